//! `sluicegate import`: nginx configurations written for the purpose
//! (`tests/fixtures/import/`) and the recorded nginx traces, imported by the real binary;
//! the YAML checked field by field (and by `check`, which the import runs), the traces
//! replayed through what they became.

use std::path::Path;

use serde_json::{Value, json};

use crate::common::*;
use crate::conformance::{REAL_TIME, real_time_matches, replay_on_a_fake_clock, scenarios, shared_zone_scenarios};
use crate::nginx;

/// What one run of `sluicegate import` gave.
struct Imported {
    code: i32,
    /// The YAML as written, and read back.
    text: String,
    yaml: Value,
    /// stderr, with the directory of the nginx files written `DIR`.
    stderr: String,
}

impl Imported {
    /// The `FILE:LINE: directive: why` lines.
    fn left_out(&self) -> Vec<&str> {
        self.stderr.lines().filter(|l| l.starts_with("DIR/") && !l.starts_with("DIR/nginx.conf: ")).collect()
    }
}

/// `sluicegate import --out DIR/sluicegate.yaml DIR/nginx.conf`.
fn import(dir: &Path) -> Imported {
    let out = dir.join("sluicegate.yaml");
    let output = binary().arg("import").arg("--out").arg(&out).arg(dir.join("nginx.conf")).output().unwrap();
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let yaml = if text.is_empty() { Value::Null } else { serde_saphyr::from_str(&text).unwrap() };
    let stderr = String::from_utf8(output.stderr).unwrap().replace(&dir.display().to_string(), "DIR");
    Imported { code: output.status.code().unwrap(), text, yaml, stderr }
}

/// A copy of `tests/fixtures/import/NAME` (dot files included) in a new directory.
fn fixture(name: &str) -> tempfile::TempDir {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), target).unwrap();
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    copy(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/import").join(name), dir.path());
    dir
}

/// A directory holding `nginx.conf` with `text`.
fn nginx_conf(text: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("nginx.conf"), text).unwrap();
    dir
}

/// A self-signed certificate for `name` in `DIR/certs/FILE.crt` and `.key`.
fn certificate(dir: &Path, file: &str, name: &str) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap().self_signed(&key).unwrap();
    std::fs::create_dir_all(dir.join("certs")).unwrap();
    std::fs::write(dir.join(format!("certs/{file}.crt")), cert.pem()).unwrap();
    std::fs::write(dir.join(format!("certs/{file}.key")), key.serialize_pem()).unwrap();
}

/// The routes as `(name, match)` pairs, in order.
fn route_matches(yaml: &Value) -> Vec<(String, Value)> {
    let routes = yaml["routes"].as_array().unwrap();
    routes.iter().map(|r| (r["name"].as_str().unwrap().to_owned(), r["match"].clone())).collect()
}

#[test]
fn an_api_gateway_with_tiers_by_map_imports_whole() {
    let dir = fixture("gateway");
    let out = import(dir.path());
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.left_out(), Vec::<&str>::new());
    assert!(out.stderr.contains("imported whole; the result is valid"), "{}", out.stderr);
    let y = &out.yaml;
    assert_eq!(y["listen"], json!(["0.0.0.0:8080"]));
    assert_eq!(y["trusted_proxies"], json!(["10.0.0.0/8", "192.168.0.0/16"]));
    assert_eq!(
        y["server"],
        json!({
            "header_read_timeout": "1m", "idle_timeout": "30s", "send_timeout": "1m", "body_read_timeout": "1m",
            "max_uri_bytes": 16384, "max_header_bytes": 65536, "max_body_bytes": "10m", "workers": 2
        })
    );
    assert_eq!(
        y["upstreams"]["api_pool"],
        json!({
            "servers": [{"address": "127.0.0.1:9001", "weight": 2}, "127.0.0.1:9002", "127.0.0.1:9003"],
            "balance": "least_conn", "max_fails": 3, "fail_timeout": "30s", "retries": 2,
            "connect_timeout": "2s", "timeout": "30s"
        })
    );
    assert_eq!(
        y["upstreams"]["reports"],
        json!({"servers": ["127.0.0.1:9100"], "connect_timeout": "2s", "timeout": "2m"})
    );
    // Free keys per key, the two gold keys handed to their own limit.
    let gold_key = |key: &str| json!({"match": {"headers": {"x-api-key": key}}, "use": "gold"});
    assert_eq!(
        y["limits"]["free"],
        json!({
            "key": "header:x-api-key", "rate": "300r/m", "burst": 20, "nodelay": true, "on_missing_key": "skip",
            "status": 429, "log_level": "warn", "max_keys": 81920, "overrides": [gold_key("gold-7f3a"), gold_key("gold-91bc")]
        })
    );
    assert_eq!(
        y["limits"]["gold"],
        json!({"key": "header:x-api-key", "rate": "50r/s", "burst": 100, "nodelay": true, "on_missing_key": "skip", "status": 429, "log_level": "warn", "max_keys": 81920})
    );
    assert_eq!(
        y["limits"]["per_ip"],
        json!({"key": "ip", "ipv6_prefix": 128, "rate": "20r/s", "burst": 40, "delay": 20, "status": 429, "log_level": "warn", "max_keys": 163840})
    );
    assert_eq!(
        y["limits"]["conns"],
        json!({"key": "ip", "ipv6_prefix": 128, "concurrency": 20, "status": 429, "log_level": "error", "max_keys": 81920})
    );
    // Exact first, then prefixes longest first.
    assert_eq!(
        route_matches(y),
        [
            ("=/healthz".to_owned(), json!({"path": "/healthz"})),
            ("/v1/reports/".to_owned(), json!({"path_prefix": "/v1/reports/"})),
            ("/v1/".to_owned(), json!({"path_prefix": "/v1/"})),
            ("/".to_owned(), json!({"path_prefix": "/"})),
        ]
    );
    let headers = json!({"x-frame-options": "DENY"});
    assert_eq!(y["routes"][0]["respond"], json!({"status": 200, "body": "ok\n", "headers": headers}));
    assert_eq!(
        y["routes"][2],
        json!({
            "name": "/v1/", "match": {"path_prefix": "/v1/"}, "upstream": "api_pool", "strip_prefix": true,
            "set_request_headers": {"x-gateway": "edge-1"}, "upstream_host": "keep_name",
            "set_response_headers": headers, "limits": ["free", "per_ip", "conns"]
        })
    );
    assert_eq!(y["routes"][1]["max_body_bytes"], "50m");
    assert_eq!(y["routes"][1]["limits"], json!(["reports"]));
    assert_eq!(y["routes"][3]["respond"], json!({"status": 404, "headers": headers}));
    // Each limit and route says where in nginx it came from.
    assert!(
        out.text.contains(
            "  # DIR/nginx.conf:34: limit_req_zone $free_key zone=free:10m rate=300r/m\n"
                .replace("DIR", &dir.path().display().to_string())
                .as_str()
        )
    );
    assert!(out.text.contains(&format!("  # {}/nginx.conf:66: location /v1/\n  - name: /v1/\n", dir.path().display())));
}

/// The gold tier of the gateway, run: a gold key has its own budget, a free key the
/// free one, as nginx's two zones gave them.
#[tokio::test]
async fn the_gateways_tiers_limit_each_key_by_its_own_budget() {
    let backend = Backend::start().await;
    let dir = fixture("gateway");
    let out = import(dir.path());
    let yaml = out
        .text
        .replace("0.0.0.0:8080", "127.0.0.1:0")
        .replace("127.0.0.1:9001", &backend.addr.to_string())
        .replace("127.0.0.1:9002", &backend.addr.to_string())
        .replace("127.0.0.1:9003", &backend.addr.to_string());
    let sg = Sluicegate::start(&yaml);
    let passed = |key: &'static str, n: usize| {
        let addr = sg.addr;
        async move {
            let mut ok = 0;
            for _ in 0..n {
                ok += usize::from(get(addr, "/v1/x", &[("x-api-key", key)]).await.status == 200);
            }
            ok
        }
    };
    // free: burst 20 nodelay, then 5 a second (one more per 200 ms the run takes on a
    // loaded machine); gold: burst 100, and per_ip only spaces its requests out.
    let started = std::time::Instant::now();
    let free = passed("free-1", 25).await;
    let refilled = (started.elapsed().as_millis() / 200) as usize;
    assert!((21..=21 + refilled).contains(&free), "{free} of 25 passed in {:?}", started.elapsed());
    assert_eq!(passed("gold-7f3a", 25).await, 25);
    assert_eq!(backend.hits().last().unwrap().path_and_query, "/x");
}

#[test]
fn a_login_page_with_a_geo_allow_list_imports_with_what_is_left_out_named() {
    let dir = fixture("login");
    let out = import(dir.path());
    // `location /static/` made no route: its requests are forwarded where nginx served files.
    assert_eq!(out.code, 5, "{}", out.stderr);
    assert_eq!(
        out.left_out(),
        [
            "DIR/nginx.conf:49: add_header: values made of variables are not converted",
            "DIR/nginx.conf:52: location: neither proxy_pass nor return: sluicegate serves no files, so no route is made; its requests now take the route of `location /` (DIR/nginx.conf:33), limited as before",
            "DIR/nginx.conf:53: root: sluicegate serves no files: it forwards requests or answers them with `respond`",
        ]
    );
    assert!(
        out.stderr.contains("DIR/nginx.conf: 3 directives left out (listed above, and as comments in the result); requests are routed, limited or refused otherwise than by nginx where this one was left out: DIR/nginx.conf:52; the result is valid"),
        "{}",
        out.stderr
    );
    let y = &out.yaml;
    assert_eq!(
        y["limits"]["login"],
        json!({
            "key": "ip", "ipv6_prefix": 128, "rate": "5r/m", "burst": 3, "nodelay": true, "status": 429,
            "log_level": "warn", "max_keys": 81920,
            "allow": {"cidrs": ["10.0.0.0/8", "192.168.1.0/24", "127.0.0.1"]}
        })
    );
    assert_eq!(y["limits"]["search"]["dry_run"], true);
    assert_eq!(y["limits"]["site"]["status"], 429);
    // nginx ran 5r/m as 83 thousandths a second; sluicegate keeps the rate written.
    assert!(out.text.contains("it ran this as 83r/1000s (4.980r/m); sluicegate keeps 5r/m exact"));
    // POSTs to /login count against login_post too; the location's limits replace the
    // server's `site`.
    assert_eq!(
        route_matches(y),
        [
            ("=/health".to_owned(), json!({"path": "/health"})),
            ("=/login POST".to_owned(), json!({"path": "/login", "methods": ["POST"]})),
            ("=/login".to_owned(), json!({"path": "/login"})),
            ("/search".to_owned(), json!({"path_prefix": "/search"})),
            ("/".to_owned(), json!({"path_prefix": "/"})),
        ]
    );
    let limits: Vec<&Value> = (1..5).map(|i| &y["routes"][i]["limits"]).collect();
    assert_eq!(limits, [&json!(["login", "login_post"]), &json!(["login"]), &json!(["search"]), &json!(["site"])]);
    assert_eq!(y["routes"][1]["max_body_bytes"], "16k");
    assert_eq!(y["routes"][4]["upstream"], "127.0.0.1-9000");
    assert_eq!(y["routes"][4]["upstream_host"], "127.0.0.1:9000");
    assert_eq!(
        y["upstreams"]["127.0.0.1-9000"],
        json!({"servers": ["127.0.0.1:9000"], "connect_timeout": "1m", "timeout": "1m"})
    );
    // Left out where it would have gone.
    let comment = format!(
        "  # left out: {}/nginx.conf:49: add_header: values made of variables are not converted\n  - name: /search\n",
        dir.path().display()
    );
    assert!(out.text.contains(&comment), "{}", out.text);
}

#[test]
fn virtual_hosts_with_tls_from_globbed_includes_import_whole() {
    let dir = fixture("vhosts");
    for (file, name) in [("default", "localhost"), ("blog", "blog.example.com"), ("shop", "shop.example.com")] {
        certificate(dir.path(), file, name);
    }
    let out = import(dir.path());
    // conf.d/.old.conf is not valid, and not read: glob leaves out dot files as nginx's does.
    assert_eq!(out.code, 0, "{}", out.stderr);
    let y = &out.yaml;
    let file = |f: &str| dir.path().join(f).display().to_string();
    assert_eq!(
        y["listen"],
        json!([{"address": "0.0.0.0:443", "tls": {"certificates": [
            {"cert": file("certs/default.crt"), "key": file("certs/default.key"), "names": ["_"]},
            {"cert": file("certs/blog.crt"), "key": file("certs/blog.key"), "names": ["blog.example.com", "www.blog.example.com"]},
            {"cert": file("certs/shop.crt"), "key": file("certs/shop.key"), "names": ["shop.example.com", "*.shop.example.com"]},
        ]}}])
    );
    assert_eq!(y["upstreams"]["shop"]["balance"], "hash");
    assert_eq!(y["upstreams"]["shop"]["hash_key"], "ip");
    assert_eq!(y["upstreams"]["blog"]["servers"], json!(["127.0.0.1:9301"]));
    assert!(out.text.contains("conf.d/upstreams.conf:9: server 127.0.0.1:9302: down, left out"));
    // Exact names (in file order), then wildcards, then the default server for the rest.
    let hosts: Vec<(Value, Value)> =
        route_matches(y).into_iter().map(|(_, m)| (m["host"].clone(), m["path_prefix"].clone())).collect();
    assert_eq!(
        hosts,
        [
            (json!("blog.example.com"), json!("/wp-admin/")),
            (json!("blog.example.com"), json!("/")),
            (json!("www.blog.example.com"), json!("/wp-admin/")),
            (json!("www.blog.example.com"), json!("/")),
            (json!("shop.example.com"), json!("/")),
            (json!("*.shop.example.com"), json!("/")),
            (Value::Null, Value::Null),
        ]
    );
    assert_eq!(y["routes"][0]["limits"], json!(["admin"]));
    assert_eq!(y["routes"][0]["upstream_host"], "blog");
    assert_eq!(y["routes"][4]["limits"], json!(["site"]));
    assert_eq!(y["routes"][4]["upstream_host"], "keep_name", "nginx's $host");
    assert_eq!(y["routes"][6]["respond"], json!({"status": 404}));
    assert!(out.text.contains(&format!("  # {}: limit_req_zone", file("conf.d/limits.conf:1"))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_recorded_nginx_trace_replays_the_same_through_its_imported_configuration() {
    let backend = Backend::start().await;
    let mut runs = Vec::new();
    for s in scenarios() {
        // The trace's directives in http, one server forwarding to the test's backend.
        let dir = nginx_conf(&format!(
            "events {{}}\nhttp {{\n{}\n    server {{\n        listen 127.0.0.1:8080;\n        location / {{ proxy_pass http://{}; }}\n    }}\n}}\n",
            s.target_config, backend.addr
        ));
        let out = import(dir.path());
        // `add_header X-Nginx-Msec $msec` and the like only reported what nginx did.
        assert_eq!(out.code, 3, "{}: {}", s.scenario, out.stderr);
        assert!(
            out.left_out().iter().all(|l| l.contains("add_header: values made of variables are not converted")),
            "{}",
            out.stderr
        );
        // nginx cannot listen on port 0; the test's proxy must.
        let yaml = out.text.replace("127.0.0.1:8080", "127.0.0.1:0");
        replay_on_a_fake_clock(&s, &yaml);
        if REAL_TIME.contains(&s.scenario.as_str()) {
            runs.push((s, yaml));
        }
    }
    assert_eq!(runs.len(), REAL_TIME.len());
    real_time_matches(&runs).await;
}

/// nginx's commonest pattern, one zone used by several locations with their own
/// `burst`, `delay` or `nodelay` (and two zones in one location, and a server's line that
/// a location's own replaces), recorded against real nginx: the import makes one limit
/// per zone and a route entry per line, and every request gets nginx's status (and
/// delay), on a fake clock and in real time through the proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_recorded_shared_zone_trace_replays_the_same_through_its_imported_configuration() {
    let backend = Backend::start().await;
    let mut runs = Vec::new();
    for s in shared_zone_scenarios() {
        let locations = s.locations.as_deref().expect("a shared zone's locations");
        let dir = nginx_conf(&format!(
            "events {{}}\nhttp {{\n    {}\n    server {{\n        listen 127.0.0.1:8080;\n        {}\n        {}\n    }}\n}}\n",
            s.target_config,
            s.server_config,
            locations.replace("BACKEND", &backend.addr.to_string())
        ));
        let out = import(dir.path());
        assert_eq!(out.code, 3, "{}: {}", s.scenario, out.stderr);
        assert!(
            out.left_out().iter().all(|l| l.contains("add_header: values made of variables are not converted")),
            "{}",
            out.stderr
        );
        // One limit per zone: nginx's one state.
        let zones = s.target_config.matches("limit_req_zone").count();
        assert_eq!(out.yaml["limits"].as_object().map(|l| l.len()), Some(zones), "{}", out.text);
        let yaml = out.text.replace("127.0.0.1:8080", "127.0.0.1:0");
        replay_on_a_fake_clock(&s, &yaml);
        runs.push((s, yaml));
    }
    real_time_matches(&runs).await;
}

#[test]
fn a_syntax_error_names_file_and_line_and_nothing_is_written() {
    let dir = nginx_conf("events {}\nhttp {\n    server {\n        listen 80\n    }\n}\n");
    let out = import(dir.path());
    assert_eq!(out.code, 1);
    assert_eq!(
        out.stderr,
        "DIR/nginx.conf:5: unexpected \"}\": the directive before it has no \";\"\nDIR/nginx.conf: nothing imported\n"
    );
    assert!(!dir.path().join("sluicegate.yaml").exists());
}

#[test]
fn an_include_that_cannot_be_read_is_named_at_its_line() {
    let dir = nginx_conf("events {}\nhttp {\n    include sites/app.conf;\n}\n");
    let out = import(dir.path());
    assert_eq!(out.code, 1);
    assert!(
        out.stderr
            .starts_with("DIR/nginx.conf:3: include: DIR/sites/app.conf cannot be read: No such file or directory"),
        "{}",
        out.stderr
    );
}

#[test]
fn bandwidth_throttling_becomes_the_routes_response_body_rate() {
    let dir = nginx_conf(
        "events {}\nhttp {\n    limit_rate 1m;\n    server {\n        listen 127.0.0.1:8080;\n        location /downloads/ {\n            limit_rate_after 1m;\n            limit_rate 100k;\n            proxy_pass http://127.0.0.1:9000;\n        }\n        location /free/ {\n            limit_rate 0;\n            proxy_pass http://127.0.0.1:9000;\n        }\n        location / {\n            proxy_pass http://127.0.0.1:9000;\n        }\n    }\n}\n",
    );
    let out = import(dir.path());
    assert_eq!(out.code, 0, "{}", out.stderr);
    let route = |i: usize| &out.yaml["routes"][i];
    assert_eq!(route(0)["name"], "/downloads/");
    assert_eq!(route(0)["response_body_rate"]["bytes_per_second"], "100k");
    assert_eq!(route(0)["response_body_rate"]["after"], "1m");
    assert_eq!(route(1)["name"], "/free/");
    assert!(route(1)["response_body_rate"].is_null(), "limit_rate 0 is no pace");
    assert_eq!(route(2)["response_body_rate"]["bytes_per_second"], "1m", "inherited from http");
    assert!(route(2)["response_body_rate"]["after"].is_null());

    // A rate from a variable is left out, at its line.
    let dir = nginx_conf(
        "events {}\nhttp {\n    server {\n        listen 127.0.0.1:8080;\n        location / {\n            limit_rate $rate;\n            proxy_pass http://127.0.0.1:9000;\n        }\n    }\n}\n",
    );
    let out = import(dir.path());
    assert_eq!(out.code, 3);
    assert_eq!(out.left_out(), ["DIR/nginx.conf:6: limit_rate: a rate set by a variable is not converted"]);
    assert!(out.yaml["routes"][0]["response_body_rate"].is_null());
}

#[test]
fn a_result_check_refuses_is_written_with_its_errors_and_status_4() {
    let dir = nginx_conf(
        "events {}\nhttp {\n    server {\n        listen 443 ssl;\n        ssl_certificate missing.crt;\n        ssl_certificate_key missing.key;\n        location / { proxy_pass http://127.0.0.1:9000; }\n    }\n}\n",
    );
    let out = import(dir.path());
    assert_eq!(out.code, 4, "{}", out.stderr);
    assert!(out.stderr.contains("sluicegate.yaml:") && out.stderr.contains("listen[0].tls.cert"), "{}", out.stderr);
    assert!(out.stderr.ends_with("imported whole; the result does not pass check (above)\n"), "{}", out.stderr);
    assert_eq!(out.yaml["listen"][0]["tls"]["cert"], dir.path().join("missing.crt").display().to_string());
}

#[test]
fn without_out_the_yaml_goes_to_stdout_and_prefix_finds_the_file() {
    let dir = nginx_conf(
        "events {}\nhttp {\n    server {\n        listen 8080;\n        location / { return 204; }\n    }\n}\n",
    );
    let output = binary().args(["import", "-p"]).arg(dir.path()).arg("nginx.conf").current_dir("/").output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let yaml: Value = serde_saphyr::from_str(std::str::from_utf8(&output.stdout).unwrap()).unwrap();
    assert_eq!(yaml["routes"][0]["respond"], json!({"status": 204}));
}

#[test]
fn servers_on_different_addresses_are_reported_since_routes_go_by_host() {
    let dir = nginx_conf(
        "events {}\nhttp {\n    server {\n        listen 80;\n        server_name example.com;\n        return 301 https://example.com/;\n    }\n    server {\n        listen 8443;\n        server_name example.com;\n        location / { proxy_pass http://127.0.0.1:9000; }\n    }\n}\n",
    );
    let out = import(dir.path());
    assert_eq!(out.code, 5, "{}", out.stderr);
    assert_eq!(
        out.left_out(),
        [
            "DIR/nginx.conf:3: listen: sluicegate routes by host and scheme, not by address: this server's locations also answer on 0.0.0.0:8443",
            "DIR/nginx.conf:8: listen: sluicegate routes by host and scheme, not by address: this server's locations also answer on 0.0.0.0:80",
            "DIR/nginx.conf:8: server: sluicegate routes by host and scheme, not by address: requests to 0.0.0.0:8443 for names no server lists go to the server at DIR/nginx.conf:3, not this one",
            "DIR/nginx.conf:8: server_name: example.com is also the name of the server at DIR/nginx.conf:3: sluicegate routes by host and scheme, not by address, so that server's routes take it on every address where both answer",
        ]
    );
    assert_eq!(out.yaml["listen"], json!(["0.0.0.0:80", "0.0.0.0:8443"]));
    let redirect = json!({"status": 301, "headers": {"location": "https://example.com/"}});
    assert_eq!(out.yaml["routes"][0]["match"], json!({"host": "example.com"}));
    assert_eq!(out.yaml["routes"][0]["respond"], redirect);
    assert_eq!(out.yaml["routes"][1]["respond"], redirect);
    assert_eq!(out.yaml["routes"].as_array().unwrap().len(), 2);
}

/// nginx's choice of location: the exact one; else the longest prefix, if it is `^~`;
/// else the first regular expression in file order that matches (`~*`: any case); else
/// the longest prefix. The imported routes give the same answers, in the same order of
/// routes, and say where they cannot (a plain prefix under a `^~` one).
#[tokio::test]
async fn regular_expression_locations_are_placed_where_nginx_tries_them() {
    let dir = nginx_conf(
        r#"events {}
http {
    server {
        listen 127.0.0.1:8080;
        location / { return 200 "root"; }
        location /api/ { return 200 "api"; }
        location ~ \.php$ { return 200 "php"; }
        location = /exact { return 200 "exact"; }
        location ^~ /static/ { return 200 "static"; }
        location ~* \.(png|jpg)$ { return 200 "image"; }
        location /static/dyn/ { return 200 "dyn"; }
        location ~ ^/(?<tenant>[a-z]+)/(?=x) { return 200 "look-ahead"; }
    }
}
"#,
    );
    let out = import(dir.path());
    assert_eq!(out.code, 5, "{}", out.stderr);
    assert_eq!(out.left_out().len(), 1, "{:?}", out.left_out());
    assert!(out.left_out()[0].starts_with("DIR/nginx.conf:12: location: look-around"), "{:?}", out.left_out());
    assert!(
        out.left_out()[0].ends_with(
            "its requests now take the routes of `location = /exact` (DIR/nginx.conf:8), `location /static/dyn/` (DIR/nginx.conf:11), `location ^~ /static/` (DIR/nginx.conf:9), `location ~ \\.php$` (DIR/nginx.conf:7), `location ~* \\.(png|jpg)$` (DIR/nginx.conf:10), `location /api/` (DIR/nginx.conf:6) where those match, else the route of `location /` (DIR/nginx.conf:5), unlimited as before"
        ),
        "{:?}",
        out.left_out()
    );
    let order: Vec<String> = route_matches(&out.yaml).into_iter().map(|(name, _)| name).collect();
    assert_eq!(order, ["=/exact", "/static/dyn/", "/static/", r"~ \.php$", r"~* \.(png|jpg)$", "/api/", "/"]);
    assert_eq!(out.yaml["routes"][4]["match"], json!({"path_regex": r"(?i-u)\.(png|jpg)$"}));
    assert!(out.text.contains("under `location ^~ /static/`"), "{}", out.text);

    let yaml = out.text.replace("127.0.0.1:8080", "127.0.0.1:0");
    let sg = Sluicegate::start(&yaml);
    for (path, location) in [
        ("/exact", "exact"),
        ("/exact.php", "php"),
        ("/static/a.php", "static"),
        ("/static/dyn/a.css", "dyn"),
        ("/api/x.PNG", "image"),
        ("/api/y.png.txt", "api"),
        ("/x.jpg", "image"),
        ("/readme", "root"),
    ] {
        assert_eq!(get(sg.addr, path, &[]).await.text(), location, "{path}");
    }
}

/// A server forwarding to a closed port, with `inside` in its location `/` (at line 7).
fn broken(inside: &str) -> String {
    format!(
        "events {{}}\nhttp {{\n    limit_req_zone $binary_remote_addr zone=perip:1m rate=10r/s;\n    server {{\n        listen 127.0.0.1:8080;\n        location / {{\n{inside}\n        }}\n    }}\n}}\n"
    )
}

/// Every file `nginx -t` refuses, the import refuses (exit 1, nothing written) at the line
/// nginx names; the files nginx accepts, it imports.
#[test]
fn what_nginx_refuses_to_load_the_import_refuses_at_the_same_line() {
    if !nginx::installed() {
        return;
    }
    let cases = [
        // A `;` left out: the next line's words become arguments.
        broken("            proxy_pass http://127.0.0.1:9\n            proxy_set_header Host $host;"),
        broken("            proxy_passs http://127.0.0.1:9;"),
        broken("            client_max_body_size 1m 2m;"),
        broken("            limit_req_zone $binary_remote_addr zone=two:1m rate=1r/s;"),
        broken("            limit_req zone=nope;"),
        broken("            limit_conn nope 1;"),
        broken("            limit_req zone=perip burst=5;\n            limit_req zone=perip;"),
        broken("            proxy_pass http://backend_app;"),
        broken("            proxy_buffering yes;"),
        broken("            proxy_pass http://127.0.0.1:9 {\n            }"),
        broken("            location /x;"),
        broken(
            "            if ($http_x) {\n                limit_req_zone $binary_remote_addr zone=x:1m rate=1r/s;\n            }",
        ),
        broken("            return 200\n        }\n        location /x/ {\n            return 204;"),
        broken("        }\n        location / {\n            return 204;"),
        broken("        }\n        location = /a {}\n        location = /a {\n            return 204;"),
        broken("            proxy_pass ftp://127.0.0.1:9;"),
        "http {\n    server {\n        listen 127.0.0.1:8080;\n    }\n}\n".to_owned(),
    ];
    for conf in &cases {
        let dir = nginx_conf(conf);
        let (message, line) = nginx::verdict(dir.path()).expect_err(conf);
        let out = import(dir.path());
        assert_eq!(out.code, 1, "nginx: {message}\n{conf}\nimport: {}", out.stderr);
        assert!(!dir.path().join("sluicegate.yaml").exists());
        let first = out.stderr.lines().next().unwrap();
        let at = first.strip_prefix("DIR/nginx.conf:").and_then(|rest| rest.split(':').next()?.parse::<usize>().ok());
        match line {
            Some(line) => assert_eq!(at, Some(line), "nginx: {message}\n{conf}\nimport: {}", out.stderr),
            // nginx names no line (an undefined zone, no events): the import does or not.
            None => assert!(first.starts_with("DIR/nginx.conf"), "{}", out.stderr),
        }
    }
    for fixture_name in ["gateway", "login"] {
        let dir = fixture(fixture_name);
        assert_eq!(nginx::verdict(dir.path()), Ok(()), "{fixture_name}");
        assert_ne!(import(dir.path()).code, 1, "{fixture_name}");
    }
}

/// nginx's regular expressions match ASCII classes on the decoded path's bytes: a digit,
/// a letter or a space of another script, or a fullwidth digit, is none of `\d`, `\w`,
/// `\s`; `.` is one byte and `~*` folds ASCII letters only. The imported routes choose
/// what nginx chooses on such paths, their captures kept.
#[tokio::test]
async fn regular_expressions_keep_the_ascii_meaning_nginx_gives_them() {
    if !nginx::installed() {
        return;
    }
    let port = closed_port();
    let dir = nginx_conf(&format!(
        r#"events {{}}
http {{
    access_log off;
    server {{
        listen 127.0.0.1:{port};
        location / {{ return 200 "root"; }}
        location ~ ^/users/(?<id>\d+)/ {{ return 200 "digits"; }}
        location ~ ^/w/\w+$ {{ return 200 "word"; }}
        location ~ ^/s/a\sb$ {{ return 200 "space"; }}
        location ~ ^/n/\D$ {{ return 200 "not-digit"; }}
        location ~ ^/b/x\b {{ return 200 "boundary"; }}
        location ~ ^/p/[[:alpha:]]+$ {{ return 200 "posix"; }}
        location ~ ^/dot/.$ {{ return 200 "one"; }}
        location ~* ^/k/k$ {{ return 200 "caseless"; }}
    }}
}}
"#
    ));
    let out = import(dir.path());
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.yaml["routes"][0]["match"], json!({"path_regex": r"(?-u)^/users/(?<id>\d+)/"}));
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let paths = [
        "/users/3/x",
        "/users/%D9%A3/x",
        "/users/%EF%BC%93/x",
        "/w/abc",
        "/w/caf%C3%A9",
        "/s/a%20b",
        "/s/a%C2%A0b",
        "/s/a%E2%80%83b",
        "/n/a",
        "/n/%D9%A3",
        "/b/x",
        "/b/x%C3%A9",
        "/p/abc",
        "/p/%C3%A9",
        "/dot/a",
        "/dot/%C3%A9",
        "/k/K",
        "/k/%E2%84%AA",
    ];
    let mut nginx_chose = Vec::new();
    {
        let _nginx = nginx::Nginx::start(dir.path(), addr).await;
        for path in paths {
            nginx_chose.push((path, get(addr, path, &[]).await.text()));
        }
    }
    let sg = Sluicegate::start(&out.text.replace(&addr.to_string(), "127.0.0.1:0"));
    let mut imported_chose = Vec::new();
    for path in paths {
        imported_chose.push((path, get(sg.addr, path, &[]).await.text()));
    }
    assert_eq!(imported_chose, nginx_chose);
    // Not every answer is the root's: the comparison tells the locations apart.
    assert!(nginx_chose.iter().filter(|(_, body)| body != "root").count() >= 9, "{nginx_chose:?}");
}

/// `GET path` with `Host: host`.
async fn get_host(addr: std::net::SocketAddr, host: &str, path: &str) -> Reply {
    let req = http::Request::get(path).header("host", host);
    request(addr, req.body(http_body_util::Full::new(bytes::Bytes::new())).unwrap()).await
}

/// What people write most converts, and answers as nginx does: `Host $host` (no port, in
/// lower case), `X-Real-IP $remote_addr`, the usual HTTP→HTTPS server, `expires` on a
/// proxied location, each server's own `max_fails`/`fail_timeout`, and temp paths that
/// need nothing.
#[tokio::test]
async fn what_people_write_most_converts_and_answers_as_nginx_does() {
    if !nginx::installed() {
        return;
    }
    let (a, b) = (Backend::start().await, Backend::start().await);
    let port = closed_port();
    let dir = nginx_conf(&format!(
        r#"events {{}}
http {{
    access_log off;
    client_body_temp_path tmp/body;
    proxy_temp_path tmp/proxy;
    fastcgi_temp_path tmp/fastcgi;
    uwsgi_temp_path tmp/uwsgi;
    scgi_temp_path tmp/scgi;
    upstream app {{
        server {} max_fails=3 fail_timeout=30s;
        server {} max_fails=1 fail_timeout=5s;
    }}
    server {{
        listen 127.0.0.1:{port};
        server_name plain.test;
        return 301 https://$host$request_uri;
    }}
    server {{
        listen 127.0.0.1:{port} default_server;
        server_name app.test;
        location / {{
            proxy_pass http://app;
            proxy_set_header Host $host;
            proxy_set_header X-Real-IP $remote_addr;
            expires 1h;
        }}
    }}
}}
"#,
        a.addr, b.addr
    ));
    std::fs::create_dir(dir.path().join("tmp")).unwrap();
    let out = import(dir.path());
    assert_eq!(out.code, 0, "{}", out.stderr);
    let y = &out.yaml;
    assert_eq!(
        y["upstreams"]["app"]["servers"],
        json!([a.addr.to_string(), {"address": b.addr.to_string(), "max_fails": 1, "fail_timeout": "5s"}])
    );
    assert_eq!(
        (&y["upstreams"]["app"]["max_fails"], &y["upstreams"]["app"]["fail_timeout"]),
        (&json!(3), &json!("30s"))
    );
    let route = |name: &str| y["routes"].as_array().unwrap().iter().find(|r| r["name"] == name).unwrap().clone();
    assert_eq!(route("/")["upstream_host"], "keep_name");
    assert_eq!(route("/")["set_request_headers"], json!({"x-real-ip": "$client_ip"}));
    assert_eq!(route("/")["expires"], "1h");
    let redirect = y["routes"].as_array().unwrap().iter().find(|r| r["match"]["host"] == "plain.test").unwrap();
    assert_eq!(redirect["respond"], json!({"status": 301, "headers": {"location": "https://$host$request_uri"}}));

    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    /// What a client and the backends saw of each request.
    async fn seen(addr: std::net::SocketAddr, backends: [&Backend; 2]) -> Vec<String> {
        let mut seen = Vec::new();
        for (host, path) in [("App.Test:8080", "/x"), ("app.test", "/y?z=1"), ("Plain.Test:80", "/a/b?c=d")] {
            let before = backends.iter().map(|b| b.hits().len()).sum::<usize>();
            let r = get_host(addr, host, path).await;
            let field = |name: &str| r.headers.get(name).map(|v| v.to_str().unwrap().to_owned());
            seen.push(format!(
                "{host}{path}: {} location={:?} cache-control={:?}",
                r.status,
                field("location"),
                field("cache-control")
            ));
            assert_eq!(field("expires").is_some(), r.status == 200, "{host}{path}");
            let hits: Vec<Hit> = backends.iter().flat_map(|b| b.hits()).collect();
            if hits.len() > before {
                let hit = hits.iter().max_by_key(|h| h.at).unwrap();
                let header = |name: &str| hit.headers.get(name).map(|v| v.to_str().unwrap().to_owned());
                seen.push(format!(
                    "  upstream: host={:?} x-real-ip={:?} {}",
                    header("host"),
                    header("x-real-ip"),
                    hit.path_and_query
                ));
            }
        }
        seen
    }
    let nginx_saw = {
        let _nginx = nginx::Nginx::start(dir.path(), addr).await;
        seen(addr, [&a, &b]).await
    };
    let sg = Sluicegate::start(&out.text.replace(&addr.to_string(), "127.0.0.1:0"));
    let sluicegate_saw = seen(sg.addr, [&a, &b]).await;
    assert_eq!(sluicegate_saw, nginx_saw);
    assert_eq!(nginx_saw.len(), 5, "{nginx_saw:?}");
}
