//! The fairness benchmark's backend and load (`benches/fairness/run.sh`).
//!
//!     fairness backend ADDR CAPACITY SERVICE_MS [SHED_AT]
//!     fairness load ADDR[,ADDR…] SECONDS LIGHT_RATE [TIMEOUT_MS] [SPLIT_S]
//!     fairness capacity ADDR SECONDS CONCURRENCY
//!
//! **backend**: answers every request `200 ok` after its service time: `SERVICE_MS` while
//! at most `CAPACITY` requests are in progress, and longer as more are (the time grows in
//! proportion: `SERVICE_MS × in progress / CAPACITY`), so that it completes `CAPACITY /
//! SERVICE_MS` requests a second at most however many it is given: a backend of fixed
//! capacity that slows everyone down when overloaded. `GET /capacity/N` sets its capacity
//! to N from then on (a backend that loses half its servers). With `SHED_AT` (a factor,
//! as `1.5`), a request that finds `SHED_AT × CAPACITY` in progress is answered `503` at
//! once: a backend that sheds when overloaded instead of slowing down. Prints `listening
//! on ADDR`.
//!
//! **load**: ten clients for `SECONDS`, each from its own loopback address
//! (127.0.0.11 to 127.0.0.20, so that each is a distinct `ip` key) and with its own
//! `X-Client` (`light1` … `light9`, `heavy`): nine light clients each sending
//! `LIGHT_RATE` requests a second, one heavy client ten times as many, at evenly spaced
//! instants whatever the answers (an open loop: a slow answer does not slow the
//! client), each request given up after `TIMEOUT_MS` [10000]. `ADDR` may be several,
//! comma-separated (instances sharing global limits): client `i` (from 0: light1 … light9,
//! heavy) sends to the `i`-th modulo their number. Prints one JSON object: per
//! class (`light`, all nine together; `heavy`), the requests sent, answered 200 within the
//! run (`ok`) and after its end (`late`), refused (429, 503), failed or timed out, the
//! requests a second answered 200 within the run (the goodput), and the 50th and 99th
//! percentiles of the time to a 200. With `SPLIT_S`, each class also has `phases`: the same
//! of the requests sent before that second and of those sent from it, and `worst_second`:
//! the most requests sent in one second that failed or timed out (an error burst).
//!
//! **capacity**: `CONCURRENCY` requests in progress at all times for `SECONDS` (a closed
//! loop, each connection sending its next request once answered): prints the requests
//! answered a second, the backend's real capacity at that many in progress (its timer
//! adds its granularity to every service time).
//!
//! An example, as `bench_backend` is: a fixed path, kept compiling by `cargo test`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

type Error = Box<dyn std::error::Error + Send + Sync>;

const LIGHT_CLIENTS: u8 = 9;
/// The heavy client sends this many times a light one's requests.
const HEAVY_FACTOR: u32 = 10;

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: fairness backend ADDR CAPACITY SERVICE_MS [SHED_AT] | fairness load ADDR[,ADDR…] SECONDS LIGHT_RATE [TIMEOUT_MS] [SPLIT_S] \
                 | fairness capacity ADDR SECONDS CONCURRENCY";
    let arg = |i: usize| args.get(i).map(String::as_str).ok_or(usage);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    match arg(0)? {
        "backend" => {
            let (capacity, service) = (arg(2)?.parse()?, Duration::from_millis(arg(3)?.parse()?));
            let shed_at = args.get(4).map(|f| f.parse::<f64>()).transpose()?;
            runtime.block_on(backend(arg(1)?, capacity, service, shed_at))
        }
        "load" => {
            let addrs = arg(1)?.split(',').map(str::parse).collect::<Result<Vec<SocketAddr>, _>>()?;
            let seconds = Duration::from_secs(arg(2)?.parse()?);
            let rate: u32 = arg(3)?.parse()?;
            let timeout = Duration::from_millis(args.get(4).map_or(Ok(10_000), |t| t.parse())?);
            let split = args.get(5).map(|s| s.parse::<f64>()).transpose()?;
            let report = runtime.block_on(load(&addrs, seconds, rate, timeout, split))?;
            println!("{report}");
            Ok(())
        }
        "capacity" => {
            let addr: SocketAddr = arg(1)?.parse()?;
            let seconds = Duration::from_secs(arg(2)?.parse()?);
            let per_second = runtime.block_on(capacity(addr, seconds, arg(3)?.parse()?))?;
            println!("{per_second:.0}");
            Ok(())
        }
        _ => Err(usage.into()),
    }
}

/// Requests answered a second with `concurrency` in progress at all times.
async fn capacity(addr: SocketAddr, seconds: Duration, concurrency: usize) -> Result<f64, Error> {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let end = Instant::now() + seconds;
    let loops: Vec<_> = (0..concurrency)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut answered = 0u64;
                while Instant::now() < end {
                    let request = Request::get(format!("http://{addr}/")).body(Empty::new())?;
                    let response = client.request(request).await?;
                    response.into_body().collect().await?;
                    answered += 1;
                }
                Ok::<_, Error>(answered)
            })
        })
        .collect();
    let mut answered = 0;
    for l in loops {
        answered += l.await??;
    }
    Ok(answered as f64 / seconds.as_secs_f64())
}

async fn backend(addr: &str, capacity: u64, service: Duration, shed_at: Option<f64>) -> Result<(), Error> {
    let listener = TcpListener::bind(addr).await?;
    println!("listening on {}", listener.local_addr()?);
    let in_progress = Arc::new(AtomicU64::new(0));
    let capacity = Arc::new(AtomicU64::new(capacity));
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let (in_progress, capacity) = (Arc::clone(&in_progress), Arc::clone(&capacity));
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                let (in_progress, capacity) = (Arc::clone(&in_progress), Arc::clone(&capacity));
                async move {
                    if let Some(n) = request.uri().path().strip_prefix("/capacity/").and_then(|n| n.parse().ok()) {
                        capacity.store(n, Ordering::Relaxed);
                        return Ok(Response::new(Full::new(Bytes::from(format!("capacity {n}\n")))));
                    }
                    let now = in_progress.fetch_add(1, Ordering::Relaxed) + 1;
                    let load = now as f64 / capacity.load(Ordering::Relaxed).max(1) as f64;
                    if shed_at.is_some_and(|at| load > at) {
                        in_progress.fetch_sub(1, Ordering::Relaxed);
                        let mut shed = Response::new(Full::new(Bytes::from_static(b"overloaded\n")));
                        *shed.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
                        return Ok(shed);
                    }
                    // Slower for everyone past its capacity: its throughput stays capacity / service.
                    let factor = load.max(1.0);
                    tokio::time::sleep(service.mul_f64(factor)).await;
                    in_progress.fetch_sub(1, Ordering::Relaxed);
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok\n"))))
                }
            });
            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

/// How one request ended: when it was sent (seconds since the run's start), and its
/// time to a 200 (ms).
struct Answer {
    at: f64,
    end: End,
    ms: f64,
}

#[derive(PartialEq)]
enum End {
    Ok,
    /// Answered 200 after the run's end: not counted in the goodput.
    Late,
    /// 429 or 503.
    Refused,
    Failed,
}

/// What `answers`, sent over `seconds`, got.
fn summary<'a>(answers: impl Iterator<Item = &'a Answer>, seconds: f64) -> serde_json::Value {
    let answers: Vec<&Answer> = answers.collect();
    let count = |end: End| answers.iter().filter(|a| a.end == end).count();
    let mut times: Vec<f64> = answers.iter().filter(|a| matches!(a.end, End::Ok | End::Late)).map(|a| a.ms).collect();
    times.sort_by(f64::total_cmp);
    let at = |q: f64| times.get(((times.len() as f64 * q) as usize).min(times.len().saturating_sub(1))).copied();
    serde_json::json!({
        "sent": answers.len(), "ok": count(End::Ok), "late": count(End::Late), "refused": count(End::Refused),
        "failed": count(End::Failed), "ok_per_second": count(End::Ok) as f64 / seconds.max(1e-9),
        "p50_ms": at(0.5), "p99_ms": at(0.99),
    })
}

async fn load(
    addrs: &[SocketAddr],
    seconds: Duration,
    rate: u32,
    timeout: Duration,
    split: Option<f64>,
) -> Result<String, Error> {
    let classes: Arc<Mutex<BTreeMap<&'static str, Vec<Answer>>>> = Arc::default();
    let begun = Instant::now();
    let end = begun + seconds;
    let mut clients = Vec::new();
    for i in 0..=LIGHT_CLIENTS {
        let heavy = i == LIGHT_CLIENTS;
        let (class, name) = if heavy { ("heavy", "heavy".to_owned()) } else { ("light", format!("light{}", i + 1)) };
        let rate = if heavy { rate * HEAVY_FACTOR } else { rate };
        let addr = addrs[usize::from(i) % addrs.len()];
        let mut connector = HttpConnector::new();
        connector.set_local_address(Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 11 + i))));
        connector.set_nodelay(true);
        let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(4096)
            .build(connector);
        let classes = Arc::clone(&classes);
        clients.push(tokio::spawn(async move {
            let every = Duration::from_secs(1) / rate.max(1);
            let start = tokio::time::Instant::now();
            let mut requests = Vec::new();
            let mut n = 0u32;
            while start.elapsed() < seconds {
                tokio::time::sleep_until(start + every * n).await;
                n += 1;
                let (client, name, classes) = (client.clone(), name.clone(), Arc::clone(&classes));
                requests.push(tokio::spawn(async move {
                    let sent = Instant::now();
                    let request = Request::get(format!("http://{addr}/"))
                        .header("x-client", name)
                        .body(Empty::new())
                        .map_err(|e| e.to_string());
                    let answer = async {
                        let response = client.request(request?).await.map_err(|e| e.to_string())?;
                        let status = response.status().as_u16();
                        response.into_body().collect().await.map_err(|e| e.to_string())?;
                        Ok::<_, String>(status)
                    };
                    let status = tokio::time::timeout(timeout, answer).await;
                    let end = match status {
                        Ok(Ok(200)) if Instant::now() <= end => End::Ok,
                        Ok(Ok(200)) => End::Late,
                        Ok(Ok(429 | 503)) => End::Refused,
                        _ => End::Failed,
                    };
                    let answer = Answer {
                        at: sent.duration_since(begun).as_secs_f64(),
                        end,
                        ms: sent.elapsed().as_secs_f64() * 1000.0,
                    };
                    let mut classes = classes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    classes.entry(class).or_default().push(answer);
                }));
            }
            for r in requests {
                let _ = r.await;
            }
        }));
    }
    for c in clients {
        c.await?;
    }
    let classes = classes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let secs = seconds.as_secs_f64();
    let report: serde_json::Map<String, serde_json::Value> = classes
        .iter()
        .map(|(name, answers)| {
            let mut value = summary(answers.iter(), secs);
            if let Some(split) = split {
                let before = summary(answers.iter().filter(|a| a.at < split), split);
                let after = summary(answers.iter().filter(|a| a.at >= split), secs - split);
                value["phases"] = serde_json::json!([before, after]);
                let last = secs.ceil() as usize;
                let mut failed = vec![0u64; last + 1];
                for a in answers.iter().filter(|a| a.end == End::Failed) {
                    failed[(a.at as usize).min(last)] += 1;
                }
                value["worst_second"] = failed.into_iter().max().unwrap_or(0).into();
            }
            ((*name).to_owned(), value)
        })
        .collect();
    Ok(serde_json::Value::Object(report).to_string())
}
