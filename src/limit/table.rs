//! A bounded, sharded map from key hash to limiter state.
//!
//! Keys arrive already hashed (keyed SipHash, see `key`), so the table uses them as they
//! are. Each shard is a flat open-addressing table with linear probing whose slots hold
//! key and state together (16 bytes for a `u64` state): a lookup at a million keys costs one cache miss
//! where a SwissTable (std's `HashMap`) costs two, control bytes then bucket, and that
//! miss was most of a decision's time. Hence this small table of our own.
//!
//! Each shard holds at most its share of `max_keys`. When a shard is full it first
//! forgets the keys whose state is that of a fresh key (lossless: the limiter decides
//! the same without them), and if that frees less than an eighth of the shard, it
//! evicts the eighth whose states rank lowest by the limiter's `rank`: for the leaky
//! bucket, the instant its bucket drains, so the keys forgotten are those closest to
//! fresh, whose loss changes the fewest decisions (among equally loaded keys, this is
//! least recently used). A refusal counts as use: a key refused lately ranks above
//! every key that was not, since forgetting it would hand the very client the limit is
//! holding back a fresh key's answer (a flood of fresh keys must not free it). Evictions are counted. Both are one pass over the shard that
//! frees many slots at once, so the cost per insert stays O(1) amortized and memory
//! never passes the bound, however many distinct keys arrive.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::shards::Shards;

/// A key and its state; key 0 marks an empty slot.
#[derive(Clone, Copy, Default)]
struct Slot<S> {
    key: u64,
    state: S,
}

/// State of one key: a `u64` for most limiters (16-byte slots), wider where needed.
pub trait State: Copy + Default {}
impl<S: Copy + Default> State for S {}

pub struct Shard<S = u64> {
    /// A power of two long, at most three quarters full; it doubles as keys arrive, up
    /// to the size `cap` needs, so a lightly used table stays small and dense.
    slots: Box<[Slot<S>]>,
    len: usize,
    cap: usize,
    /// Stored keys refused lately; kept apart from the slots so they stay 16 bytes.
    refused: Refusals,
}

/// Stored keys refused lately, with the instant of their last refusal: rank metadata
/// only, never a limiter's state, so a rejection still changes no decision. At most
/// half a shard's `cap` long (the older half is dropped when full), so a flood of
/// refused keys costs bounded memory and can only push out keys refused before it.
///
/// Hashed with foldhash rather than std's SipHash: the keys are already the keyed hashes
/// of key parts, which no client can aim, and SipHash cost a refusal 100 instructions more.
#[derive(Default)]
pub struct Refusals(HashMap<u64, u64, foldhash::fast::RandomState>);

/// Added to a refused key's rank: ranks are instants well below 2^63 (ns until 2262),
/// so every refused key ranks above every other, in the same order among themselves.
const REFUSED: u64 = 1 << 63;

impl Refusals {
    pub fn note(&mut self, key: u64, now: u64, cap: usize) {
        if self.0.len() >= cap.div_ceil(2) && !self.0.contains_key(&key) {
            // Keep the newer half: one pass per `cap / 4` refusals, O(1) amortized.
            let mut at: Vec<u64> = self.0.values().copied().collect();
            let half = at.len() / 2;
            let (_, &mut median, _) = at.select_nth_unstable(half);
            self.0.retain(|_, &mut t| t > median);
        }
        self.0.insert(key, now);
    }

    /// `rank` of `key`, raised above every unrefused key's if it was refused.
    pub fn rank(&self, key: u64, rank: u64) -> u64 {
        if self.0.contains_key(&key) { rank | REFUSED } else { rank & !REFUSED }
    }

    pub fn forget(&mut self, key: u64) {
        self.0.remove(&key);
    }

    /// Keeps the refusals of the keys `stored` still holds.
    pub fn retain(&mut self, stored: impl Fn(u64) -> bool) {
        self.0.retain(|&key, _| stored(key));
    }
}

/// Slots of a new shard.
const MIN_SLOTS: usize = 16;

fn empty_slots<S: State>(n: usize) -> Box<[Slot<S>]> {
    vec![Slot::default(); n].into_boxed_slice()
}

pub struct KeyTable<S = u64> {
    shards: Shards<Shard<S>>,
    evictions: AtomicU64,
}

/// Key 0 is the empty mark; the key hash 0 shares a slot with 1 (one chance in 2^63).
fn stored(key: u64) -> u64 {
    key.max(1)
}

impl<S: State> KeyTable<S> {
    /// A table that holds at most about `max_keys` keys (rounded up to a multiple of the
    /// shard count, at most 63 more).
    pub fn new(max_keys: usize) -> Self {
        let shards = Shards::new(max_keys, |cap| Shard {
            slots: empty_slots(MIN_SLOTS),
            len: 0,
            cap,
            refused: Refusals::default(),
        });
        KeyTable { shards, evictions: AtomicU64::new(0) }
    }

    /// Locks the shard that holds `key`.
    #[inline]
    pub fn lock(&self, key: u64) -> MutexGuard<'_, Shard<S>> {
        self.shards.lock(key)
    }

    /// Keys forgotten while they still had state (least recently used evictions).
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Keys held now (takes every shard's lock: for tests and metrics, not the request path).
    pub fn keys(&self) -> usize {
        self.shards.each().map(|s| s.len).sum()
    }

    /// Calls `f` with every stored key and state, one shard locked at a time (for
    /// metrics and the admin API, not the request path).
    pub fn each(&self, mut f: impl FnMut(u64, S)) {
        for shard in self.shards.each() {
            shard.slots.iter().filter(|slot| slot.key != 0).for_each(|slot| f(slot.key, slot.state));
        }
    }

    /// Stores `state` for `key` in its locked `shard`. If room must be made, `idle(state)`
    /// tells which stored states a fresh key would equal, and `rank(state)` which to
    /// evict first (lowest).
    pub fn put(&self, shard: &mut Shard<S>, key: u64, state: S, idle: impl Fn(S) -> bool, rank: impl Fn(S) -> u64) {
        let key = stored(key);
        let mut i = shard.find(key);
        if shard.slots[i].key == 0 {
            if shard.len >= shard.cap {
                let evicted = shard.make_room(idle, rank);
                self.evictions.fetch_add(evicted, Ordering::Relaxed);
                i = shard.find(key);
            } else if (shard.len + 1) * 4 > shard.slots.len() * 3 {
                shard.rebuild(shard.slots.len() * 2, |_| true);
                i = shard.find(key);
            }
            shard.len += 1;
        }
        shard.slots[i] = Slot { key, state };
    }
}

impl<S: State> Shard<S> {
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// The slot holding `key`, or the empty slot where it would go.
    fn find(&self, key: u64) -> usize {
        let mask = self.mask();
        let mut i = key as usize & mask;
        loop {
            let k = self.slots[i].key;
            if k == key || k == 0 {
                return i;
            }
            i = (i + 1) & mask;
        }
    }

    pub fn get(&self, key: u64) -> Option<S> {
        let slot = &self.slots[self.find(stored(key))];
        (slot.key != 0).then_some(slot.state)
    }

    /// True when a new key would make `put` evict.
    pub fn is_full(&self) -> bool {
        self.len >= self.cap
    }

    /// Changes the state of a stored key without counting it as a use.
    pub fn replace(&mut self, key: u64, state: S) {
        let i = self.find(stored(key));
        if self.slots[i].key != 0 {
            self.slots[i].state = state;
        }
    }

    /// Records that stored `key` was refused at `now`, so that it ranks as recently used
    /// although its state did not change. A key not stored has nothing to protect.
    pub fn refuse(&mut self, key: u64, now: u64) {
        let key = stored(key);
        if self.slots[self.find(key)].key != 0 {
            self.refused.note(key, now, self.cap);
        }
    }

    pub fn remove(&mut self, key: u64) {
        let i = self.find(stored(key));
        if self.slots[i].key != 0 {
            self.remove_at(i);
            self.refused.forget(stored(key));
        }
    }

    /// Empties slot `hole` and moves later entries of its probe run back into it, so
    /// every key stays reachable from its home slot without tombstones.
    fn remove_at(&mut self, mut hole: usize) {
        let mask = self.mask();
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let key = self.slots[j].key;
            if key == 0 {
                break;
            }
            let home = key as usize & mask;
            // The entry at j may fill the hole unless its home lies cyclically in (hole, j].
            let stays = if hole <= j { hole < home && home <= j } else { hole < home || home <= j };
            if !stays {
                self.slots[hole] = self.slots[j];
                hole = j;
            }
        }
        self.slots[hole] = Slot::default();
        self.len -= 1;
    }

    /// Rebuilds the table `size` slots long with the entries `keep` accepts.
    fn rebuild(&mut self, size: usize, keep: impl Fn(&Slot<S>) -> bool) {
        let old = std::mem::replace(&mut self.slots, empty_slots(size));
        self.len = 0;
        for slot in old.iter().filter(|s| s.key != 0 && keep(s)) {
            let i = self.find(slot.key);
            self.slots[i] = *slot;
            self.len += 1;
        }
    }

    /// Frees at least one slot; returns how many keys with state were evicted.
    fn make_room(&mut self, idle: impl Fn(S) -> bool, rank: impl Fn(S) -> u64) -> u64 {
        // Idle keys go whether refused or not: a fresh key gets the same answer.
        self.rebuild(self.slots.len(), |s| !idle(s.state));
        let mut refused = std::mem::take(&mut self.refused);
        let evicted = self.evict_lowest(|s| refused.rank(s.key, rank(s.state)));
        refused.retain(|key| self.slots[self.find(key)].key == key);
        self.refused = refused;
        evicted
    }

    /// Evicts the lowest ranked keys down to seven eighths of `cap`; returns how many.
    fn evict_lowest(&mut self, rank: impl Fn(&Slot<S>) -> u64) -> u64 {
        let target = self.cap - self.cap.div_ceil(8);
        if self.len <= target {
            return 0;
        }
        // Evict the lowest ranked down to the target: find the cut-off rank.
        let mut ranks: Vec<u64> = self.slots.iter().filter(|s| s.key != 0).map(&rank).collect();
        let excess = self.len - target;
        let (_, &mut cutoff, _) = ranks.select_nth_unstable(excess - 1);
        let before = self.len;
        let ties = std::cell::Cell::new(excess - ranks.iter().filter(|&&r| r < cutoff).count());
        self.rebuild(self.slots.len(), |s| {
            let r = rank(s);
            if r < cutoff {
                return false;
            }
            if r == cutoff && ties.get() > 0 {
                ties.set(ties.get() - 1);
                return false;
            }
            true
        });
        (before - self.len) as u64
    }
}

/// The keys of a table as written (`ip=10.0.0.1`), by hash, for what lists them (`GET
/// /bans`, the dashboard's holds): given when a key's entry starts, at most `max` of them.
/// A new name that would pass `max` first drops those of keys no longer `live`; if none
/// can go, the new key stays unnamed (listed by its hash), so a flood of keys costs a
/// bounded map. Keys are stored as the table stores them (`stored`), so that a key the
/// table lists is found here.
pub struct KeyNames {
    names: Mutex<HashMap<u64, Box<str>>>,
    max: usize,
}

impl KeyNames {
    pub fn new(max: usize) -> Self {
        KeyNames { names: Mutex::default(), max }
    }

    fn names(&self) -> MutexGuard<'_, HashMap<u64, Box<str>>> {
        self.names.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Names `key`; `live` tells which named keys still matter.
    pub fn name(&self, key: u64, name: Box<str>, live: impl Fn(u64) -> bool) {
        let key = stored(key);
        let mut names = self.names();
        if names.len() >= self.max && !names.contains_key(&key) {
            names.retain(|&k, _| live(k));
            if names.len() >= self.max {
                return;
            }
        }
        names.insert(key, name);
    }

    pub fn get(&self, key: u64) -> Option<Box<str>> {
        self.names().get(&stored(key)).cloned()
    }

    /// The names of `keys`, in their order, under one lock.
    pub fn of(&self, keys: impl Iterator<Item = u64>) -> Vec<Option<Box<str>>> {
        let names = self.names();
        keys.map(|key| names.get(&stored(key)).cloned()).collect()
    }

    pub fn remove(&self, key: u64) {
        self.names().remove(&stored(key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_keys_go_first_and_lose_nothing() {
        let table = KeyTable::new(8);
        for key in 1..=8u64 {
            let mut shard = table.lock(key);
            // Even keys hold a state of 0, which the test calls idle.
            table.put(&mut shard, key, key % 2, |s| s == 0, |s| s);
        }
        let mut shard = table.lock(100);
        table.put(&mut shard, 100, 1, |s| s == 0, |s| s);
        drop(shard);
        assert_eq!(table.evictions(), 0);
        assert_eq!(table.keys(), 5);
        assert_eq!(table.lock(1).get(1), Some(1));
        assert_eq!(table.lock(2).get(2), None);
    }

    #[test]
    fn lowest_ranked_keys_are_evicted_when_none_is_idle() {
        let table = KeyTable::new(16);
        // The state is the rank here: key k ranks k.
        for key in 1..=16u64 {
            let mut shard = table.lock(key);
            table.put(&mut shard, key, key, |_| false, |s| s);
        }
        // Raise key 1 to the top.
        let mut shard = table.lock(1);
        table.put(&mut shard, 1, 100, |_| false, |s| s);
        table.put(&mut shard, 1000, 101, |_| false, |s| s);
        drop(shard);
        assert_eq!(table.evictions(), 2);
        assert_eq!(table.keys(), 15);
        assert!(table.lock(1).get(1).is_some());
        assert!(table.lock(2).get(2).is_none() && table.lock(3).get(3).is_none());
        assert!(table.lock(4).get(4).is_some());
    }

    #[test]
    fn removal_keeps_every_other_key_of_a_probe_run_reachable() {
        let table = KeyTable::new(64);
        let mut shard = table.lock(0);
        let slots = shard.slots.len() as u64;
        // Keys with the same home slot, and one wrapping around the end of the table.
        let keys = [5, 5 + slots, 5 + 2 * slots, 6, slots - 1, 2 * slots - 1];
        for (n, &k) in keys.iter().enumerate() {
            table.put(&mut shard, k, n as u64 + 10, |_| false, |s| s);
        }
        for (n, &gone) in keys.iter().enumerate() {
            shard.remove(gone);
            assert_eq!(shard.get(gone), None);
            for (m, &k) in keys.iter().enumerate().skip(n + 1) {
                assert_eq!(shard.get(k), Some(m as u64 + 10), "key {k} lost after removing {gone}");
            }
        }
        assert_eq!(shard.len, 0);
        assert!(shard.slots.iter().all(|s| s.key == 0));
    }

    #[test]
    fn a_flood_of_distinct_keys_stays_within_the_bound() {
        let table = KeyTable::new(10_000);
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for now in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut shard = table.lock(x);
            table.put(&mut shard, x, now, |_| false, |s| s);
        }
        assert!(table.keys() <= 10_000 + 63, "{}", table.keys());
        assert!(table.evictions() >= 190_000);
    }
}
