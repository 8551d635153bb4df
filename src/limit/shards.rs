//! A key table split in shards, each behind its own lock, so that requests for
//! different keys seldom wait for each other: the one sizing and shard choice of every
//! table (`table::KeyTable`, `sliding_log::LogTable`).

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Keys per shard, about, when the table is full: 64 shards from 262,144 keys up.
const KEYS_PER_SHARD: usize = 4096;
pub(super) const MAX_SHARDS: usize = 64;

pub struct Shards<T>(Box<[Mutex<T>]>);

impl<T> Shards<T> {
    /// Shards for a table of at most about `max_keys` keys (rounded up to a multiple of
    /// the shard count, at most 63 more): `shard(cap)` makes each, `cap` being its share.
    pub fn new(max_keys: usize, shard: impl Fn(usize) -> T) -> Self {
        let count = (max_keys / KEYS_PER_SHARD).next_power_of_two().clamp(1, MAX_SHARDS);
        let cap = max_keys.div_ceil(count).max(1);
        Shards((0..count).map(|_| Mutex::new(shard(cap))).collect())
    }

    /// Locks the shard that holds `key`.
    #[inline]
    pub fn lock(&self, key: u64) -> MutexGuard<'_, T> {
        // High bits pick the shard, low bits the slot within it.
        let index = (key >> 40) as usize & (self.0.len() - 1);
        lock(&self.0[index])
    }

    /// Every shard, locked one at a time (for metrics and the admin API, not the
    /// request path).
    pub fn each(&self) -> impl Iterator<Item = MutexGuard<'_, T>> {
        self.0.iter().map(lock)
    }
}

fn lock<T>(shard: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a shard cannot leave a half-written state (each write is one
    // slot or one log), so a poisoned lock is still good to use.
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}
