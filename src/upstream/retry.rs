//! When a failed attempt may go to the next server, and the request body that lets it.
//!
//! A request is tried again only if it could not have reached the application: the
//! connection failed, or closed before any byte of the response. Even then only if the
//! method is idempotent (RFC 9110 §9.2.2) or its body, not empty, was not sent at all
//! (the server cannot have acted on half a request); and never once a byte of the body
//! left, since a streamed body cannot be sent twice.

use std::error::Error as StdError;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

use super::body::RequestBody;
use super::error::SendError;

type BoxError = Box<dyn StdError + Send + Sync>;

/// The client's request body, lent to one attempt after another until one of them
/// takes a frame of it.
pub struct Replayable {
    shared: Option<Arc<Mutex<Shared>>>,
}

struct Shared {
    body: RequestBody,
    /// The attempt that may read the body; an earlier one that hyper still polls on a
    /// dead connection gets an error instead of the next attempt's bytes.
    attempt: u32,
    /// A frame has been handed out: the body cannot be sent again.
    taken: bool,
}

/// The body of one attempt.
pub struct AttemptBody {
    shared: Option<Arc<Mutex<Shared>>>,
    attempt: u32,
}

impl Replayable {
    pub fn new(body: RequestBody) -> Self {
        // A body known to be empty needs no sharing: each attempt sends nothing.
        let shared = (!body.is_end_stream()).then(|| Arc::new(Mutex::new(Shared { body, attempt: 0, taken: false })));
        Replayable { shared }
    }

    /// The body for the next attempt; earlier attempts' bodies stop reading.
    pub fn attempt(&self) -> AttemptBody {
        let attempt = self.shared.as_ref().map_or(0, |s| {
            let mut shared = lock(s);
            shared.attempt += 1;
            shared.attempt
        });
        AttemptBody { shared: self.shared.clone(), attempt }
    }

    /// Whether a request that failed with `error` before its response may be tried on
    /// another server.
    pub fn may_retry(&self, error: &SendError, idempotent: bool) -> bool {
        let (taken, empty) = match &self.shared {
            None => (false, true),
            Some(s) => (lock(s).taken, false),
        };
        if taken {
            return false;
        }
        match error {
            // Nothing was sent on a connection that was never made.
            SendError::Connect(_) => true,
            SendError::Exchange(e) => closed_before_response(e) && (idempotent || !empty),
        }
    }
}

/// The connection closed or was reset with no response yet (not: a malformed response,
/// whose bytes did arrive).
fn closed_before_response(error: &hyper::Error) -> bool {
    let mut source: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(e) = source {
        if let Some(e) = e.downcast_ref::<hyper::Error>()
            && (e.is_incomplete_message() || e.is_canceled())
        {
            return true;
        }
        if let Some(e) = e.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            return matches!(e.kind(), ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof);
        }
        source = e.source();
    }
    false
}

fn lock(shared: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    // The body is left as it was by a holder that panicked: still a body.
    shared.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Debug, thiserror::Error)]
#[error("request body handed to a later attempt")]
struct Superseded;

impl Body for AttemptBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let Some(shared) = &self.shared else { return Poll::Ready(None) };
        let mut shared = lock(shared);
        if shared.attempt != self.attempt {
            return Poll::Ready(Some(Err(Box::new(Superseded))));
        }
        let polled = Pin::new(&mut shared.body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(_))) = &polled {
            shared.taken = true;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.shared.as_ref().is_none_or(|s| lock(s).body.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.shared.as_ref().map_or_else(|| SizeHint::with_exact(0), |s| lock(s).body.size_hint())
    }
}
