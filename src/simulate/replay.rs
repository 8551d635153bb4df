//! One configuration replaying logged requests on a virtual clock, through the same
//! phases as the proxy: client address, host, normalized path, route, allow-list,
//! cost, and the gate's decision (`decide`, the one call into it).
//!
//! Concurrency slots and `count:` admissions are held from a request's virtual arrival
//! to its end (arrival + the wait decided + the duration the log gives), in a queue
//! ordered by end: every request that has ended by the next arrival is settled with
//! its logged status and gives its slots back first.
//!
//! A limit keyed on a part that only sluicegate's recorded `keys` carry (a header, the
//! bearer token, a cookie, the host) decides a request only if its line records that
//! part; otherwise the request is counted as not simulated for it, and for its route.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use smallvec::SmallVec;
use typed_index_collections::TiVec;

use super::ByKey;
use super::format::{Carried, Logged};
use super::tally::Tally;
use crate::admission::hold::{HoldKey, Holds};
use crate::admission::{self, Asked, AskedBody, Decide, Origin, Refused, Verdict, Way};
use crate::clock::{ManualClock, Nanos};
use crate::config::{Config, LimitId, RouteId, Scope};
use crate::front::FrontError;
use crate::gate::{Decision, Gate, Pending, Permits};
use crate::grpc;
use crate::limit::Outcome;
use crate::limit::key_text::KeyText;
use crate::limit::queue::{Handed, Queued, Ticket};
use crate::metrics::{RequestOutcome, UPSTREAM_HOLD};
use crate::policy::LimitUse;
use crate::policy::allow::Allow;
use crate::policy::key::{KeyPart, KeySource};

/// What became of one request.
pub struct Fate {
    pub route: Option<RouteId>,
    /// `passed`, `delayed`, `rejected`, `banned`, `dry_run_rejected`, `annotated`; or why no limit
    /// saw it: `no_route`, `bad_path`, `invalid_cost`, `repeated_key_field` (a field a
    /// limit is keyed on, sent twice: 400), `missing_key` (a key that a limit with
    /// `on_missing_key: refuse` needs: 400), `upstream_hold` (its key held after its
    /// upstream refused an earlier request with a time to wait).
    pub outcome: &'static str,
    pub wait: Duration,
    /// The enforced limit that refused it, the status it answers, and the key's hash.
    pub refused: Option<(LimitId, u16, Option<u64>)>,
    /// The status a hold of its key answers it with (`upstream_hold`).
    pub held: Option<u16>,
    /// The limits whose key it lacked, as the access log's `missing_key` names them.
    pub missing_key: SmallVec<[LimitId; 2]>,
    /// The request was a gRPC call (its line has a `grpc_status`): a refusal is answered
    /// with the limit's `grpc_status`.
    pub grpc: bool,
}

/// A request waiting in a concurrency limit's queue, on the virtual clock: settled when
/// a request that ends hands it a slot, or at its deadline.
struct Waiter {
    /// Its number among the log's requests (the caller's).
    number: u64,
    ticket: Ticket,
    arrived: u64,
    deadline: u64,
    request: Logged,
}

/// How a request comes to be decided: as it arrives (with its number, for a fate that a
/// queue defers), or again once its wait in a queue ended, at `arrived`.
enum Step {
    Arrives(u64),
    Handed { handed: Handed, arrived: u64 },
    Ended { retry_after: Duration },
}

/// A request in progress: what it gives back when it ends.
struct InProgress {
    permits: Permits,
    pending: Pending,
    status: Option<u16>,
}

pub struct Replay {
    pub config: Config,
    pub name: String,
    gate: Gate,
    /// The virtual clock the gate reads: each request's instant in the log.
    clock: ManualClock,
    /// How the report writes keys: as the instance's log lines did (with the same
    /// `keys_secret`), a recorded digest as itself.
    text: KeyText,
    /// Per limit, why this log cannot drive it (`None`: it can).
    pub skipped: TiVec<LimitId, Option<String>>,
    /// Per limit, the key parts that only a line's recorded keys carry (its own key's
    /// and those of the limits its overrides name): a line without one of them cannot
    /// tell how the limit would count its request.
    per_line: TiVec<LimitId, Box<[KeyPart]>>,
    /// Caveats of this configuration with this log.
    pub notes: Vec<String>,
    /// The host of requests whose log line names none.
    host: Option<String>,
    /// Requests in progress by end, then admission.
    in_flight: BinaryHeap<Reverse<ByKey<(u64, u64), InProgress>>>,
    /// Requests waiting in a queue, and the fates of those settled since `resolved`.
    waiting: Vec<Waiter>,
    resolved: Vec<(u64, Fate)>,
    /// A request a concurrency limit with a queue has no slot for waits in it (else it
    /// is refused at once: `refusing_at_once`).
    queues: bool,
    seq: u64,
    /// The keys held after their upstream refused them, as the log's `hold_ms` says:
    /// the proxy's holds, on the virtual clock.
    holds: Holds,
    pub tally: Tally,
}

impl Replay {
    /// The ceiling of `limit` as the replay left it, if it is an adaptive concurrency
    /// limit.
    pub fn ceiling(&self, limit: LimitId) -> Option<crate::limit::adaptive::CeilingShown> {
        self.gate.limiters().ceiling(limit).map(|c| c.read())
    }

    /// `config` (loaded from `name`) for a log that carries `carried`. Global limits
    /// become one local limit with the whole budget: the log is taken as every request
    /// all instances saw.
    pub fn new(mut config: Config, name: String, carried: &Carried, host: Option<String>) -> Replay {
        let mut notes = Vec::new();
        for limit in &mut config.limits {
            if let Scope::Global { instances, .. } = limit.scope {
                notes.push(format!(
                    "limit {}: global (instances: {instances}); simulated as one instance holding the whole \
                     budget, as if one proxy had served every request of the log",
                    limit.name
                ));
                limit.scope = Scope::Local;
            }
        }
        let host_routes: Vec<&str> =
            config.routes.iter().filter(|r| r.matcher.host.is_some()).map(|r| r.name.as_str()).collect();
        if !host_routes.is_empty() && !carried.host && host.is_none() {
            notes.push(format!(
                "routes {} match on host, which the log does not carry: requests are routed as if they had \
                 none (give --host, or a log_format with $host)",
                host_routes.join(", ")
            ));
        }
        let allows = config.routes.iter().map(|r| (format!("the allow-list of route {}", r.name), &r.allow));
        let allows = allows.chain(config.limits.iter().flat_map(|l| {
            std::iter::once((format!("the allow-list of limit {}", l.name), &l.allow))
                .chain(l.overrides.iter().map(move |(allow, _)| (format!("an override of limit {}", l.name), allow)))
        }));
        for (whose, allow) in allows {
            let unseen = unseen_fields(allow, carried);
            if unseen.is_empty() {
                continue;
            }
            notes.push(if carried.recorded_keys {
                format!(
                    "{whose} matches on {}, which the log carries only where a line records it as a part of a \
                     limit's key, and a credential as a digest that matches nothing: requests may not match as \
                     they did",
                    unseen.join(", ")
                )
            } else {
                format!(
                    "{whose} matches on {}, which the log does not carry: no request matches that way",
                    unseen.join(", ")
                )
            });
        }
        for limit in config.limits.iter().filter(|l| l.count.is_some() && !carried.status) {
            notes.push(format!(
                "limit {} counts only some statuses (count:), and the log has none ($status): every \
                 admission stays counted",
                limit.name
            ));
        }
        if carried.recorded_keys {
            notes.extend(shared_fields(&config));
        }
        let skipped = config.limits.iter().map(|l| not_simulated(l, carried, host.is_some())).collect();
        let per_line = config
            .limits
            .iter()
            .map(|limit| {
                let keys =
                    std::iter::once(limit).chain(limit.overrides.iter().map(|(_, other)| &config.limits[*other]));
                let mut parts: Vec<KeyPart> = Vec::new();
                for part in keys.flat_map(|l| l.key.0.iter()) {
                    if recorded_only(part, carried, host.is_some()) && !parts.contains(part) {
                        parts.push(part.clone());
                    }
                }
                parts.into_boxed_slice()
            })
            .collect();
        let clock = ManualClock::default();
        let gate = Gate::new(&config, clock.clone().into());
        let tally = Tally::new(&config);
        let holds = Holds::new(&config, None);
        let text = KeyText::new(&config, None).recorded();
        Replay {
            config,
            name,
            gate,
            clock,
            text,
            skipped,
            per_line,
            notes,
            host,
            in_flight: BinaryHeap::new(),
            waiting: Vec::new(),
            resolved: Vec::new(),
            queues: true,
            seq: 0,
            holds,
            tally,
        }
    }

    /// Has a request that a concurrency limit with a queue has no slot for refused at
    /// once, as without the queue, so that every fate is known when the request is taken
    /// (what a synthetic load's connections need to go on); noted in `notes`.
    pub fn refusing_at_once(&mut self) {
        self.queues = false;
        for limit in self.config.limits.iter().filter(|l| l.queue.is_some()) {
            self.notes.push(format!(
                "limit {} has a queue, which this prediction does not model: a request it has no slot for is \
                 counted refused at once (what the queue would have served, it counts refused)",
                limit.name
            ));
        }
    }

    /// Starts again from nothing: every key fresh, no request in progress, nothing counted.
    pub fn restart(&mut self) {
        self.gate = Gate::new(&self.config, self.clock.clone().into());
        self.tally = Tally::new(&self.config);
        self.holds = Holds::new(&self.config, None);
        self.in_flight.clear();
        self.waiting.clear();
        self.resolved.clear();
        self.seq = 0;
    }

    /// Replays `request`, the log's `number`th, arriving at `at` (no earlier than the
    /// previous one), through the proxy's own admission (`admission::admit`), on the
    /// virtual clock: its fate, or `None` while it waits in a queue (`resolved` gives it
    /// once settled).
    pub fn take(&mut self, request: &Logged, at: u64, number: u64) -> Option<Fate> {
        self.advance(at);
        let fate = self.decide(request, at, Step::Arrives(number));
        // A request it pushed out of a queue is settled now.
        self.serve(at);
        fate
    }

    /// The fates of requests settled after waiting in a queue, each with its number,
    /// since the last call.
    pub fn resolved(&mut self) -> Vec<(u64, Fate)> {
        std::mem::take(&mut self.resolved)
    }

    /// Decides `request` at `at`, as `step` says.
    fn decide(&mut self, request: &Logged, at: u64, step: Step) -> Option<Fate> {
        let grpc = request.grpc_status.is_some();
        let mut fate = Fate {
            route: None,
            outcome: "no_route",
            wait: Duration::ZERO,
            refused: None,
            held: None,
            missing_key: SmallVec::new(),
            grpc,
        };
        let head = request.head();
        let origin = Origin::Logged { claims: request.claims.as_ref(), host: self.host.as_deref() };
        let body = request.body.as_deref().map_or(AskedBody::None, AskedBody::Given);
        let asked = Asked { head: &head, peer: request.client, declared: None, scheme: request.scheme, origin, body };
        let (skipped, per_line) = (&self.skipped, &self.per_line);
        let line_drives = |_: RouteId, l: LimitId| drives(&skipped[l], &per_line[l], request);
        // The gate decides at the request's instant in the log.
        self.clock.set(Nanos(at));
        let way = Way { decide: Decide::Spend, holds: Some(&self.holds), drives: Some(&line_drives) };
        let admitted = admission::admit(&self.config, &self.gate, &asked, &way);
        let Some(front) = &admitted.front else {
            match admitted.verdict {
                Verdict::Refused(Refused::Front(FrontError::BadPath(_))) => {
                    self.tally.bad_path += 1;
                    fate.outcome = "bad_path";
                }
                _ => self.tally.no_route += 1,
            }
            return Some(fate);
        };
        let (index, src) = (front.route, &front.src);
        fate.route = Some(index);
        let route = &self.config.routes[index];
        let arrives = matches!(step, Step::Arrives(_));
        if arrives {
            self.tally.second(at);
        }
        if !front.exempt && arrives {
            // Counted as not simulated for each limit the line cannot drive.
            for &used in &route.limits {
                let l = used.limit;
                simulated(&self.skipped[l], &self.per_line[l], &mut self.tally, l, index, request);
            }
        }
        let mut waited = Duration::ZERO;
        let decision = match admitted.verdict {
            Verdict::Decided(decision) if self.queues => {
                let cost = admitted.cost.unwrap_or(1);
                let found = Found { limits: &admitted.limits, src, cost, priority: route.priority.as_deref() };
                match queue_step(&self.gate, &mut self.waiting, step, decision, &found, request, at) {
                    Some((decision, queued)) => {
                        waited = queued;
                        decision
                    }
                    None => return None,
                }
            }
            Verdict::Decided(decision) => decision,
            Verdict::Refused(refused) => {
                self.refused(refused, index, &mut fate);
                return Some(fate);
            }
            Verdict::Held(hold) => {
                self.tally.routes[index].held += 1;
                fate.outcome = UPSTREAM_HOLD;
                fate.held = Some(hold.status.as_u16());
                return Some(fate);
            }
            // No Redis in a replay, and no body in a log line.
            Verdict::Pending | Verdict::ReadBody => return Some(fate),
        };
        let limits = &admitted.limits;
        fate.missing_key = self.gate.missing_keys(limits, src).collect();
        let outcome = RequestOutcome::of(&decision, &self.config.limits).after_queue(!waited.is_zero());
        fate.outcome = outcome.as_str();
        let results = decision.results();
        for l in limits.iter().map(|u| u.limit) {
            if !results.iter().any(|r| r.limit == l) && self.gate.limiters().key_hash(l, src).is_none() {
                self.tally.limits[l].no_key += 1;
            }
        }
        let refused = matches!(decision, Decision::Reject { .. });
        for r in results {
            let limit = r.limit;
            if refused && !r.outcome.is_rejected() {
                // As the proxy counts decisions: what another limit refused is none of
                // this one's.
                self.tally.limits[limit].refused_elsewhere();
                continue;
            }
            let wait = if let Outcome::Delayed(d) = r.outcome { d } else { Duration::ZERO };
            let label = || self.text.write(&self.config.limits[limit].key, src);
            let key = r.outcome.is_rejected().then_some((r.key.0, label));
            self.tally.limits[limit].decided(at, r.outcome.is_rejected(), wait, key);
        }
        self.tally.routes[index].outcome(outcome);
        match decision {
            Decision::Reject { limit, status, ref results, .. } => {
                let key = results.iter().find(|r| r.limit == limit).map(|r| r.key.0);
                fate.refused = Some((limit, status.as_u16(), key));
                self.tally.rejected_at(at);
            }
            Decision::Pass { wait, permits, pending, .. } => {
                fate.wait = waited + wait;
                self.tally.routes[index].waited(wait);
                let wait = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
                let answered = at.saturating_add(wait).saturating_add(request.duration.unwrap_or(0));
                if let Some(key) = &admitted.hold {
                    self.hold(request, index, key, answered);
                }
                self.in_progress(
                    answered,
                    permits,
                    pending,
                    // A gRPC call counts by its gRPC status, as the proxy counts it.
                    request.grpc_status.map(|code| grpc::counted_status(grpc::Code(code))).or(request.status),
                );
            }
        }
        Some(fate)
    }

    /// Holds `key` of route `index` from `answered`, the instant `request` was answered,
    /// if its line says its upstream refused it with a time to wait (`hold_ms`), as the
    /// proxy held it.
    fn hold(&self, request: &Logged, index: RouteId, key: &HoldKey, answered: u64) {
        let (Some(held), Some(table)) = (request.hold, self.holds.table(index)) else { return };
        let status = request.status.and_then(|s| http::StatusCode::from_u16(s).ok());
        table.hold_for(key, status.unwrap_or(http::StatusCode::TOO_MANY_REQUESTS), held, Nanos(answered));
    }

    /// Tallies what the proxy refuses with 400 before any limit decides, among the limits
    /// the line can drive (a key field sent twice, a key missing for `on_missing_key:
    /// refuse`), or a cost that is none, on route `index`.
    fn refused(&mut self, refused: Refused, index: RouteId, fate: &mut Fate) {
        fate.outcome = refused.outcome();
        let limit = match refused {
            Refused::DuplicateKeyField { id, .. } => id,
            Refused::MissingKey { id, .. } => {
                fate.missing_key.push(id);
                id
            }
            _ => {
                self.tally.routes[index].invalid_cost += 1;
                return;
            }
        };
        self.tally.routes[index].key_refused += 1;
        fate.refused = Some((limit, http::StatusCode::BAD_REQUEST.as_u16(), None));
    }

    /// Keeps a passed request's slots and `count:` admissions until `end`.
    fn in_progress(&mut self, end: u64, permits: Permits, pending: Pending, status: Option<u16>) {
        self.seq += 1;
        self.in_flight.push(Reverse(ByKey((end, self.seq), InProgress { permits, pending, status })));
    }

    /// Moves the virtual clock on to `at`: every request in progress that ended by then
    /// ends (its slots handed to requests waiting in a queue, which are decided then),
    /// and every wait in a queue that ran out by then ends, each at its instant, in order.
    fn advance(&mut self, at: u64) {
        loop {
            let end = self.in_flight.peek().map(|h| h.0.0.0);
            let deadline = self.waiting.iter().map(|w| w.deadline).min();
            let next = match (end, deadline) {
                (Some(end), Some(deadline)) => end.min(deadline),
                (Some(t), None) | (None, Some(t)) => t,
                (None, None) => break,
            };
            if next > at {
                break;
            }
            // Slots are given back at their instant (an adaptive ceiling measures how long
            // they were held).
            self.clock.set(Nanos(next));
            // A slot given back at the instant a wait runs out is handed on first.
            if end == Some(next) {
                self.end_until(next);
                self.serve(next);
            } else {
                self.expire(next);
            }
        }
    }

    /// Settles, at `now`, the waiting requests whose wait has ended: handed a slot
    /// (decided again, holding it) or pushed out; until none has.
    fn serve(&mut self, now: u64) {
        while let Some((i, ended)) =
            self.waiting.iter_mut().enumerate().find_map(|(i, w)| Some((i, w.ticket.try_end()?)))
        {
            let waiter = self.waiting.swap_remove(i);
            let step = match ended {
                Ok(handed) => Step::Handed { handed, arrived: waiter.arrived },
                Err((_, retry_after)) => Step::Ended { retry_after },
            };
            self.settle(waiter.number, &waiter.request, now, step);
        }
    }

    /// Ends, at `now`, the waits that ran out by then.
    fn expire(&mut self, now: u64) {
        while let Some(i) = self.waiting.iter().position(|w| w.deadline <= now) {
            let waiter = self.waiting.swap_remove(i);
            let step = match waiter.ticket.give_up() {
                Ok(handed) => Step::Handed { handed, arrived: waiter.arrived },
                Err((_, retry_after)) => Step::Ended { retry_after },
            };
            self.settle(waiter.number, &waiter.request, now, step);
            self.serve(now);
        }
    }

    /// Decides the waiting request `number` at `now`, as `step` says, and keeps its fate.
    fn settle(&mut self, number: u64, request: &Logged, now: u64, step: Step) {
        self.clock.set(Nanos(now));
        if let Some(fate) = self.decide(request, now, step) {
            self.resolved.push((number, fate));
        }
    }

    /// Ends every request in progress that ended by `at`.
    fn end_until(&mut self, at: u64) {
        while self.in_flight.peek().is_some_and(|h| h.0.0.0 <= at) {
            let Some(Reverse(ByKey(_, held))) = self.in_flight.pop() else { break };
            // A line without a status leaves its admissions counted, as a request whose
            // client went away before an answer does.
            if let Some(status) = held.status {
                // Every limit here is local: settling is done at once, nothing to await.
                // (A replay knows no response's report: `charge:` debits nothing here.)
                let (global, _) = held.pending.settle(status);
                debug_assert!(global.is_none(), "a replay's limits are all local");
            }
            drop(held.permits);
        }
    }

    /// The end of the log: every request still in progress ends, and every wait in a
    /// queue with it.
    pub fn finish(&mut self) {
        self.advance(u64::MAX);
    }
}

/// What the admission found of a request, as its queue step needs it.
struct Found<'a, 's> {
    limits: &'a [LimitUse],
    src: &'a KeySource<'s>,
    cost: u64,
    /// Its route's class in queues.
    priority: Option<&'a str>,
}

/// The queue step of a request its limits decided at `at` (`decision`), as `step` says:
/// a refusal a queue may take brings it to the queue (`None`: it waits there, in
/// `waiting`); handed a slot, it is decided again holding it; its wait over, it is
/// refused with what the queue expects. The decision, and how long it waited.
fn queue_step(
    gate: &Gate,
    waiting: &mut Vec<Waiter>,
    step: Step,
    mut decision: Decision,
    found: &Found<'_, '_>,
    request: &Logged,
    at: u64,
) -> Option<(Decision, Duration)> {
    let Some(limit) = gate.queue_of(&decision) else { return Some((decision, Duration::ZERO)) };
    // Without Redis, `decide_holding` decides at once.
    let holding = |handed, waited| {
        let deciding = gate.decide_holding(found.limits, found.src, found.cost, Some(handed), waited);
        futures_util::FutureExt::now_or_never(deciding).expect("a replay's limits are all local")
    };
    match step {
        Step::Arrives(number) => match gate.queue(found.limits, found.src, limit, found.priority) {
            Queued::Taken(handed) => return Some((holding(handed, Duration::ZERO), Duration::ZERO)),
            Queued::Waiting(ticket) => {
                let deadline = at.saturating_add(u64::try_from(ticket.max_wait().as_nanos()).unwrap_or(u64::MAX));
                waiting.push(Waiter { number, ticket, arrived: at, deadline, request: request.clone() });
                return None;
            }
            Queued::Refused { retry_after, .. } => decision.refused_after(limit, retry_after),
        },
        Step::Handed { handed, arrived } => {
            let waited = Duration::from_nanos(at.saturating_sub(arrived));
            return Some((holding(handed, waited), waited));
        }
        Step::Ended { retry_after } => decision.refused_after(limit, retry_after),
    }
    Some((decision, Duration::ZERO))
}

/// Whether limit `l` can decide `request`, given why the log cannot drive it
/// (`skipped`) and the parts only a line's recorded keys carry (`per_line`); else it is
/// counted as not simulated for it, in the limit's tally and in route `route`'s.
fn simulated(
    skipped: &Option<String>,
    per_line: &[KeyPart],
    tally: &mut Tally,
    l: LimitId,
    route: RouteId,
    request: &Logged,
) -> bool {
    if drives(skipped, per_line, request) {
        return true;
    }
    match per_line.iter().find(|p| !request.recorded.contains(p)) {
        Some(part) if skipped.is_none() => tally.limits[l].unrecorded(part),
        _ => tally.limits[l].not_simulated += 1,
    }
    tally.routes[route].not_simulated(l);
    false
}

/// Whether a limit can decide `request`: the log can drive it (`skipped` is `None`) and
/// the line records every part only recorded keys carry (`per_line`).
fn drives(skipped: &Option<String>, per_line: &[KeyPart], request: &Logged) -> bool {
    skipped.is_none() && per_line.iter().all(|p| request.recorded.contains(p))
}

/// Key parts of `config`'s limits that recorded keys put back in one field (`bearer` and
/// `header:authorization`, a cookie and `header:cookie`, `host` and `header:host`): a
/// line holding both can give only one of them as the proxy saw it.
fn shared_fields(config: &Config) -> Vec<String> {
    let keyed = |on: &dyn Fn(&KeyPart) -> bool| config.limits.iter().flat_map(|l| l.key.0.iter()).find(|p| on(p));
    let header = |name: http::HeaderName| keyed(&move |p| *p == KeyPart::Header(name.clone()));
    let pairs = [
        (keyed(&|p| *p == KeyPart::Bearer), header(http::header::AUTHORIZATION)),
        (keyed(&|p| matches!(p, KeyPart::Cookie(_))), header(http::header::COOKIE)),
        (keyed(&|p| *p == KeyPart::Host), header(http::header::HOST)),
    ];
    pairs
        .into_iter()
        .filter_map(|pair| match pair {
            (Some(one), Some(other)) => Some(format!(
                "limits are keyed on both {one} and {other}, which a line's recorded keys put back in one field: \
                 where a line records both, one of them is not replayed as the proxy saw it"
            )),
            _ => None,
        })
        .collect()
}

/// Whether every line of a log carrying `carried` has `part` (`host_given`: `--host`
/// names the host of lines without one).
fn carried_by_format(part: &KeyPart, carried: &Carried, host_given: bool) -> bool {
    let has_header = |name: &http::HeaderName| carried.headers.contains(name);
    match part {
        KeyPart::Ip(_) | KeyPart::Method | KeyPart::Path | KeyPart::Capture(_) => true,
        KeyPart::Host => carried.host || host_given,
        // Only sluicegate's own lines, with `keys`, record a verified token's claims or a
        // body's fields.
        KeyPart::Jwt(_) | KeyPart::Json(_) => false,
        KeyPart::Header(name) => has_header(name),
        KeyPart::Bearer => has_header(&http::header::AUTHORIZATION),
        KeyPart::Query(name) => carried.query || carried.args.iter().any(|a| a == name.as_ref()),
        KeyPart::Cookie(name) => {
            has_header(&http::header::COOKIE) || carried.cookies.iter().any(|c| c == name.as_ref())
        }
    }
}

/// Whether only a line's recorded keys carry `part`: sluicegate's lines with `keys`.
fn recorded_only(part: &KeyPart, carried: &Carried, host_given: bool) -> bool {
    carried.recorded_keys && part.logged_apart() && !carried_by_format(part, carried, host_given)
}

/// Why `limit` cannot be simulated from a log carrying `carried`, if it cannot.
fn not_simulated(limit: &crate::config::Limit, carried: &Carried, host_given: bool) -> Option<String> {
    if limit.windows.iter().any(|p| p.is_concurrency()) && !carried.duration {
        return Some(
            "a concurrency limit needs each request's duration ($request_time or $upstream_response_time, \
             or sluicegate's duration_ms), which the log does not carry"
                .to_owned(),
        );
    }
    let missing: Vec<String> = limit
        .key
        .0
        .iter()
        .filter(|part| !carried_by_format(part, carried, host_given) && !recorded_only(part, carried, host_given))
        .map(|part| format!("{part} ({})", nginx_variable(part)))
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "its key needs {}, which the log does not carry: every request would have no key and one key \
             cannot stand for all",
            missing.join(", ")
        )
    })
}

/// The fields an allow-list (or override) matches on that a log carrying `carried` lacks.
fn unseen_fields(allow: &Allow, carried: &Carried) -> Vec<String> {
    let mut unseen: Vec<String> = allow
        .headers
        .iter()
        .filter(|(name, _)| !carried.headers.contains(name))
        .map(|(name, _)| format!("the header {name}"))
        .collect();
    unseen.dedup();
    if !allow.tokens.is_empty() && !carried.headers.contains(&http::header::AUTHORIZATION) {
        unseen.push("bearer tokens".to_owned());
    }
    unseen
}

/// The nginx variable that logs a key part.
fn nginx_variable(part: &KeyPart) -> String {
    match part {
        KeyPart::Header(name) => format!("$http_{}", name.as_str().replace('-', "_")),
        KeyPart::Bearer => "$http_authorization".to_owned(),
        KeyPart::Query(name) => format!("$arg_{name}"),
        KeyPart::Cookie(name) => format!("$cookie_{name}"),
        KeyPart::Host => "$host".to_owned(),
        KeyPart::Ip(_) => "$remote_addr".to_owned(),
        KeyPart::Method | KeyPart::Path | KeyPart::Capture(_) => "$request".to_owned(),
        KeyPart::Jwt(_) => "sluicegate's `keys`: no nginx variable holds a verified claim".to_owned(),
        KeyPart::Json(_) => "sluicegate's `keys`: no nginx variable holds a body's field".to_owned(),
    }
}
