//! `cargo test --release` after `cargo run --release` builds no dependency again: every
//! feature the tests' dependencies turn on in a crate the binary uses is asked for in
//! `Cargo.toml` too (docs/internals.md, *Building once*). A test dependency that turns on one more (the gRPC
//! tests' tonic did) would make every crate above it build twice.

use std::collections::BTreeMap;
use std::process::Command;

/// Every package of the build with the features it is built with: the binary's alone
/// (`no_dev`), or with the tests' dependencies.
fn features(no_dev: bool) -> BTreeMap<String, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut tree = Command::new(cargo);
    tree.current_dir(env!("CARGO_MANIFEST_DIR")).args(["tree", "--offline", "--locked", "--prefix", "none"]);
    tree.args(["--format", "{p} [{f}]"]);
    if no_dev {
        tree.args(["--edges", "no-dev"]);
    }
    let out = tree.output().expect("cargo runs");
    assert!(out.status.success(), "cargo tree: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| {
            let (package, features) = line.trim_end_matches(" (*)").split_once(" [")?;
            Some((package.to_owned(), features.trim_end_matches(']').to_owned()))
        })
        .collect()
}

#[test]
fn the_tests_turn_on_no_feature_the_binary_lacks() {
    let (binary, tests) = (features(true), features(false));
    let differ: Vec<String> = binary
        .iter()
        .filter_map(|(package, theirs)| {
            let ours = &tests[package];
            (ours != theirs).then(|| format!("{package}: the binary's [{theirs}], the tests' [{ours}]"))
        })
        .collect();
    assert!(differ.is_empty(), "ask for the tests' features in Cargo.toml too:\n{}", differ.join("\n"));
    assert!(binary.len() > 100, "{} packages", binary.len());
}
