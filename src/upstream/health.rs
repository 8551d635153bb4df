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

use super::connect::Connector;
use super::pool::{MAX_RESPONSE_HEAD, Pool};
use super::servers::{Member, ServerSet};
use crate::config::HealthCheck;
use crate::http1::client::{ResponseBody, exchange};
use crate::http1::parse::Framing;
use crate::http1::write;

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
    // Its own pool: checks neither take nor keep connections that requests use.
    let pool = Pool::new(connector);
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

/// `GET path` on `member`, its body read to the end so that the connection can be kept.
async fn exchange_once(pool: &Pool, member: &Member, check: &HealthCheck, http2: bool) -> Result<StatusCode, String> {
    let (address, tls, host) = (member.address(), member.tls(), member.host().as_str());
    if http2 {
        let mut sender = pool.h2(address, tls).await.map_err(|e| super::error::causes(&e))?;
        let scheme = if tls { "https" } else { "http" };
        let uri =
            format!("{scheme}://{host}{}", check.path).parse().map_err(|e: http::uri::InvalidUri| e.to_string())?;
        let response = super::h2::send(&mut sender, &Method::GET, uri, http::HeaderMap::new(), None)
            .await
            .map_err(|_| "the exchange failed".to_owned())?;
        let status = response.status();
        http_body_util::BodyExt::collect(response.into_body()).await.map_err(|e| e.to_string())?;
        return Ok(status);
    }
    let mut conn = pool.checkout(address, tls, super::pool::Take::Idle).await.map_err(|e| super::error::causes(&e))?;
    let mut head = Vec::with_capacity(128);
    let mut writer = write::Head::request(&mut head, &Method::GET, check.path.as_str());
    writer.field(b"host", host.as_bytes());
    writer.end();
    let no_body: Option<&mut dyn crate::http1::BodySource> = None;
    let (result, _) = exchange(&mut conn, &head, no_body, Framing::Empty, &Method::GET, MAX_RESPONSE_HEAD).await;
    let (response, read) = result.map_err(|e| super::error::causes(&e))?;
    let mut body = ResponseBody::new(conn, &response, read);
    while let Some(piece) = poll_fn(|cx| body.poll_data(cx)).await {
        piece.map_err(|e| e.to_string())?;
    }
    if body.is_reusable() {
        body.conn_mut().give_back();
    }
    Ok(response.status)
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
}
