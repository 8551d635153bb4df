//! The one clock every limiting decision reads: the algorithms, the Redis near-cache, the
//! circuit breaker and the fallback reports. Production reads the system clock; tests and
//! replays set a `ManualClock` and see every part of the decision move with it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// An instant on the limiter clock: nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nanos(pub u64);

impl Nanos {
    /// `d` later (saturating: never wraps past the end of time).
    pub fn after(self, d: Duration) -> Nanos {
        Nanos(self.0.saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)))
    }

    /// How long after `earlier` this is (zero if it is not later).
    pub fn since(self, earlier: Nanos) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// Whole seconds since the epoch.
    pub fn secs(self) -> u64 {
        self.0 / 1_000_000_000
    }
}

/// Where the limiter reads the time: the system, or a clock the caller sets.
#[derive(Clone, Debug, Default)]
pub enum Clock {
    /// The wall clock read once, advanced by the monotonic clock since: it never steps
    /// back when the system time is adjusted, and fixed windows align with every other
    /// instance's.
    #[default]
    System,
    /// Whatever the `ManualClock` was last set to.
    Manual(ManualClock),
}

impl Clock {
    #[inline]
    pub fn now(&self) -> Nanos {
        match self {
            Clock::System => system_now(),
            Clock::Manual(manual) => manual.now(),
        }
    }
}

/// A clock that moves only when told to: for tests, and to replay traffic on a virtual
/// timeline. Clones share one time.
#[derive(Clone, Debug, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    pub fn new(start: Nanos) -> Self {
        ManualClock(Arc::new(AtomicU64::new(start.0)))
    }

    #[inline]
    pub fn now(&self) -> Nanos {
        Nanos(self.0.load(Ordering::Acquire))
    }

    pub fn set(&self, to: Nanos) {
        self.0.store(to.0, Ordering::Release);
    }

    pub fn advance(&self, by: Duration) {
        self.set(self.now().after(by));
    }
}

impl From<ManualClock> for Clock {
    fn from(manual: ManualClock) -> Self {
        Clock::Manual(manual)
    }
}

#[inline]
fn system_now() -> Nanos {
    static ORIGIN: LazyLock<(Instant, u64)> = LazyLock::new(|| {
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        (Instant::now(), u64::try_from(wall.as_nanos()).unwrap_or(0))
    });
    let (instant, wall) = *ORIGIN;
    Nanos(wall.saturating_add(u64::try_from(instant.elapsed().as_nanos()).unwrap_or(u64::MAX)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told_and_its_clones_share_the_time() {
        let manual = ManualClock::new(Nanos(5));
        let clock = Clock::from(manual.clone());
        assert_eq!(clock.now(), Nanos(5));
        manual.advance(Duration::from_nanos(10));
        assert_eq!(clock.now(), Nanos(15));
        manual.set(Nanos(3));
        assert_eq!(clock.now(), Nanos(3));
    }

    #[test]
    fn the_system_clock_never_steps_back() {
        let clock = Clock::System;
        let a = clock.now();
        assert!(clock.now() >= a && a.secs() > 1_600_000_000);
    }
}
