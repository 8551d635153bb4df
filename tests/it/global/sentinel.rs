//! Redis behind sentinels: the master is found through them, and found again when they
//! fail it over, while requests keep coming.

use std::sync::atomic::{AtomicBool, Ordering};

use super::*;
use crate::common::block_until;

/// `host:port` lines of the master the sentinel on `sentinel` names for `name`.
fn named_master(sentinel: &Redis, name: &str) -> String {
    sentinel.command(&["SENTINEL", "get-master-addr-by-name", name]).replace('\n', ":")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_master_is_found_through_the_sentinels_and_again_after_a_failover_under_load() {
    let master = Redis::start();
    let replica = Redis::start();
    replica.command(&["REPLICAOF", "127.0.0.1", &master.port.to_string()]);
    block_until("the replica in sync", Duration::from_secs(10), || {
        replica.command(&["INFO", "replication"]).contains("master_link_status:up")
    });
    let sentinel = Redis::start_sentinel("main", &master);
    // A failover needs a replica the sentinel knows (it learns them from the master) and
    // has heard from itself, in sync.
    block_until("the sentinel to know the replica", Duration::from_secs(30), || {
        let known = sentinel.command(&["SENTINEL", "replicas", "main"]);
        let fields: Vec<&str> = known.lines().collect();
        let field = |name: &str| fields.windows(2).find(|w| w[0] == name).map(|w| w[1]);
        field("port") == Some(&replica.port.to_string())
            && field("flags") == Some("slave")
            && field("master-link-status") == Some("ok")
    });
    let yaml = format!(
        "listen: 127.0.0.1:0
redis: {{ sentinel: {{ master: main, nodes: [\"127.0.0.1:{}\"], check_interval: 10s }}, timeout: 200ms,
         breaker_cooldown: 100ms }}
limits:
  quota: {{ key: \"header:x-k\", on_missing_key: skip, rate: 1r/h, burst: 2, nodelay: true, scope: global, on_store_error: deny }}
routes:
  - respond: {{ status: 200 }}
    limits: [quota]
",
        sentinel.port
    );
    let sg = Arc::new(Sluicegate::start(&yaml));
    let ask = |key: &'static str| {
        let addr = sg.addr;
        async move { get(addr, "/", &[("x-k", key)]).await.status }
    };
    // Until the sentinels have answered, Redis is not reached: `on_store_error` decides.
    wait_until("a decision in Redis", Duration::from_secs(10), async || ask("warm").await == 200).await;
    assert_eq!(futures_statuses_of(&ask, "a", 4).await, [200, 200, 200, 429], "decided in the master");
    assert_ne!(master.command(&["DBSIZE"]), "0");
    assert_eq!(master.command(&["WAIT", "1", "5000"]), "1", "the replica has the counts");
    // Requests keep coming while the sentinel makes the replica master.
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (addr, stop) = (sg.addr, Arc::clone(&stop));
        tokio::spawn(async move {
            let mut seen = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                seen.push(get_within(addr, "/", Duration::from_secs(5)).await.0);
            }
            seen
        })
    };
    assert_eq!(sentinel.command(&["SENTINEL", "FAILOVER", "main"]), "OK");
    let promoted = format!("127.0.0.1:{}", replica.port);
    block_until("the sentinel to name the replica", Duration::from_secs(30), || {
        named_master(&sentinel, "main") == promoted
    });
    // The proxy follows at once (the sentinel's `+switch-master`; its own look every
    // 10 s would come too late): a fresh key is decided in the new master.
    let fresh = std::sync::atomic::AtomicU32::new(0);
    let switched = Instant::now();
    wait_until("decisions in the new master", Duration::from_secs(20), async || {
        let key: &'static str = Box::leak(format!("fresh{}", fresh.fetch_add(1, Ordering::Relaxed)).into_boxed_str());
        let before = replica.command(&["DBSIZE"]);
        ask(key).await == 200 && replica.command(&["DBSIZE"]) != before
    })
    .await;
    assert!(switched.elapsed() < Duration::from_secs(5), "followed after {:?}", switched.elapsed());
    stop.store(true, Ordering::Relaxed);
    let seen = load.await.unwrap();
    assert!(seen.iter().all(|s| [200, 503].contains(s)), "only decisions or on_store_error: {seen:?}");
    // The count made before the failover carried over, and new ones go to the new master.
    assert_eq!(ask("a").await, 429, "the replica's copy of the count decides");
    let before = replica.command(&["DBSIZE"]);
    assert_eq!(futures_statuses_of(&ask, "b", 4).await, [200, 200, 200, 429]);
    assert_ne!(replica.command(&["DBSIZE"]), before, "written to the new master");
    let log = sg.log();
    assert!(log.contains("the sentinels name a new Redis master"), "{log}");
}

/// The statuses of `n` requests with key `key`, one after another.
async fn futures_statuses_of<F: std::future::Future<Output = u16>>(
    ask: &impl Fn(&'static str) -> F,
    key: &'static str,
    n: usize,
) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(ask(key).await);
    }
    out
}

/// The master's password (`redis.password`) and the sentinels' own
/// (`redis.sentinel.password`) each go where they belong; a wrong one is a store error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_go_to_the_master_and_to_the_sentinels() {
    let master = Redis::start();
    let sentinel = Redis::start_sentinel("main", &master);
    assert_eq!(master.command(&["CONFIG", "SET", "requirepass", "m4ster"]), "OK");
    assert_eq!(sentinel.command(&["SENTINEL", "SET", "main", "auth-pass", "m4ster"]), "OK");
    // Last: the sentinel answers no unauthenticated command after this.
    assert_eq!(sentinel.command(&["ACL", "SETUSER", "default", "resetpass", ">s3ntinel"]), "OK");
    let config = |master_password: &str, sentinel_password: &str| {
        Conf::new()
            .set(&format!(
                "redis: {{ sentinel: {{ master: main, nodes: [\"127.0.0.1:{}\"], password: {sentinel_password} }},
         password: {master_password}, timeout: 1s }}",
                sentinel.port
            ))
            .limit("g", "key: ip, rate: 1r/m, burst: 1, nodelay: true, scope: global, on_store_error: deny")
            .answering("g")
    };
    let right = config("m4ster", "s3ntinel").start();
    // Refused by `on_store_error` (spending nothing) until the master is found.
    wait_until("the master found", Duration::from_secs(10), async || get(right.addr, "/", &[]).await.status == 200)
        .await;
    assert_eq!(futures_statuses(right.addr, "/", 2).await, [200, 429], "{}", right.log());
    for (master_password, sentinel_password, why) in
        [("guess", "s3ntinel", "the master's"), ("m4ster", "guess", "the sentinels'")]
    {
        let sg = config(master_password, sentinel_password).start();
        assert_eq!(futures_statuses(sg.addr, "/", 2).await, [503, 503], "{why}: {}", sg.log());
        wait_until("the failure logged", Duration::from_secs(10), async || {
            sg.log().contains("the sentinels name no Redis master")
        })
        .await;
    }
}

/// With two sentinels, the first killed: the master is found through the second at start,
/// within `check_interval`, and followed through a failover the second makes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_first_of_two_sentinels_killed_the_master_is_found_through_the_second() {
    let master = Redis::start();
    let replica = Redis::start();
    replica.command(&["REPLICAOF", "127.0.0.1", &master.port.to_string()]);
    let mut first = Redis::start_sentinel("main", &master);
    let second = Redis::start_sentinel("main", &master);
    first.kill();
    let sg = Conf::new()
        .set(&format!(
            "redis: {{ sentinel: {{ master: main, nodes: [\"127.0.0.1:{}\", \"127.0.0.1:{}\"], check_interval: 10s }}, \
             timeout: 500ms, breaker_cooldown: 100ms }}",
            first.port, second.port
        ))
        .limit("quota", "key: \"header:x-k\", on_missing_key: skip, rate: 1r/h, burst: 1, nodelay: true, scope: global, on_store_error: deny")
        .answering("quota")
        .start();
    let ask = async |key: &str| get(sg.addr, "/", &[("x-k", key)]).await.status;
    // Asked at start, the first sentinel refuses the connection and the second answers:
    // found within check_interval, not after it (a second question would be as late).
    let keys = std::sync::atomic::AtomicU32::new(0);
    wait_until("a decision in the master", Duration::from_secs(10), async || {
        ask(&format!("warm{}", keys.fetch_add(1, Ordering::Relaxed))).await == 200
    })
    .await;
    assert_eq!([ask("a").await, ask("a").await, ask("a").await], [200, 200, 429], "decided in the master");
    assert_ne!(master.command(&["DBSIZE"]), "0");

    // The second fails the master over to the replica it knows: followed as well.
    block_until("the second sentinel to know the replica", Duration::from_secs(30), || {
        let known = second.command(&["SENTINEL", "replicas", "main"]);
        let fields: Vec<&str> = known.lines().collect();
        let field = |name: &str| fields.windows(2).find(|w| w[0] == name).map(|w| w[1]);
        field("port") == Some(&replica.port.to_string()) && field("master-link-status") == Some("ok")
    });
    assert_eq!(master.command(&["WAIT", "1", "5000"]), "1", "the replica has the counts");
    assert_eq!(second.command(&["SENTINEL", "FAILOVER", "main"]), "OK");
    let promoted = format!("127.0.0.1:{}", replica.port);
    block_until("the second sentinel to name the replica", Duration::from_secs(30), || {
        named_master(&second, "main") == promoted
    });
    wait_until("decisions in the new master", Duration::from_secs(10), async || {
        let before = replica.command(&["DBSIZE"]);
        ask(&format!("fresh{}", keys.fetch_add(1, Ordering::Relaxed))).await == 200
            && replica.command(&["DBSIZE"]) != before
    })
    .await;
    assert_eq!(ask("a").await, 429, "the count made before the failover decides");
}
