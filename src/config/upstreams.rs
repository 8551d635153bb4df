//! The `upstreams:` section: servers with their weights, how one is chosen, and when a
//! failing one is taken out.

use std::str::FromStr;
use std::time::Duration;

use http::uri::Authority;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

use http::uri::PathAndQuery;

use super::checks::{Errors, check_name, key_parts, positive_duration, status_in};
use super::raw::{BalanceName, RawHealthCheck, RawUpstream, RawUpstreamServer, RawUpstreamTls};
use super::{Balance, HealthCheck, Server, Upstream, UpstreamTls};
use crate::policy::key::KeySpec;

const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);
/// nginx's defaults: one failure takes a server out for ten seconds.
const DEFAULT_MAX_FAILS: u32 = 1;
const DEFAULT_FAIL_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_RETRIES: u32 = 1;
const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(5);
const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(1);
/// Weights past this say nothing a smaller ratio could not, and keep sums far from overflow.
const MAX_WEIGHT: u32 = 10_000;

/// Host names are looked up again this often: DNS changes (a replaced instance, a scaled
/// service) reach the proxy within half a minute, for one lookup per name per interval.
const DEFAULT_RESOLVE_INTERVAL: Duration = Duration::from_secs(30);

/// How long a request waits for a server under its `max_conns` to have room.
const DEFAULT_QUEUE_TIMEOUT: Duration = Duration::from_secs(5);

/// An upgraded connection (WebSocket) idle this long is closed.
const DEFAULT_TUNNEL_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);

pub(super) fn upstream(e: &mut Errors<'_>, name: &str, raw: &RawUpstream) -> Upstream {
    let at = format!("upstreams.{name}");
    check_name(e, &at, name);
    if raw.servers.is_empty() {
        e.add(format!("{at}.servers"), "needs at least one server (HOST:PORT)");
    }
    let health = Health {
        max_fails: raw.max_fails.unwrap_or(DEFAULT_MAX_FAILS),
        fail_timeout: fail_timeout(e, &format!("{at}.fail_timeout"), raw.fail_timeout.as_ref(), DEFAULT_FAIL_TIMEOUT),
    };
    let servers: Vec<Server> = raw
        .servers
        .iter()
        .enumerate()
        .filter_map(|(i, s)| server(e, &format!("{at}.servers[{i}]"), s, health))
        .collect();
    let balance = match (raw.balance.unwrap_or(BalanceName::RoundRobin), &raw.hash_key) {
        (BalanceName::Hash, Some(key)) => Balance::Hash(KeySpec(key_parts(e, &format!("{at}.hash_key"), key).into())),
        (BalanceName::Hash, None) => {
            e.add(
                format!("{at}.balance"),
                "`hash` needs `hash_key`, e.g. hash_key: ip or hash_key: \"cookie:session\"",
            );
            Balance::RoundRobin
        }
        (_, Some(_)) => {
            e.add(format!("{at}.hash_key"), "only used with `balance: hash`");
            Balance::RoundRobin
        }
        (BalanceName::RoundRobin, None) => Balance::RoundRobin,
        (BalanceName::LeastConn, None) => Balance::LeastConn,
        (BalanceName::RandomTwo, None) => Balance::RandomTwo,
    };
    if raw.tls.is_some() && !servers.iter().any(|s| s.tls) {
        e.add(format!("{at}.tls"), "applies only to https:// servers");
    }
    Upstream {
        name: name.to_owned(),
        tls: tls(e, &format!("{at}.tls"), raw.tls.as_ref()),
        servers,
        balance,
        connect_timeout: e.duration(
            &format!("{at}.connect_timeout"),
            raw.connect_timeout.as_ref(),
            DEFAULT_CONNECT_TIMEOUT,
        ),
        timeout: e.duration(&format!("{at}.timeout"), raw.timeout.as_ref(), DEFAULT_UPSTREAM_TIMEOUT),
        retries: raw.retries.unwrap_or(DEFAULT_RETRIES),
        http2: raw.http2.unwrap_or(false),
        health_check: raw.health_check.as_ref().map(|h| {
            if h.grpc_service.is_some() && !raw.http2.unwrap_or(false) {
                e.add(format!("{at}.health_check.grpc_service"), "needs http2: true (gRPC is HTTP/2)");
            }
            health_check(e, &format!("{at}.health_check"), h)
        }),
        tunnel_idle_timeout: super::checks::connection_timeout(
            e,
            &format!("{at}.tunnel_idle_timeout"),
            raw.tunnel_idle_timeout.as_ref(),
            DEFAULT_TUNNEL_IDLE_TIMEOUT,
        ),
        resolve_interval: resolve_interval(e, &format!("{at}.resolve_interval"), raw.resolve_interval.as_ref()),
        // Unset: as many idle connections as the load needs (`upstream::pool`); a number
        // caps them, as nginx's `keepalive` does.
        keepalive: raw.keepalive.map(|n| n as usize),
        max_conns: match raw.max_conns {
            Some(0) => {
                e.add(format!("{at}.max_conns"), "must be at least 1 (leave it out for no cap)");
                None
            }
            n => n.and_then(|n| std::num::NonZeroUsize::new(n as usize)),
        },
        queue_timeout: queue_timeout(e, &at, raw),
    }
}

/// `queue_timeout`: how long a request waits for room under `max_conns`, which it needs.
fn queue_timeout(e: &mut Errors<'_>, at: &str, raw: &RawUpstream) -> Duration {
    if raw.queue_timeout.is_some() && raw.max_conns.is_none() {
        e.add(format!("{at}.queue_timeout"), "only used with `max_conns`");
    }
    e.duration(&format!("{at}.queue_timeout"), raw.queue_timeout.as_ref(), DEFAULT_QUEUE_TIMEOUT)
}

/// `resolve_interval`: a positive duration, or `off` (look names up only at load).
fn resolve_interval(e: &mut Errors<'_>, at: &str, text: Option<&String>) -> Option<Duration> {
    match text.map(String::as_str) {
        None => Some(DEFAULT_RESOLVE_INTERVAL),
        Some("off") => None,
        Some(text) => {
            let interval = positive_duration(text).map_err(|why| format!("{why}, or `off`"));
            e.check(|| at.to_owned(), interval).or(Some(DEFAULT_RESOLVE_INTERVAL))
        }
    }
}

/// Passive health: failures within `fail_timeout` that take a server out for `fail_timeout`.
#[derive(Clone, Copy)]
struct Health {
    max_fails: u32,
    fail_timeout: Duration,
}

/// A `fail_timeout`: a duration longer than zero.
fn fail_timeout(e: &mut Errors<'_>, at: &str, text: Option<&String>, default: Duration) -> Duration {
    let fail_timeout = e.duration(at, text, default);
    if fail_timeout.is_zero() {
        e.add(at.to_owned(), "must be longer than zero (turn passive health off with max_fails: 0)");
    }
    fail_timeout
}

/// A server of an upstream whose own passive health is `upstream`'s.
fn server(e: &mut Errors<'_>, at: &str, raw: &RawUpstreamServer, upstream: Health) -> Option<Server> {
    let (text, weight, address_at, health) = match raw {
        RawUpstreamServer::Address(text) => (text, None, at.to_owned(), upstream),
        RawUpstreamServer::Weighted(w) => {
            let health = Health {
                max_fails: w.max_fails.unwrap_or(upstream.max_fails),
                fail_timeout: fail_timeout(
                    e,
                    &format!("{at}.fail_timeout"),
                    w.fail_timeout.as_ref(),
                    upstream.fail_timeout,
                ),
            };
            (&w.address, w.weight, format!("{at}.address"), health)
        }
    };
    let (tls, authority) = match (text.strip_prefix("https://"), text.strip_prefix("http://")) {
        (Some(rest), _) => (true, rest),
        (None, Some(rest)) => (false, rest),
        (None, None) => (false, text.as_str()),
    };
    let address = e.check(
        || address_at,
        Authority::from_str(authority).ok().filter(|a| a.port_u16().is_some() && !authority.contains('@')).ok_or_else(
            || {
                format!(
                    "invalid server {text:?}; write HOST:PORT (plain HTTP) or https://HOST:PORT, e.g. 127.0.0.1:3000"
                )
            },
        ),
    );
    let weight = match weight {
        None => Some(1),
        Some(w @ 1..=MAX_WEIGHT) => Some(w),
        Some(w) => {
            e.add(format!("{at}.weight"), format!("must be from 1 to {MAX_WEIGHT}, not {w}"));
            None
        }
    };
    let Health { max_fails, fail_timeout } = health;
    Some(Server { address: address?, tls, weight: weight?, max_fails, fail_timeout })
}

fn tls(e: &mut Errors<'_>, at: &str, raw: Option<&RawUpstreamTls>) -> UpstreamTls {
    let Some(raw) = raw else { return UpstreamTls { roots: None, sni: None, verify: true } };
    let roots = raw.ca_file.as_ref().and_then(|file| {
        let read = super::files::read_regular(file);
        let pem = e.check(|| format!("{at}.ca_file"), read)?;
        let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(&pem).collect();
        let certs = certs
            .map_err(|err| format!("{file:?} is not PEM certificates: {err}"))
            .and_then(|c| if c.is_empty() { Err(format!("{file:?} holds no PEM certificate")) } else { Ok(c) });
        e.check(|| format!("{at}.ca_file"), certs)
    });
    let sni = raw.sni.as_ref().and_then(|name| {
        let parsed = ServerName::try_from(name.clone()).map_err(|_| format!("invalid server name {name:?}"));
        e.check(|| format!("{at}.sni"), parsed)
    });
    let verify = raw.verify.unwrap_or(true);
    if !verify && roots.is_some() {
        e.add(format!("{at}.verify"), "`verify: false` accepts any certificate: `ca_file` would not be used");
    }
    UpstreamTls { roots, sni, verify }
}

fn health_check(e: &mut Errors<'_>, at: &str, raw: &RawHealthCheck) -> HealthCheck {
    if raw.grpc_service.is_some() && (!raw.path.is_empty() || !raw.expect_status.is_empty()) {
        let field = if raw.path.is_empty() { "expect_status" } else { "path" };
        e.add(format!("{at}.{field}"), "does not go with grpc_service (a gRPC check asks grpc.health.v1.Health/Check)");
    }
    let path = match raw.grpc_service {
        // A gRPC check has its one path.
        Some(_) => Some(PathAndQuery::from_static("/grpc.health.v1.Health/Check")),
        None => {
            let path = PathAndQuery::from_str(&raw.path).ok().filter(|_| raw.path.starts_with('/'));
            e.check(
                || format!("{at}.path"),
                path.ok_or_else(|| format!("must be a path starting with '/', such as /healthz, not {:?}", raw.path)),
            )
        }
    };
    let interval = e.positive(&format!("{at}.interval"), raw.interval.as_ref(), DEFAULT_CHECK_INTERVAL);
    let timeout = e.positive(&format!("{at}.timeout"), raw.timeout.as_ref(), DEFAULT_CHECK_TIMEOUT);
    let expect_status = raw
        .expect_status
        .iter()
        .enumerate()
        .map(|(i, &code)| status_in(e, || format!("{at}.expect_status[{i}]"), code, 100..=599))
        .collect();
    let grpc_service = raw.grpc_service.clone();
    HealthCheck {
        path: path.unwrap_or_else(|| PathAndQuery::from_static("/")),
        interval,
        timeout,
        expect_status,
        grpc_service,
    }
}
