//! Routing through the binary: `path_regex` routes with named groups in rewrites and
//! limit keys, their `check` errors, and a file of 100,000 routes.

use std::time::Instant;

use crate::common::*;

/// A tenant route: `/t/{tenant}/…` limited per tenant and forwarded as `/v2/{tenant}/…`.
fn tenants(backend: &Backend) -> Conf {
    Conf::new()
        .admin()
        .upstream(backend)
        .limit("per_tenant", "key: capture:tenant, on_missing_key: skip, rate: 1r/m, burst: 1, nodelay: true")
        .route("match: { path: /health }, respond: { status: 204 }")
        .route(
            r"match: { path_regex: '^/t/(?<tenant>[a-z0-9-]+)(?<rest>/.*)?$' }, upstream: b, limits: [per_tenant],
              rewrite: { to: '/v2/$tenant${rest}' }",
        )
        .route("match: { path_prefix: / }, respond: { status: 404, body: other }")
}

#[tokio::test]
async fn a_regex_route_limits_per_captured_tenant_and_rewrites_with_its_groups() {
    let backend = Backend::start().await;
    let sg = tenants(&backend).start();
    // Each tenant has its own budget of two (one plus a burst of one).
    for tenant in ["acme", "zeta"] {
        for _ in 0..2 {
            assert_eq!(get(sg.addr, &format!("/t/{tenant}/orders?page=2"), &[]).await.status, 200);
        }
        assert_eq!(get(sg.addr, &format!("/t/{tenant}/orders"), &[]).await.status, 429, "{tenant}'s third");
    }
    // Another spelling of the same tenant's path is the same tenant.
    assert_eq!(get(sg.addr, "/t/x/../acme/", &[]).await.status, 429);
    // Decoded, then escaped again on the way out; no `rest` is nothing.
    assert_eq!(get(sg.addr, "/t/new/a%20b%3Fc", &[]).await.status, 200);
    assert_eq!(get(sg.addr, "/t/solo", &[]).await.status, 200);
    // Not a tenant path: the routes around it.
    assert_eq!(get(sg.addr, "/health", &[]).await.status, 204);
    assert_eq!(get(sg.addr, "/t/UPPER/x", &[]).await.status, 404);
    // The admin API finds a tenant's key by the group's value.
    let admin = sg.admin_addr();
    let state = async |tenant: &str| {
        let path = format!("/limits/per_tenant?capture:tenant={tenant}");
        serde_json::from_slice::<serde_json::Value>(&get(admin, &path, &[]).await.body).unwrap()
    };
    assert_eq!(state("acme").await["windows"][0]["admits"], false);
    assert_eq!(state("nobody").await["windows"][0]["remaining"], 2);
    let targets: Vec<String> = backend.hits().into_iter().map(|h| h.path_and_query).collect();
    assert_eq!(
        targets,
        [
            "/v2/acme/orders?page=2",
            "/v2/acme/orders?page=2",
            "/v2/zeta/orders?page=2",
            "/v2/zeta/orders?page=2",
            "/v2/new/a%20b%3Fc",
            "/v2/solo"
        ]
    );
}

#[test]
fn bad_patterns_and_groups_are_check_errors_at_their_field() {
    let yaml = r"listen: 127.0.0.1:0
limits:
  per_tenant: { key: capture:tenant, on_missing_key: skip, rate: 1r/s }
routes:
  - match: { path_regex: '^/a(' }
    respond: { status: 200 }
  - match: { path_regex: '\w{1000}\w{1000}\w{1000}' }
    respond: { status: 200 }
  - match: { path_prefix: /p/ }
    respond: { status: 200 }
    limits: [per_tenant]
  - match: { path_regex: '^/t/(?<team>[^/]+)' }
    upstream: u
    limits: [per_tenant]
    rewrite: { to: '/v2/$tenant' }
  - match: { path_regex: '^/q/', path_prefix: /q/ }
    upstream: u
    rewrite: { prefix: /q/, to: / }
upstreams:
  u: { servers: ['127.0.0.1:1'] }
";
    let (code, stderr) = check_bounded(yaml);
    assert_eq!(code, Some(1), "{stderr}");
    for expected in [
        "FILE:5:26: routes[0].match.path_regex: invalid pattern: unclosed group (at character 4 of the pattern)\n",
        "FILE:7:26: routes[1].match.path_regex: invalid pattern: the pattern compiles to more than 1024 KiB",
        "FILE:11:14: routes[2].limits[0]: limit \"per_tenant\" is keyed by capture:tenant, but this route's match has no `path_regex` with a group (?<tenant>…)",
        "FILE:14:14: routes[3].limits[0]: limit \"per_tenant\" is keyed by capture:tenant",
        "FILE:15:20: routes[3].rewrite.to: `$tenant` is no named group of match.path_regex ($team)",
        "FILE:16:26: routes[4].match.path_regex: give one of `path` (exact), `path_prefix` or `path_regex`",
    ] {
        assert!(stderr.contains(expected), "missing {expected:?} in:\n{stderr}");
    }
    assert!(!stderr.contains("can never match"), "a route in error shadows none:\n{stderr}");
}

/// docs/routing.md: a plain file of 100,000 routes is accepted, checked and served; the last
/// route and a path no route matches are found at once.
#[tokio::test]
async fn a_hundred_thousand_routes_are_accepted_and_served() {
    let mut yaml = String::from("listen: 127.0.0.1:0\nroutes:\n");
    for i in 0..100_000 {
        yaml.push_str(&format!("  - {{ match: {{ path_prefix: /r{i}/ }}, respond: {{ status: 200, body: r{i} }} }}\n"));
    }
    let started = Instant::now();
    let (code, stderr) = check_bounded(&yaml);
    assert_eq!(code, Some(0), "{stderr}");
    let sg = Sluicegate::start(&yaml);
    eprintln!("check and start of 100,000 routes: {:?}", started.elapsed());
    let last = get(sg.addr, "/r99999/x", &[]).await;
    assert_eq!((last.status, last.text()), (200, "r99999".to_owned()));
    assert_eq!(get(sg.addr, "/nowhere", &[]).await.status, 404);
}
