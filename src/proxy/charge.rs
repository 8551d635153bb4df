//! What a response reports it cost, read as it passes, for the limits that charge it
//! (`charge:`): a field of its head at once, a server-sent event stream or a JSON body as
//! its data goes by, its trailers at its end; then each limit is debited (`gate::Charges`).

use http::HeaderMap;
use smallvec::SmallVec;

use crate::front::body::Scan;
use crate::gate::Charges;
use crate::ids::LimitId;
use crate::policy::charge::{Charge, PriceRow, Reading, SseScan, units_in, units_of_number};
use crate::wire::message::Response;

/// A response's meter: one report per limit that charges it.
pub struct Meter {
    /// The admissions to charge: known with the head, or, for a gRPC call whose status
    /// comes in its trailers, once its status has kept them (`end`).
    pub charges: Option<Charges>,
    reports: SmallVec<[Report; 1]>,
}

struct Report {
    limit: LimitId,
    /// Its limit's `charge:` (shared: a copy is two counts' increments).
    charge: Charge,
    /// The row of its prices the request is priced at, if it has prices.
    row: Option<PriceRow>,
    /// What was found so far (a head's or trailers' report).
    found: Option<u64>,
    /// The body read for it.
    scan: Option<BodyScan>,
}

/// A response body read for its counts as it passes.
enum BodyScan {
    /// A `text/event-stream`'s events.
    Events(Box<SseScan>),
    /// A JSON text.
    Json(Box<Scan>),
}

impl BodyScan {
    fn feed(&mut self, data: &[u8]) {
        match self {
            BodyScan::Events(scan) => scan.feed(data),
            BodyScan::Json(scan) => scan.feed(data),
        }
    }

    /// What the body reported, priced or weighed as `report`'s charge says.
    fn found(&mut self, report: &Report) -> Option<u64> {
        match self {
            BodyScan::Events(scan) => {
                scan.finish();
                report.charge.units(scan.counts(), report.row)
            }
            // A path sent twice is a report that is no count (which one would be a guess).
            BodyScan::Json(scan) if scan.repeated().is_some() => None,
            BodyScan::Json(scan) => {
                let places = report.charge.reading.weights().len();
                report
                    .charge
                    .units((0..places).map(|i| scan.number(i).map(|n| n.and_then(units_of_number))), report.row)
            }
        }
    }
}

impl Meter {
    /// A meter for `limits` (each with its `charge:`) of `response`, its head known.
    pub fn new<'c, B>(
        limits: impl Iterator<Item = (LimitId, &'c Charge, Option<PriceRow>)>,
        response: &Response<B>,
    ) -> Option<Meter> {
        // Most responses have no limit that charges: nothing of them is read.
        let mut limits = limits.peekable();
        limits.peek()?;
        let media = response
            .field(&http::header::CONTENT_TYPE)
            .map(|v| std::str::from_utf8(v).ok().and_then(|v| v.split(';').next()).unwrap_or("").trim());
        let events = media.is_some_and(|t| t.eq_ignore_ascii_case("text/event-stream"));
        // A JSON body, or one of no stated type; encoded (compressed), its text is unread.
        let json =
            media.is_none_or(|t| {
                let t = t.to_ascii_lowercase();
                t == "application/json" || t.ends_with("+json")
            }) && response.field(&http::header::CONTENT_ENCODING).is_none_or(|v| v.eq_ignore_ascii_case(b"identity"));
        let reports: SmallVec<[Report; 1]> = limits
            .map(|(limit, charge, row)| {
                let in_head = |names: &[(http::HeaderName, u64)]| {
                    charge.units(names.iter().map(|(name, _)| response.field(name).map(units_in)), row)
                };
                let (found, scan) = match &charge.reading {
                    Reading::Header(names) => (in_head(names), None),
                    // A `json` reading reads an event stream's events as `sse_json` does:
                    // an API that streams or not, as each request asks, reports alike.
                    Reading::SseJson(paths) | Reading::Json(paths) if events => {
                        (None, Some(BodyScan::Events(Box::new(SseScan::new(paths)))))
                    }
                    Reading::Json(paths) if json => {
                        let paths = paths.iter().map(|(path, _)| path.clone()).collect();
                        (None, Some(BodyScan::Json(Box::new(Scan::new(paths)))))
                    }
                    // A gRPC answer without a body carries its trailers in its head.
                    Reading::Trailer(names) => (in_head(names), None),
                    Reading::SseJson(_) | Reading::Json(_) => (None, None),
                };
                Report { limit, charge: charge.clone(), row, found, scan }
            })
            .collect();
        Some(Meter { charges: None, reports })
    }

    /// Reads the next piece of the body.
    pub fn feed(&mut self, data: &[u8]) {
        for scan in self.reports.iter_mut().filter_map(|r| r.scan.as_mut()) {
            scan.feed(data);
        }
    }

    /// The response has ended with `trailers` (or its client went away: `None`):
    /// debits each limit what was found, or its default; the debit in Redis is returned,
    /// to be awaited. `settled`: the charges a gRPC call's status kept at its end.
    pub fn end(
        mut self,
        trailers: Option<&HeaderMap>,
        settled: Option<Charges>,
    ) -> Option<impl Future<Output = ()> + Send + use<>> {
        for report in &mut self.reports {
            match (&report.charge.reading, report.scan.take()) {
                (Reading::Trailer(names), _) => {
                    // Trailers that report replace what the head said (a gRPC answer's).
                    if let Some(trailers) = trailers.filter(|t| names.iter().any(|(name, _)| t.contains_key(name))) {
                        let counts = names.iter().map(|(name, _)| trailers.get(name).map(|v| units_in(v.as_bytes())));
                        report.found = report.charge.units(counts, report.row);
                    }
                }
                (_, Some(mut scan)) => report.found = scan.found(report),
                _ => {}
            }
        }
        let reports = &self.reports;
        let charges = self.charges.take().or(settled)?;
        charges.debit(&|limit| reports.iter().find(|r| r.limit == limit).and_then(|r| r.found))
    }
}
