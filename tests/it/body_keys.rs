//! `json:` key parts: limits keyed on a field of a JSON request body, read from its
//! first `server.body_peek` bytes before the admission (HTTP/1 with a length or chunked,
//! HTTP/2), the body then forwarded unchanged; a field read twice refused, in the peek or
//! after it; a body that is not JSON, or lacks the field, meets `on_missing_key`.

use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{Full, channel::Channel};
use serde_json::Value;

use crate::common::*;

/// Two requests a minute per model; a body peeked 1 KiB deep; a body that stalls for
/// 300 ms is refused.
const CONFIG: &str = r#"
listen: 127.0.0.1:0
admin: { listen: 127.0.0.1:0 }
server: { body_peek: 1k, body_read_timeout: 300ms }
upstreams:
  app: { servers: ["BACKEND"] }
limits:
  per_model:
    rate: 2r/m
    burst: 1
    nodelay: true
    key: "json:model"
    on_missing_key: refuse
  per_tool:
    rate: 100r/m
    burst: 10
    nodelay: true
    key: "json:params.name"
    on_missing_key: shared
routes:
  - match: { path: /small }
    upstream: app
    max_body_bytes: 100
    limits: [per_model]
  - match: { path: /echo, methods: [PUT] }
    upstream: app
    limits: [per_tool]
  - upstream: app
    limits: [per_model]
"#;

fn post(path: &str, body: impl Into<Bytes>) -> Request<Full<Bytes>> {
    Request::post(path)
        .header("host", "test.local")
        .header("content-type", "application/json")
        .body(Full::new(body.into()))
        .unwrap()
}

#[tokio::test]
async fn a_json_field_keys_the_limit_and_the_body_reaches_the_upstream_unchanged() {
    let backend = Backend::start().await;
    let sg = Sluicegate::in_front_of(&backend, CONFIG);
    let body = |model: &str| {
        format!("{{\"model\": \"{model}\", \"messages\": [{{\"role\": \"user\", \"content\": \"hi \\u00e9\"}}]}}")
    };
    for _ in 0..2 {
        let r = request(sg.addr, post("/echo", body("gpt-4o"))).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.body, body("gpt-4o").as_bytes(), "the upstream got another body");
    }
    let refused = request(sg.addr, post("/echo", body("gpt-4o"))).await;
    assert_eq!(refused.status, 429, "a third request of one model in a minute");
    // Another model is another key; escapes decoded: `gpt\u002d4o` is `gpt-4o`.
    assert_eq!(request(sg.addr, post("/echo", body("o3"))).await.status, 200);
    let escaped = request(sg.addr, post("/echo", r#"{"model":"gpt\u002d4o"}"#)).await;
    assert_eq!(escaped.status, 429, "the same model spelt with an escape is the same key");
    // Without the field, or not JSON at all: the limit's on_missing_key (refuse).
    for missing in [&b"{\"messages\": []}"[..], b"model=gpt-4o", b"", b"{\"model\": \"x\""] {
        let r = request(sg.addr, post("/echo", Bytes::copy_from_slice(missing))).await;
        assert_eq!(r.status, 400, "{:?}", String::from_utf8_lossy(missing));
        assert!(r.text().contains("per_model"), "{}", r.text());
    }
    let metrics = Metrics::of(&sg).await;
    assert_eq!(metrics.value("sluicegate_limit_missing_key_total{limit=\"per_model\"}"), 4.0);
}

#[tokio::test]
async fn a_chunked_body_split_anywhere_is_keyed_alike_and_forwarded_unchanged() {
    let backend = Backend::start().await;
    let sg = Sluicegate::in_front_of(&backend, CONFIG);
    let body = br#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"search","arguments":{"q":"x"}}}"#;
    for split in [1, 20, 45, 50, body.len() - 1] {
        let (mut tx, stream) = Channel::<Bytes, std::convert::Infallible>::new(4);
        let req = Request::put("/echo").header("host", "test.local").body(stream).unwrap();
        let answer = tokio::spawn(async move { request(sg.addr, req).await });
        tx.send_data(Bytes::copy_from_slice(&body[..split])).await.unwrap();
        tx.send_data(Bytes::copy_from_slice(&body[split..])).await.unwrap();
        drop(tx);
        let r = answer.await.unwrap();
        assert_eq!((r.status, &r.body[..]), (200, &body[..]), "split at {split}");
    }
    // The limit's key shows in /limits as every surface names it.
    let limits = get(sg.admin_addr(), "/limits/per_tool?json:params.name=search", &[]).await;
    assert_eq!(limits.status, 200, "{}", limits.text());
    let state: Value = serde_json::from_slice(&limits.body).unwrap();
    assert!(state.to_string().contains("json:params.name=search"), "{state}");
}

#[tokio::test]
async fn a_large_body_is_keyed_from_its_first_bytes_and_streamed_whole() {
    let backend = Backend::start().await;
    let sg = Sluicegate::in_front_of(&backend, CONFIG);
    let mut body = br#"{"model":"big","input":""#.to_vec();
    body.resize(10 << 20, b'x');
    body.extend_from_slice(b"\"}");
    let len = body.len();
    let r = request(sg.addr, post("/upload", body)).await;
    assert_eq!((r.status, r.text()), (200, len.to_string()));
    let r = request(sg.addr, post("/upload", br#"{"model":"big"}"#.to_vec())).await;
    assert_eq!(r.status, 200);
    assert_eq!(request(sg.addr, post("/upload", br#"{"model":"big"}"#.to_vec())).await.status, 429);
}

#[tokio::test]
async fn a_field_sent_twice_is_refused_in_the_peek_and_cut_after_it() {
    let backend = Backend::start().await;
    let sg = Sluicegate::in_front_of(&backend, CONFIG);
    let within = request(sg.addr, post("/echo", r#"{"model":"cheap","model":"dear"}"#)).await;
    assert_eq!(within.status, 400);
    assert!(within.text().contains("per_model") && within.text().contains("JSON body"), "{}", within.text());
    assert!(backend.hits().is_empty(), "a body repeating its key reached the upstream");
    // Past the peek: the first one keys the request; the second cuts the body on its way,
    // so the upstream never has the whole of it.
    let padded = format!(r#"{{"model":"cheap","pad":"{}","mod\u0065l":"dear"}}"#, "x".repeat(4096));
    let after = request(sg.addr, post("/upload", padded.clone())).await;
    assert_eq!(after.status, 400, "{}", after.text());
    // The same body without the repeat goes through.
    let single = padded.replace(r#","mod\u0065l":"dear""#, "");
    assert_eq!(request(sg.addr, post("/upload", single.clone())).await.text(), single.len().to_string());
}

#[tokio::test]
async fn a_body_that_stalls_before_its_fields_are_read_is_408() {
    let backend = Backend::start().await;
    let sg = Sluicegate::in_front_of(&backend, CONFIG);
    let (mut tx, stream) = Channel::<Bytes, std::convert::Infallible>::new(4);
    let req = Request::post("/echo").header("host", "test.local").body(stream).unwrap();
    let addr = sg.addr;
    let answer = tokio::spawn(async move { request(addr, req).await });
    tx.send_data(Bytes::from_static(b"{\"mo")).await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(10), answer).await.expect("no answer").unwrap();
    assert_eq!(r.status, 408);
    assert!(backend.hits().is_empty(), "a stalled body reached the upstream");
    drop(tx);
    let metrics = Metrics::of(&sg).await;
    assert!(metrics.0.contains("outcome=\"body_timeout\""), "{}", metrics.0);
}

#[tokio::test]
async fn http2_requests_are_keyed_by_their_body_too() {
    let backend = Backend::start().await;
    let sg = Sluicegate::in_front_of(&backend, CONFIG);
    let h2 = |body: &'static str| {
        Request::post("http://test.local/echo")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap()
    };
    for _ in 0..2 {
        let r = request_h2(sg.addr, h2(r#"{"model":"h2"}"#)).await;
        assert_eq!((r.status, r.text().as_str()), (200, r#"{"model":"h2"}"#));
    }
    assert_eq!(request_h2(sg.addr, h2(r#"{"model":"h2"}"#)).await.status, 429);
    assert_eq!(request_h2(sg.addr, h2(r#"{"other":1}"#)).await.status, 400);
    // A gRPC call's body is protobuf: its json: key is missing, refused as a gRPC client
    // expects (INVALID_ARGUMENT, trailers-only), never forwarded.
    let hits = backend.hits().len();
    let grpc = Request::post("http://test.local/echo")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::from_static(b"\0\0\0\0\x02\x08\x01")))
        .unwrap();
    let r = request_h2(sg.addr, grpc).await;
    assert_eq!((r.status, r.header("grpc-status")), (200, Some("3")), "{:?}", r.headers);
    assert_eq!(backend.hits().len(), hits, "a call without the key reached the upstream");
}

#[test]
fn explain_takes_the_body_with_dash_d() {
    let (_dir, path) = config_file(&CONFIG.replace("BACKEND", "127.0.0.1:9"));
    let run = |args: &[&str]| {
        let output = binary().arg("explain").arg("-c").arg(&path).arg("--json").args(args).output().unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_slice::<Value>(&output.stdout).unwrap()
    };
    let explained = run(&["-d", r#"{"model":"gpt-4o"}"#, "--after", "2", "http://test.local/v1/chat"]);
    assert_eq!(explained["answer"]["status"], 429, "{explained}");
    assert!(explained["limits"][0]["key"].as_str().unwrap().contains("json:model=gpt-4o"), "{explained}");
    let without = run(&["-X", "POST", "http://test.local/v1/chat"]);
    assert_eq!(without["answer"]["status"], 400, "{without}");
    let notes = without["notes"].to_string();
    assert!(notes.contains("json:model") && notes.contains("-d"), "{notes}");
}

#[test]
fn check_wants_a_json_key_to_say_what_a_body_without_it_meets() {
    let yaml = CONFIG.replace("BACKEND", "127.0.0.1:9").replace("    on_missing_key: refuse\n", "");
    let (code, out) = check_bounded(&yaml);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("limits.per_model") && out.contains("on_missing_key"), "{out}");
    let too_deep = CONFIG.replace("BACKEND", "127.0.0.1:9").replace("body_peek: 1k", "body_peek: 17m");
    let (code, out) = check_bounded(&too_deep);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("server.body_peek"), "{out}");
}

#[tokio::test]
async fn a_chunked_body_over_the_routes_limit_while_its_fields_are_read_is_413_and_never_forwarded() {
    let backend = Backend::start().await;
    let sg = Sluicegate::in_front_of(&backend, CONFIG);
    let (mut tx, stream) = Channel::<Bytes, std::convert::Infallible>::new(4);
    let req = Request::post("/small").header("host", "test.local").body(stream).unwrap();
    let addr = sg.addr;
    let answer = tokio::spawn(async move { request(addr, req).await });
    tx.send_data(Bytes::from(format!(r#"{{"model":"m","pad":"{}"#, "x".repeat(60)))).await.unwrap();
    tx.send_data(Bytes::from("x".repeat(60))).await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(10), answer).await.expect("no answer").unwrap();
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(backend.hits().is_empty(), "a body over the route's limit reached the upstream");
    drop(tx);
}

/// Routes by a field of the body: `dear` takes gpt-4o and every o1 model (a prefix),
/// `rest` every other request of the path; each with its own limit per user.
const ROUTED: &str = r#"
listen: 127.0.0.1:0
admin: { listen: 127.0.0.1:0 }
server: { body_peek: 1k }
upstreams:
  app: { servers: ["BACKEND"] }
limits:
  dear: { key: "header:x-user", on_missing_key: refuse, rate: 1r/m }
  cheap: { key: "header:x-user", on_missing_key: refuse, rate: 1r/m, burst: 2, nodelay: true }
routes:
  - name: dear
    match: { path: /echo, json: { model: [gpt-4o, "o1*"] } }
    upstream: app
    limits: [dear]
  - name: rest
    match: { path: /echo }
    upstream: app
    limits: [cheap]
"#;

/// `POST /echo` with `body` as `user`.
fn ask(user: &str, body: impl Into<Bytes>) -> Request<Full<Bytes>> {
    Request::post("/echo").header("host", "test.local").header("x-user", user).body(Full::new(body.into())).unwrap()
}

#[tokio::test]
async fn a_route_matching_a_body_field_takes_its_requests_and_the_others_fall_through() {
    let backend = Backend::start().await;
    let sg = Sluicegate::in_front_of(&backend, ROUTED);
    let dear = r#"{"model": "gpt-4o", "messages": []}"#;
    let r = request(sg.addr, ask("ann", dear)).await;
    assert_eq!((r.status, r.text().as_str()), (200, dear), "forwarded unchanged");
    assert_eq!(request(sg.addr, ask("ann", dear)).await.status, 429, "the dear route's limit: one a minute");
    // A prefix: o1-mini is dear too.
    assert_eq!(request(sg.addr, ask("ann", r#"{"model":"o1-mini"}"#)).await.status, 429);
    // Another model, no model, no JSON, no body: the next route, its own limit (3 at once).
    let others = [&br#"{"model":"gpt-4o-mini"}"#[..], br#"{"n": 1}"#, b"model=gpt-4o", b""];
    for other in others {
        let r = request(sg.addr, ask("ann", Bytes::copy_from_slice(other))).await;
        assert_eq!(r.status, if other == b"" { 429 } else { 200 }, "{:?}", String::from_utf8_lossy(other));
    }
    // Chunked, split anywhere: routed alike.
    let body = br#"{"stream": true, "model": "o1-preview"}"#;
    for (user, split) in [("bob", 1), ("cy", 20), ("dee", body.len() - 1)] {
        let (mut tx, stream) = Channel::<Bytes, std::convert::Infallible>::new(4);
        let req = Request::post("/echo").header("host", "test.local").header("x-user", user).body(stream).unwrap();
        let answer = tokio::spawn(async move { request(sg.addr, req).await });
        tx.send_data(Bytes::copy_from_slice(&body[..split])).await.unwrap();
        tx.send_data(Bytes::copy_from_slice(&body[split..])).await.unwrap();
        drop(tx);
        assert_eq!(answer.await.unwrap().status, 200, "split at {split}");
        assert_eq!(request(sg.addr, ask(user, dear)).await.status, 429, "{user} was routed dear");
    }
    // HTTP/2 alike.
    let h2 =
        || Request::post("http://test.local/echo").header("x-user", "eve").body(Full::new(Bytes::from(dear))).unwrap();
    assert_eq!(request_h2(sg.addr, h2()).await.status, 200);
    assert_eq!(request_h2(sg.addr, h2()).await.status, 429);
    let config: Value = serde_json::from_slice(&get(sg.admin_addr(), "/config", &[]).await.body).unwrap();
    assert_eq!(config["routes"][0]["match"]["json"], serde_json::json!({ "model": ["gpt-4o", "o1*"] }));
}

#[tokio::test]
async fn a_body_repeating_a_field_routing_reads_is_refused_in_the_peek_and_cut_after_it() {
    let backend = Backend::start().await;
    let sg = Sluicegate::in_front_of(&backend, ROUTED);
    let within = request(sg.addr, ask("ann", r#"{"model":"gpt-4o-mini","model":"gpt-4o"}"#)).await;
    assert_eq!(within.status, 400);
    assert!(within.text().contains("routing"), "{}", within.text());
    assert!(backend.hits().is_empty(), "a body repeating its route's field reached the upstream");
    // Past the 1 KiB peek: routed by the first, the body cut at the second.
    let padded = format!(r#"{{"model":"gpt-4o-mini","pad":"{}","model":"gpt-4o"}}"#, "x".repeat(4096));
    let after = request(sg.addr, ask("bob", padded.clone())).await;
    assert_eq!(after.status, 400, "{}", after.text());
    let single = padded.replace(r#","model":"gpt-4o""#, "");
    assert_eq!(request(sg.addr, ask("bob", single.clone())).await.text(), single);
}

#[test]
fn explain_routes_by_the_body_given_with_dash_d_and_says_when_none_was() {
    let (_dir, path) = config_file(&ROUTED.replace("BACKEND", "127.0.0.1:9"));
    let run = |args: &[&str]| {
        let output = binary().arg("explain").arg("-c").arg(&path).arg("--json").args(args).output().unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_slice::<Value>(&output.stdout).unwrap()
    };
    let dear = run(&["-d", r#"{"model":"o1"}"#, "-H", "x-user: ann", "http://test.local/echo"]);
    assert_eq!(dear["route"]["name"], "dear", "{dear}");
    let without = run(&["-X", "POST", "-H", "x-user: ann", "http://test.local/echo"]);
    assert_eq!(without["route"]["name"], "rest", "{without}");
    let notes = without["notes"].to_string();
    assert!(notes.contains("route dear matches on fields of the JSON body") && notes.contains("-d"), "{notes}");
}
