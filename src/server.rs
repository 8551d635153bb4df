//! The listeners: accept connections up to `server.max_connections` (all listeners
//! together), end TLS where a listener has it, serve HTTP/1.1 and HTTP/2 on each
//! (hyper-util's auto builder; h2c in plain text, ALPN over TLS) under the connection
//! watchdog's timeouts, and on shutdown stop accepting and let in-flight requests and
//! tunnels finish within the grace period.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::Request;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{Semaphore, watch};
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

use crate::config::{Config, MAX_CONNECTIONS};
use crate::proxy::{ClientConn, Proxy};
use crate::watchdog::{self, DriveError, Timeouts, Watch, WatchedBody, WatchedIo};

/// Connections the kernel queues before `accept`; it caps this at `net.core.somaxconn`.
const LISTEN_BACKLOG: u32 = 4096;
/// Bytes of a response hyper holds for a client that reads slowly (HTTP/1 write
/// buffer), and reads ahead from an upstream: nginx's `proxy_buffers 8 4k`. hyper's
/// default, ~400 KiB each, held about 1.3 MB per client that reads nothing; this, about
/// 155 KB. It bounds an HTTP/1 request head too (hyper answers 431 past it), and an
/// upstream's response head (a 502 past it; nginx allows 4 or 8 KiB).
pub const BUFFER_BYTES: usize = 32 * 1024;
/// Open files kept for what is not a client connection: the listener, Redis, logs.
const RESERVED_FILES: u64 = 64;

pub struct Server {
    listeners: Vec<(TcpListener, Option<TlsAcceptor>)>,
    /// The admin listener, when `admin.listen` is set.
    admin: Option<TcpListener>,
    proxy: Arc<Proxy>,
    max_connections: usize,
}

/// What every connection of every listener shares.
struct Shared {
    proxy: Arc<Proxy>,
    builder: auto::Builder<TokioExecutor>,
    timeouts: Timeouts,
    /// Established connections keep being served at the cap; new ones wait in the
    /// listen backlog until one closes (as nginx does at `worker_connections`).
    slots: Arc<Semaphore>,
}

impl Server {
    /// Raises the open-file limit and binds every configured listener.
    pub async fn bind(config: Config) -> std::io::Result<Server> {
        let max_connections = config.max_connections.unwrap_or_else(|| default_max_connections(open_file_limit()));
        let mut listeners = Vec::with_capacity(config.listeners.len());
        for listener in &config.listeners {
            let address = listener.address;
            let socket = if address.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
            socket.set_reuseaddr(true)?;
            socket.bind(address)?;
            let tls = listener.tls.as_ref().map(|tls| TlsAcceptor::from(Arc::clone(&tls.server_config)));
            listeners.push((socket.listen(LISTEN_BACKLOG)?, tls));
        }
        info!(max_connections, "connection limit");
        let admin = match &config.admin {
            Some(admin) => Some(TcpListener::bind(admin.listen).await?),
            None => None,
        };
        Ok(Server { listeners, admin, proxy: Arc::new(Proxy::new(config)), max_connections })
    }

    /// Each listener's bound address, and whether it speaks TLS.
    pub fn local_addrs(&self) -> std::io::Result<Vec<(SocketAddr, bool)>> {
        self.listeners.iter().map(|(l, tls)| Ok((l.local_addr()?, tls.is_some()))).collect()
    }

    /// Serves until `shutdown` completes, then drains.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let config = self.proxy.config();
        let timeouts =
            Timeouts { header_read: config.header_read_timeout, idle: config.idle_timeout, send: config.send_timeout };
        let mut builder = auto::Builder::new(TokioExecutor::new());
        // The watchdog times request headers; hyper's own timer would also cut idle
        // keep-alive connections at `header_read_timeout`.
        builder.http1().header_read_timeout(None).keep_alive(true).max_buf_size(BUFFER_BYTES);
        let grace = config.shutdown_grace;
        if let (Some(listener), Some(admin)) = (self.admin, &config.admin) {
            if let Ok(addr) = listener.local_addr() {
                info!(%addr, "admin listening");
            }
            tokio::spawn(crate::admin::serve(listener, admin.clone(), Arc::clone(&self.proxy)));
        }
        let slots = Arc::new(Semaphore::new(self.max_connections));
        let shared = Arc::new(Shared { proxy: Arc::clone(&self.proxy), builder, timeouts, slots });
        let (stop, stopping) = watch::channel(());
        for (listener, tls) in self.listeners {
            tokio::spawn(accept_loop(listener, tls, Arc::clone(&shared), stopping.clone()));
        }
        shutdown.await;
        info!(grace_ms = grace.as_millis() as u64, "shutting down: finishing in-flight requests");
        // The accept loops end (closing their listeners) and every connection starts
        // its graceful shutdown.
        let _ = stop.send(());
        drop(stopping);
        tokio::select! {
            () = stop.closed() => info!("all connections closed"),
            () = tokio::time::sleep(grace) => warn!("grace period over; closing the remaining connections"),
        }
    }
}

/// Accepts on one listener until the shutdown, each connection in its own task.
async fn accept_loop(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    shared: Arc<Shared>,
    mut stopping: watch::Receiver<()>,
) {
    loop {
        let accepted = tokio::select! {
            accepted = accept(&listener, &shared.slots) => accepted,
            _ = stopping.changed() => return,
        };
        let Some((stream, peer, slot)) = accepted else { continue };
        debug!(%peer, "connection accepted");
        let _ = stream.set_nodelay(true);
        let hold = Arc::new(ConnectionHold { _slot: slot, _draining: stopping.clone() });
        let (shared, stopping) = (Arc::clone(&shared), stopping.clone());
        match tls.clone() {
            None => {
                let conn = ClientConn { peer, tls: false, hold };
                tokio::spawn(serve(TokioIo::new(stream), conn, Watch::new(), shared, stopping));
            }
            Some(acceptor) => {
                tokio::spawn(async move {
                    // The handshake counts against `header_read_timeout`, as the first
                    // request's headers do: the watch starts now.
                    let watch = Watch::new();
                    let handshake = tokio::time::timeout(shared.timeouts.header_read, acceptor.accept(stream));
                    match handshake.await {
                        Ok(Ok(stream)) => {
                            let conn = ClientConn { peer, tls: true, hold };
                            serve(TokioIo::new(stream), conn, watch, shared, stopping).await;
                        }
                        Ok(Err(e)) => debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => debug!(%peer, timeout = "header_read_timeout", "TLS handshake not done in time"),
                    }
                });
            }
        }
    }
}

/// Serves HTTP/1.1 (with upgrades) or HTTP/2 on one client connection under the
/// watchdog, until it closes or the shutdown's graceful close ends it.
async fn serve<I>(io: I, conn: ClientConn, watch: Arc<Watch>, shared: Arc<Shared>, mut stopping: watch::Receiver<()>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let peer = conn.peer;
    let (proxy, requests, conn) = (Arc::clone(&shared.proxy), Arc::clone(&watch), Arc::new(conn));
    let service = service_fn(move |req: Request<Incoming>| {
        let (proxy, conn) = (Arc::clone(&proxy), Arc::clone(&conn));
        let in_flight = requests.request(req.version());
        async move { Ok::<_, Infallible>(proxy.handle(req, &conn).await.map(|b| WatchedBody::new(b, in_flight))) }
    });
    let io = WatchedIo::new(io, Arc::clone(&watch));
    let connection = shared.builder.serve_connection_with_upgrades(io, service);
    // Borrowed, not moved: the receiver must live until the connection ends, as the
    // shutdown waits for every receiver to go.
    let shutdown = async {
        let _ = stopping.changed().await;
    };
    let goodbye = |conn: std::pin::Pin<&mut _>| auto::UpgradeableConnection::graceful_shutdown(conn);
    match watchdog::drive(connection, goodbye, &watch, shared.timeouts, shutdown).await {
        Ok(()) => {}
        Err(DriveError::Connection(e)) => debug!(%peer, error = %e, "connection ended with an error"),
        Err(DriveError::Expired(why)) => debug!(%peer, timeout = why.as_str(), "connection closed"),
    }
}

/// What a client connection holds while it lives, and an upgraded connection (a tunnel)
/// after hyper has let it go: its place under `max_connections`, and a receiver of the
/// shutdown signal, which the shutdown waits (at most the grace period) to see dropped.
pub struct ConnectionHold {
    _slot: tokio::sync::OwnedSemaphorePermit,
    _draining: watch::Receiver<()>,
}

/// The next connection, once a slot is free; `None` when accepting failed.
async fn accept(
    listener: &TcpListener,
    slots: &Arc<Semaphore>,
) -> Option<(tokio::net::TcpStream, SocketAddr, tokio::sync::OwnedSemaphorePermit)> {
    // The semaphore is never closed.
    let slot = Arc::clone(slots).acquire_owned().await.ok()?;
    match listener.accept().await {
        Ok((stream, peer)) => Some((stream, peer, slot)),
        Err(e) => {
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
