//! The keys that come most often in a stream (of refusals, of a candidate's changes), in
//! bounded room: the Misra-Gries summary with `N` counters. Any key that makes more than 1/(N+1) of the
//! stream is among them, and each count is a lower bound of the key's. A key's label is
//! built only when the key takes a counter, never while it holds one: a few keys
//! hammering cost one label each. Hand-written: the heavy-hitter crates keep far more
//! state or hash labels for every event.

use smallvec::SmallVec;

/// One key of the summary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopKey {
    /// The key's keyed hash.
    pub key: u64,
    /// How it is shown (as `log_keys` says).
    pub label: String,
    /// Times it came, at least (since it took its counter).
    pub count: u64,
}

/// The summary; `N` counters.
#[derive(Debug, Default)]
pub struct TopKeys<const N: usize>(SmallVec<[TopKey; N]>);

impl<const N: usize> TopKeys<N> {
    /// Counts one more of `key`, labelled by `label` (called only if the key takes a
    /// counter).
    pub fn count(&mut self, key: u64, label: impl FnOnce() -> String) {
        if let Some(entry) = self.0.iter_mut().find(|e| e.key == key) {
            entry.count += 1;
        } else if self.0.len() < N {
            self.0.push(TopKey { key, label: label(), count: 1 });
        } else {
            for entry in self.0.iter_mut() {
                entry.count -= 1;
            }
            self.0.retain(|e| e.count > 0);
        }
    }

    /// The keys counted, most first, the summary kept.
    pub fn sorted(&self) -> SmallVec<[TopKey; N]> {
        TopKeys(self.0.clone()).into_sorted()
    }

    /// The keys counted, most first.
    pub fn into_sorted(self) -> SmallVec<[TopKey; N]> {
        let mut top = self.0;
        top.sort_by_key(|e| std::cmp::Reverse(e.count));
        top
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_that_makes_most_of_a_flood_of_others_is_found_first() {
        let mut top = TopKeys::<3>::default();
        let mut labelled = Vec::new();
        for n in 0..1000u64 {
            // Key 1 makes two thirds of the flood; keys 100.. come once each.
            let key = if n % 3 == 0 { 100 + n } else { 1 };
            top.count(key, || {
                labelled.push(key);
                format!("ip=10.0.0.{key}")
            });
        }
        let top = top.into_sorted();
        assert_eq!(top[0].label, "ip=10.0.0.1");
        assert!(top[0].count >= 1000 * 2 / 3 - 1000 / 4, "{top:?}");
        assert_eq!(labelled.iter().filter(|&&k| k == 1).count(), 1, "labelled once while it holds its counter");
    }
}
