//! Requests that lack a limit's key: counted in `/metrics`, logged once, warned of by
//! `check`, and skipped, counted under one shared key, or refused (`on_missing_key`).

use crate::common::*;

/// A proxy answering every request, decided by limit `k`, keyed on `x-api-key`, with
/// `fields` more.
fn keyed(fields: &str) -> Sluicegate {
    Conf::new().admin().limit("k", &format!("key: \"header:x-api-key\", rate: 1r/m, {fields}")).answering("k").start()
}

#[tokio::test]
async fn requests_without_the_key_are_skipped_by_default_counted_and_logged_once() {
    let sg = keyed("on_missing_key: skip");
    for _ in 0..3 {
        assert_eq!(
            get(sg.addr, "/", &[]).await.status,
            200,
            "not counted: a limit of one a minute lets them all through"
        );
    }
    assert_eq!(get(sg.addr, "/", &[("x-api-key", "a")]).await.status, 200);
    assert_eq!(get(sg.addr, "/", &[("x-api-key", "a")]).await.status, 429, "with the key, it limits");
    let m = Metrics::of(&sg).await;
    assert_eq!(m.value("sluicegate_limit_missing_key_total{limit=\"k\"}"), 3.0);
    let log = sg.wait_for_log("the line \"a first request without this limit's key\"", |log| {
        log.contains("a first request without this limit's key")
    });
    assert_eq!(log.matches("a first request without this limit's key").count(), 1, "one line, not one per request");
    assert!(log.contains("on_missing_key: skip"), "{log}");
}

#[tokio::test]
async fn shared_counts_every_request_without_the_key_under_one_key() {
    let sg = keyed("on_missing_key: shared");
    assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
    assert_eq!(get(sg.addr, "/", &[]).await.status, 429, "the second request without a key shares the first's");
    assert_eq!(get(sg.addr, "/", &[("x-api-key", "a")]).await.status, 200, "a key of its own");
    let m = Metrics::of(&sg).await;
    assert_eq!(m.value("sluicegate_limit_missing_key_total{limit=\"k\"}"), 2.0);
}

#[tokio::test]
async fn refuse_answers_400_naming_the_limit_and_the_key() {
    let sg = keyed("on_missing_key: refuse");
    let refused = get(sg.addr, "/", &[]).await;
    assert_eq!(refused.status, 400);
    assert!(
        refused.text().contains("limit \"k\" counts requests by header:x-api-key, which this request lacks"),
        "{}",
        refused.text()
    );
    assert_eq!(get(sg.addr, "/", &[("x-api-key", "a")]).await.status, 200);
    let m = Metrics::of(&sg).await;
    assert_eq!(m.value("sluicegate_limit_missing_key_total{limit=\"k\"}"), 1.0);
    assert_eq!(
        m.value("sluicegate_requests_total{route=\"routes[0]\",outcome=\"missing_key\"}"),
        1.0,
        "counted with its route"
    );
    // A dry-run limit refuses nothing.
    let trial = keyed("on_missing_key: refuse, dry_run: true");
    assert_eq!(get(trial.addr, "/", &[]).await.status, 200);
}

#[test]
fn check_refuses_a_key_a_client_can_leave_out_until_on_missing_key_says_what_such_a_request_meets() {
    let conf = |key: &str, fields: &str| {
        Conf::new().limit("k", &format!("key: {key}, rate: 1r/s{fields}")).answering("k").yaml()
    };
    for key in
        ["\"header:x-api-key\"", "bearer", "\"cookie:session\"", "\"query:api_key\"", "[\"header:a\", \"cookie:b\"]"]
    {
        let (status, stderr) = check_bounded(&conf(key, ""));
        assert_eq!(status, Some(1), "{key}: an error: {stderr}");
        assert!(
            stderr.contains("FILE:3:")
                && stderr.contains("limits.k.key: a client can leave out")
                && stderr.contains("on_missing_key: refuse"),
            "{key}: {stderr}"
        );
        for mode in ["skip", "shared", "refuse"] {
            let (status, stderr) = check_bounded(&conf(key, &format!(", on_missing_key: {mode}")));
            assert_eq!(status, Some(0), "{key} {mode}: {stderr}");
            assert!(!stderr.contains("on_missing_key"), "{key} {mode}: {stderr}");
        }
    }
    for key in ["[ip, \"header:x\"]", "ip", "[method, \"cookie:b\"]"] {
        let (status, stderr) = check_bounded(&conf(key, ""));
        assert_eq!(status, Some(0), "{key} is never missing: {stderr}");
    }
}

#[tokio::test]
async fn the_access_log_names_the_limits_whose_key_a_request_lacked_as_the_counter_counts_them() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let sg = Conf::new()
        .admin()
        .set(&format!("access_log: {{ format: json, path: \"{}\" }}", log.display()))
        .limit("skipping", "key: \"header:x-a\", rate: 100r/s, burst: 10, on_missing_key: skip")
        .limit("sharing", "key: \"header:x-b\", rate: 100r/s, burst: 10, on_missing_key: shared")
        .limit("refusing", "key: \"header:x-c\", rate: 100r/s, burst: 10, on_missing_key: refuse")
        .answering("skipping, sharing, refusing")
        .start();
    assert_eq!(get(sg.addr, "/", &[("x-c", "c")]).await.status, 200);
    assert_eq!(get(sg.addr, "/", &[]).await.status, 400);
    assert_eq!(get(sg.addr, "/", &[("x-a", "a"), ("x-b", "b"), ("x-c", "c")]).await.status, 200);
    let lines: Vec<serde_json::Value> =
        crate::logs::access_lines(&log, 3).iter().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines[0]["missing_key"], serde_json::json!(["sharing", "skipping"]), "{}", lines[0]);
    assert_eq!(lines[1]["missing_key"], serde_json::json!(["refusing"]), "the limit that refused it: {}", lines[1]);
    assert!(lines[2].get("missing_key").is_none(), "absent when no key was missing: {}", lines[2]);
    let m = Metrics::of(&sg).await;
    for limit in ["skipping", "sharing", "refusing"] {
        let logged = lines.iter().filter(|l| l["missing_key"].as_array().is_some_and(|a| a.contains(&limit.into())));
        let counted = m.value(&format!("sluicegate_limit_missing_key_total{{limit=\"{limit}\"}}"));
        assert_eq!(logged.count() as f64, counted, "limit {limit}: the log and /metrics say the same");
    }
}
