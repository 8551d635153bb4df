//! `upstream_hold:`: a key the upstream refused with a time to wait (a `429` or `503`
//! with `Retry-After`, or a `RateLimit` field whose exhausted item says when it resets)
//! is answered here until then, with the upstream's status and the time left, so that
//! the upstream sees none of its requests while it asked for none. Each route's keys
//! are a bounded table; a hold never outlasts the route's `max`.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::StatusCode;
use typed_index_collections::TiVec;

use crate::clock::Nanos;
use crate::config::{Config, HoldBy, UpstreamHold};
use crate::ids::RouteId;
use crate::limit::Limiters;
use crate::limit::table::{KeyNames, KeyTable};
use crate::policy::key::{KeyHash, KeySource};
use crate::wire::message::Response;

/// Every route's held keys, indexed like `Config::routes` (`None`: no `upstream_hold`).
pub struct Holds(TiVec<RouteId, Option<HoldTable>>);

/// One route's held keys: the house's bounded key table (as bans and limits keep theirs),
/// read on the gate's clock, so that a replay or a test moves holds with its own time.
pub struct HoldTable {
    spec: UpstreamHold,
    /// Each held key's end (milliseconds since the epoch, the low 48 bits, good until the
    /// year 10889) and the status the upstream refused with (the high 16).
    table: Arc<KeyTable>,
    /// Each held key as written, for the dashboard.
    names: Arc<KeyNames>,
}

/// A key held: until when, with which status, and the key as every surface writes it.
#[derive(Clone, Debug)]
pub struct Hold {
    pub until: Nanos,
    pub status: StatusCode,
    pub key: Box<str>,
}

/// Which key of a route's requests a hold concerns, and how it is written.
pub struct HoldKey {
    hash: KeyHash,
    pub label: Box<str>,
}

const MS: u64 = 1_000_000;
const STATUS_SHIFT: u32 = 48;
const UNTIL_MASK: u64 = (1 << STATUS_SHIFT) - 1;

/// A hold's end, in nanoseconds, and its status.
fn unpack(state: u64) -> (u64, StatusCode) {
    let status = u16::try_from(state >> STATUS_SHIFT).ok().and_then(|s| StatusCode::from_u16(s).ok());
    ((state & UNTIL_MASK).saturating_mul(MS), status.unwrap_or(StatusCode::TOO_MANY_REQUESTS))
}

impl Holds {
    /// The tables of `config`'s routes; a route of the same name holding by the same
    /// thing in `old` (the configuration reloaded) keeps its held keys.
    pub fn new(config: &Config, old: Option<(&Config, &Holds)>) -> Holds {
        let same = |spec: &UpstreamHold, old_spec: &UpstreamHold, old_config: &Config| match (spec.by, old_spec.by) {
            (HoldBy::Route, HoldBy::Route) => true,
            (HoldBy::Limit(a), HoldBy::Limit(b)) => config.limits[a].name == old_config.limits[b].name,
            _ => false,
        };
        Holds(
            config
                .routes
                .iter()
                .map(|route| {
                    let spec = route.upstream_hold.clone()?;
                    let kept = old.and_then(|(old_config, holds)| {
                        let (index, _) = old_config.routes.iter_enumerated().find(|(_, r)| r.name == route.name)?;
                        holds.0[index].as_ref().filter(|t| same(&spec, &t.spec, old_config))
                    });
                    Some(HoldTable::new(spec, kept))
                })
                .collect(),
        )
    }

    pub fn table(&self, route: RouteId) -> Option<&HoldTable> {
        self.0.get(route)?.as_ref()
    }

    /// The key of `src` that route `route` holds by (`None`: the route holds nothing,
    /// or the request lacks that limit's key and is never held).
    pub fn key(&self, route: RouteId, limiters: &Limiters, src: &KeySource<'_>) -> Option<HoldKey> {
        match self.table(route)?.spec.by {
            HoldBy::Route => Some(HoldKey { hash: KeyHash(0), label: "(the route)".into() }),
            HoldBy::Limit(limit) => {
                let hash = limiters.key_hash(limit, src)?;
                Some(HoldKey { hash, label: limiters.key_label(limit, src).into() })
            }
        }
    }
}

impl HoldTable {
    /// A table for `spec`; `kept`, the same route's before a reload, gives its holds: its
    /// table itself when it is bounded alike, else a copy within the new bound.
    fn new(spec: UpstreamHold, kept: Option<&HoldTable>) -> HoldTable {
        match kept {
            Some(old) if old.spec.max_keys == spec.max_keys => {
                HoldTable { spec, table: Arc::clone(&old.table), names: Arc::clone(&old.names) }
            }
            _ => {
                let table = HoldTable {
                    table: Arc::new(KeyTable::new(spec.max_keys)),
                    names: Arc::new(KeyNames::new(spec.max_keys)),
                    spec,
                };
                if let Some(old) = kept {
                    old.table.each(|key, state| {
                        table.keep(key, state, 0, None);
                        if let Some(name) = old.names.get(key) {
                            table.names.name(key, name, |_| true);
                        }
                    });
                }
                table
            }
        }
    }

    /// The hold on `key` at `now`, if one runs (one that ended is forgotten).
    pub fn held(&self, key: &HoldKey, now: Nanos) -> Option<Hold> {
        let mut shard = self.table.lock(key.hash.0);
        let (until, status) = unpack(shard.get(key.hash.0)?);
        if until <= now.0 {
            shard.remove(key.hash.0);
            drop(shard);
            self.names.remove(key.hash.0);
            return None;
        }
        Some(Hold { until: Nanos(until), status, key: key.label.clone() })
    }

    /// Holds `key` after the upstream answered `response` at `now`, if it refused with a
    /// time to wait; returns how long.
    pub fn hold<B>(&self, key: &HoldKey, response: &Response<B>, now: Nanos) -> Option<Duration> {
        if !matches!(response.status, StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE) {
            return None;
        }
        // The clock's instants are the time of day's, for a `Retry-After` date.
        let wall = SystemTime::UNIX_EPOCH + Duration::from_nanos(now.0);
        let wait = wait_asked(response, wall)?;
        self.hold_for(key, response.status, wait, now)
    }

    /// Holds `key` from `now` for `wait` (at most the route's `max`) with `status`, as
    /// the upstream asked; returns how long, `None` if that is no time. A hold already
    /// longer stays as it is. A full table first forgets the holds that ended, then the
    /// eighth that end soonest (as every key table makes room): a flood of refused keys
    /// costs a bounded table and a bounded time each.
    pub fn hold_for(&self, key: &HoldKey, status: StatusCode, wait: Duration, now: Nanos) -> Option<Duration> {
        let wait = wait.min(self.spec.max);
        if wait.is_zero() {
            return None;
        }
        // Kept to the millisecond, rounded down, so that the time left it answers with
        // (`Retry-After`, whole seconds rounded up) is never more than the wait asked.
        let until = (now.after(wait).0 / MS).min(UNTIL_MASK);
        let state = (u64::from(status.as_u16()) << STATUS_SHIFT) | until;
        self.keep(key.hash.0, state, now.0, Some(&key.label));
        Some(wait)
    }

    /// Stores hold `state` of `key` at `now` (nanoseconds) unless a longer one runs, and
    /// names it `name`.
    fn keep(&self, key: u64, state: u64, now: u64, name: Option<&str>) {
        let mut shard = self.table.lock(key);
        if shard.get(key).is_some_and(|old| old & UNTIL_MASK >= state & UNTIL_MASK) {
            return;
        }
        let ended = |s: u64| unpack(s).0 <= now;
        self.table.put(&mut shard, key, state, ended, |s| s & UNTIL_MASK);
        drop(shard);
        if let Some(name) = name {
            let running = |k: u64| self.table.lock(k).get(k).is_some_and(|s| !ended(s));
            self.names.name(key, name.into(), running);
        }
    }

    /// The holds running at `now`, those ending last first.
    pub fn running(&self, now: Nanos) -> Vec<Hold> {
        let mut running = Vec::new();
        self.table.each(|key, state| {
            let (until, status) = unpack(state);
            if until > now.0 {
                running.push((key, until, status));
            }
        });
        running.sort_by_key(|&(_, until, _)| std::cmp::Reverse(until));
        let names = self.names.of(running.iter().map(|&(key, _, _)| key));
        (running.into_iter().zip(names))
            .map(|((key, until, status), name)| Hold {
                until: Nanos(until),
                status,
                key: name.unwrap_or_else(|| format!("(key {key:016x})").into()),
            })
            .collect()
    }
}

/// How long the upstream's refusal asks to wait: its `Retry-After` (seconds, or an HTTP
/// date from `now`), else the reset (`t`) of the `RateLimit` items it says are spent
/// (`r=0`; the latest of them), else a `RateLimit-Reset` in seconds.
fn wait_asked<B>(response: &Response<B>, now: SystemTime) -> Option<Duration> {
    let text = |name: &'static str| {
        response.field(&http::HeaderName::from_static(name)).and_then(|v| std::str::from_utf8(v).ok()).map(str::trim)
    };
    // Digits only. More of them than a u64 holds is a wait as long as any, held for `max`,
    // as RFC 9111 §1.2.2 reads an overflowing delta-seconds (the greatest value it can
    // represent), not a refusal without a time to wait.
    let seconds = |s: &str| {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse::<u64>().unwrap_or(u64::MAX))
    };
    if let Some(value) = text("retry-after") {
        return match seconds(value) {
            Some(s) => Some(Duration::from_secs(s)),
            None => httpdate::parse_http_date(value).ok()?.duration_since(now).ok(),
        };
    }
    if let Some(value) = text("ratelimit") {
        let spent = value.split(',').filter_map(|item| {
            let params: Vec<(&str, &str)> = item.split(';').skip(1).filter_map(|p| p.trim().split_once('=')).collect();
            let param = |name: &str| params.iter().find(|(n, _)| *n == name).and_then(|(_, v)| seconds(v));
            (param("r") == Some(0)).then(|| param("t")).flatten()
        });
        if let Some(t) = spent.max() {
            return Some(Duration::from_secs(t));
        }
    }
    text("ratelimit-reset").and_then(seconds).map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::wire::message::FieldValue;

    fn refusal(status: u16, fields: &[(&'static str, &str)]) -> Response<Bytes> {
        let extra = fields
            .iter()
            .map(|&(n, v)| (http::HeaderName::from_static(n), FieldValue::Long(v.as_bytes().to_vec())))
            .collect();
        Response::made(StatusCode::from_u16(status).unwrap(), extra, Bytes::new())
    }

    fn table(max_keys: usize) -> HoldTable {
        HoldTable::new(UpstreamHold { by: HoldBy::Route, max: Duration::from_secs(3600), max_keys }, None)
    }

    /// An instant on the clock, and the same as the time of day.
    fn at(secs: u64) -> Nanos {
        Nanos(secs * 1_000_000_000)
    }

    const S: Duration = Duration::from_secs(1);

    fn key(n: u64) -> HoldKey {
        HoldKey { hash: KeyHash(n), label: format!("k{n}").into() }
    }

    #[test]
    fn the_wait_is_read_from_retry_after_then_ratelimit_then_its_reset() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let wait = |status, fields: &[(&'static str, &str)]| wait_asked(&refusal(status, fields), now);
        assert_eq!(wait(429, &[("retry-after", "30")]), Some(Duration::from_secs(30)));
        let date = httpdate::fmt_http_date(now + Duration::from_secs(90));
        assert_eq!(wait(503, &[("retry-after", &date)]), Some(Duration::from_secs(90)));
        assert_eq!(wait(503, &[("retry-after", "soon")]), None);
        let items = "\"hour\";r=10;t=3000, \"minute\";r=0;t=42, \"burst\";r=0;t=5";
        assert_eq!(wait(429, &[("ratelimit", items)]), Some(Duration::from_secs(42)));
        assert_eq!(wait(429, &[("ratelimit", "\"hour\";r=10;t=3000")]), None, "nothing spent");
        assert_eq!(wait(429, &[("ratelimit-reset", "7")]), Some(Duration::from_secs(7)));
        assert_eq!(wait(429, &[]), None);
    }

    /// A date already past, a negative number and `0` ask for no wait: nothing is held.
    /// A number of more seconds than any clock counts (30 digits) is a wait as long as
    /// one can be, held for `max`, as RFC 9111 §1.2.2 reads an overflowing delta-seconds
    /// (the greatest value it can represent), not dropped as unreadable.
    #[test]
    fn a_wait_in_the_past_negative_or_zero_holds_nothing_and_one_of_30_digits_holds_for_max() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let wait = |fields: &[(&'static str, &str)]| wait_asked(&refusal(429, fields), now);
        let past = httpdate::fmt_http_date(now - Duration::from_secs(90));
        let huge = "9".repeat(30);
        assert_eq!(wait(&[("retry-after", &past)]), None, "a date already past");
        assert_eq!(wait(&[("retry-after", "-5")]), None, "not delay-seconds (RFC 9110 §10.2.3: 1*DIGIT)");
        assert_eq!(wait(&[("retry-after", "0")]), Some(Duration::ZERO));
        assert_eq!(wait(&[("retry-after", "")]), None);
        assert_eq!(wait(&[("retry-after", &huge)]), Some(Duration::from_secs(u64::MAX)));
        assert_eq!(wait(&[("ratelimit", &format!("\"day\";r=0;t={huge}"))]), Some(Duration::from_secs(u64::MAX)));
        assert_eq!(wait(&[("ratelimit-reset", &huge)]), Some(Duration::from_secs(u64::MAX)));
        let t = table(10);
        let at = at(1_000_000_000);
        for (n, value) in [(1, past.as_str()), (2, "-5"), (3, "0")] {
            assert_eq!(t.hold(&key(n), &refusal(429, &[("retry-after", value)]), at), None, "{value}");
            assert!(t.held(&key(n), at).is_none(), "{value}");
        }
        assert_eq!(t.hold(&key(4), &refusal(503, &[("retry-after", &huge)]), at), Some(Duration::from_secs(3600)));
        assert!(t.held(&key(4), at.after(3599 * S)).is_some(), "held for max");
        assert!(t.held(&key(4), at.after(3600 * S)).is_none());
    }

    #[test]
    fn a_hold_runs_until_the_wait_asked_no_longer_than_max_and_only_for_refusals() {
        let t = table(10);
        let now = at(1_700_000_000);
        assert_eq!(t.hold(&key(1), &refusal(200, &[("retry-after", "5")]), now), None, "not a refusal");
        assert_eq!(t.hold(&key(1), &refusal(429, &[("retry-after", "5")]), now), Some(5 * S));
        assert_eq!(t.hold(&key(2), &refusal(503, &[("retry-after", "99999")]), now), Some(3600 * S));
        let held = t.held(&key(1), now.after(4 * S)).expect("held");
        assert_eq!((held.status, &*held.key, held.until), (StatusCode::TOO_MANY_REQUESTS, "k1", now.after(5 * S)));
        assert!(t.held(&key(1), now.after(5 * S)).is_none(), "ended");
        assert!(t.held(&key(3), now).is_none());
        // A shorter wait does not shorten a hold, nor change its status.
        t.hold(&key(2), &refusal(429, &[("retry-after", "1")]), now);
        let held = t.held(&key(2), now.after(60 * S)).expect("still held");
        assert_eq!(held.status, StatusCode::SERVICE_UNAVAILABLE);
    }

    /// Held keys whose hash lands in one shard (the high bits pick it), as a flood's would.
    fn flooding(n: u64) -> HoldKey {
        HoldKey { hash: KeyHash(n + 1), label: format!("k{n}").into() }
    }

    #[test]
    fn a_full_table_forgets_the_holds_that_ended_then_those_that_end_soonest() {
        let t = table(16);
        let now = at(1_700_000_000);
        for n in 1..=16 {
            t.hold_for(&flooding(n), StatusCode::TOO_MANY_REQUESTS, S * (n as u32 * 10), now);
        }
        // Two more once the first has ended: it goes, and the one ending soonest with it
        // (an eighth of the table).
        let later = now.after(15 * S);
        for n in [100, 101] {
            t.hold_for(&flooding(n), StatusCode::TOO_MANY_REQUESTS, S * (n as u32 * 10), later);
        }
        let running: Vec<String> = t.running(later).into_iter().map(|h| h.key.into()).collect();
        assert_eq!(running.len(), 16, "{running:?}");
        assert_eq!(running[..2], ["k101", "k100"]);
        assert!(running.iter().all(|k| k != "k1" && k != "k2"), "{running:?}");
        assert_eq!(running.last().map(String::as_str), Some("k3"));
    }

    /// The hash 0 (a route's one key) is stored as 1 by the table: its name is found again.
    #[test]
    fn the_hold_of_a_whole_route_is_listed_by_its_name() {
        let t = table(16);
        let route = HoldKey { hash: KeyHash(0), label: "(the route)".into() };
        let now = at(1_700_000_000);
        t.hold_for(&route, StatusCode::SERVICE_UNAVAILABLE, 30 * S, now);
        assert_eq!(t.running(now).first().map(|h| &*h.key), Some("(the route)"));
        assert!(t.held(&route, now.after(30 * S)).is_none(), "ended");
        assert!(t.running(now).is_empty(), "forgotten with its name");
    }

    #[test]
    fn a_reload_keeps_the_holds_and_their_names_within_its_own_bound() {
        let old = table(16);
        let now = at(1_700_000_000);
        for n in 1..=8 {
            old.hold_for(&flooding(n), StatusCode::SERVICE_UNAVAILABLE, S * n as u32, now);
        }
        let spec = |max_keys| UpstreamHold { by: HoldBy::Route, max: 3600 * S, max_keys };
        let same = HoldTable::new(spec(16), Some(&old));
        let copied = HoldTable::new(spec(64), Some(&old));
        for t in [&same, &copied] {
            let held = t.held(&flooding(8), now).expect("kept");
            assert_eq!((held.status, held.until), (StatusCode::SERVICE_UNAVAILABLE, now.after(8 * S)));
            assert_eq!(t.running(now).first().map(|h| &*h.key), Some("k8"));
        }
    }
}
