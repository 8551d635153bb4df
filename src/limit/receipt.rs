//! What a passed request carries until its response is known: the concurrency slots it
//! holds (`Permits`) and the admissions that only some statuses keep (`Pending`).

use std::sync::Arc;

use smallvec::SmallVec;

use super::Limiters;

/// The concurrency slots a request holds, given back when this is dropped or released.
#[derive(Default)]
pub struct Permits {
    pub(super) limiters: Option<Arc<Limiters>>,
    pub(super) slots: SmallVec<[(usize, u64); 2]>,
}

/// Admissions by limits that count only some responses (`count:`), to be kept or taken
/// back once the response's status is known. Dropped unsettled (the client went away
/// before an answer), they stay counted.
#[derive(Default)]
pub struct Pending {
    pub(super) limiters: Option<Arc<Limiters>>,
    /// (limit, key) of each admission, all of `cost` units at `at`.
    pub(super) admissions: SmallVec<[(usize, u64); 1]>,
    pub(super) cost: u64,
    pub(super) at: u64,
}

impl Pending {
    /// Takes back the admissions of limits that do not count `status`.
    pub fn settle(self, status: u16) {
        let Some(limiters) = &self.limiters else { return };
        for &(limit, key) in &self.admissions {
            limiters.settle(limit, key, self.cost, self.at, status);
        }
    }
}

impl Permits {
    /// Gives the slots back now rather than at drop.
    pub fn release(&mut self) {
        if let Some(limiters) = self.limiters.take() {
            for (limit, key) in self.slots.drain(..) {
                limiters.release(limit, key);
            }
        }
    }
}

impl Drop for Permits {
    fn drop(&mut self) {
        self.release();
    }
}
