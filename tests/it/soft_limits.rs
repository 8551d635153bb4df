//! Soft limits (`action: annotate`, `annotate_from`): what is over a limit, or close to
//! it, is forwarded with `RateLimit-Exceeded` and the limit's `RateLimit` item for the
//! upstream to act on, counted `annotated`; a client can neither forge nor hide them.

use crate::common::*;
use crate::redis::Redis;

/// The value of field `name` the backend saw on each request, in order.
fn seen(backend: &Backend, name: &str) -> Vec<Option<String>> {
    backend.hits().iter().map(|h| h.headers.get(name).map(|v| v.to_str().unwrap().to_owned())).collect()
}

/// The `RateLimit` item `"NAME";r=R;t=T` as (name, r, t).
fn item(value: &str) -> (String, u64, u64) {
    let (name, rest) = value.split_once(";r=").unwrap_or_else(|| panic!("{value}"));
    let (r, t) = rest.split_once(";t=").unwrap_or_else(|| panic!("{value}"));
    (name.trim_matches('"').to_owned(), r.parse().unwrap(), t.parse().unwrap())
}

/// Over a limit with `action: annotate`, a request is forwarded, not refused: the
/// upstream sees `RateLimit-Exceeded: NAME` and the limit's `RateLimit` item; it spends
/// no quota; `/metrics`, the access log and `/config` say so; a limit that refuses still
/// refuses beside it, and a soft limit's annotation is not sent when another refused.
#[tokio::test]
async fn a_soft_limit_forwards_what_is_over_it_annotated_and_counts_it() {
    let backend = Backend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let sg = Conf::new()
        .admin()
        .upstream(&backend)
        .set(&format!("access_log: {{ path: \"{}\" }}", log.display()))
        .limit("quota", "key: ip, rate: 1r/m, burst: 1, nodelay: true, action: annotate")
        .route("name: soft, match: { path: /soft }, upstream: b, limits: [quota]")
        .start();
    let statuses: Vec<u16> = futures_statuses(sg.addr, "/soft", 4).await;
    assert_eq!(statuses, [200; 4], "nothing refused");
    let exceeded = seen(&backend, "ratelimit-exceeded");
    assert_eq!(exceeded, [None, None, Some("quota".to_owned()), Some("quota".to_owned())]);
    let items = seen(&backend, "ratelimit");
    assert_eq!(items[..2], [None, None]);
    for value in items[2..].iter().flatten() {
        let (name, r, t) = item(value);
        // Two admitted: the key's full burst is back two minutes after them.
        assert_eq!((name.as_str(), r), ("quota", 0), "{value}");
        assert!((119..=120).contains(&t), "{value}");
    }
    let m = Metrics::of(&sg).await;
    assert_eq!(m.value("sluicegate_requests_total{route=\"soft\",outcome=\"annotated\"}"), 2.0);
    assert_eq!(m.value("sluicegate_requests_total{route=\"soft\",outcome=\"passed\"}"), 2.0);
    wait_until("the access log's four lines", REPLY_WITHIN, async || {
        std::fs::read_to_string(&log).is_ok_and(|text| text.lines().count() == 4)
    })
    .await;
    let text = std::fs::read_to_string(&log).unwrap();
    let outcomes: Vec<String> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["outcome"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(outcomes, ["passed", "passed", "annotated", "annotated"]);
    let config: serde_json::Value = serde_json::from_slice(&get(sg.admin_addr(), "/config", &[]).await.body).unwrap();
    let quota = config["limits"].as_array().unwrap().iter().find(|l| l["name"] == "quota").unwrap().clone();
    assert_eq!(quota["action"], "annotate");
}

/// The ladder in one limit: `annotate_from: 80%` annotates the requests that leave the
/// key's used share of the capacity at or above 80 % (the 8th to 10th of burst 9 + 1),
/// with the true `r`; over the limit, `action: refuse` (the default) refuses, and those
/// refused reach no upstream. A limit that only delays (another route) annotates
/// nothing.
#[tokio::test]
async fn annotate_from_annotates_the_top_of_the_limit_then_it_refuses() {
    let backend = Backend::start().await;
    let sg = Conf::new()
        .admin()
        .upstream(&backend)
        .limit("per_ip", "key: ip, rate: 1r/m, burst: 9, nodelay: true, annotate_from: 80%")
        .route("name: ladder, upstream: b, limits: [per_ip]")
        .start();
    let statuses = futures_statuses(sg.addr, "/", 11).await;
    assert_eq!(statuses[..10], [200; 10]);
    assert_eq!(statuses[10], 429, "over the limit: refused");
    let exceeded = seen(&backend, "ratelimit-exceeded");
    assert_eq!(exceeded.len(), 10, "the refused request reached no upstream");
    assert!(exceeded[..7].iter().all(Option::is_none), "{exceeded:?}");
    assert!(exceeded[7..].iter().all(|e| e.as_deref() == Some("per_ip")), "{exceeded:?}");
    let left: Vec<u64> = seen(&backend, "ratelimit")[7..].iter().map(|v| item(v.as_deref().unwrap()).1).collect();
    assert_eq!(left, [2, 1, 0], "the true units left");
    let m = Metrics::of(&sg).await;
    let requests =
        |outcome: &str| m.value(&format!("sluicegate_requests_total{{route=\"ladder\",outcome=\"{outcome}\"}}"));
    assert_eq!((requests("passed"), requests("annotated"), requests("rejected")), (7.0, 3.0, 1.0));
}

/// Where a limit annotates, the client's own `RateLimit-Exceeded` and `RateLimit` never
/// reach the upstream: a request under the limit arrives with none (a forged one is
/// dropped), one over it with the limit's own (a client's cannot come first and hide it).
#[tokio::test]
async fn a_client_can_neither_forge_nor_hide_an_annotation() {
    let backend = Backend::start().await;
    let sg = Conf::new()
        .upstream(&backend)
        .limit("quota", "key: ip, rate: 1r/m, burst: 0, action: annotate")
        .forwarding("quota")
        .start();
    let forged = [("ratelimit-exceeded", "nothing"), ("ratelimit", "\"quota\";r=99;t=0"), ("RateLimit-Exceeded", "x")];
    for _ in 0..2 {
        assert_eq!(get(sg.addr, "/", &forged).await.status, 200);
    }
    let hits = backend.hits();
    let all = |h: &Hit, name: &str| -> Vec<String> {
        h.headers.get_all(name).iter().map(|v| v.to_str().unwrap().to_owned()).collect()
    };
    assert!(all(&hits[0], "ratelimit-exceeded").is_empty() && all(&hits[0], "ratelimit").is_empty(), "{hits:?}");
    assert_eq!(all(&hits[1], "ratelimit-exceeded"), ["quota"]);
    let ratelimit = all(&hits[1], "ratelimit");
    assert_eq!(ratelimit.len(), 1, "{ratelimit:?}");
    assert_eq!(item(&ratelimit[0]).0, "quota");
}

/// `annotation_field` names the field the limits that annotate a request are listed in,
/// for a backend that reads another than `RateLimit-Exceeded`; a client's own is
/// dropped all the same, and `RateLimit-Exceeded` is then the client's to send.
#[tokio::test]
async fn the_annotation_goes_in_the_field_the_configuration_names() {
    let backend = Backend::start().await;
    let sg = Conf::new()
        .upstream(&backend)
        .set("annotation_field: x-quota-exceeded")
        .limit("quota", "key: ip, rate: 1r/m, burst: 0, action: annotate")
        .forwarding("quota")
        .start();
    let forged = [("x-quota-exceeded", "nothing"), ("ratelimit-exceeded", "mine")];
    for _ in 0..2 {
        assert_eq!(get(sg.addr, "/", &forged).await.status, 200);
    }
    assert_eq!(seen(&backend, "x-quota-exceeded"), [None, Some("quota".to_owned())]);
    assert_eq!(seen(&backend, "ratelimit-exceeded"), [Some("mine".to_owned()), Some("mine".to_owned())]);
    assert_eq!(item(&seen(&backend, "ratelimit")[1].clone().unwrap()).0, "quota");
    // Not a field the proxy or HTTP already gives a meaning.
    for taken in ["ratelimit", "host", "x-forwarded-for", "content-length", "not a name"] {
        let yaml = Conf::new()
            .set(&format!("annotation_field: \"{taken}\""))
            .limit("quota", "key: ip, rate: 1r/m, action: annotate")
            .answering("quota")
            .yaml();
        let refused = Sluicegate::try_start(&yaml).err().unwrap_or_else(|| panic!("{taken} taken"));
        assert!(refused.contains("annotation_field"), "{taken}: {refused}");
    }
}

/// HTTP/2 alike: a request that came over h2c and went to an HTTP/2 upstream carries the
/// annotation as one that came over HTTP/1.1 does.
#[tokio::test]
async fn an_http2_request_is_annotated_as_an_http1_one() {
    let backend = Backend::start_h2().await;
    let sg = Conf::new()
        .set(&format!("upstreams:\n  b: {{ servers: [\"{}\"], http2: true }}", backend.addr))
        .limit("quota", "key: ip, rate: 1r/m, burst: 0, action: annotate")
        .forwarding("quota")
        .start();
    assert_eq!(get_h2(sg.addr, "/").await.status, 200);
    assert_eq!(get_h2(sg.addr, "/").await.status, 200);
    assert_eq!(get(sg.addr, "/", &[]).await.status, 200);
    let hits = backend.hits();
    assert!(hits.iter().all(|h| h.version == http::Version::HTTP_2));
    assert_eq!(seen(&backend, "ratelimit-exceeded"), [None, Some("quota".to_owned()), Some("quota".to_owned())]);
    let items = seen(&backend, "ratelimit");
    assert_eq!(item(items[1].as_deref().unwrap()).0, "quota");
    assert_eq!(items[1].as_deref().map(item).map(|i| i.1), Some(0));
}

/// A global (Redis) soft limit behaves as a local one: over it the request is forwarded
/// annotated and Redis stores nothing for it (no quota spent), and `annotate_from` reads
/// Redis's standing; a global limit that refuses beside it still refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_soft_limit_annotates_as_a_local_one() {
    let redis = Redis::start();
    let backend = Backend::start().await;
    let sg = Conf::new()
        .admin()
        .upstream(&backend)
        .redis(&redis.url(), "timeout: 1s")
        .limit("soft", "key: ip, rate: 1r/m, burst: 1, nodelay: true, scope: global, action: annotate")
        .limit("ladder", "key: ip, rate: 1r/m, burst: 4, nodelay: true, scope: global, annotate_from: 60%")
        .route("name: soft, match: { path: /soft }, upstream: b, limits: [soft]")
        .route("name: ladder, match: { path: /ladder }, upstream: b, limits: [ladder]")
        .start();
    assert_eq!(futures_statuses(sg.addr, "/soft", 4).await, [200; 4]);
    let exceeded = seen(&backend, "ratelimit-exceeded");
    assert_eq!(exceeded, [None, None, Some("soft".to_owned()), Some("soft".to_owned())]);
    for value in seen(&backend, "ratelimit")[2..].iter().flatten() {
        let (name, r, t) = item(value);
        assert_eq!((name.as_str(), r), ("soft", 0), "{value}");
        assert!((119..=120).contains(&t), "{value}: the two admitted only were stored");
    }
    let statuses = futures_statuses(sg.addr, "/ladder", 6).await;
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    let exceeded = seen(&backend, "ratelimit-exceeded");
    let ladder: Vec<Option<&str>> = exceeded[4..].iter().map(Option::as_deref).collect();
    assert_eq!(ladder, [None, None, Some("ladder"), Some("ladder"), Some("ladder")]);
    let m = Metrics::of(&sg).await;
    assert_eq!(m.value("sluicegate_requests_total{route=\"soft\",outcome=\"annotated\"}"), 2.0);
    assert_eq!(m.value("sluicegate_requests_total{route=\"ladder\",outcome=\"annotated\"}"), 3.0);
    assert_eq!(m.value("sluicegate_requests_total{route=\"ladder\",outcome=\"rejected\"}"), 1.0);
}

/// `explain` says which limit annotates and what the upstream is told, in its JSON and
/// in plain words.
#[test]
fn explain_says_a_request_is_annotated() {
    let (_dir, config) = config_file(
        "listen: 127.0.0.1:0\nlimits:\n  quota: { key: ip, rate: 1r/m, burst: 1, nodelay: true, action: annotate }\nroutes:\n  - { limits: [quota], respond: { status: 200 } }\n",
    );
    let run = |json: bool| {
        let mut command = binary();
        command.arg("explain").arg("-c").arg(&config).args(["--after", "2"]);
        if json {
            command.arg("--json");
        }
        let output = command.arg("http://example.com/").output().unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let explained: serde_json::Value = serde_json::from_str(&run(true)).unwrap();
    assert_eq!(explained["answer"]["outcome"], "annotated");
    assert_eq!(
        (explained["limits"][0]["outcome"].as_str(), explained["limits"][0]["annotated"].as_bool()),
        (Some("annotated"), Some(true))
    );
    let upstream = &explained["answer"]["upstream_headers"];
    assert_eq!(upstream[0], serde_json::json!(["ratelimit-exceeded", "quota"]));
    assert_eq!(upstream[1][0], "ratelimit");
    let text = run(false);
    assert!(text.contains("the request is annotated"), "{text}");
    assert!(text.contains("ratelimit-exceeded: quota"), "{text}");
}
