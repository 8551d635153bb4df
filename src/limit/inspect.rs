//! What the admin API shows of a limit's keys, and the changes it may make: one key's
//! state, resetting a key, listing and lifting bans. Not on the request path.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::algorithm::Held;
use super::{Limiters, Verdict};
use crate::ids::LimitId;
use crate::policy::key::KeySource;

/// One key of one limit, as a request with it would find it now.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeyState {
    /// The key as log lines write it (`KeyText`).
    pub key: String,
    /// Banned for this long still, if banned.
    pub ban_left_ms: Option<u64>,
    /// The count the operator gave the key (`PUT /overrides`), as it applies (clamped to
    /// `limit_from`'s bounds): its windows are said under it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own_count: Option<u64>,
    /// One per window (one unless the limit has `rates:`).
    pub windows: Vec<WindowState>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WindowState {
    /// A request of cost 1 would be admitted now (perhaps after a delay): never while the
    /// key is banned.
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
    /// As log lines write it (`None` for the instant between the ban's start and its
    /// naming).
    pub key: Option<Box<str>>,
    pub left_ms: u64,
}

/// What `Limiters::lift` found for the key it was given.
#[derive(Debug, PartialEq, Eq)]
pub enum Lifted {
    /// The one ban with this key or digest is lifted.
    Lifted,
    /// No running ban has this key or digest.
    NoSuchBan,
    /// Several running bans' keys hold this digest (a part they share): give the key.
    Ambiguous(usize),
}

fn ms(ns: u64) -> u64 {
    Duration::from_nanos(ns).as_millis().try_into().unwrap_or(u64::MAX)
}

impl Limiters {
    /// `limit`'s state for the key of `src` (`None`: `src` has no key for it),
    /// decided as a request of cost 1 would be, without storing anything.
    pub fn inspect(&self, limit: LimitId, src: &KeySource<'_>) -> Option<KeyState> {
        let limiter = &self.limits[limit];
        let key = limiter.key.hash(src, &self.secret.seed)?;
        let t = self.clock.now();
        let ban_left = limiter.bans.as_ref().and_then(|b| b.left(&b.lock(key.0), key.0, t.0));
        // (A count a request's field or claim would give is not known without it.)
        let own_count = limiter.tenant.as_ref().and_then(|t| Some(t.from.fit(t.set.given(key)?).count()));
        let count = limiter.count(own_count);
        let windows = limiter
            .windows
            .iter()
            .map(|algorithm| match (ban_left, algorithm.lock_as(key, None, count).decide(key, t, 1)) {
                // A ban refuses whatever the window says, for the time it has left (as
                // the gate decides: `Group::decide`).
                (Some(left), Verdict::Admit { excess, .. } | Verdict::Reject { excess, .. }) => {
                    WindowState { admits: false, remaining: 0, reset_ms: ms(left), retry_after_ms: ms(left), excess }
                }
                (None, Verdict::Admit { remaining, reset, excess, .. }) => WindowState {
                    admits: true,
                    remaining: remaining + 1,
                    reset_ms: ms(reset),
                    retry_after_ms: 0,
                    excess,
                },
                (None, Verdict::Reject { retry_after, remaining, reset, excess }) => WindowState {
                    admits: false,
                    remaining,
                    reset_ms: ms(reset),
                    retry_after_ms: ms(retry_after),
                    excess,
                },
            })
            .collect();
        Some(KeyState { key: self.key_label(limit, src), ban_left_ms: ban_left.map(ms), own_count, windows })
    }

    /// Forgets the key of `src` in `limit` (and lifts its ban): its next request is
    /// a fresh key's. `None`: `src` has no key for this limit. A concurrency limit keeps
    /// its count of requests in flight, which only their ends may change.
    pub fn reset(&self, limit: LimitId, src: &KeySource<'_>) -> Option<()> {
        let limiter = &self.limits[limit];
        let key = limiter.key.hash(src, &self.secret.seed)?;
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

    /// The keys `limit` bans now.
    pub fn banned(&self, limit: LimitId) -> Vec<Banned> {
        let Some(bans) = &self.limits[limit].bans else { return Vec::new() };
        bans.list(self.clock.now().0).into_iter().map(|(_, key, left)| Banned { key, left_ms: ms(left) }).collect()
    }

    /// Lifts, in `limit`, the ban of the key `given` as `GET /bans` writes it, or by
    /// one of its digests (with or without its `#`).
    pub fn lift(&self, limit: LimitId, given: &str) -> Lifted {
        let Some(bans) = &self.limits[limit].bans else { return Lifted::NoSuchBan };
        let now = self.clock.now().0;
        let digest = format!("#{}", given.trim_start_matches('#'));
        let named: Vec<(u64, Box<str>)> =
            bans.list(now).into_iter().filter_map(|(k, name, _)| Some((k, name?))).collect();
        let whole: Vec<&(u64, Box<str>)> = named.iter().filter(|(_, name)| **name == *given).collect();
        let matching = if whole.is_empty() {
            named.iter().filter(|(_, name)| name.split(' ').any(|part| part.ends_with(&format!("={digest}")))).collect()
        } else {
            whole
        };
        match matching[..] {
            [] => Lifted::NoSuchBan,
            [(key, _)] => {
                bans.lift(*key, now);
                Lifted::Lifted
            }
            _ => Lifted::Ambiguous(matching.len()),
        }
    }
}
