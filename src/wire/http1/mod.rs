//! HTTP/1.x, framed by sluicegate itself on both sides over `httparse`, as nginx,
//! HAProxy, h2o and Pingora frame it themselves: heads parsed where they lie in the read
//! buffer (`parse`), bodies read and written by their framing (`body`), heads written in
//! one buffer (`write`), a client connection's requests read and answered (`server`),
//! and a request sent to a server on a connection the request's own task drives
//! (`client`). HTTP/2 stays with hyper; above this module every request looks the same
//! (`crate::wire::head`).
//!
//! Written here rather than taken from hyper, whose HTTP/1 machinery (two state machines,
//! a header map per message, a task and channel per upstream connection, a buffer per
//! connection) cost twice nginx's instructions per request and 44 KB per kept-alive
//! connection (docs/performance.md).

pub mod body;
pub mod client;
pub mod date;
#[cfg(test)]
pub mod mock;
pub mod parse;
pub mod server;
pub mod write;

use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub use body::FramingError;

/// Where a request body comes from, piece by piece: an HTTP/1 client connection, an
/// HTTP/2 stream, or either held to a route's limits. It is the client's side of the
/// exchange, so it also takes what the upstream says before its final response.
pub trait BodySource: Send {
    /// The next piece of the body; `None` at its end.
    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, BodyError>>>;

    /// The trailer fields that came after the body (checked as header fields are), once
    /// `poll_chunk` has said the body ended; given once.
    fn trailers(&mut self) -> Option<http::HeaderMap> {
        None
    }

    /// The rest of the body as a source of its own, one that outlives the request, when
    /// its protocol allows it (an HTTP/2 stream's: the body of a stream that goes both
    /// ways at once, such as a bidirectional gRPC call, keeps coming after the response
    /// has begun). Taken once; `None` where the body is read from the connection.
    fn detach(&mut self) -> Option<Box<dyn BodySource>> {
        None
    }

    /// Passes an interim (1xx) response of the upstream on to the client (RFC 9110
    /// §15.2: a proxy forwards those it did not ask for), when its protocol can carry
    /// one; ready once it is written (or dropped). By default it is dropped: HTTP/2's
    /// server (hyper) cannot send one.
    fn poll_interim(&mut self, _cx: &mut Context<'_>, _head: &parse::ResponseHead) -> Poll<()> {
        Poll::Ready(())
    }
}

/// Why a body could not be read to its end.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// It broke its framing (a bad chunk size, fewer bytes than its length).
    #[error("{0}")]
    Framing(FramingError),
    /// Its connection failed.
    #[error("{0}")]
    Io(#[source] io::Error),
    /// A limit cut it (too large, too slow): the limit says which.
    #[error("cut by a limit")]
    Cut,
}

/// Bytes a read takes at most: one buffer per thread, so that a connection waiting for
/// data holds none.
const READ_BYTES: usize = 64 * 1024;

thread_local! {
    static READ_BUFFER: RefCell<Box<[u8]>> = RefCell::new(vec![0; READ_BYTES].into_boxed_slice());
}

/// Reads what `io` has into `buf` (appended): how many bytes came (0: the end). The read
/// goes into this thread's buffer and what came is copied out, so a connection whose
/// peer sends nothing holds no buffer of its own; and a read that fills less than the
/// buffer lets tokio know the socket is drained, so the next read does not first fail.
pub fn read_into<R: AsyncRead + Unpin + ?Sized>(
    cx: &mut Context<'_>,
    io: &mut R,
    buf: &mut BytesMut,
) -> Poll<io::Result<usize>> {
    READ_BUFFER.with_borrow_mut(|scratch| {
        let mut read = ReadBuf::new(scratch);
        match Pin::new(io).poll_read(cx, &mut read) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Ready(Ok(())) => {
                buf.extend_from_slice(read.filled());
                Poll::Ready(Ok(read.filled().len()))
            }
        }
    })
}

/// Reads what `io` has and throws it away: how many bytes came (0: the end). Into this
/// thread's buffer too, so that a connection being drained holds none.
pub fn read_away<R: AsyncRead + Unpin + ?Sized>(cx: &mut Context<'_>, io: &mut R) -> Poll<io::Result<usize>> {
    READ_BUFFER.with_borrow_mut(|scratch| {
        let mut read = ReadBuf::new(scratch);
        std::task::ready!(Pin::new(io).poll_read(cx, &mut read))?;
        Poll::Ready(Ok(read.filled().len()))
    })
}

/// Writes what it can of `parts` (as one run of bytes) past its first `written` bytes, in
/// one vectored write where the socket takes them all, counting on in `written`; ready
/// when all are written.
pub fn write_parts<W: AsyncWrite + Unpin + ?Sized>(
    cx: &mut Context<'_>,
    io: &mut W,
    parts: &[&[u8]],
    written: &mut usize,
) -> Poll<io::Result<()>> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    while *written < total {
        let mut skip = *written;
        let mut slices = [io::IoSlice::new(&[]); 4];
        let mut count = 0;
        for part in parts {
            if skip >= part.len() {
                skip -= part.len();
                continue;
            }
            if count == slices.len() {
                break;
            }
            slices[count] = io::IoSlice::new(&part[skip..]);
            skip = 0;
            count += 1;
        }
        match std::task::ready!(Pin::new(&mut *io).poll_write_vectored(cx, &slices[..count]))? {
            0 => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
            n => *written += n,
        }
    }
    Poll::Ready(Ok(()))
}
