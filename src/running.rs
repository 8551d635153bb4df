//! The running instance's state, shared by every connection, the admin listener and a
//! reload: the proxy of the configuration in force, where that configuration is read
//! from, and how the last reload went.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use tokio::sync::Notify;

use crate::proxy::Proxy;

/// A request takes the proxy current when it arrives and keeps it to its end, so a
/// reload cuts no request short.
pub struct Running {
    proxy: ArcSwap<Proxy>,
    /// Where the configuration is read from on a reload (`None`: no reloads).
    source: Option<PathBuf>,
    /// Why the last reload failed, if it did (cleared by a good one).
    reload_failure: Mutex<Option<String>>,
    /// Reloads asked for through the admin API.
    reloads: Notify,
}

impl Running {
    pub fn new(proxy: Proxy, source: Option<PathBuf>) -> Self {
        Running {
            proxy: ArcSwap::from_pointee(proxy),
            source,
            reload_failure: Mutex::new(None),
            reloads: Notify::new(),
        }
    }

    pub fn proxy(&self) -> Arc<Proxy> {
        self.proxy.load_full()
    }

    /// The file the configuration is read from again on a reload, if any.
    pub fn source(&self) -> Option<&Path> {
        self.source.as_deref()
    }

    /// A reload succeeded: `proxy` serves the requests from now on.
    pub fn reloaded(&self, proxy: Proxy) {
        self.proxy.store(Arc::new(proxy));
        *self.failure() = None;
    }

    /// A reload failed for `why`; the running configuration stays.
    pub fn reload_failed(&self, why: String) {
        *self.failure() = Some(why);
    }

    pub fn reload_failure(&self) -> Option<String> {
        self.failure().clone()
    }

    fn failure(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        // A message, valid whatever a panicking holder left.
        self.reload_failure.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Asks the server to reload its configuration file (the admin API's `POST /reload`);
    /// false when it was not read from a file.
    pub fn request_reload(&self) -> bool {
        self.reloads.notify_one();
        self.source.is_some()
    }

    /// Completes when a reload is asked for through `request_reload`.
    pub async fn reload_requested(&self) {
        self.reloads.notified().await;
    }
}
