//! Shared by the integration tests: where the llama.cpp fixtures live.

use std::path::PathBuf;

/// `$MOXIE_FIXTURES`, else `../shared/fixtures` next to the checkout. Panics (fails the test)
/// when the directory is missing: fidelity tests must not skip silently.
pub fn fixtures() -> PathBuf {
    let dir = match std::env::var_os("MOXIE_FIXTURES") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures"),
    };
    assert!(
        dir.join("golden/index.json").is_file() && dir.join("models").is_dir(),
        "fixture directory {} not found (set MOXIE_FIXTURES)",
        dir.display()
    );
    dir
}
