//! The request head's size limits (`server.max_uri_bytes`, `server.max_header_bytes`),
//! checked first of all so that an oversized head never reaches a route or an upstream.
//!
//! The wire bounds the head too (the HTTP/1 engine's read buffer, HTTP/2's header list
//! size), but in its own units; `server` sets those bounds loosely above these, and this
//! check gives both protocols the one limit the operator configured.

use super::FrontError;
use crate::config::Config;
use crate::wire::head::RequestHead;

/// 414 when the target is too long, 431 when the header fields are too large.
pub fn check(head: &RequestHead<'_>, config: &Config) -> Result<(), FrontError> {
    // The path and query: what the upstream receives as the target (an absolute-form
    // target's scheme and authority are not forwarded).
    let target = head.target.len();
    if target > config.server.max_uri_bytes {
        return Err(FrontError::UriTooLong { bytes: target, max: config.server.max_uri_bytes });
    }
    let bytes = header_section_bytes(head);
    if bytes > config.server.max_header_bytes {
        return Err(FrontError::HeadersTooLarge { bytes, max: config.server.max_header_bytes });
    }
    Ok(())
}

/// The header section as HTTP/1 sends it: `name: value` and CRLF per field. An HTTP/2
/// request's `:authority` counts as its `Host` field, so the same request weighs the same
/// on either protocol (HTTP/2's own measure, RFC 9113 §6.5.2, adds 32 bytes per field).
pub fn header_section_bytes(head: &RequestHead<'_>) -> usize {
    let fields: usize = head.fields.iter().map(|(name, value)| name.len() + value.len() + 4).sum();
    let authority = match head.authority {
        Some(a) if !head.fields.contains(&http::header::HOST) => "host".len() + a.len() + 4,
        _ => 0,
    };
    fields + authority
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, Method, Version};

    use super::*;
    use crate::wire::head::Fields;

    #[test]
    fn the_header_section_counts_as_http1_sends_it() {
        let mut headers = HeaderMap::new();
        headers.insert("x-k", "vv".parse().unwrap());
        let h2 = RequestHead {
            method: &Method::GET,
            target: "/",
            version: Version::HTTP_2,
            authority: Some("a.b"),
            fields: Fields::from(&headers),
        };
        // HTTP/2: `:authority` in place of `Host`.
        assert_eq!(header_section_bytes(&h2), "host: a.b\r\n".len() + "x-k: vv\r\n".len());
        let mut with_host = headers.clone();
        with_host.insert("host", "a.b".parse().unwrap());
        let h1 = RequestHead { version: Version::HTTP_11, authority: None, fields: Fields::from(&with_host), ..h2 };
        assert_eq!(header_section_bytes(&h1), "host: a.b\r\n".len() + "x-k: vv\r\n".len());
    }
}
