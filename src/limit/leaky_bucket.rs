//! nginx `limit_req`, exactly: the per-key leaky bucket with burst and delay.
//!
//! nginx keeps `excess` (in requests) and `last` per key and on each request computes
//! `excess' = max(0, excess - rate * elapsed + 1)`; a fresh key stores `excess = 0`. Note
//! where the clamp sits: a request arriving exactly one period after the last one finds
//! `excess' = 0`, so `burst: 0` admits a steady stream at the rate (the recorded nginx
//! schedules `01_steady_under_rate` and `02_too_fast_no_burst` confirm this form).
//! If `excess' > burst` the request is rejected and the state is left alone; otherwise
//! it is stored and the request waits `(excess' - delay) / rate` when positive.
//!
//! We store one number instead of two: the instant `tat = last + excess / rate` at
//! which the bucket is empty, in nanoseconds on the limiter clock. Then
//! `excess' / rate = max(now, tat + period) - now`, every quantity is a time, and the
//! arithmetic is exact integers, where nginx rounds the rate to milli-requests per
//! second and time to milliseconds.
//!
//! governor implements the same GCRA family, but it commits inside its `check`, so it
//! cannot check several limits first and then commit all or none, has no "admit after a
//! delay" outcome, and its keyed store grows without bound; hence this small type.

use super::Verdict;
use crate::policy::{Burst, Rate};

/// Per-key state: the instant, in ns, at which the bucket drains empty.
pub type Tat = u64;

/// The most drain one charge (`charge:`) adds to a key: 100 days, local and global alike
/// (Redis's arithmetic is exact below 2^53 ns, 104 days).
pub const MAX_DEBT_NS: u64 = 100 * 86_400 * 1_000_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeakyBucket {
    /// Emission interval `1 / rate`, ns.
    period: u64,
    /// `burst * period`: how far ahead of now `tat` may run, ns.
    burst: u64,
    /// `delay * period`: how much excess passes without waiting, ns.
    delay: u64,
    /// The rate's `per` (its count's interval), ns: a tenant's count is over it.
    per: u64,
}

impl LeakyBucket {
    pub fn new(rate: Rate, burst: u64, delay: u64) -> Self {
        let period = rate.period_ns();
        let per = u64::try_from(rate.per.as_nanos()).unwrap_or(u64::MAX);
        LeakyBucket { period, burst: burst.saturating_mul(period), delay: delay.saturating_mul(period), per }
    }

    /// This bucket at `count` requests per its rate's interval in place of its own count
    /// (a tenant's, `limit_from`), its burst and delay the same number of requests. The
    /// state (`tat`) means the same at any rate, so a key's tenant count may change
    /// between its requests.
    pub fn with_count(&self, count: u64) -> Self {
        let count = u128::from(count.max(1));
        let period = u64::try_from((u128::from(self.per) + count / 2) / count).unwrap_or(u64::MAX).max(1);
        let (burst, delay) = (self.burst / self.period.max(1), self.delay / self.period.max(1));
        LeakyBucket { period, burst: burst.saturating_mul(period), delay: delay.saturating_mul(period), per: self.per }
    }

    /// This bucket with `burst` in place of its burst and delay: the same rate, so the
    /// same state (`tat`) means the same here (nginx: one zone, several `limit_req` lines).
    pub fn with(&self, burst: Burst) -> Self {
        let period = self.period;
        let (burst, delay) = (burst.burst.saturating_mul(period), burst.delay.saturating_mul(period));
        LeakyBucket { period, burst, delay, per: self.per }
    }

    /// Decides a request of `cost` (≥ 1) units: as `cost` requests at the same instant,
    /// admitted all together or not at all.
    pub fn decide(&self, state: Option<Tat>, now: u64, cost: u64) -> Verdict {
        let first = match state {
            None => now,
            Some(tat) => now.max(tat.saturating_add(self.period)),
        };
        let tat = first.saturating_add((cost - 1).saturating_mul(self.period));
        let excess = tat - now;
        // nginx's `excess'`, in requests, for log lines.
        let requests = excess as f64 / self.period as f64;
        if excess > self.burst {
            // Admitted once `tat + cost·period - now' <= burst`.
            let (remaining, reset) = self.stands(state, now);
            Verdict::Reject { retry_after: excess - self.burst, remaining, reset, excess: requests }
        } else {
            Verdict::Admit {
                state: tat,
                wait: excess.saturating_sub(self.delay),
                remaining: (self.burst - excess) / self.period,
                // The full burst is back one period after the bucket drains at `tat`.
                reset: excess.saturating_add(self.period),
                excess: requests,
            }
        }
    }

    /// Where a key in `state` stands at `now`, nothing taken: the units that fit now
    /// (those whose single-unit excess stays within burst), and when the bucket, left as
    /// it is, holds its full burst again (one period after it drains, as redis-cell's
    /// `reset_after`).
    pub fn stands(&self, state: Option<Tat>, now: u64) -> (u64, u64) {
        let Some(tat) = state else { return (self.capacity(), 0) };
        let one = tat.saturating_add(self.period).saturating_sub(now);
        let remaining = if one > self.burst { 0 } else { (self.burst - one) / self.period + 1 };
        (remaining, one)
    }

    /// The largest cost this bucket can ever admit at once: `burst + 1`.
    pub fn capacity(&self) -> u64 {
        self.burst / self.period + 1
    }

    /// The state of a key with `units` left at `now` (at most `capacity`): the next
    /// `units` one-unit requests pass at once, then one per period.
    pub fn holding(&self, units: u64, now: u64) -> Tat {
        let units = units.min(self.capacity());
        now.saturating_add(self.burst).saturating_sub(units.saturating_mul(self.period))
    }

    /// Takes back an admission of `cost` units: the bucket drains that much sooner.
    pub fn refund(&self, tat: Tat, cost: u64) -> Tat {
        tat.saturating_sub(cost.saturating_mul(self.period))
    }

    /// Debits `units` more at `now` (what a response reported it cost): the bucket
    /// drains that much later, past its burst if need be. Such a debt is paid by the
    /// requests refused until the bucket has drained back within its burst, and their
    /// `Retry-After` says when.
    pub fn charge(&self, state: Option<Tat>, units: u64, now: u64) -> Tat {
        // A key idle since (or forgotten) starts from a fresh key's state.
        let from = now.saturating_sub(self.period);
        // One charge adds at most `MAX_DEBT_NS` of drain, as Redis's script is given
        // (`store::script`): a huge report refuses the key for 100 days, locally and
        // globally alike, not until the clock's end here and 100 days there.
        let units = units.min(MAX_DEBT_NS / self.period.max(1));
        state.map_or(from, |tat| tat.max(from)).saturating_add(units.saturating_mul(self.period))
    }

    /// True when a stored key behaves exactly like a fresh one from `now` on, so
    /// forgetting it loses nothing.
    pub fn is_idle(&self, tat: Tat, now: u64) -> bool {
        tat.saturating_add(self.period) <= now
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::units::parse_rate;

    const MS: u64 = 1_000_000;

    fn bucket(rate: &str, burst: u64, delay: u64) -> LeakyBucket {
        LeakyBucket::new(parse_rate(rate).unwrap(), burst, delay)
    }

    /// Feeds arrivals (ms) to one key; returns each outcome as `Ok(wait_ms)` or `Err(retry_ms)`.
    fn replay(b: &LeakyBucket, arrivals: &[u64]) -> Vec<Result<u64, u64>> {
        let mut state = None;
        arrivals
            .iter()
            .map(|&t| match b.decide(state, t * MS, 1) {
                Verdict::Admit { state: tat, wait, .. } => {
                    state = Some(tat);
                    Ok(wait / MS)
                }
                Verdict::Reject { retry_after, .. } => Err(retry_after / MS),
            })
            .collect()
    }

    #[test]
    fn burst_n_nodelay_admits_n_plus_one_at_once_then_one_per_period() {
        // 2r/s, burst 5, nodelay: six at t=0 pass, the seventh waits 500 ms.
        let b = bucket("2r/s", 5, 5);
        let out = replay(&b, &[0, 0, 0, 0, 0, 0, 0, 250, 600, 700, 1200]);
        assert_eq!(out, vec![Ok(0), Ok(0), Ok(0), Ok(0), Ok(0), Ok(0), Err(500), Err(250), Ok(0), Err(300), Ok(0)]);
    }

    #[test]
    fn zero_burst_admits_a_steady_stream_at_exactly_the_rate() {
        let b = bucket("10r/s", 0, 0);
        assert!(replay(&b, &[0, 100, 200, 300, 400]).iter().all(Result::is_ok));
        // ... and alternates when requests come every 60 ms.
        assert_eq!(replay(&b, &[0, 60, 120, 180]), vec![Ok(0), Err(40), Ok(0), Err(40)]);
    }

    #[test]
    fn default_delay_queues_every_excess_request_at_the_rate() {
        // 10r/s burst 5: one immediate, five spaced 100 ms apart, then rejections.
        let b = bucket("10r/s", 5, 0);
        let out = replay(&b, &[0; 8]);
        assert_eq!(out, vec![Ok(0), Ok(100), Ok(200), Ok(300), Ok(400), Ok(500), Err(100), Err(100)]);
    }

    #[test]
    fn delay_n_lets_n_excess_requests_through_before_queueing() {
        let b = bucket("10r/s", 6, 3);
        let out = replay(&b, &[0; 10]);
        assert_eq!(out, vec![Ok(0), Ok(0), Ok(0), Ok(0), Ok(100), Ok(200), Ok(300), Err(100), Err(100), Err(100)]);
    }

    #[test]
    fn rejection_leaves_state_untouched() {
        let b = bucket("1r/s", 0, 0);
        let Verdict::Admit { state: tat, .. } = b.decide(None, 0, 1) else { panic!("fresh key rejected") };
        // A hammering client is rejected again and again, and is admitted exactly one
        // period after its last admitted request, not after its last attempt.
        for t in [1, 10, 500, 999] {
            assert!(matches!(b.decide(Some(tat), t * MS, 1), Verdict::Reject { .. }));
        }
        assert!(matches!(b.decide(Some(tat), 1000 * MS, 1), Verdict::Admit { .. }));
    }

    #[test]
    fn rates_slower_than_nginx_can_express_are_exact() {
        // nginx stores 1r/m as 16 milli-requests/s and admits again after 62.5 s; we do after 60 s.
        let b = bucket("1r/m", 0, 0);
        assert_eq!(replay(&b, &[0, 59_999, 60_000]), vec![Ok(0), Err(1), Ok(0)]);
    }

    #[test]
    fn remaining_and_reset_describe_the_bucket_after_the_request() {
        let b = bucket("10r/s", 2, 2);
        // One request on a fresh key: the full burst is back one period later, not now.
        assert_eq!(
            b.decide(None, 0, 1),
            Verdict::Admit { state: 0, wait: 0, remaining: 2, reset: 100 * MS, excess: 0.0 }
        );
        let second = Verdict::Admit { state: 100 * MS, wait: 0, remaining: 1, reset: 200 * MS, excess: 1.0 };
        assert_eq!(b.decide(Some(0), 0, 1), second);
        let over = Verdict::Reject { retry_after: 100 * MS, remaining: 0, reset: 300 * MS, excess: 3.0 };
        assert_eq!(b.decide(Some(200 * MS), 0, 1), over);
    }

    #[test]
    fn a_costly_request_counts_as_that_many_at_once_all_or_nothing() {
        let b = bucket("10r/s", 4, 4);
        assert_eq!(b.capacity(), 5);
        let Verdict::Admit { state, remaining: 1, .. } = b.decide(None, 0, 4) else { panic!("cost 4 of 5 refused") };
        // Two more units do not fit; nothing is taken, and the refusal says one still does.
        assert_eq!(
            b.decide(Some(state), 0, 2),
            Verdict::Reject { retry_after: 100 * MS, remaining: 1, reset: 400 * MS, excess: 5.0 }
        );
        assert!(matches!(b.decide(Some(state), 0, 3), Verdict::Reject { remaining: 1, .. }));
        assert!(matches!(b.decide(Some(state), 0, 1), Verdict::Admit { remaining: 0, .. }));
        assert!(matches!(b.decide(None, 0, 6), Verdict::Reject { .. }), "more than burst + 1 never fits");
    }

    #[test]
    fn a_refund_gives_the_units_back() {
        let b = bucket("10r/s", 2, 2);
        let Verdict::Admit { state, .. } = b.decide(Some(0), 0, 2) else { panic!() };
        assert!(matches!(b.decide(Some(state), 0, 1), Verdict::Reject { .. }));
        assert!(matches!(b.decide(Some(b.refund(state, 2)), 0, 2), Verdict::Admit { .. }));
    }

    #[test]
    fn a_charge_past_the_burst_is_a_debt_paid_by_refusals_that_say_when_it_ends() {
        // 10r/s, burst 4: five units at once. A request, then a charge of 9 more.
        let b = bucket("10r/s", 4, 4);
        let Verdict::Admit { state, .. } = b.decide(None, 0, 1) else { panic!() };
        let state = b.charge(Some(state), 9, 0);
        // Ten units spent at 0: the next passes once the bucket is back within its burst,
        // at 600 ms, and a refusal before says so.
        assert_eq!(
            b.decide(Some(state), 0, 1),
            Verdict::Reject { retry_after: 600 * MS, remaining: 0, reset: 1_000 * MS, excess: 10.0 }
        );
        assert!(matches!(b.decide(Some(state), 599 * MS, 1), Verdict::Reject { retry_after, .. } if retry_after == MS));
        assert!(matches!(b.decide(Some(state), 600 * MS, 1), Verdict::Admit { .. }));
        // A key forgotten (or idle) is charged from a fresh key's state.
        assert_eq!(b.charge(None, 2, 5_000 * MS), b.charge(Some(0), 2, 5_000 * MS));
        // Five units on a fresh key: the bucket full, and one more past it.
        let t = 10_000 * MS;
        assert!(
            matches!(b.decide(Some(b.charge(None, 5, t)), t, 1), Verdict::Reject { retry_after, .. } if retry_after == 100 * MS)
        );
    }

    /// A report of 2^32 units (what a 20-digit report is charged) on a bucket draining
    /// one unit in 6 s is a debt of 100 days of drain, the most one charge adds, as it is
    /// in Redis: not the 800 years it would be, nor the clock's end where it saturates.
    #[test]
    fn one_charge_adds_at_most_100_days_of_drain() {
        let b = bucket("10r/m", 9, 9);
        let now = 1_000_000 * MS;
        let Verdict::Admit { state, .. } = b.decide(None, now, 1) else { panic!() };
        let debt = b.charge(Some(state), 1 << 32, now);
        assert_eq!(debt, state + MAX_DEBT_NS);
        let Verdict::Reject { retry_after, .. } = b.decide(Some(debt), now, 1) else { panic!() };
        assert_eq!(retry_after, MAX_DEBT_NS + 6_000 * MS - 9 * 6_000 * MS, "100 days, less the burst");
        // A charge that fits stays exact.
        assert_eq!(b.charge(Some(state), 3, now), state + 3 * 6_000 * MS);
    }

    #[test]
    fn a_key_holding_n_units_admits_n_at_once_then_one_per_period() {
        let b = bucket("10r/s", 4, 4);
        let outcomes = |state| {
            let mut state = Some(state);
            (0..4)
                .map(|_| match b.decide(state, 1_000 * MS, 1) {
                    Verdict::Admit { state: tat, .. } => {
                        state = Some(tat);
                        Ok(())
                    }
                    Verdict::Reject { retry_after, .. } => Err(retry_after / MS),
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(outcomes(b.holding(2, 1_000 * MS)), vec![Ok(()), Ok(()), Err(100), Err(100)]);
        assert_eq!(outcomes(b.holding(0, 1_000 * MS)), vec![Err(100); 4]);
        // Heard 50 ms before: half a unit more is back.
        assert_eq!(outcomes(b.holding(0, 950 * MS)), vec![Err(50); 4]);
        // More than it can hold is a fresh key.
        assert!(b.is_idle(b.holding(9, 1_000 * MS), 1_000 * MS));
    }

    #[test]
    fn idle_keys_are_those_a_fresh_key_would_match() {
        let b = bucket("10r/s", 2, 2);
        assert!(!b.is_idle(100 * MS, 150 * MS));
        assert!(b.is_idle(100 * MS, 200 * MS));
        // Idle means: deciding from the stored state and from nothing agree.
        assert_eq!(b.decide(Some(100 * MS), 200 * MS, 1), b.decide(None, 200 * MS, 1));
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;
    use crate::config::Rate;

    proptest! {
        /// In every interval [a, b] between two admitted requests, at most
        /// `burst + 1 + (b - a) / period` are admitted, whatever the arrivals and delay.
        #[test]
        fn admissions_never_exceed_burst_plus_one_plus_rate_times_t(
            period_ms in 1u64..500,
            burst in 0u64..6,
            delay_share in 0u64..=100,
            gaps in proptest::collection::vec(0u64..1500, 1..120),
        ) {
            let period = period_ms * 1_000_000;
            let b = LeakyBucket::new(Rate { count: 1, per: std::time::Duration::from_nanos(period) }, burst, burst * delay_share / 100);
            let (mut now, mut state, mut admitted) = (1_000_000_000_000u64, None, Vec::new());
            for gap in gaps {
                now += gap * period / 500;
                if let Verdict::Admit { state: s, .. } = b.decide(state, now, 1) {
                    state = Some(s);
                    admitted.push(now);
                }
            }
            for i in 0..admitted.len() {
                for j in i..admitted.len() {
                    let bound = burst + 1 + (admitted[j] - admitted[i]) / period;
                    prop_assert!((j - i + 1) as u64 <= bound, "{} admitted in {} ns", j - i + 1, admitted[j] - admitted[i]);
                }
            }
        }
    }
}
