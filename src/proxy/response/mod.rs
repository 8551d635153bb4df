//! Responses made here rather than upstream: static routes, rejections, errors; and
//! the rate-limit header fields (draft-ietf-httpapi-ratelimit-headers) on any response
//! (`ratelimit`).

mod ratelimit;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::StatusCode;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER};

use super::body::{Response, Settling};
use super::error::ProxyError;
use typed_index_collections::TiSlice;

use crate::admission::Refused;
use crate::admission::hold::Hold;
use crate::config::{
    BodyPiece, Config, Expires, HeaderMode, LimitHeaders, LimitId, LimitResponse, RejectionBody, StaticResponse,
};
use crate::front::FrontError;
use crate::gate::Decision;
use crate::grpc::{self, Code};
use crate::limit::Shown;
use crate::variables;
use crate::wire::message::{FieldValue, ResponseFields};
pub use ratelimit::{Annotation, Quota, add_ratelimit_headers, all_quotas, annotating_quotas};

/// A response made here: `status`, its `content_type`, `body`.
fn made_here(status: StatusCode, content_type: HeaderValue, body: impl Into<Bytes>) -> Response {
    // Room for a rejection's fields, made once: its content type, `Retry-After` and the
    // five rate-limit fields of `ratelimit_header_style: both`.
    let mut extra = Vec::with_capacity(8);
    extra.push((CONTENT_TYPE, FieldValue::Given(content_type)));
    Response::made(status, extra, body)
}

const TEXT: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");

pub fn static_response(r: &StaticResponse, vars: &variables::Request<'_>) -> Response {
    let mut fields = r.headers.clone();
    for (name, value) in &r.made {
        fields.append(name, value.header_value(vars));
    }
    Response {
        status: r.status,
        fields: ResponseFields::Map(fields),
        extra: vec![],
        body: Settling::from(r.body.clone()),
    }
}

/// `Expires` and `Cache-Control` for a response of `status` (nginx's `expires`, which
/// sets them on 200, 201, 204, 206, 301, 302, 303, 304, 307 and 308 only).
pub fn expires(expires: Expires, status: StatusCode) -> impl Iterator<Item = (HeaderName, HeaderValue)> {
    const CACHED: [u16; 10] = [200, 201, 204, 206, 301, 302, 303, 304, 307, 308];
    let (at, cache_control) = match expires {
        Expires::After(ttl) => (SystemTime::now() + ttl, format!("max-age={}", ttl.as_secs())),
        Expires::Epoch => (UNIX_EPOCH + Duration::from_secs(1), "no-cache".to_owned()),
        // nginx's `max`: Thu, 31 Dec 2037 23:55:55 GMT, and ten years.
        Expires::Max => (UNIX_EPOCH + Duration::from_secs(2_145_916_555), "max-age=315360000".to_owned()),
    };
    // An HTTP date and `max-age=N` or `no-cache` are valid field values.
    let date = HeaderValue::try_from(httpdate::fmt_http_date(at)).unwrap_or_else(|_| HeaderValue::from_static(""));
    let cache_control = HeaderValue::try_from(cache_control).unwrap_or_else(|_| HeaderValue::from_static("no-cache"));
    let fields = [(http::header::EXPIRES, date), (http::header::CACHE_CONTROL, cache_control)];
    fields.into_iter().filter(move |_| CACHED.contains(&status.as_u16()))
}

/// The answer to a failed request: the reason phrase, and for the client's own faults
/// what was wrong (an upstream's failure is logged, not shown); to a gRPC call (`grpc`),
/// as a gRPC response.
pub fn error(e: &ProxyError, grpc: bool) -> Response {
    let status = e.status();
    let reason = status.canonical_reason().unwrap_or("error");
    let body = if status.is_client_error() { format!("{reason}: {e}\n") } else { format!("{reason}\n") };
    let mut response = made_here(status, TEXT, body);
    if let ProxyError::Refused(Refused::Front(FrontError::InvalidToken { .. })) = e {
        // RFC 6750 §3: the challenge a refused bearer token gets.
        response.set(http::header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer error=\"invalid_token\""));
    }
    match grpc {
        true => self::grpc(response, e.grpc_code(), None),
        false => response,
    }
}

/// The answer to a request whose key its route holds (`upstream_hold`): the upstream's
/// status, with the time left as `Retry-After`.
pub fn held(held: &Hold, left: Duration, body: RejectionBody, grpc: bool) -> Response {
    let answer = rejected(held.status, left, body, &[]);
    match grpc {
        true => self::grpc(answer, Code::of_http(held.status.as_u16()), Some(left)),
        false => answer,
    }
}

/// The rejection: `Retry-After` in whole seconds, rounded up and at least 1, so a client
/// that waits exactly that long is not rejected again for being early (RFC 9110 §10.2.3).
/// The body is a line of text, or with `RejectionBody::ProblemJson` a problem details
/// object (RFC 9457) naming the `violated` limits.
pub fn rejected(status: StatusCode, retry_after: Duration, body: RejectionBody, violated: &[&str]) -> Response {
    let title = status.canonical_reason().unwrap_or("Rejected");
    let retry_after = ceil_secs(retry_after).max(1);
    let mut response = match body {
        // The default status's body is a constant: no formatting, no allocation, for
        // what a flood of rejections answers over and over.
        RejectionBody::Text if status == StatusCode::TOO_MANY_REQUESTS => {
            made_here(status, TEXT, Bytes::from_static(b"Too Many Requests\n"))
        }
        RejectionBody::Text => made_here(status, TEXT, format!("{title}\n")),
        RejectionBody::ProblemJson => {
            // Limit names are letters, digits, '_', '-' and '.': nothing to escape.
            let names = violated.iter().map(|n| format!("\"{n}\"")).collect::<Vec<_>>().join(",");
            let json = format!(
                "{{\"type\":\"about:blank\",\"title\":\"{title}\",\"status\":{},\"detail\":\"Request rate limit exceeded; retry after {retry_after} s.\",\"violated_limits\":[{names}],\"retry_after\":{retry_after}}}\n",
                status.as_u16()
            );
            made_here(status, HeaderValue::from_static("application/problem+json"), json)
        }
    };
    // New to it: a response made here has its content type only.
    response.extra.push((RETRY_AFTER, FieldValue::number(retry_after)));
    response
}

/// The refusal a limit gives of its own (`response:`): `status`, its body with the limit's
/// `name` and the seconds of `Retry-After` written in, its content type and fields.
fn own_refusal(own: &LimitResponse, name: &str, status: StatusCode, retry_after: Duration) -> Response {
    let seconds = ceil_secs(retry_after).max(1);
    let mut body = String::new();
    for piece in &own.body {
        match piece {
            BodyPiece::Text(text) => body.push_str(text),
            BodyPiece::Limit => body.push_str(name),
            BodyPiece::RetryAfter => body.push_str(itoa::Buffer::new().format(seconds)),
        }
    }
    let mut response = made_here(status, own.content_type.clone(), body);
    for (field, value) in &own.headers {
        response.set(field.clone(), value.clone());
    }
    response.set(RETRY_AFTER, FieldValue::number(seconds));
    response
}

/// The answer to a request its limits refused (`None`: `decision` passed it), as the
/// client gets it, a gRPC call's as a gRPC response: the rejecting limit's status with
/// `Retry-After`, the body `rejection_body` says, and the rate-limit fields of every
/// limit that decided (`quotas`, by limit); or, when Redis could not decide a global
/// limit with `on_store_error: deny`, a 503 (gRPC `UNAVAILABLE`) naming no limit.
pub fn refusal(
    config: &Config,
    quotas: &TiSlice<LimitId, Box<[Quota]>>,
    decision: &Decision,
    grpc: bool,
) -> Option<Response> {
    let Decision::Reject { limit, status, retry_after, results, standings, store_error } = decision else {
        return None;
    };
    if store_error.is_some() {
        let response = rejected(*status, *retry_after, config.rejection_body, &[]);
        return Some(match grpc {
            true => self::grpc(response, Code::UNAVAILABLE, Some(*retry_after)),
            false => response,
        });
    }
    let refusing = &config.limits[*limit];
    // A limit clients do not see refuses with `Retry-After` alone: no rate-limit field, no
    // limit named.
    let hidden = refusing.headers == LimitHeaders::Hidden;
    // Named in a problem details body only.
    let named = config.rejection_body == RejectionBody::ProblemJson && !hidden;
    let violated: smallvec::SmallVec<[&str; 2]> = results
        .iter()
        .filter(|_| named)
        .map(|r| &config.limits[r.limit])
        .zip(results.iter())
        .filter(|(limit, r)| r.outcome.is_rejected() && limit.refuses() && limit.headers == LimitHeaders::Shown)
        .map(|(limit, _)| limit.name.as_str())
        .collect();
    let mut response = match &refusing.response {
        Some(own) => own_refusal(own, &refusing.name, *status, *retry_after),
        None => rejected(*status, *retry_after, config.rejection_body, &violated),
    };
    if config.ratelimit_headers != HeaderMode::None && !hidden {
        // The default rejection has its content type and `Retry-After` only: the
        // rate-limit fields are new to it, and need not be looked for.
        let own = refusing.response.is_some();
        add_ratelimit_headers(
            &mut |name, value| match own {
                true => response.set(name, value),
                false => response.extra.push((name, value)),
            },
            standings.iter().map(Shown::from),
            quotas,
            config.ratelimit_header_style,
        );
    }
    Some(match grpc {
        true => self::grpc(response, config.limits[*limit].grpc_status, Some(*retry_after)),
        false => response,
    })
}

/// `response`, made here, as the answer to a gRPC call (docs/protocols.md, *gRPC*): HTTP 200,
/// `content-type: application/grpc`, no body, its status as a trailers-only response
/// (`grpc-status` `code`, `grpc-message` the text it would have had), so that a gRPC
/// client reads `code` rather than its own mapping of an HTTP status (a 429 is
/// `UNAVAILABLE` to it, "retry at once"). Its other fields stay (`Retry-After`, the
/// rate-limit fields), and `retry_after` goes as `grpc-retry-pushback-ms` too, which
/// gRPC's retry policy honours.
pub fn grpc(mut response: Response, code: Code, retry_after: Option<Duration>) -> Response {
    let text = match response.body.made() {
        Some(text) if response.extra.iter().any(|(n, v)| n == CONTENT_TYPE && v.as_bytes().starts_with(b"text/")) => {
            String::from_utf8_lossy(text).trim_end().to_owned()
        }
        _ => response.status.canonical_reason().unwrap_or("error").to_owned(),
    };
    response.status = StatusCode::OK;
    response.body.set_made(Bytes::new());
    response.set(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    response.set(GRPC_STATUS, FieldValue::number(u64::from(code.0)));
    response.set(GRPC_MESSAGE, FieldValue::Long(grpc::message(&text).into_bytes()));
    if let Some(wait) = retry_after {
        let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        response.set(GRPC_RETRY_PUSHBACK_MS, FieldValue::number(ms));
    }
    response
}

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

pub(super) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(r: &Response, name: &http::HeaderName) -> FieldValue {
        r.extra.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone()).unwrap()
    }

    #[test]
    fn retry_after_rounds_up_and_is_never_zero() {
        let retry = |d| field(&rejected(StatusCode::TOO_MANY_REQUESTS, d, RejectionBody::Text, &[]), &RETRY_AFTER);
        assert_eq!(retry(Duration::from_millis(1)), "1");
        assert_eq!(retry(Duration::from_millis(2001)), "3");
        assert_eq!(retry(Duration::from_secs(2)), "2");
    }

    #[test]
    fn a_grpc_rejection_is_a_trailers_only_resource_exhausted_with_the_pushback() {
        let r = rejected(StatusCode::TOO_MANY_REQUESTS, Duration::from_millis(1500), RejectionBody::Text, &[]);
        let r = grpc(r, Code::RESOURCE_EXHAUSTED, Some(Duration::from_millis(1500)));
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(field(&r, &CONTENT_TYPE), "application/grpc");
        assert_eq!(field(&r, &GRPC_STATUS), "8");
        assert_eq!(field(&r, &GRPC_MESSAGE), "Too Many Requests");
        assert_eq!(field(&r, &GRPC_RETRY_PUSHBACK_MS), "1500");
        assert_eq!(field(&r, &RETRY_AFTER), "2");
        assert!(r.body.made().is_some_and(Bytes::is_empty));
    }

    #[test]
    fn problem_json_names_the_violated_limits() {
        let r = rejected(
            StatusCode::TOO_MANY_REQUESTS,
            Duration::from_millis(1500),
            RejectionBody::ProblemJson,
            &["a", "b"],
        );
        assert_eq!(field(&r, &CONTENT_TYPE), "application/problem+json");
        let body = r.body.made().expect("made here");
        let body = String::from_utf8_lossy(body);
        assert!(body.contains(r#""violated_limits":["a","b"]"#) && body.contains(r#""retry_after":2"#), "{body}");
    }
}
