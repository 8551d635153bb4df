//! Request body limits: `max_body_bytes` (server-wide, per route) and `body_read_timeout`.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{Full, channel::Channel};

use crate::common::*;

fn config(upstream: &str) -> String {
    format!(
        "listen: 127.0.0.1:0\nadmin: {{ listen: 127.0.0.1:0 }}\nserver: {{ max_body_bytes: 1k, body_read_timeout: 300ms }}\nupstreams:\n  app: {{ servers: [\"{upstream}\"], timeout: 20s }}\nroutes:\n  - match: {{ methods: [PUT] }}\n    upstream: app\n    max_body_bytes: 1m\n  - upstream: app\n"
    )
}

#[tokio::test]
async fn declared_body_over_the_limit_is_413_and_never_forwarded() {
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&config(&backend.addr.to_string()));
    let upload = |method: &str, len: usize| {
        Request::builder()
            .method(method)
            .uri("/upload")
            .header("host", "test.local")
            .body(Full::new(Bytes::from(vec![b'x'; len])))
            .unwrap()
    };
    let r = request(sg.addr, upload("POST", 1025)).await;
    assert_eq!(r.status, 413);
    assert!(backend.hits().is_empty(), "an oversized body reached the backend");
    // Up to the limit passes; a route may allow more.
    assert_eq!(request(sg.addr, upload("POST", 1024)).await.text(), "1024");
    assert_eq!(request(sg.addr, upload("PUT", 100_000)).await.text(), "100000");
}

#[tokio::test]
async fn chunked_body_growing_past_the_limit_is_cut_with_413() {
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&config(&backend.addr.to_string()));
    let (mut tx, body) = Channel::<Bytes, std::convert::Infallible>::new(4);
    let pending = tokio::spawn(async move {
        request(sg.addr, Request::post("/upload").header("host", "test.local").body(body).unwrap()).await
    });
    tx.send_data(Bytes::from(vec![b'x'; 600])).await.unwrap();
    // The first chunk streams to the backend before the body is known to be too large.
    tokio::time::timeout(Duration::from_secs(10), backend.first_frame.notified()).await.expect("body not streamed");
    tx.send_data(Bytes::from(vec![b'x'; 600])).await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(10), pending).await.expect("no answer").unwrap();
    assert_eq!(r.status, 413);
    drop(tx);
}

#[tokio::test]
async fn stalled_body_is_408_after_body_read_timeout() {
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&config(&backend.addr.to_string()));
    let (mut tx, body) = Channel::<Bytes, std::convert::Infallible>::new(4);
    let started = Instant::now();
    let addr = sg.addr;
    let pending = tokio::spawn(async move {
        request(addr, Request::post("/upload").header("host", "test.local").body(body).unwrap()).await
    });
    tx.send_data(Bytes::from_static(b"some")).await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(10), pending).await.expect("stalled body never cut").unwrap();
    assert_eq!(r.status, 408);
    // Well before the upstream's 20 s timeout.
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    drop(tx);
    // Counted as the client's doing, not as a failing upstream.
    let metrics = Metrics::of(&sg).await;
    let errors =
        |kind: &str| metrics.value(&format!("sluicegate_upstream_errors_total{{route=\"routes[1]\",kind=\"{kind}\"}}"));
    assert_eq!((errors("client_body"), errors("failed")), (1.0, 0.0));
}

#[test]
fn bad_sizes_and_timeouts_are_config_errors_at_their_field() {
    let yaml = "listen: 127.0.0.1:0\nserver: { max_body_bytes: 0, body_read_timeout: 0s }\nupstreams:\n  app: { servers: [\"127.0.0.1:1\"], tunnel_idle_timeout: 2d }\nroutes:\n  - upstream: app\n    max_body_bytes: 10t\n";
    let (_dir, path) = config_file(yaml);
    let out = binary().arg("check").arg("-c").arg(&path).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for wanted in [
        "server.max_body_bytes: must be positive",
        "server.body_read_timeout: must be longer than zero",
        "upstreams.app.tunnel_idle_timeout: \"2d\" is too long",
        ":7:21: routes[0].max_body_bytes: invalid size \"10t\"",
    ] {
        assert!(stderr.contains(wanted), "{wanted} not in:\n{stderr}");
    }
}

/// An HTTP/2 client may send an empty DATA frame: the body forwarded to an HTTP/1
/// upstream goes on with what follows it, not waiting for something else to wake it.
#[tokio::test]
async fn an_empty_http2_data_frame_does_not_stall_the_body_behind_it() {
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&config(&backend.addr.to_string()));
    let stream = tokio::net::TcpStream::connect(sg.addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let (mut tx, body) = Channel::<Bytes, std::convert::Infallible>::new(4);
    let started = Instant::now();
    let pending = tokio::spawn(async move {
        let req = Request::post("http://test.local/echo").body(body).unwrap();
        read(sender.send_request(req).await.unwrap()).await
    });
    tx.send_data(Bytes::from_static(b"first ")).await.unwrap();
    tx.send_data(Bytes::new()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    tx.send_data(Bytes::from_static(b"and last")).await.unwrap();
    drop(tx);
    let r = tokio::time::timeout(Duration::from_secs(10), pending).await.expect("no answer").unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "first and last"));
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
}
