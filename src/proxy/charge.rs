//! What a response reports it cost, read as it passes, for the limits that charge it
//! (`charge:`): a field of its head at once, a server-sent event stream or a JSON body as
//! its data goes by, its trailers at its end; then each limit is debited (`gate::Charges`).

use http::HeaderMap;
use smallvec::SmallVec;

use crate::front::body::Scan;
use crate::gate::Charges;
use crate::ids::LimitId;
use crate::policy::charge::{Charge, Reading, SseScan, Weighted, units_in, units_of_number, weighed};
use crate::policy::key::ClaimPath;
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
    reading: Reading,
    /// The count found so far.
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

    /// The weighed count the body reported.
    fn found(&mut self, weights: &Weighted<ClaimPath>) -> Option<u64> {
        match self {
            BodyScan::Events(scan) => {
                scan.finish();
                scan.found()
            }
            // A path sent twice is a report that is no count (which one would be a guess).
            BodyScan::Json(scan) if scan.repeated().is_some() => weighed(std::iter::once((Some(None), 1))),
            BodyScan::Json(scan) => weighed(
                weights
                    .iter()
                    .enumerate()
                    .map(|(i, (_, weight))| (scan.number(i).map(|n| n.and_then(units_of_number)), *weight)),
            ),
        }
    }
}

impl Meter {
    /// A meter for `limits` (each with its `charge:`) of `response`, its head known.
    pub fn new<'c, B>(limits: impl Iterator<Item = (LimitId, &'c Charge)>, response: &Response<B>) -> Option<Meter> {
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
            .map(|(limit, charge)| {
                let in_head = |names: &[(http::HeaderName, u64)]| {
                    weighed(names.iter().map(|(name, weight)| (response.field(name).map(units_in), *weight)))
                };
                let (found, scan) = match &charge.reading {
                    Reading::Header(names) => (in_head(names), None),
                    Reading::SseJson(paths) if events => (None, Some(BodyScan::Events(Box::new(SseScan::new(paths))))),
                    Reading::Json(paths) if json => {
                        let paths = paths.iter().map(|(path, _)| path.clone()).collect();
                        (None, Some(BodyScan::Json(Box::new(Scan::new(paths)))))
                    }
                    // A gRPC answer without a body carries its trailers in its head.
                    Reading::Trailer(names) => (in_head(names), None),
                    Reading::SseJson(_) | Reading::Json(_) => (None, None),
                };
                Report { limit, reading: charge.reading.clone(), found, scan }
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
            match (&report.reading, &mut report.scan) {
                (Reading::Trailer(names), _) => {
                    // Trailers that report replace what the head said (a gRPC answer's).
                    if let Some(trailers) = trailers.filter(|t| names.iter().any(|(name, _)| t.contains_key(name))) {
                        let counts = names.iter().map(|(name, weight)| {
                            (trailers.get(name).map(|value| units_in(value.as_bytes())), *weight)
                        });
                        report.found = weighed(counts);
                    }
                }
                (Reading::SseJson(paths) | Reading::Json(paths), Some(scan)) => report.found = scan.found(paths),
                _ => {}
            }
        }
        let reports = &self.reports;
        let charges = self.charges.take().or(settled)?;
        charges.debit(&|limit| reports.iter().find(|r| r.limit == limit).and_then(|r| r.found))
    }
}
