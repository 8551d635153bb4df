//! Global concurrency slots: a lease per request in a Redis sorted set, which lapses by
//! itself after `lease_ttl` unless renewed. Every live lease of this instance is renewed
//! every third of `lease_ttl` by one background task. A lease is released at the end
//! of the response (its last bytes wait for Redis to confirm, so that the client's next
//! request, through any instance, finds the slot free), or when the request's
//! `Permits` are dropped early; an instance that dies takes its slots with it for at
//! most `lease_ttl`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Waker};

use futures_util::future::join_all;
use tracing::debug;

use super::Store;
use super::script::{RENEW, ScriptCall};
use crate::ids::LimitId;

/// One request's slot in a global concurrency limit, released on drop.
pub struct Lease {
    pub(super) store: Arc<Store>,
    /// The limit whose slot it is.
    pub(super) limit: LimitId,
    pub(super) key: String,
    pub(super) id: String,
}

/// The live leases of this instance: id -> key.
#[derive(Default)]
pub struct Book(Mutex<HashMap<String, String>>);

impl Book {
    pub fn add(&self, id: &str, key: &str) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).insert(id.to_owned(), key.to_owned());
    }

    fn remove(&self, id: &str) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).remove(id);
    }

    fn snapshot(&self) -> Vec<(String, String)> {
        let book = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        book.iter().map(|(id, key)| (id.clone(), key.clone())).collect()
    }
}

impl Lease {
    /// The limit whose slot it is.
    pub fn limit(&self) -> LimitId {
        self.limit
    }

    /// Gives the slot back, and waits (at most a few timeouts) until Redis has.
    pub async fn release(mut self) {
        if let Some(release) = self.take() {
            release.await;
        }
    }

    /// The release, taken out of the lease (which then has nothing left to do on drop).
    fn take(&mut self) -> Option<impl Future<Output = ()> + Send + 'static> {
        if self.id.is_empty() {
            return None;
        }
        self.store.leases.remove(&self.id);
        let (store, key, id) = (Arc::clone(&self.store), std::mem::take(&mut self.key), std::mem::take(&mut self.id));
        Some(async move {
            let release = redis::cmd("ZREM").arg(&key).arg(&id).clone();
            if tokio::time::timeout(store.timeout * 4, store.connections.command(&release)).await.is_err() {
                debug!(key, "lease release timed out; it lapses by itself");
            }
        })
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // Outside a runtime (at exit) the lease simply lapses.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let Some(release) = self.take() else { return };
        // Polled once here, the ZREM is queued on the connection at once; the reply is
        // awaited in the background.
        let mut release = Box::pin(release);
        let _guard = runtime.enter();
        if release.as_mut().poll(&mut Context::from_waker(Waker::noop())).is_pending() {
            runtime.spawn(release);
        }
    }
}

/// Renews this instance's leases every third of their ttl while `store` lives.
pub async fn renew(store: Weak<Store>) {
    let Some(period) = store.upgrade().map(|s| s.lease_ttl / 3) else { return };
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(store) = store.upgrade() else { return };
        let ttl = store.lease_ttl.as_millis().to_string();
        let leases = store.leases.snapshot();
        let calls = leases.iter().map(|(id, key)| {
            let mut call = ScriptCall::new(&RENEW);
            call.key(&[key]).arg(&ttl).arg(id);
            let store = &store;
            async move { tokio::time::timeout(store.timeout * 4, store.connections.invoke(&call)).await }
        });
        let failed = join_all(calls).await.into_iter().filter(|r| !matches!(r, Ok(Ok(_)))).count();
        if failed > 0 {
            debug!(failed, of = leases.len(), "lease renewals failed; retried next period");
        }
    }
}
