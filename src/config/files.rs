//! Files the configuration names (a CA bundle today, certificates later), read once at
//! load: only regular files, and only up to a size that no such file reaches.

use std::io::Read;

/// Larger than any PEM bundle in use (Mozilla's whole root store is about 200 KiB).
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// The contents of `path`, or why it cannot serve: a device such as `/dev/zero` would be
/// read until memory runs out, a FIFO would block the load forever.
pub fn read_regular(path: &str) -> Result<Vec<u8>, String> {
    let cannot = |err: std::io::Error| format!("cannot read {path:?}: {err}");
    // Checked before opening: opening a FIFO for reading blocks until a writer comes.
    let meta = std::fs::metadata(path).map_err(cannot)?;
    if !meta.is_file() {
        return Err(format!("{path:?} is not a regular file"));
    }
    let file = std::fs::File::open(path).map_err(cannot)?;
    let mut bytes = Vec::new();
    // Bounded here too: the file may have grown, or been replaced, since the check.
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(cannot)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!("{path:?} is larger than {} KiB", MAX_FILE_BYTES / 1024));
    }
    Ok(bytes)
}
