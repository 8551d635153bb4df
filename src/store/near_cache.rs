//! Keys Redis reported over a global limit, remembered until they would pass again: a
//! request for one is refused here, with the exact `Retry-After`, without a round trip.
//! One bounded table per limit (the local limiters' `KeyTable`): expired entries are
//! dropped first, then those that expire soonest.

use crate::limit::table::KeyTable;

pub struct NearCache {
    /// Per limit (indexed like `Config::limits`; `None` for local limits).
    tables: Box<[Option<KeyTable>]>,
}

impl NearCache {
    /// A table of `max_keys` for each limit that `global` says is global.
    pub fn new(global: impl Iterator<Item = bool>, max_keys: usize) -> Self {
        NearCache { tables: global.map(|g| (g && max_keys > 0).then(|| KeyTable::new(max_keys))).collect() }
    }

    /// How long `key` of `limit` is still refused from `now` (limiter-clock ns), if known.
    pub fn refused(&self, limit: usize, key: u64, now: u64) -> Option<u64> {
        let table = self.tables[limit].as_ref()?;
        let until = table.lock(key).get(key)?;
        (until > now).then(|| until - now)
    }

    /// Remembers that `key` of `limit` is refused until `until`.
    pub fn remember(&self, limit: usize, key: u64, until: u64, now: u64) {
        if let Some(table) = &self.tables[limit] {
            let mut shard = table.lock(key);
            table.put(&mut shard, key, until, |u| u <= now, |u| u);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_a_refusal_until_it_ends_and_only_for_global_limits() {
        let cache = NearCache::new([true, false].into_iter(), 100);
        cache.remember(0, 7, 1_000, 0);
        cache.remember(1, 7, 1_000, 0);
        assert_eq!(cache.refused(0, 7, 400), Some(600));
        assert_eq!(cache.refused(0, 7, 1_000), None);
        assert_eq!(cache.refused(0, 8, 400), None);
        assert_eq!(cache.refused(1, 7, 400), None);
    }
}
