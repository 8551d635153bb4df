//! A candidate configuration, live beside the enforced one (`POST /candidate`,
//! `sluicegate reload --candidate FILE`). Every request the enforced configuration
//! decides is decided again by the candidate's routes and limits, on the same request,
//! with the candidate's own state (fresh when it is loaded; its global limits under
//! their own Redis keys, `KEY_PREFIX` after the configured prefix). The candidate's
//! decision is never acted on: it refuses, delays, bans and shows nothing, touches none
//! of the enforced limits' state, and holds its own concurrency slots while the request
//! lives. What it would do differently is tallied (`diff`) for `GET /candidate`, the
//! metrics, the dashboard and the access log; `explain` shows both decisions; `promote`
//! makes it the running configuration, as a reload does.
//!
//! The candidate is read from a file beside the instance's configuration (the admin API
//! reads no file an operator did not put there), and kept as read: promoting it compiles
//! the same text, and is refused if either file changed on disk since it was loaded.

mod diff;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use http::StatusCode;

use crate::admission::{self, Admission, Asked, Decide, Verdict, Way};
use crate::clock::Clock;
use crate::config::{self, Config, LoadError};
use crate::gate::{Gate, Permits};
use crate::limit::Limiters;
use crate::metrics::Metrics;
pub use diff::{Change, Diff, Report};

/// What the Redis keys of a candidate's global limits begin with, after `redis.key_prefix`:
/// the enforced limits' keys are never touched.
const KEY_PREFIX: &str = "candidate:";

/// A configuration deciding requests beside the enforced one, without acting.
pub struct Candidate {
    /// Its routes and limits (its listeners and upstreams serve nothing until promoted).
    pub config: Config,
    /// Its own state, hashing keys with the enforced limits' secret, so that a key is
    /// named alike on both sides.
    pub gate: Gate,
    /// The file it was read from (absolute).
    pub file: PathBuf,
    /// That file's text, as compiled.
    text: String,
    /// The instance's configuration file, and its bytes when the candidate was loaded.
    source: (PathBuf, Vec<u8>),
    pub loaded: SystemTime,
    /// What `check` and the load found to say: the file's warnings, and the enforced
    /// limits with state that promoting it would start fresh.
    pub warnings: Vec<String>,
    pub diff: Diff,
}

/// Why a candidate was not loaded or promoted: the admin API's status, and why.
#[derive(Debug)]
pub struct Refusal {
    pub status: StatusCode,
    pub why: String,
}

impl Refusal {
    fn new(status: StatusCode, why: impl Into<String>) -> Refusal {
        Refusal { status, why: why.into() }
    }
}

/// What the candidate made of one request, for its access log line, and what it holds
/// while the request lives.
pub struct Judged {
    pub change: Change,
    /// The candidate's route, when it is not the enforced one (`-`: none).
    pub rerouted: Option<String>,
    /// Its concurrency slots, given back with the response.
    pub permits: Permits,
}

impl Candidate {
    /// Reads the candidate `file` for the instance whose running limits are `enforced`
    /// (counted in `metrics`), read from `source`: beside it (in the same directory),
    /// YAML, valid as `check` says.
    pub fn load(
        file: &Path,
        source: Option<&Path>,
        enforced: &Limiters,
        metrics: &Arc<Metrics>,
    ) -> Result<Candidate, Refusal> {
        let Some(source) = source else {
            return Err(Refusal::new(
                StatusCode::CONFLICT,
                "not started from a file: there is nothing to compare with",
            ));
        };
        let (file, source) = (absolute(file), absolute(source));
        if file.parent() != source.parent() {
            let why = format!(
                "a candidate is read from the directory of the instance's configuration ({}), not {}",
                source.parent().map_or_else(String::new, |d| d.display().to_string()),
                file.display()
            );
            return Err(Refusal::new(StatusCode::FORBIDDEN, why));
        }
        if !file.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            return Err(Refusal::new(StatusCode::FORBIDDEN, "a candidate is a .yaml or .yml file"));
        }
        if file == source {
            let why = "the candidate is the running configuration's own file: change a copy of it";
            return Err(Refusal::new(StatusCode::CONFLICT, why));
        }
        let unprocessable = |e: LoadError| Refusal::new(StatusCode::UNPROCESSABLE_ENTITY, e.to_string());
        let (name, text) = config::read(&file).map_err(unprocessable)?;
        let mut config = config::parse(&text, &name).map_err(unprocessable)?;
        let source_bytes = std::fs::read(&source).map_err(|e| {
            Refusal::new(
                StatusCode::CONFLICT,
                format!("cannot read the running configuration {}: {e}", source.display()),
            )
        })?;
        if let Some(redis) = &mut config.redis {
            redis.key_prefix.push_str(KEY_PREFIX);
        }
        let mut warnings: Vec<String> = config.warnings.iter().map(ToString::to_string).collect();
        warnings.extend(dropped(&config, enforced));
        let secret = enforced.secret().clone();
        let gate = Gate::keyed(&config, Clock::System, secret);
        if let Some(store) = gate.store() {
            store.watch();
        }
        let diff = Diff::new(metrics);
        Ok(Candidate {
            config,
            gate,
            file,
            text,
            source: (source, source_bytes),
            loaded: SystemTime::now(),
            warnings,
            diff,
        })
    }

    /// Why it may not be promoted now, if it may not: its file or the instance's
    /// changed on disk since it was loaded (promoting would run what nobody watched, or
    /// undo an edit that a reload would have taken).
    pub fn unchanged(&self, running: Option<&Path>) -> Result<(), Refusal> {
        let changed = |what: &str, file: &Path| {
            let why = format!(
                "{what} {} changed on disk since the candidate was loaded: nothing promoted (load the candidate again to watch what would run)",
                file.display()
            );
            Refusal::new(StatusCode::CONFLICT, why)
        };
        if std::fs::read(&self.file).ok().as_deref() != Some(self.text.as_bytes()) {
            return Err(changed("the candidate's file", &self.file));
        }
        let (source, bytes) = &self.source;
        if running.map(absolute).as_deref() != Some(source.as_path()) {
            return Err(changed("the instance's configuration file", source));
        }
        if std::fs::read(source).ok().as_ref() != Some(bytes) {
            return Err(changed("the instance's configuration file", source));
        }
        Ok(())
    }

    /// Its configuration compiled again from the text it was loaded from, to run: its
    /// global limits keep the configured Redis keys.
    pub fn config_again(&self) -> Result<Config, LoadError> {
        config::parse(&self.text, &self.file.display().to_string())
    }

    /// Decides `asked` as the candidate would, beside `enforced`, the enforced
    /// configuration's admission of it; tallies what changes.
    pub async fn judge(
        &self,
        asked: &Asked<'_>,
        enforced_config: &Config,
        enforced_limiters: &Limiters,
        enforced: &Admission<'_>,
    ) -> Judged {
        let mut admitted = admission::admit(
            &self.config,
            &self.gate,
            asked,
            &Way { decide: Decide::Spend, holds: None, drives: None },
        );
        if let (Verdict::Pending, Some(front), Some(cost)) = (&admitted.verdict, &admitted.front, admitted.cost) {
            admitted.verdict = Verdict::Decided(self.gate.decide(&admitted.limits, &front.src, cost).await);
        }
        let enforced = diff::Side { config: enforced_config, limiters: enforced_limiters, admission: enforced };
        let candidate = diff::Side { config: &self.config, limiters: self.gate.limiters(), admission: &admitted };
        let (change, rerouted) = self.diff.tally(&enforced, &candidate);
        let permits = match &mut admitted.verdict {
            Verdict::Decided(crate::gate::Decision::Pass { permits, .. }) => std::mem::take(permits),
            _ => Permits::default(),
        };
        Judged { change, rerouted, permits }
    }

    /// What it changed since it was loaded, in the shape `simulate --compare` reports.
    pub fn report(&self, top: usize) -> Report {
        self.diff.report(self, top)
    }
}

/// The enforced limits that hold keys now and would start fresh were `config` promoted
/// (dropped, or counting differently): said when the candidate is loaded.
fn dropped(config: &Config, enforced: &Limiters) -> Vec<String> {
    // What a promotion would keep, found as it finds it (the tables are only shared).
    let (_, _, fresh) = Limiters::reloaded(config, enforced, None);
    enforced
        .names()
        .filter_map(|(id, name)| {
            let keys = enforced.keys(id);
            if keys == 0 {
                return None;
            }
            if !config.limits.iter().any(|l| l.name == name) {
                Some(format!("limit {name:?} holds {keys} keys now; the candidate drops it: promoting forgets them"))
            } else if fresh.iter().any(|f| f == name) {
                Some(format!(
                    "limit {name:?} holds {keys} keys now; the candidate counts it otherwise (its key, algorithm or windows): promoting starts it fresh"
                ))
            } else {
                None
            }
        })
        .collect()
}

/// `path` made absolute (its links resolved when it exists).
fn absolute(path: &Path) -> PathBuf {
    path.canonicalize().or_else(|_| std::path::absolute(path)).unwrap_or_else(|_| path.to_owned())
}
