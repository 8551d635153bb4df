//! Whether Redis answers, found out in the background: while the circuit breaker is
//! open, every `breaker_cooldown`, and once when the store starts (a start or a reload).
//! A probe is a `PING` on every connection; its answer closes the breaker, its failure
//! opens it. No request waits for a probe, and none probes: while the breaker is open,
//! requests are decided by `on_store_error` at once, and an instance `/readyz` took out
//! of rotation (it gets no requests) still finds Redis back.
//!
//! Why not a request: after an outage the connection is broken, and the first command on
//! it fails at once while it starts the reconnection. A request that probed failed there
//! and kept the breaker open for another cooldown, so that Redis's return was seen one to
//! two cooldowns late (1–2 s by default). A probe asks twice, the second time on the new
//! connection, so Redis decides again at most one `breaker_cooldown` (plus the
//! reconnection's round trips) after it answers again.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError, Weak};
use std::time::Duration;

use tokio::time::{Instant, MissedTickBehavior};
use tracing::{info, warn};

use super::breaker::Change;
use super::{Store, StoreError};
use crate::clock::Nanos;

/// Where Redis stands for this instance (`/readyz`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reach {
    /// Nothing has answered yet (the start-up probe is under way).
    Connecting,
    /// The breaker is closed: requests are decided by Redis.
    Reachable,
    /// The breaker is open since `since` (limiter clock), `lasting` so far: requests are
    /// decided by `on_store_error`; `error` is the last failure's; probed every `every`.
    Unreachable { since: Nanos, lasting: Duration, error: String, every: Duration },
}

impl Store {
    /// Probes Redis now, in the background: its answer says it is reachable, its silence
    /// opens the breaker (and the probes go on until it answers). Called once the store
    /// serves requests (within a Tokio runtime).
    pub fn watch(self: &Arc<Self>) {
        self.start_probing(Duration::ZERO);
    }

    /// Where Redis stands for this instance.
    pub fn reach(&self) -> Reach {
        match self.breaker.open_since() {
            Some(since) => Reach::Unreachable {
                since,
                lasting: self.clock.now().since(since),
                error: self.last_error(),
                every: self.cooldown,
            },
            None if !self.answered.load(Ordering::Acquire) => Reach::Connecting,
            None => Reach::Reachable,
        }
    }

    /// Redis answered a call or a probe.
    pub(super) fn answered(&self) {
        if !self.answered.load(Ordering::Relaxed) {
            self.answered.store(true, Ordering::Release);
        }
        if self.breaker.succeeded() == Change::Closed {
            info!("Redis answers again: global limits are decided by Redis");
        }
    }

    /// The breaker opened (or the store starts): probes start after `first`, unless a
    /// prober runs already.
    pub(super) fn start_probing(self: &Arc<Self>, first: Duration) {
        if !self.probing.swap(true, Ordering::AcqRel) {
            tokio::spawn(probe(Arc::downgrade(self), first));
        }
    }

    /// The last failure's message, for `/readyz`.
    pub(super) fn last_error(&self) -> String {
        self.last_error.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    pub(super) fn remember_error(&self, error: &StoreError) {
        *self.last_error.lock().unwrap_or_else(PoisonError::into_inner) = error.to_string();
    }
}

/// Probes `store` after `first`, then every `breaker_cooldown` while its breaker is
/// open; ends when Redis answers with the breaker closed, or when the store is gone (a
/// reload replaced it and its last request ended).
async fn probe(store: Weak<Store>, first: Duration) {
    let Some(every) = store.upgrade().map(|s| s.cooldown) else { return };
    // At a fixed rate: a probe that waits (Redis paused) does not push the next one back.
    let mut ticks = tokio::time::interval_at(Instant::now() + first, every);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(store) = store.upgrade() else { return };
        let answer = tokio::time::timeout(store.probe_deadline, store.connections.ping()).await;
        match answer.map_err(|_| StoreError::Timeout(store.probe_deadline)).and_then(|r| Ok(r?)) {
            Ok(()) => {
                store.answered();
                store.probing.store(false, Ordering::Release);
                // Opened again meanwhile, and no other prober took over: go on.
                if !store.breaker.is_open() || store.probing.swap(true, Ordering::AcqRel) {
                    return;
                }
            }
            Err(e) => {
                store.remember_error(&e);
                if store.breaker.open(store.clock.now().0) == Change::Opened {
                    warn!(error = %e, every = ?every,
                        "Redis does not answer: circuit breaker open, global limits use on_store_error until a probe succeeds");
                }
            }
        }
    }
}
