//! The YAML the import writes: a small tree of values, each with the comments that go
//! above it, rendered in block style (short maps and lists of plain values in flow
//! style), so that a reader finds the nginx `FILE:LINE` above every limit and route.
//! Written by hand because no serializer places comments.

/// A value and the comment lines above it.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    pub comments: Vec<String>,
    pub value: Value,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Text(String),
    Int(u64),
    Bool(bool),
    List(Vec<Item>),
    Map(Vec<(String, Item)>),
}

impl Item {
    pub fn text(s: impl Into<String>) -> Item {
        Value::Text(s.into()).into()
    }

    pub fn int(n: u64) -> Item {
        Value::Int(n).into()
    }

    pub fn bool(b: bool) -> Item {
        Value::Bool(b).into()
    }

    pub fn texts<S: Into<String>>(list: impl IntoIterator<Item = S>) -> Item {
        Value::List(list.into_iter().map(Item::text).collect()).into()
    }

    pub fn commented(mut self, comments: impl IntoIterator<Item = String>) -> Item {
        self.comments.extend(comments);
        self
    }

    fn is_scalar(&self) -> bool {
        !matches!(self.value, Value::List(_) | Value::Map(_))
    }
}

impl From<Value> for Item {
    fn from(value: Value) -> Item {
        Item { comments: Vec::new(), value }
    }
}

/// A map built entry by entry, in the order written.
#[derive(Debug, Default)]
pub struct MapBuilder(Vec<(String, Item)>);

impl MapBuilder {
    pub fn set(&mut self, key: &str, item: Item) -> &mut Self {
        self.0.push((key.to_owned(), item));
        self
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn build(self) -> Item {
        Value::Map(self.0).into()
    }
}

/// The document: `header` comment lines, then the top-level entries, a blank line
/// between sections.
pub fn render(header: &[String], top: &[(String, Item)]) -> String {
    let mut out = String::new();
    for line in header {
        comment(&mut out, 0, line);
    }
    for (key, item) in top {
        out.push('\n');
        entry(&mut out, 0, key, item);
    }
    out
}

fn comment(out: &mut String, indent: usize, line: &str) {
    if line.is_empty() {
        out.push_str(&" ".repeat(indent));
        out.push_str("#\n");
    }
    for part in line.lines() {
        out.push_str(&" ".repeat(indent));
        out.push_str(if part.is_empty() { "#" } else { "# " });
        out.push_str(part);
        out.push('\n');
    }
}

/// `key: value` at `indent`, with the item's comments above it.
fn entry(out: &mut String, indent: usize, key: &str, item: &Item) {
    for line in &item.comments {
        comment(out, indent, line);
    }
    out.push_str(&" ".repeat(indent));
    out.push_str(&scalar(key));
    out.push(':');
    body(out, indent, item);
}

/// What follows `key:` or `- `: a flow value on the same line, or a block below.
fn body(out: &mut String, indent: usize, item: &Item) {
    if let Some(flow) = flow(item) {
        out.push(' ');
        out.push_str(&flow);
        out.push('\n');
        return;
    }
    out.push('\n');
    match &item.value {
        Value::Map(entries) => {
            for (key, item) in entries {
                entry(out, indent + 2, key, item);
            }
        }
        Value::List(items) => {
            for item in items {
                for line in &item.comments {
                    comment(out, indent + 2, line);
                }
                list_item(out, indent + 2, item);
            }
        }
        _ => {}
    }
}

/// `- value`; a map's first entry goes on the dash's line.
fn list_item(out: &mut String, indent: usize, item: &Item) {
    out.push_str(&" ".repeat(indent));
    out.push('-');
    match &item.value {
        Value::Map(entries) if flow(item).is_none() => {
            for (i, (key, item)) in entries.iter().enumerate() {
                if i == 0 && item.comments.is_empty() {
                    out.push(' ');
                    out.push_str(&scalar(key));
                    out.push(':');
                    body(out, indent + 2, item);
                } else {
                    if i == 0 {
                        out.push('\n');
                    }
                    entry(out, indent + 2, key, item);
                }
            }
        }
        _ => body(out, indent, item),
    }
}

/// The value on one line, if it is short and holds no comments: scalars, lists of
/// scalars, maps of at most four scalars.
fn flow(item: &Item) -> Option<String> {
    let text = match &item.value {
        Value::Text(s) => scalar(s),
        Value::Int(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::List(items) if items.iter().all(|i| i.is_scalar() && i.comments.is_empty()) => {
            let parts: Vec<String> = items.iter().filter_map(flow).collect();
            format!("[{}]", parts.join(", "))
        }
        Value::Map(entries)
            if entries.len() <= 4 && entries.iter().all(|(_, i)| i.is_scalar() && i.comments.is_empty()) =>
        {
            let parts: Vec<String> =
                entries.iter().filter_map(|(k, i)| Some(format!("{}: {}", scalar(k), flow(i)?))).collect();
            if parts.is_empty() { "{}".to_owned() } else { format!("{{ {} }}", parts.join(", ")) }
        }
        _ => return None,
    };
    (text.len() <= 100 || item.is_scalar()).then_some(text)
}

/// A string as a plain scalar when YAML cannot read it as anything else, else in
/// double quotes (JSON's escapes are YAML's).
fn scalar(s: &str) -> String {
    let plain_chars = s.bytes().all(|b| b.is_ascii_alphanumeric() || b"_./-".contains(&b));
    // `10r/s` and `30s` read as text; `10`, `1e3`, `0x1f` and `1.5` would not.
    let number_like = s.bytes().all(|b| !b.is_ascii_alphabetic() || b"eExXoObB".contains(&b))
        || ["0x", "0o", "0b"].iter().any(|p| s.starts_with(p));
    let first_ok = s
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'/' || b == b'_' || (b.is_ascii_digit() && !number_like));
    let reserved =
        ["true", "false", "yes", "no", "on", "off", "null", "y", "n"].contains(&s.to_ascii_lowercase().as_str());
    if plain_chars && first_ok && !reserved { s.to_owned() } else { serde_json::to_string(s).unwrap_or_default() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_flows_and_comments_come_out_as_yaml_reads_them() {
        let mut route = MapBuilder::default();
        route.set("name", Item::text("api"));
        route.set("match", Value::Map(vec![("path_prefix".into(), Item::text("/api/"))]).into());
        route.set("limits", Item::texts(["per_ip"]).commented(["nginx.conf:9: limit_req".to_owned()]));
        let listen = Item::texts(["0.0.0.0:80"]);
        let top = vec![
            ("listen".to_owned(), listen),
            (
                "routes".to_owned(),
                Value::List(vec![route.build().commented(["nginx.conf:7: location /api/".to_owned()])]).into(),
            ),
            ("server".to_owned(), Value::Map(vec![("workers".into(), Item::int(2))]).into()),
        ];
        let text = render(&["made by import".to_owned()], &top);
        assert_eq!(
            text,
            "# made by import\n\nlisten: [\"0.0.0.0:80\"]\n\nroutes:\n  # nginx.conf:7: location /api/\n  - name: api\n    match: { path_prefix: /api/ }\n    # nginx.conf:9: limit_req\n    limits: [per_ip]\n\nserver: { workers: 2 }\n"
        );
        let parsed: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
        assert_eq!(parsed["routes"][0]["match"]["path_prefix"], "/api/");
    }

    #[test]
    fn strings_yaml_would_read_otherwise_are_quoted() {
        assert_eq!(scalar("per_ip"), "per_ip");
        assert_eq!(scalar("*.example.com"), "\"*.example.com\"");
        assert_eq!(scalar("header:x-key"), "\"header:x-key\"");
        assert_eq!(scalar("yes"), "\"yes\"");
        assert_eq!(scalar("10"), "\"10\"");
        assert_eq!(scalar("1e3"), "\"1e3\"");
        assert_eq!(scalar("10r/s"), "10r/s");
        assert_eq!(scalar("a \"b\"\n"), "\"a \\\"b\\\"\\n\"");
        assert_eq!(scalar(""), "\"\"");
    }
}
