//! The request body on its way upstream, held to the route's size limit and to
//! `server.body_read_timeout`, and counted, so that a request whose body has begun to
//! leave is never sent again. A body that breaks a limit is cut: the exchange fails (its
//! connection is not kept), and the fault is kept so the request is answered 413 or 408
//! if the upstream has not answered yet.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Sleep;

use crate::http1::{BodyError, BodySource};

/// Why a request body was cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BodyFault {
    #[error("request body larger than {0} bytes")]
    TooLarge(u64),
    #[error("no request body data for {0:?}")]
    TooSlow(Duration),
}

/// A client's request body held to its limits.
pub struct RequestBody<'a> {
    inner: &'a mut (dyn BodySource + 'a),
    limit: Option<u64>,
    read: u64,
    timeout: Duration,
    /// Armed while the upstream waits for data the client has not sent.
    timer: Option<Pin<Box<Sleep>>>,
    /// Why it was cut, if it was.
    pub fault: Option<BodyFault>,
    /// A piece of it has been handed out: it cannot be sent again.
    pub taken: bool,
}

impl<'a> RequestBody<'a> {
    /// `inner`, at most `limit` bytes of it (`None`: any), each piece within `timeout`
    /// of the previous one.
    pub fn new(inner: &'a mut (dyn BodySource + 'a), limit: Option<u64>, timeout: Duration) -> Self {
        RequestBody { inner, limit, read: 0, timeout, timer: None, fault: None, taken: false }
    }

    fn cut(&mut self, fault: BodyFault) -> Poll<Option<Result<Bytes, BodyError>>> {
        self.fault = Some(fault);
        Poll::Ready(Some(Err(BodyError::Cut)))
    }
}

impl BodySource for RequestBody<'_> {
    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, BodyError>>> {
        if let Some(fault) = self.fault {
            return self.cut(fault);
        }
        match self.inner.poll_chunk(cx) {
            Poll::Pending => {
                let timeout = self.timeout;
                let timer = self.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => self.cut(BodyFault::TooSlow(timeout)),
                    Poll::Pending => Poll::Pending,
                }
            }
            Poll::Ready(Some(Ok(data))) => {
                self.timer = None;
                self.taken = true;
                self.read = self.read.saturating_add(data.len() as u64);
                if let Some(limit) = self.limit.filter(|&limit| self.read > limit) {
                    return self.cut(BodyFault::TooLarge(limit));
                }
                Poll::Ready(Some(Ok(data)))
            }
            other => other,
        }
    }

    fn poll_interim(&mut self, cx: &mut Context<'_>, head: &crate::http1::parse::ResponseHead) -> Poll<()> {
        self.inner.poll_interim(cx, head)
    }
}
