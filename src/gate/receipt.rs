//! What a passed request carries until its response is known: the concurrency slots it
//! holds (`Permits`: local slots and global leases) and the admissions that only some
//! statuses keep (`Pending`).

use std::sync::Arc;

use smallvec::SmallVec;

use crate::clock::Nanos;
use crate::ids::LimitId;
use crate::limit::Limiters;
use crate::policy::key::KeyHash;
use crate::store::{Admissions, Lease};

/// The concurrency slots a request holds, given back when this is dropped or released.
#[derive(Default)]
pub struct Permits {
    pub(super) limiters: Option<Arc<Limiters>>,
    pub(super) slots: SmallVec<[Slot; 2]>,
    /// Slots in global concurrency limits; each is given back when dropped.
    pub(super) leases: Vec<Lease>,
}

/// A local concurrency slot: held by `key` in limit `limit`.
pub(super) struct Slot {
    pub(super) limit: LimitId,
    pub(super) key: KeyHash,
}

/// A local admission that `Pending::settle` may take back.
pub(super) struct Refundable {
    pub(super) limit: LimitId,
    pub(super) key: KeyHash,
    /// When the limit decided it.
    pub(super) at: Nanos,
}

/// Admissions by limits that count only some responses (`count:`), to be kept or taken
/// back once the response's status is known. Dropped unsettled (the client went away
/// before an answer), they stay counted.
#[derive(Default)]
pub struct Pending {
    pub(super) limiters: Option<Arc<Limiters>>,
    /// Each local admission, all of `cost` units.
    pub(super) admissions: SmallVec<[Refundable; 1]>,
    pub(super) cost: u64,
    /// Global admissions, boxed: most requests have none.
    pub(super) global: Option<Box<Admissions>>,
}

impl Pending {
    /// Takes back the admissions of limits that do not count `status`: the local ones
    /// now; the global ones' settling in Redis is returned, to be awaited. Not an `async
    /// fn`: its future would be built and moved for every request, most of which have no
    /// global admissions.
    pub fn settle(self, status: u16) -> Option<impl Future<Output = ()> + use<>> {
        if let Some(limiters) = &self.limiters {
            for a in &self.admissions {
                limiters.settle(a.limit, a.key, self.cost, a.at, status);
            }
        }
        let (global, cost) = (self.global?, self.cost);
        Some(async move { global.settle(cost, status).await })
    }

    /// Adds `other`'s admissions (the same request's, decided in a second step).
    pub(super) fn absorb(&mut self, other: Pending) {
        self.limiters = self.limiters.take().or(other.limiters);
        self.admissions.extend(other.admissions);
    }
}

impl Permits {
    /// Gives the local slots back now, and returns the release of the global ones, to
    /// be awaited (`None`: there are none).
    pub fn finish(&mut self) -> Option<impl Future<Output = ()> + Send + 'static> {
        self.release_local();
        if self.leases.is_empty() {
            return None;
        }
        let leases = std::mem::take(&mut self.leases);
        Some(async move {
            futures_util::future::join_all(leases.into_iter().map(Lease::release)).await;
        })
    }

    /// Whether global slots are held (their release is to be awaited).
    pub fn holds_leases(&self) -> bool {
        !self.leases.is_empty()
    }

    fn release_local(&mut self) {
        if let Some(limiters) = self.limiters.take() {
            for slot in self.slots.drain(..) {
                limiters.release(slot.limit, slot.key);
            }
        }
    }

    /// Adds `other`'s slots (the same request's, taken in a second step).
    pub(super) fn absorb(&mut self, mut other: Permits) {
        self.limiters = self.limiters.take().or(other.limiters.take());
        self.slots.extend(other.slots.drain(..));
        self.leases.append(&mut other.leases);
    }
}

impl Drop for Permits {
    /// Local slots are given back at once; each lease queues its own release.
    fn drop(&mut self) {
        self.release_local();
    }
}
