//! The active health check of an upstream (`health_check`): every `interval`, `GET path`
//! on each server at once; one that does not answer an expected status within `timeout`
//! is out until a check passes. The servers checked are those of the moment, as names
//! resolve to new addresses. Runs while its upstream client lives, until a reload stops
//! its server set.

use std::sync::Arc;

use bytes::Bytes;
use http::uri::Scheme;
use http::{HeaderValue, Request, StatusCode, Uri, header};
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::connect::Connector;
use super::upstream::{Member, ServerSet};
use crate::config::HealthCheck;

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
    let client = Client::builder(TokioExecutor::new()).http2_only(http2).build(connector);
    let (servers, check) = (Arc::clone(servers), check.clone());
    Some(Checker(runtime.spawn(async move {
        let upstream = servers.upstream();
        let mut ticks = tokio::time::interval(check.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = servers.stopped() => return,
            }
            let members = servers.members();
            let probes = members.iter().map(|m| probe(&client, m, &check));
            for (member, outcome) in members.iter().zip(futures_util::future::join_all(probes).await) {
                let changed = member.checked(outcome.is_ok());
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
async fn probe(
    client: &Client<Connector, Empty<Bytes>>,
    member: &Member,
    check: &HealthCheck,
) -> Result<StatusCode, String> {
    let scheme = if member.tls() { Scheme::HTTPS } else { Scheme::HTTP };
    let uri = Uri::builder().scheme(scheme).authority(member.address().clone()).path_and_query(check.path.clone());
    let mut req = Request::new(Empty::new());
    // Scheme, authority and a checked path always build a valid URI.
    *req.uri_mut() = uri.build().unwrap_or_default();
    if let Ok(host) = HeaderValue::from_str(member.host().as_str()) {
        req.headers_mut().insert(header::HOST, host);
    }
    let exchange = async {
        let response = client.request(req).await.map_err(|e| e.to_string())?;
        let status = response.status();
        // The body is read to the end so that the connection can be kept.
        http_body_util::BodyExt::collect(response.into_body()).await.map_err(|e| e.to_string())?;
        Ok(status)
    };
    let status = tokio::time::timeout(check.timeout, exchange)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {:?}", check.timeout)))?;
    let expected = match check.expect_status.as_slice() {
        [] => status.is_success() || status.is_redirection(),
        list => list.contains(&status),
    };
    if expected { Ok(status) } else { Err(format!("status {status}")) }
}
