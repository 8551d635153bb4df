//! Field values a route sets (`set_request_headers`, `set_response_headers`,
//! `respond.headers`) made per request from what nginx calls variables: `$client_ip`
//! (the client's address as `trusted_proxies` finds it: nginx's `$remote_addr`, behind
//! `real_ip`), `$host` (the request's host, without its port, in lower case: nginx's
//! `$host`), `$request_uri` (the request target as sent: path and query), `$scheme`
//! (`http` or `https`). `${name}` when a letter follows; `$$` is a dollar sign. A value
//! without variables is a fixed one, built once.

use std::net::IpAddr;

use http::HeaderValue;

/// A field value as the configuration gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Template {
    Fixed(HeaderValue),
    Made(Box<[Piece]>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Text(Box<[u8]>),
    ClientIp,
    Host,
    RequestUri,
    Scheme,
}

const NAMES: &str = "$client_ip, $host, $request_uri, $scheme";

/// What the variables stand for in one request.
pub struct Request<'a> {
    pub client_ip: IpAddr,
    /// The request's host as sent (`Host`, or the authority of an absolute target).
    pub host: Option<&'a [u8]>,
    pub target: &'a [u8],
    pub tls: bool,
}

impl Template {
    /// Reads `text`, or says what is wrong in it.
    pub fn parse(text: &str) -> Result<Template, String> {
        let mut pieces = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        while let Some(dollar) = rest.find('$') {
            literal.push_str(&rest[..dollar]);
            let after = &rest[dollar + 1..];
            let (name, next) = if let Some(next) = after.strip_prefix('$') {
                literal.push('$');
                rest = next;
                continue;
            } else if let Some(braced) = after.strip_prefix('{') {
                braced.split_once('}').ok_or("`${` without its `}`")?
            } else {
                let end = after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(after.len());
                (&after[..end], &after[end..])
            };
            let piece = match name {
                "client_ip" => Piece::ClientIp,
                "host" => Piece::Host,
                "request_uri" => Piece::RequestUri,
                "scheme" => Piece::Scheme,
                "" => return Err(format!("`$` alone: write `$$` for a dollar sign (variables: {NAMES})")),
                other => {
                    return Err(format!("unknown variable `${other}` (variables: {NAMES}; `$$` for a dollar sign)"));
                }
            };
            if !literal.is_empty() {
                pieces.push(Piece::Text(text_bytes(&std::mem::take(&mut literal))?));
            }
            pieces.push(piece);
            rest = next;
        }
        literal.push_str(rest);
        if pieces.is_empty() {
            return HeaderValue::from_str(&literal).map(Template::Fixed).map_err(|_| invalid(&literal));
        }
        if !literal.is_empty() {
            pieces.push(Piece::Text(text_bytes(&literal)?));
        }
        Ok(Template::Made(pieces.into()))
    }

    /// The value in `request`: a fixed one as it is, a made one written into `out`.
    pub fn value<'v>(&'v self, request: &Request<'_>, out: &'v mut Vec<u8>) -> &'v [u8] {
        let pieces = match self {
            Template::Fixed(value) => return value.as_bytes(),
            Template::Made(pieces) => pieces,
        };
        out.clear();
        for piece in pieces {
            match piece {
                Piece::Text(text) => out.extend_from_slice(text),
                Piece::ClientIp => out.extend_from_slice(request.client_ip.to_canonical().to_string().as_bytes()),
                Piece::Host => out.extend_from_slice(&host_name(request.host.unwrap_or_default())),
                Piece::RequestUri => out.extend_from_slice(request.target),
                Piece::Scheme => out.extend_from_slice(if request.tls { b"https" } else { b"http" }),
            }
        }
        out
    }

    /// A value fit for a field: the made one as `HeaderValue`.
    pub fn header_value(&self, request: &Request<'_>) -> HeaderValue {
        match self {
            Template::Fixed(value) => value.clone(),
            // Every piece is a field value's bytes (checked text, an address, the client's
            // own host and target, which were field and target bytes), so is the whole.
            made => HeaderValue::from_bytes(made.value(request, &mut Vec::new()))
                .unwrap_or_else(|_| HeaderValue::from_static("")),
        }
    }
}

fn invalid(text: &str) -> String {
    format!("invalid header value {text:?}")
}

fn text_bytes(text: &str) -> Result<Box<[u8]>, String> {
    HeaderValue::from_str(text).map(|v| v.as_bytes().into()).map_err(|_| invalid(text))
}

/// nginx's `$host` of a `Host`: without its port, in lower case.
pub fn host_name(host: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    let end = match host.first() {
        Some(b'[') => host.iter().position(|&c| c == b']').map_or(host.len(), |i| i + 1),
        _ => host.iter().position(|&c| c == b':').unwrap_or(host.len()),
    };
    let name = &host[..end];
    if name.iter().any(u8::is_ascii_uppercase) { name.to_ascii_lowercase().into() } else { name.into() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_are_made_per_request_and_the_rest_is_kept_as_written() {
        let request = Request {
            client_ip: "::ffff:192.0.2.7".parse().unwrap(),
            host: Some(b"Example.COM:8443"),
            target: b"/a?b=c",
            tls: false,
        };
        let value = |text: &str| Template::parse(text).map(|v| v.header_value(&request));
        assert_eq!(value("$client_ip").unwrap(), "192.0.2.7");
        assert_eq!(value("https://$host$request_uri").unwrap(), "https://example.com/a?b=c");
        assert_eq!(value("${scheme}x $$5").unwrap(), "httpx $5");
        assert_eq!(value("plain"), Ok(HeaderValue::from_static("plain")));
        assert_eq!(
            value("$remote_addr").unwrap_err(),
            "unknown variable `$remote_addr` (variables: $client_ip, $host, $request_uri, $scheme; `$$` for a dollar sign)"
        );
        assert!(value("a$").unwrap_err().starts_with("`$` alone"));
        assert_eq!(value("${host").unwrap_err(), "`${` without its `}`");
        assert_eq!(host_name(b"[::1]:80"), &b"[::1]"[..]);
    }
}
