//! The configuration the request path uses, compiled once from the YAML file.
//!
//! `raw` mirrors the file, `fields` finds its unknown and missing fields, `validate` (with
//! `limits` for each limit) turns it into the types below (every error with its file,
//! line, column and field path, all reported together), `position` maps field paths back
//! to lines. Nothing here is parsed again per request.

mod calendar;
mod checks;
mod fast;
mod fields;
pub mod files;
mod jwt;
mod limits;
mod messages;
pub mod position;
mod raw;
pub(crate) mod resolve;
mod routes;
mod secrets;
mod shadow;
mod store;
mod strict;
pub mod tls;
pub mod units;
mod upstreams;
mod validate;
pub mod words;

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::uri::Authority;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use ipnet::IpNet;
use typed_index_collections::TiVec;

pub use crate::ids::{LimitId, RouteId, UpstreamId};
pub use crate::jwt::Verifier;
pub use crate::policy::allow::Allow;
pub use crate::policy::key::KeySpec;
use crate::policy::key::{ClaimPath, KeyPart};
pub use crate::policy::{Burst, LimitUse, OnInvalidToken, OnMissingKey, OnStoreError, Policy, Rate, Scope};
pub use crate::router::{PathMatch, PathRegex, RouteMatch, Router};
use crate::variables::Template;
pub use raw::{
    AccessFormat, ForwardedMode, HeaderMode, HeaderStyle, LimitAction, LimitHeaders, LogKeys, LogLevel, RejectionBody,
};
pub use routes::{BodyMatch, ValuePattern};
pub use validate::MAX_CONNECTIONS;

#[derive(Debug)]
pub struct Config {
    /// At least one.
    pub listeners: Vec<Listener>,
    pub trusted_proxies: Vec<IpNet>,
    /// `server:`: how connections and requests are read and served.
    pub server: ServerSettings,
    /// The admin listener (`None`: off).
    pub admin: Option<Admin>,
    /// The access log (`None`: off).
    pub access_log: Option<AccessLogConfig>,
    pub ratelimit_headers: HeaderMode,
    /// The request field that names the soft limits annotating a request
    /// (`annotation_field`, `ratelimit-exceeded` by default).
    pub annotation_field: http::HeaderName,
    pub ratelimit_header_style: HeaderStyle,
    pub rejection_body: RejectionBody,
    /// How log lines show keys: credentials hashed unless the operator opts in.
    pub log_keys: LogKeys,
    /// What the digests of key parts are keyed with (`None`: a secret drawn at start).
    pub keys_secret: Option<String>,
    /// Forwarding fields sent upstream and read from trusted proxies.
    pub forwarded: ForwardedMode,
    /// What is valid but likely a mistake (an expired certificate, no routes): `check`
    /// prints these, `run` and a reload log them.
    pub warnings: Vec<ConfigError>,
    pub upstreams: TiVec<UpstreamId, Upstream>,
    /// The Redis of global limits (required when one is global).
    pub redis: Option<Redis>,
    /// How tokens are verified (`jwt:`; required when a limit or match reads claims).
    pub jwt: Option<Arc<Verifier>>,
    /// Where `jwt.jwks_url` is fetched from (`None`: no such URL).
    pub jwks: Option<JwksSource>,
    /// Where limits with `persist: true` keep their state.
    pub persist: Persist,
    pub limits: TiVec<LimitId, Limit>,
    /// Some limit annotates (`Limit::annotates`): forwarded requests carry no
    /// `RateLimit-Exceeded` or `RateLimit` field of the client's. The one test a request
    /// pays for soft limits when there are none.
    pub annotating: bool,
    pub routes: TiVec<RouteId, Route>,
    /// `routes` indexed: which one a request takes.
    pub router: Router,
    /// Some route matches on fields of the body (`match.json`).
    pub body_routes: bool,
}

/// `server:`, as in force: how connections and requests are read and served.
#[derive(Debug, Clone)]
pub struct ServerSettings {
    /// Longest wait for a request's headers: from accept to the first request (protocol
    /// preface included), and on HTTP/1 from a request's first byte to its last header.
    pub header_read_timeout: Duration,
    /// A connection with no request in progress is closed after this long.
    pub idle_timeout: Duration,
    /// A connection whose client reads nothing of its response for this long is closed.
    pub send_timeout: Duration,
    /// Connections served at once; `None`: derived from the open-file limit at start.
    pub max_connections: Option<usize>,
    /// Connections one client address (an IPv6 /64) may hold open at once (`None`: any).
    pub max_connections_per_ip: Option<usize>,
    /// A request whose header fields weigh more than this gets 431 (see
    /// `front::size::header_section_bytes` for how they are counted).
    pub max_header_bytes: usize,
    /// A request whose target (path and query) is longer than this gets 414.
    pub max_uri_bytes: usize,
    pub shutdown_grace: Duration,
    /// Threads serving requests (`None`: one per core), fixed at start.
    pub workers: Option<usize>,
    /// Longest wait for the next piece of a request body once the upstream asks for it
    /// (nginx `client_body_timeout`); past it the request is cut and answered 408.
    pub body_read_timeout: Duration,
    /// The most of a request body read before its admission, on a route whose limits
    /// read its JSON fields (`json:` key parts).
    pub body_peek: u64,
    /// Request fields whose names hold `_` are forwarded (`server.underscores_in_headers`);
    /// by default they are dropped (see `hop::request_fields`).
    pub underscores_in_headers: bool,
}

/// `access_log:`: where and how request lines are written.
#[derive(Debug, Clone)]
pub struct AccessLogConfig {
    pub format: AccessFormat,
    /// `None`: stderr.
    pub path: Option<String>,
    /// Each line records the key parts of the limits its route evaluated (`keys: true`);
    /// a part written as a digest requires `Config::keys_secret` (validation).
    pub keys: bool,
}

impl LogKeys {
    /// Whether keys show `part` as its digest rather than as sent: credentials unless
    /// `clear`; with `hashed`, every part but the host (no credential, and what a replay
    /// routes by).
    pub fn digests(self, part: &KeyPart) -> bool {
        match self {
            LogKeys::Clear => false,
            LogKeys::HashedSecrets => part.is_secret(),
            LogKeys::Hashed => *part != KeyPart::Host,
        }
    }
}

/// `admin:`: where health, metrics and the admin API are served.
#[derive(Debug, Clone)]
pub struct Admin {
    pub listen: SocketAddr,
    /// When set, every admin call must carry `Authorization: Bearer TOKEN`.
    pub token: Option<String>,
    /// `insecure: true`: served without a token on an address other than loopback.
    pub insecure: bool,
    /// The host names it answers besides IP addresses and `localhost` (`admin.hosts`):
    /// a request naming another host is refused (421), so that no web page reaches it
    /// by DNS rebinding.
    pub hosts: Vec<String>,
}

/// An address to accept clients on, in plain text or TLS.
#[derive(Debug)]
pub struct Listener {
    pub address: SocketAddr,
    pub tls: Option<tls::Tls>,
}

#[derive(Debug)]
pub struct Upstream {
    pub name: String,
    pub servers: Vec<Server>,
    pub balance: Balance,
    pub connect_timeout: Duration,
    /// Longest wait for the response headers once the request is sent.
    pub timeout: Duration,
    /// Further servers a request that could not be sent is tried on.
    pub retries: u32,
    /// Speak HTTP/2 to the servers (prior knowledge on `http://`, ALPN on `https://`).
    pub http2: bool,
    /// How `https://` servers are verified.
    pub tls: UpstreamTls,
    pub health_check: Option<HealthCheck>,
    /// An upgraded connection (WebSocket) through which nothing moves this long is closed.
    pub tunnel_idle_timeout: Duration,
    /// How often servers written with a host name are looked up again (`None`: only when
    /// the configuration is loaded, and until each name has an address).
    pub resolve_interval: Option<Duration>,
    /// Idle HTTP/1.1 connections kept open to each server: as many as the load lately
    /// needed (`None`, the default), or at most this many (nginx `keepalive`).
    pub keepalive: Option<usize>,
    /// Requests in progress at each server, at most (`None`: no cap): a request finds
    /// another server, or waits up to `queue_timeout` for one to have room.
    pub max_conns: Option<std::num::NonZeroUsize>,
    pub queue_timeout: Duration,
}

/// Active health check: every `interval`, `GET path` on each server; a server that does
/// not answer one of `expect_status` within `timeout` is out until a check passes.
#[derive(Debug, Clone)]
pub struct HealthCheck {
    pub path: http::uri::PathAndQuery,
    pub interval: Duration,
    pub timeout: Duration,
    /// Empty: any 2xx or 3xx.
    pub expect_status: Vec<StatusCode>,
    /// Checks with gRPC's `grpc.health.v1.Health/Check` for this service (empty: the
    /// server as a whole) rather than `GET path`.
    pub grpc_service: Option<String>,
}

#[derive(Debug, Clone)]
pub struct UpstreamTls {
    /// The CA certificates to trust instead of the public roots (a private CA).
    pub roots: Option<Vec<rustls::pki_types::CertificateDer<'static>>>,
    /// The name sent and verified instead of the server's host.
    pub sni: Option<rustls::pki_types::ServerName<'static>>,
    /// `false`: any certificate is accepted (tests only).
    pub verify: bool,
}

#[derive(Debug, Clone)]
pub struct Server {
    pub address: Authority,
    /// `https://`: spoken to over TLS.
    pub tls: bool,
    /// Its share of requests relative to the other servers' weights.
    pub weight: u32,
    /// Its own passive health, or the upstream's (nginx's `server … max_fails=N
    /// fail_timeout=T`).
    pub max_fails: u32,
    pub fail_timeout: Duration,
}

/// How an upstream chooses a request's server among those not taken out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Balance {
    /// In turn, by weight (nginx's smooth weighted round robin).
    RoundRobin,
    /// Fewest requests in progress per unit of weight.
    LeastConn,
    /// The less busy of two servers drawn at random by weight.
    RandomTwo,
    /// By a key of the request, consistently: the same key goes to the same server, and
    /// adding a server moves only its share of keys.
    Hash(KeySpec),
}

/// The `redis:` section: where global limits keep their state, and how long sluicegate
/// waits for it.
#[derive(Debug, Clone)]
pub struct Redis {
    /// `redis://` or `rediss://` (TLS), with optional credentials and database; empty
    /// with `sentinel`.
    pub url: String,
    /// `url` is one node of a Redis Cluster; the others are discovered.
    pub cluster: bool,
    /// The master is found through these sentinels.
    pub sentinel: Option<Sentinel>,
    pub username: Option<String>,
    pub password: Option<String>,
    /// With `rediss://`: the PEM certificate(s) of the CA to trust instead of the public
    /// roots (a private CA).
    pub tls_ca: Option<Vec<u8>>,
    /// Longest wait for one decision; past it, each global limit's `on_store_error` applies.
    pub timeout: Duration,
    pub connect_timeout: Duration,
    /// Multiplexed connections; concurrent requests are pipelined on each.
    pub connections: usize,
    /// Start of every key sluicegate writes.
    pub key_prefix: String,
    /// Failed calls in a row that open the circuit breaker.
    pub breaker_failures: u32,
    /// How long failures must go on (first to latest of the streak) before the breaker
    /// opens: one batch of calls that timed out together does not open it.
    pub breaker_window: Duration,
    /// How long an open breaker skips Redis before it is probed, and the time between
    /// probes while it stays open (`store::probe`).
    pub breaker_cooldown: Duration,
    /// Lifetime of a global concurrency slot unless renewed (its holder renews it while
    /// the request lives).
    pub lease_ttl: Duration,
    /// Keys known to be over a global limit, remembered per limit (0: no near-cache).
    pub near_cache_keys: usize,
}

/// `redis.sentinel`.
#[derive(Debug, Clone)]
pub struct Sentinel {
    /// The master's name the sentinels know.
    pub master: String,
    /// `redis://host:port` of each sentinel.
    pub nodes: Vec<String>,
    pub password: Option<String>,
    pub check_interval: Duration,
}

/// The state directory of limits with `persist: true` (`crate::persist`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Persist {
    /// Resolved against the configuration file's directory.
    pub dir: std::path::PathBuf,
    /// How often state is written, besides at shutdown.
    pub interval: Duration,
    /// The file has a `persist:` section: the counts the operator gives keys
    /// (`PUT /overrides`) are kept in `dir` too.
    pub given: bool,
}

#[derive(Debug)]
pub struct Limit {
    pub name: String,
    pub key: KeySpec,
    /// What the limit allows: one policy, or one per window with `rates:` (all must admit).
    pub windows: Vec<Policy>,
    /// Status of a rejection.
    pub status: StatusCode,
    /// gRPC status of a rejection of a gRPC call.
    pub grpc_status: crate::grpc::Code,
    pub max_keys: usize,
    /// Decide and keep state as if enforced, but never reject or delay.
    pub dry_run: bool,
    /// Whether clients see it in the rate-limit header fields.
    pub headers: LimitHeaders,
    /// What it does with a request over it.
    pub action: LimitAction,
    /// The percentage of its capacity (1 to 100) from which a request it admits is
    /// forwarded annotated.
    pub annotate_from: Option<u8>,
    /// Its state is kept in `Config::persist`'s directory across restarts (local limits
    /// other than concurrency only).
    pub persist: bool,
    /// Level of rejection lines; delays log one level lower.
    pub log_level: LogLevel,
    /// Rejection and delay lines written per second at most; the rest are summed up in
    /// one line per second (0: none are written).
    pub log_lines_per_second: u32,
    /// A key this limit rejects is refused for a while.
    pub ban: Option<Ban>,
    /// Requests this limit does not count.
    pub allow: Allow,
    /// Only responses with these statuses count (`None`: all).
    pub count: Option<Box<[u16]>>,
    /// What the response reports it cost, debited once it has ended.
    pub charge: Option<crate::policy::charge::Charge>,
    /// The currency it counts, when it is a money budget (`money:`): its limit, charges
    /// and standings are micro-units of it.
    pub money: Option<crate::policy::charge::Money>,
    /// Requests matching an override are decided by that limit (index into
    /// `Config::limits`) instead: a paid tier with its own rate, say.
    pub overrides: Vec<(Allow, LimitId)>,
    pub scope: Scope,
    /// What it does with a request that lacks its key.
    pub on_missing_key: OnMissingKey,
    /// What it does with a request whose token does not verify (a key with `jwt:` parts).
    pub on_invalid_token: OnInvalidToken,
    /// Its own refusal (`response:`; `None`: `rejection_body`'s).
    pub response: Option<LimitResponse>,
    /// Where a key's own count may come from (`limit_from`; `None`: every key has the
    /// limit's).
    pub tenant: Option<crate::policy::tenant::TenantFrom>,
    /// A concurrency limit's waiting room (`None`: a request without a slot is refused).
    pub queue: Option<crate::policy::Queue>,
}

/// A limit's own refusal: its body (written with the limit's name and `Retry-After`),
/// content type and extra fields; its status is the limit's `status`.
#[derive(Debug, Clone)]
pub struct LimitResponse {
    pub body: Vec<BodyPiece>,
    pub content_type: HeaderValue,
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

/// A piece of a limit's refusal body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyPiece {
    Text(String),
    /// `{limit}`: the limit's name.
    Limit,
    /// `{retry_after}`: the seconds of `Retry-After`.
    RetryAfter,
}

impl Limit {
    /// Whether it refuses a request over it: neither in dry run nor annotating.
    pub fn refuses(&self) -> bool {
        !self.dry_run && self.action == LimitAction::Refuse
    }

    /// Whether it may annotate a request forwarded upstream (or, in dry run, say it
    /// would): `action: annotate`, or `annotate_from`.
    pub fn annotates(&self) -> bool {
        self.action == LimitAction::Annotate || self.annotate_from.is_some()
    }

    /// The most this limit admits at once, over all its windows (`None`: no bound on
    /// what a request may weigh).
    pub fn capacity(&self) -> Option<u64> {
        self.windows.iter().filter_map(Policy::capacity).min()
    }
}

/// `ban` and `ban_max` of a limit: a first ban lasts `base`; a repeat within `max` of the
/// last ban's end doubles it, up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ban {
    pub base: Duration,
    pub max: Duration,
}

#[derive(Debug)]
pub struct Route {
    pub name: String,
    pub matcher: RouteMatch,
    pub action: Action,
    /// The limits it applies (indices into `Config::limits`, each with the route's own
    /// burst and delay if it gives them), ascending: every request takes the locks of its
    /// limits in this one order.
    pub limits: Vec<LimitUse>,
    /// The same limits in the file's order: how `GET /config` and the dashboard list them.
    pub listed: Box<[LimitId]>,
    /// `limits` and the limits their overrides name, ascending: every limit that may
    /// decide one of the route's requests.
    pub candidates: Box<[LimitId]>,
    /// The least any of `candidates` admits at once, and which one that is (`None`: no
    /// bound on what a request may weigh).
    pub capacity: Option<(u64, LimitId)>,
    /// Requests that skip all of the route's limits.
    pub allow: Allow,
    /// What a request weighs in the route's limits.
    pub cost: Cost,
    /// What a forwarded request and its response are changed in.
    pub rewrite: Rewrite,
    /// Largest request body forwarded (the route's own, else `server.max_body_bytes`);
    /// `None`: unlimited.
    pub max_body_bytes: Option<u64>,
    /// How fast each response's body is sent (`None`: as fast as the client takes it).
    pub body_rate: Option<BodyRate>,
    /// The class its requests wait in, in the queues of its limits that have one of this
    /// name (`priority:`; `None`: each queue's classes' matches say).
    pub priority: Option<Box<str>>,
    /// Whether its requests' tokens are verified, and what an invalid one gets.
    pub token: TokenUse,
    /// Keys the upstream refused with a time to wait are answered here until then.
    pub upstream_hold: Option<UpstreamHold>,
    /// The fields of a JSON body that limits which may decide its requests read (`json:`
    /// key parts): a request with a body is read that far before its admission. (Of a
    /// route that matches on the body: every route's and every match's, as its requests
    /// may go to any later route once their body is known.)
    pub body_fields: Option<Arc<[ClaimPath]>>,
    /// The fields of the body its requests must have (`match.json`).
    pub body_match: Option<Box<BodyMatch>>,
}

/// `upstream_hold:` of a route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamHold {
    /// Whose requests a refusal holds.
    pub by: HoldBy,
    /// The longest hold, whatever the upstream asks.
    pub max: Duration,
    /// Keys held at most at once.
    pub max_keys: usize,
}

/// What an upstream's refusal holds: the key of one of the route's limits, or the route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldBy {
    Limit(LimitId),
    Route,
}

/// `jwt.jwks_url`: a JWKS fetched with the upstream client, from an upstream of its own.
#[derive(Debug)]
pub struct JwksSource {
    /// As written, for log lines.
    pub url: String,
    /// Its one server (the URL's scheme, host and port), with the default timeouts.
    pub upstream: Upstream,
    /// The path and query asked for.
    pub target: String,
    /// How often it is fetched again.
    pub refresh: Duration,
}

/// Whether a route reads its requests' tokens: some limit that may decide them is keyed
/// on a claim, or an allow-list or override matches claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenUse {
    Unread,
    Read {
        /// The first enforced limit keyed on a claim with `on_invalid_token: refuse`: a
        /// request whose token does not verify is refused (401) in its name. `None`:
        /// such a request goes on without claims.
        refused_by: Option<LimitId>,
    },
}

/// A response body's pace: its first `after` bytes at once, the rest at `per_second`
/// bytes a second (nginx's `limit_rate_after`, `limit_rate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyRate {
    pub per_second: u64,
    pub after: u64,
}

/// Changes to a forwarded request and its response, per route.
#[derive(Debug, Default)]
pub struct Rewrite {
    pub path: Option<PathRewrite>,
    pub set_request_headers: Vec<(HeaderName, Template)>,
    pub remove_request_headers: Vec<HeaderName>,
    pub set_response_headers: Vec<(HeaderName, Template)>,
    pub upstream_host: UpstreamHost,
    /// `Expires` and `Cache-Control` set on the upstream's responses (nginx's `expires`).
    pub expires: Option<Expires>,
}

/// How long a response may be cached, as nginx's `expires` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expires {
    /// `Expires` this long from now, `Cache-Control: max-age` of it.
    After(Duration),
    /// Already expired: `Expires` in 1970, `Cache-Control: no-cache`.
    Epoch,
    /// As far as nginx's `max`: `Expires` at the end of 2037, ten years' `max-age`.
    Max,
}

/// The path sent upstream, made from the normalized path that matched `prefix`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathRewrite {
    /// Without the prefix (`strip_prefix: true`), still starting with `/`.
    Strip(String),
    /// `to` followed by what comes after `prefix`.
    Replace { prefix: String, to: String },
    /// A `path_regex` route's `to`: the whole path, with what the pattern's groups captured.
    Template(Box<[Piece]>),
}

/// A piece of a `path_regex` route's `rewrite.to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    /// What the named group captured, escaped as a path.
    Group(Box<str>),
}

/// The `Host` a forwarded request carries.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub enum UpstreamHost {
    /// The client's.
    #[default]
    Keep,
    /// The client's without its port, in lower case (nginx's `$host`).
    KeepName,
    /// The server's `HOST:PORT`.
    Server,
    /// This name.
    Name(HeaderValue),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cost {
    /// Every request weighs this many units (default 1).
    Fixed(u64),
    /// A positive integer in this request header (1 when the header is absent).
    Header(HeaderName),
}

#[derive(Debug)]
pub enum Action {
    Forward(UpstreamId),
    Respond(StaticResponse),
}

#[derive(Debug)]
pub struct StaticResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    /// Fields whose values hold variables, made for each request.
    pub made: Vec<(HeaderName, Template)>,
    pub body: Bytes,
}

/// One problem in the file, where it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    pub line: usize,
    pub column: usize,
    /// Field path such as `routes[1].limits[0]`; empty for the whole file.
    pub path: String,
    pub message: String,
}

impl ConfigError {
    /// The error at `position`; quoted values and names in the path are cut short.
    pub fn new(file: &str, (line, column): (usize, usize), path: &str, message: &str) -> Self {
        ConfigError {
            file: file.to_owned(),
            line,
            column,
            path: messages::shorten_path(path),
            message: messages::shorten_quotes(message),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: ", self.file, self.line, self.column)?;
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        f.write_str(&self.message)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{file}: cannot read: {source}")]
    Read { file: String, source: std::io::Error },
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<ConfigError>),
}

/// The JSON Schema of the configuration file, derived from the types that parse it
/// (`raw`), so that it cannot drift from what `check` accepts. Values with a syntax of
/// their own (rates, durations, addresses) are strings in it; `check` tells the rest.
pub fn schema() -> String {
    let mut schema = schemars::schema_for!(raw::RawConfig);
    // Named after the product, not the type that parses it.
    schema.insert("title".into(), "sluicegate configuration".into());
    schema.insert(
        "description".into(),
        concat!(
            "The YAML configuration file of sluicegate ",
            env!("CARGO_PKG_VERSION"),
            " (`sluicegate check` tells the rest)"
        )
        .into(),
    );
    serde_json::to_string_pretty(&schema).unwrap_or_default()
}

/// Reads and compiles the file at `path`.
pub fn load(path: &Path) -> Result<Config, LoadError> {
    let (file, src) = read(path)?;
    parse(&src, &file)
}

/// What `check` does: `load`, and then every upstream host must resolve (bounded in time).
pub fn check(path: &Path) -> Result<Config, LoadError> {
    let (file, src) = read(path)?;
    let config = parse(&src, &file)?;
    let unresolved = resolve::unresolved(&config, &src, &file);
    if unresolved.is_empty() { Ok(config) } else { Err(LoadError::Invalid(unresolved)) }
}

/// The file's name for errors, and its text.
/// Far above any real configuration; `-c /dev/zero` must not read until memory runs out.
const MAX_CONFIG_BYTES: u64 = 16 << 20;

pub fn read(path: &Path) -> Result<(String, String), LoadError> {
    let file = path.display().to_string();
    let bytes =
        files::read_bounded(path, MAX_CONFIG_BYTES).map_err(|source| LoadError::Read { file: file.clone(), source })?;
    let src = String::from_utf8(bytes).map_err(|err| {
        let valid_up_to = err.utf8_error().valid_up_to();
        let position = messages::utf8_error_position(err.as_bytes(), valid_up_to);
        let byte = err.as_bytes()[valid_up_to];
        let message = format!("invalid UTF-8 (byte 0x{byte:02X}); the file must be UTF-8");
        LoadError::Invalid(vec![ConfigError::new(&file, position, "", &message)])
    })?;
    Ok((file, src))
}

/// The parser's guards against YAML bombs: alias expansion, nesting depth and the
/// file's size (`MAX_CONFIG_BYTES`) are bounded as the parser's defaults have them; its
/// counts of nodes and events are not (a file of 100,000 routes holds about a million),
/// since no file within the size bound holds more of them than bytes.
fn yaml_options() -> serde_saphyr::Options {
    let bytes = usize::try_from(MAX_CONFIG_BYTES).unwrap_or(usize::MAX);
    let mut budget = serde_saphyr::Budget::default();
    budget.max_nodes = bytes;
    budget.max_events = bytes;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options
}

/// Compiles YAML `src`; `file` names it in errors.
pub fn parse(src: &str, file: &str) -> Result<Config, LoadError> {
    if messages::is_blank(src) {
        return Err(LoadError::Invalid(vec![ConfigError::new(file, (1, 1), "", messages::EMPTY)]));
    }
    let positions = position::Positions::new(src);
    // serde's pass, watched (`strict`), tells whether the walk that finds unknown and
    // missing fields has anything to find: in a file without such errors, the common
    // case, it does not, and the file is parsed once (`fast`).
    if let Some((raw, vouched)) = fast::raw(src) {
        let fields = if vouched { fields::FieldReport::default() } else { fields::check(src, file) };
        return validate::compile(raw, &positions, fields, file).map_err(LoadError::Invalid);
    }
    // serde failed: unknown and missing fields are found beside it again, so that they
    // are reported with the one error that stopped it, placed by its path. Each walk
    // parses the file; on another thread, they take the time of one.
    let (raw, path, fields) = std::thread::scope(|scope| {
        let fields = scope.spawn(|| fields::check(src, file));
        let mut path = String::new();
        let raw = serde_saphyr::with_deserializer_from_str_with_options(src, yaml_options(), |de| {
            serde_path_to_error::deserialize(de).map_err(|e| {
                path = e.path().to_string();
                e.into_inner()
            })
        });
        (raw, path, fields.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
    });
    match raw {
        Ok(raw) => validate::compile(raw, &positions, fields, file).map_err(LoadError::Invalid),
        Err(e) => {
            let (line, column, path, message) = messages::describe(&e, src, &positions, &path);
            let mut errors = fields.errors;
            errors.push(ConfigError::new(file, (line, column), &path, &message));
            errors.sort_by_key(|err| (err.line, err.column));
            Err(LoadError::Invalid(errors))
        }
    }
}
