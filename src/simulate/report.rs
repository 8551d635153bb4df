//! What a replay counted, and the report made of it: per route and per limit, passed,
//! delayed (with the delays' percentiles) and rejected requests, the keys refused most,
//! the busiest seconds; as text for people or JSON for machines; and, for two
//! configurations, what changes between them.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use super::intake::Intake;
use super::replay::Replay;
use super::tally::{Counts, KeyTally};
use crate::config::LimitId;

/// Delays, in milliseconds.
#[derive(Debug, Serialize)]
pub struct Percentiles {
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles of `waits` (ns), exact: every wait is kept.
    fn of(waits: &mut [u64]) -> Option<Percentiles> {
        if waits.is_empty() {
            return None;
        }
        waits.sort_unstable();
        let rank = |p: f64| {
            let i = ((p * waits.len() as f64).ceil() as usize).clamp(1, waits.len()) - 1;
            (waits[i] as f64 / 1e3).round() / 1e3
        };
        let mean = waits.iter().map(|&w| w as f64).sum::<f64>() / waits.len() as f64;
        Some(Percentiles {
            p50_ms: rank(0.5),
            p90_ms: rank(0.9),
            p99_ms: rank(0.99),
            max_ms: rank(1.0),
            mean_ms: (mean / 1e3).round() / 1e3,
        })
    }
}

#[derive(Debug, Serialize)]
pub struct RouteReport {
    pub name: String,
    #[serde(flatten)]
    pub counts: Counts,
    pub banned: u64,
    pub dry_run_rejected: u64,
    /// Passed annotated by a soft limit (`RateLimit-Exceeded`), not delayed.
    pub annotated: u64,
    pub invalid_cost: u64,
    /// Refused with 400 for a key field sent twice, or missing (`on_missing_key: refuse`).
    pub key_refused: u64,
    /// Answered from a hold of its key after its upstream refused it (`upstream_hold`).
    pub held: u64,
    pub delay: Option<Percentiles>,
    /// The route's limits that the log could not drive for some (or all) of its
    /// requests: its counts are not all they would have been.
    pub limits_not_simulated: Vec<NotSimulated>,
}

/// A limit of a route that did not decide `requests` of the route's requests.
#[derive(Debug, Serialize)]
pub struct NotSimulated {
    pub limit: String,
    pub requests: u64,
}

#[derive(Debug, Serialize)]
pub struct KeyReport {
    pub key: String,
    pub rejected: u64,
}

#[derive(Debug, Serialize)]
pub struct LimitReport {
    pub name: String,
    pub key: String,
    /// Why the log cannot drive it (`null`: it was simulated, perhaps not for every
    /// request: see `partly_simulated`).
    pub not_simulated: Option<String>,
    /// Why some requests of its routes were not decided by it (their lines do not record
    /// a part of its key), how many in `not_simulated_requests`.
    pub partly_simulated: Option<String>,
    #[serde(flatten)]
    pub counts: Counts,
    pub no_key: u64,
    pub not_simulated_requests: u64,
    pub delay: Option<Percentiles>,
    pub top_keys: Vec<KeyReport>,
    /// An adaptive concurrency limit's ceiling at the end of the replay, as the logged
    /// durations taught it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ceiling: Option<crate::limit::adaptive::CeilingShown>,
}

#[derive(Debug, Serialize)]
pub struct SecondReport {
    pub second: String,
    pub requests: u64,
    pub rejected: u64,
}

/// One configuration's replay of the logs.
#[derive(Debug, Serialize)]
pub struct Report {
    pub config: String,
    pub notes: Vec<String>,
    pub routes: Vec<RouteReport>,
    pub no_route: u64,
    pub bad_path: u64,
    pub limits: Vec<LimitReport>,
    pub busiest_seconds: Vec<SecondReport>,
}

impl Report {
    pub fn of(replay: &mut Replay, top: usize) -> Report {
        let ceilings: Vec<_> = (0..replay.config.limits.len()).map(|i| replay.ceiling(LimitId::from(i))).collect();
        let config = &replay.config;
        let tally = &mut replay.tally;
        let routes = config
            .routes
            .iter()
            .zip(tally.routes.iter_mut())
            .map(|(route, t)| RouteReport::of(route, t, config))
            .collect();
        let limits = config
            .limits
            .iter()
            .zip(tally.limits.iter_mut())
            .zip(&replay.skipped)
            .zip(ceilings)
            .map(|(((limit, t), skipped), ceiling)| {
                let mut keys: Vec<&KeyTally> = t.keys.values().collect();
                keys.sort_unstable_by(|a, b| b.rejected.cmp(&a.rejected).then_with(|| a.label.cmp(&b.label)));
                let top_keys =
                    keys.iter().take(top).map(|k| KeyReport { key: k.label.clone(), rejected: k.rejected }).collect();
                // Lines that do not record a part of its key: all of them (the limit
                // decided nothing), or some.
                let unrecorded = (skipped.is_none() && !t.unrecorded.is_empty()).then(|| {
                    let parts = t.unrecorded.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
                    let hint = "sluicegate's access_log records the key parts of the limits a route evaluated, \
                                with keys: true";
                    match t.counts.requests {
                        0 => format!("its key needs {parts}, which no line of its routes' requests records ({hint})"),
                        _ => format!("their lines do not record {parts}, which its key needs ({hint})"),
                    }
                });
                let (not_simulated, partly_simulated) = match unrecorded {
                    Some(why) if t.counts.requests == 0 => (Some(why), None),
                    partly => (skipped.clone(), partly),
                };
                LimitReport {
                    name: limit.name.clone(),
                    key: limit.key.0.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
                    not_simulated,
                    partly_simulated,
                    counts: t.counts,
                    no_key: t.no_key,
                    not_simulated_requests: t.not_simulated,
                    delay: Percentiles::of(&mut t.waits),
                    top_keys,
                    ceiling,
                }
            })
            .collect();
        let mut seconds: Vec<_> = tally.seconds.iter().map(|(&s, &c)| (s, c)).collect();
        seconds.sort_unstable_by(|a, b| b.1[0].cmp(&a.1[0]).then(a.0.cmp(&b.0)));
        let busiest_seconds = seconds
            .iter()
            .take(top)
            .map(|&(s, [requests, rejected])| SecondReport { second: timestamp(s * 1_000_000_000), requests, rejected })
            .collect();
        Report {
            config: replay.name.clone(),
            notes: replay.notes.clone(),
            routes,
            no_route: tally.no_route,
            bad_path: tally.bad_path,
            limits,
            busiest_seconds,
        }
    }
}

/// `2026-11-22T23:41:45Z` (with milliseconds when there are any).
pub fn timestamp(ns: u64) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_nanos(ns);
    if ns.is_multiple_of(1_000_000_000) {
        humantime::format_rfc3339_seconds(t).to_string()
    } else {
        humantime::format_rfc3339_millis(t).to_string()
    }
}

/// Requests one configuration refuses that the other admitted, by limit and key.
#[derive(Debug, Serialize)]
pub struct NewlyRefused {
    pub limit: String,
    pub key: String,
    pub requests: u64,
}

#[derive(Debug, Serialize)]
pub struct Change {
    pub name: String,
    pub old: Option<Counts>,
    pub new: Option<Counts>,
}

/// What changes from the first configuration to the second.
#[derive(Debug, Serialize)]
pub struct Changes {
    pub routes: Vec<Change>,
    pub limits: Vec<Change>,
    /// Requests the first admitted and the second refuses.
    pub newly_refused: u64,
    /// Requests the first refused and the second admits.
    pub newly_admitted: u64,
    pub newly_refused_keys: Vec<NewlyRefused>,
}

/// Counts of each name in `old` and `new`, old's order first.
pub fn changes<'a>(
    old: impl Iterator<Item = (&'a str, Counts)>,
    new: impl Iterator<Item = (&'a str, Counts)>,
) -> Vec<Change> {
    let mut all: Vec<Change> = old.map(|(name, c)| Change { name: name.to_owned(), old: Some(c), new: None }).collect();
    for (name, c) in new {
        match all.iter_mut().find(|ch| ch.name == name) {
            Some(ch) => ch.new = Some(c),
            None => all.push(Change { name: name.to_owned(), old: None, new: Some(c) }),
        }
    }
    all
}

/// The whole output.
#[derive(Debug, Serialize)]
pub struct Output {
    pub logs: Vec<String>,
    pub format: String,
    /// `milliseconds`, or `seconds` (requests within one second in file order).
    pub timestamps: &'static str,
    pub from: Option<String>,
    pub to: Option<String>,
    pub intake: Intake,
    pub configs: Vec<Report>,
    pub changes: Option<Changes>,
}

impl Output {
    /// The report for people.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let o = &mut out;
        let _ = writeln!(
            o,
            "{} lines of {} ({}): {} requests, {} unreadable",
            self.intake.lines,
            self.logs.join(", "),
            self.format,
            self.intake.requests,
            self.intake.unreadable
        );
        if let (Some(from), Some(to)) = (&self.from, &self.to) {
            let _ = writeln!(o, "from {from} to {to}");
        }
        if self.timestamps == "seconds" {
            let _ = writeln!(
                o,
                "note: the log's times are whole seconds: requests within one second are taken in file order at that second"
            );
        }
        if self.intake.late > 0 {
            let _ = writeln!(
                o,
                "note: {} lines came more than the reorder window after a later request; taken at the instant replayed last",
                self.intake.late
            );
        }
        if self.intake.dropped > 0 {
            let _ = writeln!(o, "note: the log says its writer dropped {} lines", self.intake.dropped);
        }
        for u in &self.intake.examples {
            let _ = writeln!(o, "unreadable: {}:{}: {}: {}", u.file, u.line, u.reason, u.text);
        }
        for report in &self.configs {
            report.text(o);
        }
        if let Some(changes) = &self.changes {
            changes.text(o, &self.configs[0].config, &self.configs[1].config);
        }
        out
    }
}

impl RouteReport {
    /// The route's counts from its tally `t` (its waits and limits not simulated sorted).
    fn of(route: &crate::config::Route, t: &mut super::tally::RouteTally, config: &crate::config::Config) -> Self {
        t.not_simulated.sort_unstable();
        RouteReport {
            name: route.name.clone(),
            counts: t.counts,
            banned: t.banned,
            dry_run_rejected: t.dry_run_rejected,
            annotated: t.annotated,
            invalid_cost: t.invalid_cost,
            key_refused: t.key_refused,
            held: t.held,
            delay: Percentiles::of(&mut t.waits),
            limits_not_simulated: (t.not_simulated.iter())
                .map(|&(l, requests)| NotSimulated { limit: config.limits[l].name.clone(), requests })
                .collect(),
        }
    }

    /// What the text report says under the route's row: each count that is not zero.
    fn notes(&self) -> Vec<String> {
        let mut extra = Vec::new();
        if self.banned > 0 {
            extra.push(format!("{} rejections started a ban", self.banned));
        }
        if self.dry_run_rejected > 0 {
            extra.push(format!("{} passed only because the refusing limits are in dry run", self.dry_run_rejected));
        }
        if self.annotated > 0 {
            extra.push(format!("{} passed annotated for the upstream (RateLimit-Exceeded)", self.annotated));
        }
        if self.invalid_cost > 0 {
            extra.push(format!("{} had an invalid cost header (400)", self.invalid_cost));
        }
        if self.key_refused > 0 {
            extra.push(format!(
                "{} refused for their key (400): a key field sent twice, or missing with on_missing_key: refuse",
                self.key_refused
            ));
        }
        if self.held > 0 {
            extra.push(format!(
                "{} answered from a hold of their key, the upstream having refused it with a time to wait \
             (upstream_hold)",
                self.held
            ));
        }
        if self.delay.is_some() {
            extra.push(delay_text(&self.delay));
        }
        if !self.limits_not_simulated.is_empty() {
            let limits: Vec<String> =
                self.limits_not_simulated.iter().map(|n| format!("{} ({} requests)", n.limit, n.requests)).collect();
            extra.push(format!("LIMITS NOT SIMULATED: {}; see each limit", limits.join(", ")));
        }
        extra
    }
}

fn delay_text(p: &Option<Percentiles>) -> String {
    p.as_ref().map_or_else(String::new, |p| {
        format!("delay p50 {} ms, p90 {} ms, p99 {} ms, max {} ms", p.p50_ms, p.p90_ms, p.p99_ms, p.max_ms)
    })
}

impl Report {
    pub(super) fn text(&self, o: &mut String) {
        let _ = writeln!(o, "\n== {}", self.config);
        for note in &self.notes {
            let _ = writeln!(o, "note: {note}");
        }
        let _ =
            writeln!(o, "\n{:<24} {:>10} {:>10} {:>10} {:>10}", "route", "requests", "passed", "delayed", "rejected");
        for r in &self.routes {
            let c = r.counts;
            let _ =
                writeln!(o, "{:<24} {:>10} {:>10} {:>10} {:>10}", r.name, c.requests, c.passed, c.delayed, c.rejected);
            for e in r.notes() {
                let _ = writeln!(o, "    {e}");
            }
        }
        if self.no_route > 0 || self.bad_path > 0 {
            let _ = writeln!(o, "{:<24} {:>10}", "(no route: 404)", self.no_route);
            if self.bad_path > 0 {
                let _ = writeln!(o, "{:<24} {:>10}", "(bad path: 400)", self.bad_path);
            }
        }
        for l in &self.limits {
            let _ = writeln!(o, "\nlimit {} (key: {})", l.name, l.key);
            if let Some(why) = &l.not_simulated {
                let _ = writeln!(o, "    NOT SIMULATED: {why}; {} requests of its routes", l.not_simulated_requests);
                continue;
            }
            let c = l.counts;
            let _ = writeln!(
                o,
                "    {} decided: {} passed, {} delayed, {} rejected",
                c.requests, c.passed, c.delayed, c.rejected
            );
            if let Some(why) = &l.partly_simulated {
                let _ = writeln!(o, "    NOT SIMULATED for {} requests of its routes: {why}", l.not_simulated_requests);
            }
            if l.no_key > 0 {
                let _ = writeln!(o, "    {} requests had no key (not counted)", l.no_key);
            }
            if l.delay.is_some() {
                let _ = writeln!(o, "    {}", delay_text(&l.delay));
            }
            if let Some(c) = &l.ceiling {
                let ms = |m: Option<f64>| m.map_or_else(|| "-".to_owned(), |m| format!("{m:.1} ms"));
                let _ = writeln!(
                    o,
                    "    ceiling at the end: {} ({}–{}); slots held: {} recent, {} ground",
                    c.now,
                    c.min,
                    c.max,
                    ms(c.recent_ms),
                    ms(c.ground_ms)
                );
            }
            if !l.top_keys.is_empty() {
                let _ = writeln!(o, "    keys refused most:");
                for k in &l.top_keys {
                    let _ = writeln!(o, "      {:>10}  {}", k.rejected, k.key);
                }
            }
        }
        if !self.busiest_seconds.is_empty() {
            let _ = writeln!(o, "\nbusiest seconds:");
            for s in &self.busiest_seconds {
                let _ = writeln!(o, "    {}  {:>8} requests {:>8} rejected", s.second, s.requests, s.rejected);
            }
        }
    }
}

impl Changes {
    pub fn text(&self, o: &mut String, old: &str, new: &str) {
        let _ = writeln!(o, "\n== changes from {old} to {new}");
        let cell = |c: Option<Counts>| {
            c.map_or_else(|| "-".to_owned(), |c| format!("{}/{}/{}", c.passed, c.delayed, c.rejected))
        };
        let diff = |ch: &Change| {
            let rejected = |c: Option<Counts>| c.map_or(0, |c| c.rejected as i64);
            match rejected(ch.new) - rejected(ch.old) {
                0 => String::new(),
                d => format!("{d:+} rejected"),
            }
        };
        let _ = writeln!(o, "{:<30} {:>24} {:>24}", "passed/delayed/rejected", "old", "new");
        for (kind, list) in [("route", &self.routes), ("limit", &self.limits)] {
            for ch in list {
                let name = format!("{kind} {}", ch.name);
                let _ = writeln!(o, "{:<30} {:>24} {:>24}  {}", name, cell(ch.old), cell(ch.new), diff(ch));
            }
        }
        let _ = writeln!(o, "\n{} requests newly refused, {} newly admitted", self.newly_refused, self.newly_admitted);
        if !self.newly_refused_keys.is_empty() {
            let _ = writeln!(o, "keys newly refused:");
            for k in &self.newly_refused_keys {
                let _ = writeln!(o, "    {:>10}  limit {}: {}", k.requests, k.limit, k.key);
            }
        }
    }
}
