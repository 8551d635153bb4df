//! What `nginx -t` refuses in a configuration that parses: a directive nginx does not
//! know, one where it is not allowed, with the wrong number of arguments, without its
//! `;` or its block, a flag other than `on`/`off`, a duplicate location or `limit_req`
//! zone, a zone no `*_zone` line defines, a `proxy_pass` or upstream server whose host is
//! neither an upstream nor found. Each at the line nginx names: that of the `;` or `{`
//! ending the directive. Directives of modules nginx does not ship (Lua, njs, headers-more)
//! are not checked: the conversion names them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::directives::*;
use super::syntax::{At, Directive, SyntaxError};

/// Every error in `main` (its includes expanded), in file order.
pub fn check(main: &[Directive]) -> Vec<SyntaxError> {
    let mut checker = Checker::default();
    // Zones and upstreams may be used above the line that defines them.
    for http in main.iter().filter(|d| d.name == "http") {
        for d in http.block() {
            match (d.name.as_str(), d.block.is_some()) {
                ("limit_req_zone" | "limit_conn_zone", false) => {
                    let names = d.args.iter().filter_map(|a| a.strip_prefix("zone="));
                    let names = names.map(|z| z.split(':').next().unwrap_or_default().to_owned());
                    checker.zones.extend(names.map(|name| (d.name.clone(), name)));
                }
                ("upstream", true) => checker.upstreams.extend(d.args.first().cloned()),
                _ => {}
            }
        }
    }
    if !main.iter().any(|d| d.name == "events") {
        let file = main.first().map_or_else(|| Arc::from(""), |d| Arc::clone(&d.at.file));
        let at = At { file, line: 0 };
        checker.errors.push((0, SyntaxError { at, message: "no \"events\" section in configuration".into() }));
    }
    checker.block(main, MAIN);
    let lookups = checker.hosts.iter().map(|(seq, (_, _, name, port))| (*seq, name.clone(), *port)).collect();
    for (seq, (host, why)) in crate::config::resolve::not_found(lookups) {
        if let Some((at, written, _, _)) = checker.hosts.remove(&seq) {
            let message = format!("host not found in upstream \"{written}\": {host}: {why}");
            checker.errors.push((seq, SyntaxError { at, message }));
        }
    }
    checker.errors.sort_by_key(|(seq, _)| *seq);
    checker.errors.into_iter().map(|(_, e)| e).collect()
}

#[derive(Default)]
struct Checker {
    /// With the order they are found in.
    errors: Vec<(usize, SyntaxError)>,
    /// Hosts to look up, by the order their error would take: where, as written, the
    /// name and port looked up.
    hosts: BTreeMap<usize, (At, String, String, u16)>,
    seq: usize,
    /// `(limit_req_zone | limit_conn_zone, name)`.
    zones: BTreeSet<(String, String)>,
    upstreams: BTreeSet<String>,
}

/// What is inside a block: directives checked in these contexts, or lines of the
/// block's own (a `map`'s values, `types`), or another module's.
enum Inside {
    Directives(Contexts),
    Own,
}

impl Checker {
    fn fail(&mut self, d: &Directive, message: String) {
        self.seq += 1;
        self.errors.push((self.seq, SyntaxError { at: end(d), message }));
    }

    fn block(&mut self, directives: &[Directive], context: Contexts) {
        for d in directives {
            if let Some(inside) = self.directive(d, context)
                && let (Inside::Directives(inner), Some(block)) = (inside, &d.block)
            {
                self.block(block, inner);
            }
        }
        self.duplicate_locations(directives);
        self.duplicate_zones(directives);
    }

    /// Checks `d` standing in `context`; what its block holds when it may be entered.
    fn directive(&mut self, d: &Directive, context: Contexts) -> Option<Inside> {
        let name = d.name.as_str();
        if not_nginxs(name) {
            return None;
        }
        let rows = DIRECTIVES.iter().filter(|(n, _, _)| *n == name);
        let Some(&(_, _, args)) = rows.clone().find(|(_, contexts, _)| contexts & context != 0) else {
            let message = match rows.count() {
                0 => format!("unknown directive \"{name}\""),
                _ => format!("\"{name}\" directive is not allowed here"),
            };
            self.fail(d, message);
            return None;
        };
        let block = args & BLOCK != 0;
        if d.block.is_some() != block {
            let message = match block {
                true => format!("directive \"{name}\" has no opening \"{{\""),
                false => format!("directive \"{name}\" is not terminated by \";\""),
            };
            self.fail(d, message);
            return None;
        }
        let n = d.args.len();
        let counts = match args {
            _ if args & ANY != 0 => true,
            _ if args & FLAG != 0 => n == 1,
            _ if args & ONE_OR_MORE != 0 => n >= 1,
            _ if args & TWO_OR_MORE != 0 => n >= 2,
            _ => n <= 7 && args & (1 << n) != 0,
        };
        if !counts {
            self.fail(d, format!("invalid number of arguments in \"{name}\" directive"));
            return None;
        }
        if args & FLAG != 0 && !d.args[0].eq_ignore_ascii_case("on") && !d.args[0].eq_ignore_ascii_case("off") {
            self.fail(
                d,
                format!("invalid value \"{}\" in \"{name}\" directive, it must be \"on\" or \"off\"", d.args[0]),
            );
        }
        self.uses(d);
        Some(match (name, context) {
            ("events", _) => Inside::Directives(EVENTS),
            ("http", _) => Inside::Directives(HTTP),
            ("server", _) => Inside::Directives(SERVER),
            ("upstream", _) => Inside::Directives(UPSTREAM),
            ("location", _) => Inside::Directives(LOCATION),
            ("if", SERVER) => Inside::Directives(SERVER_IF),
            ("if", _) => Inside::Directives(LOCATION_IF),
            ("limit_except", _) => Inside::Directives(LIMIT_EXCEPT),
            _ => Inside::Own,
        })
    }

    /// A zone, an upstream or a host `d` names must exist.
    fn uses(&mut self, d: &Directive) {
        let zone = match d.name.as_str() {
            "limit_req" => d.args.iter().find_map(|a| a.strip_prefix("zone=")),
            "limit_conn" => d.args.first().map(String::as_str),
            _ => None,
        };
        if let Some(zone) = zone
            && !self.zones.contains(&(format!("{}_zone", d.name), zone.to_owned()))
        {
            let message = format!(
                "zone \"{zone}\" is defined by no {}_zone line (nginx: zero size shared memory zone \"{zone}\")",
                d.name
            );
            self.fail(d, message);
        }
        let host = match (d.name.as_str(), d.args.first()) {
            ("proxy_pass", Some(url)) if !url.contains('$') => {
                let Some(rest) = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://")) else {
                    return self.fail(d, format!("invalid URL prefix in \"{url}\""));
                };
                let host = rest.split('/').next().unwrap_or_default();
                if let Some((name, port)) = host.rsplit_once(':')
                    && self.upstreams.contains(name)
                {
                    return self.fail(d, format!("upstream \"{name}\" may not have port {port}"));
                }
                host
            }
            // A server of an upstream block (its one other `server` is a block).
            ("server", Some(address)) if d.block.is_none() => address,
            _ => return,
        };
        if !self.upstreams.contains(host) && !host.starts_with("unix:") {
            self.seq += 1;
            let (name, port) = host_port(host);
            self.hosts.insert(self.seq, (end(d), host.to_owned(), name.to_owned(), port));
        }
    }

    /// Two exact locations, or two prefix ones (`^~` or not), of one path in one block.
    fn duplicate_locations(&mut self, directives: &[Directive]) {
        let mut seen = BTreeSet::new();
        for d in directives.iter().filter(|d| d.name == "location" && d.block.is_some()) {
            let key = match &d.args[..] {
                [m, path] if m == "=" => ("=", path),
                [m, path] if m == "^~" => ("", path),
                [path] if !path.starts_with(['~', '@', '=']) => ("", path),
                _ => continue,
            };
            if !seen.insert(key) {
                self.fail(d, format!("duplicate location \"{}\"", key.1));
            }
        }
    }

    /// One zone in two `limit_req` lines of one block.
    fn duplicate_zones(&mut self, directives: &[Directive]) {
        let mut seen = BTreeSet::new();
        for d in directives.iter().filter(|d| d.name == "limit_req") {
            if let Some(zone) = d.args.iter().find_map(|a| a.strip_prefix("zone="))
                && !seen.insert(zone)
            {
                self.fail(d, "\"limit_req\" directive is duplicate".to_owned());
            }
        }
    }
}

/// Directives of modules nginx does not ship, and nginx's own mail and stream blocks,
/// which hold another grammar: left to the conversion, which names them.
fn not_nginxs(name: &str) -> bool {
    name.contains("lua") || name.starts_with("js_") || name.starts_with("more_") || matches!(name, "stream" | "mail")
}

/// Where nginx places an error about `d`: the line of its `;` or `{`.
fn end(d: &Directive) -> At {
    At { file: Arc::clone(&d.at.file), line: d.end }
}

/// `HOST[:PORT]` (`[V6]:PORT`) as the host to look up and its port (nginx's default 80).
fn host_port(written: &str) -> (&str, u16) {
    let bare = written.trim_start_matches('[');
    let (name, port) = match bare.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') || name.ends_with(']') => (name, port.parse().unwrap_or(80)),
        _ => (bare, 80),
    };
    (name.trim_end_matches(']'), port)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(src: &str) -> Vec<String> {
        let tree = super::super::syntax::parse(src, &Arc::from("t.conf")).unwrap();
        check(&tree).iter().map(ToString::to_string).collect()
    }

    #[test]
    fn each_block_holds_what_nginx_allows_there_and_its_own_lines_are_not_directives() {
        let ok = "events { worker_connections 10; }\nhttp {\n map $uri $x { default 1; ~^/a 2; }\n types { text/html html; }\n \
                  upstream u { server 127.0.0.1:1 max_fails=2; keepalive 4; }\n server { if ($x) { return 404; }\n \
                  location / { limit_except GET { deny all; } if ($x) { proxy_pass http://u; } proxy_pass http://u/; }\n \
                  location /l { content_by_lua_block { ngx.say(1) } } } }";
        assert_eq!(errors(ok), Vec::<String>::new());
        assert_eq!(
            errors(
                "events {}\nhttp {\n server {\n  listen 80;\n  proxy_pass http://127.0.0.1:1;\n  if ($x) {\n   limit_rate 1k;\n  }\n }\n}"
            ),
            [
                "t.conf:5: \"proxy_pass\" directive is not allowed here",
                "t.conf:7: \"limit_rate\" directive is not allowed here",
            ]
        );
    }

    #[test]
    fn errors_are_at_the_line_that_ends_the_directive() {
        assert_eq!(
            errors(
                "events {}\nhttp {\n server {\n  client_max_body_size\n   1m 2m;\n  keepalive_timeout\n  {\n  }\n }\n}"
            ),
            [
                "t.conf:5: invalid number of arguments in \"client_max_body_size\" directive",
                "t.conf:7: directive \"keepalive_timeout\" is not terminated by \";\"",
            ]
        );
        assert_eq!(errors("http {}"), ["t.conf: no \"events\" section in configuration"]);
    }
}
