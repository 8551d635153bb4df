//! Sliding window counter: the count of the previous fixed window, weighted by how much
//! of it the sliding window still covers, plus the count of the current one:
//! `estimate = prev · (1 − elapsed / window) + curr`; a request is admitted while
//! `estimate + 1 ≤ limit`. Windows are aligned to the Unix epoch.
//!
//! An approximation (it assumes the previous window's requests were evenly spread) that
//! removes most of the fixed window's boundary burst for the cost of two counters: each
//! aligned window admits at most `limit`, and any interval of one window's length at
//! most `2·limit − 1` (requests bunched at the end of one window and admitted again as
//! its weight fades), where a fixed window allows that much in an instant.
//!
//! State: `[window index, prev << 32 | curr]`, 16 bytes (counts up to 2^32 − 1).

use std::time::Duration;

use super::Verdict;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlidingWindow {
    limit: u64,
    window: u64,
}

const LOW: u64 = (1 << 32) - 1;

impl SlidingWindow {
    /// `limit` below 2^32, `window` at least 1 ms (checked by the config).
    pub fn new(limit: u64, window: Duration) -> Self {
        SlidingWindow { limit, window: u64::try_from(window.as_nanos()).unwrap_or(u64::MAX).max(1) }
    }

    /// This window with `limit` in place of its own (a tenant's, `limit_from`): a key's
    /// state (counts, or a log of instants) means the same under any limit.
    pub fn with_limit(&self, limit: u64) -> Self {
        SlidingWindow { limit, ..*self }
    }

    /// The window's length, ns.
    pub fn window(&self) -> u64 {
        self.window
    }

    /// The state word stored for `counts` at `now`: the current window's index.
    pub fn stored(&self, counts: u64, now: u64) -> [u64; 2] {
        [now / self.window, counts]
    }

    /// (prev, curr) as seen from `now`.
    fn counts(&self, state: Option<[u64; 2]>, now: u64) -> (u64, u64) {
        let index = now / self.window;
        match state {
            Some([i, c]) if i == index => (c >> 32, c & LOW),
            Some([i, c]) if i + 1 == index => (c & LOW, 0),
            _ => (0, 0),
        }
    }

    /// Decides a request of `cost` (≥ 1) units at `now`; an admission's `state` is the
    /// counts word (see `stored`).
    pub fn decide(&self, state: Option<[u64; 2]>, now: u64, cost: u64) -> Verdict {
        let (w, limit) = (u128::from(self.window), u128::from(self.limit));
        let units = u128::from(cost) * w;
        let (prev, curr) = self.counts(state, now);
        let elapsed = now % self.window;
        let left = u128::from(self.window - elapsed);
        // Everything in count·ns, so the comparison is exact.
        let weighted = u128::from(prev) * left + u128::from(curr) * w;
        let excess = weighted as f64 / w as f64;
        if weighted + units > limit * w {
            let retry_after = self.retry_after(prev, curr, elapsed, cost);
            let (remaining, reset) = self.stands(state, now);
            return Verdict::Reject { retry_after, remaining, reset, excess };
        }
        let curr = curr + cost;
        let remaining = (limit * w - (weighted + units)) / w;
        Verdict::Admit {
            state: (prev << 32) | curr,
            wait: 0,
            remaining: u64::try_from(remaining).unwrap_or(u64::MAX),
            reset: self.reset(prev, curr, elapsed),
            excess: excess + cost as f64,
        }
    }

    /// Where a key in `state` stands at `now`, nothing taken: the units its estimate
    /// leaves room for, and until the estimate is back to zero.
    pub fn stands(&self, state: Option<[u64; 2]>, now: u64) -> (u64, u64) {
        let (prev, curr) = self.counts(state, now);
        let elapsed = now % self.window;
        let w = u128::from(self.window);
        let weighted = u128::from(prev) * u128::from(self.window - elapsed) + u128::from(curr) * w;
        let remaining = (u128::from(self.limit) * w).saturating_sub(weighted) / w;
        (u64::try_from(remaining).unwrap_or(u64::MAX), self.reset(prev, curr, elapsed))
    }

    /// Takes back an admission of `cost` units made at `at`: from the current count if
    /// its window still runs, from the previous one if that is where it now lies.
    pub fn refund(&self, [index, counts]: [u64; 2], cost: u64, at: u64) -> [u64; 2] {
        let (prev, curr) = (counts >> 32, counts & LOW);
        match index.checked_sub(at / self.window) {
            Some(0) => [index, (prev << 32) | curr.saturating_sub(cost)],
            Some(1) => [index, (prev.saturating_sub(cost) << 32) | curr],
            _ => [index, counts],
        }
    }

    /// From `elapsed` into the current window, when `estimate + cost ≤ limit` holds again
    /// (rounded so as never to be early; `cost ≤ limit`).
    fn retry_after(&self, prev: u64, curr: u64, elapsed: u64, cost: u64) -> u64 {
        let (w, limit, cost) = (u128::from(self.window), u128::from(self.limit), u128::from(cost));
        // Within this window, as the previous one's weight fades.
        if u128::from(curr) + cost <= limit && prev > 0 {
            let room = (limit - cost - u128::from(curr)) * w;
            let at = w - room / u128::from(prev);
            if at < w {
                return u64::try_from(at).unwrap_or(u64::MAX).saturating_sub(elapsed).max(1);
            }
        }
        // In the next window, where this window's count becomes the fading one.
        // (A cost above the limit never fits; the config and the proxy refuse one first.)
        let at = if curr == 0 { 0 } else { w - limit.saturating_sub(cost) * w / u128::from(curr) };
        (self.window - elapsed).saturating_add(u64::try_from(at).unwrap_or(u64::MAX))
    }

    /// Until the estimate is back to zero.
    fn reset(&self, prev: u64, curr: u64, elapsed: u64) -> u64 {
        match (prev, curr) {
            (_, c) if c > 0 => 2 * self.window - elapsed,
            (p, _) if p > 0 => self.window - elapsed,
            _ => 0,
        }
    }

    pub fn is_idle(&self, state: [u64; 2], now: u64) -> bool {
        self.counts(Some(state), now) == (0, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    /// Replays arrivals (seconds); returns Ok(()) for admissions, Err(retry seconds) otherwise.
    fn replay(w: &SlidingWindow, arrivals: &[f64]) -> Vec<Result<(), f64>> {
        let mut state = None;
        arrivals
            .iter()
            .map(|&t| {
                let now = (t * S as f64) as u64;
                match w.decide(state, now, 1) {
                    Verdict::Admit { state: counts, .. } => {
                        state = Some(w.stored(counts, now));
                        Ok(())
                    }
                    Verdict::Reject { retry_after, .. } => Err(retry_after as f64 / S as f64),
                }
            })
            .collect()
    }

    #[test]
    fn a_costly_request_counts_as_its_cost() {
        let w = SlidingWindow::new(3, Duration::from_secs(1));
        let Verdict::Admit { state, remaining: 1, .. } = w.decide(None, 0, 2) else { panic!("cost 2 of 3 refused") };
        let stored = Some(w.stored(state, 0));
        assert!(matches!(w.decide(stored, 0, 2), Verdict::Reject { .. }));
        assert!(matches!(w.decide(stored, 0, 1), Verdict::Admit { remaining: 0, .. }));
    }

    #[test]
    fn the_previous_window_fades_out_linearly() {
        // 4 per 100 s. All four at the end of window [0, 100).
        let w = SlidingWindow::new(4, Duration::from_secs(100));
        let out = replay(&w, &[96.0, 97.0, 98.0, 99.0, 99.5, 110.0, 125.0, 125.5, 150.0, 150.0]);
        // At 99.5: full. At 110: estimate 4·0.9 = 3.6, +1 > 4: wait until 125, when 4·0.75 = 3.
        // At 125: admitted (3 + 1 = 4). At 125.5: 4·0.745 + 1 + 1 > 4: the next fits at 150.
        // At 150: 4·0.5 + 1 = 3, +1: admitted; then 4·0.5 + 2 + 1 > 4 until 4·0.25 + 2 + 1
        // fits, at 175.
        assert_eq!(out[..5], [Ok(()), Ok(()), Ok(()), Ok(()), Err(25.5)]);
        assert_eq!(out[5], Err(15.0));
        assert_eq!(out[6..], [Ok(()), Err(24.5), Ok(()), Err(25.0)]);
    }

    #[test]
    fn retry_after_is_never_early() {
        let w = SlidingWindow::new(3, Duration::from_secs(10));
        for start in [0.0, 3.3, 9.9] {
            let mut state = None;
            let mut now = (start * S as f64) as u64;
            for _ in 0..20 {
                match w.decide(state, now, 1) {
                    Verdict::Admit { state: counts, .. } => state = Some(w.stored(counts, now)),
                    Verdict::Reject { retry_after, .. } => {
                        now += retry_after;
                        assert!(
                            matches!(w.decide(state, now, 1), Verdict::Admit { .. }),
                            "not admitted at Retry-After"
                        );
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;
    use crate::limit::schedule::*;

    proptest! {
        /// Each aligned window admits at most `limit`; any interval of a window's length
        /// fewer than `2 * limit`.
        #[test]
        fn windows_admit_at_most_limit_and_any_window_length_less_than_twice(
            limit in 1u64..6,
            window_ms in 1u64..1000,
            gaps in proptest::collection::vec(0u64..400, 1..150),
        ) {
            let window = window_ms * 1_000_000;
            let w = SlidingWindow::new(limit, Duration::from_nanos(window));
            let mut state = None;
            let admitted: Vec<u64> = arrivals(&gaps, window)
                .filter(|&now| match w.decide(state, now, 1) {
                    Verdict::Admit { state: counts, .. } => { state = Some(w.stored(counts, now)); true }
                    Verdict::Reject { .. } => false,
                })
                .collect();
            prop_assert!(most_in_aligned(&admitted, window) <= limit);
            prop_assert!(most_within(&admitted, window) < 2 * limit);
        }
    }
}
