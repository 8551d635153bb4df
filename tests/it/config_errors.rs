//! The configuration's rules, each with its message and position: checked through
//! `config::parse` in this process, which is what `check` and `run` call, with what
//! `check` prints. A few tests run the binary, for what only the command line does.

use crate::common::*;

/// Whether `check` accepts `yaml` (named `FILE`), and what it prints on stderr: every
/// error and the verdict, or the warnings.
fn check(yaml: &str) -> (bool, String) {
    match sluicegate::config::parse(yaml, "FILE") {
        Ok(config) => (true, config.warnings.iter().map(|w| format!("warning: {w}\n")).collect()),
        Err(e) => (false, format!("{e}\nFILE: configuration is invalid\n")),
    }
}

/// Every line of `expected` is in `stderr`.
fn assert_reported(stderr: &str, expected: &[&str]) {
    for line in expected {
        assert!(stderr.contains(line), "{line}\nnot in\n{stderr}");
    }
}

#[test]
fn shipped_example_config_is_valid() {
    let out =
        binary().args(["check", "-c", concat!(env!("CARGO_MANIFEST_DIR"), "/config.example.yaml")]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn acceptance_config_is_accepted() {
    let yaml = r#"
listen: 127.0.0.1:18080
trusted_proxies: [127.0.0.1/32]
upstreams:
  backend: { servers: ["127.0.0.1:18081"] }
limits:
  per_ip: { key: ip, rate: 5r/s, burst: 2, nodelay: true }   # 3 at once, then 5 per second
routes:
  - match: { path_prefix: /static }
    respond: { status: 200, body: "hello\n" }
  - match: { path_prefix: / }
    upstream: backend
    limits: [per_ip]
"#;
    let (ok, stderr) = check(yaml);
    assert!(ok, "{stderr}");
}

const BASE: &str = "listen: 127.0.0.1:0\nlimits:\n";

#[test]
fn unknown_key_is_refused_with_line_and_path() {
    let (ok, stderr) = check(&format!("{BASE}  per_ip: {{ key: ip, rat: 5r/s }}\n"));
    assert!(!ok);
    assert!(stderr.contains("FILE:3:22: limits.per_ip.rat: unknown field `rat`"), "{stderr}");
}

/// Issue 28: six mistakes took three runs of `check`. Unknown fields anywhere in the file
/// (each where its key stands, with the field it most likely misspells, or the few it
/// could be) are reported with every other error, in one run.
#[test]
fn unknown_fields_are_reported_together_with_every_other_error() {
    let yaml = "listen: 127.0.0.1:0
server:
  idle_timout: 30s
upstreams:
  app:
    servers: [\"127.0.0.1:3000\"]
    timout: 5s
    fail_timeout: 0s
limits:
  per_ip: { key: ip, rate: 10r/s, burst: 2, delay: 3 }
routes:
  - match: { path_prefix: /api, hots: api.example.com }
    upstream: app
    limits: [per_ip]
    rewrite: { prefix: /api, to: /, keep: true }
    colour: blue
";
    let (ok, stderr) = check(yaml);
    assert!(!ok);
    assert_eq!(
        stderr,
        "FILE:3:3: server.idle_timout: unknown field `idle_timout`; did you mean `idle_timeout`?
FILE:7:5: upstreams.app.timout: unknown field `timout`; did you mean `timeout`?
FILE:8:19: upstreams.app.fail_timeout: must be longer than zero (turn passive health off with max_fails: 0)
FILE:10:52: limits.per_ip.delay: must not exceed burst (2); use `nodelay: true` for no delay
FILE:12:33: routes[0].match.hots: unknown field `hots`; did you mean `host`?
FILE:15:37: routes[0].rewrite.keep: unknown field `keep`; expected `prefix` or `to`
FILE:16:5: routes[0].colour: unknown field `colour`; the 19 fields of `routes[i]` are listed in docs/configuration.md
FILE: configuration is invalid
"
    );
}

/// A misspelt required field is one error, not two (unknown, and missing), and the rest of
/// the file is still checked: the placeholder serde put in its place says nothing.
#[test]
fn a_required_field_left_out_or_misspelt_leaves_the_rest_checked() {
    let yaml = "listen: 127.0.0.1:0
upstreams:
  app: { sevrers: [\"127.0.0.1:3000\"] }
limits:
  a: { kye: ip, rate: 0r/s }
  b: { rate: 1r/s, ipv4_prefix: 24 }
routes:
  - upstream: app
    limits: [a, b]
    rewrite: { prefix: /api }
    response_body_rate: { after: 1m }
";
    let (ok, stderr) = check(yaml);
    assert!(!ok);
    assert_eq!(
        stderr,
        "FILE:3:10: upstreams.app.sevrers: unknown field `sevrers`; did you mean `servers`?
FILE:5:8: limits.a.kye: unknown field `kye`; did you mean `key`?
FILE:5:23: limits.a.rate: invalid rate \"0r/s\": the count must be positive; write N r/DURATION, e.g. 10r/s, 600r/m, 100r/15m
FILE:6:6: limits.b: missing field `key`
FILE:10:14: routes[0].rewrite: missing field `to`
FILE:11:25: routes[0].response_body_rate: missing field `bytes_per_second`
FILE: configuration is invalid
"
    );
    // A value of the wrong type stops serde, and with it the checks of values: the fields
    // are still all reported, beside it.
    let (ok, stderr) = check(&yaml.replace("] }", "], retries: x }"));
    assert!(!ok);
    assert_eq!(
        stderr,
        "FILE:3:10: upstreams.app.sevrers: unknown field `sevrers`; did you mean `servers`?
FILE:3:48: upstreams.app.retries: must be a whole number ≥ 0
FILE:5:8: limits.a.kye: unknown field `kye`; did you mean `key`?
FILE:6:6: limits.b: missing field `key`
FILE:10:14: routes[0].rewrite: missing field `to`
FILE:11:25: routes[0].response_body_rate: missing field `bytes_per_second`
FILE: configuration is invalid
"
    );
}

/// `burst: 0` with delays is nginx's default (`limit_req zone=z;`): a strict rate, no queue.
#[tokio::test]
async fn zero_burst_with_delays_is_a_strict_rate_without_queue() {
    let yaml = format!(
        "{BASE}  per_ip:\n    key: ip\n    rate: 1r/h\n    burst: 0\nroutes:\n  - {{ limits: [per_ip], respond: {{ status: 200 }} }}\n"
    );
    let (ok, stderr) = check(&yaml);
    assert!(ok, "{stderr}");
    let sg = Sluicegate::start(&yaml);
    assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
    // Refused at once, not queued: with a one-hour rate a queued request would hang.
    let second = tokio::time::timeout(std::time::Duration::from_secs(10), get(sg.addr, "/", &[])).await;
    assert_eq!(second.expect("refused at once, not delayed").status, 429);
}

#[test]
fn durations_have_an_upper_bound() {
    let (ok, stderr) = check("listen: 127.0.0.1:0\nserver: {header_read_timeout: 300000000000y}\n");
    assert!(!ok, "{stderr}");
    assert!(
        stderr.contains(
            "FILE:2:31: server.header_read_timeout: invalid duration \"300000000000y\": unknown unit `y`; the units are ms, s, m, h, d"
        ),
        "{stderr}"
    );
    let (ok, stderr) = check("listen: 127.0.0.1:0\nserver: {header_read_timeout: 400d}\n");
    assert!(!ok, "{stderr}");
    assert!(
        stderr.contains("FILE:2:31: server.header_read_timeout: invalid duration \"400d\": must be at most 365d"),
        "{stderr}"
    );
}

#[test]
fn rate_units_are_listed_and_month_is_refused() {
    let (ok, stderr) = check(&format!("{BASE}  per_ip: {{ key: ip, rate: 100r/M }}\n"));
    assert!(!ok, "{stderr}");
    assert!(
        stderr.contains("FILE:3:28: limits.per_ip.rate: invalid rate \"100r/M\": window: unknown unit `M`: did you mean `m` (minute)?"),
        "{stderr}"
    );
    let (ok, stderr) = check(&format!("{BASE}  per_ip: {{ key: ip, rate: 100r/w }}\n"));
    assert!(!ok, "{stderr}");
    assert!(
        stderr.contains("FILE:3:28: limits.per_ip.rate: invalid rate \"100r/w\": window: unknown unit `w`; the units are ms, s, m, h, d"),
        "{stderr}"
    );
}

#[test]
fn bad_rate_is_refused_with_line_and_path() {
    let (ok, stderr) = check(&format!("{BASE}  per_ip: {{ key: ip, rate: 5/s }}\n"));
    assert!(!ok);
    assert!(stderr.contains("FILE:3:28: limits.per_ip.rate: invalid rate \"5/s\""), "{stderr}");
}

#[test]
fn every_error_is_reported_at_once() {
    let yaml = "listen: nowhere\nlimits:\n  a: { key: ip, rate: 0r/s }\nroutes:\n  - limits: [b]\n    respond: { status: 200 }\n";
    let (ok, stderr) = check(yaml);
    assert!(!ok);
    let errors: Vec<&str> =
        stderr.lines().filter(|l| l.starts_with("FILE:") && !l.ends_with("configuration is invalid")).collect();
    assert_eq!(errors.len(), 3, "{stderr}");
    assert!(errors[0].starts_with("FILE:1:9: listen: invalid address"), "{stderr}");
    assert!(errors[1].starts_with("FILE:3:23: limits.a.rate: invalid rate"), "{stderr}");
    assert!(errors[2].starts_with("FILE:5:14: routes[0].limits[0]: unknown limit \"b\" (defined: a)"), "{stderr}");
}

/// serde once stopped at an unknown field before reading its value; now it reads past it,
/// and an alias bomb there is still cut short by the YAML budget, not expanded.
#[test]
fn an_alias_bomb_under_an_unknown_field_is_still_refused() {
    let mut yaml = "listen: 127.0.0.1:0\nx0: &x0 [a, a, a, a, a, a, a, a, a, a]\n".to_owned();
    for i in 1..10 {
        let p = i - 1;
        yaml.push_str(&format!("x{i}: &x{i} [*x{p}, *x{p}, *x{p}, *x{p}, *x{p}, *x{p}, *x{p}, *x{p}, *x{p}, *x{p}]\n"));
    }
    let (code, stderr) = check_bounded(&yaml);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.starts_with("FILE:2:1: x0: unknown field `x0`; the 20 top-level fields"), "{stderr}");
    assert!(stderr.contains("YAML document too large or too complex: limits breached"), "{stderr}");
}

/// Names of other parts of the file (a route's limits and upstream, an override's limit)
/// and key parts get the same suggestion as fields; with none close, the few defined are
/// listed, and past eight, only counted.
#[test]
fn misspelt_references_and_keys_are_told_what_they_likely_mean() {
    let yaml = "listen: 127.0.0.1:0
upstreams:
  backend: { servers: [\"127.0.0.1:1\"], balance: hash, hash_key: \"cokie:session\" }
limits:
  per_ip: { key: ipp, rate: 1r/s, overrides: [ { match: { tokens: [t] }, use: per_tokn } ] }
  per_token: { key: [bearer, \"headr:x-user\"], rate: 1r/s }
  per_user: { key: cookies, rate: 1r/s }
routes:
  - upstream: backnd
    limits: [per_ipp, per_token, other]
";
    let (ok, stderr) = check(yaml);
    assert!(!ok);
    assert_eq!(
        stderr,
        "FILE:3:65: upstreams.backend.hash_key: unknown key kind \"cokie\"; did you mean `cookie:session`?
FILE:5:18: limits.per_ip.key: unknown key \"ipp\"; did you mean `ip`?
FILE:5:79: limits.per_ip.overrides[0].use: unknown limit \"per_tokn\"; did you mean `per_token`?
FILE:6:30: limits.per_token.key[1]: unknown key kind \"headr\"; did you mean `header:x-user`?
FILE:7:20: limits.per_user.key: unknown key \"cookies\"; did you mean `cookie:NAME`?
FILE:9:15: routes[0].upstream: unknown upstream \"backnd\"; did you mean `backend`?
FILE:10:14: routes[0].limits[0]: unknown limit \"per_ipp\"; did you mean `per_ip`?
FILE:10:34: routes[0].limits[2]: unknown limit \"other\" (defined: per_ip, per_token, per_user)
FILE: configuration is invalid
"
    );
    let many: String = (0..9).map(|i| format!("  limit_{i}: {{ key: ip, rate: 1r/s }}\n")).collect();
    let (ok, stderr) = check(&format!("{BASE}{many}routes:\n  - limits: [other]\n    respond: {{ status: 200 }}\n"));
    assert!(!ok);
    assert!(
        stderr.starts_with(
            "FILE:13:14: routes[0].limits[0]: unknown limit \"other\": none of the 9 under `limits:` is close to it\n"
        ),
        "{stderr}"
    );
}

/// What `sluicegate check` prints for a file with several unknown fields and a semantic
/// error: all of them, in one run.
#[test]
fn check_prints_every_unknown_field_and_the_other_errors_in_one_run() {
    let yaml = "listen: 127.0.0.1:0
trusted_proxy: [10.0.0.0/8]
limits:
  per_ip: { key: ip, rate: 10r/s, brust: 20 }
routes:
  - match: { path_prefx: /api }
    respond: { status: 200, bdy: ok }
    limits: [per_ip]
    cost: 0
";
    let (code, stderr) = check_bounded(yaml);
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(
        stderr,
        "FILE:2:1: trusted_proxy: unknown field `trusted_proxy`; did you mean `trusted_proxies`?
FILE:4:35: limits.per_ip.brust: unknown field `brust`; did you mean `burst`?
FILE:6:14: routes[0].match.path_prefx: unknown field `path_prefx`; did you mean `path_prefix`?
FILE:7:29: routes[0].respond.bdy: unknown field `bdy`; did you mean `body`?
FILE:9:11: routes[0].cost: must be a positive integer
FILE: configuration is invalid
"
    );
}

#[test]
fn run_refuses_to_start_with_an_invalid_config() {
    let (_dir, path) = config_file("listen: 127.0.0.1:0\nroutes:\n  - upstream: missing\n");
    let out = binary().arg("-c").arg(&path).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("routes[0].upstream: unknown upstream \"missing\""));
}

#[test]
fn concurrency_and_rate_fields_are_not_mixed() {
    let yaml = format!(
        "{BASE}  a: {{ key: ip, concurrency: 2, burst: 3 }}\n  b: {{ key: ip, rate: 1r/s, concurrency: 2 }}\n  c: {{ key: ip }}\n"
    );
    let (ok, stderr) = check(&yaml);
    assert!(!ok);
    let expected = [
        "FILE:3:40: limits.a.burst: does not apply to concurrency limits (its fields: concurrency, retry_after, adaptive)",
        "FILE:4:23: limits.b.rate: does not apply to concurrency limits",
        "FILE:5:6: limits.c: needs `rate: N r/DURATION` (e.g. 10r/s), `concurrency: N`, or an `algorithm`",
    ];
    assert_reported(&stderr, &expected);
}

#[test]
fn algorithm_fields_are_checked_per_algorithm() {
    let yaml = format!(
        "{BASE}  a: {{ key: ip, algorithm: token_bucket, capacity: 4 }}\n  b: {{ key: ip, algorithm: fixed_window, limit: 4, window: 1h, burst: 2 }}\n"
    );
    let (ok, stderr) = check(&yaml);
    assert!(!ok);
    assert!(
        stderr.contains("FILE:3:6: limits.a: algorithm token_bucket needs `refill` (e.g. refill: 10r/s)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("limits.b.burst: does not apply to algorithm fixed_window (its fields: limit, window)"),
        "{stderr}"
    );
}

#[test]
fn unknown_algorithm_lists_the_known_ones() {
    let (ok, stderr) = check(&format!("{BASE}  c: {{ key: ip, algorithm: sliding_stuff }}\n"));
    assert!(!ok);
    assert!(
        stderr.contains(
            "FILE:3:28: limits.c.algorithm: unknown variant `sliding_stuff`, expected one of leaky_bucket, gcra"
        ),
        "{stderr}"
    );
}

#[test]
fn a_fixed_cost_that_can_never_fit_is_refused() {
    let yaml = format!(
        "{BASE}  l: {{ key: ip, rate: 1r/s, burst: 2 }}\nroutes:\n  - cost: 4\n    limits: [l]\n    respond: {{ status: 200 }}\n"
    );
    let (ok, stderr) = check(&yaml);
    assert!(!ok);
    assert!(stderr.contains("FILE:5:11: routes[0].cost: 4 can never fit limit \"l\" (routes[0].limits[0]), which admits at most 3 at once"), "{stderr}");
    // The limits an override hands requests to decide them too.
    let yaml = format!(
        "{BASE}  l: {{ key: bearer, on_missing_key: skip, rate: 10r/s, burst: 9, overrides: [{{ match: {{ tokens: [t] }}, use: small }}] }}\n  small: {{ key: bearer, on_missing_key: skip, rate: 1r/s }}\nroutes:\n  - cost: 4\n    limits: [l]\n    respond: {{ status: 200 }}\n"
    );
    let (ok, stderr) = check(&yaml);
    assert!(!ok);
    assert!(stderr.contains("routes[0].cost: 4 can never fit limit \"small\" (named by an override of the route's limits), which admits at most 1 at once"), "{stderr}");
}

#[test]
fn zero_burst_is_accepted_where_nothing_is_delayed() {
    let (ok, stderr) = check(&format!(
        "{BASE}  a: {{ key: ip, rate: 1r/s, burst: 0, nodelay: true }}\n  b: {{ key: ip, algorithm: gcra, rate: 1r/s, burst: 0 }}\n"
    ));
    assert!(ok, "{stderr}");
}

#[test]
fn overrides_must_name_another_limit_without_overrides_of_its_own() {
    let yaml = format!(
        "{BASE}  a: {{ key: ip, rate: 1r/s, overrides: [ {{ match: {{ cidrs: [10.0.0.0/8] }}, use: b }}, {{ match: {{ tokens: [t] }}, use: a }}, {{ match: {{ tokens: [u] }}, use: zz }} ] }}\n  b: {{ key: ip, rate: 2r/s, overrides: [ {{ match: {{ tokens: [v] }}, use: c }} ] }}\n  c: {{ key: ip, rate: 3r/s }}\n"
    );
    let (ok, stderr) = check(&yaml);
    assert!(!ok);
    for expected in [
        "limits.a.overrides[0].use: limit \"b\" has overrides of its own; overrides do not chain",
        "limits.a.overrides[1].use: a limit cannot override itself",
        "limits.a.overrides[2].use: unknown limit \"zz\" (defined: a, b, c)",
    ] {
        assert!(stderr.contains(expected), "{expected}\nnot in\n{stderr}");
    }
}

#[test]
fn rates_take_no_other_rate_fields_and_exclude_an_algorithm() {
    let yaml = format!(
        "{BASE}  a: {{ key: ip, rates: [10r/s, 1000r/d], burst: 5 }}\n  b: {{ key: ip, rates: [10r/s], algorithm: gcra }}\n  c: {{ key: ip, rates: [] }}\n"
    );
    let (ok, stderr) = check(&yaml);
    assert!(!ok);
    for expected in [
        "FILE:3:49: limits.a.burst: does not apply to several windows (`rates`) (its fields: rates)",
        "FILE:4:6: limits.b: give one of `algorithm`, `rates` or `concurrency`",
        "limits.c.rates: needs at least one rate",
    ] {
        assert!(stderr.contains(expected), "{expected}\nnot in\n{stderr}");
    }
}

#[test]
fn global_limits_are_checked_against_the_redis_section_and_their_scripts() {
    let yaml = "listen: 127.0.0.1:0
limits:
  a: { key: ip, rate: 1r/s, scope: global }
  b: { key: ip, rate: 1r/s, on_store_error: deny }
  c: { key: ip, algorithm: fixed_window, limit: 5, window: 1500us, scope: global, instances: 0 }
  d: { key: ip, rate: 1r/d, burst: 60, nodelay: true, scope: global, on_store_error: allow, instances: 2 }
";
    let (ok, stderr) = check(yaml);
    assert!(!ok);
    for line in [
        "FILE:3:36: limits.a.scope: a global limit needs a `redis:` section",
        "FILE:4:45: limits.b.on_store_error: applies only to global limits (`scope: global`)",
        // Durations are whole milliseconds, as the Redis scripts count them.
        "FILE:5:60: limits.c.window: invalid duration \"1500us\": unknown unit `us`; the units are ms, s, m, h, d",
        "FILE:5:94: limits.c.instances: must be a positive integer",
        "FILE:6:6: limits.d: a global rate limit must drain within 52 days",
        "FILE:6:104: limits.d.instances: applies only with `on_store_error: local`",
    ] {
        assert!(stderr.contains(line), "{line}\nnot in\n{stderr}");
    }
    let (ok, stderr) = check(&format!("{yaml}redis: {{ url: \"http://x\", timeout: 0s, key_prefix: \"{{a}}\" }}\n"));
    assert!(!ok);
    for line in [
        "redis.url: invalid Redis URL \"http://x\"",
        "redis.timeout: must be longer than zero",
        "redis.key_prefix: must not contain",
    ] {
        assert!(stderr.contains(line), "{line}\nnot in\n{stderr}");
    }
    assert!(!stderr.contains("needs a `redis:` section"), "{stderr}");
    let (ok, stderr) = check(&format!(
        "{yaml}redis: {{ url: \"redis://127.0.0.1\", connections: 0, breaker_failures: 0, lease_ttl: 100ms, tls_ca_file: /no/such/ca.pem }}\n"
    ));
    assert!(!ok);
    for line in [
        "redis.connections: must be from 1 to 64",
        "redis.breaker_failures: must be a positive integer",
        "redis.lease_ttl: must be at least 300ms",
        "redis.tls_ca_file: applies only to TLS URLs (`rediss://`)",
        "redis.tls_ca_file: cannot read \"/no/such/ca.pem\"",
    ] {
        assert!(stderr.contains(line), "{line}\nnot in\n{stderr}");
    }
}

#[test]
fn a_sentinel_section_is_checked_with_positions() {
    let yaml = "listen: 127.0.0.1:0
limits:
  a: { key: ip, rate: 1r/s, scope: global }
redis:
  url: redis://127.0.0.1
  cluster: true
  sentinel:
    master: \"\"
    nodes: [\"10.0.0.1:26379\", \"10.0.0.2\", \"[::1]:26379\"]
    check_interval: 0s
";
    let (ok, stderr) = check(yaml);
    assert!(!ok);
    for line in [
        "FILE:5:8: redis.url: give either `url` or `sentinel`",
        "FILE:6:12: redis.cluster: a Redis Cluster fails over by itself",
        "FILE:8:13: redis.sentinel.master: must name the master the sentinels monitor",
        "FILE:9:31: redis.sentinel.nodes[1]: \"10.0.0.2\" is not `host:port`",
        "FILE:10:21: redis.sentinel.check_interval: must be longer than zero",
    ] {
        assert!(stderr.contains(line), "{line}\nnot in\n{stderr}");
    }
    assert!(!stderr.contains("nodes[0]") && !stderr.contains("nodes[2]"), "{stderr}");
    let (ok, stderr) = check("listen: 127.0.0.1:0\nredis: { timeout: 10ms }\n");
    assert!(!ok);
    assert!(
        stderr.contains("FILE:2:8: redis.url: required: the Redis server's URL (or `sentinel:` to find it)"),
        "{stderr}"
    );
    let (ok, stderr) = check(
        "listen: 127.0.0.1:0\nredis: { sentinel: { master: main, nodes: [\"127.0.0.1:26379\"], password: secret } }\n",
    );
    assert!(ok, "{stderr}");
}

#[test]
fn the_jwt_section_and_what_reads_claims_are_checked_with_positions() {
    // Claims read without a `jwt:` section to verify tokens with.
    let yaml = "listen: 127.0.0.1:0
limits:
  a: { key: \"jwt:sub\", rate: 1r/s, on_missing_key: skip }
  b: { key: ip, rate: 1r/s, on_invalid_token: refuse, allow: { claims: { roles: admin } } }
routes:
  - { limits: [a, b], respond: { status: 200 } }
";
    let (ok, stderr) = check(yaml);
    assert!(!ok);
    for line in [
        "FILE:3:13: limits.a.key: reads a verified token's claims: add a top-level `jwt:` section",
        "FILE:4:72: limits.b.allow.claims: reads a verified token's claims",
        "FILE:4:47: limits.b.on_invalid_token: applies to a limit keyed on a token's claims (`jwt:CLAIM`) only",
    ] {
        assert!(stderr.contains(line), "{line}\nnot in\n{stderr}");
    }
    let yaml = "listen: 127.0.0.1:0
jwt:
  secret: short
  keys_file: /etc/hostname-that-is-not-there
  leeway: 10m
  from: \"query:token\"
  issuer: []
limits:
  a: { key: \"jwt:org..id\", on_missing_key: skip, rate: 1r/s }
";
    let (ok, stderr) = check(yaml);
    assert!(!ok);
    for line in [
        "FILE:3:11: jwt.secret: is 5 bytes long; an HMAC secret needs at least 32",
        "FILE:4:14: jwt.keys_file: cannot read \"/etc/hostname-that-is-not-there\"",
        "FILE:5:11: jwt.leeway: 10m is too long; at most 5m",
        "FILE:6:9: jwt.from: \"query:token\" is not where a token can be: bearer, header:NAME or cookie:NAME",
        "FILE:7:11: jwt.issuer: needs a non-empty value",
        "FILE:9:13: limits.a.key: invalid claim \"org..id\"",
    ] {
        assert!(stderr.contains(line), "{line}\nnot in\n{stderr}");
    }
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.pem");
    std::fs::write(&keys, "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").unwrap();
    let (ok, stderr) = check(&format!("listen: 127.0.0.1:0\njwt: {{ keys_file: \"{}\" }}\n", keys.display()));
    assert!(!ok);
    assert!(stderr.contains("jwt.keys_file:") && stderr.contains("not a public key"), "{stderr}");
    let (ok, stderr) = check("listen: 127.0.0.1:0\njwt: { jwks_url: \"ftp://idp/keys\", jwks_refresh: 1s }\n");
    assert!(!ok);
    assert!(
        stderr.contains("FILE:2:18: jwt.jwks_url: \"ftp://idp/keys\" is not an http:// or https:// URL"),
        "{stderr}"
    );
    assert!(stderr.contains("FILE:2:50: jwt.jwks_refresh: must be at least 10s"), "{stderr}");
    let (ok, stderr) = check("listen: 127.0.0.1:0\njwt: { issuer: x }\n");
    assert!(!ok);
    assert!(stderr.contains("FILE:2:6: jwt: needs the keys tokens are verified with"), "{stderr}");
    let (ok, stderr) =
        check("listen: 127.0.0.1:0\njwt: { secret: \"0123456789abcdef0123456789abcdef\", audience: [api, web] }\n");
    assert!(ok, "{stderr}");
}

#[test]
fn connection_limits_are_bounded() {
    let yaml = "listen: 127.0.0.1:0\nserver:\n  idle_timeout: 0s\n  send_timeout: 2d\n  max_connections: 0\n";
    let (ok, stderr) = check(yaml);
    assert!(!ok);
    assert!(stderr.contains("FILE:3:17: server.idle_timeout: must be longer than zero"), "{stderr}");
    assert!(stderr.contains("FILE:4:17: server.send_timeout: \"2d\" is too long; at most 24h"), "{stderr}");
    assert!(stderr.contains("FILE:5:20: server.max_connections: must be from 1 to 10000000, not 0"), "{stderr}");
    let (ok, stderr) =
        check("listen: 127.0.0.1:0\nserver: { idle_timeout: 24h, send_timeout: 1s, max_connections: 1 }\n");
    assert!(ok, "{stderr}");
}

#[test]
fn worker_counts_are_bounded() {
    let (ok, stderr) = check("listen: 127.0.0.1:0\nserver:\n  workers: 0\n");
    assert!(!ok);
    assert!(stderr.contains("FILE:3:12: server.workers: must be from 1 to 1024, not 0"), "{stderr}");
    let (ok, stderr) = check("listen: 127.0.0.1:0\nserver: { workers: 1025 }\n");
    assert!(stderr.contains("server.workers: must be from 1 to 1024, not 1025"), "{stderr}");
    assert!(!ok);
    let (ok, stderr) = check("listen: 127.0.0.1:0\nserver: { workers: 1 }\n");
    assert!(ok, "{stderr}");
}

#[test]
fn head_limits_are_bounded() {
    let yaml = "listen: 127.0.0.1:0\nserver:\n  max_header_bytes: 100\n  max_uri_bytes: 2000000\n";
    let (ok, stderr) = check(yaml);
    assert!(!ok);
    let bounds = "must be from 1024 to 1048576 bytes (1 KiB to 1 MiB)";
    assert!(stderr.contains(&format!("FILE:3:21: server.max_header_bytes: {bounds}, not 100")), "{stderr}");
    assert!(stderr.contains(&format!("FILE:4:18: server.max_uri_bytes: {bounds}, not 2000000")), "{stderr}");
    let (ok, stderr) = check("listen: 127.0.0.1:0\nserver: { max_header_bytes: 1048576, max_uri_bytes: 1024 }\n");
    assert!(ok, "{stderr}");
}

#[test]
fn a_route_path_that_no_normalized_request_path_matches_is_refused() {
    let yaml = "listen: 127.0.0.1:0\nroutes:\n  - match: { path_prefix: /api//v1 }\n    respond: { status: 200 }\n  - match: { path: /x/../y }\n    respond: { status: 200 }\n  - match: { path: /%41 }\n    respond: { status: 200 }\n";
    let (ok, stderr) = check(yaml);
    assert!(!ok);
    assert!(
        stderr.contains(
            "FILE:3:27: routes[0].match.path_prefix: \"/api//v1\" is not a normalized path: write it as \"/api/v1\""
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("routes[1].match.path: \"/x/../y\" is not a normalized path: write it as \"/y\""),
        "{stderr}"
    );
    assert!(stderr.contains("routes[2].match.path: \"/%41\" is not a normalized path: write it as \"/A\""), "{stderr}");
}

#[test]
fn upstream_balancing_errors_are_reported_together_with_their_paths() {
    let yaml = "listen: 127.0.0.1:0\nupstreams:\n  a:\n    servers: [{ address: \"127.0.0.1:1\", weight: 0 }, \"nohost\"]\n    balance: hash\n  b:\n    servers: [\"127.0.0.1:1\"]\n    balance: hash\n    hash_key: [ip, \"header:\"]\n    fail_timeout: 0s\n  c:\n    servers: [\"http://127.0.0.1:1\"]\n    tls: { ca_file: /nonexistent/ca.pem, sni: \"a b\" }\n    health_check: { path: healthz, interval: 0s, expect_status: [99] }\n";
    let (ok, stderr) = check(yaml);
    assert!(!ok);
    for expected in [
        "upstreams.a.servers[0].weight: must be from 1 to 10000, not 0",
        "upstreams.a.servers[1]: invalid server \"nohost\"",
        "upstreams.a.balance: `hash` needs `hash_key`",
        "upstreams.b.hash_key[1]: header: needs a name",
        "upstreams.b.fail_timeout: must be longer than zero",
        "upstreams.c.tls: applies only to https:// servers",
        "upstreams.c.tls.ca_file: cannot read \"/nonexistent/ca.pem\"",
        "upstreams.c.tls.sni: invalid server name \"a b\"",
        "upstreams.c.health_check.path: must be a path starting with '/'",
        "upstreams.c.health_check.interval: must be longer than zero",
        "upstreams.c.health_check.expect_status[0]: must be a status from 100 to 599, not 99",
    ] {
        assert!(stderr.contains(expected), "{expected:?} missing from:\n{stderr}");
    }
}

#[test]
fn route_rewriting_errors_name_their_fields() {
    let yaml = "listen: 127.0.0.1:0\nupstreams:\n  a: { servers: [\"127.0.0.1:1\"] }\nroutes:\n  - match: { path: /x }\n    upstream: a\n    strip_prefix: true\n  - upstream: a\n    rewrite: { prefix: api, to: / }\n    upstream_host: \"a b\"\n    remove_request_headers: [\"bad name\"]\n  - respond: { status: 200 }\n    set_response_headers: { x-a: b }\n";
    let (ok, stderr) = check(yaml);
    assert!(!ok);
    for expected in [
        "routes[0].strip_prefix: needs `match.path_prefix`",
        "routes[1].rewrite.prefix: must start with '/'",
        "routes[1].upstream_host: write keep, keep_name, server, or a host name",
        "routes[1].remove_request_headers[0]: invalid header name",
        "routes[2].respond: a `respond` route forwards nothing",
    ] {
        assert!(stderr.contains(expected), "{expected:?} missing from:\n{stderr}");
    }
}

#[test]
fn text_logs_carry_no_colour_codes_when_stderr_is_not_a_terminal() {
    use std::io::BufRead;
    let (_dir, path) = config_file("listen: 127.0.0.1:0\nroutes:\n  - respond: { status: 200 }\n");
    let mut child = binary()
        .args(["--log-format", "text", "-c"])
        .arg(&path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The lines up to the one that says it listens (start-up writes a few).
    let mut lines = String::new();
    let mut reader = std::io::BufReader::new(child.stderr.take().unwrap());
    while !lines.contains("listening") && reader.read_line(&mut lines).unwrap_or(0) > 0 {}
    child.kill().unwrap();
    child.wait().unwrap();
    let line = lines;
    assert!(line.contains("listening"), "{line}");
    assert!(!line.contains('\u{1b}'), "escape codes in {line:?}");
}

#[test]
fn the_printed_schema_accepts_the_example_and_refuses_unknown_keys() {
    let out = binary().arg("schema").output().unwrap();
    assert!(out.status.success());
    let schema: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(schema["title"], "sluicegate configuration");
    let validator = jsonschema::validator_for(&schema).unwrap();
    let example = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config.example.yaml")).unwrap();
    let example: serde_json::Value = serde_saphyr::from_str(&example).unwrap();
    let errors: Vec<String> = validator.iter_errors(&example).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:?}");
    let wrong: serde_json::Value =
        serde_saphyr::from_str("listen: 127.0.0.1:8080\nlimits:\n  a: { key: ip, rat: 5r/s }\n").unwrap();
    assert!(!validator.is_valid(&wrong), "an unknown key passed the schema");
}

#[test]
fn files_named_by_the_configuration_must_be_regular_files() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("ca.pem");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let big = dir.path().join("big.pem");
    std::fs::write(&big, vec![b'x'; 2 << 20]).unwrap();
    for (file, message) in [
        ("/dev/zero".to_owned(), "\"/dev/zero\" is not a regular file".to_owned()),
        // Opening a FIFO blocks until a writer comes: `check` would hang.
        (fifo.display().to_string(), format!("{:?} is not a regular file", fifo.display().to_string())),
        (big.display().to_string(), format!("{:?} is larger than 1024 KiB", big.display().to_string())),
    ] {
        let yaml = format!("listen: 127.0.0.1:0\nredis:\n  url: rediss://127.0.0.1\n  tls_ca_file: {file}\n");
        let (code, stderr) = check_bounded(&yaml);
        assert_eq!(code, Some(1), "{stderr}");
        assert!(stderr.contains(&format!("FILE:4:16: redis.tls_ca_file: {message}\n")), "{stderr}");
    }
}

#[test]
fn long_values_in_errors_are_cut_short() {
    let key = "k".repeat(500_000);
    let (ok, stderr) = check(&format!("{BASE}  a: {{ key: ip, rate: 1r/s, {key}: 1 }}\n"));
    assert!(!ok);
    assert!(stderr.len() < 1000, "{} bytes of errors", stderr.len());
    let cut = format!("{}…", "k".repeat(60));
    assert!(
        stderr.starts_with(&format!(
            "FILE:3:29: limits.a.{cut}: unknown field `{cut}`; the 43 fields of `limits.NAME` are listed in docs/configuration.md\n"
        )),
        "{stderr}"
    );
}

#[test]
fn invalid_utf8_is_placed_by_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sluicegate.yaml");
    std::fs::write(&path, b"listen: 127.0.0.1:0\nroutes:\n  - name: \xc3\xa9t\xe9\n").unwrap();
    let out = binary().arg("check").arg("-c").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr).replace(&path.display().to_string(), "FILE");
    assert!(stderr.starts_with("FILE:3:13: invalid UTF-8 (byte 0xE9); the file must be UTF-8\n"), "{stderr}");
}

/// Each error reads in the file's terms, at the place it names; never the parser's own.
#[test]
fn parse_errors_speak_of_the_file() {
    for (yaml, line) in [
        (
            "listen: 127.0.0.1:0\nupstreams:\n  backend:\n    servers: [\"127.0.0.1:1\"]\n  other: { servers: [\"127.0.0.1:2\"] }\n  backend:\n    servers: [\"127.0.0.1:3\"]\n",
            "FILE:6:3: upstreams: `backend` is defined twice, lines 3 and 6",
        ),
        ("listen: 127.0.0.1:0\nlisten: 127.0.0.1:1\n", "FILE:2:1: `listen` is defined twice, lines 1 and 2"),
        (
            &format!("{BASE}  a:\n    key: ip\n    rate: 1r/s\n    burst: -1\n"),
            "FILE:6:12: limits.a.burst: must be a whole number ≥ 0",
        ),
        (
            &format!("{BASE}  a: {{ key: ip, rate: 1r/s, burst: 20.5 }}\n"),
            "FILE:3:36: limits.a.burst: must be a whole number ≥ 0",
        ),
        (
            &format!("{BASE}  a: {{ key: ip, rate: 1r/s, status: 70000 }}\n"),
            "FILE:3:37: limits.a.status: must be a whole number at most 65535",
        ),
        (
            &format!("{BASE}  a:\n    key: ip\n\trate: 1r/s\n"),
            "FILE:5:1: a tab in the indentation; YAML indents with spaces",
        ),
        (
            &format!("{BASE}  a: {{ key: ip, rate: 1r/s, nodelay: maybe }}\n"),
            "FILE:3:38: limits.a.nodelay: must be true or false",
        ),
        ("", "FILE:1:1: the file is empty; a configuration needs at least `listen: IP:PORT`"),
        ("# nothing yet\n\n", "FILE:1:1: the file is empty; a configuration needs at least `listen: IP:PORT`"),
    ] {
        let (ok, stderr) = check(yaml);
        assert!(!ok, "{stderr}");
        assert_eq!(stderr, format!("{line}\nFILE: configuration is invalid\n"), "{yaml}");
    }
}

#[test]
fn a_missing_file_is_one_line_with_its_path_and_the_reason() {
    let out = binary().args(["check", "-c", "/nonexistent/sluicegate.yaml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "/nonexistent/sluicegate.yaml: cannot read: No such file or directory (os error 2)\n"
    );
}

#[test]
fn a_route_that_an_earlier_one_shadows_is_refused_naming_both_lines() {
    let yaml = "listen: 127.0.0.1:0
routes:
  - match: { host: \"*.example.com\", path_prefix: /api, methods: [GET, POST] }
    respond: { status: 200 }
  - match: { host: shop.example.com, path: /api/cart, methods: [GET] }
    respond: { status: 201 }
  - match: { host: shop.example.com, path: /api/cart }
    respond: { status: 202 }
";
    let (ok, stderr) = check(yaml);
    assert!(!ok, "{stderr}");
    // The third route also takes PUT: it can still match.
    assert_eq!(
        stderr,
        "FILE:5:5: routes[1]: can never match: routes[0] (line 3) comes first and takes every request it would\nFILE: configuration is invalid\n"
    );
}

#[tokio::test]
async fn no_routes_is_a_warning_of_check_and_of_run() {
    let yaml = "listen: 127.0.0.1:0\nroutes: []\n";
    let (ok, stderr) = check(yaml);
    assert!(ok, "{stderr}");
    assert_eq!(stderr, "warning: FILE:2:9: routes: no routes: every request is answered 404\n");
    let sg = Sluicegate::start(yaml);
    assert!(sg.log().contains("routes: no routes: every request is answered 404"), "{}", sg.log());
    assert_eq!(get(sg.addr, "/", &[]).await.status, 404);
}

#[test]
fn check_reports_an_upstream_host_that_does_not_resolve() {
    let yaml = "listen: 127.0.0.1:0\nupstreams:\n  app:\n    servers: [\"localhost:3000\", \"nonexistent.invalid:80\", \"127.0.0.1:1\"]\n";
    let started = std::time::Instant::now();
    let (code, stderr) = check_bounded(yaml);
    assert_eq!(code, Some(1), "{stderr}");
    // RFC 6761: `.invalid` never resolves; a resolver that does not answer is waited for 5 s.
    assert!(started.elapsed() < std::time::Duration::from_secs(15));
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("does not resolve")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].starts_with("FILE:4:33: upstreams.app.servers[1]: host \"nonexistent.invalid\" does not resolve: "),
        "{stderr}"
    );
}

#[test]
fn resolve_interval_is_a_positive_duration_or_off() {
    let yaml = |interval: &str| {
        format!(
            "listen: 127.0.0.1:0\nupstreams:\n  app: {{ servers: [\"127.0.0.1:1\"], resolve_interval: {interval} }}\n"
        )
    };
    for good in ["off", "5s", "1m"] {
        let (ok, stderr) = check(&yaml(good));
        assert!(ok, "{good}: {stderr}");
    }
    let (_, stderr) = check(&yaml("0s"));
    assert!(
        stderr.contains("FILE:3:54: upstreams.app.resolve_interval: must be longer than zero, or `off`"),
        "{stderr}"
    );
    let (_, stderr) = check(&yaml("never"));
    assert!(stderr.contains("upstreams.app.resolve_interval: invalid duration \"never\""), "{stderr}");
}

#[test]
fn a_port_in_use_is_named_when_run_cannot_listen() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    for (field, yaml) in [
        ("listen", format!("listen: {addr}\nroutes:\n  - respond: {{ status: 200 }}\n")),
        (
            "admin.listen",
            format!("listen: 127.0.0.1:0\nadmin: {{ listen: \"{addr}\" }}\nroutes:\n  - respond: {{ status: 200 }}\n"),
        ),
    ] {
        let (_dir, path) = config_file(&yaml);
        let out = binary().arg("-c").arg(&path).stdout(std::process::Stdio::null()).output().unwrap();
        assert_eq!(out.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&out.stderr);
        let expected = format!(
            "sluicegate: {}: cannot start: {field}: cannot listen on {addr}: Address already in use",
            path.display()
        );
        assert!(stderr.contains(&expected), "{expected}\nnot in\n{stderr}");
    }
}

/// An access log that cannot be written is found by `check`, at its field, before `run`
/// or a reload trips on it; one that becomes unwritable after `check` is named with its
/// field and path when `run` or a reload cannot open it.
#[tokio::test]
async fn an_access_log_that_cannot_be_opened_is_named_with_its_field() {
    let yaml = |path: &str| {
        format!("listen: 127.0.0.1:0\naccess_log: {{ path: \"{path}\" }}\nroutes:\n  - respond: {{ status: 200 }}\n")
    };
    let (ok, stderr) = check(&yaml("/nonexistent/dir/access.log"));
    assert!(!ok);
    assert_eq!(
        stderr,
        "FILE:2:21: access_log.path: cannot open \"/nonexistent/dir/access.log\" for appending: No such file or directory (os error 2)\nFILE: configuration is invalid\n"
    );
    let dir = tempfile::tempdir().unwrap();
    let (ok, stderr) = check(&yaml(&dir.path().display().to_string()));
    assert!(!ok && stderr.contains("access_log.path: ") && stderr.contains("is not a regular file"), "{stderr}");
    // A path `check` accepted, gone by the time of the reload: the reload fails, saying
    // which field and file.
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let path = logs.join("access.log").display().to_string();
    let sg = Sluicegate::start(
        &yaml(&path).replace("listen: 127.0.0.1:0", "listen: 127.0.0.1:0\nadmin: { listen: 127.0.0.1:0 }"),
    );
    std::fs::remove_dir_all(&logs).unwrap();
    let reply = get(sg.admin_addr(), "/readyz", &[]).await;
    assert_eq!(reply.status, 200);
    let log = sg.reload(
        &yaml(&format!("{path}.2"))
            .replace("listen: 127.0.0.1:0", "listen: 127.0.0.1:0\nadmin: { listen: 127.0.0.1:0 }"),
    );
    assert!(log.contains("reload failed"), "{log}");
    assert!(
        get(sg.admin_addr(), "/readyz", &[])
            .await
            .text()
            .contains(&format!("access_log.path: cannot open \"{path}.2\""))
    );
}

#[test]
fn a_configuration_that_is_not_a_regular_file_is_refused_at_once() {
    let out = binary().args(["check", "-c", "/dev/zero"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/dev/zero: cannot read: is not a regular file"));
}

#[test]
fn a_response_body_rate_needs_a_positive_size_per_second() {
    let route = |rate: &str| {
        format!("listen: 127.0.0.1:0\nroutes:\n  - respond: {{ status: 200 }}\n    response_body_rate: {rate}\n")
    };
    let (ok, stderr) = check(&route("{ bytes_per_second: 0 }"));
    assert!(!ok);
    assert!(stderr.contains("routes[0].response_body_rate.bytes_per_second: must be positive"), "{stderr}");
    let (ok, stderr) = check(&route("{ bytes_per_second: 1.5m, after: 1m }"));
    assert!(!ok);
    assert!(stderr.contains("FILE:4:") && stderr.contains("invalid size \"1.5m\""), "{stderr}");
    let (ok, stderr) = check(&route("{ bytes_per_second: 100k, after: 0 }"));
    assert!(ok, "{stderr}");
}

/// Soft limits: a limit that annotates refuses nothing, so it cannot ban; `annotate_from`
/// is a share of the capacity from 1 % to 100 %; `action` is `refuse` or `annotate`. Each
/// at its field's position.
#[test]
fn soft_limit_fields_are_checked_at_their_positions() {
    let yaml = "listen: 127.0.0.1:0
limits:
  a: { key: ip, rate: 1r/s, action: annotate, ban: 1m }
  b: { key: ip, rate: 1r/s, annotate_from: 0% }
  c: { key: ip, rate: 1r/s, annotate_from: 80 percent }
  e: { key: ip, rate: 1r/s, burst: 4, delay: 2, annotate_from: 80% }
  f: { key: ip, concurrency: 4, action: annotate, annotate_from: 100% }
routes:
  - limits: [a, b, c, e, f]
    respond: { status: 200 }
";
    let (ok, stderr) = check(yaml);
    assert!(!ok);
    assert_reported(
        &stderr,
        &[
            "FILE:3:52: limits.a.ban: a limit with `action: annotate` forwards what is over it and refuses nothing",
            "FILE:4:44: limits.b.annotate_from: \"0%\": a share of the limit's capacity from 1% to 100%, e.g. 80%",
            "FILE:5:44: limits.c.annotate_from: \"80 percent\": a share",
        ],
    );
    assert!(!stderr.contains("limits.e") && !stderr.contains("limits.f"), "{stderr}");
    let (ok, stderr) = check(&format!("{BASE}  d: {{ key: ip, rate: 1r/s, action: warn }}\n"));
    assert!(!ok);
    assert_reported(&stderr, &["FILE:3:37: limits.d.action: unknown variant `warn`, expected one of refuse, annotate"]);
}

/// Each rule docs/limits.md states for a limit's fields and a route's list of limits, with its
/// message and position, all reported by one `check`.
#[test]
fn each_limit_rule_names_its_field_and_position() {
    let yaml = "listen: 127.0.0.1:0
limits:
  a: { key: ip, rate: 1r/s, burst: 2, delay: 3 }
  b: { key: ip, rate: 1r/s, burst: 2, delay: 1, nodelay: true }
  c: { key: ip, rate: 1r/s, ban_max: 1h }
  d: { key: ip, algorithm: fixed_window, limit: 2, window: 0ms }
  e: { key: ip, concurrency: 2, count: [200] }
  f: { key: ip, rate: 1r/s, max_keys: 0 }
  g: { key: ip, algorithm: token_bucket, capacity: 0, refill: 1r/s }
  h: { key: ip, concurrency: 0 }
routes:
  - limits: [a, a, b, c, d, e, f, g, h]
    respond: { status: 200 }
";
    let (ok, stderr) = check(yaml);
    assert!(!ok);
    assert_eq!(
        stderr,
        "FILE:3:46: limits.a.delay: must not exceed burst (2); use `nodelay: true` for no delay
FILE:4:46: limits.b.delay: give either `nodelay: true` or `delay: N`, not both
FILE:5:38: limits.c.ban_max: needs `ban` (the first ban's length)
FILE:6:60: limits.d.window: must be longer than zero
FILE:7:40: limits.e.count: does not apply to concurrency limits (a slot is held by every request)
FILE:8:39: limits.f.max_keys: must be a positive integer
FILE:9:52: limits.g.capacity: must be a positive integer
FILE:10:30: limits.h.concurrency: must be a positive integer (or `adaptive`)
FILE:12:17: routes[0].limits[1]: limit \"a\" is listed twice
FILE: configuration is invalid
"
    );
}

/// A limit that no route lists, nor any override uses, decides nothing: a warning says so.
#[test]
fn a_limit_no_route_uses_is_a_warning() {
    let yaml = "listen: 127.0.0.1:0
limits:
  used: { key: ip, rate: 1r/s, overrides: [ { match: { cidrs: [10.0.0.0/8] }, use: inner } ] }
  inner: { key: ip, rate: 10r/s }
  forgotten: { key: ip, rate: 1r/s }
routes:
  - { limits: [used], respond: { status: 200 } }
";
    let (ok, stderr) = check(yaml);
    assert!(ok, "{stderr}");
    assert_eq!(stderr, "warning: FILE:5:14: limits.forgotten: no route lists this limit: it decides nothing\n");
}

/// An unclosed `{` is reported where it was opened, not lines later where the parser
/// gave up.
#[test]
fn an_unclosed_flow_mapping_points_at_its_bracket() {
    let yaml = "listen: 127.0.0.1:0\nlimits:\n  a: { key: ip, rate: 1r/s\n  # a comment with a { in it\nroutes:\n  - respond: { status: 200 }\n";
    let (ok, stderr) = check(yaml);
    assert!(!ok);
    assert!(
        stderr.starts_with("FILE:3:6: limits.a: this `{` is not closed: a `}` (or a `,`) is missing before line "),
        "{stderr}"
    );
}

/// The shipped example starts without a warning (on free ports instead of its own).
#[test]
fn the_example_starts_without_warnings() {
    let yaml = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config.example.yaml")).unwrap();
    let yaml = yaml.replace("127.0.0.1:8080", "127.0.0.1:0").replace("127.0.0.1:9901", "127.0.0.1:0");
    let sg = Sluicegate::start(&yaml);
    let started = sg.wait_for_log("the line \"admin listening\"", |log| log.contains("admin listening"));
    assert!(started.contains("admin listening") && !started.contains("WARN"), "{started}");
    // A request to the pool waits for its first health checks, if it has any: none may
    // have failed (this example runs no servers there; the request's own failure is
    // logged, as it should be).
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    assert_eq!(rt.block_on(get(sg.addr, "/v2/x", &[])).status, 502);
    let log = sg.wait_for_log("the line \"upstream error\"", |log| log.contains("upstream error"));
    assert!(!log.contains("health check"), "{log}");
}

/// Without `-c`, `run`, `check` and `reload` read /etc/sluicegate/config.yaml, where the
/// systemd unit keeps it; when it is not there, they say so and how to give one.
#[test]
fn without_c_the_default_configuration_is_named() {
    if std::path::Path::new("/etc/sluicegate/config.yaml").exists() {
        eprintln!("skipped: this machine has /etc/sluicegate/config.yaml");
        return;
    }
    for command in ["check", "run", "reload"] {
        let out = binary().arg(command).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{command}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("/etc/sluicegate/config.yaml does not exist; give one with -c FILE"),
            "{command}: {stderr}"
        );
    }
    let help = binary().arg("--help").output().unwrap();
    assert!(help.status.success());
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("[default: /etc/sluicegate/config.yaml]"), "{help}");
}

/// Each subcommand's `--help` lists only the options it takes, `simulate`'s shows what it
/// requires, and the command summary (docs/command-line.md) names every option of every
/// subcommand.
#[test]
fn each_subcommand_has_its_own_options_and_the_command_line_page_lists_them() {
    let help = |command: &str| {
        let out = binary().args([command, "--help"]).output().unwrap();
        assert!(out.status.success(), "{command}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let check = help("check");
    assert!(check.contains("--config") && !check.contains("--log-level"), "{check}");
    assert!(!help("import").contains("--log-level"));
    let simulate = help("simulate");
    assert!(
        simulate.contains("Usage: sluicegate simulate [OPTIONS] --config <FILE> <LOG|--synthetic <SPEC>>"),
        "{simulate}"
    );
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/command-line.md")).unwrap();
    let summary = page.split("## Synopsis").nth(1).unwrap().split("\n## ").next().unwrap();
    for command in ["run", "check", "reload", "simulate", "import", "verify"] {
        // An option line: `  -c, --config <FILE>  …` or `      --json  …`; the summary
        // may write the short form.
        for line in help(command).lines().map(str::trim_start).filter(|l| l.starts_with('-')) {
            let words: Vec<&str> = line.split_whitespace().map(|w| w.trim_end_matches(',')).collect();
            let long = words.iter().find(|w| w.starts_with("--")).copied().unwrap_or_default();
            let short = words.first().filter(|w| !w.starts_with("--")).map(|w| format!("{w} "));
            if long == "--help" {
                continue;
            }
            let named = summary.contains(long) || short.is_some_and(|s| summary.contains(&s));
            assert!(named, "docs/command-line.md's synopsis lacks {command} {long}");
        }
    }
}

#[test]
fn access_log_keys_are_json_lines_with_credentials_digested_by_a_secret_of_the_operators() {
    let yaml = |log_keys: &str, access_log: &str| {
        format!(
            "listen: 127.0.0.1:0\n{log_keys}access_log: {access_log}\nlimits:\n  per_tenant: {{ key: \"header:x-tenant\", on_missing_key: skip, rate: 1r/s }}\n  per_token: {{ key: [ip, bearer], rate: 1r/s }}\nroutes:\n  - {{ limits: [per_tenant, per_token], respond: {{ status: 200 }} }}\n"
        )
    };
    let (ok, stderr) = check(&yaml("", "{ keys: true }"));
    assert!(!ok);
    assert_eq!(
        stderr,
        "FILE:2:21: access_log.keys: limit per_token is keyed on bearer, which the access log writes as a keyed \
         digest: give keys_secret (at least 16 characters, the same on every instance and across \
         restarts), or log_keys: clear to write it as sent\nFILE: configuration is invalid\n"
    );
    let (ok, stderr) = check(&yaml("", "{ keys: true, keys_secret: short }"));
    assert!(!ok && stderr.contains("access_log.keys_secret: must be at least 16 characters"), "{stderr}");
    let (ok, stderr) = check(&yaml("", "{ format: combined, keys: true, keys_secret: 0123456789abcdef }"));
    assert!(!ok && stderr.contains("access_log.keys: key parts are written in JSON lines only"), "{stderr}");
    for (log_keys, access_log) in [
        ("", "{ keys: true, keys_secret: 0123456789abcdef }"),
        // Nothing is a digest: no secret is needed.
        ("log_keys: clear\n", "{ keys: true }"),
        // Off: a secret is not needed, and one given is harmless.
        ("", "{ format: combined, keys_secret: 0123456789abcdef }"),
        // Its place now: the top level (every surface's digests are keyed with it).
        ("keys_secret: 0123456789abcdef\n", "{ keys: true }"),
    ] {
        let (ok, stderr) = check(&yaml(log_keys, access_log));
        assert!(ok, "{log_keys}{access_log}: {stderr}");
    }
    let (ok, stderr) = check(&yaml("keys_secret: 0123456789abcdef\n", "{ keys: true, keys_secret: 0123456789abcdef }"));
    assert!(!ok && stderr.contains("access_log.keys_secret: give keys_secret at the top level only"), "{stderr}");
    // A header that is no credential is written as sent, without a secret...
    let tenant_only =
        |log_keys| yaml(log_keys, "{ keys: true }").replace("limits: [per_tenant, per_token]", "limits: [per_tenant]");
    assert!(check(&tenant_only("")).0);
    // ... but with `log_keys: hashed` it is a digest too.
    let (ok, stderr) = check(&tenant_only("log_keys: hashed\n"));
    assert!(!ok && stderr.contains("limit per_tenant is keyed on header:x-tenant"), "{stderr}");
}

/// The access log's `keys_secret` is a secret like the others: `${NAME}` or a file.
#[test]
fn the_access_log_keys_secret_comes_from_the_environment_or_a_file() {
    let yaml = |secret: &str| {
        format!(
            "listen: 127.0.0.1:0\naccess_log: {{ keys: true, {secret} }}\nroutes:\n  - respond: {{ status: 200 }}\n"
        )
    };
    let (ok, stderr) = check(&yaml("keys_secret: \"${SG_SURELY_UNSET_SECRET}\""));
    assert!(
        !ok && stderr.contains("access_log.keys_secret: the environment variable SG_SURELY_UNSET_SECRET is not set"),
        "{stderr}"
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("secret");
    std::fs::write(&file, "0123456789abcdef0123\n").unwrap();
    let (ok, stderr) = check(&yaml(&format!("keys_secret_file: \"{}\"", file.display())));
    assert!(ok, "{stderr}");
    std::fs::write(&file, "short\n").unwrap();
    let (ok, stderr) = check(&yaml(&format!("keys_secret_file: \"{}\"", file.display())));
    assert!(!ok && stderr.contains("access_log.keys_secret: must be at least 16 characters"), "{stderr}");
}

/// A port alone where an address is expected, and sizes in other spellings than nginx's,
/// are refused with what to write instead.
#[test]
fn a_bare_port_and_sizes_nginx_would_refuse_are_explained() {
    let (ok, stderr) = check("listen: 19200\nroutes:\n  - respond: { status: 200 }\n");
    assert!(!ok);
    assert!(
        stderr.starts_with(
            "FILE:1:9: listen: 19200 is a port alone: write the address with it, e.g. 0.0.0.0:19200 (every interface) or 127.0.0.1:19200\n"
        ),
        "{stderr}"
    );
    let (ok, stderr) = check("listen: [127.0.0.1:0, 19201]\nroutes:\n  - respond: { status: 200 }\n");
    assert!(!ok && stderr.contains("listen[1]: 19201 is a port alone"), "{stderr}");
    for (size, why) in [
        ("10MB", "unknown unit `MB`"),
        ("10Mb", "unknown unit `Mb`"),
        ("\"1 kb\"", "no space between the number and its unit"),
        ("10G0", "unknown unit `G0`"),
    ] {
        let (ok, stderr) = check(&format!(
            "listen: 127.0.0.1:0\nserver: {{ max_body_bytes: {size} }}\nroutes:\n  - respond: {{ status: 200 }}\n"
        ));
        assert!(!ok, "{size}");
        assert!(
            stderr.contains("server.max_body_bytes: invalid size")
                && stderr.contains(why)
                && stderr
                    .contains("the units are k, m, g (×1024, upper or lower case); write e.g. 1048576, 512k, 10m, 1g"),
            "{size}: {stderr}"
        );
    }
    for size in ["10m", "10M", "512k", "1g", "1048576"] {
        let (ok, stderr) = check(&format!(
            "listen: 127.0.0.1:0\nserver: {{ max_body_bytes: {size} }}\nroutes:\n  - respond: {{ status: 200 }}\n"
        ));
        assert!(ok, "{size}: {stderr}");
    }
}

/// A route's own burst and delay on a limit: only on a leaky bucket, with its own
/// `burst`, the delay rules of a limit's, each error at its field.
#[test]
fn a_routes_own_burst_is_checked_at_its_field() {
    let yaml = "listen: 127.0.0.1:0
limits:
  perip: { key: ip, rate: 10r/s, burst: 20, nodelay: true }
  win: { key: ip, algorithm: fixed_window, limit: 5, window: 1s }
  gcra: { key: ip, algorithm: gcra, rate: 10r/s, burst: 3 }
routes:
  - limits: [{ limit: perip, burst: 5, delay: 6 }]
    respond: { status: 200 }
    match: { path: /0 }
  - limits: [{ limit: perip, burst: 5, nodelay: true, delay: 1 }]
    respond: { status: 200 }
    match: { path: /1 }
  - limits: [{ limit: perip, nodelay: true }, { limit: win, brust: 1 }]
    respond: { status: 200 }
    match: { path: /2 }
  - limits: [{ limit: win, burst: 5 }, { limit: gcra, burst: 1 }]
    respond: { status: 200 }
    match: { path: /3 }
  - limits: [perip, { limit: perip, burst: 1 }, { limit: nope, burst: 1 }]
    respond: { status: 200 }
    match: { path: /4 }
  - limits: [{ limit: perip, burst: 2 }]
    cost: 4
    respond: { status: 200 }
";
    let (ok, stderr) = check(yaml);
    assert!(!ok);
    assert_eq!(
        stderr,
        "FILE:7:47: routes[0].limits[0].delay: must not exceed burst (5); use `nodelay: true` for no delay
FILE:10:62: routes[1].limits[0].delay: give either `nodelay: true` or `delay: N`, not both
FILE:13:14: routes[2].limits[0]: needs `burst: N` (each use gives its own, as a `limit_req` line does); or name the limit alone
FILE:13:61: routes[2].limits[1].brust: unknown field `brust`; did you mean `burst`?
FILE:16:35: routes[3].limits[0].burst: a route gives its own burst and delay only to a leaky-bucket limit (`rate:` without `algorithm`), and \"win\" is not one: name it alone
FILE:16:62: routes[3].limits[1].burst: a route gives its own burst and delay only to a leaky-bucket limit (`rate:` without `algorithm`), and \"gcra\" is not one: name it alone
FILE:19:30: routes[4].limits[1].limit: limit \"perip\" is listed twice
FILE:19:58: routes[4].limits[2].limit: unknown limit \"nope\" (defined: gcra, perip, win)
FILE:23:11: routes[5].cost: 4 can never fit limit \"perip\" (routes[5].limits[0]), which admits at most 3 at once
FILE: configuration is invalid
"
    );
}

/// A limit's own refusal may not set what sluicegate writes itself, and gives its status
/// once; each error at its field.
#[test]
fn a_limits_own_response_is_checked_field_by_field() {
    let base = "listen: 127.0.0.1:0\nlimits:\n  a:\n    key: ip\n    rate: 1r/s\n";
    for (extra, error) in [
        (
            "    response: { headers: { retry-after: '5' } }\n",
            "limits.a.response.headers.retry-after: sluicegate writes this field of a refusal itself",
        ),
        (
            "    status: 429\n    response: { status: 503 }\n",
            "limits.a.response.status: give the refusal's status once",
        ),
        ("    response: { status: 200 }\n", "limits.a.response.status: must be a status from 400 to 599, not 200"),
        ("    response: { content_type: \"a\\u0001b\" }\n", "limits.a.response.content_type: "),
    ] {
        let (ok, stderr) = check(&format!("{base}{extra}"));
        assert!(!ok, "{extra}");
        assert!(stderr.starts_with("FILE:6:") || stderr.starts_with("FILE:7:"), "{extra}: {stderr}");
        assert!(stderr.contains(error), "{extra}: {stderr}");
    }
    let (ok, stderr) = check(&format!(
        "{base}    response: {{ body: 'limit {{limit}}, {{retry_after}} s', headers: {{ x-a: b }} }}\n"
    ));
    assert!(ok, "{stderr}");
}

/// A calendar window's fields, each checked where it stands: the period's word (with the
/// one it most likely misspells), the zone's name (in the IANA database), the reset day
/// for the period, and the algorithms that take one.
#[test]
fn calendar_window_fields_are_checked_with_their_positions() {
    let yaml = format!(
        "{BASE}  a: {{ key: ip, algorithm: fixed_window, limit: 5, window: {{ calendar: mnth }} }}
  b: {{ key: ip, algorithm: fixed_window, limit: 5, window: {{ calendar: day, tz: Europe/Berln }} }}
  c: {{ key: ip, algorithm: fixed_window, limit: 5, window: {{ calendar: month, reset_day: 31 }} }}
  d: {{ key: ip, algorithm: fixed_window, limit: 5, window: {{ calendar: day, reset_day: 1 }} }}
  e: {{ key: ip, algorithm: fixed_window, limit: 5, window: {{ calendar: week, reset_day: sundy }} }}
  f: {{ key: ip, algorithm: fixed_window, limit: 5, window: {{ calendar: week, reset_day: 7 }} }}
  g: {{ key: ip, algorithm: sliding_window, limit: 5, window: {{ calendar: day }} }}
  h: {{ key: ip, algorithm: fixed_window, limit: 5, window: {{ calender: day }} }}
  i: {{ key: ip, algorithm: fixed_window, limit: 5, window: {{ calendar: month, tz: Mars/Olympus_Mons }} }}
  ok: {{ key: ip, on_missing_key: skip, algorithm: fixed_window, limit: 5, window: {{ calendar: week, tz: Asia/Tokyo, reset_day: sunday }} }}
"
    );
    let (ok, stderr) = check(&yaml);
    assert!(!ok);
    let expected = [
        "FILE:3:72: limits.a.window.calendar: unknown calendar \"mnth\": give `day`, `week` or `month`; did you mean `month`?",
        "FILE:4:81: limits.b.window.tz: unknown time zone \"Europe/Berln\"; did you mean `Europe/Berlin`?",
        "FILE:5:90: limits.c.window.reset_day: a month starts on a day from 1 to 28 (a day every month has), not 31",
        "FILE:6:88: limits.d.window.reset_day: does not apply to `calendar: day` (a day starts at local midnight)",
        "FILE:7:89: limits.e.window.reset_day: a week starts on a weekday: give `monday` … `sunday`, not \"sundy\"; did you mean `sunday`?",
        "FILE:8:89: limits.f.window.reset_day: a week starts on a weekday: give `monday` … `sunday`, not 7",
        "FILE:9:62: limits.g.window: a calendar window applies only to algorithm fixed_window; algorithm sliding_window takes a length (e.g. window: 1h)",
        "FILE:10:62: limits.h.window.calender: unknown field `calender`; did you mean `calendar`?",
        "FILE:11:83: limits.i.window.tz: unknown time zone \"Mars/Olympus_Mons\" (an IANA time zone name, such as `Europe/Berlin` or `UTC`)",
    ];
    assert_reported(&stderr, &expected);
    assert!(!stderr.contains("limits.ok"), "{stderr}");
}

/// `charge:`: one kind of place the report is read from, field names or JSON paths that
/// are ones (several with positive weights), a default within bounds, on an algorithm
/// whose state can carry a debt.
#[test]
fn charge_fields_are_checked_with_their_positions() {
    let yaml = format!(
        "{BASE}  a: {{ key: ip, rate: 1r/s, charge: {{ header: x-used, trailer: x-used }} }}
  b: {{ key: ip, rate: 1r/s, charge: {{ default: 2 }} }}
  c: {{ key: ip, rate: 1r/s, charge: {{ header: \"x used\" }} }}
  d: {{ key: ip, rate: 1r/s, charge: {{ sse_json: usage..total }} }}
  e: {{ key: ip, algorithm: sliding_window, limit: 5, window: 1m, charge: {{ header: x-used }} }}
  f: {{ key: ip, concurrency: 5, charge: {{ header: x-used }} }}
  g: {{ key: ip, rate: 1r/s, charge: {{ header: x-used, default: 5000000000 }} }}
  h: {{ key: ip, rate: 1r/s, charge: {{ headr: x-used }} }}
  i: {{ key: ip, rate: 1r/s, charge: {{ sse_json: {{ usage.prompt_tokens: 0, usage..x: 4 }} }} }}
  j: {{ key: ip, rate: 1r/s, charge: {{ trailer: {{}} }} }}
  ok: {{ key: ip, on_missing_key: skip, algorithm: token_bucket, capacity: 100, refill: 100r/h, charge: {{ sse_json: usage.total_tokens, default: 50, instead_of_cost: true }} }}
"
    );
    let (ok, stderr) = check(&yaml);
    assert!(!ok);
    let expected = [
        "FILE:3:37: limits.a.charge: give one place the response reports its cost in: `header`, `trailer`, `sse_json` or `json`",
        "FILE:4:37: limits.b.charge: give one place",
        "FILE:5:47: limits.c.charge.header: invalid field name \"x used\"",
        "FILE:6:49: limits.d.charge.sse_json: \"usage..total\": a JSON path of names separated by dots, e.g. usage.total_tokens",
        "FILE:7:74: limits.e.charge: applies to rate, gcra, token_bucket, interval and fixed_window limits: a sliding window",
        "FILE:8:41: limits.f.charge: applies to rate, gcra, token_bucket, interval and fixed_window limits: a concurrency limit",
        "FILE:9:64: limits.g.charge.default: at most 4294967296 units",
        "FILE:10:39: limits.h.charge.headr: unknown field `headr`; did you mean `header`?",
        "FILE:11:72: limits.i.charge.sse_json.usage.prompt_tokens: a weight is a whole number from 1 to 4294967296",
        "FILE:11:85: limits.i.charge.sse_json.usage..x: \"usage..x\": a JSON path of names separated by dots",
        "FILE:12:48: limits.j.charge.trailer: name at least one place, each with its weight",
    ];
    assert_reported(&stderr, &expected);
    assert!(!stderr.contains("limits.ok"), "{stderr}");
}

/// `money:` and `charge.prices`: a budget is a calendar window spent by charges, its
/// amounts have at most six decimals, a price table prices every place of the reading
/// in every row and has a `*` row; amounts with decimals are money only.
#[test]
fn money_budgets_and_prices_are_checked_with_their_positions() {
    let month = "algorithm: fixed_window, window: { calendar: month }";
    let yaml = format!(
        "{BASE}  a: {{ key: ip, algorithm: fixed_window, window: 1m, limit: 2.5 }}
  b: {{ key: ip, rate: 1r/s, money: USD, charge: {{ header: x-cost }} }}
  c: {{ key: ip, {month}, limit: 5, money: USD }}
  d: {{ key: ip, rate: 1r/s, charge: {{ sse_json: [a, b], prices: {{ by: \"json:model\", table: {{}} }} }} }}
  e: {{ key: ip, {month}, limit: 1, money: USD, charge: {{ sse_json: [a, b], prices: {{ by: \"json:model\", table: {{ m1: {{ a: 1, c: 2 }}, m2: {{ a: 0.0000001, b: 1 }} }} }} }} }}
  f: {{ key: ip, {month}, limit: 20000000, money: USD, charge: {{ header: x-cost }} }}
  g: {{ key: ip, {month}, limit: 1, money: \"US D\", charge: {{ header: x-cost }} }}
  h: {{ key: ip, {month}, limit: 1, money: USD, charge: {{ sse_json: {{ a: 2 }}, prices: {{ by: \"jsn:model\", table: {{ \"*\": {{ a: 1 }} }} }} }} }}
  ok: {{ key: ip, on_missing_key: skip, {month}, limit: 50.00, money: USD, charge: {{ json: [usage.prompt_tokens, usage.completion_tokens], default: 0.01, prices: {{ by: \"json:model\", per: 1000, table: {{ m: {{ usage.prompt_tokens: 0.0025, usage.completion_tokens: 0.01 }}, \"*\": {{ usage.prompt_tokens: 0.005, usage.completion_tokens: 0.015 }} }} }} }} }}
"
    );
    let (ok, stderr) = check(&yaml);
    assert!(!ok);
    let expected = [
        "FILE:3:61: limits.a.limit: a whole number (an amount with decimals is money: give the limit `money:`)",
        "FILE:4:36: limits.b.money: a money budget is a fixed window of the calendar",
        "FILE:5:88: limits.c.money: a money budget is spent by what responses cost: give `charge`",
        "FILE:6:65: limits.d.charge.prices: prices are money: give the limit the currency it counts",
        "FILE:7:173: limits.e.charge.prices.table.m1.c: not a place the charge reads (a, b)",
        "FILE:7:162: limits.e.charge.prices.table.m1: give the price of b",
        "FILE:7:187: limits.e.charge.prices.table.m2.a: an amount of money: not negative, at most six decimals",
        "FILE:7:156: limits.e.charge.prices.table: give a row \"*\"",
        "FILE:8:78: limits.f.limit: must be more than 0 and at most 17592186.044415",
        "FILE:9:88: limits.g.money: the currency's name: letters and digits, at most 16",
        "FILE:10:131: limits.h.charge.prices: the table prices each place: name the places without weights",
        "FILE:10:137: limits.h.charge.prices.by: unknown key kind \"jsn\"",
    ];
    assert_reported(&stderr, &expected);
    assert!(!stderr.contains("limits.ok"), "{stderr}");
}

/// `upstream_hold`: by one of the route's limits or `route`, a positive `max` and
/// `max_keys`, on a route that forwards.
#[test]
fn upstream_hold_fields_are_checked_with_their_positions() {
    let yaml = "listen: 127.0.0.1:0
upstreams:
  b: { servers: [\"127.0.0.1:9\"] }
limits:
  a: { key: ip, rate: 1r/s }
routes:
  - { match: { path: /1 }, limits: [a], upstream: b, upstream_hold: { by: other } }
  - { match: { path: /2 }, limits: [a], upstream: b, upstream_hold: { max: 0s, max_keys: 0 } }
  - { match: { path: /3 }, limits: [a], respond: { status: 200 }, upstream_hold: true }
  - { match: { path: /4 }, limits: [a], upstream: b, upstream_hold: { by: route, hold: 1s } }
  - { match: { path: /5 }, limits: [a], upstream: b, upstream_hold: { by: a, max: 10m, max_keys: 50 } }
";
    let (ok, stderr) = check(yaml);
    assert!(!ok);
    let expected = [
        "FILE:7:75: routes[0].upstream_hold.by: \"other\" is not one of the route's limits (a); or give `route`",
        "FILE:8:76: routes[1].upstream_hold.max: must be longer than zero",
        "FILE:8:90: routes[1].upstream_hold.max_keys: must be a positive integer",
        "FILE:9:82: routes[2].upstream_hold: applies to a route that forwards",
        "FILE:10:82: routes[3].upstream_hold.hold: unknown field `hold`",
    ];
    assert_reported(&stderr, &expected);
    assert!(!stderr.contains("routes[4]"), "{stderr}");
}

/// Two settings that do what nobody means are said by `check`, at their field: a hold
/// on a route without limits holds every client of the route, and a charge read from a
/// trailer or the last event without `default` charges nothing to a client that hangs
/// up first. Given outright (`by: route`, a `default`), neither is said.
#[test]
fn a_hold_of_the_whole_route_and_a_charge_that_a_hang_up_escapes_are_warnings() {
    let yaml = "listen: 127.0.0.1:0
upstreams:
  b: { servers: [\"127.0.0.1:9\"] }
limits:
  t: { key: ip, rate: 1r/s, charge: { trailer: x-cost } }
  s: { key: ip, rate: 1r/s, charge: { sse_json: usage.total_tokens } }
  h: { key: ip, rate: 1r/s, charge: { header: x-cost } }
  d: { key: ip, rate: 1r/s, charge: { trailer: x-cost, default: 10 } }
routes:
  - { match: { path: /1 }, upstream: b, upstream_hold: true }
  - { match: { path: /2 }, upstream: b, upstream_hold: { max: 5m } }
  - { match: { path: /3 }, upstream: b, upstream_hold: { by: route } }
  - { match: { path: /4 }, upstream: b, upstream_hold: true, limits: [t, s, h, d] }
";
    let (ok, stderr) = check(yaml);
    assert!(ok, "{stderr}");
    let expected = [
        "warning: FILE:10:56: routes[0].upstream_hold: the route has no limit, so this holds the whole route: one \
         client's upstream refusal (429 or 503 with Retry-After) holds every client of the route, for up to 1h; name \
         the limit whose key to hold (`by: LIMIT`), or write `by: route` to mean it",
        "routes[1].upstream_hold: the route has no limit, so this holds the whole route: one client's upstream refusal \
         (429 or 503 with Retry-After) holds every client of the route, for up to 5m;",
        "limits.t.charge.default: not given: a client that hangs up before the response's trailer reports the cost is \
         charged nothing (default 0); set `default` to what a response costs when it does not say",
        "limits.s.charge.default: not given: a client that hangs up before the response's last event reports",
    ];
    assert_reported(&stderr, &expected);
    assert_eq!(stderr.lines().count(), 4, "{stderr}");
}

/// `match.json`: fields named by dotted paths, each with a value; a route matching on the
/// body shadows no later route.
#[test]
fn body_matches_are_checked_with_their_positions() {
    let yaml = "listen: 127.0.0.1:0
upstreams: { b: { servers: [\"127.0.0.1:9\"] } }
routes:
  - { match: { path: /a, json: {} }, upstream: b }
  - { match: { path: /a, json: { \"a..b\": x, c: [] } }, upstream: b }
  - { match: { path: /b, json: { model: \"gpt-*\" } }, upstream: b }
  - { match: { path: /b }, upstream: b }
";
    let (ok, stderr) = check(yaml);
    assert!(!ok);
    let expected = [
        "FILE:4:32: routes[0].match.json: name at least one field and its values",
        "FILE:5:42: routes[1].match.json.a..b: \"a..b\": a JSON path of names separated by dots",
        "FILE:5:48: routes[1].match.json.c: give at least one value",
    ];
    assert_reported(&stderr, &expected);
    assert!(!stderr.contains("can never match"), "{stderr}");
}
