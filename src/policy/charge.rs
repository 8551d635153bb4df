//! `charge:`: the units a response reports it cost (a field of its head, of its
//! trailers, or of the last server-sent event that carries it), debited from a limit
//! once the response has ended. How a report is read lives here; the debit is the
//! limit's (`limit::Limiters::charge`, the store's `CHARGE` script).

use std::sync::Arc;

use http::HeaderName;

use super::key::{ClaimPath, KeyPart};

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
    /// What each place's count costs, by the request (a money budget's price table).
    pub prices: Option<Arc<Prices>>,
}

impl Charge {
    /// What a response that reported `counts` is charged (each of the reading's places'
    /// count, in its order: `None` not reported, `Some(None)` reported but no count),
    /// priced at `row` of the prices when the charge has them: `None` when nothing was
    /// reported, or something that is no count (the default is then charged).
    /// (`row`: `None` for a charge without prices.)
    pub fn units(&self, counts: impl Iterator<Item = Option<Option<u64>>>, row: Option<PriceRow>) -> Option<u64> {
        match &self.prices {
            // A request priced by no row (none was picked for it) pays any other value's.
            Some(prices) => prices.cost(counts, row.unwrap_or(prices.row(None))),
            None => weighed(counts.zip(self.reading.weights())),
        }
    }
}

/// A row of a price table: the index of the value it prices (the table's length: any
/// other value's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PriceRow(pub u16);

/// A money budget's price table (`charge.prices`): each place's count is priced by what
/// the request names in a part of it (`json:model`: a language model's own prices).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prices {
    /// The part of the request whose value picks the row.
    pub by: KeyPart,
    /// How many units of a count each price is for (a million tokens).
    pub per: u64,
    /// Each value priced, and the price of each of the reading's places (in its order),
    /// in micro-units of the limit's money per `per` units.
    pub rows: Box<[(Box<[u8]>, PriceList)]>,
    /// The prices of any other value, and of a request without one.
    pub other: PriceList,
}

/// The price of each of a reading's places, in its order.
pub type PriceList = Box<[u64]>;

impl Prices {
    /// The row that prices a request whose `by` part is `value`.
    pub fn row(&self, value: Option<&[u8]>) -> PriceRow {
        let found = value.and_then(|v| self.rows.iter().position(|(named, _)| **named == *v));
        // At most 65,535 rows (checked).
        PriceRow(found.unwrap_or(self.rows.len()) as u16)
    }

    /// The value `row` prices, as the file names it (`*`: any other).
    pub fn name(&self, row: PriceRow) -> String {
        match self.rows.get(usize::from(row.0)) {
            Some((value, _)) => String::from_utf8_lossy(value).into_owned(),
            None => "*".to_owned(),
        }
    }

    fn of(&self, row: PriceRow) -> &[u64] {
        self.rows.get(usize::from(row.0)).map_or(&self.other, |(_, prices)| prices)
    }

    /// The micro-units `counts` cost at `row`, rounded up (a fraction of a micro-unit is
    /// a whole one): exact whatever the counts, in 128 bits, then at most `MAX_UNITS`.
    fn cost(&self, counts: impl Iterator<Item = Option<Option<u64>>>, row: PriceRow) -> Option<u64> {
        let mut total: Option<u128> = None;
        for (reported, price) in counts.zip(self.of(row)) {
            let Some(count) = reported else { continue };
            total = Some(total.unwrap_or(0) + u128::from(count?) * u128::from(*price));
        }
        let micros = total?.div_ceil(u128::from(self.per));
        Some(u64::try_from(micros).unwrap_or(MAX_UNITS).min(MAX_UNITS))
    }
}

/// A limit that counts money (`money: USD`): its limit, its charges and their default
/// are amounts of this currency, kept as whole micro-units (a millionth of it), so that
/// what a response costs at a fraction of a cent adds up exactly, locally and in Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Money {
    /// The currency's name as the file writes it (`USD`, `EUR`, `credits`).
    pub currency: Box<str>,
}

/// Micro-units in a unit of money.
pub const MICROS: u64 = 1_000_000;

/// The largest limit of a money budget, in micro-units (17,592,186.044415 of its money):
/// its fixed window counts in 44 bits (`limit::fixed_window`).
pub const MAX_BUDGET: u64 = (1 << 44) - 1;

impl Money {
    /// `micros` as an amount of the currency: `49.985` (at least two decimals, no
    /// trailing zeros past them: `50.00`, `0.000015`).
    pub fn amount(micros: u64) -> String {
        let text = format!("{}.{:06}", micros / MICROS, micros % MICROS);
        let trimmed = text.trim_end_matches('0');
        let decimals = trimmed.len() - trimmed.find('.').unwrap_or(trimmed.len()) - 1;
        if decimals < 2 { text[..text.len() - 4].to_owned() } else { trimmed.to_owned() }
    }

    /// `micros` with the currency: `49.985 USD`.
    pub fn show(&self, micros: u64) -> String {
        format!("{} {}", Money::amount(micros), self.currency)
    }
}

/// Where a response reports its cost: one place, or several whose counts are weighed and
/// summed (a language model's prompt and completion tokens, the latter at four times the
/// former's price).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reading {
    /// Fields of the response's head.
    Header(Weighted<HeaderName>),
    /// Fields of its trailers (HTTP/1.1 chunked trailers, HTTP/2 and gRPC trailers).
    Trailer(Weighted<HeaderName>),
    /// Numbers at these paths in the JSON data of a `text/event-stream` response's events:
    /// each path's last count in the stream (a path reported by another event than the
    /// others, as a prompt's tokens at the stream's start and the completion's at its end,
    /// counts all the same).
    SseJson(Weighted<ClaimPath>),
    /// Numbers at these paths in a JSON response body (`application/json`, `…+json`, or
    /// no type), read as it passes: a language model's answer when it does not stream;
    /// in a `text/event-stream` response, in its events, as `SseJson` (when it does).
    Json(Weighted<ClaimPath>),
}

impl Reading {
    /// Each place's weight, in order.
    pub fn weights(&self) -> smallvec::SmallVec<[u64; 4]> {
        match self {
            Reading::Header(places) | Reading::Trailer(places) => places.iter().map(|(_, w)| *w).collect(),
            Reading::SseJson(places) | Reading::Json(places) => places.iter().map(|(_, w)| *w).collect(),
        }
    }

    /// Each place as the file names it, in order.
    pub fn places(&self) -> Vec<String> {
        match self {
            Reading::Header(places) | Reading::Trailer(places) => places.iter().map(|(p, _)| p.to_string()).collect(),
            Reading::SseJson(places) | Reading::Json(places) => places.iter().map(|(p, _)| p.to_string()).collect(),
        }
    }
}

/// Places and the weight of each one's count. Shared: each response a limit charges
/// keeps its reading, and a copy is then a count's increment, not an allocation.
pub type Weighted<T> = std::sync::Arc<[(T, u64)]>;

/// The weighed sum of `counts` (each with its weight): `None` when none was reported,
/// or when one was reported that is no count (a malformed report is charged the
/// default, never a guess); a place not reported counts nothing.
pub fn weighed(counts: impl Iterator<Item = (Option<Option<u64>>, u64)>) -> Option<u64> {
    let mut sum: Option<u64> = None;
    for (reported, weight) in counts {
        let Some(count) = reported else { continue };
        let part = count?.saturating_mul(weight);
        sum = Some(sum.unwrap_or(0).saturating_add(part).min(MAX_UNITS));
    }
    sum
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

/// A JSON number's text that counts units (as `units_of_json`).
pub fn units_of_number(text: &[u8]) -> Option<u64> {
    units_of_json(&serde_json::from_slice::<serde_json::Value>(text).ok()?)
}

/// The longest line of an event stream looked at, and the most data one event may carry:
/// a longer one is skipped (its report, if any, not read), so a stream costs a bounded
/// buffer whatever it sends.
const MAX_EVENT_BYTES: usize = 256 * 1024;

/// Reads a `text/event-stream` body as it passes, remembering the last count found at
/// each path in an event's JSON data. Events are split as the stream format says (lines
/// end with LF, CRLF or CR; an empty line ends an event; `data:` lines join with LF).
#[derive(Debug)]
pub struct SseScan {
    /// Each path and its weight.
    paths: Weighted<ClaimPath>,
    /// The quoted first name of each path (`"usage"`): an event with none of these is
    /// not parsed.
    needles: Box<[Vec<u8>]>,
    line: Vec<u8>,
    /// The line being read is too long: skipped up to its end.
    skipping: bool,
    /// The last byte seen was a CR (a following LF belongs to the same line end).
    after_cr: bool,
    data: Vec<u8>,
    /// The event being read has data beyond `MAX_EVENT_BYTES`: not parsed.
    oversized: bool,
    /// The last count found at each path.
    found: Box<[Option<u64>]>,
}

impl SseScan {
    pub fn new(paths: &Weighted<ClaimPath>) -> SseScan {
        SseScan {
            needles: paths.iter().map(|(path, _)| format!("\"{}\"", path.first()).into_bytes()).collect(),
            paths: paths.clone(),
            line: Vec::new(),
            skipping: false,
            after_cr: false,
            data: Vec::new(),
            oversized: false,
            found: vec![None; paths.len()].into(),
        }
    }

    /// What the stream reported so far: each path's last count (`None`: not reported).
    pub fn counts(&self) -> impl Iterator<Item = Option<Option<u64>>> + '_ {
        self.found.iter().map(|found| found.map(Some))
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

    /// An event has ended: the counts its data has at the paths.
    fn dispatch(&mut self) {
        let oversized = std::mem::take(&mut self.oversized);
        let named = |needle: &[u8]| memchr::memmem::find(&self.data, needle).is_some();
        if !oversized && self.needles.iter().any(|needle| named(needle)) {
            let event = serde_json::from_slice::<serde_json::Value>(&self.data).ok();
            if let Some(object) = event.as_ref().and_then(serde_json::Value::as_object) {
                for ((path, _), found) in self.paths.iter().zip(self.found.iter_mut()) {
                    if let Some(count) = path.find(object).and_then(units_of_json) {
                        *found = Some(count);
                    }
                }
            }
        }
        self.data.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(pieces: &[&[u8]]) -> Option<u64> {
        scan_weighed(&[("usage.total_tokens", 1)], pieces)
    }

    fn scan_weighed(paths: &[(&str, u64)], pieces: &[&[u8]]) -> Option<u64> {
        let paths: Weighted<ClaimPath> = paths.iter().map(|(p, w)| (p.parse().unwrap(), *w)).collect();
        let mut s = SseScan::new(&paths);
        for p in pieces {
            s.feed(p);
        }
        s.finish();
        weighed(s.counts().zip(paths.iter().map(|(_, w)| *w)))
    }

    #[test]
    fn several_counts_are_weighed_each_at_its_last_report() {
        let weights = [("usage.prompt_tokens", 1), ("usage.completion_tokens", 4)];
        // OpenAI's shape: one last event with both (`stream_options.include_usage`).
        let openai = b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n\
            data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":5,\"total_tokens\":17}}\n\n\
            data: [DONE]\n\n";
        assert_eq!(scan_weighed(&weights, &[openai]), Some(12 + 4 * 5));
        // Anthropic's shape: the input's tokens at the start, the output's (cumulative) in
        // the last `message_delta`.
        let weights = [("message.usage.input_tokens", 3), ("usage.output_tokens", 15)];
        let anthropic = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n\
            event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"Hello\"}}\n\n\
            event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":7}}\n\n\
            event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n\
            event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        assert_eq!(scan_weighed(&weights, &[anthropic]), Some(3 * 25 + 15 * 15));
        // Nothing reported: none; one path reported: it alone.
        assert_eq!(scan_weighed(&weights, &[b"data: {}\n\n"]), None);
        assert_eq!(scan_weighed(&weights, &[b"data: {\"usage\":{\"output_tokens\":2}}\n\n"]), Some(30));
    }

    #[test]
    fn a_weighed_sum_skips_what_was_not_reported_and_refuses_what_is_no_count() {
        assert_eq!(weighed([(Some(Some(2)), 3), (None, 5), (Some(Some(1)), 1)].into_iter()), Some(7));
        assert_eq!(weighed([(None, 3), (None, 5)].into_iter()), None);
        assert_eq!(weighed([(Some(Some(2)), 3), (Some(None), 5)].into_iter()), None);
        assert_eq!(weighed([(Some(Some(MAX_UNITS)), 2)].into_iter()), Some(MAX_UNITS));
    }

    #[test]
    fn money_is_said_with_two_decimals_at_least_and_none_lost() {
        assert_eq!(Money::amount(50_000_000), "50.00");
        assert_eq!(Money::amount(49_985_000), "49.985");
        assert_eq!(Money::amount(15), "0.000015");
        assert_eq!(Money::amount(0), "0.00");
        assert_eq!(Money { currency: "USD".into() }.show(2_500_000), "2.50 USD");
    }

    #[test]
    fn prices_charge_exact_micro_units_rounded_up_per_response() {
        let prices = Prices {
            by: "json:model".parse().unwrap(),
            per: 1_000_000,
            // 0.15 and 0.60 a million tokens; any other model 5.00 and 15.00.
            rows: [(b"mini".as_slice().into(), [150_000, 600_000].as_slice().into())].into(),
            other: [5_000_000, 15_000_000].into(),
        };
        let mini = prices.row(Some(b"mini"));
        assert_eq!((mini, prices.row(Some(b"other")), prices.row(None)), (PriceRow(0), PriceRow(1), PriceRow(1)));
        assert_eq!(prices.name(mini), "mini");
        assert_eq!(prices.name(PriceRow(1)), "*");
        let cost = |counts: [Option<Option<u64>>; 2], row| prices.cost(counts.into_iter(), row);
        // 7 prompt tokens of mini: 1.05 micro-units, charged 2; 1,000 and 500: 450 exactly.
        assert_eq!(cost([Some(Some(7)), None], mini), Some(2));
        assert_eq!(cost([Some(Some(1000)), Some(Some(500))], mini), Some(450));
        assert_eq!(cost([Some(Some(1000)), Some(Some(500))], PriceRow(1)), Some(12_500));
        // Nothing reported, or something that is no count: the default.
        assert_eq!(cost([None, None], mini), None);
        assert_eq!(cost([Some(Some(1)), Some(None)], mini), None);
        // Billions of tokens at a high price: no overflow before the division.
        assert_eq!(cost([Some(Some(u64::from(u32::MAX))), None], PriceRow(1)), Some(MAX_UNITS));
    }

    #[test]
    fn a_json_numbers_text_counts_as_an_events_number_does() {
        assert_eq!(units_of_number(b"17"), Some(17));
        assert_eq!(units_of_number(b"2.5"), Some(3));
        assert_eq!(units_of_number(b"1e3"), Some(1000));
        assert_eq!(units_of_number(b"-1"), None);
        assert_eq!(units_of_number(b"1e400"), None);
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
