//! The running instance's state, shared by every connection, the admin listener and a
//! reload: the proxy of the configuration in force, where that configuration is read
//! from, since when it runs, and how the last reloads went.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Instant, SystemTime};

use arc_swap::ArcSwap;
use tokio::sync::{Notify, watch};

use crate::candidate::Candidate;
use crate::proxy::Proxy;

/// A request takes the proxy current when it arrives and keeps it to its end, so a
/// reload cuts no request short.
pub struct Running {
    proxy: ArcSwap<Proxy>,
    /// Where the configuration is read from on a reload (`None`: no reloads); a
    /// promoted candidate's file from its promotion on.
    source: Mutex<Option<PathBuf>>,
    /// A candidate asked to be promoted, for the next reload to take in place of the file.
    promoting: Mutex<Option<Arc<Candidate>>>,
    /// How many reloads there have been, and why the last one failed, if it did.
    reloads_done: watch::Sender<Reloads>,
    /// Reloads asked for through the admin API.
    reloads: Notify,
    started: Instant,
}

/// The reloads so far.
#[derive(Default)]
struct Reloads {
    count: u64,
    /// The last one, if any.
    last: Option<Reload>,
    /// The last one that failed, if any (later ones may have succeeded).
    last_failed: Option<Reload>,
}

/// What asked for a reload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReloadCause {
    /// SIGHUP (`kill -HUP`, `systemctl reload`).
    Signal,
    /// The admin API's `POST /reload` (`sluicegate reload` among others).
    AdminApi,
    /// The admin API's `POST /candidate/promote` (`sluicegate promote`).
    Promote,
}

impl ReloadCause {
    pub fn as_str(self) -> &'static str {
        match self {
            ReloadCause::Signal => "SIGHUP",
            ReloadCause::AdminApi => "POST /reload",
            ReloadCause::Promote => "POST /candidate/promote",
        }
    }
}

/// One reload: when, what asked for it, and why it failed, if it did.
#[derive(Clone, Debug)]
pub struct Reload {
    pub at: SystemTime,
    pub cause: ReloadCause,
    /// `None`: it succeeded.
    pub failure: Option<String>,
}

impl Running {
    pub fn new(proxy: Proxy, source: Option<PathBuf>) -> Self {
        Running {
            proxy: ArcSwap::from_pointee(proxy),
            source: Mutex::new(source),
            promoting: Mutex::new(None),
            reloads_done: watch::Sender::new(Reloads::default()),
            reloads: Notify::new(),
            started: Instant::now(),
        }
    }

    /// When this instance started serving.
    pub fn started(&self) -> Instant {
        self.started
    }

    pub fn proxy(&self) -> Arc<Proxy> {
        self.proxy.load_full()
    }

    /// The file the configuration is read from again on a reload, if any.
    pub fn source(&self) -> Option<PathBuf> {
        self.source.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The candidate a promotion asked for, taken by the reload that promotes it.
    pub fn take_promoting(&self) -> Option<Arc<Candidate>> {
        self.promoting.lock().unwrap_or_else(PoisonError::into_inner).take()
    }

    /// A promotion succeeded: the configuration is read from `file` from now on.
    pub fn promoted(&self, file: PathBuf) {
        *self.source.lock().unwrap_or_else(PoisonError::into_inner) = Some(file);
    }

    /// A reload that `cause` asked for succeeded: `proxy` serves the requests from now on.
    pub fn reloaded(&self, proxy: Proxy, cause: ReloadCause) {
        self.proxy.store(Arc::new(proxy));
        self.reloads_done.send_modify(|r| {
            r.count += 1;
            r.last = Some(Reload { at: SystemTime::now(), cause, failure: None });
        });
    }

    /// A reload that `cause` asked for failed for `why`; the running configuration stays.
    pub fn reload_failed(&self, why: String, cause: ReloadCause) {
        let failed = Reload { at: SystemTime::now(), cause, failure: Some(why) };
        self.reloads_done.send_modify(|r| {
            r.count += 1;
            r.last = Some(failed.clone());
            r.last_failed = Some(failed);
        });
    }

    /// Why the last reload failed, if it did.
    pub fn reload_failure(&self) -> Option<String> {
        self.reloads_done.borrow().last.as_ref().and_then(|r| r.failure.clone())
    }

    /// The last reload, and the last that failed (the same when the last one failed).
    pub fn reloads(&self) -> (Option<Reload>, Option<Reload>) {
        let reloads = self.reloads_done.borrow();
        (reloads.last.clone(), reloads.last_failed.clone())
    }

    /// Asks the server to reload its configuration file (the admin API's `POST /reload`)
    /// and waits for the outcome: `Err` says why it failed (the running configuration
    /// stays). `None` when the configuration was not read from a file, or the server
    /// stopped first.
    pub async fn reload(&self) -> Option<Result<(), String>> {
        self.source()?;
        self.reload_now().await
    }

    /// Asks the server to make `candidate` the running configuration, as a reload does,
    /// and waits for the outcome (`Err`: why not; the running configuration stays).
    pub async fn promote(&self, candidate: Arc<Candidate>) -> Option<Result<(), String>> {
        *self.promoting.lock().unwrap_or_else(PoisonError::into_inner) = Some(candidate);
        self.reload_now().await
    }

    async fn reload_now(&self) -> Option<Result<(), String>> {
        let mut done = self.reloads_done.subscribe();
        let before = done.borrow_and_update().count;
        self.reloads.notify_one();
        let after = done.wait_for(|r| r.count > before).await.ok()?;
        Some(after.last.as_ref().and_then(|r| r.failure.clone()).map_or(Ok(()), Err))
    }

    /// Completes when a reload is asked for through `request_reload`.
    pub async fn reload_requested(&self) {
        self.reloads.notified().await;
    }
}
