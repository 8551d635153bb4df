//! `sluicegate simulate`: access logs made here with a known answer, replayed by the real
//! binary through the configuration's routes and limits.

use std::path::{Path, PathBuf};
use std::process::Output;

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
  per_key: { key: \"header:x-api-key\", rate: 1r/m }
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
    let (_, text, _) = simulate(dir.path(), &["-c", "c.yaml", "access.log"]);
    assert!(text.contains("NOT SIMULATED"), "{text}");
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
