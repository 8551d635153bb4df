//! Keep-alive connections to the servers of one upstream. A request checks an idle
//! HTTP/1.1 connection out (or makes one), drives its exchange on it from its own task,
//! and gives it back once the response body has been read to its end; a connection given
//! back is a socket and nothing else (no task, no buffer). HTTP/2 (`http2: true`) shares
//! one hyper connection per server among all requests.
//!
//! How many idle connections are kept is decided by the load, not by a number (unless
//! `keepalive: N` asks for nginx's cap): a worker keeps, per server, as many as the most
//! it had lent at once lately (this purge period or the one before, `PURGE_EVERY`
//! each); what is idle beyond that (the load fell) is closed half at a time, one purge
//! after another, and no connection is kept idle past `IDLE_TIMEOUT`. So a steady load
//! at any concurrency reopens nothing: a request finds the connection an earlier one
//! gave back, where a fixed cap below the concurrency closes and reopens a connection
//! for every request past it. What bounds the sockets a backend sees is `max_conns` (the
//! requests in progress per server) and the idle timeout, as with HAProxy's idle server
//! connections and `pool-purge-delay`.
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
use crate::metrics::{Closed, PoolMetrics};

/// The largest response head read from a server (a 502 past it): nginx reads heads into
/// one `proxy_buffer_size` of 4 or 8 KiB; this leaves room for large cookies.
pub const MAX_RESPONSE_HEAD: usize = 32 * 1024;

/// Idle keep-alive connections to a server are closed after this long (the reaper looks
/// every `PURGE_EVERY`, so one lives at most that much longer).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// How often the reaper looks: a purge period. The most connections lent at once is
/// remembered for two of them, so a load that pauses for less than 5 s keeps its pool.
pub const PURGE_EVERY: Duration = Duration::from_secs(5);

pub struct Pool {
    inner: Arc<Inner>,
}

struct Inner {
    connector: Connector,
    /// `None`: idle connections kept as the load needs (the default). `Some(n)`: at most
    /// `n` per server, shared evenly between the workers (a worker keeps its share, at
    /// least one: nginx's `keepalive` is per worker process, this is the total unless
    /// there are more workers): one given back past a worker's share closes its oldest
    /// idle one (the newest are the likeliest still open at the server).
    keepalive: Option<usize>,
    metrics: PoolMetrics,
    /// Per worker (`crate::worker`), the HTTP/1.1 connections it opened, by server: those
    /// with no request on them, most recently used last, and how many are lent; plain
    /// ones, then TLS ones. A connection's socket is registered with the runtime of the
    /// worker that opened it, which is woken by its readiness: used by another, each
    /// response would cross threads. Keyed by the address as written: `Authority`'s own
    /// hash and equality go byte by byte, case-folded, which cost more per request than
    /// everything else the pool does.
    idle: Box<[IdleLists]>,
    /// The HTTP/2 connection of each server, plain then TLS.
    shared: [Mutex<ByServer<http2::SendRequest<H2Body>>>; 2],
}

/// A connection's timer for its exchanges (boxed: a timer is pinned where it lies).
pub type ExchangeTimer = Pin<Box<tokio::time::Sleep>>;

/// A worker's connections, plain then TLS.
type IdleLists = [Mutex<ByServer<Kept>>; 2];

/// A worker's connections to one server.
#[derive(Default)]
struct Kept {
    /// Those with no request on them, least recently used first.
    idle: Vec<Idle>,
    /// Those lent to exchanges now.
    lent: usize,
    /// The most lent at once in this purge period, and in the one before: what the load
    /// needed lately, which the purge keeps.
    peak: usize,
    peak_before: usize,
}

impl Kept {
    fn lend(&mut self) {
        self.lent += 1;
        self.peak = self.peak.max(self.lent);
    }
}

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
    /// It counts as lent in its home's `Kept` (until given back, taken over or dropped).
    lent: bool,
    /// What times the wait for its answers: the connection's own, made by its first
    /// exchange and reset by each. A deadline later than the one set before is one
    /// atomic store in tokio's timer, where a timer set and dropped per exchange was a
    /// registration in the timer wheel and its removal, each under the wheel's lock.
    pub timer: Option<ExchangeTimer>,
}

impl Pool {
    /// A pool for `workers` worker threads, keeping idle connections as the load needs
    /// (`keepalive: None`) or at most `keepalive` per server.
    pub fn new(connector: Connector, keepalive: Option<usize>, workers: usize, metrics: PoolMetrics) -> Self {
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
            let inner = Arc::clone(&self.inner);
            return Ok(Checkout { io: Some(io), inner, key, reused: true, home, lent: true, timer });
        }
        // Boxed: what is rare stays out of the future every request moves around.
        let io = Box::pin(self.inner.connector.connect(server, tls)).await.map_err(SendError::Connect)?;
        self.inner.metrics.opened.inc();
        let mut kept = lock(&self.inner.idle[worker][usize::from(tls)]);
        match kept.get_mut(server.as_str()) {
            Some(kept) => kept.lend(),
            None => {
                let mut new = Kept::default();
                new.lend();
                kept.insert(server.as_str().into(), new);
            }
        }
        drop(kept);
        self.inner.metrics.in_use.inc();
        let inner = Arc::clone(&self.inner);
        Ok(Checkout { io: Some(io), inner, key, reused: false, home: worker, lent: true, timer: None })
    }

    /// Per server (by address as dialed), its idle connections and those lent now, all
    /// workers together.
    pub fn report(&self) -> HashMap<String, (usize, usize)> {
        let mut report = HashMap::<String, (usize, usize)>::new();
        for list in self.inner.idle.iter().flatten() {
            for (server, kept) in lock(list).iter() {
                let counts = report.entry(server.to_string()).or_default();
                counts.0 += kept.idle.len();
                counts.1 += kept.lent;
            }
        }
        report
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
        self.inner.metrics.opened.inc();
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
    fn share(&self, worker: usize, keepalive: usize) -> usize {
        if keepalive == 0 {
            return 0;
        }
        let workers = self.idle.len();
        (keepalive / workers + usize::from(worker < keepalive % workers)).max(1)
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

    /// The most recently used idle connection to `key` of worker `home` that is still
    /// open, lent.
    fn take_idle_of(&self, home: usize, key: &Key, checked: bool) -> Option<Idle> {
        let mut kept = lock(&self.idle[home][usize::from(key.tls)]);
        let kept = kept.get_mut(key.server.as_str())?;
        while let Some(mut conn) = kept.idle.pop() {
            self.metrics.idle.dec();
            if still_open(&mut conn.io) && (!checked || socket_open(&conn.io)) {
                kept.lend();
                self.metrics.in_use.inc();
                return Some(conn);
            }
        }
        None
    }

    /// A connection of worker `home` to `key` lent no more (given back, taken over or
    /// closed).
    fn returned(&self, home: usize, key: &Key) {
        if let Some(kept) = lock(&self.idle[home][usize::from(key.tls)]).get_mut(key.server.as_str()) {
            kept.lent = kept.lent.saturating_sub(1);
        }
        self.metrics.in_use.dec();
    }

    /// A purge period has ended at `now`: closes the connections idle for longer than
    /// `IDLE_TIMEOUT`, then, unless `keepalive` caps them, half of those idle beyond what
    /// the load lately needed (the most lent at once in this period or the last, less
    /// those lent now), the least recently used first.
    fn purge(&self, now: Instant) {
        let mut closed = Vec::new();
        for kept in self.idle.iter().flatten() {
            let mut kept = lock(kept);
            for kept in kept.values_mut() {
                let before = kept.idle.len();
                kept.idle.retain(|c| now.saturating_duration_since(c.since) < IDLE_TIMEOUT);
                let timed_out = before - kept.idle.len();
                self.metrics.closed(Closed::Timeout, timed_out);
                if self.keepalive.is_none() {
                    let needed = kept.peak.max(kept.peak_before).saturating_sub(kept.lent);
                    let surplus = kept.idle.len().saturating_sub(needed).div_ceil(2);
                    closed.extend(kept.idle.drain(..surplus));
                    self.metrics.closed(Closed::Surplus, surplus);
                }
                self.metrics.idle.dec_by(gauge_value(before - kept.idle.len()));
                kept.peak_before = kept.peak;
                kept.peak = kept.lent;
            }
            kept.retain(|_, k| !k.idle.is_empty() || k.lent > 0 || k.peak_before > 0);
        }
        // Closed outside the locks.
        drop(closed);
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let idle: usize =
            self.idle.iter().flatten().map(|kept| lock(kept).values().map(|k| k.idle.len()).sum::<usize>()).sum();
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
        let share = inner.keepalive.map(|keepalive| inner.share(self.home, keepalive));
        let idle = Idle { io, timer: self.timer.take(), since: Instant::now() };
        let mut by_server = lock(&inner.idle[self.home][usize::from(self.key.tls)]);
        // Looked up before inserting: an entry's key is a new string, and the entry is
        // there but after a purge that found it unused.
        if !by_server.contains_key(self.key.server.as_str()) {
            by_server.insert(self.key.server.as_str().into(), Kept::default());
        }
        let Some(kept) = by_server.get_mut(self.key.server.as_str()) else { return };
        if std::mem::take(&mut self.lent) {
            kept.lent = kept.lent.saturating_sub(1);
            inner.metrics.in_use.dec();
        }
        let oldest = match share {
            Some(0) => Some(idle),
            Some(share) if kept.idle.len() >= share => {
                kept.idle.push(idle);
                Some(kept.idle.remove(0))
            }
            _ => {
                kept.idle.push(idle);
                inner.metrics.idle.inc();
                None
            }
        };
        drop(by_server);
        if let Some(oldest) = oldest {
            // Closed outside the lock.
            inner.metrics.closed(Closed::Keepalive, 1);
            drop(oldest);
        }
    }

    /// The connection itself, taken over (an upgrade makes it a tunnel): no longer the
    /// pool's.
    pub fn into_io(mut self) -> Option<UpstreamIo> {
        self.io.take()
    }

    fn io(&mut self) -> io::Result<&mut UpstreamIo> {
        self.io.as_mut().ok_or_else(|| io::ErrorKind::NotConnected.into())
    }
}

impl Drop for Checkout {
    /// Given back or not (closed, taken over), it is lent no more.
    fn drop(&mut self) {
        if self.lent {
            self.inner.returned(self.home, &self.key);
        }
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
    let mut tick = tokio::time::interval(PURGE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(pool) = pool.upgrade() else { return };
        pool.purge(Instant::now());
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

    /// A server that accepts every connection and holds it open; its address.
    async fn holding_server() -> (String, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepting = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        (addr, accepting)
    }

    fn pool_for(addr: &str, keepalive: Option<usize>, workers: usize) -> Pool {
        let upstream = crate::upstream::servers::tests::upstream(&[addr], 0);
        let set = crate::upstream::servers::ServerSet::new(&upstream, crate::metrics::ResolveMetrics::default());
        Pool::new(Connector::new(&upstream, set.tls_names()), keepalive, workers, PoolMetrics::default())
    }

    impl Pool {
        /// Worker `worker`'s idle connections to `addr`.
        fn idle(&self, worker: usize, addr: &str) -> usize {
            lock(&self.inner.idle[worker][0]).get(addr).map_or(0, |k| k.idle.len())
        }

        /// `n` exchanges at once on worker `worker`: each takes a connection, then all are
        /// given back.
        async fn at_once(&self, worker: usize, server: &Authority, n: usize, take: Take) {
            crate::worker::enter(worker);
            let mut taken = Vec::new();
            for _ in 0..n {
                taken.push(self.checkout(server, false, take).await.unwrap());
            }
            for mut conn in taken {
                conn.give_back();
            }
        }
    }

    /// With `keepalive`, each worker keeps the connections it opened, up to its share,
    /// and takes another worker's only when it has none; what it took goes back to its
    /// home.
    #[tokio::test(flavor = "current_thread")]
    async fn each_worker_keeps_its_share_of_keepalive_of_the_connections_it_opened() {
        let (addr, accepting) = holding_server().await;
        // Three idle connections at most, among two workers: two for worker 0, one for 1.
        let pool = pool_for(&addr, Some(3), 2);
        let server: Authority = addr.parse().unwrap();
        pool.at_once(0, &server, 3, Take::New).await;
        pool.at_once(1, &server, 3, Take::New).await;
        assert_eq!((pool.idle(0, &addr), pool.idle(1, &addr)), (2, 1), "each worker keeps its share");
        assert_eq!(pool.inner.metrics.idle_closed[Closed::Keepalive as usize].get(), 3);
        // Worker 1 takes its own first, then worker 0's; each goes back where it lives.
        crate::worker::enter(1);
        let own = pool.checkout(&server, false, Take::Idle).await.unwrap();
        assert_eq!((own.home, pool.idle(1, &addr)), (1, 0));
        let borrowed = pool.checkout(&server, false, Take::Idle).await.unwrap();
        assert_eq!((borrowed.home, pool.idle(0, &addr)), (0, 1));
        assert_eq!(pool.inner.metrics.in_use.get(), 2);
        for mut conn in [own, borrowed] {
            conn.give_back();
        }
        assert_eq!((pool.idle(0, &addr), pool.idle(1, &addr)), (2, 1));
        assert_eq!(pool.inner.metrics.in_use.get(), 0);
        crate::worker::enter(0);
        accepting.abort();
        // Fewer than the workers: one each, so that none opens a connection per request.
        let few = pool_for(&addr, Some(1), 4);
        assert_eq!((0..4).map(|w| few.inner.share(w, 1)).collect::<Vec<_>>(), [1, 1, 1, 1]);
        assert_eq!((0..4).map(|w| few.inner.share(w, 0)).sum::<usize>(), 0);
    }

    /// On the default (no `keepalive`), a steady load reopens nothing whatever its
    /// concurrency; when it falls, what it leaves idle beyond the most lent lately goes
    /// half at a time, one purge after another, and nothing stays idle past the idle
    /// timeout. Purges are called one after another: no time passes.
    #[tokio::test(flavor = "current_thread")]
    async fn the_default_pool_keeps_what_the_load_needs_and_lets_the_surplus_go_by_halves() {
        let (addr, accepting) = holding_server().await;
        let pool = pool_for(&addr, None, 1);
        let server: Authority = addr.parse().unwrap();
        let opened = || pool.inner.metrics.opened.get();
        // A purge period is the time between two purges: each is called now, so that
        // no connection has been idle for the idle timeout yet.
        let purge = |pool: &Pool| pool.inner.purge(Instant::now());
        // 100 at once, period after period: 100 opened, then none.
        for _ in 0..6 {
            pool.at_once(0, &server, 100, Take::Idle).await;
            purge(&pool);
        }
        assert_eq!((opened(), pool.idle(0, &addr)), (100, 100), "a steady load reopens nothing");
        // The load falls to 8 at once: the 100 are kept for the period after the last
        // peak, then the surplus halves each period, down to the 8 the load needs.
        let mut idle = Vec::new();
        for _ in 0..12 {
            pool.at_once(0, &server, 8, Take::Idle).await;
            purge(&pool);
            idle.push(pool.idle(0, &addr));
        }
        assert_eq!(idle, [100, 54, 31, 19, 13, 10, 9, 8, 8, 8, 8, 8], "kept, then the surplus by halves");
        assert_eq!(opened(), 100, "the smaller load reuses what is kept");
        // No load at all: everything goes, by halves.
        let mut idle = Vec::new();
        for _ in 0..6 {
            purge(&pool);
            idle.push(pool.idle(0, &addr));
        }
        assert_eq!(idle, [8, 4, 2, 1, 0, 0]);
        let closed = |why: Closed| pool.inner.metrics.idle_closed[why as usize].get();
        assert_eq!((closed(Closed::Surplus), closed(Closed::Timeout), closed(Closed::Keepalive)), (100, 0, 0));
        assert_eq!(pool.inner.metrics.idle.get(), 0);
        // A connection idle past the idle timeout is closed, whatever the load needs.
        pool.at_once(0, &server, 3, Take::Idle).await;
        pool.inner.purge(Instant::now() + IDLE_TIMEOUT);
        assert_eq!((pool.idle(0, &addr), closed(Closed::Timeout)), (0, 3));
        accepting.abort();
    }

    /// A connection lent and then closed or taken over (not given back) is lent no more:
    /// the load it measured ends with it.
    #[tokio::test(flavor = "current_thread")]
    async fn a_connection_dropped_or_taken_over_is_lent_no_more() {
        let (addr, accepting) = holding_server().await;
        let pool = pool_for(&addr, None, 1);
        let server: Authority = addr.parse().unwrap();
        crate::worker::enter(0);
        let dropped = pool.checkout(&server, false, Take::Idle).await.unwrap();
        let taken = pool.checkout(&server, false, Take::Idle).await.unwrap();
        assert_eq!(pool.inner.metrics.in_use.get(), 2);
        drop(dropped);
        let _tunnel = taken.into_io();
        assert_eq!(pool.inner.metrics.in_use.get(), 0);
        let lent = lock(&pool.inner.idle[0][0]).get(addr.as_str()).map(|k| k.lent);
        assert_eq!(lent, Some(0));
        accepting.abort();
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
