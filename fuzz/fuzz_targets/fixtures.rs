//! The fixtures the targets read once at start: one tokenizer per architecture (from the small
//! fixture models) and the chat templates (the models' own and the golden chat files').
//! `MOXIE_FIXTURES` names the folder (default `../shared/fixtures` from the repository root).

use std::path::PathBuf;
use std::sync::Arc;

use moxie_tokenizer::{ChatTemplate, Tokenizer, VocabData};

pub fn dir() -> PathBuf {
    std::env::var_os("MOXIE_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("../shared/fixtures"))
}

/// The smallest file of each architecture.
const MODELS: &[&str] = &[
    "deepseek2-tiny-Q4_0.gguf",
    "glm4moe-tiny-Q4_K_M.gguf",
    "qwen3moe-tiny-Q4_0.gguf",
    "qwen3next-tiny-Q4_0.gguf",
    "glm-dsa-tiny-Q4_K_M.gguf",
];

pub fn tokenizers() -> Vec<Arc<Tokenizer>> {
    let toks: Vec<Arc<Tokenizer>> = MODELS
        .iter()
        .filter_map(|m| {
            let vocab = VocabData::from_gguf_file(&dir().join("models").join(m)).ok()?;
            Tokenizer::new(vocab).ok().map(Arc::new)
        })
        .collect();
    assert!(
        !toks.is_empty(),
        "no fixture tokenizers under {}",
        dir().display()
    );
    toks
}

/// Every template with a tokenizer for it: each fixture model's own, and the golden chat
/// files' (with the first tokenizer's BOS/EOS texts).
pub fn templates(toks: &[Arc<Tokenizer>]) -> Vec<(ChatTemplate, Arc<Tokenizer>)> {
    let mut out: Vec<(ChatTemplate, Arc<Tokenizer>)> = toks
        .iter()
        .filter_map(|t| Some((ChatTemplate::from_tokenizer(t).ok()?, t.clone())))
        .collect();
    for arch in ["deepseek2", "glm-dsa", "glm4moe", "qwen3moe", "qwen3next"] {
        let path = dir().join("golden").join(format!("chat-{arch}.json"));
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
            continue;
        };
        if let Some(src) = v["template"].as_str() {
            if let Ok(t) = ChatTemplate::with_tokens_of(src, &toks[0]) {
                out.push((t, toks[0].clone()));
            }
        }
    }
    out
}
