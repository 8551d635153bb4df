//! The admission: the steps that decide a request, driven here and nowhere else, for
//! every reader of them. The proxy acts on its result, `explain` renders it, `simulate`'s
//! replay tallies it; a step added here (a queue, a candidate policy, a key read from the
//! body) is seen by all three.
//!
//! ```text
//! head checks (431 / 414, CONNECT, one valid Host; not for a logged line)
//!   -> client address      hop: the peer, or the rightmost untrusted forwarding hop
//!   -> route               front: normalized path, host, route, token, allow-list
//!   -> body size           a declared body over the route's max_body_bytes: 413, unread
//!   -> body fields         a route whose limits read JSON fields (`json:`): its body's
//!                          first `server.body_peek` bytes (`ReadBody`: the caller reads
//!                          them, then `resume`s); a field they read sent twice: 400
//!   -> keys                a key field sent twice, a key that must not be missing: 400
//!   -> hold                a key the upstream refused with a time to wait (upstream_hold)
//!   -> cost                what the request weighs
//!   -> decision            the gate's: local at once; `Pending` when Redis must be asked
//! ```
//!
//! How a reader wants the steps taken is its `Way`: the proxy spends (and asks Redis),
//! `explain` previews (spending nothing), the replay spends on its own clock and leaves
//! out the limits a log line cannot drive.

pub mod hold;

use std::net::IpAddr;
use std::sync::Arc;

use http::StatusCode;
use smallvec::SmallVec;

use crate::config::{Config, LimitId, LimitUse, RouteId};
use crate::front::body::Scan;
use crate::front::{self, Front, FrontError};
use crate::gate::{Decision, Gate};
use crate::grpc::Code;
use crate::hop;
use crate::policy::key::{ClaimPath, Claims, KeyPart};
use crate::router::Scheme;
use crate::wire::head::RequestHead;
use hold::{Hold, HoldKey, Holds};

/// A request as the admission reads it.
pub struct Asked<'a> {
    pub head: &'a RequestHead<'a>,
    /// The address it came from (of a logged line: its client's, as the proxy found it).
    pub peer: IpAddr,
    /// The length of its body, when its head declares one.
    pub declared: Option<u64>,
    /// How it came in: on a listener with TLS (`https`) or without; routes may match it.
    pub scheme: Scheme,
    pub origin: Origin<'a>,
    pub body: AskedBody<'a>,
}

/// A request's body, as the admission may read it.
#[derive(Clone, Copy)]
pub enum AskedBody<'a> {
    /// None (or none to read: a logged line's).
    None,
    /// On the wire, unread: a route whose limits read its fields pauses the admission
    /// (`Verdict::ReadBody`) for the caller to read it.
    Unread,
    /// Given whole (to `explain`).
    Given(&'a [u8]),
}

/// Where a request comes from: what it can still break, and where its claims are.
#[derive(Clone, Copy)]
pub enum Origin<'r> {
    /// On the wire: its head is checked, its token verified.
    Wire,
    /// Given whole to `explain`: checked and verified as on the wire, but a token that
    /// names a key not fetched yet wakes no fetch (explaining must cost the key server
    /// nothing).
    Explained,
    /// An access-log line: its head passed the checks when it was served, and its
    /// token was verified then (`claims`, as the line recorded them). `host` stands for
    /// the host of a line that names none.
    Logged { claims: Option<&'r Arc<Claims>>, host: Option<&'r str> },
}

/// How a reader wants the steps taken.
pub struct Way<'w> {
    pub decide: Decide,
    /// The routes' held keys, when holds are looked at (a replay does not: a log does
    /// not say what the upstream would have answered).
    pub holds: Option<&'w Holds>,
    /// Which of a route's limits the request can drive (a replayed line cannot drive a
    /// limit keyed on a part it does not carry): those left out neither decide nor
    /// refuse it. `None`: all.
    pub drives: Option<&'w dyn Fn(RouteId, LimitId) -> bool>,
}

/// How the limits decide.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Decide {
    /// Spending: the local limits now, the global ones left `Pending` for the caller
    /// to ask Redis (`Gate::decide`).
    Spend,
    /// Storing nothing (`Gate::preview`): the local limits only, their state as it is.
    Preview,
}

/// Why a request is refused before any limit decides it; each is the client's fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The steps in front of the limits refused it (a bad head, no route, a bad token
    /// or cost).
    #[error(transparent)]
    Front(#[from] FrontError),
    /// The declared `Content-Length` is over the route's limit (refused unread), or a
    /// body read for the fields its limits read grew past it.
    #[error("request body of {length} bytes or more is larger than {limit}")]
    BodyTooLarge { length: u64, limit: u64 },
    /// The request repeats a field that a limit of its route is keyed on: the limiter
    /// would count one value while the upstream may act on another.
    #[error("limit {limit:?} counts requests by {field}, which this request carries more than once; send it once")]
    DuplicateKeyField { limit: String, field: String, id: LimitId },
    /// Its body, read for the fields its limits are keyed on, broke off, broke its
    /// framing, or stalled past `server.body_read_timeout` (`timeout`).
    #[error("the request body could not be read for the fields limit {limit:?} reads: {why}")]
    BodyUnread { limit: String, why: String, timeout: bool },
    /// The request lacks the key of a limit with `on_missing_key: refuse`.
    #[error("limit {limit:?} counts requests by {key}, which this request lacks")]
    MissingKey {
        limit: String,
        key: String,
        /// The limit, for the count of its missing keys.
        id: LimitId,
        /// The key is a token's (`bearer`, `jwt:`): the request is not authenticated.
        token: bool,
    },
}

impl Refused {
    /// Every name `outcome` gives.
    pub const OUTCOMES: [&'static str; 10] = [
        "no_route",
        "bad_request",
        "bad_path",
        "invalid_cost",
        "invalid_token",
        "body_too_large",
        "repeated_key_field",
        "missing_key",
        "body_timeout",
        "bad_body",
    ];

    /// Its name wherever an outcome is named: `sluicegate_requests_total`, the access
    /// log, `explain` and the replay.
    pub fn outcome(&self) -> &'static str {
        match self {
            Refused::Front(FrontError::NoRoute) => "no_route",
            Refused::Front(FrontError::BadPath(_)) => "bad_path",
            Refused::Front(FrontError::InvalidCost { .. } | FrontError::CostTooHigh { .. }) => "invalid_cost",
            Refused::Front(FrontError::InvalidToken { .. }) => "invalid_token",
            Refused::Front(_) => "bad_request",
            Refused::BodyTooLarge { .. } => "body_too_large",
            Refused::DuplicateKeyField { .. } => "repeated_key_field",
            Refused::MissingKey { .. } => "missing_key",
            Refused::BodyUnread { timeout: true, .. } => "body_timeout",
            Refused::BodyUnread { .. } => "bad_body",
        }
    }

    /// The status the request is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            Refused::Front(e) => e.status(),
            Refused::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Refused::DuplicateKeyField { .. } | Refused::MissingKey { .. } => StatusCode::BAD_REQUEST,
            Refused::BodyUnread { timeout: true, .. } => StatusCode::REQUEST_TIMEOUT,
            Refused::BodyUnread { .. } => StatusCode::BAD_REQUEST,
        }
    }

    /// The gRPC status a gRPC call gets for it: what gRPC clients expect of a request
    /// they got wrong (`INVALID_ARGUMENT`, `UNAUTHENTICATED` without the token a limit
    /// counts by), not the `INTERNAL` that HTTP's 400 maps to, which reads as a server's
    /// crash.
    pub fn grpc_code(&self) -> Code {
        match self {
            Refused::MissingKey { token: true, .. } => Code::UNAUTHENTICATED,
            Refused::MissingKey { .. } | Refused::DuplicateKeyField { .. } => Code::INVALID_ARGUMENT,
            Refused::BodyUnread { timeout: true, .. } => Code::DEADLINE_EXCEEDED,
            Refused::BodyUnread { .. } => Code::INVALID_ARGUMENT,
            Refused::BodyTooLarge { .. } => Code::RESOURCE_EXHAUSTED,
            Refused::Front(e) if e.status() == StatusCode::BAD_REQUEST => Code::INVALID_ARGUMENT,
            Refused::Front(e) => Code::of_http(e.status().as_u16()),
        }
    }
}

/// What the admission found of a request, step by step, and where it ended.
pub struct Admission<'a> {
    /// The client's address (the peer's, or a trusted proxy's word).
    pub client_ip: IpAddr,
    /// The peer is a trusted proxy.
    pub trusted_peer: bool,
    /// The host it names (or stands for), once its head passed the checks.
    pub host: Option<&'a str>,
    /// Its route, key source and exemption, once a route took it.
    pub front: Option<Front<'a>>,
    /// The limits that decide it: its route's (none when exempt; of a replayed line,
    /// those it drives).
    pub limits: SmallVec<[LimitUse; 4]>,
    /// Dry-run limits keyed on a field it repeats, with that field: an enforced one
    /// would have refused it (said, not refused).
    pub repeated_dry: SmallVec<[(LimitId, String); 1]>,
    /// Its key in its route's held keys, when the route holds.
    pub hold: Option<HoldKey>,
    /// What it weighs, once known.
    pub cost: Option<u64>,
    pub verdict: Verdict,
}

/// Where the admission ended.
// Made once a request and taken apart where it is made: boxing the decision would cost
// an allocation a request.
#[allow(clippy::large_enum_variant)]
pub enum Verdict {
    /// Refused before any limit decides.
    Refused(Refused),
    /// Its key is held: the upstream asked for none of its requests until then.
    Held(Hold),
    /// Decided by the limits.
    Decided(Decision),
    /// Its route's limits read fields of its body, unread: the caller reads its first
    /// `server.body_peek` bytes and `resume`s the admission with them.
    ReadBody,
    /// A global limit may decide it: Redis must be asked (`Gate::decide` on the
    /// admission's limits, key source and cost), which the caller awaits.
    Pending,
}

/// Takes the steps of `asked` against `config` and `gate`, as `way` says.
pub fn admit<'a>(config: &Config, gate: &Gate, asked: &Asked<'a>, way: &Way<'_>) -> Admission<'a> {
    let client_ip = match asked.origin {
        Origin::Wire | Origin::Explained => {
            hop::client_ip(asked.peer, asked.head.fields, &config.trusted_proxies, config.forwarded)
        }
        // A line's client is the one the proxy found.
        Origin::Logged { .. } => asked.peer,
    };
    let mut admission = Admission {
        client_ip,
        trusted_peer: hop::is_trusted(asked.peer.to_canonical(), &config.trusted_proxies),
        host: None,
        front: None,
        limits: SmallVec::new(),
        repeated_dry: SmallVec::new(),
        hold: None,
        cost: None,
        verdict: Verdict::Pending,
    };
    if let Err(refused) = steps(config, gate, asked, way, &mut admission, None) {
        admission.verdict = Verdict::Refused(refused);
    }
    // Paused for a body there is no wire to read from.
    if let Verdict::ReadBody = admission.verdict
        && !(matches!(asked.body, AskedBody::Unread) && asked.declared != Some(0))
    {
        read_given(config, gate, asked, way, &mut admission);
    }
    admission
}

/// The steps in their order, each recording what it found in `admission`; the first
/// that refuses ends them. Inlined into `admit` (measured: out of line, with the second
/// caller a body route's resumption adds, a request cost 60 instructions more, and a copy
/// of its route's findings). `read`: its body, as far as read (to its end: `true`), when
/// the admission resumes for a route that matches on it.
#[inline(always)]
fn steps<'a>(
    config: &Config,
    gate: &Gate,
    asked: &Asked<'a>,
    way: &Way<'_>,
    admission: &mut Admission<'a>,
    read: Option<(&Scan, bool)>,
) -> Result<(), Refused> {
    let (host, claimed) = read_head(config, asked)?;
    admission.host = host;
    let known = read.map(|(scan, ended)| scan.fields(ended));
    let mut found = front::front(config, asked.head, admission.client_ip, host, asked.scheme, claimed, known.as_ref())?;
    found.src.trusted_peer = admission.trusted_peer;
    if config.body_routes && read.is_none() && config.routes[found.route].body_match.is_some() {
        // Its route matches on its body: the route is its own only if the body meets
        // the match, known once read (`resume`, or `admit` for a body given whole).
        admission.front = Some(found);
        admission.verdict = Verdict::ReadBody;
        return Ok(());
    }
    if config.body_routes
        && let Some(field) = read.and_then(|(scan, _)| scan.repeated())
    {
        repeated_route_field(config, field)?;
    }
    let route = &config.routes[found.route];
    let found = &*admission.front.insert(found);
    // Refused before it takes any quota, and unread: no `100 Continue` is sent.
    if let (Some(length), Some(limit)) = (asked.declared, route.max_body_bytes)
        && length > limit
    {
        return Err(Refused::BodyTooLarge { length, limit });
    }
    let drives = |limit: LimitId| way.drives.is_none_or(|drives| drives(found.route, limit));
    admission.limits = found.limits(config).iter().copied().filter(|u| drives(u.limit)).collect();
    if let Some(fields) = &route.body_fields {
        match (read, asked.body) {
            (Some((scan, ended)), _) => body_read(config, admission, scan, ended)?,
            (None, AskedBody::Unread) if asked.declared != Some(0) => {
                admission.verdict = Verdict::ReadBody;
                return Ok(());
            }
            (None, AskedBody::Given(body)) => {
                let mut scan = Scan::new(Arc::clone(fields));
                scan.feed(body);
                body_read(config, admission, &scan, true)?;
            }
            (None, AskedBody::Unread | AskedBody::None) => {}
        }
    }
    limited(config, gate, asked, way, admission)
}

/// The admission of a request that paused for its body (its route matches on it) when
/// the body is given whole, or there is none: read here, and resumed. Out of line: the
/// other requests' steps stay as short as before.
#[inline(never)]
fn read_given<'a>(config: &Config, gate: &Gate, asked: &Asked<'a>, way: &Way<'_>, admission: &mut Admission<'a>) {
    let body = match asked.body {
        AskedBody::Given(body) => body,
        // None: routed as a request without the fields.
        AskedBody::Unread | AskedBody::None => &[],
    };
    // The fields of every route it may go to.
    let route = admission.front.as_ref().map(|f| f.route);
    let fields = route.and_then(|r| config.routes[r].body_fields.clone()).unwrap_or_else(|| Arc::from([]));
    let mut scan = Scan::new(fields);
    scan.feed(body);
    resume(config, gate, asked, way, admission, &scan, true);
}

/// A body that repeats `field` is refused if a route matches on it: which value routed
/// the request would be a guess.
#[cold]
fn repeated_route_field(config: &Config, field: &ClaimPath) -> Result<(), Refused> {
    let routes_read = |r: &crate::config::Route| r.body_match.as_ref().is_some_and(|m| m.paths().any(|p| p == field));
    match config.routes.iter().any(routes_read) {
        true => Err(Refused::Front(FrontError::RepeatedRouteField(field.to_string()))),
        false => Ok(()),
    }
}

/// Resumes the admission that stopped at `ReadBody`, its body read as far as `scan` (to
/// its end: `ended`).
pub fn resume<'a>(
    config: &Config,
    gate: &Gate,
    asked: &Asked<'a>,
    way: &Way<'_>,
    admission: &mut Admission<'a>,
    scan: &Scan,
    ended: bool,
) {
    debug_assert!(matches!(admission.verdict, Verdict::ReadBody));
    admission.verdict = Verdict::Pending;
    // A route that matches on the body is sure once it is read: routed again with it.
    let by_body = |f: &Front<'_>| config.routes[f.route].body_match.is_some();
    let done = match config.body_routes && admission.front.as_ref().is_some_and(by_body) {
        true => steps(config, gate, asked, way, admission, Some((scan, ended))),
        false => body_read(config, admission, scan, ended).and_then(|()| limited(config, gate, asked, way, admission)),
    };
    if let Err(refused) = done {
        admission.verdict = Verdict::Refused(refused);
    }
}

/// Ends the admission of a body it could not read.
pub fn body_unread(config: &Config, admission: &mut Admission<'_>, why: String, timeout: bool) {
    // The enforced limit it reads the body for, before a dry-run one.
    let limit = admission.front.as_ref().and_then(|f| body_limits(config, f).min_by_key(|&l| config.limits[l].dry_run));
    let limit = limit.map_or_else(String::new, |l| config.limits[l].name.clone());
    admission.verdict = Verdict::Refused(Refused::BodyUnread { limit, why, timeout });
}

/// The limits that may decide the request of `found` and read its body.
fn body_limits<'c>(config: &'c Config, found: &'c Front<'_>) -> impl Iterator<Item = LimitId> + 'c {
    let reads = |l: &LimitId| config.limits[*l].key.0.iter().any(|p| matches!(p, KeyPart::Json(_)));
    found.candidates(config).iter().copied().filter(reads)
}

/// The body's fields as `scan` read them, given to the key source; a field a limit
/// reads, sent twice, refuses the request if that limit is enforced.
fn body_read(config: &Config, admission: &mut Admission<'_>, scan: &Scan, ended: bool) -> Result<(), Refused> {
    let Some(found) = admission.front.as_mut() else { return Ok(()) };
    found.src.body = Some(Box::new(scan.fields(ended)));
    let Some(field) = scan.repeated() else { return Ok(()) };
    let keyed = |l: &LimitId| config.limits[*l].key.0.iter().any(|p| matches!(p, KeyPart::Json(f) if f == field));
    let found = &*found;
    for limit in body_limits(config, found).filter(keyed) {
        let part = format!("json:{field}");
        match config.limits[limit].dry_run {
            true => admission.repeated_dry.push((limit, part)),
            false => {
                let field = KeyPart::Json(field.clone()).field();
                return Err(Refused::DuplicateKeyField { limit: config.limits[limit].name.clone(), field, id: limit });
            }
        }
    }
    Ok(())
}

/// The steps from the keys on: keys, hold, cost, decision.
fn limited<'a>(
    config: &Config,
    gate: &Gate,
    asked: &Asked<'a>,
    way: &Way<'_>,
    admission: &mut Admission<'a>,
) -> Result<(), Refused> {
    let Some(found) = admission.front.as_ref() else { return Ok(()) };
    let route = &config.routes[found.route];
    let drives = |limit: LimitId| way.drives.is_none_or(|drives| drives(found.route, limit));
    if let Some(refused) = keys_refused(config, found, &admission.limits, &drives, &mut admission.repeated_dry) {
        return Err(refused);
    }
    // A key its upstream refused with a time to wait is answered here until then,
    // before it takes any quota.
    if let Some(holds) = way.holds {
        admission.hold = holds.key(found.route, gate.limiters(), &found.src);
        let held = admission.hold.as_ref().and_then(|key| holds.table(found.route)?.held(key, gate.clock().now()));
        if let Some(held) = held {
            admission.verdict = Verdict::Held(held);
            return Ok(());
        }
    }
    let cost = front::cost(config, route, asked.head.fields)?;
    admission.cost = Some(cost);
    admission.verdict = decide(config, gate, way.decide, found, &admission.limits, cost);
    Ok(())
}

/// The request's host, and how its token's claims are read: a head the proxy reads
/// (checked first, an oversized one refused as a whole before anything reads it), or an
/// access-log line's.
#[inline(always)]
fn read_head<'a>(config: &Config, asked: &Asked<'a>) -> Result<(Option<&'a str>, front::Claimed<'a>), Refused> {
    Ok(match asked.origin {
        Origin::Wire => (front::check_head(asked.head, config)?, front::Claimed::Verify),
        Origin::Explained => (front::check_head(asked.head, config)?, front::Claimed::Explained),
        Origin::Logged { claims, host } => (front::request_host(asked.head).or(host), front::Claimed::Logged(claims)),
    })
}

/// The limits' verdict on `found` at `cost`: pending when Redis must be asked for a
/// global limit the request may meet (an override's included); without one the decision
/// never waits, and `check` is what `decide` does.
fn decide(config: &Config, gate: &Gate, way: Decide, found: &Front<'_>, limits: &[LimitUse], cost: u64) -> Verdict {
    let global = |l: &LimitId| gate.store().is_some_and(|store| store.is_global(*l));
    match way {
        Decide::Spend if found.candidates(config).iter().any(global) => Verdict::Pending,
        Decide::Spend => Verdict::Decided(gate.check(limits, &found.src, cost)),
        // Global limits keep their state in Redis, which a preview does not ask (it
        // would spend): only a gate of the reader's own (`explain::local`) decides them.
        Decide::Preview => {
            let local: SmallVec<[LimitUse; 4]> =
                limits.iter().copied().filter(|u| gate.store().is_none_or(|store| !store.is_global(u.limit))).collect();
            Verdict::Decided(gate.preview(&local, &found.src, cost))
        }
    }
}

/// Why `found`'s keys refuse it, if they do: a field an enforced limit it may meet is
/// keyed on, repeated (those of dry-run limits go to `repeated_dry`); or the missing key
/// of an enforced limit of `limits` with `on_missing_key: refuse`.
fn keys_refused(
    config: &Config,
    found: &Front<'_>,
    limits: &[LimitUse],
    drives: &dyn Fn(LimitId) -> bool,
    repeated_dry: &mut SmallVec<[(LimitId, String); 1]>,
) -> Option<Refused> {
    let candidates = found.candidates(config).iter().copied().filter(|&l| drives(l));
    for limit in candidates {
        let Some(part) = config.limits[limit].key.duplicated(&found.src) else { continue };
        match config.limits[limit].dry_run {
            true => repeated_dry.push((limit, part.to_string())),
            false => {
                let (id, limit) = (limit, config.limits[limit].name.clone());
                return Some(Refused::DuplicateKeyField { limit, field: part.field(), id });
            }
        }
    }
    let missing = front::refused_missing_keys(config, limits, &found.src).find(|&l| !config.limits[l].dry_run)?;
    let limit = &config.limits[missing];
    let token = limit.key.0.iter().any(|part| matches!(part, KeyPart::Bearer | KeyPart::Jwt(_)));
    Some(Refused::MissingKey { limit: limit.name.clone(), key: key_words(limit), id: missing, token })
}

/// A limit's key in words: its parts, `ip`, `header:x-api-key`, joined by `+`.
pub fn key_words(limit: &crate::config::Limit) -> String {
    limit.key.0.iter().map(ToString::to_string).collect::<Vec<_>>().join(" + ")
}

#[cfg(test)]
mod tests;
