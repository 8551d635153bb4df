//! Prometheus metrics, served on the admin listener's `/metrics`.
//!
//! Counters the request path bumps are created once per route and limit at start, so a
//! request costs a few atomic increments and no label lookup. What the limiters and the
//! Redis store already count (keys held, evictions, bans, store errors) is read when
//! `/metrics` is scraped. Labels are route and limit names and fixed words, never key
//! values or client addresses, so the number of series is bounded by the configuration.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use typed_index_collections::{TiSlice, TiVec};

use crate::admission::Refused;
use crate::config::{Config, Limit, LimitAction, LimitId, RouteId};
use crate::gate::{Decision, Gate};
use crate::limit::queue::QueueEnd;
use crate::limit::tenant::Tally;
use crate::limit::{LimitResult, Limiters, Outcome};
use crate::store::Store;

type Labels = Vec<(&'static str, String)>;

/// Where an upstream's lookups are counted (`sluicegate_upstream_resolve_failures_total`,
/// `sluicegate_upstream_addresses`).
#[derive(Clone, Default)]
pub struct ResolveMetrics {
    pub failures: Counter,
    pub addresses: Gauge,
}

/// Where an upstream's pool counts its connections and its waits
/// (`sluicegate_upstream_idle_connections`, `…_connections_in_use`,
/// `…_connections_opened_total`, `…_idle_closed_total`, `…_queued_total`,
/// `…_full_total`).
#[derive(Clone, Default)]
pub struct PoolMetrics {
    /// Idle connections kept now, to all the upstream's servers.
    pub idle: Gauge,
    /// Connections lent to exchanges now.
    pub in_use: Gauge,
    /// Connections opened (HTTP/1.1 and HTTP/2): per request, the pool's churn.
    pub opened: Counter,
    /// Idle connections closed by the pool, by why (`Closed`).
    pub idle_closed: [Counter; 3],
    /// Requests that found every server at `max_conns` and waited.
    pub queued: Counter,
    /// Of those, the ones that waited `queue_timeout` in vain (`503`).
    pub full: Counter,
}

/// Why the pool closed an idle connection (`reason` of
/// `sluicegate_upstream_idle_closed_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closed {
    /// Given back past `keepalive` idle ones.
    Keepalive,
    /// Idle beyond what the load lately needed.
    Surplus,
    /// Idle for longer than the idle timeout.
    Timeout,
}

impl Closed {
    const ALL: [Closed; 3] = [Closed::Keepalive, Closed::Surplus, Closed::Timeout];

    fn label(self) -> &'static str {
        match self {
            Closed::Keepalive => "keepalive",
            Closed::Surplus => "surplus",
            Closed::Timeout => "timeout",
        }
    }
}

impl PoolMetrics {
    /// Counts `n` idle connections closed for `why`.
    pub fn closed(&self, why: Closed, n: usize) {
        if n > 0 {
            self.idle_closed[why as usize].inc_by(n as u64);
        }
    }
}

/// What became of a request, for `sluicegate_requests_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestOutcome {
    Passed,
    /// Passed after a wait: a rate limit's delay, or a concurrency limit's queue.
    Delayed,
    Rejected,
    /// Rejected, and the rejection started a ban.
    Banned,
    /// Passed only because the limits that would have refused it are in dry run.
    DryRunRejected,
    /// Forwarded with `RateLimit-Exceeded` (soft limits): over a limit with `action:
    /// annotate`, or at or above a limit's `annotate_from`; not delayed.
    Annotated,
    /// Refused (503) because Redis could not decide a global limit with
    /// `on_store_error: deny`: no limit refused it.
    StoreError,
}

impl RequestOutcome {
    /// This outcome of a request that `waited` in a concurrency limit's queue for its
    /// slot (or did not): passed after a wait is delayed. (Not looked for by `of`, which
    /// every request pays for: its reader knows.)
    pub fn after_queue(self, waited: bool) -> RequestOutcome {
        match self {
            RequestOutcome::Passed | RequestOutcome::Annotated if waited => RequestOutcome::Delayed,
            other => other,
        }
    }

    const ALL: [RequestOutcome; 7] = [
        RequestOutcome::Passed,
        RequestOutcome::Delayed,
        RequestOutcome::Rejected,
        RequestOutcome::Banned,
        RequestOutcome::DryRunRejected,
        RequestOutcome::StoreError,
        RequestOutcome::Annotated,
    ];

    /// The outcomes of requests forwarded (or answered by their route), as every outcome
    /// names them: what `verify` counts as admitted and a synthetic run as sent on.
    pub const ADMITTED: [&'static str; 4] = ["passed", "delayed", "dry_run_rejected", "annotated"];

    /// What `decision` makes of a request, the configuration's limits being `limits`.
    /// Of a passed request, the first that holds names it: a limit in dry run would have
    /// refused it (`dry_run_rejected`), it waits (`delayed`), a limit annotates it
    /// (`annotated`), else `passed`.
    #[inline]
    pub fn of(decision: &Decision, limits: &TiSlice<LimitId, Limit>) -> RequestOutcome {
        match decision {
            Decision::Reject { store_error: Some(_), .. } => RequestOutcome::StoreError,
            Decision::Reject { results, .. } => {
                let banned = results.iter().any(|r| r.banned && limits[r.limit].refuses());
                if banned { RequestOutcome::Banned } else { RequestOutcome::Rejected }
            }
            Decision::Pass { wait, results, .. } => {
                // One pass, the limit read only for a result over it (in a passed request:
                // in dry run, or annotating, which would not have refused) or annotated.
                let (mut dry_rejected, mut annotated) = (false, false);
                for r in results.iter().filter(|r| r.annotated || r.outcome.is_rejected()) {
                    let limit = &limits[r.limit];
                    dry_rejected |= r.outcome.is_rejected() && limit.action == LimitAction::Refuse;
                    annotated |= r.annotated && !limit.dry_run;
                }
                match (dry_rejected, wait.is_zero(), annotated) {
                    (true, ..) => RequestOutcome::DryRunRejected,
                    (false, false, _) => RequestOutcome::Delayed,
                    (false, true, true) => RequestOutcome::Annotated,
                    (false, true, false) => RequestOutcome::Passed,
                }
            }
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RequestOutcome::Passed => "passed",
            RequestOutcome::Delayed => "delayed",
            RequestOutcome::Rejected => "rejected",
            RequestOutcome::Banned => "banned",
            RequestOutcome::DryRunRejected => "dry_run_rejected",
            RequestOutcome::StoreError => "store_error",
            RequestOutcome::Annotated => "annotated",
        }
    }
}

/// How an exchange with the upstream ended, for the upstream metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpstreamResult {
    /// Response headers arrived with this status.
    Status(u16),
    /// Refused, unreachable or timed out while connecting.
    ConnectError,
    /// No response headers within the upstream's `timeout`.
    Timeout,
    /// The exchange failed after connecting (reset, malformed response).
    Failed,
    /// The client's request body failed (broken, too large, too slow): not the upstream's
    /// fault.
    ClientBody,
}

/// The outcome of a request answered from a hold its upstream asked for.
pub const UPSTREAM_HOLD: &str = "upstream_hold";

/// The outcomes of requests answered before their limits decided them.
const EARLY: [&str; Refused::OUTCOMES.len() + 1] = {
    let mut early = [UPSTREAM_HOLD; Refused::OUTCOMES.len() + 1];
    let mut i = 0;
    while i < Refused::OUTCOMES.len() {
        early[i] = Refused::OUTCOMES[i];
        i += 1;
    }
    early
};

const DECISIONS: [&str; 3] = ["passed", "delayed", "rejected"];
const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];
const UPSTREAM_ERRORS: [&str; 4] = ["connect", "timeout", "failed", "client_body"];

/// A route's series, made on its first request: a configuration of 100,000 routes holds
/// no 2,000,000 series of zeros (in memory and in every scrape) for routes never asked for.
struct RouteMetrics {
    name: String,
    series: OnceLock<Box<RouteSeries>>,
}

#[derive(Clone)]
struct RouteSeries {
    requests: [Counter; RequestOutcome::ALL.len()],
    responses: [Counter; STATUS_CLASSES.len()],
    errors: [Counter; UPSTREAM_ERRORS.len()],
    latency: Histogram,
    /// Requests answered before their limits decided, by `EARLY`: made on first use
    /// (most routes never see one), then counted without a lookup (a flood of bad
    /// tokens is counted as cheaply as it is refused).
    early: [OnceLock<Counter>; EARLY.len()],
}

struct LimitMetrics {
    decisions: [Counter; DECISIONS.len()],
    delay: Histogram,
    /// How long requests waited in its queue, if it has one.
    /// Per class of its queue (one without classes; none without a queue).
    queue_wait: Vec<Histogram>,
}

/// The counters of one configuration's routes and limits, made from the families that
/// every configuration since start shares, so that a reload continues each series.
pub struct Metrics {
    families: Arc<Families>,
    routes: TiVec<RouteId, RouteMetrics>,
    no_route: Counter,
    /// As a route's `early`, for requests refused before a route was found.
    unrouted: [OnceLock<Counter>; EARLY.len()],
    limits: TiVec<LimitId, LimitMetrics>,
    reloads: [Counter; 2],
}

/// The registry and its metric families, kept across reloads.
struct Families {
    registry: Registry,
    requests: Family<Labels, Counter>,
    responses: Family<Labels, Counter>,
    errors: Family<Labels, Counter>,
    latency: Family<Labels, Histogram>,
    decisions: Family<Labels, Counter>,
    delays: Family<Labels, Histogram>,
    queue_waits: Family<Labels, Histogram>,
    reloads: Family<Labels, Counter>,
    resolve_failures: Family<Labels, Counter>,
    addresses: Family<Labels, Gauge>,
    grpc: Family<Labels, Counter>,
    invalid_tokens: Family<Labels, Counter>,
    /// Keys held after the upstream refused them, and requests answered from a hold.
    holds: Family<Labels, Counter>,
    held: Family<Labels, Counter>,
    state_writes: Family<Labels, Counter>,
    /// What a live candidate decides differently, by limit and change; and the requests
    /// it routes elsewhere.
    candidate_decisions: Family<Labels, Counter>,
    candidate_rerouted: Family<Labels, Counter>,
    pool: PoolFamilies,
    /// What the scrape-time collector reads: the running configuration's limiters.
    current: Arc<Mutex<Current>>,
}

/// The families of `PoolMetrics`, by upstream.
#[derive(Default)]
struct PoolFamilies {
    idle: Family<Labels, Gauge>,
    in_use: Family<Labels, Gauge>,
    opened: Family<Labels, Counter>,
    idle_closed: Family<Labels, Counter>,
    queued: Family<Labels, Counter>,
    full: Family<Labels, Counter>,
}

/// `family`, registered in `registry` as `name` with `help`.
fn registered<M>(registry: &mut Registry, name: &str, help: &str, family: Family<Labels, M>) -> Family<Labels, M>
where
    Family<Labels, M>: prometheus_client::registry::Metric + Clone,
{
    registry.register(name, help, family.clone());
    family
}

/// A family of counters, registered.
fn counters(registry: &mut Registry, name: &str, help: &str) -> Family<Labels, Counter> {
    registered(registry, name, help, Family::default())
}

/// A family of gauges, registered.
fn gauges(registry: &mut Registry, name: &str, help: &str) -> Family<Labels, Gauge> {
    registered(registry, name, help, Family::default())
}

impl PoolFamilies {
    fn registered(r: &mut Registry) -> PoolFamilies {
        PoolFamilies {
            idle: gauges(
                r,
                "upstream_idle_connections",
                "Idle connections kept open to an upstream's servers, by upstream",
            ),
            in_use: gauges(
                r,
                "upstream_connections_in_use",
                "Connections to an upstream's servers lent to requests now, by upstream",
            ),
            opened: counters(
                r,
                "upstream_connections_opened",
                "Connections opened to an upstream's servers, by upstream (per request: the pool's churn)",
            ),
            idle_closed: counters(
                r,
                "upstream_idle_closed",
                "Idle connections the pool closed, by upstream and reason: keepalive (given back past `keepalive`), \
                 surplus (beyond what the load lately needed), timeout (idle past 60 s)",
            ),
            queued: counters(
                r,
                "upstream_queued",
                "Requests that found every server at `max_conns` and waited for room, by upstream",
            ),
            full: counters(
                r,
                "upstream_full",
                "Requests answered 503: every server stayed at `max_conns` for `queue_timeout`, by upstream",
            ),
        }
    }
}

impl Metrics {
    pub fn new(config: &Config, gate: &Gate) -> Metrics {
        let mut registry = Registry::with_prefix("sluicegate");
        let r = &mut registry;
        let requests = counters(
            r,
            "requests",
            "Requests by route and outcome (no_route: no route matched; bad_request, bad_path: refused before a route was found)",
        );
        let decisions = counters(r, "limit_decisions", "Decisions of each limit, dry-run limits included");
        let delays = registered(
            r,
            "limit_delay_seconds",
            "Delays asked by each limit",
            Family::new_with_constructor(delay_histogram as fn() -> Histogram),
        );
        let queue_waits = registered(
            r,
            "limit_queue_wait_seconds",
            "How long requests waited in each concurrency limit's queue, by class (\"\": a queue without classes), \
             however the wait ended",
            Family::new_with_constructor(delay_histogram as fn() -> Histogram),
        );
        let responses = counters(r, "upstream_responses", "Upstream responses by route and status class");
        let errors = counters(r, "upstream_errors", "Upstream exchanges that got no response, by route and kind");
        let latency = registered(
            r,
            "upstream_duration_seconds",
            "Time to the upstream's response headers",
            Family::new_with_constructor(latency_histogram as fn() -> Histogram),
        );
        let resolve_failures = counters(
            r,
            "upstream_resolve_failures",
            "Lookups of upstream server host names that failed or found no address, by upstream",
        );
        let addresses = gauges(
            r,
            "upstream_addresses",
            "Addresses an upstream's servers resolve to now, each a server, by upstream",
        );
        let grpc = counters(
            r,
            "grpc_responses",
            "gRPC calls by route and the grpc-status they ended with (NONE: without one)",
        );
        let pool = PoolFamilies::registered(r);
        let invalid_tokens = counters(
            r,
            "invalid_tokens",
            "Requests whose token did not verify, by reason: refused (401) or taken without claims (on_invalid_token)",
        );
        let holds = counters(
            r,
            "upstream_holds",
            "Keys held by each route after its upstream refused them with a time to wait (upstream_hold)",
        );
        let held = counters(
            r,
            "upstream_held_requests",
            "Requests answered by each route from a hold of its upstream's refusal, unsent (upstream_hold)",
        );
        let state_writes =
            counters(r, "state_writes", "Writes of a persisted limit's state file, by limit and result (ok, failed)");
        let reloads = counters(r, "reloads", "Configuration reloads by result");
        let candidate_decisions = counters(
            r,
            "candidate_decisions",
            "Requests the live candidate decided, by limit and change from the enforced decision (refused: the candidate's limit would refuse what the enforced admits; admitted: the other way; same), since it was loaded",
        );
        let candidate_rerouted = counters(
            r,
            "candidate_rerouted",
            "Requests the live candidate would route elsewhere, by route and candidate_route (-: none), since it was loaded",
        );
        let build = gauges(r, "build_info", "The running version");
        build.get_or_create(&vec![("version", env!("CARGO_PKG_VERSION").to_owned())]).set(1);
        let current = Arc::new(Mutex::new(Current::of(config, gate)));
        let started = Gauge::<i64>::default();
        let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        started.set(i64::try_from(since_epoch.as_secs()).unwrap_or(i64::MAX));
        registry.register("start_time_seconds", "When this process started, in seconds since the Unix epoch", started);
        registry.register_collector(Box::new(State(Arc::clone(&current))));
        let families = Families {
            registry,
            requests,
            responses,
            errors,
            latency,
            decisions,
            delays,
            queue_waits,
            reloads,
            resolve_failures,
            addresses,
            grpc,
            invalid_tokens,
            holds,
            held,
            state_writes,
            candidate_decisions,
            candidate_rerouted,
            pool,
            current,
        };
        Metrics::of(Arc::new(families), config)
    }

    /// `sluicegate_candidate_decisions_total` of limit `name`, one series per change.
    pub fn candidate_series(&self, name: &str, changes: [&str; 3]) -> [Counter; 3] {
        changes.map(|change| {
            let labels = vec![("limit", name.to_owned()), ("change", change.to_owned())];
            self.families.candidate_decisions.get_or_create_owned(&labels)
        })
    }

    /// Counts a request the candidate routes to `to` rather than `from`.
    pub fn candidate_rerouted(&self, from: &str, to: &str) {
        let labels = vec![("route", from.to_owned()), ("candidate_route", to.to_owned())];
        self.families.candidate_rerouted.get_or_create(&labels).inc();
    }

    /// A candidate is loaded, or none is live any more: its series start again.
    pub fn candidate_cleared(&self) {
        self.families.candidate_decisions.clear();
        self.families.candidate_rerouted.clear();
    }

    /// The metrics of a reloaded `config`, continuing every series of this one.
    pub fn reloaded(&self, config: &Config, gate: &Gate) -> Metrics {
        let mut current = self.families.current.lock().unwrap_or_else(PoisonError::into_inner);
        *current = Current::of(config, gate);
        drop(current);
        // The reloaded upstreams set theirs: an upstream the reload removed has none.
        self.families.addresses.clear();
        Metrics::of(Arc::clone(&self.families), config)
    }

    fn of(families: Arc<Families>, config: &Config) -> Metrics {
        let f = &*families;
        let routes =
            config.routes.iter().map(|r| RouteMetrics { name: r.name.clone(), series: OnceLock::new() }).collect();
        let no_route = f.requests.get_or_create_owned(&vec![("route", String::new()), ("outcome", "no_route".into())]);
        let limits = config
            .limits
            .iter()
            .map(|limit| LimitMetrics {
                decisions: DECISIONS.map(|d| {
                    f.decisions.get_or_create_owned(&vec![("limit", limit.name.clone()), ("outcome", d.to_owned())])
                }),
                delay: f.delays.get_or_create_owned(&vec![("limit", limit.name.clone())]),
                queue_wait: limit.queue.as_ref().map_or_else(Vec::new, |queue| {
                    let classes: Vec<&str> = match &queue.classes[..] {
                        [] => vec![""],
                        classes => classes.iter().map(|c| c.name.as_str()).collect(),
                    };
                    (classes.into_iter())
                        .map(|class| {
                            let labels = vec![("limit", limit.name.clone()), ("class", class.to_owned())];
                            f.queue_waits.get_or_create_owned(&labels)
                        })
                        .collect()
                }),
            })
            .collect();
        let reloads = ["ok", "failed"].map(|r| f.reloads.get_or_create_owned(&vec![("result", r.to_owned())]));
        Metrics { families, routes, no_route, unrouted: Default::default(), limits, reloads }
    }

    /// The series of route `route` , made on first use.
    fn route(&self, route: RouteId) -> &RouteSeries {
        let RouteMetrics { name, series } = &self.routes[route];
        series.get_or_init(|| Box::new(self.families.route_series(name, true).expect("made when asked to make")))
    }

    /// The series of route `route` if a request made them: under this configuration, or
    /// under an earlier one with a route of that name (found in the families). Never
    /// makes them: what the dashboard reads must not add zero series to `/metrics`.
    fn route_if_made(&self, route: RouteId) -> Option<std::borrow::Cow<'_, RouteSeries>> {
        let RouteMetrics { name, series } = &self.routes[route];
        match series.get() {
            Some(made) => Some(std::borrow::Cow::Borrowed(made)),
            None => self.families.route_series(name, false).map(std::borrow::Cow::Owned),
        }
    }

    /// Counts a request of route `route` .
    pub fn request(&self, route: RouteId, outcome: RequestOutcome) {
        self.route(route).requests[RequestOutcome::ALL.iter().position(|&o| o == outcome).unwrap_or(0)].inc();
    }

    pub fn no_route(&self) {
        self.no_route.inc();
    }

    /// Counts a request answered before its limits decided it, of route `route` (`None`:
    /// before a route was found), under `outcome` (`Refused::outcome`, `upstream_hold`).
    /// Made on first use: few requests are.
    pub fn answered_early(&self, route: Option<RouteId>, outcome: &'static str) {
        let i = EARLY.iter().position(|&o| o == outcome).expect("an outcome EARLY lists");
        let slot = match route {
            Some(r) => &self.route(r).early[i],
            None => &self.unrouted[i],
        };
        slot.get_or_init(|| {
            let name = route.map(|r| self.routes[r].name.clone()).unwrap_or_default();
            self.families.requests.get_or_create_owned(&vec![("route", name), ("outcome", outcome.to_owned())])
        })
        .inc();
    }

    /// Counts a request whose token did not verify, by `reason` (`TokenError::reason`).
    pub fn invalid_token(&self, reason: &'static str) {
        self.families.invalid_tokens.get_or_create(&vec![("reason", reason.to_owned())]).inc();
    }

    /// Counts a hold of a key by route `route` (`answered`: a request answered from one).
    pub fn hold(&self, route: RouteId, answered: bool) {
        let family = if answered { &self.families.held } else { &self.families.holds };
        family.get_or_create(&vec![("route", self.routes[route].name.clone())]).inc();
    }

    /// Holds begun by route `route`, and requests it answered from one, since start.
    pub fn hold_counts(&self, route: RouteId) -> (u64, u64) {
        let labels = vec![("route", self.routes[route].name.clone())];
        let count = |family: &Family<Labels, Counter>| family.get(&labels).map_or(0, |c| c.get());
        (count(&self.families.holds), count(&self.families.held))
    }

    /// Counts what a limit decided: once per request, whatever its number of windows.
    pub fn decision(&self, result: &LimitResult) {
        let m = &self.limits[result.limit];
        match result.outcome {
            Outcome::Passed => m.decisions[0].inc(),
            Outcome::Delayed(wait) => {
                m.delay.observe(wait.as_secs_f64());
                m.decisions[1].inc()
            }
            Outcome::Rejected(_) => m.decisions[2].inc(),
        };
    }

    /// Observes a wait of `waited` in class `class` of the queue of limit `limit`.
    pub fn queue_wait(&self, limit: LimitId, class: usize, waited: Duration) {
        if let Some(histogram) = self.limits[limit].queue_wait.get(class) {
            histogram.observe(waited.as_secs_f64());
        }
    }

    /// Counts an exchange of route `route` with its upstream that took `elapsed`.
    pub fn upstream(&self, route: RouteId, result: UpstreamResult, elapsed: Duration) {
        let m = self.route(route);
        match result {
            UpstreamResult::Status(status) => {
                m.latency.observe(elapsed.as_secs_f64());
                m.responses[usize::from((status / 100).clamp(1, 5) - 1)].inc()
            }
            UpstreamResult::ConnectError => m.errors[0].inc(),
            UpstreamResult::Timeout => m.errors[1].inc(),
            UpstreamResult::Failed => m.errors[2].inc(),
            UpstreamResult::ClientBody => m.errors[3].inc(),
        };
    }

    /// A gRPC call of route `route` ended with `code` (`None`: without a status). Looked
    /// up by label: gRPC calls alone pay for it, and its series are bounded by the
    /// routes and the 17 codes.
    pub fn grpc(&self, route: RouteId, code: Option<crate::grpc::Code>) {
        let status = code.map_or("NONE", crate::grpc::Code::name);
        let labels = vec![("route", self.routes[route].name.clone()), ("grpc_status", status.to_owned())];
        self.families.grpc.get_or_create(&labels).inc();
    }

    /// Route `route`'s gRPC calls since start by the status they ended with (`NONE`: none),
    /// the statuses seen only. Read by the dashboard, never by a request.
    pub fn grpc_counts(&self, route: RouteId) -> Vec<(&'static str, u64)> {
        let name = &self.routes[route].name;
        (0..=16u8)
            .map(|code| crate::grpc::Code(code).name())
            .chain(["NONE"])
            .filter_map(|status| {
                let labels = vec![("route", name.clone()), ("grpc_status", status.to_owned())];
                self.families.grpc.get(&labels).map(|count| (status, count.get()))
            })
            .collect()
    }

    /// Where upstream `upstream` counts its failed lookups and its addresses (series
    /// continued across reloads).
    pub fn upstream_resolution(&self, upstream: &str) -> ResolveMetrics {
        let labels = vec![("upstream", upstream.to_owned())];
        ResolveMetrics {
            failures: self.families.resolve_failures.get_or_create_owned(&labels),
            addresses: self.families.addresses.get_or_create_owned(&labels),
        }
    }

    /// Where upstream `upstream`'s pool counts (series continued across reloads; the idle
    /// gauge counts the connections of every pool still open, the replaced ones' too).
    pub fn upstream_pool(&self, upstream: &str) -> PoolMetrics {
        let labels = vec![("upstream", upstream.to_owned())];
        let f = &self.families.pool;
        let closed = |why: Closed| {
            let mut labels = labels.clone();
            labels.push(("reason", why.label().to_owned()));
            f.idle_closed.get_or_create_owned(&labels)
        };
        PoolMetrics {
            idle: f.idle.get_or_create_owned(&labels),
            in_use: f.in_use.get_or_create_owned(&labels),
            opened: f.opened.get_or_create_owned(&labels),
            idle_closed: Closed::ALL.map(closed),
            queued: f.queued.get_or_create_owned(&labels),
            full: f.full.get_or_create_owned(&labels),
        }
    }

    /// Counts a write of limit `limit`'s state file (off the request path).
    pub fn state_write(&self, limit: &str, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.families
            .state_writes
            .get_or_create(&vec![("limit", limit.to_owned()), ("result", result.to_owned())])
            .inc();
    }

    pub fn reload_result(&self, ok: bool) {
        self.reloads[usize::from(!ok)].inc();
    }

    /// Route `route`'s requests since start, for the dashboard.
    pub fn route_counts(&self, route: RouteId) -> RouteCounts {
        let Some(m) = self.route_if_made(route) else { return RouteCounts::default() };
        let n = |o: RequestOutcome| m.requests[RequestOutcome::ALL.iter().position(|&a| a == o).unwrap_or(0)].get();
        let [connect, timeout, failed, _client_body] = &m.errors;
        let name = &self.routes[route].name;
        let early: u64 = EARLY
            .iter()
            .filter_map(|o| self.families.requests.get(&vec![("route", name.clone()), ("outcome", (*o).to_owned())]))
            .map(|c| c.get())
            .sum();
        RouteCounts {
            passed: n(RequestOutcome::Passed) + n(RequestOutcome::DryRunRejected),
            delayed: n(RequestOutcome::Delayed),
            annotated: n(RequestOutcome::Annotated),
            refused: n(RequestOutcome::Rejected) + n(RequestOutcome::Banned) + n(RequestOutcome::StoreError) + early,
            server_errors: m.responses[4].get() + connect.get() + timeout.get() + failed.get(),
        }
    }

    /// Limit `limit`'s decisions since start: passed, delayed, rejected.
    pub fn limit_decisions(&self, limit: LimitId) -> [u64; 3] {
        self.limits[limit].decisions.each_ref().map(Counter::get)
    }

    /// The upstream latency histograms of the first `routes` routes now, by route index:
    /// (upper bound in seconds, observations up to it), the last bound infinite. Read
    /// through the text exposition, `prometheus-client`'s only way out for a histogram's
    /// buckets: once a second, by the dashboard, never by a request.
    pub fn latencies(&self, routes: usize) -> Vec<Vec<(f64, u64)>> {
        let mut registry = Registry::default();
        for i in 0..routes.min(self.routes.len()) {
            if let Some(made) = self.route_if_made(RouteId::from(i)) {
                registry.register(format!("r{i}"), "", made.latency.clone());
            }
        }
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
        let mut all = vec![Vec::new(); routes.min(self.routes.len())];
        // `r3_bucket{le="0.004"} 17`
        for line in text.lines() {
            let Some((index, rest)) = line.strip_prefix('r').and_then(|l| l.split_once("_bucket{le=\"")) else {
                continue;
            };
            let Some((bound, count)) = rest.split_once("\"} ") else { continue };
            let (Ok(index), Ok(count)) = (index.parse::<usize>(), count.trim().parse::<u64>()) else { continue };
            let bound = if bound == "+Inf" { f64::INFINITY } else { bound.parse().unwrap_or(f64::INFINITY) };
            if let Some(buckets) = all.get_mut(index) {
                buckets.push((bound, count));
            }
        }
        all
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.families.registry);
        in_order(&out)
    }
}

impl Families {
    /// Route `name`'s series: those that exist, the others made (`make`) or left at zero
    /// outside the families; `None` when none exists and none is made. A route's series
    /// are made all at once: its latency histogram stands for them all.
    fn route_series(&self, name: &str, make: bool) -> Option<RouteSeries> {
        fn one<M: Clone>(family: &Family<Labels, M>, labels: &Labels, make: bool) -> Option<M>
        where
            fn() -> M: prometheus_client::metrics::family::MetricConstructor<M>,
        {
            if make { Some(family.get_or_create_owned(labels)) } else { family.get(labels).map(|m| m.clone()) }
        }
        let with = |key: &'static str, value: &str| vec![("route", name.to_owned()), (key, value.to_owned())];
        let latency = one(&self.latency, &vec![("route", name.to_owned())], make)?;
        let counter = |family: &Family<Labels, Counter>, labels: Labels| one(family, &labels, make).unwrap_or_default();
        Some(RouteSeries {
            requests: RequestOutcome::ALL.map(|o| counter(&self.requests, with("outcome", o.as_str()))),
            responses: STATUS_CLASSES.map(|c| counter(&self.responses, with("class", c))),
            errors: UPSTREAM_ERRORS.map(|k| counter(&self.errors, with("kind", k))),
            latency,
            early: Default::default(),
        })
    }
}

/// A route's requests since start, as the dashboard shows them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RouteCounts {
    /// Passed, dry-run refusals included (they passed).
    pub passed: u64,
    pub delayed: u64,
    /// Forwarded annotated by a soft limit, not delayed.
    pub annotated: u64,
    /// Refused by a limit, a ban, or Redis's absence (`on_store_error: deny`), before its
    /// limits (a token that does not verify, a key missing or repeated, a body too large,
    /// a bad cost), or answered from an upstream's hold.
    pub refused: u64,
    /// Upstream 5xx responses, and exchanges that failed (502, 504 made here).
    pub server_errors: u64,
}

/// `text` with each family's series sorted by their labels: `prometheus-client` writes
/// them in its hash maps' order, which differs from one process to the next, so two
/// instances' (or two restarts') pages could not be compared line by line. A series'
/// own lines (a histogram's buckets, sum and count) keep their order.
fn in_order(text: &str) -> String {
    fn flush<'a>(series: &mut std::collections::BTreeMap<&'a str, Vec<&'a str>>, out: &mut String) {
        for line in std::mem::take(series).into_values().flatten() {
            out.push_str(line);
            out.push('\n');
        }
    }
    let mut out = String::with_capacity(text.len());
    let mut series = std::collections::BTreeMap::new();
    for line in text.lines() {
        if line.starts_with('#') {
            flush(&mut series, &mut out);
            out.push_str(line);
            out.push('\n');
            continue;
        }
        // The labels, but a bucket's bound: `{le="0.5",route="api"}` is series `route="api"`.
        let labels = line.split_once('{').and_then(|(_, rest)| rest.rsplit_once('}')).map_or("", |(labels, _)| labels);
        let key = match labels.strip_prefix("le=\"").and_then(|rest| rest.split_once('"')) {
            Some((_, others)) => others.trim_start_matches(','),
            None => labels,
        };
        series.entry(key).or_insert_with(Vec::new).push(line);
    }
    flush(&mut series, &mut out);
    out
}

fn delay_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

fn names(config: &Config) -> TiVec<LimitId, String> {
    config.limits.iter().map(|l| l.name.clone()).collect()
}

/// The running configuration's limiters, their names, and its store.
struct Current {
    limiters: Arc<Limiters>,
    store: Option<Arc<Store>>,
    names: TiVec<LimitId, String>,
}

impl Current {
    fn of(config: &Config, gate: &Gate) -> Current {
        Current { limiters: Arc::clone(gate.limiters()), store: gate.store().cloned(), names: names(config) }
    }
}

/// What the limiters and the store count themselves, read at scrape time.
struct State(Arc<Mutex<Current>>);

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State").finish_non_exhaustive()
    }
}

impl Current {
    fn per_limit<M: EncodeMetric>(
        &self,
        encoder: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        kind: MetricType,
        value: impl Fn(LimitId) -> M,
    ) -> std::fmt::Result {
        let mut family = encoder.encode_descriptor(name, help, None, kind)?;
        for (i, limit) in self.names.iter_enumerated() {
            value(i).encode(family.encode_family(&vec![("limit", limit.as_str())])?)?;
        }
        Ok(())
    }
}

impl Current {
    /// The queues' series: depth and ends by class, of the limits with a queue only.
    fn queues(&self, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
        let l = &self.limiters;
        let queues: Vec<(LimitId, &str)> = self
            .names
            .iter_enumerated()
            .filter(|&(i, _)| l.max_wait(i).is_some())
            .map(|(i, n)| (i, n.as_str()))
            .collect();
        if queues.is_empty() {
            return Ok(());
        }
        {
            let help =
                "Requests waiting now in each concurrency limit's queue, by class (\"\": a queue without classes)";
            let mut family = encoder.encode_descriptor("limit_queue_depth", help, None, MetricType::Gauge)?;
            for &(i, limit) in &queues {
                for (c, class) in l.queue_classes(i).into_iter().enumerate() {
                    let depth = ConstGauge::new(i64::try_from(l.queued(i, Some(c))).unwrap_or(i64::MAX));
                    depth.encode(family.encode_family(&vec![("limit", limit), ("class", class)])?)?;
                }
            }
        }
        let help = "Waits in each concurrency limit's queue, by class and by how they ended: served (a slot), full, \
                    timed_out, pushed_out (a request of a shorter flow took the place), left (the client went away), \
                    store_error (Redis failed while it waited for a global limit's slot: decided again)";
        let mut family = encoder.encode_descriptor("limit_queue_ended", help, None, MetricType::Counter)?;
        for &(i, limit) in &queues {
            for (c, class) in l.queue_classes(i).into_iter().enumerate() {
                for end in QueueEnd::ALL {
                    let labels = vec![("limit", limit), ("class", class), ("end", end.as_str())];
                    ConstCounter::new(l.queue_ended(i, Some(c), end)).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        Ok(())
    }

    /// Each adaptive concurrency limit's ceiling and the latencies it moves by.
    fn ceilings(&self, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
        let l = &self.limiters;
        let ceilings: Vec<_> =
            self.names.iter_enumerated().filter_map(|(i, n)| Some((n.as_str(), l.ceiling(i)?.read()))).collect();
        if ceilings.is_empty() {
            return Ok(());
        }
        {
            let help = "Requests in progress each adaptive concurrency limit lets a key have now (its ceiling)";
            let mut family = encoder.encode_descriptor("limit_ceiling", help, None, MetricType::Gauge)?;
            for (limit, read) in &ceilings {
                let ceiling = ConstGauge::new(i64::try_from(read.now).unwrap_or(i64::MAX));
                ceiling.encode(family.encode_family(&vec![("limit", *limit)])?)?;
            }
        }
        let help = "What each adaptive concurrency limit's ceiling moves by: the median time to the upstream's answer \
                    of the requests holding its slots in the last window (recent), and the least such median (ground; the target is 1.25 times it)";
        let mut family = encoder.encode_descriptor("limit_latency_seconds", help, None, MetricType::Gauge)?;
        for (limit, read) in &ceilings {
            for (of, ms) in [("recent", read.recent_ms), ("ground", read.ground_ms)] {
                let Some(ms) = ms else { continue };
                let gauge = ConstGauge::new(ms / 1000.0);
                gauge.encode(family.encode_family(&vec![("limit", *limit), ("of", of)])?)?;
            }
        }
        Ok(())
    }
}

impl Collector for State {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let current = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let (l, this) = (&current.limiters, &*current);
        let gauge = |n: usize| ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX));
        this.per_limit(
            &mut encoder,
            "limit_keys",
            "Keys held by each limit (concurrency limits: keys with requests in flight)",
            MetricType::Gauge,
            |i| gauge(l.keys(i)),
        )?;
        this.per_limit(
            &mut encoder,
            "limit_max_keys",
            "Keys each limit's table holds at most (max_keys)",
            MetricType::Gauge,
            |i| gauge(l.max_keys(i)),
        )?;
        this.per_limit(
            &mut encoder,
            "limit_in_flight",
            "Requests in flight under each concurrency limit",
            MetricType::Gauge,
            |i| gauge(l.in_flight(i)),
        )?;
        this.queues(&mut encoder)?;
        this.ceilings(&mut encoder)?;
        this.per_limit(
            &mut encoder,
            "limit_evictions",
            "Keys dropped with live state because the limit's table was full",
            MetricType::Counter,
            |i| ConstCounter::new(l.evictions(i)),
        )?;
        this.per_limit(
            &mut encoder,
            "limit_missing_key",
            "Requests that lacked the limit's key: not counted, counted under one shared key, or refused (on_missing_key)",
            MetricType::Counter,
            |i| ConstCounter::new(l.missing(i)),
        )?;
        this.per_limit(
            &mut encoder,
            "limit_charged_units",
            "Units each limit's charge debited after responses (what they reported, or the default)",
            MetricType::Counter,
            |i| ConstCounter::new(l.charged_units(i)),
        )?;
        this.per_limit(
            &mut encoder,
            "limit_charges_defaulted",
            "Responses each limit's charge debited the default: they reported no count",
            MetricType::Counter,
            |i| ConstCounter::new(l.charges_defaulted(i)),
        )?;
        let tally = |i: LimitId, counter: fn(&Tally) -> &AtomicU64| {
            ConstCounter::new(l.tenants(i).map_or(0, |t| counter(&t.tally).load(Ordering::Relaxed)))
        };
        this.per_limit(
            &mut encoder,
            "limit_own_counts",
            "Requests decided with their key's own count (limit_from: the operator's, a trusted field's, a claim's)",
            MetricType::Counter,
            |i| tally(i, |t| &t.applied),
        )?;
        this.per_limit(
            &mut encoder,
            "limit_own_counts_clamped",
            "Of them, with a count outside the limit's limit_from bounds, clamped to the nearest",
            MetricType::Counter,
            |i| tally(i, |t| &t.clamped),
        )?;
        this.per_limit(
            &mut encoder,
            "limit_own_counts_invalid",
            "Requests whose limit_from source said no count (not a number, or the field twice): decided with the limit's own",
            MetricType::Counter,
            |i| tally(i, |t| &t.invalid),
        )?;
        this.per_limit(
            &mut encoder,
            "limit_own_counts_untrusted",
            "Requests that carried limit_from's field from a peer not in trusted_proxies: ignored",
            MetricType::Counter,
            |i| tally(i, |t| &t.untrusted),
        )?;
        this.per_limit(
            &mut encoder,
            "limit_own_counts_given",
            "Keys the operator gave a count of their own (PUT /overrides)",
            MetricType::Gauge,
            |i| gauge(l.tenants(i).map_or(0, |t| t.given_keys())),
        )?;
        this.per_limit(&mut encoder, "bans", "Bans imposed by each limit", MetricType::Counter, |i| {
            ConstCounter::new(l.bans(i))
        })?;
        this.per_limit(&mut encoder, "bans_active", "Keys banned now by each limit", MetricType::Gauge, |i| {
            gauge(l.bans_active(i))
        })?;
        let Some(store) = &current.store else { return Ok(()) };
        let c = store.counts();
        let mut counter = |name: &str, help: &str, value: u64| -> std::fmt::Result {
            ConstCounter::new(value).encode(encoder.encode_descriptor(name, help, None, MetricType::Counter)?)
        };
        counter("redis_calls", "Decisions asked of Redis", c.calls)?;
        counter(
            "redis_script_calls",
            "Script calls that carried them (concurrent decisions share one)",
            c.script_calls,
        )?;
        counter("redis_errors", "Redis calls that failed or timed out", c.errors)?;
        counter("redis_skipped", "Requests decided without Redis while the circuit breaker was open", c.skipped)?;
        counter("near_cache_hits", "Requests refused by the near-cache without a Redis call", c.near_hits)?;
        ConstGauge::new(i64::from(c.breaker_open)).encode(encoder.encode_descriptor(
            "redis_breaker_open",
            "1 while the circuit breaker skips Redis and on_store_error decides",
            None,
            MetricType::Gauge,
        )?)?;
        let mut family = encoder.encode_descriptor(
            "redis_fallbacks",
            "Global limit decisions made by on_store_error, by kind",
            None,
            MetricType::Counter,
        )?;
        for (kind, value) in ["allow", "deny", "local"].into_iter().zip(c.fallbacks) {
            ConstCounter::new(value).encode(family.encode_family(&vec![("kind", kind)])?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Clock;

    #[test]
    fn the_dashboard_reads_each_routes_counts_each_limits_decisions_and_latency_buckets() {
        let yaml = "listen: 127.0.0.1:0\nlimits:\n  l: { key: ip, rate: 1r/s }\nroutes:\n  - name: 'say \"hi\"'\n    respond: { status: 200 }\n    limits: [l]\n";
        let config = crate::config::parse(yaml, "t").unwrap();
        let metrics = Metrics::new(&config, &Gate::new(&config, Clock::System));
        for outcome in
            [RequestOutcome::Passed, RequestOutcome::DryRunRejected, RequestOutcome::Banned, RequestOutcome::Annotated]
        {
            metrics.request(RouteId::from(0), outcome);
        }
        metrics.upstream(RouteId::from(0), UpstreamResult::Status(503), Duration::from_millis(3));
        metrics.upstream(RouteId::from(0), UpstreamResult::Timeout, Duration::from_secs(30));
        metrics.upstream(RouteId::from(0), UpstreamResult::ClientBody, Duration::ZERO);
        let counts = metrics.route_counts(RouteId::from(0));
        assert_eq!(counts, RouteCounts { passed: 2, delayed: 0, annotated: 1, refused: 1, server_errors: 2 });
        assert_eq!(metrics.limit_decisions(LimitId::from(0)), [0, 0, 0]);
        let latencies = metrics.latencies(50);
        assert_eq!(latencies.len(), 1, "one route");
        let buckets = &latencies[0];
        assert_eq!(buckets.len(), 17, "16 bounds and +Inf");
        assert_eq!(buckets[3], (0.004, 1), "3 ms is within 4 ms");
        assert_eq!(buckets[2], (0.002, 0));
        assert_eq!(buckets[16], (f64::INFINITY, 1));
    }

    /// A passed request is named by the first of: a dry-run limit would have refused it,
    /// it waits, a limit annotates it (not one in dry run, which only says it would), else
    /// it passed. An annotating limit over its limit is no dry-run refusal.
    #[test]
    fn an_annotated_request_is_its_own_outcome_below_delayed_and_dry_run() {
        let yaml = "listen: 127.0.0.1:0\nlimits:\n  soft: { key: ip, rate: 1r/s, action: annotate }\n  \
                    dry: { key: ip, rate: 1r/s, dry_run: true }\n  dry_soft: { key: ip, rate: 1r/s, action: annotate, dry_run: true }\n\
                    routes:\n  - respond: { status: 200 }\n    limits: [soft, dry, dry_soft]\n";
        let config = crate::config::parse(yaml, "t").unwrap();
        let id = |name: &str| config.limits.iter().position(|l| l.name == name).map(LimitId::from).unwrap();
        let result = |name: &str, outcome, annotated| LimitResult {
            limit: id(name),
            key: crate::policy::key::KeyHash(1),
            outcome,
            banned: false,
            annotated,
            window: 0,
            excess: 0.0,
        };
        let over = Outcome::Rejected(Duration::from_secs(1));
        let outcome = |wait: u64, results: &[LimitResult]| {
            let decision = Decision::Pass {
                wait: Duration::from_millis(wait),
                results: results.iter().copied().collect(),
                standings: Default::default(),
                permits: Default::default(),
                pending: Default::default(),
                at: crate::clock::Nanos(0),
            };
            RequestOutcome::of(&decision, &config.limits).as_str()
        };
        assert_eq!(outcome(0, &[result("soft", over, true)]), "annotated");
        assert_eq!(outcome(0, &[result("soft", Outcome::Passed, false)]), "passed");
        assert_eq!(outcome(5, &[result("soft", Outcome::Delayed(Duration::from_millis(5)), true)]), "delayed");
        assert_eq!(outcome(0, &[result("soft", over, true), result("dry", over, false)]), "dry_run_rejected");
        // A dry-run limit that would annotate is only said to.
        assert_eq!(outcome(0, &[result("dry_soft", over, true)]), "passed");
        assert!(RequestOutcome::ADMITTED.contains(&RequestOutcome::Annotated.as_str()));
    }

    /// Reading a route's counts makes no series for it; a reload finds those an earlier
    /// request made.
    #[test]
    fn the_dashboard_reads_a_routes_series_without_making_them() {
        let yaml = "listen: 127.0.0.1:0\nroutes:\n  - name: asked\n    match: { path: /a }\n    respond: { status: 200 }\n  - name: never\n    respond: { status: 200 }\n";
        let config = crate::config::parse(yaml, "t").unwrap();
        let gate = Gate::new(&config, Clock::System);
        let metrics = Metrics::new(&config, &gate);
        metrics.request(RouteId::from(0), RequestOutcome::Passed);
        assert_eq!(metrics.route_counts(RouteId::from(1)), RouteCounts::default());
        assert!(metrics.latencies(50)[1].is_empty());
        assert!(!metrics.encode().contains("never"), "no series made by reading");
        let reloaded = metrics.reloaded(&config, &gate);
        assert_eq!(reloaded.route_counts(RouteId::from(0)).passed, 1, "the series made before the reload");
        assert_eq!(reloaded.latencies(50)[0].len(), 17);
    }
}
