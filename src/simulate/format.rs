//! Access log lines read back as the requests they record: sluicegate's own JSON lines,
//! nginx's `combined`, or any nginx `log_format` string, compiled once into a `Pattern`
//! that splits a line at the literal text between its variables. sluicegate's lines may
//! also record the key parts of their limits (`keys`), put back where keys read them.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri, header};
use serde::Deserialize;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::access_log::{JsonLine, Values};
use crate::policy::key::{Claims, KeyPart};
use crate::router::Scheme;
use crate::wire::head::{Fields, RequestHead};

/// nginx's predefined `combined` format.
pub const COMBINED: &str = r#"$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" "$http_user_agent""#;

/// One request as a log line recorded it.
#[derive(Debug, Clone)]
pub struct Logged {
    /// When it arrived, ns since the Unix epoch.
    pub at: u64,
    /// The client address (after `trusted_proxies` or nginx's realip).
    pub client: IpAddr,
    pub method: Method,
    pub uri: Uri,
    /// How it came in (sluicegate's `scheme`, nginx's `$scheme`; `http` when the line
    /// does not say).
    pub scheme: Scheme,
    /// `Host`, the fields the log names, and `Cookie` made of its `$cookie_NAME`s.
    pub headers: HeaderMap,
    /// What was answered (`None`: the log does not say).
    pub status: Option<u16>,
    /// The gRPC status a gRPC call ended with (sluicegate's `grpc_status`; `None`: no
    /// gRPC call, or the log does not say).
    pub grpc_status: Option<u8>,
    /// How long it was in progress, ns (`None`: the log does not say).
    pub duration: Option<u64>,
    /// The key parts the line records (sluicegate's `keys`), present or not: those
    /// present are in `headers`, as the request carried them or as their digests, but
    /// a token's claims, which are in `claims`.
    pub recorded: Vec<KeyPart>,
    /// The claims of its verified token that the line records (`jwt:CLAIM` keys).
    pub claims: Option<Arc<Claims>>,
    /// The fields of its JSON body that the line records (`json:FIELD` keys), as a body
    /// of their own that holds them alone.
    pub body: Option<Vec<u8>>,
    /// How long the upstream's refusal of it held its key (sluicegate's `hold_ms`).
    pub hold: Option<Duration>,
}

impl Logged {
    /// The request's head, as the front reads one.
    pub fn head(&self) -> RequestHead<'_> {
        RequestHead {
            method: &self.method,
            target: self.uri.path_and_query().map_or("/", http::uri::PathAndQuery::as_str),
            version: http::Version::HTTP_11,
            authority: self.uri.authority().map(http::uri::Authority::as_str),
            fields: Fields::from(&self.headers),
        }
    }
}

/// What one line holds.
pub enum Read {
    Request(Box<Logged>),
    /// sluicegate's note that its writer dropped this many lines.
    Dropped(u64),
    Blank,
}

/// Why a line is not a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable(pub String);

impl fmt::Display for Unreadable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn bad<T>(why: impl Into<String>) -> Result<T, Unreadable> {
    Err(Unreadable(why.into()))
}

/// A log format string that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("log format {0:?}: names no time ($msec, $time_local or $time_iso8601)")]
    NoTime(String),
    #[error("log format {0:?}: names no request ($request, or $request_uri or $uri with $request_method)")]
    NoRequest(String),
    #[error("log format {0:?}: names no client address ($remote_addr)")]
    NoClient(String),
    #[error("log format {format:?}: ${first} and ${second} have nothing between them to tell them apart")]
    Adjacent { format: String, first: String, second: String },
    #[error("log format {format:?}: ${name}: not a valid header name")]
    HeaderName { format: String, name: String },
}

/// What the lines of a format can tell, for the report's caveats and the limits whose
/// keys it lacks.
#[derive(Debug, Clone, Default)]
pub struct Carried {
    pub query: bool,
    /// Query parameters logged one by one (`$arg_NAME`).
    pub args: Vec<String>,
    pub host: bool,
    pub headers: Vec<HeaderName>,
    /// Cookies logged one by one (`$cookie_NAME`).
    pub cookies: Vec<String>,
    pub duration: bool,
    pub status: bool,
    /// Times in milliseconds; else in whole seconds.
    pub millis: bool,
    /// Lines may record the key parts of their limits (sluicegate's `keys`): whether one
    /// does is known line by line (`Logged::recorded`).
    pub recorded_keys: bool,
}

/// How the lines of a log are read.
pub enum Format {
    /// sluicegate's `access_log: { format: json }`.
    Json,
    /// An nginx `log_format` (`combined` is one).
    Nginx(Pattern),
}

impl Format {
    /// `json`, `combined`, or an nginx `log_format` string.
    pub fn named(name: &str) -> Result<Format, FormatError> {
        match name {
            "json" => Ok(Format::Json),
            "combined" => Pattern::compile(COMBINED).map(Format::Nginx),
            format => Pattern::compile(format).map(Format::Nginx),
        }
    }

    /// The format of a log whose first lines are `lines`: JSON objects, or `combined`.
    pub fn detect<'a>(lines: impl IntoIterator<Item = &'a str>) -> Option<Format> {
        let combined = Pattern::compile(COMBINED).ok()?;
        let mut cache = TimeCache::default();
        let mut lines = lines.into_iter().map(str::trim).filter(|l| !l.is_empty()).peekable();
        let first = *lines.peek()?;
        if first.starts_with('{') {
            return Some(Format::Json);
        }
        // Most of the first lines must read as `combined` (a log may start mid-line).
        let (mut good, mut all) = (0, 0);
        for line in lines {
            all += 1;
            good += usize::from(combined.read(line, &mut cache).is_ok());
        }
        (good * 2 > all).then_some(Format::Nginx(combined))
    }

    pub fn name(&self) -> String {
        match self {
            Format::Json => "json".to_owned(),
            Format::Nginx(p) if p.source == COMBINED => "combined".to_owned(),
            Format::Nginx(p) => format!("log_format {:?}", p.source),
        }
    }

    pub fn carried(&self) -> Carried {
        match self {
            Format::Json => Carried {
                query: true,
                headers: vec![header::REFERER, header::USER_AGENT],
                duration: true,
                status: true,
                millis: true,
                recorded_keys: true,
                ..Carried::default()
            },
            Format::Nginx(p) => p.carried(),
        }
    }

    /// The request of one line.
    pub fn read(&self, line: &str, cache: &mut TimeCache) -> Result<Read, Unreadable> {
        let line = line.trim_end_matches(['\n', '\r']);
        if line.trim().is_empty() {
            return Ok(Read::Blank);
        }
        match self {
            Format::Json => read_json(line, cache),
            Format::Nginx(p) => p.read(line, cache).map(|l| Read::Request(Box::new(l))),
        }
    }
}

fn read_json(line: &str, cache: &mut TimeCache) -> Result<Read, Unreadable> {
    #[derive(Deserialize)]
    struct Dropped {
        access_log_lines_dropped: u64,
    }
    let parsed: JsonLine<'_> = match serde_json::from_str(line) {
        Ok(parsed) => parsed,
        Err(e) => {
            return match serde_json::from_str::<Dropped>(line) {
                Ok(d) => Ok(Read::Dropped(d.access_log_lines_dropped)),
                Err(_) => bad(format!("not a sluicegate JSON line: {e}")),
            };
        }
    };
    let mut headers = HeaderMap::new();
    for (name, value) in [(header::REFERER, &parsed.referer), (header::USER_AGENT, &parsed.user_agent)] {
        if let Some(v) = value.as_deref().and_then(|v| HeaderValue::from_str(v).ok()) {
            headers.insert(name, v);
        }
    }
    let (mut claims, mut body) = (Claims::new(), Claims::new());
    let recorded = recorded_keys(parsed.keys.flatten().as_ref(), &mut headers, &mut claims, &mut body)?;
    // The duration of the whole request, else the upstream's part of it.
    let duration = parsed.duration_ms.or(parsed.upstream_ms).map(|ms| (ms.max(0.0) * 1e6).round() as u64);
    Ok(Read::Request(Box::new(Logged {
        // sluicegate's `time` is when the request arrived.
        at: cache.rfc3339(&parsed.time)?,
        client: client(&parsed.client)?,
        method: method(&parsed.method)?,
        uri: target(&parsed.target)?,
        scheme: scheme(parsed.scheme.as_deref().unwrap_or("http"))?,
        headers,
        status: parsed.status,
        grpc_status: parsed.grpc_status,
        duration,
        recorded,
        claims: (!claims.is_empty()).then(|| Arc::new(claims)),
        body: (!body.is_empty()).then(|| serde_json::Value::Object(body).to_string().into_bytes()),
        hold: parsed.hold_ms.and_then(|ms| Duration::try_from_secs_f64(ms / 1e3).ok()).filter(|d| !d.is_zero()),
    })))
}

/// The key parts a line's `keys` records, each present one put where its key reads it:
/// a header, `Authorization: Bearer VALUE`, a cookie in `Cookie`, `Host`; a part the
/// request sent several times, each time, as it sent them. A digest (`#…`) stands for the
/// value it was made of: equal values have equal digests, and a limit only compares keys.
/// Names that are no key part a line records are passed over.
fn recorded_keys(
    keys: Option<&std::collections::BTreeMap<String, Option<Values>>>,
    headers: &mut HeaderMap,
    claims: &mut Claims,
    body: &mut Claims,
) -> Result<Vec<KeyPart>, Unreadable> {
    let Some(keys) = keys else { return Ok(Vec::new()) };
    let mut recorded = Vec::with_capacity(keys.len());
    let mut cookies = Vec::new();
    for (name, values) in keys {
        let Some(part) = name.parse::<KeyPart>().ok().filter(KeyPart::logged_apart) else { continue };
        for value in values.iter().flat_map(Values::iter) {
            let value = unescape(value);
            let field = |bytes: &[u8]| {
                HeaderValue::from_bytes(bytes).or_else(|_| {
                    bad(format!("keys: {name}: {value:?} is no header value", value = String::from_utf8_lossy(bytes)))
                })
            };
            match &part {
                KeyPart::Header(header) => {
                    headers.append(header.clone(), field(&value)?);
                }
                KeyPart::Bearer => {
                    headers.append(header::AUTHORIZATION, field(&[b"Bearer ", &value[..]].concat())?);
                }
                KeyPart::Cookie(cookie) => {
                    if !cookies.is_empty() {
                        cookies.extend_from_slice(b"; ");
                    }
                    cookies.extend_from_slice(cookie.as_bytes());
                    cookies.push(b'=');
                    cookies.extend_from_slice(&value);
                }
                KeyPart::Host => {
                    headers.insert(header::HOST, field(&value)?);
                }
                KeyPart::Jwt(claim) => {
                    let text = String::from_utf8_lossy(&value);
                    // An array or object claim is logged as its JSON: read back as one.
                    let value = match text.starts_with(['[', '{']) {
                        true => serde_json::from_str(&text).unwrap_or_else(|_| text.clone().into()),
                        false => serde_json::Value::String(text.into_owned()),
                    };
                    claim.put(claims, value);
                }
                // A string as it was (a number or literal read back as the same text).
                KeyPart::Json(field) => field.put(body, String::from_utf8_lossy(&value).into_owned().into()),
                KeyPart::Ip(_) | KeyPart::Query(_) | KeyPart::Method | KeyPart::Path | KeyPart::Capture(_) => {}
            }
        }
        recorded.push(part);
    }
    if !cookies.is_empty() {
        headers.append(
            header::COOKIE,
            HeaderValue::from_bytes(&cookies).or_else(|_| bad("keys: cookies that make no Cookie field"))?,
        );
    }
    Ok(recorded)
}

fn client(text: &str) -> Result<IpAddr, Unreadable> {
    text.parse().or_else(|_| bad(format!("client address {text:?} is not an IP address")))
}

/// `http` or `https`, as `$scheme` and sluicegate's `scheme` write it.
fn scheme(text: &str) -> Result<Scheme, Unreadable> {
    match text {
        "http" => Ok(Scheme::Http),
        "https" => Ok(Scheme::Https),
        _ => bad(format!("scheme {text:?} is neither http nor https")),
    }
}

fn method(text: &str) -> Result<Method, Unreadable> {
    Method::from_bytes(text.as_bytes()).or_else(|_| bad(format!("method {text:?} is not a method")))
}

fn target(text: &str) -> Result<Uri, Unreadable> {
    text.parse().or_else(|_| bad(format!("request target {text:?} is not a URI")))
}

/// Times read lately: a log's consecutive lines mostly share their second.
#[derive(Default)]
pub struct TimeCache {
    text: String,
    secs: u64,
}

/// `$time_local`: `10/Oct/2000:13:55:36 -0700`.
const TIME_LOCAL: &[time::format_description::BorrowedFormatItem<'_>] = time::macros::format_description!(
    "[day]/[month repr:short]/[year]:[hour]:[minute]:[second] [offset_hour sign:mandatory][offset_minute]"
);

/// Width of a `$time_local` value, which holds a space.
const TIME_LOCAL_LEN: usize = 26;

impl TimeCache {
    /// Seconds since the epoch of a whole-second time, by `parse`, remembered.
    fn seconds(&mut self, text: &str, parse: impl FnOnce(&str) -> Option<i64>) -> Result<u64, Unreadable> {
        if text != self.text {
            let secs = parse(text).and_then(|s| u64::try_from(s).ok());
            self.secs = secs.ok_or_else(|| Unreadable(format!("time {text:?} cannot be read")))?;
            text.clone_into(&mut self.text);
        }
        Ok(self.secs * 1_000_000_000)
    }

    fn time_local(&mut self, text: &str) -> Result<u64, Unreadable> {
        self.seconds(text, |t| OffsetDateTime::parse(t, TIME_LOCAL).ok().map(OffsetDateTime::unix_timestamp))
    }

    /// An RFC 3339 time, to the nanosecond (sluicegate's are to the millisecond).
    fn rfc3339(&mut self, text: &str) -> Result<u64, Unreadable> {
        let at = OffsetDateTime::parse(text, &Rfc3339).ok().map(OffsetDateTime::unix_timestamp_nanos);
        at.and_then(|ns| u64::try_from(ns).ok()).ok_or_else(|| Unreadable(format!("time {text:?} cannot be read")))
    }
}

/// Seconds with a fraction (`$msec`, `$request_time`: `1700000000.123`) as ns, exactly.
fn decimal_seconds(text: &str) -> Option<u64> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    if fraction.len() > 9 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let secs: u64 = whole.parse().ok()?;
    let frac: u64 = if fraction.is_empty() { 0 } else { fraction.parse().ok()? };
    let scale = 10u64.pow(9 - fraction.len() as u32);
    secs.checked_mul(1_000_000_000)?.checked_add(frac * scale)
}

/// `$upstream_response_time`: one time per upstream tried, `, ` and ` : ` between them.
fn upstream_times(text: &str) -> Option<u64> {
    text.split([',', ':']).map(str::trim).try_fold(0u64, |sum, t| Some(sum + decimal_seconds(t)?))
}

/// The length of the `$upstream_response_time` list `rest` begins with.
fn upstream_times_len(rest: &str) -> usize {
    let time = |s: &str| s.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-')).unwrap_or(s.len());
    let mut len = time(rest);
    while let Some(sep) = [", ", " : "].iter().find(|sep| rest[len..].starts_with(**sep)) {
        let next = time(&rest[len + sep.len()..]);
        if next == 0 {
            break;
        }
        len += sep.len() + next;
    }
    len
}

/// nginx's default escaping of logged values: `"`, `\` and bytes outside printable
/// ASCII as `\xHH`.
fn unescape(text: &str) -> std::borrow::Cow<'_, [u8]> {
    if !text.contains("\\x") {
        return std::borrow::Cow::Borrowed(text.as_bytes());
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 2..i + 4).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], bytes.get(i + 1), hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'\\', Some(b'x'), Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    std::borrow::Cow::Owned(out)
}

/// A variable of a `log_format` that a replay reads.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Var {
    RemoteAddr,
    TimeLocal,
    TimeIso8601,
    Msec,
    Request,
    RequestMethod,
    RequestUri,
    Uri,
    Args,
    Arg(String),
    Host,
    Scheme,
    Header(HeaderName),
    Cookie(String),
    Status,
    RequestTime,
    UpstreamTime,
    /// Read over (`$body_bytes_sent`, `$remote_user`, ...).
    Other,
}

impl Var {
    fn of(name: &str, format: &str) -> Result<Var, FormatError> {
        Ok(match name {
            "remote_addr" => Var::RemoteAddr,
            "time_local" => Var::TimeLocal,
            "time_iso8601" => Var::TimeIso8601,
            "msec" => Var::Msec,
            "request" => Var::Request,
            "request_method" => Var::RequestMethod,
            "request_uri" => Var::RequestUri,
            "uri" | "document_uri" => Var::Uri,
            "args" | "query_string" => Var::Args,
            "host" => Var::Host,
            "scheme" => Var::Scheme,
            "status" => Var::Status,
            "request_time" => Var::RequestTime,
            "upstream_response_time" => Var::UpstreamTime,
            _ => {
                if let Some(arg) = name.strip_prefix("arg_") {
                    Var::Arg(arg.to_owned())
                } else if let Some(cookie) = name.strip_prefix("cookie_") {
                    Var::Cookie(cookie.to_owned())
                } else if let Some(field) = name.strip_prefix("http_") {
                    // nginx names `X-Api-Key` `$http_x_api_key`.
                    let field = field.replace('_', "-");
                    Var::Header(
                        HeaderName::from_bytes(field.as_bytes()).map_err(|_| FormatError::HeaderName {
                            format: format.to_owned(),
                            name: name.to_owned(),
                        })?,
                    )
                } else {
                    Var::Other
                }
            }
        })
    }
}

/// A variable and the literal text that follows it in the format.
#[derive(Debug)]
struct Field {
    var: Var,
    /// As the format spells it, for messages.
    name: String,
    /// Empty only for a variable that ends the format.
    tail: String,
}

/// An nginx `log_format`, compiled.
#[derive(Debug)]
pub struct Pattern {
    source: String,
    /// The literal text before the first variable.
    head: String,
    fields: Vec<Field>,
    /// Has `$msec`: times to the millisecond.
    millis: bool,
}

impl Pattern {
    pub fn compile(format: &str) -> Result<Pattern, FormatError> {
        let (mut head, mut fields) = (String::new(), Vec::<Field>::new());
        let mut rest = format;
        while let Some(dollar) = rest.find('$') {
            let literal = &rest[..dollar];
            match fields.last_mut() {
                Some(last) => last.tail.push_str(literal),
                None => head.push_str(literal),
            }
            let after = &rest[dollar + 1..];
            // `$name` or `${name}`.
            let (name, next) = match after.strip_prefix('{').and_then(|a| a.split_once('}')) {
                Some((name, next)) => (name, next),
                None => {
                    let end = after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(after.len());
                    (&after[..end], &after[end..])
                }
            };
            if name.is_empty() {
                match fields.last_mut() {
                    Some(last) => last.tail.push('$'),
                    None => head.push('$'),
                }
                rest = after;
                continue;
            }
            if let Some(last) = fields.last().filter(|f| f.tail.is_empty()) {
                return Err(FormatError::Adjacent {
                    format: format.to_owned(),
                    first: last.name.clone(),
                    second: name.to_owned(),
                });
            }
            fields.push(Field { var: Var::of(name, format)?, name: name.to_owned(), tail: String::new() });
            rest = next;
        }
        match fields.last_mut() {
            Some(last) => last.tail.push_str(rest),
            None => head.push_str(rest),
        }
        let has = |want: &[Var]| fields.iter().any(|f| want.contains(&f.var));
        if !has(&[Var::Msec, Var::TimeLocal, Var::TimeIso8601]) {
            return Err(FormatError::NoTime(format.to_owned()));
        }
        let request = has(&[Var::Request]) || (has(&[Var::RequestMethod]) && has(&[Var::RequestUri, Var::Uri]));
        if !request {
            return Err(FormatError::NoRequest(format.to_owned()));
        }
        if !has(&[Var::RemoteAddr]) {
            return Err(FormatError::NoClient(format.to_owned()));
        }
        let millis = has(&[Var::Msec]);
        Ok(Pattern { source: format.to_owned(), head, fields, millis })
    }

    fn carried(&self) -> Carried {
        let mut c = Carried::default();
        for f in &self.fields {
            match &f.var {
                Var::Request | Var::RequestUri | Var::Args => c.query = true,
                Var::Arg(name) => c.args.push(name.clone()),
                Var::Host => c.host = true,
                Var::Header(name) => {
                    c.host |= name == header::HOST;
                    c.headers.push(name.clone());
                }
                Var::Cookie(name) => c.cookies.push(name.clone()),
                Var::RequestTime | Var::UpstreamTime => c.duration = true,
                Var::Status => c.status = true,
                Var::Msec => c.millis = true,
                _ => {}
            }
        }
        c
    }

    /// The value of each field of `line`, in order.
    fn split<'l>(&self, line: &'l str) -> Result<smallvec::SmallVec<[&'l str; 16]>, Unreadable> {
        let mut rest = match line.strip_prefix(self.head.as_str()) {
            Some(rest) => rest,
            None => return bad(format!("does not begin with {:?}", self.head)),
        };
        let mut values = smallvec::SmallVec::new();
        for f in &self.fields {
            if f.tail.is_empty() {
                values.push(rest);
                rest = "";
                continue;
            }
            // Values with spaces of their own: `$time_local` has a fixed width, and
            // `$upstream_response_time` lists times as `0.1, 0.2 : 0.3`.
            let skip = match f.var {
                Var::TimeLocal if rest.is_char_boundary(TIME_LOCAL_LEN) => TIME_LOCAL_LEN,
                Var::UpstreamTime => upstream_times_len(rest),
                _ => 0,
            };
            let Some(at) = rest.get(skip..).and_then(|r| r.find(f.tail.as_str())) else {
                return bad(format!("no {:?} after ${}", f.tail, f.name));
            };
            values.push(&rest[..skip + at]);
            rest = &rest[skip + at + f.tail.len()..];
        }
        Ok(values)
    }

    fn read(&self, line: &str, cache: &mut TimeCache) -> Result<Logged, Unreadable> {
        let values = self.split(line)?;
        let (mut at, mut client_ip, mut request_time, mut upstream_time) = (None, None, None, None);
        let (mut request, mut method_text, mut target_text, mut path, mut args) = (None, None, None, None, None);
        let (mut status, mut cookies, mut query_args) = (None, String::new(), String::new());
        let mut scheme_of = Scheme::Http;
        let mut headers = HeaderMap::new();
        let present = |v: &str| v != "-" && !v.is_empty();
        for (f, &v) in self.fields.iter().zip(&values) {
            match &f.var {
                Var::RemoteAddr => client_ip = Some(client(v)?),
                // `$msec` is finer than the other two: it wins when a format has both.
                Var::Msec => {
                    at = Some(decimal_seconds(v).ok_or_else(|| Unreadable(format!("$msec {v:?} is not a time")))?);
                }
                Var::TimeLocal if !self.millis => at = Some(cache.time_local(v)?),
                Var::TimeIso8601 if !self.millis => {
                    at =
                        Some(cache.seconds(v, |t| {
                            OffsetDateTime::parse(t, &Rfc3339).ok().map(OffsetDateTime::unix_timestamp)
                        })?);
                }
                Var::Request if present(v) => request = Some(v),
                Var::RequestMethod => method_text = Some(v),
                Var::RequestUri => target_text = Some(v),
                Var::Uri => path = Some(v),
                Var::Args if present(v) => args = Some(v),
                Var::Arg(name) if present(v) => {
                    query_args.push(if query_args.is_empty() { '?' } else { '&' });
                    query_args.push_str(name);
                    query_args.push('=');
                    query_args.push_str(v);
                }
                Var::Host if present(v) => {
                    if let Ok(value) = HeaderValue::from_bytes(&unescape(v)) {
                        headers.insert(header::HOST, value);
                    }
                }
                Var::Scheme if present(v) => scheme_of = scheme(v)?,
                Var::Header(name) if present(v) => {
                    if let Ok(value) = HeaderValue::from_bytes(&unescape(v)) {
                        headers.insert(name.clone(), value);
                    }
                }
                Var::Cookie(name) if present(v) => {
                    if !cookies.is_empty() {
                        cookies.push_str("; ");
                    }
                    cookies.push_str(name);
                    cookies.push('=');
                    cookies.push_str(&String::from_utf8_lossy(&unescape(v)));
                }
                Var::Status if present(v) => {
                    status = Some(v.parse().or_else(|_| bad(format!("status {v:?} is not a number")))?);
                }
                Var::RequestTime if present(v) => request_time = decimal_seconds(v),
                Var::UpstreamTime if present(v) => upstream_time = upstream_times(v),
                _ => {}
            }
        }
        if !cookies.is_empty()
            && let Ok(value) = HeaderValue::from_str(&cookies)
        {
            headers.append(header::COOKIE, value);
        }
        // `$request`: `GET /path?q HTTP/1.1`; `$request_method` and `$request_uri` win.
        let request = request.map(unescape);
        let request = request.as_deref().map(String::from_utf8_lossy);
        let mut words = request.as_deref().unwrap_or_default().split(' ');
        let (word_method, word_target) = (words.next().filter(|w| !w.is_empty()), words.next());
        let Some(method_text) = method_text.or(word_method) else { return bad("no request (nginx logs `-`)") };
        let target_text = match (target_text, word_target, path) {
            (Some(t), _, _) | (None, Some(t), _) => t.to_owned(),
            (None, None, Some(path)) => match args {
                Some(args) => format!("{path}?{args}"),
                None => format!("{path}{query_args}"),
            },
            (None, None, None) => return bad(format!("request {:?} names no target", request.unwrap_or_default())),
        };
        let Some(client_ip) = client_ip else { return bad("no client address") };
        let Some(end) = at else { return bad("no time") };
        let duration = request_time.or(upstream_time);
        // nginx writes a line when the request ends, and `$msec` says when: with the
        // request's duration, when it began. (Whole-second times are taken as they are.)
        let at = match (self.millis, request_time) {
            (true, Some(took)) => end.saturating_sub(took),
            _ => end,
        };
        Ok(Logged {
            at,
            client: client_ip,
            method: method(method_text)?,
            uri: target(&target_text)?,
            scheme: scheme_of,
            headers,
            status,
            grpc_status: None,
            duration,
            recorded: Vec::new(),
            claims: None,
            body: None,
            hold: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(format: &str, line: &str) -> Logged {
        let format = Format::named(format).unwrap();
        match format.read(line, &mut TimeCache::default()) {
            Ok(Read::Request(logged)) => *logged,
            Ok(_) => panic!("no request in {line:?}"),
            Err(e) => panic!("{line:?}: {e}"),
        }
    }

    #[test]
    fn combined_lines_give_client_second_request_and_headers() {
        let l = request(
            "combined",
            r#"2001:db8::1 - - [22/Nov/2026:23:48:25 +0100] "POST /a?b=1 HTTP/1.1" 201 3 "https://r/" "curl/8 \x22x\x22""#,
        );
        assert_eq!(l.client, "2001:db8::1".parse::<IpAddr>().unwrap());
        assert_eq!(l.at, 1_795_387_705 * 1_000_000_000);
        assert_eq!((l.method, l.uri.to_string(), l.status), (Method::POST, "/a?b=1".to_owned(), Some(201)));
        assert_eq!(l.headers["user-agent"], r#"curl/8 "x""#);
        assert_eq!(l.headers["referer"], "https://r/");
    }

    #[test]
    fn msec_less_request_time_is_when_the_request_arrived() {
        let format = r#"$remote_addr $time_local|$msec "$request" $request_time $upstream_response_time $http_x_key $cookie_sid $arg_page"#;
        let l = request(
            format,
            r#"10.0.0.1 22/Nov/2026:23:48:25 +0000|1795391305.250 "GET /x HTTP/2.0" 0.250 0.100, 0.050 k1 s-1 3"#,
        );
        assert_eq!(l.at, 1_795_391_305_000_000_000);
        assert_eq!(l.duration, Some(250_000_000));
        assert_eq!(l.headers["x-key"], "k1");
        assert_eq!(l.headers["cookie"], "sid=s-1");
        let l = request(
            r#"$remote_addr [$msec] "$request_method $uri" $arg_page $upstream_response_time"#,
            r#"10.0.0.1 [1.5] "GET /x" 3 0.100 : 0.050"#,
        );
        assert_eq!((l.uri.to_string(), l.duration), ("/x?page=3".to_owned(), Some(150_000_000)));
    }

    #[test]
    fn missing_values_are_absent_and_bad_lines_say_why() {
        let l = request(r#"$remote_addr [$msec] "$request" "$http_x_key""#, r#"10.0.0.1 [1.000] "GET / HTTP/1.1" "-""#);
        assert!(l.headers.get("x-key").is_none());
        let combined = Format::named("combined").unwrap();
        let why = |line: &str| match combined.read(line, &mut TimeCache::default()) {
            Err(e) => e.0,
            Ok(_) => panic!("{line:?} was read"),
        };
        assert!(why(r#"10.0.0.1 - - [22/Nov/2026:23:48:25 +0000] "-" 400 0 "-" "-""#).contains("no request"));
        assert!(why(r#"10.0.0.1 - - [32/Nov/2026:23:48:25 +0000] "GET / HTTP/1.1" 200 0 "-" "-""#).contains("time"));
        assert!(why("hello").contains("after $remote_addr"));
    }

    #[test]
    fn formats_that_cannot_be_replayed_are_refused_when_compiled() {
        let err = |f: &str| Pattern::compile(f).unwrap_err().to_string();
        assert!(err("$remote_addr $request").contains("no time"));
        assert!(err("$remote_addr $msec $status").contains("no request"));
        assert!(err(r#"[$msec] "$request""#).contains("no client address"));
        assert!(err(r#"$remote_addr$msec "$request""#).contains("$remote_addr and $msec"));
    }

    #[test]
    fn sluicegate_json_lines_and_the_writers_drop_notes_are_read() {
        let json = Format::named("json").unwrap();
        let line = r#"{"time":"2026-11-22T23:41:45.123Z","client":"10.0.0.1","method":"GET","target":"/a?k=1","protocol":"HTTP/1.1","status":429,"bytes":0,"duration_ms":0.5,"upstream_ms":null,"route":"r","outcome":"rejected","referer":null,"user_agent":"ua"}"#;
        let Ok(Read::Request(l)) = json.read(line, &mut TimeCache::default()) else { panic!() };
        assert_eq!((l.at % 1_000_000_000, l.status, l.duration), (123_000_000, Some(429), Some(500_000)));
        assert!(matches!(
            json.read(r#"{"access_log_lines_dropped":7}"#, &mut TimeCache::default()),
            Ok(Read::Dropped(7))
        ));
        assert!(Format::detect([line]).is_some_and(|f| f.name() == "json"));
        assert!(Format::detect(["what is this", "and this"]).is_none());
        assert!(l.recorded.is_empty(), "a line without keys records none");
        assert_eq!(l.scheme, Scheme::Http, "a line without a scheme is plain HTTP's");
        let tls = line.replace(r#""protocol":"#, r#""scheme":"https","protocol":"#);
        let Ok(Read::Request(l)) = json.read(&tls, &mut TimeCache::default()) else { panic!() };
        assert_eq!(l.scheme, Scheme::Https);
        let other = line.replace(r#""protocol":"#, r#""scheme":"ftp","protocol":"#);
        assert!(json.read(&other, &mut TimeCache::default()).is_err());
    }

    #[test]
    fn nginxs_scheme_is_read() {
        let l = request(
            "$remote_addr [$time_local] $scheme \"$request\"",
            "10.0.0.1 [22/Nov/2026:23:48:25 +0000] https \"GET / HTTP/1.1\"",
        );
        assert_eq!(l.scheme, Scheme::Https);
    }

    #[test]
    fn the_key_parts_a_json_line_records_are_put_where_keys_read_them() {
        let json = Format::named("json").unwrap();
        let read = |keys: &str| {
            let line = format!(
                r#"{{"time":"2026-11-22T23:41:45.123Z","client":"10.0.0.1","method":"GET","target":"/?q=1","status":200,"keys":{keys}}}"#
            );
            json.read(&line, &mut TimeCache::default())
        };
        let Ok(Read::Request(l)) = read(
            r##"{"header:x-tenant":"caf\\xC3\\xA9","bearer":"#0123","cookie:sid":"#4567","cookie:other":null,"host":"api.example","ip":"10.9.9.9","nonsense":"x"}"##,
        ) else {
            panic!()
        };
        assert_eq!(l.headers["x-tenant"].as_bytes(), b"caf\xc3\xa9");
        assert_eq!(l.headers["authorization"], "Bearer #0123");
        assert_eq!(l.headers["cookie"], "sid=#4567");
        assert_eq!(l.headers["host"], "api.example");
        let recorded: Vec<String> = l.recorded.iter().map(ToString::to_string).collect();
        // A part the request lacked is recorded, and absent; what the line carries
        // otherwise (`ip`) and what is no key part are passed over.
        assert_eq!(recorded, ["bearer", "cookie:other", "cookie:sid", "header:x-tenant", "host"]);
        assert_eq!(l.client, "10.0.0.1".parse::<IpAddr>().unwrap());
        // A part sent several times is put back each time, as it was sent.
        let Ok(Read::Request(l)) =
            read(r##"{"header:x-tenant":["a","b"],"bearer":["#1","#2"],"cookie:sid":["s1","s2"]}"##)
        else {
            panic!()
        };
        let all = |name: &str| l.headers.get_all(name).iter().map(|v| v.to_str().unwrap()).collect::<Vec<_>>();
        assert_eq!((all("x-tenant"), all("authorization")), (vec!["a", "b"], vec!["Bearer #1", "Bearer #2"]));
        assert_eq!(all("cookie"), ["sid=s1; sid=s2"]);
        let why = match read(r#"{"header:x-tenant":"a\\x0Ab"}"#) {
            Err(e) => e.0,
            Ok(_) => panic!("a value no field can hold was read"),
        };
        assert!(why.contains("header:x-tenant"), "{why}");
    }
}
