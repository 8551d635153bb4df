//! Locations -> routes, in nginx's order of matching: per host, exact locations first,
//! then `^~` prefixes longest first, then regular expressions in file order, then the
//! other prefixes longest first; the hosts of every server before the catch-all routes
//! of the default server. Each route carries what nginx applied at its location: limits
//! (a `return` answers before them), the upstream with its URI part, header fields.

use super::destinations::{self, Takes};
use super::http::{Http, Location, Match, Server};
use super::keys::Var;
use super::limits::{Limits, Listed};
use super::listeners::Listeners;
use super::notes::Notes;
use super::scope::Scope;
use super::settings;
use super::syntax::{At, Directive};
use super::tiers;
use super::upstreams::Upstreams;
use super::values;
use super::yaml::{Item, MapBuilder, Value};
use crate::router::Scheme;

/// A route of one server, before it is given a host.
struct Template {
    /// What it takes, for where the requests of a location left out go now.
    takes: Takes,
    comments: Vec<String>,
    name: String,
    matcher: Vec<(String, Item)>,
    methods: Vec<String>,
    /// Everything after `match`.
    fields: Vec<(String, Item)>,
    limits: Vec<Listed>,
    /// Limits reached only through an override of one in `limits` (a tier).
    tiers: Vec<String>,
}

/// What the routes need from the rest of the import.
pub struct Context<'c, 'a> {
    pub http: &'c Http<'a>,
    pub listeners: &'c Listeners,
    /// The servers whose routes take requests for names no server lists, each for a
    /// scheme or both.
    pub catch_all: Vec<(usize, Option<Scheme>)>,
    pub limits: &'c mut Limits<'a>,
    pub upstreams: &'c mut Upstreams,
    /// `server.max_body_bytes` (`None`: unlimited).
    pub max_body: Option<u64>,
}

/// The `routes:` section.
pub fn section(cx: &mut Context<'_, '_>, notes: &mut Notes) -> Item {
    let servers = &cx.http.servers;
    let mut per_server = Vec::new();
    for server in servers {
        let templates = templates(cx, server, notes);
        for t in &templates {
            let listed: Vec<String> = t.limits.iter().map(|(name, _)| name.clone()).collect();
            tiers::check_overrides(cx.limits, &t.name, &listed, &t.tiers, &server.at, notes);
        }
        per_server.push(templates);
    }
    let mut exact = Vec::new();
    let mut wildcard = Vec::new();
    // One server alone takes every request, whatever its names.
    let mut taken: Vec<(&String, Option<Scheme>, usize)> = Vec::new();
    for i in (0..servers.len()).filter(|_| servers.len() > 1) {
        let scheme = cx.listeners.scheme(i);
        for name in cx.listeners.names(i) {
            // nginx refuses one name twice on an address: two servers share one only on
            // different addresses, which sluicegate's routes tell apart by scheme alone.
            let overlaps = |(n, s, _): &&(&String, Option<Scheme>, usize)| {
                *n == name && (s.is_none() || scheme.is_none() || *s == scheme)
            };
            if let Some(&(_, _, first)) = taken.iter().find(overlaps) {
                notes.left_out_at(
                    &servers[i].at,
                    "server_name",
                    format!("{name} is also the name of the server at {}: sluicegate routes by host and scheme, not by address, so that server's routes take it on every address where both answer", servers[first].at),
                );
                continue;
            }
            taken.push((name, scheme, i));
            let target = if name.starts_with("*.") { &mut wildcard } else { &mut exact };
            target.push((name.clone(), i));
        }
    }
    // nginx prefers an exact name, then the longest wildcard.
    wildcard.sort_by_key(|(name, _)| std::cmp::Reverse(name.len()));
    let mut routes = Vec::new();
    let hosts = exact.into_iter().chain(wildcard).map(|(host, i)| (Some(host), i, cx.listeners.scheme(i)));
    for (host, i, scheme) in hosts.chain(cx.catch_all.iter().map(|&(i, scheme)| (None, i, scheme))) {
        // The server's line above its first route: the others follow it.
        let server = &servers[i];
        let names = if server.names.is_empty() { String::new() } else { format!(" {}", server.names.join(" ")) };
        let label = format!(
            "{}: server{names}{}{}",
            server.at,
            host.as_ref().map_or(String::new(), |h| format!(", for {h}")),
            scheme.map_or(String::new(), |s| format!(", on its {s} addresses"))
        );
        for (n, t) in per_server[i].iter().enumerate() {
            let mut item = route(t, host.as_deref(), scheme);
            if n == 0 {
                item.comments.insert(0, label.clone());
            }
            routes.push(item);
        }
    }
    let mut seen: Vec<String> = Vec::new();
    for route in &mut routes {
        if let Value::Map(fields) = &mut route.value
            && let Some((_, Item { value: Value::Text(name), .. })) = fields.first_mut()
        {
            let base = name.clone();
            let mut n = 1;
            while seen.contains(name) {
                n += 1;
                *name = format!("{base}-{n}");
            }
            seen.push(name.clone());
        }
    }
    Value::List(routes).into()
}

/// A template given its host and scheme.
fn route(t: &Template, host: Option<&str>, scheme: Option<Scheme>) -> Item {
    let mut m = MapBuilder::default();
    let methods = if t.methods.is_empty() { String::new() } else { format!(" {}", t.methods.join(",")) };
    // `https://example.com/api/`, `http://*/` for any host: a name for each scheme.
    let name = match scheme {
        Some(s) => format!("{s}://{}{}{methods}", host.unwrap_or("*"), t.name),
        None => format!("{}{}{methods}", host.unwrap_or(""), t.name),
    };
    m.set("name", Item::text(name));
    let mut matcher: Vec<(String, Item)> = host.map(|h| ("host".to_owned(), Item::text(h))).into_iter().collect();
    matcher.extend(scheme.map(|s| ("scheme".to_owned(), Item::text(s.as_str()))));
    matcher.extend(t.matcher.iter().cloned());
    if !t.methods.is_empty() {
        matcher.push(("methods".into(), Item::texts(t.methods.clone())));
    }
    m.set("match", Value::Map(matcher).into());
    for (k, v) in &t.fields {
        m.set(k, v.clone());
    }
    if !t.limits.is_empty() {
        let entry = |(name, burst): &Listed| burst.map_or_else(|| Item::text(name.clone()), |b| b.entry(name));
        m.set("limits", Value::List(t.limits.iter().map(entry).collect()).into());
    }
    m.build().commented(t.comments.iter().cloned())
}

/// The routes of one server, in nginx's order of matching.
fn templates(cx: &mut Context<'_, '_>, server: &Server<'_>, notes: &mut Notes) -> Vec<Template> {
    let server_notes: Vec<String> = server.left_out.iter().map(|l| format!("left out: {l}")).collect();
    if let Some(ret) = server.ret {
        let mut comments =
            vec![format!("{}: {} (before any location: nginx answers every request with it)", ret.at, ret.text())];
        comments.extend(server_notes);
        return match respond(ret, &server.scope, notes) {
            Ok(respond) => vec![Template {
                takes: Takes::server_return(ret),
                comments,
                name: "/".into(),
                matcher: Vec::new(),
                methods: Vec::new(),
                fields: vec![("respond".into(), respond)],
                limits: Vec::new(),
                tiers: Vec::new(),
            }],
            Err(why) => {
                notes.left_out(ret, why);
                Vec::new()
            }
        };
    }
    let (mut out, mut left_out) = (Vec::new(), Vec::new());
    for (n, (location, skips)) in in_matching_order(&server.locations).into_iter().enumerate() {
        let mut made = match location_templates(cx, server, location, notes) {
            Ok(made) => made,
            Err(why) => {
                left_out.push((location, why));
                Vec::new()
            }
        };
        if let Some(under) = skips {
            for template in &mut made {
                template.comments.push(format!(
                    "under `location ^~ {under}`, which comes before the regular expressions: nginx tries them first \
                     for these paths, sluicegate does not"
                ));
            }
        }
        if n == 0
            && let Some(first) = made.first_mut()
        {
            first.comments.extend(server_notes.iter().cloned());
        }
        out.extend(made);
    }
    // Said once every route of the server is known: where its requests go instead.
    for (location, LeftOut { at, directive, why }) in left_out {
        let routes = out.iter().map(|t: &Template| (&t.takes, !t.methods.is_empty()));
        notes.left_out_at(&at, directive, format!("{why}; {}", destinations::destination(location, routes)));
    }
    out
}

/// Why a location makes no route: the directive that says so, and why.
struct LeftOut {
    at: At,
    directive: &'static str,
    why: String,
}

impl LeftOut {
    fn at(d: &Directive, why: impl Into<String>) -> LeftOut {
        let directive = match d.name.as_str() {
            "proxy_pass" => "proxy_pass",
            "return" => "return",
            _ => "location",
        };
        LeftOut { at: d.at.clone(), directive, why: why.into() }
    }
}

/// The locations of a server in the order whose first match is nginx's choice: exact
/// ones; then the prefixes, longest first, of those that win without the regular
/// expressions being tried (`^~`); the regular expressions in file order; the other
/// prefixes, longest first. A plain prefix that extends a `^~` one must come before it,
/// and so before the regular expressions, which nginx would try for its paths: it comes
/// with the `^~` prefix it lies under.
fn in_matching_order<'l, 'a>(locations: &'l [Location<'a>]) -> Vec<(&'l Location<'a>, Option<&'a str>)> {
    let first_prefixes: Vec<&str> = locations.iter().filter(|l| l.kind == Match::PrefixFirst).map(|l| l.path).collect();
    let any_regex = locations.iter().any(|l| matches!(l.kind, Match::Regex { .. }));
    let tier = |l: &Location<'a>| -> (u8, Option<&'a str>) {
        match l.kind {
            Match::Exact => (0, None),
            Match::PrefixFirst => (1, None),
            Match::Regex { .. } => (2, None),
            Match::Prefix => match first_prefixes.iter().find(|p| l.path.len() > p.len() && l.path.starts_with(**p)) {
                Some(under) => (1, any_regex.then_some(*under)),
                None => (3, None),
            },
        }
    };
    let mut ordered: Vec<_> = locations.iter().map(|l| (tier(l), l)).collect();
    // Stable: regular expressions keep their file order.
    ordered.sort_by_key(|((tier, _), l)| {
        let length = if matches!(l.kind, Match::Regex { .. }) { 0 } else { l.path.len() };
        (*tier, std::cmp::Reverse(length))
    });
    ordered.into_iter().map(|((_, under), l)| (l, under)).collect()
}

/// The route(s) of one location: one, or one per set of methods its limits tell apart;
/// or why it makes none.
fn location_templates(
    cx: &mut Context<'_, '_>,
    server: &Server<'_>,
    l: &Location<'_>,
    notes: &mut Notes,
) -> Result<Vec<Template>, LeftOut> {
    let d = l.directive;
    let mut comments = vec![format!("{}: {}", d.at, d.text())];
    comments.extend(l.left_out.iter().map(|line| format!("left out: {line}")));
    comments.extend(
        settings::note_location_settings(&l.scope, &server.scope, notes)
            .into_iter()
            .map(|line| format!("left out: {line}")),
    );
    let (path_field, name, path) = match l.kind {
        Match::Exact => ("path", format!("={}", l.path), l.path.to_owned()),
        Match::Prefix | Match::PrefixFirst => ("path_prefix", l.path.to_owned(), l.path.to_owned()),
        Match::Regex { caseless } => {
            // nginx's PCRE matches the decoded path's bytes, ASCII-only: `\d` is `[0-9]`,
            // `\w`, `\s`, `\b` and `(?i)` know no other letters, `.` is one byte. The
            // router matches bytes too, and `(?-u)` gives every one of those that meaning.
            let pattern = format!("(?{}-u){}", if caseless { "i" } else { "" }, l.path);
            if let Err(why) = crate::router::PathRegex::new(&pattern) {
                return Err(LeftOut::at(
                    d,
                    format!("{why}; sluicegate's regular expressions match in linear time, without it"),
                ));
            }
            ("path_regex", format!("~{} {}", if caseless { "*" } else { "" }, l.path), pattern)
        }
    };
    let matcher = vec![(path_field.to_owned(), Item::text(&path))];
    let template = |comments: Vec<String>, fields: Vec<(String, Item)>| Template {
        takes: Takes::location(l, !fields.iter().any(|(k, _)| k == "respond")),
        comments,
        name: name.clone(),
        matcher: matcher.clone(),
        methods: Vec::new(),
        fields,
        limits: Vec::new(),
        tiers: Vec::new(),
    };
    if let Some(ret) = l.ret {
        if let Some(d) = l.scope.one("expires").filter(|d| d.args != ["off"]) {
            comments.push(format!(
                "left out: {}",
                notes.left_out(d, "on a `return`: sluicegate's `respond` sets no Expires")
            ));
        }
        return match respond(ret, &l.scope, notes) {
            Ok(respond) => {
                comments.push(format!(
                    "{}: {}: nginx answers before limit_req and limit_conn run, so no limits",
                    ret.at,
                    ret.text()
                ));
                Ok(vec![template(comments, vec![("respond".into(), respond)])])
            }
            Err(why) => Err(LeftOut::at(ret, why)),
        };
    }
    let Some(proxy_pass) = l.proxy_pass else {
        return Err(LeftOut::at(d, "neither proxy_pass nor return: sluicegate serves no files, so no route is made"));
    };
    let target = cx.upstreams.target(proxy_pass, &l.scope, notes).map_err(|why| LeftOut::at(proxy_pass, why))?;
    let mut fields = vec![("upstream".to_owned(), Item::text(target.upstream.clone()))];
    if let Some(uri) = &target.uri {
        if let Match::Regex { .. } = l.kind {
            return Err(LeftOut::at(
                proxy_pass,
                "a URI part in a regular-expression location, which nginx itself refuses",
            ));
        }
        fields.extend(path_rewrite(l, uri));
    }
    let (request, mut header_notes) = request_headers(&l.scope, &target.proxy_host, notes);
    fields.extend(request);
    let (response, response_notes) = response_headers(&l.scope, notes);
    header_notes.extend(response_notes);
    if !response.is_empty() {
        fields.push(("set_response_headers".into(), Value::Map(response).into()));
    }
    match settings::max_body(&l.scope) {
        Ok(bytes) if Some(bytes) == cx.max_body || (bytes == 0 && cx.max_body.is_none()) => {}
        Ok(0) => header_notes.push(notes.left_out(
            l.scope.one("client_max_body_size").unwrap_or(d),
            "unlimited here, where every other route has a limit: sluicegate routes can change it but not lift it",
        )),
        Ok(bytes) => fields.push(("max_body_bytes".into(), Item::text(values::size_text(bytes)))),
        Err(why) => header_notes.push(notes.left_out(l.scope.one("client_max_body_size").unwrap_or(d), why)),
    }
    match settings::body_rate(&l.scope) {
        Ok(Some(rate)) => fields.push(("response_body_rate".into(), rate)),
        Ok(None) => {}
        Err((at, why)) => header_notes.push(notes.left_out(at, why)),
    }
    match settings::expires(&l.scope) {
        Ok(Some(expires)) => fields.push(("expires".into(), expires)),
        Ok(None) => {}
        Err((at, why)) => header_notes.push(notes.left_out(at, why)),
    }
    comments.extend(header_notes.into_iter().map(|line| format!("left out: {line}")));
    let (applied, limit_notes) = cx.limits.apply(&l.scope, notes);
    comments.extend(limit_notes.into_iter().map(|line| format!("left out: {line}")));
    let (applied, tiers) = tiers::pair_tiers(cx.limits, applied, notes, &mut comments);
    for a in &applied {
        if a.key.vars.contains(&Var::ServerName) && server.names.len() != 1 {
            comments.push(format!("left out: {}", notes.left_out_at(&a.at, a.directive, "$server_name is the server's first name in nginx; sluicegate keys on the host asked for, which differs for a server with other names")));
        }
    }
    Ok(tiers::split_by_methods(&applied)
        .into_iter()
        .map(|(methods, limits)| Template {
            methods,
            limits,
            tiers: tiers.clone(),
            ..template(comments.clone(), fields.clone())
        })
        .collect())
}

/// The URI part of `proxy_pass` as `strip_prefix` or `rewrite`.
fn path_rewrite(l: &Location<'_>, uri: &str) -> Vec<(String, Item)> {
    let prefix = matches!(l.kind, Match::Prefix | Match::PrefixFirst);
    if prefix && uri == "/" && l.path.ends_with('/') {
        return vec![("strip_prefix".into(), Item::bool(true))];
    }
    let mut rewrite = MapBuilder::default();
    rewrite.set("prefix", Item::text(l.path)).set("to", Item::text(uri));
    let mut item = rewrite.build();
    if uri.ends_with('/') && !l.path.ends_with('/') && prefix {
        item = item.commented([format!("nginx sent {uri}/x for {}/x (two slashes); sluicegate sends {uri}x", l.path)]);
    }
    vec![("rewrite".into(), item)]
}

/// `proxy_set_header` in force: fields set and removed, the `Host` sent. Fields that
/// sluicegate sets itself (`X-Forwarded-*`, the upgrade fields) need nothing.
fn request_headers(scope: &Scope<'_>, proxy_host: &str, notes: &mut Notes) -> (Vec<(String, Item)>, Vec<String>) {
    let (mut set, mut remove, mut lines) = (Vec::new(), Vec::new(), Vec::new());
    // nginx sends `Host: $proxy_host` unless told otherwise.
    let mut host = Some(
        Item::text(proxy_host)
            .commented(["nginx sends the proxy_pass host unless proxy_set_header Host says otherwise".to_owned()]),
    );
    for d in scope.all("proxy_set_header") {
        let [name, value] = &d.args[..] else {
            lines.push(notes.left_out(d, "expected `proxy_set_header NAME VALUE`"));
            continue;
        };
        let lower = name.to_ascii_lowercase();
        match (lower.as_str(), value.as_str()) {
            ("host", "$http_host") => host = None,
            ("host", "$host") => host = Some(Item::text("keep_name")),
            ("host", "$proxy_host") => {}
            ("host", v) if !v.contains('$') => host = Some(Item::text(v)),
            ("x-forwarded-for", "$proxy_add_x_forwarded_for" | "$remote_addr")
            | ("x-forwarded-proto", "$scheme")
            | ("x-forwarded-host", "$host" | "$http_host")
            | ("upgrade", "$http_upgrade")
            | ("connection", "$connection_upgrade" | "upgrade" | "") => {}
            (_, "") => remove.push(lower),
            (_, v) => match values::field_value(v) {
                Some(value) => set.push((lower, Item::text(value))),
                None => lines.push(notes.left_out(d, "values made of variables are not converted")),
            },
        }
    }
    let mut fields = Vec::new();
    if !set.is_empty() {
        fields.push(("set_request_headers".to_owned(), Value::Map(set).into()));
    }
    if !remove.is_empty() {
        fields.push(("remove_request_headers".to_owned(), Item::texts(remove)));
    }
    if let Some(host) = host {
        fields.push(("upstream_host".to_owned(), host));
    }
    (fields, lines)
}

/// `add_header` in force, as fields set on responses.
fn response_headers(scope: &Scope<'_>, notes: &mut Notes) -> (Vec<(String, Item)>, Vec<String>) {
    let (mut set, mut lines) = (Vec::new(), Vec::new());
    for d in scope.all("add_header") {
        match &d.args[..] {
            [name, value, ..] => match values::field_value(value) {
                Some(value) => set.push((name.to_ascii_lowercase(), Item::text(value))),
                None => lines.push(notes.left_out(d, "values made of variables are not converted")),
            },
            _ => lines.push(notes.left_out(d, "expected `add_header NAME VALUE [always]`")),
        }
    }
    (set, lines)
}

/// `return` as `respond`, or why it cannot be one.
fn respond(d: &Directive, scope: &Scope<'_>, notes: &mut Notes) -> Result<Item, String> {
    let (code, rest) = match &d.args[..] {
        [url] if url.starts_with("http://") || url.starts_with("https://") || url.starts_with("$scheme") => {
            (302, Some(url))
        }
        [code] => (code.parse().map_err(|_| format!("{code}: expected a status"))?, None),
        [code, rest] => (code.parse().map_err(|_| format!("{code}: expected a status"))?, Some(rest)),
        _ => return Err("expected `return CODE [TEXT|URL]`".into()),
    };
    if code == 444 {
        return Err("444 (close the connection without answering) is not supported".into());
    }
    let mut m = MapBuilder::default();
    m.set("status", Item::int(code));
    let (mut headers, _) = response_headers(scope, notes);
    match rest {
        Some(url) if matches!(code, 301 | 302 | 303 | 307 | 308) => {
            let url = values::field_value(url).ok_or("a URL made of other variables is not converted")?;
            headers.push(("location".into(), Item::text(url)));
        }
        Some(text) if text.contains('$') => return Err("a text made of variables is not converted".into()),
        Some(text) => {
            m.set("body", Item::text(text.clone()));
        }
        None => {}
    }
    if !headers.is_empty() {
        m.set("headers", Value::Map(headers).into());
    }
    Ok(m.build())
}
