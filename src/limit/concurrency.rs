//! nginx `limit_conn`: requests in progress per key.
//!
//! The state of a key is its number of requests in flight. A request is admitted while
//! that number is below `max`; its slot is held by a `Permit` (see `Limiters`) that the
//! response body carries and that gives the slot back when dropped: when the body has
//! been sent, or when the client went away, whatever happened upstream. A key whose
//! count returns to zero is removed, so the table holds only keys with requests in
//! flight and never evicts one; when it is full, a new key is rejected.

use std::time::Duration;

use super::Verdict;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Concurrency {
    max: u64,
    retry_after: u64,
}

impl Concurrency {
    pub fn new(max: u64, retry_after: Duration) -> Self {
        Concurrency { max, retry_after: u64::try_from(retry_after.as_nanos()).unwrap_or(u64::MAX) }
    }

    /// The most requests a key has in progress.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// This limit with `max` in place of its own (a tenant's, `limit_from`).
    pub fn with_max(&self, max: u64) -> Self {
        Concurrency { max, ..*self }
    }

    /// `in_flight` is the key's count (None: no request in flight); `table_full` says
    /// that a new key cannot be stored.
    pub fn decide(&self, in_flight: Option<u64>, table_full: bool) -> Verdict {
        let count = in_flight.unwrap_or(0);
        if count >= self.max || (in_flight.is_none() && table_full) {
            return Verdict::Reject {
                retry_after: self.retry_after,
                remaining: 0,
                reset: self.retry_after,
                excess: count as f64,
            };
        }
        Verdict::Admit { state: count + 1, wait: 0, remaining: self.max - count - 1, reset: 0, excess: count as f64 }
    }

    /// Where a key with `in_flight` requests stands, nothing taken: the slots left; a
    /// slot is back when a request ends, not at a time.
    pub fn stands(&self, in_flight: Option<u64>) -> (u64, u64) {
        (self.max.saturating_sub(in_flight.unwrap_or(0)), 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_below_the_limit_and_rejects_at_it() {
        let c = Concurrency::new(2, Duration::from_secs(3));
        assert!(matches!(c.decide(None, false), Verdict::Admit { state: 1, remaining: 1, .. }));
        assert!(matches!(c.decide(Some(1), false), Verdict::Admit { state: 2, remaining: 0, .. }));
        assert!(matches!(c.decide(Some(2), false), Verdict::Reject { retry_after: 3_000_000_000, .. }));
    }

    #[test]
    fn a_full_table_refuses_new_keys_but_not_known_ones() {
        let c = Concurrency::new(2, Duration::from_secs(1));
        assert!(matches!(c.decide(None, true), Verdict::Reject { .. }));
        assert!(matches!(c.decide(Some(1), true), Verdict::Admit { .. }));
    }
}
