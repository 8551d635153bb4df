//! The circuit breaker in front of Redis: after `threshold` failed calls in a row,
//! spread over at least `window` (from the first failure of the streak to the latest),
//! it opens, and calls are not made (each global limit's `on_store_error` applies at once)
//! until `cooldown` has passed; then one call at a time probes Redis, and the first
//! success closes it, a failure opens it for another `cooldown`.
//!
//! Written here rather than taken from a crate: the check runs on every request with a
//! global limit, so it is one atomic load on the limiter clock; half-open admits a single
//! probe per cooldown, not every caller; and a probe whose request is abandoned cannot
//! leave the breaker stuck open.
//!
//! Why a window: the calls queued on a connection when Redis pauses just past `timeout`
//! all time out together. Counting them alone would open the breaker on one hiccup and
//! let every instance decide locally for a whole cooldown; failures that persist over
//! `window` show Redis is really away.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

pub struct Breaker {
    threshold: u32,
    window: u64,
    cooldown: u64,
    failures: AtomicU32,
    /// Limiter-clock ns of the streak's first failure (0: no streak).
    streak_start: AtomicU64,
    /// Limiter-clock ns until which calls are skipped (0: closed). A probe moves it one
    /// cooldown ahead as it starts, so a probe that never finishes (its client left)
    /// only delays the next one.
    open_until: AtomicU64,
}

/// A change of state worth one log line.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    None,
    Opened,
    Closed,
}

impl Breaker {
    pub fn new(threshold: u32, window: std::time::Duration, cooldown: std::time::Duration) -> Self {
        let ns = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Breaker {
            threshold,
            window: ns(window),
            cooldown: ns(cooldown),
            failures: AtomicU32::new(0),
            streak_start: AtomicU64::new(0),
            open_until: AtomicU64::new(0),
        }
    }

    /// May a call be made at `now`? When open and cooled down, one caller (the probe) may.
    pub fn allows(&self, now: u64) -> bool {
        match self.open_until.load(Ordering::Acquire) {
            0 => true,
            until if now < until => false,
            until => {
                self.open_until.compare_exchange(until, self.reopen(now), Ordering::AcqRel, Ordering::Acquire).is_ok()
            }
        }
    }

    /// Calls are being skipped (open, or cooling down before the next probe).
    pub fn is_open(&self) -> bool {
        self.open_until.load(Ordering::Acquire) != 0
    }

    pub fn succeeded(&self) -> Change {
        self.failures.store(0, Ordering::Relaxed);
        self.streak_start.store(0, Ordering::Relaxed);
        if self.open_until.swap(0, Ordering::AcqRel) != 0 { Change::Closed } else { Change::None }
    }

    pub fn failed(&self, now: u64) -> Change {
        if self.open_until.load(Ordering::Acquire) != 0 {
            // A probe (or a call that started before the breaker opened) failed.
            self.open_until.store(self.reopen(now), Ordering::Release);
            return Change::None;
        }
        // The first failure of a streak marks its start (never 0, which means none).
        let _ = self.streak_start.compare_exchange(0, now.max(1), Ordering::AcqRel, Ordering::Acquire);
        let start = self.streak_start.load(Ordering::Acquire);
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures >= self.threshold
            && now.saturating_sub(start) >= self.window
            && self.open_until.compare_exchange(0, self.reopen(now), Ordering::AcqRel, Ordering::Acquire).is_ok()
        {
            return Change::Opened;
        }
        Change::None
    }

    /// The end of a cooldown starting `now` (never 0, which means closed).
    fn reopen(&self, now: u64) -> u64 {
        now.saturating_add(self.cooldown).max(1)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn opens_after_failures_in_a_row_and_probes_once_per_cooldown() {
        let b = Breaker::new(3, Duration::ZERO, Duration::from_millis(100));
        assert_eq!(b.failed(0), Change::None);
        assert_eq!(b.succeeded(), Change::None, "a success resets the count");
        assert_eq!([b.failed(0), b.failed(0)], [Change::None, Change::None]);
        assert!(!b.is_open());
        assert_eq!(b.failed(MS), Change::Opened);
        assert!(b.is_open());
        assert!(!b.allows(50 * MS));
        // Cooled down: one probe, not two.
        assert!(b.allows(101 * MS));
        assert!(!b.allows(101 * MS));
        // The probe fails: another cooldown from then.
        assert_eq!(b.failed(102 * MS), Change::None);
        assert!(!b.allows(150 * MS));
        assert!(b.allows(202 * MS));
        assert_eq!(b.succeeded(), Change::Closed);
        assert!(!b.is_open());
        assert!(b.allows(202 * MS) && b.allows(202 * MS));
    }

    #[test]
    fn a_probe_that_never_finishes_only_delays_the_next_one() {
        let b = Breaker::new(1, Duration::ZERO, Duration::from_millis(100));
        assert_eq!(b.failed(0), Change::Opened);
        assert!(b.allows(100 * MS), "the probe starts, and is dropped without an outcome");
        assert!(!b.allows(150 * MS));
        assert!(b.allows(200 * MS), "another probe, one cooldown later");
    }

    #[test]
    fn a_batch_of_failures_at_one_instant_does_not_open_it() {
        // The calls queued when Redis paused all time out within a millisecond.
        let b = Breaker::new(5, Duration::from_millis(200), Duration::from_secs(1));
        for i in 0..50 {
            assert_eq!(b.failed(10 * MS + i * 10_000), Change::None);
        }
        assert!(b.allows(11 * MS));
        // Redis answers again: the streak is over, and a later batch starts a new one.
        assert_eq!(b.succeeded(), Change::None);
        for _ in 0..5 {
            assert_eq!(b.failed(300 * MS), Change::None);
        }
        assert_eq!(b.failed(499 * MS), Change::None, "199 ms of failures: not yet");
        assert!(b.allows(499 * MS));
    }

    #[test]
    fn failures_spread_over_the_window_open_it() {
        let b = Breaker::new(5, Duration::from_millis(200), Duration::from_secs(1));
        for t in [0, 50, 100, 150] {
            assert_eq!(b.failed(1 + t * MS), Change::None);
        }
        assert_eq!(b.failed(1 + 200 * MS), Change::Opened);
        assert!(!b.allows(201 * MS));
    }

    #[test]
    fn a_long_streak_still_needs_the_count() {
        let b = Breaker::new(5, Duration::from_millis(200), Duration::from_secs(1));
        assert_eq!(b.failed(MS), Change::None);
        assert_eq!(b.failed(900 * MS), Change::None, "two failures over 900 ms are not five");
        for _ in 0..2 {
            assert_eq!(b.failed(901 * MS), Change::None);
        }
        assert_eq!(b.failed(902 * MS), Change::Opened);
    }
}
