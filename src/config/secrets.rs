//! Secrets (the admin token, Redis's credentials) kept out of the configuration file:
//! each can be written as itself, as `${NAME}` (the environment variable `NAME`), or by
//! its `*_file` sibling (the file's contents, a trailing newline dropped: Docker and
//! Kubernetes secrets, systemd credentials). Read at every load, so a reload picks up a
//! rotated secret.

use super::checks::Errors;

/// The secret at `field` (`admin.token`), given as `value` or by the file `file` (the
/// field `{field}_file`), if either is; a missing variable or file is an error at its
/// field.
pub(super) fn secret(e: &mut Errors<'_>, field: &str, value: Option<&str>, file: Option<&str>) -> Option<String> {
    match (value, file) {
        (Some(_), Some(_)) => {
            e.add(
                format!("{field}_file"),
                format!("give either `{}` or `{}_file`, not both", leaf(field), leaf(field)),
            );
            None
        }
        (Some(value), None) => e.check(|| field.to_owned(), from_environment(value)),
        (None, Some(file)) => e.check(|| format!("{field}_file"), from_file(file)),
        (None, None) => None,
    }
}

fn leaf(field: &str) -> &str {
    field.rsplit('.').next().unwrap_or(field)
}

/// `value` itself, or the variable it names as `${NAME}`.
fn from_environment(value: &str) -> Result<String, String> {
    let Some(name) = value.strip_prefix("${").and_then(|v| v.strip_suffix('}')) else { return Ok(value.to_owned()) };
    match std::env::var(name) {
        Ok(secret) if !secret.is_empty() => Ok(secret),
        Ok(_) => Err(format!("the environment variable {name} is empty")),
        Err(std::env::VarError::NotPresent) => Err(format!("the environment variable {name} is not set")),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("the environment variable {name} is not UTF-8")),
    }
}

/// The contents of `path`, without the newline an editor or `echo` leaves at its end.
fn from_file(path: &str) -> Result<String, String> {
    let bytes = super::files::read_regular(path)?;
    let text = String::from_utf8(bytes).map_err(|_| format!("{path:?} is not UTF-8 text"))?;
    let secret = text.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t)).unwrap_or(&text);
    if secret.is_empty() {
        return Err(format!("{path:?} is empty"));
    }
    Ok(secret.to_owned())
}
