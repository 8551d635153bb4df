//! `sluicegate explain` and `POST /explain`: the route, the keys, the limits' decisions
//! and the answer, said before the request is sent, and what a real request then gets.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use serde_json::Value;

use crate::common::*;

/// `sluicegate explain --json ARGS` on the configuration file `config`: the explanation.
fn explain(config: &Path, args: &[&str]) -> Value {
    let output = binary().arg("explain").arg("-c").arg(config).arg("--json").args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "explain {args:?}: {}\n{stdout}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// The same, in plain words.
fn explain_text(config: &Path, args: &[&str]) -> String {
    let output = binary().arg("explain").arg("-c").arg(config).args(args).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The value of the answer's header `name`.
fn header<'a>(explained: &'a Value, name: &str) -> Option<&'a str> {
    explained["answer"]["headers"].as_array()?.iter().find(|h| h[0] == name).and_then(|h| h[1].as_str())
}

/// The explanation of limit `name`.
fn limit<'a>(explained: &'a Value, name: &str) -> &'a Value {
    let limits = explained["limits"].as_array().unwrap();
    limits.iter().find(|l| l["limit"] == name).unwrap_or_else(|| panic!("no limit {name} in {explained:#}"))
}

const CONFIG: &str = r#"listen: 127.0.0.1:0
ratelimit_headers: all
limits:
  per_ip: { key: ip, rate: 10r/s, burst: 5 }
  per_key: { key: "header:x-api-key", on_missing_key: skip, rate: 100r/s, burst: 100 }
  pair: { key: [ip, "header:x-tenant"], rate: 100r/s, burst: 100 }
  login: { key: ip, rate: 1r/m, ban: 10m }
  heavy: { key: ip, rate: 1r/s, burst: 5, nodelay: true }
routes:
  - name: login
    match: { path_prefix: /login, methods: [POST] }
    respond: { status: 200 }
    limits: [login]
  - name: reports
    match: { host: reports.example.com }
    respond: { status: 200 }
    limits: [heavy]
    cost: 3
  - name: api
    match: { path_prefix: /api/ }
    respond: { status: 200 }
    limits: [per_ip, per_key, pair]
"#;

#[test]
fn a_request_for_a_later_route_says_why_each_earlier_one_did_not_match_with_its_line() {
    let (_dir, config) = config_file(CONFIG);
    let explained = explain(&config, &["http://Example.COM:8080/api/./x/../users"]);
    assert_eq!(explained["path"], "/api/users", "the normalized path");
    assert_eq!(explained["host"], "example.com", "the host without port, in lower case");
    assert_eq!(explained["route"]["name"], "api");
    assert_eq!(explained["route"]["line"], 19, "the route's line in the file");
    let passed = explained["passed_over"].as_array().unwrap();
    assert_eq!(passed.len(), 2, "{explained:#}");
    assert_eq!(passed[0]["route"], "login");
    assert_eq!(passed[0]["line"], 10);
    assert_eq!(
        passed[0]["why"],
        serde_json::json!(["path /api/users does not start with /login", "method GET is not one of POST"])
    );
    assert_eq!(passed[1]["why"], serde_json::json!(["host example.com is not reports.example.com"]));
    assert_eq!(explained["answer"]["outcome"], "passed");
    assert_eq!(explained["answer"]["status"], 200);
    let text = explain_text(&config, &["http://example.com/api/users"]);
    assert!(text.contains("route login (line 10) not taken: path /api/users does not start with /login"), "{text}");
    assert!(text.contains("route api (line 19) taken: respond 200"), "{text}");
}

#[test]
fn a_request_no_route_takes_lists_every_route_and_is_answered_404() {
    let (_dir, config) = config_file(CONFIG);
    let explained = explain(&config, &["http://example.com/nothing"]);
    assert_eq!(explained["route"], Value::Null);
    assert_eq!(explained["passed_over"].as_array().unwrap().len(), 3);
    assert_eq!(explained["answer"]["status"], 404);
    assert_eq!(explained["answer"]["reason"], "no route matches");
}

#[test]
fn a_limit_whose_key_is_missing_says_so_and_skips_the_request_while_a_tuple_counts_what_it_has() {
    let (_dir, config) = config_file(CONFIG);
    let explained = explain(&config, &["--peer", "192.0.2.7", "http://example.com/api/x"]);
    let per_key = limit(&explained, "per_key");
    assert_eq!(per_key["key"], Value::Null);
    assert_eq!(per_key["missing"], serde_json::json!(["header:x-api-key"]));
    assert_eq!(
        per_key["skipped"],
        "the request has no header:x-api-key: the limit does not count it (on_missing_key: skip)"
    );
    assert_eq!(per_key["outcome"], Value::Null, "no decision of its own");
    let pair = limit(&explained, "pair");
    assert_eq!(pair["key"], "ip=192.0.2.7 header:x-tenant=-", "written as log lines write it");
    assert_eq!(pair["missing"], serde_json::json!(["header:x-tenant"]));
    assert_eq!(pair["skipped"], Value::Null, "a tuple is missing only when every part is");
    assert_eq!(pair["outcome"], "passed");
    // With the header, its value is a credential by its name: written as its digest.
    let keyed = explain(&config, &["-H", "X-Api-Key: k1", "http://example.com/api/x"]);
    let key = limit(&keyed, "per_key")["key"].as_str().unwrap();
    assert!(key.starts_with("header:x-api-key=#") && key.len() == "header:x-api-key=#".len() + 32, "{key}");
}

#[test]
fn a_request_repeating_a_key_field_is_explained_as_the_400_it_gets() {
    let (_dir, config) = config_file(CONFIG);
    let explained = explain(&config, &["-H", "x-api-key: a", "-H", "x-api-key: b", "http://example.com/api/x"]);
    assert_eq!(explained["answer"]["status"], 400);
    let reason = explained["answer"]["reason"].as_str().unwrap();
    assert!(reason.starts_with("limit \"per_key\" counts requests by"), "{reason}");
}

#[test]
fn a_missing_key_is_explained_as_its_limits_on_missing_key_says() {
    let yaml = |mode: &str| {
        Conf::new()
            .limit("k", &format!("key: \"header:x-api-key\", rate: 1r/m, on_missing_key: {mode}"))
            .answering("k")
            .yaml()
    };
    let (_dir, refuse) = config_file(&yaml("refuse"));
    let refused = explain(&refuse, &["http://example.com/"]);
    assert_eq!(refused["answer"]["status"], 400);
    assert_eq!(
        refused["answer"]["reason"],
        "limit \"k\" counts requests by header:x-api-key, which this request lacks"
    );
    let (_dir, shared) = config_file(&yaml("shared"));
    let second = explain(&shared, &["--after", "1", "http://example.com/"]);
    assert_eq!(limit(&second, "k")["skipped"], Value::Null, "counted, under the one shared key");
    assert_eq!(second["answer"]["status"], 429, "the first request without a key spent the shared key's quota");
}

#[test]
fn a_delayed_request_is_told_its_exact_delay_after_identical_requests() {
    let (_dir, config) = config_file(CONFIG);
    // 10r/s, burst 5: three at once leave an excess of 2; the fourth waits 3 / 10 s.
    let explained = explain(&config, &["--after", "3", "http://example.com/api/x"]);
    assert_eq!(explained["after"], 3);
    assert_eq!(explained["answer"]["outcome"], "delayed");
    assert_eq!(explained["answer"]["wait_ms"], 300.0);
    let per_ip = limit(&explained, "per_ip");
    assert_eq!(per_ip["outcome"], "delayed");
    assert_eq!(per_ip["after"][0]["ms"], 300.0);
    assert_eq!(per_ip["after"][0]["excess"], 3.0);
    let fresh = explain(&config, &["http://example.com/api/x"]);
    assert_eq!(fresh["answer"]["outcome"], "passed");
    assert_eq!(fresh["answer"]["wait_ms"], 0.0);
    let text = explain_text(&config, &["--after", "3", "http://example.com/api/x"]);
    assert!(text.contains("answer: delayed 200, after a wait of 300 ms"), "{text}");
}

#[test]
fn a_weighted_request_counts_its_cost_and_is_refused_when_it_no_longer_fits() {
    let (_dir, config) = config_file(CONFIG);
    let url = "http://reports.example.com/r";
    // 1r/s, burst 5, nodelay, cost 3: an excess of 2, then 5, then 8 > 5.
    let second = explain(&config, &["--after", "1", url]);
    assert_eq!(second["cost"], 3);
    assert_eq!(second["answer"]["outcome"], "passed");
    assert_eq!(limit(&second, "heavy")["after"][0]["excess"], 5.0);
    assert_eq!(header(&second, "ratelimit"), Some("\"heavy\";r=0;t=6"), "{second:#}");
    let third = explain(&config, &["--after", "2", url]);
    assert_eq!(third["answer"]["outcome"], "rejected");
    assert_eq!(third["answer"]["status"], 429);
    assert_eq!(header(&third, "retry-after"), Some("3"), "an excess of 8 is 5 again in 3 s");
    assert_eq!(limit(&third, "heavy")["after"][0]["ms"], 3000.0);
}

#[test]
fn a_banned_key_is_refused_for_the_bans_time_left() {
    let (_dir, config) = config_file(CONFIG);
    // The first passes, the second is refused and starts a ten-minute ban.
    let explained = explain(&config, &["-X", "POST", "--after", "2", "http://example.com/login"]);
    let login = limit(&explained, "login");
    assert!(login["before"]["ban_left_ms"].as_u64().is_some_and(|ms| ms > 599_000 && ms <= 600_000), "{login:#}");
    assert_eq!(login["outcome"], "rejected");
    assert_eq!(explained["answer"]["status"], 429);
    assert_eq!(header(&explained, "retry-after"), Some("600"));
    // The request that starts the ban says so.
    let starting = explain(&config, &["-X", "POST", "--after", "1", "http://example.com/login"]);
    assert_eq!(limit(&starting, "login")["outcome"], "banned");
    assert_eq!(starting["answer"]["outcome"], "banned");
    assert_eq!(header(&starting, "retry-after"), Some("600"));
}

#[test]
fn a_request_http_cannot_carry_is_refused_with_exit_2() {
    let (_dir, config) = config_file(CONFIG);
    for args in [&["-H", "no colon", "http://a/"][..], &["-X", "G T", "http://a/"], &["ftp://a/"]] {
        let output = binary().arg("explain").arg("-c").arg(&config).args(args).output().unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&output.stderr).starts_with("sluicegate: explain: invalid"), "{args:?}");
    }
}

/// `POST /explain` of `body` on the admin listener at `admin`, with the token.
async fn post_explain(admin: std::net::SocketAddr, body: &str) -> Reply {
    let asked = http::Request::post("/explain")
        .header("host", admin.to_string())
        .header("authorization", "Bearer s3cret")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    request(admin, asked).await
}

const LIVE: &str = r#"listen: 127.0.0.1:0
admin: { listen: 127.0.0.1:0, token: s3cret }
limits:
  once: { key: "header:x-user", on_missing_key: skip, rate: 1r/h }
  login: { key: ip, rate: 1r/h, ban: 10m }
routes:
  - { match: { path: /login }, respond: { status: 200 }, limits: [login] }
  - { respond: { status: 200 }, limits: [once] }
"#;

#[tokio::test]
async fn post_explain_spends_nothing_and_the_next_real_request_gets_what_it_said() {
    let sg = Sluicegate::start(LIVE);
    let admin = sg.admin_addr();
    let asked = r#"{"url": "http://example.com/x", "headers": {"x-user": "alice"}}"#;
    // Asked again and again, a limit that admits one request per hour admits it still.
    for _ in 0..5 {
        let reply = post_explain(admin, asked).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let explained: Value = serde_json::from_str(&reply.text()).unwrap();
        assert_eq!(explained["state"], "live");
        assert_eq!(explained["answer"]["outcome"], "passed", "{explained:#}");
        assert_eq!(limit(&explained, "once")["key"], "header:x-user=alice");
    }
    let first = get(sg.addr, "/x", &[("x-user", "alice")]).await;
    assert_eq!(first.status, 200, "explain spent nothing: the one request of the hour passes");
    let explained: Value = serde_json::from_str(&post_explain(admin, asked).await.text()).unwrap();
    assert_eq!(explained["answer"]["status"], 429);
    let said = header(&explained, "retry-after").unwrap().parse::<u64>().unwrap();
    let second = get(sg.addr, "/x", &[("x-user", "alice")]).await;
    assert_eq!(second.status, 429, "as explain said");
    let got = second.header("retry-after").unwrap().parse::<u64>().unwrap();
    // Wall-clock time passes between the two: at most one second of it, on a loaded machine.
    assert!(got == said || got + 1 == said, "explain said Retry-After {said}, the request got {got}");
    assert_eq!(header(&explained, "ratelimit-policy"), second.header("ratelimit-policy"));
    // The command line asks the same through the file's admin address and token.
    let text = explain_text(&sg.config, &["--admin", &admin.to_string(), "-H", "x-user: bob", "http://example.com/x"]);
    assert!(text.contains("limits, from the running instance's state (nothing spent):"), "{text}");
    assert!(text.contains("answer: passed 200"), "{text}");
    assert_eq!(get(sg.addr, "/x", &[("x-user", "bob")]).await.status, 200);
    // `--admin` then the URL, as one writes it: the URL is the request, the address the
    // file's admin.listen.
    let dir = tempfile::tempdir().unwrap();
    let pointed = dir.path().join("sg.yaml");
    std::fs::write(&pointed, LIVE.replace("admin: { listen: 127.0.0.1:0", &format!("admin: {{ listen: {admin}")))
        .unwrap();
    let text = explain_text(&pointed, &["-H", "x-user: bob", "--admin", "http://example.com/x"]);
    assert!(text.contains("limits, from the running instance's state (nothing spent):"), "{text}");
    let answer = text.lines().find(|l| l.starts_with("answer:")).unwrap_or_default();
    assert!(answer.contains("429"), "bob's one request of the hour is spent: {text}");
    let output = binary().args(["explain", "-c"]).arg(&pointed).args(["--admin", "127.0.0.1:1"]).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("give the request's URL") && stderr.contains("--admin=ADDRESS"), "{stderr}");
}

#[tokio::test]
async fn post_explain_shows_a_live_ban_under_the_key_bans_lists() {
    let sg = Sluicegate::start(LIVE);
    let admin = sg.admin_addr();
    assert_eq!(get(sg.addr, "/login", &[]).await.status, 200);
    assert_eq!(get(sg.addr, "/login", &[]).await.status, 429, "refused: banned");
    let reply = post_explain(admin, r#"{"url": "http://example.com/login", "peer": "127.0.0.1"}"#).await;
    let explained: Value = serde_json::from_str(&reply.text()).unwrap();
    let login = limit(&explained, "login");
    assert!(login["before"]["ban_left_ms"].as_u64().is_some_and(|ms| ms > 500_000), "{login:#}");
    assert_eq!(explained["answer"]["outcome"], "rejected");
    let bans = request(
        admin,
        http::Request::get("/bans").header("authorization", "Bearer s3cret").body(Full::new(Bytes::new())).unwrap(),
    )
    .await;
    let bans: Value = serde_json::from_str(&bans.text()).unwrap();
    assert_eq!(bans["login"][0]["key"], login["key"], "one key, one name");
}

#[tokio::test]
async fn post_explain_needs_the_token_and_says_what_to_give() {
    let sg = Sluicegate::start(LIVE);
    let admin = sg.admin_addr();
    let unauthorized = request(
        admin,
        http::Request::post("/explain").body(Full::new(Bytes::from_static(b"{\"url\": \"/\"}"))).unwrap(),
    )
    .await;
    assert_eq!(unauthorized.status, 401);
    let bad = post_explain(admin, "{\"uri\": \"/\"}").await;
    assert_eq!(bad.status, 400);
    assert!(bad.text().starts_with("give the request as JSON"), "{}", bad.text());
    let bad_header = post_explain(admin, r#"{"url": "/", "headers": {"a b": "c"}}"#).await;
    assert_eq!(bad_header.status, 400);
    assert!(bad_header.text().starts_with("invalid header"), "{}", bad_header.text());
    let get_it = request(
        admin,
        http::Request::get("/explain").header("authorization", "Bearer s3cret").body(Full::new(Bytes::new())).unwrap(),
    )
    .await;
    assert_eq!(get_it.status, 405);
}

/// `CONFIG` with a JSON access log at `log` that records keys.
fn logging(log: &Path) -> String {
    CONFIG.replacen(
        "ratelimit_headers: all\n",
        &format!(
            "ratelimit_headers: all\naccess_log: {{ format: json, path: \"{}\", keys: true, keys_secret: \"0123456789abcdef\" }}\n",
            log.display()
        ),
        1,
    )
}

#[tokio::test]
async fn an_access_log_line_is_explained_as_the_request_it_records_saying_what_a_line_cannot_carry() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let sg = Sluicegate::start(&logging(&log));
    let sent = get(sg.addr, "/api/x", &[("x-api-key", "k1"), ("x-tenant", "t1")]).await;
    assert_eq!(sent.status, 200);
    let line = crate::logs::access_lines(&log, 1).remove(0);
    let explained = explain(&sg.config, &["--log-line", &line]);
    assert_eq!(explained["route"]["name"], "api", "{explained:#}");
    assert_eq!(explained["client"]["address"], "127.0.0.1");
    // The key parts the line records are the request's: the same keys as the request
    // given as curl gives it (a credential by the digest the line holds).
    let asked = explain(&sg.config, &["-H", "X-Api-Key: k1", "-H", "X-Tenant: t1", "http://example.com/api/x"]);
    for name in ["per_ip", "per_key", "pair"] {
        assert_eq!(limit(&explained, name)["key"], limit(&asked, name)["key"], "limit {name}");
    }
    assert_eq!(limit(&explained, "pair")["key"], "ip=127.0.0.1 header:x-tenant=t1");
    let notes = explained["notes"].to_string();
    assert!(notes.contains("every other field (Host included, unless it carries it) is taken as absent"), "{notes}");
    assert!(notes.contains("the line says it was answered 200"), "{notes}");
    // A field the line lacks is given with -H: here the host a later route matches on.
    let combined = r#"192.0.2.9 - - [22/Nov/2026:23:48:25 +0000] "GET /reports HTTP/1.1" 429 0 "-" "curl/8""#;
    let hosted = explain(&sg.config, &["--log-line", combined, "-H", "Host: reports.example.com"]);
    assert_eq!(hosted["route"]["name"], "reports", "{hosted:#}");
    assert_eq!(limit(&hosted, "heavy")["key"], "ip=192.0.2.9", "the client the line logged");
    let hostless = explain(&sg.config, &["--log-line", combined]);
    assert_eq!(hostless["answer"]["status"], 404, "routed as a request without a host, not refused as one");
    // What is no log line is refused, saying why, with exit 2.
    let output = binary().arg("explain").arg("-c").arg(&sg.config).args(["--log-line", "hello"]).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.starts_with("sluicegate: explain: cannot tell the line's format"), "{stderr}");
}

/// `sluicegate explain -c CONFIG ARGS -` with `raw` on standard input: its exit code, stdout
/// and stderr.
fn explain_stdin(config: &Path, args: &[&str], raw: &[u8]) -> (Option<i32>, String, String) {
    use std::io::Write;
    let mut child = binary()
        .arg("explain")
        .arg("-c")
        .arg(config)
        .args(args)
        .arg("-")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A child that refuses its arguments exits without reading its input: writing to it
    // may then find the pipe closed, which is no failure of the test.
    let _ = child.stdin.take().unwrap().write_all(raw);
    let output = child.wait_with_output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (output.status.code(), text(&output.stdout), text(&output.stderr))
}

#[tokio::test]
async fn a_raw_request_on_stdin_is_read_as_the_proxy_reads_it_and_a_head_it_refuses_gets_its_answer() {
    let sg = Sluicegate::start(CONFIG);
    let raw = b"POST /login HTTP/1.1\r\nHost: example.com\r\nX-Api-Key: k1\r\nContent-Length: 3\r\n\r\nabc";
    let (code, stdout, stderr) = explain_stdin(&sg.config, &["--json"], raw);
    assert_eq!(code, Some(0), "{stderr}");
    let explained: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!((explained["method"].as_str(), explained["route"]["name"].as_str()), (Some("POST"), Some("login")));
    // An absolute-form target names its host, and a Host naming another is refused as
    // the proxy refuses it.
    let (_, stdout, _) = explain_stdin(
        &sg.config,
        &["--json"],
        b"GET http://reports.example.com/x HTTP/1.1\r\nHost: reports.example.com\r\n\r\n",
    );
    let explained: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(explained["route"]["name"], "reports", "{explained:#}");
    let two_hosts = b"GET http://a.example/x HTTP/1.1\r\nHost: b.example\r\nConnection: close\r\n\r\n";
    let (_, stdout, _) = explain_stdin(&sg.config, &["--json"], two_hosts);
    let explained: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(explained["answer"]["status"], 400);
    assert_eq!(explained["answer"]["reason"], "Host differs from the request target's authority");
    let (status, body) = answered(sg.addr, two_hosts).await;
    assert_eq!((status, body.as_str()), (400, "Bad Request: Host differs from the request target's authority"));
    // A head the proxy's parser refuses: the status and reason the proxy answers, exit 2.
    for malformed in [
        &b"GET /api/x HTTP/1.1\r\nHost: a\r\nBad Field: x\r\n\r\n"[..],
        b"GET /api/x HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"GET /a#b HTTP/1.1\r\nHost: a\r\n\r\n",
    ] {
        let (code, stdout, stderr) = explain_stdin(&sg.config, &[], malformed);
        assert_eq!((code, stdout.as_str()), (Some(2), ""), "{stderr}");
        let (status, body) = answered(sg.addr, malformed).await;
        assert_eq!(stderr, format!("sluicegate: explain: the proxy answers {status} {body}\n"));
    }
    let (code, _, stderr) = explain_stdin(&sg.config, &[], b"GET / HTTP/1.1\r\nHost: a\r\n");
    assert_eq!(code, Some(2));
    assert!(stderr.contains("ends before its blank line"), "{stderr}");
    let (code, _, stderr) = explain_stdin(&sg.config, &["-H", "x: y"], b"GET / HTTP/1.1\r\n\r\n");
    assert_eq!(code, Some(2));
    assert!(stderr.contains("given whole"), "{stderr}");
}

/// What the proxy at `addr` answers `raw`: its status and its body's one line.
async fn answered(addr: std::net::SocketAddr, raw: &[u8]) -> (u16, String) {
    let answer = raw_exchange(addr, raw).await;
    let status = answer.get(9..12).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{answer}"));
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body).trim_end().to_owned();
    (status, body)
}

/// The steps before the limits are the proxy's own: a declared body over the route's
/// `max_body_bytes` is explained as its 413, and a token that does not verify as its
/// 401 with the challenge the proxy sends, on the route that took it (not passed over).
#[test]
fn a_body_too_large_and_a_forged_token_are_explained_as_the_proxy_answers_them() {
    use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
    let (_dir, config) = config_file(
        "listen: 127.0.0.1:0
jwt: { secret: \"0123456789abcdef0123456789abcdef\" }
limits:
  per_user: { key: \"jwt:sub\", rate: 1r/s, on_missing_key: skip }
routes:
  - { name: uploads, match: { path_prefix: /upload }, max_body_bytes: 1k, respond: { status: 200 } }
  - { name: api, match: { path_prefix: /api }, limits: [per_user], respond: { status: 200 } }
",
    );
    let large = explain(&config, &["-X", "POST", "-H", "content-length: 5000", "http://example.com/upload"]);
    assert_eq!((large["answer"]["status"].as_u64(), large["route"]["name"].as_str()), (Some(413), Some("uploads")));
    assert!(large["answer"]["reason"].as_str().unwrap().contains("larger than 1024"), "{large:#}");
    let small = explain(&config, &["-X", "POST", "-H", "content-length: 10", "http://example.com/upload"]);
    assert_eq!(small["answer"]["status"], 200);

    let claims = serde_json::json!({"sub": "alice", "exp": 4_000_000_000u64});
    let forged =
        encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(b"not the configured secret, no"))
            .unwrap();
    let explained = explain(&config, &["-H", &format!("authorization: Bearer {forged}"), "http://example.com/api/x"]);
    assert_eq!(explained["route"]["name"], "api", "{explained:#}");
    let passed_over: Vec<&str> =
        explained["passed_over"].as_array().unwrap().iter().map(|p| p["route"].as_str().unwrap()).collect();
    assert_eq!(passed_over, ["uploads"], "the route that took it is not passed over");
    assert_eq!(explained["answer"]["status"], 401);
    assert_eq!(header(&explained, "www-authenticate"), Some("Bearer error=\"invalid_token\""));
    assert!(explained["answer"]["reason"].as_str().unwrap().contains("signature"), "{explained:#}");
    let text = explain_text(&config, &["-H", &format!("authorization: Bearer {forged}"), "http://example.com/api/x"]);
    assert!(!text.contains("not taken: \n"), "{text}");
}

/// The commands Redis has run, as `INFO commandstats` counts them (`INFO` itself, which
/// asking counts, and `PING`, which the store's health check sends when it will, left
/// out).
fn redis_calls(redis: &crate::redis::Redis) -> Vec<String> {
    let stats = redis.command(&["INFO", "commandstats"]);
    let asked = |l: &&str| l.starts_with("cmdstat_info:") || l.starts_with("cmdstat_ping:");
    stats.lines().filter(|l| l.starts_with("cmdstat_") && !asked(l)).map(str::to_owned).collect()
}

/// `POST /explain` of a request a global limit decides sends Redis nothing: its answer
/// is the local preview's, and the one request a minute stays whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_explain_of_a_global_limit_sends_redis_nothing() {
    let redis = crate::redis::Redis::start();
    let sg = Conf::new()
        .set("admin: { listen: 127.0.0.1:0, token: s3cret }")
        .redis(&redis.url(), "timeout: 1s")
        .limit("shared", "key: \"header:x-user\", on_missing_key: skip, rate: 1r/m, scope: global")
        .answering("shared")
        .start();
    let admin = sg.admin_addr();
    // A decision first: the scripts are loaded, the connection made.
    assert_eq!(get(sg.addr, "/", &[("x-user", "bob")]).await.status, 200);
    let before = redis_calls(&redis);
    assert!(before.iter().any(|l| l.starts_with("cmdstat_evalsha:")), "{before:?}");
    for _ in 0..3 {
        let reply = post_explain(admin, r#"{"url": "http://example.com/x", "headers": {"x-user": "alice"}}"#).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let explained: Value = serde_json::from_str(&reply.text()).unwrap();
        assert_eq!(limit(&explained, "shared")["key"], "header:x-user=alice", "{explained:#}");
    }
    assert_eq!(redis_calls(&redis), before, "explain sent Redis a command");
    assert_eq!(get(sg.addr, "/", &[("x-user", "alice")]).await.status, 200, "alice's one request is whole");
    assert_eq!(get(sg.addr, "/", &[("x-user", "alice")]).await.status, 429);
}

/// `POST /explain` of a request that lacks a limit's key counts no missing key; the
/// same request sent does.
#[tokio::test]
async fn post_explain_of_a_request_without_a_limits_key_counts_no_missing_key() {
    let sg = Conf::new()
        .admin()
        .limit("per_user", "key: \"header:x-user\", rate: 1r/m, on_missing_key: skip")
        .answering("per_user")
        .start();
    let admin = sg.admin_addr();
    let series = "sluicegate_limit_missing_key_total{limit=\"per_user\"}";
    let before = Metrics::of(&sg).await.get(series).unwrap_or(0.0);
    for _ in 0..3 {
        let reply = post_explain(admin, r#"{"url": "http://example.com/x"}"#).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let explained: Value = serde_json::from_str(&reply.text()).unwrap();
        assert_eq!(limit(&explained, "per_user")["missing"], serde_json::json!(["header:x-user"]), "{explained:#}");
    }
    assert_eq!(Metrics::of(&sg).await.get(series).unwrap_or(0.0), before, "explain counted a missing key");
    assert_eq!(get(sg.addr, "/x", &[]).await.status, 200);
    assert_eq!(Metrics::of(&sg).await.value(series), before + 1.0, "a request sent is counted");
}

/// `POST /explain` of a request whose token names a key the fetched set lacks says it
/// is refused and wakes no fetch of the set; the same token sent does.
#[tokio::test]
async fn post_explain_of_a_token_with_an_unknown_kid_wakes_no_key_fetch() {
    use crate::tokens::{es256, fetches, key_server, now};
    let k1 = es256("k1");
    let served =
        std::sync::Arc::new(std::sync::Mutex::new(("200 OK", serde_json::json!({"keys": [k1.jwk]}).to_string())));
    let idp = key_server(&served).await;
    let sg = Conf::new()
        .set("admin: { listen: 127.0.0.1:0, token: s3cret }")
        .set(&format!("jwt: {{ jwks_url: \"http://{}/jwks\", jwks_refresh: 1h }}", idp.addr))
        .limit("per_user", "key: \"jwt:sub\", rate: 1r/m, on_missing_key: skip")
        .answering("per_user")
        .start();
    let admin = sg.admin_addr();
    wait_until("the first fetch", Duration::from_secs(10), async || sg.log().contains("\"JWKS fetched\"")).await;
    let fetched = Instant::now();
    // A woken fetch waits until 5 s after the last one: once they have passed (the time
    // itself is what is waited for), a fetch woken now is sent at once.
    wait_until("5 s since the first fetch", Duration::from_secs(10), async || {
        fetched.elapsed() > Duration::from_millis(5500)
    })
    .await;
    let unknown = es256("k9").token(Some("k9"), serde_json::json!({"sub": "alice", "exp": now() + 600}));
    let asked =
        serde_json::json!({"url": "http://example.com/x", "headers": {"authorization": format!("Bearer {unknown}")}});
    let reply = post_explain(admin, &asked.to_string()).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let explained: Value = serde_json::from_str(&reply.text()).unwrap();
    assert_eq!(explained["answer"]["status"], 401, "{explained:#}");
    // What is awaited is an absence: a fetch woken by the explanation would have been
    // sent at once; a second is long enough for it to reach a local server.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(fetches(&idp), 1, "explain woke a fetch of the key set");
    // The same token sent wakes one, at once: the setup could show it.
    assert_eq!(get(sg.addr, "/x", &[("authorization", &format!("Bearer {unknown}"))]).await.status, 401);
    wait_until("the fetch the request woke", Duration::from_secs(10), async || fetches(&idp) == 2).await;
}
