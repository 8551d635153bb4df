//! The access log (`access_log:`): one line per request, written when its response has
//! been sent (or the client went away), as JSON or in nginx's `combined` format.
//!
//! Lines go through a bounded queue to a writer thread, so a slow disk never holds up a
//! request: when the queue is full, lines are dropped and counted, and the count is
//! written once the queue drains. The file is opened again by every reload, which is how
//! a rotated log is reopened (as `nginx -s reopen` does).

use std::fs::OpenOptions;
use std::io::{BufWriter, Write};
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, Instant, SystemTime};

use http::{HeaderValue, Method, Version};

use crate::config::{AccessFormat, AccessLogConfig};
use crate::head::RequestHead;

/// Lines waiting for the writer before new ones are dropped.
const QUEUE: usize = 16 * 1024;

pub struct AccessLog {
    format: AccessFormat,
    lines: SyncSender<String>,
    dropped: Arc<AtomicU64>,
}

/// What one request's line says, gathered along the request path.
pub struct Entry {
    pub log: Arc<AccessLog>,
    pub started: Instant,
    pub time: SystemTime,
    pub client: IpAddr,
    pub method: Method,
    /// The request target as sent (path and query).
    pub target: String,
    pub version: Version,
    pub referer: Option<HeaderValue>,
    pub user_agent: Option<HeaderValue>,
    pub route: Option<String>,
    /// What the limits made of it (`passed`, `rejected`, ...; `-` when no route matched).
    pub outcome: &'static str,
    pub status: u16,
    /// Time to the upstream's response headers.
    pub upstream: Option<Duration>,
    /// Body bytes sent to the client.
    pub bytes: u64,
}

impl AccessLog {
    /// Opens the log of `config` (appending to its file, or stderr) and starts its writer.
    pub fn open(config: &AccessLogConfig) -> std::io::Result<Arc<AccessLog>> {
        let out: Box<dyn Write + Send> = match &config.path {
            None => Box::new(std::io::stderr()),
            Some(path) => {
                Box::new(OpenOptions::new().create(true).append(true).open(Path::new(path)).map_err(|e| {
                    std::io::Error::new(e.kind(), format!("access_log.path: cannot open {path:?} for appending: {e}"))
                })?)
            }
        };
        let (lines, queued) = sync_channel(QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&dropped);
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || write_lines(queued, BufWriter::new(out), &counted))?;
        Ok(Arc::new(AccessLog { format: config.format, lines, dropped }))
    }

    fn write(&self, entry: &Entry) {
        let line = match self.format {
            AccessFormat::Json => json(entry),
            AccessFormat::Combined => combined(entry),
        };
        if let Err(TrySendError::Full(_)) = self.lines.try_send(line) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Entry {
    /// Starts the line of the request `head` from `client`; the rest is filled in as it
    /// is served.
    pub fn begin(log: &Arc<AccessLog>, head: &RequestHead<'_>, client: IpAddr) -> Box<Entry> {
        let field = |name| head.fields.get(&name).and_then(|v| HeaderValue::from_bytes(v).ok());
        Box::new(Entry {
            log: Arc::clone(log),
            started: Instant::now(),
            time: SystemTime::now(),
            client,
            method: head.method.clone(),
            target: head.target.to_owned(),
            version: head.version,
            referer: field(http::header::REFERER),
            user_agent: field(http::header::USER_AGENT),
            route: None,
            outcome: "-",
            // Until an answer is made: the client went away before it (nginx's 499).
            status: 499,
            upstream: None,
            bytes: 0,
        })
    }
}

impl Drop for Entry {
    /// The response is done (sent, or abandoned by the client): its line is complete.
    fn drop(&mut self) {
        self.log.write(self);
    }
}

/// Writes lines as they come, flushing whenever the queue runs empty.
fn write_lines(queued: Receiver<String>, mut out: BufWriter<Box<dyn Write + Send>>, dropped: &AtomicU64) {
    loop {
        match queued.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => {
                let _ = out.write_all(line.as_bytes());
                continue;
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                let _ = out.flush();
                return;
            }
        }
        let lost = dropped.swap(0, Ordering::Relaxed);
        if lost > 0 {
            let _ = writeln!(out, "{{\"access_log_lines_dropped\":{lost}}}");
        }
        let _ = out.flush();
    }
}

fn header_text(value: Option<&HeaderValue>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

fn json(e: &Entry) -> String {
    let value = serde_json::json!({
        "time": humantime::format_rfc3339_millis(e.time).to_string(),
        "client": e.client.to_canonical().to_string(),
        "method": e.method.as_str(),
        "target": e.target,
        "protocol": format!("{:?}", e.version),
        "status": e.status,
        "bytes": e.bytes,
        "duration_ms": round_ms(e.started.elapsed()),
        "upstream_ms": e.upstream.map(round_ms),
        "route": e.route,
        "outcome": e.outcome,
        "referer": e.referer.as_ref().map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
        "user_agent": e.user_agent.as_ref().map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
    });
    format!("{value}\n")
}

fn round_ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1_000_000.0).round() / 1000.0
}

/// nginx's `combined`: `$remote_addr - $remote_user [$time_local] "$request" $status
/// $body_bytes_sent "$http_referer" "$http_user_agent"`, in UTC.
fn combined(e: &Entry) -> String {
    format!(
        "{} - - [{}] \"{} {} {:?}\" {} {} \"{}\" \"{}\"\n",
        e.client.to_canonical(),
        time_local(e.time),
        e.method,
        e.target.escape_default(),
        e.version,
        e.status,
        e.bytes,
        header_text(e.referer.as_ref()).escape_default(),
        header_text(e.user_agent.as_ref()).escape_default(),
    )
}

/// `22/Nov/2026:23:41:45 +0000`, from the RFC 3339 form `2026-11-22T23:41:45Z`.
fn time_local(time: SystemTime) -> String {
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let rfc = humantime::format_rfc3339_seconds(time).to_string();
    let month = rfc.get(5..7).and_then(|m| m.parse::<usize>().ok()).and_then(|m| MONTHS.get(m.wrapping_sub(1)));
    match (rfc.get(0..4), month, rfc.get(8..10), rfc.get(11..19)) {
        (Some(year), Some(month), Some(day), Some(clock)) => format!("{day}/{month}/{year}:{clock} +0000"),
        _ => rfc,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_local_is_nginx_s() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_391_305);
        assert_eq!(time_local(t), "22/Nov/2026:23:48:25 +0000");
    }
}
