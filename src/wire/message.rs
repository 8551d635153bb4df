//! What passes between the wire and the proxy, whichever protocol carried the request:
//! the request (its head, how its body is framed, where the body comes from) and the
//! response (status, fields, and a body that settles itself). `crate::server` turns a
//! connection's bytes into `Request`s and writes `Response`s back, over sluicegate's
//! HTTP/1 engine or hyper's HTTP/2; a `Service` (the proxy, the admin API) answers one
//! with the other and knows nothing of the protocol. The wire knows nothing of what a
//! response holds (slots, a log line, a pace): its body does, and settles it as it ends.

use std::future::Future;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use smallvec::SmallVec;

use crate::wire::connection::ClientConn;
use crate::wire::head::RequestHead;
use crate::wire::http1::parse::{Framing, ResponseHead};
use crate::wire::http1::{BodyError, BodySource};

/// One request.
pub struct Request<'a> {
    pub head: RequestHead<'a>,
    /// How its body is framed: `Length(n)` declares it, `Chunked` streams it.
    pub framing: Framing,
    /// Where its body comes from (`None`: it has none).
    pub body: Option<&'a mut (dyn BodySource + 'a)>,
}

/// What answers requests: the proxy, or the admin API.
pub trait Service: Send + Sync + 'static {
    /// The body of its responses.
    type Body: ResponseBody;

    fn call<'a>(
        &'a self,
        request: Request<'a>,
        conn: &'a ClientConn,
    ) -> impl Future<Output = Response<Self::Body>> + Send + 'a;
}

/// One response.
pub struct Response<B> {
    pub status: StatusCode,
    /// Fields as given where the response was made (a server's, a static route's).
    pub fields: ResponseFields,
    /// Fields set here, replacing any of the same name in `fields`: the route's
    /// `set_response_headers`, `Retry-After`, the rate-limit fields.
    pub extra: Vec<(HeaderName, FieldValue)>,
    pub body: B,
}

/// A response's body as the wire sends it, whichever protocol: its frames (data, then
/// perhaps trailers) as `hyper::body::Body` gives them, its length when known
/// (`size_hint`), and whether nothing is left (`is_end_stream`, also after its last
/// frame). Whatever the response holds until it has been sent (concurrency slots, its log
/// line, its pace) is the body's to settle, before its last frame goes out (or when it is
/// dropped, its client gone): the wire only writes what it is given.
pub trait ResponseBody: hyper::body::Body<Data = Bytes, Error = BodyError> + Send + Unpin + 'static {
    /// The response goes out without its body (to `HEAD`, a `204`, a `304`): what the
    /// body holds is settled without it; ready once it is, before the head goes out.
    fn poll_unsent(&mut self, cx: &mut Context<'_>) -> Poll<()>;

    /// Whether nothing is left of the body to send (no data, no trailers), what it
    /// holds settled as its end would settle it: ready with `true` once it is (the head
    /// then ends the stream), `false` at once when the body has something to send. An
    /// HTTP/2 head that ends its stream (HEADERS with END_STREAM) is how a server's
    /// trailers-only answer is forwarded as it was sent: a head, then an empty DATA frame
    /// that ends the stream, is a protocol error to gRPC clients that expect one.
    fn poll_ended(&mut self, cx: &mut Context<'_>) -> Poll<bool>;

    /// The connection a `101` handed over, with what it holds for the tunnel's life.
    /// Taken once.
    fn upgrade(&mut self) -> Option<Upgrade>;
}

/// A connection a server's `101` switched to another protocol: its socket, the bytes
/// read from it past the response head, how long it may idle, and what the response
/// holds until the tunnel closes.
pub struct Upgrade {
    pub io: Box<dyn UpgradedIo>,
    pub read: BytesMut,
    pub idle: std::time::Duration,
    pub held: Box<dyn Send>,
}

/// A socket, both ways.
pub trait UpgradedIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> UpgradedIo for T {}

/// A response's own fields.
// A server's head is kept inline: boxing it would cost an allocation per response, more
// than moving it the few times a response moves.
#[allow(clippy::large_enum_variant)]
pub enum ResponseFields {
    /// None but `extra`.
    None,
    Map(HeaderMap),
    /// A server's, as its protocol gave them.
    Upstream(ServerFields),
}

/// A server's response header fields as the protocol gave them.
// The HTTP/1 head, the common one, is kept inline: boxing it would cost an allocation
// per response.
#[allow(clippy::large_enum_variant)]
pub enum ServerFields {
    H1(ResponseHead),
    H2(HeaderMap),
}

/// The value of a field set here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FieldValue {
    /// Given whole (a configured value, a constant).
    Given(HeaderValue),
    /// Written here from parts known to be visible ASCII (numbers, limit names), short
    /// enough to be kept inline: the fields every rejection and every limited response
    /// carries (`Retry-After`, `RateLimit`) then cost no allocation.
    Short { len: u8, bytes: [u8; SHORT_VALUE] },
    /// Written here, longer.
    Long(Vec<u8>),
}

/// The longest value kept inline (it makes a `FieldValue` 48 bytes, a `HeaderValue` 40).
const SHORT_VALUE: usize = 38;

impl FieldValue {
    /// A decimal number.
    pub fn number(n: u64) -> Self {
        let mut value = FieldValue::written();
        value.push_number(n);
        value
    }

    /// An empty value, to be written.
    pub fn written() -> Self {
        FieldValue::Short { len: 0, bytes: [0; SHORT_VALUE] }
    }

    /// Appends `text`, which must be visible ASCII or spaces (not checked here: a field
    /// value made of anything else is refused as it is written out for HTTP/2, and is
    /// no field value for HTTP/1).
    // Written by hand rather than with a small-vector crate: this runs a few times for
    // every limited response, and a plain copy into the inline array is what it needs.
    pub fn push_str(&mut self, text: &str) {
        debug_assert!(text.bytes().all(|b| b == b' ' || b.is_ascii_graphic()), "{text:?}");
        match self {
            FieldValue::Short { len, bytes } => {
                let at = usize::from(*len);
                match bytes.get_mut(at..at + text.len()) {
                    Some(room) => {
                        room.copy_from_slice(text.as_bytes());
                        *len += text.len() as u8;
                    }
                    None => {
                        let mut long = Vec::with_capacity(at + text.len() + 32);
                        long.extend_from_slice(&bytes[..at]);
                        long.extend_from_slice(text.as_bytes());
                        *self = FieldValue::Long(long);
                    }
                }
            }
            FieldValue::Long(long) => long.extend_from_slice(text.as_bytes()),
            FieldValue::Given(_) => debug_assert!(false, "a given value is not written to"),
        }
    }

    pub fn push_number(&mut self, n: u64) {
        self.push_str(itoa::Buffer::new().format(n));
    }

    pub fn as_bytes(&self) -> &[u8] {
        match self {
            FieldValue::Given(value) => value.as_bytes(),
            FieldValue::Short { len, bytes } => &bytes[..usize::from(*len)],
            FieldValue::Long(long) => long,
        }
    }
}

impl From<HeaderValue> for FieldValue {
    fn from(value: HeaderValue) -> Self {
        FieldValue::Given(value)
    }
}

impl PartialEq<&str> for FieldValue {
    fn eq(&self, other: &&str) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl<B: From<Bytes>> Response<B> {
    /// A response made here: `status`, `extra` fields, `body`.
    pub fn made(status: StatusCode, extra: Vec<(HeaderName, FieldValue)>, body: impl Into<Bytes>) -> Self {
        Response { status, fields: ResponseFields::None, extra, body: B::from(body.into()) }
    }
}

impl<B> Response<B> {
    /// Sets `name` to `value`, replacing what the response had of it.
    pub fn set(&mut self, name: HeaderName, value: impl Into<FieldValue>) {
        let value = value.into();
        match self.extra.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => *v = value,
            None => self.extra.push((name, value)),
        }
    }

    /// The value of field `name`, as the response will carry it: `extra`'s, or else its
    /// own (the first, if it has several).
    pub fn field(&self, name: &HeaderName) -> Option<&[u8]> {
        if let Some((_, value)) = self.extra.iter().find(|(n, _)| n == name) {
            return Some(value.as_bytes());
        }
        match &self.fields {
            ResponseFields::None => None,
            ResponseFields::Map(map) | ResponseFields::Upstream(ServerFields::H2(map)) => {
                map.get(name).map(http::HeaderValue::as_bytes)
            }
            ResponseFields::Upstream(ServerFields::H1(head)) => head.fields().get(name),
        }
    }

    /// Every field the response carries (before the framing fields), as (name, value):
    /// its own, less hop-by-hop ones and those `extra` replaces; then `extra`.
    /// `keep_length`: a server's `Content-Length` stays (a response with no body, to
    /// `HEAD` say, whose length describes another).
    pub fn each_field(&self, keep_length: bool, emit: &mut impl FnMut(&[u8], &[u8])) {
        let replaced = || -> SmallVec<[&[u8]; 4]> { self.extra.iter().map(|(n, _)| n.as_str().as_bytes()).collect() };
        let switching = self.status == StatusCode::SWITCHING_PROTOCOLS;
        match &self.fields {
            ResponseFields::None => {}
            ResponseFields::Map(map) => {
                let replaced = replaced();
                for (name, value) in map {
                    if !replaced.iter().any(|r| *r == name.as_str().as_bytes()) {
                        emit(name.as_str().as_bytes(), value.as_bytes());
                    }
                }
            }
            ResponseFields::Upstream(ServerFields::H1(head)) => {
                crate::wire::head::response_fields(head.fields(), switching, keep_length, &replaced(), emit);
            }
            ResponseFields::Upstream(ServerFields::H2(map)) => {
                crate::wire::head::response_fields(map.into(), switching, keep_length, &replaced(), emit);
            }
        }
        for (name, value) in &self.extra {
            emit(name.as_str().as_bytes(), value.as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_value_grows_past_its_inline_room() {
        let mut value = FieldValue::written();
        value.push_str("\"per_ip\";r=");
        value.push_number(7);
        assert_eq!(value, "\"per_ip\";r=7");
        assert!(matches!(value, FieldValue::Short { .. }));
        for _ in 0..5 {
            value.push_str(", \"another\"");
        }
        assert!(matches!(value, FieldValue::Long(_)));
        assert_eq!(value.as_bytes(), format!("\"per_ip\";r=7{}", ", \"another\"".repeat(5)).as_bytes());
        assert_eq!(FieldValue::number(u64::MAX), "18446744073709551615");
        assert!(std::mem::size_of::<FieldValue>() <= 48);
    }
}
