//! The request path: client address -> route -> keys -> limits -> forward or respond.
//!
//! `Proxy::handle` answers every request, whichever protocol carried it (`message`). The
//! request's state is one `RequestCtx`; two steps fill it in: `admit` (the admission:
//! the head's checks, route and keys, hold, the limits' decision, acted on) and `serve`
//! (the wait, the upstream exchange or static response, what its status settles). A
//! `ProxyError` is turned into its response in one place, and the response is given
//! what waits for its end once (`RequestCtx::settle`). Rejections are not errors: they
//! are a `Decision` answered with a 429.

pub mod body;
mod charge;
pub mod error;
mod log_budget;
mod pace;
pub mod refused_keys;
pub mod response;
mod rewrite;

use std::net::IpAddr;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use tracing::{Level, debug, info, warn};
use typed_index_collections::{TiSlice, TiVec};

use arc_swap::ArcSwapOption;

use crate::access_log::{self, AccessLog, QueueWait};
use crate::admission::hold::{Hold, HoldKey, Holds};
use crate::admission::{self, Asked, AskedBody, Decide, Origin, Refused, Verdict, Way};
use crate::candidate::Candidate;
use crate::clock::Clock;
use crate::config::{Action, Config, HeaderMode, LimitAction, LimitId, LogLevel, Route, RouteId, UpstreamId};
use crate::front::{self, FrontError};
use crate::gate::{Decision, Gate, Pending, Permits};
use crate::grpc;
use crate::hop::{self, Hop};
use crate::jwks;
use crate::limit::queue::{QueueEnd, Queued};
use crate::limit::secret::KeySecret;
use crate::limit::{LimitResult, Limiters, Outcome, Shown};
use crate::metrics::{Metrics, RequestOutcome, UPSTREAM_HOLD, UpstreamResult};
use crate::policy::charge::PriceRow;
use crate::policy::key::KeySource;
use crate::router::Scheme;
use crate::upstream::{self, Outgoing, PeekError, Peeked, UpstreamClient, UpstreamError};
use crate::variables;
use crate::wire::connection::ClientConn;
use crate::wire::head::{Known, RequestHead};
use crate::wire::http1::BodySource;
use crate::wire::http1::parse::Framing;
use crate::wire::message::{self, Request};
use body::{GrpcEnd, Receipts, Response, Settling};
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
    /// What the `RateLimit` field sent upstream says of each limit that annotates.
    annotating_quotas: TiVec<LimitId, Box<[response::Quota]>>,
    /// How many rejection and delay lines each limit may still write.
    log_budgets: Arc<TiVec<LimitId, LogBudget>>,
    access_log: Option<Arc<AccessLog>>,
    /// The keys each limit refused this second, when an admin listener shows them
    /// (`None`: none does, and refusals count nothing more).
    refused_keys: Option<TiVec<LimitId, RefusedKeys>>,
    /// Keys the upstreams refused with a time to wait, per route (`upstream_hold`).
    holds: Holds,
    /// A configuration live beside this one, deciding every request again without
    /// acting on it (`POST /candidate`).
    candidate: ArcSwapOption<Candidate>,
    /// `candidate` holds one: the one test a request pays while none is live (loading
    /// the `ArcSwapOption` costs ~80 instructions, measured).
    candidate_live: AtomicBool,
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
    /// fresh), and metrics continue their series. A candidate live beside `old` stays
    /// beside the new one, unless it is `promoted`: then the limits `old` cannot give
    /// their state take the candidate's.
    pub fn reloaded(
        config: Config,
        old: &Proxy,
        promoted: Option<&Candidate>,
    ) -> std::io::Result<(Self, Vec<String>, Vec<String>)> {
        // Opened first: a log that cannot be opened fails the reload before any state moves.
        let access_log = config.access_log.as_ref().map(|log| AccessLog::open(log, &config)).transpose()?;
        // The old configuration's lookups and health checks end now; its requests in
        // progress finish with the servers as they are.
        for upstream in &old.upstreams {
            upstream.servers().stop();
        }
        let (gate, kept, fresh) = Gate::reloaded(&config, &old.gate, promoted.map(|c| &c.gate));
        let metrics = old.metrics.reloaded(&config, &gate);
        jwks::start(&config, &metrics, old.config.jwt.as_deref());
        let holds = Holds::new(&config, Some((&old.config, &old.holds)));
        let proxy = Proxy::assemble(config, gate, metrics, access_log, holds);
        match promoted {
            None => proxy.set_candidate(old.candidate()),
            // Promoted: no candidate is live any more.
            Some(_) => proxy.metrics.candidate_cleared(),
        }
        Ok((proxy, kept, fresh))
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
            annotating_quotas: response::annotating_quotas(&config.limits),
            holds,
            candidate: ArcSwapOption::empty(),
            candidate_live: AtomicBool::new(false),
            config,
        }
    }

    /// The candidate live beside this configuration, if any.
    pub fn candidate(&self) -> Option<Arc<Candidate>> {
        match self.candidate_live.load(Ordering::Relaxed) {
            true => self.candidate.load_full(),
            false => None,
        }
    }

    /// Puts `candidate` live beside this configuration, in place of the one there was
    /// (`None`: none from now on).
    pub fn set_candidate(&self, candidate: Option<Arc<Candidate>>) {
        self.candidate_live.store(candidate.is_some(), Ordering::Relaxed);
        self.candidate.store(candidate);
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
    pub fn handle<'a>(
        self: Arc<Self>,
        mut request: Request<'a>,
        conn: &'a ClientConn,
    ) -> impl Future<Output = Response> + 'a {
        let mut ctx = RequestCtx::new(&self, &request.head, conn);
        async move {
            // The admission is taken apart before the request is served: an answer already
            // made is not held in the request's state while another is made.
            let body = request.body.as_deref_mut();
            let route = match self.admit(&request.head, request.framing, body, conn, &mut ctx).await {
                Ok(Admission::Go { route, .. }) => route,
                Ok(Admission::Answer(response)) => return ctx.settle(&self.config, None, response),
                Err(e) => {
                    let response = response::error(&e, ctx.grpc);
                    return ctx.settle(&self.config, None, response);
                }
            };
            self.serve(route, &mut request, conn, &mut ctx).await
        }
    }

    /// The first step: the request's admission (`admission::admit`), acted on: what it
    /// found is counted and logged, a refusal or a hold answered here; for a request the
    /// limits pass, `ctx` keeps what `serve` needs (its slots, admissions to settle,
    /// balance key, target, hold key), and the wait they ask for is waited.
    async fn admit(
        &self,
        head: &RequestHead<'_>,
        framing: Framing,
        body: Option<&mut (dyn BodySource + '_)>,
        conn: &ClientConn,
        ctx: &mut RequestCtx,
    ) -> Result<Admission, ProxyError> {
        // Its body read, or Redis decides: boxed, with the admission it reads, so that a
        // request that waits for neither carries the room of neither. (The admission
        // ends with the block: no room is kept for it beside the box.)
        let admission = 'decided: {
            let pending = {
                let mut admitted = self.admission(head, framing, conn);
                // (One match on the verdict: a request its limits pass pays nothing for
                // the queue's check, which only a refusal makes.)
                let later = match &admitted.verdict {
                    Verdict::ReadBody | Verdict::Pending => true,
                    Verdict::Decided(refused @ Decision::Reject { .. }) => self.gate.queue_of(refused).is_some(),
                    Verdict::Decided(Decision::Pass { .. }) | Verdict::Refused(_) | Verdict::Held(_) => false,
                };
                if later || self.candidate_live.load(Ordering::Relaxed) {
                    Box::pin(self.admit_later(admitted, head, framing, body, conn, ctx))
                } else {
                    self.note(&admitted, conn, ctx);
                    break 'decided self.act(&mut admitted, head, conn, ctx, false);
                }
            };
            pending.await
        }?;
        if let Admission::Go { wait, .. } = admission
            && !wait.is_zero()
        {
            // A client that goes away while waiting drops this future here: its request
            // never reaches the upstream and its permits are released. (Boxed: most
            // requests do not wait, nor carry a timer's room.)
            Box::pin(tokio::time::sleep(wait)).await;
        }
        Ok(admission)
    }

    /// The admission of the request (`head`, from `conn`).
    fn admission<'h>(
        &self,
        head: &'h RequestHead<'h>,
        framing: Framing,
        conn: &ClientConn,
    ) -> admission::Admission<'h> {
        admission::admit(&self.config, &self.gate, &asked(head, framing, conn), &self.way())
    }

    /// How the proxy takes the admission's steps: spending, its routes' holds looked at.
    fn way(&self) -> Way<'_> {
        Way { decide: Decide::Spend, holds: Some(&self.holds), drives: None }
    }

    /// The admission `admitted` finished where it waits: for its body's first bytes, read
    /// here (and kept in `ctx`, to be sent first), and for Redis.
    async fn admit_later<'h>(
        &self,
        mut admitted: admission::Admission<'h>,
        head: &'h RequestHead<'h>,
        framing: Framing,
        body: Option<&mut (dyn BodySource + '_)>,
        conn: &ClientConn,
        ctx: &mut RequestCtx,
    ) -> Result<Admission, ProxyError> {
        if let (Verdict::ReadBody, Some(front), Some(body)) = (&admitted.verdict, &admitted.front, body) {
            let route = &self.config.routes[front.route];
            let fields = route.body_fields.clone().unwrap_or_else(|| Arc::from([]));
            let (peek, timeout) = (self.config.server.body_peek, self.config.server.body_read_timeout);
            match upstream::peek(body, fields, peek, route.max_body_bytes, timeout).await {
                Ok(peeked) => {
                    let asked = asked(head, framing, conn);
                    admission::resume(
                        &self.config,
                        &self.gate,
                        &asked,
                        &self.way(),
                        &mut admitted,
                        &peeked.scan,
                        peeked.ended,
                    );
                    ctx.peeked = Some(Box::new(peeked));
                }
                Err(PeekError::TooLarge(length)) => {
                    let limit = route.max_body_bytes.unwrap_or(0);
                    admitted.verdict = Verdict::Refused(Refused::BodyTooLarge { length, limit });
                }
                Err(PeekError::TooSlow(after)) => {
                    let why = format!("no data for {}", humantime::format_duration(after));
                    admission::body_unread(&self.config, &mut admitted, why, true);
                }
                Err(PeekError::Broken(e)) => admission::body_unread(&self.config, &mut admitted, e.to_string(), false),
            }
        }
        self.note(&admitted, conn, ctx);
        if let Verdict::Pending = admitted.verdict {
            let decision = match (&admitted.front, admitted.cost) {
                (Some(front), Some(cost)) => self.gate.decide(&admitted.limits, &front.src, cost).await,
                _ => unreachable!("a pending decision has a route and a cost"),
            };
            admitted.verdict = Verdict::Decided(decision);
        }
        let mut queued = false;
        if let Some(limit) = self.queue_for(&admitted) {
            queued = self.wait_in_queue(&mut admitted, limit, ctx).await;
        }
        if let Some(candidate) = self.candidate() {
            self.judge(&candidate, &admitted, head, framing, conn, ctx).await;
        }
        self.act(&mut admitted, head, conn, ctx, queued)
    }

    /// The limit whose queue the request `admitted` waits in: a refusal by a concurrency
    /// limit with a queue (`Gate::queue_of`).
    fn queue_for(&self, admitted: &admission::Admission<'_>) -> Option<LimitId> {
        match &admitted.verdict {
            Verdict::Decided(decision @ Decision::Reject { .. }) => self.gate.queue_of(decision),
            _ => None,
        }
    }

    /// Brings the request `admitted`, which concurrency limit `limit` has no slot for, to
    /// that limit's queue: handed a slot there, it is decided again by its other limits
    /// (`Gate::decide_holding`); refused there (full, or its wait over), it keeps its
    /// refusal, with the `Retry-After` the queue expects a slot after; its wait ended by
    /// Redis failing (a global limit's), it is decided again by all its limits. A
    /// client that goes away while waiting drops this future: its request leaves the
    /// queue and never reaches the upstream. (Awaited in the boxed part of `admit`: a
    /// request that never queues carries no room for it.) Whether it waited for the slot
    /// it holds.
    async fn wait_in_queue(
        &self,
        admitted: &mut admission::Admission<'_>,
        limit: LimitId,
        ctx: &mut RequestCtx,
    ) -> bool {
        let (Some(front), Some(cost)) = (&admitted.front, admitted.cost) else { return false };
        let since = Instant::now();
        let mut waits = false;
        let priority = self.config.routes[front.route].priority.as_deref();
        let ended = match self.gate.queue(&admitted.limits, &front.src, limit, priority) {
            Queued::Taken(handed) => Ok(handed),
            Queued::Waiting(ticket) => {
                waits = true;
                // Its line, written if its client goes away meanwhile, says so.
                ctx.log(|e| e.queued = Some(QueueWait { since, waited: None, end: QueueEnd::Left.as_str() }));
                ticket.wait().await
            }
            Queued::Refused { end, retry_after } => Err((end, retry_after)),
        };
        let waited = since.elapsed();
        let (class, name) = self.limiters().queue_class(limit, &front.src, priority).unwrap_or((0, ""));
        self.metrics.queue_wait(limit, class, waited);
        if !name.is_empty() {
            ctx.log(|e| e.queue_class = Some(name.to_owned()));
        }
        let end = ended.as_ref().map_or_else(|&(end, _)| end, |_| QueueEnd::Served);
        ctx.log(|e| e.queued = Some(QueueWait { since, waited: Some(waited), end: end.as_str() }));
        let handed = match ended {
            Ok(handed) => Some(handed),
            // Redis failed while it waited for a global slot: decided again.
            Err((QueueEnd::StoreError, _)) => None,
            Err((_, expected)) => {
                if let Verdict::Decided(decision) = &mut admitted.verdict {
                    decision.refused_after(limit, expected);
                }
                return false;
            }
        };
        let served = handed.is_some();
        let decision = self.gate.decide_holding(&admitted.limits, &front.src, cost, handed, waited).await;
        admitted.verdict = Verdict::Decided(decision);
        waits && served
    }

    /// Has the live `candidate` decide the request as well, beside the enforced
    /// admission `admitted` (the body's first bytes it read, if it read any, are the
    /// candidate's too; a body nothing read stays unread: the candidate decides without
    /// its fields). Its decision is logged and tallied, never acted on; the slots it takes
    /// are held with the request's.
    async fn judge(
        &self,
        candidate: &Candidate,
        admitted: &admission::Admission<'_>,
        head: &RequestHead<'_>,
        framing: Framing,
        conn: &ClientConn,
        ctx: &mut RequestCtx,
    ) {
        let mut asked = asked(head, framing, conn);
        asked.body = ctx.peeked.as_deref().map_or(AskedBody::None, |peeked| AskedBody::Given(peeked.scanned()));
        let judged = candidate.judge(&asked, &self.config, self.limiters(), admitted).await;
        ctx.log(|e| (e.candidate, e.candidate_route) = (Some(judged.change.as_str()), judged.rerouted));
        if !judged.permits.is_empty() {
            ctx.candidate = Some(Box::new(judged.permits));
        }
    }

    /// Notes the client and what the front of `admitted` found in `ctx` and its log line.
    fn note(&self, admitted: &admission::Admission<'_>, conn: &ClientConn, ctx: &mut RequestCtx) {
        let config = &self.config;
        (ctx.client_ip, ctx.trusted_peer) = (admitted.client_ip, admitted.trusted_peer);
        ctx.log(|e| e.client = admitted.client_ip);
        if let Some(front) = &admitted.front {
            ctx.log(|e| e.route = Some(config.routes[front.route].name.clone()));
            // What its limits are keyed on, for `simulate` (when the access log records
            // keys), so that a replay refuses as below what was refused here.
            ctx.log(|e| e.record_keys(front.route, front.exempt, &front.src));
            if let Some(error) = &front.invalid_token {
                debug!(peer = %conn.peer, %error, "token not verified: the request goes on without claims");
                self.metrics.invalid_token(error.reason());
            }
            for (limit, field) in &admitted.repeated_dry {
                self.repeated_in_dry_run(*limit, field, &front.src);
            }
        }
    }

    /// Acts on the admission's verdict (decided): a refusal or a hold answered, the
    /// limits' decision counted, logged, and answered or passed on to `serve`. (Read where
    /// it lies: what `serve` needs is taken out of it, the rest is not moved.) `queued`:
    /// the request waited in a queue for the slot it was decided with.
    fn act(
        &self,
        admitted: &mut admission::Admission<'_>,
        head: &RequestHead<'_>,
        conn: &ClientConn,
        ctx: &mut RequestCtx,
        queued: bool,
    ) -> Result<Admission, ProxyError> {
        let config = &self.config;
        if !matches!(admitted.verdict, Verdict::Decided(_)) {
            // Refused before the limits, or held.
            return match std::mem::replace(&mut admitted.verdict, Verdict::Pending) {
                Verdict::Held(held) => Ok(Admission::Answer(self.held(admitted.front.as_ref(), held, ctx))),
                Verdict::Refused(refused) => Err(self.refused(refused, admitted, head, conn, ctx).into()),
                Verdict::Decided(_) | Verdict::Pending | Verdict::ReadBody => unreachable!("decided by `admit`"),
            };
        }
        let (Some(front), Verdict::Decided(decision)) = (&admitted.front, &mut admitted.verdict) else {
            unreachable!("a decision has a route")
        };
        let route = &config.routes[front.route];
        let outcome = RequestOutcome::of(decision, &config.limits).after_queue(queued);
        self.metrics.request(front.route, outcome);
        ctx.log(|e| {
            e.outcome = outcome.as_str();
            let (missing, own) = self.gate.logged(&admitted.limits, &front.src);
            e.missing_key = missing.into_iter().map(|limit| config.limits[limit].name.clone()).collect();
            e.own_counts = own.into_iter().map(|(limit, count)| (config.limits[limit].name.clone(), count)).collect();
        });
        match decision {
            Decision::Reject { limit, results, store_error, .. } => {
                match store_error {
                    // Not a limit's refusal: no limit item in the headers, no decision counted.
                    Some(error) => self.unavailable(route, *limit, &front.src, error),
                    None => {
                        self.account(route, results, &front.src, true);
                        if ctx.grpc {
                            self.metrics.grpc(front.route, Some(config.limits[*limit].grpc_status));
                        }
                    }
                }
                let response = response::refusal(config, &self.quotas, decision, ctx.grpc);
                Ok(Admission::Answer(response.expect("a rejection is answered")))
            }
            Decision::Pass { wait, results, standings, permits, pending, .. } => {
                self.account(route, results, &front.src, false);
                let target = rewrite::target(&route.rewrite, &front.src.path, &front.src.captures, head.query());
                ctx.target = target.map(String::into_boxed_str);
                ctx.balance_key = match &route.action {
                    // (A key of 0 is balanced as 1: one word in the request's state.)
                    Action::Forward(upstream) => (self.upstreams[*upstream].servers().balance_key(&front.src))
                        .map(|k| NonZeroU64::new(k).unwrap_or(NonZeroU64::MIN)),
                    Action::Respond(_) => None,
                };
                if config.ratelimit_headers == HeaderMode::All {
                    ctx.standings = standings.iter().map(Shown::from).collect();
                }
                if config.annotating {
                    let quotas = &self.annotating_quotas;
                    ctx.annotation =
                        response::Annotation::of(results, standings, &route.listed, &config.limits, quotas);
                }
                (ctx.permits, ctx.pending) = (std::mem::take(permits), std::mem::take(pending));
                ctx.prices = ctx.pending.prices(&front.src);
                if !ctx.prices.is_empty() {
                    let named = |&(limit, row): &(LimitId, PriceRow)| {
                        let table = config.limits[limit].charge.as_ref()?.prices.as_ref()?;
                        Some((config.limits[limit].name.clone(), table.name(row)))
                    };
                    let priced_as = ctx.prices.iter().filter_map(named).collect();
                    ctx.log(|e| e.priced_as = priced_as);
                }
                // Boxed: it is held across the exchange, and most routes hold none.
                ctx.hold = admitted.hold.take().map(Box::new);
                Ok(Admission::Go { route: front.route, wait: *wait })
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
        ctx: &mut RequestCtx,
    ) -> Refused {
        let outcome = refused.outcome();
        ctx.log(|e| e.outcome = outcome);
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
            Refused::BodyUnread { limit, why, .. } => debug!(limit, why, "request body not read for its fields"),
            Refused::MissingKey { limit, id, .. } => {
                // Counted as missing (a dry-run limit refuses nothing: the gate counts the
                // request, as one it skips).
                if let Some(front) = &admitted.front {
                    self.limiters().missed(*id, &front.src);
                }
                debug!(limit, "request without the limit's key refused");
                ctx.log(|entry| entry.missing_key = vec![limit.clone()]);
            }
        }
        refused
    }

    /// The second step, for a request its limits passed on route `index` (and its wait
    /// over): the upstream exchange (or the static response), and what the response's
    /// status settles.
    async fn serve(
        &self,
        index: RouteId,
        request: &mut Request<'_>,
        conn: &ClientConn,
        ctx: &mut RequestCtx,
    ) -> Response {
        let route = &self.config.routes[index];
        // Only what the exchange reads is kept while it lasts (each named local would be
        // kept beside it).
        let response = match &route.action {
            Action::Respond(r) => Ok(response::static_response(r, &ctx.vars(&request.head, conn))),
            Action::Forward(upstream) => {
                let hop = Hop {
                    peer: conn.peer.ip(),
                    trusted_peer: ctx.trusted_peer,
                    tls: conn.tls,
                    forwarded: self.config.forwarded,
                    upgrade: hop::upgrade_protocol(request.head.version, request.head.fields),
                    rewrite: &route.rewrite,
                    authority: request.head.authority.map(str::as_bytes),
                    underscores: self.config.server.underscores_in_headers,
                    vars: ctx.vars(&request.head, conn),
                    annotating: self.config.annotating.then(|| self.config.annotation_field.as_str().as_bytes()),
                    annotation: ctx.annotation.as_deref().map(response::Annotation::fields),
                };
                let out = Outgoing {
                    head: &request.head,
                    target: ctx.target.as_deref().unwrap_or(request.head.target),
                    framing: request.framing,
                    hop,
                    host: &route.rewrite.upstream_host,
                    balance_key: ctx.balance_key.map(NonZeroU64::get),
                };
                let (limit, timeout) = (route.max_body_bytes, self.config.server.body_read_timeout);
                let peeked = ctx.peeked.take();
                let mut body = (request.body.as_deref_mut())
                    .map(|b| upstream::RequestBody::new(b, limit, timeout).with_peeked(peeked));
                let started = Instant::now();
                let forwarded = self.upstreams[*upstream].forward(&out, body.as_mut()).await;
                if let Ok(answer) = &forwarded {
                    // An adaptive ceiling learns the upstream's time, not the client's; an
                    // upstream that says it is overloaded brings it down.
                    ctx.permits.answered(matches!(answer.status.as_u16(), 429 | 503));
                }
                self.forwarded(forwarded, started, &out, index, ctx.hold.as_deref(), &mut ctx.log)
            }
        };
        if let Some(global) = self.counted(index, &response, ctx) {
            global.await;
        }
        match response {
            Ok(mut response) => {
                if self.config.ratelimit_headers == HeaderMode::All {
                    self.add_ratelimit_headers(&mut response, &ctx.standings);
                }
                ctx.settle(&self.config, Some(index), response)
            }
            // Each fault was logged where it happened, with what it concerned.
            Err(e) => {
                let response = response::error(&e, ctx.grpc);
                ctx.settle(&self.config, None, response)
            }
        }
    }

    /// The request's status is known (`response`): limits that count only some statuses
    /// keep or take back its admission (a gRPC call whose status comes in its trailers: at
    /// its end, `GrpcEnd`), and limits that charge what the response reports are given its
    /// meter. What is to be settled in Redis is returned, to be awaited.
    fn counted(
        &self,
        index: RouteId,
        response: &Result<Response, ProxyError>,
        ctx: &mut RequestCtx,
    ) -> Option<BoxFuture<'static, ()>> {
        let mut status = response.as_ref().map_or_else(|e| e.status(), |r| r.status).as_u16();
        // Read as the response passes (boxed: most responses have none).
        ctx.meter = match response {
            Ok(r) => {
                let row = |limit| ctx.prices.iter().find(|(l, _)| *l == limit).map(|(_, row)| *row);
                Meter::new(ctx.pending.charging().map(|(limit, charge)| (limit, charge, row(limit))), r).map(Box::new)
            }
            Err(_) => None,
        };
        if ctx.grpc {
            // A gRPC call counts by its gRPC status: that of a trailers-only answer's head,
            // or else that of its trailers, at the end of its body.
            let in_head = match response {
                Ok(r) => grpc_status_in_head(r),
                Err(e) => Some(e.grpc_code()),
            };
            match (in_head, response) {
                (Some(code), _) => {
                    self.metrics.grpc(index, Some(code));
                    status = grpc::counted_status(code);
                }
                (None, Ok(_)) => {
                    let (pending, metrics) = (std::mem::take(&mut ctx.pending), Arc::clone(&self.metrics));
                    ctx.grpc_end = Some(Box::new(GrpcEnd { pending, metrics, route: index, status }));
                }
                (None, Err(_)) => {}
            }
        }
        let (global, charges) = std::mem::take(&mut ctx.pending).settle(status);
        if let Some(meter) = &mut ctx.meter {
            meter.charges = charges;
        }
        global
    }

    /// The answer to a request whose key its route holds (`held`): the upstream asked
    /// for none of its requests until then.
    fn held(&self, front: Option<&front::Front<'_>>, held: Hold, ctx: &mut RequestCtx) -> Response {
        let left = held.until.since(self.gate.clock().now());
        if let Some(front) = front {
            let route = &self.config.routes[front.route].name;
            debug!(%route, key = %held.key, status = held.status.as_u16(), "held: the upstream asked to wait");
            self.metrics.hold(front.route, true);
            self.metrics.answered_early(Some(front.route), UPSTREAM_HOLD);
        }
        ctx.log(|e| e.outcome = UPSTREAM_HOLD);
        response::held(&held, left, self.config.rejection_body, ctx.grpc)
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
    /// exchange counted in the route's metrics and its `log` line, a refusal held by
    /// `hold` (the request's key, if the route holds), and the response to send on.
    fn forwarded(
        &self,
        forwarded: Result<upstream::Answer, UpstreamError>,
        started: Instant,
        out: &Outgoing<'_>,
        index: RouteId,
        hold: Option<&HoldKey>,
        log: &mut Option<Box<access_log::Entry>>,
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
        if let Some(entry) = log {
            entry.upstream = Some(took);
        }
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
        if let (Some(wait), Some(entry)) = (hold.and_then(|key| self.hold(index, key, &response)), log) {
            entry.hold = Some(wait);
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
    /// writes one log line per limit that rejected, delayed or (over it) annotated the
    /// request, or would have in dry run. Delays log one level below rejections, like
    /// nginx.
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
            // Over it, a soft limit forwards the request annotated rather than refuse it.
            let soft = limit.action == LimitAction::Annotate;
            let (message, lowered, ms) = match (r.outcome, limit.dry_run) {
                // Annotated below the limit (`annotate_from`): counted, said only on trial.
                (Outcome::Passed, true) if r.annotated => ("dry run: request would be annotated", true, None),
                (Outcome::Passed, _) => continue,
                // The request is refused anyway: its delays and annotations would not
                // have happened.
                (Outcome::Delayed(_), _) if rejected => continue,
                (Outcome::Rejected(_), false) if soft && rejected => continue,
                // A new ban is one line, with the ban's length.
                (Outcome::Rejected(length), false) if r.banned => ("request rejected, key banned", false, Some(length)),
                (Outcome::Rejected(after), false) if soft => {
                    ("request over the limit: forwarded annotated", false, Some(after))
                }
                (Outcome::Rejected(after), false) => ("request rejected", false, Some(after)),
                (Outcome::Rejected(after), true) if soft => ("dry run: request would be annotated", false, Some(after)),
                (Outcome::Rejected(after), true) => ("dry run: request would be rejected", false, Some(after)),
                (Outcome::Delayed(wait), false) => ("request delayed", true, Some(wait)),
                (Outcome::Delayed(wait), true) => ("dry run: request would be delayed", true, Some(wait)),
            };
            let level = line_level(limit.log_level, lowered);
            if !self.line_allowed(r.limit, r.key.0, src, level) {
                continue;
            }
            let (key, excess) = (self.limiters().key_label(r.limit, src), round_to_thousandths(r.excess));
            // Each duration named for what it is: the wait a delay imposes, the time a
            // refused client must let pass before it may retry (a ban's length); an
            // annotation below the limit has none.
            match (ms.map(|ms| ms.as_millis() as u64), lowered, r.banned) {
                (None, ..) => event_at!(level, route = %route.name, limit = %limit.name, key = %key, excess,
                    "{message}"),
                (Some(ms), true, _) => event_at!(level, route = %route.name, limit = %limit.name, key = %key, excess,
                    delay_ms = ms, "{message}"),
                (Some(ms), false, true) => event_at!(level, route = %route.name, limit = %limit.name, key = %key,
                    excess, ban_ms = ms, "{message}"),
                (Some(ms), false, false) => event_at!(level, route = %route.name, limit = %limit.name, key = %key,
                    excess, retry_after_ms = ms, "{message}"),
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
enum Admission {
    /// The limits passed it, on this route, once it has waited as they ask: serve it.
    Go { route: RouteId, wait: Duration },
    /// The limits refused it, or its key is held: this is its answer.
    Answer(Response),
}

/// One request on its way through the proxy: made by `handle` when its head arrives,
/// filled in by `admit` with what the admission found and what the request holds, read
/// by `serve`, and handed whole to its response (`settle`), which carries what must
/// wait for the response's end. A request whose client leaves first drops it, and what
/// it holds goes back as it drops.
struct RequestCtx {
    /// The request is a gRPC call: what sluicegate answers itself is a gRPC response.
    grpc: bool,
    /// The client's address (`trusted_proxies` applied): `$client_ip`.
    client_ip: IpAddr,
    /// The client's peer is a trusted proxy: its forwarding fields are extended.
    trusted_peer: bool,
    /// Where each window stands, for the `RateLimit` fields on its response: kept only
    /// when every response carries them (`ratelimit_headers: all`).
    standings: Box<[Shown]>,
    /// Its concurrency slots, held until its response has been sent.
    permits: Permits,
    /// Admissions its status keeps or takes back (`count:`), and those it is charged for.
    pending: Pending,
    /// The row of their prices each of its money budgets charges it at.
    prices: Box<[(LimitId, PriceRow)]>,
    /// What `hash` balancing goes by.
    balance_key: Option<NonZeroU64>,
    /// The target sent upstream when the route rewrites the path.
    target: Option<Box<str>>,
    /// The key its route's `upstream_hold` holds it by (boxed: most routes hold none).
    hold: Option<Box<HoldKey>>,
    /// Its access log line (if one is written), filled in as the request path finds
    /// things out, so that a request whose client leaves before its answer still logs
    /// its client, route and outcome.
    log: Option<Box<access_log::Entry>>,
    /// What its soft limits tell its upstream (boxed: most requests carry none).
    annotation: Option<Box<response::Annotation>>,
    /// What its response reports it cost, read as it passes (`charge:`).
    meter: Option<Box<Meter>>,
    /// A gRPC call whose status comes in its trailers: what its end settles.
    grpc_end: Option<Box<GrpcEnd>>,
    /// Its body's first bytes, read before its admission (`json:` keys), to be sent first.
    peeked: Option<Box<Peeked>>,
    /// The slots a live candidate holds for it.
    candidate: Option<Box<Permits>>,
}

impl RequestCtx {
    fn new(proxy: &Proxy, head: &RequestHead<'_>, conn: &ClientConn) -> Self {
        let (peer, scheme) = (conn.peer.ip(), Scheme::of(conn.tls));
        RequestCtx {
            grpc: grpc::is_grpc(head.fields.first_of(Known::ContentType)),
            client_ip: peer,
            trusted_peer: false,
            standings: Box::default(),
            permits: Permits::default(),
            pending: Pending::default(),
            prices: Box::default(),
            balance_key: None,
            target: None,
            hold: None,
            log: proxy.access_log.as_ref().map(|log| access_log::Entry::begin(log, head, peer, scheme)),
            annotation: None,
            meter: None,
            grpc_end: None,
            peeked: None,
            candidate: None,
        }
    }

    /// The request's variables (`$client_ip`, `$host`, ...), for what the route writes.
    fn vars<'r>(&self, head: &'r RequestHead<'_>, conn: &ClientConn) -> variables::Request<'r> {
        variables::Request {
            client_ip: self.client_ip,
            host: head.fields.first_of(Known::Host).or(head.authority.map(str::as_bytes)),
            target: head.target.as_bytes(),
            tls: conn.tls,
        }
    }

    /// Fills in the access log line, if one is written.
    fn log(&mut self, fill: impl FnOnce(&mut access_log::Entry)) {
        if let Some(entry) = &mut self.log {
            fill(entry);
        }
    }

    /// `response`, the request's answer (`served`: by this route, its limits passed),
    /// given what waits for its end, taken from here: the slots, the log line (its status
    /// now known), a gRPC call's end, the meter; and the route's pace, the upstream's
    /// tunnel timeout.
    fn settle(&mut self, config: &Config, served: Option<RouteId>, mut response: Response) -> Response {
        let route = served.map(|index| &config.routes[index]);
        // A tunnel is not paced: its bytes are no response body.
        let pace = route.and_then(|r| r.body_rate).filter(|_| response.status != http::StatusCode::SWITCHING_PROTOCOLS);
        let mut log = self.log.take();
        if let Some(entry) = &mut log {
            entry.status = response.status.as_u16();
            if self.grpc {
                entry.grpc_status = grpc_status_in_head(&response).map(|c| c.0);
            }
        }
        let tunnel_idle_timeout = match route.map(|r| &r.action) {
            Some(Action::Forward(upstream)) => config.upstreams[*upstream].tunnel_idle_timeout,
            _ => Receipts::TUNNEL_IDLE_TIMEOUT,
        };
        let receipts = Receipts {
            permits: std::mem::take(&mut self.permits),
            access: log,
            tunnel_idle_timeout,
            grpc_end: self.grpc_end.take(),
            meter: self.meter.take(),
            candidate: self.candidate.take(),
        };
        response.body.carry(receipts, pace);
        response
    }
}

/// The request `head` on `conn`, as the admission reads it: from the wire, its body
/// unread.
fn asked<'h>(head: &'h RequestHead<'h>, framing: Framing, conn: &ClientConn) -> Asked<'h> {
    let declared = if let Framing::Length(length) = framing { Some(length) } else { None };
    let body = if matches!(framing, Framing::Empty) { AskedBody::None } else { AskedBody::Unread };
    Asked { head, peer: conn.peer.ip(), declared, scheme: Scheme::of(conn.tls), origin: Origin::Wire, body }
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
    /// box when the request begins.
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
        // The request's state is one box a request (the HTTP/1 exchange around this
        // future, 304 bytes more; HTTP/2's stream task), its size decided here once: 1,744
        // bytes now, the exchange's box in mimalloc's 2,048-byte class. The bound is the
        // goal (a request in progress within 4 KiB, its upstream connection aside), not
        // today's figure: a change of the request path may take some room.
        let size = std::mem::size_of_val(&request);
        assert!(size <= 3584, "{size} bytes");
        assert!(std::mem::size_of::<Response>() <= 512, "response: {} bytes", std::mem::size_of::<Response>());
    }
}
