//! The request body on its way upstream, held to the route's size limit and to
//! `server.body_read_timeout`, and counted, so that a request whose body has begun to
//! leave is never sent again. A body that breaks a limit is cut: the exchange fails (its
//! connection is not kept), and the fault is kept so the request is answered 413 or 408
//! if the upstream has not answered yet. Each piece that leaves is stamped (`Progress`):
//! a request whose body is still moving is not a stalled upstream.
//!
//! A body whose first bytes were read before the admission (`peek`, for the JSON fields
//! its limits read) sends them first, unchanged, then the rest as it comes; the rest is
//! scanned as it passes, and a field the limits read, sent again, cuts it (`Repeated`).
//!
//! A body that goes on after its response has begun (an HTTP/2 client's, `detach`) is
//! no longer held to `body_read_timeout`: a bidirectional stream waits on both sides as
//! its application decides, as long as the response is in progress.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::time::{Instant, Sleep};

use crate::front::body::Scan;
use crate::policy::key::ClaimPath;
use crate::wire::http1::{BodyError, BodySource};

/// Why a request body was cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BodyFault {
    #[error("request body larger than {0} bytes")]
    TooLarge(u64),
    #[error("no request body data for {0:?}")]
    TooSlow(Duration),
    /// A field of a JSON body that a limit read, sent again further on.
    #[error("request body repeats a field its limits read")]
    Repeated,
}

/// The first bytes of a request body, read before its admission for the JSON fields its
/// limits read, and the scan that read them.
pub struct Peeked {
    /// The bytes read, to be sent first, as they came: one buffer, whatever the pieces
    /// (a client sending a byte a chunk would otherwise have a 64 KiB peek held as
    /// 65,536 pieces).
    read: Option<Bytes>,
    pub scan: Scan,
    /// The body ended within them.
    pub ended: bool,
    /// The bytes at the end of `read` past the peek, not scanned yet.
    tail: usize,
}

impl Peeked {
    /// The bytes scanned, as they came.
    pub fn scanned(&self) -> &[u8] {
        self.read.as_deref().map_or(&[], |read| &read[..read.len() - self.tail])
    }
}

/// Why a body could not be peeked.
#[derive(Debug)]
pub enum PeekError {
    /// It broke off or broke its framing.
    Broken(BodyError),
    /// Its next piece did not come within the timeout.
    TooSlow(Duration),
    /// More than the route's `max_body_bytes` came: how much.
    TooLarge(u64),
}

/// Reads the first `peek` bytes of `source` (the whole of a shorter body), each piece
/// within `timeout` of the last, at most `limit` (the route's `max_body_bytes`), scanning
/// them for `fields`.
pub async fn peek(
    source: &mut (dyn BodySource + '_),
    fields: Arc<[ClaimPath]>,
    peek: u64,
    limit: Option<u64>,
    timeout: Duration,
) -> Result<Peeked, PeekError> {
    let mut peeked = Peeked { read: None, scan: Scan::new(fields), ended: false, tail: 0 };
    let mut bytes = BytesMut::new();
    let mut read = 0u64;
    while read < peek {
        let next = std::future::poll_fn(|cx| source.poll_chunk(cx));
        match tokio::time::timeout(timeout, next).await {
            Err(_) => return Err(PeekError::TooSlow(timeout)),
            Ok(None) => {
                peeked.ended = true;
                break;
            }
            Ok(Some(Err(e))) => return Err(PeekError::Broken(e)),
            Ok(Some(Ok(piece))) => {
                read = read.saturating_add(piece.len() as u64);
                if limit.is_some_and(|limit| read > limit) {
                    return Err(PeekError::TooLarge(read));
                }
                // Only the first `peek` bytes are read for the admission; the rest of a
                // piece is scanned as it is sent.
                let room = usize::try_from(peek - (read - piece.len() as u64)).unwrap_or(usize::MAX);
                let scanned = piece.len().min(room);
                peeked.scan.feed(&piece[..scanned]);
                peeked.tail = piece.len() - scanned;
                bytes.extend_from_slice(&piece);
            }
        }
    }
    peeked.read = (!bytes.is_empty()).then(|| bytes.freeze());
    Ok(peeked)
}

/// When a request body last moved, shared with what times the upstream's answer.
#[derive(Debug)]
pub struct Progress {
    since: Instant,
    /// Nanoseconds from `since` to the last piece.
    last: AtomicU64,
}

impl Progress {
    fn new() -> Self {
        Progress { since: Instant::now(), last: AtomicU64::new(0) }
    }

    fn moved(&self) {
        self.last.store(u64::try_from(self.since.elapsed().as_nanos()).unwrap_or(u64::MAX), Relaxed);
    }

    /// When the body last moved (when it began, if it has not).
    pub fn last(&self) -> Instant {
        self.since + Duration::from_nanos(self.last.load(Relaxed))
    }
}

/// Where a body is read from: the request's, or its rest taken over (`detach`).
enum Inner<'a> {
    Borrowed(&'a mut (dyn BodySource + 'a)),
    Owned(Box<dyn BodySource>),
}

/// A client's request body held to its limits.
pub struct RequestBody<'a> {
    inner: Inner<'a>,
    limit: Option<u64>,
    read: u64,
    /// `None` once the response has begun (`detach`).
    timeout: Option<Duration>,
    /// Made when first asked for (a request without a body has none to tell).
    progress: Option<Arc<Progress>>,
    /// Armed while the upstream waits for data the client has not sent.
    timer: Option<Pin<Box<Sleep>>>,
    /// Why it was cut, if it was.
    pub fault: Option<BodyFault>,
    /// A piece of it has been handed out: it cannot be sent again.
    pub taken: bool,
    /// Its first bytes, read before the admission, and the scan of its JSON fields.
    peeked: Option<Box<Peeked>>,
}

impl<'a> RequestBody<'a> {
    /// `inner`, at most `limit` bytes of it (`None`: any), each piece within `timeout`
    /// of the previous one.
    pub fn new(inner: &'a mut (dyn BodySource + 'a), limit: Option<u64>, timeout: Duration) -> Self {
        let inner = Inner::Borrowed(inner);
        RequestBody {
            inner,
            limit,
            read: 0,
            timeout: Some(timeout),
            progress: None,
            timer: None,
            fault: None,
            taken: false,
            peeked: None,
        }
    }

    /// The same body, its first bytes already read (`peeked`): they are sent first.
    pub fn with_peeked(mut self, peeked: Option<Box<Peeked>>) -> Self {
        self.peeked = peeked;
        self
    }

    /// When the body last moved (from now on: asked for before it is read).
    pub fn progress(&mut self) -> Arc<Progress> {
        Arc::clone(self.progress.get_or_insert_with(|| Arc::new(Progress::new())))
    }

    fn source(&mut self) -> &mut (dyn BodySource + 'a) {
        match &mut self.inner {
            Inner::Borrowed(inner) => &mut **inner,
            Inner::Owned(inner) => &mut **inner,
        }
    }

    /// `data` leaves: counted, held to the size limit, and to the fields read once.
    fn passed(&mut self, data: Bytes) -> Poll<Option<Result<Bytes, BodyError>>> {
        self.taken = true;
        if self.peeked.as_ref().is_some_and(|p| p.scan.repeated().is_some()) {
            return self.cut(BodyFault::Repeated);
        }
        if let Some(progress) = &self.progress {
            progress.moved();
        }
        self.read = self.read.saturating_add(data.len() as u64);
        if let Some(limit) = self.limit.filter(|&limit| self.read > limit) {
            return self.cut(BodyFault::TooLarge(limit));
        }
        Poll::Ready(Some(Ok(data)))
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
        if let Some(peeked) = &mut self.peeked
            && let Some(read) = peeked.read.take()
        {
            // Read before the admission: only what lay past the peek is scanned now.
            peeked.scan.feed(&read[read.len() - peeked.tail..]);
            return self.passed(read);
        }
        if self.peeked.as_ref().is_some_and(|p| p.ended) {
            // It ended within the peek: its source has said so once.
            return Poll::Ready(None);
        }
        match self.source().poll_chunk(cx) {
            Poll::Pending => {
                let Some(timeout) = self.timeout else { return Poll::Pending };
                let timer = self.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => self.cut(BodyFault::TooSlow(timeout)),
                    Poll::Pending => Poll::Pending,
                }
            }
            Poll::Ready(Some(Ok(data))) => {
                self.timer = None;
                if let Some(peeked) = &mut self.peeked {
                    peeked.scan.feed(&data);
                }
                self.passed(data)
            }
            other => other,
        }
    }

    fn trailers(&mut self) -> Option<http::HeaderMap> {
        self.source().trailers()
    }

    fn detach(&mut self) -> Option<Box<dyn BodySource>> {
        let rest = self.source().detach()?;
        Some(Box::new(RequestBody {
            inner: Inner::Owned(rest),
            limit: self.limit,
            read: self.read,
            timeout: None,
            progress: self.progress.clone(),
            timer: None,
            fault: None,
            taken: true,
            peeked: self.peeked.take(),
        }))
    }

    fn poll_interim(&mut self, cx: &mut Context<'_>, head: &crate::wire::http1::parse::ResponseHead) -> Poll<()> {
        self.source().poll_interim(cx, head)
    }
}
