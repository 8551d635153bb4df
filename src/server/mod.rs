//! The listeners: accept connections up to `server.max_connections` (all listeners
//! together), end TLS where a listener has it, serve each connection (HTTP/1.x by
//! sluicegate's engine, `wire::h1`; HTTP/2 by hyper, `wire::h2`: h2c after the HTTP/1 engine saw its
//! preface, `h2` by ALPN over TLS), reload the configuration (certificates included) on
//! SIGHUP, and on shutdown stop accepting and let in-flight requests and tunnels finish
//! within the grace period.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio_rustls::TlsAcceptor;
use tracing::{debug, error, info, warn};

use crate::config::{self, Config, MAX_CONNECTIONS};
use crate::persist;
use crate::proxy::Proxy;
use crate::proxy::body::Settling;
use crate::running::{ReloadCause, Running};
use crate::wire::connection::{ClientConn, ConnectionHold, PeerCounts};
use crate::wire::http1::server::HeadLimits;
use crate::wire::message::Service;
use crate::wire::{Timeouts, h1, h2};

mod workers;
use workers::Workers;

/// Connections the kernel queues before `accept`; it caps this at `net.core.somaxconn`.
const LISTEN_BACKLOG: u32 = 4096;
/// Room in an HTTP/1 head beyond its target and header fields: the method, the version,
/// the spaces and line ends.
const HEAD_SLACK_BYTES: usize = 1024;
/// Open files kept for what is not a client connection: the listener, Redis, logs.
const RESERVED_FILES: u64 = 64;

pub struct Server {
    /// One per `listen` entry, in the same order.
    listeners: Vec<TcpListener>,
    /// The admin listener, when `admin.listen` is set, until `run` serves it.
    admin: Option<TcpListener>,
    /// The admin listener being served: the addresses it was configured with and bound
    /// to (they differ for port 0), and its task's handle, so that a reload that moves or
    /// removes it can stop it.
    admin_served: Option<([SocketAddr; 2], tokio::task::AbortHandle)>,
    /// The admin API, made once: its dashboard keeps its history across reloads.
    admin_service: Option<Arc<crate::admin::AdminService>>,
    running: Arc<Running>,
    max_connections: usize,
    /// SIGHUPs, listened for from `bind` on: one that comes before `run` must not end
    /// the process (the default action) but wait for it.
    hangups: tokio::sync::mpsc::Receiver<()>,
}

impl Server {
    /// Raises the open-file limit and binds the configured `listen` address. With a
    /// `source`, SIGHUP (and the admin API's `POST /reload`) reload the configuration
    /// from that file.
    pub async fn bind(config: Config, source: Option<PathBuf>) -> std::io::Result<Server> {
        let max_connections =
            config.server.max_connections.unwrap_or_else(|| default_max_connections(open_file_limit()));
        // The error names the field and the address: with two listeners, which one is
        // taken matters.
        let at = |field: &'static str, addr: SocketAddr| {
            move |e: std::io::Error| std::io::Error::new(e.kind(), format!("{field}: cannot listen on {addr}: {e}"))
        };
        let listeners = config
            .listeners
            .iter()
            .map(|l| listen(l.address).map_err(at("listen", l.address)))
            .collect::<std::io::Result<_>>()?;
        info!(max_connections, "connection limit");
        let admin = match &config.admin {
            Some(admin) => Some(TcpListener::bind(admin.listen).await.map_err(at("admin.listen", admin.listen))?),
            None => None,
        };
        let secret = persist::secret(&config);
        let proxy = Proxy::new(config, secret)?;
        persist::restore(proxy.limiters(), proxy.config());
        crate::admin::overrides::restore(&proxy);
        let running = Running::new(proxy, source);
        Ok(Server {
            listeners,
            admin,
            admin_served: None,
            admin_service: None,
            running: Arc::new(running),
            max_connections,
            hangups: hangups(),
        })
    }

    /// Each listener's bound address, and whether it speaks TLS.
    pub fn local_addrs(&self) -> std::io::Result<Vec<(SocketAddr, bool)>> {
        let proxy = self.running.proxy();
        let tls = |i: usize| proxy.config().listeners.get(i).is_some_and(|l| l.tls.is_some());
        self.listeners.iter().enumerate().map(|(i, l)| Ok((l.local_addr()?, tls(i)))).collect()
    }

    /// Serves until `shutdown` completes, then drains.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        if let Some(listener) = self.admin.take() {
            self.serve_admin(listener);
        }
        // Established connections keep being served at the cap; new ones wait in the
        // listen backlog until one closes (as nginx does at `worker_connections`).
        let writer = Arc::new(persist::Writer::default());
        let keeping = tokio::spawn(persist::keep(Arc::clone(&self.running), Arc::clone(&writer)));
        let slots = Arc::new(Semaphore::new(self.max_connections));
        let (stop, stopping) = watch::channel(());
        // One worker serves on this runtime; more, each on a thread and runtime of its own.
        let workers = match crate::worker::count(self.running.proxy().config().server.workers) {
            1 => None,
            count => match Workers::start(count) {
                Ok(workers) => Some(workers),
                Err(e) => {
                    error!(error = %e, "cannot start the worker threads; serving on one");
                    None
                }
            },
        };
        let mut accepting = Accepting { running: Arc::clone(&self.running), peers: Arc::default(), stopping, workers };
        let mut turn = 0;
        tokio::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                accepted = accept(&self.listeners, &slots, &mut turn) => accepted,
                Some(()) = self.hangups.recv() => {
                    self.reload(ReloadCause::Signal);
                    continue;
                }
                () = self.running.reload_requested() => {
                    self.reload(ReloadCause::AdminApi);
                    continue;
                }
                () = &mut shutdown => break,
            };
            if let Some((stream, peer, slot, listener)) = accepted {
                accepting.connection(stream, peer, slot, listener);
            }
        }
        let Accepting { stopping, workers, .. } = accepting;
        drop(std::mem::take(&mut self.listeners));
        let grace = self.running.proxy().config().server.shutdown_grace;
        info!(grace_ms = grace.as_millis() as u64, "shutting down: finishing in-flight requests");
        let _ = stop.send(());
        drop(stopping);
        tokio::select! {
            () = stop.closed() => info!("all connections closed"),
            () = tokio::time::sleep(grace) => warn!("grace period over; closing the remaining connections"),
        }
        // What is still served past the grace period ends with the workers.
        drop(workers);
        // Last, so that the state written holds every request that was let finish.
        keeping.abort();
        writer.write(self.running.proxy()).await;
    }
}

impl Server {
    /// Serves the admin API on `listener`, bound to the configuration's `admin.listen`,
    /// in place of the listener served so far, if any.
    fn serve_admin(&mut self, listener: TcpListener) {
        let proxy = self.running.proxy();
        let Some(admin) = &proxy.config().admin else { return };
        let bound = listener.local_addr().unwrap_or(admin.listen);
        info!(addr = %bound, "admin listening");
        if admin.insecure && admin.token.is_none() {
            warn!(addr = %bound, "the admin API has no token (admin.insecure: true): whoever reaches this address can reload the configuration, reset keys and lift bans");
        }
        let running = &self.running;
        let service =
            self.admin_service.get_or_insert_with(|| Arc::new(crate::admin::AdminService::new(Arc::clone(running))));
        let task = tokio::spawn(serve_admin(listener, Arc::clone(service), Arc::clone(running)));
        if let Some((_, before)) = self.admin_served.replace(([admin.listen, bound], task.abort_handle())) {
            before.abort();
        }
    }

    /// Reloads the configuration from its file (certificates included): all of it or, if
    /// it is invalid or a new `listen` address cannot be bound, none of it (every error is logged, the running
    /// configuration stays, and `/readyz` and `sluicegate_reloads_total` say so). `cause`
    /// is what asked for it, for the dashboard.
    /// A candidate asked to be promoted takes the place of the file: its text, as
    /// loaded, is the configuration, and its file the one read from then on.
    fn reload(&mut self, cause: ReloadCause) {
        let promoting = self.running.take_promoting();
        let cause = if promoting.is_some() { ReloadCause::Promote } else { cause };
        let Some(path) = promoting.as_ref().map(|c| c.file.clone()).or_else(|| self.running.source()) else {
            warn!("reload asked for, but the configuration was not read from a file");
            return;
        };
        let path = path.as_path();
        let old = self.running.proxy();
        let fail = |why: String| {
            error!(file = %path.display(), "reload failed; the running configuration stays");
            old.metrics().reload_result(false);
            self.running.reload_failed(why, cause);
        };
        let loaded = match &promoting {
            Some(candidate) => candidate.config_again(),
            None => config::load(path),
        };
        let mut config = match loaded {
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
                        return fail(format!("listen: cannot listen on {address}: {e}"));
                    }
                }
            }
            Some(bound)
        };
        // The admin listener moves with `admin.listen` (bound before anything changes, so
        // that an address that cannot be had fails the reload); its token and settings are
        // read by each call and connection.
        let admin_listen = config.admin.as_ref().map(|a| a.listen);
        let admin = match admin_listen {
            // (The address it is bound to, written out in place of port 0, is no move.)
            Some(address) if !self.admin_served.as_ref().is_some_and(|(served, _)| served.contains(&address)) => {
                match listen(address) {
                    Ok(listener) => Some(listener),
                    Err(e) => {
                        error!(addr = %address, error = %e, "cannot listen on the reloaded admin address");
                        return fail(format!("admin.listen: cannot listen on {address}: {e}"));
                    }
                }
            }
            _ => None,
        };
        if config.server.workers != old.config().server.workers {
            warn!("server.workers changes at the next restart; the running threads stay");
            // What is sized by the workers (the upstream pool's share of each) follows
            // the threads that run, not the file.
            config.server.workers = old.config().server.workers;
        }
        let (proxy, kept, fresh) = match Proxy::reloaded(config, &old, promoting.as_deref()) {
            Ok(reloaded) => reloaded,
            Err(e) => {
                error!(error = %e, "cannot open the reloaded access log");
                return fail(e.to_string());
            }
        };
        proxy.metrics().reload_result(true);
        if promoting.is_some() {
            self.running.promoted(path.to_path_buf());
            info!(file = %path.display(), "candidate promoted: its file is the configuration from now on");
        }
        self.running.reloaded(proxy, cause);
        if let Some(listener) = admin {
            self.serve_admin(listener);
        } else if admin_listen.is_none()
            && let Some(([_, addr], task)) = self.admin_served.take()
        {
            info!(%addr, "admin listener closed: the configuration has none");
            task.abort();
        }
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

/// The runtime the process runs on: one thread. It accepts connections and serves
/// them itself when `server.workers` is 1; with more workers it hands each to one of
/// them (`Workers`, started by `Server::run`) and keeps the rest: the admin API,
/// reloads, Redis connections, timers of the state kept. One thread per event loop, as
/// nginx runs one per worker process: a multi-thread scheduler's cross-thread wake-ups
/// and queues would be pure cost.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build()
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

/// What every accepted connection is set up with.
struct Accepting {
    running: Arc<Running>,
    /// Connections open per client address.
    peers: Arc<PeerCounts>,
    stopping: watch::Receiver<()>,
    /// The worker threads connections are handed to; `None`: served on this runtime.
    workers: Option<Workers>,
}

impl Accepting {
    /// Sets up the connection `stream` from `peer`, accepted on listener `listener`
    /// while it holds `slot` of `max_connections`, under the configuration in force now
    /// (a reload applies to later connections): its place among its address's
    /// connections, its timeouts and head limits, TLS; then serves it in a task of its
    /// own.
    fn connection(&mut self, mut stream: TcpStream, peer: SocketAddr, slot: OwnedSemaphorePermit, listener: usize) {
        debug!(%peer, "connection accepted");
        let _ = stream.set_nodelay(true);
        let proxy = self.running.proxy();
        let config = proxy.config();
        let peer_slot = match config.server.max_connections_per_ip {
            None => None,
            Some(max) => match self.peers.take(peer.ip(), max) {
                Some(place) => Some(place),
                None => {
                    // Closed at once: waiting would let one host hold the backlog.
                    debug!(%peer, max, "connection refused: max_connections_per_ip");
                    return;
                }
            },
        };
        let hold = ConnectionHold::new(slot, peer_slot);
        let settings = settings(config);
        let tls = config.listeners.get(listener).and_then(|l| l.tls.as_ref());
        let tls = tls.map(|t| TlsAcceptor::from(Arc::clone(&t.server_config)));
        // With workers, the connection is handed to the next in turn: its socket leaves
        // this runtime's event loop for the worker's, and its task runs there.
        let _worker = match &mut self.workers {
            None => None,
            Some(workers) => {
                let worker = workers.next().enter();
                match stream.into_std().and_then(TcpStream::from_std) {
                    Ok(moved) => stream = moved,
                    Err(e) => return debug!(%peer, error = %e, "connection lost on its way to a worker"),
                }
                Some(worker)
            }
        };
        let (service, stopping) = (Arc::clone(&self.running), self.stopping.clone());
        let Some(acceptor) = tls else {
            let conn = ClientConn::new(peer, false, stopping, hold);
            tokio::spawn(h1::serve(stream, conn, service, settings));
            return;
        };
        // Boxed within: a TLS session's state is large, and a plain connection's task
        // must not carry room for it.
        tokio::spawn(Box::pin(async move {
            // The handshake counts against `header_read_timeout`, as the first request's
            // headers do.
            let timeouts = settings.timeouts;
            match tokio::time::timeout(timeouts.header_read, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => {
                    let conn = ClientConn::new(peer, true, stopping.clone(), hold);
                    if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
                        let h2 = settings.h2.unwrap_or(h2::H2Settings { max_header_list_size: 16 << 10 });
                        return h2::serve(stream, conn, service, h2, timeouts, stopping).await;
                    }
                    // HTTP/2 over TLS is chosen by ALPN only (RFC 9113 §3.3).
                    h1::serve(stream, conn, service, h1::Settings { h2: None, ..settings }).await;
                }
                Ok(Err(e)) => debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => debug!(%peer, timeout = "header_read_timeout", "TLS handshake not done in time"),
            }
        }));
    }
}

/// The bounds of the request heads `config`'s HTTP/1 connections read. A head whose
/// target and header fields are within their limits always fits, so that the front
/// answers 414 or 431 with the limit that was passed; one too large even for this is
/// refused while it is read.
pub fn head_limits(config: &Config) -> HeadLimits {
    let bytes = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    HeadLimits {
        line: bytes(config.server.max_uri_bytes + HEAD_SLACK_BYTES),
        head: bytes(config.server.max_header_bytes + config.server.max_uri_bytes + HEAD_SLACK_BYTES),
    }
}

/// How the connections of `config` are served: its timeouts, its head limits.
fn settings(config: &Config) -> h1::Settings {
    h1::Settings {
        timeouts: Timeouts {
            header_read: config.server.header_read_timeout,
            idle: config.server.idle_timeout,
            send: config.server.send_timeout,
        },
        head: head_limits(config),
        h2: Some(h2::H2Settings { max_header_list_size: http2_header_list_bytes(config) }),
    }
}

/// Serves the admin listener until the process ends or a reload moves it, each
/// connection with the settings of the configuration in force when it comes.
async fn serve_admin(listener: TcpListener, service: Arc<crate::admin::AdminService>, running: Arc<Running>) {
    // Admin connections are not counted against `max_connections`, and shutdown does not
    // wait for them: their shutdown signal never comes.
    let (_never, stopping) = watch::channel(());
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                warn!(error = %e, "admin accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let settings = settings(running.proxy().config());
        let (service, stopping) = (Arc::clone(&service), stopping.clone());
        tokio::spawn(async move {
            let conn = ClientConn::unheld(peer, stopping);
            h1::serve(stream, conn, service, settings).await;
        });
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

/// HTTP/2 counts 32 bytes more per field than `front::size` (RFC 9113 §6.5.2), so a
/// section within `max_header_bytes` there (5 bytes or more per field) can count up to
/// 33/5 times as much here; the pseudo-header fields come on top. Past this, h2 answers
/// 431 itself without decoding further.
fn http2_header_list_bytes(config: &Config) -> u32 {
    let bytes = 7 * config.server.max_header_bytes + config.server.max_uri_bytes + HEAD_SLACK_BYTES;
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

/// The proxy answers requests with the configuration in force when each arrives.
impl Service for Running {
    type Body = Settling;

    fn call<'a>(
        &'a self,
        request: crate::wire::message::Request<'a>,
        conn: &'a ClientConn,
    ) -> impl Future<Output = crate::wire::message::Response<Settling>> + Send + 'a {
        // The proxy in force now, owned by the request's future: no future wraps it.
        self.proxy().handle(request, conn)
    }
}

/// A TLS connection's client closed its side when its socket's did (a `close_notify`
/// still unread counts as something sent).
impl crate::wire::connection::PeerClosed for tokio_rustls::server::TlsStream<TcpStream> {
    fn peer_closed(&self) -> bool {
        self.get_ref().0.peer_closed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection between requests holds its socket, its timer and a few words: what
    /// a request, a refusal, a tunnel or HTTP/2 need is boxed while it lasts. 688 bytes
    /// now: tokio's task around it (80 bytes of its own, aligned to 128) is 768 bytes. The
    /// bound is the goal's (a kept-alive connection within 1.5 KiB: 1,232-1,286 B measured,
    /// docs/performance.md), not today's figure.
    #[tokio::test]
    async fn a_connection_waiting_for_a_request_stays_small() {
        let config = config::parse("listen: 127.0.0.1:0\nroutes:\n  - respond: { status: 200 }\n", "t").unwrap();
        let settings = settings(&config);
        let running = Running::new(Proxy::new(config, crate::limit::secret::KeySecret::draw()).unwrap(), None);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (_stop, stopping) = watch::channel(());
        let conn = ClientConn::unheld("127.0.0.1:1".parse().unwrap(), stopping);
        let serving = h1::serve(stream, conn, Arc::new(running), settings);
        assert!(std::mem::size_of_val(&serving) <= 944, "{} bytes", std::mem::size_of_val(&serving));
    }
}
