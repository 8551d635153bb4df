//! `sluicegate import`: an nginx configuration -> a sluicegate configuration, with nginx's
//! semantics (inheritance, location order, `return` before limits, its defaults), then
//! checked as `sluicegate check` checks a file.
//!
//! `files` reads nginx.conf and its includes (`syntax`: nginx's tokenizer); `grammar`
//! refuses what `nginx -t` refuses (`directives`: nginx's directives); `http` walks
//! the http block with `scope` (inheritance); `keys`, `limits`, `upstreams`,
//! `listeners`, `settings` and `routes` each make one section of the YAML (`yaml`;
//! `tiers`: limits that count only some requests);
//! `notes` keeps what was left out, reported on stderr and as comments (`destinations`:
//! where the requests of a location left out go now).

mod destinations;
mod directives;
mod files;
mod grammar;
mod http;
mod keys;
mod limits;
mod listeners;
mod notes;
mod routes;
mod scope;
mod settings;
mod syntax;
mod tiers;
mod upstreams;
mod values;
mod yaml;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use notes::Notes;
use syntax::Directive;
use yaml::Value;

/// Everything converted, and `check` accepts the result.
pub const COMPLETE: u8 = 0;
/// Nothing written: the nginx configuration cannot be read, has a syntax error, or has
/// no `http` server to import.
pub const FAILED: u8 = 1;
/// Written, but directives were left out (listed on stderr, and as comments in it),
/// none of which changes which route a request takes or how it is limited or refused.
pub const PARTIAL: u8 = 3;
/// Written, but `check` refuses it (e.g. a certificate file missing on this machine).
pub const REFUSED: u8 = 4;
/// Written and valid, but requests will be routed, limited or refused otherwise than
/// nginx did: a location, a condition, a limit, an access rule was left out (each says
/// where its requests go now, and what they lose).
pub const DIVERTED: u8 = 5;

pub struct Options {
    pub nginx_conf: PathBuf,
    /// nginx's `-p`: where a relative `nginx_conf` is.
    pub prefix: Option<PathBuf>,
    /// Where to write the YAML (`None`: standard output).
    pub out: Option<PathBuf>,
}

/// Imports, writes, checks; reports on stderr. The exit status is one of the constants.
pub fn run(options: &Options) -> ExitCode {
    let source = options.nginx_conf.display().to_string();
    let loaded = match files::load(&options.nginx_conf, options.prefix.as_deref()) {
        Ok(loaded) => match grammar::check(&loaded.directives)[..] {
            [] => loaded,
            ref errors => return refused(errors, &source),
        },
        Err(e) => return refused(&[e], &source),
    };
    let mut notes = Notes::default();
    let yaml = match convert(&loaded.directives, &loaded.conf_prefix, &source, &mut notes) {
        Ok(yaml) => yaml,
        Err(why) => {
            eprintln!("{source}: {why}: nothing imported");
            return ExitCode::from(FAILED);
        }
    };
    for line in notes.grouped(|_| true) {
        eprintln!("{line}");
    }
    if let Some(line) = notes.ignored_line() {
        eprintln!("{source}: {line}");
    }
    let written = match &options.out {
        Some(out) => std::fs::write(out, &yaml).map_err(|e| format!("{}: cannot write: {e}", out.display())),
        // A closed pipe (`| head`) is not worth a panic, nor an error: the YAML was asked for.
        None => {
            let _ = std::io::stdout().lock().write_all(yaml.as_bytes());
            Ok(())
        }
    };
    if let Err(e) = written {
        eprintln!("{e}");
        return ExitCode::from(FAILED);
    }
    let checked = check(&yaml, options.out.as_deref());
    let diverting = notes.diverting();
    let summary = match (notes.lines().len(), diverting.len()) {
        (0, _) => "imported whole".to_owned(),
        (n, 0) => format!(
            "{} left out (listed above, and as comments in the result), none of which changes which route a request \
             takes or how it is limited",
            directives(n)
        ),
        (n, d) => {
            let at: Vec<String> = diverting.iter().map(ToString::to_string).collect();
            format!(
                "{} left out (listed above, and as comments in the result); requests are routed, limited or refused \
                 otherwise than by nginx where {} left out: {}",
                directives(n),
                if d == 1 { "this one was".to_owned() } else { format!("these {d} were") },
                at.join(", ")
            )
        }
    };
    match checked {
        Ok(()) if notes.complete() => {
            eprintln!("{source}: {summary}; the result is valid");
            ExitCode::from(COMPLETE)
        }
        Ok(()) if diverting.is_empty() => {
            eprintln!("{source}: {summary}; the result is valid");
            ExitCode::from(PARTIAL)
        }
        Ok(()) => {
            eprintln!("{source}: {summary}; the result is valid");
            ExitCode::from(DIVERTED)
        }
        Err(errors) => {
            eprintln!("{errors}");
            eprintln!("{source}: {summary}; the result does not pass check (above)");
            ExitCode::from(REFUSED)
        }
    }
}

/// What nginx would refuse to load, nothing written.
fn refused(errors: &[syntax::SyntaxError], source: &str) -> ExitCode {
    for e in errors {
        eprintln!("{e}");
    }
    eprintln!("{source}: nothing imported");
    ExitCode::from(FAILED)
}

/// "1 directive", "2 directives".
fn directives(n: usize) -> String {
    if n == 1 { "1 directive".to_owned() } else { format!("{n} directives") }
}

/// `sluicegate check` on the result: on the file written, or on a copy in the temporary
/// directory when it went to standard output (its errors then name `<stdout>`).
fn check(yaml: &str, out: Option<&Path>) -> Result<(), String> {
    let described = |e: crate::config::LoadError, name: Option<&str>| match e {
        crate::config::LoadError::Invalid(mut errors) => {
            if let Some(name) = name {
                errors.iter_mut().for_each(|e| e.file = name.to_owned());
            }
            crate::config::LoadError::Invalid(errors).to_string()
        }
        other => other.to_string(),
    };
    let warn = |config: crate::config::Config| {
        for warning in &config.warnings {
            eprintln!("warning: {warning}");
        }
    };
    if let Some(out) = out {
        return crate::config::check(out).map(warn).map_err(|e| described(e, None));
    }
    let copy = std::env::temp_dir().join(format!("sluicegate-import-{}.yaml", std::process::id()));
    std::fs::write(&copy, yaml).map_err(|e| format!("{}: cannot write a copy to check: {e}", copy.display()))?;
    let result = crate::config::check(&copy).map(warn).map_err(|e| described(e, Some("<stdout>")));
    let _ = std::fs::remove_file(&copy);
    result
}

/// The YAML for the nginx configuration `main` (its includes expanded).
fn convert(main: &[Directive], conf_prefix: &Path, source: &str, notes: &mut Notes) -> Result<String, String> {
    let mut https = main.iter().filter(|d| d.name == "http");
    let http_block = https.next().ok_or("no http block")?;
    if let Some(second) = https.next() {
        return Err(format!("{}: a second http block (nginx refuses it)", second.at));
    }
    // Lines about what belongs to no listener, upstream, limit or route: said at the top.
    let mut general = Vec::new();
    for d in main.iter().filter(|d| !matches!(d.name.as_str(), "http" | "worker_processes")) {
        if notes::needs_no_counterpart(&d.name) {
            notes.ignore(&d.name);
        } else {
            general.push(notes.left_out(d, notes::unsupported_reason(&d.name)));
        }
    }
    let http = http::read(http_block, notes);
    if http.servers.is_empty() {
        return Err("no server in the http block".into());
    }
    general.extend(http.left_out.iter().cloned());
    let variables = keys::Variables::new(&http.variables);
    let mut limits = limits::Limits::new(&http.zones, &variables, notes);
    let mut upstreams = upstreams::Upstreams::new(&http.upstreams, &variables, conf_prefix, notes);
    let listeners = listeners::Listeners::new(&http.servers, conf_prefix, notes);
    let catch_all = listeners.catch_all(&http.servers, notes);
    listeners.note_partial_listens(&http.servers, notes);
    let primary = catch_all.first().map_or(0, |&(i, _)| i);
    let (server, max_body) = settings::section(main, &http.servers, primary, notes);
    let trusted = settings::trusted_proxies(&http.scope, &http.servers, notes);
    let mut cx = routes::Context {
        http: &http,
        listeners: &listeners,
        catch_all,
        limits: &mut limits,
        upstreams: &mut upstreams,
        max_body,
    };
    let routes = routes::section(&mut cx, notes);
    let mut top = vec![("listen".to_owned(), listeners.section())];
    top.extend(trusted.map(|t| ("trusted_proxies".to_owned(), t)));
    top.push(("server".to_owned(), server));
    let sections = [("upstreams", upstreams.section()), ("limits", limits.section(notes))];
    for (name, entries) in sections {
        if !entries.is_empty() {
            top.push((name.to_owned(), Value::Map(entries).into()));
        }
    }
    top.push(("routes".to_owned(), routes));
    let header = |general: &[String]| {
        let mut header = vec![format!("Made by `sluicegate import` from {source}.")];
        if !notes.complete() {
            header.push(String::new());
            let n = notes.lines().len();
            header.push(format!(
                "Left out: {}, each in a line `left out:` here or below (and on stderr).",
                directives(n)
            ));
            header.extend(general.iter().map(|l| format!("left out: {l}")));
        }
        header
    };
    // A setting servers disagree on, a server's addresses: lines placed nowhere below
    // go to the top too.
    let placed = yaml::render(&header(&general), &top);
    general.extend(notes.grouped(|line| !placed.contains(line)));
    Ok(yaml::render(&header(&general), &top))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The YAML made of nginx configuration `src`, read back, and the lines left out.
    fn import(src: &str) -> (serde_json::Value, Vec<String>) {
        let mut notes = Notes::default();
        let tree = syntax::parse(src, &std::sync::Arc::from("nginx.conf")).unwrap();
        let yaml = convert(&tree, Path::new("/etc/nginx"), "nginx.conf", &mut notes).unwrap();
        let value = serde_saphyr::from_str(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
        (value, notes.lines())
    }

    #[test]
    fn a_location_limit_replaces_the_servers_and_https() {
        let (yaml, left_out) = import(
            "http { limit_req_zone $binary_remote_addr zone=a:1m rate=1r/s;\n\
             limit_req_zone $binary_remote_addr zone=b:1m rate=2r/s;\n\
             limit_req zone=a;\n\
             server { listen 80; location / { proxy_pass http://127.0.0.1:3000; }\n\
                      location /b/ { limit_req zone=b burst=3; proxy_pass http://127.0.0.1:3000; } } }",
        );
        assert_eq!(left_out, Vec::<String>::new());
        assert_eq!(yaml["routes"][0]["match"]["path_prefix"], "/b/");
        assert_eq!(yaml["routes"][0]["limits"], serde_json::json!(["b"]));
        assert_eq!(yaml["routes"][1]["limits"], serde_json::json!(["a"]));
        assert_eq!(yaml["limits"]["b"]["burst"], 3);
        assert_eq!(yaml["limits"]["a"]["status"], 503);
    }

    #[test]
    fn exact_locations_come_first_then_prefixes_longest_first_and_return_skips_limits() {
        let (yaml, _) = import(
            "http { limit_req_zone $binary_remote_addr zone=a:1m rate=1r/s; limit_req zone=a;\n\
             server { location / { proxy_pass http://b:1; } location /api/v1/ { proxy_pass http://b:1/; }\n\
             location = /health { return 200 ok; } location /api/ { proxy_pass http://b:1; } } }",
        );
        let paths: Vec<&serde_json::Value> =
            (0..4).map(|i| yaml["routes"][i]["match"].as_object().unwrap().values().next().unwrap()).collect();
        assert_eq!(paths, ["/health", "/api/v1/", "/api/", "/"]);
        assert_eq!(yaml["routes"][0]["respond"], serde_json::json!({"status": 200, "body": "ok"}));
        assert!(yaml["routes"][0].get("limits").is_none());
        assert_eq!(yaml["routes"][1]["strip_prefix"], true);
    }

    #[test]
    fn ipv4_and_ipv6_listens_on_one_port_become_one_dual_stack_listener() {
        let (yaml, left_out) = import("http { server { listen 80; listen [::]:80; location / { return 204; } } }");
        assert_eq!(yaml["listen"], serde_json::json!(["[::]:80"]));
        assert_eq!(left_out, Vec::<String>::new());
    }

    #[test]
    fn the_uri_part_of_proxy_pass_and_the_host_nginx_sends_come_through() {
        let (yaml, left_out) = import(
            "http { server {\n\
             location /a/ { proxy_pass http://127.0.0.1:1/; }\n\
             location /b { proxy_pass http://127.0.0.1:1/v2/; proxy_set_header Host api.internal; }\n\
             location = /c { proxy_pass http://127.0.0.1:1/d; proxy_set_header Host $host; proxy_set_header Accept-Encoding \"\"; }\n\
             location /e/ { proxy_pass http://127.0.0.1:1; proxy_set_header X-Real-IP $remote_addr; } } }",
        );
        let route = |path: &str| {
            let routes = yaml["routes"].as_array().unwrap();
            routes.iter().find(|r| r["name"] == path).unwrap().clone()
        };
        assert_eq!(route("/a/")["strip_prefix"], true);
        assert_eq!(route("/a/")["upstream_host"], "127.0.0.1:1");
        assert_eq!(route("/b")["rewrite"], serde_json::json!({"prefix": "/b", "to": "/v2/"}));
        assert_eq!(route("/b")["upstream_host"], "api.internal");
        assert_eq!(route("=/c")["rewrite"], serde_json::json!({"prefix": "/c", "to": "/d"}));
        assert_eq!(route("=/c")["remove_request_headers"], serde_json::json!(["accept-encoding"]));
        assert_eq!(route("=/c")["upstream_host"], "keep_name");
        assert_eq!(route("/e/")["set_request_headers"], serde_json::json!({"x-real-ip": "$client_ip"}));
        assert_eq!(left_out, Vec::<String>::new());
    }

    /// The test configurations cut short anywhere, or without any one of their lines or
    /// words, are refused with a position or imported; none panics.
    #[test]
    fn no_configuration_cut_or_missing_a_piece_panics() {
        let sources = [
            include_str!("../../tests/fixtures/import/gateway/nginx.conf"),
            include_str!("../../tests/fixtures/import/login/nginx.conf"),
        ];
        let try_one = |src: &str| {
            if let Ok(tree) = syntax::parse(src, &std::sync::Arc::from("cut.conf")) {
                let _ = convert(&tree, Path::new("/etc/nginx"), "cut.conf", &mut Notes::default());
            }
        };
        for src in sources {
            (0..src.len()).filter(|&i| src.is_char_boundary(i)).for_each(|end| try_one(&src[..end]));
            let lines: Vec<&str> = src.lines().collect();
            for i in 0..lines.len() {
                try_one(&[&lines[..i], &lines[i + 1..]].concat().join("\n"));
            }
            let words: Vec<&str> = src.split(' ').collect();
            for i in 0..words.len() {
                try_one(&[&words[..i], &words[i + 1..]].concat().join(" "));
            }
        }
    }

    #[test]
    fn a_zone_used_with_two_bursts_is_one_limit_and_each_problem_on_a_line_is_reported() {
        let (yaml, left_out) = import(
            "http { limit_req_zone $binary_remote_addr zone=one:1m rate=1r/s;\n\
             server { location /x/ { limit_req zone=one burst=5; proxy_pass http://b:1; }\n\
             location /y/ { limit_req zone=one burst=9; limit_req zone=nope; limit_req zone=gone; proxy_pass http://b:1; }\n\
             location /z/ { limit_req zone=one burst=7 delay=2; proxy_pass http://b:1; } } }",
        );
        // One state, as nginx keeps: the limit has its first line's burst, and each route
        // whose line asks another gives its own.
        assert_eq!(yaml["limits"]["one"]["burst"], 5);
        assert!(yaml["limits"]["one-2"].is_null());
        assert_eq!(yaml["routes"][0]["limits"], serde_json::json!(["one"]));
        assert_eq!(yaml["routes"][1]["limits"], serde_json::json!([{ "limit": "one", "burst": 9 }]));
        assert_eq!(yaml["routes"][2]["limits"], serde_json::json!([{ "limit": "one", "burst": 7, "delay": 2 }]));
        assert_eq!(
            left_out,
            [
                "nginx.conf:3: limit_req: zone \"gone\" is not defined by a limit_req_zone line that converts",
                "nginx.conf:3: limit_req: zone \"nope\" is not defined by a limit_req_zone line that converts",
            ]
        );
    }

    /// `underscores_in_headers on` keeps such fields, as the server's setting does; `off`
    /// (nginx's default) is sluicegate's own.
    #[test]
    fn underscores_in_headers_on_keeps_such_fields() {
        let conf = |flag| {
            format!("http {{ underscores_in_headers {flag}; server {{ location / {{ proxy_pass http://b:1; }} }} }}")
        };
        let (on, left_out) = import(&conf("on"));
        assert_eq!(on["server"]["underscores_in_headers"], true);
        assert!(left_out.is_empty(), "{left_out:?}");
        let (off, _) = import(&conf("off"));
        assert_eq!(off["server"].get("underscores_in_headers"), None);
    }

    /// Without a burst, `nodelay` changes nothing: lines that differ only there use the
    /// limit as it is, with no entry of their own.
    #[test]
    fn lines_without_a_burst_share_the_limit_whether_or_not_they_say_nodelay() {
        let (yaml, _) = import(
            "http { limit_req_zone $binary_remote_addr zone=one:1m rate=1r/s;\n\
             server { location /x/ { limit_req zone=one; proxy_pass http://b:1; }\n\
             location /y/ { limit_req zone=one nodelay; proxy_pass http://b:1; } } }",
        );
        assert_eq!(yaml["routes"][0]["limits"], serde_json::json!(["one"]));
        assert_eq!(yaml["routes"][1]["limits"], serde_json::json!(["one"]));
        assert_eq!(yaml["limits"]["one"].get("nodelay"), None);
    }

    #[test]
    fn a_zone_used_with_two_statuses_becomes_two_limits_with_a_note() {
        let (yaml, left_out) = import(
            "http { limit_req_zone $binary_remote_addr zone=one:1m rate=1r/s;\n\
             server { location /x/ { limit_req zone=one burst=5; proxy_pass http://b:1; }\n\
             location /y/ { limit_req zone=one burst=9 nodelay; limit_req_status 429; proxy_pass http://b:1; } } }",
        );
        assert_eq!(yaml["limits"]["one"]["status"], 503);
        assert_eq!(yaml["limits"]["one-2"]["status"], 429);
        assert_eq!(yaml["limits"]["one-2"]["nodelay"], true);
        assert_eq!(yaml["routes"][1]["limits"], serde_json::json!(["one-2"]));
        assert_eq!(
            left_out,
            [
                "nginx.conf:1: limit_req_zone: zone \"one\" is used with different statuses, log levels or dry runs, so it became 2 limits (one, one-2), each with its own state where nginx shares one",
            ]
        );
    }
}
