//! Connections to Redis, made without blocking start-up.
//!
//! A standalone Redis is reached through redis-rs `ConnectionManager`s: one multiplexed
//! connection each (concurrent requests are pipelined on it), connected lazily and
//! reconnected by redis-rs after an I/O error, one attempt per error: what comes after it
//! waits for that attempt, and the next attempt is the next call's or probe's (`probe`),
//! not a backoff's that would hold them past their timeout. A cluster client needs its first
//! connection to learn the slots, so it is made by a background task that retries until
//! Redis answers; until then every call fails at once (and `on_store_error` applies).
//! With sentinels, a background task asks them which server is the master (at start,
//! every `check_interval`, and at once after a failed call), and when it changes replaces
//! the connections with ones to the new master; until the first answer every call fails
//! at once, as with a cluster.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::SentinelNodeConnectionInfo;
use redis::{
    Client, ErrorKind, IntoConnectionInfo, RedisConnectionInfo, RedisError, RedisResult, ServerErrorKind,
    TlsCertificates, Value,
};
use tokio::sync::{Notify, watch};
use tracing::{info, warn};

use super::script::ScriptCall;
use crate::config::{self, Redis};

#[derive(Clone)]
enum Connection {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
}

/// The connections used in turn; empty until made (a cluster's, or the master's a
/// sentinel named), and replaced when the sentinels name another master.
type Slots = [ArcSwapOption<Connection>];

pub struct Connections {
    slots: Arc<Slots>,
    next: AtomicUsize,
    /// True once every slot holds its connection (at once on a standalone Redis; a
    /// cluster's when the background task has made them). A probe waits for it.
    made: watch::Receiver<bool>,
    /// With sentinels: told of a failed call, so that they are asked at once whether the
    /// master changed.
    recheck: Option<Arc<Notify>>,
}

/// The URL's connection details with the section's `username` / `password` applied.
fn connection_info(config: &Redis) -> RedisResult<redis::ConnectionInfo> {
    let mut info = config.url.as_str().into_connection_info()?;
    let settings = credentials(info.redis_settings().clone(), config.username.as_ref(), config.password.as_ref());
    info = info.set_redis_settings(settings);
    Ok(info)
}

fn credentials(
    mut settings: RedisConnectionInfo,
    username: Option<&String>,
    password: Option<&String>,
) -> RedisConnectionInfo {
    if let Some(username) = username {
        settings = settings.set_username(username);
    }
    if let Some(password) = password {
        settings = settings.set_password(password);
    }
    settings
}

/// How a standalone server's connections are made. No retries: redis-rs would retry a
/// refused connection after a backoff (50 ms, then 100 ms, each up to twice that), every
/// call and probe meanwhile would wait for it past `timeout`, and a probe after Redis came
/// back would find the failed attempt. The probe is the retry.
fn manager_config(config: &Redis) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new().set_connection_timeout(Some(config.connect_timeout)).set_number_of_retries(0)
}

impl Connections {
    /// Starts connecting (in the background: this never waits for Redis).
    pub fn new(config: &Redis) -> Connections {
        if config.url.starts_with("rediss://") {
            // rustls needs a process-wide crypto provider; a second install is a no-op error.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let slots: Arc<Slots> = (0..config.connections).map(|_| ArcSwapOption::empty()).collect();
        let standalone = !config.cluster && config.sentinel.is_none();
        let (all_made, made) = watch::channel(standalone);
        let mut connections = Connections { slots, next: AtomicUsize::new(0), made, recheck: None };
        if let Some(sentinel) = &config.sentinel {
            let recheck = Arc::new(Notify::new());
            follow_master(config, sentinel, Arc::downgrade(&connections.slots), all_made, Arc::clone(&recheck));
            connections.recheck = Some(recheck);
            return connections;
        }
        let info = match connection_info(config) {
            Ok(info) => info,
            Err(e) => {
                // Validated with the config; kept for completeness: every call then fails.
                warn!(error = %e, "invalid Redis URL: global limits use their on_store_error");
                return connections;
            }
        };
        // A private CA replaces the public roots.
        let certs = || TlsCertificates { client_tls: None, root_cert: config.tls_ca.clone() };
        if config.cluster {
            // Every call is bounded by `redis.timeout` in `Store`; the client's own
            // response timeout only has to stay out of its way.
            let mut builder = ClusterClientBuilder::new(vec![info])
                .connection_timeout(config.connect_timeout)
                .response_timeout(Duration::from_secs(60));
            if config.tls_ca.is_some() {
                builder = builder.certs(certs());
            }
            let slots = Arc::clone(&connections.slots);
            tokio::spawn(async move {
                let Ok(client) = builder.build() else { return };
                let mut backoff = Duration::from_millis(100);
                let mut logged = false;
                for slot in slots.iter() {
                    loop {
                        match client.get_async_connection().await {
                            Ok(connection) => {
                                slot.store(Some(Arc::new(Connection::Cluster(connection))));
                                break;
                            }
                            Err(e) => {
                                if !logged {
                                    warn!(error = %e, "Redis Cluster unreachable; retrying in the background");
                                    logged = true;
                                }
                                tokio::time::sleep(backoff).await;
                                backoff = (backoff * 2).min(Duration::from_secs(2));
                            }
                        }
                    }
                }
                let _ = all_made.send(true);
                info!("connected to Redis Cluster");
            });
        } else {
            let client = match config.tls_ca {
                Some(_) => Client::build_with_tls(info, certs()),
                None => Client::open(info),
            };
            match client {
                Ok(client) => connect_all(&connections.slots, &client, &manager_config(config)),
                Err(e) => warn!(error = %e, "cannot set up a Redis connection"),
            }
        }
        connections
    }

    /// The connection of slot `n`, if made.
    fn connection(&self, n: usize) -> Option<Connection> {
        self.slots[n].load().as_deref().cloned()
    }

    /// The next connection in turn, if made.
    fn next(&self) -> Option<Connection> {
        self.connection(self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len())
    }

    /// What a failed call says: with sentinels, that the master may have changed.
    fn failed<T>(&self, reply: RedisResult<T>) -> RedisResult<T> {
        if reply.is_err()
            && let Some(recheck) = &self.recheck
        {
            recheck.notify_one();
        }
        reply
    }

    /// How many connections are used in turn.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Runs `call` on the next connection in turn.
    pub async fn invoke(&self, call: &ScriptCall) -> RedisResult<Value> {
        let reply = match self.next() {
            Some(Connection::Standalone(mut c)) => evalsha(&mut c, call).await,
            Some(Connection::Cluster(mut c)) => evalsha(&mut c, call).await,
            None => Err(not_connected()),
        };
        self.failed(reply)
    }

    /// `PING`s Redis on every connection (on a cluster, every primary). A connection an
    /// outage broke answers its first command with the error that starts its
    /// reconnection, so a failed `PING` is sent once more, on the new connection. A
    /// cluster's connections not yet made are waited for (the caller bounds the wait).
    pub async fn ping(&self) -> RedisResult<()> {
        if self.made.clone().wait_for(|&made| made).await.is_err() {
            return Err(RedisError::from((ErrorKind::Io, "no connection to Redis can be made")));
        }
        let ping = redis::cmd("PING");
        let pings = (0..self.slots.len()).map(|n| {
            let ping = &ping;
            async move {
                let once = || async {
                    match self.connection(n) {
                        Some(Connection::Standalone(mut c)) => ping.query_async::<Value>(&mut c).await,
                        Some(Connection::Cluster(mut c)) => ping.query_async::<Value>(&mut c).await,
                        None => Err(not_connected()),
                    }
                };
                match once().await {
                    Ok(_) => Ok(()),
                    Err(_) => once().await.map(drop),
                }
            }
        });
        let pinged = futures_util::future::join_all(pings).await.into_iter().collect();
        self.failed(pinged)
    }

    /// Runs one command (a lease's release) on the next connection in turn.
    pub async fn command(&self, cmd: &redis::Cmd) -> RedisResult<Value> {
        let reply = match self.next() {
            Some(Connection::Standalone(mut c)) => cmd.query_async(&mut c).await,
            Some(Connection::Cluster(mut c)) => cmd.query_async(&mut c).await,
            None => Err(not_connected()),
        };
        self.failed(reply)
    }
}

fn not_connected() -> RedisError {
    RedisError::from((ErrorKind::Io, "not connected to Redis yet"))
}

/// Fills every slot with a new connection to `client`'s server (connected lazily).
fn connect_all(slots: &Slots, client: &Client, config: &ConnectionManagerConfig) {
    for slot in slots {
        match ConnectionManager::new_lazy_with_config(client.clone(), config.clone()) {
            Ok(manager) => slot.store(Some(Arc::new(Connection::Standalone(manager)))),
            Err(e) => warn!(error = %e, "cannot set up a Redis connection"),
        }
    }
}

/// The shortest time between two questions to the sentinels, however many calls fail.
const SENTINEL_GAP: Duration = Duration::from_millis(100);

/// Asks the sentinels which server is `sentinel.master`'s master, now, every
/// `check_interval` and after every `recheck`, and connects `slots` to it when it changes,
/// until the connections are dropped. The first answer sends `made`.
fn follow_master(
    config: &Redis,
    sentinel: &config::Sentinel,
    slots: Weak<Slots>,
    made: watch::Sender<bool>,
    recheck: Arc<Notify>,
) {
    let nodes: RedisResult<Vec<_>> = (sentinel.nodes.iter())
        .map(|node| {
            let info = node.as_str().into_connection_info()?;
            let settings = credentials(info.redis_settings().clone(), None, sentinel.password.as_ref());
            Ok(info.set_redis_settings(settings))
        })
        .collect();
    let built = nodes.and_then(|nodes| Ok((redis::sentinel::Sentinel::build(nodes.clone())?, nodes)));
    let (mut sentinels, nodes) = match built {
        Ok(built) => built,
        Err(e) => {
            // Validated with the config; kept for completeness: every call then fails.
            warn!(error = %e, "invalid sentinel addresses: global limits use their on_store_error");
            return;
        }
    };
    let master_info = SentinelNodeConnectionInfo::default().set_redis_connection_info(credentials(
        RedisConnectionInfo::default(),
        config.username.as_ref(),
        config.password.as_ref(),
    ));
    for node in nodes {
        hear_switches(node, Weak::clone(&slots), Arc::clone(&recheck));
    }
    let (name, interval, manager) = (sentinel.master.clone(), sentinel.check_interval, manager_config(config));
    // A sentinel that does not answer must not hold the search: each question is bounded.
    let bound = config.connect_timeout * 2;
    tokio::spawn(async move {
        let mut master: Option<String> = None;
        let mut failing = false;
        loop {
            match tokio::time::timeout(bound, sentinels.async_master_for(&name, Some(&master_info))).await {
                Ok(Ok(client)) => {
                    failing = false;
                    let found = client.get_connection_info().addr().to_string();
                    if master.as_ref() != Some(&found) {
                        let Some(slots) = slots.upgrade() else { return };
                        connect_all(&slots, &client, &manager);
                        match &master {
                            None => {
                                info!(master = %found, name = %name, "connected to the Redis master the sentinels name")
                            }
                            Some(old) => {
                                warn!(master = %found, was = %old, name = %name, "the sentinels name a new Redis master; connected to it")
                            }
                        }
                        master = Some(found);
                        let _ = made.send(true);
                    }
                }
                asked => {
                    if !failing {
                        let error = match asked {
                            Ok(Err(e)) => e.to_string(),
                            _ => format!("no answer within {bound:?}"),
                        };
                        warn!(%error, name = %name, "the sentinels name no Redis master; asking again in the background");
                        failing = true;
                    }
                }
            }
            tokio::select! {
                () = recheck.notified() => {}
                () = tokio::time::sleep(interval) => {}
            }
            if slots.strong_count() == 0 {
                return;
            }
            tokio::time::sleep(SENTINEL_GAP).await;
        }
    });
}

/// `call` as `EVALSHA`; when Redis does not know the script (first use, a restart, a
/// `SCRIPT FLUSH`), loads it and sends the call once more.
async fn evalsha(connection: &mut impl redis::aio::ConnectionLike, call: &ScriptCall) -> RedisResult<Value> {
    let cmd = call.cmd();
    match cmd.query_async(connection).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            call.script.load_async(connection).await?;
            cmd.query_async(connection).await
        }
        reply => reply,
    }
}

/// Listens to a sentinel's `+switch-master` messages (one is published as soon as it
/// names a new master) and asks for the master at once on each: a demoted master may
/// accept writes until it is told it is a replica, so waiting for a failed call could
/// send decisions to it meanwhile. Reconnects every second while the sentinel is away,
/// until the connections are dropped.
fn hear_switches(node: redis::ConnectionInfo, slots: Weak<Slots>, recheck: Arc<Notify>) {
    use futures_util::StreamExt;
    tokio::spawn(async move {
        while slots.strong_count() > 0 {
            if let Ok(client) = Client::open(node.clone())
                && let Ok(mut pubsub) = client.get_async_pubsub().await
                && pubsub.subscribe("+switch-master").await.is_ok()
            {
                let mut messages = pubsub.on_message();
                loop {
                    tokio::select! {
                        message = messages.next() => match message {
                            Some(_) => recheck.notify_one(),
                            None => break,
                        },
                        // Looks every second whether the connections are still used.
                        () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                    if slots.strong_count() == 0 {
                        return;
                    }
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
}
