//! `sluicegate simulate --synthetic` and `sluicegate verify`: the prediction of a load made
//! from the configuration alone, then a real run of the proxy under that load, driven
//! by a client here, checked against it through `/metrics`.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;

use crate::common::*;

/// `sluicegate ARGS`, its output.
fn sluicegate(args: &[&str]) -> Output {
    binary().args(args).output().unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `simulate --synthetic SPEC --json` of `config`.
fn predict(config: &Path, spec: &str) -> Value {
    let out = sluicegate(&["simulate", "-c", config.to_str().unwrap(), "--synthetic", spec, "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(&stdout(&out)).unwrap()
}

/// Limit `name`'s counts in a report.
fn limit<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["limits"].as_array().unwrap().iter().find(|l| l["name"] == name).unwrap()
}

/// `verify --snapshot FILE` of the instance whose admin listener is `admin`.
fn snapshot(config: &Path, admin: SocketAddr, file: &Path) {
    let metrics = format!("http://{admin}/metrics");
    let out = sluicegate(&[
        "verify",
        "-c",
        config.to_str().unwrap(),
        "--metrics",
        &metrics,
        "--snapshot",
        file.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// `verify -c CONFIG --since BEFORE --until AFTER --duration D --synthetic SPEC`.
fn verify(config: &Path, before: &Path, after: &Path, ran: Duration, spec: &str) -> Output {
    let duration = format!("{}us", ran.as_micros());
    sluicegate(&[
        "verify",
        "-c",
        config.to_str().unwrap(),
        "--since",
        before.to_str().unwrap(),
        "--until",
        after.to_str().unwrap(),
        "--duration",
        &duration,
        "--synthetic",
        spec,
    ])
}

/// Requests sent by every connection of a closed loop.
const MOST: u64 = 1_000_000;

/// A closed loop, as wrk drives a server: `connections` keep-alive connections, each
/// sending `GET /` with `x-key: key-(i mod keys)` as soon as its previous answer is in,
/// until `within` has passed (and at most `MOST` requests each). Returns how long the load
/// lasted, from its start to the last answer.
async fn closed_loop(addr: SocketAddr, connections: u32, keys: u32, within: Duration) -> Duration {
    let start = Instant::now();
    let tasks: Vec<_> = (0..connections)
        .map(|i| {
            tokio::spawn(async move {
                let stream = TcpStream::connect(addr).await.unwrap();
                let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
                tokio::spawn(conn);
                for _ in 0..MOST {
                    if start.elapsed() >= within {
                        break;
                    }
                    let request = Request::get("/")
                        .header("host", "test.local")
                        .header("x-key", format!("key-{}", i % keys))
                        .body(Full::new(Bytes::new()))
                        .unwrap();
                    let response = tokio::time::timeout(REPLY_WITHIN, sender.send_request(request))
                        .await
                        .expect("an answer")
                        .unwrap();
                    response.into_body().collect().await.unwrap();
                }
                start.elapsed()
            })
        })
        .collect();
    let mut lasted = Duration::ZERO;
    for task in tasks {
        lasted = lasted.max(task.await.unwrap());
    }
    lasted
}

const LIMITED: &str = "listen: 127.0.0.1:0
admin: { listen: 127.0.0.1:0 }
limits:
  per_key: { key: header:x-key, on_missing_key: skip, rate: 20r/s, burst: 4, nodelay: true }
routes:
  - name: api
    limits: [per_key]
    respond: { status: 200 }
";

#[test]
fn a_closed_loop_admits_per_key_its_burst_and_its_rate_over_the_run_whatever_the_turnaround() {
    let (_dir, config) = config_file(LIMITED);
    for turnaround in ["100us", "2ms"] {
        let spec = format!("connections=4 duration=1500ms keys=header:x-key:2 latency=0s turnaround={turnaround}");
        let predicted = predict(&config, &spec);
        // A fresh key: 1 + burst at once, then one each 50 ms: 5 + 29 within 1.5 s.
        assert_eq!(predicted["keys"]["admitted_min"], 34, "{predicted:#}");
        assert_eq!(predicted["keys"]["admitted_max"], 34);
        assert_eq!(predicted["keys"]["held_back"], 2);
        assert_eq!(predicted["admitted"], 68);
        let per_key = limit(&predicted["report"], "per_key");
        assert_eq!(per_key["passed"], 68);
        assert_eq!(predicted["requests"].as_u64().unwrap(), 68 + per_key["rejected"].as_u64().unwrap());
        let seconds = predicted["seconds"].as_array().unwrap();
        assert_eq!(seconds.len(), 2);
        assert_eq!(seconds[0]["admitted"], 2 * (5 + 19), "per key, the burst and one each 50 ms in the first second");
    }
    // Fewer refusals with a slower machine: what depends on its speed says so.
    let text = stdout(&sluicegate(&[
        "simulate",
        "-c",
        config.to_str().unwrap(),
        "--synthetic",
        "connections=4 duration=1500ms keys=header:x-key:2",
    ]));
    assert!(text.contains("closed loop: each of the 4 connections sends its next request when its answer arrives"));
    assert!(
        text.contains("exact, whatever the machine's speed: admitted 68 (34 for each of the 2 keys sent)"),
        "{text}"
    );
    assert!(text.contains("depends on the machine's speed: requests sent"), "{text}");
}

#[test]
fn delays_hold_a_closed_loops_connections_so_fewer_requests_are_sent_and_none_refused() {
    let (_dir, config) = config_file(
        "listen: 127.0.0.1:0
limits:
  paced: { key: header:x-key, on_missing_key: skip, rate: 20r/s, burst: 10 }
routes:
  - { limits: [paced], respond: { status: 200 } }
",
    );
    let predicted = predict(&config, "connections=4 duration=2s keys=header:x-key:1 latency=0s");
    let paced = limit(&predicted["report"], "paced");
    assert_eq!(paced["rejected"], 0, "four connections never fill a burst of 10: {predicted:#}");
    // The four first requests at once, the first one's next a turnaround (100 µs) later,
    // then one each 50 ms as a delay ends and its connection sends again: 39 within 2 s.
    assert_eq!(predicted["admitted"], 4 + 1 + 39);
    assert_eq!(predicted["requests"], 4 + 1 + 39, "a delayed connection sends nothing while it waits");
    let delay = &paced["delay"];
    // In the steady state each request finds the three other connections' queued: it
    // waits four turns of 50 ms, less the turnaround its connection took to send it.
    assert_eq!(delay["p50_ms"], 199.9, "{delay:#}");
    assert_eq!(delay["p99_ms"], 199.9);
}

#[test]
fn a_spec_that_cannot_be_read_is_refused_naming_its_field() {
    let (_dir, config) = config_file(LIMITED);
    let config = config.to_str().unwrap();
    let out = sluicegate(&["simulate", "-c", config, "--synthetic", "conections=4"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--synthetic: conections: unknown field; did you mean `connections`?"), "{stderr}");
    let out = sluicegate(&["simulate", "-c", config, "--synthetic", "keys=ip:0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--synthetic: keys: the number of keys must be"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_agrees_with_a_real_closed_loop_run_and_fails_for_a_configuration_that_did_not_run() {
    let sg = Sluicegate::start(LIMITED);
    let admin = sg.admin_addr();
    let dir = tempfile::tempdir().unwrap();
    let (before, after) = (dir.path().join("before.json"), dir.path().join("after.json"));
    snapshot(&sg.config, admin, &before);
    let ran = closed_loop(sg.addr, 4, 2, Duration::from_millis(1500)).await;
    snapshot(&sg.config, admin, &after);
    let spec = "connections=4 keys=header:x-key:2 latency=0s";
    let out = verify(&sg.config, &before, &after, ran, spec);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("limit per_key: expected "), "{text}");
    assert!(text.contains(" admitted, saw "), "{text}");
    assert!(text.contains("verdict: every count within its noise"), "{text}");

    // The same run, against the limit at twice the rate: it did not run.
    let other = dir.path().join("other.yaml");
    std::fs::write(&other, LIMITED.replace("rate: 20r/s", "rate: 40r/s")).unwrap();
    let out = verify(&other, &before, &after, ran, spec);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("admitted") && text.contains("OUTSIDE the noise"), "{text}");
    // And against one without that limit: /metrics has no such series.
    std::fs::write(&other, LIMITED.replace("per_key", "per_client")).unwrap();
    let out = verify(&other, &before, &after, ran, spec);
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("the instance runs another configuration"), "{}", stdout(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_loops_prediction_made_before_the_run_is_what_the_run_admits() {
    let sg = Sluicegate::start(LIMITED);
    let admin = sg.admin_addr();
    let spec = "rate=100 duration=1s keys=header:x-key:2 connections=2 latency=0s";
    let predicted = predict(&sg.config, spec);
    let per_key = limit(&predicted["report"], "per_key");
    // Each key is sent every 20 ms: 1 + burst at once, then one a 50 ms over its last
    // request at 980 ms (19), of its 50.
    assert_eq!((per_key["passed"].as_u64().unwrap(), per_key["rejected"].as_u64().unwrap()), (2 * 24, 2 * 26));
    let dir = tempfile::tempdir().unwrap();
    let (before, after) = (dir.path().join("before.json"), dir.path().join("after.json"));
    snapshot(&sg.config, admin, &before);
    // 100 requests a second on schedule, each on a connection of its own (an open loop
    // does not wait for answers), request i with key-(i mod 2), as the spec has it.
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..100u32 {
        let due = start + Duration::from_millis(u64::from(i) * 10);
        tokio::time::sleep_until(due.into()).await;
        let key = format!("key-{}", i % 2);
        let addr = sg.addr;
        tasks.push(tokio::spawn(async move {
            let status = get(addr, "/", &[("x-key", &key)]).await.status;
            (status, due.elapsed())
        }));
    }
    let ran = start.elapsed();
    let mut statuses = Vec::new();
    let mut late = Duration::ZERO;
    for task in tasks {
        let (status, answered_after) = task.await.unwrap();
        statuses.push(status);
        late = late.max(answered_after);
    }
    snapshot(&sg.config, admin, &after);
    let admitted = statuses.iter().filter(|&&s| s == 200).count() as i64;
    // The proxy decided each request between the instant it was due and its answer: the
    // decisions are the schedule shifted by at most `late` (on a busy machine, much), which
    // is worth up to `rate × late` admissions per key either way, and one more for where
    // a key's last admission falls. The noise is measured in this run, not assumed.
    let slack = 2 * ((20.0 * late.as_secs_f64()).ceil() as i64 + 1);
    assert!(
        (admitted - 48).abs() <= slack,
        "predicted 48 admitted, the run had {admitted} (answers came up to {late:?} after they were due: ±{slack})"
    );
    let out = verify(&sg.config, &before, &after, ran, spec);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let metrics = Metrics::of(&sg).await;
    assert_eq!(
        metrics.value("sluicegate_limit_decisions_total{limit=\"per_key\",outcome=\"passed\"}") as i64,
        admitted
    );
}
