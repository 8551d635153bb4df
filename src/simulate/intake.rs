//! The requests of one or more access logs, in the order they arrived.
//!
//! Logs are written as requests end, so a line may come after one that arrived later.
//! Each file's lines wait in a buffer until the log has moved `window` past them, and
//! leave it sorted by arrival (file order among equal instants); a line that comes later
//! still is taken at the instant replayed last, and counted as late. Several files are
//! merged by arrival, so logs of several instances replay as one stream, and rotated
//! ones one after the other.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::fs::File;
use std::io::{BufRead, BufReader, IsTerminal, Read as _};
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use super::format::{Format, Logged, Read, TimeCache};
use super::{ByKey, SimulateError};

/// Lines read ahead to tell a log's format.
const DETECT_LINES: usize = 20;
/// Unreadable lines quoted in the report.
const EXAMPLES: usize = 5;
/// Longest part of an unreadable line quoted.
const QUOTED: usize = 160;

/// One request, where it came from.
pub struct Entry {
    pub at: u64,
    pub file: usize,
    pub line: u64,
    pub request: Box<Logged>,
}

/// What reading the logs found besides requests.
#[derive(Debug, Default, Serialize)]
pub struct Intake {
    pub lines: u64,
    pub requests: u64,
    pub unreadable: u64,
    /// The first few unreadable lines.
    pub examples: Vec<Unreadable>,
    /// Lines that came more than the reorder window after a later arrival.
    pub late: u64,
    /// Lines sluicegate's writer said it dropped (`access_log_lines_dropped`).
    pub dropped: u64,
}

#[derive(Debug, Serialize)]
pub struct Unreadable {
    pub file: String,
    pub line: u64,
    pub reason: String,
    pub text: String,
}

/// One log file, read line by line, released in arrival order.
struct Log {
    name: String,
    reader: Box<dyn BufRead>,
    /// Lines read ahead to detect the format, not yet taken.
    ahead: VecDeque<Vec<u8>>,
    format: Format,
    cache: TimeCache,
    line: u64,
    /// Entries by arrival, then line.
    buffer: BinaryHeap<Reverse<ByKey<(u64, u64), Entry>>>,
    /// The latest arrival read so far.
    newest: u64,
    /// The arrival of the last entry released.
    released: u64,
    done: bool,
}

/// Every log, merged.
pub struct Logs {
    logs: Vec<Log>,
    window: u64,
    pub intake: Intake,
    progress: ProgressBar,
}

impl Logs {
    /// Opens `paths` (`-`: standard input), each read in `format` (`None`: detected).
    pub fn open(paths: &[PathBuf], format: Option<&str>, window: u64) -> Result<Logs, SimulateError> {
        let mut logs = Vec::new();
        let mut total = 0;
        for path in paths {
            let name = path.display().to_string();
            let open_error = |source| SimulateError::Open { file: name.clone(), source };
            let reader: Box<dyn BufRead> = if path == Path::new("-") {
                Box::new(BufReader::new(std::io::stdin()))
            } else {
                let file = File::open(path).map_err(open_error)?;
                total += file.metadata().map(|m| m.len()).unwrap_or(0);
                Box::new(BufReader::with_capacity(1 << 16, file))
            };
            logs.push(Log::open(name, reader, format)?);
        }
        if let Some(other) = logs.iter().find(|l| l.format.name() != logs[0].format.name()) {
            return Err(SimulateError::MixedFormats {
                first: format!("{} is {}", logs[0].name, logs[0].format.name()),
                other: format!("{} is {}", other.name, other.format.name()),
            });
        }
        Ok(Logs { logs, window, intake: Intake::default(), progress: progress(total) })
    }

    /// The format of the logs (all share one).
    pub fn format(&self) -> &Format {
        &self.logs[0].format
    }

    pub fn names(&self) -> Vec<String> {
        self.logs.iter().map(|l| l.name.clone()).collect()
    }

    /// The next request to arrive, over all logs.
    pub fn next(&mut self) -> Result<Option<Entry>, SimulateError> {
        for (i, log) in self.logs.iter_mut().enumerate() {
            log.fill(i, self.window, &mut self.intake, &self.progress)?;
        }
        let first =
            (0..self.logs.len()).filter_map(|i| Some((self.logs[i].buffer.peek()?.0.0.0, i))).min().map(|(_, i)| i);
        let Some(i) = first else {
            self.progress.finish_and_clear();
            return Ok(None);
        };
        let log = &mut self.logs[i];
        let Some(Reverse(ByKey(_, entry))) = log.buffer.pop() else { return Ok(None) };
        log.released = entry.at;
        Ok(Some(entry))
    }
}

impl Log {
    fn open(name: String, mut reader: Box<dyn BufRead>, format: Option<&str>) -> Result<Log, SimulateError> {
        let mut ahead = VecDeque::new();
        let format = match format {
            Some(format) => Format::named(format)?,
            None => {
                while ahead.len() < DETECT_LINES {
                    let mut line = Vec::new();
                    let read = (&mut reader).take(1 << 20).read_until(b'\n', &mut line);
                    match read.map_err(|source| SimulateError::Read { file: name.clone(), source })? {
                        0 => break,
                        _ => ahead.push_back(line),
                    }
                }
                let texts: Vec<String> = ahead.iter().map(|l| String::from_utf8_lossy(l).into_owned()).collect();
                Format::detect(texts.iter().map(String::as_str))
                    .ok_or_else(|| SimulateError::UnknownFormat { file: name.clone() })?
            }
        };
        Ok(Log {
            name,
            reader,
            ahead,
            format,
            cache: TimeCache::default(),
            line: 0,
            buffer: BinaryHeap::new(),
            newest: 0,
            released: 0,
            done: false,
        })
    }

    /// Reads until the earliest buffered entry is `window` behind the newest, or the end.
    fn fill(
        &mut self,
        file: usize,
        window: u64,
        intake: &mut Intake,
        progress: &ProgressBar,
    ) -> Result<(), SimulateError> {
        let mut text = Vec::new();
        while !self.done && self.buffer.peek().is_none_or(|w| w.0.0.0.saturating_add(window) > self.newest) {
            text.clear();
            match self.ahead.pop_front() {
                Some(line) => text = line,
                None => {
                    let read = self.reader.read_until(b'\n', &mut text);
                    if read.map_err(|source| SimulateError::Read { file: self.name.clone(), source })? == 0 {
                        self.done = true;
                        break;
                    }
                }
            }
            progress.inc(text.len() as u64);
            self.line += 1;
            intake.lines += 1;
            let parsed = match std::str::from_utf8(&text) {
                Ok(line) => self.format.read(line, &mut self.cache),
                Err(_) => Err(super::format::Unreadable("not UTF-8".to_owned())),
            };
            match parsed {
                Ok(Read::Request(request)) => {
                    intake.requests += 1;
                    let mut at = request.at;
                    if at < self.released {
                        intake.late += 1;
                        at = self.released;
                    }
                    self.newest = self.newest.max(at);
                    self.buffer.push(Reverse(ByKey((at, self.line), Entry { at, file, line: self.line, request })));
                }
                Ok(Read::Dropped(n)) => intake.dropped += n,
                Ok(Read::Blank) => {}
                Err(why) => {
                    intake.unreadable += 1;
                    if intake.examples.len() < EXAMPLES {
                        let shown = String::from_utf8_lossy(&text);
                        let shown = shown.trim_end();
                        let cut = (0..=QUOTED.min(shown.len())).rev().find(|&i| shown.is_char_boundary(i)).unwrap_or(0);
                        intake.examples.push(Unreadable {
                            file: self.name.clone(),
                            line: self.line,
                            reason: why.0,
                            text: shown[..cut].to_owned(),
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

/// A progress bar over `bytes` of logs, drawn on a terminal only.
fn progress(bytes: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() || bytes == 0 {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(bytes), ProgressDrawTarget::stderr());
    let style =
        ProgressStyle::with_template("{bar:40} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}
