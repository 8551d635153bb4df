//! Sending a request to its upstream: keep-alive connections per server (`pool`), the
//! server chosen by `upstream`, a request that could not be sent tried on the next
//! server (`retry`), bodies streamed both ways, headers prepared for the next hop.

use std::error::Error as _;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderValue, Request, Response, StatusCode, Uri, header};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use smallvec::SmallVec;
use tracing::warn;

use super::body::{FaultCell, RequestBody};
use super::connect::Connector;
use super::error::{SendError, UpstreamError};
use super::health::{self, Checker};
use super::pool::{BUFFER_BYTES, Checkout, Pool};
use super::resolve;
use super::retry::Replayable;
use super::servers::{InFlight, ServerSet};
use crate::config::{ForwardedMode, Upstream, UpstreamHost};
use crate::hop::{keep_upgrade, remove_hop_by_hop, set_forwarded};
use crate::metrics::ResolveMetrics;

pub struct UpstreamClient {
    servers: Arc<ServerSet>,
    timeout: Duration,
    retries: u32,
    pool: Pool,
    /// The servers speak HTTP/2 (requests carry scheme and authority, not `Host` alone).
    http2: bool,
    /// The active health check, stopped with this client.
    _checker: Option<Checker>,
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

/// A response body from a server, which counts the request as in progress there until
/// the body is dropped, and gives its HTTP/1 connection back to the pool once read to
/// the end (dropped before, the connection closes: it still carries the rest).
pub struct UpstreamBody {
    body: Incoming,
    checkout: Option<Checkout>,
    /// The last frame has been read.
    ended: bool,
    _in_flight: InFlight,
}

impl UpstreamClient {
    pub fn new(upstream: &Upstream, resolve_metrics: ResolveMetrics) -> Self {
        if !upstream.tls.verify {
            warn!(upstream = %upstream.name, "TLS certificates of the servers are NOT verified (tls.verify: false): for tests only, never in production");
        }
        let servers = ServerSet::new(upstream, resolve_metrics);
        if servers.has_names()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(resolve::keep_resolved(Arc::downgrade(&servers), resolve::System, upstream.resolve_interval));
        }
        let connector = Connector::new(upstream, servers.tls_names());
        let pool = Pool::new(connector.clone(), upstream.http2, BUFFER_BYTES);
        let checker =
            upstream.health_check.as_ref().and_then(|c| health::start(&servers, c, connector, upstream.http2));
        UpstreamClient {
            servers,
            timeout: upstream.timeout,
            retries: upstream.retries,
            pool,
            http2: upstream.http2,
            _checker: checker,
        }
    }

    pub fn servers(&self) -> &ServerSet {
        &self.servers
    }

    /// Forwards `req` to a server and returns its response, body still streaming. A
    /// request that could not be sent goes to another server, at most `retries` times;
    /// `balance_key` is what `hash` balancing goes by; `host` the `Host` it carries. A
    /// request body cut on the way (`fault`) is answered with its own status.
    pub async fn forward(
        &self,
        req: Request<RequestBody>,
        hop: Hop,
        fault: &FaultCell,
        balance_key: Option<u64>,
        host: &UpstreamHost,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        let upstream = self.servers.upstream();
        let upgrading = hop.upgrade.is_some();
        let (mut parts, body) = prepare_upstream_request(req, hop).into_parts();
        let body = Replayable::new(body);
        let idempotent = parts.method.is_idempotent();
        let mut tried: SmallVec<[usize; 4]> = SmallVec::new();
        let mut failed = None;
        self.servers.ready().await;
        loop {
            let Some(server) = self.servers.pick(balance_key, &tried, Instant::now()) else {
                // After a failure that could be retried, the others are out or tried:
                // that failure is the answer.
                return Err(failed.unwrap_or_else(|| {
                    warn!(upstream, servers = %self.servers.addresses(), "all servers of the upstream are out");
                    UpstreamError::NoServer { upstream: upstream.to_owned() }
                }));
            };
            tried.push(server.id());
            // No further attempt when retries are spent or every server has had its turn.
            let last = tried.len() > self.retries as usize || tried.len() == self.servers.len();
            parts.uri = upstream_uri(&parts.uri, server.address(), server.tls(), self.http2);
            match host {
                // HTTP/1 needs a `Host`; a client's HTTP/1.0 request may come without.
                UpstreamHost::Keep if self.http2 || parts.headers.contains_key(header::HOST) => {}
                UpstreamHost::Name(name) => _ = parts.headers.insert(header::HOST, name.clone()),
                UpstreamHost::Keep | UpstreamHost::Server => {
                    // An authority is always a valid field value.
                    if let Ok(value) = HeaderValue::from_str(server.host().as_str()) {
                        parts.headers.insert(header::HOST, value);
                    }
                }
            }
            // The parts stay for a further attempt; the last one takes them.
            let req = if last {
                Request::from_parts(std::mem::replace(&mut parts, Request::new(()).into_parts().0), body.attempt())
            } else {
                let mut req = Request::new(body.attempt());
                *req.method_mut() = parts.method.clone();
                *req.uri_mut() = parts.uri.clone();
                *req.version_mut() = parts.version;
                *req.headers_mut() = parts.headers.clone();
                req
            };
            let sent = tokio::time::timeout(self.timeout, self.pool.send(server.address(), server.tls(), req)).await;
            let address = server.address().clone();
            let error = match sent {
                Ok(Ok((mut response, checkout))) => {
                    server.succeeded(upstream);
                    let switched = response.headers().get(header::UPGRADE).cloned();
                    remove_hop_by_hop(response.headers_mut());
                    let switching = upgrading && response.status() == StatusCode::SWITCHING_PROTOCOLS;
                    if let Some(protocol) = switched.filter(|_| switching) {
                        keep_upgrade(response.headers_mut(), protocol);
                        // The connection becomes the tunnel: never back in the pool.
                        let body = |body| UpstreamBody { body, checkout: None, ended: false, _in_flight: server };
                        return Ok(response.map(body));
                    }
                    // The client connection speaks HTTP/1.1 whatever the upstream spoke:
                    // hyper would otherwise answer `HTTP/1.0` and close the client's
                    // keep-alive connection. A body of unknown length (an HTTP/1.0
                    // upstream reading to EOF) is then sent chunked.
                    *response.version_mut() = http::Version::HTTP_11;
                    return Ok(response.map(|body| UpstreamBody { body, checkout, ended: false, _in_flight: server }));
                }
                Err(_) => {
                    server.failed(upstream, Instant::now());
                    // The request was sent and may be in progress there: not retried.
                    return Err(UpstreamError::Timeout {
                        upstream: upstream.to_owned(),
                        server: address,
                        timeout: self.timeout,
                    });
                }
                // The client's fault says nothing of the server's health, and a body
                // that failed cannot be sent again.
                Ok(Err(_)) if let Some(&fault) = fault.get() => return Err(UpstreamError::Body(fault)),
                Ok(Err(source)) if client_body_failed(&source) => return Err(UpstreamError::ClientBody { source }),
                Ok(Err(error)) => error,
            };
            server.failed(upstream, Instant::now());
            let retry = !last && body.may_retry(&error, idempotent);
            let error = if let SendError::Connect(_) = error {
                UpstreamError::Unreachable { upstream: upstream.to_owned(), server: address, source: error }
            } else {
                UpstreamError::Failed { upstream: upstream.to_owned(), server: address, source: error }
            };
            if !retry {
                return Err(error);
            }
            warn!(upstream, error = %error, "attempt failed, trying another server");
            failed = Some(error);
        }
    }
}

/// Whether the exchange failed because the body being streamed from the client failed:
/// hyper reports an error of the body it was sending as a "user" error whose cause is
/// that body's own error, here the client connection's `hyper::Error`.
fn client_body_failed(error: &SendError) -> bool {
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

/// The target of a request for `server`: the path and query as the client sent them,
/// in origin form for HTTP/1 (an HTTP/1 client's own target is that already, kept as
/// it is without building a new one); HTTP/2 also carries the scheme and `server`.
fn upstream_uri(uri: &Uri, server: &Authority, tls: bool, http2: bool) -> Uri {
    if !http2 && uri.scheme().is_none() && uri.authority().is_none() {
        return uri.clone();
    }
    let path = uri.path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/"));
    if !http2 {
        return Uri::from(path);
    }
    let scheme = if tls { Scheme::HTTPS } else { Scheme::HTTP };
    // Scheme, authority and an origin-form path always build a valid URI.
    Uri::builder().scheme(scheme).authority(server.clone()).path_and_query(path).build().unwrap_or_default()
}

/// Rewrites a client request for the next hop: the client's `Host` kept (HTTP/2
/// clients send `:authority` instead, which becomes `Host`), hop-by-hop fields removed
/// (but an upgrade's) and the forwarding fields set.
fn prepare_upstream_request(req: Request<RequestBody>, hop: Hop) -> Request<RequestBody> {
    let (mut parts, body) = req.into_parts();
    if !parts.headers.contains_key(header::HOST)
        && let Some(value) = parts.uri.authority().and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    {
        parts.headers.insert(header::HOST, value);
    }
    parts.version = http::Version::HTTP_11;
    remove_hop_by_hop(&mut parts.headers);
    if let Some(protocol) = hop.upgrade {
        keep_upgrade(&mut parts.headers, protocol);
    }
    set_forwarded(&mut parts.headers, hop.peer, hop.trusted_peer, hop.tls, hop.forwarded);
    Request::from_parts(parts, body)
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            this.ended = true;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        if self.ended || self.body.is_end_stream() {
            if let Some(checkout) = self.checkout.take() {
                checkout.give_back();
            }
        }
    }
}
