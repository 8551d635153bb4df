//! gRPC through the proxy: a tonic client and a tonic server (messages written with
//! prost's derive, the service dispatched by hand: no protoc), over h2c and over TLS on
//! both sides; every stream shape, large messages, deadlines, cancellation, flow
//! control, and the gRPC answers sluicegate makes itself.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use http::uri::PathAndQuery;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc};
use tokio_stream::{Stream, StreamExt};
use tonic::metadata::MetadataMap;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Request, Response, Status, Streaming};
use tonic_prost::ProstCodec;

use crate::common::*;

/// The one message of the test service.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Msg {
    #[prost(string, tag = "1")]
    pub text: String,
    #[prost(uint32, tag = "2")]
    pub count: u32,
    #[prost(bytes = "vec", tag = "3")]
    pub payload: Vec<u8>,
}

pub(crate) fn msg(text: &str, count: u32, payload: usize) -> Msg {
    Msg { text: text.to_owned(), count, payload: vec![b'x'; payload] }
}

/// Messages up to this size pass (tonic's default is 4 MiB).
const MAX_MESSAGE: usize = 64 << 20;

/// What the test server saw.
#[derive(Default)]
struct Seen {
    /// `hold` calls begun, and those that ended because their client went away.
    held: AtomicUsize,
    cancelled: AtomicUsize,
    entered: Notify,
    /// Bytes of payload a server stream has produced so far.
    produced: AtomicUsize,
    /// Bytes of payload a client stream has delivered so far.
    consumed: AtomicUsize,
    /// The `x-forwarded-host` of the last call.
    forwarded_host: Mutex<Option<String>>,
    /// The soft limits that annotated the last call (`x-quota-exceeded`, as configured).
    exceeded: Mutex<Option<String>>,
}

/// Counts a `hold` call that ends without being released: its client cancelled it.
struct CancelGuard(Arc<Seen>);

impl Drop for CancelGuard {
    fn drop(&mut self) {
        self.0.cancelled.fetch_add(1, SeqCst);
        self.0.entered.notify_waiters();
    }
}

type MsgStream = Pin<Box<dyn Stream<Item = Result<Msg, Status>> + Send>>;

/// `/test.Echo/Unary`: by `text`, `fail` answers `NOT_FOUND` with trailing metadata,
/// `deny` `UNAUTHENTICATED`, `sleep` answers after `count` ms, `hold` never answers (until cancelled); anything
/// else echoes the message, `count` its payload's length.
async fn unary(seen: Arc<Seen>, request: Request<Msg>) -> Result<Response<Msg>, Status> {
    let host = request.metadata().get("x-forwarded-host").map(|v| v.to_str().unwrap().to_owned());
    *seen.forwarded_host.lock().unwrap() = host;
    let exceeded = request.metadata().get("x-quota-exceeded").map(|v| v.to_str().unwrap().to_owned());
    *seen.exceeded.lock().unwrap() = exceeded;
    let m = request.into_inner();
    match m.text.as_str() {
        "fail" => {
            let mut trailing = MetadataMap::new();
            trailing.insert("x-detail", "because".parse().unwrap());
            Err(Status::with_metadata(Code::NotFound, "no such thing", trailing))
        }
        "deny" => Err(Status::unauthenticated("who are you?")),
        "sleep" => {
            tokio::time::sleep(Duration::from_millis(m.count.into())).await;
            Ok(Response::new(m))
        }
        "hold" => {
            let _guard = CancelGuard(Arc::clone(&seen));
            seen.held.fetch_add(1, SeqCst);
            seen.entered.notify_waiters();
            std::future::pending().await
        }
        _ => Ok(Response::new(Msg { count: m.payload.len() as u32, ..m })),
    }
}

/// `/test.Echo/ServerStream`: `count` messages of the request's payload size, one every
/// `text` ms (empty: at once), made as the client takes them.
async fn server_stream(seen: Arc<Seen>, request: Request<Msg>) -> Result<Response<MsgStream>, Status> {
    let m = request.into_inner();
    let every = Duration::from_millis(m.text.parse().unwrap_or(0));
    let size = m.payload.len();
    let stream = futures_util::stream::unfold(0u32, move |i| {
        let seen = Arc::clone(&seen);
        async move {
            if i == m.count {
                return None;
            }
            if !every.is_zero() {
                tokio::time::sleep(every).await;
            }
            seen.produced.fetch_add(size, SeqCst);
            Some((Ok(Msg { text: i.to_string(), count: i, payload: vec![b'y'; size] }), i + 1))
        }
    });
    Ok(Response::new(Box::pin(stream)))
}

/// `/test.Echo/ClientStream`: how many messages came (`count`) and their payloads'
/// bytes (`text`); `hold` as the first message's text stops reading after it.
async fn client_stream(seen: Arc<Seen>, request: Request<Streaming<Msg>>) -> Result<Response<Msg>, Status> {
    let mut stream = request.into_inner();
    let (mut count, mut bytes) = (0u32, 0usize);
    while let Some(m) = stream.message().await? {
        count += 1;
        bytes += m.payload.len();
        seen.consumed.fetch_add(m.payload.len(), SeqCst);
        if m.text == "hold" {
            std::future::pending::<()>().await;
        }
    }
    Ok(Response::new(Msg { text: bytes.to_string(), count, payload: vec![] }))
}

/// `/test.Echo/Bidi`: each message echoed as it comes, `count` its payload's length.
async fn bidi(request: Request<Streaming<Msg>>) -> Result<Response<MsgStream>, Status> {
    let echoed = request.into_inner().map(|m| m.map(|m| Msg { count: m.payload.len() as u32, ..m }));
    Ok(Response::new(Box::pin(echoed)))
}

/// The test service, `test.Echo`, as generated code would dispatch it.
#[derive(Clone)]
struct Echo(Arc<Seen>);

impl tower::Service<http::Request<tonic::body::Body>> for Echo {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let seen = Arc::clone(&self.0);
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(ProstCodec::<Msg, Msg>::default())
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE);
            let s = Arc::clone(&seen);
            Ok(match req.uri().path() {
                "/test.Echo/Unary" => grpc.unary(tower::service_fn(move |r| unary(Arc::clone(&s), r)), req).await,
                "/test.Echo/ServerStream" => {
                    grpc.server_streaming(tower::service_fn(move |r| server_stream(Arc::clone(&s), r)), req).await
                }
                "/test.Echo/ClientStream" => {
                    grpc.client_streaming(tower::service_fn(move |r| client_stream(Arc::clone(&s), r)), req).await
                }
                "/test.Echo/Bidi" => grpc.streaming(tower::service_fn(bidi), req).await,
                _ => Status::unimplemented("no such method").into_http(),
            })
        })
    }
}

/// The test service on a free port: h2c, or TLS (ALPN `h2`) with `tls`.
async fn grpc_server(seen: &Arc<Seen>, tls: Option<tokio_rustls::TlsAcceptor>) -> SocketAddr {
    serve(Echo(Arc::clone(seen)), tls).await
}

/// A gRPC server of `service` on a free port (hyper's HTTP/2 server, without tonic's
/// transport, whose own handling of `grpc-timeout` would answer before the proxy).
async fn serve<S>(service: S, tls: Option<tokio_rustls::TlsAcceptor>) -> SocketAddr
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (echo, tls) = (service.clone(), tls.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    tower::Service::call(&mut echo.clone(), req.map(tonic::body::Body::new))
                });
                let builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                match tls {
                    None => {
                        let _ = builder.serve_connection(TokioIo::new(stream), service).await;
                    }
                    Some(acceptor) => {
                        let Ok(stream) = acceptor.accept(stream).await else { return };
                        let _ = builder.serve_connection(TokioIo::new(stream), service).await;
                    }
                }
            });
        }
    });
    addr
}

/// A channel to `addr`: h2c, or TLS for `localhost` trusting `ca`.
pub(crate) async fn channel(addr: SocketAddr, ca: Option<&str>) -> Channel {
    let endpoint = match ca {
        None => Endpoint::from_shared(format!("http://{addr}")).unwrap(),
        Some(ca) => Endpoint::from_shared(format!("https://{addr}"))
            .unwrap()
            .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)).domain_name("localhost"))
            .unwrap(),
    };
    endpoint.connect().await.unwrap()
}

fn client(channel: &Channel) -> tonic::client::Grpc<Channel> {
    tonic::client::Grpc::new(channel.clone())
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE)
}

fn path(method: &str) -> PathAndQuery {
    PathAndQuery::try_from(format!("/test.Echo/{method}")).unwrap()
}

async fn call_unary(channel: &Channel, m: Msg) -> Result<Response<Msg>, Status> {
    let mut grpc = client(channel);
    grpc.ready().await.unwrap();
    grpc.unary(Request::new(m), path("Unary"), ProstCodec::default()).await
}

async fn call_server_stream(channel: &Channel, m: Msg) -> Result<Streaming<Msg>, Status> {
    let mut grpc = client(channel);
    grpc.ready().await.unwrap();
    Ok(grpc.server_streaming(Request::new(m), path("ServerStream"), ProstCodec::default()).await?.into_inner())
}

async fn call_client_stream(
    channel: &Channel,
    messages: impl Stream<Item = Msg> + Send + 'static,
) -> Result<Response<Msg>, Status> {
    let mut grpc = client(channel);
    grpc.ready().await.unwrap();
    grpc.client_streaming(Request::new(messages), path("ClientStream"), ProstCodec::default()).await
}

/// A proxy in front of gRPC server `server` (`http2: true`; `upstream` more of its
/// fields), with `rest` (limits, routes) after; the TLS listener's files and address
/// when `tls` gives its certificate and key.
fn proxy(server: SocketAddr, upstream: &str, rest: &str) -> Sluicegate {
    Sluicegate::start(&format!(
        "listen: 127.0.0.1:0\nupstreams:\n  g: {{ servers: [\"{server}\"], http2: true{upstream} }}\n{rest}"
    ))
}

const FORWARD_ALL: &str = "routes:\n  - upstream: g\n";

/// Every stream shape, a large message each way, an error status with its trailing
/// metadata, and the forwarding fields, on `channel` to a proxy.
async fn every_shape(channel: &Channel, seen: &Seen, authority: &str) {
    let reply = call_unary(channel, msg("hello", 0, 3)).await.unwrap().into_inner();
    assert_eq!((reply.text.as_str(), reply.count), ("hello", 3));
    assert_eq!(seen.forwarded_host.lock().unwrap().as_deref(), Some(authority), "X-Forwarded-Host from :authority");

    // Several MiB each way in one message.
    let big = call_unary(channel, msg("big", 0, 6 << 20)).await.unwrap().into_inner();
    assert_eq!((big.count, big.payload.len()), (6 << 20, 6 << 20));

    // The server's own status, message and trailing metadata, from its trailers.
    let status = call_unary(channel, msg("fail", 0, 0)).await.unwrap_err();
    assert_eq!((status.code(), status.message()), (Code::NotFound, "no such thing"));
    assert_eq!(status.metadata().get("x-detail").unwrap(), "because");

    let mut stream = call_server_stream(channel, msg("", 3, 10)).await.unwrap();
    let mut got = vec![];
    while let Some(m) = stream.message().await.unwrap() {
        got.push(m.count);
    }
    assert_eq!(got, [0, 1, 2]);
    // A large server stream: 8 messages of 1 MiB.
    let mut stream = call_server_stream(channel, msg("", 8, 1 << 20)).await.unwrap();
    let mut bytes = 0;
    while let Some(m) = stream.message().await.unwrap() {
        bytes += m.payload.len();
    }
    assert_eq!(bytes, 8 << 20);

    let messages = tokio_stream::iter((0..5).map(|i| msg("part", i, 1 << 20)));
    let summed = call_client_stream(channel, messages).await.unwrap().into_inner();
    assert_eq!((summed.count, summed.text.as_str()), (5, (5usize << 20).to_string().as_str()));

    // Ping-pong: each message is sent only once the previous one's answer came, so the
    // call deadlocks unless its response flows while its request is still open.
    let (tx, rx) = mpsc::channel(1);
    let mut grpc = client(channel);
    grpc.ready().await.unwrap();
    tx.send(msg("ping", 0, 5)).await.unwrap();
    let request = Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    let codec = ProstCodec::<Msg, Msg>::default();
    let mut answers = grpc.streaming(request, path("Bidi"), codec).await.unwrap().into_inner();
    for i in 1..=4u32 {
        let answer = tokio::time::timeout(Duration::from_secs(5), answers.message()).await.expect("no answer").unwrap();
        assert_eq!(answer.unwrap().count, if i == 1 { 5 } else { (i - 1) * 10 }, "the answer to message {}", i - 1);
        tx.send(msg("ping", i, i as usize * 10)).await.unwrap();
    }
    drop(tx);
    let last = answers.message().await.unwrap().unwrap();
    assert_eq!(last.count, 40);
    assert!(answers.message().await.unwrap().is_none(), "the call ends with its request");
}

#[tokio::test]
async fn every_stream_shape_passes_over_h2c() {
    let seen = Arc::new(Seen::default());
    let server = grpc_server(&seen, None).await;
    let sg = proxy(server, "", FORWARD_ALL);
    every_shape(&channel(sg.addr, None).await, &seen, &sg.addr.to_string()).await;
}

/// A TLS listener's configuration for `localhost`, its files written in `dir`; the CA's
/// certificate.
fn tls_listener(dir: &std::path::Path) -> (String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_owned()]).unwrap().signed_by(&key, &issuer).unwrap();
    let (cert_file, key_file) = (dir.join("l.crt"), dir.join("l.key"));
    std::fs::write(&cert_file, leaf.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    let listen = format!(
        "listen:\n  - 127.0.0.1:0\n  - address: 127.0.0.1:0\n    tls:\n      certificates:\n        - {{ cert: {}, key: {}, names: [localhost] }}\n",
        cert_file.display(),
        key_file.display()
    );
    (listen, ca.pem())
}

/// The address of the proxy's TLS listener, from its log.
fn tls_addr(sg: &Sluicegate) -> SocketAddr {
    let is_tls = |l: &str| l.contains("\"listening\"") && l.contains("\"tls\":true");
    let log = sg.wait_for_log("the TLS listener's line", |log| log.lines().any(is_tls));
    let json: serde_json::Value = serde_json::from_str(log.lines().find(|l| is_tls(l)).unwrap()).unwrap();
    json["fields"]["addr"].as_str().unwrap().parse().unwrap()
}

#[tokio::test]
async fn every_stream_shape_passes_over_tls_on_both_sides() {
    let seen = Arc::new(Seen::default());
    let (acceptor, upstream_ca) = private_ca_acceptor(&["localhost", "127.0.0.1"]);
    let server = grpc_server(&seen, Some(acceptor)).await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("upstream-ca.pem");
    std::fs::write(&ca_file, upstream_ca).unwrap();
    let (listen, ca) = tls_listener(dir.path());
    let sg = Sluicegate::start(&format!(
        "{listen}upstreams:\n  g: {{ servers: [\"https://{server}\"], http2: true, tls: {{ ca_file: \"{}\" }} }}\n{FORWARD_ALL}",
        ca_file.display()
    ));
    let addr = tls_addr(&sg);
    // tonic names the address it connects to as `:authority` (and `localhost` by SNI).
    every_shape(&channel(addr, Some(&ca)).await, &seen, &addr.to_string()).await;
}

/// A soft limit forwards a call over it annotated (here in the field the configuration
/// names), and the call ends `OK`, counted `annotated`.
#[tokio::test]
async fn a_call_over_a_soft_limit_reaches_the_server_annotated() {
    let seen = Arc::new(Seen::default());
    let server = grpc_server(&seen, None).await;
    let sg = proxy(
        server,
        "",
        "admin: { listen: 127.0.0.1:0 }\nannotation_field: x-quota-exceeded\nlimits:\n  quota: { key: ip, rate: 1r/m, burst: 0, nodelay: true, action: annotate }\nroutes:\n  - { name: echo, upstream: g, limits: [quota] }\n",
    );
    let channel = channel(sg.addr, None).await;
    call_unary(&channel, msg("first", 0, 0)).await.unwrap();
    assert_eq!(*seen.exceeded.lock().unwrap(), None);
    call_unary(&channel, msg("second", 0, 0)).await.unwrap();
    assert_eq!(seen.exceeded.lock().unwrap().as_deref(), Some("quota"));
    let m = Metrics::of(&sg).await;
    assert_eq!(m.value("sluicegate_requests_total{route=\"echo\",outcome=\"annotated\"}"), 1.0, "{}", m.0);
    assert_eq!(m.value("sluicegate_grpc_responses_total{route=\"echo\",grpc_status=\"OK\"}"), 2.0, "{}", m.0);
}

#[tokio::test]
async fn a_refused_call_is_resource_exhausted_with_the_pushback() {
    let seen = Arc::new(Seen::default());
    let server = grpc_server(&seen, None).await;
    let sg = proxy(
        server,
        "",
        "admin: { listen: 127.0.0.1:0 }\nlimits:\n  per_ip: { key: ip, rate: 1r/m, burst: 0, nodelay: true }\n  methods: { key: ip, rate: 1r/m, burst: 0, nodelay: true, grpc_status: UNAVAILABLE, headers: hidden }\nroutes:\n  - { match: { path: /test.Echo/Unary }, upstream: g, limits: [per_ip] }\n  - { match: { path_prefix: /test.Echo/Server }, upstream: g, limits: [methods] }\n",
    );
    let channel = channel(sg.addr, None).await;
    call_unary(&channel, msg("first", 0, 0)).await.unwrap();
    let refused = call_unary(&channel, msg("second", 0, 0)).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(refused.message(), "Too Many Requests");
    let pushback: u64 = refused.metadata().get("grpc-retry-pushback-ms").unwrap().to_str().unwrap().parse().unwrap();
    assert!((59_000..=60_000).contains(&pushback), "{pushback}");
    assert_eq!(refused.metadata().get("retry-after").unwrap(), "60");
    assert_eq!(refused.metadata().get("ratelimit-policy").unwrap(), "\"per_ip\";q=1;w=60");
    // A limit may answer another code; one clients do not see (`headers: hidden`) gives
    // the pushback and no rate-limit field.
    call_server_stream(&channel, msg("", 1, 0)).await.unwrap();
    let refused = call_server_stream(&channel, msg("", 1, 0)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert_eq!(refused.metadata().get("retry-after").unwrap(), "60");
    assert!(refused.metadata().get("grpc-retry-pushback-ms").is_some());
    assert!(refused.metadata().get("ratelimit-policy").is_none() && refused.metadata().get("ratelimit").is_none());
    // No route: UNIMPLEMENTED, as a server answers a method it does not have.
    let mut grpc = client(&channel);
    grpc.ready().await.unwrap();
    let none = grpc
        .unary::<Msg, Msg, _>(
            Request::new(msg("", 0, 0)),
            PathAndQuery::from_static("/other.Svc/M"),
            ProstCodec::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(none.code(), Code::Unimplemented, "{none:?}");
    // The dashboard shows each route's calls by the status they ended with.
    let state: serde_json::Value =
        serde_json::from_slice(&get(sg.admin_addr(), "/dashboard.json", &[]).await.body).unwrap();
    let grpc: Vec<&serde_json::Value> = state["routes"].as_array().unwrap().iter().map(|r| &r["grpc"]).collect();
    assert_eq!(grpc[0], &serde_json::json!({ "OK": 1, "RESOURCE_EXHAUSTED": 1 }));
    assert_eq!(grpc[1], &serde_json::json!({ "OK": 1, "UNAVAILABLE": 1 }));
}

#[tokio::test]
async fn a_cancelled_call_cancels_upstream_and_frees_its_slot_within_a_round_trip() {
    let seen = Arc::new(Seen::default());
    let server = grpc_server(&seen, None).await;
    let sg = proxy(
        server,
        "",
        "limits:\n  one: { key: ip, concurrency: 1 }\nroutes:\n  - { match: { path: /test.Echo/Unary }, upstream: g, limits: [one] }\n  - { upstream: g }\n",
    );
    let channel = channel(sg.addr, None).await;
    for _ in 0..3 {
        let entered = seen.entered.notified();
        let before = seen.held.load(SeqCst);
        let call = tokio::spawn({
            let channel = channel.clone();
            async move { call_unary(&channel, msg("hold", 0, 0)).await }
        });
        tokio::time::timeout(Duration::from_secs(5), entered).await.expect("the call never reached the server");
        assert_eq!(seen.held.load(SeqCst), before + 1);
        // The slot is taken while the call is open.
        let refused = call_unary(&channel, msg("x", 0, 0)).await.unwrap_err();
        assert_eq!(refused.code(), Code::ResourceExhausted);
        // The client cancels (RST_STREAM): the server's handler is dropped...
        let cancelled = seen.cancelled.load(SeqCst);
        let gone = seen.entered.notified();
        call.abort();
        tokio::time::timeout(Duration::from_secs(5), gone).await.expect("the upstream call was not cancelled");
        assert_eq!(seen.cancelled.load(SeqCst), cancelled + 1);
        // ...and after one round trip on another route, the slot is free.
        call_server_stream(&channel, msg("", 0, 0)).await.unwrap();
        call_unary(&channel, msg("x", 0, 0)).await.expect("the cancelled call's slot is still taken");
    }
}

/// An upstream that resets its stream midway through the response resets the client's
/// stream, and the call's concurrency slot goes back with it.
#[tokio::test]
async fn an_upstream_that_resets_its_stream_resets_the_clients_and_frees_the_slot() {
    type Piece = Result<Frame<Bytes>, std::io::Error>;
    // Each response sends its first piece at once and hands the test what sends the rest.
    let (to_test, mut responses) = mpsc::unbounded_channel::<mpsc::Sender<Piece>>();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let Ok((stream, _)) = listener.accept().await else { return };
        let service = hyper::service::service_fn(move |_req: http::Request<hyper::body::Incoming>| {
            let to_test = to_test.clone();
            async move {
                let (tx, rx) = mpsc::channel::<Piece>(4);
                tx.send(Ok(Frame::data(Bytes::from_static(b"part")))).await.unwrap();
                to_test.send(tx).unwrap();
                let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
                Ok::<_, Infallible>(http::Response::new(body))
            }
        });
        let builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        _ = builder.serve_connection(TokioIo::new(stream), service).await;
    });
    let sg =
        proxy(server, "", "limits:\n  one: { key: ip, concurrency: 1 }\nroutes:\n  - { upstream: g, limits: [one] }\n");
    let stream = TcpStream::connect(sg.addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let get = || http::Request::get(format!("http://{}/r", sg.addr)).body(Full::new(Bytes::new())).unwrap();
    for _ in 0..2 {
        // The slot of the call reset before is free (at once, or within a moment).
        let mut opened = None;
        wait_until("the slot to be free", Duration::from_secs(5), async || {
            let response = sender.send_request(get()).await.unwrap();
            let passed = response.status() == 200;
            opened = passed.then_some(response);
            passed
        })
        .await;
        let mut body = opened.unwrap().into_body();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first, "part");
        // The slot is taken while the response is open.
        assert_eq!(sender.send_request(get()).await.unwrap().status(), 429);
        let rest = responses.recv().await.unwrap();
        rest.send(Err(std::io::Error::other("the server gives up"))).await.unwrap();
        let reset = tokio::time::timeout(Duration::from_secs(5), body.frame()).await.expect("no reset came");
        assert!(matches!(reset, Some(Err(_))), "the stream ended instead of being reset: {reset:?}");
    }
}

/// A gRPC request for `/test.Echo/Unary` as bytes on the wire (one framed message).
pub(crate) fn framed(m: &Msg) -> Bytes {
    let body = prost::Message::encode_to_vec(m);
    let mut out = BytesMut::with_capacity(5 + body.len());
    out.put_u8(0);
    out.put_u32(body.len() as u32);
    out.put_slice(&body);
    out.freeze()
}

fn grpc_request(addr: SocketAddr, m: &Msg, extra: &[(&str, &str)]) -> http::Request<Full<Bytes>> {
    let mut req = http::Request::post(format!("http://{addr}/test.Echo/Unary"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in extra {
        req = req.header(*name, *value);
    }
    req.body(Full::new(framed(m))).unwrap()
}

#[tokio::test]
async fn the_clients_deadline_is_honoured_and_a_live_stream_outlasts_the_upstream_timeout() {
    let seen = Arc::new(Seen::default());
    let server = grpc_server(&seen, None).await;
    // The client's deadline comes first, long before the server's answer and the
    // upstream's timeout: DEADLINE_EXCEEDED, not before the deadline (raw HTTP/2: tonic's
    // client would give up by itself at the same instant). Which of the two ended the
    // call is told by the code, not by how long it took.
    let patient = proxy(server, ", timeout: 30s", FORWARD_ALL);
    let started = Instant::now();
    let reply =
        request_h2(patient.addr, grpc_request(patient.addr, &msg("sleep", 20_000, 0), &[("grpc-timeout", "150m")]))
            .await;
    assert!(started.elapsed() >= Duration::from_millis(150), "before the deadline: {:?}", started.elapsed());
    assert_eq!((reply.status, reply.header("grpc-status")), (200, Some("4")), "{reply:?}");
    assert_eq!(reply.header("content-type"), Some("application/grpc"));
    // The upstream's timeout comes first: UNAVAILABLE.
    let sg = proxy(server, ", timeout: 1s", FORWARD_ALL);
    let reply = request_h2(sg.addr, grpc_request(sg.addr, &msg("sleep", 20_000, 0), &[("grpc-timeout", "30S")])).await;
    assert_eq!(reply.header("grpc-status"), Some("14"), "{reply:?}");
    // A deadline longer than the upstream's timeout does not stretch it for a silent
    // server, but a stream that moves is alive: a server stream lasting 1.8 × the
    // timeout, a message every 150 ms...
    let channel = channel(sg.addr, None).await;
    let mut stream = call_server_stream(&channel, msg("150", 12, 10)).await.unwrap();
    let mut n = 0;
    while let Some(_m) = stream.message().await.unwrap() {
        n += 1;
    }
    assert_eq!(n, 12);
    // ...and a client stream sending for as long, answered only at its end.
    let slow = tokio_stream::iter((0..12).map(|i| msg("part", i, 10))).throttle(Duration::from_millis(150));
    let summed = call_client_stream(&channel, slow).await.unwrap().into_inner();
    assert_eq!(summed.count, 12);
}

#[tokio::test]
async fn a_slow_reader_holds_the_server_back_and_a_slow_server_the_client() {
    let seen = Arc::new(Seen::default());
    let server = grpc_server(&seen, None).await;
    let sg = proxy(server, "", FORWARD_ALL);
    let channel = channel(sg.addr, None).await;
    // 64 MiB offered by the server, one message read.
    let mut stream = call_server_stream(&channel, msg("", 64, 1 << 20)).await.unwrap();
    stream.message().await.unwrap().unwrap();
    let settled = settle(&seen.produced).await;
    assert!(settled < 24 << 20, "the server made {} MiB for a client that read 1", settled >> 20);
    drop(stream);

    // 64 MiB offered by the client, to a server that reads one message.
    let sent = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&sent);
    let messages = tokio_stream::iter(0..64).map(move |i| {
        counted.fetch_add(1 << 20, SeqCst);
        msg(if i == 0 { "hold" } else { "part" }, i, 1 << 20)
    });
    let call = tokio::spawn({
        let channel = channel.clone();
        async move { call_client_stream(&channel, messages).await }
    });
    let settled = settle(&sent).await;
    assert!(settled < 24 << 20, "the client sent {} MiB to a server that read 1", settled >> 20);
    assert_eq!(seen.consumed.load(SeqCst), 1 << 20);
    call.abort();
}

/// `counter`'s value once it has not moved for 300 ms (bounded: at most 10 s).
async fn settle(counter: &AtomicUsize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = counter.load(SeqCst);
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = counter.load(SeqCst);
        if now == last || Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

/// An HTTP/2 server that answers every request with the trailers it got, plus its own
/// (and fields that may not be trailers, which the proxy drops), after echoing the body.
async fn trailer_echo() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = hyper::service::service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                let te = req.headers().get("te").cloned();
                let collected = req.into_body().collect().await.unwrap();
                let mut trailers = collected.trailers().cloned().unwrap_or_default();
                trailers.insert("x-server", "yes".parse().unwrap());
                trailers.insert("content-type", "text/plain".parse().unwrap());
                let body = collected.to_bytes();
                let frames: Vec<Result<Frame<Bytes>, Infallible>> =
                    vec![Ok(Frame::data(body)), Ok(Frame::trailers(trailers))];
                let mut response = http::Response::new(StreamBody::new(tokio_stream::iter(frames)));
                if let Some(te) = te {
                    response.headers_mut().insert("x-te-seen", te);
                }
                Ok::<_, Infallible>(response)
            });
            tokio::spawn(async move {
                let builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                _ = builder.serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    addr
}

/// An HTTP/2 `POST /t` to `addr` with `te: trailers`, the body `body`, then `trailers`.
async fn post_with_trailers(
    addr: SocketAddr,
    trailers: &[(&'static str, &'static str)],
) -> http::Response<hyper::body::Incoming> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let fields: http::HeaderMap =
        trailers.iter().map(|&(n, v)| (http::HeaderName::from_static(n), v.parse().unwrap())).collect();
    let frames: Vec<Result<Frame<Bytes>, Infallible>> =
        vec![Ok(Frame::data(Bytes::from_static(b"body"))), Ok(Frame::trailers(fields))];
    let request = http::Request::post(format!("http://{addr}/t"))
        .header("te", "trailers")
        .body(StreamBody::new(tokio_stream::iter(frames)))
        .unwrap();
    sender.send_request(request).await.unwrap()
}

#[tokio::test]
async fn trailers_pass_both_ways_over_http2_and_te_trailers_goes_upstream() {
    let sg = proxy(trailer_echo().await, "", FORWARD_ALL);
    let response = post_with_trailers(sg.addr, &[("x-client", "1"), ("trailer", "x-client")]).await;
    assert_eq!(response.headers().get("x-te-seen").unwrap(), "trailers");
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().expect("no trailers came");
    assert_eq!(collected.to_bytes(), "body");
    assert_eq!(trailers.get("x-client").unwrap(), "1");
    assert_eq!(trailers.get("x-server").unwrap(), "yes");
    assert!(trailers.get("content-type").is_none() && trailers.get("trailer").is_none(), "{trailers:?}");
}

/// The trailer section of a raw HTTP/1.1 chunked answer whose body is `data` in one
/// chunk: its field lines, sorted.
fn chunked_trailers(answer: &str, data: &str) -> Vec<String> {
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no head: {answer}"));
    assert!(head.contains("\r\ntransfer-encoding: chunked"), "{head}");
    let chunk = format!("{:x}\r\n{data}\r\n0\r\n", data.len());
    let section = body.strip_prefix(&chunk).and_then(|s| s.strip_suffix("\r\n")).unwrap_or_else(|| panic!("{body:?}"));
    let mut lines: Vec<String> = section.lines().map(str::to_owned).collect();
    lines.sort();
    lines
}

/// An HTTP/1.1 client's chunked trailers go upstream (as an HTTP/2 server's trailers),
/// and the response's trailers reach it as its last chunk's when it sent `TE: trailers`,
/// and not otherwise; fields that may not be trailers are left out both ways.
#[tokio::test]
async fn http11_clients_send_trailers_and_get_them_when_they_take_them() {
    let sg = proxy(trailer_echo().await, "", FORWARD_ALL);
    let request = |te: &str| {
        format!(
            "POST /t HTTP/1.1\r\nHost: x\r\n{te}Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
             4\r\nbody\r\n0\r\nx-client: 1\r\ncontent-length: 4\r\n\r\n"
        )
    };
    let answer = raw_exchange(sg.addr, request("TE: trailers\r\n").as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 200 ") && answer.contains("\r\nx-te-seen: trailers\r\n"), "{answer}");
    assert_eq!(chunked_trailers(&answer, "body"), ["x-client: 1", "x-server: yes"]);
    let answer = raw_exchange(sg.addr, request("").as_bytes()).await;
    assert!(!answer.contains("x-te-seen"), "{answer}");
    assert_eq!(chunked_trailers(&answer, "body"), Vec::<String>::new(), "not taken: not sent");
}

/// An HTTP/1.1 server's chunked trailers reach an HTTP/2 client as its trailers and an
/// HTTP/1.1 client that takes them as its last chunk's; an HTTP/2 client's trailers reach
/// the HTTP/1.1 server as the request's last chunk's.
#[tokio::test]
async fn an_http11_servers_trailers_reach_clients_of_both_protocols_and_theirs_reach_it() {
    let backend = StrictBackend::start(|_| {
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
          4\r\nbody\r\n0\r\ngrpc-status: 0\r\nx-up: 1\r\ncontent-length: 4\r\n\r\n"
            .to_vec()
    })
    .await;
    let sg = Sluicegate::start(&format!(
        "listen: 127.0.0.1:0\nupstreams:\n  b: {{ servers: [\"{}\"] }}\nroutes:\n  - upstream: b\n",
        backend.addr
    ));
    let response = post_with_trailers(sg.addr, &[("x-client", "1")]).await;
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().expect("no trailers came");
    assert_eq!(collected.to_bytes(), "body");
    assert_eq!((trailers["grpc-status"].to_str().unwrap(), trailers["x-up"].to_str().unwrap()), ("0", "1"));
    assert!(trailers.get("content-length").is_none(), "{trailers:?}");
    let seen = String::from_utf8(backend.seen()[0].bytes.clone()).unwrap();
    assert!(seen.ends_with("\r\n4\r\nbody\r\n0\r\nx-client: 1\r\n\r\n"), "{seen:?}");

    let request = "GET /t HTTP/1.1\r\nHost: x\r\nTE: trailers\r\nConnection: close\r\n\r\n";
    let answer = raw_exchange(sg.addr, request.as_bytes()).await;
    assert_eq!(chunked_trailers(&answer, "body"), ["grpc-status: 0", "x-up: 1"]);
}

#[tokio::test]
async fn a_grpc_health_check_takes_a_server_that_is_not_serving_out_and_back() {
    use tonic_health::ServingStatus;
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_service_status("", ServingStatus::NotServing).await;
    let server = serve(health, None).await;
    let sg = proxy(server, ", health_check: { grpc_service: \"\", interval: 50ms, timeout: 1s }", FORWARD_ALL);
    let channel = channel(sg.addr, None).await;
    // Out: the proxy answers UNAVAILABLE itself. Serving: the call reaches the server,
    // which has no such method.
    let code = async || call_unary(&channel, msg("", 0, 0)).await.unwrap_err().code();
    wait_until("the server is out", Duration::from_secs(5), async || code().await == Code::Unavailable).await;
    sg.wait_for_log("the line \"health check failed: server out\"", |log| {
        log.contains("health check failed: server out") && log.contains("NOT_SERVING")
    });
    reporter.set_service_status("", ServingStatus::Serving).await;
    wait_until("the server is back", Duration::from_secs(5), async || code().await == Code::Unimplemented).await;
}

/// A server's error as a trailers-only answer (one HEADERS frame with END_STREAM carrying
/// `grpc-status`) reaches the client as one: a head that ends the stream, never a head
/// and then an empty DATA frame with END_STREAM, which grpcio reads as "Stream removed"
/// and answers UNKNOWN. Checked on the wire with hyper's client (the response body is at
/// its end before anything is read of it), beside the server's own answer, with a
/// concurrency slot taken and given back before the head goes out.
#[tokio::test]
async fn a_servers_trailers_only_answer_reaches_the_client_as_a_trailers_only_answer() {
    let seen = Arc::new(Seen::default());
    let server = grpc_server(&seen, None).await;
    let sg =
        proxy(server, "", "limits:\n  one: { key: ip, concurrency: 1 }\nroutes:\n  - { upstream: g, limits: [one] }\n");
    let ask = async |addr: SocketAddr| {
        let response = h2c(addr).await.send_request(grpc_request(addr, &msg("fail", 0, 0), &[])).await.unwrap();
        use hyper::body::Body as _;
        let ended = response.body().is_end_stream();
        let status = response.headers().get("grpc-status").map(|v| v.to_str().unwrap().to_owned());
        let message = response.headers().get("grpc-message").map(|v| v.to_str().unwrap().to_owned());
        (ended, status, message)
    };
    let direct = ask(server).await;
    assert_eq!(direct, (true, Some("5".to_owned()), Some("no%20such%20thing".to_owned())), "the server's own answer");
    for _ in 0..3 {
        assert_eq!(ask(sg.addr).await, direct, "through the proxy, its concurrency slot given back each time");
    }
    // tonic reads it as the server's status too.
    let status = call_unary(&channel(sg.addr, None).await, msg("fail", 0, 0)).await.unwrap_err();
    assert_eq!((status.code(), status.message()), (Code::NotFound, "no such thing"));
}

/// `count_grpc: [UNAUTHENTICATED]` through the proxy: a call that ends `OK` (its status in
/// the trailers) gives its admission back, one that ends `UNAUTHENTICATED` (a
/// trailers-only answer) keeps it; two spent, the next call is refused.
#[tokio::test]
async fn a_limit_counting_grpc_statuses_is_spent_by_unauthenticated_calls_and_given_back_by_ok_ones() {
    let seen = Arc::new(Seen::default());
    let server = grpc_server(&seen, None).await;
    let sg = proxy(
        server,
        "",
        "limits:\n  bad_auth: { key: ip, rate: 1r/m, burst: 1, nodelay: true, count_grpc: [UNAUTHENTICATED] }\nroutes:\n  - { upstream: g, limits: [bad_auth] }\n",
    );
    let channel = channel(sg.addr, None).await;
    for i in 0..5 {
        call_unary(&channel, msg("fine", i, 0)).await.expect("an OK call is given back: 2 a minute pass 5");
    }
    for _ in 0..2 {
        let denied = call_unary(&channel, msg("deny", 0, 0)).await.unwrap_err();
        assert_eq!(denied.code(), Code::Unauthenticated, "{denied:?}");
    }
    let refused = call_unary(&channel, msg("fine", 0, 0)).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "two failed authentications spent the limit: {refused:?}");
}

/// `reply` is an answer sluicegate made itself to a gRPC call: HTTP 200, `content-type:
/// application/grpc`, trailers-only (no body), `grpc-status` `code`.
fn made_here(reply: &Reply, code: &str, what: &str) {
    assert_eq!(reply.status, 200, "{what}: {reply:?}");
    assert_eq!(reply.header("content-type"), Some("application/grpc"), "{what}");
    assert_eq!(reply.header("grpc-status"), Some(code), "{what}: {reply:?}");
    assert!(reply.body.is_empty(), "{what}: trailers-only, no body: {reply:?}");
}

/// README's table of what sluicegate answers a gRPC call itself: a body over
/// `max_body_bytes` and a target over `max_uri_bytes` RESOURCE_EXHAUSTED (8), a body that
/// stops coming DEADLINE_EXCEEDED (4), a bad request (a path above the root)
/// INVALID_ARGUMENT (3).
#[tokio::test]
async fn what_the_proxy_answers_a_grpc_call_itself_is_the_code_of_its_table() {
    let seen = Arc::new(Seen::default());
    let server = grpc_server(&seen, None).await;
    let sg = proxy(
        server,
        "",
        "server: { body_read_timeout: 300ms, max_uri_bytes: 1024 }\nroutes:\n  - { upstream: g, max_body_bytes: 1k }\n",
    );
    let oversize = request_h2(sg.addr, grpc_request(sg.addr, &msg("big", 0, 4096), &[])).await;
    made_here(&oversize, "8", "a body over max_body_bytes");
    let grpc = |path: &str| {
        http::Request::post(format!("http://{}{path}", sg.addr))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(Full::new(framed(&msg("x", 0, 0))))
            .unwrap()
    };
    let long = request_h2(sg.addr, grpc(&format!("/test.Echo/{}", "x".repeat(2000)))).await;
    made_here(&long, "8", "a target over max_uri_bytes");
    let above = request_h2(sg.addr, grpc("/test.Echo/../../x")).await;
    made_here(&above, "3", "a path above the root");
    // A body that stops: five bytes of a message header, then nothing.
    let stream = TcpStream::connect(sg.addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let (mut tx, body) = http_body_util::channel::Channel::<Bytes, Infallible>::new(1);
    let req = http::Request::post(format!("http://{}/test.Echo/Unary", sg.addr))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(body)
        .unwrap();
    let answer = tokio::spawn(async move { read(sender.send_request(req).await.unwrap()).await });
    tx.send_data(Bytes::from_static(&[0, 0, 0, 0, 9])).await.unwrap();
    let slow = tokio::time::timeout(Duration::from_secs(10), answer).await.expect("a stalled body never cut").unwrap();
    made_here(&slow, "4", "a body that stopped");
    drop(tx);
}

/// A call a concurrency limit has no slot for waits in its queue; one the full queue
/// sheds is `RESOURCE_EXHAUSTED` with the queue's pushback; a call cancelled while it
/// waits leaves the queue and never reaches the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_call_cancelled_never_reaches_the_server_and_a_shed_one_is_resource_exhausted() {
    let seen = Arc::new(Seen::default());
    let server = grpc_server(&seen, None).await;
    let sg = proxy(
        server,
        "",
        "admin: { listen: 127.0.0.1:0 }\nlimits:\n  one: { key: ip, concurrency: 1, queue: { max: 1, max_wait: 30s } }\nroutes:\n  - { upstream: g, limits: [one] }\n",
    );
    let channel = channel(sg.addr, None).await;
    let depth = async || Metrics::of(&sg).await.value("sluicegate_limit_queue_depth{limit=\"one\",class=\"\"}");
    let hold = || {
        let channel = channel.clone();
        tokio::spawn(async move { call_unary(&channel, msg("hold", 0, 0)).await })
    };
    let entered = seen.entered.notified();
    let first = hold();
    tokio::time::timeout(Duration::from_secs(5), entered).await.expect("the call never reached the server");
    let waiting = hold();
    wait_until("the second call in the queue", Duration::from_secs(10), async || depth().await == 1.0).await;
    // The queue is full: the third is shed, with the queue's expected wait.
    let shed = call_unary(&channel, msg("x", 0, 0)).await.unwrap_err();
    assert_eq!(shed.code(), Code::ResourceExhausted);
    assert!(shed.metadata().get("grpc-retry-pushback-ms").is_some(), "{:?}", shed.metadata());
    // Cancelled while it waits: out of the queue, and the server never saw it.
    waiting.abort();
    wait_until("the cancelled call out of the queue", Duration::from_secs(10), async || depth().await == 0.0).await;
    let m = Metrics::of(&sg).await;
    assert_eq!(m.value("sluicegate_limit_queue_ended_total{limit=\"one\",class=\"\",end=\"left\"}"), 1.0);
    assert_eq!(m.value("sluicegate_limit_queue_ended_total{limit=\"one\",class=\"\",end=\"full\"}"), 1.0);
    assert_eq!(seen.held.load(SeqCst), 1, "the cancelled call reached the server");
    // The first cancelled too: its slot is free for the next call.
    let gone = seen.entered.notified();
    first.abort();
    tokio::time::timeout(Duration::from_secs(5), gone).await.expect("the upstream call was not cancelled");
    wait_until("the slot back", Duration::from_secs(10), async || call_unary(&channel, msg("x", 0, 0)).await.is_ok())
        .await;
}
