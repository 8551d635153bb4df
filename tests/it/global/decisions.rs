//! Redis decides as the local limits do, request by request, and one budget holds for
//! every instance and every request that waits for Redis together.

use super::*;
use sluicegate::config::{LimitId, RouteId};

/// Limit `i` of the configuration.
fn id(i: usize) -> LimitId {
    LimitId::from(i)
}

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
            let call = || Call {
                limit: id(i),
                burst: None,
                count: None,
                base: store.base(id(i), u128::from(client.to_bits())),
                near: KeyHash(0),
            };
            for (n, (s, us)) in schedule(i as u64 * 31 + cost, 150).into_iter().enumerate() {
                clock.set(Nanos(s * 1_000_000_000 + us * 1000));
                let local = match gate.check(&[LimitUse::plain(id(i))], &src, cost) {
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
            let call = Call {
                limit: id(i),
                burst: None,
                count: None,
                base: store.base(id(i), u128::from(step.key)),
                near: KeyHash(0),
            };
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

/// Redis's `reset` matches the local one: until the full burst is back, one period after
/// the bucket drains, so `t` is never below `Retry-After`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_counts_until_the_full_burst_is_back() {
    let redis = Redis::start();
    let sg = Conf::new()
        .set("ratelimit_headers: all")
        .redis(&redis.url(), "timeout: 1s")
        .limit("l", "key: ip, rate: 2r/m, burst: 1, nodelay: true, scope: global, on_store_error: deny")
        .answering("l")
        .start();
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
    let sg = Conf::new()
        .set("ratelimit_headers: all")
        .redis(&redis.url(), "timeout: 1s")
        .limit("l", "key: ip, rate: 1r/m, burst: 3, nodelay: true, scope: global, on_store_error: deny")
        .route("limits: [l], cost_header: x-cost, respond: { status: 200 }")
        .start();
    let first = get(sg.addr, "/", &[("x-cost", "3")]).await;
    assert_eq!((first.status, first.header("ratelimit")), (200, Some("\"l\";r=1;t=180")));
    let refused = get(sg.addr, "/", &[("x-cost", "3")]).await;
    assert_eq!((refused.status, refused.header("retry-after")), (429, Some("120")));
    assert_eq!(refused.header("ratelimit"), Some("\"l\";r=1;t=180"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_admit_exactly_the_global_budget_between_them() {
    let redis = Redis::start();
    let conf = Conf::new()
        .redis(&redis.url(), "timeout: 1s")
        .limit(
            "shared",
            "key: \"header:x-key\", on_missing_key: skip, rate: 1r/m, burst: 9, nodelay: true, scope: global, on_store_error: deny",
        )
        .answering("shared");
    let (a, b) = (conf.start(), conf.start());
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
    let sg = Conf::new()
        .redis(&redis.url(), "timeout: 1s")
        .limit("big", "key: ip, rate: 1r/m, burst: 9, nodelay: true, scope: global")
        .limit("small", "key: ip, algorithm: sliding_log, limit: 2, window: 1h, scope: global")
        .limit("local", "key: ip, rate: 1r/m, burst: 9, nodelay: true")
        .route("match: { path: /both }, respond: { status: 200 }, limits: [big, small, local]")
        .route("match: { path: /big }, respond: { status: 200 }, limits: [big]")
        .route("match: { path: /local }, respond: { status: 200 }, limits: [local]")
        .start();
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
    let sg = Conf::new()
        .set("ratelimit_headers: all")
        .redis(&redis.url(), "timeout: 1s")
        .limit("l", "key: ip, rate: 1r/m, burst: 2, nodelay: true, scope: global")
        .route("limits: [l], cost_header: x-cost, respond: { status: 200 }")
        .start();
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
    let sg = Conf::new()
        .redis(&redis.url(), "timeout: 1s")
        .limit("l", "key: ip, rate: 1r/s, burst: 1, nodelay: true, scope: global")
        .route("limits: [l], cost_header: x-cost, respond: { status: 200 }")
        .start();
    assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
    assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
    assert_eq!(get(sg.addr, "/", &[]).await.status, 429, "one unit refused: now in the near-cache");
    let refused = get(sg.addr, "/", &[("x-cost", "2")]).await;
    assert_eq!((refused.status, refused.header("retry-after")), (429, Some("2")));
    // Obeying is the point of this test: the wait is the one the client was told.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(get(sg.addr, "/", &[("x-cost", "2")]).await.status, 200);
}

/// A global refusal takes back what the local limits admitted for the same request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_refusal_takes_back_local_admissions() {
    let redis = Redis::start();
    let sg = Conf::new()
        .redis(&redis.url(), "timeout: 1s, near_cache_keys: 0")
        .limit("local", "key: ip, rate: 1r/m, burst: 2, nodelay: true")
        .limit("global", "key: ip, algorithm: sliding_log, limit: 1, window: 1h, scope: global")
        .route("match: { path: /both }, respond: { status: 200 }, limits: [local, global]")
        .route("match: { path: /local }, respond: { status: 200 }, limits: [local]")
        .start();
    assert_eq!(futures_statuses(sg.addr, "/both", 4).await, [200, 429, 429, 429]);
    // Only the first request counted locally: two of three remain.
    assert_eq!(futures_statuses(sg.addr, "/local", 3).await, [200, 200, 429]);
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
        let sg = Conf::new()
            .set("ratelimit_headers: all")
            .admin()
            .redis(&redis.url(), "timeout: 10s, near_cache_keys: 0")
            .limit("shared", &format!("key: \"header:x-key\", on_missing_key: skip, {limit}, scope: global"))
            .answering("shared")
            .start();
        assert_eq!(get(sg.addr, "/", &[("x-key", "warm-up")]).await.status, 200);
        let evalsha_before = evalsha_calls(&redis);
        let calls_before = Metrics::of(&sg).await.value("sluicegate_redis_script_calls_total");
        // Frozen, Redis answers nothing: every request's decision waits until all are queued.
        redis.pause();
        let tasks: Vec<_> =
            (0..60).map(|_| tokio::spawn(async move { get(sg.addr, "/", &[("x-key", "team-1")]).await })).collect();
        wait_until(&format!("{limit}: every request at the store"), Duration::from_secs(10), async || {
            Metrics::of(&sg).await.value("sluicegate_redis_calls_total") >= 61.0
        })
        .await;
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
        let calls = Metrics::of(&sg).await.value("sluicegate_redis_script_calls_total");
        assert_eq!(calls, calls_before + shared as f64, "{limit}");
        // What the calls wrote is in Redis: the next request is refused too, for as long
        // (a ban's length, not the rate's minute; a window's end depends on the hour).
        let next = get(sg.addr, "/", &[("x-key", "team-1")]).await;
        assert_eq!(next.status, 429, "{limit}");
        let retry: u64 = next.header("retry-after").unwrap().parse().unwrap();
        assert!(refusal.is_none_or(|r| retry == r || retry + 1 == r), "{limit}: Retry-After {retry}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_weighted_request_leaves_the_other_global_limits_as_they_stand() {
    let redis = Redis::start();
    crate::limits::a_refused_weighted_request_leaves_the_other_limits_as_they_stand(Some(&redis.url())).await;
}

/// A route's own burst and delay on a global limit: Redis decides each entry with its
/// parameters on the limit's one state, as the local limiter does, request by request,
/// whichever entry each request comes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_and_redis_decide_a_limit_used_with_several_bursts_alike() {
    let redis = Redis::start();
    let yaml = format!(
        "listen: 127.0.0.1:0
redis: {{ url: \"{}\", timeout: 2s }}
limits:
  l: {{ key: ip, scope: global, rate: 10r/m, burst: 8, nodelay: true }}
routes:
  - {{ match: {{ path: /a }}, limits: [l], respond: {{ status: 200 }} }}
  - {{ match: {{ path: /b }}, limits: [{{ limit: l, burst: 2 }}], respond: {{ status: 200 }} }}
  - {{ match: {{ path: /c }}, limits: [{{ limit: l, burst: 5, delay: 3 }}], respond: {{ status: 200 }} }}
",
        redis.url()
    );
    let config = parse(&yaml, "test").unwrap();
    let clock = ManualClock::default();
    let gate = Gate::new(&config, clock.clone().into());
    let store = Arc::clone(gate.store().unwrap());
    let headers = HeaderMap::new();
    let (mut compared, mut refused, mut delayed) = (0, 0, 0);
    for cost in [1, 2] {
        let client = Ipv4Addr::new(10, 9, 0, cost as u8);
        let src = KeySource::get(IpAddr::V4(client), "/", &headers);
        for (n, (s, us)) in schedule(77 + cost, 200).into_iter().enumerate() {
            let route = &config.routes[RouteId::from(n % 3)];
            let used = route.limits[0];
            clock.set(Nanos(s * 1_000_000_000 + us * 1000));
            let local = match gate.check(&route.limits, &src, cost) {
                Decision::Pass { standings, .. } | Decision::Reject { standings, .. } => outcomes(&standings),
            };
            let call = Call {
                limit: id(0),
                burst: used.burst,
                count: None,
                base: store.base(id(0), u128::from(client.to_bits())),
                near: KeyHash(0),
            };
            let global = store.decide(&[call], cost, Some(RedisTime { secs: s, micros: us })).await.unwrap();
            assert_eq!(outcomes(&global.standings), local, "route {}, cost {cost}, request {n} at {s}.{us:06}", n % 3);
            refused += usize::from(local[0].0.is_rejected());
            delayed += usize::from(matches!(local[0].0, Outcome::Delayed(_)));
            compared += 1;
        }
    }
    assert!(compared == 400 && refused > 50 && delayed > 5, "{refused} refused, {delayed} delayed");
}
