//! A route's change to the path it forwards (`strip_prefix`, `rewrite`). Its changes to
//! fields are made where fields are written: `hop::request_fields` (set, removed,
//! `upstream_host`) and the response's `extra` (`set_response_headers`).

use percent_encoding::{AsciiSet, CONTROLS, percent_encode};

use crate::config::{PathRewrite, Rewrite};

/// Octets escaped in a rewritten path: those a path segment cannot hold (RFC 3986 §3.3),
/// and `%` itself, since the path was decoded. Non-ASCII octets are always escaped.
const PATH: &AsciiSet =
    &CONTROLS.add(b' ').add(b'"').add(b'#').add(b'%').add(b'<').add(b'>').add(b'?').add(b'`').add(b'{').add(b'}');

/// The target sent upstream when the route rewrites the path: made from the normalized
/// path (as nginx does with a `proxy_pass` URI), escaped again, with the query as sent.
/// `None`: the target goes as the client sent it.
pub fn target(rewrite: &Rewrite, normalized: &[u8], query: Option<&str>) -> Option<String> {
    let (prefix, to) = match rewrite.path.as_ref()? {
        PathRewrite::Strip(prefix) => (prefix, "/"),
        PathRewrite::Replace { prefix, to } => (prefix, to.as_str()),
    };
    let rest = normalized.strip_prefix(prefix.as_bytes())?;
    let mut path = to.to_owned();
    // Stripping `/api` from `/api/x` gives `/x`, not `//x`.
    let rest = if path.ends_with('/') { rest.strip_prefix(b"/").unwrap_or(rest) } else { rest };
    path.extend(percent_encode(rest, PATH));
    if let Some(query) = query {
        path.push('?');
        path.push_str(query);
    }
    // Every octet outside the path characters is escaped above; the query was valid.
    Some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewrite(path: PathRewrite) -> Rewrite {
        Rewrite { path: Some(path), ..Rewrite::default() }
    }

    fn target_of(r: &Rewrite, normalized: &str, uri: &str) -> Option<String> {
        target(r, normalized.as_bytes(), uri.split_once('?').map(|(_, q)| q)).map(|p| p.to_string())
    }

    #[test]
    fn strip_prefix_keeps_a_leading_slash_and_the_query() {
        let with_slash = rewrite(PathRewrite::Strip("/api/".into()));
        assert_eq!(target_of(&with_slash, "/api/users", "/api/users?a=1").as_deref(), Some("/users?a=1"));
        assert_eq!(target_of(&with_slash, "/api/", "/api/").as_deref(), Some("/"));
        let without = rewrite(PathRewrite::Strip("/api".into()));
        assert_eq!(target_of(&without, "/api/users", "/api/users").as_deref(), Some("/users"));
        assert_eq!(target_of(&without, "/api", "/api").as_deref(), Some("/"));
    }

    #[test]
    fn replace_puts_to_before_the_rest_and_escapes_what_decoding_revealed() {
        let r = rewrite(PathRewrite::Replace { prefix: "/old/".into(), to: "/v2/".into() });
        assert_eq!(target_of(&r, "/old/a b%?", "/old/a%20b%25%3F").as_deref(), Some("/v2/a%20b%25%3F"));
        assert_eq!(target_of(&r, "/other", "/other"), None);
    }
}
