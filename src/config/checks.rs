//! The checking toolbox every part of the configuration uses: the list of errors and
//! warnings with their positions, and the checks of values that appear in several
//! sections (names, durations, statuses, CIDRs, header fields, allow-lists, key specs).
//! A leaf of `config`: it imports none of the sections' files.

use crate::variables::Template;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::str::FromStr;
use std::time::Duration;

use http::StatusCode;
use http::header::{HeaderName, HeaderValue};
use ipnet::IpNet;

use super::ConfigError;
use super::position::Positions;
use super::raw::{RawAllow, RawKey, RawSize};
use super::units::{parse_duration, parse_size};
use crate::policy::allow::Allow;
use crate::policy::key::{ClaimPath, KeyPart};
use crate::suggest::{LISTED, closest};

pub(super) struct Errors<'a> {
    pub(super) file: &'a str,
    pub(super) positions: &'a Positions<'a>,
    /// Paths of the required fields left out (`limits.a.key`), already reported: the
    /// checks of the placeholders serde put there say nothing.
    pub(super) missing: &'a [String],
    pub(super) list: Vec<ConfigError>,
    /// Problems that do not stop the configuration from loading.
    pub(super) warnings: Vec<ConfigError>,
}

impl Errors<'_> {
    /// Records a warning at `path`: reported by `check` and logged, the load goes on.
    pub(super) fn warn(&mut self, path: String, message: impl Into<String>) {
        if self.left_out(&path) {
            return;
        }
        let (line, column) = self.positions.of(&path);
        self.warnings.push(ConfigError { file: self.file.to_owned(), line, column, path, message: message.into() });
    }

    pub(super) fn add(&mut self, path: String, message: impl Into<String>) {
        if self.left_out(&path) {
            return;
        }
        let (line, column) = self.positions.of(&path);
        self.list.push(ConfigError::new(self.file, (line, column), &path, &message.into()));
    }

    /// Whether `path` is a required field left out, or lies within one.
    fn left_out(&self, path: &str) -> bool {
        self.missing
            .iter()
            .any(|m| path.strip_prefix(m.as_str()).is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '['])))
    }

    /// The line of the value at `path`.
    pub(super) fn line_of(&self, path: &str) -> usize {
        self.positions.of(path).0
    }

    /// The value of `result`, or None with its error recorded at `path`.
    pub(super) fn check<T>(&mut self, path: impl FnOnce() -> String, result: Result<T, String>) -> Option<T> {
        result.map_err(|message| self.add(path(), message)).ok()
    }

    pub(super) fn duration(&mut self, path: &str, text: Option<&String>, default: Duration) -> Duration {
        match text {
            None => default,
            Some(text) => self.check(|| path.to_owned(), parse_duration(text)).unwrap_or(default),
        }
    }

    /// As `duration`, longer than zero.
    pub(super) fn positive(&mut self, path: &str, text: Option<&String>, default: Duration) -> Duration {
        match text {
            None => default,
            Some(text) => self.check(|| path.to_owned(), positive_duration(text)).unwrap_or(default),
        }
    }
}

/// What to say of `name`, which names no `kind` (`limit`, `upstream`) among `defined`,
/// under `section:` in the file: the defined name it most likely misspells, else the few
/// defined, else how many there are.
pub(super) fn unknown_name<T>(kind: &str, name: &str, defined: &BTreeMap<String, T>, section: &str) -> String {
    match closest(name, defined.keys().map(String::as_str)) {
        Some(meant) => format!("unknown {kind} {name:?}; did you mean `{meant}`?"),
        None if defined.is_empty() => format!("unknown {kind} {name:?} (defined: none)"),
        None if defined.len() <= LISTED => {
            let names: Vec<&str> = defined.keys().map(String::as_str).collect();
            format!("unknown {kind} {name:?} (defined: {})", names.join(", "))
        }
        None => format!("unknown {kind} {name:?}: none of the {} under `{section}:` is close to it", defined.len()),
    }
}

/// Longest connection timeout accepted: past a day a timeout protects nothing.
const MAX_CONNECTION_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// A timeout of the connection watchdog: longer than zero, at most a day.
pub(super) fn connection_timeout(e: &mut Errors<'_>, path: &str, text: Option<&String>, default: Duration) -> Duration {
    let Some(text) = text else { return default };
    let bounded = positive_duration(text).and_then(|d| {
        if d <= MAX_CONNECTION_TIMEOUT { Ok(d) } else { Err(format!("{text:?} is too long; at most 24h")) }
    });
    e.check(|| path.to_owned(), bounded).unwrap_or(default)
}

/// A body size limit: a positive byte count.
pub(super) fn body_size(e: &mut Errors<'_>, path: &str, raw: Option<&RawSize>) -> Option<u64> {
    let positive = bytes(raw?)
        .and_then(|n| if n == 0 { Err("must be positive; leave it out for no limit".into()) } else { Ok(n) });
    e.check(|| path.to_owned(), positive)
}

/// A size in bytes, zero included.
pub(super) fn size(e: &mut Errors<'_>, path: &str, raw: &RawSize) -> Option<u64> {
    e.check(|| path.to_owned(), bytes(raw))
}

fn bytes(raw: &RawSize) -> Result<u64, String> {
    match raw {
        RawSize::Bytes(n) => Ok(*n),
        RawSize::Text(text) => parse_size(text),
    }
}

pub(super) fn parse_cidr(text: &str) -> Result<IpNet, String> {
    IpNet::from_str(text)
        .or_else(|_| IpAddr::from_str(text).map(IpNet::from))
        .map(|net| net.trunc())
        .map_err(|_| format!("invalid CIDR {text:?}; write e.g. 10.0.0.0/8, 2001:db8::/32 or 127.0.0.1"))
}

/// Names appear in log lines and, quoted, in `RateLimit` header fields.
pub(super) fn check_name(e: &mut Errors<'_>, at: &str, name: &str) {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b)) {
        e.add(at.to_owned(), format!("invalid name {name:?}: use letters, digits, '_', '-' and '.'"));
    }
}

pub(super) fn allow(e: &mut Errors<'_>, at: &str, raw: Option<&RawAllow>) -> Allow {
    let Some(raw) = raw else { return Allow::default() };
    let nets = raw
        .cidrs
        .iter()
        .enumerate()
        .filter_map(|(i, text)| e.check(|| format!("{at}.cidrs[{i}]"), parse_cidr(text)))
        .collect();
    let headers = raw
        .headers
        .iter()
        .filter_map(|(name, value)| e.check(|| format!("{at}.headers.{name}"), header(name, value)))
        .collect();
    let tokens = raw.tokens.iter().map(|t| t.as_bytes().into()).collect();
    let claims = raw
        .claims
        .iter()
        .filter_map(|(claim, values)| {
            let path = e.check(|| format!("{at}.claims.{claim}"), claim.parse::<ClaimPath>())?;
            let values = values.values();
            if values.is_empty() {
                e.add(format!("{at}.claims.{claim}"), "needs at least one value");
            }
            Some((path, values.into()))
        })
        .collect();
    Allow { nets, headers, tokens, claims }
}

pub(super) fn positive_duration(text: &str) -> Result<Duration, String> {
    parse_duration(text).and_then(|d| if d.is_zero() { Err("must be longer than zero".into()) } else { Ok(d) })
}

pub(super) fn status_in(
    e: &mut Errors<'_>,
    path: impl FnOnce() -> String,
    code: u16,
    range: std::ops::RangeInclusive<u16>,
) -> StatusCode {
    let ok = range.contains(&code).then(|| StatusCode::from_u16(code).ok()).flatten();
    let (lo, hi) = (range.start(), range.end());
    e.check(path, ok.ok_or_else(|| format!("must be a status from {lo} to {hi}, not {code}")))
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// The field that names the soft limits annotating a request, by default.
pub(super) const ANNOTATION_FIELD: HeaderName = HeaderName::from_static("ratelimit-exceeded");

/// `annotation_field`: a field name no one else gives a meaning: not `RateLimit` (sent
/// beside it), `RateLimit-Policy`, nor a field that frames, routes or forwards the
/// request, whose meaning the upstream takes from HTTP or from this hop.
pub(super) fn annotation_field(name: &str) -> Result<HeaderName, String> {
    let parsed = HeaderName::from_str(name).map_err(|_| format!("invalid header name {name:?}"))?;
    let taken = [
        "ratelimit",
        "ratelimit-policy",
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
        "expect",
        "x-forwarded-for",
        "x-forwarded-proto",
        "x-forwarded-host",
        "forwarded",
    ];
    match taken.contains(&parsed.as_str()) {
        true => Err(format!("{name:?} has its own meaning; name a field of your own, such as x-quota-exceeded")),
        false => Ok(parsed),
    }
}

/// A field a route sets: its value may hold variables (see `variables`).
pub(super) fn set_field(name: &str, value: &str) -> Result<(HeaderName, Template), String> {
    let parsed = HeaderName::from_str(name).map_err(|_| format!("invalid header name {name:?}"))?;
    Ok((parsed, Template::parse(value)?))
}

pub(super) fn header(name: &str, value: &str) -> Result<(HeaderName, HeaderValue), String> {
    let parsed = HeaderName::from_str(name).map_err(|_| format!("invalid header name {name:?}"))?;
    Ok((parsed, HeaderValue::from_str(value).map_err(|_| format!("invalid value for header {name:?}"))?))
}

/// The parts of a key spec (`ip`, `header:NAME`, a list of these), errors at `at`.
pub(super) fn key_parts(e: &mut Errors<'_>, at: &str, raw: &RawKey) -> Vec<KeyPart> {
    match raw {
        RawKey::One(text) => e.check(|| at.to_owned(), text.parse()).into_iter().collect(),
        RawKey::Many(list) => {
            if list.is_empty() {
                e.add(at.to_owned(), "needs at least one part");
            }
            list.iter().enumerate().filter_map(|(i, text)| e.check(|| format!("{at}[{i}]"), text.parse())).collect()
        }
    }
}
