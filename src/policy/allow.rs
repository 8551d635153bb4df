//! Allow-lists: requests that a route's limits, or one limit, let through unlimited: by
//! client address (CIDR), by an exact header value, by bearer token, or by a claim of
//! the request's verified token. Matching any one entry is enough.

use http::{HeaderName, HeaderValue};
use ipnet::IpNet;

use super::key::{ClaimPath, KeySource, bearer_token};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allow {
    pub nets: Vec<IpNet>,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub tokens: Vec<Box<[u8]>>,
    /// A verified token's claim and the values it may hold (a string equal to one, or an
    /// array holding one).
    pub claims: Vec<(ClaimPath, Box<[String]>)>,
}

impl Allow {
    pub fn is_empty(&self) -> bool {
        self.nets.is_empty() && self.headers.is_empty() && self.tokens.is_empty() && self.claims.is_empty()
    }

    /// Whether it matches on a verified token's claims.
    pub fn reads_claims(&self) -> bool {
        !self.claims.is_empty()
    }

    /// True when `src` is exempt.
    pub fn admits(&self, src: &KeySource<'_>) -> bool {
        let ip = src.client_ip.to_canonical();
        self.nets.iter().any(|net| net.contains(&ip))
            || self.headers.iter().any(|(name, value)| src.fields.get_all(name).any(|v| v == value.as_bytes()))
            || (!self.tokens.is_empty()
                && bearer_token(src.fields).is_some_and(|token| self.tokens.iter().any(|t| **t == *token)))
            || src.claims.as_deref().is_some_and(|claims| {
                self.claims.iter().any(|(claim, values)| values.iter().any(|v| claim.holds(claims, v)))
            })
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderMap;

    use super::*;

    fn src_admitted(allow: &Allow, ip: &str, headers: &[(&str, &str)]) -> bool {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        allow.admits(&KeySource::get(ip.parse().unwrap(), "/", &map))
    }

    #[test]
    fn any_matching_entry_exempts() {
        let allow = Allow {
            nets: vec!["10.0.0.0/8".parse().unwrap()],
            headers: vec![(HeaderName::from_static("x-internal"), HeaderValue::from_static("yes"))],
            tokens: vec![b"partner-token".to_vec().into()],
            claims: vec![("tier".parse().unwrap(), vec!["gold".to_owned()].into())],
        };
        assert!(src_admitted(&allow, "10.1.2.3", &[]));
        assert!(src_admitted(&allow, "::ffff:10.1.2.3", &[]));
        assert!(!src_admitted(&allow, "192.0.2.1", &[]));
        assert!(src_admitted(&allow, "192.0.2.1", &[("x-internal", "yes")]));
        assert!(!src_admitted(&allow, "192.0.2.1", &[("x-internal", "no")]));
        assert!(src_admitted(&allow, "192.0.2.1", &[("authorization", "Bearer partner-token")]));
        assert!(!src_admitted(&allow, "192.0.2.1", &[("authorization", "Bearer other")]));
        assert!(!Allow::default().admits(&KeySource::get("10.0.0.1".parse().unwrap(), "/", &HeaderMap::new())));
        let map = HeaderMap::new();
        let mut src = KeySource::get("192.0.2.1".parse().unwrap(), "/", &map);
        src.claims = Some(std::sync::Arc::new(serde_json::from_str(r#"{"tier": ["free", "gold"]}"#).unwrap()));
        assert!(allow.admits(&src));
        src.claims = Some(std::sync::Arc::new(serde_json::from_str(r#"{"tier": "free"}"#).unwrap()));
        assert!(!allow.admits(&src));
    }
}
