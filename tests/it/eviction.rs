//! Bounded key tables under a flood of fresh keys: the keys a limit is holding back stay
//! held back, whatever else arrives.

use std::net::SocketAddr;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::common::*;

const MAX_KEYS: usize = 100;
/// Keep-alive connections the flood is spread over.
const CONNECTIONS: usize = 8;

/// Each limit on a route of its own, keyed by the client address from `X-Forwarded-For`.
fn config() -> String {
    format!(
        r#"
listen: 127.0.0.1:0
trusted_proxies: [127.0.0.1]
limits:
  bucket: {{ key: ip, rate: 1r/m, nodelay: true, max_keys: {MAX_KEYS} }}
  log: {{ key: ip, algorithm: sliding_log, limit: 1, window: 1m, max_keys: {MAX_KEYS} }}
  # Without the ban the key would pass again after 50 ms.
  banned: {{ key: ip, rate: 20r/s, nodelay: true, ban: 10m, max_keys: {MAX_KEYS} }}
routes:
  - {{ match: {{ path_prefix: /bucket }}, limits: [bucket], respond: {{ status: 200 }} }}
  - {{ match: {{ path_prefix: /log }}, limits: [log], respond: {{ status: 200 }} }}
  - {{ match: {{ path_prefix: /banned }}, limits: [banned], respond: {{ status: 200 }} }}
"#
    )
}

fn from(path: &str, ip: &str) -> Request<Full<Bytes>> {
    Request::get(path).header("host", "test.local").header("x-forwarded-for", ip).body(Full::default()).unwrap()
}

/// Sends one request from each of `clients` to `path`, over `CONNECTIONS` keep-alive
/// connections at once, and returns how many were refused.
async fn flood(addr: SocketAddr, path: &'static str, clients: Vec<String>) -> usize {
    let mut tasks = Vec::new();
    for share in clients.chunks(clients.len().div_ceil(CONNECTIONS)) {
        let share = share.to_vec();
        tasks.push(tokio::spawn(async move {
            let stream = TcpStream::connect(addr).await.unwrap();
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
            tokio::spawn(conn);
            let mut refused = 0;
            for ip in share {
                sender.ready().await.unwrap();
                let reply = read(sender.send_request(from(path, &ip)).await.unwrap()).await;
                refused += usize::from(reply.status != 200);
            }
            refused
        }));
    }
    let mut refused = 0;
    for task in tasks {
        refused += task.await.unwrap();
    }
    refused
}

/// 10 × `max_keys` fresh keys pass through each limit; the throttled leaky-bucket key,
/// the throttled sliding-log key and the banned key are refused before and after.
#[tokio::test]
async fn a_flood_of_fresh_keys_frees_neither_a_throttled_nor_a_banned_key() {
    let sg = Sluicegate::start(&config());
    let held = "192.0.2.1";
    for path in ["/bucket", "/log", "/banned"] {
        assert_eq!(request(sg.addr, from(path, held)).await.status, 200, "{path}");
        assert_eq!(request(sg.addr, from(path, held)).await.status, 429, "{path}");
    }
    for path in ["/bucket", "/log", "/banned"] {
        let fresh: Vec<String> = (0..10 * MAX_KEYS).map(|i| format!("10.0.{}.{}", i / 250, i % 250 + 1)).collect();
        assert_eq!(flood(sg.addr, path, fresh).await, 0, "{path}: a fresh key was refused");
    }
    for path in ["/bucket", "/log", "/banned"] {
        let reply = request(sg.addr, from(path, held)).await;
        assert_eq!(reply.status, 429, "{path}: the held key was freed by the flood");
        let retry: u64 = reply.header("retry-after").unwrap().parse().unwrap();
        // Each is held for most of its minute or of its 10-minute ban still.
        let at_least = if path == "/banned" { 500 } else { 30 };
        assert!(retry >= at_least, "{path}: retry-after {retry}");
    }
}
