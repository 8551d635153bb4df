//! The keys a limit refused most in the current second, for the dashboard, which adds up
//! sixty of them for its "refused most in the last minute". Fed by refusals only (a
//! request that passes does not touch it), and only when an admin listener serves the
//! dashboard; `take`, once a second, hands the second's keys over and starts the next.

use std::sync::{Mutex, PoisonError};

use smallvec::SmallVec;

use crate::top_keys::{TopKey, TopKeys};

/// Keys counted per second and limit: any key with more than 1/9 of a second's refusals.
pub const COUNTERS: usize = 8;

#[derive(Default)]
pub struct RefusedKeys(Mutex<TopKeys<COUNTERS>>);

impl RefusedKeys {
    /// Counts a refusal of the key hashed `key`, labelled by `label` (called only when
    /// the key takes a counter).
    pub fn count(&self, key: u64, label: impl FnOnce() -> String) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).count(key, label);
    }

    /// The keys refused since the last `take`, most first.
    pub fn take(&self) -> SmallVec<[TopKey; COUNTERS]> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner)).into_sorted()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_take_hands_over_the_keys_refused_since_the_last() {
        let refused = RefusedKeys::default();
        for key in [7, 7, 9] {
            refused.count(key, || format!("ip=10.0.0.{key}"));
        }
        let taken: Vec<(String, u64)> = refused.take().into_iter().map(|k| (k.label, k.count)).collect();
        assert_eq!(taken, [("ip=10.0.0.7".to_owned(), 2), ("ip=10.0.0.9".to_owned(), 1)]);
        assert!(refused.take().is_empty());
    }
}
