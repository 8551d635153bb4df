use std::time::Duration;

use crate::common::*;

/// `timeout` is the upstream's: short where a test waits for a 504, long where requests
/// are held at the backend until the test releases them.
fn config(upstream: &str, timeout: &str, limit: &str) -> String {
    format!(
        "listen: 127.0.0.1:0\nupstreams:\n  b: {{ servers: [\"{upstream}\"], timeout: {timeout} }}\nlimits:\n  c: {{ key: ip, {limit} }}\nroutes:\n  - upstream: b\n    limits: [c]\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_slow_requests_beyond_the_limit_are_rejected_until_slots_free() {
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&config(&backend.addr.to_string(), "30s", "concurrency: 2, retry_after: 2s"));
    let addr = sg.addr;
    let slow: Vec<_> = (0..2).map(|_| tokio::spawn(async move { get(addr, "/held", &[]).await.status })).collect();
    // Ready when both are in flight at the backend.
    wait_until("two requests at the backend", Duration::from_secs(10), async || backend.hits().len() >= 2).await;
    let third = get(addr, "/", &[]).await;
    assert_eq!(third.status, 429);
    assert_eq!(third.header("retry-after"), Some("2"));
    assert_eq!(third.header("ratelimit-policy"), Some("\"c\";q=2"));
    backend.gate.add_permits(2);
    for s in slow {
        assert_eq!(s.await.unwrap(), 200);
    }
    // Both responses are complete: their slots are back.
    assert_eq!(get(addr, "/", &[]).await.status, 200);
    assert_eq!(get(addr, "/", &[]).await.status, 200);
}

#[tokio::test]
async fn slot_is_released_after_an_upstream_error() {
    let sg = Sluicegate::start(&config(&format!("127.0.0.1:{}", closed_port()), "1s", "concurrency: 1"));
    for _ in 0..3 {
        assert_eq!(get(sg.addr, "/", &[]).await.status, 502);
    }
}

#[tokio::test]
async fn slot_is_released_after_an_upstream_timeout() {
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&config(&backend.addr.to_string(), "1s", "concurrency: 1"));
    for _ in 0..2 {
        assert_eq!(get(sg.addr, "/sleep/3000", &[]).await.status, 504);
    }
    assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_is_released_when_the_client_goes_away() {
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&config(&backend.addr.to_string(), "1s", "concurrency: 1"));
    let addr = sg.addr;
    let abandoned = tokio::spawn(async move { get(addr, "/sleep/5000", &[]).await });
    wait_until("the request at the backend", Duration::from_secs(10), async || !backend.hits().is_empty()).await;
    assert_eq!(get(addr, "/", &[]).await.status, 429);
    abandoned.abort();
    // The proxy learns of the disconnect asynchronously.
    wait_until("the slot released after the client left", Duration::from_secs(10), async || {
        get(addr, "/", &[]).await.status == 200
    })
    .await;
}

#[tokio::test]
async fn dry_run_never_rejects_and_logs_what_it_would_have_done() {
    let sg = Conf::new()
        .limit("d", "key: ip, rate: 1r/m, dry_run: true")
        .route("name: r, limits: [d], respond: { status: 200 }")
        .start();
    for _ in 0..3 {
        assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
    }
    let count = |log: &str| log.lines().filter(|l| l.contains("dry run: request would be rejected")).count();
    let log = sg.wait_for_log("two rejection lines", |log| count(log) >= 2);
    let would = count(&log);
    assert_eq!(would, 2, "{log}");
}

/// Sends the four requests of a `1r/m, burst: 2, delay: 1` limit: two pass, the third is
/// queued for a minute (left waiting), the fourth is rejected.
async fn pass_delay_reject(sg: &Sluicegate) {
    for _ in 0..2 {
        assert_eq!(get(sg.addr, "/", &[("x-user", "alice")]).await.status, 200);
    }
    let addr = sg.addr;
    let queued = tokio::spawn(async move { get(addr, "/", &[("x-user", "alice")]).await });
    wait_until("the request queued", Duration::from_secs(10), async || sg.log().contains("request delayed")).await;
    assert_eq!(get(sg.addr, "/", &[("x-user", "alice")]).await.status, 429);
    queued.abort();
}

#[tokio::test]
async fn log_lines_name_route_limit_key_and_excess_at_the_configured_levels() {
    let yaml = "listen: 127.0.0.1:0\nredact_keys: REDACT\nlimits:\n  l: { key: \"header:x-user\", on_missing_key: skip, rate: 1r/m, burst: 2, delay: 1, log_level: warn }\nroutes:\n  - name: api\n    limits: [l]\n    respond: { status: 200 }\n";
    let plain = Sluicegate::start(&yaml.replace("REDACT", "false"));
    pass_delay_reject(&plain).await;
    let log = plain.wait_for_log("the line \"request rejected\"", |log| log.contains("request rejected"));
    let line = log.lines().find(|l| l.contains("request rejected")).unwrap_or_else(|| panic!("{log}"));
    for field in ["\"level\":\"WARN\"", "\"route\":\"api\"", "\"limit\":\"l\"", "\"key\":\"header:x-user=alice\""] {
        assert!(line.contains(field), "{field} missing in {line}");
    }
    // nginx's excess, read off the real clock: the bucket drains 1/60,000 of a request
    // per ms, so it is 3 (2 after a pass) less what drained since the first request.
    // Within 0.1: six seconds of a stalled machine.
    let excess = |line: &str| -> f64 {
        let json: serde_json::Value = serde_json::from_str(line).unwrap();
        json["fields"]["excess"].as_f64().or_else(|| json["excess"].as_f64()).unwrap_or_else(|| panic!("{line}"))
    };
    assert!((2.9..=3.0).contains(&excess(line)), "{line}");
    let delayed = log.lines().find(|l| l.contains("request delayed")).unwrap_or_else(|| panic!("{log}"));
    assert!(delayed.contains("\"level\":\"INFO\""), "{delayed}");
    assert!((1.9..=2.0).contains(&excess(delayed)), "{delayed}");
    // Each duration says what it is: the delay's wait, the refused client's time to retry.
    let field = |line: &str, name: &str| -> Option<u64> {
        let json: serde_json::Value = serde_json::from_str(line).unwrap();
        json["fields"][name].as_u64().or_else(|| json[name].as_u64())
    };
    assert!(field(delayed, "delay_ms").is_some_and(|ms| ms > 0), "{delayed}");
    assert!(field(line, "retry_after_ms").is_some_and(|ms| ms > 0), "{line}");
    assert_eq!(field(line, "ms"), None, "{line}");

    let redacted = Sluicegate::start(&yaml.replace("REDACT", "true"));
    pass_delay_reject(&redacted).await;
    let log = redacted.wait_for_log("the line \"request rejected\"", |log| log.contains("request rejected"));
    let line = log.lines().find(|l| l.contains("request rejected")).unwrap_or_else(|| panic!("{log}"));
    assert!(!line.contains("alice") && line.contains("\"key\":\"header:x-user=#"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_streams_of_one_connection_count_separately() {
    use bytes::Bytes;
    use http::Request;
    use http_body_util::Full;
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let backend = Backend::start().await;
    let sg = Sluicegate::start(&config(&backend.addr.to_string(), "30s", "concurrency: 2"));
    let stream = tokio::net::TcpStream::connect(sg.addr).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let send = |path: &'static str| {
        let mut sender = sender.clone();
        async move {
            let req = Request::get(format!("http://test.local{path}")).body(Full::new(Bytes::new())).unwrap();
            read(sender.send_request(req).await.unwrap()).await.status
        }
    };
    let slow: Vec<_> = (0..2).map(|_| tokio::spawn(send("/held"))).collect();
    wait_until("two requests at the backend", Duration::from_secs(10), async || backend.hits().len() >= 2).await;
    assert_eq!(send("/").await, 429, "a third stream on the same connection was not counted");
    backend.gate.add_permits(2);
    for s in slow {
        assert_eq!(s.await.unwrap(), 200);
    }
    assert_eq!(send("/").await, 200);
}
