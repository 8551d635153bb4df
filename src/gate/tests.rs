//! The local decision, all or nothing, on a manual clock.

use std::net::{IpAddr, Ipv4Addr};
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;

use super::{Decision, Gate};
use crate::clock::{ManualClock, Nanos};
use crate::config::{LimitId, RouteId};
use crate::limit::gcra_cases;
use crate::limit::{Limiters, Outcome};
use crate::policy::LimitUse;
use crate::policy::key::{KeyHash, KeySource};

/// A gate on a manual clock, read as its limiters for their counts.
struct Harness {
    gate: Gate,
    clock: ManualClock,
}

impl Harness {
    /// Decides `src` locally at the instant `at` gives (ns since the epoch).
    fn check(&self, limits: &[usize], src: &KeySource<'_>, cost: u64, at: impl FnOnce() -> u64) -> Decision {
        self.clock.set(Nanos(at()));
        self.gate.check(&plain(limits), src, cost)
    }
}

impl Deref for Harness {
    type Target = Limiters;
    fn deref(&self) -> &Limiters {
        self.gate.limiters()
    }
}

fn limiters(limits: &str) -> Arc<Harness> {
    let yaml = format!("listen: 127.0.0.1:0\nlimits:\n{limits}");
    let clock = ManualClock::default();
    Arc::new(Harness { gate: Gate::new(&crate::config::parse(&yaml, "test").unwrap(), clock.clone().into()), clock })
}

fn check(l: &Harness, limits: &[usize], ip: u32, now_ms: u64) -> Decision {
    let headers = HeaderMap::new();
    let src = KeySource::get(IpAddr::V4(Ipv4Addr::from(ip)), "/", &headers);
    l.check(limits, &src, 1, || now_ms * 1_000_000)
}

/// Limits `limits`, each with its own burst.
fn plain(limits: &[usize]) -> Vec<LimitUse> {
    limits.iter().map(|&l| LimitUse::plain(LimitId::from(l))).collect()
}

fn passes(d: &Decision) -> bool {
    matches!(d, Decision::Pass { .. })
}

/// Each hand-worked schedule of `gcra_cases`, replayed on the injected clock.
#[test]
fn the_leaky_bucket_family_answers_as_worked_out_by_hand() {
    use gcra_cases::{Answer, CASES};
    let yaml: String =
        CASES.iter().enumerate().map(|(i, c)| format!("  l{i}: {{ key: ip, {} }}\n", c.policy)).collect();
    let l = limiters(&yaml);
    let headers = HeaderMap::new();
    for (i, case) in CASES.iter().enumerate() {
        for (n, step) in case.steps.iter().enumerate() {
            let src = KeySource::get(IpAddr::V4(Ipv4Addr::new(10, 0, 0, step.key)), "/", &headers);
            let at = 1_700_000_000_000_000_000 + step.at * 1_000_000_000;
            let (Decision::Pass { standings, .. } | Decision::Reject { standings, .. }) =
                l.check(&[i], &src, step.cost, || at);
            let s = standings[0];
            let retry = match s.outcome {
                Outcome::Rejected(retry) => Some(retry),
                _ => None,
            };
            assert_eq!(Answer::of(retry, s.remaining, s.reset), step.answer, "{}, request {n}", case.name);
        }
    }
}

#[test]
fn a_flood_of_random_addresses_stays_within_max_keys() {
    let l = limiters("  l: { key: ip, rate: 1r/m, burst: 5, max_keys: 10000 }\n");
    let mut x: u32 = 0x2545_F491;
    for t in 0..300_000u64 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        check(&l, &[0], x, t / 1000);
    }
    assert!(l.keys(LimitId::from(0)) <= 10_000 + 63, "{} keys", l.keys(LimitId::from(0)));
    assert!(l.evictions(LimitId::from(0)) > 0);
}

#[test]
fn concurrency_slots_return_when_permits_drop_and_in_flight_keys_are_never_evicted() {
    let l = limiters("  c: { key: ip, concurrency: 2, max_keys: 4 }\n");
    let mut held = Vec::new();
    for ip in 1..=4 {
        held.push(check(&l, &[0], ip, 0));
        held.push(check(&l, &[0], ip, 0));
    }
    assert!(held.iter().all(passes));
    // Each of the four keys has two requests in flight: a third is refused, and so is
    // a fifth key, since the table may not forget a key with requests in flight.
    assert!(!passes(&check(&l, &[0], 1, 0)));
    assert!(!passes(&check(&l, &[0], 5, 0)));
    assert_eq!(l.keys(LimitId::from(0)), 4);
    held.pop();
    assert!(passes(&check(&l, &[0], 4, 0)));
    held.clear();
    assert_eq!(l.keys(LimitId::from(0)), 0, "released keys are removed");
}

#[test]
fn a_rejection_takes_no_concurrency_slot() {
    // Limit 0 admits up to 1 in flight; limit 1 rejects every request after the first.
    let l = limiters("  a: { key: ip, concurrency: 1 }\n  b: { key: ip, rate: 1r/m }\n");
    let first = check(&l, &[0, 1], 1, 0);
    assert!(passes(&first));
    drop(first);
    for _ in 0..3 {
        assert!(!passes(&check(&l, &[0, 1], 1, 0)));
    }
    assert_eq!(l.keys(LimitId::from(0)), 0);
    assert!(passes(&check(&l, &[0], 1, 0)));
}

#[test]
fn dry_run_never_rejects_or_delays_but_keeps_state_as_if_enforced() {
    let l = limiters("  d: { key: ip, rate: 1r/s, burst: 1, dry_run: true }\n");
    let outcomes: Vec<Outcome> = (0..3)
        .map(|_| match check(&l, &[0], 1, 0) {
            Decision::Pass { wait, standings, .. } => {
                assert_eq!(wait, Duration::ZERO);
                standings[0].outcome
            }
            Decision::Reject { .. } => panic!("a dry-run limit rejected"),
        })
        .collect();
    let delayed = Outcome::Delayed(Duration::from_secs(1));
    assert_eq!(outcomes, [Outcome::Passed, delayed, Outcome::Rejected(Duration::from_secs(1))]);
    // The would-be rejection stored nothing: one second later the key is where two
    // admitted requests left it.
    let Decision::Pass { standings, .. } = check(&l, &[0], 1, 1000) else { panic!() };
    assert_eq!(standings[0].outcome, delayed);
}

/// Over a limit with `action: annotate`, a request passes at once, its result marked
/// annotated, and stores nothing (as a dry-run limit's would-be refusal); below it the
/// limit still delays as its burst and delay say.
#[test]
fn a_soft_limit_passes_what_is_over_it_annotated_storing_nothing_and_still_delays() {
    let l = limiters("  soft: { key: ip, rate: 1r/s, burst: 2, delay: 1, action: annotate }\n");
    let decide = |ms| match check(&l, &[0], 1, ms) {
        Decision::Pass { wait, results, .. } => (wait.as_millis() as u64, results[0].outcome, results[0].annotated),
        Decision::Reject { .. } => panic!("a soft limit refused"),
    };
    let over = Outcome::Rejected(Duration::from_secs(1));
    assert_eq!(decide(0), (0, Outcome::Passed, false));
    assert_eq!(decide(0), (0, Outcome::Passed, false));
    assert_eq!(decide(0), (1000, Outcome::Delayed(Duration::from_secs(1)), false), "delayed as its delay says");
    assert_eq!(decide(0), (0, over, true), "over it: forwarded at once, annotated");
    assert_eq!(decide(0), (0, over, true));
    // The annotated requests took nothing: a second later the key is where the three
    // admitted ones left it (excess 2, one waits a second).
    assert_eq!(decide(1000), (1000, Outcome::Delayed(Duration::from_secs(1)), false));
}

/// `annotate_from: 80%` marks the requests that leave the key's used share of the
/// capacity (a rate's burst + 1, a concurrency limit's max) at or above 80 %, and the
/// limit, acting as `refuse`, refuses over it: annotate, then refuse.
#[test]
fn annotate_from_marks_what_reaches_the_share_and_refuse_still_refuses_over_it() {
    let l = limiters(
        "  ladder: { key: ip, rate: 1r/m, burst: 9, nodelay: true, annotate_from: 80% }\n  \
         slots: { key: ip, concurrency: 5, annotate_from: 60% }\n",
    );
    let annotated: Vec<Option<bool>> = (0..11)
        .map(|_| match check(&l, &[0], 1, 0) {
            Decision::Pass { results, .. } => Some(results[0].annotated),
            Decision::Reject { .. } => None,
        })
        .collect();
    let mut expected = vec![Some(false); 7];
    expected.extend([Some(true), Some(true), Some(true), None]);
    assert_eq!(annotated, expected, "the 8th of 10 uses 80 %; the 11th is over");
    // In flight: the 3rd of 5 holds 60 %; the 6th is refused.
    let mut held = Vec::new();
    let mut annotated = Vec::new();
    for _ in 0..6 {
        match check(&l, &[1], 1, 0) {
            Decision::Pass { results, permits, .. } => {
                annotated.push(Some(results[0].annotated));
                held.push(permits);
            }
            Decision::Reject { .. } => annotated.push(None),
        }
    }
    assert_eq!(annotated, [Some(false), Some(false), Some(true), Some(true), Some(true), None]);
}

/// The ladder docs/limits.md shows ("Soft limits"): 20 at once, delay 15, annotate from
/// 80 %: the first 15 pass, the 16th is annotated, the 17th to 20th annotated and
/// delayed a tenth of a second more each, the 21st refused.
#[test]
fn the_documented_ladder_annotates_then_delays_then_refuses() {
    let l = limiters("  per_key: { key: ip, rate: 10r/s, burst: 19, delay: 15, annotate_from: 80% }\n");
    let fates: Vec<(u64, bool)> = (0..21)
        .map(|_| match check(&l, &[0], 1, 0) {
            Decision::Pass { wait, results, .. } => (wait.as_millis() as u64, results[0].annotated),
            Decision::Reject { .. } => (u64::MAX, false),
        })
        .collect();
    let mut expected = vec![(0, false); 15];
    expected.extend([(0, true), (100, true), (200, true), (300, true), (400, true), (u64::MAX, false)]);
    assert_eq!(fates, expected);
}

/// GCRA and the token bucket decide as governor's GCRA does, request by request.
#[test]
fn gcra_and_token_bucket_agree_with_governor() {
    use std::num::NonZeroU32;

    use governor::clock::FakeRelativeClock;
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    let strategy = (1u64..1000, 0u32..8, any::<bool>(), proptest::collection::vec(0u64..3000, 1..100));
    TestRunner::new(Config::with_cases(128))
        .run(&strategy, |(period_ms, burst, as_token_bucket, gaps)| {
            let limit = if as_token_bucket {
                format!(
                    "  l: {{ key: ip, algorithm: token_bucket, capacity: {}, refill: 1r/{period_ms}ms }}\n",
                    burst + 1
                )
            } else if burst == 0 {
                format!("  l: {{ key: ip, algorithm: gcra, rate: 1r/{period_ms}ms }}\n")
            } else {
                format!("  l: {{ key: ip, algorithm: gcra, rate: 1r/{period_ms}ms, burst: {burst} }}\n")
            };
            let ours = limiters(&limit);
            let quota = governor::Quota::with_period(Duration::from_millis(period_ms))
                .expect("non-zero period")
                .allow_burst(NonZeroU32::new(burst + 1).expect("non-zero"));
            let clock = FakeRelativeClock::default();
            let theirs = governor::RateLimiter::direct_with_clock(quota, clock.clone());
            let mut now_ns = 1_000_000_000_000u64;
            for (n, gap) in gaps.into_iter().enumerate() {
                let gap_ns = gap * period_ms * 1_000_000 / 1000;
                now_ns += gap_ns;
                clock.advance(Duration::from_nanos(gap_ns));
                let headers = HeaderMap::new();
                let src = KeySource::get([10, 0, 0, 1].into(), "/", &headers);
                let ours = passes(&ours.check(&[0], &src, 1, || now_ns));
                prop_assert_eq!(ours, theirs.check().is_ok(), "request {}", n);
            }
            Ok(())
        })
        .unwrap();
}

/// A route that lists a limit with its own burst and also reaches it through another
/// limit's override decides with the route's entry, once: the request counts once, under
/// the burst the route gave (whichever order the two uses were found in).
#[test]
fn a_limit_listed_and_reached_through_an_override_decides_once_with_the_routes_own_burst() {
    let l = limiters(
        "  a: { key: ip, rate: 1r/m, overrides: [ { match: { cidrs: [10.0.0.0/8] }, use: b } ] }\n  \
         b: { key: ip, rate: 1r/m, burst: 0 }\n",
    );
    let (a, b) = (LimitId::from(0), LimitId::from(1));
    let own = Some(crate::policy::Burst { burst: 3, delay: 3 });
    let headers = HeaderMap::new();
    let src = KeySource::get([10, 0, 0, 1].into(), "/", &headers);
    for route in [
        [LimitUse::plain(a), LimitUse { limit: b, burst: own, count: None }],
        [LimitUse { limit: b, burst: own, count: None }, LimitUse::plain(a)],
    ] {
        let passed = (0..6).filter(|_| passes(&l.gate.check(&route, &src, 1))).count();
        // Burst 3 on 1r/m: four at once, then refused; each request counted once.
        assert_eq!(passed, 4);
        l.reset(b, &src).unwrap();
    }
}

#[test]
fn a_flood_of_fresh_keys_frees_neither_a_throttled_nor_a_banned_key() {
    // Every algorithm, with room for 64 keys: key 1 is throttled, key 2 banned, then
    // 10 × max_keys fresh keys pass, one request each, while both keep being refused.
    for policy in [
        "algorithm: leaky_bucket, rate: 1r/m",
        "algorithm: leaky_bucket, rate: 1r/m, burst: 3, nodelay: true",
        "algorithm: gcra, rate: 1r/m",
        "algorithm: token_bucket, capacity: 2, refill: 1r/m",
        "algorithm: min_interval, interval: 1m",
        "algorithm: fixed_window, limit: 1, window: 1m",
        "algorithm: sliding_window, limit: 1, window: 1m",
        "algorithm: sliding_log, limit: 1, window: 1m",
        "rates: [10r/s, 1r/m]",
    ] {
        let l = limiters(&format!(
            "  a: {{ key: ip, max_keys: 64, {policy} }}\n  b: {{ key: ip, max_keys: 64, {policy}, ban: 10m }}\n"
        ));
        let mut now = 0;
        let refuse = |limit: usize, key: u32, now: u64| {
            while passes(&check(&l, &[limit], key, now)) {}
        };
        refuse(0, 1, now);
        refuse(1, 2, now);
        for fresh in 0..640 {
            now += 1;
            for limit in [0, 1] {
                assert!(passes(&check(&l, &[limit], 1000 + fresh, now)), "{policy}: fresh key {fresh} refused");
            }
            if fresh % 64 == 0 {
                assert!(!passes(&check(&l, &[0], 1, now)), "{policy}: throttled key freed after {fresh}");
                assert!(!passes(&check(&l, &[1], 2, now)), "{policy}: banned key freed after {fresh}");
            }
        }
        assert!(!passes(&check(&l, &[0], 1, now)), "{policy}: throttled key freed");
        assert!(!passes(&check(&l, &[1], 2, now)), "{policy}: banned key freed");
    }
}

#[test]
fn a_rejection_bans_the_key_for_the_ban_and_only_enforced_limits_ban() {
    let l = limiters("  b: { key: ip, rate: 10r/s, ban: 1m }\n  d: { key: ip, rate: 10r/s, ban: 1m, dry_run: true }\n");
    let retry = |d: Decision| match d {
        Decision::Reject { retry_after, .. } => Some(retry_after),
        Decision::Pass { .. } => None,
    };
    assert!(passes(&check(&l, &[0], 1, 0)));
    assert_eq!(retry(check(&l, &[0], 1, 10)), Some(Duration::from_secs(60)));
    // Long after the rate would admit again, the ban still refuses, for the time left.
    assert_eq!(retry(check(&l, &[0], 1, 1_000)), Some(Duration::from_millis(59_010)));
    assert!(passes(&check(&l, &[0], 2, 1_000)), "another key is not banned");
    assert_eq!(l.bans(LimitId::from(0)), 1);
    assert!(passes(&check(&l, &[0], 1, 60_010)));
    // The dry-run limit would reject and ban, but does neither.
    assert!(passes(&check(&l, &[1], 3, 0)));
    assert!(passes(&check(&l, &[1], 3, 10)));
    assert!(passes(&check(&l, &[1], 3, 1_000)));
    assert_eq!(l.bans(LimitId::from(1)), 0);
}

#[test]
fn several_windows_all_must_admit_and_the_slowest_sets_retry_after() {
    // 3 per second and 5 per minute, each a bucket of its size, banning on rejection.
    let l = limiters("  w: { key: ip, rates: [3r/s, 5r/m], ban: 10m }\n  x: { key: ip, rates: [3r/s, 5r/m] }\n");
    let outcome = |d: Decision| match d {
        Decision::Pass { .. } => Ok(()),
        Decision::Reject { retry_after, .. } => Err(retry_after),
    };
    let per_second: Vec<_> = (0..4).map(|_| outcome(check(&l, &[1], 1, 0))).collect();
    assert_eq!(per_second[..3], [Ok(()), Ok(()), Ok(())]);
    // The fourth does not fit the second's bucket (for 333 ms); it would fit the minute's.
    assert_eq!(per_second[3], Err(Duration::from_nanos(333_333_333)));
    let later: Vec<_> = [1_000, 2_000, 2_001].iter().map(|&t| outcome(check(&l, &[1], 1, t))).collect();
    // Two more pass (5 in the minute); then the minute's bucket, refilling one per 12 s
    // since t = 0, refuses until t = 12 s.
    assert_eq!(later[..2], [Ok(()), Ok(())]);
    assert_eq!(later[2], Err(Duration::from_millis(9_999)));
    // With a ban, the minute window's rejection bans the key for ten minutes.
    for _ in 0..3 {
        assert!(passes(&check(&l, &[0], 2, 0)));
    }
    assert!(passes(&check(&l, &[0], 2, 1_000)) && passes(&check(&l, &[0], 2, 2_000)));
    assert_eq!(outcome(check(&l, &[0], 2, 3_000)), Err(Duration::from_secs(600)));
    assert_eq!(l.bans(LimitId::from(0)), 1);
}

#[test]
fn only_counted_statuses_keep_their_quota_for_every_algorithm() {
    for limit in [
        "rate: 1r/h, burst: 1, nodelay: true",
        "algorithm: token_bucket, capacity: 2, refill: 1r/h",
        "algorithm: fixed_window, limit: 2, window: 1h",
        "algorithm: sliding_window, limit: 2, window: 1h",
        "algorithm: sliding_log, limit: 2, window: 1h",
    ] {
        let l = limiters(&format!("  login: {{ key: ip, {limit}, count: [401, 403] }}\n"));
        let settle = |d: Decision, status: u16| match d {
            Decision::Pass { pending, .. } => assert!(pending.settle(status).0.is_none(), "local settling never waits"),
            Decision::Reject { .. } => panic!("{limit}: rejected"),
        };
        // A realistic clock: a refund subtracts time, which must not run below zero.
        let t = |ms: u64| 1_700_000_000_000 + ms;
        // Successful logins are taken back: any number pass.
        for ms in 0..5 {
            settle(check(&l, &[0], 1, t(ms)), 200);
        }
        // Failures count: two, then the key is refused.
        settle(check(&l, &[0], 1, t(10)), 401);
        settle(check(&l, &[0], 1, t(11)), 403);
        assert!(!passes(&check(&l, &[0], 1, t(12))), "{limit}");
        // Requests in flight hold their quota until answered: two parallel attempts
        // of another client take both units before either is settled.
        let (a, b) = (check(&l, &[0], 2, t(20)), check(&l, &[0], 2, t(20)));
        assert!(passes(&a) && passes(&b) && !passes(&check(&l, &[0], 2, t(20))), "{limit}");
        settle(a, 200);
        assert!(passes(&check(&l, &[0], 2, t(21))), "{limit}: refund not applied");
        drop(b);
    }
}

#[test]
fn min_interval_admits_one_request_per_interval() {
    let l = limiters("  m: { key: ip, algorithm: min_interval, interval: 2s }\n");
    let at = |ms: u64| passes(&check(&l, &[0], 1, 1_700_000_000_000 + ms));
    // 0 passes; 1 999 ms later is too soon; 2 000 ms after the last admission passes.
    assert_eq!([at(0), at(1_999), at(2_000), at(3_000), at(4_000)], [true, false, true, false, true]);
}

#[test]
fn a_dry_run_limit_stores_no_window_when_one_would_reject() {
    let l =
        limiters("  d: { key: ip, rates: [1r/s, 100r/h], dry_run: true }\n  e: { key: ip, rates: [1r/s, 100r/h] }\n");
    let t = |ms: u64| 1_700_000_000_000 + ms;
    // Enforced: the second request at once is rejected by the per-second window and
    // the hour window does not count it.
    assert!(passes(&check(&l, &[1], 1, t(0))));
    assert!(!passes(&check(&l, &[1], 1, t(1))));
    // Dry run: the same requests pass, and the hour window must show the same count
    // as the enforced one: 99 remaining, not 98.
    assert!(passes(&check(&l, &[0], 1, t(0))));
    assert!(passes(&check(&l, &[0], 1, t(1))));
    let remaining = |d: Decision| match d {
        Decision::Pass { standings, .. } | Decision::Reject { standings, .. } => standings[1].remaining,
    };
    assert_eq!(remaining(check(&l, &[0], 1, t(2_000))), remaining(check(&l, &[1], 1, t(2_000))));
}

/// A gate on a manual clock for a whole configuration (`routes` with their limits).
fn gate_of(yaml: &str) -> (Gate, ManualClock, crate::config::Config) {
    let config = crate::config::parse(&format!("listen: 127.0.0.1:0\n{yaml}"), "test").unwrap();
    let clock = ManualClock::default();
    (Gate::new(&config, clock.clone().into()), clock, config)
}

/// Decides a request of `ip` through route `route`'s limits at `ms`: `Ok(wait in ms)` or
/// `Err(retry after in ms)`.
fn through(
    gate: &Gate,
    clock: &ManualClock,
    config: &crate::config::Config,
    route: usize,
    ms: u64,
) -> Result<u64, u64> {
    let headers = HeaderMap::new();
    let src = KeySource::get(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), "/", &headers);
    clock.set(Nanos(1_700_000_000_000_000_000 + ms * 1_000_000));
    match gate.check(&config.routes[RouteId::from(route)].limits, &src, 1) {
        Decision::Pass { wait, .. } => Ok(wait.as_millis() as u64),
        Decision::Reject { retry_after, .. } => Err(retry_after.as_millis() as u64),
    }
}

const SHARED: &str = "limits:
  perip: { key: ip, rate: 10r/s, burst: 20, nodelay: true }
routes:
  - { match: { path: /api }, limits: [perip], respond: { status: 200 } }
  - { match: { path: /users }, limits: [{ limit: perip, burst: 5 }], respond: { status: 200 } }
  - { match: { path: /pages }, limits: [{ limit: perip, burst: 10, delay: 4 }], respond: { status: 200 } }
";

/// nginx's one zone, several `limit_req` lines: every route's requests count in the
/// limit's one state, and each route decides with its own burst and delay.
#[test]
fn routes_decide_with_their_own_burst_on_the_limits_one_state() {
    let (gate, clock, config) = gate_of(SHARED);
    // Twelve at once through the limit's own burst (20, nodelay): all pass, excess 11.
    for _ in 0..12 {
        assert_eq!(through(&gate, &clock, &config, 0, 0), Ok(0));
    }
    // The route with burst 5 sees that excess: refused until it is back within 5, which
    // a state of its own would not have been.
    assert_eq!(through(&gate, &clock, &config, 1, 0), Err(700));
    assert_eq!(through(&gate, &clock, &config, 1, 699), Err(1));
    // The route with burst 10, delay 4, at 200 ms: excess 10, six of them waited for.
    assert_eq!(through(&gate, &clock, &config, 2, 200), Ok(600));
    // ... which counts for every route: the limit's own burst takes 10 more at once.
    for n in 0..10 {
        assert_eq!(through(&gate, &clock, &config, 0, 200), Ok(0), "request {n}");
    }
    assert_eq!(through(&gate, &clock, &config, 0, 200), Err(100));
    // Burst 5 with no delay: admitted at excess 5, waiting it out at the rate.
    assert_eq!(through(&gate, &clock, &config, 1, 1_800), Ok(500));
}

/// A refusal under a route's own burst stores nothing, as any refusal: the limit's own
/// burst still admits exactly what it did.
#[test]
fn a_refusal_under_a_routes_own_burst_takes_nothing() {
    let (gate, clock, config) = gate_of(SHARED);
    for _ in 0..6 {
        assert_eq!(through(&gate, &clock, &config, 0, 0), Ok(0));
    }
    for _ in 0..50 {
        assert!(through(&gate, &clock, &config, 1, 0).is_err());
    }
    for n in 0..15 {
        assert_eq!(through(&gate, &clock, &config, 0, 0), Ok(0), "request {n}");
    }
    assert_eq!(through(&gate, &clock, &config, 0, 0), Err(100));
}

/// A global limit's local twin takes its share of a route's own burst as of its own.
#[tokio::test]
async fn a_global_limits_twin_shares_a_routes_own_burst() {
    let (gate, clock, config) = gate_of(
        "redis: { url: \"redis://127.0.0.1:1\" }
limits:
  g: { key: ip, rate: 10r/s, burst: 9, nodelay: true, scope: global, on_store_error: local, instances: 2 }
routes:
  - { limits: [{ limit: g, burst: 3, nodelay: true }], respond: { status: 200 } }
",
    );
    // Of burst 3 (four at once), each of two instances admits two at once.
    assert_eq!(through(&gate, &clock, &config, 0, 0), Ok(0));
    assert_eq!(through(&gate, &clock, &config, 0, 0), Ok(0));
    assert!(through(&gate, &clock, &config, 0, 0).is_err());
}

/// The global path when Redis cannot answer (nothing listens on its port), on the fake
/// clock: the near-cache counts down, the breaker opens and probes, and each
/// `on_store_error` decides, all read from the gate's one clock.
mod global_path {
    use http::StatusCode;

    use super::*;
    use crate::store::near_cache::Refusal;
    use crate::store::{Call, Reach, StoreCounts, near_key};

    const T0: u64 = 1_700_000_000_000_000_000;
    const MS: u64 = 1_000_000;

    /// A gate of `limits` whose Redis refuses connections, on a manual clock at `T0`.
    fn gate(redis: &str, limits: &str) -> (Gate, ManualClock) {
        let yaml = format!(
            "listen: 127.0.0.1:0\nredis: {{ url: \"redis://127.0.0.1:1\", timeout: 200ms{redis} }}\nlimits:\n{limits}"
        );
        let clock = ManualClock::new(Nanos(T0));
        (Gate::new(&crate::config::parse(&yaml, "test").unwrap(), clock.clone().into()), clock)
    }

    fn src(headers: &HeaderMap) -> KeySource<'static> {
        // Leaked: a test's few bytes, so that the source outlives each call.
        let headers: &'static HeaderMap = Box::leak(Box::new(headers.clone()));
        KeySource::get([10, 0, 0, 1].into(), "/", headers)
    }

    async fn decide_at(gate: &Gate, clock: &ManualClock, limits: &[usize], at_ms: u64, cost: u64) -> Decision {
        clock.set(Nanos(T0 + at_ms * MS));
        let headers = HeaderMap::new();
        gate.decide(&plain(limits), &src(&headers), cost).await
    }

    fn counts(gate: &Gate) -> StoreCounts {
        gate.store().expect("a global limit").counts()
    }

    fn rejected(d: &Decision) -> Option<(StatusCode, Duration)> {
        match d {
            Decision::Reject { status, retry_after, .. } => Some((*status, *retry_after)),
            Decision::Pass { .. } => None,
        }
    }

    #[tokio::test]
    async fn the_near_cache_refuses_one_unit_until_redis_said_counting_down_on_the_clock() {
        let (gate, clock) = gate("", "  g: { key: ip, scope: global, rate: 1r/s, on_store_error: deny }\n");
        let headers = HeaderMap::new();
        let hash = gate.limiters().get(LimitId::from(0)).key.global(&src(&headers)).expect("an ip key");
        let store = gate.store().expect("a global limit");
        let call = Call {
            limit: LimitId::from(0),
            burst: None,
            count: None,
            base: store.base(LimitId::from(0), hash),
            near: KeyHash((hash >> 64) as u64),
        };
        let refusal = Refusal { until: T0 + 2_000 * MS, reset: T0 + 5_000 * MS, window: 0 };
        store.remember_refusal(&call, refusal, Nanos(T0));

        let d = decide_at(&gate, &clock, &[0], 500, 1).await;
        assert_eq!(rejected(&d), Some((StatusCode::TOO_MANY_REQUESTS, Duration::from_millis(1_500))));
        let Decision::Reject { standings, .. } = d else { unreachable!() };
        assert_eq!(standings[0].reset, Duration::from_millis(4_500));
        assert_eq!((counts(&gate).near_hits, counts(&gate).calls), (1, 0), "answered without a call");
        // Two units ask Redis, as does one unit once the refusal has ended: Redis fails,
        // and `deny` refuses with 503.
        let heavy = decide_at(&gate, &clock, &[0], 600, 2).await;
        assert_eq!(rejected(&heavy).map(|r| r.0), Some(StatusCode::SERVICE_UNAVAILABLE));
        let later = decide_at(&gate, &clock, &[0], 2_000, 1).await;
        assert_eq!(rejected(&later).map(|r| r.0), Some(StatusCode::SERVICE_UNAVAILABLE));
        assert_eq!((counts(&gate).near_hits, counts(&gate).calls), (1, 2));
    }

    /// (No probe runs here: a bare gate's store is not watched, and its first probe
    /// would come a cooldown after the breaker opened, in real time.)
    /// A refusal Redis gave under one burst is no answer for another: a route with a
    /// larger burst (or the limit's own) may be admitted now, so it asks Redis.
    #[tokio::test]
    async fn the_near_cache_answers_only_for_the_burst_it_heard_a_refusal_under() {
        let (gate, clock) = gate("", "  g: { key: ip, scope: global, rate: 1r/s, burst: 9, on_store_error: deny }\n");
        let headers = HeaderMap::new();
        let hash = gate.limiters().get(LimitId::from(0)).key.global(&src(&headers)).expect("an ip key");
        let store = gate.store().expect("a global limit");
        let tight = Some(crate::policy::Burst { burst: 1, delay: 0 });
        let call = Call {
            limit: LimitId::from(0),
            burst: tight,
            count: None,
            base: store.base(LimitId::from(0), hash),
            near: near_key((hash >> 64) as u64, tight, None),
        };
        store.remember_refusal(&call, Refusal { until: T0 + 2_000 * MS, reset: T0 + 3_000 * MS, window: 0 }, Nanos(T0));

        clock.set(Nanos(T0 + 500 * MS));
        let through = |burst| [LimitUse { limit: LimitId::from(0), burst, count: None }];
        let same = gate.decide(&through(tight), &src(&headers), 1).await;
        assert_eq!(rejected(&same), Some((StatusCode::TOO_MANY_REQUESTS, Duration::from_millis(1_500))));
        for other in [None, Some(crate::policy::Burst { burst: 5, delay: 5 })] {
            let asked = gate.decide(&through(other), &src(&headers), 1).await;
            // Redis cannot answer here: `deny` refuses with 503, not the remembered 429.
            assert_eq!(rejected(&asked).map(|r| r.0), Some(StatusCode::SERVICE_UNAVAILABLE), "{other:?}");
        }
        assert_eq!(counts(&gate).near_hits, 1);
    }

    #[tokio::test]
    async fn the_breaker_opens_over_its_window_and_no_request_asks_redis_while_it_is_open() {
        let (gate, clock) = gate(
            ", breaker_failures: 2, breaker_window: 1s, breaker_cooldown: 5s",
            "  g: { key: ip, scope: global, rate: 100r/s, on_store_error: allow }\n",
        );
        let store = gate.store().expect("a global limit");
        for at in [0, 1_000] {
            assert_eq!(store.reach(), Reach::Connecting, "nothing answered");
            assert!(passes(&decide_at(&gate, &clock, &[0], at, 1).await), "allow admits");
        }
        let c = counts(&gate);
        assert!(c.breaker_open, "two failures a second apart open it");
        assert_eq!((c.calls, c.errors, c.skipped), (2, 2, 0));
        clock.set(Nanos(T0 + 1_500 * MS));
        let Reach::Unreachable { since, lasting, error, every } = store.reach() else { panic!("{:?}", store.reach()) };
        assert_eq!(
            (since, lasting, every),
            (Nanos(T0 + 1_000 * MS), Duration::from_millis(500), Duration::from_secs(5))
        );
        assert!(error.contains("refused"), "{error}");
        // Open: however long, requests do not ask Redis (a probe in the background does).
        for at in [5_999, 6_000, 60_000] {
            assert!(passes(&decide_at(&gate, &clock, &[0], at, 1).await));
        }
        let c = counts(&gate);
        assert_eq!((c.calls, c.errors, c.skipped, c.breaker_open), (2, 2, 3, true));
        assert_eq!(c.fallbacks, [5, 0, 0], "each decided by on_store_error: allow");
    }

    #[tokio::test]
    async fn the_local_fallback_is_the_limits_share_on_the_clock_and_deny_undoes_local_admissions() {
        let (gate, clock) = gate(
            ", breaker_failures: 1, breaker_window: 0s",
            // Limits are indexed in name order.
            "  a_twin: { key: ip, scope: global, rate: 2r/s, instances: 2 }\n  \
             b_denied: { key: ip, scope: global, rate: 100r/s, on_store_error: deny }\n  \
             c_local: { key: ip, rate: 1r/m }\n",
        );
        // Two instances share 2r/s: this one's twin admits one per second.
        assert!(passes(&decide_at(&gate, &clock, &[0], 0, 1).await));
        let refused = decide_at(&gate, &clock, &[0], 10, 1).await;
        assert_eq!(rejected(&refused), Some((StatusCode::TOO_MANY_REQUESTS, Duration::from_millis(990))));
        assert!(passes(&decide_at(&gate, &clock, &[0], 1_000, 1).await));
        // `deny` refuses with 503, and takes back what the local limit admitted: its one
        // request a minute is still there.
        let denied = decide_at(&gate, &clock, &[1, 2], 2_000, 1).await;
        assert_eq!(rejected(&denied), Some((StatusCode::SERVICE_UNAVAILABLE, Duration::from_secs(1))));
        assert!(passes(&decide_at(&gate, &clock, &[2], 2_001, 1).await));
        assert_eq!(counts(&gate).fallbacks, [0, 1, 3]);
    }
}

/// A preview of every request of a schedule answers what `check` then answers, and
/// changes nothing: no quota, no ban, no concurrency slot.
#[test]
fn a_preview_decides_as_check_does_and_changes_nothing() {
    let l = limiters(
        "  a: { key: ip, rate: 10r/s, burst: 2 }\n  b: { key: ip, rate: 1r/s, ban: 1m }\n  c: { key: ip, concurrency: 1 }\n",
    );
    let headers = HeaderMap::new();
    let src = KeySource::get(IpAddr::V4(Ipv4Addr::from(1)), "/", &headers);
    let outcome = |d: &Decision| match d {
        Decision::Pass { wait, standings, .. } => (None, *wait, standings.clone()),
        Decision::Reject { retry_after, standings, .. } => (Some(*retry_after), Duration::ZERO, standings.clone()),
    };
    let mut held = Vec::new();
    for (limits, at_ms) in
        [(&[0][..], 0), (&[0], 0), (&[0], 0), (&[0], 0), (&[0], 150), (&[1], 0), (&[1], 10), (&[2], 0), (&[2], 1)]
    {
        l.clock.set(Nanos(at_ms * 1_000_000));
        let previews: Vec<_> = (0..3).map(|_| outcome(&l.gate.preview(&plain(limits), &src, 1))).collect();
        assert!(previews.windows(2).all(|p| p[0] == p[1]), "a preview changes nothing: {previews:?}");
        let decided = l.check(limits, &src, 1, || at_ms * 1_000_000);
        assert_eq!(previews[0], outcome(&decided), "limits {limits:?} at {at_ms} ms");
        if let Decision::Pass { permits, .. } = decided {
            held.push(permits);
        }
    }
    assert_eq!(l.bans(LimitId::from(1)), 1, "the ban was started by the check, not by its previews");
}

#[test]
fn the_limits_missing_a_key_are_those_that_decide_the_request_and_count_it_as_missing() {
    let l = limiters(
        "  by_key: { key: \"header:x-key\", on_missing_key: skip, rate: 1r/m, overrides: [ { match: { cidrs: [10.0.0.0/8] }, use: by_user } ] }\n  \
         by_user: { key: \"header:x-user\", on_missing_key: skip, rate: 1r/m }\n  \
         by_ip: { key: ip, rate: 1r/m }\n  \
         exempt: { key: \"header:x-team\", on_missing_key: skip, rate: 1r/m, allow: { cidrs: [192.0.2.0/24] } }\n",
    );
    // Limits are numbered by name: by_ip 0, by_key 1, by_user 2, exempt 3.
    let route = plain(&[0, 1, 3]);
    let missing = |ip: [u8; 4], headers: &HeaderMap| {
        let src = KeySource::get(ip.into(), "/", headers);
        let found: Vec<usize> = l.gate.missing_keys(&route, &src).map(LimitId::index).collect();
        // As the gate counts them when it decides.
        let before: Vec<u64> = (0..4).map(|i| l.missing(LimitId::from(i))).collect();
        drop(l.gate.check(&route, &src, 1));
        let counted: Vec<usize> = (0..4).filter(|&i| l.missing(LimitId::from(i)) > before[i]).collect();
        assert_eq!(found, counted, "{ip:?}");
        found
    };
    let none = HeaderMap::new();
    assert_eq!(missing([198, 51, 100, 1], &none), [1, 3], "an ip key is never missing");
    assert_eq!(missing([10, 0, 0, 1], &none), [2, 3], "an override's limit is asked in its place");
    assert_eq!(missing([192, 0, 2, 1], &none), [1], "an allow-list exempts it from its limit");
    let mut with_key = HeaderMap::new();
    with_key.insert("x-key", "k".parse().unwrap());
    assert_eq!(missing([198, 51, 100, 2], &with_key), [3]);
}

/// A concurrency limit of one slot with a queue (`queue` inside its braces), fair by
/// `x-user`, and a rate limit beside it on route 1.
mod queues {
    use super::*;
    use crate::limit::queue::{QueueEnd, Queued, Ticket};

    const T0: u64 = 1_700_000_000_000_000_000;

    fn gate(queue: &str) -> (Gate, ManualClock, crate::config::Config) {
        gate_of(&format!(
            "limits:
  c: {{ key: ip, concurrency: 1, queue: {{ fair_by: \"header:x-user\", {queue} }} }}
  r: {{ key: ip, rate: 1r/m, burst: 1, nodelay: true }}
routes:
  - {{ match: {{ path: /c }}, limits: [c], respond: {{ status: 200 }} }}
  - {{ match: {{ path: /cr }}, limits: [c, r], respond: {{ status: 200 }} }}
"
        ))
    }

    fn headers(user: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("x-user", user.parse().unwrap());
        headers
    }

    /// Decides a request of `user` through route `route`, and brings it to the queue if
    /// the concurrency limit refuses it.
    fn come(gate: &Gate, config: &crate::config::Config, route: usize, user: &str) -> Result<Decision, Queued> {
        let headers = headers(user);
        let src = KeySource::get(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), "/", &headers);
        let limits = &config.routes[RouteId::from(route)].limits;
        let decision = gate.check(limits, &src, 1);
        match gate.queue_of(&decision) {
            Some(limit) => Err(gate.queue(limits, &src, limit, None)),
            None => Ok(decision),
        }
    }

    fn waiting(queued: Result<Decision, Queued>) -> Ticket {
        match queued {
            Err(Queued::Waiting(ticket)) => ticket,
            _ => panic!("not waiting"),
        }
    }

    fn permits(decision: Result<Decision, Queued>) -> crate::gate::Permits {
        match decision {
            Ok(Decision::Pass { permits, .. }) => permits,
            _ => panic!("not passed"),
        }
    }

    #[tokio::test]
    async fn slots_given_back_go_round_the_flows_in_turn() {
        let (gate, _, config) = gate("max: 10");
        let held = permits(come(&gate, &config, 0, "a"));
        let tickets: Vec<(&str, Ticket)> =
            ["a", "a", "a", "b", "c"].into_iter().map(|u| (u, waiting(come(&gate, &config, 0, u)))).collect();
        // Places in the round when each came: a's one after another; b's first and c's
        // first each after the first of every flow before it.
        let positions: Vec<usize> = tickets.iter().map(|(_, t)| t.position).collect();
        assert_eq!(positions, [1, 2, 3, 2, 3]);
        let mut holder = held;
        let mut order = Vec::new();
        let mut pending: Vec<_> = tickets.into_iter().map(|(u, t)| (u, Box::pin(t.wait()))).collect();
        while !pending.is_empty() {
            drop(holder);
            // The one the slot went to.
            let (i, slot) = pending
                .iter_mut()
                .enumerate()
                .find_map(|(i, (_, w))| Some((i, futures_util::FutureExt::now_or_never(w.as_mut())?.unwrap())))
                .expect("a slot handed on");
            order.push(pending.remove(i).0);
            holder = crate::gate::Permits::default();
            holder.hold(slot);
        }
        assert_eq!(order, ["a", "b", "c", "a", "a"]);
        drop(holder);
        assert_eq!(gate.limiters().in_flight(LimitId::from(0)), 0);
        assert_eq!(gate.limiters().queue_ended(LimitId::from(0), None, QueueEnd::Served), 5);
    }

    #[tokio::test]
    async fn a_full_room_pushes_out_the_longest_flows_newest_or_refuses_the_longest_flow() {
        let (gate, _, config) = gate("max: 3");
        let _held = permits(come(&gate, &config, 0, "a"));
        let a: Vec<Ticket> = (0..3).map(|_| waiting(come(&gate, &config, 0, "a"))).collect();
        // a's fourth: its flow is the longest, refused, after the whole wait (no hand-off
        // seen yet).
        match come(&gate, &config, 0, "a") {
            Err(Queued::Refused { end: QueueEnd::Full, retry_after }) => {
                assert_eq!(retry_after, Duration::from_secs(2))
            }
            _ => panic!("a's fourth not refused"),
        }
        // b's first takes the place of a's newest.
        let b = waiting(come(&gate, &config, 0, "b"));
        let mut a = a.into_iter();
        let (first, second, third) = (a.next().unwrap(), a.next().unwrap(), a.next().unwrap());
        assert!(matches!(third.wait().await, Err((QueueEnd::PushedOut, _))));
        // b's second: b has one, a two: a flow of two is not longer than b's with it.
        assert!(matches!(come(&gate, &config, 0, "b"), Err(Queued::Refused { end: QueueEnd::Full, .. })));
        drop((first, second, b));
        assert_eq!(gate.limiters().queued(LimitId::from(0), None), 0);
        assert_eq!(gate.limiters().queue_ended(LimitId::from(0), None, QueueEnd::Left), 3);
    }

    /// `x-tier: gold` is class gold, every other request bronze.
    const CLASSES: &str = "classes: [{ name: gold, match: { headers: { x-tier: gold } } }, { name: bronze }]";

    fn come_as(gate: &Gate, config: &crate::config::Config, user: &str, tier: &str) -> Result<Decision, Queued> {
        let mut headers = headers(user);
        headers.insert("x-tier", tier.parse().unwrap());
        let src = KeySource::get(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), "/", &headers);
        let limits = &config.routes[RouteId::from(0)].limits;
        let decision = gate.check(limits, &src, 1);
        match gate.queue_of(&decision) {
            Some(limit) => Err(gate.queue(limits, &src, limit, None)),
            None => Ok(decision),
        }
    }

    #[tokio::test]
    async fn the_highest_class_waiting_is_served_first_and_a_full_queue_sheds_the_lowest() {
        let (gate, _, config) = gate(&format!("max: 3, {CLASSES}"));
        let held = permits(come_as(&gate, &config, "a", "bronze"));
        let bronze = [waiting(come_as(&gate, &config, "a", "bronze")), waiting(come_as(&gate, &config, "b", "bronze"))];
        let gold = waiting(come_as(&gate, &config, "c", "gold"));
        // Gold's place counts no bronze ahead of it; bronze's next counts gold's.
        assert_eq!(gold.position, 1);
        assert_eq!(
            gate.limiters().queue_stands(
                LimitId::from(0),
                &KeySource::get(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), "/", &headers("d")),
                None
            ),
            Some(("bronze", 3, 4))
        );
        // Full: a second gold pushes out bronze's newest (b's), not a gold.
        let gold2 = waiting(come_as(&gate, &config, "c", "gold"));
        let [a, b] = bronze;
        assert!(matches!(b.wait().await, Err((QueueEnd::PushedOut, _))));
        // A bronze request finds only its betters and a's: refused.
        assert!(matches!(come_as(&gate, &config, "e", "bronze"), Err(Queued::Refused { end: QueueEnd::Full, .. })));
        // The slot goes to gold first, then gold again, then bronze.
        drop(held);
        let mut holder = crate::gate::Permits::default();
        holder.hold(gold.wait().await.unwrap());
        drop(holder);
        let mut holder = crate::gate::Permits::default();
        holder.hold(gold2.wait().await.unwrap());
        drop(holder);
        assert!(a.wait().await.is_ok());
        let ended = |class, end| gate.limiters().queue_ended(LimitId::from(0), Some(class), end);
        assert_eq!((ended(0, QueueEnd::Served), ended(1, QueueEnd::Served)), (2, 1));
        assert_eq!((ended(1, QueueEnd::PushedOut), ended(1, QueueEnd::Full)), (1, 1));
    }

    #[tokio::test]
    async fn a_class_with_a_share_is_handed_its_share_of_the_slots_and_keeps_its_share_of_the_room() {
        let shared = "classes: [{ name: gold, match: { headers: { x-tier: gold } } }, { name: bronze, share: 25% }]";
        let (gate, _, config) = gate(&format!("max: 8, {shared}"));
        let held = permits(come_as(&gate, &config, "a", "bronze"));
        let mut tickets: Vec<(&str, Ticket)> = Vec::new();
        for (user, tier) in
            [("g1", "gold"), ("g2", "gold"), ("g3", "gold"), ("g4", "gold"), ("b1", "bronze"), ("b2", "bronze")]
        {
            tickets.push((user, waiting(come_as(&gate, &config, user, tier))));
        }
        // Each hand-off earns bronze a quarter of a slot while it waits: the fourth is its.
        let mut order = Vec::new();
        let mut holder = held;
        while !tickets.is_empty() {
            drop(holder);
            let handed = tickets.iter_mut().enumerate().find_map(|(i, (_, t))| Some((i, t.try_end()?.ok()?)));
            let (at, handed) = handed.expect("one handed the slot");
            order.push(tickets.remove(at).0);
            holder = crate::gate::Permits::default();
            holder.hold(handed);
        }
        assert_eq!(order, ["g1", "g2", "g3", "b1", "g4", "b2"]);
        // A full room (8): bronze's two are its share (25 %), not pushed out by gold.
        let _bronze =
            [waiting(come_as(&gate, &config, "b1", "bronze")), waiting(come_as(&gate, &config, "b2", "bronze"))];
        let _gold: Vec<Ticket> = (1..=6).map(|i| waiting(come_as(&gate, &config, &format!("g{i}"), "gold"))).collect();
        assert!(matches!(come_as(&gate, &config, "g7", "gold"), Err(Queued::Refused { end: QueueEnd::Full, .. })));
        // A third bronze pushes out nothing above it (nor a bronze of a flow as short).
        assert!(matches!(come_as(&gate, &config, "b3", "bronze"), Err(Queued::Refused { end: QueueEnd::Full, .. })));
        drop(holder);
    }

    #[tokio::test]
    async fn a_waiter_that_left_gets_no_slot_and_a_slot_nobody_waits_for_is_freed() {
        let (gate, _, config) = gate("max: 10");
        let held = permits(come(&gate, &config, 0, "a"));
        let gone = waiting(come(&gate, &config, 0, "a"));
        let stays = waiting(come(&gate, &config, 0, "b"));
        drop(gone);
        drop(held);
        let slot = stays.wait().await.expect("the slot went to the one still waiting");
        drop(slot);
        // Freed: the next request takes it at once, without a queue.
        assert!(come(&gate, &config, 0, "c").is_ok());
    }

    #[tokio::test]
    async fn the_expected_wait_is_the_gap_between_hand_offs_times_the_requests_ahead() {
        let (gate, clock, config) = gate("max: 2, max_wait: 30s");
        clock.set(Nanos(T0));
        let mut held = permits(come(&gate, &config, 0, "a"));
        for at in [100, 300] {
            let next = waiting(come(&gate, &config, 0, "a"));
            clock.set(Nanos(T0 + at * 1_000_000));
            drop(held);
            let mut p = crate::gate::Permits::default();
            p.hold(next.wait().await.unwrap());
            held = p;
        }
        // Gaps of 200 ms since the first hand-off: a request behind two waiting expects
        // its slot in three.
        let _waiting = [waiting(come(&gate, &config, 0, "a")), waiting(come(&gate, &config, 0, "a"))];
        match come(&gate, &config, 0, "a") {
            Err(Queued::Refused { retry_after, .. }) => assert_eq!(retry_after, Duration::from_millis(600)),
            _ => panic!("not refused"),
        }
        drop(held);
    }

    #[tokio::test]
    async fn a_request_another_limit_refuses_does_not_queue_and_one_refused_after_its_wait_passes_the_slot_on() {
        let (gate, _, config) = gate("max: 10");
        let headers = headers("a");
        let src = KeySource::get(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), "/", &headers);
        let both = &config.routes[RouteId::from(1)].limits;
        let held = permits(come(&gate, &config, 1, "a"));
        // r admits one more now (burst 1): this one waits for c.
        let next = waiting(come(&gate, &config, 1, "a"));
        assert!(passes(&gate.check(&plain(&[1]), &src, 1)), "r's second");
        // c and r both refuse this one: refused at once, not queued.
        assert!(matches!(come(&gate, &config, 1, "a"), Ok(Decision::Reject { .. })));
        let third = waiting(come(&gate, &config, 0, "b"));
        drop(held);
        let slot = next.wait().await.unwrap();
        // r refuses it now: the slot goes on to b.
        let decision = gate.decide_holding(both, &src, 1, Some(slot), Duration::from_millis(5)).await;
        assert!(matches!(decision, Decision::Reject { .. }));
        drop(decision);
        let slot = third.wait().await.expect("the slot passed on");
        assert_eq!(slot.limit, LimitId::from(0));
    }

    /// A global limit's slot (its lease, here a marker that counts its release) given
    /// back while requests wait goes to the next of them; one whose request ends without
    /// taking it hands it on; with nobody waiting, it comes back to be released. One
    /// asks Redis per room; Redis failing ends every wait (`store_error`).
    #[tokio::test]
    async fn a_lease_given_back_goes_to_the_next_waiter_and_comes_back_when_none_waits() {
        struct Lease(Arc<std::sync::atomic::AtomicUsize>);
        impl Drop for Lease {
            fn drop(&mut self) {
                self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let (gate, _, config) = gate("max: 10");
        let limiters = gate.limiters();
        let limit = LimitId::from(0);
        let (ip, headers) = (IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), HeaderMap::new());
        let key = limiters.key_hash(limit, &KeySource::get(ip, "/", &headers)).unwrap();
        let released = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let _held = permits(come(&gate, &config, 0, "a"));
        let (first, second) = (waiting(come(&gate, &config, 0, "a")), waiting(come(&gate, &config, 0, "b")));
        assert!(limiters.give_back_lease(limit, key, Box::new(Lease(Arc::clone(&released)))).is_none());
        // The first's request ends before it takes the slot: on to the second.
        drop(first.wait().await.expect("handed the lease"));
        let handed = second.wait().await.expect("handed on");
        let (_, lease) = handed.take();
        assert!(lease.expect("a lease").downcast::<Lease>().is_ok());
        assert_eq!(released.load(std::sync::atomic::Ordering::Relaxed), 1, "released once, when taken and dropped");
        // Nobody waits: it comes back.
        let back = limiters.give_back_lease(limit, key, Box::new(Lease(Arc::clone(&released))));
        assert!(back.is_some());
        // One asks Redis for the room's slots, while it has waiters.
        let third = waiting(come(&gate, &config, 0, "c"));
        let (asker, _) = limiters.start_asking(limit, key).expect("the first to ask");
        assert!(limiters.start_asking(limit, key).is_none(), "one asker per room");
        assert!(limiters.keep_asking(limit, key, asker));
        // Redis failing: every waiter is to be decided again.
        limiters.ask_again(limit, key);
        assert!(matches!(third.wait().await, Err((QueueEnd::StoreError, _))));
        assert_eq!(limiters.queue_ended(limit, None, QueueEnd::StoreError), 1);
        // The room made again has an asker of its own; the old one stops.
        let _fourth = waiting(come(&gate, &config, 0, "d"));
        let (again, _) = limiters.start_asking(limit, key).expect("a new room's asker");
        assert!(!limiters.keep_asking(limit, key, asker) && limiters.keep_asking(limit, key, again));
    }
}

/// An adaptive concurrency limit (`concurrency: adaptive`) with a queue, on the manual
/// clock: the ceiling it learns bounds the slots, a ceiling come down hands nothing on
/// until the key is back under it, and one gone up hands its spare slots to the waiters.
mod adaptive {
    use super::*;
    use crate::limit::queue::{Queued, Ticket};

    const T0: u64 = 1_700_000_000_000_000_000;

    fn at(clock: &ManualClock, ms: u64) {
        clock.set(Nanos(T0 + ms * 1_000_000));
    }

    fn come(gate: &Gate, config: &crate::config::Config) -> Result<crate::gate::Permits, Ticket> {
        let headers = HeaderMap::new();
        let src = KeySource::get(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), "/", &headers);
        let limits = &config.routes[RouteId::from(0)].limits;
        let decision = gate.check(limits, &src, 1);
        match (gate.queue_of(&decision), decision) {
            (None, Decision::Pass { permits, .. }) => Ok(permits),
            (Some(limit), _) => match gate.queue(limits, &src, limit, None) {
                Queued::Waiting(ticket) => Err(ticket),
                _ => panic!("neither a slot nor a place in the queue"),
            },
            _ => panic!("refused"),
        }
    }

    fn pass(gate: &Gate, config: &crate::config::Config) -> crate::gate::Permits {
        come(gate, config).unwrap_or_else(|_| panic!("waits"))
    }

    fn wait(gate: &Gate, config: &crate::config::Config) -> Ticket {
        come(gate, config).err().expect("passes")
    }

    fn held(ticket: &mut Ticket) -> crate::gate::Permits {
        let mut permits = crate::gate::Permits::default();
        permits.hold(ticket.try_end().expect("handed a slot").expect("served"));
        permits
    }

    fn setup() -> (Gate, ManualClock, crate::config::Config) {
        let (gate, clock, config) = gate_of(
            "limits:
  c: { key: ip, concurrency: adaptive, adaptive: { min: 2, max: 8, window: 100ms }, queue: { max: 10, max_wait: 30s } }
routes:
  - { limits: [c], respond: { status: 200 } }
",
        );
        at(&clock, 0);
        (gate, clock, config)
    }

    #[tokio::test]
    async fn a_ceiling_gone_up_hands_its_spare_slots_to_the_waiters() {
        let (gate, clock, config) = setup();
        let ceiling = || gate.limiters().ceiling(LimitId::from(0)).unwrap().get();
        assert_eq!(ceiling(), 2, "it starts at min");
        let (a, b) = (pass(&gate, &config), pass(&gate, &config));
        let mut waiting: Vec<Ticket> = (0..3).map(|_| wait(&gate, &config)).collect();
        at(&clock, 20);
        drop(a);
        let first = held(&mut waiting[0]);
        assert!(waiting[1].try_end().is_none());
        // The window's end: slots held as fast as the ground, all held: doubled.
        at(&clock, 120);
        drop(b);
        assert_eq!(ceiling(), 4);
        let (second, third) = (held(&mut waiting[1]), held(&mut waiting[2]));
        assert_eq!(gate.limiters().in_flight(LimitId::from(0)), 3);
        drop((first, second, third));
    }

    #[tokio::test]
    async fn a_ceiling_learns_the_time_to_the_upstreams_answer_not_the_clients_reading() {
        let (gate, clock, config) = setup();
        let (mut a, mut b) = (pass(&gate, &config), pass(&gate, &config));
        // Answered at 20 ms; the clients read their responses for ten seconds.
        at(&clock, 20);
        a.answered(false);
        at(&clock, 120);
        b.answered(false);
        at(&clock, 10_000);
        drop((a, b));
        let read = gate.limiters().ceiling(LimitId::from(0)).unwrap().read();
        assert_eq!(read.recent_ms, Some(120.0), "the median of 20 and 120 ms, not of ten seconds");
        assert_eq!(read.now, 4, "fast and full: doubled");
    }

    /// Its two slots taken and given back, fast and full, in its first window (20 and
    /// 120 ms): the ceiling doubles.
    fn doubled(gate: &Gate, clock: &ManualClock, config: &crate::config::Config) {
        let (a, b) = (pass(gate, config), pass(gate, config));
        at(clock, 20);
        drop(a);
        at(clock, 120);
        drop(b);
    }

    #[tokio::test]
    async fn answers_the_upstream_shed_bring_the_ceiling_down_though_fast() {
        let (gate, clock, config) = setup();
        let ceiling = || gate.limiters().ceiling(LimitId::from(0)).unwrap().get();
        doubled(&gate, &clock, &config);
        assert_eq!(ceiling(), 4);
        // All four answered at once, 503: fast, full, yet halved.
        let mut four: Vec<_> = (0..4).map(|_| pass(&gate, &config)).collect();
        at(&clock, 121);
        for p in &mut four[..3] {
            p.answered(true);
        }
        at(&clock, 221);
        four[3].answered(true);
        assert_eq!(ceiling(), 2);
        drop(four);
    }

    #[tokio::test]
    async fn a_ceiling_come_down_hands_nothing_on_until_the_key_is_under_it() {
        let (gate, clock, config) = setup();
        let ceiling = || gate.limiters().ceiling(LimitId::from(0)).unwrap().get();
        doubled(&gate, &clock, &config);
        assert_eq!(ceiling(), 4);
        let mut four: Vec<_> = (0..4).map(|_| pass(&gate, &config)).collect();
        let mut fifth = wait(&gate, &config);
        // Held ten times as long as the ground: halved (at most) to 2, the slot handed on
        // as the key held no more than its ceiling before.
        at(&clock, 1_200);
        four.pop();
        assert_eq!(ceiling(), 2);
        four.push(held(&mut fifth));
        let mut sixth = wait(&gate, &config);
        // Four held, two allowed: the next two given back are freed, the third handed on.
        for left in [3, 2] {
            four.pop();
            assert!(sixth.try_end().is_none(), "handed on over the ceiling");
            assert_eq!(gate.limiters().in_flight(LimitId::from(0)), left);
        }
        four.pop();
        let _sixth = held(&mut sixth);
        assert_eq!(gate.limiters().in_flight(LimitId::from(0)), 2);
    }
}
