//! A real, headless Chromium for the dashboard's tests, driven through chromedriver (both
//! from Debian's `chromium` and `chromium-driver`): the driver started on a free port,
//! the browser with a profile of its own, both ended with the test.
//!
//! Driven by fantoccini over the W3C WebDriver protocol: the standard every browser's
//! driver speaks (geckodriver too), pure Rust over the hyper the suite already builds, no
//! Node and no browser download (Playwright needs Node; chromiumoxide speaks Chrome's own
//! DevTools protocol). The one thing WebDriver lacks, the browser's console, comes from
//! chromedriver's log endpoint, with `goog:loggingPrefs`.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use fantoccini::{Client, ClientBuilder};
use hyper_util::client::legacy::connect::HttpConnector;

use crate::common::{request, wait_until};

const MISSING: &str =
    "chromium or chromedriver is missing: apt-get install -y chromium chromium-driver (see README.md)";
/// How long the driver and the browser may take to start on a loaded machine.
const START_WITHIN: Duration = Duration::from_secs(60);

/// A browser session; the driver and the browser are killed on drop.
pub struct Chromium {
    pub client: Client,
    port: u16,
    _driver: Driver,
    _profile: tempfile::TempDir,
}

/// chromedriver, killed with its browser on drop (the test's end, or its failure).
struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        // Its process group: the driver and every browser process it started.
        let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", self.0.id())]).status();
        let _ = self.0.wait();
    }
}

/// chromedriver on a free port, and that port. A driver that ends before it says it
/// listens (seen once in a few hundred starts on a loaded machine) is started again, up
/// to three times; what it wrote is in the failure.
fn start_driver() -> (Driver, u16) {
    let mut said = Vec::new();
    for _ in 0..3 {
        // A process group of its own: the browser it starts is killed with it.
        let mut driver = Driver(
            Command::new("chromedriver")
                .arg("--port=0")
                .process_group(0)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let stdout = driver.0.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // "ChromeDriver was started successfully on port 40239."
                let port = line.split("started successfully on port ").nth(1).map(|p| p.trim_end_matches('.').parse());
                let _ = tx.send((line.clone(), port.and_then(Result::ok)));
            }
        });
        loop {
            match rx.recv_timeout(START_WITHIN) {
                Ok((_, Some(port))) => return (driver, port),
                Ok((line, None)) => said.push(line),
                Err(mpsc::RecvTimeoutError::Timeout) => panic!("chromedriver said no port within {START_WITHIN:?}"),
                // It ended (its output closed) without saying its port: again.
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
    }
    panic!("chromedriver ended three times without listening; it said:\n{}", said.join("\n"))
}

impl Chromium {
    /// A new browser, or `None` (saying so) when Chromium or chromedriver is not installed
    /// and `CI` is not set: CI installs them (`.ci/run`), and there their absence fails.
    pub async fn start() -> Option<Chromium> {
        let installed =
            |program: &str| Command::new(program).arg("--version").output().is_ok_and(|o| o.status.success());
        if !installed("chromium") || !installed("chromedriver") {
            assert!(std::env::var_os("CI").is_none(), "{MISSING}");
            eprintln!("skipped: {MISSING}");
            return None;
        }
        let (driver, port) = start_driver();
        let profile = tempfile::tempdir().unwrap();
        let client = connect(port, &profile).await;
        client.set_window_size(1300, 1500).await.unwrap();
        Some(Chromium { client, port, _driver: driver, _profile: profile })
    }

    /// Runs `script` (a function body that `return`s a value) in the page.
    pub async fn run(&self, script: &str) -> serde_json::Value {
        self.client.execute(script, Vec::new()).await.unwrap()
    }

    /// Waits (at most `within`) until `script` returns true in the page.
    pub async fn until(&self, what: &str, within: Duration, script: &str) {
        wait_until(what, within, async || self.run(script).await == serde_json::Value::Bool(true)).await;
    }

    /// What the page wrote to the browser's console since the last call, errors the
    /// browser logged itself included (failed loads, policy violations, uncaught
    /// exceptions): `(level, message)`.
    pub async fn console(&self) -> Vec<(String, String)> {
        let session = self.client.session_id().await.unwrap().unwrap();
        let ask = http::Request::post(format!("/session/{session}/se/log"))
            .header("host", format!("127.0.0.1:{}", self.port))
            .header("content-type", "application/json")
            .body(r#"{"type":"browser"}"#.to_owned())
            .unwrap();
        let reply = request(([127, 0, 0, 1], self.port).into(), ask).await;
        let logs: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
        let entries = logs["value"].as_array().unwrap_or_else(|| panic!("no browser log: {logs}"));
        let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
        entries.iter().map(|e| (text(&e["level"]), text(&e["message"]))).collect()
    }

    /// Ends the session (the browser quits), then the driver.
    pub async fn close(self) {
        // The driver's `Drop` kills whatever did not end.
        let _ = self.client.clone().close().await;
    }
}

/// A session of the driver on `port`: headless, in `profile`, with none of the
/// background connections this machine's closed network refuses, the console logged.
async fn connect(port: u16, profile: &tempfile::TempDir) -> Client {
    let args = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-breakpad",
        "--disable-crash-reporter",
        "--disable-dev-shm-usage",
    ];
    let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    args.push(format!("--user-data-dir={}", profile.path().display()));
    let capabilities = serde_json::json!({
        "goog:chromeOptions": { "args": args },
        "goog:loggingPrefs": { "browser": "ALL" },
    });
    let serde_json::Value::Object(capabilities) = capabilities else { unreachable!() };
    let mut builder = ClientBuilder::new(HttpConnector::new());
    builder.capabilities(capabilities);
    let url = format!("http://127.0.0.1:{port}");
    match tokio::time::timeout(START_WITHIN, builder.connect(&url)).await {
        Ok(Ok(client)) => client,
        Ok(Err(e)) => panic!("chromedriver could not start Chromium: {e}"),
        Err(_) => panic!("Chromium did not start within {START_WITHIN:?}"),
    }
}
