//! Keeping an upstream's host names resolved: each server written with a name is looked
//! up when the configuration is loaded, then every `resolve_interval` in the background,
//! and the upstream's servers become the addresses found (`ServerSet::apply`). A lookup
//! that fails or finds nothing keeps the addresses the name had; a name that has none
//! (it did not resolve yet) is tried again sooner, backing off, until it does.
//!
//! The system resolver (`getaddrinfo` through `tokio::net::lookup_host`) rather than a
//! DNS client crate: it answers as every other program on the host does (`/etc/hosts`,
//! nsswitch, search domains), as `sluicegate check` and the connections did before, and
//! TTLs are not needed when the interval is configured.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Weak;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use super::servers::{Lookup, ServerSet};

/// A lookup that takes longer fails: `getaddrinfo` cannot be cancelled, but the set must
/// not wait on it (its thread finishes on its own).
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);
/// A name without an address is tried again after this, doubling up to `MAX_RETRY`.
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(30);
/// A name that keeps failing is logged when it starts failing, then at most this often.
const FAILURE_LOG_EVERY: Duration = Duration::from_secs(60);

/// Looks up a host name's addresses.
pub trait Resolve: Send + Sync + 'static {
    fn lookup(&self, host: &str, port: u16) -> impl Future<Output = io::Result<Vec<SocketAddr>>> + Send;
}

/// The system resolver.
pub struct System;

impl Resolve for System {
    async fn lookup(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        Ok(tokio::net::lookup_host((host, port)).await?.collect())
    }
}

/// Looks up the names of `set` as long as it lives and is not stopped: once now, then
/// every `interval` (`None`: no more once every name has an address). The upstream's
/// client runs this in a task of its own.
pub async fn keep_resolved(set: Weak<ServerSet>, resolver: impl Resolve, interval: Option<Duration>) {
    let mut failures = FailureLog::default();
    let mut retry = FIRST_RETRY;
    let Some(stopped) = set.upgrade().map(|set| set.stopped()) else { return };
    tokio::pin!(stopped);
    loop {
        // Held only while a round runs: between rounds the set may go.
        let Some(strong) = set.upgrade() else { return };
        let complete = resolve_once(&strong, &resolver, &mut failures).await;
        strong.mark_resolved();
        drop(strong);
        let wait = match (complete, interval) {
            (true, Some(interval)) => interval,
            (true, None) => return,
            (false, interval) => {
                let wait = interval.map_or(retry, |i| i.min(retry));
                retry = (retry * 2).min(MAX_RETRY);
                wait
            }
        };
        if complete {
            retry = FIRST_RETRY;
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = &mut stopped => return,
        }
    }
}

/// One round: every name looked up at once, the set updated, failures counted and
/// logged. True when every name has an address now.
pub(super) async fn resolve_once(set: &ServerSet, resolver: &impl Resolve, failures: &mut FailureLog) -> bool {
    let names = set.names();
    let lookups = names.iter().map(|(i, host, port)| async move {
        let found = match tokio::time::timeout(LOOKUP_TIMEOUT, resolver.lookup(host, *port)).await {
            Ok(Ok(found)) => Ok(found),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {}s", LOOKUP_TIMEOUT.as_secs())),
        };
        (*i, found)
    });
    let lookups: Vec<(usize, Lookup)> = futures_util::future::join_all(lookups).await;
    let change = set.apply(&lookups);
    let upstream = set.upstream();
    if !change.added.is_empty() || !change.removed.is_empty() {
        info!(upstream, added = ?change.added, removed = ?change.removed, servers = %set.addresses(),
            "upstream addresses changed");
    }
    let now = Instant::now();
    for (i, host, _) in &names {
        match change.failed.iter().find(|(j, _)| j == i) {
            Some((_, why)) => {
                set.metrics.failures.inc();
                if failures.should_log(*i, now) {
                    warn!(upstream, host, why, servers = %set.addresses(),
                        "upstream host name did not resolve: its addresses stay as they were");
                }
            }
            None => {
                if failures.recovered(*i) {
                    info!(upstream, host, "upstream host name resolves again");
                }
            }
        }
    }
    set.complete()
}

/// When each failing name was last logged.
#[derive(Default)]
pub(super) struct FailureLog(Vec<(usize, Instant)>);

impl FailureLog {
    fn should_log(&mut self, name: usize, now: Instant) -> bool {
        match self.0.iter_mut().find(|(i, _)| *i == name) {
            Some((_, last)) if now.duration_since(*last) < FAILURE_LOG_EVERY => false,
            Some((_, last)) => {
                *last = now;
                true
            }
            None => {
                self.0.push((name, now));
                true
            }
        }
    }

    /// The name resolved: true when it had been failing.
    fn recovered(&mut self, name: usize) -> bool {
        let failing = self.0.len();
        self.0.retain(|(i, _)| *i != name);
        self.0.len() != failing
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::metrics::ResolveMetrics;
    use crate::upstream::servers::Change;

    /// Answers what the test last told it, and counts the questions.
    #[derive(Clone, Default)]
    struct Scripted {
        answers: Arc<Mutex<HashMap<String, Lookup>>>,
        asked: Arc<AtomicUsize>,
    }

    impl Scripted {
        fn answer(&self, host: &str, answer: Result<&[&str], &str>) {
            let answer = answer.map(|a| a.iter().map(|a| a.parse().unwrap()).collect()).map_err(str::to_owned);
            self.answers.lock().unwrap().insert(host.to_owned(), answer);
        }
    }

    impl Resolve for Scripted {
        async fn lookup(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
            self.asked.fetch_add(1, Ordering::Relaxed);
            let answer = self.answers.lock().unwrap().get(host).cloned();
            match answer {
                Some(Ok(ips)) => Ok(ips.into_iter().map(|a: SocketAddr| SocketAddr::new(a.ip(), port)).collect()),
                Some(Err(why)) => Err(io::Error::other(why)),
                None => Err(io::Error::other("unknown host")),
            }
        }
    }

    fn set(servers: &[&str]) -> Arc<ServerSet> {
        let upstream = crate::upstream::servers::tests::upstream(servers, 1);
        Arc::new(ServerSet::unresolved(&upstream, ResolveMetrics::default()))
    }

    fn addrs(list: &[&str]) -> Vec<SocketAddr> {
        list.iter().map(|a| a.parse().unwrap()).collect()
    }

    /// Every server the set picks in `n` requests of round robin, by address.
    fn picked(set: &ServerSet, n: usize) -> Vec<String> {
        let mut seen: Vec<String> = (0..n)
            .filter_map(|_| set.pick(None, &[], std::time::Instant::now()))
            .map(|f| f.address().to_string())
            .collect();
        seen.sort();
        seen.dedup();
        seen
    }

    #[tokio::test]
    async fn a_name_is_every_address_it_resolves_to_and_a_new_answer_keeps_the_state_of_those_that_stay() {
        let set = set(&["backend.test:8080", "10.9.9.9:80"]);
        let dns = Scripted::default();
        let mut log = FailureLog::default();
        dns.answer("backend.test", Ok(&["10.0.0.2:0", "10.0.0.1:0", "[fd00::1]:0"]));
        assert!(resolve_once(&set, &dns, &mut log).await);
        assert_eq!(set.len(), 4);
        assert_eq!(set.metrics.addresses.get(), 4);
        assert_eq!(picked(&set, 8), ["10.0.0.1:8080", "10.0.0.2:8080", "10.9.9.9:80", "[fd00::1]:8080"]);
        assert_eq!(
            set.addresses(),
            "10.0.0.1:8080 (backend.test:8080), 10.0.0.2:8080 (backend.test:8080), \
             [fd00::1]:8080 (backend.test:8080), 10.9.9.9:80"
        );

        // 10.0.0.1 fails and is taken out; a request holds 10.0.0.2.
        let now = std::time::Instant::now();
        let out = set.pick(None, &[], now).unwrap();
        assert_eq!(out.address(), "10.0.0.1:8080");
        out.failed("u", now);
        drop(out);
        let held = set.pick(None, &[], now).unwrap();
        assert_eq!(held.address(), "10.0.0.2:8080");

        // The name now gives 10.0.0.1, ::1 and a new 10.0.0.3; 10.0.0.2 is gone.
        dns.answer("backend.test", Ok(&["10.0.0.3:0", "10.0.0.1:0", "[fd00::1]:0"]));
        assert!(resolve_once(&set, &dns, &mut log).await);
        assert_eq!(set.len(), 4);
        // 10.0.0.1 is still out: its health stayed with it. The new address is in use.
        assert_eq!(picked(&set, 12), ["10.0.0.3:8080", "10.9.9.9:80", "[fd00::1]:8080"]);
        // The removed address is chosen no more; the request it has finishes with it.
        assert_eq!(held.host(), "backend.test:8080");
        drop(held);
        // A failed lookup and an empty answer keep the addresses and are counted.
        dns.answer("backend.test", Err("SERVFAIL"));
        assert!(resolve_once(&set, &dns, &mut log).await);
        dns.answer("backend.test", Ok(&[]));
        assert!(resolve_once(&set, &dns, &mut log).await);
        assert_eq!(set.len(), 4);
        assert_eq!(set.metrics.failures.get(), 2);
    }

    #[test]
    fn applying_lookups_reports_what_was_added_removed_and_kept() {
        let set = set(&["a.test:80", "b.test:80"]);
        let first = set.apply(&[(0, Ok(addrs(&["10.0.0.1:80", "10.0.0.2:80"]))), (1, Err("timeout".into()))]);
        assert_eq!(first.added, addrs(&["10.0.0.1:80", "10.0.0.2:80"]));
        assert_eq!(first.failed, [(1, "timeout".to_owned())]);
        assert!(!set.complete());
        // Both of a.test's addresses fail their health check.
        assert!(set.members().iter().all(|m| m.checked(Err("down".into()), Duration::ZERO)));
        let second = set.apply(&[(0, Ok(addrs(&["10.0.0.2:80"]))), (1, Ok(addrs(&["10.0.0.1:80"])))]);
        let added_and_removed = addrs(&["10.0.0.1:80"]);
        assert_eq!(second, Change { added: added_and_removed.clone(), removed: added_and_removed, failed: vec![] });
        assert!(set.complete());
        let members = set.members();
        let described: Vec<String> = members.iter().map(|m| m.describe()).collect();
        assert_eq!(described, ["10.0.0.2:80 (a.test:80)", "10.0.0.1:80 (b.test:80)"]);
        // 10.0.0.2 of a.test is the same server, still out; 10.0.0.1 of b.test is a new
        // one, in, though a.test had that address.
        assert!(!members[0].checked(Err("down".into()), Duration::ZERO), "a.test's 10.0.0.2 lost its health state");
        assert!(!members[1].checked(Ok(()), Duration::ZERO), "b.test's 10.0.0.1 took a.test's health state");
        // The same addresses in another order change nothing.
        let same = set.apply(&[(0, Ok(addrs(&["10.0.0.2:80"]))), (1, Ok(addrs(&["10.0.0.1:80"])))]);
        assert_eq!(same, Change::default());
    }

    #[test]
    fn a_resolved_https_server_is_verified_by_its_name_or_by_sni_and_never_by_its_address() {
        let set = set(&["https://api.test:8443", "https://10.0.0.9:443"]);
        set.apply(&[(0, Ok(addrs(&["10.0.0.1:8443"])))]);
        let names = set.tls_names();
        let name = |a: &str| names.of(&a.parse().unwrap()).map(|n| n.to_str().into_owned());
        assert_eq!(name("10.0.0.1:8443").as_deref(), Some("api.test"));
        assert_eq!(name("10.0.0.9:443").as_deref(), Some("10.0.0.9"));
        assert_eq!(name("10.0.0.7:443"), None);
        // Just replaced: a connection for a request that chose it before still finds it.
        set.apply(&[(0, Ok(addrs(&["10.0.0.2:8443"])))]);
        assert_eq!(name("10.0.0.1:8443").as_deref(), Some("api.test"));
    }

    #[tokio::test(start_paused = true)]
    async fn names_are_looked_up_again_each_interval_and_a_name_without_address_sooner_until_stopped() {
        let set = set(&["a.test:80"]);
        let dns = Scripted::default();
        tokio::spawn(keep_resolved(Arc::downgrade(&set), dns.clone(), Some(Duration::from_secs(10))));
        // Not resolvable at start: the set is ready (requests get their 502 at once), and
        // the name is tried again after 1 s, 2 s, 4 s…
        tokio::time::timeout(Duration::from_millis(1), set.ready()).await.unwrap();
        assert_eq!((set.len(), dns.asked.load(Ordering::Relaxed)), (0, 1));
        tokio::time::sleep(Duration::from_millis(3500)).await;
        assert_eq!(dns.asked.load(Ordering::Relaxed), 3);
        dns.answer("a.test", Ok(&["10.0.0.1:0"]));
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!((set.len(), dns.asked.load(Ordering::Relaxed)), (1, 4));
        // Then every interval.
        dns.answer("a.test", Ok(&["10.0.0.1:0", "10.0.0.2:0"]));
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert_eq!(set.len(), 1);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!((set.len(), dns.asked.load(Ordering::Relaxed)), (2, 5));
        // A reload stops the lookups of the set it replaced.
        set.stop();
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(dns.asked.load(Ordering::Relaxed), 5);
        // And a set no one holds any more ends them too.
        let set = self::set(&["a.test:80"]);
        tokio::spawn(keep_resolved(Arc::downgrade(&set), dns.clone(), Some(Duration::from_secs(10))));
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(set);
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(dns.asked.load(Ordering::Relaxed), 6);
    }

    #[tokio::test(start_paused = true)]
    async fn with_resolve_interval_off_names_are_looked_up_until_each_has_an_address_then_no_more() {
        let set = set(&["a.test:80"]);
        let dns = Scripted::default();
        dns.answer("a.test", Ok(&["10.0.0.1:0"]));
        let task = tokio::spawn(keep_resolved(Arc::downgrade(&set), dns.clone(), None));
        task.await.unwrap();
        assert_eq!((set.len(), dns.asked.load(Ordering::Relaxed)), (1, 1));
    }
}
