//! Sliding window log: exact. A key keeps the instant of each request it was admitted
//! for within the last `window`; a request is admitted while fewer than `limit` remain.
//! No interval of one window's length ever holds more than `limit` admissions.
//!
//! The cost is memory: up to `limit` timestamps (8 bytes each) per key, so choose it for
//! small limits where exactness matters (logins, expensive endpoints), and a counter
//! elsewhere. The log of each key lives in its own table (`LogTable`), bounded to
//! `max_keys` keys like the others: a full shard first forgets keys whose log has
//! expired (lossless), then the eighth whose newest request is oldest.

use std::collections::{HashMap, VecDeque};
use std::sync::MutexGuard;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::Verdict;
use super::shards::Shards;
use super::table::Refusals;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlidingLog {
    limit: u64,
    window: u64,
}

pub struct LogShard {
    logs: HashMap<u64, VecDeque<u64>>,
    cap: usize,
    refused: Refusals,
}

pub struct LogTable {
    shards: Shards<LogShard>,
    evictions: AtomicU64,
}

impl SlidingLog {
    /// `limit` at most 65 536 (checked by the config).
    pub fn new(limit: u64, window: Duration) -> Self {
        SlidingLog { limit, window: u64::try_from(window.as_nanos()).unwrap_or(u64::MAX).max(1) }
    }

    /// The most admissions a window holds: a key's log is never longer.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// This window with `limit` in place of its own (a tenant's, `limit_from`): a key's
    /// state (counts, or a log of instants) means the same under any limit.
    pub fn with_limit(&self, limit: u64) -> Self {
        SlidingLog { limit, ..*self }
    }

    /// The window's length, ns.
    pub fn window(&self) -> u64 {
        self.window
    }

    /// Index of the first timestamp still inside the window at `now`.
    fn first_live(&self, log: &VecDeque<u64>, now: u64) -> usize {
        log.partition_point(|&t| t.saturating_add(self.window) <= now)
    }

    /// Where a key with `log` (oldest first) stands at `now`, nothing taken: the units
    /// left in the window, and until its newest entry expires.
    pub fn stands(&self, log: Option<&VecDeque<u64>>, now: u64) -> (u64, u64) {
        let Some(log) = log else { return (self.limit, 0) };
        let live = (log.len() - self.first_live(log, now)) as u64;
        let reset = log.back().map_or(0, |&newest| (newest + self.window).saturating_sub(now));
        (self.limit.saturating_sub(live), reset)
    }

    /// Decides a request of `cost` units at `now` from `log` (oldest first).
    pub fn decide(&self, log: Option<&VecDeque<u64>>, now: u64, cost: u64) -> Verdict {
        let empty = VecDeque::new();
        let log = log.unwrap_or(&empty);
        let first = self.first_live(log, now);
        let live = (log.len() - first) as u64;
        if live.saturating_add(cost) > self.limit {
            let (remaining, reset) = self.stands(Some(log), now);
            // Enough of the oldest live requests must expire to make room for `cost`.
            let expire =
                first.saturating_add(usize::try_from(live.saturating_add(cost) - self.limit - 1).unwrap_or(usize::MAX));
            let retry_after = log.get(expire).map_or(self.window, |&t| t + self.window - now);
            return Verdict::Reject { retry_after, remaining, reset, excess: live as f64 };
        }
        let remaining = self.limit - live - cost;
        Verdict::Admit { state: 0, wait: 0, remaining, reset: self.window, excess: (live + cost) as f64 }
    }
}

impl LogTable {
    pub fn new(max_keys: usize) -> Self {
        let shards = Shards::new(max_keys, |cap| LogShard { logs: HashMap::new(), cap, refused: Refusals::default() });
        LogTable { shards, evictions: AtomicU64::new(0) }
    }

    pub fn lock(&self, key: u64) -> MutexGuard<'_, LogShard> {
        self.shards.lock(key)
    }

    /// Keys held now (takes every shard's lock: for tests and metrics).
    pub fn keys(&self) -> usize {
        self.shards.each().map(|s| s.logs.len()).sum()
    }

    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Calls `f` with every stored key and log, one shard locked at a time (for the
    /// state directory, not the request path).
    pub fn each(&self, mut f: impl FnMut(u64, &VecDeque<u64>)) {
        for shard in self.shards.each() {
            shard.logs.iter().for_each(|(&key, log)| f(key, log));
        }
    }

    /// Puts back `key`'s `log` (oldest first) as read from the state directory, its
    /// entries still in the window at `now`; false if none is.
    pub fn restore(&self, algorithm: &SlidingLog, key: u64, log: &VecDeque<u64>, now: u64) -> bool {
        let mut live: Vec<u64> = log.iter().copied().filter(|&at| at.saturating_add(algorithm.window) > now).collect();
        // Oldest first, as `record` keeps it, and never more than `limit` (the newest).
        live.sort_unstable();
        let live: VecDeque<u64> = live.split_off(live.len().saturating_sub(algorithm.limit as usize)).into();
        if live.is_empty() {
            return false;
        }
        let mut shard = self.lock(key);
        if !shard.logs.contains_key(&key) && shard.logs.len() >= shard.cap {
            let evicted = shard.make_room(algorithm, now);
            self.evictions.fetch_add(evicted, Ordering::Relaxed);
        }
        shard.logs.insert(key, live);
        true
    }

    /// Records an admission of `cost` units at `now` for `key`.
    pub fn record(&self, shard: &mut LogShard, algorithm: &SlidingLog, key: u64, now: u64, cost: u64) {
        if !shard.logs.contains_key(&key) && shard.logs.len() >= shard.cap {
            let evicted = shard.make_room(algorithm, now);
            self.evictions.fetch_add(evicted, Ordering::Relaxed);
        }
        let log = shard.logs.entry(key).or_default();
        let first = algorithm.first_live(log, now);
        log.drain(..first);
        log.extend(std::iter::repeat_n(now, cost as usize));
    }
}

impl LogShard {
    /// Takes back an admission of `cost` units made at `at`.
    pub fn refund(&mut self, key: u64, cost: u64, at: u64) {
        if let Some(log) = self.logs.get_mut(&key) {
            for _ in 0..cost {
                match log.iter().rposition(|&t| t == at) {
                    Some(i) => drop(log.remove(i)),
                    None => break,
                }
            }
        }
    }

    /// Records that stored `key` was refused at `now` (see `Refusals`).
    pub fn refuse(&mut self, key: u64, now: u64) {
        if self.logs.contains_key(&key) {
            self.refused.note(key, now, self.cap);
        }
    }

    pub fn remove(&mut self, key: u64) {
        self.logs.remove(&key);
    }

    pub fn get(&self, key: u64) -> Option<&VecDeque<u64>> {
        self.logs.get(&key)
    }

    /// Frees at least one key; returns how many live logs were dropped.
    fn make_room(&mut self, algorithm: &SlidingLog, now: u64) -> u64 {
        self.logs.retain(|_, log| log.back().is_some_and(|&newest| newest + algorithm.window > now));
        let target = self.cap - self.cap.div_ceil(8);
        if self.logs.len() <= target {
            return 0;
        }
        // Refused keys last (see `Refusals`), then by newest request.
        let refused = &self.refused;
        let rank = |key: u64, log: &VecDeque<u64>| refused.rank(key, log.back().copied().unwrap_or(0));
        let mut ranks: Vec<u64> = self.logs.iter().map(|(&key, log)| rank(key, log)).collect();
        let excess = self.logs.len() - target;
        let (_, &mut cutoff, _) = ranks.select_nth_unstable(excess - 1);
        let before = self.logs.len();
        self.logs.retain(|&key, log| rank(key, log) > cutoff);
        let logs = &self.logs;
        self.refused.retain(|key| logs.contains_key(&key));
        (before - self.logs.len()) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn exactly_limit_per_sliding_window_with_exact_retry_after() {
        let alg = SlidingLog::new(3, Duration::from_secs(10));
        let table = LogTable::new(16);
        let mut shard = table.lock(1);
        let mut at = |t: u64| {
            let verdict = alg.decide(shard.get(1), t * S, 1);
            if let Verdict::Admit { .. } = verdict {
                table.record(&mut shard, &alg, 1, t * S, 1);
            }
            verdict
        };
        for t in [0, 4, 8] {
            assert!(matches!(at(t), Verdict::Admit { .. }));
        }
        // Full until the request of t = 0 leaves the window at t = 10.
        assert_eq!(at(9), Verdict::Reject { retry_after: S, remaining: 0, reset: 9 * S, excess: 3.0 });
        assert!(matches!(at(10), Verdict::Admit { remaining: 0, .. }));
        // Now 4, 8, 10 are live: the next room opens at 14.
        assert!(matches!(at(13), Verdict::Reject { retry_after: 1_000_000_000, .. }));
    }

    #[test]
    fn a_full_table_forgets_expired_logs_first_then_the_stalest() {
        let alg = SlidingLog::new(2, Duration::from_secs(10));
        let table = LogTable::new(8);
        let mut shard = table.lock(0);
        for key in 0..8 {
            table.record(&mut shard, &alg, key, key * S, 1);
        }
        // At t = 15, keys 0..=5 have expired: room is made without loss.
        table.record(&mut shard, &alg, 100, 15 * S, 1);
        assert_eq!(table.evictions(), 0);
        assert_eq!(shard.logs.len(), 3);
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;
    use crate::limit::schedule::*;

    proptest! {
        /// No interval of one window's length holds more than `limit` admissions.
        #[test]
        fn never_more_than_limit_in_any_window(
            limit in 1u64..6,
            window_ms in 1u64..1000,
            gaps in proptest::collection::vec(0u64..400, 1..150),
        ) {
            let window = window_ms * 1_000_000;
            let alg = SlidingLog::new(limit, Duration::from_nanos(window));
            let table = LogTable::new(4);
            let mut shard = table.lock(7);
            let admitted: Vec<u64> = arrivals(&gaps, window)
                .filter(|&now| match alg.decide(shard.get(7), now, 1) {
                    Verdict::Admit { .. } => { table.record(&mut shard, &alg, 7, now, 1); true }
                    Verdict::Reject { .. } => false,
                })
                .collect();
            prop_assert!(most_within(&admitted, window) <= limit);
        }
    }
}
