//! Decisions that wait for Redis together share one `DECIDE` call.
//!
//! Under load most of Redis's work per call is the call itself (running the script,
//! reading `TIME`, the round trip through the connection), not the limits it decides.
//! So a request's decision joins a queue; while fewer than `IN_FLIGHT_PER_CONNECTION`
//! calls per connection are under way, the queue is sent at once (alone when the proxy
//! is quiet: no wait is added), and every call that comes back sends what queued in the
//! meantime, up to `MAX_REQUESTS` decisions, in arrival order. The script decides them
//! one after another at one Redis instant, each all or nothing, as if they had come in
//! that order. Each request still waits for exactly one round trip: the one of the call
//! that carried it. On a cluster each request is its own call (the keys of different
//! requests lie in different slots).

use std::collections::VecDeque;
use std::pin::pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::script::{self, Parts, REPLY_FIELDS, ScriptCall};
use super::{Store, StoreError};

/// Calls under way at once per Redis connection: two keep Redis busy while one reply
/// travels back and the next call is built.
const IN_FLIGHT_PER_CONNECTION: usize = 2;
/// Decisions in one call at most: bounds how long Redis runs one script.
const MAX_REQUESTS: usize = 64;

/// One request's decision, waiting for a call.
struct Job {
    calls: Parts,
    cost: u64,
    /// When its request stops waiting: `redis.timeout` after it was queued.
    deadline: Instant,
    /// Where its part of the reply goes: Redis's time, then its windows' fields.
    reply: oneshot::Sender<Result<Vec<u64>, StoreError>>,
}

#[derive(Default)]
pub(super) struct Queue {
    state: Mutex<Waiting>,
}

#[derive(Default)]
struct Waiting {
    jobs: Vec<Job>,
    /// Calls being sent or awaited.
    in_flight: usize,
}

impl Queue {
    /// Queues `job`; true if the caller is to start a call (`Store::send_queued`).
    fn push(&self, job: Job, max_in_flight: usize) -> bool {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.jobs.push(job);
        let start = state.in_flight < max_in_flight;
        state.in_flight += usize::from(start);
        start
    }

    /// The next decisions to send, oldest first; `None` (and one call fewer under way)
    /// when none wait.
    fn next(&self) -> Option<Vec<Job>> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        // A request that stopped waiting (its client went away) must not spend quota in
        // Redis later, nor one whose deadline passed while earlier calls ran: dropping
        // its sender answers it `Timeout` (its limits' `on_store_error` decides).
        let now = Instant::now();
        state.jobs.retain(|job| !job.reply.is_closed() && job.deadline > now);
        if state.jobs.is_empty() {
            state.in_flight -= 1;
            return None;
        }
        let first = state.jobs.len().min(MAX_REQUESTS);
        let rest = state.jobs.split_off(first);
        Some(std::mem::replace(&mut state.jobs, rest))
    }
}

impl Store {
    /// Queues the decision of `calls` for `cost` units for a shared call, and waits for
    /// its part of the reply (the shape `invoke_decide` gives for one request), or for
    /// `redis.timeout`.
    pub(super) async fn decide_queued(self: &Arc<Self>, calls: Parts, cost: u64) -> Result<Vec<u64>, StoreError> {
        let (reply, answer) = oneshot::channel();
        let deadline = Instant::now() + self.timeout;
        let job = Job { calls, cost, deadline, reply };
        if self.queue.push(job, IN_FLIGHT_PER_CONNECTION * self.connections.len()) {
            // A task of its own: a request that goes away must not take the call the
            // others wait for with it.
            tokio::spawn(Arc::clone(self).send_queued());
        }
        // The sender is gone if the deadline passed before a call took the decision (or
        // the runtime is shutting down).
        answer.await.unwrap_or(Err(StoreError::Timeout(self.timeout)))
    }

    /// Sends what is queued, call after call, until nothing waits.
    ///
    /// Each request is answered by its deadline (`StoreError::Timeout`) with no timer of
    /// its own: the queue is in arrival order, so a call's requests reach their deadlines
    /// in order, and after those of every earlier call. One timer per call, set to the
    /// deadline of its first request still waiting, answers those whose time is up; the
    /// call is given up when none waits any more, by the deadline of its last request,
    /// so the next call starts in time for the requests queued behind.
    async fn send_queued(self: Arc<Self>) {
        while let Some(jobs) = self.queue.next() {
            let (call, windows) =
                script::decide_call(&self.specs, None, self.clock.now(), jobs.iter().map(|j| (j.cost, &j.calls)));
            let mut waiting: VecDeque<(Instant, usize, oneshot::Sender<_>)> = jobs
                .into_iter()
                .map(|j| (j.deadline, j.calls.iter().map(|c| self.spec(c.limit).windows()).sum(), j.reply))
                .collect();
            // Windows of the requests already answered `Timeout`: the reply's first ones.
            let mut answered = 0;
            let mut sent = pin!(self.invoke_decide(&call, windows));
            let reply = loop {
                let Some(&(deadline, ..)) = waiting.front() else { break None };
                if let Ok(reply) = tokio::time::timeout_at(deadline, sent.as_mut()).await {
                    break Some(reply);
                }
                let now = Instant::now();
                while waiting.front().is_some_and(|(deadline, ..)| *deadline <= now) {
                    let (_, windows, reply) = waiting.pop_front().expect("a request is waiting");
                    answered += windows;
                    // A request that stopped waiting dropped its receiver: nothing to do.
                    let _ = reply.send(Err(StoreError::Timeout(self.timeout)));
                }
            };
            match reply {
                Some(Ok(reply)) => {
                    // The length was checked: each request's windows are there, in order.
                    let (time, fields) = (&reply[..2], &reply[2..]);
                    let mut at = answered;
                    for (_, windows, reply) in waiting {
                        let mut part = Vec::with_capacity(2 + windows * REPLY_FIELDS);
                        part.extend_from_slice(time);
                        part.extend_from_slice(&fields[at * REPLY_FIELDS..(at + windows) * REPLY_FIELDS]);
                        at += windows;
                        let _ = reply.send(Ok(part));
                    }
                }
                Some(Err(e)) => {
                    for (_, _, reply) in waiting {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
                None => {}
            }
        }
    }

    /// Runs a `DECIDE` call that decides `windows` windows, and checks its reply's length.
    pub(super) async fn invoke_decide(&self, call: &ScriptCall, windows: usize) -> Result<Vec<u64>, StoreError> {
        self.stats.script_calls.fetch_add(1, Ordering::Relaxed);
        match self.connections.invoke(call).await? {
            redis::Value::BulkString(packed) => unpack(&packed, windows),
            _ => Err(StoreError::Reply(0)),
        }
    }
}

/// The integers of a `DECIDE` reply that decided `windows` windows (little-endian, 8
/// bytes each), if it has their number and none is negative.
fn unpack(packed: &[u8], windows: usize) -> Result<Vec<u64>, StoreError> {
    let integers = packed.chunks_exact(8).map(|i| i64::from_le_bytes(i.try_into().expect("8 bytes")));
    let reply: Vec<u64> = integers.map_while(|i| u64::try_from(i).ok()).collect();
    if packed.len() != (2 + windows * REPLY_FIELDS) * 8 || reply.len() * 8 != packed.len() {
        return Err(StoreError::Reply(packed.len() / 8));
    }
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::sync::oneshot;
    use tokio::time::Instant;

    use super::{Job, MAX_REQUESTS, Queue, unpack};
    use crate::store::StoreError;

    /// A waiting job, and the receiver whose dropping says its request stopped waiting.
    fn waiting(cost: u64) -> (Job, oneshot::Receiver<Result<Vec<u64>, StoreError>>) {
        let (reply, answer) = oneshot::channel();
        let deadline = Instant::now() + Duration::from_secs(60);
        (Job { calls: Default::default(), cost, deadline, reply }, answer)
    }

    fn costs(jobs: &[Job]) -> Vec<u64> {
        jobs.iter().map(|j| j.cost).collect()
    }

    #[test]
    fn calls_start_up_to_the_cap_and_take_what_queued_in_order() {
        let queue = Queue::default();
        let mut answers = Vec::new();
        let started: Vec<bool> = (1..=4)
            .map(|cost| {
                let (job, answer) = waiting(cost);
                answers.push(answer);
                queue.push(job, 2)
            })
            .collect();
        assert_eq!(started, [true, true, false, false], "two calls under way at most");
        // The first call takes everything queued by the time it runs, oldest first.
        assert_eq!(costs(&queue.next().unwrap()), [1, 2, 3, 4]);
        // Nothing left: each call ends, and a new push may start one again.
        assert!(queue.next().is_none());
        assert!(queue.next().is_none());
        let (job, _answer) = waiting(5);
        assert!(queue.push(job, 2));
    }

    #[test]
    fn a_call_carries_at_most_max_requests() {
        let queue = Queue::default();
        let answers: Vec<_> = (0..MAX_REQUESTS as u64 + 6)
            .map(|cost| {
                let (job, answer) = waiting(cost);
                queue.push(job, 1);
                answer
            })
            .collect();
        assert_eq!(queue.next().unwrap().len(), MAX_REQUESTS);
        assert_eq!(costs(&queue.next().unwrap()), (MAX_REQUESTS as u64..MAX_REQUESTS as u64 + 6).collect::<Vec<_>>());
        assert!(queue.next().is_none());
        drop(answers);
    }

    #[test]
    fn a_decision_whose_request_stopped_waiting_is_not_sent() {
        let queue = Queue::default();
        let (first, gone) = waiting(1);
        let (second, kept) = waiting(2);
        queue.push(first, 1);
        queue.push(second, 1);
        drop(gone);
        assert_eq!(costs(&queue.next().unwrap()), [2]);
        drop(kept);
        let (third, gone) = waiting(3);
        queue.push(third, 1);
        drop(gone);
        assert!(queue.next().is_none(), "only a request that gave up was queued");
    }

    #[test]
    fn a_reply_unpacks_only_with_the_integers_it_should_have() {
        let packed = |integers: &[i64]| integers.iter().flat_map(|i| i.to_le_bytes()).collect::<Vec<u8>>();
        let one_window = [1_700_000_000, 250_000, 1, 0, 99, 1_000_000_000, 1_500, 0];
        assert_eq!(unpack(&packed(&one_window), 1).unwrap(), one_window.map(|i| i as u64));
        assert!(matches!(unpack(&packed(&one_window), 2), Err(StoreError::Reply(8))), "a window missing");
        assert!(matches!(unpack(&packed(&one_window)[..60], 1), Err(StoreError::Reply(7))), "a cut integer");
        let negative = [1, 2, 1, 0, -1, 0, 0, 0];
        assert!(matches!(unpack(&packed(&negative), 1), Err(StoreError::Reply(8))), "a negative field");
    }

    #[test]
    fn a_decision_whose_deadline_passed_in_the_queue_is_not_sent_and_times_out() {
        let queue = Queue::default();
        let (mut late, mut answer) = waiting(1);
        late.deadline = Instant::now();
        let (kept, _answer) = waiting(2);
        queue.push(late, 1);
        queue.push(kept, 1);
        assert_eq!(costs(&queue.next().unwrap()), [2]);
        assert!(answer.try_recv().is_err_and(|e| e == oneshot::error::TryRecvError::Closed), "told at once");
    }
}
