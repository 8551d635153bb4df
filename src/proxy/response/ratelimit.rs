//! The rate-limit header fields (draft-ietf-httpapi-ratelimit-headers, or the legacy
//! `X-RateLimit-*`) that tell a client where it stands, on any response.

use http::header::{HeaderName, HeaderValue};
use typed_index_collections::{TiSlice, TiVec};

use super::ceil_secs;
use crate::config::{Config, HeaderStyle, Limit, LimitHeaders, LimitId, Policy};
use smallvec::SmallVec;

use crate::limit::{LimitResult, Shown, Standing};
use crate::policy::Window;
use crate::wire::message::FieldValue;

static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// What the rate-limit header fields say of one window of a limit, computed once.
pub struct Quota {
    /// The `RateLimit-Policy` item, e.g. `"per_ip";q=10;w=1`.
    pub item: String,
    /// The item as a field value, for a response that names one limit: the field is then
    /// a copy of it, made without formatting or allocating.
    pub policy: Option<HeaderValue>,
    /// The start of its `RateLimit` item up to the number remaining: `"per_ip";r=`.
    pub remaining_prefix: String,
    /// Its `q`: requests per window (or in flight, for a concurrency limit).
    pub quota: u64,
}

/// The quotas of every limit of `config`, by limit.
pub fn all_quotas(config: &Config) -> TiVec<LimitId, Box<[Quota]>> {
    // A route that gives a limit a burst of its own decides with that one: the limit's
    // own burst is then not what every response it decides is held to.
    let mut own_burst: TiVec<LimitId, bool> = vec![true; config.limits.len()].into();
    for used in config.routes.iter().flat_map(|r| &r.limits) {
        if used.burst.is_some() {
            own_burst[used.limit] = false;
        }
    }
    config.limits.iter_enumerated().map(|(id, limit)| quotas(limit, own_burst[id])).collect()
}

/// The quotas of `limit`, one per window, named after the limit (and the window's
/// length, when it has several: `"api/1s"`, `"api/1day"`); with `burst`, a rate's
/// burst said as `burst=N`.
fn quotas(limit: &Limit, burst: bool) -> Box<[Quota]> {
    // A dry run, or a limit its configuration hides, is invisible to clients: none of its
    // windows is shown, and it is never the tightest of those that are.
    if limit.dry_run || limit.headers == LimitHeaders::Hidden {
        return Box::default();
    }
    windows(limit, burst)
}

/// The quotas of every limit of `limits` that annotates the requests it forwards (soft
/// limits; none for the others, nor for one in dry run, which only says it would), by
/// limit: what the upstream is told, whether clients see the limit or not.
pub fn annotating_quotas(limits: &TiSlice<LimitId, Limit>) -> TiVec<LimitId, Box<[Quota]>> {
    let listed = |limit: &Limit| limit.annotates() && !limit.dry_run;
    limits.iter().map(|l| if listed(l) { windows(l, false) } else { Box::default() }).collect()
}

/// The quota of each window of `limit` (see `quotas`).
fn windows(limit: &Limit, burst: bool) -> Box<[Quota]> {
    let several = limit.windows.len() > 1;
    let name = |policy: &Policy| match policy {
        Policy::Rate { rate, .. } if several => format!("{}/{}", limit.name, humantime::format_duration(rate.per)),
        _ => limit.name.clone(),
    };
    limit.windows.iter().map(|policy| quota(&name(policy), policy, burst)).collect()
}

/// The quota of one window: the sustained rate as requests per window in whole seconds
/// (a sub-second or fractional window is scaled to one second); a concurrency limit and
/// a calendar window have a quota and no window: `"uploads";q=4`. A rate's burst, the
/// excess it admits at once, decides as much as the rate: with `burst`, it is said as an
/// extension parameter (`"api";q=10;w=1;burst=20`), which the draft lets a client that
/// does not know it ignore.
fn quota(name: &str, policy: &Policy, burst: bool) -> Quota {
    let (count, per) = match policy {
        &Policy::Rate { rate, .. } => (rate.count, rate.per),
        &Policy::FixedWindow { limit, window: Window::Every(window) }
        | &Policy::SlidingWindow { limit, window }
        | &Policy::SlidingLog { limit, window } => (limit, window),
        // A calendar window has no one length (days of 23 to 25 hours, months of 28 to
        // 31 days): `w` is left out, as the draft allows, and `RateLimit`'s `t` says when
        // the current one ends.
        &Policy::FixedWindow { limit, window: Window::Calendar(_) } => {
            return Quota::new(format!("\"{name}\";q={limit}"), name, limit);
        }
        &Policy::Concurrency { max, .. } => {
            return Quota::new(format!("\"{name}\";q={max}"), name, max);
        }
    };
    let (q, w) = if per.subsec_nanos() == 0 {
        (count, per.as_secs())
    } else {
        let per_second = u128::from(count) * 1_000_000_000 / per.as_nanos().max(1);
        (u64::try_from(per_second).unwrap_or(u64::MAX).max(1), 1)
    };
    match policy {
        &Policy::Rate { burst: excess, .. } if burst && excess > 0 => {
            Quota::new(format!("\"{name}\";q={q};w={w};burst={excess}"), name, q)
        }
        _ => Quota::new(format!("\"{name}\";q={q};w={w}"), name, q),
    }
}

impl Quota {
    fn new(item: String, name: &str, quota: u64) -> Self {
        let remaining_prefix = format!("\"{name}\";r=");
        Quota { policy: HeaderValue::from_str(&item).ok(), item, remaining_prefix, quota }
    }
}

static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Adds the rate-limit fields for `standings` in `style`; `quotas` holds each limit's
/// quotas (by window). `standings` is an iterator: a refusal's are `Standing`s, read in
/// place; a passed request's are `Shown` already. The legacy `X-RateLimit-*` fields can
/// describe one limit only: the one with the fewest requests remaining (then the longest
/// reset); their reset is in seconds from now, like the draft's `t`.
pub fn add_ratelimit_headers(
    set: &mut impl FnMut(HeaderName, FieldValue),
    standings: impl Iterator<Item = Shown> + Clone,
    quotas: &TiSlice<LimitId, Box<[Quota]>>,
    style: HeaderStyle,
) {
    // Limits without quotas (dry runs) are not shown.
    let shown = standings.filter(|s| !quotas[s.limit].is_empty());
    let Some(tightest) = shown.clone().min_by_key(|s| (s.remaining, std::cmp::Reverse(s.reset))) else {
        return;
    };
    let quota = |s: Shown| &quotas[s.limit][s.window as usize];
    if style != HeaderStyle::Legacy {
        let mut two = shown.clone().take(2);
        let policy = match (two.next(), two.next()) {
            (Some(one), None) => quota(one).policy.clone(),
            _ => {
                HeaderValue::try_from(shown.clone().map(|s| quota(s).item.as_str()).collect::<Vec<_>>().join(", ")).ok()
            }
        };
        if let Some(policy) = policy {
            set(RATELIMIT_POLICY.clone(), FieldValue::Given(policy));
        }
        set(RATELIMIT.clone(), ratelimit(shown, quotas));
    }
    if style != HeaderStyle::Draft {
        set(X_RATELIMIT_LIMIT.clone(), FieldValue::number(quota(tightest).quota));
        set(X_RATELIMIT_REMAINING.clone(), FieldValue::number(tightest.remaining));
        set(X_RATELIMIT_RESET.clone(), FieldValue::number(ceil_secs(tightest.reset)));
    }
}

/// The `RateLimit` field of `standings` (each limit's window with a quota): an item per
/// window, `"per_ip";r=2;t=1`. Written piece by piece, not formatted: every limited
/// response carries it.
fn ratelimit(standings: impl Iterator<Item = Shown>, quotas: &TiSlice<LimitId, Box<[Quota]>>) -> FieldValue {
    let mut current = FieldValue::written();
    for (i, s) in standings.enumerate() {
        if i > 0 {
            current.push_str(", ");
        }
        current.push_str(&quotas[s.limit][s.window as usize].remaining_prefix);
        current.push_number(s.remaining);
        current.push_str(";t=");
        current.push_number(ceil_secs(s.reset));
    }
    current
}

/// What a request's soft limits tell its upstream: the fields `RateLimit-Exceeded` (the
/// names of the limits that annotate it) and `RateLimit` (their items, as a response's).
pub struct Annotation {
    pub exceeded: FieldValue,
    pub ratelimit: FieldValue,
}

impl Annotation {
    /// The annotation of a passed request whose limits decided `results` (those of limits
    /// that annotate it marked, `LimitResult::annotated`) with their windows at
    /// `standings`, in the order of `listed` (the route's; a limit an override named,
    /// after them); `quotas`: `annotating_quotas` of `limits`. `None`: no limit annotates
    /// it (or only limits in dry run, which have no quotas there).
    pub fn of(
        results: &[LimitResult],
        standings: &[Standing],
        listed: &[LimitId],
        limits: &TiSlice<LimitId, Limit>,
        quotas: &TiSlice<LimitId, Box<[Quota]>>,
    ) -> Option<Box<Annotation>> {
        let mut annotating: SmallVec<[LimitId; 2]> =
            results.iter().filter(|r| r.annotated && !quotas[r.limit].is_empty()).map(|r| r.limit).collect();
        if annotating.is_empty() {
            return None;
        }
        annotating.sort_by_key(|l| listed.iter().position(|m| m == l).unwrap_or(usize::MAX));
        let mut exceeded = FieldValue::written();
        for (i, &limit) in annotating.iter().enumerate() {
            if i > 0 {
                exceeded.push_str(", ");
            }
            // A limit's name is a token (letters, digits, `_-.`): a field value as it is.
            exceeded.push_str(&limits[limit].name);
        }
        let items = annotating.iter().flat_map(|&l| standings.iter().filter(move |s| s.limit == l)).map(Shown::from);
        Some(Box::new(Annotation { exceeded, ratelimit: ratelimit(items, quotas) }))
    }

    /// The fields as the hop writes them.
    pub fn fields(&self) -> crate::hop::Annotation<'_> {
        crate::hop::Annotation { exceeded: self.exceeded.as_bytes(), ratelimit: self.ratelimit.as_bytes() }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::HeaderMap;

    use http::StatusCode;

    use super::*;
    use crate::config::units::parse_rate;
    use crate::limit::{Outcome, Standing};
    use crate::policy::key::{KeyHash, KeySpec};
    use typed_index_collections::TiVec;

    fn limit(name: &str, rate: &str) -> Limit {
        Limit {
            name: name.into(),
            key: KeySpec(Box::new([])),
            windows: vec![Policy::Rate { rate: parse_rate(rate).unwrap(), burst: 0, delay: 0 }],
            status: StatusCode::TOO_MANY_REQUESTS,
            max_keys: 1,
            dry_run: false,
            headers: LimitHeaders::Shown,
            action: crate::config::LimitAction::Refuse,
            annotate_from: None,
            persist: false,
            log_level: crate::config::LogLevel::Info,
            log_lines_per_second: 5,
            grpc_status: crate::grpc::Code::RESOURCE_EXHAUSTED,
            ban: None,
            allow: Default::default(),
            count: None,
            charge: None,
            money: None,
            overrides: Vec::new(),
            scope: crate::config::Scope::Local,
            on_missing_key: Default::default(),
            on_invalid_token: Default::default(),
            response: None,
            tenant: None,
            queue: None,
        }
    }

    #[test]
    fn policy_items_state_quota_and_window_in_seconds() {
        assert_eq!(quotas(&limit("a", "10r/s"), true)[0].item, "\"a\";q=10;w=1");
        assert_eq!(quotas(&limit("a", "100r/15m"), true)[0].item, "\"a\";q=100;w=900");
        assert_eq!(quotas(&limit("a", "10r/500ms"), true)[0].item, "\"a\";q=20;w=1");
        let mut two = limit("a", "10r/s");
        two.windows.push(Policy::Rate { rate: parse_rate("10000r/d").unwrap(), burst: 9999, delay: 9999 });
        let items: Vec<String> = quotas(&two, true).iter().map(|q| q.item.clone()).collect();
        assert_eq!(items, ["\"a/1s\";q=10;w=1", "\"a/1day\";q=10000;w=86400;burst=9999"]);
        let items: Vec<String> = quotas(&two, false).iter().map(|q| q.item.clone()).collect();
        assert_eq!(items, ["\"a/1s\";q=10;w=1", "\"a/1day\";q=10000;w=86400"], "a route's own burst decides");
    }

    /// The upstream is told the names of the limits that annotate a request, in the
    /// route's order, and their `RateLimit` items, as a response's: a hidden limit too
    /// (the upstream is no client), never one in dry run, nor a limit that does not annotate.
    #[test]
    fn an_annotation_names_its_limits_in_the_routes_order_with_their_items() {
        let soft = |name: &str, rate: &str| Limit { action: crate::config::LimitAction::Annotate, ..limit(name, rate) };
        let limits: TiVec<LimitId, Limit> = vec![
            soft("a", "10r/s"),
            Limit { headers: LimitHeaders::Hidden, ..soft("b", "1r/m") },
            Limit { dry_run: true, ..soft("c", "1r/m") },
            limit("d", "1r/m"),
        ]
        .into();
        let quotas = annotating_quotas(&limits);
        let id = LimitId::from;
        let standing = |limit: usize, remaining, reset_ms| Standing {
            limit: id(limit),
            window: 0,
            outcome: Outcome::Rejected(Duration::from_secs(1)),
            remaining,
            reset: Duration::from_millis(reset_ms),
            excess: 0.0,
            banned: false,
        };
        let standings = [standing(0, 1, 300), standing(1, 0, 59_500), standing(2, 0, 1), standing(3, 0, 1)];
        let results: Vec<LimitResult> = standings
            .iter()
            .map(|s| LimitResult { annotated: s.limit != id(3), ..LimitResult::fold(s.limit, KeyHash(1), &[*s]) })
            .collect();
        let listed = [id(3), id(1), id(2), id(0)];
        let annotation = Annotation::of(&results, &standings, &listed, &limits, &quotas).unwrap();
        assert_eq!(annotation.exceeded.as_bytes(), b"b, a");
        assert_eq!(annotation.ratelimit.as_bytes(), b"\"b\";r=0;t=60, \"a\";r=1;t=1");
        let none: Vec<LimitResult> = results.iter().map(|r| LimitResult { annotated: false, ..*r }).collect();
        assert!(Annotation::of(&none, &standings, &listed, &limits, &quotas).is_none());
    }

    #[test]
    fn ratelimit_fields_list_every_standing() {
        let limits = [limit("a", "10r/s"), limit("b", "1r/m")];
        let quotas: TiVec<LimitId, Box<[Quota]>> = limits.iter().map(|l| quotas(l, true)).collect();
        let standings = [
            Standing {
                limit: LimitId::from(0),
                window: 0,
                outcome: Outcome::Passed,
                remaining: 2,
                reset: Duration::from_millis(300),
                excess: 0.0,
                banned: false,
            },
            Standing {
                limit: LimitId::from(1),
                window: 0,
                outcome: Outcome::Rejected(Duration::from_secs(1)),
                remaining: 0,
                reset: Duration::from_secs(59),
                excess: 1.5,
                banned: false,
            },
        ];
        let mut h = HeaderMap::new();
        let mut insert = |n, v: FieldValue| _ = h.insert(n, HeaderValue::from_bytes(v.as_bytes()).unwrap());
        add_ratelimit_headers(&mut insert, standings.iter().map(Shown::from), &quotas, HeaderStyle::Draft);
        assert_eq!(h[&RATELIMIT_POLICY], "\"a\";q=10;w=1, \"b\";q=1;w=60");
        assert_eq!(h[&RATELIMIT], "\"a\";r=2;t=1, \"b\";r=0;t=59");
        assert!(!h.contains_key(&X_RATELIMIT_LIMIT));
        let mut h = HeaderMap::new();
        let mut insert = |n, v: FieldValue| _ = h.insert(n, HeaderValue::from_bytes(v.as_bytes()).unwrap());
        add_ratelimit_headers(&mut insert, standings.iter().map(Shown::from), &quotas, HeaderStyle::Legacy);
        assert!(!h.contains_key(&RATELIMIT));
        assert_eq!(
            (&h[&X_RATELIMIT_LIMIT], &h[&X_RATELIMIT_REMAINING], &h[&X_RATELIMIT_RESET]),
            (
                &"1".parse::<HeaderValue>().unwrap(),
                &"0".parse::<HeaderValue>().unwrap(),
                &"59".parse::<HeaderValue>().unwrap()
            )
        );

        // Hidden, `b` is in neither style: not listed, and never the tightest, though it
        // has none left.
        let limits = [limit("a", "10r/s"), Limit { headers: LimitHeaders::Hidden, ..limit("b", "1r/m") }];
        let shown: TiVec<LimitId, Box<[Quota]>> = limits.iter().map(|l| super::quotas(l, true)).collect();
        let mut h = HeaderMap::new();
        let mut insert = |n, v: FieldValue| _ = h.insert(n, HeaderValue::from_bytes(v.as_bytes()).unwrap());
        add_ratelimit_headers(&mut insert, standings.iter().map(Shown::from), &shown, HeaderStyle::Both);
        assert_eq!(h[&RATELIMIT_POLICY], "\"a\";q=10;w=1");
        assert_eq!(h[&RATELIMIT], "\"a\";r=2;t=1");
        assert_eq!((h[&X_RATELIMIT_LIMIT].as_bytes(), h[&X_RATELIMIT_REMAINING].as_bytes()), (&b"10"[..], &b"2"[..]));
    }
}
