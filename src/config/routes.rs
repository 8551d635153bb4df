//! One route of the file -> `Route`: its match, what it does (forward or respond), its
//! limits and what a request weighs in them, and what it rewrites, every error positioned.

use crate::variables::Template;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::{HeaderMap, Method};
use typed_index_collections::TiSlice;

use crate::policy::key::{BodyFields, ClaimPath, KeyPart};
use crate::router::Scheme;

use super::checks::{Errors, allow, body_size, positive_duration, set_field, size, status_in, unknown_name};
use super::raw::{
    AlgorithmName, RawConfig, RawLimit, RawLimitUse, RawMatch, RawOneOrMany, RawRespond, RawRoute, RawScheme,
    RawTunedUse, RawUpstreamHold,
};
use super::units::parse_duration;
use super::{
    Action, Allow, BodyRate, Burst, Cost, Expires, HoldBy, Limit, LimitId, LimitUse, OnInvalidToken, PathMatch,
    PathRegex, PathRewrite, Piece, Rewrite, Route, RouteMatch, StaticResponse, TokenUse, UpstreamHold, UpstreamHost,
    UpstreamId,
};

/// Below this many routes a second thread gains nothing worth its start.
const MIN_SPLIT_ROUTES: usize = 10_000;

/// Every route of `config`, in order: a long list compiled in parts on as many threads as
/// there are cores (up to four), each part's errors and warnings reported after those of
/// the parts before it, as one thread would have.
pub(super) fn all(
    e: &mut Errors<'_>,
    config: &RawConfig,
    compiled: &TiSlice<LimitId, Limit>,
    max_body_bytes: Option<u64>,
) -> Vec<Route> {
    let raw = &config.routes;
    // The routes of `part`, the first of them route `from`.
    let compile = |e: &mut Errors<'_>, from: usize, part: &[RawRoute]| -> Vec<Route> {
        let each = |(j, r)| route(e, from + j, r, config, compiled, max_body_bytes);
        part.iter().enumerate().map(each).collect()
    };
    let parts = std::thread::available_parallelism().map_or(1, std::num::NonZero::get).min(4);
    if parts < 2 || raw.len() < MIN_SPLIT_ROUTES {
        return compile(e, 0, raw);
    }
    let size = raw.len().div_ceil(parts);
    let (file, positions, missing) = (e.file, e.positions, e.missing);
    std::thread::scope(|scope| {
        let others: Vec<_> = (raw.chunks(size).enumerate().skip(1))
            .map(|(k, part)| {
                scope.spawn(move || {
                    let mut e = Errors { file, positions, missing, list: Vec::new(), warnings: Vec::new() };
                    let routes = compile(&mut e, k * size, part);
                    (routes, e.list, e.warnings)
                })
            })
            .collect();
        let mut routes = compile(e, 0, &raw[..size]);
        routes.reserve_exact(raw.len() - size);
        for other in others {
            let (part, list, warnings) = other.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            routes.extend(part);
            e.list.extend(list);
            e.warnings.extend(warnings);
        }
        routes
    })
}

/// Route `i`; `compiled` are the configuration's limits, indexed as `config.limits`.
fn route(
    e: &mut Errors<'_>,
    i: usize,
    raw: &RawRoute,
    config: &RawConfig,
    compiled: &TiSlice<LimitId, Limit>,
    max_body_bytes: Option<u64>,
) -> Route {
    let at = format!("routes[{i}]");
    let mut matcher = route_match(e, &format!("{at}.match"), &raw.matcher);
    let body_match = raw.matcher.json.as_ref().and_then(|json| body_match(e, &format!("{at}.match.json"), json));
    if raw.matcher.json.is_some() && body_match.is_none() {
        // In error, it matches nothing (as `route_match` does): it shadows no route.
        matcher.path = PathMatch::Exact(String::new());
    }
    let action = match (&raw.upstream, &raw.respond) {
        (Some(name), None) => match config.upstreams.keys().position(|n| n == name) {
            Some(index) => Action::Forward(UpstreamId::from(index)),
            None => {
                e.add(format!("{at}.upstream"), unknown_name("upstream", name, &config.upstreams, "upstreams"));
                Action::Forward(UpstreamId::from(0))
            }
        },
        (None, Some(respond)) => Action::Respond(static_response(e, &format!("{at}.respond"), respond)),
        (Some(_), Some(_)) => {
            e.add(format!("{at}.respond"), "a route has either `upstream` or `respond`, not both");
            Action::Forward(UpstreamId::from(0))
        }
        (None, None) => {
            e.add(at.clone(), "needs `upstream: NAME` or `respond: {status, body}`");
            Action::Forward(UpstreamId::from(0))
        }
    };
    let mut limits = Vec::new();
    let mut seen = HashSet::new();
    for (j, entry) in raw.limits.iter().enumerate() {
        let (here, name) = (format!("{at}.limits[{j}]"), entry.name());
        let field = match entry {
            RawLimitUse::Name(_) => here.clone(),
            RawLimitUse::Tuned(_) => format!("{here}.limit"),
        };
        match config.limits.keys().position(|n| n == name) {
            Some(_) if !seen.insert(name) => e.add(field, format!("limit {name:?} is listed twice")),
            Some(index) => {
                let burst = match entry {
                    RawLimitUse::Name(_) => None,
                    RawLimitUse::Tuned(tuned) => own_burst(e, &here, tuned, &config.limits[name]),
                };
                limits.push(LimitUse { limit: LimitId::from(index), burst, count: None });
            }
            None => e.add(field, unknown_name("limit", name, &config.limits, "limits")),
        }
    }
    let listed = limits.iter().map(|u| u.limit).collect();
    limits.sort_unstable_by_key(|u| u.limit);
    let allow = allow(e, &format!("{at}.allow"), raw.allow.as_ref());
    let cost = match (raw.cost, &raw.cost_header) {
        (Some(_), Some(_)) => {
            e.add(format!("{at}.cost_header"), "give either `cost` or `cost_header`, not both");
            Cost::Fixed(1)
        }
        (_, Some(name)) => match HeaderName::from_str(name) {
            Ok(name) => Cost::Header(name),
            Err(_) => {
                e.add(format!("{at}.cost_header"), format!("invalid header name {name:?}"));
                Cost::Fixed(1)
            }
        },
        (Some(0), None) => {
            e.add(format!("{at}.cost"), "must be a positive integer");
            Cost::Fixed(1)
        }
        (cost, None) => Cost::Fixed(cost.unwrap_or(1)),
    };
    let candidates = candidates(&limits, compiled);
    let capacity = candidates
        .iter()
        .filter_map(|&l| {
            // A route's own burst is what the limit admits at once here.
            let own = limits.iter().find(|u| u.limit == l).and_then(|u| u.burst);
            let capacity = own.map_or_else(|| compiled.get(l)?.capacity(), |b| Some(b.burst.saturating_add(1)));
            Some((capacity?, l))
        })
        .min();
    if let (Cost::Fixed(cost), Some((capacity, limit))) = (&cost, capacity)
        && *cost > capacity
    {
        // A fixed cost above what a limit admits at once would reject every request.
        let name = &compiled[limit].name;
        let whose = match raw.limits.iter().position(|u| u.name() == name) {
            Some(j) => format!("routes[{i}].limits[{j}]"),
            None => "named by an override of the route's limits".to_owned(),
        };
        e.add(
            format!("{at}.cost"),
            format!("{cost} can never fit limit {name:?} ({whose}), which admits at most {capacity} at once"),
        );
    }
    captures_named(e, &at, raw, &matcher, &candidates, compiled);
    let token = token_use(&allow, &candidates, compiled);
    let body_fields = body_fields(e, &at, &candidates, compiled);
    let rewrite = rewrite(e, &at, raw, &matcher);
    let rewrites = raw.strip_prefix.is_some()
        || raw.rewrite.is_some()
        || !raw.set_request_headers.is_empty()
        || !raw.remove_request_headers.is_empty()
        || !raw.set_response_headers.is_empty()
        || raw.upstream_host.is_some()
        || raw.expires.is_some();
    if rewrites && raw.respond.is_some() {
        e.add(
            format!("{at}.respond"),
            "a `respond` route forwards nothing: rewriting fields apply only with `upstream`",
        );
    }
    let upstream_hold = upstream_hold(e, &at, raw, &limits, compiled);
    let priority = priority(e, &at, raw, &candidates, compiled);
    let max_body_bytes = body_size(e, &format!("{at}.max_body_bytes"), raw.max_body_bytes.as_ref()).or(max_body_bytes);
    let body_rate = raw.response_body_rate.as_ref().and_then(|r| {
        let per_second = body_size(e, &format!("{at}.response_body_rate.bytes_per_second"), Some(&r.bytes_per_second));
        let after = r.after.as_ref().map_or(Some(0), |after| size(e, &format!("{at}.response_body_rate.after"), after));
        Some(BodyRate { per_second: per_second?, after: after? })
    });
    Route {
        name: raw.name.clone().unwrap_or(at),
        matcher,
        action,
        limits,
        listed,
        candidates,
        capacity,
        allow,
        cost,
        rewrite,
        max_body_bytes,
        body_rate,
        priority,
        token,
        upstream_hold,
        body_fields,
        body_match,
    }
}

/// A route's `priority`: a class of the queues of its limits (`candidates`).
fn priority(
    e: &mut Errors<'_>,
    at: &str,
    raw: &RawRoute,
    candidates: &[LimitId],
    compiled: &TiSlice<LimitId, Limit>,
) -> Option<Box<str>> {
    let name = raw.priority.as_deref()?;
    let classes = |l: &LimitId| compiled.get(*l).and_then(|l| l.queue.as_ref()).map(|q| &q.classes[..]);
    if !candidates.iter().filter_map(classes).flatten().any(|c| c.name == name) {
        e.add(
            format!("{at}.priority"),
            format!(
                "{name:?} names no class of the queues of this route's limits (a concurrency limit's `queue.classes`)"
            ),
        );
    }
    Some(Box::from(name))
}

/// A route's match on fields of the JSON body (`match: { json: { model: "gpt-4o*" } }`):
/// every field it names has one of its values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyMatch(pub Box<[(ClaimPath, Box<[ValuePattern]>)]>);

/// A value a body field may have: this text, or any that begins so (written `text*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValuePattern {
    Exact(Box<[u8]>),
    Prefix(Box<[u8]>),
}

impl BodyMatch {
    /// Whether a body with `fields` (as `json:` key parts read them: a string's text, a
    /// number's or literal's spelling) matches.
    pub fn matches(&self, fields: &BodyFields) -> bool {
        self.0.iter().all(|(path, values)| {
            fields.get(path).is_some_and(|value| {
                values.iter().any(|pattern| match pattern {
                    ValuePattern::Exact(text) => **text == *value,
                    ValuePattern::Prefix(start) => value.starts_with(start),
                })
            })
        })
    }

    /// The fields it reads.
    pub fn paths(&self) -> impl Iterator<Item = &ClaimPath> {
        self.0.iter().map(|(path, _)| path)
    }
}

/// `match.json`: each field a dotted path, each with at least one value.
fn body_match(e: &mut Errors<'_>, at: &str, raw: &BTreeMap<String, RawOneOrMany>) -> Option<Box<BodyMatch>> {
    if raw.is_empty() {
        e.add(at.to_owned(), "name at least one field and its values, e.g. `json: { model: gpt-4o }`");
        return None;
    }
    let mut fields = Vec::with_capacity(raw.len());
    for (name, values) in raw {
        let at = format!("{at}.{name}");
        let path = match name.parse::<ClaimPath>() {
            Ok(path) if !name.is_empty() => path,
            _ => {
                e.add(at, format!("{name:?}: a JSON path of names separated by dots, e.g. params.name"));
                continue;
            }
        };
        let values = values.values();
        if values.is_empty() {
            e.add(at.clone(), "give at least one value");
        }
        let patterns = values.iter().map(|v| match v.strip_suffix('*') {
            Some(start) => ValuePattern::Prefix(start.as_bytes().into()),
            None => ValuePattern::Exact(v.as_bytes().into()),
        });
        fields.push((path, patterns.collect()));
    }
    (fields.len() == raw.len()).then(|| Box::new(BodyMatch(fields.into())))
}

/// Of routes that match on the body: the fields read before routing, every route's
/// (a request may go to any later route once its body is known), at most as many as one
/// scan tells apart.
pub(super) fn body_routing(e: &mut Errors<'_>, routes: &mut [Route]) -> bool {
    if routes.iter().all(|r| r.body_match.is_none()) {
        return false;
    }
    let mut fields: Vec<ClaimPath> = Vec::new();
    for route in routes.iter() {
        let matched = route.body_match.iter().flat_map(|m| m.paths());
        for path in matched.chain(route.body_fields.iter().flat_map(|f| f.iter())) {
            if !fields.contains(path) {
                fields.push(path.clone());
            }
        }
    }
    if fields.len() > MAX_BODY_FIELDS {
        e.add(
            "routes".to_owned(),
            format!(
                "routes that match on the body read every route's body fields (match.json and json: keys): {} \
                 here, at most {MAX_BODY_FIELDS}",
                fields.len()
            ),
        );
        fields.truncate(MAX_BODY_FIELDS);
    }
    let fields: Arc<[ClaimPath]> = fields.into();
    for route in routes.iter_mut().filter(|r| r.body_match.is_some()) {
        route.body_fields = Some(Arc::clone(&fields));
    }
    true
}

/// The fields of a JSON body that the limits which may decide the route's requests read
/// (`None`: none), at most as many as one body's scan tells apart.
fn body_fields(
    e: &mut Errors<'_>,
    at: &str,
    candidates: &[LimitId],
    compiled: &TiSlice<LimitId, Limit>,
) -> Option<Arc<[ClaimPath]>> {
    let mut fields: Vec<ClaimPath> = Vec::new();
    // Its key's parts, and the part its charge's prices go by.
    let parts = candidates.iter().filter_map(|&l| compiled.get(l)).flat_map(|limit| {
        let priced = limit.charge.as_ref().and_then(|c| Some(&c.prices.as_ref()?.by));
        limit.key.0.iter().chain(priced)
    });
    for part in parts {
        if let KeyPart::Json(field) = part
            && !fields.contains(field)
        {
            fields.push(field.clone());
        }
    }
    if fields.len() > MAX_BODY_FIELDS {
        e.add(
            format!("{at}.limits"),
            format!("its limits read {} fields of the body (json:); at most {MAX_BODY_FIELDS} are read", fields.len()),
        );
        fields.truncate(MAX_BODY_FIELDS);
    }
    (!fields.is_empty()).then(|| fields.into())
}

/// The most body fields one route's limits may read (`front::body::Scan` tells 32 apart).
const MAX_BODY_FIELDS: usize = 32;

/// Whether the route's requests have their token verified: some limit that may decide
/// them is keyed on a claim, or its allow-list, theirs or their overrides match claims.
fn token_use(allow: &Allow, candidates: &[LimitId], compiled: &TiSlice<LimitId, Limit>) -> TokenUse {
    let limits = || candidates.iter().filter_map(|&l| Some((l, compiled.get(l)?)));
    let keyed = |limit: &Limit| limit.key.0.iter().any(|p| matches!(p, KeyPart::Jwt(_)));
    let counted = |limit: &Limit| limit.tenant.as_ref().is_some_and(|t| matches!(t.source, Some(KeyPart::Jwt(_))));
    let reads = allow.reads_claims()
        || limits().any(|(_, l)| {
            keyed(l) || counted(l) || l.allow.reads_claims() || l.overrides.iter().any(|o| o.0.reads_claims())
        });
    if !reads {
        return TokenUse::Unread;
    }
    let refused_by = limits()
        .find(|(_, l)| keyed(l) && !l.dry_run && l.on_invalid_token == OnInvalidToken::Refuse)
        .map(|(id, _)| id);
    TokenUse::Read { refused_by }
}

/// Every `capture:NAME` key part of a limit that may decide the route's requests names
/// a group of the route's `path_regex`: elsewhere it would never have a value.
fn captures_named(
    e: &mut Errors<'_>,
    at: &str,
    raw: &RawRoute,
    matcher: &RouteMatch,
    candidates: &[LimitId],
    compiled: &TiSlice<LimitId, Limit>,
) {
    for limit in candidates.iter().filter_map(|&l| compiled.get(l)) {
        for part in limit.key.0.iter() {
            let KeyPart::Capture(name) = part else { continue };
            let has = match &matcher.path {
                PathMatch::Regex(regex) => regex.has_group(name),
                _ => false,
            };
            if !has {
                let whose = match raw.limits.iter().position(|u| u.name() == limit.name) {
                    Some(j) => format!("{at}.limits[{j}]"),
                    None => at.to_owned(),
                };
                e.add(
                    whose,
                    format!(
                        "limit {:?} is keyed by capture:{name}, but this route's match has no `path_regex` with a group \
                         (?<{name}>…)",
                        limit.name
                    ),
                );
            }
        }
    }
}

/// A route's own burst and delay on limit `limit` (`{ limit, burst, nodelay | delay }` at
/// `at`): only a leaky bucket (nginx's `limit_req`) has them, and an entry gives its own
/// `burst`, as each `limit_req` line does; its delay, as a limit's, is 0 unless given.
fn own_burst(e: &mut Errors<'_>, at: &str, tuned: &RawTunedUse, limit: &RawLimit) -> Option<Burst> {
    let leaky = limit.rate.is_some()
        && limit.rates.is_none()
        && limit.concurrency.is_none()
        && matches!(limit.algorithm, None | Some(AlgorithmName::LeakyBucket));
    let given =
        [("burst", tuned.burst.is_some()), ("nodelay", tuned.nodelay.is_some()), ("delay", tuned.delay.is_some())];
    if !leaky {
        // The limit's own errors, if any, are reported at the limit.
        if let Some((field, _)) = given.iter().find(|(_, given)| *given) {
            e.add(
                format!("{at}.{field}"),
                format!(
                    "a route gives its own burst and delay only to a leaky-bucket limit (`rate:` without `algorithm`), \
                     and {:?} is not one: name it alone",
                    tuned.limit
                ),
            );
        }
        return None;
    }
    let Some(burst) = tuned.burst else {
        e.add(
            at.to_owned(),
            "needs `burst: N` (each use gives its own, as a `limit_req` line does); or name the limit alone",
        );
        return None;
    };
    let delay = super::limits::delay(e, at, burst, tuned.nodelay, tuned.delay);
    Some(Burst { burst, delay })
}

/// The route's `limits` and the limits their overrides name: every limit that may decide
/// one of its requests, ascending.
fn candidates(limits: &[LimitUse], compiled: &TiSlice<LimitId, Limit>) -> Box<[LimitId]> {
    let limits = limits.iter().map(|u| u.limit);
    let overridden = limits.clone().filter_map(|l| compiled.get(l)).flat_map(|l| l.overrides.iter().map(|o| o.1));
    let mut all: Vec<LimitId> = limits.chain(overridden).collect();
    all.sort_unstable();
    all.dedup();
    all.into()
}

/// `strip_prefix`, `rewrite`, the header fields and `upstream_host` of a route.
fn rewrite(e: &mut Errors<'_>, at: &str, raw: &RawRoute, matcher: &RouteMatch) -> Rewrite {
    let path = match (raw.strip_prefix.unwrap_or(false), &raw.rewrite) {
        (true, Some(_)) => {
            e.add(format!("{at}.rewrite"), "give either `strip_prefix` or `rewrite`, not both");
            None
        }
        (true, None) => match &matcher.path {
            PathMatch::Prefix(prefix) => Some(PathRewrite::Strip(prefix.clone())),
            _ => {
                e.add(format!("{at}.strip_prefix"), "needs `match.path_prefix`: the prefix to strip");
                None
            }
        },
        (false, Some(r)) => match (&matcher.path, &r.prefix) {
            (PathMatch::Regex(regex), None) => {
                let to = template(e, &format!("{at}.rewrite.to"), &r.to, regex);
                to.map(PathRewrite::Template)
            }
            (PathMatch::Regex(_), Some(_)) => {
                e.add(
                    format!("{at}.rewrite.prefix"),
                    "with `match.path_regex`, `rewrite` takes `to` alone: it replaces the whole path, and \
                     `$NAME` in it stands for the group NAME of the pattern",
                );
                None
            }
            (_, None) => {
                e.add(format!("{at}.rewrite.prefix"), "needs `prefix`: the start of the path that `to` replaces");
                None
            }
            (_, Some(prefix)) => {
                for (field, value) in [("prefix", prefix), ("to", &r.to)] {
                    if !value.starts_with('/') {
                        e.add(format!("{at}.rewrite.{field}"), format!("must start with '/', not {value:?}"));
                    }
                }
                Some(PathRewrite::Replace { prefix: prefix.clone(), to: r.to.clone() })
            }
        },
        (false, None) => None,
    };
    let mut headers = |field: &str, map: &BTreeMap<String, String>| -> Vec<(HeaderName, Template)> {
        map.iter()
            .filter_map(|(name, value)| e.check(|| format!("{at}.{field}.{name}"), set_field(name, value)))
            .collect()
    };
    let set_request_headers = headers("set_request_headers", &raw.set_request_headers);
    let set_response_headers = headers("set_response_headers", &raw.set_response_headers);
    let remove_request_headers = raw
        .remove_request_headers
        .iter()
        .enumerate()
        .filter_map(|(i, name)| {
            let parsed = HeaderName::from_str(name).map_err(|_| format!("invalid header name {name:?}"));
            e.check(|| format!("{at}.remove_request_headers[{i}]"), parsed)
        })
        .collect();
    let upstream_host = match raw.upstream_host.as_deref() {
        None | Some("keep") => UpstreamHost::Keep,
        Some("server") => UpstreamHost::Server,
        Some("keep_name") => UpstreamHost::KeepName,
        Some(name) => {
            let valid = http::uri::Authority::from_str(name).ok().filter(|_| !name.contains('@'));
            let value = valid.and_then(|a| HeaderValue::from_str(a.as_str()).ok());
            e.check(
                || format!("{at}.upstream_host"),
                value.ok_or_else(|| {
                    format!("write keep, keep_name, server, or a host name such as api.internal, not {name:?}")
                }),
            )
            .map_or(UpstreamHost::Keep, UpstreamHost::Name)
        }
    };
    let expires = raw.expires.as_deref().and_then(|text| {
        let expires = match text {
            "epoch" => Ok(Expires::Epoch),
            "max" => Ok(Expires::Max),
            text => parse_duration(text)
                .map(Expires::After)
                .map_err(|why| format!("{why}; or `epoch` (already expired) or `max` (ten years)")),
        };
        e.check(|| format!("{at}.expires"), expires)
    });
    Rewrite { path, set_request_headers, remove_request_headers, set_response_headers, upstream_host, expires }
}

/// A `path_regex` route's `rewrite.to`: text, with `$NAME` or `${NAME}` for what the
/// pattern's group NAME captured, and `$$` for `$`.
fn template(e: &mut Errors<'_>, at: &str, to: &str, regex: &PathRegex) -> Option<Box<[Piece]>> {
    if !to.starts_with('/') && !to.starts_with('$') {
        e.add(at.to_owned(), format!("must start with '/' or a group, not {to:?}"));
        return None;
    }
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut rest = to;
    while let Some(dollar) = rest.find('$') {
        text.push_str(&rest[..dollar]);
        let after = &rest[dollar + 1..];
        let (name, next) = if let Some(braced) = after.strip_prefix('{') {
            let Some((name, next)) = braced.split_once('}') else {
                e.add(at.to_owned(), "`${` without its `}`");
                return None;
            };
            (name, next)
        } else if let Some(next) = after.strip_prefix('$') {
            text.push('$');
            rest = next;
            continue;
        } else {
            let end = after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(after.len());
            (&after[..end], &after[end..])
        };
        if !regex.has_group(name) {
            let groups: Vec<String> = regex.group_names().map(|n| format!("${n}")).collect();
            let known = if groups.is_empty() { "it names none".to_owned() } else { groups.join(", ") };
            let what = if name.is_empty() {
                "`$` alone (write `$$` for a dollar sign)".to_owned()
            } else {
                format!("`${name}`")
            };
            e.add(at.to_owned(), format!("{what} is no named group of match.path_regex ({known})"));
            return None;
        }
        if !text.is_empty() {
            pieces.push(Piece::Text(std::mem::take(&mut text)));
        }
        pieces.push(Piece::Group(name.into()));
        rest = next;
    }
    text.push_str(rest);
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Some(pieces.into())
}

fn route_match(e: &mut Errors<'_>, at: &str, raw: &RawMatch) -> RouteMatch {
    let host = raw.host.as_ref().map(|h| h.trim_end_matches('.').to_ascii_lowercase());
    let mut path_of = |field: &str, value: &String| {
        if !value.starts_with('/') {
            e.add(format!("{at}.{field}"), format!("must start with '/', not {value:?}"));
        } else if !matches!(crate::path::normalize(value), Ok(Cow::Borrowed(_))) {
            // Requests are matched by their normalized path: this spelling never would.
            let normal = crate::path::normalize(value).map(|p| String::from_utf8_lossy(&p).into_owned());
            let hint = normal.map_or_else(|e| e.to_string(), |p| format!("write it as {p:?}"));
            e.add(format!("{at}.{field}"), format!("{value:?} is not a normalized path: {hint}"));
        }
        value.clone()
    };
    // In error, a route's path matches nothing (the empty path no request has), so that
    // it shadows no other route and its other errors are still reported.
    let nothing = || PathMatch::Exact(String::new());
    let path = match (&raw.path_prefix, &raw.path, &raw.path_regex) {
        (None, None, None) => PathMatch::Any,
        (Some(prefix), None, None) => PathMatch::Prefix(path_of("path_prefix", prefix)),
        (None, Some(exact), None) => PathMatch::Exact(path_of("path", exact)),
        (None, None, Some(pattern)) => PathRegex::new(pattern).map_or_else(
            |why| {
                e.add(format!("{at}.path_regex"), format!("invalid pattern: {why}"));
                nothing()
            },
            PathMatch::Regex,
        ),
        (_, exact, _) => {
            let field = if exact.is_some() { "path" } else { "path_regex" };
            e.add(format!("{at}.{field}"), "give one of `path` (exact), `path_prefix` or `path_regex`");
            nothing()
        }
    };
    let methods = raw
        .methods
        .iter()
        .flatten()
        .enumerate()
        .filter_map(|(i, m)| {
            let parsed = Method::from_bytes(m.as_bytes())
                .ok()
                .filter(|_| !m.bytes().any(|b| b.is_ascii_lowercase()))
                .ok_or_else(|| format!("invalid method {m:?}; methods are upper case, e.g. GET, POST"));
            e.check(|| format!("{at}.methods[{i}]"), parsed)
        })
        .collect();
    let scheme = raw.scheme.map(|s| match s {
        RawScheme::Http => Scheme::Http,
        RawScheme::Https => Scheme::Https,
    });
    RouteMatch { host, path, methods, scheme }
}

fn static_response(e: &mut Errors<'_>, at: &str, raw: &RawRespond) -> StaticResponse {
    let status = status_in(e, || format!("{at}.status"), raw.status.unwrap_or(200), 100..=599);
    let (mut headers, mut made) = (HeaderMap::new(), Vec::new());
    for (name, value) in &raw.headers {
        match e.check(|| format!("{at}.headers.{name}"), set_field(name, value)) {
            Some((n, Template::Fixed(v))) => _ = headers.append(n, v),
            Some((n, v)) => made.push((n, v)),
            None => {}
        }
    }
    let body = Bytes::from(raw.body.clone().unwrap_or_default());
    if !body.is_empty() && !headers.contains_key(CONTENT_TYPE) {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    }
    StaticResponse { status, headers, made, body }
}

/// The longest an upstream's refusal holds a key unless `upstream_hold.max` says.
const DEFAULT_HOLD_MAX: Duration = Duration::from_secs(3600);
/// Keys held at once unless `upstream_hold.max_keys` says.
const DEFAULT_HOLD_KEYS: u64 = 10_000;

/// `upstream_hold:`: by the key of the limit it names (`true`: the route's first limit,
/// or the route when it has none), on a route that forwards.
fn upstream_hold(
    e: &mut Errors<'_>,
    at: &str,
    raw: &RawRoute,
    limits: &[LimitUse],
    compiled: &TiSlice<LimitId, Limit>,
) -> Option<UpstreamHold> {
    let spec = match raw.upstream_hold.as_ref()? {
        RawUpstreamHold::On(false) => return None,
        RawUpstreamHold::On(true) => None,
        RawUpstreamHold::Spec(spec) => Some(spec),
    };
    let at = format!("{at}.upstream_hold");
    if raw.respond.is_some() {
        e.add(at.clone(), "applies to a route that forwards (`upstream`): a `respond` route has no upstream to refuse");
    }
    let first = raw.limits.first().and_then(|u| compiled.iter_enumerated().find(|(_, l)| l.name == u.name()));
    let max_text = spec.and_then(|s| s.max.as_deref()).unwrap_or("1h");
    let by = match spec.and_then(|s| s.by.as_deref()) {
        None if first.is_none() => {
            e.warn(
                at.clone(),
                format!(
                    "the route has no limit, so this holds the whole route: one client's upstream refusal \
                     (429 or 503 with Retry-After) holds every client of the route, for up to {max_text}; name the \
                     limit whose key to hold (`by: LIMIT`), or write `by: route` to mean it"
                ),
            );
            HoldBy::Route
        }
        None => first.map_or(HoldBy::Route, |(id, _)| HoldBy::Limit(id)),
        Some("route") => HoldBy::Route,
        Some(name) => match limits.iter().find(|u| compiled.get(u.limit).is_some_and(|l| l.name == name)) {
            Some(u) => HoldBy::Limit(u.limit),
            None => {
                let listed: Vec<&str> = raw.limits.iter().map(|u| u.name()).collect();
                e.add(
                    format!("{at}.by"),
                    format!("{name:?} is not one of the route's limits ({}); or give `route`", listed.join(", ")),
                );
                HoldBy::Route
            }
        },
    };
    let max = match spec.and_then(|s| s.max.as_deref()) {
        None => DEFAULT_HOLD_MAX,
        Some(text) => e.check(|| format!("{at}.max"), positive_duration(text)).unwrap_or(DEFAULT_HOLD_MAX),
    };
    let max_keys = spec.and_then(|s| s.max_keys).unwrap_or(DEFAULT_HOLD_KEYS);
    if max_keys == 0 {
        e.add(format!("{at}.max_keys"), "must be a positive integer");
    }
    Some(UpstreamHold { by, max, max_keys: usize::try_from(max_keys).unwrap_or(usize::MAX) })
}

#[cfg(test)]
mod tests {
    use crate::config::{LoadError, RouteId, parse};
    use crate::router::PathMatch;

    fn file(n: usize, wrong: &[usize]) -> String {
        let mut src = String::from("listen: 127.0.0.1:0\nroutes:\n");
        for i in 0..n {
            let slash = if wrong.contains(&i) { "" } else { "/" };
            src.push_str(&format!("  - {{ match: {{ path_prefix: {slash}p{i}/ }}, respond: {{ body: ok }} }}\n"));
        }
        src
    }

    /// A long list is compiled in parts on several threads: each error still names its
    /// own route and line, in the file's order, and the routes keep theirs.
    #[test]
    fn a_long_list_compiled_in_parts_reads_as_one_thread_would() {
        let n = super::MIN_SPLIT_ROUTES * 2 + 1;
        let Err(LoadError::Invalid(errors)) = parse(&file(n, &[1, n - 1]), "f") else { panic!("not refused") };
        let found: Vec<_> = errors.iter().map(|e| (e.line, e.path.clone())).collect();
        let last = format!("routes[{}].match.path_prefix", n - 1);
        assert_eq!(found, [(4, "routes[1].match.path_prefix".to_string()), (n + 2, last)]);

        let config = parse(&file(n, &[]), "f").expect("valid");
        assert_eq!(config.routes.len(), n);
        for i in [0, n / 2, n - 1] {
            let path = &config.routes[RouteId::from(i)].matcher.path;
            assert!(matches!(path, PathMatch::Prefix(p) if *p == format!("/p{i}/")), "{i}: {path:?}");
        }
    }
}
