//! Connections that say nothing, read nothing or come in floods: the watchdog's
//! timeouts and `server.max_connections`, against the real binary.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::*;

fn proxy(server: &str) -> Sluicegate {
    Sluicegate::start(&format!(
        "listen: 127.0.0.1:0\nserver: {{ {server} }}\nroutes:\n  - respond: {{ status: 200, body: ok }}\n"
    ))
}

/// Reads until the server closes the connection (at most `limit`); the bytes read, or
/// `None` if it was still open then.
async fn until_closed(stream: &mut TcpStream, limit: Duration) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    match tokio::time::timeout(limit, stream.read_to_end(&mut out)).await {
        Ok(_) => Some(out),
        Err(_) => None,
    }
}

/// Sends `GET /` on `stream` and reads its whole `200 ok` answer.
async fn answered_ok(stream: &mut TcpStream) {
    stream.write_all(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n").await.unwrap();
    let mut answer = Vec::new();
    let mut chunk = [0u8; 256];
    while !(answer.starts_with(b"HTTP/1.1 200") && answer.ends_with(b"\r\n\r\nok")) {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk)).await.unwrap().unwrap();
        assert!(n > 0, "closed before the answer: {:?}", String::from_utf8_lossy(&answer));
        answer.extend_from_slice(&chunk[..n]);
    }
}

#[tokio::test]
async fn connections_that_send_nothing_are_closed_after_the_header_read_timeout() {
    let sg = proxy("header_read_timeout: 300ms");
    let mut silent = Vec::new();
    for _ in 0..50 {
        silent.push(TcpStream::connect(sg.addr).await.unwrap());
    }
    for stream in &mut silent {
        let answer = until_closed(stream, Duration::from_secs(10)).await;
        assert_eq!(answer.as_deref(), Some(&b""[..]), "a silent connection was left open or answered");
    }
    assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
}

#[tokio::test]
async fn a_partial_http2_preface_is_closed_after_the_header_read_timeout() {
    let sg = proxy("header_read_timeout: 300ms");
    let mut stream = TcpStream::connect(sg.addr).await.unwrap();
    stream.write_all(b"PRI * HTTP").await.unwrap();
    assert!(until_closed(&mut stream, Duration::from_secs(10)).await.is_some(), "partial preface left open");
}

#[tokio::test]
async fn an_http1_request_head_begun_on_a_keep_alive_connection_gets_the_header_read_timeout() {
    let sg = proxy("header_read_timeout: 300ms, idle_timeout: 1h");
    let mut stream = TcpStream::connect(sg.addr).await.unwrap();
    answered_ok(&mut stream).await;
    stream.write_all(b"GET / HTTP/1.1\r\nHo").await.unwrap();
    let rest = until_closed(&mut stream, Duration::from_secs(10)).await;
    assert_eq!(rest.as_deref(), Some(&b""[..]), "a half-sent request head was left open");
}

#[tokio::test]
async fn an_idle_http1_keep_alive_connection_is_closed_after_the_idle_timeout_not_before() {
    let idle = Duration::from_millis(1500);
    let sg = proxy("header_read_timeout: 200ms, idle_timeout: 1500ms");
    let mut stream = TcpStream::connect(sg.addr).await.unwrap();
    let asked = Instant::now();
    answered_ok(&mut stream).await;
    let rest = until_closed(&mut stream, Duration::from_secs(15)).await;
    assert_eq!(rest.as_deref(), Some(&b""[..]), "idle keep-alive connection still open");
    // Closed by the idle timer, not by the (shorter) header timer: the idle time began
    // after the request was sent.
    assert!(asked.elapsed() >= idle - Duration::from_millis(50), "closed after {:?}", asked.elapsed());
}

#[tokio::test]
async fn an_idle_http2_connection_is_closed_after_the_idle_timeout_not_before() {
    let idle = Duration::from_millis(1500);
    let sg = proxy("header_read_timeout: 200ms, idle_timeout: 1500ms");
    let stream = TcpStream::connect(sg.addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.unwrap();
    let conn = tokio::spawn(conn);
    let req = Request::get("http://test.local/").body(Full::new(Bytes::new())).unwrap();
    let asked = Instant::now();
    let reply = read(sender.send_request(req).await.unwrap()).await;
    assert_eq!(reply.status, 200);
    let ended = tokio::time::timeout(Duration::from_secs(15), conn).await;
    assert!(ended.is_ok(), "idle HTTP/2 connection still open");
    assert!(asked.elapsed() >= idle - Duration::from_millis(50), "closed after {:?}", asked.elapsed());
}

#[tokio::test]
async fn at_max_connections_established_clients_are_served_and_new_ones_wait() {
    const CAP: usize = 8;
    // Long enough that no silent connection is cut while the test checks the cap.
    let sg = proxy(&format!("header_read_timeout: 4s, max_connections: {CAP}"));
    let accepted = |sg: &Sluicegate| sg.log().matches("connection accepted").count();

    // An established keep-alive client.
    let stream = TcpStream::connect(sg.addr).await.unwrap();
    let (mut established, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let ask = |sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>| {
        let req = Request::get("/").header("host", "h").body(Full::new(Bytes::new())).unwrap();
        sender.send_request(req)
    };
    assert_eq!(ask(&mut established).await.unwrap().status(), 200);

    // A flood of silent connections fills the other slots, and more wait beyond the cap.
    let mut silent = Vec::new();
    for _ in 0..CAP * 2 {
        silent.push(TcpStream::connect(sg.addr).await.unwrap());
    }
    sg.wait_for_log("CAP connections accepted", |_| accepted(&sg) >= CAP);
    let late = tokio::spawn(get(sg.addr, "/", &[]));

    for _ in 0..5 {
        let answer = tokio::time::timeout(Duration::from_secs(2), ask(&mut established)).await;
        assert_eq!(answer.expect("established client not answered at the cap").unwrap().status(), 200);
    }
    assert_eq!(accepted(&sg), CAP, "a connection beyond the cap was accepted");
    assert!(!late.is_finished(), "a connection beyond the cap was answered");

    // The silent ones are cut at the header timeout, and the waiting client gets its turn.
    let reply = tokio::time::timeout(Duration::from_secs(30), late).await.expect("waiting client never served");
    assert_eq!(reply.unwrap().status, 200);
}

fn proxy_to(backend: &Backend, server: &str) -> Sluicegate {
    Sluicegate::start(&format!(
        "listen: 127.0.0.1:0\nserver: {{ {server} }}\nupstreams:\n  b: {{ servers: [\"{}\"] }}\nroutes:\n  - upstream: b\n",
        backend.addr
    ))
}

// The backend runs on the test's runtime while the test waits for the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_nothing_is_closed_after_the_send_timeout() {
    const LEN: usize = 64 << 20;
    let backend = Backend::start().await;
    let sg = proxy_to(&backend, "send_timeout: 500ms");
    let mut stream = TcpStream::connect(sg.addr).await.unwrap();
    stream.write_all(format!("GET /large/{LEN} HTTP/1.1\r\nHost: h\r\n\r\n").as_bytes()).await.unwrap();
    // Read nothing until the proxy gives up on us.
    let log = sg.wait_for_log("the line \"send_timeout\"", |log| log.contains("send_timeout"));
    assert!(log.contains("send_timeout"), "no send timeout:\n{log}");
    let mut got = 0;
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk)).await {
            Ok(Ok(0) | Err(_)) => break,
            Ok(Ok(n)) => got += n,
            Err(_) => panic!("connection still open after the send timeout"),
        }
    }
    assert!(got < LEN, "the whole body arrived ({got} bytes)");
}

// HTTP/2: the client's flow-control window stays shut, so nothing blocks on the socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_client_that_reads_nothing_is_closed_after_the_send_timeout() {
    let backend = Backend::start().await;
    let sg = proxy_to(&backend, "send_timeout: 500ms");
    let stream = TcpStream::connect(sg.addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.unwrap();
    let conn = tokio::spawn(conn);
    let req = Request::get(format!("http://test.local/large/{}", 64 << 20)).body(Full::new(Bytes::new())).unwrap();
    let response = sender.send_request(req).await.unwrap();
    assert_eq!(response.status(), 200);
    // The body is held, never read.
    let ended = tokio::time::timeout(Duration::from_secs(15), conn).await;
    assert!(ended.is_ok(), "HTTP/2 connection still open after the send timeout");
    drop(response);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_nothing_holds_a_bounded_amount_of_memory() {
    const CLIENTS: usize = 40;
    // Longer than the socket buffers on the way can take, so the proxy's own fill up.
    const LEN: usize = 48 << 20;
    let backend = Backend::start().await;
    let sg = proxy_to(&backend, "send_timeout: 1h");
    assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
    let before = sg.rss();
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let mut stream = TcpStream::connect(sg.addr).await.unwrap();
        stream.write_all(format!("GET /large/{LEN} HTTP/1.1\r\nHost: h\r\n\r\n").as_bytes()).await.unwrap();
        clients.push(stream);
    }
    wait_until("every request at the backend", Duration::from_secs(20), async || backend.hits().len() > CLIENTS).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    // Ready when what the proxy holds stops growing.
    let mut held = sg.rss();
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = sg.rss();
        if now <= held + held / 100 || Instant::now() > deadline {
            held = now.max(held);
            break;
        }
        held = now;
    }
    let per_client = held.saturating_sub(before) / CLIENTS as u64;
    // About 155 KB measured; hyper's defaults held about 1.3 MB.
    assert!(per_client < 512 << 10, "{per_client} bytes held per client that reads nothing");
    drop(clients);
}

#[tokio::test]
async fn one_address_holds_at_most_max_connections_per_ip() {
    let sg = proxy("max_connections_per_ip: 2");
    let mut first = TcpStream::connect(sg.addr).await.unwrap();
    let mut second = TcpStream::connect(sg.addr).await.unwrap();
    // Both are served (and so counted) before the third arrives.
    answered_ok(&mut first).await;
    answered_ok(&mut second).await;
    let mut third = TcpStream::connect(sg.addr).await.unwrap();
    let _ = third.write_all(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n").await;
    let closed = until_closed(&mut third, Duration::from_secs(5)).await;
    assert_eq!(closed.as_deref(), Some(&b""[..]), "a third connection from the same address was served");
    // One closes: its place is free again.
    drop(first);
    // The proxy may not have seen the close yet.
    wait_until("the freed place given back", Duration::from_secs(10), async || {
        let mut again = TcpStream::connect(sg.addr).await.unwrap();
        again.write_all(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n").await.unwrap();
        let mut head = [0u8; 12];
        match tokio::time::timeout(Duration::from_secs(2), again.read_exact(&mut head)).await {
            Ok(Ok(_)) => head == *b"HTTP/1.1 200" || panic!("{}", String::from_utf8_lossy(&head)),
            _ => false,
        }
    })
    .await;
    answered_ok(&mut second).await;
}

/// A slow body costs on HTTP/2 what it costs on HTTP/1.1: a stream whose body stops
/// arriving is answered `408` after `body_read_timeout`, the connection's other streams
/// are served meanwhile, and once none is left the idle timer closes the connection, the
/// client's bodies still open.
#[tokio::test]
async fn http2_streams_whose_bodies_stop_arriving_are_timed_out_and_the_connection_idles_out() {
    const STREAMS: usize = 40;
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&format!(
        "listen: 127.0.0.1:0
server: {{ body_read_timeout: 500ms, header_read_timeout: 500ms, idle_timeout: 1s }}
upstreams:
  b: {{ servers: [\"{}\"] }}
routes:
  - upstream: b
",
        backend.addr
    ));
    let stream = TcpStream::connect(sg.addr).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.unwrap();
    let conn = tokio::spawn(conn);
    let started = Instant::now();
    // HEADERS without END_STREAM, then nothing: the body senders are kept, never used.
    let mut senders = Vec::new();
    let mut stalled = Vec::new();
    for _ in 0..STREAMS {
        let (tx, body) = http_body_util::channel::Channel::<Bytes, hyper::Error>::new(1);
        senders.push(tx);
        let req = Request::post("http://test.local/upload").body(body).unwrap();
        let mut sender = sender.clone();
        stalled.push(tokio::spawn(async move { sender.send_request(req).await.map(|r| r.status().as_u16()) }));
    }
    // Another stream of the connection is served meanwhile.
    let mut other = sender.clone();
    let req = Request::get("http://test.local/x")
        .body(http_body_util::channel::Channel::<Bytes, hyper::Error>::new(1).1)
        .unwrap();
    let reply =
        tokio::time::timeout(Duration::from_secs(5), async { read(other.send_request(req).await.unwrap()).await })
            .await
            .expect("another stream was not served");
    assert_eq!(reply.status, 200);
    for stream in stalled {
        let status = tokio::time::timeout(Duration::from_secs(10), stream).await.expect("a stalled stream stayed open");
        assert_eq!(status.unwrap().unwrap(), 408);
    }
    assert!(started.elapsed() >= Duration::from_millis(500), "{:?}", started.elapsed());
    // Each stream was reset once answered (RFC 9113 §8.1): the client stops sending its
    // body, as an HTTP/1.1 client whose connection closes does.
    for tx in &mut senders {
        let refused = tokio::time::timeout(Duration::from_secs(5), async {
            while tx.send_data(Bytes::from_static(b"late")).await.is_ok() {}
        });
        assert!(refused.await.is_ok(), "a stream answered 408 still takes its body");
    }
    // Nothing in progress: closed after the idle timeout, the bodies still held open.
    let ended = tokio::time::timeout(Duration::from_secs(10), conn).await;
    assert!(ended.is_ok(), "the idle connection stayed open");
    drop(senders);
}

/// Whether the connection `local` (the proxy's side) ↔ `remote` is no longer established:
/// the kernel has the peer's close (CLOSE_WAIT, or closed since by the proxy too;
/// `/proc/net/tcp`, addresses in its hex notation).
fn close_seen(local: std::net::SocketAddr, remote: std::net::SocketAddr) -> bool {
    let hex = |addr: std::net::SocketAddr| match addr {
        std::net::SocketAddr::V4(a) => format!("{:08X}:{:04X}", u32::from_le_bytes(a.ip().octets()), a.port()),
        std::net::SocketAddr::V6(_) => String::new(),
    };
    let (local, remote) = (hex(local), hex(remote));
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    !table.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.len() > 3 && fields[1] == local && fields[2] == remote && fields[3] == "01"
    })
}

/// A client that sends a `POST` (or a `GET`) and a pipelined `DELETE`, then goes while
/// the first is at the backend, gets nothing more done on its behalf: the `DELETE` never
/// reaches the backend. (The first requests' answers are held until both clients have
/// gone: answered before, the `DELETE` would rightly be served. Released together at
/// the end: a permit added for the first could be left unused, its request dropped at
/// the backend as the proxy gave it up, and would answer the second at once.)
#[tokio::test]
async fn a_pipelined_request_of_a_client_that_has_gone_is_never_sent() {
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&format!(
        "listen: 127.0.0.1:0\nupstreams:\n  b: {{ servers: [\"{}\"] }}\nroutes:\n  - upstream: b\n",
        backend.addr
    ));
    for (n, request) in [
        &b"POST /held HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloDELETE /x HTTP/1.1\r\nHost: a\r\n\r\n"[..],
        b"GET /held HTTP/1.1\r\nHost: a\r\n\r\nDELETE /x HTTP/1.1\r\nHost: a\r\n\r\n",
    ]
    .into_iter()
    .enumerate()
    {
        let mut stream = TcpStream::connect(sg.addr).await.unwrap();
        stream.write_all(request).await.unwrap();
        wait_until("the first request at the backend", Duration::from_secs(5), async || backend.hits().len() > n).await;
        let client = stream.local_addr().unwrap();
        drop(stream);
        // Gone as far as the proxy's kernel knows: on a busy machine the close reaches
        // the proxy's socket after `close` returns, and a client not yet seen gone is
        // rightly served its pipelined request.
        wait_until("the close at the proxy's socket", Duration::from_secs(5), async || close_seen(sg.addr, client))
            .await;
    }
    backend.gate.add_permits(2);
    // Both first requests reached the backend; give a DELETE every chance to follow them.
    let answer = raw_exchange(sg.addr, b"GET /last HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").await;
    assert!(answer.ends_with("ok"), "{answer}");
    let paths: Vec<String> = backend.hits().into_iter().map(|h| h.path_and_query).collect();
    assert_eq!(paths, ["/held", "/held", "/last"]);
}
