//! Body framing, both ways: reading a body delimited by `Content-Length`, by the chunked
//! coding or by the connection's end (`Decoder`), and writing one (`chunk_head`, ...).
//!
//! The chunked decoder is strict where lenient readers have been played against each
//! other (request smuggling): the chunk size is hex digits only, at most 16 of them (no
//! sign, no `0x`, no space before the extension), every line ends in CRLF (a bare LF or
//! CR is an error, not a line end), an extension is bounded (`MAX_LINE`), the data is
//! followed by CRLF exactly, and the trailer section is bounded (`MAX_TRAILER`) and read
//! to its empty line, each of its lines a field (a token, a colon, a value) kept for
//! `take_trailers`. The body is written again with our own framing.

use super::parse::Framing;

/// Longest chunk-size line (size and extensions): nginx allows extensions too, within
/// its buffer; anything longer is a client probing the parser.
const MAX_LINE: usize = 1024;
/// Longest trailer section.
const MAX_TRAILER: usize = 8 * 1024;

/// Why a body could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    #[error("invalid chunk size")]
    ChunkSize,
    #[error("chunk size line too long")]
    ChunkLine,
    #[error("chunk data not followed by CRLF")]
    ChunkEnd,
    #[error("invalid trailer section")]
    Trailer,
    #[error("the connection closed before the body's end")]
    Incomplete,
}

/// What the bytes at the start of the input are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// `n` bytes of framing: skip them.
    Framing(usize),
    /// The next `n` bytes are data.
    Data(usize),
    /// More input is needed.
    More,
    /// The body ended after `n` more bytes of framing.
    End(usize),
}

/// Reads one body's framing.
#[derive(Debug, Clone)]
pub struct Decoder {
    state: State,
    /// The trailer fields read (boxed: most bodies have none).
    trailers: Option<Box<http::HeaderMap>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Data bytes left.
    Length(u64),
    UntilClose,
    /// Reading a chunk-size line.
    Size,
    /// Data bytes left in a chunk.
    Chunk(u64),
    /// The CRLF after a chunk's data.
    ChunkEnd,
    /// Reading the trailer section; `read` bytes so far.
    Trailer {
        read: usize,
    },
    Done,
}

impl Decoder {
    pub fn new(framing: Framing) -> Self {
        let state = match framing {
            Framing::Empty | Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => State::Size,
            Framing::UntilClose => State::UntilClose,
        };
        Decoder { state, trailers: None }
    }

    /// The trailer fields of a chunked body, once it has been read to its end, less those
    /// that may not be trailers (`crate::wire::head::trailer_fields`); given once.
    pub fn take_trailers(&mut self) -> Option<http::HeaderMap> {
        self.trailers.take().filter(|_| self.state == State::Done).map(|fields| *fields)
    }

    /// The whole body has been read.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Data bytes still to come, when the framing says.
    pub fn remaining(&self) -> Option<u64> {
        match self.state {
            State::Length(n) => Some(n),
            State::Done => Some(0),
            _ => None,
        }
    }

    /// The connection ended: fine for a body read until then, else an error.
    pub fn close(&mut self) -> Result<(), FramingError> {
        match self.state {
            State::UntilClose | State::Done => {
                self.state = State::Done;
                Ok(())
            }
            _ => Err(FramingError::Incomplete),
        }
    }

    /// What the start of `input` is. `Data(n)` and `Framing(n)` are to be consumed by
    /// the caller before the next step.
    pub fn step(&mut self, input: &[u8]) -> Result<Step, FramingError> {
        match self.state {
            State::Done => Ok(Step::End(0)),
            State::Length(_) | State::Chunk(_) if input.is_empty() => Ok(Step::More),
            State::Length(n) => {
                let take = n.min(input.len() as u64);
                let left = n - take;
                self.state = if left == 0 { State::Done } else { State::Length(left) };
                Ok(Step::Data(take as usize))
            }
            State::UntilClose if input.is_empty() => Ok(Step::More),
            State::UntilClose => Ok(Step::Data(input.len())),
            State::Chunk(n) => {
                let take = n.min(input.len() as u64);
                let left = n - take;
                self.state = if left == 0 { State::ChunkEnd } else { State::Chunk(left) };
                Ok(Step::Data(take as usize))
            }
            State::ChunkEnd => match input {
                [b'\r', b'\n', ..] => {
                    self.state = State::Size;
                    Ok(Step::Framing(2))
                }
                [] | [b'\r'] => Ok(Step::More),
                _ => Err(FramingError::ChunkEnd),
            },
            State::Size => self.size_line(input),
            State::Trailer { read } => self.trailer(input, read),
        }
    }

    /// A chunk-size line: `1*HEXDIG [ ext ] CRLF`.
    fn size_line(&mut self, input: &[u8]) -> Result<Step, FramingError> {
        let digits = input.iter().take_while(|b| b.is_ascii_hexdigit()).count();
        if digits > 16 {
            return Err(FramingError::ChunkSize);
        }
        let Some(lf) = input.iter().position(|&b| b == b'\n') else {
            if input.len() > MAX_LINE {
                return Err(FramingError::ChunkLine);
            }
            // A byte that can never start a valid line is refused at once.
            return match input.first() {
                Some(b) if !b.is_ascii_hexdigit() => Err(FramingError::ChunkSize),
                _ => Ok(Step::More),
            };
        };
        if lf > MAX_LINE {
            return Err(FramingError::ChunkLine);
        }
        if digits == 0 || lf == 0 || input[lf - 1] != b'\r' {
            return Err(FramingError::ChunkSize);
        }
        let line = &input[..lf - 1];
        let ext = &line[digits..];
        // An extension starts with `;` (after optional whitespace, RFC 9112 §7.1.1) and
        // holds no control byte; anything else after the digits is no chunk size.
        let ext_ok = ext.is_empty()
            || ext.trim_ascii_start().first() == Some(&b';')
                && ext.iter().all(|&b| b == b'\t' || (0x20..0x7f).contains(&b));
        if !ext_ok {
            return Err(FramingError::ChunkSize);
        }
        let size = line[..digits].iter().fold(0u64, |n, &d| (n << 4) | u64::from(hex(d)));
        self.state = if size == 0 { State::Trailer { read: 0 } } else { State::Chunk(size) };
        Ok(Step::Framing(lf + 1))
    }

    /// The trailer section after the last chunk: field lines, then an empty line.
    fn trailer(&mut self, input: &[u8], read: usize) -> Result<Step, FramingError> {
        let Some(lf) = input.iter().position(|&b| b == b'\n') else {
            if read + input.len() > MAX_TRAILER {
                return Err(FramingError::Trailer);
            }
            return Ok(Step::More);
        };
        if read + lf > MAX_TRAILER || lf == 0 || input[lf - 1] != b'\r' {
            return Err(FramingError::Trailer);
        }
        let line = &input[..lf - 1];
        if line.is_empty() {
            if let Some(fields) = self.trailers.take() {
                // Counted as HTTP/2 counts a field list, the section fails past its bound.
                let kept = crate::wire::head::trailer_fields(*fields).ok_or(FramingError::Trailer)?;
                self.trailers = Some(Box::new(kept));
            }
            self.state = State::Done;
            return Ok(Step::End(lf + 1));
        }
        // A field line: a token, a colon, a value of no control byte but tabs.
        let colon = line.iter().position(|&b| b == b':').ok_or(FramingError::Trailer)?;
        let name = http::HeaderName::from_bytes(&line[..colon]).map_err(|_| FramingError::Trailer)?;
        let value = http::HeaderValue::from_bytes(line[colon + 1..].trim_ascii()).map_err(|_| FramingError::Trailer)?;
        if !line.iter().all(|&b| b == b'\t' || b >= 0x20 && b != 0x7f) {
            return Err(FramingError::Trailer);
        }
        self.trailers.get_or_insert_default().append(name, value);
        self.state = State::Trailer { read: read + lf + 1 };
        Ok(Step::Framing(lf + 1))
    }
}

fn hex(d: u8) -> u8 {
    match d {
        b'0'..=b'9' => d - b'0',
        b'a'..=b'f' => d - b'a' + 10,
        _ => d - b'A' + 10,
    }
}

/// The line that starts a chunk of `len` bytes: `{len:x}\r\n`, written into `out`
/// (at most 18 bytes); returns how many.
pub fn chunk_head(len: usize, out: &mut [u8; 18]) -> usize {
    let digits = if len == 0 { 1 } else { (usize::BITS - len.leading_zeros()).div_ceil(4) as usize };
    for (i, digit) in out[..digits].iter_mut().enumerate() {
        *digit = b"0123456789abcdef"[(len >> (4 * (digits - 1 - i))) & 0xf];
    }
    out[digits] = b'\r';
    out[digits + 1] = b'\n';
    digits + 2
}

/// What follows a chunk's data.
pub const CHUNK_END: &[u8] = b"\r\n";
/// The last chunk and an empty trailer section.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `input` whole: the data, or the error.
    fn decode(framing: Framing, input: &[u8]) -> Result<Vec<u8>, FramingError> {
        let mut d = Decoder::new(framing);
        let mut at = 0;
        let mut data = Vec::new();
        loop {
            match d.step(&input[at..])? {
                Step::Framing(n) => at += n,
                Step::Data(n) => {
                    data.extend_from_slice(&input[at..at + n]);
                    at += n;
                }
                Step::End(n) => {
                    assert_eq!(at + n, input.len(), "bytes after the body");
                    return Ok(data);
                }
                Step::More => {
                    d.close()?;
                    return Ok(data);
                }
            }
        }
    }

    #[test]
    fn chunked_bodies_are_decoded() {
        assert_eq!(decode(Framing::Chunked, b"3\r\nabc\r\n0\r\n\r\n").unwrap(), b"abc");
        assert_eq!(
            decode(Framing::Chunked, b"A;name=\"v\"\r\n0123456789\r\n0\r\nx-t: 1\r\n\r\n").unwrap(),
            b"0123456789"
        );
        assert_eq!(decode(Framing::Chunked, b"000003\r\nabc\r\n0\r\n\r\n").unwrap(), b"abc");
        assert_eq!(decode(Framing::Length(3), b"abc").unwrap(), b"abc");
    }

    #[test]
    fn trailer_fields_are_kept_checked_and_given_once() {
        let input = b"3\r\nabc\r\n0\r\ngrpc-status: 0\r\nx-t:  two words \r\ncontent-length: 3\r\n\r\n";
        let mut d = Decoder::new(Framing::Chunked);
        let mut at = 0;
        loop {
            match d.step(&input[at..]).unwrap() {
                Step::Framing(n) | Step::Data(n) => at += n,
                Step::End(n) => break assert_eq!(at + n, input.len()),
                Step::More => panic!("the whole body was given"),
            }
        }
        let trailers = d.take_trailers().unwrap();
        assert_eq!((trailers["grpc-status"].as_bytes(), trailers["x-t"].as_bytes()), (&b"0"[..], &b"two words"[..]));
        assert!(!trailers.contains_key("content-length"), "no framing field is a trailer");
        assert!(d.take_trailers().is_none());
        for bad in [&b"0\r\nx t: 1\r\n\r\n"[..], b"0\r\n: 1\r\n\r\n", b"0\r\nx-t: \x01\r\n\r\n"] {
            assert_eq!(decode(Framing::Chunked, bad), Err(FramingError::Trailer), "{:?}", String::from_utf8_lossy(bad));
        }
        // Many small fields are counted as HTTP/2 counts them (32 bytes each besides).
        let many = format!("0\r\n{}\r\n", "a: b\r\n".repeat(300));
        assert_eq!(decode(Framing::Chunked, many.as_bytes()), Err(FramingError::Trailer));
    }

    #[test]
    fn what_lenient_parsers_disagree_on_is_refused() {
        for bad in [
            &b"3\nabc\r\n0\r\n\r\n"[..],     // LF alone after the size
            b"3\r\nabc\n0\r\n\r\n",          // LF alone after the data
            b"3\r\nabcd\r\n0\r\n\r\n",       // more data than the size says
            b"-3\r\nabc\r\n0\r\n\r\n",       // a sign
            b"0x3\r\nabc\r\n0\r\n\r\n",      // a prefix
            b" 3\r\nabc\r\n0\r\n\r\n",       // leading space
            b"3 \r\nabc\r\n0\r\n\r\n",       // trailing space, no extension
            b"3\r\r\nabc\r\n0\r\n\r\n",      // a bare CR
            b"1ffffffffffffffff\r\n",        // 17 hex digits: past u64
            b"g\r\n",                        // not hex
            b"3\r\nabc\r\n0\r\nbad\r\n\r\n", // a trailer line that is no field
        ] {
            assert!(decode(Framing::Chunked, bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        let long = format!("1;{}\r\n", "x".repeat(MAX_LINE));
        assert_eq!(decode(Framing::Chunked, long.as_bytes()), Err(FramingError::ChunkLine));
        assert_eq!(decode(Framing::Chunked, b"3\r\nab"), Err(FramingError::Incomplete));
        assert_eq!(decode(Framing::Length(3), b"ab"), Err(FramingError::Incomplete));
    }

    /// Decodes `input` fed in two pieces split at `at`, as a reader gets it from two
    /// reads: the bytes it keeps between them are the unconsumed rest of the first.
    fn decode_split(framing: Framing, input: &[u8], at: usize) -> Result<Vec<u8>, FramingError> {
        let mut d = Decoder::new(framing);
        let mut buf = input[..at].to_vec();
        let mut fed = at;
        let mut data = Vec::new();
        loop {
            match d.step(&buf)? {
                Step::Framing(n) => drop(buf.drain(..n)),
                Step::Data(n) => data.extend(buf.drain(..n)),
                Step::End(n) => {
                    assert_eq!(buf.len() - n + input.len() - fed, 0, "bytes after the body");
                    return Ok(data);
                }
                Step::More if fed < input.len() => {
                    buf.extend_from_slice(&input[fed..]);
                    fed = input.len();
                }
                Step::More => {
                    d.close()?;
                    return Ok(data);
                }
            }
        }
    }

    #[test]
    fn a_body_split_at_any_byte_decodes_as_it_does_whole() {
        let good: &[&[u8]] = &[
            b"3\r\nabc\r\n0\r\n\r\n",
            b"A;name=\"v\"\r\n0123456789\r\n0\r\nx-t: 1\r\n\r\n",
            b"1\r\na\r\n2;x\r\nbc\r\n0\r\n\r\n",
        ];
        let bad: &[&[u8]] = &[b"3\nabc\r\n0\r\n\r\n", b"3\r\nabcd\r\n0\r\n\r\n", b"3 \r\nabc\r\n0\r\n\r\n"];
        for input in good.iter().chain(bad) {
            let whole = decode(Framing::Chunked, input);
            for at in 0..=input.len() {
                assert_eq!(
                    decode_split(Framing::Chunked, input, at),
                    whole,
                    "{:?} at {at}",
                    String::from_utf8_lossy(input)
                );
            }
        }
    }

    #[test]
    fn extensions_with_control_bytes_and_trailers_past_their_bound_are_refused() {
        for bad in [&b"3;a\x01b\r\nabc\r\n0\r\n\r\n"[..], b"3;a\0\r\nabc\r\n0\r\n\r\n", b"3;a\rb\r\nabc\r\n0\r\n\r\n"] {
            assert_eq!(
                decode(Framing::Chunked, bad),
                Err(FramingError::ChunkSize),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        // Whitespace before the `;` and inside the extension is read (RFC 9112 §7.1.1).
        assert_eq!(decode(Framing::Chunked, b"3 ;a=b c\r\nabc\r\n0\r\n\r\n").unwrap(), b"abc");
        let trailers = format!("0\r\nx-t: {}\r\n\r\n", "v".repeat(MAX_TRAILER));
        assert_eq!(decode(Framing::Chunked, trailers.as_bytes()), Err(FramingError::Trailer));
        // (Within the bytes read, and within the bound as HTTP/2 counts fields: 32 each
        // besides name and value.)
        let within = format!("0\r\nx-t: {}\r\n\r\n", "v".repeat(MAX_TRAILER - 40));
        assert!(decode(Framing::Chunked, within.as_bytes()).is_ok());
    }

    #[test]
    fn chunk_heads_are_hex_lines() {
        let mut out = [0; 18];
        for (len, text) in
            [(0, "0\r\n"), (10, "a\r\n"), (255, "ff\r\n"), (4096, "1000\r\n"), (usize::MAX, "ffffffffffffffff\r\n")]
        {
            let n = chunk_head(len, &mut out);
            assert_eq!(&out[..n], text.as_bytes());
        }
    }

    /// Steps `d` over `input` until it wants data or more input: the framing bytes taken.
    fn framing(d: &mut Decoder, input: &[u8]) -> Result<usize, FramingError> {
        let mut at = 0;
        while let Step::Framing(n) = d.step(&input[at..])? {
            at += n;
        }
        Ok(at)
    }

    /// A chunk size is at most 16 hex digits, in either case: the largest `u64` is one,
    /// and leading zeros count (a parser that skips them and one that does not would
    /// read a different size).
    #[test]
    fn a_chunk_size_is_sixteen_hex_digits_at_most_leading_zeros_counted() {
        let mut d = Decoder::new(Framing::Chunked);
        assert_eq!(framing(&mut d, b"ffffffffffffffff\r\n"), Ok(18));
        assert_eq!(d.step(b"ab"), Ok(Step::Data(2)));
        assert_eq!(decode(Framing::Chunked, b"0000000000000003\r\nabc\r\n0\r\n\r\n").unwrap(), b"abc");
        assert_eq!(decode(Framing::Chunked, b"00000000000000003\r\nabc\r\n0\r\n\r\n"), Err(FramingError::ChunkSize));
        let mut d = Decoder::new(Framing::Chunked);
        assert_eq!(framing(&mut d, b"aB\r\n"), Ok(4));
        assert_eq!(d.step(&[b'x'; 200]), Ok(Step::Data(0xab)));
        for bad in [&b";x\r\n"[..], b"\r\n", b"3;\x7f\r\n"] {
            assert_eq!(decode(Framing::Chunked, bad), Err(FramingError::ChunkSize), "{bad:?}");
        }
    }

    /// A chunk-size line of `len` bytes before its LF (its CR included).
    fn size_line(len: usize) -> Vec<u8> {
        format!("3;{}\r\nabc\r\n0\r\n\r\n", "x".repeat(len - 3)).into_bytes()
    }

    #[test]
    fn a_chunk_size_line_at_its_bound_is_read_and_a_byte_over_is_refused_however_it_comes() {
        assert_eq!(decode(Framing::Chunked, &size_line(MAX_LINE)).unwrap(), b"abc");
        assert_eq!(decode(Framing::Chunked, &size_line(MAX_LINE + 1)), Err(FramingError::ChunkLine));
        // Arriving without its LF yet: at the bound, more is waited for.
        for at in [MAX_LINE - 1, MAX_LINE, MAX_LINE + 1] {
            assert_eq!(decode_split(Framing::Chunked, &size_line(MAX_LINE), at).unwrap(), b"abc", "at {at}");
            let over = decode_split(Framing::Chunked, &size_line(MAX_LINE + 1), at);
            assert_eq!(over, Err(FramingError::ChunkLine), "at {at}");
        }
    }

    #[test]
    fn chunk_data_is_followed_by_crlf_exactly() {
        for bad in [&b"3\r\nabcX"[..], b"3\r\nabc\rX", b"3\r\nabc\n", b"3\r\nabc\n\r\n0\r\n\r\n"] {
            assert_eq!(decode(Framing::Chunked, bad), Err(FramingError::ChunkEnd), "{bad:?}");
        }
        // Its CR come, not its LF yet: more is waited for (and the end before it is an
        // incomplete body).
        assert_eq!(decode(Framing::Chunked, b"3\r\nabc\r"), Err(FramingError::Incomplete));
        assert_eq!(decode_split(Framing::Chunked, b"3\r\nabc\r\n0\r\n\r\n", 7).unwrap(), b"abc");
    }

    /// The trailer section is bounded as HTTP/2 counts a field list (name, value and 32
    /// bytes each): at the bound it is read, a byte over fails the body.
    #[test]
    fn trailers_at_their_bound_are_read_and_a_byte_over_is_refused() {
        let value = crate::wire::head::MAX_TRAILER_BYTES - "x-t".len() - 32;
        let at = format!("0\r\nx-t: {}\r\n\r\n", "v".repeat(value));
        assert!(decode(Framing::Chunked, at.as_bytes()).is_ok());
        let over = format!("0\r\nx-t: {}\r\n\r\n", "v".repeat(value + 1));
        assert_eq!(decode(Framing::Chunked, over.as_bytes()), Err(FramingError::Trailer));
        // Every line ends in CRLF, the section's last one too.
        for bad in [&b"0\r\nx-t: 1\n\r\n"[..], b"0\r\n\n", b"0\r\nx-t: 1\r\n\n"] {
            assert_eq!(decode(Framing::Chunked, bad), Err(FramingError::Trailer), "{bad:?}");
        }
        // A body cut in its trailer section is incomplete.
        assert_eq!(decode(Framing::Chunked, b"0\r\nx-t: 1\r\n"), Err(FramingError::Incomplete));
    }

    /// A body delimited by its length takes that many bytes and no more: what follows is
    /// the next message's.
    #[test]
    fn a_body_of_a_length_takes_that_many_bytes_and_leaves_what_follows() {
        let mut d = Decoder::new(Framing::Length(5));
        assert_eq!((d.step(b"abc"), d.remaining()), (Ok(Step::Data(3)), Some(2)));
        assert_eq!(d.step(b""), Ok(Step::More));
        assert_eq!((d.step(b"deGET /"), d.remaining()), (Ok(Step::Data(2)), Some(0)));
        assert_eq!((d.step(b"GET /"), d.is_done()), (Ok(Step::End(0)), true));
        // A chunked body ends after its last chunk and trailers, and takes nothing after.
        let mut d = Decoder::new(Framing::Chunked);
        assert_eq!(d.step(b"0\r\n\r\nGET /"), Ok(Step::Framing(3)));
        assert_eq!(d.step(b"\r\nGET /"), Ok(Step::End(2)));
    }

    /// The connection's end ends a body read until then (a response's), and fails any
    /// other before its end.
    #[test]
    fn the_connections_end_ends_a_body_read_until_close_and_fails_any_other() {
        let mut d = Decoder::new(Framing::UntilClose);
        assert_eq!(d.step(b"abc"), Ok(Step::Data(3)));
        assert_eq!((d.close(), d.is_done()), (Ok(()), true));
        for framing in [Framing::Length(1), Framing::Chunked] {
            assert_eq!(Decoder::new(framing).close(), Err(FramingError::Incomplete), "{framing:?}");
        }
        for framing in [Framing::Empty, Framing::Length(0)] {
            let mut d = Decoder::new(framing);
            assert_eq!((d.step(b"GET /"), d.close()), (Ok(Step::End(0)), Ok(())), "{framing:?}");
        }
    }
}
