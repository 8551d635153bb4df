//! What a passed request carries until its response is known: the concurrency slots it
//! holds (`Permits`: local slots and global leases) and the admissions that only some
//! statuses keep (`Pending`).

use std::sync::Arc;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use smallvec::SmallVec;

use crate::clock::Nanos;
use crate::ids::LimitId;
use crate::limit::Limiters;
use crate::limit::adaptive::Since;
use crate::limit::queue::Handed;
use crate::policy::charge::{Charge, PriceRow};
use crate::policy::key::{KeyHash, KeySource};
use crate::store::{Admissions, Lease};

/// The concurrency slots a request holds, given back when this is dropped or released.
#[derive(Default)]
pub struct Permits {
    pub(super) limiters: Option<Arc<Limiters>>,
    pub(super) slots: SmallVec<[Slot; 2]>,
    /// Slots in global concurrency limits; each is given back when dropped.
    pub(super) leases: Vec<HeldLease>,
}

/// A local concurrency slot: held by `key` in limit `limit`.
pub(super) struct Slot {
    pub(super) limit: LimitId,
    pub(super) key: KeyHash,
    /// When it was taken (an adaptive limit learns how long slots are held; `None`: it
    /// has learnt it, from the upstream's answer).
    pub(super) since: Option<Since>,
}

// Every passed request moves its slots with it.
const _: () = assert!(size_of::<Slot>() == 16);

/// A slot of a global concurrency limit: its lease, held by `key` (as the limit's local
/// tables know it, and its queue's rooms).
pub(super) struct HeldLease {
    pub(super) key: KeyHash,
    pub(super) lease: Lease,
}

/// A local admission that `Pending::settle` may take back.
pub(super) struct Refundable {
    pub(super) limit: LimitId,
    pub(super) key: KeyHash,
    /// When the limit decided it.
    pub(super) at: Nanos,
    /// The key's own count it was decided with, as its local state decides (`limit_from`).
    pub(super) count: Option<u64>,
}

/// Admissions by limits that count only some responses (`count:`), to be kept or taken
/// back once the response's status is known, and by limits that charge what the
/// response reports (`charge:`). Dropped unsettled (the client went away before an
/// answer), they stay counted, and nothing is charged.
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
    /// now; the global ones' settling in Redis is returned, to be awaited. What is left
    /// of limits that charge is returned too, to be charged once the response has ended.
    /// Not an `async fn`, and the settling in Redis boxed: a future would be built and
    /// moved, at its full size, for every request, most of which have no global
    /// admissions.
    pub fn settle(self, status: u16) -> (Option<BoxFuture<'static, ()>>, Option<Charges>) {
        let Pending { limiters, admissions, cost, global } = self;
        let mut charges = Charges { limiters: None, local: SmallVec::new(), global: None, cost };
        if let Some(limiters) = &limiters {
            for a in admissions {
                limiters.settle(a.limit, a.key, a.count, cost, a.at, status);
                if limiters.counts(a.limit, status) && limiters.get(a.limit).charge.is_some() {
                    charges.local.push(a);
                }
            }
            if !charges.local.is_empty() {
                charges.limiters = Some(Arc::clone(limiters));
            }
        }
        let global = global.map(|global| {
            let (charged, settled) = global.split(|limit| {
                limiters.as_ref().is_some_and(|l| l.counts(limit, status) && l.get(limit).charge.is_some())
            });
            if let Some(charged) = charged {
                charges.limiters = limiters.clone();
                charges.global = Some(Box::new(charged));
            }
            async move { settled.settle(cost, status).await }.boxed()
        });
        (global, charges.limiters.is_some().then_some(charges))
    }

    /// The limits of these admissions that charge what the response reports, each with
    /// its `charge:`.
    pub fn charging(&self) -> impl Iterator<Item = (LimitId, &Charge)> {
        let limiters = self.limiters.as_deref();
        let global = self.global.iter().flat_map(|g| g.list.iter().map(|a| a.limit));
        self.admissions.iter().map(|a| a.limit).chain(global).filter_map(move |limit| {
            let charge = limiters?.get(limit).charge.as_ref()?;
            Some((limit, charge))
        })
    }

    /// For each of its limits that prices what it charges (a money budget's `prices`),
    /// the row the request `src` is priced at: by the value of the prices' part in the
    /// request, as it was when its limits decided it.
    pub fn prices(&self, src: &KeySource<'_>) -> Box<[(LimitId, PriceRow)]> {
        if self.admissions.is_empty() && self.global.is_none() {
            return Box::default();
        }
        (self.charging())
            .filter_map(|(limit, charge)| {
                let prices = charge.prices.as_ref()?;
                Some((limit, prices.row(prices.by.value_in(src).as_deref())))
            })
            .collect()
    }

    /// Adds `other`'s admissions (the same request's, decided in a second step).
    pub(super) fn absorb(&mut self, other: Pending) {
        self.limiters = self.limiters.take().or(other.limiters);
        self.admissions.extend(other.admissions);
    }
}

/// A request's admissions by limits that charge what its response reports
/// (`charge:`), once its status has kept them.
pub struct Charges {
    limiters: Option<Arc<Limiters>>,
    local: SmallVec<[Refundable; 1]>,
    global: Option<Box<Admissions>>,
    /// The request's own cost.
    cost: u64,
}

impl Charges {
    /// Debits what the response reported to each limit (`reported(limit)`: `None`, it
    /// did not, and the limit's default is charged): the local ones now; the global
    /// ones' debit in Redis is returned, to be awaited before the response ends, so the
    /// client's next request finds it.
    pub fn debit(self, reported: &dyn Fn(LimitId) -> Option<u64>) -> Option<impl Future<Output = ()> + Send + use<>> {
        let limiters = self.limiters?;
        let cost = i64::try_from(self.cost).unwrap_or(i64::MAX);
        // What limit `limit` is debited: the report (or the default), less the request's
        // cost where the report replaces it.
        let units = |limit: LimitId| {
            let charge = limiters.get(limit).charge.as_ref()?;
            let found = reported(limit);
            let units = found.unwrap_or(charge.default);
            limiters.count_charge(limit, units, found.is_some());
            let units = i64::try_from(units).unwrap_or(i64::MAX);
            Some(if charge.instead_of_cost { units - cost } else { units })
        };
        for a in &self.local {
            match units(a.limit) {
                Some(0) | None => {}
                Some(n) => limiters.charge(a.limit, a.key, a.count, n, a.at),
            }
        }
        let global = self.global?;
        let debits: SmallVec<[i64; 1]> = global.list.iter().map(|a| units(a.limit).unwrap_or(0)).collect();
        Some(async move { global.charge(&debits).await })
    }
}

impl Permits {
    /// It holds no slot.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty() && self.leases.is_empty()
    }

    /// Gives the local slots back now, and returns the release of the global ones, to
    /// be awaited (`None`: there are none, or each was handed to a request waiting here
    /// for it).
    pub fn finish(&mut self) -> Option<impl Future<Output = ()> + Send + 'static> {
        self.release_slots();
        if self.leases.is_empty() {
            return None;
        }
        let leases = self.pass_leases();
        if leases.is_empty() {
            return None;
        }
        Some(async move {
            futures_util::future::join_all(leases.into_iter().map(Lease::release)).await;
        })
    }

    /// Whether global slots are held (their release is to be awaited).
    pub fn holds_leases(&self) -> bool {
        !self.leases.is_empty()
    }

    /// Gives the local slots back.
    fn release_slots(&mut self) {
        if let Some(limiters) = &self.limiters {
            for slot in self.slots.drain(..) {
                limiters.release(slot.limit, slot.key, slot.since);
            }
        }
    }

    /// Hands each lease of a limit with a queue to a request waiting here for it: the
    /// leases left, to be released in Redis. (Apart: most requests hold none, and pay
    /// nothing for its loop.)
    #[cold]
    fn pass_leases(&mut self) -> Vec<Lease> {
        let held = std::mem::take(&mut self.leases);
        let Some(limiters) = &self.limiters else { return held.into_iter().map(|held| held.lease).collect() };
        let mut leases = Vec::with_capacity(held.len());
        for HeldLease { key, lease } in held {
            if limiters.get(lease.limit()).queue.is_none() {
                leases.push(lease);
                continue;
            }
            let back = limiters.give_back_lease(lease.limit(), key, Box::new(lease));
            leases.extend(back.and_then(|back| back.downcast::<Lease>().ok()).map(|lease| *lease));
        }
        leases
    }

    /// The upstream's response head came: an adaptive limit's ceiling learns from the
    /// time to it (so a client that reads its response slowly, holding the slot, does
    /// not teach it that the upstream is slow), or, the upstream saying it is overloaded
    /// (`shed`: 429, 503), that it is over what the upstream takes; the slots are given
    /// back later unsampled.
    pub fn answered(&mut self, shed: bool) {
        let Some(limiters) = &self.limiters else { return };
        for slot in &mut self.slots {
            if let Some(since) = slot.since.take() {
                limiters.answered(slot.limit, slot.key, since, shed);
            }
        }
    }

    /// Holds `handed`, a slot the request waited for in a queue (a global limit's: its
    /// lease).
    pub(super) fn hold(&mut self, handed: Handed) {
        let (limit, key, since) = (handed.limit, handed.key, handed.since);
        let (limiters, lease) = handed.take();
        self.limiters.get_or_insert(limiters);
        match lease {
            Some(lease) => {
                if let Ok(lease) = lease.downcast::<Lease>() {
                    self.leases.push(HeldLease { key, lease: *lease });
                }
            }
            None => self.slots.push(Slot { limit, key, since: Some(since) }),
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
    /// Local slots are given back at once; each lease is handed to a request waiting for
    /// it, or queues its own release.
    fn drop(&mut self) {
        self.release_slots();
        if !self.leases.is_empty() {
            drop(self.pass_leases());
        }
    }
}
