//! Sending a request to its upstream: a pooled keep-alive HTTP/1.1 client per upstream,
//! servers taken in turn, bodies streamed both ways, headers prepared for the next hop.

use std::error::Error as _;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderValue, Request, Response, StatusCode, Uri, header};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::body::{FaultCell, RequestBody};
use super::error::ProxyError;
use super::headers::{keep_upgrade, remove_hop_by_hop, set_forwarded};
use crate::config::{ForwardedMode, Upstream};

/// Idle keep-alive connections to an upstream are closed after this long.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

pub struct UpstreamClient {
    name: String,
    servers: Box<[Authority]>,
    next: AtomicUsize,
    timeout: Duration,
    client: Client<HttpConnector, RequestBody>,
}

/// The hop that forwards: who sent the request to us and whether we trust it.
pub struct Hop {
    pub peer: IpAddr,
    pub trusted_peer: bool,
    /// The client connection is TLS.
    pub tls: bool,
    /// Which forwarding fields the upstream gets.
    pub forwarded: ForwardedMode,
    /// The protocol the client asks to switch to (`Upgrade`), carried to the upstream.
    pub upgrade: Option<HeaderValue>,
}

impl UpstreamClient {
    pub fn new(upstream: &Upstream) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(upstream.connect_timeout));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .http1_max_buf_size(crate::server::BUFFER_BYTES)
            .build(connector);
        UpstreamClient {
            name: upstream.name.clone(),
            servers: upstream.servers.clone().into(),
            next: AtomicUsize::new(0),
            timeout: upstream.timeout,
            client,
        }
    }

    /// Forwards `req` to the next server and returns its response, body still streaming.
    /// A request body cut on the way (`fault`) is answered with its own status.
    pub async fn forward(
        &self,
        req: Request<RequestBody>,
        hop: Hop,
        fault: &FaultCell,
    ) -> Result<Response<Incoming>, ProxyError> {
        let server = &self.servers[self.next.fetch_add(1, Ordering::Relaxed) % self.servers.len()];
        let upgrading = hop.upgrade.is_some();
        let req = prepare_upstream_request(req, server, hop);
        let response = tokio::time::timeout(self.timeout, self.client.request(req)).await;
        let mut response = match response {
            Err(_) => {
                return Err(ProxyError::UpstreamTimeout { upstream: self.name.clone(), timeout: self.timeout });
            }
            Ok(Err(_)) if let Some(&fault) = fault.get() => return Err(ProxyError::Body(fault)),
            Ok(Err(source)) if source.is_connect() => {
                return Err(ProxyError::UpstreamUnreachable { upstream: self.name.clone(), source });
            }
            Ok(Err(source)) if client_body_failed(&source) => return Err(ProxyError::ClientBody { source }),
            Ok(Err(source)) => {
                return Err(ProxyError::UpstreamFailed { upstream: self.name.clone(), source });
            }
            Ok(Ok(response)) => response,
        };
        let switched = response.headers().get(header::UPGRADE).cloned();
        remove_hop_by_hop(response.headers_mut());
        if let Some(protocol) = switched.filter(|_| upgrading && response.status() == StatusCode::SWITCHING_PROTOCOLS) {
            keep_upgrade(response.headers_mut(), protocol);
            return Ok(response);
        }
        // The client connection speaks HTTP/1.1 whatever the upstream spoke: hyper would
        // otherwise answer `HTTP/1.0` and close the client's keep-alive connection. A body
        // of unknown length (an HTTP/1.0 upstream reading to EOF) is then sent chunked.
        *response.version_mut() = http::Version::HTTP_11;
        Ok(response)
    }
}

/// Whether the exchange failed because the body being streamed from the client failed:
/// hyper reports an error of the body it was sending as a "user" error whose cause is
/// that body's own error, here the client connection's `hyper::Error`.
fn client_body_failed(error: &hyper_util::client::legacy::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = cause {
        if let Some(h) = e.downcast_ref::<hyper::Error>()
            && h.is_user()
            && h.source().is_some_and(|s| s.is::<hyper::Error>())
        {
            return true;
        }
        cause = e.source();
    }
    false
}

/// Rewrites a client request for `server`: origin-form target, the client's `Host`
/// kept (HTTP/2 clients send `:authority` instead, which becomes `Host`), hop-by-hop
/// fields removed and `X-Forwarded-*` set.
fn prepare_upstream_request(req: Request<RequestBody>, server: &Authority, hop: Hop) -> Request<RequestBody> {
    let (mut parts, body) = req.into_parts();
    if !parts.headers.contains_key(header::HOST)
        && let Some(value) = parts.uri.authority().and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    {
        parts.headers.insert(header::HOST, value);
    }
    let mut uri = Uri::builder().scheme(Scheme::HTTP).authority(server.clone());
    uri = uri.path_and_query(parts.uri.path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/")));
    // Scheme, authority and an origin-form path always build a valid URI.
    parts.uri = uri.build().unwrap_or_default();
    parts.version = http::Version::HTTP_11;
    remove_hop_by_hop(&mut parts.headers);
    if let Some(protocol) = hop.upgrade {
        keep_upgrade(&mut parts.headers, protocol);
    }
    set_forwarded(&mut parts.headers, hop.peer, hop.trusted_peer, hop.tls, hop.forwarded);
    Request::from_parts(parts, body)
}
