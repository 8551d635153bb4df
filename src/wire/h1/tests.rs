//! The engine in-process: a client's bytes in over an in-memory pipe, split wherever a
//! test says, and what it answers read back; the service echoes what the engine read.

use bytes::Bytes;
use hyper::body::SizeHint;
use tokio::io::{AsyncReadExt, DuplexStream, ReadHalf, WriteHalf};

use super::*;
use crate::wire::http1::BodyError;
use crate::wire::http1::mock::Pieces;

/// A body made in full.
struct Made(Option<Bytes>);

impl From<Bytes> for Made {
    fn from(bytes: Bytes) -> Self {
        Made(Some(bytes))
    }
}

impl hyper::body::Body for Made {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        Poll::Ready(self.get_mut().0.take().filter(|b| !b.is_empty()).map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.as_ref().is_none_or(Bytes::is_empty)
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.0.as_ref().map_or(0, |b| b.len() as u64))
    }
}

impl ResponseBody for Made {
    fn poll_unsent(&mut self, _cx: &mut Context<'_>) -> Poll<()> {
        Poll::Ready(())
    }

    fn poll_ended(&mut self, _cx: &mut Context<'_>) -> Poll<bool> {
        Poll::Ready(hyper::body::Body::is_end_stream(self))
    }

    fn upgrade(&mut self) -> Option<Upgrade> {
        None
    }
}

/// Answers each request with what the engine read of it: `METHOD TARGET [BODY]`, and
/// the body's trailer fields after it; a body that breaks its framing is a 400.
struct Echo;

impl Service for Echo {
    type Body = Made;

    async fn call<'a>(&'a self, request: Request<'a>, _conn: &'a ClientConn) -> Response<Made> {
        let mut body = Vec::new();
        let mut trailers = String::new();
        if let Some(source) = request.body {
            while let Some(piece) = poll_fn(|cx| source.poll_chunk(cx)).await {
                match piece {
                    Ok(piece) => body.extend_from_slice(&piece),
                    Err(e) => return Response::made(StatusCode::BAD_REQUEST, vec![], format!("body: {e}")),
                }
            }
            for (name, value) in source.trailers().iter().flatten() {
                trailers.push_str(&format!(" {name}={}", value.to_str().unwrap_or("?")));
            }
        }
        let (method, target) = (request.head.method, request.head.target);
        let text = format!("{method} {target} [{}]{trailers}", String::from_utf8_lossy(&body));
        Response::made(StatusCode::OK, vec![], text)
    }
}

/// A service whose call holds 8 KB across an await.
struct Large;

impl Service for Large {
    type Body = Made;

    async fn call<'a>(&'a self, _request: Request<'a>, _conn: &'a ClientConn) -> Response<Made> {
        let room = std::hint::black_box([1u8; 8192]);
        tokio::task::yield_now().await;
        Response::made(StatusCode::OK, vec![], Bytes::copy_from_slice(&room[..1]))
    }
}

/// Each request's exchange is boxed while it lasts: its call's future must have room
/// in it once, shared with the other states (writing the response), not twice.
#[tokio::test]
async fn an_exchange_has_room_for_its_call_once() {
    let (_client, server) = tokio::io::duplex(64);
    let mut c = Conn::new(server);
    let bytes = Bytes::from_static(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n");
    let parsed = parse::request(&bytes, 1024, 4096).unwrap().unwrap();
    let head = parse::ParsedHead::new(bytes, parsed);
    let (_stop, stopping) = watch::channel(());
    let conn = ClientConn::unheld("127.0.0.1:1".parse().unwrap(), stopping);
    let exchange = super::exchange(&mut c, head, &conn, &Large, Duration::from_secs(1));
    let size = std::mem::size_of_val(&exchange);
    assert!(size < 8192 + 2048, "{size} bytes");
}

fn settings() -> Settings {
    let t = Duration::from_secs(5);
    Settings {
        timeouts: Timeouts { header_read: t, idle: t, send: t },
        head: HeadLimits { line: 1024, head: 4096 },
        h2: None,
    }
}

/// A connection served by the engine; the client's two halves.
fn connect() -> (ReadHalf<DuplexStream>, WriteHalf<DuplexStream>, watch::Sender<()>) {
    let (client, server) = tokio::io::duplex(1 << 16);
    let (stop, stopping) = watch::channel(());
    let conn = ClientConn::unheld("127.0.0.1:1".parse().unwrap(), stopping);
    tokio::spawn(serve(server, conn, Arc::new(Echo), settings()));
    let (read, write) = tokio::io::split(client);
    (read, write, stop)
}

/// The responses in `out` (status, body, whether it said `connection: close`), and
/// whether the last is incomplete.
fn responses(mut out: &[u8]) -> (Vec<(u16, String, bool)>, bool) {
    let mut all = Vec::new();
    while !out.is_empty() {
        let mut fields = [httparse::EMPTY_HEADER; 16];
        let mut response = httparse::Response::new(&mut fields);
        let Ok(httparse::Status::Complete(len)) = response.parse(out) else { return (all, true) };
        let field =
            |name: &str| response.headers.iter().find(|f| f.name.eq_ignore_ascii_case(name)).map(|f| f.value.to_vec());
        let length: usize = field("content-length").map_or(0, |v| String::from_utf8(v).unwrap().parse().unwrap());
        if out.len() < len + length {
            return (all, true);
        }
        let close = field("connection").is_some_and(|v| v == b"close");
        let body = String::from_utf8_lossy(&out[len..len + length]).into_owned();
        all.push((response.code.unwrap(), body, close));
        out = &out[len + length..];
    }
    (all, false)
}

/// What the engine answers `pieces`, each written on its own (the engine runs between
/// them): the responses, once `count` have come or the engine closed the connection.
async fn exchange(pieces: &[&[u8]], count: usize) -> Vec<(u16, String, bool)> {
    let (mut read, mut write, _stop) = connect();
    for piece in pieces {
        write.write_all(piece).await.unwrap();
        tokio::task::yield_now().await;
    }
    let mut out = Vec::new();
    let reading = async {
        loop {
            let (got, partial) = responses(&out);
            if got.len() >= count && !partial {
                return got;
            }
            let mut buf = [0u8; 4096];
            match read.read(&mut buf).await.unwrap() {
                0 => return got,
                n => out.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), reading)
        .await
        .unwrap_or_else(|_| panic!("no answer within 5 s; read {:?}", String::from_utf8_lossy(&out)))
}

const PIPELINED: &[u8] = b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
    3;ext=1\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\nx-t: 1\r\n\r\n\
    GET /b?q HTTP/1.1\r\nHost: x\r\n\r\n\
    POST /c HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi";

fn pipelined_answers() -> Vec<(u16, String, bool)> {
    vec![
        (200, "POST /a [abc0123456789abcdef] x-t=1".to_owned(), false),
        (200, "GET /b?q []".to_owned(), false),
        (200, "POST /c [hi]".to_owned(), false),
    ]
}

/// The connection's one timer is looked at once a wait and then not again until it
/// rings: a connection that served several requests, each within the timeouts
/// (`settings`: 5 s), is still closed once idle for its idle timeout, not before.
#[tokio::test(start_paused = true)]
async fn a_connection_idle_after_several_requests_is_closed_at_its_idle_timeout() {
    let (mut read, mut write, _stop) = connect();
    let mut answered = Instant::now();
    for _ in 0..4 {
        write.write_all(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut buf = [0u8; 1024];
        let n = read.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&buf[..n]));
        answered = Instant::now();
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(Duration::from_secs(60), read.read(&mut buf)).await;
    assert!(matches!(closed, Ok(Ok(0))), "not closed: {closed:?}");
    let idle = answered.elapsed();
    assert!(idle >= Duration::from_secs(5) && idle <= Duration::from_secs(10), "closed after {idle:?} idle");
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order() {
    assert_eq!(exchange(&[PIPELINED], 3).await, pipelined_answers());
}

/// Heads, chunk-size lines, chunk data, trailers and the next request's head, split at
/// every byte: each split reads as the whole does.
#[tokio::test]
async fn requests_split_at_every_byte_read_as_sent_whole() {
    for at in 1..PIPELINED.len() {
        let (a, b) = PIPELINED.split_at(at);
        assert_eq!(exchange(&[a, b], 3).await, pipelined_answers(), "split at {at}");
    }
    let bytes: Vec<&[u8]> = PIPELINED.chunks(1).collect();
    assert_eq!(exchange(&bytes, 3).await, pipelined_answers(), "a byte at a time");
}

/// The framings that lenient readers disagree on: refused with 400 and the connection
/// closed, or read one way only and the connection closed after (both `Content-Length`
/// and `Transfer-Encoding`): a request hidden in a body is never served.
#[tokio::test]
async fn smuggling_vectors_are_refused_or_read_one_way_then_closed() {
    let hidden = "GET /hidden HTTP/1.1\r\nHost: x\r\n\r\n";
    /// A request's bytes, and the answers (status, body, closed) the engine gives.
    type Case<'a> = (&'a str, &'a [(u16, &'a str, bool)]);
    let cases: &[Case<'_>] = &[
        (
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            &[(200, "POST / []", true)],
        ),
        ("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n", &[(400, "", true)]),
        ("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +0\r\n\r\n", &[(400, "", true)]),
        ("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n", &[(400, "", true)]),
        ("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n", &[(400, "", true)]),
        ("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n", &[(400, "", true)]),
        ("POST / HTTP/1.1\r\nHost: x\r\n Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", &[(400, "", true)]),
        ("POST / HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", &[(400, "", true)]),
        (
            "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0x0\r\n\r\n",
            &[(400, "body: invalid chunk size", true)],
        ),
        (
            "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n0\r\n\r\n",
            &[(400, "body: chunk data not followed by CRLF", true)],
        ),
        (
            "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\nx\r\n\r\n",
            &[(400, "body: invalid chunk size", true)],
        ),
        ("GET /a#/../b HTTP/1.1\r\nHost: x\r\n\r\n", &[(400, "", true)]),
    ];
    for (request, answers) in cases {
        let sent = format!("{request}{hidden}");
        let got = exchange(&[sent.as_bytes()], 2).await;
        let got: Vec<(u16, &str, bool)> = got
            .iter()
            .map(|(status, body, close)| {
                (*status, if *status == 400 && !body.starts_with("body:") { "" } else { body.as_str() }, *close)
            })
            .collect();
        assert_eq!(&got, answers, "{request:?}");
    }
}

/// A client that asked for `100 Continue` gets it before it sends its body, and only
/// when the body is read.
#[tokio::test]
async fn a_client_waiting_for_100_continue_gets_it_then_its_answer() {
    let (mut read, mut write, _stop) = connect();
    write.write_all(b"POST /e HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n").await.unwrap();
    let mut buf = [0u8; 25];
    tokio::time::timeout(Duration::from_secs(5), read.read_exact(&mut buf)).await.unwrap().unwrap();
    assert_eq!(&buf, b"HTTP/1.1 100 Continue\r\n\r\n");
    write.write_all(b"abc").await.unwrap();
    let mut out = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), read.read(&mut out)).await.unwrap().unwrap();
    assert_eq!(responses(&out[..n]).0, [(200, "POST /e [abc]".to_owned(), false)]);
}

/// A response to `HEAD` has a head only (its length that of the body `GET` would
/// get), and the next response follows it at once.
#[tokio::test]
async fn a_response_to_head_has_no_body() {
    let (mut read, mut write, _stop) = connect();
    write.write_all(b"HEAD /h HTTP/1.1\r\nHost: x\r\n\r\nGET /g HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut out = Vec::new();
    let reading = async {
        while !out.ends_with(b"GET /g []") {
            let mut buf = [0u8; 4096];
            let n = read.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed");
            out.extend_from_slice(&buf[..n]);
        }
    };
    tokio::time::timeout(Duration::from_secs(5), reading).await.expect("no second answer");
    let text = String::from_utf8(out).unwrap();
    let (first, second) = text.split_once("\r\n\r\n").unwrap();
    assert!(first.starts_with("HTTP/1.1 200 ") && first.contains("content-length: 10"), "{first}");
    assert!(second.starts_with("HTTP/1.1 200 "), "{second}");
}

/// Everything the client reads until the engine closes the connection (5 s at most).
async fn read_to_close(read: &mut ReadHalf<DuplexStream>) -> Vec<u8> {
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), read.read_to_end(&mut out))
        .await
        .unwrap_or_else(|_| panic!("not closed within 5 s; read {:?}", String::from_utf8_lossy(&out)))
        .unwrap();
    out
}

/// Shutdown closes a kept-alive connection between requests, however many it has
/// served (its wait for the signal lasts the connection's life), and answers first a
/// request whose head has begun, with `connection: close`.
#[tokio::test]
async fn shutdown_closes_a_connection_between_requests_and_answers_a_begun_one_first() {
    let get = |path: &str| format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n");
    let (mut read, mut write, stop) = connect();
    for path in ["/1", "/2"] {
        write.write_all(get(path).as_bytes()).await.unwrap();
        let mut buf = vec![0u8; 4096];
        let n = read.read(&mut buf).await.unwrap();
        let (got, partial) = responses(&buf[..n]);
        assert!(!partial && got == [(200, format!("GET {path} []"), false)], "{got:?}");
    }
    stop.send(()).unwrap();
    assert_eq!(read_to_close(&mut read).await, b"", "closed, nothing more sent");

    let (mut read, mut write, stop) = connect();
    write.write_all(b"GET /begun HTTP/1.1\r\n").await.unwrap();
    // The engine reads the piece before the signal comes (it runs between yields).
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    stop.send(()).unwrap();
    write.write_all(b"host: x\r\n\r\n").await.unwrap();
    let out = read_to_close(&mut read).await;
    assert_eq!(responses(&out), (vec![(200, "GET /begun []".to_owned(), true)], false));
}

/// What a client reads until the engine closes the connection, after sending `pieces`
/// (each written on its own) and closing its side when `then_close`.
async fn answer_to(pieces: &[&[u8]], then_close: bool) -> String {
    let (mut read, mut write, _stop) = connect();
    // The engine may have closed the connection already: what it answered is the test.
    for piece in pieces {
        let _ = write.write_all(piece).await;
        tokio::task::yield_now().await;
    }
    if then_close {
        let _ = write.shutdown().await;
    }
    String::from_utf8(read_to_close(&mut read).await).unwrap()
}

/// A refused head is answered with its status (`settings`: a request line of 1,024 bytes
/// at most, a head of 4,096, while they arrive), `connection: close`, and the connection
/// closes: nothing after it is read as a request.
#[tokio::test]
async fn a_refused_head_is_answered_with_its_status_and_the_connection_closes() {
    let next = "GET /next HTTP/1.1\r\nHost: x\r\n\r\n";
    let long_line = format!("GET /{} HTTP/1.1\r\n", "x".repeat(1024));
    let large_head = format!("GET / HTTP/1.1\r\nX-Pad: {}\r\n", "x".repeat(4096));
    for (sent, status) in [
        (long_line, 414),
        (large_head, 431),
        (format!("GET / HTTP/1.1\r\nHost: x\r\nX: a\rb\r\n\r\n{next}"), 400),
        (format!("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n{next}"), 501),
    ] {
        let answer = answer_to(&[sent.as_bytes()], false).await;
        let (got, partial) = responses(answer.as_bytes());
        assert!(!partial && got.len() == 1, "{sent:?}: {answer:?}");
        assert_eq!((got[0].0, got[0].2), (status, true), "{sent:?}: {answer:?}");
    }
}

/// RFC 9110 §9.3.2: the refusal of a `HEAD` has no body (though it says its length).
#[tokio::test]
async fn a_refused_head_request_is_answered_without_a_body() {
    let answer = answer_to(&[b"HEAD / HTTP/1.1\r\nHost : x\r\n\r\n"], false).await;
    assert!(answer.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{answer:?}");
    assert!(answer.contains("\r\ncontent-length: ") && answer.ends_with("\r\n\r\n"), "{answer:?}");
}

/// A client that closes between requests, or before its first, is closed with nothing
/// sent; one that closes in the middle of a head is not answered either (there is no
/// request to answer).
#[tokio::test]
async fn a_client_closing_between_requests_or_mid_head_gets_nothing_more() {
    let get = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n";
    let answer = answer_to(&[get], true).await;
    assert_eq!(responses(answer.as_bytes()), (vec![(200, "GET /a []".to_owned(), false)], false));
    assert_eq!(answer_to(&[], true).await, "");
    let answer = answer_to(&[get, b"GET /b HTTP/1.1\r\nHo"], true).await;
    assert_eq!(responses(answer.as_bytes()), (vec![(200, "GET /a []".to_owned(), false)], false));
}

/// RFC 9112 §9.3: an HTTP/1.0 connection closes after its response unless the client
/// asked to keep it; an HTTP/1.1 one is kept unless the client says `close`.
#[tokio::test]
async fn a_connection_is_kept_as_its_version_and_connection_field_say() {
    let two = |first: &str| format!("{first}GET /b HTTP/1.1\r\nHost: x\r\n\r\n");
    let a = |close: bool| (200, "GET /a []".to_owned(), close);
    let b = (200, "GET /b []".to_owned(), false);
    for (sent, answers) in [
        (two("GET /a HTTP/1.0\r\n\r\n"), vec![a(true)]),
        (two("GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"), vec![a(true)]),
        (two("GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"), vec![a(false), b.clone()]),
        (two("GET /a HTTP/1.1\r\nHost: x\r\n\r\n"), vec![a(false), b.clone()]),
    ] {
        assert_eq!(exchange(&[sent.as_bytes()], 2).await, answers, "{sent:?}");
    }
}

/// A body whose length is not known: its pieces, then its trailer fields if any.
struct Streamed {
    pieces: std::collections::VecDeque<Bytes>,
    trailers: Option<http::HeaderMap>,
}

impl Streamed {
    fn of(pieces: &[&'static str], trailers: &[(&'static str, &'static str)]) -> Self {
        let map = trailers.iter().map(|(n, v)| (http::HeaderName::from_static(n), v.parse().unwrap())).collect();
        Streamed {
            pieces: pieces.iter().map(|p| Bytes::from_static(p.as_bytes())).collect(),
            trailers: Some(map).filter(|m: &http::HeaderMap| !m.is_empty()),
        }
    }
}

impl hyper::body::Body for Streamed {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        let frame = match this.pieces.pop_front() {
            Some(piece) => Frame::data(piece),
            None => match this.trailers.take() {
                Some(trailers) => Frame::trailers(trailers),
                None => return Poll::Ready(None),
            },
        };
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.pieces.is_empty() && self.trailers.is_none()
    }
}

impl ResponseBody for Streamed {
    fn poll_unsent(&mut self, _cx: &mut Context<'_>) -> Poll<()> {
        Poll::Ready(())
    }

    fn poll_ended(&mut self, _cx: &mut Context<'_>) -> Poll<bool> {
        Poll::Ready(hyper::body::Body::is_end_stream(self))
    }

    fn upgrade(&mut self) -> Option<Upgrade> {
        None
    }
}

/// What `write_response` writes of a `status` response with `body` to the request
/// `request` (its date field left out), to a client that takes `takes` bytes a write,
/// and whether the connection is kept after it.
async fn written<B: ResponseBody>(request: &str, status: StatusCode, body: B, takes: usize) -> (String, bool) {
    let bytes = Bytes::copy_from_slice(request.as_bytes());
    let parsed = parse::request(&bytes, 1024, 4096).unwrap().unwrap();
    let head = parse::ParsedHead::new(bytes, parsed);
    let mut c = Conn::new(Pieces::waiting(Vec::<&[u8]>::new()).taking(takes));
    let response = Response { status, fields: ResponseFields::None, extra: vec![], body };
    let writing = write_response(&mut c, b"", response, &head, head.keep_alive, Duration::from_secs(1));
    let kept = match tokio::time::timeout(Duration::from_secs(5), writing).await.expect("written at once") {
        Ok(Written::Done { keep_alive }) => keep_alive,
        Ok(Written::Upgraded(_)) => panic!("upgraded"),
        Err(e) => panic!("{e}"),
    };
    let text = String::from_utf8(c.io.written).unwrap();
    let text = text.split_inclusive("\r\n").filter(|line| !line.starts_with("date: ")).collect();
    (text, kept)
}

const GET11: &str = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
const OK: StatusCode = StatusCode::OK;

/// RFC 9112 §6: without a length, an HTTP/1.1 client gets the body chunked (a chunk a
/// piece) and the connection kept; an HTTP/1.0 one gets it until the connection closes.
#[tokio::test]
async fn a_body_of_unknown_length_is_chunked_to_http11_and_closed_on_for_http10() {
    let chunked = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
    for takes in [usize::MAX, 1] {
        let body = Streamed::of(&["hello", " world"], &[]);
        assert_eq!(written(GET11, OK, body, takes).await, (chunked.to_owned(), true), "{takes} a write");
    }
    let body = Streamed::of(&["hello", " world"], &[]);
    let http10 = written("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", OK, body, usize::MAX).await;
    assert_eq!(http10, ("HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nhello world".to_owned(), false));
    let empty = written(GET11, OK, Streamed::of(&[], &[]), usize::MAX).await;
    assert_eq!(empty, ("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n".to_owned(), true));
}

#[tokio::test]
async fn a_body_of_known_length_goes_with_its_content_length() {
    let (text, kept) = written(GET11, OK, Made::from(Bytes::from_static(b"hello")), 1).await;
    assert_eq!((text.as_str(), kept), ("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello", true));
    let (text, _) = written(GET11, OK, Made::from(Bytes::new()), usize::MAX).await;
    assert_eq!(text, "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n");
    // An HTTP/1.0 client that asked to keep the connection is told it is kept.
    let (text, kept) =
        written("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", OK, Made::from(Bytes::from_static(b"a")), 9).await;
    assert_eq!(
        (text.as_str(), kept),
        ("HTTP/1.1 200 OK\r\ncontent-length: 1\r\nconnection: keep-alive\r\n\r\na", true)
    );
}

/// RFC 9112 §6.3: no body to `HEAD` (its length, when known, the one `GET` would get),
/// none with a 204 or a 304, whatever the body holds; the connection kept.
#[tokio::test]
async fn head_204_and_304_responses_have_no_body_bytes() {
    let head = "HEAD / HTTP/1.1\r\nHost: x\r\n\r\n";
    let hello = || Made::from(Bytes::from_static(b"hello"));
    let text = |status: StatusCode, extra: &str| format!("HTTP/1.1 {status}\r\n{extra}\r\n");
    assert_eq!(written(head, OK, hello(), 3).await, (text(OK, "content-length: 5\r\n"), true));
    assert_eq!(written(head, OK, Streamed::of(&["hello"], &[]), 3).await, (text(OK, ""), true));
    for status in [StatusCode::NO_CONTENT, StatusCode::NOT_MODIFIED] {
        assert_eq!(written(GET11, status, hello(), 3).await, (text(status, ""), true), "{status}");
        let streamed = Streamed::of(&["hello"], &[]);
        assert_eq!(written(GET11, status, streamed, 3).await, (text(status, ""), true), "{status}");
    }
}

/// Trailer fields go in the chunked trailer section to a client that takes them
/// (`TE: trailers`, RFC 9110 §10.1.4); to any other they are dropped.
#[tokio::test]
async fn trailers_go_to_a_client_that_takes_them_and_no_other() {
    let body = || Streamed::of(&["hello"], &[("grpc-status", "0")]);
    let te = "GET / HTTP/1.1\r\nHost: x\r\nTE: trailers\r\n\r\n";
    let head = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n";
    assert_eq!(written(te, OK, body(), 2).await, (format!("{head}0\r\ngrpc-status: 0\r\n\r\n"), true));
    assert_eq!(written(GET11, OK, body(), 2).await, (format!("{head}0\r\n\r\n"), true));
}

/// A piece of a body goes out as its response is framed: as it is, or as one chunk (with
/// the last chunk after it when it is the last piece).
#[test]
fn a_piece_of_a_body_is_framed_as_its_response_is() {
    let pieces = |head: &[u8], data: &[u8], chunked: bool, last: bool| {
        let mut line = [0u8; 18];
        piece(head, data, chunked, last, &mut line).concat()
    };
    assert_eq!(pieces(b"H", b"abc", false, false), b"Habc");
    assert_eq!(pieces(b"H", b"abc", false, true), b"Habc");
    assert_eq!(pieces(b"H", b"abc", true, false), b"H3\r\nabc\r\n");
    assert_eq!(pieces(b"", &[b'x'; 26], true, true), [&b"1a\r\n"[..], &[b'x'; 26], b"\r\n0\r\n\r\n"].concat());
    // An empty piece is no chunk (a chunk of size 0 would end the body).
    assert_eq!(pieces(b"H", b"", true, false), b"H");
    assert_eq!(pieces(b"H", b"", true, true), b"H0\r\n\r\n");
}
