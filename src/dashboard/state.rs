//! `GET /dashboard.json`: what the page shows, as of now. The instance and its
//! configuration; per route and per limit the seconds of history the page lacks (those
//! after its `since`); per limit its keys, bans and most refused keys; per upstream
//! server its health; Redis. Keys are shown as `log_keys` says (credentials hashed unless
//! `clear`), bans by the keyed hash they are kept by; per route the keys its upstream
//! refused and it holds (`upstream_hold`).

use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use super::history::{History, MAX_SHOWN};
use crate::admission::hold::HoldTable;
use crate::config::words::{LimitWords, RouteWords};
use crate::config::{Config, LimitId, RouteId};
use crate::limit::queue::QueueEnd;
use crate::policy::Policy;
use crate::proxy::Proxy;
use crate::running::{Reload, Running};
use crate::store::Reach;

/// Bans listed per limit (those with the most time left); the count says how many more.
const BANS_LISTED: usize = 20;
/// Keys listed among a limit's most refused of the last minute.
const REFUSED_LISTED: usize = 10;

/// The page's state; `since`: the last second of history the page has, if any.
pub fn state(running: &Running, history: &History, since: Option<u64>) -> Value {
    let proxy = running.proxy();
    let config = proxy.config();
    // All the history there is when the page has none, or has seconds of another run or
    // too old to follow on; else the seconds after its last.
    let kept = history.seconds() as u64;
    let missing = since.filter(|&s| s <= history.seq).map(|s| history.seq - s).filter(|&m| m <= kept);
    let seconds = missing.unwrap_or(kept) as usize;
    let history_of = |n: &str| (history.routes.get(n), history.limits.get(n));
    let routes: Vec<Value> = config
        .routes
        .iter_enumerated()
        .take(MAX_SHOWN)
        .map(|(i, route)| {
            let (h, _) = history_of(&route.name);
            let series = |pick: fn(&super::history::RouteHistory) -> &super::history::Series| {
                h.map_or_else(|| vec![0; seconds], |h| pick(h).last(seconds))
            };
            let latency = |q: f64| h.and_then(|h| h.latency(q));
            let mut shown = json!({
                "passed": series(|h| &h.passed),
                "delayed": series(|h| &h.delayed),
                "annotated": series(|h| &h.annotated),
                "refused": series(|h| &h.refused),
                "server_errors": series(|h| &h.server_errors),
                "latency": latency(0.5).zip(latency(0.99)).map(|((p50, responses), (p99, _))| json!({
                    "p50_ms": p50 * 1000.0, "p99_ms": p99 * 1000.0, "responses": responses,
                })),
                // Its gRPC calls since start, by the status they ended with.
                "grpc": proxy.metrics().grpc_counts(i).into_iter().map(|(s, n)| (s.to_owned(), Value::from(n))).collect::<serde_json::Map<_, _>>(),
            });
            with_words(&mut shown, &RouteWords::of(route, config));
            if let (Some(table), Some(shown)) = (proxy.holds().table(i), shown.as_object_mut()) {
                shown.insert("held".into(), held(&proxy, i, table));
            }
            shown
        })
        .collect();
    let limits: Vec<Value> = config.limits.keys().take(MAX_SHOWN).map(|i| limit(&proxy, history, i, seconds)).collect();
    json!({
        "seq": history.seq,
        "at_ms": history.at.map(unix_ms),
        "full": missing.is_none(),
        "seconds": seconds,
        "instance": instance(running, config),
        "routes": routes,
        "routes_left_out": config.routes.len().saturating_sub(MAX_SHOWN),
        "limits": limits,
        "limits_left_out": config.limits.len().saturating_sub(MAX_SHOWN),
        "upstreams": upstreams(&proxy),
        "redis": redis(&proxy, history),
        // What a live candidate changed since it was loaded (`GET /candidate`).
        "candidate": proxy.candidate().map(|c| serde_json::to_value(c.report(CANDIDATE_KEYS)).unwrap_or_default()),
    })
}

/// Keys the candidate's panel lists each way.
const CANDIDATE_KEYS: usize = 5;

/// The keys route `route` holds after its upstream refused them: how many, those with
/// the most time left, and the holds begun and requests answered from one since start.
fn held(proxy: &Proxy, route: RouteId, table: &HoldTable) -> Value {
    let now = proxy.gate().clock().now();
    let running = table.running(now);
    let (begun, answered) = proxy.metrics().hold_counts(route);
    let listed: Vec<Value> = (running.iter().take(BANS_LISTED))
        .map(|h| {
            let left = h.until.since(now);
            json!({ "key": &*h.key, "status": h.status.as_u16(), "left_ms": left.as_millis() as u64 })
        })
        .collect();
    json!({ "now": running.len(), "keys": listed, "begun": begun, "answered": answered })
}

/// Limit `index`: its words, its history, its keys and bans.
fn limit(proxy: &Proxy, history: &History, index: LimitId, seconds: usize) -> Value {
    let (config, limiters) = (proxy.config(), proxy.limiters());
    let limit = &config.limits[index];
    let h = history.limits.get(&limit.name);
    let series = |pick: fn(&super::history::LimitHistory) -> &super::history::Series| {
        h.map_or_else(|| vec![0; seconds], |h| pick(h).last(seconds))
    };
    let refused = h.map(|h| h.refused_most(REFUSED_LISTED)).unwrap_or_default();
    let mut bans = limiters.banned(index);
    bans.sort_by_key(|b| std::cmp::Reverse(b.left_ms));
    let banned = bans.len();
    let listed: Vec<Value> =
        bans.into_iter().take(BANS_LISTED).map(|b| json!({ "key": b.key, "left_ms": b.left_ms })).collect();
    let mut shown = json!({
        "keys": limiters.keys(index),
        "in_flight": limit.windows.iter().any(Policy::is_concurrency).then(|| limiters.in_flight(index)),
        // Its queue (`queue` is its settings): requests waiting now, and how waits
        // ended since start.
        "queued": limit.queue.as_ref().map(|_| {
            let ended = |end| limiters.queue_ended(index, None, end);
            let refused: u64 = [QueueEnd::Full, QueueEnd::TimedOut, QueueEnd::PushedOut].into_iter().map(ended).sum();
            json!({ "waiting": limiters.queued(index, None), "served": ended(QueueEnd::Served),
                    "refused": refused, "left": ended(QueueEnd::Left) })
        }),
        // An adaptive concurrency limit's ceiling now, and the latencies (ms) it moves by.
        "ceiling": limiters.ceiling(index).map(|c| c.read()),
        "evictions": limiters.evictions(index),
        "missing_key": limiters.missing(index),
        // Keys with a count of their own (`limit_from`): given by the operator, and the
        // requests decided with one, clamped, or whose field came from an untrusted peer.
        "own_counts": limiters.tenants(index).map(|t| {
            let n = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
            json!({ "given": t.given_keys(), "applied": n(&t.tally.applied), "clamped": n(&t.tally.clamped),
                    "untrusted": n(&t.tally.untrusted) })
        }),
        "passed": series(|h| &h.passed),
        "delayed": series(|h| &h.delayed),
        "rejected": series(|h| &h.rejected),
        "banned": banned,
        "bans": listed,
        "refused_most": refused.iter().map(|r| json!({ "key": r.label, "count": r.count })).collect::<Vec<_>>(),
    });
    let mut words = LimitWords::of(limit);
    // The table's bound as it stands: a reload keeps the one it was made with.
    words.max_keys = limiters.max_keys(index);
    with_words(&mut shown, &words);
    shown
}

/// `shown` (an object) with the fields of `words`, how `GET /config` describes the same
/// route or limit.
fn with_words(shown: &mut Value, words: &impl serde::Serialize) {
    if let (Some(shown), Ok(Value::Object(words))) = (shown.as_object_mut(), serde_json::to_value(words)) {
        shown.extend(words);
    }
}

/// The version, since when it runs, its file and its reloads.
fn instance(running: &Running, config: &Config) -> Value {
    let (last, last_failed) = running.reloads();
    let reload =
        |r: Option<Reload>| r.map(|r| json!({ "at_ms": unix_ms(r.at), "how": r.cause.as_str(), "errors": r.failure }));
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_s": running.started().elapsed().as_secs(),
        "file": running.source().map(|p| p.display().to_string()),
        "listen": config.listeners.iter().map(|l| l.address.to_string()).collect::<Vec<_>>(),
        "log_keys": config.log_keys,
        "last_reload": reload(last),
        "last_failed_reload": reload(last_failed),
    })
}

/// Each upstream's servers as of now.
fn upstreams(proxy: &Proxy) -> Vec<Value> {
    let now = Instant::now();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    proxy
        .config()
        .upstreams
        .iter()
        .zip(proxy.upstreams())
        .map(|(upstream, client)| {
            let pool = client.pool_report();
            let servers: Vec<Value> = client
                .servers()
                .report(now)
                .into_iter()
                .map(|s| {
                    let (idle, lent) = pool.get(&s.dialed).copied().unwrap_or_default();
                    json!({
                        "address": s.address,
                        "connections": { "idle": idle, "in_use": lent },
                        "out": s.out.map(|(why, since)| json!({ "why": why, "for_ms": ms(now.saturating_duration_since(since)) })),
                        "in_flight": s.in_flight,
                        "failures": s.failures,
                        "check_ms": s.check_took.map(ms),
                    })
                })
                .collect();
            json!({ "name": upstream.name, "servers": servers })
        })
        .collect()
}

/// Whether Redis answers, and what the store counted over the last minute; `null`
/// without global limits.
fn redis(proxy: &Proxy, history: &History) -> Value {
    let Some(store) = proxy.store() else { return Value::Null };
    let reach = store.reach();
    let (now, minute, seconds) =
        history.store().map_or_else(|| (store.counts(), Default::default(), 0), |(n, m, s)| (n.clone(), m, s));
    let looked_up = minute.near_hits + minute.calls;
    let [allow, deny, local] = minute.fallbacks;
    json!({
        "reach": match reach {
            Reach::Connecting => "connecting",
            Reach::Reachable => "reachable",
            Reach::Unreachable { .. } => "unreachable",
        },
        "unreachable": match reach {
            Reach::Unreachable { since, error, every, .. } => json!({
                "since_ms": since.0 / 1_000_000, "error": error, "probed_every_ms": every.as_millis() as u64,
            }),
            _ => Value::Null,
        },
        "breaker_open": now.breaker_open,
        "minute": {
            "seconds": seconds,
            "calls": minute.calls,
            "errors": minute.errors,
            "skipped": minute.skipped,
            "fallbacks": { "allow": allow, "deny": deny, "local": local },
            "near_cache_hits": minute.near_hits,
            "near_cache_hit_rate": (looked_up > 0).then(|| minute.near_hits as f64 / looked_up as f64),
        },
    })
}

fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
