//! One scrape of `/metrics` read back: each sample by its name and labels.
//!
//! Hand-written: a sample line of the text exposition (Prometheus and OpenMetrics) is
//! `name{label="value",…} value [timestamp]`, with `\\`, `\"` and `\n` escaped in values,
//! and only sluicegate's own page is read here; the parsers on crates.io bring a date
//! library and a regex engine for the same few rules.

use std::collections::HashMap;

/// A sample's labels, sorted by name.
type Labels = Vec<(String, String)>;

/// The samples of one scrape.
#[derive(Debug, Default, Clone)]
pub struct Scrape {
    samples: HashMap<(String, Labels), f64>,
}

/// A line that is no sample: its number and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {why}: {text:?}")]
pub struct ExpositionError {
    pub line: usize,
    pub why: &'static str,
    pub text: String,
}

impl Scrape {
    /// The samples of `text`, a `/metrics` page.
    pub fn parse(text: &str) -> Result<Scrape, ExpositionError> {
        let mut samples = HashMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why| ExpositionError { line: n + 1, why, text: line.to_owned() };
            let (name, labels, rest) = sample(line).ok_or_else(|| bad("not a sample"))?;
            let value = rest.split_whitespace().next().ok_or_else(|| bad("no value"))?;
            let value: f64 = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v.parse().map_err(|_| bad("the value is no number"))?,
            };
            samples.insert((name.to_owned(), labels), value);
        }
        Ok(Scrape { samples })
    }

    /// The value of sample `name` with exactly `labels` (in any order), if there is one.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut key: Labels = labels.iter().map(|&(k, v)| (k.to_owned(), v.to_owned())).collect();
        key.sort_unstable();
        self.samples.get(&(name.to_owned(), key)).copied()
    }
}

/// `name{labels} rest`: the name, its labels sorted, and what follows them.
fn sample(line: &str) -> Option<(&str, Labels, &str)> {
    let end = line.find(['{', ' ', '\t']).unwrap_or(line.len());
    let (name, mut rest) = line.split_at(end);
    if name.is_empty() {
        return None;
    }
    let mut labels = Labels::new();
    if let Some(inner) = rest.strip_prefix('{') {
        rest = inner;
        loop {
            rest = rest.trim_start_matches([',', ' ']);
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let (label, after) = rest.split_once("=\"")?;
            let (value, after) = quoted(after)?;
            labels.push((label.trim().to_owned(), value));
            rest = after;
        }
    }
    labels.sort_unstable();
    Some((name, labels, rest))
}

/// The value of a label, its escapes undone, up to its closing quote; and what follows.
fn quoted(text: &str) -> Option<(String, &str)> {
    let mut value = String::new();
    let mut chars = text.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((value, &text[i + 1..])),
            '\\' => match chars.next()?.1 {
                'n' => value.push('\n'),
                other => value.push(other),
            },
            c => value.push(c),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_found_by_name_and_labels_in_any_order() {
        let page = "# HELP sluicegate_requests Requests\n# TYPE sluicegate_requests counter\n\
                    sluicegate_requests_total{route=\"api\",outcome=\"passed\"} 12\n\
                    sluicegate_limit_delay_seconds_sum{limit=\"a \\\"b\\\\\"} 0.25\n\
                    sluicegate_start_time_seconds 1767225600\n\
                    sluicegate_limit_delay_seconds_bucket{limit=\"x\",le=\"+Inf\"} 3 1767225600.5\n# EOF\n";
        let scrape = Scrape::parse(page).unwrap();
        assert_eq!(scrape.get("sluicegate_requests_total", &[("outcome", "passed"), ("route", "api")]), Some(12.0));
        assert_eq!(scrape.get("sluicegate_limit_delay_seconds_sum", &[("limit", "a \"b\\")]), Some(0.25));
        assert_eq!(scrape.get("sluicegate_start_time_seconds", &[]), Some(1_767_225_600.0));
        assert_eq!(scrape.get("sluicegate_limit_delay_seconds_bucket", &[("limit", "x"), ("le", "+Inf")]), Some(3.0));
        assert_eq!(scrape.get("sluicegate_requests_total", &[("route", "api")]), None, "labels must all match");
    }

    #[test]
    fn a_line_that_is_no_sample_is_an_error_with_its_number() {
        let e = Scrape::parse("a 1\nb{x=\"1} 2\n").unwrap_err();
        assert_eq!((e.line, e.why), (2, "not a sample"));
        assert_eq!(Scrape::parse("a one").unwrap_err().why, "the value is no number");
        assert_eq!(Scrape::parse("a").unwrap_err().why, "no value");
    }
}
