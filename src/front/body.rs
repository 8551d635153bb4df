//! The fields of a JSON request body that `json:` key parts read, found as the body
//! passes, piece by piece: first in the bounded peek read before the admission, then in
//! the rest as it is forwarded, where a name the limits read seen a second time cuts the
//! body (the limiter counted one value; an upstream whose parser keeps the last would act
//! on another). The same reads a JSON response's counts for `charge: { json: ... }`.
//!
//! Written here rather than with a JSON crate: serde_json needs the whole text, and the
//! streaming parsers (actson, struson) keep every string whole while it is read (a
//! 10 MB prompt, 10 MB per request). This keeps only the names on the wanted paths and
//! their values (each at most `VALUE_MAX` bytes), and skips every other string with
//! `memchr`; it checks the structure (brackets, names, colons, commas), not the spelling
//! of numbers or literals, which the upstream's parser judges.

use std::sync::Arc;

use crate::policy::key::{BodyFields, ClaimPath};

/// The longest value kept: a longer one is no key (the request lacks it).
pub const VALUE_MAX: usize = 1024;
/// The deepest nesting read: a deeper body is not JSON to the limits.
const MAX_DEPTH: usize = 256;

/// A JSON text read piece by piece for the values at `paths`.
pub struct Scan {
    paths: Arc<[ClaimPath]>,
    slots: Box<[Slot]>,
    /// A wanted path whose value came twice.
    repeated: Option<usize>,
    /// The paths whose value is a string (a mask over `paths`).
    strings: u32,
    state: State,
    /// The containers open: whether each is an object, and which paths its own path
    /// begins (a mask over `paths`) at which depth.
    stack: Vec<Frame>,
    /// The name or value being read, when it is wanted.
    text: Vec<u8>,
    /// The paths the name just read continues (set between a name and its value).
    named: u32,
    /// A `\u` escape's high surrogate, waiting for its low one.
    high: Option<u16>,
}

#[derive(Clone, Default)]
enum Slot {
    #[default]
    Unseen,
    /// Seen: its value, if it is a string, number or literal no longer than `VALUE_MAX`.
    Seen(Option<Box<[u8]>>),
}

#[derive(Clone, Copy)]
struct Frame {
    object: bool,
    paths: u32,
    depth: u16,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    /// A value is due (at the top, after `:`, `[` or an array's `,`).
    Value,
    /// After `[`: a value or `]`.
    ValueOrClose,
    /// After `{`: a name or `}`.
    NameOrClose,
    /// After an object's `,`.
    Name,
    Colon,
    /// After a value: `,` or the container's close.
    After,
    /// In a string: `name` says whether it is a name; `keep` whether its text is kept.
    Str {
        name: bool,
        keep: bool,
        escape: Escape,
    },
    /// In a number or literal, kept or not.
    Scalar {
        keep: bool,
    },
    /// The top-level value is complete.
    Done,
    Invalid,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Escape {
    None,
    /// After `\`.
    Backslash,
    /// In `\uXXXX`: the digits read so far and their value.
    Unicode {
        digits: u8,
        value: u16,
    },
}

impl Scan {
    /// A scan for `paths` (at most 32).
    pub fn new(paths: Arc<[ClaimPath]>) -> Scan {
        debug_assert!(paths.len() <= 32);
        let slots = vec![Slot::Unseen; paths.len()].into_boxed_slice();
        Scan {
            paths,
            slots,
            repeated: None,
            strings: 0,
            state: State::Value,
            stack: Vec::new(),
            text: Vec::new(),
            named: 0,
            high: None,
        }
    }

    /// Whether the text broke JSON's structure so far.
    pub fn invalid(&self) -> bool {
        self.state == State::Invalid
    }

    /// Whether the top-level value is complete.
    pub fn complete(&self) -> bool {
        self.state == State::Done
    }

    /// The wanted path whose value came twice, if one did.
    pub fn repeated(&self) -> Option<&ClaimPath> {
        self.repeated.map(|i| &self.paths[i])
    }

    /// What the text read so far gives the limits: each path's value (none for a text
    /// that is not JSON, or whose top-level value ended unfinished when `ended`).
    pub fn fields(&self, ended: bool) -> BodyFields {
        let broken = self.invalid() || (ended && !self.complete());
        let values = self
            .slots
            .iter()
            .map(|slot| match slot {
                Slot::Seen(Some(value)) if !broken => Some(value.clone()),
                _ => None,
            })
            .collect();
        BodyFields::new(Arc::clone(&self.paths), values)
    }

    /// The number at `paths[i]`, for a count (`charge: { json: ... }`): `None` when the
    /// path was not seen, `Some(None)` when its value is no number (a string, a literal,
    /// an object or array, one too long to keep) or the text broke JSON's structure.
    pub fn number(&self, i: usize) -> Option<Option<&[u8]>> {
        let Slot::Seen(value) = &self.slots[i] else { return None };
        let string = self.strings & (1 << i) != 0;
        Some(value.as_deref().filter(|v| !string && !self.invalid() && matches!(v.first(), Some(b'-' | b'0'..=b'9'))))
    }

    /// Reads `bytes`, the next piece of the text.
    pub fn feed(&mut self, bytes: &[u8]) {
        let mut i = 0;
        while i < bytes.len() {
            if let State::Str { keep: false, escape: Escape::None, .. } = self.state {
                // Skipped text: straight to its next quote or backslash.
                match memchr::memchr2(b'"', b'\\', &bytes[i..]) {
                    Some(at) => i += at,
                    None => return,
                }
            }
            self.byte(bytes[i]);
            i += 1;
            if matches!(self.state, State::Invalid) {
                return;
            }
        }
    }

    fn byte(&mut self, b: u8) {
        let ws = matches!(b, b' ' | b'\t' | b'\n' | b'\r');
        self.state = match self.state {
            State::Invalid => State::Invalid,
            State::Done if ws => State::Done,
            State::Done => State::Invalid,
            State::Str { name, keep, escape } => return self.string(b, name, keep, escape),
            State::Scalar { keep } => match b {
                b',' | b']' | b'}' => {
                    self.scalar_end(keep);
                    self.state = self.after_value();
                    return self.byte(b);
                }
                _ if ws => {
                    self.scalar_end(keep);
                    self.after_value()
                }
                _ if keep => {
                    if self.text.len() <= VALUE_MAX {
                        self.text.push(b);
                    }
                    State::Scalar { keep }
                }
                _ => State::Scalar { keep },
            },
            _ if ws => self.state,
            State::Value | State::ValueOrClose => match b {
                b']' if self.state == State::ValueOrClose => self.close(false),
                b'{' => self.open(true),
                b'[' => self.open(false),
                b'"' => {
                    let keep = self.leaf().is_some();
                    self.text.clear();
                    State::Str { name: false, keep, escape: Escape::None }
                }
                b'-' | b'0'..=b'9' | b't' | b'f' | b'n' => {
                    let keep = self.leaf().is_some();
                    self.text.clear();
                    self.text.push(b);
                    State::Scalar { keep }
                }
                _ => State::Invalid,
            },
            State::NameOrClose | State::Name => match b {
                b'}' if self.state == State::NameOrClose => self.close(true),
                b'"' => {
                    self.text.clear();
                    let keep = self.stack.last().is_some_and(|f| f.paths != 0);
                    State::Str { name: true, keep, escape: Escape::None }
                }
                _ => State::Invalid,
            },
            State::Colon => match b {
                b':' => State::Value,
                _ => State::Invalid,
            },
            State::After => match (b, self.stack.last()) {
                (b',', Some(f)) if f.object => {
                    self.named = 0;
                    State::Name
                }
                (b',', Some(_)) => State::Value,
                (b'}', Some(f)) if f.object => self.close(true),
                (b']', Some(f)) if !f.object => self.close(false),
                _ => State::Invalid,
            },
        };
    }

    /// One byte of a string.
    fn string(&mut self, b: u8, name: bool, keep: bool, escape: Escape) {
        let mut next = Escape::None;
        match escape {
            Escape::None => match b {
                b'"' => {
                    self.flush_high(keep);
                    return self.string_end(name, keep);
                }
                b'\\' => next = Escape::Backslash,
                _ if b < 0x20 => {
                    self.state = State::Invalid;
                    return;
                }
                _ => {
                    self.flush_high(keep);
                    self.keep(keep, &[b]);
                }
            },
            Escape::Backslash => {
                let decoded = match b {
                    b'"' | b'\\' | b'/' => b,
                    b'b' => 0x08,
                    b'f' => 0x0c,
                    b'n' => b'\n',
                    b'r' => b'\r',
                    b't' => b'\t',
                    b'u' => {
                        self.state = State::Str { name, keep, escape: Escape::Unicode { digits: 0, value: 0 } };
                        return;
                    }
                    _ => {
                        self.state = State::Invalid;
                        return;
                    }
                };
                self.flush_high(keep);
                self.keep(keep, &[decoded]);
            }
            Escape::Unicode { digits, value } => {
                let Some(digit) = (b as char).to_digit(16) else {
                    self.state = State::Invalid;
                    return;
                };
                let value = value << 4 | digit as u16;
                if digits < 3 {
                    next = Escape::Unicode { digits: digits + 1, value };
                } else {
                    self.unicode(keep, value);
                }
            }
        }
        self.state = State::Str { name, keep, escape: next };
    }

    /// A `\uXXXX` escape's code unit, read: a high surrogate waits for its low one.
    fn unicode(&mut self, keep: bool, unit: u16) {
        let c = match (self.high.take(), unit) {
            (Some(high), 0xDC00..=0xDFFF) => {
                char::from_u32(0x10000 + ((u32::from(high) - 0xD800) << 10) + (u32::from(unit) - 0xDC00))
            }
            (high, 0xD800..=0xDBFF) => {
                if high.is_some() {
                    self.keep(keep, "\u{FFFD}".as_bytes());
                }
                self.high = Some(unit);
                return;
            }
            (high, unit) => {
                if high.is_some() {
                    self.keep(keep, "\u{FFFD}".as_bytes());
                }
                char::from_u32(u32::from(unit))
            }
        };
        let mut buf = [0; 4];
        self.keep(keep, c.unwrap_or('\u{FFFD}').encode_utf8(&mut buf).as_bytes());
    }

    /// A high surrogate not followed by its low one stands for U+FFFD.
    fn flush_high(&mut self, keep: bool) {
        if self.high.take().is_some() {
            self.keep(keep, "\u{FFFD}".as_bytes());
        }
    }

    fn keep(&mut self, keep: bool, bytes: &[u8]) {
        if keep && self.text.len() <= VALUE_MAX {
            self.text.extend_from_slice(bytes);
        }
    }

    fn string_end(&mut self, name: bool, keep: bool) {
        if name {
            self.named = match (keep, self.stack.last()) {
                (true, Some(frame)) => self.continuing(*frame),
                _ => 0,
            };
            self.state = State::Colon;
        } else {
            if keep && let Some(i) = self.leaf() {
                self.strings |= 1 << i;
            }
            self.scalar_end(keep);
            self.state = self.after_value();
        }
    }

    /// The paths of `frame`'s that the name just read (in `text`) continues.
    fn continuing(&self, frame: Frame) -> u32 {
        let depth = usize::from(frame.depth);
        let mut named = 0;
        for (i, path) in self.paths.iter().enumerate() {
            if frame.paths & (1 << i) != 0 && path.names().get(depth).is_some_and(|n| n.as_bytes() == self.text) {
                named |= 1 << i;
            }
        }
        named
    }

    /// The wanted path the value now due completes, if it completes one.
    fn leaf(&self) -> Option<usize> {
        let frame = self.stack.last()?;
        let depth = usize::from(frame.depth) + 1;
        (0..self.paths.len()).find(|&i| self.named & (1 << i) != 0 && self.paths[i].names().len() == depth)
    }

    /// A value at a wanted path: `Some` its text, `None` one that is no key.
    fn seen(&mut self, value: Option<Box<[u8]>>) {
        let Some(i) = self.leaf() else { return };
        match self.slots[i] {
            Slot::Unseen => self.slots[i] = Slot::Seen(value),
            Slot::Seen(_) => {
                self.repeated.get_or_insert(i);
            }
        }
    }

    fn scalar_end(&mut self, keep: bool) {
        if keep {
            let value = (self.text.len() <= VALUE_MAX).then(|| self.text.as_slice().into());
            self.seen(value);
        }
    }

    fn after_value(&mut self) -> State {
        self.named = 0;
        if self.stack.is_empty() { State::Done } else { State::After }
    }

    fn open(&mut self, object: bool) -> State {
        if self.stack.len() >= MAX_DEPTH {
            return State::Invalid;
        }
        // An object or array at a wanted path is no key (but it is seen: twice is twice).
        self.seen(None);
        let frame = match self.stack.last() {
            None => Frame { object, paths: if object { mask(self.paths.len()) } else { 0 }, depth: 0 },
            Some(outer) if object && outer.object => {
                let depth = outer.depth + 1;
                let deeper = |i: usize| self.paths[i].names().len() > usize::from(depth);
                let paths = (0..self.paths.len()).filter(|&i| self.named & (1 << i) != 0 && deeper(i));
                Frame { object, paths: paths.fold(0, |m, i| m | 1 << i), depth }
            }
            Some(_) => Frame { object, paths: 0, depth: 0 },
        };
        self.stack.push(frame);
        self.named = 0;
        if object { State::NameOrClose } else { State::ValueOrClose }
    }

    fn close(&mut self, object: bool) -> State {
        match self.stack.pop() {
            Some(frame) if frame.object == object => self.after_value(),
            _ => State::Invalid,
        }
    }
}

fn mask(n: usize) -> u32 {
    if n >= 32 { u32::MAX } else { (1 << n) - 1 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(paths: &[&str], pieces: &[&[u8]]) -> Scan {
        let paths: Arc<[ClaimPath]> = paths.iter().map(|p| p.parse().unwrap()).collect();
        let mut scan = Scan::new(paths);
        for piece in pieces {
            scan.feed(piece);
        }
        scan
    }

    fn values(scan: &Scan, ended: bool) -> Vec<Option<String>> {
        let fields = scan.fields(ended);
        (0..scan.paths.len())
            .map(|i| fields.get(&scan.paths[i]).map(|v| String::from_utf8(v.to_vec()).unwrap()))
            .collect()
    }

    fn one(paths: &[&str], text: &str) -> Vec<Option<String>> {
        values(&scan(paths, &[text.as_bytes()]), true)
    }

    fn s(v: &str) -> Option<String> {
        Some(v.to_owned())
    }

    #[test]
    fn numbers_are_told_from_strings_literals_and_broken_texts() {
        let paths = ["u.a", "u.b", "u.c", "u.d", "u.e"];
        let text: &[u8] = br#"{"u": {"a": 12, "b": "12", "c": true, "d": 2.5e1, "e": {"x": 1}}}"#;
        let s = scan(&paths, &[text]);
        let numbers: Vec<_> = (0..paths.len()).map(|i| s.number(i).map(|n| n.map(<[u8]>::to_vec))).collect();
        assert_eq!(
            numbers,
            [Some(Some(b"12".to_vec())), Some(None), Some(None), Some(Some(b"2.5e1".to_vec())), Some(None)]
        );
        assert_eq!(scan(&["u.a"], &[br#"{"x": 1}"#]).number(0), None);
        assert_eq!(scan(&["u.a"], &[br#"{"u": {"a": 12}]"#]).number(0), Some(None));
    }

    #[test]
    fn reads_names_at_their_paths_nested_or_not() {
        let body = r#"{"model":"gpt-4o","stream":true,"n":2,"params":{"name":"search","arguments":{"q":"x"}},
            "messages":[{"role":"user","model":"no"}],"metadata":{"user_id":"u-7"}}"#;
        let got = one(&["model", "params.name", "metadata.user_id", "n", "stream", "params.arguments"], body);
        assert_eq!(got, [s("gpt-4o"), s("search"), s("u-7"), s("2"), s("true"), None]);
        // A name inside an array is on no path; an absent one is missing.
        assert_eq!(one(&["role", "absent", "messages.role"], body), [None, None, None]);
    }

    #[test]
    fn escapes_are_decoded_in_names_and_values() {
        let got = one(&["model"], r#"{"mod\u0065l":"caf\u00e9 \ud83d\ude00 \"q\" \\ \/"}"#);
        assert_eq!(got, [s("café 😀 \"q\" \\ /")]);
        // A lone surrogate stands for U+FFFD.
        assert_eq!(one(&["m"], r#"{"m":"\ud83dx"}"#), [s("\u{FFFD}x")]);
    }

    #[test]
    fn a_name_repeated_is_caught_however_it_is_spelt_and_wherever_it_is_split() {
        let body = br#"{"model":"cheap","pad":"aaaa","mod\u0065l":"dear"}"#;
        for split in 0..body.len() {
            let split_scan = scan(&["model"], &[&body[..split], &body[split..]]);
            assert_eq!(split_scan.repeated().map(ToString::to_string), Some("model".into()), "split at {split}");
            assert_eq!(values(&split_scan, true), [s("cheap")]);
        }
        // Twice through an object repeated on the way.
        let twice = scan(&["params.name"], &[br#"{"params":{"name":"a"},"params":{"name":"b"}}"#]);
        assert!(twice.repeated().is_some());
        // The same name elsewhere is not a repeat.
        let elsewhere = scan(&["name"], &[br#"{"name":"a","x":{"name":"b"},"y":[{"name":"c"}]}"#]);
        assert!(elsewhere.repeated().is_none());
    }

    #[test]
    fn every_split_of_a_body_reads_the_same() {
        let body = br#" { "a" : { "b" : "x\"y\u00e9" } , "n" : -12.5e3 , "t" : false } "#;
        let whole = values(&scan(&["a.b", "n", "t"], &[body]), true);
        assert_eq!(whole, [s("x\"yé"), s("-12.5e3"), s("false")]);
        for split in 0..body.len() {
            for second in split..body.len() {
                let pieces: [&[u8]; 3] = [&body[..split], &body[split..second], &body[second..]];
                assert_eq!(values(&scan(&["a.b", "n", "t"], &pieces), true), whole, "{split} {second}");
            }
        }
    }

    #[test]
    fn a_prefix_gives_what_it_holds_and_a_broken_text_gives_nothing() {
        let prefix = br#"{"model":"gpt-4o","messages":[{"content":"aaaaaaaaaaaa"#;
        let read = scan(&["model", "later"], &[prefix]);
        assert!(!read.complete() && !read.invalid());
        assert_eq!(values(&read, false), [s("gpt-4o"), None]);
        // Ended unfinished: not JSON.
        assert_eq!(values(&read, true), [None, None]);
        for broken in [r#"{"model":"a",}"#, r#"{"model" "a"}"#, r#"["model"]]"#, "model=a", r#"{"model":"a"} x"#] {
            assert_eq!(one(&["model"], broken), [None], "{broken}");
        }
        // Not an object at the top: no names.
        assert_eq!(one(&["model"], r#"[{"model":"a"}]"#), [None]);
        assert_eq!(one(&["model"], r#""model""#), [None]);
    }

    #[test]
    fn a_value_too_long_or_not_a_scalar_is_no_key() {
        let long = "x".repeat(VALUE_MAX + 1);
        assert_eq!(one(&["m", "n"], &format!(r#"{{"m":"{long}","n":"ok"}}"#)), [None, s("ok")]);
        let fits = "x".repeat(VALUE_MAX);
        assert_eq!(one(&["m"], &format!(r#"{{"m":"{fits}"}}"#)), [Some(fits)]);
        assert_eq!(one(&["m"], r#"{"m":{"a":1}}"#), [None]);
        assert_eq!(one(&["m"], r#"{"m":null}"#), [s("null")]);
    }

    #[test]
    fn nesting_is_bounded() {
        let deep = format!("{{\"a\":{}1{}}}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(scan(&["b"], &[deep.as_bytes()]).invalid());
        let fine = format!("{{\"a\":{}1{},\"b\":2}}", "[".repeat(MAX_DEPTH - 2), "]".repeat(MAX_DEPTH - 2));
        assert_eq!(one(&["b"], &fine), [s("2")]);
    }
}
