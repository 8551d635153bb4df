//! What a limit counts by: the key of a request, reduced to a fixed-size keyed hash.
//!
//! A key spec is parsed once from the config (`ip`, `header:NAME`, `bearer`,
//! `query:NAME`, `cookie:NAME`, `method`, `path`, `host`, `capture:NAME`, `jwt:CLAIM`, or
//! a list of these). Per
//! request the parts are fed into one SipHash-1-3 keyed with a random 128-bit seed
//! (`KeySeed`: drawn at start, or kept in the state directory when limits persist their
//! state), so a table stores 8 bytes per key whatever the key's length, and a client
//! cannot choose values that collide.

use std::borrow::Cow;
use std::fmt;
use std::hash::Hasher;
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::Arc;

use http::{HeaderName, Method, header};
use smallvec::SmallVec;

use crate::router::Captures;
use crate::suggest::closest;
use crate::wire::head::{Fields, Known, RequestHead};

/// Prefix lengths an `ip` key keeps of IPv4 and IPv6 addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpPrefix {
    pub v4: u8,
    pub v6: u8,
}

/// A whole IPv4 address, an IPv6 /64: one IPv6 subscriber usually holds a /64 and could
/// otherwise step through it to escape a limit.
pub const DEFAULT_IP_PREFIX: IpPrefix = IpPrefix { v4: 32, v6: 64 };

impl IpPrefix {
    /// `ip` with the bits past the prefix cleared.
    pub fn mask(self, ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V4(v4) => {
                let keep = u32::MAX.checked_shl(32 - u32::from(self.v4)).unwrap_or(0);
                IpAddr::V4((u32::from(v4) & keep).into())
            }
            IpAddr::V6(v6) => {
                let keep = u128::MAX.checked_shl(128 - u32::from(self.v6)).unwrap_or(0);
                IpAddr::V6((u128::from(v6) & keep).into())
            }
        }
    }

    fn len(self, ip: IpAddr) -> u8 {
        if ip.is_ipv4() { self.v4 } else { self.v6 }
    }
}

/// One component of a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyPart {
    /// The client address, masked to a prefix.
    Ip(IpPrefix),
    Header(HeaderName),
    Bearer,
    Query(Box<str>),
    Cookie(Box<str>),
    Method,
    Path,
    Host,
    /// What the group of this name in the route's `path_regex` captured of the path.
    Capture(Box<str>),
    /// A claim of the request's verified token (`jwt:sub`, `jwt:org.id`).
    Jwt(ClaimPath),
    /// A field of its JSON body (`json:model`, `json:params.name`), read from the first
    /// `server.body_peek` bytes before the admission.
    Json(ClaimPath),
}

/// The fields of a JSON request body that its route's `json:` key parts read: each
/// wanted place's value, if the body has it (a string decoded, a number or literal as
/// written).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyFields {
    paths: Arc<[ClaimPath]>,
    values: Box<[Option<Box<[u8]>>]>,
}

impl BodyFields {
    /// `values[i]` is the value at `paths[i]`.
    pub fn new(paths: Arc<[ClaimPath]>, values: Box<[Option<Box<[u8]>>]>) -> Self {
        debug_assert_eq!(paths.len(), values.len());
        BodyFields { paths, values }
    }

    /// The value at `path`, if the body has it.
    pub fn get(&self, path: &ClaimPath) -> Option<&[u8]> {
        let i = self.paths.iter().position(|p| p == path)?;
        self.values[i].as_deref()
    }
}

/// The claims of a verified token.
pub type Claims = serde_json::Map<String, serde_json::Value>;

/// A claim's place in a token's claims: `sub`, or `org.id` for a nested one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimPath(Box<[Box<str>]>);

impl FromStr for ClaimPath {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s.is_empty() {
            return Err("jwt: needs a claim, e.g. jwt:sub or jwt:org.id".into());
        }
        if s.split('.').any(str::is_empty) {
            return Err(format!("invalid claim {s:?}: names separated by single dots, e.g. org.id"));
        }
        Ok(ClaimPath(s.split('.').map(Into::into).collect()))
    }
}

impl fmt::Display for ClaimPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join("."))
    }
}

impl ClaimPath {
    /// Its names, outermost first.
    pub fn names(&self) -> &[Box<str>] {
        &self.0
    }

    /// Its first (outermost) name.
    pub fn first(&self) -> &str {
        &self.0[0]
    }

    /// The claim in `claims`, if the token has it (`null` counts as absent).
    pub fn find<'c>(&self, claims: &'c Claims) -> Option<&'c serde_json::Value> {
        let (first, rest) = self.0.split_first()?;
        let mut value = claims.get(&**first)?;
        for name in rest {
            value = value.as_object()?.get(&**name)?;
        }
        (!value.is_null()).then_some(value)
    }

    /// Sets the claim in `claims` to `value`, making the objects it is nested in.
    pub fn put(&self, claims: &mut Claims, value: serde_json::Value) {
        let Some((last, outer)) = self.0.split_last() else { return };
        let mut map = claims;
        for name in outer {
            let entry = map.entry(&**name).or_insert_with(|| serde_json::Value::Object(Claims::new()));
            if !entry.is_object() {
                *entry = serde_json::Value::Object(Claims::new());
            }
            let serde_json::Value::Object(inner) = entry else { return };
            map = inner;
        }
        map.insert(last.to_string(), value);
    }

    /// Whether the claim in `claims` is `wanted`: a string equal to it, a number or
    /// boolean written as it, or an array holding one of these.
    pub fn holds(&self, claims: &Claims, wanted: &str) -> bool {
        let is = |v: &serde_json::Value| match v {
            serde_json::Value::String(s) => s == wanted,
            serde_json::Value::Number(n) => wanted.parse::<serde_json::Number>().is_ok_and(|w| w == *n),
            serde_json::Value::Bool(b) => wanted == if *b { "true" } else { "false" },
            _ => false,
        };
        match self.find(claims) {
            Some(serde_json::Value::Array(items)) => items.iter().any(is),
            Some(v) => is(v),
            None => false,
        }
    }
}

/// Key parts written alone, and the kinds written with a name (`header:NAME`).
const PLAIN: [&str; 5] = ["ip", "bearer", "method", "path", "host"];
const NAMED: [&str; 6] = ["header", "query", "cookie", "capture", "jwt", "json"];

impl FromStr for KeyPart {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let nameless = |kind: &str| format!("{kind}: needs a name, e.g. {kind}:x-api-key");
        let named = |kind: &str, name: &str| -> Result<Box<str>, String> {
            if name.is_empty() { Err(nameless(kind)) } else { Ok(name.into()) }
        };
        match s.split_once(':') {
            None => match s {
                "ip" => Ok(KeyPart::Ip(DEFAULT_IP_PREFIX)),
                "bearer" => Ok(KeyPart::Bearer),
                "method" => Ok(KeyPart::Method),
                "path" => Ok(KeyPart::Path),
                "host" => Ok(KeyPart::Host),
                "jwt" => Err("jwt: needs a claim, e.g. jwt:sub or jwt:org.id".into()),
                "json" => Err(JSON_NAMELESS.into()),
                kind if NAMED.contains(&kind) => Err(nameless(kind)),
                _ => Err(match closest(s, PLAIN.into_iter().chain(NAMED)) {
                    Some(kind) if NAMED.contains(&kind) => format!("unknown key {s:?}; did you mean `{kind}:NAME`?"),
                    Some(part) => format!("unknown key {s:?}; did you mean `{part}`?"),
                    None => format!(
                        "unknown key {s:?} (expected ip, bearer, method, path, host, header:NAME, query:NAME, cookie:NAME, capture:NAME, jwt:CLAIM or json:FIELD)"
                    ),
                }),
            },
            Some(("header", name)) => {
                let name = named("header", name)?;
                HeaderName::from_str(&name).map(KeyPart::Header).map_err(|_| format!("invalid header name {name:?}"))
            }
            Some(("query", name)) => named("query", name).map(KeyPart::Query),
            Some(("cookie", name)) => named("cookie", name).map(KeyPart::Cookie),
            Some(("capture", name)) => named("capture", name).map(KeyPart::Capture),
            Some(("jwt", claim)) => claim.parse().map(KeyPart::Jwt),
            Some(("json", "")) => Err(JSON_NAMELESS.into()),
            Some(("json", field)) => field
                .parse()
                .map(KeyPart::Json)
                .map_err(|_| format!("invalid body field {field:?}: names separated by single dots, e.g. params.name")),
            Some((kind, name)) => Err(match closest(kind, NAMED) {
                Some(meant) => format!("unknown key kind {kind:?}; did you mean `{meant}:{name}`?"),
                None => {
                    format!("unknown key kind {kind:?} (expected header:, query:, cookie:, capture:, jwt: or json:)")
                }
            }),
        }
    }
}

const JSON_NAMELESS: &str = "json: needs a field of the JSON body, e.g. json:model or json:params.name";

/// Words that mark a header or query parameter name as carrying a credential
/// (`x-api-key`, `x-auth-token`, `proxy-authorization`, `?access_token=`).
const SECRET_WORDS: [&str; 6] = ["key", "token", "secret", "auth", "password", "session"];

impl KeyPart {
    /// Whether the part's value is a credential, kept out of logs by default: the bearer
    /// token, any cookie, `Cookie` itself, and headers or query parameters whose name
    /// holds one of `SECRET_WORDS` (case-insensitive).
    pub fn is_secret(&self) -> bool {
        let named = |name: &str| {
            let name = name.to_ascii_lowercase();
            SECRET_WORDS.iter().any(|w| name.contains(w))
        };
        match self {
            KeyPart::Bearer | KeyPart::Cookie(_) => true,
            KeyPart::Header(name) => name == header::COOKIE || named(name.as_str()),
            KeyPart::Query(name) => named(name),
            KeyPart::Ip(_)
            | KeyPart::Method
            | KeyPart::Path
            | KeyPart::Host
            | KeyPart::Capture(_)
            | KeyPart::Jwt(_)
            | KeyPart::Json(_) => false,
        }
    }
}

impl KeyPart {
    /// Whether an access log line written with `keys: true` records this part: the parts
    /// a line does not carry otherwise (its `client`, `method` and `target` give `ip`,
    /// `method`, `path` and `query`, and it has `referer` and `user_agent` of its own).
    pub fn logged_apart(&self) -> bool {
        match self {
            KeyPart::Header(name) => name != header::REFERER && name != header::USER_AGENT,
            KeyPart::Bearer | KeyPart::Cookie(_) | KeyPart::Host | KeyPart::Jwt(_) | KeyPart::Json(_) => true,
            KeyPart::Ip(_) | KeyPart::Query(_) | KeyPart::Method | KeyPart::Path | KeyPart::Capture(_) => false,
        }
    }

    /// This part of `src` as its key reads it (`None`: the request lacks it): a field's
    /// first value, the bearer token, a cookie's value, the host in lowercase; an address
    /// as `ip/prefix`.
    pub fn value_in<'s>(&self, src: &'s KeySource<'_>) -> Option<Cow<'s, [u8]>> {
        match value(self, src)? {
            Value::Bytes(bytes) => Some(bytes),
            Value::Host(host) if host.bytes().any(|b| b.is_ascii_uppercase()) => {
                Some(Cow::Owned(host.to_ascii_lowercase().into_bytes()))
            }
            Value::Host(host) => Some(Cow::Borrowed(host.as_bytes())),
            Value::Ip(ip, len) => Some(Cow::Owned(format!("{ip}/{len}").into_bytes())),
        }
    }
}

/// The key of SipHash-1-3 that key parts are hashed with: unguessable to clients, so they
/// cannot aim values at one slot. The same algorithm as std's `RandomState`, whose key
/// cannot be given: a seed kept in the state directory must hash a key as it did before
/// a restart, or the state read back would belong to no key.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct KeySeed(pub [u8; 16]);

impl KeySeed {
    /// A hasher keyed with this seed.
    #[inline]
    pub fn hasher(&self) -> siphasher::sip::SipHasher13 {
        siphasher::sip::SipHasher13::new_with_key(&self.0)
    }
}

/// A request's key for one limit, as the limit's tables hold it: a keyed 64-bit hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KeyHash(pub u64);

/// A limit's key: one part, or a tuple of parts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeySpec(pub Box<[KeyPart]>);

/// What of a request keys are taken from.
pub struct KeySource<'a> {
    pub client_ip: IpAddr,
    pub method: &'a Method,
    /// The target's query as sent.
    pub query: Option<&'a str>,
    /// The normalized path (`crate::path`), which routes and `path` keys see.
    pub path: Cow<'a, [u8]>,
    pub fields: Fields<'a>,
    /// The request's host, without port, as routing saw it.
    pub host: Option<&'a str>,
    /// What the route's `path_regex` captured of `path` (empty until a route is found).
    pub captures: Captures,
    /// The claims of the request's verified token (`None`: none, or none verified; read
    /// once a route that uses them is found).
    pub claims: Option<Arc<Claims>>,
    /// The fields of its JSON body that its route's limits read (`None`: none read).
    pub body: Option<Box<BodyFields>>,
    /// It came from a peer in `trusted_proxies`, whose fields a limit's `limit_from`
    /// may read a count from.
    pub trusted_peer: bool,
}

impl<'a> KeySource<'a> {
    /// The source of `head`, from `client_ip`, whose path normalizes to `path` and whose
    /// host routing reads as `host`.
    pub fn new(client_ip: IpAddr, head: &RequestHead<'a>, path: Cow<'a, [u8]>, host: Option<&'a str>) -> Self {
        KeySource {
            client_ip,
            method: head.method,
            query: head.query(),
            path,
            fields: head.fields,
            host,
            captures: Captures::default(),
            claims: None,
            body: None,
            trusted_peer: false,
        }
    }

    /// A `GET` of `target` from `client_ip` with `headers`, its path taken as normalized
    /// and its host from `Host`: for tests and benchmarks.
    pub fn get(client_ip: IpAddr, target: &'a str, headers: &'a http::HeaderMap) -> Self {
        static GET: Method = Method::GET;
        let head = RequestHead {
            method: &GET,
            target,
            version: http::Version::HTTP_11,
            authority: None,
            fields: Fields::from(headers),
        };
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
        KeySource::new(client_ip, &head, Cow::Borrowed(head.path().as_bytes()), host)
    }
}

impl KeySpec {
    /// The key of `src` hashed with `seed`, or `None` when the request has no key for
    /// this limit, which then does not count it (nginx's empty-key rule). A tuple key is
    /// missing only when every part is missing, so leaving out one header does not
    /// escape a limit keyed on `[ip, header:x]`.
    pub fn hash(&self, src: &KeySource<'_>, seed: &KeySeed) -> Option<KeyHash> {
        let (key, present) = self.hash_any(src, seed);
        present.then_some(key)
    }

    /// The key of `src` hashed with `seed` whether or not the request has it, and whether
    /// it has: every request lacking every part has one key, the same (a limit with
    /// `on_missing_key: shared` counts them all under it).
    #[inline]
    pub fn hash_any(&self, src: &KeySource<'_>, seed: &KeySeed) -> (KeyHash, bool) {
        let mut h = seed.hasher();
        let present = self.feed(src, &mut h);
        (KeyHash(h.finish()), present)
    }

    /// The key of `src` as every instance computes it, for global limits: 128 bits of
    /// SHA-1 (a fixed function, unlike `hash`, whose seed is per process or per state directory; and one that
    /// keeps key values such as tokens out of Redis). Whether or not the request has it,
    /// as `hash_any`, with whether it has.
    pub fn global_any(&self, src: &KeySource<'_>) -> (u128, bool) {
        let mut h = Sha1Hasher(sha1_smol::Sha1::new());
        let present = self.feed(src, &mut h);
        let digest = h.0.digest().bytes();
        let mut first = [0; 16];
        first.copy_from_slice(&digest[..16]);
        (u128::from_be_bytes(first), present)
    }

    /// The key of `src` for global limits (`None`: the request lacks it).
    pub fn global(&self, src: &KeySource<'_>) -> Option<u128> {
        let (key, present) = self.global_any(src);
        present.then_some(key)
    }

    /// Whether `src` has this key: some part present (`ip`, `method` and `path` always are).
    pub fn present(&self, src: &KeySource<'_>) -> bool {
        self.0.iter().any(|part| {
            matches!(part, KeyPart::Ip(_) | KeyPart::Method | KeyPart::Path) || part.value_in(src).is_some()
        })
    }

    /// Whether a request may lack this key: no part is one every request has.
    pub fn may_be_missing(&self) -> bool {
        !self.0.iter().any(|part| matches!(part, KeyPart::Ip(_) | KeyPart::Method | KeyPart::Path))
    }

    /// Feeds every part of `src` into `h`; false when all are missing.
    #[inline]
    fn feed(&self, src: &KeySource<'_>, h: &mut impl Hasher) -> bool {
        let mut any = false;
        for part in self.0.iter() {
            let present = feed(part, src, h);
            h.write_u8(u8::from(present));
            any |= present;
        }
        any
    }
}

/// SHA-1 behind the `Hasher` interface that key parts are fed through (`finish` is not
/// used: the digest is read in full).
struct Sha1Hasher(sha1_smol::Sha1);

impl Hasher for Sha1Hasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    fn write_usize(&mut self, n: usize) {
        // Fixed width, so that 32- and 64-bit instances agree.
        self.0.update(&(n as u64).to_le_bytes());
    }

    fn finish(&self) -> u64 {
        let d = self.0.digest().bytes();
        u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
    }
}

/// The value of one key part in a request.
enum Value<'a> {
    /// A masked address and its prefix length.
    Ip(IpAddr, u8),
    Bytes(Cow<'a, [u8]>),
    /// Compared case-insensitively (RFC 9110 §4.2.3).
    Host(&'a str),
}

/// `part` of `src`, or None when the request lacks it.
fn value<'s>(part: &KeyPart, src: &'s KeySource<'_>) -> Option<Value<'s>> {
    let bytes = |b: &'s [u8]| Some(Value::Bytes(Cow::Borrowed(b)));
    match part {
        KeyPart::Ip(prefix) => {
            let ip = src.client_ip.to_canonical();
            Some(Value::Ip(prefix.mask(ip), prefix.len(ip)))
        }
        KeyPart::Header(name) => bytes(src.fields.get(name)?),
        KeyPart::Bearer => bytes(bearer_token(src.fields)?),
        KeyPart::Query(name) => {
            let (_, v) = form_urlencoded::parse(src.query?.as_bytes()).find(|(k, _)| k == name.as_ref())?;
            Some(Value::Bytes(match v {
                Cow::Borrowed(v) => Cow::Borrowed(v.as_bytes()),
                Cow::Owned(v) => Cow::Owned(v.into_bytes()),
            }))
        }
        KeyPart::Cookie(name) => bytes(cookie(src.fields, name)?),
        KeyPart::Method => bytes(src.method.as_str().as_bytes()),
        KeyPart::Path => Some(Value::Bytes(Cow::Borrowed(&src.path))),
        KeyPart::Host => Some(Value::Host(src.host?)),
        KeyPart::Capture(name) => bytes(src.captures.get(name, &src.path)?),
        KeyPart::Jwt(claim) => Some(Value::Bytes(match claim.find(src.claims.as_deref()?)? {
            serde_json::Value::String(s) => Cow::Borrowed(s.as_bytes()),
            // A number or boolean as written; an array or object as its JSON.
            other => Cow::Owned(other.to_string().into_bytes()),
        })),
        KeyPart::Json(field) => bytes(src.body.as_deref()?.get(field)?),
    }
}

/// Writes `part` of `src` into `h`; false when the request lacks it.
fn feed(part: &KeyPart, src: &KeySource<'_>, h: &mut impl Hasher) -> bool {
    let mut bytes = |b: &[u8]| {
        h.write(b);
        h.write_usize(b.len());
    };
    match value(part, src) {
        None => return false,
        Some(Value::Ip(IpAddr::V4(v4), _)) => bytes(&v4.octets()),
        Some(Value::Ip(IpAddr::V6(v6), _)) => bytes(&v6.octets()),
        Some(Value::Bytes(b)) => bytes(&b),
        Some(Value::Host(host)) => {
            for b in host.bytes() {
                h.write_u8(b.to_ascii_lowercase());
            }
            h.write_usize(host.len());
        }
    }
    true
}

impl fmt::Display for KeyPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyPart::Ip(_) => f.write_str("ip"),
            KeyPart::Header(name) => write!(f, "header:{name}"),
            KeyPart::Bearer => f.write_str("bearer"),
            KeyPart::Query(name) => write!(f, "query:{name}"),
            KeyPart::Cookie(name) => write!(f, "cookie:{name}"),
            KeyPart::Method => f.write_str("method"),
            KeyPart::Path => f.write_str("path"),
            KeyPart::Host => f.write_str("host"),
            KeyPart::Capture(name) => write!(f, "capture:{name}"),
            KeyPart::Jwt(claim) => write!(f, "jwt:{claim}"),
            KeyPart::Json(field) => write!(f, "json:{field}"),
        }
    }
}

/// The token of `Authorization: Bearer TOKEN` (RFC 6750 §2.1; the scheme is
/// case-insensitive, RFC 9110 §11.1).
pub fn bearer_token<'a>(fields: Fields<'a>) -> Option<&'a [u8]> {
    bearer(fields.first_of(Known::Authorization)?)
}

/// The token of an `Authorization` field's `value` of the `Bearer` scheme.
pub fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || rest.first() != Some(&b' ') {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// The values of cookie `name` in the `Cookie` header(s) (RFC 6265 §5.4: `a=1; b=2`).
/// A scan without allocation, where a cookie crate would build a struct per pair.
pub fn cookies<'h>(fields: Fields<'h>, name: &str) -> impl Iterator<Item = &'h [u8]> {
    fields.all_of(Known::Cookie).flat_map(move |line| {
        line.split(|&b| b == b';').filter_map(move |pair| {
            let pair = pair.trim_ascii();
            let eq = pair.iter().position(|&b| b == b'=')?;
            (pair[..eq].trim_ascii() == name.as_bytes()).then(|| pair[eq + 1..].trim_ascii())
        })
    })
}

fn cookie<'h>(fields: Fields<'h>, name: &str) -> Option<&'h [u8]> {
    cookies(fields, name).next()
}

impl KeyPart {
    /// Where a request carries this part, for messages to the client.
    pub fn field(&self) -> String {
        match self {
            KeyPart::Header(name) => format!("the header `{name}`"),
            KeyPart::Bearer => "the `Authorization` header".to_owned(),
            KeyPart::Query(name) => format!("the query parameter `{name}`"),
            KeyPart::Cookie(name) => format!("the cookie `{name}`"),
            KeyPart::Ip(_) => "the client address".to_owned(),
            KeyPart::Method => "the method".to_owned(),
            KeyPart::Path => "the path".to_owned(),
            KeyPart::Host => "the `Host` header".to_owned(),
            KeyPart::Capture(name) => format!("the group `{name}` of the route's path_regex"),
            KeyPart::Jwt(claim) => format!("the claim `{claim}` of a verified token"),
            KeyPart::Json(field) => format!("the field `{field}` of the JSON body"),
        }
    }
}

impl KeyPart {
    /// Every value of this part in `src`: the one `value_in` reads, or, when the request
    /// carries the part more than once (`KeySpec::duplicated`), each in order (a repeated
    /// `Authorization`'s token, or the field whole where it holds none), so that what
    /// the proxy refused can be told again from them.
    pub fn values_in<'s>(&self, src: &'s KeySource<'_>) -> SmallVec<[Cow<'s, [u8]>; 1]> {
        let many: SmallVec<[Cow<'s, [u8]>; 1]> = match self {
            KeyPart::Header(name) if *name != header::COOKIE => src.fields.get_all(name).map(Cow::Borrowed).collect(),
            KeyPart::Bearer => {
                src.fields.all_of(Known::Authorization).map(|v| Cow::Borrowed(bearer(v).unwrap_or(v))).collect()
            }
            KeyPart::Cookie(name) => cookies(src.fields, name).map(Cow::Borrowed).collect(),
            _ => SmallVec::new(),
        };
        if many.len() > 1 { many } else { self.value_in(src).into_iter().collect() }
    }
}

impl KeySpec {
    /// The first part of the key that `src` carries more than once. A key reads the
    /// first of repeated fields, while an upstream may read another (the last, or all
    /// joined): a client could show the limiter one value and the upstream another.
    pub fn duplicated(&self, src: &KeySource<'_>) -> Option<&KeyPart> {
        let repeated = |name: &HeaderName| src.fields.get_all(name).nth(1).is_some();
        self.0.iter().find(|part| match part {
            // HTTP/2 clients may split `Cookie` into one field per cookie (RFC 9113
            // §8.2.3): a whole-header key sees only the first one, as it would anyway.
            KeyPart::Header(name) => *name != header::COOKIE && repeated(name),
            KeyPart::Bearer => repeated(&header::AUTHORIZATION),
            KeyPart::Cookie(name) => cookies(src.fields, name).nth(1).is_some(),
            KeyPart::Query(name) => src.query.is_some_and(|q| {
                form_urlencoded::parse(q.as_bytes()).filter(|(k, _)| k == name.as_ref()).nth(1).is_some()
            }),
            // One address, one method, one path; a repeated `Host` is refused before, and
            // so is a repeated token (`jwt::Verifier::token`).
            KeyPart::Ip(_)
            | KeyPart::Method
            | KeyPart::Path
            | KeyPart::Host
            | KeyPart::Capture(_)
            | KeyPart::Jwt(_) => false,
            // A body repeating it is refused as its fields are read (`front::body`).
            KeyPart::Json(_) => false,
        })
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderMap;

    use super::*;

    fn spec(parts: &[&str]) -> KeySpec {
        KeySpec(parts.iter().map(|p| p.parse().unwrap()).collect())
    }

    fn key(spec: &KeySpec, ip: &str, uri: &str, headers: &[(&str, &str)]) -> Option<u64> {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.append(HeaderName::from_str(k).unwrap(), v.parse().unwrap());
        }
        map.insert(header::HOST, "Example.com".parse().unwrap());
        spec.hash(&KeySource::get(ip.parse().unwrap(), uri, &map), &SEED).map(|k| k.0)
    }

    static SEED: KeySeed = KeySeed([7; 16]);

    #[test]
    fn ipv4_mapped_ipv6_is_the_same_client_as_ipv4() {
        let s = spec(&["ip"]);
        assert_eq!(key(&s, "10.0.0.1", "/", &[]), key(&s, "::ffff:10.0.0.1", "/", &[]));
        assert_ne!(key(&s, "10.0.0.1", "/", &[]), key(&s, "10.0.0.2", "/", &[]));
    }

    #[test]
    fn ipv6_clients_are_keyed_by_their_64_and_prefixes_can_be_set() {
        let s = spec(&["ip"]);
        assert_eq!(key(&s, "2001:db8:1:2::1", "/", &[]), key(&s, "2001:db8:1:2:ffff::9", "/", &[]));
        assert_ne!(key(&s, "2001:db8:1:2::1", "/", &[]), key(&s, "2001:db8:1:3::1", "/", &[]));
        assert_ne!(key(&s, "10.0.0.1", "/", &[]), key(&s, "10.0.0.2", "/", &[]));
        let v4_24 = KeySpec(Box::new([KeyPart::Ip(IpPrefix { v4: 24, v6: 128 })]));
        assert_eq!(key(&v4_24, "10.0.0.1", "/", &[]), key(&v4_24, "10.0.0.200", "/", &[]));
        assert_ne!(key(&v4_24, "2001:db8::1", "/", &[]), key(&v4_24, "2001:db8::2", "/", &[]));
        let zero = IpPrefix { v4: 0, v6: 0 };
        assert_eq!(zero.mask("10.1.2.3".parse().unwrap()), "0.0.0.0".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn missing_header_means_no_key() {
        let s = spec(&["header:x-key"]);
        assert_eq!(key(&s, "10.0.0.1", "/", &[]), None);
        assert!(key(&s, "10.0.0.1", "/", &[("x-key", "a")]).is_some());
    }

    #[test]
    fn bearer_token_is_taken_from_authorization() {
        let s = spec(&["bearer"]);
        let a = key(&s, "10.0.0.1", "/", &[("authorization", "Bearer abc")]);
        assert!(a.is_some());
        assert_eq!(a, key(&s, "10.0.0.9", "/", &[("authorization", "bearer  abc")]));
        assert_eq!(key(&s, "10.0.0.1", "/", &[("authorization", "Basic abc")]), None);
        assert_eq!(key(&s, "10.0.0.1", "/", &[("authorization", "Bearer ")]), None);
    }

    #[test]
    fn query_values_are_percent_decoded() {
        let s = spec(&["query:k"]);
        assert_eq!(key(&s, "10.0.0.1", "/?a=1&k=a%62", &[]), key(&s, "10.0.0.1", "/?k=ab", &[]));
        assert_eq!(key(&s, "10.0.0.1", "/?kk=1", &[]), None);
    }

    #[test]
    fn cookies_are_found_among_others() {
        let s = spec(&["cookie:sid"]);
        let a = key(&s, "10.0.0.1", "/", &[("cookie", "a=1; sid=xyz; b=2")]);
        assert_eq!(a, key(&s, "10.0.0.1", "/", &[("cookie", "a=1"), ("cookie", "sid=xyz")]));
        assert_eq!(key(&s, "10.0.0.1", "/", &[("cookie", "sidx=1")]), None);
    }

    #[test]
    fn tuple_key_differs_by_each_part_and_survives_a_missing_part() {
        let s = spec(&["ip", "header:x-key"]);
        let with = key(&s, "10.0.0.1", "/", &[("x-key", "a")]);
        let without = key(&s, "10.0.0.1", "/", &[]);
        assert!(without.is_some());
        assert_ne!(with, without);
        // The parts are delimited: ("ab", "") and ("a", "b") differ.
        let hh = spec(&["header:x", "header:y"]);
        assert_ne!(
            key(&hh, "1.1.1.1", "/", &[("x", "ab"), ("y", "")]),
            key(&hh, "1.1.1.1", "/", &[("x", "a"), ("y", "b")])
        );
    }

    #[test]
    fn credentials_are_found_by_the_names_that_carry_them() {
        for name in ["authorization", "proxy-authorization", "cookie", "x-api-key", "x-auth-token", "x-secret"] {
            assert!(KeyPart::Header(HeaderName::from_static(name)).is_secret(), "{name}");
        }
        assert!(!KeyPart::Header(HeaderName::from_static("x-tenant")).is_secret());
        assert!(spec(&["bearer"]).0[0].is_secret() && spec(&["query:access_token"]).0[0].is_secret());
    }

    #[test]
    fn repeated_fields_of_a_key_are_found() {
        let s = spec(&["ip", "bearer", "header:x-key", "query:q", "cookie:sid"]);
        let uri = "/?q=1&r=2&r=3";
        let check = |headers: &[(&str, &str)], uri: &str| {
            let mut map = HeaderMap::new();
            for (k, v) in headers {
                map.append(HeaderName::from_str(k).unwrap(), v.parse().unwrap());
            }
            let src = KeySource::get("10.0.0.1".parse().unwrap(), uri, &map);
            s.duplicated(&src).map(ToString::to_string)
        };
        let once = [("authorization", "Bearer a"), ("x-key", "k"), ("cookie", "sid=1; other=2"), ("cookie", "o=3")];
        assert_eq!(check(&once, uri), None);
        assert_eq!(check(&[("authorization", "Bearer a"), ("authorization", "Bearer b")], uri).unwrap(), "bearer");
        assert_eq!(check(&[("x-key", "a"), ("x-key", "b")], uri).unwrap(), "header:x-key");
        assert_eq!(check(&[("cookie", "sid=1"), ("cookie", "sid=2")], uri).unwrap(), "cookie:sid");
        assert_eq!(check(&[("cookie", "sid=1; sid=2")], uri).unwrap(), "cookie:sid");
        assert_eq!(check(&[], "/?q=1&q=2").unwrap(), "query:q");
    }

    #[test]
    fn claims_key_by_their_value_nested_or_not() {
        let claims: Claims = serde_json::from_value(serde_json::json!({
            "sub": "alice", "n": 7, "org": {"id": "acme"}, "roles": ["a", "b"], "none": null
        }))
        .unwrap();
        let map = HeaderMap::new();
        let mut src = KeySource::get("10.0.0.1".parse().unwrap(), "/", &map);
        let value = |src: &KeySource<'_>, part: &str| {
            part.parse::<KeyPart>().unwrap().value_in(src).map(|v| String::from_utf8(v.into_owned()).unwrap())
        };
        assert_eq!(value(&src, "jwt:sub"), None, "no verified token, no claim");
        src.claims = Some(Arc::new(claims));
        assert_eq!(value(&src, "jwt:sub").as_deref(), Some("alice"));
        assert_eq!(value(&src, "jwt:n").as_deref(), Some("7"));
        assert_eq!(value(&src, "jwt:org.id").as_deref(), Some("acme"));
        assert_eq!(value(&src, "jwt:roles").as_deref(), Some(r#"["a","b"]"#));
        assert_eq!(value(&src, "jwt:none"), None);
        assert_eq!(value(&src, "jwt:sub.x"), None);
        let roles: ClaimPath = "roles".parse().unwrap();
        let claims = src.claims.as_deref().unwrap();
        assert!(roles.holds(claims, "b") && !roles.holds(claims, "c"));
        assert!("n".parse::<ClaimPath>().unwrap().holds(claims, "7"));
        assert!("org.id".parse::<ClaimPath>().unwrap().holds(claims, "acme"));
    }

    #[test]
    fn unknown_key_kinds_are_explained() {
        let error = |s: &str| s.parse::<KeyPart>().unwrap_err();
        assert_eq!(
            error("ipv4"),
            "unknown key \"ipv4\" (expected ip, bearer, method, path, host, header:NAME, query:NAME, cookie:NAME, capture:NAME, jwt:CLAIM or json:FIELD)"
        );
        assert!(error("header:").contains("needs a name"));
        assert!(error("header:bad name").contains("invalid header name"));
        assert_eq!(error("header"), "header: needs a name, e.g. header:x-api-key");
        assert_eq!(
            error("nope:x"),
            "unknown key kind \"nope\" (expected header:, query:, cookie:, capture:, jwt: or json:)"
        );
        assert!(error("jwt:").contains("needs a claim"));
        assert!(error("jwt:org..id").contains("single dots"));
        assert!(error("json:").contains("needs a field of the JSON body"));
        assert!(error("json").contains("needs a field of the JSON body"));
        assert!(error("json:a..b").contains("single dots"));
        assert_eq!("json:params.name".parse::<KeyPart>().unwrap().to_string(), "json:params.name");
    }

    #[test]
    fn misspelt_keys_are_told_what_they_likely_mean() {
        let error = |s: &str| s.parse::<KeyPart>().unwrap_err();
        assert_eq!(error("ipp"), "unknown key \"ipp\"; did you mean `ip`?");
        assert_eq!(error("Bearer"), "unknown key \"Bearer\"; did you mean `bearer`?");
        assert_eq!(error("methd"), "unknown key \"methd\"; did you mean `method`?");
        assert_eq!(error("cookies"), "unknown key \"cookies\"; did you mean `cookie:NAME`?");
        assert_eq!(error("headers:x-api-key"), "unknown key kind \"headers\"; did you mean `header:x-api-key`?");
        assert_eq!(error("qeury:page"), "unknown key kind \"qeury\"; did you mean `query:page`?");
    }
}
