//! Requests addressed to the admin listener, and only those, are answered. A web page the
//! operator visits can make its own name resolve to 127.0.0.1 after it has loaded (DNS
//! rebinding): the browser then sends that page's requests to the admin listener as
//! *same-origin* ones, which the cross-site rule (`cross_site`) cannot tell from the
//! dashboard's own. What such a request cannot change is the `Host` it carries: the
//! page's name. So the listener answers a `Host` that is an IP literal, `localhost`, or
//! a name `admin.hosts` lists, and 421 (RFC 9110 §15.5.20: not a request this server
//! answers for that authority) to any other. A request without `Host` (HTTP/1.0, which
//! no browser sends) names nothing a page could have chosen and is answered.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::wire::head::{Known, RequestHead, text};

/// Why `head` is not addressed to this listener, whose configured names are `hosts`, if
/// it is not.
pub fn refusal(head: &RequestHead<'_>, hosts: &[String]) -> Option<String> {
    let named = head.fields.all_of(Known::Host).chain(head.authority.map(str::as_bytes));
    for value in named {
        let Some(host) = text(value).and_then(name_of) else {
            return Some(format!("Host {:?} is no host", String::from_utf8_lossy(value)));
        };
        if !answered(host, hosts) {
            let listed = match hosts.is_empty() {
                true => "admin.hosts lists none".to_owned(),
                false => format!("admin.hosts lists {}", hosts.join(", ")),
            };
            return Some(format!(
                "Host {host:?} is not this admin listener's: it answers an IP address, localhost, or a name \
                 admin.hosts lists ({listed})"
            ));
        }
    }
    None
}

/// The host of an authority (`host[:port]`, `[v6][:port]`), without its port and a
/// trailing dot.
fn name_of(authority: &str) -> Option<&str> {
    let host = match authority.strip_prefix('[') {
        Some(rest) => {
            let (inside, after) = rest.split_once(']')?;
            if !(after.is_empty() || after.starts_with(':')) {
                return None;
            }
            return inside.parse::<Ipv6Addr>().is_ok().then_some(&authority[..inside.len() + 2]);
        }
        None => authority.rsplit_once(':').map_or(authority, |(host, _)| host),
    };
    Some(host.strip_suffix('.').unwrap_or(host))
}

fn answered(host: &str, hosts: &[String]) -> bool {
    host.starts_with('[')
        || host.parse::<Ipv4Addr>().is_ok()
        || host.eq_ignore_ascii_case("localhost")
        || hosts.iter().any(|name| host.eq_ignore_ascii_case(name.strip_suffix('.').unwrap_or(name)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::head::Fields;

    fn refused(host: Option<&str>, authority: Option<&str>, hosts: &[&str]) -> Option<String> {
        let mut request = http::Request::get("/config");
        if let Some(host) = host {
            request = request.header("host", host);
        }
        let request = request.body(()).unwrap();
        let head = RequestHead {
            method: request.method(),
            target: "/config",
            version: http::Version::HTTP_11,
            authority,
            fields: Fields::from(request.headers()),
        };
        let hosts: Vec<String> = hosts.iter().map(|h| (*h).to_owned()).collect();
        refusal(&head, &hosts)
    }

    #[test]
    fn an_ip_address_localhost_or_a_listed_name_is_answered() {
        for host in
            ["127.0.0.1:9901", "127.0.0.1", "10.1.2.3:80", "[::1]:9901", "[::1]", "localhost:9901", "LocalHost."]
        {
            assert_eq!(refused(Some(host), None, &[]), None, "{host}");
        }
        assert_eq!(refused(Some("admin.internal:9901"), None, &["admin.internal"]), None);
        assert_eq!(refused(Some("ADMIN.internal."), None, &["admin.internal."]), None);
        assert_eq!(refused(None, None, &[]), None, "HTTP/1.0 without Host: no page chose it");
        assert_eq!(refused(None, Some("127.0.0.1:9901"), &[]), None, "HTTP/2's :authority");
    }

    #[test]
    fn any_other_name_is_refused_saying_what_is_answered() {
        let why = refused(Some("rebind.evil.example:19603"), None, &[]).unwrap();
        assert_eq!(
            why,
            "Host \"rebind.evil.example\" is not this admin listener's: it answers an IP address, localhost, \
             or a name admin.hosts lists (admin.hosts lists none)"
        );
        for host in ["localhost.evil.example", "127.0.0.1.evil.example", "evil.localhost", "0x7f.1", "[::1]x"] {
            assert!(refused(Some(host), None, &["admin.internal"]).is_some(), "{host}");
        }
        assert!(refused(None, Some("rebind.evil.example"), &[]).is_some(), "HTTP/2's :authority");
        assert!(refused(Some("127.0.0.1"), Some("evil.example"), &[]).is_some(), "either names the request");
    }
}
