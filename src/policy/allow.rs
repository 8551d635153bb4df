//! Allow-lists: requests that a route's limits, or one limit, let through unlimited: by
//! client address (CIDR), by an exact header value, or by bearer token. Matching any
//! one entry is enough.

use http::{HeaderName, HeaderValue};
use ipnet::IpNet;

use super::key::{KeySource, bearer_token};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allow {
    pub nets: Vec<IpNet>,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub tokens: Vec<Box<[u8]>>,
}

impl Allow {
    pub fn is_empty(&self) -> bool {
        self.nets.is_empty() && self.headers.is_empty() && self.tokens.is_empty()
    }

    /// True when `src` is exempt.
    pub fn admits(&self, src: &KeySource<'_>) -> bool {
        let ip = src.client_ip.to_canonical();
        self.nets.iter().any(|net| net.contains(&ip))
            || self.headers.iter().any(|(name, value)| src.fields.get_all(name).any(|v| v == value.as_bytes()))
            || (!self.tokens.is_empty()
                && bearer_token(src.fields).is_some_and(|token| self.tokens.iter().any(|t| **t == *token)))
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
        };
        assert!(src_admitted(&allow, "10.1.2.3", &[]));
        assert!(src_admitted(&allow, "::ffff:10.1.2.3", &[]));
        assert!(!src_admitted(&allow, "192.0.2.1", &[]));
        assert!(src_admitted(&allow, "192.0.2.1", &[("x-internal", "yes")]));
        assert!(!src_admitted(&allow, "192.0.2.1", &[("x-internal", "no")]));
        assert!(src_admitted(&allow, "192.0.2.1", &[("authorization", "Bearer partner-token")]));
        assert!(!src_admitted(&allow, "192.0.2.1", &[("authorization", "Bearer other")]));
        assert!(!Allow::default().admits(&KeySource::get("10.0.0.1".parse().unwrap(), "/", &HeaderMap::new())));
    }
}
