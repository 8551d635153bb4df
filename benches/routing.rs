//! Which route a request takes (`Router::find`) as the routes grow: the last of 1, 1,000
//! and 100,000 routes (by path prefix, by exact host), a path no route matches, and
//! `path_regex` routes, one against 1,000.
//!
//! `cargo bench --bench routing`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use http::Method;
use sluicegate::router::{PathMatch, PathRegex, RouteMatch, Router, Scheme};

fn prefix(i: usize) -> RouteMatch {
    RouteMatch { path: PathMatch::Prefix(format!("/r{i}/")), ..RouteMatch::default() }
}

fn host(i: usize) -> RouteMatch {
    RouteMatch { host: Some(format!("h{i}.example.com")), ..RouteMatch::default() }
}

/// A tenant route as users write them: one pattern per service, a named group; anchored
/// (`^`: indexed by its literal start) or not (matched in the host's `RegexSet`).
fn regex(i: usize, anchor: &str) -> RouteMatch {
    let pattern = format!(r"{anchor}/s{i}/t/(?<tenant>[a-z0-9-]+)/orders/[0-9]+$");
    RouteMatch { path: PathMatch::Regex(PathRegex::new(&pattern).expect("valid")), ..RouteMatch::default() }
}

fn router(routes: impl Iterator<Item = RouteMatch>) -> Router {
    Router::new(&routes.collect::<Vec<_>>()).expect("routes index")
}

fn routing(c: &mut Criterion) {
    let mut group = c.benchmark_group("route");
    for n in [1, 1_000, 100_000] {
        let by_path = router((0..n).map(prefix));
        let last = format!("/r{}/items/7", n - 1);
        group.bench_with_input(BenchmarkId::new("last_prefix", n), &last, |b, path| {
            b.iter(|| by_path.find(&Method::GET, black_box(path.as_bytes()), Some("example.com"), Scheme::Http))
        });
        group.bench_function(BenchmarkId::new("no_match", n), |b| {
            b.iter(|| by_path.find(&Method::GET, black_box(b"/nowhere/items/7"), Some("example.com"), Scheme::Http))
        });
        let by_host = router((0..n).map(host));
        let name = format!("h{}.example.com", n - 1);
        group.bench_with_input(BenchmarkId::new("last_host", n), &name, |b, name| {
            b.iter(|| by_host.find(&Method::GET, b"/items/7", Some(black_box(name)), Scheme::Http))
        });
    }
    for (kind, anchor) in [("regex", "^"), ("unanchored_regex", "")] {
        for n in [1, 1_000] {
            let patterns = router((0..n).map(|i| regex(i, anchor)));
            let last = format!("/s{}/t/acme-corp/orders/12345", n - 1);
            group.bench_with_input(BenchmarkId::new(format!("last_{kind}"), n), &last, |b, path| {
                b.iter(|| patterns.find(&Method::GET, black_box(path.as_bytes()), None, Scheme::Http))
            });
            group.bench_function(BenchmarkId::new(format!("{kind}_no_match"), n), |b| {
                b.iter(|| patterns.find(&Method::GET, black_box(b"/static/app.js"), None, Scheme::Http))
            });
        }
    }
    // What the route found then reads of the path: its named groups.
    if let PathMatch::Regex(r) = &regex(0, "^").path {
        group.bench_function("captures", |b| b.iter(|| r.captures(black_box(b"/s0/t/acme-corp/orders/12345"))));
    }
    group.finish();
}

criterion_group!(benches, routing);
criterion_main!(benches);
