//! Global limits: their state in Redis, shared by every sluicegate instance.
//!
//! `Store::decide` sends one `DECIDE` script call with every global limit of a request
//! (on a Redis Cluster, one per hash slot, concurrently), bounded by `redis.timeout` and
//! guarded by a circuit breaker. Keys are `{prefix}{limit:hash}:kind+window`: the hash
//! tag holds a limit's key together (its windows and its ban share one slot). What the
//! request path does when this fails is the limits' `on_store_error` (see
//! `limit::global`); this module counts failures and fallbacks and logs them at most
//! once per `REPORT_EVERY`.

pub mod breaker;
mod connection;
pub mod lease;
pub mod near_cache;
mod script;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use redis::cluster_routing::Slot;
use redis::{FromRedisValue, RedisError};
use smallvec::SmallVec;
use tracing::{info, warn};

use crate::config::{Config, OnStoreError, Scope};
use crate::limit::{Outcome, Standing};
use breaker::{Breaker, Change};
use connection::Connections;
pub use lease::Lease;
use near_cache::{NearCache, Refusal};
use script::{REFUND, REPLY_FIELDS, Spec};

/// Fallback log lines come at most this often, each with the counts since the last.
const REPORT_EVERY: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("circuit breaker open")]
    Open,
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Redis(#[from] RedisError),
    #[error("unexpected reply from the decide script ({0} integers)")]
    Reply(usize),
}

/// Counts since start, for the fallback log lines and `/metrics` (`Store::counts`).
#[derive(Default)]
struct Stats {
    /// Decisions asked of Redis (one per request, whatever the number of slots).
    calls: AtomicU64,
    /// Requests refused by the near-cache without a call.
    near_hits: AtomicU64,
    /// Calls that failed or timed out.
    errors: AtomicU64,
    /// Requests decided without Redis because the breaker was open.
    skipped: AtomicU64,
    /// Global limit decisions made by `on_store_error`: allow, deny, local.
    fallbacks: [AtomicU64; 3],
}

/// Counts since start: see `Stats`.
pub struct StoreCounts {
    pub calls: u64,
    pub near_hits: u64,
    pub errors: u64,
    pub skipped: u64,
    /// By `on_store_error`: allow, deny, local.
    pub fallbacks: [u64; 3],
    /// The circuit breaker is open: global limits are decided by `on_store_error`.
    pub breaker_open: bool,
}

/// One global limit of a request: its index and the Redis key base of the request's key.
pub struct Call {
    pub limit: usize,
    pub base: String,
    /// The key's 64-bit hash, for the near-cache.
    pub near: u64,
}

/// A global admission that `settle` may take back.
pub struct Admission {
    pub limit: usize,
    /// The key base.
    pub base: String,
    /// Redis time of the admission, (s, µs).
    pub at: (u64, u64),
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
}

/// Calls (indices) that go to Redis in one script call.
type Batch = SmallVec<[usize; 2]>;

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

pub struct Store {
    connections: Connections,
    /// Per limit, indexed like `Config::limits` (`None`: local).
    specs: Box<[Option<Spec>]>,
    prefix: String,
    cluster: bool,
    timeout: Duration,
    lease_ttl: Duration,
    breaker: Breaker,
    near: NearCache,
    leases: lease::Book,
    /// Lease ids: this instance's random tag and a sequence number.
    instance: u64,
    lease_seq: AtomicU64,
    stats: Stats,
    /// When the last fallback line was logged, and the counts it reported.
    reported: Mutex<(Option<Instant>, [u64; 5])>,
}

impl Store {
    /// The store of `config`'s global limits, if it has any; starts connecting and
    /// renewing leases in the background (call within a Tokio runtime).
    pub fn new(config: &Config) -> Option<Arc<Store>> {
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
            breaker: Breaker::new(redis.breaker_failures, redis.breaker_window, redis.breaker_cooldown),
            near: NearCache::new(config.limits.iter().map(|l| global(&l.scope)), redis.near_cache_keys),
            leases: lease::Book::default(),
            instance: std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), Instant::now()),
            lease_seq: AtomicU64::new(0),
            stats: Stats::default(),
            reported: Mutex::new((None, [0; 5])),
        });
        if config.limits.iter().any(|l| global(&l.scope) && l.windows.iter().any(|p| p.is_concurrency())) {
            tokio::spawn(lease::renew(Arc::downgrade(&store)));
        }
        Some(store)
    }

    pub fn is_global(&self, limit: usize) -> bool {
        self.specs[limit].is_some()
    }

    /// The Redis key base of `limit` for a request whose key hashes to `hash`.
    pub fn base(&self, limit: usize, hash: u128) -> String {
        let name = self.specs[limit].as_ref().map_or("", |s| s.name.as_str());
        format!("{}{{{name}:{hash:032x}}}", self.prefix)
    }

    /// The near-cache's refusal of a one-unit request for `call` at `now`, if it has one.
    pub fn near_refused(&self, call: &Call, now: u64) -> Option<Refusal> {
        let refusal = self.near.refused(call.limit, call.near, now);
        if refusal.is_some() {
            self.stats.near_hits.fetch_add(1, Ordering::Relaxed);
        }
        refusal
    }

    /// What the store has counted since start, for `/metrics`.
    pub fn counts(&self) -> StoreCounts {
        let s = &self.stats;
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StoreCounts {
            calls: load(&s.calls),
            near_hits: load(&s.near_hits),
            errors: load(&s.errors),
            skipped: load(&s.skipped),
            fallbacks: [load(&s.fallbacks[0]), load(&s.fallbacks[1]), load(&s.fallbacks[2])],
            breaker_open: self.breaker.is_open(),
        }
    }

    /// Decides `calls` (a request's global limits) for `cost` units, all or nothing, at
    /// Redis's time (or `clock`, as (s, µs), for tests replaying a schedule).
    pub async fn decide(
        self: &Arc<Self>,
        calls: &[Call],
        cost: u64,
        clock: Option<(u64, u64)>,
    ) -> Result<Verdicts, StoreError> {
        let now = crate::limit::now();
        if !self.breaker.allows(now) {
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
        let sent = batches.iter().map(|batch| self.decide_batch(calls, batch, &ids, cost, clock));
        let replies = match tokio::time::timeout(self.timeout, join_all(sent)).await {
            Ok(replies) => replies.into_iter().collect::<Result<Vec<_>, _>>(),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        };
        let replies = match replies {
            Ok(replies) => replies,
            Err(e) => {
                self.failed(&e);
                // A lease a late reply may still have taken is given back (or lapses).
                for (call, id) in calls.iter().zip(&ids).filter(|(_, id)| !id.is_empty()) {
                    drop(Lease {
                        store: Arc::clone(self),
                        key: self.spec(call.limit).key(&call.base, 0),
                        id: id.clone(),
                    });
                }
                return Err(e);
            }
        };
        if self.breaker.succeeded() == Change::Closed {
            info!("Redis answers again: global limits are decided by Redis");
        }
        // Refusals are remembered from the reply's arrival, at or after Redis decided:
        // a client told the time left from then on is never early.
        Ok(self.verdicts(calls, &batches, &replies, &ids, cost, crate::limit::now()))
    }

    /// Turns the replies into standings; on a rejection, takes back what other slots'
    /// calls admitted (a cluster only), and remembers the refused keys.
    fn verdicts(
        self: &Arc<Self>,
        calls: &[Call],
        batches: &[Batch],
        replies: &[Vec<u64>],
        ids: &[String],
        cost: u64,
        now: u64,
    ) -> Verdicts {
        let mut standings = SmallVec::new();
        // Calls whose state the script stored: those of batches no enforced limit
        // rejected, less dry-run limits that would have (they store nothing).
        let mut committed: SmallVec<[(usize, (u64, u64)); 2]> = SmallVec::new();
        let mut rejected = false;
        for (batch, reply) in batches.iter().zip(replies) {
            let at = (reply[0], reply[1]);
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
                match (longest, spec.dry_run) {
                    (None, _) => stored.push(c),
                    (Some(_), true) => {}
                    (Some((after, reset, window)), false) => {
                        batch_rejects = true;
                        // The near-cache knows when a request of one unit passes again
                        // (a concurrency slot may free up any moment: not for those).
                        if cost == 1 && !spec.leases {
                            let at = |d: Duration| now.saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
                            let refusal = Refusal { until: at(after), reset: at(reset), window };
                            self.near.remember(calls[c].limit, calls[c].near, refusal, now);
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
                let lease = Lease { store: Arc::clone(self), key: spec.key(&call.base, 0), id: ids[c].clone() };
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

    async fn decide_batch(
        &self,
        calls: &[Call],
        batch: &[usize],
        ids: &[String],
        cost: u64,
        clock: Option<(u64, u64)>,
    ) -> Result<Vec<u64>, StoreError> {
        let modules = batch.iter().fold(0, |m, &c| m | self.spec(calls[c].limit).modules);
        let mut invocation = script::decide(modules).prepare_invoke();
        match clock {
            Some((s, us)) => invocation.arg(s).arg(us),
            None => invocation.arg("").arg(""),
        };
        invocation.arg(cost).arg(batch.len());
        let mut windows = 0;
        for &c in batch {
            let spec = self.spec(calls[c].limit);
            spec.push_decide(&calls[c].base, &ids[c], &mut invocation);
            windows += spec.windows();
        }
        let value = self.connections.invoke(&invocation).await?;
        let reply = Vec::<u64>::from_redis_value(value).map_err(|_| StoreError::Reply(0))?;
        if reply.len() != 2 + windows * REPLY_FIELDS {
            return Err(StoreError::Reply(reply.len()));
        }
        Ok(reply)
    }

    /// Takes back an admission of `cost` by `limit` for `base` made at Redis time `at`,
    /// in the background.
    pub fn refund(self: &Arc<Self>, limit: usize, base: String, at: (u64, u64), cost: u64) {
        let store = Arc::clone(self);
        tokio::spawn(async move { store.take_back(limit, &base, at, cost).await });
    }

    /// Takes back an admission now, waiting at most a few timeouts (a failure leaves it
    /// counted, and is logged).
    async fn take_back(&self, limit: usize, base: &str, at: (u64, u64), cost: u64) {
        let mut invocation = REFUND.prepare_invoke();
        invocation.arg(at.0).arg(at.1).arg(cost);
        self.spec(limit).push_refund(base, &mut invocation);
        let wait = self.timeout * 4;
        let result = tokio::time::timeout(wait, self.connections.invoke(&invocation)).await;
        if let Ok(Err(e)) | Err(e) = result.map_err(|_| StoreError::Timeout(wait)).map(|r| r.map_err(StoreError::from))
        {
            warn!(limit = %self.spec(limit).name, error = %e, "a global admission could not be taken back");
        }
    }

    /// Counts a decision made by `on_store_error` and reports now and then.
    pub fn fell_back(&self, how: OnStoreError) {
        self.stats.fallbacks[how as usize].fetch_add(1, Ordering::Relaxed);
        self.report(None);
    }

    fn failed(&self, error: &StoreError) {
        self.stats.errors.fetch_add(1, Ordering::Relaxed);
        if self.breaker.failed(crate::limit::now()) == Change::Opened {
            warn!(error = %error, "Redis keeps failing: circuit breaker open, global limits use on_store_error until a probe succeeds");
        }
        self.report(Some(error));
    }

    /// One warn line per `REPORT_EVERY` at most, with what happened since the last.
    fn report(&self, error: Option<&StoreError>) {
        let Ok(mut reported) = self.reported.try_lock() else { return };
        let (last, before) = &mut *reported;
        if last.is_some_and(|at| at.elapsed() < REPORT_EVERY) {
            return;
        }
        let s = &self.stats;
        let now = [&s.errors, &s.skipped, &s.fallbacks[0], &s.fallbacks[1], &s.fallbacks[2]]
            .map(|c| c.load(Ordering::Relaxed));
        let d: Vec<u64> = now.iter().zip(before.iter()).map(|(n, b)| n - b).collect();
        warn!(
            errors = d[0],
            skipped = d[1],
            allowed = d[2],
            denied = d[3],
            local = d[4],
            error = error.map(ToString::to_string).unwrap_or_default(),
            "global limits without Redis: on_store_error decided (counts since the last such line)"
        );
        *last = Some(Instant::now());
        *before = now;
    }

    fn spec(&self, limit: usize) -> &Spec {
        self.specs[limit].as_ref().expect("only global limits reach the store")
    }
}

/// A window's reply fields as a standing of `limit`.
fn standing(limit: usize, window: usize, f: &[u64]) -> Standing {
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
