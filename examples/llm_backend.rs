//! A stand-in for a language model's API, for the LLM gateway example
//! (`examples/llm-gateway.yaml`) and its test: it answers in the shapes the real APIs
//! document, with made-up text and counted usage, so that budgets and charges can be
//! tried without a model or a key.
//!
//! - `POST /v1/chat/completions` (OpenAI's shape): with `"stream": true`, an event
//!   stream of chunks whose last carries `usage` (as `stream_options.include_usage`
//!   asks), then `data: [DONE]`; otherwise one JSON answer with `usage`.
//! - `POST /v1/messages` (Anthropic's shape): an event stream, the input's tokens in
//!   `message_start`, the output's in the last `message_delta`.
//! - `POST /mcp` (an MCP server's JSON-RPC): a `tools/call` answered with an empty
//!   result.
//!
//! Prompt (input) tokens are the request body's bytes divided by 4, rounded up; every
//! answer is the same 12 tokens. Anything else is `404`.
//!
//!     cargo run --release --example llm_backend 127.0.0.1:9100
//!
//! Prints `listening on ADDR` once bound (port 0 picks one).

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// The answer's words, one token each: 12 tokens.
const WORDS: [&str; 12] =
    ["This", " is", " the", " stub", " model", " answering", " in", " twelve", " tokens", ",", " as", " promised"];

fn main() -> std::io::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:0".to_owned());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(serve(&addr))
}

async fn serve(addr: &str) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    println!("listening on {}", listener.local_addr()?);
    loop {
        let (stream, _) = listener.accept().await?;
        tokio::spawn(async move {
            _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service_fn(answer)).await;
        });
    }
}

async fn answer(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = request.uri().path().to_owned();
    let body = request.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let asked: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let model = asked["model"].as_str().unwrap_or("unknown").to_owned();
    let prompt = body.len().div_ceil(4);
    let completion = WORDS.len();
    let (kind, text) = match path.as_str() {
        "/v1/chat/completions" if asked["stream"] == true => ("text/event-stream", openai_stream(&model, prompt)),
        "/v1/chat/completions" => {
            let answer = serde_json::json!({
                "id": "chatcmpl-stub",
                "object": "chat.completion",
                "model": model,
                "choices": [{ "index": 0, "message": { "role": "assistant", "content": WORDS.concat() }, "finish_reason": "stop" }],
                "usage": { "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion },
            });
            ("application/json", answer.to_string())
        }
        "/v1/messages" => ("text/event-stream", anthropic_stream(&model, prompt)),
        "/mcp" => {
            let answer = serde_json::json!({ "jsonrpc": "2.0", "id": asked["id"], "result": { "content": [] } });
            ("application/json", answer.to_string())
        }
        _ => {
            let mut response = Response::new(Full::new(Bytes::from_static(b"not found\n")));
            *response.status_mut() = StatusCode::NOT_FOUND;
            return Ok(response);
        }
    };
    let mut response = Response::new(Full::new(Bytes::from(text)));
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static(kind));
    Ok(response)
}

/// OpenAI's chunks, then the usage chunk, then `[DONE]`.
fn openai_stream(model: &str, prompt: usize) -> String {
    let mut out = String::new();
    for word in WORDS {
        let chunk = serde_json::json!({
            "id": "chatcmpl-stub", "object": "chat.completion.chunk", "model": model,
            "choices": [{ "index": 0, "delta": { "content": word } }], "usage": null,
        });
        out.push_str(&format!("data: {chunk}\n\n"));
    }
    let usage = serde_json::json!({
        "id": "chatcmpl-stub", "object": "chat.completion.chunk", "model": model, "choices": [],
        "usage": { "prompt_tokens": prompt, "completion_tokens": WORDS.len(), "total_tokens": prompt + WORDS.len() },
    });
    out.push_str(&format!("data: {usage}\n\ndata: [DONE]\n\n"));
    out
}

/// Anthropic's events: the input's tokens at the start, the output's (cumulative) in
/// `message_delta`.
fn anthropic_stream(model: &str, input: usize) -> String {
    let start = serde_json::json!({
        "type": "message_start",
        "message": { "id": "msg_stub", "model": model, "usage": { "input_tokens": input, "output_tokens": 1 } },
    });
    let mut out = format!("event: message_start\ndata: {start}\n\n");
    for word in WORDS {
        let delta = serde_json::json!({ "type": "content_block_delta", "index": 0, "delta": { "type": "text_delta", "text": word } });
        out.push_str(&format!("event: content_block_delta\ndata: {delta}\n\n"));
    }
    let end = serde_json::json!({ "type": "message_delta", "delta": { "stop_reason": "end_turn" }, "usage": { "output_tokens": WORDS.len() } });
    out.push_str(&format!(
        "event: message_delta\ndata: {end}\n\nevent: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n"
    ));
    out
}
