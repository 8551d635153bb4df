//! Responses made here rather than upstream: static routes, rejections, errors; and the
//! rate-limit header fields (draft-ietf-httpapi-ratelimit-headers) on any response.

use std::fmt::Write as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};
use http_body_util::{Either, Full};
use hyper::body::{Body, Frame, SizeHint};

use super::error::ProxyError;
use super::forward::UpstreamBody;
use crate::access_log::Entry;
use crate::config::{HeaderStyle, Limit, Policy, RejectionBody, StaticResponse};
use crate::limit::{Permits, Standing};

/// A response body, streamed from the upstream or made here in full, carrying the
/// request's concurrency slots: they are given back when the body has been sent to the
/// end, or when hyper drops it because the client went away.
pub struct ProxyBody {
    inner: Either<UpstreamBody, Full<Bytes>>,
    permits: Permits,
    /// The release of global slots under way, and the frame (or end) it holds back.
    releasing: Option<(Release, Option<Frame<Bytes>>)>,
    /// The request's access log line, written when this body is dropped.
    access: Option<Box<Entry>>,
}

type Release = Pin<Box<dyn Future<Output = ()> + Send>>;

impl ProxyBody {
    pub fn streamed(body: UpstreamBody) -> Self {
        ProxyBody { inner: Either::Left(body), permits: Permits::default(), releasing: None, access: None }
    }

    pub fn full(body: impl Into<Bytes>) -> Self {
        let inner = Either::Right(Full::new(body.into()));
        ProxyBody { inner, permits: Permits::default(), releasing: None, access: None }
    }

    pub fn holding(self, permits: Permits) -> Self {
        ProxyBody { permits, ..self }
    }

    /// Counts the bytes sent into `entry`, which writes its line when the body is dropped:
    /// sent in full, or abandoned by the client.
    pub fn logged(self, entry: Box<Entry>) -> Self {
        ProxyBody { access: Some(entry), ..self }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    /// Slots are given back when the body ends. The last frame (or the end) waits until
    /// global slots are released in Redis, so the client cannot see its response done
    /// while the slot still counts.
    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Some((release, _)) = &mut this.releasing {
            std::task::ready!(release.as_mut().poll(cx));
            let held = this.releasing.take().and_then(|(_, frame)| frame);
            return Poll::Ready(held.map(Ok));
        }
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let (Some(entry), Poll::Ready(Some(Ok(frame)))) = (&mut this.access, &polled) {
            entry.bytes += frame.data_ref().map_or(0, |d| d.len() as u64);
        }
        let ends = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => this.inner.is_end_stream(),
            _ => false,
        };
        if !ends {
            return polled;
        }
        let Some(release) = this.permits.finish() else { return polled };
        let frame = match polled {
            Poll::Ready(Some(Ok(frame))) => Some(frame),
            _ => None,
        };
        this.releasing = Some((Box::pin(release), frame));
        Pin::new(this).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.releasing.is_none() && !self.permits.holds_leases() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

fn made_here(status: StatusCode, body: impl Into<Bytes>) -> Response<ProxyBody> {
    let mut response = Response::new(ProxyBody::full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

pub fn static_response(r: &StaticResponse) -> Response<ProxyBody> {
    let mut response = Response::new(ProxyBody::full(r.body.clone()));
    *response.status_mut() = r.status;
    *response.headers_mut() = r.headers.clone();
    response
}

/// The answer to a failed request: the reason phrase, and for the client's own faults
/// what was wrong (an upstream's failure is logged, not shown).
pub fn error(e: &ProxyError) -> Response<ProxyBody> {
    let status = e.status();
    let reason = status.canonical_reason().unwrap_or("error");
    let body = if status.is_client_error() { format!("{reason}: {e}\n") } else { format!("{reason}\n") };
    made_here(status, body)
}

/// The rejection: `Retry-After` in whole seconds, rounded up and at least 1, so a client
/// that waits exactly that long is not rejected again for being early (RFC 9110 §10.2.3).
/// The body is a line of text, or with `RejectionBody::ProblemJson` a problem details
/// object (RFC 9457) naming the `violated` limits.
pub fn rejected(
    status: StatusCode,
    retry_after: Duration,
    body: RejectionBody,
    violated: &[&str],
) -> Response<ProxyBody> {
    let title = status.canonical_reason().unwrap_or("Rejected");
    let retry_after = ceil_secs(retry_after).max(1);
    let mut response = match body {
        // The default status's body is a constant: no formatting, no allocation, for
        // what a flood of rejections answers over and over.
        RejectionBody::Text if status == StatusCode::TOO_MANY_REQUESTS => {
            made_here(status, Bytes::from_static(b"Too Many Requests\n"))
        }
        RejectionBody::Text => made_here(status, format!("{title}\n")),
        RejectionBody::ProblemJson => {
            // Limit names are letters, digits, '_', '-' and '.': nothing to escape.
            let names = violated.iter().map(|n| format!("\"{n}\"")).collect::<Vec<_>>().join(",");
            let json = format!(
                "{{\"type\":\"about:blank\",\"title\":\"{title}\",\"status\":{},\"detail\":\"Request rate limit exceeded; retry after {retry_after} s.\",\"violated_limits\":[{names}],\"retry_after\":{retry_after}}}\n",
                status.as_u16()
            );
            let mut response = made_here(status, json);
            response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
            response
        }
    };
    response.headers_mut().insert(RETRY_AFTER, HeaderValue::from(retry_after));
    response
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// What the rate-limit header fields say of one window of a limit, computed once.
pub struct Quota {
    /// The `RateLimit-Policy` item, e.g. `"per_ip";q=10;w=1`.
    pub item: String,
    /// The item as a field value, for a response that names one limit: the field is then
    /// a copy of it, made without formatting or allocating.
    pub policy: Option<HeaderValue>,
    /// Its name.
    pub name: String,
    /// Its `q`: requests per window (or in flight, for a concurrency limit).
    pub quota: u64,
}

/// The quotas of `limit`, one per window, named after the limit (and the window's
/// length, when it has several: `"api/1s"`, `"api/1day"`).
pub fn quotas(limit: &Limit) -> Box<[Quota]> {
    let several = limit.windows.len() > 1;
    let name = |policy: &Policy| match policy {
        Policy::Rate { rate, .. } if several => format!("{}/{}", limit.name, humantime::format_duration(rate.per)),
        _ => limit.name.clone(),
    };
    limit.windows.iter().map(|policy| quota(&name(policy), policy)).collect()
}

/// The quota of one window: the sustained rate as requests per window in whole seconds
/// (a sub-second or fractional window is scaled to one second); a concurrency limit has a
/// quota and no window: `"uploads";q=4`.
fn quota(name: &str, policy: &Policy) -> Quota {
    let (count, per) = match *policy {
        Policy::Rate { rate, .. } => (rate.count, rate.per),
        Policy::FixedWindow { limit, window }
        | Policy::SlidingWindow { limit, window }
        | Policy::SlidingLog { limit, window } => (limit, window),
        Policy::Concurrency { max, .. } => {
            return Quota::new(format!("\"{name}\";q={max}"), name, max);
        }
    };
    let (q, w) = if per.subsec_nanos() == 0 {
        (count, per.as_secs())
    } else {
        let per_second = u128::from(count) * 1_000_000_000 / per.as_nanos().max(1);
        (u64::try_from(per_second).unwrap_or(u64::MAX).max(1), 1)
    };
    Quota::new(format!("\"{name}\";q={q};w={w}"), name, q)
}

impl Quota {
    fn new(item: String, name: &str, quota: u64) -> Self {
        Quota { policy: HeaderValue::from_str(&item).ok(), item, name: name.to_owned(), quota }
    }
}

static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Adds the rate-limit fields for `standings` in `style`; `quotas` holds each limit's
/// quotas (by window) by limit index. The legacy `X-RateLimit-*` fields can describe one limit only:
/// the one with the fewest requests remaining (then the longest reset); their reset is
/// in seconds from now, like the draft's `t`.
pub fn add_ratelimit_headers(
    headers: &mut HeaderMap,
    standings: &[Standing],
    quotas: &[Box<[Quota]>],
    style: HeaderStyle,
) {
    let Some(tightest) = standings.iter().min_by_key(|s| (s.remaining, std::cmp::Reverse(s.reset))) else {
        return;
    };
    let quota = |s: &Standing| &quotas[s.limit][s.window];
    if style != HeaderStyle::Legacy {
        let policy = match standings {
            [one] => quota(one).policy.clone(),
            _ => HeaderValue::try_from(standings.iter().map(|s| quota(s).item.as_str()).collect::<Vec<_>>().join(", "))
                .ok(),
        };
        let mut current = String::with_capacity(32 * standings.len());
        for s in standings {
            if !current.is_empty() {
                current.push_str(", ");
            }
            // Writing to a `String` cannot fail.
            let _ = write!(current, "\"{}\";r={};t={}", quota(s).name, s.remaining, ceil_secs(s.reset));
        }
        if let Some(policy) = policy {
            headers.insert(&RATELIMIT_POLICY, policy);
        }
        if let Ok(current) = HeaderValue::try_from(current) {
            headers.insert(&RATELIMIT, current);
        }
    }
    if style != HeaderStyle::Draft {
        headers.insert(&X_RATELIMIT_LIMIT, HeaderValue::from(quota(tightest).quota));
        headers.insert(&X_RATELIMIT_REMAINING, HeaderValue::from(tightest.remaining));
        headers.insert(&X_RATELIMIT_RESET, HeaderValue::from(ceil_secs(tightest.reset)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::units::parse_rate;
    use crate::limit::Outcome;
    use crate::limit::key::KeySpec;

    fn limit(name: &str, rate: &str) -> Limit {
        Limit {
            name: name.into(),
            key: KeySpec(Box::new([])),
            windows: vec![Policy::Rate { rate: parse_rate(rate).unwrap(), burst: 0, delay: 0 }],
            status: StatusCode::TOO_MANY_REQUESTS,
            max_keys: 1,
            dry_run: false,
            log_level: crate::config::LogLevel::Info,
            log_lines_per_second: 5,
            ban: None,
            allow: Default::default(),
            count: None,
            overrides: Vec::new(),
            scope: crate::config::Scope::Local,
        }
    }

    #[test]
    fn retry_after_rounds_up_and_is_never_zero() {
        let retry =
            |d| rejected(StatusCode::TOO_MANY_REQUESTS, d, RejectionBody::Text, &[]).headers()[RETRY_AFTER].clone();
        assert_eq!(retry(Duration::from_millis(1)), "1");
        assert_eq!(retry(Duration::from_millis(2001)), "3");
        assert_eq!(retry(Duration::from_secs(2)), "2");
    }

    #[test]
    fn policy_items_state_quota_and_window_in_seconds() {
        assert_eq!(quotas(&limit("a", "10r/s"))[0].item, "\"a\";q=10;w=1");
        assert_eq!(quotas(&limit("a", "100r/15m"))[0].item, "\"a\";q=100;w=900");
        assert_eq!(quotas(&limit("a", "10r/500ms"))[0].item, "\"a\";q=20;w=1");
        let mut two = limit("a", "10r/s");
        two.windows.push(Policy::Rate { rate: parse_rate("10000r/d").unwrap(), burst: 9999, delay: 9999 });
        let items: Vec<String> = quotas(&two).iter().map(|q| q.item.clone()).collect();
        assert_eq!(items, ["\"a/1s\";q=10;w=1", "\"a/1day\";q=10000;w=86400"]);
    }

    #[test]
    fn ratelimit_fields_list_every_standing() {
        let limits = [limit("a", "10r/s"), limit("b", "1r/m")];
        let quotas: Vec<Box<[Quota]>> = limits.iter().map(quotas).collect();
        let standings = [
            Standing {
                limit: 0,
                window: 0,
                outcome: Outcome::Passed,
                remaining: 2,
                reset: Duration::from_millis(300),
                excess: 0.0,
                banned: false,
            },
            Standing {
                limit: 1,
                window: 0,
                outcome: Outcome::Rejected(Duration::from_secs(1)),
                remaining: 0,
                reset: Duration::from_secs(59),
                excess: 1.5,
                banned: false,
            },
        ];
        let mut h = HeaderMap::new();
        add_ratelimit_headers(&mut h, &standings, &quotas, HeaderStyle::Draft);
        assert_eq!(h[&RATELIMIT_POLICY], "\"a\";q=10;w=1, \"b\";q=1;w=60");
        assert_eq!(h[&RATELIMIT], "\"a\";r=2;t=1, \"b\";r=0;t=59");
        assert!(!h.contains_key(&X_RATELIMIT_LIMIT));
        let mut h = HeaderMap::new();
        add_ratelimit_headers(&mut h, &standings, &quotas, HeaderStyle::Legacy);
        assert!(!h.contains_key(&RATELIMIT));
        assert_eq!(
            (&h[&X_RATELIMIT_LIMIT], &h[&X_RATELIMIT_REMAINING], &h[&X_RATELIMIT_RESET]),
            (
                &"1".parse::<HeaderValue>().unwrap(),
                &"0".parse::<HeaderValue>().unwrap(),
                &"59".parse::<HeaderValue>().unwrap()
            )
        );
    }

    #[test]
    fn problem_json_names_the_violated_limits() {
        let r = rejected(
            StatusCode::TOO_MANY_REQUESTS,
            Duration::from_millis(1500),
            RejectionBody::ProblemJson,
            &["a", "b"],
        );
        assert_eq!(r.headers()[CONTENT_TYPE], "application/problem+json");
        let Either::Right(full) = &r.body().inner else { panic!("not made here") };
        let body = format!("{full:?}");
        assert!(
            body.contains(r#"\"violated_limits\":[\"a\",\"b\"]"#) && body.contains(r#"\"retry_after\":2"#),
            "{body}"
        );
    }
}
