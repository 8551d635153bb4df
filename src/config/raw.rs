//! The serde mirror of the YAML file: field names, types and optionality, no logic.
//!
//! Values with a syntax of their own (rates, durations, CIDRs, addresses) stay strings
//! here and are parsed by `validate`, which can then report every such error at once
//! with its position.
//!
//! Unknown keys are errors, but not serde's: it would stop at the first. serde skips
//! them, and `fields` reports every one, with a suggestion, from the JSON Schema of these
//! types, in which `#[schemars(deny_unknown_fields)]` keeps them refused. A required
//! field left out is reported there too, so serde fills it in with a placeholder
//! (`#[serde(default)]`, which `#[schemars(!default)]` keeps out of the schema: it stays
//! required) and the rest of the file is still checked; nothing is compiled from it.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::policy::{OnInvalidToken, OnMissingKey, OnStoreError};

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default)]
    #[schemars(!default)]
    pub listen: RawListen,
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    #[serde(default)]
    pub server: RawServer,
    pub admin: Option<RawAdmin>,
    pub access_log: Option<RawAccessLog>,
    #[serde(default)]
    pub ratelimit_headers: HeaderMode,
    /// The request field that names the soft limits annotating a request, for the
    /// upstream (`ratelimit-exceeded` by default).
    pub annotation_field: Option<String>,
    #[serde(default)]
    pub ratelimit_header_style: HeaderStyle,
    #[serde(default)]
    pub rejection_body: RejectionBody,
    pub log_keys: Option<LogKeys>,
    /// The older spelling of `log_keys: hashed` (`true`); `false` changes nothing.
    #[serde(default)]
    pub redact_keys: bool,
    /// What the digests of key parts are keyed with (HMAC-SHA-256), wherever a key is
    /// written: the same on every instance and across restarts, so that one value has
    /// one digest everywhere.
    pub keys_secret: Option<String>,
    /// A file that holds `keys_secret`.
    pub keys_secret_file: Option<String>,
    #[serde(default)]
    pub forwarded: ForwardedMode,
    #[serde(default)]
    pub upstreams: BTreeMap<String, RawUpstream>,
    pub redis: Option<RawRedis>,
    pub jwt: Option<RawJwt>,
    /// Where limits with `persist: true` keep their state, and how often it is written.
    pub persist: Option<RawPersist>,
    #[serde(default)]
    pub limits: BTreeMap<String, RawLimit>,
    #[serde(default)]
    pub routes: Vec<RawRoute>,
}

/// `listen: 0.0.0.0:8080`, or a list of addresses and `{address, tls}` listeners.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum RawListen {
    One(String),
    Many(Vec<RawListener>),
    /// A number: a port without its address, refused with a message that says so
    /// (rather than serde's "did not match any variant").
    #[schemars(skip)]
    Port(i64),
}

/// The placeholder of a `listen` left out.
impl Default for RawListen {
    fn default() -> Self {
        RawListen::Many(Vec::new())
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum RawListener {
    Address(String),
    Full(RawFullListener),
    /// As `RawListen::Port`.
    #[schemars(skip)]
    Port(i64),
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawFullListener {
    #[serde(default)]
    #[schemars(!default)]
    pub address: String,
    pub tls: Option<RawTls>,
}

/// `tls: {cert, key}` (one certificate for every name), or `tls: {certificates: [...]}`
/// chosen by SNI.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawTls {
    pub cert: Option<String>,
    pub key: Option<String>,
    #[serde(default)]
    pub certificates: Vec<RawCertificate>,
    /// `"1.2"` (default) or `"1.3"`.
    pub min_version: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawCertificate {
    #[serde(default)]
    #[schemars(!default)]
    pub cert: String,
    #[serde(default)]
    #[schemars(!default)]
    pub key: String,
    #[serde(default)]
    pub names: Vec<String>,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawServer {
    pub header_read_timeout: Option<String>,
    pub idle_timeout: Option<String>,
    pub send_timeout: Option<String>,
    pub max_connections: Option<u64>,
    pub max_connections_per_ip: Option<u64>,
    pub max_header_bytes: Option<u64>,
    pub max_uri_bytes: Option<u64>,
    pub shutdown_grace: Option<String>,
    pub max_body_bytes: Option<RawSize>,
    pub body_read_timeout: Option<String>,
    pub body_peek: Option<RawSize>,
    pub workers: Option<u64>,
    #[serde(default)]
    pub underscores_in_headers: bool,
}

/// A byte count: a YAML integer, or text with a unit (`10m`).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum RawSize {
    Bytes(u64),
    Text(String),
}

/// The placeholder of a required size left out.
impl Default for RawSize {
    fn default() -> Self {
        RawSize::Bytes(0)
    }
}

/// The admin listener: health, metrics, admin API.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawAdmin {
    #[serde(default)]
    #[schemars(!default)]
    pub listen: String,
    /// The token itself, or `${VARIABLE}`.
    pub token: Option<String>,
    /// A file that holds the token.
    pub token_file: Option<String>,
    /// Serve a listener on an address other than loopback without a token (logged at
    /// warn on every start).
    #[serde(default)]
    pub insecure: bool,
    /// Host names the listener answers besides IP addresses and `localhost`.
    #[serde(default)]
    pub hosts: Vec<String>,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawUpstream {
    #[serde(default)]
    #[schemars(!default)]
    pub servers: Vec<RawUpstreamServer>,
    pub connect_timeout: Option<String>,
    pub timeout: Option<String>,
    pub balance: Option<BalanceName>,
    pub hash_key: Option<RawKey>,
    pub max_fails: Option<u32>,
    pub fail_timeout: Option<String>,
    pub retries: Option<u32>,
    pub http2: Option<bool>,
    pub tls: Option<RawUpstreamTls>,
    pub health_check: Option<RawHealthCheck>,
    pub tunnel_idle_timeout: Option<String>,
    pub resolve_interval: Option<String>,
    pub keepalive: Option<u32>,
    pub max_conns: Option<u32>,
    pub queue_timeout: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawHealthCheck {
    /// Required unless `grpc_service` is given (checked when the file is validated).
    #[serde(default)]
    pub path: String,
    pub interval: Option<String>,
    pub timeout: Option<String>,
    #[serde(default)]
    pub expect_status: Vec<u16>,
    pub grpc_service: Option<String>,
}

/// How `https://` servers are verified.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawUpstreamTls {
    pub ca_file: Option<String>,
    pub sni: Option<String>,
    pub verify: Option<bool>,
}

/// `"HOST:PORT"`, or `{ address: "HOST:PORT", weight: 3, max_fails: 2, fail_timeout: 30s }`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum RawUpstreamServer {
    Address(String),
    Weighted(RawWeightedServer),
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawWeightedServer {
    #[serde(default)]
    #[schemars(!default)]
    pub address: String,
    pub weight: Option<u32>,
    /// The upstream's unless given.
    pub max_fails: Option<u32>,
    pub fail_timeout: Option<String>,
}

/// `balance:` of an upstream: how a request's server is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BalanceName {
    RoundRobin,
    LeastConn,
    RandomTwo,
    Hash,
}

/// The Redis that global limits share.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawRedis {
    /// Required unless `sentinel` is given (checked with the rest).
    #[serde(default)]
    pub url: String,
    #[serde(default)]
    pub cluster: bool,
    /// The master is found through Redis Sentinel (instead of `url`).
    pub sentinel: Option<RawSentinel>,
    /// The user itself, or `${VARIABLE}`.
    pub username: Option<String>,
    /// The password itself, or `${VARIABLE}`.
    pub password: Option<String>,
    /// A file that holds the password.
    pub password_file: Option<String>,
    pub tls_ca_file: Option<String>,
    pub timeout: Option<String>,
    pub connect_timeout: Option<String>,
    pub connections: Option<u64>,
    pub key_prefix: Option<String>,
    pub breaker_failures: Option<u32>,
    pub breaker_window: Option<String>,
    pub breaker_cooldown: Option<String>,
    pub lease_ttl: Option<String>,
    pub near_cache_keys: Option<u64>,
}

/// `redis.sentinel`: the sentinels that name the master of a Redis replication group.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawSentinel {
    /// The master's name, as the sentinels' `sentinel monitor NAME …` gives it.
    pub master: String,
    /// The sentinels, `host:port`.
    pub nodes: Vec<String>,
    /// The sentinels' own password (`requirepass` of the sentinels), itself or `${VARIABLE}`.
    pub password: Option<String>,
    /// A file that holds the sentinels' password.
    pub password_file: Option<String>,
    /// How often the sentinels are asked which server is the master (besides after
    /// every failed call); default `5s`.
    pub check_interval: Option<String>,
}

/// `jwt:`: how the tokens that `jwt:CLAIM` keys and `claims:` matches read are verified.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawJwt {
    /// The HMAC secret (HS256, HS384, HS512), itself or `${VARIABLE}`.
    pub secret: Option<String>,
    /// A file that holds the secret.
    pub secret_file: Option<String>,
    /// Public keys: a PEM file (RSA, EC or Ed25519 keys) or a JWKS file.
    pub keys_file: Option<String>,
    /// A JWKS fetched over HTTP(S), again every `jwks_refresh` and when a token names a
    /// key it lacks.
    pub jwks_url: Option<String>,
    /// How often `jwks_url` is fetched again; default `5m`.
    pub jwks_refresh: Option<String>,
    /// Accepted `iss`: one or a list (left out: any).
    pub issuer: Option<RawOneOrMany>,
    /// Accepted `aud`: one or a list (left out: not checked).
    pub audience: Option<RawOneOrMany>,
    /// Clock skew allowed on `exp` and `nbf`; default `30s`.
    pub leeway: Option<String>,
    /// Where requests carry the token: `bearer` (default), `header:NAME` or `cookie:NAME`.
    pub from: Option<String>,
}

/// A value or a list of values.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum RawOneOrMany {
    One(String),
    Many(Vec<String>),
}

impl RawOneOrMany {
    pub fn values(&self) -> Vec<String> {
        match self {
            RawOneOrMany::One(one) => vec![one.clone()],
            RawOneOrMany::Many(many) => many.clone(),
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawLimit {
    #[serde(default)]
    #[schemars(!default)]
    pub key: RawKey,
    pub ipv4_prefix: Option<u8>,
    pub ipv6_prefix: Option<u8>,
    pub algorithm: Option<AlgorithmName>,
    pub rate: Option<String>,
    pub rates: Option<Vec<String>>,
    pub burst: Option<u64>,
    pub nodelay: Option<bool>,
    pub delay: Option<u64>,
    pub limit: Option<RawAmount>,
    /// The currency a money budget counts in: its limit and charges are amounts of it.
    pub money: Option<String>,
    pub window: Option<RawWindow>,
    pub capacity: Option<u64>,
    pub refill: Option<String>,
    pub interval: Option<String>,
    pub concurrency: Option<RawConcurrency>,
    /// The bounds of a ceiling that learns (`concurrency: adaptive`).
    pub adaptive: Option<RawAdaptive>,
    pub retry_after: Option<String>,
    pub status: Option<u16>,
    pub grpc_status: Option<String>,
    pub max_keys: Option<u64>,
    pub dry_run: Option<bool>,
    /// Whether clients see it in the rate-limit header fields.
    pub headers: Option<LimitHeaders>,
    /// What it does with a request over it: refuse it, or forward it annotated.
    pub action: Option<LimitAction>,
    /// The share of its capacity (`80%`) from which a request it admits is forwarded
    /// annotated.
    pub annotate_from: Option<String>,
    /// Keep the limit's state (and bans) in the state directory across restarts.
    pub persist: Option<bool>,
    pub log_level: Option<LogLevel>,
    pub log_lines_per_second: Option<u32>,
    pub ban: Option<String>,
    pub ban_max: Option<String>,
    pub allow: Option<RawAllow>,
    pub count: Option<Vec<u16>>,
    pub count_grpc: Option<Vec<String>>,
    pub charge: Option<RawCharge>,
    #[serde(default)]
    pub overrides: Vec<RawOverride>,
    pub scope: Option<ScopeName>,
    pub on_store_error: Option<OnStoreError>,
    pub instances: Option<u64>,
    pub on_missing_key: Option<OnMissingKey>,
    pub on_invalid_token: Option<OnInvalidToken>,
    pub response: Option<RawLimitResponse>,
    pub limit_from: Option<RawLimitFrom>,
    /// A concurrency limit's waiting room.
    pub queue: Option<RawQueue>,
}

/// `queue: { max: 100, max_wait: 2s, fair_by: ip }`: a request a concurrency limit has no
/// slot for waits for one, in turn by flow.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawQueue {
    pub max: Option<u64>,
    pub max_wait: Option<String>,
    pub fair_by: Option<RawKey>,
    /// Its classes, highest first.
    pub classes: Option<Vec<RawQueueClass>>,
}

/// `{ name: gold, match: { claims: { tier: gold } } }`: a class of a queue's requests.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawQueueClass {
    #[serde(default)]
    #[schemars(!default)]
    pub name: String,
    #[serde(rename = "match")]
    pub matcher: Option<RawAllow>,
    /// The share of the slots handed on that it is sure of while it has requests waiting
    /// (`20%`).
    pub share: Option<String>,
}

/// `limit_from: { header: x-tenant-limit, min: 1, max: 1000 }`: each key may have its own
/// count, said by a trusted proxy's field (`header`) or the verified token (`jwt`), or set
/// by the operator (`PUT /overrides/NAME?...`), within `[min, max]`.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawLimitFrom {
    pub header: Option<String>,
    pub jwt: Option<String>,
    pub min: Option<RawAmount>,
    pub max: Option<RawAmount>,
}

/// `persist: { dir: /var/lib/sluicegate, interval: 1m }`.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawPersist {
    /// The state directory (relative: to the configuration file's directory).
    pub dir: Option<String>,
    /// How often the state is written (besides at shutdown).
    pub interval: Option<String>,
}

/// `concurrency: 50`, or `concurrency: adaptive`: a ceiling that learns, within
/// `adaptive:`'s bounds.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum RawConcurrency {
    Count(u64),
    Word(String),
}

/// `adaptive: { min: 4, max: 200, window: 500ms }`.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawAdaptive {
    pub min: Option<u64>,
    pub max: Option<u64>,
    pub window: Option<String>,
}

/// `window: 1m`, or a calendar window: `{ calendar: month, tz: Europe/Berlin, reset_day: 1 }`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum RawWindow {
    Length(String),
    Calendar(RawCalendarWindow),
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawCalendarWindow {
    /// `day`, `week` or `month`.
    #[serde(default)]
    #[schemars(!default)]
    pub calendar: String,
    /// An IANA time zone name (default `UTC`).
    pub tz: Option<String>,
    /// The month's day (1 to 28, default 1) or the week's (`monday` … `sunday`, default
    /// `monday`) the window starts on, at local midnight.
    pub reset_day: Option<RawResetDay>,
}

/// `limits.NAME.charge`: where the response reports what it cost (one of `header`,
/// `trailer`, `sse_json`, `json`), what is charged when it does not, and whether the report
/// replaces the request's cost.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawCharge {
    pub header: Option<RawReading>,
    pub trailer: Option<RawReading>,
    pub sse_json: Option<RawReading>,
    pub json: Option<RawReading>,
    pub default: Option<RawAmount>,
    pub instead_of_cost: Option<bool>,
    pub prices: Option<RawPrices>,
}

/// `limits.NAME.charge.prices`: what each place's count costs, by a part of the request
/// (`by: json:model`), per `per` units (a million by default); the row `"*"` prices any
/// other value.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawPrices {
    pub by: String,
    pub per: Option<u64>,
    pub table: BTreeMap<String, BTreeMap<String, RawAmount>>,
}

/// A whole number (`100`), or, on a limit that counts money, an amount of it (`50.00`).
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum RawAmount {
    Whole(u64),
    Decimal(f64),
}

/// Where a charge is read: one place (a field's name, a JSON path), or several, each with
/// the weight its count is multiplied by (`{ usage.prompt_tokens: 1, usage.completion_tokens: 4 }`).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum RawReading {
    One(String),
    /// Several places, each of weight 1 (with `prices`: the places the table prices).
    List(Vec<String>),
    Weighted(BTreeMap<String, u64>),
}

/// A day of the month (a number) or of the week (a name).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum RawResetDay {
    Number(i64),
    Name(String),
}

/// `limits.NAME.response`: the limit's own refusal.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawLimitResponse {
    pub status: Option<u16>,
    pub body: Option<String>,
    pub content_type: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

/// Where a limit keeps its state: in this process, or in Redis, shared by every instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ScopeName {
    Local,
    Global,
}

/// Requests matching `match` are decided by the limit named in `use` instead.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawOverride {
    #[serde(rename = "match", default)]
    #[schemars(!default)]
    pub matcher: RawAllow,
    #[serde(rename = "use", default)]
    #[schemars(!default)]
    pub target: String,
}

/// `algorithm:` of a limit (default: the nginx leaky bucket).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AlgorithmName {
    LeakyBucket,
    Gcra,
    TokenBucket,
    MinInterval,
    FixedWindow,
    SlidingWindow,
    SlidingLog,
}

/// Level of a limit's rejection lines; its delay lines go one level lower (like nginx
/// `limit_req_log_level`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
}

/// `key: ip` or `key: [ip, "header:x-api-key"]`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum RawKey {
    One(String),
    Many(Vec<String>),
}

/// The placeholder of a `key` left out.
impl Default for RawKey {
    fn default() -> Self {
        RawKey::Many(Vec::new())
    }
}

/// An entry of a route's `limits`: a limit's name, or `{ limit: NAME, burst: N, nodelay:
/// true | delay: N }`, the limit with the route's own burst and delay on its one state.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum RawLimitUse {
    Name(String),
    Tuned(RawTunedUse),
}

impl RawLimitUse {
    /// The limit's name.
    pub fn name(&self) -> &str {
        match self {
            RawLimitUse::Name(name) => name,
            RawLimitUse::Tuned(tuned) => &tuned.limit,
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawTunedUse {
    pub limit: String,
    pub burst: Option<u64>,
    pub nodelay: Option<bool>,
    pub delay: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawRoute {
    pub name: Option<String>,
    #[serde(rename = "match", default)]
    pub matcher: RawMatch,
    pub upstream: Option<String>,
    pub respond: Option<RawRespond>,
    #[serde(default)]
    pub limits: Vec<RawLimitUse>,
    pub allow: Option<RawAllow>,
    pub cost: Option<u64>,
    pub cost_header: Option<String>,
    pub strip_prefix: Option<bool>,
    pub rewrite: Option<RawRewrite>,
    #[serde(default)]
    pub set_request_headers: BTreeMap<String, String>,
    #[serde(default)]
    pub remove_request_headers: Vec<String>,
    #[serde(default)]
    pub set_response_headers: BTreeMap<String, String>,
    pub upstream_host: Option<String>,
    /// `1h`, `epoch` or `max` (nginx's `expires`).
    pub expires: Option<String>,
    pub max_body_bytes: Option<RawSize>,
    pub response_body_rate: Option<RawBodyRate>,
    pub upstream_hold: Option<RawUpstreamHold>,
    /// The class its requests wait in, in the queues of its limits that have it.
    pub priority: Option<String>,
}

/// `upstream_hold: true`, or `{ by: LIMIT | route, max: 1h, max_keys: 10000 }`: a key the
/// upstream refused (429/503 with a time to wait) is answered here until then.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum RawUpstreamHold {
    On(bool),
    Spec(RawUpstreamHoldSpec),
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawUpstreamHoldSpec {
    /// The name of one of the route's limits, whose key is held, or `route`.
    pub by: Option<String>,
    pub max: Option<String>,
    pub max_keys: Option<u64>,
}

/// `response_body_rate: { bytes_per_second: 100k, after: 1m }`: each response's body
/// paced (nginx's `limit_rate`, `limit_rate_after`).
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawBodyRate {
    #[serde(default)]
    #[schemars(!default)]
    pub bytes_per_second: RawSize,
    pub after: Option<RawSize>,
}

/// `rewrite: { prefix: /api/, to: / }`: the path sent upstream; with `match.path_regex`,
/// `rewrite: { to: /v2/$tenant }` (the whole path, with the pattern's named groups).
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawRewrite {
    pub prefix: Option<String>,
    #[serde(default)]
    #[schemars(!default)]
    pub to: String,
}

/// Requests exempt from limits: any matching entry is enough.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawAllow {
    #[serde(default)]
    pub cidrs: Vec<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub tokens: Vec<String>,
    /// Claims of the verified token and the values that match (`tier: [gold]`, `org.id: acme`).
    #[serde(default)]
    pub claims: BTreeMap<String, RawOneOrMany>,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawMatch {
    pub host: Option<String>,
    pub path_prefix: Option<String>,
    pub path: Option<String>,
    pub path_regex: Option<String>,
    pub methods: Option<Vec<String>>,
    /// `https`: requests that came in on a listener with `tls`; `http`: on one without.
    pub scheme: Option<RawScheme>,
    /// Fields of the JSON body and the values (one or several, `gpt-4o*` a prefix) each
    /// must have.
    pub json: Option<BTreeMap<String, RawOneOrMany>>,
}

/// A route's `match.scheme`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RawScheme {
    /// Requests on a listener without `tls`.
    Http,
    /// Requests on a listener with `tls`.
    Https,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawRespond {
    pub status: Option<u16>,
    pub body: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

/// `access_log:`: one line per request.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct RawAccessLog {
    #[serde(default)]
    pub format: AccessFormat,
    /// A file to append to; stderr when left out.
    pub path: Option<String>,
    /// Each line records the key parts of the limits its route evaluated (`keys`), which
    /// `simulate` replays limits keyed on headers, tokens and cookies from.
    #[serde(default)]
    pub keys: bool,
    /// The older place of the top-level `keys_secret`.
    pub keys_secret: Option<String>,
    /// The older place of the top-level `keys_secret_file`.
    pub keys_secret_file: Option<String>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AccessFormat {
    /// One JSON object per line.
    #[default]
    Json,
    /// nginx's `combined` format.
    Combined,
}

/// Which responses carry `RateLimit-Policy` / `RateLimit` headers.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum HeaderMode {
    None,
    /// Only 429s (and other rejections).
    #[default]
    Rejected,
    /// Rejections and every response of a route with limits.
    All,
}

/// Whether a limit is shown to clients in the rate-limit header fields of the responses
/// it decides (`ratelimit_headers` says which responses carry them).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LimitHeaders {
    /// Its items are in `RateLimit-Policy` and `RateLimit` (a quota to advertise).
    #[default]
    Shown,
    /// Never named in them, nor in a refusal's body: a refusal of its own says only
    /// `Retry-After` (a threshold against abuse, not to be probed).
    Hidden,
}

/// What a limit does with a request over it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LimitAction {
    /// Refuse it (its `status`, `Retry-After`).
    #[default]
    Refuse,
    /// Forward it, with `RateLimit-Exceeded: NAME` and the limit's `RateLimit` item for
    /// the upstream: a soft limit, which tells the backend instead of refusing the client.
    Annotate,
}

/// Which rate-limit header fields are sent.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum HeaderStyle {
    /// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers).
    #[default]
    Draft,
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset`.
    Legacy,
    Both,
}

/// Which forwarding fields go upstream, and which one names the client behind a
/// trusted proxy.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ForwardedMode {
    /// `X-Forwarded-For`, `-Proto`, `-Host`.
    #[default]
    XForwarded,
    /// `Forwarded` (RFC 7239).
    Rfc7239,
    /// Both sent; the client is read from `Forwarded` when a request has one.
    Both,
}

/// The body of a rejection.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RejectionBody {
    /// The status's reason phrase, as text.
    #[default]
    Text,
    /// `application/problem+json` (RFC 9457) naming the violated limits.
    ProblemJson,
}

/// How log lines show the keys of limits.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LogKeys {
    /// Key parts that carry credentials (`bearer`, cookies, `Authorization`, API-key and
    /// token headers and query parameters) as their keyed hash, the rest as sent.
    #[default]
    HashedSecrets,
    /// The whole key as its keyed hash.
    Hashed,
    /// Every part as sent: the operator opts in to credentials in the logs.
    Clear,
}

#[cfg(test)]
mod tests {
    /// serde would stop at the first unknown field; `fields` reports them all instead.
    #[test]
    fn serde_leaves_unknown_fields_to_fields() {
        assert!(!include_str!("raw.rs").contains(concat!("serde(", "deny_unknown_fields")));
    }

    /// Every field of the file has a row in the configuration reference, docs/configuration.md
    /// (found as a whole word in some row, which also catches the fields of
    /// `{cidrs, headers, tokens}`).
    #[test]
    fn every_field_is_in_the_configuration_reference() {
        let doc = include_str!("../../docs/configuration.md");
        let start = doc.find("## Configuration reference").expect("the reference section");
        let end = doc[start + 1..].find("\n## ").map_or(doc.len(), |i| start + 1 + i);
        let rows: Vec<&str> = doc[start..end].lines().filter(|l| l.starts_with("| `")).collect();
        let has_word = |row: &str, word: &str| {
            row.match_indices(word).any(|(i, _)| {
                let edge = |c: Option<char>| !c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
                edge(row[..i].chars().next_back()) && edge(row[i + word.len()..].chars().next())
            })
        };
        let mut rename = None;
        let mut missing = Vec::new();
        for line in include_str!("raw.rs").lines().map(str::trim) {
            if let Some(rest) = line.strip_prefix("#[serde(rename = \"") {
                rename = rest.split('"').next();
                continue;
            }
            let Some((field, _)) = line.strip_prefix("pub ").and_then(|l| l.split_once(": ")) else { continue };
            if field.contains(' ') {
                continue;
            }
            let name = rename.take().unwrap_or(field);
            if !rows.iter().any(|row| has_word(row, name)) {
                missing.push(name);
            }
        }
        assert!(missing.is_empty(), "fields missing from docs/configuration.md: {missing:?}");
    }
}
