//! A fuzzer of configurations: mutants of `config.example.yaml`, from a fixed seed, are
//! refused or accepted by `check` (exit code 1 or 0, never a crash), and those accepted
//! also start (or refuse to start) and answer a request without a panic.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::common::*;

const MUTANTS: usize = 600;
/// Accepted mutants that are also run, the first ones found.
const RUNS: usize = 30;
/// Among its mutants: a `burst` at the top of u64 on a route's limit (an overflow once).
const SEED: u64 = 13;

/// SplitMix64 (Steele, Lea, Flood 2014): a few lines, the same sequence on every machine
/// and in every version, which is all a fixed-seed fuzzer needs of its randomness.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

/// Values put in place of a value of the file: edges of every kind of field, other
/// types, and YAML that means something else.
const VALUES: &[&str] = &[
    "",
    "~",
    "-1",
    "0",
    "20.5",
    "1e400",
    "18446744073709551615",
    "18446744073709551616",
    "340282366920938463463374607431768211456",
    "300000000000y",
    "365d",
    "366d",
    "0s",
    "0ms",
    "1ms",
    "18446744073709551615ms",
    "9223372036854775807s",
    "0r/s",
    "1r/ms",
    "18446744073709551615r/ms",
    "18446744073709551615r/365d",
    "1r/365d",
    "10r/0s",
    "r/s",
    "5r/M",
    "[]",
    "{}",
    "[1, [2]]",
    "{a: {b: c}}",
    "true",
    "null",
    "\"\"",
    "\"\\u202e\\0x\"",
    "e\u{303}\u{301}",
    "\u{1f980}",
    "\"\\t\"",
    "'''",
    "\"",
    "&a x",
    "*a",
    "!!binary aGk=",
    "!!float .nan",
    "!!int 0x7fffffffffffffff",
    "/",
    "//",
    "/%00",
    "/../x",
    "/a%2F..",
    "[::1]:0",
    "127.0.0.1:65536",
    ":0",
    "*.example.com",
    "a@b:1",
    "ip",
    "[ip, ip]",
    "header:",
    "header:x",
    "query:",
    "cookie:a",
    "bearer",
    "path",
    "global",
    "sliding_log",
    "fixed_window",
    "gcra",
    "token_bucket",
    "min_interval",
    "sliding_window",
    "599",
    "65535",
];

/// Numbers at the edges of the integer types, and zero.
const NUMBERS: &[&str] = &[
    "0",
    "1",
    "255",
    "65536",
    "4294967295",
    "4294967296",
    "9007199254740993",
    "9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "000000000000000000000000000001",
];

/// Characters YAML or a terminal treats specially: BOM, NEL and line separator (YAML
/// line breaks), zero width, right-to-left override, NUL, BEL, DEL, a lone combining mark.
const ODD: &[&str] =
    &["\u{feff}", "\u{85}", "\u{2028}", "\u{200b}", "\u{202e}", "\0", "\u{7}", "\u{7f}", "\u{301}", "\u{1f980}", "\t"];

/// The char boundaries of `s` (so that a cut or an insertion keeps it UTF-8).
fn boundary(rng: &mut Rng, s: &str) -> usize {
    let bounds: Vec<usize> = s.char_indices().map(|(i, _)| i).chain([s.len()]).collect();
    bounds[rng.below(bounds.len())]
}

/// Byte range of the value on `line` (after the first `: ` or `- `, before a comment).
fn value_range(line: &str) -> Option<(usize, usize)> {
    let start = line.find(": ").or_else(|| line.find("- "))? + 2;
    let end = line[start..].find(" #").map_or(line.len(), |c| start + c);
    Some((start, end))
}

fn mutate(rng: &mut Rng, lines: &mut Vec<String>) {
    let n = lines.len();
    let i = rng.below(n);
    match rng.below(12) {
        0 | 1 => {
            if let Some((start, end)) = value_range(&lines[i]) {
                lines[i].replace_range(start..end, rng.pick(VALUES));
            }
        }
        2 => {
            lines.remove(i);
        }
        3 => {
            let copy = lines[i].clone();
            let at = rng.below(n);
            lines.insert(at, copy);
        }
        4 => lines.swap(i, rng.below(n)),
        5 => {
            let at = boundary(rng, &lines[i]);
            let odd = rng.pick(ODD);
            lines[i].insert_str(at, odd);
        }
        6 => {
            // A tab in the indentation, or an indentation changed by one level.
            let indent = lines[i].len() - lines[i].trim_start().len();
            match rng.below(3) {
                0 if indent > 0 => lines[i].replace_range(..1, "\t"),
                1 if indent >= 2 => lines[i].replace_range(..2, ""),
                _ => lines[i].insert_str(0, "  "),
            }
        }
        7 => {
            // The value wrapped into another type.
            if let Some((start, end)) = value_range(&lines[i]) {
                let value = lines[i][start..end].to_owned();
                let wrapped = match rng.below(3) {
                    0 => format!("[{value}]"),
                    1 => format!("{{x: {value}}}"),
                    _ => format!("{value:?}"),
                };
                lines[i].replace_range(start..end, &wrapped);
            }
        }
        8 => {
            // Another line's key: a field out of place, or twice in one map.
            let other = &lines[rng.below(n)];
            if let (Some(colon), Some(key_end)) = (lines[i].find(':'), other.find(':')) {
                let key = other[..key_end].trim_start().trim_start_matches("- ").to_owned();
                let indent = lines[i].len() - lines[i].trim_start().len();
                lines[i].replace_range(indent..colon, &key);
            }
        }
        9 | 10 => {
            // A number of the line (in a value, a rate, a duration) at an edge.
            let line = &lines[i];
            let starts: Vec<usize> = line
                .char_indices()
                .filter(|&(j, c)| c.is_ascii_digit() && !line[..j].ends_with(|p: char| p.is_ascii_digit()))
                .map(|(j, _)| j)
                .collect();
            if !starts.is_empty() {
                let start = starts[rng.below(starts.len())];
                let end = line[start..].find(|c: char| !c.is_ascii_digit()).map_or(line.len(), |e| start + e);
                lines[i].replace_range(start..end, rng.pick(NUMBERS));
            }
        }
        _ => {
            let at = boundary(rng, &lines[i]);
            lines[i].truncate(at);
            lines.truncate(i + 1);
        }
    }
}

fn crashed(log: &str) -> bool {
    log.contains("panicked") || log.contains("memory allocation")
}

/// Starts the accepted mutant, sends it one request, and stops it.
fn run(yaml: &str) {
    let mut sluicegate = match Sluicegate::try_start(yaml) {
        Ok(sluicegate) => sluicegate,
        Err(log) => {
            assert!(!crashed(&log), "run crashed on:\n{yaml}\nlog:\n{log}");
            return;
        }
    };
    if let Ok(mut stream) = TcpStream::connect(sluicegate.addr) {
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = stream.write_all(b"GET /api/x HTTP/1.1\r\nHost: fuzz.test\r\nConnection: close\r\n\r\n");
        let _ = stream.read_to_end(&mut Vec::new());
    }
    let log = sluicegate.kill();
    assert!(!crashed(&log), "run crashed on:\n{yaml}\nlog:\n{log}");
}

#[test]
fn mutated_configurations_are_refused_or_run_but_never_crash() {
    let started = Instant::now();
    // The listeners on port 0 and the upstream on a closed port: mutants that run do not
    // collide with anything else on the machine.
    let base = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config.example.yaml"))
        .unwrap()
        .replace("127.0.0.1:8080", "127.0.0.1:0")
        .replace("127.0.0.1:9901", "127.0.0.1:0")
        .replace("127.0.0.1:3000", &format!("127.0.0.1:{}", closed_port()));
    let base: Vec<String> = base.lines().map(str::to_owned).collect();
    let mut rng = Rng(SEED);
    let (mut accepted, mut runs) = (0, 0);
    for _ in 0..MUTANTS {
        let mut lines = base.clone();
        for _ in 0..=rng.below(3) {
            mutate(&mut rng, &mut lines);
        }
        let yaml = lines.join("\n") + "\n";
        let (code, stderr) = check_bounded(&yaml);
        assert!(
            matches!(code, Some(0 | 1)) && !crashed(&stderr),
            "check exited {code:?} on:\n{yaml}\nstderr:\n{stderr}"
        );
        // Every error is one short line: a mutant never floods the terminal.
        assert!(stderr.lines().all(|l| l.chars().count() < 600), "a long line on:\n{yaml}\nstderr:\n{stderr}");
        // Errors speak of the file, not of the parser library's settings.
        assert!(!stderr.contains("in Options"), "the library's advice on:\n{yaml}\nstderr:\n{stderr}");
        if code == Some(0) {
            accepted += 1;
            if runs < RUNS {
                runs += 1;
                run(&yaml);
            }
        }
    }
    // The mutations are not all fatal: some accepted mutants were run.
    assert!(runs >= 5, "only {runs} mutants were accepted");
    eprintln!("{MUTANTS} mutants, {accepted} accepted, {runs} run, in {:?}", started.elapsed());
}
