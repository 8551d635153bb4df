//! A concurrency limit's ceiling that learns (`concurrency: adaptive`): how many requests
//! its slots let in at once, raised while the requests that hold them are as fast as they
//! get and lowered when they slow down, so that a backend's own queue stays short and the
//! requests it cannot take now wait in sluicegate's (fairly, with a `queue:`) or are
//! refused at once.
//!
//! - **The latency**: each request holding a slot is a sample, the time from the slot's
//!   taking to the upstream's response head (`Permits::answered`; to its giving back when
//!   none came): a client reading its response slowly teaches it nothing. A window
//!   (`window`, once the time is over and a slot is given back) takes the median of its
//!   last `KEPT` samples: a few slow streams do not move it.
//! - **The ground**: the least window median seen, the backend's latency without a queue
//!   of its own. It only falls, except at `min`: a window measured with the ceiling at
//!   `min` is the latency with the fewest requests the limit lets in, and is the ground
//!   from then on (so a backend that became slower for good is learned again, as Envoy
//!   re-measures its minimum by pinning the limit to its least, but without pinning: the
//!   ceiling goes there only when latency sends it).
//! - **The move**, once a window, by the gradient `target / median` where the target is
//!   `TOLERANCE` × the ground (Envoy's adaptive concurrency and Netflix's Gradient2 move
//!   alike): over the target, the ceiling is multiplied by it (halved at most in a
//!   window); within it, and only if the ceiling was reached in the window (a slot given
//!   back with the key's slots all held, or handed to a waiter), it grows by it (by one
//!   at least; doubled at most). From the start, until a first window over the target,
//!   it doubles, and its windows end early, once a round of its slots was given back (a
//!   slow start, as TCP's, that doubles once a round trip): a cold proxy reaches a
//!   backend's capacity in a few of the backend's latencies, not a few windows. A ceiling
//!   that nothing fills does not grow, and one the window used less than half of comes
//!   down to twice what it used: a surge, or a backend that slows, meets no more than
//!   that before the latency is heard.
//!
//! Why a gradient rather than AIMD: against a backend whose latency grows with its load,
//! the gradient lands on the ceiling that keeps the latency at the target in one window
//! (`ceiling × target / latency`), where AIMD saws around it. Why the median of a
//! window rather than a moving average: one slow response (a download) weighs one
//! sample, not its length. Why written here: `tower`'s and the crates near it limit a
//! `Service` with their own semaphore and have no per-key table or waiting room to
//! steer, which is what the ceiling bounds here.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::Nanos;
use crate::policy::Adaptive;

/// The target latency, as a multiple of the ground: a backend's queue may add this much.
pub const TOLERANCE: f64 = 1.25;
/// Samples a window keeps (its last ones) to take their median.
const KEPT: usize = 64;
/// The fewest samples a round of the slow start takes.
const MIN_ROUND: u64 = 4;

/// When a slot was taken, as the slot keeps it: microseconds of the clock in 32 bits, the
/// lowest always set (2 µs steps), so that a slot with an `Option` of it stays 16 bytes
/// (every passed request moves its slots with it); a slot held longer than 71 minutes is
/// measured modulo that.
#[derive(Clone, Copy, Debug)]
pub struct Since(NonZeroU32);

impl Since {
    pub fn at(now: Nanos) -> Self {
        Since(NonZeroU32::new((now.0 / 1_000) as u32 | 1).unwrap_or(NonZeroU32::MIN))
    }

    /// How long a slot taken then was held at `now`.
    pub fn held(self, now: Nanos) -> Duration {
        Duration::from_micros(u64::from(Since::at(now).0.get().wrapping_sub(self.0.get())))
    }
}

/// A limit's ceiling and what it learns it from. Shared by every key of the limit: a
/// limit keyed per client gives each client this many slots.
pub struct Ceiling {
    pub(crate) min: u64,
    pub(crate) max: u64,
    pub(crate) window: Duration,
    now: AtomicU64,
    learner: Mutex<Learner>,
}

/// A window being measured, and what the windows before taught.
struct Learner {
    /// When the window began (`None`: before its first sample).
    start: Option<u64>,
    /// Its last samples (ns), `KEPT` at most, and where the next goes.
    kept: [u64; KEPT],
    samples: usize,
    /// Answers that said the upstream is overloaded (`shed`), not among the samples.
    shed: usize,
    /// A slot was given back with the ceiling reached.
    full: bool,
    /// The most slots a key held when one was given back.
    peak: u64,
    /// The ground (ns).
    ground: Option<f64>,
    /// The last window's median (ns).
    recent: Option<f64>,
    /// No window has gone over the target yet: the ceiling doubles.
    starting: bool,
}

/// A ceiling as it reads now, as every surface shows it (metrics, `explain`, the
/// dashboard, `simulate`'s report): the requests in progress it lets a key have, its
/// bounds, and the latencies it moves by (ms; `None` before a first window).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CeilingShown {
    pub now: u64,
    pub min: u64,
    pub max: u64,
    /// The median time to the upstream's answer of the last window's slots.
    pub recent_ms: Option<f64>,
    /// The least such median: its target is `TOLERANCE` times it.
    pub ground_ms: Option<f64>,
}

impl Ceiling {
    pub fn new(adaptive: Adaptive, max: u64) -> Self {
        let learner = Learner {
            start: None,
            kept: [0; KEPT],
            samples: 0,
            shed: 0,
            full: false,
            peak: 0,
            ground: None,
            recent: None,
            starting: true,
        };
        Ceiling {
            min: adaptive.min,
            max,
            window: adaptive.window,
            now: AtomicU64::new(adaptive.min),
            learner: Mutex::new(learner),
        }
    }

    /// Whether it learns within these bounds (a reload keeps what it learned then).
    pub fn same(&self, min: u64, max: u64, window: Duration) -> bool {
        (self.min, self.max, self.window) == (min, max, window)
    }

    /// The most requests a key of the limit may have in progress now.
    #[inline]
    pub fn get(&self) -> u64 {
        self.now.load(Ordering::Relaxed)
    }

    /// A slot held `held` was given back at `now`, when its key held `in_flight` slots
    /// (itself included; `None`: it went on to a waiter, all being held). Closes the
    /// window, and moves the ceiling, when its time is over: whether it went up.
    pub fn sample(&self, held: Duration, in_flight: Option<u64>, now: Nanos) -> bool {
        self.note(Some(held), in_flight, now)
    }

    /// The upstream answered a request holding a slot that it is overloaded (429, 503):
    /// not a time to learn (such answers come back fast), but a sign that the ceiling is
    /// above what it can take. As `sample`.
    pub fn shed(&self, in_flight: Option<u64>, now: Nanos) -> bool {
        self.note(None, in_flight, now)
    }

    /// A slot given back after `held` (`None`: shed), as `sample` says.
    fn note(&self, held: Option<Duration>, in_flight: Option<u64>, now: Nanos) -> bool {
        let mut learner = self.learner.lock().unwrap_or_else(PoisonError::into_inner);
        let start = *learner.start.get_or_insert(now.0);
        match held {
            Some(held) => {
                let slot = learner.samples % KEPT;
                learner.kept[slot] = u64::try_from(held.as_nanos()).unwrap_or(u64::MAX);
                learner.samples += 1;
            }
            None => learner.shed += 1,
        }
        let was = self.get();
        learner.full |= in_flight.is_none_or(|n| n >= was);
        learner.peak = learner.peak.max(in_flight.unwrap_or(was));
        // Starting, a window is also over once as many slots as the ceiling were given
        // back (a round of them, as TCP's slow start doubles once a round trip).
        let answers = (learner.samples + learner.shed) as u64;
        let round = learner.starting && learner.full && answers >= was.max(MIN_ROUND);
        if now.0.saturating_sub(start) < u64::try_from(self.window.as_nanos()).unwrap_or(u64::MAX) && !round {
            return false;
        }
        let next = learner.close(was, self.min).clamp(self.min, self.max);
        learner.start = Some(now.0);
        self.now.store(next, Ordering::Relaxed);
        next > was
    }

    /// What it reads now.
    pub fn read(&self) -> CeilingShown {
        let learner = self.learner.lock().unwrap_or_else(PoisonError::into_inner);
        let ms = |ns: Option<f64>| ns.map(|ns| ns / 1e6);
        CeilingShown {
            now: self.get(),
            min: self.min,
            max: self.max,
            recent_ms: ms(learner.recent),
            ground_ms: ms(learner.ground),
        }
    }
}

impl Learner {
    /// Ends the window (its samples taken), and says where the ceiling, at `ceiling`, goes.
    fn close(&mut self, ceiling: u64, min: u64) -> u64 {
        let (full, peak) = (std::mem::take(&mut self.full), std::mem::take(&mut self.peak));
        // A ceiling far above what the window used comes down to twice that: a surge
        // then meets the backend at twice its load at most before the latency is heard.
        let used = if full { ceiling } else { ceiling.min(peak.saturating_mul(2)) };
        let (samples, shed) = (std::mem::take(&mut self.samples), std::mem::take(&mut self.shed));
        if shed > 0 {
            // Over what the upstream takes: down by the share of answers it shed (halved
            // at most, one slot at least), the times of the others not heeded.
            self.starting = false;
            let kept = samples as f64 / (samples + shed) as f64;
            return ((used as f64 * kept.max(0.5)) as u64).min(ceiling.saturating_sub(1));
        }
        let kept = &mut self.kept[..samples.min(KEPT)];
        let middle = kept.len() / 2;
        let median = *kept.select_nth_unstable(middle).1 as f64;
        self.recent = Some(median);
        let ground = match self.ground {
            Some(ground) if ceiling > min => ground.min(median),
            _ => median,
        };
        self.ground = Some(ground);
        let gradient = ground * TOLERANCE / median.max(1.0);
        if gradient < 1.0 {
            self.starting = false;
            return (used as f64 * gradient.max(0.5)) as u64;
        }
        match (full, self.starting) {
            (false, _) => used,
            (true, true) => ceiling.saturating_mul(2),
            (true, false) => ((ceiling as f64 * gradient.min(2.0)) as u64).max(ceiling + 1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn ceiling(min: u64, max: u64) -> Ceiling {
        Ceiling::new(Adaptive { min, window: Duration::from_millis(100) }, max)
    }

    /// A slot given back to a waiter: the key's slots all held.
    const FULL: Option<u64> = None;

    /// A window (of 100 ms) ending at `end_ms`: two slots held `ms` each given back, at
    /// its start and at its end (too few for a round of the slow start), with `in_flight`.
    fn window(c: &Ceiling, end_ms: u64, ms: u64, in_flight: Option<u64>) {
        c.sample(Duration::from_millis(ms), in_flight, Nanos((end_ms - 100) * MS));
        c.sample(Duration::from_millis(ms), in_flight, Nanos(end_ms * MS));
    }

    #[test]
    fn starting_it_doubles_once_a_round_of_its_slots_was_given_back() {
        let c = ceiling(4, 100);
        for i in 0..4 {
            assert_eq!(c.get(), 4);
            c.sample(Duration::from_millis(20), FULL, Nanos(i * MS));
        }
        for i in 0..8 {
            assert_eq!(c.get(), 8);
            c.sample(Duration::from_millis(20), FULL, Nanos((10 + i) * MS));
        }
        assert_eq!(c.get(), 16);
        // Past the slow start, windows end with their time only.
        for i in 0..20 {
            c.sample(Duration::from_millis(40), FULL, Nanos((20 + i) * MS));
        }
        assert_eq!(c.get(), 10);
        for i in 0..20 {
            c.sample(Duration::from_millis(20), FULL, Nanos((40 + i) * MS));
        }
        assert_eq!(c.get(), 10);
    }

    /// Answers saying the upstream is overloaded (429, 503) are not times to learn (they
    /// come back fast): the ceiling comes down by their share of the window's answers,
    /// halved at most, one slot at least, and stops its slow start.
    #[test]
    fn answers_the_upstream_shed_bring_it_down_by_their_share() {
        let c = ceiling(4, 100);
        window(&c, 100, 20, FULL);
        window(&c, 200, 20, FULL);
        assert_eq!(c.get(), 16);
        // A quarter shed, the others fast: down a quarter, not up.
        for i in 0..3 {
            c.sample(Duration::from_millis(1), FULL, Nanos((200 + i) * MS));
        }
        c.shed(FULL, Nanos(300 * MS));
        assert_eq!(c.get(), 12);
        // All shed: halved at most.
        c.shed(FULL, Nanos(350 * MS));
        c.shed(FULL, Nanos(400 * MS));
        assert_eq!(c.get(), 6);
        // One in a hundred: one slot at least.
        for i in 0..99 {
            c.sample(Duration::from_millis(20), FULL, Nanos(400 * MS + i * 1000));
        }
        c.shed(FULL, Nanos(500 * MS));
        assert_eq!(c.get(), 5);
        // Fast again with nothing shed: no slow start (it doubled before), the gradient.
        window(&c, 600, 20, FULL);
        assert!(c.get() < 10, "{}", c.get());
    }

    #[test]
    fn starts_at_min_and_doubles_while_full_and_fast() {
        let c = ceiling(4, 100);
        assert_eq!(c.get(), 4);
        window(&c, 100, 20, FULL);
        assert_eq!(c.get(), 8);
        window(&c, 200, 20, FULL);
        assert_eq!(c.get(), 16);
        // Not reached: it stays.
        window(&c, 300, 20, Some(10));
        assert_eq!(c.get(), 16);
        // Less than half used: down to twice what was.
        window(&c, 400, 20, Some(3));
        assert_eq!(c.get(), 6);
        let read = c.read();
        assert_eq!((read.ground_ms, read.recent_ms), (Some(20.0), Some(20.0)));
    }

    #[test]
    fn slower_than_the_target_lowers_it_by_the_gradient_and_halves_at_most() {
        let c = ceiling(4, 100);
        for end in [100, 200, 300, 400] {
            window(&c, end, 20, FULL);
        }
        assert_eq!(c.get(), 64);
        // 40 ms against a target of 25: × 0.625.
        window(&c, 500, 40, FULL);
        assert_eq!(c.get(), 40);
        // 200 ms: halved, not more.
        window(&c, 600, 200, FULL);
        assert_eq!(c.get(), 20);
        // Back within the target: grows by the gradient (× 1.25), no more doubling.
        window(&c, 700, 20, FULL);
        assert_eq!(c.get(), 25);
        window(&c, 800, 25, FULL);
        assert_eq!(c.get(), 26, "at the target: one more");
    }

    #[test]
    fn stays_within_min_and_max() {
        let c = ceiling(4, 10);
        for end in [100, 200, 300] {
            window(&c, end, 20, FULL);
        }
        assert_eq!(c.get(), 10);
        window(&c, 400, 500, FULL);
        assert_eq!(c.get(), 5);
        window(&c, 500, 500, FULL);
        assert_eq!(c.get(), 4, "halved to 2 at most, kept at min");
    }

    #[test]
    fn a_ground_measured_at_min_replaces_a_lower_one() {
        let c = ceiling(2, 100);
        window(&c, 100, 10, FULL);
        assert_eq!(c.get(), 4);
        // The backend is now 50 ms at best: the ceiling falls to min...
        window(&c, 200, 50, FULL);
        assert_eq!(c.get(), 2);
        assert_eq!(c.read().ground_ms, Some(10.0));
        // ...where the window measured is the ground, and the ceiling grows again.
        window(&c, 300, 50, FULL);
        assert_eq!(c.read().ground_ms, Some(50.0));
        assert_eq!(c.get(), 3);
    }

    #[test]
    fn a_slots_time_is_kept_in_32_bits_of_microseconds_across_their_wrap() {
        let wrap = (1u64 << 32) * 1_000;
        let since = Since::at(Nanos(wrap - 1_000_000));
        assert_eq!(since.held(Nanos(wrap + 2_000_000)), Duration::from_millis(3));
    }

    #[test]
    fn the_median_ignores_a_few_slow_responses() {
        let c = ceiling(4, 100);
        for i in 0..20 {
            let held = if i % 5 == 0 { 10_000 } else { 20 };
            c.sample(Duration::from_millis(held), Some(1), Nanos(i * 5 * MS));
        }
        c.sample(Duration::from_millis(20), Some(1), Nanos(100 * MS));
        assert_eq!(c.read().recent_ms, Some(20.0));
        assert_eq!(c.get(), 4, "not reached: it stays");
    }
}
