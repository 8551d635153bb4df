use crate::common::*;
use sluicegate::config::RouteId;

/// Issue 4's acceptance configuration, as written, each limit on its own route.
const CONFIG: &str = r#"
listen: 127.0.0.1:0
limits:
  fw: { key: ip, algorithm: fixed_window,   limit: 4, window: 1h }     # 4
  sl: { key: ip, algorithm: sliding_log,    limit: 4, window: 1h }     # 4
  sw: { key: ip, algorithm: sliding_window, limit: 4, window: 1h }     # 4
  tb: { key: ip, algorithm: token_bucket,   capacity: 4, refill: 1r/h } # 4
  gc: { key: ip, algorithm: gcra,           rate: 1r/h, burst: 3 }     # 4 (burst + 1, as nginx)
  mi: { key: ip, algorithm: min_interval,   interval: 1h }             # 1
  bn: { key: ip, rate: 1r/s, burst: 0, nodelay: true, ban: 1h }        # 1, then refused for an hour
routes:
  - { match: { path: /fw }, limits: [fw], respond: { status: 200 } }
  - { match: { path: /sl }, limits: [sl], respond: { status: 200 } }
  - { match: { path: /sw }, limits: [sw], respond: { status: 200 } }
  - { match: { path: /tb }, limits: [tb], respond: { status: 200 } }
  - { match: { path: /gc }, limits: [gc], respond: { status: 200 } }
  - { match: { path: /mi }, limits: [mi], respond: { status: 200 } }
  - { match: { path: /bn }, limits: [bn], respond: { status: 200 } }
"#;

/// Each algorithm's `Retry-After`, exactly, on a clock the test sets: the time after which
/// the refused request would pass, and the header that says it in whole seconds, rounded
/// up (never early).
#[test]
fn each_algorithm_says_exactly_when_a_refused_request_would_pass() {
    use sluicegate::clock::{ManualClock, Nanos};
    use sluicegate::gate::{Decision, Gate};
    use sluicegate::policy::key::KeySource;
    use std::time::Duration;

    const H: u64 = 3600;
    // 1234.5 s into an epoch-aligned hour.
    let into = Duration::from_millis(1_234_500);
    let config = sluicegate::config::parse(CONFIG, "algorithms.yaml").unwrap();
    let headers = http::HeaderMap::new();
    let src = KeySource::get([192, 0, 2, 1].into(), "/", &headers);
    for (route, burst, after) in [
        // The window reopens at the next hour.
        (0, 4, Duration::from_secs(H) - into),
        // The oldest of the four leaves the log an hour after it came.
        (1, 4, Duration::from_secs(H)),
        // Four in this window weigh 4·(1 − e/w) in the next: 3 fit a quarter into it.
        (2, 4, Duration::from_secs(H) - into + Duration::from_secs(H / 4)),
        // The bucket families: one unit back per hour.
        (3, 4, Duration::from_secs(H)),
        (4, 4, Duration::from_secs(H)),
        (5, 1, Duration::from_secs(H)),
        // The ban's length, not the rate's second.
        (6, 1, Duration::from_secs(H)),
    ] {
        let clock = ManualClock::new(Nanos(1_000_000 * H * 1_000_000_000 + into.as_nanos() as u64));
        let gate = Gate::new(&config, clock.clone().into());
        let limits = &config.routes[RouteId::from(route)].limits;
        for n in 0..burst {
            assert!(matches!(gate.check(limits, &src, 1), Decision::Pass { .. }), "route {route}: request {n}");
        }
        let Decision::Reject { retry_after, .. } = gate.check(limits, &src, 1) else {
            panic!("route {route} admitted")
        };
        assert_eq!(retry_after, after, "route {route}");
        // Just before, still refused; at that instant, admitted (a ban refuses until it ends).
        clock.advance(after - Duration::from_millis(1));
        assert!(matches!(gate.check(limits, &src, 1), Decision::Reject { .. }), "route {route}: early");
        clock.advance(Duration::from_millis(1));
        assert!(matches!(gate.check(limits, &src, 1), Decision::Pass { .. }), "route {route}: on time");
    }
}

/// Sends requests until the first rejection; returns how many passed and the rejection.
async fn admitted_at_once(sg: &Sluicegate, path: &str) -> (usize, Reply) {
    for passed in 0..10 {
        let reply = get(sg.addr, path, &[]).await;
        if reply.status != 200 {
            return (passed, reply);
        }
    }
    panic!("{path} never rejected");
}

/// `CONFIG` for the binary, which runs on the wall clock: the windows aligned to the
/// epoch are a year long (the longest there is), so that a run does not cross the start
/// of one between two requests, as it would cross an hour's once an hour.
fn on_the_wall_clock() -> String {
    CONFIG.replace("limit: 4, window: 1h", "limit: 4, window: 365d")
}

/// A year, the windows of `on_the_wall_clock`, in seconds.
const YEAR: u64 = 365 * 86_400;

#[tokio::test]
async fn each_algorithm_admits_its_documented_burst_then_rejects_with_headers() {
    let sg = Sluicegate::start(&on_the_wall_clock());
    for (path, expected, policy) in [
        ("/fw", 4, "\"fw\";q=4;w=31536000"),
        ("/sl", 4, "\"sl\";q=4;w=31536000"),
        ("/sw", 4, "\"sw\";q=4;w=31536000"),
        ("/tb", 4, "\"tb\";q=1;w=3600;burst=3"),
        ("/gc", 4, "\"gc\";q=1;w=3600;burst=3"),
        ("/mi", 1, "\"mi\";q=1;w=3600"),
    ] {
        let (passed, rejected) = admitted_at_once(&sg, path).await;
        assert_eq!(passed, expected, "{path}");
        assert_eq!(rejected.status, 429, "{path}");
        assert_eq!(rejected.header("ratelimit-policy"), Some(policy), "{path}");
        let retry: u64 = rejected.header("retry-after").unwrap().parse().unwrap();
        // The bucket families: an hour, the log a year, from a request made a moment
        // ago. The windows, from the wall clock's place in the year-long window (exactly
        // on the injected clock above; here within the seconds the test takes).
        let into = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() % YEAR;
        let expected = match path {
            "/fw" => YEAR - into,
            "/sw" => YEAR - into + YEAR / 4,
            "/sl" => YEAR,
            _ => 3600,
        };
        // (Unless a window began between the request and the reading of the clock.)
        let near_the_start = into < 10 && matches!(path, "/fw" | "/sw");
        assert!(
            near_the_start || (retry <= expected + 1 && retry + 5 >= expected),
            "{path}: Retry-After {retry}, {expected} expected"
        );
        assert!(rejected.header("ratelimit").unwrap().contains(";r=0;"), "{path}");
    }
}

/// Each route admits its number of immediate requests, and `bn` then refuses the key
/// for an hour.
#[tokio::test]
async fn the_acceptance_limits_admit_their_documented_counts() {
    let sg = Sluicegate::start(&on_the_wall_clock());
    for (path, expected) in [("/fw", 4), ("/sl", 4), ("/sw", 4), ("/tb", 4), ("/gc", 4), ("/mi", 1), ("/bn", 1)] {
        let (passed, _) = admitted_at_once(&sg, path).await;
        assert_eq!(passed, expected, "{path}");
    }
    // A second later the rate would admit again; the ban refuses, for the hour's rest
    // (the passing of time is what is tested).
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let banned = get(sg.addr, "/bn", &[]).await;
    assert_eq!(banned.status, 429);
    let retry: u64 = banned.header("retry-after").unwrap().parse().unwrap();
    assert!((3590..=3599).contains(&retry), "{retry}");
}
