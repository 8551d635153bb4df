//! Raw file -> compiled `Config`: every check, every error collected with its position.

use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use http::header::HeaderValue;
use typed_index_collections::{TiSlice, TiVec};

use super::checks::{Errors, body_size, connection_timeout, parse_cidr, size};
use super::fields::FieldReport;
use super::position::Positions;
use super::raw::{
    AccessFormat, LogKeys, RawAccessLog, RawAdmin, RawConfig, RawListen, RawListener, RawPersist, RawServer,
};
use super::{
    AccessLogConfig, Admin, Config, ConfigError, Limit, LimitId, Listener, Persist, Route, RouteId, Router,
    ServerSettings, jwt, limits, routes, shadow, store, tls, upstreams,
};
use crate::policy::key::KeyPart;
use crate::policy::{Policy, Scope};
use crate::router::Scheme;

const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(60);
/// nginx's `client_body_timeout`.
const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(60);
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

fn admin(e: &mut Errors<'_>, raw: &RawAdmin) -> Option<Admin> {
    let listen = e.check(
        || "admin.listen".into(),
        SocketAddr::from_str(&raw.listen)
            .map_err(|_| format!("invalid address {:?}; write IP:PORT, e.g. 127.0.0.1:9901", raw.listen)),
    );
    let token = super::secrets::secret(e, "admin.token", raw.token.as_deref(), raw.token_file.as_deref());
    if token.as_ref().is_some_and(|t| t.is_empty() || HeaderValue::from_str(&format!("Bearer {t}")).is_err()) {
        e.add("admin.token".into(), "must be a non-empty string of visible ASCII characters");
    }
    let given = raw.token.is_some() || raw.token_file.is_some();
    if let Some(addr) = listen
        && !addr.ip().to_canonical().is_loopback()
        && !given
        && !raw.insecure
    {
        e.add(
            "admin.listen".into(),
            format!(
                "{addr} is not a loopback address and the admin API has no token: anyone who reaches it could \
                 reload the configuration, reset keys and lift bans; set admin.token (or token_file), or \
                 admin.insecure: true to serve it so knowingly"
            ),
        );
    }
    if raw.insecure && given {
        e.warn("admin.insecure".into(), "does nothing with a token: every call needs the token anyway");
    }
    for (i, name) in raw.hosts.iter().enumerate() {
        let bare = name.strip_suffix('.').unwrap_or(name);
        let valid = !bare.is_empty()
            && bare.split('.').all(|label| {
                (1..=63).contains(&label.len()) && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            });
        if !valid {
            e.add(
                format!("admin.hosts[{i}]"),
                format!("{name:?} is not a host name: write the name alone (letters, digits, '-' and '.'), no port or scheme"),
            );
        }
    }
    Some(Admin { listen: listen?, token, insecure: raw.insecure, hosts: raw.hosts.clone() })
}

/// `fields`: the file's unknown and missing fields, reported with the rest.
pub fn compile(
    raw: RawConfig,
    positions: &Positions,
    fields: FieldReport,
    file: &str,
) -> Result<Config, Vec<ConfigError>> {
    let FieldReport { errors, missing } = fields;
    let mut e = Errors { file, positions, missing: &missing, list: errors, warnings: Vec::new() };

    let listeners = listeners(&mut e, &raw.listen);
    let trusted_proxies: Vec<_> = raw
        .trusted_proxies
        .iter()
        .enumerate()
        .filter_map(|(i, text)| e.check(|| format!("trusted_proxies[{i}]"), parse_cidr(text)))
        .collect();
    let server = server_settings(&mut e, &raw.server);
    let max_body_bytes = body_size(&mut e, "server.max_body_bytes", raw.server.max_body_bytes.as_ref());
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
    // Found now, by `check` too, rather than when `run` or a reload opens it.
    if let Some(path) = raw.access_log.as_ref().and_then(|a| a.path.as_deref()).filter(|p| *p != "stderr") {
        e.check(|| "access_log.path".into(), super::files::appendable(path));
    }
    let upstreams = raw.upstreams.iter().map(|(name, u)| upstreams::upstream(&mut e, name, u)).collect();
    let redis = raw.redis.as_ref().map(|r| store::redis(&mut e, r));
    let jwt = raw.jwt.as_ref().and_then(|j| jwt::jwt(&mut e, j));
    let jwks = raw.jwt.as_ref().and_then(|j| jwt::jwks(&mut e, j));
    if raw.jwt.is_none() {
        jwt::require_jwt(&mut e, &raw);
    }
    let limits: TiVec<LimitId, _> =
        raw.limits.iter().map(|(name, l)| limits::limit(&mut e, name, l, &raw.limits)).collect();
    if redis.is_none() {
        store::require_redis(&mut e, &limits.raw);
    }
    tenant_sources(&mut e, &limits.raw, trusted_proxies.is_empty());
    let mut routes: TiVec<RouteId, _> = routes::all(&mut e, &raw, &limits, max_body_bytes).into();
    let body_routes = routes::body_routing(&mut e, &mut routes.raw);
    let router = Router::new(routes.iter().map(|r| &r.matcher)).unwrap_or_else(|message| {
        e.add("routes".into(), message);
        Router::default()
    });
    shadow::check(&mut e, &routes.raw, &router);
    if let Some(listeners) = &listeners {
        scheme_without_listener(&mut e, &routes.raw, listeners);
    }
    // A limit no route lists (nor overrides into) decides nothing: most likely a name
    // left out of a route's `limits`.
    for name in raw.limits.keys() {
        let listed = raw.routes.iter().any(|r| r.limits.iter().any(|u| u.name() == name))
            || raw.limits.values().any(|l| l.overrides.iter().any(|o| &o.target == name));
        if !listed {
            e.warn(format!("limits.{name}"), "no route lists this limit: it decides nothing");
        }
    }
    let keys_secret = keys_secret(&mut e, &raw);
    let annotation_field = match &raw.annotation_field {
        Some(name) => e.check(|| "annotation_field".into(), super::checks::annotation_field(name)),
        None => None,
    }
    .unwrap_or(super::checks::ANNOTATION_FIELD);
    let persist = persist(&mut e, raw.persist.as_ref(), file);
    if let Some(log) = &raw.access_log {
        access_log_keys(&mut e, log, keys_secret.is_some(), log_keys, &limits, &routes);
    }
    if routes.is_empty() {
        e.warn("routes".into(), "no routes: every request is answered 404");
    }

    match listeners {
        Some(listeners) if e.list.is_empty() => Ok(Config {
            listeners,
            trusted_proxies,
            server,
            admin,
            access_log: raw.access_log.as_ref().map(|a| AccessLogConfig {
                format: a.format,
                path: a.path.clone().filter(|p| p != "stderr"),
                keys: a.keys,
            }),
            ratelimit_headers: raw.ratelimit_headers,
            annotation_field,
            ratelimit_header_style: raw.ratelimit_header_style,
            rejection_body: raw.rejection_body,
            log_keys,
            keys_secret,
            forwarded: raw.forwarded,
            warnings: e.warnings,
            upstreams,
            redis,
            jwt,
            jwks,
            persist,
            annotating: limits.iter().any(Limit::annotates),
            limits,
            routes,
            router,
            body_routes,
        }),
        _ => {
            e.list.sort_by_key(|err| (err.line, err.column));
            Err(e.list)
        }
    }
}

/// What `limit_from` needs beyond its own fields: a count in a field is honoured only
/// from a peer in `trusted_proxies` (none listed, none would be); and a global rate's
/// takebacks and charges (`count:`, `charge:`) are made in Redis with the limit's own
/// interval, so a key's own count and them do not go together there.
fn tenant_sources(e: &mut Errors<'_>, limits: &[Limit], no_trusted_proxies: bool) {
    for limit in limits {
        let Some(tenant) = &limit.tenant else { continue };
        let at = format!("limits.{}.limit_from", limit.name);
        if no_trusted_proxies && matches!(tenant.source, Some(KeyPart::Header(_))) {
            e.add(
                format!("{at}.header"),
                "a count in a field is read only from a peer in `trusted_proxies`, and none is listed: \
                 list the proxy (or auth gateway) that sets it",
            );
        }
        let global_rate =
            matches!(limit.scope, Scope::Global { .. }) && matches!(limit.windows.as_slice(), [Policy::Rate { .. }]);
        if global_rate && (limit.count.is_some() || limit.charge.is_some()) {
            e.add(
                at,
                "a global rate limit that takes back (`count`) or charges (`charge`) decides every key with its own \
                 rate: give it a window (`algorithm: fixed_window`), or keep it local",
            );
        }
    }
}

/// Where persisted limits keep their state unless `persist.dir` says otherwise: the
/// directory the systemd unit (contrib/sluicegate.service) gives the service.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/sluicegate";
/// How often persisted state is written unless `persist.interval` says otherwise: what a
/// crash may lose, against a write of every persisted table.
const DEFAULT_PERSIST_INTERVAL: Duration = Duration::from_secs(60);
/// `persist.interval`'s bounds: a second (more often, writing the tables is most of what
/// the process does) to an hour (what a crash may lose).
const PERSIST_INTERVAL: std::ops::RangeInclusive<Duration> = Duration::from_secs(1)..=Duration::from_secs(3600);

/// `server.body_peek`'s default: an LLM or MCP request's fields come in its first bytes,
/// and a prompt of a few pages fits.
const DEFAULT_BODY_PEEK: u64 = 64 << 10;
/// `server.body_peek`'s bound: what each request of a body-keyed route may hold before
/// its admission.
const MAX_BODY_PEEK: u64 = 16 << 20;

/// `server:`, each setting checked, defaults filled in.
fn server_settings(e: &mut Errors<'_>, raw: &RawServer) -> ServerSettings {
    let header_read_timeout =
        e.duration("server.header_read_timeout", raw.header_read_timeout.as_ref(), DEFAULT_HEADER_READ_TIMEOUT);
    let shutdown_grace = e.duration("server.shutdown_grace", raw.shutdown_grace.as_ref(), DEFAULT_SHUTDOWN_GRACE);
    let idle_timeout = connection_timeout(e, "server.idle_timeout", raw.idle_timeout.as_ref(), DEFAULT_IDLE_TIMEOUT);
    let send_timeout = connection_timeout(e, "server.send_timeout", raw.send_timeout.as_ref(), DEFAULT_SEND_TIMEOUT);
    let body_read_timeout =
        connection_timeout(e, "server.body_read_timeout", raw.body_read_timeout.as_ref(), DEFAULT_BODY_READ_TIMEOUT);
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
    let max_connections = connections("max_connections", raw.max_connections);
    let max_connections_per_ip = connections("max_connections_per_ip", raw.max_connections_per_ip);
    let workers = raw.workers.and_then(|n| {
        e.check(
            || "server.workers".to_owned(),
            match n {
                1..=MAX_WORKERS => Ok(n as usize),
                _ => Err(format!("must be from 1 to {MAX_WORKERS}, not {n}")),
            },
        )
    });
    let max_header_bytes = head_limit(e, "server.max_header_bytes", raw.max_header_bytes, DEFAULT_MAX_HEADER_BYTES);
    let max_uri_bytes = head_limit(e, "server.max_uri_bytes", raw.max_uri_bytes, DEFAULT_MAX_URI_BYTES);
    let body_peek = raw.body_peek.as_ref().map_or(Some(DEFAULT_BODY_PEEK), |peek| {
        let peek = size(e, "server.body_peek", peek)?;
        e.check(
            || "server.body_peek".to_owned(),
            match peek {
                1..=MAX_BODY_PEEK => Ok(peek),
                _ => Err(format!("must be from 1 byte to {} MiB, not {peek} bytes", MAX_BODY_PEEK >> 20)),
            },
        )
    });
    ServerSettings {
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
        body_peek: body_peek.unwrap_or(DEFAULT_BODY_PEEK),
        underscores_in_headers: raw.underscores_in_headers,
    }
}

/// `persist:`, the state directory (a relative one resolved against the directory of
/// `file`, the configuration's) and how often state is written.
fn persist(e: &mut Errors<'_>, raw: Option<&RawPersist>, file: &str) -> Persist {
    let dir = raw.and_then(|r| r.dir.as_deref()).unwrap_or(DEFAULT_STATE_DIR);
    if dir.is_empty() {
        e.add("persist.dir".into(), "must name a directory");
    }
    let interval = e.duration("persist.interval", raw.and_then(|r| r.interval.as_ref()), DEFAULT_PERSIST_INTERVAL);
    if !PERSIST_INTERVAL.contains(&interval) {
        e.add("persist.interval".into(), "must be between 1s and 1h");
    }
    let base = std::path::Path::new(file).parent().unwrap_or(std::path::Path::new(""));
    Persist { dir: base.join(dir), interval, given: raw.is_some() }
}

/// Shortest `keys_secret`: 16 characters of a random string key HMAC-SHA-256 well past
/// guessing.
const MIN_KEYS_SECRET: usize = 16;

/// `keys_secret` (or `keys_secret_file`), or its older place in `access_log`.
fn keys_secret(e: &mut Errors<'_>, raw: &RawConfig) -> Option<String> {
    let top = (raw.keys_secret.as_deref(), raw.keys_secret_file.as_deref());
    let old =
        raw.access_log.as_ref().map_or((None, None), |a| (a.keys_secret.as_deref(), a.keys_secret_file.as_deref()));
    let field = match (top, old) {
        ((None, None), (None, None)) => return None,
        (_, (None, None)) => "keys_secret",
        ((None, None), _) => "access_log.keys_secret",
        _ => {
            e.add("access_log.keys_secret".into(), "give keys_secret at the top level only (this is its older place)");
            return None;
        }
    };
    let (value, file) = if field == "keys_secret" { top } else { old };
    let secret = super::secrets::secret(e, field, value, file)?;
    if secret.chars().count() < MIN_KEYS_SECRET {
        e.add(
            field.into(),
            format!("must be at least {MIN_KEYS_SECRET} characters (a random string, kept like a password)"),
        );
    }
    Some(secret)
}

/// `access_log.keys`: key parts are written in JSON lines, and a part written as a digest
/// (a credential, unless `log_keys: clear`) needs `keys_secret`, so that one value has one
/// digest in every line a replay is given, and a reader of the log cannot test guesses.
fn access_log_keys(
    e: &mut Errors<'_>,
    raw: &RawAccessLog,
    keys_secret: bool,
    log_keys: LogKeys,
    limits: &TiSlice<LimitId, Limit>,
    routes: &TiSlice<RouteId, Route>,
) {
    if raw.keys && raw.format == AccessFormat::Combined {
        e.add(
            "access_log.keys".into(),
            "key parts are written in JSON lines only: give format: json (nginx's combined has no place for them)",
        );
    }
    if !raw.keys || keys_secret {
        return;
    }
    let digested = routes
        .iter()
        .flat_map(|r| r.candidates.iter())
        .filter_map(|&l| limits.get(l))
        .find_map(|l| l.key.0.iter().find(|p| p.logged_apart() && log_keys.digests(p)).map(|p| (l, p)));
    if let Some((limit, part)) = digested {
        e.add(
            "access_log.keys".into(),
            format!(
                "limit {} is keyed on {part}, which the access log writes as a keyed digest: give \
                 keys_secret (at least {MIN_KEYS_SECRET} characters, the same on every instance and \
                 across restarts), or log_keys: clear to write it as sent",
                limit.name
            ),
        );
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

/// Warns of each route whose `match.scheme` no listener serves: it takes no request.
fn scheme_without_listener(e: &mut Errors<'_>, routes: &[Route], listeners: &[Listener]) {
    for (i, route) in routes.iter().enumerate() {
        let Some(scheme) = route.matcher.scheme else { continue };
        if !listeners.iter().any(|l| Scheme::of(l.tls.is_some()) == scheme) {
            let which = if scheme == Scheme::Https { "no listener has" } else { "every listener has" };
            e.warn(
                format!("routes[{i}].match.scheme"),
                format!("{which} `tls`, so no request comes in by {scheme}: this route takes none"),
            );
        }
    }
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
    let port = |e: &mut Errors<'_>, at: String, n: i64| {
        e.add(
            at,
            format!(
                "{n} is a port alone: write the address with it, e.g. 0.0.0.0:{n} (every interface) or 127.0.0.1:{n}"
            ),
        );
    };
    match raw {
        RawListen::One(text) => Some(vec![Listener { address: address(e, "listen".into(), text)?, tls: None }]),
        RawListen::Port(n) => {
            port(e, "listen".into(), *n);
            None
        }
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
                    RawListener::Port(n) => {
                        port(e, at, *n);
                        None
                    }
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
