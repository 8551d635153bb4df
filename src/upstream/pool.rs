//! Keep-alive connections to the servers of one upstream, driven with hyper's
//! connection-level client. A request checks an idle HTTP/1.1 connection out (or makes
//! one) and sends on it; its response body puts the connection back once read to the
//! end. HTTP/2 shares one connection per server among all requests.
//!
//! Hand-written rather than hyper-util's pooled client: that one passes each request
//! through its pool's checkout machinery and, for every HTTP/1 response, spawns a task
//! that waits for the connection to be idle again before pooling it. A list of idle
//! senders does without both (see README's *Performance* for what that saved). Each
//! connection still runs in a task of its own: driving it from the request's task
//! instead polled both connections on every wake-up of either and cost more.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use http::uri::{Authority, Scheme};
use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper::client::conn::{TrySendError, http1, http2};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tower_service::Service;

use super::connect::{Connector, UpstreamIo};
use super::error::SendError;
use super::retry::AttemptBody;

/// Bytes of a response hyper holds for a client that reads slowly (HTTP/1 write
/// buffer), and reads ahead from an upstream: nginx's `proxy_buffers 8 4k`. hyper's
/// default, ~400 KiB each, held about 1.3 MB per client that reads nothing; this, about
/// 155 KB. It bounds an upstream's response head too (a 502 past it; nginx allows 4 or
/// 8 KiB); a client's request head is bounded by `http1_buffer_bytes`.
pub const BUFFER_BYTES: usize = 32 * 1024;

/// Idle keep-alive connections to a server are closed after this long (the reaper looks
/// every half of it, so one lives at most one and a half times this).
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

pub struct Pool {
    inner: Arc<Inner>,
}

struct Inner {
    connector: Connector,
    http2: bool,
    /// hyper's read and write buffer per HTTP/1 connection.
    buffer_bytes: usize,
    /// HTTP/1.1 connections with no request on them, by server, most recently used
    /// last; plain ones, then TLS ones. Keyed by the address as written: `Authority`'s
    /// own hash and equality go byte by byte, case-folded, which cost more per request
    /// than everything else the pool does (callgrind).
    idle: [Mutex<ByServer<Vec<Idle>>>; 2],
    /// The HTTP/2 connection of each server, plain then TLS.
    shared: [Mutex<ByServer<http2::SendRequest<AttemptBody>>>; 2],
}

/// A server, as the pool files its connections.
#[derive(Clone)]
struct Key {
    server: Authority,
    tls: bool,
}

/// By server address, hashed with foldhash rather than std's SipHash: the addresses come
/// from the configuration and DNS, not from clients, and SipHash's two hashes per
/// request (checkout, give back) showed in the instruction counts (README, *Performance*).
type ByServer<T> = HashMap<Box<str>, T, foldhash::fast::RandomState>;

struct Idle {
    sender: http1::SendRequest<AttemptBody>,
    since: Instant,
}

/// A connection lent to a request until its response body has been read to the end.
/// Dropped before that, it closes the connection (the rest of the body is still on it).
pub struct Checkout {
    inner: Arc<Inner>,
    key: Key,
    sender: http1::SendRequest<AttemptBody>,
}

impl Pool {
    pub fn new(connector: Connector, http2: bool, buffer_bytes: usize) -> Self {
        let inner =
            Arc::new(Inner { connector, http2, buffer_bytes, idle: Default::default(), shared: Default::default() });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(reap(Arc::downgrade(&inner)));
        }
        Pool { inner }
    }

    /// Sends `req` to `server` (over TLS when `tls`); the response comes with the
    /// connection to give back once its body is done (`None` for HTTP/2, whose
    /// connection is shared). An HTTP/1 request goes in origin form, an HTTP/2 one with
    /// its scheme and authority (`:scheme`, `:authority`).
    pub async fn send(
        &self,
        server: &Authority,
        tls: bool,
        mut req: Request<AttemptBody>,
    ) -> Result<(Response<Incoming>, Option<Checkout>), SendError> {
        let key = Key { server: server.clone(), tls };
        if self.inner.http2 {
            // Boxed, like the connects below: what is rare stays out of the future
            // every request moves around.
            return Box::pin(self.send_h2(key, req)).await.map(|response| (response, None));
        }
        loop {
            let (mut sender, reused) = match self.inner.checkout(&key) {
                Some(sender) => (sender, true),
                None => (Box::pin(self.connect_h1(&key)).await?, false),
            };
            // A pooled connection that is still finishing its last exchange gets ready
            // in a moment; one the server closed meanwhile is dropped for the next.
            if sender.ready().await.is_err() && reused {
                continue;
            }
            match sender.try_send_request(req).await {
                Ok(response) => {
                    let checkout = Checkout { inner: Arc::clone(&self.inner), key, sender };
                    return Ok((response, Some(checkout)));
                }
                // Closed before a byte of the request was written: hyper gives it back,
                // and it goes on another connection, as hyper-util's client does.
                Err(e) => req = unsent(e, reused)?,
            }
        }
    }

    async fn send_h2(&self, key: Key, mut req: Request<AttemptBody>) -> Result<Response<Incoming>, SendError> {
        loop {
            let shared = lock(key.shared(&self.inner)).get(key.server.as_str()).filter(|s| !s.is_closed()).cloned();
            let (mut sender, reused) = match shared {
                Some(sender) => (sender, true),
                None => {
                    let sender = self.connect_h2(&key).await?;
                    lock(key.shared(&self.inner)).insert(key.server.as_str().into(), sender.clone());
                    (sender, false)
                }
            };
            if sender.ready().await.is_err() && reused {
                lock(key.shared(&self.inner)).remove(key.server.as_str());
                continue;
            }
            match sender.try_send_request(req).await {
                Ok(response) => return Ok(response),
                Err(e) => req = unsent(e, reused)?,
            }
        }
    }

    async fn connect(&self, key: &Key) -> Result<UpstreamIo, SendError> {
        let scheme = if key.tls { Scheme::HTTPS } else { Scheme::HTTP };
        let uri = Uri::builder().scheme(scheme).authority(key.server.clone()).path_and_query("/").build();
        let uri = uri.map_err(|e| SendError::Connect(e.into()))?;
        self.inner.connector.clone().call(uri).await.map_err(SendError::Connect)
    }

    async fn connect_h1(&self, key: &Key) -> Result<http1::SendRequest<AttemptBody>, SendError> {
        let io = self.connect(key).await?;
        let (sender, connection) = http1::Builder::new().max_buf_size(self.inner.buffer_bytes).handshake(io).await?;
        // Its errors reach the request on it; upgrades (`101`) hand the connection over.
        tokio::spawn(async move { _ = connection.with_upgrades().await });
        Ok(sender)
    }

    async fn connect_h2(&self, key: &Key) -> Result<http2::SendRequest<AttemptBody>, SendError> {
        let io = self.connect(key).await?;
        let (sender, connection) =
            http2::Builder::new(TokioExecutor::new()).timer(TokioTimer::new()).handshake(io).await?;
        tokio::spawn(async move { _ = connection.await });
        Ok(sender)
    }
}

/// The request back from a send that wrote nothing of it, to go on another connection;
/// else the error. A fresh connection that fails so is not tried again.
fn unsent(mut error: TrySendError<Request<AttemptBody>>, reused: bool) -> Result<Request<AttemptBody>, SendError> {
    match error.take_message() {
        Some(req) if reused => Ok(req),
        _ => Err(SendError::Exchange(error.into_error())),
    }
}

impl Inner {
    fn checkout(&self, key: &Key) -> Option<http1::SendRequest<AttemptBody>> {
        let mut idle = lock(key.idle(self));
        let list = idle.get_mut(key.server.as_str())?;
        while let Some(conn) = list.pop() {
            if !conn.sender.is_closed() {
                return Some(conn.sender);
            }
        }
        None
    }

    /// Closes the connections idle for longer than `IDLE_TIMEOUT`.
    fn expire(&self, now: Instant) {
        for idle in &self.idle {
            let mut idle = lock(idle);
            for list in idle.values_mut() {
                list.retain(|c| now.saturating_duration_since(c.since) < IDLE_TIMEOUT && !c.sender.is_closed());
            }
            idle.retain(|_, list| !list.is_empty());
        }
    }
}

impl Key {
    fn idle<'a>(&self, inner: &'a Inner) -> &'a Mutex<ByServer<Vec<Idle>>> {
        &inner.idle[usize::from(self.tls)]
    }

    fn shared<'a>(&self, inner: &'a Inner) -> &'a Mutex<ByServer<http2::SendRequest<AttemptBody>>> {
        &inner.shared[usize::from(self.tls)]
    }
}

impl Checkout {
    /// The response body was read to its end: the connection takes the next request.
    pub fn give_back(self) {
        if self.sender.is_closed() {
            return;
        }
        let idle = Idle { sender: self.sender, since: Instant::now() };
        let mut pool = lock(self.key.idle(&self.inner));
        match pool.get_mut(self.key.server.as_str()) {
            Some(list) => list.push(idle),
            None => _ = pool.insert(self.key.server.as_str().into(), vec![idle]),
        }
    }
}

async fn reap(pool: std::sync::Weak<Inner>) {
    let mut tick = tokio::time::interval(IDLE_TIMEOUT / 2);
    loop {
        tick.tick().await;
        let Some(pool) = pool.upgrade() else { return };
        pool.expire(Instant::now());
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Lists of connections, valid whatever a panicking holder left.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
