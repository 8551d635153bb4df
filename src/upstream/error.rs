//! Why an upstream exchange failed: the one error a request's forwarding ends in
//! (`UpstreamError`), and what one attempt on a connection ended in (`SendError`).

use std::time::Duration;

use http::uri::Authority;

use super::body::BodyFault;

use crate::wire::http1::BodyError;
use crate::wire::http1::client::ExchangeError;

/// Each variant says who is at fault: the client (its body) or the upstream.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The request body broke the route's size limit or `server.body_read_timeout`
    /// before the upstream answered.
    #[error("{0}")]
    Body(BodyFault),
    /// The client's request body broke off or was malformed (a bad chunk size, fewer
    /// bytes than its `Content-Length`) while it was being forwarded.
    #[error("the client's request body is malformed or incomplete: {source}")]
    ClientBody { source: BodyError },
    /// No server of the upstream is in use: each failed lately (passive health).
    #[error("upstream {upstream}: all servers are out after failures")]
    NoServer { upstream: String },
    /// The server refused the connection or could not be reached in time.
    #[error("upstream {upstream} server {server} unreachable: {}", causes(.source))]
    Unreachable { upstream: String, server: Authority, source: SendError },
    /// The connection was made but the exchange failed (reset, malformed response).
    #[error("upstream {upstream} server {server} failed: {}", causes(.source))]
    Failed { upstream: String, server: Authority, source: SendError },
    /// Every server the request could go to had `max_conns` requests in progress, for
    /// all of `queue_timeout`.
    #[error("upstream {upstream}: every server has max_conns ({max_conns}) requests in progress; waited {waited:?}")]
    Full { upstream: String, max_conns: usize, waited: Duration },
    /// No response headers within the upstream's `timeout` (of the request body's last
    /// piece), or before the client's own deadline (`deadline`: a gRPC call's
    /// `grpc-timeout`) passed.
    #[error("upstream {upstream} server {server} sent no response within {timeout:?}{}", if *.deadline { " (the client's deadline)" } else { "" })]
    Timeout { upstream: String, server: Authority, timeout: Duration, deadline: bool },
}

impl UpstreamError {
    /// The client's own fault (its body), not the upstream's.
    pub fn is_client_error(&self) -> bool {
        matches!(self, UpstreamError::Body(_) | UpstreamError::ClientBody { .. })
    }
}

/// An error and its causes, `a: b: c`: hyper's errors say "client error (Connect)" and
/// keep what went wrong (refused, a certificate not trusted) in their sources.
pub fn causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// Why an attempt got no response.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No connection could be made (refused, unreachable, TLS handshake failed): nothing
    /// was sent.
    #[error("cannot connect")]
    Connect(#[source] std::io::Error),
    /// The exchange on an HTTP/1 connection failed.
    #[error("exchange failed")]
    Exchange(#[source] ExchangeError),
    /// The exchange on an HTTP/2 connection failed.
    #[error("exchange failed")]
    H2(#[source] hyper::Error),
}
