//! What the import did not carry over, and why: each directive left out is one line
//! `FILE:LINE: directive: why` (and a comment where it would have gone in the YAML); on
//! stderr the lines of one directive left out of one file for one reason are one line
//! (`FILE:LINE: directive: why (21 lines: 2-22)`). Directives that need no counterpart
//! are only counted. Each left out is either without effect on where requests go and
//! how they are limited, or not (`Effect`): the exit status tells the two apart.

use std::collections::{BTreeMap, BTreeSet};

use super::syntax::{At, Directive};

/// What leaving a directive out changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Effect {
    /// Neither which route a request takes nor how it is limited or refused: a header,
    /// compression, a timeout, a setting servers disagree on.
    Dropped,
    /// Requests take another route, or are limited or refused otherwise than by nginx: a
    /// location, a condition, a limit, an access rule, an address or name of a server.
    Diverts,
}

impl Effect {
    /// What leaving out the directive `name` changes, as far as its name tells.
    pub fn of(name: &str) -> Effect {
        const DIVERTING: &[&str] = &[
            "location",
            "if",
            "rewrite",
            "return",
            "proxy_pass",
            "try_files",
            "limit_except",
            "internal",
            "server",
            "server_name",
            "listen",
            "limit_req",
            "limit_req_zone",
            "limit_req_status",
            "limit_req_dry_run",
            "limit_conn",
            "limit_conn_zone",
            "limit_conn_status",
            "limit_conn_dry_run",
            "client_max_body_size",
            "allow",
            "deny",
            "satisfy",
            "auth_basic",
            "auth_basic_user_file",
            "auth_request",
            "auth_jwt",
            "ssl_verify_client",
            "ssl_client_certificate",
            "set_real_ip_from",
            "real_ip_header",
            "real_ip_recursive",
        ];
        // `fastcgi_pass`, `grpc_pass`, …: where nginx sent the location's requests.
        if DIVERTING.contains(&name) || name.ends_with("_pass") { Effect::Diverts } else { Effect::Dropped }
    }
}

/// One directive left out.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    at: At,
    directive: String,
    why: String,
    effect: Effect,
}

#[derive(Debug, Default)]
pub struct Notes {
    /// Left out: by position, directive and why. One line each, however many routes
    /// inherit the directive.
    left_out: BTreeSet<Entry>,
    /// Directives with nothing to convert (logging, buffers, process settings), by name.
    ignored: BTreeMap<String, usize>,
}

impl Notes {
    /// Records `d` as left out and returns the line that says so.
    pub fn left_out(&mut self, d: &Directive, why: impl Into<String>) -> String {
        self.left_out_at(&d.at, &d.name, why)
    }

    /// Records `directive` at `at` as left out, with the effect its name tells.
    pub fn left_out_at(&mut self, at: &At, directive: &str, why: impl Into<String>) -> String {
        self.left_out_as(at, directive, why, Effect::of(directive))
    }

    /// Records `directive` at `at` as left out, with `effect`.
    pub fn left_out_as(&mut self, at: &At, directive: &str, why: impl Into<String>, effect: Effect) -> String {
        let why = why.into();
        let line = format!("{at}: {directive}: {why}");
        self.left_out.insert(Entry { at: at.clone(), directive: directive.to_owned(), why, effect });
        line
    }

    pub fn ignore(&mut self, name: &str) {
        *self.ignored.entry(name.to_owned()).or_default() += 1;
    }

    /// Whether everything that changes how requests are answered was converted.
    pub fn complete(&self) -> bool {
        self.left_out.is_empty()
    }

    /// The lines, one a directive left out, in file order.
    pub fn lines(&self) -> Vec<String> {
        self.left_out.iter().map(Entry::line).collect()
    }

    /// The lines in file order, those of one directive left out of one file for one
    /// reason as one, at its first position, ending `(N lines: 2-22)`; only the lines
    /// `keep` keeps.
    pub fn grouped(&self, keep: impl Fn(&str) -> bool) -> Vec<String> {
        let mut groups: Vec<(&Entry, Vec<usize>)> = Vec::new();
        for e in self.left_out.iter().filter(|e| keep(&e.line())) {
            let same = |(first, _): &&mut (&Entry, Vec<usize>)| {
                first.at.file == e.at.file && first.directive == e.directive && first.why == e.why
            };
            match groups.iter_mut().find(same) {
                Some((_, lines)) => lines.push(e.at.line),
                None => groups.push((e, vec![e.at.line])),
            }
        }
        groups
            .into_iter()
            .map(|(first, lines)| match lines.len() {
                1 => first.line(),
                n => format!("{} ({n} lines: {})", first.line(), runs(&lines)),
            })
            .collect()
    }

    /// The positions of the directives left out whose effect is `Diverts`, in file order,
    /// each once.
    pub fn diverting(&self) -> Vec<&At> {
        let mut at: Vec<&At> = self.left_out.iter().filter(|e| e.effect == Effect::Diverts).map(|e| &e.at).collect();
        // Sorted already: a location and its `fastcgi_pass` on one line are one place.
        at.dedup();
        at
    }

    /// One line naming the directives ignored, if any.
    pub fn ignored_line(&self) -> Option<String> {
        if self.ignored.is_empty() {
            return None;
        }
        let names: Vec<String> =
            self.ignored.iter().map(|(name, &n)| if n == 1 { name.clone() } else { format!("{name} ({n})") }).collect();
        Some(format!("nothing to convert (sluicegate needs no counterpart): {}", names.join(", ")))
    }
}

impl Entry {
    fn line(&self) -> String {
        format!("{}: {}: {}", self.at, self.directive, self.why)
    }
}

/// Line numbers (ascending) as runs: `2-5, 9, 11-12`.
fn runs(lines: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let mut j = i;
        while j + 1 < lines.len() && lines[j + 1] <= lines[j] + 1 {
            j += 1;
        }
        out.push(if j == i { lines[i].to_string() } else { format!("{}-{}", lines[i], lines[j]) });
        i = j + 1;
    }
    out.join(", ")
}

/// Directives that change nothing a client gets from sluicegate: process and event
/// settings, logging, buffering and file-cache tuning, TLS tuning that rustls decides.
pub fn needs_no_counterpart(name: &str) -> bool {
    const NAMES: &[&str] = &[
        "user",
        "pid",
        "daemon",
        "master_process",
        "worker_rlimit_nofile",
        "worker_connections",
        "worker_cpu_affinity",
        "worker_priority",
        "worker_shutdown_timeout",
        "working_directory",
        "lock_file",
        "timer_resolution",
        "pcre_jit",
        "thread_pool",
        "env",
        "events",
        "use",
        "multi_accept",
        "accept_mutex",
        "accept_mutex_delay",
        "error_log",
        "access_log",
        "log_format",
        "log_not_found",
        "log_subrequest",
        "open_log_file_cache",
        "rewrite_log",
        "sendfile",
        "sendfile_max_chunk",
        "tcp_nopush",
        "tcp_nodelay",
        "aio",
        "directio",
        "output_buffers",
        "postpone_output",
        "types",
        "default_type",
        "types_hash_max_size",
        "types_hash_bucket_size",
        "server_names_hash_bucket_size",
        "server_names_hash_max_size",
        "variables_hash_max_size",
        "variables_hash_bucket_size",
        "map_hash_max_size",
        "map_hash_bucket_size",
        "proxy_headers_hash_max_size",
        "proxy_headers_hash_bucket_size",
        "server_tokens",
        "open_file_cache",
        "open_file_cache_valid",
        "open_file_cache_min_uses",
        "open_file_cache_errors",
        "reset_timedout_connection",
        "lingering_close",
        "lingering_time",
        "lingering_timeout",
        "keepalive_requests",
        "keepalive_time",
        "client_header_buffer_size",
        "client_body_buffer_size",
        "client_body_in_file_only",
        "proxy_buffering",
        "proxy_buffers",
        "proxy_buffer_size",
        "proxy_busy_buffers_size",
        "proxy_max_temp_file_size",
        "proxy_temp_file_write_size",
        "proxy_request_buffering",
        "proxy_http_version",
        "proxy_send_timeout",
        "proxy_next_upstream",
        "proxy_next_upstream_tries",
        "proxy_next_upstream_timeout",
        "proxy_socket_keepalive",
        "proxy_ssl_server_name",
        "proxy_ssl_protocols",
        "proxy_ssl_session_reuse",
        "resolver",
        "resolver_timeout",
        "ssl_ciphers",
        "ssl_prefer_server_ciphers",
        "ssl_session_cache",
        "ssl_session_timeout",
        "ssl_session_tickets",
        "ssl_session_ticket_key",
        "ssl_dhparam",
        "ssl_ecdh_curve",
        "ssl_stapling",
        "ssl_stapling_verify",
        "ssl_trusted_certificate",
        "ssl_buffer_size",
        "ssl_early_data",
        "http2",
        "http2_max_concurrent_streams",
        "http2_chunk_size",
        "http2_recv_buffer_size",
        "http2_idle_timeout",
        "ignore_invalid_headers",
        "server_name_in_redirect",
        "port_in_redirect",
        "absolute_redirect",
        "msie_padding",
        "msie_refresh",
        "charset_types",
        "keepalive",
        "zone",
    ];
    // Where nginx keeps bodies and responses on disk: sluicegate streams them.
    NAMES.contains(&name) || name.ends_with("_temp_path")
}

/// Why a directive sluicegate has no counterpart for is left out.
pub fn unsupported_reason(name: &str) -> &'static str {
    match name {
        "if" => "conditions are not converted",
        "rewrite" => "regular-expression rewrites are not converted",
        "set" => "variables set here are not converted",
        "root" | "alias" | "try_files" | "index" | "autoindex" | "etag" => {
            "sluicegate serves no files: it forwards requests or answers them with `respond`"
        }
        "error_page" | "proxy_intercept_errors" => "error pages are not converted",
        "allow" | "deny" => "access control by address is not supported",
        "auth_basic" | "auth_basic_user_file" | "auth_request" | "auth_request_set" | "auth_jwt" | "satisfy" => {
            "authentication is not supported"
        }
        "gzip" | "gzip_types" | "gzip_vary" | "gzip_proxied" | "gzip_comp_level" | "gzip_min_length"
        | "gzip_static" | "gunzip" => "response compression is not supported",
        "limit_except" => "method restrictions are not converted",
        "internal" => "internal locations are not converted",
        "ssl_client_certificate" | "ssl_verify_client" | "ssl_verify_depth" | "ssl_crl" => {
            "client certificates are not supported"
        }
        "fastcgi_pass" | "uwsgi_pass" | "scgi_pass" | "grpc_pass" | "memcached_pass" => {
            "only proxy_pass (HTTP) is converted"
        }
        "stream" | "mail" => "only http is converted",
        "proxy_hide_header"
        | "proxy_pass_header"
        | "proxy_ignore_headers"
        | "more_set_headers"
        | "more_clear_headers" => "changing response headers other than by add_header is not supported",
        "sub_filter" | "sub_filter_once" | "sub_filter_types" | "addition_types" => "changing bodies is not supported",
        "mirror" | "mirror_request_body" => "mirroring is not supported",
        "split_clients" => "variables set here are not converted",
        "load_module" => "dynamic modules are not converted",
        "proxy_cookie_domain" | "proxy_cookie_path" | "proxy_cookie_flags" => "cookie rewriting is not supported",
        "proxy_redirect" => "rewriting the upstream's Location is not supported (sluicegate sends it as is)",
        _ if name.starts_with("proxy_cache") || name.starts_with("fastcgi_cache") || name == "proxy_store" => {
            "caching is not supported"
        }
        _ if name.contains("lua") => "Lua is not supported",
        _ if name.starts_with("js_") => "njs is not supported",
        _ => "not supported",
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn the_lines_of_one_directive_left_out_of_one_file_for_one_reason_are_one() {
        let mut notes = Notes::default();
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("fastcgi_params"), Arc::from("nginx.conf"));
        for line in [2, 3, 4, 5, 7, 9, 10] {
            notes.left_out_at(&At { file: a.clone(), line }, "fastcgi_param", "not supported");
        }
        notes.left_out_at(&At { file: b.clone(), line: 3 }, "fastcgi_param", "not supported");
        notes.left_out_at(&At { file: a.clone(), line: 8 }, "fastcgi_param", "another reason");
        assert_eq!(
            notes.grouped(|_| true),
            [
                "fastcgi_params:2: fastcgi_param: not supported (7 lines: 2-5, 7, 9-10)",
                "fastcgi_params:8: fastcgi_param: another reason",
                "nginx.conf:3: fastcgi_param: not supported",
            ]
        );
        assert_eq!(notes.lines().len(), 9, "each is still a line of its own where it is commented");
        assert!(notes.diverting().is_empty(), "a parameter changes neither routes nor limits");
        notes.left_out_at(&At { file: b.clone(), line: 4 }, "location", "no route is made");
        notes.left_out_at(&At { file: b, line: 4 }, "fastcgi_pass", "only proxy_pass (HTTP) is converted");
        assert_eq!(notes.diverting().len(), 1, "one place, however many directives left out there");
    }
}
