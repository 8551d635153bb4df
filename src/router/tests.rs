use proptest::prelude::*;

use super::*;

const HOSTS: [Option<&str>; 7] =
    [None, Some("a.com"), Some("b.a.com"), Some("*.a.com"), Some("*.b.a.com"), Some("c.org"), Some("*.org")];
const PATHS: [&str; 7] = ["/", "/a", "/a/", "/a/b", "/ab", "/b", ""];
const PATTERNS: [&str; 4] = ["^/a", "b$", "^/a/(?P<x>[^/]+)", "^/(a|b)/?$"];

fn methods() -> [Method; 4] {
    [Method::GET, Method::POST, Method::PUT, Method::from_bytes(b"PURGE").unwrap()]
}

/// A route of a few hosts, paths, patterns and methods that overlap.
pub(crate) fn route() -> impl Strategy<Value = RouteMatch> {
    let path = prop_oneof![
        Just(PathMatch::Any),
        (0..PATHS.len()).prop_map(|i| PathMatch::Prefix(PATHS[i].into())),
        (0..PATHS.len()).prop_map(|i| PathMatch::Exact(PATHS[i].into())),
        (0..PATTERNS.len()).prop_map(|i| PathMatch::Regex(PathRegex::new(PATTERNS[i]).unwrap())),
    ];
    let scheme = prop_oneof![Just(None), Just(Some(Scheme::Http)), Just(Some(Scheme::Https))];
    (0..HOSTS.len(), path, proptest::collection::vec(0..4usize, 0..3), scheme).prop_map(|(h, path, ms, scheme)| {
        RouteMatch {
            host: HOSTS[h].map(str::to_owned),
            path,
            methods: ms.into_iter().map(|i| methods()[i].clone()).collect(),
            scheme,
        }
    })
}

fn request() -> impl Strategy<Value = (Method, String, Option<&'static str>, Scheme)> {
    let hosts = [None, Some("a.com"), Some("A.Com"), Some("x.b.a.com"), Some("b.a.com"), Some("c.org"), Some(".a.com")];
    let paths =
        prop_oneof![(0..PATHS.len()).prop_map(|i| PATHS[i].to_owned()), Just("/a/b/c".to_owned()), "[/ab]{0,5}"];
    (0..4usize, paths, 0..hosts.len(), any::<bool>())
        .prop_map(move |(m, path, h, tls)| (methods()[m].clone(), path, hosts[h], Scheme::of(tls)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// The index finds the route the plain rule does: the first in file order that
    /// matches in every respect.
    #[test]
    fn the_index_finds_the_first_route_that_matches(
        routes in proptest::collection::vec(route(), 0..12),
        requests in proptest::collection::vec(request(), 1..20),
    ) {
        let router = Router::new(&routes).unwrap();
        for (method, path, host, scheme) in requests {
            let plain =
                routes.iter().position(|r| matches(r, &method, path.as_bytes(), host, scheme)).map(RouteId::from);
            let found = router.find(&method, path.as_bytes(), host, scheme);
            prop_assert_eq!(found, plain, "{} {:?} at {:?} by {}", method, path, host, scheme);
        }
    }
}

#[test]
fn hosts_match_exactly_or_by_wildcard_without_port() {
    let routes = [
        RouteMatch { host: Some("example.com".into()), ..RouteMatch::default() },
        RouteMatch { host: Some("*.example.com".into()), ..RouteMatch::default() },
    ];
    let router = Router::new(&routes).unwrap();
    let find = |host| router.find(&Method::GET, b"/", Some(host), Scheme::Http).map(RouteId::index);
    assert_eq!(find("EXAMPLE.com"), Some(0));
    assert_eq!(find("www.example.com"), Some(1));
    assert_eq!(find("a.b.example.com"), Some(1));
    assert_eq!(find("badexample.com"), None);
    assert_eq!(find(".example.com"), None);
    // A host of many labels is looked up by the suffixes a wildcard could have, not all.
    let long = format!("{}example.com", "a.".repeat(4_000));
    assert_eq!(find(&long), Some(1));
    assert_eq!(router.wildcard_suffixes(&long).count(), 2, "com, example.com");
}

#[test]
fn paths_and_methods_narrow_a_route() {
    let routes = [
        RouteMatch { path: PathMatch::Prefix("/api".into()), methods: vec![Method::POST], ..RouteMatch::default() },
        RouteMatch { path: PathMatch::Exact("/login".into()), ..RouteMatch::default() },
    ];
    let router = Router::new(&routes).unwrap();
    assert_eq!(router.find(&Method::POST, b"/api/x", None, Scheme::Http), Some(RouteId::from(0)));
    assert_eq!(router.find(&Method::GET, b"/api/x", None, Scheme::Http), None);
    assert_eq!(router.find(&Method::POST, b"/ap", None, Scheme::Http), None);
    assert_eq!(router.find(&Method::GET, b"/login", None, Scheme::Http), Some(RouteId::from(1)));
    assert_eq!(router.find(&Method::GET, b"/login/x", None, Scheme::Http), None);
}

#[test]
fn a_hundred_thousand_routes_are_found_by_their_own_host_and_prefix() {
    let routes: Vec<RouteMatch> = (0..100_000)
        .map(|i| RouteMatch {
            host: (i % 2 == 0).then(|| format!("h{i}.example.com")),
            path: PathMatch::Prefix(format!("/r{i}/")),
            methods: Vec::new(),
            scheme: None,
        })
        .collect();
    let router = Router::new(&routes).unwrap();
    assert_eq!(router.find(&Method::GET, b"/r99999/x", None, Scheme::Http), Some(RouteId::from(99_999)));
    assert_eq!(
        router.find(&Method::GET, b"/r99998/x", Some("h99998.example.com"), Scheme::Http),
        Some(RouteId::from(99_998))
    );
    assert_eq!(router.find(&Method::GET, b"/r99998/x", Some("h2.example.com"), Scheme::Http), None);
    assert_eq!(router.find(&Method::GET, b"/nowhere", Some("h2.example.com"), Scheme::Http), None);
}

#[test]
fn a_route_for_one_scheme_takes_only_the_requests_that_came_in_by_it() {
    let routes = [
        RouteMatch { host: Some("example.com".into()), scheme: Some(Scheme::Http), ..RouteMatch::default() },
        RouteMatch { path: PathMatch::Prefix("/api/".into()), scheme: Some(Scheme::Https), ..RouteMatch::default() },
        RouteMatch::default(),
    ];
    let router = Router::new(&routes).unwrap();
    let find = |path: &[u8], scheme| router.find(&Method::GET, path, Some("example.com"), scheme).map(RouteId::index);
    assert_eq!(find(b"/api/x", Scheme::Http), Some(0));
    assert_eq!(find(b"/api/x", Scheme::Https), Some(1));
    assert_eq!(find(b"/other", Scheme::Https), Some(2));
    let missed = mismatch(&routes[0], &Method::GET, b"/", Some("example.com"), Scheme::Https);
    assert_eq!(missed, Mismatch { scheme: true, ..Mismatch::default() });
}
