//! The small value syntaxes of the file: durations (`250ms`, `30s`, `1h`) and rates
//! (`10r/s`, `600r/m`, `100r/15m`).

use std::time::Duration;

pub use crate::policy::Rate;

/// The units durations and rate windows take, as nginx's time units do (minus years
/// and months, whose length varies).
const UNITS: &str = "ms, s, m, h, d";

/// The longest duration any setting takes: a year. Longer values are surely typos, and
/// a bound keeps every `Instant + Duration` in the process from overflowing.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// One or more `NUMBER UNIT` parts (`250ms`, `1h30m`, `1h 30m`), summed. Hand-written
/// rather than humantime's parser, which also takes months (`M`), years and
/// microseconds: `100r/M` read as "per month" when a minute was meant.
fn parse_span(text: &str) -> Result<Duration, String> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(format!("empty; the units are {UNITS}"));
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!("expected a number; the units are {UNITS}"));
        }
        let count: u64 = rest[..digits].parse().map_err(|_| "the number is too large".to_owned())?;
        rest = rest[digits..].trim_start();
        let unit_len = rest.find(|c: char| !c.is_alphabetic()).unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        let nanos: u64 = match unit {
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "d" => 86_400_000_000_000,
            "M" => return Err("unknown unit `M`: did you mean `m` (minute)?".into()),
            "" => return Err(format!("a unit is missing; the units are {UNITS}")),
            other => return Err(format!("unknown unit `{other}`; the units are {UNITS}")),
        };
        rest = rest[unit_len..].trim_start();
        let part = u128::from(count) * u128::from(nanos);
        total = total
            .checked_add(Duration::from_nanos(u64::try_from(part).map_err(|_| "the number is too large".to_owned())?))
            .ok_or("the number is too large")?;
    }
    Ok(total)
}

pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let d =
        parse_span(text).map_err(|why| format!("invalid duration {text:?}: {why}; write e.g. 250ms, 30s, 1m, 1h"))?;
    if d > MAX_DURATION {
        return Err(format!("invalid duration {text:?}: must be at most 365d"));
    }
    Ok(d)
}

pub fn parse_rate(text: &str) -> Result<Rate, String> {
    let bad = |why: &str| format!("invalid rate {text:?}: {why}; write N r/DURATION, e.g. 10r/s, 600r/m, 100r/15m");
    let (count, window) = text.split_once("r/").ok_or_else(|| bad("no \"r/\""))?;
    let count: u64 = count.trim().parse().map_err(|_| bad("the count must be a whole number"))?;
    if count == 0 {
        return Err(bad("the count must be positive"));
    }
    let window = window.trim();
    // A bare unit (`r/s`, `r/m`) means one of it.
    let per = if window.starts_with(|c: char| c.is_ascii_digit()) {
        parse_span(window)
    } else {
        parse_span(&format!("1{window}"))
    }
    .map_err(|why| bad(&format!("window: {why}")))?;
    if per.is_zero() {
        return Err(bad("the window must be positive"));
    }
    if per > MAX_DURATION {
        return Err(bad("the window must be at most 365d"));
    }
    let rate = Rate { count, per };
    if rate.period_ns() == 0 {
        return Err(bad("faster than one request per nanosecond"));
    }
    Ok(rate)
}

/// The units sizes take, as nginx's do.
const SIZE_UNITS: &str = "k, m, g (×1024, upper or lower case)";

/// A byte count as nginx writes it, and only so: a whole number of bytes, or one followed
/// at once by `k`, `m` or `g` (`K`, `M`, `G`), multiples of 1024: `1048576`, `512k`,
/// `10m`, `1g`. nginx refuses `10MB`, `1 kb` and `1.5m`; so does sluicegate, rather than
/// guess whether `MB` means 10⁶ or 2²⁰ bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let bad = |why: String| format!("invalid size {text:?}: {why}; write e.g. 1048576, 512k, 10m, 1g");
    let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    if digits == 0 {
        return Err(bad(format!("expected a whole number of bytes; the units are {SIZE_UNITS}")));
    }
    let count: u64 = text[..digits].parse().map_err(|_| bad("the number is too large".into()))?;
    let shift = match &text[digits..] {
        "" => 0,
        "k" | "K" => 10,
        "m" | "M" => 20,
        "g" | "G" => 30,
        unit if unit.starts_with(char::is_whitespace) => {
            return Err(bad(format!("no space between the number and its unit; the units are {SIZE_UNITS}")));
        }
        unit => return Err(bad(format!("unknown unit `{unit}`; the units are {SIZE_UNITS}"))),
    };
    count.checked_mul(1 << shift).ok_or_else(|| bad("the number is too large".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_keep_full_precision() {
        let r = parse_rate("1r/m").unwrap();
        assert_eq!(r.period_ns(), 60_000_000_000);
        assert_eq!(parse_rate("10r/s").unwrap().period_ns(), 100_000_000);
        assert_eq!(parse_rate("5000r/h").unwrap().period_ns(), 720_000_000);
        assert_eq!(parse_rate("100r/15m").unwrap().period_ns(), 9_000_000_000);
        assert_eq!(parse_rate("3 r/m").unwrap().period_ns(), 20_000_000_000);
        assert_eq!(parse_rate("7r/s").unwrap().period_ns(), 142_857_143);
    }

    #[test]
    fn bad_rates_say_what_is_wrong() {
        for bad in ["", "10", "0r/s", "-1r/s", "1.5r/s", "10r/", "10r/parsec", "10r/0s"] {
            let err = parse_rate(bad).unwrap_err();
            assert!(err.contains("invalid rate"), "{bad}: {err}");
        }
    }

    #[test]
    fn sizes_are_written_as_nginx_writes_them_and_only_so() {
        assert_eq!(parse_size("1048576").unwrap(), 1 << 20);
        assert_eq!(parse_size("512k").unwrap(), 512 << 10);
        assert_eq!(parse_size("512K").unwrap(), 512 << 10);
        assert_eq!(parse_size("10m").unwrap(), 10 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        for bad in
            ["", "k", "1.5m", "10t", "-1", "99999999999999999999g", "10MB", "10Mb", "10MiB", "1 kb", "1 g", "10b"]
        {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_size("10MB").unwrap_err(),
            "invalid size \"10MB\": unknown unit `MB`; the units are k, m, g (×1024, upper or lower case); write e.g. 1048576, 512k, 10m, 1g"
        );
        assert!(parse_size("1 kb").unwrap_err().contains("no space between the number and its unit"));
    }

    #[test]
    fn durations_accept_common_units() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("1h 30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("2d").unwrap(), Duration::from_secs(2 * 86400));
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn units_outside_the_list_are_refused() {
        for bad in ["1y", "1us", "5sec", "1w", "10", "300000000000y", "99999999999999999999s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert!(parse_duration("366d").unwrap_err().contains("at most 365d"));
        assert!(parse_rate("100r/M").unwrap_err().contains("did you mean `m` (minute)?"));
        assert!(parse_rate("1r/w").unwrap_err().contains("the units are ms, s, m, h, d"));
    }
}
