//! Keys Redis refused a one-unit request for, remembered until such a request would pass
//! again: another one-unit request for the key is refused here without a round trip,
//! with what Redis would answer: the `Retry-After` and the reset left, and no unit left
//! (a one-unit refusal means none is). Heavier requests still go to Redis: their
//! `Retry-After` is longer, and only Redis knows by how much.
//! One bounded table per limit (the local limiters' `KeyTable`): expired entries are
//! dropped first, then those that expire soonest.

use typed_index_collections::TiVec;

use crate::ids::LimitId;
use crate::limit::table::KeyTable;

/// A remembered refusal, as instants on the limiter clock (ns).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Refusal {
    /// When a one-unit request passes again.
    pub until: u64,
    /// When the refusing window is back at its full quota.
    pub reset: u64,
    /// The window that refused longest.
    pub window: usize,
}

pub struct NearCache {
    /// Per limit (indexed like `Config::limits`; `None` for local limits).
    tables: TiVec<LimitId, Option<KeyTable<Refusal>>>,
}

impl NearCache {
    /// A table of `max_keys` for each limit that `global` says is global.
    pub fn new(global: impl Iterator<Item = bool>, max_keys: usize) -> Self {
        NearCache { tables: global.map(|g| (g && max_keys > 0).then(|| KeyTable::new(max_keys))).collect() }
    }

    /// The refusal of a one-unit request for `key` of `limit` at `now`, if one is known.
    pub fn refused(&self, limit: LimitId, key: u64, now: u64) -> Option<Refusal> {
        let table = self.tables[limit].as_ref()?;
        let refusal = table.lock(key).get(key)?;
        (refusal.until > now).then_some(refusal)
    }

    /// Remembers that a one-unit request for `key` of `limit` is refused as `refusal` says.
    pub fn remember(&self, limit: LimitId, key: u64, refusal: Refusal, now: u64) {
        if let Some(table) = &self.tables[limit] {
            let mut shard = table.lock(key);
            table.put(&mut shard, key, refusal, |r| r.until <= now, |r| r.until);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_a_refusal_until_it_ends_and_only_for_global_limits() {
        let cache = NearCache::new([true, false].into_iter(), 100);
        let (a, b) = (LimitId::from(0), LimitId::from(1));
        let refusal = Refusal { until: 1_000, reset: 3_000, window: 1 };
        cache.remember(a, 7, refusal, 0);
        cache.remember(b, 7, refusal, 0);
        assert_eq!(cache.refused(a, 7, 400), Some(refusal));
        assert_eq!(cache.refused(a, 7, 1_000), None);
        assert_eq!(cache.refused(a, 8, 400), None);
        assert_eq!(cache.refused(b, 7, 400), None);
    }
}
