//! Where the requests of a location the import left out go now: the location made no
//! route, so its requests take the first of its server's routes that matches them, and
//! are limited by that route's limits instead of the location's. Said in the location's
//! note, so that what changes for those requests is read where it is reported.

use super::http::{Location, Match};
use super::scope::Scope;
use super::syntax::{At, Directive};
use crate::router::PathRegex;

/// The paths a route (or a location) matches, as nginx's location wrote them.
#[derive(Debug, Clone)]
pub enum Paths {
    /// A server's `return`: every request.
    Any,
    Exact(String),
    Prefix(String),
    /// `None`: a pattern sluicegate cannot run, which may match any path.
    Regex(Option<PathRegex>),
}

impl Paths {
    pub fn of(l: &Location<'_>) -> Paths {
        match l.kind {
            Match::Exact => Paths::Exact(l.path.to_owned()),
            Match::Prefix | Match::PrefixFirst => Paths::Prefix(l.path.to_owned()),
            // As the route's `path_regex` is written (`routes::location_templates`).
            Match::Regex { caseless } => {
                Paths::Regex(PathRegex::new(&format!("(?{}-u){}", if caseless { "i" } else { "" }, l.path)).ok())
            }
        }
    }
}

/// What a route made of a location (or of a server's `return`) takes.
#[derive(Debug, Clone)]
pub struct Takes {
    pub paths: Paths,
    /// The location, in words: `` `location /api/` (nginx.conf:12) ``.
    pub what: String,
    /// The `limit_req` and `limit_conn` lines nginx applies there, as `(position, text)`
    /// (none before a `return`, which answers first).
    pub limits: Vec<(At, String)>,
}

impl Takes {
    /// The route of location `l`; `limited`: its limits apply (not a `return`).
    pub fn location(l: &Location<'_>, limited: bool) -> Takes {
        let d = l.directive;
        let limits = if limited { limit_lines(&l.scope) } else { Vec::new() };
        Takes { paths: Paths::of(l), what: format!("`{}` ({})", d.text(), d.at), limits }
    }

    /// The route of a server's `return`, which answers every request.
    pub fn server_return(ret: &Directive) -> Takes {
        Takes { paths: Paths::Any, what: format!("the server's `{}` ({})", ret.text(), ret.at), limits: Vec::new() }
    }
}

/// The `limit_req` and `limit_conn` lines in force in `scope`.
fn limit_lines(scope: &Scope<'_>) -> Vec<(At, String)> {
    scope.all("limit_req").iter().chain(scope.all("limit_conn")).map(|d| (d.at.clone(), d.text())).collect()
}

/// How many of a location's requests a route takes, of those no earlier route took.
#[derive(Debug, PartialEq, Eq)]
enum Share {
    None,
    /// Some, or maybe some (a regular expression beside a prefix).
    Some,
    All,
}

/// How many of the requests to `l` the route matching `r` takes.
fn share(r: &Paths, l: &Paths) -> Share {
    let all_or_none = |all: bool| if all { Share::All } else { Share::None };
    let some_or_none = |some: bool| if some { Share::Some } else { Share::None };
    match (r, l) {
        (Paths::Any, _) => Share::All,
        (Paths::Prefix(p), Paths::Exact(q)) => all_or_none(q.starts_with(p.as_str())),
        (Paths::Prefix(p), Paths::Prefix(q)) if q.starts_with(p.as_str()) => Share::All,
        (Paths::Prefix(p), Paths::Prefix(q)) => some_or_none(p.starts_with(q.as_str())),
        // Every path starts with `/`.
        (Paths::Prefix(p), Paths::Regex(_) | Paths::Any) => {
            if p == "/" {
                Share::All
            } else {
                Share::Some
            }
        }
        (Paths::Exact(p), Paths::Exact(q)) => all_or_none(p == q),
        (Paths::Exact(p), Paths::Prefix(q)) => some_or_none(p.starts_with(q.as_str())),
        (Paths::Exact(p), Paths::Regex(Some(regex))) => some_or_none(regex.is_match(p.as_bytes())),
        (Paths::Exact(_), Paths::Regex(None) | Paths::Any) => Share::Some,
        (Paths::Regex(Some(regex)), Paths::Exact(q)) => all_or_none(regex.is_match(q.as_bytes())),
        (Paths::Regex(_), _) => Share::Some,
    }
}

/// Where the requests of `l`, a location that made no route, go now among `routes` (its
/// server's, in the order they are tried, each with whether it takes some methods only),
/// and which limits they lose and gain, in words.
pub fn destination<'t>(l: &Location<'_>, routes: impl IntoIterator<Item = (&'t Takes, bool)>) -> String {
    let paths = Paths::of(l);
    // A location split by methods is several routes: together they take what the one
    // for any method takes.
    let mut merged: Vec<(&Takes, bool)> = Vec::new();
    for (takes, some_methods) in routes {
        match merged.last_mut() {
            Some((last, only_some)) if last.what == takes.what => *only_some &= some_methods,
            _ => merged.push((takes, some_methods)),
        }
    }
    let (mut first, mut all) = (Vec::new(), None);
    for (takes, some_methods) in merged {
        match share(&takes.paths, &paths) {
            Share::None => {}
            Share::All if !some_methods => {
                all = Some(takes);
                break;
            }
            Share::All | Share::Some => first.push(takes.what.as_str()),
        }
    }
    let earlier = match first.len() {
        0 => None,
        1 => Some(format!("the route of {} where that matches", first[0])),
        _ => Some(format!("the routes of {} where those match", first.join(", "))),
    };
    let none = "no route of its server (a route for any host, or a 404)";
    let mut out = match (earlier, all) {
        (None, Some(r)) => format!("its requests now take the route of {}", r.what),
        (Some(earlier), Some(r)) => format!("its requests now take {earlier}, else the route of {}", r.what),
        (None, None) => format!("its requests now take {none}"),
        (Some(earlier), None) => format!("its requests now take {earlier}, else {none}"),
    };
    let own = limit_lines(&l.scope);
    let theirs = all.map_or(&[][..], |r| &r.limits[..]);
    let lines = |of: &[(At, String)], without: &[(At, String)]| -> Vec<String> {
        let kept = |text: &String| without.iter().any(|(_, t)| t == text);
        of.iter().filter(|(_, text)| !kept(text)).map(|(at, text)| format!("`{text}` ({at})")).collect()
    };
    let (lost, gained) = (lines(&own, theirs), lines(theirs, &own));
    match (lost.is_empty(), gained.is_empty()) {
        (true, true) if own.is_empty() => out.push_str(", unlimited as before"),
        (true, true) => out.push_str(", limited as before"),
        (false, true) => out.push_str(&format!(", losing {}", lost.join(", "))),
        (true, false) => out.push_str(&format!(", now limited by {}", gained.join(", "))),
        (false, false) => {
            out.push_str(&format!(", losing {}, now limited by {} instead", lost.join(", "), gained.join(", ")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_takes_what_lies_under_it_and_a_regex_is_known_only_on_exact_paths() {
        let prefix = |p: &str| Paths::Prefix(p.into());
        let exact = |p: &str| Paths::Exact(p.into());
        let regex = |p: &str| Paths::Regex(PathRegex::new(p).ok());
        assert_eq!(share(&prefix("/"), &regex(r"\.php$")), Share::All);
        assert_eq!(share(&prefix("/app/"), &regex(r"\.php$")), Share::Some);
        assert_eq!(share(&prefix("/"), &prefix("/static/")), Share::All);
        assert_eq!(share(&prefix("/static/img/"), &prefix("/static/")), Share::Some);
        assert_eq!(share(&prefix("/api/"), &prefix("/static/")), Share::None);
        assert_eq!(share(&exact("/x.php"), &regex(r"\.php$")), Share::Some);
        assert_eq!(share(&exact("/x.html"), &regex(r"\.php$")), Share::None);
        assert_eq!(share(&regex(r"\.php$"), &exact("/x.php")), Share::All);
        assert_eq!(share(&regex(r"\.php$"), &prefix("/")), Share::Some);
        assert_eq!(share(&Paths::Any, &exact("/x")), Share::All);
    }
}
