//! What the store counts (calls, near-cache hits, failures, fallbacks) for `/metrics`, and
//! the warn line that reports failures and fallbacks at most once per `REPORT_EVERY`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tracing::warn;

use super::breaker::Change;
use super::{Store, StoreError};
use crate::clock::Nanos;
use crate::policy::OnStoreError;

/// Fallback log lines come at most this often, each with the counts since the last.
const REPORT_EVERY: Duration = Duration::from_secs(10);

/// Counts since start, for the fallback log lines and `/metrics` (`Store::counts`).
#[derive(Default)]
pub(super) struct Stats {
    /// Decisions asked of Redis (one per request, whatever the number of slots).
    pub(super) calls: AtomicU64,
    /// `DECIDE` script calls that carried them (concurrent decisions share one).
    pub(super) script_calls: AtomicU64,
    /// Requests refused by the near-cache without a call.
    pub(super) near_hits: AtomicU64,
    /// Calls that failed or timed out.
    errors: AtomicU64,
    /// Requests decided without Redis because the breaker was open.
    pub(super) skipped: AtomicU64,
    /// Global limit decisions made by `on_store_error`: allow, deny, local.
    fallbacks: [AtomicU64; 3],
}

/// Counts since start: see `Stats`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreCounts {
    pub calls: u64,
    pub script_calls: u64,
    pub near_hits: u64,
    pub errors: u64,
    pub skipped: u64,
    /// By `on_store_error`: allow, deny, local.
    pub fallbacks: [u64; 3],
    /// The circuit breaker is open: global limits are decided by `on_store_error`.
    pub breaker_open: bool,
}

impl StoreCounts {
    /// What was counted since `earlier` (the breaker as it is now).
    pub fn since(&self, earlier: &StoreCounts) -> StoreCounts {
        let [allow, deny, local] = [0, 1, 2].map(|i| self.fallbacks[i].saturating_sub(earlier.fallbacks[i]));
        StoreCounts {
            calls: self.calls.saturating_sub(earlier.calls),
            script_calls: self.script_calls.saturating_sub(earlier.script_calls),
            near_hits: self.near_hits.saturating_sub(earlier.near_hits),
            errors: self.errors.saturating_sub(earlier.errors),
            skipped: self.skipped.saturating_sub(earlier.skipped),
            fallbacks: [allow, deny, local],
            breaker_open: self.breaker_open,
        }
    }
}

/// The counts a fallback line reports, as differences from the last line's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Trouble {
    errors: u64,
    skipped: u64,
    allowed: u64,
    denied: u64,
    local: u64,
}

impl Trouble {
    fn since(&self, before: &Trouble) -> Trouble {
        Trouble {
            errors: self.errors - before.errors,
            skipped: self.skipped - before.skipped,
            allowed: self.allowed - before.allowed,
            denied: self.denied - before.denied,
            local: self.local - before.local,
        }
    }
}

/// When the last fallback line was logged (`None`: never), and the counts it reported.
#[derive(Default)]
pub(super) struct Reported {
    at: Option<Nanos>,
    counts: Trouble,
}

impl Stats {
    fn trouble(&self) -> Trouble {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let [allowed, denied, local] = [0, 1, 2].map(|i| load(&self.fallbacks[i]));
        Trouble { errors: load(&self.errors), skipped: load(&self.skipped), allowed, denied, local }
    }
}

impl Store {
    /// What the store has counted since start, for `/metrics`.
    pub fn counts(&self) -> StoreCounts {
        let s = &self.stats;
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StoreCounts {
            calls: load(&s.calls),
            script_calls: load(&s.script_calls),
            near_hits: load(&s.near_hits),
            errors: load(&s.errors),
            skipped: load(&s.skipped),
            fallbacks: [load(&s.fallbacks[0]), load(&s.fallbacks[1]), load(&s.fallbacks[2])],
            breaker_open: self.breaker.is_open(),
        }
    }

    /// Counts a decision made by `on_store_error` after `error`, and reports now and
    /// then (after counting it: the line's counts include this request).
    pub fn fell_back(&self, how: OnStoreError, error: &StoreError) {
        self.stats.fallbacks[how as usize].fetch_add(1, Ordering::Relaxed);
        self.report(Some(error));
    }

    /// Counts a failed call, remembers its error, and tells the breaker, which may open:
    /// the probes start then. The request's fallback reports it.
    pub(super) fn failed(self: &Arc<Self>, error: &StoreError) {
        self.stats.errors.fetch_add(1, Ordering::Relaxed);
        self.remember_error(error);
        if self.breaker.failed(self.clock.now().0) == Change::Opened {
            warn!(error = %error, every = ?self.cooldown,
                "Redis keeps failing: circuit breaker open, global limits use on_store_error until a probe succeeds");
            self.start_probing(self.cooldown);
        }
    }

    /// One warn line per `REPORT_EVERY` at most, with what happened since the last.
    fn report(&self, error: Option<&StoreError>) {
        let Ok(mut reported) = self.reported.try_lock() else { return };
        let now = self.clock.now();
        if reported.at.is_some_and(|at| now.since(at) < REPORT_EVERY) {
            return;
        }
        let counts = self.stats.trouble();
        let d = counts.since(&reported.counts);
        warn!(
            errors = d.errors,
            skipped = d.skipped,
            allowed = d.allowed,
            denied = d.denied,
            local = d.local,
            error = error.map(ToString::to_string).unwrap_or_default(),
            "global limits without Redis: on_store_error decided (counts since the last such line)"
        );
        *reported = Reported { at: Some(now), counts };
    }
}
