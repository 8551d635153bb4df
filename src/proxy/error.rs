//! Why a request could not be served, and the one mapping from that to a status.

use http::StatusCode;

use crate::front::FrontError;
use crate::grpc::Code;
use crate::upstream::{BodyFault, UpstreamError};

/// Each variant says who is at fault: the client (4xx) or the upstream (5xx).
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The steps in front of the limits refused it (a bad head, no route, a bad cost).
    #[error(transparent)]
    Front(#[from] FrontError),
    /// The request repeats a field that a limit of its route is keyed on: the limiter
    /// would count one value while the upstream may act on another.
    #[error("limit {limit:?} counts requests by {field}, which this request carries more than once; send it once")]
    DuplicateKeyField { limit: String, field: String },
    /// The request lacks the key of a limit with `on_missing_key: refuse`.
    #[error("limit {limit:?} counts requests by {key}, which this request lacks")]
    MissingKey { limit: String, key: String },
    /// The declared `Content-Length` is over the route's limit: refused unread.
    #[error("declared body of {length} bytes is larger than {limit}")]
    BodyTooLarge { length: u64, limit: u64 },
    /// The exchange with the upstream failed, or the client's body did on the way.
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
}

impl ProxyError {
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::Front(e) => e.status(),
            ProxyError::DuplicateKeyField { .. } | ProxyError::MissingKey { .. } => StatusCode::BAD_REQUEST,
            ProxyError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::Upstream(e) => match e {
                UpstreamError::ClientBody { .. } => StatusCode::BAD_REQUEST,
                UpstreamError::Body(BodyFault::TooLarge(_)) => StatusCode::PAYLOAD_TOO_LARGE,
                UpstreamError::Body(BodyFault::TooSlow(_)) => StatusCode::REQUEST_TIMEOUT,
                UpstreamError::NoServer { .. } | UpstreamError::Unreachable { .. } | UpstreamError::Failed { .. } => {
                    StatusCode::BAD_GATEWAY
                }
                UpstreamError::Full { .. } => StatusCode::SERVICE_UNAVAILABLE,
                UpstreamError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            },
        }
    }
}

impl ProxyError {
    /// The gRPC status a gRPC call gets for it (a table in docs/protocols.md, *gRPC*): the status's,
    /// but that an upstream that did not answer before the client's own deadline is
    /// `DEADLINE_EXCEEDED`, and a body over the route's limit `RESOURCE_EXHAUSTED`.
    pub fn grpc_code(&self) -> Code {
        match self {
            ProxyError::Upstream(UpstreamError::Timeout { deadline: true, .. }) => Code::DEADLINE_EXCEEDED,
            ProxyError::Upstream(UpstreamError::Timeout { deadline: false, .. }) => Code::UNAVAILABLE,
            e => Code::of_http(e.status().as_u16()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::uri::Authority;

    use super::*;

    #[test]
    fn each_error_maps_to_its_status() {
        assert_eq!(ProxyError::from(FrontError::NoRoute).status(), StatusCode::NOT_FOUND);
        assert_eq!(ProxyError::from(FrontError::Connect).status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(ProxyError::from(FrontError::UriTooLong { bytes: 2, max: 1 }).status(), StatusCode::URI_TOO_LONG);
        let headers = ProxyError::from(FrontError::HeadersTooLarge { bytes: 2, max: 1 });
        assert_eq!(headers.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
        let server = Authority::from_static("127.0.0.1:80");
        let timeout =
            UpstreamError::Timeout { upstream: "u".into(), server, timeout: Duration::from_secs(1), deadline: false };
        assert_eq!(ProxyError::from(timeout).status(), StatusCode::GATEWAY_TIMEOUT);
        let none = UpstreamError::NoServer { upstream: "u".into() };
        assert_eq!(ProxyError::from(none).status(), StatusCode::BAD_GATEWAY);
        let full = UpstreamError::Full { upstream: "u".into(), max_conns: 1, waited: Duration::from_secs(1) };
        assert_eq!(ProxyError::from(full).status(), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn each_error_maps_to_its_grpc_status() {
        let server = Authority::from_static("127.0.0.1:80");
        let timeout = |deadline| UpstreamError::Timeout {
            upstream: "u".into(),
            server: server.clone(),
            timeout: Duration::from_secs(1),
            deadline,
        };
        assert_eq!(ProxyError::from(timeout(true)).grpc_code(), Code::DEADLINE_EXCEEDED);
        assert_eq!(ProxyError::from(timeout(false)).grpc_code(), Code::UNAVAILABLE);
        assert_eq!(ProxyError::from(FrontError::NoRoute).grpc_code(), Code::UNIMPLEMENTED);
        let token = FrontError::InvalidToken { limit: "l".into(), error: crate::jwt::TokenError::Expired };
        assert_eq!(ProxyError::from(token.clone()).status(), StatusCode::UNAUTHORIZED);
        assert_eq!(ProxyError::from(token).grpc_code(), Code::UNAUTHENTICATED);
        let none = UpstreamError::NoServer { upstream: "u".into() };
        assert_eq!(ProxyError::from(none).grpc_code(), Code::UNAVAILABLE);
        let large = ProxyError::BodyTooLarge { length: 2, limit: 1 };
        assert_eq!(large.grpc_code(), Code::RESOURCE_EXHAUSTED);
        assert_eq!(ProxyError::from(UpstreamError::Body(BodyFault::TooLarge(1))).grpc_code(), Code::RESOURCE_EXHAUSTED);
    }
}
