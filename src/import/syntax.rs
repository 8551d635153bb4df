//! nginx's configuration syntax: words, directives ended by `;` and blocks in `{}`, each
//! directive with the file and line it starts on.
//!
//! Written here rather than taken from a crate: those on crates.io either refuse
//! directives they do not know (`nginx-config`), or split one nginx word into several
//! arguments (`nginx-lint-parser` 0.24 reads `$binary_remote_addr$http_x_key` as two,
//! which changes what a `limit_req_zone` key means) and accept words nginx refuses
//! (`^/a{3}$` unquoted). nginx's own rules (`ngx_conf_read_token`) fit in this file.

use std::fmt;
use std::sync::Arc;

/// Where a directive starts: file and line (1-based).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct At {
    pub file: Arc<str>,
    pub line: usize,
}

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

#[derive(Debug, Clone)]
pub struct Directive {
    pub name: String,
    /// The words after the name, quotes removed and escapes applied as nginx does.
    pub args: Vec<String>,
    pub at: At,
    /// The line of the `;` or `{` that ends it: where nginx places its errors.
    pub end: usize,
    /// The directives of its `{}` block; `None` for a directive ended by `;`.
    pub block: Option<Vec<Directive>>,
}

impl Directive {
    /// The directive as written on one line (`limit_req zone=one burst=5`), for notes.
    pub fn text(&self) -> String {
        let mut text = self.name.clone();
        for arg in &self.args {
            text.push(' ');
            if arg.is_empty() || arg.contains(|c: char| c.is_whitespace() || c == ';' || c == '{') {
                text.push_str(&format!("{arg:?}"));
            } else {
                text.push_str(arg);
            }
        }
        text
    }

    pub fn block(&self) -> &[Directive] {
        self.block.as_deref().unwrap_or_default()
    }
}

/// A file nginx would refuse to load, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntaxError {
    pub at: At,
    pub message: String,
}

impl fmt::Display for SyntaxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Line 0: the file as a whole (it cannot be read).
        match self.at.line {
            0 => write!(f, "{}: {}", self.at.file, self.message),
            _ => write!(f, "{}: {}", self.at, self.message),
        }
    }
}

#[derive(Debug, PartialEq)]
enum Token {
    Word(String),
    Semicolon,
    Open,
    Close,
}

/// Splits `src` into nginx's tokens, each with its line.
struct Lexer<'a> {
    src: &'a [u8],
    pos: usize,
    line: usize,
    file: &'a Arc<str>,
}

impl Lexer<'_> {
    fn error(&self, line: usize, message: impl Into<String>) -> SyntaxError {
        SyntaxError { at: At { file: self.file.clone(), line }, message: message.into() }
    }

    fn bump(&mut self) -> Option<u8> {
        let c = *self.src.get(self.pos)?;
        self.pos += 1;
        if c == b'\n' {
            self.line += 1;
        }
        Some(c)
    }

    fn next(&mut self) -> Result<Option<(Token, usize)>, SyntaxError> {
        loop {
            let line = self.line;
            let Some(c) = self.bump() else { return Ok(None) };
            let token = match c {
                b' ' | b'\t' | b'\r' | b'\n' => continue,
                b'#' => {
                    while self.src.get(self.pos).is_some_and(|&c| c != b'\n') {
                        self.pos += 1;
                    }
                    continue;
                }
                b';' => Token::Semicolon,
                b'{' => Token::Open,
                b'}' => Token::Close,
                b'"' | b'\'' => self.quoted(c, line)?,
                _ => {
                    self.pos -= 1;
                    self.unquoted()
                }
            };
            return Ok(Some((token, line)));
        }
    }

    /// A word in quotes: up to the same quote not escaped by `\`. nginx wants a space,
    /// `;`, `{` or `)` right after it.
    fn quoted(&mut self, quote: u8, line: usize) -> Result<Token, SyntaxError> {
        let start = self.pos;
        loop {
            match self.bump() {
                None => {
                    return Err(self.error(
                        line,
                        format!("unexpected end of file: the {} opened here is never closed", quote as char),
                    ));
                }
                Some(b'\\') => {
                    self.bump();
                }
                Some(c) if c == quote => break,
                Some(_) => {}
            }
        }
        let word = unescape(&self.src[start..self.pos - 1]);
        match self.src.get(self.pos) {
            None | Some(b' ' | b'\t' | b'\r' | b'\n' | b';' | b'{') => {}
            Some(b')') => self.pos += 1,
            Some(&c) => return Err(self.error(self.line, format!("unexpected \"{}\" after a quoted word", c as char))),
        }
        Ok(Token::Word(word))
    }

    /// A word without quotes: up to a space, `;` or `{` (a `{` right after `$` belongs to
    /// a `${name}` variable); `\` escapes the next character.
    fn unquoted(&mut self) -> Token {
        let start = self.pos;
        let mut after_dollar = false;
        while let Some(&c) = self.src.get(self.pos) {
            match c {
                b'{' if after_dollar => {}
                b' ' | b'\t' | b'\r' | b'\n' | b';' | b'{' => break,
                b'\\' => {
                    self.bump();
                }
                _ => {}
            }
            after_dollar = c == b'$';
            self.bump();
        }
        Token::Word(unescape(&self.src[start..self.pos]))
    }

    /// The raw text of a block of another language (`content_by_lua_block { … }`) up to
    /// its closing brace, skipping braces in its strings and comments.
    fn skip_foreign_block(&mut self, line: usize) -> Result<(), SyntaxError> {
        let mut depth = 1;
        while let Some(c) = self.bump() {
            match c {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        return Ok(());
                    }
                }
                b'"' | b'\'' => {
                    while let Some(d) = self.bump() {
                        if d == b'\\' {
                            self.bump();
                        } else if d == c || d == b'\n' {
                            break;
                        }
                    }
                }
                b'-' if self.src.get(self.pos) == Some(&b'-') => {
                    while self.src.get(self.pos).is_some_and(|&c| c != b'\n') {
                        self.pos += 1;
                    }
                }
                _ => {}
            }
        }
        Err(self.error(line, "unexpected end of file: the block opened here is never closed"))
    }
}

/// nginx's escapes: `\"`, `\'` and `\\` lose their backslash, `\t`, `\r`, `\n` are
/// control characters, any other `\` stays as written.
fn unescape(raw: &[u8]) -> String {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'\\' && i + 1 < raw.len() {
            let escaped = match raw[i + 1] {
                c @ (b'"' | b'\'' | b'\\') => Some(c),
                b't' => Some(b'\t'),
                b'r' => Some(b'\r'),
                b'n' => Some(b'\n'),
                _ => None,
            };
            if let Some(c) = escaped {
                out.push(c);
                i += 2;
                continue;
            }
        }
        out.push(raw[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Directives whose block is code in another language, kept out of nginx's tokenizer
/// as the module that owns them does.
fn is_foreign_block(name: &str) -> bool {
    name.ends_with("_by_lua_block") || name.ends_with("_by_njs_block")
}

/// The directives of `src`, nested as written; `file` names it in positions.
pub fn parse(src: &str, file: &Arc<str>) -> Result<Vec<Directive>, SyntaxError> {
    let mut lexer = Lexer { src: src.as_bytes(), pos: 0, line: 1, file };
    // Open blocks: the directive that opened each (with the line of its brace) and the
    // directives read inside it so far.
    let mut stack: Vec<(Directive, usize, Vec<Directive>)> = Vec::new();
    let mut done: Vec<Directive> = Vec::new();
    let mut words: Vec<String> = Vec::new();
    let mut first_line = 0;
    let at = |line| At { file: file.clone(), line };
    while let Some((token, line)) = lexer.next()? {
        match token {
            Token::Word(word) => {
                if words.is_empty() {
                    first_line = line;
                }
                words.push(word);
            }
            Token::Semicolon | Token::Open if words.is_empty() => {
                let c = if token == Token::Open { '{' } else { ';' };
                return Err(lexer.error(line, format!("unexpected \"{c}\"")));
            }
            Token::Semicolon => {
                let name = words.remove(0);
                let args = std::mem::take(&mut words);
                let directive = Directive { name, args, at: at(first_line), end: line, block: None };
                stack.last_mut().map_or(&mut done, |open| &mut open.2).push(directive);
            }
            Token::Open => {
                let name = words.remove(0);
                let args = std::mem::take(&mut words);
                let directive = Directive { name, args, at: at(first_line), end: line, block: None };
                if is_foreign_block(&directive.name) {
                    lexer.skip_foreign_block(line)?;
                    let directive = Directive { block: Some(Vec::new()), ..directive };
                    stack.last_mut().map_or(&mut done, |open| &mut open.2).push(directive);
                } else {
                    stack.push((directive, line, Vec::new()));
                }
            }
            Token::Close => {
                if !words.is_empty() {
                    return Err(lexer.error(line, "unexpected \"}\": the directive before it has no \";\""));
                }
                let Some((directive, _, inner)) = stack.pop() else {
                    return Err(lexer.error(line, "unexpected \"}\": no block is open"));
                };
                let directive = Directive { block: Some(inner), ..directive };
                stack.last_mut().map_or(&mut done, |open| &mut open.2).push(directive);
            }
        }
    }
    if !words.is_empty() {
        return Err(lexer.error(first_line, "unexpected end of file: this directive has no \";\""));
    }
    if let Some((directive, line, _)) = stack.pop() {
        return Err(lexer.error(
            line,
            format!("unexpected end of file: the block of \"{}\" opened here is never closed", directive.name),
        ));
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(src: &str) -> Result<Vec<Directive>, String> {
        parse(src, &Arc::from("t.conf")).map_err(|e| e.to_string())
    }

    /// name(args){…} per directive, to compare trees at a glance.
    fn shape(directives: &[Directive]) -> String {
        let one = |d: &Directive| {
            let block = d.block.as_ref().map(|b| format!("{{{}}}", shape(b))).unwrap_or_default();
            format!("{}@{}{:?}{block}", d.name, d.at.line, d.args)
        };
        directives.iter().map(one).collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn words_end_only_at_spaces_semicolons_and_braces() {
        let tree =
            parsed("limit_req_zone $binary_remote_addr$http_x zone=one:10m rate=1r/s;\nkey ${a}x \"a b\" '';").unwrap();
        assert_eq!(
            shape(&tree),
            r#"limit_req_zone@1["$binary_remote_addr$http_x", "zone=one:10m", "rate=1r/s"] key@2["${a}x", "a b", ""]"#
        );
    }

    #[test]
    fn blocks_nest_and_keep_the_line_each_directive_starts_on() {
        let tree = parsed("http {\n  # a comment; {\n  server {\n    listen\n      80;\n  }\n}\n").unwrap();
        assert_eq!(shape(&tree), r#"http@1[]{server@3[]{listen@4["80"]}}"#);
    }

    #[test]
    fn escapes_are_applied_as_nginx_applies_them() {
        let tree = parsed(r#"return 200 "a\"b\\c\nd\$e"; x a\;b;"#).unwrap();
        assert_eq!(tree[0].args[1], "a\"b\\c\nd\\$e");
        // `\;` keeps the word going, and its backslash.
        assert_eq!(tree[1].args, ["a\\;b"]);
    }

    #[test]
    fn code_blocks_of_other_languages_are_skipped_whole() {
        let tree = parsed("location / {\n content_by_lua_block {\n  ngx.say(\"}\") -- }\n }\n proxy_pass http://b;\n}")
            .unwrap();
        assert_eq!(shape(&tree), r#"location@1["/"]{content_by_lua_block@2[]{} proxy_pass@5["http://b"]}"#);
    }

    #[test]
    fn syntax_errors_name_the_file_and_line() {
        assert_eq!(
            parsed("server {\n listen 80\n}").unwrap_err(),
            "t.conf:3: unexpected \"}\": the directive before it has no \";\""
        );
        assert_eq!(parsed("a;\n}").unwrap_err(), "t.conf:2: unexpected \"}\": no block is open");
        assert_eq!(
            parsed("http {\n server {\n").unwrap_err(),
            "t.conf:2: unexpected end of file: the block of \"server\" opened here is never closed"
        );
        assert_eq!(
            parsed("a \"b;\nc;").unwrap_err(),
            "t.conf:1: unexpected end of file: the \" opened here is never closed"
        );
        assert_eq!(parsed("\n;").unwrap_err(), "t.conf:2: unexpected \";\"");
        assert_eq!(parsed("a \"b\"c;").unwrap_err(), "t.conf:1: unexpected \"c\" after a quoted word");
        assert_eq!(parsed("listen 80").unwrap_err(), "t.conf:1: unexpected end of file: this directive has no \";\"");
    }
}
