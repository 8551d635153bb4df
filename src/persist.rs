//! The state directory (`persist.dir`): where limits with `persist: true` keep their key
//! tables and bans across restarts, one file per limit (`NAME.state`, see
//! `limit::snapshot`), beside the secret their keys are hashed with and their files are
//! sealed with (`keys.secret`). Read at start (before the first request); written on a
//! timer (`persist.interval`) and at shutdown, off the request path (a blocking task
//! that locks one shard at a time), each file whole or not at all: a temporary file in
//! the same directory, synced, then renamed over the old one. A reload keeps the state
//! in memory (`Limiters::reloaded`), and the next write writes what it kept.
//!
//! What is read must be sluicegate's own: whoever can write the directory or a file in
//! it could lift quotas and bans. So the directory, the secret and each state file must
//! belong to sluicegate's user (or root) and be writable by no one else (`trusted`); a
//! directory that is not is neither read nor written (an error says why, every start),
//! a state file that is not is refused. A state file larger than its limit can write
//! (`Limiters::state_bound`) is refused before a byte of it is read, and one edited
//! without the secret is refused by its seal. A secret file that is there but cannot be
//! used (unreadable, not sluicegate's own, not a secret) is never replaced: the state
//! files it keys are kept for the restart that can use it, and nothing is written
//! meanwhile.

use std::collections::HashSet;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use tracing::{error, info, warn};

use crate::config::Config;
use crate::limit::Limiters;
use crate::limit::secret::{self, KeySecret};
use crate::proxy::Proxy;
use crate::running::Running;

/// The secret's file in the state directory.
const SECRET_FILE: &str = "keys.secret";

fn persists(config: &Config) -> bool {
    config.limits.iter().any(|l| l.persist)
}

/// The file of limit `name`'s state in `dir`.
pub fn state_file(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.state"))
}

/// Why a file or directory with `meta` is not sluicegate's own, if it is not: owned by
/// another user than the process's (root aside, who can write anything anyway), or
/// writable by its group or others.
fn untrusted(meta: &std::fs::Metadata) -> Option<String> {
    let (owner, me) = (meta.uid(), rustix::process::geteuid().as_raw());
    let mode = meta.mode() & 0o777;
    if owner != me && owner != 0 {
        return Some(format!("it belongs to user {owner}, not to sluicegate's ({me})"));
    }
    if mode & 0o022 != 0 {
        return Some(format!("its group or others may write it (mode {mode:o}); chmod go-w it"));
    }
    None
}

/// Whether the state directory `dir` may be read and written: it does not exist yet
/// (the first write makes it, for this user only), or it is sluicegate's own.
fn trusted_dir(dir: &Path) -> Result<(), String> {
    match std::fs::metadata(dir) {
        Ok(meta) => match untrusted(&meta) {
            None => Ok(()),
            Some(why) => Err(format!("the state directory {} is not sluicegate's own: {why}", dir.display())),
        },
        // A directory not made yet (or that cannot be: writing it will say why).
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => Ok(()),
        Err(e) => Err(format!("cannot read the state directory {}: {e}", dir.display())),
    }
}

/// The bytes of the file at `path` in a trusted directory, if it is a regular file of
/// sluicegate's own, not a link, and at most `max` bytes long: checked on the open file,
/// before any byte is read.
fn read_trusted(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Error;
    let refused = |why: String| Error::new(ErrorKind::InvalidInput, why);
    if std::fs::symlink_metadata(path)?.is_symlink() {
        return Err(refused("it is a symbolic link".into()));
    }
    // Not following a link put there since, and not blocking on a FIFO.
    let flags = rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK;
    let file = std::fs::File::options().read(true).custom_flags(flags.bits() as i32).open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(refused("it is not a regular file".into()));
    }
    if let Some(why) = untrusted(&meta) {
        return Err(refused(why));
    }
    if meta.len() > max {
        let len = meta.len();
        return Err(refused(format!("it is {len} bytes, more than this limit can write ({max}): refused unread")));
    }
    let mut bytes = Vec::new();
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(refused(format!("it grew past {max} bytes while read")));
    }
    Ok(bytes)
}

/// The secret to hash and digest keys with: when `config` persists a limit, the one in
/// its state directory (drawn and saved there on first use); else one drawn now. A
/// secret file that is there but cannot be used (unreadable, not sluicegate's own, not
/// a secret) is left as it is: a secret is drawn for this run, persisted limits start
/// fresh, and nothing is written (`ensure_secret`) until it is fixed or removed.
pub fn secret(config: &Config) -> KeySecret {
    if !persists(config) {
        return KeySecret::draw();
    }
    let dir = &config.persist.dir;
    if let Err(why) = trusted_dir(dir) {
        error!("{why}: nothing is read from it or written to it; persisted limits start fresh");
        return KeySecret::draw();
    }
    let path = dir.join(SECRET_FILE);
    let file = path.display();
    match read_trusted(&path, secret::FILE_LEN as u64).map(|bytes| KeySecret::from_file(&bytes)) {
        Ok(Some(secret)) => return secret,
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        unusable => {
            let why = match unusable {
                Err(e) => e.to_string(),
                _ => "not a key secret file".to_owned(),
            };
            error!(%file, "key secret unusable: {why}; it is left as it is, persisted limits start fresh and nothing is written: fix it, or remove it to start over");
            return KeySecret::draw();
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
    if !persists(config) || trusted_dir(&config.persist.dir).is_err() {
        return;
    }
    let now = limiters.clock().now().0;
    for (id, limit) in config.limits.iter_enumerated().filter(|(_, l)| l.persist) {
        let path = state_file(&config.persist.dir, &limit.name);
        let file = path.display();
        let bytes = match read_trusted(&path, limiters.state_bound(id)) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                info!(limit = %limit.name, %file, "no state file yet: the limit starts fresh");
                continue;
            }
            Err(e) => {
                warn!(limit = %limit.name, %file, "state file refused: {e}; the limit starts fresh");
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

/// The file of the counts the operator gave keys (`PUT /overrides`) in `dir`.
const OVERRIDES_FILE: &str = "overrides.json";

/// What the most counts the admin API gives take when saved (100,000 keys of a limit,
/// each named in at most 256 bytes, `admin::overrides`), with room: read no more.
const MAX_OVERRIDES_BYTES: u64 = 64 << 20;

/// The counts the operator gave keys, as last saved, when the file has a `persist:`
/// section: read under the same rules as the state files (sluicegate's own, its size
/// checked before a byte is read). `None`: none saved, or refused (logged).
pub fn read_overrides(config: &Config) -> Option<Vec<u8>> {
    if !config.persist.given || trusted_dir(&config.persist.dir).is_err() {
        return None;
    }
    let path = config.persist.dir.join(OVERRIDES_FILE);
    match read_trusted(&path, MAX_OVERRIDES_BYTES) {
        Ok(bytes) => Some(bytes),
        Err(e) if e.kind() == ErrorKind::NotFound => None,
        Err(e) => {
            warn!(file = %path.display(), "overrides file refused: {e}; no key starts with its own count");
            None
        }
    }
}

/// Saves the counts the operator gave keys (`bytes`, JSON), when the file has a
/// `persist:` section; an error says why they were not.
pub fn save_overrides(config: &Config, bytes: &[u8]) -> Result<(), String> {
    if !config.persist.given {
        return Ok(());
    }
    trusted_dir(&config.persist.dir)?;
    let path = config.persist.dir.join(OVERRIDES_FILE);
    write_atomic(&path, bytes).map_err(|e| format!("cannot save {}: {e}", path.display()))
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

/// Saves `secret` in `dir` unless its file holds it already: in a directory of
/// sluicegate's own, where no secret file is or where another secret is (one this run
/// did not read: a reload turned `persist` on or moved `persist.dir`; the state files
/// keyed with it are replaced by this run's). A file that cannot be used (unreadable,
/// not sluicegate's own, not a secret) is never replaced: the state files it keys would
/// be lost with it, so nothing is written until it is mended or removed.
fn ensure_secret(dir: &Path, secret: &KeySecret) -> std::io::Result<()> {
    trusted_dir(dir).map_err(|why| std::io::Error::new(ErrorKind::PermissionDenied, why))?;
    let path = dir.join(SECRET_FILE);
    let unusable = |why: String| {
        let file = path.display();
        std::io::Error::new(
            ErrorKind::InvalidData,
            format!("key secret {file} unusable ({why}): nothing written, so as not to replace it"),
        )
    };
    match read_trusted(&path, secret::FILE_LEN as u64).map(|bytes| KeySecret::from_file(&bytes)) {
        Ok(Some(held)) if held == *secret => Ok(()),
        Ok(Some(_)) => write_atomic(&path, &secret.to_file()),
        Err(e) if e.kind() == ErrorKind::NotFound => write_atomic(&path, &secret.to_file()),
        Ok(None) => Err(unusable("not a key secret file".into())),
        Err(e) => Err(unusable(e.to_string())),
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
