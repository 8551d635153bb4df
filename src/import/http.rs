//! The nginx `http` block read into what the import converts: definitions (zones,
//! maps, upstreams), servers, and their locations flattened with the directives each
//! inherits. Directives with no counterpart are noted where they stand.

use super::notes::{Notes, needs_no_counterpart, unsupported_reason};
use super::scope::{Scope, is_inherited};
use super::syntax::{At, Directive};

pub struct Http<'a> {
    pub scope: Scope<'a>,
    pub servers: Vec<Server<'a>>,
    /// `upstream` blocks, `map` and `geo` blocks, `limit_req_zone` and `limit_conn_zone`
    /// lines, in file order.
    pub upstreams: Vec<&'a Directive>,
    pub variables: Vec<&'a Directive>,
    pub zones: Vec<&'a Directive>,
    /// Lines about http-level directives left out.
    pub left_out: Vec<String>,
}

pub struct Server<'a> {
    pub at: At,
    pub scope: Scope<'a>,
    pub listens: Vec<&'a Directive>,
    pub names: Vec<String>,
    /// `ssl on`: every `listen` of the server is TLS (nginx before 1.25).
    pub ssl_on: bool,
    /// A `return` outside locations: nginx answers with it before any location.
    pub ret: Option<&'a Directive>,
    pub locations: Vec<Location<'a>>,
    pub left_out: Vec<String>,
}

/// How a location matches the normalized path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Match {
    /// `location = /x`
    Exact,
    /// `location ^~ /x`: the longest prefix, and then no regular expression is tried.
    PrefixFirst,
    /// `location /x`: the longest prefix, if no regular expression matches.
    Prefix,
    /// `location ~ RE` (`caseless`: `~*`)
    Regex { caseless: bool },
}

pub struct Location<'a> {
    pub directive: &'a Directive,
    pub kind: Match,
    pub path: &'a str,
    pub scope: Scope<'a>,
    pub proxy_pass: Option<&'a Directive>,
    pub ret: Option<&'a Directive>,
    pub left_out: Vec<String>,
}

/// Reads `http`, noting what is left out.
pub fn read<'a>(http: &'a Directive, notes: &mut Notes) -> Http<'a> {
    let scope = Scope::default().inner(http.block());
    let mut out = Http {
        scope,
        servers: Vec::new(),
        upstreams: Vec::new(),
        variables: Vec::new(),
        zones: Vec::new(),
        left_out: Vec::new(),
    };
    for d in http.block() {
        match d.name.as_str() {
            "server" => out.servers.push(server(d, &out.scope, notes)),
            "upstream" => out.upstreams.push(d),
            "map" | "geo" => out.variables.push(d),
            "limit_req_zone" | "limit_conn_zone" => out.zones.push(d),
            _ => {
                if let Some(line) = other(d, notes) {
                    out.left_out.push(line);
                }
            }
        }
    }
    out
}

/// A directive not read by its level: inherited ones are read through the scope, those
/// with no counterpart counted, the rest noted as left out (the line returned).
fn other(d: &Directive, notes: &mut Notes) -> Option<String> {
    if is_inherited(&d.name) {
        return None;
    }
    // `off` is what sluicegate does: the upstream's Location goes to the client as sent.
    if needs_no_counterpart(&d.name) || (d.name == "proxy_redirect" && d.args == ["off"]) {
        notes.ignore(&d.name);
        return None;
    }
    let why = match d.name.as_str() {
        "server" | "upstream" | "map" | "geo" | "limit_req_zone" | "limit_conn_zone" => "only valid in http".to_owned(),
        "location" | "listen" | "server_name" => "not valid here".to_owned(),
        // What becomes of the requests it answers (`if ($http_user_agent ~* bot) { return 403; }`).
        "if" => match d.block().iter().find(|inner| inner.name == "return") {
            Some(ret) => format!(
                "{}: the requests it answers with `{}` now go on to the route their path takes, limited and \
                 forwarded as any other",
                unsupported_reason("if"),
                ret.text()
            ),
            None => unsupported_reason("if").to_owned(),
        },
        name => unsupported_reason(name).to_owned(),
    };
    Some(notes.left_out(d, why))
}

fn server<'a>(d: &'a Directive, http: &Scope<'a>, notes: &mut Notes) -> Server<'a> {
    let scope = http.inner(d.block());
    let mut server = Server {
        at: d.at.clone(),
        scope,
        listens: Vec::new(),
        names: Vec::new(),
        ssl_on: false,
        ret: None,
        locations: Vec::new(),
        left_out: Vec::new(),
    };
    for inner in d.block() {
        match inner.name.as_str() {
            "listen" => server.listens.push(inner),
            "server_name" => server.names.extend(inner.args.iter().cloned()),
            "ssl" => server.ssl_on = inner.args == ["on"],
            "return" => server.ret = Some(inner),
            "location" => {
                let scope = server.scope.clone();
                locations(inner, &scope, &mut server, notes);
            }
            _ => server.left_out.extend(other(inner, notes)),
        }
    }
    server
}

/// The location `d` and those nested in it, each with the scope it inherits, into
/// `server` (and there the lines of those left out).
fn locations<'a>(d: &'a Directive, outer: &Scope<'a>, server: &mut Server<'a>, notes: &mut Notes) {
    let (kind, path) = match &d.args[..] {
        [m, path] if m == "=" => (Match::Exact, path),
        [m, path] if m == "^~" => (Match::PrefixFirst, path),
        [m, pattern] if m == "~" || m == "~*" => (Match::Regex { caseless: m == "~*" }, pattern),
        [path] if path.starts_with('/') => (Match::Prefix, path),
        args => {
            let why = match args.first().map(String::as_str) {
                Some(name) if name.starts_with('@') => "named locations are not converted",
                _ => "expected `location [=|^~] /path`",
            };
            server.left_out.push(notes.left_out(d, why));
            return;
        }
    };
    let scope = outer.inner(d.block());
    let mut location = Location { directive: d, kind, path, scope, proxy_pass: None, ret: None, left_out: Vec::new() };
    let mut nested = Vec::new();
    for inner in d.block() {
        match inner.name.as_str() {
            "proxy_pass" => location.proxy_pass = Some(inner),
            "return" => location.ret = Some(inner),
            "location" => nested.push(inner),
            _ => location.left_out.extend(other(inner, notes)),
        }
    }
    let scope = location.scope.clone();
    server.locations.push(location);
    for inner in nested {
        locations(inner, &scope, server, notes);
    }
}
