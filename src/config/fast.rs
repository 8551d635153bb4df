//! The common path: the file parsed once, by serde under `strict`'s watch; `None` when
//! serde fails, and the full path (`parse`: serde beside the `fields` walk) finds and
//! places every error.
//!
//! Why: on a file of 100,000 routes the full path parsed the YAML twice (serde's pass and
//! the walk); the `strict` pass vouches for what the walk would have checked, so a valid
//! file is parsed once.

use super::raw::RawConfig;
use super::{strict, yaml_options};

/// What serde makes of `src`, and whether `strict` vouches that the `fields` walk finds
/// nothing in it; `None`: serde failed.
pub(super) fn raw(src: &str) -> Option<(RawConfig, bool)> {
    serde_saphyr::with_deserializer_from_str_with_options(src, yaml_options(), |de| strict::deserialize(de)).ok()
}
