//! `match.path_regex`: Rust's `regex` crate, whose matching takes time linear in the
//! path whatever the pattern (no backtracking: no pattern and no request can make it
//! slow), on the normalized path's bytes. The routes of one host are matched in one pass
//! (`Set`); the route found then reads its named groups (`Captures`), which its
//! `rewrite` and its limits' `capture:NAME` keys use.

use std::sync::Arc;

use regex::bytes::{Regex, RegexBuilder, RegexSet, RegexSetBuilder};

/// Largest compiled form of one pattern; a larger one is a configuration error.
pub const MAX_PATTERN_BYTES: usize = 1 << 20;
/// Largest compiled form of all the patterns of one host together.
pub const MAX_SET_BYTES: usize = 64 << 20;

/// A compiled `path_regex`.
#[derive(Debug, Clone)]
pub struct PathRegex {
    regex: Regex,
    /// The literal starts of every match, when the pattern is anchored at the start
    /// (`^/t/` gives `/t/`); `None`: it may match anywhere, or starts too many ways.
    starts: Option<Box<[Box<[u8]>]>>,
    /// The named groups: their index in the pattern and their name.
    names: Box<[(usize, Arc<str>)]>,
}

impl PathRegex {
    /// Compiles `pattern`, or says why it cannot be (the `regex` crate's message, which
    /// points into the pattern).
    pub fn new(pattern: &str) -> Result<PathRegex, String> {
        let regex = RegexBuilder::new(pattern).size_limit(MAX_PATTERN_BYTES).build().map_err(|e| match e {
            regex::Error::CompiledTooBig(limit) => {
                format!("the pattern compiles to more than {} KiB; write a simpler one", limit >> 10)
            }
            other => one_line(&other.to_string()),
        })?;
        let names = regex.capture_names().enumerate().filter_map(|(i, name)| Some((i, Arc::from(name?)))).collect();
        Ok(PathRegex { starts: anchored_starts(pattern), regex, names })
    }

    /// The literal starts of every match of an anchored pattern (see `anchored_starts`).
    pub fn anchored_starts(&self) -> Option<impl Iterator<Item = &[u8]>> {
        Some(self.starts.as_ref()?.iter().map(|s| &**s))
    }

    pub fn pattern(&self) -> &str {
        self.regex.as_str()
    }

    /// The pattern has a group of this name.
    pub fn has_group(&self, name: &str) -> bool {
        self.names.iter().any(|(_, n)| &**n == name)
    }

    /// Its named groups, for messages.
    pub fn group_names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(|(_, n)| &**n)
    }

    pub fn is_match(&self, path: &[u8]) -> bool {
        self.regex.is_match(path)
    }

    /// What the named groups captured of `path` (nothing when the pattern names none).
    pub fn captures(&self, path: &[u8]) -> Captures {
        if self.names.is_empty() {
            return Captures::default();
        }
        let Some(found) = self.regex.captures(path) else { return Captures::default() };
        let spans = self.names.iter().filter_map(|(i, name)| {
            let span = found.get(*i)?;
            Some((Arc::clone(name), span.start(), span.end()))
        });
        Captures(Some(Box::new(Found { spans: spans.collect(), text: None })))
    }
}

/// Most starts an anchored pattern may have to be indexed by them (`(?i)^/api` has 8).
const MAX_STARTS: usize = 16;

/// The literal starts every match of `pattern` has, if it can match only at the start
/// of the path (`^/t/(?<t>[^/]+)` gives `/t/`, `^/(a|b)/` gives `/a/` and `/b/`), and
/// they are few: the routing tree then offers the route only to paths that start so.
fn anchored_starts(pattern: &str) -> Option<Box<[Box<[u8]>]>> {
    use regex_syntax::hir::Look;
    use regex_syntax::hir::literal::{ExtractKind, Extractor};
    // As the path's bytes are matched: `(?-u:.)` is any byte.
    let hir = regex_syntax::ParserBuilder::new().utf8(false).build().parse(pattern).ok()?;
    if !hir.properties().look_set_prefix().contains(Look::Start) {
        return None;
    }
    let starts = Extractor::new().kind(ExtractKind::Prefix).extract(&hir);
    let literals = starts.literals().filter(|l| !l.is_empty() && l.len() <= MAX_STARTS)?;
    Some(literals.iter().map(|l| l.as_bytes().into()).collect())
}

/// The `regex` crate's syntax error on one line: what is wrong and where, from its
/// drawing of the pattern with a `^` under the place (indented four columns).
fn one_line(message: &str) -> String {
    let what = message.lines().find_map(|l| l.strip_prefix("error: ")).unwrap_or(message);
    let caret = message.lines().skip(2).find(|l| l.trim_start().starts_with('^')).and_then(|l| l.find('^'));
    match caret {
        Some(column) if column >= 4 => format!("{what} (at character {} of the pattern)", column - 3),
        _ => what.to_owned(),
    }
}

/// The named groups a route's `path_regex` captured: spans of the normalized path. Every
/// request's key source holds one, mostly empty: a pointer's size then, no allocation.
#[derive(Debug, Default, Clone)]
pub struct Captures(Option<Box<Found>>);

#[derive(Debug, Clone)]
struct Found {
    /// Name, start, end.
    spans: Box<[(Arc<str>, usize, usize)]>,
    /// The text the spans are of, when it is not the path (`given`).
    text: Option<Box<[u8]>>,
}

impl Captures {
    /// Captures given by name rather than found in a path: the admin API's key lookup.
    pub fn given<'v>(values: impl IntoIterator<Item = (&'v str, &'v [u8])>) -> Captures {
        let (mut spans, mut text) = (Vec::new(), Vec::new());
        for (name, value) in values {
            spans.push((Arc::from(name), text.len(), text.len() + value.len()));
            text.extend_from_slice(value);
        }
        Captures(Some(Box::new(Found { spans: spans.into(), text: Some(text.into()) })))
    }

    /// What the group `name` captured of `path` (the path the pattern ran on).
    pub fn get<'p>(&'p self, name: &str, path: &'p [u8]) -> Option<&'p [u8]> {
        let found = self.0.as_deref()?;
        let (_, start, end) = found.spans.iter().find(|(n, ..)| &**n == name)?;
        found.text.as_deref().unwrap_or(path).get(*start..*end)
    }
}

/// The `path_regex` routes of one host, gathered in file order.
#[derive(Debug, Default)]
pub struct Builder {
    patterns: Vec<String>,
    routes: Vec<u32>,
}

impl Builder {
    pub fn push(&mut self, regex: &PathRegex, route: u32) {
        self.patterns.push(regex.pattern().to_owned());
        self.routes.push(route);
    }

    /// One set of them all, or why it cannot be made (too large together).
    pub fn build(self) -> Result<Set, String> {
        let set = RegexSetBuilder::new(&self.patterns).size_limit(MAX_SET_BYTES).build().map_err(|e| match e {
            regex::Error::CompiledTooBig(limit) => format!(
                "{} path_regex patterns of one host compile to more than {} MiB together",
                self.patterns.len(),
                limit >> 20
            ),
            other => other.to_string(),
        })?;
        Ok(Set { set, routes: self.routes.into() })
    }
}

/// The `path_regex` routes of one host, matched together.
#[derive(Debug)]
pub struct Set {
    set: RegexSet,
    /// Per pattern, ascending.
    routes: Box<[u32]>,
}

impl Set {
    /// The least route of the set.
    pub fn first(&self) -> u32 {
        self.routes[0]
    }

    /// Calls `each` with the routes whose pattern matches `path`, ascending, until it
    /// returns true.
    pub fn matching(&self, path: &[u8], mut each: impl FnMut(u32) -> bool) {
        // Most paths match none: the cheap question first, without the set of matches.
        if !self.set.is_match(path) {
            return;
        }
        for i in self.set.matches(path).iter() {
            if each(self.routes[i]) {
                return;
            }
        }
    }

    /// The routes whose pattern is written as `regex`'s.
    pub fn same<'s>(&'s self, regex: &'s PathRegex) -> impl Iterator<Item = u32> + 's {
        let patterns = self.set.patterns().iter();
        patterns.zip(&self.routes).filter(|(p, _)| p.as_str() == regex.pattern()).map(|(_, &r)| r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_groups_capture_spans_of_the_path() {
        let r = PathRegex::new(r"^/t/(?P<tenant>[^/]+)/(?<rest>.*)$").unwrap();
        let path = b"/t/acme/orders/1";
        let c = r.captures(path);
        assert_eq!(c.get("tenant", path), Some(&b"acme"[..]));
        assert_eq!(c.get("rest", path), Some(&b"orders/1"[..]));
        assert_eq!(c.get("other", path), None);
        assert!(r.captures(b"/x").get("tenant", b"/x").is_none());
        assert!(r.has_group("tenant") && !r.has_group("x"));
    }

    #[test]
    fn bad_and_huge_patterns_say_why() {
        assert_eq!(PathRegex::new("/a(").unwrap_err(), "unclosed group (at character 3 of the pattern)");
        assert_eq!(
            PathRegex::new("^/(?<x>a)(?<x>b)").unwrap_err(),
            "duplicate capture group name (at character 6 of the pattern)"
        );
        let huge = PathRegex::new(r"\w{1000}\w{1000}\w{1000}").unwrap_err();
        assert!(huge.contains("compiles to more than 1024 KiB"), "{huge}");
    }

    #[test]
    fn anchored_patterns_give_the_literal_starts_of_their_matches() {
        let starts = |p: &str| {
            let regex = PathRegex::new(p).unwrap();
            regex.anchored_starts().map(|s| s.map(|l| String::from_utf8_lossy(l).into_owned()).collect::<Vec<_>>())
        };
        assert_eq!(starts(r"^/t/(?<t>[^/]+)/x$"), Some(vec!["/t/".to_owned()]));
        assert_eq!(starts(r"^/(a|b)/"), Some(vec!["/a/".to_owned(), "/b/".to_owned()]));
        assert_eq!(starts(r"^/s1\.json"), Some(vec!["/s1.json".to_owned()]));
        assert_eq!(starts(r"/t/"), None, "not anchored");
        assert_eq!(starts(r"^/a|/b"), None, "one branch not anchored");
        assert_eq!(starts(r"(?i)^/api/").map(|s| s.len()), Some(8), "each way to write it");
    }

    #[test]
    fn a_set_yields_the_matching_routes_in_order() {
        let mut b = Builder::default();
        for (pattern, route) in [("^/a", 2), ("x$", 5), ("^/a/x$", 9)] {
            b.push(&PathRegex::new(pattern).unwrap(), route);
        }
        let set = b.build().unwrap();
        let mut seen = Vec::new();
        set.matching(b"/a/x", |r| {
            seen.push(r);
            r == 5
        });
        assert_eq!(seen, [2, 5]);
        assert_eq!(set.first(), 2);
    }
}
