//! `upstream_hold:`: a key the upstream refused with a time to wait is answered at the
//! edge until then, with the upstream's status and the time left; the upstream sees
//! none of its requests meanwhile, other keys go on.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::common::*;

/// A backend that refuses by path: `/refuse/N` answers `429` with `Retry-After: N`,
/// `/busy/N` `503` with a `RateLimit` whose spent item resets in N s; anything else
/// `200`. Records each request's path and `x-user`.
async fn refusing_backend() -> (SocketAddr, Arc<Mutex<Vec<(String, String)>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let log = log.clone();
            let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let user = req.headers().get("x-user").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
                let path = req.uri().path().to_owned();
                log.lock().unwrap().push((path.clone(), user));
                let response = http::Response::builder();
                let response = if let Some(n) = path.strip_prefix("/refuse/") {
                    response.status(429).header("retry-after", n)
                } else if let Some(n) = path.strip_prefix("/busy/") {
                    response.status(503).header("ratelimit", format!("\"day\";r=5;t=80000, \"minute\";r=0;t={n}"))
                } else {
                    response
                };
                async move { Ok::<_, Infallible>(response.body(Full::new(Bytes::from_static(b"upstream"))).unwrap()) }
            });
            tokio::spawn(async move {
                _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    (addr, seen)
}

fn yaml(backend: SocketAddr, hold: &str) -> String {
    format!(
        "listen: 127.0.0.1:0\nadmin: {{ listen: 127.0.0.1:0 }}\nupstreams:\n  b: {{ servers: [\"{backend}\"] }}\n\
         limits:\n  per_user: {{ key: \"header:x-user\", rate: 100r/s, burst: 100, nodelay: true, on_missing_key: skip }}\n\
         routes:\n  - {{ name: api, limits: [per_user], upstream: b, upstream_hold: {hold} }}\n"
    )
}

fn json(reply: &Reply) -> serde_json::Value {
    serde_json::from_slice(&reply.body).unwrap_or_else(|e| panic!("{e}: {}", reply.text()))
}

async fn get_as(addr: SocketAddr, path: &str, user: &str) -> Reply {
    get(addr, path, &[("x-user", user)]).await
}

/// A `429` with `Retry-After: 30` for one user holds that user's key (the route's first
/// limit's): their next requests are answered `429` here with the time left, the
/// upstream sees none of them, another user passes; metrics, the dashboard and a reload
/// that keeps the route all say the same.
#[tokio::test]
async fn an_upstream_429_holds_the_users_key_at_the_edge_until_its_retry_after() {
    let (backend, seen) = refusing_backend().await;
    let sg = Sluicegate::start(&yaml(backend, "true"));
    let refused = get_as(sg.addr, "/refuse/30", "ann").await;
    assert_eq!((refused.status, refused.header("retry-after")), (429, Some("30")), "the upstream's own answer");
    assert_eq!(refused.text(), "upstream");
    for _ in 0..3 {
        let held = get_as(sg.addr, "/ok", "ann").await;
        assert_eq!(held.status, 429);
        let after: u64 = held.header("retry-after").unwrap().parse().unwrap();
        assert!((29..=30).contains(&after), "the time left of the upstream's 30 s: {after}");
        assert_ne!(held.text(), "upstream", "answered here");
    }
    assert_eq!(get_as(sg.addr, "/ok", "bob").await.status, 200, "another key goes on");
    let users: Vec<String> = seen.lock().unwrap().iter().map(|(p, u)| format!("{p} {u}")).collect();
    assert_eq!(users, ["/refuse/30 ann", "/ok bob"], "the upstream saw none of the held requests");

    let metrics = Metrics::of(&sg).await;
    assert_eq!(metrics.value("sluicegate_upstream_holds_total{route=\"api\"}"), 1.0);
    assert_eq!(metrics.value("sluicegate_upstream_held_requests_total{route=\"api\"}"), 3.0);
    let state = json(&get(sg.admin_addr(), "/dashboard.json", &[]).await);
    let held = &state["routes"][0]["held"];
    assert_eq!(
        (held["now"].as_u64(), held["keys"][0]["key"].as_str()),
        (Some(1), Some("header:x-user=ann")),
        "as logs write it: {held}"
    );
    assert_eq!(state["routes"][0]["upstream_hold"]["by"], "per_user");
    let config = json(&get(sg.admin_addr(), "/config", &[]).await);
    assert_eq!(config["routes"][0]["upstream_hold"], state["routes"][0]["upstream_hold"], "one description");

    // A reload that keeps the route keeps its holds.
    let log = sg.reload(&yaml(backend, "{ by: per_user, max: 1h }"));
    assert!(log.contains("configuration reloaded"), "{log}");
    assert_eq!(get_as(sg.addr, "/ok", "ann").await.status, 429, "still held after the reload");
    assert_eq!(seen.lock().unwrap().len(), 2);
}

/// A `503` whose `RateLimit` says when its spent item resets holds the whole route
/// (`by: route`), no longer than `max`; once that ends, requests reach the upstream again.
#[tokio::test]
async fn an_upstream_503_holds_the_route_no_longer_than_max_then_lets_requests_through() {
    let (backend, seen) = refusing_backend().await;
    let sg = Sluicegate::start(&yaml(backend, "{ by: route, max: 1s }"));
    let started = Instant::now();
    assert_eq!(get_as(sg.addr, "/busy/600", "ann").await.status, 503);
    let held = get_as(sg.addr, "/ok", "bob").await;
    assert_eq!((held.status, held.header("retry-after")), (503, Some("1")), "every key, at most max");
    wait_until("the hold to end", Duration::from_secs(10), async || get_as(sg.addr, "/ok", "bob").await.status == 200)
        .await;
    assert!(started.elapsed() >= Duration::from_secs(1), "not before max: {:?}", started.elapsed());
    let paths: Vec<String> = seen.lock().unwrap().iter().map(|(p, _)| p.clone()).collect();
    assert_eq!(paths, ["/busy/600", "/ok"], "nothing reached the upstream while held");
}

/// A refusal without a time to wait holds nothing; a route without `upstream_hold`
/// forwards every request whatever its upstream answered.
#[tokio::test]
async fn a_refusal_without_a_time_to_wait_holds_nothing() {
    let (backend, seen) = refusing_backend().await;
    let sg = Sluicegate::start(&yaml(backend, "true"));
    // `/refuse/` with no number: a Retry-After that is not one.
    assert_eq!(get_as(sg.addr, "/refuse/soon", "ann").await.status, 429);
    assert_eq!(get_as(sg.addr, "/ok", "ann").await.status, 200);
    let sg = Sluicegate::start(&yaml(backend, "false"));
    assert_eq!(get_as(sg.addr, "/refuse/30", "ann").await.status, 429);
    assert_eq!(get_as(sg.addr, "/ok", "ann").await.status, 200);
    assert_eq!(seen.lock().unwrap().len(), 4);
}

/// `POST /explain` goes through the proxy's own admission: a held key is explained as
/// the hold it meets (its status and time left), spending nothing, and the request that
/// follows gets that answer; another key is explained as passing.
#[tokio::test]
async fn explain_says_a_held_key_is_answered_from_its_hold() {
    let (backend, seen) = refusing_backend().await;
    let sg = Sluicegate::start(&yaml(backend, "true"));
    let admin = sg.admin_addr();
    assert_eq!(get_as(sg.addr, "/refuse/30", "ann").await.status, 429);
    let explain = async |user: &str| {
        let body = format!(r#"{{"url": "http://localhost/ok", "headers": {{"x-user": "{user}"}}}}"#);
        let asked = http::Request::post("/explain")
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        json(&request(admin, asked).await)
    };
    let explained = explain("ann").await;
    let answer = &explained["answer"];
    assert_eq!(
        (answer["outcome"].as_str(), answer["status"].as_u64()),
        (Some("upstream_hold"), Some(429)),
        "{explained:#}"
    );
    let retry_after = answer["headers"].as_array().unwrap().iter().find(|h| h[0] == "retry-after").unwrap();
    assert!((29..=30).contains(&retry_after[1].as_str().unwrap().parse::<u64>().unwrap()), "{answer}");
    assert!(answer["reason"].as_str().unwrap().contains("header:x-user=ann"), "{answer}");
    assert_eq!(explain("bob").await["answer"]["outcome"], "passed");
    assert_eq!(seen.lock().unwrap().len(), 1, "explaining sent nothing upstream");
    assert_eq!(get_as(sg.addr, "/ok", "ann").await.status, 429, "as explained");
}

/// A held request spends no quota: with a limit of one request a minute, a client held
/// by the route's hold (another client's refusal held the whole route) still has its
/// one request once the hold ends, and the limit then refuses the next.
#[tokio::test]
async fn a_held_request_spends_no_quota() {
    let (backend, seen) = refusing_backend().await;
    let sg = Conf::new()
        .admin()
        .set(&format!("upstreams:\n  b: {{ servers: [\"{backend}\"] }}"))
        .limit("per_user", "key: \"header:x-user\", rate: 1r/m, on_missing_key: skip")
        .route("name: api, limits: [per_user], upstream: b, upstream_hold: { by: route }")
        .start();
    assert_eq!(get_as(sg.addr, "/refuse/3", "ann").await.status, 429, "the upstream's refusal holds the route 3 s");
    for _ in 0..3 {
        let held = get_as(sg.addr, "/ok", "bob").await;
        assert_eq!(held.status, 429);
        assert_ne!(held.text(), "upstream", "answered here");
        let after: u64 = held.header("retry-after").unwrap().parse().unwrap();
        assert!(after <= 3, "the hold's time left, not the limit's minute: {after}");
    }
    let holding = async || json(&get(sg.admin_addr(), "/dashboard.json", &[]).await)["routes"][0]["held"]["now"] != 0;
    wait_until("the hold to end", Duration::from_secs(10), async || !holding().await).await;
    assert_eq!(get_as(sg.addr, "/ok", "bob").await.status, 200, "bob's one request of the minute is whole");
    let limited = get_as(sg.addr, "/ok", "bob").await;
    assert_eq!(limited.status, 429);
    assert!(limited.header("retry-after").unwrap().parse::<u64>().unwrap() > 50, "the limit's refusal now");
    let users: Vec<String> = seen.lock().unwrap().iter().map(|(p, u)| format!("{p} {u}")).collect();
    assert_eq!(users, ["/refuse/3 ann", "/ok bob"]);
}

/// The proxy's JSON access log says how long each refusal held its key (`hold_ms`), and
/// `simulate` replays it with the proxy's holds on its virtual clock: the held requests
/// are answered from the hold, with the upstream's status, as the proxy answered them,
/// and another user's request passes.
#[tokio::test]
async fn the_access_log_records_each_hold_and_simulate_replays_the_holds_as_the_proxy_answered() {
    let (backend, _) = refusing_backend().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let access = format!("access_log: {{ format: json, path: \"{}\", keys: true }}\n", log.display());
    let sg = Sluicegate::start(&(access + &yaml(backend, "true")));
    let mut answers = vec![get_as(sg.addr, "/refuse/30", "ann").await.status];
    for user in ["ann", "ann", "bob"] {
        answers.push(get_as(sg.addr, "/ok", user).await.status);
    }
    assert_eq!(answers, [429, 429, 429, 200]);
    let lines: Vec<serde_json::Value> =
        crate::logs::access_lines(&log, 4).iter().map(|l| serde_json::from_str(l).unwrap()).collect();
    let hold_ms: Vec<Option<f64>> = lines.iter().map(|l| l["hold_ms"].as_f64()).collect();
    assert_eq!(hold_ms, [Some(30_000.0), None, None, None], "{lines:?}");
    let out = binary()
        .args(["simulate", "--json", "-c", sg.config.to_str().unwrap(), "--decisions", "d.jsonl", "access.log"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["configs"][0]["routes"][0]["held"], 2, "{report}");
    let decisions: Vec<serde_json::Value> = std::fs::read_to_string(dir.path().join("d.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let replayed: Vec<(&str, Option<u64>)> =
        decisions.iter().map(|d| (d["outcome"].as_str().unwrap(), d["status"].as_u64())).collect();
    assert_eq!(
        replayed,
        [("passed", None), ("upstream_hold", Some(429)), ("upstream_hold", Some(429)), ("passed", None)]
    );
    let logged: Vec<&str> = lines.iter().map(|l| l["outcome"].as_str().unwrap()).collect();
    assert_eq!(logged, replayed.iter().map(|(o, _)| *o).collect::<Vec<_>>(), "the outcomes the proxy logged");
}
