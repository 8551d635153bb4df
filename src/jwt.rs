//! Verified JSON Web Tokens (RFC 7519): what `jwt:CLAIM` key parts and `claims:`
//! matches read. A token counts only once its signature verifies with a configured key
//! (a secret, PEM keys or a JWKS) and its times, issuer and audience hold: an unverified
//! claim is whatever the client writes, a fresh key per request.
//!
//! Verification is the cryptography of `jsonwebtoken`; what it costs per request is
//! spent once per token: a verified token's claims are kept until it expires (a bounded
//! table; a kept token is verified again once the fetched keys change).
//!
//! Keys come from the configuration (a secret, a keys file), read at every load, and from
//! a JWKS URL (`RemoteKeys`), which `jwks` fetches in the background and keeps across
//! reloads.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use arc_swap::ArcSwap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::Notify;

use http::HeaderName;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation, errors::ErrorKind};

use crate::policy::key::{Claims, bearer, cookies};
use crate::wire::head::{Fields, Known};

/// Where a request carries its token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenField {
    /// `Authorization: Bearer TOKEN` (the default).
    Bearer,
    /// The whole value of a header.
    Header(HeaderName),
    /// The value of a cookie.
    Cookie(Box<str>),
}

/// Why a request's token was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the request carries more than one token")]
    Repeated,
    #[error("the token is not a JSON Web Token")]
    Malformed,
    #[error("the token's key (kid {0:?}) is not one of the configured keys")]
    UnknownKey(String),
    #[error("the token is signed with an algorithm no configured key verifies")]
    Algorithm,
    #[error("the token's signature does not verify")]
    Signature,
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet")]
    NotYetValid,
    #[error("the token lacks the claim `{0}`")]
    MissingClaim(String),
    #[error("the token's issuer is not the configured one")]
    Issuer,
    #[error("the token's audience is not the configured one")]
    Audience,
}

/// Whether the header of `token` names an algorithm no key can have (`none`, `HS1`):
/// such a token is refused for its algorithm, which is what it tries, not counted as
/// malformed.
fn names_an_unknown_algorithm(token: &str) -> bool {
    use base64::Engine;
    let head = token.split('.').next().unwrap_or_default();
    let Ok(json) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(head.trim_end_matches('=')) else {
        return false;
    };
    let Ok(header) = serde_json::from_slice::<serde_json::Value>(&json) else { return false };
    header.get("alg").and_then(serde_json::Value::as_str).is_some_and(|alg| alg.parse::<Algorithm>().is_err())
}

impl TokenError {
    /// A short word for metrics and log fields.
    pub fn reason(&self) -> &'static str {
        match self {
            TokenError::Repeated => "repeated",
            TokenError::Malformed => "malformed",
            TokenError::UnknownKey(_) => "unknown_key",
            TokenError::Algorithm => "algorithm",
            TokenError::Signature => "signature",
            TokenError::Expired => "expired",
            TokenError::NotYetValid => "not_yet_valid",
            TokenError::MissingClaim(_) => "missing_claim",
            TokenError::Issuer => "issuer",
            TokenError::Audience => "audience",
        }
    }

    fn of(kind: &ErrorKind) -> TokenError {
        match kind {
            ErrorKind::InvalidSignature => TokenError::Signature,
            ErrorKind::ExpiredSignature => TokenError::Expired,
            ErrorKind::ImmatureSignature => TokenError::NotYetValid,
            ErrorKind::InvalidIssuer => TokenError::Issuer,
            ErrorKind::InvalidAudience => TokenError::Audience,
            ErrorKind::MissingRequiredClaim(claim) => TokenError::MissingClaim(claim.clone()),
            ErrorKind::InvalidAlgorithm | ErrorKind::MissingAlgorithm | ErrorKind::InvalidAlgorithmName => {
                TokenError::Algorithm
            }
            // A key the token's header does not fit (an RSA modulus too short, an
            // EC point off the curve) is a signature that does not verify.
            ErrorKind::InvalidEcdsaKey | ErrorKind::InvalidRsaKey(_) | ErrorKind::Crypto(_) => TokenError::Signature,
            _ => TokenError::Malformed,
        }
    }
}

/// One key tokens may be signed with, and the validation that goes with it (the
/// algorithms of its family, the configured times, issuer and audience).
pub struct VerifyingKey {
    /// The JWKS `kid`, if the key has one: a token naming a `kid` is verified by that
    /// key only.
    pub kid: Option<String>,
    key: DecodingKey,
    validation: Validation,
}

impl fmt::Debug for VerifyingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerifyingKey").field("kid", &self.kid).field("algorithms", &self.validation.algorithms).finish()
    }
}

/// What every token must satisfy besides its signature.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checks {
    /// Accepted `iss` values (empty: any).
    pub issuers: Vec<String>,
    /// Accepted `aud` values (empty: `aud` not checked).
    pub audiences: Vec<String>,
    /// Clock skew allowed on `exp` and `nbf`.
    pub leeway: Duration,
}

impl Checks {
    fn validation(&self, algorithms: &[Algorithm]) -> Validation {
        let mut v = Validation::new(algorithms[0]);
        v.algorithms = algorithms.to_vec();
        // `exp` is required (a token without it would never expire), but the times are
        // checked by `Verifier::verify`, against the clock it is given.
        v.validate_exp = false;
        v.validate_nbf = false;
        // A claim that is checked is required: a token without `aud` (or with `"aud":
        // null`) was minted for no service in particular, maybe another one of the same
        // issuer, and must not count here (RFC 7519 §4.1.3: a principal that does not
        // identify itself in `aud` rejects the token when `aud` is present; we go further
        // and require it when an audience is configured).
        let mut required = vec!["exp"];
        v.validate_aud = !self.audiences.is_empty();
        if !self.audiences.is_empty() {
            v.set_audience(&self.audiences);
            required.push("aud");
        }
        if !self.issuers.is_empty() {
            v.set_issuer(&self.issuers);
            required.push("iss");
        }
        v.set_required_spec_claims(&required);
        v
    }
}

const HMAC: [Algorithm; 3] = [Algorithm::HS256, Algorithm::HS384, Algorithm::HS512];
const RSA: [Algorithm; 6] =
    [Algorithm::RS256, Algorithm::RS384, Algorithm::RS512, Algorithm::PS256, Algorithm::PS384, Algorithm::PS512];
const EC: [Algorithm; 2] = [Algorithm::ES256, Algorithm::ES384];
const ED: [Algorithm; 1] = [Algorithm::EdDSA];

impl VerifyingKey {
    /// A shared secret (HS256, HS384, HS512).
    pub fn secret(secret: &[u8], checks: &Checks) -> VerifyingKey {
        VerifyingKey { kid: None, key: DecodingKey::from_secret(secret), validation: checks.validation(&HMAC) }
    }

    /// The public keys of `text`: a JWKS (`{"keys": [...]}`) or PEM public keys (RSA, EC
    /// or Ed25519, one or more blocks).
    pub fn parse(text: &str, checks: &Checks) -> Result<Vec<VerifyingKey>, String> {
        if text.trim_start().starts_with('{') {
            let set: JwkSet = serde_json::from_str(text).map_err(|e| format!("not a JWKS: {e}"))?;
            return VerifyingKey::of_jwks(&set, checks);
        }
        let blocks: Vec<&str> = text.split_inclusive("-----END ").collect();
        let mut keys = Vec::new();
        for (i, block) in blocks.iter().enumerate() {
            let Some(start) = block.find("-----BEGIN ") else { continue };
            // The END line's label, which `split_inclusive` left in the next piece.
            let label_end = blocks.get(i + 1).and_then(|next| next.find('\n')).unwrap_or(0);
            let pem = format!("{}{}", &block[start..], blocks.get(i + 1).map_or("", |next| &next[..label_end]));
            keys.push(VerifyingKey::of_pem(pem.as_bytes(), checks)?);
        }
        if keys.is_empty() {
            return Err("holds no PEM public key and is not a JWKS".into());
        }
        Ok(keys)
    }

    fn of_pem(pem: &[u8], checks: &Checks) -> Result<VerifyingKey, String> {
        let found = [
            (DecodingKey::from_rsa_pem(pem), &RSA[..]),
            (DecodingKey::from_ec_pem(pem), &EC[..]),
            (DecodingKey::from_ed_pem(pem), &ED[..]),
        ]
        .into_iter()
        .find_map(|(key, algorithms)| Some((key.ok()?, algorithms)));
        let (key, algorithms) = found.ok_or("a PEM block is not a public key of RSA, EC (P-256, P-384) or Ed25519")?;
        Ok(VerifyingKey { kid: None, key, validation: checks.validation(algorithms) })
    }

    /// The keys of a JWKS; a key whose `alg` is given verifies that algorithm only.
    pub fn of_jwks(set: &JwkSet, checks: &Checks) -> Result<Vec<VerifyingKey>, String> {
        use jsonwebtoken::jwk::AlgorithmParameters as P;
        let mut keys = Vec::new();
        for (i, jwk) in set.keys.iter().enumerate() {
            let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("key {i} of the JWKS: {e}"))?;
            let family: &[Algorithm] = match jwk.algorithm {
                P::RSA(_) => &RSA,
                P::EllipticCurve(_) => &EC,
                P::OctetKeyPair(_) => &ED,
                P::OctetKey(_) => &HMAC,
            };
            let named = jwk.common.key_algorithm.and_then(|a| a.to_string().parse::<Algorithm>().ok());
            let algorithms = match named {
                Some(alg) if family.contains(&alg) => vec![alg],
                Some(alg) => return Err(format!("key {i} of the JWKS: alg {alg:?} does not fit its key type")),
                None => family.to_vec(),
            };
            keys.push(VerifyingKey { kid: jwk.common.key_id.clone(), key, validation: checks.validation(&algorithms) });
        }
        Ok(keys)
    }
}

/// Whether a token that names a key the fetched set lacks may wake a fetch of the set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fetch {
    /// A request on the wire: the key server may hold a key made since the last fetch.
    Wake,
    /// A request explained (`explain`, `POST /explain`): explaining spends nothing, the
    /// key server's attention included, so a made-up `kid` asked about sends no fetch.
    Never,
}

/// Verified tokens kept, at most; past it the table is emptied of expired tokens, then
/// of all.
const CACHED_TOKENS: usize = 10_000;

/// A verified token's claims and the times it holds between.
struct Verified {
    claims: Arc<Claims>,
    /// The fetched keys' generation it was verified under.
    generation: u64,
    /// `nbf` and `exp` in Unix seconds, with the leeway applied.
    from: u64,
    until: u64,
}

/// The keys tokens are verified with, where requests carry them, and the tokens verified
/// so far.
#[derive(Debug)]
pub struct Verifier {
    field: TokenField,
    pub checks: Checks,
    keys: Vec<VerifyingKey>,
    /// The keys of `jwt.jwks_url`, once `jwks` attached them.
    remote: OnceLock<Arc<RemoteKeys>>,
    verified: Mutex<HashMap<Box<[u8]>, Verified>>,
}

/// The keys of a JWKS URL as last fetched, shared by the configurations that name it.
#[derive(Debug)]
pub struct RemoteKeys {
    /// The URL, as written.
    pub url: String,
    /// What the keys' validations check: a configuration that checks otherwise fetches
    /// its own.
    pub checks: Checks,
    keys: ArcSwap<Vec<VerifyingKey>>,
    /// Bumped by every change of `keys`.
    generation: AtomicU64,
    /// Woken when a token names a key the set lacks, or when these keys are dropped.
    pub wanted: Arc<Notify>,
}

impl RemoteKeys {
    pub fn new(url: &str, checks: &Checks) -> RemoteKeys {
        RemoteKeys {
            url: url.to_owned(),
            checks: checks.clone(),
            keys: ArcSwap::from_pointee(Vec::new()),
            generation: AtomicU64::new(0),
            wanted: Arc::new(Notify::new()),
        }
    }

    /// Replaces the keys with those of the JWKS `text`; how many there are now.
    pub fn set(&self, text: &str) -> Result<usize, String> {
        let set: JwkSet = serde_json::from_str(text).map_err(|e| format!("not a JWKS: {e}"))?;
        let keys = VerifyingKey::of_jwks(&set, &self.checks)?;
        let count = keys.len();
        self.keys.store(Arc::new(keys));
        self.generation.fetch_add(1, Ordering::Release);
        Ok(count)
    }
}

impl Drop for RemoteKeys {
    fn drop(&mut self) {
        // Its fetcher wakes, finds it gone and ends.
        self.wanted.notify_one();
    }
}

impl Verified {
    /// Its claims if it holds at `now`.
    fn at(&self, now: u64) -> Result<Arc<Claims>, TokenError> {
        if now < self.from {
            Err(TokenError::NotYetValid)
        } else if now > self.until {
            Err(TokenError::Expired)
        } else {
            Ok(self.claims.clone())
        }
    }
}

impl fmt::Debug for Verified {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verified").field("from", &self.from).field("until", &self.until).finish()
    }
}

impl Verifier {
    pub fn new(field: TokenField, checks: Checks, keys: Vec<VerifyingKey>) -> Verifier {
        Verifier { field, checks, keys, remote: OnceLock::new(), verified: Mutex::new(HashMap::new()) }
    }

    /// Verifies with `remote`'s keys as well (once: later calls change nothing).
    pub fn attach(&self, remote: Arc<RemoteKeys>) {
        let _ = self.remote.set(remote);
    }

    /// The keys of the JWKS URL it verifies with, once attached.
    pub fn remote(&self) -> Option<&Arc<RemoteKeys>> {
        self.remote.get()
    }

    /// The request's token (`None`: it carries none), or why it cannot be taken. A token
    /// carried twice is refused: the upstream may read the other one.
    pub fn token<'f>(&self, fields: Fields<'f>) -> Result<Option<&'f [u8]>, TokenError> {
        // The one value of the field (one pass over the fields), or none.
        fn once<'f>(mut all: impl Iterator<Item = &'f [u8]>) -> Result<Option<&'f [u8]>, TokenError> {
            let first = all.next();
            if all.next().is_some() { Err(TokenError::Repeated) } else { Ok(first) }
        }
        let token = match &self.field {
            TokenField::Bearer => once(fields.all_of(Known::Authorization))?.and_then(bearer),
            TokenField::Header(name) => once(fields.get_all(name))?.map(<[u8]>::trim_ascii),
            TokenField::Cookie(name) => once(cookies(fields, name))?,
        };
        Ok(token.filter(|t| !t.is_empty()))
    }

    /// The claims of the request's token (`None`: it carries none), verified; `fetch`
    /// says whether a token naming a key the set lacks wakes a fetch of the set.
    pub fn claims(&self, fields: Fields<'_>, fetch: Fetch) -> Result<Option<Arc<Claims>>, TokenError> {
        match self.token(fields)? {
            None => Ok(None),
            Some(token) => self.verify_with(token, now(), fetch).map(Some),
        }
    }

    /// The claims of `token` at `now` (Unix seconds), verified.
    pub fn verify(&self, token: &[u8], now: u64) -> Result<Arc<Claims>, TokenError> {
        self.verify_with(token, now, Fetch::Wake)
    }

    /// `verify`, waking a fetch of the set for a token that names a key it lacks only
    /// when `fetch` says so.
    pub fn verify_with(&self, token: &[u8], now: u64, fetch: Fetch) -> Result<Arc<Claims>, TokenError> {
        let remote = self.remote.get();
        let generation = remote.map_or(0, |r| r.generation.load(Ordering::Acquire));
        if let Some(known) = self.verified.lock().unwrap_or_else(|p| p.into_inner()).get(token)
            && known.generation == generation
        {
            return known.at(now);
        }
        let text = std::str::from_utf8(token).map_err(|_| TokenError::Malformed)?;
        let header = jsonwebtoken::decode_header(text).map_err(|e| {
            if names_an_unknown_algorithm(text) { TokenError::Algorithm } else { TokenError::of(e.kind()) }
        })?;
        let fetched = remote.map(|r| r.keys.load_full());
        let keys: Vec<&VerifyingKey> = self.keys.iter().chain(fetched.iter().flat_map(|k| k.iter())).collect();
        let mut tried = None;
        for key in keys.iter().copied() {
            let fits = match (&header.kid, &key.kid) {
                (Some(asked), Some(kid)) => asked == kid,
                // A key without a `kid` verifies any token its algorithm fits.
                (_, None) => true,
                (None, Some(_)) => true,
            };
            if !fits || !key.validation.algorithms.contains(&header.alg) {
                continue;
            }
            match jsonwebtoken::decode::<Claims>(text, &key.key, &key.validation) {
                Ok(data) => return self.keep(token, data.claims, generation, now),
                // Another key of the same algorithm may have signed it (a rotation).
                Err(e) => tried = Some(TokenError::of(e.kind())),
            }
        }
        let error = tried.unwrap_or_else(|| match header.kid {
            Some(kid) if !keys.iter().any(|k| k.kid.as_deref() == Some(&kid)) => TokenError::UnknownKey(kid),
            _ => TokenError::Algorithm,
        });
        if let (Some(remote), TokenError::UnknownKey(_) | TokenError::Algorithm, Fetch::Wake) = (remote, &error, fetch)
        {
            // The key server may hold a key made since the last fetch.
            remote.wanted.notify_one();
        }
        Err(error)
    }

    /// Keeps a token whose signature verified until it expires, and its claims if its
    /// times hold at `now`.
    fn keep(&self, token: &[u8], claims: Claims, generation: u64, now: u64) -> Result<Arc<Claims>, TokenError> {
        let leeway = self.checks.leeway.as_secs();
        // `exp` is a whole number (the signature's check requires it); an `nbf` that is
        // no number is a token refused.
        let exp =
            claims.get("exp").and_then(serde_json::Value::as_u64).ok_or(TokenError::MissingClaim("exp".into()))?;
        let nbf = match claims.get("nbf") {
            None => 0,
            Some(nbf) => nbf.as_f64().filter(|t| *t >= 0.0).ok_or(TokenError::Malformed)?.ceil() as u64,
        };
        let known = Verified {
            claims: Arc::new(claims),
            generation,
            from: nbf.saturating_sub(leeway),
            until: exp.saturating_add(leeway),
        };
        let answer = known.at(now);
        let mut verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        if verified.len() >= CACHED_TOKENS {
            verified.retain(|_, v| now <= v.until);
            if verified.len() >= CACHED_TOKENS {
                verified.clear();
            }
        }
        verified.insert(token.into(), known);
        answer
    }
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use jsonwebtoken::{EncodingKey, Header, encode};
    use serde_json::json;

    use super::*;

    const NOW: u64 = 1_800_000_000;

    fn hs(claims: serde_json::Value, secret: &[u8]) -> String {
        encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(secret)).unwrap()
    }

    fn verifier(checks: Checks) -> Verifier {
        let keys = vec![VerifyingKey::secret(b"0123456789abcdef0123456789abcdef", &checks)];
        Verifier::new(TokenField::Bearer, checks, keys)
    }

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    #[test]
    fn a_token_verifies_only_with_its_key_and_within_its_times() {
        let v = verifier(Checks { leeway: Duration::from_secs(30), ..Checks::default() });
        let good = hs(json!({"sub": "alice", "exp": NOW + 60}), SECRET);
        assert_eq!(v.verify(good.as_bytes(), NOW).unwrap()["sub"], "alice");
        let forged = hs(json!({"sub": "alice", "exp": NOW + 60}), b"another secret of thirty-two b..");
        assert_eq!(v.verify(forged.as_bytes(), NOW).unwrap_err(), TokenError::Signature);
        let expired = hs(json!({"sub": "bob", "exp": NOW - 31}), SECRET);
        assert_eq!(v.verify(expired.as_bytes(), NOW).unwrap_err(), TokenError::Expired);
        let within_leeway = hs(json!({"sub": "bob", "exp": NOW - 29}), SECRET);
        assert!(v.verify(within_leeway.as_bytes(), NOW).is_ok());
        let early = hs(json!({"sub": "bob", "exp": NOW + 600, "nbf": NOW + 31}), SECRET);
        assert_eq!(v.verify(early.as_bytes(), NOW).unwrap_err(), TokenError::NotYetValid);
        let endless = hs(json!({"sub": "bob"}), SECRET);
        assert_eq!(v.verify(endless.as_bytes(), NOW).unwrap_err(), TokenError::MissingClaim("exp".into()));
        assert_eq!(v.verify(b"not.a.token", NOW).unwrap_err(), TokenError::Malformed);
    }

    #[test]
    fn a_kept_token_still_expires() {
        let v = verifier(Checks::default());
        let token = hs(json!({"sub": "alice", "exp": NOW + 10}), SECRET);
        assert!(v.verify(token.as_bytes(), NOW).is_ok());
        assert!(v.verify(token.as_bytes(), NOW + 10).is_ok());
        assert_eq!(v.verify(token.as_bytes(), NOW + 11).unwrap_err(), TokenError::Expired);
    }

    /// A signing key of `alg`'s family made now (RSA by openssl, which ring cannot make;
    /// the others by rcgen) and its public key as PEM.
    fn key_pair(alg: Algorithm) -> (EncodingKey, String) {
        let made = |alg: &'static rcgen::SignatureAlgorithm| {
            let pair = rcgen::KeyPair::generate_for(alg).unwrap();
            (pair.serialize_pem(), pair.public_key_pem())
        };
        let openssl = |args: &[&str], input: &[u8]| {
            use std::io::Write;
            use std::process::{Command, Stdio};
            let mut child = Command::new("openssl")
                .args(args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("openssl must be installed");
            child.stdin.take().unwrap().write_all(input).unwrap();
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8(out.stdout).unwrap()
        };
        let (private, public) = match alg {
            Algorithm::RS256 | Algorithm::PS256 => {
                let private = openssl(&["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"], b"");
                let public = openssl(&["pkey", "-pubout"], private.as_bytes());
                (private, public)
            }
            Algorithm::ES256 => made(&rcgen::PKCS_ECDSA_P256_SHA256),
            Algorithm::ES384 => made(&rcgen::PKCS_ECDSA_P384_SHA384),
            Algorithm::EdDSA => made(&rcgen::PKCS_ED25519),
            other => panic!("no key for {other:?}"),
        };
        let signing = match alg {
            Algorithm::RS256 | Algorithm::PS256 => EncodingKey::from_rsa_pem(private.as_bytes()),
            Algorithm::ES256 | Algorithm::ES384 => EncodingKey::from_ec_pem(private.as_bytes()),
            _ => EncodingKey::from_ed_pem(private.as_bytes()),
        };
        (signing.unwrap(), public)
    }

    /// For every family of public key: its own token verifies; an HS256 token whose
    /// secret is the key's PEM text (the classic confusion of a public key for an HMAC
    /// secret) and an unsigned one are refused.
    #[test]
    fn alg_none_and_an_hmac_token_keyed_with_a_public_keys_pem_are_refused() {
        // {"alg":"none"}.{"sub":"alice","exp":NOW + 60}. with no signature.
        let none = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJhbGljZSIsImV4cCI6MTgwMDAwMDA2MH0.";
        let claims = json!({"sub": "alice", "exp": NOW + 60});
        for alg in [Algorithm::RS256, Algorithm::PS256, Algorithm::ES256, Algorithm::ES384, Algorithm::EdDSA] {
            let (signing, public_pem) = key_pair(alg);
            let keys = VerifyingKey::parse(&public_pem, &Checks::default()).unwrap();
            let v = Verifier::new(TokenField::Bearer, Checks::default(), keys);
            let own = encode(&Header::new(alg), &claims, &signing).unwrap();
            assert_eq!(v.verify(own.as_bytes(), NOW).unwrap()["sub"], "alice", "{alg:?}");
            let confused =
                encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(public_pem.as_bytes()))
                    .unwrap();
            assert_eq!(v.verify(confused.as_bytes(), NOW).unwrap_err(), TokenError::Algorithm, "{alg:?}");
            assert_eq!(v.verify(none.as_bytes(), NOW).unwrap_err(), TokenError::Algorithm, "{alg:?}");
        }
    }

    /// A token naming a key the fetched set lacks wakes a fetch of the set, unless it is
    /// only explained (`Fetch::Never`).
    #[test]
    fn an_unknown_kid_wakes_a_fetch_unless_the_token_is_only_explained() {
        use futures_util::FutureExt;
        let v = Verifier::new(TokenField::Bearer, Checks::default(), vec![]);
        let remote = Arc::new(RemoteKeys::new("http://keys.example/jwks", &Checks::default()));
        v.attach(Arc::clone(&remote));
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some("k9".into());
        let token = encode(&header, &json!({"sub": "a", "exp": NOW + 60}), &EncodingKey::from_secret(SECRET)).unwrap();
        let unknown = TokenError::UnknownKey("k9".into());
        assert_eq!(v.verify_with(token.as_bytes(), NOW, Fetch::Never).unwrap_err(), unknown);
        assert!(remote.wanted.notified().now_or_never().is_none(), "an explained token woke a fetch");
        assert_eq!(v.verify_with(token.as_bytes(), NOW, Fetch::Wake).unwrap_err(), unknown);
        assert!(remote.wanted.notified().now_or_never().is_some(), "a token on the wire wakes one");
    }

    #[test]
    fn issuer_and_audience_are_checked_when_configured() {
        let v = verifier(Checks {
            issuers: vec!["https://id.example".into()],
            audiences: vec!["api".into()],
            leeway: Duration::ZERO,
        });
        let ok = hs(json!({"sub": "a", "exp": NOW + 60, "iss": "https://id.example", "aud": "api"}), SECRET);
        assert!(v.verify(ok.as_bytes(), NOW).is_ok());
        let other_aud = hs(json!({"sub": "a", "exp": NOW + 60, "iss": "https://id.example", "aud": "web"}), SECRET);
        assert_eq!(v.verify(other_aud.as_bytes(), NOW).unwrap_err(), TokenError::Audience);
        let other_iss = hs(json!({"sub": "a", "exp": NOW + 60, "iss": "https://evil.example", "aud": "api"}), SECRET);
        assert_eq!(v.verify(other_iss.as_bytes(), NOW).unwrap_err(), TokenError::Issuer);
        let no_iss = hs(json!({"sub": "a", "exp": NOW + 60, "aud": "api"}), SECRET);
        assert_eq!(v.verify(no_iss.as_bytes(), NOW).unwrap_err(), TokenError::MissingClaim("iss".into()));
        let no_aud = hs(json!({"sub": "a", "exp": NOW + 60, "iss": "https://id.example"}), SECRET);
        assert_eq!(v.verify(no_aud.as_bytes(), NOW).unwrap_err(), TokenError::MissingClaim("aud".into()));
        let null_aud = hs(json!({"sub": "a", "exp": NOW + 60, "iss": "https://id.example", "aud": null}), SECRET);
        assert_eq!(v.verify(null_aud.as_bytes(), NOW).unwrap_err(), TokenError::MissingClaim("aud".into()));
        let empty_aud = hs(json!({"sub": "a", "exp": NOW + 60, "iss": "https://id.example", "aud": []}), SECRET);
        assert_eq!(v.verify(empty_aud.as_bytes(), NOW).unwrap_err(), TokenError::Audience);
    }
}
