//! SIGHUP reloads the configuration: limits keep their state, requests in flight finish
//! under the configuration they started with, and a broken file changes nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::common::*;

fn config(backend: &Backend, limits: &str, body: &str) -> String {
    format!(
        r#"
listen: 127.0.0.1:0
admin: {{ listen: 127.0.0.1:0 }}
upstreams:
  b: {{ servers: ["{}"] }}
limits:
{limits}
routes:
  - match: {{ path: /static }}
    respond: {{ status: 200, body: "{body}" }}
  - match: {{ path: /limited }}
    respond: {{ status: 200 }}
    limits: [l]
  - upstream: b
    limits: [slot]
"#,
        backend.addr
    )
}

const SLOT: &str = "  slot: { key: ip, concurrency: 1 }";

#[tokio::test]
async fn a_reload_keeps_a_throttled_key_throttled_and_applies_the_new_rate() {
    let backend = Backend::start().await;
    let sg = Sluicegate::start(&config(&backend, &format!("  l: {{ key: ip, rate: 1r/m }}\n{SLOT}"), "a"));
    assert_eq!(get(sg.addr, "/limited", &[]).await.status, 200);
    assert_eq!(get(sg.addr, "/limited", &[]).await.status, 429);
    let log =
        sg.reload(&config(&backend, &format!("  l: {{ key: ip, rate: 1r/m, burst: 1, nodelay: true }}\n{SLOT}"), "b"));
    assert!(log.contains("configuration reloaded") && log.contains(r#"kept":"[\"l\", \"slot\"]"#), "{log}");
    assert_eq!(get(sg.addr, "/static", &[]).await.text(), "b", "the new configuration serves");
    // The key's bucket still holds the request of before: the new burst of one admits one
    // more (a fresh key would be admitted twice), then refuses.
    assert_eq!(get(sg.addr, "/limited", &[]).await.status, 200);
    assert_eq!(get(sg.addr, "/limited", &[]).await.status, 429);
    // A changed key is another limit: it starts fresh, and the reload says so.
    let log = sg.reload(&config(&backend, &format!("  l: {{ key: method, rate: 1r/m }}\n{SLOT}"), "c"));
    assert!(log.contains(r#"fresh":"[\"l\"]"#), "{log}");
    assert_eq!(get(sg.addr, "/limited", &[]).await.status, 200);
}

/// A window's count is kept while its length is; a new length, or another number of
/// `rates:`, starts the limit fresh, and the reload's log line says which.
#[tokio::test]
async fn a_changed_window_or_number_of_rates_starts_fresh() {
    let backend = Backend::start().await;
    let with = |l: &str| config(&backend, &format!("  l: {{ key: ip, {l} }}\n{SLOT}"), "x");
    for (before, after, fresh) in [
        // Another limit in the same window: the two requests of before still count.
        // (Windows aligned to the epoch are a year long: a test that ran across the start
        // of an hour-long one would find its count gone. A year's starts are rarer.)
        ("algorithm: fixed_window, limit: 2, window: 365d", "algorithm: fixed_window, limit: 1, window: 365d", false),
        (
            "algorithm: sliding_window, limit: 2, window: 365d",
            "algorithm: sliding_window, limit: 2, window: 364d",
            true,
        ),
        ("algorithm: sliding_log, limit: 2, window: 1h", "algorithm: sliding_log, limit: 2, window: 30m", true),
        ("rates: [2r/h]", "rates: [2r/h, 10r/d]", true),
    ] {
        let sg = Sluicegate::start(&with(before));
        assert_eq!(get(sg.addr, "/limited", &[]).await.status, 200, "{before}");
        assert_eq!(get(sg.addr, "/limited", &[]).await.status, 200, "{before}");
        assert_eq!(get(sg.addr, "/limited", &[]).await.status, 429, "{before}");
        let log = sg.reload(&with(after));
        let (list, status) = if fresh { ("fresh", 200) } else { ("kept", 429) };
        assert!(log.contains(&format!(r#"{list}":"[\"l\""#)), "{before} -> {after}: {log}");
        assert_eq!(get(sg.addr, "/limited", &[]).await.status, status, "{before} -> {after}");
    }
}

#[tokio::test]
async fn a_ban_survives_a_reload() {
    let backend = Backend::start().await;
    let limits = format!("  l: {{ key: ip, rate: 1r/m, ban: 10m }}\n{SLOT}");
    let sg = Sluicegate::start(&config(&backend, &limits, "a"));
    assert_eq!(get(sg.addr, "/limited", &[]).await.status, 200);
    assert_eq!(get(sg.addr, "/limited", &[]).await.header("retry-after"), Some("600"));
    // Another route, another body, a longer ban: the key stays banned for what was left.
    sg.reload(&config(&backend, &format!("  l: {{ key: ip, rate: 10r/s, ban: 20m }}\n{SLOT}"), "b"));
    let refused = get(sg.addr, "/limited", &[]).await;
    assert_eq!(refused.status, 429);
    assert!(refused.header("retry-after").unwrap().parse::<u64>().unwrap() > 590, "{:?}", refused.headers);
}

#[tokio::test]
async fn a_reload_cuts_neither_a_streaming_response_nor_a_delayed_request() {
    let backend = Backend::start().await;
    let limits = format!("  l: {{ key: ip, rate: 2r/s, burst: 5 }}\n{SLOT}");
    let sg = Sluicegate::start(&config(&backend, &limits, "a"));
    let streaming = send(sg.addr, http::Request::get("/stream").header("host", "t").body(String::new()).unwrap()).await;
    assert_eq!(streaming.status(), 200);
    // Three at once: the second waits half a second, the third a second.
    let delayed: Vec<_> =
        (0..3).map(|_| tokio::spawn(async move { get(sg.addr, "/limited", &[]).await.status })).collect();
    sg.reload(&config(&backend, &limits, "b"));
    // The slot the stream holds is still counted by the reloaded limit.
    assert_eq!(get(sg.addr, "/other", &[]).await.status, 429);
    backend.release.notify_one();
    assert_eq!(read(streaming).await.text(), "first\nrest\n");
    for request in delayed {
        assert_eq!(request.await.unwrap(), 200);
    }
    // Its end gave the slot back to the table the new configuration uses.
    assert_eq!(get(sg.addr, "/other", &[]).await.status, 200);
}

#[tokio::test]
async fn reloads_under_keep_alive_load_fail_no_request_and_a_broken_file_changes_nothing() {
    let backend = Backend::start().await;
    let limits = format!("  l: {{ key: ip, rate: 1000r/s, burst: 1000, nodelay: true }}\n{SLOT}");
    let sg = Sluicegate::start(&config(&backend, &limits, "v0"));
    let (stop, served, failed) =
        (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (stop, served, failed, addr) = (stop.clone(), served.clone(), failed.clone(), sg.addr);
            tokio::spawn(async move {
                let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
                let (mut sender, conn) =
                    hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.unwrap();
                tokio::spawn(conn);
                // Bounded: at most 20 000 requests per client, and the test stops it.
                for _ in 0..20_000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let req = http::Request::get("/static").header("host", "t").body(String::new()).unwrap();
                    match sender.send_request(req).await {
                        Ok(r) if r.status() == 200 => served.fetch_add(1, Ordering::Relaxed),
                        _ => failed.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    let wait_for_traffic = |n: u64| {
        let served = served.clone();
        async move {
            let goal = served.load(Ordering::Relaxed) + n;
            wait_until("traffic served", Duration::from_secs(10), async || served.load(Ordering::Relaxed) >= goal)
                .await;
        }
    };
    for version in 1..=3 {
        wait_for_traffic(50).await;
        let log = sg.reload(&config(&backend, &limits, &format!("v{version}")));
        assert!(log.contains("configuration reloaded"), "{log}");
    }
    wait_for_traffic(50).await;
    // Two errors at once: both are reported, and the running configuration stays.
    let log = sg.reload("listen: nowhere\nlimits:\n  a: { key: ip, rate: 0r/s }\n");
    assert!(log.contains("reload failed"), "{log}");
    assert!(log.contains("listen: invalid address") && log.contains("limits.a.rate"), "{log}");
    wait_for_traffic(50).await;
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }
    assert_eq!(failed.load(Ordering::Relaxed), 0, "requests failed across reloads");
    assert_eq!(get(sg.addr, "/static", &[]).await.text(), "v3");
    let admin = sg.admin_addr();
    let ready = get(admin, "/readyz", &[]).await;
    assert_eq!(ready.status, 200);
    assert!(ready.text().contains("the last reload failed"), "{}", ready.text());
    let metrics = Metrics::of(&sg).await;
    assert_eq!(metrics.value("sluicegate_reloads_total{result=\"ok\"}"), 3.0);
    assert_eq!(metrics.value("sluicegate_reloads_total{result=\"failed\"}"), 1.0);
}

#[tokio::test]
async fn sluicegate_reload_checks_the_file_then_asks_the_running_instance() {
    let yaml = |body: &str, port: u16| {
        format!(
            "listen: 127.0.0.1:0\nadmin: {{ listen: \"127.0.0.1:{port}\", token: t0k }}\nroutes:\n  - respond: {{ status: 200, body: {body} }}\n"
        )
    };
    let port = closed_port();
    let sg = Sluicegate::start(&yaml("one", port));
    sg.admin_addr();
    let reload = || binary().arg("reload").arg("-c").arg(&sg.config).output().unwrap();
    // An invalid file is refused before the running instance is asked anything.
    std::fs::write(&sg.config, "listen: nowhere\n").unwrap();
    let refused = reload();
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("listen: invalid address"));
    std::fs::write(&sg.config, yaml("two", port)).unwrap();
    let asked = reload();
    assert!(asked.status.success(), "{}", String::from_utf8_lossy(&asked.stderr));
    assert!(String::from_utf8_lossy(&asked.stdout).ends_with(": reloaded\n"));
    // Done when the command returns.
    assert_eq!(get(sg.addr, "/", &[]).await.text(), "two");
    // A file `check` accepts whose reload fails (its address is taken): the command says
    // so and why, and exits 1; the running configuration stays.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let three = yaml("three", port).replace("listen: 127.0.0.1:0", &format!("listen: {}", taken.local_addr().unwrap()));
    std::fs::write(&sg.config, three).unwrap();
    let failed = reload();
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert_eq!(failed.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("reload failed") && stderr.contains("cannot listen on"), "{stderr}");
    assert_eq!(get(sg.addr, "/", &[]).await.text(), "two");
}

/// `sluicegate reload -c FILE` reloads the instance's own file only: given another file
/// (which names the same admin listener), it says which file the instance reads and
/// which was given, exits 1, and the instance reloads nothing; given its file, it names
/// the file reloaded.
#[tokio::test]
async fn sluicegate_reload_of_a_file_the_instance_does_not_read_is_refused_with_both_names() {
    let yaml = |body: &str, port: u16| {
        format!(
            "listen: 127.0.0.1:0\nadmin: {{ listen: \"127.0.0.1:{port}\" }}\nroutes:\n  - respond: {{ status: 200, body: {body} }}\n"
        )
    };
    let port = closed_port();
    let sg = Sluicegate::start(&yaml("one", port));
    sg.admin_addr();
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("other.yaml");
    std::fs::write(&other, yaml("other", port)).unwrap();
    let refused = binary().arg("reload").arg("-c").arg(&other).output().unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    let own = sg.config.canonicalize().unwrap();
    let given = other.canonicalize().unwrap();
    assert!(stderr.contains(&own.display().to_string()) && stderr.contains(&given.display().to_string()), "{stderr}");
    assert!(stderr.contains("nothing reloaded"), "{stderr}");
    assert!(refused.stdout.is_empty(), "{}", String::from_utf8_lossy(&refused.stdout));
    assert_eq!(get(sg.addr, "/", &[]).await.text(), "one");
    let log = sg.log();
    assert!(!log.contains("configuration reloaded"), "the instance reloaded:\n{log}");
    // Its own file, by another path to it: reloaded, and named as the instance reads it.
    std::fs::write(&sg.config, yaml("two", port)).unwrap();
    let dotted = sg.config.parent().unwrap().join(".").join(sg.config.file_name().unwrap());
    let asked = binary().arg("reload").arg("-c").arg(&dotted).output().unwrap();
    assert!(asked.status.success(), "{}", String::from_utf8_lossy(&asked.stderr));
    assert_eq!(String::from_utf8_lossy(&asked.stdout), format!("{}: reloaded\n", sg.config.display()));
    assert_eq!(get(sg.addr, "/", &[]).await.text(), "two");
}

/// The admin listener takes its token from the configuration in force: a reload that
/// adds a token closes the API to calls without it, one that changes it opens it to the
/// new token only (and `sluicegate reload` with the new file uses it), one that removes
/// it opens it again; a reload that moves `admin.listen` moves the listener.
#[tokio::test]
async fn a_reload_adds_changes_and_removes_the_admin_token_and_moves_the_admin_listener() {
    let yaml =
        |admin: &str| format!("listen: 127.0.0.1:0\nadmin: {{ {admin} }}\nroutes:\n  - respond: {{ status: 200 }}\n");
    let port = closed_port();
    let listen = format!("listen: \"127.0.0.1:{port}\"");
    let sg = Sluicegate::start(&yaml(&listen));
    let admin = sg.admin_addr();
    let status = async |token: Option<&str>| {
        let bearer = token.map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> = bearer.as_deref().map(|b| ("authorization", b)).into_iter().collect();
        get(admin, "/config", &headers).await.status
    };
    assert_eq!(status(None).await, 200);
    assert!(sg.reload(&yaml(&format!("{listen}, token: first-token"))).contains("configuration reloaded"));
    assert_eq!((status(None).await, status(Some("first-token")).await), (401, 200), "a token added");
    let page = get(admin, "/", &[]).await.text();
    assert!(page.contains("data-token=\"required\""), "the page asks for the token");
    assert!(sg.reload(&yaml(&format!("{listen}, token: second-token"))).contains("configuration reloaded"));
    let changed = (status(Some("first-token")).await, status(Some("second-token")).await);
    assert_eq!(changed, (401, 200), "the token changed");
    std::fs::write(&sg.config, yaml(&format!("{listen}, token: second-token"))).unwrap();
    let asked = binary().arg("reload").arg("-c").arg(&sg.config).output().unwrap();
    assert!(asked.status.success(), "{}", String::from_utf8_lossy(&asked.stderr));
    assert!(sg.reload(&yaml(&listen)).contains("configuration reloaded"));
    assert_eq!(status(None).await, 200, "the token removed");
    assert!(get(admin, "/", &[]).await.text().contains("data-token=\"none\""));
    // Moved: served at the new address, no longer at the old one.
    let moved_port = closed_port();
    let log = sg.reload(&yaml(&format!("listen: \"127.0.0.1:{moved_port}\"")));
    assert!(log.contains("configuration reloaded"), "{log}");
    let moved: std::net::SocketAddr = format!("127.0.0.1:{moved_port}").parse().unwrap();
    assert_eq!(get(moved, "/healthz", &[]).await.status, 200);
    wait_until("the old admin address to close", Duration::from_secs(5), async || {
        tokio::net::TcpStream::connect(admin).await.is_err()
    })
    .await;
}

#[tokio::test]
async fn a_changed_listen_address_rebinds_or_the_whole_reload_fails() {
    let yaml = |listen: &str, body: &str| {
        format!("listen: \"{listen}\"\nroutes:\n  - respond: {{ status: 200, body: {body} }}\n")
    };
    let sg = Sluicegate::start(&yaml("127.0.0.1:0", "one"));
    // An address in use: nothing changes, the old address serves the old configuration.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let log = sg.reload(&yaml(&taken.local_addr().unwrap().to_string(), "two"));
    assert!(log.contains("reload failed") && log.contains("cannot listen on the reloaded address"), "{log}");
    assert_eq!(get(sg.addr, "/", &[]).await.text(), "one");
    // A free one: served there with the new configuration, and the old one is closed.
    let port = closed_port();
    let log = sg.reload(&yaml(&format!("127.0.0.1:{port}"), "three"));
    assert!(log.contains("configuration reloaded"), "{log}");
    let moved: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    assert_eq!(get(moved, "/", &[]).await.text(), "three");
    assert!(tokio::net::TcpStream::connect(sg.addr).await.is_err(), "the old address still accepts");
}

/// A limit a reload keeps keeps the table it was made with: `max_keys` changes at the next
/// restart, and `sluicegate_limit_max_keys` says the size in force.
#[tokio::test]
async fn a_kept_limit_keeps_its_tables_size_and_says_so() {
    let conf = |max_keys: u32| {
        Conf::new().admin().limit("l", &format!("key: ip, rate: 10r/s, max_keys: {max_keys}")).answering("l")
    };
    let sg = conf(1000).start();
    assert!(sg.reload(&conf(5000).yaml()).contains("configuration reloaded"));
    assert_eq!(Metrics::of(&sg).await.value("sluicegate_limit_max_keys{limit=\"l\"}"), 1000.0);
}
