//! `sluicegate explain` and the admin API's `POST /explain`: why a request is answered
//! as it is. The request goes through the steps the proxy takes (`front`: head checks,
//! client address, normalized path and host, route, allow-list, cost; the gate's
//! overrides and allow-lists per limit), and is decided by the gate's `preview`, which
//! decides as `check` does and stores nothing. Nothing here routes, keys or decides on
//! its own: it only says what those steps found.
//!
//! The command line decides against a gate of its own, fresh (after `--after N`
//! identical requests); the admin API against the live tables, spending nothing.

pub mod asked;
mod text;

use std::net::IpAddr;
use std::time::Duration;

use http::Method;
use serde::{Deserialize, Serialize};

use crate::config::position::Positions;

use crate::admission::hold::Holds;
use crate::admission::{self, Asked, AskedBody, Decide, Origin, Refused, Verdict, Way};
use crate::config::{Action, Config, ForwardedMode, LimitId, PathMatch, Route, RouteId, Scope};
use crate::front::{self, FrontError};
use crate::gate::{Decision, Gate, Permits};
use crate::hop;
use crate::limit::inspect::KeyState;
use crate::limit::key_text::KeyText;
use crate::limit::{Outcome, Standing};
use crate::metrics::RequestOutcome;
use crate::policy::key::KeySource;
use crate::proxy::error::ProxyError;
use crate::proxy::response;
use crate::router::{Mismatch, Scheme, mismatch};
use crate::wire::head::{Fields, Known, RequestHead};

/// Earlier routes listed with why they did not match, at most.
const PASSED_OVER_SHOWN: usize = 100;

/// Everything `explain` found out about one request, in the order the proxy finds it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Explanation {
    pub method: String,
    /// The target as sent.
    pub target: String,
    /// The normalized path that routes and `path` keys see (`None`: it cannot be
    /// normalized, and the request is refused).
    pub path: Option<String>,
    /// The host, without its port, as routing reads it.
    pub host: Option<String>,
    /// How the request is taken to have come in: `https` (on a listener with TLS) for an
    /// `https://` URL, else `http`.
    pub scheme: String,
    pub client: Client,
    /// The routes before the one taken (or all, when none is), each with why it did
    /// not match; at most `PASSED_OVER_SHOWN`, `passed_over_more` saying how many more.
    pub passed_over: Vec<PassedOver>,
    pub passed_over_more: usize,
    pub route: Option<RouteTaken>,
    /// What the request weighs in the route's limits.
    pub cost: Option<u64>,
    /// The route's limits, in the route's order.
    pub limits: Vec<LimitExplained>,
    /// Where the limits' state comes from: `empty` (a fresh state, after `after`
    /// identical requests) or `live` (the running instance's tables).
    pub state: String,
    /// Identical requests decided before this one, from an empty state.
    pub after: u64,
    pub answer: Answer,
    pub notes: Vec<String>,
    /// How the live candidate would decide it, from its own state (`POST /explain` while
    /// a candidate is live: `state` is `candidate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate: Option<Box<Explanation>>,
}

/// The client address and how it was found.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Client {
    pub address: IpAddr,
    pub peer: IpAddr,
    pub how: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PassedOver {
    pub route: String,
    pub index: usize,
    /// Its line in the configuration file, where the file is at hand.
    pub line: Option<usize>,
    pub why: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RouteTaken {
    pub name: String,
    pub index: usize,
    pub line: Option<usize>,
    /// `upstream NAME`, or `respond STATUS`.
    pub action: String,
    /// The route's allow-list exempts the request from all its limits.
    pub exempt: bool,
}

/// One limit of the route and what it made of the request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LimitExplained {
    /// The limit as the route lists it.
    pub limit: String,
    pub line: Option<usize>,
    /// The limit that decides instead, by an override.
    pub decided_by: Option<String>,
    /// The route's own burst on it, if it gives one.
    pub burst: Option<u64>,
    pub scope: String,
    pub dry_run: bool,
    /// The request's key, written as log lines, `/bans` and `simulate` write it (`None`:
    /// every part is missing).
    pub key: Option<String>,
    /// The key's parts the request lacks.
    pub missing: Vec<String>,
    /// Why the limit does not decide the request, if it does not.
    pub skipped: Option<String>,
    /// The key's state as the request finds it (as `GET /limits/NAME` shows it).
    pub before: Option<KeyState>,
    /// Where each window stands once the request is decided (as it was, if refused).
    pub after: Vec<WindowAfter>,
    /// `passed`, `delayed`, `rejected`, `banned`, `annotated`, or `queued` (no slot of a
    /// concurrency limit with a queue is free: the request would wait for one) (a dry-run
    /// limit's: what it would do).
    pub outcome: Option<String>,
    /// The currency it counts, a money budget's: its `remaining` are micro-units of it.
    #[serde(default)]
    pub money: Option<String>,
    /// The row of its charge's prices the request's response is priced at (`*`: any
    /// other value's).
    #[serde(default)]
    pub priced_as: Option<String>,
    /// The key's own count it is decided with (`limit_from`), where it came from
    /// (`operator`, `header`, `jwt`), and whether it was clamped to the bounds.
    #[serde(default)]
    pub own_count: Option<OwnCount>,
    /// It annotates the request, which is forwarded (`RateLimit-Exceeded`): over it with
    /// `action: annotate`, or at or above its `annotate_from` (a dry-run limit's: it would;
    /// never of a request another limit refuses).
    #[serde(default)]
    pub annotated: bool,
    /// Its queue (a concurrency limit's `queue:`), and where the request would stand in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueExplained>,
    /// Its ceiling now, an adaptive concurrency limit's (`concurrency: adaptive`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceiling: Option<crate::limit::adaptive::CeilingShown>,
}

/// A concurrency limit's queue, as a request finds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueExplained {
    /// The request's class, when the queue has classes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    pub max: usize,
    pub max_wait_ms: f64,
    /// What tells its flows apart, and the request's flow, written as keys are.
    pub fair_by: String,
    pub flow: String,
    /// Requests waiting for the key's slots now.
    pub waiting: usize,
    /// The request would wait (the limit has no slot for it and refuses nothing else):
    /// its place in the round, itself included.
    pub position: Option<usize>,
}

/// One window once the request is decided.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WindowAfter {
    pub outcome: String,
    /// The wait it asks for (delayed) or after which the request would pass (rejected),
    /// in ms, to the nanosecond.
    pub ms: f64,
    /// Further units the key could send now without rejection.
    pub remaining: u64,
    pub reset_ms: f64,
    /// nginx's excess (requests in flight, for a concurrency limit).
    pub excess: f64,
    /// This request starts a ban, as long as `ms` says.
    pub bans: bool,
}

/// What the client gets.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Answer {
    /// The access log's outcome (`passed`, `delayed`, `rejected`, `banned`,
    /// `dry_run_rejected`, `store_error`, `annotated`), or `refused` for a request the
    /// front refuses.
    pub outcome: String,
    /// The status sluicegate answers with (`None`: the upstream's, once forwarded).
    pub status: Option<u16>,
    /// Why the front refuses the request.
    pub reason: Option<String>,
    /// How long the request waits before it is forwarded, in ms, to the nanosecond.
    pub wait_ms: f64,
    /// `upstream NAME` where it goes once admitted.
    pub forwarded_to: Option<String>,
    /// The fields sluicegate sets on the answer: `Retry-After`, `RateLimit-Policy`,
    /// `RateLimit`, `X-RateLimit-*`, and a refusal's `Content-Type`.
    pub headers: Vec<(String, String)>,
    /// The fields sluicegate sets on the request it forwards: the soft limits'
    /// `RateLimit-Exceeded` and `RateLimit`, when one annotates it.
    #[serde(default)]
    pub upstream_headers: Vec<(String, String)>,
    /// A refusal's body.
    pub body: Option<String>,
}

fn ms(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1e6
}

/// `config` for an explanation from an empty state: a global limit decided here as one
/// instance holding the whole budget (its state would be in Redis), as `simulate` does.
pub fn local(mut config: Config) -> (Config, Vec<String>) {
    let mut notes = Vec::new();
    for limit in &mut config.limits {
        if let Scope::Global { .. } = limit.scope {
            notes.push(format!(
                "limit {}: global; decided here as one instance holding the whole budget, from an empty state",
                limit.name
            ));
            limit.scope = Scope::Local;
        }
    }
    (config, notes)
}

/// Explains the request `head` from `peer`, come in by `scheme`, against `config`, the state of `gate` and
/// the keys `holds` holds (the live instance's; none for a state of the explanation's
/// own), through the proxy's own admission (`admission::admit`), previewed: nothing is
/// spent. `claimed`: `Logged` when the head is what an access-log line recorded, which
/// passed the head's checks when the proxy read it (a line carries no `Host` unless it
/// logs one), with the token's claims the line recorded. With `after`, `after` identical
/// requests are first admitted by `gate` (and held: their concurrency slots stay taken)
/// — only for a gate of the explanation's own, never the live one. `state` says which it
/// is.
#[allow(clippy::too_many_arguments)]
pub fn explain(
    config: &Config,
    gate: &Gate,
    holds: Option<&Holds>,
    head: &RequestHead<'_>,
    peer: IpAddr,
    scheme: Scheme,
    claimed: front::Claimed<'_>,
    body: Option<&[u8]>,
    after: u64,
    state: &str,
) -> Explanation {
    let head = *head;
    let (logged, origin) = match claimed {
        front::Claimed::Logged(claims) => (true, Origin::Logged { claims, host: None }),
        front::Claimed::Explained => (false, Origin::Explained),
        front::Claimed::Verify => (false, Origin::Wire),
    };
    let declared = declared_length(head.fields);
    let body = body.map_or(AskedBody::None, AskedBody::Given);
    let asked = Asked { head: &head, peer, declared, scheme, origin, body };
    // The identical requests before this one, held in progress.
    let spend = Way { decide: Decide::Spend, holds: None, drives: None };
    let held: Vec<Permits> = (0..after)
        .filter_map(|_| match admission::admit(config, gate, &asked, &spend).verdict {
            Verdict::Decided(Decision::Pass { permits, .. }) => Some(permits),
            _ => None,
        })
        .collect();
    let admitted = admission::admit(config, gate, &asked, &Way { decide: Decide::Preview, holds, drives: None });
    let address = admitted.client_ip;
    let grpc = crate::grpc::is_grpc(head.fields.first_of(Known::ContentType));
    let mut explanation = Explanation {
        method: head.method.to_string(),
        target: head.target.to_owned(),
        path: None,
        host: front::request_host(&head).map(str::to_ascii_lowercase),
        scheme: scheme.to_string(),
        client: Client { address, peer, how: how_found(config, peer, address, head.fields) },
        passed_over: Vec::new(),
        passed_over_more: 0,
        route: None,
        cost: admitted.cost,
        limits: Vec::new(),
        state: state.to_owned(),
        after,
        answer: Answer {
            outcome: "refused".to_owned(),
            status: None,
            reason: None,
            wait_ms: 0.0,
            forwarded_to: None,
            headers: Vec::new(),
            upstream_headers: Vec::new(),
            body: None,
        },
        notes: Vec::new(),
        candidate: None,
    };
    // The route the request took: found, or found before its token failed.
    let taken = match (&admitted.front, &admitted.verdict) {
        (Some(front), _) => Some(front.route),
        (None, Verdict::Refused(Refused::Front(FrontError::InvalidToken { route, .. }))) => Some(*route),
        _ => None,
    };
    // Its normalized path and host, for the routes passed over (the route's own key
    // source, or the head's when no route took it).
    let head_checked = logged || front::check_head(&head, config).is_ok();
    let own;
    let source = match &admitted.front {
        Some(front) => Some(&front.src),
        None if head_checked => {
            own = front::source(&head, address, admitted.host).ok();
            own.as_ref()
        }
        None => None,
    };
    if let Some(src) = source {
        explanation.path = Some(String::from_utf8_lossy(&src.path).into_owned());
        let taken = taken.map_or(config.routes.len(), |r| r.index());
        explanation.passed_over(config, head.method, src, scheme, taken);
    }
    if let Some(index) = taken {
        let route = &config.routes[index];
        let exempt = admitted.front.as_ref().is_some_and(|f| f.exempt);
        let action = action(config, route);
        explanation.route =
            Some(RouteTaken { name: route.name.clone(), index: index.index(), line: None, action, exempt });
    }
    match &admitted.verdict {
        Verdict::Refused(refused) => {
            let error = ProxyError::from(refused.clone());
            explanation.answer.outcome = refused.outcome().to_owned();
            explanation.refuse(refused.status(), refused);
            explanation.answer.with_response(&response::error(&error, grpc));
        }
        Verdict::Held(hold) => {
            let left = hold.until.since(gate.clock().now());
            explanation.answer.outcome = crate::metrics::UPSTREAM_HOLD.to_owned();
            explanation.answer.reason = Some(format!(
                "the upstream refused the key {} with a time to wait: held here for {:.1} s more",
                hold.key,
                left.as_secs_f64()
            ));
            explanation.answer.with_response(&response::held(hold, left, config.rejection_body, grpc));
        }
        Verdict::Decided(decision) => {
            if let Some(front) = &admitted.front {
                let route = &config.routes[front.route];
                let before: Vec<Option<KeyState>> =
                    route.candidates.iter().map(|&l| gate.limiters().inspect(l, &front.src)).collect();
                // A line's recorded credential is its digest already: written as it is.
                let text = gate.limiters().key_text().clone();
                let text = if logged { text.recorded() } else { text };
                explanation.limits = route
                    .limits
                    .iter()
                    .map(|&used| {
                        let state =
                            |l: LimitId| route.candidates.iter().position(|&c| c == l).and_then(|i| before[i].clone());
                        let src = &front.src;
                        let priority = route.priority.as_deref();
                        explain_limit(config, gate, &text, src, front.exempt, used, decision, state, priority)
                    })
                    .collect();
                explanation.answer = answer(config, route, decision, grpc);
                if let Some(limit) = gate.queue_of(decision) {
                    explanation.notes.push(format!(
                        "limit {} has no slot free for it: it would wait in the limit's queue, and be forwarded \
                         once handed a slot (if its other limits still admit it); the answer is its refusal if \
                         none comes within max_wait",
                        config.limits[limit].name
                    ));
                }
            }
        }
        // A preview never asks Redis; a body is given whole or not at all.
        Verdict::Pending | Verdict::ReadBody => {}
    }
    if let Some(front) = &admitted.front
        && let Some(fields) = &config.routes[front.route].body_fields
        && matches!(asked.body, AskedBody::None)
    {
        let fields: Vec<String> = fields.iter().map(|f| format!("json:{f}")).collect();
        explanation.notes.push(format!(
            "its route's limits read {} of the JSON body, which was not given (curl's -d): taken as missing",
            fields.join(", ")
        ));
    }
    // A route that would have taken it by its body's fields, had one been given.
    if config.body_routes
        && matches!(asked.body, AskedBody::None)
        && let Some(front) = &admitted.front
    {
        let by_body = |r: RouteId| config.routes[r].body_match.is_some();
        let (method, path, host) = (asked.head.method, &front.src.path, front.src.host);
        if let Some(r) = config.router.find_where(method, path, host, asked.scheme, by_body)
            && r < front.route
        {
            explanation.notes.push(format!(
                "route {} matches on fields of the JSON body, which was not given (curl's -d): routed as a request \
                 without them",
                config.routes[r].name
            ));
        }
    }
    drop(held);
    explanation
}

/// The body length `fields` declare (`Content-Length`, once), as the wire would frame it.
fn declared_length(fields: Fields<'_>) -> Option<u64> {
    let mut lengths = fields.all_of(Known::ContentLength);
    let length = lengths.next()?;
    match lengths.next() {
        Some(_) => None,
        None => std::str::from_utf8(length).ok()?.trim().parse().ok(),
    }
}

impl Answer {
    /// The fields and body of `response`, the proxy's answer.
    fn with_response(&mut self, response: &crate::proxy::body::Response) {
        self.status = Some(response.status.as_u16());
        self.headers = (response.extra.iter())
            .map(|(name, value)| (name.to_string(), String::from_utf8_lossy(value.as_bytes()).into_owned()))
            .collect();
        self.body = response.body.made().map(|b| String::from_utf8_lossy(b).into_owned()).filter(|b| !b.is_empty());
    }
}

impl Explanation {
    /// The proxy refuses the request before its limits: with `status`, for `why`.
    fn refuse(&mut self, status: http::StatusCode, why: &impl std::fmt::Display) {
        self.answer.status = Some(status.as_u16());
        self.answer.reason = Some(why.to_string());
    }

    /// Lists the routes before `taken` (all of them when `taken` is their number: none
    /// matched), each with why it does not match.
    fn passed_over(&mut self, config: &Config, method: &Method, src: &KeySource<'_>, scheme: Scheme, taken: usize) {
        for (index, route) in config.routes.iter().take(taken).enumerate() {
            let missed = mismatch(&route.matcher, method, &src.path, src.host, scheme);
            if self.passed_over.len() == PASSED_OVER_SHOWN {
                self.passed_over_more += 1;
                continue;
            }
            let why = why_not(route, missed, method, src, scheme);
            self.passed_over.push(PassedOver { route: route.name.clone(), index, line: None, why });
        }
    }

    /// Fills in the lines of routes and limits from `src`, the configuration file's text.
    pub fn locate(&mut self, src: &str) {
        let positions = Positions::new(src);
        let route_line = |index: usize| positions.of(&format!("routes[{index}]")).0;
        for passed in &mut self.passed_over {
            passed.line = Some(route_line(passed.index));
        }
        if let Some(route) = &mut self.route {
            route.line = Some(route_line(route.index));
        }
        for limit in &mut self.limits {
            limit.line = positions.key_line(&format!("limits.{}", limit.limit));
        }
    }
}

/// Why `route` does not take the request, in words, from what `mismatch` found.
fn why_not(route: &Route, missed: Mismatch, method: &Method, src: &KeySource<'_>, scheme: Scheme) -> Vec<String> {
    let m = &route.matcher;
    let path = String::from_utf8_lossy(&src.path);
    let mut why = Vec::new();
    if missed.host {
        let want = m.host.as_deref().unwrap_or_default();
        why.push(match src.host {
            Some(host) => format!("host {} is not {want}", host.to_ascii_lowercase()),
            None => format!("the request names no host; the route wants {want}"),
        });
    }
    if missed.path {
        why.push(match &m.path {
            PathMatch::Prefix(prefix) => format!("path {path} does not start with {prefix}"),
            PathMatch::Exact(exact) => format!("path {path} is not {exact}"),
            PathMatch::Regex(regex) => format!("path {path} does not match {}", regex.pattern()),
            PathMatch::Any => format!("path {path}"),
        });
    }
    if missed.method {
        let methods: Vec<&str> = m.methods.iter().map(Method::as_str).collect();
        why.push(format!("method {method} is not one of {}", methods.join(", ")));
    }
    if missed.scheme {
        let want = m.scheme.map_or("", Scheme::as_str);
        why.push(format!("scheme {scheme} is not {want}"));
    }
    why
}

/// How the client address was found from `peer`.
fn how_found(config: &Config, peer: IpAddr, address: IpAddr, fields: Fields<'_>) -> String {
    let peer = peer.to_canonical();
    if !hop::is_trusted(peer, &config.trusted_proxies) {
        return "the peer's address: the peer is not in trusted_proxies".to_owned();
    }
    let field = match config.forwarded {
        ForwardedMode::XForwarded => "X-Forwarded-For",
        ForwardedMode::Rfc7239 => "Forwarded",
        ForwardedMode::Both if fields.contains(&http::header::FORWARDED) => "Forwarded",
        ForwardedMode::Both => "X-Forwarded-For",
    };
    let given = fields.contains(&http::header::FORWARDED) || fields.first_of(Known::XForwardedFor).is_some();
    match (given, address == peer) {
        (false, _) => format!("the peer's address: the peer is a trusted proxy, but the request has no {field}"),
        (true, true) => {
            format!("the peer's address: the peer is a trusted proxy and {field} names no untrusted hop it can read")
        }
        (true, false) => format!(
            "{field}, its rightmost hop not in trusted_proxies (the peer {peer} is a trusted proxy; hops left of it are the client's word)"
        ),
    }
}

/// `upstream NAME` or `respond STATUS`.
fn action(config: &Config, route: &Route) -> String {
    match &route.action {
        Action::Forward(upstream) => format!("upstream {}", config.upstreams[*upstream].name),
        Action::Respond(r) => format!("respond {}", r.status.as_u16()),
    }
}

/// What limit `used` of a route made of the request `src` (`exempt`: the route's
/// allow-list exempts it), from `decision` and the key's state before (`before`, by
/// limit); its key written by `text`; `priority`: the route's class in queues.
#[allow(clippy::too_many_arguments)]
fn explain_limit(
    config: &Config,
    gate: &Gate,
    text: &KeyText,
    src: &KeySource<'_>,
    exempt: bool,
    used: crate::policy::LimitUse,
    decision: &Decision,
    before: impl Fn(LimitId) -> Option<KeyState>,
    priority: Option<&str>,
) -> LimitExplained {
    let choice = gate.choice(used, src, false);
    let deciding = choice.used.limit;
    let limit = &config.limits[deciding];
    let limiters = gate.limiters();
    let missing: Vec<String> =
        limit.key.0.iter().filter(|part| part.value_in(src).is_none()).map(ToString::to_string).collect();
    let key = limiters.key_hash(deciding, src).map(|_| text.write(&limit.key, src));
    let global = matches!(limit.scope, Scope::Global { .. });
    let skipped = if exempt {
        Some("the route's allow-list exempts the request".to_owned())
    } else if choice.exempt {
        Some(format!("the allow-list of limit {} exempts the request", limit.name))
    } else if key.is_none() {
        Some(format!(
            "the request has no {}: the limit does not count it (on_missing_key: skip)",
            missing.join(", nor ")
        ))
    } else if global {
        Some("global: its state is in Redis, which explain does not ask (asking would spend)".to_owned())
    } else {
        None
    };
    let standings: Vec<&Standing> = match decision {
        Decision::Pass { standings, .. } | Decision::Reject { standings, .. } => {
            standings.iter().filter(|s| s.limit == deciding).collect()
        }
    };
    let result = decision.results().iter().find(|r| r.limit == deciding);
    // Over it, a soft limit annotates rather than refuses (whether or not another refuses
    // the request).
    let soft = limit.action == crate::config::LimitAction::Annotate;
    let queued = gate.queue_of(decision) == Some(deciding);
    let outcome = result.filter(|_| skipped.is_none()).map(|r| match (r.outcome, r.banned) {
        (Outcome::Rejected(_), _) if queued => "queued".to_owned(),
        (Outcome::Rejected(_), true) => "banned".to_owned(),
        (Outcome::Rejected(_), false) if soft => "annotated".to_owned(),
        (Outcome::Passed, _) if r.annotated => "annotated".to_owned(),
        (outcome, _) => outcome_word(outcome).to_owned(),
    });
    let annotated = result.is_some_and(|r| skipped.is_none() && r.annotated);
    LimitExplained {
        limit: config.limits[used.limit].name.clone(),
        line: None,
        decided_by: choice.overridden.then(|| limit.name.clone()),
        burst: choice.used.burst.map(|b| b.burst),
        scope: if global { "global" } else { "local" }.to_owned(),
        dry_run: limit.dry_run,
        key,
        missing,
        before: if skipped.is_none() { before(deciding) } else { None },
        after: if skipped.is_none() { standings.iter().map(|s| window_after(s)).collect() } else { Vec::new() },
        outcome,
        annotated,
        money: limit.money.as_ref().map(|m| m.currency.to_string()),
        priced_as: (limit.charge.as_ref())
            .and_then(|c| c.prices.as_ref())
            .map(|p| p.name(p.row(p.by.value_in(src).as_deref()))),
        own_count: if skipped.is_none() { own_count(gate, deciding, src) } else { None },
        queue: if skipped.is_none() { queue_explained(gate, text, deciding, src, decision, priority) } else { None },
        ceiling: gate.limiters().ceiling(deciding).map(|c| c.read()),
        skipped,
    }
}

/// The queue of limit `limit`, if it has one, and where `src` (of a route whose class
/// in queues is `priority`) would stand in it, `decision` being its limits'.
fn queue_explained(
    gate: &Gate,
    text: &KeyText,
    limit: LimitId,
    src: &KeySource<'_>,
    decision: &Decision,
    priority: Option<&str>,
) -> Option<QueueExplained> {
    let queue = gate.limiters().get(limit).queue.as_ref()?;
    let (class, waiting, position) = gate.limiters().queue_stands(limit, src, priority).unwrap_or(("", 0, 1));
    Some(QueueExplained {
        class: (!class.is_empty()).then(|| class.to_owned()),
        max: queue.max,
        max_wait_ms: ms(queue.max_wait),
        fair_by: queue.fair_by.0.iter().map(ToString::to_string).collect::<Vec<_>>().join(" + "),
        flow: text.write(&queue.fair_by, src),
        waiting,
        position: (gate.queue_of(decision) == Some(limit)).then_some(position),
    })
}

/// A key's own count as `explain` says it: an amount on a money budget.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OwnCount {
    pub count: serde_json::Value,
    pub from: String,
    pub clamped: bool,
}

/// The own count the key of `src` has in limit `limit`, if it has one (counted nowhere).
fn own_count(gate: &Gate, limit: LimitId, src: &KeySource<'_>) -> Option<OwnCount> {
    let tenant = gate.limiters().get(limit).tenant.as_ref()?;
    let key = gate.limiters().key_found(limit, src).0?;
    let counted = tenant.set.count(&tenant.from, key, src, false)?;
    let count = match tenant.from.money {
        true => crate::policy::charge::Money::amount(counted.count).into(),
        false => counted.count.into(),
    };
    Some(OwnCount { count, from: counted.whence.as_str().to_owned(), clamped: counted.clamped })
}

fn outcome_word(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Passed => "passed",
        Outcome::Delayed(_) => "delayed",
        Outcome::Rejected(_) => "rejected",
    }
}

fn window_after(s: &Standing) -> WindowAfter {
    let wait = match s.outcome {
        Outcome::Passed => Duration::ZERO,
        Outcome::Delayed(d) | Outcome::Rejected(d) => d,
    };
    WindowAfter {
        outcome: outcome_word(s.outcome).to_owned(),
        ms: ms(wait),
        remaining: s.remaining,
        reset_ms: ms(s.reset),
        excess: s.excess,
        bans: s.banned,
    }
}

/// What the client gets from `decision` on `route`: a refusal as the proxy makes it
/// (`response::refusal`), or a pass with its wait and the rate-limit fields the proxy
/// adds to the route's response.
fn answer(config: &Config, route: &Route, decision: &Decision, grpc: bool) -> Answer {
    let outcome = RequestOutcome::of(decision, &config.limits).as_str().to_owned();
    let quotas = response::all_quotas(config);
    let mut headers = Vec::new();
    if let Some(refusal) = response::refusal(config, &quotas, decision, grpc) {
        for (name, value) in &refusal.extra {
            headers.push((name.to_string(), String::from_utf8_lossy(value.as_bytes()).into_owned()));
        }
        let body = refusal.body.made().map(|b| String::from_utf8_lossy(b).into_owned());
        return Answer {
            outcome,
            status: Some(refusal.status.as_u16()),
            reason: None,
            wait_ms: 0.0,
            forwarded_to: None,
            headers,
            upstream_headers: Vec::new(),
            body,
        };
    }
    let (wait, results, standings) = match decision {
        Decision::Pass { wait, results, standings, .. } => (*wait, results.as_slice(), standings.as_slice()),
        Decision::Reject { .. } => (Duration::ZERO, &[][..], &[][..]),
    };
    // As the proxy annotates the request it forwards.
    let annotating = response::annotating_quotas(&config.limits);
    let annotation = response::Annotation::of(results, standings, &route.listed, &config.limits, &annotating);
    let upstream_headers = annotation.map_or_else(Vec::new, |a| {
        let text = |v: &[u8]| String::from_utf8_lossy(v).into_owned();
        let fields = a.fields();
        let named = config.annotation_field.to_string();
        vec![(named, text(fields.exceeded)), ("ratelimit".to_owned(), text(fields.ratelimit))]
    });
    if config.ratelimit_headers == crate::config::HeaderMode::All {
        let mut add = |name: http::HeaderName, value: crate::wire::message::FieldValue| {
            headers.push((name.to_string(), String::from_utf8_lossy(value.as_bytes()).into_owned()));
        };
        let standings = standings.iter().map(crate::limit::Shown::from);
        response::add_ratelimit_headers(&mut add, standings, &quotas, config.ratelimit_header_style);
    }
    let (status, forwarded_to) = match &route.action {
        Action::Respond(r) => (Some(r.status.as_u16()), None),
        Action::Forward(upstream) => (None, Some(config.upstreams[*upstream].name.clone())),
    };
    Answer { outcome, status, reason: None, wait_ms: ms(wait), forwarded_to, headers, upstream_headers, body: None }
}
