//! Fixed window: at most `limit` requests per key in each window, windows aligned to
//! the Unix epoch (`[k·window, (k+1)·window)`), so every instance, and every restart,
//! agrees on where a window starts.
//!
//! The cheapest algorithm, and the coarsest: a client can spend `limit` at the end of
//! one window and `limit` again at the start of the next, `2·limit` within a moment
//! around the boundary. Choose it for long windows (a daily quota) where that is
//! acceptable.
//!
//! State: the window's index (low 40 bits: windows of at least 1 ms repeat an index
//! only after 34 years) and the count in it (24 bits), in one `u64`.

use std::time::Duration;

use super::Verdict;

const COUNT_BITS: u32 = 24;
const INDEX_MASK: u64 = (1 << 40) - 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedWindow {
    limit: u64,
    window: u64,
}

fn pack(index: u64, count: u64) -> u64 {
    ((index & INDEX_MASK) << COUNT_BITS) | count
}

impl FixedWindow {
    /// `limit` below 2^24, `window` at least 1 ms (checked by the config).
    pub fn new(limit: u64, window: Duration) -> Self {
        FixedWindow { limit, window: u64::try_from(window.as_nanos()).unwrap_or(u64::MAX).max(1) }
    }

    /// The window's length, ns.
    pub fn window(&self) -> u64 {
        self.window
    }

    /// The count this window so far for `state` at `now` (ns since the Unix epoch).
    fn count(&self, state: Option<u64>, now: u64) -> u64 {
        let index = now / self.window;
        match state {
            Some(s) if s >> COUNT_BITS == index & INDEX_MASK => s & ((1 << COUNT_BITS) - 1),
            _ => 0,
        }
    }

    /// Decides a request of `cost` (≥ 1) units.
    pub fn decide(&self, state: Option<u64>, now: u64, cost: u64) -> Verdict {
        let count = self.count(state, now);
        let index = now / self.window;
        let reset = self.reset(now);
        if count.saturating_add(cost) > self.limit {
            let remaining = self.limit.saturating_sub(count);
            return Verdict::Reject { retry_after: reset, remaining, reset, excess: count as f64 };
        }
        let count = count + cost;
        Verdict::Admit {
            state: pack(index, count),
            wait: 0,
            remaining: self.limit - count,
            reset,
            excess: count as f64,
        }
    }

    /// Where a key in `state` stands at `now`, nothing taken: the units left in the
    /// current window, and its end.
    pub fn stands(&self, state: Option<u64>, now: u64) -> (u64, u64) {
        (self.limit.saturating_sub(self.count(state, now)), self.reset(now))
    }

    /// Until the window of `now` ends.
    fn reset(&self, now: u64) -> u64 {
        (now / self.window + 1) * self.window - now
    }

    /// Takes back an admission of `cost` units made at `at`, if its window still runs.
    pub fn refund(&self, state: u64, cost: u64, at: u64) -> u64 {
        if state >> COUNT_BITS == (at / self.window) & INDEX_MASK {
            let count = state & ((1 << COUNT_BITS) - 1);
            (state & !((1 << COUNT_BITS) - 1)) | count.saturating_sub(cost)
        } else {
            state
        }
    }

    /// A count from an earlier window is a fresh key's.
    /// The state of a key with `units` left in the window of `now`.
    pub fn holding(&self, units: u64, now: u64) -> u64 {
        pack(now / self.window, self.limit - units.min(self.limit))
    }

    pub fn is_idle(&self, state: u64, now: u64) -> bool {
        self.count(Some(state), now) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn replay(w: &FixedWindow, arrivals_s: &[f64]) -> Vec<bool> {
        let mut state = None;
        arrivals_s
            .iter()
            .map(|&t| match w.decide(state, (t * S as f64) as u64, 1) {
                Verdict::Admit { state: s, .. } => {
                    state = Some(s);
                    true
                }
                Verdict::Reject { .. } => false,
            })
            .collect()
    }

    #[test]
    fn a_key_holding_n_units_admits_n_until_the_window_ends() {
        let w = FixedWindow::new(5, Duration::from_secs(10));
        let state = w.holding(2, 12 * S);
        assert!(matches!(w.decide(Some(state), 13 * S, 2), Verdict::Admit { remaining: 0, .. }));
        assert!(matches!(w.decide(Some(state), 13 * S, 3), Verdict::Reject { remaining: 2, .. }));
        assert!(matches!(w.decide(Some(state), 20 * S, 5), Verdict::Admit { .. }), "a new window");
        assert!(matches!(w.decide(Some(w.holding(9, 12 * S)), 12 * S, 5), Verdict::Admit { .. }));
    }

    #[test]
    fn limit_per_epoch_aligned_window_and_the_double_burst_at_its_edge() {
        let w = FixedWindow::new(3, Duration::from_secs(60));
        // Window [60, 120): three pass, the fourth waits for 120. At 119.9 and 120.0 the
        // client gets 3 + 3 within a tenth of a second: the documented boundary burst.
        let out = replay(&w, &[60.0, 61.0, 62.0, 63.0, 119.9, 120.0, 120.0, 120.0, 120.1]);
        assert_eq!(out, [true, true, true, false, false, true, true, true, false]);
    }

    #[test]
    fn rejection_says_when_the_window_ends() {
        let w = FixedWindow::new(1, Duration::from_secs(10));
        let Verdict::Admit { state, remaining: 0, reset, .. } = w.decide(None, 12 * S, 1) else { panic!() };
        assert_eq!(reset, 8 * S);
        assert_eq!(
            w.decide(Some(state), 15 * S, 1),
            Verdict::Reject { retry_after: 5 * S, remaining: 0, reset: 5 * S, excess: 1.0 }
        );
        assert!(w.is_idle(state, 20 * S) && !w.is_idle(state, 19 * S));
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;
    use crate::limit::schedule::*;

    proptest! {
        /// Each epoch-aligned window admits at most `limit`; any interval of one window's
        /// length, at most `2 * limit` (the boundary burst, never more).
        #[test]
        fn windows_admit_at_most_limit_and_any_window_length_at_most_twice(
            limit in 1u64..6,
            window_ms in 1u64..1000,
            gaps in proptest::collection::vec(0u64..400, 1..150),
        ) {
            let window = window_ms * 1_000_000;
            let w = FixedWindow::new(limit, Duration::from_nanos(window));
            let mut state = None;
            let admitted: Vec<u64> = arrivals(&gaps, window)
                .filter(|&now| match w.decide(state, now, 1) {
                    Verdict::Admit { state: s, .. } => { state = Some(s); true }
                    Verdict::Reject { .. } => false,
                })
                .collect();
            prop_assert!(most_in_aligned(&admitted, window) <= limit);
            prop_assert!(most_within(&admitted, window) <= 2 * limit);
        }
    }
}
