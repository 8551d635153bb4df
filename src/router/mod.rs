//! Which route a request takes: the first, in file order, whose host, path and method
//! all match. The rule is the linear one; the cost is not: `Router` indexes the routes
//! at load, so that a request costs about the same with one route or 100,000.
//!
//! - Hosts: exact names in a hash map, `*.example.com` by suffix (one lookup per label
//!   of the request's host), and the routes that name no host.
//! - Paths, per host: prefixes and exact paths in a radix tree (`paths`), routes for any
//!   path in a list. A `path_regex` anchored with a literal start (`^/t/(?<t>…)`) hangs in
//!   the tree at that start and is tried only by the paths that have it; the others are
//!   matched together in one `RegexSet`, in one pass.
//! - Methods: a bit mask per route; the scheme (a TLS listener or not), a flag beside it.
//!
//! Each source yields its routes in ascending order; the request takes the least that
//! matches in every respect, and a source whose least route cannot beat the best found
//! so far is not looked at.

mod paths;
pub mod pattern;

use std::collections::HashMap;

use http::Method;

use crate::ids::RouteId;

use paths::Paths;
pub use pattern::{Captures, PathRegex};

/// What a route matches.
#[derive(Debug, Default, Clone)]
pub struct RouteMatch {
    /// Lower-case host without port; `*.example.com` matches any subdomain.
    pub host: Option<String>,
    pub path: PathMatch,
    /// Empty: any method.
    pub methods: Vec<Method>,
    /// The scheme the request came in by (`None`: either).
    pub scheme: Option<Scheme>,
}

/// How a request came in: `Https` on a listener with `tls`, `Http` on one without. The
/// same as the request's `$scheme` (RFC 9110 §4.2: `https` is HTTP over TLS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

impl Scheme {
    /// The scheme of a request on a listener with TLS (`tls`) or without.
    pub fn of(tls: bool) -> Scheme {
        if tls { Scheme::Https } else { Scheme::Http }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
}

impl std::fmt::Display for Scheme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Default, Clone)]
pub enum PathMatch {
    #[default]
    Any,
    Prefix(String),
    Exact(String),
    /// A regular expression, anchored as written, on the normalized path.
    Regex(PathRegex),
}

/// The routes of a configuration, indexed for `find`.
#[derive(Debug, Default)]
pub struct Router {
    exact_hosts: HashMap<Box<str>, Table>,
    /// By the suffix after `*.`.
    wildcard_hosts: HashMap<Box<str>, Table>,
    /// The longest of those suffixes: a request's host is looked up by no longer one, so
    /// that a `Host` of a thousand labels costs no more than the configuration's own.
    longest_wildcard: usize,
    any_host: Table,
    /// Per route: its methods and scheme.
    methods: Box<[Methods]>,
    /// The `path_regex` patterns hung in the trees.
    patterns: Vec<PathRegex>,
}

/// The routes of one host (or of none), by path.
#[derive(Debug)]
struct Table {
    /// The least route of the table.
    first: u32,
    /// Routes for any path.
    any: Vec<u32>,
    paths: Paths,
    regexes: Option<Box<pattern::Set>>,
}

impl Table {
    fn shrink(&mut self) {
        self.any.shrink_to_fit();
        self.paths.shrink();
    }
}

impl Default for Table {
    fn default() -> Self {
        Table { first: u32::MAX, any: Vec::new(), paths: Paths::default(), regexes: None }
    }
}

/// A route's methods: the standard ones as bits, others listed; and its scheme.
#[derive(Debug, Default)]
struct Methods {
    /// Bit `i`: `STANDARD[i]`. All clear, with no `others`: any method.
    bits: u16,
    others: Box<[Method]>,
    scheme: Option<Scheme>,
}

const STANDARD: [Method; 9] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::OPTIONS,
    Method::PATCH,
    Method::TRACE,
    Method::CONNECT,
];

/// `method`'s bit, or 0 for a method not in `STANDARD`.
fn bit(method: &Method) -> u16 {
    STANDARD.iter().position(|m| m == method).map_or(0, |i| 1 << i)
}

impl Methods {
    fn new(methods: &[Method], scheme: Option<Scheme>) -> Self {
        let bits = methods.iter().fold(0, |bits, m| bits | bit(m));
        let others = methods.iter().filter(|m| bit(m) == 0).cloned().collect();
        Methods { bits, others, scheme }
    }

    /// Whether a request with `method` (whose bit is `bit`) by `scheme` may take the route.
    #[inline]
    fn allow(&self, bit: u16, method: &Method, scheme: Scheme) -> bool {
        self.scheme.is_none_or(|s| s == scheme)
            && ((self.bits == 0 && self.others.is_empty())
                || self.bits & bit != 0
                || (bit == 0 && self.others.contains(method)))
    }
}

impl Router {
    /// Indexes `routes`, given in file order; fails only when the `path_regex` patterns
    /// of one host are too large together.
    pub fn new<'m>(routes: impl IntoIterator<Item = &'m RouteMatch>) -> Result<Router, String> {
        let mut router = Router::default();
        let mut methods = Vec::new();
        let mut regexes: HashMap<Option<(bool, Box<str>)>, pattern::Builder> = HashMap::new();
        for (i, m) in routes.into_iter().enumerate() {
            let route = u32::try_from(i).unwrap_or(u32::MAX);
            methods.push(Methods::new(&m.methods, m.scheme));
            let host = m.host.as_deref().map(|h| match h.strip_prefix("*.") {
                Some(suffix) => (true, Box::from(suffix)),
                None => (false, Box::from(h)),
            });
            let table = router.table_mut(host.as_ref());
            table.first = table.first.min(route);
            match &m.path {
                PathMatch::Any => table.any.push(route),
                PathMatch::Prefix(p) => table.paths.node(p.as_bytes()).prefix.push(route),
                PathMatch::Exact(p) => table.paths.node(p.as_bytes()).exact.push(route),
                PathMatch::Regex(r) => match r.anchored_starts() {
                    Some(starts) => {
                        let pattern = u32::try_from(router.patterns.len()).unwrap_or(u32::MAX);
                        let table = router.table_mut(host.as_ref());
                        for start in starts {
                            let regex = &mut table.paths.node(start).regex;
                            if regex.last() != Some(&(route, pattern)) {
                                regex.push((route, pattern));
                            }
                        }
                        router.patterns.push(r.clone());
                    }
                    None => regexes.entry(host).or_default().push(r, route),
                },
            }
        }
        for (host, builder) in regexes {
            router.table_mut(host.as_ref()).regexes = Some(Box::new(builder.build()?));
        }
        router.methods = methods.into();
        for table in router.exact_hosts.values_mut().chain(router.wildcard_hosts.values_mut()) {
            table.shrink();
        }
        router.any_host.shrink();
        Ok(router)
    }

    fn table_mut(&mut self, host: Option<&(bool, Box<str>)>) -> &mut Table {
        match host {
            None => &mut self.any_host,
            Some((false, name)) => self.exact_hosts.entry(name.clone()).or_default(),
            Some((true, suffix)) => {
                self.longest_wildcard = self.longest_wildcard.max(suffix.len());
                self.wildcard_hosts.entry(suffix.clone()).or_default()
            }
        }
    }

    /// The first route, in file order, that serves `method` on the normalized `path` at
    /// `host` (without port or trailing dot, any case), come in by `scheme`.
    pub fn find(&self, method: &Method, path: &[u8], host: Option<&str>, scheme: Scheme) -> Option<RouteId> {
        self.find_where(method, path, host, scheme, |_| true)
    }

    /// `find`, among the routes `accept` takes: those whose match on the body the
    /// request's body meets, or may. (Generic: `find`'s `accept` costs nothing.)
    pub fn find_where(
        &self,
        method: &Method,
        path: &[u8],
        host: Option<&str>,
        scheme: Scheme,
        accept: impl Fn(RouteId) -> bool,
    ) -> Option<RouteId> {
        let want = Want { router: self, bit: bit(method), method, path, scheme, accept };
        let mut best = u32::MAX;
        if let Some(host) = host.filter(|_| !self.exact_hosts.is_empty() || !self.wildcard_hosts.is_empty()) {
            let lower;
            let host = if host.bytes().any(|b| b.is_ascii_uppercase()) {
                lower = host.to_ascii_lowercase();
                &lower
            } else {
                host
            };
            if let Some(table) = self.exact_hosts.get(host) {
                want.best_in(table, &mut best);
            }
            if !self.wildcard_hosts.is_empty() {
                for suffix in self.wildcard_suffixes(host) {
                    if let Some(table) = self.wildcard_hosts.get(suffix) {
                        want.best_in(table, &mut best);
                    }
                }
            }
        }
        want.best_in(&self.any_host, &mut best);
        (best != u32::MAX).then(|| RouteId::from(best as usize))
    }

    /// Every route that might take all the requests `m` matches, a superset, in no order:
    /// those whose host and path index it would be found under (`config::shadow` decides).
    pub fn covering(&self, m: &RouteMatch) -> Vec<usize> {
        let mut tables = vec![&self.any_host];
        match m.host.as_deref().map(|h| (h.strip_prefix("*."), h)) {
            None => {}
            Some((None, host)) => {
                tables.extend(self.exact_hosts.get(host));
                tables.extend(self.wildcard_suffixes(host).filter_map(|s| self.wildcard_hosts.get(s)));
            }
            Some((Some(base), _)) => {
                tables.extend(self.wildcard_hosts.get(base));
                tables.extend(self.wildcard_suffixes(base).filter_map(|s| self.wildcard_hosts.get(s)));
            }
        }
        let mut found = Vec::new();
        for table in tables {
            found.extend(&table.any);
            let same = |&(route, pattern): &(u32, u32), r: &PathRegex| {
                (self.patterns[pattern as usize].pattern() == r.pattern()).then_some(route)
            };
            match &m.path {
                PathMatch::Any => {}
                PathMatch::Prefix(p) => table.paths.walk(p.as_bytes(), |node, _| found.extend(&node.prefix)),
                PathMatch::Exact(p) => table.paths.walk(p.as_bytes(), |node, whole| {
                    found.extend(&node.prefix);
                    if whole {
                        found.extend(&node.exact);
                    }
                }),
                PathMatch::Regex(r) => {
                    found.extend(table.regexes.iter().flat_map(|set| set.same(r)));
                    for start in r.anchored_starts().into_iter().flatten() {
                        table.paths.walk(start, |node, whole| {
                            if whole {
                                found.extend(node.regex.iter().filter_map(|entry| same(entry, r)));
                            }
                        });
                    }
                }
            }
        }
        found.into_iter().map(|r| r as usize).collect()
    }
}

impl Router {
    /// The suffixes of `host` after each of its dots but a leading one, shortest first and
    /// no longer than a configured wildcard's: those a wildcard `*.SUFFIX` could cover it
    /// by (`a.b.c` gives `c`, then `b.c`).
    fn wildcard_suffixes<'h>(&self, host: &'h str) -> impl Iterator<Item = &'h str> {
        let dots = host.bytes().enumerate().rev().filter(|&(i, b)| b == b'.' && i > 0);
        dots.map(move |(i, _)| &host[i + 1..]).take_while(|suffix| suffix.len() <= self.longest_wildcard)
    }
}

/// One request's method, path and scheme, looked up table by table, among the routes
/// `accept` takes.
struct Want<'r, A> {
    router: &'r Router,
    bit: u16,
    method: &'r Method,
    path: &'r [u8],
    scheme: Scheme,
    accept: A,
}

impl<A: Fn(RouteId) -> bool> Want<'_, A> {
    /// Lowers `best` to the least route of `table` that takes the request.
    fn best_in(&self, table: &Table, best: &mut u32) {
        if table.first >= *best {
            return;
        }
        self.least(&table.any, best);
        table.paths.walk(self.path, |node, whole| {
            self.least(&node.prefix, best);
            if whole {
                self.least(&node.exact, best);
            }
            let patterns = &self.router.patterns;
            let mut regex = node.regex.iter().take_while(|&&(route, _)| route < *best);
            if let Some(&(route, _)) =
                regex.find(|&&(route, p)| self.takes(route) && patterns[p as usize].is_match(self.path))
            {
                *best = route;
            }
        });
        if let Some(set) = &table.regexes
            && set.first() < *best
        {
            set.matching(self.path, |route| {
                let takes = route < *best && self.takes(route);
                if takes {
                    *best = route;
                }
                takes || route >= *best
            });
        }
    }

    /// Lowers `best` to the least of `routes` (ascending) whose methods allow the request.
    #[inline]
    fn least(&self, routes: &[u32], best: &mut u32) {
        if let Some(&route) = routes.iter().take_while(|&&r| r < *best).find(|&&r| self.takes(r)) {
            *best = route;
        }
    }

    #[inline]
    fn takes(&self, route: u32) -> bool {
        self.router.methods[route as usize].allow(self.bit, self.method, self.scheme)
            && (self.accept)(RouteId::from(route as usize))
    }
}

/// Whether `m` matches a request: the plain rule, which `Router::find` must agree with
/// (the property test below), and which `config::shadow` compares with.
#[cfg(test)]
pub fn matches(m: &RouteMatch, method: &Method, path: &[u8], host: Option<&str>, scheme: Scheme) -> bool {
    mismatch(m, method, path, host, scheme) == Mismatch::default()
}

/// Which of a request's host, path, method and scheme `m` does not match (all false: it
/// matches). Not on the request path, which asks the index (`Router::find`); this is the
/// rule in plain words, for `explain` to say why a route was passed over.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    pub host: bool,
    pub path: bool,
    pub method: bool,
    pub scheme: bool,
}

pub fn mismatch(m: &RouteMatch, method: &Method, path: &[u8], host: Option<&str>, scheme: Scheme) -> Mismatch {
    let host_ok = match (&m.host, host) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(want), Some(host)) => match want.strip_prefix("*.") {
            Some(suffix) => {
                host.len() > suffix.len() + 1
                    && host[host.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
                    && host.as_bytes()[host.len() - suffix.len() - 1] == b'.'
            }
            None => host.eq_ignore_ascii_case(want),
        },
    };
    let path_ok = match &m.path {
        PathMatch::Any => true,
        PathMatch::Prefix(prefix) => path.starts_with(prefix.as_bytes()),
        PathMatch::Exact(exact) => path == exact.as_bytes(),
        PathMatch::Regex(r) => r.is_match(path),
    };
    let method_ok = m.methods.is_empty() || m.methods.contains(method);
    let scheme_ok = m.scheme.is_none_or(|s| s == scheme);
    Mismatch { host: !host_ok, path: !path_ok, method: !method_ok, scheme: !scheme_ok }
}

#[cfg(test)]
pub(crate) mod tests;
