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
    let mut sender = h2c(sg.addr).await;
    let (mut tx, body) = Channel::<Bytes, std::convert::Infallible>::new(4);
    let started = Instant::now();
    let pending = tokio::spawn(async move {
        let req = Request::post("http://test.local/echo").body(body).unwrap();
        read(sender.send_request(req).await.unwrap()).await
    });
    tx.send_data(Bytes::from_static(b"first ")).await.unwrap();
    tx.send_data(Bytes::new()).await.unwrap();
    // A gap after the empty frame is what is tested: the body must go on when the next
    // data comes, not wait for something else to wake it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    tx.send_data(Bytes::from_static(b"and last")).await.unwrap();
    drop(tx);
    let r = tokio::time::timeout(Duration::from_secs(10), pending).await.expect("no answer").unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "first and last"));
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
}

/// A declared body over `max_body_bytes` on a limited route is refused before the limits:
/// the one request a minute stays whole for the next request.
#[tokio::test]
async fn a_413_on_a_limited_route_leaves_the_quota_whole() {
    let backend = Backend::start().await;
    let sg = Conf::new()
        .upstream(&backend)
        .set("server: { max_body_bytes: 1k }")
        .limit("once", "key: ip, rate: 1r/m")
        .forwarding("once")
        .start();
    let post = |len: usize| {
        Request::post("/upload").header("host", "test.local").body(Full::new(Bytes::from(vec![b'x'; len]))).unwrap()
    };
    for _ in 0..3 {
        assert_eq!(request(sg.addr, post(2048)).await.status, 413);
    }
    assert_eq!(request(sg.addr, post(10)).await.text(), "10", "the minute's request is whole");
    assert_eq!(request(sg.addr, post(10)).await.status, 429, "and spent now");
    assert_eq!(backend.hits().len(), 1);
}

/// A client whose body is cut short (it goes away before its declared length, or before
/// the last chunk) never has a complete body reach the backend: the backend reads the
/// bytes that came and then the end of the connection, never a request it could act on.
#[tokio::test]
async fn a_body_the_client_cuts_short_reaches_the_backend_cut_short() {
    use tokio::io::AsyncWriteExt;
    let backend = StrictBackend::start(|_| b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec()).await;
    let sg = Conf::new().set(&format!("upstreams:\n  b: {{ servers: [\"{}\"] }}", backend.addr)).forwarding("").start();
    let heads = [
        ("POST /length HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n", "forty bytes of a body of a hundred......"),
        ("POST /chunked HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", "5\r\nhello\r\n"),
    ];
    for (i, (head, part)) in heads.iter().enumerate() {
        let mut client = tokio::net::TcpStream::connect(sg.addr).await.unwrap();
        client.write_all(head.as_bytes()).await.unwrap();
        client.write_all(part.as_bytes()).await.unwrap();
        let line = head.split(" HTTP").next().unwrap().to_owned();
        // The part is forwarded before the client goes: the backend has begun reading it.
        wait_until("the part at the backend", Duration::from_secs(10), async || {
            let reading = backend.reading();
            reading.starts_with(line.as_bytes()) && String::from_utf8_lossy(&reading).contains(part.trim_end())
        })
        .await;
        assert!(backend.seen().len() == i, "complete before the client went: {:?}", backend.lines());
        drop(client);
        wait_until("the backend's connection to end", Duration::from_secs(10), async || backend.seen().len() > i).await;
        let seen = &backend.seen()[i];
        assert_eq!(seen.line, format!("{line} (cut short)"), "{:?}", String::from_utf8_lossy(&seen.bytes));
        let text = String::from_utf8_lossy(&seen.bytes);
        let body = text.split_once("\r\n\r\n").unwrap().1;
        match i {
            0 => assert_eq!(body, *part, "the bytes that came, no more"),
            _ => assert!(!body.contains("0\r\n\r\n"), "no last chunk made up: {body:?}"),
        }
    }
}
