//! The request to explain, as asked: curl's spelling on the command line (`-X`, `-H`,
//! a URL), or the JSON body of the admin API's `POST /explain`, which the command line
//! sends with `--admin`. Either becomes one `Asked`, checked here: a method, a URL and
//! header fields that HTTP can carry, or a clear error. A head read otherwise (an
//! access-log line, a raw request) is asked of the admin API as one too (`from_head`).

use std::collections::BTreeMap;
use std::net::IpAddr;

use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri};
use serde::{Deserialize, Serialize};

pub use crate::access_log::Values;
use crate::router::Scheme;
use crate::wire::head::{Fields, RequestHead};

/// Where the request comes from when nothing says: the peer a local client has.
pub const DEFAULT_PEER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

/// A request to explain, as `POST /explain` takes it:
/// `{"method": "GET", "url": "http://host/path", "headers": {"x-key": "k1"}, "peer": "10.0.0.1"}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Asked {
    #[serde(default = "get")]
    pub method: String,
    /// `http://HOST[:PORT]/PATH?QUERY`, or the target alone (`/PATH?QUERY`).
    pub url: String,
    /// Header fields by name; a field sent several times as a list of its values.
    #[serde(default)]
    pub headers: BTreeMap<String, Values>,
    /// The address the request comes from (its TCP peer); 127.0.0.1 when not given.
    #[serde(default)]
    pub peer: Option<IpAddr>,
    /// The request is one an access-log line recorded: it passed the head's checks when
    /// the proxy read it (a line carries no `Host` unless it logs one).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub logged: bool,
    /// `https` for a request that came in on a listener with TLS, where the URL has no
    /// scheme to say so (`/PATH`); `http` when neither says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// Its body (text), for a route whose limits read its JSON fields (`json:`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
}

fn get() -> String {
    "GET".to_owned()
}

/// Why a request cannot be explained: it is not one HTTP could carry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AskedError {
    #[error("invalid method {0:?}")]
    Method(String),
    #[error("invalid URL {0:?}: give http://HOST/PATH or /PATH")]
    Url(String),
    #[error("invalid header {0:?}: give 'name: value'")]
    Header(String),
    #[error("invalid scheme {0:?}: give http or https, and the URL's own if it has one")]
    Scheme(String),
}

/// A request ready for the front: its method, target (origin-form) and fields.
pub struct Request {
    pub method: Method,
    pub target: String,
    pub headers: HeaderMap,
    pub peer: IpAddr,
    /// The URL's scheme, else the one given, else `http`.
    pub scheme: Scheme,
    pub body: Option<Vec<u8>>,
}

impl Request {
    /// The request's head, as the front reads one.
    pub fn head(&self) -> RequestHead<'_> {
        RequestHead {
            method: &self.method,
            target: &self.target,
            version: http::Version::HTTP_11,
            authority: None,
            fields: Fields::from(&self.headers),
        }
    }
}

impl Asked {
    /// The request of `head` from `peer`, come in by `scheme` (`logged`: as an access-log
    /// line recorded it), as `POST /explain` takes it: its method, its target (with an
    /// absolute-form target's authority, `SCHEME://AUTHORITY/PATH`), its scheme and its
    /// fields (a field's value must be text: JSON carries no other bytes).
    pub fn from_head(head: &RequestHead<'_>, peer: IpAddr, scheme: Scheme, logged: bool) -> Result<Asked, AskedError> {
        let url = match head.authority {
            Some(authority) => format!("{scheme}://{authority}{}", head.target),
            None => head.target.to_owned(),
        };
        let mut fields: BTreeMap<String, Values> = BTreeMap::new();
        for (name, value) in head.fields.iter() {
            let name = String::from_utf8_lossy(name).to_ascii_lowercase();
            let value = std::str::from_utf8(value)
                .map_err(|_| AskedError::Header(format!("{name}: {}", String::from_utf8_lossy(value))))?;
            fields.entry(name).or_insert_with(|| Values::Many(Vec::new())).push(value.to_owned());
        }
        let scheme = (scheme == Scheme::Https).then(|| scheme.to_string());
        Ok(Asked {
            method: head.method.to_string(),
            url,
            headers: fields,
            peer: Some(peer),
            logged,
            scheme,
            body: None,
        })
    }

    /// The request of `curl -X METHOD -H 'name: value'… URL`.
    pub fn from_curl(method: &str, headers: &[String], url: &str, peer: Option<IpAddr>) -> Result<Asked, AskedError> {
        let mut fields: BTreeMap<String, Values> = BTreeMap::new();
        for header in headers {
            let (name, value) = header.split_once(':').ok_or_else(|| AskedError::Header(header.clone()))?;
            let (name, value) = (name.trim().to_ascii_lowercase(), value.trim().to_owned());
            fields.entry(name).or_insert_with(|| Values::Many(Vec::new())).push(value);
        }
        let (logged, scheme, body) = (false, None, None);
        Ok(Asked { method: method.to_owned(), url: url.to_owned(), headers: fields, peer, logged, scheme, body })
    }

    /// The request as the front reads it. As curl does, a URL's host is sent as `Host`
    /// unless a `Host` field is given.
    pub fn request(&self) -> Result<Request, AskedError> {
        let method = Method::from_bytes(self.method.as_bytes()).map_err(|_| AskedError::Method(self.method.clone()))?;
        let uri: Uri = self.url.parse().map_err(|_| AskedError::Url(self.url.clone()))?;
        if uri.scheme().is_some_and(|s| s != "http" && s != "https")
            || (uri.scheme().is_some() != uri.authority().is_some())
        {
            return Err(AskedError::Url(self.url.clone()));
        }
        let scheme = match (uri.scheme_str(), self.scheme.as_deref()) {
            (Some("https"), None | Some("https")) | (None, Some("https")) => Scheme::Https,
            (Some("http"), None | Some("http")) | (None, None | Some("http")) => Scheme::Http,
            (_, given) => return Err(AskedError::Scheme(given.unwrap_or_default().to_owned())),
        };
        let mut headers = HeaderMap::new();
        for (name, values) in &self.headers {
            let bad = || AskedError::Header(format!("{name}: {values:?}"));
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad())?;
            for value in values.iter() {
                headers.append(&name, HeaderValue::from_str(value).map_err(|_| bad())?);
            }
        }
        if let Some(authority) = uri.authority()
            && !headers.contains_key(http::header::HOST)
        {
            let host = HeaderValue::from_str(authority.as_str()).map_err(|_| AskedError::Url(self.url.clone()))?;
            headers.insert(http::header::HOST, host);
        }
        let target = uri.path_and_query().map_or("/", http::uri::PathAndQuery::as_str);
        let target = if target.is_empty() { "/" } else { target };
        let (target, peer) = (target.to_owned(), self.peer.unwrap_or(DEFAULT_PEER));
        let body = self.body.as_ref().map(|b| b.as_bytes().to_vec());
        Ok(Request { method, target, headers, peer, scheme, body })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn curls_spelling_makes_the_request_curl_would_send() {
        let asked = Asked::from_curl(
            "POST",
            &["X-Key: k1".into(), "x-key: k2".into(), "Cookie: a=b".into()],
            "http://api.example.com:8080/v1/x?y=1",
            None,
        )
        .unwrap();
        let request = asked.request().unwrap();
        assert_eq!(request.method, Method::POST);
        assert_eq!(request.target, "/v1/x?y=1");
        assert_eq!(request.headers.get_all("x-key").iter().count(), 2, "a field given twice is sent twice");
        assert_eq!(request.headers["host"], "api.example.com:8080");
        assert_eq!(request.peer, DEFAULT_PEER);
        assert_eq!(request.scheme, Scheme::Http);
        let https = Asked::from_curl("GET", &[], "https://a/", None).unwrap().request().unwrap();
        assert_eq!(https.scheme, Scheme::Https, "the URL's scheme is the request's");
        let given_host = Asked::from_curl("GET", &["Host: other".into()], "http://a/", None).unwrap();
        assert_eq!(given_host.request().unwrap().headers["host"], "other", "a given Host wins, as with curl");
        let path_only = Asked::from_curl("GET", &[], "/x", None).unwrap().request().unwrap();
        assert!(path_only.headers.get("host").is_none());
    }

    #[test]
    fn a_head_read_elsewhere_is_asked_as_the_same_request() {
        let mut headers = HeaderMap::new();
        headers.append("x-key", HeaderValue::from_static("k1"));
        headers.append("x-key", HeaderValue::from_static("k2"));
        headers.append("host", HeaderValue::from_static("a.example"));
        let head = RequestHead {
            method: &Method::PUT,
            target: "/x?y=1",
            version: http::Version::HTTP_11,
            authority: Some("a.example"),
            fields: Fields::from(&headers),
        };
        let peer: IpAddr = "192.0.2.1".parse().unwrap();
        let asked = Asked::from_head(&head, peer, Scheme::Http, true).unwrap();
        assert_eq!((asked.url.as_str(), asked.logged, asked.peer), ("http://a.example/x?y=1", true, Some(peer)));
        let tls = Asked::from_head(&head, peer, Scheme::Https, true).unwrap();
        assert_eq!((tls.url.as_str(), tls.request().unwrap().scheme), ("https://a.example/x?y=1", Scheme::Https));
        let path_only = RequestHead { authority: None, ..head };
        let tls = Asked::from_head(&path_only, peer, Scheme::Https, true).unwrap();
        assert_eq!((tls.url.as_str(), tls.request().unwrap().scheme), ("/x?y=1", Scheme::Https), "said apart");
        let request = asked.request().unwrap();
        assert_eq!((request.method, request.target.as_str()), (Method::PUT, "/x?y=1"));
        assert_eq!(request.headers, headers, "every field, each value in order");
        let mut binary = headers.clone();
        binary.insert("x-bin", HeaderValue::from_bytes(b"\xff").unwrap());
        let head = RequestHead { fields: Fields::from(&binary), ..head };
        assert!(
            matches!(Asked::from_head(&head, peer, Scheme::Http, false), Err(AskedError::Header(_))),
            "JSON carries text only"
        );
    }

    #[test]
    fn what_http_cannot_carry_is_refused_with_what_to_give() {
        let asked = |method: &str, header: &str, url: &str| {
            let headers: Vec<String> = if header.is_empty() { vec![] } else { vec![header.into()] };
            Asked::from_curl(method, &headers, url, None).and_then(|a| a.request())
        };
        assert!(matches!(asked("G T", "", "/"), Err(AskedError::Method(_))));
        assert!(matches!(asked("GET", "no colon", "/"), Err(AskedError::Header(_))));
        assert!(matches!(asked("GET", "x: a\u{1}b", "/"), Err(AskedError::Header(_))));
        assert!(matches!(asked("GET", "", "ftp://a/"), Err(AskedError::Url(_))));
        assert!(matches!(asked("GET", "", "not a url"), Err(AskedError::Url(_))));
        let both = |url: &str, scheme: &str| {
            let mut asked = Asked::from_curl("GET", &[], url, None).unwrap();
            asked.scheme = Some(scheme.to_owned());
            asked.request().map(|r| r.scheme)
        };
        assert!(matches!(both("http://a/", "https"), Err(AskedError::Scheme(_))));
        assert!(matches!(both("/", "ftp"), Err(AskedError::Scheme(_))));
        assert_eq!(both("/", "https"), Ok(Scheme::Https));
    }
}
