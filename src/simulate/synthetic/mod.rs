//! `simulate --synthetic`: what a load tool such as wrk will see, predicted from the
//! configuration alone. The load (`spec`) is turned into requests on a virtual clock and
//! each is decided by a `Replay`, the code `simulate` replays logs with: the proxy's
//! client address, routing, keys, allow-lists and gate, nothing written twice.
//!
//! The model: in a closed loop (`rate=max`, as wrk drives a server) each connection sends
//! its next request when its answer arrives: a refusal (or any answer the proxy makes
//! itself) after the `turnaround`, an admitted request after the turnaround, its delay
//! and the backend's `latency`. In an open loop (`rate=N`, as wrk2 `-R`) requests leave
//! on schedule, N a second over all connections, whatever the answers.

pub mod spec;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt::Write as _;
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Uri};
use serde::Serialize;

use super::format::{Carried, Logged};
use super::replay::{Fate, Replay};
use super::report::Report;
use crate::clock::Nanos;
use crate::config::Config;
use crate::hop;
use crate::metrics::RequestOutcome;
use crate::policy::key::KeyPart;
use crate::wire::head::Fields;
pub use spec::{Offered, Spec, SpecError};

/// Where the virtual clock of a prediction starts: 2026-01-01T00:00:00Z, a whole second
/// (and minute, hour, day), so that fixed windows start with the load.
pub const START: Nanos = Nanos(1_767_225_600_000_000_000);

/// What one spec makes of one configuration.
#[derive(Debug, Serialize)]
pub struct Prediction {
    pub config: String,
    /// The spec as read, defaults included.
    pub spec: String,
    #[serde(skip)]
    pub load: Spec,
    pub closed_loop: bool,
    /// Requests sent, admitted (passed, delayed, or passed by a limit in dry run) and
    /// refused (by a limit, or answered by the proxy itself: no route, a bad path).
    pub requests: u64,
    pub admitted: u64,
    pub refused: u64,
    pub keys: KeySpread,
    /// Per second from the start: requests, admitted, refused.
    pub seconds: Vec<Second>,
    /// Per limit and second from the start: its admissions and refusals.
    pub limit_seconds: Vec<LimitSeconds>,
    /// Per route and limit: passed, delayed, rejected, and the delays' percentiles.
    pub report: Report,
}

/// How the admissions spread over the keys connections send.
#[derive(Debug, Serialize, Clone, Copy, PartialEq, Eq)]
pub struct KeySpread {
    /// Keys the connections send (a connection keeps one key: at most one per connection).
    pub used: u32,
    pub admitted_min: u64,
    pub admitted_max: u64,
    /// Keys that a limit held back (refused or delayed) at least once: their admissions
    /// are set by the limits, not by how fast the machine sends.
    pub held_back: u32,
}

#[derive(Debug, Serialize, Clone, Copy, Default)]
pub struct Second {
    pub second: u64,
    pub requests: u64,
    pub admitted: u64,
    pub refused: u64,
}

#[derive(Debug, Serialize)]
pub struct LimitSeconds {
    pub limit: String,
    pub admitted: Vec<u64>,
    pub refused: Vec<u64>,
}

/// The model of `spec` against one configuration: its replay, restarted for every run.
pub struct Model {
    replay: Replay,
    spec: Spec,
    /// The request each key is sent with (connection i sends that of key i mod their
    /// number), ready to replay.
    requests: Vec<Logged>,
}

impl Model {
    /// `config` (read from `name`) under `spec`.
    pub fn new(config: Config, name: String, spec: Spec) -> Model {
        let carried = carried(&config);
        let requests = (0..spec.connections.get().min(spec.keys.count()))
            .map(|connection| request(&config, &spec, connection))
            .collect();
        let mut replay = Replay::new(config, name, &carried, None);
        replay.refusing_at_once();
        Model { replay, spec, requests }
    }

    pub fn config(&self) -> &Config {
        &self.replay.config
    }

    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    /// The spec, to change its timing (`duration`, `rate`, `turnaround`) between runs:
    /// the requests themselves were made once, by `new`.
    pub fn spec_mut(&mut self) -> &mut Spec {
        &mut self.spec
    }

    /// Runs the load from `start`, every key fresh.
    pub fn run(&mut self, start: Nanos) -> Prediction {
        self.replay.restart();
        let spec = &self.spec;
        let end = start.after(spec.duration).0;
        let keys = self.requests.len();
        let mut per_key = vec![(0u64, false); keys];
        let mut seconds: Vec<Second> = Vec::new();
        let (mut requests, mut admitted) = (0u64, 0u64);
        let mut send = |replay: &mut Replay, connection: u32, at: u64| -> Fate {
            let key = connection as usize % keys;
            let fate = replay.take(&self.requests[key], at, 0).expect("a replay that refuses at once decides at once");
            let second = (at - start.0) / 1_000_000_000;
            let index = usize::try_from(second).unwrap_or(usize::MAX);
            if seconds.len() <= index {
                seconds.resize_with(index + 1, Second::default);
                seconds[index].second = second;
            }
            seconds[index].requests += 1;
            requests += 1;
            if forwarded(&fate) {
                seconds[index].admitted += 1;
                admitted += 1;
                per_key[key].0 += 1;
            } else {
                seconds[index].refused += 1;
            }
            per_key[key].1 |= fate.refused.is_some() || !fate.wait.is_zero();
            fate
        };
        match spec.rate {
            Offered::Max => {
                // Each connection's next send, earliest first (then by connection).
                let mut next: BinaryHeap<Reverse<(u64, u32)>> =
                    (0..spec.connections.get()).map(|c| Reverse((start.0, c))).collect();
                let (turnaround, latency) = (nanos(spec.turnaround), nanos(spec.latency));
                while let Some(Reverse((at, connection))) = next.pop() {
                    if at >= end {
                        continue;
                    }
                    let fate = send(&mut self.replay, connection, at);
                    let answered =
                        if forwarded(&fate) { at.saturating_add(nanos(fate.wait)).saturating_add(latency) } else { at };
                    next.push(Reverse((answered.saturating_add(turnaround), connection)));
                }
            }
            Offered::PerSecond(rate) => {
                let connections = spec.connections.get();
                let period = 1e9 / rate;
                for n in 0u64.. {
                    let at = start.0.saturating_add((n as f64 * period) as u64);
                    if at >= end {
                        break;
                    }
                    send(&mut self.replay, (n % u64::from(connections)) as u32, at);
                }
            }
        }
        self.replay.finish();
        let start_second = start.secs();
        let limit_seconds = self
            .replay
            .config
            .limits
            .iter()
            .zip(self.replay.tally.limits.iter())
            .map(|(limit, tally)| {
                let mut admitted = vec![0; seconds.len()];
                let mut refused = vec![0; seconds.len()];
                for (second, [a, r]) in tally.series() {
                    if let Some(i) = second.checked_sub(start_second).and_then(|i| usize::try_from(i).ok())
                        && i < seconds.len()
                    {
                        (admitted[i], refused[i]) = (a, r);
                    }
                }
                LimitSeconds { limit: limit.name.clone(), admitted, refused }
            })
            .collect();
        let mut report = Report::of(&mut self.replay, 10);
        // Seconds are told from the load's start, below.
        report.busiest_seconds.clear();
        let spread = KeySpread {
            used: keys as u32,
            admitted_min: per_key.iter().map(|k| k.0).min().unwrap_or(0),
            admitted_max: per_key.iter().map(|k| k.0).max().unwrap_or(0),
            held_back: per_key.iter().filter(|k| k.1).count() as u32,
        };
        if spec.keys.count() > spec.connections.get() {
            report.notes.push(format!(
                "{} keys for {} connections: a connection keeps one key, so {} of them are sent",
                spec.keys.count(),
                spec.connections,
                spec.connections
            ));
        }
        Prediction {
            config: self.replay.name.clone(),
            spec: spec.to_string(),
            load: spec.clone(),
            closed_loop: spec.rate == Offered::Max,
            requests,
            admitted,
            refused: requests - admitted,
            keys: spread,
            seconds,
            limit_seconds,
            report,
        }
    }
}

/// Whether the request went on to the backend (passed, delayed, passed by a limit in dry
/// run, or annotated), rather than being answered by the proxy itself.
pub fn forwarded(fate: &Fate) -> bool {
    RequestOutcome::ADMITTED.contains(&fate.outcome)
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// What a synthetic request carries: every field a limit's key, an allow-list or an
/// override can read is known to be there or not (unlike a log line's), so a limit keyed
/// on a field the spec does not send skips the requests, as in `run`.
fn carried(config: &Config) -> Carried {
    let mut headers = vec![http::header::AUTHORIZATION, http::header::COOKIE, http::header::HOST];
    for limit in &config.limits {
        for part in limit.key.0.iter() {
            if let KeyPart::Header(name) = part {
                headers.push(name.clone());
            }
        }
        let allows = std::iter::once(&limit.allow).chain(limit.overrides.iter().map(|(allow, _)| allow));
        headers.extend(allows.flat_map(|a| a.headers.iter().map(|(name, _)| name.clone())));
    }
    headers.extend(config.routes.iter().flat_map(|r| r.allow.headers.iter().map(|(name, _)| name.clone())));
    Carried { query: true, host: true, headers, duration: true, status: true, millis: true, ..Carried::default() }
}

/// The request connection `connection` sends: the spec's method, target, host and
/// fields, its key, and the client address the proxy would find for it (its peer, or
/// the hop `X-Forwarded-For` names when the peer is a trusted proxy).
fn request(config: &Config, spec: &Spec, connection: u32) -> Logged {
    let mut headers = HeaderMap::new();
    if let Some(host) = &spec.host {
        headers.insert(http::header::HOST, HeaderValue::from_str(host).expect("checked when the spec was read"));
    }
    for (name, value) in &spec.headers {
        headers.append(name.clone(), value.clone());
    }
    if let Some((name, value)) = spec.keys.field(connection) {
        headers.insert(name, value);
    }
    let peer = spec.keys.address(connection);
    let client = hop::client_ip(peer, Fields::from(&headers), &config.trusted_proxies, config.forwarded);
    Logged {
        at: 0,
        client,
        method: spec.method.clone(),
        uri: spec.path.parse::<Uri>().expect("checked when the spec was read"),
        // A spec names no scheme: its requests are plain HTTP's.
        scheme: crate::router::Scheme::Http,
        headers,
        status: Some(200),
        grpc_status: None,
        claims: None,
        body: None,
        duration: Some(nanos(spec.latency)),
        recorded: Vec::new(),
        hold: None,
    }
}

impl Prediction {
    /// The prediction for people: the model, what is exact and what depends on the
    /// machine, the routes' and limits' counts, and each second.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let o = &mut out;
        let spec = &self.load;
        let _ = writeln!(o, "synthetic load: {}", self.spec);
        let _ = writeln!(o, "  keys: {}", spec.keys);
        match spec.rate {
            Offered::Max => {
                let _ = writeln!(
                    o,
                    "  closed loop: each of the {} connections sends its next request when its answer arrives: a \
                     refusal after the turnaround ({}), an admitted request after the turnaround, its delay and the \
                     backend's latency ({})",
                    spec.connections,
                    humantime::format_duration(spec.turnaround),
                    humantime::format_duration(spec.latency)
                );
            }
            Offered::PerSecond(rate) => {
                let _ = writeln!(
                    o,
                    "  open loop: requests leave on schedule, {rate} a second over all connections, whatever the \
                     answers; an admitted request is answered after its delay and the backend's latency ({})",
                    humantime::format_duration(spec.latency)
                );
            }
        }
        let k = self.keys;
        let per_key = if k.admitted_min == k.admitted_max {
            format!("{} for each of the {} keys sent", k.admitted_min, k.used)
        } else {
            format!("{} to {} for each of the {} keys sent", k.admitted_min, k.admitted_max, k.used)
        };
        if self.closed_loop {
            let _ = writeln!(
                o,
                "\nexact, whatever the machine's speed: admitted {} ({per_key}), and the delays",
                self.admitted
            );
            if k.held_back < k.used {
                let _ = writeln!(
                    o,
                    "  but {} of the {} keys were never held back by a limit: what they were admitted depends on the \
                     machine's speed too",
                    k.used - k.held_back,
                    k.used
                );
            }
            let _ = writeln!(
                o,
                "depends on the machine's speed: requests sent {}, so refused {} (at the turnaround assumed); \
                 `sluicegate verify` measures it on a real run",
                self.requests, self.refused
            );
        } else {
            let _ = writeln!(
                o,
                "\nrequests {}: admitted {} ({per_key}), refused {}",
                self.requests, self.admitted, self.refused
            );
        }
        self.report.text(o);
        // Each limit that decided a request, its admissions/refusals beside the totals.
        let limits: Vec<&LimitSeconds> =
            self.limit_seconds.iter().filter(|l| l.admitted.iter().chain(&l.refused).any(|&n| n > 0)).collect();
        let _ = write!(o, "\n{:>8} {:>10} {:>10} {:>10}", "second", "requests", "admitted", "refused");
        for l in &limits {
            let _ = write!(o, " {:>20}", format!("{} adm/ref", l.limit));
        }
        let _ = writeln!(o);
        for (i, s) in self.seconds.iter().enumerate() {
            let _ = write!(o, "{:>8} {:>10} {:>10} {:>10}", s.second, s.requests, s.admitted, s.refused);
            for l in &limits {
                let _ = write!(o, " {:>20}", format!("{}/{}", l.admitted[i], l.refused[i]));
            }
            let _ = writeln!(o);
        }
        out
    }
}
