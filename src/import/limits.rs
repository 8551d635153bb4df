//! `limit_req_zone` / `limit_conn_zone` and the `limit_req` / `limit_conn` lines in force
//! at each location -> sluicegate limits. A zone is one state in nginx, so it becomes
//! one limit shared by every route that uses it, with the burst and delay of its first
//! `limit_req` line; a route whose line asks another burst or delay lists the limit with
//! its own (`{ limit, burst, nodelay | delay }`), on the same state, as nginx decides it.
//! Only a zone used with different statuses, log levels or dry runs needs one limit per
//! setting, each with its own state.

use std::collections::BTreeMap;

use super::keys::{Key, Matcher, Variables};
use super::notes::Notes;
use super::scope::Scope;
use super::syntax::{At, Directive};
use super::values;
use super::yaml::{Item, MapBuilder, Value};
use crate::policy::key::{KeyPart, KeySpec};

/// Bytes nginx takes per state on 64-bit: its tree node and record (88 bytes for
/// `limit_req`, 36 for `limit_conn`) plus the key, rounded up to a power of two by its
/// slab allocator: 128 and 64 bytes for keys of up to 40 and 28 bytes (an address).
const REQ_STATE_BYTES: u64 = 128;
const CONN_STATE_BYTES: u64 = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `rate=COUNTr/s` or `r/m`.
    Req {
        count: u64,
        per_minute: bool,
    },
    Conn,
}

struct Zone<'a> {
    directive: &'a Directive,
    name: String,
    kind: Kind,
    size: u64,
    key: Result<Key, String>,
}

/// What a `limit_req` or `limit_conn` line asks of its zone, with the location's
/// `*_status`, `*_log_level` and `*_dry_run`: what tells one limit made of a zone from
/// another (a line's burst and delay do not: a route gives its own).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Setting {
    /// `limit_conn`: the concurrency.
    concurrency: u64,
    status: u16,
    log_level: &'static str,
    dry_run: bool,
}

/// A `limit_req` line's burst and delay (`delay: None`: nodelay); zero for `limit_conn`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Burst {
    pub burst: u64,
    pub delay: Option<u64>,
}

/// One sluicegate limit.
struct Made {
    name: String,
    zone: usize,
    setting: Setting,
    /// Its own burst and delay: its first line's.
    burst: Burst,
    /// The `limit_req`/`limit_conn` lines it stands for, as written.
    uses: Vec<(At, String)>,
    /// Requests decided by another limit instead (a tier), by what matches them.
    overrides: Vec<(Matcher, String)>,
}

/// A limit as a route lists it: its name, and the line's own burst and delay where they
/// are not the limit's.
pub type Listed = (String, Option<Burst>);

/// A limit a route applies, with its key.
#[derive(Debug, Clone)]
pub struct Applied {
    pub name: String,
    /// The line's own burst and delay, where they are not the limit's.
    pub burst: Option<Burst>,
    pub key: Key,
    /// The `limit_req` or `limit_conn` line.
    pub at: At,
    pub directive: &'static str,
}

pub struct Limits<'a> {
    zones: Vec<Zone<'a>>,
    made: Vec<Made>,
}

impl<'a> Limits<'a> {
    pub fn new(directives: &[&'a Directive], variables: &Variables<'_>, notes: &mut Notes) -> Self {
        let mut zones = Vec::new();
        for d in directives {
            match zone(d, variables) {
                Ok(z) => zones.push(z),
                Err(why) => {
                    notes.left_out(d, why);
                }
            }
        }
        Limits { zones, made: Vec::new() }
    }

    /// The limits in force in `scope`, or the lines saying why one is left out.
    pub fn apply(&mut self, scope: &Scope<'_>, notes: &mut Notes) -> (Vec<Applied>, Vec<String>) {
        let (mut applied, mut left_out) = (Vec::new(), Vec::new());
        for d in scope.all("limit_req").iter().chain(scope.all("limit_conn")) {
            match self.apply_one(d, scope) {
                Ok(a) => applied.push(a),
                Err(why) => left_out.push(notes.left_out(d, why)),
            }
        }
        (applied, left_out)
    }

    fn apply_one(&mut self, d: &Directive, scope: &Scope<'_>) -> Result<Applied, String> {
        let req = d.name == "limit_req";
        let (zone_name, setting, burst) = if req { limit_req(d, scope)? } else { limit_conn(d, scope)? };
        let zone = self
            .zones
            .iter()
            .position(|z| z.name == zone_name && matches!(z.kind, Kind::Req { .. }) == req)
            .ok_or_else(|| format!("zone {zone_name:?} is not defined by a {}_zone line that converts", d.name))?;
        let key = self.zones[zone].key.clone().map_err(|why| format!("zone {zone_name:?}: {why}"))?;
        let made = match self.made.iter().position(|m| m.zone == zone && m.setting == setting) {
            Some(i) => i,
            None => {
                let taken = self.made.iter().filter(|m| m.zone == zone).count();
                let name = if taken == 0 {
                    limit_name(&zone_name)
                } else {
                    format!("{}-{}", limit_name(&zone_name), taken + 1)
                };
                self.made.push(Made { name, zone, setting, burst, uses: Vec::new(), overrides: Vec::new() });
                self.made.len() - 1
            }
        };
        let uses = &mut self.made[made].uses;
        if !uses.iter().any(|(at, _)| *at == d.at) {
            uses.push((d.at.clone(), d.text()));
            uses.sort();
        }
        let directive = if req { "limit_req" } else { "limit_conn" };
        let made = &self.made[made];
        let burst = (burst != made.burst).then_some(burst);
        Ok(Applied { name: made.name.clone(), burst, key, at: d.at.clone(), directive })
    }

    /// Has `limit` hand the requests matching `matchers` to `to`. Fails when `limit`
    /// already hands one of them to another limit.
    pub fn add_overrides(&mut self, limit: &str, matchers: &[Matcher], to: &str) -> Result<(), String> {
        let made = self.made.iter_mut().find(|m| m.name == limit).ok_or("no such limit")?;
        for m in matchers {
            match made.overrides.iter().find(|(o, _)| o == m) {
                Some((_, other)) if other != to => {
                    return Err(format!("{limit} already hands these requests to {other}"));
                }
                Some(_) => {}
                None => made.overrides.push((m.clone(), to.to_owned())),
            }
        }
        Ok(())
    }

    /// The limits a limit hands requests to, by what matches them.
    pub fn overrides_of(&self, limit: &str) -> Vec<(Matcher, String)> {
        self.made.iter().find(|m| m.name == limit).map(|m| m.overrides.clone()).unwrap_or_default()
    }

    /// The `limits:` section: one entry per limit made, zones in file order, with
    /// the nginx lines it came from above it. A zone used with several settings gets a
    /// note: its state is no longer shared.
    pub fn section(&self, notes: &mut Notes) -> Vec<(String, Item)> {
        let mut out = Vec::new();
        for (z, zone) in self.zones.iter().enumerate() {
            let made: Vec<&Made> = self.made.iter().filter(|m| m.zone == z).collect();
            if made.is_empty() {
                continue;
            }
            let Ok(key) = &zone.key else { continue };
            let mut shared = Vec::new();
            if made.len() > 1 {
                let names: Vec<&str> = made.iter().map(|m| m.name.as_str()).collect();
                shared.push(notes.left_out(
                    zone.directive,
                    format!(
                        "zone {:?} is used with different statuses, log levels or dry runs, so it became {} limits ({}), each with its own state where nginx shares one",
                        zone.name,
                        made.len(),
                        names.join(", ")
                    ),
                ));
            }
            for m in made {
                let item = limit_item(zone, key, m, notes).commented(shared.iter().map(|l| format!("left out: {l}")));
                out.push((m.name.clone(), item));
            }
        }
        out
    }
}

impl Burst {
    /// Sets `nodelay` or `delay` in `m` as this burst asks (neither for the default, every
    /// excess request waiting).
    fn set_delay(&self, m: &mut MapBuilder) {
        match self.delay {
            None => _ = m.set("nodelay", Item::bool(true)),
            Some(0) => {}
            Some(n) => _ = m.set("delay", Item::int(n)),
        }
    }

    /// A route's entry for limit `name` with this burst and delay:
    /// `{ limit: NAME, burst: N, nodelay: true | delay: N }`.
    pub fn entry(&self, name: &str) -> Item {
        let mut m = MapBuilder::default();
        m.set("limit", Item::text(name)).set("burst", Item::int(self.burst));
        self.set_delay(&mut m);
        m.build()
    }
}

/// A zone name as a sluicegate limit name (letters, digits, `_`, `-`, `.`).
fn limit_name(zone: &str) -> String {
    zone.chars().map(|c| if c.is_ascii_alphanumeric() || "_-.".contains(c) { c } else { '_' }).collect()
}

fn zone<'a>(d: &'a Directive, variables: &Variables<'_>) -> Result<Zone<'a>, String> {
    let req = d.name == "limit_req_zone";
    let key = d.args.first().ok_or("expected a key")?;
    let (mut name_size, mut rate) = (None, None);
    for arg in &d.args[1..] {
        if let Some(zone) = arg.strip_prefix("zone=") {
            name_size = Some(zone.rsplit_once(':').ok_or_else(|| format!("zone={zone}: expected NAME:SIZE"))?);
        } else if let Some(r) = arg.strip_prefix("rate=").filter(|_| req) {
            rate = Some(r);
        } else if arg == "sync" {
            return Err("sync (zones shared between nginx Plus instances) is not converted; see scope: global".into());
        } else {
            return Err(format!("unknown parameter {arg:?}"));
        }
    }
    let (name, size) = name_size.ok_or("expected zone=NAME:SIZE")?;
    let size = values::size(size)?;
    let kind = match (req, rate) {
        (false, _) => Kind::Conn,
        (true, None) => return Err("expected rate=Nr/s or rate=Nr/m".into()),
        (true, Some(rate)) => {
            let (count, per_minute) = match (rate.strip_suffix("r/s"), rate.strip_suffix("r/m")) {
                (Some(n), _) => (n, false),
                (_, Some(n)) => (n, true),
                _ => return Err(format!("rate={rate}: expected Nr/s or Nr/m")),
            };
            // nginx's own bound (it keeps thousandths of a request in an int); also keeps
            // the arithmetic below from overflowing.
            let count = count
                .parse()
                .ok()
                .filter(|&n: &u64| (1..=2_000_000).contains(&n))
                .ok_or_else(|| format!("rate={rate}: invalid"))?;
            Kind::Req { count, per_minute }
        }
    };
    Ok(Zone { directive: d, name: name.to_owned(), kind, size, key: variables.key(key) })
}

/// nginx's `*_status`, `*_log_level` and `*_dry_run` in force for `prefix` (`limit_req`
/// or `limit_conn`), defaults included: 503, error, off.
fn common(scope: &Scope<'_>, prefix: &str) -> Result<(u16, &'static str, bool), String> {
    let status = match scope.value(&format!("{prefix}_status")) {
        Some(s) => s
            .parse()
            .ok()
            .filter(|s| (400..=599).contains(s))
            .ok_or_else(|| format!("{prefix}_status {s}: expected 400-599"))?,
        None => 503,
    };
    // sluicegate has no `notice`: it logs such lines at info, as nginx's lowest but one.
    let log_level = match scope.value(&format!("{prefix}_log_level")).unwrap_or("error") {
        "error" => "error",
        "warn" => "warn",
        "notice" | "info" => "info",
        other => return Err(format!("{prefix}_log_level {other}: expected info, notice, warn or error")),
    };
    let dry_run = scope.value(&format!("{prefix}_dry_run")) == Some("on");
    Ok((status, log_level, dry_run))
}

fn limit_req(d: &Directive, scope: &Scope<'_>) -> Result<(String, Setting, Burst), String> {
    let (status, log_level, dry_run) = common(scope, "limit_req")?;
    let (mut zone, mut burst, mut delay) = (None, 0, Some(0));
    for arg in &d.args {
        let number = |v: &str| v.parse::<u64>().map_err(|_| format!("{arg}: expected a whole number"));
        if let Some(z) = arg.strip_prefix("zone=") {
            zone = Some(z.to_owned());
        } else if let Some(b) = arg.strip_prefix("burst=") {
            burst = number(b)?;
        } else if let Some(n) = arg.strip_prefix("delay=") {
            delay = Some(number(n)?);
        } else if arg == "nodelay" {
            delay = None;
        } else {
            return Err(format!("unknown parameter {arg:?}"));
        }
    }
    // No request ever waits when `delay` reaches `burst`: that is `nodelay`. Without a
    // burst none can wait either way: one form (the default's) for both, so that lines
    // that differ only there share the limit's own entry.
    let delay = if burst == 0 { Some(0) } else { delay.filter(|&n| n < burst) };
    let zone = zone.ok_or("expected zone=NAME")?;
    Ok((zone, Setting { concurrency: 0, status, log_level, dry_run }, Burst { burst, delay }))
}

fn limit_conn(d: &Directive, scope: &Scope<'_>) -> Result<(String, Setting, Burst), String> {
    let (status, log_level, dry_run) = common(scope, "limit_conn")?;
    let [zone, n] = &d.args[..] else { return Err("expected `limit_conn ZONE NUMBER`".into()) };
    let concurrency =
        n.parse().ok().filter(|&n: &u64| n > 0).ok_or_else(|| format!("{n}: expected a positive number"))?;
    Ok((zone.clone(), Setting { concurrency, status, log_level, dry_run }, Burst { burst: 0, delay: None }))
}

fn limit_item(zone: &Zone<'_>, key: &Key, made: &Made, notes: &mut Notes) -> Item {
    let mut comments = vec![format!("{}: {}", zone.directive.at, zone.directive.text())];
    comments.extend(made.uses.iter().map(|(at, text)| format!("used by {at}: {text}")));
    let mut m = MapBuilder::default();
    let spec = key.spec();
    // By the rule `check` warns by.
    let parts: Result<Box<[KeyPart]>, String> = spec.iter().map(|p| p.parse()).collect();
    let may_be_missing = parts.is_ok_and(|parts| KeySpec(parts).may_be_missing());
    m.set("key", if spec.len() == 1 { Item::text(spec[0].clone()) } else { Item::texts(spec) });
    if key.vars.contains(&super::keys::Var::Ip) {
        m.set(
            "ipv6_prefix",
            Item::int(128)
                .commented(["nginx counts each IPv6 address apart; sluicegate's default is the /64".to_owned()]),
        );
    }
    let (state, s) = match zone.kind {
        Kind::Req { count, per_minute } => {
            let unit = if per_minute { "m" } else { "s" };
            let mut rate = Item::text(format!("{count}r/{unit}"));
            let milli = count * 1000 / if per_minute { 60 } else { 1 };
            if per_minute && (count * 1000) % 60 != 0 {
                rate = rate.commented([format!(
                    "nginx keeps rates in thousandths of a request per second: it ran this as {milli}r/1000s ({:.3}r/m); sluicegate keeps {count}r/m exact",
                    milli as f64 * 0.06
                )]);
            }
            m.set("rate", rate);
            if made.burst.burst > 0 {
                m.set("burst", Item::int(made.burst.burst));
            }
            made.burst.set_delay(&mut m);
            ("limit_req", REQ_STATE_BYTES)
        }
        Kind::Conn => {
            m.set("concurrency", Item::int(made.setting.concurrency));
            ("limit_conn", CONN_STATE_BYTES)
        }
    };
    // nginx counts no request whose key is empty: said so where the key can be.
    if may_be_missing {
        m.set(
            "on_missing_key",
            Item::text("skip").commented(["nginx does not count a request whose key is empty".to_owned()]),
        );
    }
    m.set("status", Item::int(u64::from(made.setting.status)));
    m.set("log_level", Item::text(made.setting.log_level));
    if made.setting.dry_run {
        m.set("dry_run", Item::bool(true));
    }
    let max_keys = (zone.size / s).max(1);
    m.set(
        "max_keys",
        Item::int(max_keys).commented([format!(
            "nginx's {} {state} zone holds about this many states of {s} bytes (64-bit)",
            values::size_text(zone.size)
        )]),
    );
    // The requests the key leaves out, less those handed to another limit.
    let exempt = key.exempt.iter().filter(|e| !made.overrides.iter().any(|(m, _)| m == *e));
    let allow = matching(exempt, zone, notes);
    if !allow.is_empty() {
        m.set("allow", allow.build());
    }
    if !made.overrides.is_empty() {
        let list = made.overrides.iter().map(|(matcher, to)| {
            let mut o = MapBuilder::default();
            o.set("match", matching(std::iter::once(matcher), zone, notes).build());
            o.set("use", Item::text(to.clone()));
            o.build()
        });
        m.set("overrides", Value::List(list.collect()).into());
    }
    m.build().commented(comments)
}

/// `{cidrs, headers, tokens}` matching `matchers` (for `allow` and an override's
/// `match`); methods are told apart by routes instead. An allow-list holds one value per
/// header: further ones are noted at `zone`.
fn matching<'m>(matchers: impl Iterator<Item = &'m Matcher>, zone: &Zone<'_>, notes: &mut Notes) -> MapBuilder {
    let (mut cidrs, mut headers, mut tokens) = (Vec::new(), BTreeMap::new(), Vec::new());
    for matcher in matchers {
        match matcher {
            Matcher::Net(net) => cidrs.push(net.clone()),
            Matcher::Token(token) => tokens.push(token.clone()),
            Matcher::Method(_) => {}
            Matcher::Header(name, value) => {
                if let Some(kept) = headers.get(name) {
                    notes.left_out(
                        zone.directive,
                        format!("{name}: {value:?} is not exempted: an allow-list holds one value per header ({kept:?} kept)"),
                    );
                } else {
                    headers.insert(name.clone(), value.clone());
                }
            }
        }
    }
    let mut allow = MapBuilder::default();
    if !cidrs.is_empty() {
        allow.set("cidrs", Item::texts(cidrs));
    }
    if !headers.is_empty() {
        allow.set("headers", Value::Map(headers.into_iter().map(|(k, v)| (k, Item::text(v))).collect()).into());
    }
    if !tokens.is_empty() {
        allow.set("tokens", Item::texts(tokens));
    }
    allow
}
