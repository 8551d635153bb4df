//! Fixed window: at most `limit` requests per key in each window. A window of a given
//! length is aligned to the Unix epoch (`[k·window, (k+1)·window)`), so every instance,
//! and every restart, agrees on where a window starts; a calendar window (a day, week or
//! month of a time zone, `policy::calendar`) runs from local midnight to local midnight,
//! whatever the day's or the month's length.
//!
//! The cheapest algorithm, and the coarsest: a client can spend `limit` at the end of
//! one window and `limit` again at the start of the next, `2·limit` within a moment
//! around the boundary. Choose it for long windows (a daily quota) where that is
//! acceptable.
//!
//! State: the window's index (low 40 bits: windows of at least 1 ms repeat an index
//! only after 34 years; a calendar window's is its start in seconds) and the count in it
//! (24 bits), in one `u64`. A money budget counts micro-units, more than 24 bits hold
//! (50 USD is 50,000,000): its calendar window is indexed by its start in hours (low 20
//! bits, repeating after 119 years) and counts in the other 44.

use std::sync::Arc;

use super::Verdict;
use crate::policy::Window;
use crate::policy::calendar::Windows;

/// How a key's state is packed: a window's count in the low bits, its index above.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Packing {
    count_bits: u32,
    /// The time a calendar window's index counts (ns): its start in these.
    calendar_unit: u64,
}

const NARROW: Packing = Packing { count_bits: 24, calendar_unit: 1_000_000_000 };
/// A money budget's (calendar windows only).
const WIDE: Packing = Packing { count_bits: 44, calendar_unit: 3_600_000_000_000 };

// A money budget's limit fits its count.
const _: () = assert!(crate::policy::charge::MAX_BUDGET == (1 << WIDE.count_bits) - 1);

impl Packing {
    fn count_max(self) -> u64 {
        (1 << self.count_bits) - 1
    }

    fn index_mask(self) -> u64 {
        (1 << (64 - self.count_bits)) - 1
    }

    fn pack(self, index: u64, count: u64) -> u64 {
        ((index & self.index_mask()) << self.count_bits) | count
    }

    /// The index and count of `state`.
    fn unpack(self, state: u64) -> (u64, u64) {
        (state >> self.count_bits, state & self.count_max())
    }
}

#[derive(Debug, Clone)]
pub struct FixedWindow {
    limit: u64,
    span: Span,
    packing: Packing,
}

/// Where the windows start and end.
#[derive(Debug, Clone)]
enum Span {
    /// Every this many ns from the epoch.
    Every(u64),
    /// By the calendar (shared: a limit's algorithm stays as small as before calendars,
    /// and a tenant's copy of it, `with_limit`, allocates nothing).
    Calendar(Arc<Windows>),
}

/// A calendar window's index (its start in `unit` ns) and end: out of line, so that a
/// window of a length costs what it did before calendars (measured: docs/performance.md).
#[inline(never)]
fn calendar_window(windows: &Windows, now: u64, unit: u64) -> (u64, u64) {
    let bounds = windows.at(now);
    (bounds.start / unit, bounds.end)
}

impl FixedWindow {
    /// `limit` below 2^24 (a money budget's, `wide`, below 2^44, with a calendar window),
    /// a window of at least 1 ms (checked by the config).
    pub fn new(limit: u64, window: &Window, wide: bool) -> Self {
        let span = match window {
            Window::Every(length) => Span::Every(u64::try_from(length.as_nanos()).unwrap_or(u64::MAX).max(1)),
            Window::Calendar(calendar) => Span::Calendar(Arc::new(Windows::new(calendar.clone()))),
        };
        debug_assert!(!wide || matches!(span, Span::Calendar(_)), "a wide count has calendar windows");
        FixedWindow { limit, span, packing: if wide { WIDE } else { NARROW } }
    }

    /// These windows with `limit` in place of their own (a tenant's, `limit_from`): the
    /// state, a window's index and count, means the same under any limit.
    pub fn with_limit(&self, limit: u64) -> Self {
        FixedWindow { limit, ..self.clone() }
    }

    /// Whether `other` has the same windows and packing (then a key's state means the
    /// same in both).
    pub fn same_windows(&self, other: &FixedWindow) -> bool {
        self.packing == other.packing
            && match (&self.span, &other.span) {
                (Span::Every(a), Span::Every(b)) => a == b,
                (Span::Calendar(a), Span::Calendar(b)) => a.calendar == b.calendar,
                _ => false,
            }
    }

    /// Its windows, in words: `every Nns`, or the calendar's (and a budget's packing).
    pub fn windows(&self) -> String {
        match &self.span {
            Span::Every(length) => format!("every {length}ns"),
            Span::Calendar(windows) if self.packing == WIDE => format!("{}, counts in 44 bits", windows.calendar),
            Span::Calendar(windows) => windows.calendar.to_string(),
        }
    }

    /// The index of the window of `now` (ns since the Unix epoch), and its end.
    #[inline]
    fn window(&self, now: u64) -> (u64, u64) {
        match &self.span {
            Span::Every(length) => {
                let index = now / length;
                (index, (index + 1) * length)
            }
            Span::Calendar(windows) => calendar_window(windows, now, self.packing.calendar_unit),
        }
    }

    /// The count in the window `index` for `state`: its own, or what the window just
    /// before it counted past its limit (a charge's debt, `charge`), at most a whole
    /// window's: a debt carries into the next window, no further.
    fn count(&self, state: Option<u64>, index: u64) -> u64 {
        let Some(s) = state else { return 0 };
        let mask = self.packing.index_mask();
        let (stored, count) = self.packing.unpack(s);
        if stored == index & mask {
            count
        } else if count > self.limit && stored == self.previous(index) & mask {
            (count - self.limit).min(self.limit)
        } else {
            0
        }
    }

    /// The index of the window before window `index` (only asked of a key in debt).
    fn previous(&self, index: u64) -> u64 {
        match &self.span {
            Span::Every(_) => index.wrapping_sub(1),
            // The index's time is at most the window's start: just before it is the window
            // before (a calendar window is a day at least).
            Span::Calendar(windows) => {
                let unit = self.packing.calendar_unit;
                windows.at((index * unit).saturating_sub(1)).start / unit
            }
        }
    }

    /// The length of the window that starts at `end` (ns).
    fn next_length(&self, end: u64) -> u64 {
        match &self.span {
            Span::Every(length) => *length,
            Span::Calendar(windows) => windows.at(end).end - end,
        }
    }

    /// Decides a request of `cost` (≥ 1) units.
    #[inline]
    pub fn decide(&self, state: Option<u64>, now: u64, cost: u64) -> Verdict {
        let (index, end) = self.window(now);
        let count = self.count(state, index);
        let reset = end - now;
        if count.saturating_add(cost) > self.limit {
            let remaining = self.limit.saturating_sub(count);
            // A debt past this window's limit fills the next one too.
            let carried = count.saturating_sub(self.limit).min(self.limit);
            let retry_after = if carried + cost > self.limit { reset + self.next_length(end) } else { reset };
            return Verdict::Reject { retry_after, remaining, reset, excess: count as f64 };
        }
        let count = count + cost;
        Verdict::Admit {
            state: self.packing.pack(index, count),
            wait: 0,
            remaining: self.limit - count,
            reset,
            excess: count as f64,
        }
    }

    /// Where a key in `state` stands at `now`, nothing taken: the units left in the
    /// current window, and its end.
    pub fn stands(&self, state: Option<u64>, now: u64) -> (u64, u64) {
        let (index, end) = self.window(now);
        (self.limit.saturating_sub(self.count(state, index)), end - now)
    }

    /// Debits `units` more at `now` (what a response reported it cost), past the limit
    /// if need be: the rest of the window is refused, and what is past the limit is
    /// carried into the next window (at most a whole window's).
    pub fn charge(&self, state: Option<u64>, units: u64, now: u64) -> u64 {
        let index = self.window(now).0;
        self.packing.pack(index, self.count(state, index).saturating_add(units).min(self.packing.count_max()))
    }

    /// Takes back an admission of `cost` units made at `at`, if its window still runs.
    pub fn refund(&self, state: u64, cost: u64, at: u64) -> u64 {
        let (index, count) = self.packing.unpack(state);
        if index == self.window(at).0 & self.packing.index_mask() {
            (state & !self.packing.count_max()) | count.saturating_sub(cost)
        } else {
            state
        }
    }

    /// A count from an earlier window is a fresh key's.
    /// The state of a key with `units` left in the window of `now`.
    pub fn holding(&self, units: u64, now: u64) -> u64 {
        self.packing.pack(self.window(now).0, self.limit - units.min(self.limit))
    }

    pub fn is_idle(&self, state: u64, now: u64) -> bool {
        self.count(Some(state), self.window(now).0) == 0
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const S: u64 = 1_000_000_000;

    fn replay(w: &FixedWindow, arrivals_s: &[f64]) -> Vec<bool> {
        let mut state = None;
        arrivals_s
            .iter()
            .map(|&t| match w.decide(state, (t * S as f64) as u64, 1) {
                Verdict::Admit { state: s, .. } => {
                    state = Some(s);
                    true
                }
                Verdict::Reject { .. } => false,
            })
            .collect()
    }

    #[test]
    fn a_key_holding_n_units_admits_n_until_the_window_ends() {
        let w = FixedWindow::new(5, &Window::Every(Duration::from_secs(10)), false);
        let state = w.holding(2, 12 * S);
        assert!(matches!(w.decide(Some(state), 13 * S, 2), Verdict::Admit { remaining: 0, .. }));
        assert!(matches!(w.decide(Some(state), 13 * S, 3), Verdict::Reject { remaining: 2, .. }));
        assert!(matches!(w.decide(Some(state), 20 * S, 5), Verdict::Admit { .. }), "a new window");
        assert!(matches!(w.decide(Some(w.holding(9, 12 * S)), 12 * S, 5), Verdict::Admit { .. }));
    }

    #[test]
    fn limit_per_epoch_aligned_window_and_the_double_burst_at_its_edge() {
        let w = FixedWindow::new(3, &Window::Every(Duration::from_secs(60)), false);
        // Window [60, 120): three pass, the fourth waits for 120. At 119.9 and 120.0 the
        // client gets 3 + 3 within a tenth of a second: the documented boundary burst.
        let out = replay(&w, &[60.0, 61.0, 62.0, 63.0, 119.9, 120.0, 120.0, 120.0, 120.1]);
        assert_eq!(out, [true, true, true, false, false, true, true, true, false]);
    }

    #[test]
    fn rejection_says_when_the_window_ends() {
        let w = FixedWindow::new(1, &Window::Every(Duration::from_secs(10)), false);
        let Verdict::Admit { state, remaining: 0, reset, .. } = w.decide(None, 12 * S, 1) else { panic!() };
        assert_eq!(reset, 8 * S);
        assert_eq!(
            w.decide(Some(state), 15 * S, 1),
            Verdict::Reject { retry_after: 5 * S, remaining: 0, reset: 5 * S, excess: 1.0 }
        );
        assert!(w.is_idle(state, 20 * S) && !w.is_idle(state, 19 * S));
    }

    #[test]
    fn a_charge_past_the_limit_carries_into_the_next_window_and_no_further() {
        let w = FixedWindow::new(10, &Window::Every(Duration::from_secs(10)), false);
        let Verdict::Admit { state, .. } = w.decide(None, 12 * S, 1) else { panic!() };
        // 1 + 14 units in [10, 20): 5 past the limit, carried into [20, 30).
        let state = w.charge(Some(state), 14, 13 * S);
        assert_eq!(
            w.decide(Some(state), 15 * S, 1),
            Verdict::Reject { retry_after: 5 * S, remaining: 0, reset: 5 * S, excess: 15.0 }
        );
        assert!(!w.is_idle(state, 25 * S), "the debt is still owed in the next window");
        assert!(matches!(w.decide(Some(state), 21 * S, 5), Verdict::Admit { remaining: 0, .. }));
        assert!(matches!(w.decide(Some(state), 21 * S, 6), Verdict::Reject { remaining: 5, .. }));
        assert!(matches!(w.decide(Some(state), 30 * S, 10), Verdict::Admit { .. }), "paid off");
        // A debt of more than a window fills the next one whole, and the refusal says so.
        let deep = w.charge(Some(state), 100, 13 * S);
        assert!(
            matches!(w.decide(Some(deep), 15 * S, 1), Verdict::Reject { retry_after, .. } if retry_after == 15 * S)
        );
        assert!(matches!(w.decide(Some(deep), 25 * S, 1), Verdict::Reject { retry_after, .. } if retry_after == 5 * S));
        assert!(matches!(w.decide(Some(deep), 30 * S, 10), Verdict::Admit { .. }), "no further");
        // A charge in a later window starts from that window's count.
        assert_eq!(w.charge(Some(state), 3, 41 * S), w.charge(None, 3, 41 * S));
        assert!(w.is_idle(deep, 30 * S));
    }
}

/// Calendar windows on a clock the tests set: each instant is a local time in Berlin.
#[cfg(test)]
mod calendar {
    use std::time::Duration;

    use jiff::civil::Weekday;
    use jiff::tz::TimeZone;

    use super::*;
    use crate::policy::calendar::{Calendar, Period};

    const S: u64 = 1_000_000_000;
    const H: u64 = 3600 * S;

    fn berlin(limit: u64, period: Period) -> FixedWindow {
        let calendar = Calendar { period, tz: TimeZone::get("Europe/Berlin").unwrap() };
        FixedWindow::new(limit, &Window::Calendar(calendar), false)
    }

    /// ns of a local time in Europe/Berlin.
    fn at(text: &str) -> u64 {
        let zoned = text.parse::<jiff::civil::DateTime>().unwrap().in_tz("Europe/Berlin").unwrap();
        u64::try_from(zoned.timestamp().as_nanosecond()).unwrap()
    }

    /// Admits `limit` at `first`, refuses the next at `refused` with `Retry-After` (and
    /// reset) equal to `retry`, and admits again at `next` (the next window's start).
    fn exhaust(w: &FixedWindow, limit: u64, first: u64, refused: u64, retry: u64, next: u64) {
        let mut state = None;
        for n in 0..limit {
            let Verdict::Admit { state: s, remaining, .. } = w.decide(state, first, 1) else { panic!("request {n}") };
            assert_eq!(remaining, limit - n - 1);
            state = Some(s);
        }
        assert_eq!(
            w.decide(state, refused, 1),
            Verdict::Reject { retry_after: retry, remaining: 0, reset: retry, excess: limit as f64 }
        );
        assert_eq!(w.stands(state, refused), (0, retry));
        assert!(matches!(w.decide(state, next - 1, 1), Verdict::Reject { retry_after: 1, .. }));
        assert!(matches!(w.decide(state, next, 1), Verdict::Admit { remaining, .. } if remaining == limit - 1));
        assert!(w.is_idle(state.unwrap(), next) && !w.is_idle(state.unwrap(), next - 1));
    }

    #[test]
    fn a_month_ends_at_midnight_of_the_first_whatever_its_length() {
        let w = berlin(3, Period::Month(1));
        // January: 31 days; refused on the 31st at 23:00, one hour before February.
        exhaust(&w, 3, at("2026-01-01T00:00"), at("2026-01-31T23:00"), H, at("2026-02-01T00:00"));
        // February 2026: 28 days, then March.
        exhaust(&w, 3, at("2026-02-10T08:00"), at("2026-02-28T12:00"), 12 * H, at("2026-03-01T00:00"));
        // February 2028: 29 days.
        exhaust(&w, 3, at("2028-02-28T12:00"), at("2028-02-28T12:00"), 36 * H, at("2028-03-01T00:00"));
        // March 2026 loses an hour to daylight saving time: 31 days less one hour.
        let march = at("2026-03-01T00:00");
        exhaust(&w, 3, march, march, 31 * 24 * H - H, at("2026-04-01T00:00"));
    }

    #[test]
    fn a_monthly_debt_carries_into_the_next_month_and_its_refusal_waits_for_the_month_after() {
        let w = berlin(100, Period::Month(1));
        let jan = at("2026-01-31T23:00");
        // 150 charged in January: 50 carried into February (28 days), refused at its end.
        let state = w.charge(None, 150, jan);
        assert!(matches!(w.decide(Some(state), jan, 1), Verdict::Reject { retry_after, .. } if retry_after == H));
        assert!(matches!(w.decide(Some(state), at("2026-02-27T00:00"), 50), Verdict::Admit { remaining: 0, .. }));
        assert!(matches!(w.decide(Some(state), at("2026-02-27T00:00"), 51), Verdict::Reject { .. }));
        // 300 in January: February is owed whole; a refusal in January says 1 March.
        let deep = w.charge(None, 300, jan);
        let to_march = at("2026-03-01T00:00") - jan;
        assert!(matches!(w.decide(Some(deep), jan, 1), Verdict::Reject { retry_after, .. } if retry_after == to_march));
        assert!(matches!(w.decide(Some(deep), at("2026-03-01T00:00"), 100), Verdict::Admit { .. }));
    }

    #[test]
    fn a_month_from_the_15th_runs_to_the_next_15th() {
        let w = berlin(2, Period::Month(15));
        // Refused on 1 March: the window began on 15 February and ends on 15 March.
        exhaust(&w, 2, at("2026-02-15T00:00"), at("2026-03-01T00:00"), 14 * 24 * H, at("2026-03-15T00:00"));
        // Used on 14 March: the window of 15 February still, which ends the next day.
        exhaust(&w, 2, at("2026-03-14T10:00"), at("2026-03-14T10:00"), 14 * H, at("2026-03-15T00:00"));
    }

    #[test]
    fn a_day_lasts_23_hours_when_the_clocks_go_forward_and_25_when_they_go_back() {
        let w = berlin(1, Period::Day);
        // 29 March 2026: 02:00 does not exist; at 01:30 the day has 21.5 hours left, not 22.5.
        exhaust(&w, 1, at("2026-03-29T00:00"), at("2026-03-29T01:30"), 21 * H + H / 2, at("2026-03-30T00:00"));
        // The whole day: 23 hours.
        let spring = at("2026-03-29T00:00");
        exhaust(&w, 1, spring, spring, 23 * H, at("2026-03-30T00:00"));
        // 25 October 2026: 02:00 to 03:00 twice; from midnight, 25 hours to the next.
        let autumn = at("2026-10-25T00:00");
        exhaust(&w, 1, autumn, autumn, 25 * H, at("2026-10-26T00:00"));
        // At noon, after the change: 12 hours left, as the clock on the wall says.
        exhaust(&w, 1, autumn, at("2026-10-25T12:00"), 12 * H, at("2026-10-26T00:00"));
    }

    #[test]
    fn a_week_runs_from_midnight_of_its_weekday() {
        let w = berlin(2, Period::Week(Weekday::Monday));
        // Friday 27 November 2026, noon: until Monday 30 November, midnight.
        exhaust(&w, 2, at("2026-11-23T00:00"), at("2026-11-27T12:00"), 2 * 24 * H + 12 * H, at("2026-11-30T00:00"));
        // The week of 25 October has 7 days and one hour.
        let week = at("2026-10-19T00:00");
        exhaust(&w, 2, week, week, 7 * 24 * H + H, at("2026-10-26T00:00"));
        let sunday = berlin(1, Period::Week(Weekday::Sunday));
        exhaust(&sunday, 1, at("2026-11-28T23:00"), at("2026-11-28T23:00"), H, at("2026-11-29T00:00"));
    }

    #[test]
    fn a_calendar_key_heard_or_refunded_stays_in_its_window() {
        let w = berlin(5, Period::Day);
        let state = w.holding(2, at("2026-10-25T10:00"));
        assert!(matches!(w.decide(Some(state), at("2026-10-25T23:00"), 2), Verdict::Admit { remaining: 0, .. }));
        assert!(matches!(w.decide(Some(state), at("2026-10-26T00:00"), 5), Verdict::Admit { .. }));
        let Verdict::Admit { state, .. } = w.decide(Some(state), at("2026-10-25T23:00"), 2) else { panic!() };
        assert_eq!(w.refund(state, 2, at("2026-10-25T01:00")), w.holding(2, at("2026-10-25T23:00")));
        assert_eq!(w.refund(state, 2, at("2026-10-24T23:00")), state, "an admission of the day before");
        let other = berlin(5, Period::Month(1));
        assert!(w.same_windows(&berlin(9, Period::Day)) && !w.same_windows(&other));
        assert!(!w.same_windows(&FixedWindow::new(5, &Window::Every(Duration::from_secs(86_400)), false)));
    }

    #[test]
    fn a_money_budget_counts_past_24_bits_in_months_that_start_off_the_hour() {
        // Kolkata's midnight is half past a UTC hour: the index (in hours) floors it.
        let calendar = Calendar { period: Period::Month(1), tz: TimeZone::get("Asia/Kolkata").unwrap() };
        let w = FixedWindow::new(50_000_000, &Window::Calendar(calendar.clone()), true);
        let at = |text: &str| {
            let zoned = text.parse::<jiff::civil::DateTime>().unwrap().in_tz("Asia/Kolkata").unwrap();
            u64::try_from(zoned.timestamp().as_nanosecond()).unwrap()
        };
        let start = at("2026-11-01T00:00");
        let Verdict::Admit { state, remaining, .. } = w.decide(None, start + H, 1) else { panic!() };
        assert_eq!(remaining, 49_999_999);
        // 60 of 50 spent: refused for the rest of the month, 10 carried into the next.
        let state = w.charge(Some(state), 60_000_000, start + 2 * H);
        assert!(matches!(w.decide(Some(state), at("2026-11-30T23:59"), 1), Verdict::Reject { remaining: 0, .. }));
        let Verdict::Admit { remaining, .. } = w.decide(Some(state), at("2026-12-01T00:00"), 1) else { panic!() };
        assert_eq!(remaining, 50_000_000 - 10_000_001 - 1);
        let Verdict::Admit { remaining, .. } = w.decide(Some(state), at("2027-01-01T00:00"), 1) else { panic!() };
        assert_eq!(remaining, 49_999_999, "a month later still: fresh");
        assert!(!w.same_windows(&FixedWindow::new(5, &Window::Calendar(calendar), false)), "another packing");
    }
}

#[cfg(test)]
mod properties {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::limit::schedule::*;

    proptest! {
        /// Each epoch-aligned window admits at most `limit`; any interval of one window's
        /// length, at most `2 * limit` (the boundary burst, never more).
        #[test]
        fn windows_admit_at_most_limit_and_any_window_length_at_most_twice(
            limit in 1u64..6,
            window_ms in 1u64..1000,
            gaps in proptest::collection::vec(0u64..400, 1..150),
        ) {
            let window = window_ms * 1_000_000;
            let w = FixedWindow::new(limit, &Window::Every(Duration::from_nanos(window)), false);
            let mut state = None;
            let admitted: Vec<u64> = arrivals(&gaps, window)
                .filter(|&now| match w.decide(state, now, 1) {
                    Verdict::Admit { state: s, .. } => { state = Some(s); true }
                    Verdict::Reject { .. } => false,
                })
                .collect();
            prop_assert!(most_in_aligned(&admitted, window) <= limit);
            prop_assert!(most_within(&admitted, window) <= 2 * limit);
        }
    }
}
