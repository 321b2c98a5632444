//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use moxie_gguf::{Array, GgmlType, GgufWriter, TensorInfo, Value};

/// The fixture directory: `$MOXIE_FIXTURES`, else `/work/shared/fixtures` relative to this
/// crate. Panics (fails the test) if it does not exist.
pub fn fixtures_dir() -> PathBuf {
    let dir = match std::env::var_os("MOXIE_FIXTURES") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures"),
    };
    assert!(
        dir.is_dir(),
        "fixture directory {} is missing: set MOXIE_FIXTURES to the fixtures folder (models/, headers/, golden/)",
        dir.display()
    );
    dir
}

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("moxie-gguf-test-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Deterministic tensor bytes derived from the tensor name.
pub fn pattern(t: &TensorInfo) -> Vec<u8> {
    let mut h: u32 = 2166136261;
    for b in t.name.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(16777619);
    }
    (0..t.n_bytes)
        .map(|i| {
            let x = h.wrapping_add((i as u32).wrapping_mul(2654435761));
            (x >> 13) as u8
        })
        .collect()
}

/// A small writer: a few metadata kinds (string, u32, f32, string array, nested array) and
/// three tensors of different types.
pub fn small_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "test").unwrap();
    w.add("test.block_count", Value::U32(2)).unwrap();
    w.add("test.eps", Value::F32(1e-6)).unwrap();
    w.add(
        "tokenizer.ggml.tokens",
        Array::from_strs(["a", "bc", "<s>"]),
    )
    .unwrap();
    w.add(
        "test.nested",
        Array::from(vec![Array::from(vec![1i32, 2]), Array::from(vec![true])]),
    )
    .unwrap();
    w.add_tensor_info("a.weight", &[8, 2], GgmlType::F32)
        .unwrap();
    w.add_tensor_info("b.weight", &[64, 2], GgmlType::Q4_0)
        .unwrap();
    w.add_tensor_info("c.weight", &[32], GgmlType::Q8_0)
        .unwrap();
    w
}

pub fn small_file() -> Vec<u8> {
    small_writer().write_to_bytes(pattern).unwrap()
}

/// End of the last tensor's data in a file written by `w` (what follows is padding).
pub fn data_end(w: &GgufWriter) -> usize {
    w.tensor_infos()
        .iter()
        .map(|t| t.file_offset + t.n_bytes)
        .max()
        .unwrap_or(w.header_len()) as usize
}

/// Raw GGUF byte builder for hand-made (possibly invalid) files.
#[derive(Default)]
pub struct Raw(pub Vec<u8>);

impl Raw {
    pub fn header(magic: &[u8], version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        let mut r = Raw(Vec::new());
        r.bytes(magic).u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Raw {
        self.0.extend_from_slice(b);
        self
    }
    pub fn u8(&mut self, v: u8) -> &mut Raw {
        self.0.push(v);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Raw {
        self.bytes(&v.to_le_bytes())
    }
    pub fn u64(&mut self, v: u64) -> &mut Raw {
        self.bytes(&v.to_le_bytes())
    }
    pub fn str(&mut self, s: &str) -> &mut Raw {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    /// A key with a u32 value.
    pub fn kv_u32(&mut self, key: &str, v: u32) -> &mut Raw {
        self.str(key).u32(4).u32(v)
    }
    /// A key with a string value.
    pub fn kv_str(&mut self, key: &str, v: &str) -> &mut Raw {
        self.str(key).u32(8).str(v)
    }
    /// A tensor info record.
    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Raw {
        self.str(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    /// Zero padding to `alignment`, then `n` data bytes.
    pub fn data(&mut self, alignment: usize, n: usize) -> &mut Raw {
        while !self.0.len().is_multiple_of(alignment) {
            self.0.push(0);
        }
        self.0.extend((0..n).map(|i| i as u8));
        self
    }
    pub fn done(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.0)
    }
}
