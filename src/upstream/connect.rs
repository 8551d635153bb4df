//! Connections to an upstream's servers: TCP for `http://`, TCP then TLS (rustls) for
//! `https://`, with ALPN telling the server which HTTP version we speak, both within the
//! upstream's `connect_timeout`.
//!
//! Hand-written over `tokio` and `tokio-rustls` rather than taken from a connector crate:
//! the upstream's own verifier, SNI override and connect timeout fit in these few lines,
//! and servers are addresses already (`resolve` looks names up).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::uri::Authority;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::servers::TlsNames;
use crate::config::{Upstream, UpstreamTls};

/// Makes connections for the pool of one upstream.
#[derive(Clone)]
pub struct Connector {
    tls: TlsConnector,
    /// The name each server is verified by (a connection goes to its resolved address).
    names: TlsNames,
    timeout: Duration,
}

impl Connector {
    pub fn new(upstream: &Upstream, names: TlsNames) -> Self {
        Connector {
            tls: TlsConnector::from(Arc::new(client_config(&upstream.tls, upstream.http2))),
            names,
            timeout: upstream.connect_timeout,
        }
    }

    /// A connection to `server` (an address: IP and port), over TLS when `tls`.
    pub async fn connect(&self, server: &Authority, tls: bool) -> io::Result<UpstreamIo> {
        tokio::time::timeout(self.timeout, self.connect_now(server, tls))
            .await
            .unwrap_or_else(|_| Err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out")))
    }

    async fn connect_now(&self, server: &Authority, tls: bool) -> io::Result<UpstreamIo> {
        let tcp = match server.as_str().parse::<SocketAddr>() {
            Ok(address) => TcpStream::connect(address).await?,
            // A name written as is (a link-local address with its zone): the resolver's.
            Err(_) => TcpStream::connect(server.as_str()).await?,
        };
        tcp.set_nodelay(true)?;
        if !tls {
            return Ok(UpstreamIo::Plain(tcp));
        }
        let name = match self.names.of(server) {
            Some(name) => name,
            None => ServerName::try_from(server.host().trim_matches(['[', ']']).to_owned())
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
        };
        Ok(UpstreamIo::Tls(Box::new(self.tls.connect(name, tcp).await?)))
    }
}

/// A connection to a server, plain or TLS.
pub enum UpstreamIo {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for UpstreamIo {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(io) => Pin::new(io).poll_read(cx, buf),
            UpstreamIo::Tls(io) => Pin::new(io.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpstreamIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamIo::Plain(io) => Pin::new(io).poll_write(cx, buf),
            UpstreamIo::Tls(io) => Pin::new(io.as_mut()).poll_write(cx, buf),
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

    fn is_write_vectored(&self) -> bool {
        match self {
            UpstreamIo::Plain(io) => io.is_write_vectored(),
            UpstreamIo::Tls(io) => io.is_write_vectored(),
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
