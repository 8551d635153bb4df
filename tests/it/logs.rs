//! Rejection lines: a flood cannot turn them into a flood of log lines, and credentials
//! in keys stay out of them unless asked for.

use crate::common::*;

#[tokio::test]
async fn a_flood_of_rejections_writes_a_few_lines_a_second_and_one_summary() {
    let sg = Sluicegate::start(
        "listen: 127.0.0.1:0\ntrusted_proxies: [127.0.0.1/32]\nlimits:\n  l: { key: ip, rate: 1r/h, log_lines_per_second: 3 }\nroutes:\n  - respond: { status: 200 }\n    limits: [l]\n",
    );
    assert_eq!(get(sg.addr, "/", &[("x-forwarded-for", "192.0.2.1")]).await.status, 200);
    let started = std::time::Instant::now();
    for n in 0..200 {
        // Mostly one client, a few others once each.
        let ip = if n % 10 == 0 { format!("198.51.100.{}", n / 10) } else { "192.0.2.1".to_owned() };
        let status = get(sg.addr, "/", &[("x-forwarded-for", &ip)]).await.status;
        assert_eq!(status, if n % 10 == 0 { 200 } else { 429 });
    }
    let seconds = started.elapsed().as_secs() + 2;
    // Every rejection is either a line or counted in a summary, which the next second's
    // flush writes.
    let counted = |log: &str| {
        let lines = log.lines().filter(|l| l.contains("\"request rejected\"")).count() as u64;
        let left_out: u64 = log
            .lines()
            .filter(|l| l.contains("lines left out"))
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["fields"]["left_out"].as_u64().unwrap())
            .sum();
        (lines, left_out)
    };
    let log = sg.wait_for_log("180 rejections logged or left out", |log| {
        let (lines, left_out) = counted(log);
        lines + left_out == 180
    });
    let (lines, left_out) = counted(&log);
    assert_eq!(lines + left_out, 180, "{log}");
    assert!(lines <= 3 * seconds, "{lines} lines in about {seconds} s");
    let summary = log.lines().find(|l| l.contains("lines left out")).unwrap();
    assert!(summary.contains("ip=192.0.2.1 ("), "the most refused key is named: {summary}");
}

/// The access log's lines, once `n` are written (at most 10 s).
pub fn access_lines(path: &std::path::Path, n: usize) -> Vec<String> {
    let read = || std::fs::read_to_string(path).unwrap_or_default().lines().map(str::to_owned).collect::<Vec<_>>();
    block_until(&format!("{n} access log lines"), std::time::Duration::from_secs(10), || read().len() >= n);
    read()
}

#[tokio::test]
async fn the_access_log_has_one_json_line_per_request_with_what_became_of_it() {
    let backend = Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let sg = Sluicegate::start(&format!(
        r#"
listen: 127.0.0.1:0
access_log: {{ format: json, path: "{}" }}
upstreams:
  b: {{ servers: ["{}"] }}
limits:
  l: {{ key: ip, rate: 1r/h }}
routes:
  - name: hello
    match: {{ path: /hello }}
    respond: {{ status: 200, body: "hello\n" }}
    limits: [l]
  - name: api
    match: {{ path_prefix: /api }}
    upstream: b
"#,
        path.display(),
        backend.addr
    ));
    assert_eq!(get(sg.addr, "/hello?x=1", &[("user-agent", "probe/1")]).await.status, 200);
    assert_eq!(get(sg.addr, "/hello", &[]).await.status, 429);
    assert_eq!(get(sg.addr, "/nothing", &[]).await.status, 404);
    assert_eq!(get(sg.addr, "/api/x", &[]).await.status, 200);
    let lines = access_lines(&path, 4);
    let json: Vec<serde_json::Value> = lines.iter().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(json.len(), 4, "{lines:?}");
    let field = |i: usize, name: &str| json[i][name].clone();
    assert_eq!(field(0, "target"), "/hello?x=1");
    assert_eq!((field(0, "status"), field(0, "bytes")), (200.into(), 6.into()));
    assert_eq!((field(0, "route"), field(0, "outcome")), ("hello".into(), "passed".into()));
    assert_eq!((field(0, "client"), field(0, "user_agent")), ("127.0.0.1".into(), "probe/1".into()));
    assert_eq!((field(1, "status"), field(1, "outcome")), (429.into(), "rejected".into()));
    assert_eq!(
        (field(2, "status"), field(2, "route"), field(2, "outcome")),
        (404.into(), serde_json::Value::Null, "no_route".into())
    );
    assert_eq!((field(3, "status"), field(3, "route"), field(3, "bytes")), (200.into(), "api".into(), 2.into()));
    assert!(field(3, "upstream_ms").as_f64().unwrap() > 0.0);
    assert!(field(0, "upstream_ms").is_null(), "a static route has no upstream time");
    assert!(field(0, "time").as_str().unwrap().ends_with('Z'));
    assert!(json.iter().all(|line| line.get("keys").is_none()), "keys are recorded only when asked for");
}

/// A log recording keys, with `log_keys` as `mode` (`""`: the default): a route `/a`
/// whose limits count by cookie, API key, tenant and client, exempting `10.9.9.9`.
fn recording_keys(path: &std::path::Path, mode: &str) -> String {
    format!(
        "listen: 127.0.0.1:0
trusted_proxies: [127.0.0.1]
{mode}
access_log: {{ format: json, path: \"{}\", keys: true, keys_secret: \"0123456789abcdef\" }}
limits:
  session: {{ key: [ip, \"cookie:sid\"], rate: 10r/s }}
  api: {{ key: [\"header:x-api-key\", \"header:x-tenant\"], on_missing_key: skip, rate: 10r/s }}
routes:
  - match: {{ path_prefix: /a }}
    limits: [session, api]
    allow: {{ cidrs: [10.9.9.9/32] }}
    respond: {{ status: 200 }}
",
        path.display()
    )
}

#[tokio::test]
async fn recorded_keys_keep_credentials_out_of_the_access_log_unless_asked_for() {
    let credentials = [("cookie", "lang=en; sid=s-789-session"), ("x-api-key", "k-456-apikey"), ("x-tenant", "acme")];
    for mode in ["", "log_keys: hashed_secrets", "log_keys: hashed", "log_keys: clear"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let sg = Sluicegate::start(&recording_keys(&path, mode));
        assert_eq!(get(sg.addr, "/a", &credentials).await.status, 200);
        let exempt = [credentials.as_slice(), &[("x-forwarded-for", "10.9.9.9")]].concat();
        assert_eq!(get(sg.addr, "/a", &exempt).await.status, 200);
        assert_eq!(get(sg.addr, "/nothing", &credentials).await.status, 404);
        let lines = access_lines(&path, 3);
        let json: Vec<serde_json::Value> = lines.iter().map(|l| serde_json::from_str(l).unwrap()).collect();
        let keys = &json[0]["keys"];
        let names: Vec<&String> = keys.as_object().unwrap().keys().collect();
        assert_eq!(names, ["cookie:sid", "header:x-api-key", "header:x-tenant"], "{mode}: the client is in the line");
        assert_eq!(json[1]["keys"], serde_json::json!({}), "{mode}: the route's allow-list exempted it");
        assert!(json[2]["keys"].is_null(), "{mode}: no route, no limit");
        let text = std::fs::read_to_string(&path).unwrap();
        let digest = |name: &str| keys[name].as_str().unwrap().starts_with('#');
        if mode == "log_keys: clear" {
            assert_eq!(
                (keys["cookie:sid"].as_str(), keys["header:x-api-key"].as_str()),
                (Some("s-789-session"), Some("k-456-apikey"))
            );
            continue;
        }
        for secret in ["s-789-session", "k-456-apikey"] {
            assert!(!text.contains(secret), "{mode}: a credential in clear in the access log:\n{text}");
        }
        assert!(digest("cookie:sid") && digest("header:x-api-key"), "{mode}: {keys}");
        assert_eq!(digest("header:x-tenant"), mode == "log_keys: hashed", "{mode}: {keys}");
    }
}

#[tokio::test]
async fn the_access_log_speaks_nginx_combined() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let sg = Sluicegate::start(&format!(
        "listen: 127.0.0.1:0\naccess_log: {{ format: combined, path: \"{}\" }}\nroutes:\n  - respond: {{ status: 201, body: abc }}\n",
        path.display()
    ));
    get(sg.addr, "/a?b=c", &[("referer", "http://r.example/"), ("user-agent", "curl/8.0")]).await;
    let lines = access_lines(&path, 1);
    let line = &lines[0];
    assert!(line.starts_with("127.0.0.1 - - ["), "{line}");
    assert!(line.ends_with(r#"] "GET /a?b=c HTTP/1.1" 201 3 "http://r.example/" "curl/8.0""#), "{line}");
}

/// A bearer-keyed limit that admits one request a minute; `extra` is added at the top.
fn bearer_limited(extra: &str) -> String {
    format!(
        "listen: 127.0.0.1:0\n{extra}\nlimits:\n  per_token: {{ key: [ip, bearer], rate: 1r/m, nodelay: true, log_level: warn }}\nroutes:\n  - name: api\n    limits: [per_token]\n    respond: {{ status: 200 }}\n"
    )
}

/// The log line of the second request with `Authorization: Bearer TOKEN`, refused.
async fn rejection_line(sg: &Sluicegate) -> String {
    let auth = [("authorization", "Bearer key-A-secret-token")];
    assert_eq!(get(sg.addr, "/", &auth).await.status, 200);
    assert_eq!(get(sg.addr, "/", &auth).await.status, 429);
    let log = sg.wait_for_log("the line \"request rejected\"", |log| log.contains("request rejected"));
    log.lines().find(|l| l.contains("request rejected")).unwrap_or_else(|| panic!("{log}")).to_owned()
}

#[tokio::test]
async fn bearer_tokens_are_logged_hashed_unless_the_operator_asks_for_them() {
    for extra in ["", "log_keys: hashed_secrets"] {
        let sg = Sluicegate::start(&bearer_limited(extra));
        let line = rejection_line(&sg).await;
        assert!(line.contains("\"key\":\"ip=127.0.0.1 bearer=#"), "{line}");
        assert!(!sg.log().contains("key-A-secret-token"), "{extra:?}: the token reached the log:\n{}", sg.log());
    }
    // Every part as its digest, and its older spelling.
    for extra in ["log_keys: hashed", "redact_keys: true"] {
        let sg = Sluicegate::start(&bearer_limited(extra));
        let line = rejection_line(&sg).await;
        assert!(
            line.contains("\"key\":\"ip=#") && line.contains(" bearer=#") && !line.contains("127.0.0.1"),
            "{extra}: {line}"
        );
        assert!(!sg.log().contains("key-A-secret-token"), "{extra:?}: the token reached the log");
    }
    let sg = Sluicegate::start(&bearer_limited("log_keys: clear"));
    let line = rejection_line(&sg).await;
    assert!(line.contains("\"key\":\"ip=127.0.0.1 bearer=key-A-secret-token\""), "{line}");
}

#[test]
fn log_keys_and_redact_keys_together_are_refused() {
    let (_dir, path) = config_file("listen: 127.0.0.1:0\nlog_keys: clear\nredact_keys: true\n");
    let out = binary().arg("check").arg("-c").arg(&path).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains(":3:14: redact_keys: give either `log_keys` or `redact_keys: true`"), "{stderr}");
}
