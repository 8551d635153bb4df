//! What changes at each hop: the client's address behind trusted proxies, hop-by-hop
//! fields removed, upgrades kept, and the forwarding fields (`X-Forwarded-*`, and
//! `Forwarded` of RFC 7239 in `forwarded`) sent upstream.

pub mod forwarded;

use std::net::{IpAddr, SocketAddr};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use ipnet::IpNet;

use crate::config::ForwardedMode;
use crate::head::{Fields, text};
use forwarded::Node;

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

pub fn is_trusted(ip: IpAddr, trusted: &[IpNet]) -> bool {
    trusted.iter().any(|net| net.contains(&ip))
}

/// The client's address: the peer, or when the peer is a trusted proxy, the rightmost
/// `X-Forwarded-For` (or `Forwarded` `for=`, per `mode`) entry that is not a trusted
/// proxy. The entries left of it were written by the client itself and prove nothing, so
/// the leftmost is never taken. An entry that does not parse (or an `unknown` or
/// obfuscated `Forwarded` node) ends the walk at the last good hop.
pub fn client_ip(peer: IpAddr, fields: Fields<'_>, trusted: &[IpNet], mode: ForwardedMode) -> IpAddr {
    let mut client = peer.to_canonical();
    if !is_trusted(client, trusted) {
        return client;
    }
    let rfc7239 = match mode {
        ForwardedMode::XForwarded => false,
        ForwardedMode::Rfc7239 => true,
        ForwardedMode::Both => fields.contains(&header::FORWARDED),
    };
    if rfc7239 {
        for node in forwarded::for_nodes(fields.get_all(&header::FORWARDED)).into_iter().rev() {
            let Node::Ip(ip) = node else { return client };
            client = ip.to_canonical();
            if !is_trusted(client, trusted) {
                return client;
            }
        }
        return client;
    }
    for value in fields.get_all(&X_FORWARDED_FOR).rev() {
        let Some(text) = text(value) else {
            return client;
        };
        for hop in text.rsplit(',').map(str::trim).filter(|h| !h.is_empty()) {
            let Some(ip) = parse_hop(hop) else {
                return client;
            };
            client = ip.to_canonical();
            if !is_trusted(client, trusted) {
                return client;
            }
        }
    }
    client
}

/// `1.2.3.4`, `2001:db8::1`, `1.2.3.4:5678` or `[2001:db8::1]:443`.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    hop.parse().ok().or_else(|| hop.parse::<SocketAddr>().ok().map(|s| s.ip()))
}

/// Removes the hop-by-hop fields (RFC 9110 §7.6.1): those named in `Connection`, and
/// `Connection`, `Proxy-Connection`, `Keep-Alive`, `TE`, `Transfer-Encoding`, `Upgrade`.
pub fn remove_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry none of them: a look at the names present costs a few
    // comparisons, six removals six lookups (a tenth of a request's header work).
    let hop = [
        &header::CONNECTION,
        &PROXY_CONNECTION,
        &KEEP_ALIVE,
        &header::TE,
        &header::TRANSFER_ENCODING,
        &header::UPGRADE,
    ];
    if !headers.keys().any(|name| hop.contains(&name)) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in hop {
        headers.remove(name);
    }
}

/// The protocol an HTTP/1.1 request asks to switch to: its `Upgrade` field, when its
/// `Connection` field names `upgrade` (RFC 9110 §7.8). HTTP/2 has no such upgrade.
pub fn upgrade_protocol(version: http::Version, headers: &HeaderMap) -> Option<HeaderValue> {
    let asked = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("upgrade"));
    if version != http::Version::HTTP_11 || !asked {
        return None;
    }
    headers.get(header::UPGRADE).cloned()
}

/// Puts back, after hop-by-hop removal, the two fields that carry an upgrade to the
/// next hop: `Connection: upgrade` and `Upgrade: PROTOCOL`.
pub fn keep_upgrade(headers: &mut HeaderMap, protocol: HeaderValue) {
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, protocol);
}

/// Sets the forwarding fields for the upstream: `X-Forwarded-*`, `Forwarded` (RFC 7239)
/// or both, per `mode`. From a trusted proxy, the chain it sent is extended; from anyone
/// else, incoming values are replaced (or, for the fields `mode` does not send, removed),
/// so the upstream never sees forwarding claims that no trusted hop vouched for.
/// `X-Forwarded-Host` and `host=` are the request's `Host`, as the client sent it.
pub fn set_forwarded(headers: &mut HeaderMap, peer: IpAddr, trusted_peer: bool, tls: bool, mode: ForwardedMode) {
    if mode != ForwardedMode::XForwarded {
        let element = forwarded::element(peer, tls, headers.get(header::HOST));
        let earlier: Vec<&str> = headers.get_all(header::FORWARDED).iter().filter_map(|v| v.to_str().ok()).collect();
        let value =
            if trusted_peer && !earlier.is_empty() { format!("{}, {element}", earlier.join(", ")) } else { element };
        if let Ok(value) = HeaderValue::try_from(value) {
            headers.insert(header::FORWARDED, value);
        }
    }
    if mode == ForwardedMode::Rfc7239 {
        if !trusted_peer {
            for name in [&X_FORWARDED_FOR, &X_FORWARDED_PROTO, &X_FORWARDED_HOST] {
                headers.remove(name);
            }
        }
        return;
    }
    let peer = ip_text(peer.to_canonical());
    let chain = if trusted_peer {
        let earlier: Vec<&str> = headers.get_all(&X_FORWARDED_FOR).iter().filter_map(|v| v.to_str().ok()).collect();
        if earlier.is_empty() { peer } else { format!("{}, {peer}", earlier.join(", ")) }
    } else {
        peer
    };
    if let Ok(value) = HeaderValue::try_from(chain) {
        headers.insert(&X_FORWARDED_FOR, value);
    }
    if !(trusted_peer && headers.contains_key(&X_FORWARDED_PROTO)) {
        headers.insert(&X_FORWARDED_PROTO, HeaderValue::from_static(if tls { "https" } else { "http" }));
    }
    if !(trusted_peer && headers.contains_key(&X_FORWARDED_HOST)) {
        match headers.get(header::HOST).cloned() {
            Some(host) => headers.insert(&X_FORWARDED_HOST, host),
            None => headers.remove(&X_FORWARDED_HOST),
        };
    }
}

/// An address as `Display` writes it. IPv4, what nearly every request carries, is
/// written digit by digit: `Ipv4Addr`'s `Display` goes through the formatting machinery
/// and cost more instructions per forwarded request than all other header work here.
fn ip_text(ip: IpAddr) -> String {
    let IpAddr::V4(v4) = ip else { return ip.to_string() };
    let mut out = String::with_capacity(15);
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        if octet >= 100 {
            out.push(char::from(b'0' + octet / 100));
        }
        if octet >= 10 {
            out.push(char::from(b'0' + octet / 10 % 10));
        }
        out.push(char::from(b'0' + octet % 10));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        for text in ["0.0.0.0", "1.2.3.4", "10.0.99.100", "127.0.0.1", "255.255.255.255", "2001:db8::1", "::1"] {
            let ip: IpAddr = text.parse().unwrap();
            assert_eq!(ip_text(ip), ip.to_string());
        }
        for n in [0u32, 9, 10, 99, 100, 199, 200, 255, 0x0a0b_0c0d, u32::MAX] {
            let ip = IpAddr::V4(n.into());
            assert_eq!(ip_text(ip), ip.to_string());
        }
    }

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    fn xff(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(&X_FORWARDED_FOR, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn untrusted_peer_is_the_client_whatever_it_claims() {
        let h = xff(&["1.1.1.1"]);
        assert_eq!(
            client_ip("9.9.9.9".parse().unwrap(), Fields::from(&h), &nets(&["10.0.0.0/8"]), ForwardedMode::XForwarded),
            "9.9.9.9".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn rightmost_untrusted_hop_is_the_client_never_the_leftmost() {
        let trusted = nets(&["10.0.0.0/8"]);
        let h = xff(&["6.6.6.6, 2.2.2.2", "10.0.0.7"]);
        assert_eq!(
            client_ip("10.0.0.1".parse().unwrap(), Fields::from(&h), &trusted, ForwardedMode::XForwarded),
            "2.2.2.2".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn garbage_in_the_chain_stops_at_the_last_good_hop() {
        let trusted = nets(&["10.0.0.0/8"]);
        let h = xff(&["not-an-ip, 10.0.0.9"]);
        assert_eq!(
            client_ip("10.0.0.1".parse().unwrap(), Fields::from(&h), &trusted, ForwardedMode::XForwarded),
            "10.0.0.9".parse::<IpAddr>().unwrap()
        );
        let h = xff(&["[2001:db8::1]:443"]);
        assert_eq!(
            client_ip("10.0.0.1".parse().unwrap(), Fields::from(&h), &trusted, ForwardedMode::XForwarded),
            "2001:db8::1".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn forwarded_for_is_walked_from_the_right_like_x_forwarded_for() {
        let trusted = nets(&["10.0.0.0/8"]);
        let mut h = HeaderMap::new();
        h.append(header::FORWARDED, "for=6.6.6.6, for=\"[2001:db8::2]\"".parse().unwrap());
        h.append(header::FORWARDED, "for=10.0.0.7;proto=https".parse().unwrap());
        h.append(&X_FORWARDED_FOR, "3.3.3.3".parse().unwrap());
        let peer: IpAddr = "10.0.0.1".parse().unwrap();
        let v6: IpAddr = "2001:db8::2".parse().unwrap();
        assert_eq!(client_ip(peer, Fields::from(&h), &trusted, ForwardedMode::Rfc7239), v6);
        assert_eq!(client_ip(peer, Fields::from(&h), &trusted, ForwardedMode::Both), v6);
        assert_eq!(
            client_ip(peer, Fields::from(&h), &trusted, ForwardedMode::XForwarded),
            "3.3.3.3".parse::<IpAddr>().unwrap()
        );
        h.insert(header::FORWARDED, "for=5.5.5.5, for=unknown".parse().unwrap());
        assert_eq!(client_ip(peer, Fields::from(&h), &trusted, ForwardedMode::Rfc7239), peer);
    }

    #[test]
    fn connection_named_fields_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, "keep-alive, x-secret".parse().unwrap());
        h.insert("x-secret", "1".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("x-kept", "1".parse().unwrap());
        remove_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-kept"));
    }

    #[test]
    fn only_a_connection_upgrade_on_http11_is_an_upgrade() {
        let mut h = HeaderMap::new();
        h.insert(header::UPGRADE, "websocket".parse().unwrap());
        assert_eq!(upgrade_protocol(http::Version::HTTP_11, &h), None);
        h.insert(header::CONNECTION, "keep-alive, Upgrade".parse().unwrap());
        assert_eq!(upgrade_protocol(http::Version::HTTP_11, &h).unwrap(), "websocket");
        assert_eq!(upgrade_protocol(http::Version::HTTP_2, &h), None);
        assert_eq!(upgrade_protocol(http::Version::HTTP_10, &h), None);
    }

    #[test]
    fn forwarded_chain_is_extended_only_for_trusted_peers() {
        let mut h = xff(&["1.1.1.1"]);
        set_forwarded(&mut h, "10.0.0.1".parse().unwrap(), true, false, ForwardedMode::XForwarded);
        assert_eq!(h[&X_FORWARDED_FOR], "1.1.1.1, 10.0.0.1");
        let mut h = xff(&["1.1.1.1"]);
        h.insert(&X_FORWARDED_HOST, "evil".parse().unwrap());
        h.insert(header::HOST, "example.com".parse().unwrap());
        set_forwarded(&mut h, "9.9.9.9".parse().unwrap(), false, false, ForwardedMode::XForwarded);
        assert_eq!(h[&X_FORWARDED_FOR], "9.9.9.9");
        assert_eq!(h[&X_FORWARDED_HOST], "example.com");
        assert_eq!(h[&X_FORWARDED_PROTO], "http");
    }
}
