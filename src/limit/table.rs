//! A bounded, sharded map from key hash to limiter state.
//!
//! Keys arrive already hashed (keyed SipHash, see `key`), so the map uses them as they
//! are. Each shard holds at most its share of `max_keys`. When a shard is full it first
//! forgets the keys whose state is that of a fresh key (lossless: the limiter decides
//! the same without them), and if that frees less than an eighth of the shard, it
//! evicts the least recently used eighth (counted in `evictions`). Both are one pass
//! over the shard that frees many slots at once, so the cost per insert stays O(1)
//! amortized and memory never passes the bound, however many distinct keys arrive.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Passes a key hash through: the keys are keyed-hash outputs already.
#[derive(Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used by `u64` keys; fold anything else in anyway.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

struct Slot<S> {
    state: S,
    /// Limiter-clock ns of the last request that stored this state.
    used: u64,
}

pub struct Shard<S> {
    map: HashMap<u64, Slot<S>, BuildHasherDefault<KeyHasher>>,
    cap: usize,
}

pub struct KeyTable<S> {
    shards: Box<[Mutex<Shard<S>>]>,
    evictions: AtomicU64,
}

impl<S: Copy> KeyTable<S> {
    /// A table that holds at most about `max_keys` keys (rounded up to a multiple of the
    /// shard count, at most 63 more).
    pub fn new(max_keys: usize) -> Self {
        let shards = (max_keys / 4096).next_power_of_two().clamp(1, 64);
        let cap = max_keys.div_ceil(shards).max(1);
        let shards = (0..shards).map(|_| Mutex::new(Shard { map: HashMap::default(), cap })).collect();
        KeyTable { shards, evictions: AtomicU64::new(0) }
    }

    /// Locks the shard that holds `key`.
    pub fn lock(&self, key: u64) -> MutexGuard<'_, Shard<S>> {
        // Bits away from those hashbrown uses for the bucket (low) and tag (top 7).
        let index = (key >> 40) as usize & (self.shards.len() - 1);
        // A panic while holding a shard cannot leave a half-written state (each write
        // is one insert), so a poisoned lock is still good to use.
        self.shards[index].lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keys forgotten while they still had state (least recently used evictions).
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Keys held now (takes every shard's lock: for tests and metrics, not the request path).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).map.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stores `state` for `key` in its locked `shard`; `idle(state)` tells which stored
    /// states a fresh key would equal.
    pub fn put(&self, shard: &mut Shard<S>, key: u64, state: S, now: u64, idle: impl Fn(&S) -> bool) {
        if let Some(slot) = shard.map.get_mut(&key) {
            *slot = Slot { state, used: now };
            return;
        }
        if shard.map.len() >= shard.cap {
            let evicted = shard.make_room(idle);
            self.evictions.fetch_add(evicted, Ordering::Relaxed);
        }
        shard.map.insert(key, Slot { state, used: now });
    }
}

impl<S: Copy> Shard<S> {
    pub fn get(&self, key: u64) -> Option<S> {
        self.map.get(&key).map(|slot| slot.state)
    }

    /// True when a new key would make `put` evict.
    pub fn is_full(&self) -> bool {
        self.map.len() >= self.cap
    }

    /// Changes the state of a stored key without counting it as a use.
    pub fn replace(&mut self, key: u64, state: S) {
        if let Some(slot) = self.map.get_mut(&key) {
            slot.state = state;
        }
    }

    pub fn remove(&mut self, key: u64) {
        self.map.remove(&key);
    }

    /// Frees at least one slot; returns how many keys with state were evicted.
    fn make_room(&mut self, idle: impl Fn(&S) -> bool) -> u64 {
        self.map.retain(|_, slot| !idle(&slot.state));
        let target = self.cap - self.cap.div_ceil(8);
        if self.map.len() <= target {
            return 0;
        }
        // Evict the least recently used down to the target: find the cut-off instant.
        let mut used: Vec<u64> = self.map.values().map(|slot| slot.used).collect();
        let excess = self.map.len() - target;
        let (_, &mut cutoff, _) = used.select_nth_unstable(excess - 1);
        let before = self.map.len();
        let mut ties = excess - used.iter().filter(|&&u| u < cutoff).count();
        self.map.retain(|_, slot| {
            if slot.used < cutoff {
                return false;
            }
            if slot.used == cutoff && ties > 0 {
                ties -= 1;
                return false;
            }
            true
        });
        (before - self.map.len()) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_keys_go_first_and_lose_nothing() {
        let table = KeyTable::<u64>::new(8);
        for key in 0..8u64 {
            let mut shard = table.lock(key);
            // Even keys hold a state of 0, which the test calls idle.
            table.put(&mut shard, key, key % 2, key, |&s| s == 0);
        }
        let mut shard = table.lock(100);
        table.put(&mut shard, 100, 1, 100, |&s| s == 0);
        drop(shard);
        assert_eq!(table.evictions(), 0);
        assert_eq!(table.len(), 5);
        assert_eq!(table.lock(1).get(1), Some(1));
        assert_eq!(table.lock(2).get(2), None);
    }

    #[test]
    fn least_recently_used_keys_are_evicted_when_none_is_idle() {
        let table = KeyTable::<u64>::new(16);
        for key in 0..16u64 {
            let mut shard = table.lock(key);
            table.put(&mut shard, key, 1, key, |_| false);
        }
        // Touch key 0 so that it is the most recent.
        let mut shard = table.lock(0);
        table.put(&mut shard, 0, 1, 100, |_| false);
        table.put(&mut shard, 1000, 1, 101, |_| false);
        drop(shard);
        assert_eq!(table.evictions(), 2);
        assert_eq!(table.len(), 15);
        assert!(table.lock(0).get(0).is_some());
        assert!(table.lock(1).get(1).is_none() && table.lock(2).get(2).is_none());
        assert!(table.lock(3).get(3).is_some());
    }

    #[test]
    fn a_flood_of_distinct_keys_stays_within_the_bound() {
        let table = KeyTable::<u64>::new(10_000);
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for now in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut shard = table.lock(x);
            table.put(&mut shard, x, now, now, |_| false);
        }
        assert!(table.len() <= 10_000 + 63, "{}", table.len());
        assert!(table.evictions() >= 190_000);
    }
}
