//! A candidate configuration live beside the running one (`sluicegate reload
//! --candidate`, `/candidate`): it decides every request again with its own state and
//! acts on none; what it changes is in `GET /candidate` (in `simulate --compare`'s
//! shape), the metrics, the access log and `explain`; `sluicegate promote` makes it the
//! running configuration with the state carried, refused if a file changed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::*;
use crate::logs::access_lines;
use crate::redis::Redis;

/// `METHOD path` on the admin listener `admin`, without a body.
async fn admin_call(admin: std::net::SocketAddr, method: http::Method, path: &str) -> Reply {
    let req =
        http::Request::builder().method(method).uri(path).header("host", "localhost").header("content-length", "0");
    request(admin, req.body(String::new()).unwrap()).await
}

/// A configuration of one limit per `x-key`, `limit` an hour, answered by the proxy.
fn per_key(limit: u64, extra: &str) -> String {
    Conf::new()
        .admin()
        .set(extra)
        .limit(
            "per_key",
            &format!(
                "key: \"header:x-key\", on_missing_key: refuse, algorithm: fixed_window, limit: {limit}, window: 1h"
            ),
        )
        .route("name: api, limits: [per_key], respond: { status: 200 }")
        .yaml()
}

/// Writes `yaml` as `name` beside the instance's configuration, its admin listener
/// where the instance's is (so that `sluicegate -c` finds it).
fn beside(sg: &Sluicegate, name: &str, yaml: &str) -> PathBuf {
    let path = sg.config.parent().unwrap().join(name);
    std::fs::write(&path, pinned(sg, yaml)).unwrap();
    path
}

/// `yaml` with the admin listener of `sg` in place of port 0.
fn pinned(sg: &Sluicegate, yaml: &str) -> String {
    let admin = format!("admin: {{ listen: \"{}\" }}", sg.admin_addr());
    yaml.replace("admin: { listen: 127.0.0.1:0 }", &admin)
}

/// Starts the proxy with `yaml`, its file then naming its admin listener's address.
fn start(yaml: &str) -> Sluicegate {
    let sg = Sluicegate::start(yaml);
    std::fs::write(&sg.config, pinned(&sg, yaml)).unwrap();
    sg
}

/// `sluicegate ARGS -c CONFIG`: its exit status, stdout and stderr.
fn cli(args: &[&str], config: &Path) -> (bool, String, String) {
    let out = binary().args(args).arg("-c").arg(config).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// The statuses of `n` requests of key `key`, one after another.
async fn statuses(addr: std::net::SocketAddr, key: &str, n: usize) -> Vec<u16> {
    let mut statuses = Vec::new();
    for _ in 0..n {
        statuses.push(get(addr, "/", &[("x-key", key)]).await.status);
    }
    statuses
}

#[tokio::test]
async fn a_candidate_that_lowers_a_limit_says_what_it_would_refuse_refuses_nothing_and_promotes_with_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let access = format!("access_log: {{ path: \"{}\", format: json }}", log.display());
    let sg = start(&per_key(10, &access));
    let admin = sg.admin_addr();
    let candidate = beside(&sg, "candidate.yaml", &per_key(5, &access));

    let (ok, out, err) = cli(&["reload", "--candidate", candidate.to_str().unwrap()], &sg.config);
    assert!(ok, "{out}{err}");
    assert!(out.contains("live beside"), "{out}");
    // (Its line is read from the process's stderr as it comes: waited for, not raced.)
    sg.wait_for_log("the candidate's log line", |log| log.contains("candidate live"));

    // 8 requests of each of two keys: the running limit (10) admits them all; the
    // candidate's (5) would refuse the last 3 of each.
    for key in ["a", "b"] {
        assert_eq!(statuses(sg.addr, key, 8).await, [200; 8], "the candidate refuses nothing");
    }
    let report: serde_json::Value =
        serde_json::from_str(&admin_call(admin, http::Method::GET, "/candidate").await.text()).unwrap();
    assert_eq!(report["requests"], 16, "{report}");
    assert_eq!(report["changes"]["newly_refused"], 6, "{report}");
    assert_eq!(report["changes"]["newly_admitted"], 0);
    let keys = report["changes"]["newly_refused_keys"].as_array().unwrap();
    assert_eq!(keys.len(), 2, "{report}");
    for k in keys {
        assert_eq!((k["limit"].as_str(), k["requests"].as_u64()), (Some("per_key"), Some(3)), "{report}");
    }
    let limits = &report["changes"]["limits"][0];
    assert_eq!(
        (limits["old"]["rejected"].as_u64(), limits["new"]["rejected"].as_u64()),
        (Some(0), Some(6)),
        "{report}"
    );
    let m = Metrics::of(&sg).await;
    assert_eq!(m.value("sluicegate_candidate_decisions_total{limit=\"per_key\",change=\"refused\"}"), 6.0, "{}", m.0);
    assert_eq!(m.value("sluicegate_candidate_decisions_total{limit=\"per_key\",change=\"same\"}"), 10.0);
    assert_eq!(m.value("sluicegate_requests_total{route=\"api\",outcome=\"passed\"}"), 16.0);
    // Each line says what the candidate would have done.
    let lines = access_lines(&log, 16);
    let said: Vec<String> = lines[..8]
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["candidate"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(said, ["same", "same", "same", "same", "same", "refused", "refused", "refused"]);
    // `explain` shows both decisions: the running one passes the next request, the
    // candidate's refuses it.
    let asked = serde_json::json!({"method": "GET", "url": "http://localhost/", "headers": {"x-key": "a"}});
    let req = http::Request::post("/explain").header("host", "localhost").body(asked.to_string()).unwrap();
    let explained: serde_json::Value = serde_json::from_str(&request(admin, req).await.text()).unwrap();
    assert_eq!(explained["answer"]["outcome"], "passed", "{explained}");
    assert_eq!(explained["candidate"]["answer"]["status"], 429, "{explained}");
    assert_eq!(explained["candidate"]["state"], "candidate");
    let (ok, text, _) = cli(&["candidate"], &sg.config);
    assert!(ok && text.contains("6 requests newly refused, 0 newly admitted"), "{text}");

    // Promoted: the limit keeps its state (key a has made 8 requests in this window, more
    // than 5) and its new count applies from now on.
    let (ok, out, err) = cli(&["promote"], &sg.config);
    assert!(ok, "{out}{err}");
    assert_eq!(statuses(sg.addr, "a", 1).await, [429], "the state is carried");
    assert_eq!(statuses(sg.addr, "c", 6).await, [200, 200, 200, 200, 200, 429], "the candidate's limit");
    assert_eq!(admin_call(admin, http::Method::GET, "/candidate").await.status, 404, "no candidate after");
    // Its file is the configuration from now on: reloading the old one is refused.
    let (ok, _, err) = cli(&["reload"], &sg.config);
    assert!(!ok && err.contains("candidate.yaml"), "{err}");
    let (ok, out, err) = cli(&["reload"], &candidate);
    assert!(ok, "{out}{err}");
}

#[tokio::test]
async fn a_candidate_is_read_only_beside_the_configuration_valid_and_promoted_only_as_loaded() {
    let sg = start(&per_key(10, ""));
    let admin = sg.admin_addr();
    let call = async |method, path: String| admin_call(admin, method, &path).await;
    let load = |file: &Path| format!("/candidate?file={}", file.display());

    // Elsewhere than the configuration's directory: refused.
    let elsewhere = tempfile::tempdir().unwrap();
    let outside = elsewhere.path().join("candidate.yaml");
    std::fs::write(&outside, per_key(5, "")).unwrap();
    let reply = call(http::Method::POST, load(&outside)).await;
    assert_eq!(reply.status, 403, "{}", reply.text());
    // No file named, the configuration's own file, a file that is no YAML, and a link
    // beside the configuration to a file elsewhere: refused, nothing read.
    assert_eq!(call(http::Method::POST, "/candidate".into()).await.status, 400);
    assert_eq!(call(http::Method::POST, load(&sg.config)).await.status, 409);
    let text = beside(&sg, "candidate.txt", &per_key(5, ""));
    assert_eq!(call(http::Method::POST, load(&text)).await.status, 403);
    let link = sg.config.parent().unwrap().join("linked.yaml");
    std::os::unix::fs::symlink(&outside, &link).unwrap();
    let reply = call(http::Method::POST, load(&link)).await;
    assert_eq!(reply.status, 403, "a link is followed before the directory is checked: {}", reply.text());
    assert_eq!(call(http::Method::GET, "/candidate".into()).await.status, 404, "none loaded");
    // Invalid: the error at its position.
    let broken = beside(&sg, "broken.yaml", &per_key(5, "").replace("limit: 5", "limit: five"));
    let reply = call(http::Method::POST, load(&broken)).await;
    assert_eq!(reply.status, 422, "{}", reply.text());
    assert!(reply.text().contains("broken.yaml:") && reply.text().contains("limit"), "{}", reply.text());
    let (ok, _, err) = cli(&["reload", "--candidate", broken.to_str().unwrap()], &sg.config);
    assert!(!ok && err.contains("the candidate is invalid"), "{err}");

    // A candidate whose file changed since it was loaded is not promoted, nor one whose
    // instance's file changed.
    let candidate = beside(&sg, "candidate.yaml", &per_key(5, ""));
    assert_eq!(call(http::Method::POST, load(&candidate)).await.status, 200);
    std::fs::write(&candidate, pinned(&sg, &per_key(6, ""))).unwrap();
    let reply = call(http::Method::POST, "/candidate/promote".into()).await;
    assert_eq!(reply.status, 409, "{}", reply.text());
    assert!(reply.text().contains("candidate's file") && reply.text().contains("changed on disk"), "{}", reply.text());
    assert_eq!(call(http::Method::POST, load(&candidate)).await.status, 200, "loaded again");
    std::fs::write(&sg.config, pinned(&sg, &per_key(11, ""))).unwrap();
    let reply = call(http::Method::POST, "/candidate/promote".into()).await;
    assert_eq!(reply.status, 409, "{}", reply.text());
    assert!(reply.text().contains("instance's configuration file"), "{}", reply.text());
    assert_eq!(statuses(sg.addr, "a", 10).await, [200; 10], "nothing promoted: 10 pass, the candidate's 5 would not");

    // Dropped: it says what it changed, one last time.
    let reply = call(http::Method::DELETE, "/candidate".into()).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(reply.text().contains("newly refused"), "{}", reply.text());
    assert_eq!(call(http::Method::DELETE, "/candidate".into()).await.status, 404);
    let m = Metrics::of(&sg).await;
    assert_eq!(m.get("sluicegate_candidate_decisions_total{limit=\"per_key\",change=\"same\"}"), None, "{}", m.0);
}

#[tokio::test]
async fn a_candidate_that_drops_a_limit_with_state_is_warned_of_and_one_that_reroutes_says_where() {
    let yaml = Conf::new()
        .admin()
        .limit("per_ip", "key: ip, rate: 100r/s, burst: 10")
        .route("name: api, match: { path_prefix: /api }, limits: [per_ip], respond: { status: 200 }")
        .route("name: rest, respond: { status: 200 }")
        .yaml();
    let sg = start(&yaml);
    assert_eq!(get(sg.addr, "/api", &[]).await.status, 200);
    let candidate = Conf::new()
        .admin()
        .route("name: api_v2, match: { path_prefix: /api, methods: [POST] }, respond: { status: 200 }")
        .route("name: rest, respond: { status: 200 }")
        .yaml();
    let candidate = beside(&sg, "candidate.yaml", &candidate);
    let (ok, out, err) = cli(&["reload", "--candidate", candidate.to_str().unwrap()], &sg.config);
    assert!(ok, "{out}{err}");
    assert!(out.contains("warning: limit \"per_ip\" holds 1 keys now; the candidate drops it"), "{out}");
    assert_eq!(get(sg.addr, "/api", &[]).await.status, 200);
    let report: serde_json::Value =
        serde_json::from_str(&admin_call(sg.admin_addr(), http::Method::GET, "/candidate").await.text()).unwrap();
    assert_eq!(report["rerouted"][0]["route"], "api", "{report}");
    assert_eq!(report["rerouted"][0]["candidate_route"], "rest", "{report}");
    let m = Metrics::of(&sg).await;
    assert_eq!(m.value("sluicegate_candidate_rerouted_total{route=\"api\",candidate_route=\"rest\"}"), 1.0, "{}", m.0);
}

#[tokio::test]
async fn under_steady_traffic_a_lower_candidate_reports_about_its_share_newly_refused_and_then_enforces_it() {
    // 10 a second per key running, 5 in the candidate; 8 a second of one key, evenly.
    let fields =
        |n| format!("key: \"header:x-key\", on_missing_key: refuse, algorithm: fixed_window, limit: {n}, window: 1s");
    let conf = |n| Conf::new().admin().limit("per_key", &fields(n)).answering("per_key").yaml();
    let sg = start(&conf(10));
    let candidate = beside(&sg, "candidate.yaml", &conf(5));
    assert!(cli(&["reload", "--candidate", candidate.to_str().unwrap()], &sg.config).0);
    let paced = async |n: usize| {
        let mut tick = tokio::time::interval(Duration::from_millis(125));
        let mut refused = 0;
        for _ in 0..n {
            tick.tick().await;
            refused += usize::from(get(sg.addr, "/", &[("x-key", "k")]).await.status == 429);
        }
        refused
    };
    assert_eq!(paced(24).await, 0, "3 s at 8/s: the running limit refuses nothing");
    let report: serde_json::Value =
        serde_json::from_str(&admin_call(sg.admin_addr(), http::Method::GET, "/candidate").await.text()).unwrap();
    // Each whole second's window refuses 3 of its 8; the two partial ones at the ends
    // up to as many between them (6 to 9 in all), a request's jitter aside.
    let newly = report["changes"]["newly_refused"].as_u64().unwrap();
    assert!((5..=10).contains(&newly), "{newly} newly refused of 24: {report}");
    assert!(cli(&["promote"], &sg.config).0);
    // 2 s at 8/s, 5 a second admitted: the whole second between refuses 3 of its 8 (the
    // running limit, 10, none), the window the promotion fell in carries what it counted
    // before, and may refuse all of its requests: 3 to 11.
    let refused = paced(16).await;
    assert!((3..=11).contains(&refused), "{refused} refused of 16");
}

#[tokio::test]
async fn a_global_candidate_keeps_its_state_under_its_own_redis_keys() {
    let redis = Redis::start();
    let fields = |n| {
        format!(
            "key: \"header:x-key\", on_missing_key: refuse, algorithm: fixed_window, limit: {n}, window: 1h, scope: global"
        )
    };
    let conf = |n| {
        Conf::new()
            .admin()
            .redis(&redis.url(), "key_prefix: \"sg:\"")
            .limit("per_key", &fields(n))
            .answering("per_key")
            .yaml()
    };
    let sg = start(&conf(10));
    let candidate = beside(&sg, "candidate.yaml", &conf(5));
    assert!(cli(&["reload", "--candidate", candidate.to_str().unwrap()], &sg.config).0);
    assert_eq!(statuses(sg.addr, "a", 8).await, [200; 8]);
    let keys = redis.command(&["KEYS", "sg:*"]);
    let (candidate_keys, enforced_keys): (Vec<&str>, Vec<&str>) =
        keys.lines().filter(|k| !k.is_empty()).partition(|k| k.starts_with("sg:candidate:"));
    assert!(!candidate_keys.is_empty() && !enforced_keys.is_empty(), "{keys}");
    // Each side counted what it admitted, in its own keys.
    // (A fixed window's state is "INDEX COUNT".)
    let count = |key: &&str| redis.command(&["GET", key]).split(' ').nth(1).and_then(|c| c.trim().parse().ok());
    let counted = |keys: &[&str]| keys.iter().map(|k| count(k).unwrap_or(0)).sum::<u64>();
    assert_eq!(counted(&enforced_keys), 8, "{keys}");
    assert_eq!(counted(&candidate_keys), 5, "{keys}");
    let report: serde_json::Value =
        serde_json::from_str(&admin_call(sg.admin_addr(), http::Method::GET, "/candidate").await.text()).unwrap();
    assert_eq!(report["changes"]["newly_refused"], 3, "{report}");
}
