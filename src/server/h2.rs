//! One client connection speaking HTTP/2 (h2c with prior knowledge, or `h2` by ALPN over
//! TLS), served by hyper under the connection watchdog's timeouts. Each stream's request
//! is turned into the same `Request` the HTTP/1 engine hands the service, and the
//! service's `Response` into hyper's; nothing above knows which protocol it was.

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use hyper::body::{Body as _, Frame, Incoming, SizeHint};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tracing::debug;

use super::Timeouts;
use super::pace::{self, Pacer};
use super::watchdog::{self, DriveError, Watch, WatchedBody, WatchedIo};
use crate::connection::ClientConn;
use crate::head::{Fields, RequestHead};
use crate::http1::parse::Framing;
use crate::http1::{BodyError, BodySource};
use crate::message::{Body, Receipts, Request, Response, Service};

/// How HTTP/2 connections are served.
#[derive(Clone, Copy)]
pub struct H2Settings {
    /// HTTP/2's own bound on a request's header list; past it, h2 answers 431 itself.
    pub max_header_list_size: u32,
}

/// Serves HTTP/2 on `io` (from `conn`) with `service` until the connection closes, a
/// timeout expires, or shutdown's graceful close ends it.
pub async fn serve<I, S>(
    io: I,
    conn: ClientConn,
    service: Arc<S>,
    settings: H2Settings,
    timeouts: Timeouts,
    mut stopping: watch::Receiver<()>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: Service,
{
    let peer = conn.peer;
    let watch = Watch::new();
    let (conn, requests) = (Arc::new(conn), Arc::clone(&watch));
    let service = service_fn(move |req: http::Request<Incoming>| {
        let (service, conn) = (Arc::clone(&service), Arc::clone(&conn));
        let in_flight = requests.request(http::Version::HTTP_2);
        async move {
            let (parts, incoming) = req.into_parts();
            let head = RequestHead {
                method: &parts.method,
                target: parts.uri.path_and_query().map_or("/", http::uri::PathAndQuery::as_str),
                version: http::Version::HTTP_2,
                authority: parts.uri.authority().map(http::uri::Authority::as_str),
                fields: Fields::from(&parts.headers),
            };
            let framing = match (incoming.is_end_stream(), incoming.size_hint().exact()) {
                (true, _) => Framing::Empty,
                (false, Some(n)) => Framing::Length(n),
                (false, None) => Framing::Chunked,
            };
            let mut source = Stream { body: Some(incoming), trailers: None };
            let request = Request { head, framing, body: Some(&mut source) };
            let response = service.call(request, &conn).await;
            Ok::<_, Infallible>(into_hyper(response, &parts.method).map(|body| WatchedBody::new(body, in_flight)))
        }
    });
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder.timer(TokioTimer::new()).max_header_list_size(settings.max_header_list_size);
    let io = WatchedIo::new(TokioIo::new(io), Arc::clone(&watch));
    let connection = builder.serve_connection(io, service);
    // Borrowed, not moved: the receiver must live until the connection ends, as the
    // shutdown waits for every receiver to go.
    let goodbye = |conn: Pin<&mut _>| hyper::server::conn::http2::Connection::graceful_shutdown(conn);
    match watchdog::drive(connection, goodbye, &watch, timeouts, &mut stopping).await {
        Ok(()) => {}
        Err(DriveError::Connection(e)) => debug!(%peer, error = %e, "connection ended with an error"),
        Err(DriveError::Expired(why)) => debug!(%peer, timeout = why.as_str(), "connection closed"),
    }
}

/// A stream's request body, as the service reads bodies.
struct Stream {
    /// `None` once its rest was taken over (`detach`).
    body: Option<Incoming>,
    trailers: Option<HeaderMap>,
}

impl BodySource for Stream {
    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, BodyError>>> {
        match &mut self.body {
            Some(body) => crate::upstream::h2::poll_data(body, &mut self.trailers, cx),
            None => Poll::Ready(None),
        }
    }

    fn trailers(&mut self) -> Option<HeaderMap> {
        self.trailers.take()
    }

    /// The stream's body is hyper's, owned: it can go on after the request's call.
    fn detach(&mut self) -> Option<Box<dyn BodySource>> {
        let body = self.body.take()?;
        Some(Box::new(Stream { body: Some(body), trailers: None }))
    }
}

/// hyper's response of `response`, to a request with `method`.
fn into_hyper(response: Response, method: &Method) -> http::Response<Outgoing> {
    let bodiless = *method == Method::HEAD
        || response.status == StatusCode::NO_CONTENT
        || response.status == StatusCode::NOT_MODIFIED;
    let keep_length = bodiless && matches!(response.body, Body::Upstream(_));
    let mut headers = HeaderMap::new();
    response.each_field(keep_length, &mut |name, value| {
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
            headers.append(name, value);
        }
    });
    let Response { status, body, receipts, .. } = response;
    let pacer = response.pace.map(Pacer::new);
    let outgoing = Outgoing { body: Some(body), receipts, releasing: None, pacer, held: Bytes::new() };
    let mut out = http::Response::new(outgoing);
    *out.status_mut() = status;
    *out.headers_mut() = headers;
    out
}

/// A response body as hyper sends it: the service's, carrying the receipts to its end.
pub struct Outgoing {
    /// `None` once sent.
    body: Option<Body>,
    receipts: Receipts,
    /// The release of global slots under way, and the frame (or end) it holds back.
    releasing: Option<(Release, Option<Frame<Bytes>>)>,
    /// The body's pace (the route's `response_body_rate`), and what it read but did not
    /// send yet.
    pacer: Option<Pacer>,
    held: Bytes,
}

type Release = Pin<Box<dyn Future<Output = ()> + Send>>;

impl Outgoing {
    /// The body's last `data` (or none, and then its trailers, if it has any): the slots
    /// go back first.
    fn end(
        &mut self,
        cx: &mut Context<'_>,
        data: Option<Bytes>,
    ) -> Poll<Option<Result<Frame<Bytes>, <Self as hyper::body::Body>::Error>>> {
        // A body's trailers come once its data has ended (a poll that gave data did not
        // read them yet).
        let trailers = match (&mut self.body, &data) {
            (Some(Body::Upstream(body)), None) => body.trailers(),
            _ => None,
        };
        self.receipts.ended(trailers.as_ref());
        self.body = None;
        let frame = data.map(Frame::data).or_else(|| trailers.map(Frame::trailers));
        match self.receipts.permits.finish() {
            None => Poll::Ready(frame.map(Ok)),
            Some(release) => {
                self.releasing = Some((Box::pin(release), frame));
                Pin::new(self).poll_frame(cx)
            }
        }
    }
}

impl hyper::body::Body for Outgoing {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    /// Slots are given back when the body ends. The last frame (or the end) waits until
    /// global slots are released in Redis, so the client cannot see its response done
    /// while the slot still counts.
    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Some((release, _)) = &mut this.releasing {
            std::task::ready!(release.as_mut().poll(cx));
            let held = this.releasing.take().and_then(|(_, frame)| frame);
            return Poll::Ready(held.map(Ok));
        }
        if let (Some(pacer), false) = (&mut this.pacer, this.held.is_empty()) {
            // A paced body goes in steps of what was read, each once the pace allows it.
            let n = pace::piece_bytes(pacer.rate()).min(this.held.len());
            std::task::ready!(pacer.poll_send(cx, n));
            let step = this.held.split_to(n);
            if !this.held.is_empty() || this.body.is_some() {
                return Poll::Ready(Some(Ok(Frame::data(step))));
            }
            return this.end(cx, Some(step));
        }
        let (frame, ends) = match &mut this.body {
            None => (None, true),
            Some(Body::Full(bytes)) => {
                let bytes = std::mem::take(bytes);
                this.body = None;
                (Some(bytes).filter(|b| b.has_remaining()), true)
            }
            Some(Body::Upstream(body)) => match std::task::ready!(body.poll_data(cx)) {
                Some(Ok(data)) => (Some(data), body.is_done()),
                Some(Err(e)) => return Poll::Ready(Some(Err(Box::new(e)))),
                None => (None, true),
            },
        };
        if let (Some(entry), Some(data)) = (&mut this.receipts.access, &frame) {
            entry.bytes += data.len() as u64;
        }
        let frame = match frame {
            Some(data) if this.pacer.is_some() => {
                this.held = data;
                if ends {
                    this.body = None;
                }
                return Pin::new(this).poll_frame(cx);
            }
            frame => frame,
        };
        if !ends {
            return Poll::Ready(frame.map(|data| Ok(Frame::data(data))));
        }
        this.end(cx, frame)
    }

    /// A body made here and empty ends with the head: a gRPC answer made here is a
    /// trailers-only response (its status in the one HEADERS frame, which ends the
    /// stream), as the protocol requires.
    fn is_end_stream(&self) -> bool {
        let empty = match &self.body {
            None => true,
            Some(Body::Full(bytes)) => bytes.is_empty(),
            Some(Body::Upstream(_)) => false,
        };
        self.releasing.is_none() && !self.receipts.permits.holds_leases() && empty && self.held.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        match &self.body {
            None => SizeHint::with_exact(0),
            Some(Body::Full(bytes)) => SizeHint::with_exact(bytes.len() as u64),
            Some(Body::Upstream(body)) => body.length().map_or_else(SizeHint::default, SizeHint::with_exact),
        }
    }
}

/// A connection whose first bytes were read already (looking for the HTTP/2 preface):
/// they are read again first.
pub struct Rewind<I> {
    read: Bytes,
    io: I,
}

impl<I> Rewind<I> {
    pub fn new(read: Bytes, io: I) -> Self {
        Rewind { read, io }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Rewind<I> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.read.has_remaining() {
            let n = this.read.len().min(buf.remaining());
            buf.put_slice(&this.read[..n]);
            this.read.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Rewind<I> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
