//! The listener: accepts connections up to `server.max_connections`, serves HTTP/1.1 and
//! h2c on each (hyper-util's auto builder) under the connection watchdog's timeouts, and
//! on shutdown stops accepting and lets in-flight requests finish within the grace period.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
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
use tracing::{debug, error, info, warn};

use arc_swap::ArcSwap;

use crate::config::{self, Config, MAX_CONNECTIONS};
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
    running: Arc<Running>,
    max_connections: usize,
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
        let listener = listen(config.listen)?;
        info!(max_connections, "connection limit");
        let admin = match &config.admin {
            Some(admin) => Some(TcpListener::bind(admin.listen).await?),
            None => None,
        };
        let running = Running {
            proxy: ArcSwap::from_pointee(Proxy::new(config)?),
            source,
            reload_failure: Mutex::new(None),
            reloads: Notify::new(),
        };
        Ok(Server { listener, admin, running: Arc::new(running), max_connections })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` completes, then drains.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        // The watchdog times request headers; hyper's own timer would also cut idle
        // keep-alive connections at `header_read_timeout`.
        builder.http1().header_read_timeout(None).keep_alive(true).max_buf_size(BUFFER_BYTES);
        let admin = self.running.proxy().config().admin.clone();
        if let (Some(listener), Some(admin)) = (self.admin.take(), admin) {
            if let Ok(addr) = listener.local_addr() {
                info!(%addr, "admin listening");
            }
            tokio::spawn(crate::admin::serve(listener, admin, Arc::clone(&self.running)));
        }
        let mut hangups = hangups();
        // Established connections keep being served at the cap; new ones wait in the
        // listen backlog until one closes (as nginx does at `worker_connections`).
        let slots = Arc::new(Semaphore::new(self.max_connections));
        let (stop, stopping) = watch::channel(());
        tokio::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                accepted = accept(&self.listener, &slots) => accepted,
                Some(()) = hangups.recv() => {
                    self.reload();
                    continue;
                }
                () = self.running.reloads.notified() => {
                    self.reload();
                    continue;
                }
                () = &mut shutdown => break,
            };
            let Some((stream, peer, slot)) = accepted else { continue };
            debug!(%peer, "connection accepted");
            let _ = stream.set_nodelay(true);
            let config = self.running.proxy.load();
            let config = config.config();
            let timeouts = Timeouts {
                header_read: config.header_read_timeout,
                idle: config.idle_timeout,
                send: config.send_timeout,
            };
            let running = Arc::clone(&self.running);
            let watch = Watch::new();
            let requests = Arc::clone(&watch);
            let service = service_fn(move |req: Request<Incoming>| {
                let proxy = running.proxy();
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
    /// Reloads the configuration from its file: all of it or, if it is invalid or its
    /// `listen` address cannot be bound, none of it (every error is logged, the running
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
            Ok(config) => config,
            Err(e) => {
                for line in e.to_string().lines() {
                    error!("{line}");
                }
                return fail(e.to_string());
            }
        };
        let listener = if config.listen == old.config().listen {
            None
        } else {
            match listen(config.listen) {
                Ok(listener) => Some(listener),
                Err(e) => {
                    error!(addr = %config.listen, error = %e, "cannot listen on the reloaded address");
                    return fail(format!("cannot listen on {}: {e}", config.listen));
                }
            }
        };
        if config.admin.as_ref().map(|a| a.listen) != old.config().admin.as_ref().map(|a| a.listen) {
            warn!("admin.listen changes at the next restart; the admin listener stays where it is");
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
        if let Some(listener) = listener {
            if let Ok(addr) = listener.local_addr() {
                info!(%addr, "listening");
            }
            // Connections accepted on the old address are served to their end.
            self.listener = listener;
        }
    }
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
