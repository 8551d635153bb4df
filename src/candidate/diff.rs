//! What a candidate changes, tallied request by request since it was loaded: per route
//! and limit, what each side decided (counted as `simulate` counts a replay); the
//! requests the candidate would newly refuse and newly admit, and the keys most
//! affected (named as every surface names keys: the enforced limits' secret hashes and
//! digests them alike); the requests it would route elsewhere. Read by `GET /candidate`
//! and the dashboard in the shape of `simulate --compare`'s changes, so that yesterday's
//! replay and today's live numbers read side by side; counted in
//! `sluicegate_candidate_decisions_total{limit,change}` as they come.
//!
//! One lock a request, taken only while a candidate is live; everything it holds is
//! bounded by the two configurations' names (the keys by a Misra-Gries summary).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use prometheus_client::metrics::counter::Counter;
use serde::Serialize;
use smallvec::SmallVec;

use super::Candidate;
use crate::admission::{Admission, Verdict};
use crate::config::{Config, LimitId};
use crate::gate::Decision;
use crate::limit::{LimitResult, Limiters, Outcome};
use crate::metrics::{Metrics, RequestOutcome};
use crate::simulate::Counts;
use crate::simulate::report::{Change as Changed, Changes, NewlyRefused};
use crate::top_keys::TopKeys;

/// Keys kept per limit and direction: any key with more than 1/9 of them is among them.
const KEYS: usize = 8;

/// Pairs of routes counted by name (in the tally and the metrics' series); those that
/// come after are counted as `*` → `*`, so that traffic spread over many routes cannot
/// grow either without bound.
const REROUTES: usize = 1_000;

/// What the candidate makes of a request, beside the enforced configuration (the access
/// log's `candidate`, the `change` of `sluicegate_candidate_decisions_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// The enforced limits admit it and a candidate's limit would refuse it.
    Refused,
    /// An enforced limit refuses it and the candidate's would admit it.
    Admitted,
    /// Both admit it, or both refuse it.
    Same,
}

impl Change {
    pub const ALL: [Change; 3] = [Change::Refused, Change::Admitted, Change::Same];

    pub fn as_str(self) -> &'static str {
        match self {
            Change::Refused => "refused",
            Change::Admitted => "admitted",
            Change::Same => "same",
        }
    }

    fn of(enforced: bool, candidate: bool) -> Change {
        match (enforced, candidate) {
            (false, true) => Change::Refused,
            (true, false) => Change::Admitted,
            _ => Change::Same,
        }
    }
}

/// One side's admission of a request: its configuration, state and findings.
pub struct Side<'s, 'h> {
    pub config: &'s Config,
    pub limiters: &'s Limiters,
    pub admission: &'s Admission<'h>,
}

impl Side<'_, '_> {
    fn route(&self) -> Option<&str> {
        self.admission.front.as_ref().map(|f| self.config.routes[f.route].name.as_str())
    }

    fn decision(&self) -> Option<&Decision> {
        match &self.admission.verdict {
            Verdict::Decided(decision) => Some(decision),
            _ => None,
        }
    }

    /// The limit that refuses the request, if one does (Redis failing is no limit's
    /// refusal).
    fn refused_by(&self) -> Option<&LimitResult> {
        match self.decision()? {
            Decision::Reject { limit, results, store_error: None, .. } => results.iter().find(|r| r.limit == *limit),
            _ => None,
        }
    }

    fn results(&self) -> &[LimitResult] {
        self.decision().map_or(&[], Decision::results)
    }

    /// Whether limit `name` refuses the request by its own result.
    fn limit_refuses(&self, name: &str) -> bool {
        self.results()
            .iter()
            .any(|r| r.outcome.is_rejected() && self.config.limits[r.limit].refuses() && self.name(r.limit) == name)
    }

    fn name(&self, limit: LimitId) -> &str {
        &self.config.limits[limit].name
    }

    /// The label of the key `result` was decided by.
    fn label(&self, result: &LimitResult) -> String {
        let front = self.admission.front.as_ref();
        front.map_or_else(|| "-".to_owned(), |f| self.limiters.key_label(result.limit, &f.src))
    }
}

/// The tally since the candidate was loaded.
pub struct Diff {
    tally: Mutex<Tally>,
    metrics: Arc<Metrics>,
}

#[derive(Default)]
struct Tally {
    requests: u64,
    newly_refused: u64,
    newly_admitted: u64,
    /// By route name: the enforced side's counts, the candidate's.
    routes: HashMap<String, [Option<Counts>; 2]>,
    limits: HashMap<String, LimitDiff>,
    /// Requests by (enforced route, candidate route) that differ (`-`: none).
    rerouted: HashMap<(String, String), u64>,
}

struct LimitDiff {
    counts: [Option<Counts>; 2],
    /// Keys the candidate would newly refuse, and newly admit.
    refused: TopKeys<KEYS>,
    admitted: TopKeys<KEYS>,
    /// `sluicegate_candidate_decisions_total` of the limit, by `Change`.
    series: [Counter; 3],
}

impl Diff {
    /// An empty tally, its metrics' series started again.
    pub fn new(metrics: &Arc<Metrics>) -> Diff {
        metrics.candidate_cleared();
        Diff { tally: Mutex::default(), metrics: Arc::clone(metrics) }
    }

    /// Tallies one request as `enforced` and `candidate` decided it; returns what
    /// changes, and the candidate's route when it is not the enforced one.
    pub fn tally(&self, enforced: &Side<'_, '_>, candidate: &Side<'_, '_>) -> (Change, Option<String>) {
        let mut tally = self.tally.lock().unwrap_or_else(PoisonError::into_inner);
        tally.requests += 1;
        let sides = [enforced, candidate];
        for (n, side) in sides.iter().enumerate() {
            if let (Some(route), Some(decision)) = (side.route(), side.decision()) {
                // (A route's name is made a `String` once, not each request.)
                if !tally.routes.contains_key(route) {
                    tally.routes.insert(route.to_owned(), [None; 2]);
                }
                let counts = tally.routes.get_mut(route).expect("inserted");
                counts[n].get_or_insert_default().outcome(RequestOutcome::of(decision, &side.config.limits));
            }
            let refused = matches!(side.decision(), Some(Decision::Reject { .. }));
            for r in side.results() {
                let limit = tally.limit(side.name(r.limit), &self.metrics);
                let counts = limit.counts[n].get_or_insert_default();
                if refused && !r.outcome.is_rejected() {
                    // Another limit refused it: no decision of this one's.
                    counts.requests += 1;
                } else {
                    counts.decided(r.outcome.is_rejected(), matches!(r.outcome, Outcome::Delayed(_)));
                }
            }
        }
        // Each limit either side decided it with, by its own result.
        let mut names: SmallVec<[&str; 4]> = SmallVec::new();
        for side in sides {
            for r in side.results() {
                let name = side.name(r.limit);
                if !names.contains(&name) {
                    names.push(name);
                }
            }
        }
        for name in names {
            let change = Change::of(enforced.limit_refuses(name), candidate.limit_refuses(name));
            tally.limit(name, &self.metrics).series[change as usize].inc();
        }
        let change = Change::of(enforced.refused_by().is_some(), candidate.refused_by().is_some());
        match change {
            Change::Refused => {
                tally.newly_refused += 1;
                if let Some(r) = candidate.refused_by() {
                    let limit = tally.limit(candidate.name(r.limit), &self.metrics);
                    limit.refused.count(r.key.0, || candidate.label(r));
                }
            }
            Change::Admitted => {
                tally.newly_admitted += 1;
                if let Some(r) = enforced.refused_by() {
                    let limit = tally.limit(enforced.name(r.limit), &self.metrics);
                    limit.admitted.count(r.key.0, || enforced.label(r));
                }
            }
            Change::Same => {}
        }
        let rerouted = (enforced.route() != candidate.route()).then(|| {
            let (from, to) = (enforced.route().unwrap_or("-").to_owned(), candidate.route().unwrap_or("-").to_owned());
            let pair = counted_as(&tally.rerouted, (from, to.clone()));
            self.metrics.candidate_rerouted(&pair.0, &pair.1);
            *tally.rerouted.entry(pair).or_default() += 1;
            to
        });
        (change, rerouted)
    }

    /// The tally in the shape `simulate --compare` reports it, `top` keys each way.
    pub fn report(&self, candidate: &Candidate, top: usize) -> Report {
        let tally = self.tally.lock().unwrap_or_else(PoisonError::into_inner);
        let changed = |map: Vec<(&String, [Option<Counts>; 2])>| {
            let mut list: Vec<Changed> =
                map.into_iter().map(|(name, [old, new])| Changed { name: name.clone(), old, new }).collect();
            list.sort_by(|a, b| a.name.cmp(&b.name));
            list
        };
        let keys = |pick: fn(&LimitDiff) -> &TopKeys<KEYS>| {
            let mut keys: Vec<NewlyRefused> = tally
                .limits
                .iter()
                .flat_map(|(name, l)| {
                    pick(l).sorted().into_iter().map(|k| NewlyRefused {
                        limit: name.clone(),
                        key: k.label,
                        requests: k.count,
                    })
                })
                .collect();
            keys.sort_by(|a, b| b.requests.cmp(&a.requests).then_with(|| (&a.limit, &a.key).cmp(&(&b.limit, &b.key))));
            keys.truncate(top);
            keys
        };
        let mut rerouted: Vec<Rerouted> = tally
            .rerouted
            .iter()
            .map(|((route, to), &requests)| Rerouted { route: route.clone(), candidate_route: to.clone(), requests })
            .collect();
        rerouted.sort_by(|a, b| b.requests.cmp(&a.requests).then_with(|| a.route.cmp(&b.route)));
        let limit_decisions = {
            let mut list: Vec<LimitChanges> = tally
                .limits
                .iter()
                .map(|(name, l)| {
                    let [refused, admitted, same] = l.series.each_ref().map(Counter::get);
                    LimitChanges { limit: name.clone(), refused, admitted, same }
                })
                .collect();
            list.sort_by(|a, b| a.limit.cmp(&b.limit));
            list
        };
        Report {
            file: candidate.file.display().to_string(),
            loaded: humantime::format_rfc3339_seconds(candidate.loaded).to_string(),
            seconds: SystemTime::now().duration_since(candidate.loaded).unwrap_or_default().as_secs(),
            requests: tally.requests,
            warnings: candidate.warnings.clone(),
            changes: Changes {
                routes: changed(tally.routes.iter().map(|(n, c)| (n, *c)).collect()),
                limits: changed(tally.limits.iter().map(|(n, l)| (n, l.counts)).collect()),
                newly_refused: tally.newly_refused,
                newly_admitted: tally.newly_admitted,
                newly_refused_keys: keys(|l| &l.refused),
            },
            newly_admitted_keys: keys(|l| &l.admitted),
            limit_decisions,
            rerouted,
        }
    }
}

/// The pair of routes a request routed elsewhere counts under: its own, while fewer than
/// `REROUTES` pairs are counted (or it is one of them), else `*` → `*`.
fn counted_as(rerouted: &HashMap<(String, String), u64>, pair: (String, String)) -> (String, String) {
    match rerouted.len() < REROUTES || rerouted.contains_key(&pair) {
        true => pair,
        false => ("*".to_owned(), "*".to_owned()),
    }
}

impl Tally {
    fn limit(&mut self, name: &str, metrics: &Metrics) -> &mut LimitDiff {
        if !self.limits.contains_key(name) {
            let diff = LimitDiff {
                counts: [None; 2],
                refused: TopKeys::default(),
                admitted: TopKeys::default(),
                series: metrics.candidate_series(name, Change::ALL.map(Change::as_str)),
            };
            self.limits.insert(name.to_owned(), diff);
        }
        self.limits.get_mut(name).expect("inserted")
    }
}

/// `GET /candidate`: what the candidate changed since it was loaded.
#[derive(Debug, Serialize)]
pub struct Report {
    /// Its file, and since when it is live (RFC 3339, and seconds).
    pub file: String,
    pub loaded: String,
    pub seconds: u64,
    /// Requests both decided.
    pub requests: u64,
    pub warnings: Vec<String>,
    /// As `simulate --compare` reports them: `old` the enforced side, `new` the candidate.
    pub changes: Changes,
    /// The keys the candidate would newly admit most, by the enforced limit that refuses them.
    pub newly_admitted_keys: Vec<NewlyRefused>,
    /// Per limit, its requests by change (`sluicegate_candidate_decisions_total`).
    pub limit_decisions: Vec<LimitChanges>,
    /// Requests the candidate would route elsewhere, by route.
    pub rerouted: Vec<Rerouted>,
}

#[derive(Debug, Serialize)]
pub struct LimitChanges {
    pub limit: String,
    pub refused: u64,
    pub admitted: u64,
    pub same: u64,
}

#[derive(Debug, Serialize)]
pub struct Rerouted {
    pub route: String,
    pub candidate_route: String,
    pub requests: u64,
}

impl Report {
    /// As `sluicegate reload --candidate` and `sluicegate candidate` print it.
    pub fn text(&self) -> String {
        use std::fmt::Write;
        let mut o = String::new();
        let _ = writeln!(
            o,
            "candidate {} live since {} ({} s): {} requests decided by both",
            self.file, self.loaded, self.seconds, self.requests
        );
        for warning in &self.warnings {
            let _ = writeln!(o, "warning: {warning}");
        }
        self.changes.text(&mut o, "enforced", "candidate");
        if !self.newly_admitted_keys.is_empty() {
            let _ = writeln!(o, "keys newly admitted:");
            for k in &self.newly_admitted_keys {
                let _ = writeln!(o, "    {:>10}  limit {}: {}", k.requests, k.limit, k.key);
            }
        }
        if !self.rerouted.is_empty() {
            let _ = writeln!(o, "requests routed elsewhere:");
            for r in &self.rerouted {
                let _ = writeln!(o, "    {:>10}  route {} -> {}", r.requests, r.route, r.candidate_route);
            }
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_of_routes_past_the_first_thousand_are_counted_together() {
        let pair = |n: usize| (format!("r{n}"), format!("c{n}"));
        let mut rerouted = HashMap::new();
        for n in 0..REROUTES {
            let counted = counted_as(&rerouted, pair(n));
            assert_eq!(counted, pair(n));
            *rerouted.entry(counted).or_insert(0) += 1;
        }
        assert_eq!(counted_as(&rerouted, pair(REROUTES)), ("*".to_owned(), "*".to_owned()));
        assert_eq!(counted_as(&rerouted, pair(7)), pair(7), "a pair already counted keeps its own");
    }

    #[test]
    fn a_change_is_what_the_candidate_does_beside_the_running_decision() {
        assert_eq!(Change::of(false, true), Change::Refused);
        assert_eq!(Change::of(true, false), Change::Admitted);
        assert_eq!(Change::of(true, true), Change::Same);
        assert_eq!(Change::of(false, false), Change::Same);
        assert_eq!(Change::ALL.map(Change::as_str), ["refused", "admitted", "same"], "the metric's series, in order");
    }
}
