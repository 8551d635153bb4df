use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::Full;

use crate::common::*;

/// The configuration of the foundation issue's acceptance, on ephemeral ports.
fn acceptance(backend: &Backend) -> String {
    format!(
        r#"
listen: 127.0.0.1:0
trusted_proxies: [127.0.0.1/32]
upstreams:
  backend: {{ servers: ["{}"] }}
limits:
  per_ip: {{ key: ip, rate: 5r/s, burst: 2, nodelay: true }}   # 3 at once, then 5 per second
routes:
  - match: {{ path_prefix: /static }}
    respond: {{ status: 200, body: "hello\n" }}
  - match: {{ path_prefix: / }}
    upstream: backend
    limits: [per_ip]
"#,
        backend.addr
    )
}

#[tokio::test]
async fn burst_passes_then_429_with_retry_after_then_passes_again() {
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&acceptance(&backend));
    assert_eq!(get(sg.addr, "/static", &[]).await.text(), "hello\n");
    for _ in 0..3 {
        assert_eq!(get(sg.addr, "/x", &[]).await.status, 200);
    }
    let rejected = get(sg.addr, "/x", &[]).await;
    assert_eq!(rejected.status, 429);
    let retry: u64 = rejected.header("retry-after").unwrap().parse().unwrap();
    assert!(retry >= 1);
    assert_eq!(rejected.header("ratelimit-policy"), Some("\"per_ip\";q=5;w=1;burst=2"));
    assert!(rejected.header("ratelimit").unwrap().starts_with("\"per_ip\";r=0;t="));
    assert_eq!(backend.hits().len(), 3, "a rejected request reached the upstream");
    // Another client behind the trusted proxy is unaffected.
    assert_eq!(get(sg.addr, "/x", &[("x-forwarded-for", "192.0.2.7")]).await.status, 200);
    // Retry-After is a promise: waiting that long is enough.
    tokio::time::sleep(Duration::from_secs(retry)).await;
    assert_eq!(get(sg.addr, "/x", &[]).await.status, 200);
}

#[tokio::test]
async fn spoofed_leftmost_forwarded_for_does_not_change_the_key() {
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&acceptance(&backend));
    let mut statuses = Vec::new();
    for i in 0..5 {
        let xff = format!("203.0.113.{i}, 192.0.2.50");
        statuses.push(get(sg.addr, "/x", &[("x-forwarded-for", &xff)]).await.status);
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
}

fn keyed(extra_limit: &str, routes: &str) -> String {
    format!(
        "listen: 127.0.0.1:0\nlimits:\n  by_key: {{ key: \"header:x-key\", on_missing_key: skip, rate: 1r/m, burst: 1, nodelay: true }}\n{extra_limit}\nroutes:\n{routes}"
    )
}

const STATIC: &str = "    respond: { status: 200, body: ok }\n";

#[tokio::test]
async fn keys_are_independent_and_a_missing_key_is_not_counted() {
    let sg = Sluicegate::start(&keyed("", &format!("  - limits: [by_key]\n{STATIC}")));
    let mut seen = Vec::new();
    for key in ["a", "a", "a", "b", "b", "b"] {
        seen.push(get(sg.addr, "/", &[("x-key", key)]).await.status);
    }
    assert_eq!(seen, [200, 200, 429, 200, 200, 429]);
    for _ in 0..5 {
        assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
    }
}

#[tokio::test]
async fn routes_with_their_own_limits_are_independent() {
    let routes = format!(
        "  - match: {{ path_prefix: /a }}\n    limits: [by_key]\n{STATIC}  - match: {{ path_prefix: /b }}\n    limits: [other]\n{STATIC}"
    );
    let sg = Sluicegate::start(&keyed(
        "  other: { key: \"header:x-key\", on_missing_key: skip, rate: 1r/m, nodelay: true }",
        &routes,
    ));
    let statuses = [
        get(sg.addr, "/a", &[("x-key", "k")]).await.status,
        get(sg.addr, "/a", &[("x-key", "k")]).await.status,
        get(sg.addr, "/a", &[("x-key", "k")]).await.status,
        get(sg.addr, "/b", &[("x-key", "k")]).await.status,
        get(sg.addr, "/b", &[("x-key", "k")]).await.status,
    ];
    assert_eq!(statuses, [200, 200, 429, 200, 429]);
}

#[tokio::test]
async fn a_request_rejected_by_one_limit_consumes_no_quota_of_another() {
    // /both is limited per client address and per key; /key only per key.
    let routes = format!(
        "  - match: {{ path_prefix: /both }}\n    limits: [per_ip, by_key]\n{STATIC}  - match: {{ path_prefix: /key }}\n    limits: [by_key]\n{STATIC}"
    );
    let sg = Sluicegate::start(&keyed("  per_ip: { key: ip, rate: 1r/m, nodelay: true }", &routes));
    assert_eq!(get(sg.addr, "/both", &[("x-key", "k1")]).await.status, 200);
    // per_ip rejects these, so key k2 must keep its whole quota (burst 1: two requests).
    for _ in 0..3 {
        assert_eq!(get(sg.addr, "/both", &[("x-key", "k2")]).await.status, 429);
    }
    let after: Vec<u16> = [
        get(sg.addr, "/key", &[("x-key", "k2")]).await.status,
        get(sg.addr, "/key", &[("x-key", "k2")]).await.status,
        get(sg.addr, "/key", &[("x-key", "k2")]).await.status,
    ]
    .into();
    assert_eq!(after, [200, 200, 429]);
}

#[tokio::test]
async fn rejection_status_is_configurable_and_headers_can_come_on_every_response() {
    let sg = Conf::new()
        .set("ratelimit_headers: all")
        .limit("l", "key: ip, rate: 2r/m, burst: 1, nodelay: true, status: 503")
        .route("limits: [l], respond: { status: 200, body: ok }")
        .start();
    let first = get(sg.addr, "/", &[]).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.header("ratelimit-policy"), Some("\"l\";q=2;w=60;burst=1"));
    // `t`: until the full burst is back, one period after the bucket drains.
    assert_eq!(first.header("ratelimit"), Some("\"l\";r=1;t=30"));
    let second = get(sg.addr, "/", &[]).await;
    assert_eq!(second.header("ratelimit"), Some("\"l\";r=0;t=60"));
    let third = get(sg.addr, "/", &[]).await;
    assert_eq!(third.status, 503);
    assert_eq!(third.header("retry-after"), Some("30"));
    assert_eq!(third.header("ratelimit"), Some("\"l\";r=0;t=60"));
}

/// With `burst` left out, a refusal's `t` is never below its own `Retry-After`.
#[tokio::test]
async fn reset_is_never_below_retry_after_without_a_burst() {
    let sg = Conf::new().set("ratelimit_headers: all").limit("l", "key: ip, rate: 2r/m").answering("l").start();
    let first = get(sg.addr, "/", &[]).await;
    assert_eq!((first.status, first.header("ratelimit")), (200, Some("\"l\";r=0;t=30")));
    let refused = get(sg.addr, "/", &[]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("retry-after"), Some("30"));
    assert_eq!(refused.header("ratelimit"), Some("\"l\";r=0;t=30"));
}

#[tokio::test]
async fn delayed_burst_reaches_the_upstream_spaced_by_the_rate() {
    let backend = Backend::start().await;
    let sg = Conf::new().upstream(&backend).limit("l", "key: ip, rate: 10r/s, burst: 3").forwarding("l").start();
    let addr = sg.addr;
    let sent = Instant::now();
    let requests: Vec<_> = (0..5).map(|_| tokio::spawn(async move { get(addr, "/", &[]).await.status })).collect();
    let mut statuses = Vec::new();
    for r in requests {
        statuses.push(r.await.unwrap());
    }
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 200, 200, 200, 429]);
    let mut at: Vec<Instant> = backend.hits().iter().map(|h| h.at).collect();
    at.sort();
    // The first decision comes after `sent`, and the limiter releases the k-th request k
    // periods after it: never earlier, whatever the machine does. A stalled machine
    // only makes them later (bounded generously: the point is that they were held).
    for (k, at) in at.iter().enumerate() {
        let after = *at - sent;
        let due = Duration::from_millis(100) * k as u32;
        assert!(
            after >= due && after < due + Duration::from_secs(2),
            "request {k} reached the upstream after {after:?}"
        );
    }
}

#[tokio::test]
async fn client_that_leaves_while_queued_never_reaches_the_upstream() {
    let backend = Backend::start().await;
    let sg = Conf::new().upstream(&backend).limit("l", "key: ip, rate: 2r/s, burst: 5").forwarding("l").start();
    assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
    // The next request is queued for 500 ms; the client gives up once it is.
    let addr = sg.addr;
    let queued = tokio::spawn(async move {
        send(addr, Request::get("/").header("host", "test.local").body(Full::new(Bytes::new())).unwrap()).await
    });
    wait_until("the request queued", Duration::from_secs(10), async || sg.log().contains("request delayed")).await;
    queued.abort();
    // Past the instant it would have been released, the upstream has still seen one request.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(backend.hits().len(), 1);
}

#[tokio::test]
async fn ipv6_clients_share_their_64_and_prefixes_are_configurable() {
    let sg = Conf::new().behind_proxy().limit("l", "key: ip, rate: 1r/m, ipv4_prefix: 24").answering("l").start();
    let from = |ip: &'static str| [("x-forwarded-for", ip)];
    assert_eq!(get(sg.addr, "/", &from("2001:db8:1:2::1")).await.status, 200);
    assert_eq!(get(sg.addr, "/", &from("2001:db8:1:2:aaaa::1")).await.status, 429);
    assert_eq!(get(sg.addr, "/", &from("2001:db8:1:3::1")).await.status, 200);
    assert_eq!(get(sg.addr, "/", &from("192.0.2.1")).await.status, 200);
    assert_eq!(get(sg.addr, "/", &from("192.0.2.200")).await.status, 429);
    assert_eq!(get(sg.addr, "/", &from("192.0.3.1")).await.status, 200);
}

#[tokio::test]
async fn legacy_headers_and_problem_json_rejections_on_request() {
    let sg = Conf::new()
        .set("ratelimit_header_style: both")
        .set("rejection_body: problem_json")
        .limit("per_ip", "key: ip, rate: 1r/m")
        .limit("watch", "key: ip, rate: 1r/m, dry_run: true")
        .answering("per_ip, watch")
        .start();
    assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
    let r = get(sg.addr, "/", &[]).await;
    assert_eq!(r.status, 429);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(body["status"], 429);
    // Only enforced limits are named: the dry-run one rejected nothing.
    assert_eq!(body["violated_limits"], serde_json::json!(["per_ip"]));
    assert_eq!(body["retry_after"].as_u64().map(|s| s >= 59), Some(true));
    assert_eq!(r.header("x-ratelimit-limit"), Some("1"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    assert!(r.header("ratelimit-policy").unwrap().contains("\"per_ip\";q=1;w=60"));
}

/// A limit with `headers: hidden` is shown to no client: the responses it decides carry
/// the shown limits only (in both styles, and it is never the tightest), its own refusal
/// says `Retry-After` alone (no rate-limit field, no limit named in its body), and a
/// shown limit's refusal beside it names the shown one only. `/config` says which is which.
#[tokio::test]
async fn a_hidden_limit_is_in_no_header_and_its_refusal_says_only_retry_after() {
    let conf = |quota: &str, flood: &str| {
        Conf::new()
            .admin()
            .set("ratelimit_headers: all")
            .set("ratelimit_header_style: both")
            .set("rejection_body: problem_json")
            .limit("quota", &format!("key: ip, rate: {quota}"))
            .limit("flood", &format!("key: ip, rate: {flood}, headers: hidden"))
            .answering("quota, flood")
            .start()
    };
    let sg = conf("100r/m, burst: 50", "2r/m");
    let first = get(sg.addr, "/", &[]).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.header("ratelimit-policy"), Some("\"quota\";q=100;w=60;burst=50"));
    assert_eq!(first.header("ratelimit"), Some("\"quota\";r=50;t=1"));
    // `flood` has none left, `quota` 50: the legacy fields describe `quota`.
    assert_eq!((first.header("x-ratelimit-limit"), first.header("x-ratelimit-remaining")), (Some("100"), Some("50")));
    let refused = get(sg.addr, "/", &[]).await;
    assert_eq!((refused.status, refused.header("retry-after")), (429, Some("30")));
    for field in ["ratelimit-policy", "ratelimit", "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"] {
        assert_eq!(refused.header(field), None, "{field}");
    }
    let body: serde_json::Value = serde_json::from_slice(&refused.body).unwrap();
    assert_eq!(body["violated_limits"], serde_json::json!([]));
    let config: serde_json::Value = serde_json::from_slice(&get(sg.admin_addr(), "/config", &[]).await.body).unwrap();
    let shown = |name: &str| {
        config["limits"].as_array().unwrap().iter().find(|l| l["name"] == name).unwrap()["headers"].clone()
    };
    assert_eq!((shown("quota"), shown("flood")), ("shown".into(), "hidden".into()));

    let sg = conf("1r/m", "100r/m");
    assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
    let refused = get(sg.addr, "/", &[]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("ratelimit-policy"), Some("\"quota\";q=1;w=60"));
    assert_eq!(refused.header("ratelimit"), Some("\"quota\";r=0;t=60"));
    let body: serde_json::Value = serde_json::from_slice(&refused.body).unwrap();
    assert_eq!(body["violated_limits"], serde_json::json!(["quota"]));
}

#[tokio::test]
async fn a_banned_key_is_refused_for_the_ban_while_others_pass() {
    let sg = Conf::new()
        .behind_proxy()
        .limit("bn", "key: ip, rate: 20r/s, nodelay: true, ban: 1h")
        .route("name: login, limits: [bn], respond: { status: 200 }")
        .start();
    let from = |ip: &'static str| [("x-forwarded-for", ip)];
    assert_eq!(get(sg.addr, "/", &from("192.0.2.1")).await.status, 200);
    let banned = get(sg.addr, "/", &from("192.0.2.1")).await;
    assert_eq!((banned.status, banned.header("retry-after")), (429, Some("3600")));
    // The rate alone would admit again after 50 ms; the ban does not.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let still = get(sg.addr, "/", &from("192.0.2.1")).await;
    assert_eq!(still.status, 429);
    let retry: u64 = still.header("retry-after").unwrap().parse().unwrap();
    assert!((3599..=3600).contains(&retry), "{retry}");
    assert_eq!(get(sg.addr, "/", &from("192.0.2.2")).await.status, 200);
    let log = sg.wait_for_log("the line \"key banned\"", |log| log.contains("key banned"));
    let line = log.lines().find(|l| l.contains("key banned")).unwrap();
    assert!(line.contains("\"route\":\"login\"") && line.contains("\"ban_ms\":3600000"), "{line}");
}

#[tokio::test]
async fn allow_lists_exempt_requests_from_a_route_or_from_one_limit() {
    let yaml = r#"
listen: 127.0.0.1:0
trusted_proxies: [127.0.0.1]
limits:
  per_ip: { key: ip, rate: 1r/m }
  per_token: { key: bearer, on_missing_key: skip, rate: 1r/m, allow: { tokens: [partner] } }
routes:
  - match: { path_prefix: /a }
    limits: [per_ip]
    allow: { cidrs: [10.0.0.0/8], headers: { x-internal: "yes" } }
    respond: { status: 200 }
  - match: { path_prefix: /b }
    limits: [per_token]
    respond: { status: 200 }
"#;
    let sg = Sluicegate::start(yaml);
    let statuses = |replies: Vec<Reply>| replies.iter().map(|r| r.status).collect::<Vec<_>>();
    let mut replies = Vec::new();
    for headers in [
        vec![("x-forwarded-for", "192.0.2.1")],
        vec![("x-forwarded-for", "192.0.2.1")],
        vec![("x-forwarded-for", "10.1.1.1")],
        vec![("x-forwarded-for", "10.1.1.1")],
        vec![("x-forwarded-for", "192.0.2.1"), ("x-internal", "yes")],
    ] {
        replies.push(get(sg.addr, "/a", &headers).await);
    }
    assert_eq!(statuses(replies), [200, 429, 200, 200, 200]);
    let mut replies = Vec::new();
    for token in ["Bearer someone", "Bearer someone", "Bearer partner", "Bearer partner"] {
        replies.push(get(sg.addr, "/b", &[("authorization", token)]).await);
    }
    assert_eq!(statuses(replies), [200, 429, 200, 200]);
}

#[tokio::test]
async fn several_windows_on_one_key_report_one_policy_item_each() {
    let sg = Conf::new().limit("api", "key: ip, rates: [2r/s, 3r/h]").answering("api").start();
    assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
    assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
    let r = get(sg.addr, "/", &[]).await;
    assert_eq!(r.status, 429);
    assert_eq!(r.header("ratelimit-policy"), Some("\"api/1s\";q=2;w=1;burst=1, \"api/1h\";q=3;w=3600;burst=2"));
    assert!(
        r.header("ratelimit").unwrap().starts_with("\"api/1s\";r=0;t=1, \"api/1h\";r=1;t="),
        "{:?}",
        r.header("ratelimit")
    );
}

#[tokio::test]
async fn weighted_requests_spend_their_cost_and_a_cost_that_never_fits_is_a_400() {
    let sg = Conf::new()
        .limit("tokens", "key: ip, algorithm: token_bucket, capacity: 10, refill: 1r/h")
        .route("cost_header: x-cost, limits: [tokens], respond: { status: 200 }")
        .start();
    let mut statuses = Vec::new();
    for cost in ["4", "4", "4", "2"] {
        statuses.push(get(sg.addr, "/", &[("x-cost", cost)]).await.status);
    }
    // 4 + 4 pass; the third 4 does not fit the 2 left and spends nothing; 2 does.
    assert_eq!(statuses, [200, 200, 429, 200]);
    let never = get(sg.addr, "/", &[("x-cost", "11")]).await;
    assert_eq!(never.status, 400);
    assert!(
        never.text().contains("a cost of 11 can never fit limit \"tokens\", which admits at most 10 at once"),
        "{}",
        never.text()
    );
    assert_eq!(get(sg.addr, "/", &[("x-cost", "lots")]).await.status, 400);
    assert_eq!(get(sg.addr, "/", &[("x-cost", "0")]).await.status, 400);
}

#[tokio::test]
async fn only_counted_responses_spend_quota() {
    let backend = Backend::start().await;
    let sg = Conf::new()
        .upstream(&backend)
        .limit("login", "key: ip, algorithm: sliding_log, limit: 2, window: 1h, count: [401]")
        .forwarding("login")
        .start();
    let mut statuses = Vec::new();
    for path in
        ["/status/200", "/status/200", "/status/200", "/status/401", "/status/200", "/status/401", "/status/200"]
    {
        statuses.push(get(sg.addr, path, &[]).await.status);
    }
    // Successes are free; the second failure spends the quota, and the key is refused.
    assert_eq!(statuses, [200, 200, 200, 401, 200, 401, 429]);
    assert_eq!(backend.hits().len(), 6, "the refused request reached the upstream");
}

#[tokio::test]
async fn an_override_gives_matching_keys_their_own_limit() {
    let yaml = r#"
listen: 127.0.0.1:0
limits:
  per_token:
    key: bearer
    on_missing_key: skip
    rate: 1r/m
    overrides: [ { match: { tokens: [gold-1] }, use: gold } ]
  gold: { key: bearer, on_missing_key: skip, algorithm: token_bucket, capacity: 3, refill: 1r/m }
routes:
  - limits: [per_token]
    respond: { status: 200 }
"#;
    let sg = Sluicegate::start(yaml);
    let as_token = |token: &'static str| [("authorization", token)];
    assert_eq!(get(sg.addr, "/", &as_token("Bearer basic")).await.status, 200);
    let basic = get(sg.addr, "/", &as_token("Bearer basic")).await;
    assert_eq!((basic.status, basic.header("ratelimit-policy")), (429, Some("\"per_token\";q=1;w=60")));
    for _ in 0..3 {
        assert_eq!(get(sg.addr, "/", &as_token("Bearer gold-1")).await.status, 200);
    }
    let gold = get(sg.addr, "/", &as_token("Bearer gold-1")).await;
    assert_eq!((gold.status, gold.header("ratelimit-policy")), (429, Some("\"gold\";q=1;w=60;burst=2")));
}

#[tokio::test]
async fn a_cost_too_large_for_an_override_target_is_refused_before_any_algorithm() {
    let yaml = r#"
listen: 127.0.0.1:0
limits:
  base:
    key: bearer
    on_missing_key: skip
    algorithm: sliding_window
    limit: 100
    window: 1m
    overrides: [ { match: { tokens: [small] }, use: small } ]
  small: { key: bearer, on_missing_key: skip, algorithm: sliding_log, limit: 3, window: 1m }
routes:
  - cost_header: x-cost
    limits: [base]
    respond: { status: 200 }
"#;
    let sg = Sluicegate::start(yaml);
    for cost in ["5", "18446744073709551615"] {
        let r = get(sg.addr, "/", &[("authorization", "Bearer small"), ("x-cost", cost)]).await;
        assert_eq!(r.status, 400, "cost {cost}");
    }
    assert_eq!(get(sg.addr, "/", &[("authorization", "Bearer small"), ("x-cost", "3")]).await.status, 200);
}

/// A refused weighted request reports the units still left, not 0.
#[tokio::test]
async fn a_refused_weighted_request_reports_the_units_left() {
    let sg = Conf::new()
        .set("ratelimit_headers: all")
        .limit("l", "key: ip, rate: 1r/m, burst: 3, nodelay: true")
        .route("limits: [l], cost_header: x-cost, respond: { status: 200 }")
        .start();
    let first = get(sg.addr, "/", &[("x-cost", "3")]).await;
    assert_eq!((first.status, first.header("ratelimit")), (200, Some("\"l\";r=1;t=180")));
    let refused = get(sg.addr, "/", &[("x-cost", "3")]).await;
    assert_eq!((refused.status, refused.header("retry-after")), (429, Some("120")));
    assert_eq!(refused.header("ratelimit"), Some("\"l\";r=1;t=180"));
}

/// The limits of `scope` (`local`, or `global` on `redis`) that would have admitted a
/// weighted request another limit refused say where the key stands, as the request did
/// not count: their units and their reset, in every algorithm.
pub(crate) async fn a_refused_weighted_request_leaves_the_other_limits_as_they_stand(redis: Option<&str>) {
    let (scope, store) = match redis {
        Some(url) => (", scope: global, on_store_error: deny", format!("redis: {{ url: \"{url}\", timeout: 1s }}\n")),
        None => ("", String::new()),
    };
    // The windows aligned to the epoch are a year long: a run across the start of an
    // hour-long one would see it emptied between two requests.
    let yaml = format!(
        "listen: 127.0.0.1:0\nratelimit_headers: all\n{store}limits:
  bucket: {{ key: ip, algorithm: token_bucket, capacity: 10, refill: 1r/h{scope} }}
  fixed: {{ key: ip, algorithm: fixed_window, limit: 10, window: 365d{scope} }}
  sliding: {{ key: ip, algorithm: sliding_window, limit: 10, window: 365d{scope} }}
  log: {{ key: ip, algorithm: sliding_log, limit: 10, window: 1h{scope} }}
  slow: {{ key: ip, rate: 1r/h, burst: 3, nodelay: true{scope} }}
routes:
  - cost_header: x-cost
    limits: [bucket, fixed, sliding, log, slow]
    respond: {{ status: 200 }}
"
    );
    let sg = Sluicegate::start(&yaml);
    let first = get(sg.addr, "/", &[("x-cost", "2")]).await;
    assert_eq!(first.status, 200);
    let before = first.header("ratelimit").unwrap().to_owned();
    // `slow` has 2 units left: 3 are refused, and nothing is taken anywhere.
    let refused = get(sg.addr, "/", &[("x-cost", "3")]).await;
    assert_eq!(refused.status, 429);
    let after = refused.header("ratelimit").unwrap();
    let item = |header: &str, name: &str| {
        header.split(", ").find(|i| i.starts_with(&format!("\"{name}\""))).map(str::to_owned)
    };
    assert_eq!(item(&before, "bucket").as_deref(), Some("\"bucket\";r=8;t=7200"), "{before}");
    for name in ["bucket", "fixed", "sliding", "log"] {
        let (was, is) = (item(&before, name).unwrap(), item(after, name).unwrap());
        // `t` may have moved on by the second between the two requests, not up.
        let (was_r, is_r) = (was.split(";t=").next().unwrap(), is.split(";t=").next().unwrap());
        assert_eq!(is_r, was_r, "{name}: {before} then {after}");
        let t = |i: &str| i.rsplit("t=").next().unwrap().parse::<u64>().unwrap();
        assert!(t(&is) <= t(&was) && t(&is) + 2 >= t(&was), "{name}: {before} then {after}");
    }
    assert_eq!(item(after, "slow").as_deref(), Some("\"slow\";r=2;t=7200"), "{after}");
    // And nothing was taken: 8 units pass in `bucket`, 2 in `slow`.
    assert_eq!(get(sg.addr, "/", &[("x-cost", "2")]).await.status, 200);
}

#[tokio::test]
async fn a_refused_weighted_request_leaves_the_other_local_limits_as_they_stand() {
    a_refused_weighted_request_leaves_the_other_limits_as_they_stand(None).await;
}

/// A limit with several windows is one limit in every reader, once per request: one log
/// line per refusal, one decision, one decision for a banned key, and a key its windows'
/// tables all drop is one eviction.
#[tokio::test]
async fn several_windows_count_once_per_request_everywhere() {
    const MAX_KEYS: usize = 100;
    const FRESH: usize = 300;
    let yaml = format!(
        "listen: 127.0.0.1:0
admin: {{ listen: 127.0.0.1:0 }}
trusted_proxies: [127.0.0.1]
limits:
  multi: {{ key: ip, rates: [1r/m, 1r/h], log_lines_per_second: 100, max_keys: {MAX_KEYS} }}
  banned: {{ key: ip, rates: [1r/m, 1r/h], ban: 1h }}
routes:
  - {{ match: {{ path_prefix: /multi }}, limits: [multi], respond: {{ status: 200 }} }}
  - {{ match: {{ path_prefix: /banned }}, limits: [banned], respond: {{ status: 200 }} }}
"
    );
    let sg = Sluicegate::start(&yaml);
    let mut answers = Vec::new();
    for path in ["/multi", "/multi", "/multi", "/multi", "/banned", "/banned", "/banned"] {
        answers.push(get(sg.addr, path, &[("x-forwarded-for", "192.0.2.1")]).await.status);
    }
    // Each refusal is by both windows.
    assert_eq!(answers, [200, 429, 429, 429, 200, 429, 429]);
    let log = sg.wait_for_log("five lines \"request rejected\"", |log| log.matches("\"request rejected").count() >= 5);
    let lines = |limit: &str| {
        log.lines()
            .filter(|l| l.contains("\"request rejected") && l.contains(&format!("\"limit\":\"{limit}\"")))
            .count()
    };
    assert_eq!((lines("multi"), lines("banned")), (3, 2), "one line per refusal:\n{log}");

    // Fresh keys push older ones out: each window's table drops about as many.
    for n in 0..FRESH {
        let ip = format!("10.0.{}.{}", n / 250, n % 250 + 1);
        assert_eq!(get(sg.addr, "/multi", &[("x-forwarded-for", &ip)]).await.status, 200);
    }
    let m = Metrics::of(&sg).await;
    let decisions = |limit: &str, outcome: &str| {
        m.value(&format!("sluicegate_limit_decisions_total{{limit=\"{limit}\",outcome=\"{outcome}\"}}"))
    };
    assert_eq!((decisions("multi", "passed"), decisions("multi", "rejected")), ((FRESH + 1) as f64, 3.0));
    assert_eq!((decisions("banned", "passed"), decisions("banned", "rejected")), (1.0, 2.0));
    assert_eq!(m.value("sluicegate_bans_total{limit=\"banned\"}"), 1.0);
    // At most every key but those held can have been dropped, once.
    let evictions = m.value("sluicegate_limit_evictions_total{limit=\"multi\"}");
    let held = m.value("sluicegate_limit_keys{limit=\"multi\"}");
    assert!(held <= (MAX_KEYS + 63) as f64 && evictions > 0.0, "{held} keys held, {evictions} evictions");
    assert!(evictions + held <= (FRESH + 1) as f64, "{evictions} evictions, {held} keys held of {}", FRESH + 1);
}

/// A dry-run limit is invisible to clients: no header item of its own, and it is never
/// the tightest one shown, however little it has left (it stays in logs and metrics).
#[tokio::test]
async fn a_dry_run_limit_is_never_advertised_to_clients() {
    let alone = Conf::new()
        .set("ratelimit_headers: all")
        .set("ratelimit_header_style: both")
        .limit("trial", "key: ip, rate: 1r/m, dry_run: true")
        .answering("trial")
        .start();
    for _ in 0..3 {
        let r = get(alone.addr, "/", &[]).await;
        assert_eq!(r.status, 200);
        for name in ["ratelimit", "ratelimit-policy", "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"]
        {
            assert_eq!(r.header(name), None, "{name}");
        }
    }
    let beside = Conf::new()
        .set("ratelimit_headers: all")
        .set("ratelimit_header_style: both")
        .limit("trial", "key: ip, rate: 1r/m, dry_run: true")
        .limit("real", "key: ip, rate: 1r/s, burst: 9, nodelay: true")
        .answering("trial, real")
        .start();
    get(beside.addr, "/", &[]).await;
    let r = get(beside.addr, "/", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("ratelimit-policy"), Some("\"real\";q=1;w=1;burst=9"));
    // (`t`: about two seconds, as the real clock has it.)
    assert!(r.header("ratelimit").unwrap().starts_with("\"real\";r=8;t="), "{:?}", r.header("ratelimit"));
    assert_eq!((r.header("x-ratelimit-limit"), r.header("x-ratelimit-remaining")), (Some("1"), Some("8")));
}

/// A limit's own refusal: its status, its body with the limit's name and `Retry-After`
/// written in (a JSON body keeps its other braces), its content type and fields; the
/// `Retry-After` and rate-limit fields as every refusal has them.
#[tokio::test]
async fn a_limit_answers_its_refusals_with_its_own_response() {
    let yaml = r#"
listen: 127.0.0.1:0
limits:
  api:
    key: ip
    rate: 1r/m
    response:
      status: 503
      body: '{"error": "slow down", "limit": "{limit}", "retry_in": {retry_after}}'
      content_type: application/json
      headers: { x-limited-by: edge }
  plain: { key: ip, rate: 1r/m }
routes:
  - match: { path: /api }
    respond: { status: 200 }
    limits: [api]
  - respond: { status: 200 }
    limits: [plain]
"#;
    let sg = Sluicegate::start(yaml);
    assert_eq!(get(sg.addr, "/api", &[]).await.status, 200);
    let refused = get(sg.addr, "/api", &[]).await;
    assert_eq!(refused.status, 503);
    assert_eq!(refused.header("content-type"), Some("application/json"));
    assert_eq!(refused.header("x-limited-by"), Some("edge"));
    let retry = refused.header("retry-after").unwrap().to_owned();
    assert_eq!(refused.text(), format!(r#"{{"error": "slow down", "limit": "api", "retry_in": {retry}}}"#));
    assert!(refused.header("ratelimit-policy").is_some(), "the rate-limit fields too");
    // A limit without one answers as `rejection_body` says.
    assert_eq!(get(sg.addr, "/other", &[]).await.status, 200);
    let other = get(sg.addr, "/other", &[]).await;
    assert_eq!((other.status, other.text().as_str()), (429, "Too Many Requests\n"));
    assert_eq!(other.header("x-limited-by"), None);
}

/// When several limits refuse, the one that admits last decides the status and
/// `Retry-After` (README, *Rejections*), whichever the route lists first and whichever
/// status is the larger: here the limit of one a minute (60 s) over one of two (30 s).
#[tokio::test]
async fn when_several_limits_refuse_the_one_that_admits_last_decides_the_status() {
    for (late, soon) in [(503, 429), (429, 503)] {
        let sg = Conf::new()
            .limit("late", &format!("key: ip, rate: 1r/m, status: {late}"))
            .limit("soon", &format!("key: ip, rate: 2r/m, status: {soon}"))
            .route("match: { path: /late-first }, limits: [late, soon], respond: { status: 200 }")
            .route("limits: [soon, late], respond: { status: 200 }")
            .start();
        assert_eq!(get(sg.addr, "/late-first", &[]).await.status, 200, "both spent");
        for path in ["/late-first", "/soon-first", "/late-first"] {
            let refused = get(sg.addr, path, &[]).await;
            assert_eq!(refused.status, late, "{path}: the status of the limit that admits last ({late} over {soon})");
            let after: u64 = refused.header("retry-after").unwrap().parse().unwrap();
            assert!((55..=60).contains(&after), "{path}: its Retry-After, not the other's 30 s: {after}");
        }
    }
}
