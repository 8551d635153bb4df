//! What a replay counts as it goes: per route and per limit, what became of each
//! request, the waits, the keys refused, and the requests of each second. `report`
//! turns these into what is shown. A leaf of `simulate`.

use std::collections::HashMap;
use std::time::Duration;

use typed_index_collections::TiVec;

use serde::Serialize;

use crate::config::{Config, LimitId, RouteId};
use crate::metrics::RequestOutcome;
use crate::policy::key::KeyPart;

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
    pub(super) counts: Counts,
    pub(super) banned: u64,
    pub(super) dry_run_rejected: u64,
    /// Forwarded with `RateLimit-Exceeded` by a soft limit (counted as passed too).
    pub(super) annotated: u64,
    pub invalid_cost: u64,
    /// Refused with 400 before its limits: a key field sent twice, or a key missing for a
    /// limit with `on_missing_key: refuse`.
    pub key_refused: u64,
    /// Answered from a hold of its key, which an earlier line's upstream refusal began
    /// (`upstream_hold`).
    pub held: u64,
    /// Every wait of a delayed request, ns.
    pub(super) waits: Vec<u64>,
    /// Limits of the route that did not decide some of its requests, as the log could
    /// not drive them, and how many each: (limit, requests).
    pub(super) not_simulated: Vec<(LimitId, u64)>,
}

impl Counts {
    /// Counts a request its limits decided, as a route's: refused (banned too, or
    /// Redis failing with `on_store_error: deny`), delayed, or passed (a dry-run limit's
    /// refusal and a soft limit's annotation pass it).
    pub fn outcome(&mut self, outcome: RequestOutcome) {
        self.requests += 1;
        match outcome {
            RequestOutcome::Delayed => self.delayed += 1,
            RequestOutcome::Rejected | RequestOutcome::StoreError | RequestOutcome::Banned => self.rejected += 1,
            RequestOutcome::Passed | RequestOutcome::DryRunRejected | RequestOutcome::Annotated => self.passed += 1,
        }
    }

    /// Counts one decision of a limit: `rejected`, else `delayed`, else passed.
    pub fn decided(&mut self, rejected: bool, delayed: bool) {
        self.requests += 1;
        match (rejected, delayed) {
            (true, _) => self.rejected += 1,
            (false, true) => self.delayed += 1,
            (false, false) => self.passed += 1,
        }
    }
}

impl RouteTally {
    pub fn outcome(&mut self, outcome: RequestOutcome) {
        self.counts.outcome(outcome);
        match outcome {
            RequestOutcome::Banned => self.banned += 1,
            // It passes: the limits that would refuse it only say so.
            RequestOutcome::DryRunRejected => self.dry_run_rejected += 1,
            // It passes, annotated for its upstream.
            RequestOutcome::Annotated => self.annotated += 1,
            // (A replay decides every limit locally: Redis never fails it.)
            _ => {}
        }
    }

    /// Counts a request that limit `limit` of the route would have decided, had the log
    /// allowed.
    pub fn not_simulated(&mut self, limit: LimitId) {
        match self.not_simulated.iter_mut().find(|(l, _)| *l == limit) {
            Some((_, requests)) => *requests += 1,
            None => self.not_simulated.push((limit, 1)),
        }
    }

    pub fn waited(&mut self, wait: Duration) {
        if !wait.is_zero() {
            self.waits.push(nanos(wait));
        }
    }
}

/// A key a limit refused.
pub(super) struct KeyTally {
    pub(super) label: String,
    pub(super) rejected: u64,
}

#[derive(Default)]
pub struct LimitTally {
    pub(super) counts: Counts,
    /// Requests of its routes that had no key for it (not counted, as in `run`).
    pub no_key: u64,
    /// Requests of its routes it would have decided, had the log allowed.
    pub not_simulated: u64,
    /// Key parts it needs that the lines of some of those requests do not record, in
    /// the order first missed.
    pub(super) unrecorded: Vec<KeyPart>,
    pub(super) waits: Vec<u64>,
    pub(super) keys: HashMap<u64, KeyTally>,
    /// Admitted and rejected requests per second.
    pub(super) series: HashMap<u64, [u64; 2]>,
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
        self.counts.decided(rejected, !wait.is_zero());
        self.series.entry(at / 1_000_000_000).or_default()[usize::from(rejected)] += 1;
        if !rejected && !wait.is_zero() {
            self.waits.push(nanos(wait));
        }
        if let Some((hash, label)) = refused {
            self.keys.entry(hash).or_insert_with(|| KeyTally { label: label(), rejected: 0 }).rejected += 1;
        }
    }

    /// Counts a request another limit refused: one this limit reached but did not decide
    /// (it spent nothing on it), as the proxy's decision counters have it.
    pub fn refused_elsewhere(&mut self) {
        self.counts.requests += 1;
    }

    /// Counts a request it would have decided had its line recorded key part `part`.
    pub fn unrecorded(&mut self, part: &KeyPart) {
        self.not_simulated += 1;
        if !self.unrecorded.contains(part) {
            self.unrecorded.push(part.clone());
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
    pub routes: TiVec<RouteId, RouteTally>,
    pub limits: TiVec<LimitId, LimitTally>,
    pub no_route: u64,
    pub bad_path: u64,
    /// Requests and rejections per second, over every route.
    pub(super) seconds: HashMap<u64, [u64; 2]>,
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

pub(super) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
