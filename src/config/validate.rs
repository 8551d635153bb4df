//! Raw file -> compiled `Config`: every check, every error collected with its position.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::uri::Authority;
use http::{HeaderMap, Method, StatusCode};
use ipnet::IpNet;

use super::position::Positions;
use super::raw::{RawAdmin, RawAllow, RawConfig, RawMatch, RawRespond, RawRoute, RawUpstream};
use super::units::parse_duration;
use super::{Action, Admin, Config, ConfigError, Cost, PathMatch, Route, RouteMatch, StaticResponse, Upstream};
use super::{limits, shadow, store};
use crate::limit::allow::Allow;

const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest connection timeout accepted: past a day a timeout protects nothing.
const MAX_CONNECTION_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// More connections than any one process can hold open.
pub const MAX_CONNECTIONS: u64 = 10_000_000;
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);

pub(super) struct Errors<'a> {
    file: &'a str,
    positions: &'a Positions,
    list: Vec<ConfigError>,
}

impl Errors<'_> {
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
    let mut e = Errors { file, positions, list: Vec::new() };

    let listen = e.check(
        || "listen".into(),
        SocketAddr::from_str(&raw.listen)
            .map_err(|_| format!("invalid address {:?}; write IP:PORT, e.g. 0.0.0.0:8080", raw.listen)),
    );
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
    let max_connections = raw.server.max_connections.and_then(|n| {
        e.check(
            || "server.max_connections".into(),
            match n {
                1..=MAX_CONNECTIONS => Ok(n as usize),
                _ => Err(format!("must be from 1 to {MAX_CONNECTIONS}, not {n}")),
            },
        )
    });

    let admin = raw.admin.as_ref().and_then(|a| admin(&mut e, a));
    let upstreams = raw.upstreams.iter().map(|(name, u)| upstream(&mut e, name, u)).collect();
    let redis = raw.redis.as_ref().map(|r| store::redis(&mut e, r));
    let limits: Vec<_> = raw.limits.iter().map(|(name, l)| limits::limit(&mut e, name, l, &raw.limits)).collect();
    if redis.is_none() {
        store::require_redis(&mut e, &limits);
    }
    let routes: Vec<_> = raw.routes.iter().enumerate().map(|(i, r)| route(&mut e, i, r, &raw)).collect();
    shadow::check(&mut e, &routes);
    let mut warnings = Vec::new();
    if routes.is_empty() {
        let message = "no routes: every request is answered 404";
        warnings.push(ConfigError::new(file, positions.of("routes"), "routes", message));
    }

    match listen {
        Some(listen) if e.list.is_empty() => Ok(Config {
            listen,
            trusted_proxies,
            header_read_timeout,
            idle_timeout,
            send_timeout,
            max_connections,
            shutdown_grace,
            admin,
            ratelimit_headers: raw.ratelimit_headers,
            ratelimit_header_style: raw.ratelimit_header_style,
            rejection_body: raw.rejection_body,
            redact_keys: raw.redact_keys,
            upstreams,
            redis,
            limits,
            routes,
            warnings,
        }),
        _ => {
            e.list.sort_by_key(|err| (err.line, err.column));
            Err(e.list)
        }
    }
}

/// A timeout of the connection watchdog: longer than zero, at most a day.
fn connection_timeout(e: &mut Errors<'_>, path: &str, text: Option<&String>, default: Duration) -> Duration {
    let Some(text) = text else { return default };
    let bounded = positive_duration(text).and_then(|d| {
        if d <= MAX_CONNECTION_TIMEOUT { Ok(d) } else { Err(format!("{text:?} is too long; at most 24h")) }
    });
    e.check(|| path.to_owned(), bounded).unwrap_or(default)
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

fn upstream(e: &mut Errors<'_>, name: &str, raw: &RawUpstream) -> Upstream {
    let at = format!("upstreams.{name}");
    check_name(e, &at, name);
    if raw.servers.is_empty() {
        e.add(format!("{at}.servers"), "needs at least one server (HOST:PORT)");
    }
    let servers =
        raw.servers
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                e.check(
                    || format!("{at}.servers[{i}]"),
                    Authority::from_str(s).ok().filter(|a| a.port_u16().is_some() && !s.contains('@')).ok_or_else(
                        || format!("invalid server {s:?}; write HOST:PORT, e.g. 127.0.0.1:3000 (plain HTTP)"),
                    ),
                )
            })
            .collect();
    Upstream {
        name: name.to_owned(),
        servers,
        connect_timeout: e.duration(
            &format!("{at}.connect_timeout"),
            raw.connect_timeout.as_ref(),
            DEFAULT_CONNECT_TIMEOUT,
        ),
        timeout: e.duration(&format!("{at}.timeout"), raw.timeout.as_ref(), DEFAULT_UPSTREAM_TIMEOUT),
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

fn route(e: &mut Errors<'_>, i: usize, raw: &RawRoute, config: &RawConfig) -> Route {
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
    Route { name: raw.name.clone().unwrap_or(at), matcher, action, limits, allow, cost }
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
