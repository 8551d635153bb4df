//! Test helpers: a real backend in the test process, the real `sluicegate` binary as a
//! child process, and a plain HTTP client. Everything listens on 127.0.0.1:0.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, channel::Channel};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};

/// What the backend saw of one request.
#[derive(Clone, Debug)]
pub struct Hit {
    pub at: Instant,
    pub path_and_query: String,
    pub headers: HeaderMap,
    pub version: http::Version,
}

/// An HTTP/1.1 backend. Paths: `/sleep/MS`, `/held` (answers once the test adds a permit
/// to `gate`, so a request stays in flight exactly as long as the test needs, whatever the
/// load), `/status/CODE`, `/large/BYTES` (a body of that many bytes, at most 64 MiB),
/// `/stream` (one chunk, then
/// the rest once `release` is notified), `/echo` (answers the body it received),
/// `/upload` (answers the body's length, notifies
/// `first_frame` when the first data arrives); anything else answers 200 `ok`.
pub struct Backend {
    pub addr: SocketAddr,
    pub hits: Arc<Mutex<Vec<Hit>>>,
    pub release: Arc<Notify>,
    pub first_frame: Arc<Notify>,
    pub gate: Arc<Semaphore>,
    /// The accept loop and every connection, ended by `kill`.
    tasks: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

type TestBody = http_body_util::combinators::BoxBody<Bytes, hyper::Error>;

fn full(status: u16, body: impl Into<Bytes>) -> Response<TestBody> {
    let mut r = Response::new(Full::new(body.into()).map_err(|never| match never {}).boxed());
    *r.status_mut() = StatusCode::from_u16(status).unwrap();
    r
}

/// `len` bytes of `x`, one buffer shared by every response (at most 64 MiB).
fn large(len: usize) -> Bytes {
    static LARGE: std::sync::OnceLock<Bytes> = std::sync::OnceLock::new();
    LARGE.get_or_init(|| Bytes::from(vec![b'x'; 64 << 20])).slice(..len)
}

impl Backend {
    pub async fn start() -> Backend {
        Backend::serve(Wire::Http1).await
    }

    /// The same backend speaking HTTP/2 only, without TLS (h2c, prior knowledge).
    pub async fn start_h2() -> Backend {
        Backend::serve(Wire::Http2).await
    }

    /// The same backend over TLS (HTTP/2 when the client asks for `h2` by ALPN, else
    /// HTTP/1.1), with a certificate for `localhost` and 127.0.0.1 from a private CA made
    /// now; returns the CA's certificate in PEM.
    pub async fn start_tls() -> (Backend, String) {
        Backend::start_tls_for(&["localhost", "127.0.0.1"]).await
    }

    /// The same with a certificate for `names` only.
    pub async fn start_tls_for(names: &[&str]) -> (Backend, String) {
        let (acceptor, ca) = private_ca_acceptor(names);
        (Backend::serve(Wire::Tls(acceptor)).await, ca)
    }

    async fn serve(wire: Wire) -> Backend {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let backend = Backend {
            addr: listener.local_addr().unwrap(),
            hits: Arc::default(),
            release: Arc::default(),
            first_frame: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
            tasks: Arc::default(),
        };
        let (hits, release, first_frame, gate) =
            (backend.hits.clone(), backend.release.clone(), backend.first_frame.clone(), backend.gate.clone());
        let tasks = backend.tasks.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (hits, release, first_frame, gate) =
                    (hits.clone(), release.clone(), first_frame.clone(), gate.clone());
                let service = service_fn(move |req: Request<Incoming>| {
                    let (hits, release, first_frame, gate) =
                        (hits.clone(), release.clone(), first_frame.clone(), gate.clone());
                    async move {
                        let path_and_query = req.uri().path_and_query().map(|p| p.to_string()).unwrap_or_default();
                        hits.lock().unwrap().push(Hit {
                            at: Instant::now(),
                            path_and_query: path_and_query.clone(),
                            headers: req.headers().clone(),
                            version: req.version(),
                        });
                        let path = req.uri().path().to_owned();
                        let response = if let Some(ms) = path.strip_prefix("/sleep/") {
                            tokio::time::sleep(Duration::from_millis(ms.parse().unwrap())).await;
                            full(200, "slept")
                        } else if path == "/held" {
                            gate.acquire().await.unwrap().forget();
                            full(200, "released")
                        } else if let Some(code) = path.strip_prefix("/status/") {
                            let mut r = full(code.parse().unwrap(), format!("status {code}"));
                            r.headers_mut().insert("x-backend", "yes".parse().unwrap());
                            r
                        } else if let Some(len) = path.strip_prefix("/large/") {
                            full(200, large(len.parse().unwrap()))
                        } else if path == "/stream" {
                            let (mut tx, body) = Channel::<Bytes, hyper::Error>::new(1);
                            tokio::spawn(async move {
                                tx.send_data(Bytes::from_static(b"first\n")).await.unwrap();
                                release.notified().await;
                                tx.send_data(Bytes::from_static(b"rest\n")).await.unwrap();
                            });
                            Response::new(body.boxed())
                        } else if path == "/echo" {
                            // What the upstream received as the body, framing taken off.
                            match req.into_body().collect().await {
                                Ok(body) => full(200, body.to_bytes()),
                                Err(_) => full(400, "broken body"),
                            }
                        } else if path == "/upload" {
                            let mut body = req.into_body();
                            let mut total = 0;
                            // A body that breaks off ends the upload; the exchange fails with it.
                            while let Some(Ok(frame)) = body.frame().await {
                                if let Ok(data) = frame.into_data() {
                                    if total == 0 {
                                        first_frame.notify_one();
                                    }
                                    total += data.len();
                                }
                            }
                            full(200, total.to_string())
                        } else {
                            full(200, "ok")
                        };
                        Ok::<_, hyper::Error>(response)
                    }
                });
                let connection = match &wire {
                    Wire::Http1 => tokio::spawn(async move {
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    }),
                    Wire::Http2 => tokio::spawn(async move {
                        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    }),
                    Wire::Tls(acceptor) => {
                        let handshake = acceptor.accept(stream);
                        tokio::spawn(async move {
                            let Ok(stream) = handshake.await else { return };
                            if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
                                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                                    .serve_connection(TokioIo::new(stream), service)
                                    .await;
                            } else {
                                let _ = hyper::server::conn::http1::Builder::new()
                                    .serve_connection(TokioIo::new(stream), service)
                                    .await;
                            }
                        })
                    }
                };
                tasks.lock().unwrap().push(connection.abort_handle());
            }
        });
        backend.tasks.lock().unwrap().push(accept.abort_handle());
        backend
    }

    /// Stops the backend as a crash would: the port refuses connections and open ones
    /// are closed, requests in progress with them.
    pub async fn kill(&self) {
        let tasks: Vec<_> = self.tasks.lock().unwrap().drain(..).collect();
        for task in &tasks {
            task.abort();
        }
        // Aborted tasks end (and close their sockets) when the runtime next runs them.
        for _ in 0..1000 {
            if tasks.iter().all(|t| t.is_finished()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("backend tasks did not end");
    }

    pub fn hits(&self) -> Vec<Hit> {
        self.hits.lock().unwrap().clone()
    }
}

/// What a test backend speaks.
enum Wire {
    Http1,
    Http2,
    Tls(tokio_rustls::TlsAcceptor),
}

/// A TLS acceptor with a certificate for `names` signed by a CA made for this call, and
/// that CA's certificate in PEM.
pub fn private_ca_acceptor(names: &[&str]) -> (tokio_rustls::TlsAcceptor, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone()], rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()))
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    (tokio_rustls::TlsAcceptor::from(Arc::new(config)), ca.pem())
}

/// A running `sluicegate` process; killed on drop.
pub struct Sluicegate {
    pub addr: SocketAddr,
    child: Child,
    log: Arc<Mutex<String>>,
    log_done: Arc<std::sync::atomic::AtomicBool>,
    /// The configuration file it was started with (rewrite it, then `reload`).
    pub config: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

/// Writes `yaml` to a file and runs `sluicegate` with `args` on it.
pub fn config_file(yaml: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sluicegate.yaml");
    std::fs::write(&path, yaml).unwrap();
    (dir, path)
}

pub fn binary() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sluicegate"))
}

impl Sluicegate {
    /// Starts the proxy with `yaml` and waits until it reports its listening address.
    pub fn start(yaml: &str) -> Sluicegate {
        Self::try_start(yaml).unwrap_or_else(|log| panic!("sluicegate did not start; log:\n{log}"))
    }

    /// Starts the proxy in front of `backend`, with `yaml` as written but for `BACKEND`,
    /// which stands for the backend's address: a raw string, no braces to double.
    pub fn in_front_of(backend: &Backend, yaml: &str) -> Sluicegate {
        Sluicegate::start(&yaml.replace("BACKEND", &backend.addr.to_string()))
    }

    /// Starts the proxy with `yaml`: the running process once it reports its listening
    /// address, or its whole log if it exits (or is still silent after 20 s) before that.
    pub fn try_start(yaml: &str) -> Result<Sluicegate, String> {
        Self::try_start_with(yaml, &[])
    }

    /// `try_start` with the environment variables `env` set for the process.
    pub fn try_start_with(yaml: &str, env: &[(&str, &str)]) -> Result<Sluicegate, String> {
        let (dir, path) = config_file(yaml);
        let mut child = binary()
            .envs(env.iter().copied())
            .args(["--log-format", "json", "--log-level", "debug", "-c"])
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let sink = log.clone();
        let log_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let done = log_done.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Ok(json) = serde_json::from_str::<serde_json::Value>(&line)
                    && json["fields"]["message"] == "listening"
                {
                    let _ = tx.send(json["fields"]["addr"].as_str().unwrap().parse::<SocketAddr>().unwrap());
                }
                let mut sink = sink.lock().unwrap();
                sink.push_str(&line);
                sink.push('\n');
            }
            done.store(true, std::sync::atomic::Ordering::Release);
        });
        if let Ok(addr) = rx.recv_timeout(Duration::from_secs(20)) {
            return Ok(Sluicegate { addr, child, log, log_done, config: path, _dir: dir });
        }
        let _ = child.kill();
        let _ = child.wait();
        // The reader sees the end of the pipe once the process is gone.
        while !log_done.load(std::sync::atomic::Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(5));
        }
        Err(log.lock().unwrap().clone())
    }

    /// The names of the process's threads.
    pub fn threads(&self) -> Vec<String> {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", self.child.id())).unwrap();
        tasks.map(|t| std::fs::read_to_string(t.unwrap().path().join("comm")).unwrap().trim().to_owned()).collect()
    }

    /// The resident memory of the process, in bytes.
    pub fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kb = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap();
        kb.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap() * 1024
    }

    /// The log read so far. Lines arrive through a pipe and a reader thread: to see a
    /// line written before a response, use `wait_for_log`.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits (at most 10 s) until `ready` holds for the log, and returns the log; fails
    /// the test, saying `what` was awaited and showing the log, once 10 s have passed.
    pub fn wait_for_log(&self, what: &str, ready: impl Fn(&str) -> bool) -> String {
        const WITHIN: Duration = Duration::from_secs(10);
        let deadline = Instant::now() + WITHIN;
        loop {
            let log = self.log();
            if ready(&log) {
                return log;
            }
            assert!(Instant::now() < deadline, "waited {WITHIN:?} in vain for {what}; the log:\n{log}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The admin listener's address, from its start-up log line.
    pub fn admin_addr(&self) -> SocketAddr {
        let log = self.wait_for_log("the line \"admin listening\"", |log| log.contains("\"admin listening\""));
        let line = log.lines().find(|l| l.contains("\"admin listening\"")).expect("no admin listener in the log");
        let json: serde_json::Value = serde_json::from_str(line).unwrap();
        json["fields"]["addr"].as_str().unwrap().parse().unwrap()
    }

    /// Waits until the process has exited and its log has been read to the end.
    fn wait_for_exit(&mut self) -> ExitStatus {
        let status = self.child.wait().unwrap();
        while !self.log_done.load(std::sync::atomic::Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(5));
        }
        status
    }

    /// Writes `yaml` over the configuration file, sends SIGHUP, and waits (at most 10 s)
    /// for the reload's log line: `configuration reloaded` or `reload failed`. Returns
    /// the log from there on.
    pub fn reload(&self, yaml: &str) -> String {
        let before = self.log().len();
        std::fs::write(&self.config, yaml).unwrap();
        let status = Command::new("kill").args(["-HUP", &self.child.id().to_string()]).status().unwrap();
        assert!(status.success());
        let done =
            |log: &str| log[before..].contains("configuration reloaded") || log[before..].contains("reload failed");
        let log = self.wait_for_log("the reload's line", |log| log.len() > before && done(log));
        log[before..].to_owned()
    }

    /// Kills the process and returns its whole log.
    pub fn kill(&mut self) -> String {
        let _ = self.child.kill();
        self.wait_for_exit();
        self.log()
    }

    /// Sends SIGTERM and waits for the exit.
    pub fn terminate(&mut self) -> ExitStatus {
        self.signal("TERM");
        self.wait_for_exit()
    }

    /// Sends the signal `name` (`TERM`, `INT`, `HUP`).
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill").args([&format!("-{name}"), &self.child.id().to_string()]).status().unwrap();
        assert!(status.success());
    }

    /// Waits (at most `within`) for the process to exit by itself.
    pub fn exits_within(&mut self, within: Duration) -> ExitStatus {
        block_until("the process's exit", within, || self.child.try_wait().unwrap().is_some());
        self.wait_for_exit()
    }
}

impl Drop for Sluicegate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A response read in full.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends one request on a new HTTP/1.1 connection and reads the whole response.
pub async fn request<B>(addr: SocketAddr, req: Request<B>) -> Reply
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let response = send(addr, req).await;
    read(response).await
}

/// Sends one request on a new HTTP/1.1 connection; the body is left to stream.
pub async fn send<B>(addr: SocketAddr, req: Request<B>) -> Response<Incoming>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let exchange = async {
        let stream = TcpStream::connect(addr).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
        tokio::spawn(conn);
        sender.send_request(req).await.unwrap()
    };
    tokio::time::timeout(REPLY_WITHIN, exchange)
        .await
        .unwrap_or_else(|_| panic!("no response head from {addr} within {REPLY_WITHIN:?}"))
}

/// How long a helper waits for a response (its head, then its body) before it fails the
/// test: a proxy that hangs fails the test that met it instead of stalling the suite.
pub const REPLY_WITHIN: Duration = Duration::from_secs(30);

pub async fn read(response: Response<Incoming>) -> Reply {
    let (parts, body) = response.into_parts();
    let body = tokio::time::timeout(REPLY_WITHIN, body.collect())
        .await
        .unwrap_or_else(|_| panic!("the response body did not end within {REPLY_WITHIN:?}"));
    Reply { status: parts.status.as_u16(), headers: parts.headers, body: body.unwrap().to_bytes() }
}

/// `GET path` with extra `headers`, for host `localhost` (which the admin listener
/// answers too, as it answers no other name unless told).
pub async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut req = Request::get(path).header("host", "localhost");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    request(addr, req.body(Full::new(Bytes::new())).unwrap()).await
}

/// Sends one request over HTTP/2 without TLS (h2c, prior knowledge).
/// `GET path` `n` times, one after another: the statuses.
pub async fn futures_statuses(addr: SocketAddr, path: &str, n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(get(addr, path, &[]).await.status);
    }
    out
}

pub async fn get_h2(addr: SocketAddr, path: &str) -> Reply {
    request_h2(addr, Request::get(format!("http://test.local{path}")).body(Full::new(Bytes::new())).unwrap()).await
}

/// A new h2c connection to `addr`, driven on a task of its own.
pub async fn h2c<B>(addr: SocketAddr) -> hyper::client::conn::http2::SendRequest<B>
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    sender
}

/// Sends `req` (an absolute URI: its authority becomes `:authority`) on a new h2c
/// connection and reads the whole response.
pub async fn request_h2(addr: SocketAddr, req: Request<Full<Bytes>>) -> Reply {
    let exchange = async { h2c(addr).await.send_request(req).await.unwrap() };
    let response = tokio::time::timeout(REPLY_WITHIN, exchange)
        .await
        .unwrap_or_else(|_| panic!("no HTTP/2 response head from {addr} within {REPLY_WITHIN:?}"));
    read(response).await
}

/// A backend that answers every connection with `answer` and records what it received:
/// one read (a request head is enough to answer), the answer, then it closes.
pub async fn raw_backend(answer: &'static [u8]) -> (SocketAddr, Arc<Mutex<Vec<u8>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&received);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let n = stream.read(&mut buf).await.unwrap_or(0);
                seen.lock().unwrap().extend_from_slice(&buf[..n]);
                let _ = stream.write_all(answer).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    (addr, received)
}

/// One request a `StrictBackend` read: on which of its connections (0, 1, ... in the
/// order they were accepted), its bytes exactly as they came (head and body), and its
/// request line.
#[derive(Clone, Debug)]
pub struct Seen {
    pub conn: usize,
    pub bytes: Vec<u8>,
    pub line: String,
}

/// A backend that frames requests as strictly as the RFC allows and no more leniently
/// than any server: a head with both `Content-Length` and `Transfer-Encoding`, two
/// `Content-Length` fields (even equal), or a coding other than `chunked` alone ends the
/// connection unanswered and is recorded as `REFUSED`. Every request read is recorded
/// byte for byte and answered with what `answer` makes of its request line; connections
/// are kept alive until the proxy closes them.
pub struct StrictBackend {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// The bytes read so far of the request being read (on the connection that read last).
    reading: Arc<Mutex<Vec<u8>>>,
}

impl StrictBackend {
    pub async fn start(answer: impl Fn(&str) -> Vec<u8> + Send + Sync + 'static) -> StrictBackend {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let reading: Arc<Mutex<Vec<u8>>> = Arc::default();
        let answer = Arc::new(answer);
        let (record, partial) = (Arc::clone(&seen), Arc::clone(&reading));
        tokio::spawn(async move {
            let mut conn = 0;
            while let Ok((stream, _)) = listener.accept().await {
                let record = (Arc::clone(&record), Arc::clone(&partial));
                tokio::spawn(strict_connection(stream, conn, record, Arc::clone(&answer)));
                conn += 1;
            }
        });
        StrictBackend { addr, seen, reading }
    }

    /// The bytes read so far of the request it is reading now (head and body as they
    /// came), before it is complete or cut short and recorded in `seen`.
    pub fn reading(&self) -> Vec<u8> {
        self.reading.lock().unwrap().clone()
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The request lines it read, in order.
    pub fn lines(&self) -> Vec<String> {
        self.seen().into_iter().map(|s| s.line).collect()
    }
}

/// Where a `StrictBackend`'s connections record what they read: each request read
/// (`seen`), and the bytes of the one being read (`reading`).
type StrictRecord = (Arc<Mutex<Vec<Seen>>>, Arc<Mutex<Vec<u8>>>);

/// Serves one connection of a `StrictBackend`.
async fn strict_connection<F: Fn(&str) -> Vec<u8>>(
    mut stream: TcpStream,
    conn: usize,
    (seen, reading): StrictRecord,
    answer: Arc<F>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = Vec::new();
    loop {
        // The head.
        let (head_len, line, framing) = loop {
            let mut fields = [httparse::EMPTY_HEADER; 64];
            let mut req = httparse::Request::new(&mut fields);
            match req.parse(&buf) {
                Ok(httparse::Status::Complete(len)) => {
                    let line = format!("{} {}", req.method.unwrap_or(""), req.path.unwrap_or(""));
                    let named = |n: &str| req.headers.iter().filter(|h| h.name.eq_ignore_ascii_case(n)).count();
                    let value =
                        |n: &str| req.headers.iter().find(|h| h.name.eq_ignore_ascii_case(n)).map(|h| h.value.to_vec());
                    let framing = match (named("content-length"), named("transfer-encoding")) {
                        (0, 0) => Some(StrictFraming::Length(0)),
                        (1, 0) => std::str::from_utf8(&value("content-length").unwrap())
                            .ok()
                            .and_then(|v| v.parse().ok())
                            .map(StrictFraming::Length),
                        (0, 1) if value("transfer-encoding").unwrap() == b"chunked" => Some(StrictFraming::Chunked),
                        _ => None,
                    };
                    break (len, line, framing);
                }
                Ok(httparse::Status::Partial) => {}
                Err(_) => break (buf.len(), "REFUSED".to_owned(), None),
            }
            let mut more = [0u8; 4096];
            match stream.read(&mut more).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    buf.extend_from_slice(&more[..n]);
                    *reading.lock().unwrap() = buf.clone();
                }
            }
        };
        let Some(framing) = framing else {
            seen.lock().unwrap().push(Seen { conn, bytes: buf, line: "REFUSED".to_owned() });
            return;
        };
        // The body, as its framing says.
        let end = loop {
            if let Some(end) = framing.end(&buf[head_len..]) {
                break head_len + end;
            }
            let mut more = [0u8; 4096];
            match stream.read(&mut more).await {
                Ok(0) | Err(_) => {
                    seen.lock().unwrap().push(Seen { conn, bytes: buf, line: format!("{line} (cut short)") });
                    return;
                }
                Ok(n) => {
                    buf.extend_from_slice(&more[..n]);
                    *reading.lock().unwrap() = buf.clone();
                }
            }
        };
        let bytes: Vec<u8> = buf.drain(..end).collect();
        seen.lock().unwrap().push(Seen { conn, bytes, line: line.clone() });
        if stream.write_all(&answer(&line)).await.is_err() {
            return;
        }
    }
}

#[derive(Clone, Copy)]
enum StrictFraming {
    Length(usize),
    Chunked,
}

impl StrictFraming {
    /// Where the body that starts `body` ends, once all of it is there.
    fn end(self, body: &[u8]) -> Option<usize> {
        match self {
            StrictFraming::Length(n) => (body.len() >= n).then_some(n),
            StrictFraming::Chunked => {
                let mut at = 0;
                loop {
                    let line_end = body[at..].windows(2).position(|w| w == b"\r\n")? + at;
                    let size = std::str::from_utf8(&body[at..line_end]).ok()?;
                    let size = usize::from_str_radix(size.split(';').next()?, 16).ok()?;
                    at = line_end + 2;
                    if size == 0 {
                        // The trailer section, to its empty line.
                        let rest = &body[at..];
                        return match rest.starts_with(b"\r\n") {
                            true => Some(at + 2),
                            false => rest.windows(4).position(|w| w == b"\r\n\r\n").map(|p| at + p + 4),
                        };
                    }
                    if body.len() < at + size + 2 {
                        return None;
                    }
                    at += size + 2;
                }
            }
        }
    }
}

/// A port on which nothing listens (bound, then released), below the kernel's ephemeral
/// range (32768 and up by default): a port the test then listens on is not taken
/// meanwhile as the source port of some other test's outgoing connection.
pub fn closed_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let seed = std::process::id().wrapping_mul(7919);
    for _ in 0..1000 {
        let port = 20_000 + (seed.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed) * 61) % 12_000) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port from 20000 to 31999");
}

/// Writes `bytes` on a new connection and reads until the server closes it: every use
/// expects the server to close (after a refusal, or a `Connection: close`), and the test
/// fails, showing what was read, if it has not within 5 s. A connection the server resets
/// after answering counts as closed.
pub async fn raw_exchange(addr: SocketAddr, bytes: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const WITHIN: Duration = Duration::from_secs(5);
    let mut out = Vec::new();
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        // The server may refuse and close before it has read all: what it answered counts.
        let _ = stream.write_all(bytes).await;
        let mut piece = [0u8; 16 * 1024];
        loop {
            match stream.read(&mut piece).await {
                Ok(0) | Err(_) => return,
                Ok(n) => out.extend_from_slice(&piece[..n]),
            }
        }
    };
    if tokio::time::timeout(WITHIN, exchange).await.is_err() {
        panic!("the server did not close the connection within {WITHIN:?}; read: {:?}", String::from_utf8_lossy(&out));
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `check` on `yaml`: its exit code (None: killed by a signal) and stderr, the file's
/// path written `FILE`. Bounded: a check that hangs fails the test instead of stalling it.
pub fn check_bounded(yaml: &str) -> (Option<i32>, String) {
    let (dir, path) = config_file(yaml);
    let stderr_path = dir.path().join("stderr");
    let stderr = std::fs::File::create(&stderr_path).unwrap();
    let mut child = binary().arg("check").arg("-c").arg(&path).stdout(Stdio::null()).stderr(stderr).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("check did not finish within 20 s on:\n{yaml}");
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    (status.code(), stderr.replace(&path.display().to_string(), "FILE"))
}

/// Waits until `condition` holds, looking every 10 ms; fails the test, saying `what` was
/// awaited, once `within` has passed. The one way a test waits for an event.
pub async fn wait_until(what: &str, within: Duration, mut condition: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !condition().await {
        assert!(Instant::now() < deadline, "waited {within:?} in vain for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `wait_until` for a test (or helper) that runs on a plain thread.
pub fn block_until(what: &str, within: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !condition() {
        assert!(Instant::now() < deadline, "waited {within:?} in vain for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One scrape of a `/metrics` page.
pub struct Metrics(pub String);

impl Metrics {
    /// `/metrics` of `sg`, whose configuration has an admin listener.
    pub async fn of(sg: &Sluicegate) -> Metrics {
        let reply = get(sg.admin_addr(), "/metrics", &[]).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        Metrics(reply.text())
    }

    /// The value of the sample `series` (its name with its labels, as exposed), if any.
    pub fn get(&self, series: &str) -> Option<f64> {
        self.0.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')).map(|v| v.trim().parse().unwrap())
    }

    /// The value of the sample `series`; the test fails, showing the page, without it.
    pub fn value(&self, series: &str) -> f64 {
        self.get(series).unwrap_or_else(|| panic!("no {series} in\n{}", self.0))
    }
}

/// A test configuration, built: `listen: 127.0.0.1:0`, the settings the test gives, its
/// upstream, its limits and its routes, each written as the YAML it stands for.
#[derive(Default)]
pub struct Conf {
    top: String,
    limits: String,
    routes: String,
}

impl Conf {
    pub fn new() -> Conf {
        Conf::default()
    }

    /// A top-level setting, as its YAML line (`ratelimit_headers: all`).
    pub fn set(mut self, line: &str) -> Conf {
        self.top.push_str(line);
        self.top.push('\n');
        self
    }

    /// An admin listener on a free port (`Sluicegate::admin_addr`).
    pub fn admin(self) -> Conf {
        self.set("admin: { listen: 127.0.0.1:0 }")
    }

    /// Clients' addresses from `X-Forwarded-For`, sent by the test from 127.0.0.1.
    pub fn behind_proxy(self) -> Conf {
        self.set("trusted_proxies: [127.0.0.1]")
    }

    /// The Redis at `url` as the store of global limits, with `options` (`timeout: 1s`).
    pub fn redis(self, url: &str, options: &str) -> Conf {
        self.set(&format!("redis: {{ url: \"{url}\", {options} }}"))
    }

    /// `backend` as upstream `b`.
    pub fn upstream(self, backend: &Backend) -> Conf {
        self.set(&format!("upstreams:\n  b: {{ servers: [\"{}\"] }}", backend.addr))
    }

    /// Limit `name`, `fields` the inside of its `{ }`.
    pub fn limit(mut self, name: &str, fields: &str) -> Conf {
        self.limits.push_str(&format!("  {name}: {{ {fields} }}\n"));
        self
    }

    /// A route, `fields` the inside of its `{ }`.
    pub fn route(mut self, fields: &str) -> Conf {
        self.routes.push_str(&format!("  - {{ {fields} }}\n"));
        self
    }

    /// A route for every request, decided by `limits` (`l, m`), answered `200` by the proxy.
    pub fn answering(self, limits: &str) -> Conf {
        self.route(&format!("limits: [{limits}], respond: {{ status: 200 }}"))
    }

    /// A route for every request, decided by `limits`, forwarded to upstream `b`.
    pub fn forwarding(self, limits: &str) -> Conf {
        self.route(&format!("limits: [{limits}], upstream: b"))
    }

    pub fn yaml(&self) -> String {
        let limits = if self.limits.is_empty() { String::new() } else { format!("limits:\n{}", self.limits) };
        format!("listen: 127.0.0.1:0\n{}{limits}routes:\n{}", self.top, self.routes)
    }

    pub fn start(&self) -> Sluicegate {
        Sluicegate::start(&self.yaml())
    }
}

/// Sends `POST PATH` with `Expect: 100-continue` and a five-byte body (`hello`) only once
/// `100 Continue` came, as a client that waits does; returns the rest of the answer,
/// read until the connection closes.
pub async fn post_after_100_continue(addr: SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut interim = [0u8; 25];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut interim)).await.unwrap().unwrap();
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    stream.write_all(b"hello").await.unwrap();
    let mut rest = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut rest)).await.unwrap().unwrap();
    rest
}
