//! Opens many connections to a proxy and holds them, for the memory measurement
//! (`LAYOUT=memory benches/wrk/run.sh`): the proxy's resident memory with them open, less without,
//! is what a connection costs it.
//!
//!     hold_connections ADDR COUNT MODE
//!
//! MODE is `idle` (connected, nothing sent), `kept` (one `GET /` answered, the connection
//! kept alive), `h2` (the HTTP/2 preface and SETTINGS sent, the server's SETTINGS read,
//! no stream) or `busy` (`GET /held` sent, which `bench_backend` never answers: a
//! request in progress, with its upstream connection). Prints `ready` once every connection is in that state, then holds them
//! until its standard input closes.

use std::io::Read as _;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

type Error = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: hold_connections ADDR COUNT idle|kept|h2|busy";
    let addr = args.next().ok_or(usage)?;
    let count: usize = args.next().ok_or(usage)?.parse()?;
    let mode = args.next().ok_or(usage)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let held = runtime.block_on(async {
        let mut held = Vec::with_capacity(count);
        // A few at a time, so that the listen backlog never overflows.
        for chunk in (0..count).collect::<Vec<_>>().chunks(200) {
            let opened = chunk.iter().map(|_| open(&addr, &mode));
            for stream in futures_util::future::join_all(opened).await {
                held.push(stream?);
            }
        }
        Ok::<_, Error>(held)
    })?;
    println!("ready {}", held.len());
    // Held until the caller is done measuring.
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    drop(held);
    Ok(())
}

async fn open(addr: &str, mode: &str) -> Result<TcpStream, Error> {
    let mut stream = TcpStream::connect(addr).await?;
    match mode {
        "idle" => {}
        "kept" => {
            stream.write_all(b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n").await?;
            read_response(&mut stream).await?;
        }
        "h2" => {
            // The client preface and an empty SETTINGS frame (RFC 9113 §3.4).
            stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0").await?;
            let mut frame = [0u8; 9];
            stream.read_exact(&mut frame).await?;
        }
        "busy" => stream.write_all(b"GET /held HTTP/1.1\r\nHost: bench\r\n\r\n").await?,
        other => return Err(format!("unknown mode {other}").into()),
    }
    Ok(stream)
}

/// Reads one response with a `Content-Length`.
async fn read_response(stream: &mut TcpStream) -> Result<(), Error> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Err("closed before the response".into());
        }
        got.extend_from_slice(&buf[..n]);
        let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else { continue };
        let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
        let length = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok())
            .ok_or("no content-length")?;
        if got.len() >= end + 4 + length {
            return Ok(());
        }
    }
}
