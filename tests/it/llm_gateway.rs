//! The LLM gateway example: `examples/llm-gateway.yaml` in front of the stand-in model API
//! (`examples/llm_backend`) does what its comments say: each key's monthly budget spent
//! at each model's prices, streamed or not, exactly; refused once spent, with the
//! example's own answer; keys and tools read from the request body.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use bytes::Bytes;
use http_body_util::Full;

use crate::common::*;

/// The stand-in model API, stopped when dropped.
struct Stub {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Stub {
    fn drop(&mut self) {
        _ = self.child.kill();
        _ = self.child.wait();
    }
}

/// Starts `examples/llm_backend` (built beside the binary under test by `cargo test`).
fn stub() -> Stub {
    let dir = std::path::Path::new(env!("CARGO_BIN_EXE_sluicegate")).parent().unwrap();
    let bin = dir.join("examples/llm_backend");
    let mut child = Command::new(&bin)
        .arg("127.0.0.1:0")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e} (`cargo test` builds the examples; `cargo test --test it` does not: `cargo build --release --example llm_backend`)", bin.display()));
    // Its first line, printed once bound (an exit closes the pipe: an empty line).
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("{line:?}")).parse().unwrap();
    Stub { child, addr }
}

/// `POST path` with `body` as API key `key` (none: `None`).
async fn post(addr: SocketAddr, path: &str, key: Option<&str>, body: &str) -> Reply {
    let mut req = http::Request::post(path).header("host", "localhost").header("content-type", "application/json");
    if let Some(key) = key {
        req = req.header("x-api-key", key);
    }
    request(addr, req.body(Full::new(Bytes::from(body.to_owned()))).unwrap()).await
}

/// What the stub's answer to `body` costs at `prompt` and `completion` dollars a million
/// tokens, in micro-dollars, rounded up: its prompt is the body's bytes / 4 (rounded up),
/// its answer 12 tokens.
fn cost(body: &str, prompt: f64, completion: f64) -> u64 {
    let tokens = body.len().div_ceil(4) as f64;
    (tokens * prompt + 12.0 * completion).ceil() as u64
}

#[tokio::test]
async fn the_llm_gateway_example_spends_each_keys_budget_at_each_models_prices() {
    let stub = stub();
    let example = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/llm-gateway.yaml")).unwrap();
    // Its ports made free ones, its budget 500 micro-dollars, so that a few answers spend it.
    let yaml = example
        .replace("127.0.0.1:8080", "127.0.0.1:0")
        .replace("127.0.0.1:9901", "127.0.0.1:0")
        .replace("127.0.0.1:9100", &stub.addr.to_string())
        .replace("limit: 5.00", "limit: 0.0005");
    assert_ne!(yaml, example);
    let sg = Sluicegate::start(&yaml);

    let dear = r#"{"model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}]}"#;
    let cheap = r#"{"model": "gpt-4o-mini", "stream": true, "messages": [{"role": "user", "content": "Hi"}]}"#;
    let answer = post(sg.addr, "/v1/chat/completions", Some("alice"), dear).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(answer.text().contains("\"usage\""), "{}", answer.text());
    let streamed = post(sg.addr, "/v1/chat/completions", Some("alice"), cheap).await;
    assert_eq!(streamed.status, 200);
    assert!(streamed.text().ends_with("data: [DONE]\n\n"), "{}", streamed.text());
    let (dear_cost, cheap_cost) = (cost(dear, 2.5, 10.0), cost(cheap, 0.15, 0.6));
    let mut spent = dear_cost + cheap_cost;
    let left = get(sg.admin_addr(), "/limits/spend?header:x-api-key=alice", &[]).await;
    let left: serde_json::Value = serde_json::from_slice(&left.body).unwrap();
    let said = left["windows"][0]["remaining_money"].as_str().unwrap().to_owned();
    assert_eq!(said.parse::<f64>().unwrap(), (500 - spent) as f64 / 1e6, "{left}");

    // Spent: each gpt-4o answer is admitted while a micro-dollar is left, then the
    // next is refused with the example's answer, until the month's end.
    let mut answered = 2;
    while spent < 500 {
        assert_eq!(post(sg.addr, "/v1/chat/completions", Some("alice"), dear).await.status, 200);
        (spent, answered) = (spent + dear_cost, answered + 1);
        assert!(answered < 20, "the budget is never spent");
    }
    let refused = post(sg.addr, "/v1/chat/completions", Some("alice"), dear).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("content-type"), Some("application/json"));
    assert!(refused.text().contains("\"budget_exceeded\""), "{}", refused.text());
    // Another key has its own budget; a request without a key is refused.
    assert_eq!(post(sg.addr, "/v1/chat/completions", Some("bob"), dear).await.status, 200);
    assert_eq!(post(sg.addr, "/v1/chat/completions", None, dear).await.status, 400);

    // MCP: 6 calls of one tool at once (one and a burst of 5), then refused; another
    // tool, and calls naming no tool, pass.
    let call = |tool: &str| {
        format!(r#"{{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {{"name": "{tool}"}}}}"#)
    };
    for _ in 0..6 {
        assert_eq!(post(sg.addr, "/mcp", Some("alice"), &call("search")).await.status, 200);
    }
    assert_eq!(post(sg.addr, "/mcp", Some("alice"), &call("search")).await.status, 429);
    assert_eq!(post(sg.addr, "/mcp", Some("alice"), &call("fetch")).await.status, 200);
    let list = r#"{"jsonrpc": "2.0", "id": 2, "method": "tools/list"}"#;
    assert_eq!(post(sg.addr, "/mcp", Some("alice"), list).await.status, 200);
}
