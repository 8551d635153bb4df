//! Calendar windows (`window: { calendar: day, tz: … }`) through the real binary, locally
//! and with a real Redis: a refusal's `Retry-After` is the time to the next local
//! midnight, computed here from the wall clock; and in this process, the Redis script
//! and the local limiter decide schedules across daylight-saving changes and month ends
//! alike, and instances whose clocks are a day apart count in the window Redis is in.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use http::HeaderMap;
use jiff::Timestamp;
use jiff::tz::TimeZone;
use sluicegate::clock::{Clock, ManualClock, Nanos};
use sluicegate::config::{LimitId, LimitUse, parse};
use sluicegate::gate::{Decision, Gate};
use sluicegate::limit::{Outcome, Standing};
use sluicegate::policy::key::{KeyHash, KeySource};
use sluicegate::store::{Call, RedisTime};

use crate::common::*;
use crate::redis::Redis;

/// A zone whose next midnight is at least ten minutes away and whose last is at least a
/// minute ago, so that a run near midnight does not cross it: Berlin, else Tokyo.
fn zone() -> &'static str {
    ["Europe/Berlin", "Asia/Tokyo"]
        .into_iter()
        .find(|name| {
            let now = Timestamp::now().to_zoned_datetime(TimeZone::get(name).unwrap());
            let midnight = now.start_of_day().unwrap();
            let since = now.timestamp().as_second() - midnight.timestamp().as_second();
            since > 60 && seconds_to_midnight(name) > 600
        })
        .expect("Berlin and Tokyo are not both near midnight")
}

/// Seconds from now to the next local midnight in `zone`, by the wall clock.
fn seconds_to_midnight(zone: &str) -> i64 {
    let now = Timestamp::now().to_zoned_datetime(TimeZone::get(zone).unwrap());
    let next = now.date().tomorrow().unwrap().to_zoned_datetime(TimeZone::get(zone).unwrap()).unwrap();
    next.timestamp().as_second() - now.timestamp().as_second()
}

/// Sends `limit` requests through `addrs` in turn (all admitted), then one more, refused
/// with `Retry-After` (and `RateLimit`'s `t`) within a second of the next local midnight.
async fn refused_until_midnight(addrs: &[std::net::SocketAddr], limit: usize, zone: &str) {
    for n in 0..limit {
        let reply = get(addrs[n % addrs.len()], "/", &[]).await;
        assert_eq!(reply.status, 200, "request {n}");
    }
    let before = seconds_to_midnight(zone);
    let refused = get(addrs[limit % addrs.len()], "/", &[]).await;
    let after = seconds_to_midnight(zone);
    assert_eq!(refused.status, 429);
    let retry: i64 = refused.header("retry-after").unwrap().parse().unwrap();
    // Rounded up from the instant the proxy decided, between `before` and `after`.
    assert!((after - 1..=before + 1).contains(&retry), "Retry-After {retry}, midnight in {after}..{before} s");
    assert_eq!(refused.header("ratelimit"), Some(format!("\"daily\";r=0;t={retry}").as_str()));
    assert_eq!(refused.header("ratelimit-policy"), Some(format!("\"daily\";q={limit}").as_str()));
}

#[tokio::test]
async fn a_calendar_day_refuses_until_local_midnight_and_every_surface_names_it() {
    let zone = zone();
    let sg = Conf::new()
        .admin()
        .limit("daily", &format!("key: ip, algorithm: fixed_window, limit: 3, window: {{ calendar: day, tz: {zone} }}"))
        .answering("daily")
        .start();
    refused_until_midnight(&[sg.addr], 3, zone).await;
    let window = serde_json::json!({ "calendar": "day", "tz": zone });
    let config: serde_json::Value = serde_json::from_str(&get(sg.admin_addr(), "/config", &[]).await.text()).unwrap();
    assert_eq!(config["limits"][0]["windows"][0]["window"], window, "{config}");
    let shown: serde_json::Value =
        serde_json::from_str(&get(sg.admin_addr(), "/dashboard.json", &[]).await.text()).unwrap();
    let limits = shown["limits"].as_array().unwrap();
    assert_eq!(limits[0]["windows"][0]["window"], window, "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_calendar_day_is_one_budget_to_local_midnight_for_two_instances() {
    let zone = zone();
    let redis = Redis::start();
    let conf = Conf::new()
        .redis(&redis.url(), "timeout: 1s")
        .limit(
            "daily",
            &format!(
                "key: ip, algorithm: fixed_window, limit: 4, window: {{ calendar: day, tz: {zone} }}, scope: global, \
                 on_store_error: deny"
            ),
        )
        .answering("daily");
    let (a, b) = (conf.start(), conf.start());
    refused_until_midnight(&[a.addr, b.addr], 4, zone).await;
    // The key lives in Redis until that midnight, not a moment longer.
    let keys = redis.command(&["KEYS", "*:cw0"]);
    let key = keys.lines().next().expect("the window's key");
    let ttl: i64 = redis.command(&["PTTL", key]).trim().parse().unwrap();
    let left = seconds_to_midnight(zone) * 1000;
    assert!((left - 2000..=left + 1000).contains(&ttl), "PTTL {ttl} ms, midnight in {left} ms");
}

fn outcomes(standings: &[Standing]) -> Vec<(Outcome, u64, std::time::Duration)> {
    standings.iter().map(|s| (s.outcome, s.remaining, s.reset)).collect()
}

/// ns since the epoch of a local time in `zone`.
fn local(zone: &str, text: &str) -> u64 {
    let zoned = text.parse::<jiff::civil::DateTime>().unwrap().in_tz(zone).unwrap();
    u64::try_from(zoned.timestamp().as_nanosecond()).unwrap()
}

/// The local limiter and the Redis script, at the same instants, across a short and a
/// long day in Berlin, a month's end and a leap day: the same outcome, `Retry-After`,
/// remaining and reset for every request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_and_redis_decide_calendar_windows_alike_across_their_ends() {
    let redis = Redis::start();
    let policies = [
        ("day, tz: Europe/Berlin", "2026-03-28T23:50", "2026-03-30T00:10"),
        ("day, tz: Europe/Berlin", "2026-10-24T23:50", "2026-10-26T00:10"),
        ("month, tz: Europe/Berlin", "2026-01-31T23:00", "2026-02-01T01:00"),
        ("month, tz: America/New_York, reset_day: 15", "2028-02-14T23:00", "2028-02-15T01:00"),
        ("month, reset_day: 1", "2028-02-29T23:00", "2028-03-01T01:00"),
        ("week, tz: Europe/Berlin, reset_day: sunday", "2026-10-24T23:00", "2026-10-25T05:00"),
    ];
    let mut yaml = format!("listen: 127.0.0.1:0\nredis: {{ url: \"{}\", timeout: 2s }}\nlimits:\n", redis.url());
    for (i, (window, ..)) in policies.iter().enumerate() {
        yaml += &format!(
            "  l{i}: {{ key: ip, on_missing_key: skip, scope: global, algorithm: fixed_window, limit: 3, \
             window: {{ calendar: {window} }} }}\n"
        );
    }
    let clock = ManualClock::default();
    let gate = Gate::new(&parse(&yaml, "test").unwrap(), clock.clone().into());
    let store = Arc::clone(gate.store().unwrap());
    let headers = HeaderMap::new();
    let mut rejected = 0;
    for (i, &(window, from, to)) in policies.iter().enumerate() {
        let zone = window.split("tz: ").nth(1).map_or("UTC", |z| z.split(',').next().unwrap());
        let (from, to) = (local(zone, from), local(zone, to));
        let id = LimitId::from(i);
        let client = Ipv4Addr::new(10, 9, i as u8, 1);
        let src = KeySource::get(IpAddr::V4(client), "/", &headers);
        let call = || Call {
            limit: id,
            burst: None,
            count: None,
            base: store.base(id, u128::from(client.to_bits())),
            near: KeyHash(0),
        };
        // Every 7 minutes and 13.000123 s, two requests at once.
        let mut at = from;
        while at < to {
            for _ in 0..2 {
                clock.set(Nanos(at));
                let local = match gate.check(&[LimitUse::plain(id)], &src, 1) {
                    Decision::Pass { standings, .. } | Decision::Reject { standings, .. } => outcomes(&standings),
                };
                let redis_time = RedisTime { secs: at / 1_000_000_000, micros: at % 1_000_000_000 / 1000 };
                let global = store.decide(&[call()], 1, Some(redis_time)).await.unwrap();
                assert_eq!(outcomes(&global.standings), local, "{window} at {at}");
                rejected += usize::from(local[0].0.is_rejected());
            }
            at += 433_000_123_000;
        }
    }
    assert!(rejected > 20, "{rejected} refusals");
}

/// Two instances whose clocks are a day behind and a day ahead of Redis's (and one on
/// time) share one daily budget: Redis's clock picks the window from the instants each
/// sends (its own, the one before or the next), so each counts in today's window and
/// says when it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_a_day_apart_count_in_the_window_redis_is_in() {
    let zone = zone();
    let redis = Redis::start();
    let yaml = format!(
        "listen: 127.0.0.1:0\nredis: {{ url: \"{}\", timeout: 2s }}\nlimits:\n  daily: {{ key: ip, scope: global, \
         algorithm: fixed_window, limit: 3, window: {{ calendar: day, tz: {zone} }} }}\n",
        redis.url()
    );
    let config = parse(&yaml, "test").unwrap();
    const DAY: u64 = 86_400_000_000_000;
    let now = Clock::System.now().0;
    let gates: Vec<Gate> = [now - DAY, now + DAY, now]
        .into_iter()
        .map(|at| Gate::new(&config, ManualClock::new(Nanos(at)).into()))
        .collect();
    let id = LimitId::from(0);
    let decide = async |gate: &Gate| {
        let store = gate.store().unwrap();
        let call = Call { limit: id, burst: None, count: None, base: store.base(id, 7), near: KeyHash(0) };
        store.decide(&[call], 1, None).await.unwrap().standings[0]
    };
    for (n, gate) in gates.iter().enumerate() {
        let s = decide(gate).await;
        assert_eq!((s.outcome, s.remaining), (Outcome::Passed, 2 - n as u64), "instance {n}");
    }
    for gate in &gates {
        let before = seconds_to_midnight(zone);
        let Outcome::Rejected(retry) = decide(gate).await.outcome else { panic!("the fourth request passed") };
        let after = seconds_to_midnight(zone);
        assert!(
            (after - 1..=before + 1).contains(&(retry.as_secs() as i64)),
            "{retry:?}, midnight in {after}..{before} s"
        );
    }
}

/// `simulate` replays a log on the requests' own clock: a daily quota in Berlin starts
/// again at 23:00 UTC in winter, not at UTC midnight.
#[test]
fn simulate_replays_a_calendar_day_to_its_local_midnight() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = "listen: 127.0.0.1:0
limits:
  daily: { key: ip, algorithm: fixed_window, limit: 2, window: { calendar: day, tz: Europe/Berlin } }
routes:
  - { limits: [daily], respond: { status: 200 } }
";
    std::fs::write(dir.path().join("c.yaml"), yaml).unwrap();
    let line =
        |time: &str| format!("10.0.0.1 - - [25/Oct/2026:{time} +0000] \"GET / HTTP/1.1\" 200 2 \"-\" \"curl/8\"\n");
    let log: String = ["22:59:57", "22:59:58", "22:59:59", "23:00:00", "23:00:01", "23:00:02"].map(line).concat();
    std::fs::write(dir.path().join("access.log"), log).unwrap();
    let out = binary()
        .args(["simulate", "-c", "c.yaml", "--decisions", "d.jsonl", "access.log"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let decided = std::fs::read_to_string(dir.path().join("d.jsonl")).unwrap();
    let mut lines: Vec<serde_json::Value> = decided.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    lines.sort_by_key(|d| d["line"].as_u64().unwrap());
    let statuses: Vec<u64> = lines.iter().map(|d| d["status"].as_u64().unwrap_or(200)).collect();
    assert_eq!(statuses, [200, 200, 429, 200, 200, 429], "{decided}");
}
