//! The Lua side of global limits: the scripts, and each limit's arguments to them.
//!
//! One Lua module per algorithm (`lua/*.lua`, each the Redis twin of a `limit/*.rs`)
//! and a driver per operation are joined into scripts: `decide` runs every global limit
//! of a request in one atomic call, `REFUND` takes admissions back, `RENEW` extends
//! concurrency leases. Each is sent as `EVALSHA` and loaded again on `NOSCRIPT`
//! (`Connections::invoke`).

use std::io::Write;
use std::sync::{LazyLock, OnceLock};

use redis::{Cmd, RedisWrite, Script, ToRedisArgs};
use smallvec::SmallVec;
use typed_index_collections::TiSlice;

use super::RedisTime;

use crate::clock::Nanos;
use crate::config::{Limit, LimitId};
use crate::limit::leaky_bucket::MAX_DEBT_NS;
use crate::policy::calendar::Windows;
use crate::policy::{Burst, Policy, Rate, Window};

/// The algorithm modules, each with the code that names it in the scripts' arguments.
const MODULES: [(&str, &str); 6] = [
    ("lb", include_str!("lua/leaky_bucket.lua")),
    ("fw", include_str!("lua/fixed_window.lua")),
    ("sw", include_str!("lua/sliding_window.lua")),
    ("sl", include_str!("lua/sliding_log.lua")),
    ("cc", include_str!("lua/concurrency.lua")),
    ("ban", include_str!("lua/ban.lua")),
];

/// A script: the time helpers, the modules in `modules` (a bit per entry of `MODULES`;
/// the others stay empty tables), then `driver`.
fn script(modules: u8, driver: &str) -> Script {
    let mut source = String::from(include_str!("lua/time.lua"));
    source += "local leaky_bucket, fixed_window, calendar_window, sliding_window, sliding_log, concurrency, ban = \
               {}, {}, {}, {}, {}, {}, {}\n";
    for (bit, (_, module)) in MODULES.iter().enumerate() {
        if modules & (1 << bit) != 0 {
            source += module;
        }
    }
    Script::new(&(source + driver))
}

/// The `DECIDE` script with just the modules a call needs (`Spec::modules`, or-ed):
/// Redis runs the whole script on every call, so one that defines only the algorithms
/// in use costs it less. At most 64 variants, each made (and its SHA-1 computed) once.
pub fn decide(modules: u8) -> &'static Script {
    static SCRIPTS: [OnceLock<Script>; 64] = [const { OnceLock::new() }; 64];
    SCRIPTS[usize::from(modules & 63)].get_or_init(|| script(modules, include_str!("lua/decide.lua")))
}

pub static REFUND: LazyLock<Script> = LazyLock::new(|| script(0b1111, include_str!("lua/refund.lua")));
pub static CHARGE: LazyLock<Script> = LazyLock::new(|| script(0b11, include_str!("lua/charge.lua")));
pub static RENEW: LazyLock<Script> = LazyLock::new(|| script(0, include_str!("lua/renew.lua")));

/// A call of a script being built: its keys and its arguments, each added in turn.
///
/// In place of redis-rs's `ScriptInvocation`, which allocates a buffer per key and per
/// argument (a shared call of 64 requests has hundreds): here keys and arguments each
/// fill one buffer, and a key is written from its parts without being joined first.
pub struct ScriptCall {
    pub script: &'static Script,
    keys: Cmd,
    args: Cmd,
}

impl ScriptCall {
    pub fn new(script: &'static Script) -> ScriptCall {
        ScriptCall { script, keys: Cmd::new(), args: Cmd::new() }
    }

    pub fn arg(&mut self, arg: impl ToRedisArgs) -> &mut ScriptCall {
        arg.write_redis_args(&mut self.args);
        self
    }

    /// Adds the key that is `parts` joined.
    pub fn key(&mut self, parts: &[&str]) -> &mut ScriptCall {
        let mut key = self.keys.writer_for_next_arg();
        for part in parts {
            key.write_all(part.as_bytes()).expect("a Vec takes every write");
        }
        drop(key);
        self
    }

    /// The `EVALSHA` command.
    pub fn cmd(&self) -> Cmd {
        let (keys, args) = (self.keys.args_iter(), self.args.args_iter());
        let parts = keys.clone().chain(args.clone()).filter_map(|arg| match arg {
            redis::Arg::Simple(arg) => Some(arg),
            _ => None,
        });
        let mut cmd =
            Cmd::with_capacity(3 + keys.len() + args.len(), 64 + parts.clone().map(<[u8]>::len).sum::<usize>());
        cmd.arg("EVALSHA").arg(self.script.get_hash()).arg(keys.len());
        parts.for_each(|arg| cmd.write_arg(arg));
        cmd
    }
}

/// Integers in each window's reply (packed, 8 bytes each): admitted, wait or retry ns,
/// remaining, reset ns, excess in thousandths, banned.
pub const REPLY_FIELDS: usize = 6;

/// One global limit of a request as a `DECIDE` call carries it.
#[derive(Clone, Debug)]
pub struct Part {
    pub limit: LimitId,
    /// The route's own burst and delay on it (`None`: the limit's own).
    pub burst: Option<Burst>,
    /// The key's own count (`limit_from`; `None`: the limit's).
    pub count: Option<u64>,
    /// The Redis key base of the request's key.
    pub base: String,
    /// The lease a concurrency window takes ('' for others).
    pub lease: String,
}

/// A request's global limits as a `DECIDE` call carries them.
pub type Parts = SmallVec<[Part; 2]>;

/// A `DECIDE` call for `requests` (each its cost and its limits), at Redis's time or
/// `at`, with the number of windows it decides. Calendar windows are given from `at`,
/// else from `now` on the caller's clock. Each limit's fixed part is sent once per
/// burst and count it is used with (a route's own burst, a key's own count, are other
/// parameters on the same keys).
pub fn decide_call<'a>(
    specs: &TiSlice<LimitId, Option<Spec>>,
    at: Option<RedisTime>,
    now: Nanos,
    requests: impl Iterator<Item = (u64, &'a Parts)> + Clone,
) -> (ScriptCall, usize) {
    let instant = at.map_or(now, RedisTime::nanos);
    let spec = |limit: LimitId| specs[limit].as_ref().expect("only global limits reach the store");
    // Each limit with the route's own burst and the key's own count it is used with.
    type Used = (LimitId, Option<Burst>, Option<u64>);
    let mut used: SmallVec<[Used; 4]> = SmallVec::new();
    for part in requests.clone().flat_map(|(_, parts)| parts) {
        if !used.contains(&(part.limit, part.burst, part.count)) {
            used.push((part.limit, part.burst, part.count));
        }
    }
    let mut call = ScriptCall::new(decide(used.iter().fold(0, |m, &(l, ..)| m | spec(l).modules)));
    match at {
        Some(RedisTime { secs, micros }) => call.arg(secs).arg(micros),
        None => call.arg("").arg(""),
    };
    call.arg(requests.clone().count()).arg(used.len());
    for &(limit, burst, count) in &used {
        spec(limit).push_limit(burst, count, instant, &mut call);
    }
    let mut windows = 0;
    for (cost, parts) in requests {
        call.arg(cost).arg(parts.len());
        for part in parts {
            let index = used.iter().position(|&u| u == (part.limit, part.burst, part.count)).unwrap_or_default() + 1;
            spec(part.limit).push_use(index, &part.base, &part.lease, &mut call);
            windows += spec(part.limit).windows();
        }
    }
    (call, windows)
}

/// A global limit's fixed part of every call, formatted once.
#[derive(Debug)]
pub struct Spec {
    pub name: String,
    /// Per window: the key suffix (kind and window index), the kind and its three
    /// parameters (a calendar window's first: its instants are given per call).
    windows: Vec<(String, [String; 4])>,
    /// Per window, its policy: the parameters of a key's own count are made from it.
    policies: Vec<Policy>,
    /// A concurrency window's lease lifetime (its third parameter).
    lease_ttl_ms: u64,
    /// Per window, a calendar window's calendar: for the window of the call's instant
    /// (`0`) and the next one (`1`), each remembering the last it found.
    calendars: Vec<Option<(Windows, Windows)>>,
    /// `DECIDE`'s group header: whether it does not refuse (dry run, annotate), window
    /// count, ban and ban_max in ns.
    header: [String; 4],
    has_ban: bool,
    /// The modules its windows and ban need (bits of `MODULES`).
    pub modules: u8,
    /// Whether its (single) window is a concurrency limit, whose admissions take leases.
    pub leases: bool,
    /// It refuses a request over it (`Limit::refuses`): neither in dry run nor annotating.
    pub refuses: bool,
    pub counted: Option<Box<[u16]>>,
}

fn ns(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn module(kind: &str) -> u8 {
    // The calendar window is a fixed window: its module holds both.
    let kind = if kind == "cw" { "fw" } else { kind };
    1 << MODULES.iter().position(|(k, _)| *k == kind).unwrap_or(0)
}

impl Spec {
    pub fn new(limit: &Limit, lease_ttl_ms: u64) -> Spec {
        let windows: Vec<(String, [String; 4])> = limit
            .windows
            .iter()
            .enumerate()
            .map(|(i, policy)| {
                let (kind, params) = params_of(policy, None, lease_ttl_ms);
                let [a, b, c] = params.map(|p| p.to_string());
                (format!(":{kind}{i}"), [kind.to_owned(), a, b, c])
            })
            .collect();
        let ban = limit.ban.map_or([0, 0], |b| [ns(b.base), ns(b.max)]);
        let calendars = (limit.windows.iter())
            .map(|policy| match policy {
                Policy::FixedWindow { window: Window::Calendar(c), .. } => {
                    Some((Windows::new(c.clone()), Windows::new(c.clone())))
                }
                _ => None,
            })
            .collect();
        let mut modules = windows.iter().fold(0, |m, (_, w)| m | module(&w[0]));
        if ban[0] > 0 {
            modules |= module("ban");
        }
        Spec {
            name: limit.name.clone(),
            policies: limit.windows.clone(),
            lease_ttl_ms,
            leases: windows.first().is_some_and(|(_, w)| w[0] == "cc"),
            header: [
                // The script's "dry" limit stores nothing when over, and refuses nothing.
                if limit.refuses() { "0" } else { "1" }.to_owned(),
                windows.len().to_string(),
                ban[0].to_string(),
                ban[1].to_string(),
            ],
            has_ban: ban[0] > 0,
            windows,
            calendars,
            modules,
            refuses: limit.refuses(),
            counted: limit.count.clone(),
        }
    }

    pub fn windows(&self) -> usize {
        self.windows.len()
    }

    /// The Redis key of window `window` for the key `base`.
    pub fn key(&self, base: &str, window: usize) -> String {
        format!("{base}{}", self.windows[window].0)
    }

    /// Adds this limit's fixed part to a `DECIDE` call (once per call and burst, however
    /// many of its requests use the limit), with `burst` in place of its own burst and
    /// delay if given (a leaky bucket's: `[kind, period, burst · period, delay · period]`),
    /// and its calendar windows' instants around `now`.
    fn push_limit(&self, burst: Option<Burst>, count: Option<u64>, now: Nanos, call: &mut ScriptCall) {
        for field in &self.header {
            call.arg(field);
        }
        for (((_, params), calendar), policy) in self.windows.iter().zip(&self.calendars).zip(&self.policies) {
            // A key's own count: its window's parameters made again with it.
            let counted;
            let params = match count {
                Some(n) => {
                    let (kind, numbers) = params_of(policy, Some(n), self.lease_ttl_ms);
                    let [a, b, c] = numbers.map(|p| p.to_string());
                    counted = [kind.to_owned(), a, b, c];
                    &counted
                }
                None => params,
            };
            if let Some(calendar) = calendar {
                call.arg(&params[..2]);
                push_calendar(calendar, now, call);
                continue;
            }
            match (burst, params[1].parse::<u64>()) {
                (Some(b), Ok(period)) if params[0] == "lb" => {
                    call.arg(&params[..2]).arg(b.burst.saturating_mul(period)).arg(b.delay.saturating_mul(period));
                }
                _ => _ = call.arg(params),
            }
        }
    }

    /// Adds a request's use of this limit (the `index`-th of the call, from 1) to a
    /// `DECIDE` call, for the key `base`; `lease` names the lease a concurrency window
    /// takes.
    fn push_use(&self, index: usize, base: &str, lease: &str, call: &mut ScriptCall) {
        call.arg(index);
        for (suffix, _) in &self.windows {
            call.key(&[base, suffix]);
            call.arg(if self.leases { lease } else { "" });
        }
        if self.has_ban {
            call.key(&[base, ":ban"]);
        }
    }

    /// Adds this limit's windows to a `REFUND` call for the key `base`, of an admission
    /// at `at`.
    pub fn push_refund(&self, base: &str, at: RedisTime, call: &mut ScriptCall) {
        for ((suffix, params), calendar) in self.windows.iter().zip(&self.calendars) {
            call.key(&[base, suffix]);
            match calendar {
                Some(calendar) => push_calendar(calendar, at.nanos(), call.arg(&params[..2])),
                None => _ = call.arg(params).arg(""),
            }
        }
    }

    /// Adds this limit's windows to a `CHARGE` call for the key `base`, of `units` at
    /// `now` (a leaky bucket's debt bounded to 100 days of its drain, which the script's
    /// arithmetic keeps exact).
    pub fn push_charge(&self, base: &str, now: Nanos, units: u64, call: &mut ScriptCall) {
        for ((suffix, params), calendar) in self.windows.iter().zip(&self.calendars) {
            call.key(&[base, suffix]);
            let units = match params[1].parse::<u64>() {
                Ok(period) if params[0] == "lb" => units.min(MAX_DEBT_NS / period.max(1)),
                _ => units,
            };
            call.arg(units);
            match calendar {
                Some(calendar) => push_calendar(calendar, now, call.arg(&params[..2])),
                None => _ = call.arg(params).arg(""),
            }
        }
    }
}

/// A window's kind and its three parameters, the count (a rate's requests per its
/// interval, a window's limit, the requests in flight) `count` if given.
fn params_of(policy: &Policy, count: Option<u64>, lease_ttl_ms: u64) -> (&'static str, [u64; 3]) {
    match policy.clone() {
        Policy::Rate { rate, burst, delay } => {
            let rate = Rate { count: count.unwrap_or(rate.count), per: rate.per };
            let period = rate.period_ns().max(1);
            ("lb", [period, burst.saturating_mul(period), delay.saturating_mul(period)])
        }
        Policy::FixedWindow { limit, window: Window::Every(window) } => {
            ("fw", [count.unwrap_or(limit), window.as_millis() as u64, 0])
        }
        Policy::FixedWindow { limit, window: Window::Calendar(_) } => ("cw", [count.unwrap_or(limit), 0, 0]),
        Policy::SlidingWindow { limit, window } => ("sw", [count.unwrap_or(limit), window.as_millis() as u64, 0]),
        Policy::SlidingLog { limit, window } => ("sl", [count.unwrap_or(limit), ns(window), 0]),
        Policy::Concurrency { max, retry_after, .. } => ("cc", [count.unwrap_or(max), ns(retry_after), lease_ttl_ms]),
    }
}

/// A calendar window's instants for a call at `now`: the start and end of its window and
/// the next one's end, in ms.
fn push_calendar((this, next): &(Windows, Windows), now: Nanos, call: &mut ScriptCall) {
    let ms = |ns: u64| ns / 1_000_000;
    let window = this.at(now.0);
    call.arg(ms(window.start)).arg(ms(window.end)).arg(ms(next.at(window.end).end));
}

#[cfg(test)]
mod tests {
    use super::{RENEW, ScriptCall};

    #[test]
    fn a_call_sends_its_keys_before_its_arguments_whatever_their_order() {
        let mut call = ScriptCall::new(&RENEW);
        call.arg(5).key(&["sg:{a}", ":lb0"]).arg("").key(&["b"]);
        let hash = RENEW.get_hash();
        let expected = format!(
            "*7\r\n$7\r\nEVALSHA\r\n$40\r\n{hash}\r\n$1\r\n2\r\n$10\r\nsg:{{a}}:lb0\r\n$1\r\nb\r\n$1\r\n5\r\n$0\r\n\r\n"
        );
        assert_eq!(String::from_utf8(call.cmd().get_packed_command()).unwrap(), expected);
    }
}
