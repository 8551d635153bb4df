//! A peer in-process for the engine's tests: what it sends comes in the pieces a test
//! chooses, one piece a read (a byte at a time, split inside a CRLF, several requests in
//! one read), and what is written to it is kept to be read back, taken as slowly as the
//! test says. Polled with a waker that does nothing (`poll_once`), a test runs the engine
//! step by step without a runtime, and a wait can never hang: it is `Poll::Pending`.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A peer that sends `pieces`, then ends (`closes`) or goes quiet.
pub struct Pieces {
    pieces: VecDeque<Vec<u8>>,
    /// Once every piece is read: the end of the stream (a read of 0 bytes), or a wait.
    closes: bool,
    /// Most bytes one write takes.
    takes: usize,
    /// Everything written to the peer.
    pub written: Vec<u8>,
}

impl Pieces {
    /// Sends `pieces`, one a read, then closes its side.
    pub fn closing<P: AsRef<[u8]>>(pieces: impl IntoIterator<Item = P>) -> Self {
        Pieces {
            pieces: pieces.into_iter().map(|p| p.as_ref().to_vec()).collect(),
            closes: true,
            takes: usize::MAX,
            written: Vec::new(),
        }
    }

    /// Sends `pieces`, one a read, then sends nothing more (a read waits).
    pub fn waiting<P: AsRef<[u8]>>(pieces: impl IntoIterator<Item = P>) -> Self {
        Pieces { closes: false, ..Pieces::closing(pieces) }
    }

    /// Takes at most `n` bytes a write.
    pub fn taking(self, n: usize) -> Self {
        Pieces { takes: n, ..self }
    }

    /// Sends `bytes` with its next reads, after what it had to send.
    pub fn send(&mut self, bytes: &[u8]) {
        self.pieces.push_back(bytes.to_vec());
    }

    /// Whether everything it had to send has been read.
    pub fn all_read(&self) -> bool {
        self.pieces.is_empty()
    }
}

/// `bytes` one byte a piece.
pub fn bytewise(bytes: &[u8]) -> Vec<&[u8]> {
    bytes.chunks(1).collect()
}

/// Polls `f` once, with a waker that does nothing.
pub fn poll_once<T>(f: impl FnOnce(&mut Context<'_>) -> Poll<T>) -> Poll<T> {
    f(&mut Context::from_waker(Waker::noop()))
}

impl AsyncRead for Pieces {
    fn poll_read(mut self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let Some(mut piece) = self.pieces.pop_front() else {
            return match self.closes {
                true => Poll::Ready(Ok(())),
                false => Poll::Pending,
            };
        };
        let n = piece.len().min(buf.remaining());
        buf.put_slice(&piece[..n]);
        if n < piece.len() {
            self.pieces.push_front(piece.split_off(n));
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Pieces {
    fn poll_write(mut self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let n = buf.len().min(self.takes);
        self.written.extend_from_slice(&buf[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
