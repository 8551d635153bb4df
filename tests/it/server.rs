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
    let yaml = format!(
        "listen: 127.0.0.1:0\nupstreams:\n  b: {{ servers: [\"{}\"] }}\nroutes:\n  - upstream: b\n",
        backend.addr
    );
    let sg = Sluicegate::start(&yaml);
    let request = format!("CONNECT {0} HTTP/1.1\r\nHost: {0}\r\nConnection: close\r\n\r\n", backend.addr);
    let answer = raw_exchange(sg.addr, request.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 405"), "{answer:?}");
    assert!(backend.hits().is_empty(), "CONNECT reached the upstream");
}

/// A body that breaks off is the client's fault: 400, and no warning about the upstream.
#[tokio::test]
async fn broken_request_bodies_get_400_not_502() {
    let backend = Backend::start().await;
    let yaml = format!(
        "listen: 127.0.0.1:0\nupstreams:\n  b: {{ servers: [\"{}\"] }}\nroutes:\n  - upstream: b\n",
        backend.addr
    );
    let sg = Sluicegate::start(&yaml);
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
    let yaml = format!(
        "listen: 127.0.0.1:0\nupstreams:\n  b: {{ servers: [\"{}\"] }}\nroutes:\n  - upstream: b\n",
        backend.addr
    );
    let sg = Sluicegate::start(&yaml);
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
    let mut stream = TcpStream::connect(sg.addr).await.unwrap();
    stream.write_all(b"GET / HTTP/1.1\r\nHost: h\r\n").await.unwrap();
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "connection still open after the header-read timeout");
}

#[tokio::test]
async fn sigterm_lets_in_flight_requests_finish_and_stops_accepting() {
    let backend = Backend::start().await;
    let yaml = format!(
        "listen: 127.0.0.1:0\nupstreams:\n  b: {{ servers: [\"{}\"] }}\nroutes:\n  - upstream: b\n",
        backend.addr
    );
    let mut sg = Sluicegate::start(&yaml);
    let addr = sg.addr;
    let slow = tokio::spawn(async move { get(addr, "/sleep/700", &[]).await });
    // Ready when the request is in flight at the backend.
    while backend.hits().is_empty() {
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
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
