//! The `Forwarded` field (RFC 7239): the `for=` hops a trusted proxy reports, and the
//! element this hop appends.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use crate::wire::head::text;

/// One `for=` value of a `Forwarded` element, as far as the client address goes.
#[derive(Debug, PartialEq, Eq)]
pub enum Node {
    Ip(IpAddr),
    /// `unknown`, an obfuscated `_name` (§6.3), or anything that does not parse.
    Opaque,
}

/// The `for=` node of every element in `values`, first to last (a value may hold
/// several elements; an element without `for=` is `Opaque`, as its sender hid the hop).
pub fn for_nodes<'a>(values: impl Iterator<Item = &'a [u8]>) -> Vec<Node> {
    let mut nodes = Vec::new();
    for value in values {
        let Some(text) = text(value) else {
            nodes.push(Node::Opaque);
            continue;
        };
        for element in split_outside_quotes(text, ',') {
            if element.trim().is_empty() {
                continue;
            }
            let node = split_outside_quotes(element, ';')
                .filter_map(|pair| pair.split_once('='))
                .find(|(name, _)| name.trim().eq_ignore_ascii_case("for"))
                .map_or(Node::Opaque, |(_, value)| node(&unquote(value.trim())));
            nodes.push(node);
        }
    }
    nodes
}

/// `192.0.2.1`, `192.0.2.1:8080`, `[2001:db8::1]` or `[2001:db8::1]:443` (§6).
fn node(text: &str) -> Node {
    let ip = text
        .parse::<IpAddr>()
        .ok()
        .or_else(|| text.parse::<SocketAddr>().ok().map(|s| s.ip()))
        .or_else(|| text.strip_prefix('[')?.strip_suffix(']')?.parse().ok());
    ip.map_or(Node::Opaque, Node::Ip)
}

/// `text` cut at each `sep` that is not inside a quoted string (RFC 9110 §5.6.4).
fn split_outside_quotes(text: &str, sep: char) -> impl Iterator<Item = &str> {
    let mut quoted = false;
    let mut escaped = false;
    text.split(move |c| {
        if escaped {
            escaped = false;
        } else if quoted && c == '\\' {
            escaped = true;
        } else if c == '"' {
            quoted = !quoted;
        } else if c == sep && !quoted {
            return true;
        }
        false
    })
}

fn unquote(text: &str) -> String {
    match text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
        Some(inner) => {
            let mut out = String::with_capacity(inner.len());
            let mut chars = inner.chars();
            while let Some(c) = chars.next() {
                out.extend(if c == '\\' { chars.next() } else { Some(c) });
            }
            out
        }
        None => text.to_owned(),
    }
}

/// This hop's element: `for=PEER;proto=http|https;host=HOST` (§4), IPv6 addresses in
/// brackets and quoted, a value that is not a token quoted.
pub fn element(peer: IpAddr, tls: bool, host: Option<&[u8]>) -> String {
    let mut out = match peer.to_canonical() {
        IpAddr::V4(ip) => format!("for={ip}"),
        IpAddr::V6(ip) => format!("for=\"[{ip}]\""),
    };
    out.push_str(if tls { ";proto=https" } else { ";proto=http" });
    if let Some(host) = host.and_then(text) {
        let _ = write!(out, ";host={}", token_or_quoted(host));
    }
    out
}

fn token_or_quoted(value: &str) -> String {
    // tchar (RFC 9110 §5.6.2).
    let tchar = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if !value.is_empty() && value.chars().all(tchar) {
        return value.to_owned();
    }
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(values: &[&str]) -> Vec<Node> {
        for_nodes(values.iter().map(|v| v.as_bytes()))
    }

    fn ip(text: &str) -> Node {
        Node::Ip(text.parse().unwrap())
    }

    #[test]
    fn for_values_of_every_form_are_read() {
        assert_eq!(
            nodes(&["for=192.0.2.43, for=\"[2001:db8:cafe::17]\";proto=https", "For=\"198.51.100.17:8080\";by=x"]),
            vec![ip("192.0.2.43"), ip("2001:db8:cafe::17"), ip("198.51.100.17")]
        );
        assert_eq!(nodes(&["for=\"[2001:db8::1]:4711\""]), vec![ip("2001:db8::1")]);
    }

    #[test]
    fn hidden_and_broken_hops_are_opaque() {
        assert_eq!(
            nodes(&["for=unknown, for=_hidden, proto=http, for=\"[::1\""]),
            vec![Node::Opaque, Node::Opaque, Node::Opaque, Node::Opaque]
        );
        // A comma inside a quoted string does not start an element.
        assert_eq!(nodes(&["host=\"a,b\";for=10.0.0.1"]), vec![ip("10.0.0.1")]);
    }

    #[test]
    fn elements_quote_ipv6_and_hosts_with_ports() {
        let host = b"example.com:8443";
        assert_eq!(
            element("2001:db8::1".parse().unwrap(), true, Some(host)),
            "for=\"[2001:db8::1]\";proto=https;host=\"example.com:8443\""
        );
        assert_eq!(element("192.0.2.1".parse().unwrap(), false, None), "for=192.0.2.1;proto=http");
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
        let host = b"example.com";
        assert_eq!(element(mapped, false, Some(host)), "for=192.0.2.1;proto=http;host=example.com");
    }
}
