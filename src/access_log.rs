//! The access log (`access_log:`): one line per request, written when its response has
//! been sent (or the client went away), as JSON or in nginx's `combined` format.
//!
//! Lines go through a bounded queue to a writer thread, so a slow disk never holds up a
//! request: when the queue is full, lines are dropped and counted, and the count is
//! written once the queue drains. The file is opened again by every reload, which is how
//! a rotated log is reopened (as `nginx -s reopen` does).
//!
//! With `keys: true`, a JSON line also records the key parts of the limits its route
//! evaluated (`KeyRecorder`), so that `simulate` can replay limits keyed on headers,
//! tokens and cookies, which the rest of the line does not carry.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::{BufWriter, Write};
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, Instant, SystemTime};

use http::{HeaderValue, Method, Version};
use serde::{Deserialize, Deserializer, Serialize};
use typed_index_collections::TiVec;

use crate::config::{AccessFormat, AccessLogConfig, Config, RouteId};
use crate::limit::key_text::KeyText;
use crate::policy::key::{KeyPart, KeySource};
use crate::router::Scheme;
use crate::wire::head::RequestHead;

/// Lines waiting for the writer before new ones are dropped.
const QUEUE: usize = 16 * 1024;

pub struct AccessLog {
    format: AccessFormat,
    lines: SyncSender<String>,
    dropped: Arc<AtomicU64>,
    /// What lines record of keys (`None`: `keys` is off).
    keys: Option<KeyRecorder>,
}

/// What the lines record of the keys of limits (`keys: true`): per route, the parts its
/// limits (and those their overrides name) are keyed on that a line does not carry
/// otherwise (`KeyPart::logged_apart`): headers, the bearer token, cookies, the host.
///
/// Each value is written as every other surface writes it (`KeyText`): as sent (bytes
/// outside printable ASCII, and `\`, escaped as `\xHH`, nginx's way), or, as `log_keys`
/// says, as its digest keyed with `keys_secret`: a replay groups requests by their key,
/// so one value must have one digest on every line of the logs it is given, across
/// restarts, reloads and instances, which a secret drawn at start does not give.
/// `simulate` never needs the secret to group: it takes a digest for the value it stands
/// for, as equal values have equal digests and a limit only compares keys.
pub struct KeyRecorder {
    text: KeyText,
    /// By route: the parts its lines record, in this order.
    routes: TiVec<RouteId, Box<[Recorded]>>,
}

/// One key part a route's lines record.
struct Recorded {
    part: KeyPart,
    /// As a limit's `key` names it, the field's name in a line: `header:x-tenant`.
    name: Box<str>,
}

/// What one line records of keys: its route's parts' values, in `KeyRecorder` order, as
/// written (`None`: the request has none; several: it sent the part more than once).
/// Empty when the route's allow-list exempted the request: no limit evaluated it.
pub struct RecordedKeys {
    route: RouteId,
    values: Vec<Option<Values>>,
}

impl KeyRecorder {
    /// What the lines of `config` record, if `keys` is on.
    fn new(log: &AccessLogConfig, config: &Config) -> Option<KeyRecorder> {
        if !log.keys {
            return None;
        }
        let text = KeyText::new(config, None);
        let routes = config
            .routes
            .iter()
            .map(|route| {
                let mut parts: Vec<Recorded> = Vec::new();
                for part in route.candidates.iter().flat_map(|&l| config.limits[l].key.0.iter()) {
                    // A part to digest without `keys_secret` is never written (validation
                    // refuses that configuration): its limits are then reported as not
                    // simulated, rather than a credential written as sent.
                    let unkeyed = text.digests(part) && !text.stable();
                    if !part.logged_apart() || unkeyed || parts.iter().any(|r| r.part == *part) {
                        continue;
                    }
                    parts.push(Recorded { part: part.clone(), name: part.to_string().into() });
                }
                parts.into_boxed_slice()
            })
            .collect();
        Some(KeyRecorder { text, routes })
    }

    fn record(&self, route: RouteId, exempt: bool, src: &KeySource<'_>) -> RecordedKeys {
        let parts: &[Recorded] = if exempt { &[] } else { &self.routes[route] };
        let values = parts
            .iter()
            .map(|r| Values::of(r.part.values_in(src).iter().map(|v| self.text.value(&r.part, v)).collect()))
            .collect();
        RecordedKeys { route, values }
    }

    /// The `keys` object of a line.
    fn keys(&self, keys: &RecordedKeys) -> BTreeMap<String, Option<Values>> {
        let parts = self.routes.get(keys.route).map_or(&[][..], |p| &p[..]);
        parts.iter().zip(&keys.values).map(|(r, v)| (r.name.to_string(), v.clone())).collect()
    }
}

/// What one request's line says, gathered along the request path.
pub struct Entry {
    pub log: Arc<AccessLog>,
    pub started: Instant,
    pub time: SystemTime,
    pub client: IpAddr,
    pub method: Method,
    /// The request target as sent (path and query).
    pub target: String,
    pub version: Version,
    /// How it came in: `https` on a listener with TLS.
    pub scheme: Scheme,
    pub referer: Option<HeaderValue>,
    pub user_agent: Option<HeaderValue>,
    pub route: Option<String>,
    /// What the limits made of it (`passed`, `rejected`, ...; `-` when no route matched).
    pub outcome: &'static str,
    pub status: u16,
    /// Time to the upstream's response headers.
    pub upstream: Option<Duration>,
    /// Body bytes sent to the client.
    pub bytes: u64,
    /// The `grpc-status` a gRPC call ended with (its trailers', or its trailers-only
    /// head's), if it has one.
    pub grpc_status: Option<u8>,
    /// The key parts of the limits its route evaluated (`keys: true`; `None`: none were
    /// found yet, or `keys` is off).
    pub keys: Option<RecordedKeys>,
    /// The limits whose key it lacked, as `sluicegate_limit_missing_key_total` counts them.
    pub missing_key: Vec<String>,
    /// The limits that decided it with its key's own count (`limit_from`), and that count.
    pub own_counts: BTreeMap<String, u64>,
    /// The money budgets that charge its response, and the row of their prices it is
    /// charged at (`*`: any other value's).
    pub priced_as: BTreeMap<String, String>,
    /// How long its key is held (`upstream_hold`) after the upstream refused it with a
    /// time to wait: what a replay holds it for.
    pub hold: Option<Duration>,
    /// What a live candidate makes of it beside the enforced decision: `refused`,
    /// `admitted` or `same` (`None`: no candidate is live).
    pub candidate: Option<&'static str>,
    /// The candidate's route, when it is not the one taken (`-`: none).
    pub candidate_route: Option<String>,
    /// Its wait in a concurrency limit's queue (`None`: it did not come to one).
    pub queued: Option<QueueWait>,
    /// The class it waited in, when the queue has classes.
    pub queue_class: Option<String>,
}

impl AccessLog {
    /// Opens the log `log` of `config` (appending to its file, or stderr) and starts its
    /// writer.
    pub fn open(log: &AccessLogConfig, config: &Config) -> std::io::Result<Arc<AccessLog>> {
        let out: Box<dyn Write + Send> = match &log.path {
            None => Box::new(std::io::stderr()),
            Some(path) => {
                Box::new(OpenOptions::new().create(true).append(true).open(Path::new(path)).map_err(|e| {
                    std::io::Error::new(e.kind(), format!("access_log.path: cannot open {path:?} for appending: {e}"))
                })?)
            }
        };
        let (lines, queued) = sync_channel(QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&dropped);
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || write_lines(queued, BufWriter::new(out), &counted))?;
        Ok(Arc::new(AccessLog { format: log.format, lines, dropped, keys: KeyRecorder::new(log, config) }))
    }

    fn write(&self, entry: &Entry) {
        let line = match self.format {
            AccessFormat::Json => json(entry),
            AccessFormat::Combined => combined(entry),
        };
        if let Err(TrySendError::Full(_)) = self.lines.try_send(line) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Entry {
    /// Starts the line of the request `head` from `client`, come in by `scheme`; the rest
    /// is filled in as it is served.
    pub fn begin(log: &Arc<AccessLog>, head: &RequestHead<'_>, client: IpAddr, scheme: Scheme) -> Box<Entry> {
        let field = |name| head.fields.get(&name).and_then(|v| HeaderValue::from_bytes(v).ok());
        Box::new(Entry {
            log: Arc::clone(log),
            started: Instant::now(),
            time: SystemTime::now(),
            client,
            method: head.method.clone(),
            target: head.target.to_owned(),
            version: head.version,
            scheme,
            referer: field(http::header::REFERER),
            user_agent: field(http::header::USER_AGENT),
            route: None,
            outcome: "-",
            // Until an answer is made: the client went away before it (nginx's 499).
            status: 499,
            upstream: None,
            bytes: 0,
            grpc_status: None,
            keys: None,
            missing_key: Vec::new(),
            own_counts: BTreeMap::new(),
            priced_as: BTreeMap::new(),
            hold: None,
            candidate: None,
            candidate_route: None,
            queued: None,
            queue_class: None,
        })
    }

    /// Records the key parts of the limits of route `route` (an index into the
    /// configuration's routes) in `src`, if the log records keys; none when the route's
    /// allow-list `exempt`s the request.
    pub fn record_keys(&mut self, route: RouteId, exempt: bool, src: &KeySource<'_>) {
        if let Some(recorder) = &self.log.keys {
            self.keys = Some(recorder.record(route, exempt, src));
        }
    }
}

impl Drop for Entry {
    /// The response is done (sent, or abandoned by the client): its line is complete.
    fn drop(&mut self) {
        self.log.write(self);
    }
}

/// Writes lines as they come, flushing whenever the queue runs empty.
fn write_lines(queued: Receiver<String>, mut out: BufWriter<Box<dyn Write + Send>>, dropped: &AtomicU64) {
    loop {
        match queued.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => {
                let _ = out.write_all(line.as_bytes());
                continue;
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                let _ = out.flush();
                return;
            }
        }
        let lost = dropped.swap(0, Ordering::Relaxed);
        if lost > 0 {
            let _ = writeln!(out, "{{\"access_log_lines_dropped\":{lost}}}");
        }
        let _ = out.flush();
    }
}

fn header_text(value: Option<&HeaderValue>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

/// One field's value, or the values of a field sent several times in order: as the access
/// log's `keys` and `POST /explain`'s `headers` write them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Values {
    One(String),
    Many(Vec<String>),
}

impl Values {
    /// `values` as written: one alone, several as a list (`None`: there are none).
    pub fn of(mut values: Vec<String>) -> Option<Values> {
        match values.len() {
            0 => None,
            1 => values.pop().map(Values::One),
            _ => Some(Values::Many(values)),
        }
    }

    pub fn push(&mut self, value: String) {
        match self {
            Values::Many(all) => all.push(value),
            Values::One(first) => *self = Values::Many(vec![std::mem::take(first), value]),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        match self {
            Values::One(one) => std::slice::from_ref(one).iter(),
            Values::Many(all) => all.iter(),
        }
        .map(String::as_str)
    }
}

/// A request's wait in a queue, as its line tells it.
#[derive(Debug, Clone, Copy)]
pub struct QueueWait {
    /// When it came to the queue.
    pub since: Instant,
    /// How long it waited (`None`: it waits still, and its client went away: until the
    /// line is written).
    pub waited: Option<Duration>,
    /// How the wait ended (`QueueEnd::as_str`: `served`, `full`, ...).
    pub end: &'static str,
}

/// One line of the JSON access log, as `json` writes it and as `simulate` reads it back:
/// one type both ways. What a reader may find missing (lines of an older version, or
/// written by hand) is optional.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct JsonLine<'a> {
    /// When the request arrived (RFC 3339, milliseconds, UTC).
    #[serde(borrow)]
    pub time: Cow<'a, str>,
    /// The client's address, after `trusted_proxies`.
    #[serde(borrow)]
    pub client: Cow<'a, str>,
    #[serde(borrow)]
    pub method: Cow<'a, str>,
    /// The target as sent.
    #[serde(borrow)]
    pub target: Cow<'a, str>,
    #[serde(borrow, default)]
    pub protocol: Option<Cow<'a, str>>,
    /// `http`, or `https` for a request on a listener with TLS (which routes may match).
    #[serde(borrow, default)]
    pub scheme: Option<Cow<'a, str>>,
    #[serde(default)]
    pub status: Option<u16>,
    /// Body bytes sent.
    #[serde(default)]
    pub bytes: Option<u64>,
    #[serde(default)]
    pub duration_ms: Option<f64>,
    /// To the upstream's response headers (`None`: none was asked).
    #[serde(default)]
    pub upstream_ms: Option<f64>,
    #[serde(borrow, default)]
    pub route: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub outcome: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub referer: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub user_agent: Option<Cow<'a, str>>,
    /// A gRPC call's status; absent on other requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc_status: Option<u8>,
    /// The key parts recorded, by name, `null` for one the request lacked: absent when the
    /// log records none (`keys: false`), `null` when the request reached no limit's key.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub keys: Option<Option<BTreeMap<String, Option<Values>>>>,
    /// The limits whose key the request lacked (skipped, counted under the shared key, or
    /// refusing it, as their `on_missing_key` says); absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing_key: Vec<String>,
    /// The limits that decided it with its key's own count (`limit_from`: a trusted
    /// proxy's field, a claim, the operator's), and that count (micro-units of a money
    /// budget's); absent when none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub own_counts: BTreeMap<String, u64>,
    /// The money budgets that charge its response, and the row of their prices it is
    /// charged at (`{"monthly": "gpt-4o"}`, `*`: any other value's); absent when none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub priced_as: BTreeMap<String, String>,
    /// How long the upstream's refusal of it holds its key (`upstream_hold`), ms;
    /// absent when it began no hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_ms: Option<f64>,
    /// What a live candidate makes of it beside the enforced decision (`refused`: it
    /// would refuse what is admitted; `admitted`: the other way; `same`); absent when no
    /// candidate is live.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub candidate: Option<Cow<'a, str>>,
    /// The candidate's route, when it would route the request elsewhere (`-`: to none).
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub candidate_route: Option<Cow<'a, str>>,
    /// How long it waited in a concurrency limit's queue, ms; absent when it did not
    /// come to one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_ms: Option<f64>,
    /// How its wait in the queue ended: `served` (a slot), `full`, `timed_out`,
    /// `pushed_out` (a shorter flow took its place) or `left` (the client went away).
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<Cow<'a, str>>,
    /// The class it waited in, when the queue has classes.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub queue_class: Option<Cow<'a, str>>,
}

/// A field that is there, even as `null`.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

fn json(e: &Entry) -> String {
    let text = |v: &HeaderValue| String::from_utf8_lossy(v.as_bytes()).into_owned().into();
    let line = JsonLine {
        time: humantime::format_rfc3339_millis(e.time).to_string().into(),
        client: e.client.to_canonical().to_string().into(),
        method: e.method.as_str().into(),
        target: e.target.as_str().into(),
        protocol: Some(format!("{:?}", e.version).into()),
        scheme: Some(e.scheme.as_str().into()),
        status: Some(e.status),
        bytes: Some(e.bytes),
        duration_ms: Some(round_ms(e.started.elapsed())),
        upstream_ms: e.upstream.map(round_ms),
        route: e.route.as_deref().map(Cow::Borrowed),
        outcome: Some(e.outcome.into()),
        referer: e.referer.as_ref().map(text),
        user_agent: e.user_agent.as_ref().map(text),
        grpc_status: e.grpc_status,
        keys: e.log.keys.as_ref().map(|recorder| e.keys.as_ref().map(|keys| recorder.keys(keys))),
        missing_key: e.missing_key.clone(),
        own_counts: e.own_counts.clone(),
        priced_as: e.priced_as.clone(),
        hold_ms: e.hold.map(round_ms),
        candidate: e.candidate.map(Cow::Borrowed),
        candidate_route: e.candidate_route.as_deref().map(Cow::Borrowed),
        queued_ms: e.queued.map(|q| round_ms(q.waited.unwrap_or_else(|| q.since.elapsed()))),
        queue: e.queued.map(|q| Cow::Borrowed(q.end)),
        queue_class: e.queue_class.as_deref().map(Cow::Borrowed),
    };
    // A line of strings, numbers and maps of strings always serializes.
    let mut out = serde_json::to_string(&line).unwrap_or_default();
    out.push('\n');
    out
}

fn round_ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1_000_000.0).round() / 1000.0
}

/// nginx's `combined`: `$remote_addr - $remote_user [$time_local] "$request" $status
/// $body_bytes_sent "$http_referer" "$http_user_agent"`, in UTC.
fn combined(e: &Entry) -> String {
    format!(
        "{} - - [{}] \"{} {} {:?}\" {} {} \"{}\" \"{}\"\n",
        e.client.to_canonical(),
        time_local(e.time),
        e.method,
        e.target.escape_default(),
        e.version,
        e.status,
        e.bytes,
        header_text(e.referer.as_ref()).escape_default(),
        header_text(e.user_agent.as_ref()).escape_default(),
    )
}

/// `22/Nov/2026:23:41:45 +0000`, from the RFC 3339 form `2026-11-22T23:41:45Z`.
fn time_local(time: SystemTime) -> String {
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let rfc = humantime::format_rfc3339_seconds(time).to_string();
    let month = rfc.get(5..7).and_then(|m| m.parse::<usize>().ok()).and_then(|m| MONTHS.get(m.wrapping_sub(1)));
    match (rfc.get(0..4), month, rfc.get(8..10), rfc.get(11..19)) {
        (Some(year), Some(month), Some(day), Some(clock)) => format!("{day}/{month}/{year}:{clock} +0000"),
        _ => rfc,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A route `/a` whose limits are keyed on a tenant header, a bearer token with a
    /// cookie, and the host; a route `/b` without limits.
    fn keyed(settings: &str) -> Config {
        let yaml = format!(
            "listen: 127.0.0.1:0\n{settings}\nlimits:\n  t: {{ key: \"header:x-tenant\", on_missing_key: skip, rate: 1r/s }}\n  \
             b: {{ key: [ip, bearer, \"cookie:sid\"], rate: 1r/s }}\n  h: {{ key: [host, \"header:x-tenant\"], on_missing_key: skip, rate: 1r/s }}\n\
             routes:\n  - {{ match: {{ path_prefix: /a }}, limits: [t, b, h], respond: {{ status: 200 }} }}\n  \
             - {{ match: {{ path_prefix: /b }}, respond: {{ status: 200 }} }}\n"
        );
        crate::config::parse(&yaml, "t").unwrap_or_else(|e| panic!("{e}"))
    }

    /// The `keys` object a line of route `route` of `config` writes for `headers`.
    fn recorded(config: &Config, route: usize, headers: &[(&str, &[u8])]) -> serde_json::Value {
        let mut map = http::HeaderMap::new();
        for (name, value) in headers {
            map.append(http::HeaderName::from_bytes(name.as_bytes()).unwrap(), HeaderValue::from_bytes(value).unwrap());
        }
        let src = KeySource::get("10.0.0.1".parse().unwrap(), "/a", &map);
        let log = config.access_log.as_ref().unwrap();
        let recorder = KeyRecorder::new(log, config).unwrap();
        serde_json::to_value(recorder.keys(&recorder.record(RouteId::from(route), false, &src))).unwrap()
    }

    const REQUEST: [(&str, &[u8]); 4] = [
        ("x-tenant", b"acme"),
        ("authorization", b"Bearer tok-123"),
        ("cookie", b"a=1; sid=s-456"),
        ("host", b"Example.com"),
    ];

    #[test]
    fn a_line_records_the_key_parts_of_its_routes_limits_with_credentials_as_keyed_digests() {
        let config = keyed("access_log: { keys: true, keys_secret: 0123456789abcdef }");
        let keys = recorded(&config, 0, &REQUEST);
        let names: Vec<&String> = keys.as_object().unwrap().keys().collect();
        assert_eq!(names, ["bearer", "cookie:sid", "header:x-tenant", "host"], "each part once, ip not at all");
        assert_eq!((keys["header:x-tenant"].as_str(), keys["host"].as_str()), (Some("acme"), Some("example.com")));
        let text = keys.to_string();
        assert!(!text.contains("tok-123") && !text.contains("s-456"), "{text}");
        let bearer = keys["bearer"].as_str().unwrap();
        assert!(bearer.len() == 33 && bearer.starts_with('#'), "{bearer}");
        assert_ne!(keys["bearer"], keys["cookie:sid"]);
        // The same value has the same digest in another process with the same secret
        // (another instance, a restart), and another under another secret.
        let again = keyed("access_log: { keys: true, keys_secret: 0123456789abcdef }");
        assert_eq!(recorded(&again, 0, &REQUEST), keys);
        let other = keyed("access_log: { keys: true, keys_secret: fedcba9876543210 }");
        assert_ne!(recorded(&other, 0, &REQUEST)["bearer"], keys["bearer"]);
        // A part the request lacks is null; a route without limits records nothing.
        let lacking = recorded(&config, 0, &[("x-tenant", b"acme")]);
        assert!(lacking["bearer"].is_null() && lacking["cookie:sid"].is_null() && lacking["host"].is_null());
        assert_eq!(recorded(&config, 1, &REQUEST), serde_json::json!({}));
        // A part sent more than once is every value, in order, each written as one is.
        let twice = recorded(&config, 0, &[("x-tenant", b"a"), ("x-tenant", b"b"), ("cookie", b"sid=1; sid=2")]);
        assert_eq!(twice["header:x-tenant"], serde_json::json!(["a", "b"]));
        let sids = twice["cookie:sid"].as_array().unwrap();
        assert!(sids.len() == 2 && sids[0] != sids[1] && sids[0].as_str().unwrap().starts_with('#'), "{twice}");
        let exempt = KeyRecorder::new(config.access_log.as_ref().unwrap(), &config).unwrap();
        let src = KeySource::get("10.0.0.1".parse().unwrap(), "/a", &HEADERS);
        assert!(exempt.keys(&exempt.record(RouteId::from(0), true, &src)).is_empty());
    }

    static HEADERS: std::sync::LazyLock<http::HeaderMap> = std::sync::LazyLock::new(http::HeaderMap::new);

    #[test]
    fn log_keys_says_which_recorded_parts_are_digests() {
        let hashed = keyed("log_keys: hashed\naccess_log: { keys: true, keys_secret: 0123456789abcdef }");
        let keys = recorded(&hashed, 0, &REQUEST);
        assert!(keys["header:x-tenant"].as_str().unwrap().starts_with('#'));
        assert_eq!(keys["host"], "example.com", "the host is no credential, and a replay routes by it");
        let clear = keyed("log_keys: clear\naccess_log: { keys: true }");
        let keys = recorded(&clear, 0, &REQUEST);
        assert_eq!((keys["bearer"].as_str(), keys["cookie:sid"].as_str()), (Some("tok-123"), Some("s-456")));
        // Any bytes are written exactly, in printable ASCII.
        let keys = recorded(&clear, 0, &[("x-tenant", b"caf\xc3\xa9 \\x41\xff")]);
        assert_eq!(keys["header:x-tenant"], r"caf\xC3\xA9 \x5Cx41\xFF");
    }

    /// The line the log writes reads back as `simulate` reads it, and written again from
    /// what was read, it is the same line.
    #[test]
    fn a_json_line_reads_back_as_it_was_written() {
        let config = keyed("access_log: { keys: true, keys_secret: 0123456789abcdef }");
        let (lines, queued) = sync_channel(4);
        let keys = KeyRecorder::new(config.access_log.as_ref().unwrap(), &config);
        let log = Arc::new(AccessLog { format: AccessFormat::Json, lines, dropped: Arc::default(), keys });
        let headers: http::HeaderMap =
            [(http::header::HeaderName::from_static("x-tenant"), HeaderValue::from_static("acme"))]
                .into_iter()
                .collect();
        let src = KeySource::get("10.0.0.1".parse().unwrap(), "/a", &headers);
        let recorded = log.keys.as_ref().unwrap().record(RouteId::from(0), false, &src);
        let entry = Entry {
            log: Arc::clone(&log),
            started: Instant::now(),
            time: SystemTime::UNIX_EPOCH + Duration::from_millis(1_764_000_000_123),
            client: "::ffff:10.0.0.1".parse().unwrap(),
            method: Method::POST,
            target: "/a?q=\"x\"&é".to_owned(),
            version: Version::HTTP_2,
            scheme: Scheme::Https,
            referer: Some(HeaderValue::from_static("https://r.example/")),
            user_agent: None,
            route: Some("api".to_owned()),
            outcome: "passed",
            status: 200,
            upstream: Some(Duration::from_micros(2_500)),
            bytes: 12,
            grpc_status: Some(16),
            keys: Some(recorded),
            missing_key: vec!["per_tenant".to_owned(), "per_token".to_owned()],
            own_counts: BTreeMap::from([("per_org".to_owned(), 500)]),
            priced_as: BTreeMap::from([("monthly".to_owned(), "gpt-4o".to_owned())]),
            hold: Some(Duration::from_secs(30)),
            candidate: Some("refused"),
            candidate_route: Some("api_v2".to_owned()),
            queued: Some(QueueWait {
                since: Instant::now(),
                waited: Some(Duration::from_micros(12_345)),
                end: "served",
            }),
            queue_class: Some("gold".to_owned()),
        };
        drop(entry);
        let line = queued.recv().unwrap();
        let read: JsonLine<'_> = serde_json::from_str(&line).unwrap();
        let recorder = log.keys.as_ref().unwrap();
        let keys = recorder.keys(&recorder.record(RouteId::from(0), false, &src));
        assert_eq!(keys.get("header:x-tenant"), Some(&Some(Values::One("acme".to_owned()))), "{keys:?}");
        let expected = JsonLine {
            time: "2025-11-24T16:00:00.123Z".into(),
            client: "10.0.0.1".into(),
            method: "POST".into(),
            target: "/a?q=\"x\"&é".into(),
            protocol: Some("HTTP/2.0".into()),
            scheme: Some("https".into()),
            status: Some(200),
            bytes: Some(12),
            duration_ms: read.duration_ms,
            upstream_ms: Some(2.5),
            route: Some("api".into()),
            outcome: Some("passed".into()),
            referer: Some("https://r.example/".into()),
            user_agent: None,
            grpc_status: Some(16),
            keys: Some(Some(keys)),
            missing_key: vec!["per_tenant".into(), "per_token".into()],
            own_counts: BTreeMap::from([("per_org".to_owned(), 500)]),
            priced_as: BTreeMap::from([("monthly".to_owned(), "gpt-4o".to_owned())]),
            hold_ms: Some(30_000.0),
            candidate: Some("refused".into()),
            candidate_route: Some("api_v2".into()),
            queued_ms: Some(12.345),
            queue: Some("served".into()),
            queue_class: Some("gold".into()),
        };
        assert_eq!(read, expected, "{line}");
        assert_eq!(format!("{}\n", serde_json::to_string(&read).unwrap()), line);
    }

    #[test]
    fn time_local_is_nginx_s() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_391_305);
        assert_eq!(time_local(t), "22/Nov/2026:23:48:25 +0000");
    }
}
