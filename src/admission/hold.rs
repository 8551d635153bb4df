//! `upstream_hold:`: a key the upstream refused with a time to wait (a `429` or `503`
//! with `Retry-After`, or a `RateLimit` field whose exhausted item says when it resets)
//! is answered here until then, with the upstream's status and the time left, so that
//! the upstream sees none of its requests while it asked for none. Each route's keys
//! are a bounded table; a hold never outlasts the route's `max`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use http::StatusCode;
use typed_index_collections::TiVec;

use crate::config::{Config, HoldBy, UpstreamHold};
use crate::ids::RouteId;
use crate::limit::Limiters;
use crate::policy::key::{KeyHash, KeySource};
use crate::wire::message::Response;

/// Every route's held keys, indexed like `Config::routes` (`None`: no `upstream_hold`).
pub struct Holds(TiVec<RouteId, Option<HoldTable>>);

/// One route's held keys.
pub struct HoldTable {
    spec: UpstreamHold,
    keys: Mutex<HashMap<u64, Hold, foldhash::fast::RandomState>>,
}

/// A key held: until when, with which status, and the key as every surface writes it.
#[derive(Clone, Debug)]
pub struct Hold {
    pub until: Instant,
    pub status: StatusCode,
    pub key: Box<str>,
}

/// Which key of a route's requests a hold concerns, and how it is written.
pub struct HoldKey {
    hash: KeyHash,
    pub label: Box<str>,
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
                        let table = holds.0[index].as_ref().filter(|t| same(&spec, &t.spec, old_config))?;
                        Some(table.keys.lock().unwrap_or_else(|e| e.into_inner()).clone())
                    });
                    Some(HoldTable { spec, keys: Mutex::new(kept.unwrap_or_default()) })
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
    /// The hold on `key` at `now`, if one runs (one that ended is forgotten).
    pub fn held(&self, key: &HoldKey, now: Instant) -> Option<Hold> {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        let hold = keys.get(&key.hash.0)?;
        if hold.until <= now {
            keys.remove(&key.hash.0);
            return None;
        }
        Some(hold.clone())
    }

    /// Holds `key` after the upstream answered `response` at `now` (`wall`: the time of
    /// day, for a `Retry-After` date), if it refused with a time to wait; returns how
    /// long. A full table first forgets the holds that ended, then half of those that
    /// end soonest: a flood of refused keys costs a bounded table and, spread over the
    /// holds it makes, a bounded time each.
    pub fn hold<B>(&self, key: &HoldKey, response: &Response<B>, now: Instant, wall: SystemTime) -> Option<Duration> {
        if !matches!(response.status, StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE) {
            return None;
        }
        let wait = wait_asked(response, wall)?.min(self.spec.max);
        if wait.is_zero() {
            return None;
        }
        let until = now + wait;
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        if keys.len() >= self.spec.max_keys && !keys.contains_key(&key.hash.0) {
            keys.retain(|_, h| h.until > now);
            if keys.len() >= self.spec.max_keys {
                let mut ends: Vec<Instant> = keys.values().map(|h| h.until).collect();
                let half = (ends.len() / 2).saturating_sub(1);
                let (_, cut, _) = ends.select_nth_unstable(half);
                let cut = *cut;
                keys.retain(|_, h| h.until > cut);
            }
        }
        // A hold already longer stays as it is.
        let hold =
            keys.entry(key.hash.0).or_insert_with(|| Hold { until, status: response.status, key: key.label.clone() });
        if hold.until < until {
            hold.until = until;
            hold.status = response.status;
        }
        Some(wait)
    }

    /// The holds running at `now`, those ending last first.
    pub fn running(&self, now: Instant) -> Vec<Hold> {
        let keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        let mut running: Vec<Hold> = keys.values().filter(|h| h.until > now).cloned().collect();
        running.sort_by_key(|h| std::cmp::Reverse(h.until));
        running
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
        HoldTable {
            spec: UpstreamHold { by: HoldBy::Route, max: Duration::from_secs(3600), max_keys },
            keys: Mutex::default(),
        }
    }

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
        let (at, wall) = (Instant::now(), now);
        for (n, value) in [(1, past.as_str()), (2, "-5"), (3, "0")] {
            assert_eq!(t.hold(&key(n), &refusal(429, &[("retry-after", value)]), at, wall), None, "{value}");
            assert!(t.held(&key(n), at).is_none(), "{value}");
        }
        assert_eq!(
            t.hold(&key(4), &refusal(503, &[("retry-after", &huge)]), at, wall),
            Some(Duration::from_secs(3600))
        );
        assert!(t.held(&key(4), at + Duration::from_secs(3599)).is_some(), "held for max");
        assert!(t.held(&key(4), at + Duration::from_secs(3600)).is_none());
    }

    #[test]
    fn a_hold_runs_until_the_wait_asked_no_longer_than_max_and_only_for_refusals() {
        let t = table(10);
        let now = Instant::now();
        let wall = SystemTime::now();
        assert_eq!(t.hold(&key(1), &refusal(200, &[("retry-after", "5")]), now, wall), None, "not a refusal");
        assert_eq!(t.hold(&key(1), &refusal(429, &[("retry-after", "5")]), now, wall), Some(Duration::from_secs(5)));
        assert_eq!(
            t.hold(&key(2), &refusal(503, &[("retry-after", "99999")]), now, wall),
            Some(Duration::from_secs(3600))
        );
        let held = t.held(&key(1), now + Duration::from_secs(4)).expect("held");
        assert_eq!((held.status, &*held.key), (StatusCode::TOO_MANY_REQUESTS, "k1"));
        assert!(t.held(&key(1), now + Duration::from_secs(5)).is_none(), "ended");
        assert!(t.held(&key(3), now).is_none());
        // A shorter wait does not shorten a hold.
        t.hold(&key(2), &refusal(429, &[("retry-after", "1")]), now, wall);
        assert!(t.held(&key(2), now + Duration::from_secs(60)).is_some());
    }

    #[test]
    fn a_full_table_forgets_the_holds_that_end_soonest() {
        let t = table(4);
        let (now, wall) = (Instant::now(), SystemTime::now());
        for n in 1..=4 {
            t.hold(&key(n), &refusal(429, &[("retry-after", &(n * 10).to_string())]), now, wall);
        }
        t.hold(&key(5), &refusal(429, &[("retry-after", "50")]), now, wall);
        let running: Vec<Box<str>> = t.running(now).into_iter().map(|h| h.key).collect();
        assert_eq!(running, ["k5".into(), "k4".into(), "k3".into()] as [Box<str>; 3]);
    }
}
