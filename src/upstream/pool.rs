//! Keep-alive connections to the servers of one upstream. A request checks an idle
//! HTTP/1.1 connection out (or makes one), drives its exchange on it from its own task,
//! and gives it back once the response body has been read to its end; a connection given
//! back is a socket and nothing else (no task, no buffer). HTTP/2 (`http2: true`) shares
//! one hyper connection per server among all requests.
//!
//! A server may close an idle connection at any time. A connection checked out is first
//! looked at without blocking: one the server closed (or wrote to unasked) is dropped
//! for the next, so that a request is rarely sent on a connection already gone. The
//! cheap look sees what the runtime has seen of the socket; a request that could not be
//! sent again on a new connection (`Take::IdleChecked`) asks the socket itself.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use http::uri::Authority;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::connect::{Connector, UpstreamIo};
use super::error::SendError;
use super::h2::H2Body;
use crate::metrics::PoolMetrics;

/// The largest response head read from a server (a 502 past it): nginx reads heads into
/// one `proxy_buffer_size` of 4 or 8 KiB; this leaves room for large cookies.
pub const MAX_RESPONSE_HEAD: usize = 32 * 1024;

/// Idle keep-alive connections to a server are closed after this long (the reaper looks
/// every half of it, so one lives at most one and a half times this).
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

pub struct Pool {
    inner: Arc<Inner>,
}

struct Inner {
    connector: Connector,
    /// Idle connections kept per server, at most, shared evenly between the workers (a
    /// worker keeps its share, at least one: nginx's `keepalive` is per worker process,
    /// this is the total unless there are more workers): one given back past a worker's
    /// share closes its oldest idle one (the newest are the likeliest still open at the
    /// server).
    keepalive: usize,
    metrics: PoolMetrics,
    /// Per worker (`crate::worker`), the HTTP/1.1 connections with no request on them
    /// that it opened, by server, most recently used last; plain ones, then TLS ones. A
    /// connection's socket is registered with the runtime of the worker that opened it,
    /// which is woken by its readiness: used by another, each response would cross
    /// threads. Keyed by the address as written: `Authority`'s own hash and equality go
    /// byte by byte, case-folded, which cost more per request than everything else the
    /// pool does.
    idle: Box<[IdleLists]>,
    /// The HTTP/2 connection of each server, plain then TLS.
    shared: [Mutex<ByServer<http2::SendRequest<H2Body>>>; 2],
}

/// A connection's timer for its exchanges (boxed: a timer is pinned where it lies).
pub type ExchangeTimer = Pin<Box<tokio::time::Sleep>>;

/// A worker's idle connections, plain then TLS.
type IdleLists = [Mutex<ByServer<Vec<Idle>>>; 2];

/// By server address, hashed with foldhash rather than std's SipHash: the addresses come
/// from the configuration and DNS, not from clients.
type ByServer<T> = HashMap<Box<str>, T, foldhash::fast::RandomState>;

struct Idle {
    io: UpstreamIo,
    /// Its exchanges' timer, kept with it.
    timer: Option<ExchangeTimer>,
    since: Instant,
}

/// A server, as the pool files its connections.
#[derive(Clone)]
struct Key {
    server: Authority,
    tls: bool,
}

/// Which connection a request takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Take {
    /// An idle one the runtime has not seen closed, else a new one: for a request that
    /// can be sent again on a new connection should this one turn out to be gone.
    Idle,
    /// An idle one its socket says is open (a look that costs a system call: the
    /// runtime may not yet have taken in a close the kernel has), else a new one: for a
    /// request that cannot be sent again (RFC 9110 §9.2.2).
    IdleChecked,
    /// A new one.
    New,
}

/// An HTTP/1.1 connection lent to one exchange. `give_back` it once the exchange ended
/// cleanly (the response read to its end, the server willing); dropped before, it is
/// closed.
pub struct Checkout {
    /// `None` once taken over.
    io: Option<UpstreamIo>,
    inner: Arc<Inner>,
    key: Key,
    /// It came from the pool: it served another exchange before.
    pub reused: bool,
    /// The worker whose runtime its socket is registered with: it goes back to that
    /// worker's idle connections.
    home: usize,
    /// What times the wait for its answers: the connection's own, made by its first
    /// exchange and reset by each. A deadline later than the one set before is one
    /// atomic store in tokio's timer, where a timer set and dropped per exchange was a
    /// registration in the timer wheel and its removal, each under the wheel's lock.
    pub timer: Option<ExchangeTimer>,
}

impl Pool {
    /// A pool for `workers` worker threads.
    pub fn new(connector: Connector, keepalive: usize, workers: usize, metrics: PoolMetrics) -> Self {
        let idle = (0..workers.max(1)).map(|_| IdleLists::default()).collect();
        let inner = Arc::new(Inner { connector, keepalive, metrics, idle, shared: Default::default() });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(reap(Arc::downgrade(&inner)));
        }
        Pool { inner }
    }

    /// An HTTP/1.1 connection to `server` (over TLS when `tls`), as `take` says.
    pub async fn checkout(&self, server: &Authority, tls: bool, take: Take) -> Result<Checkout, SendError> {
        let key = Key { server: server.clone(), tls };
        let worker = crate::worker::index() % self.inner.idle.len();
        if take != Take::New
            && let Some((idle, home)) = self.inner.take_idle(&key, worker, take == Take::IdleChecked)
        {
            let Idle { io, timer, .. } = idle;
            return Ok(Checkout { io: Some(io), inner: Arc::clone(&self.inner), key, reused: true, home, timer });
        }
        // Boxed: what is rare stays out of the future every request moves around.
        let io = Box::pin(self.inner.connector.connect(server, tls)).await.map_err(SendError::Connect)?;
        Ok(Checkout { io: Some(io), inner: Arc::clone(&self.inner), key, reused: false, home: worker, timer: None })
    }

    /// The HTTP/2 connection to `server`, shared by every request to it: the open one,
    /// or a new one.
    pub async fn h2(&self, server: &Authority, tls: bool) -> Result<http2::SendRequest<H2Body>, SendError> {
        let key = Key { server: server.clone(), tls };
        let shared = &self.inner.shared[usize::from(tls)];
        if let Some(sender) = lock(shared).get(server.as_str()).filter(|s| !s.is_closed()) {
            return Ok(sender.clone());
        }
        let io = self.inner.connector.connect(&key.server, tls).await.map_err(SendError::Connect)?;
        let (sender, connection) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .handshake(TokioIo::new(io))
            .await
            .map_err(SendError::H2)?;
        // Its errors reach the requests on it.
        tokio::spawn(async move { _ = connection.await });
        lock(shared).insert(server.as_str().into(), sender.clone());
        Ok(sender)
    }
}

impl Inner {
    /// Worker `worker`'s share of `keepalive`: the shares add up to it, but none is
    /// below one (a worker keeping none would open a connection for each of its
    /// requests, however few).
    fn share(&self, worker: usize) -> usize {
        if self.keepalive == 0 {
            return 0;
        }
        let workers = self.idle.len();
        (self.keepalive / workers + usize::from(worker < self.keepalive % workers)).max(1)
    }

    /// The most recently used idle connection to `key` that is still open (its socket
    /// asked when `checked`), and the worker it belongs to: one of `worker`'s own, else
    /// one another worker keeps (rather than a new connection).
    fn take_idle(&self, key: &Key, worker: usize, checked: bool) -> Option<(Idle, usize)> {
        if let Some(idle) = self.take_idle_of(worker, key, checked) {
            return Some((idle, worker));
        }
        let workers = self.idle.len();
        (1..workers)
            .map(|i| (worker + i) % workers)
            .find_map(|home| Some((self.take_idle_of(home, key, checked)?, home)))
    }

    /// The most recently used idle connection to `key` of worker `home` that is still open.
    fn take_idle_of(&self, home: usize, key: &Key, checked: bool) -> Option<Idle> {
        let mut idle = lock(&self.idle[home][usize::from(key.tls)]);
        let list = idle.get_mut(key.server.as_str())?;
        while let Some(mut conn) = list.pop() {
            self.metrics.idle.dec();
            if still_open(&mut conn.io) && (!checked || socket_open(&conn.io)) {
                return Some(conn);
            }
        }
        None
    }

    /// Closes the connections idle for longer than `IDLE_TIMEOUT`.
    fn expire(&self, now: Instant) {
        for idle in self.idle.iter().flatten() {
            let mut idle = lock(idle);
            for list in idle.values_mut() {
                let before = list.len();
                list.retain(|c| now.saturating_duration_since(c.since) < IDLE_TIMEOUT);
                self.metrics.idle.dec_by(gauge_value(before - list.len()));
            }
            idle.retain(|_, list| !list.is_empty());
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let idle: usize = self.idle.iter().flatten().map(|idle| lock(idle).values().map(Vec::len).sum::<usize>()).sum();
        self.metrics.idle.dec_by(gauge_value(idle));
    }
}

fn gauge_value(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Whether an idle connection is still open: a look at its socket that never waits. A
/// closed one reads its end (or an error); one the server wrote to unasked is out of step.
fn still_open(io: &mut UpstreamIo) -> bool {
    let mut byte = [0u8; 1];
    match io {
        // Asked of tokio's readiness first: while nothing came, no system call and no
        // waker to register (a poll would register one, for 140 instructions a request).
        UpstreamIo::Plain(tcp) => matches!(tcp.try_read(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock),
        // TLS may hold bytes already read and decrypted: its stream is polled.
        UpstreamIo::Tls(_) => {
            let mut cx = Context::from_waker(Waker::noop());
            let mut buf = ReadBuf::new(&mut byte);
            matches!(Pin::new(io).poll_read(&mut cx, &mut buf), Poll::Pending)
        }
    }
}

/// Whether the socket under `io` is open and has nothing to read, as the kernel says
/// now: a peek that never blocks (the socket is non-blocking). Bytes waiting (a TLS
/// alert, a response nobody asked for) make it out of step, as a close does.
fn socket_open(io: &UpstreamIo) -> bool {
    let tcp = match io {
        UpstreamIo::Plain(tcp) => tcp,
        UpstreamIo::Tls(tls) => tls.get_ref().0,
    };
    let mut byte = [std::mem::MaybeUninit::<u8>::uninit()];
    matches!(socket2::SockRef::from(tcp).peek(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

impl Checkout {
    /// The exchange on it ended cleanly: back to the pool now, for the next request
    /// (what is left of this one, its response going out to the client, needs it no
    /// more; given back later, a client's next request could find the pool empty and
    /// open another).
    pub fn give_back(&mut self) {
        let Some(io) = self.io.take() else { return };
        let inner = &*self.inner;
        let share = inner.share(self.home);
        if share == 0 {
            inner.metrics.idle_closed.inc();
            return;
        }
        let idle = Idle { io, timer: self.timer.take(), since: Instant::now() };
        let mut pool = lock(&inner.idle[self.home][usize::from(self.key.tls)]);
        let oldest = match pool.get_mut(self.key.server.as_str()) {
            Some(list) => {
                let oldest = (list.len() >= share).then(|| list.remove(0));
                list.push(idle);
                oldest
            }
            None => {
                pool.insert(self.key.server.as_str().into(), vec![idle]);
                None
            }
        };
        drop(pool);
        match oldest {
            // Closed outside the lock.
            Some(oldest) => {
                inner.metrics.idle_closed.inc();
                drop(oldest);
            }
            None => _ = inner.metrics.idle.inc(),
        }
    }

    /// The connection itself, taken over (an upgrade makes it a tunnel).
    pub fn into_io(mut self) -> Option<UpstreamIo> {
        self.io.take()
    }

    fn io(&mut self) -> io::Result<&mut UpstreamIo> {
        self.io.as_mut().ok_or_else(|| io::ErrorKind::NotConnected.into())
    }
}

impl AsyncRead for Checkout {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.get_mut().io()?).poll_read(cx, buf)
    }
}

impl AsyncWrite for Checkout {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(self.get_mut().io()?).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(self.get_mut().io()?).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.as_ref().is_some_and(UpstreamIo::is_write_vectored)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.get_mut().io()?).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.get_mut().io()?).poll_shutdown(cx)
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

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// A connection to a server of our own, and the server's end of it.
    async fn pair() -> (UpstreamIo, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (UpstreamIo::Plain(client), server)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_close_the_runtime_has_not_taken_in_yet_is_seen_by_asking_the_socket() {
        let (mut io, server) = pair().await;
        assert!(still_open(&mut io) && socket_open(&io), "an open, quiet connection");
        drop(server);
        // No await since the close: the runtime has not polled its events, so only the
        // socket knows. A request that cannot be sent again must not take it.
        assert!(still_open(&mut io), "the runtime's view lags (what made the race)");
        assert!(!socket_open(&io), "the kernel has the close");
    }

    /// Each worker keeps the connections it opened, up to its share of `keepalive`, and
    /// takes another worker's only when it has none; what it took goes back to its home.
    #[tokio::test(flavor = "current_thread")]
    async fn each_worker_keeps_its_share_of_the_idle_connections_it_opened() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepting = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let upstream = crate::upstream::servers::tests::upstream(&[&addr], 0);
        let set = crate::upstream::servers::ServerSet::new(&upstream, crate::metrics::ResolveMetrics::default());
        // Three idle connections at most, among two workers: two for worker 0, one for 1.
        let pool = Pool::new(Connector::new(&upstream, set.tls_names()), 3, 2, PoolMetrics::default());
        let server: Authority = addr.parse().unwrap();
        let idle = |worker: usize| lock(&pool.inner.idle[worker][0]).get(addr.as_str()).map_or(0, Vec::len);
        let open = async |worker: usize, n: usize| {
            crate::worker::enter(worker);
            let mut taken = Vec::new();
            for _ in 0..n {
                taken.push(pool.checkout(&server, false, Take::New).await.unwrap());
            }
            for mut conn in taken {
                conn.give_back();
            }
        };
        open(0, 3).await;
        open(1, 3).await;
        assert_eq!((idle(0), idle(1)), (2, 1), "each worker keeps its share");
        assert_eq!(pool.inner.metrics.idle_closed.get(), 3);
        // Worker 1 takes its own first, then worker 0's; each goes back where it lives.
        crate::worker::enter(1);
        let own = pool.checkout(&server, false, Take::Idle).await.unwrap();
        assert_eq!((own.home, idle(1)), (1, 0));
        let borrowed = pool.checkout(&server, false, Take::Idle).await.unwrap();
        assert_eq!((borrowed.home, idle(0)), (0, 1));
        for mut conn in [own, borrowed] {
            conn.give_back();
        }
        assert_eq!((idle(0), idle(1)), (2, 1));
        crate::worker::enter(0);
        accepting.abort();
        // Fewer than the workers: one each, so that none opens a connection per request.
        let few = Pool::new(Connector::new(&upstream, set.tls_names()), 1, 4, PoolMetrics::default());
        assert_eq!((0..4).map(|w| few.inner.share(w)).collect::<Vec<_>>(), [1, 1, 1, 1]);
        let none = Pool::new(Connector::new(&upstream, set.tls_names()), 0, 4, PoolMetrics::default());
        assert_eq!((0..4).map(|w| none.inner.share(w)).sum::<usize>(), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn bytes_nobody_asked_for_make_a_connection_out_of_step() {
        let (io, mut server) = pair().await;
        server.write_all(b"HTTP/1.1 408 Request Timeout\r\n\r\n").await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while socket_open(&io) && Instant::now() < deadline {
            tokio::task::yield_now().await;
        }
        assert!(!socket_open(&io));
        drop(server);
    }
}
