//! How a key is written, wherever one is shown: log lines, the access log's `keys`, the
//! dashboard, `GET /bans`, the `GET /limits` lookup and `simulate`'s report all write a
//! key as `KeyText` does, so that a key seen on one is found on the others.
//!
//! A key is written part by part, `ip=192.0.2.1 header:x-api-key=#3f2a…`, a part the
//! request lacks as `-`. A part that `log_keys` keeps out of the logs (credentials by
//! default) is written as its digest: `#` and 32 hex digits, the first 128 bits of
//! HMAC-SHA-256 of the part's name, a NUL and its value, keyed with `keys_secret`. Keyed
//! with a configured secret, one value has one digest across restarts, reloads and
//! instances, and a reader of the logs who guesses a token cannot test the guess.
//! Without `keys_secret`, the secret is drawn at start (`KeySecret`) and digests hold
//! while the process runs, or across restarts when limits persist their state (the
//! state directory keeps it).
//!
//! The key tables do not key by these digests: the request path keeps its SipHash
//! (`KeySpec::hash`), and a digest is made only when a key is written (a log line within
//! its budget, a key the dashboard counts, a ban's start, a lookup).

use std::borrow::Cow;
use std::net::IpAddr;

use ring::hmac;

use super::secret::KeySecret;
use crate::config::{Config, LogKeys};
use crate::policy::key::{KeyPart, KeySource, KeySpec};

/// Writes keys: the digests' secret and which parts are digested.
#[derive(Clone)]
pub struct KeyText {
    key: hmac::Key,
    /// The secret was drawn at start (no `keys_secret`).
    drawn: bool,
    mode: LogKeys,
    /// Values of digested parts are digests already (`simulate`, reading an access log's
    /// `keys`): written as they are.
    recorded: bool,
}

/// Length of a digest as written: `#` and 32 hex digits.
const DIGEST_LEN: usize = 33;

impl KeyText {
    /// How `config` writes keys: digests keyed with `keys_secret`, else with `drawn` (the
    /// limiters' `KeySecret::digest`, kept across reloads and, with persisted limits,
    /// restarts), else with a secret drawn now.
    pub fn new(config: &Config, drawn: Option<&[u8; 32]>) -> KeyText {
        let (key, drawn) = match (&config.keys_secret, drawn) {
            (Some(secret), _) => (hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes()), false),
            (None, Some(drawn)) => (hmac::Key::new(hmac::HMAC_SHA256, drawn), true),
            (None, None) => (hmac::Key::new(hmac::HMAC_SHA256, &KeySecret::draw().digest), true),
        };
        KeyText { key, drawn, mode: config.log_keys, recorded: false }
    }

    /// The same, for values read back from an access log, where digested parts are
    /// digests already.
    pub fn recorded(self) -> KeyText {
        KeyText { recorded: true, ..self }
    }

    /// The secret is `keys_secret`, not drawn at start.
    pub fn stable(&self) -> bool {
        !self.drawn
    }

    /// Whether `part` is written as its digest.
    pub fn digests(&self, part: &KeyPart) -> bool {
        self.mode.digests(part)
    }

    /// The key `spec` of `src`, or `-` when it has none (no part present).
    pub fn write(&self, spec: &KeySpec, src: &KeySource<'_>) -> String {
        let mut out = String::new();
        let mut any = false;
        for part in spec.0.iter() {
            if !out.is_empty() {
                out.push(' ');
            }
            let value = part.value_in(src);
            any |= value.is_some();
            let text = match value {
                None => "-".to_owned(),
                Some(value) => self.value(part, &value),
            };
            out.push_str(&format!("{part}={text}"));
        }
        if any { out } else { "-".to_owned() }
    }

    /// `value`, of `part`, as written: its digest, or the value (an address without a
    /// whole-address prefix, other bytes escaped by `escape`).
    pub fn value(&self, part: &KeyPart, value: &[u8]) -> String {
        if self.digests(part) {
            if self.recorded && is_digest(value) {
                return String::from_utf8_lossy(value).into_owned();
            }
            return self.digest(&part.to_string(), value);
        }
        if let KeyPart::Ip(_) = part {
            // `value_in` writes `address/prefix`; a whole address is written alone.
            let text = String::from_utf8_lossy(value);
            if let Some((ip, len)) = text.split_once('/')
                && let Ok(parsed) = ip.parse::<IpAddr>()
                && len == if parsed.is_ipv4() { "32" } else { "128" }
            {
                return ip.to_owned();
            }
            return text.into_owned();
        }
        escape(value).into_owned()
    }

    /// `#` and the first 128 bits of HMAC-SHA-256 of `name`, a NUL and `value`, in hex.
    fn digest(&self, name: &str, value: &[u8]) -> String {
        let mut mac = hmac::Context::with_key(&self.key);
        mac.update(name.as_bytes());
        mac.update(&[0]);
        mac.update(value);
        let tag = mac.sign();
        let mut out = String::with_capacity(DIGEST_LEN);
        out.push('#');
        for &b in &tag.as_ref()[..16] {
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 15)]));
        }
        out
    }
}

/// Whether `value` is written as a digest is: `#` and 32 lowercase hex digits.
pub fn is_digest(value: &[u8]) -> bool {
    value.len() == DIGEST_LEN
        && value[0] == b'#'
        && value[1..].iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// `value` as printable ASCII: other bytes, and `\`, as `\xHH` (nginx's escaping, which
/// `simulate` undoes), so that any value, UTF-8 or not, is written exactly.
pub fn escape(value: &[u8]) -> Cow<'_, str> {
    if value.iter().all(|&b| (0x20..0x7f).contains(&b) && b != b'\\') {
        return String::from_utf8_lossy(value);
    }
    let mut out = String::with_capacity(value.len() + 8);
    for &b in value {
        if (0x20..0x7f).contains(&b) && b != b'\\' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("\\x{b:02X}"));
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use http::HeaderMap;

    use super::*;

    fn text(yaml: &str) -> KeyText {
        let yaml = format!("listen: 127.0.0.1:0\n{yaml}\nroutes: [{{ respond: {{ status: 200 }} }}]\n");
        KeyText::new(&crate::config::parse(&yaml, "test").unwrap(), None)
    }

    fn spec(parts: &[&str]) -> KeySpec {
        KeySpec(parts.iter().map(|p| p.parse().unwrap()).collect())
    }

    fn source<'a>(uri: &'a str, headers: &'a HeaderMap) -> KeySource<'a> {
        KeySource::get("10.0.0.1".parse().unwrap(), uri, headers)
    }

    #[test]
    fn keys_are_written_part_by_part_with_credentials_as_keyed_digests() {
        let s =
            spec(&["ip", "bearer", "header:x-user", "header:X-Api-Key", "cookie:sid", "query:access_token", "host"]);
        let mut headers = HeaderMap::new();
        headers.insert("authorization", "Bearer tok-123".parse().unwrap());
        headers.insert("x-user", "alice".parse().unwrap());
        headers.insert("x-api-key", "k-456".parse().unwrap());
        headers.insert("cookie", "sid=s-789".parse().unwrap());
        headers.insert("host", "Example.COM".parse().unwrap());
        let src = source("/?access_token=q-000", &headers);
        let secret = "keys_secret: 0123456789abcdef";
        let written = text(secret).write(&s, &src);
        for secret in ["tok-123", "k-456", "s-789", "q-000"] {
            assert!(!written.contains(secret), "{written}");
        }
        assert!(written.starts_with("ip=10.0.0.1 bearer=#") && written.contains(" header:x-user=alice "), "{written}");
        assert!(written.ends_with(" host=example.com"), "{written}");
        assert_eq!(written, text(secret).write(&s, &src), "the same in another process with the same secret");
        assert_ne!(written, text("keys_secret: fedcba9876543210").write(&s, &src));
        let drawn = text("");
        assert_ne!(drawn.write(&s, &src), text("").write(&s, &src), "a secret drawn per process");
        let clear = text("log_keys: clear").write(&s, &src);
        for secret in ["tok-123", "k-456", "s-789", "q-000"] {
            assert!(clear.contains(secret), "{clear}");
        }
        let hashed = text(&format!("log_keys: hashed\n{secret}")).write(&spec(&["ip", "host"]), &src);
        assert!(hashed.starts_with("ip=#") && hashed.ends_with(" host=example.com"), "{hashed}");
    }

    #[test]
    fn a_recorded_digest_stands_for_itself_and_a_missing_key_is_a_dash() {
        let s = spec(&["header:x-api-key"]);
        let mut headers = HeaderMap::new();
        headers.insert("x-api-key", "k-456".parse().unwrap());
        let live = text("keys_secret: 0123456789abcdef");
        let written = live.write(&s, &source("/", &headers));
        let digest = written.strip_prefix("header:x-api-key=").unwrap();
        assert!(is_digest(digest.as_bytes()), "{written}");
        headers.insert("x-api-key", digest.parse().unwrap());
        assert_eq!(live.clone().recorded().write(&s, &source("/", &headers)), written);
        assert_ne!(live.write(&s, &source("/", &headers)), written, "live, a value shaped like a digest is hashed");
        assert_eq!(live.write(&s, &source("/", &HeaderMap::new())), "-");
        assert_eq!(
            live.write(&spec(&["ip", "header:x-api-key"]), &source("/", &HeaderMap::new())),
            "ip=10.0.0.1 header:x-api-key=-"
        );
    }
}
