//! The dashboard's JSON and page over HTTP: what it shows of routes, limits, keys and
//! bans, the history it keeps, and how it answers what is not asked right. (The page in a
//! real browser: `browser.rs`.)

use std::time::Duration;

use crate::common::*;

/// `GET /dashboard.json` (`?since=SEQ` when given) on `sg`'s admin listener.
async fn state(sg: &Sluicegate, since: Option<u64>) -> serde_json::Value {
    let path = since.map_or_else(|| "/dashboard.json".to_owned(), |s| format!("/dashboard.json?since={s}"));
    let reply = get(sg.admin_addr(), &path, &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.header("content-type"), Some("application/json"));
    serde_json::from_slice(&reply.body).unwrap()
}

fn named<'a>(list: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    list.as_array().unwrap().iter().find(|item| item["name"] == name).unwrap_or_else(|| panic!("no {name} in {list}"))
}

fn sum(series: &serde_json::Value) -> u64 {
    series.as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).sum()
}

/// A flood of one client shows, within a few seconds and without any request reading
/// it: the route's refusals per second, the limit's rejections, the refused keys as
/// `log_keys` says (a bearer token hashed, a plain header as sent), and the ban, by the
/// key it bans as log lines write it.
#[tokio::test]
async fn a_flood_shows_its_refusals_its_keys_and_its_ban() {
    let sg = Conf::new()
        .admin()
        .limit("per_token", "key: bearer, on_missing_key: skip, rate: 1r/m, burst: 2, nodelay: true")
        .limit("per_user", "key: \"header:x-user\", on_missing_key: skip, rate: 1r/m, ban: 10m")
        .route("name: api, match: { path_prefix: /api }, respond: { status: 200 }, limits: [per_token]")
        .route("name: login, respond: { status: 200 }, limits: [per_user]")
        .start();
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(get(sg.addr, "/api/x", &[("authorization", "Bearer s3cret-token")]).await.status);
        statuses.push(get(sg.addr, "/login", &[("x-user", "mallory")]).await.status);
    }
    assert_eq!(statuses.iter().filter(|&&s| s == 429).count(), 5 + 7, "{statuses:?}");
    let mut shown = serde_json::Value::Null;
    wait_until("the refusals in the dashboard's history", Duration::from_secs(10), async || {
        shown = state(&sg, None).await;
        sum(&named(&shown["routes"], "api")["refused"]) == 5 && sum(&named(&shown["routes"], "login")["refused"]) == 7
    })
    .await;
    let api = named(&shown["routes"], "api");
    assert_eq!(sum(&api["passed"]), 3);
    assert_eq!(api["respond"]["status"], 200);
    let per_token = named(&shown["limits"], "per_token");
    assert_eq!((sum(&per_token["passed"]), sum(&per_token["rejected"])), (3, 5));
    assert_eq!((per_token["keys"].as_u64(), per_token["max_keys"].as_u64()), (Some(1), Some(100_000)));
    let refused = &per_token["refused_most"][0];
    let label = refused["key"].as_str().unwrap();
    assert!(label.starts_with("bearer=#") && !shown.to_string().contains("s3cret-token"), "{label}");
    assert_eq!(refused["count"], 5);
    let per_user = named(&shown["limits"], "per_user");
    assert_eq!(per_user["refused_most"][0]["key"], "header:x-user=mallory");
    assert_eq!(per_user["banned"], 1);
    let ban = &per_user["bans"][0];
    assert_eq!(ban["key"], "header:x-user=mallory", "{ban}");
    assert!(ban["left_ms"].as_u64().unwrap() > 590_000, "{ban}");
    assert_eq!(shown["redis"], serde_json::Value::Null, "no global limits");
    assert_eq!(shown["instance"]["file"], sg.config.display().to_string());
}

/// A limit's card counts its own decisions: a request another limit of the route refused
/// is no pass of this one (it spent nothing here), so a generous limit beside a strict one
/// shows as many passes as the route let through, not one per request.
#[tokio::test]
async fn a_limit_counts_no_pass_for_a_request_another_limit_refused() {
    let sg = Conf::new()
        .admin()
        .limit("generous", "key: ip, rate: 100r/s, burst: 100, nodelay: true")
        .limit("strict", "key: ip, rate: 1r/m, burst: 1, nodelay: true")
        .route("name: api, respond: { status: 200 }, limits: [generous, strict]")
        .start();
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(get(sg.addr, "/", &[]).await.status);
    }
    assert_eq!(statuses, [200, 200, 429, 429, 429, 429]);
    let mut shown = serde_json::Value::Null;
    wait_until("the refusals in the dashboard's history", Duration::from_secs(10), async || {
        shown = state(&sg, None).await;
        sum(&named(&shown["routes"], "api")["refused"]) == 4
    })
    .await;
    assert_eq!(sum(&named(&shown["routes"], "api")["passed"]), 2);
    let generous = named(&shown["limits"], "generous");
    assert_eq!((sum(&generous["passed"]), sum(&generous["rejected"])), (2, 0), "{generous}");
    let strict = named(&shown["limits"], "strict");
    assert_eq!((sum(&strict["passed"]), sum(&strict["rejected"])), (2, 4), "{strict}");
    let metrics = Metrics::of(&sg).await;
    assert_eq!(metrics.value("sluicegate_limit_decisions_total{limit=\"generous\",outcome=\"passed\"}"), 2.0);
}

/// The page's first call gets the whole history the server keeps; each next call, the
/// seconds after the last it got (and the whole history again if it asks for seconds the
/// server no longer has, or never had).
#[tokio::test]
async fn each_call_gets_the_seconds_after_the_last_it_had() {
    let sg = Conf::new().admin().answering("").start();
    let mut first = serde_json::Value::Null;
    wait_until("three seconds of history", Duration::from_secs(10), async || {
        first = state(&sg, None).await;
        first["seq"].as_u64().unwrap() >= 3
    })
    .await;
    let seq = first["seq"].as_u64().unwrap();
    assert_eq!(first["full"], true);
    assert_eq!(first["seconds"].as_u64(), Some(seq));
    assert_eq!(first["routes"][0]["passed"].as_array().unwrap().len() as u64, seq);
    let next = state(&sg, Some(seq - 1)).await;
    let missing = next["seq"].as_u64().unwrap() - (seq - 1);
    assert_eq!((next["full"].as_bool(), next["seconds"].as_u64()), (Some(false), Some(missing)));
    assert_eq!(next["routes"][0]["passed"].as_array().unwrap().len() as u64, missing);
    let again = state(&sg, Some(seq + 1_000_000)).await;
    assert_eq!(again["full"], true, "seconds of another run: all of this one's");
}

/// Upstream servers: one out since its health check failed, with why; one in use, with
/// its requests and its check's time.
#[tokio::test]
async fn upstream_servers_show_whether_they_are_out_and_why() {
    let backend = Backend::start().await;
    let sg = Conf::new()
        .admin()
        .set(&format!(
            "upstreams:\n  b: {{ servers: [\"{}\"], health_check: {{ path: /, interval: 100ms }} }}\n  dead: {{ servers: [\"127.0.0.1:{}\"], health_check: {{ path: /, interval: 100ms }} }}",
            backend.addr,
            closed_port()
        ))
        .route("name: live, match: { path_prefix: /live }, upstream: b")
        .route("name: gone, upstream: dead")
        .start();
    assert_eq!(get(sg.addr, "/live", &[]).await.status, 200);
    let mut shown = serde_json::Value::Null;
    wait_until("the dead server out", Duration::from_secs(10), async || {
        shown = state(&sg, None).await;
        !named(&shown["upstreams"], "dead")["servers"][0]["out"].is_null()
            && !named(&shown["upstreams"], "b")["servers"][0]["check_ms"].is_null()
    })
    .await;
    let dead = &named(&shown["upstreams"], "dead")["servers"][0];
    assert!(dead["out"]["why"].as_str().unwrap().starts_with("health check: "), "{dead}");
    let live = &named(&shown["upstreams"], "b")["servers"][0];
    assert_eq!((live["out"].clone(), live["failures"].as_u64()), (serde_json::Value::Null, Some(0)), "{live}");
    // The pool's connections to it: the one the request took, kept idle since.
    assert_eq!(live["connections"], serde_json::json!({ "idle": 1, "in_use": 0 }), "{live}");
}

/// A reload is shown with when and how it came; a failed one keeps its errors shown
/// after a later reload succeeds.
#[tokio::test]
async fn reloads_are_shown_with_how_they_came_and_the_last_failures_errors() {
    let conf = Conf::new().admin().answering("");
    let sg = conf.start();
    assert!(sg.reload("listen: 127.0.0.1:0\nroutes: nonsense\n").contains("reload failed"));
    assert!(sg.reload(&conf.yaml()).contains("configuration reloaded"));
    let shown = state(&sg, None).await;
    let instance = &shown["instance"];
    assert_eq!(
        (instance["last_reload"]["how"].as_str(), &instance["last_reload"]["errors"]),
        (Some("SIGHUP"), &serde_json::Value::Null)
    );
    let failed = &instance["last_failed_reload"];
    assert!(failed["errors"].as_str().unwrap().contains("routes"), "{failed}");
    assert!(failed["at_ms"].as_u64().unwrap() <= instance["last_reload"]["at_ms"].as_u64().unwrap());
}

/// What is not asked right gets a 4xx, never a panic: a `since` that is no number (the
/// whole history), another method, a path under the JSON, a head that is no HTTP.
#[tokio::test]
async fn a_malformed_dashboard_call_gets_a_4xx() {
    let sg = Conf::new().admin().answering("").start();
    let admin = sg.admin_addr();
    assert_eq!(get(admin, "/dashboard.json?since=soon", &[]).await.status, 200);
    assert_eq!(get(admin, "/dashboard.json?since=-1&since=%ff", &[]).await.status, 200);
    let post = http::Request::post("/dashboard.json").header("host", admin.to_string()).body(String::new()).unwrap();
    assert_eq!(request(admin, post).await.status, 405);
    assert_eq!(get(admin, "/dashboard.json/x", &[]).await.status, 404);
    assert_eq!(get(admin, "/dashboard.js/../../etc/passwd", &[]).await.status, 404);
    assert!(raw_exchange(admin, b"\x16\x03\x01garbage\r\n\r\n").await.starts_with("HTTP/1.1 400"));
    assert_eq!(get(admin, "/healthz", &[]).await.status, 200, "still serving");
}

/// The page and its files: the same bytes whatever the token, no data, a strict policy.
#[tokio::test]
async fn the_page_is_served_with_a_strict_content_security_policy() {
    let sg = Conf::new().set("admin: { listen: 127.0.0.1:0, token: t0ken }").answering("").start();
    let page = get(sg.admin_addr(), "/", &[]).await;
    assert_eq!(page.status, 200);
    assert_eq!(page.header("content-type"), Some("text/html; charset=utf-8"));
    let csp = page.header("content-security-policy").unwrap();
    for directive in ["default-src 'none'", "script-src 'self'", "connect-src 'self'", "form-action 'none'"] {
        assert!(csp.contains(directive), "{csp}");
    }
    assert!(!csp.contains("unsafe"), "{csp}");
    assert_eq!(page.header("x-content-type-options"), Some("nosniff"));
    assert!(page.text().contains("data-token=\"required\""));
    for file in ["/dashboard.js", "/dashboard.css", "/icon.svg"] {
        assert_eq!(get(sg.admin_addr(), file, &[]).await.status, 200, "{file} needs no token");
    }
    assert_eq!(get(sg.admin_addr(), "/dashboard.json", &[]).await.status, 401);
}

/// With global limits, whether Redis answers: here it never does, so the breaker opens,
/// the dashboard says since when and why, and counts the fallbacks of the last minute.
#[tokio::test]
async fn global_limits_show_that_redis_does_not_answer_and_the_fallbacks() {
    let sg = Conf::new()
        .admin()
        .redis(&format!("redis://127.0.0.1:{}", closed_port()), "timeout: 50ms")
        .limit("shared", "key: ip, rate: 1000r/s, burst: 1000, scope: global, on_store_error: local")
        .answering("shared")
        .start();
    let mut shown = serde_json::Value::Null;
    wait_until("Redis unreachable and a fallback counted", Duration::from_secs(15), async || {
        assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
        shown = state(&sg, None).await;
        shown["redis"]["reach"] == "unreachable" && shown["redis"]["minute"]["fallbacks"]["local"].as_u64() > Some(0)
    })
    .await;
    let redis = &shown["redis"];
    assert_eq!(redis["breaker_open"], true, "{redis}");
    assert!(!redis["unreachable"]["error"].as_str().unwrap().is_empty(), "{redis}");
    assert_eq!(named(&shown["limits"], "shared")["scope"], "global");
}
