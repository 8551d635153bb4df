//! One request's limit decision, end to end, read top to bottom in this file.
//!
//! 1. Overrides and allow-lists pick the limits that decide the request (`choose`).
//! 2. A one-unit request for a key the near-cache knows Redis refuses one unit is refused
//!    at once, as Redis would; heavier requests ask Redis (their wait is longer). A
//!    request for a key whose global concurrency limit has requests waiting here for its
//!    slots (a queue) is refused by it at once, to wait behind them (`behind_waiters`).
//! 3. The local limits decide, all or nothing (`check_chosen`): every shard of every
//!    limit locked in one order, the clock read once, a rejection stores nothing. A
//!    local rejection costs Redis nothing.
//! 4. One `Store::decide` call decides every global limit. If one rejects, the local
//!    admissions of step 3 are taken back (`undo`): no quota is spent anywhere.
//! 5. If Redis fails or the breaker is open, each global limit's `on_store_error` decides
//!    (`fall_back`): `allow` admits, `deny` refuses with 503, `local` asks the limit's
//!    local twin (its rate and capacity divided by `instances`), all or nothing with step
//!    3. Each Redis answer in step 4 sets the twin to its share of what Redis said is left
//!    (`hear`), so a fallback goes on from there rather than from a fresh key.
//! 6. A pass carries its receipts (`Permits`, `Pending`) until the response is done.
//!
//! A limit refuses only if it `refuses`: over a limit in dry run or with `action:
//! annotate`, a request stores nothing there and passes; a passed request's results are
//! marked where a soft limit annotates it (`annotate`), for the proxy to tell the upstream.
//!
//! `limit` holds the local state, `store` speaks to Redis; both read the gate's `Clock`.

mod receipt;
#[cfg(test)]
mod tests;

use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use http::StatusCode;
use smallvec::{SmallVec, smallvec};

use crate::clock::{Clock, Nanos};
use crate::config::{Config, LimitId};
use crate::limit::adaptive::Since;
use crate::limit::algorithm::Held;
use crate::limit::queue::{Handed, Queued};
use crate::limit::secret::KeySecret;
use crate::limit::table::Shard;
use crate::limit::{LimitResult, Limiter, Limiters, Outcome, Standing, Verdict};
use crate::policy::key::{KeyHash, KeySource};
use crate::policy::{LimitUse, OnMissingKey, OnStoreError, Scope};
use crate::store::{Admissions, Call, Store, StoreError, Verdicts, near_key};
pub use receipt::{Charges, Pending, Permits};
use receipt::{HeldLease, Refundable, Slot};

/// `Retry-After` of a request refused because Redis cannot answer (`on_store_error: deny`).
const DENIED_RETRY_AFTER: Duration = Duration::from_secs(1);

/// What each limit that decided a request made of it, one result per limit.
pub type Results = SmallVec<[LimitResult; 2]>;
/// Where each window of those limits stands, by limit and window (the `RateLimit` fields).
pub type Standings = SmallVec<[Standing; 2]>;
/// The limits that decide a request, as `Gate::choose` picks them.
type Chosen = SmallVec<[LimitUse; 2]>;

/// What the limits of a route make of a request. A rejection is an outcome, not an error.
pub enum Decision {
    /// Go on after `wait` (zero for most requests), holding `permits` until the
    /// response is done, and settling `pending` with the response's status. The local
    /// limits decided at `at`.
    Pass { wait: Duration, results: Results, standings: Standings, permits: Permits, pending: Pending, at: Nanos },
    /// Answer `status` now; `limit` is the enforced
    /// rejecting limit that would admit the request last, after `retry_after`. With a
    /// `store_error`, no limit refused it: Redis could not decide global limit `limit`,
    /// whose `on_store_error: deny` refuses (503; `results` and `standings` are empty).
    Reject {
        limit: LimitId,
        status: StatusCode,
        retry_after: Duration,
        results: Results,
        standings: Standings,
        store_error: Option<Box<str>>,
    },
}

impl Decision {
    /// This refusal by `limit`, which waited in its queue (or could not), refused after
    /// `expected`, as the queue expects a slot.
    pub fn refused_after(&mut self, limit: LimitId, expected: Duration) {
        if let Decision::Reject { retry_after, results, .. } = self {
            *retry_after = expected;
            for r in results.iter_mut().filter(|r| r.limit == limit) {
                r.outcome = Outcome::Rejected(expected);
            }
        }
    }

    /// One result per limit that decided the request.
    pub fn results(&self) -> &[LimitResult] {
        match self {
            Decision::Pass { results, .. } | Decision::Reject { results, .. } => results,
        }
    }
}

/// What one limit of a route becomes for a request (`Gate::choice`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    /// The limit that decides it: the route's, or the one an override names.
    pub used: LimitUse,
    /// An override of the route's limit matched.
    pub overridden: bool,
    /// The deciding limit's allow-list exempts the request.
    pub exempt: bool,
}

/// Where a configuration's requests are decided: its limits' local state, the Redis
/// store of its global limits, and the clock both read.
pub struct Gate {
    limiters: Arc<Limiters>,
    /// Where global limits are decided (`None`: every limit is local).
    store: Option<Arc<Store>>,
    clock: Clock,
}

impl Gate {
    /// The gate of `config`, every key fresh, reading the time from `clock`
    /// (`Clock::System` in production; a `ManualClock` to decide on a virtual timeline).
    /// With global limits, this connects to Redis in the background (call within a Tokio
    /// runtime).
    pub fn new(config: &Config, clock: Clock) -> Gate {
        Gate::keyed(config, clock, KeySecret::draw())
    }

    /// `new`, hashing and digesting keys with `secret` (the state directory's, when
    /// limits persist their state).
    pub fn keyed(config: &Config, clock: Clock, secret: KeySecret) -> Gate {
        let limiters = Limiters::new(config, clock.clone(), secret);
        Gate { limiters, store: Store::new(config, clock.clone()), clock }
    }

    /// The gate of `config`, a reload of `old`'s: see `Limiters::reloaded` for what is
    /// kept (`also`: a promoted candidate's gate, whose state is taken where `old` has
    /// none to give). Returns the names of the limits that kept their state, and of those
    /// that start fresh.
    pub fn reloaded(config: &Config, old: &Gate, also: Option<&Gate>) -> (Gate, Vec<String>, Vec<String>) {
        let (limiters, kept, fresh) = Limiters::reloaded(config, &old.limiters, also.map(|g| &*g.limiters));
        let gate = Gate { limiters, store: Store::new(config, old.clock.clone()), clock: old.clock.clone() };
        (gate, kept, fresh)
    }

    pub fn limiters(&self) -> &Arc<Limiters> {
        &self.limiters
    }

    /// The Redis store of global limits, if any.
    pub fn store(&self) -> Option<&Arc<Store>> {
        self.store.as_ref()
    }

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Decides the request `src`, weighing `cost` units (≥ 1, and no more than every
    /// limit's `capacity`), against `limits` (a route's, ascending by limit, each with the
    /// route's own burst if it gives one), local and global. The request path's one call.
    pub async fn decide(&self, limits: &[LimitUse], src: &KeySource<'_>, cost: u64) -> Decision {
        let Some(store) = &self.store else { return self.check(limits, src, cost) };
        self.decide_chosen(store, self.choose(limits, src, true), src, cost).await
    }

    /// The limit whose queue the refusal `decision` may wait in: the one limit that
    /// refuses it is a concurrency limit with a queue (a request another limit refuses
    /// too is refused at once, as it would be after waiting; one refused because Redis
    /// could not answer is refused as its `on_store_error` says).
    pub fn queue_of(&self, decision: &Decision) -> Option<LimitId> {
        let Decision::Reject { limit, results, store_error: None, .. } = decision else { return None };
        self.limiters.get(*limit).queue.as_ref()?;
        let refusing = |r: &&LimitResult| r.outcome.is_rejected() && self.limiters.get(r.limit).refuses;
        (results.iter().filter(refusing).count() == 1).then_some(*limit)
    }

    /// Brings the request `src` that limit `limit` refused (`queue_of`) to that limit's
    /// queue (`limits`: its route's, as `decide` was given them; `priority`: its route's
    /// class). A global limit's waiters here are handed the slots this instance's
    /// requests give back; the first to wait for a key's slots starts asking Redis for
    /// those given back elsewhere (`ask_for_slots`).
    pub fn queue(&self, limits: &[LimitUse], src: &KeySource<'_>, limit: LimitId, priority: Option<&str>) -> Queued {
        let used = self.choose(limits, src, false).into_iter().find(|u| u.limit == limit);
        let count = used.and_then(|u| u.count);
        let Some(store) = self.store.as_ref().filter(|store| store.is_global(limit)) else {
            return self.limiters.queue(limit, src, count, priority, false);
        };
        let queued = self.limiters.queue(limit, src, count, priority, true);
        if let Queued::Waiting(_) = &queued
            && let Some(key) = self.limiters.key_hash(limit, src)
            && let Some((asker, every)) = self.limiters.start_asking(limit, key)
        {
            let burst = used.and_then(|u| u.burst);
            let (hash, _) = self.limiters.get(limit).key.global_any(src);
            let (base, near) = (store.base(limit, hash), near_key((hash >> 64) as u64, burst, count));
            let call = Call { limit, burst, count, base, near };
            let asking = Asking { limiters: Arc::clone(&self.limiters), call, key, asker, every };
            tokio::spawn(ask_for_slots(Arc::clone(store), asking));
        }
        queued
    }

    /// `decide` of the limits `chosen` for `src`: through Redis if the gate has it.
    async fn decide_unchosen(&self, chosen: Chosen, src: &KeySource<'_>, cost: u64) -> Decision {
        match &self.store {
            Some(store) => self.decide_chosen(store, chosen, src, cost).await,
            None => self.check_chosen::<false>(&chosen, src, cost),
        }
    }

    /// Decides, as `decide` does, a request that waited in a queue and was `handed` a slot
    /// of that queue's limit: its other limits decide it now (they may refuse it, and the
    /// slot goes on to the next waiter); passed, it holds the slot with its others, and
    /// the queue's limit says it was delayed `waited`. Handed nothing, its wait in a
    /// global limit's queue ended because Redis could not answer (`QueueEnd::StoreError`):
    /// all its limits decide it again, so their `on_store_error` do unless Redis answers.
    pub async fn decide_holding(
        &self,
        limits: &[LimitUse],
        src: &KeySource<'_>,
        cost: u64,
        handed: Option<Handed>,
        waited: Duration,
    ) -> Decision {
        // (Its keys' own counts were tallied when it was first decided.)
        let mut chosen = self.choose(limits, src, false);
        chosen.retain(|u| handed.as_ref().is_none_or(|handed| u.limit != handed.limit));
        let decision = self.decide_unchosen(chosen, src, cost).await;
        let Some(handed) = handed else { return decision };
        let Decision::Pass { wait, mut results, standings, mut permits, pending, at } = decision else {
            return decision;
        };
        let outcome = Outcome::Delayed(waited);
        let standing = Standing {
            limit: handed.limit,
            window: 0,
            outcome,
            remaining: 0,
            reset: Duration::ZERO,
            excess: 0.0,
            banned: false,
        };
        let at_limit = results.partition_point(|r| r.limit < handed.limit);
        results.insert(at_limit, LimitResult::fold(handed.limit, handed.key, &[standing]));
        permits.hold(handed);
        Decision::Pass { wait, results, standings, permits, pending, at }
    }

    /// `decide` of the limits `chosen` for `src`, some of them global (`store`'s).
    async fn decide_chosen(&self, store: &Arc<Store>, chosen: Chosen, src: &KeySource<'_>, cost: u64) -> Decision {
        let (global, local): (Chosen, Chosen) = chosen.into_iter().partition(|u| store.is_global(u.limit));
        let calls: SmallVec<[Call; 2]> = global
            .iter()
            .filter_map(|&LimitUse { limit, burst, count }| {
                let (hash, present) = self.limiters.get(limit).key.global_any(src);
                if !present {
                    self.limiters.missed(limit, src);
                    if self.limiters.get(limit).on_missing_key != OnMissingKey::Shared {
                        return None;
                    }
                }
                let (base, near) = (store.base(limit, hash), near_key((hash >> 64) as u64, burst, count));
                Some(Call { limit, burst, count, base, near })
            })
            .collect();
        if cost == 1
            && let Some(refused) = self.near_refused(store, &calls, src)
        {
            return refused;
        }
        if let Some(behind) = self.behind_waiters(&calls, src) {
            return behind;
        }
        let first = self.check_chosen::<false>(&local, src, cost);
        if calls.is_empty() || matches!(first, Decision::Reject { .. }) {
            return first;
        }
        match store.decide(&calls, cost, None).await {
            Ok(verdicts) => self.with_global(first, &local, &calls, verdicts, store, src, cost),
            Err(e) => self.fall_back(first, &calls, store, src, cost, &e),
        }
    }

    /// Decides the request `src` as `decide` does, but all locally (a global limit by its
    /// local twin, as if Redis could not answer and its `on_store_error` were `local`), at
    /// the gate's clock's time: what a replay on a `ManualClock` calls, one request at a
    /// time. Concurrency slots are held until the returned `Permits` drop.
    pub fn check(&self, limits: &[LimitUse], src: &KeySource<'_>, cost: u64) -> Decision {
        if limits.iter().all(|u| self.limiters.get(u.limit).plain) {
            return self.check_chosen::<false>(limits, src, cost);
        }
        self.check_chosen::<false>(&self.choose(limits, src, true), src, cost)
    }

    /// What `check` would decide for `src` now, from the limits' state as it is, but
    /// storing nothing: no quota spent, no ban started (a rejection that would start one
    /// says how long it would be), no slot taken, no key touched. What `explain` asks of
    /// the live tables.
    pub fn preview(&self, limits: &[LimitUse], src: &KeySource<'_>, cost: u64) -> Decision {
        self.check_chosen::<true>(&self.choose(limits, src, false), src, cost)
    }

    /// The limits of `limits` (overrides and allow-lists applied, as `choose` picks them)
    /// whose key `src` lacks: those that count it as `on_missing_key` says, in
    /// `sluicegate_limit_missing_key_total`, when they decide it.
    pub fn missing_keys<'a>(
        &'a self,
        limits: &[LimitUse],
        src: &'a KeySource<'_>,
    ) -> impl Iterator<Item = LimitId> + 'a {
        self.logged(limits, src).0.into_iter()
    }

    /// What a request's log line says of its limits: those whose key it lacks
    /// (`missing_keys`), and those it is decided with its key's own count by (`limit_from`),
    /// with that count; counted nowhere.
    pub fn logged(&self, limits: &[LimitUse], src: &KeySource<'_>) -> (Vec<LimitId>, Vec<(LimitId, u64)>) {
        let chosen = self.choose(limits, src, false);
        let missing = chosen.iter().map(|u| u.limit).filter(|&l| !self.limiters.get(l).key.present(src)).collect();
        let own = chosen.iter().filter_map(|u| Some((u.limit, u.count?))).collect();
        (missing, own)
    }

    /// The limits that decide `src`: `limits` with overrides applied (an override's
    /// limit with its own burst; sorted again, so that locks are still taken in ascending
    /// order), less those whose allow-list exempts it. A limit both listed by the route
    /// and reached through an override decides once, with the route's entry (its own
    /// burst, if it gives one). Each with its key's own count, if it has one (`tally`:
    /// counted in the limit's tenant metrics, as a request decided, not previewed).
    fn choose(&self, limits: &[LimitUse], src: &KeySource<'_>, tally: bool) -> Chosen {
        let mut chosen = Chosen::new();
        let mut swapped = false;
        for &used in limits {
            let choice = self.choice(used, src, tally);
            swapped |= choice.overridden;
            if !choice.exempt {
                chosen.push(choice.used);
            }
        }
        if swapped {
            // An override's use has no burst of its own: a route's entry with one sorts
            // first, and is the one kept.
            chosen.sort_unstable_by_key(|u| (u.limit, u.burst.is_none()));
            chosen.dedup_by_key(|u| u.limit);
        }
        chosen
    }

    /// What becomes of `used`, one limit of a route, for `src`: the limit its first
    /// matching override names decides instead (with that limit's own burst), and that
    /// limit's allow-list may exempt the request.
    pub fn choice(&self, used: LimitUse, src: &KeySource<'_>, tally: bool) -> Choice {
        let over = self.limiters.get(used.limit).overrides.iter().find(|(m, _)| m.admits(src));
        let mut used = over.map_or(used, |&(_, other)| LimitUse::plain(other));
        let limiter = self.limiters.get(used.limit);
        let exempt = !limiter.allow.is_empty() && limiter.allow.admits(src);
        if let Some(tenant) = &limiter.tenant
            && !exempt
        {
            used.count = self.limiters.key_found(used.limit, src).0.and_then(|key| {
                let counted = tenant.set.count(&tenant.from, key, src, tally)?;
                Some(counted.count)
            });
        }
        Choice { used, overridden: over.is_some(), exempt }
    }

    /// The near-cache's refusal of a one-unit request by the longest-refused global limit
    /// that refuses, if any: what Redis answered, with the times counted down since.
    fn near_refused(&self, store: &Store, calls: &[Call], src: &KeySource<'_>) -> Option<Decision> {
        let now = self.clock.now();
        let (limit, known) = calls
            .iter()
            .filter(|c| self.limiters.get(c.limit).refuses)
            .filter_map(|c| Some((c.limit, store.near_refused(c, now)?)))
            .max_by_key(|&(_, known)| known.until)?;
        let left = |at: u64| Nanos(at).since(now);
        let status = self.limiters.get(limit).status;
        Some(self.refusal(limit, src, known.window, status, left(known.until), left(known.reset)))
    }

    /// The refusal of a request by a global concurrency limit whose queue has requests
    /// waiting here for its key's slots, if one has: it queues behind them without asking
    /// Redis, as a newcomer does behind a local limit's waiters (else it would take a slot
    /// freed elsewhere before the room's asker could hand it to the oldest).
    fn behind_waiters(&self, calls: &[Call], src: &KeySource<'_>) -> Option<Decision> {
        let call = calls.iter().find(|c| {
            let limiter = self.limiters.get(c.limit);
            limiter.queue.is_some() && limiter.refuses && self.limiters.has_waiters(c.limit, src)
        })?;
        let limiter = self.limiters.get(call.limit);
        let wait = self.limiters.max_wait(call.limit).unwrap_or_default();
        Some(self.refusal(call.limit, src, 0, limiter.status, wait, Duration::ZERO))
    }

    /// Decides `src` against the `chosen` limits, all local. The clock is read once every
    /// lock is held: read earlier, a request delayed on its way to the lock could find a
    /// later instant already stored by another thread and count the difference as excess.
    /// `PREVIEW` decides the same way and changes nothing (`preview`).
    #[inline]
    fn check_chosen<const PREVIEW: bool>(&self, chosen: &[LimitUse], src: &KeySource<'_>, cost: u64) -> Decision {
        // Every shard in one order for every request: limit by limit, each limit's
        // windows in order, then its bans.
        // (Built in place: moving these groups around costs more than deciding them.)
        let mut groups: SmallVec<[Group<'_>; 2]> = SmallVec::new();
        for &LimitUse { limit, burst, count } in chosen {
            let limiter = self.limiters.get(limit);
            let (key, present) = self.limiters.key_found(limit, src);
            if !present && !PREVIEW {
                self.limiters.missed(limit, src);
            }
            let Some(key) = key else { continue };
            let (burst, count) = (limiter.burst(burst), limiter.count(count));
            let shards = limiter.windows.iter().map(|algorithm| algorithm.lock_as(key, burst, count)).collect();
            let bans = limiter.bans.as_ref().map(|bans| bans.lock(key.0));
            groups.push(Group { limit, limiter, key, count, shards, bans, admits: SmallVec::new(), rejects: false });
        }
        let now = self.clock.now();
        let mut standings = Standings::new();
        let mut results = Results::new();
        for group in &mut groups {
            let first = standings.len();
            group.decide(now, cost, &mut standings);
            group.ban_if_rejected::<PREVIEW>(now, &mut standings[first..]);
            results.push(LimitResult::fold(group.limit, group.key, &standings[first..]));
        }
        if let Some(rejection) = self.rejection(&results) {
            // A refusal counts as use in every table that holds the key (rank only, no
            // state), so a flood of fresh keys cannot push the refused key out.
            let mut first = 0;
            for group in &mut groups {
                let windows = group.shards.len();
                group.restate(now, &mut standings[first..first + windows]);
                if !PREVIEW {
                    group.refuse(now);
                }
                first += windows;
            }
            return self.reject(rejection, results, standings);
        }

        let mut wait = Duration::ZERO;
        let mut permits = Permits::default();
        let mut pending = Pending { cost, ..Pending::default() };
        for group in &mut groups {
            // A limit that does not refuse (dry run, annotate) and is over in any of its
            // windows keeps all of its state, as a refused request leaves it.
            if group.rejects {
                continue;
            }
            let (limit, key, count, dry_run) = (group.limit, group.key, group.count, group.limiter.dry_run);
            for (shard, admit) in group.shards.iter_mut().zip(&group.admits) {
                if !dry_run {
                    wait = wait.max(Duration::from_nanos(admit.wait));
                }
                if PREVIEW {
                    continue;
                }
                shard.store(key, admit.state, now, cost);
                if let Held::Concurrency(..) = shard {
                    permits.limiters.get_or_insert_with(|| Arc::clone(&self.limiters));
                    permits.slots.push(Slot { limit, key, since: Some(Since::at(now)) });
                }
            }
            if group.limiter.settles_after() && !PREVIEW {
                pending.limiters.get_or_insert_with(|| Arc::clone(&self.limiters));
                pending.admissions.push(Refundable { limit, key, at: now, count });
            }
        }
        if self.limiters.annotating {
            // Local tables: a global limit's twin decides with its share.
            let tuned = |l| chosen.iter().find(|u| u.limit == l).map_or((None, None), |u| (u.burst, u.count));
            self.annotate(&mut results, &standings, tuned, None);
        }
        Decision::Pass { wait, results, standings, permits, pending, at: now }
    }

    /// Marks the `results` of a passed request whose limits annotate it (their windows at
    /// `standings`; `tuned`: a limit's route's own burst and its key's own count), as `Limiter::annotates` says; `share`:
    /// how many share each window's capacity (`None`: the limit's local twin's own share).
    fn annotate(
        &self,
        results: &mut [LimitResult],
        standings: &[Standing],
        tuned: impl Fn(LimitId) -> (Option<crate::policy::Burst>, Option<u64>),
        share: Option<u64>,
    ) {
        for r in results.iter_mut() {
            let limiter = self.limiters.get(r.limit);
            let windows = standings.iter().position(|s| s.limit == r.limit).map_or(&[][..], |first| {
                let len = standings[first..].iter().take_while(|s| s.limit == r.limit).count();
                &standings[first..first + len]
            });
            r.annotated = limiter.annotates(r.outcome, windows, tuned(r.limit), share.unwrap_or(limiter.share()));
        }
    }

    /// The local decision `first` (a pass, by the `local` limits) joined with what Redis
    /// decided of `calls`.
    #[allow(clippy::too_many_arguments)]
    fn with_global(
        &self,
        first: Decision,
        local: &[LimitUse],
        calls: &[Call],
        verdicts: Verdicts,
        store: &Arc<Store>,
        src: &KeySource<'_>,
        cost: u64,
    ) -> Decision {
        let Decision::Pass { wait, mut results, mut standings, mut permits, mut pending, at } = first else {
            return first;
        };
        if verdicts.rejected {
            self.undo(&results, cost, at);
            self.restate(&results, local, &mut standings);
        }
        let mut global = self.fold_global(&verdicts.standings, src);
        self.hear(&verdicts, &global, calls);
        if self.limiters.annotating {
            // Redis's standings count the whole capacity.
            let tuned = |l| calls.iter().find(|c| c.limit == l).map_or((None, None), |c| (c.burst, c.count));
            self.annotate(&mut global, &verdicts.standings, tuned, Some(1));
        }
        let global_wait = global
            .iter()
            .filter(|r| !self.limiters.get(r.limit).dry_run)
            .filter_map(|r| match r.outcome {
                Outcome::Delayed(wait) => Some(wait),
                _ => None,
            })
            .max()
            .unwrap_or_default();
        results.extend(global);
        results.sort_by_key(|r| r.limit);
        standings.extend(verdicts.standings);
        standings.sort_by_key(|s| (s.limit, s.window));
        if let Some(rejection) = self.rejection(&results) {
            return self.reject(rejection, results, standings);
        }
        permits.leases = (verdicts.leases.into_iter())
            .map(|lease| {
                let key = results.iter().find(|r| r.limit == lease.limit()).map_or(KeyHash(0), |r| r.key);
                HeldLease { key, lease }
            })
            .collect();
        if permits.leases.iter().any(|held| self.limiters.get(held.lease.limit()).queue.is_some()) {
            // (Its leases are handed to the requests waiting for them.)
            permits.limiters.get_or_insert_with(|| Arc::clone(&self.limiters));
        }
        let counted: SmallVec<_> =
            verdicts.admissions.into_iter().filter(|a| self.limiters.get(a.limit).settles_after()).collect();
        if !counted.is_empty() {
            pending.limiters.get_or_insert_with(|| Arc::clone(&self.limiters));
            pending.global = Some(Box::new(Admissions { store: Arc::clone(store), list: counted }));
        }
        Decision::Pass { wait: wait.max(global_wait), results, standings, permits, pending, at }
    }

    /// One result per global limit, from Redis's standings (grouped by limit, in call
    /// order), with the key its local twin knows the request by.
    fn fold_global(&self, standings: &[Standing], src: &KeySource<'_>) -> Results {
        standings
            .chunk_by(|a, b| a.limit == b.limit)
            .map(|windows| {
                let limit = windows[0].limit;
                // A global limit is asked only for requests that have its key.
                let key = self.limiters.key_hash(limit, src).unwrap_or(KeyHash(0));
                LimitResult::fold(limit, key, windows)
            })
            .collect()
    }

    /// Keeps the local twins of `on_store_error: local` limits where Redis says the key
    /// stands, each with its share (`remaining / instances`): if Redis then fails, the
    /// twin goes on from there, not from a fresh key's full share.
    fn hear(&self, verdicts: &Verdicts, global: &[LimitResult], calls: &[Call]) {
        let now = self.clock.now();
        for s in &verdicts.standings {
            let limiter = self.limiters.get(s.limit);
            let Scope::Global { on_store_error: OnStoreError::Local, instances } = limiter.scope else { continue };
            let Some(key) = global.iter().find(|r| r.limit == s.limit).map(|r| r.key) else { continue };
            // Redis counted the units left under the route's own burst, if it has one.
            let call = calls.iter().find(|c| c.limit == s.limit);
            let burst = limiter.burst(call.and_then(|c| c.burst));
            let count = limiter.count(call.and_then(|c| c.count));
            // (A window that admitted a request another limit refused says where the key
            // stands without it.)
            limiter.windows[s.window].lock_as(key, burst, count).hear(key, s.remaining / instances, now);
        }
    }

    /// Decides the global limits of `calls` by their `on_store_error`, after `first` (a
    /// pass) decided the local ones.
    fn fall_back(
        &self,
        first: Decision,
        calls: &[Call],
        store: &Store,
        src: &KeySource<'_>,
        cost: u64,
        error: &StoreError,
    ) -> Decision {
        let Decision::Pass { wait, mut results, mut standings, mut permits, mut pending, at } = first else {
            return first;
        };
        let mut local = Chosen::new();
        let mut denied = None;
        for call in calls {
            let limiter = self.limiters.get(call.limit);
            let Scope::Global { on_store_error, .. } = limiter.scope else { continue };
            store.fell_back(on_store_error, error);
            match on_store_error {
                OnStoreError::Allow => {}
                OnStoreError::Deny if limiter.refuses => denied = Some(call.limit),
                OnStoreError::Deny => {}
                OnStoreError::Local => local.push(LimitUse { limit: call.limit, burst: call.burst, count: call.count }),
            }
        }
        if let Some(limit) = denied {
            self.undo(&results, cost, at);
            return Decision::Reject {
                limit,
                status: StatusCode::SERVICE_UNAVAILABLE,
                retry_after: DENIED_RETRY_AFTER,
                results: Results::new(),
                standings: Standings::new(),
                store_error: Some(error.to_string().into()),
            };
        }
        if local.is_empty() {
            return Decision::Pass { wait, results, standings, permits, pending, at };
        }
        match self.check_chosen::<false>(&local, src, cost) {
            rejection @ Decision::Reject { .. } => {
                self.undo(&results, cost, at);
                rejection
            }
            Decision::Pass { wait: w, results: r, standings: s, permits: p, pending: q, .. } => {
                results.extend(r);
                results.sort_by_key(|r| r.limit);
                standings.extend(s);
                standings.sort_by_key(|s| (s.limit, s.window));
                permits.absorb(p);
                pending.absorb(q);
                Decision::Pass { wait: wait.max(w), results, standings, permits, pending, at }
            }
        }
    }

    /// The limit that refuses, if one does (neither in dry run nor annotating): the one
    /// that would admit last.
    fn rejection(&self, results: &[LimitResult]) -> Option<(LimitId, Duration)> {
        results
            .iter()
            .filter(|r| self.limiters.get(r.limit).refuses)
            .filter_map(|r| match r.outcome {
                Outcome::Rejected(after) => Some((r.limit, after)),
                _ => None,
            })
            .max_by_key(|&(_, after)| after)
    }

    /// The rejection of a request by `limit`, with the results and standings of all its
    /// limits (those of windows that would have admitted it say where the key stands, as
    /// the request did not count).
    fn reject(&self, (limit, retry_after): (LimitId, Duration), results: Results, standings: Standings) -> Decision {
        let status = self.limiters.get(limit).status;
        Decision::Reject { limit, status, retry_after, results, standings, store_error: None }
    }

    /// Takes back every admission of a passed decision (its `results`, decided at `at`):
    /// another part of the request's limits refused it after all.
    fn undo(&self, results: &[LimitResult], cost: u64, at: Nanos) {
        for r in results.iter().filter(|r| !r.outcome.is_rejected()) {
            for window in self.limiters.get(r.limit).windows.iter() {
                window.lock(r.key).refund(r.key, cost, at);
            }
        }
    }

    /// Sets the `standings` of local windows that admitted a request whose admissions
    /// were then taken back (`undo`) to where their keys stand (under the bursts `local`
    /// gives them): the request did not count.
    fn restate(&self, results: &[LimitResult], local: &[LimitUse], standings: &mut [Standing]) {
        let now = self.clock.now();
        for s in standings.iter_mut().filter(|s| !s.outcome.is_rejected()) {
            let Some(r) = results.iter().find(|r| r.limit == s.limit) else { continue };
            let limiter = self.limiters.get(s.limit);
            let used = local.iter().find(|u| u.limit == s.limit);
            let (burst, count) = (limiter.burst(used.and_then(|u| u.burst)), limiter.count(used.and_then(|u| u.count)));
            let (remaining, reset) = limiter.windows[s.window].lock_as(r.key, burst, count).stands(r.key, now);
            s.remaining = remaining;
            s.reset = Duration::from_nanos(reset);
        }
    }

    /// A refusal of `src` by `window` of `limit` alone, decided without asking Redis:
    /// with `status`, for `after`, no unit left, the full quota back after `reset`.
    fn refusal(
        &self,
        limit: LimitId,
        src: &KeySource<'_>,
        window: usize,
        status: StatusCode,
        after: Duration,
        reset: Duration,
    ) -> Decision {
        let outcome = Outcome::Rejected(after);
        let standing = Standing { limit, window, outcome, remaining: 0, reset, excess: 0.0, banned: false };
        let key = self.limiters.key_hash(limit, src).unwrap_or(KeyHash(0));
        let results = smallvec![LimitResult::fold(limit, key, &[standing])];
        Decision::Reject {
            limit,
            status,
            retry_after: after,
            results,
            standings: smallvec![standing],
            store_error: None,
        }
    }
}

/// Who asks Redis for a global limit's slots for the requests waiting here for those of
/// one key (`ask_for_slots`).
struct Asking {
    limiters: Arc<Limiters>,
    /// The call that asks for a slot of the key.
    call: Call,
    /// The key's room, and the asker's id there.
    key: KeyHash,
    asker: u64,
    every: Duration,
}

/// Asks Redis, every `every`, for a slot of the global limit of `call` for the requests
/// waiting here for the slots of `key`, while any wait: one asker per room, not one per
/// waiter (Redis's load would grow with the queue), asking on at a tick while Redis grants
/// slots and requests wait, then until the next tick. A slot granted is handed to the next
/// of them in the room's order, or given back if none waits any more. The slots this
/// instance's requests give back are handed on without asking (`Permits`); those given
/// back elsewhere, or lapsed, reach the waiters only so. Redis failing ends every wait:
/// each request is decided again (`Gate::decide_holding`, handed nothing).
async fn ask_for_slots(store: Arc<Store>, asking: Asking) {
    let Asking { limiters, call, key, asker, every } = asking;
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        // At each tick, as many slots as Redis grants while requests wait: several may
        // have been freed since the last.
        loop {
            if !limiters.keep_asking(call.limit, key, asker) {
                return;
            }
            match store.decide(std::slice::from_ref(&call), 1, None).await {
                Ok(mut verdicts) => match verdicts.leases.pop() {
                    Some(lease) => drop(limiters.give_back_lease(call.limit, key, Box::new(lease))),
                    None => break,
                },
                Err(_) => {
                    limiters.ask_again(call.limit, key);
                    return;
                }
            }
        }
    }
}

/// One limit's part in a local decision: its key, its shards locked for the key (one per
/// window, then its bans), and what its windows decided once the clock was read.
struct Group<'a> {
    limit: LimitId,
    limiter: &'a Limiter,
    key: KeyHash,
    /// The key's own count, as its local state decides (`limit_from`).
    count: Option<u64>,
    /// In window order.
    shards: SmallVec<[Held<'a>; 1]>,
    bans: Option<MutexGuard<'a, Shard>>,
    /// What each window would store, in window order, unless one of them rejects.
    admits: SmallVec<[Admit; 1]>,
    /// Some window of this limit rejects the request (or its key is banned).
    rejects: bool,
}

/// A window's admission: the state to store, and the wait it asks for (ns).
struct Admit {
    state: u64,
    wait: u64,
}

impl Group<'_> {
    /// Decides each window at `now`, adding its standing to `standings`: a banned key is
    /// refused for the time its ban has left, whatever the algorithm says.
    #[inline]
    fn decide(&mut self, now: Nanos, cost: u64, standings: &mut SmallVec<[Standing; 2]>) {
        let left = match (&self.limiter.bans, &self.bans) {
            (Some(bans), Some(shard)) => bans.left(shard, self.key.0, now.0),
            _ => None,
        };
        for (window, shard) in self.shards.iter().enumerate() {
            let verdict = match left {
                Some(left) => Verdict::Reject { retry_after: left, remaining: 0, reset: left, excess: 0.0 },
                None => shard.decide(self.key, now, cost),
            };
            match verdict {
                Verdict::Admit { state, wait, .. } => self.admits.push(Admit { state, wait }),
                Verdict::Reject { .. } => self.rejects = true,
            }
            standings.push(Standing::of(self.limit, window, &verdict));
        }
    }

    /// A rejection by any window of a limit that refuses and bans starts a ban, unless
    /// one runs; the first of the limit's `standings` then says the ban's length.
    /// `PREVIEW`: says so without starting it.
    #[inline]
    fn ban_if_rejected<const PREVIEW: bool>(&mut self, now: Nanos, standings: &mut [Standing]) {
        if !self.limiter.refuses || !self.rejects {
            return;
        }
        let (Some(bans), Some(shard), Some(first)) = (&self.limiter.bans, self.bans.as_mut(), standings.first_mut())
        else {
            return;
        };
        if bans.left(shard, self.key.0, now.0).is_none() {
            let length =
                if PREVIEW { bans.length(shard, self.key.0, now.0) } else { bans.impose(shard, self.key.0, now.0) };
            first.outcome = Outcome::Rejected(Duration::from_nanos(length));
            first.banned = true;
        }
    }

    /// Sets the `standings` of this limit's windows that would have admitted a refused
    /// request to where the key stands, as the request did not count.
    fn restate(&self, now: Nanos, standings: &mut [Standing]) {
        for (shard, s) in self.shards.iter().zip(standings) {
            if !s.outcome.is_rejected() {
                let (remaining, reset) = shard.stands(self.key, now);
                s.remaining = remaining;
                s.reset = Duration::from_nanos(reset);
            }
        }
    }

    /// Counts a refusal as use of the key in each of this limit's tables.
    fn refuse(&mut self, now: Nanos) {
        for shard in self.shards.iter_mut() {
            shard.refuse(self.key, now);
        }
        if let Some(shard) = self.bans.as_mut() {
            shard.refuse(self.key.0, now.0);
        }
    }
}
