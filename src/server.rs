//! The listeners: accept connections up to `server.max_connections` (all listeners
//! together), end TLS where a listener has it, serve HTTP/1.1 and HTTP/2 on each
//! (hyper-util's auto builder; h2c in plain text, ALPN over TLS) under the connection
//! watchdog's timeouts, reload the configuration (certificates included) on SIGHUP, and
//! on shutdown stop accepting and let in-flight requests and tunnels finish within the
//! grace period.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::Request;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{Notify, Semaphore, watch};
use tokio_rustls::TlsAcceptor;
use tracing::{debug, error, info, warn};

use arc_swap::ArcSwap;

use crate::config::{self, Config, MAX_CONNECTIONS};
use crate::proxy::{ClientConn, Proxy};
use crate::watchdog::{self, DriveError, Timeouts, Watch, WatchedBody, WatchedIo};

/// Connections the kernel queues before `accept`; it caps this at `net.core.somaxconn`.
const LISTEN_BACKLOG: u32 = 4096;
/// Bytes of a response hyper holds for a client that reads slowly (HTTP/1 write
/// buffer), and reads ahead from an upstream: nginx's `proxy_buffers 8 4k`. hyper's
/// default, ~400 KiB each, held about 1.3 MB per client that reads nothing; this, about
/// 155 KB. It bounds an upstream's response head too (a 502 past it; nginx allows 4 or
/// 8 KiB); a client's request head is bounded by `http1_buffer_bytes`.
pub const BUFFER_BYTES: usize = 32 * 1024;
/// Room in an HTTP/1 head beyond its target and header fields: the method, the version,
/// the spaces and line ends, and whitespace hyper does not count.
const HEAD_SLACK_BYTES: usize = 1024;
/// Open files kept for what is not a client connection: the listener, Redis, logs.
const RESERVED_FILES: u64 = 64;

pub struct Server {
    /// One per `listen` entry, in the same order.
    listeners: Vec<TcpListener>,
    /// The admin listener, when `admin.listen` is set.
    admin: Option<TcpListener>,
    running: Arc<Running>,
    max_connections: usize,
    /// SIGHUPs, listened for from `bind` on: one that comes before `run` must not end
    /// the process (the default action) but wait for it.
    hangups: tokio::sync::mpsc::Receiver<()>,
}

/// What every connection, the admin listener and a reload share: the proxy of the
/// configuration in force. A request takes the one current when it arrives and keeps it
/// to its end, so a reload cuts no request short.
pub struct Running {
    proxy: ArcSwap<Proxy>,
    /// Where the configuration is read from on a reload (`None`: no reloads).
    source: Option<PathBuf>,
    /// Why the last reload failed, if it did (cleared by a good one).
    reload_failure: Mutex<Option<String>>,
    /// Reloads asked for through the admin API.
    reloads: Notify,
}

impl Running {
    pub fn proxy(&self) -> Arc<Proxy> {
        self.proxy.load_full()
    }

    pub fn reload_failure(&self) -> Option<String> {
        self.reload_failure.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Asks the server to reload its configuration file (the admin API's `POST /reload`).
    pub fn request_reload(&self) -> bool {
        self.reloads.notify_one();
        self.source.is_some()
    }
}

impl Server {
    /// Raises the open-file limit and binds the configured `listen` address. With a
    /// `source`, SIGHUP (and the admin API's `POST /reload`) reload the configuration
    /// from that file.
    pub async fn bind(config: Config, source: Option<PathBuf>) -> std::io::Result<Server> {
        let max_connections = config.max_connections.unwrap_or_else(|| default_max_connections(open_file_limit()));
        // The error names the address: with two listeners, which one is taken matters.
        let at = |addr: SocketAddr| move |e: std::io::Error| std::io::Error::new(e.kind(), format!("{addr}: {e}"));
        let listeners = config
            .listeners
            .iter()
            .map(|l| listen(l.address).map_err(at(l.address)))
            .collect::<std::io::Result<_>>()?;
        info!(max_connections, "connection limit");
        let admin = match &config.admin {
            Some(admin) => Some(TcpListener::bind(admin.listen).await.map_err(at(admin.listen))?),
            None => None,
        };
        let running = Running {
            proxy: ArcSwap::from_pointee(Proxy::new(config)?),
            source,
            reload_failure: Mutex::new(None),
            reloads: Notify::new(),
        };
        Ok(Server { listeners, admin, running: Arc::new(running), max_connections, hangups: hangups() })
    }

    /// Each listener's bound address, and whether it speaks TLS.
    pub fn local_addrs(&self) -> std::io::Result<Vec<(SocketAddr, bool)>> {
        let proxy = self.running.proxy();
        let tls = |i: usize| proxy.config().listeners.get(i).is_some_and(|l| l.tls.is_some());
        self.listeners.iter().enumerate().map(|(i, l)| Ok((l.local_addr()?, tls(i)))).collect()
    }

    /// Serves until `shutdown` completes, then drains.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        // The watchdog times request headers; hyper's own timer would also cut idle
        // keep-alive connections at `header_read_timeout`.
        builder.http1().header_read_timeout(None).keep_alive(true);
        let admin = self.running.proxy().config().admin.clone();
        if let (Some(listener), Some(admin)) = (self.admin.take(), admin) {
            if let Ok(addr) = listener.local_addr() {
                info!(%addr, "admin listening");
            }
            tokio::spawn(crate::admin::serve(listener, admin, Arc::clone(&self.running)));
        }
        // Established connections keep being served at the cap; new ones wait in the
        // listen backlog until one closes (as nginx does at `worker_connections`).
        let slots = Arc::new(Semaphore::new(self.max_connections));
        let peers = Arc::new(PeerCounts::default());
        let (stop, stopping) = watch::channel(());
        let mut turn = 0;
        tokio::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                accepted = accept(&self.listeners, &slots, &mut turn) => accepted,
                Some(()) = self.hangups.recv() => {
                    self.reload();
                    continue;
                }
                () = self.running.reloads.notified() => {
                    self.reload();
                    continue;
                }
                () = &mut shutdown => break,
            };
            let Some((stream, peer, slot, index)) = accepted else { continue };
            debug!(%peer, "connection accepted");
            let _ = stream.set_nodelay(true);
            let proxy = self.running.proxy();
            let config = proxy.config();
            // Sized from the head limits of the configuration in force when the
            // connection opens (a reload applies to later connections).
            builder.http1().max_buf_size(http1_buffer_bytes(config));
            builder.http2().max_header_list_size(http2_header_list_bytes(config));
            let timeouts = Timeouts {
                header_read: config.header_read_timeout,
                idle: config.idle_timeout,
                send: config.send_timeout,
            };
            // The certificates of the configuration in force: a reload's apply to the
            // connections accepted after it.
            let tls = config.listeners.get(index).and_then(|l| l.tls.as_ref());
            let tls = tls.map(|t| TlsAcceptor::from(Arc::clone(&t.server_config)));
            let stopping = stopping.clone();
            let peer_slot = match config.max_connections_per_ip {
                None => None,
                Some(max) => match peers.take(peer.ip(), max) {
                    Some(place) => Some(place),
                    None => {
                        // Closed at once: waiting would let one host hold the backlog.
                        debug!(%peer, max, "connection refused: max_connections_per_ip");
                        continue;
                    }
                },
            };
            let hold = Arc::new(ConnectionHold { _slot: slot, _draining: stopping.clone(), _peer: peer_slot });
            let serving = Serving { running: Arc::clone(&self.running), builder: builder.clone(), timeouts, stopping };
            tokio::spawn(async move {
                // The handshake counts against `header_read_timeout`, as the first
                // request's headers do: the watch starts before it.
                let watch = Watch::new();
                let Some(acceptor) = tls else {
                    let conn = ClientConn { peer, tls: false, hold };
                    return serving.serve(TokioIo::new(stream), conn, watch).await;
                };
                match tokio::time::timeout(timeouts.header_read, acceptor.accept(stream)).await {
                    Ok(Ok(stream)) => {
                        let conn = ClientConn { peer, tls: true, hold };
                        serving.serve(TokioIo::new(stream), conn, watch).await;
                    }
                    Ok(Err(e)) => debug!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => debug!(%peer, timeout = "header_read_timeout", "TLS handshake not done in time"),
                }
            });
        }
        drop(std::mem::take(&mut self.listeners));
        let grace = self.running.proxy().config().shutdown_grace;
        info!(grace_ms = grace.as_millis() as u64, "shutting down: finishing in-flight requests");
        let _ = stop.send(());
        drop(stopping);
        tokio::select! {
            () = stop.closed() => info!("all connections closed"),
            () = tokio::time::sleep(grace) => warn!("grace period over; closing the remaining connections"),
        }
    }
}

impl Server {
    /// Reloads the configuration from its file (certificates included): all of it or, if
    /// it is invalid or a new `listen` address cannot be bound, none of it (every error is logged, the running
    /// configuration stays, and `/readyz` and `sluicegate_reloads_total` say so).
    fn reload(&mut self) {
        let Some(path) = &self.running.source else {
            warn!("reload asked for, but the configuration was not read from a file");
            return;
        };
        let old = self.running.proxy();
        let fail = |why: String| {
            error!(file = %path.display(), "reload failed; the running configuration stays");
            old.metrics().reload_result(false);
            *self.running.reload_failure.lock().unwrap_or_else(PoisonError::into_inner) = Some(why);
        };
        let config = match config::load(path) {
            Ok(config) => {
                for warning in &config.warnings {
                    warn!("{warning}");
                }
                config
            }
            Err(e) => {
                for line in e.to_string().lines() {
                    error!("{line}");
                }
                return fail(e.to_string());
            }
        };
        let addresses = |c: &Config| c.listeners.iter().map(|l| l.address).collect::<Vec<_>>();
        let listeners = if addresses(&config) == addresses(old.config()) {
            None
        } else {
            let mut bound = Vec::new();
            for address in addresses(&config) {
                match listen(address) {
                    Ok(listener) => bound.push(listener),
                    Err(e) => {
                        error!(addr = %address, error = %e, "cannot listen on the reloaded address");
                        return fail(format!("cannot listen on {address}: {e}"));
                    }
                }
            }
            Some(bound)
        };
        if config.admin.as_ref().map(|a| a.listen) != old.config().admin.as_ref().map(|a| a.listen) {
            warn!("admin.listen changes at the next restart; the admin listener stays where it is");
        }
        if config.workers != old.config().workers {
            warn!("server.workers changes at the next restart; the running threads stay");
        }
        let (proxy, kept, fresh) = match Proxy::reloaded(config, &old) {
            Ok(reloaded) => reloaded,
            Err(e) => {
                error!(error = %e, "cannot open the reloaded access log");
                return fail(format!("cannot open the access log: {e}"));
            }
        };
        proxy.metrics().reload_result(true);
        self.running.proxy.store(Arc::new(proxy));
        *self.running.reload_failure.lock().unwrap_or_else(PoisonError::into_inner) = None;
        info!(file = %path.display(), kept = ?kept, fresh = ?fresh, "configuration reloaded: limits kept their state or started fresh");
        if let Some(listeners) = listeners {
            // Connections accepted on the old addresses are served to their end.
            self.listeners = listeners;
            for (addr, tls) in self.local_addrs().unwrap_or_default() {
                info!(%addr, tls, "listening");
            }
        }
    }
}

/// The runtime that serves: `workers` threads (`None`: one per core, tokio's default).
/// One worker is a current-thread runtime: with a single thread there is no other to
/// hand a task to, and the multi-thread scheduler's cross-thread wake-ups and queues
/// would be pure cost (nginx with `worker_processes 1` likewise runs one event loop).
pub fn runtime(workers: Option<usize>) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = match workers {
        Some(1) => tokio::runtime::Builder::new_current_thread(),
        Some(n) => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(n);
            builder
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    };
    builder.enable_all().build()
}

/// A listener on `addr` with a long accept backlog.
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// SIGHUP, the reload signal of nginx and of `systemctl reload`. Without it (it cannot
/// fail on Unix), no reloads by signal.
fn hangups() -> tokio::sync::mpsc::Receiver<()> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(mut signal) => {
            tokio::spawn(async move {
                while signal.recv().await.is_some() {
                    // One pending reload is enough: it reads the file as it is then.
                    let _ = tx.try_send(());
                }
            });
        }
        Err(e) => warn!(error = %e, "cannot listen for SIGHUP"),
    }
    rx
}

/// What a connection task needs to serve its connection.
struct Serving {
    running: Arc<Running>,
    builder: auto::Builder<TokioExecutor>,
    timeouts: Timeouts,
    stopping: watch::Receiver<()>,
}

impl Serving {
    /// Serves HTTP/1.1 (with upgrades) or HTTP/2 on one client connection under the
    /// watchdog, until it closes or the shutdown's graceful close ends it.
    async fn serve<I>(mut self, io: I, conn: ClientConn, watch: Arc<Watch>)
    where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let peer = conn.peer;
        let (running, requests, conn) = (Arc::clone(&self.running), Arc::clone(&watch), Arc::new(conn));
        let service = service_fn(move |req: Request<Incoming>| {
            let (proxy, conn) = (running.proxy(), Arc::clone(&conn));
            let in_flight = requests.request(req.version());
            async move { Ok::<_, Infallible>(proxy.handle(req, &conn).await.map(|b| WatchedBody::new(b, in_flight))) }
        });
        let io = WatchedIo::new(io, Arc::clone(&watch));
        let connection = self.builder.serve_connection_with_upgrades(io, service);
        // Borrowed, not moved: the receiver must live until the connection ends, as the
        // shutdown waits for every receiver to go.
        let goodbye = |conn: std::pin::Pin<&mut _>| auto::UpgradeableConnection::graceful_shutdown(conn);
        match watchdog::drive(connection, goodbye, &watch, self.timeouts, &mut self.stopping).await {
            Ok(()) => {}
            Err(DriveError::Connection(e)) => debug!(%peer, error = %e, "connection ended with an error"),
            Err(DriveError::Expired(why)) => debug!(%peer, timeout = why.as_str(), "connection closed"),
        }
    }
}

/// What a client connection holds while it lives, and an upgraded connection (a tunnel)
/// after hyper has let it go: its place under `max_connections`, and a receiver of the
/// shutdown signal, which the shutdown waits (at most the grace period) to see dropped.
pub struct ConnectionHold {
    _slot: tokio::sync::OwnedSemaphorePermit,
    _draining: watch::Receiver<()>,
    _peer: Option<PeerSlot>,
}

/// Connections open per client address (`server.max_connections_per_ip`), so that one
/// host cannot take every slot of `max_connections`. An IPv6 client counts by its /64, as
/// it can pick any address in it. Holds only addresses with connections open, so at
/// most `max_connections` entries.
#[derive(Default)]
struct PeerCounts(Mutex<HashMap<IpAddr, usize>>);

/// One connection's place in `PeerCounts`, given back when the connection ends.
struct PeerSlot {
    counts: Arc<PeerCounts>,
    peer: IpAddr,
}

impl PeerCounts {
    /// A place for a connection from `peer`, unless it already holds `max`.
    fn take(self: &Arc<Self>, peer: IpAddr, max: usize) -> Option<PeerSlot> {
        let peer = match peer.to_canonical() {
            IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
            v4 => v4,
        };
        let mut counts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let open = counts.entry(peer).or_insert(0);
        if *open >= max {
            if *open == 0 {
                counts.remove(&peer);
            }
            return None;
        }
        *open += 1;
        Some(PeerSlot { counts: Arc::clone(self), peer })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut counts = self.counts.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(open) = counts.get_mut(&self.peer) {
            *open -= 1;
            if *open == 0 {
                counts.remove(&self.peer);
            }
        }
    }
}

/// The next connection on any of `listeners`, once a slot is free, with the index of
/// its listener; `None` when accepting failed. The listener asked first takes `turn`s,
/// so a busy one cannot starve the others.
async fn accept(
    listeners: &[TcpListener],
    slots: &Arc<Semaphore>,
    turn: &mut usize,
) -> Option<(tokio::net::TcpStream, SocketAddr, tokio::sync::OwnedSemaphorePermit, usize)> {
    // The semaphore is never closed.
    let slot = Arc::clone(slots).acquire_owned().await.ok()?;
    *turn = turn.wrapping_add(1);
    let first = *turn;
    let accepted = std::future::poll_fn(|cx| {
        for i in 0..listeners.len() {
            let index = (first + i) % listeners.len();
            if let std::task::Poll::Ready(result) = listeners[index].poll_accept(cx) {
                return std::task::Poll::Ready((index, result));
            }
        }
        std::task::Poll::Pending
    });
    match accepted.await {
        (index, Ok((stream, peer))) => Some((stream, peer, slot, index)),
        (_, Err(e)) => {
            // Out of file descriptors and the like: back off instead of spinning.
            warn!(error = %e, "accept failed");
            tokio::time::sleep(Duration::from_millis(50)).await;
            None
        }
    }
}

/// Raises the soft open-file limit to the hard one (as nginx's `worker_rlimit_nofile`
/// and Go's runtime do) and returns it.
fn open_file_limit() -> u64 {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => {
            info!(limit, "open-file limit");
            limit
        }
        Err(e) => {
            let limit = rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(1024, |(soft, _)| soft);
            warn!(error = %e, limit, "cannot raise the open-file limit");
            limit
        }
    }
}

/// Each client connection may hold one upstream connection too, so half of the files
/// left after the reserved ones (within what the configuration would accept).
fn default_max_connections(open_files: u64) -> usize {
    let half = (open_files.saturating_sub(RESERVED_FILES) / 2).clamp(1, MAX_CONNECTIONS);
    usize::try_from(half).unwrap_or(1)
}

/// hyper's HTTP/1 buffer must hold a whole request head: one whose target and header
/// fields are within their limits always fits, so that `proxy::head` answers 414 or 431
/// with the limit that was passed. A head too large even for this gets hyper's own 431.
/// The same size bounds the response bytes held for a slow reader: never below
/// `BUFFER_BYTES`.
fn http1_buffer_bytes(config: &Config) -> usize {
    (config.max_header_bytes + config.max_uri_bytes + HEAD_SLACK_BYTES).max(BUFFER_BYTES)
}

/// HTTP/2 counts 32 bytes more per field than `proxy::head` (RFC 9113 §6.5.2), so a
/// section within `max_header_bytes` there (5 bytes or more per field) can count up to
/// 33/5 times as much here; the pseudo-header fields come on top. Past this, h2 answers
/// 431 itself without decoding further.
fn http2_header_list_bytes(config: &Config) -> u32 {
    let bytes = 7 * config.max_header_bytes + config.max_uri_bytes + HEAD_SLACK_BYTES;
    // At most 8 MiB with the limits validation accepts.
    u32::try_from(bytes).unwrap_or(u32::MAX)
}

/// Completes on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_client_counts_by_its_64_and_places_come_back() {
        let counts = Arc::new(PeerCounts::default());
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let a = counts.take(ip("2001:db8:1:2::1"), 2).unwrap();
        let b = counts.take(ip("2001:db8:1:2:ffff::9"), 2).unwrap();
        assert!(counts.take(ip("2001:db8:1:2::77"), 2).is_none(), "the same /64");
        assert!(counts.take(ip("2001:db8:1:3::1"), 2).is_some(), "another /64");
        assert!(counts.take(ip("::ffff:192.0.2.1"), 1).is_some(), "IPv4-mapped counts as IPv4");
        drop((a, b));
        assert!(counts.take(ip("2001:db8:1:2::1"), 2).is_some());
        assert!(counts.0.lock().unwrap().is_empty(), "addresses without connections are forgotten");
    }
}
