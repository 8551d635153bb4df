//! No spelling of a path escapes the route and the limits of its normalized form, and
//! the upstream still receives the target as sent.

use crate::common::*;

/// A `/login` prefix route limited to one request a minute per client, an exact
/// `/exact` route and a host route limited alike, a concurrency-limited `/stream`, and a
/// catch-all route with no limit. Clients are told apart by `X-Forwarded-For`.
fn config(backend: &Backend) -> String {
    format!(
        r#"
listen: 127.0.0.1:0
trusted_proxies: [127.0.0.1/32]
upstreams:
  b: {{ servers: ["{}"] }}
limits:
  login: {{ key: ip, rate: 1r/m }}
  exact: {{ key: ip, rate: 1r/m }}
  by_path: {{ key: [ip, path], rate: 1r/m, ban: 10m }}
  slot: {{ key: ip, concurrency: 1 }}
routes:
  - match: {{ path_prefix: /login }}
    upstream: b
    limits: [login]
  - match: {{ path: /exact }}
    upstream: b
    limits: [exact]
  - match: {{ host: admin.local, path_prefix: /panel }}
    upstream: b
    limits: [by_path]
  - match: {{ path: /stream }}
    upstream: b
    limits: [slot]
  - upstream: b
"#,
        backend.addr
    )
}

/// The status of `GET target` sent byte for byte from client `ip` to `host`.
async fn status(sg: &Sluicegate, target: &str, ip: &str, host: &str) -> u16 {
    let request =
        format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nX-Forwarded-For: {ip}\r\nConnection: close\r\n\r\n");
    let answer = raw_exchange(sg.addr, request.as_bytes()).await;
    answer.get(9..12).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{target}: no status in {answer:?}"))
}

const LOGIN_SPELLINGS: &[&str] = &[
    "//login",
    "///login",
    "/./login",
    "/x/../login",
    "/%6cogin",
    "/%6Cogin",
    "/%2e/login",
    "/%2E/login",
    "/x/..%2Flogin",
    "/x/%2e%2e/login",
    "/x/%2E%2E%2flogin",
    "/%2flogin",
    "/login/.",
    "/a/b/../../login?next=/",
    "/login?x=1",
    "/x/./../login",
];

#[tokio::test]
async fn no_spelling_of_a_limited_prefix_escapes_its_limit() {
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&config(&backend));
    for (n, spelling) in LOGIN_SPELLINGS.iter().enumerate() {
        // Spent by the plain spelling, refused in the other; and the other way round.
        let (a, b) = (format!("192.0.2.{n}"), format!("198.51.100.{n}"));
        assert_eq!(status(&sg, "/login", &a, "test.local").await, 200);
        assert_eq!(status(&sg, spelling, &a, "test.local").await, 429, "{spelling} escaped the limit");
        assert_eq!(status(&sg, spelling, &b, "test.local").await, 200, "{spelling}");
        assert_eq!(status(&sg, "/login", &b, "test.local").await, 429, "{spelling} was not counted");
    }
    // Case is significant, as in nginx: /LOGIN is another path, on the catch-all route.
    assert_eq!(status(&sg, "/LOGIN", "192.0.2.200", "test.local").await, 200);
    assert_eq!(status(&sg, "/LOGIN", "192.0.2.200", "test.local").await, 200);
}

#[tokio::test]
async fn no_spelling_of_an_exact_path_or_a_host_route_escapes_its_limit_or_ban() {
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&config(&backend));
    for (n, spelling) in ["//exact", "/./exact", "/y/../exact", "/%65xact", "/exact/."].iter().enumerate() {
        let ip = format!("192.0.2.{n}");
        assert_eq!(status(&sg, "/exact", &ip, "test.local").await, 200);
        // `/exact/.` is `/exact/`, another path than the exact route's.
        let want = if spelling.ends_with('.') { 200 } else { 429 };
        assert_eq!(status(&sg, spelling, &ip, "test.local").await, want, "{spelling}");
    }
    // The path key counts the normalized path, and the ban holds for every spelling.
    let ip = "203.0.113.9";
    assert_eq!(status(&sg, "/panel/a", ip, "admin.local").await, 200);
    assert_eq!(status(&sg, "/panel//a", ip, "ADMIN.local:80").await, 429, "rejected, and banned");
    for spelling in ["/panel/a", "/panel/./a", "/%70anel/a", "/panel/x/../a", "/panel%2Fa"] {
        assert_eq!(status(&sg, spelling, ip, "admin.local").await, 429, "{spelling} escaped the ban");
    }
}

#[tokio::test]
async fn no_spelling_escapes_a_concurrency_limit() {
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&config(&backend));
    // The slot is held while the body streams (the backend holds it until released).
    let held =
        send(sg.addr, http::Request::get("/stream").header("host", "test.local").body(String::new()).unwrap()).await;
    assert_eq!(held.status(), 200);
    for spelling in ["//stream", "/./stream", "/s/../stream", "/%73tream", "/%2fstream"] {
        assert_eq!(status(&sg, spelling, "127.0.0.1", "test.local").await, 429, "{spelling}");
    }
    backend.release.notify_one();
    assert_eq!(read(held).await.text(), "first\nrest\n");
    assert_eq!(backend.hits().len(), 1, "a refused spelling reached the upstream");
}

#[tokio::test]
async fn paths_above_the_root_or_with_an_encoded_nul_get_400_and_are_never_forwarded() {
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&config(&backend));
    for target in ["/..", "/../etc/passwd", "/a/../../etc/passwd", "/%2e%2e/x", "/a/..%2f..%2fx", "/x%00.php", "/%zz"] {
        assert_eq!(status(&sg, target, "192.0.2.1", "test.local").await, 400, "{target}");
    }
    assert!(backend.hits().is_empty(), "a bad path was forwarded: {:?}", backend.hits());
}

#[tokio::test]
async fn the_upstream_receives_the_request_target_byte_for_byte() {
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&config(&backend));
    for target in ["/a//b/./c/../d?q=%2F..&x", "/%6cogin?next=/x/../y", "/x/%2e%2e/static/%7Efile"] {
        assert_eq!(status(&sg, target, &format!("192.0.2.{}", target.len()), "test.local").await, 200);
        assert_eq!(backend.hits().last().unwrap().path_and_query, target);
    }
}
