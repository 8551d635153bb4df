use crate::common::*;

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

#[tokio::test]
async fn each_algorithm_admits_its_documented_burst_then_rejects_with_headers() {
    let sg = Sluicegate::start(CONFIG);
    for (path, expected, policy) in [
        ("/fw", 4, "\"fw\";q=4;w=3600"),
        ("/sl", 4, "\"sl\";q=4;w=3600"),
        ("/sw", 4, "\"sw\";q=4;w=3600"),
        ("/tb", 4, "\"tb\";q=1;w=3600"),
        ("/gc", 4, "\"gc\";q=1;w=3600"),
        ("/mi", 1, "\"mi\";q=1;w=3600"),
    ] {
        let (passed, rejected) = admitted_at_once(&sg, path).await;
        assert_eq!(passed, expected, "{path}");
        assert_eq!(rejected.status, 429, "{path}");
        assert_eq!(rejected.header("ratelimit-policy"), Some(policy), "{path}");
        let retry: u64 = rejected.header("retry-after").unwrap().parse().unwrap();
        // The token-bucket family refills one request per hour; the fixed window reopens
        // at the next epoch-aligned hour.
        // The sliding window also waits out part of the next window: up to two hours.
        assert!((1..=7200).contains(&retry), "{path}: Retry-After {retry}");
        assert!(rejected.header("ratelimit").unwrap().contains(";r=0;"), "{path}");
    }
}

/// Each route admits its number of immediate requests, and `bn` then refuses the key
/// for an hour.
#[tokio::test]
async fn the_acceptance_limits_admit_their_documented_counts() {
    let sg = Sluicegate::start(CONFIG);
    for (path, expected) in [("/fw", 4), ("/sl", 4), ("/sw", 4), ("/tb", 4), ("/gc", 4), ("/mi", 1), ("/bn", 1)] {
        let (passed, _) = admitted_at_once(&sg, path).await;
        assert_eq!(passed, expected, "{path}");
    }
    // A second later the rate would admit again; the ban refuses, for the hour's rest.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let banned = get(sg.addr, "/bn", &[]).await;
    assert_eq!(banned.status, 429);
    let retry: u64 = banned.header("retry-after").unwrap().parse().unwrap();
    assert!((3590..=3599).contains(&retry), "{retry}");
}
