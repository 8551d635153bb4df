//! End-to-end tests: the real `sluicegate` binary between a real client and backend.
// A failed unwrap is a failed test; helpers outside #[test] functions unwrap too.
#![allow(clippy::unwrap_used)]

mod admin;
mod algorithms;
mod common;
mod concurrency;
mod config_errors;
mod config_fuzz;
mod conformance;
mod connections;
mod forwarding;
mod global;
mod limits;
mod paths;
mod redis;
mod server;
