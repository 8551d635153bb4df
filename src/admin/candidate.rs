//! The candidate's calls: `POST /candidate?file=PATH` puts a candidate live beside the
//! running configuration (in place of the one there was), `GET /candidate` says what it
//! changed since (JSON in `simulate --compare`'s shape, or `?format=text`), `DELETE
//! /candidate` drops it, `POST /candidate/promote` makes it the running configuration.

use std::path::Path;
use std::sync::Arc;

use http::StatusCode;
use tracing::{info, warn};

use super::{json, text, typed};
use crate::candidate::Candidate;
use crate::proxy::body::Response;
use crate::running::Running;

/// Keys listed each way when the call does not say (`?top=N`).
const TOP: usize = 10;

/// `POST /candidate?file=PATH`.
pub fn load(running: &Running, query: &str) -> Response {
    let Some(file) = param(query, "file") else {
        return text(StatusCode::BAD_REQUEST, "name the candidate's file: POST /candidate?file=PATH\n");
    };
    let proxy = running.proxy();
    match Candidate::load(Path::new(&file), running.source().as_deref(), proxy.limiters(), proxy.metrics()) {
        Ok(candidate) => {
            let mut body = format!(
                "candidate {} live beside {}: every request is decided by both, only the running one acts\n",
                candidate.file.display(),
                running.source().map(|s| s.display().to_string()).unwrap_or_default()
            );
            for warning in &candidate.warnings {
                warn!(file = %candidate.file.display(), "candidate: {warning}");
                body.push_str(&format!("warning: {warning}\n"));
            }
            info!(file = %candidate.file.display(), "candidate live");
            proxy.set_candidate(Some(Arc::new(candidate)));
            typed(StatusCode::OK, "text/plain", body)
        }
        Err(refusal) => typed(refusal.status, "text/plain", format!("no candidate loaded: {}\n", refusal.why)),
    }
}

/// `GET /candidate[?top=N][&format=text]`.
pub fn show(running: &Running, query: &str) -> Response {
    let Some(candidate) = running.proxy().candidate() else { return none() };
    let top = param(query, "top").and_then(|t| t.parse().ok()).unwrap_or(TOP);
    let report = candidate.report(top);
    match param(query, "format").as_deref() {
        Some("text") => typed(StatusCode::OK, "text/plain", report.text()),
        _ => json(StatusCode::OK, &report),
    }
}

/// `DELETE /candidate`: what it changed is said one last time.
pub fn drop(running: &Running) -> Response {
    let proxy = running.proxy();
    let Some(candidate) = proxy.candidate() else { return none() };
    proxy.set_candidate(None);
    proxy.metrics().candidate_cleared();
    info!(file = %candidate.file.display(), "candidate dropped");
    typed(StatusCode::OK, "text/plain", format!("dropped; it had changed:\n{}", candidate.report(TOP).text()))
}

/// `POST /candidate/promote`: refused (`409`) if either file changed since the
/// candidate was loaded; `422` if it cannot run (an address it cannot listen on).
pub async fn promote(running: &Running) -> Response {
    let Some(candidate) = running.proxy().candidate() else { return none() };
    if let Err(refusal) = candidate.unchanged(running.source().as_deref()) {
        return typed(refusal.status, "text/plain", format!("{}\n", refusal.why));
    }
    match running.promote(Arc::clone(&candidate)).await {
        Some(Ok(())) => {
            let body = format!("promoted {}: it is the configuration from now on\n", candidate.file.display());
            typed(StatusCode::OK, "text/plain", body)
        }
        Some(Err(why)) => typed(
            StatusCode::UNPROCESSABLE_ENTITY,
            "text/plain",
            format!("promotion failed; the running configuration and the candidate stay:\n{why}\n"),
        ),
        None => text(StatusCode::SERVICE_UNAVAILABLE, "the server is stopping\n"),
    }
}

fn none() -> Response {
    text(StatusCode::NOT_FOUND, "no candidate is live: POST /candidate?file=PATH puts one\n")
}

fn param(query: &str, name: &str) -> Option<String> {
    form_urlencoded::parse(query.as_bytes()).find(|(n, _)| n == name).map(|(_, v)| v.into_owned())
}
