//! `jwt.jwks_url`: the key set tokens are verified with, fetched by the upstream client
//! (an upstream of its own, `jwt.jwks_url`) at start, every `jwks_refresh`, and soon after
//! a token names a key the set lacks (a rotation), at most once every `MIN_GAP`. A reload
//! that names the same URL and checks keeps the keys and their fetcher: no token waits
//! for a fetch because the file was reloaded.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::config::Config;
use crate::jwt::{RemoteKeys, Verifier};
use crate::metrics::Metrics;
use crate::upstream::UpstreamClient;

/// The shortest time between two fetches: a flood of tokens naming made-up keys asks the
/// key server once in this long, not once a token.
const MIN_GAP: Duration = Duration::from_secs(5);
/// Larger than any key set in use.
const MAX_JWKS_BYTES: usize = 1 << 20;

/// Gives `config`'s verifier the keys of its `jwks_url`: those `old` (the configuration
/// replaced) fetched when it names the same URL with the same checks, else fetched anew.
pub fn start(config: &Config, metrics: &Metrics, old: Option<&Verifier>) {
    let (Some(verifier), Some(source)) = (&config.jwt, &config.jwks) else { return };
    let kept = old.and_then(Verifier::remote).filter(|r| r.url == source.url && r.checks == verifier.checks);
    if let Some(kept) = kept {
        verifier.attach(Arc::clone(kept));
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
    let remote = Arc::new(RemoteKeys::new(&source.url, &verifier.checks));
    verifier.attach(Arc::clone(&remote));
    let client = UpstreamClient::new(&source.upstream, 1, metrics);
    let wanted = Arc::clone(&remote.wanted);
    runtime.spawn(fetch(Arc::downgrade(&remote), wanted, client, source.target.clone(), source.refresh));
}

/// Fetches the key set at `target` into `remote` until it is dropped.
async fn fetch(
    remote: Weak<RemoteKeys>,
    wanted: Arc<Notify>,
    client: UpstreamClient,
    target: String,
    refresh: Duration,
) {
    let mut have_keys = false;
    loop {
        let Some(keys) = remote.upgrade() else { return };
        let got = client.fetch(&target, MAX_JWKS_BYTES).await.and_then(|(status, body)| {
            if !status.is_success() {
                return Err(format!("status {status}"));
            }
            let text = String::from_utf8(body).map_err(|_| "the body is not UTF-8".to_owned())?;
            keys.set(&text)
        });
        let url = keys.url.as_str();
        match &got {
            Ok(count) if !have_keys => info!(url, keys = count, "JWKS fetched"),
            Ok(count) => debug!(url, keys = count, "JWKS fetched again"),
            Err(why) => warn!(url, why, "JWKS fetch failed: tokens are verified with the keys fetched before, if any"),
        }
        have_keys |= got.is_ok();
        drop(keys);
        let fetched = Instant::now();
        let next = if got.is_ok() { refresh } else { MIN_GAP };
        tokio::select! {
            () = tokio::time::sleep(next) => {}
            () = wanted.notified() => tokio::time::sleep_until(fetched + MIN_GAP).await,
        }
    }
}
