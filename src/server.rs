//! The listener: accepts connections up to `server.max_connections`, serves HTTP/1.1 and
//! h2c on each (hyper-util's auto builder) under the connection watchdog's timeouts, and
//! on shutdown stops accepting and lets in-flight requests finish within the grace period.

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
use tracing::{debug, info, warn};

use crate::config::{Config, MAX_CONNECTIONS};
use crate::proxy::Proxy;
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
    listener: TcpListener,
    /// The admin listener, when `admin.listen` is set.
    admin: Option<TcpListener>,
    proxy: Arc<Proxy>,
    max_connections: usize,
}

impl Server {
    /// Raises the open-file limit and binds the configured `listen` address.
    pub async fn bind(config: Config) -> std::io::Result<Server> {
        let max_connections = config.max_connections.unwrap_or_else(|| default_max_connections(open_file_limit()));
        // The error names the address: with two listeners, which one is taken matters.
        let at = |addr: SocketAddr| move |e: std::io::Error| std::io::Error::new(e.kind(), format!("{addr}: {e}"));
        let listen = || -> std::io::Result<TcpListener> {
            let socket = if config.listen.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
            socket.set_reuseaddr(true)?;
            socket.bind(config.listen)?;
            socket.listen(LISTEN_BACKLOG)
        };
        let listener = listen().map_err(at(config.listen))?;
        info!(max_connections, "connection limit");
        let admin = match &config.admin {
            Some(admin) => Some(TcpListener::bind(admin.listen).await.map_err(at(admin.listen))?),
            None => None,
        };
        Ok(Server { listener, admin, proxy: Arc::new(Proxy::new(config)), max_connections })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
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
        // Established connections keep being served at the cap; new ones wait in the
        // listen backlog until one closes (as nginx does at `worker_connections`).
        let slots = Arc::new(Semaphore::new(self.max_connections));
        let (stop, stopping) = watch::channel(());
        tokio::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                accepted = accept(&self.listener, &slots) => accepted,
                () = &mut shutdown => break,
            };
            let Some((stream, peer, slot)) = accepted else { continue };
            debug!(%peer, "connection accepted");
            let _ = stream.set_nodelay(true);
            let proxy = Arc::clone(&self.proxy);
            let watch = Watch::new();
            let requests = Arc::clone(&watch);
            let service = service_fn(move |req: Request<Incoming>| {
                let proxy = Arc::clone(&proxy);
                let in_flight = requests.request(req.version());
                async move { Ok::<_, Infallible>(proxy.handle(req, peer).await.map(|b| WatchedBody::new(b, in_flight))) }
            });
            let io = WatchedIo::new(TokioIo::new(stream), Arc::clone(&watch));
            let connection = builder.serve_connection(io, service).into_owned();
            let mut stopping = stopping.clone();
            tokio::spawn(async move {
                // Borrowed, not moved: the receiver must live until the connection ends,
                // as the shutdown waits for every receiver to go.
                let shutdown = async {
                    let _ = stopping.changed().await;
                };
                let goodbye = |conn: std::pin::Pin<&mut _>| auto::Connection::graceful_shutdown(conn);
                match watchdog::drive(connection, goodbye, &watch, timeouts, shutdown).await {
                    Ok(()) => {}
                    Err(DriveError::Connection(e)) => debug!(%peer, error = %e, "connection ended with an error"),
                    Err(DriveError::Expired(why)) => debug!(%peer, timeout = why.as_str(), "connection closed"),
                }
                drop((slot, stopping));
            });
        }
        drop(self.listener);
        info!(grace_ms = grace.as_millis() as u64, "shutting down: finishing in-flight requests");
        let _ = stop.send(());
        drop(stopping);
        tokio::select! {
            () = stop.closed() => info!("all connections closed"),
            () = tokio::time::sleep(grace) => warn!("grace period over; closing the remaining connections"),
        }
    }
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
