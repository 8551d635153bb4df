//! The path routes and `path` keys see: the request's path as nginx sees it before it
//! chooses a location, so that no other spelling of a path escapes its route or its limit.
//!
//! Every percent-encoded octet is decoded (`%2F` too, as nginx does for location
//! matching), repeated slashes are merged (nginx `merge_slashes on`) and `.` and `..`
//! segments are removed (RFC 3986 §5.2.4). The upstream still receives the request target
//! exactly as the client sent it. Hand-written: the crates that decode percent-encoding or
//! resolve dot segments do one of these steps each, allocate even for a path that is
//! already normal, and none refuses a path that climbs above the root.

use std::borrow::Cow;

/// Why a path cannot be normalized; the request is answered `400`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadPath {
    #[error("the path climbs above the root")]
    AboveRoot,
    #[error("the path holds an encoded NUL")]
    Nul,
    #[error("the path holds a % not followed by two hex digits")]
    BadEscape,
}

/// The normalized form of `path` (the request target's path, without its query).
/// Borrows `path` when it is already normal, the common case.
pub fn normalize(path: &str) -> Result<Cow<'_, [u8]>, BadPath> {
    let bytes = path.as_bytes();
    // `*` (OPTIONS *) and anything else that is not an absolute path is left alone.
    if bytes.first() != Some(&b'/') || is_normal(bytes) {
        return Ok(Cow::Borrowed(bytes));
    }
    let decoded = decode(bytes)?;
    Ok(Cow::Owned(remove_dot_segments(&decoded)?))
}

/// No escape, no empty segment (but a trailing slash), no `.` or `..` segment.
fn is_normal(path: &[u8]) -> bool {
    if path.contains(&b'%') {
        return false;
    }
    let mut segments = path[1..].split(|&b| b == b'/').peekable();
    while let Some(segment) = segments.next() {
        let last = segments.peek().is_none();
        if (segment.is_empty() && !last) || segment == b"." || segment == b".." {
            return false;
        }
    }
    true
}

fn decode(path: &[u8]) -> Result<Vec<u8>, BadPath> {
    let mut out = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        let b = path[i];
        if b != b'%' {
            out.push(b);
            i += 1;
            continue;
        }
        let hex = |at: usize| path.get(at).and_then(|&c| (c as char).to_digit(16));
        let (Some(hi), Some(lo)) = (hex(i + 1), hex(i + 2)) else { return Err(BadPath::BadEscape) };
        let octet = (hi * 16 + lo) as u8;
        if octet == 0 {
            return Err(BadPath::Nul);
        }
        out.push(octet);
        i += 3;
    }
    Ok(out)
}

/// Merges slashes and resolves `.` and `..` (RFC 3986 §5.2.4); a trailing slash, or a
/// last segment `.` or `..`, leaves the result ending in `/`.
fn remove_dot_segments(path: &[u8]) -> Result<Vec<u8>, BadPath> {
    let mut out: Vec<u8> = Vec::with_capacity(path.len());
    let segments: Vec<&[u8]> = path.split(|&b| b == b'/').skip(1).collect();
    for (n, segment) in segments.iter().enumerate() {
        let last = n + 1 == segments.len();
        match *segment {
            b"" | b"." => {
                if last {
                    out.push(b'/');
                }
            }
            b".." => {
                if out.is_empty() {
                    return Err(BadPath::AboveRoot);
                }
                let parent = out.iter().rposition(|&b| b == b'/').unwrap_or(0);
                out.truncate(parent);
                if last {
                    out.push(b'/');
                }
            }
            segment => {
                out.push(b'/');
                out.extend_from_slice(segment);
            }
        }
    }
    if out.is_empty() {
        out.push(b'/');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(path: &str) -> Result<String, BadPath> {
        normalize(path).map(|p| String::from_utf8_lossy(&p).into_owned())
    }

    #[test]
    fn a_normal_path_is_borrowed() {
        for path in ["/", "/login", "/a/b/", "/a.b/c..d/.e", "*"] {
            assert!(matches!(normalize(path), Ok(Cow::Borrowed(_))), "{path}");
            assert_eq!(n(path).unwrap(), path);
        }
    }

    #[test]
    fn every_spelling_of_a_path_normalizes_to_it() {
        for spelling in [
            "//login",
            "/./login",
            "/x/../login",
            "/%6cogin",
            "/%6Cogin",
            "/%2e/login",
            "/y/x/..%2F..%2Flogin",
            "/x/..%2Flogin",
            "/x/%2e%2e/login",
            "/x/%2e%2e%2flogin",
            "///login",
            "/login/.",
            "/a/b/../../login",
            "/%2flogin",
        ] {
            let normal = n(spelling).unwrap();
            assert!(normal == "/login" || normal == "/login/", "{spelling} -> {normal}");
        }
        assert_eq!(n("/login/.").unwrap(), "/login/");
        assert_eq!(n("/login/x/..").unwrap(), "/login/");
        assert_eq!(n("/a//b///c").unwrap(), "/a/b/c");
        assert_eq!(n("/a/b/").unwrap(), "/a/b/");
        assert_eq!(n("/..a/b.").unwrap(), "/..a/b.");
        assert_eq!(n("/x/..").unwrap(), "/");
        assert_eq!(n("//").unwrap(), "/");
    }

    #[test]
    fn case_stays_significant() {
        assert_eq!(n("/LOGIN").unwrap(), "/LOGIN");
        assert_eq!(n("/%4cOGIN").unwrap(), "/LOGIN");
    }

    #[test]
    fn paths_above_the_root_nul_and_bad_escapes_are_refused() {
        for path in ["/..", "/../login", "/x/../../login", "/%2e%2e/login", "/x/..%2f..%2flogin"] {
            assert_eq!(n(path), Err(BadPath::AboveRoot), "{path}");
        }
        assert_eq!(n("/login%00.php"), Err(BadPath::Nul));
        for path in ["/%", "/%2", "/%zz", "/a%g0"] {
            assert_eq!(n(path), Err(BadPath::BadEscape), "{path}");
        }
    }

    #[test]
    fn decoded_bytes_need_not_be_utf8() {
        assert_eq!(normalize("/%ff").unwrap().as_ref(), b"/\xff");
    }
}
