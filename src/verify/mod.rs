//! `sluicegate verify`: a real run's counts, read from the instance's `/metrics` before
//! and after it, beside what the synthetic model (`simulate::synthetic`) predicts for a
//! run of the same length and the same number of requests, each with the noise the
//! model itself derives for it.
//!
//! What the run was is taken from the scrapes: its length (`--duration`, else the span
//! between them) and its requests (every route's, and those no route took). A closed
//! loop's turnaround is fitted so that the model sends as many requests as the run did;
//! an open loop's rate is the run's. The noise of each count is what an error of δ in
//! the run's length is worth to the model (its counts for the run δ shorter and δ
//! longer), one request per key for an admission under way when the run ended, and for
//! refusals, the requests the fitted model sends fewer or more than the run.

pub mod exposition;

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::Nanos;
use crate::metrics::RequestOutcome;
use crate::simulate::synthetic::{Model, Offered, Prediction, spec::MAX_REQUESTS};
use exposition::{ExpositionError, Scrape};

/// The tick of the timers at either end of a run: wrk's stop and the proxy's delays are
/// whole milliseconds.
const TICK: Duration = Duration::from_millis(1);
/// The most model runs spent fitting a closed loop's turnaround: halving a span of
/// turnarounds from 1 ns to seconds in proportion takes about this many.
const FITS: usize = 12;

/// `/metrics` as it was at an instant: what `verify --snapshot` writes.
#[derive(Debug, Serialize, Deserialize)]
pub struct Snapshot {
    /// When it was taken, ns since the Unix epoch.
    pub taken_at: u64,
    pub metrics: String,
}

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("{file}: cannot write: {source}")]
    Write { file: String, source: std::io::Error },
    #[error("{file}: cannot read: {source}")]
    Read { file: String, source: std::io::Error },
    #[error("{file}: not a snapshot written by verify --snapshot: {why}")]
    NotSnapshot { file: String, why: String },
    #[error("/metrics {which}: {error}")]
    Exposition { which: &'static str, error: ExpositionError },
    #[error("--duration {given}: only {span} passed between the scrapes")]
    Longer { given: String, span: String },
    #[error("no request reached the instance between the scrapes: run the load between them")]
    NoRequests,
    #[error("the run had {0} requests, more than the {MAX_REQUESTS} a model run decides: verify a shorter run")]
    TooMany(u64),
}

impl Snapshot {
    pub fn write(&self, path: &Path) -> Result<(), VerifyError> {
        let text = serde_json::to_string(self).expect("a snapshot is plain data");
        std::fs::write(path, text).map_err(|source| VerifyError::Write { file: path.display().to_string(), source })
    }

    pub fn read(path: &Path) -> Result<Snapshot, VerifyError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| VerifyError::Read { file: file.clone(), source })?;
        serde_json::from_str(&text).map_err(|e| VerifyError::NotSnapshot { file, why: e.to_string() })
    }
}

/// What a route or limit admitted and refused in a run (or a model of it).
#[derive(Debug, Clone, Copy)]
struct Split {
    admitted: u64,
    refused: u64,
}

/// What the run's `/metrics` say of one limit: its decisions (`None`: no such series)
/// and its mean delay, ms.
struct LimitSeen {
    name: String,
    split: Option<Split>,
    mean_delay_ms: Option<f64>,
}

/// One count of the run beside its prediction.
#[derive(Debug, Serialize)]
pub struct Compared {
    /// `route NAME` or `limit NAME`.
    pub of: String,
    /// `admitted`, `refused`.
    pub count: &'static str,
    pub expected: u64,
    /// `None`: the instance has no such series (it runs another configuration).
    pub seen: Option<u64>,
    pub noise: u64,
    pub within: bool,
}

/// A limit's mean delay, predicted and seen: shown, not judged (a delay's length
/// follows the arrivals, which the closed loop models only on average).
#[derive(Debug, Serialize)]
pub struct Delay {
    pub limit: String,
    pub expected_ms: Option<f64>,
    pub seen_ms: Option<f64>,
}

/// The outcome: every count within its noise, or not.
#[derive(Debug, Serialize)]
pub struct Verdict {
    pub config: String,
    pub spec: String,
    /// The run: its length taken, the span between the scrapes, its requests.
    pub duration_s: f64,
    pub span_s: f64,
    pub duration_given: bool,
    pub requests: u64,
    /// How much the run's length is uncertain, ms.
    pub delta_ms: f64,
    /// Requests the model sent for the run.
    pub modelled_requests: u64,
    /// The closed loop's fitted turnaround, µs.
    pub turnaround_us: Option<f64>,
    pub keys: u32,
    pub counts: Vec<Compared>,
    pub delays: Vec<Delay>,
    pub within: bool,
}

/// What the run between `before` and `after` did, beside what `model` predicts for it;
/// `duration`: how long the load ran (wrk's `-d`), else the span between the scrapes.
pub fn verify(
    model: &mut Model,
    before: &Snapshot,
    after: &Snapshot,
    duration: Option<Duration>,
) -> Result<Verdict, VerifyError> {
    let parse = |which, snapshot: &Snapshot| {
        Scrape::parse(&snapshot.metrics).map_err(|error| VerifyError::Exposition { which, error })
    };
    let (old, new) = (parse("before", before)?, parse("after", after)?);
    let diff = |name: &str, labels: &[(&str, &str)]| -> Option<u64> {
        let now = new.get(name, labels)?;
        Some((now - old.get(name, labels).unwrap_or(0.0)).max(0.0).round() as u64)
    };
    let span = Nanos(after.taken_at).since(Nanos(before.taken_at));
    let length = match duration {
        Some(d) if d > span => {
            return Err(VerifyError::Longer {
                given: humantime::format_duration(d).to_string(),
                span: format!("{:.3}s", span.as_secs_f64()),
            });
        }
        Some(d) => d,
        None => span,
    };
    let delta = span - length + 2 * TICK;
    let config = model.config();
    let outcomes = |route: &str, which: &[&str]| -> u64 {
        which.iter().filter_map(|o| diff("sluicegate_requests_total", &[("route", route), ("outcome", o)])).sum()
    };
    const REFUSED: [&str; 3] = ["rejected", "banned", "store_error"];
    let routes: Vec<(String, Split)> = config
        .routes
        .iter()
        .map(|r| {
            (
                r.name.clone(),
                Split { admitted: outcomes(&r.name, &RequestOutcome::ADMITTED), refused: outcomes(&r.name, &REFUSED) },
            )
        })
        .collect();
    let no_route = outcomes("", &["no_route"]);
    let requests = routes.iter().map(|(_, s)| s.admitted + s.refused).sum::<u64>() + no_route;
    if requests == 0 {
        return Err(VerifyError::NoRequests);
    }
    if requests > MAX_REQUESTS {
        return Err(VerifyError::TooMany(requests));
    }
    let limits: Vec<LimitSeen> = config
        .limits
        .iter()
        .map(|l| {
            let decided = |o| diff("sluicegate_limit_decisions_total", &[("limit", &l.name), ("outcome", o)]);
            let split = match (decided("passed"), decided("delayed"), decided("rejected")) {
                (Some(p), Some(d), Some(r)) => Some(Split { admitted: p + d, refused: r }),
                _ => None,
            };
            let sum =
                |s: &str| Some(new.get(s, &[("limit", &l.name)])? - old.get(s, &[("limit", &l.name)]).unwrap_or(0.0));
            let mean = match (sum("sluicegate_limit_delay_seconds_sum"), sum("sluicegate_limit_delay_seconds_count")) {
                (Some(total), Some(n)) if n >= 1.0 => Some(total / n * 1e3),
                _ => None,
            };
            LimitSeen { name: l.name.clone(), split, mean_delay_ms: mean }
        })
        .collect();

    // The run as the model runs it: its length, and its start in the middle of where it
    // may have started (fixed windows are aligned to the clock).
    let start = Nanos(before.taken_at).after((span - length) / 2);
    model.spec_mut().duration = length;
    let admitted_seen: u64 = routes.iter().map(|(_, s)| s.admitted).sum();
    let waited_seen: f64 = limits.iter().filter_map(|l| Some(l.mean_delay_ms? * l.split?.admitted as f64 / 1e3)).sum();
    let (prediction, turnaround) = match model.spec().rate {
        Offered::PerSecond(_) => {
            model.spec_mut().rate = Offered::PerSecond(requests as f64 / length.as_secs_f64());
            (model.run(start), None)
        }
        Offered::Max => fit(model, start, requests, admitted_seen, waited_seen),
    };
    let residual = prediction.requests.abs_diff(requests);
    let mut shorter = model.spec().clone();
    shorter.duration = length.saturating_sub(delta).max(TICK);
    let mut longer = model.spec().clone();
    longer.duration = length + delta;
    let fitted = model.spec().clone();
    *model.spec_mut() = shorter;
    let low = model.run(start);
    *model.spec_mut() = longer;
    let high = model.run(start);
    *model.spec_mut() = fitted;

    let keys = u64::from(prediction.keys.used);
    let all_held = prediction.keys.held_back == prediction.keys.used;
    let mut counts = Vec::new();
    // An admission count's noise: what δ is worth to the model, one request per key, and
    // the model's miss when some key was never held back (its admissions follow the
    // requests sent). A refusal count is the requests less the admissions: its noise is
    // theirs and the model's miss.
    let mut compare = |of: String,
                       admitted: &dyn Fn(&Prediction) -> u64,
                       refused: &dyn Fn(&Prediction) -> u64,
                       seen: Option<Split>| {
        let spread = admitted(&high).abs_diff(admitted(&low)).div_ceil(2) + keys;
        let noise = spread + if all_held { 0 } else { residual };
        for (count, expected, seen, noise) in [
            ("admitted", admitted(&prediction), seen.map(|s| s.admitted), noise),
            ("refused", refused(&prediction), seen.map(|s| s.refused), spread + residual),
        ] {
            let within = seen.is_some_and(|seen| seen.abs_diff(expected) <= noise);
            counts.push(Compared { of: of.clone(), count, expected, seen, noise, within });
        }
    };
    for (i, (name, seen)) in routes.iter().enumerate() {
        let route = |p: &Prediction| p.report.routes[i].counts;
        if route(&prediction).requests == 0 && seen.admitted + seen.refused == 0 {
            continue;
        }
        let admitted_of = |p: &Prediction| route(p).passed + route(p).delayed;
        compare(format!("route {name}"), &admitted_of, &|p| route(p).rejected, Some(*seen));
    }
    let mut delays = Vec::new();
    for (i, seen) in limits.iter().enumerate() {
        let limit = |p: &Prediction| p.report.limits[i].counts;
        if limit(&prediction).requests == 0 && seen.split.is_some_and(|s| s.admitted + s.refused == 0) {
            continue;
        }
        let admitted_of = |p: &Prediction| limit(p).passed + limit(p).delayed;
        compare(format!("limit {}", seen.name), &admitted_of, &|p| limit(p).rejected, seen.split);
        let expected_ms = prediction.report.limits[i].delay.as_ref().map(|d| d.mean_ms);
        if expected_ms.is_some() || seen.mean_delay_ms.is_some() {
            delays.push(Delay { limit: seen.name.clone(), expected_ms, seen_ms: seen.mean_delay_ms });
        }
    }
    let within = counts.iter().all(|c| c.within);
    Ok(Verdict {
        config: prediction.config.clone(),
        spec: prediction.spec.clone(),
        duration_s: length.as_secs_f64(),
        span_s: span.as_secs_f64(),
        duration_given: duration.is_some(),
        requests,
        delta_ms: delta.as_secs_f64() * 1e3,
        modelled_requests: prediction.requests,
        turnaround_us: turnaround.map(|t| t.as_secs_f64() * 1e6),
        keys: prediction.keys.used,
        counts,
        delays,
        within,
    })
}

/// Runs the closed loop of `model` from `start` with the turnaround that makes it send
/// `requests`, as the run did. The requests sent fall as the turnaround grows, so it is
/// sought between the fastest a model run may take and the slowest the run allows
/// (every connection busy all along, a turnaround per request), halving the span in
/// proportion each time, from the turnaround the run's own counts imply (a turnaround per
/// request, the latency per admission and the delays filling the connections' time),
/// until the model is within one request per connection of the run or `FITS` runs are
/// spent. Where delays pace the loop, the requests sent barely move with it. Returns the
/// closest run and its turnaround.
fn fit(model: &mut Model, start: Nanos, requests: u64, admitted: u64, waited_s: f64) -> (Prediction, Option<Duration>) {
    let spec = model.spec();
    let busy = f64::from(spec.connections.get()) * spec.duration.as_secs_f64();
    let (mut fast, mut slow) = (busy / MAX_REQUESTS as f64, busy / requests as f64);
    let implied = (busy - admitted as f64 * spec.latency.as_secs_f64() - waited_s) / requests as f64;
    let mut turnaround = if implied > fast && implied < slow { implied } else { (fast * slow).sqrt() };
    let tolerance = u64::from(spec.connections.get());
    let mut best: Option<(Prediction, f64)> = None;
    for _ in 0..FITS {
        // (To 100 ns: finer says nothing of a machine.)
        turnaround = (turnaround * 1e7).round().max(1.0) / 1e7;
        model.spec_mut().turnaround = Duration::from_secs_f64(turnaround);
        let run = model.run(start);
        let sent = run.requests;
        let closer = best.as_ref().is_none_or(|(b, _)| sent.abs_diff(requests) < b.requests.abs_diff(requests));
        if closer {
            best = Some((run, turnaround));
        }
        if sent.abs_diff(requests) <= tolerance {
            break;
        }
        if sent > requests {
            fast = turnaround;
        } else {
            slow = turnaround;
        }
        turnaround = (fast * slow).sqrt();
    }
    let (run, turnaround) = best.expect("at least one run");
    model.spec_mut().turnaround = Duration::from_secs_f64(turnaround);
    (run, Some(Duration::from_secs_f64(turnaround)))
}

/// `1,234,567`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

impl Verdict {
    /// The verdict for people: the run, the model, the noise, then one line per count.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let o = &mut out;
        let how = if self.duration_given {
            format!("--duration; {:.3} s passed between the scrapes", self.span_s)
        } else {
            "the span between the scrapes".to_owned()
        };
        let _ = writeln!(
            o,
            "run: {:.3} s ({how}), {} requests ({:.0}/s)",
            self.duration_s,
            thousands(self.requests),
            self.requests as f64 / self.duration_s
        );
        let _ = writeln!(o, "model: {} on {}", self.spec, self.config);
        match self.turnaround_us {
            Some(t) => {
                let _ = writeln!(
                    o,
                    "  closed loop, turnaround fitted to {t:.1} µs per exchange: the model sends {} requests",
                    thousands(self.modelled_requests)
                );
            }
            None => {
                let _ = writeln!(
                    o,
                    "  open loop at the run's rate: the model sends {} requests",
                    thousands(self.modelled_requests)
                );
            }
        }
        let _ = writeln!(
            o,
            "noise: the run's length is known to within {:.1} ms (the span less the duration, and a {} ms timer tick at \
             each end); each count may differ by what that is worth to the model (half the difference of its counts \
             for the run that much shorter and longer), by one request per key ({} sent: an admission under way as \
             the run ended), and refusals (the requests less the admissions) by the {} requests the model sends more or \
             fewer than the run",
            self.delta_ms,
            TICK.as_millis(),
            self.keys,
            thousands(self.modelled_requests.abs_diff(self.requests))
        );
        for c in &self.counts {
            let Some(seen) = c.seen else {
                let _ = writeln!(
                    o,
                    "{}: expected {} {}, but /metrics has no such series: the instance runs another configuration",
                    c.of,
                    thousands(c.expected),
                    c.count
                );
                continue;
            };
            let change = if c.expected == 0 {
                String::new()
            } else {
                format!(", {:+.1} %", (seen as f64 - c.expected as f64) / c.expected as f64 * 100.0).replace('-', "−")
            };
            let _ = writeln!(
                o,
                "{}: expected {} {}, saw {}{change}, {} (±{})",
                c.of,
                thousands(c.expected),
                c.count,
                thousands(seen),
                if c.within { "within noise" } else { "OUTSIDE the noise" },
                thousands(c.noise)
            );
        }
        for d in &self.delays {
            let ms = |v: Option<f64>| v.map_or("none".to_owned(), |v| format!("{v:.1} ms"));
            let _ = writeln!(
                o,
                "limit {}: mean delay expected {}, saw {} (shown, not judged)",
                d.limit,
                ms(d.expected_ms),
                ms(d.seen_ms)
            );
        }
        let _ = writeln!(
            o,
            "{}",
            if self.within {
                "verdict: every count within its noise"
            } else {
                "verdict: some counts are outside their noise"
            }
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;
    use crate::simulate::synthetic::Spec;

    const CONFIG: &str = "listen: 127.0.0.1:0
limits:
  per_key: { key: header:x-key, on_missing_key: skip, rate: 10r/s, nodelay: true }
routes:
  - { name: api, limits: [per_key], respond: { status: 200 } }
";

    /// `/metrics` after a run on route `api` and limit `per_key` that admitted `admitted`
    /// and refused `refused`.
    fn metrics(admitted: u64, refused: u64) -> String {
        format!(
            "sluicegate_requests_total{{route=\"api\",outcome=\"passed\"}} {admitted}\n\
             sluicegate_requests_total{{route=\"api\",outcome=\"rejected\"}} {refused}\n\
             sluicegate_limit_decisions_total{{limit=\"per_key\",outcome=\"passed\"}} {admitted}\n\
             sluicegate_limit_decisions_total{{limit=\"per_key\",outcome=\"delayed\"}} 0\n\
             sluicegate_limit_decisions_total{{limit=\"per_key\",outcome=\"rejected\"}} {refused}\n"
        )
    }

    /// The verdict on a 2 s open loop of 100 requests a second on 2 keys that saw
    /// `after` (from nothing), with `--duration 2s` read 2 ms into a span of 2.002 s.
    fn verdict(after: String) -> Verdict {
        let config = config::parse(CONFIG, "c.yaml").unwrap();
        let spec = Spec::parse("rate=100 duration=2s keys=header:x-key:2 latency=0s").unwrap();
        let mut model = Model::new(config, "c.yaml".to_owned(), spec);
        let before = Snapshot { taken_at: 1_767_225_600_000_000_000, metrics: String::new() };
        let after = Snapshot { taken_at: before.taken_at + 2_002_000_000, metrics: after };
        verify(&mut model, &before, &after, Some(Duration::from_secs(2))).unwrap()
    }

    #[test]
    fn a_run_that_admitted_what_the_model_admits_is_within_the_noise_and_one_far_from_it_is_not() {
        // Per key: 1 at once, then one each 100 ms, of a request each 20 ms: 20 in 2 s.
        let v = verdict(metrics(40, 160));
        let admitted = v.counts.iter().find(|c| c.of == "limit per_key" && c.count == "admitted").unwrap();
        assert_eq!(admitted.expected, 40, "{v:#?}");
        // δ = 4 ms (the span less the duration, and a tick at each end): the run 4 ms
        // longer would take the request of 2.000 s, admitted; half of it (rounded up), and
        // one request per key.
        assert_eq!(admitted.noise, 1 + 2);
        assert!(v.within);
        assert!(verdict(metrics(43, 157)).within, "three more: within");
        let v = verdict(metrics(45, 155));
        assert!(!v.within, "five more: outside");
        assert!(v.text().contains("limit per_key: expected 40 admitted, saw 45, +12.5 %, OUTSIDE the noise (±3)"));
    }

    #[test]
    fn a_limit_the_instance_does_not_have_is_outside_and_said_so() {
        let v = verdict(metrics(40, 160).replace("per_key", "per_client"));
        assert!(!v.within);
        assert!(
            v.text().contains("limit per_key: expected 40 admitted, but /metrics has no such series"),
            "{}",
            v.text()
        );
    }

    #[test]
    fn a_run_without_requests_or_longer_than_its_reads_cannot_be_verified() {
        let config = config::parse(CONFIG, "c.yaml").unwrap();
        let mut model = Model::new(config, "c.yaml".to_owned(), Spec::parse("").unwrap());
        let before = Snapshot { taken_at: 0, metrics: String::new() };
        let after = Snapshot { taken_at: 1_000_000_000, metrics: metrics(0, 0) };
        assert!(matches!(verify(&mut model, &before, &after, None), Err(VerifyError::NoRequests)));
        let long = Some(Duration::from_secs(2));
        assert!(matches!(verify(&mut model, &before, &after, long), Err(VerifyError::Longer { .. })));
    }

    #[test]
    fn thousands_are_separated_by_commas() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_203), "1,203");
        assert_eq!(thousands(12_345_678), "12,345,678");
    }
}
