//! A client's HTTP/1 connection: its requests read one after another (pipelined ones
//! wait in the buffer, answered in order), the body of each read as its framing
//! delimits it (`RequestBody`, which sends `100 Continue` when the client waits for it),
//! and what a response needs written. `crate::server` runs the loop over these.
//!
//! Between requests the connection holds no buffer: `buf` is empty and unallocated, and
//! reads go into the thread's buffer first (`read_into`).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite};

use super::body::{Decoder, Step};
use super::parse::{self, HeadError, RequestHead};
use super::{BodyError, BodySource, read_into, write_parts};

/// The preface an HTTP/2 client with prior knowledge opens with (RFC 9113 §3.4).
pub const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// One client connection.
pub struct Conn<I> {
    pub io: I,
    /// Bytes read and not yet taken: the start of a head, body bytes, pipelined requests.
    pub buf: BytesMut,
}

/// What reading a head found.
pub enum Read {
    Head(RequestHead),
    /// The HTTP/2 preface: the connection speaks HTTP/2 (its bytes are still in `buf`).
    H2,
    /// The client closed the connection between requests.
    Closed,
}

/// The bounds of a request head.
#[derive(Clone, Copy)]
pub struct HeadLimits {
    /// The request line (method, target, version).
    pub line: usize,
    /// The whole head.
    pub head: usize,
}

impl<I: AsyncRead + AsyncWrite + Unpin> Conn<I> {
    pub fn new(io: I) -> Self {
        Conn { io, buf: BytesMut::new() }
    }

    /// Whether a request has begun arriving (some byte of it is buffered).
    pub fn head_begun(&self) -> bool {
        !self.buf.is_empty()
    }

    /// Reads until the buffer holds a whole head (or the HTTP/2 preface, when `h2` may
    /// come: the first request of a plain connection).
    pub fn poll_head(
        &mut self,
        cx: &mut Context<'_>,
        limits: HeadLimits,
        h2: bool,
    ) -> Poll<io::Result<Result<Read, HeadError>>> {
        loop {
            if !self.buf.is_empty() {
                if h2
                    && self.buf.len() >= 3
                    && H2_PREFACE.starts_with(&self.buf[..self.buf.len().min(H2_PREFACE.len())])
                {
                    if self.buf.len() >= H2_PREFACE.len() {
                        return Poll::Ready(Ok(Ok(Read::H2)));
                    }
                } else {
                    match parse::request(&self.buf, limits.line, limits.head) {
                        Err(e) => return Poll::Ready(Ok(Err(e))),
                        Ok(Some(parsed)) => {
                            // Nothing pipelined: the buffer is the head's (splitting it
                            // would allocate a count of its owners).
                            let bytes = match parsed.len == self.buf.len() {
                                true => std::mem::take(&mut self.buf).freeze(),
                                false => self.buf.split_to(parsed.len).freeze(),
                            };
                            return Poll::Ready(Ok(Ok(Read::Head(RequestHead::new(bytes, parsed)))));
                        }
                        Ok(None) => {}
                    }
                }
            }
            let n = ready!(read_into(cx, &mut self.io, &mut self.buf))?;
            if n == 0 {
                return Poll::Ready(match self.buf.is_empty() {
                    true => Ok(Ok(Read::Closed)),
                    false => Err(io::ErrorKind::UnexpectedEof.into()),
                });
            }
        }
    }

    /// While a request without body is served: reads what the client sends meanwhile
    /// (pipelined requests, at most `max` bytes of them) and completes when it closes
    /// the connection (or breaks it): the request is then given up.
    pub fn poll_gone(&mut self, cx: &mut Context<'_>, max: usize) -> Poll<()> {
        while self.buf.len() < max {
            match ready!(read_into(cx, &mut self.io, &mut self.buf)) {
                Ok(0) | Err(_) => return Poll::Ready(()),
                Ok(_) => {}
            }
        }
        Poll::Pending
    }

    /// Writes what it can of `parts` past the first `written` bytes (see `write_parts`).
    pub fn poll_write_parts(
        &mut self,
        cx: &mut Context<'_>,
        parts: &[&[u8]],
        written: &mut usize,
    ) -> Poll<io::Result<()>> {
        write_parts(cx, &mut self.io, parts, written)
    }
}

/// The body of the request being served, read from its connection as its framing
/// delimits it.
pub struct RequestBody<'c, I> {
    conn: &'c mut Conn<I>,
    decoder: Decoder,
    /// `100 Continue` is owed before the first read (bytes of it written so far).
    continue_owed: Option<usize>,
}

const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

impl<'c, I: AsyncRead + AsyncWrite + Unpin + Send> RequestBody<'c, I> {
    pub fn new(conn: &'c mut Conn<I>, head: &RequestHead) -> Self {
        // A client that sent body bytes already is not waiting for leave to.
        let continue_owed = (head.expect_continue && conn.buf.is_empty()).then_some(0);
        RequestBody { conn, decoder: Decoder::new(head.framing), continue_owed }
    }

    /// The whole body has been read.
    pub fn is_done(&self) -> bool {
        self.decoder.is_done()
    }
}

impl<I: AsyncRead + AsyncWrite + Unpin + Send> BodySource for RequestBody<'_, I> {
    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, BodyError>>> {
        // RFC 9110 §10.1.1: the client waits for this before it sends the body; it is
        // sent only once the body is asked for, so a request refused before (413, 429)
        // gets its final status instead.
        while let Some(written) = self.continue_owed {
            let n = ready!(Pin::new(&mut self.conn.io).poll_write(cx, &CONTINUE[written..])).map_err(BodyError::Io)?;
            self.continue_owed = (written + n < CONTINUE.len() && n > 0).then_some(written + n);
            if n == 0 {
                return Poll::Ready(Some(Err(BodyError::Io(io::ErrorKind::WriteZero.into()))));
            }
        }
        loop {
            let buf = &mut self.conn.buf;
            match self.decoder.step(buf).map_err(BodyError::Framing)? {
                Step::Framing(n) => buf.advance(n),
                Step::Data(n) if n == buf.len() => return Poll::Ready(Some(Ok(std::mem::take(buf).freeze()))),
                Step::Data(n) => return Poll::Ready(Some(Ok(buf.split_to(n).freeze()))),
                Step::End(n) => {
                    buf.advance(n);
                    return Poll::Ready(None);
                }
                Step::More => {
                    let n = ready!(read_into(cx, &mut self.conn.io, &mut self.conn.buf)).map_err(BodyError::Io)?;
                    if n == 0 {
                        self.decoder.close().map_err(BodyError::Framing)?;
                    }
                }
            }
        }
    }
}
