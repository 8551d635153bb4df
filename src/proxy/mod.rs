//! The request path: client address -> route -> keys -> limits -> forward or respond.
//!
//! `Proxy::handle` is the service hyper calls for every request; it runs the phases in
//! `handle_inner`, a `?` pipeline, and turns a `ProxyError` into its response in one
//! place. Rejections are not errors: they are a `Decision` answered with a 429.

pub mod error;
mod forward;
pub mod headers;
pub mod response;
pub mod route;

use std::net::SocketAddr;

use http::{Request, Response};
use http_body_util::Either;
use hyper::body::Incoming;
use tracing::{debug, info, warn};

use crate::config::{Action, Config, HeaderMode};
use crate::limit::key::KeySource;
use crate::limit::{self, Decision, Limiters};
use error::ProxyError;
use forward::{Hop, UpstreamClient};
use response::ProxyBody;

pub struct Proxy {
    config: Config,
    limiters: Limiters,
    upstreams: Box<[UpstreamClient]>,
    /// Each limit's `RateLimit-Policy` item, by limit index.
    policies: Box<[String]>,
}

impl Proxy {
    pub fn new(config: Config) -> Self {
        Proxy {
            limiters: Limiters::new(&config),
            upstreams: config.upstreams.iter().map(UpstreamClient::new).collect(),
            policies: config.limits.iter().map(response::policy_item).collect(),
            config,
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Serves one request from `peer`. Never fails: every outcome is a response.
    pub async fn handle(&self, req: Request<Incoming>, peer: SocketAddr) -> Response<ProxyBody> {
        let (method, path) = (req.method().clone(), req.uri().path().to_owned());
        match self.handle_inner(req, peer).await {
            Ok(response) => response,
            Err(e) => {
                // Upstream faults were logged with their route where they happened.
                debug!(%method, %path, error = %e, "request answered with an error");
                response::error(&e)
            }
        }
    }

    async fn handle_inner(
        &self,
        req: Request<Incoming>,
        peer: SocketAddr,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let config = &self.config;
        let trusted_peer = headers::is_trusted(peer.ip().to_canonical(), &config.trusted_proxies);
        let client_ip = headers::client_ip(peer.ip(), req.headers(), &config.trusted_proxies);
        let host = route::request_host(req.uri(), req.headers());
        let route = route::match_route(&config.routes, req.method(), req.uri().path(), host)
            .ok_or(ProxyError::NoRoute)?;

        let src = KeySource {
            client_ip,
            method: req.method(),
            uri: req.uri(),
            headers: req.headers(),
            host,
        };
        let standings = match self.limiters.check(&route.limits, &src, limit::now()) {
            Decision::Reject {
                limit,
                status,
                retry_after,
                standings,
            } => {
                info!(route = %route.name, limit = %config.limits[limit].name, client = %client_ip,
                      retry_after_ms = retry_after.as_millis() as u64, "request rejected");
                let mut response = response::rejected(status, retry_after);
                if config.ratelimit_headers != HeaderMode::None {
                    response::add_ratelimit_headers(
                        response.headers_mut(),
                        &standings,
                        &config.limits,
                        &self.policies,
                    );
                }
                return Ok(response);
            }
            Decision::Pass { wait, standings } => {
                if !wait.is_zero() {
                    debug!(route = %route.name, client = %client_ip, wait_ms = wait.as_millis() as u64, "request delayed");
                    // A client that goes away while waiting drops this future here, and
                    // its request never reaches the upstream.
                    tokio::time::sleep(wait).await;
                }
                standings
            }
        };

        let mut response = match &route.action {
            Action::Respond(r) => response::static_response(r),
            Action::Forward(upstream) => {
                let host = host.map(str::to_owned);
                let hop = Hop {
                    peer: peer.ip(),
                    trusted_peer,
                    host: host.as_deref(),
                };
                let forwarded = self.upstreams[*upstream].forward(req, hop).await;
                forwarded
                    .inspect_err(|e| warn!(route = %route.name, error = %e, "upstream error"))?
                    .map(Either::Left)
            }
        };
        if config.ratelimit_headers == HeaderMode::All {
            response::add_ratelimit_headers(
                response.headers_mut(),
                &standings,
                &config.limits,
                &self.policies,
            );
        }
        Ok(response)
    }
}
