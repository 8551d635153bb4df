//! Which route a request takes: the first, in file order, whose host, path and method
//! all match; and the host it names, which must be one and valid.

use http::uri::Authority;
use http::{Method, Version};

use crate::config::{PathMatch, Route, RouteMatch};
use crate::head::{Known, RequestHead, text};

/// Why a request's `Host` is unusable, if it is: HTTP/1.1 requires exactly one valid
/// `Host` (RFC 9112 §3.2); HTTP/1.0 and HTTP/2 may omit it, never repeat or garble it;
/// and an HTTP/2 `Host` naming another authority than `:authority` makes the request
/// malformed (RFC 9113 §8.3.1), since routes would see one and the upstream the other.
pub fn host_fault(head: &RequestHead<'_>) -> Option<&'static str> {
    let mut hosts = head.fields.all_of(Known::Host);
    let Some(host) = hosts.next() else {
        return (head.version == Version::HTTP_11).then_some("an HTTP/1.1 request needs a Host header");
    };
    if hosts.next().is_some() {
        return Some("more than one Host header");
    }
    // An authority without userinfo: `host[:port]`, nothing else.
    let valid = plain_host(host) || !host.contains(&b'@') && text(host).is_some_and(|h| h.parse::<Authority>().is_ok());
    if !valid {
        return Some("invalid Host header");
    }
    // HTTP/2's `:authority`, or an HTTP/1.1 absolute-form target (`GET http://a/x`), names
    // the host too; RFC 9112 §3.2.2 says to believe the target over `Host`, but a request
    // naming two hosts would be routed and limited as one and served as the other.
    match head.authority {
        Some(authority) if !authority.eq_ignore_ascii_case(text(host)?) => {
            Some("Host differs from the request target's authority")
        }
        _ => None,
    }
}

/// A host name or IPv4 address of letters, digits, `.` and `-`, with an optional port of
/// up to five digits: what nearly every request sends, and always a valid authority.
/// Checked by hand first because `Authority`'s parser copies the text into a new buffer,
/// an allocation per request for the common case.
fn plain_host(host: &[u8]) -> bool {
    let (name, port) = match host.iter().position(|&b| b == b':') {
        Some(colon) => (&host[..colon], &host[colon + 1..]),
        None => (host, &b"0"[..]),
    };
    !name.is_empty()
        && name.iter().all(|&b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        && port.iter().all(u8::is_ascii_digit)
        && std::str::from_utf8(port).is_ok_and(|p| p.parse::<u16>().is_ok())
}

/// The request's host without port: the `Host` field (HTTP/1.1), else the authority
/// the request names (HTTP/2 `:authority`).
pub fn request_host<'r>(head: &RequestHead<'r>) -> Option<&'r str> {
    let raw = match head.fields.first_of(Known::Host) {
        Some(value) => text(value)?,
        None => head.authority?,
    };
    let host = if raw.starts_with('[') {
        // IPv6 literal: keep the brackets, drop any port.
        &raw[..=raw.find(']')?]
    } else {
        raw.rsplit_once(':').map_or(raw, |(host, _port)| host)
    };
    Some(host.trim_end_matches('.'))
}

/// The index of the route that serves the request. `path` is the normalized path
/// (`crate::path`): its bytes need not be UTF-8.
pub fn match_route(routes: &[Route], method: &Method, path: &[u8], host: Option<&str>) -> Option<usize> {
    routes.iter().position(|route| matches(&route.matcher, method, path, host))
}

fn matches(m: &RouteMatch, method: &Method, path: &[u8], host: Option<&str>) -> bool {
    let host_ok = match (&m.host, host) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(want), Some(host)) => match want.strip_prefix("*.") {
            Some(suffix) => {
                host.len() > suffix.len() + 1
                    && host[host.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
                    && host.as_bytes()[host.len() - suffix.len() - 1] == b'.'
            }
            None => host.eq_ignore_ascii_case(want),
        },
    };
    let path_ok = match &m.path {
        PathMatch::Any => true,
        PathMatch::Prefix(prefix) => path.starts_with(prefix.as_bytes()),
        PathMatch::Exact(exact) => path == exact.as_bytes(),
    };
    host_ok && path_ok && (m.methods.is_empty() || m.methods.contains(method))
}

#[cfg(test)]
mod tests {
    use http::HeaderMap;

    use super::*;

    fn m(host: Option<&str>, path: PathMatch, methods: &[Method]) -> RouteMatch {
        RouteMatch { host: host.map(str::to_owned), path, methods: methods.to_vec() }
    }

    #[test]
    fn hosts_match_exactly_or_by_wildcard_without_port() {
        let exact = m(Some("example.com"), PathMatch::Any, &[]);
        assert!(matches(&exact, &Method::GET, b"/", Some("EXAMPLE.com")));
        assert!(!matches(&exact, &Method::GET, b"/", Some("www.example.com")));
        let wild = m(Some("*.example.com"), PathMatch::Any, &[]);
        assert!(matches(&wild, &Method::GET, b"/", Some("a.example.com")));
        assert!(!matches(&wild, &Method::GET, b"/", Some("example.com")));
        assert!(!matches(&wild, &Method::GET, b"/", Some("badexample.com")));
    }

    #[test]
    fn a_plain_host_is_one_the_authority_parser_accepts_too() {
        for host in ["example.com", "a", "127.0.0.1:8080", "x-y.z.:1", "A1:65535", "..", "-"] {
            assert!(plain_host(host.as_bytes()), "{host}");
            assert!(host.parse::<Authority>().is_ok(), "{host}");
        }
        for host in ["", ":80", "a:", "a:65536", "a:1:2", "[::1]:80", "a b", "u@h", "h:8x", "é"] {
            assert!(!plain_host(host.as_bytes()), "{host}");
        }
    }

    #[test]
    fn host_is_read_without_port() {
        let head = |headers: &'static HeaderMap, authority| RequestHead {
            method: &Method::GET,
            target: "/",
            version: Version::HTTP_11,
            authority,
            fields: crate::head::Fields::from(headers),
        };
        let h = |v: &str| {
            let mut map = HeaderMap::new();
            map.insert(http::header::HOST, v.parse().unwrap());
            &*Box::leak(Box::new(map))
        };
        assert_eq!(request_host(&head(h("example.com:8080"), None)), Some("example.com"));
        assert_eq!(request_host(&head(h("[::1]:8080"), None)), Some("[::1]"));
        let none = &*Box::leak(Box::new(HeaderMap::new()));
        assert_eq!(request_host(&head(none, Some("example.org:80"))), Some("example.org"));
    }

    #[test]
    fn paths_and_methods_narrow_a_route() {
        let r = m(None, PathMatch::Prefix("/api".into()), &[Method::POST]);
        assert!(matches(&r, &Method::POST, b"/api/x", None));
        assert!(!matches(&r, &Method::GET, b"/api/x", None));
        assert!(!matches(&r, &Method::POST, b"/ap", None));
        let e = m(None, PathMatch::Exact("/login".into()), &[]);
        assert!(matches(&e, &Method::GET, b"/login", None));
        assert!(!matches(&e, &Method::GET, b"/login/x", None));
    }
}
