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
use hyper::body::{Body as _, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tracing::debug;

use super::Timeouts;
use super::watchdog::{self, DriveError, Watch, WatchedBody, WatchedIo};
use crate::wire::connection::ClientConn;
use crate::wire::head::{Fields, RequestHead};
use crate::wire::http1::parse::Framing;
use crate::wire::http1::{BodyError, BodySource, FramingError};
use crate::wire::message::{self, Request, Response, ResponseBody as _, Service};

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
        let in_flight = requests.request();
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
            let mut response = service.call(request, &conn).await;
            // A body with nothing left but its end goes out in the head (see
            // `ResponseBody::poll_ended`).
            std::future::poll_fn(|cx| response.body.poll_ended(cx)).await;
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
            Some(body) => poll_data(body, &mut self.trailers, cx),
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
fn into_hyper<B>(response: Response<B>, method: &Method) -> http::Response<B> {
    let bodiless = *method == Method::HEAD
        || response.status == StatusCode::NO_CONTENT
        || response.status == StatusCode::NOT_MODIFIED;
    let keep_length = bodiless && matches!(response.fields, message::ResponseFields::Upstream(_));
    let mut headers = HeaderMap::new();
    response.each_field(keep_length, &mut |name, value| {
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
            headers.append(name, value);
        }
    });
    let mut out = http::Response::new(response.body);
    *out.status_mut() = response.status;
    *out.headers_mut() = headers;
    out
}

/// The next data of an HTTP/2 body, a request's or a response's; its trailers, checked
/// as header fields are (`crate::wire::head::trailer_fields`), are kept in `trailers`. `None`
/// at its end.
pub fn poll_data(
    body: &mut Incoming,
    trailers: &mut Option<HeaderMap>,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Bytes, BodyError>>> {
    loop {
        match std::task::ready!(Pin::new(&mut *body).poll_frame(cx)) {
            None => return Poll::Ready(None),
            Some(Err(e)) => return Poll::Ready(Some(Err(BodyError::Io(std::io::Error::other(e))))),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => return Poll::Ready(Some(Ok(data))),
                Err(frame) => {
                    if let Ok(fields) = frame.into_trailers() {
                        let Some(fields) = crate::wire::head::trailer_fields(fields) else {
                            return Poll::Ready(Some(Err(BodyError::Framing(FramingError::Trailer))));
                        };
                        *trailers = Some(fields);
                    }
                }
            },
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
