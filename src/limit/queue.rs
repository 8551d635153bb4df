//! A concurrency limit's waiting room (`queue:`): a request the limit has no slot for
//! waits for one instead of being refused at once.
//!
//! - **One room per key** of the limit (its slots are the key's): at most `max` requests
//!   wait in it, each for `max_wait` at most.
//! - **Hand-off**: a slot given back while requests wait is not freed but handed to the
//!   next of them (`Rooms::hand_off`), under the room's lock, so that a newcomer cannot
//!   take it first: while a room holds waiters its key's slots are all held, and the
//!   gate's own decision refuses newcomers, who then queue behind. A newcomer that finds
//!   a slot freed between its refusal and its turn at the room takes it (`join`).
//! - **Fair by flow**: the waiters of a room are grouped by the flow `fair_by` tells them
//!   apart by (the client's address unless said otherwise); slots go round the flows,
//!   one request of each in turn (deficit round robin with a quantum of one request:
//!   every request holds one slot, whatever it weighs). A client with ten times the
//!   others' requests waiting gets one slot in each round, as each of them does. Round
//!   robin over exact flows rather than APF's shuffle-sharded queues: a room's flows are
//!   few (bounded by `max`), each is found by hash, and no two flows ever share a queue.
//! - **Full**: a newcomer meeting a full room pushes out the newest waiter of the longest
//!   flow, if that flow would still be longer than the newcomer's; otherwise it is
//!   refused. A heavy client fills the room only while nobody else wants it.
//! - **Retry-After from the room**: the mean time between hand-offs (a moving average)
//!   times the requests ahead in the round; `max_wait` while no hand-off was seen.
//! - **Leaving**: a waiter whose request ends (the client closed, reset the stream or
//!   cancelled the call) leaves the room when its `Ticket` drops; a slot sent to it in
//!   the meantime goes back, and on to the next, when its `Handed` drops.
//!
//! Written here rather than taken from a crate: the semaphores and fair queues of crates
//! (tokio's `Semaphore`, async-lock) are FIFO over one queue, with no flows, no bound
//! with push-out, and no hand-off into a key's table of slots.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;

use super::{LimitId, Limiters};
use crate::clock::Nanos;
use crate::policy::key::{KeyHash, KeySpec};

/// Weight of a new gap between hand-offs in their moving average.
const GAP_WEIGHT: f64 = 0.2;

/// A limit's queue: its bounds and its rooms.
pub(crate) struct Queue {
    pub(crate) max: usize,
    pub(crate) max_wait: Duration,
    pub(crate) fair_by: KeySpec,
    /// Kept by a reload that keeps the limit's state: its waiters wait on.
    pub(crate) rooms: Arc<Rooms>,
}

impl Queue {
    pub(crate) fn new(queue: &crate::policy::Queue) -> Self {
        Queue { max: queue.max, max_wait: queue.max_wait, fair_by: queue.fair_by.clone(), rooms: Arc::default() }
    }
}

/// The rooms of a limit's keys that have requests waiting, and what became of them.
#[derive(Default)]
pub(crate) struct Rooms {
    rooms: Mutex<Hall>,
    next_id: AtomicU64,
    /// Requests waiting now, in every room.
    waiting: AtomicU64,
    ended: [AtomicU64; QueueEnd::ALL.len()],
}

/// The rooms by key, and how fast the limit hands slots on.
#[derive(Default)]
struct Hall {
    rooms: HashMap<u64, Room>,
    /// When a slot was last handed on (ns), in any room, and the mean gap between
    /// hand-offs.
    last: Option<u64>,
    gap: Option<f64>,
}

impl Hall {
    /// The room of `key`, made if it has none.
    fn room(&mut self, key: u64) -> &mut Room {
        self.rooms.entry(key).or_default()
    }

    /// Removes the room of `key` if nobody waits in it.
    fn tidy(&mut self, key: u64) {
        if self.rooms.get(&key).is_some_and(|r| r.waiting == 0) {
            self.rooms.remove(&key);
        }
    }

    /// A slot was handed on at `now`: the gap since the last is averaged in.
    fn handed(&mut self, now: Nanos) {
        if let Some(last) = self.last {
            let gap = now.0.saturating_sub(last) as f64;
            self.gap = Some(self.gap.map_or(gap, |mean| mean + GAP_WEIGHT * (gap - mean)));
        }
        self.last = Some(now.0);
    }

    /// When a slot is expected for the request `position` in its room's round: that many
    /// mean gaps between the limit's hand-offs, times the rooms they go round (each
    /// room's keys hand their own slots on, taken here to be as fast as the others);
    /// `max_wait` before a gap was seen.
    fn estimate(&self, max_wait: Duration, position: usize) -> Duration {
        let rooms = self.rooms.len().max(1) as f64;
        self.gap.map_or(max_wait, |gap| Duration::from_nanos((gap * position as f64 * rooms) as u64))
    }
}

/// The requests waiting for one key's slots.
#[derive(Default)]
struct Room {
    /// The waiters of each flow, oldest first.
    flows: HashMap<u64, VecDeque<Waiter>>,
    /// The flows with waiters, in the order they are served.
    ring: VecDeque<u64>,
    waiting: usize,
}

struct Waiter {
    id: u64,
    to: oneshot::Sender<Handed>,
}

/// How a request's wait in a queue ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueEnd {
    /// A slot was handed to it (or free when it came).
    Served,
    /// The room was full, and its flow was no shorter than any other.
    Full,
    /// It waited `max_wait`.
    TimedOut,
    /// A request of a shorter flow took its place in a full room.
    PushedOut,
    /// Its client went away while it waited.
    Left,
}

impl QueueEnd {
    pub const ALL: [QueueEnd; 5] =
        [QueueEnd::Served, QueueEnd::Full, QueueEnd::TimedOut, QueueEnd::PushedOut, QueueEnd::Left];

    /// Its name wherever it is named: the access log's `queue`, the metrics' `outcome`.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueEnd::Served => "served",
            QueueEnd::Full => "full",
            QueueEnd::TimedOut => "timed_out",
            QueueEnd::PushedOut => "pushed_out",
            QueueEnd::Left => "left",
        }
    }
}

/// A slot of a concurrency limit handed to a waiting request (or taken by one that found
/// it free): given back, and on to the next waiter, when dropped unless `take`n.
pub struct Handed {
    limiters: Option<Arc<Limiters>>,
    pub limit: LimitId,
    pub key: KeyHash,
}

impl Handed {
    pub(crate) fn new(limiters: Arc<Limiters>, limit: LimitId, key: KeyHash) -> Self {
        Handed { limiters: Some(limiters), limit, key }
    }

    /// The slot, to be held by the request's permits (which give it back).
    pub fn take(mut self) -> (Arc<Limiters>, LimitId, KeyHash) {
        let limiters = self.limiters.take().expect("a slot not yet taken");
        (limiters, self.limit, self.key)
    }
}

impl Drop for Handed {
    fn drop(&mut self) {
        if let Some(limiters) = self.limiters.take() {
            limiters.release(self.limit, self.key);
        }
    }
}

/// What a request the limit refused for want of a slot finds at its queue.
pub enum Queued {
    /// A slot was freed meanwhile: it is the request's.
    Taken(Handed),
    /// It waits for one.
    Waiting(Ticket),
    /// It cannot wait (`QueueEnd::Full`); a slot is expected after `retry_after`.
    Refused { end: QueueEnd, retry_after: Duration },
}

/// What a request finds of its key's slots as it comes to the room (`Rooms::join`).
pub(crate) enum Take {
    /// One was free: it holds it now.
    Slot(Handed),
    /// All are held: it may wait.
    Busy,
    /// None can be held: the key is new and the limit's table is full.
    NoRoom,
}

/// A request's place in a room; it leaves the room when dropped.
pub struct Ticket {
    rooms: Arc<Rooms>,
    key: u64,
    flow: u64,
    id: u64,
    to: oneshot::Receiver<Handed>,
    /// Requests ahead of it in the round when it came, itself included.
    pub position: usize,
    max_wait: Duration,
    done: bool,
}

impl Ticket {
    /// Waits for a slot, `max_wait` at most: the slot, or how the wait ended with the
    /// time after which a slot is expected.
    pub async fn wait(mut self) -> Result<Handed, (QueueEnd, Duration)> {
        let ended = tokio::time::timeout(self.max_wait, &mut self.to).await;
        self.done = true;
        match ended {
            Ok(Ok(handed)) => {
                self.rooms.count(QueueEnd::Served);
                Ok(handed)
            }
            Ok(Err(_)) => {
                let retry_after = self.rooms.estimate(self.key, self.max_wait, None);
                self.rooms.count(QueueEnd::PushedOut);
                Err((QueueEnd::PushedOut, retry_after))
            }
            Err(_) => {
                let position = self.rooms.leave(self.key, self.flow, self.id);
                // Handed a slot as its time ran out: it is served.
                if position.is_none()
                    && let Ok(handed) = self.to.try_recv()
                {
                    self.rooms.count(QueueEnd::Served);
                    return Ok(handed);
                }
                let retry_after = self.rooms.estimate(self.key, self.max_wait, position);
                self.rooms.count(QueueEnd::TimedOut);
                Err((QueueEnd::TimedOut, retry_after))
            }
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.done && self.rooms.leave(self.key, self.flow, self.id).is_some() {
            self.rooms.count(QueueEnd::Left);
        }
    }
}

impl Rooms {
    fn lock(&self) -> MutexGuard<'_, Hall> {
        self.rooms.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn count(&self, end: QueueEnd) {
        let i = QueueEnd::ALL.iter().position(|&e| e == end).unwrap_or(0);
        self.ended[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Requests waiting now.
    pub(crate) fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Waits that ended so, since start.
    pub(crate) fn ended(&self, end: QueueEnd) -> u64 {
        let i = QueueEnd::ALL.iter().position(|&e| e == end).unwrap_or(0);
        self.ended[i].load(Ordering::Relaxed)
    }

    /// Joins the room of `key` in flow `flow`, unless `take` finds a slot free (called
    /// under the room's lock, so that no slot is given back unseen meanwhile).
    pub(crate) fn join(
        self: &Arc<Self>,
        queue: &Queue,
        key: KeyHash,
        flow: u64,
        take: impl FnOnce() -> Take,
    ) -> Queued {
        let mut hall = self.lock();
        let room = hall.room(key.0);
        let refused = match room.waiting {
            0 => match take() {
                Take::Slot(handed) => {
                    hall.tidy(key.0);
                    drop(hall);
                    self.count(QueueEnd::Served);
                    return Queued::Taken(handed);
                }
                Take::Busy => false,
                Take::NoRoom => true,
            },
            waiting if waiting >= queue.max => {
                let pushed = room.push_out(flow);
                if pushed {
                    self.waiting.fetch_sub(1, Ordering::Relaxed);
                }
                !pushed
            }
            _ => false,
        };
        if refused {
            let position = room.next_of(flow);
            let retry_after = hall.estimate(queue.max_wait, position);
            hall.tidy(key.0);
            drop(hall);
            self.count(QueueEnd::Full);
            return Queued::Refused { end: QueueEnd::Full, retry_after };
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (to, from) = oneshot::channel();
        match room.flows.entry(flow) {
            Entry::Occupied(mut e) => e.get_mut().push_back(Waiter { id, to }),
            Entry::Vacant(e) => {
                e.insert(VecDeque::from([Waiter { id, to }]));
                room.ring.push_back(flow);
            }
        }
        room.waiting += 1;
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let position = room.position(flow);
        Queued::Waiting(Ticket {
            rooms: Arc::clone(self),
            key: key.0,
            flow,
            id,
            to: from,
            position,
            max_wait: queue.max_wait,
            done: false,
        })
    }

    /// Hands the slot `key` gives back in `limit` to its next waiter, if one waits; else
    /// `free`s it (under the room's lock: a newcomer joining meanwhile sees it free).
    pub(crate) fn hand_off(&self, limiters: &Arc<Limiters>, limit: LimitId, key: KeyHash, free: impl FnOnce()) {
        let mut hall = self.lock();
        if let Some(room) = hall.rooms.get_mut(&key.0) {
            while let Some(waiter) = room.next() {
                self.waiting.fetch_sub(1, Ordering::Relaxed);
                let handed = Handed { limiters: Some(Arc::clone(limiters)), limit, key };
                match waiter.to.send(handed) {
                    Ok(()) => {
                        hall.handed(limiters.clock().now());
                        hall.tidy(key.0);
                        return;
                    }
                    // Its request is ending: the slot is not its to give back.
                    Err(mut handed) => handed.limiters = None,
                }
            }
            hall.tidy(key.0);
        }
        free();
    }

    /// Takes waiter `id` of `flow` out of the room of `key`: its position then (`None`:
    /// it was no longer there, handed a slot or pushed out).
    fn leave(&self, key: u64, flow: u64, id: u64) -> Option<usize> {
        let mut hall = self.lock();
        let room = hall.rooms.get_mut(&key)?;
        let at = room.flows.get(&flow)?.iter().position(|w| w.id == id)?;
        let position = room.position_at(at);
        let waiters = room.flows.get_mut(&flow)?;
        waiters.remove(at);
        if waiters.is_empty() {
            room.flows.remove(&flow);
            room.ring.retain(|&f| f != flow);
        }
        room.waiting -= 1;
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        hall.tidy(key);
        Some(position)
    }

    /// When a slot of `key` is expected for a request `position` in the round (`None`:
    /// at the end of it).
    fn estimate(&self, key: u64, max_wait: Duration, position: Option<usize>) -> Duration {
        let hall = self.lock();
        // At the end of the round by default.
        let position = position.unwrap_or_else(|| hall.rooms.get(&key).map_or(1, |room| room.waiting + 1));
        hall.estimate(max_wait, position)
    }

    /// Where a request of `flow` would stand in the room of `key` (`None`: nobody waits).
    pub(crate) fn would_stand(&self, key: KeyHash, flow: u64) -> Option<(usize, usize)> {
        let hall = self.lock();
        let room = hall.rooms.get(&key.0).filter(|r| r.waiting > 0)?;
        Some((room.waiting, room.next_of(flow)))
    }
}

impl Room {
    /// The next waiter in the round: the oldest of the flow whose turn it is.
    fn next(&mut self) -> Option<Waiter> {
        while let Some(flow) = self.ring.pop_front() {
            let Some(waiters) = self.flows.get_mut(&flow) else { continue };
            let waiter = waiters.pop_front();
            if waiters.is_empty() {
                self.flows.remove(&flow);
            } else {
                self.ring.push_back(flow);
            }
            if let Some(waiter) = waiter {
                self.waiting -= 1;
                return Some(waiter);
            }
        }
        None
    }

    /// Makes room for a request of `flow` in a full room: pushes out the newest waiter
    /// of the longest flow if that flow is longer than `flow` would be with it.
    fn push_out(&mut self, flow: u64) -> bool {
        let own = self.flows.get(&flow).map_or(0, VecDeque::len);
        let longest = self.flows.iter().max_by_key(|(_, w)| w.len()).map(|(&f, w)| (f, w.len()));
        let Some((longest, len)) = longest.filter(|&(_, len)| len > own + 1) else { return false };
        let waiters = self.flows.get_mut(&longest).expect("the longest flow");
        // Dropped, its sender tells the waiter it was pushed out.
        waiters.pop_back();
        debug_assert!(len > 1, "a flow longer than another's plus one keeps a waiter");
        self.waiting -= 1;
        true
    }

    /// The requests ahead in the round of one of `flow`, itself included (joined last).
    fn position(&self, flow: u64) -> usize {
        let own = self.flows.get(&flow).map_or(0, VecDeque::len);
        self.position_at(own.saturating_sub(1))
    }

    /// The place in the round of a request of `flow` that would join now, itself
    /// included.
    fn next_of(&self, flow: u64) -> usize {
        let own = self.flows.get(&flow).map_or(0, VecDeque::len);
        self.flows.values().map(|w| w.len().min(own + 1)).sum::<usize>() + 1
    }

    /// The requests served before the waiter `at` places into its flow, and it: each
    /// flow's first `at + 1` waiters at most.
    fn position_at(&self, at: usize) -> usize {
        self.flows.values().map(|w| w.len().min(at + 1)).sum::<usize>().max(1)
    }
}
