//! One limit of the file -> `Limit`: its key, its algorithm and that algorithm's fields,
//! windows, bans, allow-list, counted statuses and overrides, every error positioned.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue};

use super::calendar;
use super::checks::{Errors, allow, check_name, key_parts, positive_duration, status_in, unknown_name};
use super::raw::{
    AlgorithmName, RawAdaptive, RawAmount, RawConcurrency, RawLimit, RawPrices, RawQueueClass, RawReading, RawWindow,
};
use super::store::scope;
use super::units::parse_rate;
use super::{Ban, BodyPiece, Limit, LimitAction, LimitId, LimitResponse, LogLevel, Policy, Rate};
use crate::grpc::Code;
use crate::policy::allow::Allow;
use crate::policy::charge::{Charge, MAX_BUDGET, MAX_UNITS, MICROS, Money, Prices, Reading, Weighted};
use crate::policy::key::{ClaimPath, DEFAULT_IP_PREFIX, KeyPart, KeySpec};
use crate::policy::tenant::TenantFrom;
use crate::policy::{QueueClass, Scope, Window};

/// `Retry-After` of a concurrency rejection unless the limit says otherwise.
const DEFAULT_CONCURRENCY_RETRY_AFTER: Duration = Duration::from_secs(1);
/// Keys a local limit remembers before it evicts; about 4 MB at this size.
const DEFAULT_MAX_KEYS: u64 = 100_000;

/// A flood of rejections writes a few lines a second per limit, then one summary.
const DEFAULT_LOG_LINES_PER_SECOND: u32 = 5;

pub(super) fn limit(e: &mut Errors<'_>, name: &str, raw: &RawLimit, all: &BTreeMap<String, RawLimit>) -> Limit {
    let at = format!("limits.{name}");
    check_name(e, &at, name);
    let errors_before = e.list.len();
    let parts = key_parts(e, &format!("{at}.key"), &raw.key);
    let key_read = e.list.len() == errors_before;
    let parts = ip_prefix(e, &at, raw, parts);
    let policy = policy(e, &at, raw);
    let charge = charge(e, &at, raw, policy.as_deref().unwrap_or_default());
    let own_status = raw.response.as_ref().and_then(|r| r.status);
    if own_status.is_some() && raw.status.is_some() {
        e.add(format!("{at}.response.status"), "give the refusal's status once: `status` or `response.status`");
    }
    let status_at = if own_status.is_some() { "response.status" } else { "status" };
    let status = status_in(e, || format!("{at}.{status_at}"), own_status.or(raw.status).unwrap_or(429), 400..=599);
    if raw.max_keys == Some(0) {
        e.add(format!("{at}.max_keys"), "must be a positive integer");
    }
    let scope = scope(e, &at, raw, policy.as_deref().unwrap_or_default());
    let key = KeySpec(parts.into());
    if raw.on_invalid_token.is_some() && !key.0.iter().any(|p| matches!(p, KeyPart::Jwt(_))) {
        e.add(format!("{at}.on_invalid_token"), "applies to a limit keyed on a token's claims (`jwt:CLAIM`) only");
    }
    // A client escapes a limit by leaving its key out unless the file says what such a
    // request meets: refused here rather than defaulted, so no limit is off unawares.
    if key_read && raw.on_missing_key.is_none() && key.may_be_missing() && !key.0.is_empty() {
        let parts: Vec<String> = key.0.iter().map(ToString::to_string).collect();
        e.add(
            format!("{at}.key"),
            format!(
                "a client can leave out {}: say what such a request meets, `on_missing_key: refuse` (400), \
                 `shared` (counted under one key) or `skip` (not counted, as nginx does)",
                parts.join(" and ")
            ),
        );
    }
    let money = money(e, &at, raw, policy.as_deref().unwrap_or_default(), charge.as_ref());
    let persist = raw.persist.unwrap_or(false);
    if persist {
        let windows = policy.as_deref().unwrap_or_default();
        if matches!(scope, Scope::Global { .. }) {
            e.add(format!("{at}.persist"), "global limits already live in Redis: persist applies to local limits");
        } else if windows.iter().any(|p| matches!(p, Policy::Concurrency { .. })) {
            e.add(
                format!("{at}.persist"),
                "a concurrency limit counts requests in flight, which end with the process: it has nothing to persist",
            );
        }
    }
    let tenant = tenant(e, &at, raw, policy.as_deref().unwrap_or_default());
    Limit {
        name: name.to_owned(),
        queue: queue(e, &at, raw, policy.as_deref().unwrap_or_default()),
        key,
        // A placeholder only where an error is already recorded: then no Config is built.
        windows: policy.unwrap_or_default(),
        status,
        grpc_status: grpc_status(e, &at, raw),
        max_keys: usize::try_from(raw.max_keys.unwrap_or(DEFAULT_MAX_KEYS)).unwrap_or(usize::MAX),
        dry_run: raw.dry_run.unwrap_or(false),
        headers: raw.headers.unwrap_or_default(),
        action: action(e, &at, raw),
        annotate_from: annotate_from(e, &at, raw),
        persist,
        log_level: raw.log_level.unwrap_or(LogLevel::Info),
        log_lines_per_second: raw.log_lines_per_second.unwrap_or(DEFAULT_LOG_LINES_PER_SECOND),
        ban: ban(e, &at, raw),
        allow: allow(e, &format!("{at}.allow"), raw.allow.as_ref()),
        count: count(e, &at, raw),
        charge,
        money,
        overrides: overrides(e, &at, name, raw, all),
        scope,
        on_missing_key: raw.on_missing_key.unwrap_or_default(),
        on_invalid_token: raw.on_invalid_token.unwrap_or_default(),
        response: response(e, &at, raw, status),
        tenant,
    }
}

/// Requests a queue holds unless it says otherwise.
const DEFAULT_QUEUE_MAX: u64 = 100;
/// The most a queue holds: each waiting request holds its connection's state meanwhile.
const MOST_QUEUED: u64 = 1_000_000;
/// The most classes a queue has.
const MOST_CLASSES: usize = 16;
/// How long a request waits in a queue unless it says otherwise.
const DEFAULT_QUEUE_WAIT: Duration = Duration::from_secs(2);

/// `queue:`, on a concurrency limit that refuses without banning: its bound, its
/// wait and the flows it serves in turn (the client's address unless it says otherwise).
fn queue(e: &mut Errors<'_>, at: &str, raw: &RawLimit, windows: &[Policy]) -> Option<crate::policy::Queue> {
    let queue = raw.queue.as_ref()?;
    let at = format!("{at}.queue");
    match windows {
        [Policy::Concurrency { .. }] | [] => {}
        _ => e.add(
            at.clone(),
            "applies to concurrency limits (a request waits for a slot; a rate limit delays with `burst`, as nginx does)",
        ),
    }
    if raw.ban.is_some() {
        e.add(at.clone(), "a limit that bans refuses at once: give either `ban` or `queue`");
    }
    if raw.action == Some(LimitAction::Annotate) {
        e.add(at.clone(), "a limit with `action: annotate` refuses nothing, so nothing waits for it");
    }
    let max = queue.max.unwrap_or(DEFAULT_QUEUE_MAX);
    if !(1..=MOST_QUEUED).contains(&max) {
        e.add(format!("{at}.max"), format!("must be from 1 to {MOST_QUEUED}"));
    }
    let max_wait = e.positive(&format!("{at}.max_wait"), queue.max_wait.as_ref(), DEFAULT_QUEUE_WAIT);
    let fair_by = match &queue.fair_by {
        Some(raw) => {
            let parts = key_parts(e, &format!("{at}.fair_by"), raw);
            if parts.iter().any(|p| matches!(p, KeyPart::Json(_))) {
                e.add(format!("{at}.fair_by"), "a flow is told apart by the request's head, not its body (`json:`)");
            }
            KeySpec(parts.into())
        }
        None => KeySpec([KeyPart::Ip(DEFAULT_IP_PREFIX)].into()),
    };
    let classes = classes(e, &at, queue.classes.as_deref().unwrap_or_default());
    Some(crate::policy::Queue { max: usize::try_from(max).unwrap_or(usize::MAX), max_wait, fair_by, classes })
}

/// A queue's `classes`, highest first: named once each, each but the last with a `match`
/// (the last takes every request no other admits).
fn classes(e: &mut Errors<'_>, at: &str, raw: &[RawQueueClass]) -> Box<[QueueClass]> {
    if raw.len() == 1 {
        e.add(format!("{at}.classes"), "needs two classes at least (one class is every request: leave it out)");
    }
    if raw.len() > MOST_CLASSES {
        e.add(format!("{at}.classes"), format!("{MOST_CLASSES} classes at most"));
    }
    let mut classes: Vec<QueueClass> = Vec::new();
    for (i, class) in raw.iter().enumerate() {
        let here = format!("{at}.classes[{i}]");
        check_name(e, &format!("{here}.name"), &class.name);
        if classes.iter().any(|c| c.name == class.name) {
            e.add(format!("{here}.name"), format!("class {:?} is named twice", class.name));
        }
        let last = i + 1 == raw.len();
        if class.matcher.is_none() && !last {
            e.add(
                here.clone(),
                "needs a `match` (only the last class may go without: it takes every request no class admits)",
            );
        }
        let matcher = allow(e, &format!("{here}.match"), class.matcher.as_ref());
        let share = class.share.as_deref().and_then(|text| {
            let percent = text.trim().strip_suffix('%').and_then(|n| n.trim().parse::<u8>().ok());
            let percent = percent.filter(|n| (1..=100).contains(n));
            e.check(|| format!("{here}.share"), percent.ok_or_else(|| format!("{text:?}: a share from 1% to 100%")))
        });
        classes.push(QueueClass { name: class.name.clone(), matcher, share: share.unwrap_or(0) });
    }
    let shared: u32 = classes.iter().map(|c| u32::from(c.share)).sum();
    if shared > 100 {
        e.add(format!("{at}.classes"), format!("the classes' shares add up to {shared}%: 100% at most"));
    }
    classes.into()
}

/// `limit_from:`: the bounds (amounts on a money budget) and the source, on a limit of
/// one window whose count a number says.
fn tenant(e: &mut Errors<'_>, at: &str, raw: &RawLimit, windows: &[Policy]) -> Option<TenantFrom> {
    let from = raw.limit_from.as_ref()?;
    let at = format!("{at}.limit_from");
    let money = raw.money.is_some();
    let largest = match windows {
        [Policy::FixedWindow { .. }] if money => MAX_BUDGET,
        [Policy::FixedWindow { .. }] => MAX_WINDOW_LIMIT,
        [Policy::SlidingLog { .. }] => MAX_LOG_LIMIT,
        [Policy::SlidingWindow { .. }] => u64::from(u32::MAX),
        [Policy::Rate { .. }] if raw.algorithm == Some(AlgorithmName::MinInterval) => {
            e.add(at, "a minimum interval has no count for a key to have its own of (give a rate: algorithm gcra)");
            return None;
        }
        [Policy::Rate { .. } | Policy::Concurrency { .. }] => u64::MAX,
        [] => return None,
        _ => {
            e.add(at, "applies to a limit of one window (its count is one number), not to several (`rates`)");
            return None;
        }
    };
    let source = match (&from.header, &from.jwt) {
        (Some(_), Some(_)) => {
            e.add(at.clone(), "give one of `header` and `jwt`, or neither (counts set only by `PUT /overrides`)");
            None
        }
        (Some(name), None) => e.check(|| format!("{at}.header"), format!("header:{name}").parse::<KeyPart>()),
        (None, Some(claim)) => e.check(|| format!("{at}.jwt"), format!("jwt:{claim}").parse::<KeyPart>()),
        (None, None) => None,
    };
    let Some(max) = from.max else {
        e.add(at, "needs `max`: the largest count a key may be given (e.g. max: 1000)");
        return None;
    };
    let max = amount_in(e, &format!("{at}.max"), max, money)?;
    let min = match from.min {
        Some(min) => amount_in(e, &format!("{at}.min"), min, money)?,
        None => 1,
    };
    if min == 0 {
        e.add(format!("{at}.min"), "must be more than 0: a key without room is a ban (`ban:`), not a limit");
    } else if max < min {
        e.add(format!("{at}.max"), "must be at least `min`");
    } else if max > largest {
        let largest = if money { Money::amount(largest) } else { largest.to_string() };
        e.add(format!("{at}.max"), format!("must be at most {largest}, the most this limit's algorithm counts"));
    }
    Some(TenantFrom { source, min, max, money })
}

/// `money:`: the currency a budget counts, on a fixed window of the calendar spent by
/// what its responses cost.
fn money(e: &mut Errors<'_>, at: &str, raw: &RawLimit, windows: &[Policy], charge: Option<&Charge>) -> Option<Money> {
    let currency = raw.money.as_ref()?;
    let at_money = format!("{at}.money");
    if currency.is_empty() || currency.len() > 16 || !currency.bytes().all(|b| b.is_ascii_alphanumeric()) {
        e.add(at_money.clone(), "the currency's name: letters and digits, at most 16 (e.g. USD, EUR, credits)");
    }
    let calendar = matches!(windows, [Policy::FixedWindow { window: Window::Calendar(_), .. }]);
    if !windows.is_empty() && !calendar {
        e.add(
            at_money,
            "a money budget is a fixed window of the calendar: `algorithm: fixed_window, window: { calendar: month }` \
             (or day, week)",
        );
    } else if charge.is_none() {
        e.add(
            at_money,
            "a money budget is spent by what responses cost: give `charge` (with `prices`, or a place that reports \
             micro-units)",
        );
    }
    Some(Money { currency: currency.as_str().into() })
}

/// `charge:`: exactly one place the response reports its cost in, on a limit whose state
/// can carry a debt (the leaky-bucket family and fixed windows: a debt is a later
/// drain, or a count past the window's limit carried into the next window).
fn charge(e: &mut Errors<'_>, at: &str, raw: &RawLimit, windows: &[Policy]) -> Option<Charge> {
    let raw_charge = raw.charge.as_ref()?;
    let at = format!("{at}.charge");
    let chargeable = |p: &Policy| matches!(p, Policy::Rate { .. } | Policy::FixedWindow { .. });
    if let Some(other) = windows.iter().find(|p| !chargeable(p)) {
        let what = match other {
            Policy::Concurrency { .. } => "a concurrency limit counts requests in progress, not units",
            _ => "a sliding window weighs its windows by elapsed time, so a debt has no defined end",
        };
        e.add(at.clone(), format!("applies to rate, gcra, token_bucket, interval and fixed_window limits: {what}"));
    }
    let field = |text: &str| HeaderName::from_str(text).map_err(|_| format!("invalid field name {text:?}"));
    let path = |text: &str| match text.parse::<ClaimPath>() {
        Ok(p) if !text.is_empty() => Ok(p),
        _ => Err(format!("{text:?}: a JSON path of names separated by dots, e.g. usage.total_tokens")),
    };
    let c = raw_charge;
    let reading = match (&c.header, &c.trailer, &c.sse_json, &c.json) {
        (Some(names), None, None, None) => Reading::Header(weighted(e, &format!("{at}.header"), names, field)?),
        (None, Some(names), None, None) => Reading::Trailer(weighted(e, &format!("{at}.trailer"), names, field)?),
        (None, None, Some(paths), None) => Reading::SseJson(weighted(e, &format!("{at}.sse_json"), paths, path)?),
        (None, None, None, Some(paths)) => Reading::Json(weighted(e, &format!("{at}.json"), paths, path)?),
        _ => {
            e.add(at, "give one place the response reports its cost in: `header`, `trailer`, `sse_json` or `json`");
            return None;
        }
    };
    let money = raw.money.is_some();
    let default = match raw_charge.default {
        Some(amount) => amount_in(e, &format!("{at}.default"), amount, money).unwrap_or(0),
        None => 0,
    };
    if raw_charge.default.is_none() && !matches!(reading, Reading::Header(_)) {
        let place = match reading {
            Reading::Trailer(_) => "trailer",
            Reading::SseJson(_) => "last event",
            _ => "body",
        };
        e.warn(
            format!("{at}.default"),
            format!(
                "not given: a client that hangs up before the response's {place} reports the cost is charged \
                 nothing (default 0); set `default` to what a response costs when it does not say"
            ),
        );
    }
    if default > MAX_UNITS {
        let most = if money { Money::amount(MAX_UNITS) } else { format!("{MAX_UNITS} units") };
        e.add(format!("{at}.default"), format!("at most {most}"));
    }
    let prices = raw_charge.prices.as_ref().and_then(|p| prices(e, &at, p, &reading, money));
    Some(Charge {
        reading,
        default,
        // A budget's charge is what the response cost, the request's own micro-unit
        // only what let it in.
        instead_of_cost: raw_charge.instead_of_cost.unwrap_or(money),
        prices: prices.map(Arc::new),
    })
}

/// `charge.prices`: a price for each place of `reading` in every row, the row `"*"`
/// given, on a money budget.
fn prices(e: &mut Errors<'_>, at: &str, raw: &RawPrices, reading: &Reading, money: bool) -> Option<Prices> {
    let at = format!("{at}.prices");
    if !money {
        e.add(at, "prices are money: give the limit the currency it counts, e.g. `money: USD`");
        return None;
    }
    if reading.weights().iter().any(|&w| w != 1) {
        e.add(at.clone(), "the table prices each place: name the places without weights, e.g. `sse_json: [usage.prompt_tokens, usage.completion_tokens]`");
    }
    let by = e.check(|| format!("{at}.by"), raw.by.parse::<KeyPart>());
    let per = raw.per.unwrap_or(MICROS);
    if per == 0 {
        e.add(format!("{at}.per"), "must be a positive integer (the units each price is for)");
    }
    let places = reading.places();
    let mut row = |value: &str, prices: &BTreeMap<String, RawAmount>| -> Option<Box<[u64]>> {
        let at = format!("{at}.table.{value}");
        for place in prices.keys().filter(|p| !places.contains(p)) {
            e.add(format!("{at}.{place}"), format!("not a place the charge reads ({})", places.join(", ")));
        }
        let row: Vec<Option<u64>> = (places.iter())
            .map(|place| match prices.get(place) {
                Some(&price) => amount_in(e, &format!("{at}.{place}"), price, true),
                None => {
                    e.add(at.clone(), format!("give the price of {place}"));
                    None
                }
            })
            .collect();
        row.into_iter().collect()
    };
    let mut rows = Vec::new();
    for (value, prices) in raw.table.iter().filter(|(value, _)| *value != "*") {
        rows.extend(row(value, prices).map(|row| (value.as_bytes().into(), row)));
    }
    let other = match raw.table.get("*") {
        Some(prices) => row("*", prices),
        None => {
            e.add(
                format!("{at}.table"),
                "give a row \"*\": the prices of any other value, and of a request without one",
            );
            None
        }
    };
    if rows.len() >= usize::from(u16::MAX) {
        e.add(format!("{at}.table"), format!("at most {} rows", u16::MAX - 1));
    }
    Some(Prices { by: by?, per, rows: rows.into(), other: other? })
}

/// An amount at `at`: on a money budget, micro-units of its money (at most six decimals);
/// elsewhere a whole number.
fn amount_in(e: &mut Errors<'_>, at: &str, amount: RawAmount, money: bool) -> Option<u64> {
    match (amount, money) {
        (RawAmount::Whole(n), false) => Some(n),
        (RawAmount::Decimal(_), false) => {
            e.add(at.to_owned(), "a whole number (an amount with decimals is money: give the limit `money:`)");
            None
        }
        (RawAmount::Whole(n), true) => {
            let micros = n.checked_mul(MICROS);
            if micros.is_none() {
                e.add(at.to_owned(), "too large an amount");
            }
            micros
        }
        (RawAmount::Decimal(x), true) => {
            let micros = x * MICROS as f64;
            let whole = micros.round();
            if !(0.0..=u64::MAX as f64 / 2.0).contains(&whole) || (micros - whole).abs() > 1e-3 {
                e.add(at.to_owned(), "an amount of money: not negative, at most six decimals (a micro-unit)");
                return None;
            }
            Some(whole as u64)
        }
    }
}

/// The places of a `charge` reading at `at` (one, of weight 1, or several with their
/// weights), each read by `parse`.
fn weighted<T>(
    e: &mut Errors<'_>,
    at: &str,
    raw: &RawReading,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Option<Weighted<T>> {
    match raw {
        RawReading::One(text) => Some([(e.check(|| at.to_owned(), parse(text))?, 1)].into()),
        RawReading::List(list) if list.is_empty() => {
            e.add(at.to_owned(), "name at least one place");
            None
        }
        RawReading::List(list) => {
            let places: Vec<_> = (list.iter().enumerate())
                .filter_map(|(i, text)| Some((e.check(|| format!("{at}[{i}]"), parse(text))?, 1)))
                .collect();
            (places.len() == list.len()).then(|| places.into())
        }
        RawReading::Weighted(weights) if weights.is_empty() => {
            e.add(at.to_owned(), "name at least one place, each with its weight");
            None
        }
        RawReading::Weighted(weights) => {
            let mut places = Vec::with_capacity(weights.len());
            for (text, &weight) in weights {
                let place = e.check(|| format!("{at}.{text}"), parse(text));
                if weight == 0 || weight > MAX_UNITS {
                    e.add(format!("{at}.{text}"), format!("a weight is a whole number from 1 to {MAX_UNITS}"));
                }
                places.extend(place.map(|place| (place, weight)));
            }
            (places.len() == weights.len()).then(|| places.into())
        }
    }
}

/// A refusal body's largest size.
const MAX_RESPONSE_BODY: usize = 64 * 1024;

/// Fields a limit's refusal may not set: sluicegate frames the response and writes its
/// `Retry-After` and rate-limit fields itself; `content_type` says the content type.
const SET_HERE: &[&str] = &[
    "content-length",
    "transfer-encoding",
    "connection",
    "content-type",
    "retry-after",
    "ratelimit",
    "ratelimit-policy",
    "ratelimit-limit",
    "ratelimit-remaining",
    "ratelimit-reset",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
];

/// `response:`, the limit's own refusal: its body (by default the status's reason, as
/// `rejection_body: text` writes it) with `{limit}` and `{retry_after}` written in, its
/// content type (default `text/plain; charset=utf-8`) and extra fields.
fn response(e: &mut Errors<'_>, at: &str, raw: &RawLimit, status: http::StatusCode) -> Option<LimitResponse> {
    let raw = raw.response.as_ref()?;
    let at = format!("{at}.response");
    let body = match &raw.body {
        Some(body) if body.len() > MAX_RESPONSE_BODY => {
            e.add(
                format!("{at}.body"),
                format!("{} bytes, more than the {MAX_RESPONSE_BODY} a refusal may have", body.len()),
            );
            Vec::new()
        }
        Some(body) => body_pieces(body),
        None => vec![BodyPiece::Text(format!("{}\n", status.canonical_reason().unwrap_or("Rejected")))],
    };
    let content_type = raw.content_type.as_deref().unwrap_or("text/plain; charset=utf-8");
    let content_type = e
        .check(
            || format!("{at}.content_type"),
            HeaderValue::from_str(content_type).map_err(|_| format!("{content_type:?} is no valid field value")),
        )
        .unwrap_or(HeaderValue::from_static("text/plain"));
    let mut headers = Vec::new();
    for (name, value) in &raw.headers {
        let here = format!("{at}.headers.{name}");
        let Ok(parsed) = HeaderName::from_str(name) else {
            e.add(here, format!("invalid header name {name:?}"));
            continue;
        };
        if SET_HERE.contains(&parsed.as_str()) {
            e.add(here, "sluicegate writes this field of a refusal itself (the content type: `content_type`)");
            continue;
        }
        match HeaderValue::from_str(value) {
            Ok(value) => headers.push((parsed, value)),
            Err(_) => e.add(here, format!("{value:?} is no valid field value")),
        }
    }
    Some(LimitResponse { body, content_type, headers })
}

/// `body` in pieces: `{limit}` and `{retry_after}` where they are written, the rest as
/// text (any other brace is text: a JSON body keeps its own).
fn body_pieces(body: &str) -> Vec<BodyPiece> {
    let mut pieces = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let next = [("{limit}", BodyPiece::Limit), ("{retry_after}", BodyPiece::RetryAfter)]
            .into_iter()
            .filter_map(|(mark, piece)| rest.find(mark).map(|at| (at, mark.len(), piece)))
            .min_by_key(|&(at, _, _)| at);
        let Some((at, len, piece)) = next else {
            pieces.push(BodyPiece::Text(rest.to_owned()));
            break;
        };
        if at > 0 {
            pieces.push(BodyPiece::Text(rest[..at].to_owned()));
        }
        pieces.push(piece);
        rest = &rest[at + len..];
    }
    pieces
}

/// The gRPC status of the limit's rejections of gRPC calls: a code's name
/// (`RESOURCE_EXHAUSTED`, the default), never `OK`.
fn grpc_status(e: &mut Errors<'_>, at: &str, raw: &RawLimit) -> Code {
    let Some(given) = raw.grpc_status.as_deref() else { return Code::RESOURCE_EXHAUSTED };
    let code = Code::named(given).filter(|&c| c != Code::OK).ok_or_else(|| {
        format!("must name a gRPC status other than OK (RESOURCE_EXHAUSTED, UNAVAILABLE, ...), not {given:?}")
    });
    e.check(|| format!("{at}.grpc_status"), code).unwrap_or(Code::RESOURCE_EXHAUSTED)
}

/// Applies the limit's `ipv4_prefix` / `ipv6_prefix` to its `ip` key parts.
fn ip_prefix(e: &mut Errors<'_>, at: &str, raw: &RawLimit, mut parts: Vec<KeyPart>) -> Vec<KeyPart> {
    let mut prefix = DEFAULT_IP_PREFIX;
    for (field, given, max, slot) in
        [("ipv4_prefix", raw.ipv4_prefix, 32, &mut prefix.v4), ("ipv6_prefix", raw.ipv6_prefix, 128, &mut prefix.v6)]
    {
        match given {
            Some(len) if len > max => e.add(format!("{at}.{field}"), format!("must be from 0 to {max}")),
            Some(len) => *slot = len,
            None => {}
        }
    }
    let has_ip = parts.iter().any(|p| matches!(p, KeyPart::Ip(_)));
    // No parts: the key is refused (or left out) already.
    if !has_ip && !parts.is_empty() && (raw.ipv4_prefix.is_some() || raw.ipv6_prefix.is_some()) {
        let field = if raw.ipv4_prefix.is_some() { "ipv4_prefix" } else { "ipv6_prefix" };
        e.add(format!("{at}.{field}"), "applies only to limits whose key includes `ip`");
    }
    for part in &mut parts {
        if let KeyPart::Ip(p) = part {
            *p = prefix;
        }
    }
    parts
}

/// What a limit counts, as written: its kind decides which fields apply.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Algorithm(AlgorithmName),
    /// `rates: [..]`, several windows on one key.
    Windows,
    Concurrency,
}

impl Kind {
    fn describe(self) -> &'static str {
        match self {
            Kind::Algorithm(AlgorithmName::LeakyBucket) => "the leaky bucket (the default algorithm)",
            Kind::Algorithm(AlgorithmName::Gcra) => "algorithm gcra",
            Kind::Algorithm(AlgorithmName::TokenBucket) => "algorithm token_bucket",
            Kind::Algorithm(AlgorithmName::MinInterval) => "algorithm min_interval",
            Kind::Algorithm(AlgorithmName::FixedWindow) => "algorithm fixed_window",
            Kind::Algorithm(AlgorithmName::SlidingWindow) => "algorithm sliding_window",
            Kind::Algorithm(AlgorithmName::SlidingLog) => "algorithm sliding_log",
            Kind::Windows => "several windows (`rates`)",
            Kind::Concurrency => "concurrency limits",
        }
    }

    fn fields(self) -> &'static [&'static str] {
        match self {
            Kind::Algorithm(AlgorithmName::LeakyBucket) => &["rate", "burst", "nodelay", "delay"],
            Kind::Algorithm(AlgorithmName::Gcra) => &["rate", "burst"],
            Kind::Algorithm(AlgorithmName::TokenBucket) => &["capacity", "refill"],
            Kind::Algorithm(AlgorithmName::MinInterval) => &["interval"],
            Kind::Algorithm(AlgorithmName::FixedWindow | AlgorithmName::SlidingWindow | AlgorithmName::SlidingLog) => {
                &["limit", "window"]
            }
            Kind::Windows => &["rates"],
            Kind::Concurrency => &["concurrency", "retry_after", "adaptive"],
        }
    }
}

/// Largest `limit` of a sliding log: 512 KiB of timestamps per key at most.
const MAX_LOG_LIMIT: u64 = 65_536;

/// Largest `limit` of a fixed window.
const MAX_WINDOW_LIMIT: u64 = (1 << 24) - 1;

/// The limit's policies (one per window): what kind of limit it is decides which fields
/// apply, and every other field given is an error.
fn policy(e: &mut Errors<'_>, at: &str, raw: &RawLimit) -> Option<Vec<Policy>> {
    let kind = match (raw.algorithm, &raw.rates, &raw.concurrency) {
        (algorithm, None, None) => Kind::Algorithm(algorithm.unwrap_or(AlgorithmName::LeakyBucket)),
        (None, Some(_), None) => Kind::Windows,
        (None, None, Some(_)) => Kind::Concurrency,
        _ => {
            e.add(at.to_owned(), "give one of `algorithm`, `rates` or `concurrency`");
            return None;
        }
    };
    let given = [
        ("rates", raw.rates.is_some()),
        ("rate", raw.rate.is_some()),
        ("burst", raw.burst.is_some()),
        ("nodelay", raw.nodelay.is_some()),
        ("delay", raw.delay.is_some()),
        ("limit", raw.limit.is_some()),
        ("window", raw.window.is_some()),
        ("capacity", raw.capacity.is_some()),
        ("refill", raw.refill.is_some()),
        ("interval", raw.interval.is_some()),
        ("retry_after", raw.retry_after.is_some()),
        ("adaptive", raw.adaptive.is_some()),
    ];
    for (field, _) in given.iter().filter(|(field, given)| *given && !kind.fields().contains(field)) {
        let fields = kind.fields().join(", ");
        e.add(format!("{at}.{field}"), format!("does not apply to {} (its fields: {fields})", kind.describe()));
    }
    let missing = |e: &mut Errors<'_>, field: &str, example: &str| {
        e.add(at.to_owned(), format!("{} needs `{field}` (e.g. {field}: {example})", kind.describe()));
    };
    let one = match kind {
        Kind::Windows => return windows(e, at, raw.rates.as_deref().unwrap_or_default()),
        Kind::Algorithm(AlgorithmName::LeakyBucket) if raw.rate.is_none() => {
            e.add(at.to_owned(), "needs `rate: N r/DURATION` (e.g. 10r/s), `concurrency: N`, or an `algorithm`");
            None
        }
        Kind::Algorithm(AlgorithmName::LeakyBucket) => {
            let (rate, burst) = (rate(e, at, "rate", raw.rate.as_deref()), raw.burst.unwrap_or(0));
            let delay = delay(e, at, burst, raw.nodelay, raw.delay);
            Some(Policy::Rate { rate: rate?, burst, delay })
        }
        // GCRA (governor's, redis-cell's): the leaky bucket with `nodelay`. Both store the
        // instant the bucket drains; GCRA's is one period later, with the same decisions.
        Kind::Algorithm(AlgorithmName::Gcra) => {
            if raw.rate.is_none() {
                missing(e, "rate", "10r/s");
            }
            let (rate, burst) = (rate(e, at, "rate", raw.rate.as_deref()), raw.burst.unwrap_or(0));
            Some(Policy::Rate { rate: rate?, burst, delay: burst })
        }
        // A token bucket refilled continuously is GCRA with a burst of `capacity - 1`.
        Kind::Algorithm(AlgorithmName::TokenBucket) => {
            if raw.capacity.is_none() {
                missing(e, "capacity", "100");
            }
            if raw.refill.is_none() {
                missing(e, "refill", "10r/s");
            }
            if raw.capacity == Some(0) {
                e.add(format!("{at}.capacity"), "must be a positive integer");
            }
            let rate = rate(e, at, "refill", raw.refill.as_deref())?;
            let burst = raw.capacity.filter(|&c| c > 0)? - 1;
            Some(Policy::Rate { rate, burst, delay: burst })
        }
        // One request per interval: a rate of 1 per interval, no burst.
        Kind::Algorithm(AlgorithmName::MinInterval) => {
            let Some(text) = &raw.interval else {
                missing(e, "interval", "1s");
                return None;
            };
            let per = e.check(|| format!("{at}.interval"), positive_duration(text))?;
            Some(Policy::Rate { rate: Rate { count: 1, per }, burst: 0, delay: 0 })
        }
        Kind::Algorithm(
            name @ (AlgorithmName::FixedWindow | AlgorithmName::SlidingWindow | AlgorithmName::SlidingLog),
        ) => {
            if raw.limit.is_none() {
                missing(e, "limit", "100");
            }
            if raw.window.is_none() {
                missing(e, "window", "1m");
            }
            let limit = amount_in(e, &format!("{at}.limit"), raw.limit?, raw.money.is_some())?;
            // Fixed and sliding windows keep their counts in 24 and 32 bits of the key's
            // state (a money budget's fixed window in 44); a sliding log keeps a timestamp
            // per request, 8 bytes each.
            let max = match name {
                AlgorithmName::FixedWindow if raw.money.is_some() => MAX_BUDGET,
                AlgorithmName::FixedWindow => MAX_WINDOW_LIMIT,
                AlgorithmName::SlidingLog => MAX_LOG_LIMIT,
                _ => u64::from(u32::MAX),
            };
            if !(1..=max).contains(&limit) {
                let range = match raw.money {
                    Some(_) => format!("more than 0 and at most {}", Money::amount(max)),
                    None => format!("from 1 to {max}"),
                };
                e.add(format!("{at}.limit"), format!("must be {range}"));
            }
            let window = match raw.window.as_ref()? {
                RawWindow::Length(text) => e.check(|| format!("{at}.window"), positive_duration(text))?,
                RawWindow::Calendar(calendar) if name == AlgorithmName::FixedWindow => {
                    let calendar = calendar::calendar(e, at, calendar)?;
                    return Some(vec![Policy::FixedWindow { limit, window: Window::Calendar(calendar) }]);
                }
                RawWindow::Calendar(_) => {
                    e.add(
                        format!("{at}.window"),
                        format!(
                            "a calendar window applies only to algorithm fixed_window; {} takes a length (e.g. window: 1h)",
                            kind.describe()
                        ),
                    );
                    return None;
                }
            };
            if window < Duration::from_millis(1) {
                e.add(format!("{at}.window"), "must be at least 1ms");
            }
            Some(match name {
                AlgorithmName::FixedWindow => Policy::FixedWindow { limit, window: Window::Every(window) },
                AlgorithmName::SlidingLog => Policy::SlidingLog { limit, window },
                _ => Policy::SlidingWindow { limit, window },
            })
        }
        Kind::Concurrency => {
            let (max, adaptive) = match &raw.concurrency {
                Some(RawConcurrency::Word(word)) if word == "adaptive" => adaptive(e, at, raw),
                Some(RawConcurrency::Word(word)) => {
                    e.add(
                        format!("{at}.concurrency"),
                        format!("must be a positive integer or `adaptive`, not {word:?}"),
                    );
                    (1, None)
                }
                &Some(RawConcurrency::Count(max)) => {
                    if max == 0 {
                        e.add(format!("{at}.concurrency"), "must be a positive integer (or `adaptive`)");
                    }
                    if raw.adaptive.is_some() {
                        e.add(format!("{at}.adaptive"), "applies to `concurrency: adaptive` (this limit's is fixed)");
                    }
                    (max, None)
                }
                None => (0, None),
            };
            let retry_after =
                e.duration(&format!("{at}.retry_after"), raw.retry_after.as_ref(), DEFAULT_CONCURRENCY_RETRY_AFTER);
            Some(Policy::Concurrency { max, retry_after, adaptive })
        }
    };
    one.map(|policy| vec![policy])
}

/// An adaptive ceiling's least unless it says otherwise.
const DEFAULT_ADAPTIVE_MIN: u64 = 4;
/// An adaptive ceiling's most unless it says otherwise.
const DEFAULT_ADAPTIVE_MAX: u64 = 1000;
/// How often an adaptive ceiling moves unless it says otherwise.
const DEFAULT_ADAPTIVE_WINDOW: Duration = Duration::from_millis(500);
/// The bounds of an adaptive ceiling's window: a few samples at least, and a move now and then.
const ADAPTIVE_WINDOWS: std::ops::RangeInclusive<Duration> = Duration::from_millis(10)..=Duration::from_secs(60);

/// `concurrency: adaptive` with `adaptive: { min, max, window }`: the most its ceiling
/// reaches, and how it learns, on a local limit whose keys have no counts of their own.
fn adaptive(e: &mut Errors<'_>, at: &str, raw: &RawLimit) -> (u64, Option<crate::policy::Adaptive>) {
    let given = raw.adaptive.as_ref().unwrap_or(&RawAdaptive { min: None, max: None, window: None });
    let at_adaptive = format!("{at}.adaptive");
    let (min, max) = (given.min.unwrap_or(DEFAULT_ADAPTIVE_MIN), given.max.unwrap_or(DEFAULT_ADAPTIVE_MAX));
    if min == 0 {
        e.add(format!("{at_adaptive}.min"), "must be a positive integer");
    }
    if !(min.max(1)..=MOST_QUEUED).contains(&max) {
        e.add(format!("{at_adaptive}.max"), format!("must be from `min` ({min}) to {MOST_QUEUED}"));
    }
    let window = e.positive(&format!("{at_adaptive}.window"), given.window.as_ref(), DEFAULT_ADAPTIVE_WINDOW);
    if !ADAPTIVE_WINDOWS.contains(&window) {
        e.add(format!("{at_adaptive}.window"), "must be from 10ms to 60s");
    }
    if raw.scope == Some(super::raw::ScopeName::Global) {
        e.add(
            format!("{at}.concurrency"),
            "adaptive applies to local limits (each instance learns from the requests it sends)",
        );
    }
    if raw.limit_from.is_some() {
        e.add(format!("{at}.limit_from"), "a ceiling that learns and a count per key exclude each other");
    }
    (max.max(1), Some(crate::policy::Adaptive { min: min.max(1), window }))
}

/// `rates: [10r/s, 10000r/d]`: each window admits N per W (a token bucket of capacity N
/// refilled at N per W), and a request must fit every window.
fn windows(e: &mut Errors<'_>, at: &str, rates: &[String]) -> Option<Vec<Policy>> {
    if rates.is_empty() {
        e.add(format!("{at}.rates"), "needs at least one rate");
    }
    let windows: Vec<Policy> = rates
        .iter()
        .enumerate()
        .filter_map(|(i, text)| {
            let rate = e.check(|| format!("{at}.rates[{i}]"), parse_rate(text))?;
            Some(Policy::Rate { rate, burst: rate.count - 1, delay: rate.count - 1 })
        })
        .collect();
    (windows.len() == rates.len() && !windows.is_empty()).then_some(windows)
}

fn overrides(
    e: &mut Errors<'_>,
    at: &str,
    name: &str,
    raw: &RawLimit,
    all: &BTreeMap<String, RawLimit>,
) -> Vec<(Allow, LimitId)> {
    let mut compiled = Vec::new();
    for (i, o) in raw.overrides.iter().enumerate() {
        let here = format!("{at}.overrides[{i}]");
        let matcher = allow(e, &format!("{here}.match"), Some(&o.matcher));
        match all.keys().position(|n| *n == o.target) {
            None => e.add(format!("{here}.use"), unknown_name("limit", &o.target, all, "limits")),
            Some(_) if o.target == name => e.add(format!("{here}.use"), "a limit cannot override itself"),
            Some(_) if !all[&o.target].overrides.is_empty() => {
                e.add(
                    format!("{here}.use"),
                    format!("limit {:?} has overrides of its own; overrides do not chain", o.target),
                );
            }
            Some(index) => compiled.push((matcher, LimitId::from(index))),
        }
    }
    compiled
}

/// The statuses the limit counts (`None`: all). A gRPC call counts by the status it
/// ended with, `crate::grpc::counted_status`: with `count_grpc`, the codes listed; HTTP
/// statuses as `count` lists them (all, without `count`).
fn count(e: &mut Errors<'_>, at: &str, raw: &RawLimit) -> Option<Box<[u16]>> {
    if raw.count.is_none() && raw.count_grpc.is_none() {
        return None;
    }
    if raw.concurrency.is_some() {
        let field = if raw.count.is_some() { "count" } else { "count_grpc" };
        e.add(format!("{at}.{field}"), "does not apply to concurrency limits (a slot is held by every request)");
    }
    let mut counted: Vec<u16> = match &raw.count {
        Some(statuses) => {
            if statuses.is_empty() {
                e.add(format!("{at}.count"), "needs at least one status (leave `count` out to count every response)");
            }
            for (i, &status) in statuses.iter().enumerate() {
                if !(100..=599).contains(&status) {
                    e.add(format!("{at}.count[{i}]"), format!("must be a status from 100 to 599, not {status}"));
                }
            }
            statuses.clone()
        }
        None => (100..=599).collect(),
    };
    for (i, name) in raw.count_grpc.iter().flatten().enumerate() {
        match Code::named(name) {
            Some(code) => counted.push(crate::grpc::counted_status(code)),
            None => e.add(
                format!("{at}.count_grpc[{i}]"),
                format!("must name a gRPC status (OK, UNAVAILABLE, ...), not {name:?}"),
            ),
        }
    }
    if raw.count_grpc.as_ref().is_some_and(Vec::is_empty) {
        e.add(
            format!("{at}.count_grpc"),
            "needs at least one gRPC status (leave `count_grpc` out to count every call)",
        );
    }
    Some(counted.into())
}

/// `action:`: a limit that annotates refuses nothing, so it has no refusal to ban with.
fn action(e: &mut Errors<'_>, at: &str, raw: &RawLimit) -> LimitAction {
    let action = raw.action.unwrap_or_default();
    if action == LimitAction::Annotate && raw.ban.is_some() {
        e.add(
            format!("{at}.ban"),
            "a limit with `action: annotate` forwards what is over it and refuses nothing, so nothing starts a ban: \
             drop `ban`, or pair this limit with one that refuses",
        );
    }
    action
}

/// `annotate_from: 80%`: the share of the limit's capacity, a whole percentage from 1 to
/// 100, at or above which a request it admits is forwarded annotated.
fn annotate_from(e: &mut Errors<'_>, at: &str, raw: &RawLimit) -> Option<u8> {
    let text = raw.annotate_from.as_deref()?;
    let percent =
        text.trim().strip_suffix('%').and_then(|n| n.trim().parse::<u8>().ok()).filter(|n| (1..=100).contains(n));
    e.check(
        || format!("{at}.annotate_from"),
        percent.ok_or_else(|| format!("{text:?}: a share of the limit's capacity from 1% to 100%, e.g. 80%")),
    )
}

fn ban(e: &mut Errors<'_>, at: &str, raw: &RawLimit) -> Option<Ban> {
    let Some(text) = &raw.ban else {
        if raw.ban_max.is_some() {
            e.add(format!("{at}.ban_max"), "needs `ban` (the first ban's length)");
        }
        return None;
    };
    let base = e.check(|| format!("{at}.ban"), positive_duration(text))?;
    let max = match &raw.ban_max {
        None => base,
        Some(text) => {
            let max = e.check(|| format!("{at}.ban_max"), positive_duration(text))?;
            if max < base {
                e.add(
                    format!("{at}.ban_max"),
                    format!("must not be shorter than `ban` ({text} < {})", raw.ban.as_deref().unwrap_or_default()),
                );
            }
            max
        }
    };
    Some(Ban { base, max })
}

/// The excess requests admitted without waiting, out of `burst`, from `nodelay` or
/// `delay` (of a leaky-bucket limit at `at`, or of a route's own use of one): 0 by
/// default (every excess request waits), `burst` for `nodelay`.
pub(super) fn delay(e: &mut Errors<'_>, at: &str, burst: u64, nodelay: Option<bool>, delay: Option<u64>) -> u64 {
    match (nodelay, delay) {
        (Some(true), Some(_)) => {
            e.add(format!("{at}.delay"), "give either `nodelay: true` or `delay: N`, not both");
            0
        }
        (_, Some(d)) if d > burst => {
            e.add(format!("{at}.delay"), format!("must not exceed burst ({burst}); use `nodelay: true` for no delay"));
            0
        }
        (Some(true), None) => burst,
        (_, delay) => delay.unwrap_or(0),
    }
}

fn rate(e: &mut Errors<'_>, at: &str, field: &str, text: Option<&str>) -> Option<Rate> {
    e.check(|| format!("{at}.{field}"), parse_rate(text?))
}
