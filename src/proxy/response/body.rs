//! The body of every response, streamed from the upstream or made here in full, which
//! carries the request's receipts (`Permits`) and its access log line to the end.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::{Body, Frame, SizeHint};

use crate::access_log::Entry;
use crate::gate::Permits;
use crate::upstream::UpstreamBody;

/// A response body, streamed from the upstream or made here in full, carrying the
/// request's concurrency slots: they are given back when the body has been sent to the
/// end, or when hyper drops it because the client went away.
pub struct ProxyBody {
    pub(super) inner: Either<UpstreamBody, Full<Bytes>>,
    permits: Permits,
    /// The release of global slots under way, and the frame (or end) it holds back.
    releasing: Option<(Release, Option<Frame<Bytes>>)>,
    /// The request's access log line, written when this body is dropped.
    access: Option<Box<Entry>>,
}

type Release = Pin<Box<dyn Future<Output = ()> + Send>>;

impl ProxyBody {
    pub fn streamed(body: UpstreamBody) -> Self {
        ProxyBody { inner: Either::Left(body), permits: Permits::default(), releasing: None, access: None }
    }

    pub fn full(body: impl Into<Bytes>) -> Self {
        let inner = Either::Right(Full::new(body.into()));
        ProxyBody { inner, permits: Permits::default(), releasing: None, access: None }
    }

    pub fn holding(self, permits: Permits) -> Self {
        ProxyBody { permits, ..self }
    }

    /// Counts the bytes sent into `entry`, which writes its line when the body is dropped:
    /// sent in full, or abandoned by the client.
    pub fn logged(self, entry: Box<Entry>) -> Self {
        ProxyBody { access: Some(entry), ..self }
    }
}

impl Body for ProxyBody {
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
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let (Some(entry), Poll::Ready(Some(Ok(frame)))) = (&mut this.access, &polled) {
            entry.bytes += frame.data_ref().map_or(0, |d| d.len() as u64);
        }
        let ends = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => this.inner.is_end_stream(),
            _ => false,
        };
        if !ends {
            return polled;
        }
        let Some(release) = this.permits.finish() else { return polled };
        let frame = match polled {
            Poll::Ready(Some(Ok(frame))) => Some(frame),
            _ => None,
        };
        this.releasing = Some((Box::pin(release), frame));
        Pin::new(this).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.releasing.is_none() && !self.permits.holds_leases() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
