//! The request head's size limits (`server.max_uri_bytes`, `server.max_header_bytes`),
//! checked first of all so that an oversized head never reaches a route or an upstream.
//!
//! hyper bounds the head too (its HTTP/1 read buffer, HTTP/2's header list size), but in
//! its own units; `server` sets those bounds loosely above these, and this check gives
//! both protocols the one limit the operator configured.

use http::Request;

use super::error::ProxyError;
use crate::config::Config;

/// 414 when the target is too long, 431 when the header fields are too large.
pub fn check_head<B>(req: &Request<B>, config: &Config) -> Result<(), ProxyError> {
    // The path and query: what the upstream receives as the target (an absolute-form
    // target's scheme and authority are not forwarded).
    let target = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if target > config.max_uri_bytes {
        return Err(ProxyError::UriTooLong { bytes: target, max: config.max_uri_bytes });
    }
    let bytes = header_section_bytes(req);
    if bytes > config.max_header_bytes {
        return Err(ProxyError::HeadersTooLarge { bytes, max: config.max_header_bytes });
    }
    Ok(())
}

/// The header section as HTTP/1 sends it: `name: value` and CRLF per field. An HTTP/2
/// request's `:authority` counts as its `Host` field, so the same request weighs the same
/// on either protocol (HTTP/2's own measure, RFC 9113 §6.5.2, adds 32 bytes per field).
pub fn header_section_bytes<B>(req: &Request<B>) -> usize {
    let fields: usize = req.headers().iter().map(|(name, value)| name.as_str().len() + value.len() + 4).sum();
    let authority = match req.uri().authority() {
        Some(a) if !req.headers().contains_key(http::header::HOST) => "host".len() + a.as_str().len() + 4,
        _ => 0,
    };
    fields + authority
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_section_counts_as_http1_sends_it() {
        let req = Request::get("/").header("host", "a.b").header("x-k", "vv").body(()).unwrap();
        assert_eq!(header_section_bytes(&req), "host: a.b\r\n".len() + "x-k: vv\r\n".len());
        // HTTP/2: `:authority` in place of `Host`.
        let req = Request::get("http://a.b/").header("x-k", "vv").body(()).unwrap();
        assert_eq!(header_section_bytes(&req), "host: a.b\r\n".len() + "x-k: vv\r\n".len());
    }
}
