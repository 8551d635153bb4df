//! `charge:`: what a response reports it cost, debited after it, from a field of its
//! head, its trailers (HTTP/1.1 chunked, HTTP/2, gRPC) or the last server-sent event
//! that carries it; a debt past the quota carried, its `Retry-After` saying when it is
//! paid; local and global.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_stream::StreamExt as _;

use crate::common::*;
use crate::redis::Redis;

type Frames = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// A backend that reports what each request cost, by path: `/report/N` in the field
/// `x-tokens-used` of its head, `/sse/N` in the `usage.total_tokens` of an event of a
/// `text/event-stream` body (sent in pieces, `[DONE]` after it), `/trailer/N` in a
/// trailer (over HTTP/2: `http2`), `/status/CODE/N` in the head of a response with that
/// status; anything else reports nothing. Counts its requests.
async fn reporting_backend(http2: bool) -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::Ordering::SeqCst;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = hits.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let seen = seen.clone();
            let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                seen.fetch_add(1, SeqCst);
                async move {
                    let path = req.uri().path().to_owned();
                    let (kind, n) = path[1..].split_once('/').unwrap_or((&path[1..], ""));
                    let mut frames = Vec::new();
                    let mut response = http::Response::builder();
                    match kind {
                        "report" => {
                            response = response.header("x-tokens-used", n);
                            frames.push(Ok(Frame::data(Bytes::from_static(b"ok"))));
                        }
                        "sse" => {
                            response = response.header("content-type", "text/event-stream; charset=utf-8");
                            let usage = format!("data: {{\"usage\": {{\"total_tokens\": {n}}}}}\n\n");
                            for piece in ["data: {\"choices\": []}\n\n", &usage[..9], &usage[9..], "data: [DONE]\n\n"] {
                                frames.push(Ok(Frame::data(Bytes::from(piece.to_owned()))));
                            }
                        }
                        // `/usage/P/C`: a language model's stream, its usage (P prompt
                        // tokens, C completion tokens) in its last event; also in the head.
                        "usage" => {
                            let (prompt, completion) = n.split_once('/').unwrap();
                            response = response
                                .header("content-type", "text/event-stream")
                                .header("x-prompt-tokens", prompt)
                                .header("x-completion-tokens", completion);
                            let usage = format!(
                                "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":{prompt},\"completion_tokens\":{completion}}}}}\n\n"
                            );
                            for piece in ["data: {\"choices\":[{\"delta\":{}}]}\n\n", &usage, "data: [DONE]\n\n"] {
                                frames.push(Ok(Frame::data(Bytes::from(piece.to_owned()))));
                            }
                        }
                        // `/json/P/C`: a language model's answer in one JSON body (sent in
                        // pieces of 7 bytes), its usage after a message quoting a usage;
                        // `/json-gzip/P/C` says it is compressed.
                        "json" | "json-gzip" => {
                            let (prompt, completion) = n.split_once('/').unwrap();
                            response = response.header("content-type", "application/json");
                            if kind == "json-gzip" {
                                response = response.header("content-encoding", "gzip");
                            }
                            let body = format!(
                                r#"{{"id":"c1","choices":[{{"message":{{"content":"\"usage\": {{\"prompt_tokens\": 999}}"}}}}],
 "usage" : {{"prompt_tokens":{prompt},"completion_tokens":{completion},"total_tokens":0}}}}"#
                            );
                            for piece in body.as_bytes().chunks(7) {
                                frames.push(Ok(Frame::data(Bytes::copy_from_slice(piece))));
                            }
                        }
                        "stalled" => {
                            response = response.header("content-type", "text/event-stream");
                            frames.push(Ok(Frame::data(Bytes::from_static(b"data: {\"choices\": []}\n\n"))));
                        }
                        // `/status/CODE/N`: answered CODE, reporting N in the head.
                        "status" => {
                            let (code, units) = n.split_once('/').unwrap();
                            response = response.status(code.parse::<u16>().unwrap()).header("x-tokens-used", units);
                            frames.push(Ok(Frame::data(Bytes::from_static(b"status"))));
                        }
                        "trailer" => {
                            frames.push(Ok(Frame::data(Bytes::from_static(b"ok"))));
                            let mut trailers = http::HeaderMap::new();
                            trailers.insert("x-tokens-used", n.parse().unwrap());
                            frames.push(Ok(Frame::trailers(trailers)));
                        }
                        _ => frames.push(Ok(Frame::data(Bytes::from_static(b"ok")))),
                    }
                    let frames = tokio_stream::iter(frames);
                    // `/stalled`: an event without usage, then nothing more (a stream still
                    // being generated).
                    let body: Frames = match kind {
                        "stalled" => StreamBody::new(frames.chain(tokio_stream::pending())).boxed(),
                        _ => StreamBody::new(frames).boxed(),
                    };
                    Ok::<_, Infallible>(response.body(body).unwrap())
                }
            });
            tokio::spawn(async move {
                if http2 {
                    let builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                    _ = builder.serve_connection(TokioIo::new(stream), service).await;
                } else {
                    _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                }
            });
        }
    });
    (addr, hits)
}

fn hits(counter: &std::sync::atomic::AtomicUsize) -> usize {
    counter.load(std::sync::atomic::Ordering::SeqCst)
}

/// `GET path` as user `user`.
async fn get_as(addr: SocketAddr, path: &str, user: &str) -> Reply {
    get(addr, path, &[("x-user", user)]).await
}

/// A parameter (`r`: the units left, `t`: the seconds until they are all back) of the
/// reply's `RateLimit` item.
fn ratelimit(reply: &Reply, param: &str) -> u64 {
    let field = reply.header("ratelimit").unwrap_or_else(|| panic!("no RateLimit: {:?}", reply.headers));
    let value = field.split(';').find_map(|p| p.strip_prefix(param)?.strip_prefix('='));
    value.unwrap_or_else(|| panic!("no {param} in {field}")).parse().unwrap()
}

/// The seconds of a reply's `Retry-After`.
fn retry_after(reply: &Reply) -> u64 {
    reply.header("retry-after").unwrap_or_else(|| panic!("no Retry-After: {}", reply.status)).parse().unwrap()
}

/// A proxy in front of `backend` (`http2`: spoken to in HTTP/2) with limit `tokens`
/// (`fields`) on every request, an admin listener, and `top` settings.
fn proxy(backend: SocketAddr, http2: bool, fields: &str, top: &str) -> Sluicegate {
    let yaml = format!(
        "listen: 127.0.0.1:0\nadmin: {{ listen: 127.0.0.1:0 }}\nratelimit_headers: all\n{top}\nupstreams:\n  b: {{ \
         servers: [\"{backend}\"], http2: {http2} }}\nlimits:\n  tokens: {{ key: \"header:x-user\", \
         on_missing_key: skip, {fields} }}\nroutes:\n  - {{ limits: [tokens], upstream: b }}\n"
    );
    Sluicegate::start(&yaml)
}

const BUCKET: &str = "algorithm: token_bucket, capacity: 10, refill: 10r/m";

/// A token bucket of 10 (one back every 6 s) charged what the head reports: a report
/// of 25 on a request of 1 leaves a debt of 16 units, so the next requests are refused
/// for 17 refills (102 s), and the backend sees none of them; another user is not
/// touched; a response that reports nothing is charged the default.
async fn a_debt_from_a_head_field_refuses_until_it_is_paid(scope: &str, top: &str) {
    let (backend, seen) = reporting_backend(false).await;
    let sg = proxy(backend, false, &format!("{BUCKET}, charge: {{ header: x-tokens-used, default: 3 }}{scope}"), top);
    let first = get_as(sg.addr, "/report/25", "ann").await;
    assert_eq!((first.status, first.text()), (200, "ok".to_owned()));
    let refused = get_as(sg.addr, "/report/1", "ann").await;
    assert_eq!(refused.status, 429);
    let after = retry_after(&refused);
    assert!((101..=102).contains(&after), "Retry-After {after}: 26 units on a bucket of 10, 6 s a unit");
    assert_eq!(hits(&seen), 1, "the backend saw no refused request");
    // Another user: a full bucket. A response without a report is charged 3 (and its
    // own unit): 6 of 10 left, said by the next response.
    assert_eq!(get_as(sg.addr, "/plain", "bob").await.status, 200);
    let next = get_as(sg.addr, "/plain", "bob").await;
    assert_eq!(ratelimit(&next, "r"), 5);
    let metrics = Metrics::of(&sg).await;
    assert_eq!(metrics.value("sluicegate_limit_charged_units_total{limit=\"tokens\"}"), 25.0 + 3.0 + 3.0);
    assert_eq!(metrics.value("sluicegate_limit_charges_defaulted_total{limit=\"tokens\"}"), 2.0);
    let config: serde_json::Value = serde_json::from_slice(&get(sg.admin_addr(), "/config", &[]).await.body).unwrap();
    let charge = &config["limits"][0]["charge"];
    assert_eq!(*charge, serde_json::json!({ "header": "x-tokens-used", "default": 3, "instead_of_cost": false }));
}

#[tokio::test]
async fn a_local_debt_from_a_head_field_refuses_until_it_is_paid() {
    a_debt_from_a_head_field_refuses_until_it_is_paid("", "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_debt_from_a_head_field_refuses_until_it_is_paid_on_every_instance() {
    let redis = Redis::start();
    let top = format!("redis: {{ url: \"{}\", timeout: 1s }}", redis.url());
    a_debt_from_a_head_field_refuses_until_it_is_paid(", scope: global", &top).await;
    // The debt lives in Redis: a second instance refuses the same user at once.
    let (backend, seen) = reporting_backend(false).await;
    let fields = format!("{BUCKET}, charge: {{ header: x-tokens-used }}, scope: global");
    let (a, b) = (proxy(backend, false, &fields, &top), proxy(backend, false, &fields, &top));
    assert_eq!(get_as(a.addr, "/report/40", "cy").await.status, 200);
    let refused = get_as(b.addr, "/plain", "cy").await;
    assert_eq!(refused.status, 429);
    assert!(retry_after(&refused) > 180, "41 units: {} s", retry_after(&refused));
    assert_eq!(hits(&seen), 1);
}

/// The windows of the fixed-window limits here, in seconds: 30 days, so that no window
/// ends during a test (an hour's would, at each full hour: the test then fails).
const WINDOW: u64 = 30 * 86_400;

/// An event stream's usage, read from its events as they pass (split across pieces,
/// `[DONE]` after it), replaces the request's cost (`instead_of_cost`) in a fixed
/// window of 50 (`WINDOW` long): 30 + 80 is 60 past the limit, a debt carried into the
/// next window (50 of it, the whole window), so a refusal now waits for the end of the next.
async fn an_event_streams_usage_replaces_the_cost_and_its_debt_carries(scope: &str, top: &str) {
    let (backend, seen) = reporting_backend(false).await;
    let fields = format!(
        "algorithm: fixed_window, limit: 50, window: 30d, charge: {{ sse_json: usage.total_tokens, instead_of_cost: \
         true }}{scope}"
    );
    let sg = proxy(backend, false, &fields, top);
    let first = get_as(sg.addr, "/sse/30", "ann").await;
    assert_eq!(first.status, 200);
    assert!(first.text().contains("[DONE]"), "the stream passes whole: {}", first.text());
    let second = get_as(sg.addr, "/sse/80", "ann").await;
    assert_eq!((second.status, ratelimit(&second, "r")), (200, 19), "50 - 30 - 1");
    let refused = get_as(sg.addr, "/sse/30", "ann").await;
    assert_eq!(refused.status, 429);
    let reset = ratelimit(&refused, "t");
    assert!(
        retry_after(&refused) >= reset + WINDOW - 1,
        "past this window's end ({reset} s): {}",
        retry_after(&refused)
    );
    assert_eq!(hits(&seen), 2);
    let metrics = Metrics::of(&sg).await;
    assert_eq!(metrics.value("sluicegate_limit_charged_units_total{limit=\"tokens\"}"), 110.0);
}

/// A charge read from several places, each count weighed: a stream's prompt tokens at 1
/// and its completion tokens at 4 (10 and 5: 30 units), the same from two head fields;
/// the next response's `RateLimit` shows the debit, `/config` the weights.
#[tokio::test]
async fn a_charge_of_several_counts_weighs_each() {
    let (backend, _) = reporting_backend(false).await;
    for (reading, said) in [
        (
            "sse_json: { usage.prompt_tokens: 1, usage.completion_tokens: 4 }",
            "usage.completion_tokens*4 + usage.prompt_tokens*1",
        ),
        ("header: { x-prompt-tokens: 1, x-completion-tokens: 4 }", "x-completion-tokens*4 + x-prompt-tokens*1"),
    ] {
        let fields = format!(
            "algorithm: fixed_window, limit: 1000, window: 30d, charge: {{ {reading}, instead_of_cost: true }}"
        );
        let sg = proxy(backend, false, &fields, "");
        let first = get_as(sg.addr, "/usage/10/5", "ann").await;
        assert_eq!(first.status, 200, "{reading}");
        let next = get_as(sg.addr, "/plain", "ann").await;
        assert_eq!(ratelimit(&next, "r"), 1000 - 30 - 1, "{reading}");
        let metrics = Metrics::of(&sg).await;
        assert_eq!(metrics.value("sluicegate_limit_charged_units_total{limit=\"tokens\"}"), 30.0, "{reading}");
        let config: serde_json::Value =
            serde_json::from_slice(&get(sg.admin_addr(), "/config", &[]).await.body).unwrap();
        let charge = &config["limits"][0]["charge"];
        assert_eq!(charge[reading.split(':').next().unwrap()], said, "{charge}");
    }
}

/// A JSON response body's usage (a model's answer that does not stream), read as it
/// passes in pieces, weighed, over both protocols: a usage quoted inside a string is
/// not read; the same reading reads an event stream's events; a compressed body or one
/// of another type is charged the default.
#[tokio::test]
async fn a_json_bodys_usage_is_charged_as_it_passes() {
    for http2 in [false, true] {
        let (backend, _) = reporting_backend(http2).await;
        let fields = "algorithm: fixed_window, limit: 1000, window: 30d, charge: { json: { usage.prompt_tokens: 1, \
                      usage.completion_tokens: 4 }, default: 7, instead_of_cost: true }";
        let sg = proxy(backend, http2, fields, "");
        let first = get_as(sg.addr, "/json/10/5", "ann").await;
        assert_eq!(first.status, 200);
        assert!(first.text().ends_with("\"total_tokens\":0}}"), "the body passes whole: {}", first.text());
        let next = get_as(sg.addr, "/plain", "ann").await;
        assert_eq!(ratelimit(&next, "r"), 1000 - 30 - 1, "http2 {http2}");
        // The same reading of an event stream: its events, as `sse_json` reads them.
        assert_eq!(get_as(sg.addr, "/usage/10/5", "cy").await.status, 200);
        assert_eq!(ratelimit(&get_as(sg.addr, "/plain", "cy").await, "r"), 1000 - 30 - 1, "http2 {http2}");
        // Compressed: unread, the default (7); `/plain` (ann's above, then bob's) has no
        // type but is no JSON: 7 each.
        assert_eq!(get_as(sg.addr, "/json-gzip/10/5", "bob").await.status, 200);
        assert_eq!(ratelimit(&get_as(sg.addr, "/plain", "bob").await, "r"), 1000 - 7 - 1, "http2 {http2}");
        let metrics = Metrics::of(&sg).await;
        assert_eq!(metrics.value("sluicegate_limit_charged_units_total{limit=\"tokens\"}"), 30.0 * 2.0 + 7.0 * 4.0);
        assert_eq!(metrics.value("sluicegate_limit_charges_defaulted_total{limit=\"tokens\"}"), 4.0);
    }
}

/// A budget of 0.002 USD a month per user, its responses priced by the model the
/// request's body names.
const BUDGET: &str = "algorithm: fixed_window, window: { calendar: month }, limit: 0.002, money: USD, charge: { \
    sse_json: [usage.prompt_tokens, usage.completion_tokens], default: 0.0001, prices: { by: \"json:model\", \
    table: { gpt-4o: { usage.prompt_tokens: 2.5, usage.completion_tokens: 10 }, \"*\": { usage.prompt_tokens: 5, \
    usage.completion_tokens: 15.00 } } } }";

/// `POST path` as user `user` with a JSON body naming `model`.
async fn ask_as(addr: SocketAddr, path: &str, user: &str, model: &str) -> Reply {
    let body = format!("{{\"model\": \"{model}\", \"messages\": []}}");
    let req = http::Request::post(path)
        .header("host", "localhost")
        .header("x-user", user)
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(Bytes::from(body)))
        .unwrap();
    request(addr, req).await
}

/// A money budget spent by priced usage, exactly, in micro-units: 100 prompt and 50
/// completion tokens of gpt-4o at 2.50 and 10.00 a million are 0.00075 USD; the same of
/// a model the table does not name, at its `*` row (5.00 and 15.00), 0.00125: the
/// budget is then spent, the next request refused until the month's end; `/limits`,
/// `/config` and `explain` say it in money.
async fn a_money_budget_is_spent_at_each_models_prices(scope: &str, top: &str) {
    let (backend, seen) = reporting_backend(false).await;
    let sg = proxy(backend, false, &format!("{BUDGET}{scope}"), top);
    assert_eq!(ask_as(sg.addr, "/usage/100/50", "ann", "gpt-4o").await.status, 200);
    let second = ask_as(sg.addr, "/usage/100/50", "ann", "llama-3").await;
    assert_eq!((second.status, ratelimit(&second, "r")), (200, 2000 - 750 - 1), "micro-units left");
    let refused = ask_as(sg.addr, "/usage/1/1", "ann", "gpt-4o").await;
    assert_eq!(refused.status, 429, "750 + 1250 of 2000 micro-units spent");
    assert!((1..=31 * 86_400).contains(&retry_after(&refused)), "until the month's end");
    assert_eq!(hits(&seen), 2);
    let metrics = Metrics::of(&sg).await;
    assert_eq!(metrics.value("sluicegate_limit_charged_units_total{limit=\"tokens\"}"), 2000.0);
    let config: serde_json::Value = serde_json::from_slice(&get(sg.admin_addr(), "/config", &[]).await.body).unwrap();
    let limit = &config["limits"][0];
    assert_eq!((&limit["money"], &limit["windows"][0]["limit"]), (&"USD".into(), &"0.002".into()), "{limit}");
    let table = &limit["charge"]["prices"]["table"];
    assert_eq!(table["gpt-4o"]["usage.prompt_tokens"], "2.50", "{table}");
    assert_eq!(table["*"]["usage.completion_tokens"], "15.00", "{table}");
    if scope.is_empty() {
        let state = get(sg.admin_addr(), "/limits/tokens?header:x-user=ann", &[]).await;
        let state: serde_json::Value = serde_json::from_slice(&state.body).unwrap();
        assert_eq!((&state["money"], &state["windows"][0]["remaining_money"]), (&"USD".into(), &"0.00".into()));
        let bob = get(sg.admin_addr(), "/limits/tokens?header:x-user=bob", &[]).await;
        let bob: serde_json::Value = serde_json::from_slice(&bob.body).unwrap();
        assert_eq!(bob["windows"][0]["remaining_money"], "0.002", "{bob}");
    }
}

#[tokio::test]
async fn a_local_money_budget_is_spent_at_each_models_prices() {
    a_money_budget_is_spent_at_each_models_prices("", "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_money_budget_is_spent_at_each_models_prices_on_every_instance() {
    let redis = Redis::start();
    let top = format!("redis: {{ url: \"{}\", timeout: 1s }}", redis.url());
    a_money_budget_is_spent_at_each_models_prices(", scope: global", &top).await;
    // Spent in Redis: another instance refuses the same user, and a request without a
    // model is priced at the `*` row.
    let (backend, _) = reporting_backend(false).await;
    let fields = format!("{BUDGET}, scope: global");
    let (a, b) = (proxy(backend, false, &fields, &top), proxy(backend, false, &fields, &top));
    let plain = http::Request::post("/usage/100/50")
        .header("host", "localhost")
        .header("x-user", "cy")
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(request(a.addr, plain).await.status, 200);
    let next = ask_as(b.addr, "/usage/1/1", "cy", "gpt-4o").await;
    assert_eq!((next.status, ratelimit(&next, "r")), (200, 2000 - 1250 - 1));
}

#[tokio::test]
async fn an_event_streams_usage_replaces_the_cost_and_its_debt_carries_into_the_next_window() {
    an_event_streams_usage_replaces_the_cost_and_its_debt_carries("", "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_streams_usage_is_charged_in_redis_and_its_debt_carries_into_the_next_window() {
    let redis = Redis::start();
    let top = format!("redis: {{ url: \"{}\", timeout: 1s }}", redis.url());
    an_event_streams_usage_replaces_the_cost_and_its_debt_carries(", scope: global", &top).await;
    // The window's key lives to the end of the next window, which the debt fills.
    let keys = redis.command(&["KEYS", "*"]);
    let key = keys.lines().next().unwrap_or_else(|| panic!("no key: {keys}"));
    let ttl: u64 = redis.command(&["PTTL", key]).parse().unwrap();
    assert!(ttl > WINDOW * 1000 && ttl <= 2 * WINDOW * 1000 + 1, "{key}: TTL {ttl} ms");
}

/// A client that leaves before the stream reports its usage does not get the response
/// free: it is charged the limit's `default` as soon as the proxy sees it gone, the
/// stream still running upstream.
#[tokio::test]
async fn a_client_that_leaves_before_the_report_is_charged_the_default() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (backend, _) = reporting_backend(false).await;
    let fields =
        "algorithm: fixed_window, limit: 100, window: 30d, charge: { sse_json: usage.total_tokens, default: 40 }";
    let sg = proxy(backend, false, fields, "");
    let mut client = tokio::net::TcpStream::connect(sg.addr).await.unwrap();
    client.write_all(b"GET /stalled HTTP/1.1\r\nHost: x\r\nx-user: ann\r\n\r\n").await.unwrap();
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("choices") {
        let mut buf = [0u8; 1024];
        let n = tokio::time::timeout(Duration::from_secs(5), client.read(&mut buf)).await.unwrap().unwrap();
        assert!(n > 0, "closed before the first event: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    drop(client);
    let units = "sluicegate_limit_charged_units_total{limit=\"tokens\"}";
    wait_until("the default charged", Duration::from_secs(10), async || {
        Metrics::of(&sg).await.get(units) == Some(40.0)
    })
    .await;
    assert_eq!(Metrics::of(&sg).await.value("sluicegate_limit_charges_defaulted_total{limit=\"tokens\"}"), 1.0);
    let next = get_as(sg.addr, "/report/0", "ann").await;
    assert_eq!(ratelimit(&next, "r"), 100 - 1 - 40 - 1);
}

/// A trailer's report, from an HTTP/2 server (the client speaking HTTP/1.1) and from an
/// HTTP/1.1 server's chunked trailers (the client speaking HTTP/2).
#[tokio::test]
async fn a_trailers_report_is_charged_from_servers_of_both_protocols() {
    let (backend, _) = reporting_backend(true).await;
    let sg = proxy(backend, true, &format!("{BUCKET}, charge: {{ trailer: x-tokens-used }}"), "");
    assert_eq!(get_as(sg.addr, "/trailer/12", "ann").await.status, 200);
    let refused = get_as(sg.addr, "/trailer/1", "ann").await;
    assert_eq!(refused.status, 429);
    assert!((23..=24).contains(&retry_after(&refused)), "13 units, 6 s each past 9: {}", retry_after(&refused));

    let answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: x-tokens-used\r\n\r\n2\r\nok\r\n0\r\nx-tokens-used: 12\r\n\r\n";
    let (raw, _) = raw_backend(answer).await;
    let sg = proxy(raw, false, &format!("{BUCKET}, charge: {{ trailer: x-tokens-used }}"), "");
    let req =
        || http::Request::get(format!("http://{}/t", sg.addr)).header("x-user", "ann").body(String::new()).unwrap();
    let first = request_h2(sg.addr, req().map(|b| http_body_util::Full::new(Bytes::from(b)))).await;
    assert_eq!(first.status, 200);
    let refused = request_h2(sg.addr, req().map(|b| http_body_util::Full::new(Bytes::from(b)))).await;
    assert_eq!(refused.status, 429, "{:?}", refused.headers);
}

/// A gRPC server reporting in its trailers what a call cost (`x-tokens-used`: the
/// request message's `count`), with its status.
async fn reporting_grpc_server() -> SocketAddr {
    use crate::grpc::{Msg, framed};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = hyper::service::service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let m: Msg = prost::Message::decode(&body[5..]).unwrap();
                let mut trailers = http::HeaderMap::new();
                trailers.insert("grpc-status", "0".parse().unwrap());
                trailers.insert("x-tokens-used", m.count.to_string().parse().unwrap());
                let frames = vec![Ok(Frame::data(framed(&m))), Ok(Frame::trailers(trailers))];
                let body: Frames = StreamBody::new(tokio_stream::iter(frames)).boxed();
                Ok::<_, Infallible>(
                    http::Response::builder().header("content-type", "application/grpc").body(body).unwrap(),
                )
            });
            tokio::spawn(async move {
                let builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                _ = builder.serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    addr
}

/// A gRPC call's trailers report its cost: a tonic client's calls, the third refused
/// `RESOURCE_EXHAUSTED` once 1 + 6 + 1 + 6 units spent a bucket of 10.
#[tokio::test]
async fn a_grpc_calls_trailers_report_its_cost() {
    let server = reporting_grpc_server().await;
    let sg = proxy(server, true, &format!("{BUCKET}, charge: {{ trailer: x-tokens-used }}"), "");
    let channel = crate::grpc::channel(sg.addr, None).await;
    let call = |count: u32| {
        let mut request = tonic::Request::new(crate::grpc::msg("charge", count, 0));
        request.metadata_mut().insert("x-user", "ann".parse().unwrap());
        let channel = channel.clone();
        async move {
            let mut grpc = tonic::client::Grpc::new(channel);
            grpc.ready().await.unwrap();
            let path = http::uri::PathAndQuery::from_static("/test.Echo/Unary");
            grpc.unary::<_, crate::grpc::Msg, _>(request, path, tonic_prost::ProstCodec::default()).await
        }
    };
    for _ in 0..2 {
        let reply = call(6).await.expect("passed");
        assert_eq!(reply.get_ref().count, 6);
    }
    let refused = call(6).await.expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused:?}");
}

/// A token bucket of 10 that refills one unit every 6 minutes: no unit comes back
/// during a test, however slow the machine.
const SLOW_BUCKET: &str = "algorithm: token_bucket, capacity: 10, refill: 10r/h";

/// A proxy in front of `backend` whose every route costs `cost`, with limit `tokens`
/// (`fields`), `top` settings and `routes` (the default one last, to `backend`).
fn proxy_with(backend: SocketAddr, fields: &str, top: &str, routes: &str, cost: u64) -> Sluicegate {
    Conf::new()
        .set("ratelimit_headers: all")
        .set(top)
        .set(&format!(
            "upstreams:\n  b: {{ servers: [\"{backend}\"] }}\n  dead: {{ servers: [\"127.0.0.1:{}\"] }}",
            closed_port()
        ))
        .limit("tokens", &format!("key: \"header:x-user\", on_missing_key: skip, {fields}"))
        .route(routes)
        .route(&format!("limits: [tokens], upstream: b, cost: {cost}"))
        .start()
}

/// With `instead_of_cost`, a report below the request's cost gives the difference back:
/// a request of cost 5 that reports 1 leaves 9 of 10, seen in the next one's `RateLimit`.
async fn a_report_below_the_cost_gives_the_difference_back(scope: &str, top: &str) {
    let (backend, _) = reporting_backend(false).await;
    let fields = format!("{SLOW_BUCKET}, charge: {{ header: x-tokens-used, instead_of_cost: true }}{scope}");
    let sg = proxy_with(backend, &fields, top, "match: { path: /never }, respond: { status: 200 }", 5);
    let first = get_as(sg.addr, "/report/1", "ann").await;
    assert_eq!((first.status, ratelimit(&first, "r")), (200, 5), "admitted at its cost");
    let second = get_as(sg.addr, "/report/1", "ann").await;
    assert_eq!((second.status, ratelimit(&second, "r")), (200, 4), "10 - 5 + 4 back - 5");
    let third = get_as(sg.addr, "/report/5", "ann").await;
    assert_eq!((third.status, ratelimit(&third, "r")), (200, 3), "8 - 5: the second gave 4 back too");
    let refused = get_as(sg.addr, "/report/5", "ann").await;
    assert_eq!(refused.status, 429, "3 left, a cost of 5");
}

#[tokio::test]
async fn a_local_report_below_the_cost_gives_the_difference_back() {
    a_report_below_the_cost_gives_the_difference_back("", "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_report_below_the_cost_gives_the_difference_back() {
    let redis = Redis::start();
    let top = format!("redis: {{ url: \"{}\", timeout: 1s }}", redis.url());
    a_report_below_the_cost_gives_the_difference_back(", scope: global", &top).await;
}

/// A response whose status the limit does not count (`count:`) is not charged, its
/// report nor the default; nor is a `502` the proxy makes when the upstream is gone (it
/// counts as its status, its own unit spent, the default not charged).
async fn an_uncounted_response_and_a_502_made_here_are_not_charged(scope: &str, top: &str) {
    let (backend, seen) = reporting_backend(false).await;
    // Two limits in one: `tokens` counts what the `/status/` route answers 200 only.
    let fields = format!("{SLOW_BUCKET}, count: [200, 502], charge: {{ header: x-tokens-used, default: 7 }}{scope}");
    let routes = "match: { path_prefix: /dead/ }, limits: [tokens], upstream: dead";
    let sg = proxy_with(backend, &fields, top, routes, 1);
    let uncounted = get_as(sg.addr, "/status/503/50", "ann").await;
    assert_eq!((uncounted.status, uncounted.text().as_str()), (503, "status"), "the upstream's own 503");
    let next = get_as(sg.addr, "/status/200/0", "ann").await;
    assert_eq!((next.status, ratelimit(&next, "r")), (200, 9), "the 503 given back and not charged 50");
    assert_eq!(hits(&seen), 2);

    let made = get_as(sg.addr, "/dead/x", "bob").await;
    assert_eq!(made.status, 502);
    let next = get_as(sg.addr, "/report/0", "bob").await;
    assert_eq!((next.status, ratelimit(&next, "r")), (200, 8), "the 502's own unit spent, not the default 7");
    let metrics = Metrics::of(&sg).await;
    assert_eq!(metrics.get("sluicegate_limit_charges_defaulted_total{limit=\"tokens\"}").unwrap_or(0.0), 0.0);
    assert_eq!(metrics.get("sluicegate_limit_charged_units_total{limit=\"tokens\"}").unwrap_or(0.0), 0.0);
}

#[tokio::test]
async fn a_local_limit_charges_no_uncounted_response_nor_a_502_made_here() {
    an_uncounted_response_and_a_502_made_here_are_not_charged("", "admin: { listen: 127.0.0.1:0 }").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_limit_charges_no_uncounted_response_nor_a_502_made_here() {
    let redis = Redis::start();
    let top = format!("admin: {{ listen: 127.0.0.1:0 }}\nredis: {{ url: \"{}\", timeout: 1s }}", redis.url());
    an_uncounted_response_and_a_502_made_here_are_not_charged(", scope: global", &top).await;
}

/// A report of 20 digits (more than any count: charged as 2^32 units) refuses the key
/// for the same time locally and globally: the debt is capped at 100 days of drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twenty_digit_report_refuses_the_key_for_100_days_locally_and_globally_alike() {
    let (backend, _) = reporting_backend(false).await;
    let redis = Redis::start();
    let top = format!("redis: {{ url: \"{}\", timeout: 1s }}", redis.url());
    let mut waits = Vec::new();
    for (scope, top) in [("", ""), (", scope: global", top.as_str())] {
        let fields = format!("{BUCKET}, charge: {{ header: x-tokens-used }}{scope}");
        let sg = proxy_with(backend, &fields, top, "match: { path: /never }, respond: { status: 200 }", 1);
        assert_eq!(get_as(sg.addr, "/report/99999999999999999999", "ann").await.status, 200);
        let refused = get_as(sg.addr, "/report/1", "ann").await;
        assert_eq!(refused.status, 429, "{scope}");
        waits.push(retry_after(&refused));
    }
    const DAYS_100: u64 = 100 * 86_400;
    for wait in &waits {
        assert!((DAYS_100 - 60..=DAYS_100 + 6).contains(wait), "Retry-After {waits:?}: 100 days of debt");
    }
    assert!(waits[0].abs_diff(waits[1]) <= 1, "local and global alike: {waits:?}");
}

/// `explain` says a budget's standing as money and the row of prices a request's
/// response would be charged at (`*` for a model the table does not name).
#[test]
fn explain_says_a_budget_in_money_and_the_row_of_prices() {
    let yaml = format!(
        "listen: 127.0.0.1:0\nupstreams:\n  b: {{ servers: [\"127.0.0.1:9\"] }}\nlimits:\n  tokens: {{ key: \
         \"header:x-user\", on_missing_key: skip, {BUDGET} }}\nroutes:\n  - {{ limits: [tokens], upstream: b }}\n"
    );
    let (_dir, path) = config_file(&yaml);
    let explain = |model: &str, json: bool| {
        let body = format!("{{\"model\": \"{model}\"}}");
        let mut command = binary();
        command.arg("explain").arg("-c").arg(&path).args(["-d", &body, "-H", "x-user: ann", "http://localhost/v1"]);
        if json {
            command.arg("--json");
        }
        let output = command.output().unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap()
    };
    let explained: serde_json::Value = serde_json::from_str(&explain("gpt-4o", true)).unwrap();
    let limit = &explained["limits"][0];
    assert_eq!((&limit["money"], &limit["priced_as"]), (&"USD".into(), &"gpt-4o".into()), "{limit}");
    let other: serde_json::Value = serde_json::from_str(&explain("llama-3", true)).unwrap();
    assert_eq!(other["limits"][0]["priced_as"], "*");
    let text = explain("gpt-4o", false);
    assert!(text.contains("0.002 USD remaining") && text.contains("prices of \"gpt-4o\""), "{text}");
}

/// The access log says which row of prices each money budget charges a response at.
#[tokio::test]
async fn the_access_log_says_the_row_of_prices_a_response_is_charged_at() {
    let (backend, _) = reporting_backend(false).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let top = format!("access_log: {{ format: json, path: \"{}\" }}", log.display());
    let sg = proxy(backend, false, BUDGET, &top);
    assert_eq!(ask_as(sg.addr, "/usage/1/1", "ann", "gpt-4o").await.status, 200);
    assert_eq!(ask_as(sg.addr, "/usage/1/1", "ann", "llama-3").await.status, 200);
    let mut text = String::new();
    block_until("two access-log lines", Duration::from_secs(5), || {
        text = std::fs::read_to_string(&log).unwrap_or_default();
        text.lines().count() == 2
    });
    let rows: Vec<serde_json::Value> =
        text.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["priced_as"].clone()).collect();
    assert_eq!(rows, [serde_json::json!({"tokens": "gpt-4o"}), serde_json::json!({"tokens": "*"})], "{text}");
}
