//! The request path: client address -> route -> keys -> limits -> forward or respond.
//!
//! `Proxy::handle` answers every request, whichever protocol carried it (`message`). It
//! runs two steps: `admit` (the head's checks, the front: route and keys, then the
//! limits' decision) and `serve` (the wait, the upstream exchange or static response,
//! settling), and turns a `ProxyError` into its response in one place. Rejections are
//! not errors: they are a `Decision` answered with a 429.

pub mod body;
mod charge;
pub mod error;
mod log_budget;
mod pace;
pub mod refused_keys;
pub mod response;
mod rewrite;
pub mod top_keys;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use smallvec::SmallVec;
use tracing::{Level, debug, info, warn};
use typed_index_collections::{TiSlice, TiVec};

use crate::access_log::{self, AccessLog};
use crate::admission::hold::{Hold, HoldKey, Holds};
use crate::admission::{self, Asked, Decide, Origin, Refused, Verdict, Way};
use crate::clock::Clock;
use crate::config::{Action, Config, HeaderMode, LimitId, LogLevel, Route, RouteId, UpstreamId};
use crate::front::{self, FrontError};
use crate::gate::{Decision, Gate, Pending, Permits};
use crate::grpc;
use crate::hop::{self, Hop};
use crate::jwks;
use crate::limit::secret::KeySecret;
use crate::limit::{LimitResult, Limiters, Outcome, Shown};
use crate::metrics::{Metrics, RequestOutcome, UPSTREAM_HOLD, UpstreamResult};
use crate::policy::key::KeySource;
use crate::router::Scheme;
use crate::upstream::{self, Outgoing, UpstreamClient, UpstreamError};
use crate::variables;
use crate::wire::connection::ClientConn;
use crate::wire::head::{Known, RequestHead};
use crate::wire::http1::BodySource;
use crate::wire::http1::parse::Framing;
use crate::wire::message::{self, Request};
use body::{Response, Settling};
use charge::Meter;
use error::ProxyError;
use log_budget::LogBudget;
use refused_keys::RefusedKeys;

/// `tracing::event!` at a level known only at run time (its callsites need a constant).
macro_rules! event_at {
    ($level:expr, $($rest:tt)+) => {
        match $level {
            Level::ERROR => tracing::event!(Level::ERROR, $($rest)+),
            Level::WARN => tracing::event!(Level::WARN, $($rest)+),
            Level::INFO => tracing::event!(Level::INFO, $($rest)+),
            Level::DEBUG => tracing::event!(Level::DEBUG, $($rest)+),
            _ => tracing::event!(Level::TRACE, $($rest)+),
        }
    };
}

pub struct Proxy {
    config: Config,
    /// Where each request's limits are decided.
    gate: Gate,
    metrics: Arc<Metrics>,
    upstreams: TiVec<UpstreamId, UpstreamClient>,
    /// What the rate-limit headers say of each limit.
    quotas: TiVec<LimitId, Box<[response::Quota]>>,
    /// How many rejection and delay lines each limit may still write.
    log_budgets: Arc<TiVec<LimitId, LogBudget>>,
    access_log: Option<Arc<AccessLog>>,
    /// The keys each limit refused this second, when an admin listener shows them
    /// (`None`: none does, and refusals count nothing more).
    refused_keys: Option<TiVec<LimitId, RefusedKeys>>,
    /// Keys the upstreams refused with a time to wait, per route (`upstream_hold`).
    holds: Holds,
}

impl Proxy {
    /// The proxy of `config`, hashing and digesting keys with `secret`; fails only if its
    /// access log cannot be opened.
    pub fn new(config: Config, secret: KeySecret) -> std::io::Result<Self> {
        let gate = Gate::keyed(&config, Clock::System, secret);
        let metrics = Metrics::new(&config, &gate);
        Proxy::with(config, gate, metrics)
    }

    /// The proxy of `config`, reloaded while `old` served: limits keep their state as
    /// `Gate::reloaded` says (it returns the names of the limits kept and started
    /// fresh), and metrics continue their series.
    pub fn reloaded(config: Config, old: &Proxy) -> std::io::Result<(Self, Vec<String>, Vec<String>)> {
        // Opened first: a log that cannot be opened fails the reload before any state moves.
        let access_log = config.access_log.as_ref().map(|log| AccessLog::open(log, &config)).transpose()?;
        // The old configuration's lookups and health checks end now; its requests in
        // progress finish with the servers as they are.
        for upstream in &old.upstreams {
            upstream.servers().stop();
        }
        let (gate, kept, fresh) = Gate::reloaded(&config, &old.gate);
        let metrics = old.metrics.reloaded(&config, &gate);
        jwks::start(&config, &metrics, old.config.jwt.as_deref());
        let holds = Holds::new(&config, Some((&old.config, &old.holds)));
        Ok((Proxy::assemble(config, gate, metrics, access_log, holds), kept, fresh))
    }

    fn with(config: Config, gate: Gate, metrics: Metrics) -> std::io::Result<Self> {
        let access_log = config.access_log.as_ref().map(|log| AccessLog::open(log, &config)).transpose()?;
        jwks::start(&config, &metrics, None);
        let holds = Holds::new(&config, None);
        Ok(Proxy::assemble(config, gate, metrics, access_log, holds))
    }

    fn assemble(
        config: Config,
        gate: Gate,
        metrics: Metrics,
        access_log: Option<Arc<AccessLog>>,
        holds: Holds,
    ) -> Self {
        let log_budgets = Arc::new(config.limits.iter().map(|l| LogBudget::new(l.log_lines_per_second)).collect());
        let levels = config.limits.iter().map(|l| (l.name.clone(), line_level(l.log_level, false))).collect();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(flush_log_budgets(Arc::downgrade(&log_budgets), levels, gate.clock().clone()));
            // Whether Redis answers is known before a request asks it (`/readyz`).
            if let Some(store) = gate.store() {
                store.watch();
            }
        }
        let workers = crate::worker::count(config.server.workers);
        let upstreams = config.upstreams.iter().map(|u| UpstreamClient::new(u, workers, &metrics)).collect();
        let refused_keys =
            config.admin.is_some().then(|| config.limits.iter().map(|_| RefusedKeys::default()).collect());
        Proxy {
            access_log,
            log_budgets,
            refused_keys,
            metrics: Arc::new(metrics),
            gate,
            upstreams,
            quotas: response::all_quotas(&config),
            holds,
            config,
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn limiters(&self) -> &Arc<Limiters> {
        self.gate.limiters()
    }

    /// Where requests are decided.
    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// The Redis store of the global limits, if any.
    pub fn store(&self) -> Option<&Arc<crate::store::Store>> {
        self.gate.store()
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The keys `limit` refused since the dashboard last took them (`None`: without an
    /// admin listener they are not counted).
    pub fn refused_keys(&self, limit: LimitId) -> Option<&RefusedKeys> {
        self.refused_keys.as_ref().map(|all| &all[limit])
    }

    /// The keys each route holds after its upstream refused them (`upstream_hold`).
    pub fn holds(&self) -> &Holds {
        &self.holds
    }

    /// The upstreams' clients, as `Config::upstreams` lists them.
    pub fn upstreams(&self) -> &TiSlice<UpstreamId, UpstreamClient> {
        &self.upstreams
    }

    /// Serves one request that came on `conn`. Never fails: every outcome is a response.
    // A block, not an `async fn`, read where it lies: an `async fn` keeps each argument
    // twice in its future (as given, and moved into its body), in every request's box.
    #[allow(clippy::manual_async_fn)]
    pub fn handle<'a>(
        self: Arc<Self>,
        request: Request<'a>,
        conn: &'a ClientConn,
    ) -> impl Future<Output = Response> + 'a {
        async move {
            let (head, framing) = (&request.head, request.framing);
            let mut trace = Trace(
                self.access_log
                    .as_ref()
                    .map(|log| access_log::Entry::begin(log, head, conn.peer.ip(), Scheme::of(conn.tls))),
            );
            // What sluicegate answers a gRPC call itself is a gRPC response.
            let grpc = grpc::is_grpc(head.fields.first_of(Known::ContentType));
            // The admission is taken apart before the request is served: an answer already
            // made is not held in the request's state while another is made.
            let mut admitted = match self.admit(head, framing, conn, grpc, &mut trace).await {
                Ok(Admission::Go(admitted)) => admitted,
                Ok(Admission::Answer(response)) => return finish(response, trace, grpc),
                Err(e) => return finish(response::error(&e, grpc), trace, grpc),
            };
            let response = self.serve(head, framing, request.body, &mut admitted, conn, &mut trace).await;
            // Each fault was logged where it happened, with what it concerned.
            finish(response.unwrap_or_else(|e| response::error(&e, grpc)), trace, grpc)
        }
    }

    /// The first step: the request's admission (`admission::admit`), acted on: what it
    /// found is counted and logged, a refusal or a hold answered here; a request the
    /// limits pass goes on to `serve`, carrying what that needs and nothing that borrows
    /// the request.
    async fn admit(
        &self,
        head: &RequestHead<'_>,
        framing: Framing,
        conn: &ClientConn,
        grpc: bool,
        trace: &mut Trace,
    ) -> Result<Admission, ProxyError> {
        let config = &self.config;
        let declared = if let Framing::Length(length) = framing { Some(length) } else { None };
        let asked = Asked { head, peer: conn.peer.ip(), declared, scheme: Scheme::of(conn.tls), origin: Origin::Wire };
        let mut admitted = {
            let way = Way { decide: Decide::Spend, holds: Some(&self.holds), drives: None };
            admission::admit(config, &self.gate, &asked, &way)
        };
        trace.with(|e| e.client = admitted.client_ip);
        if let Some(front) = &admitted.front {
            trace.with(|e| e.route = Some(config.routes[front.route].name.clone()));
            // What its limits are keyed on, for `simulate` (when the access log records
            // keys), so that a replay refuses as below what was refused here.
            trace.with(|e| e.record_keys(front.route, front.exempt, &front.src));
            if let Some(error) = &front.invalid_token {
                debug!(peer = %conn.peer, %error, "token not verified: the request goes on without claims");
                self.metrics.invalid_token(error.reason());
            }
            for (limit, field) in &admitted.repeated_dry {
                self.repeated_in_dry_run(*limit, field, &front.src);
            }
        }
        let verdict = std::mem::replace(&mut admitted.verdict, Verdict::Pending);
        let (Some(front), Some(cost)) = (&admitted.front, admitted.cost) else {
            // Refused before the limits, or held.
            return match verdict {
                Verdict::Held(held) => Ok(Admission::Answer(self.held(admitted.front.as_ref(), held, grpc, trace))),
                Verdict::Refused(refused) => Err(self.refused(refused, &admitted, head, conn, trace).into()),
                Verdict::Decided(_) | Verdict::Pending => unreachable!("a decision has a route and a cost"),
            };
        };
        let route = &config.routes[front.route];
        let decision = match verdict {
            Verdict::Decided(decision) => decision,
            // With Redis, the call's future is boxed, so that requests without global
            // limits do not carry its room.
            Verdict::Pending => Box::pin(self.gate.decide(&admitted.limits, &front.src, cost)).await,
            Verdict::Refused(refused) => return Err(self.refused(refused, &admitted, head, conn, trace).into()),
            Verdict::Held(held) => return Ok(Admission::Answer(self.held(Some(front), held, grpc, trace))),
        };
        let outcome = RequestOutcome::of(&decision, &config.limits);
        self.metrics.request(front.route, outcome);
        trace.with(|e| {
            e.outcome = outcome.as_str();
            let missing = self.gate.missing_keys(&admitted.limits, &front.src);
            e.missing_key = missing.map(|limit| config.limits[limit].name.clone()).collect();
        });
        match decision {
            Decision::Reject { limit, ref results, ref store_error, .. } => {
                match store_error {
                    // Not a limit's refusal: no limit item in the headers, no decision counted.
                    Some(error) => self.unavailable(route, limit, &front.src, error),
                    None => {
                        self.account(route, results, &front.src, true);
                        if grpc {
                            self.metrics.grpc(front.route, Some(config.limits[limit].grpc_status));
                        }
                    }
                }
                let response = response::refusal(config, &self.quotas, &decision, grpc);
                Ok(Admission::Answer(response.expect("a rejection is answered")))
            }
            Decision::Pass { wait, results, standings, permits, pending, .. } => {
                self.account(route, &results, &front.src, false);
                let target = rewrite::target(&route.rewrite, &front.src.path, &front.src.captures, head.query());
                let balance_key = match &route.action {
                    Action::Forward(upstream) => self.upstreams[*upstream].servers().balance_key(&front.src),
                    Action::Respond(_) => None,
                };
                let admitted = Admitted {
                    route: front.route,
                    wait,
                    standings: match config.ratelimit_headers {
                        HeaderMode::All => standings.iter().map(Shown::from).collect(),
                        _ => SmallVec::new(),
                    },
                    permits,
                    pending,
                    balance_key,
                    target,
                    trusted_peer: admitted.trusted_peer,
                    client_ip: admitted.client_ip,
                    grpc,
                    // Boxed: it is held across the exchange, and most routes hold none.
                    hold: admitted.hold.take().map(Box::new),
                };
                Ok(Admission::Go(admitted))
            }
        }
    }

    /// Counts and logs the admission's refusal of a request, which is answered with it.
    fn refused(
        &self,
        refused: Refused,
        admitted: &admission::Admission<'_>,
        head: &RequestHead<'_>,
        conn: &ClientConn,
        trace: &mut Trace,
    ) -> Refused {
        let outcome = refused.outcome();
        trace.with(|e| e.outcome = outcome);
        match (&refused, &admitted.front) {
            (Refused::Front(FrontError::NoRoute), _) => {}
            (_, Some(front)) => self.metrics.answered_early(Some(front.route), outcome),
            (Refused::Front(FrontError::InvalidToken { route, .. }), None) => {
                self.metrics.answered_early(Some(*route), outcome);
            }
            (_, None) => self.metrics.answered_early(None, outcome),
        }
        match &refused {
            Refused::Front(FrontError::NoRoute) => {
                debug!(method = %head.method, path = head.path(), host = admitted.host, "no route matches");
                self.metrics.no_route();
            }
            Refused::Front(FrontError::InvalidToken { limit, error, .. }) => {
                debug!(peer = %conn.peer, limit, %error, "token refused");
                self.metrics.invalid_token(error.reason());
            }
            Refused::Front(e) if admitted.front.is_none() => debug!(peer = %conn.peer, error = %e, "bad request"),
            Refused::Front(_) => {}
            Refused::BodyTooLarge { length, limit } => {
                let route = admitted.front.as_ref().map(|f| self.config.routes[f.route].name.as_str());
                debug!(route, length, limit, "request body too large");
            }
            Refused::DuplicateKeyField { limit, field, .. } => debug!(limit, key = %field, "repeated key field"),
            Refused::MissingKey { limit, id, .. } => {
                // Counted as missing (a dry-run limit refuses nothing: the gate counts the
                // request, as one it skips).
                if let Some(front) = &admitted.front {
                    self.limiters().missed(*id, &front.src);
                }
                debug!(limit, "request without the limit's key refused");
                trace.with(|entry| entry.missing_key = vec![limit.clone()]);
            }
        }
        refused
    }

    /// The second step, for a request its limits passed: its wait, then the upstream
    /// exchange (or the static response) and the settling of `count:` limits. The
    /// response carries the request's slots until it has been sent (an upgrade's, until
    /// its tunnel closes).
    // A block, not an `async fn`, as `handle` is.
    #[allow(clippy::manual_async_fn)]
    fn serve(
        &self,
        head: &RequestHead<'_>,
        framing: Framing,
        body: Option<&mut (dyn BodySource + '_)>,
        admitted: &mut Admitted,
        conn: &ClientConn,
        trace: &mut Trace,
    ) -> impl Future<Output = Result<Response, ProxyError>> {
        async move {
            // Borrowed, not moved: the request's state holds it once.
            let index = admitted.route;
            let (config, route) = (&self.config, &self.config.routes[index]);
            if !admitted.wait.is_zero() {
                // A client that goes away while waiting drops this future here: its request
                // never reaches the upstream and its permits are released. (Boxed: most
                // requests do not wait, nor carry a timer's room.)
                Box::pin(tokio::time::sleep(admitted.wait)).await;
            }
            let vars = variables::Request {
                client_ip: admitted.client_ip,
                host: head.fields.first_of(Known::Host).or(head.authority.map(str::as_bytes)),
                target: head.target.as_bytes(),
                tls: conn.tls,
            };
            let response = match &route.action {
                Action::Respond(r) => Ok(response::static_response(r, &vars)),
                Action::Forward(upstream) => {
                    let hop = Hop {
                        peer: conn.peer.ip(),
                        trusted_peer: admitted.trusted_peer,
                        tls: conn.tls,
                        forwarded: config.forwarded,
                        upgrade: hop::upgrade_protocol(head.version, head.fields),
                        rewrite: &route.rewrite,
                        authority: head.authority.map(str::as_bytes),
                        underscores: config.server.underscores_in_headers,
                        vars,
                    };
                    let target = admitted.target.as_deref().unwrap_or(head.target);
                    let host = &route.rewrite.upstream_host;
                    let out = Outgoing { head, target, framing, hop, host, balance_key: admitted.balance_key };
                    // Awaited here rather than in a function of its own: each future nested in
                    // another is moved into it whole (its room for every state), a copy per level.
                    let mut bounded = body
                        .map(|b| upstream::RequestBody::new(b, route.max_body_bytes, config.server.body_read_timeout));
                    let started = Instant::now();
                    let forwarded = self.upstreams[*upstream].forward(&out, bounded.as_mut()).await;
                    self.forwarded(forwarded, started, &out, index, admitted.hold.as_deref(), trace)
                }
            };

            // Limits that count only some statuses keep or take back this request now; in
            // Redis (boxed, with the response: most requests have nothing to settle there).
            let mut response = response;
            let mut status = response.as_ref().map_or_else(|e| e.status(), |r| r.status).as_u16();
            // Limits that charge what the response reports read it as it passes (boxed: most
            // responses have none).
            let mut meter = match &response {
                Ok(r) => Meter::new(admitted.pending.charging(), r).map(Box::new),
                Err(_) => None,
            };
            if admitted.grpc {
                // A gRPC call counts by its gRPC status: that of a trailers-only answer's
                // head, or else that of its trailers, at the end of its body.
                let in_head = match &response {
                    Ok(r) => grpc_status_in_head(r),
                    Err(e) => Some(e.grpc_code()),
                };
                match (in_head, &mut response) {
                    (Some(code), _) => {
                        self.metrics.grpc(index, Some(code));
                        status = grpc::counted_status(code);
                    }
                    (None, Ok(r)) => {
                        let (pending, metrics) = (std::mem::take(&mut admitted.pending), Arc::clone(&self.metrics));
                        r.body.receipts().grpc_end = Some(Box::new(move |code| {
                            metrics.grpc(index, code);
                            let (global, charges) = pending.settle(code.map_or(status, grpc::counted_status));
                            if let Some(global) = global {
                                tokio::spawn(global);
                            }
                            charges
                        }));
                    }
                    (None, Err(_)) => {}
                }
            }
            let (global, charges) = std::mem::take(&mut admitted.pending).settle(status);
            if let Some(meter) = &mut meter {
                meter.charges = charges;
            }
            if let Some(global) = global {
                global.await;
            }
            let mut response = response?;
            response.body.receipts().permits = std::mem::take(&mut admitted.permits);
            response.body.receipts().meter = meter;
            // A tunnel is not paced: its bytes are no response body.
            if let Some(rate) = route.body_rate
                && response.status != http::StatusCode::SWITCHING_PROTOCOLS
            {
                response.body.pace(rate);
            }
            if let Action::Forward(upstream) = &route.action {
                response.body.receipts().tunnel_idle_timeout = config.upstreams[*upstream].tunnel_idle_timeout;
            }
            if config.ratelimit_headers == HeaderMode::All {
                self.add_ratelimit_headers(&mut response, &admitted.standings);
            }
            Ok(response)
        }
    }

    /// The answer to a request whose key its route holds (`held`): the upstream asked
    /// for none of its requests until then.
    fn held(&self, front: Option<&front::Front<'_>>, held: Hold, grpc: bool, trace: &mut Trace) -> Response {
        let left = held.until.since(self.gate.clock().now());
        if let Some(front) = front {
            let route = &self.config.routes[front.route].name;
            debug!(%route, key = %held.key, status = held.status.as_u16(), "held: the upstream asked to wait");
            self.metrics.hold(front.route, true);
            self.metrics.answered_early(Some(front.route), UPSTREAM_HOLD);
        }
        trace.with(|e| e.outcome = UPSTREAM_HOLD);
        response::held(&held, left, self.config.rejection_body, grpc)
    }

    /// Holds `key` of route `index` if the upstream's answer `response` refused it with
    /// a time to wait.
    fn hold(&self, index: RouteId, key: &HoldKey, response: &Response) -> Option<Duration> {
        let wait = self.holds.table(index)?.hold(key, response, self.gate.clock().now())?;
        self.metrics.hold(index, false);
        info!(route = %self.config.routes[index].name, key = %key.label, status = response.status.as_u16(),
            wait_s = wait.as_secs_f64(), "the upstream refused: key held until it asked");
        Some(wait)
    }

    /// What came of sending `out` (of route `index`) upstream, begun at `started`: the
    /// exchange counted in the route's metrics, a refusal held by `hold` (the request's
    /// key, if the route holds), and the response to send on.
    fn forwarded(
        &self,
        forwarded: Result<upstream::Answer, UpstreamError>,
        started: Instant,
        out: &Outgoing<'_>,
        index: RouteId,
        hold: Option<&HoldKey>,
        trace: &mut Trace,
    ) -> Result<Response, ProxyError> {
        let route = &self.config.routes[index];
        let result = match &forwarded {
            Ok(response) => UpstreamResult::Status(response.status.as_u16()),
            Err(UpstreamError::Timeout { .. }) => UpstreamResult::Timeout,
            Err(UpstreamError::Unreachable { .. }) => UpstreamResult::ConnectError,
            // The request body broke off, grew too large or stalled: the client's doing.
            Err(e) if e.is_client_error() => UpstreamResult::ClientBody,
            Err(_) => UpstreamResult::Failed,
        };
        let took = started.elapsed();
        trace.with(|e| e.upstream = Some(took));
        self.metrics.upstream(index, result, took);
        let upstream::UpstreamResponse { status, fields, body } =
            *forwarded.inspect_err(|e| match e.is_client_error() {
                // The client's fault says nothing about the upstream's health.
                true => debug!(route = %route.name, error = %e, "client error while forwarding"),
                false => warn!(route = %route.name, error = %e, "upstream error"),
            })?;
        let mut extra: Vec<_> = (route.rewrite.set_response_headers.iter())
            .map(|(n, v)| (n.clone(), v.header_value(&out.hop.vars).into()))
            .collect();
        if let Some(expires) = route.rewrite.expires {
            extra.extend(response::expires(expires, status).map(|(n, v)| (n, v.into())));
        }
        let response =
            Response { status, fields: message::ResponseFields::Upstream(fields), extra, body: Settling::from(body) };
        if let Some(wait) = hold.and_then(|key| self.hold(index, key, &response)) {
            trace.with(|e| e.hold = Some(wait));
        }
        Ok(response)
    }

    /// Says, within its log budget and at the level of its rejection lines, that dry-run
    /// limit `limit` would have refused `src` for repeating the field `field`: a limit on
    /// trial never refuses anything.
    fn repeated_in_dry_run(&self, limit: LimitId, field: &str, src: &KeySource<'_>) {
        let level = line_level(self.config.limits[limit].log_level, false);
        let key = self.limiters().key_hash(limit, src).map_or(0, |k| k.0);
        if self.line_allowed(limit, key, src, level) {
            event_at!(level, limit = %self.config.limits[limit].name, field,
                key = %self.limiters().key_label(limit, src),
                "dry run: request would be refused: repeated key field");
        }
    }

    fn add_ratelimit_headers(&self, response: &mut Response, standings: &[Shown]) {
        let style = self.config.ratelimit_header_style;
        let standings = standings.iter().copied();
        response::add_ratelimit_headers(&mut |name, value| response.set(name, value), standings, &self.quotas, style);
    }

    /// Counts each limit's result (and the key of a refusal, for the dashboard), and
    /// writes one log line per limit that rejected or delayed the request, or would have
    /// in dry run. Delays log one level below rejections, like nginx.
    fn account(&self, route: &Route, results: &[LimitResult], src: &KeySource<'_>, rejected: bool) {
        for r in results {
            let limit = &self.config.limits[r.limit];
            // What another limit refused, this one neither passed nor counted (all or
            // nothing): no decision of its own.
            if !rejected || r.outcome.is_rejected() {
                self.metrics.decision(r);
            }
            if r.banned {
                self.limiters().name_ban(r.limit, r.key, src);
            }
            if let (Outcome::Rejected(_), Some(refused)) = (r.outcome, &self.refused_keys) {
                let label = || self.limiters().key_label(r.limit, src);
                refused[r.limit].count(r.key.0, label);
            }
            let (message, lowered, ms) = match (r.outcome, limit.dry_run) {
                (Outcome::Passed, _) => continue,
                // The request is refused anyway: its delays would not have happened.
                (Outcome::Delayed(_), _) if rejected => continue,
                // A new ban is one line, with the ban's length.
                (Outcome::Rejected(length), false) if r.banned => ("request rejected, key banned", false, length),
                (Outcome::Rejected(after), false) => ("request rejected", false, after),
                (Outcome::Rejected(after), true) => ("dry run: request would be rejected", false, after),
                (Outcome::Delayed(wait), false) => ("request delayed", true, wait),
                (Outcome::Delayed(wait), true) => ("dry run: request would be delayed", true, wait),
            };
            let level = line_level(limit.log_level, lowered);
            if !self.line_allowed(r.limit, r.key.0, src, level) {
                continue;
            }
            let (key, excess, ms) =
                (self.limiters().key_label(r.limit, src), round_to_thousandths(r.excess), ms.as_millis() as u64);
            // Each duration named for what it is: the wait a delay imposes, the time a
            // refused client must let pass before it may retry (a ban's length).
            match (lowered, r.banned) {
                (true, _) => event_at!(level, route = %route.name, limit = %limit.name, key = %key, excess,
                    delay_ms = ms, "{message}"),
                (false, true) => event_at!(level, route = %route.name, limit = %limit.name, key = %key, excess,
                    ban_ms = ms, "{message}"),
                (false, false) => event_at!(level, route = %route.name, limit = %limit.name, key = %key, excess,
                    retry_after_ms = ms, "{message}"),
            }
        }
    }

    /// Logs, at warn and within the limit's `log_lines_per_second`, a request refused
    /// because Redis could not decide global limit `limit` (`on_store_error: deny`).
    fn unavailable(&self, route: &Route, limit: LimitId, src: &KeySource<'_>, error: &str) {
        let key = self.limiters().key_hash(limit, src).map_or(0, |k| k.0);
        if self.line_allowed(limit, key, src, Level::WARN) {
            warn!(route = %route.name, limit = %self.config.limits[limit].name,
                key = %self.limiters().key_label(limit, src), error,
                "request refused: Redis could not decide this global limit (on_store_error: deny)");
        }
    }

    /// Whether a line of `limit` about `src` (its key hashed: `key`) may be written at
    /// `level`: the level is logged and the limit's `log_lines_per_second` is not spent (the summary of a
    /// second that has ended is written first). Nothing is computed for lines nobody
    /// reads: no key label, no budget.
    fn line_allowed(&self, limit: LimitId, key: u64, src: &KeySource<'_>, level: Level) -> bool {
        if !enabled(level) {
            return false;
        }
        let label = || self.limiters().key_label(limit, src);
        let take = self.log_budgets[limit].take(self.gate.clock().now().secs(), key, label);
        if let Some(summary) = take.summary {
            log_summary(level, &self.config.limits[limit].name, &summary);
        }
        take.write
    }
}

/// What the first step of a request ends in.
// Both are moved once, from `admit` to `handle`: boxing either would cost more.
#[allow(clippy::large_enum_variant)]
enum Admission {
    /// The limits passed it: serve it.
    Go(Admitted),
    /// The limits refused it: this is its answer.
    Answer(Response),
}

/// What the admission of a request hands to its serving.
struct Admitted {
    route: RouteId,
    /// How long the limits ask it to wait.
    wait: std::time::Duration,
    /// Where each window stands, for the `RateLimit` fields on its response: kept only
    /// when every response carries them (`ratelimit_headers: all`).
    standings: SmallVec<[Shown; 2]>,
    permits: Permits,
    pending: Pending,
    /// What `hash` balancing goes by.
    balance_key: Option<u64>,
    /// The target sent upstream when the route rewrites the path.
    target: Option<String>,
    /// The client's peer is a trusted proxy: its forwarding fields are extended.
    trusted_peer: bool,
    /// The client's address (`trusted_proxies` applied): `$client_ip`.
    client_ip: IpAddr,
    /// The request is a gRPC call.
    grpc: bool,
    /// The key its route's `upstream_hold` holds it by (boxed: most routes hold none).
    hold: Option<Box<HoldKey>>,
}

/// The request's access log line (if one is written), filled in as the request path
/// finds things out, so that a request whose client leaves before its answer (its
/// future dropped) still logs its client, route and outcome.
struct Trace(Option<Box<access_log::Entry>>);

impl Trace {
    fn with(&mut self, fill: impl FnOnce(&mut access_log::Entry)) {
        if let Some(entry) = &mut self.0 {
            fill(entry);
        }
    }
}

/// `response`, carrying the request's access log line, if it is written: the line is
/// written when the body is done.
fn finish(mut response: Response, trace: Trace, grpc: bool) -> Response {
    if let Trace(Some(mut entry)) = trace {
        entry.status = response.status.as_u16();
        if grpc {
            entry.grpc_status = grpc_status_in_head(&response).map(|c| c.0);
        }
        response.body.receipts().access = Some(entry);
    }
    response
}

/// The `grpc-status` the head of `response` carries (a trailers-only gRPC response), if
/// any.
fn grpc_status_in_head(response: &Response) -> Option<grpc::Code> {
    response.field(&http::HeaderName::from_static("grpc-status")).and_then(grpc::Code::parse)
}

/// The level of a limit's rejection lines (`lowered`: its delay lines, one below, as
/// nginx does with `limit_req_log_level`).
fn line_level(level: LogLevel, lowered: bool) -> Level {
    match (level, lowered) {
        (LogLevel::Error, false) => Level::ERROR,
        (LogLevel::Error, true) | (LogLevel::Warn, false) => Level::WARN,
        (LogLevel::Warn, true) | (LogLevel::Info, false) => Level::INFO,
        (LogLevel::Info, true) | (LogLevel::Debug, false) => Level::DEBUG,
        (LogLevel::Debug, true) => Level::TRACE,
    }
}

/// Whether lines at `level` are written (tracing's callsites need a constant level).
fn enabled(level: Level) -> bool {
    match level {
        Level::ERROR => tracing::enabled!(Level::ERROR),
        Level::WARN => tracing::enabled!(Level::WARN),
        Level::INFO => tracing::enabled!(Level::INFO),
        Level::DEBUG => tracing::enabled!(Level::DEBUG),
        _ => tracing::enabled!(Level::TRACE),
    }
}

/// One line for a second's left-out rejection and delay lines of limit `name`.
fn log_summary(level: Level, limit: &str, summary: &log_budget::Summary) {
    event_at!(level, limit, left_out = summary.left_out, top_keys = %summary.top,
        "rejection and delay lines left out in the last second (log_lines_per_second)");
}

/// Once a second, sums up what each limit left out in a second no later line closed;
/// ends with the proxy that owns the budgets.
async fn flush_log_budgets(
    budgets: std::sync::Weak<TiVec<LimitId, LogBudget>>,
    limits: Vec<(String, Level)>,
    clock: Clock,
) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tick.tick().await;
        let Some(budgets) = budgets.upgrade() else { return };
        let second = clock.now().secs();
        for (budget, (name, level)) in budgets.iter().zip(&limits) {
            if let Some(summary) = budget.flush(second) {
                log_summary(*level, name, &summary);
            }
        }
    }
}

/// `excess` is logged as a number (JSON keeps its type) with three decimals: the
/// nginx-style figure is in requests, and finer digits are float noise.
fn round_to_thousandths(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
#[cfg(test)]
mod tests {
    use super::*;

    /// What a request carries while it is in progress stays small: it is moved into its
    /// box when the request begins, and held by every connection with a request.
    #[tokio::test]
    async fn a_requests_state_stays_small() {
        let config = crate::config::parse("listen: 127.0.0.1:0\nroutes:\n  - respond: { status: 200 }\n", "t").unwrap();
        let proxy = Arc::new(super::Proxy::new(config, KeySecret::draw()).unwrap());
        let headers = http::HeaderMap::new();
        let head = RequestHead {
            method: &http::Method::GET,
            target: "/",
            version: http::Version::HTTP_11,
            authority: None,
            fields: crate::wire::head::Fields::from(&headers),
        };
        let (_stop, stopping) = tokio::sync::watch::channel(());
        let conn = ClientConn::unheld("127.0.0.1:1".parse().unwrap(), stopping);
        let request = proxy.handle(Request { head, framing: Framing::Empty, body: None }, &conn);
        // 1,728 bytes: the upstream's attempt is pinned where it lies, the exchange and the
        // configuration in force are awaited without a future of their own around them,
        // no future on the way keeps its arguments twice, and what is rare is boxed
        // (3,120, then 2,432 before). With the HTTP/1 exchange around it (about 300 bytes
        // more), a request in progress is one block of mimalloc's 2,048-byte class.
        assert!(std::mem::size_of_val(&request) <= 1728, "{} bytes", std::mem::size_of_val(&request));
        assert!(std::mem::size_of::<Response>() <= 512, "response: {} bytes", std::mem::size_of::<Response>());
    }
}
