//! Files the configuration names (a CA bundle today, certificates later), read once at
//! load: only regular files, and only up to a size that no such file reaches.

use std::io::Read;

/// Larger than any PEM bundle in use (Mozilla's whole root store is about 200 KiB).
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// The contents of `path`, or why it cannot serve: a device such as `/dev/zero` would be
/// read until memory runs out, a FIFO would block the load forever.
pub fn read_regular(path: &str) -> Result<Vec<u8>, String> {
    read_bounded(std::path::Path::new(path), MAX_FILE_BYTES).map_err(|err| match err.kind() {
        std::io::ErrorKind::InvalidInput => format!("{path:?} {err}"),
        _ => format!("cannot read {path:?}: {err}"),
    })
}

/// The contents of the regular file at `path`, if it holds at most `max` bytes; a
/// device, a FIFO or a larger file is an `InvalidInput` error saying which.
pub fn read_bounded(path: &std::path::Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Error, ErrorKind};
    let too_large = || Error::new(ErrorKind::InvalidInput, format!("is larger than {} KiB", max / 1024));
    // Checked before opening: opening a FIFO for reading blocks until a writer comes;
    // and a file too large is refused unread, whatever it holds (a sparse file of a
    // gigabyte costs nothing to plant).
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(Error::new(ErrorKind::InvalidInput, "is not a regular file"));
    }
    if meta.len() > max {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    // Bounded here too: the file may have grown, or been replaced, since the check.
    std::fs::File::open(path)?.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(too_large());
    }
    Ok(bytes)
}

/// Whether a log can be appended to `path`: an existing regular file opened for
/// appending, or a new file in an existing directory (made and removed again to know).
pub fn appendable(path: &str) -> Result<(), String> {
    use std::fs::OpenOptions;
    let at = std::path::Path::new(path);
    let result = match std::fs::metadata(at) {
        Ok(meta) if !meta.is_file() => return Err(format!("{path:?} is not a regular file")),
        Ok(_) => OpenOptions::new().append(true).open(at).map(drop),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            OpenOptions::new().append(true).create_new(true).open(at).and_then(|_| std::fs::remove_file(at))
        }
        Err(e) => Err(e),
    };
    result.map_err(|e| format!("cannot open {path:?} for appending: {e}"))
}
