//! The backend of the whole-proxy benchmark (`benches/wrk/run.sh`): answers every
//! request `200 ok` (but `/held`, never answered: a request kept in progress for the
//! memory measurement; and `/__accepted`, the number of connections it has accepted, by
//! which the benchmark counts the connections a proxy opened) on one thread, so that pinned to one CPU beside wrk and a proxy it
//! costs what a lean origin costs and nothing is left to scheduling between threads.
//!
//! An example rather than a `[[bench]]` target: `cargo build --release --example
//! bench_backend` gives it a fixed path (bench binaries get hashed names), and
//! `cargo test` / `clippy --all-targets` keep it compiling.
//!
//!     bench_backend 127.0.0.1:PORT
//!
//! Prints `listening on ADDR` once bound (port 0 picks one).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http::{Request, Response, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

fn main() -> std::io::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:0".to_owned());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(serve(&addr))
}

async fn serve(addr: &str) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    println!("listening on {}", listener.local_addr()?);
    let accepted = Arc::new(AtomicU64::new(0));
    loop {
        let (stream, _) = listener.accept().await?;
        accepted.fetch_add(1, Ordering::Relaxed);
        let _ = stream.set_nodelay(true);
        let accepted = Arc::clone(&accepted);
        tokio::spawn(async move {
            let service = service_fn(|request: Request<Incoming>| {
                let accepted = Arc::clone(&accepted);
                async move {
                    if request.uri().path() == "/held" {
                        std::future::pending::<()>().await;
                    }
                    let body = match request.uri().path() {
                        "/__accepted" => Bytes::from(format!("{}\n", accepted.load(Ordering::Relaxed))),
                        _ => Bytes::from_static(b"ok\n"),
                    };
                    let mut response = Response::new(Full::new(body));
                    response.headers_mut().insert(header::CONTENT_TYPE, http::HeaderValue::from_static("text/plain"));
                    Ok::<_, Infallible>(response)
                }
            });
            // A client that goes away mid-request is no concern of a benchmark backend.
            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}
