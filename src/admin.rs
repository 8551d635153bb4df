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

use crate::config::{Admin, Config, Scope};
use crate::front;
use crate::head::{Fields, RequestHead};
use crate::policy::key::bearer_token;
use crate::proxy::Proxy;
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
        && !bearer_token(Fields::from(req.headers())).is_some_and(|given| bool::from(given.ct_eq(token.as_bytes())))
    {
        let mut response = text(StatusCode::UNAUTHORIZED, "admin token required\n");
        response.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        return response;
    }
    match (req.method(), req.uri().path()) {
        (&Method::POST, "/reload") if running.request_reload() => text(StatusCode::ACCEPTED, "reloading\n"),
        (&Method::POST, "/reload") => text(StatusCode::CONFLICT, "not started from a file: nothing to reload\n"),
        (m, path) if m != Method::GET && m != Method::HEAD && !(m == Method::DELETE && is_key_path(path)) => {
            text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n")
        }
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
        (_, path) if path.starts_with("/limits/") || path.starts_with("/bans") || path == "/config" => {
            keys(req, &running.proxy())
        }
        (_, "/metrics") => {
            let mut response = Response::new(Full::new(Bytes::from(running.proxy().metrics().encode())));
            response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static(OPENMETRICS));
            response
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: /healthz, /readyz, /metrics, /config, /limits/NAME?PART=VALUE, /bans, POST /reload\n",
        ),
    }
}

fn is_key_path(path: &str) -> bool {
    path.starts_with("/limits/") || path.starts_with("/bans/")
}

/// The admin API over limits and keys (JSON): `GET /config`; `GET` and `DELETE`
/// `/limits/NAME?PART=VALUE...` (a key's state, or its reset); `GET /bans`;
/// `DELETE /bans/NAME/KEY` (lift a ban by the keyed hash that `/bans` and log lines show).
fn keys(req: &Request<Incoming>, proxy: &Proxy) -> Response<Full<Bytes>> {
    let config = proxy.config();
    let limiters = proxy.limiters();
    let path = req.uri().path();
    let find = |name: &str| config.limits.iter().position(|l| l.name == name);
    if path == "/config" {
        return json(StatusCode::OK, &describe(config));
    }
    if path == "/bans" {
        let all: serde_json::Map<String, serde_json::Value> = config
            .limits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.ban.is_some())
            .map(|(i, l)| (l.name.clone(), serde_json::json!(limiters.banned(i))))
            .collect();
        return json(StatusCode::OK, &all);
    }
    if let Some(rest) = path.strip_prefix("/bans/") {
        let (name, key) = rest.split_once('/').unwrap_or((rest, ""));
        let key = key.replace("%23", "#");
        let key = if key.starts_with('#') { key } else { format!("#{key}") };
        return match find(name) {
            Some(i) if req.method() == Method::DELETE && limiters.lift(i, &key) => text(StatusCode::NO_CONTENT, ""),
            Some(_) if req.method() == Method::DELETE => text(StatusCode::NOT_FOUND, "no such ban\n"),
            Some(i) => json(StatusCode::OK, &limiters.banned(i)),
            None => text(StatusCode::NOT_FOUND, "no such limit\n"),
        };
    }
    let name = path.trim_start_matches("/limits/");
    let Some(index) = find(name) else { return text(StatusCode::NOT_FOUND, "no such limit\n") };
    if matches!(config.limits[index].scope, Scope::Global { .. }) {
        return text(StatusCode::CONFLICT, "a global limit: its state is in Redis\n");
    }
    let Ok(request) = key_request(req.uri().query().unwrap_or_default()) else {
        return text(
            StatusCode::BAD_REQUEST,
            "give the key's parts as query parameters: ip=, header:NAME=, bearer=, query:NAME=, cookie:NAME=, method=, path=, host=\n",
        );
    };
    let (parts, _) = request.into_parts();
    let client_ip = parts.extensions.get::<std::net::IpAddr>().copied().unwrap_or([0, 0, 0, 0].into());
    // Hashed as the request path hashes: normalized path, host without port.
    let head = RequestHead {
        method: &parts.method,
        target: parts.uri.path_and_query().map_or("/", http::uri::PathAndQuery::as_str),
        version: http::Version::HTTP_11,
        authority: None,
        fields: Fields::from(&parts.headers),
    };
    let Ok(src) = front::source(&head, client_ip, None) else {
        return text(StatusCode::BAD_REQUEST, "invalid path\n");
    };
    match (req.method(), limiters.inspect(index, &src)) {
        (_, None) => text(StatusCode::BAD_REQUEST, "those parameters give no key for this limit\n"),
        (&Method::DELETE, Some(_)) => {
            limiters.reset(index, &src);
            text(StatusCode::NO_CONTENT, "")
        }
        (_, Some(state)) => json(StatusCode::OK, &state),
    }
}

/// A request that carries the key parts given as `query` (`ip=…&header:x-key=…`), so that
/// the limit's own key extraction hashes it exactly as on the request path.
fn key_request(query: &str) -> Result<Request<()>, http::Error> {
    let mut request = Request::builder();
    let (mut uri_path, mut uri_query, mut ip) = ("/".to_owned(), Vec::new(), None);
    for (part, value) in form_urlencoded::parse(query.as_bytes()) {
        match part.split_once(':') {
            Some(("header", name)) => request = request.header(name, value.as_ref()),
            Some(("cookie", name)) => request = request.header(header::COOKIE, format!("{name}={value}")),
            Some(("query", name)) => uri_query.push((name.to_owned(), value.into_owned())),
            _ => match part.as_ref() {
                "ip" => ip = value.parse::<std::net::IpAddr>().ok(),
                "bearer" => request = request.header(header::AUTHORIZATION, format!("Bearer {value}")),
                "method" => request = request.method(value.as_ref()),
                "path" => uri_path = value.into_owned(),
                "host" => request = request.header(header::HOST, value.as_ref()),
                _ => {}
            },
        }
    }
    let query: String = form_urlencoded::Serializer::new(String::new()).extend_pairs(uri_query).finish();
    let uri = if query.is_empty() { uri_path } else { format!("{uri_path}?{query}") };
    let mut request = request.uri(uri);
    if let Some(ip) = ip {
        request = request.extension(ip);
    }
    request.body(())
}

/// The running configuration's routes and limits.
fn describe(config: &Config) -> serde_json::Value {
    let limits: Vec<_> = config
        .limits
        .iter()
        .map(|l| {
            serde_json::json!({
                "name": l.name,
                "key": l.key.0.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "scope": if matches!(l.scope, Scope::Global { .. }) { "global" } else { "local" },
                "windows": l.windows.iter().map(|w| format!("{w:?}")).collect::<Vec<_>>(),
                "dry_run": l.dry_run,
                "ban": l.ban.map(|b| humantime::format_duration(b.base).to_string()),
                "max_keys": l.max_keys,
            })
        })
        .collect();
    let routes: Vec<_> = config
        .routes
        .iter()
        .map(|r| {
            serde_json::json!({
                "name": r.name,
                "limits": r.limits.iter().map(|&i| config.limits[i].name.as_str()).collect::<Vec<_>>(),
            })
        })
        .collect();
    let listen: Vec<_> = config
        .listeners
        .iter()
        .map(|l| serde_json::json!({ "address": l.address.to_string(), "tls": l.tls.is_some() }))
        .collect();
    serde_json::json!({ "listen": listen, "routes": routes, "limits": limits })
}

fn json(status: StatusCode, value: &impl serde::Serialize) -> Response<Full<Bytes>> {
    let body = serde_json::to_vec_pretty(value).unwrap_or_default();
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
    response
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
