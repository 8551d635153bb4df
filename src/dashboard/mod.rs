//! The dashboard on the admin listener: one page (`GET /`), its script, style sheet and
//! icon, embedded in the binary (`page/`), which asks `GET /dashboard.json` every second
//! for what changed (`state`) and draws it, sparklines included, in plain JavaScript: no
//! other origin, no library. The page's files hold no data and are served without the
//! admin token, so that a browser can load them before the token is typed; the JSON needs
//! it. A task fills the history it shows once a second from the counters that exist
//! (`history`).

mod history;
mod state;

use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;

use crate::running::Running;
use history::History;

/// What the page may load and where from: its own files and `/dashboard.json`, nothing
/// inline, nothing from another origin, no form sent anywhere, no framing.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const PAGE: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/dashboard.js");
const STYLE: &str = include_str!("page/dashboard.css");
const ICON: &str = include_str!("page/icon.svg");

/// The dashboard of the running instance.
pub struct Dashboard {
    history: Arc<Mutex<History>>,
    /// The page, saying that a token must be typed, and saying that none is needed.
    pages: [Bytes; 2],
}

impl Dashboard {
    /// The dashboard of `running`, whose history is recorded from now on (within a Tokio
    /// runtime).
    pub fn start(running: Arc<Running>) -> Dashboard {
        let page = |token: &str| Bytes::from(PAGE.replace("data-token=\"\"", &format!("data-token=\"{token}\"")));
        Dashboard { history: history::start(running), pages: [page("required"), page("none")] }
    }

    /// The page's file at `path` (its content type and bytes), if it is one. `token`: the
    /// admin API needs one now, so the page asks for it first.
    pub fn file(&self, path: &str, token: bool) -> Option<(&'static str, Bytes)> {
        match path {
            "/" => Some(("text/html; charset=utf-8", self.pages[usize::from(!token)].clone())),
            "/dashboard.js" => Some(("text/javascript; charset=utf-8", Bytes::from_static(SCRIPT.as_bytes()))),
            "/dashboard.css" => Some(("text/css; charset=utf-8", Bytes::from_static(STYLE.as_bytes()))),
            "/icon.svg" => Some(("image/svg+xml", Bytes::from_static(ICON.as_bytes()))),
            _ => None,
        }
    }

    /// `GET /dashboard.json?since=SEQ`: the state as of now, with the seconds of history
    /// after `since` (all of them without it, or with one the page cannot follow on).
    pub fn state(&self, running: &Running, query: &str) -> serde_json::Value {
        let since = form_urlencoded::parse(query.as_bytes())
            .find(|(name, _)| name == "since")
            .and_then(|(_, value)| value.parse().ok());
        let history = self.history.lock().unwrap_or_else(PoisonError::into_inner);
        state::state(running, &history, since)
    }
}
