//! The `jwt:` section (the keys tokens are verified with, where requests carry them, what
//! their claims must say), and what limits, allow-lists and overrides that read claims
//! ask of it.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;

use super::checks::Errors;
use super::raw::{RawAllow, RawConfig, RawJwt, RawKey, RawOneOrMany, RawUpstream, RawUpstreamServer};
use super::secrets::secret;
use super::{JwksSource, upstreams};
use crate::jwt::{Checks, TokenField, Verifier, VerifyingKey};
use crate::policy::key::KeyPart;

const DEFAULT_LEEWAY: Duration = Duration::from_secs(30);
/// A clock further off than this is a clock to fix, not a skew to allow.
const MAX_LEEWAY: Duration = Duration::from_secs(300);
/// An HMAC secret shorter than the hash's output is a guessable one (RFC 7518 §3.2 asks
/// for at least 256 bits with HS256).
const MIN_SECRET_BYTES: usize = 32;

pub(super) fn jwt(e: &mut Errors<'_>, raw: &RawJwt) -> Option<Arc<Verifier>> {
    let leeway = e.duration("jwt.leeway", raw.leeway.as_ref(), DEFAULT_LEEWAY);
    if leeway > MAX_LEEWAY {
        e.add("jwt.leeway".into(), format!("{} is too long; at most 5m", humantime::format_duration(leeway)));
    }
    let mut list = |field: &str, given: Option<&RawOneOrMany>| {
        let values = given.map(RawOneOrMany::values).unwrap_or_default();
        if given.is_some() && (values.is_empty() || values.iter().any(String::is_empty)) {
            e.add(format!("jwt.{field}"), "needs a non-empty value (or leave it out to accept any)");
        }
        values
    };
    let checks = Checks {
        issuers: list("issuer", raw.issuer.as_ref()),
        audiences: list("audience", raw.audience.as_ref()),
        leeway,
    };
    let field = match raw.from.as_deref() {
        None => Some(TokenField::Bearer),
        Some(from) => e.check(|| "jwt.from".into(), token_field(from)),
    };
    let mut keys = Vec::new();
    if let Some(secret) = secret(e, "jwt.secret", raw.secret.as_deref(), raw.secret_file.as_deref()) {
        if secret.len() < MIN_SECRET_BYTES {
            let at = if raw.secret_file.is_some() { "jwt.secret_file" } else { "jwt.secret" };
            e.add(
                at.into(),
                format!("is {} bytes long; an HMAC secret needs at least {MIN_SECRET_BYTES}", secret.len()),
            );
        }
        keys.push(VerifyingKey::secret(secret.as_bytes(), &checks));
    }
    if let Some(path) = &raw.keys_file {
        let read = super::files::read_regular(path)
            .and_then(|bytes| String::from_utf8(bytes).map_err(|_| format!("{path:?} is not UTF-8 text")))
            .and_then(|text| VerifyingKey::parse(&text, &checks).map_err(|err| format!("{path:?}: {err}")));
        keys.extend(e.check(|| "jwt.keys_file".into(), read).into_iter().flatten());
    }
    if raw.secret.is_none() && raw.secret_file.is_none() && raw.keys_file.is_none() && raw.jwks_url.is_none() {
        e.add(
            "jwt".into(),
            "needs the keys tokens are verified with: `secret`, `secret_file`, `keys_file` or `jwks_url`",
        );
    }
    Some(Arc::new(Verifier::new(field?, checks, keys)))
}

const DEFAULT_JWKS_REFRESH: Duration = Duration::from_secs(300);
/// Fetching more often than this would ask the key server once a request.
const MIN_JWKS_REFRESH: Duration = Duration::from_secs(10);

/// `jwt.jwks_url` (`http://` or `https://`), fetched from an upstream of its own: its one
/// server is the URL's host and port, with every upstream default.
pub(super) fn jwks(e: &mut Errors<'_>, raw: &RawJwt) -> Option<JwksSource> {
    let url = raw.jwks_url.as_ref()?;
    let refresh = e.duration("jwt.jwks_refresh", raw.jwks_refresh.as_ref(), DEFAULT_JWKS_REFRESH);
    if refresh < MIN_JWKS_REFRESH {
        e.add("jwt.jwks_refresh".into(), "must be at least 10s");
    }
    let parsed = url.parse::<http::Uri>().ok().and_then(|uri| {
        let tls = match uri.scheme_str()? {
            "https" => true,
            "http" => false,
            _ => return None,
        };
        let authority = uri.authority().filter(|a| !a.as_str().contains('@'))?;
        let port = authority.port_u16().unwrap_or(if tls { 443 } else { 80 });
        let server = format!("{}://{}:{port}", if tls { "https" } else { "http" }, authority.host());
        let target = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
        Some((server, target))
    });
    let Some((server, target)) = parsed else {
        e.add("jwt.jwks_url".into(), format!("{url:?} is not an http:// or https:// URL"));
        return None;
    };
    let upstream = RawUpstream { servers: vec![RawUpstreamServer::Address(server)], ..RawUpstream::default() };
    Some(JwksSource { url: url.clone(), upstream: upstreams::upstream(e, JWKS_UPSTREAM, &upstream), target, refresh })
}

/// The name of `jwt.jwks_url`'s upstream, in log lines and metrics.
const JWKS_UPSTREAM: &str = "jwt.jwks_url";

/// `bearer`, `header:NAME` or `cookie:NAME`.
fn token_field(from: &str) -> Result<TokenField, String> {
    match from.split_once(':') {
        None if from == "bearer" => Ok(TokenField::Bearer),
        Some(("header", name)) => {
            HeaderName::from_str(name).map(TokenField::Header).map_err(|_| format!("invalid header name {name:?}"))
        }
        Some(("cookie", name)) if !name.is_empty() => Ok(TokenField::Cookie(name.into())),
        _ => Err(format!("{from:?} is not where a token can be: bearer, header:NAME or cookie:NAME")),
    }
}

/// Every field that reads a token's claims, when the file has no `jwt:` section to
/// verify tokens with: each is an error at its place.
pub(super) fn require_jwt(e: &mut Errors<'_>, raw: &RawConfig) {
    const NEEDED: &str =
        "reads a verified token's claims: add a top-level `jwt:` section with the keys to verify tokens with";
    let reads = |allow: Option<&RawAllow>| allow.is_some_and(|a| !a.claims.is_empty());
    for (name, limit) in &raw.limits {
        let parts = match &limit.key {
            RawKey::One(one) => std::slice::from_ref(one),
            RawKey::Many(many) => many.as_slice(),
        };
        if parts.iter().any(|p| matches!(p.parse::<KeyPart>(), Ok(KeyPart::Jwt(_)))) {
            e.add(format!("limits.{name}.key"), NEEDED);
        }
        if reads(limit.allow.as_ref()) {
            e.add(format!("limits.{name}.allow.claims"), NEEDED);
        }
        if limit.limit_from.as_ref().is_some_and(|from| from.jwt.is_some()) {
            e.add(format!("limits.{name}.limit_from.jwt"), NEEDED);
        }
        for (i, o) in limit.overrides.iter().enumerate() {
            if reads(Some(&o.matcher)) {
                e.add(format!("limits.{name}.overrides[{i}].match.claims"), NEEDED);
            }
        }
    }
    for (i, route) in raw.routes.iter().enumerate() {
        if reads(route.allow.as_ref()) {
            e.add(format!("routes[{i}].allow.claims"), NEEDED);
        }
    }
}
