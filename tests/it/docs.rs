//! README and the pages of `docs/` hold together: every heading is reachable from a
//! contents list (README's lists every page, each page its own headings), every link
//! between them finds its page and heading, and every configuration option they name
//! (`admin.hosts`, `routes[i].upstream_hold`, `limits.NAME.charge`) is one the
//! configuration's JSON Schema has: the schema is derived from the types that parse the
//! file, so a renamed or removed field makes the documentation that names it fail here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use regex::Regex;
use serde_json::Value;

/// README and every page of `docs/`, by their path from the repository's root
/// (`README.md`, `docs/limits.md`).
fn pages() -> BTreeMap<String, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages = BTreeMap::new();
    pages.insert("README.md".to_owned(), std::fs::read_to_string(root.join("README.md")).unwrap());
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            let name = format!("docs/{}", path.file_name().unwrap().to_str().unwrap());
            pages.insert(name, std::fs::read_to_string(&path).unwrap());
        }
    }
    assert!(pages.len() >= 10, "README and the docs pages: {:?}", pages.keys());
    pages
}

/// The text of `page` outside fenced code blocks, whose `#` lines are no headings and
/// whose brackets are no links.
fn prose(page: &str) -> String {
    let mut fenced = false;
    let mut kept = String::new();
    for line in page.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    kept
}

/// The anchor GitHub makes of a heading: its text as rendered (no backticks, a link's
/// text alone), in lower case, without punctuation but `-` and `_`, spaces as `-`.
fn anchor(heading: &str) -> String {
    let link = Regex::new(r"\[([^\]]*)\]\([^)]*\)").unwrap();
    link.replace_all(heading, "$1")
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of the page's headings of level 2 and below (the title is the page's
/// own), in order; a repeated one gets `-1`, `-2`… as on GitHub.
fn anchors(page: &str) -> Vec<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut found = Vec::new();
    for line in prose(page).lines() {
        let Some(text) = line.strip_prefix("##").map(|rest| rest.trim_start_matches('#')) else { continue };
        let Some(text) = text.strip_prefix(' ') else { continue };
        let plain = anchor(text);
        let n = seen.entry(plain.clone()).or_default();
        found.push(if *n == 0 { plain } else { format!("{plain}-{n}") });
        *n += 1;
    }
    found
}

/// The targets of the links in `text` (`limits.md#keys`, `#paths`), inline code
/// left out; a link's text may run over lines.
fn links(text: &str) -> Vec<String> {
    let code = Regex::new(r"`[^`]*`").unwrap();
    let link = Regex::new(r"\[[^\]]*\]\(([^)\s]+)\)").unwrap();
    let text = code.replace_all(text, "");
    link.captures_iter(&text).map(|c| c[1].to_owned()).collect()
}

/// A page's contents list: the list under its `**Contents**` line, up to the blank line
/// that ends it.
fn contents(name: &str, page: &str) -> String {
    let mut lines = page.lines().skip_while(|l| *l != "**Contents**");
    assert!(lines.next().is_some(), "{name} has no **Contents** list");
    lines
        .skip_while(|l| l.is_empty())
        .take_while(|l| l.starts_with("- ") || l.starts_with("  "))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Where a link of the page `from` leads: the page's path from the root (or `from`
/// itself for `#anchor`), and the anchor if any.
fn target(from: &str, link: &str) -> (String, Option<String>) {
    let (path, anchor) = match link.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor.to_owned())),
        None => (link, None),
    };
    if path.is_empty() {
        return (from.to_owned(), anchor);
    }
    let mut joined = PathBuf::new();
    for part in Path::new(from).parent().unwrap().join(path).components() {
        match part {
            Component::ParentDir => assert!(joined.pop(), "{from}: {link} leads out of the repository"),
            Component::CurDir => {}
            other => joined.push(other),
        }
    }
    (joined.to_str().unwrap().to_owned(), anchor)
}

#[test]
fn every_heading_is_in_its_pages_contents_and_every_page_in_readmes() {
    let pages = pages();
    let mut unlisted = Vec::new();
    for (name, page) in &pages {
        let listed: BTreeSet<String> = links(&contents(name, page))
            .into_iter()
            .map(|link| target(name, &link))
            .map(|(p, a)| format!("{p}#{}", a.unwrap_or_default()))
            .collect();
        for anchor in anchors(page) {
            if !listed.contains(&format!("{name}#{anchor}")) {
                unlisted.push(format!("{name}#{anchor}"));
            }
        }
        if name == "README.md" {
            for page in pages.keys().filter(|p| p.starts_with("docs/")) {
                if !listed.contains(&format!("{page}#")) {
                    unlisted.push(format!("README.md's contents: {page}"));
                }
            }
        }
    }
    assert!(unlisted.is_empty(), "headings and pages no contents list reaches: {unlisted:#?}");
}

#[test]
fn every_link_between_readme_and_the_docs_finds_its_page_and_heading() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let pages = pages();
    let anchors: BTreeMap<&str, Vec<String>> = pages.iter().map(|(n, p)| (n.as_str(), anchors(p))).collect();
    let mut broken = Vec::new();
    let mut checked = 0;
    for (name, page) in &pages {
        for link in links(&prose(page)) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = target(name, &link);
            if !root.join(&path).exists() {
                broken.push(format!("{name}: {link}: no file {path}"));
            } else if let Some(anchor) = anchor {
                match anchors.get(path.as_str()) {
                    Some(known) if known.contains(&anchor) => {}
                    Some(_) => broken.push(format!("{name}: {link}: {path} has no heading #{anchor}")),
                    None => broken.push(format!("{name}: {link}: {path} is not a page of README or docs/")),
                }
            }
        }
    }
    assert!(checked >= 200, "only {checked} links found");
    assert!(broken.is_empty(), "{broken:#?}");
}

/// The configuration's JSON Schema, with `$ref`s to its definitions.
struct Schema(Value);

impl Schema {
    fn load() -> Schema {
        Schema(serde_json::from_str(&sluicegate::config::schema()).unwrap())
    }

    /// `node` and every schema it stands for through `$ref`, `anyOf`, `oneOf`, `allOf`
    /// (an `Option`, an untagged enum such as a window that is a length or a calendar).
    fn alternatives<'a>(&'a self, node: &'a Value, depth: usize, found: &mut Vec<&'a Value>) {
        found.push(node);
        if depth > 16 {
            return;
        }
        let reference = node.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix("#/$defs/"));
        if let Some(def) = reference.and_then(|name| self.0.get("$defs")?.get(name)) {
            self.alternatives(def, depth + 1, found);
        }
        for list in ["anyOf", "oneOf", "allOf"] {
            for sub in node.get(list).and_then(Value::as_array).into_iter().flatten() {
                self.alternatives(sub, depth + 1, found);
            }
        }
    }

    /// What `segment` of a path leads to from `nodes`: a field of an object, any name
    /// of a map (`limits.NAME`, `upstreams.app`), an item of a list (`[i]`, `[0]`).
    fn step<'a>(&'a self, nodes: &[&'a Value], segment: &str) -> Vec<&'a Value> {
        let mut next = Vec::new();
        for node in nodes {
            let mut alternatives = Vec::new();
            self.alternatives(node, 0, &mut alternatives);
            for alternative in alternatives {
                if segment.starts_with('[') {
                    next.extend(alternative.get("items").filter(|i| i.is_object()));
                    continue;
                }
                let properties = alternative.get("properties").and_then(Value::as_object);
                next.extend(properties.and_then(|p| p.get(segment)));
                let map = alternative.get("additionalProperties").filter(|a| a.is_object());
                next.extend(map.filter(|_| properties.is_none()));
            }
        }
        next
    }

    /// Whether the path (`routes[i].match.path`) leads anywhere from `from`.
    fn has<'a>(&'a self, from: &'a Value, path: &str) -> bool {
        let mut nodes = vec![from];
        for segment in segments(path) {
            nodes = self.step(&nodes, segment);
            if nodes.is_empty() {
                return false;
            }
        }
        true
    }

    fn top_level(&self) -> BTreeSet<&str> {
        self.0["properties"].as_object().unwrap().keys().map(String::as_str).collect()
    }

    /// Every object the schema describes anywhere, for paths written from within one
    /// (`match.path_prefix`, `health_check.path`).
    fn objects(&self) -> Vec<&Value> {
        let mut found = Vec::new();
        let mut queue = vec![&self.0];
        let mut seen = BTreeSet::new();
        while let Some(node) = queue.pop() {
            let mut alternatives = Vec::new();
            self.alternatives(node, 0, &mut alternatives);
            for alternative in alternatives {
                if !seen.insert(alternative as *const Value) {
                    continue;
                }
                if let Some(properties) = alternative.get("properties").and_then(Value::as_object) {
                    found.push(alternative);
                    queue.extend(properties.values());
                }
                queue.extend(alternative.get("additionalProperties").filter(|a| a.is_object()));
                queue.extend(alternative.get("items").filter(|i| i.is_object()));
            }
        }
        found
    }
}

/// `routes[i].match.path` as `routes`, `[i]`, `match`, `path`.
fn segments(path: &str) -> impl Iterator<Item = &str> {
    Regex::new(r"\[[^\]]*\]|[^.\[\]]+").unwrap().find_iter(path).map(|m| m.as_str()).collect::<Vec<_>>().into_iter()
}

/// The backticked words of `text` written as configuration paths: lower-case names
/// joined by `.` or followed by `[i]` (`persist.dir`, `limits.NAME.charge.default`),
/// without the file names that look alike (`server.rs`, `keys.secret`).
fn option_paths(text: &str) -> Vec<&str> {
    let path = Regex::new(r"`([a-z_]+(?:\[[a-z0-9]*\]|\.[A-Za-z0-9_]+)+)`").unwrap();
    let file = Regex::new(r"\.(rs|lua|md|ya?ml|json|toml|sh|svg|secret|state|conf|log|service)$").unwrap();
    path.captures_iter(text).map(|c| c.get(1).unwrap().as_str()).filter(|p| !file.is_match(p)).collect()
}

#[test]
fn readme_and_the_docs_name_only_options_the_configuration_has() {
    let schema = Schema::load();
    let top = schema.top_level();
    let objects = schema.objects();
    let fields: BTreeSet<&str> =
        objects.iter().flat_map(|o| o["properties"].as_object().unwrap().keys().map(String::as_str)).collect();
    let mut unknown = Vec::new();
    let (mut whole, mut relative) = (0, 0);
    for (name, page) in pages() {
        for path in option_paths(&page) {
            let first = segments(path).next().unwrap();
            if top.contains(first) {
                // Written from the top: `admin.hosts`, `routes[i].upstream_hold`.
                whole += 1;
                if !schema.has(&schema.0, path) {
                    unknown.push(format!("{name}: `{path}`"));
                }
            } else if fields.contains(first) {
                // Written from within an object: `match.path_prefix`, `tls.ca_file`.
                relative += 1;
                if !objects.iter().any(|o| schema.has(o, path)) {
                    unknown.push(format!("{name}: `{path}` (from within an object)"));
                }
            }
        }
    }
    assert!(whole >= 150 && relative >= 10, "only {whole} paths and {relative} relative ones found");
    assert!(unknown.is_empty(), "options the configuration does not have: {unknown:#?}");
}

/// A row of the reference names a field's siblings after it (`listen[i].tls.cert`,
/// `.key`; `limits.NAME.window.calendar`, `tz`, `reset_day`): each is a field too.
#[test]
fn every_row_of_the_configuration_reference_names_fields_the_configuration_has() {
    let schema = Schema::load();
    let top = schema.top_level();
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md")).unwrap();
    let code = Regex::new(r"`([^`]+)`").unwrap();
    let mut unknown = Vec::new();
    let mut rows = 0;
    for row in page.lines().filter(|l| l.starts_with("| `")) {
        rows += 1;
        let key = row.trim_start_matches("| ").split(" | ").next().unwrap();
        let mut names = code.captures_iter(key).map(|c| c.get(1).unwrap().as_str());
        let first = names.next().unwrap();
        let parent = first.rsplit_once('.').map_or("", |(parent, _)| parent);
        for name in std::iter::once(first).chain(names) {
            let name = name.trim_start_matches('.');
            let path = match segments(name).next() {
                Some(s) if top.contains(s) => name.to_owned(),
                _ => format!("{parent}.{name}"),
            };
            if !schema.has(&schema.0, &path) {
                unknown.push(format!("`{path}` in {row}"));
            }
        }
    }
    assert!(rows >= 100, "only {rows} rows");
    assert!(unknown.is_empty(), "{unknown:#?}");
}
