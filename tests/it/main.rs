//! End-to-end tests: the real `sluicegate` binary between a real client and backend.
// A failed unwrap is a failed test; helpers outside #[test] functions unwrap too.
#![allow(clippy::unwrap_used)]

mod adaptive;
mod admin;
mod algorithms;
mod bench;
mod bodies;
mod body_keys;
mod browser;
mod build_once;
mod calendar;
mod candidate;
mod charges;
mod chromium;
mod common;
mod concurrency;
mod config_errors;
mod config_fuzz;
mod conformance;
mod connections;
mod dashboard;
mod docs;
mod engine;
mod eviction;
mod explain;
mod forwarded;
mod forwarding;
// The hand-worked GCRA schedules the local limiter's tests replay too.
#[path = "../../src/limit/gcra_cases.rs"]
mod gcra_cases;
mod global;
mod grafana;
mod grpc;
mod grpcio;
mod holds;
mod import;
mod import_https;
mod key_names;
mod keys;
mod limits;
mod llm_gateway;
mod logs;
mod missing_keys;
mod nginx;
mod pacing;
mod paths;
mod persist;
mod promises;
mod queue;
mod redis;
mod reload;
mod routing;
mod server;
mod simulate;
mod smuggling;
mod soft_limits;
mod synthetic;
mod tenants;
mod tls;
mod tokens;
mod upgrades;
mod upstreams;
