//! What a replay counted, and the report made of it: per route and per limit, passed,
//! delayed (with the delays' percentiles) and rejected requests, the keys refused most,
//! the busiest seconds; as text for people or JSON for machines; and, for two
//! configurations, what changes between them.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use super::intake::Intake;
use super::replay::Replay;
use crate::config::Config;
use crate::metrics::RequestOutcome;

/// A progress bar over `bytes` of logs, drawn on a terminal only.
pub fn progress(bytes: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() || bytes == 0 {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(bytes), ProgressDrawTarget::stderr());
    let style =
        ProgressStyle::with_template("{bar:40} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}

/// What became of the requests of a route, or a limit's decisions.
#[derive(Debug, Default, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Counts {
    pub requests: u64,
    pub passed: u64,
    pub delayed: u64,
    pub rejected: u64,
}

#[derive(Default)]
pub struct RouteTally {
    counts: Counts,
    banned: u64,
    dry_run_rejected: u64,
    pub invalid_cost: u64,
    /// Every wait of a delayed request, ns.
    waits: Vec<u64>,
}

impl RouteTally {
    pub fn outcome(&mut self, outcome: RequestOutcome) {
        self.counts.requests += 1;
        match outcome {
            RequestOutcome::Passed => self.counts.passed += 1,
            RequestOutcome::Delayed => self.counts.delayed += 1,
            RequestOutcome::Rejected => self.counts.rejected += 1,
            RequestOutcome::Banned => {
                self.counts.rejected += 1;
                self.banned += 1;
            }
            // It passes: the limits that would refuse it only say so.
            RequestOutcome::DryRunRejected => {
                self.counts.passed += 1;
                self.dry_run_rejected += 1;
            }
        }
    }

    pub fn waited(&mut self, wait: Duration) {
        if !wait.is_zero() {
            self.waits.push(nanos(wait));
        }
    }
}

/// A key a limit refused.
struct KeyTally {
    label: String,
    rejected: u64,
}

#[derive(Default)]
pub struct LimitTally {
    counts: Counts,
    /// Requests of its routes that had no key for it (not counted, as in `run`).
    pub no_key: u64,
    /// Requests of its routes it would have decided, had the log allowed.
    pub not_simulated: u64,
    waits: Vec<u64>,
    keys: HashMap<u64, KeyTally>,
    /// Admitted and rejected requests per second.
    series: HashMap<u64, [u64; 2]>,
}

impl LimitTally {
    /// Counts one decision of this limit at `at`; `refused`: the key's hash and label.
    pub fn decided(
        &mut self,
        at: u64,
        rejected: bool,
        wait: Duration,
        refused: Option<(u64, impl FnOnce() -> String)>,
    ) {
        self.counts.requests += 1;
        let slot = self.series.entry(at / 1_000_000_000).or_default();
        if rejected {
            self.counts.rejected += 1;
            slot[1] += 1;
        } else if !wait.is_zero() {
            self.counts.delayed += 1;
            self.waits.push(nanos(wait));
            slot[0] += 1;
        } else {
            self.counts.passed += 1;
            slot[0] += 1;
        }
        if let Some((hash, label)) = refused {
            self.keys.entry(hash).or_insert_with(|| KeyTally { label: label(), rejected: 0 }).rejected += 1;
        }
    }

    /// Admitted and rejected requests per second, by second.
    pub fn series(&self) -> Vec<(u64, [u64; 2])> {
        let mut series: Vec<_> = self.series.iter().map(|(&s, &c)| (s, c)).collect();
        series.sort_unstable();
        series
    }

    pub fn key_label(&self, hash: u64) -> Option<&str> {
        self.keys.get(&hash).map(|k| k.label.as_str())
    }
}

/// Everything one configuration's replay counted.
pub struct Tally {
    pub routes: Vec<RouteTally>,
    pub limits: Vec<LimitTally>,
    pub no_route: u64,
    pub bad_path: u64,
    /// Requests and rejections per second, over every route.
    seconds: HashMap<u64, [u64; 2]>,
}

impl Tally {
    pub fn new(config: &Config) -> Tally {
        Tally {
            routes: config.routes.iter().map(|_| RouteTally::default()).collect(),
            limits: config.limits.iter().map(|_| LimitTally::default()).collect(),
            no_route: 0,
            bad_path: 0,
            seconds: HashMap::new(),
        }
    }

    pub fn second(&mut self, at: u64) {
        self.seconds.entry(at / 1_000_000_000).or_default()[0] += 1;
    }

    pub fn rejected_at(&mut self, at: u64) {
        self.seconds.entry(at / 1_000_000_000).or_default()[1] += 1;
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Delays, in milliseconds.
#[derive(Debug, Serialize)]
pub struct Percentiles {
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
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
        Some(Percentiles { p50_ms: rank(0.5), p90_ms: rank(0.9), p99_ms: rank(0.99), max_ms: rank(1.0) })
    }
}

#[derive(Debug, Serialize)]
pub struct RouteReport {
    pub name: String,
    #[serde(flatten)]
    pub counts: Counts,
    pub banned: u64,
    pub dry_run_rejected: u64,
    pub invalid_cost: u64,
    pub delay: Option<Percentiles>,
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
    /// Why the log cannot drive it (`null`: it was simulated).
    pub not_simulated: Option<String>,
    #[serde(flatten)]
    pub counts: Counts,
    pub no_key: u64,
    pub not_simulated_requests: u64,
    pub delay: Option<Percentiles>,
    pub top_keys: Vec<KeyReport>,
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
        let config = &replay.config;
        let tally = &mut replay.tally;
        let routes = config
            .routes
            .iter()
            .zip(tally.routes.iter_mut())
            .map(|(route, t)| RouteReport {
                name: route.name.clone(),
                counts: t.counts,
                banned: t.banned,
                dry_run_rejected: t.dry_run_rejected,
                invalid_cost: t.invalid_cost,
                delay: Percentiles::of(&mut t.waits),
            })
            .collect();
        let limits = config
            .limits
            .iter()
            .zip(tally.limits.iter_mut())
            .zip(&replay.skipped)
            .map(|((limit, t), skipped)| {
                let mut keys: Vec<&KeyTally> = t.keys.values().collect();
                keys.sort_unstable_by(|a, b| b.rejected.cmp(&a.rejected).then_with(|| a.label.cmp(&b.label)));
                let top_keys =
                    keys.iter().take(top).map(|k| KeyReport { key: k.label.clone(), rejected: k.rejected }).collect();
                LimitReport {
                    name: limit.name.clone(),
                    key: limit.key.0.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
                    not_simulated: skipped.clone(),
                    counts: t.counts,
                    no_key: t.no_key,
                    not_simulated_requests: t.not_simulated,
                    delay: Percentiles::of(&mut t.waits),
                    top_keys,
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
    if ns % 1_000_000_000 == 0 {
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

fn delay_text(p: &Option<Percentiles>) -> String {
    p.as_ref().map_or_else(String::new, |p| {
        format!("delay p50 {} ms, p90 {} ms, p99 {} ms, max {} ms", p.p50_ms, p.p90_ms, p.p99_ms, p.max_ms)
    })
}

impl Report {
    fn text(&self, o: &mut String) {
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
            let mut extra = Vec::new();
            if r.banned > 0 {
                extra.push(format!("{} rejections started a ban", r.banned));
            }
            if r.dry_run_rejected > 0 {
                extra.push(format!("{} passed only because the refusing limits are in dry run", r.dry_run_rejected));
            }
            if r.invalid_cost > 0 {
                extra.push(format!("{} had an invalid cost header (400)", r.invalid_cost));
            }
            if r.delay.is_some() {
                extra.push(delay_text(&r.delay));
            }
            for e in extra {
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
            if l.no_key > 0 {
                let _ = writeln!(o, "    {} requests had no key (not counted)", l.no_key);
            }
            if l.delay.is_some() {
                let _ = writeln!(o, "    {}", delay_text(&l.delay));
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
    fn text(&self, o: &mut String, old: &str, new: &str) {
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
