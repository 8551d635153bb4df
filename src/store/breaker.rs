//! The circuit breaker in front of Redis: after `threshold` failed calls in a row it
//! opens, and calls are not made (each global limit's `on_store_error` applies at once)
//! until `cooldown` has passed; then one call at a time probes Redis, and the first
//! success closes it, a failure opens it for another `cooldown`.
//!
//! Written here rather than taken from a crate: the check runs on every request with a
//! global limit, so it is two atomic loads on the limiter clock, and half-open admits a
//! single probe, not every caller (as the circuit-breaker crates we looked at do).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

pub struct Breaker {
    threshold: u32,
    cooldown: u64,
    failures: AtomicU32,
    /// Limiter-clock ns until which calls are skipped (0: closed).
    open_until: AtomicU64,
    probing: AtomicBool,
}

/// A change of state worth one log line.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    None,
    Opened,
    Closed,
}

impl Breaker {
    pub fn new(threshold: u32, cooldown: std::time::Duration) -> Self {
        Breaker {
            threshold,
            cooldown: u64::try_from(cooldown.as_nanos()).unwrap_or(u64::MAX),
            failures: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
            probing: AtomicBool::new(false),
        }
    }

    /// May a call be made at `now`? When open and cooled down, one caller (the probe) may.
    pub fn allows(&self, now: u64) -> bool {
        match self.open_until.load(Ordering::Acquire) {
            0 => true,
            until if now < until => false,
            _ => self.probing.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).is_ok(),
        }
    }

    pub fn succeeded(&self) -> Change {
        self.failures.store(0, Ordering::Relaxed);
        self.probing.store(false, Ordering::Release);
        if self.open_until.swap(0, Ordering::AcqRel) != 0 { Change::Closed } else { Change::None }
    }

    pub fn failed(&self, now: u64) -> Change {
        if self.probing.swap(false, Ordering::AcqRel) {
            self.open_until.store(now.saturating_add(self.cooldown).max(1), Ordering::Release);
            return Change::None;
        }
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures >= self.threshold
            && self
                .open_until
                .compare_exchange(0, now.saturating_add(self.cooldown).max(1), Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            return Change::Opened;
        }
        Change::None
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn opens_after_failures_in_a_row_and_probes_once_per_cooldown() {
        let b = Breaker::new(3, Duration::from_millis(100));
        assert_eq!(b.failed(0), Change::None);
        assert_eq!(b.succeeded(), Change::None, "a success resets the count");
        assert_eq!([b.failed(0), b.failed(0)], [Change::None, Change::None]);
        assert_eq!(b.failed(MS), Change::Opened);
        assert!(!b.allows(50 * MS));
        // Cooled down: one probe, not two.
        assert!(b.allows(101 * MS));
        assert!(!b.allows(101 * MS));
        // The probe fails: another cooldown from then.
        assert_eq!(b.failed(102 * MS), Change::None);
        assert!(!b.allows(150 * MS));
        assert!(b.allows(202 * MS));
        assert_eq!(b.succeeded(), Change::Closed);
        assert!(b.allows(202 * MS) && b.allows(202 * MS));
    }
}
