//! Why a request could not be served, and the one mapping from that to a status.

use http::StatusCode;

use crate::admission::Refused;
use crate::front::FrontError;
use crate::grpc::Code;
use crate::upstream::{BodyFault, UpstreamError};

/// Each variant says who is at fault: the client (4xx) or the upstream (5xx).
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The admission refused it before any limit decided (a bad head, no route, a
    /// body too large, a bad key or cost).
    #[error(transparent)]
    Refused(#[from] Refused),
    /// The exchange with the upstream failed, or the client's body did on the way.
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
}

impl From<FrontError> for ProxyError {
    fn from(e: FrontError) -> Self {
        ProxyError::Refused(e.into())
    }
}

impl ProxyError {
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::Refused(e) => e.status(),
            ProxyError::Upstream(e) => match e {
                UpstreamError::ClientBody { .. } | UpstreamError::Body(BodyFault::Repeated) => StatusCode::BAD_REQUEST,
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
            ProxyError::Refused(e) => e.grpc_code(),
            // A request the client got wrong (its body broke off) is its fault: what
            // gRPC clients expect of that, not the `INTERNAL` HTTP's 400 maps to.
            e if e.status() == StatusCode::BAD_REQUEST => Code::INVALID_ARGUMENT,
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
        let route = crate::ids::RouteId::from(0);
        let token = FrontError::InvalidToken { limit: "l".into(), route, error: crate::jwt::TokenError::Expired };
        assert_eq!(ProxyError::from(token.clone()).status(), StatusCode::UNAUTHORIZED);
        assert_eq!(ProxyError::from(token).grpc_code(), Code::UNAUTHENTICATED);
        let none = UpstreamError::NoServer { upstream: "u".into() };
        assert_eq!(ProxyError::from(none).grpc_code(), Code::UNAVAILABLE);
        let large = ProxyError::from(Refused::BodyTooLarge { length: 2, limit: 1 });
        assert_eq!(large.grpc_code(), Code::RESOURCE_EXHAUSTED);
        let id = crate::ids::LimitId::from(0);
        let missing = |token| Refused::MissingKey { limit: "l".into(), key: "k".into(), id, token };
        assert_eq!(ProxyError::from(missing(true)).grpc_code(), Code::UNAUTHENTICATED, "a request without its token");
        assert_eq!(ProxyError::from(missing(false)).grpc_code(), Code::INVALID_ARGUMENT, "not INTERNAL");
        assert_eq!(ProxyError::from(FrontError::BadHost("x")).grpc_code(), Code::INVALID_ARGUMENT);
        assert_eq!(ProxyError::from(UpstreamError::Body(BodyFault::TooLarge(1))).grpc_code(), Code::RESOURCE_EXHAUSTED);
    }
}
