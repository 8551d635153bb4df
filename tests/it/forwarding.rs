use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full, channel::Channel};

use crate::common::*;

fn config(upstream: &str, extra: &str) -> String {
    format!(
        "listen: 127.0.0.1:0\n{extra}\nupstreams:\n  app: {{ servers: [\"{upstream}\"], connect_timeout: 500ms, timeout: 300ms }}\nroutes:\n  - name: hello\n    match: {{ path: /hello }}\n    respond: {{ status: 203, body: \"hi\\n\", headers: {{ x-static: \"1\" }} }}\n  - name: app\n    match: {{ path_prefix: /app/ }}\n    upstream: app\n  - name: direct\n    match: {{ path_prefix: /, methods: [GET, POST] }}\n    upstream: app\n"
    )
}

#[tokio::test]
async fn static_route_answers_without_a_backend() {
    let sg = Sluicegate::start(&config(&format!("127.0.0.1:{}", closed_port()), ""));
    let r = get(sg.addr, "/hello", &[]).await;
    assert_eq!((r.status, r.text().as_str()), (203, "hi\n"));
    assert_eq!(r.header("x-static"), Some("1"));
}

#[tokio::test]
async fn status_body_headers_and_query_pass_through() {
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&config(&backend.addr.to_string(), ""));
    let r = get(sg.addr, "/status/201?a=1&b=%20", &[]).await;
    assert_eq!((r.status, r.text().as_str()), (201, "status 201"));
    assert_eq!(r.header("x-backend"), Some("yes"));
    assert_eq!(backend.hits()[0].path_and_query, "/status/201?a=1&b=%20");
}

#[tokio::test]
async fn hop_by_hop_fields_are_removed_and_forwarded_fields_replaced_for_untrusted_peers() {
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&config(&backend.addr.to_string(), ""));
    let r = get(
        sg.addr,
        "/x",
        &[
            ("connection", "x-drop"),
            ("x-drop", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("x-keep", "1"),
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-host", "evil.example"),
        ],
    )
    .await;
    assert_eq!(r.status, 200);
    let seen = &backend.hits()[0].headers;
    for gone in ["x-drop", "keep-alive", "proxy-connection"] {
        assert!(!seen.contains_key(gone), "{gone} was forwarded");
    }
    assert_eq!(seen["x-keep"], "1");
    assert_eq!(seen["host"], "localhost");
    assert_eq!(seen["x-forwarded-for"], "127.0.0.1");
    assert_eq!(seen["x-forwarded-proto"], "http");
    assert_eq!(seen["x-forwarded-host"], "localhost");
}

#[tokio::test]
async fn forwarded_chain_of_a_trusted_proxy_is_extended() {
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&config(&backend.addr.to_string(), "trusted_proxies: [127.0.0.0/8]"));
    get(sg.addr, "/x", &[("x-forwarded-for", "1.1.1.1"), ("x-forwarded-proto", "https")]).await;
    let seen = &backend.hits()[0].headers;
    assert_eq!(seen["x-forwarded-for"], "1.1.1.1, 127.0.0.1");
    assert_eq!(seen["x-forwarded-proto"], "https");
}

#[tokio::test]
async fn response_body_streams_before_the_upstream_finishes() {
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&config(&backend.addr.to_string(), ""));
    let response =
        send(sg.addr, Request::get("/stream").header("host", "test.local").body(Full::new(Bytes::new())).unwrap())
            .await;
    let mut body = response.into_body();
    // The backend holds back the rest until we have the first chunk: a proxy that
    // buffered the body would never deliver it.
    let first = tokio::time::timeout(Duration::from_secs(5), body.frame()).await.expect("first chunk not streamed");
    assert_eq!(first.unwrap().unwrap().into_data().unwrap(), "first\n");
    backend.release.notify_one();
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(rest, "rest\n");
}

#[tokio::test]
async fn request_body_streams_to_the_upstream() {
    let backend = Backend::start().await;
    // The upstream's timeout counts the upload: 8 MiB through a busy
    // machine can take longer than the 300 ms the other tests use.
    let sg = Sluicegate::start(&config(&backend.addr.to_string(), "").replace(", timeout: 300ms", ", timeout: 20s"));
    let (mut tx, body) = Channel::<Bytes, std::convert::Infallible>::new(4);
    let req = Request::post("/upload").header("host", "test.local").body(body).unwrap();
    let pending = tokio::spawn(async move { request(sg.addr, req).await });
    tx.send_data(Bytes::from(vec![b'x'; 1024])).await.unwrap();
    // The backend has the first bytes while the client has not finished sending.
    tokio::time::timeout(Duration::from_secs(5), backend.first_frame.notified())
        .await
        .expect("request body not streamed");
    for _ in 0..256 {
        tx.send_data(Bytes::from(vec![b'y'; 32 * 1024])).await.unwrap();
    }
    drop(tx);
    let r = pending.await.unwrap();
    assert_eq!(r.text(), (1024 + 256 * 32 * 1024).to_string());
}

#[tokio::test]
async fn unmatched_request_is_404() {
    let sg = Sluicegate::start(&config(&format!("127.0.0.1:{}", closed_port()), ""));
    let r = request(sg.addr, Request::delete("/x").header("host", "h").body(Full::new(Bytes::new())).unwrap()).await;
    assert_eq!(r.status, 404);
}

#[tokio::test]
async fn refused_upstream_is_502_and_logged_with_its_route() {
    let sg = Sluicegate::start(&config(&format!("127.0.0.1:{}", closed_port()), ""));
    let r = get(sg.addr, "/app/x", &[]).await;
    assert_eq!(r.status, 502);
    let log = sg.wait_for_log("the line \"upstream error\"", |log| log.contains("upstream error"));
    assert!(log.lines().any(|l| l.contains("upstream error") && l.contains("\"route\":\"app\"")), "{log}");
}

#[tokio::test]
async fn slow_upstream_is_504_after_the_timeout() {
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&config(&backend.addr.to_string(), ""));
    let started = Instant::now();
    let r = get(sg.addr, "/sleep/3000", &[]).await;
    assert_eq!(r.status, 504);
    assert!(started.elapsed() < Duration::from_millis(2500), "{:?}", started.elapsed());
}

#[tokio::test]
async fn servers_of_an_upstream_take_turns() {
    let (a, b) = (Backend::start().await, Backend::start().await);
    let yaml =
        config(&a.addr.to_string(), "").replace(&format!("\"{}\"", a.addr), &format!("\"{}\", \"{}\"", a.addr, b.addr));
    let sg = Sluicegate::start(&yaml);
    for _ in 0..4 {
        assert_eq!(get(sg.addr, "/x", &[]).await.status, 200);
    }
    assert_eq!((a.hits().len(), b.hits().len()), (2, 2));
}

#[tokio::test]
async fn routes_rewrite_the_path_the_host_and_header_fields() {
    let backend = Backend::start().await;
    let b = backend.addr;
    let sg = Sluicegate::start(&format!(
        r#"listen: 127.0.0.1:0
upstreams:
  app: {{ servers: ["{b}"] }}
routes:
  - match: {{ path_prefix: /api/ }}
    upstream: app
    strip_prefix: true
    upstream_host: server
    set_request_headers: {{ x-added: "1", x-replaced: new }}
    remove_request_headers: [x-secret]
    set_response_headers: {{ x-served-by: sluicegate }}
  - match: {{ path_prefix: /old/ }}
    upstream: app
    rewrite: {{ prefix: /old/, to: /v2/ }}
    upstream_host: api.internal
"#
    ));
    let r = get(sg.addr, "/api//users/./me?q=1", &[("x-secret", "s"), ("x-replaced", "old")]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-served-by"), Some("sluicegate"));
    let hit = &backend.hits()[0];
    assert_eq!(hit.path_and_query, "/users/me?q=1");
    assert_eq!(hit.headers["host"], b.to_string());
    // The client's host is still told, in X-Forwarded-Host.
    assert_eq!(hit.headers["x-forwarded-host"], "localhost");
    assert_eq!((&hit.headers["x-added"], &hit.headers["x-replaced"]), (&"1".parse().unwrap(), &"new".parse().unwrap()));
    assert!(!hit.headers.contains_key("x-secret"));

    let r = get(sg.addr, "/old/a%20b", &[]).await;
    assert_eq!((r.status, r.header("x-served-by")), (200, None));
    let hit = &backend.hits()[1];
    assert_eq!((hit.path_and_query.as_str(), &hit.headers["host"]), ("/v2/a%20b", &"api.internal".parse().unwrap()));
}

/// An HTTP/1.0 upstream (like `python3 -m http.server`): no Content-Length, the body
/// ends when it closes the connection.
async fn http10_backend() -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = stream.write_all(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nold server\n").await;
                let _ = stream.shutdown().await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn an_http10_upstream_is_answered_as_http11_chunked_on_a_kept_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = http10_backend().await;
    let sg = Sluicegate::start(&config(&upstream.to_string(), ""));
    let mut client = tokio::net::TcpStream::connect(sg.addr).await.expect("connect");
    for round in 0..2 {
        client.write_all(b"GET /x HTTP/1.1\r\nHost: test.local\r\n\r\n").await.expect("write");
        let mut reply = Vec::new();
        let mut buf = [0u8; 1024];
        let read_all = async {
            while !reply.ends_with(b"0\r\n\r\n") {
                let n = client.read(&mut buf).await.expect("read");
                assert!(n > 0, "round {round}: connection closed after {:?}", String::from_utf8_lossy(&reply));
                reply.extend_from_slice(&buf[..n]);
            }
        };
        tokio::time::timeout(Duration::from_secs(10), read_all).await.expect("a whole chunked reply");
        let text = String::from_utf8_lossy(&reply).to_lowercase();
        assert!(text.starts_with("http/1.1 200 ok\r\n"), "round {round}: {text}");
        assert!(text.contains("\r\ntransfer-encoding: chunked\r\n"), "round {round}: {text}");
        assert!(!text.contains("\r\nconnection: close\r\n"), "round {round}: {text}");
        assert!(text.contains("old server\n"), "round {round}: {text}");
    }
}

/// CGI-style backends read `X_Forwarded_For` as `X-Forwarded-For`: a field named with `_`
/// never reaches the backend by default, and kept (`underscores_in_headers`), never one
/// that stands for a field the proxy sets or frames by.
#[tokio::test]
async fn fields_named_with_underscores_are_dropped_and_kept_never_shadow_ours() {
    let request = b"POST /a HTTP/1.1\r\nHost: a\r\nX_Forwarded_For: 6.6.6.6\r\nContent_Length: 99\r\nTransfer_Encoding: chunked\r\nX_Api_Key: k\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi";
    for (server, kept) in [("", &[][..]), ("server: { underscores_in_headers: true }\n", &["X_Api_Key: k"][..])] {
        let backend = StrictBackend::start(|_| b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec()).await;
        let sg = Sluicegate::start(&format!(
            "listen: 127.0.0.1:0\n{server}upstreams:\n  b: {{ servers: [\"{}\"] }}\nroutes:\n  - upstream: b\n",
            backend.addr
        ));
        let answer = raw_exchange(sg.addr, request).await;
        assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("ok"), "{answer}");
        let seen = backend.seen();
        assert_eq!(seen.len(), 1, "{seen:?}");
        let sent = String::from_utf8_lossy(&seen[0].bytes).into_owned();
        let underscored: Vec<&str> = sent.lines().filter(|l| l.split(':').next().unwrap().contains('_')).collect();
        assert_eq!(underscored, kept, "{server:?}: {sent}");
        assert!(sent.contains("x-forwarded-for: 127.0.0.1\r\n") && sent.ends_with("\r\n\r\nhi"), "{sent}");
    }
}
