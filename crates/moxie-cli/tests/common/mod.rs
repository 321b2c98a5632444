//! Shared by the command-line tests: running the `moxie` binary, the shared fixtures, scratch
//! paths. Each test binary uses a part of it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// The `moxie` binary of this build, run with `args` to completion.
pub fn moxie(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_moxie"))
        .args(args)
        .output()
        .expect("running moxie")
}

/// `path` under `$MOXIE_FIXTURES` or `../shared/fixtures` next to the checkout (the test fails
/// if missing).
pub fn fixture(path: &str) -> String {
    let dir = match std::env::var_os("MOXIE_FIXTURES") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures"),
    };
    let path = dir.join(path);
    assert!(
        path.is_file(),
        "{} not found (set MOXIE_FIXTURES)",
        path.display()
    );
    path.to_str().unwrap().to_owned()
}

/// The fixture model file `name` (`models/{name}`).
pub fn fixture_model(name: &str) -> String {
    fixture(&format!("models/{name}"))
}

/// A scratch file `moxie-{tag}-{pid}-{name}` in the target's temporary directory (else the
/// system's).
pub fn tmp(tag: &str, name: &str) -> PathBuf {
    let base = std::env::var_os("CARGO_TARGET_TMPDIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    base.join(format!("moxie-{tag}-{}-{name}", std::process::id()))
}

/// A fresh, empty directory `moxie-{tag}-{test}-{pid}` in the target's temporary directory,
/// of test `test`'s own (tests run in parallel threads of one process).
pub fn tmp_dir(tag: &str, test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("moxie-{tag}-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
