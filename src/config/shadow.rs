//! Routes that can never match: an earlier route, tried first, takes every request
//! they would (routes are tried in file order, the first match wins).
//!
//! The earlier routes that might are found through the routing index, as a request's
//! route is: the check costs about the same per route with ten routes or 100,000.

use super::checks::Errors;
use super::{PathMatch, Route, RouteMatch, Router};

/// Records an error at each route that an earlier one shadows.
pub(super) fn check(e: &mut Errors<'_>, routes: &[Route], router: &Router) {
    for (j, later) in routes.iter().enumerate() {
        if matches!(&later.matcher.path, PathMatch::Exact(p) if p.is_empty()) {
            continue; // a match in error, which matches nothing (`routes::route_match`)
        }
        // A route that matches on the body takes only some of the requests its head
        // match does: it shadows none.
        let sure = |i: usize| routes[i].body_match.is_none();
        if let Some(i) = shadowed_by(router, |i| &routes[i].matcher, sure, j) {
            let line = e.line_of(&format!("routes[{i}]"));
            e.add(
                format!("routes[{j}]"),
                format!("can never match: routes[{i}] (line {line}) comes first and takes every request it would"),
            );
        }
    }
}

/// The first route before route `j` that takes every request `j` would, if any; the
/// routes' matches are `matcher(i)`, indexed in `router`; only those `sure` of take every
/// request their match does may.
fn shadowed_by<'m>(
    router: &Router,
    matcher: impl Fn(usize) -> &'m RouteMatch,
    sure: impl Fn(usize) -> bool,
    j: usize,
) -> Option<usize> {
    let later = matcher(j);
    router.covering(later).into_iter().filter(|&i| i < j && sure(i) && covers(matcher(i), later)).min()
}

/// Whether every request `b` matches is also matched by `a` (see `router::matches`).
fn covers(a: &RouteMatch, b: &RouteMatch) -> bool {
    let host = match (&a.host, &b.host) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(a), Some(b)) => match a.strip_prefix("*.") {
            // `*.s` takes the strict subdomains of `s`: `x.s`, and every host of `*.s`
            // or `*.x.s`.
            Some(suffix) => match b.strip_prefix("*.") {
                Some(base) => base == suffix || is_subdomain(base, suffix),
                None => is_subdomain(b, suffix),
            },
            None => a == b,
        },
    };
    let path = match (&a.path, &b.path) {
        (PathMatch::Any, _) => true,
        (PathMatch::Prefix(p), PathMatch::Prefix(q) | PathMatch::Exact(q)) => q.starts_with(p.as_str()),
        (PathMatch::Exact(p), PathMatch::Exact(q)) => p == q,
        (PathMatch::Regex(p), PathMatch::Regex(q)) => p.pattern() == q.pattern(),
        _ => false,
    };
    let methods = a.methods.is_empty() || (!b.methods.is_empty() && b.methods.iter().all(|m| a.methods.contains(m)));
    let scheme = a.scheme.is_none() || a.scheme == b.scheme;
    host && path && methods && scheme
}

/// `host` is a strict subdomain of `of`.
fn is_subdomain(host: &str, of: &str) -> bool {
    host.strip_suffix(of).is_some_and(|head| head.len() > 1 && head.ends_with('.'))
}

#[cfg(test)]
mod tests {
    use http::Method;
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        /// The routes the index offers include the first that covers a route, which the
        /// plain scan of every earlier route finds.
        #[test]
        fn the_index_finds_the_shadowing_route_the_plain_scan_does(
            routes in proptest::collection::vec(crate::router::tests::route(), 0..16),
        ) {
            let router = Router::new(&routes).unwrap();
            for (j, later) in routes.iter().enumerate() {
                let plain = routes[..j].iter().position(|earlier| covers(earlier, later));
                prop_assert_eq!(shadowed_by(&router, |i| &routes[i], |_| true, j), plain, "routes[{}]", j);
            }
        }
    }

    fn m(host: Option<&str>, path: PathMatch, methods: &[Method]) -> RouteMatch {
        RouteMatch { host: host.map(str::to_owned), path, methods: methods.to_vec(), scheme: None }
    }

    #[test]
    fn a_route_covers_what_it_matches_in_every_respect() {
        let prefix = |p: &str| PathMatch::Prefix(p.into());
        let exact = |p: &str| PathMatch::Exact(p.into());
        let get = [Method::GET];
        assert!(covers(&m(None, PathMatch::Any, &[]), &m(Some("a.com"), exact("/x"), &get)));
        assert!(covers(&m(None, prefix("/api"), &[]), &m(None, prefix("/api/v1"), &get)));
        assert!(covers(&m(None, prefix("/api"), &[Method::GET, Method::POST]), &m(None, exact("/api"), &get)));
        assert!(covers(&m(Some("*.a.com"), prefix("/"), &[]), &m(Some("x.a.com"), prefix("/"), &[])));
        assert!(covers(&m(Some("*.a.com"), prefix("/"), &[]), &m(Some("*.x.a.com"), prefix("/"), &[])));
        assert!(covers(&m(Some("*.a.com"), prefix("/"), &[]), &m(Some("*.a.com"), prefix("/"), &[])));
        assert!(!covers(&m(Some("*.a.com"), prefix("/"), &[]), &m(Some("a.com"), prefix("/"), &[])));
        assert!(!covers(&m(Some("*.a.com"), prefix("/"), &[]), &m(Some("xa.com"), prefix("/"), &[])));
        assert!(!covers(&m(Some("a.com"), PathMatch::Any, &[]), &m(None, PathMatch::Any, &[])));
        assert!(!covers(&m(None, exact("/api"), &[]), &m(None, prefix("/api"), &[])));
        assert!(!covers(&m(None, prefix("/api/"), &[]), &m(None, prefix("/api"), &[])));
        assert!(!covers(&m(None, PathMatch::Any, &get), &m(None, PathMatch::Any, &[])));
        assert!(!covers(&m(None, PathMatch::Any, &get), &m(None, PathMatch::Any, &[Method::POST])));
        let by = |scheme| RouteMatch { scheme, ..m(None, PathMatch::Any, &[]) };
        let (http, https) = (Some(crate::router::Scheme::Http), Some(crate::router::Scheme::Https));
        assert!(covers(&by(None), &by(https)));
        assert!(covers(&by(https), &by(https)));
        assert!(!covers(&by(http), &by(https)));
        assert!(!covers(&by(https), &by(None)));
    }
}
