//! What happens when Redis fails: killed under load, paused, its scripts flushed, or
//! not there at start. No request waits past the timeout; `on_store_error` decides.

use super::*;

/// Redis killed under load: no request waits past the timeout, each limit does as its
/// `on_store_error` says, one report line stands for many fallbacks, and Redis is used
/// again once it is back, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_under_load_then_restarted() {
    let mut redis = Redis::start();
    let yaml = format!(
        "listen: 127.0.0.1:0\nredis: {{ url: \"{}\", timeout: 100ms, breaker_failures: 3, breaker_cooldown: 200ms }}\nlimits:
  open: {{ key: ip, rate: 100000r/s, burst: 100000, nodelay: true, scope: global, on_store_error: allow }}
  closed: {{ key: ip, rate: 100000r/s, burst: 100000, nodelay: true, scope: global, on_store_error: deny }}
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
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
    let stop = Arc::new(AtomicBool::new(false));
    let (answered, denied) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
    let load: Vec<_> = (0..4)
        .map(|n| {
            let (addr, stop) = (sg.addr, Arc::clone(&stop));
            let (answered, denied) = (Arc::clone(&answered), Arc::clone(&denied));
            tokio::spawn(async move {
                let path = if n % 2 == 0 { "/open" } else { "/closed" };
                let mut seen = Vec::new();
                while !stop.load(Relaxed) {
                    let (status, _, took) = get_within(addr, path, Duration::from_secs(5)).await;
                    seen.push((path, status, took));
                    answered.fetch_add(1, Relaxed);
                    denied.fetch_or(status == 503, Relaxed);
                }
                seen
            })
        })
        .collect();
    wait_until("the load under way", Duration::from_secs(10), async || answered.load(Relaxed) >= 8).await;
    redis.kill();
    let at_kill = answered.load(Relaxed);
    // ...and until the failures have opened the circuit breaker (which the load's calls
    // to the dead Redis do, some timeouts in).
    wait_until("requests decided without Redis, the breaker open", Duration::from_secs(20), async || {
        answered.load(Relaxed) >= at_kill + 40 && denied.load(Relaxed) && sg.log().contains("circuit breaker open")
    })
    .await;
    stop.store(true, Relaxed);
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
    let log = sg.wait_for_log("the line \"circuit breaker open\"", |l| l.contains("circuit breaker open"));
    assert!(log.contains("circuit breaker open"), "{log}");
    let reports = log.matches("global limits without Redis").count();
    let fallbacks = seen.len() + 30;
    assert!((1..=2).contains(&reports), "{reports} report lines for {fallbacks} requests:\n{log}");

    redis.restart();
    wait_until("Redis used again", Duration::from_secs(15), async || {
        get(sg.addr, "/closed", &[]).await;
        redis.command(&["DBSIZE"]) != "0"
    })
    .await;
    assert_eq!(get(sg.addr, "/closed", &[]).await.status, 200);
    assert!(
        sg.wait_for_log("the line \"Redis answers again\"", |l| l.contains("Redis answers again"))
            .contains("Redis answers again")
    );
}

/// When Redis goes, a key's local twin goes on from the units Redis last said were
/// left (its share of them: all, for one instance), not from a fresh key's burst.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_twin_starts_from_what_redis_last_said() {
    let mut redis = Redis::start();
    let sg = Conf::new()
        .redis(&redis.url(), "timeout: 100ms")
        .limit("rate", "key: ip, rate: 1r/m, burst: 5, nodelay: true, scope: global, on_store_error: local")
        .limit("window", "key: ip, algorithm: fixed_window, limit: 6, window: 1d, scope: global, on_store_error: local")
        .route("match: { path: /rate }, respond: { status: 200 }, limits: [rate]")
        .route("match: { path: /window }, respond: { status: 200 }, limits: [window]")
        .start();
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
/// docs/global-limits.md states, `rate × F` per time `F` the instances decide locally (the pause, at
/// most a breaker cooldown and two timeouts more) plus the twins' starting units.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_keep_the_budget_through_redis_pauses() {
    const RATE: f64 = 50.0;
    let (timeout, cooldown) = (Duration::from_millis(20), Duration::from_millis(100));
    let redis = Redis::start();
    let conf = Conf::new()
        .redis(&redis.url(), "timeout: 20ms, breaker_cooldown: 100ms")
        .limit(
            "g",
            "key: ip, rate: 50r/s, burst: 20, nodelay: true, scope: global, on_store_error: local, instances: 3",
        )
        .answering("g");
    let instances = [conf.start(), conf.start(), conf.start()];
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
    let sg = Conf::new()
        .redis(&redis.url(), "timeout: 40ms, breaker_failures: 2, breaker_cooldown: 100ms")
        .limit("g", "key: ip, algorithm: fixed_window, limit: 1000, window: 1h, scope: global, on_store_error: allow")
        .answering("g")
        .start();
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
    wait_until("Redis used after SIGCONT", Duration::from_secs(10), async || {
        get(sg.addr, "/", &[]).await;
        count(&redis) > before
    })
    .await;
}

/// Redis paused while requests keep arriving: each is answered by its own deadline (the
/// timeout after it arrived), also those queued behind calls that Redis never answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_queued_behind_unanswered_calls_still_wait_one_timeout() {
    let redis = Redis::start();
    let sg = Conf::new()
        .redis(&redis.url(), "timeout: 300ms, breaker_failures: 100000")
        .limit("g", "key: ip, algorithm: fixed_window, limit: 1000, window: 1h, scope: global, on_store_error: allow")
        .answering("g")
        .start();
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
    let sg = Conf::new()
        .set("ratelimit_headers: all")
        .redis(&redis.url(), "timeout: 600ms, breaker_failures: 100000, near_cache_keys: 0")
        .limit("g", "key: \"header:x-key\", on_missing_key: skip, rate: 1r/m, burst: 9, nodelay: true, scope: global, on_store_error: allow")
        .answering("g")
        .start();
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
    let sg = Conf::new()
        .redis(&redis.url(), "timeout: 1s")
        .limit("g", "key: ip, rate: 1r/m, burst: 9, nodelay: true, scope: global, on_store_error: deny")
        .answering("g")
        .start();
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
    let sg = Conf::new()
        .redis(&redis.url(), "timeout: 30ms, breaker_cooldown: 100ms")
        .limit("g", "key: ip, rate: 1r/m, burst: 2, nodelay: true, scope: global, on_store_error: allow")
        .answering("g")
        .start();
    assert_eq!(futures_statuses(sg.addr, "/", 5).await, [200; 5]);
    redis.restart();
    wait_until("the global limit applied", Duration::from_secs(15), async || {
        get(sg.addr, "/", &[]).await.status == 429
    })
    .await;
}

/// Redis down under `on_store_error: deny` is not rate limiting: the 503 claims no limit
/// in its headers, the log says at warn what failed, the access log, the metrics and the
/// fallback summary count it as its own outcome, `/readyz` turns unready, and once Redis
/// is back requests are decided by it again within `breaker_cooldown` and a call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_under_deny_is_its_own_outcome_everywhere() {
    let mut redis = Redis::start();
    let dir = tempfile::tempdir().unwrap();
    let access = dir.path().join("access.log");
    let sg = Conf::new()
        .admin()
        .set("ratelimit_headers: all")
        .set(&format!("access_log: {{ format: json, path: \"{}\" }}", access.display()))
        // Two failures open the breaker, however fast they come (refused connections fail
        // in a millisecond).
        .redis(&redis.url(), "timeout: 100ms, breaker_failures: 2, breaker_window: 0s, breaker_cooldown: 300ms")
        .limit("by_key", "key: ip, rate: 100r/s, burst: 100, nodelay: true, scope: global, on_store_error: deny")
        .answering("by_key")
        .start();
    let admin = sg.admin_addr();
    assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
    let ready = get(admin, "/readyz", &[]).await;
    assert_eq!((ready.status, ready.text().as_str()), (200, "ready; Redis answers\n"));

    redis.kill();
    for _ in 0..4 {
        let refused = get(sg.addr, "/", &[]).await;
        assert_eq!((refused.status, refused.header("retry-after")), (503, Some("1")));
        assert_eq!(
            (refused.header("ratelimit"), refused.header("ratelimit-policy")),
            (None, None),
            "no limit refused it"
        );
    }
    let ready = get(admin, "/readyz", &[]).await;
    assert_eq!(ready.status, 503, "{}", ready.text());
    assert!(ready.text().contains("by_key refuse with 503 (on_store_error: deny)"), "{}", ready.text());
    let log = sg.wait_for_log("the line \"request refused: Redis could not decide\"", |l| {
        l.contains("request refused: Redis could not decide")
    });
    let line =
        log.lines().find(|l| l.contains("request refused: Redis could not decide")).unwrap_or_else(|| panic!("{log}"));
    assert!(
        line.contains("\"level\":\"WARN\"") && line.contains("\"limit\":\"by_key\"") && line.contains("\"error\":"),
        "{line}"
    );
    assert!(!log.contains("\"request rejected\""), "logged as a limit's rejection:\n{log}");
    let summary = log.lines().find(|l| l.contains("global limits without Redis")).unwrap_or_else(|| panic!("{log}"));
    assert!(!summary.contains("\"denied\":0"), "the first summary counts its own request: {summary}");
    let m = Metrics::of(&sg).await;
    assert_eq!(m.value("sluicegate_requests_total{route=\"routes[0]\",outcome=\"store_error\"}"), 4.0);
    assert_eq!(m.value("sluicegate_requests_total{route=\"routes[0]\",outcome=\"rejected\"}"), 0.0);
    assert_eq!(m.value("sluicegate_limit_decisions_total{limit=\"by_key\",outcome=\"rejected\"}"), 0.0);
    let lines = crate::logs::access_lines(&access, 5);
    assert_eq!(lines.iter().filter(|l| l.contains("\"outcome\":\"store_error\"")).count(), 4, "{lines:#?}");

    // Back: decided by Redis again within the breaker's cooldown and one call (bounded
    // here with a loaded machine's second).
    redis.restart();
    let back = std::time::Instant::now();
    wait_until("Redis deciding again", Duration::from_secs(10), async || get(sg.addr, "/", &[]).await.status == 200)
        .await;
    assert!(back.elapsed() < Duration::from_millis(300 + 100 + 1000), "{:?}", back.elapsed());
    assert_eq!(get(admin, "/readyz", &[]).await.status, 200);
}

/// An instance that `/readyz` took out of rotation gets no requests, so no request can
/// find Redis back: a probe in the background does, and the instance is ready again
/// within the probe interval (`breaker_cooldown`), with no request at all. Likewise an
/// instance started while Redis is away is not ready before its first request (it
/// probes at start). The body says since when Redis is away, and its last error; an
/// instance whose global limits `allow` or decide `local`ly stays ready, degraded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_out_of_rotation_is_ready_again_once_redis_answers() {
    let mut redis = Redis::start();
    let url = redis.url();
    let deny = || {
        Conf::new()
            .admin()
            .redis(&url, "timeout: 1s")
            .limit("g", "key: ip, rate: 100r/s, burst: 100, scope: global, on_store_error: deny")
            .answering("g")
    };
    let early = deny().start();
    let open = Conf::new()
        .admin()
        .redis(&url, "timeout: 1s")
        .limit("a", "key: ip, rate: 100r/s, burst: 100, scope: global, on_store_error: allow")
        .limit("t", "key: ip, rate: 100r/s, burst: 100, scope: global, on_store_error: local")
        .answering("a, t")
        .start();
    let readyz = async |sg: &Sluicegate| {
        let reply = get(sg.admin_addr(), "/readyz", &[]).await;
        (reply.status, reply.text())
    };
    assert_eq!(get(early.addr, "/", &[]).await.status, 200);
    redis.kill();
    // Requests find Redis gone and open the breaker.
    wait_until("the instance out of rotation", Duration::from_secs(10), async || {
        get(early.addr, "/", &[]).await;
        readyz(&early).await.0 == 503
    })
    .await;
    let (_, body) = readyz(&early).await;
    assert!(body.contains("since 20") && body.contains("probed every 1s") && body.contains("last error: "), "{body}");
    wait_until("the other instance's breaker open", Duration::from_secs(10), async || {
        get(open.addr, "/", &[]).await;
        readyz(&open).await.1.contains("unreachable since")
    })
    .await;
    let (status, body) = readyz(&open).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("ready, degraded: "), "{body}");
    // Started now, it knows before any request.
    let late = deny().start();
    wait_until("the start-up probe's failure", Duration::from_secs(10), async || readyz(&late).await.0 == 503).await;

    redis.restart();
    for sg in [&early, &late, &open] {
        wait_until("ready again, with no request", Duration::from_secs(10), async || {
            readyz(sg).await == (200, "ready; Redis answers\n".into())
        })
        .await;
        assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
    }
}

/// docs/global-limits.md: once Redis answers again, requests are decided by it within one probe
/// interval (`breaker_cooldown`), plus a reconnection. The probe that finds Redis back
/// reconnects and succeeds; a request that probed in its place found the connection the
/// outage broke, failed, and kept the breaker open one more interval: Redis was seen one
/// to two intervals late (about 1.5 s with the default 1 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_decided_by_redis_again_within_one_probe_interval() {
    const PROBE_EVERY: Duration = Duration::from_secs(2);
    // The reconnection (milliseconds here) and the 10 ms polling below, on a busy machine.
    const SLACK: Duration = Duration::from_millis(500);
    let mut redis = Redis::start();
    let sg = Conf::new()
        .admin()
        .redis(&redis.url(), "timeout: 1s, breaker_cooldown: 2s")
        .limit("g", "key: ip, rate: 100r/s, burst: 100, scope: global, on_store_error: deny")
        .answering("g")
        .start();
    assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
    redis.kill();
    wait_until("the breaker open", Duration::from_secs(10), async || {
        assert_eq!(get(sg.addr, "/", &[]).await.status, 503);
        Metrics::of(&sg).await.value("sluicegate_redis_breaker_open") == 1.0
    })
    .await;
    // Redis comes back between two probes, once the connection attempts that the
    // failures started are over. Placement, not synchronization: the bound holds
    // wherever Redis comes back; here a request that probes finds a broken connection.
    tokio::time::sleep(PROBE_EVERY / 4).await;
    redis.restart();
    let back = Instant::now();
    wait_until("a request decided by Redis", Duration::from_secs(10), async || {
        get(sg.addr, "/", &[]).await.status == 200
    })
    .await;
    let took = back.elapsed();
    assert!(took <= PROBE_EVERY + SLACK, "admitted {took:?} after Redis came back; probes every {PROBE_EVERY:?}");
}
