//! The state directory (`persist.dir`): where limits with `persist: true` keep their key
//! tables and bans across restarts, one file per limit (`NAME.state`, see
//! `limit::snapshot`), beside the secret their keys are hashed with (`keys.secret`).
//! Read at start (before the first request); written on a timer (`persist.interval`) and
//! at shutdown, off the request path (a blocking task that locks one shard at a time),
//! each file whole or not at all: a temporary file in the same directory, synced, then
//! renamed over the old one. A reload keeps the state in memory (`Limiters::reloaded`),
//! and the next write writes what it kept.

use std::collections::HashSet;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use tracing::{error, info, warn};

use crate::config::Config;
use crate::config::files::read_bounded;
use crate::limit::Limiters;
use crate::limit::secret::{self, KeySecret};
use crate::proxy::Proxy;
use crate::running::Running;

/// The secret's file in the state directory.
const SECRET_FILE: &str = "keys.secret";
/// A state file larger than this is refused unread: a table of 100,000 keys writes
/// about 2 MB (a sliding log more, a timestamp per admission).
const MAX_STATE_FILE: u64 = 1 << 30;

fn persists(config: &Config) -> bool {
    config.limits.iter().any(|l| l.persist)
}

/// The file of limit `name`'s state in `dir`.
pub fn state_file(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.state"))
}

/// The secret to hash and digest keys with: when `config` persists a limit, the one in
/// its state directory (drawn and saved there on first use); else one drawn now.
pub fn secret(config: &Config) -> KeySecret {
    if !persists(config) {
        return KeySecret::draw();
    }
    let path = config.persist.dir.join(SECRET_FILE);
    let file = path.display();
    match read_bounded(&path, secret::FILE_LEN as u64) {
        Ok(bytes) => {
            if let Some(secret) = KeySecret::from_file(&bytes) {
                return secret;
            }
            warn!(%file, "not a key secret file: a new secret is drawn; state files keyed with the old one are refused");
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => {
            error!(%file, error = %e, "cannot read the key secret: a new one is drawn; persisted limits start fresh");
        }
    }
    let secret = KeySecret::draw();
    if let Err(e) = write_atomic(&path, &secret.to_file()) {
        error!(%file, error = %e, "cannot save the key secret: persisted state will not survive a restart");
    }
    secret
}

/// Takes back each persisted limit's state from its file, logging what it took or why it
/// took none (the limit then starts fresh).
pub fn restore(limiters: &Limiters, config: &Config) {
    let now = limiters.clock().now().0;
    for (id, limit) in config.limits.iter_enumerated().filter(|(_, l)| l.persist) {
        let path = state_file(&config.persist.dir, &limit.name);
        let file = path.display();
        let bytes = match read_bounded(&path, MAX_STATE_FILE) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                info!(limit = %limit.name, %file, "no state file yet: the limit starts fresh");
                continue;
            }
            Err(e) => {
                warn!(limit = %limit.name, %file, error = %e, "state file refused: cannot read it; the limit starts fresh");
                continue;
            }
        };
        match limiters.restore(id, &bytes, now) {
            Ok(r) => {
                let age_s = now.saturating_sub(r.written) / 1_000_000_000;
                info!(limit = %limit.name, %file, keys = r.keys, bans = r.bans, age_s, "state restored");
            }
            Err(why) => warn!(limit = %limit.name, %file, "state file refused: {why}; the limit starts fresh"),
        }
    }
}

/// Writes the persisted limits' state, one write at a time.
#[derive(Default)]
pub struct Writer {
    /// The files whose last write failed: a failure is logged when a file starts failing,
    /// not at every interval (the counter counts each).
    failing: Mutex<HashSet<PathBuf>>,
}

impl Writer {
    /// Writes the state of `proxy`'s persisted limits, on a blocking thread.
    pub async fn write(self: &Arc<Self>, proxy: Arc<Proxy>) {
        let writer = Arc::clone(self);
        if let Err(e) = tokio::task::spawn_blocking(move || writer.write_now(&proxy)).await {
            error!(error = %e, "the state writer failed");
        }
    }

    fn write_now(&self, proxy: &Proxy) {
        let config = proxy.config();
        if !persists(config) {
            return;
        }
        // Held for the whole round: two rounds never race to rename a limit's file.
        let mut failing = self.failing.lock().unwrap_or_else(PoisonError::into_inner);
        let limiters = proxy.limiters();
        let dir = &config.persist.dir;
        // The state files are only as good as the secret beside them.
        let saved = ensure_secret(dir, limiters.secret());
        let now = limiters.clock().now().0;
        for (id, limit) in config.limits.iter_enumerated().filter(|(_, l)| l.persist) {
            let path = state_file(dir, &limit.name);
            let result = saved.as_ref().map_err(|e| std::io::Error::new(e.kind(), e.to_string())).and_then(|()| {
                let bytes = limiters.snapshot(id, now);
                write_atomic(&path, &bytes)
            });
            proxy.metrics().state_write(&limit.name, result.is_ok());
            match result {
                Ok(()) if failing.remove(&path) => {
                    info!(limit = %limit.name, file = %path.display(), "state written again")
                }
                Ok(()) => {}
                Err(e) => {
                    if failing.insert(path.clone()) {
                        error!(limit = %limit.name, file = %path.display(), error = %e,
                            "cannot write the state file: the state would not survive a restart (sluicegate_state_writes_total{{result=\"failed\"}} counts the failures)");
                    }
                }
            }
        }
    }
}

/// Saves `secret` in `dir` unless its file holds it already.
fn ensure_secret(dir: &Path, secret: &KeySecret) -> std::io::Result<()> {
    let path = dir.join(SECRET_FILE);
    match read_bounded(&path, secret::FILE_LEN as u64) {
        Ok(bytes) if KeySecret::from_file(&bytes).as_ref() == Some(secret) => Ok(()),
        _ => write_atomic(&path, &secret.to_file()),
    }
}

/// Replaces the file at `path` with `bytes`, whole or not at all: a temporary file in
/// the same directory (readable by this user only), synced, renamed over it, and the
/// directory synced so that the rename itself survives a crash. The directory is made,
/// for this user only, if it does not exist.
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let mut file = tempfile::Builder::new().prefix(".").suffix(".tmp").tempfile_in(dir)?;
    file.write_all(bytes)?;
    file.as_file().sync_all()?;
    file.persist(path).map_err(|e| e.error)?;
    std::fs::File::open(dir)?.sync_all()
}

/// Writes the state every `persist.interval` (of the configuration in force) until the
/// process ends.
pub async fn keep(running: Arc<Running>, writer: Arc<Writer>) {
    loop {
        tokio::time::sleep(running.proxy().config().persist.interval).await;
        writer.write(running.proxy()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_replaces_the_whole_file_readable_by_its_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("deeper").join("a.state");
        write_atomic(&path, b"first").unwrap();
        write_atomic(&path, b"second").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(path.parent().unwrap()).unwrap().permissions().mode() & 0o777, 0o700);
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(path.parent().unwrap()).unwrap().count(), 1);
    }
}
