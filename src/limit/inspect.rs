//! What the admin API shows of a limit's keys, and the changes it may make: one key's
//! state, resetting a key, listing and lifting bans. Not on the request path.

use std::time::Duration;

use serde::Serialize;

use super::algorithm::Held;
use super::{Limiters, Verdict};
use crate::policy::key::KeySource;

/// One key of one limit, as a request with it would find it now.
#[derive(Debug, Serialize)]
pub struct KeyState {
    /// The key's keyed hash, as log lines show it with `log_keys: hashed`.
    pub key: String,
    /// Banned for this long still, if banned.
    pub ban_left_ms: Option<u64>,
    /// One per window (one unless the limit has `rates:`).
    pub windows: Vec<WindowState>,
}

#[derive(Debug, Serialize)]
pub struct WindowState {
    /// A request of cost 1 would be admitted now (perhaps after a delay).
    pub admits: bool,
    /// Requests (units) the key could still make now without rejection.
    pub remaining: u64,
    /// Until the key's full quota is back.
    pub reset_ms: u64,
    /// When a refused request would be admitted (0 when it is admitted).
    pub retry_after_ms: u64,
    /// nginx's excess, in requests; for concurrency limits, the requests in flight.
    pub excess: f64,
}

/// One banned key.
#[derive(Debug, Serialize)]
pub struct Banned {
    pub key: String,
    pub left_ms: u64,
}

fn ms(ns: u64) -> u64 {
    Duration::from_nanos(ns).as_millis().try_into().unwrap_or(u64::MAX)
}

/// How keys are named: the same keyed hash as the log's.
pub fn label(key: u64) -> String {
    format!("#{key:016x}")
}

impl Limiters {
    /// Limit `index`'s state for the key of `src` (`None`: `src` has no key for it),
    /// decided as a request of cost 1 would be, without storing anything.
    pub fn inspect(&self, index: usize, src: &KeySource<'_>) -> Option<KeyState> {
        let limiter = &self.limits[index];
        let key = limiter.key.hash(src, &self.seed)?;
        let t = self.clock.now();
        let ban_left_ms = limiter.bans.as_ref().and_then(|b| b.left(&b.lock(key.0), key.0, t.0)).map(ms);
        let windows = limiter
            .windows
            .iter()
            .map(|algorithm| match algorithm.lock(key).decide(key, t, 1) {
                Verdict::Admit { remaining, reset, excess, .. } => WindowState {
                    admits: true,
                    remaining: remaining + 1,
                    reset_ms: ms(reset),
                    retry_after_ms: 0,
                    excess,
                },
                Verdict::Reject { retry_after, remaining, reset, excess } => WindowState {
                    admits: false,
                    remaining,
                    reset_ms: ms(reset),
                    retry_after_ms: ms(retry_after),
                    excess,
                },
            })
            .collect();
        Some(KeyState { key: label(key.0), ban_left_ms, windows })
    }

    /// Forgets the key of `src` in limit `index` (and lifts its ban): its next request is
    /// a fresh key's. `None`: `src` has no key for this limit. A concurrency limit keeps
    /// its count of requests in flight, which only their ends may change.
    pub fn reset(&self, index: usize, src: &KeySource<'_>) -> Option<()> {
        let limiter = &self.limits[index];
        let key = limiter.key.hash(src, &self.seed)?;
        for algorithm in limiter.windows.iter() {
            let mut held = algorithm.lock(key);
            if !matches!(held, Held::Concurrency(..)) {
                held.forget(key);
            }
        }
        if let Some(bans) = &limiter.bans {
            bans.lift(key.0, self.clock.now().0);
        }
        Some(())
    }

    /// The keys limit `index` bans now.
    pub fn banned(&self, index: usize) -> Vec<Banned> {
        let Some(bans) = &self.limits[index].bans else { return Vec::new() };
        bans.list(self.clock.now().0)
            .into_iter()
            .map(|(key, left)| Banned { key: label(key), left_ms: ms(left) })
            .collect()
    }

    /// Lifts the ban of the key labelled `label` (`#` and 16 hex digits) in limit
    /// `index`; true if it was banned.
    pub fn lift(&self, index: usize, label: &str) -> bool {
        let key = label.strip_prefix('#').and_then(|hex| u64::from_str_radix(hex, 16).ok());
        match (key, &self.limits[index].bans) {
            (Some(key), Some(bans)) => bans.lift(key, self.clock.now().0),
            _ => false,
        }
    }
}
