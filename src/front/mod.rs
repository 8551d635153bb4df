//! The steps in front of the limits, written once for every caller: the proxy (for
//! requests on the wire), `simulate` (for logged requests) and the admin API's key
//! lookup. From a request head and its client's address they find the normalized path,
//! the host, the route, the claims of its verified token (when the route reads them), the
//! key source, whether the route's allow-list exempts the request, and what it weighs;
//! or why the request cannot go on (`FrontError`).
//!
//! The proxy checks the head itself first (`check_head`: sizes, `CONNECT`, `Host`), as
//! only a request on the wire can break those.

pub mod body;
mod route;
pub mod size;

use std::net::IpAddr;
use std::sync::Arc;

use http::{Method, StatusCode};

use crate::config::{Config, Cost, LimitId, LimitUse, OnMissingKey, PathMatch, Route, RouteId, TokenUse};
use crate::jwt::{Fetch, TokenError};
use crate::path::{self, BadPath};
use crate::policy::key::{BodyFields, Claims, KeySource};
use crate::router::Scheme;
use crate::wire::head::{Fields, RequestHead, text};
pub use route::{checked_host, request_host};

/// Why a request cannot reach its limits; each is the client's fault (a 4xx).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrontError {
    /// The request target (path and query) is longer than `server.max_uri_bytes`.
    #[error("the request target is {bytes} bytes long; at most {max} are accepted")]
    UriTooLong { bytes: usize, max: usize },
    /// The request's header fields weigh more than `server.max_header_bytes`.
    #[error("the request's header fields take {bytes} bytes; at most {max} are accepted")]
    HeadersTooLarge { bytes: usize, max: usize },
    /// `CONNECT` asks for a tunnel: this is a reverse proxy, not a forward proxy.
    #[error("CONNECT is not served: this is a reverse proxy")]
    Connect,
    /// `TRACE` on a route that does not name it in `match.methods`: it echoes the
    /// request, credentials included, to whatever script can read the answer.
    #[error("TRACE is not allowed on this route")]
    Trace,
    /// The request's `Host` is missing, repeated or invalid.
    #[error("{0}")]
    BadHost(&'static str),
    /// The request's path cannot be normalized: it climbs above the root, holds an
    /// encoded NUL or a broken escape. Never forwarded.
    #[error("invalid request path: {0}")]
    BadPath(#[from] BadPath),
    /// The client asked for something no route serves.
    #[error("no route matches")]
    NoRoute,
    /// The body repeats a field a route matches on: which value routed it would be a
    /// guess, and an upstream keeping the last would act on another than routing did.
    #[error("the body gives field {0} twice, which routing reads")]
    RepeatedRouteField(String),
    /// The request's cost header is not a positive integer.
    #[error("{header} must be a positive integer, not {value:?}")]
    InvalidCost { header: String, value: String },
    /// The request weighs more than a limit ever admits at once: waiting will not help.
    #[error("a cost of {cost} can never fit limit {limit:?}, which admits at most {capacity} at once")]
    CostTooHigh { cost: u64, limit: String, capacity: u64 },
    /// The request's token does not verify, and a limit keyed on its claims refuses such
    /// requests (`on_invalid_token: refuse`).
    #[error("limit {limit:?} counts requests by a verified token's claims: {error}")]
    InvalidToken {
        limit: String,
        /// The route that took the request (the token failed, not the route).
        route: RouteId,
        error: TokenError,
    },
}

impl FrontError {
    /// The status the request is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            FrontError::UriTooLong { .. } => StatusCode::URI_TOO_LONG,
            FrontError::HeadersTooLarge { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            FrontError::Connect | FrontError::Trace => StatusCode::METHOD_NOT_ALLOWED,
            FrontError::NoRoute => StatusCode::NOT_FOUND,
            FrontError::InvalidToken { .. } => StatusCode::UNAUTHORIZED,
            FrontError::BadHost(_)
            | FrontError::BadPath(_)
            | FrontError::InvalidCost { .. }
            | FrontError::CostTooHigh { .. }
            | FrontError::RepeatedRouteField(_) => StatusCode::BAD_REQUEST,
        }
    }
}

/// What the steps in front of the limits made of a request.
pub struct Front<'a> {
    pub route: RouteId,
    /// What the route's limits take their keys from.
    pub src: KeySource<'a>,
    /// The route's allow-list lets the request skip all of its limits.
    pub exempt: bool,
    /// Why its token did not verify, when no limit refused it for that (it goes on
    /// without claims).
    pub invalid_token: Option<TokenError>,
}

impl Front<'_> {
    /// The limits that decide the request: the route's, or none when it is exempt.
    pub fn limits<'c>(&self, config: &'c Config) -> &'c [LimitUse] {
        if self.exempt { &[] } else { &config.routes[self.route].limits }
    }

    /// The limits that may decide it, those their overrides name included.
    pub fn candidates<'c>(&self, config: &'c Config) -> &'c [LimitId] {
        if self.exempt { &[] } else { &config.routes[self.route].candidates }
    }
}

/// What no request on the wire may be, whatever its route: larger than the head limits
/// (414, 431), a `CONNECT` (405: a catch-all route must not turn into an open tunnel),
/// or without one valid `Host` (400). Its host (`request_host`), when it passes.
pub fn check_head<'a>(head: &RequestHead<'a>, config: &Config) -> Result<Option<&'a str>, FrontError> {
    size::check(head, config)?;
    if head.method == Method::CONNECT {
        return Err(FrontError::Connect);
    }
    checked_host(head).map_err(FrontError::BadHost)
}

/// The key source of `head` from `client_ip`: its path normalized as nginx would see it,
/// and `host`, the host it names (`request_host`) or stands for.
pub fn source<'a>(
    head: &RequestHead<'a>,
    client_ip: IpAddr,
    host: Option<&'a str>,
) -> Result<KeySource<'a>, FrontError> {
    let path = path::normalize(head.path())?;
    Ok(KeySource::new(client_ip, head, path, host))
}

/// Where the claims of a request's token come from.
#[derive(Clone, Copy)]
pub enum Claimed<'c> {
    /// Its token, verified with `Config::jwt` (a request on the wire).
    Verify,
    /// Its token, verified with `Config::jwt` as for `Verify`, but a token naming a key
    /// the fetched set lacks wakes no fetch of it (a request explained: explaining spends
    /// nothing).
    Explained,
    /// What an access-log line recorded of them (the claims its limits' keys read),
    /// verified when the request was served.
    Logged(Option<&'c Arc<Claims>>),
}

/// The route `head` from `client_ip`, come in by `scheme`, takes, with its key source and
/// exemption; `host` is the host it names (`request_host`) or stands for.
pub fn front<'a>(
    config: &Config,
    head: &RequestHead<'a>,
    client_ip: IpAddr,
    host: Option<&'a str>,
    scheme: Scheme,
    claimed: Claimed<'_>,
    body: Option<&BodyFields>,
) -> Result<Front<'a>, FrontError> {
    let mut src = source(head, client_ip, host)?;
    let route = if config.body_routes {
        // A route that matches on the body takes the request if its body meets the
        // match, or, unread, may (the admission then reads it, and routes it again).
        let meets = |r: RouteId| match (&config.routes[r].body_match, body) {
            (Some(m), Some(fields)) => m.matches(fields),
            _ => true,
        };
        config.router.find_where(head.method, &src.path, src.host, scheme, meets)
    } else {
        config.router.find(head.method, &src.path, src.host, scheme)
    };
    let route = route.ok_or(FrontError::NoRoute)?;
    if *head.method == Method::TRACE && !config.routes[route].matcher.methods.contains(&Method::TRACE) {
        return Err(FrontError::Trace);
    }
    if let PathMatch::Regex(regex) = &config.routes[route].matcher.path {
        src.captures = regex.captures(&src.path);
    }
    let mut invalid_token = None;
    let fetch = if matches!(claimed, Claimed::Explained) { Fetch::Never } else { Fetch::Wake };
    if let TokenUse::Read { refused_by } = config.routes[route].token {
        src.claims = match (claimed, &config.jwt) {
            (Claimed::Logged(claims), _) => claims.cloned(),
            (Claimed::Verify | Claimed::Explained, None) => None,
            (Claimed::Verify | Claimed::Explained, Some(verifier)) => match verifier.claims(head.fields, fetch) {
                Ok(claims) => claims,
                Err(error) => match refused_by {
                    Some(limit) => {
                        let limit = config.limits[limit].name.clone();
                        return Err(FrontError::InvalidToken { limit, route, error });
                    }
                    // No limit refuses it: a request without claims.
                    None => {
                        invalid_token = Some(error);
                        None
                    }
                },
            },
        };
    }
    let exempt = config.routes[route].allow.admits(&src);
    Ok(Front { route, src, exempt, invalid_token })
}

/// The limits of `limits` (a route's) with `on_missing_key: refuse` whose key `src`
/// lacks: the proxy refuses such a request (`400`) for an enforced limit, before any
/// limit decides it.
pub fn refused_missing_keys<'c>(
    config: &'c Config,
    limits: &'c [LimitUse],
    src: &'c KeySource<'_>,
) -> impl Iterator<Item = LimitId> + 'c {
    limits.iter().map(|u| u.limit).filter(move |&limit| {
        let limit = &config.limits[limit];
        limit.on_missing_key == OnMissingKey::Refuse && !limit.key.present(src)
    })
}

/// What a request with `fields` weighs in the limits of `route` (of `config`): its
/// cost, unless that is no positive integer or more than a limit that may decide it
/// ever admits at once.
pub fn cost(config: &Config, route: &Route, fields: Fields<'_>) -> Result<u64, FrontError> {
    let name = match &route.cost {
        Cost::Fixed(cost) => return Ok(*cost), // checked against the limits at load
        Cost::Header(name) => name,
    };
    let Some(value) = fields.get(name) else { return Ok(1) };
    let cost = text(value).and_then(|v| v.trim().parse::<u64>().ok()).filter(|&c| c >= 1);
    let cost = cost.ok_or_else(|| FrontError::InvalidCost {
        header: name.to_string(),
        value: String::from_utf8_lossy(value).into_owned(),
    })?;
    match route.capacity {
        Some((capacity, limit)) if cost > capacity => {
            Err(FrontError::CostTooHigh { cost, limit: config.limits[limit].name.clone(), capacity })
        }
        _ => Ok(cost),
    }
}
