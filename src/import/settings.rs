//! nginx's connection and request settings -> sluicegate's `server:` section, and
//! `set_real_ip_from` / `real_ip_header` -> `trusted_proxies`. nginx lets each server
//! (some each location) set its own; sluicegate has one value for every listener, so
//! where servers differ the catch-all server's value is kept and the others noted.

use std::time::Duration;

use super::http::Server;
use super::notes::Notes;
use super::scope::Scope;
use super::syntax::Directive;
use super::values;
use super::yaml::{Item, MapBuilder};

/// nginx directive, sluicegate field, nginx's default.
const TIMEOUTS: &[(&str, &str, u64)] = &[
    ("client_header_timeout", "header_read_timeout", 60),
    ("keepalive_timeout", "idle_timeout", 75),
    ("send_timeout", "send_timeout", 60),
    ("client_body_timeout", "body_read_timeout", 60),
];

/// nginx's `client_max_body_size` when not set.
pub const NGINX_MAX_BODY: u64 = 1 << 20;

/// sluicegate's bounds of `max_header_bytes` and `max_uri_bytes`.
const HEAD_BYTES: std::ops::RangeInclusive<u64> = 1024..=1 << 20;

/// The `server:` section, from the settings in force at each server; `chosen` is the
/// server whose values win where servers differ. Also returns the body size every
/// route has unless its location says otherwise (`None`: unlimited).
pub fn section(main: &[Directive], servers: &[Server<'_>], chosen: usize, notes: &mut Notes) -> (Item, Option<u64>) {
    let mut m = MapBuilder::default();
    for &(nginx, field, default) in TIMEOUTS {
        let Some(d) = agreed(servers, chosen, nginx, notes) else {
            m.set(
                field,
                Item::text(values::duration_text(Duration::from_secs(default)))
                    .commented([format!("nginx's default {nginx}")]),
            );
            continue;
        };
        let comment = format!("{}: {}", d.at, d.text());
        match d.args.first().map(|t| values::time(t)) {
            Some(Ok(t)) if !t.is_zero() => {
                m.set(field, Item::text(values::duration_text(t)).commented([comment]));
            }
            Some(Ok(_)) => {
                notes.left_out(d, "0 (no keep-alive, no timeout) is not supported");
            }
            Some(Err(why)) => {
                notes.left_out(d, why);
            }
            None => {}
        }
    }
    if let Some(d) = agreed(servers, chosen, "large_client_header_buffers", notes) {
        match (d.args.first().and_then(|n| n.parse::<u64>().ok()), d.args.get(1).map(|s| values::size(s))) {
            (Some(n), Some(Ok(size))) => {
                let comment = format!("{}: {}", d.at, d.text());
                for (field, bytes) in [("max_uri_bytes", size), ("max_header_bytes", n.saturating_mul(size))] {
                    let kept = bytes.clamp(*HEAD_BYTES.start(), *HEAD_BYTES.end());
                    if kept != bytes {
                        notes.left_out(
                            d,
                            format!("{field} {bytes} is outside sluicegate's 1024 to 1048576: {kept} kept"),
                        );
                    }
                    m.set(field, Item::int(kept).commented([comment.clone()]));
                }
            }
            _ => {
                notes.left_out(d, "expected `large_client_header_buffers NUMBER SIZE`");
            }
        }
    }
    // `off`, nginx's default, is sluicegate's: such fields are dropped.
    if let Some(d) = agreed(servers, chosen, "underscores_in_headers", notes).filter(|d| d.args == ["on"]) {
        m.set("underscores_in_headers", Item::bool(true).commented([format!("{}: {}", d.at, d.text())]));
    }
    let body = servers.get(chosen).map_or(Ok(NGINX_MAX_BODY), |s| max_body(&s.scope));
    let max_body = match body {
        Ok(0) => None,
        Ok(bytes) => {
            let comment = match servers.get(chosen).and_then(|s| s.scope.one("client_max_body_size")) {
                Some(d) => format!("{}: {}", d.at, d.text()),
                None => "nginx's default client_max_body_size".into(),
            };
            m.set("max_body_bytes", Item::text(values::size_text(bytes)).commented([comment]));
            Some(bytes)
        }
        Err(why) => {
            if let Some(d) = servers.get(chosen).and_then(|s| s.scope.one("client_max_body_size")) {
                notes.left_out(d, why);
            }
            None
        }
    };
    // `auto` is one per core, sluicegate's default.
    if let Some(d) = main.iter().find(|d| d.name == "worker_processes")
        && let Some(Ok(n)) = d.args.first().map(|a| a.parse::<u64>())
    {
        m.set("workers", Item::int(n).commented([format!("{}: {}", d.at, d.text())]));
    }
    (m.build(), max_body)
}

/// `client_max_body_size` in force (0: unlimited).
pub fn max_body(scope: &Scope<'_>) -> Result<u64, String> {
    scope.value("client_max_body_size").map_or(Ok(NGINX_MAX_BODY), values::size)
}

/// `limit_rate` and `limit_rate_after` in force, as a route's `response_body_rate`
/// (`None`: no pace, nginx's `limit_rate 0` included); an error names the directive.
pub fn body_rate<'a>(scope: &Scope<'a>) -> Result<Option<Item>, (&'a Directive, String)> {
    let Some(rate) = scope.one("limit_rate") else { return Ok(None) };
    let size = |d: &'a Directive| {
        let text = d.args.first().map_or("", String::as_str);
        let why = |e: String| match text.contains('$') {
            true => (d, "a rate set by a variable is not converted".to_owned()),
            false => (d, e),
        };
        values::size(text).map_err(why)
    };
    let per_second = size(rate)?;
    if per_second == 0 {
        return Ok(None);
    }
    let mut map = MapBuilder::default();
    map.set("bytes_per_second", Item::text(values::size_text(per_second)));
    if let Some(after) = scope.one("limit_rate_after") {
        match size(after)? {
            0 => {}
            bytes => _ = map.set("after", Item::text(values::size_text(bytes))),
        }
    }
    Ok(Some(map.build()))
}

/// `expires` in force, as the route's `expires`: a time, `epoch` or `max` (`off`: none).
pub fn expires<'a>(scope: &Scope<'a>) -> Result<Option<Item>, (&'a Directive, String)> {
    let Some(d) = scope.one("expires") else { return Ok(None) };
    match &d.args[..] {
        [off] if off == "off" => Ok(None),
        [word] if word == "epoch" || word == "max" => Ok(Some(Item::text(word))),
        [time] if !time.starts_with(['-', '@']) => {
            values::time(time).map(|t| Some(Item::text(values::duration_text(t)))).map_err(|why| (d, why))
        }
        _ => Err((
            d,
            "only `expires TIME`, `epoch`, `max` and `off` are converted (not negative times, `@`, `modified`)".into(),
        )),
    }
}

/// The line setting `name` at the chosen server; notes servers whose value differs.
fn agreed<'a>(servers: &[Server<'a>], chosen: usize, name: &str, notes: &mut Notes) -> Option<&'a Directive> {
    let kept = servers.get(chosen).and_then(|s| s.scope.one(name));
    let text = |d: Option<&Directive>| d.map(|d| d.args.clone());
    for server in servers {
        let theirs = server.scope.one(name);
        if text(theirs) != text(kept) {
            let at = theirs.map_or(&server.at, |d| &d.at);
            notes.left_out_at(
                at,
                name,
                format!(
                    "sluicegate has one value for all servers: {} kept",
                    kept.map_or("nginx's default".into(), |d| d.args.join(" "))
                ),
            );
        }
    }
    kept
}

/// Notes the per-location values of server-wide settings.
pub fn note_location_settings(location: &Scope<'_>, server: &Scope<'_>, notes: &mut Notes) -> Vec<String> {
    let mut lines = Vec::new();
    for &(nginx, _, _) in TIMEOUTS.iter().chain(&[("large_client_header_buffers", "", 0)]) {
        if let Some(d) = location.one(nginx).filter(|d| server.one(nginx).is_none_or(|s| s.at != d.at)) {
            lines.push(notes.left_out(d, "sluicegate has one value for all servers and locations"));
        }
    }
    lines
}

/// `trusted_proxies` from the real IP settings of http (and every server: they must
/// agree), with comments; `None` without `set_real_ip_from`.
pub fn trusted_proxies(http: &Scope<'_>, servers: &[Server<'_>], notes: &mut Notes) -> Option<Item> {
    let from = http.all("set_real_ip_from");
    for server in servers {
        let theirs = server.scope.all("set_real_ip_from");
        if theirs.iter().map(|d| &d.at).ne(from.iter().map(|d| &d.at)) {
            let at = theirs.first().map_or(&server.at, |d| &d.at);
            notes.left_out_at(
                at,
                "set_real_ip_from",
                "sluicegate trusts one list of proxies for all servers: http's is kept",
            );
        }
    }
    if from.is_empty() {
        return None;
    }
    let mut comments: Vec<String> = from.iter().map(|d| format!("{}: {}", d.at, d.text())).collect();
    let mut nets = Vec::new();
    for d in from {
        match d.args.first() {
            Some(net) if net != "unix:" => nets.push(net.clone()),
            _ => {
                notes.left_out(d, "unix: peers are not converted");
            }
        }
    }
    match http.one("real_ip_header") {
        Some(d) if d.args.first().is_some_and(|h| h.eq_ignore_ascii_case("x-forwarded-for")) => {
            comments.push(format!("{}: {}", d.at, d.text()));
        }
        Some(d) => {
            notes.left_out(d, "sluicegate reads the client address from X-Forwarded-For (or Forwarded) only");
        }
        None => {
            notes.left_out_at(
                &from[0].at,
                "real_ip_header",
                "nginx reads X-Real-IP when real_ip_header is not set; sluicegate reads X-Forwarded-For",
            );
        }
    }
    if http.value("real_ip_recursive") != Some("on") {
        comments.push("nginx (real_ip_recursive off) took the last X-Forwarded-For address even when trusted; sluicegate skips trusted ones, as real_ip_recursive on".into());
    }
    Some(Item::texts(nets).commented(comments))
}
