//! The admin listener (`admin.listen`): liveness, readiness and Prometheus metrics, apart
//! from the proxy's own listener so that it can stay on a private address.
//!
//! `GET /healthz` answers while the process serves; `GET /readyz` once the configuration
//! is loaded (saying so when the last reload failed); `GET /metrics` is the Prometheus
//! text exposition; `POST /reload` reloads the configuration file, as SIGHUP does. With
//! `admin.token`, every call must carry `Authorization: Bearer TOKEN` (compared in
//! constant time).

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

use crate::config::{Admin, Config};
use crate::limit::key::bearer_token;
use crate::server::Running;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves the admin listener until the process ends.
pub async fn serve(listener: TcpListener, admin: Admin, running: Arc<Running>) {
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
        let (admin, running) = (Arc::clone(&admin), Arc::clone(&running));
        let service = service_fn(move |req: Request<Incoming>| {
            let response = answer(&req, &admin, &running);
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

fn answer(req: &Request<Incoming>, admin: &Admin, running: &Running) -> Response<Full<Bytes>> {
    if let Some(token) = &admin.token
        && !bearer_token(req.headers()).is_some_and(|given| bool::from(given.ct_eq(token.as_bytes())))
    {
        let mut response = text(StatusCode::UNAUTHORIZED, "admin token required\n");
        response.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        return response;
    }
    match (req.method(), req.uri().path()) {
        (&Method::POST, "/reload") if running.request_reload() => text(StatusCode::ACCEPTED, "reloading\n"),
        (&Method::POST, "/reload") => text(StatusCode::CONFLICT, "not started from a file: nothing to reload\n"),
        (m, _) if m != Method::GET && m != Method::HEAD => text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n"),
        (_, "/healthz") => text(StatusCode::OK, "ok\n"),
        // A failed reload leaves a good configuration serving: still ready, but said, so
        // that an operator sees it without taking the instance out of rotation.
        (_, "/readyz") => match running.reload_failure() {
            None => text(StatusCode::OK, "ready\n"),
            Some(why) => {
                let body = format!("ready; the last reload failed and the previous configuration serves:\n{why}\n");
                let mut response = Response::new(Full::new(Bytes::from(body)));
                response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("text/plain"));
                response
            }
        },
        (_, "/metrics") => {
            let mut response = Response::new(Full::new(Bytes::from(running.proxy().metrics().encode())));
            response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static(OPENMETRICS));
            response
        }
        _ => text(StatusCode::NOT_FOUND, "not found: /healthz, /readyz, /metrics, POST /reload\n"),
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("text/plain"));
    response
}

/// Asks the instance running `config` to reload its file: `POST /reload` on its admin
/// listener, with its token. The client side of `sluicegate reload`.
pub async fn request_reload(config: &Config) -> Result<(), String> {
    let admin = config.admin.as_ref().ok_or("the configuration has no admin listener (admin.listen)")?;
    let stream = tokio::net::TcpStream::connect(admin.listen).await.map_err(|e| format!("{}: {e}", admin.listen))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let mut request = Request::post("/reload").header(header::HOST, admin.listen.to_string());
    if let Some(token) = &admin.token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request.body(Full::new(Bytes::new())).map_err(|e| e.to_string())?;
    let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
    match response.status() {
        StatusCode::ACCEPTED => Ok(()),
        status => Err(format!("{} answered {status}", admin.listen)),
    }
}
