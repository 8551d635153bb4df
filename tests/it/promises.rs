//! Promises README and docs/ make that no other test held the binary to: the metrics no test
//! read (delays, Redis failures, the breaker, the near-cache, upstream errors by kind),
//! the admin API's refusals and `POST /reload`, ban escalation up to `ban_max`,
//! `ratelimit_headers`, a `count:` admission whose client left, and the access log's
//! outcomes and its reopening on reload.

use std::time::Duration;

use tokio::io::AsyncWriteExt;

use crate::common::*;
use crate::logs::access_lines;
use crate::redis::Redis;

/// `METHOD path` on the admin listener `admin`, without a body.
async fn admin_call(admin: std::net::SocketAddr, method: http::Method, path: &str) -> Reply {
    let req =
        http::Request::builder().method(method).uri(path).header("host", "localhost").header("content-length", "0");
    request(admin, req.body(String::new()).unwrap()).await
}

/// `sluicegate_requests_total` of `route` with `outcome`.
fn requests(m: &Metrics, route: &str, outcome: &str) -> f64 {
    m.value(&format!("sluicegate_requests_total{{route=\"{route}\",outcome=\"{outcome}\"}}"))
}

/// `sluicegate_limit_decisions_total` of `limit` with `outcome`.
fn decisions(m: &Metrics, limit: &str, outcome: &str) -> f64 {
    m.value(&format!("sluicegate_limit_decisions_total{{limit=\"{limit}\",outcome=\"{outcome}\"}}"))
}

/// docs/operations.md, *Observing it*: `sluicegate_limit_delay_seconds` is a histogram of "delays a
/// limit asked for, one per delayed request"; `sluicegate_requests_total` has the outcome
/// `delayed` and `sluicegate_limit_decisions_total` counts a limit's delays.
#[tokio::test]
async fn a_delayed_request_is_counted_as_delayed_and_its_delay_observed() {
    let sg = Conf::new()
        .admin()
        .limit("pace", "key: ip, rate: 2r/s, burst: 5")
        .route("name: paced, respond: { status: 200 }, limits: [pace]")
        .start();
    let before = Metrics::of(&sg).await;
    assert_eq!(before.value("sluicegate_limit_delay_seconds_count{limit=\"pace\"}"), 0.0);
    // The first request of a fresh key passes at once; the second, sent right after, is
    // queued until the bucket has drained half a second's worth (less what has elapsed).
    assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
    assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
    let m = Metrics::of(&sg).await;
    assert_eq!((requests(&m, "paced", "passed"), requests(&m, "paced", "delayed")), (1.0, 1.0));
    assert_eq!((decisions(&m, "pace", "passed"), decisions(&m, "pace", "delayed")), (1.0, 1.0));
    assert_eq!(m.value("sluicegate_limit_delay_seconds_count{limit=\"pace\"}"), 1.0, "one observation per delay");
    let sum = m.value("sluicegate_limit_delay_seconds_sum{limit=\"pace\"}");
    assert!(sum > 0.0 && sum <= 0.5, "the delay asked is at most 1/rate: {sum} s");
    // In the buckets too: none below 1 ms, every one by +Inf.
    let bucket = |le: &str| {
        m.0.lines()
            .find(|l| l.starts_with("sluicegate_limit_delay_seconds_bucket{") && l.contains(&format!("le=\"{le}\"")))
            .and_then(|l| l.rsplit(' ').next())
            .map(|v| v.parse::<f64>().unwrap())
            .unwrap_or_else(|| panic!("no bucket le={le} in\n{}", m.0))
    };
    assert_eq!((bucket("0.001"), bucket("+Inf")), (0.0, 1.0));
}

/// docs/operations.md, *Observing it*: `sluicegate_redis_errors_total` counts global decisions whose
/// Redis call failed, `sluicegate_redis_fallbacks_total{kind}` those `on_store_error`
/// made (`allow`, `deny`, `local`), `sluicegate_redis_breaker_open` is 1 while the
/// breaker skips Redis and `sluicegate_redis_skipped_total` counts what it skipped;
/// *Global limits*: after `breaker_failures` failures in a row Redis is not called for
/// `breaker_cooldown`, then one request probes it, and Redis is used again once it
/// answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_failures_fallbacks_and_the_breaker_are_counted() {
    let mut redis = Redis::start();
    let sg = Sluicegate::start(&format!(
        r#"
listen: 127.0.0.1:0
admin: {{ listen: 127.0.0.1:0 }}
redis: {{ url: "{}", timeout: 1s, breaker_failures: 3, breaker_window: 0s, breaker_cooldown: 300ms }}
limits:
  open: {{ key: ip, rate: 100r/s, burst: 100, nodelay: true, scope: global, on_store_error: allow }}
  closed: {{ key: ip, rate: 100r/s, burst: 100, nodelay: true, scope: global, on_store_error: deny }}
  twin: {{ key: ip, rate: 100r/s, burst: 100, nodelay: true, scope: global, on_store_error: local }}
routes:
  - {{ match: {{ path: /allow }}, respond: {{ status: 200 }}, limits: [open] }}
  - {{ match: {{ path: /deny }}, respond: {{ status: 200 }}, limits: [closed] }}
  - {{ match: {{ path: /local }}, respond: {{ status: 200 }}, limits: [twin] }}
"#,
        redis.url()
    ));
    for path in ["/allow", "/deny", "/local"] {
        assert_eq!(get(sg.addr, path, &[]).await.status, 200, "{path}, decided by Redis");
    }
    let m = Metrics::of(&sg).await;
    assert_eq!(m.value("sluicegate_redis_calls_total"), 3.0);
    assert_eq!(m.value("sluicegate_redis_errors_total"), 0.0);
    assert_eq!(m.value("sluicegate_redis_breaker_open"), 0.0);
    for kind in ["allow", "deny", "local"] {
        assert_eq!(m.value(&format!("sluicegate_redis_fallbacks_total{{kind=\"{kind}\"}}")), 0.0, "{kind}");
    }

    redis.kill();
    // Three failures in a row, one per on_store_error: each decides its request.
    assert_eq!(get(sg.addr, "/allow", &[]).await.status, 200);
    assert_eq!(get(sg.addr, "/deny", &[]).await.status, 503);
    assert_eq!(get(sg.addr, "/local", &[]).await.status, 200);
    let m = Metrics::of(&sg).await;
    assert_eq!(m.value("sluicegate_redis_errors_total"), 3.0, "each failed decision once");
    assert_eq!(m.value("sluicegate_redis_breaker_open"), 1.0, "three failures in a row open it");
    for kind in ["allow", "deny", "local"] {
        assert_eq!(m.value(&format!("sluicegate_redis_fallbacks_total{{kind=\"{kind}\"}}")), 1.0, "{kind}");
    }
    // While it is open, requests are decided without a call (a request that comes after
    // the cooldown probes, fails, and opens it again for another).
    wait_until("a request decided while the breaker skips Redis", Duration::from_secs(10), async || {
        assert_eq!(get(sg.addr, "/allow", &[]).await.status, 200);
        Metrics::of(&sg).await.value("sluicegate_redis_skipped_total") >= 1.0
    })
    .await;
    let m = Metrics::of(&sg).await;
    let (errors, skipped) = (m.value("sluicegate_redis_errors_total"), m.value("sluicegate_redis_skipped_total"));
    let fallbacks: f64 = ["allow", "deny", "local"]
        .iter()
        .map(|kind| m.value(&format!("sluicegate_redis_fallbacks_total{{kind=\"{kind}\"}}")))
        .sum();
    assert_eq!(fallbacks, errors + skipped, "every failed or skipped decision fell back, once");
    assert_eq!(m.value("sluicegate_redis_calls_total"), 3.0 + errors, "a skipped decision is no call");

    redis.restart();
    wait_until("the breaker closed by a probe that Redis answers", Duration::from_secs(15), async || {
        let status = get(sg.addr, "/deny", &[]).await.status;
        assert!([200, 503].contains(&status), "{status}");
        Metrics::of(&sg).await.value("sluicegate_redis_breaker_open") == 0.0
    })
    .await;
    assert_eq!(get(sg.addr, "/deny", &[]).await.status, 200, "decided by Redis again");
}

/// docs/global-limits.md: once Redis refused a one-unit request for a key, this
/// instance refuses further one-unit requests for it itself, without a round trip, with
/// the `Retry-After` counted down; `sluicegate_near_cache_hits_total` counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_redis_refused_is_refused_again_by_the_near_cache() {
    let redis = Redis::start();
    let sg = Sluicegate::start(&format!(
        r#"
listen: 127.0.0.1:0
admin: {{ listen: 127.0.0.1:0 }}
redis: {{ url: "{}", timeout: 2s, breaker_failures: 100000 }}
limits:
  g: {{ key: ip, rate: 1r/m, scope: global, on_store_error: deny }}
routes:
  - respond: {{ status: 200 }}
    limits: [g]
"#,
        redis.url()
    ));
    assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
    let by_redis = get(sg.addr, "/", &[]).await;
    assert_eq!(by_redis.status, 429);
    let m = Metrics::of(&sg).await;
    assert_eq!((m.value("sluicegate_redis_calls_total"), m.value("sluicegate_near_cache_hits_total")), (2.0, 0.0));
    for n in 1..=3 {
        let near = get(sg.addr, "/", &[]).await;
        assert_eq!(near.status, 429);
        let seconds = |r: &Reply| r.header("retry-after").unwrap().parse::<u64>().unwrap();
        assert!(seconds(&near) <= seconds(&by_redis) && seconds(&near) >= 58, "{:?}", near.headers);
        let m = Metrics::of(&sg).await;
        assert_eq!(m.value("sluicegate_near_cache_hits_total"), f64::from(n));
        assert_eq!(m.value("sluicegate_redis_calls_total"), 2.0, "Redis was not asked again");
        assert_eq!(m.value("sluicegate_redis_errors_total"), 0.0);
    }
}

/// docs/operations.md, *Observing it*: `sluicegate_upstream_errors_total{kind}` counts `timeout`
/// (no response headers within the upstream's `timeout`: `504`) and `failed` (the
/// connection closed before a response: `502`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_timeouts_and_failures_are_counted_by_kind() {
    let backend = Backend::start().await;
    let sg = Sluicegate::in_front_of(
        &backend,
        r#"
listen: 127.0.0.1:0
admin: { listen: 127.0.0.1:0 }
upstreams:
  b: { servers: ["BACKEND"], timeout: 300ms, retries: 0 }
routes:
  - name: api
    upstream: b
"#,
    );
    let errors = |m: &Metrics, kind: &str| {
        m.value(&format!("sluicegate_upstream_errors_total{{route=\"api\",kind=\"{kind}\"}}"))
    };
    assert_eq!(get(sg.addr, "/sleep/5000", &[]).await.status, 504);
    let m = Metrics::of(&sg).await;
    assert_eq!((errors(&m, "timeout"), errors(&m, "failed")), (1.0, 0.0));
    // A request held at the backend, which then dies: its connection closes unanswered.
    let addr = sg.addr;
    let held = tokio::spawn(async move { get(addr, "/held", &[]).await.status });
    wait_until("the request at the backend", Duration::from_secs(10), async || {
        backend.hits().iter().any(|h| h.path_and_query == "/held")
    })
    .await;
    backend.kill().await;
    assert_eq!(tokio::time::timeout(Duration::from_secs(10), held).await.unwrap().unwrap(), 502);
    let m = Metrics::of(&sg).await;
    assert_eq!((errors(&m, "timeout"), errors(&m, "failed"), errors(&m, "connect")), (1.0, 1.0, 0.0));
}

/// docs/operations.md, *Observing it*: "Global limits keep their state in Redis: the key API answers
/// `409` for them", and `DELETE /bans/NAME/HASH` answers `204` when it lifts a ban,
/// `404` if there is none.
#[tokio::test]
async fn the_key_api_refuses_global_limits_and_lifting_no_ban_is_404() {
    // No Redis listens: the admin API must not need it to answer.
    let sg = Sluicegate::start(&format!(
        r#"
listen: 127.0.0.1:0
admin: {{ listen: 127.0.0.1:0 }}
redis: {{ url: "redis://127.0.0.1:{}" }}
limits:
  shared: {{ key: ip, rate: 1r/s, scope: global }}
  strict: {{ key: ip, rate: 1r/m, ban: 10m }}
routes:
  - match: {{ path: /shared }}
    respond: {{ status: 200 }}
    limits: [shared]
  - respond: {{ status: 200 }}
    limits: [strict]
"#,
        closed_port()
    ));
    let admin = sg.admin_addr();
    for method in [http::Method::GET, http::Method::DELETE] {
        let reply = admin_call(admin, method.clone(), "/limits/shared?ip=192.0.2.7").await;
        assert_eq!(reply.status, 409, "{method} of a global limit's key: {}", reply.text());
    }
    // The local limit's key API answers, for contrast.
    assert_eq!(admin_call(admin, http::Method::GET, "/limits/strict?ip=192.0.2.7").await.status, 200);

    assert_eq!(admin_call(admin, http::Method::DELETE, "/bans/strict/0123456789abcdef").await.status, 404);
    // A real ban: lifted once (204), then there is none (404).
    assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
    assert_eq!(get(sg.addr, "/", &[]).await.status, 429);
    let bans: serde_json::Value = serde_json::from_slice(&get(admin, "/bans", &[]).await.body).unwrap();
    let key = bans["strict"][0]["key"].as_str().unwrap_or_else(|| panic!("no ban listed: {bans}"));
    let lift = format!("/bans/strict/{}", key.trim_start_matches('#'));
    assert_eq!(admin_call(admin, http::Method::DELETE, &lift).await.status, 204);
    assert_eq!(admin_call(admin, http::Method::DELETE, &lift).await.status, 404, "that ban is gone");
    assert_eq!(admin_call(admin, http::Method::DELETE, "/bans/nothing/0123456789abcdef").await.status, 404);
}

/// docs/operations.md, *Observing it*: `POST /reload` answers `202` and reloads the configuration
/// file as SIGHUP does; *Reloading*: new requests then use the new configuration, and a
/// file that is invalid changes nothing (`sluicegate_reloads_total` counts both).
#[tokio::test]
async fn post_reload_reloads_the_file() {
    let yaml = |body: &str| {
        format!(
            "listen: 127.0.0.1:0\nadmin: {{ listen: 127.0.0.1:0 }}\nroutes:\n  - respond: {{ status: 200, body: \"{body}\" }}\n"
        )
    };
    let sg = Sluicegate::start(&yaml("before"));
    let admin = sg.admin_addr();
    assert_eq!(get(sg.addr, "/", &[]).await.text(), "before");
    // The answer comes once the reload is done, and says how it went.
    let reload = async |written: &str| {
        std::fs::write(&sg.config, written).unwrap();
        admin_call(admin, http::Method::POST, "/reload").await
    };
    let done = reload(&yaml("after")).await;
    assert_eq!((done.status, done.text()), (200, format!("reloaded {}\n", sg.config.display())));
    assert_eq!(get(sg.addr, "/", &[]).await.text(), "after", "the next request sees the new configuration");

    let failed = reload("listen: 127.0.0.1:0\nroutes: nonsense\n").await;
    assert_eq!(failed.status, 422, "{}", failed.text());
    assert!(
        failed.text().contains("reload failed; the running configuration stays") && failed.text().contains("routes"),
        "{}",
        failed.text()
    );
    assert_eq!(get(sg.addr, "/", &[]).await.text(), "after", "a broken file changes nothing");
    let m = Metrics::of(&sg).await;
    assert_eq!(m.value("sluicegate_reloads_total{result=\"ok\"}"), 1.0);
    assert_eq!(m.value("sluicegate_reloads_total{result=\"failed\"}"), 1.0);
}

/// docs/limits.md, *Bans*: "With `ban_max`, a key banned again within `ban_max` of its previous
/// ban's end gets twice that ban, up to `ban_max`", and a banned key's `Retry-After` is
/// the time left. A ban of 1 s, 2 s, then 3 s (4 s capped at `ban_max`).
#[tokio::test]
async fn a_key_banned_again_gets_twice_the_ban_up_to_ban_max() {
    let sg = Conf::new()
        .admin()
        .limit("l", "key: ip, rate: 1r/m, ban: 1s, ban_max: 3s")
        .route("name: login, respond: { status: 200 }, limits: [l]")
        .start();
    let admin = sg.admin_addr();
    let ban_left = async || -> Option<u64> {
        let state = get(admin, "/limits/l?ip=127.0.0.1", &[]).await;
        assert_eq!(state.status, 200, "{}", state.text());
        serde_json::from_slice::<serde_json::Value>(&state.body).unwrap()["ban_left_ms"].as_u64()
    };
    let retry_after = |r: &Reply| r.header("retry-after").map(str::to_owned);
    assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
    // The bucket (one request a minute) refuses this key for a minute: each request
    // after a ban has ended is refused again, and bans it again.
    for (n, seconds) in [(1, "1"), (2, "2"), (3, "3")] {
        let refused = get(sg.addr, "/", &[]).await;
        assert_eq!((refused.status, retry_after(&refused).as_deref()), (429, Some(seconds)), "ban {n}");
        let left = ban_left().await.expect("the key is banned");
        assert!(left <= seconds.parse::<u64>().unwrap() * 1000, "ban {n}: {left} ms left");
        // A request while banned is refused with the time left, and bans no further.
        let again = get(sg.addr, "/", &[]).await;
        assert_eq!(again.status, 429);
        assert!(retry_after(&again).unwrap().parse::<u64>().unwrap() <= seconds.parse().unwrap());
        assert_eq!(Metrics::of(&sg).await.value("sluicegate_bans_total{limit=\"l\"}"), f64::from(n));
        if n < 3 {
            wait_until(&format!("ban {n} over"), Duration::from_secs(10), async || ban_left().await.is_none()).await;
        }
    }
    let m = Metrics::of(&sg).await;
    assert_eq!((requests(&m, "login", "banned"), requests(&m, "login", "rejected")), (3.0, 3.0));
}

/// docs/configuration.md: `ratelimit_headers` says "which responses carry
/// `RateLimit-Policy` / `RateLimit`": `none` puts them (and, with
/// `ratelimit_header_style: both`, `X-RateLimit-*`) on no response; *Rejections* answer
/// with `Retry-After` whatever the headers. `rejected` (the default) and `all` for
/// contrast.
#[tokio::test]
async fn ratelimit_headers_none_sends_none_but_keeps_retry_after() {
    const NAMES: [&str; 5] =
        ["ratelimit-policy", "ratelimit", "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"];
    for (mode, on_pass, on_rejection) in [("none", false, false), ("rejected", false, true), ("all", true, true)] {
        let sg = Sluicegate::start(&format!(
            "listen: 127.0.0.1:0\nratelimit_headers: {mode}\nratelimit_header_style: both\nlimits:\n  l: {{ key: ip, rate: 1r/m }}\nroutes:\n  - respond: {{ status: 200 }}\n    limits: [l]\n"
        ));
        let passed = get(sg.addr, "/", &[]).await;
        let refused = get(sg.addr, "/", &[]).await;
        assert_eq!((passed.status, refused.status), (200, 429), "{mode}");
        for name in NAMES {
            assert_eq!(passed.header(name).is_some(), on_pass, "{mode}: {name} on a pass: {:?}", passed.headers);
            assert_eq!(refused.header(name).is_some(), on_rejection, "{mode}: {name} on a 429: {:?}", refused.headers);
        }
        assert_eq!(passed.header("retry-after"), None, "{mode}");
        assert_eq!(refused.header("retry-after"), Some("60"), "{mode}: a rejection says when to come back");
    }
}

/// docs/limits.md, *Counting only some outcomes*: with `count:`, "the request takes its quota
/// when it is admitted … and gives it back once its response's status turns out not to
/// count", and "a request whose client goes away before the response stays counted";
/// *Global limits*: `count:` works globally too. Also, *Observing it*: the access log
/// writes a line when the client went away, and a concurrency slot
/// (`sluicegate_limit_in_flight`) is held until then.
async fn a_client_that_leaves_stays_counted(redis: Option<&Redis>) {
    let backend = Backend::start().await;
    let (store, scope) = match redis {
        Some(redis) => (format!("redis: {{ url: \"{}\", timeout: 2s }}\n", redis.url()), ", scope: global"),
        None => (String::new(), ""),
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let sg = Sluicegate::in_front_of(
        &backend,
        &format!(
            r#"
listen: 127.0.0.1:0
admin: {{ listen: 127.0.0.1:0 }}
access_log: {{ format: json, path: "{}" }}
{store}upstreams:
  b: {{ servers: ["BACKEND"] }}
limits:
  login: {{ key: ip, algorithm: sliding_log, limit: 1, window: 1h, count: [401]{scope} }}
  slots: {{ key: ip, concurrency: 5 }}
routes:
  - name: login
    upstream: b
    limits: [login, slots]
"#,
            log.display()
        ),
    );
    // Statuses that do not count are given back: the one unit of quota stays free.
    for _ in 0..3 {
        assert_eq!(get(sg.addr, "/status/200", &[]).await.status, 200);
    }
    // A request the backend holds, whose client then goes away.
    let mut client = tokio::net::TcpStream::connect(sg.addr).await.unwrap();
    client.write_all(b"GET /held HTTP/1.1\r\nHost: test.local\r\n\r\n").await.unwrap();
    wait_until("the request at the backend", Duration::from_secs(10), async || {
        backend.hits().iter().any(|h| h.path_and_query == "/held")
    })
    .await;
    assert_eq!(Metrics::of(&sg).await.value("sluicegate_limit_in_flight{limit=\"slots\"}"), 1.0);
    drop(client);
    // The proxy gave the request up: its line is written, its slot is back.
    let lines = access_lines(&log, 4);
    assert!(lines[3].contains("\"target\":\"/held\""), "{lines:?}");
    wait_until("the slot given back", Duration::from_secs(10), async || {
        Metrics::of(&sg).await.value("sluicegate_limit_in_flight{limit=\"slots\"}") == 0.0
    })
    .await;
    backend.gate.add_permits(1);
    // Its admission was never settled: it stays counted, and the key is refused.
    let refused = get(sg.addr, "/status/200", &[]).await;
    assert_eq!(refused.status, 429, "the abandoned request's quota was given back");
    assert_eq!(backend.hits().len(), 4, "the refused request reached the backend");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_stays_counted_locally() {
    a_client_that_leaves_stays_counted(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_stays_counted_globally() {
    let redis = Redis::start();
    a_client_that_leaves_stays_counted(Some(&redis)).await;
}

/// docs/operations.md, *Observing it*: each request writes its access log line "once its response
/// has been sent (or the client went away)", with `client` "the address after
/// `trusted_proxies`", `route` (`null`: no route) and `outcome`, what the limits made of
/// it. The line of a request that was routed, passed its limits and was at the upstream
/// when its client left must say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_line_of_a_client_that_left_names_its_client_route_and_outcome() {
    let backend = Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let sg = Sluicegate::in_front_of(
        &backend,
        &format!(
            "listen: 127.0.0.1:0\ntrusted_proxies: [127.0.0.1/32]\naccess_log: {{ format: json, path: \"{}\" }}\nupstreams:\n  b: {{ servers: [\"BACKEND\"] }}\nlimits:\n  l: {{ key: ip, rate: 10r/s }}\nroutes:\n  - name: api\n    upstream: b\n    limits: [l]\n",
            log.display()
        ),
    );
    // For contrast, a request that is answered.
    assert_eq!(get(sg.addr, "/", &[("x-forwarded-for", "192.0.2.7")]).await.status, 200);
    let mut client = tokio::net::TcpStream::connect(sg.addr).await.unwrap();
    client.write_all(b"GET /held HTTP/1.1\r\nHost: test.local\r\nX-Forwarded-For: 192.0.2.8\r\n\r\n").await.unwrap();
    wait_until("the request at the backend", Duration::from_secs(10), async || {
        backend.hits().iter().any(|h| h.path_and_query == "/held")
    })
    .await;
    drop(client);
    let lines = access_lines(&log, 2);
    backend.gate.add_permits(1);
    let [answered, left] = [&lines[0], &lines[1]].map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap());
    let fields = |line: &serde_json::Value| (line["client"].clone(), line["route"].clone(), line["outcome"].clone());
    assert_eq!(fields(&answered), ("192.0.2.7".into(), "api".into(), "passed".into()), "{answered}");
    assert_eq!(left["target"], "/held", "{left}");
    assert_eq!(fields(&left), ("192.0.2.8".into(), "api".into(), "passed".into()), "{left}");
    assert_eq!(left["status"], 499, "{left}");
}

/// docs/operations.md, *Observing it*: each access log line's `outcome` is `passed`, `delayed`,
/// `rejected`, `banned`, `dry_run_rejected`, or `-` (no route, `route: null`); "a reload
/// opens the file again, so `mv access.log access.log.1 && kill -HUP PID` rotates it".
#[tokio::test]
async fn the_access_log_shows_every_outcome_and_is_reopened_on_reload() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
access_log: {{ format: json, path: "{}" }}
limits:
  pace: {{ key: ip, rate: 2r/s, burst: 5 }}
  strict: {{ key: ip, rate: 1r/m, ban: 1m }}
  trial: {{ key: ip, rate: 1r/m, dry_run: true }}
routes:
  - {{ name: paced, match: {{ path: /paced }}, respond: {{ status: 200 }}, limits: [pace] }}
  - {{ name: login, match: {{ path: /login }}, respond: {{ status: 200 }}, limits: [strict] }}
  - {{ name: trial, match: {{ path: /trial }}, respond: {{ status: 200 }}, limits: [trial] }}
"#,
        path.display()
    );
    let sg = Sluicegate::start(&yaml);
    // (The second /paced is sent at once: it waits its turn, under half a second.)
    let expected = [
        ("/paced", 200, "paced", "passed"),
        ("/paced", 200, "paced", "delayed"),
        ("/login", 200, "login", "passed"),
        ("/login", 429, "login", "banned"),
        ("/login", 429, "login", "rejected"),
        ("/trial", 200, "trial", "passed"),
        ("/trial", 200, "trial", "dry_run_rejected"),
        ("/nothing", 404, "", "no_route"),
    ];
    for (target, status, _, _) in expected {
        assert_eq!(get(sg.addr, target, &[]).await.status, status, "{target}");
    }
    let check = |lines: &[String], expected: &[(&str, u16, &str, &str)]| {
        assert_eq!(lines.len(), expected.len(), "{lines:#?}");
        for (line, &(target, status, route, outcome)) in lines.iter().zip(expected) {
            let json: serde_json::Value = serde_json::from_str(line).unwrap();
            let route = if route.is_empty() { serde_json::Value::Null } else { route.into() };
            assert_eq!(
                (&json["target"], &json["status"], &json["route"], &json["outcome"]),
                (&target.into(), &status.into(), &route, &outcome.into()),
                "{line}"
            );
        }
    };
    check(&access_lines(&path, expected.len()), &expected);

    // Rotated: moved away, then a reload opens a new file at the path.
    let rotated = dir.path().join("access.log.1");
    std::fs::rename(&path, &rotated).unwrap();
    let log = sg.reload(&yaml);
    assert!(log.contains("configuration reloaded"), "{log}");
    assert_eq!(get(sg.addr, "/login", &[]).await.status, 429, "still banned");
    assert_eq!(get(sg.addr, "/nothing", &[]).await.status, 404);
    check(&access_lines(&path, 2), &[("/login", 429, "login", "rejected"), ("/nothing", 404, "", "no_route")]);
    check(&access_lines(&rotated, expected.len()), &expected);
}
