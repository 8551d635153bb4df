//! Raw file -> compiled `Config`: every check, every error collected with its position.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::{HeaderMap, Method, StatusCode};
use ipnet::IpNet;

use super::position::Positions;
use super::raw::{
    LogKeys, RawAdmin, RawAllow, RawConfig, RawListen, RawListener, RawMatch, RawRespond, RawRoute, RawSize,
};
use super::units::{parse_duration, parse_size};
use super::{
    AccessLogConfig, Action, Admin, Config, ConfigError, Cost, PathMatch, PathRewrite, Rewrite, Route, RouteMatch,
    StaticResponse, UpstreamHost,
};
use super::{Listener, limits, shadow, store, tls, upstreams};
use crate::policy::allow::Allow;

const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(60);
/// nginx's `client_body_timeout`.
const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest connection timeout accepted: past a day a timeout protects nothing.
const MAX_CONNECTION_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// More connections than any one process can hold open.
pub const MAX_CONNECTIONS: u64 = 10_000_000;
/// More threads than this serve no machine better than one per core would.
const MAX_WORKERS: u64 = 1024;
/// nginx's `large_client_header_buffers 4 8k` holds a 32 KiB head; one buffer, 8 KiB,
/// holds the request line.
const DEFAULT_MAX_HEADER_BYTES: u64 = 32 * 1024;
const DEFAULT_MAX_URI_BYTES: u64 = 8 * 1024;
/// Bounds of both head limits: below 1 KiB common requests fail (a browser's cookies
/// alone), above 1 MiB a limit no longer bounds the memory a client can hold.
const HEAD_LIMIT_BYTES: std::ops::RangeInclusive<u64> = 1024..=1024 * 1024;

pub(super) struct Errors<'a> {
    file: &'a str,
    positions: &'a Positions,
    list: Vec<ConfigError>,
    /// Problems that do not stop the configuration from loading.
    warnings: Vec<ConfigError>,
}

impl Errors<'_> {
    /// Records a warning at `path`: reported by `check` and logged, the load goes on.
    pub(super) fn warn(&mut self, path: String, message: impl Into<String>) {
        let (line, column) = self.positions.of(&path);
        self.warnings.push(ConfigError { file: self.file.to_owned(), line, column, path, message: message.into() });
    }

    pub(super) fn add(&mut self, path: String, message: impl Into<String>) {
        let (line, column) = self.positions.of(&path);
        self.list.push(ConfigError::new(self.file, (line, column), &path, &message.into()));
    }

    /// The line of the value at `path`.
    pub(super) fn line_of(&self, path: &str) -> usize {
        self.positions.of(path).0
    }

    /// The value of `result`, or None with its error recorded at `path`.
    pub(super) fn check<T>(&mut self, path: impl FnOnce() -> String, result: Result<T, String>) -> Option<T> {
        result.map_err(|message| self.add(path(), message)).ok()
    }

    pub(super) fn duration(&mut self, path: &str, text: Option<&String>, default: Duration) -> Duration {
        match text {
            None => default,
            Some(text) => self.check(|| path.to_owned(), parse_duration(text)).unwrap_or(default),
        }
    }
}

fn admin(e: &mut Errors<'_>, raw: &RawAdmin) -> Option<Admin> {
    let listen = e.check(
        || "admin.listen".into(),
        SocketAddr::from_str(&raw.listen)
            .map_err(|_| format!("invalid address {:?}; write IP:PORT, e.g. 127.0.0.1:9901", raw.listen)),
    );
    if raw.token.as_ref().is_some_and(|t| t.is_empty() || HeaderValue::from_str(&format!("Bearer {t}")).is_err()) {
        e.add("admin.token".into(), "must be a non-empty string of visible ASCII characters");
    }
    Some(Admin { listen: listen?, token: raw.token.clone() })
}

pub(super) fn names<T>(map: &BTreeMap<String, T>) -> String {
    if map.is_empty() { "none".to_owned() } else { map.keys().map(String::as_str).collect::<Vec<_>>().join(", ") }
}

pub fn compile(raw: RawConfig, positions: &Positions, file: &str) -> Result<Config, Vec<ConfigError>> {
    let mut e = Errors { file, positions, list: Vec::new(), warnings: Vec::new() };

    let listeners = listeners(&mut e, &raw.listen);
    let trusted_proxies = raw
        .trusted_proxies
        .iter()
        .enumerate()
        .filter_map(|(i, text)| e.check(|| format!("trusted_proxies[{i}]"), parse_cidr(text)))
        .collect();
    let header_read_timeout =
        e.duration("server.header_read_timeout", raw.server.header_read_timeout.as_ref(), DEFAULT_HEADER_READ_TIMEOUT);
    let shutdown_grace =
        e.duration("server.shutdown_grace", raw.server.shutdown_grace.as_ref(), DEFAULT_SHUTDOWN_GRACE);
    let idle_timeout =
        connection_timeout(&mut e, "server.idle_timeout", raw.server.idle_timeout.as_ref(), DEFAULT_IDLE_TIMEOUT);
    let send_timeout =
        connection_timeout(&mut e, "server.send_timeout", raw.server.send_timeout.as_ref(), DEFAULT_SEND_TIMEOUT);
    let body_read_timeout = connection_timeout(
        &mut e,
        "server.body_read_timeout",
        raw.server.body_read_timeout.as_ref(),
        DEFAULT_BODY_READ_TIMEOUT,
    );
    let max_body_bytes = body_size(&mut e, "server.max_body_bytes", raw.server.max_body_bytes.as_ref());
    let mut connections = |field: &str, given: Option<u64>| {
        given.and_then(|n| {
            e.check(
                || format!("server.{field}"),
                match n {
                    1..=MAX_CONNECTIONS => Ok(n as usize),
                    _ => Err(format!("must be from 1 to {MAX_CONNECTIONS}, not {n}")),
                },
            )
        })
    };
    let max_connections = connections("max_connections", raw.server.max_connections);
    let max_connections_per_ip = connections("max_connections_per_ip", raw.server.max_connections_per_ip);
    let workers = raw.server.workers.and_then(|n| {
        e.check(
            || "server.workers".to_owned(),
            match n {
                1..=MAX_WORKERS => Ok(n as usize),
                _ => Err(format!("must be from 1 to {MAX_WORKERS}, not {n}")),
            },
        )
    });
    let max_header_bytes =
        head_limit(&mut e, "server.max_header_bytes", raw.server.max_header_bytes, DEFAULT_MAX_HEADER_BYTES);
    let max_uri_bytes = head_limit(&mut e, "server.max_uri_bytes", raw.server.max_uri_bytes, DEFAULT_MAX_URI_BYTES);
    let log_keys = match (raw.log_keys, raw.redact_keys) {
        (Some(mode), false) => mode,
        (None, false) => LogKeys::default(),
        (None, true) => LogKeys::Hashed,
        (Some(_), true) => {
            e.add("redact_keys".into(), "give either `log_keys` or `redact_keys: true` (its older spelling), not both");
            LogKeys::Hashed
        }
    };

    let admin = raw.admin.as_ref().and_then(|a| admin(&mut e, a));
    let upstreams = raw.upstreams.iter().map(|(name, u)| upstreams::upstream(&mut e, name, u)).collect();
    let redis = raw.redis.as_ref().map(|r| store::redis(&mut e, r));
    let limits: Vec<_> = raw.limits.iter().map(|(name, l)| limits::limit(&mut e, name, l, &raw.limits)).collect();
    if redis.is_none() {
        store::require_redis(&mut e, &limits);
    }
    let routes: Vec<_> =
        raw.routes.iter().enumerate().map(|(i, r)| route(&mut e, i, r, &raw, max_body_bytes)).collect();
    shadow::check(&mut e, &routes);
    if routes.is_empty() {
        e.warn("routes".into(), "no routes: every request is answered 404");
    }

    match listeners {
        Some(listeners) if e.list.is_empty() => Ok(Config {
            listeners,
            trusted_proxies,
            header_read_timeout,
            idle_timeout,
            send_timeout,
            max_connections,
            max_connections_per_ip,
            max_header_bytes,
            max_uri_bytes,
            shutdown_grace,
            workers,
            body_read_timeout,
            admin,
            access_log: raw
                .access_log
                .as_ref()
                .map(|a| AccessLogConfig { format: a.format, path: a.path.clone().filter(|p| p != "stderr") }),
            ratelimit_headers: raw.ratelimit_headers,
            ratelimit_header_style: raw.ratelimit_header_style,
            rejection_body: raw.rejection_body,
            log_keys,
            forwarded: raw.forwarded,
            warnings: e.warnings,
            upstreams,
            redis,
            limits,
            routes,
        }),
        _ => {
            e.list.sort_by_key(|err| (err.line, err.column));
            Err(e.list)
        }
    }
}

/// `server.max_header_bytes` or `server.max_uri_bytes`: a size in bytes within
/// `HEAD_LIMIT_BYTES`.
fn head_limit(e: &mut Errors<'_>, path: &str, value: Option<u64>, default: u64) -> usize {
    let n = value.unwrap_or(default);
    let (lo, hi) = (HEAD_LIMIT_BYTES.start(), HEAD_LIMIT_BYTES.end());
    let checked = match usize::try_from(n) {
        Ok(bytes) if HEAD_LIMIT_BYTES.contains(&n) => Ok(bytes),
        _ => Err(format!("must be from {lo} to {hi} bytes (1 KiB to 1 MiB), not {n}")),
    };
    e.check(|| path.to_owned(), checked).unwrap_or(default as usize)
}

/// A timeout of the connection watchdog: longer than zero, at most a day.
pub(super) fn connection_timeout(e: &mut Errors<'_>, path: &str, text: Option<&String>, default: Duration) -> Duration {
    let Some(text) = text else { return default };
    let bounded = positive_duration(text).and_then(|d| {
        if d <= MAX_CONNECTION_TIMEOUT { Ok(d) } else { Err(format!("{text:?} is too long; at most 24h")) }
    });
    e.check(|| path.to_owned(), bounded).unwrap_or(default)
}

/// `listen`: one address, or a list of addresses and `{address, tls}` listeners.
fn listeners(e: &mut Errors<'_>, raw: &RawListen) -> Option<Vec<Listener>> {
    let address = |e: &mut Errors<'_>, at: String, text: &str| {
        e.check(
            || at,
            SocketAddr::from_str(text)
                .map_err(|_| format!("invalid address {text:?}; write IP:PORT, e.g. 0.0.0.0:8080")),
        )
    };
    match raw {
        RawListen::One(text) => Some(vec![Listener { address: address(e, "listen".into(), text)?, tls: None }]),
        RawListen::Many(list) if list.is_empty() => {
            e.add("listen".into(), "needs at least one address");
            None
        }
        RawListen::Many(list) => {
            let mut listeners = Vec::new();
            for (i, item) in list.iter().enumerate() {
                let at = format!("listen[{i}]");
                let listener = match item {
                    RawListener::Address(text) => address(e, at, text).map(|address| Listener { address, tls: None }),
                    RawListener::Full(full) => {
                        let addr = address(e, format!("{at}.address"), &full.address);
                        let tls = full.tls.as_ref().map(|t| tls::tls(e, &format!("{at}.tls"), t));
                        match (addr, tls) {
                            (Some(address), None) => Some(Listener { address, tls: None }),
                            (Some(address), Some(Some(tls))) => Some(Listener { address, tls: Some(tls) }),
                            _ => None,
                        }
                    }
                };
                listeners.extend(listener);
            }
            (listeners.len() == list.len()).then_some(listeners)
        }
    }
}

/// A body size limit: a positive byte count.
fn body_size(e: &mut Errors<'_>, path: &str, raw: Option<&RawSize>) -> Option<u64> {
    let size = match raw? {
        RawSize::Bytes(n) => Ok(*n),
        RawSize::Text(text) => parse_size(text),
    };
    let positive =
        size.and_then(|n| if n == 0 { Err("must be positive; leave it out for no limit".into()) } else { Ok(n) });
    e.check(|| path.to_owned(), positive)
}

fn parse_cidr(text: &str) -> Result<IpNet, String> {
    IpNet::from_str(text)
        .or_else(|_| IpAddr::from_str(text).map(IpNet::from))
        .map(|net| net.trunc())
        .map_err(|_| format!("invalid CIDR {text:?}; write e.g. 10.0.0.0/8, 2001:db8::/32 or 127.0.0.1"))
}

/// Names appear in log lines and, quoted, in `RateLimit` header fields.
pub(super) fn check_name(e: &mut Errors<'_>, at: &str, name: &str) {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b)) {
        e.add(at.to_owned(), format!("invalid name {name:?}: use letters, digits, '_', '-' and '.'"));
    }
}

pub(super) fn allow(e: &mut Errors<'_>, at: &str, raw: Option<&RawAllow>) -> Allow {
    let Some(raw) = raw else { return Allow::default() };
    let nets = raw
        .cidrs
        .iter()
        .enumerate()
        .filter_map(|(i, text)| e.check(|| format!("{at}.cidrs[{i}]"), parse_cidr(text)))
        .collect();
    let headers = raw
        .headers
        .iter()
        .filter_map(|(name, value)| e.check(|| format!("{at}.headers.{name}"), header(name, value)))
        .collect();
    let tokens = raw.tokens.iter().map(|t| t.as_bytes().into()).collect();
    Allow { nets, headers, tokens }
}

pub(super) fn positive_duration(text: &str) -> Result<Duration, String> {
    parse_duration(text).and_then(|d| if d.is_zero() { Err("must be longer than zero".into()) } else { Ok(d) })
}

pub(super) fn status_in(
    e: &mut Errors<'_>,
    path: impl FnOnce() -> String,
    code: u16,
    range: std::ops::RangeInclusive<u16>,
) -> StatusCode {
    let ok = range.contains(&code).then(|| StatusCode::from_u16(code).ok()).flatten();
    let (lo, hi) = (range.start(), range.end());
    e.check(path, ok.ok_or_else(|| format!("must be a status from {lo} to {hi}, not {code}")))
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

fn route(e: &mut Errors<'_>, i: usize, raw: &RawRoute, config: &RawConfig, max_body_bytes: Option<u64>) -> Route {
    let at = format!("routes[{i}]");
    let matcher = route_match(e, &format!("{at}.match"), &raw.matcher);
    let action = match (&raw.upstream, &raw.respond) {
        (Some(name), None) => match config.upstreams.keys().position(|n| n == name) {
            Some(index) => Action::Forward(index),
            None => {
                e.add(
                    format!("{at}.upstream"),
                    format!("unknown upstream {name:?} (defined: {})", names(&config.upstreams)),
                );
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
            None => e.add(
                format!("{at}.limits[{j}]"),
                format!("unknown limit {name:?} (defined: {})", names(&config.limits)),
            ),
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
        (cost, None) => {
            let cost = cost.unwrap_or(1);
            // A fixed cost above what a limit admits at once would reject every request.
            for (j, name) in raw.limits.iter().enumerate() {
                let capacity = config.limits.get(name).and_then(limits::raw_capacity);
                if let Some(capacity) = capacity.filter(|&c| cost > c) {
                    e.add(format!("{at}.cost"), format!("{cost} can never fit limit {name:?} (routes[{i}].limits[{j}]), which admits at most {capacity} at once"));
                }
            }
            Cost::Fixed(cost)
        }
    };
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
    Route { name: raw.name.clone().unwrap_or(at), matcher, action, limits, allow, cost, rewrite, max_body_bytes }
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

fn header(name: &str, value: &str) -> Result<(HeaderName, HeaderValue), String> {
    let parsed = HeaderName::from_str(name).map_err(|_| format!("invalid header name {name:?}"))?;
    Ok((parsed, HeaderValue::from_str(value).map_err(|_| format!("invalid value for header {name:?}"))?))
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
