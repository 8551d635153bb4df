//! An upstream's servers as the request path sees them: which are usable now (passive
//! health, nginx `max_fails` / `fail_timeout`), which one a request goes to (`balance`),
//! and how many requests each has in progress.
//!
//! A server that fails `max_fails` times within `fail_timeout` is taken out for
//! `fail_timeout`; then one request at a time probes it until one succeeds.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::uri::Authority;
use tracing::{info, warn};

use super::balance::{self, SmoothRoundRobin};
use crate::config::{Balance, Upstream};
use crate::policy::key::KeySource;

pub struct ServerSet {
    upstream: String,
    servers: Box<[Arc<ServerState>]>,
    weights: Box<[u32]>,
    /// Identities for `hash`, by server.
    ids: Box<[u64]>,
    balance: Balance,
    rr: SmoothRoundRobin,
}

struct ServerState {
    address: Authority,
    tls: bool,
    in_flight: AtomicUsize,
    health: Mutex<Health>,
    /// Its last active health check failed: out until one passes.
    check_failed: AtomicBool,
    /// Failures that take the server out (0: never).
    max_fails: u32,
    fail_timeout: Duration,
}

#[derive(Default)]
struct Health {
    /// Failures counted since `since`; a failure more than `fail_timeout` later starts anew.
    fails: u32,
    since: Option<Instant>,
    /// Taken out until then; past it, the next request probes and pushes it one
    /// `fail_timeout` further, so that only one probe is out at a time.
    out_until: Option<Instant>,
}

/// A request's claim on a server: counts as in progress there until dropped (with the
/// response body, once it has been sent).
pub struct InFlight {
    server: Arc<ServerState>,
    index: usize,
}

impl ServerSet {
    pub fn new(upstream: &Upstream) -> Self {
        // With a single server there is nowhere else to send a request: taking it out
        // would only turn its next requests into 502s without trying (nginx does the same).
        let max_fails = if upstream.servers.len() > 1 { upstream.max_fails } else { 0 };
        ServerSet {
            upstream: upstream.name.clone(),
            servers: upstream
                .servers
                .iter()
                .map(|s| {
                    Arc::new(ServerState {
                        address: s.address.clone(),
                        tls: s.tls,
                        in_flight: AtomicUsize::new(0),
                        health: Mutex::default(),
                        check_failed: AtomicBool::new(false),
                        max_fails,
                        fail_timeout: upstream.fail_timeout,
                    })
                })
                .collect(),
            weights: upstream.servers.iter().map(|s| s.weight).collect(),
            ids: upstream.servers.iter().map(|s| balance::server_id(s.address.as_str())).collect(),
            balance: upstream.balance.clone(),
            rr: SmoothRoundRobin::new(upstream.servers.len()),
        }
    }

    /// What `hash` balancing goes by for this request: the same for the same key on
    /// every instance (`None`: not hashing, or the request has no such key, and then
    /// goes round robin).
    pub fn balance_key(&self, src: &KeySource<'_>) -> Option<u64> {
        match &self.balance {
            Balance::Hash(spec) => spec.global(src).map(|k| k as u64),
            _ => None,
        }
    }

    /// The server for the next attempt of a request: usable now and not in `tried`.
    /// `None` when there is none left.
    pub fn pick(&self, key: Option<u64>, tried: &[usize], now: Instant) -> Option<InFlight> {
        let mut refused: smallvec::SmallVec<[usize; 4]> = smallvec::SmallVec::new();
        loop {
            let eligible = |i: usize| !tried.contains(&i) && !refused.contains(&i) && self.servers[i].usable(now);
            let index = self.choose(key, eligible)?;
            // Between the look and the claim another request may have taken the one probe.
            if self.servers[index].claim(now) {
                let server = self.servers[index].clone();
                server.in_flight.fetch_add(1, Ordering::Relaxed);
                return Some(InFlight { server, index });
            }
            refused.push(index);
        }
    }

    fn choose(&self, key: Option<u64>, eligible: impl Fn(usize) -> bool) -> Option<usize> {
        let loads = || -> smallvec::SmallVec<[usize; 8]> {
            self.servers.iter().map(|s| s.in_flight.load(Ordering::Relaxed)).collect()
        };
        match (&self.balance, key) {
            (Balance::Hash(_), Some(key)) => balance::rendezvous(key, &self.ids, &self.weights, eligible),
            (Balance::RoundRobin | Balance::Hash(_), _) => self.rr.pick(&self.weights, eligible),
            (Balance::LeastConn, _) => balance::least_conn(&self.rr, &self.weights, &loads(), eligible),
            (Balance::RandomTwo, _) => {
                balance::random_two(&self.weights, &loads(), eligible, &mut fastrand::Rng::new())
            }
        }
    }

    /// Every server, for the active health check.
    pub fn members(&self) -> impl Iterator<Item = Member> + '_ {
        self.servers.iter().map(|s| Member(s.clone()))
    }

    pub fn len(&self) -> usize {
        self.servers.len()
    }

    pub fn upstream(&self) -> &str {
        &self.upstream
    }

    /// Every server, for the line that says none is usable.
    pub fn addresses(&self) -> String {
        self.servers.iter().map(|s| s.address.as_str()).collect::<Vec<_>>().join(", ")
    }
}

impl ServerState {
    fn usable(&self, now: Instant) -> bool {
        !self.check_failed.load(Ordering::Relaxed)
            && (self.max_fails == 0 || self.lock().out_until.is_none_or(|until| now >= until))
    }

    /// Takes the server for a request; false when it is out and its probe already taken.
    fn claim(&self, now: Instant) -> bool {
        if self.check_failed.load(Ordering::Relaxed) {
            return false;
        }
        if self.max_fails == 0 {
            return true;
        }
        let mut health = self.lock();
        match health.out_until {
            None => true,
            Some(until) if now >= until => {
                health.out_until = Some(now + self.fail_timeout);
                true
            }
            Some(_) => false,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Health> {
        // Health is a few counters, valid whatever a panicking holder left.
        self.health.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl InFlight {
    pub fn address(&self) -> &Authority {
        &self.server.address
    }

    /// Spoken to over TLS (`https://`).
    pub fn tls(&self) -> bool {
        self.server.tls
    }

    pub fn index(&self) -> usize {
        self.index
    }

    /// A response arrived: a server that was out is back.
    pub fn succeeded(&self, upstream: &str) {
        let s = &self.server;
        if s.max_fails == 0 {
            return;
        }
        let mut health = s.lock();
        if health.out_until.take().is_some() {
            health.fails = 0;
            health.since = None;
            info!(upstream, server = %s.address, "server answered its probe: back in use");
        }
    }

    /// The server could not be reached, closed the connection or did not answer in time.
    pub fn failed(&self, upstream: &str, now: Instant) {
        let s = &self.server;
        if s.max_fails == 0 {
            return;
        }
        let mut health = s.lock();
        if health.since.is_none_or(|since| now.saturating_duration_since(since) > s.fail_timeout) {
            health.fails = 0;
            health.since = Some(now);
        }
        health.fails += 1;
        if health.fails >= s.max_fails {
            health.out_until = Some(now + s.fail_timeout);
            warn!(upstream, server = %s.address, fails = health.fails, fail_timeout = ?s.fail_timeout,
                "server taken out after failures");
        }
    }
}

/// A server as the active health check sees it.
pub struct Member(Arc<ServerState>);

impl Member {
    pub fn address(&self) -> &Authority {
        &self.0.address
    }

    pub fn tls(&self) -> bool {
        self.0.tls
    }

    /// Records the outcome of a check: a failed one takes the server out until one passes.
    /// True when that changed whether it is out.
    pub fn checked(&self, passed: bool) -> bool {
        self.0.check_failed.swap(!passed, Ordering::Relaxed) == passed
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.server.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Server;

    fn set(servers: usize, max_fails: u32) -> ServerSet {
        ServerSet::new(&Upstream {
            name: "u".into(),
            servers: (0..servers)
                .map(|i| Server { address: format!("127.0.0.1:{}", 8000 + i).parse().unwrap(), tls: false, weight: 1 })
                .collect(),
            balance: Balance::RoundRobin,
            connect_timeout: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            max_fails,
            fail_timeout: Duration::from_secs(10),
            retries: 1,
            http2: false,
            tls: crate::config::UpstreamTls { roots: None, sni: None, verify: true },
            health_check: None,
            tunnel_idle_timeout: Duration::from_secs(3600),
        })
    }

    fn pick(set: &ServerSet, now: Instant) -> Option<usize> {
        set.pick(None, &[], now).map(|f| f.index())
    }

    /// The servers of two picks in a row, in order of index.
    fn two(set: &ServerSet, now: Instant) -> [Option<usize>; 2] {
        let mut two = [pick(set, now), pick(set, now)];
        two.sort();
        two
    }

    #[test]
    fn a_server_is_out_after_max_fails_within_fail_timeout_then_probed_once() {
        let set = set(2, 2);
        let t0 = Instant::now();
        let first = set.pick(None, &[], t0).unwrap();
        assert_eq!(first.index(), 0);
        first.failed("u", t0);
        // One failure of two: still in turn.
        assert_eq!(two(&set, t0), [Some(0), Some(1)]);
        set.pick(None, &[1], t0).unwrap().failed("u", t0 + Duration::from_secs(1));
        assert!((0..4).all(|_| pick(&set, t0 + Duration::from_secs(2)) == Some(1)));
        // After fail_timeout one request probes it; the others keep away until it answers.
        let probe_at = t0 + Duration::from_secs(12);
        let probe = set.pick(None, &[1], probe_at).unwrap();
        assert_eq!(probe.index(), 0);
        assert!((0..4).all(|_| pick(&set, probe_at) == Some(1)));
        probe.succeeded("u");
        assert_eq!(two(&set, probe_at), [Some(0), Some(1)]);
    }

    #[test]
    fn failures_further_apart_than_fail_timeout_do_not_add_up() {
        let set = set(2, 2);
        let t0 = Instant::now();
        set.pick(None, &[1], t0).unwrap().failed("u", t0);
        set.pick(None, &[1], t0).unwrap().failed("u", t0 + Duration::from_secs(11));
        assert_eq!(two(&set, t0 + Duration::from_secs(11)), [Some(0), Some(1)]);
    }

    #[test]
    fn all_out_means_no_server_and_max_fails_zero_never_takes_one_out() {
        let set = set(2, 1);
        let t0 = Instant::now();
        for i in 0..2 {
            set.pick(None, &[1 - i], t0).unwrap().failed("u", t0);
        }
        assert_eq!(pick(&set, t0), None);
        let kept = self::set(2, 0);
        kept.pick(None, &[1], t0).unwrap().failed("u", t0);
        assert_eq!(two(&kept, t0), [Some(0), Some(1)]);
        // A lone server is never taken out: there is nowhere else to go.
        let lone = self::set(1, 1);
        lone.pick(None, &[], t0).unwrap().failed("u", t0);
        assert_eq!(pick(&lone, t0), Some(0));
    }

    #[test]
    fn a_failed_health_check_takes_a_server_out_until_one_passes() {
        let set = set(2, 0);
        let now = Instant::now();
        let second = set.members().nth(1).unwrap();
        assert!(second.checked(false));
        assert!(!second.checked(false), "no change, nothing to log");
        assert!((0..4).all(|_| pick(&set, now) == Some(0)));
        assert!(second.checked(true));
        assert_eq!(two(&set, now), [Some(0), Some(1)]);
    }

    #[test]
    fn in_flight_counts_until_the_claim_is_dropped() {
        let set = set(2, 1);
        let now = Instant::now();
        let held = set.pick(None, &[], now).unwrap();
        assert_eq!(set.servers[held.index()].in_flight.load(Ordering::Relaxed), 1);
        let index = held.index();
        drop(held);
        assert_eq!(set.servers[index].in_flight.load(Ordering::Relaxed), 0);
    }
}
