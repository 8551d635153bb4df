use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::*;

const STATIC: &str = "listen: 127.0.0.1:0\nroutes:\n  - respond: { status: 200, body: ok }\n";

#[tokio::test]
async fn h2c_requests_are_served() {
    let sg = Sluicegate::start(STATIC);
    let r = get_h2(sg.addr, "/").await;
    assert_eq!((r.status, r.text().as_str()), (200, "ok"));
}

#[tokio::test]
async fn malformed_request_gets_400_and_the_server_lives_on() {
    let sg = Sluicegate::start(STATIC);
    let answer = raw_exchange(sg.addr, b"NOT HTTP AT ALL\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");
    assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
}

#[tokio::test]
async fn oversized_request_headers_get_431() {
    let sg = Sluicegate::start(STATIC);
    let request = format!("GET / HTTP/1.1\r\nHost: h\r\nX-Big: {}\r\n\r\n", "a".repeat(1 << 20));
    let answer = raw_exchange(sg.addr, request.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{:?}", &answer[..answer.len().min(200)]);
}

#[tokio::test]
async fn connect_gets_405_and_never_reaches_the_upstream() {
    let backend = Backend::start().await;
    let sg = Conf::new().upstream(&backend).route("upstream: b").start();
    let request = format!("CONNECT {0} HTTP/1.1\r\nHost: {0}\r\nConnection: close\r\n\r\n", backend.addr);
    let answer = raw_exchange(sg.addr, request.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 405"), "{answer:?}");
    assert!(backend.hits().is_empty(), "CONNECT reached the upstream");
}

/// A body that breaks off is the client's fault: 400, and no warning about the upstream.
#[tokio::test]
async fn broken_request_bodies_get_400_not_502() {
    let backend = Backend::start().await;
    let sg = Conf::new().upstream(&backend).route("upstream: b").start();
    let bad_chunk = "POST /upload HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n";
    let answer = raw_exchange(sg.addr, bad_chunk.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");

    // Fewer bytes than announced, then the client stops sending.
    let mut stream = TcpStream::connect(sg.addr).await.unwrap();
    stream.write_all(b"POST /upload HTTP/1.1\r\nHost: h\r\nContent-Length: 100\r\n\r\nshort").await.unwrap();
    stream.shutdown().await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out)).await;
    let answer = String::from_utf8_lossy(&out);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");
    assert!(!sg.log().contains("upstream error"), "{}", sg.log());
}

/// RFC 9112 §3.2: exactly one valid `Host` on HTTP/1.1, or 400 and nothing forwarded.
#[tokio::test]
async fn missing_repeated_or_invalid_host_gets_400() {
    let backend = Backend::start().await;
    let sg = Conf::new().upstream(&backend).route("upstream: b").start();
    for head in [
        "GET / HTTP/1.1\r\n",
        "GET / HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n",
        "GET / HTTP/1.1\r\nHost: a b\r\n",
        "GET / HTTP/1.1\r\nHost: user@a.example\r\n",
        "GET / HTTP/1.0\r\nHost: a.example\r\nHost: b.example\r\n",
        "GET http://admin.example/ HTTP/1.1\r\nHost: a.example\r\n",
    ] {
        let answer = raw_exchange(sg.addr, format!("{head}Connection: close\r\n\r\n").as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.") && answer[8..].starts_with(" 400 "), "{head:?}: {answer:?}");
    }
    assert!(backend.hits().is_empty(), "a request with a bad Host reached the upstream");
    // HTTP/1.0 may omit Host; one valid Host passes.
    for head in [
        "GET / HTTP/1.0\r\n",
        "GET / HTTP/1.1\r\nHost: a.example:8080\r\n",
        "GET http://a.example/ HTTP/1.1\r\nHost: A.example\r\n",
    ] {
        let answer = raw_exchange(sg.addr, format!("{head}Connection: close\r\n\r\n").as_bytes()).await;
        assert!(answer.contains(" 200 "), "{head:?}: {answer:?}");
    }
}

#[tokio::test]
async fn client_that_never_finishes_its_headers_is_cut_off() {
    let sg = Sluicegate::start(
        "listen: 127.0.0.1:0\nserver: { header_read_timeout: 300ms }\nroutes:\n  - respond: { status: 200 }\n",
    );
    let started = std::time::Instant::now();
    let mut stream = TcpStream::connect(sg.addr).await.unwrap();
    stream.write_all(b"GET / HTTP/1.1\r\nHost: h\r\n").await.unwrap();
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "connection still open after the header-read timeout");
    // Never before the timeout (the bound above is the machine's).
    assert!(started.elapsed() >= Duration::from_millis(300), "closed after {:?}", started.elapsed());
}

/// `header_read_timeout` counts from a request's first byte, not from the last answer:
/// a keep-alive connection quiet for longer (within `idle_timeout`) is still served.
#[tokio::test]
async fn a_quiet_keep_alive_connection_is_not_cut_by_the_header_timeout() {
    let sg = Sluicegate::start(
        "listen: 127.0.0.1:0\nserver: { header_read_timeout: 200ms, idle_timeout: 20s }\nroutes:\n  - respond: { status: 200, body: ok }\n",
    );
    let mut stream = TcpStream::connect(sg.addr).await.unwrap();
    let exchange = async |stream: &mut TcpStream| {
        stream.write_all(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n").await.unwrap();
        let mut answer = Vec::new();
        let mut chunk = [0u8; 256];
        while !answer.ends_with(b"\r\n\r\nok") {
            let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk)).await.unwrap().unwrap();
            assert!(n > 0, "closed: {}", String::from_utf8_lossy(&answer));
            answer.extend_from_slice(&chunk[..n]);
        }
    };
    exchange(&mut stream).await;
    // The passing of time is what is tested: three header timeouts of silence.
    tokio::time::sleep(Duration::from_millis(600)).await;
    exchange(&mut stream).await;
}

/// HTTP/2: a `Host` field that names another authority than `:authority` is a 400,
/// never forwarded; the same authority in both is served.
#[tokio::test]
async fn an_http2_host_other_than_the_authority_is_a_400() {
    let sg = Sluicegate::start("listen: 127.0.0.1:0\nroutes:\n  - respond: { status: 200 }\n");
    let with_host = |host: &str| {
        http::Request::get("http://a.example/")
            .header("host", host)
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap()
    };
    assert_eq!(request_h2(sg.addr, with_host("b.example")).await.status, 400);
    assert_eq!(request_h2(sg.addr, with_host("a.example")).await.status, 200);
}

#[tokio::test]
async fn sigterm_lets_in_flight_requests_finish_and_stops_accepting() {
    let backend = Backend::start().await;
    let mut sg = Conf::new().upstream(&backend).route("upstream: b").start();
    let addr = sg.addr;
    let slow = tokio::spawn(async move { get(addr, "/sleep/700", &[]).await });
    // Ready when the request is in flight at the backend.
    wait_until("the request at the backend", Duration::from_secs(10), async || !backend.hits().is_empty()).await;
    let exit = tokio::task::spawn_blocking(move || {
        let status = sg.terminate();
        (status, sg.log())
    });
    let reply = slow.await.unwrap();
    assert_eq!((reply.status, reply.text().as_str()), (200, "slept"));
    let (status, log) = exit.await.unwrap();
    assert!(status.success(), "{status:?}\n{log}");
    assert!(log.contains("all connections closed"), "{log}");
    assert!(TcpStream::connect(addr).await.is_err(), "still accepting after shutdown");
}

/// SIGINT stops the proxy as SIGTERM does; a request still running when
/// `shutdown_grace` ends is cut, and the proxy exits (0: the stop was asked for).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_drains_for_shutdown_grace_then_closes_what_is_left() {
    let backend = Backend::start().await;
    let mut sg = Sluicegate::start(&forwarding_config(&backend, "{ shutdown_grace: 300ms }"));
    let addr = sg.addr;
    // Held at the backend until the test ends.
    let held = tokio::spawn(async move { raw_exchange(addr, b"GET /held HTTP/1.1\r\nHost: h\r\n\r\n").await });
    wait_until("the request at the backend", Duration::from_secs(10), async || !backend.hits().is_empty()).await;
    let signalled = std::time::Instant::now();
    sg.signal("INT");
    let status =
        tokio::task::spawn_blocking(move || (sg.exits_within(Duration::from_secs(10)), sg.log())).await.unwrap();
    let (status, log) = status;
    assert!(status.success(), "{status:?}\n{log}");
    assert!(log.contains("grace period over"), "{log}");
    // Not before the grace period; the bound above is the machine's, not the proxy's.
    assert!(signalled.elapsed() >= Duration::from_millis(300), "{:?}", signalled.elapsed());
    let answer = held.await.unwrap();
    assert!(!answer.contains("200"), "the held request was answered: {answer}");
    backend.gate.add_permits(1);
}

/// A second signal while requests drain exits at once, with status 1, not after
/// `shutdown_grace`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_exits_at_once() {
    let backend = Backend::start().await;
    let mut sg = Sluicegate::start(&forwarding_config(&backend, "{ shutdown_grace: 60s }"));
    let addr = sg.addr;
    let _held = tokio::spawn(async move { get(addr, "/held", &[]).await });
    wait_until("the request at the backend", Duration::from_secs(10), async || !backend.hits().is_empty()).await;
    sg.signal("TERM");
    wait_until("the drain begun", Duration::from_secs(10), async || sg.log().contains("shutting down")).await;
    sg.signal("INT");
    let (status, log) =
        tokio::task::spawn_blocking(move || (sg.exits_within(Duration::from_secs(10)), sg.log())).await.unwrap();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("second signal: exiting without waiting"), "{log}");
    backend.gate.add_permits(1);
}

fn forwarding_config(backend: &Backend, server: &str) -> String {
    format!(
        "listen: 127.0.0.1:0\nserver: {server}\nupstreams:\n  b: {{ servers: [\"{}\"] }}\nroutes:\n  - upstream: b\n",
        backend.addr
    )
}

/// The status line of an HTTP/1.1 exchange on a new connection.
async fn h1_status(addr: std::net::SocketAddr, target: &str, header: &str) -> String {
    let request = format!("GET {target} HTTP/1.1\r\nHost: h\r\nX-Big: {header}\r\nConnection: close\r\n\r\n");
    let answer = raw_exchange(addr, request.as_bytes()).await;
    answer.lines().next().unwrap_or_default().to_owned()
}

/// `server.max_uri_bytes` and `server.max_header_bytes` on HTTP/1: 414 and 431 at the
/// configured sizes, whether below or above hyper's buffer, and nothing forwarded.
#[tokio::test]
async fn http1_heads_over_the_configured_sizes_get_414_and_431() {
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&forwarding_config(&backend, "{ max_uri_bytes: 2048, max_header_bytes: 4096 }"));
    let long_target = format!("/{}", "a".repeat(2100));
    assert_eq!(h1_status(sg.addr, &long_target, "x").await, "HTTP/1.1 414 URI Too Long");
    assert_eq!(h1_status(sg.addr, "/", &"b".repeat(4100)).await, "HTTP/1.1 431 Request Header Fields Too Large");
    assert!(backend.hits().is_empty(), "an oversized head reached the upstream");
    // Just within both limits: forwarded.
    assert_eq!(h1_status(sg.addr, &format!("/{}", "a".repeat(2000)), &"b".repeat(3900)).await, "HTTP/1.1 200 OK");
    assert_eq!(backend.hits().len(), 1);

    // Limits above hyper's 32 KiB buffer hold too.
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&forwarding_config(&backend, "{ max_uri_bytes: 40000, max_header_bytes: 100000 }"));
    let (target, header) = (format!("/{}", "a".repeat(39000)), "b".repeat(90_000));
    assert_eq!(h1_status(sg.addr, &target, &header).await, "HTTP/1.1 200 OK");
    assert_eq!(backend.hits()[0].headers["x-big"].len(), 90_000);
    assert_eq!(h1_status(sg.addr, &target, &"b".repeat(101_000)).await, "HTTP/1.1 431 Request Header Fields Too Large");
    assert_eq!(h1_status(sg.addr, &format!("/{}", "a".repeat(41000)), "x").await, "HTTP/1.1 414 URI Too Long");
    assert_eq!(backend.hits().len(), 1);
}

/// The defaults: 8 KiB of target, 32 KiB of header fields, on HTTP/1 and HTTP/2 alike.
#[tokio::test]
async fn default_head_limits_hold_on_http1_and_http2() {
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&forwarding_config(&backend, "{}"));
    assert_eq!(h1_status(sg.addr, &format!("/{}", "a".repeat(8200)), "x").await, "HTTP/1.1 414 URI Too Long");
    assert_eq!(h1_status(sg.addr, "/", &"b".repeat(33 * 1024)).await, "HTTP/1.1 431 Request Header Fields Too Large");
    assert!(backend.hits().is_empty(), "an oversized head reached the upstream");

    let h2 = |path: String, header: String| {
        let req = http::Request::get(format!("http://test.local{path}")).header("x-big", header);
        request_h2(sg.addr, req.body(http_body_util::Full::new(bytes::Bytes::new())).unwrap())
    };
    assert_eq!(h2(format!("/{}", "a".repeat(8200)), "x".into()).await.status, 414);
    assert_eq!(h2("/".into(), "b".repeat(33 * 1024)).await.status, 431);
    // Far past the limit, h2 itself refuses the stream with 431.
    assert_eq!(h2("/".into(), "b".repeat(400 * 1024)).await.status, 431);
    assert!(backend.hits().is_empty(), "an oversized head reached the upstream");
    // Within both: forwarded (hyper's own HTTP/2 default would have refused 16 KiB).
    let reply = h2(format!("/{}", "a".repeat(8000)), "b".repeat(30 * 1024)).await;
    assert_eq!(reply.status, 200);
    assert_eq!(backend.hits().len(), 1);
}

#[tokio::test]
async fn server_workers_is_the_number_of_threads_serving_requests() {
    let backend = Backend::start().await;
    let workers = |sg: &Sluicegate| sg.threads().iter().filter(|t| t.starts_with("sg-worker-")).count();
    let three = Sluicegate::start(&forwarding_config(&backend, "{ workers: 3 }"));
    // A new thread names itself once it first runs, which a loaded machine may delay a
    // little.
    wait_until("three named workers", Duration::from_secs(10), async || workers(&three) == 3).await;
    // Connections are handed to the workers in turn, and answered there.
    let replies = futures_util::future::join_all((0..6).map(|_| get(three.addr, "/", &[]))).await;
    assert!(replies.iter().all(|r| r.status == 200));
    // One worker is the main thread alone, and it serves concurrent requests.
    let one = Sluicegate::start(&forwarding_config(&backend, "{ workers: 1 }"));
    let replies = futures_util::future::join_all((0..16).map(|_| get(one.addr, "/", &[]))).await;
    assert!(replies.iter().all(|r| r.status == 200));
    assert_eq!(workers(&one), 0, "{:?}", one.threads());
}

/// The shipped systemd unit is valid (`systemd-analyze verify`, where installed) and
/// gives the dynamic user a writable log directory.
#[test]
fn the_systemd_unit_verifies_and_has_somewhere_to_log() {
    let unit = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/contrib/sluicegate.service")).unwrap();
    assert!(unit.contains("DynamicUser=yes") && unit.contains("LogsDirectory=sluicegate"), "{unit}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sluicegate.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/sluicegate", env!("CARGO_BIN_EXE_sluicegate"))).unwrap();
    match std::process::Command::new("systemd-analyze").arg("verify").arg(&path).output() {
        Ok(out) => assert!(out.status.success() && out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr)),
        Err(e) => eprintln!("systemd-analyze not run ({e}): only the unit's text was checked"),
    }
}

/// RFC 9112 §3.2: a target is origin-form, absolute-form, authority-form for CONNECT, or
/// `*` for OPTIONS. Anything else would be forwarded as another request than sent.
#[tokio::test]
async fn a_relative_or_authority_target_without_connect_is_a_400() {
    let backend = Backend::start().await;
    let sg = Conf::new().upstream(&backend).route("upstream: b").start();
    for request in [
        "DELETE x HTTP/1.1\r\nHost: x\r\n",
        "GET index.html HTTP/1.0\r\n",
        "GET x:80 HTTP/1.1\r\nHost: x\r\n",
        "GET * HTTP/1.1\r\nHost: x\r\n",
        "GET ?q=1 HTTP/1.1\r\nHost: x\r\n",
    ] {
        let answer = raw_exchange(sg.addr, format!("{request}Connection: close\r\n\r\n").as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 400 "), "{request:?}: {answer:?}");
    }
    assert!(backend.hits().is_empty(), "{:?}", backend.hits());
}

/// RFC 9112 §3.2: a `Host` whose port is no port is a 400.
#[tokio::test]
async fn a_host_with_an_invalid_port_is_a_400() {
    let backend = Backend::start().await;
    let sg = Conf::new().upstream(&backend).route("upstream: b").start();
    for host in ["x:abc", "x:8o", "x:65536", "[::1]:ab"] {
        let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let answer = raw_exchange(sg.addr, request.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 400 "), "{host:?}: {answer:?}");
    }
    assert!(backend.hits().is_empty(), "{:?}", backend.hits());
}

/// RFC 3986 §3.2.2: a host in brackets is an IPv6 address (or an IPvFuture); anything
/// else in brackets is a 400, never forwarded as `X-Forwarded-Host`.
#[tokio::test]
async fn a_host_in_brackets_that_is_no_ip_literal_is_a_400() {
    let backend = Backend::start().await;
    let sg = Conf::new().upstream(&backend).route("upstream: b").start();
    for host in ["[::,1]:80", "[::,1]", "[127.0.0.1]", "[]:80", "[fe80::1%25eth0]"] {
        let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let answer = raw_exchange(sg.addr, request.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 400 "), "{host:?}: {answer:?}");
    }
    assert!(backend.hits().is_empty(), "{:?}", backend.hits());
    let answer = raw_exchange(sg.addr, b"GET / HTTP/1.1\r\nHost: [::1]:80\r\nConnection: close\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer:?}");
    assert_eq!(backend.hits()[0].headers["x-forwarded-host"], "[::1]:80");
}

/// RFC 9110 §9.3.2: an answer to HEAD has no body, refusals included.
#[tokio::test]
async fn a_refusal_of_a_head_request_has_no_body() {
    let sg = Sluicegate::start(STATIC);
    for (request, status) in [
        ("HEAD / HTTP/1.1\r\nHost: a\r\nX A: 1\r\n\r\n".to_owned(), "400"),
        (format!("HEAD / HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\n\r\n", "a".repeat(100_000)), "431"),
        ("HEAD / HTTP/1.1\r\nHost: x:abc\r\nConnection: close\r\n\r\n".to_owned(), "400"),
        ("HEAD x HTTP/1.1\r\nHost: x\r\n\r\n".to_owned(), "400"),
    ] {
        let answer = raw_exchange(sg.addr, request.as_bytes()).await;
        assert!(answer.starts_with(&format!("HTTP/1.1 {status}")), "{answer:?}");
        assert!(answer.contains("content-length: ") && answer.ends_with("\r\n\r\n"), "a body: {answer:?}");
    }
}

/// TRACE echoes the request, credentials included: refused unless a route names it.
#[tokio::test]
async fn trace_is_405_unless_a_route_names_it() {
    let backend = Backend::start().await;
    let sg = Conf::new()
        .upstream(&backend)
        .route("match: { path: /debug, methods: [TRACE] }, upstream: b")
        .route("upstream: b")
        .start();
    let answer = raw_exchange(sg.addr, b"TRACE / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 405 "), "{answer:?}");
    assert!(backend.hits().is_empty(), "{:?}", backend.hits());
    let answer = raw_exchange(sg.addr, b"TRACE /debug HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer:?}");
    assert_eq!(backend.hits().len(), 1);
}
