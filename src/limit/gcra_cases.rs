//! Fixed schedules for the leaky bucket family (`rate:`, GCRA), each answer worked out
//! by hand from the definition, for the local limiter's tests and (by `#[path]`) the
//! Redis script's. Per key: `tat`, the instant the bucket drains; a request of `cost`
//! at `now` finds `first = max(now, tat + period)` (`now` for a fresh key) and
//! `excess = first + (cost - 1)·period - now`.
//! - `excess ≤ burst·period`: it passes, `tat = now + excess`, `remaining =
//!   ⌊(burst·period - excess) / period⌋`, `reset = excess + period`.
//! - otherwise it is refused and nothing changes: `Retry-After = excess - burst·period`,
//!   `remaining` = the units that fit now (`⌊(burst·period - (first - now)) / period⌋ + 1`,
//!   or 0), `reset = tat + period - now` (0 for a fresh key).
//!
//! Rates are per minute, so that the keys' TTLs in Redis (real time) outlast a replay
//! (schedule time). Times are in seconds from the schedule's start.

/// What a request is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    Pass { remaining: u64, reset: u64 },
    Refuse { retry: u64, remaining: u64, reset: u64 },
}

impl Answer {
    /// The answer with `retry` (`None`: passed), `remaining` and `reset`; times must be
    /// whole seconds, as every worked-out one is.
    pub fn of(retry: Option<std::time::Duration>, remaining: u64, reset: std::time::Duration) -> Answer {
        let secs = |d: std::time::Duration| {
            assert_eq!(d.subsec_nanos(), 0, "{d:?} is not whole seconds");
            d.as_secs()
        };
        match retry {
            Some(retry) => Answer::Refuse { retry: secs(retry), remaining, reset: secs(reset) },
            None => Answer::Pass { remaining, reset: secs(reset) },
        }
    }
}

/// A request: at `at` s, for key `key`, weighing `cost`, and its answer.
pub struct Step {
    pub at: u64,
    pub key: u8,
    pub cost: u64,
    pub answer: Answer,
}

pub struct Case {
    pub name: &'static str,
    /// The limit's policy, in YAML flow style.
    pub policy: &'static str,
    pub steps: &'static [Step],
}

const fn pass(at: u64, key: u8, cost: u64, remaining: u64, reset: u64) -> Step {
    Step { at, key, cost, answer: Answer::Pass { remaining, reset } }
}

const fn refuse(at: u64, key: u8, cost: u64, retry: u64, remaining: u64, reset: u64) -> Step {
    Step { at, key, cost, answer: Answer::Refuse { retry, remaining, reset } }
}

pub const CASES: [Case; 5] = [
    Case {
        // period 6 s, burst 24 s. A fresh key takes burst + 1 at once; then idle gaps:
        // 15 s later one period and a half is back; 2 min later the key is as fresh.
        name: "fresh burst, then idle gaps",
        policy: "rate: 10r/m, burst: 4, nodelay: true",
        steps: &[
            pass(0, 1, 1, 4, 6),
            pass(0, 1, 1, 3, 12),
            pass(0, 1, 1, 2, 18),
            pass(0, 1, 1, 1, 24),
            pass(0, 1, 1, 0, 30),
            // first = 30: excess 30 > 24. tat 24: reset 30.
            refuse(0, 1, 1, 6, 0, 30),
            // first = max(15, 30) = 30: excess 15, (24 - 15) / 6 = 1 left.
            pass(15, 1, 1, 1, 21),
            // first = max(120, 36) = 120.
            pass(120, 1, 1, 4, 6),
        ],
    },
    Case {
        // period 12 s, burst 24 s, a request every 6 s: the bucket fills, then every
        // other request passes.
        name: "steady, twice the rate",
        policy: "rate: 5r/m, burst: 2, nodelay: true",
        steps: &[
            pass(0, 1, 1, 2, 12),
            pass(6, 1, 1, 1, 18),
            pass(12, 1, 1, 1, 24),
            pass(18, 1, 1, 0, 30),
            pass(24, 1, 1, 0, 36),
            // tat 48: first 60, excess 30 > 24; reset 48 + 12 - 30.
            refuse(30, 1, 1, 6, 0, 30),
            pass(36, 1, 1, 0, 36),
            refuse(42, 1, 1, 6, 0, 30),
        ],
    },
    Case {
        // period 6 s, burst 24 s: three units take three periods of excess at once.
        name: "weighted",
        policy: "rate: 10r/m, burst: 4, nodelay: true",
        steps: &[
            // first 0, tat 12: excess 12.
            pass(0, 1, 3, 2, 18),
            // first 18, excess 30 > 24: refused, but 2 units still fit.
            refuse(0, 1, 3, 6, 2, 18),
            // first 18, tat 24.
            pass(0, 1, 2, 0, 30),
            // first 30, excess 27 > 24; reset 24 + 6 - 3.
            refuse(3, 1, 1, 3, 0, 27),
        ],
    },
    Case {
        // Two keys of one limit, alternately: each counts only its own requests.
        name: "interleaved keys",
        policy: "rate: 10r/m, burst: 4, nodelay: true",
        steps: &[
            pass(0, 1, 1, 4, 6),
            pass(0, 2, 1, 4, 6),
            // first = 6: excess 5.
            pass(1, 1, 1, 3, 11),
            pass(2, 2, 1, 3, 10),
            // first = 12: excess 9.
            pass(3, 1, 1, 2, 15),
            pass(3, 2, 2, 1, 21),
        ],
    },
    Case {
        // period 30 s, burst 30 s.
        name: "2 per minute",
        policy: "rate: 2r/m, burst: 1, nodelay: true",
        steps: &[
            pass(0, 1, 1, 1, 30),
            pass(0, 1, 1, 0, 60),
            // tat 30: first 60, excess 50 > 30.
            refuse(10, 1, 1, 20, 0, 50),
            // first 60: excess 15, (30 - 15) / 30 = 0 left.
            pass(45, 1, 1, 0, 45),
            // tat 60: first 90, excess 45 > 30.
            refuse(45, 1, 1, 15, 0, 45),
        ],
    },
];
