//! `sluicegate simulate`: access logs made here with a known answer, replayed by the real
//! binary through the configuration's routes and limits.

use std::path::{Path, PathBuf};
use std::process::Output;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use serde_json::Value;

use crate::common::*;
use crate::conformance::{nginx_delays_ms, policy_yaml, scenarios, tolerance_ms};

/// A log format that carries the conformance fixtures' key and times to the millisecond.
const KEYED_MS: &str = r#"$remote_addr [$msec] "$request" $status "$http_x_key""#;

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// Runs `sluicegate simulate ARGS` in `dir`; stdout and stderr as text.
fn simulate(dir: &Path, args: &[&str]) -> (Output, String, String) {
    let out = binary().arg("simulate").args(args).current_dir(dir).output().unwrap();
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(out.status.success(), "simulate {args:?} failed:\n{stderr}");
    (out, stdout, stderr)
}

fn simulate_json(dir: &Path, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let (_, stdout, _) = simulate(dir, &all);
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{stdout}"))
}

/// The decisions file's lines, in log line order.
fn decisions(path: &Path) -> Vec<Value> {
    let mut lines: Vec<Value> =
        std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    lines.sort_by_key(|d| (d["line"].as_u64().unwrap(), d["config_index"].as_u64().unwrap_or(0)));
    lines
}

/// What the proxy would answer: the refusing limit's status, else 200.
fn status(decision: &Value) -> u16 {
    decision["status"].as_u64().map_or(200, |s| s as u16)
}

/// `ip - - [22/Nov/2026:10:00:SS +0000] "GET PATH HTTP/1.1" 200 2 "-" "curl/8"`.
fn combined(ip: &str, second: u32, path: &str) -> String {
    format!("{ip} - - [22/Nov/2026:10:00:{second:02} +0000] \"GET {path} HTTP/1.1\" 200 2 \"-\" \"curl/8\"\n")
}

const PER_IP: &str = "listen: 127.0.0.1:0
limits:
  per_ip: { key: ip, rate: 1r/s, nodelay: true }
routes:
  - name: all
    limits: [per_ip]
    respond: { status: 200 }
";

#[test]
fn each_nginx_conformance_schedule_written_as_a_log_replays_to_the_statuses_nginx_recorded() {
    for s in scenarios() {
        let dir = tempfile::tempdir().unwrap();
        let config = write(dir.path(), "c.yaml", &policy_yaml(&s));
        let log: String = s
            .requests
            .iter()
            .map(|r| {
                let msec = format!("{}.{:03}", 1_700_000_000 + r.t_ms / 1000, r.t_ms % 1000);
                format!("127.0.0.1 [{msec}] \"GET / HTTP/1.1\" {} \"{}\"\n", r.status, r.key.as_deref().unwrap_or("-"))
            })
            .collect();
        write(dir.path(), "access.log", &log);
        let config = config.to_str().unwrap();
        simulate(dir.path(), &["-c", config, "--format", KEYED_MS, "--decisions", "d.jsonl", "access.log"]);
        let decided = decisions(&dir.path().join("d.jsonl"));
        assert_eq!(decided.len(), s.requests.len(), "{}", s.scenario);
        let ours: Vec<u16> = decided.iter().map(status).collect();
        let theirs: Vec<u16> = s.requests.iter().map(|r| r.status).collect();
        assert_eq!(ours, theirs, "{}", s.scenario);
        for ((d, nginx), r) in decided.iter().zip(nginx_delays_ms(&s)).zip(&s.requests) {
            let wait = d["wait_ms"].as_f64().unwrap();
            assert!((wait - nginx).abs() <= tolerance_ms(nginx), "{} at {} ms: {wait} vs {nginx}", s.scenario, r.t_ms);
        }
    }
}

#[test]
fn a_combined_log_replays_each_second_in_file_order_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "c.yaml", PER_IP);
    let log = [
        combined("10.0.0.1", 1, "/a"),
        combined("10.0.0.1", 1, "/b"),
        combined("10.0.0.2", 1, "/a"),
        combined("10.0.0.1", 1, "/c"),
        combined("10.0.0.1", 2, "/a"),
    ]
    .concat();
    write(dir.path(), "access.log", &log);
    // The format is told from the lines.
    let report = simulate_json(dir.path(), &["-c", "c.yaml", "--decisions", "d.jsonl", "access.log"]);
    assert_eq!(report["format"], "combined");
    assert_eq!(report["timestamps"], "seconds");
    let route = &report["configs"][0]["routes"][0];
    assert_eq!(
        (route["requests"].as_u64(), route["passed"].as_u64(), route["rejected"].as_u64()),
        (Some(5), Some(3), Some(2))
    );
    let limit = &report["configs"][0]["limits"][0];
    assert_eq!(limit["top_keys"], serde_json::json!([{ "key": "ip=10.0.0.1", "rejected": 2 }]));
    let statuses: Vec<u16> = decisions(&dir.path().join("d.jsonl")).iter().map(status).collect();
    assert_eq!(statuses, [200, 429, 200, 429, 200]);
    let (_, text, _) = simulate(dir.path(), &["-c", "c.yaml", "access.log"]);
    assert!(text.contains("whole seconds: requests within one second are taken in file order"), "{text}");
    assert!(text.contains("ip=10.0.0.1"), "{text}");
}

#[test]
fn unreadable_lines_are_counted_and_shown_with_their_line_numbers_and_the_rest_replays() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "c.yaml", PER_IP);
    let log = [
        combined("10.0.0.1", 1, "/"),
        "\\x16\\x03\\x01 garbage from a TLS client\n".to_owned(),
        combined("10.0.0.2", 1, "/"),
        combined("10.0.0.3", 1, "/"),
        "not.an.ip - - [22/Nov/2026:10:00:01 +0000] \"GET / HTTP/1.1\" 200 2 \"-\" \"-\"\n".to_owned(),
        combined("10.0.0.4", 2, "/"),
    ]
    .concat();
    write(dir.path(), "access.log", &log);
    let report = simulate_json(dir.path(), &["-c", "c.yaml", "--format", "combined", "access.log"]);
    assert_eq!(report["intake"]["lines"], 6);
    assert_eq!(report["intake"]["requests"], 4);
    assert_eq!(report["intake"]["unreadable"], 2);
    let lines: Vec<u64> =
        report["intake"]["examples"].as_array().unwrap().iter().map(|e| e["line"].as_u64().unwrap()).collect();
    assert_eq!(lines, [2, 5]);
    assert!(report["intake"]["examples"][1]["reason"].as_str().unwrap().contains("not an IP address"));
    assert_eq!(report["configs"][0]["routes"][0]["passed"], 4);
    let (_, text, _) = simulate(dir.path(), &["-c", "c.yaml", "access.log"]);
    assert!(text.contains("unreadable: access.log:5: "), "{text}");
}

#[test]
fn a_limit_keyed_on_a_header_the_log_lacks_is_reported_as_not_simulated() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "c.yaml",
        "listen: 127.0.0.1:0
limits:
  per_ip: { key: ip, rate: 1r/s, nodelay: true, allow: { headers: { x-internal: \"yes\" } } }
  per_key: { key: \"header:x-api-key\", on_missing_key: skip, rate: 1r/m }
routes:
  - limits: [per_ip, per_key]
    respond: { status: 200 }
",
    );
    write(dir.path(), "access.log", &[combined("10.0.0.1", 1, "/"), combined("10.0.0.2", 1, "/")].concat());
    let report = simulate_json(dir.path(), &["-c", "c.yaml", "access.log"]);
    let limits = &report["configs"][0]["limits"];
    assert!(limits[0]["not_simulated"].is_null());
    assert_eq!(limits[0]["requests"], 2);
    let why = limits[1]["not_simulated"].as_str().unwrap();
    assert!(why.contains("header:x-api-key") && why.contains("$http_x_api_key"), "{why}");
    assert_eq!(limits[1]["not_simulated_requests"], 2);
    assert_eq!(limits[1]["requests"], 0);
    let notes = report["configs"][0]["notes"].to_string();
    assert!(notes.contains("the allow-list of limit per_ip matches on the header x-internal"), "{notes}");
    // The route is marked: its counts are not all its limits would have made.
    let route = &report["configs"][0]["routes"][0];
    assert_eq!(route["limits_not_simulated"], serde_json::json!([{ "limit": "per_key", "requests": 2 }]));
    let (_, text, _) = simulate(dir.path(), &["-c", "c.yaml", "access.log"]);
    assert!(text.contains("NOT SIMULATED"), "{text}");
    assert!(text.contains("LIMITS NOT SIMULATED: per_key (2 requests)"), "{text}");
    // A format that carries the header: the limit is simulated, one key per value.
    let format = r#"$remote_addr [$time_local] "$request" $status "$http_x_api_key""#;
    let log = "10.0.0.1 [22/Nov/2026:10:00:01 +0000] \"GET / HTTP/1.1\" 200 \"k1\"\n\
               10.0.0.2 [22/Nov/2026:10:00:01 +0000] \"GET / HTTP/1.1\" 200 \"k2\"\n\
               10.0.0.3 [22/Nov/2026:10:00:01 +0000] \"GET / HTTP/1.1\" 200 \"k1\"\n\
               10.0.0.4 [22/Nov/2026:10:00:01 +0000] \"GET / HTTP/1.1\" 200 \"-\"\n";
    write(dir.path(), "keyed.log", log);
    let report = simulate_json(dir.path(), &["-c", "c.yaml", "--format", format, "keyed.log"]);
    let per_key = &report["configs"][0]["limits"][1];
    assert!(per_key["not_simulated"].is_null());
    assert_eq!(report["configs"][0]["routes"][0]["limits_not_simulated"], serde_json::json!([]));
    assert_eq!((per_key["passed"].as_u64(), per_key["rejected"].as_u64()), (Some(2), Some(1)));
    assert_eq!(per_key["no_key"], 1);
    // A credential is shown by its keyed hash, as `log_keys: hashed_secrets` has it.
    let key = per_key["top_keys"][0]["key"].as_str().unwrap();
    assert!(key.starts_with("header:x-api-key=#") && !key.contains("k1"), "{key}");
}

#[test]
fn two_configurations_are_compared_with_the_keys_newly_refused() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "old.yaml",
        &PER_IP.replace("rate: 1r/s, nodelay: true", "rate: 10r/s, burst: 20, nodelay: true"),
    );
    write(dir.path(), "new.yaml", &PER_IP.replace("rate: 1r/s, nodelay: true", "rate: 1r/s, burst: 2, nodelay: true"));
    let mut log: Vec<String> = (0..5).map(|_| combined("10.0.0.1", 1, "/")).collect();
    log.push(combined("10.0.0.2", 1, "/"));
    write(dir.path(), "access.log", &log.concat());
    let report = simulate_json(dir.path(), &["-c", "old.yaml", "-c", "new.yaml", "--plot", "p.svg", "access.log"]);
    let changes = &report["changes"];
    assert_eq!(changes["newly_refused"], 2);
    assert_eq!(changes["newly_admitted"], 0);
    assert_eq!(
        changes["newly_refused_keys"],
        serde_json::json!([{ "limit": "per_ip", "key": "ip=10.0.0.1", "requests": 2 }])
    );
    assert_eq!(changes["routes"][0]["old"]["rejected"], 0);
    assert_eq!(changes["routes"][0]["new"]["rejected"], 2);
    let svg = std::fs::read_to_string(dir.path().join("p.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("per_ip (old.yaml)") && svg.contains("per_ip (new.yaml)"));
    let (_, text, _) = simulate(dir.path(), &["-c", "old.yaml", "--compare", "new.yaml", "access.log"]);
    assert!(text.contains("== changes from old.yaml to new.yaml"), "{text}");
    assert!(text.contains("2 requests newly refused"), "{text}");
    assert!(text.contains("limit per_ip: ip=10.0.0.1"), "{text}");
}

#[test]
fn a_concurrency_limit_holds_each_request_for_its_logged_duration() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "c.yaml",
        "listen: 127.0.0.1:0\nlimits:\n  one: { key: ip, concurrency: 1 }\nroutes:\n  - limits: [one]\n    respond: { status: 200 }\n",
    );
    // nginx writes a line when its request ends ($msec), so the lines come in order of
    // their ends: B (0.5 to 0.6) is written before A (0 to 1), which it overlaps.
    let line = |ip: &str, end: &str, took: &str| format!("{ip} [{end}] \"GET / HTTP/1.1\" 200 {took}\n");
    let log = [
        line("10.0.0.1", "1700000000.600", "0.100"), // B: refused, A is in progress
        line("10.0.0.1", "1700000001.000", "1.000"), // A
        line("10.0.0.1", "1700000001.200", "0.200"), // C: starts as A ends
        line("10.0.0.2", "1700000001.150", "0.050"), // D: another client
    ]
    .concat();
    write(dir.path(), "access.log", &log);
    let format = r#"$remote_addr [$msec] "$request" $status $request_time"#;
    let report =
        simulate_json(dir.path(), &["-c", "c.yaml", "--format", format, "--decisions", "d.jsonl", "access.log"]);
    let limit = &report["configs"][0]["limits"][0];
    assert!(limit["not_simulated"].is_null());
    assert_eq!((limit["passed"].as_u64(), limit["rejected"].as_u64()), (Some(3), Some(1)));
    let statuses: Vec<u16> = decisions(&dir.path().join("d.jsonl")).iter().map(status).collect();
    assert_eq!(statuses, [429, 200, 200, 200]);
    // Without durations it cannot be simulated, and says so.
    let report = simulate_json(
        dir.path(),
        &["-c", "c.yaml", "--format", r#"$remote_addr [$msec] "$request" $status $body_bytes_sent"#, "access.log"],
    );
    let why = report["configs"][0]["limits"][0]["not_simulated"].as_str().unwrap();
    assert!(why.contains("$request_time"), "{why}");
}

#[tokio::test]
async fn the_proxys_own_json_log_replays_to_the_answers_the_proxy_gave() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let sg = Sluicegate::start(&format!(
        "listen: 127.0.0.1:0
access_log: {{ format: json, path: \"{}\" }}
limits:
  per_ip: {{ key: ip, rate: 1r/m, burst: 2, nodelay: true }}
  slow: {{ key: ip, rate: 1r/m, burst: 5 }}
routes:
  - name: fast
    match: {{ path_prefix: /fast }}
    limits: [per_ip]
    respond: {{ status: 200 }}
  - name: slow
    limits: [slow]
    respond: {{ status: 204 }}
",
        log.display()
    ));
    let mut answers = Vec::new();
    for _ in 0..5 {
        answers.push(get(sg.addr, "/fast", &[]).await.status);
    }
    answers.push(get(sg.addr, "/slow", &[]).await.status);
    assert_eq!(answers, [200, 200, 200, 429, 429, 204]);
    let lines = crate::logs::access_lines(&log, answers.len());
    assert_eq!(lines.len(), answers.len());
    let config = sg.config.to_str().unwrap();
    let report = simulate_json(dir.path(), &["-c", config, "--decisions", "d.jsonl", "access.log"]);
    assert_eq!(report["format"], "json");
    assert_eq!(report["timestamps"], "milliseconds");
    assert_eq!(report["intake"]["requests"], 6);
    let fast = &report["configs"][0]["routes"][0];
    assert_eq!(
        (fast["name"].as_str(), fast["passed"].as_u64(), fast["rejected"].as_u64()),
        (Some("fast"), Some(3), Some(2))
    );
    let slow = &report["configs"][0]["routes"][1];
    assert_eq!(slow["delayed"], 0, "a fresh key's first request is not delayed");
    // Request by request, the replay answers what the proxy answered.
    let logged: Vec<u64> =
        lines.iter().map(|l| serde_json::from_str::<Value>(l).unwrap()["status"].as_u64().unwrap()).collect();
    let replayed: Vec<u64> = decisions(&dir.path().join("d.jsonl"))
        .iter()
        .map(|d| match d["status"].as_u64() {
            Some(refused) => refused,
            None => {
                if d["route"] == "slow" {
                    204
                } else {
                    200
                }
            }
        })
        .collect();
    assert_eq!(replayed, logged);
}

#[test]
fn a_global_limit_is_replayed_as_one_instance_with_the_whole_budget_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    // Redis is never asked: the port is closed.
    write(
        dir.path(),
        "c.yaml",
        &format!(
            "listen: 127.0.0.1:0
redis: {{ url: \"redis://127.0.0.1:{}\" }}
limits:
  shared: {{ key: ip, rate: 1r/s, burst: 3, nodelay: true, scope: global, on_store_error: local, instances: 4 }}
routes:
  - limits: [shared]
    respond: {{ status: 200 }}
",
            closed_port()
        ),
    );
    // Five at once: the whole budget admits four (burst 3); a quarter share would admit one.
    write(dir.path(), "access.log", &(0..5).map(|_| combined("10.0.0.1", 1, "/")).collect::<String>());
    let report = simulate_json(dir.path(), &["-c", "c.yaml", "access.log"]);
    let limit = &report["configs"][0]["limits"][0];
    assert_eq!((limit["passed"].as_u64(), limit["rejected"].as_u64()), (Some(4), Some(1)));
    let notes = report["configs"][0]["notes"].to_string();
    assert!(notes.contains("global (instances: 4)") && notes.contains("whole budget"), "{notes}");
}

#[tokio::test]
async fn a_limit_with_several_windows_counts_once_per_request_in_metrics_and_in_simulate() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let sg = Sluicegate::start(&format!(
        "listen: 127.0.0.1:0
admin: {{ listen: 127.0.0.1:0 }}
access_log: {{ format: json, path: \"{}\" }}
limits:
  multi: {{ key: ip, rates: [2r/s, 3r/h] }}
routes:
  - name: all
    limits: [multi]
    respond: {{ status: 200 }}
",
        log.display()
    ));
    let mut answers = Vec::new();
    for _ in 0..6 {
        answers.push(get(sg.addr, "/", &[]).await.status);
    }
    // The one-second window admits two at once; the others are refused by it while the
    // hourly window still has room.
    assert_eq!(answers, [200, 200, 429, 429, 429, 429]);
    let metrics = Metrics::of(&sg).await;
    let decisions = |outcome: &str| {
        metrics.value(&format!("sluicegate_limit_decisions_total{{limit=\"multi\",outcome=\"{outcome}\"}}"))
    };
    assert_eq!((decisions("passed"), decisions("rejected")), (2.0, 4.0), "one decision per request, not per window");
    crate::logs::access_lines(&log, answers.len());
    let config = sg.config.to_str().unwrap();
    let report = simulate_json(dir.path(), &["-c", config, "access.log"]);
    let limit = &report["configs"][0]["limits"][0];
    assert_eq!((limit["passed"].as_u64(), limit["rejected"].as_u64()), (Some(2), Some(4)), "as /metrics counts");
}

/// The secret of the access log's digests in the tests.
const KEYS_SECRET: &str = "test-secret-0123456789";

/// Two limits keyed on what only the access log's `keys` carries: a tenant's header and a
/// bearer token; the log at `log`.
fn keyed_by_tenant_and_token(log: &Path) -> String {
    format!(
        "listen: 127.0.0.1:0
admin: {{ listen: 127.0.0.1:0 }}
access_log: {{ format: json, path: \"{}\", keys: true, keys_secret: \"{KEYS_SECRET}\" }}
limits:
  per_tenant: {{ key: \"header:x-tenant\", on_missing_key: skip, rate: 1r/m, burst: 2, nodelay: true }}
  per_token: {{ key: bearer, on_missing_key: skip, rate: 1r/m, burst: 1, nodelay: true }}
routes:
  - name: api
    limits: [per_tenant, per_token]
    respond: {{ status: 200 }}
",
        log.display()
    )
}

/// What `/metrics` says limit `limit` decided: (passed, rejected).
fn decided(metrics: &Metrics, limit: &str) -> (u64, u64) {
    let count = |outcome: &str| {
        metrics.get(&format!("sluicegate_limit_decisions_total{{limit=\"{limit}\",outcome=\"{outcome}\"}}"))
    };
    (count("passed").unwrap_or(0.0) as u64, count("rejected").unwrap_or(0.0) as u64)
}

#[tokio::test]
async fn limits_keyed_on_a_header_and_a_bearer_token_replay_from_the_proxys_log_as_the_proxy_decided() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let sg = Sluicegate::start(&keyed_by_tenant_and_token(&log));
    // (tenant, token): each limit refuses some, and a request one limit refuses leaves
    // the other's count as it was.
    let sent = [
        (Some("acme"), Some("tok-A-5e1f0c9d")),
        (Some("acme"), Some("tok-A-5e1f0c9d")),
        (Some("acme"), Some("tok-A-5e1f0c9d")), // the token's third: refused
        (Some("acme"), Some("tok-B-77aa3b21")),
        (Some("acme"), Some("tok-B-77aa3b21")), // the tenant's fourth: refused
        (Some("globex"), Some("tok-B-77aa3b21")),
        (Some("globex"), Some("tok-B-77aa3b21")), // the token's third: refused
        (Some("globex"), None),
        (None, Some("tok-C-0d4e8f12")),
        (None, None),
        (Some("initech"), Some("tok-C-0d4e8f12")),
        (Some("initech"), Some("tok-C-0d4e8f12")), // the token's third: refused
    ];
    let mut answers = Vec::new();
    for (tenant, token) in sent {
        let bearer = token.map(|t| format!("Bearer {t}"));
        let mut headers = Vec::new();
        headers.extend(tenant.map(|t| ("x-tenant", t)));
        headers.extend(bearer.as_deref().map(|b| ("authorization", b)));
        answers.push(get(sg.addr, "/", &headers).await.status);
    }
    assert_eq!(answers, [200, 200, 429, 200, 429, 200, 429, 200, 200, 200, 200, 429]);
    let lines = crate::logs::access_lines(&log, sent.len());
    let metrics = Metrics::of(&sg).await;
    let text = std::fs::read_to_string(&log).unwrap();
    for token in ["tok-A-5e1f0c9d", "tok-B-77aa3b21", "tok-C-0d4e8f12"] {
        assert!(!text.contains(token), "a bearer token in clear in the access log:\n{text}");
    }
    let first: Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(first["keys"]["header:x-tenant"], "acme", "no credential: as sent");
    assert!(first["keys"]["bearer"].as_str().unwrap().starts_with('#'));
    let last_but_two: Value = serde_json::from_str(&lines[9]).unwrap();
    assert_eq!(last_but_two["keys"], serde_json::json!({ "header:x-tenant": null, "bearer": null }));

    let config = sg.config.to_str().unwrap();
    let report = simulate_json(dir.path(), &["-c", config, "--decisions", "d.jsonl", "access.log"]);
    let replayed = &report["configs"][0];
    // Each limit decided as /metrics counted its decisions.
    for (i, name) in ["per_tenant", "per_token"].iter().enumerate() {
        let limit = &replayed["limits"][i];
        assert_eq!(limit["name"], *name);
        assert!(limit["not_simulated"].is_null() && limit["partly_simulated"].is_null(), "{limit}");
        let simulated = (limit["passed"].as_u64().unwrap(), limit["rejected"].as_u64().unwrap());
        assert_eq!(simulated, decided(&metrics, name), "limit {name}");
    }
    assert_eq!(replayed["limits"][0]["no_key"], 2);
    assert_eq!(replayed["limits"][1]["no_key"], 2);
    // The route's requests as the log's outcomes have them, and none unsimulated.
    let route = &replayed["routes"][0];
    let outcomes = |outcome: &str| {
        lines.iter().filter(|l| serde_json::from_str::<Value>(l).unwrap()["outcome"] == outcome).count() as u64
    };
    assert_eq!(
        (route["passed"].as_u64(), route["rejected"].as_u64()),
        (Some(outcomes("passed")), Some(outcomes("rejected")))
    );
    assert_eq!(route["limits_not_simulated"], serde_json::json!([]));
    // Request by request, the replay answers what the proxy answered.
    let logged: Vec<u16> =
        lines.iter().map(|l| serde_json::from_str::<Value>(l).unwrap()["status"].as_u64().unwrap() as u16).collect();
    let replayed: Vec<u16> = decisions(&dir.path().join("d.jsonl")).iter().map(status).collect();
    assert_eq!(replayed, logged);
    // The keys refused most are named as the log names them: the token by its digest.
    let (_, text, _) = simulate(dir.path(), &["-c", config, "access.log"]);
    assert!(text.contains("header:x-tenant=acme"), "{text}");
    assert!(!text.contains("tok-"), "{text}");

    // A limit keyed on a header the proxy's limits did not use: its lines do not record
    // it, and the route says its counts are not all the limits would have made.
    let more = std::fs::read_to_string(config)
        .unwrap()
        .replace("limits: [per_tenant, per_token]", "limits: [per_tenant, per_token, per_user]");
    let more = more
        .replace("limits:\n", "limits:\n  per_user: { key: \"header:x-user\", on_missing_key: skip, rate: 1r/m }\n");
    write(dir.path(), "more.yaml", &more);
    let report = simulate_json(dir.path(), &["-c", "more.yaml", "access.log"]);
    let replayed = &report["configs"][0];
    let per_user = replayed["limits"].as_array().unwrap().iter().find(|l| l["name"] == "per_user").unwrap();
    let why = per_user["not_simulated"].as_str().unwrap();
    assert!(why.contains("header:x-user") && why.contains("no line") && why.contains("keys: true"), "{why}");
    assert_eq!((per_user["requests"].as_u64(), per_user["not_simulated_requests"].as_u64()), (Some(0), Some(12)));
    assert_eq!(
        replayed["routes"][0]["limits_not_simulated"],
        serde_json::json!([{ "limit": "per_user", "requests": 12 }])
    );
    let (_, text, _) = simulate(dir.path(), &["-c", "more.yaml", "access.log"]);
    assert!(text.contains("LIMITS NOT SIMULATED: per_user (12 requests)"), "{text}");
}

/// A sluicegate JSON line of a `GET /` from `ip` at second `second` with `keys` (raw JSON,
/// or nothing: a line written without `keys`).
fn json_line(ip: &str, second: u32, keys: Option<&str>) -> String {
    let keys = keys.map_or_else(String::new, |k| format!(",\"keys\":{k}"));
    format!(
        "{{\"time\":\"2026-11-22T10:00:{second:02}.000Z\",\"client\":\"{ip}\",\"method\":\"GET\",\"target\":\"/\",\"status\":200,\"duration_ms\":1.0,\"route\":\"api\",\"outcome\":\"passed\"{keys}}}\n"
    )
}

#[test]
fn a_route_whose_limits_its_lines_do_not_all_record_is_marked_and_the_rest_replays() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "c.yaml",
        "listen: 127.0.0.1:0
limits:
  per_ip: { key: ip, rate: 1r/m, burst: 9, nodelay: true }
  per_tenant: { key: \"header:x-tenant\", on_missing_key: skip, rate: 1r/m, burst: 1, nodelay: true }
  per_user: { key: \"header:x-user\", on_missing_key: skip, rate: 1r/m, nodelay: true }
routes:
  - name: api
    match: { path_prefix: / }
    limits: [per_ip, per_tenant, per_user]
    respond: { status: 200 }
",
    );
    let both = r#"{"header:x-tenant":"acme","header:x-user":"u1"}"#;
    let tenant = r#"{"header:x-tenant":"acme"}"#;
    let log = [
        json_line("10.0.0.1", 1, Some(both)),
        json_line("10.0.0.1", 2, Some(both)),   // per_user refuses u1's second
        json_line("10.0.0.1", 3, Some(tenant)), // x-user not recorded: per_user cannot say
        json_line("10.0.0.1", 4, Some(tenant)), // per_tenant refuses acme's third
        json_line("10.0.0.1", 5, None),         // written without keys
    ]
    .concat();
    write(dir.path(), "access.log", &log);
    let report = simulate_json(dir.path(), &["-c", "c.yaml", "access.log"]);
    let replayed = &report["configs"][0];
    assert_eq!(
        replayed["routes"][0]["limits_not_simulated"],
        serde_json::json!([
            { "limit": "per_tenant", "requests": 1 },
            { "limit": "per_user", "requests": 3 },
        ])
    );
    let limit = |name: &str| replayed["limits"].as_array().unwrap().iter().find(|l| l["name"] == name).unwrap().clone();
    let per_ip = limit("per_ip");
    assert!(per_ip["partly_simulated"].is_null() && per_ip["not_simulated"].is_null());
    assert_eq!(per_ip["requests"], 5, "the client address is on every line");
    let per_tenant = limit("per_tenant");
    // Its own decisions: the second request, refused by per_user, is none of its own (it
    // took nothing of acme's), the fourth is acme's third.
    assert_eq!((per_tenant["passed"].as_u64(), per_tenant["rejected"].as_u64()), (Some(2), Some(1)));
    assert_eq!(per_tenant["not_simulated_requests"], 1);
    let per_user = limit("per_user");
    assert!(per_user["not_simulated"].is_null());
    assert_eq!((per_user["passed"].as_u64(), per_user["rejected"].as_u64()), (Some(1), Some(1)));
    let why = per_user["partly_simulated"].as_str().unwrap();
    assert!(why.starts_with("their lines do not record header:x-user"), "{why}");
    let (_, text, _) = simulate(dir.path(), &["-c", "c.yaml", "access.log"]);
    assert!(text.contains("LIMITS NOT SIMULATED: per_tenant (1 requests), per_user (3 requests)"), "{text}");
    assert!(
        text.contains("NOT SIMULATED for 3 requests of its routes: their lines do not record header:x-user"),
        "{text}"
    );
    // Two parts that recorded keys can only put back in one field are named.
    write(
        dir.path(),
        "shared.yaml",
        "listen: 127.0.0.1:0
limits:
  per_token: { key: bearer, on_missing_key: skip, rate: 1r/m }
  per_auth: { key: \"header:authorization\", on_missing_key: skip, rate: 1r/m }
routes:
  - limits: [per_token, per_auth]
    respond: { status: 200 }
",
    );
    let report = simulate_json(dir.path(), &["-c", "shared.yaml", "access.log"]);
    let notes = report["configs"][0]["notes"].to_string();
    assert!(notes.contains("keyed on both bearer and header:authorization"), "{notes}");
}

/// gRPC calls in the proxy's JSON log count by the `grpc_status` they ended with, as the
/// proxy counts them (`count_grpc`), and a refused one is answered with the limit's
/// `grpc_status` in the decisions.
#[test]
fn grpc_calls_count_by_their_logged_grpc_status_and_are_refused_with_the_limits() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "c.yaml",
        "listen: 127.0.0.1:0
limits:
  bad_auth: { key: ip, rate: 1r/m, burst: 1, nodelay: true, count_grpc: [UNAUTHENTICATED], grpc_status: UNAVAILABLE }
routes:
  - name: api
    limits: [bad_auth]
    respond: { status: 200 }
",
    );
    // A call that ended with `grpc_status` (HTTP 200, as every gRPC answer), at second `s`.
    let call = |s: u32, code: u8| {
        format!(
            "{{\"time\":\"2026-11-22T10:00:{s:02}.000Z\",\"client\":\"10.0.0.1\",\"method\":\"POST\",\"target\":\"/a.B/C\",\"status\":200,\"grpc_status\":{code},\"duration_ms\":1.0}}\n"
        )
    };
    // Successful calls count nothing; the second failed authentication uses up the
    // burst, and the next call is refused whatever it would have ended with.
    let log = [call(1, 0), call(2, 0), call(3, 16), call(4, 0), call(5, 16), call(6, 0)].concat();
    write(dir.path(), "access.log", &log);
    simulate(dir.path(), &["-c", "c.yaml", "--decisions", "d.jsonl", "access.log"]);
    let d = decisions(&dir.path().join("d.jsonl"));
    let outcomes: Vec<&str> = d.iter().map(|d| d["outcome"].as_str().unwrap()).collect();
    assert_eq!(outcomes, ["passed", "passed", "passed", "passed", "passed", "rejected"]);
    assert_eq!((d[5]["grpc_status"].as_u64(), d[0].get("grpc_status")), (Some(14), None));
}

#[tokio::test]
async fn requests_the_proxy_refused_with_400_for_their_keys_replay_as_refused_and_the_rest_as_decided() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let yaml = format!(
        "listen: 127.0.0.1:0
access_log: {{ format: json, path: \"{}\", keys: true, keys_secret: \"{KEYS_SECRET}\" }}
limits:
  per_client: {{ key: \"header:x-client\", rate: 1r/m, burst: 1, nodelay: true, on_missing_key: refuse }}
  per_key: {{ key: \"header:x-api-key\", rate: 1r/m, burst: 1, nodelay: true, on_missing_key: skip }}
  per_session: {{ key: \"cookie:sid\", rate: 1r/m, burst: 5, nodelay: true, on_missing_key: skip }}
routes:
  - name: api
    limits: [per_client, per_key, per_session]
    respond: {{ status: 200 }}
",
        log.display()
    );
    let sg = Sluicegate::start(&yaml);
    let sent: [&[(&str, &str)]; 8] = [
        &[("x-client", "c1"), ("x-api-key", "a1")],
        &[("x-api-key", "a1")],
        &[("x-client", "c1"), ("x-client", "c2")],
        &[("x-client", "c2"), ("x-api-key", "a1"), ("x-api-key", "a2")],
        &[("x-client", "c2"), ("cookie", "sid=s1; sid=s2")],
        &[("x-client", "c2"), ("authorization", "Bearer t")],
        &[("x-client", "c1")],
        &[("x-client", "c1"), ("x-api-key", "a1")],
    ];
    let mut statuses = Vec::new();
    for headers in sent {
        statuses.push(get(sg.addr, "/", headers).await.status);
    }
    assert_eq!(statuses, [200, 400, 400, 400, 400, 200, 200, 429], "the proxy's answers");
    let logged: Vec<Value> =
        crate::logs::access_lines(&log, sent.len()).iter().map(|l| serde_json::from_str(l).unwrap()).collect();
    write(dir.path(), "c.yaml", &yaml);
    simulate(dir.path(), &["-c", "c.yaml", "--decisions", "decisions.jsonl", "access.log"]);
    let replayed = decisions(&dir.path().join("decisions.jsonl"));
    assert_eq!(replayed.len(), sent.len());
    for (n, (logged, replayed)) in logged.iter().zip(&replayed).enumerate() {
        let status = replayed["status"].as_u64().unwrap_or(200);
        assert_eq!(Some(status), logged["status"].as_u64(), "request {n}: {logged} replayed as {replayed}");
        let missing = |v: &Value| v.get("missing_key").cloned().unwrap_or_else(|| serde_json::json!([]));
        assert_eq!(missing(replayed), missing(logged), "request {n}: {logged} replayed as {replayed}");
    }
    assert_eq!(replayed[1]["outcome"], "missing_key");
    assert_eq!(replayed[1]["limit"], "per_client");
    for n in [2, 3, 4] {
        assert_eq!(replayed[n]["outcome"], "repeated_key_field", "{}", replayed[n]);
    }
}

#[tokio::test]
async fn limits_keyed_on_verified_claims_replay_from_the_claims_the_proxys_log_recorded() {
    use jsonwebtoken::{EncodingKey, Header, encode};
    const SECRET: &str = "0123456789abcdef0123456789abcdef";
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let sg = Sluicegate::start(&format!(
        "listen: 127.0.0.1:0
access_log: {{ format: json, path: \"{}\", keys: true }}
jwt: {{ secret: \"{SECRET}\" }}
limits:
  per_user: {{ key: \"jwt:sub\", rate: 1r/m, burst: 1, nodelay: true, on_missing_key: skip }}
  per_org: {{ key: \"jwt:org.id\", rate: 1r/m, burst: 2, nodelay: true, on_missing_key: skip }}
routes:
  - name: api
    limits: [per_user, per_org]
    respond: {{ status: 200 }}
",
        log.display()
    ));
    let exp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 600;
    let token = |sub: &str, org: &str| {
        let claims = serde_json::json!({"sub": sub, "org": {"id": org}, "exp": exp});
        format!("Bearer {}", encode(&Header::default(), &claims, &EncodingKey::from_secret(SECRET.as_bytes())).unwrap())
    };
    let sent = [("alice", "acme"), ("alice", "acme"), ("alice", "acme"), ("bob", "acme"), ("carol", "globex")];
    let mut answers = Vec::new();
    for (sub, org) in sent {
        answers.push(get(sg.addr, "/", &[("authorization", &token(sub, org))]).await.status);
    }
    answers.push(get(sg.addr, "/", &[]).await.status);
    // alice's third is refused by per_user, and takes none of acme's three: bob's is.
    assert_eq!(answers, [200, 200, 429, 200, 200, 200]);
    let lines = crate::logs::access_lines(&log, answers.len());
    let first: Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(first["keys"], serde_json::json!({ "jwt:sub": "alice", "jwt:org.id": "acme" }));
    let config = sg.config.to_str().unwrap();
    simulate_json(dir.path(), &["-c", config, "--decisions", "d.jsonl", "access.log"]);
    let logged: Vec<u16> =
        lines.iter().map(|l| serde_json::from_str::<Value>(l).unwrap()["status"].as_u64().unwrap() as u16).collect();
    let replayed: Vec<u16> = decisions(&dir.path().join("d.jsonl")).iter().map(status).collect();
    assert_eq!(replayed, logged, "the replay decides by the logged claims as the proxy did");
    assert_eq!(logged, answers);
}

/// A limit keyed on a field of the JSON body replays from the fields the proxy's log
/// recorded (`keys: true`): no log line carries a body.
#[tokio::test]
async fn limits_keyed_on_body_fields_replay_from_the_fields_the_proxys_log_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let sg = Sluicegate::start(&format!(
        "listen: 127.0.0.1:0
access_log: {{ format: json, path: \"{}\", keys: true }}
limits:
  per_model: {{ key: \"json:model\", rate: 1r/m, burst: 1, nodelay: true, on_missing_key: shared }}
  per_tool: {{ key: \"json:params.name\", rate: 1r/m, burst: 2, nodelay: true, on_missing_key: skip }}
routes:
  - name: api
    limits: [per_model, per_tool]
    respond: {{ status: 200 }}
",
        log.display()
    ));
    let sent = [
        r#"{"model":"a","params":{"name":"t"}}"#,
        r#"{"model":"a","params":{"name":"t"}}"#,
        r#"{"model":"a","params":{"name":"t"}}"#,
        r#"{"model":"b","params":{"name":"t"}}"#,
        r#"{"model":"c","params":{"name":"u"}}"#,
        r#"{"other":1}"#,
        r#"{"other":2}"#,
        r#"{"other":3}"#,
    ];
    let mut answers = Vec::new();
    for body in sent {
        let req = Request::post("/").header("host", "test.local").body(Full::new(Bytes::from(body))).unwrap();
        answers.push(request(sg.addr, req).await.status);
    }
    // a's third is refused by per_model, and takes none of t's three: b's is; the bodies
    // without a model share one key.
    assert_eq!(answers, [200, 200, 429, 200, 200, 200, 200, 429]);
    let lines = crate::logs::access_lines(&log, answers.len());
    let first: Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(first["keys"], serde_json::json!({ "json:model": "a", "json:params.name": "t" }));
    let config = sg.config.to_str().unwrap();
    simulate_json(dir.path(), &["-c", config, "--decisions", "d.jsonl", "access.log"]);
    let replayed: Vec<u16> = decisions(&dir.path().join("d.jsonl")).iter().map(status).collect();
    assert_eq!(replayed, answers, "the replay decides by the logged fields as the proxy did");
}

/// A concurrency limit's queue on a replay: a request with no slot waits for the one a
/// logged request gives back when it ends, decided then, or is refused when its wait
/// runs out; against the same limit without a queue, which refuses them all.
#[test]
fn a_queue_on_a_replay_hands_the_slots_a_logged_request_gives_back_to_the_requests_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let limit = "listen: 127.0.0.1:0\nlimits:\n  c: { key: ip, concurrency: 1QUEUE }\nroutes:\n  - { limits: [c], respond: { status: 200 } }\n";
    write(dir.path(), "queue.yaml", &limit.replace("QUEUE", ", queue: { max: 5, max_wait: 500ms }"));
    write(dir.path(), "plain.yaml", &limit.replace("QUEUE", ""));
    // (ms from 10:00:00, duration ms): the first holds the slot to 300; the second gets
    // it then (to 600), the third at 600 (to 700), the fourth at 700 (to 800); the fifth
    // would get it at 800, after its 500 ms: refused at 760.
    let log: String = [(0, 300), (100, 300), (150, 100), (250, 100), (260, 100)]
        .iter()
        .map(|(at, duration)| {
            format!(
                "{{\"time\":\"2026-11-22T10:00:00.{at:03}Z\",\"client\":\"10.0.0.1\",\"method\":\"GET\",\"target\":\"/{at}\",\"status\":200,\"duration_ms\":{duration}.0}}\n"
            )
        })
        .collect();
    write(dir.path(), "access.log", &log);
    let report =
        simulate_json(dir.path(), &["-c", "queue.yaml", "-c", "plain.yaml", "--decisions", "d.jsonl", "access.log"]);
    let lines = decisions(&dir.path().join("d.jsonl"));
    let queued: Vec<(u16, u64)> = lines
        .iter()
        .filter(|d| d["config_index"] == 0)
        .map(|d| (status(d), d["wait_ms"].as_f64().unwrap().round() as u64))
        .collect();
    assert_eq!(queued, [(200, 0), (200, 200), (200, 450), (200, 450), (429, 0)], "{lines:#?}");
    let plain: Vec<u16> = lines.iter().filter(|d| d["config_index"] == 1).map(status).collect();
    assert_eq!(plain, [200, 429, 429, 429, 429]);
    let route = &report["configs"][0]["routes"][0];
    assert_eq!(
        (route["passed"].as_u64(), route["delayed"].as_u64(), route["rejected"].as_u64()),
        (Some(1), Some(3), Some(1)),
        "{report:#}"
    );
    // Without the queue, the three it served are refused.
    assert_eq!(report["changes"]["newly_refused"], 3, "{report:#}");
}

/// An adaptive concurrency limit on a replay learns from the logged durations: requests
/// of 20 ms, four at a time, raise its ceiling from min, and the report says where it
/// ended and what it measured.
#[test]
fn an_adaptive_ceiling_on_a_replay_learns_from_the_logged_durations() {
    let dir = tempfile::tempdir().unwrap();
    let config = "listen: 127.0.0.1:0\nlimits:\n  c: { key: ip, concurrency: adaptive, adaptive: { min: 1, max: 50, window: 10ms } }\nroutes:\n  - { limits: [c], respond: { status: 200 } }\n";
    write(dir.path(), "adaptive.yaml", config);
    // Every 5 ms for 400 ms, each lasting 20 ms: four in progress if all pass.
    let log: String = (0..80)
        .map(|i| {
            let at = i * 5;
            format!(
                "{{\"time\":\"2026-11-22T10:00:00.{at:03}Z\",\"client\":\"10.0.0.1\",\"method\":\"GET\",\"target\":\"/{at}\",\"status\":200,\"duration_ms\":20.0}}\n"
            )
        })
        .collect();
    write(dir.path(), "access.log", &log);
    let report = simulate_json(dir.path(), &["-c", "adaptive.yaml", "access.log"]);
    let ceiling = &report["configs"][0]["limits"][0]["ceiling"];
    assert!(ceiling["now"].as_u64().is_some_and(|n| n >= 4), "{report:#}");
    assert_eq!((ceiling["min"].as_u64(), ceiling["max"].as_u64()), (Some(1), Some(50)), "{report:#}");
    assert_eq!(ceiling["ground_ms"].as_f64(), Some(20.0), "{report:#}");
    let (_, text, _) = simulate(dir.path(), &["-c", "adaptive.yaml", "access.log"]);
    assert!(text.contains("ceiling at the end: "), "{text}");
}
