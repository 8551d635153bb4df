//! A client's HTTP/1 connection: its requests read one after another (pipelined ones
//! wait in the buffer, answered in order), the body of each read as its framing
//! delimits it (`BodyReader`, which sends `100 Continue` when the client waits for it),
//! and what a response needs written. `crate::server` runs the loop over these.
//!
//! Between requests the connection holds no buffer: `buf` is empty and unallocated, and
//! reads go into the thread's buffer first (`read_into`).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite};

use std::sync::Mutex;

use http::{StatusCode, Version};

use super::body::{Decoder, Step};
use super::parse::{self, HeadError, ParsedHead, ResponseHead};
use super::{BodyError, BodySource, read_into, write, write_parts};

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
    Head(ParsedHead),
    /// The HTTP/2 preface: the connection speaks HTTP/2 (its bytes are still in `buf`).
    H2,
    /// The client closed the connection between requests.
    Closed,
}

/// The bounds of a request head, in bytes (`u32`: every connection's future holds them).
#[derive(Clone, Copy)]
pub struct HeadLimits {
    /// The request line (method, target, version).
    pub line: u32,
    /// The whole head.
    pub head: u32,
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
                    match parse::request(&self.buf, limits.line as usize, limits.head as usize) {
                        Err(e) => return Poll::Ready(Ok(Err(e))),
                        Ok(Some(parsed)) => {
                            // Nothing pipelined: the buffer is the head's (splitting it
                            // would allocate a count of its owners).
                            let bytes = match parsed.len == self.buf.len() {
                                true => std::mem::take(&mut self.buf).freeze(),
                                false => self.buf.split_to(parsed.len).freeze(),
                            };
                            return Poll::Ready(Ok(Ok(Read::Head(ParsedHead::new(bytes, parsed)))));
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

/// Which interim (1xx) responses of the upstream the client of a request with `head`
/// gets: none for an HTTP/1.0 client (RFC 9110 §15.2: it knows no 1xx), and no
/// `100 Continue` for one that asked for it (it gets ours, once its body is wanted).
#[derive(Clone, Copy)]
struct InterimFor {
    version: Version,
    expect_continue: bool,
}

impl InterimFor {
    fn of(head: &ParsedHead) -> Self {
        InterimFor { version: head.version, expect_continue: head.expect_continue }
    }

    fn forwards(self, interim: &ResponseHead) -> bool {
        self.version == Version::HTTP_11 && !(interim.status == StatusCode::CONTINUE && self.expect_continue)
    }
}

/// The client's side of a request without a body: the interim responses of its upstream,
/// queued for the connection to write between polls of the request (which cannot write
/// them itself: the connection meanwhile watches whether the client goes away).
pub struct Bodiless<'q> {
    to: InterimFor,
    queue: &'q Mutex<Vec<u8>>,
}

/// Interim responses queued past this are dropped: a client that reads none of them must
/// not make the connection hold what a server sends without end.
const MAX_INTERIM_QUEUED: usize = 16 * 1024;

impl<'q> Bodiless<'q> {
    /// For a request with `head`, its interim responses queued in `queue`.
    pub fn new(head: &ParsedHead, queue: &'q Mutex<Vec<u8>>) -> Self {
        Bodiless { to: InterimFor::of(head), queue }
    }
}

impl BodySource for Bodiless<'_> {
    fn poll_chunk(&mut self, _cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, BodyError>>> {
        Poll::Ready(None)
    }

    fn poll_interim(&mut self, _cx: &mut Context<'_>, head: &ResponseHead) -> Poll<()> {
        if let Ok(mut queue) = self.queue.lock()
            && self.to.forwards(head)
            && queue.len() < MAX_INTERIM_QUEUED
        {
            write::interim(&mut queue, head);
        }
        Poll::Ready(())
    }
}

/// The body of the request being served, read from its connection as its framing
/// delimits it.
pub struct BodyReader<'c, I> {
    conn: &'c mut Conn<I>,
    decoder: Decoder,
    /// `100 Continue` is owed before the first read (bytes of it written so far).
    continue_owed: Option<usize>,
    /// Which interim responses the client gets.
    to: InterimFor,
    /// An interim response of the upstream being written, and how much of it is out.
    interim: Option<(Vec<u8>, usize)>,
}

const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

impl<'c, I: AsyncRead + AsyncWrite + Unpin + Send> BodyReader<'c, I> {
    pub fn new(conn: &'c mut Conn<I>, head: &ParsedHead) -> Self {
        // A client that sent body bytes already is not waiting for leave to.
        let continue_owed = (head.expect_continue && conn.buf.is_empty()).then_some(0);
        BodyReader { conn, decoder: Decoder::new(head.framing), continue_owed, to: InterimFor::of(head), interim: None }
    }

    /// The whole body has been read.
    pub fn is_done(&self) -> bool {
        self.decoder.is_done()
    }

    /// Writes what is left of the interim response being written.
    fn poll_interim_written(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if let Some((bytes, written)) = &mut self.interim {
            // A client that cannot take it fails its response's write too.
            let _ = ready!(write_parts(cx, &mut self.conn.io, &[bytes], written));
            self.interim = None;
        }
        Poll::Ready(())
    }
}

impl<I: AsyncRead + AsyncWrite + Unpin + Send> BodySource for BodyReader<'_, I> {
    fn trailers(&mut self) -> Option<http::HeaderMap> {
        self.decoder.take_trailers()
    }

    fn poll_interim(&mut self, cx: &mut Context<'_>, head: &ResponseHead) -> Poll<()> {
        ready!(self.poll_interim_written(cx));
        if self.to.forwards(head) {
            let mut bytes = Vec::with_capacity(128);
            write::interim(&mut bytes, head);
            self.interim = Some((bytes, 0));
        }
        self.poll_interim_written(cx)
    }

    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, BodyError>>> {
        // An interim response begun goes out whole before anything else is written.
        ready!(self.poll_interim_written(cx));
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

#[cfg(test)]
mod tests;
