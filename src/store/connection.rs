//! Connections to Redis, made without blocking start-up.
//!
//! A standalone Redis is reached through redis-rs `ConnectionManager`s: one multiplexed
//! connection each (concurrent requests are pipelined on it), connected lazily and
//! reconnected by redis-rs after an I/O error. A cluster client needs its first
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
        let info = match connection_info(config) {
            Ok(info) => info,
            Err(e) => {
                // Validated with the config; kept for completeness: every call then fails.
                warn!(error = %e, "invalid Redis URL: global limits use their on_store_error");
                return Connections { slots, next: AtomicUsize::new(0) };
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
                info!("connected to Redis Cluster");
            });
        } else {
            let manager_config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(config.connect_timeout))
                .set_number_of_retries(2)
                .set_min_delay(Duration::from_millis(50))
                .set_max_delay(Duration::from_millis(500));
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
        Connections { slots, next: AtomicUsize::new(0) }
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
