//! A load driver for instruction counts (`benches/wrk/instructions.sh`): sends exactly N
//! `GET /` requests over C keep-alive HTTP/1.1 connections, each connection one request
//! at a time, and exits. Under `valgrind --tool=callgrind` the proxy's instruction
//! count divided by N is its cost per request, free of the noise wall-clock figures
//! carry on a shared machine; wrk cannot stop after an exact number of requests.
//!
//!     bench_client ADDR REQUESTS [CONNECTIONS]
//!
//! With `BENCH_BEARER=TOKEN` in the environment every request carries
//! `Authorization: Bearer TOKEN`. With `BENCH_BODY=BYTES` each is a `POST` of a JSON body
//! of that many bytes, `{"model":"bench","input":"xx…"}`, with `X-Model: bench`.
//!
//! Prints the status codes it got (`200: N`); exits non-zero if a request failed.

use std::collections::BTreeMap;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

type Error = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: bench_client ADDR REQUESTS [CONNECTIONS]";
    let addr = args.next().ok_or(usage)?;
    let requests: usize = args.next().ok_or(usage)?.parse()?;
    let connections: usize = args.next().map_or(Ok(8), |c| c.parse())?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let counts = runtime.block_on(async {
        let mut tasks = Vec::new();
        for c in 0..connections {
            // The requests spread evenly; the first connections take the remainder.
            let share = requests / connections + usize::from(c < requests % connections);
            let (bearer, body) = (std::env::var("BENCH_BEARER").ok(), body()?);
            tasks.push(tokio::spawn(drive(addr.clone(), share, bearer, body)));
        }
        let mut counts = BTreeMap::new();
        for task in tasks {
            for (status, n) in task.await?? {
                *counts.entry(status).or_insert(0) += n;
            }
        }
        Ok::<_, Error>(counts)
    })?;
    for (status, n) in counts {
        println!("{status}: {n}");
    }
    Ok(())
}

/// The body `BENCH_BODY` asks for, if it does.
fn body() -> Result<Option<Bytes>, Error> {
    let Ok(bytes) = std::env::var("BENCH_BODY") else { return Ok(None) };
    let bytes: usize = bytes.parse()?;
    let mut body = br#"{"model":"bench","input":""#.to_vec();
    body.resize(bytes.saturating_sub(2).max(body.len()), b'x');
    body.extend_from_slice(b"\"}");
    Ok(Some(Bytes::from(body)))
}

/// `requests` requests one after another on one connection; counts by status.
async fn drive(
    addr: String,
    requests: usize,
    bearer: Option<String>,
    body: Option<Bytes>,
) -> Result<BTreeMap<u16, usize>, Error> {
    let stream = TcpStream::connect(&addr).await?;
    stream.set_nodelay(true)?;
    let (mut sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let mut counts = BTreeMap::new();
    for _ in 0..requests {
        let mut req = Request::get("/").header(http::header::HOST, &addr);
        if let Some(token) = &bearer {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let req = match &body {
            Some(body) => req.method("POST").header("x-model", "bench").body(Full::new(body.clone()))?,
            None => req.body(Full::new(Bytes::new()))?,
        };
        let response = sender.send_request(req).await?;
        *counts.entry(response.status().as_u16()).or_insert(0) += 1;
        response.into_body().collect().await?;
        sender.ready().await?;
    }
    Ok(counts)
}
