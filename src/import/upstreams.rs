//! `upstream` blocks and `proxy_pass` -> sluicegate upstreams. A `proxy_pass` to an
//! address makes an upstream of its own; the timeouts and TLS checks in force where it
//! is used are the upstream's, so one nginx upstream used with different ones becomes
//! one sluicegate upstream per set of them.

use std::time::Duration;

use super::keys::Variables;
use super::notes::{Effect, Notes, needs_no_counterpart};
use super::scope::Scope;
use super::syntax::{At, Directive};
use super::values;
use super::yaml::{Item, MapBuilder, Value};

/// nginx's `proxy_connect_timeout` and `proxy_read_timeout` when not set.
const NGINX_PROXY_TIMEOUT: Duration = Duration::from_secs(60);

/// nginx's `max_fails` and `fail_timeout` of a server when not set (sluicegate's too).
const NGINX_SERVER_HEALTH: (u64, Duration) = (1, Duration::from_secs(10));

/// Where a location forwards to.
pub struct Target {
    /// The sluicegate upstream.
    pub upstream: String,
    /// nginx's `$proxy_host`: the host (and port, if written) of `proxy_pass`, which
    /// nginx sends as `Host` unless told otherwise.
    pub proxy_host: String,
    /// The URI part of `proxy_pass` (`http://b/v2/` -> `/v2/`), if any.
    pub uri: Option<String>,
}

/// An `upstream` block, read.
struct Block {
    name: String,
    at: At,
    servers: Vec<Item>,
    /// Upstream-level fields (balance, hash_key, max_fails, fail_timeout, retries).
    fields: Vec<(String, Item)>,
    comments: Vec<String>,
}

/// The TLS and timeout settings a use of an upstream carries.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Use {
    https: bool,
    connect_timeout: Duration,
    timeout: Duration,
    ca_file: Option<String>,
    sni: Option<String>,
}

/// One sluicegate upstream: a block, or a single address, with the settings of its uses.
struct Made {
    name: String,
    /// Index into `blocks`, or the `HOST:PORT` of a `proxy_pass` to an address.
    source: Result<usize, String>,
    settings: Use,
    uses: Vec<At>,
}

pub struct Upstreams {
    blocks: Vec<Block>,
    made: Vec<Made>,
    conf_prefix: std::path::PathBuf,
}

impl Upstreams {
    pub fn new(
        blocks: &[&Directive],
        variables: &Variables<'_>,
        conf_prefix: &std::path::Path,
        notes: &mut Notes,
    ) -> Self {
        let blocks = blocks.iter().map(|d| block(d, variables, notes)).collect();
        Upstreams { blocks, made: Vec::new(), conf_prefix: conf_prefix.to_path_buf() }
    }

    /// The upstream `proxy_pass` sends to, with the settings in force in `scope`.
    pub fn target(&mut self, proxy_pass: &Directive, scope: &Scope<'_>, notes: &mut Notes) -> Result<Target, String> {
        let [url] = &proxy_pass.args[..] else { return Err("expected `proxy_pass URL`".into()) };
        if url.contains('$') {
            return Err("an address made of variables is not converted".into());
        }
        let (https, rest) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
            (Some(rest), _) => (false, rest),
            (_, Some(rest)) => (true, rest),
            _ => return Err(format!("{url:?}: only http:// and https:// are converted")),
        };
        let (proxy_host, uri) = match rest.find('/') {
            Some(i) => (&rest[..i], Some(rest[i..].to_owned())),
            None => (rest, None),
        };
        if proxy_host.starts_with("unix:") {
            return Err("unix sockets are not supported".into());
        }
        let settings = self.settings(https, scope, notes, &proxy_pass.at)?;
        let source = match self.blocks.iter().position(|b| b.name == proxy_host) {
            Some(i) => Ok(i),
            None => Err(address(proxy_host, https)?),
        };
        let made = match self.made.iter().position(|m| m.source == source && m.settings == settings) {
            Some(i) => i,
            None => {
                let base = match &source {
                    Ok(i) => self.blocks[*i].name.clone(),
                    Err(addr) => addr.replace([':', '[', ']'], "-").trim_matches('-').to_owned(),
                };
                let taken = self.made.iter().filter(|m| m.source == source).count();
                let name = if taken == 0 { base } else { format!("{base}-{}", taken + 1) };
                self.made.push(Made { name, source, settings, uses: Vec::new() });
                self.made.len() - 1
            }
        };
        self.made[made].uses.push(proxy_pass.at.clone());
        self.made[made].uses.sort();
        Ok(Target { upstream: self.made[made].name.clone(), proxy_host: proxy_host.to_owned(), uri })
    }

    fn settings(&self, https: bool, scope: &Scope<'_>, notes: &mut Notes, at: &At) -> Result<Use, String> {
        let time = |name: &str| -> Result<Duration, String> {
            scope.one(name).map_or(Ok(NGINX_PROXY_TIMEOUT), |d| values::time(d.args.first().map_or("", String::as_str)))
        };
        let (mut ca_file, mut sni) = (None, None);
        if https {
            if scope.value("proxy_ssl_verify") == Some("on") {
                ca_file = scope
                    .value("proxy_ssl_trusted_certificate")
                    .map(|f| self.conf_prefix.join(f).display().to_string());
            } else {
                // Where requests go and how they are limited stay the same.
                notes.left_out_as(
                    at,
                    "proxy_pass",
                    "nginx does not check an https upstream's certificate (proxy_ssl_verify off, its default); sluicegate does, against public roots: set the upstream's tls.ca_file, or tls.verify: false",
                    Effect::Dropped,
                );
            }
            sni = scope.value("proxy_ssl_name").filter(|n| !n.contains('$')).map(str::to_owned);
        }
        Ok(Use {
            https,
            connect_timeout: time("proxy_connect_timeout")?,
            timeout: time("proxy_read_timeout")?,
            ca_file,
            sni,
        })
    }

    /// The `upstreams:` section: blocks first, in file order, then addresses.
    pub fn section(&self) -> Vec<(String, Item)> {
        let mut made: Vec<&Made> = self.made.iter().collect();
        made.sort_by_key(|m| (m.source.is_err(), m.source.as_ref().ok().copied()));
        made.into_iter().map(|m| (m.name.clone(), self.item(m))).collect()
    }

    fn item(&self, made: &Made) -> Item {
        let mut m = MapBuilder::default();
        let mut comments = Vec::new();
        let scheme = if made.settings.https { "https://" } else { "" };
        match &made.source {
            Ok(i) => {
                let block = &self.blocks[*i];
                comments.push(format!("{}: upstream {}", block.at, block.name));
                comments.extend(block.comments.iter().cloned());
                let servers = block.servers.iter().map(|s| with_scheme(s, scheme)).collect();
                m.set("servers", Value::List(servers).into());
                for (field, item) in &block.fields {
                    m.set(field, item.clone());
                }
            }
            Err(address) => {
                m.set("servers", Item::texts([format!("{scheme}{address}")]));
            }
        }
        comments.extend(made.uses.iter().map(|at| format!("used by {at}: proxy_pass")));
        let s = &made.settings;
        m.set("connect_timeout", Item::text(values::duration_text(s.connect_timeout)));
        m.set("timeout", Item::text(values::duration_text(s.timeout)));
        let mut tls = MapBuilder::default();
        if let Some(ca) = &s.ca_file {
            tls.set("ca_file", Item::text(ca.clone()));
        }
        if let Some(sni) = &s.sni {
            tls.set("sni", Item::text(sni.clone()));
        }
        if !tls.is_empty() {
            m.set("tls", tls.build());
        }
        m.build().commented(comments)
    }
}

/// A server written `HOST:PORT` (or a `{address, weight}` map) with `scheme` before it.
fn with_scheme(server: &Item, scheme: &str) -> Item {
    match &server.value {
        Value::Text(address) => Item::text(format!("{scheme}{address}")),
        Value::Map(fields) => {
            let fields = fields.iter().map(|(k, v)| {
                if k == "address" { (k.clone(), with_scheme(v, scheme)) } else { (k.clone(), v.clone()) }
            });
            Value::Map(fields.collect()).into()
        }
        _ => server.clone(),
    }
}

/// `HOST[:PORT]` of nginx as sluicegate's `HOST:PORT`.
fn address(host: &str, https: bool) -> Result<String, String> {
    let default = if https { 443 } else { 80 };
    let has_port = match host.rsplit_once(':') {
        Some((h, port)) => {
            !h.ends_with(':') && (!host.starts_with('[') || h.ends_with(']')) && port.parse::<u16>().is_ok()
        }
        None => false,
    };
    if host.is_empty() || host.starts_with("unix:") {
        return Err(format!("{host:?}: only HOST:PORT servers are converted"));
    }
    Ok(if has_port { host.to_owned() } else { format!("{host}:{default}") })
}

fn block(d: &Directive, variables: &Variables<'_>, notes: &mut Notes) -> Block {
    let name = d.args.first().cloned().unwrap_or_default();
    let mut b = Block { name, at: d.at.clone(), servers: Vec::new(), fields: Vec::new(), comments: Vec::new() };
    let mut health: Option<(u64, Duration)> = None;
    for inner in d.block() {
        match inner.name.as_str() {
            "server" => match server(inner, &mut health) {
                Ok(Some(item)) => b.servers.push(item),
                Ok(None) => b.comments.push(format!("{}: server {}: down, left out", inner.at, inner.args[0])),
                Err(why) => b.comments.push(format!("left out: {}", notes.left_out(inner, why))),
            },
            "least_conn" => b.fields.push(("balance".into(), Item::text("least_conn"))),
            "ip_hash" => {
                b.fields.push((
                    "balance".into(),
                    Item::text("hash").commented(["nginx's ip_hash goes by the first three octets of an IPv4 address, sluicegate's by the whole address".to_owned()]),
                ));
                b.fields.push(("hash_key".into(), Item::text("ip")));
            }
            "hash" => match variables.key(inner.args.first().map_or("", String::as_str)) {
                Ok(key) if key.exempt.is_empty() && key.only.is_none() => {
                    b.fields.push(("balance".into(), Item::text("hash")));
                    let spec = key.spec();
                    b.fields.push((
                        "hash_key".into(),
                        if spec.len() == 1 { Item::text(spec[0].clone()) } else { Item::texts(spec) },
                    ));
                }
                Ok(_) => b.comments.push(format!(
                    "left out: {}",
                    notes.left_out(inner, "a key that leaves requests out is not converted")
                )),
                Err(why) => b.comments.push(format!("left out: {}", notes.left_out(inner, why))),
            },
            "random" if inner.args.first().is_some_and(|a| a == "two") => {
                b.fields.push(("balance".into(), Item::text("random_two")));
            }
            name if needs_no_counterpart(name) => notes.ignore(name),
            _ => b.comments.push(format!(
                "left out: {}",
                notes.left_out(
                    inner,
                    "not converted (sluicegate balances by round_robin, least_conn, random_two or hash)"
                )
            )),
        }
    }
    if let Some((max_fails, fail_timeout)) = health.filter(|&h| h != NGINX_SERVER_HEALTH) {
        b.fields.push(("max_fails".into(), Item::int(max_fails)));
        b.fields.push(("fail_timeout".into(), Item::text(values::duration_text(fail_timeout))));
    }
    // nginx tries every server before it gives up (proxy_next_upstream_tries 0).
    if b.servers.len() > 2 {
        b.fields.push(("retries".into(), Item::int(b.servers.len() as u64 - 1)));
    }
    b
}

/// A `server` line of an upstream: its address, weight and passive health, `None` when
/// `down`. `health` holds the first server's `max_fails` and `fail_timeout`, written as
/// the upstream's; another server's own pair is written with it.
fn server(d: &Directive, health: &mut Option<(u64, Duration)>) -> Result<Option<Item>, String> {
    let address = address(d.args.first().ok_or("expected an address")?, false)?;
    let (mut weight, mut this) = (1, NGINX_SERVER_HEALTH);
    for arg in &d.args[1..] {
        let number = |n: &str| n.parse::<u64>().map_err(|_| format!("{arg}: expected a whole number"));
        match arg.split_once('=') {
            Some(("weight", w)) => weight = number(w)?,
            Some(("max_fails", n)) => this.0 = number(n)?,
            Some(("fail_timeout", t)) => this.1 = values::time(t)?,
            None if arg == "down" => return Ok(None),
            None if arg == "backup" => {
                return Err("backup servers are not supported: left out, so they get no requests".into());
            }
            _ => return Err(format!("{arg} is not converted")),
        }
    }
    let first = *health.get_or_insert(this);
    let mut fields = vec![("address".to_owned(), Item::text(address.clone()))];
    if weight != 1 {
        fields.push(("weight".into(), Item::int(weight)));
    }
    if this != first {
        fields.push(("max_fails".into(), Item::int(this.0)));
        fields.push(("fail_timeout".into(), Item::text(values::duration_text(this.1))));
    }
    Ok(Some(if fields.len() == 1 { Item::text(address) } else { Value::Map(fields).into() }))
}
