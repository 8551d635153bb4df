//! Responses made here rather than upstream: static routes, rejections, errors; and the
//! rate-limit header fields (draft-ietf-httpapi-ratelimit-headers) on any response.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};
use http_body_util::{Either, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};

use super::error::ProxyError;
use crate::config::{Limit, Policy, StaticResponse};
use crate::limit::{Permits, Standing};

/// A response body, streamed from the upstream or made here in full, carrying the
/// request's concurrency slots: they are given back when the body has been sent to the
/// end, or when hyper drops it because the client went away.
pub struct ProxyBody {
    inner: Either<Incoming, Full<Bytes>>,
    permits: Permits,
}

impl ProxyBody {
    pub fn streamed(body: Incoming) -> Self {
        ProxyBody { inner: Either::Left(body), permits: Permits::default() }
    }

    pub fn full(body: impl Into<Bytes>) -> Self {
        ProxyBody { inner: Either::Right(Full::new(body.into())), permits: Permits::default() }
    }

    pub fn holding(self, permits: Permits) -> Self {
        ProxyBody { permits, ..self }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            this.permits.release();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
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

pub fn error(e: &ProxyError) -> Response<ProxyBody> {
    let status = e.status();
    made_here(status, format!("{}\n", status.canonical_reason().unwrap_or("error")))
}

/// The rejection: `Retry-After` in whole seconds, rounded up and at least 1, so a client
/// that waits exactly that long is not rejected again for being early (RFC 9110 §10.2.3).
pub fn rejected(status: StatusCode, retry_after: Duration) -> Response<ProxyBody> {
    let mut response = made_here(status, format!("{}\n", status.canonical_reason().unwrap_or("rejected")));
    response.headers_mut().insert(RETRY_AFTER, HeaderValue::from(ceil_secs(retry_after).max(1)));
    response
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The quota policy item of a limit, e.g. `"per_ip";q=10;w=1`: the sustained rate as
/// quota per window, the window in whole seconds (a sub-second or fractional window is
/// scaled to one second). Built once per limit.
/// A concurrency limit has a quota and no window: `"uploads";q=4`.
pub fn policy_item(limit: &Limit) -> String {
    let (count, per) = match limit.policy {
        Policy::Rate { rate, .. } => (rate.count, rate.per),
        Policy::FixedWindow { limit, window } => (limit, window),
        Policy::Concurrency { max, .. } => return format!("\"{}\";q={max}", limit.name),
    };
    let (q, w) = if per.subsec_nanos() == 0 {
        (count, per.as_secs())
    } else {
        let per_second = u128::from(count) * 1_000_000_000 / per.as_nanos().max(1);
        (u64::try_from(per_second).unwrap_or(u64::MAX).max(1), 1)
    };
    format!("\"{}\";q={q};w={w}", limit.name)
}

/// Adds `RateLimit-Policy` and `RateLimit` for `standings`; `policies` holds each
/// limit's policy item by limit index.
pub fn add_ratelimit_headers(headers: &mut HeaderMap, standings: &[Standing], limits: &[Limit], policies: &[String]) {
    if standings.is_empty() {
        return;
    }
    let mut policy = String::new();
    let mut current = String::new();
    for s in standings {
        if !policy.is_empty() {
            policy.push_str(", ");
            current.push_str(", ");
        }
        policy.push_str(&policies[s.limit]);
        current.push_str(&format!("\"{}\";r={};t={}", limits[s.limit].name, s.remaining, ceil_secs(s.reset)));
    }
    for (name, value) in [(&RATELIMIT_POLICY, policy), (&RATELIMIT, current)] {
        if let Ok(value) = HeaderValue::try_from(value) {
            headers.insert(name, value);
        }
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
            policy: Policy::Rate { rate: parse_rate(rate).unwrap(), burst: 0, delay: 0 },
            status: StatusCode::TOO_MANY_REQUESTS,
            max_keys: 1,
            dry_run: false,
            log_level: crate::config::LogLevel::Info,
        }
    }

    #[test]
    fn retry_after_rounds_up_and_is_never_zero() {
        let r = rejected(StatusCode::TOO_MANY_REQUESTS, Duration::from_millis(1));
        assert_eq!(r.headers()[RETRY_AFTER], "1");
        let r = rejected(StatusCode::TOO_MANY_REQUESTS, Duration::from_millis(2001));
        assert_eq!(r.headers()[RETRY_AFTER], "3");
        let r = rejected(StatusCode::TOO_MANY_REQUESTS, Duration::from_secs(2));
        assert_eq!(r.headers()[RETRY_AFTER], "2");
    }

    #[test]
    fn policy_items_state_quota_and_window_in_seconds() {
        assert_eq!(policy_item(&limit("a", "10r/s")), "\"a\";q=10;w=1");
        assert_eq!(policy_item(&limit("a", "100r/15m")), "\"a\";q=100;w=900");
        assert_eq!(policy_item(&limit("a", "10r/500ms")), "\"a\";q=20;w=1");
    }

    #[test]
    fn ratelimit_fields_list_every_standing() {
        let limits = [limit("a", "10r/s"), limit("b", "1r/m")];
        let policies: Vec<String> = limits.iter().map(policy_item).collect();
        let standings = [
            Standing {
                limit: 0,
                outcome: Outcome::Passed,
                remaining: 2,
                reset: Duration::from_millis(300),
                excess: 0.0,
            },
            Standing {
                limit: 1,
                outcome: Outcome::Rejected(Duration::from_secs(1)),
                remaining: 0,
                reset: Duration::from_secs(59),
                excess: 1.5,
            },
        ];
        let mut h = HeaderMap::new();
        add_ratelimit_headers(&mut h, &standings, &limits, &policies);
        assert_eq!(h[&RATELIMIT_POLICY], "\"a\";q=10;w=1, \"b\";q=1;w=60");
        assert_eq!(h[&RATELIMIT], "\"a\";r=2;t=1, \"b\";r=0;t=59");
    }
}
