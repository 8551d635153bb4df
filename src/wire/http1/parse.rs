//! Request and response heads, parsed with `httparse` where they lie in the read buffer:
//! a head keeps its bytes (`bytes::Bytes`, shared with the buffer they were read into)
//! and where each part lies in them, so no field is copied into a map.
//!
//! This is where request smuggling is stopped (RFC 9112 read as a proxy's threat model):
//! a request is framed one way only, or refused. `httparse` already refuses obs-fold, a
//! space before a colon, bare CR, NUL and other control bytes in a field, and a target
//! or method that is not a token; on top of that, here:
//! - `Content-Length` must be one field of digits (several, a list, a sign, a space
//!   inside: 400), within `u64`;
//! - `Transfer-Encoding` must end in `chunked` and hold nothing else (another coding
//!   last: 400; one we do not decode before it: 501); HTTP/1.0 with it: 400;
//! - with both, the chunked encoding frames the request, `Content-Length` is dropped
//!   and the connection is closed after the response (RFC 9112 §6.1).
//!
//! The upstream only ever gets the framing we write, so it can never see a request
//! boundary where we did not.

use std::mem::MaybeUninit;

use bytes::Bytes;
use http::{Method, StatusCode, Version};

use crate::wire::head::{FieldSpan, Fields, Known, RequestHead, Span};

/// More fields than this in a head: 431 (nginx allows about as many in its default
/// buffers; no real client sends more).
pub const MAX_FIELDS: usize = 100;

/// How a message's body is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// The chunked transfer coding.
    Chunked,
    /// Everything until the connection closes (responses only).
    UntilClose,
}

/// A request head, parsed.
pub struct ParsedHead {
    bytes: Bytes,
    pub method: Method,
    /// The target in origin form (path and query); for an absolute-form target, its
    /// path and query.
    target: Span,
    /// An absolute-form target's authority (`GET http://host/x`).
    authority: Option<Span>,
    pub version: Version,
    fields: Vec<FieldSpan>,
    pub framing: Framing,
    /// The client asks to keep the connection open after this exchange.
    pub keep_alive: bool,
    /// The framing was in doubt (both `Transfer-Encoding` and `Content-Length`): the
    /// connection is closed after the response whatever else it says.
    pub close_after: bool,
    /// `Expect: 100-continue`: the client waits for `100 Continue` before its body.
    pub expect_continue: bool,
}

/// A response head from an upstream, parsed.
pub struct ResponseHead {
    bytes: Bytes,
    pub status: StatusCode,
    pub version: Version,
    fields: Vec<FieldSpan>,
    pub framing: Framing,
    /// The server keeps the connection open after this exchange.
    pub keep_alive: bool,
}

/// Why a request head is refused, with the status it is answered with. The connection
/// is closed after the answer: its framing cannot be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    #[error("malformed request head: {0}")]
    Malformed(&'static str),
    #[error("more than {MAX_FIELDS} header fields")]
    TooManyFields,
    #[error("the request head is larger than {0} bytes")]
    TooLarge(usize),
    #[error("the request line is longer than {0} bytes")]
    LineTooLong(usize),
    #[error("Transfer-Encoding {0} is not supported; only chunked is")]
    UnsupportedCoding(&'static str),
}

impl HeadError {
    pub fn status(&self) -> StatusCode {
        match self {
            HeadError::Malformed(_) => StatusCode::BAD_REQUEST,
            HeadError::TooManyFields | HeadError::TooLarge(_) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            HeadError::LineTooLong(_) => StatusCode::URI_TOO_LONG,
            HeadError::UnsupportedCoding(_) => StatusCode::NOT_IMPLEMENTED,
        }
    }
}

/// What the fields of a message say about its framing and connection.
#[derive(Default)]
struct Framed {
    length: Option<u64>,
    lengths: u32,
    chunked: bool,
    /// Transfer codings were given (any, `chunked` included).
    codings: bool,
    close: bool,
    keep_alive: bool,
    expect_continue: bool,
}

/// Parses the request head at the start of `buf`: `Ok(None)` while it is incomplete,
/// else its length in bytes and the head (whose bytes the caller then splits off the
/// buffer and hands to `ParsedHead::new`). `max_line` bounds the request line,
/// `max_head` the whole head while it is incomplete.
pub fn request(buf: &[u8], max_line: usize, max_head: usize) -> Result<Option<Parsed>, HeadError> {
    let mut headers = [const { MaybeUninit::uninit() }; MAX_FIELDS];
    let mut req = httparse::Request::new(&mut []);
    let len = match req.parse_with_uninit_headers(buf, &mut headers) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => {
            // A request line that has not ended within its bound never will (414); a
            // head that has not ended within its bound, 431.
            let line = buf.iter().position(|&b| b == b'\n').unwrap_or(buf.len());
            if line > max_line {
                return Err(HeadError::LineTooLong(max_line));
            }
            if buf.len() > max_head {
                return Err(HeadError::TooLarge(max_head));
            }
            return Ok(None);
        }
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooManyFields),
        Err(e) => return Err(HeadError::Malformed(describe(e))),
    };
    let (Some(method), Some(path), Some(minor)) = (req.method, req.path, req.version) else {
        return Err(HeadError::Malformed("incomplete request line"));
    };
    let method = Method::from_bytes(method.as_bytes()).map_err(|_| HeadError::Malformed("invalid method"))?;
    let version = if minor == 1 { Version::HTTP_11 } else { Version::HTTP_10 };
    let head = &buf[..len];
    let (target, authority) = target(path.as_bytes(), &method, head)?;
    let fields: Vec<FieldSpan> = req.headers.iter().map(|h| field(h, head)).collect();
    let framed = framed(&fields, head, version)?;
    let framing = match (framed.codings, framed.length) {
        (true, _) => Framing::Chunked,
        (false, Some(0) | None) => Framing::Empty,
        (false, Some(n)) => Framing::Length(n),
    };
    let keep_alive = match version {
        Version::HTTP_11 => !framed.close,
        _ => framed.keep_alive && !framed.close,
    };
    Ok(Some(Parsed {
        len,
        method,
        target,
        authority,
        version,
        fields,
        framing,
        keep_alive,
        close_after: framed.codings && framed.lengths > 0,
        expect_continue: framed.expect_continue && version == Version::HTTP_11,
    }))
}

/// A request head parsed where it lies: its length, and where its parts lie.
pub struct Parsed {
    pub len: usize,
    method: Method,
    target: Span,
    authority: Option<Span>,
    version: Version,
    fields: Vec<FieldSpan>,
    framing: Framing,
    keep_alive: bool,
    close_after: bool,
    expect_continue: bool,
}

impl ParsedHead {
    /// The head `parsed` from `bytes` (the same bytes, split off the buffer).
    pub fn new(bytes: Bytes, parsed: Parsed) -> Self {
        ParsedHead {
            bytes,
            method: parsed.method,
            target: parsed.target,
            authority: parsed.authority,
            version: parsed.version,
            fields: parsed.fields,
            framing: parsed.framing,
            keep_alive: parsed.keep_alive,
            close_after: parsed.close_after,
            expect_continue: parsed.expect_continue,
        }
    }

    /// The target in origin form, as sent.
    pub fn target(&self) -> &str {
        // Checked to be UTF-8 by httparse (a token of visible ASCII or UTF-8).
        match std::str::from_utf8(self.target.get(&self.bytes)) {
            Ok("") | Err(_) => "/",
            Ok(target) => target,
        }
    }

    pub fn authority(&self) -> Option<&str> {
        self.authority.and_then(|a| std::str::from_utf8(a.get(&self.bytes)).ok())
    }

    /// Every field, where it was read.
    pub fn fields(&self) -> Fields<'_> {
        Fields::Raw { bytes: &self.bytes, spans: &self.fields }
    }

    /// The head as every step above the wire reads it.
    pub fn view(&self) -> RequestHead<'_> {
        RequestHead {
            method: &self.method,
            target: self.target(),
            version: self.version,
            authority: self.authority(),
            fields: self.fields(),
        }
    }
}

impl ResponseHead {
    pub fn fields(&self) -> Fields<'_> {
        Fields::Raw { bytes: &self.bytes, spans: &self.fields }
    }
}

/// Parses the response head at the start of `buf`, to a request with `method`: `Ok(None)`
/// while it is incomplete (and within `max_head`), else its length and the head, whose
/// bytes the caller splits off. A malformed head, or one larger than `max_head`, is an
/// error: the exchange fails with 502.
pub fn response(buf: &[u8], method: &Method, max_head: usize) -> Result<Option<(usize, ResponseParsed)>, &'static str> {
    let mut headers = [const { MaybeUninit::uninit() }; MAX_FIELDS];
    let mut res = httparse::Response::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(&mut res, buf, &mut headers) {
        // A head larger than the bound is refused whether it came in one read or several.
        Ok(httparse::Status::Complete(len)) if len > max_head => return Err("response head too large"),
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() > max_head => return Err("response head too large"),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err("too many header fields in the response"),
        Err(e) => return Err(describe(e)),
    };
    let (Some(code), Some(minor)) = (res.code, res.version) else { return Err("incomplete status line") };
    let status = StatusCode::from_u16(code).map_err(|_| "invalid status code")?;
    let version = if minor == 1 { Version::HTTP_11 } else { Version::HTTP_10 };
    let head = &buf[..len];
    let fields: Vec<FieldSpan> = res.headers.iter().map(|h| field(h, head)).collect();
    let framed = framed(&fields, head, Version::HTTP_11).map_err(|_| "invalid framing fields in the response")?;
    // RFC 9112 §6.3, in its order.
    let framing = if *method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        Framing::Empty
    } else if framed.codings {
        if framed.chunked { Framing::Chunked } else { Framing::UntilClose }
    } else {
        match framed.length {
            Some(0) => Framing::Empty,
            Some(n) => Framing::Length(n),
            None => Framing::UntilClose,
        }
    };
    // A response framed in doubt (codings and a length) leaves the connection unusable;
    // after a `101` it speaks another protocol.
    let reusable = framing != Framing::UntilClose
        && !(framed.codings && framed.lengths > 0)
        && status != StatusCode::SWITCHING_PROTOCOLS;
    let keep_alive = reusable
        && match version {
            Version::HTTP_11 => !framed.close,
            _ => framed.keep_alive && !framed.close,
        };
    Ok(Some((len, ResponseParsed { status, version, fields, framing, keep_alive })))
}

/// A response head parsed where it lies.
pub struct ResponseParsed {
    status: StatusCode,
    version: Version,
    fields: Vec<FieldSpan>,
    framing: Framing,
    keep_alive: bool,
}

impl ResponseHead {
    pub fn new(bytes: Bytes, parsed: ResponseParsed) -> Self {
        ResponseHead {
            bytes,
            status: parsed.status,
            version: parsed.version,
            fields: parsed.fields,
            framing: parsed.framing,
            keep_alive: parsed.keep_alive,
        }
    }
}

fn field(h: &httparse::Header<'_>, head: &[u8]) -> FieldSpan {
    let name = h.name.as_bytes();
    FieldSpan { name: Span::of(name, head), value: Span::of(h.value, head), known: Known::of(name) }
}

/// The target's origin form and an absolute-form target's authority (RFC 9112 §3.2):
/// origin form (`/path?query`), absolute form (`http://host/path`), authority form
/// (`host:port`) for `CONNECT` only and `*` for `OPTIONS` only. Anything else is a 400:
/// a relative target (`index.html`) or an authority without `CONNECT` has no path the
/// request could be routed by, and one forwarded as `/` would be served as another
/// request than the client sent. A fragment (`#`) is no part of a target (§3.2.1): cut
/// off as a browser cuts it, the path routed and limited would not be the one forwarded;
/// kept, a backend would cut it where the routing did not (`/login#/../public`).
fn target(path: &[u8], method: &Method, head: &[u8]) -> Result<(Span, Option<Span>), HeadError> {
    if path.contains(&b'#') {
        return Err(HeadError::Malformed("a fragment (#) in the request target"));
    }
    if path.first() == Some(&b'/') {
        return Ok((Span::of(path, head), None));
    }
    if path == b"*" {
        return match *method == Method::OPTIONS {
            true => Ok((Span::of(path, head), None)),
            false => Err(HeadError::Malformed("the target * is for OPTIONS only")),
        };
    }
    let rest = if path.len() > 7 && path[..7].eq_ignore_ascii_case(b"http://") {
        &path[7..]
    } else if path.len() > 8 && path[..8].eq_ignore_ascii_case(b"https://") {
        &path[8..]
    } else if *method == Method::CONNECT && !path.contains(&b'/') {
        // Authority form (`CONNECT host:port`): no path; the front refuses CONNECT (405).
        return Ok((Span::of(&path[path.len()..], head), Some(Span::of(path, head))));
    } else {
        return Err(HeadError::Malformed("the request target is neither a path nor an absolute URI"));
    };
    let end = rest.iter().position(|&b| b == b'/' || b == b'?').unwrap_or(rest.len());
    let (authority, origin) = rest.split_at(end);
    if authority.is_empty() {
        return Err(HeadError::Malformed("an absolute URI without a host"));
    }
    if origin.first() == Some(&b'?') {
        return Err(HeadError::Malformed("an absolute URI with a query but no path"));
    }
    // `http://host` stands for the path `/`: an empty target is read as `/` (see
    // `ParsedHead::target`).
    Ok((Span::of(origin, head), Some(Span::of(authority, head))))
}

/// Reads the fields that frame a message and say what becomes of its connection.
fn framed(fields: &[FieldSpan], head: &[u8], version: Version) -> Result<Framed, HeadError> {
    let mut f = Framed::default();
    for field in fields {
        let value = field.value.get(head);
        if field.known == Known::ContentLength {
            f.lengths += 1;
            if f.lengths > 1 {
                return Err(HeadError::Malformed("more than one Content-Length"));
            }
            f.length = Some(content_length(value)?);
        } else if field.known == Known::TransferEncoding {
            if version == Version::HTTP_10 {
                // RFC 9112 §6.1: HTTP/1.0 has no transfer codings; its framing is faulty.
                return Err(HeadError::Malformed("Transfer-Encoding in an HTTP/1.0 request"));
            }
            for coding in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                if f.chunked {
                    // Something after `chunked`: it is not the final coding (§6.3).
                    return Err(HeadError::Malformed("chunked is not the final transfer coding"));
                }
                if coding.eq_ignore_ascii_case(b"chunked") {
                    f.chunked = true;
                } else if coding.is_empty() {
                    return Err(HeadError::Malformed("an empty transfer coding"));
                } else {
                    // gzip, deflate, compress: codings we could decode but do not; anything
                    // else (`xchunked`, `chunked;x`) is no coding at all.
                    return Err(match known_coding(coding) {
                        Some(name) => HeadError::UnsupportedCoding(name),
                        None => HeadError::Malformed("an unknown transfer coding"),
                    });
                }
            }
            f.codings = true;
        } else if field.known == Known::Connection {
            for token in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                if token.eq_ignore_ascii_case(b"close") {
                    f.close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") {
                    f.keep_alive = true;
                }
            }
        } else if field.known == Known::Expect {
            f.expect_continue = value.trim_ascii().eq_ignore_ascii_case(b"100-continue");
        }
    }
    if f.codings && !f.chunked {
        return Err(HeadError::Malformed("chunked is not the final transfer coding"));
    }
    Ok(f)
}

/// A `Content-Length` value: digits only (RFC 9110 §8.6), within `u64`.
fn content_length(value: &[u8]) -> Result<u64, HeadError> {
    let digits = value.trim_ascii();
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(HeadError::Malformed("Content-Length is not a number"));
    }
    digits
        .iter()
        .try_fold(0u64, |n, &d| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))
        .ok_or(HeadError::Malformed("Content-Length is too large"))
}

fn known_coding(coding: &[u8]) -> Option<&'static str> {
    ["gzip", "x-gzip", "deflate", "compress", "x-compress"]
        .into_iter()
        .find(|known| coding.eq_ignore_ascii_case(known.as_bytes()))
}

fn describe(e: httparse::Error) -> &'static str {
    match e {
        httparse::Error::HeaderName => "invalid byte in a header field name",
        httparse::Error::HeaderValue => "invalid byte in a header field value",
        httparse::Error::NewLine => "invalid line ending",
        httparse::Error::Status => "invalid status",
        httparse::Error::Token => "invalid byte in the request line",
        httparse::Error::TooManyHeaders => "too many header fields",
        httparse::Error::Version => "not HTTP/1.0 or HTTP/1.1",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The request head at the start of `bytes`: its status if refused, else its target
    /// as the proxy reads it.
    fn read(bytes: &str) -> Result<String, StatusCode> {
        match request(bytes.as_bytes(), 8192, 32768) {
            Err(e) => Err(e.status()),
            Ok(None) => panic!("incomplete: {bytes:?}"),
            Ok(Some(parsed)) => {
                let len = parsed.len;
                Ok(ParsedHead::new(Bytes::copy_from_slice(&bytes.as_bytes()[..len]), parsed).target().to_owned())
            }
        }
    }

    #[test]
    fn a_target_is_a_path_an_absolute_uri_an_authority_for_connect_or_a_star_for_options() {
        for (line, target) in [
            ("GET /a?b HTTP/1.1", "/a?b"),
            ("GET http://h/a?b HTTP/1.1", "/a?b"),
            ("GET http://h HTTP/1.1", "/"),
            ("CONNECT h:443 HTTP/1.1", "/"),
            ("OPTIONS * HTTP/1.1", "*"),
        ] {
            assert_eq!(read(&format!("{line}\r\nHost: h\r\n\r\n")).as_deref(), Ok(target), "{line}");
        }
        for line in [
            "GET /r/prefix/x#/../../z HTTP/1.1",
            "POST /login#/../../public HTTP/1.1",
            "GET /r/exact#x HTTP/1.1",
            "GET http://h/a#b HTTP/1.1",
            "DELETE x HTTP/1.1",
            "GET index.html HTTP/1.0",
            "GET h:80 HTTP/1.1",
            "GET * HTTP/1.1",
            "GET ?q=1 HTTP/1.1",
            // Decided: refused (docs/protocols.md, *HTTP/1 framing*).
            "GET http://x?q=1 HTTP/1.1",
            "GET / HTTP/1.2",
        ] {
            assert_eq!(read(&format!("{line}\r\nHost: h\r\n\r\n")), Err(StatusCode::BAD_REQUEST), "{line}");
        }
    }

    #[test]
    fn transfer_codings_other_than_one_final_chunked_are_refused() {
        for te in ["chunked, chunked", "chunked,", ", chunked", "chunked, identity", "identity", "xchunked"] {
            let head = format!("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: {te}\r\n\r\n");
            assert_eq!(read(&head), Err(StatusCode::BAD_REQUEST), "{te}");
        }
        let head = "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n";
        assert_eq!(read(head), Err(StatusCode::NOT_IMPLEMENTED));
        let head = "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: Chunked\r\nContent-Length: 3\r\n\r\n";
        let parsed = request(head.as_bytes(), 8192, 32768).unwrap().unwrap();
        assert_eq!((parsed.framing, parsed.close_after), (Framing::Chunked, true));
    }

    #[test]
    fn a_response_head_past_its_bound_is_refused_however_it_was_read() {
        let head = format!("HTTP/1.1 200 OK\r\nX-Big: {}\r\n\r\n", "x".repeat(100));
        assert!(response(head.as_bytes(), &Method::GET, 64).is_err(), "whole");
        assert!(response(&head.as_bytes()[..80], &Method::GET, 64).is_err(), "begun");
        assert!(response(head.as_bytes(), &Method::GET, head.len()).unwrap().is_some());
    }

    #[test]
    fn the_largest_content_length_is_read_and_one_past_it_refused() {
        let head = "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 18446744073709551615\r\n\r\n";
        assert_eq!(request(head.as_bytes(), 8192, 32768).unwrap().unwrap().framing, Framing::Length(u64::MAX));
        let head = "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 18446744073709551616\r\n\r\n";
        assert_eq!(read(head), Err(StatusCode::BAD_REQUEST));
    }

    /// The request head `bytes` (whole), parsed, or the status it is refused with.
    fn parsed(bytes: &str) -> Result<ParsedHead, StatusCode> {
        let parsed = request(bytes.as_bytes(), 8192, 32768).map_err(|e| e.status())?.expect("a whole head");
        Ok(ParsedHead::new(Bytes::copy_from_slice(&bytes.as_bytes()[..parsed.len]), parsed))
    }

    /// A head with `fields` (each line ending in CRLF) after `GET / HTTP/1.1`.
    fn with_fields(fields: &str) -> String {
        format!("GET / HTTP/1.1\r\nHost: h\r\n{fields}\r\n")
    }

    /// RFC 9112 §2.2: a bare LF may end a line; a bare CR is refused wherever it is.
    #[test]
    fn a_bare_lf_ends_a_line_and_a_bare_cr_is_refused() {
        assert_eq!(read("GET /a HTTP/1.1\nHost: h\n\n").as_deref(), Ok("/a"));
        assert_eq!(read("GET /a HTTP/1.1\r\nHost: h\nX: 1\r\n\n").as_deref(), Ok("/a"));
        for bad in [
            "GET /a HTTP/1.1\rHost: h\r\n\r\n",
            "GET /a HTTP/1.1\r\nHost: h\r\r\n\r\n",
            "GET /a HTTP/1.1\r\nHost: h\r\nX: a\rb\r\n\r\n",
            "GET /a HTTP/1.1\r\nHost: h\r\n\r\r\n",
        ] {
            assert_eq!(read(bad), Err(StatusCode::BAD_REQUEST), "{bad:?}");
        }
    }

    /// RFC 9112 §5.1, §5.2: no whitespace between a field name and its colon, no line
    /// folding (a field line that starts with whitespace), a name that is a token, a
    /// value of visible bytes, spaces and tabs (and obs-text).
    #[test]
    fn folded_lines_space_before_a_colon_and_invalid_names_or_values_are_refused() {
        for bad in [
            "X: a\r\n b\r\n",
            "X: a\r\n\tb\r\n",
            "X : a\r\n",
            "X\t: a\r\n",
            ": a\r\n",
            "X(: a\r\n",
            "X\0: a\r\n",
            "\u{e9}: a\r\n",
            "X: a\0b\r\n",
            "X: a\x01b\r\n",
            "X: a\x7fb\r\n",
            "X\r\n",
        ] {
            assert_eq!(read(&with_fields(bad)), Err(StatusCode::BAD_REQUEST), "{bad:?}");
        }
        let head = parsed(&with_fields("X: a\tb \u{e9}\r\n")).unwrap();
        let value = head.fields().get(&http::HeaderName::from_static("x")).unwrap().to_vec();
        assert_eq!(value, "a\tb \u{e9}".as_bytes(), "the whitespace around a value is no part of it");
    }

    #[test]
    fn request_lines_that_are_not_method_target_and_http1_version_are_refused() {
        for bad in [
            "GET  / HTTP/1.1",
            "GET /  HTTP/1.1",
            "GET / HTTP/1.1 ",
            "GET / http/1.1",
            "GET / HTTP/2.0",
            "GET /",
            "GET / a HTTP/1.1",
            "G(T / HTTP/1.1",
            " GET / HTTP/1.1",
        ] {
            assert_eq!(read(&format!("{bad}\r\nHost: h\r\n\r\n")), Err(StatusCode::BAD_REQUEST), "{bad:?}");
        }
        assert_eq!(parsed("GET / HTTP/1.0\r\n\r\n").unwrap().version, Version::HTTP_10);
        assert_eq!(parsed("GET / HTTP/1.1\r\n\r\n").unwrap().version, Version::HTTP_11);
    }

    #[test]
    fn an_absolute_target_gives_its_authority_and_its_path() {
        for (target, authority, path) in [
            ("http://h:8080/a?b", Some("h:8080"), "/a?b"),
            ("HTTPS://h/a", Some("h"), "/a"),
            ("http://h", Some("h"), "/"),
            ("/a", None, "/a"),
        ] {
            let head = parsed(&format!("GET {target} HTTP/1.1\r\nHost: h\r\n\r\n")).unwrap();
            assert_eq!((head.authority(), head.target()), (authority, path), "{target}");
        }
        let head = parsed("CONNECT h:443 HTTP/1.1\r\nHost: h\r\n\r\n").unwrap();
        assert_eq!(head.authority(), Some("h:443"));
        for bad in ["http://", "http:///a", "https://?q", "ftp://h/a"] {
            assert_eq!(read(&format!("GET {bad} HTTP/1.1\r\n\r\n")), Err(StatusCode::BAD_REQUEST), "{bad}");
        }
    }

    /// RFC 9112 §9.3: HTTP/1.1 keeps the connection unless `close`; HTTP/1.0 closes it
    /// unless `keep-alive` (and not `close`); tokens in any case, in a list.
    #[test]
    fn http10_closes_unless_it_asks_to_keep_alive_and_http11_keeps_alive_unless_it_asks_to_close() {
        for (version, connection, keep_alive) in [
            ("1.1", "", true),
            ("1.1", "Connection: close\r\n", false),
            ("1.1", "Connection: keep-alive, Close\r\n", false),
            ("1.1", "Connection: upgrade\r\nConnection: close\r\n", false),
            ("1.0", "", false),
            ("1.0", "Connection: Keep-Alive\r\n", true),
            ("1.0", "Connection: keep-alive, close\r\n", false),
        ] {
            let head = format!("GET / HTTP/{version}\r\nHost: h\r\n{connection}\r\n");
            assert_eq!(parsed(&head).unwrap().keep_alive, keep_alive, "{head:?}");
        }
    }

    /// RFC 9110 §10.1.1: only `100-continue` (in any case) is waited for, and only by an
    /// HTTP/1.1 client.
    #[test]
    fn only_an_http11_expect_100_continue_is_waited_for() {
        for (version, expect, waits) in [
            ("1.1", "100-continue", true),
            ("1.1", "100-Continue", true),
            ("1.1", "200-ok", false),
            ("1.0", "100-continue", false),
        ] {
            let head = format!("POST / HTTP/{version}\r\nHost: h\r\nExpect: {expect}\r\nContent-Length: 1\r\n\r\n");
            assert_eq!(parsed(&head).unwrap().expect_continue, waits, "{head:?}");
        }
    }

    /// RFC 9110 §8.6: one field of digits; none or 0 is no body.
    #[test]
    fn a_content_length_is_one_field_of_digits() {
        for (fields, framing) in [
            ("", Framing::Empty),
            ("Content-Length: 0\r\n", Framing::Empty),
            ("Content-Length: 000\r\n", Framing::Empty),
            ("Content-Length: 5\r\n", Framing::Length(5)),
            ("Content-Length:   5  \r\n", Framing::Length(5)),
        ] {
            assert_eq!(parsed(&with_fields(fields)).unwrap().framing, framing, "{fields:?}");
        }
        for bad in [
            "Content-Length: \r\n",
            "Content-Length: 5, 5\r\n",
            "Content-Length: 5,5\r\n",
            "Content-Length: 5 5\r\n",
            "Content-Length: -5\r\n",
            "Content-Length: +5\r\n",
            "Content-Length: 0x5\r\n",
            "Content-Length: 5.0\r\n",
            "Content-Length: 5\r\nContent-Length: 5\r\n",
            "Content-Length: 5\r\nContent-Length: 6\r\n",
            "Content-Length: 5\r\ncontent-length: 5\r\n",
        ] {
            assert_eq!(read(&with_fields(bad)), Err(StatusCode::BAD_REQUEST), "{bad:?}");
        }
    }

    /// RFC 9112 §6.1: with both, the chunked coding frames the request, and the
    /// connection closes after it (whichever field comes first).
    #[test]
    fn a_content_length_beside_transfer_encoding_is_dropped_and_the_connection_closed_after() {
        for fields in [
            "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
            "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
            "Content-Length: 0\r\nTransfer-Encoding: chunked\r\n",
        ] {
            let head = parsed(&with_fields(fields)).unwrap();
            assert_eq!((head.framing, head.close_after), (Framing::Chunked, true), "{fields:?}");
        }
        let head = parsed(&with_fields("Transfer-Encoding: chunked\r\n")).unwrap();
        assert_eq!((head.framing, head.close_after, head.keep_alive), (Framing::Chunked, false, true));
        // Beside a coding refused, the length does not save the request.
        let bad = with_fields("Content-Length: 5\r\nTransfer-Encoding: identity\r\n");
        assert_eq!(read(&bad), Err(StatusCode::BAD_REQUEST));
    }

    /// RFC 9112 §6.3: chunked must be the final coding, across fields as within one.
    #[test]
    fn transfer_encodings_across_fields_are_one_list() {
        for (fields, status) in [
            ("Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n", StatusCode::NOT_IMPLEMENTED),
            ("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", StatusCode::BAD_REQUEST),
            ("Transfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n", StatusCode::BAD_REQUEST),
            ("Transfer-Encoding: gzip\r\n", StatusCode::NOT_IMPLEMENTED),
            ("Transfer-Encoding: deflate, chunked\r\n", StatusCode::NOT_IMPLEMENTED),
            ("Transfer-Encoding: \r\n", StatusCode::BAD_REQUEST),
            ("Transfer-Encoding: chunked;q=1\r\n", StatusCode::BAD_REQUEST),
        ] {
            assert_eq!(read(&with_fields(fields)).map(|_| ()), Err(status), "{fields:?}");
        }
        for fields in ["Transfer-Encoding: CHUNKED\r\n", "Transfer-Encoding:\tchunked \r\n"] {
            assert_eq!(parsed(&with_fields(fields)).unwrap().framing, Framing::Chunked, "{fields:?}");
        }
    }

    #[test]
    fn a_hundred_fields_are_read_and_one_more_is_431() {
        let fields = |n: usize| (1..n).map(|i| format!("X-{i}: v\r\n")).collect::<String>();
        assert!(read(&with_fields(&fields(MAX_FIELDS))).is_ok(), "Host and 99 more");
        assert_eq!(read(&with_fields(&fields(MAX_FIELDS + 1))), Err(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE));
    }

    /// The bounds hold a head that has not ended (414 for its request line, 431 for the
    /// whole), at the byte; one that has ended is left to the front's exact limits
    /// (`front::size`), whatever its size.
    #[test]
    fn a_head_not_ended_is_bounded_at_the_byte_and_an_ended_one_is_not() {
        let line = "GET /xxxxxxxxxx HTTP/1.1\r"; // 25 bytes before its LF
        assert!(matches!(request(line.as_bytes(), 25, 100), Ok(None)));
        assert_eq!(request(line.as_bytes(), 24, 100).err(), Some(HeadError::LineTooLong(24)));
        let begun = format!("{line}\nHost: h\r\n");
        assert!(matches!(request(begun.as_bytes(), 25, 100), Ok(None)));
        assert_eq!(request(begun.as_bytes(), 24, 100).err(), Some(HeadError::LineTooLong(24)));
        assert!(matches!(request(begun.as_bytes(), 25, begun.len()), Ok(None)));
        assert_eq!(request(begun.as_bytes(), 25, begun.len() - 1).err(), Some(HeadError::TooLarge(begun.len() - 1)));
        let ended = format!("{begun}\r\n");
        assert!(matches!(request(ended.as_bytes(), 10, 10), Ok(Some(p)) if p.len == ended.len()));
    }
}
