//! HTTP/1.1 upgrades through the proxy: a WebSocket echo backend, messages both ways,
//! close from either side, limits held for the tunnel's life, idle and shutdown ends.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream, client_async};

use crate::common::*;

/// A WebSocket backend that echoes every message, and closes when it gets `close`.
async fn echo_backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else { return };
                while let Some(Ok(message)) = ws.next().await {
                    if message == Message::text("close") {
                        let _ = ws.close(None).await;
                    } else if message.is_text() || message.is_binary() {
                        let _ = ws.send(message).await;
                    }
                }
            });
        }
    });
    addr
}

fn config(backend: SocketAddr, extra: &str) -> String {
    format!(
        "listen: 127.0.0.1:0\nserver: {{ shutdown_grace: 1s }}\nupstreams:\n  ws: {{ servers: [\"{backend}\"], tunnel_idle_timeout: 2s }}\nlimits:\n  sockets: {{ key: ip, concurrency: 1, retry_after: 1s }}\nroutes:\n  - match: {{ path: /limited }}\n    upstream: ws\n    limits: [sockets]\n  - upstream: ws\n{extra}"
    )
}

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

async fn connect(addr: SocketAddr, path: &str) -> Result<Ws, WsError> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (ws, response) = client_async(format!("ws://test.local{path}"), MaybeTlsStream::Plain(stream)).await?;
    assert_eq!(response.status(), 101);
    Ok(ws)
}

/// The next message, within a bounded wait; `None` when the stream ended or failed.
async fn next(ws: &mut Ws) -> Option<Message> {
    tokio::time::timeout(Duration::from_secs(10), ws.next()).await.expect("no message in 10 s")?.ok()
}

#[tokio::test]
async fn websocket_messages_flow_both_ways_until_either_side_closes() {
    let sg = Sluicegate::start(&config(echo_backend().await, ""));
    let mut ws = connect(sg.addr, "/chat").await.unwrap();
    for text in ["hello", "again"] {
        ws.send(Message::text(text)).await.unwrap();
        assert_eq!(next(&mut ws).await, Some(Message::text(text)));
    }
    ws.send(Message::binary(vec![0u8, 1, 2, 255])).await.unwrap();
    assert_eq!(next(&mut ws).await, Some(Message::binary(vec![0u8, 1, 2, 255])));
    // The client closes: the close handshake passes through.
    ws.close(None).await.unwrap();
    assert!(matches!(next(&mut ws).await, Some(Message::Close(_)) | None));

    // The backend closes.
    let mut ws = connect(sg.addr, "/chat").await.unwrap();
    ws.send(Message::text("close")).await.unwrap();
    assert!(matches!(next(&mut ws).await, Some(Message::Close(_)) | None));
}

#[tokio::test]
async fn a_tunnel_is_not_paced_by_its_routes_response_body_rate() {
    let paced = "  - match: { path: /paced }\n    upstream: ws\n    response_body_rate: { bytes_per_second: 1k }\n";
    let sg = Sluicegate::start(&config(echo_backend().await, "").replacen(
        "  - upstream: ws\n",
        &format!("{paced}  - upstream: ws\n"),
        1,
    ));
    let mut ws = connect(sg.addr, "/paced").await.unwrap();
    let started = Instant::now();
    for _ in 0..4 {
        // 16 KiB each way: 32 s at the route's pace.
        ws.send(Message::binary(vec![7u8; 16 << 10])).await.unwrap();
        assert_eq!(next(&mut ws).await, Some(Message::binary(vec![7u8; 16 << 10])));
    }
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
}

#[tokio::test]
async fn a_tunnel_holds_its_concurrency_slot_until_it_closes() {
    let sg = Sluicegate::start(&config(echo_backend().await, ""));
    let mut first = connect(sg.addr, "/limited").await.unwrap();
    match connect(sg.addr, "/limited").await {
        Err(WsError::Http(response)) => assert_eq!(response.status(), 429),
        other => panic!("a second socket was let through: {:?}", other.map(|_| ())),
    }
    // Still open and working while the second one was refused.
    first.send(Message::text("ping")).await.unwrap();
    assert_eq!(next(&mut first).await, Some(Message::text("ping")));
    first.close(None).await.unwrap();
    while next(&mut first).await.is_some() {}
    // The slot comes back once both connections are closed.
    wait_until("the slot back", Duration::from_secs(10), async || match connect(sg.addr, "/limited").await {
        Ok(_) => true,
        Err(WsError::Http(r)) if r.status() == 429 => false,
        Err(e) => panic!("{e}"),
    })
    .await;
}

#[tokio::test]
async fn an_idle_tunnel_is_closed_after_tunnel_idle_timeout() {
    let sg = Sluicegate::start(&config(echo_backend().await, ""));
    let mut ws = connect(sg.addr, "/chat").await.unwrap();
    ws.send(Message::text("hi")).await.unwrap();
    assert_eq!(next(&mut ws).await, Some(Message::text("hi")));
    let quiet = Instant::now();
    assert_eq!(next(&mut ws).await, None, "the idle tunnel stayed open");
    let idle = quiet.elapsed();
    assert!(idle >= Duration::from_millis(1900) && idle < Duration::from_secs(9), "{idle:?}");
}

#[tokio::test]
async fn shutdown_closes_tunnels_after_the_grace_period() {
    let mut sg = Sluicegate::start(&config(echo_backend().await, ""));
    let mut ws = connect(sg.addr, "/chat").await.unwrap();
    let started = Instant::now();
    let exited = tokio::task::spawn_blocking(move || sg.terminate());
    // During the grace period the tunnel still carries messages.
    ws.send(Message::text("still here")).await.unwrap();
    assert_eq!(next(&mut ws).await, Some(Message::text("still here")));
    assert_eq!(next(&mut ws).await, None, "the tunnel outlived the proxy");
    assert!(exited.await.unwrap().success());
    assert!(started.elapsed() >= Duration::from_millis(900), "closed before the grace period: {:?}", started.elapsed());
}

#[tokio::test]
async fn upgrade_fields_are_dropped_from_a_request_that_is_not_an_upgrade() {
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&format!(
        "listen: 127.0.0.1:0\nupstreams:\n  app: {{ servers: [\"{}\"] }}\nroutes:\n  - upstream: app\n",
        backend.addr
    ));
    // `Upgrade` without `Connection: upgrade` is not an upgrade (RFC 9110 §7.8).
    let r = get(sg.addr, "/x", &[("upgrade", "websocket")]).await;
    assert_eq!(r.status, 200);
    assert!(!backend.hits()[0].headers.contains_key("upgrade"));
    assert!(!backend.hits()[0].headers.contains_key("connection"));
}
