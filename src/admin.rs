//! The admin listener (`admin.listen`): liveness, readiness and Prometheus metrics, apart
//! from the proxy's own listener so that it can stay on a private address.
//!
//! `GET /healthz` answers while the process serves; `GET /readyz` once the configuration
//! is loaded and, for global limits, while Redis answers or `on_store_error` stands in;
//! `GET /metrics` is the Prometheus text exposition. With `admin.token`, every call must
//! carry `Authorization: Bearer TOKEN` (compared in constant time).

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tracing::{debug, warn};

use crate::config::Admin;
use crate::limit::key::bearer_token;
use crate::proxy::Proxy;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves the admin listener until the process ends.
pub async fn serve(listener: TcpListener, admin: Admin, proxy: Arc<Proxy>) {
    let admin = Arc::new(admin);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                warn!(error = %e, "admin accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let (admin, proxy) = (Arc::clone(&admin), Arc::clone(&proxy));
        let service = service_fn(move |req: Request<Incoming>| {
            let response = answer(&req, &admin, &proxy);
            async move { Ok::<_, Infallible>(response) }
        });
        tokio::spawn(async move {
            let builder = auto::Builder::new(TokioExecutor::new());
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            if let Err(e) = connection.await {
                debug!(%peer, error = %e, "admin connection ended with an error");
            }
        });
    }
}

fn answer(req: &Request<Incoming>, admin: &Admin, proxy: &Proxy) -> Response<Full<Bytes>> {
    if let Some(token) = &admin.token
        && !bearer_token(req.headers()).is_some_and(|given| bool::from(given.ct_eq(token.as_bytes())))
    {
        let mut response = text(StatusCode::UNAUTHORIZED, "admin token required\n");
        response.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        return response;
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
    }
    match req.uri().path() {
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" => text(StatusCode::OK, "ready\n"),
        "/metrics" => {
            let mut response = Response::new(Full::new(Bytes::from(proxy.metrics().encode())));
            response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static(OPENMETRICS));
            response
        }
        _ => text(StatusCode::NOT_FOUND, "not found: /healthz, /readyz, /metrics\n"),
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("text/plain"));
    response
}
