//! One route of the file -> `Route`: its match, what it does (forward or respond), its
//! limits and what a request weighs in them, and what it rewrites, every error positioned.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::str::FromStr;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::{HeaderMap, Method};

use super::checks::{Errors, allow, body_size, header, size, status_in, unknown_name};
use super::raw::{RawConfig, RawMatch, RawRespond, RawRoute};
use super::{
    Action, BodyRate, Cost, Limit, PathMatch, PathRewrite, Rewrite, Route, RouteMatch, StaticResponse, UpstreamHost,
};

/// Route `i`; `compiled` are the configuration's limits, indexed as `config.limits`.
pub(super) fn route(
    e: &mut Errors<'_>,
    i: usize,
    raw: &RawRoute,
    config: &RawConfig,
    compiled: &[Limit],
    max_body_bytes: Option<u64>,
) -> Route {
    let at = format!("routes[{i}]");
    let matcher = route_match(e, &format!("{at}.match"), &raw.matcher);
    let action = match (&raw.upstream, &raw.respond) {
        (Some(name), None) => match config.upstreams.keys().position(|n| n == name) {
            Some(index) => Action::Forward(index),
            None => {
                e.add(format!("{at}.upstream"), unknown_name("upstream", name, &config.upstreams, "upstreams"));
                Action::Forward(0)
            }
        },
        (None, Some(respond)) => Action::Respond(static_response(e, &format!("{at}.respond"), respond)),
        (Some(_), Some(_)) => {
            e.add(format!("{at}.respond"), "a route has either `upstream` or `respond`, not both");
            Action::Forward(0)
        }
        (None, None) => {
            e.add(at.clone(), "needs `upstream: NAME` or `respond: {status, body}`");
            Action::Forward(0)
        }
    };
    let mut limits = Vec::new();
    let mut seen = HashSet::new();
    for (j, name) in raw.limits.iter().enumerate() {
        match config.limits.keys().position(|n| n == name) {
            Some(_) if !seen.insert(name) => {
                e.add(format!("{at}.limits[{j}]"), format!("limit {name:?} is listed twice"))
            }
            Some(index) => limits.push(index),
            None => e.add(format!("{at}.limits[{j}]"), unknown_name("limit", name, &config.limits, "limits")),
        }
    }
    limits.sort_unstable();
    let allow = allow(e, &format!("{at}.allow"), raw.allow.as_ref());
    let cost = match (raw.cost, &raw.cost_header) {
        (Some(_), Some(_)) => {
            e.add(format!("{at}.cost_header"), "give either `cost` or `cost_header`, not both");
            Cost::Fixed(1)
        }
        (_, Some(name)) => match HeaderName::from_str(name) {
            Ok(name) => Cost::Header(name),
            Err(_) => {
                e.add(format!("{at}.cost_header"), format!("invalid header name {name:?}"));
                Cost::Fixed(1)
            }
        },
        (Some(0), None) => {
            e.add(format!("{at}.cost"), "must be a positive integer");
            Cost::Fixed(1)
        }
        (cost, None) => Cost::Fixed(cost.unwrap_or(1)),
    };
    let candidates = candidates(&limits, compiled);
    let capacity = candidates.iter().filter_map(|&l| Some((compiled.get(l)?.capacity()?, l))).min();
    if let (Cost::Fixed(cost), Some((capacity, limit))) = (&cost, capacity)
        && *cost > capacity
    {
        // A fixed cost above what a limit admits at once would reject every request.
        let name = &compiled[limit].name;
        let whose = match raw.limits.iter().position(|n| n == name) {
            Some(j) => format!("routes[{i}].limits[{j}]"),
            None => "named by an override of the route's limits".to_owned(),
        };
        e.add(
            format!("{at}.cost"),
            format!("{cost} can never fit limit {name:?} ({whose}), which admits at most {capacity} at once"),
        );
    }
    let rewrite = rewrite(e, &at, raw, &matcher);
    let rewrites = raw.strip_prefix.is_some()
        || raw.rewrite.is_some()
        || !raw.set_request_headers.is_empty()
        || !raw.remove_request_headers.is_empty()
        || !raw.set_response_headers.is_empty()
        || raw.upstream_host.is_some();
    if rewrites && raw.respond.is_some() {
        e.add(
            format!("{at}.respond"),
            "a `respond` route forwards nothing: rewriting fields apply only with `upstream`",
        );
    }
    let max_body_bytes = body_size(e, &format!("{at}.max_body_bytes"), raw.max_body_bytes.as_ref()).or(max_body_bytes);
    let body_rate = raw.response_body_rate.as_ref().and_then(|r| {
        let per_second = body_size(e, &format!("{at}.response_body_rate.bytes_per_second"), Some(&r.bytes_per_second));
        let after = r.after.as_ref().map_or(Some(0), |after| size(e, &format!("{at}.response_body_rate.after"), after));
        Some(BodyRate { per_second: per_second?, after: after? })
    });
    Route {
        name: raw.name.clone().unwrap_or(at),
        matcher,
        action,
        limits,
        candidates,
        capacity,
        allow,
        cost,
        rewrite,
        max_body_bytes,
        body_rate,
    }
}

/// The route's `limits` and the limits their overrides name: every limit that may decide
/// one of its requests, ascending.
fn candidates(limits: &[usize], compiled: &[Limit]) -> Box<[usize]> {
    let overridden = limits.iter().filter_map(|&l| compiled.get(l)).flat_map(|l| l.overrides.iter().map(|o| o.1));
    let mut all: Vec<usize> = limits.iter().copied().chain(overridden).collect();
    all.sort_unstable();
    all.dedup();
    all.into()
}

/// `strip_prefix`, `rewrite`, the header fields and `upstream_host` of a route.
fn rewrite(e: &mut Errors<'_>, at: &str, raw: &RawRoute, matcher: &RouteMatch) -> Rewrite {
    let path = match (raw.strip_prefix.unwrap_or(false), &raw.rewrite) {
        (true, Some(_)) => {
            e.add(format!("{at}.rewrite"), "give either `strip_prefix` or `rewrite`, not both");
            None
        }
        (true, None) => match &matcher.path {
            PathMatch::Prefix(prefix) => Some(PathRewrite::Strip(prefix.clone())),
            _ => {
                e.add(format!("{at}.strip_prefix"), "needs `match.path_prefix`: the prefix to strip");
                None
            }
        },
        (false, Some(r)) => {
            for (field, value) in [("prefix", &r.prefix), ("to", &r.to)] {
                if !value.starts_with('/') {
                    e.add(format!("{at}.rewrite.{field}"), format!("must start with '/', not {value:?}"));
                }
            }
            Some(PathRewrite::Replace { prefix: r.prefix.clone(), to: r.to.clone() })
        }
        (false, None) => None,
    };
    let mut headers = |field: &str, map: &BTreeMap<String, String>| -> Vec<(HeaderName, HeaderValue)> {
        map.iter().filter_map(|(name, value)| e.check(|| format!("{at}.{field}.{name}"), header(name, value))).collect()
    };
    let set_request_headers = headers("set_request_headers", &raw.set_request_headers);
    let set_response_headers = headers("set_response_headers", &raw.set_response_headers);
    let remove_request_headers = raw
        .remove_request_headers
        .iter()
        .enumerate()
        .filter_map(|(i, name)| {
            let parsed = HeaderName::from_str(name).map_err(|_| format!("invalid header name {name:?}"));
            e.check(|| format!("{at}.remove_request_headers[{i}]"), parsed)
        })
        .collect();
    let upstream_host = match raw.upstream_host.as_deref() {
        None | Some("keep") => UpstreamHost::Keep,
        Some("server") => UpstreamHost::Server,
        Some(name) => {
            let valid = http::uri::Authority::from_str(name).ok().filter(|_| !name.contains('@'));
            let value = valid.and_then(|a| HeaderValue::from_str(a.as_str()).ok());
            e.check(
                || format!("{at}.upstream_host"),
                value.ok_or_else(|| format!("write keep, server, or a host name such as api.internal, not {name:?}")),
            )
            .map_or(UpstreamHost::Keep, UpstreamHost::Name)
        }
    };
    Rewrite { path, set_request_headers, remove_request_headers, set_response_headers, upstream_host }
}

fn route_match(e: &mut Errors<'_>, at: &str, raw: &RawMatch) -> RouteMatch {
    let host = raw.host.as_ref().map(|h| h.trim_end_matches('.').to_ascii_lowercase());
    let mut path_of = |field: &str, value: &String| {
        if !value.starts_with('/') {
            e.add(format!("{at}.{field}"), format!("must start with '/', not {value:?}"));
        } else if !matches!(crate::path::normalize(value), Ok(Cow::Borrowed(_))) {
            // Requests are matched by their normalized path: this spelling never would.
            let normal = crate::path::normalize(value).map(|p| String::from_utf8_lossy(&p).into_owned());
            let hint = normal.map_or_else(|e| e.to_string(), |p| format!("write it as {p:?}"));
            e.add(format!("{at}.{field}"), format!("{value:?} is not a normalized path: {hint}"));
        }
        value.clone()
    };
    let path = match (&raw.path_prefix, &raw.path) {
        (Some(_), Some(_)) => {
            e.add(format!("{at}.path"), "give either `path` (exact) or `path_prefix`, not both");
            PathMatch::Any
        }
        (Some(prefix), None) => PathMatch::Prefix(path_of("path_prefix", prefix)),
        (None, Some(exact)) => PathMatch::Exact(path_of("path", exact)),
        (None, None) => PathMatch::Any,
    };
    let methods = raw
        .methods
        .iter()
        .flatten()
        .enumerate()
        .filter_map(|(i, m)| {
            let parsed = Method::from_bytes(m.as_bytes())
                .ok()
                .filter(|_| !m.bytes().any(|b| b.is_ascii_lowercase()))
                .ok_or_else(|| format!("invalid method {m:?}; methods are upper case, e.g. GET, POST"));
            e.check(|| format!("{at}.methods[{i}]"), parsed)
        })
        .collect();
    RouteMatch { host, path, methods }
}

fn static_response(e: &mut Errors<'_>, at: &str, raw: &RawRespond) -> StaticResponse {
    let status = status_in(e, || format!("{at}.status"), raw.status.unwrap_or(200), 100..=599);
    let mut headers = HeaderMap::new();
    for (name, value) in &raw.headers {
        if let Some((n, v)) = e.check(|| format!("{at}.headers.{name}"), header(name, value)) {
            headers.append(n, v);
        }
    }
    let body = Bytes::from(raw.body.clone().unwrap_or_default());
    if !body.is_empty() && !headers.contains_key(CONTENT_TYPE) {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    }
    StaticResponse { status, headers, body }
}
