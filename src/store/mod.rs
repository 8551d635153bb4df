//! Global limits: their state in Redis, shared by every sluicegate instance.
//!
//! `Store::decide` sends one `DECIDE` script call with every global limit of a request
//! (on a Redis Cluster, one per hash slot, concurrently), bounded by `redis.timeout` and
//! guarded by a circuit breaker. Keys are `{prefix}{limit:hash}:kind+window`: the hash
//! tag holds a limit's key together (its windows and its ban share one slot). Redis only:
//! what the request path does with the answer, or when there is none (the limits'
//! `on_store_error`), is `gate`'s. `reply` reads the answer, `report` counts and logs
//! failures and fallbacks, `probe` finds out in the background whether Redis answers.

pub mod breaker;
mod connection;
pub mod lease;
pub mod near_cache;
mod probe;
mod queue;
mod reply;
mod report;
mod script;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use redis::RedisError;
use redis::cluster_routing::Slot;
use smallvec::SmallVec;
use tracing::warn;
use typed_index_collections::TiVec;

use crate::clock::{Clock, Nanos};
use crate::config::{Burst, Config, LimitId, Scope};
use crate::policy::key::KeyHash;
use breaker::Breaker;
use connection::Connections;
pub use lease::Lease;
use near_cache::{NearCache, Refusal};
pub use probe::Reach;
use reply::Batch;
pub use reply::Verdicts;
pub use report::StoreCounts;
use report::{Reported, Stats};
use script::{CHARGE, Part, Parts, REFUND, ScriptCall, Spec};

#[derive(Clone, Debug, thiserror::Error)]
pub enum StoreError {
    #[error("circuit breaker open")]
    Open,
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Redis(#[from] RedisError),
    #[error("unexpected reply from the decide script ({0} packed integers)")]
    Reply(usize),
}

/// One global limit of a request: its index, the route's own burst and delay on it, and
/// the Redis key base of the request's key.
pub struct Call {
    pub limit: LimitId,
    /// `None`: the limit's own.
    pub burst: Option<Burst>,
    /// The key's own count (`limit_from`; `None`: the limit's).
    pub count: Option<u64>,
    pub base: String,
    /// The key's 64-bit hash, for the near-cache (see `near_key`).
    pub near: KeyHash,
}

/// The near-cache's key of a request whose key hashes to `hash` (64 bits), using a limit
/// with `burst`: a refusal under one burst says nothing of another (a larger one may
/// admit the same request now), so each burst remembers its own. The limit's own burst
/// keeps the key's hash; another is mixed in (for each burst a bijection of the hash, so
/// two keys never meet under one burst; across bursts, only by a 64-bit chance).
pub fn near_key(hash: u64, burst: Option<Burst>, count: Option<u64>) -> KeyHash {
    if burst.is_none() && count.is_none() {
        return KeyHash(hash);
    }
    // A key's own count is another set of parameters too (one key has one at a time,
    // but it may change between requests).
    let burst = burst.map_or(0, |b| b.burst.wrapping_add(1));
    let salt = burst.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ count.map_or(0, |n| n.wrapping_add(1).rotate_left(32));
    KeyHash((hash ^ salt).wrapping_mul(0xff51_afd7_ed55_8ccd).rotate_left(29))
}

/// An instant on Redis's clock, as its `TIME` command and the scripts give it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RedisTime {
    pub secs: u64,
    pub micros: u64,
}

impl RedisTime {
    /// The instant, ns since the Unix epoch.
    pub fn nanos(self) -> Nanos {
        Nanos(self.secs * 1_000_000_000 + self.micros * 1000)
    }
}

/// A global admission that `settle` may take back.
pub struct Admission {
    pub limit: LimitId,
    /// The key base.
    pub base: String,
    /// When Redis admitted it.
    pub at: RedisTime,
}

/// A request's global admissions by limits that count only some statuses.
pub struct Admissions {
    pub store: Arc<Store>,
    pub list: SmallVec<[Admission; 1]>,
}

impl Admissions {
    /// Takes back the admissions whose limit does not count `status` (`count:`), before
    /// the response goes out, so that the client's next request finds its quota back.
    pub async fn settle(&self, cost: u64, status: u16) {
        for a in &self.list {
            if self.store.spec(a.limit).counted.as_ref().is_some_and(|counted| !counted.contains(&status)) {
                self.store.take_back(a.limit, &a.base, a.at, cost).await;
            }
        }
    }

    /// These admissions parted in two: those of limits `pick` picks (`None`: none are),
    /// and the others.
    pub fn split(self, pick: impl Fn(LimitId) -> bool) -> (Option<Admissions>, Admissions) {
        let (picked, rest): (SmallVec<_>, SmallVec<_>) = self.list.into_iter().partition(|a| pick(a.limit));
        let picked = (!picked.is_empty()).then(|| Admissions { store: Arc::clone(&self.store), list: picked });
        (picked, Admissions { store: self.store, list: rest })
    }

    /// Debits each admission's key `units` more (a negative number takes that many
    /// back): what its response reported it cost (`charge:`), after the admission.
    pub async fn charge(&self, units: &[i64]) {
        for (a, &n) in self.list.iter().zip(units) {
            match u64::try_from(n) {
                Ok(0) => {}
                Ok(n) => self.store.debit(a.limit, &a.base, n).await,
                Err(_) => self.store.take_back(a.limit, &a.base, a.at, n.unsigned_abs()).await,
            }
        }
    }
}

pub struct Store {
    connections: Connections,
    /// Per limit, indexed like `Config::limits` (`None`: local).
    specs: TiVec<LimitId, Option<Spec>>,
    prefix: String,
    cluster: bool,
    timeout: Duration,
    lease_ttl: Duration,
    breaker: Breaker,
    /// Time between probes while the breaker is open (`redis.breaker_cooldown`).
    cooldown: Duration,
    /// Longest wait for a probe's answer: a new connection and a round trip.
    probe_deadline: Duration,
    /// A prober runs (`probe`).
    probing: AtomicBool,
    /// Redis has answered a call or a probe.
    answered: AtomicBool,
    /// The last failure's message (calls and probes).
    last_error: Mutex<String>,
    /// Decisions waiting to share a call.
    queue: queue::Queue,
    near: NearCache,
    leases: lease::Book,
    /// Lease ids: this instance's random tag and a sequence number.
    instance: u64,
    lease_seq: AtomicU64,
    stats: Stats,
    reported: Mutex<Reported>,
    /// The breaker's, the near-cache's and the reports' time.
    clock: Clock,
}

impl Store {
    /// The store of `config`'s global limits, if it has any; starts connecting and
    /// renewing leases in the background (call within a Tokio runtime).
    pub fn new(config: &Config, clock: Clock) -> Option<Arc<Store>> {
        let redis = config.redis.as_ref()?;
        let global = |scope: &Scope| matches!(scope, Scope::Global { .. });
        if !config.limits.iter().any(|l| global(&l.scope)) {
            return None;
        }
        let lease_ttl_ms = u64::try_from(redis.lease_ttl.as_millis()).unwrap_or(u64::MAX);
        let store = Arc::new(Store {
            connections: Connections::new(redis),
            specs: config.limits.iter().map(|l| global(&l.scope).then(|| Spec::new(l, lease_ttl_ms))).collect(),
            prefix: redis.key_prefix.clone(),
            cluster: redis.cluster,
            timeout: redis.timeout,
            lease_ttl: redis.lease_ttl,
            breaker: Breaker::new(redis.breaker_failures, redis.breaker_window),
            cooldown: redis.breaker_cooldown,
            probe_deadline: redis.connect_timeout + redis.timeout,
            probing: AtomicBool::new(false),
            answered: AtomicBool::new(false),
            last_error: Mutex::default(),
            queue: queue::Queue::default(),
            near: NearCache::new(config.limits.iter().map(|l| global(&l.scope)), redis.near_cache_keys),
            leases: lease::Book::default(),
            instance: std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), Instant::now()),
            lease_seq: AtomicU64::new(0),
            stats: Stats::default(),
            reported: Mutex::default(),
            clock,
        });
        if config.limits.iter().any(|l| global(&l.scope) && l.windows.iter().any(|p| p.is_concurrency())) {
            tokio::spawn(lease::renew(Arc::downgrade(&store)));
        }
        Some(store)
    }

    pub fn is_global(&self, limit: LimitId) -> bool {
        self.specs[limit].is_some()
    }

    /// The Redis key base of `limit` for a request whose key hashes to `hash`.
    pub fn base(&self, limit: LimitId, hash: u128) -> String {
        let name = self.specs[limit].as_ref().map_or("", |s| s.name.as_str());
        key_base(&self.prefix, name, hash)
    }

    /// The near-cache's refusal of a one-unit request for `call` at `now`, if it has one.
    pub fn near_refused(&self, call: &Call, now: Nanos) -> Option<Refusal> {
        let refusal = self.near.refused(call.limit, call.near.0, now.0);
        if refusal.is_some() {
            self.stats.near_hits.fetch_add(1, Ordering::Relaxed);
        }
        refusal
    }

    /// Remembers that Redis refused `call` (from `now` on, as `refusal` says).
    pub(crate) fn remember_refusal(&self, call: &Call, refusal: Refusal, now: Nanos) {
        self.near.remember(call.limit, call.near.0, refusal, now.0);
    }

    /// Decides `calls` (a request's global limits) for `cost` units, all or nothing, at
    /// Redis's time (or `at`, for tests replaying a schedule).
    pub async fn decide(
        self: &Arc<Self>,
        calls: &[Call],
        cost: u64,
        at: Option<RedisTime>,
    ) -> Result<Verdicts, StoreError> {
        if !self.breaker.allows() {
            self.stats.skipped.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::Open);
        }
        self.stats.calls.fetch_add(1, Ordering::Relaxed);
        let ids: SmallVec<[String; 2]> = calls
            .iter()
            .map(|c| match self.spec(c.limit).leases {
                true => format!("{:016x}-{}", self.instance, self.lease_seq.fetch_add(1, Ordering::Relaxed)),
                false => String::new(),
            })
            .collect();
        let batches = self.batches(calls.iter().map(|c| c.base.as_str()));
        let parts = |batch: &Batch| -> Parts {
            let part = |c: &Call, lease: &String| Part {
                limit: c.limit,
                burst: c.burst,
                count: c.count,
                base: c.base.clone(),
                lease: lease.clone(),
            };
            batch.iter().map(|&c| part(&calls[c], &ids[c])).collect()
        };
        let replies = match batches.as_slice() {
            // At Redis's own time on a standalone Redis (one batch), the decision may share
            // a call with other requests' (`queue`), which answers it by its deadline.
            [batch] if at.is_none() && !self.cluster => self.decide_queued(parts(batch), cost).await.map(|r| vec![r]),
            // A cluster's batches, or a decision at a given time (`at`: tests replaying a
            // schedule), are calls of their own.
            _ => {
                let sent = batches.iter().map(|batch| {
                    let (call, windows) =
                        script::decide_call(&self.specs, at, self.clock.now(), std::iter::once((cost, &parts(batch))));
                    async move { self.invoke_decide(&call, windows).await }
                });
                match tokio::time::timeout(self.timeout, join_all(sent)).await {
                    Ok(replies) => replies.into_iter().collect::<Result<Vec<_>, _>>(),
                    Err(_) => Err(StoreError::Timeout(self.timeout)),
                }
            }
        };
        let replies = match replies {
            Ok(replies) => replies,
            Err(e) => {
                self.failed(&e);
                // A lease a late reply may still have taken is given back (or lapses).
                for (call, id) in calls.iter().zip(&ids).filter(|(_, id)| !id.is_empty()) {
                    drop(Lease {
                        store: Arc::clone(self),
                        limit: call.limit,
                        key: self.spec(call.limit).key(&call.base, 0),
                        id: id.clone(),
                    });
                }
                return Err(e);
            }
        };
        self.answered();
        // Refusals are remembered from the reply's arrival, at or after Redis decided:
        // a client told the time left from then on is never early.
        Ok(self.verdicts(calls, &batches, &replies, &ids, cost, self.clock.now()))
    }

    /// Calls grouped by Redis Cluster slot (all in one on a standalone Redis).
    fn batches<'a>(&self, bases: impl Iterator<Item = &'a str>) -> SmallVec<[Batch; 1]> {
        let mut batches: SmallVec<[(Option<Slot>, Batch); 1]> = SmallVec::new();
        for (i, base) in bases.enumerate() {
            let slot = self.cluster.then(|| Slot::for_key(base));
            match batches.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, batch)) => batch.push(i),
                None => batches.push((slot, SmallVec::from_slice(&[i]))),
            }
        }
        batches.into_iter().map(|(_, batch)| batch).collect()
    }

    /// Takes back an admission of `cost` by `limit` for `base` made at Redis time `at`,
    /// in the background.
    pub fn refund(self: &Arc<Self>, limit: LimitId, base: String, at: RedisTime, cost: u64) {
        let store = Arc::clone(self);
        tokio::spawn(async move { store.take_back(limit, &base, at, cost).await });
    }

    /// Takes back an admission now, waiting at most a few timeouts (a failure leaves it
    /// counted, and is logged).
    async fn take_back(&self, limit: LimitId, base: &str, at: RedisTime, cost: u64) {
        let mut call = ScriptCall::new(&REFUND);
        call.arg(at.secs).arg(at.micros).arg(cost);
        self.spec(limit).push_refund(base, at, &mut call);
        let wait = self.timeout * 4;
        let result = tokio::time::timeout(wait, self.connections.invoke(&call)).await;
        if let Ok(Err(e)) | Err(e) = result.map_err(|_| StoreError::Timeout(wait)).map(|r| r.map_err(StoreError::from))
        {
            warn!(limit = %self.spec(limit).name, error = %e, "a global admission could not be taken back");
        }
    }

    /// Debits `units` from the key `base` of `limit` at Redis's own time, past its
    /// quota if need be (`charge:`), waiting at most a few timeouts (a failure leaves
    /// the debt unpaid, and is logged).
    async fn debit(&self, limit: LimitId, base: &str, units: u64) {
        let mut call = ScriptCall::new(&CHARGE);
        call.arg("").arg("");
        self.spec(limit).push_charge(base, self.clock.now(), units, &mut call);
        let wait = self.timeout * 4;
        let result = tokio::time::timeout(wait, self.connections.invoke(&call)).await;
        if let Ok(Err(e)) | Err(e) = result.map_err(|_| StoreError::Timeout(wait)).map(|r| r.map_err(StoreError::from))
        {
            warn!(limit = %self.spec(limit).name, error = %e, units, "a charge could not be debited");
        }
    }

    fn spec(&self, limit: LimitId) -> &Spec {
        self.specs[limit].as_ref().expect("only global limits reach the store")
    }
}

/// `{prefix}{{{name}:{hash:032x}}}`, written out: `format!` cost more than the rest of
/// the key's work (docs/performance.md).
fn key_base(prefix: &str, name: &str, hash: u128) -> String {
    let mut base = String::with_capacity(prefix.len() + name.len() + 35);
    base.push_str(prefix);
    base.push('{');
    base.push_str(name);
    base.push(':');
    for shift in (0..32).rev() {
        base.push(char::from(b"0123456789abcdef"[(hash >> (shift * 4)) as usize & 15]));
    }
    base.push('}');
    base
}

#[cfg(test)]
mod tests {
    #[test]
    fn key_bases_are_the_prefix_the_limit_and_32_hex_digits() {
        for hash in [0, 1, 0xabc, u128::MAX, 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210] {
            assert_eq!(super::key_base("sg:", "per_ip", hash), format!("sg:{{per_ip:{hash:032x}}}"));
        }
    }
}
