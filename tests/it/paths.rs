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

/// RFC 9112 §3.2.1: a target has no fragment. Cut off where the backend cuts it (every
/// URL parser does), `/login#/../public` would be limited as `/public` and served as
/// `/login`: it is refused, as nothing the proxy forwards may be routed as another path.
#[tokio::test]
async fn a_fragment_in_the_target_is_a_400_and_never_forwarded() {
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&config(&backend));
    let ip = "192.0.2.77";
    assert_eq!(status(&sg, "/login", ip, "test.local").await, 200);
    for target in [
        "/login#/../../public",
        "/r/prefix/x#/../../z",
        "/exact#x",
        "/login#",
        "/login?next=1#/../x",
        "/x#/../login",
        "/stream#1",
        "http://test.local/login#/../x",
    ] {
        assert_eq!(status(&sg, target, ip, "test.local").await, 400, "{target}");
    }
    assert_eq!(backend.hits().len(), 1, "a target with a fragment was forwarded: {:?}", backend.hits());
}

/// HTTP/2's `:path` holds no fragment either: hyper's URI parser cuts a `#` and what
/// follows, so the path routed, limited and forwarded is the same one (`/login`), as a
/// URL parser reads it. Sent in a hand-written HEADERS frame, since every client drops
/// the fragment before sending.
#[tokio::test]
async fn an_http2_path_with_a_fragment_is_routed_and_forwarded_as_the_path_before_it() {
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&config(&backend));
    assert_eq!(h2_raw_status(sg.addr, "/login#/../public").await, 200);
    // The login route's limit took it: the next login (from the same address) is refused.
    assert_eq!(get_h2(sg.addr, "/login").await.status, 429);
    assert_eq!(backend.hits().iter().map(|h| h.path_and_query.as_str()).collect::<Vec<_>>(), ["/login"]);
}

/// Sends `GET path` (`path` as bytes, unchecked) on a new h2c connection from 127.0.0.1
/// and returns the response's `:status`, read from its HEADERS frame: one of those in
/// HPACK's static table (RFC 7541 Appendix A), which the test expects.
async fn h2_raw_status(addr: std::net::SocketAddr, path: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut block = vec![0x82, 0x86]; // :method GET, :scheme http
    for (index, value) in [(4u8, path), (1, "test.local")] {
        // Literal without indexing, name indexed (:path 4, :authority 1), no Huffman.
        block.push(index);
        block.push(value.len() as u8);
        block.extend_from_slice(value.as_bytes());
    }
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]); // SETTINGS, empty
    let len = block.len();
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, 1, 0x05, 0, 0, 0, 1]);
    out.extend_from_slice(&block);
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(&out).await.unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut buf = Vec::new();
    loop {
        // Frames: 9-byte header, then the payload.
        let mut at = 0;
        while buf.len() >= at + 9 {
            let len = (usize::from(buf[at]) << 16) | (usize::from(buf[at + 1]) << 8) | usize::from(buf[at + 2]);
            if buf.len() < at + 9 + len {
                break;
            }
            let (kind, stream_id) =
                (buf[at + 3], u32::from_be_bytes([buf[at + 5], buf[at + 6], buf[at + 7], buf[at + 8]]));
            if kind == 1 && stream_id == 1 {
                const STATIC: [u16; 7] = [200, 204, 206, 304, 400, 404, 500];
                let first = buf[at + 9];
                return match first.checked_sub(0x88).and_then(|i| STATIC.get(usize::from(i))) {
                    Some(&status) => status,
                    None => panic!("{path}: a status outside the static table: {:x?}", &buf[at + 9..at + 9 + len]),
                };
            }
            assert!(!(kind == 3 && stream_id == 1), "{path}: the stream was reset");
            at += 9 + len;
        }
        let mut piece = [0u8; 4096];
        let read = tokio::time::timeout_at(deadline, stream.read(&mut piece)).await;
        let n = read.unwrap_or_else(|_| panic!("{path}: no response within 5 s")).unwrap();
        assert!(n > 0, "{path}: the connection closed without a response");
        buf.extend_from_slice(&piece[..n]);
    }
}
