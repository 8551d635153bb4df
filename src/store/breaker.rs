//! The circuit breaker in front of Redis: after `threshold` failed calls in a row,
//! spread over at least `window` (from the first failure of the streak to the latest),
//! it opens, and calls are not made (each global limit's `on_store_error` applies at once)
//! until Redis answers a probe (`probe`: in the background, every `breaker_cooldown`).
//!
//! Written here rather than taken from a crate: the check runs on every request with a
//! global limit, so it is one atomic load; and no request probes: after an outage a
//! request's call would meet the connection the outage broke, fail, and keep the breaker
//! open for another cooldown (`probe` says why).
//!
//! Why a window: the calls queued on a connection when Redis pauses just past `timeout`
//! all time out together. Counting them alone would open the breaker on one hiccup and
//! let every instance decide locally for a whole cooldown; failures that persist over
//! `window` show Redis is really away.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::clock::Nanos;

pub struct Breaker {
    threshold: u32,
    window: u64,
    failures: AtomicU32,
    /// Limiter-clock ns of the streak's first failure (0: no streak).
    streak_start: AtomicU64,
    /// Limiter-clock ns since which calls are skipped (0: closed).
    open_since: AtomicU64,
}

/// A change of state worth one log line.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    None,
    Opened,
    Closed,
}

impl Breaker {
    pub fn new(threshold: u32, window: std::time::Duration) -> Self {
        Breaker {
            threshold,
            window: u64::try_from(window.as_nanos()).unwrap_or(u64::MAX),
            failures: AtomicU32::new(0),
            streak_start: AtomicU64::new(0),
            open_since: AtomicU64::new(0),
        }
    }

    /// May a call be made? Not while the breaker is open: a probe closes it.
    #[inline]
    pub fn allows(&self) -> bool {
        self.open_since.load(Ordering::Acquire) == 0
    }

    /// Calls are being skipped.
    pub fn is_open(&self) -> bool {
        !self.allows()
    }

    /// Since when calls are skipped, if they are (on the limiter clock).
    pub fn open_since(&self) -> Option<Nanos> {
        match self.open_since.load(Ordering::Acquire) {
            0 => None,
            since => Some(Nanos(since)),
        }
    }

    /// Redis answered (a call or a probe).
    pub fn succeeded(&self) -> Change {
        self.failures.store(0, Ordering::Relaxed);
        self.streak_start.store(0, Ordering::Relaxed);
        if self.open_since.swap(0, Ordering::AcqRel) != 0 { Change::Closed } else { Change::None }
    }

    /// A call failed at `now`: opens the breaker once failures in a row reach the
    /// threshold and span the window.
    pub fn failed(&self, now: u64) -> Change {
        if self.is_open() {
            // A call that started before the breaker opened: the probes decide now.
            return Change::None;
        }
        // The first failure of a streak marks its start (never 0, which means none).
        let _ = self.streak_start.compare_exchange(0, now.max(1), Ordering::AcqRel, Ordering::Acquire);
        let start = self.streak_start.load(Ordering::Acquire);
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures >= self.threshold && now.saturating_sub(start) >= self.window {
            return self.open(now);
        }
        Change::None
    }

    /// Opens the breaker at `now` whatever the count (a probe found Redis away).
    pub fn open(&self, now: u64) -> Change {
        match self.open_since.compare_exchange(0, now.max(1), Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => Change::Opened,
            Err(_) => Change::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn opens_after_failures_in_a_row_and_stays_open_until_redis_answers() {
        let b = Breaker::new(3, Duration::ZERO);
        assert_eq!(b.failed(1), Change::None);
        assert_eq!(b.succeeded(), Change::None, "a success resets the count");
        assert_eq!([b.failed(1), b.failed(1)], [Change::None, Change::None]);
        assert!(b.allows());
        assert_eq!(b.failed(MS), Change::Opened);
        assert!(b.is_open() && !b.allows());
        assert_eq!(b.open_since(), Some(Nanos(MS)));
        // However long it stays open, no call is made: a late failure changes nothing.
        assert_eq!(b.failed(100_000 * MS), Change::None);
        assert!(!b.allows());
        assert_eq!(b.open_since(), Some(Nanos(MS)), "open since the first opening");
        assert_eq!(b.succeeded(), Change::Closed);
        assert!(b.allows() && b.open_since().is_none());
    }

    #[test]
    fn a_probe_opens_it_at_once_and_once() {
        let b = Breaker::new(5, Duration::from_millis(200));
        assert_eq!(b.open(7 * MS), Change::Opened);
        assert_eq!(b.open(8 * MS), Change::None);
        assert_eq!(b.open_since(), Some(Nanos(7 * MS)));
        assert_eq!(b.succeeded(), Change::Closed);
        assert_eq!(b.succeeded(), Change::None);
    }

    #[test]
    fn a_batch_of_failures_at_one_instant_does_not_open_it() {
        // The calls queued when Redis paused all time out within a millisecond.
        let b = Breaker::new(5, Duration::from_millis(200));
        for i in 0..50 {
            assert_eq!(b.failed(10 * MS + i * 10_000), Change::None);
        }
        assert!(b.allows());
        // Redis answers again: the streak is over, and a later batch starts a new one.
        assert_eq!(b.succeeded(), Change::None);
        for _ in 0..5 {
            assert_eq!(b.failed(300 * MS), Change::None);
        }
        assert_eq!(b.failed(499 * MS), Change::None, "199 ms of failures: not yet");
        assert!(b.allows());
    }

    #[test]
    fn failures_spread_over_the_window_open_it() {
        let b = Breaker::new(5, Duration::from_millis(200));
        for t in [0, 50, 100, 150] {
            assert_eq!(b.failed(1 + t * MS), Change::None);
        }
        assert_eq!(b.failed(1 + 200 * MS), Change::Opened);
        assert!(!b.allows());
    }

    #[test]
    fn a_long_streak_still_needs_the_count() {
        let b = Breaker::new(5, Duration::from_millis(200));
        assert_eq!(b.failed(MS), Change::None);
        assert_eq!(b.failed(900 * MS), Change::None, "two failures over 900 ms are not five");
        for _ in 0..2 {
            assert_eq!(b.failed(901 * MS), Change::None);
        }
        assert_eq!(b.failed(902 * MS), Change::Opened);
    }
}
