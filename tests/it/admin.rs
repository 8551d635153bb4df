//! The admin listener: health, readiness, token, and metrics that match what was sent.

use crate::common::*;

/// A proxy in front of `backend` with a static, a dry-run and a failing route, with
/// `admin` as its admin section.
fn start(backend: &Backend, admin: &str) -> Sluicegate {
    let yaml = r#"
listen: 127.0.0.1:0
admin: ADMIN
upstreams:
  b: { servers: ["BACKEND"] }
  dead: { servers: ["127.0.0.1:CLOSED"] }
limits:
  strict: { key: ip, rate: 1r/m, ban: 10m }
  slots: { key: ip, concurrency: 5 }
  dry: { key: ip, rate: 1r/m, dry_run: true }
routes:
  - name: login
    match: { path: /login }
    respond: { status: 200 }
    limits: [strict]
  - name: trial
    match: { path: /trial }
    respond: { status: 200 }
    limits: [dry]
  - name: gone
    match: { path_prefix: /gone }
    upstream: dead
  - name: api
    match: { methods: [GET] }
    upstream: b
    limits: [slots]
"#;
    Sluicegate::in_front_of(backend, &yaml.replace("ADMIN", admin).replace("CLOSED", &closed_port().to_string()))
}

#[tokio::test]
async fn metrics_count_what_was_sent() {
    let backend = Backend::start().await;
    let sg = start(&backend, "{ listen: 127.0.0.1:0 }");
    let admin = sg.admin_addr();
    let mut statuses = Vec::new();
    for path in ["/login", "/login", "/login", "/trial", "/trial", "/a", "/b", "/c", "/status/404", "/gone"] {
        statuses.push(get(sg.addr, path, &[]).await.status);
    }
    let post = http::Request::post("/x").header("host", "test.local").body(String::new()).unwrap();
    statuses.push(request(sg.addr, post).await.status);
    assert_eq!(statuses, [200, 429, 429, 200, 200, 200, 200, 200, 404, 502, 404]);

    let metrics = get(admin, "/metrics", &[]).await;
    assert!(metrics.header("content-type").unwrap().starts_with("application/openmetrics-text"));
    let m = Metrics::of(&sg).await;
    let requests = |route: &str, outcome: &str| {
        m.value(&format!("sluicegate_requests_total{{route=\"{route}\",outcome=\"{outcome}\"}}"))
    };
    assert_eq!(requests("login", "passed"), 1.0);
    assert_eq!(requests("login", "banned"), 1.0, "the first rejection starts the ban");
    assert_eq!(requests("login", "rejected"), 1.0);
    assert_eq!(requests("trial", "passed"), 1.0);
    assert_eq!(requests("trial", "dry_run_rejected"), 1.0);
    assert_eq!(requests("api", "passed"), 4.0);
    assert_eq!(requests("gone", "passed"), 1.0);
    assert_eq!(requests("", "no_route"), 1.0);
    let decisions = |limit: &str, outcome: &str| {
        m.value(&format!("sluicegate_limit_decisions_total{{limit=\"{limit}\",outcome=\"{outcome}\"}}"))
    };
    assert_eq!(decisions("strict", "passed"), 1.0);
    assert_eq!(decisions("strict", "rejected"), 2.0);
    assert_eq!(decisions("dry", "rejected"), 1.0);
    assert_eq!(decisions("slots", "passed"), 4.0);
    assert_eq!(m.value("sluicegate_bans_total{limit=\"strict\"}"), 1.0);
    assert_eq!(m.value("sluicegate_bans_active{limit=\"strict\"}"), 1.0);
    assert_eq!(m.value("sluicegate_limit_keys{limit=\"strict\"}"), 1.0);
    assert_eq!(m.value("sluicegate_limit_in_flight{limit=\"slots\"}"), 0.0, "slots are released");
    assert_eq!(m.value("sluicegate_upstream_responses_total{route=\"api\",class=\"2xx\"}"), 3.0);
    assert_eq!(m.value("sluicegate_upstream_responses_total{route=\"api\",class=\"4xx\"}"), 1.0);
    assert_eq!(m.value("sluicegate_upstream_errors_total{route=\"gone\",kind=\"connect\"}"), 1.0);
    assert_eq!(m.value("sluicegate_upstream_duration_seconds_count{route=\"api\"}"), 4.0);
    assert_eq!(m.value("sluicegate_build_info{version=\"0.1.0\"}"), 1.0);
    assert_eq!(m.value("sluicegate_limit_max_keys{limit=\"strict\"}"), 100_000.0);
    let started = m.value("sluicegate_start_time_seconds");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    assert!(started <= now && started > now - 600.0, "{started}");
    assert!(!m.0.contains("127.0.0.1"), "a client address became a label:\n{}", m.0);

    assert_eq!(get(admin, "/healthz", &[]).await.status, 200);
    assert_eq!(get(admin, "/readyz", &[]).await.status, 200);
    assert_eq!(get(admin, "/nothing", &[]).await.status, 404);
}

#[tokio::test]
async fn with_a_token_every_admin_call_needs_it() {
    let backend = Backend::start().await;
    let sg = start(&backend, "{ listen: 127.0.0.1:0, token: s3cret }");
    let admin = sg.admin_addr();
    for path in ["/healthz", "/metrics"] {
        let refused = get(admin, path, &[]).await;
        assert_eq!(refused.status, 401, "{path}");
        assert_eq!(refused.header("www-authenticate"), Some("Bearer"));
        assert_eq!(get(admin, path, &[("authorization", "Bearer s3cre")]).await.status, 401);
        assert_eq!(get(admin, path, &[("authorization", "Bearer s3cret")]).await.status, 200);
    }
    // The proxy's own listener serves no admin path: /metrics is the backend's.
    assert_eq!(get(sg.addr, "/metrics", &[]).await.text(), "ok");
}

#[tokio::test]
async fn the_admin_api_shows_resets_and_unbans_keys() {
    let sg = Sluicegate::start(
        r#"
listen: 127.0.0.1:0
admin: { listen: 127.0.0.1:0 }
trusted_proxies: [127.0.0.1/32]
limits:
  login: { key: ip, rate: 1r/m, ban: 10m }
  api: { key: [ip, "header:x-api-key"], rate: 10r/m, burst: 4, nodelay: true }
routes:
  - match: { path: /login }
    respond: { status: 200 }
    limits: [login]
  - respond: { status: 200 }
    limits: [api]
"#,
    );
    let admin = sg.admin_addr();
    let client = [("x-forwarded-for", "192.0.2.7"), ("x-api-key", "k1")];
    for _ in 0..3 {
        assert_eq!(get(sg.addr, "/x", &client).await.status, 200);
    }
    let state = get(admin, "/limits/api?ip=192.0.2.7&header:x-api-key=k1", &[]).await;
    assert_eq!(state.status, 200, "{}", state.text());
    let state: serde_json::Value = serde_json::from_slice(&state.body).unwrap();
    assert_eq!(state["windows"][0]["remaining"], 2, "{state}");
    assert_eq!(state["windows"][0]["admits"], true);
    // Reset: the key is fresh again.
    let mut req = http::Request::delete("/limits/api?ip=192.0.2.7&header:x-api-key=k1").header("host", "localhost");
    req = req.header("content-length", "0");
    assert_eq!(request(admin, req.body(String::new()).unwrap()).await.status, 204);
    let state = get(admin, "/limits/api?ip=192.0.2.7&header:x-api-key=k1", &[]).await;
    let state: serde_json::Value = serde_json::from_slice(&state.body).unwrap();
    assert_eq!(state["windows"][0]["remaining"], 5, "{state}");

    // A ban is listed by the key's keyed hash, and lifted by it.
    let login = [("x-forwarded-for", "198.51.100.9")];
    assert_eq!(get(sg.addr, "/login", &login).await.status, 200);
    assert_eq!(get(sg.addr, "/login", &login).await.status, 429);
    let bans: serde_json::Value = serde_json::from_slice(&get(admin, "/bans", &[]).await.body).unwrap();
    let banned = bans["login"].as_array().unwrap();
    assert_eq!(banned.len(), 1, "{bans}");
    assert!(banned[0]["left_ms"].as_u64().unwrap() > 590_000);
    let state: serde_json::Value =
        serde_json::from_slice(&get(admin, "/limits/login?ip=198.51.100.9", &[]).await.body).unwrap();
    assert_eq!(state["key"], banned[0]["key"], "the same key, by value or by hash");
    assert!(state["ban_left_ms"].as_u64().unwrap() > 590_000);
    let key = banned[0]["key"].as_str().unwrap().trim_start_matches('#').to_owned();
    let lift =
        http::Request::delete(format!("/bans/login/{key}")).header("host", "localhost").body(String::new()).unwrap();
    assert_eq!(request(admin, lift).await.status, 204);
    let state: serde_json::Value =
        serde_json::from_slice(&get(admin, "/limits/login?ip=198.51.100.9", &[]).await.body).unwrap();
    assert!(state["ban_left_ms"].is_null(), "{state}");
    // The bucket itself still refuses until its rate admits: lifting a ban is not a reset.
    assert_eq!(get(sg.addr, "/login", &login).await.status, 429);
    let config: serde_json::Value = serde_json::from_slice(&get(admin, "/config", &[]).await.body).unwrap();
    assert_eq!(config["limits"][0]["name"], "api");
    assert_eq!(get(admin, "/limits/nope?ip=1.2.3.4", &[]).await.status, 404);
}

/// `/metrics` lists each family's series in one order (by labels), the same on every
/// instance and restart: two pages of one configuration compare line by line.
#[tokio::test]
async fn metrics_series_come_in_a_stable_order() {
    let mut conf = Conf::new().admin();
    for n in 0..8 {
        conf = conf
            .limit(&format!("l{n}"), "key: ip, rate: 1r/s, burst: 2")
            .route(&format!("name: r{n}, match: {{ path_prefix: /{n} }}, limits: [l{n}], respond: {{ status: 200 }}"));
    }
    let (a, b) = (conf.start(), conf.start());
    let (a, b) = (Metrics::of(&a).await.0, Metrics::of(&b).await.0);
    // The same lines but for each process's start time, which two starts may not share.
    let others = |page: &str| -> Vec<String> {
        page.lines().filter(|l| !l.starts_with("sluicegate_start_time_seconds ")).map(str::to_owned).collect()
    };
    assert_eq!(others(&a), others(&b));
    // A histogram's series keep their own lines together, buckets in order.
    let delay: Vec<&str> = a.lines().filter(|l| l.starts_with("sluicegate_limit_delay_seconds_bucket{le=")).collect();
    assert!(
        delay[0].contains("le=\"0.001\",limit=\"l0\"") && delay[16].contains("le=\"+Inf\",limit=\"l0\""),
        "{delay:?}"
    );
}

/// The admin token need not be written into the file: `${NAME}` reads it from the
/// environment, `token_file` from a file (a trailing newline dropped); `check` names a
/// variable that is not set, and refuses both at once.
#[tokio::test]
async fn the_admin_token_comes_from_the_environment_or_a_file() {
    let yaml = |token: &str| {
        format!(
            "listen: 127.0.0.1:0\nadmin: {{ listen: 127.0.0.1:0, {token} }}\nroutes:\n  - respond: {{ status: 200 }}\n"
        )
    };
    let called = async |sg: &Sluicegate, token: &str| {
        get(sg.admin_addr(), "/healthz", &[("authorization", &format!("Bearer {token}"))]).await.status
    };
    let from_env =
        Sluicegate::try_start_with(&yaml("token: \"${SG_ADMIN_TOKEN}\""), &[("SG_ADMIN_TOKEN", "from-env")]).unwrap();
    assert_eq!((called(&from_env, "from-env").await, called(&from_env, "${SG_ADMIN_TOKEN}").await), (200, 401));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "from-file\n").unwrap();
    let from_file = Sluicegate::start(&yaml(&format!("token_file: \"{}\"", file.display())));
    assert_eq!((called(&from_file, "from-file").await, called(&from_file, "other").await), (200, 401));

    let check = |yaml: &str| {
        let (_dir, path) = config_file(yaml);
        let out = binary().args(["check", "-c"]).arg(&path).env_remove("SG_UNSET_TOKEN").output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).replace(&path.display().to_string(), "FILE"))
    };
    let (code, stderr) = check(&yaml("token: \"${SG_UNSET_TOKEN}\""));
    assert_eq!(code, Some(1));
    assert!(stderr.contains("admin.token: the environment variable SG_UNSET_TOKEN is not set"), "{stderr}");
    let (code, stderr) = check(&yaml(&format!("token: t, token_file: \"{}\"", file.display())));
    assert_eq!(code, Some(1));
    assert!(stderr.contains("admin.token_file: give either `token` or `token_file`, not both"), "{stderr}");
}

/// A token rotated in its file (`admin.token_file`) is taken at the next reload: from
/// then on the old one is refused and the new one accepted; until then the old one
/// stands (the file is read at a load, not at each call).
#[tokio::test]
async fn an_admin_token_rotated_in_its_file_replaces_the_old_one_at_the_reload() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "old-token\n").unwrap();
    let yaml = Conf::new()
        .set(&format!("admin: {{ listen: 127.0.0.1:0, token_file: \"{}\" }}", file.display()))
        .answering("")
        .yaml();
    let sg = Sluicegate::start(&yaml);
    let admin = sg.admin_addr();
    let called = async |token: &str| get(admin, "/bans", &[("authorization", &format!("Bearer {token}"))]).await.status;
    assert_eq!((called("old-token").await, called("new-token").await), (200, 401));
    std::fs::write(&file, "new-token\n").unwrap();
    assert_eq!((called("old-token").await, called("new-token").await), (200, 401), "not before the reload");
    let log = sg.reload(&yaml);
    assert!(log.contains("configuration reloaded"), "{log}");
    assert_eq!(called("old-token").await, 401, "the old token after the rotation");
    assert_eq!(called("new-token").await, 200);
}

/// `GET /config` speaks the configuration's own words (routes with their match and
/// action, limits' windows as written, `nodelay: true` and `10r/s` included, the server's
/// settings, upstreams with `http2`), never a secret; the dashboard describes routes and
/// limits in the same words; a key lookup without the limit's key parts says which it
/// needs.
#[tokio::test]
async fn the_config_is_shown_in_its_own_words_and_a_key_lookup_says_what_it_needs() {
    let backend = Backend::start().await;
    let sg = Conf::new()
        .set("admin: { listen: 127.0.0.1:0, token: s3cret-token }")
        .set("server: { idle_timeout: 90s }")
        .upstream(&backend)
        .limit("per_user", "key: \"header:x-user\", on_missing_key: skip, rate: 10r/s, burst: 2, nodelay: true")
        .limit("window", "key: ip, algorithm: fixed_window, limit: 5, window: 1m")
        .route("name: api, match: { path_prefix: /api, methods: [GET] }, upstream: b, limits: [per_user, window]")
        .start();
    let auth = [("authorization", "Bearer s3cret-token")];
    let config = get(sg.admin_addr(), "/config", &auth).await;
    assert_eq!(config.status, 200);
    let text = config.text();
    assert!(!text.contains("s3cret-token"), "{text}");
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let route = &json["routes"][0];
    assert_eq!(route["match"], serde_json::json!({ "path_prefix": "/api", "methods": ["GET"] }), "{route}");
    assert_eq!(
        (route["upstream"].as_str(), route["limits"].clone()),
        (Some("b"), serde_json::json!(["per_user", "window"]))
    );
    let limit = json["limits"].as_array().unwrap().iter().find(|l| l["name"] == "per_user").unwrap();
    assert_eq!(limit["windows"], serde_json::json!([{ "rate": "10r/s", "burst": 2, "nodelay": true }]), "{limit}");
    let refusal = (&limit["status"], &limit["grpc_status"], &limit["on_missing_key"]);
    assert_eq!(
        refusal,
        (&serde_json::json!(429), &serde_json::json!("RESOURCE_EXHAUSTED"), &serde_json::json!("skip"))
    );
    let window = json["limits"].as_array().unwrap().iter().find(|l| l["name"] == "window").unwrap();
    assert_eq!(window["windows"][0]["window"], "1m", "{window}");
    assert_eq!(
        (json["upstreams"][0]["name"].as_str(), json["upstreams"][0]["http2"].as_bool()),
        (Some("b"), Some(false))
    );
    assert_eq!(
        (json["server"]["idle_timeout"].as_str(), json["server"]["header_read_timeout"].as_str()),
        (Some("1m 30s"), Some("10s")),
        "{}",
        json["server"]
    );
    // The dashboard says the same of the same route and limit.
    let shown = get(sg.admin_addr(), "/dashboard.json", &auth).await;
    let shown: serde_json::Value = serde_json::from_slice(&shown.body).unwrap();
    let dashboard_limit = shown["limits"].as_array().unwrap().iter().find(|l| l["name"] == "per_user").unwrap();
    for field in
        ["key", "scope", "windows", "dry_run", "persist", "ban", "max_keys", "status", "grpc_status", "on_missing_key"]
    {
        assert_eq!(dashboard_limit[field], limit[field], "{field}");
    }
    for field in ["name", "match", "upstream", "limits"] {
        assert_eq!(shown["routes"][0][field], *route.get(field).unwrap(), "{field}");
    }
    // A lookup whose parameters give no key for the limit.
    let lookup = get(sg.admin_addr(), "/limits/per_user?ip=10.0.0.1", &auth).await;
    assert_eq!(lookup.status, 400);
    assert_eq!(
        lookup.text(),
        "ip is no part of its key: limit \"per_user\" is keyed by header:x-user; give ?header:x-user=VALUE\n"
    );
}

/// Every key kind can be named in a lookup, a `jwt:` part too; a lookup that leaves a
/// part of the key out is refused, never answered with the state of another key (that
/// of requests without the part).
#[tokio::test]
async fn a_key_with_a_claim_is_looked_up_and_reset_by_its_claim() {
    use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
    let secret = "0123456789abcdef0123456789abcdef";
    let sg = Conf::new()
        .admin()
        .behind_proxy()
        .set(&format!("jwt: {{ secret: \"{secret}\" }}"))
        .limit("per_org", "key: [\"jwt:org\", ip], rate: 1r/m, burst: 4, nodelay: true, on_missing_key: skip")
        .limit("per_user", "key: \"jwt:sub\", rate: 1r/m, burst: 9, nodelay: true, on_missing_key: skip")
        .answering("per_org, per_user")
        .start();
    let admin = sg.admin_addr();
    let exp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 600;
    let claims = serde_json::json!({"sub": "alice", "org": "acme", "exp": exp});
    let token = encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(secret.as_bytes())).unwrap();
    let bearer = format!("Bearer {token}");
    for _ in 0..3 {
        let sent = [("authorization", bearer.as_str()), ("x-forwarded-for", "192.0.2.7")];
        assert_eq!(get(sg.addr, "/", &sent).await.status, 200);
    }
    // Without a token, from the same address: another key of per_org (its ip part alone).
    assert_eq!(get(sg.addr, "/", &[("x-forwarded-for", "192.0.2.7")]).await.status, 200);
    let remaining = async |lookup: &str| {
        let reply = get(admin, lookup, &[]).await;
        assert_eq!(reply.status, 200, "{lookup}: {}", reply.text());
        let state: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
        state["windows"][0]["remaining"].as_u64().unwrap()
    };
    assert_eq!(remaining("/limits/per_user?jwt:sub=alice").await, 7);
    assert_eq!(remaining("/limits/per_user?jwt%3Asub=alice").await, 7);
    assert_eq!(remaining("/limits/per_org?jwt:org=acme&ip=192.0.2.7").await, 2);
    let partial = get(admin, "/limits/per_org?ip=192.0.2.7", &[]).await;
    assert_eq!(
        (partial.status, partial.text()),
        (
            400,
            "jwt:org not given: limit \"per_org\" is keyed by jwt:org + ip; give ?jwt:org=VALUE&ip=VALUE\n".to_owned()
        )
    );
    let reset = http::Request::delete("/limits/per_user?jwt:sub=alice").header("host", "localhost");
    assert_eq!(request(admin, reset.body(String::new()).unwrap()).await.status, 204);
    assert_eq!(remaining("/limits/per_user?jwt:sub=alice").await, 10, "reset: a fresh key");
    assert_eq!(remaining("/limits/per_org?jwt:org=acme&ip=192.0.2.7").await, 2, "another limit, untouched");
}

/// An admin listener on an address other than loopback without a token is refused by
/// `check` and by `run`, at its field; with a token it is fine, and `insecure: true`
/// serves it without one, saying so at warn on every start.
#[tokio::test]
async fn an_admin_listener_beyond_loopback_needs_a_token_or_insecure() {
    let yaml =
        |admin: &str| format!("listen: 127.0.0.1:0\nadmin: {{ {admin} }}\nroutes:\n  - respond: {{ status: 200 }}\n");
    let refused = yaml("listen: 0.0.0.0:0");
    let (code, stderr) = check_bounded(&refused);
    assert_eq!(code, Some(1));
    assert!(
        stderr.starts_with(
            "FILE:2:18: admin.listen: 0.0.0.0:0 is not a loopback address and the admin API has no token: anyone who \
             reaches it could reload the configuration, reset keys and lift bans; set admin.token (or token_file), \
             or admin.insecure: true to serve it so knowingly\n"
        ),
        "{stderr}"
    );
    let (_dir, path) = config_file(&refused);
    let run = binary().arg("-c").arg(&path).stdout(std::process::Stdio::null()).output().unwrap();
    assert_eq!(run.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&run.stderr).contains("admin.listen: 0.0.0.0:0 is not a loopback address"));

    for fine in ["listen: 127.0.0.1:0", "listen: \"[::1]:0\"", "listen: 0.0.0.0:0, token: s3cret"] {
        assert_eq!(check_bounded(&yaml(fine)), (Some(0), String::new()), "{fine}");
    }
    let (code, stderr) = check_bounded(&yaml("listen: 0.0.0.0:0, token: s3cret, insecure: true"));
    assert_eq!(code, Some(0));
    assert!(stderr.contains("admin.insecure: does nothing with a token"), "{stderr}");

    let sg = Sluicegate::start(&yaml("listen: 0.0.0.0:0, insecure: true"));
    let log = sg.wait_for_log("the line \"admin.insecure: true\"", |log| log.contains("admin.insecure: true"));
    let line = log.lines().find(|l| l.contains("admin.insecure: true")).expect("no warning at start");
    assert!(line.contains("\"level\":\"WARN\""), "{line}");
    assert_eq!(get(sg.admin_addr(), "/healthz", &[]).await.status, 200);
}

/// A call that changes state is refused, `403` with the reason, when a browser says
/// another site made it: an `Origin` that is not the listener's own, a `Sec-Fetch-Site`
/// but `same-origin` or `none`, or a body type a plain HTML form sends. The dashboard's
/// own calls, curl's and `sluicegate reload` pass; reads are not concerned.
#[tokio::test]
async fn state_changing_calls_another_site_makes_are_refused() {
    let conf = Conf::new().admin().limit("l", "key: ip, rate: 1r/m, ban: 10m").answering("l");
    let sg = conf.start();
    let admin = sg.admin_addr();
    let own = format!("http://{admin}");
    let call = async |method: http::Method, path: &str, fields: &[(&str, &str)]| {
        let mut req = http::Request::builder().method(method).uri(path).header("host", admin.to_string());
        for (name, value) in fields {
            req = req.header(*name, *value);
        }
        request(admin, req.body(String::new()).unwrap()).await
    };
    let calls = [
        (http::Method::POST, "/reload", 200),
        (http::Method::DELETE, "/bans/l/0000000000000001", 404),
        (http::Method::DELETE, "/limits/l?ip=10.0.0.1", 204),
    ];
    for (method, path, answer) in calls {
        let refused = call(method.clone(), path, &[("origin", "http://evil.example")]).await;
        assert_eq!(
            (refused.status, refused.text()),
            (
                403,
                format!(
                    "cross-site request refused: Origin http://evil.example is not this admin listener's ({own})\n"
                )
            ),
            "{method} {path}"
        );
        let refused = call(method.clone(), path, &[("sec-fetch-site", "cross-site")]).await;
        assert_eq!(refused.status, 403, "{method} {path}: {}", refused.text());
        let form = call(method.clone(), path, &[("content-type", "application/x-www-form-urlencoded")]).await;
        assert!(form.text().contains("is what a plain HTML form sends"), "{method} {path}: {}", form.text());
        let page = [("origin", own.as_str()), ("sec-fetch-site", "same-origin"), ("content-type", "application/json")];
        assert_eq!(call(method.clone(), path, &page).await.status, answer, "{method} {path} from the page itself");
        assert_eq!(call(method.clone(), path, &[]).await.status, answer, "{method} {path} from curl");
    }
    let read = call(http::Method::GET, "/bans", &[("origin", "http://evil.example")]).await;
    assert_eq!(read.status, 200, "a read changes nothing (the token guards it)");
    // `sluicegate reload` finds the listener where the file says.
    let yaml = conf.yaml().replace("admin: { listen: 127.0.0.1:0 }", &format!("admin: {{ listen: \"{admin}\" }}"));
    std::fs::write(&sg.config, yaml).unwrap();
    let reload = binary().arg("reload").arg("-c").arg(&sg.config).output().unwrap();
    assert!(reload.status.success(), "{}", String::from_utf8_lossy(&reload.stderr));
}

/// DNS rebinding: a page on a name that resolves to 127.0.0.1 once it has loaded sends
/// same-origin requests to the admin listener, which carry that name as `Host`. They are
/// answered 421 and change nothing; the dashboard still loads from `localhost` and
/// 127.0.0.1, and a name `admin.hosts` lists is answered.
#[tokio::test]
async fn a_page_that_rebinds_its_name_to_the_admin_listener_is_answered_421_and_changes_nothing() {
    use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
    let secret = "0123456789abcdef0123456789abcdef";
    let sg = Conf::new()
        .set("admin: { listen: 127.0.0.1:0, hosts: [admin.internal] }")
        .set(&format!("jwt: {{ secret: \"{secret}\" }}"))
        .limit("per_user", "key: \"jwt:sub\", rate: 1r/m, ban: 10m, on_missing_key: refuse")
        .answering("per_user")
        .start();
    let admin = sg.admin_addr();
    let exp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 600;
    let claims = serde_json::json!({"sub": "alice-7", "exp": exp});
    let token = encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(secret.as_bytes())).unwrap();
    let alice = [("authorization", format!("Bearer {token}"))];
    let alice: Vec<(&str, &str)> = alice.iter().map(|(n, v)| (*n, v.as_str())).collect();
    assert_eq!(get(sg.addr, "/", &alice).await.status, 200);
    assert_eq!(get(sg.addr, "/", &alice).await.status, 429, "banned from now on");
    let bans: serde_json::Value = serde_json::from_slice(&get(admin, "/bans/per_user", &[]).await.body).unwrap();
    let key = bans[0]["key"].as_str().unwrap().to_owned();
    assert!(key.starts_with("jwt:sub=alice-7"), "{bans}");
    let encoded: String = percent_encoding::utf8_percent_encode(&key, percent_encoding::NON_ALPHANUMERIC).to_string();

    let rebound = format!("rebind.evil.example:{}", admin.port());
    let origin = format!("http://{rebound}");
    let call = async |method: http::Method, path: &str, host: &str, body: &'static str| {
        let mut req = http::Request::builder().method(method).uri(path).header("host", host);
        if host == rebound {
            req = req.header("origin", &origin).header("sec-fetch-site", "same-origin");
        }
        if !body.is_empty() {
            req = req.header("content-type", "application/json");
        }
        request(admin, req.body(body.to_owned()).unwrap()).await
    };
    let config = call(http::Method::GET, "/config", &rebound, "").await;
    assert_eq!(config.status, 421, "{}", config.text());
    assert_eq!(
        config.text(),
        "misdirected request: Host \"rebind.evil.example\" is not this admin listener's: it answers an IP \
         address, localhost, or a name admin.hosts lists (admin.hosts lists admin.internal)\n"
    );
    let reload = call(http::Method::POST, "/reload", &rebound, "{}").await;
    assert_eq!(reload.status, 421, "{}", reload.text());
    let lift = call(http::Method::DELETE, &format!("/bans/per_user/{encoded}"), &rebound, "").await;
    assert_eq!(lift.status, 421, "{}", lift.text());
    for path in ["/", "/dashboard.json", "/metrics", "/healthz"] {
        assert_eq!(call(http::Method::GET, path, &rebound, "").await.status, 421, "{path}");
    }
    assert!(!sg.log().contains("configuration reloaded"), "the page reloaded nothing");
    assert_eq!(get(sg.addr, "/", &alice).await.status, 429, "the ban still holds");

    // The dashboard loads where the operator opens it, and a listed name is answered.
    for host in [admin.to_string(), format!("localhost:{}", admin.port()), format!("[::1]:{}", admin.port())] {
        let page = call(http::Method::GET, "/", &host, "").await;
        assert_eq!(page.status, 200, "{host}");
        assert_eq!(call(http::Method::GET, "/dashboard.json", &host, "").await.status, 200, "{host}");
    }
    let listed = format!("admin.internal:{}", admin.port());
    assert_eq!(call(http::Method::GET, "/config", &listed, "").await.status, 200);
    let lift = call(http::Method::DELETE, &format!("/bans/per_user/{encoded}"), &admin.to_string(), "").await;
    assert_eq!(lift.status, 204, "{}", lift.text());
    assert_eq!(get(sg.addr, "/", &alice).await.status, 429, "the bucket itself still refuses: a lift is no reset");
}
