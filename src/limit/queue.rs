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
//! - **Classes** (`classes:`, highest first): a request's class is the first whose `match`
//!   admits it, else the last. A slot goes to the highest class with requests waiting;
//!   within a class, round the flows.
//! - **Full**: a newcomer meeting a full room pushes out the newest waiter of the lowest
//!   class below its own that has one (shedding the lowest class first); within its own
//!   class, the newest waiter of the longest flow, if that flow would still be longer
//!   than the newcomer's; otherwise it is refused. A heavy client fills the room only
//!   while nobody else wants it.
//! - **Retry-After from the room**: the mean time between hand-offs (a moving average)
//!   times the requests ahead in the round; `max_wait` while no hand-off was seen.
//! - **Leaving**: a waiter whose request ends (the client closed, reset the stream or
//!   cancelled the call) leaves the room when its `Ticket` drops; a slot sent to it in
//!   the meantime goes back, and on to the next, when its `Handed` drops.
//! - **Global limits** (slots leased in Redis): the rooms are this instance's. A lease
//!   given back while requests wait here is handed to the next of them (`hand_lease`),
//!   still held in Redis, so that no other instance's newcomer takes it between its
//!   release and a waiter's ask; slots given back elsewhere reach the waiters through
//!   one asker of Redis per room, at an interval (`Queue::ask_every`; the asker is the
//!   gate's), a slot granted so being handed in the room's order; a newcomer waits
//!   behind the room's waiters without asking Redis (the gate's `behind_waiters`).
//!   Redis failing meanwhile ends every wait of the room (`QueueEnd::StoreError`): each
//!   request is decided again, as its limits' `on_store_error` say.
//!
//! Written here rather than taken from a crate: the semaphores and fair queues of crates
//! (tokio's `Semaphore`, async-lock) are FIFO over one queue, with no flows, no bound
//! with push-out, and no hand-off into a key's table of slots.

use std::any::Any;
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

/// The bounds of the interval at which a global limit's room asks Redis for a slot.
const ASK_EVERY_LEAST: Duration = Duration::from_millis(10);
const ASK_EVERY_MOST: Duration = Duration::from_millis(200);

/// A global limit's slot as the store holds it (its lease), opaque here (the store's
/// types are not this module's to know): handed from a request that gives it back to
/// the next waiter, as a local slot is.
pub type Leased = Box<dyn Any + Send>;

/// A limit's queue: its bounds and its rooms.
pub(crate) struct Queue {
    pub(crate) max: usize,
    pub(crate) max_wait: Duration,
    pub(crate) fair_by: KeySpec,
    /// Its classes, highest first (none: one class).
    pub(crate) classes: Box<[crate::policy::QueueClass]>,
    /// Kept by a reload that keeps the limit's state (and its classes): its waiters
    /// wait on.
    pub(crate) rooms: Arc<Rooms>,
}

impl Queue {
    pub(crate) fn new(queue: &crate::policy::Queue) -> Self {
        Queue {
            max: queue.max,
            max_wait: queue.max_wait,
            fair_by: queue.fair_by.clone(),
            classes: queue.classes.clone(),
            rooms: Arc::new(Rooms::new(queue.classes.len().max(1))),
        }
    }

    /// The class of `src`: the one its route's `priority` names, if this queue has it;
    /// else the first whose `match` admits it, else the last.
    pub(crate) fn class_of(&self, src: &crate::policy::key::KeySource<'_>, priority: Option<&str>) -> usize {
        if let Some(class) = priority.and_then(|name| self.classes.iter().position(|c| c.name == name)) {
            return class;
        }
        let last = self.classes.len().saturating_sub(1);
        self.classes.iter().position(|c| !c.matcher.is_empty() && c.matcher.admits(src)).unwrap_or(last)
    }

    /// The name of class `class` (`""`: the queue has no classes).
    pub(crate) fn class_name(&self, class: usize) -> &str {
        self.classes.get(class).map_or("", |c| c.name.as_str())
    }

    /// How often a room of a global limit asks Redis for a slot freed elsewhere: a
    /// tenth of `max_wait`, from 10 to 200 ms.
    pub(crate) fn ask_every(&self) -> Duration {
        (self.max_wait / 10).clamp(ASK_EVERY_LEAST, ASK_EVERY_MOST)
    }
}

/// The rooms of a limit's keys that have requests waiting, and what became of them.
pub(crate) struct Rooms {
    rooms: Mutex<Hall>,
    next_id: AtomicU64,
    /// Per class: requests waiting now, in every room, and how waits ended.
    counts: Box<[ClassCounts]>,
}

#[derive(Default)]
struct ClassCounts {
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
    /// The room of `key`, made (with a lane of each of `classes`, one without) if it has
    /// none.
    fn room(&mut self, key: u64, classes: &[crate::policy::QueueClass]) -> &mut Room {
        self.rooms.entry(key).or_insert_with(|| {
            let share = |c: &crate::policy::QueueClass| Lane { share: u32::from(c.share), ..Lane::default() };
            let lanes = match classes {
                [] => vec![Lane::default()],
                _ => classes.iter().map(share).collect(),
            };
            Room { lanes: lanes.into(), waiting: 0, asker: None }
        })
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

/// The requests waiting for one key's slots: a lane per class, highest first.
struct Room {
    lanes: Box<[Lane]>,
    waiting: usize,
    /// Who asks Redis for its key's slots, if someone does (a global limit's room): a
    /// room emptied and made again has a new asker, the old one stopping.
    asker: Option<u64>,
}

/// The requests of one class waiting for one key's slots.
#[derive(Default)]
struct Lane {
    /// The share (percent) of the slots handed on that it is sure of while it has
    /// requests waiting, and what it earned of it: a slot each 100.
    share: u32,
    earned: u32,
    /// The waiters of each flow, oldest first.
    flows: HashMap<u64, VecDeque<Waiter>>,
    /// The flows with waiters, in the order they are served.
    ring: VecDeque<u64>,
    waiting: usize,
}

struct Waiter {
    id: u64,
    to: oneshot::Sender<Turn>,
}

/// What a waiter is sent.
enum Turn {
    /// A slot.
    Slot(Handed),
    /// Redis could not answer for a global limit's slots: it is to be decided again.
    AskAgain,
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
    /// Redis could not answer for the global limit's slots: it was decided again, as its
    /// limits' `on_store_error` say.
    StoreError,
}

impl QueueEnd {
    pub const ALL: [QueueEnd; 6] = [
        QueueEnd::Served,
        QueueEnd::Full,
        QueueEnd::TimedOut,
        QueueEnd::PushedOut,
        QueueEnd::Left,
        QueueEnd::StoreError,
    ];

    /// Its name wherever it is named: the access log's `queue`, the metrics' `outcome`.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueEnd::Served => "served",
            QueueEnd::Full => "full",
            QueueEnd::TimedOut => "timed_out",
            QueueEnd::PushedOut => "pushed_out",
            QueueEnd::Left => "left",
            QueueEnd::StoreError => "store_error",
        }
    }
}

/// A slot of a concurrency limit handed to a waiting request (or taken by one that found
/// it free): given back, and on to the next waiter, when dropped unless `take`n.
pub struct Handed {
    limiters: Option<Arc<Limiters>>,
    pub limit: LimitId,
    pub key: KeyHash,
    /// When it was handed (or taken).
    pub since: super::adaptive::Since,
    /// A global limit's slot: its lease (`None`: a local slot).
    lease: Option<Leased>,
}

impl Handed {
    pub(crate) fn new(limiters: Arc<Limiters>, limit: LimitId, key: KeyHash, since: super::adaptive::Since) -> Self {
        Handed { limiters: Some(limiters), limit, key, since, lease: None }
    }

    /// A slot of `key` in `limit`, handed now.
    fn now(limiters: &Arc<Limiters>, limit: LimitId, key: KeyHash) -> Self {
        Handed::new(Arc::clone(limiters), limit, key, super::adaptive::Since::at(limiters.clock().now()))
    }

    /// The slot, to be held by the request's permits (which give it back), and its
    /// lease if it is a global limit's.
    pub fn take(mut self) -> (Arc<Limiters>, Option<Leased>) {
        (self.limiters.take().expect("a slot not yet taken"), self.lease.take())
    }

    /// Makes its drop do nothing (its slot was not handed on, under the room's lock:
    /// whoever has it frees it), and gives back its lease, if it has one.
    fn defuse(&mut self) -> Option<Leased> {
        self.limiters = None;
        self.lease.take()
    }
}

impl Drop for Handed {
    fn drop(&mut self) {
        let Some(limiters) = self.limiters.take() else { return };
        match self.lease.take() {
            // Handed on, or else dropped: released in Redis.
            Some(lease) => drop(limiters.give_back_lease(self.limit, self.key, lease)),
            None => limiters.release(self.limit, self.key, None),
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
    class: usize,
    flow: u64,
    id: u64,
    to: oneshot::Receiver<Turn>,
    /// Requests ahead of it in the round when it came, itself included.
    pub position: usize,
    max_wait: Duration,
    done: bool,
}

impl Ticket {
    /// Waits for a slot, `max_wait` at most: the slot, or how the wait ended with the
    /// time after which a slot is expected.
    pub async fn wait(mut self) -> Result<Handed, (QueueEnd, Duration)> {
        match tokio::time::timeout(self.max_wait, &mut self.to).await {
            Ok(Ok(turn)) => self.turn(turn),
            Ok(Err(_)) => Err(self.pushed_out()),
            Err(_) => self.give_up(),
        }
    }

    /// How the wait ended, if it did, read without waiting (what a replay on a virtual
    /// clock asks after each slot given back): handed a slot, or pushed out.
    pub fn try_end(&mut self) -> Option<Result<Handed, (QueueEnd, Duration)>> {
        match self.to.try_recv() {
            Ok(turn) => Some(self.turn(turn)),
            Err(oneshot::error::TryRecvError::Empty) => None,
            Err(oneshot::error::TryRecvError::Closed) => Some(Err(self.pushed_out())),
        }
    }

    /// Stops waiting: its `max_wait` is over. A slot handed to it meanwhile is its.
    pub fn give_up(mut self) -> Result<Handed, (QueueEnd, Duration)> {
        self.done = true;
        let position = self.rooms.leave(self.key, self.class, self.flow, self.id);
        if position.is_none()
            && let Ok(turn) = self.to.try_recv()
        {
            return self.turn(turn);
        }
        let retry_after = self.rooms.estimate(self.key, self.max_wait, position);
        self.rooms.count(self.class, QueueEnd::TimedOut);
        Err((QueueEnd::TimedOut, retry_after))
    }

    /// The longest it waits.
    pub fn max_wait(&self) -> Duration {
        self.max_wait
    }

    /// What it was sent: a slot, or Redis failing for a global limit's.
    fn turn(&mut self, turn: Turn) -> Result<Handed, (QueueEnd, Duration)> {
        self.done = true;
        let end = match turn {
            Turn::Slot(handed) => {
                self.rooms.count(self.class, QueueEnd::Served);
                return Ok(handed);
            }
            Turn::AskAgain => QueueEnd::StoreError,
        };
        self.rooms.count(self.class, end);
        Err((end, Duration::ZERO))
    }

    fn pushed_out(&mut self) -> (QueueEnd, Duration) {
        self.done = true;
        let retry_after = self.rooms.estimate(self.key, self.max_wait, None);
        self.rooms.count(self.class, QueueEnd::PushedOut);
        (QueueEnd::PushedOut, retry_after)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.done && self.rooms.leave(self.key, self.class, self.flow, self.id).is_some() {
            self.rooms.count(self.class, QueueEnd::Left);
        }
    }
}

impl Rooms {
    fn new(classes: usize) -> Self {
        let counts = (0..classes).map(|_| ClassCounts::default()).collect();
        Rooms { rooms: Mutex::default(), next_id: AtomicU64::new(0), counts }
    }

    fn lock(&self) -> MutexGuard<'_, Hall> {
        self.rooms.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn count(&self, class: usize, end: QueueEnd) {
        let i = QueueEnd::ALL.iter().position(|&e| e == end).unwrap_or(0);
        self.counts[class].ended[i].fetch_add(1, Ordering::Relaxed);
    }

    fn waited(&self, class: usize, more: bool) {
        match more {
            true => self.counts[class].waiting.fetch_add(1, Ordering::Relaxed),
            false => self.counts[class].waiting.fetch_sub(1, Ordering::Relaxed),
        };
    }

    /// Its classes: as many as its queue's (one without).
    pub(crate) fn classes(&self) -> usize {
        self.counts.len()
    }

    /// Requests of class `class` waiting now.
    pub(crate) fn waiting(&self, class: usize) -> u64 {
        self.counts[class].waiting.load(Ordering::Relaxed)
    }

    /// Waits of class `class` that ended so, since start.
    pub(crate) fn ended(&self, class: usize, end: QueueEnd) -> u64 {
        let i = QueueEnd::ALL.iter().position(|&e| e == end).unwrap_or(0);
        self.counts[class].ended[i].load(Ordering::Relaxed)
    }

    /// Joins the room of `key` in class `class` and flow `flow`, unless `take` finds a
    /// slot free (called under the room's lock, so that no slot is given back unseen
    /// meanwhile).
    pub(crate) fn join(
        self: &Arc<Self>,
        queue: &Queue,
        key: KeyHash,
        class: usize,
        flow: u64,
        take: impl FnOnce() -> Take,
    ) -> Queued {
        let mut hall = self.lock();
        let room = hall.room(key.0, &queue.classes);
        let refused = match room.waiting {
            0 => match take() {
                Take::Slot(handed) => {
                    hall.tidy(key.0);
                    drop(hall);
                    self.count(class, QueueEnd::Served);
                    return Queued::Taken(handed);
                }
                Take::Busy => false,
                Take::NoRoom => true,
            },
            waiting if waiting >= queue.max => match room.push_out(class, flow, queue.max) {
                Some(pushed) => {
                    self.waited(pushed, false);
                    false
                }
                None => true,
            },
            _ => false,
        };
        if refused {
            let position = room.next_of(class, flow);
            let retry_after = hall.estimate(queue.max_wait, position);
            hall.tidy(key.0);
            drop(hall);
            self.count(class, QueueEnd::Full);
            return Queued::Refused { end: QueueEnd::Full, retry_after };
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (to, from) = oneshot::channel();
        let lane = &mut room.lanes[class];
        match lane.flows.entry(flow) {
            Entry::Occupied(mut e) => e.get_mut().push_back(Waiter { id, to }),
            Entry::Vacant(e) => {
                e.insert(VecDeque::from([Waiter { id, to }]));
                lane.ring.push_back(flow);
            }
        }
        lane.waiting += 1;
        room.waiting += 1;
        self.waited(class, true);
        let position = room.position(class, flow);
        Queued::Waiting(Ticket {
            rooms: Arc::clone(self),
            key: key.0,
            class,
            flow,
            id,
            to: from,
            position,
            max_wait: queue.max_wait,
            done: false,
        })
    }

    /// Hands the slot `key` gives back in `limit` to its next waiter, if one waits and the
    /// key is not over its ceiling (an adaptive one, come down); else frees it (under the
    /// room's lock: a newcomer joining meanwhile sees it free). Slots the key may hold
    /// beyond its own (a reload raised `concurrency`) go to the next waiters too. The
    /// slots the key held when it freed this one (`None`: handed on, all are held).
    pub(crate) fn hand_off(&self, limiters: &Arc<Limiters>, limit: LimitId, key: KeyHash) -> Option<u64> {
        let mut hall = self.lock();
        let Some(room) = hall.rooms.get_mut(&key.0).filter(|_| !limiters.over(limit, key)) else {
            return Some(limiters.free(limit, key));
        };
        if let Err(mut handed) = self.give(room, Handed::now(limiters, limit, key)) {
            handed.defuse();
            hall.tidy(key.0);
            return Some(limiters.free(limit, key));
        }
        self.give_spare(room, limiters, limit, key);
        hall.handed(limiters.clock().now());
        hall.tidy(key.0);
        None
    }

    /// Hands the slots `key` may hold beyond those it holds (its adaptive ceiling went up)
    /// to its waiters, if any wait.
    pub(crate) fn hand_spare(&self, limiters: &Arc<Limiters>, limit: LimitId, key: KeyHash) {
        let mut hall = self.lock();
        if let Some(room) = hall.rooms.get_mut(&key.0) {
            self.give_spare(room, limiters, limit, key);
            hall.tidy(key.0);
        }
    }

    /// Hands the lease of a global limit's slot that `key` gives back in `limit` to its
    /// next waiter, if one waits here: the lease back if none does (to be released).
    pub(crate) fn hand_lease(
        &self,
        limiters: &Arc<Limiters>,
        limit: LimitId,
        key: KeyHash,
        lease: Leased,
    ) -> Option<Leased> {
        let mut hall = self.lock();
        let Some(room) = hall.rooms.get_mut(&key.0) else { return Some(lease) };
        let mut handed = Handed::now(limiters, limit, key);
        handed.lease = Some(lease);
        let back = match self.give(room, handed) {
            Ok(()) => {
                hall.handed(limiters.clock().now());
                None
            }
            Err(mut handed) => handed.defuse(),
        };
        hall.tidy(key.0);
        back
    }

    /// Takes and hands on spare slots of `key` while requests wait in `room`.
    fn give_spare(&self, room: &mut Room, limiters: &Arc<Limiters>, limit: LimitId, key: KeyHash) {
        while room.waiting > 0 && limiters.spare(limit, key) {
            if let Err(mut handed) = self.give(room, Handed::now(limiters, limit, key)) {
                handed.defuse();
                limiters.free(limit, key);
            }
        }
    }

    /// Hands `handed` to the next waiter of `room` still waiting: `handed` back if none is
    /// (to be `defuse`d under the lock: its drop would come back here).
    fn give(&self, room: &mut Room, mut handed: Handed) -> Result<(), Handed> {
        while let Some((class, waiter)) = room.next() {
            self.waited(class, false);
            match waiter.to.send(Turn::Slot(handed)) {
                Ok(()) => return Ok(()),
                // Its request is ending: on to the next.
                Err(Turn::Slot(back)) => handed = back,
                Err(Turn::AskAgain) => unreachable!("a slot was sent"),
            }
        }
        Err(handed)
    }

    /// Whether the caller is to ask Redis for the slots of `key` (a global limit's) for
    /// its room's waiters, and as whom: one caller per room while it has waiters.
    pub(crate) fn start_asking(&self, key: KeyHash) -> Option<u64> {
        let asker = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut hall = self.lock();
        let room = hall.rooms.get_mut(&key.0).filter(|r| r.waiting > 0 && r.asker.is_none())?;
        room.asker = Some(asker);
        Some(asker)
    }

    /// Whether `asker` asks Redis on for the slots of `key`: requests wait for them, in
    /// the room it asks for. If none does, it stops (the next to come starts again).
    pub(crate) fn keep_asking(&self, key: KeyHash, asker: u64) -> bool {
        let mut hall = self.lock();
        match hall.rooms.get_mut(&key.0).filter(|r| r.asker == Some(asker)) {
            Some(room) if room.waiting > 0 => true,
            Some(room) => {
                room.asker = None;
                false
            }
            None => false,
        }
    }

    /// Whether requests wait in the room of `key`.
    pub(crate) fn has_waiters(&self, key: KeyHash) -> bool {
        self.lock().rooms.get(&key.0).is_some_and(|r| r.waiting > 0)
    }

    /// Ends the wait of every request in the room of `key`: Redis could not answer for
    /// the slots they wait for; each is decided again.
    pub(crate) fn ask_again(&self, key: KeyHash) {
        let mut hall = self.lock();
        let Some(mut room) = hall.rooms.remove(&key.0) else { return };
        while let Some((class, waiter)) = room.next() {
            self.waited(class, false);
            // (A request ending meanwhile needs no answer.)
            let _ = waiter.to.send(Turn::AskAgain);
        }
    }

    /// Takes waiter `id` of `flow` in class `class` out of the room of `key`: its
    /// position then (`None`: it was no longer there, handed a slot or pushed out).
    fn leave(&self, key: u64, class: usize, flow: u64, id: u64) -> Option<usize> {
        let mut hall = self.lock();
        let room = hall.rooms.get_mut(&key)?;
        let lane = &room.lanes[class];
        let at = lane.flows.get(&flow)?.iter().position(|w| w.id == id)?;
        let position = room.ahead(class) + lane.position_at(at);
        let lane = &mut room.lanes[class];
        let waiters = lane.flows.get_mut(&flow)?;
        waiters.remove(at);
        if waiters.is_empty() {
            lane.flows.remove(&flow);
            lane.ring.retain(|&f| f != flow);
        }
        lane.waiting -= 1;
        room.waiting -= 1;
        self.waited(class, false);
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

    /// Where a request of `class` and `flow` would stand in the room of `key` (`None`:
    /// nobody waits).
    pub(crate) fn would_stand(&self, key: KeyHash, class: usize, flow: u64) -> Option<(usize, usize)> {
        let hall = self.lock();
        let room = hall.rooms.get(&key.0).filter(|r| r.waiting > 0)?;
        Some((room.waiting, room.next_of(class, flow)))
    }
}

impl Room {
    /// The next waiter, round its class's flows: of the highest class that has earned a
    /// slot of its share (each class with a share and requests waiting earns it at every
    /// hand-off; one without requests waiting earns nothing and keeps nothing: what it
    /// does not use is lent), else of the highest class with one.
    fn next(&mut self) -> Option<(usize, Waiter)> {
        for lane in self.lanes.iter_mut() {
            lane.earned = if lane.waiting > 0 { lane.earned + lane.share } else { 0 };
        }
        let earned = self.lanes.iter().position(|l| l.waiting > 0 && l.earned >= 100);
        let class = earned.or_else(|| self.lanes.iter().position(|l| l.waiting > 0))?;
        let lane = &mut self.lanes[class];
        if earned.is_some() {
            lane.earned -= 100;
        }
        let waiter = lane.next()?;
        self.waiting -= 1;
        Some((class, waiter))
    }

    /// Makes room for a request of `class` and `flow` in a full room (of `max`): pushes
    /// out the newest waiter of the lowest class below `class` that has one (and, if it
    /// has a share, more waiting than its share of `max`: a class sure of a share of the
    /// slots is sure of that share of the room), or else within `class` that of its
    /// longest flow if that flow is longer than `flow` would be with it. The class it
    /// pushed out of, if it did.
    fn push_out(&mut self, class: usize, flow: u64, max: usize) -> Option<usize> {
        let over_share = |l: &Lane| l.waiting > 0 && l.waiting * 100 > l.share as usize * max;
        let lowest = (self.lanes.iter().enumerate().rev())
            .find(|&(c, l)| if c == class { l.waiting > 0 } else { over_share(l) })
            .map(|(c, _)| c)?;
        let pushed = match lowest.cmp(&class) {
            std::cmp::Ordering::Greater => self.lanes[lowest].push_out(None),
            std::cmp::Ordering::Equal => self.lanes[class].push_out(Some(flow)),
            std::cmp::Ordering::Less => false,
        };
        pushed.then(|| {
            self.waiting -= 1;
            lowest
        })
    }

    /// The waiters of the classes above `class`: all served first.
    fn ahead(&self, class: usize) -> usize {
        self.lanes[..class].iter().map(|l| l.waiting).sum()
    }

    /// The place of a request of `class` and `flow` that joined last, itself included.
    fn position(&self, class: usize, flow: u64) -> usize {
        let lane = &self.lanes[class];
        let own = lane.flows.get(&flow).map_or(0, VecDeque::len);
        self.ahead(class) + lane.position_at(own.saturating_sub(1))
    }

    /// The place of a request of `class` and `flow` that would join now, itself included.
    fn next_of(&self, class: usize, flow: u64) -> usize {
        let lane = &self.lanes[class];
        let own = lane.flows.get(&flow).map_or(0, VecDeque::len);
        self.ahead(class) + lane.flows.values().map(|w| w.len().min(own + 1)).sum::<usize>() + 1
    }
}

impl Lane {
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

    /// Pushes out the newest waiter of the longest flow (of flows as long, the one whose
    /// newest came last): any (`None`: a request of a higher class comes), or if longer
    /// than `flow` would be with one more.
    fn push_out(&mut self, flow: Option<u64>) -> bool {
        let own = flow.map_or(0, |f| self.flows.get(&f).map_or(0, VecDeque::len));
        // Of flows as long, the one that came last.
        let longest = (self.flows.iter())
            .max_by_key(|(_, w)| (w.len(), w.back().map(|last| last.id)))
            .map(|(&f, w)| (f, w.len()));
        let Some((longest, len)) = longest.filter(|&(_, len)| flow.is_none() || len > own + 1) else { return false };
        let Some(waiters) = self.flows.get_mut(&longest) else { return false };
        // Dropped, its sender tells the waiter it was pushed out.
        waiters.pop_back();
        if len == 1 {
            self.flows.remove(&longest);
            self.ring.retain(|&f| f != longest);
        }
        self.waiting -= 1;
        true
    }

    /// The requests served before the waiter `at` places into its flow, and it: each
    /// flow's first `at + 1` waiters at most.
    fn position_at(&self, at: usize) -> usize {
        self.flows.values().map(|w| w.len().min(at + 1)).sum::<usize>().max(1)
    }
}
