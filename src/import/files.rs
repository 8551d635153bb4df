//! Reads the nginx configuration and every file it includes, as nginx does: a relative
//! `include` (and certificate path) is taken from the directory of the main file, the
//! "configuration prefix"; a pattern with `*`, `?` or `[` includes every match in
//! alphabetical order, and none at all is no error.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::syntax::{self, At, Directive, SyntaxError};

/// Far above any real nginx configuration; a path to `/dev/zero` must not be read until
/// memory runs out.
const MAX_FILE_BYTES: u64 = 16 << 20;

/// Includes within includes deeper than this are a loop nginx would never finish.
const MAX_DEPTH: usize = 32;

/// The configuration with every `include` replaced by the directives it names.
pub struct Loaded {
    pub directives: Vec<Directive>,
    /// Where relative paths of the configuration start (nginx's `conf_prefix`).
    pub conf_prefix: PathBuf,
}

/// Reads `conf` (taken in `prefix` when relative and a prefix is given, as `nginx -p`
/// does) and the files it includes.
pub fn load(conf: &Path, prefix: Option<&Path>) -> Result<Loaded, SyntaxError> {
    let conf = match prefix {
        Some(prefix) if conf.is_relative() => prefix.join(conf),
        _ => conf.to_path_buf(),
    };
    let conf_prefix = conf.parent().map(Path::to_path_buf).unwrap_or_default();
    let reader = Reader { conf_prefix };
    let directives = reader.file(&conf, None, &mut Vec::new())?;
    Ok(Loaded { directives, conf_prefix: reader.conf_prefix })
}

struct Reader {
    conf_prefix: PathBuf,
}

impl Reader {
    /// The directives of the file at `path`, includes expanded; `from` is the `include`
    /// that named it, `open` the files being read around it.
    fn file(&self, path: &Path, from: Option<&At>, open: &mut Vec<PathBuf>) -> Result<Vec<Directive>, SyntaxError> {
        let name: Arc<str> = Arc::from(path.display().to_string());
        let fail = |message: String| match from {
            Some(at) => SyntaxError { at: at.clone(), message: format!("include: {} {message}", path.display()) },
            None => SyntaxError { at: At { file: name.clone(), line: 0 }, message },
        };
        if open.iter().any(|p| p == path) || open.len() >= MAX_DEPTH {
            return Err(fail("includes itself".into()));
        }
        let src = read(path).map_err(|e| fail(format!("cannot be read: {e}")))?;
        let tree = syntax::parse(&src, &name)?;
        open.push(path.to_path_buf());
        let expanded = self.expand(tree, open);
        open.pop();
        expanded
    }

    fn expand(&self, tree: Vec<Directive>, open: &mut Vec<PathBuf>) -> Result<Vec<Directive>, SyntaxError> {
        let mut out = Vec::with_capacity(tree.len());
        for mut directive in tree {
            if directive.name == "include" && directive.block.is_none() {
                let [pattern] = &directive.args[..] else {
                    return Err(SyntaxError { at: directive.at, message: "include: takes one file or pattern".into() });
                };
                for path in self.matches(pattern, &directive.at)? {
                    out.extend(self.file(&path, Some(&directive.at), open)?);
                }
                continue;
            }
            if let Some(block) = directive.block.take() {
                directive.block = Some(self.expand(block, open)?);
            }
            out.push(directive);
        }
        Ok(out)
    }

    /// The files an `include` names.
    fn matches(&self, pattern: &str, at: &At) -> Result<Vec<PathBuf>, SyntaxError> {
        let full = self.conf_prefix.join(pattern);
        if !pattern.contains(['*', '?', '[']) {
            return Ok(vec![full]);
        }
        let bad = |message: String| SyntaxError { at: at.clone(), message: format!("include: {message}") };
        // glob(3), which nginx calls, leaves out names that start with a dot unless the
        // pattern spells the dot.
        let options = glob::MatchOptions { require_literal_leading_dot: true, ..glob::MatchOptions::new() };
        let found = glob::glob_with(&full.to_string_lossy(), options).map_err(|e| bad(format!("{pattern:?}: {e}")))?;
        found.map(|entry| entry.map_err(|e| bad(e.to_string()))).collect()
    }
}

/// The text of a regular file of at most `MAX_FILE_BYTES`.
fn read(path: &Path) -> std::io::Result<String> {
    use std::io::{Error, ErrorKind};
    if !std::fs::metadata(path)?.is_file() {
        return Err(Error::new(ErrorKind::InvalidInput, "not a regular file"));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)?.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(Error::new(ErrorKind::InvalidInput, format!("larger than {} MiB", MAX_FILE_BYTES >> 20)));
    }
    String::from_utf8(bytes).map_err(|_| Error::new(ErrorKind::InvalidData, "not UTF-8 text"))
}
