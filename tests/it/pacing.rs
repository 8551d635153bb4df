//! A route's `response_body_rate` (nginx's `limit_rate`, `limit_rate_after`): the rate a
//! client receives, measured at the client, over HTTP/1 and HTTP/2; other streams of the
//! connection are not held back by a paced one.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

use crate::common::*;

const BODY: usize = 400 << 10;
const AFTER: usize = 100 << 10;
const RATE: usize = 200 << 10;

fn paced(backend: &Backend) -> Sluicegate {
    Sluicegate::start(&format!(
        "listen: 127.0.0.1:0\nupstreams:\n  b: {{ servers: [\"{}\"] }}\nroutes:\n  - match: {{ path_prefix: /large/ }}\n    upstream: b\n    response_body_rate: {{ bytes_per_second: 200k, after: 100k }}\n  - upstream: b\n",
        backend.addr
    ))
}

/// Reads `response`'s body: how long after its first byte the first `AFTER` bytes had
/// come, and all of them.
async fn timed(response: http::Response<hyper::body::Incoming>) -> (Duration, Duration, usize) {
    let mut body = response.into_body();
    let (mut got, mut first, mut after) = (0, None, None);
    while let Some(frame) = body.frame().await {
        got += frame.unwrap().data_ref().map_or(0, Bytes::len);
        let first = *first.get_or_insert_with(Instant::now);
        if got >= AFTER && after.is_none() {
            after = Some(first.elapsed());
        }
    }
    (after.unwrap_or_default(), first.map_or_else(Duration::default, |f| f.elapsed()), got)
}

/// The paced part's time: (BODY - AFTER) / RATE.
fn expected() -> Duration {
    Duration::from_secs_f64((BODY - AFTER) as f64 / RATE as f64)
}

fn assert_paced(after: Duration, total: Duration, got: usize) {
    assert_eq!(got, BODY);
    assert!(after < Duration::from_millis(300), "the first 100 KiB took {after:?}");
    // Never faster than the rate allows; slower only by the scheduler's lateness.
    let rate = (BODY - AFTER) as f64 / total.as_secs_f64();
    assert!(total >= expected().mul_f64(0.97), "{BODY} bytes in {total:?}: {rate:.0} B/s, faster than 200 KiB/s");
    assert!(total <= expected().mul_f64(1.05), "{BODY} bytes in {total:?}: {rate:.0} B/s, not 200 KiB/s");
}

#[tokio::test]
async fn an_http1_response_body_comes_at_the_routes_rate_after_its_first_bytes() {
    let backend = Backend::start().await;
    let sg = paced(&backend);
    let req = Request::get(format!("/large/{BODY}")).header("host", "test.local");
    let response = send(sg.addr, req.body(Full::new(Bytes::new())).unwrap()).await;
    assert_eq!(response.status(), 200);
    let (after, total, got) = timed(response).await;
    assert_paced(after, total, got);
    // Another route of the same proxy is not paced.
    let started = Instant::now();
    let reply = get(sg.addr, "/status/200", &[]).await;
    assert_eq!(reply.status, 200);
    assert!(started.elapsed() < Duration::from_millis(500));
}

#[tokio::test]
async fn an_http2_stream_is_paced_and_the_connections_other_streams_are_not() {
    let backend = Backend::start().await;
    let sg = paced(&backend);
    let stream = TcpStream::connect(sg.addr).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let mut large = sender.clone();
    let paced = tokio::spawn(async move {
        let req = Request::get(format!("http://test.local/large/{BODY}")).body(Full::new(Bytes::new())).unwrap();
        let response = large.send_request(req).await.unwrap();
        timed(response).await
    });
    // While the paced stream goes on (its request at the backend, its answer paced for
    // seconds), small requests on the same connection are answered at once.
    wait_until("the paced request at the backend", Duration::from_secs(10), async || !backend.hits().is_empty()).await;
    for _ in 0..3 {
        let asked = Instant::now();
        let mut small = sender.clone();
        let req = Request::get("http://test.local/status/200").body(Full::new(Bytes::new())).unwrap();
        let reply = read(small.send_request(req).await.unwrap()).await;
        assert_eq!(reply.status, 200);
        assert!(asked.elapsed() < Duration::from_millis(300), "a small stream waited {:?}", asked.elapsed());
        assert!(!paced.is_finished(), "the paced stream ended before the small ones were asked");
    }
    let (after, total, got) = paced.await.unwrap();
    assert_paced(after, total, got);
}

#[tokio::test]
async fn a_paced_response_holds_its_concurrency_slot_until_its_last_bytes() {
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&format!(
        "listen: 127.0.0.1:0\nupstreams:\n  b: {{ servers: [\"{}\"] }}\nlimits:\n  one: {{ key: ip, concurrency: 1 }}\nroutes:\n  - upstream: b\n    limits: [one]\n    response_body_rate: {{ bytes_per_second: 40k }}\n",
        backend.addr
    ));
    // 60 KiB at 40 KiB/s: one read from the upstream, sent over 1.5 s.
    let req = Request::get("/large/61440").header("host", "test.local");
    let response = send(sg.addr, req.body(Full::new(Bytes::new())).unwrap()).await;
    assert_eq!(response.status(), 200);
    let download = tokio::spawn(timed(response));
    // A third of the way into the body (placement, not synchronisation: the upstream's
    // whole body has been read by then, the client's not sent until 1.3 s).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(get(sg.addr, "/status/200", &[]).await.status, 429, "the slot was given back before the body was sent");
    let (_, total, got) = download.await.unwrap();
    assert_eq!(got, 61440);
    // Timed from the first body byte, one step (1/8 s) in.
    assert!(total >= Duration::from_millis(1300), "{total:?}");
    assert_eq!(get(sg.addr, "/status/200", &[]).await.status, 200);
}
