//! Requests to HTTP/2 servers (`http2: true`), through hyper: hyper drives the shared
//! connection from a task of its own and sends a request's body from there, so the body
//! goes through a channel (`Piped`) that the request's task fills from the client's
//! body. Trailers pass both ways. A response may begin before the request's body has
//! ended (a bidirectional gRPC call): the rest of the body is then sent by a task of its
//! own, which ends with the response (`Pumping`).

use std::future::poll_fn;
use std::pin::{Pin, pin};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, Uri};
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::client::conn::http2::SendRequest;
use tokio::sync::mpsc;

use crate::wire::http1::{BodyError, BodySource};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of a request to an HTTP/2 server.
pub type H2Body = BoxBody<Bytes, BoxError>;

/// Why a request to an HTTP/2 server failed.
pub enum H2Error {
    Exchange(hyper::Error),
    /// The client's body failed on the way.
    Body(BodyError),
}

/// A response from an HTTP/2 server, and the task still sending its request's body,
/// if the response began first.
pub struct Sent {
    pub response: Response<Incoming>,
    pub pumping: Option<Pumping>,
}

/// The task sending the rest of a request body whose response has begun; stopped when
/// dropped (with the response: a call whose answer is gone or done takes no more), which
/// resets the request's stream upstream.
pub struct Pumping(tokio::task::JoinHandle<()>);

impl Drop for Pumping {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Sends a request with `fields` for `uri` to `sender`, its body read from `body`, and
/// returns the response once its head has come. A body that has not ended by then goes
/// on being sent by a task of its own, when it can outlive the request
/// (`BodySource::detach`); otherwise the response waits until it has been sent (ending
/// it early would end the stream as if it were whole).
pub async fn send(
    sender: &mut SendRequest<H2Body>,
    method: &http::Method,
    uri: Uri,
    fields: HeaderMap,
    body: Option<&mut (dyn BodySource + '_)>,
) -> Result<Sent, H2Error> {
    let (source, request_body) = match body {
        Some(source) => {
            // One piece in the channel, one in hand: a client faster than the server
            // is held back by the stream's flow control, not buffered.
            let (tx, rx) = mpsc::channel(1);
            (Some((source, Pipe { tx, held: None, ended: false, done: false })), Piped { rx, ended: false }.boxed())
        }
        None => (None, http_body_util::Empty::new().map_err(|never| match never {}).boxed()),
    };
    let mut request = Request::new(request_body);
    *request.method_mut() = method.clone();
    *request.uri_mut() = uri;
    *request.headers_mut() = fields;
    sender.ready().await?;
    let mut response = pin!(sender.send_request(request));
    let Some((source, mut pipe)) = source else {
        return Ok(Sent { response: response.await?, pumping: None });
    };
    let first = {
        let pumping = pin!(pipe.run(&mut *source));
        tokio::select! {
            body = pumping => Err(body),
            response = &mut response => Ok(response),
        }
    };
    match first {
        // The body ended (or failed: the stream is reset) before the response came.
        Err(Ok(())) => Ok(Sent { response: response.await?, pumping: None }),
        Err(Err(e)) => Err(H2Error::Body(e)),
        Ok(Err(e)) => Err(H2Error::Exchange(e)),
        Ok(Ok(response)) if pipe.done => Ok(Sent { response, pumping: None }),
        Ok(Ok(response)) => match source.detach() {
            Some(mut rest) => {
                let task = tokio::spawn(async move {
                    // A body that fails resets the stream; the response says the rest.
                    let _ = pipe.run(&mut *rest).await;
                });
                Ok(Sent { response, pumping: Some(Pumping(task)) })
            }
            None => {
                pipe.run(source).await.map_err(H2Error::Body)?;
                Ok(Sent { response, pumping: None })
            }
        },
    }
}

/// The sending end of a request body's channel: what was read from the client and not
/// yet sent is kept here, not in the future that sends it, so that the future can be
/// dropped and the body taken up again by another (`send`).
struct Pipe {
    /// Frames, then `None` for the body's end; closed without it, the stream is reset.
    tx: mpsc::Sender<Option<Frame<Bytes>>>,
    held: Option<Option<Frame<Bytes>>>,
    /// The client's body has ended: the trailers (if any) and the end are all that is left.
    ended: bool,
    /// The end has been sent.
    done: bool,
}

impl Pipe {
    /// Sends `source` to its end (then its trailers, then the end).
    async fn run(&mut self, source: &mut (dyn BodySource + '_)) -> Result<(), BodyError> {
        loop {
            if self.held.is_none() {
                let piece = if self.ended {
                    None
                } else {
                    match poll_fn(|cx| source.poll_chunk(cx)).await {
                        Some(Ok(data)) => Some(Frame::data(data)),
                        Some(Err(e)) => return Err(e),
                        None => {
                            self.ended = true;
                            source.trailers().map(Frame::trailers)
                        }
                    }
                };
                self.held = Some(piece);
            }
            let Ok(permit) = self.tx.reserve().await else {
                // The stream is gone; its response says why.
                return Ok(());
            };
            let Some(piece) = self.held.take() else { continue };
            let end = piece.is_none();
            permit.send(piece);
            if end {
                self.done = true;
                return Ok(());
            }
        }
    }
}

/// A request body as hyper sends it: what `Pipe` sends through the channel.
struct Piped {
    rx: mpsc::Receiver<Option<Frame<Bytes>>>,
    ended: bool,
}

impl hyper::body::Body for Piped {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        match std::task::ready!(self.rx.poll_recv(cx)) {
            Some(Some(frame)) => Poll::Ready(Some(Ok(frame))),
            Some(None) => {
                self.ended = true;
                Poll::Ready(None)
            }
            // The sender went before the end (the client's body failed, or the call was
            // cancelled): the stream is reset, not ended as if whole.
            None => Poll::Ready(Some(Err("the request body was cut off".into()))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// Header fields as a `HeaderMap`, from (name, value) pairs; one that is no valid field
/// (they were all checked as they came in) is left out.
pub fn header_map(pairs: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(&name), HeaderValue::from_bytes(&value)) {
            map.append(name, value);
        }
    }
    map
}

impl From<hyper::Error> for H2Error {
    fn from(e: hyper::Error) -> Self {
        H2Error::Exchange(e)
    }
}
