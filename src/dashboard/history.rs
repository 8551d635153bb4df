//! What the dashboard shows of the recent past: per route and per limit, the requests of
//! each of the last 15 minutes' seconds, in rings of fixed size; the last minute's
//! upstream latency buckets, refused keys and Redis counts. A task reads the counters the
//! request path keeps anyway (`metrics`, the limits' refused keys, the store's counts)
//! once a second and writes the differences here: a request never touches this.
//!
//! The first `MAX_SHOWN` routes and limits of the configuration have a history (a file of
//! many thousand routes would otherwise hold megabytes); a reload keeps the history of
//! every route and limit whose name stays.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant, SystemTime};

use smallvec::SmallVec;

use crate::metrics::RouteCounts;
use crate::proxy::Proxy;
use crate::proxy::refused_keys::COUNTERS;
use crate::running::Running;
use crate::store::StoreCounts;
use crate::top_keys::TopKey;

/// Seconds of history per route and limit: 15 minutes.
pub const SECONDS: usize = 900;
/// Seconds that latency quantiles, refused keys and Redis rates are taken over.
pub const MINUTE: usize = 60;
/// Routes, and limits, with a history.
pub const MAX_SHOWN: usize = 50;

/// One counter's increase in each second, from its totals.
#[derive(Debug)]
pub struct Series {
    total: u64,
    per_second: VecDeque<u32>,
}

impl Series {
    fn starting_at(total: u64) -> Series {
        Series { total, per_second: VecDeque::with_capacity(SECONDS) }
    }

    /// The counter is at `total` now, `seconds` after it was last read: its increase is
    /// spread over them (a late tick's seconds share it).
    fn push(&mut self, total: u64, seconds: usize) {
        let increase = total.saturating_sub(self.total);
        self.total = total;
        let seconds = seconds.clamp(1, SECONDS) as u64;
        for i in 0..seconds {
            let share = increase / seconds + u64::from(i < increase % seconds);
            if self.per_second.len() == SECONDS {
                self.per_second.pop_front();
            }
            self.per_second.push_back(u32::try_from(share).unwrap_or(u32::MAX));
        }
    }

    /// The last `n` seconds, oldest first; seconds before the counter was first read are 0.
    pub fn last(&self, n: usize) -> Vec<u32> {
        let kept = self.per_second.len().min(n);
        let mut out = vec![0; n - kept];
        out.extend(self.per_second.range(self.per_second.len() - kept..));
        out
    }
}

/// A route's history.
#[derive(Debug)]
pub struct RouteHistory {
    pub passed: Series,
    pub delayed: Series,
    pub annotated: Series,
    pub refused: Series,
    pub server_errors: Series,
    /// The upstream latency buckets (bound, count up to it) of each of the last
    /// `MINUTE` + 1 seconds.
    latency: VecDeque<Vec<(f64, u64)>>,
}

impl RouteHistory {
    fn starting_at(counts: RouteCounts) -> RouteHistory {
        RouteHistory {
            passed: Series::starting_at(counts.passed),
            delayed: Series::starting_at(counts.delayed),
            annotated: Series::starting_at(counts.annotated),
            refused: Series::starting_at(counts.refused),
            server_errors: Series::starting_at(counts.server_errors),
            latency: VecDeque::with_capacity(MINUTE + 1),
        }
    }

    fn push(&mut self, counts: RouteCounts, seconds: usize, latency: Vec<(f64, u64)>) {
        self.passed.push(counts.passed, seconds);
        self.delayed.push(counts.delayed, seconds);
        self.annotated.push(counts.annotated, seconds);
        self.refused.push(counts.refused, seconds);
        self.server_errors.push(counts.server_errors, seconds);
        if self.latency.len() > MINUTE {
            self.latency.pop_front();
        }
        self.latency.push_back(latency);
    }

    /// The `q` quantile (0 to 1) of the upstream latency over the last minute, in
    /// seconds, and the number of responses it is taken from; `None` without any.
    pub fn latency(&self, q: f64) -> Option<(f64, u64)> {
        let (first, last) = (self.latency.front()?, self.latency.back()?);
        // A route's histogram is made by its first request: a second read before then
        // has no buckets, and every observation since came after it.
        let then = |i: usize| first.get(i).map_or(0, |&(_, then)| then);
        let increase: Vec<(f64, u64)> =
            last.iter().enumerate().map(|(i, &(bound, now))| (bound, now.saturating_sub(then(i)))).collect();
        let count = increase.last().map_or(0, |&(_, n)| n);
        quantile(q, &increase).map(|value| (value, count))
    }
}

/// The `q` quantile of the observations counted in cumulative `buckets` (upper bound,
/// observations up to it; the last bound infinite), interpolated linearly within its
/// bucket, as Prometheus's `histogram_quantile` does; in the last, open bucket, the
/// highest finite bound. `None` without observations.
pub fn quantile(q: f64, buckets: &[(f64, u64)]) -> Option<f64> {
    let total = buckets.last()?.1;
    if total == 0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * total as f64;
    let (mut lower, mut below) = (0.0, 0);
    for &(bound, count) in buckets {
        if count as f64 >= rank {
            if bound.is_infinite() {
                return Some(lower);
            }
            let within = (count - below) as f64;
            let share = if within == 0.0 { 1.0 } else { (rank - below as f64) / within };
            return Some(lower + (bound - lower) * share);
        }
        (lower, below) = (bound, count);
    }
    Some(lower)
}

/// A limit's history.
#[derive(Debug)]
pub struct LimitHistory {
    pub passed: Series,
    pub delayed: Series,
    pub rejected: Series,
    /// The keys refused most in each of the last `MINUTE` seconds.
    refused: VecDeque<SmallVec<[TopKey; COUNTERS]>>,
}

impl LimitHistory {
    fn starting_at([passed, delayed, rejected]: [u64; 3]) -> LimitHistory {
        LimitHistory {
            passed: Series::starting_at(passed),
            delayed: Series::starting_at(delayed),
            rejected: Series::starting_at(rejected),
            refused: VecDeque::with_capacity(MINUTE),
        }
    }

    fn push(&mut self, [passed, delayed, rejected]: [u64; 3], seconds: usize, refused: SmallVec<[TopKey; COUNTERS]>) {
        self.passed.push(passed, seconds);
        self.delayed.push(delayed, seconds);
        self.rejected.push(rejected, seconds);
        for second in 0..seconds.clamp(1, MINUTE) {
            if self.refused.len() == MINUTE {
                self.refused.pop_front();
            }
            // A late tick's keys go to its last second.
            self.refused.push_back(if second + 1 == seconds.clamp(1, MINUTE) {
                refused.clone()
            } else {
                SmallVec::new()
            });
        }
    }

    /// The `n` keys refused most over the last minute, most first (counts are lower
    /// bounds: each second counts its most refused keys only).
    pub fn refused_most(&self, n: usize) -> Vec<TopKey> {
        let mut sums: HashMap<u64, TopKey> = HashMap::new();
        for key in self.refused.iter().flatten() {
            sums.entry(key.key).and_modify(|sum| sum.count += key.count).or_insert_with(|| key.clone());
        }
        let mut top: Vec<TopKey> = sums.into_values().collect();
        top.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.label.cmp(&b.label)));
        top.truncate(n);
        top
    }
}

/// Everything the dashboard keeps, as of the last tick.
#[derive(Debug, Default)]
pub struct History {
    /// Seconds recorded since start: what the page asks for the seconds after.
    pub seq: u64,
    /// When the last second was recorded.
    pub at: Option<SystemTime>,
    last_tick: Option<Instant>,
    pub routes: HashMap<String, RouteHistory>,
    pub limits: HashMap<String, LimitHistory>,
    /// The store's counts at each of the last `MINUTE` + 1 seconds.
    store: VecDeque<StoreCounts>,
}

impl History {
    /// Records the second that ends at `now` from `proxy`'s counters.
    pub fn record(&mut self, proxy: &Proxy, now: Instant) {
        // Ticks come a second apart; one that comes late covers the seconds it missed.
        let seconds = self.last_tick.map_or(1, |last| (now - last).as_secs_f64().round().max(1.0) as usize);
        self.last_tick = Some(now);
        self.seq += seconds as u64;
        self.at = Some(SystemTime::now());
        let (config, metrics) = (proxy.config(), proxy.metrics());

        let latencies = metrics.latencies(MAX_SHOWN);
        let mut routes = HashMap::new();
        for ((i, route), latency) in config.routes.iter_enumerated().take(MAX_SHOWN).zip(latencies) {
            let counts = metrics.route_counts(i);
            let mut history = self.routes.remove(&route.name).unwrap_or_else(|| RouteHistory::starting_at(counts));
            history.push(counts, seconds, latency);
            routes.insert(route.name.clone(), history);
        }
        self.routes = routes;

        let mut limits = HashMap::new();
        for (i, limit) in config.limits.iter_enumerated().take(MAX_SHOWN) {
            let decisions = metrics.limit_decisions(i);
            let mut history = self.limits.remove(&limit.name).unwrap_or_else(|| LimitHistory::starting_at(decisions));
            let refused = proxy.refused_keys(i).map(|r| r.take()).unwrap_or_default();
            history.push(decisions, seconds, refused);
            limits.insert(limit.name.clone(), history);
        }
        self.limits = limits;

        match proxy.store() {
            Some(store) => {
                if self.store.len() > MINUTE {
                    self.store.pop_front();
                }
                self.store.push_back(store.counts());
            }
            None => self.store.clear(),
        }
    }

    /// The store's counts now, their increase over the last minute (or since recorded),
    /// and the seconds that is; `None` without global limits.
    pub fn store(&self) -> Option<(&StoreCounts, StoreCounts, usize)> {
        let (first, last) = (self.store.front()?, self.store.back()?);
        Some((last, last.since(first), self.store.len() - 1))
    }

    /// Seconds the history covers back from now, at most `SECONDS`.
    pub fn seconds(&self) -> usize {
        usize::try_from(self.seq).unwrap_or(usize::MAX).min(SECONDS)
    }
}

/// Records a second of `running`'s counters into `history` every second, as long as the
/// history is kept (by the admin listener). The first is recorded now, before the
/// listeners accept anything: what the counters hold from then on is history.
pub fn start(running: Arc<Running>) -> Arc<Mutex<History>> {
    let mut first = History::default();
    first.record(&running.proxy(), Instant::now());
    let history = Arc::new(Mutex::new(first));
    let kept: Weak<Mutex<History>> = Arc::downgrade(&history);
    tokio::spawn(async move {
        let start = tokio::time::Instant::now() + Duration::from_secs(1);
        let mut ticks = tokio::time::interval_at(start, Duration::from_secs(1));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let Some(history) = kept.upgrade() else { return };
            let proxy = running.proxy();
            history.lock().unwrap_or_else(PoisonError::into_inner).record(&proxy, Instant::now());
        }
    });
    history
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_series_keeps_each_seconds_increase_and_spreads_a_late_ticks_over_its_seconds() {
        let mut series = Series::starting_at(100);
        series.push(103, 1);
        series.push(110, 3);
        assert_eq!(series.last(6), [0, 0, 3, 3, 2, 2]);
        for total in 0..(SECONDS as u64 + 10) {
            series.push(110 + total, 1);
        }
        assert_eq!(series.per_second.len(), SECONDS, "the ring keeps its size");
    }

    #[test]
    fn the_latency_of_a_route_whose_first_request_came_after_the_first_second_is_shown_at_once() {
        let mut history = RouteHistory::starting_at(RouteCounts::default());
        history.push(RouteCounts::default(), 1, Vec::new());
        assert_eq!(history.latency(0.5), None);
        history.push(RouteCounts::default(), 1, vec![(0.001, 0), (0.002, 4), (f64::INFINITY, 4)]);
        assert_eq!(history.latency(0.5), Some((0.0015, 4)));
        assert_eq!(history.latency(0.99).map(|(_, n)| n), Some(4));
    }

    #[test]
    fn a_quantile_is_interpolated_within_its_bucket() {
        let buckets = [(0.001, 0), (0.002, 50), (0.004, 99), (f64::INFINITY, 100)];
        assert_eq!(quantile(0.5, &buckets), Some(0.002));
        let p25 = quantile(0.25, &buckets).unwrap();
        assert!((p25 - 0.0015).abs() < 1e-9, "{p25}");
        assert_eq!(quantile(1.0, &buckets), Some(0.004), "the open bucket says its lower bound");
        assert_eq!(quantile(0.5, &[(0.001, 0), (f64::INFINITY, 0)]), None);
    }

    #[test]
    fn the_keys_refused_most_add_up_over_the_minute() {
        let mut limit = LimitHistory::starting_at([0; 3]);
        let key = |key: u64, count: u64| TopKey { key, label: format!("k{key}"), count };
        limit.push([0, 0, 5], 1, [key(1, 3), key(2, 2)].into_iter().collect());
        limit.push([0, 0, 9], 1, [key(2, 4)].into_iter().collect());
        let top: Vec<(String, u64)> = limit.refused_most(5).into_iter().map(|k| (k.label, k.count)).collect();
        assert_eq!(top, [("k2".to_owned(), 6), ("k1".to_owned(), 3)]);
        for _ in 0..MINUTE {
            limit.push([0, 0, 9], 1, SmallVec::new());
        }
        assert!(limit.refused_most(5).is_empty(), "a minute later");
    }
}
