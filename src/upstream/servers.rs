//! An upstream's servers as the request path sees them: which are usable now (passive
//! health, nginx `max_fails` / `fail_timeout`), which one a request goes to (`balance`),
//! and how many requests each has in progress.
//!
//! A server written with a host name is every address the name resolves to, each a
//! server of its own with the written weight (as nginx does); `resolve` keeps them up to
//! date. The servers of the moment are one `Members` generation, swapped whole when the
//! addresses change: an address that stays keeps its state (health, requests in
//! progress), a new one starts healthy, a removed one is no longer chosen while the
//! requests it has finish.
//!
//! A server that fails `max_fails` times within `fail_timeout` is taken out for
//! `fail_timeout`; then one request at a time probes it until one succeeds. A server
//! with `max_conns` requests in progress takes no more until one ends.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use http::uri::Authority;
use rustls::pki_types::ServerName;
use tokio::sync::watch;
use tracing::{info, warn};

use super::balance::{self, SmoothRoundRobin};
use crate::config::{Balance, Server, Upstream};
use crate::metrics::ResolveMetrics;
use crate::policy::key::KeySource;

pub struct ServerSet {
    upstream: String,
    written: Box<[Written]>,
    /// The servers of the moment; shared with the connector, which asks them for names.
    current: Arc<ArcSwap<Members>>,
    balance: Balance,
    /// The longest a request waits for the first lookup of the names.
    connect_timeout: Duration,
    /// Every name has been looked up once (whatever the answer): read by every request,
    /// so an atomic, with `resolving_done` to wake those that wait for it.
    resolved: AtomicBool,
    resolving_done: tokio::sync::Notify,
    /// Set by `stop`: the background work of this set (lookups, health checks) ends.
    stopped: watch::Sender<bool>,
    pub(super) metrics: ResolveMetrics,
    /// Requests in progress a server takes at most (`usize::MAX`: no cap).
    max_conns: usize,
    /// Told when a server at `max_conns` has room again.
    freed: Arc<tokio::sync::Notify>,
}

/// A server as written in the configuration.
struct Written {
    /// As written: `Host` for `upstream_host: server` and health checks.
    authority: Authority,
    /// The address when the host is an IP literal; `None`: a name to look up.
    literal: Option<SocketAddr>,
    port: u16,
    tls: bool,
    /// The name TLS sends (SNI) and verifies: `tls.sni`, else the written host.
    tls_name: Option<ServerName<'static>>,
    weight: u32,
    /// Failures that take the server out (0: never), within and for `fail_timeout`.
    max_fails: u32,
    fail_timeout: Duration,
}

/// One generation of servers: every address of every written server, as resolved last.
struct Members {
    servers: Box<[Arc<ServerState>]>,
    weights: Box<[u32]>,
    /// Identities for `hash`, by server.
    ids: Box<[u64]>,
    rr: SmoothRoundRobin,
    /// The servers the swap to this generation removed: a connection for a request that
    /// chose one just before the swap still finds its TLS name.
    retired: Box<[Arc<ServerState>]>,
}

struct ServerState {
    /// Unique among the servers of every upstream, for as long as the process runs: what
    /// a request's tried servers are told apart by when the set changes between attempts.
    id: usize,
    /// The written server it is an address of.
    written: usize,
    /// What it is connected to.
    socket: SocketAddr,
    /// The same as an authority: the IP literal as written, or the resolved address.
    address: Authority,
    /// As written (a name, or the same as `address`).
    host: Authority,
    tls: bool,
    tls_name: Option<ServerName<'static>>,
    in_flight: AtomicUsize,
    /// Requests that failed here since it became a server (the failures behind passive
    /// health), counted when they fail.
    failures: AtomicU64,
    health: Mutex<Health>,
    /// Its last active health check failed: out until one passes.
    check_failed: AtomicBool,
    /// What the active health check last found, for the dashboard.
    checked: Mutex<Option<Checked>>,
    /// Failures that take the server out (0: never).
    max_fails: u32,
    fail_timeout: Duration,
    max_conns: usize,
    /// The set's: told when this server, at `max_conns`, has room again.
    freed: Arc<tokio::sync::Notify>,
}

#[derive(Default)]
struct Health {
    /// Failures counted since `since`; a failure more than `fail_timeout` later starts anew.
    fails: u32,
    since: Option<Instant>,
    /// Taken out until then; past it, the next request probes and pushes it one
    /// `fail_timeout` further, so that only one probe is out at a time.
    out_until: Option<Instant>,
    /// When it was taken out (kept while probes fail).
    out_since: Option<Instant>,
}

/// The last active health check of a server.
struct Checked {
    /// Why it failed (`None`: it passed).
    failure: Option<String>,
    /// Since when checks have passed, or failed.
    since: Instant,
    /// How long the check took.
    took: Duration,
}

/// A server as the dashboard shows it.
#[derive(Debug)]
pub struct ServerReport {
    /// Its address, with the name it is an address of.
    pub address: String,
    /// The address connections are made to, as the pool files them.
    pub dialed: String,
    /// Why it is out, and since when (`None`: in use).
    pub out: Option<(String, Instant)>,
    pub in_flight: usize,
    pub failures: u64,
    /// How long its last active health check took, if it has one.
    pub check_took: Option<Duration>,
}

/// A request's claim on a server: counts as in progress there until dropped (with the
/// response body, once it has been sent).
pub struct InFlight {
    server: Arc<ServerState>,
    /// The only server of its generation: passive health does not take it out, since
    /// there is nowhere else to send a request (nginx does the same).
    lone: bool,
}

/// What one lookup of a written server's name gave: its addresses, or why there are none.
pub type Lookup = Result<Vec<SocketAddr>, String>;

/// How a set of lookups changed the servers.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Change {
    pub added: Vec<SocketAddr>,
    pub removed: Vec<SocketAddr>,
    /// The written servers (by index) whose lookup failed or found nothing: they keep
    /// the addresses they had.
    pub failed: Vec<(usize, String)>,
}

static NEXT_ID: AtomicUsize = AtomicUsize::new(0);

impl ServerSet {
    /// The servers of `upstream`, its IP literals only: names have no address until
    /// `resolve` looks them up.
    pub fn new(upstream: &Upstream, metrics: ResolveMetrics) -> Arc<Self> {
        Arc::new(ServerSet::unresolved(upstream, metrics))
    }

    /// Some server is written with a host name, to be looked up.
    pub fn has_names(&self) -> bool {
        self.written.iter().any(|w| w.literal.is_none())
    }

    /// The set with its IP literals only, names not looked up yet.
    pub(super) fn unresolved(upstream: &Upstream, metrics: ResolveMetrics) -> Self {
        let written: Box<[Written]> = upstream.servers.iter().map(|s| written(s, upstream)).collect();
        let names = written.iter().any(|w| w.literal.is_none());
        let set = ServerSet {
            upstream: upstream.name.clone(),
            current: Arc::new(ArcSwap::from_pointee(Members::of(Vec::new(), Vec::new(), &written))),
            written,
            balance: upstream.balance.clone(),
            connect_timeout: upstream.connect_timeout,
            resolved: AtomicBool::new(!names),
            resolving_done: tokio::sync::Notify::new(),
            stopped: watch::Sender::new(false),
            metrics,
            max_conns: upstream.max_conns.map_or(usize::MAX, std::num::NonZeroUsize::get),
            freed: Arc::default(),
        };
        set.apply(&[]);
        set
    }

    /// The names to look up: (index of the written server, host, port).
    pub(super) fn names(&self) -> Vec<(usize, String, u16)> {
        let names = self.written.iter().enumerate().filter(|(_, w)| w.literal.is_none());
        names.map(|(i, w)| (i, w.authority.host().to_owned(), w.port)).collect()
    }

    /// Applies what the lookups of the written servers `lookups` (by index) found, and
    /// swaps the servers if their addresses changed. A lookup that failed or found no
    /// address keeps the written server's addresses as they were.
    pub(super) fn apply(&self, lookups: &[(usize, Lookup)]) -> Change {
        let old = self.current.load_full();
        let mut change = Change::default();
        let mut servers: Vec<Arc<ServerState>> = Vec::new();
        for (i, w) in self.written.iter().enumerate() {
            let had = || old.servers.iter().filter(|s| s.written == i);
            let mut addresses: Vec<SocketAddr> = match (w.literal, lookups.iter().find(|(j, _)| *j == i)) {
                (Some(literal), _) => vec![literal],
                (None, Some((_, Ok(found)))) if !found.is_empty() => found.clone(),
                (None, found) => {
                    if let Some((_, lookup)) = found {
                        let why = lookup.as_ref().err().cloned().unwrap_or_else(|| "no address".to_owned());
                        change.failed.push((i, why));
                    }
                    had().map(|s| s.socket).collect()
                }
            };
            // One order whatever the resolver's, so that the same addresses are the same set.
            addresses.sort();
            addresses.dedup();
            for address in addresses {
                match had().find(|s| s.socket == address) {
                    Some(kept) => servers.push(Arc::clone(kept)),
                    None => {
                        change.added.push(address);
                        servers.push(Arc::new(self.state(i, w, address)));
                    }
                }
            }
        }
        let retired: Vec<Arc<ServerState>> =
            old.servers.iter().filter(|s| !servers.iter().any(|n| Arc::ptr_eq(s, n))).cloned().collect();
        change.removed = retired.iter().map(|s| s.socket).collect();
        self.metrics.addresses.set(i64::try_from(servers.len()).unwrap_or(i64::MAX));
        if !change.added.is_empty() || !retired.is_empty() {
            self.current.store(Arc::new(Members::of(servers, retired, &self.written)));
        }
        change
    }

    fn state(&self, written: usize, w: &Written, address: SocketAddr) -> ServerState {
        ServerState {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            written,
            socket: address,
            // An IP literal stays as written; a resolved address is written the one way.
            // A link-local IPv6 address with its zone (`%eth0`) is no valid authority:
            // its connections then go by the name, resolved again when they are made.
            address: match w.literal {
                Some(_) => w.authority.clone(),
                None => Authority::try_from(address.to_string()).unwrap_or_else(|_| w.authority.clone()),
            },
            host: w.authority.clone(),
            tls: w.tls,
            tls_name: w.tls_name.clone(),
            in_flight: AtomicUsize::new(0),
            failures: AtomicU64::new(0),
            health: Mutex::default(),
            check_failed: AtomicBool::new(false),
            checked: Mutex::new(None),
            max_fails: w.max_fails,
            fail_timeout: w.fail_timeout,
            max_conns: self.max_conns,
            freed: Arc::clone(&self.freed),
        }
    }

    /// Every name has been looked up once: requests need not wait for it any more.
    pub(super) fn mark_resolved(&self) {
        self.resolved.store(true, Ordering::Release);
        self.resolving_done.notify_waiters();
    }

    /// Waits for the first lookup of the names (at most `connect_timeout`, part of what
    /// connecting may take), so that the first requests after a start or a reload find
    /// the servers. Immediate once it is done, and for an upstream without names.
    pub async fn ready(&self) {
        if self.resolved.load(Ordering::Acquire) {
            return;
        }
        let done = self.resolving_done.notified();
        tokio::pin!(done);
        // Registered before the second look: a `mark_resolved` in between still wakes it.
        done.as_mut().enable();
        if !self.resolved.load(Ordering::Acquire) {
            let _ = tokio::time::timeout(self.connect_timeout, done).await;
        }
    }

    /// Ends the background work of this set (its lookups, its health check): a reload
    /// replaced it. Requests in progress may still use it.
    pub fn stop(&self) {
        self.stopped.send_replace(true);
    }

    /// Completes once `stop` has been called, or the set is gone.
    pub fn stopped(&self) -> impl Future<Output = ()> + Send + use<> {
        let mut stopped = self.stopped.subscribe();
        async move {
            let _ = stopped.wait_for(|stopped| *stopped).await;
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

    /// The server for the next attempt of a request: usable now and not in `tried` (by
    /// `InFlight::id`). `None` when there is none left.
    pub fn pick(&self, key: Option<u64>, tried: &[usize], now: Instant) -> Option<InFlight> {
        let members = self.current.load();
        let servers = &members.servers;
        let lone = servers.len() == 1;
        let mut refused: smallvec::SmallVec<[usize; 4]> = smallvec::SmallVec::new();
        loop {
            let eligible = |i: usize| {
                !tried.contains(&servers[i].id)
                    && !refused.contains(&i)
                    && servers[i].has_room()
                    && servers[i].usable(now, lone)
            };
            let index = self.choose(&members, key, eligible)?;
            // Between the look and the claim another request may have taken the last
            // room or the one probe.
            let server = &servers[index];
            if server.take_room() {
                if server.claim(now, lone) {
                    return Some(InFlight { server: Arc::clone(server), lone });
                }
                server.give_room();
            }
            refused.push(index);
        }
    }

    /// Some server the request could go to (usable, not in `tried`) has `max_conns`
    /// requests in progress: room may come.
    pub fn full(&self, tried: &[usize], now: Instant) -> bool {
        let members = self.current.load();
        let lone = members.servers.len() == 1;
        members.servers.iter().any(|s| !tried.contains(&s.id) && !s.has_room() && s.usable(now, lone))
    }

    /// Completes when a server at `max_conns` has room again (register it with
    /// `enable` before looking, so that room made in between is not missed).
    pub fn freed(&self) -> tokio::sync::futures::Notified<'_> {
        self.freed.notified()
    }

    /// The most requests in progress a server takes (`None`: no cap).
    pub fn max_conns(&self) -> Option<usize> {
        (self.max_conns != usize::MAX).then_some(self.max_conns)
    }

    fn choose(&self, m: &Members, key: Option<u64>, eligible: impl Fn(usize) -> bool) -> Option<usize> {
        let loads = || -> smallvec::SmallVec<[usize; 8]> {
            m.servers.iter().map(|s| s.in_flight.load(Ordering::Relaxed)).collect()
        };
        match (&self.balance, key) {
            (Balance::Hash(_), Some(key)) => balance::rendezvous(key, &m.ids, &m.weights, eligible),
            (Balance::RoundRobin | Balance::Hash(_), _) => m.rr.pick(&m.weights, eligible),
            (Balance::LeastConn, _) => balance::least_conn(&m.rr, &m.weights, &loads(), eligible),
            (Balance::RandomTwo, _) => balance::random_two(&m.weights, &loads(), eligible, &mut fastrand::Rng::new()),
        }
    }

    /// Every server of the moment as the dashboard shows it, at `now`.
    pub fn report(&self, now: Instant) -> Vec<ServerReport> {
        let members = self.current.load();
        let lone = members.servers.len() == 1;
        members.servers.iter().map(|s| s.report(now, lone)).collect()
    }

    /// Every server of the moment, for the active health check.
    pub fn members(&self) -> Vec<Member> {
        self.current.load().servers.iter().map(|s| Member(Arc::clone(s))).collect()
    }

    /// The servers of the moment.
    pub fn len(&self) -> usize {
        self.current.load().servers.len()
    }

    pub fn upstream(&self) -> &str {
        &self.upstream
    }

    /// Every written server has an address.
    pub(super) fn complete(&self) -> bool {
        let members = self.current.load();
        (0..self.written.len()).all(|i| members.servers.iter().any(|s| s.written == i))
    }

    /// Every server, for the line that says none is usable; a name with no address is
    /// listed as such.
    pub fn addresses(&self) -> String {
        let members = self.current.load();
        let listed = self.written.iter().enumerate().flat_map(|(i, w)| {
            let mut of: Vec<String> = members.servers.iter().filter(|s| s.written == i).map(|s| s.describe()).collect();
            if of.is_empty() {
                of.push(format!("{} (no address)", w.authority));
            }
            of
        });
        listed.collect::<Vec<_>>().join(", ")
    }

    /// The TLS names of the servers, as the connector asks for them.
    pub fn tls_names(&self) -> TlsNames {
        TlsNames(Arc::clone(&self.current))
    }
}

impl Drop for ServerSet {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Members {
    fn of(servers: Vec<Arc<ServerState>>, retired: Vec<Arc<ServerState>>, written: &[Written]) -> Self {
        Members {
            weights: servers.iter().map(|s| written[s.written].weight).collect(),
            ids: servers.iter().map(|s| balance::server_id(s.address.as_str())).collect(),
            rr: SmoothRoundRobin::new(servers.len()),
            servers: servers.into(),
            retired: retired.into(),
        }
    }
}

fn written(server: &Server, upstream: &Upstream) -> Written {
    let host = server.address.host().trim_start_matches('[').trim_end_matches(']');
    let port = server.address.port_u16().unwrap_or(if server.tls { 443 } else { 80 });
    let tls_name = match &upstream.tls.sni {
        Some(sni) => Some(sni.clone()),
        None => ServerName::try_from(host.to_owned()).ok(),
    };
    Written {
        authority: server.address.clone(),
        literal: host.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, port)),
        port,
        tls: server.tls,
        tls_name: tls_name.filter(|_| server.tls),
        weight: server.weight,
        max_fails: server.max_fails,
        fail_timeout: server.fail_timeout,
    }
}

impl ServerState {
    fn has_room(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) < self.max_conns
    }

    /// Counts a request in progress here, if under `max_conns`.
    fn take_room(&self) -> bool {
        let max = self.max_conns;
        self.in_flight.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n < max).then_some(n + 1)).is_ok()
    }

    /// A request here ended: one at `max_conns` has room again, for those that wait.
    fn give_room(&self) {
        if self.in_flight.fetch_sub(1, Ordering::Relaxed) == self.max_conns {
            self.freed.notify_waiters();
        }
    }

    fn usable(&self, now: Instant, lone: bool) -> bool {
        !self.check_failed.load(Ordering::Relaxed)
            && (lone || self.max_fails == 0 || self.lock().out_until.is_none_or(|until| now >= until))
    }

    /// Takes the server for a request; false when it is out and its probe already taken.
    fn claim(&self, now: Instant, lone: bool) -> bool {
        if self.check_failed.load(Ordering::Relaxed) {
            return false;
        }
        if lone || self.max_fails == 0 {
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

    fn report(&self, now: Instant, lone: bool) -> ServerReport {
        let checked = self.checked.lock().unwrap_or_else(|p| p.into_inner());
        let check_took = checked.as_ref().map(|c| c.took);
        let out = match checked.as_ref() {
            Some(Checked { failure: Some(why), since, .. }) => Some((format!("health check: {why}"), *since)),
            _ if self.usable(now, lone) => None,
            _ => self.lock().out_since.map(|since| {
                let why = format!(
                    "max_fails ({}) reached within fail_timeout ({:?}); a request probes it again",
                    self.max_fails, self.fail_timeout
                );
                (why, since)
            }),
        };
        ServerReport {
            address: self.describe(),
            dialed: self.address.to_string(),
            out,
            in_flight: self.in_flight.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            check_took,
        }
    }

    /// The address, with the name it is an address of when it was written as one.
    fn describe(&self) -> String {
        if self.host == self.address { self.address.to_string() } else { format!("{} ({})", self.address, self.host) }
    }
}

impl InFlight {
    /// Where the request goes: an IP address and port.
    pub fn address(&self) -> &Authority {
        &self.server.address
    }

    /// The server as written (host name or IP literal, and port): `Host` for
    /// `upstream_host: server`.
    pub fn host(&self) -> &Authority {
        &self.server.host
    }

    /// Spoken to over TLS (`https://`).
    pub fn tls(&self) -> bool {
        self.server.tls
    }

    /// Tells this server apart from the others of its upstream, whatever addresses come
    /// and go between a request's attempts.
    pub fn id(&self) -> usize {
        self.server.id
    }

    /// A response arrived: a server that was out is back.
    pub fn succeeded(&self, upstream: &str) {
        let s = &self.server;
        if self.lone || s.max_fails == 0 {
            return;
        }
        let mut health = s.lock();
        if health.out_until.take().is_some() {
            health.fails = 0;
            health.since = None;
            health.out_since = None;
            info!(upstream, server = %s.describe(), "server answered its probe: back in use");
        }
    }

    /// The server could not be reached, closed the connection or did not answer in time.
    pub fn failed(&self, upstream: &str, now: Instant) {
        let s = &self.server;
        s.failures.fetch_add(1, Ordering::Relaxed);
        if self.lone || s.max_fails == 0 {
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
            health.out_since.get_or_insert(now);
            warn!(upstream, server = %s.describe(), fails = health.fails, fail_timeout = ?s.fail_timeout,
                "server taken out after failures");
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.server.give_room();
    }
}

/// A server as the active health check sees it.
pub struct Member(Arc<ServerState>);

impl Member {
    /// Where the check connects.
    pub fn address(&self) -> &Authority {
        &self.0.address
    }

    /// The server as written: the check's `Host`.
    pub fn host(&self) -> &Authority {
        &self.0.host
    }

    pub fn tls(&self) -> bool {
        self.0.tls
    }

    /// The address, with the name it was resolved from, for log lines.
    pub fn describe(&self) -> String {
        self.0.describe()
    }

    /// Records the outcome of a check that took `took` (`Err`: why it failed): a failed
    /// one takes the server out until one passes. True when that changed whether it is
    /// out.
    pub fn checked(&self, outcome: Result<(), String>, took: Duration) -> bool {
        let passed = outcome.is_ok();
        let changed = self.0.check_failed.swap(!passed, Ordering::Relaxed) == passed;
        let mut checked = self.0.checked.lock().unwrap_or_else(|p| p.into_inner());
        let since = match checked.as_ref() {
            Some(last) if !changed => last.since,
            _ => Instant::now(),
        };
        *checked = Some(Checked { failure: outcome.err(), since, took });
        changed
    }
}

/// The name TLS sends and verifies for a server, looked up by the address a connection
/// is made to: a resolved address is verified against the name it was resolved from,
/// never against itself.
#[derive(Clone)]
pub struct TlsNames(Arc<ArcSwap<Members>>);

impl TlsNames {
    /// `None` for an address that is no server of the upstream (the connector then
    /// goes by the address).
    ///
    /// Two names written in one upstream that resolve to the same address and port
    /// share its connections, and this gives the first one's name.
    pub fn of(&self, address: &Authority) -> Option<ServerName<'static>> {
        let members = self.0.load();
        let mut all = members.servers.iter().chain(members.retired.iter());
        all.find(|s| s.address == *address).and_then(|s| s.tls_name.clone())
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::upstream) fn upstream(servers: &[&str], max_fails: u32) -> Upstream {
        Upstream {
            name: "u".into(),
            servers: servers
                .iter()
                .map(|s| {
                    let (tls, address) = s.strip_prefix("https://").map_or((false, *s), |rest| (true, rest));
                    Server {
                        address: address.parse().unwrap(),
                        tls,
                        weight: 1,
                        max_fails,
                        fail_timeout: Duration::from_secs(10),
                    }
                })
                .collect(),
            balance: Balance::RoundRobin,
            connect_timeout: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            retries: 1,
            http2: false,
            tls: crate::config::UpstreamTls { roots: None, sni: None, verify: true },
            health_check: None,
            tunnel_idle_timeout: Duration::from_secs(3600),
            resolve_interval: None,
            keepalive: None,
            max_conns: None,
            queue_timeout: Duration::from_secs(5),
        }
    }

    fn set(servers: usize, max_fails: u32) -> ServerSet {
        let addresses: Vec<String> = (0..servers).map(|i| format!("127.0.0.1:{}", 8000 + i)).collect();
        let addresses: Vec<&str> = addresses.iter().map(String::as_str).collect();
        ServerSet::unresolved(&upstream(&addresses, max_fails), ResolveMetrics::default())
    }

    /// The position of the picked server among the set's servers.
    fn pick(set: &ServerSet, now: Instant) -> Option<usize> {
        let picked = set.pick(None, &[], now)?;
        set.current.load().servers.iter().position(|s| s.id == picked.id())
    }

    /// The ids of the servers at these positions, for `tried`.
    fn ids(set: &ServerSet, positions: &[usize]) -> Vec<usize> {
        positions.iter().map(|&i| set.current.load().servers[i].id).collect()
    }

    /// The servers of two picks in a row, in order of position.
    fn two(set: &ServerSet, now: Instant) -> [Option<usize>; 2] {
        let mut two = [pick(set, now), pick(set, now)];
        two.sort();
        two
    }

    #[test]
    fn a_server_is_out_after_max_fails_within_fail_timeout_then_probed_once() {
        let set = set(2, 2);
        let t0 = Instant::now();
        assert_eq!(pick(&set, t0), Some(0));
        set.pick(None, &ids(&set, &[1]), t0).unwrap().failed("u", t0);
        // One failure of two: still in turn.
        assert_eq!(two(&set, t0), [Some(0), Some(1)]);
        set.pick(None, &ids(&set, &[1]), t0).unwrap().failed("u", t0 + Duration::from_secs(1));
        assert!((0..4).all(|_| pick(&set, t0 + Duration::from_secs(2)) == Some(1)));
        // After fail_timeout one request probes it; the others keep away until it answers.
        let probe_at = t0 + Duration::from_secs(12);
        let probe = set.pick(None, &ids(&set, &[1]), probe_at).unwrap();
        assert_eq!(probe.id(), ids(&set, &[0])[0]);
        assert!((0..4).all(|_| pick(&set, probe_at) == Some(1)));
        probe.succeeded("u");
        assert_eq!(two(&set, probe_at), [Some(0), Some(1)]);
    }

    #[test]
    fn failures_further_apart_than_fail_timeout_do_not_add_up() {
        let set = set(2, 2);
        let t0 = Instant::now();
        set.pick(None, &ids(&set, &[1]), t0).unwrap().failed("u", t0);
        set.pick(None, &ids(&set, &[1]), t0).unwrap().failed("u", t0 + Duration::from_secs(11));
        assert_eq!(two(&set, t0 + Duration::from_secs(11)), [Some(0), Some(1)]);
    }

    #[test]
    fn all_out_means_no_server_and_max_fails_zero_never_takes_one_out() {
        let set = set(2, 1);
        let t0 = Instant::now();
        for i in 0..2 {
            set.pick(None, &ids(&set, &[1 - i]), t0).unwrap().failed("u", t0);
        }
        assert_eq!(pick(&set, t0), None);
        let kept = self::set(2, 0);
        kept.pick(None, &ids(&kept, &[1]), t0).unwrap().failed("u", t0);
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
        let second = set.members().into_iter().nth(1).unwrap();
        assert!(second.checked(Err("down".into()), Duration::ZERO));
        assert!(!second.checked(Err("down".into()), Duration::ZERO), "no change, nothing to log");
        assert!((0..4).all(|_| pick(&set, now) == Some(0)));
        assert!(second.checked(Ok(()), Duration::ZERO));
        assert_eq!(two(&set, now), [Some(0), Some(1)]);
    }

    #[test]
    fn the_report_says_why_a_server_is_out_since_when_and_counts_its_failures() {
        let set = set(2, 1);
        let t0 = Instant::now();
        set.pick(None, &ids(&set, &[1]), t0).unwrap().failed("u", t0);
        let report = set.report(t0 + Duration::from_secs(1));
        let (why, since) = report[0].out.clone().expect("taken out");
        assert_eq!(why, "max_fails (1) reached within fail_timeout (10s); a request probes it again");
        assert_eq!(since, t0);
        assert_eq!((report[0].failures, report[1].failures), (1, 0));
        assert!(report[1].out.is_none() && report[1].check_took.is_none());
        let second = set.members().into_iter().nth(1).unwrap();
        second.checked(Err("status 500".into()), Duration::from_millis(3));
        let report = set.report(t0);
        assert_eq!(report[1].out.as_ref().map(|(why, _)| why.as_str()), Some("health check: status 500"));
        assert_eq!(report[1].check_took, Some(Duration::from_millis(3)));
    }

    #[test]
    fn in_flight_counts_until_the_claim_is_dropped() {
        let set = set(2, 1);
        let now = Instant::now();
        let held = set.pick(None, &[], now).unwrap();
        let server = Arc::clone(&held.server);
        assert_eq!(server.in_flight.load(Ordering::Relaxed), 1);
        drop(held);
        assert_eq!(server.in_flight.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_server_at_max_conns_takes_no_more_and_its_room_wakes_those_that_wait() {
        let mut two = upstream(&["127.0.0.1:8000", "127.0.0.1:8001"], 1);
        two.max_conns = std::num::NonZeroUsize::new(1);
        let set = ServerSet::unresolved(&two, ResolveMetrics::default());
        let now = Instant::now();
        let (a, b) = (set.pick(None, &[], now).unwrap(), set.pick(None, &[], now).unwrap());
        assert_ne!(a.id(), b.id(), "the first is full: the second goes to the other");
        assert!(set.pick(None, &[], now).is_none(), "both full");
        assert!(set.full(&[], now), "room may come");
        assert!(!set.full(&[a.id(), b.id()], now), "not for a request that tried both");
        let freed = set.freed();
        tokio::pin!(freed);
        freed.as_mut().enable();
        drop(b);
        tokio::time::timeout(Duration::from_secs(5), freed).await.expect("the waiter is told");
        assert!(set.pick(None, &[], now).is_some());
    }

    #[test]
    fn a_removed_address_is_chosen_no_more_while_its_requests_finish_and_one_that_stays_keeps_its_count() {
        let set = ServerSet::unresolved(&upstream(&["api.test:80"], 1), ResolveMetrics::default());
        let addresses = |list: &[&str]| Ok(list.iter().map(|a| a.parse().unwrap()).collect());
        set.apply(&[(0, addresses(&["10.0.0.1:80", "10.0.0.2:80"]))]);
        let now = Instant::now();
        let (first, second) = (set.pick(None, &[], now).unwrap(), set.pick(None, &[], now).unwrap());
        assert_eq!((first.address().as_str(), second.address().as_str()), ("10.0.0.1:80", "10.0.0.2:80"));
        set.apply(&[(0, addresses(&["10.0.0.2:80", "10.0.0.3:80"]))]);
        assert_eq!(set.addresses(), "10.0.0.2:80 (api.test:80), 10.0.0.3:80 (api.test:80)");
        // The request on the removed address still counts there until it ends.
        assert_eq!(first.server.in_flight.load(Ordering::Relaxed), 1);
        let in_flight = |set: &ServerSet| -> Vec<usize> {
            set.current.load().servers.iter().map(|s| s.in_flight.load(Ordering::Relaxed)).collect()
        };
        assert_eq!(in_flight(&set), [1, 0]);
        let removed = Arc::clone(&first.server);
        drop((first, second));
        assert_eq!(removed.in_flight.load(Ordering::Relaxed), 0);
        assert_eq!(in_flight(&set), [0, 0]);
        // least_conn and retries see the new set: a request tried on the kept one goes
        // to the new one.
        let kept = set.current.load().servers[0].id;
        assert_eq!(set.pick(None, &[kept], now).unwrap().address(), "10.0.0.3:80");
    }

    #[test]
    fn hash_keeps_keys_on_their_address_when_a_name_gains_one_and_moves_only_the_new_ones_share() {
        let mut u = upstream(&["api.test:80"], 1);
        u.balance = Balance::Hash(crate::policy::key::KeySpec(Box::new([crate::policy::key::KeyPart::Bearer])));
        let set = ServerSet::unresolved(&u, ResolveMetrics::default());
        let addresses = |n: u8| Ok((1..=n).map(|i| SocketAddr::from(([10, 0, 0, i], 80))).collect());
        let now = Instant::now();
        let servers = |set: &ServerSet| -> Vec<String> {
            (0..20_000u64)
                .map(|k| set.pick(Some(k.wrapping_mul(0x9e37_79b9_7f4a_7c15)), &[], now).unwrap())
                .map(|f| f.address().to_string())
                .collect()
        };
        set.apply(&[(0, addresses(4))]);
        let before = servers(&set);
        set.apply(&[(0, addresses(5))]);
        let after = servers(&set);
        let moved: Vec<_> = before.iter().zip(&after).filter(|(b, a)| b != a).map(|(_, a)| a).collect();
        assert!(moved.iter().all(|a| a.as_str() == "10.0.0.5:80"), "a key moved between addresses that stayed");
        // 1/5 of the keys, within 2 %.
        assert!((moved.len() as f64 / 20_000.0 - 0.2).abs() < 0.02, "{} moved", moved.len());
        // Back to four: every key is where it was.
        set.apply(&[(0, addresses(4))]);
        assert_eq!(servers(&set), before);
    }

    #[test]
    fn an_ip_literal_is_one_server_as_written_and_a_name_has_none_until_looked_up() {
        let set = ServerSet::unresolved(
            &upstream(&["[::1]:8000", "https://backend.test:8443", "10.0.0.1:80"], 1),
            ResolveMetrics::default(),
        );
        assert_eq!(set.len(), 2);
        assert_eq!(set.addresses(), "[::1]:8000, backend.test:8443 (no address), 10.0.0.1:80");
        assert_eq!(set.names(), [(1, "backend.test".to_owned(), 8443)]);
        assert_eq!(set.metrics.addresses.get(), 2);
    }
}
