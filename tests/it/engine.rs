//! The HTTP/1 engine's edges, each case byte for byte: what the client gets and what a
//! strict backend (`StrictBackend`: it frames by the RFC and records every byte) receives.
//! Interim responses, pooled upstream connections after bodiless answers, upstream bodies
//! cut short, requests answered without their body read, HTTP/1.0 keep-alive, upgrades
//! refused, targets and fields refused.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::*;

/// A proxy in front of the backend at `addr`, everything forwarded; `server` lines (each
/// `key: value`) added under `server:`.
fn proxy_to(addr: SocketAddr, server: &str) -> Sluicegate {
    let server = if server.is_empty() { String::new() } else { format!("server: {{ {server} }}\n") };
    Sluicegate::start(&format!(
        "listen: 127.0.0.1:0\n{server}upstreams:\n  b: {{ servers: [\"{addr}\"], retries: 0 }}\nroutes:\n  - upstream: b\n"
    ))
}

/// The status lines of the responses in `answer`, interim ones included, in order (a
/// status line may follow the body before it on the same text line).
fn status_lines(answer: &str) -> Vec<&str> {
    answer.match_indices("HTTP/1.1 ").map(|(at, _)| answer[at..].split("\r\n").next().unwrap()).collect()
}

const EARLY_HINTS_AND_OK: &[u8] =
    b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";

#[tokio::test]
async fn an_interim_response_and_the_final_one_in_one_write_are_both_read_at_once() {
    for answer in [EARLY_HINTS_AND_OK, b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"] {
        let backend = StrictBackend::start(move |_| answer.to_vec()).await;
        // The upstream's timeout is the default 30 s: the answer must not wait for it.
        let sg = proxy_to(backend.addr, "");
        let started = Instant::now();
        let reply = raw_exchange(sg.addr, b"GET /a HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").await;
        assert!(reply.ends_with("\r\n\r\nok"), "{reply}");
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        // The server is healthy: the next request goes to it too.
        let reply = raw_exchange(sg.addr, b"GET /b HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").await;
        assert!(reply.ends_with("\r\n\r\nok"), "{reply}");
        assert_eq!(backend.lines(), ["GET /a", "GET /b"]);
    }
}

#[tokio::test]
async fn interim_responses_reach_http11_clients_never_http10_ones() {
    let backend = StrictBackend::start(|_| EARLY_HINTS_AND_OK.to_vec()).await;
    let sg = proxy_to(backend.addr, "");
    let reply = raw_exchange(sg.addr, b"GET /a HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").await;
    assert_eq!(status_lines(&reply), ["HTTP/1.1 103 Early Hints", "HTTP/1.1 200 OK"], "{reply}");
    assert!(reply.contains("\r\nLink: </s.css>; rel=preload\r\n\r\nHTTP/1.1 200"), "{reply}");
    // With a body read as it comes (the client's side of the exchange writes it).
    let reply =
        raw_exchange(sg.addr, b"POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
            .await;
    assert_eq!(status_lines(&reply), ["HTTP/1.1 103 Early Hints", "HTTP/1.1 200 OK"], "{reply}");
    // HTTP/1.0 has no interim responses.
    let reply = raw_exchange(sg.addr, b"GET /a HTTP/1.0\r\nHost: a\r\n\r\n").await;
    assert_eq!(status_lines(&reply), ["HTTP/1.1 200 OK"], "{reply}");
    // HTTP/2: hyper's server cannot send one; the final response comes.
    assert_eq!(get_h2(sg.addr, "/a").await.text(), "ok");
}

#[tokio::test]
async fn a_client_that_asked_for_100_continue_gets_ours_not_the_upstreams_as_well() {
    let backend = StrictBackend::start(|_| {
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
            .to_vec()
    })
    .await;
    let sg = proxy_to(backend.addr, "");
    let rest = post_after_100_continue(sg.addr, "/a").await;
    assert_eq!(status_lines(&rest), ["HTTP/1.1 103 Early Hints", "HTTP/1.1 200 OK"], "{rest}");
}

#[tokio::test]
async fn a_pooled_upstream_connection_stays_in_step_after_head_and_304_answers() {
    // Each bodiless answer declares a length its body does not have: a proxy that read
    // a body after it would take the next response's head for it.
    let backend = StrictBackend::start(|line| match line {
        "HEAD /h" => b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n".to_vec(),
        "GET /nm" => b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\nETag: \"x\"\r\n\r\n".to_vec(),
        _ => b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext".to_vec(),
    })
    .await;
    let sg = proxy_to(backend.addr, "");
    let reply = raw_exchange(sg.addr, b"HEAD /h HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").await;
    assert!(reply.starts_with("HTTP/1.1 200") && reply.ends_with("\r\n\r\n"), "{reply}");
    assert!(reply.contains("Content-Length: 10\r\n"), "HEAD keeps the length GET would have: {reply}");
    assert_eq!(get(sg.addr, "/after-head", &[]).await.text(), "next");
    let reply = raw_exchange(sg.addr, b"GET /nm HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").await;
    assert!(reply.starts_with("HTTP/1.1 304") && reply.ends_with("\r\n\r\n"), "{reply}");
    assert_eq!(get(sg.addr, "/after-304", &[]).await.text(), "next");
    let seen = backend.seen();
    let lines: Vec<&str> = seen.iter().map(|s| s.line.as_str()).collect();
    assert_eq!(lines, ["HEAD /h", "GET /after-head", "GET /nm", "GET /after-304"]);
    assert!(seen.iter().all(|s| s.conn == 0), "one pooled connection throughout: {seen:?}");
}

#[tokio::test]
async fn an_upstream_body_cut_short_reaches_the_client_cut_short() {
    for (answer, whole) in [
        (&b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"[..], "content-length: 10\r\n"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n", "transfer-encoding: chunked\r\n"),
    ] {
        let (addr, _) = raw_backend(answer).await;
        let sg = proxy_to(addr, "");
        let reply = raw_exchange(sg.addr, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert!(reply.starts_with("HTTP/1.1 200") && reply.contains(whole), "{reply}");
        let body = &reply[reply.find("\r\n\r\n").unwrap() + 4..];
        // Short of its length, or without the last chunk: never a complete response.
        assert!(body == "abc" || body == "3\r\nabc\r\n", "{body:?}");
    }
}

#[tokio::test]
async fn an_upstream_head_over_32_kib_is_a_502() {
    let big: &'static [u8] = Box::leak(
        format!("HTTP/1.1 200 OK\r\nX-Big: {}\r\nContent-Length: 2\r\n\r\nok", "x".repeat(33 * 1024))
            .into_bytes()
            .into_boxed_slice(),
    );
    let (addr, _) = raw_backend(big).await;
    let sg = proxy_to(addr, "");
    let reply = raw_exchange(sg.addr, b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").await;
    assert!(reply.starts_with("HTTP/1.1 502"), "{reply}");
}

/// A body that holds a whole request: read as a request, it would reach the backend.
const HIDDEN: &str = "GET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n";

#[tokio::test]
async fn a_request_answered_without_its_body_read_never_has_the_body_read_as_a_request() {
    let backend = StrictBackend::start(|_| b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec()).await;
    // A server that answers on the head, before the body (and reads nothing more).
    let (early, early_received) =
        raw_backend(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 2\r\nConnection: close\r\n\r\nno").await;
    let sg = Sluicegate::start(
        &format!(
            "listen: 127.0.0.1:0
upstreams:
  b: {{ servers: [\"{}\"], retries: 0 }}
limits:
  none: {{ key: ip, rate: 1r/m }}
routes:
  - {{ match: {{ path: /small }}, upstream: b, max_body_bytes: 4 }}
  - {{ match: {{ path: /limited }}, upstream: b, limits: [none] }}
  - {{ match: {{ path: /static }}, respond: {{ status: 200, body: here }} }}
  - {{ match: {{ path: /early }}, upstream: early }}
  - upstream: b
",
            backend.addr
        )
        .replace("upstreams:\n", &format!("upstreams:\n  early: {{ servers: [\"{early}\"], retries: 0 }}\n")),
    );
    // The limited route's one request a minute is taken first.
    assert_eq!(get(sg.addr, "/limited", &[]).await.status, 200);
    for (target, status) in [("/small", "413"), ("/limited", "429"), ("/static", "200"), ("/early", "403")] {
        // The body is declared but arrives only after the answer could be made: it is
        // read away or the connection closes; never is it the next request.
        let mut stream = TcpStream::connect(sg.addr).await.unwrap();
        let head = format!("POST {target} HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n", HIDDEN.len());
        stream.write_all(head.as_bytes()).await.unwrap();
        let mut first = [0u8; 12];
        tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut first)).await.unwrap().unwrap();
        assert_eq!(&first[9..], status.as_bytes(), "{target}: {}", String::from_utf8_lossy(&first));
        let _ = stream.write_all(HIDDEN.as_bytes()).await;
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest)).await;
        let rest = String::from_utf8_lossy(&rest);
        assert_eq!(rest.matches("HTTP/1.1 ").count(), 0, "{target}: a second answer: {rest}");
    }
    assert!(!backend.lines().iter().any(|l| l.contains("smuggled")), "{:?}", backend.lines());
    let early_received = String::from_utf8_lossy(&early_received.lock().unwrap()).into_owned();
    assert!(!early_received.contains("smuggled"), "{early_received}");
}

#[tokio::test]
async fn http10_keep_alive_is_kept_and_close_is_closed() {
    let backend = StrictBackend::start(|_| b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec()).await;
    let sg = proxy_to(backend.addr, "");
    let mut stream = TcpStream::connect(sg.addr).await.unwrap();
    for n in 0..2 {
        stream.write_all(b"GET /k HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").await.unwrap();
        let mut answer = vec![0u8; 4096];
        let len = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut answer)).await.unwrap().unwrap();
        let answer = String::from_utf8_lossy(&answer[..len]);
        assert!(answer.contains("connection: keep-alive\r\n") && answer.ends_with("ok"), "{n}: {answer}");
    }
    // Without keep-alive, HTTP/1.0 closes after the answer.
    let reply = raw_exchange(sg.addr, b"GET /c HTTP/1.0\r\n\r\n").await;
    assert!(reply.contains("connection: close\r\n") && reply.ends_with("ok"), "{reply}");
    assert_eq!(backend.lines(), ["GET /k", "GET /k", "GET /c"]);
}

#[tokio::test]
async fn an_upgrade_answered_without_101_is_an_ordinary_response() {
    let backend = StrictBackend::start(|_| b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec()).await;
    let sg = proxy_to(backend.addr, "");
    let reply = raw_exchange(
        sg.addr,
        b"GET /ws HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\nGET /next HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    // Not a tunnel: the bytes after the request are the next request, answered too.
    assert_eq!(status_lines(&reply), ["HTTP/1.1 200 OK", "HTTP/1.1 200 OK"], "{reply}");
    assert_eq!(backend.lines(), ["GET /ws", "GET /next"]);
}

#[tokio::test]
async fn a_refused_head_is_answered_whole_while_the_client_still_sends() {
    let backend = StrictBackend::start(|_| b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec()).await;
    let sg = proxy_to(backend.addr, "");
    let mut stream = TcpStream::connect(sg.addr).await.unwrap();
    // A refused head followed by a body the proxy never reads: the answer must not be
    // lost to a reset of the connection (lingering close).
    stream.write_all(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\n").await.unwrap();
    let body = vec![b'x'; 256 * 1024];
    let writer = tokio::spawn(async move {
        let _ = stream.write_all(&body).await;
        stream
    });
    let mut stream = writer.await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400") && answer.contains("connection: close"), "{answer}");
    assert!(backend.lines().is_empty(), "{:?}", backend.lines());
}
