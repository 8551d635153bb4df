//! A limit's algorithm paired with the table of its keys' state, and the same pair
//! locked for one key: the one place that knows which state each algorithm keeps.

use std::borrow::Cow;
use std::sync::{Arc, MutexGuard};

use super::Verdict;
use super::adaptive::Ceiling;
use super::concurrency::Concurrency;
use super::fixed_window::FixedWindow;
use super::leaky_bucket::LeakyBucket;
use super::sliding_log::{LogShard, LogTable, SlidingLog};
use super::sliding_window::SlidingWindow;
use super::table::{KeyTable, Shard};
use crate::clock::Nanos;
use crate::policy::key::KeyHash;
use crate::policy::{Burst, Policy};

/// A limit's algorithm with the table of its keys' state. The table is shared with the
/// limit's previous configuration across a reload that keeps its state (`adopt`), so
/// requests still running under the old one release their slots into the same table.
pub(crate) enum Algorithm {
    LeakyBucket(LeakyBucket, Arc<KeyTable>),
    FixedWindow(FixedWindow, Arc<KeyTable>),
    SlidingWindow(SlidingWindow, Arc<KeyTable<[u64; 2]>>),
    SlidingLog(SlidingLog, Arc<LogTable>),
    /// With the ceiling it learns, if adaptive (its `max` then bounds the ceiling).
    Concurrency(Concurrency, Arc<KeyTable>, Option<Arc<Ceiling>>),
}

/// A limit's algorithm with the locked shard that holds one key. By value (or a copy
/// only when it differs): a route may decide with its own burst and delay, a tenant with
/// its own count (`Algorithm::lock_as`).
pub(crate) enum Held<'a> {
    LeakyBucket(LeakyBucket, &'a KeyTable, MutexGuard<'a, Shard>),
    FixedWindow(Cow<'a, FixedWindow>, &'a KeyTable, MutexGuard<'a, Shard>),
    SlidingWindow(SlidingWindow, &'a KeyTable<[u64; 2]>, MutexGuard<'a, Shard<[u64; 2]>>),
    SlidingLog(SlidingLog, &'a LogTable, MutexGuard<'a, LogShard>),
    Concurrency(Concurrency, &'a KeyTable, MutexGuard<'a, Shard>),
}

impl Algorithm {
    /// `wide`: a money budget's, whose fixed window counts micro-units.
    pub fn new(policy: &Policy, max_keys: usize, wide: bool) -> Self {
        match policy {
            &Policy::Rate { rate, burst, delay } => {
                Algorithm::LeakyBucket(LeakyBucket::new(rate, burst, delay), Arc::new(KeyTable::new(max_keys)))
            }
            Policy::FixedWindow { limit, window } => {
                Algorithm::FixedWindow(FixedWindow::new(*limit, window, wide), Arc::new(KeyTable::new(max_keys)))
            }
            &Policy::SlidingWindow { limit, window } => {
                Algorithm::SlidingWindow(SlidingWindow::new(limit, window), Arc::new(KeyTable::new(max_keys)))
            }
            &Policy::SlidingLog { limit, window } => {
                Algorithm::SlidingLog(SlidingLog::new(limit, window), Arc::new(LogTable::new(max_keys)))
            }
            &Policy::Concurrency { max, retry_after, adaptive } => Algorithm::Concurrency(
                Concurrency::new(max, retry_after),
                Arc::new(KeyTable::new(max_keys)),
                adaptive.map(|adaptive| Arc::new(Ceiling::new(adaptive, max))),
            ),
        }
    }

    /// Takes over the key table of `old`, the same limit's algorithm in the configuration
    /// being replaced, when its states mean the same here; true if it did. A leaky
    /// bucket's state is the instant its bucket drains, whatever the rate (so GCRA, the
    /// token bucket and the minimum interval share it); a concurrency table counts
    /// requests in flight; a window's state is only meaningful for the same window.
    pub fn adopt(&mut self, old: &Algorithm) -> bool {
        match (self, old) {
            (Algorithm::LeakyBucket(_, t), Algorithm::LeakyBucket(_, o)) => *t = Arc::clone(o),
            (Algorithm::Concurrency(_, t, c), Algorithm::Concurrency(_, o, learned)) => {
                *t = Arc::clone(o);
                // What the ceiling learned is kept while it learns within the same bounds.
                if let (Some(c), Some(learned)) = (c, learned)
                    && learned.same(c.min, c.max, c.window)
                {
                    *c = Arc::clone(learned);
                }
            }
            (Algorithm::FixedWindow(a, t), Algorithm::FixedWindow(b, o)) if a.same_windows(b) => *t = Arc::clone(o),
            (Algorithm::SlidingWindow(a, t), Algorithm::SlidingWindow(b, o)) if a.window() == b.window() => {
                *t = Arc::clone(o)
            }
            (Algorithm::SlidingLog(a, t), Algorithm::SlidingLog(b, o)) if a.window() == b.window() => {
                *t = Arc::clone(o)
            }
            _ => return false,
        }
        true
    }

    /// What a key's state means in this algorithm, in words (`snapshot::definition`):
    /// two algorithms with the same meaning read each other's states, as `adopt` judges.
    pub fn meaning(&self) -> String {
        match self {
            Algorithm::LeakyBucket(..) => "leaky_bucket".to_owned(),
            Algorithm::FixedWindow(a, _) => format!("fixed_window {}", a.windows()),
            Algorithm::SlidingWindow(a, _) => format!("sliding_window {}ns", a.window()),
            Algorithm::SlidingLog(a, _) => format!("sliding_log {}ns", a.window()),
            Algorithm::Concurrency(..) => "concurrency".to_owned(),
        }
    }

    #[inline]
    pub fn lock(&self, key: KeyHash) -> Held<'_> {
        self.lock_as(key, None, None)
    }

    /// `lock`, deciding with `burst` in place of the limit's own burst and delay (a
    /// route's own, on the limit's one state; only a leaky bucket is given one), and with
    /// `count` in place of its count (a tenant's, `limit_from`: a rate's requests per its
    /// interval, a window's limit, a concurrency limit's requests in flight).
    #[inline]
    pub fn lock_as(&self, KeyHash(key): KeyHash, burst: Option<Burst>, count: Option<u64>) -> Held<'_> {
        match self {
            Algorithm::LeakyBucket(a, t) => {
                let a = count.map_or(*a, |n| a.with_count(n));
                Held::LeakyBucket(burst.map_or(a, |b| a.with(b)), t, t.lock(key))
            }
            Algorithm::FixedWindow(a, t) => {
                let a = count.map_or(Cow::Borrowed(a), |n| Cow::Owned(a.with_limit(n)));
                Held::FixedWindow(a, t, t.lock(key))
            }
            Algorithm::SlidingWindow(a, t) => {
                Held::SlidingWindow(count.map_or(*a, |n| a.with_limit(n)), t, t.lock(key))
            }
            Algorithm::SlidingLog(a, t) => Held::SlidingLog(count.map_or(*a, |n| a.with_limit(n)), t, t.lock(key)),
            Algorithm::Concurrency(a, t, ceiling) => {
                let max = count.or_else(|| ceiling.as_ref().map(|c| c.get()));
                Held::Concurrency(max.map_or(*a, |n| a.with_max(n)), t, t.lock(key))
            }
        }
    }

    pub fn keys(&self) -> usize {
        match self {
            Algorithm::LeakyBucket(_, t) | Algorithm::FixedWindow(_, t) | Algorithm::Concurrency(_, t, _) => t.keys(),
            Algorithm::SlidingWindow(_, t) => t.keys(),
            Algorithm::SlidingLog(_, t) => t.keys(),
        }
    }

    pub fn evictions(&self) -> u64 {
        match self {
            Algorithm::LeakyBucket(_, t) | Algorithm::FixedWindow(_, t) | Algorithm::Concurrency(_, t, _) => {
                t.evictions()
            }
            Algorithm::SlidingWindow(_, t) => t.evictions(),
            Algorithm::SlidingLog(_, t) => t.evictions(),
        }
    }
}

impl Held<'_> {
    #[inline]
    /// Decides a request of `cost` units; a concurrency slot is one per request.
    pub fn decide(&self, KeyHash(key): KeyHash, Nanos(now): Nanos, cost: u64) -> Verdict {
        match self {
            Held::LeakyBucket(a, _, shard) => a.decide(shard.get(key), now, cost),
            Held::FixedWindow(a, _, shard) => a.decide(shard.get(key), now, cost),
            Held::SlidingWindow(a, _, shard) => a.decide(shard.get(key), now, cost),
            Held::SlidingLog(a, _, shard) => a.decide(shard.get(key), now, cost),
            Held::Concurrency(a, _, shard) => a.decide(shard.get(key), shard.is_full()),
        }
    }

    /// Whether `key` holds slots here (a concurrency limit's; other algorithms: false).
    pub fn holds(&self, KeyHash(key): KeyHash) -> bool {
        matches!(self, Held::Concurrency(_, _, shard) if shard.get(key).is_some())
    }

    /// Where `key` stands at `now`, nothing taken: the units a request could still have,
    /// and until the full quota is back (ns). What a window that admitted a request some
    /// other limit refused tells the client: the request did not count.
    pub fn stands(&self, KeyHash(key): KeyHash, Nanos(now): Nanos) -> (u64, u64) {
        match self {
            Held::LeakyBucket(a, _, shard) => a.stands(shard.get(key), now),
            Held::FixedWindow(a, _, shard) => a.stands(shard.get(key), now),
            Held::SlidingWindow(a, _, shard) => a.stands(shard.get(key), now),
            Held::SlidingLog(a, _, shard) => a.stands(shard.get(key), now),
            Held::Concurrency(a, _, shard) => a.stands(shard.get(key)),
        }
    }

    /// Records that `key` was refused at `now`: it ranks as recently used when room is
    /// made, while its state, and so every decision, stays as it was.
    pub fn refuse(&mut self, KeyHash(key): KeyHash, Nanos(now): Nanos) {
        match self {
            Held::LeakyBucket(_, _, shard) | Held::FixedWindow(_, _, shard) | Held::Concurrency(_, _, shard) => {
                shard.refuse(key, now)
            }
            Held::SlidingWindow(_, _, shard) => shard.refuse(key, now),
            Held::SlidingLog(_, _, shard) => shard.refuse(key, now),
        }
    }

    /// Forgets `key`: its next request is treated as a fresh key's (the admin API's reset).
    pub fn forget(&mut self, KeyHash(key): KeyHash) {
        match self {
            Held::LeakyBucket(_, _, shard) | Held::FixedWindow(_, _, shard) | Held::Concurrency(_, _, shard) => {
                shard.remove(key)
            }
            Held::SlidingWindow(_, _, shard) => shard.remove(key),
            Held::SlidingLog(_, _, shard) => shard.remove(key),
        }
    }

    /// Sets `key` to have `units` left at `now`, as a global limit's local twin heard
    /// from Redis. The leaky bucket family and fixed windows (aligned alike everywhere)
    /// follow what they hear; the sliding windows' and concurrency twins keep their own
    /// count, their share of the limit.
    pub fn hear(&mut self, KeyHash(key): KeyHash, units: u64, Nanos(now): Nanos) {
        match self {
            Held::LeakyBucket(a, t, shard) => t.put(shard, key, a.holding(units, now), |s| a.is_idle(s, now), |s| s),
            Held::FixedWindow(a, t, shard) => t.put(shard, key, a.holding(units, now), |s| a.is_idle(s, now), |s| s),
            Held::SlidingWindow(..) | Held::SlidingLog(..) | Held::Concurrency(..) => {}
        }
    }

    /// Takes back an admission of `cost` units made at `at` (a concurrency slot is given
    /// back by its permit instead).
    pub fn refund(&mut self, KeyHash(key): KeyHash, cost: u64, Nanos(at): Nanos) {
        match self {
            Held::LeakyBucket(a, _, shard) => {
                if let Some(state) = shard.get(key) {
                    shard.replace(key, a.refund(state, cost));
                }
            }
            Held::FixedWindow(a, _, shard) => {
                if let Some(state) = shard.get(key) {
                    shard.replace(key, a.refund(state, cost, at));
                }
            }
            Held::SlidingWindow(a, _, shard) => {
                if let Some(state) = shard.get(key) {
                    shard.replace(key, a.refund(state, cost, at));
                }
            }
            Held::SlidingLog(_, _, shard) => shard.refund(key, cost, at),
            Held::Concurrency(..) => {}
        }
    }

    /// Debits `units` more from `key` at `now`, past its quota if need be (`charge:`,
    /// which only the leaky-bucket family and fixed windows take).
    pub fn charge(&mut self, KeyHash(key): KeyHash, units: u64, Nanos(now): Nanos) {
        match self {
            Held::LeakyBucket(a, t, shard) => {
                let state = a.charge(shard.get(key), units, now);
                t.put(shard, key, state, |s| a.is_idle(s, now), |s| s);
            }
            Held::FixedWindow(a, t, shard) => {
                let state = a.charge(shard.get(key), units, now);
                t.put(shard, key, state, |s| a.is_idle(s, now), |s| s);
            }
            Held::SlidingWindow(..) | Held::SlidingLog(..) | Held::Concurrency(..) => {}
        }
    }

    /// Stores an admission's `state` for `key`. When the shard is full it forgets first
    /// the keys whose state equals a fresh key's, then the lowest ranked: for the leaky
    /// bucket the soonest to drain, for the windows the oldest window, so the keys closest
    /// to fresh go. Concurrency tables never evict: a new key is rejected when they are
    /// full, before this.
    #[inline]
    pub fn store(&mut self, KeyHash(key): KeyHash, state: u64, Nanos(now): Nanos, cost: u64) {
        match self {
            Held::LeakyBucket(a, t, shard) => t.put(shard, key, state, |s| a.is_idle(s, now), |s| s),
            Held::FixedWindow(a, t, shard) => t.put(shard, key, state, |s| a.is_idle(s, now), |s| s),
            Held::SlidingWindow(a, t, shard) => {
                t.put(shard, key, a.stored(state, now), |s| a.is_idle(s, now), |[index, _]| index);
            }
            Held::SlidingLog(a, t, shard) => t.record(shard, a, key, now, cost),
            Held::Concurrency(_, t, shard) => t.put(shard, key, state, |s| s == 0, |s| s),
        }
    }
}
