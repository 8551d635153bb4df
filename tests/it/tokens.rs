//! Limits keyed on a verified token's claims (`jwt:CLAIM`): tokens made here, signed with
//! an HMAC secret or an ECDSA key (PEM and JWKS), forged, expired and unsigned ones
//! refused, overrides and allow-lists by claim, a key rotation picked up by a reload.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::json;

use crate::common::*;

const SECRET: &str = "0123456789abcdef0123456789abcdef";

pub(crate) fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// An HS256 token of `claims` signed with `secret`.
fn hs(claims: serde_json::Value, secret: &str) -> String {
    encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(secret.as_bytes())).unwrap()
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// The status of `GET /` with `token` as its bearer token (none: `None`).
async fn status_with(sg: &Sluicegate, token: Option<&str>) -> u16 {
    match token {
        Some(token) => get(sg.addr, "/", &[("authorization", &bearer(token))]).await.status,
        None => get(sg.addr, "/", &[]).await.status,
    }
}

fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}

/// A signing key of one of the families tokens may be signed with, made now: what signs
/// (its algorithm and private key), its public key as PEM, and as a JWK named `kid`.
pub(crate) struct SigningKey {
    alg: Algorithm,
    signing: EncodingKey,
    public_pem: String,
    pub(crate) jwk: serde_json::Value,
}

/// `openssl ARGS` with `input` on its standard input: its standard output.
fn openssl(args: &[&str], input: &[u8]) -> Vec<u8> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new("openssl")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl must be installed (.ci/run installs it)");
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

impl SigningKey {
    /// A key for `alg` (RS256 and PS256: RSA 2048, made by openssl, as ring makes no RSA
    /// keys; ES256, ES384, EdDSA: made by rcgen).
    fn new(alg: Algorithm, kid: &str) -> SigningKey {
        let ec = |pair: &rcgen::KeyPair, crv: &str, size: usize| {
            let point = pair.public_key_raw();
            assert_eq!(point.len(), 1 + 2 * size, "an uncompressed {crv} point");
            json!({
                "kty": "EC", "crv": crv, "kid": kid, "use": "sig",
                "x": base64url(&point[1..1 + size]), "y": base64url(&point[1 + size..]),
            })
        };
        let (signing, public_pem, mut jwk) = match alg {
            Algorithm::RS256 | Algorithm::PS256 => {
                let private = openssl(&["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"], b"");
                let public = String::from_utf8(openssl(&["pkey", "-pubout"], &private)).unwrap();
                let modulus =
                    String::from_utf8(openssl(&["rsa", "-pubin", "-noout", "-modulus"], public.as_bytes())).unwrap();
                let hex = modulus.trim().strip_prefix("Modulus=").unwrap();
                let n: Vec<u8> =
                    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
                let jwk = json!({"kty": "RSA", "kid": kid, "use": "sig", "n": base64url(&n), "e": "AQAB"});
                (EncodingKey::from_rsa_pem(&private).unwrap(), public, jwk)
            }
            Algorithm::ES256 => {
                let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
                let jwk = ec(&pair, "P-256", 32);
                (EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap(), pair.public_key_pem(), jwk)
            }
            Algorithm::ES384 => {
                let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
                let jwk = ec(&pair, "P-384", 48);
                (EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap(), pair.public_key_pem(), jwk)
            }
            Algorithm::EdDSA => {
                let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
                let jwk = json!({
                    "kty": "OKP", "crv": "Ed25519", "kid": kid, "use": "sig", "x": base64url(pair.public_key_raw()),
                });
                (EncodingKey::from_ed_pem(pair.serialize_pem().as_bytes()).unwrap(), pair.public_key_pem(), jwk)
            }
            other => panic!("no test key for {other:?}"),
        };
        jwk["alg"] = json!(format!("{alg:?}"));
        SigningKey { alg, signing, public_pem, jwk }
    }

    pub(crate) fn token(&self, kid: Option<&str>, claims: serde_json::Value) -> String {
        let mut header = Header::new(self.alg);
        header.kid = kid.map(str::to_owned);
        encode(&header, &claims, &self.signing).unwrap()
    }
}

/// A P-256 key (ES256) named `kid`.
pub(crate) fn es256(kid: &str) -> SigningKey {
    SigningKey::new(Algorithm::ES256, kid)
}

#[tokio::test]
async fn a_limit_keyed_on_a_verified_claim_counts_each_subject_and_refuses_what_does_not_verify() {
    let sg = Conf::new()
        .admin()
        .set(&format!("jwt: {{ secret: \"{SECRET}\" }}"))
        .limit("per_user", "key: \"jwt:sub\", rate: 1r/m, on_missing_key: skip")
        .answering("per_user")
        .start();
    let exp = now() + 600;
    let alice = hs(json!({"sub": "alice", "exp": exp}), SECRET);
    assert_eq!(status_with(&sg, Some(&alice)).await, 200);
    assert_eq!(status_with(&sg, Some(&alice)).await, 429, "one a minute per subject");
    // A fresh token of the same subject is the same key: a new token escapes nothing.
    let alice_again = hs(json!({"sub": "alice", "exp": exp + 1, "jti": "x"}), SECRET);
    assert_eq!(status_with(&sg, Some(&alice_again)).await, 429);
    let bob = hs(json!({"sub": "bob", "exp": exp}), SECRET);
    assert_eq!(status_with(&sg, Some(&bob)).await, 200, "another subject, another key");

    // What does not verify is refused before any limit, never keyed by its claims.
    let forged = hs(json!({"sub": "mallory", "exp": exp}), "a secret that is not the configured one!");
    let expired = hs(json!({"sub": "carol", "exp": now() - 120}), SECRET);
    let unsigned = format!(
        "{}.{}.",
        base64url(br#"{"alg":"none","typ":"JWT"}"#),
        base64url(format!(r#"{{"sub":"dave","exp":{exp}}}"#).as_bytes())
    );
    let endless = hs(json!({"sub": "erin"}), SECRET);
    for (token, why) in [
        (&forged, "the token's signature does not verify"),
        (&expired, "the token has expired"),
        (&unsigned, "signed with an algorithm no configured key verifies"),
        (&endless, "the token lacks the claim `exp`"),
        (&"not-a-jwt".to_owned(), "not a JSON Web Token"),
    ] {
        let reply = get(sg.addr, "/", &[("authorization", &bearer(token))]).await;
        assert_eq!(reply.status, 401, "{why}");
        assert_eq!(reply.header("www-authenticate"), Some("Bearer error=\"invalid_token\""));
        assert!(reply.text().contains("limit \"per_user\"") && reply.text().contains(why), "{}", reply.text());
    }
    // Sent twice, the token is refused: the upstream may read the other one.
    let twice = get(sg.addr, "/", &[("authorization", &bearer(&bob)), ("authorization", &bearer(&alice))]).await;
    assert_eq!(twice.status, 401);
    assert!(twice.text().contains("more than one token"), "{}", twice.text());
    // Without a token, the key is missing: `on_missing_key: skip` lets it through.
    assert_eq!(status_with(&sg, None).await, 200);
    assert_eq!(status_with(&sg, None).await, 200);
    let m = Metrics::of(&sg).await;
    assert_eq!(m.value("sluicegate_limit_missing_key_total{limit=\"per_user\"}"), 2.0);
    for (reason, n) in [
        ("signature", 1.0),
        ("expired", 1.0),
        ("algorithm", 1.0),
        ("malformed", 1.0),
        ("missing_claim", 1.0),
        ("repeated", 1.0),
    ] {
        assert_eq!(m.value(&format!("sluicegate_invalid_tokens_total{{reason=\"{reason}\"}}")), n, "{reason}");
    }
    // Each answer is counted with its route: the six refused for their token, the two
    // without one (skipped by the limit) as passed.
    let route =
        |outcome: &str| m.value(&format!("sluicegate_requests_total{{route=\"routes[0]\",outcome=\"{outcome}\"}}"));
    assert_eq!(route("invalid_token"), 6.0);
    assert_eq!(route("passed"), 4.0);
}

#[tokio::test]
async fn a_limit_that_takes_invalid_tokens_as_missing_counts_them_under_the_shared_key() {
    let sg = Conf::new()
        .admin()
        .set(&format!("jwt: {{ secret: \"{SECRET}\" }}"))
        .limit("per_user", "key: \"jwt:sub\", rate: 1r/m, on_invalid_token: missing_key, on_missing_key: shared")
        .answering("per_user")
        .start();
    let exp = now() + 600;
    let forged = |sub: &str| hs(json!({"sub": sub, "exp": exp}), "a secret that is not the configured one!");
    assert_eq!(status_with(&sg, Some(&forged("m1"))).await, 200);
    assert_eq!(status_with(&sg, Some(&forged("m2"))).await, 429, "every forged token shares one key");
    assert_eq!(status_with(&sg, None).await, 429, "with the requests that carry none");
    assert_eq!(status_with(&sg, Some(&hs(json!({"sub": "alice", "exp": exp}), SECRET))).await, 200);
    let m = Metrics::of(&sg).await;
    assert_eq!(m.value("sluicegate_invalid_tokens_total{reason=\"signature\"}"), 2.0, "counted, though not refused");
}

#[tokio::test]
async fn ecdsa_tokens_verify_with_pem_and_jwks_keys_chosen_by_kid_and_a_rotation_is_picked_up_by_a_reload() {
    let (k1, k2, pem_key) = (es256("k1"), es256("k2"), es256("pem"));
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    std::fs::write(&jwks, json!({"keys": [k1.jwk]}).to_string()).unwrap();
    let pem = dir.path().join("key.pem");
    std::fs::write(&pem, &pem_key.public_pem).unwrap();
    let conf = |keys_file: &std::path::Path| {
        Conf::new()
            .set(&format!("jwt: {{ keys_file: \"{}\", issuer: https://id.example }}", keys_file.display()))
            .limit("per_org", "key: \"jwt:org.id\", rate: 1r/m, on_missing_key: skip")
            .answering("per_org")
            .yaml()
    };
    let mut sg = Sluicegate::start(&conf(&jwks));
    let claims = |org: &str| json!({"sub": "u", "org": {"id": org}, "iss": "https://id.example", "exp": now() + 600});
    assert_eq!(status_with(&sg, Some(&k1.token(Some("k1"), claims("acme")))).await, 200);
    assert_eq!(status_with(&sg, Some(&k1.token(Some("k1"), claims("acme")))).await, 429, "keyed on org.id");
    assert_eq!(status_with(&sg, Some(&k1.token(Some("k1"), claims("globex")))).await, 200);
    // A key the set does not hold, a kid naming another key, another issuer: refused.
    let unknown = get(sg.addr, "/", &[("authorization", &bearer(&k2.token(Some("k2"), claims("initech"))))]).await;
    assert_eq!(unknown.status, 401);
    assert!(unknown.text().contains("kid \"k2\""), "{}", unknown.text());
    assert_eq!(status_with(&sg, Some(&k2.token(Some("k1"), claims("initech")))).await, 401, "signed by another key");
    let other_issuer = json!({"sub": "u", "org": {"id": "x"}, "iss": "https://evil.example", "exp": now() + 600});
    assert_eq!(status_with(&sg, Some(&k1.token(Some("k1"), other_issuer))).await, 401);
    // An HMAC token signed with the public key's text never verifies against it.
    let confused = hs(claims("hmac"), &serde_json::to_string(&k1.jwk).unwrap());
    assert_eq!(status_with(&sg, Some(&confused)).await, 401);

    // The rotation: the set now holds k2 as well.
    std::fs::write(&jwks, json!({"keys": [k1.jwk, k2.jwk]}).to_string()).unwrap();
    sg.reload(&conf(&jwks));
    wait_until("k2 verifies", Duration::from_secs(5), async || {
        status_with(&sg, Some(&k2.token(Some("k2"), claims(&format!("r{}", now()))))).await == 200
    })
    .await;
    // PEM public keys: a token without a kid verifies with the key whose algorithm fits.
    sg.reload(&conf(&pem));
    wait_until("the PEM key verifies", Duration::from_secs(5), async || {
        status_with(&sg, Some(&pem_key.token(None, claims(&format!("p{}", now()))))).await == 200
    })
    .await;
    assert_eq!(status_with(&sg, Some(&k1.token(Some("k1"), claims("acme-2")))).await, 401, "k1 no longer configured");
    sg.kill();
}

#[tokio::test]
async fn overrides_and_allow_lists_match_a_verified_tokens_claims() {
    let sg = Conf::new()
        .set(&format!("jwt: {{ secret: \"{SECRET}\", from: \"header:x-token\" }}"))
        .limit(
            "per_user",
            "key: \"jwt:sub\", rate: 1r/m, on_missing_key: skip, \
             overrides: [ { match: { claims: { tier: [gold, platinum] } }, use: gold } ], \
             allow: { claims: { roles: admin } }",
        )
        .limit("gold", "key: \"jwt:sub\", rate: 1r/m, burst: 2, nodelay: true, on_missing_key: skip")
        .answering("per_user")
        .start();
    let exp = now() + 600;
    let token = |claims: serde_json::Value| hs(claims, SECRET);
    let with = async |token: &str| get(sg.addr, "/", &[("x-token", token)]).await.status;
    let free = token(json!({"sub": "f", "tier": "free", "exp": exp}));
    assert_eq!((with(&free).await, with(&free).await), (200, 429));
    let gold = token(json!({"sub": "g", "tier": "gold", "exp": exp}));
    let golds = [with(&gold).await, with(&gold).await, with(&gold).await, with(&gold).await];
    assert_eq!(golds, [200, 200, 200, 429], "a gold token is decided by the gold limit");
    let admin = token(json!({"sub": "a", "roles": ["user", "admin"], "exp": exp}));
    for _ in 0..3 {
        assert_eq!(with(&admin).await, 200, "an array holding admin: exempt");
    }
    // A forged gold token is refused, not promoted.
    let forged = hs(json!({"sub": "f", "tier": "gold", "exp": exp}), "a secret that is not the configured one!");
    assert_eq!(with(&forged).await, 401);
    // The bearer field is not where this configuration reads tokens.
    assert_eq!(get(sg.addr, "/", &[("authorization", &bearer(&gold))]).await.status, 200, "no token: skipped");
}

#[tokio::test]
async fn routes_whose_limits_read_no_claims_never_look_at_the_token() {
    let sg = Conf::new()
        .set(&format!("jwt: {{ secret: \"{SECRET}\" }}"))
        .limit("per_user", "key: \"jwt:sub\", rate: 1r/m, on_missing_key: skip")
        .limit("per_ip", "key: ip, rate: 100r/s")
        .route("match: { path_prefix: /api/ }, limits: [per_user], respond: { status: 200 }")
        .route("match: { path_prefix: /static/ }, limits: [per_ip], respond: { status: 200 }")
        .start();
    let forged = hs(json!({"sub": "m", "exp": now() + 600}), "a secret that is not the configured one!");
    let auth = bearer(&forged);
    assert_eq!(get(sg.addr, "/api/x", &[("authorization", &auth)]).await.status, 401);
    assert_eq!(get(sg.addr, "/static/x", &[("authorization", &auth)]).await.status, 200);
}

#[tokio::test]
async fn a_jwks_url_is_fetched_again_when_a_token_names_a_key_it_lacks_and_kept_across_a_reload() {
    let (k1, k2) = (es256("k1"), es256("k2"));
    let served = Arc::new(Mutex::new(json!({"keys": [k1.jwk]}).to_string()));
    let body = Arc::clone(&served);
    let idp = StrictBackend::start(move |line| {
        let (status, text) = match line == "GET /.well-known/jwks.json" {
            true => ("200 OK", body.lock().unwrap().clone()),
            false => ("404 Not Found", String::new()),
        };
        format!("HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{text}", text.len())
            .into_bytes()
    })
    .await;
    let conf = |leeway: &str| {
        Conf::new()
            .set(&format!(
                "jwt: {{ jwks_url: \"http://{}/.well-known/jwks.json\", jwks_refresh: 1h, leeway: {leeway} }}",
                idp.addr
            ))
            .limit("per_user", "key: \"jwt:sub\", rate: 1r/m, on_missing_key: skip")
            .answering("per_user")
            .yaml()
    };
    let mut sg = Sluicegate::start(&conf("30s"));
    let claims = |sub: &str| json!({"sub": sub, "exp": now() + 600});
    wait_until("the JWKS is fetched", Duration::from_secs(10), async || {
        status_with(&sg, Some(&k1.token(Some("k1"), claims(&format!("a{}", rand_suffix()))))).await == 200
    })
    .await;
    let fetches = || idp.lines().iter().filter(|l| *l == "GET /.well-known/jwks.json").count();
    assert_eq!(fetches(), 1, "fetched once at start: {:?}", idp.lines());

    // The key server rotates: k2 appears. A token signed with it is refused until the
    // set is fetched again, which that token asked for.
    *served.lock().unwrap() = json!({"keys": [k1.jwk, k2.jwk]}).to_string();
    assert_eq!(status_with(&sg, Some(&k2.token(Some("k2"), claims("b")))).await, 401);
    wait_until("k2 verifies", Duration::from_secs(15), async || {
        status_with(&sg, Some(&k2.token(Some("k2"), claims(&format!("b{}", rand_suffix()))))).await == 200
    })
    .await;
    assert_eq!(fetches(), 2, "fetched again once: {:?}", idp.lines());
    // A flood of made-up kids asks the key server at most once in 5 s.
    for i in 0..20 {
        assert_eq!(status_with(&sg, Some(&k2.token(Some(&format!("nope{i}")), claims("c")))).await, 401);
    }
    assert!(fetches() <= 3, "{} fetches", fetches());
    wait_until("the flood's one fetch", Duration::from_secs(15), async || fetches() == 3).await;

    // A reload with the same URL and checks keeps the keys: no fetch, no refusal.
    let before = fetches();
    sg.reload(&conf("30s"));
    assert_eq!(status_with(&sg, Some(&k2.token(Some("k2"), claims("d")))).await, 200);
    assert_eq!(fetches(), before, "kept across the reload");
    // Other checks fetch a set of their own.
    sg.reload(&conf("20s"));
    wait_until("fetched for the new checks", Duration::from_secs(10), async || fetches() > before).await;
    sg.kill();
}

/// A suffix that makes each token of a retry loop a fresh key.
fn rand_suffix() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos()
}

#[tokio::test]
async fn a_dry_run_limit_refuses_no_token_and_counts_it() {
    let sg = Conf::new()
        .admin()
        .set(&format!("jwt: {{ secret: \"{SECRET}\" }}"))
        .limit("per_user", "key: \"jwt:sub\", rate: 1r/m, on_missing_key: skip, dry_run: true")
        .answering("per_user")
        .start();
    let forged = hs(json!({"sub": "m", "exp": now() + 600}), "a secret that is not the configured one!");
    assert_eq!(status_with(&sg, Some(&forged)).await, 200, "a limit on trial refuses nothing");
    let m = Metrics::of(&sg).await;
    assert_eq!(m.value("sluicegate_invalid_tokens_total{reason=\"signature\"}"), 1.0);
}

/// With `audience`, a token must name it in `aud`: one without `aud`, with `"aud": null`
/// or `[]` (minted for no service in particular, perhaps another service of the same
/// issuer) is refused, never counted under its subject; with `issuer`, `iss` likewise.
#[tokio::test]
async fn with_an_audience_a_token_without_aud_is_refused() {
    let sg = Conf::new()
        .admin()
        .set(&format!("jwt: {{ secret: \"{SECRET}\", issuer: https://id.example, audience: sluicegate-probe }}"))
        .limit("per_user", "key: \"jwt:sub\", rate: 1r/m, on_missing_key: skip")
        .answering("per_user")
        .start();
    let exp = now() + 600;
    let token = |extra: serde_json::Value| {
        let mut claims = json!({"sub": "alice", "exp": exp, "iss": "https://id.example"});
        claims.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        hs(claims, SECRET)
    };
    for (aud, why) in [
        (json!({}), "the token lacks the claim `aud`"),
        (json!({"aud": null}), "the token lacks the claim `aud`"),
        (json!({"aud": []}), "audience"),
        (json!({"aud": "another-service"}), "audience"),
    ] {
        let reply = get(sg.addr, "/", &[("authorization", &bearer(&token(aud.clone())))]).await;
        assert_eq!(reply.status, 401, "{aud}: {}", reply.text());
        assert!(reply.text().contains(why), "{aud}: {}", reply.text());
    }
    let no_iss = hs(json!({"sub": "alice", "exp": exp, "aud": "sluicegate-probe"}), SECRET);
    assert_eq!(status_with(&sg, Some(&no_iss)).await, 401, "iss is required with issuer");
    assert_eq!(status_with(&sg, Some(&token(json!({"aud": "sluicegate-probe"})))).await, 200);
    assert_eq!(
        status_with(&sg, Some(&token(json!({"aud": ["x", "sluicegate-probe"]})))).await,
        429,
        "alice, counted once"
    );
    let m = Metrics::of(&sg).await;
    assert_eq!(m.value("sluicegate_invalid_tokens_total{reason=\"missing_claim\"}"), 3.0);
}

/// The families README lists, each with its own key, a token of each verifies with its
/// public key given as PEM (no `kid`) and as a JWKS (chosen by `kid`, limited to its
/// `alg`); a token of the same algorithm signed by another key, and an HS256 token whose
/// secret is the public key's PEM (algorithm confusion), are refused.
#[tokio::test]
async fn tokens_of_every_key_family_verify_with_their_public_key_and_an_hmac_token_keyed_with_it_is_refused() {
    let families = [Algorithm::RS256, Algorithm::PS256, Algorithm::ES256, Algorithm::ES384, Algorithm::EdDSA];
    let keys: Vec<SigningKey> = families.iter().map(|&alg| SigningKey::new(alg, &format!("{alg:?}"))).collect();
    let strangers: Vec<SigningKey> = families.iter().map(|&alg| SigningKey::new(alg, &format!("{alg:?}"))).collect();
    let dir = tempfile::tempdir().unwrap();
    let pem = dir.path().join("keys.pem");
    std::fs::write(&pem, keys.iter().map(|k| k.public_pem.trim_end().to_owned() + "\n").collect::<String>()).unwrap();
    let jwks = dir.path().join("jwks.json");
    std::fs::write(&jwks, json!({"keys": keys.iter().map(|k| &k.jwk).collect::<Vec<_>>()}).to_string()).unwrap();
    let claims = |sub: &str| json!({"sub": sub, "exp": now() + 600});
    for (file, by_kid) in [(&pem, false), (&jwks, true)] {
        let sg = Conf::new()
            .set(&format!("jwt: {{ keys_file: \"{}\" }}", file.display()))
            .limit("per_user", "key: \"jwt:sub\", rate: 100r/s, burst: 100, nodelay: true, on_missing_key: skip")
            .answering("per_user")
            .start();
        let refusal = async |token: &str| {
            let reply = get(sg.addr, "/", &[("authorization", &bearer(token))]).await;
            assert_eq!(reply.status, 401, "{}", reply.text());
            reply.text()
        };
        for (key, stranger) in keys.iter().zip(&strangers) {
            let alg = format!("{:?}", key.alg);
            let kid = by_kid.then_some(alg.as_str());
            let own = key.token(kid, claims(&alg));
            assert_eq!(status_with(&sg, Some(&own)).await, 200, "{alg} from {}", file.display());
            let forged = refusal(&stranger.token(kid, claims(&alg))).await;
            assert!(forged.contains("signature does not verify"), "{alg}: {forged}");
            // The PEM text as an HMAC secret, the classic confusion of a public key.
            let mut header = Header::new(Algorithm::HS256);
            header.kid = kid.map(str::to_owned);
            let secret = EncodingKey::from_secret(key.public_pem.as_bytes());
            let confused = refusal(&encode(&header, &claims(&alg), &secret).unwrap()).await;
            assert!(confused.contains("algorithm"), "{alg}: {confused}");
        }
        // One RSA key signs RS256 and PS256: a PEM key verifies both, a JWK only its `alg`.
        let rsa = &keys[0];
        let mut header = Header::new(Algorithm::PS256);
        header.kid = by_kid.then(|| "RS256".to_owned());
        let other_padding = encode(&header, &claims("pss"), &rsa.signing).unwrap();
        assert_eq!(status_with(&sg, Some(&other_padding)).await, if by_kid { 401 } else { 200 }, "{}", file.display());
    }
}

/// A key server for `jwt.jwks_url` at `/jwks`: it answers what `served` holds (a status
/// line's code and reason, and a body) when asked.
pub(crate) async fn key_server(served: &Arc<Mutex<(&'static str, String)>>) -> StrictBackend {
    let served = Arc::clone(served);
    StrictBackend::start(move |line| {
        let (status, text) = match line == "GET /jwks" {
            true => served.lock().unwrap().clone(),
            false => ("404 Not Found", String::new()),
        };
        format!("HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{text}", text.len())
            .into_bytes()
    })
    .await
}

/// A configuration verifying tokens with the JWKS of `key_server`, refreshed every
/// `refresh`, and a limit keyed on `sub` that admits many a second.
fn with_jwks(key_server: &StrictBackend, refresh: &str) -> Conf {
    Conf::new()
        .set(&format!("jwt: {{ jwks_url: \"http://{}/jwks\", jwks_refresh: {refresh} }}", key_server.addr))
        .limit("per_user", "key: \"jwt:sub\", rate: 100r/s, burst: 100, nodelay: true, on_missing_key: skip")
        .answering("per_user")
}

/// How many times `key_server` was asked for the set.
pub(crate) fn fetches(key_server: &StrictBackend) -> usize {
    key_server.lines().iter().filter(|l| *l == "GET /jwks").count()
}

/// A token verified (and kept) under a key is refused, the same token, once the key is
/// gone: from the keys file (and the secret rotated), by a reload.
#[tokio::test]
async fn a_token_verified_before_a_reload_rotates_its_key_or_secret_out_is_refused_after_it() {
    let (k1, k2) = (es256("k1"), es256("k2"));
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    std::fs::write(&jwks, json!({"keys": [k1.jwk, k2.jwk]}).to_string()).unwrap();
    let conf = |secret: &str| {
        Conf::new()
            .set(&format!("jwt: {{ keys_file: \"{}\", secret: \"{secret}\" }}", jwks.display()))
            .limit("per_user", "key: \"jwt:sub\", rate: 100r/s, burst: 100, nodelay: true, on_missing_key: skip")
            .answering("per_user")
            .yaml()
    };
    let sg = Sluicegate::start(&conf(SECRET));
    let claims = |sub: &str| json!({"sub": sub, "exp": now() + 600});
    let by_k1 = k1.token(Some("k1"), claims("alice"));
    let by_secret = hs(claims("bob"), SECRET);
    let by_k2 = k2.token(Some("k2"), claims("carol"));
    for token in [&by_k1, &by_secret, &by_k2] {
        // The second time from the verified tokens kept.
        assert_eq!((status_with(&sg, Some(token)).await, status_with(&sg, Some(token)).await), (200, 200));
    }
    std::fs::write(&jwks, json!({"keys": [k2.jwk]}).to_string()).unwrap();
    let log = sg.reload(&conf("another secret of at least 32 bytes!"));
    assert!(log.contains("configuration reloaded"), "{log}");
    let refused = get(sg.addr, "/", &[("authorization", &bearer(&by_k1))]).await;
    assert_eq!(refused.status, 401, "k1 was rotated out: {}", refused.text());
    assert!(refused.text().contains("kid \"k1\""), "{}", refused.text());
    let refused = get(sg.addr, "/", &[("authorization", &bearer(&by_secret))]).await;
    assert_eq!(refused.status, 401, "the secret was rotated: {}", refused.text());
    assert_eq!(status_with(&sg, Some(&by_k2)).await, 200, "k2 stays");
}

/// `jwks_refresh` fetches the set again with no token asking, and a token verified
/// (and kept) under a key the key server has since dropped is refused once the refresh
/// brought the new set.
#[tokio::test]
async fn a_token_verified_before_the_key_server_drops_its_key_is_refused_once_the_periodic_refresh_fetched_the_set() {
    let (k1, k2) = (es256("k1"), es256("k2"));
    let served = Arc::new(Mutex::new(("200 OK", json!({"keys": [k1.jwk, k2.jwk]}).to_string())));
    let idp = key_server(&served).await;
    let sg = with_jwks(&idp, "10s").start();
    wait_until("the first fetch", Duration::from_secs(10), async || sg.log().contains("\"JWKS fetched\"")).await;
    let token = k1.token(Some("k1"), json!({"sub": "alice", "exp": now() + 600}));
    assert_eq!((status_with(&sg, Some(&token)).await, status_with(&sg, Some(&token)).await), (200, 200));
    assert_eq!(fetches(&idp), 1, "no token asked for another fetch");
    // The key server drops k1. Until the refresh, the kept token is not sent: nothing
    // but the refresh may fetch the set.
    served.lock().unwrap().1 = json!({"keys": [k2.jwk]}).to_string();
    wait_until("the periodic refresh", Duration::from_secs(30), async || sg.log().contains("JWKS fetched again")).await;
    assert_eq!(fetches(&idp), 2);
    let refused = get(sg.addr, "/", &[("authorization", &bearer(&token))]).await;
    assert_eq!(refused.status, 401, "k1 is gone from the key server: {}", refused.text());
    assert!(refused.text().contains("kid \"k1\""), "{}", refused.text());
    assert_eq!(status_with(&sg, Some(&k2.token(Some("k2"), json!({"sub": "bob", "exp": now() + 600})))).await, 200);
}

/// Until the first fetch of the set succeeds every token that needs it is refused (not
/// taken unverified); once fetched, the keys stay in use through a fetch that fails.
#[tokio::test]
async fn a_jwks_token_is_refused_until_the_first_fetch_succeeds_and_the_keys_outlive_a_failed_fetch() {
    let k1 = es256("k1");
    let served = Arc::new(Mutex::new(("503 Service Unavailable", String::new())));
    let idp = key_server(&served).await;
    let sg = with_jwks(&idp, "1h").start();
    let failed = |log: &str| log.matches("JWKS fetch failed").count();
    wait_until("the first fetch to fail", Duration::from_secs(10), async || failed(&sg.log()) == 1).await;
    let token = |sub: &str| k1.token(Some("k1"), json!({"sub": sub, "exp": now() + 600}));
    let first = token("alice");
    let refused = get(sg.addr, "/", &[("authorization", &bearer(&first))]).await;
    assert_eq!(refused.status, 401, "no keys yet: {}", refused.text());
    assert!(refused.text().contains("kid \"k1\""), "{}", refused.text());
    let unsigned = format!("{}.{}.", base64url(br#"{"alg":"none"}"#), base64url(br#"{"sub":"eve","exp":9999999999}"#));
    assert_eq!(status_with(&sg, Some(&unsigned)).await, 401);

    *served.lock().unwrap() = ("200 OK", json!({"keys": [k1.jwk]}).to_string());
    // The refused token asked for a fetch, taken 5 s after the failed one.
    let tries = std::sync::atomic::AtomicU32::new(0);
    wait_until("the set fetched", Duration::from_secs(20), async || {
        let fresh = token(&format!("t{}", tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed)));
        status_with(&sg, Some(&fresh)).await == 200
    })
    .await;
    assert_eq!(status_with(&sg, Some(&first)).await, 200, "the token refused before the fetch verifies now");

    // The key server fails; a token naming a key the set lacks asks for a fetch, which fails.
    *served.lock().unwrap() = ("500 Internal Server Error", String::new());
    let (before, failed_before) = (fetches(&idp), failed(&sg.log()));
    assert_eq!(
        status_with(&sg, Some(&es256("k9").token(Some("k9"), json!({"sub": "x", "exp": now() + 600})))).await,
        401
    );
    wait_until("the fetch to fail", Duration::from_secs(20), async || failed(&sg.log()) == failed_before + 1).await;
    assert_eq!(fetches(&idp), before + 1);
    assert_eq!(status_with(&sg, Some(&token("bob"))).await, 200, "a new token verifies with the keys kept");
}

#[tokio::test]
async fn a_verified_claim_gives_its_subject_its_own_count_and_a_forged_one_cannot() {
    let sg = Conf::new()
        .set(&format!("jwt: {{ secret: \"{SECRET}\" }}"))
        .limit(
            "per_user",
            "key: \"jwt:sub\", on_missing_key: refuse, algorithm: fixed_window, limit: 1, window: 1h, \
             limit_from: { jwt: quota, max: 3 }",
        )
        .answering("per_user")
        .start();
    let exp = now() + 600;
    let gold = hs(json!({"sub": "gold", "quota": 3, "exp": exp}), SECRET);
    let plain = hs(json!({"sub": "plain", "exp": exp}), SECRET);
    let mut statuses = Vec::new();
    for token in [&gold, &gold, &gold, &gold, &plain, &plain] {
        statuses.push(status_with(&sg, Some(token)).await);
    }
    assert_eq!(statuses, [200, 200, 200, 429, 200, 429], "the claim's 3, the limit's 1");
    // A token that does not verify says nothing: refused before any count is read.
    let forged = hs(json!({"sub": "mallory", "quota": 3, "exp": exp}), "a secret that is not the configured one!");
    assert_eq!(status_with(&sg, Some(&forged)).await, 401);
}
