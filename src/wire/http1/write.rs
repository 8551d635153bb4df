//! Heads written into one buffer, to go out in one write: the request line or status
//! line, the fields as they are given (names as sent, when they come from a peer), and
//! the framing fields, which are always ours.

use std::cell::Cell;

use http::{Method, StatusCode};

use super::date;

/// A head buffer larger than this is not kept for the next response.
const KEPT_BYTES: usize = 16 * 1024;

thread_local! {
    /// A buffer for response heads, lent to one response at a time: most responses are
    /// written before the next one needs it, so writing a head allocates nothing.
    static SPARE: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// An empty buffer to write a head in: this thread's spare one if it is free.
pub fn buffer() -> Vec<u8> {
    let spare = SPARE.take();
    if spare.capacity() > 0 { spare } else { Vec::with_capacity(512) }
}

/// Gives `buffer` back to be lent again.
pub fn give_back(mut buffer: Vec<u8>) {
    if buffer.capacity() <= KEPT_BYTES {
        buffer.clear();
        SPARE.set(buffer);
    }
}

/// A head being written into `out`.
pub struct Head<'a> {
    out: &'a mut Vec<u8>,
}

impl<'a> Head<'a> {
    /// `METHOD TARGET HTTP/1.1`: requests to servers are HTTP/1.1 whatever the client spoke.
    pub fn request(out: &'a mut Vec<u8>, method: &Method, target: &str) -> Self {
        out.extend_from_slice(method.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(target.as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\n");
        Head { out }
    }

    /// `HTTP/1.1 STATUS REASON`: responses are HTTP/1.1 whatever the client spoke, as
    /// nginx's are (RFC 9110 §2.5: the highest minor version the server supports).
    pub fn response(out: &'a mut Vec<u8>, status: StatusCode) -> Self {
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(status.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
        out.extend_from_slice(b"\r\n");
        Head { out }
    }

    #[inline]
    pub fn field(&mut self, name: &[u8], value: &[u8]) {
        self.out.extend_from_slice(name);
        self.out.extend_from_slice(b": ");
        self.out.extend_from_slice(value);
        self.out.extend_from_slice(b"\r\n");
    }

    pub fn content_length(&mut self, length: u64) {
        let mut digits = itoa::Buffer::new();
        self.field(b"content-length", digits.format(length).as_bytes());
    }

    pub fn date(&mut self) {
        self.field(b"date", &date::now());
    }

    /// Ends the head (the empty line).
    pub fn end(self) {
        self.out.extend_from_slice(b"\r\n");
    }
}

/// An interim (1xx) response of a server as a client gets it: its status line and its
/// fields but the hop-by-hop and framing ones, appended to `out`.
pub fn interim(out: &mut Vec<u8>, head: &super::parse::ResponseHead) {
    let mut writer = Head::response(out, head.status);
    crate::wire::head::response_fields(head.fields(), false, false, &[], &mut |name, value| writer.field(name, value));
    writer.end();
}

/// The end of a chunked body: the last chunk, `trailers` (checked already as trailer
/// fields are) as its trailer section, and the empty line; appended to `out`.
pub fn last_chunk(out: &mut Vec<u8>, trailers: &http::HeaderMap) {
    out.extend_from_slice(b"0\r\n");
    for (name, value) in trailers {
        for part in [name.as_str().as_bytes(), b": ", value.as_bytes(), b"\r\n"] {
            out.extend_from_slice(part);
        }
    }
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_are_written_line_by_line() {
        let mut out = Vec::new();
        let mut head = Head::request(&mut out, &Method::POST, "/a?b=1");
        head.field(b"Host", b"example.com");
        head.content_length(12);
        head.end();
        assert_eq!(out, b"POST /a?b=1 HTTP/1.1\r\nHost: example.com\r\ncontent-length: 12\r\n\r\n");
        let mut out = Vec::new();
        Head::response(&mut out, StatusCode::TOO_MANY_REQUESTS).end();
        assert_eq!(out, b"HTTP/1.1 429 Too Many Requests\r\n\r\n");
    }

    #[test]
    fn a_chunked_body_ends_with_its_trailers() {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        trailers.append("x-t", "1".parse().unwrap());
        let mut out = Vec::new();
        last_chunk(&mut out, &trailers);
        assert_eq!(out, b"0\r\ngrpc-status: 0\r\nx-t: 1\r\n\r\n");
        let mut out = Vec::new();
        last_chunk(&mut out, &http::HeaderMap::new());
        assert_eq!(out, super::super::body::LAST_CHUNK);
    }
}
