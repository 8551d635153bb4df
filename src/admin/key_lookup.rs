//! `GET /limits/NAME?PART=VALUE...` and its `DELETE`: one key of a local limit named by
//! the values of its parts, each written as the limit's `key:` writes it (`ip=`,
//! `header:x-api-key=`, `jwt:sub=`, `capture:id=`, ...), and hashed exactly as the
//! request path hashes them. Every part of the limit's key must be given, and only
//! those: a tuple key with a part left out is another key (a request without that part),
//! so a lookup that leaves one out, or names one the key does not have, is refused
//! rather than answered with another key's state.

use std::net::IpAddr;
use std::sync::Arc;

use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, StatusCode};

use crate::config::{LimitId, Scope};
use crate::front;
use crate::policy::charge::Money;
use crate::policy::key::{BodyFields, ClaimPath, Claims, KeyPart, KeySource};
use crate::proxy::Proxy;
use crate::proxy::body::Response;
use crate::router::Captures;
use crate::wire::head::{Fields, RequestHead};

/// The parts a lookup may name, as the error says them.
const PARTS: &str = "ip=, header:NAME=, bearer=, query:NAME=, cookie:NAME=, method=, path=, host=, capture:NAME=, jwt:CLAIM=, json:FIELD=";

/// The answer to a lookup (`reset`: its `DELETE`) of `query` in limit `name`.
pub fn answer(proxy: &Proxy, name: &str, query: &str, reset: bool) -> Response {
    let config = proxy.config();
    let global = |l: &crate::config::Limit| l.name == name && matches!(l.scope, Scope::Global { .. });
    if config.limits.iter().any(global) {
        return super::text(StatusCode::CONFLICT, "a global limit: its state is in Redis\n");
    }
    with_key(proxy, name, query, |index, src| {
        let limiters = proxy.limiters();
        match (reset, limiters.inspect(index, src)) {
            (_, None) => super::text(StatusCode::BAD_REQUEST, "the values given make no key\n"),
            (true, Some(_)) => {
                limiters.reset(index, src);
                super::text(StatusCode::NO_CONTENT, "")
            }
            (false, Some(state)) => match &config.limits[index].money {
                None => super::json(StatusCode::OK, &state),
                // A budget's standing said as money too: `"remaining_money": "49.985"`.
                Some(money) => {
                    let mut shown = serde_json::to_value(&state).unwrap_or_default();
                    shown["money"] = serde_json::Value::from(&*money.currency);
                    if let Some(windows) = shown["windows"].as_array_mut() {
                        for (shown, window) in windows.iter_mut().zip(&state.windows) {
                            shown["remaining_money"] = Money::amount(window.remaining).into();
                        }
                    }
                    super::json(StatusCode::OK, &shown)
                }
            },
        }
    })
}

/// `answer` of the request that carries the key of limit `name` given by `query`'s parts,
/// as its limits read it; 404 for no such limit, 400 for parts that are not its key's.
pub fn with_key(
    proxy: &Proxy,
    name: &str,
    query: &str,
    answer: impl FnOnce(LimitId, &KeySource<'_>) -> Response,
) -> Response {
    let config = proxy.config();
    let Some(index) = config.limits.position(|l| l.name == name) else {
        return super::text(StatusCode::NOT_FOUND, "no such limit\n");
    };
    let limit = &config.limits[index];
    let keyed: Vec<String> = limit.key.0.iter().map(ToString::to_string).collect();
    let asked = match Asked::parse(query, &keyed) {
        Ok(asked) => asked,
        Err(why) => {
            let give: Vec<String> = keyed.iter().map(|part| format!("{part}=VALUE")).collect();
            let body = format!("{why}: limit {name:?} is keyed by {}; give ?{}\n", keyed.join(" + "), give.join("&"));
            return super::typed(StatusCode::BAD_REQUEST, "text/plain", body);
        }
    };
    let head = RequestHead {
        method: &asked.method,
        target: &asked.target,
        version: http::Version::HTTP_11,
        authority: None,
        fields: Fields::from(&asked.headers),
    };
    let Ok(mut src) = front::source(&head, asked.ip, asked.host.as_deref()) else {
        return super::text(StatusCode::BAD_REQUEST, "invalid path\n");
    };
    if !asked.captures.is_empty() {
        src.captures = Captures::given(asked.captures.iter().map(|(n, v)| (n.as_str(), v.as_bytes())));
    }
    if !asked.claims.is_empty() {
        src.claims = Some(Arc::new(asked.claims));
    }
    if !asked.body.is_empty() {
        let (paths, values): (Vec<ClaimPath>, Vec<_>) = asked.body.into_iter().unzip();
        src.body = Some(Box::new(BodyFields::new(paths.into(), values.into())));
    }
    answer(index, &src)
}

/// A request that carries the parts a lookup gives, for the limit's own key extraction.
struct Asked {
    method: Method,
    /// Path and query, as a request's target.
    target: String,
    host: Option<String>,
    ip: IpAddr,
    headers: HeaderMap,
    captures: Vec<(String, String)>,
    claims: Claims,
    /// The JSON body's fields, as `json:` parts read them.
    body: Vec<(ClaimPath, Option<Box<[u8]>>)>,
}

impl Asked {
    /// The request of `query`, whose parts must be exactly the parts of a key written
    /// `keyed` (each as `KeyPart`'s text).
    fn parse(query: &str, keyed: &[String]) -> Result<Asked, String> {
        let mut asked = Asked {
            method: Method::GET,
            target: "/".to_owned(),
            host: None,
            ip: IpAddr::from([0, 0, 0, 0]),
            headers: HeaderMap::new(),
            captures: Vec::new(),
            claims: Claims::new(),
            body: Vec::new(),
        };
        let (mut path, mut uri_query, mut given) = ("/".to_owned(), Vec::new(), Vec::new());
        for (name, value) in form_urlencoded::parse(query.as_bytes()) {
            let part: KeyPart = name.parse().map_err(|e| format!("{name}: {e} (a lookup gives {PARTS})"))?;
            let written = part.to_string();
            if !keyed.contains(&written) {
                return Err(format!("{written} is no part of its key"));
            }
            if given.contains(&written) {
                return Err(format!("{written} is given twice"));
            }
            let invalid = |what: &str| format!("{written}: {value:?} is not {what}");
            match &part {
                KeyPart::Ip(_) => asked.ip = value.parse().map_err(|_| invalid("an IP address"))?,
                KeyPart::Header(field) => {
                    let value = HeaderValue::from_str(&value).map_err(|_| invalid("a field value"))?;
                    asked.headers.append(field.clone(), value);
                }
                KeyPart::Bearer => {
                    let value = HeaderValue::from_str(&format!("Bearer {value}")).map_err(|_| invalid("a token"))?;
                    asked.headers.append(header::AUTHORIZATION, value);
                }
                KeyPart::Cookie(cookie) => {
                    let value = HeaderValue::from_str(&format!("{cookie}={value}")).map_err(|_| invalid("a cookie"))?;
                    asked.headers.append(header::COOKIE, value);
                }
                KeyPart::Query(parameter) => uri_query.push((parameter.to_string(), value.into_owned())),
                KeyPart::Method => asked.method = value.parse().map_err(|_| invalid("a method"))?,
                KeyPart::Path => path = value.into_owned(),
                KeyPart::Host => asked.host = Some(value.into_owned()),
                KeyPart::Capture(group) => asked.captures.push((group.to_string(), value.into_owned())),
                // A claim is looked up as text: a string claim and a number or boolean
                // one written as `value` key alike (`KeyPart::value_in`).
                KeyPart::Jwt(claim) => claim.put(&mut asked.claims, serde_json::Value::String(value.into_owned())),
                KeyPart::Json(field) => asked.body.push((field.clone(), Some(value.as_bytes().into()))),
            }
            given.push(written);
        }
        let missing: Vec<&str> = keyed.iter().filter(|part| !given.contains(part)).map(String::as_str).collect();
        if !missing.is_empty() {
            return Err(format!("{} not given", missing.join(" and ")));
        }
        let query: String = form_urlencoded::Serializer::new(String::new()).extend_pairs(uri_query).finish();
        asked.target = if query.is_empty() { path } else { format!("{path}?{query}") };
        if asked.target.parse::<http::uri::PathAndQuery>().is_err() || !asked.target.starts_with('/') {
            return Err(format!("path: {:?} is not a path", asked.target));
        }
        // A `Host` field too, which a `header:host` part would read.
        if let Some(host) = &asked.host {
            let value = HeaderValue::from_str(host).map_err(|_| format!("host: {host:?} is not a host"))?;
            asked.headers.insert(HeaderName::from_static("host"), value);
        }
        Ok(asked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyed(parts: &[&str]) -> Vec<String> {
        parts.iter().map(|p| p.parse::<KeyPart>().unwrap().to_string()).collect()
    }

    #[test]
    fn every_part_of_the_key_and_only_those_make_a_lookup() {
        let key = keyed(&["jwt:org", "ip"]);
        let asked = Asked::parse("jwt:org=acme&ip=192.0.2.7", &key).unwrap();
        assert_eq!(asked.ip, IpAddr::from([192, 0, 2, 7]));
        assert_eq!(asked.claims["org"], "acme");
        let asked = Asked::parse("jwt%3Aorg=acme&ip=192.0.2.7", &key).unwrap();
        assert_eq!(asked.claims["org"], "acme", "the part's name percent-encoded");
        assert_eq!(Asked::parse("ip=192.0.2.7", &key).err().unwrap(), "jwt:org not given");
        assert_eq!(Asked::parse("jwt:org=a&ip=192.0.2.7&path=/x", &key).err().unwrap(), "path is no part of its key");
        assert_eq!(Asked::parse("jwt:org=a&jwt:org=b&ip=1.2.3.4", &key).err().unwrap(), "jwt:org is given twice");
        let why = Asked::parse("jwt:org=a&ip=1.2.3.4&nope=1", &key).err().unwrap();
        assert!(why.starts_with("nope: unknown key \"nope\""), "{why}");
        assert_eq!(Asked::parse("jwt:org=a&ip=x", &key).err().unwrap(), "ip: \"x\" is not an IP address");
        let nested = Asked::parse("jwt:org.id=7", &keyed(&["jwt:org.id"])).unwrap();
        assert_eq!(nested.claims["org"]["id"], "7");
    }

    #[test]
    fn each_kind_of_part_lands_where_the_key_reads_it() {
        let key =
            keyed(&["header:X-Key", "bearer", "cookie:sid", "query:page", "method", "path", "host", "capture:id"]);
        let query =
            "header:x-key=k&bearer=t&cookie:sid=s&query:page=2&method=POST&path=/a/b&host=Example.com&capture:id=9";
        let asked = Asked::parse(query, &key).unwrap();
        assert_eq!(asked.headers["x-key"], "k");
        assert_eq!(asked.headers["authorization"], "Bearer t");
        assert_eq!(asked.headers["cookie"], "sid=s");
        assert_eq!(asked.headers["host"], "Example.com");
        assert_eq!((asked.method, asked.target.as_str()), (Method::POST, "/a/b?page=2"));
        assert_eq!(asked.captures, [("id".to_owned(), "9".to_owned())]);
    }
}
