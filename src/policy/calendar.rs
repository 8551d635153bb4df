//! Calendar windows: the window of a fixed-window limit as a day, a week or a month of a
//! time zone's calendar, each starting at local midnight (of the week's or the month's
//! reset day), so that "10 000 a month from the 1st, in Europe/Berlin" means that across
//! daylight-saving changes (days of 23 and 25 hours) and months of 28 to 31 days. The
//! zone's rules are the IANA database's, read by jiff; the windows' instants are
//! computed here, once per window (`Windows`), and given to the limiters and to Redis.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use jiff::civil::{Date, Weekday};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

/// How long a calendar window lasts, and the day it starts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Period {
    /// From local midnight to the next.
    Day,
    /// From local midnight of this weekday to the next one's.
    Week(Weekday),
    /// From local midnight of this day of the month (1 to 28, so every month has it) to
    /// the next month's.
    Month(u8),
}

/// A calendar window: a period in a time zone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Calendar {
    pub period: Period,
    pub tz: TimeZone,
}

/// One window, `[start, end)`, in ns since the Unix epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub start: u64,
    pub end: u64,
}

const NS: u64 = 1_000_000_000;

impl Calendar {
    /// The window that holds `now` (ns since the Unix epoch).
    pub fn bounds(&self, now: u64) -> Bounds {
        // Every u64 of ns (up to 2554) is an instant jiff represents.
        let at = Timestamp::from_nanosecond(i128::from(now)).unwrap_or(Timestamp::MAX);
        let first = self.first_day(at.to_zoned_datetime(self.tz.clone()).date());
        Bounds { start: self.midnight(first), end: self.midnight(self.next_first_day(first)) }
    }

    /// The first day of the window that holds `date`.
    fn first_day(&self, date: Date) -> Date {
        match self.period {
            Period::Day => date,
            Period::Week(weekday) => date.saturating_sub(i64::from(date.weekday().since(weekday)).days()),
            Period::Month(day) => {
                let this = date.first_of_month().saturating_add(i64::from(day - 1).days());
                if date >= this { this } else { this.saturating_sub(1.month()) }
            }
        }
    }

    /// The first day of the window after the one that starts on `first`.
    fn next_first_day(&self, first: Date) -> Date {
        match self.period {
            Period::Day => first.saturating_add(1.day()),
            Period::Week(_) => first.saturating_add(7.days()),
            // The day is at most 28: the next month has it.
            Period::Month(_) => first.saturating_add(1.month()),
        }
    }

    /// The first instant of `date` in the zone: its midnight, or where a change of
    /// offset skips midnight, the end of the gap (jiff's "compatible" choice).
    fn midnight(&self, date: Date) -> u64 {
        let instant = date.to_zoned_datetime(self.tz.clone()).map_or(Timestamp::MAX, |z| z.timestamp());
        u64::try_from(instant.as_nanosecond()).unwrap_or(0)
    }

    /// The zone's name, as the file gives it (`UTC` for the default).
    pub fn tz_name(&self) -> &str {
        self.tz.iana_name().unwrap_or("UTC")
    }

    /// The word `calendar:` takes.
    pub fn unit(&self) -> &'static str {
        match self.period {
            Period::Day => "day",
            Period::Week(_) => "week",
            Period::Month(_) => "month",
        }
    }

    /// `reset_day` as the file writes it (`None` for a day).
    pub fn reset_day(&self) -> Option<String> {
        match self.period {
            Period::Day => None,
            Period::Week(weekday) => Some(weekday_name(weekday).to_owned()),
            Period::Month(day) => Some(day.to_string()),
        }
    }
}

/// The weekdays as `reset_day` names them, Monday first.
pub const WEEKDAYS: [&str; 7] = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"];

/// The weekday `reset_day` names (`monday` … `sunday`).
pub fn weekday(name: &str) -> Option<Weekday> {
    let offset = WEEKDAYS.iter().position(|w| *w == name)?;
    Weekday::from_monday_zero_offset(i8::try_from(offset).ok()?).ok()
}

/// The name `reset_day` gives `weekday`.
pub fn weekday_name(weekday: Weekday) -> &'static str {
    WEEKDAYS[usize::try_from(weekday.to_monday_zero_offset()).unwrap_or(0)]
}

/// `calendar: month, tz: Europe/Berlin, reset_day: 15`, as the file writes it.
impl fmt::Display for Calendar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "calendar: {}, tz: {}", self.unit(), self.tz_name())?;
        match self.reset_day() {
            Some(day) => write!(f, ", reset_day: {day}"),
            None => Ok(()),
        }
    }
}

/// A calendar with the window it found last: a window is computed from the zone's rules
/// once, and every instant inside it is answered from memory. The window is kept in one
/// atomic word (its start and length in whole seconds: a zone's offsets are whole
/// seconds), so that threads deciding at once never see half of one window and half of
/// another.
#[derive(Debug)]
pub struct Windows {
    pub calendar: Calendar,
    /// Start in s (high 41 bits), length in s (low 23 bits: up to 97 days); 0: none yet.
    last: AtomicU64,
}

const LENGTH_BITS: u32 = 23;

impl Windows {
    pub fn new(calendar: Calendar) -> Windows {
        Windows { calendar, last: AtomicU64::new(0) }
    }

    /// The window that holds `now`.
    #[inline]
    pub fn at(&self, now: u64) -> Bounds {
        let last = self.last.load(Ordering::Relaxed);
        let start = (last >> LENGTH_BITS) * NS;
        let end = start + (last & ((1 << LENGTH_BITS) - 1)) * NS;
        if (start..end).contains(&now) {
            return Bounds { start, end };
        }
        let bounds = self.calendar.bounds(now);
        let length = (bounds.end - bounds.start) / NS;
        if bounds.start.is_multiple_of(NS) && bounds.end.is_multiple_of(NS) && length < 1 << LENGTH_BITS {
            self.last.store((bounds.start / NS) << LENGTH_BITS | length, Ordering::Relaxed);
        }
        bounds
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn berlin(period: Period) -> Calendar {
        Calendar { period, tz: TimeZone::get("Europe/Berlin").unwrap() }
    }

    /// ns of a local time in Europe/Berlin.
    fn local(text: &str) -> u64 {
        let zoned = text.parse::<jiff::civil::DateTime>().unwrap().in_tz("Europe/Berlin").unwrap();
        u64::try_from(zoned.timestamp().as_nanosecond()).unwrap()
    }

    const HOUR: u64 = 3600 * NS;

    #[test]
    fn a_day_is_23_hours_in_spring_and_25_in_autumn_in_berlin() {
        let day = berlin(Period::Day);
        let spring = day.bounds(local("2026-03-29T12:00"));
        assert_eq!(spring, Bounds { start: local("2026-03-29T00:00"), end: local("2026-03-30T00:00") });
        assert_eq!(spring.end - spring.start, 23 * HOUR);
        let autumn = day.bounds(local("2026-10-25T02:30"));
        assert_eq!(autumn.end - autumn.start, 25 * HOUR);
        assert_eq!(day.bounds(local("2026-10-25T00:00")), autumn, "midnight starts its day");
        assert_eq!(day.bounds(local("2026-10-25T00:00") - 1).end, autumn.start, "and ends the one before");
    }

    #[test]
    fn a_month_runs_from_its_reset_day_to_the_next_months() {
        let month = berlin(Period::Month(1));
        let january = month.bounds(local("2026-01-31T23:59:59"));
        assert_eq!(january, Bounds { start: local("2026-01-01T00:00"), end: local("2026-02-01T00:00") });
        let february = month.bounds(local("2028-02-29T12:00"));
        assert_eq!(february.end - february.start, 29 * 24 * HOUR, "a leap year's February");
        assert_eq!(february.end, local("2028-03-01T00:00"));
        // March in Berlin loses an hour to daylight saving time.
        let march = month.bounds(local("2026-03-15T00:00"));
        assert_eq!(march.end - march.start, 31 * 24 * HOUR - HOUR);
        let fifteenth = berlin(Period::Month(15));
        assert_eq!(
            fifteenth.bounds(local("2026-03-14T23:00")),
            Bounds { start: local("2026-02-15T00:00"), end: local("2026-03-15T00:00") }
        );
        assert_eq!(fifteenth.bounds(local("2026-03-15T00:00")).end, local("2026-04-15T00:00"));
    }

    #[test]
    fn a_week_starts_at_midnight_of_its_weekday() {
        // 2026-11-27 is a Friday.
        let week = berlin(Period::Week(Weekday::Monday));
        assert_eq!(
            week.bounds(local("2026-11-27T10:00")),
            Bounds { start: local("2026-11-23T00:00"), end: local("2026-11-30T00:00") }
        );
        let friday = berlin(Period::Week(Weekday::Friday));
        assert_eq!(friday.bounds(local("2026-11-27T00:00")).start, local("2026-11-27T00:00"));
        assert_eq!(friday.bounds(local("2026-11-26T23:59")).start, local("2026-11-20T00:00"));
        let autumn = week.bounds(local("2026-10-21T00:00"));
        assert_eq!(autumn.end - autumn.start, 7 * 24 * HOUR + HOUR, "the week of the 25-hour day");
    }

    #[test]
    fn remembered_windows_answer_as_the_calendar_in_any_order() {
        let windows = Windows::new(berlin(Period::Day));
        for text in
            ["2026-03-29T12:00", "2026-03-29T00:00", "2026-03-28T23:59:59", "2026-03-30T00:00", "2026-03-29T01:00"]
        {
            assert_eq!(windows.at(local(text)), windows.calendar.bounds(local(text)), "{text}");
        }
        assert_eq!(weekday("sunday"), Some(Weekday::Sunday));
        assert_eq!(weekday("Sunday"), None);
        assert_eq!(
            berlin(Period::Week(Weekday::Sunday)).to_string(),
            "calendar: week, tz: Europe/Berlin, reset_day: sunday"
        );
    }
}
