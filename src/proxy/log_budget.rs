//! How many rejection and delay lines a limit may write: `log_lines_per_second` in each
//! second, then none until the next, when one summary line says how many were left out
//! and which keys were refused most among them. A flood of rejections (a client hammering
//! a refused key, or many clients) then costs the log a few lines a second, not one line
//! per request.
//!
//! The most refused keys are found with the Misra-Gries summary (`top_keys`, `TOP`
//! counters): any key that made more than 1/(TOP+1) of the left-out lines is among them.

use std::sync::{Mutex, PoisonError};

use crate::top_keys::TopKeys;

/// Keys named in a summary line.
const TOP: usize = 3;

/// The lines of one second, and what was left out.
#[derive(Default)]
struct Window {
    second: u64,
    written: u32,
    left_out: u64,
    top: TopKeys<TOP>,
}

/// A second's left-out lines, to be written as one.
#[derive(Debug, PartialEq, Eq)]
pub struct Summary {
    pub left_out: u64,
    /// The most refused keys among them, most first (counts are lower bounds).
    pub top: String,
}

pub struct LogBudget {
    per_second: u32,
    window: Mutex<Window>,
}

/// What `LogBudget::take` allows.
pub struct Take {
    /// Write this request's line.
    pub write: bool,
    /// Write first the summary of a second that has ended.
    pub summary: Option<Summary>,
}

impl LogBudget {
    pub fn new(per_second: u32) -> Self {
        LogBudget { per_second, window: Mutex::new(Window::default()) }
    }

    /// Asks to write a line at `second` for the key hashed `key`, labelled by `label`
    /// (called only when the key must be remembered).
    pub fn take(&self, second: u64, key: u64, label: impl FnOnce() -> String) -> Take {
        let mut w = self.window.lock().unwrap_or_else(PoisonError::into_inner);
        let summary = if w.second == second { None } else { w.restart(second) };
        if w.written < self.per_second {
            w.written += 1;
            return Take { write: true, summary };
        }
        w.left_out += 1;
        w.top.count(key, label);
        Take { write: false, summary }
    }

    /// The summary of a second before `second` that no line has closed yet, if any
    /// lines were left out (called once a second, so that a flood that stops is still
    /// summed up).
    pub fn flush(&self, second: u64) -> Option<Summary> {
        let mut w = self.window.lock().unwrap_or_else(PoisonError::into_inner);
        if w.second < second { w.restart(second) } else { None }
    }
}

impl Window {
    /// Starts `second`; returns the summary of the one that ended.
    fn restart(&mut self, second: u64) -> Option<Summary> {
        let ended = std::mem::replace(self, Window { second, ..Window::default() });
        (ended.left_out > 0).then(|| {
            let top = ended.top.into_sorted();
            let top = top.iter().map(|e| format!("{} ({})", e.label, e.count)).collect::<Vec<_>>().join(", ");
            Summary { left_out: ended.left_out, top }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_few_lines_a_second_then_one_summary_naming_the_most_refused_keys() {
        let budget = LogBudget::new(2);
        let take = |second, key: u64| budget.take(second, key, || format!("ip=10.0.0.{key}"));
        assert!(take(10, 1).write && take(10, 1).write);
        for n in 0..1000u64 {
            // Key 1 makes most of the flood; keys 100.. come once each.
            let t = take(10, if n % 3 == 0 { 100 + n } else { 1 });
            assert!(!t.write && t.summary.is_none());
        }
        let next = take(11, 7);
        assert!(next.write);
        let summary = next.summary.expect("the flood is summed up");
        assert_eq!(summary.left_out, 1000);
        assert!(summary.top.starts_with("ip=10.0.0.1 ("), "{}", summary.top);
        assert_eq!(budget.flush(11), None, "nothing left out in second 11");
        assert!(take(11, 7).write);
        assert!(!take(11, 7).write);
    }

    #[test]
    fn a_flood_that_stops_is_summed_up_by_the_flush() {
        let budget = LogBudget::new(0);
        for _ in 0..5 {
            assert!(!budget.take(3, 9, || "k".into()).write);
        }
        assert_eq!(budget.flush(3), None, "the second is not over");
        assert_eq!(budget.flush(4), Some(Summary { left_out: 5, top: "k (5)".into() }));
        assert_eq!(budget.flush(5), None);
    }
}
