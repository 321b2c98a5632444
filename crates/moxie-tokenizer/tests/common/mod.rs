//! Shared helpers for the fixture tests.
#![allow(dead_code)]

use std::path::PathBuf;

use moxie_tokenizer::{Tokenizer, VocabData};
use serde_json::Value;

/// The fixture directory: `$MOXIE_FIXTURES`, else `<workspace>/../shared/fixtures`.
/// A missing directory fails the test (fixtures are required, never skipped).
pub fn fixtures_dir() -> PathBuf {
    let dir = match std::env::var_os("MOXIE_FIXTURES") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures"),
    };
    assert!(
        dir.join("golden").is_dir(),
        "fixture directory {} not found (set MOXIE_FIXTURES); these tests need the shared fixtures",
        dir.display()
    );
    dir
}

pub fn read_json(rel: &str) -> Value {
    let p = fixtures_dir().join(rel);
    let s =
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()));
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("cannot parse {}: {e}", p.display()))
}

pub const ARCHS: [&str; 3] = ["deepseek2", "glm4moe", "qwen3moe"];

pub const SPECIALS: [&str; 15] = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "[gMASK]",
    "<sop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<think>",
    "</think>",
];

/// tokenizer.json's vocabulary (tokens by id, merges), for cross-checking the GGUF.
pub fn tokenizer_json_vocab() -> (Vec<String>, Vec<String>) {
    let tj = read_json("tokenizer/tokenizer.json");
    let model = &tj["model"];
    let vocab = model["vocab"].as_object().expect("vocab");
    let mut tokens = vec![String::new(); vocab.len()];
    for (t, id) in vocab {
        tokens[id.as_u64().unwrap() as usize] = t.clone();
    }
    let merges = model["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| format!("{} {}", m[0].as_str().unwrap(), m[1].as_str().unwrap()))
        .collect();
    (tokens, merges)
}

/// The vocabulary as the production path reads it: GGUF metadata -> `VocabData::from_gguf`.
pub fn vocab(arch: &str) -> VocabData {
    let path = fixtures_dir().join(format!("models/{arch}-tiny-F32.gguf"));
    let f = moxie_gguf::GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    VocabData::from_gguf(f.metadata()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn tokenizer(arch: &str) -> Tokenizer {
    Tokenizer::new(vocab(arch)).unwrap_or_else(|e| panic!("{arch}: {e}"))
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}
