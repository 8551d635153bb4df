//! The configuration in force, in the file's own words: what `GET /config` answers and
//! what the dashboard describes routes and limits with, from one typed view each
//! (`RouteWords`, `LimitWords`), so that the two never tell a route or a limit apart.
//! Values are written as the file writes them (`rate: 20r/s`, `nodelay: true`, `30s`,
//! `10m` bytes); settings left at their default are written too, so that the answer says
//! what is in force. Secrets (the admin token, Redis's credentials, `keys_secret`) are
//! never written.

use std::time::Duration;

use serde::Serialize;

use super::{Action, Balance, BodyPiece, Config, HoldBy, Limit, LogKeys, Route, Scope, Upstream, ValuePattern};
use crate::policy::calendar::{self, Period};
use crate::policy::charge::{Money, Reading};
use crate::policy::key::KeyPart;
use crate::policy::{Burst, Policy, Rate, Window};
use crate::router::PathMatch;

/// `GET /config`.
#[derive(Serialize)]
pub struct ConfigWords<'a> {
    pub listen: Vec<ListenerWords>,
    pub server: ServerWords,
    pub log_keys: LogKeys,
    pub upstreams: Vec<UpstreamWords<'a>>,
    pub routes: Vec<RouteWords<'a>>,
    pub limits: Vec<LimitWords<'a>>,
}

#[derive(Serialize)]
pub struct ListenerWords {
    pub address: String,
    pub tls: bool,
}

/// `server:`, every setting as in force (defaults included).
#[derive(Serialize)]
pub struct ServerWords {
    pub header_read_timeout: String,
    pub idle_timeout: String,
    pub send_timeout: String,
    pub body_read_timeout: String,
    pub body_peek: u64,
    pub shutdown_grace: String,
    pub max_connections: Option<usize>,
    pub max_connections_per_ip: Option<usize>,
    pub max_header_bytes: usize,
    pub max_uri_bytes: usize,
    pub workers: Option<usize>,
}

#[derive(Serialize)]
pub struct UpstreamWords<'a> {
    pub name: &'a str,
    pub servers: Vec<ServerAddressWords>,
    pub balance: String,
    pub connect_timeout: String,
    pub timeout: String,
    pub retries: u32,
    pub http2: bool,
    /// A number, or `as needed` (the default: kept as the load needs).
    pub keepalive: serde_json::Value,
    /// Requests in progress at each server, at most (`null`: no cap).
    pub max_conns: Option<usize>,
    pub queue_timeout: String,
}

#[derive(Serialize)]
pub struct ServerAddressWords {
    pub address: String,
    pub weight: u32,
    /// Its passive health: its own, or the upstream's as it inherited them.
    pub max_fails: u32,
    pub fail_timeout: String,
}

/// A route: its name, its `match`, where it goes and the limits it lists.
#[derive(Serialize)]
pub struct RouteWords<'a> {
    pub name: &'a str,
    #[serde(rename = "match")]
    pub matcher: MatchWords<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub respond: Option<RespondWords>,
    pub limits: Vec<LimitUseWords<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_body_bytes: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_hold: Option<HoldWords<'a>>,
    /// The class its requests wait in, in its limits' queues.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<&'a str>,
}

/// A route's `upstream_hold`: whose key it holds (a limit's name, or `route`), for how
/// long at most, and how many keys at once.
#[derive(Serialize)]
pub struct HoldWords<'a> {
    pub by: &'a str,
    pub max: String,
    pub max_keys: usize,
}

/// An entry of a route's `limits`: the limit's name, or the limit with the route's own
/// burst and delay, as the file writes them.
#[derive(Serialize)]
#[serde(untagged)]
pub enum LimitUseWords<'a> {
    Name(&'a str),
    Tuned {
        limit: &'a str,
        burst: u64,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        nodelay: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        delay: Option<u64>,
    },
}

#[derive(Serialize)]
pub struct MatchWords<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_regex: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<&'a str>,
    /// Fields of the body and the values each may have (`gpt-4o*`: any beginning so).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub json: Option<std::collections::BTreeMap<String, Vec<String>>>,
}

#[derive(Serialize)]
pub struct RespondWords {
    pub status: u16,
}

/// A limit: its name, key, scope and windows.
#[derive(Serialize)]
pub struct LimitWords<'a> {
    pub name: &'a str,
    /// Its key's parts (`ip`, `header:x-api-key`).
    pub key: Vec<String>,
    pub scope: &'static str,
    pub windows: Vec<PolicyWords>,
    pub dry_run: bool,
    /// Whether clients see it in the rate-limit header fields.
    pub headers: crate::config::LimitHeaders,
    /// What it does with a request over it: `refuse` or `annotate`.
    pub action: crate::config::LimitAction,
    /// The share of its capacity from which a request it admits is forwarded annotated
    /// (`80%`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub annotate_from: Option<String>,
    /// Its state kept in the state directory across restarts.
    pub persist: bool,
    pub ban: Option<String>,
    pub max_keys: usize,
    /// The status of its refusals, and a refused gRPC call's `grpc-status`.
    pub status: u16,
    pub grpc_status: &'static str,
    pub on_missing_key: crate::policy::OnMissingKey,
    /// Its own refusal, if it gives one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response: Option<ResponseWords>,
    /// The currency a money budget counts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub money: Option<&'a str>,
    /// What a response reports it cost, debited after it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub charge: Option<ChargeWords>,
    /// Where a key's own count may come from, and its bounds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit_from: Option<LimitFromWords>,
    /// A concurrency limit's queue.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueWords>,
}

/// `queue:` as the file writes it, defaults included.
#[derive(Serialize)]
pub struct QueueWords {
    pub max: usize,
    pub max_wait: String,
    pub fair_by: Vec<String>,
    /// Its classes, highest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<ClassWords>,
}

/// A queue's class: its name, and its share if it has one (its `match` is not written).
#[derive(Serialize)]
pub struct ClassWords {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub share: Option<String>,
}

/// `limit_from:` as the file writes it: its source (`header` or `jwt`, or neither: only
/// the operator's counts), and the bounds (amounts on a money budget).
#[derive(Serialize)]
pub struct LimitFromWords {
    #[serde(flatten)]
    pub source: std::collections::BTreeMap<&'static str, String>,
    pub min: Amount,
    pub max: Amount,
}

/// `charge:` of a limit, as the file writes it: where the report is read (`header`,
/// `trailer`, `sse_json` or `json` and its name or path), the default, and whether the report
/// replaces the request's cost.
#[derive(Serialize)]
pub struct ChargeWords {
    #[serde(flatten)]
    pub reading: std::collections::BTreeMap<&'static str, String>,
    pub default: Amount,
    pub instead_of_cost: bool,
    /// A money budget's price table: what it goes by, per how many units, and each
    /// value's price of each place (`*`: any other value).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prices: Option<PricesWords>,
}

/// `charge.prices` as the file writes it.
#[derive(Serialize)]
pub struct PricesWords {
    pub by: String,
    pub per: u64,
    pub table: std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
}

/// `response:` of a limit: its body as written (with `{limit}` and `{retry_after}`), its
/// content type and fields.
#[derive(Serialize)]
pub struct ResponseWords {
    pub body: String,
    pub content_type: String,
    pub headers: std::collections::BTreeMap<String, String>,
}

/// A limit's count, or a money budget's amount (`"50.00"`).
#[derive(Serialize)]
#[serde(untagged)]
pub enum Amount {
    Count(u64),
    Money(String),
}

/// One window of a limit, in the words of its algorithm.
#[derive(Serialize)]
#[serde(untagged)]
pub enum PolicyWords {
    Rate {
        rate: String,
        burst: u64,
        /// `nodelay: true`: every request within `burst` passes at once.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        nodelay: bool,
        /// `delay: N` (left out for 0, the default, and for `nodelay`).
        #[serde(skip_serializing_if = "Option::is_none")]
        delay: Option<u64>,
    },
    Window {
        algorithm: &'static str,
        limit: Amount,
        window: WindowWords,
    },
    Concurrency {
        concurrency: ConcurrencyWords,
        retry_after: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        adaptive: Option<AdaptiveWords>,
    },
}

/// `concurrency: 50`, or `concurrency: adaptive`.
#[derive(Serialize)]
#[serde(untagged)]
pub enum ConcurrencyWords {
    Count(u64),
    Word(&'static str),
}

/// `adaptive:` as the file writes it, defaults included.
#[derive(Serialize)]
pub struct AdaptiveWords {
    pub min: u64,
    pub max: u64,
    pub window: String,
}

/// A window: its length (`1m`), or `{ calendar: month, tz: Europe/Berlin, reset_day: 1 }`.
#[derive(Serialize)]
#[serde(untagged)]
pub enum WindowWords {
    Length(String),
    Calendar {
        calendar: &'static str,
        tz: String,
        /// The month's day (1 to 28), or the week's day (`monday` … `sunday`).
        #[serde(skip_serializing_if = "Option::is_none")]
        reset_day: Option<ResetDayWords>,
    },
}

#[derive(Serialize)]
#[serde(untagged)]
pub enum ResetDayWords {
    OfMonth(u8),
    OfWeek(&'static str),
}

impl WindowWords {
    fn of(window: &Window) -> Self {
        match window {
            Window::Every(length) => WindowWords::Length(span(*length)),
            Window::Calendar(calendar) => WindowWords::Calendar {
                calendar: calendar.unit(),
                tz: calendar.tz_name().to_owned(),
                reset_day: match calendar.period {
                    Period::Day => None,
                    Period::Week(weekday) => Some(ResetDayWords::OfWeek(calendar::weekday_name(weekday))),
                    Period::Month(day) => Some(ResetDayWords::OfMonth(day)),
                },
            },
        }
    }
}

impl<'a> ConfigWords<'a> {
    pub fn of(config: &'a Config) -> Self {
        ConfigWords {
            listen: config
                .listeners
                .iter()
                .map(|l| ListenerWords { address: l.address.to_string(), tls: l.tls.is_some() })
                .collect(),
            server: ServerWords {
                header_read_timeout: span(config.server.header_read_timeout),
                idle_timeout: span(config.server.idle_timeout),
                send_timeout: span(config.server.send_timeout),
                body_read_timeout: span(config.server.body_read_timeout),
                body_peek: config.server.body_peek,
                shutdown_grace: span(config.server.shutdown_grace),
                max_connections: config.server.max_connections,
                max_connections_per_ip: config.server.max_connections_per_ip,
                max_header_bytes: config.server.max_header_bytes,
                max_uri_bytes: config.server.max_uri_bytes,
                workers: config.server.workers,
            },
            log_keys: config.log_keys,
            upstreams: config.upstreams.iter().map(UpstreamWords::of).collect(),
            routes: config.routes.iter().map(|r| RouteWords::of(r, config)).collect(),
            limits: config.limits.iter().map(LimitWords::of).collect(),
        }
    }
}

impl<'a> UpstreamWords<'a> {
    fn of(u: &'a Upstream) -> Self {
        UpstreamWords {
            name: &u.name,
            servers: u
                .servers
                .iter()
                .map(|s| ServerAddressWords {
                    address: format!("{}{}", if s.tls { "https://" } else { "" }, s.address),
                    weight: s.weight,
                    max_fails: s.max_fails,
                    fail_timeout: span(s.fail_timeout),
                })
                .collect(),
            balance: match &u.balance {
                Balance::RoundRobin => "round_robin".to_owned(),
                Balance::LeastConn => "least_conn".to_owned(),
                Balance::RandomTwo => "random_two".to_owned(),
                Balance::Hash(key) => {
                    format!("hash ({})", key.0.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))
                }
            },
            connect_timeout: span(u.connect_timeout),
            timeout: span(u.timeout),
            retries: u.retries,
            http2: u.http2,
            keepalive: u.keepalive.map_or_else(|| "as needed".into(), Into::into),
            max_conns: u.max_conns.map(std::num::NonZeroUsize::get),
            queue_timeout: span(u.queue_timeout),
        }
    }
}

impl<'a> RouteWords<'a> {
    pub fn of(route: &'a Route, config: &'a Config) -> Self {
        let m = &route.matcher;
        let (mut path_prefix, mut path, mut path_regex) = (None, None, None);
        match &m.path {
            PathMatch::Any => {}
            PathMatch::Prefix(p) => path_prefix = Some(p.as_str()),
            PathMatch::Exact(p) => path = Some(p.as_str()),
            PathMatch::Regex(r) => path_regex = Some(r.pattern()),
        }
        let (upstream, respond) = match &route.action {
            Action::Forward(u) => (Some(config.upstreams[*u].name.as_str()), None),
            Action::Respond(answer) => (None, Some(RespondWords { status: answer.status.as_u16() })),
        };
        RouteWords {
            name: &route.name,
            matcher: MatchWords {
                host: m.host.as_deref(),
                path_prefix,
                path,
                path_regex,
                methods: m.methods.iter().map(http::Method::as_str).collect(),
                json: route.body_match.as_ref().map(|b| {
                    let value = |p: &ValuePattern| match p {
                        ValuePattern::Exact(text) => String::from_utf8_lossy(text).into_owned(),
                        ValuePattern::Prefix(start) => format!("{}*", String::from_utf8_lossy(start)),
                    };
                    b.0.iter().map(|(path, values)| (path.to_string(), values.iter().map(value).collect())).collect()
                }),
            },
            upstream,
            respond,
            limits: (route.listed.iter())
                .filter_map(|&listed| route.limits.iter().find(|u| u.limit == listed))
                .map(|u| {
                    let limit = config.limits[u.limit].name.as_str();
                    match u.burst {
                        None => LimitUseWords::Name(limit),
                        Some(Burst { burst, delay }) => {
                            let (nodelay, delay) = delay_words(burst, delay);
                            LimitUseWords::Tuned { limit, burst, nodelay, delay }
                        }
                    }
                })
                .collect(),
            max_body_bytes: route.max_body_bytes.map(size),
            priority: route.priority.as_deref(),
            upstream_hold: route.upstream_hold.as_ref().map(|h| HoldWords {
                by: match h.by {
                    HoldBy::Limit(limit) => &config.limits[limit].name,
                    HoldBy::Route => "route",
                },
                max: span(h.max),
                max_keys: h.max_keys,
            }),
        }
    }
}

impl<'a> LimitWords<'a> {
    pub fn of(limit: &'a Limit) -> Self {
        LimitWords {
            name: &limit.name,
            key: limit.key.0.iter().map(ToString::to_string).collect(),
            scope: if matches!(limit.scope, Scope::Global { .. }) { "global" } else { "local" },
            windows: limit.windows.iter().map(|w| PolicyWords::of(w, limit.money.is_some())).collect(),
            money: limit.money.as_ref().map(|m| &*m.currency),
            limit_from: limit.tenant.as_ref().map(|t| LimitFromWords {
                source: (t.source.iter())
                    .filter_map(|part| match part {
                        KeyPart::Header(name) => Some(("header", name.to_string())),
                        KeyPart::Jwt(claim) => Some(("jwt", claim.to_string())),
                        _ => None,
                    })
                    .collect(),
                min: Amount::of(t.min, t.money),
                max: Amount::of(t.max, t.money),
            }),
            queue: limit.queue.as_ref().map(|q| QueueWords {
                max: q.max,
                max_wait: span(q.max_wait),
                fair_by: q.fair_by.0.iter().map(ToString::to_string).collect(),
                classes: (q.classes.iter())
                    .map(|c| ClassWords { name: c.name.clone(), share: (c.share > 0).then(|| format!("{}%", c.share)) })
                    .collect(),
            }),
            dry_run: limit.dry_run,
            headers: limit.headers,
            action: limit.action,
            annotate_from: limit.annotate_from.map(|p| format!("{p}%")),
            persist: limit.persist,
            ban: limit.ban.map(|b| span(b.base)),
            max_keys: limit.max_keys,
            status: limit.status.as_u16(),
            grpc_status: limit.grpc_status.name(),
            on_missing_key: limit.on_missing_key,
            response: limit.response.as_ref().map(|r| ResponseWords {
                body: (r.body.iter())
                    .map(|piece| match piece {
                        BodyPiece::Text(text) => text.as_str(),
                        BodyPiece::Limit => "{limit}",
                        BodyPiece::RetryAfter => "{retry_after}",
                    })
                    .collect(),
                content_type: String::from_utf8_lossy(r.content_type.as_bytes()).into_owned(),
                headers: (r.headers.iter())
                    .map(|(n, v)| (n.to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
                    .collect(),
            }),
            charge: limit.charge.as_ref().map(|c| {
                // One place as the file names it; several as `a*1 + b*4`.
                fn places<T: std::fmt::Display>(places: &[(T, u64)]) -> String {
                    match places {
                        [(place, 1)] => place.to_string(),
                        _ => places
                            .iter()
                            .map(|(place, weight)| format!("{place}*{weight}"))
                            .collect::<Vec<_>>()
                            .join(" + "),
                    }
                }
                let (field, value) = match &c.reading {
                    Reading::Header(names) => ("header", places(names)),
                    Reading::Trailer(names) => ("trailer", places(names)),
                    Reading::SseJson(paths) => ("sse_json", places(paths)),
                    Reading::Json(paths) => ("json", places(paths)),
                };
                let money = limit.money.is_some();
                let prices = c.prices.as_ref().map(|p| {
                    let places = c.reading.places();
                    let row =
                        |prices: &[u64]| places.iter().cloned().zip(prices.iter().map(|&m| Money::amount(m))).collect();
                    let mut table: std::collections::BTreeMap<_, _> = p
                        .rows
                        .iter()
                        .map(|(value, prices)| (String::from_utf8_lossy(value).into_owned(), row(prices)))
                        .collect();
                    table.insert("*".to_owned(), row(&p.other));
                    PricesWords { by: p.by.to_string(), per: p.per, table }
                });
                ChargeWords {
                    reading: [(field, value)].into(),
                    default: Amount::of(c.default, money),
                    instead_of_cost: c.instead_of_cost,
                    prices,
                }
            }),
        }
    }
}

/// `nodelay` and `delay` as the file writes them for `delay` excess requests out of
/// `burst` passing at once: `nodelay: true` for all of them, `delay: N` for some, neither
/// for none (the default).
fn delay_words(burst: u64, delay: u64) -> (bool, Option<u64>) {
    (burst > 0 && delay >= burst, (delay > 0 && delay < burst).then_some(delay))
}

impl Amount {
    /// `n`, or, of a money budget (`money`), `n` micro-units as an amount.
    fn of(n: u64, money: bool) -> Amount {
        if money { Amount::Money(Money::amount(n)) } else { Amount::Count(n) }
    }
}

impl PolicyWords {
    /// `policy`'s words (`money`: a money budget's, its limit an amount).
    pub fn of(policy: &Policy, money: bool) -> Self {
        let windowed = |algorithm, limit, window: Duration| PolicyWords::Window {
            algorithm,
            limit: Amount::Count(limit),
            window: WindowWords::Length(span(window)),
        };
        match policy {
            &Policy::Rate { rate, burst, delay } => {
                let (nodelay, delay) = delay_words(burst, delay);
                PolicyWords::Rate { rate: rate_words(rate), burst, nodelay, delay }
            }
            Policy::FixedWindow { limit, window } => {
                let limit = Amount::of(*limit, money);
                PolicyWords::Window { algorithm: "fixed_window", limit, window: WindowWords::of(window) }
            }
            &Policy::SlidingWindow { limit, window } => windowed("sliding_window", limit, window),
            &Policy::SlidingLog { limit, window } => windowed("sliding_log", limit, window),
            &Policy::Concurrency { max, retry_after, adaptive } => PolicyWords::Concurrency {
                concurrency: match adaptive {
                    Some(_) => ConcurrencyWords::Word("adaptive"),
                    None => ConcurrencyWords::Count(max),
                },
                retry_after: span(retry_after),
                adaptive: adaptive.map(|a| AdaptiveWords { min: a.min, max, window: span(a.window) }),
            },
        }
    }
}

/// A rate as the file writes it: `20r/s`, `600r/m`, `100r/15m`.
fn rate_words(rate: Rate) -> String {
    let per = span(rate.per);
    // One of a unit is written as the bare unit: `r/s`, not `r/1s`.
    let per = match per.strip_prefix('1') {
        Some(unit) if unit.chars().all(|c| c.is_ascii_alphabetic()) => unit.to_owned(),
        _ => per,
    };
    format!("{}r/{per}", rate.count)
}

/// A duration as the file writes it: `30s`, `1m 30s`, `250ms`.
fn span(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// A size as the file writes it: `10m`, `512k`, or bytes.
fn size(bytes: u64) -> String {
    match bytes {
        0 => "0".to_owned(),
        n if n % (1 << 30) == 0 => format!("{}g", n >> 30),
        n if n % (1 << 20) == 0 => format!("{}m", n >> 20),
        n if n % (1 << 10) == 0 => format!("{}k", n >> 10),
        n => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RouteId;

    #[test]
    fn the_configuration_is_written_in_the_files_words() {
        let yaml = "listen: 127.0.0.1:0
server: { idle_timeout: 90s, max_header_bytes: 16384 }
upstreams: { api: { servers: [127.0.0.1:1], http2: true } }
limits:
  per_ip: { key: ip, rate: 20r/s, burst: 40, nodelay: true }
  half: { key: [ip, \"header:x-key\"], rate: 600r/m, burst: 10, delay: 4 }
  slow: { key: ip, rate: 100r/15m }
routes:
  - { match: { path_prefix: /api }, upstream: api, limits: [per_ip, half, slow], max_body_bytes: 10m }
";
        let config = crate::config::parse(yaml, "t").unwrap();
        let words = serde_json::to_value(ConfigWords::of(&config)).unwrap();
        let windows: Vec<&serde_json::Value> =
            words["limits"].as_array().unwrap().iter().map(|l| &l["windows"][0]).collect();
        assert_eq!(*windows[0], serde_json::json!({ "rate": "600r/m", "burst": 10, "delay": 4 }));
        assert_eq!(*windows[1], serde_json::json!({ "rate": "20r/s", "burst": 40, "nodelay": true }));
        assert_eq!(*windows[2], serde_json::json!({ "rate": "100r/15m", "burst": 0 }));
        assert_eq!(words["limits"][0]["key"], serde_json::json!(["ip", "header:x-key"]));
        assert_eq!(words["server"]["idle_timeout"], "1m 30s");
        assert_eq!(words["server"]["max_header_bytes"], 16384);
        assert_eq!(words["upstreams"][0]["http2"], true);
        assert_eq!(words["routes"][0]["match"], serde_json::json!({ "path_prefix": "/api" }));
        assert_eq!(words["routes"][0]["max_body_bytes"], "10m");
        // What it writes, the file reads back to the same.
        let rate = crate::config::units::parse_rate(windows[2]["rate"].as_str().unwrap()).unwrap();
        assert_eq!(rate.per, Duration::from_secs(900));
    }

    #[test]
    fn a_routes_own_burst_is_written_as_the_file_gives_it_and_reads_back_the_same() {
        let limits = "[per_ip, { limit: half, burst: 3, nodelay: true }, { limit: slow, burst: 5, delay: 2 }, \
                      { limit: other, burst: 4 }]";
        let yaml = format!(
            "listen: 127.0.0.1:0
limits:
  per_ip: {{ key: ip, rate: 20r/s }}
  half: {{ key: ip, rate: 600r/m }}
  slow: {{ key: ip, rate: 1r/s }}
  other: {{ key: ip, rate: 1r/s }}
routes:
  - {{ limits: {limits}, respond: {{ status: 200 }} }}
"
        );
        let config = crate::config::parse(&yaml, "t").unwrap();
        let words = serde_json::to_value(ConfigWords::of(&config)).unwrap();
        // In the file's order (requests take their locks in the order of the names).
        let written = serde_json::json!([
            "per_ip",
            { "limit": "half", "burst": 3, "nodelay": true },
            { "limit": "slow", "burst": 5, "delay": 2 },
            { "limit": "other", "burst": 4 },
        ]);
        assert_eq!(words["routes"][0]["limits"], written);
        let again = yaml.replace(limits, &written.to_string());
        assert_eq!(
            crate::config::parse(&again, "t").unwrap().routes[RouteId::from(0)].limits,
            config.routes[RouteId::from(0)].limits
        );
    }
}
