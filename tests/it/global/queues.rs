//! A queue on a global concurrency limit (slots leased in Redis), with two instances and
//! a real Redis: a lease given back is handed to a request waiting on the same instance
//! (no other instance's newcomer takes it meanwhile); one given back on another instance
//! reaches the waiters through their room's ask of Redis, a newcomer waiting behind them;
//! a request that leaves while waiting never reaches the backend and takes no slot; Redis
//! failing while requests wait decides them again, as `on_store_error` says.

use std::time::Duration;

use super::*;
use crate::logs::access_lines;

/// One global slot for every client (all come from 127.0.0.1); `queue` the inside of its
/// `queue: { }` (none if empty), with `on_store_error: on_error` and an access log at `log`.
fn slots(redis: &Redis, backend: &Backend, queue: &str, on_error: &str, log: Option<&std::path::Path>) -> Conf {
    let queue = if queue.is_empty() { String::new() } else { format!(", queue: {{ {queue} }}") };
    let conf = Conf::new()
        .redis(&redis.url(), "timeout: 500ms")
        .admin()
        .upstream(backend)
        .limit("slots", &format!("key: ip, concurrency: 1, scope: global, on_store_error: {on_error}{queue}"))
        .forwarding("slots");
    match log {
        Some(log) => conf.set(&format!("access_log: {{ format: json, path: \"{}\" }}", log.display())),
        None => conf,
    }
}

/// Instance `a`, with the queue (`max: 10, max_wait: 20s`: its room asks Redis every
/// 200 ms; its access log at `log`), and instance `b`, without, sharing limit `slots`.
fn pair(redis: &Redis, backend: &Backend, log: Option<&std::path::Path>) -> (Sluicegate, Sluicegate) {
    let a = slots(redis, backend, "max: 10, max_wait: 20s", "deny", log).start();
    (a, slots(redis, backend, "", "deny", None).start())
}

/// Requests waiting in the queue of limit `slots` on `sg`.
async fn depth(sg: &Sluicegate) -> f64 {
    Metrics::of(sg).await.value("sluicegate_limit_queue_depth{limit=\"slots\",class=\"\"}")
}

/// Sends `GET path` to `sg` in the background.
fn send(sg: &Sluicegate, path: &str) -> tokio::task::JoinHandle<u16> {
    let (addr, path) = (sg.addr, path.to_owned());
    tokio::spawn(async move { get(addr, &path, &[]).await.status })
}

/// The paths the backend has seen, in order.
fn seen(backend: &Backend) -> Vec<String> {
    backend.hits().iter().map(|h| h.path_and_query.clone()).collect()
}

/// Waits until the backend has seen `n` requests.
async fn at_backend(backend: &Backend, n: usize) {
    wait_until(&format!("{n} requests at the backend"), Duration::from_secs(10), async || backend.hits().len() == n)
        .await;
}

/// The access log line of the request for `target`.
fn line_of(lines: &[String], target: &str) -> serde_json::Value {
    (lines.iter().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()))
        .find(|l| l["target"] == target)
        .unwrap_or_else(|| panic!("no line for {target} in {lines:#?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_slot_given_back_goes_to_a_request_waiting_on_the_same_instance() {
    let redis = Redis::start();
    let backend = Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let (a, b) = pair(&redis, &backend, Some(&log));
    let first = send(&a, "/held?a1");
    at_backend(&backend, 1).await;
    let second = send(&a, "/held?a2");
    wait_until("a2 in a's queue", Duration::from_secs(10), async || depth(&a).await == 1.0).await;
    backend.gate.add_permits(1);
    assert_eq!(first.await.unwrap(), 200);
    // a1's lease went to a2 as a1's response ended, never freed in Redis: a request
    // through b, come at once, finds the slot held (freed, b's request would take it
    // before a's room next asked Redis).
    assert_eq!(get(b.addr, "/b1", &[]).await.status, 429);
    at_backend(&backend, 2).await;
    assert_eq!(seen(&backend), ["/held?a1", "/held?a2"]);
    backend.gate.add_permits(1);
    assert_eq!(second.await.unwrap(), 200);
    // Nobody waits now: the slot was freed in Redis as a2's response ended.
    assert_eq!(get(b.addr, "/b2", &[]).await.status, 200);
    let lines = access_lines(&log, 2);
    let waited = line_of(&lines, "/held?a2");
    assert_eq!(
        (&waited["status"], &waited["queue"], &waited["outcome"]),
        (&200.into(), &"served".into(), &"delayed".into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_slot_given_back_on_another_instance_reaches_the_waiters_through_redis() {
    let redis = Redis::start();
    let backend = Backend::start().await;
    let (a, b) = pair(&redis, &backend, None);
    let held = send(&b, "/held?b1");
    at_backend(&backend, 1).await;
    let waiting = [send(&a, "/held?a1"), send(&a, "/held?a2"), send(&a, "/held?a3")];
    wait_until("three in a's queue", Duration::from_secs(10), async || depth(&a).await == 3.0).await;
    // While the slot is b's, a's room asks Redis five times a second, not once per waiter
    // (fifteen): within a second, a handful of scripts run (lease renewals among them).
    let before = evalsha_calls(&redis);
    // The passing of time is what is measured.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let asked = evalsha_calls(&redis) - before;
    assert!((1..=9).contains(&asked), "{asked} asks of Redis in a second for one room");
    assert_eq!(backend.hits().len(), 1, "a waiter passed while the slot was held");
    backend.gate.add_permits(1);
    assert_eq!(held.await.unwrap(), 200);
    // Freed in Redis by b: a's room finds it at its next ask, then hands it on itself.
    at_backend(&backend, 2).await;
    backend.gate.add_permits(1);
    at_backend(&backend, 3).await;
    backend.gate.add_permits(1);
    at_backend(&backend, 4).await;
    backend.gate.add_permits(1);
    for w in waiting {
        assert_eq!(w.await.unwrap(), 200);
    }
    let metrics = Metrics::of(&a).await;
    assert_eq!(metrics.value("sluicegate_limit_queue_ended_total{limit=\"slots\",class=\"\",end=\"served\"}"), 3.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_waits_behind_the_requests_waiting_on_its_instance_though_redis_has_a_slot_free() {
    let redis = Redis::start();
    let backend = Backend::start().await;
    let (a, b) = pair(&redis, &backend, None);
    let held = send(&b, "/held?b1");
    at_backend(&backend, 1).await;
    let first = send(&a, "/held?a1");
    wait_until("a1 in a's queue", Duration::from_secs(10), async || depth(&a).await == 1.0).await;
    backend.gate.add_permits(1);
    assert_eq!(held.await.unwrap(), 200);
    // The slot is free in Redis; a2 comes before a's room asks again (every 200 ms), and
    // waits its turn behind a1 rather than taking it.
    let second = send(&a, "/held?a2");
    at_backend(&backend, 2).await;
    backend.gate.add_permits(1);
    at_backend(&backend, 3).await;
    backend.gate.add_permits(1);
    assert_eq!((first.await.unwrap(), second.await.unwrap()), (200, 200));
    assert_eq!(seen(&backend), ["/held?b1", "/held?a1", "/held?a2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_leaves_a_global_limits_queue_never_reaches_the_backend_nor_keeps_a_slot() {
    let redis = Redis::start();
    let backend = Backend::start().await;
    let (a, b) = pair(&redis, &backend, None);
    let first = send(&a, "/held?a1");
    at_backend(&backend, 1).await;
    let gone = send(&a, "/held?gone2");
    wait_until("gone2 in the queue", Duration::from_secs(10), async || depth(&a).await == 1.0).await;
    gone.abort();
    wait_until("gone2 out of the queue", Duration::from_secs(10), async || depth(&a).await == 0.0).await;
    backend.gate.add_permits(1);
    assert_eq!(first.await.unwrap(), 200);
    // Nobody waited for the slot: it was freed in Redis, and b takes it.
    assert_eq!(get(b.addr, "/b1", &[]).await.status, 200);
    assert_eq!(seen(&backend), ["/held?a1", "/b1"], "a request that left the queue reached the backend");
    let metrics = Metrics::of(&a).await;
    assert!(metrics.value("sluicegate_limit_queue_ended_total{limit=\"slots\",class=\"\",end=\"left\"}") >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_failing_while_requests_wait_for_a_global_slot_decides_them_as_on_store_error_says() {
    let mut redis = Redis::start();
    let backend = Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let a = slots(&redis, &backend, "max: 10, max_wait: 20s", "allow", Some(&log)).start();
    let first = send(&a, "/held?a1");
    at_backend(&backend, 1).await;
    let second = send(&a, "/held?a2");
    wait_until("a2 in the queue", Duration::from_secs(10), async || depth(&a).await == 1.0).await;
    redis.kill();
    // The room's next ask fails: a2 is decided again, and `on_store_error: allow` passes it.
    at_backend(&backend, 2).await;
    backend.gate.add_permits(2);
    assert_eq!(first.await.unwrap(), 200);
    assert_eq!(second.await.unwrap(), 200);
    let lines = access_lines(&log, 2);
    let waited = line_of(&lines, "/held?a2");
    assert_eq!(waited["queue"], "store_error", "{waited}");
    let metrics = Metrics::of(&a).await;
    assert_eq!(
        metrics.value("sluicegate_limit_queue_ended_total{limit=\"slots\",class=\"\",end=\"store_error\"}"),
        1.0
    );
}
