//! Rejection lines a flood cannot turn into a flood of log lines.

use crate::common::*;

#[tokio::test]
async fn a_flood_of_rejections_writes_a_few_lines_a_second_and_one_summary() {
    let sg = Sluicegate::start(
        "listen: 127.0.0.1:0\ntrusted_proxies: [127.0.0.1/32]\nlimits:\n  l: { key: ip, rate: 1r/h, log_lines_per_second: 3 }\nroutes:\n  - respond: { status: 200 }\n    limits: [l]\n",
    );
    assert_eq!(get(sg.addr, "/", &[("x-forwarded-for", "192.0.2.1")]).await.status, 200);
    let started = std::time::Instant::now();
    for n in 0..200 {
        // Mostly one client, a few others once each.
        let ip = if n % 10 == 0 { format!("198.51.100.{}", n / 10) } else { "192.0.2.1".to_owned() };
        let status = get(sg.addr, "/", &[("x-forwarded-for", &ip)]).await.status;
        assert_eq!(status, if n % 10 == 0 { 200 } else { 429 });
    }
    let seconds = started.elapsed().as_secs() + 2;
    // Every rejection is either a line or counted in a summary, which the next second's
    // flush writes.
    let counted = |log: &str| {
        let lines = log.lines().filter(|l| l.contains("\"request rejected\"")).count() as u64;
        let left_out: u64 = log
            .lines()
            .filter(|l| l.contains("lines left out"))
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["fields"]["left_out"].as_u64().unwrap())
            .sum();
        (lines, left_out)
    };
    let log = sg.wait_for_log(|log| {
        let (lines, left_out) = counted(log);
        lines + left_out == 180
    });
    let (lines, left_out) = counted(&log);
    assert_eq!(lines + left_out, 180, "{log}");
    assert!(lines <= 3 * seconds, "{lines} lines in about {seconds} s");
    let summary = log.lines().find(|l| l.contains("lines left out")).unwrap();
    assert!(summary.contains("ip=192.0.2.1 ("), "the most refused key is named: {summary}");
}
