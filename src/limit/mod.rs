//! The limits of a route, decided together for one request.
//!
//! Each configured limit has a leaky bucket (its policy) and a key table (its state).
//! `Limiters::check` locks the shard of every applicable limit (in ascending limit
//! order, so two requests never wait on each other's locks crosswise), decides each,
//! and stores the new states only if every limit admits: a rejected request consumes
//! no quota anywhere. The request then waits the longest delay any limit asked for.

pub mod key;
pub mod leaky_bucket;
pub mod table;

use std::hash::RandomState;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use http::StatusCode;
use smallvec::SmallVec;

use crate::config::{Config, Limit};
use key::{KeySource, KeySpec};
use leaky_bucket::{LeakyBucket, Tat, Verdict};
use table::KeyTable;

/// Nanoseconds on the monotonic limiter clock (its origin: the first call).
pub fn now() -> u64 {
    static ORIGIN: LazyLock<Instant> = LazyLock::new(Instant::now);
    u64::try_from(ORIGIN.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

struct Limiter {
    key: KeySpec,
    status: StatusCode,
    bucket: LeakyBucket,
    table: KeyTable<Tat>,
}

/// Every configured limit, indexed like `Config::limits`.
pub struct Limiters {
    seed: RandomState,
    limits: Box<[Limiter]>,
}

/// Where one limit stands for the current request (for the `RateLimit` header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Standing {
    /// Index into `Config::limits`.
    pub limit: usize,
    /// Further requests this key could make right now without rejection.
    pub remaining: u64,
    /// Until the key's full quota is back.
    pub reset: Duration,
}

/// What the limits of a route make of a request. A rejection is an outcome, not an error.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Forward after `wait` (zero for most requests).
    Pass {
        wait: Duration,
        standings: SmallVec<[Standing; 4]>,
    },
    /// Answer `status` now; `limit` (index into `Config::limits`) is the rejecting limit
    /// that would admit the request last, after `retry_after`.
    Reject {
        limit: usize,
        status: StatusCode,
        retry_after: Duration,
        standings: SmallVec<[Standing; 4]>,
    },
}

impl Limiters {
    pub fn new(config: &Config) -> Self {
        Self::from_limits(&config.limits)
    }

    pub fn from_limits(limits: &[Limit]) -> Self {
        let limits = limits
            .iter()
            .map(|l| Limiter {
                key: l.key.clone(),
                status: l.status,
                bucket: LeakyBucket::new(l.rate, l.burst, l.delay),
                table: KeyTable::new(l.max_keys),
            })
            .collect();
        Limiters {
            seed: RandomState::new(),
            limits,
        }
    }

    /// Keys dropped with live state by limit `index` since start.
    pub fn evictions(&self, index: usize) -> u64 {
        self.limits[index].table.evictions()
    }

    /// Decides the request `src` against `limits` (ascending indices) at `now`.
    pub fn check(&self, limits: &[usize], src: &KeySource<'_>, now: u64) -> Decision {
        let keyed: SmallVec<[(usize, u64); 4]> = limits
            .iter()
            .filter_map(|&i| self.limits[i].key.hash(src, &self.seed).map(|k| (i, k)))
            .collect();
        let mut held: SmallVec<[_; 4]> = SmallVec::new();
        for &(i, key) in &keyed {
            let limiter = &self.limits[i];
            let shard = limiter.table.lock(key);
            let verdict = limiter.bucket.decide(shard.get(key), now);
            held.push((i, key, shard, verdict));
        }

        let mut rejected: Option<(usize, u64)> = None;
        let mut standings = SmallVec::new();
        for (i, _, _, verdict) in &held {
            let (remaining, reset) = match *verdict {
                Verdict::Admit {
                    remaining, reset, ..
                } => (remaining, reset),
                Verdict::Reject { retry_after, reset } => {
                    if rejected.is_none_or(|(_, longest)| retry_after > longest) {
                        rejected = Some((*i, retry_after));
                    }
                    (0, reset)
                }
            };
            standings.push(Standing {
                limit: *i,
                remaining,
                reset: Duration::from_nanos(reset),
            });
        }
        if let Some((limit, retry_after)) = rejected {
            return Decision::Reject {
                limit,
                status: self.limits[limit].status,
                retry_after: Duration::from_nanos(retry_after),
                standings,
            };
        }

        let mut wait = 0;
        for (i, key, mut shard, verdict) in held {
            if let Verdict::Admit { tat, wait: w, .. } = verdict {
                let limiter = &self.limits[i];
                limiter.table.put(&mut shard, key, tat, now, |&t| {
                    limiter.bucket.is_idle(t, now)
                });
                wait = wait.max(w);
            }
        }
        Decision::Pass {
            wait: Duration::from_nanos(wait),
            standings,
        }
    }
}
