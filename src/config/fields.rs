//! Unknown fields and required fields left out, every one with its place, found without
//! serde: serde stops at the first error, and these are the commonest (a typo in a field's
//! name is both at once when the field is required).
//!
//! The file's YAML events are walked against the JSON Schema of `raw` (the types that
//! parse it, so the two cannot drift): each mapping the schema describes as an object
//! with `additionalProperties: false` takes only its `properties`, and has its
//! `required` ones. The walk keeps one frame per open mapping or sequence, never
//! recursing, and expands no alias (an alias bomb costs it nothing).

use std::sync::OnceLock;

use serde_json::Value;
use serde_saphyr::granit_parser::{Event, Parser, ScalarStyle};

use super::ConfigError;
use super::position::Position;
use super::raw::RawConfig;
use crate::suggest::{LISTED, closest, one_of};

/// What the walk found.
#[derive(Debug, Default)]
pub(super) struct FieldReport {
    /// Unknown fields (at their key) and required fields left out (at their mapping).
    pub errors: Vec<ConfigError>,
    /// Paths of the required fields left out, such as `limits.a.key`: serde filled them
    /// in with placeholders, whose checks have nothing to say.
    pub missing: Vec<String>,
}

pub(super) fn schema() -> &'static Value {
    static SCHEMA: OnceLock<Value> = OnceLock::new();
    SCHEMA.get_or_init(|| schemars::schema_for!(RawConfig).to_value())
}

/// The subschemas of `schema` that a node of JSON type `kind` (`object`, `array`) can
/// match: `$ref`s resolved, `anyOf`, `oneOf` and `allOf` opened (an `Option`, an untagged
/// enum). `depth` bounds the search, should a type ever refer to itself.
fn of_type(kind: &str, schema: &'static Value, depth: usize, found: &mut Vec<&'static Value>) {
    if depth > 16 {
        return;
    }
    let target = schema.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix("#/$defs/"));
    if let Some(def) = target.and_then(|name| self::schema().get("$defs")?.get(name)) {
        of_type(kind, def, depth + 1, found);
    }
    for list in ["anyOf", "oneOf", "allOf"] {
        for sub in schema.get(list).and_then(Value::as_array).into_iter().flatten() {
            of_type(kind, sub, depth + 1, found);
        }
    }
    let typed = match schema.get("type") {
        Some(Value::String(t)) => t == kind,
        Some(Value::Array(types)) => types.iter().any(|t| t == kind),
        _ => false,
    };
    if typed {
        found.push(schema);
    }
}

fn objects(schema: Option<&'static Value>) -> Vec<&'static Value> {
    let mut found = Vec::new();
    if let Some(schema) = schema {
        of_type("object", schema, 0, &mut found);
    }
    found
}

fn items(schema: Option<&'static Value>) -> Option<&'static Value> {
    let mut found = Vec::new();
    of_type("array", schema?, 0, &mut found);
    found.into_iter().find_map(|array| array.get("items"))
}

/// A node's place: its field path (`routes[1].match`), and the same path as the
/// configuration reference (docs/configuration.md) writes it (`routes[i].match`, `limits.NAME`).
#[derive(Clone, Default)]
struct Place {
    path: String,
    reference: String,
}

impl Place {
    fn field(&self, key: &str) -> Place {
        Place { path: join(&self.path, key), reference: join(&self.reference, key) }
    }

    /// An entry of a map whose keys are names (`limits`, `upstreams`).
    fn entry(&self, key: &str) -> Place {
        Place { path: join(&self.path, key), reference: join(&self.reference, "NAME") }
    }

    fn item(&self, i: usize) -> Place {
        Place { path: format!("{}[{i}]", self.path), reference: format!("{}[i]", self.reference) }
    }
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() { key.to_owned() } else { format!("{parent}.{key}") }
}

/// A node about to be read: its place, and the schema it must meet (`None`: not checked,
/// such as an unknown field's value).
struct Node {
    place: Place,
    schema: Option<&'static Value>,
}

enum Frame {
    Mapping {
        place: Place,
        at: Position,
        /// What the mapping can be (empty: not checked).
        objects: Vec<&'static Value>,
        /// The fields given.
        given: Vec<String>,
        /// The fields unknown ones were taken for: not reported again as left out.
        suggested: Vec<&'static str>,
        /// A merge key (`<<: *base`) may give any field: none is missing.
        merges: bool,
        /// The value of the key just read.
        value: Option<Node>,
    },
    Sequence {
        place: Place,
        items: Option<&'static Value>,
        next: usize,
    },
}

impl Frame {
    /// The frame of a mapping or sequence that starts with `event`, at `at`.
    fn open(event: &Event<'_>, at: Position, node: Node) -> Option<Frame> {
        match event {
            Event::MappingStart(..) => Some(Frame::Mapping {
                place: node.place,
                at,
                objects: objects(node.schema),
                given: Vec::new(),
                suggested: Vec::new(),
                merges: false,
                value: None,
            }),
            Event::SequenceStart(..) => Some(Frame::Sequence { place: node.place, items: items(node.schema), next: 0 }),
            _ => None,
        }
    }
}

/// Unknown and missing fields of `src`, named `file` in errors. A syntax error ends the
/// walk (the deserializer reports it); what came before it is reported.
pub(super) fn check(src: &str, file: &str) -> FieldReport {
    let mut fields = FieldReport::default();
    let mut stack: Vec<Frame> = Vec::new();
    for event in Parser::new_from_str(src) {
        let Ok((event, span)) = event else { break };
        let at = (span.start.line(), span.start.col() + 1);
        match &event {
            Event::MappingStart(..) | Event::SequenceStart(..) | Event::Scalar(..) | Event::Alias(_) => {}
            Event::MappingEnd => {
                if let Some(Frame::Mapping { place, at, objects, given, suggested, merges: false, .. }) = stack.pop()
                    && let [object] = objects[..]
                {
                    let required = object.get("required").and_then(Value::as_array).into_iter().flatten();
                    for field in required.filter_map(Value::as_str).filter(|f| !given.iter().any(|g| g == f)) {
                        if !suggested.contains(&field) {
                            let message = format!("missing field `{field}`");
                            fields.errors.push(ConfigError::new(file, at, &place.path, &message));
                        }
                        fields.missing.push(join(&place.path, field));
                    }
                }
                continue;
            }
            Event::SequenceEnd => {
                stack.pop();
                continue;
            }
            // One document: a second is the deserializer's to refuse.
            Event::DocumentEnd => break,
            _ => continue,
        }
        let node = match stack.last_mut() {
            None => Node { place: Place::default(), schema: Some(schema()) },
            Some(Frame::Sequence { place, items, next }) => {
                *next += 1;
                Node { place: place.item(*next - 1), schema: *items }
            }
            Some(Frame::Mapping { place, objects, given, suggested, merges, value, .. }) => match value.take() {
                Some(node) => node,
                None => {
                    // A key: what it says is the next node's place and schema.
                    let mut next = Node { place: place.field("?"), schema: None };
                    match &event {
                        Event::Scalar(text, style, _, tag)
                            if text == "<<" && (*style == ScalarStyle::Plain || tag.is_some()) =>
                        {
                            *merges = true;
                        }
                        Event::Scalar(text, ..) => {
                            next.place = place.field(text);
                            let field = objects.iter().find_map(|o| o.get("properties")?.get(text.as_ref()));
                            let named =
                                objects.iter().find_map(|o| o.get("additionalProperties").filter(|a| a.is_object()));
                            let closed =
                                objects.iter().all(|o| o.get("additionalProperties") == Some(&Value::Bool(false)));
                            if let Some(schema) = field {
                                given.push(text.to_string());
                                next.schema = Some(schema);
                            } else if let Some(schema) = named {
                                next = Node { place: place.entry(text), schema: Some(schema) };
                            } else if closed && !objects.is_empty() {
                                let (message, meant) = unknown(text, objects, &place.reference);
                                suggested.extend(meant);
                                fields.errors.push(ConfigError::new(file, at, &next.place.path, &message));
                            }
                        }
                        // A key that is not text (`? [a, b]`) is the deserializer's to refuse.
                        _ => {}
                    }
                    *value = Some(next);
                    // A key that is a mapping or a sequence: its own nodes are not checked.
                    Node { place: Place::default(), schema: None }
                }
            },
        };
        stack.extend(Frame::open(&event, at, node));
    }
    fields
}

/// The message for an unknown field `name` of a mapping that can be `objects`, found at
/// `reference` in docs/configuration.md's terms; and the field it was taken for, if any.
fn unknown(name: &str, objects: &[&'static Value], reference: &str) -> (String, Option<&'static str>) {
    let mut known: Vec<&'static str> = objects
        .iter()
        .filter_map(|o| o.get("properties")?.as_object())
        .flat_map(|properties| properties.keys().map(String::as_str))
        .collect();
    known.sort_unstable();
    known.dedup();
    let message = match closest(name, known.iter().copied()) {
        Some(meant) => return (format!("unknown field `{name}`; did you mean `{meant}`?"), Some(meant)),
        None if known.len() <= LISTED => format!("unknown field `{name}`; expected {}", one_of(&known)),
        None if reference.is_empty() => {
            format!("unknown field `{name}`; the {} top-level fields are listed in docs/configuration.md", known.len())
        }
        None => format!(
            "unknown field `{name}`; the {} fields of `{reference}` are listed in docs/configuration.md",
            known.len()
        ),
    };
    (message, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(src: &str) -> (Vec<String>, Vec<String>) {
        let fields = check(src, "F");
        (fields.errors.iter().map(ToString::to_string).collect(), fields.missing)
    }

    #[test]
    fn every_unknown_field_is_found_where_its_key_stands() {
        let src = "listen: [{ address: \"127.0.0.1:1\", tsl: {} }]\nservr: {}\nupstreams:\n  a:\n    servers: [{ address: x, wieght: 2 }]\n    health_check: { path: /, intervall: 1s }\nroutes:\n  - match: { hots: a }\n    colour: blue\n";
        let (errors, missing) = found(src);
        assert_eq!(
            errors,
            [
                "F:1:36: listen[0].tsl: unknown field `tsl`; did you mean `tls`?",
                "F:2:1: servr: unknown field `servr`; did you mean `server`?",
                "F:5:29: upstreams.a.servers[0].wieght: unknown field `wieght`; did you mean `weight`?",
                "F:6:30: upstreams.a.health_check.intervall: unknown field `intervall`; did you mean `interval`?",
                "F:8:14: routes[0].match.hots: unknown field `hots`; did you mean `host`?",
                "F:9:5: routes[0].colour: unknown field `colour`; the 19 fields of `routes[i]` are listed in docs/configuration.md",
            ]
        );
        assert!(missing.is_empty(), "{missing:?}");
    }

    #[test]
    fn a_few_fields_are_listed_when_none_is_close() {
        let (errors, _) = found("listen: 127.0.0.1:1\nroutes:\n  - rewrite: { prefix: /a, to: /b, via: /c }\n");
        assert_eq!(errors, ["F:3:36: routes[0].rewrite.via: unknown field `via`; expected `prefix` or `to`"]);
        let (errors, _) = found("listen: 127.0.0.1:1\nwhatever: 1\n");
        assert_eq!(
            errors,
            ["F:2:1: whatever: unknown field `whatever`; the 20 top-level fields are listed in docs/configuration.md"]
        );
    }

    #[test]
    fn names_and_header_fields_are_never_unknown() {
        let src = "listen: 127.0.0.1:1\nupstreams:\n  any.name: { servers: [\"127.0.0.1:1\"] }\nlimits:\n  rate: { key: ip, rate: 1r/s, allow: { headers: { x-key: v } } }\nroutes:\n  - respond: { headers: { x-a: b } }\n    set_request_headers: { timeout: x }\n";
        assert_eq!(found(src), (vec![], vec![]));
    }

    #[test]
    fn required_fields_left_out_are_reported_once() {
        let src = "limits:\n  a: { kye: ip, rate: 1r/s }\n  b: { rate: 1r/s }\nroutes:\n  - rewrite: { prefix: /a }\n";
        let (errors, missing) = found(src);
        assert_eq!(
            errors,
            [
                "F:2:8: limits.a.kye: unknown field `kye`; did you mean `key`?",
                "F:3:6: limits.b: missing field `key`",
                "F:5:14: routes[0].rewrite: missing field `to`",
                // The root mapping ends last.
                "F:1:1: missing field `listen`",
            ]
        );
        assert_eq!(missing, ["limits.a.key", "limits.b.key", "routes[0].rewrite.to", "listen"]);
    }

    /// A merge key may give any field; the fields of the mapping it merges are checked
    /// where that mapping stands, once, and aliases are not followed.
    #[test]
    fn merge_keys_and_aliases_are_taken_as_written() {
        let src = "listen: 127.0.0.1:1\nlimits:\n  a: &base { key: ip, rate: 1r/s, burts: 1 }\n  b:\n    <<: *base\n    rate: 2r/s\n  c: *base\n";
        let (errors, missing) = found(src);
        assert_eq!(errors, ["F:3:35: limits.a.burts: unknown field `burts`; did you mean `burst`?"]);
        assert!(missing.is_empty(), "{missing:?}");
    }

    #[test]
    fn keys_that_are_not_text_and_syntax_errors_end_nothing_early() {
        let src = "listen: 127.0.0.1:1\n? [a, b]\n: { c: d }\nlimits:\n  a: { key: ip, rat: 1r/s }\n";
        let (errors, _) = found(src);
        assert_eq!(errors, ["F:5:17: limits.a.rat: unknown field `rat`; did you mean `rate`?"]);
        // What comes before a syntax error is reported; the deserializer reports the rest.
        let (errors, _) = found("listen: 127.0.0.1:1\nservr: {}\nlimits: [\n");
        assert_eq!(errors, ["F:2:1: servr: unknown field `servr`; did you mean `server`?"]);
    }

    /// serde skips unknown fields, so a type that took its fields without
    /// `#[schemars(deny_unknown_fields)]` would accept any: every object of the schema
    /// with fields must close them.
    #[test]
    fn every_object_with_fields_refuses_others() {
        let defs = schema()["$defs"].as_object().expect("definitions");
        let open: Vec<&str> = defs
            .iter()
            .map(|(name, def)| (name.as_str(), def))
            .chain([("RawConfig", schema())])
            .filter(|(_, def)| def.get("properties").is_some())
            .filter(|(_, def)| def.get("additionalProperties") != Some(&Value::Bool(false)))
            .map(|(name, _)| name)
            .collect();
        assert!(open.is_empty(), "types that accept unknown fields: {open:?}");
    }
}
