//! Connections to an upstream's servers: TCP for `http://`, TCP then TLS (rustls) for
//! `https://`, with ALPN telling the client which HTTP version to speak.
//!
//! Hand-written over `tokio-rustls` rather than taken from `hyper-rustls`: the upstream's
//! own verifier, SNI override and connect timeout fit in these few lines.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use http::uri::Scheme;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::servers::TlsNames;
use crate::config::{Upstream, UpstreamTls};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Makes connections for the pooled client of one upstream.
#[derive(Clone)]
pub struct Connector {
    tcp: HttpConnector,
    tls: TlsConnector,
    /// The name each server is verified by (a URI names the resolved address).
    names: TlsNames,
    /// The TLS handshake's share of `connect_timeout` is bounded by it too.
    timeout: Duration,
}

impl Connector {
    pub fn new(upstream: &Upstream, names: TlsNames) -> Self {
        let mut tcp = HttpConnector::new();
        tcp.set_connect_timeout(Some(upstream.connect_timeout));
        tcp.set_nodelay(true);
        // `https://` targets are ours to wrap in TLS.
        tcp.enforce_http(false);
        Connector {
            tcp,
            tls: TlsConnector::from(Arc::new(client_config(&upstream.tls, upstream.http2))),
            names,
            timeout: upstream.connect_timeout,
        }
    }
}

fn client_config(tls: &UpstreamTls, http2: bool) -> ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions");
    let mut config = if tls.verify {
        let mut roots = RootCertStore::empty();
        match &tls.roots {
            // Each was parsed at load; one rustls cannot use fails every handshake, loudly.
            Some(certs) => _ = roots.add_parsable_certificates(certs.iter().cloned()),
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    } else {
        builder.dangerous().with_custom_certificate_verifier(Arc::new(AcceptAny(provider))).with_no_client_auth()
    };
    config.alpn_protocols = vec![if http2 { b"h2".to_vec() } else { b"http/1.1".to_vec() }];
    config
}

impl tower_service::Service<Uri> for Connector {
    type Response = UpstreamIo;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<UpstreamIo, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.tcp.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let tls = uri.scheme() == Some(&Scheme::HTTPS);
        let connecting = self.tcp.call(uri.clone());
        let sni = uri.authority().and_then(|a| self.names.of(a));
        let (connector, timeout) = (self.tls.clone(), self.timeout);
        Box::pin(async move {
            let tcp = connecting.await?;
            if !tls {
                return Ok(UpstreamIo::Plain(tcp));
            }
            let name = match sni {
                Some(name) => name,
                None => ServerName::try_from(uri.host().unwrap_or_default().trim_matches(['[', ']']).to_owned())?,
            };
            let handshake = connector.connect(name, tcp.into_inner());
            let stream = tokio::time::timeout(timeout, handshake)
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))??;
            Ok(UpstreamIo::Tls(Box::new(TokioIo::new(stream))))
        })
    }
}

/// A connection to a server, plain or TLS.
pub enum UpstreamIo {
    Plain(TokioIo<TcpStream>),
    Tls(Box<TokioIo<TlsStream<TcpStream>>>),
}

impl Connection for UpstreamIo {
    fn connected(&self) -> Connected {
        match self {
            UpstreamIo::Plain(io) => io.connected(),
            UpstreamIo::Tls(io) => {
                let (tcp, session) = io.inner().get_ref();
                let connected = tcp.connected();
                if session.alpn_protocol() == Some(b"h2") { connected.negotiated_h2() } else { connected }
            }
        }
    }
}

impl Read for UpstreamIo {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: ReadBufCursor<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(io) => Pin::new(io).poll_read(cx, buf),
            UpstreamIo::Tls(io) => Pin::new(io.as_mut()).poll_read(cx, buf),
        }
    }
}

impl Write for UpstreamIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamIo::Plain(io) => Pin::new(io).poll_write(cx, buf),
            UpstreamIo::Tls(io) => Pin::new(io.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(io) => Pin::new(io).poll_flush(cx),
            UpstreamIo::Tls(io) => Pin::new(io.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(io) => Pin::new(io).poll_shutdown(cx),
            UpstreamIo::Tls(io) => Pin::new(io.as_mut()).poll_shutdown(cx),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            UpstreamIo::Plain(io) => io.is_write_vectored(),
            UpstreamIo::Tls(io) => io.is_write_vectored(),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamIo::Plain(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            UpstreamIo::Tls(io) => Pin::new(io.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
}

/// `verify: false`: every certificate is accepted (signatures are still checked, so the
/// handshake is well-formed). For tests against self-signed servers only.
#[derive(Debug)]
struct AcceptAny(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
