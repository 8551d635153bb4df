//! `/overrides`: the counts the operator gives keys of limits with `limit_from`, without a
//! reload. `PUT /overrides/NAME?PART=VALUE...` with `{"limit": 500}` (an amount on a
//! money budget: `{"limit": "25.50"}`) gives the key its own count, `DELETE` takes it
//! back, `GET /overrides` (or `/overrides/NAME`) lists them. A key is named by its parts
//! as `GET /limits/NAME?...` names it (`/overrides/NAME/VALUE` for a key of one part).
//! A count outside the limit's `[min, max]` is kept as given and clamped when used (a
//! reload may move the bounds), and the answer says what applies. With a `persist:`
//! section they are saved in its directory (`overrides.json`) at each change, and given
//! again at start.

use std::sync::{Arc, Mutex};

use http::StatusCode;
use serde::{Deserialize, Serialize};

use super::key_lookup;
use crate::config::{Config, LimitId};
use crate::limit::tenant::Given;
use crate::persist;
use crate::policy::charge::Money;
use crate::policy::tenant::{Fit, TenantFrom, amount};
use crate::proxy::Proxy;
use crate::proxy::body::Response;

/// At most this many bytes of a `PUT`'s body: `{"limit": "17592186.044415"}` and room.
pub const MAX_BODY_BYTES: usize = 1024;

/// At most this many keys of one limit have a count of their own, each named in at most
/// `MAX_PARTS_BYTES`: what is given must fit the file it is saved in when read back
/// (`persist::MAX_OVERRIDES_BYTES`), or a restart would lose it all.
const MAX_GIVEN: usize = 100_000;
const MAX_PARTS_BYTES: usize = 256;

/// One saved count, as `overrides.json` keeps it.
#[derive(Debug, Serialize, Deserialize)]
struct Saved {
    limit: String,
    parts: String,
    count: u64,
}

#[derive(Serialize, Deserialize)]
struct SavedFile {
    overrides: Vec<Saved>,
}

/// Saves are made one at a time, each of every count given then.
static SAVING: Mutex<()> = Mutex::new(());

/// `GET /overrides` (`name`: of one limit).
pub fn list(proxy: &Proxy, name: Option<&str>) -> Response {
    let config = proxy.config();
    let mut all = serde_json::Map::new();
    for (id, limit) in config.limits.iter_enumerated() {
        let (Some(from), Some(set)) = (&limit.tenant, proxy.limiters().tenants(id)) else { continue };
        if name.is_some_and(|n| n != limit.name) {
            continue;
        }
        let shown: Vec<serde_json::Value> = set.list().into_iter().map(|g| shown(from, &g)).collect();
        all.insert(limit.name.clone(), shown.into());
    }
    match name {
        Some(n) if !all.contains_key(n) => no_tenant(config, n),
        Some(n) => super::json(StatusCode::OK, &all[n]),
        None => super::json(StatusCode::OK, &all),
    }
}

/// A count given, as the answers show it: as given, what applies, and whether it was
/// clamped; amounts on a money budget.
fn shown(from: &TenantFrom, given: &Given) -> serde_json::Value {
    let fit = from.fit(given.count);
    let write = |n: u64| -> serde_json::Value { if from.money { Money::amount(n).into() } else { n.into() } };
    serde_json::json!({
        "key": given.key,
        "parts": given.parts,
        "limit": write(given.count),
        "applies": write(fit.count()),
        "clamped": matches!(fit, Fit::Clamped(_)),
    })
}

fn no_tenant(config: &Config, name: &str) -> Response {
    match config.limits.iter().any(|l| l.name == name) {
        true => super::typed(
            StatusCode::CONFLICT,
            "text/plain",
            format!("limit {name:?} has no `limit_from`: its keys cannot have counts of their own\n"),
        ),
        false => super::text(StatusCode::NOT_FOUND, "no such limit\n"),
    }
}

/// The parts of a key named in the path (`/overrides/NAME/VALUE`, a key of one part) or
/// the query, written one way (`header:x-api-key=acme`: each part as the key writes it,
/// its value percent-encoded as a query's), whichever way they were given.
fn parts(config: &Config, name: &str, value: Option<&str>, query: &str) -> Result<String, Box<Response>> {
    let written = |pairs: &mut dyn Iterator<Item = (String, String)>| -> String {
        let each = pairs.map(|(part, value)| {
            format!("{part}={}", form_urlencoded::byte_serialize(value.as_bytes()).collect::<String>())
        });
        each.collect::<Vec<_>>().join("&")
    };
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return Ok(written(
            &mut form_urlencoded::parse(query.as_bytes()).map(|(p, v)| (p.into_owned(), v.into_owned())),
        ));
    };
    let limit = config.limits.iter().find(|l| l.name == name).ok_or_else(|| Box::new(no_tenant(config, name)))?;
    match &limit.key.0[..] {
        [part] => {
            let value = percent_encoding::percent_decode_str(value).decode_utf8_lossy().into_owned();
            Ok(written(&mut std::iter::once((part.to_string(), value))))
        }
        _ => Err(Box::new(super::typed(
            StatusCode::BAD_REQUEST,
            "text/plain",
            format!(
                "limit {name:?} is keyed by several parts: name its key by them, /overrides/{name}?PART=VALUE&...\n"
            ),
        ))),
    }
}

/// `PUT /overrides/NAME...` with `body`, or its `DELETE` (`body`: `None`); answered once
/// what is given is saved (`persist:`), the file written on a blocking thread.
pub async fn change(proxy: &Arc<Proxy>, name: &str, value: Option<&str>, query: &str, body: Option<&[u8]>) -> Response {
    let config = proxy.config();
    let limit = config.limits.position(|l| l.name == name);
    let Some((id, from)) = limit.and_then(|id| Some((id, config.limits[id].tenant.as_ref()?))) else {
        return no_tenant(config, name);
    };
    let parts = match parts(config, name, value, query) {
        Ok(parts) => parts,
        Err(refused) => return *refused,
    };
    if parts.len() > MAX_PARTS_BYTES {
        let why = format!("a key named in more than {MAX_PARTS_BYTES} bytes cannot be given a count\n");
        return super::typed(StatusCode::BAD_REQUEST, "text/plain", why);
    }
    let count = match body.map(|b| asked_count(from, b)) {
        None => None,
        Some(Ok(count)) => Some(count),
        Some(Err(why)) => return super::typed(StatusCode::BAD_REQUEST, "text/plain", format!("{why}\n")),
    };
    let answer = key_lookup::with_key(proxy, name, &parts, |_, src| {
        let limiters = proxy.limiters();
        let (Some(key), Some(set)) = (limiters.key_found(id, src).0, limiters.tenants(id)) else {
            return super::text(StatusCode::BAD_REQUEST, "the values given make no key\n");
        };
        match count {
            Some(_) if set.given_keys() >= MAX_GIVEN && set.given(key).is_none() => super::typed(
                StatusCode::INSUFFICIENT_STORAGE,
                "text/plain",
                format!("{MAX_GIVEN} keys of limit {name:?} have counts of their own already: take some back first\n"),
            ),
            Some(count) => {
                let given = Given { key: limiters.key_label(id, src), parts: parts.clone(), count };
                let shown = shown(from, &given);
                set.give(key, given);
                super::json(StatusCode::OK, &shown)
            }
            None if set.take_back(key) => super::text(StatusCode::NO_CONTENT, ""),
            None => super::text(StatusCode::NOT_FOUND, "this key has no count of its own\n"),
        }
    });
    if answer.status.is_success() && config.persist.given {
        let proxy = Arc::clone(proxy);
        if let Err(e) = tokio::task::spawn_blocking(move || save(&proxy)).await {
            tracing::error!(error = %e, "the counts given keys were not saved");
        }
    }
    answer
}

/// The count a `PUT`'s body asks for: `{"limit": N}`, or an amount (a number or a string,
/// at most six decimals) on a money budget.
fn asked_count(from: &TenantFrom, body: &[u8]) -> Result<u64, String> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Asked {
        limit: serde_json::Value,
    }
    let asked: Asked = serde_json::from_slice(body).map_err(|e| format!("the body is {{\"limit\": N}}: {e}"))?;
    let count = match (&asked.limit, from.money) {
        (serde_json::Value::Number(n), false) => n.as_u64(),
        (serde_json::Value::Number(n), true) => amount(&n.to_string()),
        (serde_json::Value::String(text), true) => amount(text),
        _ => None,
    };
    let what = if from.money { "an amount of money (at most six decimals)" } else { "a whole number" };
    match count {
        Some(0) | None => Err(format!("limit: {} is not {what} above 0", asked.limit)),
        Some(count) => Ok(count),
    }
}

/// Saves every count given now (the file keeps them: `persist:`), one save at a time, so
/// that the last written holds the last given; a failure is logged, and the counts hold
/// in memory.
fn save(proxy: &Proxy) {
    let config = proxy.config();
    let _one = SAVING.lock().unwrap_or_else(|p| p.into_inner());
    let overrides = config
        .limits
        .iter_enumerated()
        .filter_map(|(id, l)| Some((l, proxy.limiters().tenants(id)?)))
        .flat_map(|(l, set)| {
            set.list().into_iter().map(|g| Saved { limit: l.name.clone(), parts: g.parts, count: g.count })
        })
        .collect();
    let bytes = serde_json::to_vec_pretty(&SavedFile { overrides }).unwrap_or_default();
    if let Err(why) = persist::save_overrides(config, &bytes) {
        tracing::error!("the counts given keys were not saved: {why}; they hold until the process ends");
    }
}

/// Gives again the counts saved (at start): each whose limit still has `limit_from` and
/// whose parts still name its key; what is left out is logged.
pub fn restore(proxy: &Proxy) {
    let Some(bytes) = persist::read_overrides(proxy.config()) else { return };
    let saved: SavedFile = match serde_json::from_slice(&bytes) {
        Ok(saved) => saved,
        Err(e) => {
            tracing::warn!("overrides file unreadable: {e}; no key starts with its own count");
            return;
        }
    };
    let (mut given, mut left) = (0, 0);
    for s in saved.overrides {
        let id: Option<LimitId> = proxy.config().limits.position(|l| l.name == s.limit);
        let Some(set) = id.and_then(|id| proxy.limiters().tenants(id)) else {
            left += 1;
            continue;
        };
        let answer = key_lookup::with_key(proxy, &s.limit, &s.parts, |id, src| {
            let Some(key) = proxy.limiters().key_found(id, src).0 else {
                return super::text(StatusCode::BAD_REQUEST, "");
            };
            set.give(key, Given { key: proxy.limiters().key_label(id, src), parts: s.parts.clone(), count: s.count });
            super::text(StatusCode::OK, "")
        });
        if answer.status.is_success() { given += 1 } else { left += 1 }
    }
    tracing::info!(
        given,
        left_out = left,
        "counts given keys restored (limits without `limit_from`, or keyed otherwise now, left out)"
    );
}
