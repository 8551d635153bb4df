//! An explanation in plain words, one fact a line, as `sluicegate explain` prints it
//! without `--json`.

use std::fmt::{self, Display, Formatter};

use super::{Explanation, LimitExplained, WindowAfter};
use crate::limit::inspect::KeyState;

/// A time in ms, to the microsecond where it has one (`300 ms`, `1.5 ms`).
fn ms(ms: f64) -> String {
    let rounded = (ms * 1000.0).round() / 1000.0;
    format!("{rounded} ms")
}

/// ` (line N)` where the line is known.
fn at(line: Option<usize>) -> String {
    line.map(|l| format!(" (line {l})")).unwrap_or_default()
}

impl Display for Explanation {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        writeln!(f, "request: {} {}", self.method, self.target)?;
        let host = self.host.as_deref().unwrap_or("none");
        let scheme = &self.scheme;
        match &self.path {
            Some(path) => writeln!(f, "  path {path} (normalized), host {host}, scheme {scheme}")?,
            None => writeln!(f, "  host {host}, scheme {scheme}")?,
        }
        writeln!(f, "  client {}: {}", self.client.address, self.client.how)?;
        for passed in &self.passed_over {
            writeln!(f, "route {}{} not taken: {}", passed.route, at(passed.line), passed.why.join("; "))?;
        }
        if self.passed_over_more > 0 {
            writeln!(f, "({} more routes not taken)", self.passed_over_more)?;
        }
        if let Some(route) = &self.route {
            writeln!(f, "route {}{} taken: {}", route.name, at(route.line), route.action)?;
            if let Some(cost) = self.cost {
                writeln!(f, "  cost {cost}")?;
            }
        }
        if !self.limits.is_empty() {
            match self.state.as_str() {
                "live" => writeln!(f, "limits, from the running instance's state (nothing spent):")?,
                "candidate" => writeln!(f, "limits, from the candidate's own state (nothing spent):")?,
                _ if self.after == 0 => writeln!(f, "limits, from an empty state:")?,
                _ => writeln!(f, "limits, from an empty state after {} identical requests:", self.after)?,
            }
        }
        for limit in &self.limits {
            write!(f, "{limit}")?;
        }
        let answer = &self.answer;
        let status = answer.status.map_or_else(|| "the upstream's status".to_owned(), |s| s.to_string());
        match (&answer.reason, &answer.forwarded_to) {
            (Some(reason), _) => writeln!(f, "answer: {status}: {reason}")?,
            (None, Some(upstream)) if answer.wait_ms > 0.0 => writeln!(
                f,
                "answer: {}: waits {}, then goes to upstream {upstream}",
                answer.outcome,
                ms(answer.wait_ms)
            )?,
            (None, Some(upstream)) => writeln!(f, "answer: {}: goes to upstream {upstream}", answer.outcome)?,
            (None, None) if answer.wait_ms > 0.0 => {
                writeln!(f, "answer: {} {status}, after a wait of {}", answer.outcome, ms(answer.wait_ms))?
            }
            (None, None) => writeln!(f, "answer: {} {status}", answer.outcome)?,
        }
        for (name, value) in &answer.headers {
            writeln!(f, "  {name}: {value}")?;
        }
        if !answer.upstream_headers.is_empty() {
            writeln!(f, "  sent upstream with the request (soft limits):")?;
            for (name, value) in &answer.upstream_headers {
                writeln!(f, "    {name}: {value}")?;
            }
        }
        if let Some(body) = &answer.body {
            writeln!(f, "  body: {}", body.trim_end())?;
        }
        for note in &self.notes {
            writeln!(f, "note: {note}")?;
        }
        if let Some(candidate) = &self.candidate {
            writeln!(f, "\nthe live candidate would decide it (never acting on it):")?;
            write!(f, "{candidate}")?;
        }
        Ok(())
    }
}

impl Display for LimitExplained {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let mut about = vec![self.scope.clone()];
        if self.dry_run {
            about.push("dry run".to_owned());
        }
        if let Some(burst) = self.burst {
            about.push(format!("the route's burst {burst}"));
        }
        writeln!(f, "  {}{} ({}):", self.limit, at(self.line), about.join(", "))?;
        if let Some(by) = &self.decided_by {
            writeln!(f, "    an override hands the request to limit {by}")?;
        }
        match &self.key {
            Some(key) if self.missing.is_empty() => writeln!(f, "    key {key}")?,
            Some(key) if key == "-" => writeln!(
                f,
                "    key missing: {}; counted under the one key of such requests (on_missing_key: shared)",
                self.missing.join(", ")
            )?,
            Some(key) => writeln!(f, "    key {key} (missing: {})", self.missing.join(", "))?,
            None => writeln!(f, "    key missing: {}", self.missing.join(", "))?,
        }
        if let Some(skipped) = &self.skipped {
            return writeln!(f, "    skipped: {skipped}");
        }
        let money = self.money.as_deref();
        if let Some(before) = &self.before {
            write!(f, "{}", Before(before, money))?;
        }
        for window in &self.after {
            writeln!(f, "    after:  {}", After(window, money))?;
        }
        if let Some(row) = &self.priced_as {
            writeln!(f, "    its response is charged at the prices of {row:?}")?;
        }
        if let Some(own) = &self.own_count {
            let clamped = if own.clamped { ", clamped to the limit's bounds" } else { "" };
            writeln!(f, "    its key's own count: {} (from the {}{clamped})", own.count, own.from)?;
        }
        if let Some(outcome) = &self.outcome {
            let verb = match (outcome.as_str(), self.dry_run) {
                ("passed", false) => "passes",
                ("passed", true) => "would pass (dry run)",
                (_, false) => "is",
                (_, true) => "would be (dry run)",
            };
            let mut outcome = if outcome == "passed" { String::new() } else { format!(" {outcome}") };
            // A delay and an annotation, both.
            if self.annotated && outcome == " delayed" {
                outcome.push_str(" and annotated");
            }
            writeln!(f, "    the request {verb}{outcome}")?;
        }
        if let Some(queue) = &self.queue {
            let wait = humantime::format_duration(std::time::Duration::from_secs_f64(queue.max_wait_ms / 1000.0));
            let class = queue.class.as_ref().map_or_else(String::new, |c| format!(", its class {c}"));
            writeln!(
                f,
                "    queue: {} waiting of {} at most, fair by {} (its flow: {}{class}), {wait} at most",
                queue.waiting, queue.max, queue.fair_by, queue.flow
            )?;
            if let Some(position) = queue.position {
                writeln!(
                    f,
                    "    no slot is free: it would wait, {position} in the round, and be refused if none comes in {wait}"
                )?;
            }
        }
        Ok(())
    }
}

struct Before<'a>(&'a KeyState, Option<&'a str>);

/// A count, or micro-units of a money budget's currency as an amount of it.
struct Units<'a>(u64, Option<&'a str>);

impl Display for Units<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self.1 {
            Some(currency) => write!(f, "{} {currency}", crate::policy::charge::Money::amount(self.0)),
            None => write!(f, "{}", self.0),
        }
    }
}

impl Display for Before<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        if let Some(left) = self.0.ban_left_ms {
            writeln!(f, "    before: banned, {} left", ms(left as f64))?;
        }
        // As `GET /limits/NAME` shows the key: what a one-unit request would find.
        for w in &self.0.windows {
            writeln!(f, "    before: {} remaining", Units(w.remaining, self.1))?;
        }
        Ok(())
    }
}

struct After<'a>(&'a WindowAfter, Option<&'a str>);

impl Display for After<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let w = self.0;
        match w.outcome.as_str() {
            "delayed" => write!(f, "delayed {}", ms(w.ms))?,
            "rejected" if w.bans => write!(f, "rejected, and banned for {}", ms(w.ms))?,
            "rejected" => write!(f, "rejected, would pass in {}", ms(w.ms))?,
            other => f.write_str(other)?,
        }
        write!(
            f,
            "; {} remaining, excess {}, full again in {}",
            Units(w.remaining, self.1),
            (w.excess * 1000.0).round() / 1000.0,
            ms(w.reset_ms)
        )
    }
}
