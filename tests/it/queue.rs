//! A concurrency limit's queue (`queue:`), through the binary: a request without a slot
//! waits for one, the slots go round the flows, a client that leaves never reaches the
//! backend, a full room or a wait too long is refused with the queue's `Retry-After`,
//! and a reload keeps the waiters.

use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;

use crate::common::*;

/// One slot per client address; `queue` the inside of the limit's `queue: { }`.
fn queued(backend: &Backend, queue: &str, log: &std::path::Path) -> Conf {
    Conf::new()
        .admin()
        .upstream(backend)
        .set(&format!("access_log: {{ format: json, path: \"{}\" }}", log.display()))
        .limit("c", &format!("key: ip, concurrency: 1, queue: {{ {queue} }}"))
        .forwarding("c")
}

/// Requests waiting in limit `c`'s queue now.
async fn depth(sg: &Sluicegate) -> f64 {
    Metrics::of(sg).await.value("sluicegate_limit_queue_depth{limit=\"c\",class=\"\"}")
}

/// Sends `GET path` as `user`, in the background.
fn send(sg: &Sluicegate, path: &str, user: &'static str) -> tokio::task::JoinHandle<Reply> {
    let (addr, path) = (sg.addr, path.to_owned());
    tokio::spawn(async move { get(addr, &path, &[("x-user", user)]).await })
}

/// Sends `GET path` as `user` and waits until it is in the queue (`waiting` then).
async fn join(sg: &Sluicegate, path: &str, user: &'static str, waiting: f64) -> tokio::task::JoinHandle<Reply> {
    let sent = send(sg, path, user);
    wait_until(&format!("{path} in the queue"), Duration::from_secs(10), async || depth(sg).await == waiting).await;
    sent
}

/// Limit `c`'s queue (`queue` its first fields) with classes gold (`x-tier: gold`) and
/// bronze (`bronze`: its fields after its name), fair by `x-user`.
fn classed(backend: &Backend, queue: &str, bronze: &str, log: &std::path::Path) -> Sluicegate {
    let classes =
        format!("classes: [{{ name: gold, match: {{ headers: {{ x-tier: gold }} }} }}, {{ name: bronze{bronze} }}]");
    queued(backend, &format!("{queue}, fair_by: \"header:x-user\", {classes}"), log).start()
}

/// Sends `GET path` as `user` of tier `tier` (`x-tier`), in the background.
fn send_in(sg: &Sluicegate, tier: &'static str, user: &'static str, path: &str) -> tokio::task::JoinHandle<Reply> {
    let (addr, path) = (sg.addr, path.to_owned());
    tokio::spawn(async move { get(addr, &path, &[("x-user", user), ("x-tier", tier)]).await })
}

/// Requests of class `class` waiting in limit `c`'s queue now.
async fn class_depth(sg: &Sluicegate, class: &str) -> f64 {
    Metrics::of(sg).await.value(&format!("sluicegate_limit_queue_depth{{limit=\"c\",class=\"{class}\"}}"))
}

/// The JSON access log lines whose target is `target`.
fn line_of(lines: &[String], target: &str) -> serde_json::Value {
    lines
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|l| l["target"] == target)
        .unwrap_or_else(|| panic!("no line for {target} in {lines:#?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_a_slot_waits_for_one_and_the_slots_go_round_the_flows() {
    let backend = Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let sg = queued(&backend, "max: 10, max_wait: 30s, fair_by: \"header:x-user\"", &log).start();
    let first = send(&sg, "/held?a1", "a");
    wait_until("a1 at the backend", Duration::from_secs(10), async || backend.hits().len() == 1).await;
    // Three wait: two of client a, then one of client b.
    let waiting = [join(&sg, "/held?a2", "a", 1.0).await, join(&sg, "/held?a3", "a", 2.0).await];
    let b = join(&sg, "/held?b1", "b", 3.0).await;
    // `explain` of c's next request: it would wait, after one of a's and b's, in the round.
    let asked = serde_json::json!({"method": "GET", "url": "http://localhost/", "headers": {"x-user": "c"}});
    let req = http::Request::post("/explain").header("host", "localhost").body(asked.to_string()).unwrap();
    let explained: serde_json::Value = serde_json::from_str(&request(sg.admin_addr(), req).await.text()).unwrap();
    let limit = &explained["limits"][0];
    assert_eq!(limit["outcome"], "queued", "{explained}");
    assert_eq!(limit["queue"]["waiting"], 3, "{explained}");
    assert_eq!(limit["queue"]["position"], 3, "{explained}");
    assert_eq!(limit["queue"]["flow"], "header:x-user=c", "{explained}");
    // The dashboard's limit card says so too.
    let shown: serde_json::Value =
        serde_json::from_str(&get(sg.admin_addr(), "/dashboard.json", &[]).await.text()).unwrap();
    let card = shown["limits"].as_array().unwrap().iter().find(|l| l["name"] == "c").unwrap();
    assert_eq!((card["queued"]["waiting"].as_u64(), card["queue"]["max"].as_u64()), (Some(3), Some(10)), "{card}");
    backend.gate.add_permits(4);
    assert_eq!(first.await.unwrap().status, 200);
    for w in waiting {
        assert_eq!(w.await.unwrap().status, 200);
    }
    assert_eq!(b.await.unwrap().status, 200);
    // Each slot given back went to the next flow in turn: b's request before a's second,
    // though it came after it (first come, first served would send a3 before b1).
    let order: Vec<String> = backend.hits().iter().map(|h| h.path_and_query.clone()).collect();
    assert_eq!(order, ["/held?a1", "/held?a2", "/held?b1", "/held?a3"]);
    let metrics = Metrics::of(&sg).await;
    assert_eq!(metrics.value("sluicegate_limit_queue_ended_total{limit=\"c\",class=\"\",end=\"served\"}"), 3.0);
    assert_eq!(metrics.value("sluicegate_limit_queue_depth{limit=\"c\",class=\"\"}"), 0.0);
    assert_eq!(metrics.value("sluicegate_limit_queue_wait_seconds_count{limit=\"c\",class=\"\"}"), 3.0);
    // A wait is a delay by the limit: counted as one, not as a refusal.
    assert_eq!(metrics.value("sluicegate_limit_decisions_total{limit=\"c\",outcome=\"delayed\"}"), 3.0);
    assert_eq!(metrics.get("sluicegate_limit_decisions_total{limit=\"c\",outcome=\"rejected\"}").unwrap_or(0.0), 0.0);
    let lines = crate::logs::access_lines(&log, 4);
    let b1 = line_of(&lines, "/held?b1");
    assert_eq!(b1["queue"], "served", "{b1}");
    assert!(b1["queued_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{b1}");
    assert_eq!(b1["outcome"], "delayed", "{b1}");
    let a1 = line_of(&lines, "/held?a1");
    assert!(a1.get("queue").is_none() && a1.get("queued_ms").is_none(), "{a1}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_the_queue_never_reaches_the_backend() {
    let backend = Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let sg = queued(&backend, "max: 10, max_wait: 30s", &log).start();
    let first = send(&sg, "/held?first", "a");
    wait_until("the first at the backend", Duration::from_secs(10), async || backend.hits().len() == 1).await;
    // HTTP/1: the connection closes.
    join(&sg, "/held?gone-h1", "a", 1.0).await.abort();
    wait_until("the HTTP/1 client out of the queue", Duration::from_secs(10), async || depth(&sg).await == 0.0).await;
    // HTTP/2: the stream is reset (its response future dropped), the connection stays.
    let mut h2 = h2c::<Full<Bytes>>(sg.addr).await;
    let req = Request::get("http://test.local/held?gone-h2").body(Full::new(Bytes::new())).unwrap();
    let stream = tokio::spawn(async move { h2.send_request(req).await.map(|r| r.status()) });
    wait_until("the HTTP/2 stream in the queue", Duration::from_secs(10), async || depth(&sg).await == 1.0).await;
    stream.abort();
    wait_until("the HTTP/2 stream out of the queue", Duration::from_secs(10), async || depth(&sg).await == 0.0).await;
    let metrics = Metrics::of(&sg).await;
    assert_eq!(metrics.value("sluicegate_limit_queue_ended_total{limit=\"c\",class=\"\",end=\"left\"}"), 2.0);
    backend.gate.add_permits(2);
    assert_eq!(first.await.unwrap().status, 200);
    // The slot the first gave back was free: nobody waited for it.
    assert_eq!(get(sg.addr, "/held?after", &[]).await.status, 200);
    let order: Vec<String> = backend.hits().iter().map(|h| h.path_and_query.clone()).collect();
    assert_eq!(order, ["/held?first", "/held?after"], "a request that left the queue reached the backend");
    let lines = crate::logs::access_lines(&log, 4);
    let gone = line_of(&lines, "/held?gone-h1");
    assert_eq!(gone["queue"], "left", "{gone}");
    assert!(gone["queued_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{gone}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_room_pushes_out_the_longest_flow_and_a_wait_too_long_is_refused_with_the_queues_retry_after() {
    let backend = Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let sg = queued(&backend, "max: 2, max_wait: 1500ms, fair_by: \"header:x-user\"", &log).start();
    let first = send(&sg, "/held?first", "a");
    wait_until("the first at the backend", Duration::from_secs(10), async || backend.hits().len() == 1).await;
    let a2 = join(&sg, "/held?a2", "a", 1.0).await;
    let a3 = join(&sg, "/held?a3", "a", 2.0).await;
    // Full, and a's flow is the longest: a's next is refused at once.
    let a4 = get(sg.addr, "/held?a4", &[("x-user", "a")]).await;
    assert_eq!(a4.status, 429);
    // b's first pushes out a's newest: a flow of two against one of none.
    let b1 = send(&sg, "/held?b1", "b");
    let pushed = a3.await.unwrap();
    assert_eq!(pushed.status, 429);
    // No slot was handed on yet: the queue expects one after its whole wait.
    assert_eq!(pushed.header("retry-after"), Some("2"), "{:?}", pushed.text());
    // Nobody gives a slot back: a2 and b1 wait their 1.5 s and are refused.
    for waited in [a2, b1] {
        let waited = waited.await.unwrap();
        assert_eq!(waited.status, 429);
        assert!(waited.header("retry-after").is_some());
    }
    let metrics = Metrics::of(&sg).await;
    for (end, n) in [("full", 1.0), ("pushed_out", 1.0), ("timed_out", 2.0), ("served", 0.0)] {
        assert_eq!(
            metrics.value(&format!("sluicegate_limit_queue_ended_total{{limit=\"c\",class=\"\",end=\"{end}\"}}")),
            n
        );
    }
    backend.gate.add_permits(1);
    assert_eq!(first.await.unwrap().status, 200);
    let lines = crate::logs::access_lines(&log, 5);
    for (target, end) in [("/held?a4", "full"), ("/held?a3", "pushed_out"), ("/held?a2", "timed_out")] {
        let line = line_of(&lines, target);
        assert_eq!((line["queue"].as_str(), line["outcome"].as_str()), (Some(end), Some("rejected")), "{line}");
    }
    let b1 = line_of(&lines, "/held?b1");
    assert!(b1["queued_ms"].as_f64().is_some_and(|ms| ms >= 1500.0), "{b1}");
    let order: Vec<String> = backend.hits().iter().map(|h| h.path_and_query.clone()).collect();
    assert_eq!(order, ["/held?first"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_after_of_a_refusal_is_the_queues_expected_wait() {
    let backend = Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let sg = queued(&backend, "max: 4, max_wait: 30s", &log).start();
    let mut sent = vec![send(&sg, "/held?first", "a")];
    wait_until("the first at the backend", Duration::from_secs(10), async || backend.hits().len() == 1).await;
    for i in 0..4 {
        sent.push(join(&sg, &format!("/held?w{i}"), "a", f64::from(i + 1)).await);
    }
    // Two slots handed on, milliseconds apart: the queue measures the gap.
    for served in [2, 3] {
        backend.gate.add_permits(1);
        wait_until("a slot handed on", Duration::from_secs(10), async || backend.hits().len() == served).await;
    }
    for i in 4..6 {
        sent.push(join(&sg, &format!("/held?w{i}"), "a", f64::from(i - 1)).await);
    }
    // Full: refused, expecting a slot after five gaps (well under a second), not after
    // its whole wait of 30 s.
    let refused = get(sg.addr, "/held?late", &[]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("retry-after"), Some("1"));
    backend.gate.add_permits(8);
    for s in sent {
        assert_eq!(s.await.unwrap().status, 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_class_is_served_first_and_a_full_queue_sheds_the_lowest_class() {
    let backend = Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let sg = classed(&backend, "max: 2, max_wait: 30s", "", &log);
    let first = send_in(&sg, "bronze", "u", "/held?first");
    wait_until("the first at the backend", Duration::from_secs(10), async || backend.hits().len() == 1).await;
    let b1 = send_in(&sg, "bronze", "u", "/held?b1");
    wait_until("b1 waiting", Duration::from_secs(10), async || class_depth(&sg, "bronze").await == 1.0).await;
    let b2 = send_in(&sg, "bronze", "u", "/held?b2");
    wait_until("b2 waiting", Duration::from_secs(10), async || class_depth(&sg, "bronze").await == 2.0).await;
    // Full: gold's first takes the place of bronze's newest, though of the same flow.
    let g1 = send_in(&sg, "gold", "u", "/held?g1");
    assert_eq!(b2.await.unwrap().status, 429, "bronze's newest not shed");
    wait_until("g1 waiting", Duration::from_secs(10), async || class_depth(&sg, "gold").await == 1.0).await;
    // A bronze request finds the queue full of its own class and gold: refused.
    assert_eq!(get(sg.addr, "/held?b3", &[("x-user", "v")]).await.status, 429);
    backend.gate.add_permits(3);
    for r in [first, g1, b1] {
        assert_eq!(r.await.unwrap().status, 200);
    }
    // gold, though it came after b1, went first.
    let order: Vec<String> = backend.hits().iter().map(|h| h.path_and_query.clone()).collect();
    assert_eq!(order, ["/held?first", "/held?g1", "/held?b1"]);
    let m = Metrics::of(&sg).await;
    let ended = |class: &str, end: &str| {
        m.value(&format!("sluicegate_limit_queue_ended_total{{limit=\"c\",class=\"{class}\",end=\"{end}\"}}"))
    };
    assert_eq!((ended("bronze", "pushed_out"), ended("bronze", "full"), ended("bronze", "served")), (1.0, 1.0, 1.0));
    assert_eq!((ended("gold", "served"), ended("gold", "pushed_out")), (1.0, 0.0));
    // Each class's waits in its own histogram, and the class in each waiter's line.
    let waits =
        |class: &str| m.value(&format!("sluicegate_limit_queue_wait_seconds_count{{limit=\"c\",class=\"{class}\"}}"));
    assert_eq!((waits("gold"), waits("bronze")), (1.0, 3.0));
    let lines = crate::logs::access_lines(&log, 5);
    for (target, class) in
        [("/held?g1", "gold"), ("/held?b1", "bronze"), ("/held?b2", "bronze"), ("/held?b3", "bronze")]
    {
        let line = line_of(&lines, target);
        assert_eq!(line["queue_class"], class, "{line}");
    }
    assert!(line_of(&lines, "/held?first")["queue_class"].is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_with_a_share_is_handed_its_share_while_a_higher_class_waits() {
    let backend = Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let sg = classed(&backend, "max: 10, max_wait: 30s", ", share: 50%", &log);
    let first = send_in(&sg, "bronze", "u", "/held?first");
    wait_until("the first at the backend", Duration::from_secs(10), async || backend.hits().len() == 1).await;
    let mut sent = vec![first];
    for (class, user, path, gold, bronze) in [
        ("gold", "g", "/held?g1", 1.0, 0.0),
        ("gold", "g", "/held?g2", 2.0, 0.0),
        ("bronze", "b", "/held?b1", 2.0, 1.0),
    ] {
        sent.push(send_in(&sg, class, user, path));
        wait_until(path, Duration::from_secs(10), async || {
            class_depth(&sg, "gold").await == gold && class_depth(&sg, "bronze").await == bronze
        })
        .await;
    }
    backend.gate.add_permits(4);
    for r in sent {
        assert_eq!(r.await.unwrap().status, 200);
    }
    // Half of the slots handed on while bronze waits are its: the second.
    let order: Vec<String> = backend.hits().iter().map(|h| h.path_and_query.clone()).collect();
    assert_eq!(order, ["/held?first", "/held?g1", "/held?b1", "/held?g2"]);
    let config: serde_json::Value = serde_json::from_slice(&get(sg.admin_addr(), "/config", &[]).await.body).unwrap();
    let words = &config["limits"][0]["queue"]["classes"];
    assert_eq!(words, &serde_json::json!([{"name": "gold"}, {"name": "bronze", "share": "50%"}]), "{config}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routes_priority_names_the_class_its_requests_wait_in() {
    let backend = Backend::start().await;
    let classes = "classes: [{ name: gold, match: { headers: { x-tier: gold } } }, { name: bronze }]";
    let sg = Conf::new()
        .admin()
        .upstream(&backend)
        .limit("c", &format!("key: ip, concurrency: 1, queue: {{ max: 10, max_wait: 30s, {classes} }}"))
        .route("match: { path: /held, methods: [POST] }, upstream: b, limits: [c], priority: gold")
        .forwarding("c")
        .start();
    let addr = sg.addr;
    let first = tokio::spawn(async move { get(addr, "/held?first", &[]).await });
    wait_until("the first at the backend", Duration::from_secs(10), async || backend.hits().len() == 1).await;
    let bronze = tokio::spawn(async move { get(addr, "/held?bronze", &[]).await });
    wait_until("bronze waiting", Duration::from_secs(10), async || class_depth(&sg, "bronze").await == 1.0).await;
    // A POST takes the route whose priority is gold, with no header saying so.
    let gold = tokio::spawn(async move {
        request(addr, Request::post("/held?gold").header("host", "localhost").body(Full::new(Bytes::new())).unwrap())
            .await
    });
    wait_until("gold waiting", Duration::from_secs(10), async || class_depth(&sg, "gold").await == 1.0).await;
    backend.gate.add_permits(3);
    for r in [first, bronze] {
        assert_eq!(r.await.unwrap().status, 200);
    }
    assert_eq!(gold.await.unwrap().status, 200);
    let order: Vec<String> = backend.hits().iter().map(|h| h.path_and_query.clone()).collect();
    assert_eq!(order, ["/held?first", "/held?gold", "/held?bronze"]);
    // A priority that names no class of the route's queues is refused, at its place.
    let (code, stderr) = check_bounded(
        "listen: 127.0.0.1:0\nlimits:\n  c: { key: ip, concurrency: 1, queue: {} }\nroutes:\n  - { limits: [c], respond: { status: 200 }, priority: gold }\n",
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("routes[0].priority: \"gold\" names no class of the queues"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_the_queues_waiters() {
    let backend = Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let conf = queued(&backend, "max: 10, max_wait: 30s", &log);
    let sg = conf.start();
    let first = send(&sg, "/held?first", "a");
    wait_until("the first at the backend", Duration::from_secs(10), async || backend.hits().len() == 1).await;
    let waiter = join(&sg, "/held?waiter", "a", 1.0).await;
    sg.reload(&conf.yaml().replace("max_wait: 30s", "max_wait: 20s"));
    assert_eq!(depth(&sg).await, 1.0, "the reload lost the waiter");
    backend.gate.add_permits(2);
    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(waiter.await.unwrap().status, 200);
    let order: Vec<String> = backend.hits().iter().map(|h| h.path_and_query.clone()).collect();
    assert_eq!(order, ["/held?first", "/held?waiter"]);
}

#[test]
fn check_names_every_misplaced_queue_field() {
    let limit = |fields: &str| {
        let yaml = format!(
            "listen: 127.0.0.1:0\nlimits:\n  c: {{ key: ip, {fields} }}\nroutes:\n  - {{ limits: [c], respond: {{ status: 200 }} }}\n"
        );
        let (code, stderr) = check_bounded(&yaml);
        assert_eq!(code, Some(1), "{fields}: {stderr}");
        stderr
    };
    for (fields, expected) in [
        ("rate: 1r/s, queue: { max: 5 }", "limits.c.queue: applies to concurrency limits"),
        ("concurrency: 2, ban: 1m, queue: {}", "limits.c.queue: a limit that bans refuses at once"),
        ("concurrency: 2, queue: { max: 0 }", "limits.c.queue.max: must be from 1 to"),
        ("concurrency: 2, queue: { max_wait: 0s }", "limits.c.queue.max_wait:"),
        ("concurrency: 2, queue: { fair_by: \"json:user\" }", "limits.c.queue.fair_by: a flow is told apart"),
        ("concurrency: 2, queue: { fair_by: \"nope:x\" }", "limits.c.queue.fair_by:"),
        ("concurrency: 2, queue: { size: 3 }", "size"),
        ("concurrency: 2, action: annotate, queue: {}", "limits.c.queue: a limit with `action: annotate`"),
        ("concurrency: 2, queue: { classes: [{ name: a }] }", "limits.c.queue.classes: needs two classes at least"),
        (
            "concurrency: 2, queue: { classes: [{ name: a }, { name: b }] }",
            "limits.c.queue.classes[0]: needs a `match`",
        ),
        (
            "concurrency: 2, queue: { classes: [{ name: a, match: { cidrs: [10.0.0.0/8] } }, { name: a }] }",
            "limits.c.queue.classes[1].name: class \"a\" is named twice",
        ),
        (
            "concurrency: 2, queue: { classes: [{ name: a, match: { cidrs: [nope] } }, { name: b }] }",
            "limits.c.queue.classes[0].match.cidrs[0]",
        ),
        (
            "concurrency: 2, queue: { classes: [{ name: a, match: { cidrs: [10.0.0.0/8] } }, { name: b, share: 0% }] }",
            "limits.c.queue.classes[1].share: \"0%\": a share from 1% to 100%",
        ),
        (
            "concurrency: 2, queue: { classes: [{ name: a, match: { cidrs: [10.0.0.0/8] }, share: 60% }, { name: b, share: 50% }] }",
            "limits.c.queue.classes: the classes' shares add up to 110%: 100% at most",
        ),
    ] {
        let stderr = limit(fields);
        assert!(stderr.contains(expected), "{fields}: {expected} not in\n{stderr}");
    }
}
