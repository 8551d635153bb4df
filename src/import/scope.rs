//! nginx's inheritance: a directive set at a level (http, server, location) replaces the
//! same directive of the levels around it, all its lines together. So a `limit_req` in a
//! location replaces every `limit_req` of its server and of http, and one
//! `proxy_set_header` in a location drops all those of the server.

use std::collections::BTreeMap;

use super::syntax::Directive;

/// Directives the import converts that nginx inherits from level to level.
const INHERITED: &[&str] = &[
    "limit_req",
    "limit_req_status",
    "limit_req_log_level",
    "limit_req_dry_run",
    "limit_conn",
    "limit_conn_status",
    "limit_conn_log_level",
    "limit_conn_dry_run",
    "proxy_set_header",
    "add_header",
    "proxy_connect_timeout",
    "proxy_read_timeout",
    "proxy_ssl_verify",
    "proxy_ssl_trusted_certificate",
    "proxy_ssl_name",
    "ssl_certificate",
    "ssl_certificate_key",
    "ssl_protocols",
    "client_max_body_size",
    "limit_rate",
    "limit_rate_after",
    "expires",
    "client_header_timeout",
    "client_body_timeout",
    "keepalive_timeout",
    "send_timeout",
    "large_client_header_buffers",
    "underscores_in_headers",
    "set_real_ip_from",
    "real_ip_header",
    "real_ip_recursive",
];

pub fn is_inherited(name: &str) -> bool {
    INHERITED.contains(&name)
}

/// The inherited directives in force at one level.
#[derive(Debug, Clone, Default)]
pub struct Scope<'a> {
    by_name: BTreeMap<&'a str, Vec<&'a Directive>>,
}

impl<'a> Scope<'a> {
    /// The scope inside `block`, a level nested in this one.
    pub fn inner(&self, block: &'a [Directive]) -> Scope<'a> {
        let mut inner = self.clone();
        let mut replaced = Vec::new();
        for d in block.iter().filter(|d| is_inherited(&d.name)) {
            let lines = inner.by_name.entry(&d.name).or_default();
            if !replaced.contains(&d.name.as_str()) {
                lines.clear();
                replaced.push(&d.name);
            }
            lines.push(d);
        }
        inner
    }

    /// Every line of `name` in force.
    pub fn all(&self, name: &str) -> &[&'a Directive] {
        self.by_name.get(name).map_or(&[], Vec::as_slice)
    }

    /// The line of a one-value directive in force (nginx refuses it twice at one level;
    /// the last is taken).
    pub fn one(&self, name: &str) -> Option<&'a Directive> {
        self.all(name).last().copied()
    }

    /// The first argument of `name` in force.
    pub fn value(&self, name: &str) -> Option<&'a str> {
        self.one(name).and_then(|d| d.args.first()).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::import::syntax::parse;

    #[test]
    fn a_level_replaces_all_lines_of_a_directive_it_sets_and_keeps_the_others() {
        let tree = parse(
            "limit_req zone=a; limit_req zone=b; limit_req_status 429;\nserver { limit_req zone=c; }",
            &Arc::from("t"),
        )
        .unwrap();
        let http = Scope::default().inner(&tree);
        let args = |s: &Scope<'_>| s.all("limit_req").iter().map(|d| d.args[0].clone()).collect::<Vec<_>>();
        assert_eq!(args(&http), ["zone=a", "zone=b"]);
        let server = http.inner(tree[3].block());
        assert_eq!(args(&server), ["zone=c"]);
        assert_eq!(server.value("limit_req_status"), Some("429"));
        assert_eq!(server.inner(&[]).all("limit_req").len(), 1);
    }
}
