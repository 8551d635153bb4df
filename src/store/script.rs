//! The Lua side of global limits: the scripts, and each limit's arguments to them.
//!
//! One Lua module per algorithm (`lua/*.lua`, each the Redis twin of a `limit/*.rs`)
//! and a driver per operation are joined into three scripts: `DECIDE` runs every global
//! limit of a request in one atomic call, `REFUND` takes admissions back, `RENEW`
//! extends concurrency leases. Each is sent as `EVALSHA` and loaded again on `NOSCRIPT`
//! (redis-rs's `Script` does both).

use std::sync::LazyLock;

use redis::Script;

use crate::config::{Limit, Policy};

const ALGORITHMS: &str = concat!(
    include_str!("lua/time.lua"),
    include_str!("lua/leaky_bucket.lua"),
    include_str!("lua/fixed_window.lua"),
    include_str!("lua/sliding_window.lua"),
    include_str!("lua/sliding_log.lua"),
    include_str!("lua/concurrency.lua"),
    include_str!("lua/ban.lua"),
);

pub static DECIDE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{ALGORITHMS}{}", include_str!("lua/decide.lua"))));
pub static REFUND: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{ALGORITHMS}{}", include_str!("lua/refund.lua"))));
pub static RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{ALGORITHMS}{}", include_str!("lua/renew.lua"))));

/// Integers in each window's reply: admitted, wait or retry ns, remaining, reset ns,
/// excess in thousandths, banned.
pub const REPLY_FIELDS: usize = 6;

/// One window of a global limit as the scripts take it.
#[derive(Debug)]
struct Window {
    kind: &'static str,
    params: [u64; 3],
}

/// A global limit's fixed part of every call: its windows' parameters and its ban.
#[derive(Debug)]
pub struct Spec {
    pub name: String,
    windows: Vec<Window>,
    /// Ban and ban_max, ns (0: no ban).
    ban: [u64; 2],
    pub dry_run: bool,
    pub counted: Option<Box<[u16]>>,
}

fn ns(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Spec {
    pub fn new(limit: &Limit, lease_ttl_ms: u64) -> Spec {
        let windows = limit
            .windows
            .iter()
            .map(|policy| match *policy {
                Policy::Rate { rate, burst, delay } => {
                    let period = rate.period_ns();
                    Window { kind: "lb", params: [period, burst * period, delay * period] }
                }
                Policy::FixedWindow { limit, window } => {
                    Window { kind: "fw", params: [limit, window.as_millis() as u64, 0] }
                }
                Policy::SlidingWindow { limit, window } => {
                    Window { kind: "sw", params: [limit, window.as_millis() as u64, 0] }
                }
                Policy::SlidingLog { limit, window } => Window { kind: "sl", params: [limit, ns(window), 0] },
                Policy::Concurrency { max, retry_after } => {
                    Window { kind: "cc", params: [max, ns(retry_after), lease_ttl_ms] }
                }
            })
            .collect();
        Spec {
            name: limit.name.clone(),
            windows,
            ban: limit.ban.map_or([0, 0], |b| [ns(b.base), ns(b.max)]),
            dry_run: limit.dry_run,
            counted: limit.count.clone(),
        }
    }

    pub fn windows(&self) -> usize {
        self.windows.len()
    }

    /// Whether its window `window` is a concurrency limit, whose admissions take a lease.
    pub fn leases(&self, window: usize) -> bool {
        self.windows[window].kind == "cc"
    }

    /// The Redis key of window `window` for the key `base`.
    pub fn key(&self, base: &str, window: usize) -> String {
        format!("{base}:{}{window}", self.windows[window].kind)
    }

    /// Appends this limit's group to a `DECIDE` call for the key `base`; `lease` names
    /// the lease a concurrency window takes.
    pub fn push_decide(&self, base: &str, lease: &str, keys: &mut Vec<String>, args: &mut Vec<String>) {
        args.push(if self.dry_run { "1" } else { "0" }.to_owned());
        args.push(self.windows.len().to_string());
        args.extend(self.ban.iter().map(u64::to_string));
        for (i, w) in self.windows.iter().enumerate() {
            keys.push(self.key(base, i));
            args.push(w.kind.to_owned());
            args.extend(w.params.iter().map(u64::to_string));
            args.push(if w.kind == "cc" { lease.to_owned() } else { String::new() });
        }
        if self.ban[0] > 0 {
            keys.push(format!("{base}:ban"));
        }
    }

    /// Appends this limit's windows to a `REFUND` call for the key `base`.
    pub fn push_refund(&self, base: &str, keys: &mut Vec<String>, args: &mut Vec<String>) {
        for (i, w) in self.windows.iter().enumerate() {
            keys.push(self.key(base, i));
            args.push(w.kind.to_owned());
            args.extend(w.params.iter().map(u64::to_string));
            args.push(String::new());
        }
    }
}
