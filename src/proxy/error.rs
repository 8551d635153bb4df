//! Why a request could not be served, and the one mapping from that to a status.

use std::time::Duration;

use http::StatusCode;
use http::uri::Authority;

use super::body::BodyFault;
use crate::front::FrontError;

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
    /// The request body broke the route's size limit or `server.body_read_timeout`
    /// before the upstream answered.
    #[error("{0}")]
    Body(super::body::BodyFault),
    /// The declared `Content-Length` is over the route's limit: refused unread.
    #[error("declared body of {length} bytes is larger than {limit}")]
    BodyTooLarge { length: u64, limit: u64 },
    /// The client's request body broke off or was malformed (a bad chunk size, fewer
    /// bytes than its `Content-Length`) while it was being forwarded.
    #[error("the client's request body is malformed or incomplete: {source}")]
    ClientBody { source: super::pool::SendError },
    /// No server of the upstream is in use: each failed lately (passive health).
    #[error("upstream {upstream}: all servers are out after failures")]
    NoServer { upstream: String },
    /// The server refused the connection or could not be reached in time.
    #[error("upstream {upstream} server {server} unreachable: {}", causes(.source))]
    UpstreamUnreachable { upstream: String, server: Authority, source: super::pool::SendError },
    /// The connection was made but the exchange failed (reset, malformed response).
    #[error("upstream {upstream} server {server} failed: {}", causes(.source))]
    UpstreamFailed { upstream: String, server: Authority, source: super::pool::SendError },
    /// No response headers within the upstream's `timeout`.
    #[error("upstream {upstream} server {server} sent no response within {timeout:?}")]
    UpstreamTimeout { upstream: String, server: Authority, timeout: Duration },
}

/// An error and its causes, `a: b: c`: hyper's errors say "client error (Connect)" and
/// keep what went wrong (refused, a certificate not trusted) in their sources.
fn causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

impl ProxyError {
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::Front(e) => e.status(),
            ProxyError::ClientBody { .. } | ProxyError::DuplicateKeyField { .. } => StatusCode::BAD_REQUEST,
            ProxyError::BodyTooLarge { .. } | ProxyError::Body(BodyFault::TooLarge(_)) => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::Body(BodyFault::TooSlow(_)) => StatusCode::REQUEST_TIMEOUT,
            ProxyError::NoServer { .. }
            | ProxyError::UpstreamUnreachable { .. }
            | ProxyError::UpstreamFailed { .. } => StatusCode::BAD_GATEWAY,
            ProxyError::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_maps_to_its_status() {
        assert_eq!(ProxyError::from(FrontError::NoRoute).status(), StatusCode::NOT_FOUND);
        assert_eq!(ProxyError::from(FrontError::Connect).status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(ProxyError::from(FrontError::UriTooLong { bytes: 2, max: 1 }).status(), StatusCode::URI_TOO_LONG);
        let headers = ProxyError::from(FrontError::HeadersTooLarge { bytes: 2, max: 1 });
        assert_eq!(headers.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
        let server = Authority::from_static("127.0.0.1:80");
        let timeout = ProxyError::UpstreamTimeout { upstream: "u".into(), server, timeout: Duration::from_secs(1) };
        assert_eq!(timeout.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(ProxyError::NoServer { upstream: "u".into() }.status(), StatusCode::BAD_GATEWAY);
    }
}
