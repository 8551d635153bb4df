//! What limit keys read of a request, end to end.

use crate::common::*;

/// A request's path and headers, and what its 400 must say.
type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);

/// A request that repeats a field a limit of its route is keyed on is refused with 400
/// and never forwarded: the limiter reads the first value, the upstream might read another.
#[tokio::test]
async fn repeated_fields_a_limit_is_keyed_on_get_400_and_are_not_forwarded() {
    let backend = Backend::start().await;
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
upstreams:
  b: {{ servers: ["{}"] }}
limits:
  per_key: {{ key: "header:x-api-key", on_missing_key: skip, rate: 100r/s }}
  per_user: {{ key: [bearer, "query:user", "cookie:sid"], on_missing_key: skip, rate: 100r/s }}
routes:
  - {{ match: {{ path_prefix: /open }}, upstream: b }}
  - {{ upstream: b, limits: [per_key, per_user] }}
"#,
        backend.addr
    );
    let sg = Sluicegate::start(&yaml);
    let cases: [Case<'_>; 5] = [
        (
            "/",
            &[("x-api-key", "mine"), ("x-api-key", "someone-else")],
            "limit \"per_key\" counts requests by the header `x-api-key`",
        ),
        (
            "/",
            &[("authorization", "Bearer a"), ("authorization", "Bearer b")],
            "limit \"per_user\" counts requests by the `Authorization` header",
        ),
        ("/?user=a&user=b", &[], "limit \"per_user\" counts requests by the query parameter `user`"),
        ("/", &[("cookie", "sid=a; theme=dark; sid=b")], "limit \"per_user\" counts requests by the cookie `sid`"),
        ("/", &[("cookie", "sid=a"), ("cookie", "sid=b")], "the cookie `sid`"),
    ];
    for (path, headers, why) in cases {
        let reply = get(sg.addr, path, headers).await;
        assert_eq!(reply.status, 400, "{path} {headers:?}");
        assert!(reply.text().contains(why), "{path} {headers:?}: {}", reply.text());
        assert!(reply.text().contains("carries more than once; send it once"), "{}", reply.text());
    }
    assert!(backend.hits().is_empty(), "a request with a repeated key field reached the upstream");

    // Each once, or repeated fields no limit is keyed on: forwarded.
    let once = [
        ("x-api-key", "mine"),
        ("authorization", "Bearer a"),
        ("cookie", "sid=a; theme=dark"),
        ("x-other", "1"),
        ("x-other", "2"),
    ];
    assert_eq!(get(sg.addr, "/?user=a&page=1&page=2", &once).await.status, 200);
    // A route without limits does not care.
    assert_eq!(get(sg.addr, "/open", &[("x-api-key", "a"), ("x-api-key", "b")]).await.status, 200);
    assert_eq!(backend.hits().len(), 2);
}

/// A limit on trial (`dry_run`) never refuses: a repeated key field is logged instead.
#[tokio::test]
async fn a_dry_run_limit_lets_a_repeated_key_field_through_and_logs_it() {
    let sg = Conf::new()
        .limit("trial", "key: \"header:x-api-key\", on_missing_key: skip, rate: 100r/s, dry_run: true")
        .answering("trial")
        .start();
    assert_eq!(get(sg.addr, "/", &[("x-api-key", "a"), ("x-api-key", "b")]).await.status, 200);
    let log = sg.wait_for_log("the line \"repeated key field\"", |log| log.contains("repeated key field"));
    assert!(log.contains("dry run: request would be refused: repeated key field"), "{log}");
}

/// HTTP/2 browsers send each cookie as a field of its own (RFC 9113 §8.2.3): a limit
/// keyed on the whole `Cookie` header is exempt from the repeated-field 400, on both
/// protocols, and counts by the first.
#[tokio::test]
async fn a_cookie_header_split_in_fields_is_no_repeated_key_field() {
    let backend = Backend::start().await;
    let sg = Conf::new()
        .upstream(&backend)
        .limit("by_cookie", "key: \"header:cookie\", on_missing_key: skip, rate: 1r/m")
        .forwarding("by_cookie")
        .start();
    let split = |path: &str| {
        http::Request::get(format!("http://test.local{path}"))
            .header("cookie", "sid=a")
            .header("cookie", "theme=dark")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap()
    };
    assert_eq!(request_h2(sg.addr, split("/one")).await.status, 200);
    // The same first cookie: the same key, its one request a minute spent.
    assert_eq!(request_h2(sg.addr, split("/two")).await.status, 429);
    let http1 = get(sg.addr, "/three", &[("cookie", "sid=b"), ("cookie", "theme=dark")]).await;
    assert_eq!(http1.status, 200, "{}", http1.text());
    let seen: Vec<String> = backend.hits().iter().map(|h| h.path_and_query.clone()).collect();
    assert_eq!(seen, ["/one", "/three"]);
}
