//! Errors in the user's words: the YAML parser's errors retold (a duplicated key with
//! both its lines, a number that is not one, a tab where it stands), and quoted values
//! cut short so that a huge value cannot flood the terminal.

use serde_saphyr::Error;

use super::position::Positions;

/// Characters of a quoted value or a path segment kept in a message.
const QUOTE_CHARS: usize = 60;

/// `text` with every quoted run (between `"` or `` ` ``) longer than `QUOTE_CHARS`
/// characters cut to that many and `…`.
pub fn shorten_quotes(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(4096));
    let mut quote: Option<char> = None;
    let (mut kept, mut escaped) = (0, false);
    for c in text.chars() {
        match quote {
            None => {
                out.push(c);
                if c == '"' || c == '`' {
                    (quote, kept, escaped) = (Some(c), 0, false);
                }
            }
            Some(q) if c == q && !escaped => {
                if kept > QUOTE_CHARS {
                    out.push('…');
                }
                out.push(c);
                quote = None;
            }
            Some(_) => {
                // `"` inside a Debug-quoted string is escaped as `\"`.
                escaped = !escaped && c == '\\';
                kept += 1;
                if kept <= QUOTE_CHARS {
                    out.push(c);
                }
            }
        }
    }
    if quote.is_some() && kept > QUOTE_CHARS {
        out.push('…');
    }
    out
}

/// A field path with each segment (a name from the file) cut to `QUOTE_CHARS`.
pub fn shorten_path(path: &str) -> String {
    if path.len() <= QUOTE_CHARS {
        return path.to_owned();
    }
    let segments: Vec<String> = path
        .split('.')
        .map(|s| {
            if s.chars().count() > QUOTE_CHARS {
                s.chars().take(QUOTE_CHARS).collect::<String>() + "…"
            } else {
                s.to_owned()
            }
        })
        .collect();
    segments.join(".")
}

/// Where a parse error stands and what it means: (line, column, field path, message).
pub fn describe(error: &Error, src: &str, positions: &Positions, path: &str) -> (usize, usize, String, String) {
    let error = error.without_snippet();
    let (line, column) = error.location().map_or((1, 1), |l| (l.line() as usize, l.column() as usize));
    // `serde_path_to_error` writes `?` for a key it has not read yet.
    let path = path.trim_end_matches('?').trim_end_matches('.');
    let path = if path == "." { "" } else { path }.to_owned();
    let message = match error {
        Error::DuplicateMappingKey { key: Some(key), .. } => {
            let first = positions.key_line(&if path.is_empty() { key.clone() } else { format!("{path}.{key}") });
            match first {
                Some(first) if first != line => format!("`{key}` is defined twice, lines {first} and {line}"),
                _ => format!("`{key}` is defined twice"),
            }
        }
        Error::InvalidScalar { ty, .. } if ty.starts_with('u') => {
            let digits = scalar_at(src, line, column).bytes().all(|b| b.is_ascii_digit());
            let max = match *ty {
                "u8" => u64::from(u8::MAX),
                "u16" => u64::from(u16::MAX),
                "u32" => u64::from(u32::MAX),
                _ => u64::MAX,
            };
            if digits { format!("must be a whole number at most {max}") } else { "must be a whole number ≥ 0".into() }
        }
        Error::InvalidScalar { ty: "boolean", .. } | Error::InvalidBooleanStrict { .. } => {
            "must be true or false".into()
        }
        other => {
            // The library's wording for users: no advice on its own options.
            let message = other.render_with_formatter(&serde_saphyr::UserMessageFormatter);
            // The plain message ends with the location we print in front instead.
            let suffix = format!(" at line {line}, column {column}");
            let message = message.strip_suffix(&suffix).unwrap_or(&message).to_owned();
            if message.contains("tab")
                && let Some((tab_line, tab_column)) = indenting_tab(src)
            {
                return (
                    tab_line,
                    tab_column,
                    String::new(),
                    "a tab in the indentation; YAML indents with spaces".into(),
                );
            }
            // The parser notices an unclosed `{` or `[` where it gives up, often lines
            // later: point at the bracket instead.
            if (message.contains("did not find expected ',' or '}'")
                || message.contains("did not find expected ',' or ']'"))
                && let Some((open_line, open_column, bracket)) = unclosed(src, line, column)
                && open_line < line
            {
                let close = if bracket == '{' { '}' } else { ']' };
                return (
                    open_line,
                    open_column,
                    path,
                    format!("this `{bracket}` is not closed: a `{close}` (or a `,`) is missing before line {line}"),
                );
            }
            message
        }
    };
    (line, column, path, message)
}

/// The innermost `{` or `[` still open at `line`:`column` (1-based), outside quotes and
/// comments: its line, column and character.
fn unclosed(src: &str, line: usize, column: usize) -> Option<(usize, usize, char)> {
    let mut open = Vec::new();
    for (n, text) in src.lines().enumerate().take(line) {
        let mut quote = None;
        let mut previous = ' ';
        for (c, ch) in text.chars().enumerate() {
            if n + 1 == line && c + 1 >= column {
                break;
            }
            match (quote, ch) {
                (Some('"'), '"') if previous != '\\' => quote = None,
                (Some('\''), '\'') => quote = None,
                (Some(_), _) => {}
                (None, '"' | '\'') => quote = Some(ch),
                (None, '#') if previous.is_whitespace() => break,
                (None, '{' | '[') => open.push((n + 1, c + 1, ch)),
                (None, '}' | ']') => {
                    open.pop();
                }
                _ => {}
            }
            previous = ch;
        }
    }
    open.pop()
}

/// What a file of only comments and blank lines is told (serde would make it a
/// configuration of placeholders, with an error about one of them).
pub const EMPTY: &str = "the file is empty; a configuration needs at least `listen: IP:PORT`";

/// Only comments and blank lines.
pub fn is_blank(src: &str) -> bool {
    src.lines().map(str::trim).all(|l| l.is_empty() || l.starts_with('#') || l == "---")
}

/// The plain scalar starting at `line`:`column` (1-based), up to a flow delimiter or comment.
fn scalar_at(src: &str, line: usize, column: usize) -> &str {
    let text = src.lines().nth(line.saturating_sub(1)).unwrap_or_default();
    let start = text.char_indices().nth(column.saturating_sub(1)).map_or(text.len(), |(i, _)| i);
    let rest = &text[start..];
    let end = rest.find([',', '}', ']', '#']).unwrap_or(rest.len());
    rest[..end].trim()
}

/// The first tab in a line's indentation (line and column, 1-based).
fn indenting_tab(src: &str) -> Option<(usize, usize)> {
    src.lines().enumerate().find_map(|(i, line)| {
        let indent = &line[..line.len() - line.trim_start().len()];
        indent.find('\t').map(|at| (i + 1, indent[..at].chars().count() + 1))
    })
}

/// Line and column (1-based) of the first byte of `bytes` that is not UTF-8.
pub fn utf8_error_position(bytes: &[u8], valid_up_to: usize) -> (usize, usize) {
    let valid = &bytes[..valid_up_to];
    let line_start = valid.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let line = valid.iter().filter(|&&b| b == b'\n').count() + 1;
    // `valid` is UTF-8 up to here: count characters, not bytes.
    let column = String::from_utf8_lossy(&valid[line_start..]).chars().count() + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_quoted_values_are_cut_and_short_ones_kept() {
        let long = "k".repeat(500);
        assert_eq!(
            shorten_quotes(&format!("unknown field `{long}`, expected `a`")),
            format!("unknown field `{}…`, expected `a`", "k".repeat(60))
        );
        assert_eq!(shorten_quotes(r#"invalid name "a\"b""#), r#"invalid name "a\"b""#);
        assert_eq!(shorten_path(&format!("limits.{long}.rate")), format!("limits.{}….rate", "k".repeat(60)));
    }

    #[test]
    fn utf8_errors_are_placed_by_line_and_character() {
        let bytes = b"a: 1\nb: \xc3\xa9\xff\n";
        // Valid up to the 0xFF: five bytes of line 1, four of line 2 (`é` is two).
        assert_eq!(utf8_error_position(bytes, 10), (2, 5));
    }
}
