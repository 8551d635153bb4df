//! What passes between the wire and the proxy, whichever protocol carried the request:
//! the request (its head, how its body is framed, where the body comes from) and the
//! response (status, fields, body, and the receipts it carries until it has been sent).
//! `crate::server` turns a connection's bytes into `Request`s and writes `Response`s
//! back, over sluicegate's HTTP/1 engine or hyper's HTTP/2; a `Service` (the proxy, the
//! admin API) answers one with the other and knows nothing of the protocol.

use std::future::Future;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use smallvec::SmallVec;

use crate::access_log::Entry;
use crate::config::BodyRate;
use crate::connection::ClientConn;
use crate::gate::Permits;
use crate::grpc::Code;
use crate::head::RequestHead;
use crate::http1::BodySource;
use crate::http1::parse::Framing;
use crate::upstream::{ResponseFields, UpstreamBody};

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
    fn call<'a>(&'a self, request: Request<'a>, conn: &'a ClientConn) -> impl Future<Output = Response> + Send + 'a;
}

/// One response.
pub struct Response {
    pub status: StatusCode,
    /// Fields as given where the response was made (a server's, a static route's).
    pub fields: Fields,
    /// Fields set here, replacing any of the same name in `fields`: the route's
    /// `set_response_headers`, `Retry-After`, the rate-limit fields.
    pub extra: Vec<(HeaderName, FieldValue)>,
    pub body: Body,
    /// The pace its body is sent at (the route's `response_body_rate`).
    pub pace: Option<BodyRate>,
    /// What the response holds until it has been sent (or abandoned by the client).
    pub receipts: Receipts,
}

/// A response's own fields.
// A server's head is kept inline: boxing it would cost an allocation per response, more
// than moving it the few times a response moves.
#[allow(clippy::large_enum_variant)]
pub enum Fields {
    /// None but `extra`.
    None,
    Map(HeaderMap),
    /// A server's, as its protocol gave them.
    Upstream(ResponseFields),
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

pub enum Body {
    /// Made here, in full (empty for no body).
    Full(Bytes),
    /// A server's, still to be read.
    Upstream(UpstreamBody),
}

/// What a response carries until it has been sent in full or the client went away: the
/// request's concurrency slots, and its access log line (written when dropped).
pub struct Receipts {
    pub permits: Permits,
    pub access: Option<Box<Entry>>,
    /// A tunnel made of this response (`101`) through which nothing moves this long is
    /// closed (the upstream's `tunnel_idle_timeout`).
    pub tunnel_idle_timeout: std::time::Duration,
    /// What the proxy does once a gRPC call's response has ended, with the `grpc-status`
    /// of its trailers (`None`: it ended without one, its client gone or its protocol
    /// unable to carry trailers).
    pub grpc_end: Option<GrpcEnd>,
}

/// See `Receipts::grpc_end`.
pub type GrpcEnd = Box<dyn FnOnce(Option<Code>) + Send>;

impl Default for Receipts {
    fn default() -> Self {
        Receipts {
            permits: Permits::default(),
            access: None,
            tunnel_idle_timeout: std::time::Duration::from_secs(3600),
            grpc_end: None,
        }
    }
}

impl Receipts {
    /// The response's body ended with `trailers`: the gRPC status they carry goes to the
    /// access log line and to `grpc_end`.
    pub fn ended(&mut self, trailers: Option<&HeaderMap>) {
        let code = trailers.and_then(crate::grpc::status);
        if let (Some(entry), Some(code)) = (&mut self.access, code) {
            entry.grpc_status = Some(code.0);
        }
        if let Some(end) = self.grpc_end.take() {
            end(code);
        }
    }
}

impl Drop for Receipts {
    /// A call that ends without its trailers (the client went away) ends all the same.
    fn drop(&mut self) {
        if let Some(end) = self.grpc_end.take() {
            end(None);
        }
    }
}

impl Response {
    /// A response made here: `status`, `fields`, `body`.
    pub fn made(status: StatusCode, extra: Vec<(HeaderName, FieldValue)>, body: impl Into<Bytes>) -> Self {
        let body = Body::Full(body.into());
        Response { status, fields: Fields::None, extra, body, pace: None, receipts: Receipts::default() }
    }

    /// Sets `name` to `value`, replacing what the response had of it.
    pub fn set(&mut self, name: HeaderName, value: impl Into<FieldValue>) {
        let value = value.into();
        match self.extra.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => *v = value,
            None => self.extra.push((name, value)),
        }
    }

    /// The `grpc-status` its head carries (a trailers-only gRPC response), if any.
    pub fn grpc_status_in_head(&self) -> Option<Code> {
        let name = http::HeaderName::from_static("grpc-status");
        let value = match self.extra.iter().find(|(n, _)| *n == name) {
            Some((_, value)) => Some(value.as_bytes()),
            None => match &self.fields {
                Fields::None => None,
                Fields::Map(map) | Fields::Upstream(ResponseFields::H2(map)) => {
                    map.get(&name).map(HeaderValue::as_bytes)
                }
                Fields::Upstream(ResponseFields::H1(head)) => head.fields().get(&name),
            },
        };
        value.and_then(Code::parse)
    }

    /// Every field the response carries (before the framing fields), as (name, value):
    /// its own, less hop-by-hop ones and those `extra` replaces; then `extra`.
    /// `keep_length`: a server's `Content-Length` stays (a response with no body, to
    /// `HEAD` say, whose length describes another).
    pub fn each_field(&self, keep_length: bool, emit: &mut impl FnMut(&[u8], &[u8])) {
        let replaced: SmallVec<[&[u8]; 4]> = self.extra.iter().map(|(n, _)| n.as_str().as_bytes()).collect();
        let switching = self.status == StatusCode::SWITCHING_PROTOCOLS;
        match &self.fields {
            Fields::None => {}
            Fields::Map(map) => {
                for (name, value) in map {
                    if !replaced.iter().any(|r| *r == name.as_str().as_bytes()) {
                        emit(name.as_str().as_bytes(), value.as_bytes());
                    }
                }
            }
            Fields::Upstream(ResponseFields::H1(head)) => {
                crate::hop::response_fields(head.fields(), switching, keep_length, &replaced, emit);
            }
            Fields::Upstream(ResponseFields::H2(map)) => {
                crate::hop::response_fields(map.into(), switching, keep_length, &replaced, emit);
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
