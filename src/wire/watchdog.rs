//! The HTTP/2 connection watchdog: closes connections that say nothing or read nothing.
//! (HTTP/1 connections keep their timeouts in their own loop, `wire::h1`.)
//!
//! One `Watch` per connection is shared by the socket (`WatchedIo`), every response body
//! (`WatchedBody`) and the task that drives the connection (`drive`). Events only store a
//! time or bump a counter; the driver's one timer wakes at the earliest deadline, or at
//! the latest one "shortest timeout" after its last look, and then checks lazily. So no
//! timer is reset per byte, per frame or per request.
//!
//! hyper offers no hook for these (HTTP/2 has no idle timer and no send timeout); no
//! crate wraps a socket with them either, hence this module.

use std::future::{Future, poll_fn};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use hyper::body::{Body, Frame, SizeHint};
use hyper::rt::{Read, ReadBufCursor, Write};
use tokio::time::Instant;

/// How long an idle connection told to go away (HTTP/2: GOAWAY) may take to close.
const GOODBYE_GRACE: Duration = Duration::from_secs(1);

/// The timeouts of `server:`.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub header_read: Duration,
    pub idle: Duration,
    pub send: Duration,
}

impl Timeouts {
    pub fn shortest(&self) -> Duration {
        self.header_read.min(self.idle).min(self.send)
    }
}

/// What one connection is doing, as its socket and its requests report it. Times are
/// nanoseconds since `opened`, plus one so that 0 means "not now".
pub struct Watch {
    opened: Instant,
    in_flight: AtomicUsize,
    /// A request has been received: the connection is past its opening.
    served: AtomicBool,
    /// When the last request in flight ended.
    idle_since: AtomicU64,
    /// When a write to the socket found it full, with no write done since.
    write_blocked_since: AtomicU64,
    /// When a response body handed out a frame the connection has not taken on from.
    body_waiting_since: AtomicU64,
}

/// Why a connection was closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// No complete request within `header_read_timeout`.
    Header,
    /// No request in progress for `idle_timeout`.
    Idle,
    /// The client took nothing of its response for `send_timeout`.
    Send,
}

impl Expiry {
    pub fn as_str(self) -> &'static str {
        match self {
            Expiry::Header => "header_read_timeout",
            Expiry::Idle => "idle_timeout",
            Expiry::Send => "send_timeout",
        }
    }
}

impl Watch {
    pub fn new() -> Arc<Watch> {
        Arc::new(Watch {
            opened: Instant::now(),
            in_flight: AtomicUsize::new(0),
            served: AtomicBool::new(false),
            idle_since: AtomicU64::new(0),
            write_blocked_since: AtomicU64::new(0),
            body_waiting_since: AtomicU64::new(0),
        })
    }

    fn now(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_nanos()).unwrap_or(u64::MAX - 1) + 1
    }

    fn at(&self, stamp: u64) -> Instant {
        self.opened + Duration::from_nanos(stamp - 1)
    }

    /// A request arrived; the returned guard, kept with its response, ends it.
    pub fn request(self: &Arc<Self>) -> OpenRequest {
        self.in_flight.fetch_add(1, Relaxed);
        self.served.store(true, Relaxed);
        OpenRequest(Arc::clone(self))
    }

    /// The earliest deadline now in force, and which timeout it is.
    fn deadline(&self, t: &Timeouts) -> Option<(Instant, Expiry)> {
        let mut earliest: Option<(Instant, Expiry)> = None;
        let mut consider = |stamp: u64, timeout: Duration, why: Expiry| {
            // A deadline past what `Instant` can hold is never.
            if let Some(at) = (stamp != 0).then(|| self.at(stamp).checked_add(timeout)).flatten() {
                if earliest.is_none_or(|(e, _)| at < e) {
                    earliest = Some((at, why));
                }
            }
        };
        consider(self.write_blocked_since.load(Relaxed), t.send, Expiry::Send);
        consider(self.body_waiting_since.load(Relaxed), t.send, Expiry::Send);
        if self.in_flight.load(Relaxed) == 0 {
            match self.served.load(Relaxed) {
                false => consider(1, t.header_read, Expiry::Header),
                true => consider(self.idle_since.load(Relaxed), t.idle, Expiry::Idle),
            }
        }
        earliest
    }
}

/// One request in flight on a connection, until its response body is done or dropped.
pub struct OpenRequest(Arc<Watch>);

impl Drop for OpenRequest {
    fn drop(&mut self) {
        let watch = &self.0;
        watch.body_waiting_since.store(0, Relaxed);
        if watch.in_flight.fetch_sub(1, Relaxed) == 1 {
            watch.idle_since.store(watch.now(), Relaxed);
        }
    }
}

/// Drives `conn` until it ends, closing it when a timeout of `timeouts` expires: an
/// idle one is asked to go away (`goodbye`: HTTP/2 sends GOAWAY), any other is dropped
/// at once (the client is not listening). A change seen by `stopping` (or its sender
/// gone) asks it to finish gracefully.
pub async fn drive<C, E>(
    conn: C,
    goodbye: impl Fn(Pin<&mut C>),
    watch: &Watch,
    timeouts: Timeouts,
    stopping: &mut tokio::sync::watch::Receiver<()>,
) -> Result<(), DriveError<E>>
where
    C: Future<Output = Result<(), E>>,
{
    // Asked for a change only when there is one, or to hold this task's waker, as the
    // timer below (docs/performance.md).
    let signalled = stopping.clone();
    let shutdown = async {
        let _ = stopping.changed().await;
    };
    let mut shutdown_waker: Option<Waker> = None;
    tokio::pin!(conn);
    tokio::pin!(shutdown);
    let shortest = timeouts.shortest();
    let sleep = tokio::time::sleep_until(later(Instant::now(), shortest));
    tokio::pin!(sleep);
    let mut shutting_down = false;
    let mut leaving: Option<Instant> = None;
    // The waker the timer holds. The timer is polled only when it has fired or does not
    // hold this task's waker, not on every wake-up of the connection (two per request),
    // without `tokio::select!` (docs/performance.md).
    let mut timer_waker: Option<Waker> = None;
    loop {
        let woken = poll_fn(|cx| {
            if let Poll::Ready(ended) = conn.as_mut().poll(cx) {
                return Poll::Ready(Woken::Ended(ended));
            }
            if !shutting_down
                && (signalled.has_changed().unwrap_or(true)
                    || !shutdown_waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())))
            {
                let registers = tokio::task::coop::has_budget_remaining();
                if shutdown.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Woken::Shutdown);
                }
                shutdown_waker = registers.then(|| cx.waker().clone());
            }
            if sleep.is_elapsed() || !timer_waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                // Out of its budget, the task gets `Pending` from the timer, which then
                // holds no waker.
                let registers = tokio::task::coop::has_budget_remaining();
                if sleep.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Woken::Timer);
                }
                timer_waker = registers.then(|| cx.waker().clone());
            }
            Poll::Pending
        })
        .await;
        match woken {
            Woken::Ended(ended) => return ended.map_err(DriveError::Connection),
            Woken::Shutdown => {
                shutting_down = true;
                goodbye(conn.as_mut());
            }
            Woken::Timer => {
                let now = Instant::now();
                // Every deadline is set at least `shortest` after the moment it is set,
                // so looking again `shortest` from now misses none.
                let mut next = later(now, shortest);
                match watch.deadline(&timeouts) {
                    Some((at, Expiry::Idle)) if at <= now => match leaving {
                        None => {
                            goodbye(conn.as_mut());
                            leaving = Some(now + GOODBYE_GRACE);
                            next = now + GOODBYE_GRACE;
                        }
                        Some(until) if now >= until => return Err(DriveError::Expired(Expiry::Idle)),
                        Some(until) => next = until,
                    },
                    Some((at, why)) if at <= now => return Err(DriveError::Expired(why)),
                    Some((at, _)) => next = next.min(at),
                    None => {}
                }
                sleep.as_mut().reset(next);
                // A fired timer gave its waker away.
                timer_waker = None;
            }
        }
    }
}

/// What woke the task that drives a connection.
enum Woken<E> {
    Ended(Result<(), E>),
    Shutdown,
    Timer,
}

/// `at + after`, or a day after `at` when that is past what `Instant` can hold.
fn later(at: Instant, after: Duration) -> Instant {
    at.checked_add(after).unwrap_or(at + Duration::from_secs(86_400))
}

/// How a driven connection ended, when not cleanly.
#[derive(Debug)]
pub enum DriveError<E> {
    Connection(E),
    Expired(Expiry),
}

/// The socket of a connection: reports writes that find it full.
pub struct WatchedIo<T> {
    inner: T,
    watch: Arc<Watch>,
}

impl<T> WatchedIo<T> {
    pub fn new(inner: T, watch: Arc<Watch>) -> Self {
        WatchedIo { inner, watch }
    }
}

impl<T: Read + Unpin> Read for WatchedIo<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: ReadBufCursor<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: Write + Unpin> WatchedIo<T> {
    fn note<R>(&self, written: &Poll<io::Result<R>>) {
        let blocked = &self.watch.write_blocked_since;
        match written {
            Poll::Pending => {
                if blocked.load(Relaxed) == 0 {
                    blocked.store(self.watch.now(), Relaxed);
                }
            }
            Poll::Ready(_) => {
                if blocked.load(Relaxed) != 0 {
                    blocked.store(0, Relaxed);
                }
            }
        }
    }
}

impl<T: Write + Unpin> Write for WatchedIo<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.note(&written);
        written
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.note(&written);
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// A response body that ends its request's `OpenRequest` when done, and reports a frame
/// handed out that the connection does not come back for (the client's flow control
/// window stays shut).
pub struct WatchedBody<B> {
    inner: B,
    in_flight: Option<OpenRequest>,
}

impl<B> WatchedBody<B> {
    pub fn new(inner: B, in_flight: OpenRequest) -> Self {
        WatchedBody { inner, in_flight: Some(in_flight) }
    }
}

impl<B: Body + Unpin> Body for WatchedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Some(in_flight) = &this.in_flight {
            let waiting = &in_flight.0.body_waiting_since;
            match &polled {
                Poll::Ready(Some(Ok(_))) if !this.inner.is_end_stream() => waiting.store(in_flight.0.now(), Relaxed),
                Poll::Ready(_) => this.in_flight = None,
                Poll::Pending => waiting.store(0, Relaxed),
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timeouts =
        Timeouts { header_read: Duration::from_secs(10), idle: Duration::from_secs(60), send: Duration::from_secs(30) };

    fn why(watch: &Watch) -> Option<(Duration, Expiry)> {
        watch.deadline(&T).map(|(at, why)| (at - watch.opened, why))
    }

    #[tokio::test(start_paused = true)]
    async fn each_state_has_its_timer() {
        let watch = Watch::new();
        let secs = Duration::from_secs;
        assert_eq!(why(&watch), Some((secs(10), Expiry::Header)), "opening");
        let request = watch.request();
        assert_eq!(why(&watch), None, "busy");
        tokio::time::advance(secs(100)).await;
        drop(request);
        assert_eq!(why(&watch), Some((secs(160), Expiry::Idle)), "idle from the end of the request");
        tokio::time::advance(secs(5)).await;
        let request = watch.request();
        tokio::time::advance(secs(1)).await;
        watch.write_blocked_since.store(watch.now(), Relaxed);
        assert_eq!(why(&watch), Some((secs(136), Expiry::Send)), "a write waits for the client");
        drop(request);
        assert_eq!(why(&watch), Some((secs(136), Expiry::Send)), "still waiting, and sooner than idle");
    }

    #[test]
    fn a_deadline_past_what_instant_holds_is_never() {
        let watch = Watch::new();
        let forever = Timeouts { header_read: Duration::MAX, ..T };
        assert_eq!(watch.deadline(&forever), None);
    }
}
