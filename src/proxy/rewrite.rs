//! A route's change to the path it forwards (`strip_prefix`, `rewrite`). Its changes to
//! fields are made where fields are written: `hop::request_fields` (set, removed,
//! `upstream_host`) and the response's `extra` (`set_response_headers`).

use percent_encoding::{AsciiSet, CONTROLS, percent_encode};

use crate::config::{PathRewrite, Piece, Rewrite};
use crate::router::Captures;

/// Octets escaped in a rewritten path: those a path segment cannot hold (RFC 3986 §3.3),
/// and `%` itself, since the path was decoded. Non-ASCII octets are always escaped.
const PATH: &AsciiSet =
    &CONTROLS.add(b' ').add(b'"').add(b'#').add(b'%').add(b'<').add(b'>').add(b'?').add(b'`').add(b'{').add(b'}');

/// The target sent upstream when the route rewrites the path: made from the normalized
/// path (as nginx does with a `proxy_pass` URI), escaped again, with the query as sent.
/// `captures` are the route's `path_regex` groups in that path. `None`: the target goes
/// as the client sent it.
pub fn target(rewrite: &Rewrite, normalized: &[u8], captures: &Captures, query: Option<&str>) -> Option<String> {
    let mut path = match rewrite.path.as_ref()? {
        PathRewrite::Strip(prefix) => replace(normalized, prefix, "/")?,
        PathRewrite::Replace { prefix, to } => replace(normalized, prefix, to)?,
        PathRewrite::Template(pieces) => {
            let mut path = String::new();
            for piece in pieces {
                match piece {
                    Piece::Text(text) => path.push_str(text),
                    // A group that took no part in the match stands for nothing.
                    Piece::Group(name) => {
                        path.extend(percent_encode(captures.get(name, normalized).unwrap_or_default(), PATH));
                    }
                }
            }
            // `to` starting with a group whose text does not start with `/`.
            if !path.starts_with('/') {
                path.insert(0, '/');
            }
            path
        }
    };
    if let Some(query) = query {
        path.push('?');
        path.push_str(query);
    }
    // Every octet outside the path characters is escaped above; the query was valid.
    Some(path)
}

/// `to` followed by what follows `prefix` in `normalized`.
fn replace(normalized: &[u8], prefix: &str, to: &str) -> Option<String> {
    let rest = normalized.strip_prefix(prefix.as_bytes())?;
    let mut path = to.to_owned();
    // Stripping `/api` from `/api/x` gives `/x`, not `//x`.
    let rest = if path.ends_with('/') { rest.strip_prefix(b"/").unwrap_or(rest) } else { rest };
    path.extend(percent_encode(rest, PATH));
    Some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewrite(path: PathRewrite) -> Rewrite {
        Rewrite { path: Some(path), ..Rewrite::default() }
    }

    fn target_of(r: &Rewrite, normalized: &str, uri: &str) -> Option<String> {
        target(r, normalized.as_bytes(), &Captures::default(), uri.split_once('?').map(|(_, q)| q))
    }

    #[test]
    fn a_template_puts_the_groups_in_escaped() {
        use crate::router::PathRegex;
        let regex = PathRegex::new(r"^/t/(?<tenant>[^/]+)(?<rest>/.*)?$").unwrap();
        let r = rewrite(PathRewrite::Template(
            [Piece::Text("/v2/".into()), Piece::Group("tenant".into()), Piece::Group("rest".into())].into(),
        ));
        let at = |path: &str, query| target(&r, path.as_bytes(), &regex.captures(path.as_bytes()), query);
        assert_eq!(at("/t/ac me/x?y", Some("q=1")).as_deref(), Some("/v2/ac%20me/x%3Fy?q=1"));
        assert_eq!(at("/t/acme", None).as_deref(), Some("/v2/acme"), "a group that took no part is empty");
        let leading = rewrite(PathRewrite::Template([Piece::Group("tenant".into())].into()));
        let path = b"/t/acme/x";
        assert_eq!(target(&leading, path, &regex.captures(path), None).as_deref(), Some("/acme"));
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
