//! What changes at each hop: the client's address behind trusted proxies, hop-by-hop
//! fields removed, upgrades kept, and the forwarding fields (`X-Forwarded-*`, and
//! `Forwarded` of RFC 7239 in `forwarded`) sent upstream.

pub mod forwarded;

use std::net::{IpAddr, SocketAddr};

use http::header;
use ipnet::IpNet;

use smallvec::SmallVec;

use crate::config::{ForwardedMode, Rewrite};
use crate::variables::Request;
use crate::wire::head::{Fields, Known, named_by, takes_trailers, text};
use forwarded::Node;

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
        for node in forwarded::for_nodes(fields.all_of(Known::Forwarded)).into_iter().rev() {
            let Node::Ip(ip) = node else { return client };
            client = ip.to_canonical();
            if !is_trusted(client, trusted) {
                return client;
            }
        }
        return client;
    }
    for value in fields.all_of(Known::XForwardedFor).rev() {
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

/// The protocol an HTTP/1.1 request asks to switch to: its `Upgrade` field, when its
/// `Connection` field names `upgrade` (RFC 9110 §7.8). HTTP/2 has no such upgrade.
pub fn upgrade_protocol<'a>(version: http::Version, fields: Fields<'a>) -> Option<&'a [u8]> {
    if version != http::Version::HTTP_11 {
        return None;
    }
    let asked = fields
        .all_of(Known::Connection)
        .flat_map(|v| v.split(|&b| b == b','))
        .any(|token| token.trim_ascii().eq_ignore_ascii_case(b"upgrade"));
    if asked { fields.first_of(Known::Upgrade) } else { None }
}

/// How a request is handed to the next hop.
pub struct Hop<'a> {
    pub peer: IpAddr,
    /// The peer is a trusted proxy: the forwarding chain it sent is extended.
    pub trusted_peer: bool,
    /// The client connection is TLS.
    pub tls: bool,
    /// Which forwarding fields the upstream gets.
    pub forwarded: ForwardedMode,
    /// The protocol the client asks to switch to (`Upgrade`), carried to the upstream.
    pub upgrade: Option<&'a [u8]>,
    /// The route's changes to the request's fields.
    pub rewrite: &'a Rewrite,
    /// The request's HTTP/2 `:authority` (HTTP/1: its absolute-form target's), which
    /// stands for `Host` where the request has none (RFC 9113 §8.3.1).
    pub authority: Option<&'a [u8]>,
    /// Fields whose names hold `_` go on (`server.underscores_in_headers`), but those
    /// that would stand for a field set here.
    pub underscores: bool,
    /// What the variables of `set_request_headers` values stand for.
    pub vars: Request<'a>,
    /// Some limit of the configuration annotates (`Config::annotating`): the field that
    /// names them (`annotation_field`, `RateLimit-Exceeded` by default). The client's own
    /// of it and of `RateLimit` are dropped.
    pub annotating: Option<&'a [u8]>,
    /// The fields the request's soft limits set, if any annotates it.
    pub annotation: Option<Annotation<'a>>,
}

/// What a request's soft limits tell its upstream (`action: annotate`, `annotate_from`):
/// the values of `RateLimit-Exceeded` (the limits' names) and `RateLimit` (their items).
#[derive(Clone, Copy)]
pub struct Annotation<'a> {
    pub exceeded: &'a [u8],
    pub ratelimit: &'a [u8],
}

/// The request fields soft limits set: the one that names them (`Hop::annotating`) and
/// `RateLimit`. Where limits may annotate, a client's own are never forwarded, so that
/// it can neither forge an annotation nor hide one (one field saying
/// `RateLimit-Exceeded: other` first, say).
fn annotation_fields(named: &[u8]) -> [&[u8]; 2] {
    [named, b"ratelimit"]
}

/// Whether a field named `name`, which holds `_`, is dropped. CGI and the frameworks that
/// follow it read `X_Forwarded_For` and `X-Forwarded-For` as one variable, so a client
/// could forge what this hop sets: by default every such field is dropped (as nginx's
/// `underscores_in_headers off` does); kept, never one that would stand for a field this
/// hop sets or frames the request by, nor one the route sets.
fn underscored_dropped(name: &[u8], hop: &Hop<'_>) -> bool {
    let rewrite = hop.rewrite;
    if !hop.underscores {
        return true;
    }
    // The longest name a hop sets or frames by is 17 bytes.
    let mut dashed = [0u8; 32];
    let known = match dashed.get_mut(..name.len()) {
        Some(room) => {
            for (to, &from) in room.iter_mut().zip(name) {
                *to = if from == b'_' { b'-' } else { from };
            }
            Known::of(room)
        }
        None => Known::Other,
    };
    let same = |set: &[u8]| {
        set.len() == name.len()
            && set.iter().zip(name).all(|(&a, &b)| a.eq_ignore_ascii_case(&b) || (a == b'-' && b == b'_'))
    };
    !matches!(known, Known::Other | Known::Authorization | Known::Cookie)
        || rewrite.set_request_headers.iter().any(|(n, _)| same(n.as_str().as_bytes()))
        || hop.annotating.is_some_and(|named| annotation_fields(named).iter().any(|f| same(f)))
}

/// The fields a request with `fields` carries to the next hop, in order, given to
/// `emit` as (name, value): the client's own (names as sent) but the hop-by-hop ones,
/// `Host`, `Content-Length`, `Expect` (the hop answers it) and the forwarding fields; the
/// route's `set_request_headers`, whose names replace the client's, less the route's
/// `remove_request_headers`; the soft limits' `RateLimit-Exceeded` and `RateLimit`, in
/// place of the client's (`Hop::annotating`); `Host` (`host`: as the route's `upstream_host` says, for the
/// server at hand); the upgrade's `Connection` and `Upgrade`; then the forwarding fields
/// (`X-Forwarded-*`, `Forwarded`), extended when the peer is a trusted proxy and replaced
/// otherwise, so that an upstream never sees forwarding claims no trusted hop made. The
/// framing fields are the writer's. Of `TE`, the one value a proxy passes on is
/// `trailers` (RFC 9110 §10.1.4; the one HTTP/2 allows, RFC 9113 §8.2.2): it says the
/// client takes trailer fields, which gRPC servers require.
pub fn request_fields(fields: Fields<'_>, hop: &Hop<'_>, host: Option<&[u8]>, emit: &mut impl FnMut(&[u8], &[u8])) {
    let rewrite = hop.rewrite;
    let connection: SmallVec<[&[u8]; 2]> = fields.all_of(Known::Connection).collect();
    // (Soft limits' fields are replaced as a route's are: no test more per field.)
    let rewrites = !rewrite.set_request_headers.is_empty()
        || !rewrite.remove_request_headers.is_empty()
        || hop.annotating.is_some();
    let replaced = |name: &[u8]| {
        rewrite.set_request_headers.iter().any(|(n, _)| n.as_str().as_bytes().eq_ignore_ascii_case(name))
            || rewrite.remove_request_headers.iter().any(|n| n.as_str().as_bytes().eq_ignore_ascii_case(name))
            || hop.annotating.is_some_and(|named| annotation_fields(named).iter().any(|f| f.eq_ignore_ascii_case(name)))
    };
    let rfc7239 = hop.forwarded != ForwardedMode::XForwarded;
    let x_forwarded = hop.forwarded != ForwardedMode::Rfc7239;
    if let Some(host) = host {
        emit(b"host", host);
    }
    let mut trailers = false;
    fields.each(&mut |known, name, value| {
        let dropped = match known {
            Known::Host | Known::ContentLength | Known::Expect => true,
            Known::Te => {
                trailers |= takes_trailers(value);
                true
            }
            // Rebuilt below; with `rfc7239` alone a trusted peer's `X-Forwarded-*` pass as
            // they are, and with `x_forwarded` alone its `Forwarded`.
            Known::XForwardedFor | Known::XForwardedProto | Known::XForwardedHost => x_forwarded || !hop.trusted_peer,
            Known::Forwarded => rfc7239,
            known => known.is_hop_by_hop(),
        } || (!connection.is_empty() && named_by(name, &connection))
            || (rewrites && replaced(name))
            || (name.contains(&b'_') && underscored_dropped(name, hop));
        if !dropped {
            emit(name, value);
        }
    });
    let mut made = Vec::new();
    for (name, value) in rewrite.set_request_headers.iter().filter(|(n, _)| *n != header::HOST) {
        emit(name.as_str().as_bytes(), value.value(&hop.vars, &mut made));
    }
    if let (Some(annotation), Some(named)) = (hop.annotation, hop.annotating) {
        let [exceeded, ratelimit] = annotation_fields(named);
        emit(exceeded, annotation.exceeded);
        emit(ratelimit, annotation.ratelimit);
    }
    if trailers {
        emit(b"te", b"trailers");
    }
    if let Some(protocol) = hop.upgrade {
        emit(b"connection", b"upgrade");
        emit(b"upgrade", protocol);
    }
    // The request's `Host` as the client sent it (or as the route set it).
    let client_host = rewrite
        .set_request_headers
        .iter()
        .find(|(n, _)| *n == header::HOST)
        .map(|(_, v)| v.value(&hop.vars, &mut made))
        .or_else(|| fields.first_of(Known::Host))
        .or(hop.authority);
    if rfc7239 {
        let element = forwarded::element(hop.peer, hop.tls, client_host);
        let earlier: SmallVec<[&[u8]; 2]> = fields.all_of(Known::Forwarded).collect();
        if hop.trusted_peer && !earlier.is_empty() {
            let mut chain = earlier.join(&b", "[..]);
            chain.extend_from_slice(b", ");
            chain.extend_from_slice(element.as_bytes());
            emit(b"forwarded", &chain);
        } else {
            emit(b"forwarded", element.as_bytes());
        }
    }
    if !x_forwarded {
        return;
    }
    let mut peer = [0u8; 45];
    let peer = ip_text(hop.peer.to_canonical(), &mut peer);
    let earlier: SmallVec<[&[u8]; 2]> =
        if hop.trusted_peer { fields.all_of(Known::XForwardedFor).collect() } else { SmallVec::new() };
    if earlier.is_empty() {
        emit(b"x-forwarded-for", peer);
    } else {
        let mut chain = earlier.join(&b", "[..]);
        chain.extend_from_slice(b", ");
        chain.extend_from_slice(peer);
        emit(b"x-forwarded-for", &chain);
    }
    let proto = if hop.trusted_peer { fields.first_of(Known::XForwardedProto) } else { None };
    match proto {
        Some(_) => fields.all_of(Known::XForwardedProto).for_each(|v| emit(b"x-forwarded-proto", v)),
        None => emit(b"x-forwarded-proto", if hop.tls { b"https" } else { b"http" }),
    }
    let forwarded_host = if hop.trusted_peer { fields.first_of(Known::XForwardedHost) } else { None };
    match (forwarded_host, client_host) {
        (Some(_), _) => fields.all_of(Known::XForwardedHost).for_each(|v| emit(b"x-forwarded-host", v)),
        (None, Some(host)) => emit(b"x-forwarded-host", host),
        (None, None) => {}
    }
}

/// An address as `Display` writes it, into `out`. IPv4, what nearly every request
/// carries, is written digit by digit: `Ipv4Addr`'s `Display` goes through the formatting
/// machinery and cost more instructions than all other header work here.
fn ip_text(ip: IpAddr, out: &mut [u8; 45]) -> &[u8] {
    let IpAddr::V4(v4) = ip else {
        use std::io::Write as _;
        let mut cursor = std::io::Cursor::new(&mut out[..]);
        // An IPv6 address is at most 45 characters.
        let _ = write!(cursor, "{ip}");
        let len = cursor.position() as usize;
        return &out[..len];
    };
    let mut len = 0;
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            out[len] = b'.';
            len += 1;
        }
        if octet >= 100 {
            out[len] = b'0' + octet / 100;
            len += 1;
        }
        if octet >= 10 {
            out[len] = b'0' + octet / 10 % 10;
            len += 1;
        }
        out[len] = b'0' + octet % 10;
        len += 1;
    }
    &out[..len]
}

#[cfg(test)]
mod tests {
    use http::HeaderMap;

    use super::*;

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        let text = |ip: IpAddr| String::from_utf8(ip_text(ip, &mut [0; 45]).to_vec()).unwrap();
        for written in ["0.0.0.0", "1.2.3.4", "10.0.99.100", "127.0.0.1", "255.255.255.255", "2001:db8::1", "::1"] {
            let ip: IpAddr = written.parse().unwrap();
            assert_eq!(text(ip), ip.to_string());
        }
        let longest: IpAddr = "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255".parse().unwrap();
        assert_eq!(text(longest), longest.to_string());
        for n in [0u32, 9, 10, 99, 100, 199, 200, 255, 0x0a0b_0c0d, u32::MAX] {
            let ip = IpAddr::V4(n.into());
            assert_eq!(text(ip), ip.to_string());
        }
    }

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    fn xff(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(Known::XForwardedFor.header_name(), v.parse().unwrap());
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
        h.append(Known::XForwardedFor.header_name(), "3.3.3.3".parse().unwrap());
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

    /// The fields `headers` carry to the next hop from `peer`.
    fn forward(headers: &HeaderMap, peer: &str, trusted_peer: bool, mode: ForwardedMode) -> Vec<(String, String)> {
        let rewrite = Rewrite::default();
        let upgrade = upgrade_protocol(http::Version::HTTP_11, Fields::from(headers));
        let peer = peer.parse().unwrap();
        let vars = Request { client_ip: peer, host: None, target: b"/", tls: false };
        let hop = Hop {
            peer,
            trusted_peer,
            tls: false,
            forwarded: mode,
            upgrade,
            rewrite: &rewrite,
            authority: None,
            underscores: false,
            vars,
            annotating: None,
            annotation: None,
        };
        let mut out = Vec::new();
        let host = headers.get(header::HOST).map(|h| h.as_bytes());
        request_fields(Fields::from(headers), &hop, host, &mut |n, v| {
            out.push((String::from_utf8_lossy(n).into_owned(), String::from_utf8_lossy(v).into_owned()))
        });
        out
    }

    fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
        fields.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    #[test]
    fn hop_by_hop_and_connection_named_fields_stop_here() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, "keep-alive, x-secret".parse().unwrap());
        h.insert("x-secret", "1".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("te", "trailers".parse().unwrap());
        h.insert("x-kept", "1".parse().unwrap());
        let out = forward(&h, "9.9.9.9", false, ForwardedMode::XForwarded);
        let names: Vec<&str> = out.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["x-kept", "te", "x-forwarded-for", "x-forwarded-proto"]);
        assert_eq!(field(&out, "te"), Some("trailers"));
    }

    #[test]
    fn of_te_only_trailers_goes_on() {
        for (sent, kept) in [("gzip, trailers;q=0.5", true), ("Trailers", true), ("gzip", false), ("trailersx", false)]
        {
            let mut h = HeaderMap::new();
            h.insert("te", sent.parse().unwrap());
            let out = forward(&h, "9.9.9.9", false, ForwardedMode::XForwarded);
            assert_eq!(field(&out, "te"), kept.then_some("trailers"), "{sent}");
        }
    }

    #[test]
    fn fields_named_with_underscores_are_dropped_and_kept_never_stand_for_ours() {
        let mut h = HeaderMap::new();
        for (name, value) in [
            ("x_forwarded_for", "6.6.6.6"),
            ("content_length", "5"),
            ("transfer_encoding", "chunked"),
            ("x_api_key", "k"),
            ("x_user", "u"),
            ("x-kept", "1"),
        ] {
            h.insert(http::HeaderName::from_static(name), value.parse().unwrap());
        }
        let out = forward(&h, "9.9.9.9", false, ForwardedMode::XForwarded);
        let names: Vec<&str> = out.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["x-kept", "x-forwarded-for", "x-forwarded-proto"], "dropped by default");
        let mut rewrite = Rewrite::default();
        let set = crate::variables::Template::parse("set").unwrap();
        rewrite.set_request_headers.push((http::HeaderName::from_static("x-user"), set));
        let hop = keeping_underscores(&rewrite);
        let mut kept = Vec::new();
        request_fields(Fields::from(&h), &hop, None, &mut |n, _| kept.push(String::from_utf8_lossy(n).into_owned()));
        assert_eq!(kept, ["x_api_key", "x-kept", "x-user", "x-forwarded-for", "x-forwarded-proto"], "kept");
    }

    /// A hop from 9.9.9.9 (not trusted) with `rewrite`, keeping fields named with `_`.
    fn keeping_underscores(rewrite: &Rewrite) -> Hop<'_> {
        let peer = "9.9.9.9".parse().unwrap();
        Hop {
            peer,
            trusted_peer: false,
            tls: false,
            forwarded: ForwardedMode::XForwarded,
            upgrade: None,
            rewrite,
            underscores: true,
            vars: Request { client_ip: peer, host: None, target: b"/", tls: false },
            authority: None,
            annotating: None,
            annotation: None,
        }
    }

    /// Where limits annotate, the client's own `RateLimit-Exceeded` and `RateLimit` (in
    /// any case, and with `_` where such names are kept) never reach the upstream: it can
    /// neither forge an annotation nor hide one; the soft limits' own take their place.
    /// Without an annotating limit they are the client's business, and pass.
    #[test]
    fn a_clients_annotation_fields_are_dropped_where_limits_annotate() {
        let mut h = HeaderMap::new();
        for (name, value) in [
            ("ratelimit-exceeded", "nothing"),
            ("RateLimit", "\"x\";r=9;t=0"),
            ("ratelimit_exceeded", "other"),
            ("x-kept", "1"),
        ] {
            h.append(http::HeaderName::from_bytes(name.as_bytes()).unwrap(), value.parse().unwrap());
        }
        let rewrite = Rewrite::default();
        let fields = |annotating: bool, annotation| {
            let annotating = annotating.then_some(&b"ratelimit-exceeded"[..]);
            let hop = Hop { annotating, annotation, ..keeping_underscores(&rewrite) };
            let mut out = Vec::new();
            request_fields(Fields::from(&h), &hop, None, &mut |n, v| {
                out.push(format!("{}: {}", String::from_utf8_lossy(n), String::from_utf8_lossy(v)))
            });
            out.retain(|f| !f.starts_with("x-forwarded"));
            out
        };
        let soft = Annotation { exceeded: b"per_key", ratelimit: b"\"per_key\";r=0;t=30" };
        assert_eq!(
            fields(true, Some(soft)),
            ["x-kept: 1", "ratelimit-exceeded: per_key", "ratelimit: \"per_key\";r=0;t=30"]
        );
        assert_eq!(fields(true, None), ["x-kept: 1"], "not annotated: none at all");
        assert_eq!(
            fields(false, None),
            ["ratelimit-exceeded: nothing", "ratelimit: \"x\";r=9;t=0", "ratelimit_exceeded: other", "x-kept: 1"]
        );
    }

    #[test]
    fn only_a_connection_upgrade_on_http11_is_an_upgrade() {
        let mut h = HeaderMap::new();
        h.insert(header::UPGRADE, "websocket".parse().unwrap());
        assert_eq!(upgrade_protocol(http::Version::HTTP_11, Fields::from(&h)), None);
        h.insert(header::CONNECTION, "keep-alive, Upgrade".parse().unwrap());
        assert_eq!(upgrade_protocol(http::Version::HTTP_11, Fields::from(&h)).unwrap(), b"websocket");
        assert_eq!(upgrade_protocol(http::Version::HTTP_2, Fields::from(&h)), None);
        assert_eq!(upgrade_protocol(http::Version::HTTP_10, Fields::from(&h)), None);
        let out = forward(&h, "9.9.9.9", false, ForwardedMode::XForwarded);
        assert_eq!((field(&out, "connection"), field(&out, "upgrade")), (Some("upgrade"), Some("websocket")));
    }

    #[test]
    fn forwarded_chain_is_extended_only_for_trusted_peers() {
        let h = xff(&["1.1.1.1"]);
        let out = forward(&h, "10.0.0.1", true, ForwardedMode::XForwarded);
        assert_eq!(field(&out, "x-forwarded-for"), Some("1.1.1.1, 10.0.0.1"));
        let mut h = xff(&["1.1.1.1"]);
        h.insert(Known::XForwardedHost.header_name(), "evil".parse().unwrap());
        h.insert(header::HOST, "example.com".parse().unwrap());
        let out = forward(&h, "9.9.9.9", false, ForwardedMode::XForwarded);
        assert_eq!(field(&out, "x-forwarded-for"), Some("9.9.9.9"));
        assert_eq!(field(&out, "x-forwarded-host"), Some("example.com"));
        assert_eq!(field(&out, "x-forwarded-proto"), Some("http"));
        assert_eq!(out.iter().filter(|(n, _)| n == "x-forwarded-host").count(), 1, "the client's claim is gone");
    }

    #[test]
    fn rfc7239_alone_drops_an_untrusted_peers_x_forwarded_fields_and_keeps_a_trusted_ones() {
        let mut h = xff(&["1.1.1.1"]);
        h.insert(header::HOST, "example.com".parse().unwrap());
        let out = forward(&h, "9.9.9.9", false, ForwardedMode::Rfc7239);
        assert_eq!(field(&out, "x-forwarded-for"), None);
        assert_eq!(field(&out, "forwarded"), Some("for=9.9.9.9;proto=http;host=example.com"));
        let out = forward(&h, "10.0.0.1", true, ForwardedMode::Rfc7239);
        assert_eq!(field(&out, "x-forwarded-for"), Some("1.1.1.1"));
    }
}
