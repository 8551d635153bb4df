//! Global limits against a real Redis: the same decisions as local ones, one budget
//! shared by several instances (`decisions`), what happens when Redis fails, is paused,
//! forgets its scripts or starts late (`outages`), and Redis as deployed: a cluster,
//! TLS, credentials, leases of an instance that dies, keys' TTLs (`deployments`), a
//! master found through sentinels and their failover (`sentinel`), requests waiting for a
//! global slot (`queues`).

mod decisions;
mod deployments;
mod outages;
mod queues;
mod sentinel;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderMap;
use sluicegate::clock::{ManualClock, Nanos};
use sluicegate::config::{LimitUse, parse};
use sluicegate::gate::{Decision, Gate};
use sluicegate::limit::{Outcome, Standing};
use sluicegate::policy::key::{KeyHash, KeySource};
use sluicegate::store::{Call, RedisTime};

use crate::common::{Backend, Conf, Metrics, Sluicegate, futures_statuses, get, wait_until};
use crate::redis::{Cluster, Redis};

/// `GET path`, failing the test if no answer comes within `limit` (Redis is failing:
/// no request may hang).
async fn get_within(addr: std::net::SocketAddr, path: &str, limit: Duration) -> (u16, Option<String>, Duration) {
    let started = Instant::now();
    let reply = tokio::time::timeout(limit, get(addr, path, &[]))
        .await
        .unwrap_or_else(|_| panic!("{path}: no answer within {limit:?}"));
    (reply.status, reply.header("retry-after").map(str::to_owned), started.elapsed())
}

/// Evalsha calls Redis has run so far (not counting those that found no script).
fn evalsha_calls(redis: &Redis) -> u64 {
    let stats = redis.command(&["INFO", "commandstats"]);
    let Some(line) = stats.lines().find_map(|l| l.strip_prefix("cmdstat_evalsha:")) else { return 0 };
    let field = |name: &str| -> u64 {
        line.split(',').find_map(|f| f.strip_prefix(name)?.strip_prefix('=')).unwrap().parse().unwrap()
    };
    field("calls") - field("failed_calls")
}
