//! A fixed-window limit's calendar window from the file (`window: { calendar: month,
//! tz: Europe/Berlin, reset_day: 1 }`) -> `Calendar`, every field checked with its place:
//! the period's word, the time zone's name (in the IANA database jiff reads), the reset
//! day for the period (1 to 28 for a month, a weekday's name for a week, none for a day).

use jiff::civil::Weekday;
use jiff::tz::TimeZone;

use super::checks::Errors;
use super::raw::{RawCalendarWindow, RawResetDay};
use crate::policy::calendar::{self, Calendar, Period, WEEKDAYS};
use crate::suggest::{closest, one_of};

const UNITS: [&str; 3] = ["day", "week", "month"];

/// The calendar window `raw` of the limit at `at` (its `window`).
pub(super) fn calendar(e: &mut Errors<'_>, at: &str, raw: &RawCalendarWindow) -> Option<Calendar> {
    let at = format!("{at}.window");
    let tz = time_zone(e, &at, raw.tz.as_deref().unwrap_or("UTC"));
    let period = match raw.calendar.as_str() {
        "day" => {
            if raw.reset_day.is_some() {
                e.add(format!("{at}.reset_day"), "does not apply to `calendar: day` (a day starts at local midnight)");
            }
            Some(Period::Day)
        }
        "week" => weekday(e, &at, raw.reset_day.as_ref()).map(Period::Week),
        "month" => day_of_month(e, &at, raw.reset_day.as_ref()).map(Period::Month),
        other => {
            let meant = closest(other, UNITS).map_or(String::new(), |m| format!("; did you mean `{m}`?"));
            e.add(format!("{at}.calendar"), format!("unknown calendar {other:?}: give {}{meant}", one_of(&UNITS)));
            None
        }
    };
    Some(Calendar { period: period?, tz: tz? })
}

/// The zone named `name`, from the IANA database (the system's, else the copy built in).
fn time_zone(e: &mut Errors<'_>, at: &str, name: &str) -> Option<TimeZone> {
    let found = TimeZone::get(name).ok().filter(|tz| tz.iana_name().is_some());
    if found.is_none() {
        let names: Vec<String> = jiff::tz::db().available().map(|n| n.as_str().to_owned()).collect();
        let meant = match closest(name, names.iter().map(String::as_str)) {
            Some(meant) => format!("; did you mean `{meant}`?"),
            None => " (an IANA time zone name, such as `Europe/Berlin` or `UTC`)".to_owned(),
        };
        e.add(format!("{at}.tz"), format!("unknown time zone {name:?}{meant}"));
    }
    found
}

/// A week's `reset_day`: a weekday's name, `monday` by default.
fn weekday(e: &mut Errors<'_>, at: &str, raw: Option<&RawResetDay>) -> Option<Weekday> {
    let (given, meant) = match raw {
        None => return Some(Weekday::Monday),
        Some(RawResetDay::Name(name)) => match calendar::weekday(name) {
            Some(weekday) => return Some(weekday),
            None => (format!("{name:?}"), closest(name, WEEKDAYS)),
        },
        Some(RawResetDay::Number(n)) => (n.to_string(), None),
    };
    let meant = meant.map_or(String::new(), |m| format!("; did you mean `{m}`?"));
    e.add(
        format!("{at}.reset_day"),
        format!("a week starts on a weekday: give `monday` … `sunday`, not {given}{meant}"),
    );
    None
}

/// A month's `reset_day`: 1 to 28 (a day every month has), 1 by default.
fn day_of_month(e: &mut Errors<'_>, at: &str, raw: Option<&RawResetDay>) -> Option<u8> {
    match raw {
        None => Some(1),
        Some(RawResetDay::Number(n)) if (1..=28).contains(n) => u8::try_from(*n).ok(),
        Some(given) => {
            let given = match given {
                RawResetDay::Number(n) => n.to_string(),
                RawResetDay::Name(name) => format!("{name:?}"),
            };
            e.add(
                format!("{at}.reset_day"),
                format!("a month starts on a day from 1 to 28 (a day every month has), not {given}"),
            );
            None
        }
    }
}
