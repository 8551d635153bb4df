//! For `check` (and `import`) only: upstream servers named by a host that does not
//! resolve, reported where they stand (as `nginx -t` reports "host not found in upstream"). `run` does not
//! refuse to start on them: its resolver may answer later, and a 502 names the server.

use std::collections::BTreeMap;
use std::net::{IpAddr, ToSocketAddrs};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::position::Positions;
use super::{Config, ConfigError};

/// Longest wait for all the lookups together: a resolver that does not answer must not
/// hang `check`.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) fn unresolved(config: &Config, src: &str, file: &str) -> Vec<ConfigError> {
    let mut lookups = Vec::new();
    for upstream in &config.upstreams {
        for (i, server) in upstream.servers.iter().enumerate() {
            let host = server.address.host().trim_start_matches('[').trim_end_matches(']');
            let port = server.address.port_u16().unwrap_or(if server.tls { 443 } else { 80 });
            lookups.push((format!("upstreams.{}.servers[{i}]", upstream.name), host.to_owned(), port));
        }
    }
    let failed = not_found(lookups);
    let positions = Positions::new(src);
    let mut errors: Vec<ConfigError> = failed
        .into_iter()
        .map(|(path, (host, why))| {
            ConfigError::new(file, positions.of(&path), &path, &format!("host {host:?} does not resolve: {why}"))
        })
        .collect();
    errors.sort_by_key(|err| (err.line, err.column));
    errors
}

/// The lookups, by key, whose host is no address and does not resolve within
/// `RESOLVE_TIMEOUT` (all together): `(host, why)`.
pub(crate) fn not_found<K: Ord + Clone + Send + 'static>(
    lookups: Vec<(K, String, u16)>,
) -> BTreeMap<K, (String, String)> {
    let (tx, rx) = mpsc::channel();
    // Lookups not answered yet, by key, with their host.
    let mut pending = BTreeMap::new();
    for (key, host, port) in lookups {
        if host.parse::<IpAddr>().is_ok() {
            continue;
        }
        pending.insert(key.clone(), host.clone());
        let tx = tx.clone();
        // The system resolver (getaddrinfo, with /etc/hosts) blocks and cannot be
        // cancelled: each lookup gets a thread that is left behind if it hangs.
        std::thread::spawn(move || {
            let found = (host.as_str(), port).to_socket_addrs().map(|mut addrs| addrs.next().is_some());
            let _ = tx.send((key, found));
        });
    }
    let deadline = Instant::now() + RESOLVE_TIMEOUT;
    let mut failed = BTreeMap::new();
    while !pending.is_empty() {
        let Ok((key, found)) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) else {
            break;
        };
        let host = pending.remove(&key).unwrap_or_default();
        match found {
            Ok(true) => {}
            Ok(false) => _ = failed.insert(key, (host, "no address".to_owned())),
            Err(err) => _ = failed.insert(key, (host, err.to_string())),
        }
    }
    let silent = format!("no answer within {}s", RESOLVE_TIMEOUT.as_secs());
    failed.extend(pending.into_iter().map(|(key, host)| (key, (host, silent.clone()))));
    failed
}
