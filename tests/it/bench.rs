//! The whole-proxy benchmark still works: `benches/wrk/run.sh` in its one-core layout,
//! one repetition of one second against this build of sluicegate and the test backend.
//! The figures mean nothing here (a loaded machine, one second); the table must come.

use std::process::Command;

use crate::common::Backend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_one_core_benchmark_runs_for_a_second_and_prints_its_table() {
    if Command::new("wrk").arg("--version").output().is_err() {
        eprintln!("skipped: wrk is not installed (apt-get install wrk), so the benchmark cannot run");
        return;
    }
    let backend = Backend::start().await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/wrk/run.sh");
    let port = backend.addr.port().to_string();
    let run = tokio::task::spawn_blocking(move || {
        Command::new("bash")
            .arg(script)
            .envs([
                ("LAYOUT", "onecore"),
                ("CASES", "forwarded"),
                ("REPS", "1"),
                ("DURATION", "1s"),
                ("WARMUP", "0s"),
                ("SKIP_BUILD", "1"),
                ("SG", env!("CARGO_BIN_EXE_sluicegate")),
                ("BACKEND_PORT", &port),
            ])
            .output()
            .unwrap()
    });
    let output = tokio::time::timeout(std::time::Duration::from_secs(90), run).await.unwrap().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "run.sh failed:\n{stdout}\n{stderr}");
    let row = stdout
        .lines()
        .find(|l| l.starts_with("| forwarded | sluicegate |"))
        .unwrap_or_else(|| panic!("no sluicegate row in:\n{stdout}\n{stderr}"));
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    let rps: f64 = cells[3].parse().unwrap_or_else(|_| panic!("req/s is not a number in {row:?}"));
    assert!(rps > 0.0, "{row}");
    assert_eq!(cells[9], "0", "every forwarded request should pass: {row}");
    assert!(stdout.contains("| direct | backend |"), "{stdout}");
    assert!(!backend.hits().is_empty(), "the requests reached the test backend");
}
