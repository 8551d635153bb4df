//! A request head as every step above the wire reads it, whichever protocol carried it:
//! method, target, version, the authority an HTTP/2 request names, and its header
//! fields (`Fields`). Routing, keys, allow-lists, the gate's inputs and the access log
//! read this view and nothing protocol-specific. A leaf: it imports no other module.

use http::{HeaderMap, HeaderName, Method, Version};

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
        self.target.split_once('?').map_or(self.target, |(path, _)| path)
    }

    /// The target's query, without the `?`.
    pub fn query(&self) -> Option<&'a str> {
        self.target.split_once('?').map(|(_, query)| query)
    }
}

/// The header fields of a request, looked up by name (case-insensitively, as RFC 9110
/// §5.1 says), values as the bytes that were sent.
#[derive(Clone, Copy)]
pub struct Fields<'a>(&'a HeaderMap);

impl<'a> From<&'a HeaderMap> for Fields<'a> {
    fn from(map: &'a HeaderMap) -> Self {
        Fields(map)
    }
}

impl<'a> Fields<'a> {
    /// The value of the first field named `name`.
    #[inline]
    pub fn get(&self, name: &HeaderName) -> Option<&'a [u8]> {
        self.0.get(name).map(|v| v.as_bytes())
    }

    /// The values of every field named `name`, in the order they came.
    pub fn get_all(&self, name: &HeaderName) -> impl DoubleEndedIterator<Item = &'a [u8]> + use<'a> {
        self.0.get_all(name).into_iter().map(|v| v.as_bytes())
    }

    pub fn contains(&self, name: &HeaderName) -> bool {
        self.0.contains_key(name)
    }

    /// Every field, as (name, value), in the order they came.
    pub fn iter(&self) -> impl Iterator<Item = (&'a str, &'a [u8])> + use<'a> {
        self.0.iter().map(|(name, value)| (name.as_str(), value.as_bytes()))
    }
}

/// `value` as text if it holds visible ASCII only (and tabs), as `HeaderValue::to_str`
/// reads it: what a field that names hosts, addresses or numbers must be.
pub fn text(value: &[u8]) -> Option<&str> {
    value.iter().all(|&b| b == b'\t' || (0x20..0x7f).contains(&b)).then(|| std::str::from_utf8(value).ok()).flatten()
}
