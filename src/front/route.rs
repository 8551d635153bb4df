//! The host a request names, which must be one and valid, as routing reads it (the
//! route itself is `router`'s).

use http::Version;
use http::uri::Authority;

use crate::wire::head::{Known, RequestHead, text};

/// The request's host without port, as `request_host` reads it, once its `Host` is
/// known to be usable; else why it is not. One pass over the fields for both, and for a
/// plain `Host` one over its bytes: every request is checked and routed by its host.
pub fn checked_host<'r>(head: &RequestHead<'r>) -> Result<Option<&'r str>, &'static str> {
    Ok(match host_field(head)? {
        Some(Host::Plain(name)) => Some(name),
        Some(Host::Other(field)) => host_of(Some(field), head.authority),
        None => host_of(None, head.authority),
    })
}

/// A valid `Host` value.
enum Host<'r> {
    /// A plain one (`plain_host`), read already: its name without port.
    Plain(&'r str),
    Other(&'r [u8]),
}

/// The request's one `Host` value, if it has one; or why its `Host` is unusable:
/// HTTP/1.1 requires exactly one valid `Host` (RFC 9112 §3.2); HTTP/1.0 and HTTP/2 may
/// omit it, never repeat or garble it; and an HTTP/2 `Host` naming another authority
/// than `:authority` makes the request malformed (RFC 9113 §8.3.1), since routes would
/// see one and the upstream the other.
fn host_field<'r>(head: &RequestHead<'r>) -> Result<Option<Host<'r>>, &'static str> {
    let mut hosts = head.fields.all_of(Known::Host);
    let Some(host) = hosts.next() else {
        return match head.version == Version::HTTP_11 {
            true => Err("an HTTP/1.1 request needs a Host header"),
            false => Ok(None),
        };
    };
    if hosts.next().is_some() {
        return Err("more than one Host header");
    }
    // An authority without userinfo: `host[:port]`, nothing else.
    let plain = plain_host(host);
    let valid = plain.is_some()
        || !host.contains(&b'@')
            && valid_port(host)
            && valid_ip_literal(host)
            && text(host).is_some_and(|h| h.parse::<Authority>().is_ok());
    if !valid {
        return Err("invalid Host header");
    }
    // HTTP/2's `:authority`, or an HTTP/1.1 absolute-form target (`GET http://a/x`), names
    // the host too; RFC 9112 §3.2.2 says to believe the target over `Host`, but a request
    // naming two hosts would be routed and limited as one and served as the other. (A
    // valid host is printable ASCII: its bytes compare as its text.)
    match head.authority {
        Some(authority) if !authority.as_bytes().eq_ignore_ascii_case(host) => {
            Err("Host differs from the request target's authority")
        }
        _ => Ok(Some(plain.map_or(Host::Other(host), Host::Plain))),
    }
}

/// A host name or IPv4 address of letters, digits, `.` and `-`, with an optional port of
/// up to five digits: what nearly every request sends, and always a valid authority. Its
/// name without port (nor trailing dots, as `host_of` reads it), when `host` is one.
/// Checked by hand, in one pass, first because `Authority`'s parser copies the text into
/// a new buffer, an allocation per request for the common case.
fn plain_host(host: &[u8]) -> Option<&str> {
    let mut colon = None;
    // The port, summed as it is read (parsing it as text would check the bytes again).
    let mut port = 0u32;
    for (i, &b) in host.iter().enumerate() {
        match (colon, b) {
            (None, b':') => colon = Some(i),
            (None, b) if b.is_ascii_alphanumeric() || b == b'.' || b == b'-' => {}
            (Some(_), b) if b.is_ascii_digit() && port <= 6553 => port = port * 10 + u32::from(b - b'0'),
            _ => return None,
        }
    }
    let mut name = match colon {
        Some(colon) if colon + 1 == host.len() || port > 65535 => return None,
        Some(colon) => &host[..colon],
        None => host,
    };
    if name.is_empty() {
        return None;
    }
    while let [rest @ .., b'.'] = name {
        name = rest;
    }
    std::str::from_utf8(name).ok()
}

/// The port of `host` (`name:port`, `[v6]:port`), if it has one, is a port: digits, at
/// most 65535 (RFC 9112 §3.2: a `Host` with an invalid port is a 400). `Authority`'s
/// parser takes any bytes after the colon.
fn valid_port(host: &[u8]) -> bool {
    let after_name = match host.iter().rposition(|&b| b == b']') {
        Some(bracket) => &host[bracket + 1..],
        None => host,
    };
    match after_name.iter().rposition(|&b| b == b':') {
        None => true,
        Some(colon) => {
            let port = &after_name[colon + 1..];
            port.iter().all(u8::is_ascii_digit)
                && std::str::from_utf8(port).is_ok_and(|p| p.is_empty() || p.parse::<u16>().is_ok())
        }
    }
}

/// Whether a host in brackets is an IP-literal as RFC 3986 §3.2.2 writes it: an IPv6
/// address or an `IPvFuture` (`v` HEXDIG+ `.` then unreserved, sub-delims or `:`).
/// `Authority`'s parser takes any bytes between the brackets (`[::,1]`), which the
/// upstream would be handed as `X-Forwarded-Host`. A host without brackets passes.
fn valid_ip_literal(host: &[u8]) -> bool {
    let Some(inside) = host.strip_prefix(b"[") else { return !host.contains(&b']') };
    let Some(end) = inside.iter().position(|&b| b == b']') else { return false };
    let literal = &inside[..end];
    if let [b'v' | b'V', rest @ ..] = literal {
        let Some(dot) = rest.iter().position(|&b| b == b'.') else { return false };
        let (version, tail) = (&rest[..dot], &rest[dot + 1..]);
        return !version.is_empty()
            && version.iter().all(u8::is_ascii_hexdigit)
            && !tail.is_empty()
            && tail.iter().all(|&b| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:".contains(&b));
    }
    text(literal).is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok())
}

/// The request's host without port: the `Host` field (HTTP/1.1), else the authority
/// the request names (HTTP/2 `:authority`).
pub fn request_host<'r>(head: &RequestHead<'r>) -> Option<&'r str> {
    host_of(head.fields.first_of(Known::Host), head.authority)
}

/// The host without port of a request whose `Host` is `field`, else `authority`.
fn host_of<'r>(field: Option<&'r [u8]>, authority: Option<&'r str>) -> Option<&'r str> {
    let raw = match field {
        Some(value) => value,
        None => authority?.as_bytes(),
    };
    // Byte by byte: this runs for every request, and `str`'s searches cost several
    // times more for a host of a few bytes.
    let mut host = match raw.first() {
        // IPv6 literal: keep the brackets, drop any port.
        Some(b'[') => &raw[..=raw.iter().position(|&b| b == b']')?],
        _ => raw.iter().rposition(|&b| b == b':').map_or(raw, |colon| &raw[..colon]),
    };
    while let [name @ .., b'.'] = host {
        host = name;
    }
    text(host)
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, Method};

    use super::*;

    #[test]
    fn a_plain_host_is_one_the_authority_parser_accepts_too() {
        for host in ["example.com", "a", "127.0.0.1:8080", "x-y.z.:1", "A1:65535", "..", "-", "x:00080"] {
            assert!(plain_host(host.as_bytes()).is_some(), "{host}");
            assert!(host.parse::<Authority>().is_ok(), "{host}");
        }
        for host in ["", ":80", "a:", "a:65536", "a:70000", "a:1:2", "[::1]:80", "a b", "u@h", "h:8x", "é"] {
            assert!(plain_host(host.as_bytes()).is_none(), "{host}");
        }
    }

    #[test]
    fn a_host_with_a_port_that_is_no_port_is_invalid() {
        for host in ["x:abc", "x:8x", "x:65536", "[::1]:ab", "[::1]:99999", "x:-1", "x_y:abc"] {
            assert!(!valid_port(host.as_bytes()), "{host}");
        }
        for host in ["x", "x:80", "x:", "[::1]", "[::1]:443", "x_y:1"] {
            assert!(valid_port(host.as_bytes()), "{host}");
        }
    }

    #[test]
    fn an_ip_literal_is_an_ipv6_address_or_an_ipvfuture_and_nothing_else() {
        for host in
            ["[::1]", "[::1]:80", "[2001:db8::7]", "[::ffff:192.0.2.1]:8080", "[v1.x:y]", "[V7f.a-b]", "a.b", "a"]
        {
            assert!(valid_ip_literal(host.as_bytes()), "{host}");
        }
        for host in
            ["[::,1]:80", "[::,1]", "[]", "[127.0.0.1]", "[::1", "[fe80::1%25eth0]", "[v.x]", "[v1.]", "[v1.a/b]", "a]"]
        {
            assert!(!valid_ip_literal(host.as_bytes()), "{host}");
        }
    }

    #[test]
    fn host_is_read_without_port() {
        let head = |headers: &'static HeaderMap, authority| RequestHead {
            method: &Method::GET,
            target: "/",
            version: Version::HTTP_11,
            authority,
            fields: crate::wire::head::Fields::from(headers),
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
}
