//! A request head as every step above the wire reads it, whichever protocol carried it:
//! method, target, version, the authority an HTTP/2 request names, and its header
//! fields (`Fields`). Routing, keys, allow-lists, the gate's inputs and the access log
//! read this view and nothing protocol-specific. A leaf: it imports no other module.
//!
//! HTTP/1 fields stay where they were read (`Fields::Raw`: the head's bytes and where
//! each field lies in them); HTTP/2's are hyper's `HeaderMap` (`Fields::Map`).

use http::{HeaderMap, HeaderName, Method, Version};
use smallvec::SmallVec;

/// One request's head, borrowed from wherever the protocol keeps it.
#[derive(Clone, Copy)]
pub struct RequestHead<'a> {
    pub method: &'a Method,
    /// The target as sent, in origin form: path and query (`/a/b?x=1`); what the
    /// upstream receives unless a route rewrites it, and what the access log shows.
    pub target: &'a str,
    pub version: Version,
    /// The authority the request names besides `Host`: HTTP/2's `:authority`, or an
    /// HTTP/1.1 absolute-form target's (`GET http://a/x`).
    pub authority: Option<&'a str>,
    pub fields: Fields<'a>,
}

impl<'a> RequestHead<'a> {
    /// The target's path, without the query.
    pub fn path(&self) -> &'a str {
        self.target.get(..self.query_mark()).unwrap_or(self.target)
    }

    /// The target's query, without the `?`.
    pub fn query(&self) -> Option<&'a str> {
        self.target.get(self.query_mark() + 1..)
    }

    /// Where the target's `?` is, or its length. Byte by byte: `str`'s search for a
    /// `char` costs several times more on the short targets every request has.
    fn query_mark(&self) -> usize {
        self.target.bytes().position(|b| b == b'?').unwrap_or(self.target.len())
    }
}

/// Where something lies in a head's bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Span {
    start: u32,
    len: u32,
}

impl Span {
    /// Where `part`, a slice of `within`, lies in it.
    pub fn of(part: &[u8], within: &[u8]) -> Span {
        // Heads are far smaller than 4 GiB.
        let start = part.as_ptr() as usize - within.as_ptr() as usize;
        Span { start: start as u32, len: part.len() as u32 }
    }

    #[inline]
    pub fn get<'a>(&self, bytes: &'a [u8]) -> &'a [u8] {
        &bytes[self.start as usize..(self.start + self.len) as usize]
    }
}

/// One header field of a head kept as read: its name, its value, and which of the
/// fields the request path reads by name it is (told once, as the head is parsed).
#[derive(Clone, Copy, Debug, Default)]
pub struct FieldSpan {
    pub name: Span,
    pub value: Span,
    pub known: Known,
}

/// The header fields the request path reads or drops by name: told apart once per
/// field, so that a lookup or a filter compares one byte per field, not its name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum Known {
    #[default]
    Other,
    Host,
    Connection,
    Upgrade,
    Expect,
    ContentLength,
    TransferEncoding,
    Te,
    KeepAlive,
    ProxyConnection,
    XForwardedFor,
    XForwardedProto,
    XForwardedHost,
    Forwarded,
    Authorization,
    Cookie,
    /// Read for every request (is it a gRPC call?).
    ContentType,
    /// A gRPC call's deadline, looked for in every forwarded request.
    GrpcTimeout,
}

impl Known {
    /// What a field named `name` (as sent: any case) is. Told apart by its length and
    /// first letter, then the one candidate compared whole: exactly first, as most
    /// senders write names in lower case, then whatever their case.
    pub fn of(name: &[u8]) -> Known {
        let Some(&first) = name.first() else { return Known::Other };
        let (known, lower): (Known, &[u8]) = match (name.len(), first | 0x20) {
            (2, b't') => (Known::Te, b"te"),
            (4, b'h') => (Known::Host, b"host"),
            (6, b'c') => (Known::Cookie, b"cookie"),
            (6, b'e') => (Known::Expect, b"expect"),
            (7, b'u') => (Known::Upgrade, b"upgrade"),
            (9, b'f') => (Known::Forwarded, b"forwarded"),
            (10, b'c') => (Known::Connection, b"connection"),
            (10, b'k') => (Known::KeepAlive, b"keep-alive"),
            (12, b'c') => (Known::ContentType, b"content-type"),
            (12, b'g') => (Known::GrpcTimeout, b"grpc-timeout"),
            (13, b'a') => (Known::Authorization, b"authorization"),
            (14, b'c') => (Known::ContentLength, b"content-length"),
            (15, b'x') => (Known::XForwardedFor, b"x-forwarded-for"),
            (16, b'p') => (Known::ProxyConnection, b"proxy-connection"),
            (16, b'x') => (Known::XForwardedHost, b"x-forwarded-host"),
            (17, b't') => (Known::TransferEncoding, b"transfer-encoding"),
            (17, b'x') => (Known::XForwardedProto, b"x-forwarded-proto"),
            _ => return Known::Other,
        };
        match name == lower || name.eq_ignore_ascii_case(lower) {
            true => known,
            false => Known::Other,
        }
    }

    /// What a field named `name` is (a `HeaderName` is lower case).
    #[inline]
    pub fn of_name(name: &HeaderName) -> Known {
        Known::of(name.as_str().as_bytes())
    }

    /// The name of a known field (`Other` has none: it is never looked up by kind).
    pub fn header_name(self) -> &'static HeaderName {
        use http::header;
        static NAMES: [HeaderName; 18] = [
            HeaderName::from_static("x-sluicegate-none"),
            header::HOST,
            header::CONNECTION,
            header::UPGRADE,
            header::EXPECT,
            header::CONTENT_LENGTH,
            header::TRANSFER_ENCODING,
            header::TE,
            HeaderName::from_static("keep-alive"),
            HeaderName::from_static("proxy-connection"),
            HeaderName::from_static("x-forwarded-for"),
            HeaderName::from_static("x-forwarded-proto"),
            HeaderName::from_static("x-forwarded-host"),
            header::FORWARDED,
            header::AUTHORIZATION,
            header::COOKIE,
            header::CONTENT_TYPE,
            HeaderName::from_static("grpc-timeout"),
        ];
        &NAMES[self as usize]
    }

    /// A hop-by-hop field by its name alone (RFC 9110 §7.6.1); those `Connection` names
    /// are hop-by-hop too.
    pub fn is_hop_by_hop(self) -> bool {
        matches!(
            self,
            Known::Connection
                | Known::KeepAlive
                | Known::ProxyConnection
                | Known::Te
                | Known::TransferEncoding
                | Known::Upgrade
        )
    }
}

/// The header fields of a request, looked up by name (case-insensitively, as RFC 9110
/// §5.1 says), values as the bytes that were sent.
#[derive(Clone, Copy)]
pub enum Fields<'a> {
    /// As hyper keeps them (HTTP/2).
    Map(&'a HeaderMap),
    /// Where they were read (HTTP/1): a linear scan of a few spans is cheaper than a map.
    Raw { bytes: &'a [u8], spans: &'a [FieldSpan] },
}

impl<'a> From<&'a HeaderMap> for Fields<'a> {
    fn from(map: &'a HeaderMap) -> Self {
        Fields::Map(map)
    }
}

impl<'a> Fields<'a> {
    /// The value of the first field named `name`.
    #[inline]
    pub fn get(&self, name: &HeaderName) -> Option<&'a [u8]> {
        match *self {
            Fields::Map(map) => map.get(name).map(|v| v.as_bytes()),
            Fields::Raw { .. } => self.get_all(name).next(),
        }
    }

    /// The values of every field named `name`, in the order they came.
    pub fn get_all<'n>(&self, name: &'n HeaderName) -> Values<'a, 'n> {
        match *self {
            Fields::Map(map) => Values::Map(map.get_all(name).into_iter()),
            Fields::Raw { bytes, spans } => {
                let known = Known::of_name(name);
                Values::Raw { bytes, spans: spans.iter(), name: name.as_str().as_bytes(), known }
            }
        }
    }

    /// The value of the first field of kind `known`.
    #[inline]
    pub fn first_of(&self, known: Known) -> Option<&'a [u8]> {
        self.all_of(known).next()
    }

    /// The values of every field of kind `known` (not `Other`), in the order they came:
    /// found by kind, no name compared.
    pub fn all_of(&self, known: Known) -> Values<'a, 'static> {
        debug_assert!(known != Known::Other);
        match *self {
            Fields::Map(map) => Values::Map(map.get_all(known.header_name()).into_iter()),
            Fields::Raw { bytes, spans } => Values::Raw { bytes, spans: spans.iter(), name: b"", known },
        }
    }

    /// Every field with what it is, as (known, name, value), in the order they came.
    pub fn each(&self, f: &mut impl FnMut(Known, &'a [u8], &'a [u8])) {
        match *self {
            Fields::Map(map) => {
                for (name, value) in map {
                    f(Known::of_name(name), name.as_str().as_bytes(), value.as_bytes());
                }
            }
            Fields::Raw { bytes, spans } => {
                for span in spans {
                    f(span.known, span.name.get(bytes), span.value.get(bytes));
                }
            }
        }
    }

    pub fn contains(&self, name: &HeaderName) -> bool {
        self.get(name).is_some()
    }

    /// Every field, as (name, value), in the order they came.
    pub fn iter(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + use<'a> {
        let (map, raw) = match *self {
            Fields::Map(map) => (Some(map.iter().map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()))), None),
            Fields::Raw { bytes, spans } => {
                (None, Some(spans.iter().map(move |f| (f.name.get(bytes), f.value.get(bytes)))))
            }
        };
        map.into_iter().flatten().chain(raw.into_iter().flatten())
    }
}

/// The values of the fields of one name.
pub enum Values<'a, 'n> {
    Map(http::header::ValueIter<'a, http::HeaderValue>),
    /// `name` in lower case, as a `HeaderName` holds it, and what it is: a known name is
    /// found by its kind, any other by its bytes.
    Raw {
        bytes: &'a [u8],
        spans: std::slice::Iter<'a, FieldSpan>,
        name: &'n [u8],
        known: Known,
    },
}

impl FieldSpan {
    #[inline]
    fn is(&self, bytes: &[u8], name: &[u8], known: Known) -> bool {
        match known {
            Known::Other => self.known == Known::Other && self.name.get(bytes).eq_ignore_ascii_case(name),
            known => self.known == known,
        }
    }
}

impl<'a> Iterator for Values<'a, '_> {
    type Item = &'a [u8];

    #[inline]
    fn next(&mut self) -> Option<&'a [u8]> {
        match self {
            Values::Map(values) => values.next().map(|v| v.as_bytes()),
            Values::Raw { bytes, spans, name, known } => {
                spans.find(|f| f.is(bytes, name, *known)).map(|f| f.value.get(bytes))
            }
        }
    }
}

impl DoubleEndedIterator for Values<'_, '_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        match self {
            Values::Map(values) => values.next_back().map(|v| v.as_bytes()),
            Values::Raw { bytes, spans, name, known } => {
                spans.rfind(|f| f.is(bytes, name, *known)).map(|f| f.value.get(bytes))
            }
        }
    }
}

/// `value` as text if it holds visible ASCII only (and tabs), as `HeaderValue::to_str`
/// reads it: what a field that names hosts, addresses or numbers must be.
pub fn text(value: &[u8]) -> Option<&str> {
    value.iter().all(|&b| b == b'\t' || (0x20..0x7f).contains(&b)).then(|| std::str::from_utf8(value).ok()).flatten()
}

/// Whether a field named `name` is one of those `connection` (the message's `Connection`
/// values) names: hop-by-hop too (RFC 9110 §7.6.1).
pub fn named_by(name: &[u8], connection: &[&[u8]]) -> bool {
    connection.iter().any(|list| list.split(|&b| b == b',').any(|token| token.trim_ascii().eq_ignore_ascii_case(name)))
}

/// The fields of an upstream's response that the client gets, given to `emit`: all but
/// the hop-by-hop ones (a `101`'s `Upgrade` kept, with `Connection: upgrade`), the framing
/// fields (the writer's, unless `keep_length`: a response without body, to `HEAD` say,
/// whose `Content-Length` describes another), and those named in `replaced`.
pub fn response_fields(
    fields: Fields<'_>,
    switching: bool,
    keep_length: bool,
    replaced: &[&[u8]],
    emit: &mut impl FnMut(&[u8], &[u8]),
) {
    let connection: SmallVec<[&[u8]; 2]> = fields.all_of(Known::Connection).collect();
    fields.each(&mut |known, name, value| {
        let dropped = match known {
            // A `101`'s `Upgrade` says what the connection becomes.
            Known::Upgrade => !switching,
            Known::ContentLength => !keep_length,
            known => known.is_hop_by_hop() || (!connection.is_empty() && named_by(name, &connection)),
        } || replaced.iter().any(|r| r.eq_ignore_ascii_case(name));
        if !dropped {
            emit(name, value);
        }
    });
    if switching {
        emit(b"connection", b"upgrade");
    }
}

/// Whether a `TE` field's value lists `trailers`: its sender takes trailer fields (RFC
/// 9110 §10.1.4).
pub fn takes_trailers(value: &[u8]) -> bool {
    value.split(|&b| b == b',').any(|t| {
        let token = t.split(|&b| b == b';').next().unwrap_or_default();
        token.trim_ascii().eq_ignore_ascii_case(b"trailers")
    })
}

/// Longest trailer section passed on, counted as HTTP/2 counts a field list (name,
/// value and 32 bytes per field): what the HTTP/1 decoder allows a chunked body's.
pub const MAX_TRAILER_BYTES: usize = 8 * 1024;

/// The trailer fields of `trailers` that are passed on: none that may not be a trailer
/// (RFC 9110 §6.5.1: framing, routing, the hop-by-hop ones, `Trailer` itself); `None`
/// when the section is larger than `MAX_TRAILER_BYTES`, which fails the message.
pub fn trailer_fields(mut trailers: HeaderMap) -> Option<HeaderMap> {
    let size: usize = trailers.iter().map(|(n, v)| n.as_str().len() + v.len() + 32).sum();
    if size > MAX_TRAILER_BYTES {
        return None;
    }
    let connection: Vec<HeaderName> = trailers
        .get_all(http::header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .filter_map(|token| HeaderName::from_bytes(token.trim_ascii()).ok())
        .collect();
    for name in connection {
        trailers.remove(name);
    }
    let forbidden: Vec<HeaderName> = trailers
        .keys()
        .filter(|name| {
            let known = Known::of_name(name);
            known.is_hop_by_hop()
                || matches!(known, Known::Host | Known::ContentLength | Known::Expect)
                || [http::header::TRAILER, http::header::CONTENT_TYPE, http::header::CONTENT_ENCODING].contains(*name)
        })
        .cloned()
        .collect();
    for name in forbidden {
        trailers.remove(name);
    }
    Some(trailers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailers_lose_what_may_not_be_a_trailer_and_are_bounded() {
        let mut t = HeaderMap::new();
        for (name, value) in [
            ("grpc-status", "0"),
            ("connection", "x-secret"),
            ("x-secret", "1"),
            ("content-length", "5"),
            ("transfer-encoding", "chunked"),
            ("host", "a"),
            ("trailer", "x"),
            ("x-kept", "yes"),
        ] {
            t.append(HeaderName::from_static(name), value.parse().unwrap());
        }
        let kept = trailer_fields(t).unwrap();
        let names: Vec<&str> = kept.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["grpc-status", "x-kept"]);
        let mut big = HeaderMap::new();
        big.insert("x-big", "x".repeat(MAX_TRAILER_BYTES).parse().unwrap());
        assert!(trailer_fields(big).is_none());
    }

    #[test]
    fn each_known_kind_names_itself() {
        for known in [
            Known::Host,
            Known::Connection,
            Known::Upgrade,
            Known::Expect,
            Known::ContentLength,
            Known::TransferEncoding,
            Known::Te,
            Known::KeepAlive,
            Known::ProxyConnection,
            Known::XForwardedFor,
            Known::XForwardedProto,
            Known::XForwardedHost,
            Known::Forwarded,
            Known::Authorization,
            Known::Cookie,
            Known::ContentType,
            Known::GrpcTimeout,
        ] {
            assert_eq!(Known::of_name(known.header_name()), known);
            assert_eq!(Known::of(known.header_name().as_str().to_uppercase().as_bytes()), known);
        }
        assert_eq!(Known::of(b"Content-Length"), Known::ContentLength);
        // Of a known name's length and first letter, or neither, but none of them.
        for other in ["x-api-key", "", "t", "date", "hosT2", "x-forwarded-fox", "content-lengtx", "tx", "expecT-"] {
            assert_eq!(Known::of(other.as_bytes()), Known::Other, "{other}");
        }
    }
}
