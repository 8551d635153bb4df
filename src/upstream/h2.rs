//! Requests to HTTP/2 servers (`http2: true`), through hyper: hyper drives the shared
//! connection from a task of its own and sends a request's body from there, so the body
//! goes through a channel that the request's task fills from the client's body.

use std::future::poll_fn;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, Uri};
use http_body_util::BodyExt;
use http_body_util::channel::{Channel, Sender};
use http_body_util::combinators::BoxBody;
use hyper::body::{Body as _, Incoming};
use hyper::client::conn::http2::SendRequest;

use crate::http1::{BodyError, BodySource};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of a request to an HTTP/2 server.
pub type H2Body = BoxBody<Bytes, BoxError>;

/// Why a request to an HTTP/2 server failed.
pub enum H2Error {
    Exchange(hyper::Error),
    /// The client's body failed on the way.
    Body(BodyError),
}

/// The next data of an HTTP/2 body, a request's or a response's (trailers are not
/// forwarded); `None` at its end.
pub fn poll_data(body: &mut Incoming, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, BodyError>>> {
    loop {
        match std::task::ready!(Pin::new(&mut *body).poll_frame(cx)) {
            None => return Poll::Ready(None),
            Some(Err(e)) => return Poll::Ready(Some(Err(BodyError::Io(std::io::Error::other(e))))),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    return Poll::Ready(Some(Ok(data)));
                }
            }
        }
    }
}

/// Sends a request with `fields` for `uri` to `sender`, its body read from `body`, and
/// returns the response head once the body has been sent too (a response that comes
/// first waits for it: ending the body early would end the stream as if it were whole).
pub async fn send(
    sender: &mut SendRequest<H2Body>,
    method: &http::Method,
    uri: Uri,
    fields: HeaderMap,
    body: Option<&mut (dyn BodySource + '_)>,
) -> Result<Response<Incoming>, H2Error> {
    let (tx, request_body): (Option<Sender<Bytes, BoxError>>, H2Body) = match body {
        Some(_) => {
            let (tx, channel) = Channel::new(1);
            (Some(tx), channel.boxed())
        }
        None => (None, http_body_util::Empty::new().map_err(|never| match never {}).boxed()),
    };
    let mut request = Request::new(request_body);
    *request.method_mut() = method.clone();
    *request.uri_mut() = uri;
    *request.headers_mut() = fields;
    sender.ready().await?;
    let response = async { sender.send_request(request).await.map_err(H2Error::Exchange) };
    let pump = async {
        let (Some(source), Some(mut tx)) = (body, tx) else { return Ok(()) };
        loop {
            match poll_fn(|cx| source.poll_chunk(cx)).await {
                Some(Ok(data)) => {
                    if tx.send_data(data).await.is_err() {
                        // The stream is gone; its response says why.
                        return Ok(());
                    }
                }
                Some(Err(e)) => {
                    tx.abort(Box::new(std::io::Error::other(e.to_string())));
                    return Err(H2Error::Body(e));
                }
                None => return Ok(()),
            }
        }
    };
    let (response, ()) = tokio::try_join!(response, pump)?;
    Ok(response)
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
