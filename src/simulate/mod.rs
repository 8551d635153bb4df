//! `sluicegate simulate`: what a configuration would have done to the requests of
//! access logs, replayed on a virtual clock taken from the logs' times, through the
//! routing, keys and limiters `run` uses (`replay`).
//!
//! `intake` reads the logs (`format`) and hands their requests over in arrival order;
//! each configuration's `Replay` decides them; `report` counts and tells, `plot` draws.

pub mod format;
mod intake;
mod plot;
mod replay;
pub mod report;
pub mod synthetic;
mod tally;
pub use tally::Counts;

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::time::Duration;

use smallvec::SmallVec;

use crate::config::{self, LimitId, LoadError};
pub use format::FormatError;
use intake::Logs;
use replay::{Fate, Replay};
use report::{Changes, NewlyRefused, Output, Report};

/// A value ordered by its key alone, for the queues of `intake` and `replay`.
struct ByKey<K, V>(K, V);

impl<K: Ord, V> PartialEq for ByKey<K, V> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl<K: Ord, V> Eq for ByKey<K, V> {}
impl<K: Ord, V> PartialOrd for ByKey<K, V> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<K: Ord, V> Ord for ByKey<K, V> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.cmp(&other.0)
    }
}

/// What to replay and how to report it.
#[derive(Debug, Clone)]
pub struct Options {
    /// One configuration, or two to compare.
    pub configs: Vec<PathBuf>,
    pub logs: Vec<PathBuf>,
    /// `json`, `combined`, or an nginx `log_format` string (`None`: detected).
    pub format: Option<String>,
    /// The host of requests whose line names none.
    pub host: Option<String>,
    /// How far a line may come after a later arrival and still be replayed in order.
    pub reorder_window: Duration,
    /// Keys and seconds listed.
    pub top: usize,
    pub plot: Option<PathBuf>,
    /// Where to write one JSON line per request decided.
    pub decisions: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    /// A file that cannot be read says so in one line, as `run` does.
    #[error("{0}")]
    ConfigRead(LoadError),
    #[error("{error}\n{file}: configuration is invalid")]
    Config { file: String, error: LoadError },
    #[error("simulate takes one configuration, or two to compare (-c OLD -c NEW)")]
    Configs,
    #[error("{file}: cannot open: {source}")]
    Open { file: String, source: std::io::Error },
    #[error("{file}: cannot read: {source}")]
    Read { file: String, source: std::io::Error },
    #[error("{file}: cannot write: {source}")]
    Write { file: String, source: std::io::Error },
    #[error(
        "{file}: cannot tell the log's format from its first lines: give --format json, --format combined, or \
         --format with the nginx log_format string"
    )]
    UnknownFormat { file: String },
    #[error("logs of different formats ({first}, {other}): replay them one format at a time")]
    MixedFormats { first: String, other: String },
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("{file}: cannot draw the plot: {message}")]
    Plot { file: String, message: String },
}

/// Replays the logs of `options` through each of its configurations.
pub fn run(options: &Options) -> Result<Output, SimulateError> {
    if options.configs.is_empty() || options.configs.len() > 2 {
        return Err(SimulateError::Configs);
    }
    if let Some(path) = options.plot.as_ref().filter(|p| p.extension().is_none_or(|e| e != "svg")) {
        let message = "the plot is drawn as SVG: name the file FILE.svg".to_owned();
        return Err(SimulateError::Plot { file: path.display().to_string(), message });
    }
    let configs = options
        .configs
        .iter()
        .map(|path| {
            let file = path.display().to_string();
            config::load(path).map(|c| (c, file.clone())).map_err(|error| match error {
                LoadError::Read { .. } => SimulateError::ConfigRead(error),
                LoadError::Invalid(_) => SimulateError::Config { file, error },
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let window = u64::try_from(options.reorder_window.as_nanos()).unwrap_or(u64::MAX);
    let mut logs = Logs::open(&options.logs, options.format.as_deref(), window)?;
    let carried = logs.format().carried();
    let mut replays: Vec<Replay> =
        configs.into_iter().map(|(c, name)| Replay::new(c, name, &carried, options.host.clone())).collect();
    let mut decisions = options
        .decisions
        .as_ref()
        .map(|path| {
            let file = File::create(path)
                .map_err(|source| SimulateError::Open { file: path.display().to_string(), source })?;
            Ok::<_, SimulateError>((BufWriter::new(file), path.display().to_string()))
        })
        .transpose()?;
    let names = logs.names();
    let mut compared = Compared::default();
    let (mut from, mut to) = (None, None);
    // Requests whose fate a queue deferred under some configuration, by number: where
    // they are in the logs, and each configuration's fate once known.
    let mut deferred: HashMap<u64, Deferred> = HashMap::new();
    let mut number = 0u64;
    while let Some(entry) = logs.next()? {
        from.get_or_insert(entry.at);
        to = Some(entry.at);
        let fates: SmallVec<[Option<Fate>; 2]> =
            replays.iter_mut().map(|r| r.take(&entry.request, entry.at, number)).collect();
        deferred.insert(number, (entry.file, entry.line, entry.at, fates));
        number += 1;
        settle(&mut deferred, &mut replays, &mut decisions, &mut compared, &names, false)?;
    }
    for replay in &mut replays {
        replay.finish();
    }
    settle(&mut deferred, &mut replays, &mut decisions, &mut compared, &names, true)?;
    if let Some((mut out, file)) = decisions {
        out.flush().map_err(|source| SimulateError::Write { file, source })?;
    }
    if let Some(path) = &options.plot {
        plot::draw(path, &replays)
            .map_err(|message| SimulateError::Plot { file: path.display().to_string(), message })?;
    }
    let changes = (replays.len() == 2).then(|| compared.changes(&replays, options.top));
    let configs: Vec<Report> = replays.iter_mut().map(|r| Report::of(r, options.top)).collect();
    let changes = changes.map(|(keys, refused, admitted)| Changes {
        routes: report::changes(
            configs[0].routes.iter().map(|r| (r.name.as_str(), r.counts)),
            configs[1].routes.iter().map(|r| (r.name.as_str(), r.counts)),
        ),
        limits: report::changes(
            configs[0].limits.iter().filter(|l| l.not_simulated.is_none()).map(|l| (l.name.as_str(), l.counts)),
            configs[1].limits.iter().filter(|l| l.not_simulated.is_none()).map(|l| (l.name.as_str(), l.counts)),
        ),
        newly_refused: refused,
        newly_admitted: admitted,
        newly_refused_keys: keys,
    });
    Ok(Output {
        logs: names,
        format: logs.format().name(),
        timestamps: if carried.millis { "milliseconds" } else { "seconds" },
        from: from.map(report::timestamp),
        to: to.map(report::timestamp),
        intake: std::mem::take(&mut logs.intake),
        configs,
        changes,
    })
}

/// A request taken by every replay: its log, line and instant, and each configuration's
/// fate once known (a queue defers it).
type Deferred = (usize, u64, u64, SmallVec<[Option<Fate>; 2]>);

/// The decisions file and where it is written, if one is.
type Decisions = Option<(BufWriter<File>, String)>;

/// Takes the fates the replays settled since the last call and writes and compares each
/// request whose fate every configuration knows (`all`: the replays are over).
fn settle(
    deferred: &mut HashMap<u64, Deferred>,
    replays: &mut [Replay],
    decisions: &mut Decisions,
    compared: &mut Compared,
    names: &[String],
    all: bool,
) -> Result<(), SimulateError> {
    for n in 0..replays.len() {
        for (number, fate) in replays[n].resolved() {
            if let Some((.., fates)) = deferred.get_mut(&number) {
                fates[n] = Some(fate);
            }
        }
    }
    let mut known: Vec<u64> =
        deferred.iter().filter(|(_, (.., fates))| fates.iter().all(Option::is_some)).map(|(&n, _)| n).collect();
    known.sort_unstable();
    for number in known {
        let Some((file, line, at, fates)) = deferred.remove(&number) else { continue };
        let fates: SmallVec<[Fate; 2]> = fates.into_iter().flatten().collect();
        if let Some((out, path)) = decisions {
            for (n, fate) in fates.iter().enumerate() {
                let written = decision_line(&replays[n], fate, &names[file], line, at, n, replays.len());
                writeln!(out, "{written}").map_err(|source| SimulateError::Write { file: path.clone(), source })?;
            }
        }
        if let [old, new] = &fates[..] {
            compared.add(old, new);
        }
    }
    debug_assert!(!all || deferred.is_empty(), "every wait ends with the replay");
    Ok(())
}

/// One request's fate under configuration `n` of `of`, as a JSON line.
fn decision_line(replay: &Replay, fate: &Fate, log: &str, line: u64, at: u64, n: usize, of: usize) -> String {
    let limits = &replay.config.limits;
    let mut value = serde_json::json!({
        "log": log,
        "line": line,
        "at": report::timestamp(at),
        "route": fate.route.map(|r| replay.config.routes[r].name.as_str()),
        "outcome": fate.outcome,
        "wait_ms": fate.wait.as_secs_f64() * 1000.0,
        "status": fate.refused.map(|(_, status, _)| status).or(fate.held),
        "limit": fate.refused.map(|(limit, _, _)| limits[limit].name.as_str()),
        "missing_key": fate.missing_key.iter().map(|&l| limits[l].name.as_str()).collect::<Vec<_>>(),
    });
    if let (true, Some((limit, _, _)), "rejected" | "banned") = (fate.grpc, fate.refused, fate.outcome) {
        // A gRPC call is refused with a gRPC status (HTTP 200, as the proxy answers it).
        value["grpc_status"] = serde_json::Value::from(limits[limit].grpc_status.0);
    }
    if of > 1 {
        value["config"] = serde_json::Value::from(replay.name.as_str());
        value["config_index"] = serde_json::Value::from(n);
    }
    value.to_string()
}

/// What the second configuration does differently, request by request.
#[derive(Default)]
struct Compared {
    /// Requests the second refuses and the first did not, by refusing limit and key hash.
    refused: HashMap<(LimitId, Option<u64>), u64>,
    newly_refused: u64,
    newly_admitted: u64,
}

impl Compared {
    fn add(&mut self, old: &Fate, new: &Fate) {
        match (old.refused, new.refused) {
            (None, Some((limit, _, key))) => {
                self.newly_refused += 1;
                *self.refused.entry((limit, key)).or_default() += 1;
            }
            (Some(_), None) => self.newly_admitted += 1,
            _ => {}
        }
    }

    /// The keys newly refused most (as the second configuration's log lines name them),
    /// and the counts of requests newly refused and newly admitted.
    fn changes(&self, replays: &[Replay], top: usize) -> (Vec<NewlyRefused>, u64, u64) {
        let new = &replays[1];
        let mut keys: Vec<NewlyRefused> = self
            .refused
            .iter()
            .map(|(&(limit, key), &requests)| NewlyRefused {
                limit: new.config.limits[limit].name.clone(),
                key: key.and_then(|k| new.tally.limits[limit].key_label(k)).unwrap_or("-").to_owned(),
                requests,
            })
            .collect();
        keys.sort_unstable_by(|a, b| {
            b.requests.cmp(&a.requests).then_with(|| (&a.limit, &a.key).cmp(&(&b.limit, &b.key)))
        });
        keys.truncate(top);
        (keys, self.newly_refused, self.newly_admitted)
    }
}
