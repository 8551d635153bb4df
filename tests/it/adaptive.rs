//! A concurrency ceiling that learns (`concurrency: adaptive`), through the binary: it
//! starts at `min` and holds requests to it, grows while the requests holding its slots
//! are fast, falls when they slow down, and every surface says where it stands.

use std::time::Duration;

use crate::common::*;

/// Sends `n` requests for `path` at once and waits for their answers, reading the
/// ceiling meanwhile: the least and the most it read (it moves within the batch).
async fn batch(sg: &Sluicegate, path: &str, n: usize) -> (f64, f64) {
    let sent: Vec<_> = (0..n)
        .map(|_| {
            let (addr, path) = (sg.addr, path.to_owned());
            tokio::spawn(async move { get(addr, &path, &[]).await.status })
        })
        .collect();
    let (mut least, mut most) = (f64::MAX, 0.0f64);
    while !sent.iter().all(tokio::task::JoinHandle::is_finished) {
        let now = ceiling(sg).await;
        (least, most) = (least.min(now), most.max(now));
    }
    for s in sent {
        assert_eq!(s.await.unwrap(), 200);
    }
    let now = ceiling(sg).await;
    (least.min(now), most.max(now))
}

async fn ceiling(sg: &Sluicegate) -> f64 {
    Metrics::of(sg).await.value("sluicegate_limit_ceiling{limit=\"c\"}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adaptive_ceiling_starts_at_min_grows_with_fast_slots_and_falls_when_they_slow() {
    let backend = Backend::start().await;
    let sg = Conf::new()
        .admin()
        .upstream(&backend)
        .limit(
            "c",
            "key: ip, concurrency: adaptive, adaptive: { min: 2, max: 64, window: 20ms }, \
             queue: { max: 100, max_wait: 30s }",
        )
        .forwarding("c")
        .start();
    assert_eq!(ceiling(&sg).await, 2.0, "it starts at min");
    let config: serde_json::Value = serde_json::from_slice(&get(sg.admin_addr(), "/config", &[]).await.body).unwrap();
    let words = &config["limits"][0]["windows"][0];
    assert_eq!(words["concurrency"], "adaptive", "{words}");
    assert_eq!(words["adaptive"], serde_json::json!({"min": 2, "max": 64, "window": "20ms"}), "{words}");

    // At min: two requests reach the backend, a third waits.
    let held: Vec<_> = (0..3)
        .map(|_| {
            let addr = sg.addr;
            tokio::spawn(async move { get(addr, "/held", &[]).await.status })
        })
        .collect();
    let depth = async || Metrics::of(&sg).await.value("sluicegate_limit_queue_depth{limit=\"c\",class=\"\"}");
    wait_until("two at the backend, one waiting", Duration::from_secs(10), async || {
        backend.hits().len() == 2 && depth().await == 1.0
    })
    .await;
    backend.gate.add_permits(3);
    for h in held {
        assert_eq!(h.await.unwrap(), 200);
    }

    // Fast (5 ms): the ceiling, reached, grows (doubling while it starts).
    let mut peak = 0.0f64;
    wait_until("the ceiling grows", Duration::from_secs(20), async || {
        peak = peak.max(batch(&sg, "/sleep/5", 16).await.1);
        peak >= 8.0
    })
    .await;
    let explain = serde_json::json!({"method": "GET", "url": "http://localhost/"});
    let req = http::Request::post("/explain").header("host", "localhost").body(explain.to_string()).unwrap();
    let explained: serde_json::Value = serde_json::from_str(&request(sg.admin_addr(), req).await.text()).unwrap();
    let said = &explained["limits"][0]["ceiling"];
    assert_eq!((said["min"].as_u64(), said["max"].as_u64()), (Some(2), Some(64)), "{explained}");
    assert!(said["now"].as_f64().unwrap() > 2.0, "{explained}");
    assert!(said["ground_ms"].as_f64().unwrap() >= 5.0, "{explained}");

    // Slow (80 ms, many times the ground): it falls (by half a window at most; at min the
    // slow latency becomes the ground, and it grows again).
    wait_until("the ceiling falls", Duration::from_secs(20), async || {
        batch(&sg, "/sleep/80", 16).await.0 <= peak / 2.0
    })
    .await;
    let metrics = Metrics::of(&sg).await;
    let recent = metrics.value("sluicegate_limit_latency_seconds{limit=\"c\",of=\"recent\"}");
    assert!(recent >= 0.08, "the last window's median: {recent}");
    let shown: serde_json::Value =
        serde_json::from_str(&get(sg.admin_addr(), "/dashboard.json", &[]).await.text()).unwrap();
    let card = shown["limits"].as_array().unwrap().iter().find(|l| l["name"] == "c").unwrap();
    assert_eq!(card["ceiling"]["now"].as_f64(), Some(ceiling(&sg).await), "{card}");
}

/// `check` places every misplaced field of an adaptive ceiling.
#[test]
fn check_names_every_misplaced_adaptive_field() {
    for (fields, expected) in [
        ("concurrency: adaptive, adaptive: { min: 0 }", "limits.c.adaptive.min: must be a positive integer"),
        ("concurrency: adaptive, adaptive: { min: 10, max: 5 }", "limits.c.adaptive.max: must be from `min` (10)"),
        ("concurrency: adaptive, adaptive: { window: 5ms }", "limits.c.adaptive.window: must be from 10ms to 60s"),
        ("concurrency: adaptive, adaptive: { step: 2 }", "step"),
        ("concurrency: 5, adaptive: { min: 2 }", "limits.c.adaptive: applies to `concurrency: adaptive`"),
        ("rate: 1r/s, adaptive: { min: 2 }", "limits.c.adaptive: does not apply"),
        ("concurrency: often", "limits.c.concurrency: must be a positive integer or `adaptive`"),
        ("concurrency: adaptive, scope: global", "limits.c.concurrency: adaptive applies to local limits"),
        ("concurrency: adaptive, limit_from: { max: 10 }", "limits.c.limit_from: a ceiling that learns"),
    ] {
        let yaml = format!(
            "listen: 127.0.0.1:0\nlimits:\n  c: {{ key: ip, {fields} }}\nroutes:\n  - {{ limits: [c], respond: {{ status: 200 }} }}\n"
        );
        let (code, stderr) = check_bounded(&yaml);
        assert_eq!(code, Some(1), "{fields}: {stderr}");
        assert!(stderr.contains(expected), "{fields}: {expected} not in\n{stderr}");
    }
}
