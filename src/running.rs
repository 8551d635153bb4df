//! The running instance's state, shared by every connection, the admin listener and a
//! reload: the proxy of the configuration in force, where that configuration is read
//! from, and how the last reload went.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::sync::{Notify, watch};

use crate::proxy::Proxy;

/// A request takes the proxy current when it arrives and keeps it to its end, so a
/// reload cuts no request short.
pub struct Running {
    proxy: ArcSwap<Proxy>,
    /// Where the configuration is read from on a reload (`None`: no reloads).
    source: Option<PathBuf>,
    /// How many reloads there have been, and why the last one failed, if it did.
    reloads_done: watch::Sender<Reloads>,
    /// Reloads asked for through the admin API.
    reloads: Notify,
}

/// The reloads so far.
#[derive(Default)]
struct Reloads {
    count: u64,
    /// Why the last one failed (`None`: it succeeded, or there was none).
    failure: Option<String>,
}

impl Running {
    pub fn new(proxy: Proxy, source: Option<PathBuf>) -> Self {
        Running {
            proxy: ArcSwap::from_pointee(proxy),
            source,
            reloads_done: watch::Sender::new(Reloads::default()),
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
        self.reloads_done.send_modify(|r| {
            r.count += 1;
            r.failure = None;
        });
    }

    /// A reload failed for `why`; the running configuration stays.
    pub fn reload_failed(&self, why: String) {
        self.reloads_done.send_modify(|r| {
            r.count += 1;
            r.failure = Some(why);
        });
    }

    pub fn reload_failure(&self) -> Option<String> {
        self.reloads_done.borrow().failure.clone()
    }

    /// Asks the server to reload its configuration file (the admin API's `POST /reload`)
    /// and waits for the outcome: `Err` says why it failed (the running configuration
    /// stays). `None` when the configuration was not read from a file, or the server
    /// stopped first.
    pub async fn reload(&self) -> Option<Result<(), String>> {
        self.source.as_ref()?;
        let mut done = self.reloads_done.subscribe();
        let before = done.borrow_and_update().count;
        self.reloads.notify_one();
        let after = done.wait_for(|r| r.count > before).await.ok()?;
        Some(after.failure.clone().map_or(Ok(()), Err))
    }

    /// Completes when a reload is asked for through `request_reload`.
    pub async fn reload_requested(&self) {
        self.reloads.notified().await;
    }
}
