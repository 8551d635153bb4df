//! `listen`, `server_name` and `ssl_*` of the servers -> sluicegate listeners (TLS with
//! one certificate per server, chosen by SNI), the hosts each server's routes match, and
//! the scheme they match where the servers of plain and TLS addresses differ (the usual
//! HTTP→HTTPS pair). sluicegate picks a route by host and scheme on whatever listener a
//! request came in, where nginx first picks the servers of the address: where that
//! differs, a note says so.

use std::path::Path;

use crate::router::Scheme;

use super::http::Server;
use super::notes::Notes;
use super::syntax::{At, Directive};
use super::yaml::{Item, MapBuilder, Value};

/// One `listen` of a server.
#[derive(Debug, Clone)]
struct Listen {
    address: String,
    ssl: bool,
    default: bool,
    /// A `0.0.0.0:PORT` taken into `[::]:PORT` (see `merge_dual_stack`).
    merged: bool,
    at: At,
}

pub struct Listeners {
    /// Per server: its listens.
    listens: Vec<Vec<Listen>>,
    /// Per server: `(cert, key)`, its TLS version floor, its names.
    certs: Vec<Option<(String, String)>>,
    min_versions: Vec<Option<&'static str>>,
    names: Vec<Vec<String>>,
}

impl Listeners {
    pub fn new(servers: &[Server<'_>], conf_prefix: &Path, notes: &mut Notes) -> Self {
        let mut out = Listeners { listens: Vec::new(), certs: Vec::new(), min_versions: Vec::new(), names: Vec::new() };
        for server in servers {
            let ssl_on = server.ssl_on;
            let mut listens: Vec<Listen> = server.listens.iter().filter_map(|d| listen(d, ssl_on, notes)).collect();
            if server.listens.is_empty() {
                // nginx's default when a server has no `listen`.
                listens.push(Listen {
                    address: "0.0.0.0:80".into(),
                    ssl: ssl_on,
                    default: false,
                    merged: false,
                    at: server.at.clone(),
                });
            }
            let (cert, min_version) = tls(server, conf_prefix, notes);
            if cert.is_none() && listens.iter().any(|l| l.ssl) {
                notes.left_out_at(
                    &server.at,
                    "listen",
                    "ssl without ssl_certificate and ssl_certificate_key: no TLS listener is made for it",
                );
                listens.retain(|l| !l.ssl);
            }
            out.listens.push(listens);
            out.certs.push(cert);
            out.min_versions.push(min_version);
            out.names.push(server_names(server, notes));
        }
        out.merge_dual_stack();
        out
    }

    /// `listen 80; listen [::]:80;` is one listener in sluicegate: its `[::]` socket
    /// takes IPv4 clients too (where `net.ipv6.bindv6only` is 0, Linux's default), and
    /// binding `0.0.0.0` beside it would fail. nginx binds `[::]` as IPv6 only.
    fn merge_dual_stack(&mut self) {
        let all: Vec<String> = self.listens.iter().flatten().map(|l| l.address.clone()).collect();
        for listens in &mut self.listens {
            for l in listens.iter_mut() {
                let port = l.address.strip_prefix("0.0.0.0:").unwrap_or_default();
                let v6 = format!("[::]:{port}");
                if !port.is_empty() && all.contains(&v6) {
                    l.address = v6;
                    l.merged = true;
                }
            }
            // One server's two lines are now one listen.
            let mut seen = Vec::new();
            listens.retain(|l| {
                let first = !seen.contains(&l.address);
                seen.push(l.address.clone());
                first
            });
        }
    }

    /// Every address, in order of first appearance.
    fn addresses(&self) -> Vec<(&str, bool)> {
        let mut out: Vec<(&str, bool)> = Vec::new();
        for l in self.listens.iter().flatten() {
            match out.iter_mut().find(|(a, _)| *a == l.address) {
                Some((_, ssl)) => *ssl |= l.ssl,
                None => out.push((&l.address, l.ssl)),
            }
        }
        out
    }

    /// The default server of `address`: the one that says `default_server`, else the
    /// first that listens on it.
    fn default_of(&self, address: &str) -> Option<usize> {
        let on = |i: &usize| self.listens[*i].iter().any(|l| l.address == address);
        let all: Vec<usize> = (0..self.listens.len()).filter(on).collect();
        all.iter()
            .copied()
            .find(|&i| self.listens[i].iter().any(|l| l.address == address && l.default))
            .or(all.first().copied())
    }

    /// Whether addresses of both kinds, plain and TLS, are listened on: only then can
    /// routes tell their requests apart by scheme.
    fn both_schemes(&self) -> bool {
        let addresses = self.addresses();
        addresses.iter().any(|(_, ssl)| *ssl) && addresses.iter().any(|(_, ssl)| !*ssl)
    }

    /// The scheme the routes of `server` match: `https` for a server that listens on TLS
    /// addresses only, `http` for one on plain addresses only, where the other kind is
    /// listened on by other servers; `None` (either) otherwise.
    pub fn scheme(&self, server: usize) -> Option<Scheme> {
        let listens = &self.listens[server];
        if !self.both_schemes() || listens.is_empty() {
            return None;
        }
        let tls = listens.iter().all(|l| self.is_tls(&l.address));
        let plain = listens.iter().all(|l| !self.is_tls(&l.address));
        match (tls, plain) {
            (true, _) => Some(Scheme::Https),
            (_, true) => Some(Scheme::Http),
            _ => None,
        }
    }

    /// Whether `address` is a TLS one (nginx makes the whole address TLS when any of its
    /// `listen` lines says `ssl`).
    fn is_tls(&self, address: &str) -> bool {
        self.addresses().iter().any(|(a, ssl)| *a == address && *ssl)
    }

    /// The servers whose routes take requests for names no server lists, each with the
    /// scheme its routes do so for: the default server of the first address; or, where
    /// plain and TLS addresses have different defaults, the default of the first plain
    /// address for `http` and of the first TLS address for `https`. Notes each other
    /// default that sluicegate cannot keep.
    pub fn catch_all(&self, servers: &[Server<'_>], notes: &mut Notes) -> Vec<(usize, Option<Scheme>)> {
        let addresses = self.addresses();
        let default_of_kind =
            |tls: bool| addresses.iter().find(|(_, ssl)| *ssl == tls).and_then(|(a, _)| self.default_of(a));
        let chosen: Vec<(usize, Option<Scheme>)> = match (default_of_kind(false), default_of_kind(true)) {
            (Some(plain), Some(tls)) if plain != tls => vec![(plain, Some(Scheme::Http)), (tls, Some(Scheme::Https))],
            _ => addresses.first().and_then(|(a, _)| self.default_of(a)).map(|d| (d, None)).into_iter().collect(),
        };
        for (address, ssl) in &addresses {
            let Some(other) = self.default_of(address) else { continue };
            let Some(&(kept, _)) = chosen.iter().find(|(_, scheme)| scheme.is_none_or(|s| s == Scheme::of(*ssl)))
            else {
                continue;
            };
            if other != kept {
                notes.left_out_at(
                    &servers[other].at,
                    "server",
                    format!("sluicegate routes by host and scheme, not by address: requests to {address} for names no server lists go to the server at {}, not this one", servers[kept].at),
                );
            }
        }
        chosen
    }

    /// Notes each server that does not listen on every address of the schemes it
    /// answers: its routes answer on all of them in sluicegate.
    pub fn note_partial_listens(&self, servers: &[Server<'_>], notes: &mut Notes) {
        let addresses = self.addresses();
        for (i, server) in servers.iter().enumerate() {
            let scheme = self.scheme(i);
            let missing: Vec<&str> = addresses
                .iter()
                .filter(|(_, ssl)| scheme.is_none_or(|s| s == Scheme::of(*ssl)))
                .map(|(a, _)| *a)
                .filter(|a| !self.listens[i].iter().any(|l| l.address == *a))
                .collect();
            if !missing.is_empty() {
                notes.left_out_at(
                    &server.at,
                    "listen",
                    format!(
                        "sluicegate routes by host and scheme, not by address: this server's locations also answer on {}",
                        missing.join(", ")
                    ),
                );
            }
        }
    }

    /// The hosts a server's routes match (`*.example.com` included).
    pub fn names(&self, server: usize) -> &[String] {
        &self.names[server]
    }

    /// The `listen:` section.
    pub fn section(&self) -> Item {
        let mut list = Vec::new();
        for (address, ssl) in self.addresses() {
            let first = self.listens.iter().flatten().find(|l| l.address == address).map(|l| l.at.clone());
            let mut comment: Vec<String> = first.map(|at| format!("{at}: listen")).into_iter().collect();
            if self.listens.iter().flatten().any(|l| l.address == address && l.merged) {
                comment.push(format!(
                    "and {}: IPv4 clients come in on this IPv6 socket (net.ipv6.bindv6only 0, Linux's default)",
                    address.replace("[::]", "0.0.0.0")
                ));
            }
            if !ssl {
                list.push(Item::text(address).commented(comment));
                continue;
            }
            let mut tls = MapBuilder::default();
            // The address's default server first: a client that sends no known name gets its certificate.
            let mut servers: Vec<usize> = (0..self.listens.len())
                .filter(|&i| self.certs[i].is_some() && self.listens[i].iter().any(|l| l.address == address && l.ssl))
                .collect();
            if let Some(d) = self.default_of(address) {
                servers.sort_by_key(|&i| i != d);
            }
            match &servers[..] {
                [one] => {
                    let (cert, key) = self.certs[*one].clone().unwrap_or_default();
                    tls.set("cert", Item::text(cert)).set("key", Item::text(key));
                }
                many => {
                    let certificates = many.iter().map(|&i| {
                        let (cert, key) = self.certs[i].clone().unwrap_or_default();
                        let mut c = MapBuilder::default();
                        c.set("cert", Item::text(cert)).set("key", Item::text(key));
                        // A catch-all server has no name to list: `_`, as nginx writes it, matches
                        // none, and being first its certificate goes to every name no other lists.
                        let names = match &self.names[i][..] {
                            [] => Item::texts(["_"]),
                            names => Item::texts(names.to_vec()),
                        };
                        c.set("names", names);
                        c.build()
                    });
                    tls.set("certificates", Value::List(certificates.collect()).into());
                }
            }
            if let Some(v) = servers.first().and_then(|&i| self.min_versions[i]) {
                tls.set("min_version", Item::text(v));
            }
            let mut l = MapBuilder::default();
            l.set("address", Item::text(address)).set("tls", tls.build());
            list.push(l.build().commented(comment));
        }
        Value::List(list).into()
    }
}

/// A `listen` line as sluicegate's address, or `None` (noted) when it cannot be one.
fn listen(d: &Directive, ssl_on: bool, notes: &mut Notes) -> Option<Listen> {
    let Some(spec) = d.args.first() else {
        notes.left_out(d, "expected an address");
        return None;
    };
    let address = match address(spec) {
        Ok(a) => a,
        Err(why) => {
            notes.left_out(d, why);
            return None;
        }
    };
    let mut l = Listen { address, ssl: ssl_on, default: false, merged: false, at: d.at.clone() };
    for param in &d.args[1..] {
        match param.as_str() {
            "ssl" => l.ssl = true,
            "default_server" | "default" => l.default = true,
            // sluicegate offers HTTP/2 on every listener: by ALPN with TLS, as h2c without.
            "http2" => {}
            "quic" | "http3" => {
                notes.left_out(d, "HTTP/3 (QUIC) is not supported");
                return None;
            }
            "proxy_protocol" => {
                notes.left_out(d, "the PROXY protocol is not supported");
                return None;
            }
            // Socket tuning (backlog=, reuseport, deferred, ipv6only=, …) sluicegate sets itself.
            _ => {}
        }
    }
    Some(l)
}

/// nginx's `listen` address (`80`, `*:80`, `127.0.0.1`, `[::]:8080`, `localhost:80`)
/// as `IP:PORT`.
fn address(spec: &str) -> Result<String, String> {
    if spec.starts_with("unix:") {
        return Err("unix sockets are not supported".into());
    }
    let (host, port) = if spec.bytes().all(|b| b.is_ascii_digit()) {
        ("0.0.0.0", spec)
    } else if let Some(rest) = spec.strip_prefix('[') {
        let (ip, after) = rest.split_once(']').ok_or_else(|| format!("{spec}: invalid address"))?;
        return Ok(format!("[{ip}]:{}", after.strip_prefix(':').unwrap_or("80")));
    } else {
        spec.rsplit_once(':').unwrap_or((spec, "80"))
    };
    let port: u16 = port.parse().ok().filter(|&p| p > 0).ok_or_else(|| format!("{spec}: invalid port"))?;
    let ip = match host {
        "*" => "0.0.0.0",
        "localhost" => "127.0.0.1",
        h if h.parse::<std::net::Ipv4Addr>().is_ok() => h,
        h => return Err(format!("{h}: listen on an IP address; sluicegate does not look names up to listen")),
    };
    Ok(format!("{ip}:{port}"))
}

/// The server's certificate and key (absolute paths: nginx takes relative ones from
/// the configuration prefix), and its TLS version floor.
fn tls(server: &Server<'_>, conf_prefix: &Path, notes: &mut Notes) -> (Option<(String, String)>, Option<&'static str>) {
    let (certs, keys) = (server.scope.all("ssl_certificate"), server.scope.all("ssl_certificate_key"));
    for extra in certs.iter().skip(1).chain(keys.iter().skip(1)) {
        notes.left_out(extra, "one certificate per server is converted (the first)");
    }
    let pair = match (certs.first(), keys.first()) {
        (Some(c), Some(k)) => certificate_file(c, conf_prefix, notes).zip(certificate_file(k, conf_prefix, notes)),
        _ => None,
    };
    let mut floor = None;
    if let Some(d) = server.scope.one("ssl_protocols") {
        if d.args.iter().any(|p| matches!(p.as_str(), "SSLv2" | "SSLv3" | "TLSv1" | "TLSv1.1")) {
            notes.left_out(d, "sluicegate accepts TLS 1.2 and 1.3 only");
        }
        if !d.args.iter().any(|p| p == "TLSv1.2") && d.args.iter().any(|p| p == "TLSv1.3") {
            floor = Some("1.3");
        }
    }
    (pair, floor)
}

/// A certificate or key file as an absolute path, or `None` (noted) when nginx chooses
/// it per request.
fn certificate_file(d: &Directive, conf_prefix: &Path, notes: &mut Notes) -> Option<String> {
    let f = d.args.first()?;
    if f.contains('$') || f.starts_with("data:") || f.starts_with("engine:") {
        notes.left_out(d, "certificates chosen by variables or from data:/engine: are not converted");
        return None;
    }
    let path = conf_prefix.join(f);
    Some(std::path::absolute(&path).unwrap_or(path).display().to_string())
}

/// The hosts a server's routes match: exact names, `*.x` wildcards, `.x` as both.
fn server_names(server: &Server<'_>, notes: &mut Notes) -> Vec<String> {
    let mut names = Vec::new();
    for name in &server.names {
        let name = name.to_ascii_lowercase();
        match name.as_str() {
            // `_` and "" are the usual names of a catch-all server: they match nothing.
            "" | "_" => {}
            n if n.starts_with('~') || n.ends_with(".*") || n.contains('$') => {
                notes.left_out_at(
                    &server.at,
                    "server_name",
                    format!("{n}: only exact names and *.x wildcards are converted"),
                );
            }
            n => match n.strip_prefix('.') {
                Some(base) => names.extend([base.to_owned(), format!("*.{base}")]),
                None => names.push(n.to_owned()),
            },
        }
    }
    names
}
