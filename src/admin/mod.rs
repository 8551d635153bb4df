//! The admin listener (`admin.listen`): the dashboard, liveness, readiness and
//! Prometheus metrics, apart from the proxy's own listener so that it can stay on a
//! private address.
//!
//! `GET /` is the dashboard (`dashboard`: its page and `GET /dashboard.json`);
//! `GET /healthz` answers while the process serves; `GET /readyz` once the configuration
//! is loaded (saying so when the last reload failed); `GET /metrics` is the Prometheus
//! text exposition; `POST /reload` reloads the configuration file, as SIGHUP does;
//! `POST /explain` explains how a request would be answered now (`explain`), spending
//! nothing; `/candidate` puts a candidate configuration live beside the running one,
//! says what it changes, drops or promotes it (`candidate`). With
//! `admin.token`, every call must carry `Authorization: Bearer TOKEN` (compared in
//! constant time). Only requests addressed to the listener are answered (`addressed`:
//! a `Host` that is an IP address, `localhost` or a name of `admin.hosts`), and a call
//! that changes state is refused when a browser says another site made it
//! (`cross_site`).

mod addressed;
mod candidate;
mod cross_site;
mod key_lookup;
pub mod overrides;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, StatusCode};
use smallvec::SmallVec;
use subtle::ConstantTimeEq;

use crate::config::words::ConfigWords;
use crate::config::{LimitId, OnStoreError, Scope};
use crate::dashboard::{self, Dashboard};
use crate::explain::{self, asked::Asked};
use crate::front;
use crate::limit::inspect::Lifted;
use crate::policy::key::bearer_token;
use crate::proxy::Proxy;
use crate::proxy::body::{Response, Settling};
use crate::running::Running;
use crate::store::Reach;
use crate::wire::connection::ClientConn;
use crate::wire::head::RequestHead;
use crate::wire::http1::BodySource;
use crate::wire::message::{Request, Service};

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The admin API, as the listener's connections are served. Its token is the one of the
/// configuration in force when a call arrives: a reload that adds, changes or removes
/// `admin.token` applies to the next call.
pub struct AdminService {
    running: Arc<Running>,
    dashboard: Dashboard,
}

impl AdminService {
    /// The admin API of `running`; its dashboard's history is recorded from now on
    /// (within a Tokio runtime).
    pub fn new(running: Arc<Running>) -> Self {
        let dashboard = Dashboard::start(Arc::clone(&running));
        AdminService { running, dashboard }
    }
}

impl Service for AdminService {
    type Body = Settling;

    async fn call<'a>(&'a self, request: Request<'a>, _conn: &'a ClientConn) -> Response {
        answer(&request.head, request.body, self).await
    }
}

/// The answer to one admin call: one `match` on the method and the path's segments, a
/// function per endpoint. Only a reload waits (for its outcome), and an explanation (for
/// its request, read from `body` once the token is checked).
async fn answer(head: &RequestHead<'_>, body: Option<&mut (dyn BodySource + '_)>, service: &AdminService) -> Response {
    let AdminService { running, dashboard } = service;
    let proxy = running.proxy();
    let admin = proxy.config().admin.as_ref();
    if let Some(why) = addressed::refusal(head, admin.map_or(&[], |admin| &admin.hosts[..])) {
        return typed(StatusCode::MISDIRECTED_REQUEST, "text/plain", format!("misdirected request: {why}\n"));
    }
    let token = admin.and_then(|admin| admin.token.as_deref());
    if !head.method.is_safe()
        && let Some(why) = cross_site::refusal(head)
    {
        return typed(StatusCode::FORBIDDEN, "text/plain", format!("cross-site request refused: {why}\n"));
    }
    let method = if *head.method == Method::HEAD { &Method::GET } else { head.method };
    // The page's files hold no data: a browser loads them before the token is typed.
    if method == Method::GET
        && let Some((content_type, body)) = dashboard.file(head.path(), token.is_some())
    {
        return page(typed(StatusCode::OK, content_type, body));
    }
    if let Some(token) = token
        && !bearer_token(head.fields).is_some_and(|given| bool::from(given.ct_eq(token.as_bytes())))
    {
        let mut response = text(StatusCode::UNAUTHORIZED, "admin token required\n");
        response.set(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return response;
    }
    let segments: SmallVec<[&str; 4]> = head.path().trim_start_matches('/').splitn(3, '/').collect();
    let query = head.query().unwrap_or_default();
    match (method, &segments[..]) {
        (&Method::GET, ["healthz"]) => text(StatusCode::OK, "ok\n"),
        (&Method::GET, ["readyz"]) => readyz(running),
        (&Method::GET, ["metrics"]) => metrics(&proxy),
        (&Method::GET, ["config"]) => json(StatusCode::OK, &ConfigWords::of(proxy.config())),
        (&Method::GET, ["dashboard.json"]) => {
            // Compact: a first answer holds 15 minutes of seconds per route and limit.
            let state = serde_json::to_vec(&dashboard.state(running, query)).unwrap_or_default();
            page(typed(StatusCode::OK, "application/json", state))
        }
        (&Method::POST, ["reload"]) => reload(running, query).await,
        (_, ["reload"]) => text(StatusCode::METHOD_NOT_ALLOWED, "use POST\n"),
        (&Method::GET, ["candidate"]) => candidate::show(running, query),
        (&Method::POST, ["candidate"]) => candidate::load(running, query),
        (&Method::DELETE, ["candidate"]) => candidate::drop(running),
        (&Method::POST, ["candidate", "promote"]) => candidate::promote(running).await,
        (_, ["candidate", ..]) => {
            text(StatusCode::METHOD_NOT_ALLOWED, "use GET, POST or DELETE /candidate, POST /candidate/promote\n")
        }
        (&Method::POST, ["explain"]) => explain(&proxy, body).await,
        (_, ["explain"]) => text(StatusCode::METHOD_NOT_ALLOWED, "use POST\n"),
        (&Method::GET, ["bans"]) => bans(&proxy),
        (&Method::GET, ["bans", name, ..]) => {
            with_limit(&proxy, name, |i| json(StatusCode::OK, &proxy.limiters().banned(i)))
        }
        (&Method::DELETE, ["bans", name, rest @ ..]) => lift(&proxy, name, rest.first().copied().unwrap_or_default()),
        (&Method::GET, ["overrides"]) => overrides::list(&proxy, None),
        (&Method::GET, ["overrides", name]) => overrides::list(&proxy, Some(name)),
        (&Method::PUT, ["overrides", name, rest @ ..]) => {
            let too_large = "a count given a key takes at most 1 KiB: {\"limit\": N}\n";
            match read_body(body, overrides::MAX_BODY_BYTES, too_large).await {
                Ok(read) => overrides::change(&proxy, name, rest.first().copied(), query, Some(&read)).await,
                Err(refused) => refused,
            }
        }
        (&Method::DELETE, ["overrides", name, rest @ ..]) => {
            overrides::change(&proxy, name, rest.first().copied(), query, None).await
        }
        (_, ["overrides", ..]) => text(StatusCode::METHOD_NOT_ALLOWED, "use GET, PUT or DELETE\n"),
        (&Method::GET, ["limits", name]) => key_lookup::answer(&proxy, name, query, false),
        (&Method::DELETE, ["limits", name]) => key_lookup::answer(&proxy, name, query, true),
        (m, ["healthz" | "readyz" | "metrics" | "config" | "bans" | "limits" | "dashboard.json", ..])
            if m != Method::GET =>
        {
            text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n")
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: / (the dashboard), /healthz, /readyz, /metrics, /config, /limits/NAME?PART=VALUE, /overrides, /bans, /candidate, POST /reload, POST /explain\n",
        ),
    }
}

/// `GET /readyz`. A failed reload leaves a good configuration serving: still ready, but
/// said, so that an operator sees it without taking the instance out of rotation.
///
/// With global limits, the body also says whether Redis answers. While the circuit
/// breaker is open (Redis keeps failing), an instance whose enforced global limits
/// include one with `on_store_error: deny` refuses those requests with 503: it is not
/// ready (503), so that a load balancer sends traffic elsewhere; with `allow` or `local`
/// it serves, degraded, and stays ready. Either way the body says since when, the last
/// error and the probe interval: the background probe brings the instance back when
/// Redis answers, with no request (an instance out of rotation gets none).
fn readyz(running: &Running) -> Response {
    let proxy = running.proxy();
    let mut body = String::new();
    let mut status = StatusCode::OK;
    if let Some(store) = proxy.store() {
        let reach = store.reach();
        if let Reach::Unreachable { since, lasting, error, every } = reach {
            let denying: Vec<&str> = proxy
                .config()
                .limits
                .iter()
                .filter(|l| l.refuses() && matches!(l.scope, Scope::Global { on_store_error: OnStoreError::Deny, .. }))
                .map(|l| l.name.as_str())
                .collect();
            if denying.is_empty() {
                body.push_str("ready, degraded: Redis does not answer (circuit breaker open); global limits decided by on_store_error\n");
            } else {
                status = StatusCode::SERVICE_UNAVAILABLE;
                body.push_str(&format!(
                    "not ready: Redis does not answer (circuit breaker open) and {} refuse with 503 (on_store_error: deny)\n",
                    denying.join(", ")
                ));
            }
            body.push_str(&format!(
                "Redis unreachable since {} ({:.1} s), probed every {}; last error: {error}\n",
                humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_nanos(since.0)),
                lasting.as_secs_f64(),
                humantime::format_duration(every),
            ));
        } else if reach == Reach::Connecting {
            body.push_str("ready; Redis has not answered yet\n");
        } else {
            body.push_str("ready; Redis answers\n");
        }
    } else {
        body.push_str("ready\n");
    }
    if let Some(why) = running.reload_failure() {
        body.push_str(&format!("the last reload failed and the previous configuration serves:\n{why}\n"));
    }
    typed(status, "text/plain", body)
}

/// `GET /metrics`: the Prometheus text exposition.
fn metrics(proxy: &Proxy) -> Response {
    typed(StatusCode::OK, OPENMETRICS, proxy.metrics().encode())
}

/// `POST /reload[?file=PATH]`: the configuration file is read again, as on SIGHUP, and
/// the answer says how that went: `200` naming the file, or `422` with every reason when
/// the file (or binding its addresses, or opening its access log) failed and the running
/// configuration stays. With `file` (what `sluicegate reload -c` gives), a file that is
/// not the instance's is refused (`409`, both named) and nothing is reloaded: the
/// instance reads only its own file.
async fn reload(running: &Running, query: &str) -> Response {
    let given = form_urlencoded::parse(query.as_bytes()).find(|(name, _)| name == "file").map(|(_, file)| file);
    if let (Some(given), Some(source)) = (given, running.source()) {
        let same = |a: &std::path::Path, b: &std::path::Path| match (a.canonicalize(), b.canonicalize()) {
            (Ok(a), Ok(b)) => a == b,
            _ => a == b,
        };
        if !same(std::path::Path::new(given.as_ref()), &source) {
            let body = format!(
                "this instance reads {}, not {given}: nothing reloaded (reload {} or start an instance with {given})\n",
                source.display(),
                source.display()
            );
            return typed(StatusCode::CONFLICT, "text/plain", body);
        }
    }
    match running.reload().await {
        Some(Ok(())) => {
            let file = running.source().map(|s| s.display().to_string()).unwrap_or_default();
            typed(StatusCode::OK, "text/plain", format!("reloaded {file}\n"))
        }
        Some(Err(why)) => typed(
            StatusCode::UNPROCESSABLE_ENTITY,
            "text/plain",
            format!("reload failed; the running configuration stays:\n{why}\n"),
        ),
        None => text(StatusCode::CONFLICT, "not started from a file: nothing to reload\n"),
    }
}

/// The largest request `POST /explain` reads.
const EXPLAIN_MAX_BYTES: usize = 64 * 1024;
/// How long a body sent to the admin API may take to come.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The whole of `body` (none: empty), at most `max` bytes: else `413` saying `too_large`,
/// `400` when it breaks off, `408` when it does not come within 10 s.
async fn read_body(
    body: Option<&mut (dyn BodySource + '_)>,
    max: usize,
    too_large: &'static str,
) -> Result<Vec<u8>, Response> {
    let mut read = Vec::new();
    let Some(body) = body else { return Ok(read) };
    let whole = async {
        while let Some(piece) = std::future::poll_fn(|cx| body.poll_chunk(cx)).await {
            let Ok(piece) = piece else { return Err(StatusCode::BAD_REQUEST) };
            if read.len() + piece.len() > max {
                return Err(StatusCode::PAYLOAD_TOO_LARGE);
            }
            read.extend_from_slice(&piece);
        }
        Ok(())
    };
    match tokio::time::timeout(BODY_READ_TIMEOUT, whole).await {
        Ok(Ok(())) => Ok(read),
        Ok(Err(StatusCode::PAYLOAD_TOO_LARGE)) => Err(text(StatusCode::PAYLOAD_TOO_LARGE, too_large)),
        Ok(Err(_)) => Err(text(StatusCode::BAD_REQUEST, "the body broke off\n")),
        Err(_) => Err(text(StatusCode::REQUEST_TIMEOUT, "the body did not come within 10 s\n")),
    }
}

/// `POST /explain` with `{"method", "url", "headers", "peer"}`: how the running
/// instance would answer that request now, from its live tables, spending nothing (the
/// gate's `preview`): `200` with the explanation as JSON, `400` saying what is wrong with
/// the request asked, `413` past 64 KiB, `408` when the body does not come within 10 s.
async fn explain(proxy: &Proxy, body: Option<&mut (dyn BodySource + '_)>) -> Response {
    let read = match read_body(body, EXPLAIN_MAX_BYTES, "the request to explain takes at most 64 KiB\n").await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    let asked: Asked = match serde_json::from_slice(&read) {
        Ok(asked) => asked,
        Err(e) => {
            let why = format!(
                "give the request as JSON: {{\"method\": \"GET\", \"url\": \"http://HOST/PATH\", \"headers\": {{\"name\": \"value\"}}, \"peer\": \"IP\"}}: {e}\n"
            );
            return typed(StatusCode::BAD_REQUEST, "text/plain", why);
        }
    };
    match asked.request() {
        Ok(request) => {
            // A logged request's claims are not sent: it is explained without them.
            let claimed = if asked.logged { front::Claimed::Logged(None) } else { front::Claimed::Explained };
            let head = request.head();
            let explain = |config, gate, holds, state| {
                let body = request.body.as_deref();
                explain::explain(config, gate, holds, &head, request.peer, request.scheme, claimed, body, 0, state)
            };
            let mut explained = explain(proxy.config(), proxy.gate(), Some(proxy.holds()), "live");
            if let Some(candidate) = proxy.candidate() {
                explained.candidate = Some(Box::new(explain(&candidate.config, &candidate.gate, None, "candidate")));
            }
            json(StatusCode::OK, &explained)
        }
        Err(e) => typed(StatusCode::BAD_REQUEST, "text/plain", format!("{e}\n")),
    }
}

/// `GET /bans`: the keys each banning limit refuses now.
fn bans(proxy: &Proxy) -> Response {
    let config = proxy.config();
    let all: serde_json::Map<String, serde_json::Value> = config
        .limits
        .iter_enumerated()
        .filter(|(_, l)| l.ban.is_some())
        .map(|(i, l)| (l.name.clone(), serde_json::json!(proxy.limiters().banned(i))))
        .collect();
    json(StatusCode::OK, &all)
}

/// `DELETE /bans/NAME/KEY`: lifts a ban by its key as `/bans` and log lines write it
/// (percent-encoded), or by one of its digests, with or without its `#` (which a URL
/// cannot carry unencoded: it starts the fragment).
fn lift(proxy: &Proxy, name: &str, key: &str) -> Response {
    let key = percent_encoding::percent_decode_str(key).decode_utf8_lossy();
    with_limit(proxy, name, |i| match proxy.limiters().lift(i, &key) {
        Lifted::Lifted => text(StatusCode::NO_CONTENT, ""),
        Lifted::NoSuchBan => typed(
            StatusCode::NOT_FOUND,
            "text/plain",
            format!(
                "no running ban of limit {name:?} has the key {key:?}: give a key as GET /bans/{name} writes it \
                 (percent-encoded), or one of its digests, with or without its #\n"
            ),
        ),
        Lifted::Ambiguous(n) => typed(
            StatusCode::CONFLICT,
            "text/plain",
            format!(
                "{n} running bans of limit {name:?} have the digest {key:?}: give the whole key as GET /bans/{name} writes it\n"
            ),
        ),
    })
}

/// `answer` with limit `name`, or 404.
fn with_limit(proxy: &Proxy, name: &str, answer: impl FnOnce(LimitId) -> Response) -> Response {
    match proxy.config().limits.position(|l| l.name == name) {
        Some(index) => answer(index),
        None => text(StatusCode::NOT_FOUND, "no such limit\n"),
    }
}

/// `response`, a part of the dashboard: what the page may load and do (CSP), never
/// sniffed as another type, never framed, never sent elsewhere as a referrer, never
/// cached.
fn page(mut response: Response) -> Response {
    response.set(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(dashboard::CONTENT_SECURITY_POLICY));
    response.set(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    response.set(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response.set(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    response.set(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn json(status: StatusCode, value: &impl serde::Serialize) -> Response {
    typed(status, "application/json", serde_json::to_vec_pretty(value).unwrap_or_default())
}

fn text(status: StatusCode, body: &'static str) -> Response {
    typed(status, "text/plain", body)
}

fn typed(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response {
    Response::made(status, vec![(header::CONTENT_TYPE, HeaderValue::from_static(content_type).into())], body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::head::Fields;

    /// The admin API of an instance of `yaml` (within a Tokio runtime: the dashboard's
    /// history starts).
    fn service(yaml: &str) -> AdminService {
        let config = crate::config::parse(yaml, "test").unwrap();
        AdminService::new(Arc::new(Running::new(
            Proxy::new(config, crate::limit::secret::KeySecret::draw()).unwrap(),
            None,
        )))
    }

    fn head_of(req: &http::Request<()>) -> RequestHead<'_> {
        RequestHead {
            method: req.method(),
            target: req.uri().path_and_query().map_or("/", |p| p.as_str()),
            version: http::Version::HTTP_11,
            authority: None,
            fields: Fields::from(req.headers()),
        }
    }

    /// The answer, made at once (a reload here has no file and is refused at once).
    fn made(answer: impl Future<Output = Response>) -> Response {
        use futures_util::FutureExt;
        answer.now_or_never().expect("answered at once")
    }

    fn call(service: &AdminService, method: Method, uri: &str) -> (StatusCode, String) {
        let req = http::Request::builder().method(method).uri(uri).body(()).unwrap();
        let response = made(answer(&head_of(&req), None, service));
        let body = response.body.made().expect("made here");
        (response.status, String::from_utf8_lossy(body).into_owned())
    }

    const CONFIG: &str = "listen: 127.0.0.1:0
admin: { listen: 127.0.0.1:0 }
limits:
  strict: { key: ip, rate: 1r/m, ban: 1m }
  shared: { key: ip, rate: 1r/s, scope: global }
redis: { url: redis://127.0.0.1:1 }
routes:
  - respond: { status: 200 }
    limits: [strict, shared]
";

    #[tokio::test]
    async fn each_endpoint_answers_its_methods_and_nothing_else() {
        let service = service(CONFIG);
        let status = |method: Method, uri: &str| call(&service, method, uri).0;
        assert_eq!(status(Method::GET, "/healthz"), StatusCode::OK);
        assert_eq!(status(Method::HEAD, "/readyz"), StatusCode::OK);
        assert_eq!(status(Method::POST, "/healthz"), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(status(Method::GET, "/reload"), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(status(Method::POST, "/reload"), StatusCode::CONFLICT, "not started from a file");
        assert_eq!(status(Method::GET, "/nothing"), StatusCode::NOT_FOUND);
        assert_eq!(status(Method::GET, "/limits/nothing?ip=10.0.0.1"), StatusCode::NOT_FOUND);
        assert_eq!(status(Method::GET, "/limits/shared?ip=10.0.0.1"), StatusCode::CONFLICT, "kept in Redis");
        assert_eq!(status(Method::GET, "/limits/strict?ip=10.0.0.1"), StatusCode::OK);
        assert_eq!(status(Method::DELETE, "/limits/strict?ip=10.0.0.1"), StatusCode::NO_CONTENT);
        assert_eq!(status(Method::GET, "/bans"), StatusCode::OK);
        assert_eq!(status(Method::DELETE, "/bans/strict/%230000000000000001"), StatusCode::NOT_FOUND, "no such ban");
        let (_, config) = call(&service, Method::GET, "/config");
        assert!(config.contains("strict"), "{config}");
    }

    #[tokio::test]
    async fn with_a_token_nothing_answers_without_it_but_the_pages_files() {
        let service = service(&CONFIG.replace("127.0.0.1:0 }\nlimits", "127.0.0.1:0, token: s3cret }\nlimits"));
        let request = |path: &str, token: Option<&str>| {
            let mut request = http::Request::get(path);
            if let Some(token) = token {
                request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
            }
            made(answer(&head_of(&request.body(()).unwrap()), None, &service))
        };
        for path in ["/healthz", "/dashboard.json", "/config"] {
            assert_eq!(request(path, None).status, StatusCode::UNAUTHORIZED, "{path}");
            assert_eq!(request(path, Some("wrong")).status, StatusCode::UNAUTHORIZED, "{path}");
            assert_eq!(request(path, Some("s3cret")).status, StatusCode::OK, "{path}");
        }
        for path in ["/", "/dashboard.js", "/dashboard.css", "/icon.svg"] {
            let file = request(path, None);
            assert_eq!(file.status, StatusCode::OK, "{path}");
            let body = file.body.made().expect("made here");
            assert!(!String::from_utf8_lossy(body).contains("shared"), "{path} shows no data (no limit's name)");
            let csp = file.extra.iter().find(|(name, _)| *name == header::CONTENT_SECURITY_POLICY);
            assert!(csp.is_some(), "{path} has its Content-Security-Policy");
        }
        let page = request("/", None).body.made().expect("made here").clone();
        assert!(String::from_utf8_lossy(&page).contains("data-token=\"required\""), "the page asks for the token");
    }
}
