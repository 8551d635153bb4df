//! Sending a request to its upstream: a server chosen by `servers` (balance, health), a
//! connection from the `pool`, the request written by sluicegate's HTTP/1 engine (or
//! hyper's HTTP/2, with `http2: true`), and a request that could not be sent tried on
//! the next server.
//!
//! A request is tried again only if it could not have reached the application: the
//! connection failed, or closed before any byte of the response. Even then only if the
//! method is idempotent (RFC 9110 §9.2.2) or its body, not empty, was not sent at all
//! (the server cannot have acted on half a request); and never once a byte of the body
//! left, since a streamed body cannot be sent twice. A kept-alive connection the server
//! closed just as the request went out is tried again on a new connection to the same
//! server, under the same rule, without counting against the server's health.

use std::borrow::Cow;
use std::future::poll_fn;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::uri::{Authority, Scheme};
use http::{HeaderMap, StatusCode, Uri};
use hyper::body::{Body, Incoming};
use smallvec::SmallVec;
use tokio::time::Sleep;
use tracing::warn;

use super::body::{Progress, RequestBody};
use super::connect::{Connector, UpstreamIo};
use super::error::{SendError, UpstreamError};
use super::h2::{self, H2Error};
use super::health::{self, Checker};
use super::pool::{Checkout, MAX_RESPONSE_HEAD, Pool, Take};
use super::resolve;
use super::servers::{InFlight, ServerSet};
use crate::config::{Upstream, UpstreamHost};
use crate::grpc;
use crate::hop::{self, Hop};
use crate::metrics::{Metrics, PoolMetrics};
use crate::variables;
use crate::wire::head::{Known, RequestHead};
use crate::wire::http1::client::{ExchangeError, ResponseBody, exchange};
use crate::wire::http1::parse::Framing;
use crate::wire::http1::write;
use crate::wire::http1::{BodyError, BodySource};
use crate::wire::message::ServerFields;

pub struct UpstreamClient {
    servers: std::sync::Arc<ServerSet>,
    timeout: Duration,
    retries: u32,
    pool: Pool,
    /// The servers speak HTTP/2 (requests carry scheme and authority, not `Host` alone).
    http2: bool,
    /// How long a request waits for a server under `max_conns` to have room.
    queue_timeout: Duration,
    metrics: PoolMetrics,
    /// The active health check, stopped with this client.
    _checker: Option<Checker>,
}

/// A request as it goes upstream.
pub struct Outgoing<'a> {
    pub head: &'a RequestHead<'a>,
    /// The target sent: the client's, or the route's rewrite of it.
    pub target: &'a str,
    /// How its body is framed (as the client framed it: the upstream gets the same
    /// length, or the chunked coding).
    pub framing: Framing,
    pub hop: Hop<'a>,
    /// The `Host` it carries.
    pub host: &'a UpstreamHost,
    /// What `hash` balancing goes by.
    pub balance_key: Option<u64>,
}

/// A server's response, its body still to be read. Boxed where an attempt makes it
/// (`Answer`): it is moved through the attempt's timer, the retries and the proxy, and
/// each move of it whole would be a copy of some 300 bytes.
pub struct UpstreamResponse {
    pub status: StatusCode,
    pub fields: ServerFields,
    pub body: UpstreamBody,
}

/// A server's response as an attempt brings it back.
pub type Answer = Box<UpstreamResponse>;

impl UpstreamResponse {
    /// A response to an attempt, its server not counted yet.
    fn new(status: StatusCode, fields: ServerFields, kind: BodyKind) -> Answer {
        Box::new(UpstreamResponse { status, fields, body: UpstreamBody { kind, in_flight: None } })
    }
}

/// A response body from a server, which counts the request as in progress there until
/// it is read to the end (or dropped), and gives its HTTP/1 connection back to the pool
/// then (dropped before, the connection closes: it still carries the rest). Counted no
/// longer than the server is busy with it: the next request's `least_conn` pick must not
/// find it still counted while the client is reading the last bytes.
pub struct UpstreamBody {
    kind: BodyKind,
    in_flight: Option<InFlight>,
}

// The HTTP/1 body is the common one, kept inline: boxing it would cost an allocation per
// response.
#[allow(clippy::large_enum_variant)]
enum BodyKind {
    H1 {
        body: ResponseBody<Checkout>,
        /// The request went out whole: the connection is in step for another.
        sent: bool,
    },
    H2(Box<H2Body>),
}

/// An HTTP/2 server's response body.
struct H2Body {
    incoming: Incoming,
    /// Its trailers, once read.
    trailers: Option<HeaderMap>,
    /// The request's body still being sent, if the response began first: stopped with
    /// this body.
    _pumping: Option<h2::Pumping>,
}

impl UpstreamClient {
    /// The client of `upstream` for `workers` worker threads (its pool keeps idle
    /// connections per worker).
    pub fn new(upstream: &Upstream, workers: usize, metrics: &Metrics) -> Self {
        if !upstream.tls.verify {
            warn!(upstream = %upstream.name, "TLS certificates of the servers are NOT verified (tls.verify: false): for tests only, never in production");
        }
        let servers = ServerSet::new(upstream, metrics.upstream_resolution(&upstream.name));
        let pool_metrics = metrics.upstream_pool(&upstream.name);
        if servers.has_names()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(resolve::keep_resolved(
                std::sync::Arc::downgrade(&servers),
                resolve::System,
                upstream.resolve_interval,
            ));
        }
        let connector = Connector::new(upstream, servers.tls_names());
        let checker =
            upstream.health_check.as_ref().and_then(|c| health::start(&servers, c, connector.clone(), upstream.http2));
        UpstreamClient {
            servers,
            timeout: upstream.timeout,
            retries: upstream.retries,
            pool: Pool::new(connector, upstream.keepalive, workers, pool_metrics.clone()),
            http2: upstream.http2,
            queue_timeout: upstream.queue_timeout,
            metrics: pool_metrics,
            _checker: checker,
        }
    }

    pub fn servers(&self) -> &ServerSet {
        &self.servers
    }

    /// Per server (as dialed), the idle connections its pool keeps and those lent now.
    pub fn pool_report(&self) -> std::collections::HashMap<String, (usize, usize)> {
        self.pool.report()
    }

    /// `GET target` from sluicegate itself (a JWKS), no client request behind it: its
    /// status and body, at most `max` bytes, within the upstream's `timeout`. HTTP/1.1.
    pub async fn fetch(&self, target: &str, max: usize) -> Result<(StatusCode, Vec<u8>), String> {
        let upstream = self.servers.upstream();
        self.servers.ready().await;
        let server = self.servers.pick(None, &[], Instant::now()).ok_or("no server of the upstream is in use")?;
        let host = server.host().as_str();
        let got = tokio::time::timeout(
            self.timeout,
            health::get(&self.pool, server.address(), server.tls(), host, target, Some(max)),
        )
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {:?}", self.timeout)));
        match &got {
            Ok(_) => server.succeeded(upstream),
            Err(_) => server.failed(upstream, Instant::now()),
        }
        got
    }

    /// Forwards `out` (its body from `body`) to a server and returns its response, body
    /// still to be read. A request that could not be sent goes to another server, at
    /// most `retries` times.
    // A block, not an `async fn`, as `attempt` is.
    #[allow(clippy::manual_async_fn)]
    pub fn forward(
        &self,
        out: &Outgoing<'_>,
        mut body: Option<&mut RequestBody<'_>>,
    ) -> impl Future<Output = Result<Answer, UpstreamError>> {
        async move {
            // Named by what it is asked for where it is needed: its name, the gRPC timeout,
            // kept in every request's state across the attempts, would cost 32 bytes.
            let idempotent = out.head.method.is_idempotent();
            let empty = matches!(out.framing, Framing::Empty | Framing::Length(0));
            let mut tried: SmallVec<[usize; 4]> = SmallVec::new();
            // The error of an attempt that will be retried (boxed: rare, and held in every
            // request's state meanwhile).
            let mut failed: Option<Box<UpstreamError>> = None;
            // A gRPC call's deadline bounds the wait for its answer as well.
            let deadline = grpc_timeout(out).map(|d| tokio::time::Instant::now() + d);
            self.servers.ready().await;
            loop {
                // Picked in one expression: the server is kept once in the future.
                let server = match self.servers.pick(out.balance_key, &tried, Instant::now()) {
                    Some(server) => server,
                    // Boxed: what is rare stays out of the future every request moves around.
                    None => match Box::pin(self.wait_for_room(out.balance_key, &tried)).await? {
                        Some(server) => server,
                        // After a failure that could be retried, the others are out or
                        // tried: that failure is the answer.
                        None => {
                            return Err(failed.map_or_else(
                                || {
                                    let servers = self.servers.addresses();
                                    warn!(upstream = self.servers.upstream(), %servers, "all servers of the upstream are out");
                                    UpstreamError::NoServer { upstream: self.servers.upstream().to_owned() }
                                },
                                |failed| *failed,
                            ));
                        }
                    },
                };
                tried.push(server.id());
                // No further attempt when retries are spent or every server has had its turn.
                let last = tried.len() > self.retries as usize || tried.len() == self.servers.len();
                let mut fresh = false;
                let error = loop {
                    let taken_before = body.as_ref().is_some_and(|b| b.taken);
                    // A request without a body has none to move.
                    let progress = body.as_mut().filter(|_| !empty).map(|b| b.progress());
                    let wait = Wait { timeout: self.timeout, progress: progress.as_deref(), deadline };
                    let answered = self.attempt(&server, out, body.as_deref_mut(), fresh, wait).await;
                    match answered {
                        Ok(mut answer) => {
                            server.succeeded(self.servers.upstream());
                            answer.body.in_flight = Some(server);
                            answer.body.release_if_done();
                            return Ok(answer);
                        }
                        Err(Failure::Expired(Expired::Deadline)) => {
                            // The client gave up: that says nothing of the server's health.
                            return Err(UpstreamError::Timeout {
                                upstream: self.servers.upstream().to_owned(),
                                server: server.address().clone(),
                                timeout: grpc_timeout(out).unwrap_or(self.timeout),
                                deadline: true,
                            });
                        }
                        Err(Failure::Expired(Expired::Stalled)) => {
                            server.failed(self.servers.upstream(), Instant::now());
                            // The request was sent and may be in progress there: not retried.
                            return Err(UpstreamError::Timeout {
                                upstream: self.servers.upstream().to_owned(),
                                server: server.address().clone(),
                                timeout: self.timeout,
                                deadline: false,
                            });
                        }
                        // The client's fault says nothing of the server's health, and a body
                        // that failed cannot be sent again.
                        Err(Failure::Body(e)) => {
                            return Err(match body.as_ref().and_then(|b| b.fault) {
                                Some(fault) => UpstreamError::Body(fault),
                                None => UpstreamError::ClientBody { source: e },
                            });
                        }
                        Err(Failure::Send { error, reused: true, responded: false })
                            if !fresh && !taken_before && may_retry(&error, idempotent, empty, body.as_deref()) =>
                        {
                            // A kept-alive connection the server had closed: a new one.
                            fresh = true;
                        }
                        Err(Failure::Send { error, .. }) => break error,
                    }
                };
                server.failed(self.servers.upstream(), Instant::now());
                let retry = !last && may_retry(&error, idempotent, empty, body.as_deref());
                let error = if let SendError::Connect(_) = error {
                    UpstreamError::Unreachable {
                        upstream: self.servers.upstream().to_owned(),
                        server: server.address().clone(),
                        source: error,
                    }
                } else {
                    UpstreamError::Failed {
                        upstream: self.servers.upstream().to_owned(),
                        server: server.address().clone(),
                        source: error,
                    }
                };
                if !retry {
                    return Err(error);
                }
                warn!(upstream = self.servers.upstream(), error = %error, "attempt failed, trying another server");
                failed = Some(Box::new(error));
            }
        }
    }

    /// The server for the next attempt once one that could take it, at `max_conns` now,
    /// has room: `None` at once when none is at its cap (every server out or tried),
    /// an error after `queue_timeout`.
    async fn wait_for_room(&self, key: Option<u64>, tried: &[usize]) -> Result<Option<InFlight>, UpstreamError> {
        let deadline = tokio::time::Instant::now() + self.queue_timeout;
        let mut queued = false;
        loop {
            let freed = self.servers.freed();
            tokio::pin!(freed);
            // Registered before the look: room made in between still wakes it.
            freed.as_mut().enable();
            let now = Instant::now();
            if let Some(server) = self.servers.pick(key, tried, now) {
                return Ok(Some(server));
            }
            if !self.servers.full(tried, now) {
                return Ok(None);
            }
            if !queued {
                queued = true;
                self.metrics.queued.inc();
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                self.metrics.full.inc();
                return Err(UpstreamError::Full {
                    upstream: self.servers.upstream().to_owned(),
                    max_conns: self.servers.max_conns().unwrap_or(usize::MAX),
                    waited: self.queue_timeout,
                });
            }
        }
    }

    /// One attempt on `server` (a new connection when `fresh`), its answer awaited as
    /// `wait` says.
    // A block, not an `async fn`, as `answered` is.
    #[allow(clippy::manual_async_fn)]
    fn attempt(
        &self,
        server: &InFlight,
        out: &Outgoing<'_>,
        body: Option<&mut RequestBody<'_>>,
        fresh: bool,
        wait: Wait<'_>,
    ) -> impl Future<Output = Result<Answer, Failure>> {
        async move {
            let body = body.map(|b| b as &mut dyn BodySource);
            if self.http2 {
                // Boxed: HTTP/1 requests do not carry its room. (A timer of its own: the
                // exchange shares its connection with others.)
                return Box::pin(async {
                    let host = upstream_host(out, server);
                    let timer = std::pin::pin!(tokio::time::sleep(wait.timeout));
                    let attempt = std::pin::pin!(self.attempt_h2(server, out, body, host.as_deref()));
                    wait.answered(timer, attempt).await.map_err(Failure::Expired)?
                })
                .await;
            }
            // A request that cannot be sent again must not go out on a connection the server
            // has closed already: its socket is asked.
            let take = match (fresh, out.head.method.is_idempotent()) {
                (true, _) => Take::New,
                (false, true) => Take::Idle,
                (false, false) => Take::IdleChecked,
            };
            let checkout = self.pool.checkout(server.address(), server.tls(), take);
            let mut conn = match wait.deadline {
                None => checkout.await,
                // A connection still to be made is bounded by the call's deadline too.
                Some(deadline) => Box::pin(tokio::time::timeout_at(deadline, checkout))
                    .await
                    .map_err(|_| Failure::Expired(Expired::Deadline))?,
            }
            .map_err(Failure::connect)?;
            let reused = conn.reused;
            // This thread's spare head buffer (as a response head's): the exchange gives it
            // back once the head is sent, so a request waiting for its answer holds none.
            let mut head = write::buffer();
            // In a block: what writes the head is not kept in the attempt's future.
            {
                let host = upstream_host(out, server);
                let mut writer = write::Head::request(&mut head, out.head.method, out.target);
                let fields = &mut |name: &[u8], value: &[u8]| writer.field(name, value);
                hop::request_fields(out.head.fields, &out.hop, host.as_deref(), fields);
                match out.framing {
                    Framing::Empty => {}
                    Framing::Length(n) => writer.content_length(n),
                    Framing::Chunked | Framing::UntilClose => writer.field(b"transfer-encoding", b"chunked"),
                }
                writer.end();
            }
            let framing = if out.framing == Framing::UntilClose { Framing::Chunked } else { out.framing };
            let mut timer = conn.timer.take().unwrap_or_else(|| Box::pin(tokio::time::sleep(wait.timeout)));
            let exchanged = {
                let exchange =
                    std::pin::pin!(exchange(&mut conn, head, body, framing, out.head.method, MAX_RESPONSE_HEAD));
                wait.answered(timer.as_mut(), exchange).await
            };
            conn.timer = Some(timer);
            let (result, sent) = exchanged.map_err(Failure::Expired)?;
            let (response, read) = match result {
                Ok(response) => response,
                Err(ExchangeError::Body(e)) => return Err(Failure::Body(e)),
                Err(e) => {
                    let responded = matches!(e, ExchangeError::Response(_));
                    return Err(Failure::Send { error: SendError::Exchange(e), reused, responded });
                }
            };
            if response.status == StatusCode::SWITCHING_PROTOCOLS && out.hop.upgrade.is_none() {
                let e = ExchangeError::Response("101 Switching Protocols to a request that asked for no upgrade");
                return Err(Failure::Send { error: SendError::Exchange(e), reused, responded: true });
            }
            let mut body = BodyKind::H1 { body: ResponseBody::new(conn, &response, read), sent: sent.all };
            // A response without a body (204, 304, to HEAD) is read already.
            body.give_back_if_done();
            Ok(UpstreamResponse::new(response.status, ServerFields::H1(response), body))
        }
    }

    async fn attempt_h2(
        &self,
        server: &InFlight,
        out: &Outgoing<'_>,
        body: Option<&mut dyn BodySource>,
        host: Option<&[u8]>,
    ) -> Result<Answer, Failure> {
        let mut sender = self.pool.h2(server.address(), server.tls()).await.map_err(Failure::connect)?;
        let mut pairs = Vec::with_capacity(16);
        hop::request_fields(out.head.fields, &out.hop, None, &mut |name, value| {
            pairs.push((name.to_vec(), value.to_vec()))
        });
        let fields = h2::header_map(pairs);
        let uri = h2_uri(server.address(), server.tls(), out.target, host);
        let body = body.filter(|_| !matches!(out.framing, Framing::Empty | Framing::Length(0)));
        match h2::send(&mut sender, out.head.method, uri, fields, body).await {
            Ok(h2::Sent { response, pumping }) => {
                let (parts, incoming) = response.into_parts();
                let body = BodyKind::H2(Box::new(H2Body { incoming, trailers: None, _pumping: pumping }));
                Ok(UpstreamResponse::new(parts.status, ServerFields::H2(parts.headers), body))
            }
            Err(H2Error::Body(e)) => Err(Failure::Body(e)),
            Err(H2Error::Exchange(e)) => Err(Failure::Send { error: SendError::H2(e), reused: true, responded: false }),
        }
    }
}

/// Why an attempt's answer was not waited for any longer.
enum Expired {
    /// Nothing moved for the upstream's `timeout`: no response head, and no piece of
    /// the request body sent.
    Stalled,
    /// The client's own deadline (`grpc-timeout`) passed.
    Deadline,
}

/// How long an attempt's answer is waited for: no response within `timeout` of the
/// request body's last piece (`progress`: a body still moving is no stalled server), nor
/// past the client's `deadline`.
#[derive(Clone, Copy)]
struct Wait<'a> {
    timeout: Duration,
    progress: Option<&'a Progress>,
    deadline: Option<tokio::time::Instant>,
}

impl Wait<'_> {
    /// `attempt`'s outcome, unless it stalls or the deadline passes first, as `timer`
    /// says. The timer is reset only when it would ring late, or has rung: one set for
    /// an earlier exchange on the connection rings a little early, and is then set
    /// again for what is left. (`Sleep::reset` costs about 140 instructions: the
    /// deadline made a tick, then stored.)
    // A block, not an `async fn`: an `async fn` keeps each argument twice in its future.
    #[allow(clippy::manual_async_fn)]
    fn answered<T>(
        self,
        mut timer: Pin<&mut Sleep>,
        mut attempt: Pin<&mut impl Future<Output = T>>,
    ) -> impl Future<Output = Result<T, Expired>> {
        async move {
            let started = tokio::time::Instant::now();
            let mut now = started;
            loop {
                let (at, expired) = self.due(started);
                if !(now < timer.deadline() && timer.deadline() <= at) {
                    timer.as_mut().reset(at);
                }
                let outcome = poll_fn(|cx| match attempt.as_mut().poll(cx) {
                    Poll::Ready(outcome) => Poll::Ready(Some(outcome)),
                    Poll::Pending => timer.as_mut().poll(cx).map(|()| None),
                })
                .await;
                if let Some(outcome) = outcome {
                    return Ok(outcome);
                }
                now = tokio::time::Instant::now();
                // Rung early (set for an earlier exchange), or the body moved since it was
                // set: the wait goes on from there.
                let moved =
                    matches!(expired, Expired::Stalled) && self.progress.is_some_and(|p| p.last() + self.timeout > now);
                if now >= at && !moved {
                    return Err(expired);
                }
            }
        }
    }

    /// When a wait begun at `started` ends, and why: `timeout` after the body last moved
    /// (or `started`), or the call's deadline if that comes first. (A function of its
    /// own: what it works out is not kept in the wait's future.)
    fn due(&self, started: tokio::time::Instant) -> (tokio::time::Instant, Expired) {
        let stalled_at = self.progress.map_or(started, |p| p.last().max(started)) + self.timeout;
        match self.deadline {
            Some(deadline) if deadline < stalled_at => (deadline, Expired::Deadline),
            _ => (stalled_at, Expired::Stalled),
        }
    }
}

/// The timeout a gRPC call asked for (`grpc-timeout`), if it is one.
fn grpc_timeout(out: &Outgoing<'_>) -> Option<Duration> {
    out.head.fields.first_of(Known::GrpcTimeout).and_then(grpc::timeout)
}

/// The `Host` a request goes upstream with, as its route's `upstream_host` says: the
/// client's (HTTP/1 needs one; a client's HTTP/1.0 request may come without), its name
/// alone, a name given, or the server's; the server's when there is no other.
fn upstream_host<'a>(out: &Outgoing<'a>, server: &'a InFlight) -> Option<Cow<'a, [u8]>> {
    let client = || out.head.fields.first_of(Known::Host).or(out.head.authority.map(str::as_bytes));
    let host = match out.host {
        UpstreamHost::Keep => client().map(Cow::Borrowed),
        UpstreamHost::KeepName => client().map(variables::host_name),
        UpstreamHost::Name(name) => Some(Cow::Borrowed(name.as_bytes())),
        UpstreamHost::Server => Some(Cow::Borrowed(server.host().as_str().as_bytes())),
    };
    host.or(Some(Cow::Borrowed(server.host().as_str().as_bytes())))
}

/// How an attempt failed.
enum Failure {
    /// Its answer was waited for as long as it may be.
    Expired(Expired),
    /// The client's body failed.
    Body(BodyError),
    /// The connection or the exchange failed; on a connection `reused` from the pool,
    /// and after some of a response (`responded`) or not.
    Send { error: SendError, reused: bool, responded: bool },
}

impl Failure {
    fn connect(error: SendError) -> Failure {
        Failure::Send { error, reused: false, responded: false }
    }
}

/// Whether a request that failed with `error` before its response may be sent again.
fn may_retry(error: &SendError, idempotent: bool, empty: bool, body: Option<&RequestBody<'_>>) -> bool {
    if body.is_some_and(|b| b.taken) {
        return false;
    }
    match error {
        // Nothing was sent on a connection that was never made.
        SendError::Connect(_) => true,
        SendError::Exchange(ExchangeError::Closed(_)) => idempotent || !empty,
        SendError::Exchange(_) => false,
        SendError::H2(e) => (e.is_incomplete_message() || e.is_canceled()) && (idempotent || !empty),
    }
}

/// The URI of an HTTP/2 request: scheme, the `Host` it carries as `:authority` (the
/// server's address without one), and the target.
fn h2_uri(server: &Authority, tls: bool, target: &str, host: Option<&[u8]>) -> Uri {
    let scheme = if tls { Scheme::HTTPS } else { Scheme::HTTP };
    let authority = host.and_then(|h| Authority::try_from(h).ok()).unwrap_or_else(|| server.clone());
    // Scheme, authority and an origin-form target (checked as it came in) build a URI.
    Uri::builder().scheme(scheme).authority(authority).path_and_query(target).build().unwrap_or_default()
}

impl BodyKind {
    /// An HTTP/1 body read to its end, its request having gone out whole: the connection
    /// is in step for the next exchange, and goes back to the pool at once.
    fn give_back_if_done(&mut self) {
        if let BodyKind::H1 { body, sent: true } = self
            && body.is_reusable()
        {
            body.conn_mut().give_back();
        }
    }
}

impl UpstreamBody {
    /// The next piece of the body; `None` at its end.
    pub fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, BodyError>>> {
        let polled = match &mut self.kind {
            BodyKind::H1 { body, .. } => {
                let polled = body.poll_data(cx);
                self.kind.give_back_if_done();
                polled
            }
            BodyKind::H2(h2) => crate::wire::h2::poll_data(&mut h2.incoming, &mut h2.trailers, cx),
        };
        if polled.is_ready() {
            self.release_if_done();
        }
        polled
    }

    /// Read to the end: the server is no longer busy with this request.
    fn release_if_done(&mut self) {
        if self.in_flight.is_some() && self.is_done() {
            self.in_flight = None;
        }
    }

    /// The whole body has been read (as far as this side can tell).
    pub fn is_done(&self) -> bool {
        match &self.kind {
            BodyKind::H1 { body, .. } => body.is_done(),
            BodyKind::H2(h2) => h2.incoming.is_end_stream(),
        }
    }

    /// The trailer fields that followed the body, once it has been read to its end
    /// (HTTP/2 trailers, or an HTTP/1 server's chunked ones); given once.
    pub fn trailers(&mut self) -> Option<HeaderMap> {
        match &mut self.kind {
            BodyKind::H1 { body, .. } => body.trailers(),
            BodyKind::H2(h2) => h2.trailers.take(),
        }
    }

    /// Data bytes the body declared, if it did.
    pub fn length(&self) -> Option<u64> {
        match &self.kind {
            BodyKind::H1 { body, .. } => body.remaining(),
            BodyKind::H2(h2) => h2.incoming.size_hint().exact(),
        }
    }

    /// The connection, taken over by an upgrade (`101`): its socket and the bytes read
    /// from it past the response head.
    pub fn into_upgrade(self) -> Option<(UpstreamIo, BytesMut)> {
        match self.kind {
            BodyKind::H1 { body, .. } => {
                let (conn, buf) = body.into_parts();
                Some((conn.into_io()?, buf))
            }
            BodyKind::H2(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::time::Instant;

    use super::*;

    /// How long `wait` waits for an answer that never comes, with a connection's timer set
    /// `set_before` ago for an exchange of `timeout`.
    async fn waited(wait: Wait<'_>, set_before: Duration) -> (Expired, Duration) {
        let mut timer = Box::pin(tokio::time::sleep(wait.timeout));
        tokio::time::advance(set_before).await;
        let started = Instant::now();
        let never = std::pin::pin!(std::future::pending::<()>());
        let expired = wait.answered(timer.as_mut(), never).await.err().unwrap();
        (expired, started.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn a_timer_an_earlier_exchange_set_rings_early_and_the_wait_goes_on_to_its_own_end() {
        let timeout = Duration::from_secs(10);
        let (expired, after) = waited(Wait { timeout, progress: None, deadline: None }, Duration::from_secs(6)).await;
        assert!(matches!(expired, Expired::Stalled));
        assert!(after >= timeout && after < timeout + Duration::from_millis(5), "{after:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_sooner_than_the_timer_is_kept() {
        let (timeout, soon) = (Duration::from_secs(10), Duration::from_secs(2));
        let deadline = Some(Instant::now() + soon);
        let (expired, after) = waited(Wait { timeout, progress: None, deadline }, Duration::ZERO).await;
        assert!(matches!(expired, Expired::Deadline));
        assert!(after >= soon && after < soon + Duration::from_millis(5), "{after:?}");
    }
}
