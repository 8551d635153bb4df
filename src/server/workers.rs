//! The worker threads that serve connections when there is more than one worker. Each
//! runs a current-thread runtime of its own (its own event loop and timers) and serves
//! every connection handed to it for the connection's whole life, as nginx's worker
//! processes do. tokio's multi-thread runtime (one shared event loop, tasks stolen
//! between threads) cost a forwarded request about a sixth more CPU with two workers
//! than with one, measured: a connection's task moved between cores, its responses woke
//! it across threads, and memory freed on another thread than the one that allocated it
//! (docs/performance.md). What the workers share is the proxy itself: limits, metrics,
//! the upstream pool (which keeps each worker's connections apart, `crate::worker`).

use std::io;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

pub struct Workers {
    handles: Vec<Handle>,
    /// The worker the next connection goes to: each in turn.
    next: usize,
    /// Dropped with the `Workers`, each worker's runtime ends, and with it whatever it
    /// still serves.
    _stops: Vec<oneshot::Sender<()>>,
}

impl Workers {
    /// Starts `count` worker threads, each with its runtime.
    pub fn start(count: usize) -> io::Result<Workers> {
        let (mut handles, mut stops) = (Vec::with_capacity(count), Vec::with_capacity(count));
        for index in 0..count {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let (stop, stopped) = oneshot::channel::<()>();
            handles.push(runtime.handle().clone());
            stops.push(stop);
            std::thread::Builder::new().name(format!("sg-worker-{index}")).spawn(move || {
                crate::worker::enter(index);
                runtime.block_on(async move { _ = stopped.await });
            })?;
        }
        Ok(Workers { handles, next: 0, _stops: stops })
    }

    /// The worker the next connection goes to: each in turn. Entered (`Handle::enter`),
    /// the sockets made and tasks spawned are its.
    pub fn next(&mut self) -> &Handle {
        let handle = &self.handles[self.next];
        self.next = (self.next + 1) % self.handles.len();
        handle
    }
}
