//! Replays of request schedules recorded against real nginx 1.22 `limit_req`
//! (`tests/fixtures/nginx-limit-req/`, see its README; and zones shared by locations
//! with their own bursts, `tests/fixtures/nginx-shared-zone/`): statuses must match
//! exactly and delays closely, first on a fake clock through the limiter, then in real
//! time through the proxy.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use http::HeaderMap;
use serde::Deserialize;
use sluicegate::clock::{ManualClock, Nanos};
use sluicegate::gate::{Decision, Gate};
use sluicegate::policy::key::KeySource;

use crate::common::*;

#[derive(Deserialize)]
pub struct Scenario {
    pub scenario: String,
    /// The one `limit_req` line (`nginx-limit-req/`; a shared zone's lines are in
    /// `locations`).
    limit: Option<LimitDef>,
    /// The nginx directives the schedule was recorded with, in `http`.
    pub target_config: String,
    /// A shared zone's: the server's own directives, and its location blocks
    /// (`BACKEND` standing for the backend's address).
    #[serde(default)]
    pub server_config: String,
    pub locations: Option<String>,
    pub requests: Vec<Recorded>,
}

#[derive(Deserialize)]
struct LimitDef {
    rate: String,
    burst: u64,
    #[serde(default)]
    nodelay: bool,
    delay: Option<u64>,
}

#[derive(Deserialize)]
pub struct Recorded {
    pub t_ms: u64,
    pub key: Option<String>,
    #[serde(default = "root")]
    pub path: String,
    pub status: u16,
    latency_ms: f64,
}

fn root() -> String {
    "/".to_owned()
}

pub fn scenarios() -> Vec<Scenario> {
    let scenarios = recorded("nginx-limit-req");
    assert!(scenarios.len() >= 9, "fixtures missing");
    scenarios
}

/// Zones shared by several locations with their own bursts (`record.py` beside them).
pub fn shared_zone_scenarios() -> Vec<Scenario> {
    let scenarios = recorded("nginx-shared-zone");
    assert!(scenarios.len() >= 3, "fixtures missing");
    scenarios
}

fn recorded(dir: &str) -> Vec<Scenario> {
    let dir = format!("{}/tests/fixtures/{dir}", env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files.iter().map(|f| serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap()).collect()
}

/// The sluicegate equivalent of the scenario's `limit_req` line.
pub fn policy_yaml(s: &Scenario) -> String {
    let l = s.limit.as_ref().expect("a scenario of one limit_req line");
    let mut limit = format!("key: \"header:x-key\", on_missing_key: skip, rate: {}", l.rate);
    if l.burst > 0 {
        limit += &format!(", burst: {}", l.burst);
    }
    if l.nodelay {
        limit += ", nodelay: true";
    }
    if let Some(d) = l.delay {
        limit += &format!(", delay: {d}");
    }
    format!(
        "listen: 127.0.0.1:0\nlimits:\n  l: {{ {limit} }}\nroutes:\n  - limits: [l]\n    respond: {{ status: 200 }}\n"
    )
}

/// nginx's delay of each request: its latency less the scenario's fastest answer (the
/// cost of a round trip through nginx).
pub fn nginx_delays_ms(s: &Scenario) -> Vec<f64> {
    let base = s.requests.iter().map(|r| r.latency_ms).fold(f64::INFINITY, f64::min);
    s.requests.iter().map(|r| r.latency_ms - base).collect()
}

/// How close a delay must be: 5 ms, plus 0.5 % of the delay, because nginx's timers run
/// late by about 3 ms per second of delay (1008, 2009, 3011 ms recorded for 1, 2, 3 s in
/// `09_per_minute_delay`) where ours fire on time.
pub fn tolerance_ms(nginx: f64) -> f64 {
    5.0 + nginx * 0.005
}

#[test]
fn limiter_matches_nginx_on_a_fake_clock() {
    for s in scenarios() {
        replay_on_a_fake_clock(&s, &policy_yaml(&s));
    }
}

/// Replays `s` through the limits of the routes of configuration `yaml` that its
/// requests' paths match, on a fake clock: every status must be nginx's, every delay
/// within `tolerance_ms` of nginx's.
pub fn replay_on_a_fake_clock(s: &Scenario, yaml: &str) {
    let config = sluicegate::config::parse(yaml, &s.scenario).unwrap();
    let clock = ManualClock::default();
    let gate = Gate::new(&config, clock.clone().into());
    let expected_delays = nginx_delays_ms(s);
    for (i, r) in s.requests.iter().enumerate() {
        let mut headers = HeaderMap::new();
        if let Some(key) = &r.key {
            headers.insert("x-key", key.parse().unwrap());
        }
        let src = KeySource::get([127, 0, 0, 1].into(), &r.path, &headers);
        let route = config.router.find(
            &http::Method::GET,
            r.path.as_bytes(),
            Some("localhost"),
            sluicegate::router::Scheme::Http,
        );
        let limits = &config.routes[route.unwrap_or_else(|| panic!("{}: no route for {}", s.scenario, r.path))].limits;
        clock.set(Nanos(r.t_ms * 1_000_000));
        let (status, wait) = match gate.check(limits, &src, 1) {
            Decision::Pass { wait, .. } => (200, wait),
            Decision::Reject { status, .. } => (status.as_u16(), Duration::ZERO),
        };
        assert_eq!(status, r.status, "{} request {i} at {} ms to {}", s.scenario, r.t_ms, r.path);
        let ours = wait.as_secs_f64() * 1000.0;
        let theirs = expected_delays[i];
        assert!(
            (ours - theirs).abs() <= tolerance_ms(theirs),
            "{} request {i}: delay {ours} ms, nginx {theirs:.1} ms",
            s.scenario
        );
    }
}

/// Scenarios whose decisions lie at least 50 ms from flipping, safe to replay in real
/// time on a loaded machine. (`11_ms_granularity` turns on 5 ms and `02` on 40 ms: the
/// fake-clock replay above covers them.)
pub const REAL_TIME: &[&str] = &[
    "03_burst_nodelay",
    "04_burst_delay_queue",
    "05_delay_n",
    "07_two_keys_independent",
    "08_per_minute_nodelay",
    "09_per_minute_delay",
];

/// (status, delay in ms) of each request of a group.
type Outcomes = Vec<(u16, f64)>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_matches_nginx_in_real_time() {
    let chosen: Vec<Scenario> = scenarios().into_iter().filter(|s| REAL_TIME.contains(&s.scenario.as_str())).collect();
    assert_eq!(chosen.len(), REAL_TIME.len());
    let runs: Vec<(Scenario, String)> = chosen
        .into_iter()
        .map(|s| {
            let yaml = policy_yaml(&s);
            (s, yaml)
        })
        .collect();
    real_time_matches(&runs).await;
}

/// Each schedule sent in real time through a proxy started with its configuration (the
/// YAML beside it): statuses must be nginx's and delays within `tolerance_ms` of nginx's
/// plus the scheduling noise measured in the same replay (`Noise`).
///
/// A stall longer than a schedule's period changes what the limiter sees (a request sent
/// late finds more of the bucket drained), so statuses can differ on a machine stalled
/// that long; a wrong delay or status differs run after run. So one mismatch is reported
/// and the replay run again: this fails only when the second replay does too.
pub async fn real_time_matches(runs: &[(Scenario, String)]) {
    if let Err(first) = replay_in_real_time(runs).await {
        eprintln!("real-time replay: {first}; replaying again");
        if let Err(second) = replay_in_real_time(runs).await {
            panic!("{second} (and before: {first})");
        }
    }
}

/// How much the machine itself delayed a replay: the slowest answer of a proxy without
/// limits, asked every 10 ms while the schedules run, plus the latest any request of
/// the schedules was sent. A limiter's wrong delay is at least a period (tens of ms) on
/// every run; a loaded machine's noise is measured, not guessed.
struct Noise {
    probe_ms: f64,
    late_ms: f64,
}

impl Noise {
    fn ms(&self) -> f64 {
        self.probe_ms + self.late_ms
    }
}

/// Every schedule of `runs` sent in real time; the first request whose status or delay
/// differs from nginx's, if one does.
async fn replay_in_real_time(runs: &[(Scenario, String)]) -> Result<(), String> {
    // Start every proxy first (a blocking wait for readiness), then run all schedules
    // from one instant, so no start-up stalls a schedule already running.
    let proxies: Vec<Sluicegate> = runs.iter().map(|(_, yaml)| Sluicegate::start(yaml)).collect();
    let probe = Sluicegate::start("listen: 127.0.0.1:0\nroutes:\n  - respond: { status: 200 }\n");
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let probing = {
        let (addr, done) = (probe.addr, std::sync::Arc::clone(&done));
        tokio::spawn(async move {
            let mut slowest = 0f64;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let sent = Instant::now();
                assert_eq!(get(addr, "/", &[]).await.status, 200);
                slowest = slowest.max(sent.elapsed().as_secs_f64() * 1000.0);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            slowest
        })
    };
    let start = tokio::time::Instant::now() + Duration::from_millis(100);
    let mut sent = Vec::new();
    for ((s, _), sg) in runs.iter().zip(&proxies) {
        let tasks: Vec<_> = s
            .requests
            .iter()
            .map(|r| {
                let (addr, key, at) = (sg.addr, r.key.clone(), start + Duration::from_millis(r.t_ms));
                let path = r.path.clone();
                tokio::spawn(async move {
                    tokio::time::sleep_until(at).await;
                    let late = at.elapsed().as_secs_f64() * 1000.0;
                    let sent = Instant::now();
                    let headers: Vec<(&str, &str)> = key.as_deref().map(|k| ("x-key", k)).into_iter().collect();
                    let status = get(addr, &path, &headers).await.status;
                    ((status, sent.elapsed().as_secs_f64() * 1000.0), late)
                })
            })
            .collect();
        sent.push((s, tasks));
    }
    // Every request answered before any is judged: none is left running against a proxy
    // that an early mismatch would stop.
    let mut answered = Vec::new();
    let mut late_ms = 0f64;
    for (s, tasks) in sent {
        let mut outcomes = Vec::new();
        for t in tasks {
            let (outcome, late) = t.await.unwrap();
            late_ms = late_ms.max(late);
            outcomes.push(outcome);
        }
        answered.push((s, outcomes));
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let noise = Noise { probe_ms: probing.await.unwrap(), late_ms };
    for (s, outcomes) in answered {
        let delays = nginx_delays_ms(s);
        // Requests sent at the same instant with the same key may arrive in any order:
        // compare each such group as sorted (status, delay) lists.
        let mut groups: BTreeMap<(u64, Option<String>), (Outcomes, Outcomes)> = BTreeMap::new();
        for ((r, ours), theirs) in s.requests.iter().zip(outcomes).zip(delays) {
            let g = groups.entry((r.t_ms, r.key.clone())).or_default();
            g.0.push(ours);
            g.1.push((r.status, theirs));
        }
        for ((t, key), (mut ours, mut theirs)) in groups {
            ours.sort_by(|a, b| a.partial_cmp(b).unwrap());
            theirs.sort_by(|a, b| a.partial_cmp(b).unwrap());
            let statuses = |v: &[(u16, f64)]| v.iter().map(|x| x.0).collect::<Vec<_>>();
            if statuses(&ours) != statuses(&theirs) {
                return Err(format!(
                    "{} at {t} ms key {key:?}: statuses {:?} vs nginx {:?} (noise: {:.1} ms)",
                    s.scenario,
                    statuses(&ours),
                    statuses(&theirs),
                    noise.ms()
                ));
            }
            for ((_, o), (_, n)) in ours.iter().zip(&theirs) {
                // Real time adds our own round trip and the machine's scheduling noise.
                if (o - n).abs() > tolerance_ms(*n) + noise.ms() {
                    return Err(format!(
                        "{} at {t} ms: {o:.1} ms vs nginx {n:.1} ms (noise: answers up to {:.1} ms, sent up to {:.1} ms late)",
                        s.scenario, noise.probe_ms, noise.late_ms
                    ));
                }
            }
        }
    }
    Ok(())
}
