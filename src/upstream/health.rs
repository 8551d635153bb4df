//! The active health check of an upstream (`health_check`): every `interval`, `GET path`
//! on each server at once; one that does not answer an expected status within `timeout`
//! is out until a check passes. The servers checked are those of the moment, as names
//! resolve to new addresses. Runs while its upstream client lives, until a reload stops
//! its server set.

use std::future::poll_fn;
use std::sync::Arc;
use std::time::Instant;

use http::{Method, StatusCode};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use hyper::client::conn::http2::SendRequest;

use super::connect::Connector;
use super::h2::H2Body;
use super::pool::{MAX_RESPONSE_HEAD, Pool};
use super::servers::{Member, ServerSet};
use crate::config::HealthCheck;
use crate::wire::http1::client::{ResponseBody, exchange};
use crate::wire::http1::parse::Framing;
use crate::wire::http1::write;

/// The running check; dropping it stops the check.
pub struct Checker(JoinHandle<()>);

impl Drop for Checker {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts checking the servers of `servers`; `None` outside a runtime (nothing to run on).
pub fn start(servers: &Arc<ServerSet>, check: &HealthCheck, connector: Connector, http2: bool) -> Option<Checker> {
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    // Its own pool: checks neither take nor keep connections that requests use; one a
    // server is all a check at a time needs. Not in the metrics: those count requests'.
    let pool = Pool::new(connector, Some(1), 1, crate::metrics::PoolMetrics::default());
    let (servers, check) = (Arc::clone(servers), check.clone());
    Some(Checker(runtime.spawn(async move {
        let upstream = servers.upstream();
        let mut ticks = tokio::time::interval(check.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                // Stopped first: a tick due at once must not check the servers once more.
                biased;
                () = servers.stopped() => return,
                _ = ticks.tick() => {}
            }
            let members = servers.members();
            let probes = members.iter().map(|m| async {
                let started = Instant::now();
                (probe(&pool, m, &check, http2).await, started.elapsed())
            });
            for (member, (outcome, took)) in members.iter().zip(futures_util::future::join_all(probes).await) {
                let changed = member.checked(outcome.as_ref().map(|_| ()).map_err(Clone::clone), took);
                match outcome {
                    Err(why) if changed => {
                        warn!(upstream, server = %member.describe(), why, "health check failed: server out")
                    }
                    Ok(status) if changed => {
                        info!(upstream, server = %member.describe(), %status, "health check passed: server back")
                    }
                    _ => {}
                }
            }
        }
    })))
}

/// The status of one check, or why it failed.
async fn probe(pool: &Pool, member: &Member, check: &HealthCheck, http2: bool) -> Result<StatusCode, String> {
    let status = tokio::time::timeout(check.timeout, exchange_once(pool, member, check, http2))
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {:?}", check.timeout)))?;
    let expected = match check.expect_status.as_slice() {
        [] => status.is_success() || status.is_redirection(),
        list => list.contains(&status),
    };
    if expected { Ok(status) } else { Err(format!("status {status}")) }
}

/// `GET path` on `member` (or gRPC's health check, with `grpc_service`), its body read
/// to the end so that the connection can be kept.
async fn exchange_once(pool: &Pool, member: &Member, check: &HealthCheck, http2: bool) -> Result<StatusCode, String> {
    let (address, tls, host) = (member.address(), member.tls(), member.host().as_str());
    if let Some(service) = &check.grpc_service {
        let mut sender = pool.h2(address, tls).await.map_err(|e| super::error::causes(&e))?;
        let scheme = if tls { "https" } else { "http" };
        let uri =
            format!("{scheme}://{host}{}", check.path).parse().map_err(|e: http::uri::InvalidUri| e.to_string())?;
        return grpc_check(&mut sender, uri, service).await;
    }
    if http2 {
        let mut sender = pool.h2(address, tls).await.map_err(|e| super::error::causes(&e))?;
        let scheme = if tls { "https" } else { "http" };
        let uri =
            format!("{scheme}://{host}{}", check.path).parse().map_err(|e: http::uri::InvalidUri| e.to_string())?;
        let response = super::h2::send(&mut sender, &Method::GET, uri, http::HeaderMap::new(), None)
            .await
            .map_err(|_| "the exchange failed".to_owned())?
            .response;
        let status = response.status();
        http_body_util::BodyExt::collect(response.into_body()).await.map_err(|e| e.to_string())?;
        return Ok(status);
    }
    get(pool, address, tls, host, check.path.as_str(), None).await.map(|(status, _)| status)
}

/// `GET target` over HTTP/1.1 from sluicegate itself (a check, a JWKS) on the server at
/// `address`, over TLS when `tls`, with `Host: host`: its status, and its body when
/// `keep` bounds it (a longer one fails); read to the end so that the connection can be
/// kept.
pub(super) async fn get(
    pool: &Pool,
    address: &http::uri::Authority,
    tls: bool,
    host: &str,
    target: &str,
    keep: Option<usize>,
) -> Result<(StatusCode, Vec<u8>), String> {
    let mut conn = pool.checkout(address, tls, super::pool::Take::Idle).await.map_err(|e| super::error::causes(&e))?;
    let mut head = Vec::with_capacity(128);
    let mut writer = write::Head::request(&mut head, &Method::GET, target);
    writer.field(b"host", host.as_bytes());
    writer.end();
    let no_body: Option<&mut dyn crate::wire::http1::BodySource> = None;
    let (result, _) = exchange(&mut conn, head, no_body, Framing::Empty, &Method::GET, MAX_RESPONSE_HEAD).await;
    let (response, read) = result.map_err(|e| super::error::causes(&e))?;
    let mut body = ResponseBody::new(conn, &response, read);
    let mut kept = Vec::new();
    while let Some(piece) = poll_fn(|cx| body.poll_data(cx)).await {
        let piece = piece.map_err(|e| e.to_string())?;
        if let Some(max) = keep {
            if kept.len() + piece.len() > max {
                return Err(format!("the body is larger than {} KiB", max / 1024));
            }
            kept.extend_from_slice(&piece);
        }
    }
    if body.is_reusable() {
        body.conn_mut().give_back();
    }
    Ok((response.status, kept))
}

/// gRPC's standard health check (`grpc.health.v1.Health/Check`, grpc/grpc's
/// `doc/health-checking.md`) of `service`: passed (`200 OK`) when the server answers
/// `SERVING` with `grpc-status: 0`.
///
/// Its two messages are encoded here by hand: `HealthCheckRequest` is one string field
/// and `HealthCheckResponse` one enum field, a few bytes each, which do not call for a
/// protobuf library and its generated code.
async fn grpc_check(sender: &mut SendRequest<H2Body>, uri: http::Uri, service: &str) -> Result<StatusCode, String> {
    let mut fields = http::HeaderMap::new();
    fields.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/grpc"));
    fields.insert(http::header::TE, http::HeaderValue::from_static("trailers"));
    let mut body = Once(Some(grpc_frame(&health_request(service))));
    let sent =
        super::h2::send(sender, &Method::POST, uri, fields, Some(&mut body as &mut dyn crate::wire::http1::BodySource))
            .await
            .map_err(|_| "the exchange failed".to_owned())?;
    let (parts, incoming) = sent.response.into_parts();
    if parts.status != StatusCode::OK {
        return Err(format!("status {}", parts.status));
    }
    let collected = http_body_util::BodyExt::collect(incoming).await.map_err(|e| e.to_string())?;
    let code = collected.trailers().and_then(crate::grpc::status).or_else(|| crate::grpc::status(&parts.headers));
    match code {
        Some(crate::grpc::Code::OK) => {}
        Some(code) => return Err(format!("grpc-status {} ({})", code.0, code.name())),
        None => return Err("no grpc-status".to_owned()),
    }
    // One message: a zero flag byte, its length, then `status` (field 1, a varint):
    // 1 is SERVING.
    let status = match collected.to_bytes().as_ref() {
        [0, _, _, _, _, 0x08, 1] => return Ok(StatusCode::OK),
        [0, _, _, _, _, 0x08, 2, ..] => "NOT_SERVING",
        [0, _, _, _, _, 0x08, 3, ..] => "SERVICE_UNKNOWN",
        _ => "UNKNOWN",
    };
    Err(format!("{status} (not SERVING)"))
}

/// `HealthCheckRequest { service }`: field 1, length-delimited.
fn health_request(service: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(service.len() + 6);
    if !service.is_empty() {
        out.push(0x0a);
        let mut len = service.len();
        while len >= 0x80 {
            out.push((len as u8 & 0x7f) | 0x80);
            len >>= 7;
        }
        out.push(len as u8);
        out.extend_from_slice(service.as_bytes());
    }
    out
}

/// One gRPC message as it goes on the wire: not compressed, its length, itself.
fn grpc_frame(message: &[u8]) -> bytes::Bytes {
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(0);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out.into()
}

/// A body of one piece.
struct Once(Option<bytes::Bytes>);

impl crate::wire::http1::BodySource for Once {
    fn poll_chunk(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<bytes::Bytes, crate::wire::http1::BodyError>>> {
        std::task::Poll::Ready(self.0.take().map(Ok))
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::time::{Duration, Instant};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::metrics::ResolveMetrics;
    use crate::upstream::servers::tests::upstream;

    /// A server that answers every request `204` and closes.
    async fn answers_204() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut head = [0; 1024];
                    let _ = stream.read(&mut head).await;
                    let _ = stream.write_all(b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n").await;
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn the_check_follows_the_addresses_a_name_resolves_to() {
        let up = answers_204().await;
        let down = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        let upstream = upstream(&["svc.test:80"], 0);
        let set = Arc::new(ServerSet::unresolved(&upstream, ResolveMetrics::default()));
        set.apply(&[(0, Ok(vec![up]))]);
        let check = HealthCheck {
            path: http::uri::PathAndQuery::from_static("/healthz"),
            interval: Duration::from_millis(20),
            timeout: Duration::from_millis(500),
            expect_status: vec![],
            grpc_service: None,
        };
        let _checker = start(&set, &check, Connector::new(&upstream, set.tls_names()), false).unwrap();
        // The name now also resolves to an address where nothing listens.
        set.apply(&[(0, Ok(vec![up, down]))]);
        let picks_only_up = || {
            (0..4).all(|_| set.pick(None, &[], Instant::now()).is_some_and(|f| f.address().as_str() == up.to_string()))
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !picks_only_up() {
            assert!(Instant::now() < deadline, "the new address was never checked");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A reload stops the check: a new address where nothing listens stays in.
        set.stop();
        let also_down = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        set.apply(&[(0, Ok(vec![also_down]))]);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(set.pick(None, &[], Instant::now()).is_some(), "checked after stop");
    }

    #[test]
    fn the_grpc_health_request_is_its_protobuf_encoding() {
        assert_eq!(health_request(""), b"");
        assert_eq!(health_request("a.B"), b"\x0a\x03a.B");
        let long = "s".repeat(200);
        assert_eq!(&health_request(&long)[..3], &[0x0a, 0xc8, 0x01]);
        assert_eq!(grpc_frame(b"\x08\x01").as_ref(), b"\x00\x00\x00\x00\x02\x08\x01");
    }
}
