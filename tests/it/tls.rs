//! TLS termination against certificates made at test time by a private CA: SNI picks
//! the certificate, ALPN offers h2 and http/1.1, TLS 1.1 is refused, a client that
//! never starts its handshake is closed, `check` names bad files at their setting.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::common::*;

/// A private CA and two server certificates it signed, as PEM files in `dir`.
struct Pki {
    dir: tempfile::TempDir,
    issuer: CertifiedIssuer<'static, KeyPair>,
    ca: CertificateDer<'static>,
    /// The DER of the certificates for `a.test` and `*.b.test`.
    a: CertificateDer<'static>,
    b: CertificateDer<'static>,
}

impl Pki {
    fn new() -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let placeholder = issuer.der().clone();
        let mut pki = Pki { ca: issuer.der().clone(), a: placeholder.clone(), b: placeholder, dir, issuer };
        pki.a = pki.issue("a.test", "a");
        pki.b = pki.issue("*.b.test", "b");
        pki
    }

    /// A new certificate for `name` in `file.crt` and `file.key`; its DER.
    fn issue(&self, name: &str, file: &str) -> CertificateDer<'static> {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_owned()]).unwrap().signed_by(&key, &self.issuer).unwrap();
        std::fs::write(self.path(&format!("{file}.crt")), cert.pem()).unwrap();
        std::fs::write(self.path(&format!("{file}.key")), key.serialize_pem()).unwrap();
        cert.der().clone()
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// A plain listener first (the one `Sluicegate::start` reports), then a TLS one
    /// choosing between both certificates by SNI.
    fn config(&self, backend: SocketAddr, extra: &str) -> String {
        let p = |f: &str| self.path(f).display().to_string();
        format!(
            "listen:\n  - 127.0.0.1:0\n  - address: 127.0.0.1:0\n    tls:\n      certificates:\n        - {{ cert: {}, key: {}, names: [a.test] }}\n        - {{ cert: {}, key: {}, names: [\"*.b.test\"] }}\n{extra}upstreams:\n  app: {{ servers: [\"{backend}\"] }}\nroutes:\n  - upstream: app\n",
            p("a.crt"),
            p("a.key"),
            p("b.crt"),
            p("b.key"),
        )
    }

    fn connector(&self, alpn: &[&[u8]]) -> TlsConnector {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.clone()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        TlsConnector::from(Arc::new(config))
    }
}

/// The address of the TLS listener, from the log.
fn tls_addr(sg: &Sluicegate) -> SocketAddr {
    let log = sg.wait_for_log("the line \"listening\"", |log| {
        log.lines().any(|l| l.contains("\"listening\"") && l.contains("\"tls\":true"))
    });
    let line =
        log.lines().find(|l| l.contains("\"listening\"") && l.contains("\"tls\":true")).expect("no TLS listener");
    let json: serde_json::Value = serde_json::from_str(line).unwrap();
    json["fields"]["addr"].as_str().unwrap().parse().unwrap()
}

async fn handshake(pki: &Pki, addr: SocketAddr, name: &str, alpn: &[&[u8]]) -> TlsStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from(name.to_owned()).unwrap();
    pki.connector(alpn).connect(name, tcp).await.unwrap()
}

fn get_request() -> Request<Full<Bytes>> {
    Request::get("https://a.test/x").header("host", "a.test").body(Full::new(Bytes::new())).unwrap()
}

#[tokio::test]
async fn sni_chooses_the_certificate_and_http1_is_served_with_forwarded_proto_https() {
    let pki = Pki::new();
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&pki.config(backend.addr, ""));
    let addr = tls_addr(&sg);
    for (name, want) in [("a.test", &pki.a), ("www.b.test", &pki.b)] {
        let tls = handshake(&pki, addr, name, &[b"http/1.1"]).await;
        assert_eq!(tls.get_ref().1.peer_certificates().unwrap()[0], *want, "certificate for {name}");
    }
    let tls = handshake(&pki, addr, "a.test", &[b"http/1.1"]).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.unwrap();
    tokio::spawn(conn);
    let r = read(sender.send_request(get_request()).await.unwrap()).await;
    assert_eq!((r.status, r.text().as_str()), (200, "ok"));
    assert_eq!(backend.hits()[0].headers["x-forwarded-proto"], "https");
    // The plain listener of the same proxy still says http.
    assert_eq!(get(sg.addr, "/x", &[]).await.status, 200);
    assert_eq!(backend.hits()[1].headers["x-forwarded-proto"], "http");
}

#[tokio::test]
async fn a_reload_serves_renewed_certificates_to_new_connections_and_keeps_old_ones() {
    let pki = Pki::new();
    let backend = Backend::start().await;
    let yaml = pki.config(backend.addr, "");
    let sg = Sluicegate::start(&yaml);
    let addr = tls_addr(&sg);
    let old = handshake(&pki, addr, "a.test", &[b"http/1.1"]).await;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(old)).await.unwrap();
    tokio::spawn(conn);
    let renewed = pki.issue("a.test", "a");
    assert_ne!(renewed, pki.a);
    let log = sg.reload(&yaml);
    assert!(log.contains("configuration reloaded"), "{log}");
    let tls = handshake(&pki, addr, "a.test", &[b"http/1.1"]).await;
    assert_eq!(tls.get_ref().1.peer_certificates().unwrap()[0], renewed);
    // The connection made before the reload goes on.
    assert_eq!(read(sender.send_request(get_request()).await.unwrap()).await.status, 200);
}

#[tokio::test]
async fn http2_is_chosen_by_alpn() {
    let pki = Pki::new();
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&pki.config(backend.addr, ""));
    let tls = handshake(&pki, tls_addr(&sg), "a.test", &[b"h2", b"http/1.1"]).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await.unwrap();
    tokio::spawn(conn);
    let response = sender.send_request(get_request()).await.unwrap();
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(read(response).await.text(), "ok");
}

/// `openssl s_client` with `args` against `addr`: whether the handshake succeeded, and
/// what it printed.
fn s_client(addr: SocketAddr, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new("openssl")
        .args(["s_client", "-connect", &addr.to_string(), "-servername", "a.test"])
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("openssl must be installed (.ci/run installs it)");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[tokio::test]
async fn a_client_offering_only_tls_1_1_is_refused() {
    let pki = Pki::new();
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&pki.config(backend.addr, ""));
    let addr = tls_addr(&sg);
    // SECLEVEL=0 lets this openssl offer TLS 1.1 at all; the same client gets TLS 1.2.
    let (ok, text) = tokio::task::spawn_blocking(move || s_client(addr, &["-tls1_2"])).await.unwrap();
    assert!(ok && text.contains("TLSv1.2"), "{text}");
    let legacy = ["-tls1_1", "-cipher", "DEFAULT@SECLEVEL=0"];
    let (ok, text) = tokio::task::spawn_blocking(move || s_client(addr, &legacy)).await.unwrap();
    assert!(!ok, "TLS 1.1 accepted:\n{text}");
    // rustls answers with a handshake_failure alert; no certificate was ever sent.
    assert!(text.contains("alert handshake failure") && text.contains("no peer certificate available"), "{text}");
}

#[tokio::test]
async fn min_version_1_3_refuses_a_tls_1_2_client() {
    let pki = Pki::new();
    let backend = Backend::start().await;
    let yaml = pki
        .config(backend.addr, "")
        .replace("    tls:\n      certificates:", "    tls:\n      min_version: \"1.3\"\n      certificates:");
    assert!(yaml.contains("min_version"));
    let sg = Sluicegate::start(&yaml);
    let addr = tls_addr(&sg);
    let (ok, text) = tokio::task::spawn_blocking(move || s_client(addr, &["-tls1_2"])).await.unwrap();
    assert!(!ok && text.contains("no peer certificate available"), "TLS 1.2 accepted:\n{text}");
    let (ok, text) = tokio::task::spawn_blocking(move || s_client(addr, &["-tls1_3"])).await.unwrap();
    assert!(ok && text.contains("TLSv1.3"), "{text}");
}

#[tokio::test]
async fn a_client_that_never_sends_its_hello_is_closed_after_header_read_timeout() {
    let pki = Pki::new();
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&pki.config(backend.addr, "server: { header_read_timeout: 500ms }\n"));
    let mut tcp = TcpStream::connect(tls_addr(&sg)).await.unwrap();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "connection left open: {read:?}");
}

fn check(yaml: &str) -> String {
    let (_dir, path) = config_file(yaml);
    let out = binary().arg("check").arg("-c").arg(&path).output().unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn check_names_an_unreadable_file_and_a_key_of_another_certificate() {
    let pki = Pki::new();
    let p = |f: &str| pki.path(f).display().to_string();
    let listen = |cert: &str, key: &str| {
        format!(
            "listen:\n  - address: 127.0.0.1:0\n    tls: {{ cert: {cert}, key: {key} }}\nroutes:\n  - respond: {{}}\n"
        )
    };
    let missing = check(&listen(&p("nope.crt"), &p("a.key")));
    assert!(missing.contains(":3:") && missing.contains("listen[0].tls.cert: cannot read"), "{missing}");
    let mismatched = check(&listen(&p("a.crt"), &p("b.key")));
    assert!(mismatched.contains("listen[0].tls.key:") && mismatched.contains("is not the key of"), "{mismatched}");
    let bad_version =
        check(&listen(&p("a.crt"), &p("a.key")).replace(" }\nroutes", ", min_version: \"1.1\" }\nroutes"));
    assert!(bad_version.contains("listen[0].tls.min_version: must be"), "{bad_version}");
}

#[test]
fn check_warns_of_an_expired_certificate_and_accepts_the_file() {
    let pki = Pki::new();
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["old.test".to_owned()]).unwrap();
    params.not_before = rcgen::date_time_ymd(2019, 1, 1);
    params.not_after = rcgen::date_time_ymd(2020, 1, 1);
    let cert = params.signed_by(&key, &pki.issuer).unwrap();
    std::fs::write(pki.path("old.crt"), cert.pem()).unwrap();
    std::fs::write(pki.path("old.key"), key.serialize_pem()).unwrap();
    let (cert, key) = (pki.path("old.crt").display().to_string(), pki.path("old.key").display().to_string());
    let yaml = format!(
        "listen:\n  - address: 127.0.0.1:0\n    tls: {{ cert: {cert}, key: {key} }}\nroutes:\n  - respond: {{}}\n"
    );
    let (_dir, path) = config_file(&yaml);
    let out = binary().arg("check").arg("-c").arg(&path).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("warning: ") && stderr.contains(":3:"), "{stderr}");
    assert!(stderr.contains("listen[0].tls.cert: the certificate in") && stderr.contains("expired on"), "{stderr}");
}
