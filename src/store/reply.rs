//! Reading the decide script's reply: one standing per window, the admissions to keep
//! (or to take back when another slot's call refused), the leases taken, and the
//! refusals the near-cache remembers.

use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use super::near_cache::Refusal;
use super::script::REPLY_FIELDS;
use super::{Admission, Call, Lease, RedisTime, Store};
use crate::clock::Nanos;
use crate::ids::LimitId;
use crate::limit::{Outcome, Standing};

/// Calls (indices) that go to Redis in one script call.
pub(super) type Batch = SmallVec<[usize; 2]>;

/// What Redis made of a request's global limits.
pub struct Verdicts {
    /// One per window, in call order.
    pub standings: SmallVec<[Standing; 2]>,
    /// An enforced global limit rejected: nothing was stored anywhere.
    pub rejected: bool,
    /// The slots the request holds in global concurrency limits.
    pub leases: Vec<Lease>,
    /// The admissions, for `settle`.
    pub admissions: SmallVec<[Admission; 1]>,
}

impl Store {
    /// Turns the replies into standings; on a rejection, takes back what other slots'
    /// calls admitted (a cluster only), and remembers the refused keys.
    pub(super) fn verdicts(
        self: &Arc<Self>,
        calls: &[Call],
        batches: &[Batch],
        replies: &[Vec<u64>],
        ids: &[String],
        cost: u64,
        now: Nanos,
    ) -> Verdicts {
        let mut standings = SmallVec::new();
        // Calls whose state the script stored: those of batches no limit that refuses
        // rejected, less limits that do not refuse (dry run, annotate) and would have
        // (they store nothing).
        let mut committed: SmallVec<[(usize, RedisTime); 2]> = SmallVec::new();
        let mut rejected = false;
        for (batch, reply) in batches.iter().zip(replies) {
            let at = RedisTime { secs: reply[0], micros: reply[1] };
            let mut fields = reply[2..].chunks_exact(REPLY_FIELDS);
            let (mut batch_rejects, mut stored) = (false, Batch::new());
            for &c in batch {
                let spec = self.spec(calls[c].limit);
                let mut longest: Option<(Duration, Duration, usize)> = None;
                for window in 0..spec.windows() {
                    let Some(f) = fields.next() else { break };
                    let standing = standing(calls[c].limit, window, f);
                    if let Outcome::Rejected(after) = standing.outcome
                        && longest.is_none_or(|(longest, ..)| after > longest)
                    {
                        longest = Some((after, standing.reset, window));
                    }
                    standings.push(standing);
                }
                match (longest, spec.refuses) {
                    (None, _) => stored.push(c),
                    (Some(_), false) => {}
                    (Some((after, reset, window)), true) => {
                        batch_rejects = true;
                        // The near-cache knows when a request of one unit passes again
                        // (a concurrency slot may free up any moment: not for those).
                        if cost == 1 && !spec.leases {
                            let refusal = Refusal { until: now.after(after).0, reset: now.after(reset).0, window };
                            self.remember_refusal(&calls[c], refusal, now);
                        }
                    }
                }
            }
            rejected |= batch_rejects;
            if !batch_rejects {
                committed.extend(stored.into_iter().map(|c| (c, at)));
            }
        }
        let mut verdicts = Verdicts { standings, rejected, leases: Vec::new(), admissions: SmallVec::new() };
        for (c, at) in committed {
            let call = &calls[c];
            let spec = self.spec(call.limit);
            if spec.leases {
                let (key, id) = (spec.key(&call.base, 0), ids[c].clone());
                let lease = Lease { store: Arc::clone(self), limit: call.limit, key, id };
                if !rejected {
                    self.leases.add(&lease.id, &lease.key);
                }
                // Dropped at once when the request is rejected: the slot goes back.
                verdicts.leases.push(lease);
            } else if rejected {
                self.refund(call.limit, call.base.clone(), at, cost);
            } else {
                verdicts.admissions.push(Admission { limit: call.limit, base: call.base.clone(), at });
            }
        }
        if rejected {
            verdicts.leases.clear();
        }
        verdicts
    }
}

/// A window's reply fields as a standing of `limit`.
fn standing(limit: LimitId, window: usize, f: &[u64]) -> Standing {
    let t = Duration::from_nanos(f[1]);
    let outcome = match (f[0], t.is_zero()) {
        (1, true) => Outcome::Passed,
        (1, false) => Outcome::Delayed(t),
        _ => Outcome::Rejected(t),
    };
    Standing {
        limit,
        window,
        outcome,
        remaining: f[2],
        reset: Duration::from_nanos(f[3]),
        excess: f[4] as f64 / 1000.0,
        banned: f[5] == 1,
    }
}
