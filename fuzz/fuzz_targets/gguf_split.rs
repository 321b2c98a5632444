//! A split GGUF set of any bytes: the input is one byte choosing the part to open, then the
//! parts' images separated by [`PART_SEP`]. They are written as `fuzz-0000k-of-0000n.gguf`
//! into a directory of this process's own and opened as a set (header only, then with the
//! tensor bytes), so what the parts say about each other (`split.count`, `split.no`,
//! `split.tensors.count`, tensors per part) meets every disagreement. Every failure must be an
//! error, never a panic, hang or huge allocation.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use moxie_gguf::{GgufFile, OpenOptions};

/// Between two parts' bytes (`scripts/fuzz.sh seed` writes seeds this way).
const PART_SEP: &[u8] = b"\xf0GGUF-PART\xf0";

/// At most this many parts: the set is written to disk at every input.
const MAX_PARTS: usize = 8;

fn dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // tmpfs where there is one: every input is written as files.
        let base = Path::new("/dev/shm");
        let base = if base.is_dir() {
            base.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let d = base.join(format!("moxie-fuzz-split-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("creating the fuzz directory");
        d
    })
}

fn parts(mut rest: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while let Some(at) = rest.windows(PART_SEP.len()).position(|w| w == PART_SEP) {
        out.push(&rest[..at]);
        rest = &rest[at + PART_SEP.len()..];
    }
    out.push(rest);
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let parts = parts(rest);
    let n = parts.len();
    if !(2..=MAX_PARTS).contains(&n) {
        return;
    }
    let dir = dir();
    if let Ok(old) = std::fs::read_dir(dir) {
        for e in old.flatten() {
            let _ = std::fs::remove_file(e.path());
        }
    }
    let name = |i: usize| dir.join(format!("fuzz-{:05}-of-{n:05}.gguf", i + 1));
    for (i, p) in parts.iter().enumerate() {
        // With `pick`'s high bit set the last part is left out: the missing-part error.
        if i > 0 && pick & 0x80 != 0 && i == n - 1 {
            continue;
        }
        std::fs::write(name(i), p).expect("writing a part");
    }
    let open = name(usize::from(pick & 0x7f) % n);
    if !open.exists() {
        return;
    }
    for header_only in [true, false] {
        let opts = OpenOptions {
            header_only,
            follow_splits: true,
        };
        let Ok(f) = GgufFile::open_with(&open, opts) else {
            continue;
        };
        std::hint::black_box((f.split_count(), f.paths().len()));
        for i in 0..f.tensors().len() {
            let _ = f.tensor_data_at(i);
        }
        std::hint::black_box(f.total_tensor_bytes());
    }
});
