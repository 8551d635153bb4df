//! Limits with `persist: true` keep their state across a restart: written at shutdown
//! (SIGTERM) and on a timer, read back at start; a damaged, foreign or mismatched file is
//! refused with a log line, and the limit starts fresh.

use std::path::Path;
use std::time::Duration;

use crate::common::*;

/// A quota of 3 per `x-api-key` in windows of `window`, and `/login`, where a second
/// request of a key bans it for an hour; both persisted in `state` (written at shutdown,
/// and every `interval`).
fn conf(state: &Path, window: &str, interval: &str) -> Conf {
    let quota = format!(
        "key: \"header:x-api-key\", algorithm: fixed_window, limit: 3, window: {window}, persist: true, on_missing_key: skip"
    );
    Conf::new()
        .admin()
        .set(&format!("persist: {{ dir: \"{}\", interval: {interval} }}", state.display()))
        .limit("quota", &quota)
        .limit(
            "login",
            "key: \"header:x-api-key\", algorithm: fixed_window, limit: 1, window: 30d, ban: 1h, persist: true, \
             on_missing_key: skip",
        )
        .route("match: { path_prefix: /login }, limits: [login], respond: { status: 200 }")
        .answering("quota")
}

async fn status(sg: &Sluicegate, path: &str, key: &str) -> Reply {
    get(sg.addr, path, &[("x-api-key", key)]).await
}

fn retry_after(reply: &Reply) -> u64 {
    reply.header("retry-after").expect("a refusal says when").parse().unwrap()
}

async fn bans(sg: &Sluicegate) -> serde_json::Value {
    serde_json::from_slice(&get(sg.admin_addr(), "/bans", &[]).await.body).unwrap()
}

/// Spends key `k1`'s quota (3 of 3) and gets key `bad` banned at `/login`; returns the
/// quota's `Retry-After` and the ban's key as `GET /bans` writes it.
async fn spend(sg: &Sluicegate) -> (u64, String) {
    for _ in 0..3 {
        assert_eq!(status(sg, "/", "k1").await.status, 200);
    }
    let refused = status(sg, "/", "k1").await;
    assert_eq!(refused.status, 429);
    assert_eq!(status(sg, "/login", "bad").await.status, 200);
    assert_eq!(status(sg, "/login", "bad").await.status, 429);
    let bans = bans(sg).await;
    assert_eq!(bans["login"].as_array().map(Vec::len), Some(1), "{bans}");
    (retry_after(&refused), bans["login"][0]["key"].as_str().unwrap().to_owned())
}

#[tokio::test]
async fn a_restart_keeps_a_spent_quota_and_a_ban_named_as_before() {
    let state = tempfile::tempdir().unwrap();
    let conf = conf(state.path(), "30d", "1h");
    let mut sg = conf.start();
    let (quota_retry, banned) = spend(&sg).await;
    // A digest of the credential, not the key itself.
    assert!(banned.starts_with("header:x-api-key=#"), "{banned}");
    // A reload carries the state; shutdown writes what it carried.
    assert!(sg.reload(&conf.yaml()).contains("configuration reloaded"));
    assert!(sg.terminate().success());
    for file in ["quota.state", "login.state", "keys.secret"] {
        assert!(state.path().join(file).exists(), "{file} written at shutdown");
    }

    let sg = conf.start();
    let log = sg.wait_for_log("two lines \"state restored\"", |log| log.matches("state restored").count() == 2);
    assert!(log.contains(r#""limit":"quota""#) && log.contains(r#""keys":1"#), "{log}");
    // The quota stays spent until the same window's end; another key has its own.
    let refused = status(&sg, "/", "k1").await;
    assert_eq!(refused.status, 429, "a restart forgave the quota");
    assert!(retry_after(&refused) <= quota_retry && retry_after(&refused) + 30 >= quota_retry, "{refused:?}");
    assert_eq!(status(&sg, "/", "k2").await.status, 200);
    // The ban runs on, listed under the same name.
    let refused = status(&sg, "/login", "bad").await;
    assert_eq!(refused.status, 429, "a restart forgot the ban");
    assert!(retry_after(&refused) > 3500, "{refused:?}");
    let bans = bans(&sg).await;
    assert_eq!(bans["login"][0]["key"], banned.as_str(), "{bans}");
    assert!(bans["login"][0]["left_ms"].as_u64().unwrap() > 3_500_000, "{bans}");
}

#[tokio::test]
async fn state_written_on_the_timer_survives_a_crash() {
    let state = tempfile::tempdir().unwrap();
    let conf = conf(state.path(), "30d", "1s");
    let mut sg = conf.start();
    spend(&sg).await;
    let writes = async |sg: &Sluicegate| {
        Metrics::of(sg).await.get(r#"sluicegate_state_writes_total{limit="quota",result="ok"}"#).unwrap_or(0.0)
    };
    // A round under way may have read the table before the requests: wait for the next.
    let before = writes(&sg).await;
    wait_until("two writes after the requests", Duration::from_secs(10), async || writes(&sg).await >= before + 2.0)
        .await;
    // SIGKILL: no write at shutdown.
    sg.kill();

    let sg = conf.start();
    sg.wait_for_log("two lines \"state restored\"", |log| log.matches("state restored").count() == 2);
    assert_eq!(status(&sg, "/", "k1").await.status, 429);
    assert_eq!(status(&sg, "/login", "bad").await.status, 429);
}

#[tokio::test]
async fn a_damaged_or_foreign_file_is_refused_and_the_limit_starts_fresh() {
    let state = tempfile::tempdir().unwrap();
    let conf = conf(state.path(), "30d", "1h");
    let mut sg = conf.start();
    spend(&sg).await;
    assert!(sg.terminate().success());
    let quota = state.path().join("quota.state");
    let bytes = std::fs::read(&quota).unwrap();
    std::fs::write(&quota, &bytes[..bytes.len() / 2]).unwrap();
    std::fs::write(state.path().join("login.state"), "limits: { login: {} }\n").unwrap();

    let sg = conf.start();
    let log = sg.wait_for_log("two lines \"state file refused\"", |log| log.matches("state file refused").count() == 2);
    assert!(log.contains("state file refused: damaged, truncated, or edited without"), "{log}");
    assert!(log.contains("state file refused: not a sluicegate state file"), "{log}");
    assert!(log.contains(&quota.display().to_string()), "the line names the file: {log}");
    for _ in 0..3 {
        assert_eq!(status(&sg, "/", "k1").await.status, 200, "fresh");
    }
    assert_eq!(status(&sg, "/login", "bad").await.status, 200, "no ban");
}

#[tokio::test]
async fn a_limit_whose_window_changed_does_not_take_the_old_state() {
    let state = tempfile::tempdir().unwrap();
    let mut sg = conf(state.path(), "30d", "1h").start();
    spend(&sg).await;
    assert!(sg.terminate().success());

    let sg = conf(state.path(), "7d", "1h").start();
    let log = sg.wait_for_log("the lines \"state file refused\" and \"state restored\"", |log| {
        log.contains("state file refused") && log.contains("state restored")
    });
    assert!(log.contains("written for another key or windows"), "{log}");
    for _ in 0..3 {
        assert_eq!(status(&sg, "/", "k1").await.status, 200, "fresh");
    }
    // The other limit did not change: its ban holds.
    assert_eq!(status(&sg, "/login", "bad").await.status, 429);
}

#[test]
fn check_refuses_persist_where_there_is_nothing_to_keep_with_positions() {
    let yaml = "listen: 127.0.0.1:0
redis: { url: \"redis://127.0.0.1:1\" }
persist: { dir: \"\", interval: 2h }
limits:
  slots: { key: ip, concurrency: 4, persist: true }
  shared: { key: ip, rate: 10r/s, scope: global, persist: true }
routes:
  - { respond: { status: 200 }, limits: [slots, shared] }
";
    let err = sluicegate::config::parse(yaml, "FILE").expect_err("invalid").to_string();
    for line in [
        "FILE:3:17: persist.dir: must name a directory",
        "FILE:3:31: persist.interval: must be between 1s and 1h",
        "FILE:5:46: limits.slots.persist: a concurrency limit counts requests in flight, which end with the process: it has nothing to persist",
        "FILE:6:59: limits.shared.persist: global limits already live in Redis: persist applies to local limits",
    ] {
        assert!(err.contains(line), "no {line:?} in\n{err}");
    }
}

#[tokio::test]
async fn a_state_directory_that_cannot_be_written_is_counted_logged_once_and_the_proxy_serves_on() {
    let state = tempfile::tempdir().unwrap();
    // A directory under a regular file cannot be made, whoever runs the test.
    let file = state.path().join("file");
    std::fs::write(&file, "").unwrap();
    let sg = conf(&file.join("state"), "30d", "1s").start();
    sg.wait_for_log("the line \"key secret unusable\"", |log| log.contains("key secret unusable"));
    let failed = async |sg: &Sluicegate| {
        Metrics::of(sg).await.get(r#"sluicegate_state_writes_total{limit="quota",result="failed"}"#).unwrap_or(0.0)
    };
    wait_until("two failed writes", Duration::from_secs(10), async || failed(&sg).await >= 2.0).await;
    let log = sg.log();
    assert_eq!(log.matches("cannot write the state file").count(), 2, "once per limit: {log}");
    assert_eq!(status(&sg, "/", "k1").await.status, 200);
}

#[test]
fn the_state_directory_is_read_from_the_configuration_files_directory() {
    let parse = |persist: &str| {
        let yaml = format!("listen: 127.0.0.1:0\n{persist}routes:\n  - {{ respond: {{ status: 200 }} }}\n");
        sluicegate::config::parse(&yaml, "/etc/sluicegate/config.yaml").unwrap().persist
    };
    let default = parse("");
    assert_eq!(default.dir, Path::new("/var/lib/sluicegate"));
    assert_eq!(default.interval, Duration::from_secs(60));
    let relative = parse("persist: { dir: state, interval: 5s }\n");
    assert_eq!(relative.dir, Path::new("/etc/sluicegate/state"));
    assert_eq!(relative.interval, Duration::from_secs(5));
    assert_eq!(parse("persist: { dir: /srv/sg }\n").dir, Path::new("/srv/sg"));
}

/// A planted state file larger than its limit can write is refused before a byte of it
/// is read: sparse files of 1 GiB + 4 KiB and of just under 1 GiB cost the proxy
/// nothing (it reads neither into memory).
#[tokio::test]
async fn a_planted_state_file_larger_than_its_limit_writes_is_refused_unread() {
    let state = tempfile::tempdir().unwrap();
    for (file, len) in [("quota.state", (1u64 << 30) + 4096), ("login.state", (1u64 << 30) - 4096)] {
        let planted = std::fs::File::create(state.path().join(file)).unwrap();
        planted.set_len(len).unwrap();
    }
    let sg = conf(state.path(), "30d", "1h").start();
    let log = sg.wait_for_log("two lines \"state file refused\"", |log| log.matches("state file refused").count() == 2);
    assert_eq!(log.matches("than this limit can write").count(), 2, "{log}");
    assert!(log.contains("refused unread"), "{log}");
    assert!(sg.rss() < 256 << 20, "{} bytes resident: the file was read", sg.rss());
    assert_eq!(status(&sg, "/", "k1").await.status, 200);
}

/// Whoever can write the state directory or a file in it could lift quotas and bans:
/// a directory others may write is neither read nor written, a state file others may
/// write or another user owns is refused, and a file edited with its checksum made to
/// match again is refused by its seal.
#[tokio::test]
async fn state_that_others_may_have_written_or_edited_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &Path, mode: u32| std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    let state = tempfile::tempdir().unwrap();
    let conf = conf(state.path(), "30d", "1h");
    let mut sg = conf.start();
    spend(&sg).await;
    assert!(sg.terminate().success());
    let (quota, login) = (state.path().join("quota.state"), state.path().join("login.state"));
    let written = (std::fs::read(&quota).unwrap(), std::fs::read(&login).unwrap());

    // The directory writable by all: nothing read from it, nothing written to it.
    mode(state.path(), 0o777);
    let mut sg = conf.start();
    let log = sg.wait_for_log("the line \"is not sluicegate's own\"", |log| log.contains("is not sluicegate's own"));
    assert!(log.contains("its group or others may write it (mode 777)"), "{log}");
    assert!(!log.contains("state restored"), "{log}");
    assert_eq!(status(&sg, "/", "k1").await.status, 200, "fresh");
    assert!(sg.terminate().success());
    assert_eq!((std::fs::read(&quota).unwrap(), std::fs::read(&login).unwrap()), written, "nothing written");

    // The directory mended; a file others may write, a file of another user.
    mode(state.path(), 0o700);
    mode(&quota, 0o666);
    std::os::unix::fs::chown(&login, Some(4242), None).unwrap();
    let mut sg = conf.start();
    let log = sg.wait_for_log("two lines \"state file refused\"", |log| log.matches("state file refused").count() == 2);
    assert!(log.contains("its group or others may write it (mode 666)"), "{log}");
    assert!(log.contains("it belongs to user 4242"), "{log}");
    assert_eq!(status(&sg, "/", "k1").await.status, 200, "fresh");
    assert_eq!(status(&sg, "/login", "bad").await.status, 200, "no ban");
    assert!(sg.terminate().success());

    // A spent count set back to nothing, and the file's SHA-256 recomputed.
    std::fs::write(&quota, &written.0).unwrap();
    mode(&quota, 0o600);
    let mut content = written.0[..written.0.len() - 32].to_vec();
    // The quota's one entry (key u64, state u64) before the bans' count (u32, 0).
    let at = content.len() - 4 - 8;
    content[at..at + 8].copy_from_slice(&0u64.to_le_bytes());
    let sum = ring::digest::digest(&ring::digest::SHA256, &content);
    content.extend_from_slice(sum.as_ref());
    std::fs::write(&quota, &content).unwrap();
    let sg = conf.start();
    let log = sg.wait_for_log("the line \"state file refused\"", |log| log.contains("state file refused"));
    assert!(log.contains("edited without the state directory's secret"), "{log}");
}

/// The secret beside the state files: deleted, a new one is drawn and saved, and the
/// files it keyed are refused; there but unusable, it is left as it is and nothing is
/// written over the state it keys; and a reload that turns `persist` on saves the
/// running secret with the state, so that the restart reads both.
#[tokio::test]
async fn the_key_secret_is_saved_once_and_never_replaced_by_a_write() {
    use std::os::unix::fs::PermissionsExt;
    let state = tempfile::tempdir().unwrap();
    let conf = conf(state.path(), "30d", "1h");
    let mut sg = conf.start();
    spend(&sg).await;
    assert!(sg.terminate().success());
    let secret = state.path().join("keys.secret");
    let quota = state.path().join("quota.state");
    let saved = std::fs::read(&secret).unwrap();

    // Unusable (others may write it): left as it is, and the state files too.
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o666)).unwrap();
    let spent = std::fs::read(&quota).unwrap();
    let mut sg = conf.start();
    let log = sg.wait_for_log("the line \"key secret unusable\"", |log| log.contains("key secret unusable"));
    assert!(log.contains("it is left as it is"), "{log}");
    assert_eq!(status(&sg, "/", "k1").await.status, 200, "fresh for this run");
    assert!(sg.terminate().success());
    assert_eq!(std::fs::read(&secret).unwrap(), saved, "the secret was replaced");
    assert_eq!(std::fs::read(&quota).unwrap(), spent, "the state it keys was written over");
    // Mended, it keys the state again.
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut sg = conf.start();
    sg.wait_for_log("two lines \"state restored\"", |log| log.matches("state restored").count() == 2);
    assert_eq!(status(&sg, "/", "k1").await.status, 429, "the spent quota is back");
    assert!(sg.terminate().success());

    // Deleted: another secret, saved; the files keyed with the old one are refused.
    std::fs::remove_file(&secret).unwrap();
    let mut sg = conf.start();
    let log = sg.wait_for_log("two lines \"state file refused\"", |log| log.matches("state file refused").count() == 2);
    assert!(log.contains("keyed with another secret"), "{log}");
    assert_eq!(status(&sg, "/", "k1").await.status, 200, "fresh");
    assert!(sg.terminate().success());
    assert_ne!(std::fs::read(&secret).unwrap(), saved, "a new secret");

    // Persist turned on by a reload: the running secret is saved with the state.
    let fresh = tempfile::tempdir().unwrap();
    let without = Conf::new()
        .admin()
        .set(&format!("persist: {{ dir: \"{}\", interval: 1h }}", fresh.path().display()))
        .limit(
            "quota",
            "key: \"header:x-api-key\", algorithm: fixed_window, limit: 3, window: 30d, on_missing_key: skip",
        )
        .answering("quota");
    let mut sg = without.start();
    for _ in 0..3 {
        assert_eq!(status(&sg, "/", "k1").await.status, 200);
    }
    let with = without.yaml().replace("on_missing_key: skip", "on_missing_key: skip, persist: true");
    assert!(sg.reload(&with).contains("configuration reloaded"));
    assert!(sg.terminate().success());
    let sg = Sluicegate::start(&with);
    sg.wait_for_log("the line \"state restored\"", |log| log.contains("state restored"));
    assert_eq!(status(&sg, "/", "k1").await.status, 429, "the quota spent before the reload is kept");
}
