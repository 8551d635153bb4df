//! One key, one name: the same request's key is written the same way by every surface
//! that shows one (log lines, the access log, `/bans`, the `/limits` lookup, the
//! dashboard, `simulate`'s report), in every process given the same `keys_secret`.

use std::time::Duration;

use serde_json::Value;

use crate::common::*;

fn yaml(access_log: &std::path::Path) -> String {
    format!(
        r#"listen: 127.0.0.1:0
admin: {{ listen: 127.0.0.1:0 }}
keys_secret: "0123456789abcdef-0123"
access_log: {{ format: json, path: "{}", keys: true }}
limits:
  per_key: {{ key: "header:x-api-key", on_missing_key: skip, rate: 1r/m, ban: 10m }}
routes:
  - {{ name: api, respond: {{ status: 200 }}, limits: [per_key] }}
"#,
        access_log.display()
    )
}

/// The `key` of the log's `message` line.
fn logged_key(log: &str, message: &str) -> String {
    let line = log.lines().find(|l| l.contains(message)).unwrap_or_else(|| panic!("no {message:?} in:\n{log}"));
    let json: Value = serde_json::from_str(line).unwrap();
    json["fields"]["key"].as_str().unwrap().to_owned()
}

async fn json(addr: std::net::SocketAddr, path: &str) -> Value {
    let reply = get(addr, path, &[]).await;
    assert_eq!(reply.status, 200, "{path}: {}", reply.text());
    serde_json::from_slice(&reply.body).unwrap()
}

async fn delete(addr: std::net::SocketAddr, path: &str) -> Reply {
    let req = http::Request::delete(path).header("host", "localhost").header("content-length", "0");
    request(addr, req.body(String::new()).unwrap()).await
}

#[tokio::test]
async fn a_key_has_one_name_in_logs_access_log_bans_lookup_dashboard_and_simulate() {
    let dir = tempfile::tempdir().unwrap();
    let access_log = dir.path().join("access.log");
    let sg = Sluicegate::start(&yaml(&access_log));
    let admin = sg.admin_addr();
    let key = [("x-api-key", "k-secret-1")];
    assert_eq!(get(sg.addr, "/", &key).await.status, 200);
    assert_eq!(get(sg.addr, "/", &key).await.status, 429);
    let log = sg
        .wait_for_log("the line \"request rejected, key banned\"", |log| log.contains("request rejected, key banned"));
    let name = logged_key(&log, "request rejected, key banned");
    let digest = name.strip_prefix("header:x-api-key=#").unwrap_or_else(|| panic!("{name}"));
    assert_eq!(digest.len(), 32, "{name}");
    assert!(!log.contains("k-secret-1"), "the credential in clear:\n{log}");

    // The access log records the part as the log line writes it.
    let lines = crate::logs::access_lines(&access_log, 2);
    let line: Value = serde_json::from_str(&lines[1]).unwrap();
    assert_eq!(format!("header:x-api-key={}", line["keys"]["header:x-api-key"].as_str().unwrap()), name);
    // /bans, and the lookup, which says what the next request gets: refused, for the
    // time the ban has left.
    let bans = json(admin, "/bans").await;
    assert_eq!(bans["per_key"][0]["key"], name.as_str(), "{bans}");
    let state = json(admin, "/limits/per_key?header:x-api-key=k-secret-1").await;
    assert_eq!(state["key"], name.as_str());
    let left = state["ban_left_ms"].as_u64().unwrap();
    assert_eq!(state["windows"][0]["admits"], false, "{state}");
    let retry = state["windows"][0]["retry_after_ms"].as_u64().unwrap();
    assert!(retry > 590_000 && retry.abs_diff(left) < 1_000, "{state}");
    // The dashboard's keys refused most.
    let mut shown = Value::Null;
    wait_until("the refused key on the dashboard", Duration::from_secs(10), async || {
        shown = json(admin, "/dashboard.json").await;
        shown["limits"][0]["refused_most"].as_array().is_some_and(|keys| !keys.is_empty())
    })
    .await;
    assert_eq!(shown["limits"][0]["refused_most"][0]["key"], name.as_str(), "{shown}");
    assert_eq!(shown["limits"][0]["bans"][0]["key"], name.as_str());
    // `simulate`'s report, from the access log and the same file.
    let out = binary().arg("simulate").arg("-c").arg(&sg.config).arg(&access_log).output().unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{report}{}", String::from_utf8_lossy(&out.stderr));
    assert!(report.contains(&name), "{name} not in:\n{report}");

    // Another instance (or this one restarted) with the same secret names it the same.
    let other_log = dir.path().join("other.log");
    let other = Sluicegate::start(&yaml(&other_log));
    assert_eq!(get(other.addr, "/", &key).await.status, 200);
    assert_eq!(get(other.addr, "/", &key).await.status, 429);
    let log = other
        .wait_for_log("the line \"request rejected, key banned\"", |log| log.contains("request rejected, key banned"));
    assert_eq!(logged_key(&log, "request rejected, key banned"), name);

    // A ban is lifted by its digest as printed, without its `#` (which a URL cannot
    // carry), or with it encoded; what matches nothing says what was expected.
    let missing = delete(admin, "/bans/per_key/0123").await;
    assert_eq!(missing.status, 404);
    assert!(missing.text().contains("GET /bans/per_key"), "{}", missing.text());
    assert_eq!(delete(admin, &format!("/bans/per_key/{digest}")).await.status, 204);
    assert_eq!(json(admin, "/bans").await["per_key"], serde_json::json!([]));
    assert_eq!(delete(other.admin_addr(), &format!("/bans/per_key/%23{digest}")).await.status, 204);
}
