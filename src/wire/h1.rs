//! One client connection speaking HTTP/1.x, served by sluicegate's engine (`http1`): its
//! requests read one after another (pipelined ones answered in order), each handed to
//! the service with its body as it arrives, each response written back as one buffer
//! with the first bytes of its body where they are at hand; keep-alive, `100 Continue`,
//! upgrades (the connection becomes a tunnel), the HTTP/2 preface (the connection goes to
//! hyper's HTTP/2 with what was read), graceful shutdown, and the connection's timeouts.
//!
//! Memory scales with requests, not connections: between requests the connection's
//! future holds its socket, a timer and a few words; the request's own future (boxed)
//! exists while a request is in progress and is freed when it ends.

use std::future::{Future, poll_fn};
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::FutureExt;
use http::{Method, StatusCode, Version};
use hyper::body::Frame;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};
use tracing::debug;

use super::Timeouts;
use super::h2::{self, H2Settings};
use super::tunnel;
use crate::wire::connection::{ClientConn, PeerClosed};
use crate::wire::head::{Known, takes_trailers};
use crate::wire::http1::body::{CHUNK_END, LAST_CHUNK, chunk_head};
use crate::wire::http1::parse::{self, Framing, HeadError};
use crate::wire::http1::server::{Bodiless, BodyReader, Conn, HeadLimits, Read};
use crate::wire::http1::{read_away, write};
use crate::wire::message::{Request, Response, ResponseBody, ResponseFields, Service, Upgrade};

/// How one connection is served.
#[derive(Clone)]
pub struct Settings {
    pub timeouts: Timeouts,
    pub head: HeadLimits,
    /// HTTP/2 may begin on this connection (plain text: the client's preface).
    pub h2: Option<H2Settings>,
}

/// A client that sends this much before its response has been written is not read
/// further meanwhile (a flood of pipelined requests waits in the kernel's buffers).
const MAX_PIPELINED: usize = 64 * 1024;
/// Once a response goes out while the client is still sending its body, the body is read
/// and thrown away for at most this long (and this much) before the connection closes,
/// so that the close does not reset the connection before the client has read the
/// response (nginx's `lingering_close`).
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: u64 = 1 << 20;

/// Serves HTTP/1 requests on `io` (from `conn`) with `service` until the connection
/// closes, a timeout expires, or shutdown (`stopping`) comes between two requests.
///
/// The connection is made of the socket before the future that serves it, so that the
/// future holds the connection alone.
pub fn serve<I, S>(
    io: I,
    conn: ClientConn,
    service: Arc<S>,
    settings: Settings,
) -> impl Future<Output = ()> + Send + 'static
where
    I: AsyncRead + AsyncWrite + Unpin + PeerClosed + Send + 'static,
    S: Service,
{
    // Made out here: the block holds the connection, not its socket as well.
    let mut c = Conn::new(io);
    async move {
        let end = keep_alive(&mut c, &conn, &*service, &settings).await;
        let peer = conn.peer;
        match end {
            End::Closed => {}
            End::Ended(Ended::Io(e)) => debug!(%peer, error = %e, "connection ended with an error"),
            End::Ended(Ended::Expired(why)) => debug!(%peer, timeout = why, "connection closed"),
            End::Ended(Ended::Stopping) => {}
            // Boxed, as every rare end: the connection's future has room for its common
            // states only.
            rare => Box::pin(finish(rare, c, conn, service, settings)).await,
        }
    }
}

/// Serves requests one after another while the connection is kept alive: how it ended.
async fn keep_alive<'a, I, S>(c: &'a mut Conn<I>, conn: &'a ClientConn, service: &'a S, settings: &'a Settings) -> End
where
    I: AsyncRead + AsyncWrite + Unpin + PeerClosed + Send,
    S: Service,
{
    // One timer for the connection's life, looked at lazily (see `Waiting`): no timer is
    // set per request.
    let timer = tokio::time::sleep(settings.timeouts.shortest());
    tokio::pin!(timer);
    // Shutdown's signal, waited for once for the connection's life: a wait registered
    // and dropped per request costs more than 300 instructions. (Its own receiver: the
    // exchanges look at the connection's meanwhile.)
    let stopping = conn.stopping();
    let mut watcher = stopping.clone();
    let stop = watcher.changed().fuse();
    tokio::pin!(stop);
    let mut waiting = Waiting {
        since: Instant::now(),
        first: true,
        head_since: None,
        stop_registered: false,
        timer_registered: false,
    };
    loop {
        let head = match poll_fn(|cx| waiting.poll_head(cx, c, settings, timer.as_mut(), stopping, stop.as_mut())).await
        {
            Ok(Ok(Read::Head(head))) => head,
            Ok(Ok(Read::H2)) => return End::H2,
            Ok(Ok(Read::Closed)) => return End::Closed,
            Ok(Err(e)) => return End::Refused(e),
            Err(ended) => return End::Ended(ended),
        };
        // Boxed: the request's state exists only while it is in progress. Made where
        // it is written into its box (`Box::pin`, or a local first, would copy all of
        // its ~2 KB there, about 300 instructions a request). Its size is memory per
        // request in progress, by mimalloc's size classes: 2,048 bytes, in the 2,048-byte
        // class.
        let exchanged = Box::write(Box::new_uninit(), exchange(c, head, conn, service, settings.timeouts.send));
        match Box::into_pin(exchanged).await {
            Exchanged::KeepAlive => {}
            Exchanged::Close => return End::Closed,
            Exchanged::Upgraded(tunnel) => return End::Tunnel(tunnel),
        }
        waiting = Waiting { since: Instant::now(), first: false, head_since: None, ..waiting };
    }
}

/// How a connection's requests ended.
enum End {
    Closed,
    Ended(Ended),
    /// The HTTP/2 preface came.
    H2,
    /// A request head was refused.
    Refused(HeadError),
    /// A `101`: the connection is now a tunnel to the upstream.
    Tunnel(Tunnel),
}

/// What follows a connection's rarer ends: HTTP/2, a refusal, a tunnel.
async fn finish<I, S>(end: End, mut c: Conn<I>, conn: ClientConn, service: Arc<S>, settings: Settings)
where
    I: AsyncRead + AsyncWrite + Unpin + PeerClosed + Send + 'static,
    S: Service,
{
    let peer = conn.peer;
    match end {
        End::H2 => {
            if let Some(h2) = settings.h2 {
                let rewound = h2::Rewind::new(std::mem::take(&mut c.buf).freeze(), c.io);
                let stopping = conn.stopping().clone();
                h2::serve(rewound, conn, service, h2, settings.timeouts, stopping).await;
            }
        }
        End::Refused(e) => {
            debug!(%peer, error = %e, "bad request head");
            let _ = refuse(&mut c, &e, settings.timeouts.send).await;
            linger_on(&mut c).await;
        }
        End::Tunnel(tunnel) => tunnel.run(c, peer).await,
        End::Closed | End::Ended(_) => {}
    }
}

/// Why a connection ended without a request.
enum Ended {
    Io(io::Error),
    Expired(&'static str),
    Stopping,
}

/// A connection waiting for its next request head, and since when.
struct Waiting {
    since: Instant,
    /// The connection's first request (its wait counts against `header_read_timeout`).
    first: bool,
    /// When the head's first byte came.
    head_since: Option<Instant>,
    /// Shutdown's wait has been polled once: it holds the connection task's waker (the
    /// same for the task's life) until the signal, so later waits only look at the
    /// receiver. Polling it again per request costs about 180 instructions.
    stop_registered: bool,
    /// The connection's timer has been polled since it last rang or was reset: it holds
    /// the task's waker and wakes the task when it rings, so until then a wait only
    /// asks whether it has rung (a poll per request cost about 120 instructions).
    timer_registered: bool,
}

impl Waiting {
    fn poll_head<I: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        cx: &mut Context<'_>,
        c: &mut Conn<I>,
        settings: &Settings,
        mut timer: Pin<&mut Sleep>,
        stopping: &watch::Receiver<()>,
        stop: Pin<&mut impl Future>,
    ) -> Poll<Result<Result<Read, HeadError>, Ended>> {
        if !c.head_begun() && stopping.has_changed().unwrap_or(true) {
            // Shutting down: a connection between requests is closed.
            return Poll::Ready(Err(Ended::Stopping));
        }
        if let Poll::Ready(read) = c.poll_head(cx, settings.head, self.first && settings.h2.is_some()) {
            return Poll::Ready(read.map_err(Ended::Io));
        }
        if self.head_since.is_none() && c.head_begun() {
            self.head_since = Some(Instant::now());
        }
        // The timer wakes at the deadline in force, or `shortest` after its last look,
        // whichever comes first: every deadline is at least `shortest` after it begins,
        // so none is missed, and a request never resets it.
        let t = settings.timeouts;
        if !self.timer_registered || timer.is_elapsed() {
            while timer.as_mut().poll(cx).is_ready() {
                let now = Instant::now();
                let (deadline, why) = match (self.head_since, self.first) {
                    (Some(since), _) => (since + t.header_read, "header_read_timeout"),
                    (None, true) => (self.since + t.header_read, "header_read_timeout"),
                    (None, false) => (self.since + t.idle, "idle_timeout"),
                };
                if now >= deadline {
                    return Poll::Ready(Err(Ended::Expired(why)));
                }
                timer.as_mut().reset(deadline.min(now + t.shortest()));
            }
            self.timer_registered = true;
        }
        // Asked for shutdown's signal only while nothing of a request is in (a request
        // begun is read and answered first); the signal itself is looked at above.
        if !c.head_begun() && !self.stop_registered {
            if stop.poll(cx).is_ready() {
                return Poll::Ready(Err(Ended::Stopping));
            }
            self.stop_registered = true;
        }
        Poll::Pending
    }
}

/// A connection that became a tunnel after its `101` (boxed: upgrades are rare, and the
/// connection's state should not carry their room). What the response held is kept
/// until the tunnel closes.
struct Tunnel(Box<Upgrade>);

impl Tunnel {
    async fn run<I: AsyncRead + AsyncWrite + Unpin>(self, c: Conn<I>, peer: std::net::SocketAddr) {
        let Upgrade { io, read, idle, held } = *self.0;
        match tunnel::run(c.io, c.buf, io, read, idle).await {
            Ok(how) => debug!(%peer, "tunnel {how}"),
            Err(e) => debug!(%peer, error = %e, "tunnel ended with an error"),
        }
        drop(held);
    }
}

/// What came of one request and its response.
enum Exchanged {
    /// The connection may take another request.
    KeepAlive,
    /// The connection closes (as the response said, or now: the client went away, or a
    /// write failed).
    Close,
    Upgraded(Tunnel),
}

/// One request and its response.
// A block, not an `async fn`: an `async fn` keeps each argument twice in its future (as
// given, and moved into its body), and the head is 120 bytes of every request's box.
#[allow(clippy::manual_async_fn)]
fn exchange<'a, I, S>(
    c: &'a mut Conn<I>,
    head: parse::ParsedHead,
    conn: &'a ClientConn,
    service: &'a S,
    send_timeout: Duration,
) -> impl Future<Output = Exchanged> + 'a
where
    I: AsyncRead + AsyncWrite + Unpin + PeerClosed + Send,
    S: Service,
{
    async move {
        let view = head.view();
        let has_body = !matches!(head.framing, Framing::Empty | Framing::Length(0));
        // The response, whether the request's body was read, and the interim responses
        // queued (from `written` on) that go out before it.
        let (response, body_read, queued, written) = if has_body {
            let mut body = BodyReader::new(c, &head);
            let request = Request { head: view, framing: head.framing, body: Some(&mut body) };
            let response = service.call(request, conn).await;
            (response, body.is_done(), Vec::new(), 0)
        } else {
            let interim = Mutex::new(Vec::new());
            let mut source = Bodiless::new(&head, &interim);
            let request = Request { head: view, framing: head.framing, body: Some(&mut source) };
            // Bytes of the interim responses queued that are written.
            let mut written = 0;
            // The call's future lives in this block only: one still in scope at the write
            // below would be kept apart from every other state of the exchange, not share
            // their room (the exchange's box was 5.5 KB with it, 3 KB without).
            let response = {
                let mut call = std::pin::pin!(service.call(request, conn));
                // A client that goes away before its answer gives its request up: the
                // request is dropped wherever it is (waiting its turn, or at the upstream).
                poll_fn(|cx| {
                    if let Poll::Ready(response) = call.as_mut().poll(cx) {
                        return Poll::Ready(Some(response));
                    }
                    if let Ok(mut queued) = interim.lock()
                        && !queued.is_empty()
                        && c.poll_write_parts(cx, &[&queued], &mut written).is_ready()
                    {
                        // Written, or the client cannot take them: it is seen gone below.
                        queued.clear();
                        written = 0;
                    }
                    c.poll_gone(cx, MAX_PIPELINED).map(|()| None)
                })
                .await
            };
            let Some(response) = response else { return Exchanged::Close };
            let queued = interim.lock().map(|mut q| std::mem::take(&mut *q)).unwrap_or_default();
            (response, true, queued, written)
        };
        let keep_alive =
            head.keep_alive && !head.close_after && body_read && !conn.stopping().has_changed().unwrap_or(true);
        let before = queued.get(written..).unwrap_or_default();
        match write_response(c, before, response, &head, keep_alive, send_timeout).await {
            Ok(Written::Done { .. }) if !body_read => {
                // The client may still be sending the body no one read: read it away a
                // little before closing, so that its response is not lost to a reset.
                linger_on(c).await;
                Exchanged::Close
            }
            // Requests pipelined behind this one are served only for a client still there:
            // one that closed its side meanwhile gets nothing more done on its behalf. Looked
            // at when one has begun arriving: what is read, then the kernel, as tokio may
            // not have heard of a close yet. With nothing read behind this one there is
            // nothing to give up, and the next head's read sees a close as well as this
            // look would (a read that finds nothing costs 200 instructions).
            Ok(Written::Done { keep_alive: true })
                if c.head_begun()
                    && (poll_fn(|cx| Poll::Ready(c.poll_gone(cx, MAX_PIPELINED))).await.is_ready()
                        || c.io.peer_closed()) =>
            {
                Exchanged::Close
            }
            Ok(Written::Done { keep_alive: true }) => Exchanged::KeepAlive,
            Ok(Written::Done { keep_alive: false }) => Exchanged::Close,
            Ok(Written::Upgraded(tunnel)) => Exchanged::Upgraded(tunnel),
            Err(e) => {
                debug!(peer = %conn.peer, error = %e, "response not sent");
                Exchanged::Close
            }
        }
    }
}

/// How writing a response ended.
enum Written {
    Done {
        keep_alive: bool,
    },
    /// A `101`: the connection is now a tunnel to the upstream.
    Upgraded(Tunnel),
}

/// Writes `response` to a request from an HTTP/1.`version` client (`to`): its head in
/// one buffer, after the interim responses still to go (`before`: the head's write sends
/// them, so that no response is held across a write of its own), with the first piece
/// of its body, then the rest as it comes; a body that
/// ends with trailers is given them as its chunked trailer section when the client takes
/// them (`TE: trailers`). The body settles itself before its last piece (see
/// `message::ResponseBody`).
async fn write_response<I: AsyncRead + AsyncWrite + Unpin, B: ResponseBody>(
    c: &mut Conn<I>,
    before: &[u8],
    response: Response<B>,
    to: &parse::ParsedHead,
    keep_alive: bool,
    send_timeout: Duration,
) -> io::Result<Written> {
    let (method, version) = (&to.method, to.version);
    let status = response.status;
    let switching = status == StatusCode::SWITCHING_PROTOCOLS;
    // RFC 9112 §6.3: these have no body whatever their fields say; a response to HEAD
    // keeps the length of what GET would have sent.
    let bodiless = *method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let length = response.body.size_hint().exact();
    // Without a length, an HTTP/1.1 client gets the body chunked; an HTTP/1.0 client
    // gets it until the connection closes.
    let chunked = !bodiless && length.is_none() && version == Version::HTTP_11;
    let keep_alive = keep_alive && (bodiless || length.is_some() || chunked) && !switching;
    let mut head = write::buffer();
    head.extend_from_slice(before);
    let mut writer = write::Head::response(&mut head, status);
    let mut dated = false;
    let from_server = matches!(response.fields, ResponseFields::Upstream(_));
    let keep_length = bodiless && from_server;
    response.each_field(keep_length, &mut |name, value| {
        dated |= name.eq_ignore_ascii_case(b"date");
        writer.field(name, value);
    });
    if !dated {
        writer.date();
    }
    if !bodiless || (*method == Method::HEAD && !keep_length) {
        match length {
            Some(n) if !status.is_informational() && status != StatusCode::NO_CONTENT => writer.content_length(n),
            _ if chunked => writer.field(b"transfer-encoding", b"chunked"),
            _ => {}
        }
    }
    match (keep_alive, version) {
        (false, _) if !switching => writer.field(b"connection", b"close"),
        (true, Version::HTTP_10) => writer.field(b"connection", b"keep-alive"),
        _ => {}
    }
    writer.end();
    let mut body = response.body;
    if switching && from_server {
        let upgrade = body.upgrade().ok_or(io::ErrorKind::Unsupported)?;
        write_all(c, &[&head], send_timeout).await?;
        return Ok(Written::Upgraded(Tunnel(Box::new(upgrade))));
    }
    if bodiless {
        poll_fn(|cx| body.poll_unsent(cx)).await;
        write_all(c, &[&head], send_timeout).await?;
        write::give_back(head);
        return Ok(Written::Done { keep_alive });
    }
    let takes_trailers = chunked && to.fields().all_of(Known::Te).any(takes_trailers);
    let mut head_sent = false;
    loop {
        // The first piece goes out with the head when it is at hand already; otherwise
        // the head goes alone, and the body follows as it comes.
        let frame = match head_sent {
            false => match poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx))).await {
                Poll::Ready(frame) => frame,
                Poll::Pending => {
                    write_all(c, &[&head], send_timeout).await?;
                    head_sent = true;
                    continue;
                }
            },
            // A client that goes away while the body is awaited gives it up at once,
            // not at the next piece (which a stalled stream may never send).
            true => match poll_fn(|cx| match Pin::new(&mut body).poll_frame(cx) {
                Poll::Ready(frame) => Poll::Ready(Some(frame)),
                Poll::Pending => c.poll_gone(cx, MAX_PIPELINED).map(|()| None),
            })
            .await
            {
                Some(frame) => frame,
                None => return Err(io::ErrorKind::ConnectionAborted.into()),
            },
        };
        let first: &[u8] = if head_sent { &[] } else { &head };
        head_sent = true;
        let trailers = match frame.map(|f| f.map(Frame::into_data)) {
            Some(Ok(Ok(data))) => {
                let last = body.is_end_stream();
                let mut line = [0u8; 18];
                write_all(c, &piece(first, &data, chunked, last, &mut line), send_timeout).await?;
                if last {
                    break;
                }
                continue;
            }
            Some(Ok(Err(frame))) => frame.into_trailers().ok(),
            Some(Err(e)) => {
                // Broken off midway: the client sees the connection close short of the
                // declared length (or without the last chunk).
                write_all(c, &[first], send_timeout).await?;
                return Err(io::Error::other(e.to_string()));
            }
            None => None,
        };
        // Written into a buffer only when there are trailers to carry.
        let mut with_trailers = Vec::new();
        let end: &[u8] = match trailers.filter(|_| takes_trailers) {
            Some(trailers) => {
                write::last_chunk(&mut with_trailers, &trailers);
                &with_trailers
            }
            None if chunked => LAST_CHUNK,
            None => &[],
        };
        write_all(c, &[first, end], send_timeout).await?;
        break;
    }
    write::give_back(head);
    Ok(Written::Done { keep_alive })
}

/// The parts that write `head` (possibly empty) and one piece of body `data`: in the
/// chunked coding when `chunked` (its size line written into `line`; with the last chunk
/// too when `last`).
fn piece<'a>(head: &'a [u8], data: &'a [u8], chunked: bool, last: bool, line: &'a mut [u8; 18]) -> [&'a [u8]; 4] {
    if !chunked {
        return [head, data, &[], &[]];
    }
    if data.is_empty() {
        return [head, if last { LAST_CHUNK } else { &[] }, &[], &[]];
    }
    let n = chunk_head(data.len(), line);
    let tail: &[u8] = if last { b"\r\n0\r\n\r\n" } else { CHUNK_END };
    [head, &line[..n], data, tail]
}

/// Writes all of `parts`; a client that takes nothing of them for `send_timeout` fails
/// the write (nginx's `send_timeout`). The timer is set only once a write must wait.
async fn write_all<I: AsyncRead + AsyncWrite + Unpin>(
    c: &mut Conn<I>,
    parts: &[&[u8]],
    send_timeout: Duration,
) -> io::Result<()> {
    let mut written = 0;
    loop {
        let before = written;
        match poll_fn(|cx| Poll::Ready(c.poll_write_parts(cx, parts, &mut written))).await {
            Poll::Ready(result) => return result,
            Poll::Pending if written > before => continue,
            Poll::Pending => {}
        }
        let progress = poll_fn(|cx| {
            let before = written;
            match c.poll_write_parts(cx, parts, &mut written) {
                Poll::Ready(result) => Poll::Ready(result.map(|()| true)),
                Poll::Pending if written > before => Poll::Ready(Ok(false)),
                Poll::Pending => Poll::Pending,
            }
        });
        match tokio::time::timeout(send_timeout, progress).await {
            Ok(Ok(true)) => return Ok(()),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, "send_timeout")),
        }
    }
}

/// Answers a request whose head is refused, and says the connection closes.
async fn refuse<I: AsyncRead + AsyncWrite + Unpin>(
    c: &mut Conn<I>,
    e: &HeadError,
    send_timeout: Duration,
) -> io::Result<()> {
    let status = e.status();
    let body = format!("{}: {e}\n", status.canonical_reason().unwrap_or("Bad Request"));
    // RFC 9110 §9.3.2: the answer to HEAD has no body, whatever it is (its request line
    // is read as far as it goes: a refused head may be incomplete).
    let to_head = c.buf.starts_with(b"HEAD ");
    let mut head = Vec::with_capacity(160);
    let mut writer = write::Head::response(&mut head, status);
    writer.field(b"content-type", b"text/plain; charset=utf-8");
    writer.date();
    writer.content_length(body.len() as u64);
    writer.field(b"connection", b"close");
    writer.end();
    let body = if to_head { "" } else { &body };
    write_all(c, &[&head, body.as_bytes()], send_timeout).await
}

/// Closes a connection whose client may still be sending: its sending side first, then
/// what comes is read and thrown away, briefly.
async fn linger_on<I: AsyncRead + AsyncWrite + Unpin>(c: &mut Conn<I>) {
    let _ = c.io.shutdown().await;
    let mut read = 0u64;
    let drain = poll_fn(|cx| {
        while read < LINGER_BYTES {
            match std::task::ready!(read_away(cx, &mut c.io)) {
                Ok(0) | Err(_) => break,
                Ok(n) => read += n as u64,
            }
        }
        Poll::Ready(())
    });
    let _ = tokio::time::timeout(LINGER, drain).await;
}

#[cfg(test)]
mod tests;
