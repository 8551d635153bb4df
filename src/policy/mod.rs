//! The words a limit is written in, shared by the configuration that compiles limits
//! and the code that enforces them: what a limit allows (`Policy`, `Rate`), where it
//! keeps its state (`Scope`, `OnStoreError`), what it counts by (`key`) and whom it lets
//! through (`allow`). A leaf: it imports no other module of the crate.

pub mod allow;
pub mod calendar;
pub mod charge;
pub mod key;
pub mod tenant;

use std::fmt;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ids::LimitId;
use calendar::Calendar;

/// A concurrency limit's waiting room (`queue:`): a request that finds no slot waits for
/// one, in a queue of at most `max` requests for the limit's key, each for `max_wait` at
/// most; the slots freed are handed to the waiting requests in turn by the flows that
/// `fair_by` tells apart (one request of each flow waiting, then the next of each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queue {
    pub max: usize,
    pub max_wait: Duration,
    pub fair_by: key::KeySpec,
    /// Its classes, highest first (none: every request is of one class).
    pub classes: Box<[QueueClass]>,
}

/// A class of a queue's requests (`classes:`): those its `match` admits (the last class:
/// every request no class admits). A slot goes to the highest class with requests
/// waiting; a full queue sheds the lowest class first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueClass {
    pub name: String,
    pub matcher: allow::Allow,
    /// The share (percent, 0: none) of the slots handed on that it is sure of while it
    /// has requests waiting, whatever the classes above it want (`share:`).
    pub share: u8,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Policy {
    /// Request rate with nginx `limit_req` semantics. GCRA, the token bucket and the
    /// minimum interval are this with other parameters (see `limits`).
    Rate {
        rate: Rate,
        /// Excess requests admitted beyond the rate (nginx `burst`).
        burst: u64,
        /// Excess requests admitted without waiting: 0 by default (every excess
        /// request waits), `burst` for `nodelay`, N for `delay: N`.
        delay: u64,
    },
    /// At most `limit` requests per `window`.
    FixedWindow { limit: u64, window: Window },
    /// `prev · (1 − elapsed/window) + curr` at most `limit`, windows aligned to the epoch.
    SlidingWindow { limit: u64, window: Duration },
    /// At most `limit` admissions in any interval of `window`, exactly.
    SlidingLog { limit: u64, window: Duration },
    /// Requests in progress (nginx `limit_conn`); a rejection says `Retry-After`. With
    /// `adaptive`, `max` is the most the ceiling it learns may reach.
    Concurrency { max: u64, retry_after: Duration, adaptive: Option<Adaptive> },
}

/// A concurrency ceiling that learns (`concurrency: adaptive`): it starts at `min`, moves
/// once a `window` by the latency of the requests that held its slots, and stays within
/// `min` and the limit's `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Adaptive {
    pub min: u64,
    pub window: Duration,
}

impl Policy {
    pub fn is_concurrency(&self) -> bool {
        matches!(self, Policy::Concurrency { .. })
    }

    /// What a key holds when it is full: its `capacity`, or a concurrency limit's `max`
    /// (requests in flight).
    pub fn full(&self) -> u64 {
        match *self {
            Policy::Concurrency { max, .. } => max,
            _ => self.capacity().unwrap_or(u64::MAX),
        }
    }

    /// The most this policy admits at once, in units: a request that weighs more could
    /// never pass (`None`: a concurrency limit counts requests, not units).
    pub fn capacity(&self) -> Option<u64> {
        match *self {
            Policy::Rate { burst, .. } => Some(burst.saturating_add(1)),
            Policy::FixedWindow { limit, .. }
            | Policy::SlidingWindow { limit, .. }
            | Policy::SlidingLog { limit, .. } => Some(limit),
            Policy::Concurrency { .. } => None,
        }
    }
}

/// The window of a fixed-window limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Window {
    /// This long, windows aligned to the Unix epoch (`[k·length, (k+1)·length)`).
    Every(Duration),
    /// A day, week or month of a time zone's calendar.
    Calendar(Calendar),
}

/// Where a limit keeps its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// In this process.
    Local,
    /// In Redis, shared by every instance; `instances` divides the local fallback's rate.
    Global { on_store_error: OnStoreError, instances: u64 },
}

/// `count` requests per `per`, kept exactly as written (nginx truncates `1r/m` to
/// 16 milli-requests per second; we do not).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    pub count: u64,
    pub per: Duration,
}

impl Rate {
    /// The emission interval `per / count` in nanoseconds, rounded to the nearest
    /// nanosecond: the only approximation, a relative error below 1e-9 for any rate
    /// slower than one request per microsecond.
    pub fn period_ns(&self) -> u64 {
        let per = self.per.as_nanos();
        let count = u128::from(self.count);
        u64::try_from((per + count / 2) / count).unwrap_or(u64::MAX)
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}r/{}", self.count, humantime::format_duration(self.per))
    }
}

/// What a limit does with a request that lacks its key (every part of it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OnMissingKey {
    /// Not counted, as nginx does with an empty key.
    #[default]
    Skip,
    /// Counted under one key shared by every request that lacks it.
    Shared,
    /// Refused with `400`, naming the limit and the key.
    Refuse,
}

/// What a limit keyed on a token's claims does with a request whose token does not verify.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnInvalidToken {
    /// Refused with `401` and `WWW-Authenticate: Bearer error="invalid_token"`.
    #[default]
    Refuse,
    /// Taken as carrying no token: its claims are missing (`on_missing_key` decides).
    MissingKey,
}

/// What a global limit does while Redis cannot answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OnStoreError {
    /// Admit the request (fail open).
    Allow,
    /// Refuse it with 503 (fail closed).
    Deny,
    /// Decide it with a local limiter of the same policy (its rate divided by `instances`).
    Local,
}

/// A route's own `burst` and delay on a rate limit: nginx's model, where one zone keeps
/// one `excess` per key and each `limit_req` line that uses it brings its own `burst`
/// and `delay`/`nodelay`. The limit's state is shared; only these parameters differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Burst {
    /// Excess requests admitted beyond the rate.
    pub burst: u64,
    /// Excess requests admitted without waiting (`burst` for `nodelay`), at most `burst`.
    pub delay: u64,
}

impl Burst {
    /// This burst for one of `instances` sharing a global limit: as `limit`'s local twin
    /// shares the limit's own (the requests admitted at once, `burst + 1`, are divided).
    pub fn shared(self, instances: u64) -> Burst {
        let burst = (self.burst.saturating_add(1)).div_ceil(instances.max(1)).max(1) - 1;
        Burst { burst, delay: self.delay.min(burst) }
    }
}

/// One limit a route applies, with the route's own burst and delay on it (`None`: the
/// limit's own), and, once the gate has chosen the limits of a request, its key's own
/// count (`limit_from`; `None`: the limit's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitUse {
    pub limit: LimitId,
    pub burst: Option<Burst>,
    pub count: Option<u64>,
}

impl LimitUse {
    /// Limit `limit` with its own burst, delay and count.
    pub fn plain(limit: LimitId) -> LimitUse {
        LimitUse { limit, burst: None, count: None }
    }
}
