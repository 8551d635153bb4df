//! Which worker thread the code at hand runs on. With more than one worker, each runs a
//! runtime of its own and serves the connections handed to it for their whole life (as
//! nginx's worker processes do; `server::workers`): a connection's tasks, its sockets'
//! readiness and its upstream connections stay on one thread. State kept per worker
//! (the upstream pool's idle connections) is found by this index.

use std::cell::Cell;

thread_local! {
    /// Set once by a worker thread as it starts; 0 everywhere else.
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

/// The index of the worker this thread is (0 on any other thread, and with one worker).
pub fn index() -> usize {
    INDEX.with(Cell::get)
}

/// Marks this thread as worker `index`.
pub fn enter(index: usize) {
    INDEX.with(|i| i.set(index));
}

/// How many workers serve: `server.workers`, else one per core.
pub fn count(configured: Option<usize>) -> usize {
    configured.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from)).max(1)
}
