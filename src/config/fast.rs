//! The common path: the file parsed once, by serde under `strict`'s watch, its list of
//! routes split over the cores when it is long; `None` when serde fails, and the full
//! path (`parse`: serde beside the `fields` walk) finds and places every error.
//!
//! Why: on a file of 100,000 routes the full path parsed the YAML twice (serde's pass and
//! the walk, each about half of the 2.9 s of CPU `check` took on a 2-core Xeon), and
//! serde's pass alone takes about 0.8 s on one core there. The `strict` pass vouches for
//! what the walk would have checked, so a valid file is parsed once; and the routes, the
//! bulk of any long file, are cut at entries into as many parts as there are cores (up
//! to four), each parsed on its own thread.
//!
//! A cut is made only where it cannot change what the file says: after a line `routes:`
//! that is a key of the top-level mapping with nothing left open before it (checked by
//! parsing the text up to it), within a block list whose every line is indented at least
//! as its entries, holds no quote, anchor, alias or tag, and closes every bracket it
//! opens. Then each entry line at the list's indentation starts an entry of that list,
//! whatever the parser's state, and the text from one such line to the next part is a
//! list of its own. The first part stays in the file (with what follows the routes); the
//! others are parsed alone. Anything else, and any error of any part, and the file is
//! read whole.

use std::num::NonZero;

use serde_saphyr::granit_parser::{Event, Parser};

use super::raw::{RawConfig, RawRoute};
use super::{strict, yaml_options};

/// Below this many bytes of routes a second thread gains nothing worth its start.
const MIN_SPLIT_BYTES: usize = 256 * 1024;
/// More parts than cores gain nothing; this many bounds the threads on a large machine.
const MAX_PARTS: usize = 4;

/// What serde makes of `src`, and whether `strict` vouches that the `fields` walk finds
/// nothing in it; `None`: serde failed (on the file, or on one of its parts).
pub(super) fn raw(src: &str) -> Option<(RawConfig, bool)> {
    let parts = std::thread::available_parallelism().map_or(1, NonZero::get).min(MAX_PARTS);
    match plan(src, parts, MIN_SPLIT_BYTES) {
        Some(plan) => split(src, &plan),
        None => whole(src),
    }
}

/// `T` from `src` under `strict`'s watch: the whole file (`RawConfig`), or a part of its
/// routes (`Vec<RawRoute>`).
fn parsed<T: serde::de::DeserializeOwned>(src: &str) -> Option<(T, bool)> {
    serde_saphyr::with_deserializer_from_str_with_options(src, yaml_options(), |de| strict::deserialize(de)).ok()
}

fn whole(src: &str) -> Option<(RawConfig, bool)> {
    parsed(src)
}

/// Where the routes are cut.
#[derive(Debug, PartialEq, Eq)]
struct Plan {
    /// The start of each part but the first, which stays in the file.
    cuts: Vec<usize>,
    /// The end of the routes: what follows goes with the first part.
    end: usize,
    /// The entries of each part.
    counts: Vec<usize>,
}

fn split(src: &str, plan: &Plan) -> Option<(RawConfig, bool)> {
    std::thread::scope(|scope| {
        let bounds = plan.cuts.iter().skip(1).chain([&plan.end]);
        let others: Vec<_> = plan
            .cuts
            .iter()
            .zip(bounds)
            .map(|(&from, &to)| scope.spawn(move || parsed::<Vec<RawRoute>>(&src[from..to])))
            .collect();
        let first = [&src[..plan.cuts[0]], &src[plan.end..]].concat();
        let mut raw = whole(&first).filter(|(raw, _)| raw.routes.len() == plan.counts[0]);
        for (other, &count) in others.into_iter().zip(&plan.counts[1..]) {
            let part = other.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            match (&mut raw, part) {
                (Some((raw, vouched)), Some((part, sure))) if part.len() == count => {
                    raw.routes.extend(part);
                    *vouched &= sure;
                }
                _ => raw = None,
            }
        }
        raw
    })
}

/// The cuts of `src`'s routes into at most `parts` parts, if it has a list of routes
/// of `min_bytes` or more that can be cut (the module's doc).
fn plan(src: &str, parts: usize, min_bytes: usize) -> Option<Plan> {
    if parts < 2 || src.len() < min_bytes {
        return None;
    }
    let at = if src.starts_with("routes:") { 0 } else { src.find("\nroutes:")? + 1 };
    let line_end = src[at..].find('\n').map_or(src.len(), |i| at + i + 1);
    if src[at..line_end].trim_end() != "routes:" || !opens_routes(&src[..line_end]) {
        return None;
    }
    let body = line_end;
    let mut entries = Vec::new();
    let mut indent = None;
    let mut end = src.len();
    let mut start = body;
    while start < src.len() {
        let next = src[start..].find('\n').map_or(src.len(), |i| start + i + 1);
        let line = src[start..next].trim_end_matches('\n');
        let rest = line.trim_start_matches(' ');
        let spaces = line.len() - rest.len();
        if !(rest.is_empty() || rest.starts_with('#')) {
            let entry = rest == "-" || rest.starts_with("- ");
            if spaces == 0 && !entry {
                end = start;
                break;
            }
            let indent = *indent.get_or_insert(spaces);
            if spaces < indent || (spaces == indent && !entry) || !inert(rest) {
                return None;
            }
            if spaces == indent {
                entries.push(start);
            }
        }
        start = next;
    }
    if end - body < min_bytes {
        return None;
    }
    let (mut cuts, mut counts, mut first) = (Vec::new(), Vec::new(), 0);
    for k in 1..parts {
        let target = body + (end - body) * k / parts;
        let i = entries.partition_point(|&e| e < target);
        if i > first && i < entries.len() {
            cuts.push(entries[i]);
            counts.push(i - first);
            first = i;
        }
    }
    counts.push(entries.len() - first);
    (!cuts.is_empty()).then_some(Plan { cuts, end, counts })
}

/// Whether a line of the routes (without its indentation) can neither open nor close
/// anything that spans lines: no quote (a string), anchor, alias or tag, no tab or line
/// break other than `\n`, and its brackets (outside a comment) close in order on the
/// line. A bracket inside a plain value (`/a[0]`) is counted too: where that unbalances a
/// line, the file is not cut.
fn inert(line: &str) -> bool {
    if !line.is_ascii() && line.contains(['\u{85}', '\u{2028}', '\u{2029}']) {
        return false;
    }
    let (mut depth, mut comment, mut after_space) = (0usize, false, true);
    for b in line.bytes() {
        match b {
            b'"' | b'\'' | b'&' | b'*' | b'!' | b'\t' | b'\r' => return false,
            b'#' if after_space => comment = true,
            b'{' | b'[' if !comment => depth += 1,
            b'}' | b']' if !comment => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return false,
            },
            _ => {}
        }
        after_space = b == b' ';
    }
    depth == 0
}

/// Whether `prefix`, the file up to and with its line `routes:`, is YAML without error in
/// which that line is a key of the top-level mapping: no string or bracket opened before
/// it is still open there.
fn opens_routes(prefix: &str) -> bool {
    let line = prefix.lines().count();
    let mut depth = 0usize;
    let mut found = false;
    for event in Parser::new_from_str(prefix) {
        let Ok((event, span)) = event else { return false };
        match event {
            Event::MappingStart(..) | Event::SequenceStart(..) => {
                // Only the top-level mapping may be open at the line.
                if depth == 0 && !matches!(event, Event::MappingStart(..)) {
                    return false;
                }
                depth += 1;
            }
            Event::MappingEnd | Event::SequenceEnd => depth = depth.saturating_sub(1),
            Event::Scalar(text, ..) if depth == 1 && span.start.line() == line && span.start.col() == 0 => {
                found = text == "routes";
            }
            _ => {}
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes_file(n: usize, before: &str, after: &str) -> String {
        let mut src = format!("listen: 127.0.0.1:0\n{before}routes:\n");
        for i in 0..n {
            src.push_str(&format!("  - {{ match: {{ path_prefix: /p{i}/ }}, respond: {{ body: ok }} }}\n"));
        }
        src.push_str(after);
        src
    }

    fn debug(raw: Option<(RawConfig, bool)>) -> String {
        let (raw, vouched) = raw.expect("parsed");
        assert!(vouched);
        format!("{raw:?}")
    }

    #[test]
    fn routes_cut_into_parts_give_what_the_whole_file_gives() {
        let src = routes_file(
            100,
            "limits:\n  a: { key: ip, rate: 1r/s }\n",
            "upstreams:\n  u: { servers: [\"127.0.0.1:1\"] }\n",
        );
        let plan = plan(&src, 3, 0).expect("a plan");
        assert_eq!(plan.counts.len(), 3);
        assert_eq!(plan.counts.iter().sum::<usize>(), 100);
        assert!(src[plan.end..].starts_with("upstreams:"));
        assert_eq!(debug(split(&src, &plan)), debug(whole(&src)));
    }

    #[test]
    fn block_entries_with_comments_are_cut_at_entries() {
        let mut src = String::from("listen: 127.0.0.1:0\nroutes:\n# the first\n");
        for i in 0..40 {
            src.push_str(&format!("- match:\n    path_prefix: /p{i}/  # a [comment\n\n  respond: {{ body: ok }}\n"));
        }
        let plan = plan(&src, 2, 0).expect("a plan");
        assert_eq!(plan.counts, [20, 20]);
        assert_eq!(debug(split(&src, &plan)), debug(whole(&src)));
    }

    /// What could span a cut (a string, a bracket, an anchor, a line `routes:` that is not
    /// a key) leaves the file whole.
    #[test]
    fn files_that_could_read_otherwise_are_not_cut() {
        let cut = |src: &str| plan(src, 2, 0).is_some();
        assert!(cut(&routes_file(10, "", "")));
        for line in ["  - { respond: { body: \"a\" } }\n", "  - { respond: { body: a' } }\n", "  - &a {}\n"] {
            assert!(!cut(&routes_file(10, "", line)), "{line}");
        }
        assert!(!cut(&routes_file(10, "", "  - { respond: {\n      body: a } }\n")));
        assert!(!cut(&routes_file(10, "", " - {}\n")));
        assert!(!cut(&routes_file(10, "", "  x: 1\n")));
        // `routes:` inside a string that a later line closes.
        assert!(!cut(&routes_file(10, "keys_secret: \"a\n", "forwarded: \"\n")));
        assert!(!cut(&routes_file(10, "server: {\n", "}\n")));
        assert!(!cut(&format!("x: |\n{}", routes_file(10, "", "").replace('\n', "\n "))));
    }

    #[test]
    fn a_part_that_is_not_vouched_for_leaves_the_file_unvouched() {
        let src = routes_file(10, "", "  - { match: { path_prefx: /x/ }, respond: { body: ok } }\n");
        let plan = plan(&src, 2, 0).expect("a plan");
        assert_eq!(split(&src, &plan).map(|(_, vouched)| vouched), Some(false));
        assert_eq!(whole(&src).map(|(_, vouched)| vouched), Some(false));
    }

    #[test]
    fn a_part_serde_refuses_leaves_the_file_to_the_full_path() {
        let src = routes_file(10, "", "  - { match: { path_prefix: [] }, respond: { body: ok } }\n");
        let plan = plan(&src, 2, 0).expect("a plan");
        assert!(split(&src, &plan).is_none());
    }
}
