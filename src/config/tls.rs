//! A listener's `tls:` settings, and the rustls server configuration built from them.
//!
//! `server_config` reads the certificate and key files and builds the rustls
//! `ServerConfig`; the configuration load calls it so that `check` reports unreadable
//! files and mismatched keys at their setting, and a reload of the configuration would
//! call it again to pick up renewed certificates.

use std::fmt;
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::checks::Errors;
use super::raw::RawTls;

/// What a listener's `tls:` says, its files read and checked.
pub struct Tls {
    pub server_config: Arc<ServerConfig>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Tls { .. }")
    }
}

/// One certificate chain and its key, and the server names it is chosen for (SNI).
struct Certificate {
    names: Vec<String>,
    key: Arc<CertifiedKey>,
}

/// Checks `raw` (at field path `at`) and builds its rustls configuration; `None` with
/// every problem recorded.
pub(super) fn tls(e: &mut Errors<'_>, at: &str, raw: &RawTls) -> Option<Tls> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions: &[&rustls::SupportedProtocolVersion] = match raw.min_version.as_deref() {
        None | Some("1.2") => &[&rustls::version::TLS13, &rustls::version::TLS12],
        Some("1.3") => &[&rustls::version::TLS13],
        Some(other) => {
            e.add(format!("{at}.min_version"), format!("must be \"1.2\" or \"1.3\", not {other:?}"));
            return None;
        }
    };
    let mut certificates = Vec::new();
    let mut ok = true;
    match (&raw.cert, &raw.key, raw.certificates.is_empty()) {
        (Some(cert), Some(key), true) => match certified_key(cert, key, &provider) {
            Ok(key) => {
                warn_if_expired(e, &format!("{at}.cert"), cert, &key);
                certificates.push(Certificate { names: Vec::new(), key });
            }
            Err((field, message)) => {
                e.add(format!("{at}.{field}"), message);
                ok = false;
            }
        },
        (None, None, false) => {
            for (i, c) in raw.certificates.iter().enumerate() {
                if c.names.is_empty() {
                    e.add(format!("{at}.certificates[{i}].names"), "list the server names this certificate is for");
                    ok = false;
                }
                match certified_key(&c.cert, &c.key, &provider) {
                    Ok(key) => {
                        warn_if_expired(e, &format!("{at}.certificates[{i}].cert"), &c.cert, &key);
                        let names = c.names.iter().map(|n| n.trim_end_matches('.').to_ascii_lowercase()).collect();
                        certificates.push(Certificate { names, key });
                    }
                    Err((field, message)) => {
                        e.add(format!("{at}.certificates[{i}].{field}"), message);
                        ok = false;
                    }
                }
            }
        }
        (Some(_), None, true) => return missing(e, at, "key"),
        (None, Some(_), true) => return missing(e, at, "cert"),
        _ => {
            e.add(at.to_owned(), "give either `cert` and `key`, or `certificates: [{cert, key, names}]`");
            return None;
        }
    }
    if !ok {
        return None;
    }
    let builder = ServerConfig::builder_with_provider(provider).with_protocol_versions(versions);
    let builder = match builder {
        Ok(builder) => builder,
        Err(err) => {
            e.add(format!("{at}.min_version"), err.to_string());
            return None;
        }
    };
    let mut config = builder.with_no_client_auth().with_cert_resolver(Arc::new(BySni(certificates)));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Some(Tls { server_config: Arc::new(config) })
}

fn missing(e: &mut Errors<'_>, at: &str, field: &str) -> Option<Tls> {
    e.add(format!("{at}.{field}"), format!("`cert` and `key` go together; `{field}` is missing"));
    None
}

/// The chain in `cert` and the key in `key`, checked to belong together. An error names
/// the field (`cert` or `key`) it concerns.
fn certified_key(
    cert: &str,
    key: &str,
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, (&'static str, String)> {
    let chain_pem = super::files::read_regular(cert).map_err(|m| ("cert", m))?;
    let chain = CertificateDer::pem_slice_iter(&chain_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| ("cert", format!("{cert:?}: not a PEM certificate chain ({err})")))?;
    if chain.is_empty() {
        return Err(("cert", format!("{cert:?} holds no PEM certificate")));
    }
    let key_pem = super::files::read_regular(key).map_err(|m| ("key", m))?;
    let der = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|err| ("key", format!("{key:?}: no PEM private key ({err})")))?;
    let signing = provider
        .key_provider
        .load_private_key(der)
        .map_err(|err| ("key", format!("{key:?}: unusable private key ({err})")))?;
    let certified = CertifiedKey::new(chain, signing);
    certified.keys_match().map_err(|_| ("key", format!("{key:?} is not the key of the certificate in {cert:?}")))?;
    Ok(Arc::new(certified))
}

/// An expired (or not yet valid) leaf certificate is a warning, not an error: the
/// proxy still starts and serves its other listeners and routes, as nginx does.
fn warn_if_expired(e: &mut Errors<'_>, at: &str, file: &str, key: &CertifiedKey) {
    let Some(leaf) = key.cert.first() else { return };
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(leaf) else { return };
    let validity = parsed.validity();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let now = i64::try_from(now).unwrap_or(i64::MAX);
    if validity.not_after.timestamp() < now {
        e.warn(at.to_owned(), format!("the certificate in {file:?} expired on {}", validity.not_after));
    } else if validity.not_before.timestamp() > now {
        e.warn(at.to_owned(), format!("the certificate in {file:?} is not valid before {}", validity.not_before));
    }
}

/// Picks the certificate for the name a client asks for (SNI): an exact name, then a
/// `*.example.com` wildcard one level deep, else the first certificate (clients that
/// send no SNI, or a name no certificate lists). Hand-written: rustls's own
/// `ResolvesServerCertUsingSni` has neither wildcards nor a default.
#[derive(Debug)]
struct BySni(Vec<Certificate>);

impl fmt::Debug for Certificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Certificate").field("names", &self.names).finish_non_exhaustive()
    }
}

impl ResolvesServerCert for BySni {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let first = self.0.first().map(|c| Arc::clone(&c.key));
        let Some(name) = hello.server_name().map(str::to_ascii_lowercase) else { return first };
        let wildcard = name.split_once('.').map(|(_, parent)| format!("*.{parent}"));
        let find = |wanted: &str| self.0.iter().find(|c| c.names.iter().any(|n| n == wanted));
        find(&name).or_else(|| wildcard.as_deref().and_then(find)).map(|c| Arc::clone(&c.key)).or(first)
    }
}
