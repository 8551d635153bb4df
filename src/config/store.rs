//! The `redis:` section, and what a limit's `scope: global` asks of it and of its policy.

use std::time::Duration;

use redis::IntoConnectionInfo;

use super::checks::Errors;
use super::raw::{OnStoreError, RawLimit, RawRedis, RawSentinel, ScopeName};
use super::{Limit, Policy, Redis, Scope, Sentinel};

const DEFAULT_TIMEOUT: Duration = Duration::from_millis(20);
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const DEFAULT_BREAKER_FAILURES: u32 = 5;
const DEFAULT_BREAKER_WINDOW: Duration = Duration::from_millis(200);
const DEFAULT_BREAKER_COOLDOWN: Duration = Duration::from_secs(1);
const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);
const DEFAULT_NEAR_CACHE_KEYS: u64 = 100_000;
pub const DEFAULT_KEY_PREFIX: &str = "sluicegate:";
const DEFAULT_SENTINEL_CHECK: Duration = Duration::from_secs(5);

/// Global scripts compute in Lua numbers (doubles), exact up to 2^53; spans of time up to
/// 2^52 ns (52 days) and products of counts and microseconds up to 2^52 leave room.
const EXACT: u128 = 1 << 52;

pub(super) fn redis(e: &mut Errors<'_>, raw: &RawRedis) -> Redis {
    let sentinel = raw.sentinel.as_ref().map(|s| sentinel(e, raw, s));
    if sentinel.is_none()
        && let Err(err) = raw.url.as_str().into_connection_info()
    {
        let message = match raw.url.is_empty() {
            true => "required: the Redis server's URL (or `sentinel:` to find it)".to_owned(),
            false => format!("invalid Redis URL {:?}: {err}", raw.url),
        };
        e.add("redis.url".into(), message);
    }
    let connections = raw.connections.unwrap_or(1);
    if !(1..=64).contains(&connections) {
        e.add("redis.connections".into(), "must be from 1 to 64");
    }
    if raw.breaker_failures == Some(0) {
        e.add("redis.breaker_failures".into(), "must be a positive integer");
    }
    let key_prefix = raw.key_prefix.clone().unwrap_or_else(|| DEFAULT_KEY_PREFIX.to_owned());
    if key_prefix.contains(['{', '}']) {
        e.add("redis.key_prefix".into(), "must not contain '{' or '}': sluicegate places the cluster hash tag itself");
    }
    let lease_ttl = e.positive("redis.lease_ttl", raw.lease_ttl.as_ref(), DEFAULT_LEASE_TTL);
    if lease_ttl < Duration::from_millis(300) {
        e.add("redis.lease_ttl".into(), "must be at least 300ms (leases are renewed every third of it)");
    }
    let tls_ca = raw.tls_ca_file.as_ref().and_then(|file| {
        if !raw.url.starts_with("rediss://") && raw.sentinel.is_none() {
            e.add("redis.tls_ca_file".into(), "applies only to TLS URLs (`rediss://`)");
        }
        e.check(|| "redis.tls_ca_file".into(), super::files::read_regular(file))
    });
    Redis {
        url: raw.url.clone(),
        cluster: raw.cluster,
        sentinel,
        username: super::secrets::secret(e, "redis.username", raw.username.as_deref(), None),
        password: super::secrets::secret(e, "redis.password", raw.password.as_deref(), raw.password_file.as_deref()),
        tls_ca,
        timeout: e.positive("redis.timeout", raw.timeout.as_ref(), DEFAULT_TIMEOUT),
        connect_timeout: e.positive("redis.connect_timeout", raw.connect_timeout.as_ref(), DEFAULT_CONNECT_TIMEOUT),
        connections: usize::try_from(connections.clamp(1, 64)).unwrap_or(1),
        key_prefix,
        breaker_failures: raw.breaker_failures.unwrap_or(DEFAULT_BREAKER_FAILURES).max(1),
        // Zero is allowed: the breaker then counts failures in a row only.
        breaker_window: e.duration("redis.breaker_window", raw.breaker_window.as_ref(), DEFAULT_BREAKER_WINDOW),
        breaker_cooldown: e.positive("redis.breaker_cooldown", raw.breaker_cooldown.as_ref(), DEFAULT_BREAKER_COOLDOWN),
        lease_ttl,
        near_cache_keys: usize::try_from(raw.near_cache_keys.unwrap_or(DEFAULT_NEAR_CACHE_KEYS)).unwrap_or(usize::MAX),
    }
}

/// `redis.sentinel`, and what it excludes: a URL, a cluster, TLS (not supported with
/// sentinels yet).
fn sentinel(e: &mut Errors<'_>, raw: &RawRedis, s: &RawSentinel) -> Sentinel {
    let at = "redis.sentinel";
    for (field, given, why) in [
        ("url", !raw.url.is_empty(), "give either `url` or `sentinel`: with `sentinel` the sentinels name the master"),
        ("cluster", raw.cluster, "a Redis Cluster fails over by itself: give either `cluster` or `sentinel`"),
        ("tls_ca_file", raw.tls_ca_file.is_some(), "TLS is not supported with `sentinel`"),
    ] {
        if given {
            e.add(format!("redis.{field}"), why);
        }
    }
    if s.master.is_empty() {
        e.add(format!("{at}.master"), "must name the master the sentinels monitor");
    }
    if s.nodes.is_empty() {
        e.add(format!("{at}.nodes"), "must list at least one sentinel (`host:port`)");
    }
    let nodes = (s.nodes.iter().enumerate())
        .filter_map(|(i, node)| e.check(|| format!("{at}.nodes[{i}]"), sentinel_node(node)))
        .collect();
    Sentinel {
        master: s.master.clone(),
        nodes,
        password: super::secrets::secret(
            e,
            "redis.sentinel.password",
            s.password.as_deref(),
            s.password_file.as_deref(),
        ),
        check_interval: e.positive("redis.sentinel.check_interval", s.check_interval.as_ref(), DEFAULT_SENTINEL_CHECK),
    }
}

/// A sentinel's `host:port` as the URL the client takes.
fn sentinel_node(node: &str) -> Result<String, String> {
    let port = node.rsplit_once(':').map(|(host, port)| (host, port.parse::<u16>()));
    match port {
        Some((host, Ok(port))) if !host.is_empty() && port > 0 => {
            let url = format!("redis://{node}");
            url.as_str().into_connection_info().map_err(|err| format!("invalid sentinel address {node:?}: {err}"))?;
            Ok(url)
        }
        _ => Err(format!("{node:?} is not `host:port` (a sentinel's address, e.g. 10.0.0.1:26379)")),
    }
}

/// Global limits need the `redis:` section.
pub(super) fn require_redis(e: &mut Errors<'_>, limits: &[Limit]) {
    for limit in limits.iter().filter(|l| matches!(l.scope, Scope::Global { .. })) {
        e.add(
            format!("limits.{}.scope", limit.name),
            "a global limit needs a `redis:` section (e.g. redis: { url: \"redis://127.0.0.1:6379\" })",
        );
    }
}

/// The limit's `scope`, `on_store_error` and `instances`, and whether its policy fits the
/// exact arithmetic of the global scripts.
pub(super) fn scope(e: &mut Errors<'_>, at: &str, raw: &RawLimit, windows: &[Policy]) -> Scope {
    if raw.scope != Some(ScopeName::Global) {
        for (field, given) in [("on_store_error", raw.on_store_error.is_some()), ("instances", raw.instances.is_some())]
        {
            if given {
                e.add(format!("{at}.{field}"), "applies only to global limits (`scope: global`)");
            }
        }
        return Scope::Local;
    }
    let on_store_error = raw.on_store_error.unwrap_or(OnStoreError::Local);
    match raw.instances {
        Some(0) => e.add(format!("{at}.instances"), "must be a positive integer"),
        Some(_) if on_store_error != OnStoreError::Local => {
            e.add(format!("{at}.instances"), "applies only with `on_store_error: local`")
        }
        _ => {}
    }
    for policy in windows {
        if let Err(message) = fits_globally(policy) {
            e.add(at.to_owned(), message);
        }
    }
    Scope::Global { on_store_error, instances: raw.instances.unwrap_or(1).max(1) }
}

fn fits_globally(policy: &Policy) -> Result<(), String> {
    let ns = |d: Duration| d.as_nanos();
    match *policy {
        Policy::Rate { rate, burst, .. } if u128::from(rate.period_ns()) * u128::from(burst + 1) > EXACT => {
            return Err("a global rate limit must drain within 52 days (burst + 1 periods)".into());
        }
        Policy::SlidingWindow { limit, window } if u128::from(limit) * window.as_micros() > EXACT => {
            return Err("a global sliding window allows limit × window (in µs) up to 2^52: lower one of them".into());
        }
        Policy::SlidingLog { window, .. } if ns(window) > EXACT => {
            return Err("a global sliding log's window must be at most 52 days".into());
        }
        _ => {}
    }
    Ok(())
}
