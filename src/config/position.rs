//! Where each value of the YAML file stands, by field path.
//!
//! Validation works on the parsed structs, which no longer know their lines; this index,
//! built from the same parser's event stream, maps a path such as `routes[1].limits[0]`
//! (the format `serde_path_to_error` prints) to the line and column of that value. It is
//! built when a position is first asked for: a valid file never pays for it (a file of
//! 100,000 routes has a million values).

use std::collections::HashMap;
use std::sync::OnceLock;

use serde_saphyr::granit_parser::{Event, Parser};

/// Line and column (both 1-based) of a value in the file.
pub type Position = (usize, usize);

pub struct Positions<'s> {
    src: &'s str,
    index: OnceLock<Index>,
}

struct Index {
    values: HashMap<String, Position>,
    /// Lines of the keys, by the path of their value: a duplicated key names the first.
    keys: HashMap<String, usize>,
}

enum Frame {
    Map { path: String, key: Option<String> },
    Seq { path: String, next: usize },
}

fn child(parent: &str, key: &str) -> String {
    if parent.is_empty() { key.to_owned() } else { format!("{parent}.{key}") }
}

impl<'s> Positions<'s> {
    /// The positions of the values of `src`, indexed when first asked for.
    pub fn new(src: &'s str) -> Self {
        Positions { src, index: OnceLock::new() }
    }

    fn index(&self) -> &Index {
        self.index.get_or_init(|| Index::of(self.src))
    }

    /// The line of the first key at `path`.
    pub fn key_line(&self, path: &str) -> Option<usize> {
        self.index().keys.get(path).copied()
    }

    /// The position of `path`, or of its nearest indexed ancestor (a missing field is
    /// reported where its parent stands).
    pub fn of(&self, mut path: &str) -> Position {
        let values = &self.index().values;
        loop {
            if let Some(pos) = values.get(path) {
                return *pos;
            }
            match path.rfind(['.', '[']) {
                Some(cut) => path = &path[..cut],
                None => return values.get("").copied().unwrap_or((1, 1)),
            }
        }
    }
}

impl Index {
    /// Indexes every value of `src`. A syntax error ends the walk early: the
    /// deserializer reports it with its own position.
    fn of(src: &str) -> Self {
        let mut map = HashMap::new();
        let mut keys = HashMap::new();
        let mut stack: Vec<Frame> = Vec::new();
        for event in Parser::new_from_str(src) {
            let Ok((event, span)) = event else { break };
            let pos = (span.start.line(), span.start.col() + 1);
            let is_node = matches!(
                event,
                Event::Scalar(..) | Event::SequenceStart(..) | Event::MappingStart(..) | Event::Alias(_)
            );
            let mut path = None;
            if is_node {
                match stack.last_mut() {
                    Some(Frame::Map { path: p, key }) => match key.take() {
                        // This node is a key: remember it, the next node is its value.
                        None => {
                            if let Event::Scalar(text, ..) = &event {
                                keys.entry(child(p, text)).or_insert(pos.0);
                                *key = Some(text.to_string());
                            } else {
                                *key = Some(String::new());
                            }
                            continue;
                        }
                        Some(k) => path = Some(child(p, &k)),
                    },
                    Some(Frame::Seq { path: p, next }) => {
                        path = Some(format!("{p}[{next}]"));
                        *next += 1;
                    }
                    None => path = Some(String::new()),
                }
            }
            if let Some(path) = &path {
                map.entry(path.clone()).or_insert(pos);
            }
            match event {
                Event::MappingStart(..) => stack.push(Frame::Map { path: path.unwrap_or_default(), key: None }),
                Event::SequenceStart(..) => stack.push(Frame::Seq { path: path.unwrap_or_default(), next: 0 }),
                Event::MappingEnd | Event::SequenceEnd => {
                    stack.pop();
                }
                _ => {}
            }
        }
        Index { values: map, keys }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_of_nested_values_are_found_by_path() {
        let src = "listen: a\nlimits:\n  per_ip: { key: ip, burst: 0 }\nroutes:\n  - limits: [x, y]\n    upstream: u\n";
        let p = Positions::new(src);
        assert_eq!(p.of("listen"), (1, 9));
        assert_eq!(p.of("limits.per_ip.burst"), (3, 29));
        assert_eq!(p.of("routes[0].limits[1]"), (5, 17));
        assert_eq!(p.of("routes[0].upstream"), (6, 15));
        assert_eq!(p.of("routes[0].respond"), (5, 5));
    }
}
