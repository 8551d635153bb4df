//! Keys: what an nginx variable names in a request (`$binary_remote_addr` is `ip`,
//! `$http_x_api_key` is `header:x-api-key`), concatenations of them (a tuple key), and
//! the allow-list idiom where a `geo` or `map` gives trusted requests an empty key,
//! which nginx does not count.

use std::collections::BTreeMap;

use super::syntax::Directive;

/// A part of the request a variable reads.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Var {
    Ip,
    Header(String),
    Cookie(String),
    Arg(String),
    Host,
    /// `$server_name`: the server's first name, where sluicegate has the requested host.
    ServerName,
    Path,
    Method,
}

impl Var {
    fn builtin(name: &str) -> Option<Var> {
        Some(match name {
            "binary_remote_addr" | "remote_addr" => Var::Ip,
            "host" => Var::Host,
            "server_name" => Var::ServerName,
            "uri" | "document_uri" => Var::Path,
            "request_method" => Var::Method,
            _ => {
                if let Some(h) = name.strip_prefix("http_") {
                    Var::Header(h.replace('_', "-").to_ascii_lowercase())
                } else if let Some(c) = name.strip_prefix("cookie_") {
                    Var::Cookie(c.to_owned())
                } else if let Some(a) = name.strip_prefix("arg_") {
                    Var::Arg(a.to_owned())
                } else {
                    return None;
                }
            }
        })
    }

    /// The key part sluicegate writes for it.
    pub fn key_part(&self) -> String {
        match self {
            Var::Ip => "ip".into(),
            Var::Header(name) => format!("header:{name}"),
            Var::Cookie(name) => format!("cookie:{name}"),
            Var::Arg(name) => format!("query:{name}"),
            Var::Host | Var::ServerName => "host".into(),
            Var::Path => "path".into(),
            Var::Method => "method".into(),
        }
    }
}

/// A piece of a value: text, a variable the request defines, or one a `map`, `geo` or
/// something else sets (by name).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Var(Var),
    Named(String),
}

/// `$a:${b}c` into its parts.
fn parts(value: &str) -> Vec<Part> {
    let mut out = Vec::new();
    let mut rest = value;
    while let Some(i) = rest.find('$') {
        if i > 0 {
            out.push(Part::Text(rest[..i].to_owned()));
        }
        let after = &rest[i + 1..];
        let (name, next) = match after.strip_prefix('{').and_then(|a| a.split_once('}')) {
            Some((name, next)) => (name, next),
            None => {
                let end = after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(after.len());
                after.split_at(end)
            }
        };
        if name.is_empty() {
            out.push(Part::Text("$".into()));
        } else {
            out.push(Var::builtin(name).map_or_else(|| Part::Named(name.to_owned()), Part::Var));
        }
        rest = next;
    }
    if !rest.is_empty() {
        out.push(Part::Text(rest.to_owned()));
    }
    out
}

/// What tells exempted (or, for a tier, counted) requests apart.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Matcher {
    /// A client address or network, as nginx's `geo` writes it.
    Net(String),
    Header(String, String),
    /// `Authorization: Bearer TOKEN`.
    Token(String),
    Method(String),
}

/// A limit's key, as sluicegate counts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    pub vars: Vec<Var>,
    /// Text beside the variables: nginx's key is then never empty.
    pub has_text: bool,
    /// Requests the key leaves out (an empty key in nginx): an allow-list.
    pub exempt: Vec<Matcher>,
    /// `Some`: only these requests are counted (the map's default is empty).
    pub only: Option<Vec<Matcher>>,
}

impl Key {
    /// `ip`, or `[ip, "header:x"]`.
    pub fn spec(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for part in self.vars.iter().map(Var::key_part) {
            if !out.contains(&part) {
                out.push(part);
            }
        }
        out
    }
}

/// The `map` and `geo` blocks, by the variable each sets.
pub struct Variables<'a> {
    by_name: BTreeMap<&'a str, &'a Directive>,
}

/// A `map` or `geo` resolved: what it reads, its default and its entries, each value
/// already split into parts.
struct Table {
    source: Source,
    default: Vec<Part>,
    entries: Vec<(String, Vec<Part>)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    /// The client address (`geo`), matched by network.
    Net,
    /// A request variable, matched by exact value (nginx compares ignoring case).
    Var(Var),
}

impl<'a> Variables<'a> {
    pub fn new(blocks: &[&'a Directive]) -> Self {
        let by_name = blocks.iter().filter_map(|d| Some((d.args.last()?.strip_prefix('$')?, *d))).collect();
        Variables { by_name }
    }

    /// The key of `limit_req_zone KEY` / `limit_conn_zone KEY`, or why it is left out.
    pub fn key(&self, text: &str) -> Result<Key, String> {
        let parts = parts(text);
        if let [Part::Named(name)] = &parts[..] {
            let table = self.table(name, 0)?;
            return selected_key(name, &table);
        }
        plain_key(&parts)
    }

    /// The `map` or `geo` that sets `$name`; `depth` bounds chains of maps.
    fn table(&self, name: &str, depth: usize) -> Result<Table, String> {
        let d = self
            .by_name
            .get(name)
            .ok_or_else(|| format!("${name} is not converted (only request variables, and maps and geos of them)"))?;
        if depth > 8 {
            return Err(format!("${name}: maps of maps nest too deep"));
        }
        match d.name.as_str() {
            "geo" => geo(d),
            _ => self.map(d, depth),
        }
    }

    fn map(&self, d: &Directive, depth: usize) -> Result<Table, String> {
        let [source, _] = &d.args[..] else { return Err("map: expected `map $source $variable`".into()) };
        let (mut default, mut entries) = (Vec::new(), Vec::new());
        for entry in d.block() {
            match (entry.name.as_str(), &entry.args[..]) {
                ("default", [value]) => default = parts(value),
                ("volatile", []) => {}
                ("hostnames", []) => return Err(format!("map of ${}: hostnames matching is not converted", d.args[1])),
                (m, [_]) if m.starts_with('~') => {
                    return Err(format!("map of {source}: regular expressions ({m}) are not converted"));
                }
                (m, [value]) => entries.push((m.strip_prefix('\\').unwrap_or(m).to_owned(), parts(value))),
                _ => return Err(format!("map of {source}: {}: expected `VALUE RESULT`", entry.at)),
            }
        }
        match &parts(source)[..] {
            [Part::Var(var)] => {
                let source = if *var == Var::Ip { Source::Net } else { Source::Var(var.clone()) };
                Ok(Table { source, default, entries })
            }
            // A map of a map or geo: each entry of the inner one, looked up in this one.
            [Part::Named(inner)] => {
                let inner = self.table(inner, depth + 1)?;
                let look = |value: &[Part]| -> Result<Vec<Part>, String> {
                    let text =
                        literal(value).ok_or_else(|| format!("map of {source}: its values must be plain text"))?;
                    let found = entries.iter().find(|(m, _)| m.eq_ignore_ascii_case(&text));
                    Ok(found.map_or_else(|| default.clone(), |(_, v)| v.clone()))
                };
                let entries =
                    inner.entries.iter().map(|(m, v)| Ok((m.clone(), look(v)?))).collect::<Result<_, String>>()?;
                Ok(Table { source: inner.source, default: look(&inner.default)?, entries })
            }
            _ => Err(format!("map of {source}: only maps of one variable are converted")),
        }
    }
}

fn geo(d: &Directive) -> Result<Table, String> {
    let source = match &d.args[..] {
        [_] => Source::Net,
        [source, _] if matches!(parts(source)[..], [Part::Var(Var::Ip)]) => Source::Net,
        _ => return Err(format!("geo {}: only geo of the client address is converted", d.args.join(" "))),
    };
    let (mut default, mut entries) = (Vec::new(), Vec::new());
    for entry in d.block() {
        match (entry.name.as_str(), &entry.args[..]) {
            // geo values are text: `$` in them is no variable.
            ("default", [value]) => default = vec![Part::Text(value.clone())],
            (p @ ("ranges" | "proxy" | "proxy_recursive" | "delete"), _) => {
                return Err(format!("geo: {p} is not converted ({})", entry.at));
            }
            (net, [value]) => entries.push((net.to_owned(), vec![Part::Text(value.clone())])),
            _ => return Err(format!("geo: {}: expected `NETWORK VALUE`", entry.at)),
        }
    }
    Ok(Table { source, default, entries })
}

/// The text of `value` when it has no variable.
fn literal(value: &[Part]) -> Option<String> {
    value.iter().map(|p| if let Part::Text(t) = p { Some(t.as_str()) } else { None }).collect()
}

/// A key made of request variables and text.
fn plain_key(parts: &[Part]) -> Result<Key, String> {
    let mut key = Key { vars: Vec::new(), has_text: false, exempt: Vec::new(), only: None };
    for part in parts {
        match part {
            Part::Text(t) => key.has_text |= !t.is_empty(),
            Part::Var(v) => key.vars.push(v.clone()),
            Part::Named(name) => {
                return Err(format!("${name} is not converted (only request variables, and maps and geos of them)"));
            }
        }
    }
    if key.vars.is_empty() {
        return Err(
            "a key without variables is one state shared by every request; sluicegate keys name a part of the request"
                .into(),
        );
    }
    Ok(key)
}

/// The key a `map`/`geo` gives: one expression for the requests it counts, an empty
/// value for the others.
fn selected_key(name: &str, table: &Table) -> Result<Key, String> {
    let counted: Vec<&Vec<Part>> =
        std::iter::once(&table.default).chain(table.entries.iter().map(|(_, v)| v)).filter(|v| !is_empty(v)).collect();
    let Some(first) = counted.first() else {
        return Err(format!("${name} is empty for every request: nginx never counts any"));
    };
    if counted.iter().any(|v| v != first) {
        return Err(format!(
            "${name} gives different keys to different requests; only an empty key (not counted) or one key is converted"
        ));
    }
    let mut key = plain_key(first)?;
    let matcher = |m: &String| matcher(&table.source, m);
    if is_empty(&table.default) {
        let only = table.entries.iter().filter(|(_, v)| !is_empty(v)).map(|(m, _)| matcher(m));
        key.only = Some(only.collect::<Result<_, _>>()?);
    } else {
        let exempt = table.entries.iter().filter(|(_, v)| is_empty(v)).map(|(m, _)| matcher(m));
        key.exempt = exempt.collect::<Result<_, _>>()?;
    }
    Ok(key)
}

fn is_empty(value: &[Part]) -> bool {
    value.iter().all(|p| matches!(p, Part::Text(t) if t.is_empty()))
}

/// How sluicegate tells the requests of one entry apart.
fn matcher(source: &Source, value: &str) -> Result<Matcher, String> {
    Ok(match source {
        Source::Net => Matcher::Net(value.to_owned()),
        Source::Var(Var::Header(h)) if h == "authorization" => match value.split_once(' ') {
            Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => Matcher::Token(token.to_owned()),
            _ => Matcher::Header(h.clone(), value.to_owned()),
        },
        Source::Var(Var::Header(h)) => Matcher::Header(h.clone(), value.to_owned()),
        Source::Var(Var::Method) => Matcher::Method(value.to_ascii_uppercase()),
        Source::Var(var) => {
            return Err(format!(
                "requests told apart by {} cannot be exempted (allow-lists match addresses, headers and tokens)",
                var.key_part()
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::import::syntax::parse;

    fn key_of(conf: &str, key: &str) -> Result<Key, String> {
        let tree = parse(conf, &Arc::from("t")).unwrap();
        let blocks: Vec<&Directive> = tree.iter().collect();
        Variables::new(&blocks).key(key)
    }

    #[test]
    fn request_variables_and_their_concatenations_are_key_parts() {
        let key = key_of("", "$binary_remote_addr$http_x_api_key").unwrap();
        assert_eq!(key.spec(), ["ip", "header:x-api-key"]);
        assert!(!key.has_text);
        let key = key_of("", "$cookie_sid:${arg_user}/$uri$request_method$host").unwrap();
        assert_eq!(key.spec(), ["cookie:sid", "query:user", "path", "method", "host"]);
        assert!(key.has_text);
        assert!(key_of("", "$request_uri").unwrap_err().contains("$request_uri is not converted"));
        assert!(key_of("", "global").unwrap_err().contains("without variables"));
    }

    #[test]
    fn a_geo_then_map_giving_trusted_networks_an_empty_key_is_an_allow_list() {
        let conf = "geo $limited { default 1; 10.0.0.0/8 0; 192.168.1.7 0; }\n\
                    map $limited $limit_key { 0 \"\"; 1 $binary_remote_addr; }";
        let key = key_of(conf, "$limit_key").unwrap();
        assert_eq!(key.spec(), ["ip"]);
        assert_eq!(key.exempt, [Matcher::Net("10.0.0.0/8".into()), Matcher::Net("192.168.1.7".into())]);
        assert_eq!(key.only, None);
    }

    #[test]
    fn a_map_of_a_header_gives_exempt_values_or_the_only_values_counted() {
        let conf = "map $http_x_api_key $free { default $http_x_api_key; gold-1 \"\"; }\n\
                    map $http_x_api_key $gold { default \"\"; gold-1 $http_x_api_key; }\n\
                    map $http_authorization $partner { default $binary_remote_addr; \"Bearer p1\" \"\"; }\n\
                    map $request_method $post { default \"\"; POST $binary_remote_addr; }";
        let free = key_of(conf, "$free").unwrap();
        assert_eq!(
            (free.spec(), free.exempt),
            (vec!["header:x-api-key".to_owned()], vec![Matcher::Header("x-api-key".into(), "gold-1".into())])
        );
        let gold = key_of(conf, "$gold").unwrap();
        assert_eq!(gold.only, Some(vec![Matcher::Header("x-api-key".into(), "gold-1".into())]));
        assert_eq!(key_of(conf, "$partner").unwrap().exempt, [Matcher::Token("p1".into())]);
        assert_eq!(key_of(conf, "$post").unwrap().only, Some(vec![Matcher::Method("POST".into())]));
    }

    #[test]
    fn maps_that_cannot_be_expressed_say_why() {
        let conf = "map $http_x $two { default $binary_remote_addr; a $http_x; }\n\
                    map $uri $re { default $binary_remote_addr; ~^/a \"\"; }\n\
                    map $cookie_c $byc { default $binary_remote_addr; v \"\"; }\n\
                    geo $g { ranges; default 1; }\n";
        assert!(key_of(conf, "$two").unwrap_err().contains("different keys"));
        assert!(key_of(conf, "$re").unwrap_err().contains("regular expressions"));
        assert!(key_of(conf, "$byc").unwrap_err().contains("cannot be exempted"));
        assert!(key_of(conf, "$g").unwrap_err().contains("ranges"));
    }
}
