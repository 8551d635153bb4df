//! Upgraded connections (HTTP/1.1 `Upgrade`, RFC 9110 §7.8; WebSocket, RFC 6455): once
//! the upstream answers `101`, the client's and the upstream's connections are joined
//! and bytes flow both ways until either side closes or nothing moves for the
//! upstream's `tunnel_idle_timeout`. The request's concurrency slots and its client
//! connection's place (`ConnectionHold`) are kept for the tunnel's whole life.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;
use tracing::debug;

use crate::connection::ConnectionHold;
use crate::gate::Permits;

/// What a tunnel keeps alive while it runs.
pub struct Tunnel {
    pub client: OnUpgrade,
    pub upstream: OnUpgrade,
    pub idle_timeout: Duration,
    pub permits: Permits,
    pub hold: Arc<ConnectionHold>,
    pub route: String,
}

impl Tunnel {
    /// Runs the tunnel in its own task: hyper hands over both connections only after
    /// the `101` has been written to the client.
    pub fn spawn(self) {
        tokio::spawn(self.run());
    }

    async fn run(mut self) {
        let (client, upstream) = match tokio::try_join!(self.client, self.upstream) {
            Ok(pair) => pair,
            Err(e) => {
                debug!(route = %self.route, error = %e, "upgrade failed");
                return;
            }
        };
        // Both connections are closed (dropped at the end of this block) before the
        // slots are given back.
        let outcome = {
            let clock = Clock { start: Instant::now(), last: AtomicU64::new(0) };
            let mut client = Stamped { io: TokioIo::new(client), clock: &clock };
            let mut upstream = Stamped { io: TokioIo::new(upstream), clock: &clock };
            let copy = tokio::io::copy_bidirectional(&mut client, &mut upstream);
            tokio::pin!(copy);
            loop {
                tokio::select! {
                    done = &mut copy => break done.map(|(up, down)| format!("closed after {up} bytes up, {down} down")),
                    () = tokio::time::sleep_until(clock.last() + self.idle_timeout) => {
                        if clock.last() + self.idle_timeout <= Instant::now() {
                            break Ok(format!("idle for {:?}", self.idle_timeout));
                        }
                    }
                }
            }
        };
        match outcome {
            Ok(how) => debug!(route = %self.route, "tunnel {how}"),
            Err(e) => debug!(route = %self.route, error = %e, "tunnel ended with an error"),
        }
        if let Some(release) = self.permits.finish() {
            release.await;
        }
        drop(self.hold);
    }
}

/// When bytes last came from either end (nanoseconds after `start`).
struct Clock {
    start: Instant,
    last: AtomicU64,
}

impl Clock {
    fn last(&self) -> Instant {
        self.start + Duration::from_nanos(self.last.load(Ordering::Relaxed))
    }

    fn touch(&self) {
        let since = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last.store(since, Ordering::Relaxed);
    }
}

/// One end of a tunnel, noting when bytes come from it.
struct Stamped<'a, T> {
    io: T,
    clock: &'a Clock,
}

impl<T: AsyncRead + Unpin> AsyncRead for Stamped<'_, T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.clock.touch();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Stamped<'_, T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
