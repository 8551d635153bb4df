//! Upgraded connections (HTTP/1.1 `Upgrade`, RFC 9110 §7.8; WebSocket, RFC 6455): once
//! the upstream answers `101`, the client's and the upstream's connections are joined
//! and bytes flow both ways until either side closes or nothing moves for the
//! upstream's `tunnel_idle_timeout`. The connection's task runs the tunnel itself, so
//! the request's receipts (its concurrency slots) and the connection's place
//! (`ConnectionHold`) are kept for the tunnel's whole life without a hand-off.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::Instant;

/// Joins `client` and `upstream` until either closes or nothing moves for `idle`; what
/// each sent already (read past the heads: `client_sent`, `upstream_sent`) goes to the
/// other first. Returns how it ended, for the log.
pub async fn run<C, U>(
    mut client: C,
    mut client_sent: BytesMut,
    mut upstream: U,
    mut upstream_sent: BytesMut,
    idle: Duration,
) -> io::Result<String>
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    while client_sent.has_remaining() {
        let n = upstream.write(&client_sent).await?;
        client_sent.advance(n);
    }
    while upstream_sent.has_remaining() {
        let n = client.write(&upstream_sent).await?;
        upstream_sent.advance(n);
    }
    let clock = Clock { start: Instant::now(), last: AtomicU64::new(0) };
    let mut client = Stamped { io: client, clock: &clock };
    let mut upstream = Stamped { io: upstream, clock: &clock };
    let copy = tokio::io::copy_bidirectional(&mut client, &mut upstream);
    tokio::pin!(copy);
    loop {
        tokio::select! {
            done = &mut copy => return done.map(|(up, down)| format!("closed after {up} bytes up, {down} down")),
            () = tokio::time::sleep_until(clock.last() + idle) => {
                if clock.last() + idle <= Instant::now() {
                    return Ok(format!("idle for {idle:?}"));
                }
            }
        }
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
