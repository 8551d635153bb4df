//! One request to a server on an HTTP/1.1 connection, driven by the request's own task:
//! no task, channel or hand-off per connection. `exchange` writes the head (and the body
//! as the client sends it, framed by us) while it reads for the response head; the
//! response body is then read by `ResponseBody`, which says when the connection may
//! take the next request.

use std::future::poll_fn;
use std::io;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use http::Method;
use tokio::io::{AsyncRead, AsyncWrite};

use super::body::{self, Decoder, FramingError, Step};
use super::parse::{self, Framing, ResponseHead};
use super::{BodyError, BodySource, read_into, write, write_parts};

/// How an exchange failed, and how far it got (for deciding whether to try again).
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// The server closed the connection, or it broke, before a response came.
    #[error("the connection closed before a response: {0}")]
    Closed(#[source] io::Error),
    /// The response head is not HTTP/1.
    #[error("invalid response: {0}")]
    Response(&'static str),
    /// The client's body failed on the way.
    #[error("the request body failed: {0}")]
    Body(#[source] BodyError),
}

/// What an exchange sent before it ended.
#[derive(Debug, Default, Clone, Copy)]
pub struct Sent {
    /// Some byte of the request body left for the server: it cannot be sent again.
    pub body: bool,
    /// The request, body included, was written in full.
    pub all: bool,
}

/// Writes the request `head` (its framing fields included) and the body from `body`
/// framed as `framing`, on `io`, and reads the response head to a request with `method`.
/// The head's buffer is given back (`write::give_back`) once it is sent: a request
/// waiting for its answer holds none.
/// Interim responses (1xx but `101`) are handed to `body`, the client's side, as they
/// come (`BodySource::poll_interim`), each parsed from what is already read before
/// reading more: a server may send an interim and the final response in one write.
/// Returns the final head and the bytes already read after it, with what was sent.
// A block, not an `async fn`: an `async fn` keeps each argument twice in its future,
// which lives in every forwarded request's state.
#[allow(clippy::manual_async_fn)]
pub fn exchange<I: AsyncRead + AsyncWrite + Unpin, B: BodySource + ?Sized>(
    io: &mut I,
    head: Vec<u8>,
    body: Option<&mut B>,
    framing: Framing,
    method: &Method,
    max_head: usize,
) -> impl Future<Output = (Result<(ResponseHead, BytesMut), ExchangeError>, Sent)> {
    async move {
        let mut sent = Sent::default();
        let mut out = Sending { head, written: 0, chunk: None, framing, body, ended: framing == Framing::Empty };
        let mut buf = BytesMut::new();
        // An interim head read and not yet taken by the client's side (boxed: rare, and
        // the exchange's future is in every forwarded request's state).
        let mut interim: Option<Box<ResponseHead>> = None;
        let result = poll_fn(|cx| {
            // Writing goes on while the response is awaited: a server may answer before it
            // has read the whole body, or only after.
            if let Err(e) = out.poll_send(cx, io, &mut sent) {
                return Poll::Ready(Err(e));
            }
            loop {
                if let Some(head) = &interim {
                    if let Some(body) = out.body.as_deref_mut() {
                        ready!(body.poll_interim(cx, head));
                    }
                    interim = None;
                }
                if !buf.is_empty() {
                    match parse::response(&buf, method, max_head).map_err(ExchangeError::Response)? {
                        None => {}
                        Some((len, parsed)) => {
                            let head = ResponseHead::new(buf.split_to(len).freeze(), parsed);
                            if head.status.is_informational() && head.status != http::StatusCode::SWITCHING_PROTOCOLS {
                                // 100 Continue, 103 Early Hints: the final response follows.
                                interim = Some(Box::new(head));
                                continue;
                            }
                            return Poll::Ready(Ok(head));
                        }
                    }
                }
                match read_into(cx, &mut *io, &mut buf) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(ExchangeError::Closed(e))),
                    Poll::Ready(Ok(0)) => {
                        return Poll::Ready(Err(ExchangeError::Closed(io::ErrorKind::UnexpectedEof.into())));
                    }
                    Poll::Ready(Ok(_)) => {}
                }
            }
        })
        .await;
        sent.all = out.ended && out.chunk.is_none() && out.written == out.head.len();
        (result.map(|head| (head, buf)), sent)
    }
}

/// The request on its way out: its head, then its body.
struct Sending<'b, B: ?Sized> {
    /// Empty once written (its buffer given back).
    head: Vec<u8>,
    /// Bytes of `head` written.
    written: usize,
    /// The chunk being written: its framing line, data, and how much of both is out.
    chunk: Option<Chunk>,
    framing: Framing,
    body: Option<&'b mut B>,
    /// The body's end was written (or there is none).
    ended: bool,
}

struct Chunk {
    line: [u8; 18],
    line_len: usize,
    data: Bytes,
    /// The chunk's end (CRLF) is owed.
    tail: bool,
    written: usize,
}

impl<B: BodySource + ?Sized> Sending<'_, B> {
    /// Writes what can be written now: what is left of the head with the piece of body
    /// at hand, in one vectored write (a small request goes out in one), then the body
    /// as the client sends it.
    fn poll_send<I: AsyncWrite + Unpin>(
        &mut self,
        cx: &mut Context<'_>,
        io: &mut I,
        sent: &mut Sent,
    ) -> Result<(), ExchangeError> {
        loop {
            if self.chunk.is_none() && !self.ended {
                self.next_chunk(cx, sent)?;
            }
            let head = &self.head[self.written..];
            let Some(chunk) = &mut self.chunk else {
                if head.is_empty() {
                    // All written, or the body has nothing yet.
                    return Ok(());
                }
                let mut written = 0;
                let polled = write_parts(cx, io, &[head], &mut written);
                self.head_written(written);
                match polled {
                    Poll::Pending => return Ok(()),
                    Poll::Ready(Err(e)) => return Err(ExchangeError::Closed(e)),
                    Poll::Ready(Ok(())) => continue,
                }
            };
            // The head's rest and the chunk as one run of bytes; a chunk is begun only
            // once the head is out, so its progress counts from where the head ends.
            let tail = if chunk.tail { body::CHUNK_END } else { &[] };
            let parts: [&[u8]; 4] = [head, &chunk.line[..chunk.line_len], &chunk.data, tail];
            let mut written = if head.is_empty() { chunk.written } else { 0 };
            let polled = write_parts(cx, io, &parts, &mut written);
            let of_head = written.min(head.len());
            chunk.written = written - of_head;
            self.head_written(of_head);
            match polled {
                Poll::Pending => return Ok(()),
                Poll::Ready(Err(e)) => return Err(ExchangeError::Closed(e)),
                Poll::Ready(Ok(())) => self.chunk = None,
            }
        }
    }

    /// Counts `n` more bytes of the head written; gives its buffer back once all are.
    fn head_written(&mut self, n: usize) {
        self.written += n;
        if self.written == self.head.len() && !self.head.is_empty() {
            write::give_back(std::mem::take(&mut self.head));
            self.written = 0;
        }
    }

    /// Takes the next piece of body, if one is at hand, as the chunk to write.
    fn next_chunk(&mut self, cx: &mut Context<'_>, sent: &mut Sent) -> Result<(), ExchangeError> {
        let Some(body) = self.body.as_deref_mut() else {
            self.ended = true;
            return Ok(());
        };
        let chunked = self.framing == Framing::Chunked;
        // An empty piece (an HTTP/2 client may send an empty DATA frame) is passed over
        // and the body asked again: left at that, nothing would wake this task for the
        // next piece.
        let mut polled = body.poll_chunk(cx);
        while matches!(&polled, Poll::Ready(Some(Ok(data))) if data.is_empty()) {
            polled = body.poll_chunk(cx);
        }
        match polled {
            Poll::Pending => {}
            Poll::Ready(Some(Err(e))) => return Err(ExchangeError::Body(e)),
            Poll::Ready(Some(Ok(data))) => {
                sent.body = true;
                let mut chunk = Chunk { line: [0; 18], line_len: 0, data, tail: chunked, written: 0 };
                if chunked {
                    chunk.line_len = body::chunk_head(chunk.data.len(), &mut chunk.line);
                }
                self.chunk = Some(chunk);
            }
            Poll::Ready(None) => {
                self.ended = true;
                if chunked {
                    // The client's trailer fields go on as the last chunk's.
                    let data = match body.trailers() {
                        Some(trailers) => {
                            let mut last = Vec::new();
                            write::last_chunk(&mut last, &trailers);
                            Bytes::from(last)
                        }
                        None => Bytes::from_static(body::LAST_CHUNK),
                    };
                    self.chunk = Some(Chunk { line: [0; 18], line_len: 0, data, tail: false, written: 0 });
                }
            }
        }
        Ok(())
    }
}

/// A response body read from its connection `conn`, as its framing delimits it.
pub struct ResponseBody<C> {
    conn: C,
    /// Bytes read but not yet handed out (at first, those read with the head).
    buf: BytesMut,
    decoder: Decoder,
    /// The connection may carry another exchange once this body is read.
    keep_alive: bool,
}

impl<C: AsyncRead + Unpin> ResponseBody<C> {
    /// The body of `head`, whose first bytes (`read` after the head) came with it.
    pub fn new(conn: C, head: &ResponseHead, read: BytesMut) -> Self {
        ResponseBody { conn, buf: read, decoder: Decoder::new(head.framing), keep_alive: head.keep_alive }
    }

    /// The whole body has been read.
    pub fn is_done(&self) -> bool {
        self.decoder.is_done()
    }

    /// The trailer fields of a chunked body read to its end; given once.
    pub fn trailers(&mut self) -> Option<http::HeaderMap> {
        self.decoder.take_trailers()
    }

    /// Data bytes still to come, when the framing says.
    pub fn remaining(&self) -> Option<u64> {
        self.decoder.remaining()
    }

    /// The body has been read in full, and the connection may take another exchange.
    pub fn is_reusable(&self) -> bool {
        self.is_done() && self.keep_alive && self.buf.is_empty()
    }

    pub fn conn_mut(&mut self) -> &mut C {
        &mut self.conn
    }

    /// The connection, whatever its state (an upgrade takes it over), and the bytes
    /// read from it and not handed out.
    pub fn into_parts(self) -> (C, BytesMut) {
        (self.conn, self.buf)
    }

    /// The next piece of the body; `None` at its end.
    pub fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, BodyError>>> {
        loop {
            match self.decoder.step(&self.buf).map_err(BodyError::Framing)? {
                Step::Framing(n) => self.buf.advance(n),
                Step::Data(n) if n == self.buf.len() => {
                    return Poll::Ready(Some(Ok(std::mem::take(&mut self.buf).freeze())));
                }
                Step::Data(n) => return Poll::Ready(Some(Ok(self.buf.split_to(n).freeze()))),
                Step::End(n) => {
                    self.buf.advance(n);
                    return Poll::Ready(None);
                }
                Step::More => {
                    let n = ready!(read_into(cx, &mut self.conn, &mut self.buf)).map_err(BodyError::Io)?;
                    if n == 0 {
                        self.decoder.close().map_err(BodyError::Framing)?;
                    }
                }
            }
        }
    }
}

impl From<FramingError> for BodyError {
    fn from(e: FramingError) -> Self {
        BodyError::Framing(e)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;

    use super::*;

    /// A bodiless request's client side that keeps the status of each interim response.
    #[derive(Default)]
    struct Interims(Vec<u16>);

    impl BodySource for Interims {
        fn poll_chunk(&mut self, _cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, BodyError>>> {
            Poll::Ready(None)
        }

        fn poll_interim(&mut self, _cx: &mut Context<'_>, head: &ResponseHead) -> Poll<()> {
            self.0.push(head.status.as_u16());
            Poll::Ready(())
        }
    }

    /// A request waiting for its answer holds no head buffer: the one its head was
    /// written in is this thread's spare again once the head is out.
    #[tokio::test]
    async fn a_request_head_sent_gives_its_buffer_back_before_the_answer_comes() {
        let (mut io, mut server) = tokio::io::duplex(4096);
        let mut head = Vec::with_capacity(1000);
        head.extend_from_slice(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n");
        let no_body: Option<&mut Interims> = None;
        let mut exchanged = std::pin::pin!(exchange(&mut io, head, no_body, Framing::Empty, &Method::GET, 1024));
        // No answer yet: the head goes out, and the exchange waits.
        assert!(poll_fn(|cx| Poll::Ready(exchanged.as_mut().poll(cx).is_pending())).await);
        let mut sent = [0; 64];
        let n = tokio::io::AsyncReadExt::read(&mut server, &mut sent).await.unwrap();
        assert_eq!(&sent[..n], b"GET / HTTP/1.1\r\nhost: a\r\n\r\n");
        assert_eq!(write::buffer().capacity(), 1000, "the head's buffer is the spare");
        server.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").await.unwrap();
        let (result, sent) = exchanged.await;
        assert_eq!(result.unwrap().0.status, http::StatusCode::NO_CONTENT);
        assert!(sent.all);
    }

    #[tokio::test]
    async fn interim_responses_read_with_the_final_one_are_handed_over_and_the_final_one_returned() {
        let (mut io, mut server) = tokio::io::duplex(4096);
        // All of it in one write, before the request is even sent: nothing more will come.
        server
            .write_all(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 204 No Content\r\n\r\nextra")
            .await
            .unwrap();
        let mut interims = Interims::default();
        let head = b"GET / HTTP/1.1\r\nhost: a\r\n\r\n".to_vec();
        let exchanged = exchange(&mut io, head, Some(&mut interims), Framing::Empty, &Method::GET, 32 * 1024);
        let (result, sent) = tokio::time::timeout(std::time::Duration::from_secs(5), exchanged).await.unwrap();
        let (response, rest) = result.unwrap();
        assert_eq!(response.status, http::StatusCode::NO_CONTENT);
        assert_eq!(&rest[..], b"extra");
        assert_eq!(interims.0, [100, 103]);
        assert!(sent.all);
    }
}
