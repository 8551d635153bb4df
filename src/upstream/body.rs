//! The request body on its way upstream, held to the route's size limit and to
//! `server.body_read_timeout`. A body that breaks either is cut: the upstream request is
//! aborted (hyper drops an upstream connection whose request body failed), and the fault
//! is noted so the request is answered 413 or 408 if the upstream has not answered yet.

use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::time::Sleep;

/// Why a request body was cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BodyFault {
    #[error("request body larger than {0} bytes")]
    TooLarge(u64),
    #[error("no request body data for {0:?}")]
    TooSlow(Duration),
}

/// Where the body leaves word of its fault for the request's handler.
pub type FaultCell = Arc<OnceLock<BodyFault>>;

pub struct RequestBody {
    inner: Incoming,
    limit: Option<u64>,
    read: u64,
    timeout: Duration,
    /// Armed while the upstream waits for data the client has not sent.
    timer: Option<Pin<Box<Sleep>>>,
    fault: FaultCell,
}

impl RequestBody {
    pub fn new(inner: Incoming, limit: Option<u64>, timeout: Duration, fault: FaultCell) -> Self {
        RequestBody { inner, limit, read: 0, timeout, timer: None, fault }
    }

    fn cut(&mut self, fault: BodyFault) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let _ = self.fault.set(fault);
        Poll::Ready(Some(Err(Box::new(fault))))
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => {
                let timeout = this.timeout;
                let timer = this.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => this.cut(BodyFault::TooSlow(timeout)),
                    Poll::Pending => Poll::Pending,
                }
            }
            Poll::Ready(Some(Ok(frame))) => {
                this.timer = None;
                if let Some(data) = frame.data_ref() {
                    this.read = this.read.saturating_add(data.len() as u64);
                    if let Some(limit) = this.limit.filter(|&limit| this.read > limit) {
                        return this.cut(BodyFault::TooLarge(limit));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Box::new(e)))),
            Poll::Ready(None) => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
