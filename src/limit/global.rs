//! A request's local and global limits, decided together, all or nothing.
//!
//! 1. A one-unit request for a key the near-cache knows Redis refuses one unit is refused
//!    at once, as Redis would; heavier requests ask Redis (their wait is longer).
//! 2. The local limits decide (`check`); a local rejection costs Redis nothing.
//! 3. One `Store::decide` call decides every global limit. If one rejects, the local
//!    admissions of step 2 are taken back: no quota is spent anywhere.
//! 4. If Redis fails or the breaker is open, each global limit's `on_store_error` decides:
//!    `allow` admits, `deny` refuses with 503, `local` asks the limit's local twin (its
//!    rate and capacity divided by `instances`), all or nothing with step 2. Each Redis
//!    answer in step 3 sets the twin to its share of what Redis said is left, so a
//!    fallback goes on from there rather than from a fresh key.

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use smallvec::{SmallVec, smallvec};

use super::{Decision, Limiters, Outcome, Standing, now};
use crate::config::{OnStoreError, Scope};
use crate::policy::key::KeySource;
use crate::store::{Admissions, Call, Store, Verdicts};

/// `Retry-After` of a request refused because Redis cannot answer (`on_store_error: deny`).
const DENIED_RETRY_AFTER: Duration = Duration::from_secs(1);

impl Limiters {
    /// Decides the request `src`, weighing `cost` units, against `limits` (ascending
    /// indices), local and global.
    pub async fn decide(self: &Arc<Self>, limits: &[usize], src: &KeySource<'_>, cost: u64) -> Decision {
        let Some(store) = &self.store else { return self.check(limits, src, cost, now) };
        let chosen = self.choose(limits, src);
        let (global, local): (SmallVec<[usize; 2]>, SmallVec<[usize; 2]>) =
            chosen.into_iter().partition(|&limit| store.is_global(limit));
        let calls: SmallVec<[Call; 2]> = global
            .iter()
            .filter_map(|&limit| {
                let hash = self.limits[limit].key.global(src)?;
                Some(Call { limit, base: store.base(limit, hash), near: (hash >> 64) as u64 })
            })
            .collect();
        if cost == 1
            && let Some(refused) = self.near_refused(store, &calls)
        {
            return refused;
        }
        let first = self.check_chosen(&local, src, cost, now);
        if calls.is_empty() || matches!(first, Decision::Reject { .. }) {
            return first;
        }
        match store.decide(&calls, cost, None).await {
            Ok(verdicts) => self.with_global(first, verdicts, store, src, cost),
            Err(_) => self.fall_back(first, &calls, store, src, cost),
        }
    }

    /// The near-cache's refusal of a one-unit request by the longest-refused enforced
    /// global limit, if any: what Redis answered, with the times counted down since.
    fn near_refused(&self, store: &Store, calls: &[Call]) -> Option<Decision> {
        let t = now();
        let (limit, known) = calls
            .iter()
            .filter(|c| !self.limits[c.limit].dry_run)
            .filter_map(|c| Some((c.limit, store.near_refused(c, t)?)))
            .max_by_key(|&(_, known)| known.until)?;
        let left = |at: u64| Duration::from_nanos(at.saturating_sub(t));
        Some(refusal(limit, known.window, self.limits[limit].status, left(known.until), left(known.reset)))
    }

    /// The local decision `first` (a pass) joined with what Redis decided.
    fn with_global(
        &self,
        first: Decision,
        verdicts: Verdicts,
        store: &Arc<Store>,
        src: &KeySource<'_>,
        cost: u64,
    ) -> Decision {
        let Decision::Pass { wait, mut standings, mut permits, mut pending, at } = first else { return first };
        if verdicts.rejected {
            self.undo(&standings, src, cost, at);
        }
        self.hear(&verdicts, src, cost);
        let global_wait = verdicts
            .standings
            .iter()
            .filter(|s| !self.limits[s.limit].dry_run)
            .filter_map(|s| match s.outcome {
                Outcome::Delayed(wait) => Some(wait),
                _ => None,
            })
            .max()
            .unwrap_or_default();
        standings.extend(verdicts.standings);
        standings.sort_by_key(|s| (s.limit, s.window));
        if let Some(rejection) = self.rejection(&standings) {
            return self.reject(rejection, standings);
        }
        permits.leases = verdicts.leases;
        let counted: SmallVec<_> =
            verdicts.admissions.into_iter().filter(|a| self.limits[a.limit].counted.is_some()).collect();
        if !counted.is_empty() {
            pending.global = Some(Box::new(Admissions { store: Arc::clone(store), list: counted }));
        }
        Decision::Pass { wait: wait.max(global_wait), standings, permits, pending, at }
    }

    /// Keeps the local twins of `on_store_error: local` limits where Redis says the key
    /// stands, each with its share (`remaining / instances`): if Redis then fails, the
    /// twin goes on from there, not from a fresh key's full share.
    fn hear(&self, verdicts: &Verdicts, src: &KeySource<'_>, cost: u64) {
        let t = now();
        for s in &verdicts.standings {
            let limiter = &self.limits[s.limit];
            let Scope::Global { on_store_error: OnStoreError::Local, instances } = limiter.scope else { continue };
            let Some(key) = limiter.key.hash(src, &self.seed) else { continue };
            // A window that admitted a request another limit refused got its units back.
            let back = if verdicts.rejected && !matches!(s.outcome, Outcome::Rejected(_)) { cost } else { 0 };
            limiter.windows[s.window].lock(key).hear(key, (s.remaining + back) / instances, t);
        }
    }

    /// Decides the global limits of `calls` by their `on_store_error`, after `first` (a
    /// pass) decided the local ones.
    fn fall_back(
        self: &Arc<Self>,
        first: Decision,
        calls: &[Call],
        store: &Store,
        src: &KeySource<'_>,
        cost: u64,
    ) -> Decision {
        let Decision::Pass { wait, mut standings, mut permits, mut pending, at } = first else { return first };
        let mut local: SmallVec<[usize; 2]> = SmallVec::new();
        let mut denied = None;
        for call in calls {
            let limiter = &self.limits[call.limit];
            let Scope::Global { on_store_error, .. } = limiter.scope else { continue };
            store.fell_back(on_store_error);
            match on_store_error {
                OnStoreError::Allow => {}
                OnStoreError::Deny if !limiter.dry_run => denied = Some(call.limit),
                OnStoreError::Deny => {}
                OnStoreError::Local => local.push(call.limit),
            }
        }
        if let Some(limit) = denied {
            self.undo(&standings, src, cost, at);
            return refusal(limit, 0, StatusCode::SERVICE_UNAVAILABLE, DENIED_RETRY_AFTER, DENIED_RETRY_AFTER);
        }
        if local.is_empty() {
            return Decision::Pass { wait, standings, permits, pending, at };
        }
        match self.check_chosen(&local, src, cost, now) {
            rejection @ Decision::Reject { .. } => {
                self.undo(&standings, src, cost, at);
                rejection
            }
            Decision::Pass { wait: w, standings: s, permits: p, pending: q, .. } => {
                standings.extend(s);
                standings.sort_by_key(|s| (s.limit, s.window));
                permits.absorb(p);
                pending.absorb(q);
                Decision::Pass { wait: wait.max(w), standings, permits, pending, at }
            }
        }
    }
}

/// A refusal by `window` of `limit` alone, decided without asking Redis: with `status`,
/// for `after`, no unit left, the full quota back after `reset`.
fn refusal(limit: usize, window: usize, status: StatusCode, after: Duration, reset: Duration) -> Decision {
    let standing =
        Standing { limit, window, outcome: Outcome::Rejected(after), remaining: 0, reset, excess: 0.0, banned: false };
    Decision::Reject { limit, status, retry_after: after, standings: smallvec![standing] }
}
