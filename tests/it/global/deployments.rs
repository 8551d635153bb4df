//! Redis as it is deployed: a cluster, TLS with a private CA, a password; the leases of
//! an instance that dies; the keys' prefix and TTLs.

use super::*;

/// A Redis Cluster of three masters: limits whose keys live in different slots are
/// decided by one call per slot, still all or nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_decides_global_limits() {
    let cluster = Cluster::start(3);
    let sg = Conf::new()
        .redis(&cluster.url(), "cluster: true, timeout: 1s")
        .limit(
            "per_key",
            "key: \"header:x-key\", on_missing_key: skip, rate: 1r/m, burst: 4, nodelay: true, scope: global, on_store_error: deny",
        )
        .limit(
            "per_ip",
            "key: ip, algorithm: sliding_window, limit: 1000, window: 1h, scope: global, on_store_error: deny",
        )
        .answering("per_key, per_ip")
        .start();
    sg.wait_for_log("the line \"connected to Redis Cluster\"", |l| l.contains("connected to Redis Cluster"));
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(get(sg.addr, "/", &[("x-key", "k0")]).await.status);
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429], "{}", sg.log());
    // The keys are spread over the nodes by their hash tags: one per limit and key.
    let keys: usize = cluster.nodes.iter().map(|n| n.command(&["DBSIZE"]).parse::<usize>().unwrap()).sum();
    assert_eq!(keys, 2);
    // per_ip counted only the five admitted requests: refusals were taken back.
    let per_ip = cluster
        .nodes
        .iter()
        .flat_map(|n| n.command(&["KEYS", "*per_ip*"]).lines().map(|k| (n, k.to_owned())).collect::<Vec<_>>())
        .next()
        .unwrap();
    // "index prev curr": 5 in all, whether or not an hour began meanwhile, once the
    // refunds sent in the background have arrived.
    wait_until("per_ip at 5", Duration::from_secs(10), async || {
        let state = per_ip.0.command(&["GET", &per_ip.1]);
        let counted: u64 = state.split(' ').skip(1).map(|n| n.parse::<u64>().unwrap()).sum();
        assert!(counted >= 5, "per_ip state {state:?}");
        counted == 5
    })
    .await;
}

/// An instance killed while holding a global concurrency slot: the slot comes back by
/// itself once its lease lapses, while a live request keeps its slot by renewing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_of_a_killed_instance_lapse_and_live_ones_are_renewed() {
    let redis = Redis::start();
    let backend = Backend::start().await;
    let yaml = format!(
        "listen: 127.0.0.1:0\nredis: {{ url: \"{}\", timeout: 1s, lease_ttl: 1500ms }}\nupstreams:\n  b: {{ servers: [\"{}\"] }}\nlimits:\n  slots: {{ key: ip, concurrency: 1, scope: global, on_store_error: deny }}\nroutes:\n  - match: {{ path_prefix: / }}\n    upstream: b\n    limits: [slots]\n",
        redis.url(),
        backend.addr
    );
    let (a, b) = (Sluicegate::start(&yaml), Sluicegate::start(&yaml));
    // A request through `a` holds the slot, held at the backend until released, for
    // longer than the lease's ttl. (A ttl of 1.5 s, renewed every 500 ms: a renewal may
    // come a second late on a loaded machine and the lease still holds.)
    let a_addr = a.addr;
    let long = tokio::spawn(async move { get(a_addr, "/held", &[]).await.status });
    wait_until("the request at the backend", Duration::from_secs(10), async || !backend.hits().is_empty()).await;
    // The passing of time is what is tested.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(get(b.addr, "/", &[]).await.status, 429, "renewed past its ttl, the lease still holds");
    backend.gate.add_permits(1);
    assert_eq!(long.await.unwrap(), 200);
    assert_eq!(get(b.addr, "/", &[]).await.status, 200, "released at the end of the request");

    // Now `a` dies mid-request: its slot returns within one lease ttl.
    let long = tokio::spawn(async move { get(a_addr, "/held", &[]).await });
    wait_until("the request at the backend", Duration::from_secs(10), async || backend.hits().len() >= 3).await;
    assert_eq!(get(b.addr, "/", &[]).await.status, 429);
    drop(a); // SIGKILL
    let killed = Instant::now();
    wait_until("the dead instance's slot back", Duration::from_secs(10), async || {
        get(b.addr, "/", &[]).await.status == 200
    })
    .await;
    // Lapsed within one ttl of its last renewal, plus a poll (and a loaded machine's second).
    assert!(killed.elapsed() <= Duration::from_millis(1500 + 1000), "{:?}", killed.elapsed());
    long.abort();
}

/// `count: [401]` on a global limit: other statuses are taken back in Redis; every key
/// written carries the prefix and a TTL (here over three multiplexed connections).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_counted_statuses_keep_global_quota_and_keys_expire() {
    let redis = Redis::start();
    let backend = Backend::start().await;
    let sg = Conf::new()
        .redis(&redis.url(), "timeout: 1s, key_prefix: \"edge-7:\", connections: 3")
        .upstream(&backend)
        .limit("login", "key: ip, algorithm: sliding_log, limit: 2, window: 1h, count: [401], scope: global, ban: 1m")
        .limit("pace", "key: ip, rate: 10r/m, burst: 20, nodelay: true, scope: global")
        .route("match: { path_prefix: / }, upstream: b, limits: [login, pace]")
        .start();
    for _ in 0..4 {
        assert_eq!(get(sg.addr, "/status/200", &[]).await.status, 200);
    }
    assert_eq!(get(sg.addr, "/status/401", &[]).await.status, 401);
    assert_eq!(get(sg.addr, "/status/401", &[]).await.status, 401);
    let refused = get(sg.addr, "/status/200", &[]).await;
    assert_eq!(refused.status, 429, "two failures spent the quota; successes were taken back");
    assert_eq!(refused.header("retry-after"), Some("60"), "and the key is banned");
    let keys = redis.command(&["KEYS", "*"]);
    assert_eq!(keys.lines().count(), 3, "{keys}");
    for key in keys.lines() {
        assert!(key.starts_with("edge-7:{"), "{key}");
        let ttl: i64 = redis.command(&["PTTL", key]).parse().unwrap();
        // No longer than the state matters: `pace` drains its six units (6 s each); the
        // log's newest entry leaves after its hour; a ban is remembered for its length
        // and then `ban_max` (the 1 m ban's own length by default), to double a repeat.
        let most = match key.rsplit(':').next().unwrap() {
            "lb0" => 6 * 6_000,
            "sl0" => 3_600_000,
            "ban" => 2 * 60_000,
            other => panic!("unexpected key {key} ({other})"),
        };
        // (Rounded up to a whole ms.)
        assert!(ttl <= most + 1 && ttl > most - 10_000, "{key}: TTL {ttl} ms, at most {most} expected");
    }
}

/// Writes a private CA (`ca.pem`) and a certificate for 127.0.0.1 signed by it
/// (`server.pem`, `server.key`) into `dir`, with the openssl command.
fn private_ca(dir: &std::path::Path) {
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl").args(args).current_dir(dir).output().expect("openssl");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    openssl(
        &["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem"]
            .into_iter()
            .chain(["-days", "2", "-subj", "/CN=sluicegate test CA"])
            .collect::<Vec<_>>(),
    );
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(dir.join("ext.cnf"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    openssl(
        &["x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial"]
            .into_iter()
            .chain(["-out", "server.pem", "-days", "2", "-extfile", "ext.cnf"])
            .collect::<Vec<_>>(),
    );
}

/// `rediss://` with a private CA: decisions go through TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_limits_over_tls_with_a_private_ca() {
    let certs = tempfile::tempdir().unwrap();
    private_ca(certs.path());
    let redis = Redis::start_tls(certs.path());
    let ca = certs.path().join("ca.pem");
    let sg = Conf::new()
        .redis(
            &format!("rediss://127.0.0.1:{}", redis.tls_port),
            &format!("tls_ca_file: \"{}\", timeout: 1s", ca.display()),
        )
        .limit("g", "key: ip, rate: 1r/m, burst: 1, nodelay: true, scope: global, on_store_error: deny")
        .answering("g")
        .start();
    assert_eq!(futures_statuses(sg.addr, "/", 3).await, [200, 200, 429], "{}", sg.log());
    assert_eq!(redis.command(&["DBSIZE"]), "1");
}

/// A Redis with a password: the right one is used; with a wrong one Redis refuses every
/// call, and `on_store_error` decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_sent_and_a_refusal_is_a_store_error() {
    let redis = Redis::start();
    assert_eq!(redis.command(&["CONFIG", "SET", "requirepass", "s3cret"]), "OK");
    let config = |password: &str| {
        Conf::new()
            .redis(&redis.url(), &format!("{password}, timeout: 1s"))
            .limit("g", "key: ip, rate: 1r/m, burst: 1, nodelay: true, scope: global, on_store_error: deny")
            .answering("g")
    };
    let right = config("password: s3cret").start();
    assert_eq!(futures_statuses(right.addr, "/", 3).await, [200, 200, 429], "{}", right.log());
    let wrong = config("password: guess").start();
    assert_eq!(futures_statuses(wrong.addr, "/", 2).await, [503, 503], "{}", wrong.log());
    // Kept out of the file: from the environment, or from a file of its own.
    let env = Sluicegate::try_start_with(
        &config("password: \"${SG_REDIS_PASSWORD}\"").yaml(),
        &[("SG_REDIS_PASSWORD", "s3cret")],
    )
    .unwrap();
    assert_eq!(futures_statuses(env.addr, "/", 1).await, [429], "the same key, counted in Redis: {}", env.log());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("redis-password");
    std::fs::write(&file, "s3cret\n").unwrap();
    let from_file = config(&format!("password_file: \"{}\"", file.display())).start();
    assert_eq!(futures_statuses(from_file.addr, "/", 1).await, [429], "{}", from_file.log());
}
