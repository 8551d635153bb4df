//! `charge:`: the units a response reports it cost (a field of its head, of its
//! trailers, or of the last server-sent event that carries it), debited from a limit
//! once the response has ended. How a report is read lives here; the debit is the
//! limit's (`limit::Limiters::charge`, the store's `CHARGE` script).

use http::HeaderName;

use super::key::ClaimPath;

/// The most a single response may be charged: a larger report is taken as this. A
/// fixed window counts in 24 bits, a leaky bucket's debt is a time; this keeps both far
/// from overflowing.
pub const MAX_UNITS: u64 = 1 << 32;

/// A limit's `charge:`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    pub reading: Reading,
    /// Units charged when the response never reports (or reports something that is not
    /// a count).
    pub default: u64,
    /// The report replaces the request's own cost instead of adding to it: the cost
    /// admitted the request and is given back once the report is known.
    pub instead_of_cost: bool,
}

/// Where a response reports its cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reading {
    /// A field of the response's head.
    Header(HeaderName),
    /// A field of its trailers (HTTP/1.1 chunked trailers, HTTP/2 and gRPC trailers).
    Trailer(HeaderName),
    /// A number at this path in the JSON data of the last event of a
    /// `text/event-stream` response that has it.
    SseJson(ClaimPath),
}

/// A count written in a field: ASCII digits, surrounding whitespace allowed (`None`:
/// anything else, so a malformed report is charged the default, never a guess).
pub fn units_in(value: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(value).ok()?.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Digits only: a parse failure is an overflow, taken as the largest charge.
    Some(text.parse::<u64>().unwrap_or(MAX_UNITS).min(MAX_UNITS))
}

/// A JSON number that counts units: a non-negative integer (a fraction is rounded up:
/// a report of 2.5 tokens charges 3).
fn units_of_json(value: &serde_json::Value) -> Option<u64> {
    let n = value.as_number()?;
    if let Some(n) = n.as_u64() {
        return Some(n.min(MAX_UNITS));
    }
    let f = n.as_f64().filter(|f| *f >= 0.0)?;
    Some((f.ceil() as u64).min(MAX_UNITS))
}

/// The longest line of an event stream looked at, and the most data one event may carry:
/// a longer one is skipped (its report, if any, not read), so a stream costs a bounded
/// buffer whatever it sends.
const MAX_EVENT_BYTES: usize = 256 * 1024;

/// Reads a `text/event-stream` body as it passes, remembering the last count found at
/// `path` in an event's JSON data. Events are split as the stream format says (lines
/// end with LF, CRLF or CR; an empty line ends an event; `data:` lines join with LF).
#[derive(Debug)]
pub struct SseScan {
    path: ClaimPath,
    /// The quoted first name of `path` (`"usage"`): an event without it is not parsed.
    needle: Vec<u8>,
    line: Vec<u8>,
    /// The line being read is too long: skipped up to its end.
    skipping: bool,
    /// The last byte seen was a CR (a following LF belongs to the same line end).
    after_cr: bool,
    data: Vec<u8>,
    /// The event being read has data beyond `MAX_EVENT_BYTES`: not parsed.
    oversized: bool,
    /// The last count found.
    pub found: Option<u64>,
}

impl SseScan {
    pub fn new(path: &ClaimPath) -> SseScan {
        let needle = format!("\"{}\"", path.first()).into_bytes();
        SseScan {
            path: path.clone(),
            needle,
            line: Vec::new(),
            skipping: false,
            after_cr: false,
            data: Vec::new(),
            oversized: false,
            found: None,
        }
    }

    /// Reads the next piece of the body.
    pub fn feed(&mut self, bytes: &[u8]) {
        let mut rest = bytes;
        while !rest.is_empty() {
            if self.after_cr && rest[0] == b'\n' {
                rest = &rest[1..];
                self.after_cr = false;
                continue;
            }
            self.after_cr = false;
            match memchr::memchr2(b'\n', b'\r', rest) {
                Some(end) => {
                    self.take(&rest[..end]);
                    self.after_cr = rest[end] == b'\r';
                    self.line_ended();
                    rest = &rest[end + 1..];
                }
                None => {
                    self.take(rest);
                    rest = &[];
                }
            }
        }
    }

    /// The body has ended: an event not closed by an empty line still counts.
    pub fn finish(&mut self) {
        if !self.line.is_empty() || self.skipping {
            self.line_ended();
        }
        self.dispatch();
    }

    fn take(&mut self, piece: &[u8]) {
        if self.skipping {
            return;
        }
        if self.line.len() + piece.len() > MAX_EVENT_BYTES {
            self.line.clear();
            self.skipping = true;
            self.oversized = true;
            return;
        }
        self.line.extend_from_slice(piece);
    }

    fn line_ended(&mut self) {
        let line = std::mem::take(&mut self.line);
        if std::mem::take(&mut self.skipping) {
            return;
        }
        if line.is_empty() {
            self.dispatch();
        } else if let Some(value) = line.strip_prefix(b"data") {
            // `data:value`, `data: value` (one space dropped) or `data` alone.
            let value = match value {
                [] => &[][..],
                [b':', b' ', v @ ..] | [b':', v @ ..] => v,
                _ => return,
            };
            if self.data.len() + value.len() + 1 > MAX_EVENT_BYTES {
                self.oversized = true;
            } else {
                if !self.data.is_empty() {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
            }
        }
        self.line = line;
        self.line.clear();
    }

    /// An event has ended: its count, if its data has one at `path`.
    fn dispatch(&mut self) {
        let oversized = std::mem::take(&mut self.oversized);
        if !oversized && memchr::memmem::find(&self.data, &self.needle).is_some() {
            let found = serde_json::from_slice::<serde_json::Value>(&self.data)
                .ok()
                .and_then(|v| self.path.find(v.as_object()?).and_then(units_of_json));
            if found.is_some() {
                self.found = found;
            }
        }
        self.data.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(pieces: &[&[u8]]) -> Option<u64> {
        let mut s = SseScan::new(&"usage.total_tokens".parse().unwrap());
        for p in pieces {
            s.feed(p);
        }
        s.finish();
        s.found
    }

    #[test]
    fn counts_in_fields_are_digits_only() {
        assert_eq!(units_in(b" 42 "), Some(42));
        assert_eq!(units_in(b"0"), Some(0));
        for bad in [&b""[..], b"-1", b"4.5", b"12a", b"+3", b"0x10"] {
            assert_eq!(units_in(bad), None, "{bad:?}");
        }
        assert_eq!(units_in(b"99999999999999999999999"), Some(MAX_UNITS));
    }

    #[test]
    fn the_last_event_that_reports_counts_whatever_follows_it() {
        let stream = b"data: {\"choices\":[]}\n\ndata: {\"usage\":{\"total_tokens\":17}}\n\ndata: [DONE]\n\n";
        assert_eq!(scan(&[stream]), Some(17));
        // Split at every byte: the same.
        for cut in 0..stream.len() {
            assert_eq!(scan(&[&stream[..cut], &stream[cut..]]), Some(17), "cut at {cut}");
        }
        // A later report replaces an earlier one.
        let two = b"data: {\"usage\":{\"total_tokens\":3}}\n\ndata: {\"usage\":{\"total_tokens\":9}}\n\n";
        assert_eq!(scan(&[two]), Some(9));
    }

    #[test]
    fn line_ends_data_lines_and_an_unclosed_last_event_are_read_as_the_format_says() {
        assert_eq!(scan(&[b"event: x\r\ndata: {\"usage\":\r\ndata: {\"total_tokens\": 5}}\r\n\r\n"]), Some(5));
        assert_eq!(scan(&[b"data:{\"usage\":{\"total_tokens\":2.5}}\r\r"]), Some(3));
        assert_eq!(scan(&[b": comment\ndata: {\"usage\":{\"total_tokens\":8}}"]), Some(8));
        // Not a count, not JSON, another path, a negative number: nothing found.
        for bad in [
            &b"data: {\"usage\":{\"total_tokens\":\"8\"}}\n\n"[..],
            b"data: {\"usage\": 8\n\n",
            b"data: {\"usage\":{\"prompt_tokens\":8}}\n\n",
            b"data: {\"usage\":{\"total_tokens\":-8}}\n\n",
            b"datum: {\"usage\":{\"total_tokens\":8}}\n\n",
        ] {
            assert_eq!(scan(&[bad]), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn an_oversized_event_is_skipped_and_the_stream_read_on() {
        let mut big = b"data: {\"usage\":{\"total_tokens\":1},\"pad\":\"".to_vec();
        big.extend(std::iter::repeat_n(b'x', MAX_EVENT_BYTES));
        big.extend_from_slice(b"\"}\n\n");
        assert_eq!(scan(&[&big]), None);
        let mut then = big.clone();
        then.extend_from_slice(b"data: {\"usage\":{\"total_tokens\":4}}\n\n");
        assert_eq!(scan(&[&then[..1000], &then[1000..]]), Some(4));
    }
}
