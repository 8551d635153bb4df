//! A client connection read in-process: a peer's bytes in the pieces each test chooses
//! (`mock::Pieces`), polled step by step, each request read as the proxy reads it (its
//! head, then its body to its end when it has one).

use std::task::Poll;

use bytes::Bytes;
use http::Method;

use super::*;
use crate::wire::http1::mock::{Pieces, bytewise, poll_once};

/// Small bounds, so that a test can reach them.
const LIMITS: HeadLimits = HeadLimits { line: 64, head: 256 };

const GET: &[u8] = b"GET /g HTTP/1.1\r\nHost: h\r\n\r\n";
const POST: &[u8] = b"POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello";
const CHUNKED: &[u8] = b"POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n\
    3;x=y\r\nabc\r\n2\r\nde\r\n0\r\nx-t: 1\r\n\r\n";
/// The HTTP/2 preface and the SETTINGS frame that follows it.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

/// What a connection reads from `peer`, request by request, until it stops reading (see
/// `read_request`): `closed` (the client closed between requests), `waiting` (for more
/// bytes), `h2`, `refused STATUS`, `io: KIND`; and the connection.
fn read_from(peer: Pieces, h2: bool) -> (Vec<String>, Conn<Pieces>) {
    let mut conn = Conn::new(peer);
    let mut got = Vec::new();
    loop {
        // As the engine asks: HTTP/2 may begin with the first request only.
        let read = poll_once(|cx| conn.poll_head(cx, LIMITS, h2 && got.is_empty()));
        let end = match read {
            Poll::Ready(Ok(Ok(Read::Head(head)))) => match read_request(&mut conn, &head) {
                Ok(request) => {
                    got.push(request);
                    continue;
                }
                Err(request) => request,
            },
            Poll::Pending => "waiting".to_owned(),
            Poll::Ready(Ok(Ok(Read::Closed))) => "closed".to_owned(),
            Poll::Ready(Ok(Ok(Read::H2))) => "h2".to_owned(),
            Poll::Ready(Ok(Err(e))) => format!("refused {}", e.status().as_u16()),
            Poll::Ready(Err(e)) => format!("io: {:?}", e.kind()),
        };
        got.push(end);
        return (got, conn);
    }
}

/// What a connection reads of `pieces` sent whole, the client closing after them.
fn read(pieces: &[&[u8]]) -> Vec<String> {
    read_from(Pieces::closing(pieces), false).0
}

/// The request with `head` as read: `METHOD TARGET [BODY]`, its trailer fields, and
/// `close` when the connection closes after it; an error (the connection then closes)
/// when its body cannot be read to its end.
fn read_request(conn: &mut Conn<Pieces>, head: &ParsedHead) -> Result<String, String> {
    let (mut body, mut trailers) = (String::new(), String::new());
    // As the engine reads one: a request without a body has no body reader.
    if head.framing != parse::Framing::Empty {
        let mut reader = BodyReader::new(conn, head);
        loop {
            let failed = match poll_once(|cx| reader.poll_chunk(cx)) {
                Poll::Ready(Some(Ok(piece))) => {
                    body.push_str(&String::from_utf8_lossy(&piece));
                    continue;
                }
                Poll::Ready(None) => break,
                Poll::Ready(Some(Err(e))) => format!("body: {e}"),
                Poll::Pending => "waiting".to_owned(),
            };
            return Err(format!("{} {} [{body}... {failed}", head.method, head.target()));
        }
        for (name, value) in reader.trailers().iter().flatten() {
            trailers.push_str(&format!(" {name}={}", value.to_str().unwrap()));
        }
    }
    let close = if !head.keep_alive || head.close_after { " close" } else { "" };
    Ok(format!("{} {} [{body}]{trailers}{close}", head.method, head.target()))
}

fn concat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

#[test]
fn requests_pipelined_in_one_read_are_read_one_after_another() {
    let all = concat(&[CHUNKED, POST, GET]);
    assert_eq!(read(&[&all]), ["POST /c [abcde] x-t=1", "POST /p [hello]", "GET /g []", "closed"]);
}

/// Heads, chunk-size lines, chunk data, the CRLF after it (split between its CR and its
/// LF too), trailers, and the next head: a byte a read, or split at any byte, each reads
/// as it does whole.
#[test]
fn requests_split_anywhere_read_as_sent_whole() {
    let all = concat(&[CHUNKED, POST, GET]);
    let whole = read(&[&all]);
    assert_eq!(read(&bytewise(&all)), whole, "a byte a read");
    for at in 1..all.len() {
        let (a, b) = all.split_at(at);
        assert_eq!(read(&[a, b]), whole, "split at {at}");
    }
}

#[test]
fn bytes_after_a_body_stay_in_the_buffer_for_the_next_head() {
    let mut conn = Conn::new(Pieces::waiting([concat(&[POST, GET])]));
    let Poll::Ready(Ok(Ok(Read::Head(head)))) = poll_once(|cx| conn.poll_head(cx, LIMITS, false)) else {
        panic!("no head")
    };
    assert_eq!(read_request(&mut conn, &head).unwrap(), "POST /p [hello]");
    assert_eq!(&conn.buf[..], GET, "the next request, whole and untouched");
}

/// Between requests the connection holds no buffer (module doc): what the head and the
/// body took is theirs.
#[test]
fn a_connection_holds_no_buffer_once_its_request_is_read() {
    for request in [GET, POST, CHUNKED] {
        let (got, conn) = read_from(Pieces::waiting([request]), false);
        assert_eq!(got.last().map(String::as_str), Some("waiting"), "{got:?}");
        assert_eq!(conn.buf.capacity(), 0, "{got:?}");
    }
}

#[test]
fn a_client_closing_between_requests_is_closed_and_mid_head_is_an_unexpected_end() {
    assert_eq!(read(&[]), ["closed"]);
    assert_eq!(read(&[GET]), ["GET /g []", "closed"]);
    assert_eq!(read(&[GET, b"GET /x HTTP/1.1\r\nHo"]), ["GET /g []", "io: UnexpectedEof"]);
    assert_eq!(read(&[b"G"]), ["io: UnexpectedEof"]);
    // One that sends nothing more is waited for.
    assert_eq!(read_from(Pieces::waiting([GET, b"GET /x"]), false).0, ["GET /g []", "waiting"]);
}

/// RFC 9112 §2.2: an empty line before a request line is ignored.
#[test]
fn empty_lines_before_a_request_line_are_skipped() {
    assert_eq!(read(&[GET, b"\r\n", GET]), ["GET /g []", "GET /g []", "closed"]);
    assert_eq!(read(&[b"\r\n\r\n", GET]), ["GET /g []", "closed"]);
}

/// A request line of `len` bytes before its LF (CR included).
fn line_of(len: usize) -> Vec<u8> {
    let line = format!("GET /{} HTTP/1.1\r", "x".repeat(len - 15));
    assert_eq!(line.len(), len);
    line.into_bytes()
}

/// A request line still arriving is measured as it comes: at its bound it is read, a
/// byte over it is refused with 414, whether its LF has come or not.
#[test]
fn a_request_line_at_its_bound_is_read_and_a_byte_over_is_414() {
    let bound = LIMITS.line as usize;
    let rest: &[u8] = b"\nHost: h\r\n\r\n";
    let target = format!("/{}", "x".repeat(bound - 15));
    assert_eq!(read(&[&line_of(bound), rest]), [format!("GET {target} []"), "closed".to_owned()]);
    assert_eq!(read(&[&line_of(bound + 1), rest]), ["refused 414"]);
    // Its LF come, the rest of the head not yet.
    assert_eq!(read(&[&concat(&[&line_of(bound + 1), b"\nHost: h\r\n"]), b"\r\n"]), ["refused 414"]);
    // At the bound without its LF yet, it is waited for.
    assert_eq!(read_from(Pieces::waiting([line_of(bound)]), false).0, ["waiting"]);
}

/// The first `len` bytes of a head (without its empty line).
fn head_of(len: usize) -> Vec<u8> {
    let head = format!("GET / HTTP/1.1\r\nX-Pad: {}\r\n", "x".repeat(len - 25));
    assert_eq!(head.len(), len);
    head.into_bytes()
}

/// A head still arriving is measured as it comes: at its bound it is read on, a byte
/// over it is refused with 431.
#[test]
fn a_head_at_its_bound_is_read_and_a_byte_over_is_431() {
    let bound = LIMITS.head as usize;
    assert_eq!(read(&[&head_of(bound), b"\r\n"]), ["GET / []", "closed"]);
    assert_eq!(read(&[&head_of(bound + 1), b"\r\n"]), ["refused 431"]);
}

/// A head that came whole is not bounded here: the front measures its target and fields
/// against their limits exactly (`front::size`), and these bounds only keep a head that
/// has not ended from growing without end (`server::head_limits`).
#[test]
fn a_head_that_came_whole_is_left_to_the_fronts_exact_limits() {
    let long = concat(&[&line_of(LIMITS.line as usize + 1), b"\nHost: h\r\n\r\n"]);
    assert!(read(&[&long])[0].starts_with("GET /xx"));
    let large = concat(&[&head_of(LIMITS.head as usize + 1), b"\r\n"]);
    assert_eq!(read(&[&large]), ["GET / []", "closed"]);
}

#[test]
fn the_http2_preface_is_recognised_whole_or_in_pieces_and_kept_to_be_read_again() {
    let pieces: [Vec<&[u8]>; 4] = [
        vec![PREFACE],
        bytewise(PREFACE),
        vec![&PREFACE[..2], &PREFACE[2..]],
        vec![&PREFACE[..3], &PREFACE[3..24], &PREFACE[24..]],
    ];
    for pieces in pieces {
        let (got, conn) = read_from(Pieces::waiting(&pieces), true);
        assert_eq!(got, ["h2"], "{pieces:?}");
        // Every byte read (the whole preface at least) is there for HTTP/2 to read.
        assert!(conn.buf.len() >= 24 && PREFACE.starts_with(&conn.buf), "{pieces:?}");
    }
}

/// A start like the preface's that turns out not to be it is an HTTP/1 request (`PRI` is
/// a method like any other).
#[test]
fn a_start_like_the_prefaces_that_is_not_it_is_read_as_http1() {
    let pri = b"PRI /x HTTP/1.1\r\nHost: h\r\n\r\n";
    assert_eq!(read_from(Pieces::closing([pri]), true).0, ["PRI /x []", "closed"]);
    assert_eq!(read_from(Pieces::closing(bytewise(pri)), true).0, ["PRI /x []", "closed"]);
    // Like it up to its version: the preface's line read as HTTP/1 is refused.
    let almost = b"PRI * HTTP/2.1\r\n\r\nSM\r\n\r\n";
    assert_eq!(read_from(Pieces::closing([almost]), true).0, ["refused 400"]);
}

#[test]
fn the_preface_is_refused_where_http2_may_not_begin_and_cut_short_is_an_unexpected_end() {
    assert_eq!(read_from(Pieces::closing([PREFACE]), false).0, ["refused 400"]);
    assert_eq!(read_from(Pieces::closing([GET, PREFACE]), true).0, ["GET /g []", "refused 400"]);
    assert_eq!(read_from(Pieces::closing([&PREFACE[..10]]), true).0, ["io: UnexpectedEof"]);
    assert_eq!(read_from(Pieces::waiting([&PREFACE[..23]]), true).0, ["waiting"]);
}

#[test]
fn a_body_of_its_content_length_is_read_and_one_cut_short_is_an_error() {
    assert_eq!(read(&[POST]), ["POST /p [hello]", "closed"]);
    assert_eq!(read(&bytewise(POST)), ["POST /p [hello]", "closed"]);
    let zero = b"POST /z HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n";
    assert_eq!(read(&[zero, GET]), ["POST /z []", "GET /g []", "closed"]);
    assert_eq!(read(&[&POST[..POST.len() - 2]]), ["POST /p [hel... body: the connection closed before the body's end"]);
}

/// Cut anywhere before its end, a chunked body is an error, and nothing after it is read.
#[test]
fn a_chunked_body_cut_anywhere_is_an_error() {
    let head = CHUNKED.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    for at in head..CHUNKED.len() {
        let got = read(&[&CHUNKED[..at]]);
        assert!(
            got.len() == 1 && got[0].ends_with("body: the connection closed before the body's end"),
            "cut at {at}: {got:?}"
        );
    }
}

#[test]
fn chunk_data_not_followed_by_crlf_ends_the_connections_requests() {
    for bad in [&b"3\r\nabcd\r\n0\r\n\r\n"[..], b"3\r\nabc\n0\r\n\r\n", b"3\r\nabc\rx0\r\n\r\n"] {
        let request = concat(&[b"POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n", bad, GET]);
        assert_eq!(read(&[&request]), ["POST /c [abc... body: chunk data not followed by CRLF"], "{bad:?}");
    }
}

/// A request that waits for `100 Continue` with a body of 5 bytes (none sent yet).
const EXPECTS: &[u8] = b"POST /e HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n";

/// The head at the start of what `peer` sends, read, and the connection.
fn head_read(peer: Pieces) -> (ParsedHead, Conn<Pieces>) {
    let mut conn = Conn::new(peer);
    match poll_once(|cx| conn.poll_head(cx, LIMITS, false)) {
        Poll::Ready(Ok(Ok(Read::Head(head)))) => (head, conn),
        _ => panic!("no head"),
    }
}

/// RFC 9110 §10.1.1: sent when the body is first asked for, so that a request refused
/// before that gets its final status instead; once.
#[test]
fn continue_is_sent_when_the_body_is_first_read_and_not_before() {
    let (head, mut conn) = head_read(Pieces::waiting([EXPECTS]));
    assert!(head.expect_continue);
    let mut body = BodyReader::new(&mut conn, &head);
    assert_eq!(body.conn.io.written, b"", "not before the body is asked for");
    assert!(poll_once(|cx| body.poll_chunk(cx)).is_pending());
    assert_eq!(body.conn.io.written, CONTINUE);
    body.conn.io.send(b"hel");
    body.conn.io.send(b"lo");
    let mut read = Vec::new();
    while let Poll::Ready(Some(Ok(piece))) = poll_once(|cx| body.poll_chunk(cx)) {
        read.extend_from_slice(&piece);
    }
    assert_eq!((&read[..], body.is_done()), (&b"hello"[..], true));
    assert_eq!(body.conn.io.written, CONTINUE, "once");
}

#[test]
fn continue_is_never_sent_for_a_body_not_read() {
    let (head, mut conn) = head_read(Pieces::waiting([EXPECTS]));
    drop(BodyReader::new(&mut conn, &head));
    assert_eq!(conn.io.written, b"");
}

/// A client that sent body bytes is not waiting; an HTTP/1.0 client knows no 1xx.
#[test]
fn continue_is_not_sent_to_a_client_that_sent_its_body_or_speaks_http10() {
    let (got, conn) = read_from(Pieces::closing([concat(&[EXPECTS, b"hello"])]), false);
    assert_eq!((got[0].as_str(), &conn.io.written[..]), ("POST /e [hello]", &b""[..]));
    let http10 = b"POST /e HTTP/1.0\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n";
    let (got, conn) = read_from(Pieces::closing([&http10[..], b"hello"]), false);
    assert_eq!((got[0].as_str(), &conn.io.written[..]), ("POST /e [hello] close", &b""[..]));
}

#[test]
fn continue_goes_out_whole_to_a_client_that_takes_a_byte_a_write() {
    let (head, mut conn) = head_read(Pieces::waiting([EXPECTS]).taking(1));
    let mut body = BodyReader::new(&mut conn, &head);
    assert!(poll_once(|cx| body.poll_chunk(cx)).is_pending());
    assert_eq!(body.conn.io.written, CONTINUE);
}

/// While a request without a body is served, what the client sends is read (pipelined
/// requests, up to a bound) and its close is seen.
#[test]
fn a_client_is_watched_while_its_request_is_served() {
    let mut conn = Conn::new(Pieces::waiting([GET]));
    assert!(poll_once(|cx| conn.poll_gone(cx, 1024)).is_pending());
    assert_eq!(&conn.buf[..], GET, "kept for the next head");
    let mut conn = Conn::new(Pieces::closing([GET]));
    assert!(poll_once(|cx| conn.poll_gone(cx, 1024)).is_ready(), "gone");
    // Past the bound nothing more is read: it waits in the kernel's buffers.
    let mut conn = Conn::new(Pieces::closing([&b"abc"[..], b"def"]));
    assert!(poll_once(|cx| conn.poll_gone(cx, 3)).is_pending());
    assert_eq!((&conn.buf[..], conn.io.all_read()), (&b"abc"[..], false));
}

/// An upstream's interim response, parsed.
fn interim(head: &[u8]) -> ResponseHead {
    let (len, parsed) = parse::response(head, &Method::POST, 4096).unwrap().unwrap();
    ResponseHead::new(Bytes::copy_from_slice(&head[..len]), parsed)
}

/// RFC 9110 §15.2: a proxy forwards the interim responses it did not ask for, to clients
/// that know them; a client that asked for `100 Continue` gets ours (once its body is
/// wanted), not the upstream's too.
#[test]
fn interim_responses_go_to_http11_clients_but_a_100_only_to_one_that_did_not_expect_ours() {
    let early = interim(b"HTTP/1.1 103 Early Hints\r\nLink: </s>\r\n\r\n");
    let cont = interim(b"HTTP/1.1 100 Continue\r\n\r\n");
    for (request, forwarded) in [
        (
            &b"GET / HTTP/1.1\r\nHost: h\r\n\r\n"[..],
            "HTTP/1.1 103 Early Hints\r\nlink: </s>\r\n\r\nHTTP/1.1 100 Continue\r\n\r\n",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n\r\n",
            "HTTP/1.1 103 Early Hints\r\nlink: </s>\r\n\r\n",
        ),
        (b"GET / HTTP/1.0\r\nHost: h\r\n\r\n", ""),
    ] {
        let (head, _conn) = head_read(Pieces::waiting([request]));
        let queue = Mutex::new(Vec::new());
        let mut source = Bodiless::new(&head, &queue);
        for response in [&early, &cont] {
            assert!(poll_once(|cx| source.poll_interim(cx, response)).is_ready());
        }
        let queued = queue.into_inner().unwrap();
        assert_eq!(String::from_utf8_lossy(&queued).to_lowercase(), forwarded.to_lowercase(), "{request:?}");
    }
}

/// A client that reads none of them does not make the connection hold what an upstream
/// sends without end.
#[test]
fn interim_responses_queued_are_bounded() {
    let early = interim(b"HTTP/1.1 103 Early Hints\r\nLink: </s>\r\n\r\n");
    let (head, _conn) = head_read(Pieces::waiting([GET]));
    let queue = Mutex::new(Vec::new());
    let mut source = Bodiless::new(&head, &queue);
    for _ in 0..2 * MAX_INTERIM_QUEUED {
        assert!(poll_once(|cx| source.poll_interim(cx, &early)).is_ready());
    }
    let queued = queue.into_inner().unwrap().len();
    assert!((MAX_INTERIM_QUEUED..MAX_INTERIM_QUEUED + 64).contains(&queued), "{queued} bytes");
}

/// An interim response of the upstream goes out, whole, before the body is read on.
#[test]
fn an_interim_response_goes_out_whole_while_the_body_is_read() {
    let early = interim(b"HTTP/1.1 103 Early Hints\r\n\r\n");
    let (head, mut conn) = head_read(Pieces::waiting([POST]).taking(4));
    let mut body = BodyReader::new(&mut conn, &head);
    assert!(poll_once(|cx| body.poll_interim(cx, &early)).is_ready());
    assert_eq!(body.conn.io.written, b"HTTP/1.1 103 Early Hints\r\n\r\n");
    assert!(matches!(poll_once(|cx| body.poll_chunk(cx)), Poll::Ready(Some(Ok(b))) if b == "hello"));
}
