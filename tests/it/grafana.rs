//! `contrib/grafana-dashboard.json` queries only what `/metrics` exports: every
//! `sluicegate_*` name in its panels' expressions is a sample of a real scrape.

use std::collections::BTreeSet;

use crate::common::*;

/// Every string under a key `expr` in `value`.
fn expressions<'a>(value: &'a serde_json::Value, found: &mut Vec<&'a str>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr", serde_json::Value::String(expr)) => found.push(expr),
                    _ => expressions(value, found),
                }
            }
        }
        serde_json::Value::Array(values) => values.iter().for_each(|v| expressions(v, found)),
        _ => {}
    }
}

/// The metric names `expr` names: `sluicegate_` and what follows of a name.
fn metric_names(expr: &str) -> impl Iterator<Item = &str> {
    expr.match_indices("sluicegate_").map(|(at, _)| {
        let rest = &expr[at..];
        let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
        &rest[..end]
    })
}

#[tokio::test]
async fn every_metric_the_grafana_dashboard_queries_is_exported() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/contrib/grafana-dashboard.json");
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut found = Vec::new();
    expressions(&dashboard, &mut found);
    let queried: BTreeSet<&str> = found.iter().flat_map(|expr| metric_names(expr)).collect();
    assert!(queried.len() >= 20, "{queried:?}");
    let panels = dashboard["panels"].as_array().unwrap();
    for panel in panels.iter().filter(|p| p["type"] != "row" && p["type"] != "text") {
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{}", panel["title"]);
    }

    // Every family there is: routes forwarding and answering (a route's series appear
    // with its first request), limits with bans, concurrency and delays, global limits
    // (Redis absent: the store's counts are exported all the same).
    let backend = Backend::start().await;
    let sg = Conf::new()
        .admin()
        .upstream(&backend)
        .redis(&format!("redis://127.0.0.1:{}", closed_port()), "timeout: 50ms")
        .limit("banning", "key: ip, rate: 1r/m, ban: 1m")
        .limit("slots", "key: ip, concurrency: 2")
        .limit("shared", "key: ip, rate: 10r/s, scope: global, on_store_error: local")
        .route("name: login, match: { path: /login }, respond: { status: 200 }, limits: [banning]")
        .forwarding("slots, shared")
        .start();
    for path in ["/login", "/api"] {
        get(sg.addr, path, &[]).await;
    }
    let scrape = Metrics::of(&sg).await;
    let exported: BTreeSet<&str> = scrape
        .0
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split(['{', ' ']).next())
        .collect();
    let missing: Vec<&&str> = queried.difference(&exported).collect();
    assert!(missing.is_empty(), "queried by the Grafana dashboard, not exported: {missing:?}\nexported: {exported:?}");
}
