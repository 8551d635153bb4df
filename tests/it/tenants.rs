//! Tenant limits (`limit_from`): a key's own count, from a field a trusted proxy sets, a
//! verified claim, or the operator (`PUT /overrides`, kept across a restart with
//! `persist:`), clamped to the limit's bounds; locally, in Redis, and over HTTP/2.

use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;

use crate::common::*;
use crate::redis::Redis;

/// A quota of 2 per `x-api-key` an hour, whose keys may have their own, 1 to 5.
fn quota(trusted: &str) -> Conf {
    Conf::new()
        .admin()
        .set(&format!("trusted_proxies: [{trusted}]"))
        .limit(
            "quota",
            "key: \"header:x-api-key\", on_missing_key: refuse, algorithm: fixed_window, limit: 2, window: 1h, \
             limit_from: { header: x-tenant-limit, min: 1, max: 5 }",
        )
        .answering("quota")
}

/// How many of `n` requests of `key` (with `headers`) pass, one after another.
async fn passed(addr: std::net::SocketAddr, key: &str, headers: &[(&str, &str)], n: usize) -> usize {
    let mut passed = 0;
    for _ in 0..n {
        let mut all = vec![("x-api-key", key)];
        all.extend_from_slice(headers);
        if get(addr, "/", &all).await.status == 200 {
            passed += 1;
        }
    }
    passed
}

#[tokio::test]
async fn a_trusted_proxys_field_gives_a_key_its_own_count_within_the_bounds() {
    let sg = quota("127.0.0.1").start();
    assert_eq!(passed(sg.addr, "plain", &[], 4).await, 2, "the limit's own count");
    assert_eq!(passed(sg.addr, "gold", &[("x-tenant-limit", "4")], 6).await, 4);
    assert_eq!(passed(sg.addr, "greedy", &[("x-tenant-limit", "1000")], 7).await, 5, "clamped to max");
    assert_eq!(passed(sg.addr, "odd", &[("x-tenant-limit", "four")], 4).await, 2, "not a count: the limit's");
    // The field twice (a proxy that adds its own after the client's): which one the proxy
    // set cannot be told, so neither counts.
    let twice = [("x-tenant-limit", "5"), ("x-tenant-limit", "1")];
    assert_eq!(passed(sg.addr, "twice", &twice, 4).await, 2, "the field twice: the limit's");
    // A key's count can change between its requests: its window's count stays.
    assert_eq!(passed(sg.addr, "plain", &[("x-tenant-limit", "3")], 2).await, 1);
    let m = Metrics::of(&sg).await;
    assert_eq!(m.value("sluicegate_limit_own_counts_total{limit=\"quota\"}"), 15.0, "{}", m.0);
    assert_eq!(m.value("sluicegate_limit_own_counts_clamped_total{limit=\"quota\"}"), 7.0);
    assert_eq!(m.value("sluicegate_limit_own_counts_invalid_total{limit=\"quota\"}"), 8.0);
    assert_eq!(m.value("sluicegate_limit_own_counts_untrusted_total{limit=\"quota\"}"), 0.0);

    // Over HTTP/2 alike.
    let h2 = |n: &str| {
        Request::get(format!("http://{}/", sg.addr))
            .header("x-api-key", "h2")
            .header("x-tenant-limit", n)
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(request_h2(sg.addr, h2("3")).await.status);
    }
    assert_eq!(statuses, [200, 200, 200, 429]);
}

#[tokio::test]
async fn a_client_cannot_raise_its_own_limit_from_an_untrusted_address() {
    // The test's requests come from 127.0.0.1, which is not the trusted proxy.
    let sg = quota("10.0.0.0/8").start();
    assert_eq!(passed(sg.addr, "self-made", &[("x-tenant-limit", "5")], 4).await, 2);
    let m = Metrics::of(&sg).await;
    assert_eq!(m.value("sluicegate_limit_own_counts_untrusted_total{limit=\"quota\"}"), 4.0);
    assert_eq!(m.value("sluicegate_limit_own_counts_total{limit=\"quota\"}"), 0.0);
}

async fn admin(sg: &Sluicegate, method: http::Method, path: &str, body: &str) -> Reply {
    let req = Request::builder()
        .method(method)
        .uri(format!("http://{}{path}", sg.admin_addr()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    request(sg.admin_addr(), req).await
}

#[tokio::test]
async fn the_operator_gives_a_key_its_own_count_without_a_reload_and_a_restart_keeps_it() {
    let state = tempfile::tempdir().unwrap();
    let conf = quota("10.0.0.0/8").set(&format!("persist: {{ dir: \"{}\" }}", state.path().display()));
    let mut sg = conf.start();
    let given = admin(&sg, http::Method::PUT, "/overrides/quota/acme", r#"{"limit": 4}"#).await;
    assert_eq!(given.status, 200, "{}", given.text());
    let shown: serde_json::Value = serde_json::from_slice(&given.body).unwrap();
    assert_eq!(
        (shown["limit"].as_u64(), shown["applies"].as_u64(), shown["clamped"].as_bool()),
        (Some(4), Some(4), Some(false))
    );
    assert_eq!(passed(sg.addr, "acme", &[], 6).await, 4);
    let state = get(sg.admin_addr(), "/limits/quota?header:x-api-key=acme", &[]).await;
    let state: serde_json::Value = serde_json::from_slice(&state.body).unwrap();
    assert_eq!((state["own_count"].as_u64(), state["windows"][0]["remaining"].as_u64()), (Some(4), Some(0)), "{state}");
    assert_eq!(passed(sg.addr, "other", &[], 3).await, 2);
    // Above the bounds: kept as given, applied clamped, and said so.
    let over = admin(&sg, http::Method::PUT, "/overrides/quota?header:x-api-key=big", r#"{"limit": 50}"#).await;
    let shown: serde_json::Value = serde_json::from_slice(&over.body).unwrap();
    assert_eq!((shown["applies"].as_u64(), shown["clamped"].as_bool()), (Some(5), Some(true)), "{shown}");
    for bad in [r#"{"limit": 0}"#, r#"{"limit": "x"}"#, r#"{"count": 3}"#, "not json"] {
        let refused = admin(&sg, http::Method::PUT, "/overrides/quota/acme", bad).await;
        assert_eq!(refused.status, 400, "{bad}: {}", refused.text());
    }
    let no = admin(&sg, http::Method::PUT, "/overrides/nothing/acme", r#"{"limit": 4}"#).await;
    assert_eq!(no.status, 404);
    let listed: serde_json::Value =
        serde_json::from_slice(&get(sg.admin_addr(), "/overrides", &[]).await.body).unwrap();
    assert_eq!(listed["quota"].as_array().map(Vec::len), Some(2), "{listed}");
    assert_eq!(listed["quota"][0]["parts"], "header:x-api-key=acme", "{listed}");
    let m = Metrics::of(&sg).await;
    assert_eq!(m.value("sluicegate_limit_own_counts_given{limit=\"quota\"}"), 2.0);

    // A restart gives them again (the windows' counts themselves are not persisted here).
    sg.terminate();
    let sg = conf.start();
    assert_eq!(passed(sg.addr, "acme", &[], 6).await, 4, "{}", sg.log());
    let gone = admin(&sg, http::Method::DELETE, "/overrides/quota/acme", "").await;
    assert_eq!(gone.status, 204);
    assert_eq!(admin(&sg, http::Method::DELETE, "/overrides/quota/acme", "").await.status, 404);
    assert_eq!(passed(sg.addr, "acme2", &[], 3).await, 2);
    let listed: serde_json::Value =
        serde_json::from_slice(&get(sg.admin_addr(), "/overrides/quota", &[]).await.body).unwrap();
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
}

#[tokio::test]
async fn a_keys_own_rate_sets_its_interval_and_its_burst_stays() {
    let sg = Conf::new()
        .admin()
        .limit(
            "per_key",
            "key: \"header:x-api-key\", on_missing_key: refuse, rate: 1r/m, burst: 2, nodelay: true, \
             limit_from: { max: 600 }",
        )
        .answering("per_key")
        .start();
    let given = admin(&sg, http::Method::PUT, "/overrides/per_key/fast", r#"{"limit": 60}"#).await;
    assert_eq!(given.status, 200, "{}", given.text());
    for key in ["slow", "fast"] {
        assert_eq!(passed(sg.addr, key, &[], 3).await, 3, "{key}: its burst");
    }
    let slow = get(sg.addr, "/", &[("x-api-key", "slow")]).await;
    let fast = get(sg.addr, "/", &[("x-api-key", "fast")]).await;
    assert_eq!((slow.status, slow.header("retry-after")), (429, Some("60")));
    assert_eq!((fast.status, fast.header("retry-after")), (429, Some("1")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_limit_decides_a_key_with_its_own_count_in_redis() {
    let redis = Redis::start();
    let conf = Conf::new()
        .admin()
        .behind_proxy()
        .redis(&redis.url(), "timeout: 1s")
        .limit(
            "quota",
            "key: \"header:x-api-key\", on_missing_key: refuse, algorithm: fixed_window, limit: 2, window: 1h, \
             scope: global, on_store_error: deny, limit_from: { header: x-tenant-limit, max: 10 }",
        )
        .answering("quota");
    let (a, b) = (conf.start(), conf.start());
    let mut passed_total = 0;
    for n in 0..8 {
        let addr = if n % 2 == 0 { a.addr } else { b.addr };
        if get(addr, "/", &[("x-api-key", "team"), ("x-tenant-limit", "5")]).await.status == 200 {
            passed_total += 1;
        }
    }
    assert_eq!(passed_total, 5, "one budget of 5 between the two instances");
    assert_eq!(passed(a.addr, "plain", &[], 3).await, 2);
    let given = admin(&a, http::Method::PUT, "/overrides/quota/op", r#"{"limit": 3}"#).await;
    assert_eq!(given.status, 200);
    assert_eq!(passed(a.addr, "op", &[], 5).await, 3);
}

#[test]
fn check_places_every_limit_from_error() {
    let cases = [
        (
            "  l: { key: \"header:x-k\", on_missing_key: skip, rate: 1r/s, limit_from: { header: x-n, max: 5 } }\n",
            "limits.l.limit_from.header",
            "trusted_proxies",
        ),
        (
            "  l: { key: \"header:x-k\", on_missing_key: skip, algorithm: min_interval, interval: 1s, limit_from: { max: 5 } }\n",
            "limits.l.limit_from",
            "minimum interval",
        ),
        (
            "  l: { key: \"header:x-k\", on_missing_key: skip, algorithm: sliding_log, limit: 5, window: 1s, limit_from: { max: 100000 } }\n",
            "limits.l.limit_from.max",
            "at most 65536",
        ),
        (
            "  l: { key: \"header:x-k\", on_missing_key: skip, rates: [10r/s, 100r/m], limit_from: { max: 5 } }\n",
            "limits.l.limit_from",
            "one window",
        ),
        (
            "  l: { key: \"header:x-k\", on_missing_key: skip, rate: 1r/s, limit_from: { min: 5 } }\n",
            "limits.l.limit_from",
            "needs `max`",
        ),
        (
            "  l: { key: \"header:x-k\", on_missing_key: skip, rate: 1r/s, limit_from: { min: 6, max: 5 } }\n",
            "limits.l.limit_from.max",
            "at least `min`",
        ),
        (
            "  l: { key: \"header:x-k\", on_missing_key: skip, rate: 1r/s, limit_from: { jwt: tier_limit, max: 5 } }\n",
            "limits.l.limit_from.jwt",
            "jwt:",
        ),
    ];
    for (limit, field, words) in cases {
        let yaml = format!(
            "listen: 127.0.0.1:0\nlimits:\n{limit}routes:\n  - {{ limits: [l], respond: {{ status: 200 }} }}\n"
        );
        let (code, out) = check_bounded(&yaml);
        assert_eq!(code, Some(1), "{limit}: {out}");
        assert!(out.contains(field) && out.contains(words), "{limit}: wanted {field} saying {words:?}: {out}");
        assert!(out.contains(":3:"), "placed on the limit's line: {out}");
    }
}

#[tokio::test]
async fn a_keys_own_count_is_shown_in_config_explain_and_the_access_log() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let sg = quota("127.0.0.1").set(&format!("access_log: {{ format: json, path: \"{}\" }}", log.display())).start();
    let config: serde_json::Value = serde_json::from_slice(&get(sg.admin_addr(), "/config", &[]).await.body).unwrap();
    let from = &config["limits"][0]["limit_from"];
    assert_eq!(
        (from["header"].as_str(), from["min"].as_u64(), from["max"].as_u64()),
        (Some("x-tenant-limit"), Some(1), Some(5)),
        "{config}"
    );
    assert_eq!(get(sg.addr, "/", &[("x-api-key", "t1"), ("x-tenant-limit", "9")]).await.status, 200);
    let asked =
        r#"{"url": "http://localhost/", "headers": {"x-api-key": "t1", "x-tenant-limit": "9"}, "peer": "127.0.0.1"}"#;
    let explained = admin(&sg, http::Method::POST, "/explain", asked).await;
    let explained: serde_json::Value = serde_json::from_slice(&explained.body).unwrap();
    let own = &explained["limits"][0]["own_count"];
    assert_eq!(
        (own["count"].as_u64(), own["from"].as_str(), own["clamped"].as_bool()),
        (Some(5), Some("header"), Some(true)),
        "{explained}"
    );
    let line = block_until_line(&log);
    assert_eq!(line["own_counts"]["quota"].as_u64(), Some(5), "{line}");
}

/// The first line of the JSON access log at `path`, once written.
fn block_until_line(path: &std::path::Path) -> serde_json::Value {
    let mut line = String::new();
    block_until("an access-log line", Duration::from_secs(5), || {
        line = std::fs::read_to_string(path).unwrap_or_default();
        line.ends_with('\n')
    });
    serde_json::from_str(line.lines().next().unwrap()).unwrap()
}
