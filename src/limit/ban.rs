//! Temporary bans: once a limit with `ban` rejects a key, every request with that key
//! is refused until the ban ends, with `Retry-After` the time left. With escalation, a
//! key banned again less than `max` after its last ban ended gets twice that ban, up to
//! `max`.
//!
//! A ban table per limit, bounded like the limit's own (see `table`). State: the ban's
//! end in milliseconds since the Unix epoch (48 bits, good until the year 10889) and the
//! number of bans in a row (16 bits), in one `u64`. Beside it, each running ban's key as
//! written (`KeyText`), given when the ban starts, for `GET /bans`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use super::table::{KeyNames, KeyTable, Shard};

const MS: u64 = 1_000_000;
const STRIKE_SHIFT: u32 = 48;
const UNTIL_MASK: u64 = (1 << STRIKE_SHIFT) - 1;

pub struct Bans {
    base: u64,
    max: u64,
    /// Shared with the limit's previous configuration across a reload (`adopt`).
    table: Arc<KeyTable>,
    imposed: Arc<AtomicU64>,
    /// Each banned key as written, by its hash: at most `max_keys` (as the table).
    names: Arc<KeyNames>,
}

fn unpack(state: u64) -> (u64, u64) {
    ((state & UNTIL_MASK) * MS, state >> STRIKE_SHIFT)
}

impl Bans {
    /// Bans of `base`, doubling on repeat up to `max` (no escalation when equal).
    pub fn new(base: Duration, max: Duration, max_keys: usize) -> Self {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let table = Arc::new(KeyTable::new(max_keys));
        Bans {
            base: ns(base),
            max: ns(max).max(ns(base)),
            table,
            imposed: Arc::default(),
            names: Arc::new(KeyNames::new(max_keys)),
        }
    }

    /// Keeps the bans (and their count) of `old`, the same limit's bans before a reload.
    pub fn adopt(&mut self, old: &Bans) {
        self.table = Arc::clone(&old.table);
        self.imposed = Arc::clone(&old.imposed);
        self.names = Arc::clone(&old.names);
    }

    /// Names the ban of `key`, started at `now`, by the key as written. Names of bans that
    /// have ended are dropped when the names would outnumber the table's keys.
    pub fn name(&self, key: u64, name: String, now: u64) {
        self.names.name(key, name.into(), |k| self.left(&self.table.lock(k), k, now).is_some());
    }

    pub fn lock(&self, key: u64) -> MutexGuard<'_, Shard> {
        self.table.lock(key)
    }

    /// How long `key` stays banned from `now`, if it is.
    pub fn left(&self, shard: &Shard, key: u64, now: u64) -> Option<u64> {
        let (until, _) = unpack(shard.get(key)?);
        (until > now).then(|| until - now)
    }

    /// Bans `key` from `now`; returns the ban's length.
    pub fn impose(&self, shard: &mut Shard, key: u64, now: u64) -> u64 {
        let (strikes, length) = self.next(shard, key, now);
        // Kept to the millisecond, rounded down, so that a `Retry-After` of `length` is
        // never earlier than the ban's end.
        let until = now.saturating_add(length) / MS;
        let state = (strikes.min(u64::from(u16::MAX)) << STRIKE_SHIFT) | (until & UNTIL_MASK);
        let max = self.max;
        self.table.put(shard, key, state, |s| unpack(s).0.saturating_add(max) <= now, |s| s & UNTIL_MASK);
        self.imposed.fetch_add(1, Ordering::Relaxed);
        length
    }

    /// How long a ban of `key` started at `now` would last, without starting it.
    pub fn length(&self, shard: &Shard, key: u64, now: u64) -> u64 {
        self.next(shard, key, now).1
    }

    /// The strike a ban of `key` started at `now` would be, and its length: a repeat
    /// within `max` of the last ban's end doubles it, up to `max`.
    fn next(&self, shard: &Shard, key: u64, now: u64) -> (u64, u64) {
        let strikes = match shard.get(key).map(unpack) {
            Some((until, strikes)) if now < until.saturating_add(self.max) => strikes + 1,
            _ => 1,
        };
        let length = self.base.saturating_mul(1u64.checked_shl((strikes - 1) as u32).unwrap_or(u64::MAX)).min(self.max);
        (strikes, length)
    }

    /// Keys banned at `now`.
    pub fn active(&self, now: u64) -> usize {
        let mut n = 0;
        self.table.each(|_, state| n += usize::from(unpack(state).0 > now));
        n
    }

    /// The keys banned at `now`, as written (`None`: the ban has no name yet, its start
    /// being under way), with the time each ban has left.
    pub fn list(&self, now: u64) -> Vec<(u64, Option<Box<str>>, u64)> {
        let mut banned = Vec::new();
        self.table.each(|key, state| {
            let (until, _) = unpack(state);
            if until > now {
                banned.push((key, until - now));
            }
        });
        let names = self.names.of(banned.iter().map(|&(key, _)| key));
        banned.into_iter().zip(names).map(|((key, left), name)| (key, name, left)).collect()
    }

    /// Every key's ban state (a ban running, or one whose repeat would escalate) with its
    /// name, for the state directory.
    pub fn entries(&self) -> Vec<(u64, u64, Option<Box<str>>)> {
        let mut entries = Vec::new();
        self.table.each(|key, state| entries.push((key, state, None)));
        let names = self.names.of(entries.iter().map(|&(key, _, _)| key));
        entries.iter_mut().zip(names).for_each(|(entry, name)| entry.2 = name);
        entries
    }

    /// Puts back `key`'s ban `state` and its `name` (empty: none) as read from the state
    /// directory, unless it no longer matters at `now` (the ban is over and a repeat
    /// would not escalate); true if it took it.
    pub fn restore(&self, key: u64, state: u64, name: &str, now: u64) -> bool {
        let max = self.max;
        let idle = |s: u64| unpack(s).0.saturating_add(max) <= now;
        if idle(state) {
            return false;
        }
        self.table.put(&mut self.table.lock(key), key, state, idle, |s| s & UNTIL_MASK);
        if !name.is_empty() && unpack(state).0 > now {
            self.name(key, name.to_owned(), now);
        }
        true
    }

    /// Ends `key`'s ban, if it has one; true if it had.
    pub fn lift(&self, key: u64, now: u64) -> bool {
        let mut shard = self.table.lock(key);
        let banned = self.left(&shard, key, now).is_some();
        shard.remove(key);
        drop(shard);
        self.names.remove(key);
        banned
    }

    /// Bans imposed since start.
    pub fn imposed(&self) -> u64 {
        self.imposed.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_ban_lasts_its_length_then_ends() {
        let bans = Bans::new(Duration::from_secs(60), Duration::from_secs(60), 100);
        let mut shard = bans.lock(7);
        let now = 1_700_000_000 * S;
        assert_eq!(bans.impose(&mut shard, 7, now), 60 * S);
        assert_eq!(bans.left(&shard, 7, now + 10 * S), Some(50 * S));
        assert_eq!(bans.left(&shard, 7, now + 60 * S), None);
        assert_eq!(bans.left(&shard, 8, now), None);
        assert_eq!(bans.imposed(), 1);
    }

    #[test]
    fn repeat_offenders_get_doubled_bans_up_to_the_maximum() {
        let bans = Bans::new(Duration::from_secs(60), Duration::from_secs(200), 100);
        let mut shard = bans.lock(7);
        let mut now = 1_700_000_000 * S;
        let mut lengths = Vec::new();
        for _ in 0..4 {
            let length = bans.impose(&mut shard, 7, now);
            lengths.push(length / S);
            now += length + S; // banned again a second after the ban ends
        }
        assert_eq!(lengths, [60, 120, 200, 200]);
        // Good behaviour for longer than the maximum starts over.
        now += 200 * S;
        assert_eq!(bans.impose(&mut shard, 7, now), 60 * S);
    }
}
