//! Upstreams with several servers: passive health, retries on the next server, and
//! balancing, against real backends that die, stall or close without answering.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Notify;

use crate::common::*;

/// A proxy whose route `/` goes to `servers` (YAML list items) with `extra` upstream fields.
fn start(servers: &[String], extra: &str) -> Sluicegate {
    let list = servers.join(", ");
    Sluicegate::start(&format!(
        "listen: 127.0.0.1:0\nupstreams:\n  app: {{ servers: [{list}], connect_timeout: 500ms, timeout: 1s{extra} }}\nroutes:\n  - match: {{ path_prefix: / }}\n    upstream: app\n"
    ))
}

fn quoted(addr: SocketAddr) -> String {
    format!("\"{addr}\"")
}

/// A server that reads the request head and closes the connection without a byte of
/// response, every time.
async fn hangs_up() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut buf = [0; 4096];
            let _ = stream.read(&mut buf).await;
        }
    });
    addr
}

fn count(log: &str, message: &str) -> usize {
    log.lines().filter(|l| l.contains(&format!("\"message\":\"{message}\""))).count()
}

async fn post(addr: SocketAddr, path: &str, body: &'static str) -> Reply {
    request(addr, Request::post(path).header("host", "test.local").body(Full::new(Bytes::from(body))).unwrap()).await
}

#[tokio::test]
async fn a_server_killed_mid_run_costs_no_client_an_error_and_is_skipped_after_max_fails() {
    let (a, b) = (Backend::start().await, Backend::start().await);
    let sg = start(&[quoted(a.addr), quoted(b.addr)], ", max_fails: 1, fail_timeout: 60s");
    for _ in 0..10 {
        assert_eq!(get(sg.addr, "/x", &[]).await.status, 200);
    }
    assert_eq!((a.hits().len(), b.hits().len()), (5, 5));
    a.kill().await;
    for i in 0..20 {
        assert_eq!(get(sg.addr, "/x", &[]).await.status, 200, "request {i} after the kill");
    }
    assert_eq!(b.hits().len(), 25);
    // One failure (max_fails) took it out; no later request went near it.
    let log = sg.wait_for_log("the line \"server taken out after failures\"", |log| {
        count(log, "server taken out after failures") > 0
    });
    assert_eq!(count(&log, "server taken out after failures"), 1, "{log}");
    assert_eq!(count(&log, "attempt failed, trying another server"), 1, "{log}");
    assert!(log.contains(&format!("\"server\":\"{}\"", a.addr)), "{log}");
}

/// nginx's `server … max_fails=N fail_timeout=T`: a server's own pair wins over its
/// upstream's.
#[tokio::test]
async fn a_servers_own_max_fails_takes_it_out_where_the_upstreams_would_not() {
    let b = Backend::start().await;
    let dead = closed_port();
    let servers = [format!("{{ address: \"127.0.0.1:{dead}\", max_fails: 1, fail_timeout: 60s }}"), quoted(b.addr)];
    let sg = start(&servers, ", max_fails: 0");
    for i in 0..10 {
        assert_eq!(get(sg.addr, "/x", &[]).await.status, 200, "request {i}");
    }
    let log = sg.wait_for_log("the line \"server taken out after failures\"", |log| {
        count(log, "server taken out after failures") > 0
    });
    assert_eq!(count(&log, "attempt failed, trying another server"), 1, "taken out after one failure: {log}");
    assert!(log.contains(&format!("\"server\":\"127.0.0.1:{dead}\"")), "{log}");
}

#[tokio::test]
async fn a_request_with_a_body_is_sent_again_whole_when_the_first_server_refused_it() {
    let b = Backend::start().await;
    // max_fails 0: the dead server keeps its turn, and every other request meets it.
    let sg = start(&[format!("\"127.0.0.1:{}\"", closed_port()), quoted(b.addr)], ", max_fails: 0");
    for _ in 0..6 {
        let r = post(sg.addr, "/upload", "twelve bytes").await;
        assert_eq!((r.status, r.text().as_str()), (200, "12"));
    }
    assert_eq!(b.hits().len(), 6);
}

#[tokio::test]
async fn a_connection_closed_before_the_response_is_retried_only_when_that_is_safe() {
    let b = Backend::start().await;
    let servers = [quoted(hangs_up().await), quoted(b.addr)];
    // The first request of each proxy goes to the first server.
    let sg = start(&servers, ", max_fails: 0");
    assert_eq!(get(sg.addr, "/x", &[]).await.status, 200, "an idempotent request goes to the next server");
    let sg = start(&servers, ", max_fails: 0");
    // A POST whose whole request was sent may have been acted on: never sent twice.
    assert_eq!(post(sg.addr, "/x", "").await.status, 502);
    assert_eq!(b.hits().len(), 1);
    let sg = start(&servers, ", max_fails: 0, retries: 0");
    assert_eq!(get(sg.addr, "/x", &[]).await.status, 502, "retries: 0 sends once");
}

#[tokio::test]
async fn a_slow_server_answers_504_and_the_request_is_not_sent_again() {
    let (slow, b) = (Backend::start().await, Backend::start().await);
    let sg = start(&[quoted(slow.addr), quoted(b.addr)], "");
    let started = Instant::now();
    assert_eq!(get(sg.addr, "/sleep/3000", &[]).await.status, 504);
    assert!(started.elapsed() < Duration::from_millis(2500), "{:?}", started.elapsed());
    assert_eq!((slow.hits().len(), b.hits().len()), (1, 0));
    // Not answering in time is a failure: the slow server is out, the other serves.
    for _ in 0..3 {
        assert_eq!(get(sg.addr, "/x", &[]).await.status, 200);
    }
    assert_eq!((slow.hits().len(), b.hits().len()), (1, 3));
}

#[tokio::test]
async fn when_every_server_is_out_the_answer_is_502_at_once_with_a_line_naming_them() {
    let dead = [format!("127.0.0.1:{}", closed_port()), format!("127.0.0.1:{}", closed_port())];
    let sg = start(&dead.iter().map(|d| format!("\"{d}\"")).collect::<Vec<_>>(), ", fail_timeout: 60s");
    // Tried on both, both taken out.
    assert_eq!(get(sg.addr, "/x", &[]).await.status, 502);
    assert_eq!(get(sg.addr, "/x", &[]).await.status, 502);
    let log = sg.wait_for_log("the line \"all servers of the upstream are out\"", |log| {
        count(log, "all servers of the upstream are out") > 0
    });
    let line = log.lines().find(|l| l.contains("all servers of the upstream are out")).expect("no line for all out");
    assert!(line.contains(&format!("{}, {}", dead[0], dead[1])), "{line}");
    // Only the first request tried to connect.
    assert_eq!(count(&log, "server taken out after failures"), 2, "{log}");
    assert_eq!(count(&log, "attempt failed, trying another server"), 1, "{log}");
}

#[tokio::test]
async fn round_robin_shares_follow_the_weights() {
    let backends = [Backend::start().await, Backend::start().await, Backend::start().await];
    let servers: Vec<_> =
        backends.iter().zip([1, 2, 3]).map(|(b, w)| format!("{{ address: \"{}\", weight: {w} }}", b.addr)).collect();
    let sg = start(&servers, "");
    for _ in 0..600 {
        assert_eq!(get(sg.addr, "/x", &[]).await.status, 200);
    }
    let shares: Vec<_> = backends.iter().map(|b| b.hits().len()).collect();
    assert_eq!(shares, [100, 200, 300]);
}

#[tokio::test]
async fn random_two_shares_follow_the_weights_within_a_few_percent() {
    let backends = [Backend::start().await, Backend::start().await];
    let servers: Vec<_> =
        backends.iter().zip([1, 3]).map(|(b, w)| format!("{{ address: \"{}\", weight: {w} }}", b.addr)).collect();
    let sg = start(&servers, ", balance: random_two");
    for _ in 0..1000 {
        assert_eq!(get(sg.addr, "/x", &[]).await.status, 200);
    }
    // 250 expected on the first; five standard deviations (about 14) is within 7 %.
    let first = backends[0].hits().len();
    assert!(first.abs_diff(250) <= 70, "{first} of 1000, expected 250");
}

#[tokio::test]
async fn least_conn_sends_new_requests_past_a_busy_server() {
    let (a, b) = (Backend::start().await, Backend::start().await);
    let sg = start(&[quoted(a.addr), quoted(b.addr)], ", balance: least_conn");
    // A response in progress keeps its server busy until its body ends.
    let held = send(sg.addr, Request::get("/stream").header("host", "h").body(Full::new(Bytes::new())).unwrap()).await;
    let busy = if a.hits().len() == 1 { &a } else { &b };
    // Each answered in full before the next is sent: none may find the idle server still
    // counting the request before it (which made it a tie, broken round robin).
    for _ in 0..100 {
        assert_eq!(get(sg.addr, "/x", &[]).await.status, 200);
    }
    assert_eq!(busy.hits().len(), 1, "a request went to the busy server");
    busy.release.notify_one();
    assert_eq!(read(held).await.text(), "first\nrest\n");
}

#[tokio::test]
async fn hash_keeps_each_key_on_one_server() {
    let backends = [Backend::start().await, Backend::start().await, Backend::start().await];
    let servers: Vec<_> = backends.iter().map(|b| quoted(b.addr)).collect();
    let sg = start(&servers, ", balance: hash, hash_key: \"header:x-user\"");
    for user in 0..30 {
        let before: Vec<_> = backends.iter().map(|b| b.hits().len()).collect();
        for _ in 0..4 {
            assert_eq!(get(sg.addr, "/x", &[("x-user", &user.to_string())]).await.status, 200);
        }
        let grew: Vec<_> = backends.iter().zip(&before).map(|(b, n)| b.hits().len() - n).collect();
        assert!(grew.contains(&4), "user {user} spread over servers: {grew:?}");
    }
    assert!(backends.iter().all(|b| !b.hits().is_empty()), "30 keys all on some servers only");
}

#[tokio::test]
async fn an_http2_upstream_is_spoken_to_in_http2_and_bodies_still_stream() {
    let backend = Backend::start_h2().await;
    let sg = start(&[quoted(backend.addr)], ", http2: true");
    let r = post(sg.addr, "/upload", "twelve bytes").await;
    assert_eq!((r.status, r.text().as_str()), (200, "12"));
    let hit = &backend.hits()[0];
    assert_eq!(hit.version, http::Version::HTTP_2);
    assert_eq!(hit.headers["x-forwarded-for"], "127.0.0.1");
    // The response streams: the first chunk arrives while the backend holds the rest.
    let response =
        send(sg.addr, Request::get("/stream").header("host", "h").body(Full::new(Bytes::new())).unwrap()).await;
    assert_eq!(response.version(), http::Version::HTTP_11);
    let mut body = response.into_body();
    let first = tokio::time::timeout(Duration::from_secs(5), body.frame()).await;
    assert_eq!(first.expect("first chunk not streamed").unwrap().unwrap().into_data().unwrap(), "first\n");
    backend.release.notify_one();
    assert_eq!(body.collect().await.unwrap().to_bytes(), "rest\n");
}

#[tokio::test]
async fn an_https_server_with_a_private_ca_is_verified_against_ca_file() {
    let (backend, ca) = Backend::start_tls().await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca).unwrap();
    let server = format!("\"https://{}\"", backend.addr);
    let sg = start(std::slice::from_ref(&server), &format!(", tls: {{ ca_file: \"{}\" }}", ca_file.display()));
    let r = post(sg.addr, "/upload", "twelve bytes").await;
    assert_eq!((r.status, r.text().as_str()), (200, "12"));
    assert_eq!(backend.hits()[0].headers["host"], "test.local");

    // The public roots do not know the private CA: the handshake fails, 502.
    let untrusted = start(std::slice::from_ref(&server), "");
    assert_eq!(get(untrusted.addr, "/x", &[]).await.status, 502);
    let log = untrusted.wait_for_log("the line \"upstream error\"", |log| log.contains("upstream error"));
    assert!(log.contains("certificate"), "{log}");
    // A name the certificate does not hold is refused even by the right CA.
    let wrong_name = start(
        std::slice::from_ref(&server),
        &format!(", tls: {{ ca_file: \"{}\", sni: other.example }}", ca_file.display()),
    );
    assert_eq!(get(wrong_name.addr, "/x", &[]).await.status, 502);
    // verify: false takes any certificate, and says so loudly.
    let blind = start(std::slice::from_ref(&server), ", tls: { verify: false }");
    assert_eq!(get(blind.addr, "/x", &[]).await.status, 200);
    assert!(blind.log().contains("NOT verified"), "{}", blind.log());
    assert_eq!(backend.hits().len(), 2);
}

#[tokio::test]
async fn an_https_server_is_spoken_to_in_http2_when_alpn_agrees_on_h2() {
    let (backend, ca) = Backend::start_tls().await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca).unwrap();
    let server = format!("\"https://localhost:{}\"", backend.addr.port());
    let sg = start(&[server], &format!(", http2: true, tls: {{ ca_file: \"{}\" }}", ca_file.display()));
    let r = post(sg.addr, "/upload", "twelve bytes").await;
    assert_eq!((r.status, r.text().as_str()), (200, "12"));
    assert_eq!(backend.hits()[0].version, http::Version::HTTP_2);
}

// Several threads: the backends must answer checks while this thread waits on the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_failing_its_health_check_gets_no_requests_until_one_passes() {
    let (a, b) = (Backend::start().await, Backend::start().await);
    // Passive health and retries off: only the active check keeps requests away from b.
    let check = ", max_fails: 0, retries: 0, health_check: { path: /status/204, interval: 100ms, timeout: 500ms, expect_status: [204] }";
    let sg = start(&[quoted(a.addr), quoted(b.addr)], check);
    b.kill().await;
    let log = sg.wait_for_log("the line \"health check failed: server out\"", |log| {
        log.contains("health check failed: server out")
    });
    let line = log.lines().find(|l| l.contains("health check failed: server out")).expect("no failed check");
    assert!(line.contains(&b.addr.to_string()), "{line}");
    for _ in 0..10 {
        assert_eq!(get(sg.addr, "/x", &[]).await.status, 200);
    }
    assert!(a.hits().iter().filter(|h| h.path_and_query == "/x").count() == 10);
    assert!(a.hits().iter().any(|h| h.path_and_query == "/status/204"), "a was never checked");

    // A status not expected fails the check too: with every server out, 502 at once.
    let sg = start(&[quoted(a.addr)], ", health_check: { path: /status/503, interval: 100ms }");
    sg.wait_for_log("the line \"health check failed: server out\"", |log| {
        log.contains("health check failed: server out")
    });
    assert_eq!(get(sg.addr, "/x", &[]).await.status, 502);
    assert!(
        sg.wait_for_log("the line \"all servers of the upstream are out\"", |log| log
            .contains("all servers of the upstream are out"))
            .contains("all servers")
    );
}

/// The value of the series `name{upstream="UPSTREAM"}` in `metrics`, if it is there.
fn series(metrics: &Metrics, name: &str, upstream: &str) -> Option<f64> {
    metrics.get(&format!("{name}{{upstream=\"{upstream}\"}}"))
}

#[tokio::test]
async fn an_https_server_written_by_name_is_verified_by_that_name_not_by_the_address_it_resolves_to() {
    // The certificate holds the name only: verifying the resolved 127.0.0.1 would fail.
    let (backend, ca) = Backend::start_tls_for(&["localhost"]).await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca).unwrap();
    let port = backend.addr.port();
    let sg = Sluicegate::start(&format!(
        "listen: 127.0.0.1:0\nadmin: {{ listen: 127.0.0.1:0 }}\nupstreams:\n  app: {{ servers: [\"https://localhost:{port}\"], tls: {{ ca_file: \"{}\" }} }}\nroutes:\n  - upstream: app\n    upstream_host: server\n",
        ca_file.display()
    ));
    for _ in 0..3 {
        assert_eq!(get(sg.addr, "/x", &[]).await.status, 200);
    }
    // `upstream_host: server` sends the server as written, not its address.
    assert!(backend.hits().iter().all(|h| h.headers["host"] == format!("localhost:{port}").as_str()));
    // This machine's /etc/hosts gives localhost one address.
    assert_eq!(series(&Metrics::of(&sg).await, "sluicegate_upstream_addresses", "app"), Some(1.0));
}

#[tokio::test]
async fn a_host_name_that_does_not_resolve_has_no_server_and_is_looked_up_again_logged_once() {
    let backend = Backend::start().await;
    // RFC 6761: `.invalid` never resolves.
    let sg = Sluicegate::start(&format!(
        "listen: 127.0.0.1:0\nadmin: {{ listen: 127.0.0.1:0 }}\nupstreams:\n  app: {{ servers: [\"nowhere.invalid:80\", \"{}\"] }}\n  gone: {{ servers: [\"nowhere.invalid:80\"] }}\nroutes:\n  - match: {{ path_prefix: /gone }}\n    upstream: gone\n  - upstream: app\n",
        backend.addr
    ));
    // The other server takes every request: the name has no server to fail.
    for _ in 0..6 {
        assert_eq!(get(sg.addr, "/x", &[]).await.status, 200);
    }
    assert_eq!(backend.hits().len(), 6);
    let started = Instant::now();
    assert_eq!(get(sg.addr, "/gone", &[]).await.status, 502);
    assert!(started.elapsed() < Duration::from_millis(500), "{:?}", started.elapsed());
    let log = sg.wait_for_log("the line \"all servers of the upstream are out\"", |log| {
        log.contains("all servers of the upstream are out")
    });
    assert!(log.contains("nowhere.invalid:80 (no address)"), "{log}");
    let m = Metrics::of(&sg).await;
    assert_eq!(series(&m, "sluicegate_upstream_addresses", "app"), Some(1.0), "{}", m.0);
    assert_eq!(series(&m, "sluicegate_upstream_addresses", "gone"), Some(0.0), "{}", m.0);
    // Tried again a second later (then 2 s, 4 s… later), logged only the first time.
    wait_until("a second look-up", Duration::from_secs(10), async || {
        series(&Metrics::of(&sg).await, "sluicegate_upstream_resolve_failures_total", "gone").unwrap_or(0.0) >= 2.0
    })
    .await;
    let lines = |upstream: &str| {
        sg.log()
            .lines()
            .filter(|l| {
                l.contains("upstream host name did not resolve") && l.contains(&format!("\"upstream\":\"{upstream}\""))
            })
            .count()
    };
    assert_eq!((lines("app"), lines("gone")), (1, 1), "{}", sg.log());
}

#[tokio::test]
async fn a_reload_looks_names_up_again_and_drops_the_address_count_of_an_upstream_it_removed() {
    let (a, b) = (Backend::start().await, Backend::start().await);
    let yaml = |port: u16, extra: &str| {
        format!(
            "listen: 127.0.0.1:0\nadmin: {{ listen: 127.0.0.1:0 }}\nupstreams:\n  app: {{ servers: [\"localhost:{port}\"], resolve_interval: off }}\n{extra}routes:\n  - upstream: app\n"
        )
    };
    let sg = Sluicegate::start(&yaml(a.addr.port(), "  old: { servers: [\"127.0.0.1:1\"] }\n"));
    assert_eq!(get(sg.addr, "/x", &[]).await.status, 200);
    assert_eq!(series(&Metrics::of(&sg).await, "sluicegate_upstream_addresses", "old"), Some(1.0));
    let log = sg.reload(&yaml(b.addr.port(), ""));
    assert!(log.contains("configuration reloaded"), "{log}");
    assert_eq!(get(sg.addr, "/x", &[]).await.status, 200);
    assert_eq!((a.hits().len(), b.hits().len()), (1, 1));
    let m = Metrics::of(&sg).await;
    assert_eq!(series(&m, "sluicegate_upstream_addresses", "app"), Some(1.0), "{}", m.0);
    assert_eq!(series(&m, "sluicegate_upstream_addresses", "old"), None, "{}", m.0);
}

/// A server that answers `per_connection` requests on each connection (`answer`, kept
/// alive) and then closes it silently, as a server whose keep-alive timeout ran out
/// does; it counts the connections it accepted and signals each close.
async fn answers_then_hangs_up(
    per_connection: usize,
    answer: &'static [u8],
) -> (SocketAddr, Arc<AtomicUsize>, Arc<Notify>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (accepted, closed) = (Arc::new(AtomicUsize::new(0)), Arc::new(Notify::new()));
    let (count, signal) = (Arc::clone(&accepted), Arc::clone(&closed));
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let signal = Arc::clone(&signal);
            tokio::spawn(async move {
                let mut head = Vec::new();
                for _ in 0..per_connection {
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        let mut buf = [0; 4096];
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    head.clear();
                    if stream.write_all(answer).await.is_err() {
                        return;
                    }
                }
                drop(stream);
                signal.notify_one();
            });
        }
    });
    (addr, accepted, closed)
}

#[tokio::test]
async fn upstream_connections_are_kept_alive_and_one_the_server_closed_is_replaced_unnoticed() {
    let (backend, accepted, closed) = answers_then_hangs_up(3, b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
    let sg = start(&[quoted(backend)], "");
    for _ in 0..3 {
        assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "three requests in a row share one connection");
    closed.notified().await;
    // Not idempotent, so not retried after a send: it must go on a live connection.
    assert_eq!(post(sg.addr, "/", "").await.status, 200);
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_connection_whose_response_has_no_body_is_kept_alive_too() {
    let (backend, accepted, _) = answers_then_hangs_up(3, b"HTTP/1.1 204 No Content\r\n\r\n").await;
    let sg = start(&[quoted(backend)], "");
    for _ in 0..3 {
        assert_eq!(get(sg.addr, "/", &[]).await.status, 204);
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "three requests in a row share one connection");
}

/// `start`'s configuration with an admin listener, for the pool's metrics.
fn start_with_admin(servers: &[String], extra: &str) -> Sluicegate {
    let list = servers.join(", ");
    Sluicegate::start(&format!(
        "listen: 127.0.0.1:0\nadmin: {{ listen: 127.0.0.1:0 }}\nupstreams:\n  app: {{ servers: [{list}], connect_timeout: 500ms, timeout: 1s{extra} }}\nroutes:\n  - match: {{ path_prefix: / }}\n    upstream: app\n"
    ))
}

#[tokio::test]
async fn a_reload_that_changes_workers_keeps_the_pool_sized_for_the_running_threads() {
    let backend = Backend::start().await;
    let config = |workers: u32| {
        format!(
            "listen: 127.0.0.1:0\nserver: {{ workers: {workers} }}\nadmin: {{ listen: 127.0.0.1:0 }}\nupstreams:\n  app: {{ servers: [{}], timeout: 5s, keepalive: 4 }}\nroutes:\n  - match: {{ path_prefix: / }}\n    upstream: app\n",
            quoted(backend.addr)
        )
    };
    let sg = Sluicegate::start(&config(1));
    // Still one thread after the reload: its pool keeps all four, not a quarter of them.
    assert!(sg.reload(&config(4)).contains("server.workers changes at the next restart"));
    let held: Vec<_> = (0..4).map(|_| tokio::spawn(get(sg.addr, "/held", &[]))).collect();
    wait_until("four requests at the server", Duration::from_secs(5), async || backend.hits().len() == 4).await;
    backend.gate.add_permits(4);
    for reply in held {
        assert_eq!(reply.await.unwrap().status, 200);
    }
    let m = Metrics::of(&sg).await;
    assert_eq!(series(&m, "sluicegate_upstream_idle_connections", "app"), Some(4.0), "{}", m.0);
}

#[tokio::test]
async fn a_server_at_max_conns_queues_the_next_request_until_one_ends_and_a_queue_that_waits_too_long_is_503() {
    let backend = Backend::start().await;
    let sg = start_with_admin(&[quoted(backend.addr)], ", max_conns: 1, queue_timeout: 300ms");
    // The one room is taken for as long as the server works on the request.
    let held = tokio::spawn(get(sg.addr, "/held", &[]));
    wait_until("the held request to reach the server", Duration::from_secs(5), async || backend.hits().len() == 1)
        .await;
    let refused = get(sg.addr, "/x", &[]).await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(backend.hits().len(), 1, "the refused request never reached the server");
    assert!(sg.wait_for_log("the line \"max_conns (1)\"", |l| l.contains("max_conns (1)")).contains("waited 300ms"));
    // One that waits gets the room when the held request ends.
    let queued = tokio::spawn(get(sg.addr, "/y", &[]));
    wait_until("the next request to queue", Duration::from_secs(5), async || {
        series(&Metrics::of(&sg).await, "sluicegate_upstream_queued_total", "app") == Some(2.0)
    })
    .await;
    assert_eq!(backend.hits().len(), 1, "the queued request waits for the room");
    backend.gate.add_permits(2);
    assert_eq!(held.await.unwrap().status, 200);
    assert_eq!(queued.await.unwrap().status, 200);
    let m = Metrics::of(&sg).await;
    assert_eq!(series(&m, "sluicegate_upstream_full_total", "app"), Some(1.0), "{}", m.0);
}

#[tokio::test]
async fn idle_connections_past_keepalive_are_closed_and_counted() {
    let backend = Backend::start().await;
    let sg = start_with_admin(&[quoted(backend.addr)], ", keepalive: 2");
    // Five at once take five connections; all five come back to a pool that keeps two.
    let held: Vec<_> = (0..5).map(|_| tokio::spawn(get(sg.addr, "/held", &[]))).collect();
    wait_until("five requests at the server", Duration::from_secs(5), async || backend.hits().len() == 5).await;
    backend.gate.add_permits(5);
    for reply in held {
        assert_eq!(reply.await.unwrap().status, 200);
    }
    let m = Metrics::of(&sg).await;
    assert_eq!(series(&m, "sluicegate_upstream_idle_connections", "app"), Some(2.0), "{}", m.0);
    assert_eq!(
        m.get(r#"sluicegate_upstream_idle_closed_total{upstream="app",reason="keepalive"}"#),
        Some(3.0),
        "{}",
        m.0
    );
}

/// On its defaults the pool keeps what the load needs: 64 clients, each on its own
/// keep-alive connection, send request after request, and after the first 64 no request
/// opens an upstream connection (a fixed `keepalive` below the concurrency would close
/// and reopen one for every request past it).
#[tokio::test]
async fn on_its_defaults_a_steady_load_opens_no_upstream_connection_after_its_first() {
    use hyper_util::rt::TokioIo;
    let backend = Backend::start().await;
    let sg = start_with_admin(&[quoted(backend.addr)], "");
    const CLIENTS: usize = 64;
    const EACH: usize = 40;
    // All clients hold a request at the server at once first, so that the pool must
    // hold 64 connections; then each sends its requests one after another.
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let addr = sg.addr;
            tokio::spawn(async move {
                let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
                let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
                tokio::spawn(conn);
                for i in 0..EACH {
                    let path = if i == 0 { "/held" } else { "/x" };
                    let req = http::Request::get(path).header("host", "localhost").body(String::new()).unwrap();
                    let response = sender.send_request(req).await.unwrap();
                    assert_eq!(response.status(), 200);
                    response.into_body().collect().await.unwrap();
                }
            })
        })
        .collect();
    wait_until("64 requests held at the server", Duration::from_secs(10), async || backend.hits().len() == CLIENTS)
        .await;
    backend.gate.add_permits(CLIENTS);
    for client in clients {
        client.await.unwrap();
    }
    let m = Metrics::of(&sg).await;
    let opened = series(&m, "sluicegate_upstream_connections_opened_total", "app").unwrap();
    assert_eq!(opened, CLIENTS as f64, "{} requests opened {opened} connections\n{}", CLIENTS * EACH, m.0);
    assert_eq!(series(&m, "sluicegate_upstream_idle_connections", "app"), Some(CLIENTS as f64));
    assert_eq!(series(&m, "sluicegate_upstream_connections_in_use", "app"), Some(0.0));
    for reason in ["keepalive", "surplus", "timeout"] {
        let closed = m.get(&format!("sluicegate_upstream_idle_closed_total{{upstream=\"app\",reason=\"{reason}\"}}"));
        assert_eq!(closed, Some(0.0), "{reason}");
    }
}
