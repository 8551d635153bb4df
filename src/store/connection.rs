//! Connections to Redis, made without blocking start-up.
//!
//! A standalone Redis is reached through redis-rs `ConnectionManager`s: one multiplexed
//! connection each (concurrent requests are pipelined on it), connected lazily and
//! reconnected by redis-rs after an I/O error, one attempt per error: what comes after it
//! waits for that attempt, and the next attempt is the next call's or probe's (`probe`),
//! not a backoff's that would hold them past their timeout. A cluster client needs its first
//! connection to learn the slots, so it is made by a background task that retries until
//! Redis answers; until then every call fails at once (and `on_store_error` applies).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Client, ErrorKind, IntoConnectionInfo, RedisError, RedisResult, ServerErrorKind, TlsCertificates, Value};
use tracing::{info, warn};

use super::script::ScriptCall;
use crate::config::Redis;

#[derive(Clone)]
enum Connection {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
}

pub struct Connections {
    slots: Arc<[OnceLock<Connection>]>,
    next: AtomicUsize,
    /// True once every slot holds its connection (at once on a standalone Redis; a
    /// cluster's when the background task has made them). A probe waits for it.
    made: tokio::sync::watch::Receiver<bool>,
}

/// The URL's connection details with the section's `username` / `password` applied.
fn connection_info(config: &Redis) -> RedisResult<redis::ConnectionInfo> {
    let mut info = config.url.as_str().into_connection_info()?;
    let mut settings = info.redis_settings().clone();
    if let Some(username) = &config.username {
        settings = settings.set_username(username);
    }
    if let Some(password) = &config.password {
        settings = settings.set_password(password);
    }
    info = info.set_redis_settings(settings);
    Ok(info)
}

impl Connections {
    /// Starts connecting (in the background: this never waits for Redis).
    pub fn new(config: &Redis) -> Connections {
        if config.url.starts_with("rediss://") {
            // rustls needs a process-wide crypto provider; a second install is a no-op error.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let slots: Arc<[OnceLock<Connection>]> = (0..config.connections).map(|_| OnceLock::new()).collect();
        let (all_made, made) = tokio::sync::watch::channel(!config.cluster);
        let info = match connection_info(config) {
            Ok(info) => info,
            Err(e) => {
                // Validated with the config; kept for completeness: every call then fails.
                warn!(error = %e, "invalid Redis URL: global limits use their on_store_error");
                return Connections { slots, next: AtomicUsize::new(0), made };
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
            let slots = Arc::clone(&slots);
            tokio::spawn(async move {
                let Ok(client) = builder.build() else { return };
                let mut backoff = Duration::from_millis(100);
                let mut logged = false;
                for slot in slots.iter() {
                    loop {
                        match client.get_async_connection().await {
                            Ok(connection) => {
                                let _ = slot.set(Connection::Cluster(connection));
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
            // No retries: redis-rs would retry a refused connection after a backoff (50 ms,
            // then 100 ms, each up to twice that), every call and probe meanwhile would
            // wait for it past `timeout`, and a probe after Redis came back would find the
            // failed attempt. The probe is the retry.
            let manager_config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(config.connect_timeout))
                .set_number_of_retries(0);
            for slot in slots.iter() {
                let client = match config.tls_ca {
                    Some(_) => Client::build_with_tls(info.clone(), certs()),
                    None => Client::open(info.clone()),
                };
                match client.and_then(|client| ConnectionManager::new_lazy_with_config(client, manager_config.clone()))
                {
                    Ok(manager) => {
                        let _ = slot.set(Connection::Standalone(manager));
                    }
                    Err(e) => warn!(error = %e, "cannot set up a Redis connection"),
                }
            }
        }
        Connections { slots, next: AtomicUsize::new(0), made }
    }

    /// How many connections are used in turn.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Runs `call` on the next connection in turn.
    pub async fn invoke(&self, call: &ScriptCall) -> RedisResult<Value> {
        let n = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        match self.slots[n].get().cloned() {
            Some(Connection::Standalone(mut c)) => evalsha(&mut c, call).await,
            Some(Connection::Cluster(mut c)) => evalsha(&mut c, call).await,
            None => Err(RedisError::from((ErrorKind::Io, "not connected to Redis yet"))),
        }
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
        let pings = self.slots.iter().map(|slot| {
            let ping = &ping;
            async move {
                let once = || async {
                    match slot.get().cloned() {
                        Some(Connection::Standalone(mut c)) => ping.query_async::<Value>(&mut c).await,
                        Some(Connection::Cluster(mut c)) => ping.query_async::<Value>(&mut c).await,
                        None => Err(RedisError::from((ErrorKind::Io, "not connected to Redis yet"))),
                    }
                };
                match once().await {
                    Ok(_) => Ok(()),
                    Err(_) => once().await.map(drop),
                }
            }
        });
        futures_util::future::join_all(pings).await.into_iter().collect()
    }

    /// Runs one command (a lease's release) on the next connection in turn.
    pub async fn command(&self, cmd: &redis::Cmd) -> RedisResult<Value> {
        let n = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        match self.slots[n].get().cloned() {
            Some(Connection::Standalone(mut c)) => cmd.query_async(&mut c).await,
            Some(Connection::Cluster(mut c)) => cmd.query_async(&mut c).await,
            None => Err(RedisError::from((redis::ErrorKind::Io, "not connected to Redis yet"))),
        }
    }
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
