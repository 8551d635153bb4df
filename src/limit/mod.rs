//! The limits of a route, decided together for one request.
//!
//! Each configured limit has an algorithm (its policy) and a key table (its state).
//! `Limiters::check` locks the shard of every applicable limit (in ascending limit
//! order, so two requests never wait on each other's locks crosswise), decides each,
//! and stores the new states only if every enforced limit admits: a rejected request
//! consumes no quota anywhere and takes no concurrency slot. The request then waits the
//! longest delay any enforced limit asked for, holding its concurrency slots in
//! `Permits` until its response is done.

pub mod algorithm;
pub mod ban;
pub mod concurrency;
pub mod fixed_window;
#[cfg(test)]
mod gcra_cases;
mod global;
pub mod inspect;
pub mod leaky_bucket;
pub mod receipt;
pub mod sliding_log;
pub mod sliding_window;
pub mod table;

use std::hash::RandomState;
use std::sync::{Arc, LazyLock, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http::StatusCode;
use smallvec::SmallVec;

use crate::config::{Config, Limit, LogKeys};
use crate::policy::allow::Allow;
use crate::policy::key::{KeySource, KeySpec};
use crate::policy::{Policy, Rate, Scope};
use crate::store::Store;
use algorithm::{Algorithm, Held};
use ban::Bans;
pub use receipt::{Pending, Permits};
use table::Shard;

/// The limiter clock: nanoseconds since the Unix epoch, read from the wall clock once
/// and advanced by the monotonic clock since, so it never steps back when the system
/// time is adjusted, and fixed windows align with every other instance's.
pub fn now() -> u64 {
    static ORIGIN: LazyLock<(Instant, u64)> = LazyLock::new(|| {
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        (Instant::now(), u64::try_from(wall.as_nanos()).unwrap_or(0))
    });
    let (instant, wall) = *ORIGIN;
    wall.saturating_add(u64::try_from(instant.elapsed().as_nanos()).unwrap_or(u64::MAX))
}

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

struct Limiter {
    /// The limit's name: with its key and algorithm, what a reload keeps state by.
    name: String,
    key: KeySpec,
    /// Requests this limit lets through without counting them.
    allow: Allow,
    /// One algorithm per window (usually one); a request must fit all.
    windows: Box<[Algorithm]>,
    /// Statuses that count: an admission whose response has another is taken back.
    counted: Option<Box<[u16]>>,
    /// Requests matching one are decided by that limit instead.
    overrides: Box<[(Allow, usize)]>,
    bans: Option<Bans>,
    status: StatusCode,
    dry_run: bool,
    scope: Scope,
    /// Neither overrides nor an allow-list: it decides every request it is listed for.
    plain: bool,
}

/// One limit's part in a decision: its key, its locked shards, what it decided.
struct Entry<'a> {
    limit: usize,
    window: usize,
    key: u64,
    shard: Held<'a>,
    bans: Option<MutexGuard<'a, Shard>>,
    verdict: Option<Verdict>,
}

/// Every configured limit, indexed like `Config::limits`.
pub struct Limiters {
    seed: RandomState,
    limits: Box<[Limiter]>,
    /// Where global limits are decided (`None`: every limit is local).
    store: Option<Arc<Store>>,
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
    /// Index into `Config::limits`.
    pub limit: usize,
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

/// What the limits of a route make of a request. A rejection is an outcome, not an error.
pub enum Decision {
    /// Go on after `wait` (zero for most requests), holding `permits` until the
    /// response is done, and settling `pending` with the response's status. The local
    /// limits decided at `at`.
    Pass { wait: Duration, standings: SmallVec<[Standing; 2]>, permits: Permits, pending: Pending, at: u64 },
    /// Answer `status` now; `limit` (index into `Config::limits`) is the enforced
    /// rejecting limit that would admit the request last, after `retry_after`.
    Reject { limit: usize, status: StatusCode, retry_after: Duration, standings: SmallVec<[Standing; 2]> },
}

impl Limiters {
    /// The limiters of `config`; with global limits, this connects to Redis in the
    /// background (call within a Tokio runtime).
    pub fn new(config: &Config) -> Arc<Self> {
        let limits = config.limits.iter().map(limiter).collect();
        Arc::new(Limiters { seed: RandomState::new(), limits, store: Store::new(config) })
    }

    /// The limiters of `config`, a reload of the configuration `old` was made from: a
    /// local limit whose name, key and algorithm (and window, for windows) are unchanged
    /// keeps every key's state, bans and requests in flight, with its new parameters
    /// applying from now on; any other starts fresh. Returns the names of both kinds.
    pub fn reloaded(config: &Config, old: &Limiters) -> (Arc<Self>, Vec<String>, Vec<String>) {
        let (mut kept, mut fresh) = (Vec::new(), Vec::new());
        let limits = config
            .limits
            .iter()
            .map(|limit| {
                let mut new = limiter(limit);
                match old.limits.iter().find(|o| o.name == limit.name) {
                    Some(before) if new.carry(before) => kept.push(limit.name.clone()),
                    // A limit that adopted some windows' state but not all starts over.
                    _ => {
                        new = limiter(limit);
                        fresh.push(limit.name.clone());
                    }
                }
                new
            })
            .collect();
        (Arc::new(Limiters { seed: old.seed.clone(), limits, store: Store::new(config) }), kept, fresh)
    }

    /// The Redis store of global limits, if any.
    pub fn store(&self) -> Option<&Arc<Store>> {
        self.store.as_ref()
    }

    /// Bans imposed by limit `index` since start.
    pub fn bans(&self, index: usize) -> u64 {
        self.limits[index].bans.as_ref().map_or(0, Bans::imposed)
    }

    /// Keys banned now by limit `index`.
    pub fn bans_active(&self, index: usize) -> usize {
        self.limits[index].bans.as_ref().map_or(0, |b| b.active(now()))
    }

    /// Requests in flight under limit `index`, if it is a concurrency limit (else 0).
    pub fn in_flight(&self, index: usize) -> usize {
        let Some(Algorithm::Concurrency(_, table)) = self.limits[index].windows.first() else { return 0 };
        let mut n = 0u64;
        table.each(|_, in_flight| n += in_flight);
        usize::try_from(n).unwrap_or(usize::MAX)
    }

    /// The largest cost limit `index` can ever admit at once (`None`: no limit on cost).
    pub fn capacity(&self, index: usize) -> Option<u64> {
        self.limits[index].windows.iter().filter_map(Algorithm::capacity).min()
    }

    /// Keys dropped with live state by limit `index` since start.
    pub fn evictions(&self, index: usize) -> u64 {
        self.limits[index].windows.iter().map(Algorithm::evictions).sum()
    }

    /// Keys held by limit `index` now.
    pub fn keys(&self, index: usize) -> usize {
        self.limits[index].windows.iter().map(Algorithm::keys).max().unwrap_or(0)
    }

    /// The key of `src` for limit `index`, hashed (`None`: the request has none).
    pub fn key_hash(&self, index: usize, src: &KeySource<'_>) -> Option<u64> {
        self.limits[index].key.hash(src, &self.seed)
    }

    /// How log lines name the key of `src` for limit `index`: its value, its keyed hash
    /// (stable while the process runs), or its value with credentials hashed (`mode`).
    pub fn key_label(&self, index: usize, src: &KeySource<'_>, mode: LogKeys) -> String {
        let spec = &self.limits[index].key;
        match (mode, spec.hash(src, &self.seed)) {
            (_, None) => "-".to_owned(),
            (LogKeys::Hashed, Some(hash)) => inspect::label(hash),
            (LogKeys::HashedSecrets, Some(_)) => spec.describe(src, Some(&self.seed)),
            (LogKeys::Clear, Some(_)) => spec.describe(src, None),
        }
    }

    /// Decides the request `src`, weighing `cost` units (≥ 1, and no more than every
    /// limit's `capacity`), against `limits` (ascending indices) at the time `clock` gives,
    /// all locally (a global limit by its local fallback): see `decide` for the request
    /// path.
    pub fn check(
        self: &Arc<Self>,
        limits: &[usize],
        src: &KeySource<'_>,
        cost: u64,
        clock: impl FnOnce() -> u64,
    ) -> Decision {
        let chosen;
        let limits = if limits.iter().all(|&l| self.limits[l].plain) {
            limits
        } else {
            chosen = self.choose(limits, src);
            &chosen
        };
        self.check_chosen(limits, src, cost, clock)
    }

    /// The limits that decide `src`: `limits` with overrides applied (sorted again, so
    /// that locks are still taken in ascending order), less those whose allow-list
    /// exempts it.
    fn choose(&self, limits: &[usize], src: &KeySource<'_>) -> SmallVec<[usize; 2]> {
        let mut chosen: SmallVec<[usize; 2]> = SmallVec::from_slice(limits);
        let mut swapped = false;
        for limit in chosen.iter_mut() {
            if let Some(&(_, other)) = self.limits[*limit].overrides.iter().find(|(m, _)| m.admits(src)) {
                *limit = other;
                swapped = true;
            }
        }
        if swapped {
            chosen.sort_unstable();
            chosen.dedup();
        }
        chosen.retain(|&mut limit| {
            let allow = &self.limits[limit].allow;
            allow.is_empty() || !allow.admits(src)
        });
        chosen
    }

    /// Decides `src` against the `chosen` limits, all local. The clock is read once every
    /// lock is held: read earlier, a request delayed on its way to the lock could find a
    /// later instant already stored by another thread and count the difference as excess.
    #[inline]
    fn check_chosen(
        self: &Arc<Self>,
        chosen: &[usize],
        src: &KeySource<'_>,
        cost: u64,
        clock: impl FnOnce() -> u64,
    ) -> Decision {
        let mut entries: SmallVec<[Entry<'_>; 2]> = SmallVec::new();
        for &limit in chosen {
            let limiter = &self.limits[limit];
            if let Some(key) = limiter.key.hash(src, &self.seed) {
                // The limit's shards in window order, then its ban shard (held by the
                // first window's entry): one order for every request.
                for (window, algorithm) in limiter.windows.iter().enumerate() {
                    let shard = algorithm.lock(key);
                    entries.push(Entry { limit, window, key, shard, bans: None, verdict: None });
                }
                if let (Some(bans), Some(first)) = (&limiter.bans, entries.len().checked_sub(limiter.windows.len())) {
                    entries[first].bans = Some(bans.lock(key));
                }
            }
        }
        let now = clock();
        let mut standings: SmallVec<[Standing; 2]> = SmallVec::new();
        for e in &mut entries {
            // A banned key is refused for the time left, whatever the algorithm says.
            let left = match (&self.limits[e.limit].bans, &e.bans) {
                (Some(bans), Some(shard)) => bans.left(shard, e.key, now),
                _ => None,
            };
            let verdict = match left {
                Some(left) => Verdict::Reject { retry_after: left, remaining: 0, reset: left, excess: 0.0 },
                None => e.shard.decide(e.key, now, cost),
            };
            standings.push(standing(e.limit, e.window, &verdict));
            e.verdict = Some(verdict);
        }
        // A rejection by any window of an enforced limit that bans starts a ban, unless
        // one runs; the ban's length is then that rejection's wait. (Entries and standings
        // are aligned; a limit's ban shard is held by its first window's entry.)
        for (n, e) in entries.iter_mut().enumerate() {
            let limiter = &self.limits[e.limit];
            let (Some(bans), Some(shard), false) = (&limiter.bans, e.bans.as_mut(), limiter.dry_run) else { continue };
            let rejects =
                standings[n..n + limiter.windows.len()].iter().any(|s| matches!(s.outcome, Outcome::Rejected(_)));
            if rejects && bans.left(shard, e.key, now).is_none() {
                standings[n].outcome = Outcome::Rejected(Duration::from_nanos(bans.impose(shard, e.key, now)));
                standings[n].banned = true;
            }
        }
        if let Some(rejection) = self.rejection(&standings) {
            // A refusal counts as use in every table that holds the key (rank only, no
            // state), so a flood of fresh keys cannot push the refused key out.
            for e in &mut entries {
                e.shard.refuse(e.key, now);
                if let Some(shard) = e.bans.as_mut() {
                    shard.refuse(e.key, now);
                }
            }
            return self.reject(rejection, standings);
        }

        let mut wait = 0;
        let mut permits = Permits::default();
        let mut pending = Pending { cost, ..Pending::default() };
        for (n, e) in entries.iter_mut().enumerate() {
            // A dry-run limit that would reject, in any of its windows, keeps all of its
            // state, as it would have if enforced. (Its windows are entries n - window..)
            let first = n - e.window;
            let windows = self.limits[e.limit].windows.len();
            if standings[first..first + windows].iter().any(|s| matches!(s.outcome, Outcome::Rejected(_))) {
                continue;
            }
            let Some(Verdict::Admit { state, wait: w, .. }) = e.verdict else { continue };
            e.shard.store(e.key, state, now, cost);
            let limiter = &self.limits[e.limit];
            if !limiter.dry_run {
                wait = wait.max(w);
            }
            if let Held::Concurrency(..) = e.shard {
                permits.limiters.get_or_insert_with(|| Arc::clone(self));
                permits.slots.push((e.limit, e.key));
            }
            if limiter.counted.is_some() && e.window == 0 {
                pending.limiters.get_or_insert_with(|| Arc::clone(self));
                pending.admissions.push((e.limit, e.key, now));
            }
        }
        Decision::Pass { wait: Duration::from_nanos(wait), standings, permits, pending, at: now }
    }

    /// The enforced limit that rejects, if one does: the one that would admit last.
    fn rejection(&self, standings: &[Standing]) -> Option<(usize, Duration)> {
        standings
            .iter()
            .filter(|s| !self.limits[s.limit].dry_run)
            .filter_map(|s| match s.outcome {
                Outcome::Rejected(after) => Some((s.limit, after)),
                _ => None,
            })
            .max_by_key(|&(_, after)| after)
    }

    /// The rejection of a request by `limit`, with the standings of all its limits.
    fn reject(&self, (limit, retry_after): (usize, Duration), mut standings: SmallVec<[Standing; 2]>) -> Decision {
        // The others describe the key as if this request had counted; it did not.
        for s in standings.iter_mut().filter(|s| !matches!(s.outcome, Outcome::Rejected(_))) {
            s.remaining += 1;
        }
        Decision::Reject { limit, status: self.limits[limit].status, retry_after, standings }
    }

    /// Takes back every admission of a passed decision (its `standings`, decided at
    /// `at`): another part of the request's limits refused it after all.
    fn undo(&self, standings: &[Standing], src: &KeySource<'_>, cost: u64, at: u64) {
        for s in standings {
            let limiter = &self.limits[s.limit];
            let rejects = standings.iter().any(|o| o.limit == s.limit && matches!(o.outcome, Outcome::Rejected(_)));
            if let (false, Some(key)) = (rejects, limiter.key.hash(src, &self.seed)) {
                limiter.windows[s.window].lock(key).refund(key, cost, at);
            }
        }
    }

    /// Takes back an admission of limit `limit` for `key` unless it counts `status`.
    fn settle(&self, limit: usize, key: u64, cost: u64, at: u64, status: u16) {
        let limiter = &self.limits[limit];
        if limiter.counted.as_ref().is_some_and(|counted| !counted.contains(&status)) {
            for algorithm in limiter.windows.iter() {
                algorithm.lock(key).refund(key, cost, at);
            }
        }
    }

    fn release(&self, limit: usize, key: u64) {
        let Some(Algorithm::Concurrency(_, table)) = self.limits[limit].windows.first() else { return };
        let mut shard = table.lock(key);
        match shard.get(key) {
            Some(in_flight) if in_flight > 1 => shard.replace(key, in_flight - 1),
            _ => shard.remove(key),
        }
    }
}

impl Limiter {
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
        true
    }
}

/// Where a limit stands after deciding `verdict` for limit `i`.
fn standing(limit: usize, window: usize, verdict: &Verdict) -> Standing {
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

/// A limit's local limiter. A global limit's is its `on_store_error: local` fallback,
/// each window's rate and capacity divided by `instances` (rounded up, so never to zero).
fn limiter(limit: &Limit) -> Limiter {
    let share = match limit.scope {
        Scope::Global { instances, .. } => instances,
        Scope::Local => 1,
    };
    let windows = limit.windows.iter().map(|policy| Algorithm::new(&shared(policy, share), limit.max_keys)).collect();
    Limiter {
        name: limit.name.clone(),
        key: limit.key.clone(),
        allow: limit.allow.clone(),
        windows,
        counted: limit.count.clone(),
        overrides: limit.overrides.clone().into(),
        bans: limit.ban.map(|ban| Bans::new(ban.base, ban.max, limit.max_keys)),
        status: limit.status,
        dry_run: limit.dry_run,
        scope: limit.scope,
        plain: limit.overrides.is_empty() && limit.allow.is_empty(),
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
            let burst = part(burst.saturating_add(1)) - 1;
            Policy::Rate { rate: Rate { count: rate.count, per }, burst, delay: delay.min(burst) }
        }
        Policy::FixedWindow { limit, window } => Policy::FixedWindow { limit: part(limit), window },
        Policy::SlidingWindow { limit, window } => Policy::SlidingWindow { limit: part(limit), window },
        Policy::SlidingLog { limit, window } => Policy::SlidingLog { limit: part(limit), window },
        Policy::Concurrency { max, retry_after } => Policy::Concurrency { max: part(max), retry_after },
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
    use std::net::{IpAddr, Ipv4Addr};

    use http::{HeaderMap, Method, Uri};

    use super::*;

    fn limiters(limits: &str) -> Arc<Limiters> {
        let yaml = format!("listen: 127.0.0.1:0\nlimits:\n{limits}");
        Limiters::new(&crate::config::parse(&yaml, "test").unwrap())
    }

    fn check(l: &Arc<Limiters>, limits: &[usize], ip: u32, now_ms: u64) -> Decision {
        let (uri, headers) = (Uri::from_static("/"), HeaderMap::new());
        let src = KeySource {
            client_ip: IpAddr::V4(Ipv4Addr::from(ip)),
            method: &Method::GET,
            uri: &uri,
            path: uri.path().as_bytes(),
            headers: &headers,
            host: None,
        };
        l.check(limits, &src, 1, || now_ms * 1_000_000)
    }

    fn passes(d: &Decision) -> bool {
        matches!(d, Decision::Pass { .. })
    }

    /// Each hand-worked schedule of `gcra_cases`, replayed on the injected clock.
    #[test]
    fn the_leaky_bucket_family_answers_as_worked_out_by_hand() {
        use gcra_cases::{Answer, CASES};
        let yaml: String =
            CASES.iter().enumerate().map(|(i, c)| format!("  l{i}: {{ key: ip, {} }}\n", c.policy)).collect();
        let l = limiters(&yaml);
        let (uri, headers) = (Uri::from_static("/"), HeaderMap::new());
        for (i, case) in CASES.iter().enumerate() {
            for (n, step) in case.steps.iter().enumerate() {
                let src = KeySource {
                    client_ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, step.key)),
                    method: &Method::GET,
                    uri: &uri,
                    path: uri.path().as_bytes(),
                    headers: &headers,
                    host: None,
                };
                let at = 1_700_000_000_000_000_000 + step.at * 1_000_000_000;
                let (Decision::Pass { standings, .. } | Decision::Reject { standings, .. }) =
                    l.check(&[i], &src, step.cost, || at);
                let s = standings[0];
                let retry = match s.outcome {
                    Outcome::Rejected(retry) => Some(retry),
                    _ => None,
                };
                assert_eq!(Answer::of(retry, s.remaining, s.reset), step.answer, "{}, request {n}", case.name);
            }
        }
    }

    #[test]
    fn a_global_limits_local_twin_gets_its_share_of_rate_and_burst() {
        let rate = |count, secs| Rate { count, per: Duration::from_secs(secs) };
        let policy = Policy::Rate { rate: rate(50, 1), burst: 20, delay: 20 };
        // 21 at once among 3: 7 each (burst 6), at 50 per 3 s.
        assert_eq!(shared(&policy, 3), Policy::Rate { rate: rate(50, 3), burst: 6, delay: 6 });
        let strict = Policy::Rate { rate: rate(10, 1), burst: 0, delay: 0 };
        assert_eq!(shared(&strict, 4), Policy::Rate { rate: rate(10, 4), burst: 0, delay: 0 });
        let window = Policy::FixedWindow { limit: 10, window: Duration::from_secs(60) };
        assert_eq!(shared(&window, 3), Policy::FixedWindow { limit: 4, window: Duration::from_secs(60) });
    }

    #[test]
    fn a_flood_of_random_addresses_stays_within_max_keys() {
        let l = limiters("  l: { key: ip, rate: 1r/m, burst: 5, max_keys: 10000 }\n");
        let mut x: u32 = 0x2545_F491;
        for t in 0..300_000u64 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            check(&l, &[0], x, t / 1000);
        }
        assert!(l.keys(0) <= 10_000 + 63, "{} keys", l.keys(0));
        assert!(l.evictions(0) > 0);
    }

    #[test]
    fn concurrency_slots_return_when_permits_drop_and_in_flight_keys_are_never_evicted() {
        let l = limiters("  c: { key: ip, concurrency: 2, max_keys: 4 }\n");
        let mut held = Vec::new();
        for ip in 1..=4 {
            held.push(check(&l, &[0], ip, 0));
            held.push(check(&l, &[0], ip, 0));
        }
        assert!(held.iter().all(passes));
        // Each of the four keys has two requests in flight: a third is refused, and so is
        // a fifth key, since the table may not forget a key with requests in flight.
        assert!(!passes(&check(&l, &[0], 1, 0)));
        assert!(!passes(&check(&l, &[0], 5, 0)));
        assert_eq!(l.keys(0), 4);
        held.pop();
        assert!(passes(&check(&l, &[0], 4, 0)));
        held.clear();
        assert_eq!(l.keys(0), 0, "released keys are removed");
    }

    #[test]
    fn a_rejection_takes_no_concurrency_slot() {
        // Limit 0 admits up to 1 in flight; limit 1 rejects every request after the first.
        let l = limiters("  a: { key: ip, concurrency: 1 }\n  b: { key: ip, rate: 1r/m }\n");
        let first = check(&l, &[0, 1], 1, 0);
        assert!(passes(&first));
        drop(first);
        for _ in 0..3 {
            assert!(!passes(&check(&l, &[0, 1], 1, 0)));
        }
        assert_eq!(l.keys(0), 0);
        assert!(passes(&check(&l, &[0], 1, 0)));
    }

    #[test]
    fn dry_run_never_rejects_or_delays_but_keeps_state_as_if_enforced() {
        let l = limiters("  d: { key: ip, rate: 1r/s, burst: 1, dry_run: true }\n");
        let outcomes: Vec<Outcome> = (0..3)
            .map(|_| match check(&l, &[0], 1, 0) {
                Decision::Pass { wait, standings, .. } => {
                    assert_eq!(wait, Duration::ZERO);
                    standings[0].outcome
                }
                Decision::Reject { .. } => panic!("a dry-run limit rejected"),
            })
            .collect();
        let delayed = Outcome::Delayed(Duration::from_secs(1));
        assert_eq!(outcomes, [Outcome::Passed, delayed, Outcome::Rejected(Duration::from_secs(1))]);
        // The would-be rejection stored nothing: one second later the key is where two
        // admitted requests left it.
        let Decision::Pass { standings, .. } = check(&l, &[0], 1, 1000) else { panic!() };
        assert_eq!(standings[0].outcome, delayed);
    }

    /// GCRA and the token bucket decide as governor's GCRA does, request by request.
    #[test]
    fn gcra_and_token_bucket_agree_with_governor() {
        use std::num::NonZeroU32;

        use governor::clock::FakeRelativeClock;
        use proptest::prelude::*;
        use proptest::test_runner::{Config, TestRunner};

        let strategy = (1u64..1000, 0u32..8, any::<bool>(), proptest::collection::vec(0u64..3000, 1..100));
        TestRunner::new(Config::with_cases(128))
            .run(&strategy, |(period_ms, burst, as_token_bucket, gaps)| {
                let limit = if as_token_bucket {
                    format!(
                        "  l: {{ key: ip, algorithm: token_bucket, capacity: {}, refill: 1r/{period_ms}ms }}\n",
                        burst + 1
                    )
                } else if burst == 0 {
                    format!("  l: {{ key: ip, algorithm: gcra, rate: 1r/{period_ms}ms }}\n")
                } else {
                    format!("  l: {{ key: ip, algorithm: gcra, rate: 1r/{period_ms}ms, burst: {burst} }}\n")
                };
                let ours = limiters(&limit);
                let quota = governor::Quota::with_period(Duration::from_millis(period_ms))
                    .expect("non-zero period")
                    .allow_burst(NonZeroU32::new(burst + 1).expect("non-zero"));
                let clock = FakeRelativeClock::default();
                let theirs = governor::RateLimiter::direct_with_clock(quota, clock.clone());
                let mut now_ns = 1_000_000_000_000u64;
                for (n, gap) in gaps.into_iter().enumerate() {
                    let gap_ns = gap * period_ms * 1_000_000 / 1000;
                    now_ns += gap_ns;
                    clock.advance(Duration::from_nanos(gap_ns));
                    let uri = Uri::from_static("/");
                    let headers = HeaderMap::new();
                    let src = KeySource {
                        client_ip: [10, 0, 0, 1].into(),
                        method: &Method::GET,
                        uri: &uri,
                        path: uri.path().as_bytes(),
                        headers: &headers,
                        host: None,
                    };
                    let ours = passes(&ours.check(&[0], &src, 1, || now_ns));
                    prop_assert_eq!(ours, theirs.check().is_ok(), "request {}", n);
                }
                Ok(())
            })
            .unwrap();
    }

    #[test]
    fn a_flood_of_fresh_keys_frees_neither_a_throttled_nor_a_banned_key() {
        // Every algorithm, with room for 64 keys: key 1 is throttled, key 2 banned, then
        // 10 × max_keys fresh keys pass, one request each, while both keep being refused.
        for policy in [
            "algorithm: leaky_bucket, rate: 1r/m",
            "algorithm: leaky_bucket, rate: 1r/m, burst: 3, nodelay: true",
            "algorithm: gcra, rate: 1r/m",
            "algorithm: token_bucket, capacity: 2, refill: 1r/m",
            "algorithm: min_interval, interval: 1m",
            "algorithm: fixed_window, limit: 1, window: 1m",
            "algorithm: sliding_window, limit: 1, window: 1m",
            "algorithm: sliding_log, limit: 1, window: 1m",
            "rates: [10r/s, 1r/m]",
        ] {
            let l = limiters(&format!(
                "  a: {{ key: ip, max_keys: 64, {policy} }}\n  b: {{ key: ip, max_keys: 64, {policy}, ban: 10m }}\n"
            ));
            let mut now = 0;
            let refuse = |limit: usize, key: u32, now: u64| {
                while passes(&check(&l, &[limit], key, now)) {}
            };
            refuse(0, 1, now);
            refuse(1, 2, now);
            for fresh in 0..640 {
                now += 1;
                for limit in [0, 1] {
                    assert!(passes(&check(&l, &[limit], 1000 + fresh, now)), "{policy}: fresh key {fresh} refused");
                }
                if fresh % 64 == 0 {
                    assert!(!passes(&check(&l, &[0], 1, now)), "{policy}: throttled key freed after {fresh}");
                    assert!(!passes(&check(&l, &[1], 2, now)), "{policy}: banned key freed after {fresh}");
                }
            }
            assert!(!passes(&check(&l, &[0], 1, now)), "{policy}: throttled key freed");
            assert!(!passes(&check(&l, &[1], 2, now)), "{policy}: banned key freed");
        }
    }

    #[test]
    fn a_rejection_bans_the_key_for_the_ban_and_only_enforced_limits_ban() {
        let l =
            limiters("  b: { key: ip, rate: 10r/s, ban: 1m }\n  d: { key: ip, rate: 10r/s, ban: 1m, dry_run: true }\n");
        let retry = |d: Decision| match d {
            Decision::Reject { retry_after, .. } => Some(retry_after),
            Decision::Pass { .. } => None,
        };
        assert!(passes(&check(&l, &[0], 1, 0)));
        assert_eq!(retry(check(&l, &[0], 1, 10)), Some(Duration::from_secs(60)));
        // Long after the rate would admit again, the ban still refuses, for the time left.
        assert_eq!(retry(check(&l, &[0], 1, 1_000)), Some(Duration::from_millis(59_010)));
        assert!(passes(&check(&l, &[0], 2, 1_000)), "another key is not banned");
        assert_eq!(l.bans(0), 1);
        assert!(passes(&check(&l, &[0], 1, 60_010)));
        // The dry-run limit would reject and ban, but does neither.
        assert!(passes(&check(&l, &[1], 3, 0)));
        assert!(passes(&check(&l, &[1], 3, 10)));
        assert!(passes(&check(&l, &[1], 3, 1_000)));
        assert_eq!(l.bans(1), 0);
    }

    #[test]
    fn several_windows_all_must_admit_and_the_slowest_sets_retry_after() {
        // 3 per second and 5 per minute, each a bucket of its size, banning on rejection.
        let l = limiters("  w: { key: ip, rates: [3r/s, 5r/m], ban: 10m }\n  x: { key: ip, rates: [3r/s, 5r/m] }\n");
        let outcome = |d: Decision| match d {
            Decision::Pass { .. } => Ok(()),
            Decision::Reject { retry_after, .. } => Err(retry_after),
        };
        let per_second: Vec<_> = (0..4).map(|_| outcome(check(&l, &[1], 1, 0))).collect();
        assert_eq!(per_second[..3], [Ok(()), Ok(()), Ok(())]);
        // The fourth does not fit the second's bucket (for 333 ms); it would fit the minute's.
        assert_eq!(per_second[3], Err(Duration::from_nanos(333_333_333)));
        let later: Vec<_> = [1_000, 2_000, 2_001].iter().map(|&t| outcome(check(&l, &[1], 1, t))).collect();
        // Two more pass (5 in the minute); then the minute's bucket, refilling one per 12 s
        // since t = 0, refuses until t = 12 s.
        assert_eq!(later[..2], [Ok(()), Ok(())]);
        assert_eq!(later[2], Err(Duration::from_millis(9_999)));
        // With a ban, the minute window's rejection bans the key for ten minutes.
        for _ in 0..3 {
            assert!(passes(&check(&l, &[0], 2, 0)));
        }
        assert!(passes(&check(&l, &[0], 2, 1_000)) && passes(&check(&l, &[0], 2, 2_000)));
        assert_eq!(outcome(check(&l, &[0], 2, 3_000)), Err(Duration::from_secs(600)));
        assert_eq!(l.bans(0), 1);
    }

    #[test]
    fn only_counted_statuses_keep_their_quota_for_every_algorithm() {
        for limit in [
            "rate: 1r/h, burst: 1, nodelay: true",
            "algorithm: token_bucket, capacity: 2, refill: 1r/h",
            "algorithm: fixed_window, limit: 2, window: 1h",
            "algorithm: sliding_window, limit: 2, window: 1h",
            "algorithm: sliding_log, limit: 2, window: 1h",
        ] {
            let l = limiters(&format!("  login: {{ key: ip, {limit}, count: [401, 403] }}\n"));
            let settle = |d: Decision, status: u16| match d {
                Decision::Pass { pending, .. } => {
                    futures_util::FutureExt::now_or_never(pending.settle(status)).expect("local settling never waits")
                }
                Decision::Reject { .. } => panic!("{limit}: rejected"),
            };
            // A realistic clock: a refund subtracts time, which must not run below zero.
            let t = |ms: u64| 1_700_000_000_000 + ms;
            // Successful logins are taken back: any number pass.
            for ms in 0..5 {
                settle(check(&l, &[0], 1, t(ms)), 200);
            }
            // Failures count: two, then the key is refused.
            settle(check(&l, &[0], 1, t(10)), 401);
            settle(check(&l, &[0], 1, t(11)), 403);
            assert!(!passes(&check(&l, &[0], 1, t(12))), "{limit}");
            // Requests in flight hold their quota until answered: two parallel attempts
            // of another client take both units before either is settled.
            let (a, b) = (check(&l, &[0], 2, t(20)), check(&l, &[0], 2, t(20)));
            assert!(passes(&a) && passes(&b) && !passes(&check(&l, &[0], 2, t(20))), "{limit}");
            settle(a, 200);
            assert!(passes(&check(&l, &[0], 2, t(21))), "{limit}: refund not applied");
            drop(b);
        }
    }

    #[test]
    fn min_interval_admits_one_request_per_interval() {
        let l = limiters("  m: { key: ip, algorithm: min_interval, interval: 2s }\n");
        let at = |ms: u64| passes(&check(&l, &[0], 1, 1_700_000_000_000 + ms));
        // 0 passes; 1 999 ms later is too soon; 2 000 ms after the last admission passes.
        assert_eq!([at(0), at(1_999), at(2_000), at(3_000), at(4_000)], [true, false, true, false, true]);
    }

    #[test]
    fn a_dry_run_limit_stores_no_window_when_one_would_reject() {
        let l = limiters(
            "  d: { key: ip, rates: [1r/s, 100r/h], dry_run: true }\n  e: { key: ip, rates: [1r/s, 100r/h] }\n",
        );
        let t = |ms: u64| 1_700_000_000_000 + ms;
        // Enforced: the second request at once is rejected by the per-second window and
        // the hour window does not count it.
        assert!(passes(&check(&l, &[1], 1, t(0))));
        assert!(!passes(&check(&l, &[1], 1, t(1))));
        // Dry run: the same requests pass, and the hour window must show the same count
        // as the enforced one: 99 remaining, not 98.
        assert!(passes(&check(&l, &[0], 1, t(0))));
        assert!(passes(&check(&l, &[0], 1, t(1))));
        let remaining = |d: Decision| match d {
            Decision::Pass { standings, .. } | Decision::Reject { standings, .. } => standings[1].remaining,
        };
        assert_eq!(remaining(check(&l, &[0], 1, t(2_000))), remaining(check(&l, &[1], 1, t(2_000))));
    }
}
