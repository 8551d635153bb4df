//! Global limits against a real Redis: the same decisions as local ones, one budget
//! shared by several instances, and what happens when Redis fails, is paused, forgets
//! its scripts, is a cluster, or when an instance dies holding concurrency slots.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderMap;
use sluicegate::clock::{ManualClock, Nanos};
use sluicegate::config::parse;
use sluicegate::gate::{Decision, Gate};
use sluicegate::limit::{Outcome, Standing};
use sluicegate::policy::key::{KeyHash, KeySource};
use sluicegate::store::{Call, RedisTime};

use crate::common::{Backend, Sluicegate, get};
use crate::redis::{Cluster, Redis};

/// The policies compared, each with periods long enough that the keys' TTLs (in Redis's
/// real time) outlast the replay (in schedule time).
const POLICIES: [&str; 14] = [
    "rate: 10r/m, burst: 3",
    "rate: 10r/m, burst: 5, delay: 2",
    "rate: 7r/m, burst: 2, nodelay: true",
    "algorithm: gcra, rate: 3r/m, burst: 1",
    "algorithm: token_bucket, capacity: 4, refill: 5r/m",
    "algorithm: min_interval, interval: 9s",
    "algorithm: fixed_window, limit: 4, window: 30s",
    "algorithm: sliding_window, limit: 4, window: 30s",
    "algorithm: sliding_log, limit: 4, window: 30s",
    "rates: [3r/m, 10r/h]",
    "rate: 5r/m, burst: 1, nodelay: true, ban: 40s, ban_max: 3m",
    "algorithm: sliding_window, limit: 3, window: 20s, ban: 1m",
    "rates: [2r/m, 5r/h], dry_run: true",
    "algorithm: fixed_window, limit: 3, window: 45s, ban: 2m, dry_run: true",
];

/// Arrival instants as (s, µs) (Redis time has µs resolution): bursts at one instant,
/// short gaps and long ones.
fn schedule(seed: u64, n: usize) -> Vec<(u64, u64)> {
    let mut x = seed | 1;
    let mut t: u64 = 1_700_000_000_123_457;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            t += match x % 10 {
                0..=2 => 0,
                3..=6 => x % 2_000_000,
                _ => x % 12_000_000,
            };
            (t / 1_000_000, t % 1_000_000)
        })
        .collect()
}

fn outcomes(standings: &[Standing]) -> Vec<(Outcome, bool)> {
    standings.iter().map(|s| (s.outcome, s.banned)).collect()
}

/// For each policy and cost, the local limiter and the Redis script see the same
/// schedule; every request must get the same outcome from both, to the nanosecond.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_and_redis_decide_every_schedule_alike() {
    let redis = Redis::start();
    let mut yaml = format!("listen: 127.0.0.1:0\nredis: {{ url: \"{}\", timeout: 2s }}\nlimits:\n", redis.url());
    for (i, policy) in POLICIES.iter().enumerate() {
        yaml += &format!("  l{i:02}: {{ key: ip, scope: global, {policy} }}\n");
    }
    let clock = ManualClock::default();
    let gate = Gate::new(&parse(&yaml, "test").unwrap(), clock.clone().into());
    let store = Arc::clone(gate.store().unwrap());
    let headers = HeaderMap::new();
    let mut compared = 0;
    for (i, policy) in POLICIES.iter().enumerate() {
        let costs: &[u64] = if policy.contains("min_interval") { &[1] } else { &[1, 2] };
        for &cost in costs {
            let client = Ipv4Addr::new(10, 0, i as u8, cost as u8);
            let src = KeySource::get(IpAddr::V4(client), "/", &headers);
            let call = || Call { limit: i, base: store.base(i, u128::from(client.to_bits())), near: KeyHash(0) };
            for (n, (s, us)) in schedule(i as u64 * 31 + cost, 150).into_iter().enumerate() {
                clock.set(Nanos(s * 1_000_000_000 + us * 1000));
                let local = match gate.check(&[i], &src, cost) {
                    Decision::Pass { standings, .. } | Decision::Reject { standings, .. } => outcomes(&standings),
                };
                let global = store.decide(&[call()], cost, Some(RedisTime { secs: s, micros: us })).await.unwrap();
                assert_eq!(outcomes(&global.standings), local, "{policy}, cost {cost}, request {n} at {s}.{us:06}");
                compared += 1;
            }
        }
    }
    assert!(compared > 3000);
}

/// The Redis script answers each hand-worked schedule of `gcra_cases` (the local
/// limiter's unit tests replay them too), on a clock passed to the script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_answers_the_leaky_bucket_schedules_as_worked_out_by_hand() {
    use crate::gcra_cases::{Answer, CASES};
    let redis = Redis::start();
    let mut yaml = format!("listen: 127.0.0.1:0\nredis: {{ url: \"{}\", timeout: 2s }}\nlimits:\n", redis.url());
    for (i, case) in CASES.iter().enumerate() {
        yaml += &format!("  l{i}: {{ key: ip, scope: global, {} }}\n", case.policy);
    }
    let gate = Gate::new(&parse(&yaml, "test").unwrap(), ManualClock::default().into());
    let store = Arc::clone(gate.store().unwrap());
    for (i, case) in CASES.iter().enumerate() {
        for (n, step) in case.steps.iter().enumerate() {
            let call = Call { limit: i, base: store.base(i, u128::from(step.key)), near: KeyHash(0) };
            let at = RedisTime { secs: 1_700_000_000 + step.at, micros: 0 };
            let verdicts = store.decide(&[call], step.cost, Some(at)).await.unwrap();
            let s = verdicts.standings[0];
            let retry = match s.outcome {
                Outcome::Rejected(retry) => Some(retry),
                _ => None,
            };
            assert_eq!(Answer::of(retry, s.remaining, s.reset), step.answer, "{}, request {n}", case.name);
        }
    }
}

/// `GET path`, failing the test if no answer comes within `limit` (Redis is failing:
/// no request may hang).
async fn get_within(addr: std::net::SocketAddr, path: &str, limit: Duration) -> (u16, Option<String>, Duration) {
    let started = Instant::now();
    let reply = tokio::time::timeout(limit, get(addr, path, &[]))
        .await
        .unwrap_or_else(|_| panic!("{path}: no answer within {limit:?}"));
    (reply.status, reply.header("retry-after").map(str::to_owned), started.elapsed())
}

fn respond_route(limits: &str) -> String {
    format!("  - match: {{ path_prefix: / }}\n    respond: {{ status: 200, body: ok }}\n    limits: [{limits}]\n")
}

/// Evalsha calls Redis has run so far (not counting those that found no script).
fn evalsha_calls(redis: &Redis) -> u64 {
    let stats = redis.command(&["INFO", "commandstats"]);
    let Some(line) = stats.lines().find_map(|l| l.strip_prefix("cmdstat_evalsha:")) else { return 0 };
    let field = |name: &str| -> u64 {
        line.split(',').find_map(|f| f.strip_prefix(name)?.strip_prefix('=')).unwrap().parse().unwrap()
    };
    field("calls") - field("failed_calls")
}

/// Redis's `reset` matches the local one: until the full burst is back, one period after
/// the bucket drains, so `t` is never below `Retry-After`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_counts_until_the_full_burst_is_back() {
    let redis = Redis::start();
    let yaml = format!(
        "listen: 127.0.0.1:0\nratelimit_headers: all\nredis: {{ url: \"{}\", timeout: 1s }}\nlimits:\n  l: {{ key: ip, rate: 2r/m, burst: 1, nodelay: true, scope: global, on_store_error: deny }}\nroutes:\n{}",
        redis.url(),
        respond_route("l")
    );
    let sg = Sluicegate::start(&yaml);
    let first = get(sg.addr, "/", &[]).await;
    assert_eq!((first.status, first.header("ratelimit")), (200, Some("\"l\";r=1;t=30")));
    let second = get(sg.addr, "/", &[]).await;
    assert_eq!((second.status, second.header("ratelimit")), (200, Some("\"l\";r=0;t=60")));
    let third = get(sg.addr, "/", &[]).await;
    assert_eq!((third.status, third.header("retry-after")), (429, Some("30")));
    assert_eq!(third.header("ratelimit"), Some("\"l\";r=0;t=60"));
}

/// Redis's refusal of a weighted request reports the units still left, not 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_weighted_request_reports_the_units_left() {
    let redis = Redis::start();
    let yaml = format!(
        "listen: 127.0.0.1:0\nratelimit_headers: all\nredis: {{ url: \"{}\", timeout: 1s }}\nlimits:\n  l: {{ key: ip, rate: 1r/m, burst: 3, nodelay: true, scope: global, on_store_error: deny }}\nroutes:\n  - limits: [l]\n    cost_header: x-cost\n    respond: {{ status: 200 }}\n",
        redis.url()
    );
    let sg = Sluicegate::start(&yaml);
    let first = get(sg.addr, "/", &[("x-cost", "3")]).await;
    assert_eq!((first.status, first.header("ratelimit")), (200, Some("\"l\";r=1;t=180")));
    let refused = get(sg.addr, "/", &[("x-cost", "3")]).await;
    assert_eq!((refused.status, refused.header("retry-after")), (429, Some("120")));
    assert_eq!(refused.header("ratelimit"), Some("\"l\";r=1;t=180"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_admit_exactly_the_global_budget_between_them() {
    let redis = Redis::start();
    let yaml = format!(
        "listen: 127.0.0.1:0\nredis: {{ url: \"{}\", timeout: 1s }}\nlimits:\n  shared: {{ key: \"header:x-key\", rate: 1r/m, burst: 9, nodelay: true, scope: global, on_store_error: deny }}\nroutes:\n{}",
        redis.url(),
        respond_route("shared")
    );
    let (a, b) = (Sluicegate::start(&yaml), Sluicegate::start(&yaml));
    let tasks: Vec<_> = (0..40)
        .map(|n| {
            let addr = if n % 2 == 0 { a.addr } else { b.addr };
            tokio::spawn(async move { get(addr, "/", &[("x-key", "team-1")]).await.status })
        })
        .collect();
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.unwrap());
    }
    assert_eq!(statuses.iter().filter(|&&s| s == 200).count(), 10, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|&&s| s == 429).count(), 30);
    // Another key has its own budget.
    assert_eq!(get(b.addr, "/", &[("x-key", "team-2")]).await.status, 200);
}

/// Several global limits on a route take one round trip per request, refuse all or
/// nothing, and a key known to be refused is refused without a round trip until it
/// may pass, with the exact time left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_round_trip_all_or_nothing_and_the_near_cache() {
    let redis = Redis::start();
    let yaml = format!(
        "listen: 127.0.0.1:0\nredis: {{ url: \"{}\", timeout: 1s }}\nlimits:
  big: {{ key: ip, rate: 1r/m, burst: 9, nodelay: true, scope: global }}
  small: {{ key: ip, algorithm: sliding_log, limit: 2, window: 1h, scope: global }}
  local: {{ key: ip, rate: 1r/m, burst: 9, nodelay: true }}
routes:
  - match: {{ path: /both }}
    respond: {{ status: 200 }}
    limits: [big, small, local]
  - match: {{ path: /big }}
    respond: {{ status: 200 }}
    limits: [big]
  - match: {{ path: /local }}
    respond: {{ status: 200 }}
    limits: [local]
",
        redis.url()
    );
    let sg = Sluicegate::start(&yaml);
    let before = evalsha_calls(&redis);
    assert_eq!(get(sg.addr, "/both", &[]).await.status, 200);
    assert_eq!(get(sg.addr, "/both", &[]).await.status, 200);
    assert_eq!(evalsha_calls(&redis) - before, 2, "one call per request for two global limits");
    // `small` refuses the third: `big` and the local limit keep their quota.
    let refused = get(sg.addr, "/both", &[]).await;
    assert_eq!(refused.status, 429);
    let first_retry: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((3598..=3600).contains(&first_retry), "{first_retry}");
    // Now known: further refusals need no round trip, and say the same time left.
    let calls = evalsha_calls(&redis);
    for _ in 0..5 {
        let again = get(sg.addr, "/both", &[]).await;
        assert_eq!(again.status, 429);
        let retry: u64 = again.header("retry-after").unwrap().parse().unwrap();
        assert!(retry <= first_retry && retry + 2 >= first_retry, "{retry} vs {first_retry}");
    }
    assert_eq!(evalsha_calls(&redis), calls, "the near-cache answered");
    // 10 - 2 left in `big`, 10 - 2 in the local limit.
    let big: Vec<u16> = futures_statuses(sg.addr, "/big", 9).await;
    assert_eq!(big.iter().filter(|&&s| s == 200).count(), 8, "{big:?}");
    let local: Vec<u16> = futures_statuses(sg.addr, "/local", 9).await;
    assert_eq!(local.iter().filter(|&&s| s == 200).count(), 8, "{local:?}");
}

/// The near-cache answers a one-unit request exactly as Redis did (the reset too, not
/// the `Retry-After` again), and lets Redis answer heavier ones, whose wait is longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_near_cache_answers_as_redis_and_only_for_one_unit() {
    let redis = Redis::start();
    let yaml = format!(
        "listen: 127.0.0.1:0\nratelimit_headers: all\nredis: {{ url: \"{}\", timeout: 1s }}\nlimits:\n  l: {{ key: ip, rate: 1r/m, burst: 2, nodelay: true, scope: global }}\nroutes:\n  - limits: [l]\n    cost_header: x-cost\n    respond: {{ status: 200 }}\n",
        redis.url()
    );
    let sg = Sluicegate::start(&yaml);
    for _ in 0..3 {
        assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
    }
    let answer = |r: &crate::common::Reply| {
        (r.status, r.header("retry-after").map(str::to_owned), r.header("ratelimit").map(str::to_owned))
    };
    let refused = |after: &str| (429, Some(after.to_owned()), Some("\"l\";r=0;t=180".to_owned()));
    let calls = evalsha_calls(&redis);
    assert_eq!(answer(&get(sg.addr, "/", &[]).await), refused("60"), "Redis's answer");
    assert_eq!(evalsha_calls(&redis), calls + 1);
    assert_eq!(answer(&get(sg.addr, "/", &[]).await), refused("60"), "the near-cache's answer");
    assert_eq!(evalsha_calls(&redis), calls + 1);
    assert_eq!(answer(&get(sg.addr, "/", &[("x-cost", "2")]).await), refused("120"), "two units wait longer");
    assert_eq!(evalsha_calls(&redis), calls + 2, "Redis answered two units");
    assert_eq!(answer(&get(sg.addr, "/", &[]).await), refused("60"));
    assert_eq!(evalsha_calls(&redis), calls + 2);
}

/// A client that waits the `Retry-After` it was given is not refused again, whatever its
/// cost, even when a one-unit refusal of its key is in the near-cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_obeys_retry_after_passes_next_time() {
    let redis = Redis::start();
    let yaml = format!(
        "listen: 127.0.0.1:0\nredis: {{ url: \"{}\", timeout: 1s }}\nlimits:\n  l: {{ key: ip, rate: 1r/s, burst: 1, nodelay: true, scope: global }}\nroutes:\n  - limits: [l]\n    cost_header: x-cost\n    respond: {{ status: 200 }}\n",
        redis.url()
    );
    let sg = Sluicegate::start(&yaml);
    assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
    assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
    assert_eq!(get(sg.addr, "/", &[]).await.status, 429, "one unit refused: now in the near-cache");
    let refused = get(sg.addr, "/", &[("x-cost", "2")]).await;
    assert_eq!((refused.status, refused.header("retry-after")), (429, Some("2")));
    // Obeying is the point of this test: the wait is the one the client was told.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(get(sg.addr, "/", &[("x-cost", "2")]).await.status, 200);
}

async fn futures_statuses(addr: std::net::SocketAddr, path: &str, n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(get(addr, path, &[]).await.status);
    }
    out
}

/// A global refusal takes back what the local limits admitted for the same request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_refusal_takes_back_local_admissions() {
    let redis = Redis::start();
    let yaml = format!(
        "listen: 127.0.0.1:0\nredis: {{ url: \"{}\", timeout: 1s, near_cache_keys: 0 }}\nlimits:
  local: {{ key: ip, rate: 1r/m, burst: 2, nodelay: true }}
  global: {{ key: ip, algorithm: sliding_log, limit: 1, window: 1h, scope: global }}
routes:
  - match: {{ path: /both }}
    respond: {{ status: 200 }}
    limits: [local, global]
  - match: {{ path: /local }}
    respond: {{ status: 200 }}
    limits: [local]
",
        redis.url()
    );
    let sg = Sluicegate::start(&yaml);
    assert_eq!(futures_statuses(sg.addr, "/both", 4).await, [200, 429, 429, 429]);
    // Only the first request counted locally: two of three remain.
    assert_eq!(futures_statuses(sg.addr, "/local", 3).await, [200, 200, 429]);
}

/// Redis killed under load: no request waits past the timeout, each limit does as its
/// `on_store_error` says, one report line stands for many fallbacks, and Redis is used
/// again once it is back, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_under_load_then_restarted() {
    let mut redis = Redis::start();
    let yaml = format!(
        "listen: 127.0.0.1:0\nredis: {{ url: \"{}\", timeout: 100ms, breaker_failures: 3, breaker_cooldown: 200ms }}\nlimits:
  open: {{ key: ip, rate: 1000r/s, burst: 1000, nodelay: true, scope: global, on_store_error: allow }}
  closed: {{ key: ip, rate: 1000r/s, burst: 1000, nodelay: true, scope: global, on_store_error: deny }}
  twin: {{ key: ip, rate: 1r/m, burst: 5, nodelay: true, scope: global, on_store_error: local, instances: 2 }}
routes:
  - match: {{ path: /open }}
    respond: {{ status: 200 }}
    limits: [open]
  - match: {{ path: /closed }}
    respond: {{ status: 200 }}
    limits: [closed]
  - match: {{ path: /twin }}
    respond: {{ status: 200 }}
    limits: [twin]
",
        redis.url()
    );
    let sg = Arc::new(Sluicegate::start(&yaml));
    // (The twin stays untouched: its local state must be fresh when Redis goes.)
    assert_eq!(get(sg.addr, "/open", &[]).await.status, 200);
    assert_eq!(redis.command(&["DBSIZE"]), "1", "the global limit is decided in Redis");
    // Four clients keep requesting while Redis dies.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load: Vec<_> = (0..4)
        .map(|n| {
            let (addr, stop) = (sg.addr, Arc::clone(&stop));
            tokio::spawn(async move {
                let path = if n % 2 == 0 { "/open" } else { "/closed" };
                let mut seen = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let (status, _, took) = get_within(addr, path, Duration::from_secs(5)).await;
                    seen.push((path, status, took));
                }
                seen
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    redis.kill();
    tokio::time::sleep(Duration::from_millis(800)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut seen = Vec::new();
    for task in load {
        seen.extend(task.await.unwrap());
    }
    assert!(seen.len() > 40, "{} requests", seen.len());
    for (path, status, took) in &seen {
        assert!(*took < Duration::from_millis(500), "{path} took {took:?}");
        let expected: &[u16] = if *path == "/open" { &[200] } else { &[200, 503] };
        assert!(expected.contains(status), "{path}: {status}");
    }
    assert!(seen.iter().any(|&(p, s, _)| p == "/closed" && s == 503), "deny never applied");
    // Sequentially now, with Redis gone: each limit as its on_store_error says.
    let mut statuses = std::collections::BTreeMap::<&str, Vec<u16>>::new();
    for _ in 0..10 {
        for path in ["/open", "/closed", "/twin"] {
            let (status, retry_after, _) = get_within(sg.addr, path, Duration::from_secs(5)).await;
            if path == "/closed" {
                assert_eq!(retry_after.as_deref(), Some("1"));
            }
            statuses.entry(path).or_default().push(status);
        }
    }
    assert!(statuses["/open"].iter().all(|&s| s == 200), "{:?}", statuses["/open"]);
    assert!(statuses["/closed"].iter().all(|&s| s == 503), "{:?}", statuses["/closed"]);
    // The local twin: its share of 6 at once (burst 5) and of the rate, between two
    // instances; it never heard of the key from Redis.
    let twin = &statuses["/twin"];
    assert_eq!(twin.iter().filter(|&&s| s == 200).count(), 3, "{twin:?}");
    let log = sg.wait_for_log(|l| l.contains("circuit breaker open"));
    assert!(log.contains("circuit breaker open"), "{log}");
    let reports = log.matches("global limits without Redis").count();
    let fallbacks = seen.len() + 30;
    assert!((1..=2).contains(&reports), "{reports} report lines for {fallbacks} requests:\n{log}");

    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        get(sg.addr, "/closed", &[]).await;
        if redis.command(&["DBSIZE"]) != "0" {
            break;
        }
        assert!(Instant::now() < deadline, "Redis is not used again:\n{}", sg.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(get(sg.addr, "/closed", &[]).await.status, 200);
    assert!(sg.wait_for_log(|l| l.contains("Redis answers again")).contains("Redis answers again"));
}

/// When Redis goes, a key's local twin goes on from the units Redis last said were
/// left (its share of them: all, for one instance), not from a fresh key's burst.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_twin_starts_from_what_redis_last_said() {
    let mut redis = Redis::start();
    let yaml = format!(
        "listen: 127.0.0.1:0\nredis: {{ url: \"{}\", timeout: 100ms }}\nlimits:
  rate: {{ key: ip, rate: 1r/m, burst: 5, nodelay: true, scope: global, on_store_error: local }}
  window: {{ key: ip, algorithm: fixed_window, limit: 6, window: 1d, scope: global, on_store_error: local }}
routes:
  - match: {{ path: /rate }}
    respond: {{ status: 200 }}
    limits: [rate]
  - match: {{ path: /window }}
    respond: {{ status: 200 }}
    limits: [window]
",
        redis.url()
    );
    let sg = Sluicegate::start(&yaml);
    for path in ["/rate", "/window"] {
        assert_eq!(futures_statuses(sg.addr, path, 4).await, [200; 4], "{path} by Redis: 2 of 6 left");
    }
    redis.kill();
    for path in ["/rate", "/window"] {
        assert_eq!(futures_statuses(sg.addr, path, 4).await, [200, 200, 429, 429], "{path} by the twin");
    }
}

/// Three instances share a global limit (50 r/s, burst 20), held at its limit, while
/// Redis pauses for 30 ms, then for 2 s. Each local twin starts from its share of what
/// its instance last heard from Redis (next to nothing, for a key held at its limit),
/// not from a full burst: the admissions stay within the budget plus the allowance
/// README states, `rate × F` per time `F` the instances decide locally (the pause, at
/// most a breaker cooldown and two timeouts more) plus the twins' starting units.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_keep_the_budget_through_redis_pauses() {
    const RATE: f64 = 50.0;
    let (timeout, cooldown) = (Duration::from_millis(20), Duration::from_millis(100));
    let redis = Redis::start();
    let yaml = format!(
        "listen: 127.0.0.1:0\nredis: {{ url: \"{}\", timeout: 20ms, breaker_cooldown: 100ms }}\nlimits:\n  g: {{ key: ip, rate: 50r/s, burst: 20, nodelay: true, scope: global, on_store_error: local, instances: 3 }}\nroutes:\n{}",
        redis.url(),
        respond_route("g")
    );
    let instances = [Sluicegate::start(&yaml), Sluicegate::start(&yaml), Sluicegate::start(&yaml)];
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let started = Instant::now();
    // Two clients per instance, each far faster than the rate (paced, to spare the cores).
    let load: Vec<_> = (0..6)
        .map(|n| {
            let (addr, stop) = (instances[n % 3].addr, Arc::clone(&stop));
            tokio::spawn(async move {
                let mut seen = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let (status, _, _) = get_within(addr, "/", Duration::from_secs(5)).await;
                    seen.push((status, Instant::now()));
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                seen
            })
        })
        .collect();
    let mut paused = Vec::new();
    for pause in [Duration::from_millis(30), Duration::from_secs(2)] {
        tokio::time::sleep(Duration::from_millis(600)).await;
        let from = Instant::now();
        redis.pause();
        tokio::time::sleep(pause).await;
        redis.resume();
        paused.push((from, Instant::now()));
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut seen = Vec::new();
    for task in load {
        seen.extend(task.await.unwrap());
    }
    let elapsed = started.elapsed().as_secs_f64();
    assert!(seen.iter().all(|&(s, _)| s == 200 || s == 429), "{:?}", seen.iter().map(|s| s.0).collect::<Vec<_>>());
    let admitted = seen.iter().filter(|&&(s, _)| s == 200).count() as f64;
    let (from, to) = paused[1];
    assert!(
        seen.iter().any(|&(s, at)| s == 200 && at > from + Duration::from_millis(500) && at < to),
        "the local twins admit while Redis is paused"
    );
    // Budget: burst + 1 at once, then the rate. Allowance, per stretch F decided
    // locally: the twins' starting units (their share of what they heard: at most one
    // each, rounding) and min(rate × F, burst + 1), the quota Redis regains unused while
    // the twins spend at the rate. Plus a fifth of a second of the rate, for a call that
    // times out under load outside the pauses.
    let budget = 21.0 + RATE * elapsed;
    let allowance: f64 = paused
        .iter()
        .map(|(from, to)| 3.0 + (RATE * (*to - *from + cooldown + timeout * 2).as_secs_f64()).min(21.0))
        .sum::<f64>()
        + RATE * 0.2;
    assert!(
        admitted <= budget + allowance,
        "{admitted} admitted in {elapsed:.2} s: budget {budget:.0} + allowance {allowance:.0}"
    );
    // And the limit held: far more requests came than it allows.
    assert!(seen.len() as f64 > 2.0 * (budget + allowance), "{} requests", seen.len());
}

/// Redis paused (SIGSTOP): requests still get their answer within the timeout; after
/// SIGCONT, Redis decides again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_paused_then_resumed() {
    let redis = Redis::start();
    let yaml = format!(
        "listen: 127.0.0.1:0\nredis: {{ url: \"{}\", timeout: 40ms, breaker_failures: 2, breaker_cooldown: 100ms }}\nlimits:\n  g: {{ key: ip, algorithm: fixed_window, limit: 1000, window: 1h, scope: global, on_store_error: allow }}\nroutes:\n{}",
        redis.url(),
        respond_route("g")
    );
    let sg = Sluicegate::start(&yaml);
    assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
    redis.pause();
    for n in 0..10 {
        let (status, _, took) = get_within(sg.addr, "/", Duration::from_secs(5)).await;
        assert_eq!(status, 200);
        assert!(took < Duration::from_millis(400), "request {n} took {took:?} with Redis paused");
    }
    redis.resume();
    let key = redis.command(&["KEYS", "*"]);
    let count = |r: &Redis| r.command(&["GET", &key]).split(' ').nth(1).unwrap_or("0").parse::<u64>().unwrap();
    let before = count(&redis);
    let deadline = Instant::now() + Duration::from_secs(10);
    while count(&redis) <= before {
        assert!(Instant::now() < deadline, "Redis is not used after SIGCONT:\n{}", sg.log());
        get(sg.addr, "/", &[]).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Redis paused while requests keep arriving: each is answered by its own deadline (the
/// timeout after it arrived), also those queued behind calls that Redis never answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_queued_behind_unanswered_calls_still_wait_one_timeout() {
    let redis = Redis::start();
    let yaml = format!(
        "listen: 127.0.0.1:0\nredis: {{ url: \"{}\", timeout: 300ms, breaker_failures: 100000 }}\nlimits:\n  g: {{ key: ip, algorithm: fixed_window, limit: 1000, window: 1h, scope: global, on_store_error: allow }}\nroutes:\n{}",
        redis.url(),
        respond_route("g")
    );
    let sg = Sluicegate::start(&yaml);
    assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
    redis.pause();
    // One request every 50 ms for a second: most arrive while calls are under way, and
    // queue. A queued request that waited for an earlier call's full timeout before its
    // own call started would take up to twice the timeout.
    let mut waiting = Vec::new();
    for _ in 0..20 {
        waiting.push(tokio::spawn(get_within(sg.addr, "/", Duration::from_secs(5))));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (n, request) in waiting.into_iter().enumerate() {
        let (status, _, took) = request.await.unwrap();
        assert_eq!(status, 200, "request {n}");
        assert!(took >= Duration::from_millis(290), "request {n} answered after {took:?}, before its timeout");
        assert!(took < Duration::from_millis(450), "request {n} took {took:?}, past its timeout of 300 ms");
    }
    redis.resume();
}

/// A call whose first request was answered `Timeout` while Redis was paused still gives
/// the requests after it their own part of the reply once Redis answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_answers_its_later_requests_after_its_first_timed_out() {
    let redis = Redis::start();
    let yaml = format!(
        "listen: 127.0.0.1:0\nratelimit_headers: all\nredis: {{ url: \"{}\", timeout: 600ms, breaker_failures: 100000, near_cache_keys: 0 }}\nlimits:\n  g: {{ key: \"header:x-key\", rate: 1r/m, burst: 9, nodelay: true, scope: global, on_store_error: allow }}\nroutes:\n{}",
        redis.url(),
        respond_route("g")
    );
    let sg = Sluicegate::start(&yaml);
    assert_eq!(get(sg.addr, "/", &[("x-key", "warm-up")]).await.status, 200);
    redis.pause();
    let send = || tokio::spawn(get(sg.addr, "/", &[("x-key", "k")]));
    // Two calls under way (the cap for one connection), frozen; at 600 ms they are given
    // up and the next call carries `a` (deadline 750 ms) and `b` (1050 ms).
    let _under_way = [send(), send()];
    tokio::time::sleep(Duration::from_millis(150)).await;
    let a = send();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b = send();
    tokio::time::sleep(Duration::from_millis(450)).await;
    redis.resume();
    let _ = a.await.unwrap();
    let b = b.await.unwrap();
    // Redis then runs the frozen calls in order: the two (9 and 8 left), `a` (7), `b` (6).
    assert_eq!(b.status, 200);
    let left = b.header("ratelimit").and_then(|h| h.split("r=").nth(1)).and_then(|r| r.split(';').next());
    assert_eq!(left, Some("6"), "{:?}", b.header("ratelimit"));
}

/// `SCRIPT FLUSH` mid-run: the next call finds NOSCRIPT, loads the script again, and
/// decides; no request falls back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushed_scripts_are_loaded_again() {
    let redis = Redis::start();
    let yaml = format!(
        "listen: 127.0.0.1:0\nredis: {{ url: \"{}\", timeout: 1s }}\nlimits:\n  g: {{ key: ip, rate: 1r/m, burst: 9, nodelay: true, scope: global, on_store_error: deny }}\nroutes:\n{}",
        redis.url(),
        respond_route("g")
    );
    let sg = Sluicegate::start(&yaml);
    let mut statuses = futures_statuses(sg.addr, "/", 5).await;
    assert_eq!(redis.command(&["SCRIPT", "FLUSH"]), "OK");
    statuses.extend(futures_statuses(sg.addr, "/", 10).await);
    assert_eq!(statuses.iter().filter(|&&s| s == 200).count(), 10, "{statuses:?}");
    assert!(statuses[10..].iter().all(|&s| s == 429), "{statuses:?}");
    assert!(!sg.log().contains("global limits without Redis"), "{}", sg.log());
}

/// Started without Redis: sluicegate serves (here failing open), and uses Redis once it
/// appears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_without_redis_and_uses_it_once_it_appears() {
    let mut redis = Redis::start();
    redis.kill();
    let yaml = format!(
        "listen: 127.0.0.1:0\nredis: {{ url: \"{}\", timeout: 30ms, breaker_cooldown: 100ms }}\nlimits:\n  g: {{ key: ip, rate: 1r/m, burst: 2, nodelay: true, scope: global, on_store_error: allow }}\nroutes:\n{}",
        redis.url(),
        respond_route("g")
    );
    let sg = Sluicegate::start(&yaml);
    assert_eq!(futures_statuses(sg.addr, "/", 5).await, [200; 5]);
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(15);
    while get(sg.addr, "/", &[]).await.status != 429 {
        assert!(Instant::now() < deadline, "the global limit never applied:\n{}", sg.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A Redis Cluster of three masters: limits whose keys live in different slots are
/// decided by one call per slot, still all or nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_decides_global_limits() {
    let cluster = Cluster::start(3);
    let yaml = format!(
        "listen: 127.0.0.1:0\nredis: {{ url: \"{}\", cluster: true, timeout: 1s }}\nlimits:
  per_key: {{ key: \"header:x-key\", rate: 1r/m, burst: 4, nodelay: true, scope: global, on_store_error: deny }}
  per_ip: {{ key: ip, algorithm: sliding_window, limit: 1000, window: 1h, scope: global, on_store_error: deny }}
routes:
{}",
        cluster.url(),
        respond_route("per_key, per_ip")
    );
    let sg = Sluicegate::start(&yaml);
    sg.wait_for_log(|l| l.contains("connected to Redis Cluster"));
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(get(sg.addr, "/", &[("x-key", "k0")]).await.status);
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429], "{}", sg.log());
    // The keys are spread over the nodes by their hash tags: one per limit and key.
    let keys: usize = cluster.nodes.iter().map(|n| n.command(&["DBSIZE"]).parse::<usize>().unwrap()).sum();
    assert_eq!(keys, 2);
    // per_ip counted only the five admitted requests: refusals were taken back.
    let per_ip = cluster
        .nodes
        .iter()
        .flat_map(|n| n.command(&["KEYS", "*per_ip*"]).lines().map(|k| (n, k.to_owned())).collect::<Vec<_>>())
        .next()
        .unwrap();
    // "index prev curr": 5 in all, whether or not an hour began meanwhile, once the
    // refunds sent in the background have arrived.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let state = per_ip.0.command(&["GET", &per_ip.1]);
        let counted: u64 = state.split(' ').skip(1).map(|n| n.parse::<u64>().unwrap()).sum();
        if counted == 5 {
            break;
        }
        assert!(counted > 5 && Instant::now() < deadline, "per_ip state {state:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// An instance killed while holding a global concurrency slot: the slot comes back by
/// itself once its lease lapses, while a live request keeps its slot by renewing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_of_a_killed_instance_lapse_and_live_ones_are_renewed() {
    let redis = Redis::start();
    let backend = Backend::start().await;
    let yaml = format!(
        "listen: 127.0.0.1:0\nredis: {{ url: \"{}\", timeout: 1s, lease_ttl: 600ms }}\nupstreams:\n  b: {{ servers: [\"{}\"] }}\nlimits:\n  slots: {{ key: ip, concurrency: 1, scope: global, on_store_error: deny }}\nroutes:\n  - match: {{ path_prefix: / }}\n    upstream: b\n    limits: [slots]\n",
        redis.url(),
        backend.addr
    );
    let (a, b) = (Sluicegate::start(&yaml), Sluicegate::start(&yaml));
    // A request through `a` holds the slot, held at the backend until released, for
    // longer than the lease's ttl.
    let a_addr = a.addr;
    let long = tokio::spawn(async move { get(a_addr, "/held", &[]).await.status });
    let deadline = Instant::now() + Duration::from_secs(5);
    while backend.hits().is_empty() {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(get(b.addr, "/", &[]).await.status, 429, "renewed past its ttl, the lease still holds");
    backend.gate.add_permits(1);
    assert_eq!(long.await.unwrap(), 200);
    assert_eq!(get(b.addr, "/", &[]).await.status, 200, "released at the end of the request");

    // Now `a` dies mid-request: its slot returns within one lease ttl.
    let long = tokio::spawn(async move { get(a_addr, "/held", &[]).await });
    let deadline = Instant::now() + Duration::from_secs(5);
    while backend.hits().len() < 3 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(get(b.addr, "/", &[]).await.status, 429);
    drop(a); // SIGKILL
    let killed = Instant::now();
    while get(b.addr, "/", &[]).await.status != 200 {
        assert!(killed.elapsed() < Duration::from_secs(3), "the dead instance's slot never came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Lapsed within one ttl of its last renewal, plus a poll.
    assert!(killed.elapsed() <= Duration::from_millis(600 + 400), "{:?}", killed.elapsed());
    long.abort();
}

/// `count: [401]` on a global limit: other statuses are taken back in Redis; every key
/// written carries the prefix and a TTL (here over three multiplexed connections).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_counted_statuses_keep_global_quota_and_keys_expire() {
    let redis = Redis::start();
    let backend = Backend::start().await;
    let yaml = format!(
        "listen: 127.0.0.1:0\nredis: {{ url: \"{}\", timeout: 1s, key_prefix: \"edge-7:\", connections: 3 }}\nupstreams:\n  b: {{ servers: [\"{}\"] }}\nlimits:
  login: {{ key: ip, algorithm: sliding_log, limit: 2, window: 1h, count: [401], scope: global, ban: 1m }}
  pace: {{ key: ip, rate: 10r/m, burst: 20, nodelay: true, scope: global }}
routes:
  - match: {{ path_prefix: / }}
    upstream: b
    limits: [login, pace]
",
        redis.url(),
        backend.addr
    );
    let sg = Sluicegate::start(&yaml);
    for _ in 0..4 {
        assert_eq!(get(sg.addr, "/status/200", &[]).await.status, 200);
    }
    assert_eq!(get(sg.addr, "/status/401", &[]).await.status, 401);
    assert_eq!(get(sg.addr, "/status/401", &[]).await.status, 401);
    let refused = get(sg.addr, "/status/200", &[]).await;
    assert_eq!(refused.status, 429, "two failures spent the quota; successes were taken back");
    assert_eq!(refused.header("retry-after"), Some("60"), "and the key is banned");
    let keys = redis.command(&["KEYS", "*"]);
    assert_eq!(keys.lines().count(), 3, "{keys}");
    for key in keys.lines() {
        assert!(key.starts_with("edge-7:{"), "{key}");
        let ttl: i64 = redis.command(&["PTTL", key]).parse().unwrap();
        assert!(ttl > 0, "{key} has no TTL ({ttl})");
    }
}

/// Writes a private CA (`ca.pem`) and a certificate for 127.0.0.1 signed by it
/// (`server.pem`, `server.key`) into `dir`, with the openssl command.
fn private_ca(dir: &std::path::Path) {
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl").args(args).current_dir(dir).output().expect("openssl");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    openssl(
        &["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem"]
            .into_iter()
            .chain(["-days", "2", "-subj", "/CN=sluicegate test CA"])
            .collect::<Vec<_>>(),
    );
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(dir.join("ext.cnf"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    openssl(
        &["x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial"]
            .into_iter()
            .chain(["-out", "server.pem", "-days", "2", "-extfile", "ext.cnf"])
            .collect::<Vec<_>>(),
    );
}

/// `rediss://` with a private CA: decisions go through TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_limits_over_tls_with_a_private_ca() {
    let certs = tempfile::tempdir().unwrap();
    private_ca(certs.path());
    let redis = Redis::start_tls(certs.path());
    let yaml = format!(
        "listen: 127.0.0.1:0\nredis: {{ url: \"rediss://127.0.0.1:{}\", tls_ca_file: \"{}\", timeout: 1s }}\nlimits:\n  g: {{ key: ip, rate: 1r/m, burst: 1, nodelay: true, scope: global, on_store_error: deny }}\nroutes:\n{}",
        redis.tls_port,
        certs.path().join("ca.pem").display(),
        respond_route("g")
    );
    let sg = Sluicegate::start(&yaml);
    assert_eq!(futures_statuses(sg.addr, "/", 3).await, [200, 200, 429], "{}", sg.log());
    assert_eq!(redis.command(&["DBSIZE"]), "1");
}

/// A Redis with a password: the right one is used; with a wrong one Redis refuses every
/// call, and `on_store_error` decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_sent_and_a_refusal_is_a_store_error() {
    let redis = Redis::start();
    assert_eq!(redis.command(&["CONFIG", "SET", "requirepass", "s3cret"]), "OK");
    let config = |password: &str| {
        format!(
            "listen: 127.0.0.1:0\nredis: {{ url: \"{}\", password: \"{password}\", timeout: 1s }}\nlimits:\n  g: {{ key: ip, rate: 1r/m, burst: 1, nodelay: true, scope: global, on_store_error: deny }}\nroutes:\n{}",
            redis.url(),
            respond_route("g")
        )
    };
    let right = Sluicegate::start(&config("s3cret"));
    assert_eq!(futures_statuses(right.addr, "/", 3).await, [200, 200, 429], "{}", right.log());
    let wrong = Sluicegate::start(&config("guess"));
    assert_eq!(futures_statuses(wrong.addr, "/", 2).await, [503, 503], "{}", wrong.log());
}

/// The value of `name` in a `/metrics` text.
fn metric(text: &str, name: &str) -> u64 {
    let line = text.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} in:\n{text}"));
    line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("bad line {line}"))
}

/// Requests that wait for Redis together share script calls, and each is still decided
/// on its own, in turn: the budget is exact, and every admitted request is told a
/// different number of units left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_waiting_together_share_a_call_and_keep_the_exact_budget() {
    // Every algorithm that keeps its state in a string, which a call reads once per key
    // and writes once at its end: each request must still see those before it.
    for (limit, refusal) in [
        ("rate: 1r/m, burst: 19, nodelay: true", Some(60)),
        ("algorithm: fixed_window, limit: 20, window: 1h", None),
        ("algorithm: sliding_window, limit: 20, window: 1h", None),
        ("rate: 1r/m, burst: 19, nodelay: true, ban: 2h, ban_max: 4h", Some(7200)),
    ] {
        let redis = Redis::start();
        let yaml = format!(
            "listen: 127.0.0.1:0\nratelimit_headers: all\nadmin: {{ listen: 127.0.0.1:0 }}\nredis: {{ url: \"{}\", timeout: 10s, near_cache_keys: 0 }}\nlimits:\n  shared: {{ key: \"header:x-key\", {limit}, scope: global }}\nroutes:\n{}",
            redis.url(),
            respond_route("shared")
        );
        let sg = Sluicegate::start(&yaml);
        assert_eq!(get(sg.addr, "/", &[("x-key", "warm-up")]).await.status, 200);
        let evalsha_before = evalsha_calls(&redis);
        let calls_before =
            metric(&get(sg.admin_addr(), "/metrics", &[]).await.text(), "sluicegate_redis_script_calls_total");
        // Frozen, Redis answers nothing: every request's decision waits until all are queued.
        redis.pause();
        let tasks: Vec<_> =
            (0..60).map(|_| tokio::spawn(async move { get(sg.addr, "/", &[("x-key", "team-1")]).await })).collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = get(sg.admin_addr(), "/metrics", &[]).await.text();
            if metric(&text, "sluicegate_redis_calls_total") >= 61 {
                break;
            }
            assert!(Instant::now() < deadline, "{limit}: the requests did not all reach the store:\n{text}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        redis.resume();
        let mut left = Vec::new();
        let mut refused = 0;
        for task in tasks {
            let reply = task.await.unwrap();
            match reply.status {
                200 => left.push(reply.header("ratelimit").and_then(|h| h.split("r=").nth(1)).map(|r| r.to_owned())),
                429 => refused += 1,
                other => panic!("{limit}: status {other}"),
            }
        }
        assert_eq!((left.len(), refused), (20, 40), "{limit}");
        // Each admitted request saw the ones decided before it in the same call.
        let mut left: Vec<u64> =
            left.iter().map(|r| r.as_deref().unwrap().split(';').next().unwrap().parse().unwrap()).collect();
        left.sort_unstable();
        assert_eq!(left, (0..20).collect::<Vec<_>>(), "{limit}");
        // Two calls were under way when Redis froze; the other 58 waited and went in one.
        let shared = evalsha_calls(&redis) - evalsha_before;
        assert!(shared <= 3, "{limit}: {shared} script calls for 60 requests");
        let text = get(sg.admin_addr(), "/metrics", &[]).await.text();
        assert_eq!(metric(&text, "sluicegate_redis_script_calls_total"), calls_before + shared, "{limit}");
        // What the calls wrote is in Redis: the next request is refused too, for as long
        // (a ban's length, not the rate's minute; a window's end depends on the hour).
        let next = get(sg.addr, "/", &[("x-key", "team-1")]).await;
        assert_eq!(next.status, 429, "{limit}");
        let retry: u64 = next.header("retry-after").unwrap().parse().unwrap();
        assert!(refusal.is_none_or(|r| retry == r || retry + 1 == r), "{limit}: Retry-After {retry}");
    }
}
