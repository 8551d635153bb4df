//! The load `simulate --synthetic` and `verify` model, as the command line spells it:
//! `connections=64 rate=max duration=10s keys=ip:8 path=/api/x`, fields separated by
//! spaces, each `NAME=VALUE` once (but `header=`, which repeats). A field that is
//! unknown, repeated or cannot be read is an error naming it.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::time::Duration;

use http::{HeaderName, HeaderValue, Method};
use serde::Serialize;

use crate::config::units::parse_rate;
use crate::suggest;

/// The most requests one model run may decide: a spec past it is surely a typo (a
/// turnaround of 1ns), and a run is about 1 µs a request.
pub const MAX_REQUESTS: u64 = 50_000_000;

/// The fields of a spec, in the order `--help` lists them.
const FIELDS: [&str; 10] =
    ["connections", "rate", "duration", "keys", "path", "method", "host", "header", "latency", "turnaround"];

/// How fast requests are sent.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Offered {
    /// Closed loop: each connection sends its next request when its answer arrives.
    Max,
    /// Open loop: this many requests a second in all, on schedule whatever the answers.
    PerSecond(f64),
}

/// Which key each connection's requests carry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Keys {
    /// `ip:N`: N client addresses, 127.0.0.1 upwards; connection i is address i mod N.
    Ip(NonZeroU32),
    /// `header:NAME:N`: N values of the header (`key-0` …); connection i sends value i mod N.
    Header(#[serde(serialize_with = "header_name")] HeaderName, NonZeroU32),
}

fn header_name<S: serde::Serializer>(name: &HeaderName, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(name.as_str())
}

impl Keys {
    /// How many keys there are.
    pub fn count(&self) -> u32 {
        match self {
            Keys::Ip(n) | Keys::Header(_, n) => n.get(),
        }
    }

    /// The client address of connection `connection`.
    pub fn address(&self, connection: u32) -> IpAddr {
        let n = match self {
            Keys::Ip(n) => connection % n.get(),
            Keys::Header(..) => 0,
        };
        IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::LOCALHOST) + n))
    }

    /// The header field connection `connection` adds, if the keys are a header's values.
    pub fn field(&self, connection: u32) -> Option<(HeaderName, HeaderValue)> {
        match self {
            Keys::Ip(_) => None,
            Keys::Header(name, n) => {
                let value = format!("key-{}", connection % n.get());
                Some((name.clone(), HeaderValue::from_str(&value).expect("key-N is a valid header value")))
            }
        }
    }
}

impl fmt::Display for Keys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Keys::Ip(n) if n.get() == 1 => write!(f, "ip:1 (every connection from 127.0.0.1)"),
            Keys::Ip(n) => write!(
                f,
                "ip:{n} (client addresses 127.0.0.1 to {}; connection i is address i mod {n})",
                self.address(n.get() - 1)
            ),
            Keys::Header(name, n) => {
                write!(
                    f,
                    "header:{name}:{n} ({name}: key-0 to key-{}; connection i sends key-(i mod {n}))",
                    n.get() - 1
                )
            }
        }
    }
}

/// A synthetic load: who sends what, how fast, for how long.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Spec {
    pub connections: NonZeroU32,
    pub rate: Offered,
    pub duration: Duration,
    pub keys: Keys,
    pub path: String,
    #[serde(serialize_with = "method")]
    pub method: Method,
    pub host: Option<String>,
    #[serde(skip)]
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The backend's service time: what an admitted request waits for its answer, beyond
    /// its delay.
    pub latency: Duration,
    /// The time one exchange takes on the machine, apart from the backend: a refusal's
    /// whole round trip. Closed loop only.
    pub turnaround: Duration,
}

fn method<S: serde::Serializer>(m: &Method, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(m.as_str())
}

/// A spec that cannot be read: the field, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--synthetic: {field}: {why}")]
pub struct SpecError {
    pub field: String,
    pub why: String,
}

fn bad<T>(field: &str, why: impl Into<String>) -> Result<T, SpecError> {
    Err(SpecError { field: field.to_owned(), why: why.into() })
}

impl Spec {
    /// The spec of `text`; every field not given takes its default.
    pub fn parse(text: &str) -> Result<Spec, SpecError> {
        let mut spec = Spec {
            connections: NonZeroU32::new(64).expect("64 is not zero"),
            rate: Offered::Max,
            duration: Duration::from_secs(10),
            keys: Keys::Ip(NonZeroU32::MIN),
            path: "/".to_owned(),
            method: Method::GET,
            host: None,
            headers: Vec::new(),
            latency: Duration::from_millis(1),
            turnaround: Duration::from_micros(100),
        };
        let mut seen: Vec<&str> = Vec::new();
        for item in text.split_whitespace() {
            let Some((name, value)) = item.split_once('=') else {
                return bad(item, "give NAME=VALUE");
            };
            let Some(&field) = FIELDS.iter().find(|&&f| f == name) else {
                let hint = match suggest::closest(name, FIELDS) {
                    Some(close) => format!("; did you mean `{close}`?"),
                    None => format!("; the fields are {}", suggest::one_of(&FIELDS)),
                };
                return bad(name, format!("unknown field{hint}"));
            };
            if field != "header" && seen.contains(&field) {
                return bad(field, "given twice");
            }
            seen.push(field);
            match field {
                "connections" => {
                    spec.connections = match value.parse::<NonZeroU32>() {
                        Ok(n) => n,
                        Err(_) => return bad(field, format!("must be a whole number ≥ 1, not {value:?}")),
                    }
                }
                "rate" => spec.rate = offered(value)?,
                "duration" => {
                    spec.duration = span(field, value)?;
                    if spec.duration.is_zero() {
                        return bad(field, "must be longer than 0");
                    }
                }
                "keys" => spec.keys = keys(value)?,
                "path" => {
                    if !value.starts_with('/') || value.parse::<http::uri::PathAndQuery>().is_err() {
                        return bad(field, format!("must be a request target starting with /, not {value:?}"));
                    }
                    spec.path = value.to_owned();
                }
                "method" => {
                    spec.method = match Method::from_bytes(value.as_bytes()) {
                        Ok(m) => m,
                        Err(_) => return bad(field, format!("invalid method {value:?}")),
                    }
                }
                "host" => {
                    if HeaderValue::from_str(value).is_err() || value.is_empty() {
                        return bad(field, format!("invalid host {value:?}"));
                    }
                    spec.host = Some(value.to_owned());
                }
                "header" => spec.headers.push(header(value)?),
                "latency" => spec.latency = span(field, value)?,
                _ => {
                    spec.turnaround = span(field, value)?;
                    if spec.turnaround.is_zero() {
                        return bad(field, "must be longer than 0: a closed loop of instant refusals never ends");
                    }
                }
            }
        }
        let requests = spec.most_requests();
        if requests > MAX_REQUESTS {
            let field = if spec.rate == Offered::Max { "turnaround" } else { "rate" };
            return bad(
                field,
                format!(
                    "the load would send up to {requests} requests, more than the {MAX_REQUESTS} a model run decides"
                ),
            );
        }
        Ok(spec)
    }

    /// The most requests the load can send: every exchange a refusal, in a closed loop.
    pub fn most_requests(&self) -> u64 {
        let secs = self.duration.as_secs_f64();
        let most = match self.rate {
            Offered::PerSecond(rate) => rate * secs,
            Offered::Max => f64::from(self.connections.get()) * secs / self.turnaround.as_secs_f64(),
        };
        most.ceil() as u64
    }
}

impl fmt::Display for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rate = match self.rate {
            Offered::Max => "max".to_owned(),
            Offered::PerSecond(r) => format!("{r}"),
        };
        let keys = match &self.keys {
            Keys::Ip(n) => format!("ip:{n}"),
            Keys::Header(name, n) => format!("header:{name}:{n}"),
        };
        write!(
            f,
            "connections={} rate={rate} duration={} keys={keys} path={} method={}",
            self.connections,
            humantime::format_duration(self.duration),
            self.path,
            self.method
        )?;
        if let Some(host) = &self.host {
            write!(f, " host={host}")?;
        }
        for (name, value) in &self.headers {
            write!(f, " header={name}:{}", String::from_utf8_lossy(value.as_bytes()))?;
        }
        write!(
            f,
            " latency={} turnaround={}",
            humantime::format_duration(self.latency),
            humantime::format_duration(self.turnaround)
        )
    }
}

/// A duration as humantime reads it (`10s`, `1ms`, `250us`).
fn span(field: &str, value: &str) -> Result<Duration, SpecError> {
    humantime::parse_duration(value)
        .or_else(|e| bad(field, format!("invalid duration {value:?}: {e}; write e.g. 10s, 1ms, 250us")))
}

/// `max`, a number of requests a second, or a rate as the file writes one (`600r/m`).
fn offered(value: &str) -> Result<Offered, SpecError> {
    if value == "max" {
        return Ok(Offered::Max);
    }
    let per_second = match value.parse::<f64>() {
        Ok(n) => n,
        Err(_) => match parse_rate(value) {
            Ok(rate) => rate.count as f64 / rate.per.as_secs_f64(),
            Err(_) => {
                return bad("rate", format!("give max, requests a second (500), or a rate (500r/s), not {value:?}"));
            }
        },
    };
    if !(per_second.is_finite() && per_second > 0.0) {
        return bad("rate", format!("must be more than 0 requests a second, not {value:?}"));
    }
    Ok(Offered::PerSecond(per_second))
}

/// `ip:N` or `header:NAME:N`.
fn keys(value: &str) -> Result<Keys, SpecError> {
    let count = |n: &str| match n.parse::<NonZeroU32>() {
        Ok(n) => Ok(n),
        Err(_) => bad("keys", format!("the number of keys must be a whole number ≥ 1, not {n:?}")),
    };
    match value.split(':').collect::<Vec<_>>()[..] {
        ["ip", n] => {
            let n = count(n)?;
            // Addresses past 127.255.255.254 leave the loopback block a test client can bind.
            if n.get() >= 1 << 24 {
                return bad("keys", "ip: at most 16777214 addresses (127.0.0.1 to 127.255.255.254)");
            }
            Ok(Keys::Ip(n))
        }
        ["header", name, n] => match HeaderName::from_bytes(name.as_bytes()) {
            Ok(name) => Ok(Keys::Header(name, count(n)?)),
            Err(_) => bad("keys", format!("invalid header name {name:?}")),
        },
        _ => bad("keys", format!("give ip:N or header:NAME:N, not {value:?}")),
    }
}

/// `name:value`.
fn header(value: &str) -> Result<(HeaderName, HeaderValue), SpecError> {
    let Some((name, text)) = value.split_once(':') else {
        return bad("header", format!("give name:value, not {value:?}"));
    };
    match (HeaderName::from_bytes(name.trim().as_bytes()), HeaderValue::from_str(text.trim())) {
        (Ok(name), Ok(v)) => Ok((name, v)),
        _ => bad("header", format!("invalid field {value:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_issues_example_reads_with_every_other_field_at_its_default() {
        let spec = Spec::parse("connections=64 rate=max duration=10s keys=ip:8 path=/api/x").unwrap();
        assert_eq!(spec.connections.get(), 64);
        assert_eq!(spec.rate, Offered::Max);
        assert_eq!(spec.duration, Duration::from_secs(10));
        assert_eq!(spec.keys, Keys::Ip(NonZeroU32::new(8).unwrap()));
        assert_eq!(spec.path, "/api/x");
        assert_eq!((spec.method, spec.host), (Method::GET, None));
        assert_eq!((spec.latency, spec.turnaround), (Duration::from_millis(1), Duration::from_micros(100)));
    }

    #[test]
    fn every_field_reads_and_headers_repeat() {
        let spec = Spec::parse(
            "rate=600r/m method=POST host=api.example header=x-a:1 header=x-b:2 keys=header:x-api-key:100 \
             latency=250us turnaround=2ms connections=3 duration=1500ms",
        )
        .unwrap();
        assert_eq!(spec.rate, Offered::PerSecond(10.0));
        assert_eq!(spec.method, Method::POST);
        assert_eq!(spec.host.as_deref(), Some("api.example"));
        assert_eq!(spec.headers.len(), 2);
        assert_eq!(spec.keys.count(), 100);
        assert_eq!(spec.keys.field(101).unwrap().1, "key-1");
        assert_eq!(spec.duration, Duration::from_millis(1500));
        assert_eq!(Spec::parse("rate=250").unwrap().rate, Offered::PerSecond(250.0));
    }

    #[test]
    fn connection_i_takes_address_i_mod_n_from_127_0_0_1() {
        let keys = Keys::Ip(NonZeroU32::new(8).unwrap());
        assert_eq!(keys.address(0), "127.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(keys.address(9), "127.0.0.2".parse::<IpAddr>().unwrap());
        assert_eq!(keys.address(7), "127.0.0.8".parse::<IpAddr>().unwrap());
        assert!(keys.field(3).is_none());
    }

    #[test]
    fn a_bad_spec_is_an_error_naming_its_field() {
        let field = |text: &str| Spec::parse(text).unwrap_err();
        let e = field("conections=4");
        assert_eq!(e.field, "conections");
        assert!(e.why.contains("did you mean `connections`"), "{e}");
        assert_eq!(field("connections=0").field, "connections");
        assert_eq!(field("connections=many").field, "connections");
        assert_eq!(field("rate=fast").field, "rate");
        assert_eq!(field("rate=0").field, "rate");
        assert_eq!(field("duration=10").field, "duration");
        assert_eq!(field("duration=0s").field, "duration");
        assert_eq!(field("keys=ip").field, "keys");
        assert_eq!(field("keys=ip:0").field, "keys");
        assert_eq!(field("keys=cookie:a:3").field, "keys");
        assert_eq!(field("keys=header:bad name:3").field, "keys");
        assert_eq!(field("path=api").field, "path");
        assert_eq!(field("method=G(T").field, "method");
        assert_eq!(field("header=novalue").field, "header");
        assert_eq!(field("latency=soon").field, "latency");
        assert_eq!(field("turnaround=0s").field, "turnaround");
        assert_eq!(field("rate=max rate=10").field, "rate");
        assert_eq!(field("connections").field, "connections");
        let e = field("connections=64 turnaround=1ns duration=1h");
        assert_eq!(e.field, "turnaround", "{e}");
        assert!(e.to_string().starts_with("--synthetic: turnaround: the load would send up to"), "{e}");
    }

    #[test]
    fn a_spec_prints_as_it_is_written_with_its_defaults() {
        let spec = Spec::parse("keys=header:x-k:2 header=x-a:1").unwrap();
        assert_eq!(
            spec.to_string(),
            "connections=64 rate=max duration=10s keys=header:x-k:2 path=/ method=GET header=x-a:1 latency=1ms \
             turnaround=100us"
        );
        assert_eq!(Spec::parse(&spec.to_string()).unwrap(), spec);
    }
}
