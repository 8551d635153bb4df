//! The real nginx beside the import: `nginx -t` on a file, and nginx serving a file in
//! the foreground until dropped. Both run with the file's directory as prefix, their pid
//! file there and their errors on stderr, never as a daemon.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::*;

const MISSING: &str =
    "nginx is not installed (`apt-get install -y nginx`, as .ci/run does): the comparison with nginx is skipped";

/// Whether nginx is installed; when not, says so (the caller skips) unless `CI` is set:
/// CI installs it, and there its absence fails.
pub fn installed() -> bool {
    let found = Command::new("nginx").arg("-v").output().is_ok_and(|o| o.status.success());
    if !found {
        assert!(std::env::var_os("CI").is_none(), "{MISSING}");
        eprintln!("skipped: {MISSING}");
    }
    found
}

/// nginx on `DIR/nginx.conf` with `-p DIR`, its pid file in DIR, its errors on stderr.
fn nginx(dir: &Path, main: &str) -> Command {
    let mut command = Command::new("nginx");
    command.arg("-c").arg(dir.join("nginx.conf")).arg("-p").arg(dir).args(["-e", "stderr", "-g"]);
    command.arg(format!("pid {}; {main}", dir.join("nginx.pid").display()));
    command
}

/// `nginx -t`'s verdict on `DIR/nginx.conf`: `Ok`, or its message and the line it names
/// in its file (`None` when it names none).
pub fn verdict(dir: &Path) -> Result<(), (String, Option<usize>)> {
    let output = nginx(dir, "").arg("-t").output().unwrap();
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let emerg = stderr.lines().find(|l| l.contains("[emerg]")).unwrap_or(&stderr).to_owned();
    let file = format!(" in {}:", dir.join("nginx.conf").display());
    let line = emerg.rsplit_once(&file).and_then(|(_, line)| line.trim().parse().ok());
    Err((emerg, line))
}

/// nginx serving `DIR/nginx.conf` (which listens on `addr`) in the foreground.
pub struct Nginx {
    child: Child,
}

impl Nginx {
    pub async fn start(dir: &Path, addr: SocketAddr) -> Nginx {
        let child = nginx(dir, "daemon off; master_process off;").stdout(Stdio::null()).spawn().unwrap();
        let mut nginx = Nginx { child };
        wait_until("nginx to listen", Duration::from_secs(10), async || {
            assert!(nginx.child.try_wait().unwrap().is_none(), "nginx ended; its errors are above");
            tokio::net::TcpStream::connect(addr).await.is_ok()
        })
        .await;
        nginx
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
