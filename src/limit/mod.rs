//! Local limit state: each configured limit's algorithms (one per window) with their key
//! tables, and its bans; what one window makes of one request (`Verdict`, `Standing`).
//! A leaf below the decision: `gate` locks and decides these for a request, a reload
//! carries them over by limit name (`LimitName`), the admin API inspects them.

pub mod adaptive;
pub mod algorithm;
pub mod ban;
pub mod concurrency;
pub mod fixed_window;
#[cfg(test)]
pub(crate) mod gcra_cases;
pub mod inspect;
pub mod key_text;
pub mod leaky_bucket;
pub mod queue;
pub mod secret;
mod shards;
pub mod sliding_log;
pub mod sliding_window;
pub mod snapshot;
pub mod table;
pub mod tenant;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::StatusCode;
use typed_index_collections::TiVec;

use crate::clock::{Clock, Nanos};
use crate::config::{Config, Limit, LimitAction};
pub use crate::ids::LimitId;
use crate::policy::allow::Allow;
use crate::policy::charge::Charge;
use crate::policy::key::{KeyHash, KeySource, KeySpec};
use crate::policy::{Burst, OnMissingKey, Policy, Rate, Scope};
use algorithm::Algorithm;
use ban::Bans;
use key_text::KeyText;
use secret::KeySecret;

/// What one limit makes of one request; times in ns.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Verdict {
    /// Store `state`; the request waits `wait`; `remaining` more requests would be
    /// admitted now; the full quota is back in `reset`; `excess` is nginx's excess (in
    /// requests) or the requests in flight, for log lines.
    Admit { state: u64, wait: u64, remaining: u64, reset: u64, excess: f64 },
    /// Nothing changes; the same request would be admitted in `retry_after`; `remaining`
    /// units would still be admitted now (fewer than this request's cost).
    Reject { retry_after: u64, remaining: u64, reset: u64, excess: f64 },
}

/// A limit's identity, which a reload keeps: its name. A limit renamed is a new limit.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LimitName(Arc<str>);

/// One configured limit: its policy and its state.
pub(crate) struct Limiter {
    pub(crate) id: LimitName,
    pub(crate) key: KeySpec,
    /// Requests this limit lets through without counting them.
    pub(crate) allow: Allow,
    /// One algorithm per window (usually one); a request must fit all.
    pub(crate) windows: Box<[Algorithm]>,
    /// Statuses that count: an admission whose response has another is taken back.
    pub(crate) counted: Option<Box<[u16]>>,
    /// What a response reports it cost, debited after it (`charge`).
    pub(crate) charge: Option<Charge>,
    /// Requests matching one are decided by that limit instead.
    pub(crate) overrides: Box<[(Allow, LimitId)]>,
    pub(crate) bans: Option<Bans>,
    pub(crate) status: StatusCode,
    pub(crate) dry_run: bool,
    /// It refuses a request over it: neither in dry run nor annotating (`Limit::refuses`).
    pub(crate) refuses: bool,
    /// When it annotates a request it passes (`None`: never).
    annotates: Option<Annotates>,
    pub(crate) scope: Scope,
    /// Neither overrides, nor an allow-list, nor its keys' own counts: it decides every
    /// request it is listed for, with its own parameters.
    pub(crate) plain: bool,
    pub(crate) on_missing_key: OnMissingKey,
    /// Requests that lacked its key, since start (a reload that keeps the limit keeps it).
    missing: Arc<AtomicU64>,
    /// What its `charge:` debited, since start (kept alike).
    charged: Arc<Charged>,
    /// The instances a global limit's local twin shares it with (1 for a local limit).
    share: u64,
    /// The `max_keys` its tables were made with (a reload that keeps them keeps this).
    max_keys: usize,
    /// Its keys' own counts (`limit_from`), kept by a reload that keeps its name.
    pub(crate) tenant: Option<tenant::Tenant>,
    /// Where a request it has no slot for waits for one (a concurrency limit's `queue:`).
    pub(crate) queue: Option<queue::Queue>,
}

/// When a limit annotates a request (soft limits): over it (`action: annotate`), and from
/// a share of its capacity (`annotate_from`).
struct Annotates {
    over: bool,
    /// The percentage of a window's capacity at or above which a request is annotated.
    from: Option<u64>,
    /// Each window's capacity as configured (`Policy::capacity`; a concurrency limit's
    /// `max`), before a global limit's local twin takes its share.
    full: Box<[u64]>,
}

/// What a limit's `charge:` debited: units, and responses that did not report and were
/// charged the default.
#[derive(Default)]
struct Charged {
    units: AtomicU64,
    defaulted: AtomicU64,
}

/// Every configured limit, indexed like `Config::limits`.
pub struct Limiters {
    /// What keys are hashed and digested with: kept across reloads, and across restarts
    /// when limits persist their state.
    secret: KeySecret,
    /// How keys are written, wherever they are shown.
    text: KeyText,
    limits: TiVec<LimitId, Limiter>,
    /// Some limit annotates: passed requests are looked at for annotations (`Config::annotating`).
    pub(crate) annotating: bool,
    clock: Clock,
}

/// How a request fared with one limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    Delayed(Duration),
    /// With the time after which it would pass.
    Rejected(Duration),
}

/// Where one limit stands for the current request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Standing {
    pub limit: LimitId,
    /// Which of the limit's windows (0 unless it has `rates:`).
    pub window: usize,
    /// As decided, even for a dry-run limit that then did not act on it.
    pub outcome: Outcome,
    /// Further requests this key could make right now without rejection.
    pub remaining: u64,
    /// Until the key's full quota is back.
    pub reset: Duration,
    pub excess: f64,
    /// This request started a ban, as long as its `Rejected` outcome says.
    pub banned: bool,
}

/// Where one window of a limit stands, as the rate-limit header fields tell a client:
/// what a passed request keeps of its `Standing`s until its response is made (32 bytes
/// against 72, in every such request's state).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shown {
    pub limit: LimitId,
    /// Which of the limit's windows.
    pub window: u32,
    pub remaining: u64,
    pub reset: Duration,
}

impl From<&Standing> for Shown {
    fn from(s: &Standing) -> Self {
        Shown { limit: s.limit, window: s.window as u32, remaining: s.remaining, reset: s.reset }
    }
}

impl Outcome {
    #[inline]
    pub fn is_rejected(&self) -> bool {
        matches!(self, Outcome::Rejected(_))
    }
}

/// What one limit made of a request, its windows folded into one: what metrics, log
/// lines, the access log, `simulate` and the taking back of admissions read. (The
/// per-window `Standing`s are kept only for the `RateLimit` header fields.)
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LimitResult {
    pub limit: LimitId,
    /// The request's key for this limit, as its local tables hold it.
    pub key: KeyHash,
    /// Rejected if any window rejected (after the longest of their waits), else delayed
    /// by the longest wait asked, else passed; as decided, even for a dry-run limit.
    pub outcome: Outcome,
    /// This request started a ban, as long as `outcome` says.
    pub banned: bool,
    /// The request, passed, is forwarded with this limit named in `RateLimit-Exceeded`:
    /// over it with `action: annotate`, or at or above its `annotate_from` (as decided,
    /// even for a dry-run limit, which then only says so).
    pub annotated: bool,
    /// The window that decided `outcome` (0 unless the limit has `rates:`).
    pub window: usize,
    /// nginx's excess (or the requests in flight) in that window.
    pub excess: f64,
}

impl LimitResult {
    /// The result of limit `limit` for `key`, from its windows' `standings` (at least one).
    #[inline]
    pub fn fold(limit: LimitId, key: KeyHash, standings: &[Standing]) -> LimitResult {
        let of = |decider: &Standing| LimitResult {
            limit,
            key,
            outcome: decider.outcome,
            banned: decider.banned,
            annotated: false,
            window: decider.window,
            excess: decider.excess,
        };
        if let [one] = standings {
            // Most limits have one window: it decides.
            return of(one);
        }
        let rank = |s: &&Standing| match s.outcome {
            Outcome::Passed => (0, Duration::ZERO),
            Outcome::Delayed(wait) => (1, wait),
            Outcome::Rejected(after) => (2, after),
        };
        // A ban, once started, is what the key's next requests meet: its length decides.
        let banned = standings.iter().find(|s| s.banned);
        let decider = banned.or_else(|| standings.iter().max_by_key(rank)).copied().unwrap_or(Standing {
            limit,
            window: 0,
            outcome: Outcome::Passed,
            remaining: 0,
            reset: Duration::ZERO,
            excess: 0.0,
            banned: false,
        });
        of(&decider)
    }
}

impl Standing {
    /// Where window `window` of limit `limit` stands after deciding `verdict`.
    #[inline]
    pub fn of(limit: LimitId, window: usize, verdict: &Verdict) -> Standing {
        let (outcome, remaining, reset, excess) = match *verdict {
            Verdict::Admit { wait, remaining, reset, excess, .. } => {
                let outcome = if wait > 0 { Outcome::Delayed(Duration::from_nanos(wait)) } else { Outcome::Passed };
                (outcome, remaining, reset, excess)
            }
            Verdict::Reject { retry_after, remaining, reset, excess } => {
                (Outcome::Rejected(Duration::from_nanos(retry_after)), remaining, reset, excess)
            }
        };
        Standing { limit, window, outcome, remaining, reset: Duration::from_nanos(reset), excess, banned: false }
    }
}

impl Limiters {
    /// The limiters of `config`, every key fresh, reading the time from `clock`, hashing
    /// and digesting keys with `secret`.
    pub fn new(config: &Config, clock: Clock, secret: KeySecret) -> Arc<Self> {
        let limits = config.limits.iter().map(limiter).collect();
        let text = KeyText::new(config, Some(&secret.digest));
        Arc::new(Limiters { secret, text, limits, annotating: config.annotating, clock })
    }

    /// The limiters of `config`, a reload of the configuration `old` was made from: a
    /// limit whose identity (name), key and algorithm (and window, for windows) are
    /// unchanged keeps every key's state, bans and requests in flight, with its new
    /// parameters applying from now on; any other starts fresh. Returns the names of both
    /// kinds. `also`: a second source, asked for the limits `old` cannot give their state
    /// (a candidate's, when it is promoted: where it has the only state of a limit).
    pub fn reloaded(config: &Config, old: &Limiters, also: Option<&Limiters>) -> (Arc<Self>, Vec<String>, Vec<String>) {
        let (mut kept, mut fresh) = (Vec::new(), Vec::new());
        let limits = config
            .limits
            .iter()
            .map(|limit| {
                let id = LimitName(Arc::from(limit.name.as_str()));
                let carried = [Some(old), also].into_iter().flatten().find_map(|source| {
                    let before = source.limits.iter().find(|o| o.id == id)?;
                    // A limit that adopted some windows' state but not all starts over.
                    let mut new = limiter(limit);
                    new.carry(before).then_some(new)
                });
                let mut new = match carried {
                    Some(new) => {
                        kept.push(limit.name.clone());
                        new
                    }
                    None => {
                        fresh.push(limit.name.clone());
                        limiter(limit)
                    }
                };
                // The counts the operator gave its keys are kept while it has `limit_from`
                // and the same key.
                let same_key = |o: &&Limiter| o.id == new.id && o.key == new.key;
                let before = old.limits.iter().find(same_key).and_then(|o| o.tenant.as_ref());
                if let (Some(tenant), Some(before)) = (&mut new.tenant, before) {
                    tenant.set = Arc::clone(&before.set);
                }
                new
            })
            .collect();
        let text = KeyText::new(config, Some(&old.secret.digest));
        let limiters = Limiters {
            secret: old.secret.clone(),
            text,
            limits,
            annotating: config.annotating,
            clock: old.clock.clone(),
        };
        (Arc::new(limiters), kept, fresh)
    }

    /// The limiter of `limit`.
    #[inline]
    pub(crate) fn get(&self, limit: LimitId) -> &Limiter {
        &self.limits[limit]
    }

    /// What keys are hashed and digested with.
    pub fn secret(&self) -> &KeySecret {
        &self.secret
    }

    /// The clock every decision of these limits reads.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Bans imposed by `limit` since start.
    pub fn bans(&self, limit: LimitId) -> u64 {
        self.limits[limit].bans.as_ref().map_or(0, Bans::imposed)
    }

    /// Keys banned now by `limit`.
    pub fn bans_active(&self, limit: LimitId) -> usize {
        self.limits[limit].bans.as_ref().map_or(0, |b| b.active(self.clock.now().0))
    }

    /// Requests in flight under `limit`, if it is a concurrency limit (else 0).
    pub fn in_flight(&self, limit: LimitId) -> usize {
        let Some(Algorithm::Concurrency(_, table, _)) = self.limits[limit].windows.first() else { return 0 };
        let mut n = 0u64;
        table.each(|_, in_flight| n += in_flight);
        usize::try_from(n).unwrap_or(usize::MAX)
    }

    /// Keys dropped with live state by `limit` since start. Each window's table
    /// drops keys of its own; a key dropped by several windows counts once: the most any
    /// window dropped (their sum would count one key once per window).
    pub fn evictions(&self, limit: LimitId) -> u64 {
        self.limits[limit].windows.iter().map(Algorithm::evictions).max().unwrap_or(0)
    }

    /// Each limit's id and name.
    pub fn names(&self) -> impl Iterator<Item = (LimitId, &str)> {
        self.limits.iter_enumerated().map(|(id, l)| (id, &*l.id.0))
    }

    /// The most keys `limit` holds: the `max_keys` its tables were made with (a
    /// reload changes it only for a limit that starts fresh).
    pub fn max_keys(&self, limit: LimitId) -> usize {
        self.limits[limit].max_keys
    }

    /// Keys held by `limit` now.
    pub fn keys(&self, limit: LimitId) -> usize {
        self.limits[limit].windows.iter().map(Algorithm::keys).max().unwrap_or(0)
    }

    /// The key of `src` for `limit`, hashed (`None`: the request has none, and the
    /// limit does not count it).
    #[inline]
    pub fn key_hash(&self, limit: LimitId, src: &KeySource<'_>) -> Option<KeyHash> {
        self.key_found(limit, src).0
    }

    /// The key of `src` for `limit` as its tables hold it (`None`: the limit does
    /// not count the request), and whether the request has it: one that lacks it is
    /// counted under the one shared key with `on_missing_key: shared`.
    #[inline]
    pub fn key_found(&self, limit: LimitId, src: &KeySource<'_>) -> (Option<KeyHash>, bool) {
        let limiter = &self.limits[limit];
        let (key, present) = limiter.key.hash_any(src, &self.secret.seed);
        ((present || limiter.on_missing_key == OnMissingKey::Shared).then_some(key), present)
    }

    /// Counts a request `src` that lacks the key of `limit`; the first one since
    /// start is logged at warn (once: a flood of them writes one line), naming the parts.
    pub fn missed(&self, limit: LimitId, src: &KeySource<'_>) {
        let limiter = &self.limits[limit];
        if limiter.missing.fetch_add(1, Ordering::Relaxed) == 0 {
            let parts: Vec<String> = limiter.key.0.iter().map(ToString::to_string).collect();
            let what = match limiter.on_missing_key {
                OnMissingKey::Skip => "not counted by this limit (on_missing_key: skip)",
                OnMissingKey::Shared => "counted under the one key shared by such requests (on_missing_key: shared)",
                OnMissingKey::Refuse => "refused (on_missing_key: refuse)",
            };
            tracing::warn!(limit = %limiter.id.0, key = %self.key_label(limit, src), missing = %parts.join(" "),
                "a first request without this limit's key: {what}; sluicegate_limit_missing_key_total counts them");
        }
    }

    /// Units debited by the `charge:` of `limit`, since start.
    pub fn charged_units(&self, limit: LimitId) -> u64 {
        self.limits[limit].charged.units.load(Ordering::Relaxed)
    }

    /// Responses charged the default by the `charge:` of `limit` (they did not report).
    pub fn charges_defaulted(&self, limit: LimitId) -> u64 {
        self.limits[limit].charged.defaulted.load(Ordering::Relaxed)
    }

    /// Counts a charge of `units` by `limit` (`reported`: the response said so).
    pub(crate) fn count_charge(&self, limit: LimitId, units: u64, reported: bool) {
        let charged = &self.limits[limit].charged;
        charged.units.fetch_add(units, Ordering::Relaxed);
        if !reported {
            charged.defaulted.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Requests that lacked the key of `limit`, since start.
    pub fn missing(&self, limit: LimitId) -> u64 {
        self.limits[limit].missing.load(Ordering::Relaxed)
    }

    /// The counts given the keys of `limit` and their tally, if it has `limit_from`.
    pub fn tenants(&self, limit: LimitId) -> Option<&Arc<tenant::Tenants>> {
        self.limits[limit].tenant.as_ref().map(|t| &t.set)
    }

    /// How keys are written.
    pub fn key_text(&self) -> &KeyText {
        &self.text
    }

    /// The key of `src` for `limit`, as every surface writes it (`KeyText`).
    pub fn key_label(&self, limit: LimitId, src: &KeySource<'_>) -> String {
        self.text.write(&self.limits[limit].key, src)
    }

    /// Names the ban that `src`'s key (hashed: `key`) has just started in `limit`,
    /// so that `GET /bans` writes it as log lines do.
    pub fn name_ban(&self, limit: LimitId, key: KeyHash, src: &KeySource<'_>) {
        if let Some(bans) = &self.limits[limit].bans {
            bans.name(key.0, self.key_label(limit, src), self.clock.now().0);
        }
    }

    /// Takes back an admission of limit `limit` for `key` (decided with the key's own
    /// `count`, if it had one) unless it counts `status`.
    pub(crate) fn settle(&self, limit: LimitId, key: KeyHash, count: Option<u64>, cost: u64, at: Nanos, status: u16) {
        if !self.counts(limit, status) {
            for algorithm in self.limits[limit].windows.iter() {
                algorithm.lock_as(key, None, count).refund(key, cost, at);
            }
        }
    }

    /// Whether limit `limit` counts a response of `status` (`count:`).
    pub(crate) fn counts(&self, limit: LimitId, status: u16) -> bool {
        self.limits[limit].counted.as_ref().is_none_or(|counted| counted.contains(&status))
    }

    /// Debits `units` from `key` in limit `limit` now, after its response (`charge:`);
    /// a negative `units` gives back what the request was admitted with (`instead_of_cost`,
    /// a report below the cost), as a refund of an admission at `at`.
    pub(crate) fn charge(&self, limit: LimitId, key: KeyHash, count: Option<u64>, units: i64, at: Nanos) {
        let now = self.clock.now();
        for algorithm in self.limits[limit].windows.iter() {
            let mut held = algorithm.lock_as(key, None, count);
            match u64::try_from(units) {
                Ok(units) => held.charge(key, units, now),
                Err(_) => held.refund(key, units.unsigned_abs(), at),
            }
        }
    }

    /// Gives back a concurrency slot of limit `limit` held by `key` since `since`
    /// (`None`: handed to a request that went away before it used it): to the next
    /// request waiting for one, if the limit has a queue and one waits. An adaptive
    /// limit's ceiling learns how long it was held.
    pub(crate) fn release(self: &Arc<Self>, limit: LimitId, key: KeyHash, since: Option<adaptive::Since>) {
        let queue = self.limits[limit].queue.as_ref();
        let in_flight = match queue {
            Some(queue) => queue.rooms.hand_off(self, limit, key),
            None => Some(self.free(limit, key)),
        };
        if let (Some(ceiling), Some(since)) = (self.ceiling(limit), since) {
            self.learn(ceiling, limit, key, since, in_flight);
        }
    }

    /// `ceiling`, of `limit`, learns from a slot of `key` taken at `since` (its key
    /// holding `in_flight`, `None`: all it may): a ceiling gone up hands its new slots to
    /// the waiting requests.
    fn learn(
        self: &Arc<Self>,
        ceiling: &adaptive::Ceiling,
        limit: LimitId,
        key: KeyHash,
        since: adaptive::Since,
        in_flight: Option<u64>,
    ) {
        let now = self.clock.now();
        if ceiling.sample(since.held(now), in_flight, now)
            && let Some(queue) = &self.limits[limit].queue
        {
            queue.rooms.hand_spare(self, limit, key);
        }
    }

    /// The upstream answered a request holding a slot of `limit` for `key` since `since`:
    /// an adaptive limit's ceiling learns the time to its answer (the key's slots held
    /// now telling whether the ceiling was reached), or, the answer saying the upstream
    /// is overloaded (`shed`), that it is above what the upstream takes.
    pub(crate) fn answered(self: &Arc<Self>, limit: LimitId, key: KeyHash, since: adaptive::Since, shed: bool) {
        let Some(Algorithm::Concurrency(_, table, Some(ceiling))) = self.limits[limit].windows.first() else {
            return;
        };
        let in_flight = table.lock(key.0).get(key.0).unwrap_or(0);
        if shed {
            ceiling.shed(Some(in_flight), self.clock.now());
            return;
        }
        self.learn(ceiling, limit, key, since, Some(in_flight));
    }

    /// The ceiling of `limit`, if it is an adaptive concurrency limit.
    pub fn ceiling(&self, limit: LimitId) -> Option<&adaptive::Ceiling> {
        match self.limits[limit].windows.first() {
            Some(Algorithm::Concurrency(_, _, ceiling)) => ceiling.as_deref(),
            _ => None,
        }
    }

    /// A request of `src` that limit `limit` (a concurrency limit with a queue) refused
    /// for want of a slot comes to its queue: it takes a slot freed meanwhile, or waits
    /// in its key's room (`count`: the key's own count of slots, `limit_from`; `priority`:
    /// its route's class; `leased`: the limit's slots are leased in Redis, which refused
    /// it one just now, and it waits).
    pub fn queue(
        self: &Arc<Self>,
        limit: LimitId,
        src: &KeySource<'_>,
        count: Option<u64>,
        priority: Option<&str>,
        leased: bool,
    ) -> queue::Queued {
        let limiter = &self.limits[limit];
        let (Some(queue), Some(key)) = (&limiter.queue, self.key_hash(limit, src)) else {
            return queue::Queued::Refused { end: queue::QueueEnd::Full, retry_after: Duration::ZERO };
        };
        let flow = queue.fair_by.hash_any(src, &self.secret.seed).0.0;
        queue.rooms.join(queue, key, queue.class_of(src, priority), flow, || {
            let Some(window) = limiter.windows.first().filter(|_| !leased) else {
                return if leased { queue::Take::Busy } else { queue::Take::NoRoom };
            };
            let mut held = window.lock_as(key, None, limiter.count(count));
            let now = self.clock.now();
            match held.decide(key, now, 1) {
                Verdict::Admit { state, .. } => {
                    held.store(key, state, now, 1);
                    queue::Take::Slot(queue::Handed::new(Arc::clone(self), limit, key, adaptive::Since::at(now)))
                }
                Verdict::Reject { .. } if held.holds(key) => queue::Take::Busy,
                Verdict::Reject { .. } => queue::Take::NoRoom,
            }
        })
    }

    /// Hands `lease`, a slot of global limit `limit` that `key` gives back, to the next
    /// request waiting here for one, if the limit has a queue and one waits: the lease
    /// back if none does (to be released in Redis).
    pub fn give_back_lease(
        self: &Arc<Self>,
        limit: LimitId,
        key: KeyHash,
        lease: queue::Leased,
    ) -> Option<queue::Leased> {
        match &self.limits[limit].queue {
            Some(queue) => queue.rooms.hand_lease(self, limit, key, lease),
            None => Some(lease),
        }
    }

    /// Whether the caller is to ask Redis for slots of global limit `limit` for the
    /// requests waiting here for those of `key`, as whom and at what interval (one
    /// caller per room; it asks while `keep_asking`).
    pub fn start_asking(&self, limit: LimitId, key: KeyHash) -> Option<(u64, Duration)> {
        let queue = self.limits[limit].queue.as_ref()?;
        Some((queue.rooms.start_asking(key)?, queue.ask_every()))
    }

    /// Whether `asker` asks on for slots of `key` in the queue of `limit`: requests still
    /// wait for them in the room it asks for (else it stops).
    pub fn keep_asking(&self, limit: LimitId, key: KeyHash, asker: u64) -> bool {
        self.limits[limit].queue.as_ref().is_some_and(|q| q.rooms.keep_asking(key, asker))
    }

    /// Whether requests wait here for the slots of `src`'s key in the queue of `limit`.
    pub fn has_waiters(&self, limit: LimitId, src: &KeySource<'_>) -> bool {
        let Some(queue) = &self.limits[limit].queue else { return false };
        self.key_hash(limit, src).is_some_and(|key| queue.rooms.has_waiters(key))
    }

    /// Redis could not answer for the slots of global limit `limit`: every request
    /// waiting here for those of `key` is to be decided again.
    pub fn ask_again(&self, limit: LimitId, key: KeyHash) {
        if let Some(queue) = &self.limits[limit].queue {
            queue.rooms.ask_again(key);
        }
    }

    /// Where a request of `src` would stand in the queue of `limit` now, nothing taken:
    /// its class's name, the requests waiting for its key's slots, and its place in the
    /// round if it joined.
    pub fn queue_stands(
        &self,
        limit: LimitId,
        src: &KeySource<'_>,
        priority: Option<&str>,
    ) -> Option<(&str, usize, usize)> {
        let queue = self.limits[limit].queue.as_ref()?;
        let key = self.key_hash(limit, src)?;
        let class = queue.class_of(src, priority);
        let flow = queue.fair_by.hash_any(src, &self.secret.seed).0.0;
        let (waiting, position) = queue.rooms.would_stand(key, class, flow).unwrap_or((0, 1));
        Some((queue.class_name(class), waiting, position))
    }

    /// The class a request of `src` (of a route whose class in queues is `priority`) waits
    /// in, in the queue of `limit`: its index and its name (`""`: the queue has no
    /// classes); `None` without a queue.
    pub fn queue_class(&self, limit: LimitId, src: &KeySource<'_>, priority: Option<&str>) -> Option<(usize, &str)> {
        let queue = self.limits[limit].queue.as_ref()?;
        let class = queue.class_of(src, priority);
        Some((class, queue.class_name(class)))
    }

    /// The classes of the queue of `limit`, by name (one, `""`, for a queue without;
    /// none without a queue).
    pub fn queue_classes(&self, limit: LimitId) -> Vec<&str> {
        let Some(queue) = &self.limits[limit].queue else { return Vec::new() };
        (0..queue.rooms.classes()).map(|c| queue.class_name(c)).collect()
    }

    /// Requests waiting in the queue of `limit` now (0 without one), of every class or of
    /// class `class` (its index in `queue_classes`).
    pub fn queued(&self, limit: LimitId, class: Option<usize>) -> u64 {
        let Some(queue) = &self.limits[limit].queue else { return 0 };
        let rooms = &queue.rooms;
        class.map_or_else(|| (0..rooms.classes()).map(|c| rooms.waiting(c)).sum(), |c| rooms.waiting(c))
    }

    /// Waits in the queue of `limit` that ended so, since start, of every class or of
    /// class `class`.
    pub fn queue_ended(&self, limit: LimitId, class: Option<usize>, end: queue::QueueEnd) -> u64 {
        let Some(queue) = &self.limits[limit].queue else { return 0 };
        let rooms = &queue.rooms;
        class.map_or_else(|| (0..rooms.classes()).map(|c| rooms.ended(c, end)).sum(), |c| rooms.ended(c, end))
    }

    /// The longest a request waits in the queue of `limit`, if it has one.
    pub fn max_wait(&self, limit: LimitId) -> Option<Duration> {
        self.limits[limit].queue.as_ref().map(|q| q.max_wait)
    }

    /// Frees a concurrency slot of limit `limit` held by `key`: the slots the key held,
    /// this one included.
    fn free(&self, limit: LimitId, key: KeyHash) -> u64 {
        let Some(Algorithm::Concurrency(_, table, _)) = self.limits[limit].windows.first() else { return 0 };
        let mut shard = table.lock(key.0);
        let held = shard.get(key.0).unwrap_or(0);
        match held {
            2.. => shard.replace(key.0, held - 1),
            _ => shard.remove(key.0),
        }
        held
    }

    /// Whether `key` holds more slots of `limit` than its ceiling lets it now (an adaptive
    /// ceiling came down): a slot it gives back is then freed, not handed on.
    fn over(&self, limit: LimitId, key: KeyHash) -> bool {
        let Some(Algorithm::Concurrency(_, table, Some(ceiling))) = self.limits[limit].windows.first() else {
            return false;
        };
        table.lock(key.0).get(key.0).unwrap_or(0) > ceiling.get()
    }

    /// Takes one more slot of `limit` for `key`, if it holds fewer than it may now (an
    /// adaptive ceiling went up, a reload raised `concurrency`): for a waiter. Not for a
    /// limit whose keys have counts of their own (`limit_from`), not known here.
    fn spare(&self, limit: LimitId, key: KeyHash) -> bool {
        let limiter = &self.limits[limit];
        let Some(Algorithm::Concurrency(slots, table, ceiling)) = limiter.windows.first() else { return false };
        if limiter.tenant.is_some() {
            return false;
        }
        let most = ceiling.as_ref().map_or(slots.max(), |c| c.get());
        let mut shard = table.lock(key.0);
        match shard.get(key.0) {
            Some(held) if held < most => {
                shard.replace(key.0, held + 1);
                true
            }
            _ => false,
        }
    }
}

impl Limiter {
    /// Whether its admissions wait for the response: to be taken back by status
    /// (`count:`) or charged what it reports (`charge:`).
    pub(crate) fn settles_after(&self) -> bool {
        self.counted.is_some() || self.charge.is_some()
    }

    /// Whether it annotates a request it passed with `outcome` (its windows standing at
    /// `standings` after it), under the route's own `burst` (as configured) and the key's
    /// own `count` (`limit_from`, as given), where `share`
    /// instances share each window's capacity (its local twin's; 1 for Redis's standings
    /// and a local limit): over it with `action: annotate`, or when the units the key has
    /// used of any window's capacity reach `annotate_from` of it.
    pub(crate) fn annotates(
        &self,
        outcome: Outcome,
        standings: &[Standing],
        (burst, count): (Option<Burst>, Option<u64>),
        share: u64,
    ) -> bool {
        let Some(annotates) = &self.annotates else { return false };
        if outcome.is_rejected() {
            return annotates.over;
        }
        let Some(from) = annotates.from else { return false };
        standings.iter().any(|s| {
            // A route's own burst is a leaky bucket's, whose one window it sizes; a key's
            // own count sizes a window or a concurrency limit (a rate's burst stays).
            let rate = matches!(self.windows.first(), Some(Algorithm::LeakyBucket(..)));
            let own = count.filter(|_| !rate).unwrap_or(annotates.full[s.window]);
            let full = burst.map_or(own, |b| b.burst.saturating_add(1));
            let capacity = full.div_ceil(share).max(1);
            let used = capacity.saturating_sub(s.remaining);
            used.saturating_mul(100) >= from * capacity
        })
    }

    /// The instances its local twin shares it with (1 for a local limit).
    pub(crate) fn share(&self) -> u64 {
        self.share
    }

    /// A key's own `count` (`limit_from`) as its local state decides with it: a global
    /// limit's twin takes its share of a window's or a concurrency limit's (a rate's is
    /// shared by its interval, already the twin's).
    #[inline]
    pub(crate) fn count(&self, count: Option<u64>) -> Option<u64> {
        let rate = matches!(self.windows.first(), Some(Algorithm::LeakyBucket(..)));
        count.map(|n| tenant::Tenant::local(n, self.share, rate))
    }

    /// A route's own `burst` on this limit as its local state decides with it: a global
    /// limit's twin takes its share, as it does of the limit's own burst.
    #[inline]
    pub(crate) fn burst(&self, burst: Option<Burst>) -> Option<Burst> {
        burst.map(|b| b.shared(self.share))
    }

    /// Takes over the state of `old`, this limit before a reload, if its key, scope and
    /// algorithms are the same; true if it did.
    fn carry(&mut self, old: &Limiter) -> bool {
        let same = old.key == self.key && old.scope == self.scope && old.windows.len() == self.windows.len();
        if !same || !self.windows.iter_mut().zip(old.windows.iter()).all(|(new, old)| new.adopt(old)) {
            return false;
        }
        if let (Some(bans), Some(old_bans)) = (&mut self.bans, &old.bans) {
            bans.adopt(old_bans);
        }
        self.max_keys = old.max_keys;
        self.missing = Arc::clone(&old.missing);
        self.charged = Arc::clone(&old.charged);
        // Its waiters stay while the classes they wait in do.
        if let (Some(queue), Some(old_queue)) = (&mut self.queue, &old.queue)
            && queue.classes.iter().map(|c| &c.name).eq(old_queue.classes.iter().map(|c| &c.name))
        {
            queue.rooms = Arc::clone(&old_queue.rooms);
        }
        true
    }
}

/// A limit's local limiter. A global limit's is its `on_store_error: local` fallback,
/// each window's rate and capacity divided by `instances` (rounded up, so never to zero).
fn limiter(limit: &Limit) -> Limiter {
    let share = match limit.scope {
        Scope::Global { instances, .. } => instances,
        Scope::Local => 1,
    };
    let wide = limit.money.is_some();
    let windows =
        limit.windows.iter().map(|policy| Algorithm::new(&shared(policy, share), limit.max_keys, wide)).collect();
    Limiter {
        id: LimitName(Arc::from(limit.name.as_str())),
        key: limit.key.clone(),
        allow: limit.allow.clone(),
        windows,
        counted: limit.count.clone(),
        charge: limit.charge.clone(),
        overrides: limit.overrides.clone().into(),
        bans: limit.ban.map(|ban| Bans::new(ban.base, ban.max, limit.max_keys)),
        status: limit.status,
        dry_run: limit.dry_run,
        refuses: limit.refuses(),
        annotates: limit.annotates().then(|| Annotates {
            over: limit.action == LimitAction::Annotate,
            from: limit.annotate_from.map(u64::from),
            full: limit.windows.iter().map(Policy::full).collect(),
        }),
        scope: limit.scope,
        plain: limit.overrides.is_empty() && limit.allow.is_empty() && limit.tenant.is_none(),
        on_missing_key: limit.on_missing_key,
        missing: Arc::default(),
        charged: Arc::default(),
        share,
        max_keys: limit.max_keys,
        tenant: limit.tenant.clone().map(|from| tenant::Tenant { from, set: Arc::default() }),
        queue: limit.queue.as_ref().map(queue::Queue::new),
    }
}

/// `policy` with its rate and capacity divided among `instances`: for a rate, the
/// requests admitted at once (`burst + 1`) are shared, so that the instances' twins
/// together hold no more than the limit does.
fn shared(policy: &Policy, instances: u64) -> Policy {
    let part = |n: u64| n.div_ceil(instances).max(1);
    match *policy {
        Policy::Rate { rate, burst, delay } => {
            let per = rate.per.saturating_mul(u32::try_from(instances).unwrap_or(u32::MAX));
            let Burst { burst, delay } = Burst { burst, delay }.shared(instances);
            Policy::Rate { rate: Rate { count: rate.count, per }, burst, delay }
        }
        Policy::FixedWindow { limit, ref window } => Policy::FixedWindow { limit: part(limit), window: window.clone() },
        Policy::SlidingWindow { limit, window } => Policy::SlidingWindow { limit: part(limit), window },
        Policy::SlidingLog { limit, window } => Policy::SlidingLog { limit: part(limit), window },
        Policy::Concurrency { max, retry_after, adaptive } => {
            Policy::Concurrency { max: part(max), retry_after, adaptive }
        }
    }
}

/// Random schedules for the algorithms' property tests.
#[cfg(test)]
pub(crate) mod schedule {
    /// Arrival instants (ns since the epoch, from late 2023): each gap counts hundredths
    /// of `unit`.
    pub fn arrivals(gaps: &[u64], unit: u64) -> impl Iterator<Item = u64> + '_ {
        gaps.iter().scan(1_700_000_000_000_000_000u64, move |now, gap| {
            *now += gap * unit / 100;
            Some(*now)
        })
    }

    /// The most admissions (sorted instants) in any interval of `len` ns.
    pub fn most_within(admitted: &[u64], len: u64) -> u64 {
        (0..admitted.len())
            .map(|i| admitted[i..].iter().take_while(|&&t| t - admitted[i] < len).count() as u64)
            .max()
            .unwrap_or(0)
    }

    /// The most admissions in one window `[k·len, (k+1)·len)`.
    pub fn most_in_aligned(admitted: &[u64], len: u64) -> u64 {
        admitted.chunk_by(|a, b| a / len == b / len).map(|w| w.len() as u64).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_global_limits_local_twin_gets_its_share_of_rate_and_burst() {
        let rate = |count, secs| Rate { count, per: Duration::from_secs(secs) };
        let policy = Policy::Rate { rate: rate(50, 1), burst: 20, delay: 20 };
        // 21 at once among 3: 7 each (burst 6), at 50 per 3 s.
        assert_eq!(shared(&policy, 3), Policy::Rate { rate: rate(50, 3), burst: 6, delay: 6 });
        let strict = Policy::Rate { rate: rate(10, 1), burst: 0, delay: 0 };
        assert_eq!(shared(&strict, 4), Policy::Rate { rate: rate(10, 4), burst: 0, delay: 0 });
        let minute = crate::policy::Window::Every(Duration::from_secs(60));
        let window = Policy::FixedWindow { limit: 10, window: minute.clone() };
        assert_eq!(shared(&window, 3), Policy::FixedWindow { limit: 4, window: minute });
    }
}
