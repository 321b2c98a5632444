//! The tokenizer's input: the `tokenizer.*` metadata of a GGUF file as plain data.

/// Everything [`Tokenizer::new`](crate::Tokenizer::new) needs, as read from the GGUF keys
/// named on each field. `None` means "key absent" (llama.cpp's defaults then apply).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VocabData {
    /// `tokenizer.ggml.model`: `"gpt2"` (byte-level BPE) or `"llama"` (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer name (BPE only).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type` (llama.cpp `LLAMA_TOKEN_TYPE_*`: 1 normal, 2 unknown,
    /// 3 control, 4 user-defined, 5 unused, 6 byte). Absent: every token is normal.
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.merges` (`"left right"`, rank = index).
    pub merges: Option<Vec<String>>,
    /// `tokenizer.ggml.scores` (SentencePiece merge priority).
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id`.
    pub eot_id: Option<u32>,
    /// `tokenizer.ggml.eom_token_id`.
    pub eom_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk_id: Option<u32>,
    /// `tokenizer.ggml.seperator_token_id` (sic, llama.cpp's spelling).
    pub sep_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad_id: Option<u32>,
    /// `tokenizer.ggml.mask_token_id`.
    pub mask_id: Option<u32>,
    /// `tokenizer.ggml.fim_pre_token_id` (or the deprecated `prefix_token_id`).
    pub fim_pre_id: Option<u32>,
    /// `tokenizer.ggml.fim_suf_token_id` (or the deprecated `suffix_token_id`).
    pub fim_suf_id: Option<u32>,
    /// `tokenizer.ggml.fim_mid_token_id` (or the deprecated `middle_token_id`).
    pub fim_mid_id: Option<u32>,
    /// `tokenizer.ggml.fim_pad_token_id`.
    pub fim_pad_id: Option<u32>,
    /// `tokenizer.ggml.fim_rep_token_id`.
    pub fim_rep_id: Option<u32>,
    /// `tokenizer.ggml.fim_sep_token_id`.
    pub fim_sep_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_sep_token`.
    pub add_sep: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix`.
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
    /// `general.name` (llama.cpp keys a few token-attribute fixes on it, e.g. Phi-3).
    pub model_name: Option<String>,
    /// `general.architecture`.
    pub architecture: Option<String>,
}

use crate::TokenizerError;
use moxie_gguf::{GgufFile, Metadata, Value};

fn bad(key: &str, what: &str) -> TokenizerError {
    TokenizerError::Metadata(format!("{key}: {what}"))
}

fn opt_str(md: &Metadata, key: &str) -> Result<Option<String>, TokenizerError> {
    match md.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_str()
            .map(|s| Some(s.to_string()))
            .ok_or_else(|| bad(key, "expected a string")),
    }
}

fn opt_bool(md: &Metadata, key: &str) -> Result<Option<bool>, TokenizerError> {
    match md.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_bool()
            .map(Some)
            .ok_or_else(|| bad(key, "expected a bool")),
    }
}

/// Token ids: any integer type holding a value that fits `u32`.
fn opt_id(md: &Metadata, key: &str) -> Result<Option<u32>, TokenizerError> {
    match md.get(key) {
        None => Ok(None),
        Some(v) => match v.as_i64() {
            Some(i) if (0..=u32::MAX as i64).contains(&i) => Ok(Some(i as u32)),
            // llama.cpp reads these as uint32; a negative int32 (-1 = none) means "no token"
            Some(_) => Ok(None),
            None => Err(bad(key, "expected an integer token id")),
        },
    }
}

fn opt_strings(md: &Metadata, key: &str) -> Result<Option<Vec<String>>, TokenizerError> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::Array(a)) => a
            .strs()
            .map(|it| Some(it.map(str::to_string).collect()))
            .ok_or_else(|| bad(key, "expected an array of strings")),
        Some(_) => Err(bad(key, "expected an array of strings")),
    }
}

impl VocabData {
    /// Reads the tokenizer keys of a GGUF file's metadata (the keys named on each field).
    pub fn from_gguf(md: &Metadata) -> Result<VocabData, TokenizerError> {
        let model = opt_str(md, "tokenizer.ggml.model")?
            .ok_or_else(|| bad("tokenizer.ggml.model", "missing"))?;
        let tokens = opt_strings(md, "tokenizer.ggml.tokens")?.ok_or_else(|| {
            bad(
                "tokenizer.ggml.tokens",
                "missing (cannot find tokenizer vocab)",
            )
        })?;
        let token_types = match md.get("tokenizer.ggml.token_type") {
            None => None,
            Some(v) => Some(
                v.as_array()
                    .and_then(|a| a.as_i32s())
                    .map(<[i32]>::to_vec)
                    .ok_or_else(|| {
                        bad("tokenizer.ggml.token_type", "expected an array of int32")
                    })?,
            ),
        };
        let scores = match md.get("tokenizer.ggml.scores") {
            None => None,
            Some(v) => {
                let a = v
                    .as_array()
                    .ok_or_else(|| bad("tokenizer.ggml.scores", "expected an array"))?;
                if let Some(f) = a.as_f32s() {
                    Some(f.to_vec())
                } else if let Some(i) = a.as_i32s() {
                    Some(i.iter().map(|&x| x as f32).collect())
                } else {
                    return Err(bad(
                        "tokenizer.ggml.scores",
                        "expected an array of float32 or int32",
                    ));
                }
            }
        };
        let id = |key: &str| opt_id(md, key);
        // llama.cpp reads the deprecated prefix/suffix/middle keys last, so they win
        let first = |deprecated: Option<u32>, current: Option<u32>| deprecated.or(current);
        Ok(VocabData {
            model,
            pre: opt_str(md, "tokenizer.ggml.pre")?,
            tokens,
            token_types,
            merges: opt_strings(md, "tokenizer.ggml.merges")?,
            scores,
            bos_id: id("tokenizer.ggml.bos_token_id")?,
            eos_id: id("tokenizer.ggml.eos_token_id")?,
            eot_id: id("tokenizer.ggml.eot_token_id")?,
            eom_id: id("tokenizer.ggml.eom_token_id")?,
            unk_id: id("tokenizer.ggml.unknown_token_id")?,
            sep_id: id("tokenizer.ggml.seperator_token_id")?,
            pad_id: id("tokenizer.ggml.padding_token_id")?,
            mask_id: id("tokenizer.ggml.mask_token_id")?,
            fim_pre_id: first(
                id("tokenizer.ggml.prefix_token_id")?,
                id("tokenizer.ggml.fim_pre_token_id")?,
            ),
            fim_suf_id: first(
                id("tokenizer.ggml.suffix_token_id")?,
                id("tokenizer.ggml.fim_suf_token_id")?,
            ),
            fim_mid_id: first(
                id("tokenizer.ggml.middle_token_id")?,
                id("tokenizer.ggml.fim_mid_token_id")?,
            ),
            fim_pad_id: id("tokenizer.ggml.fim_pad_token_id")?,
            fim_rep_id: id("tokenizer.ggml.fim_rep_token_id")?,
            fim_sep_id: id("tokenizer.ggml.fim_sep_token_id")?,
            add_bos: opt_bool(md, "tokenizer.ggml.add_bos_token")?,
            add_eos: opt_bool(md, "tokenizer.ggml.add_eos_token")?,
            add_sep: opt_bool(md, "tokenizer.ggml.add_sep_token")?,
            add_space_prefix: opt_bool(md, "tokenizer.ggml.add_space_prefix")?,
            chat_template: opt_str(md, "tokenizer.chat_template")?,
            model_name: opt_str(md, "general.name")?,
            architecture: opt_str(md, "general.architecture")?,
        })
    }

    /// Opens a GGUF file (header only) and reads its tokenizer keys.
    pub fn from_gguf_file(path: &std::path::Path) -> Result<VocabData, TokenizerError> {
        let f = GgufFile::open_header_only(path)
            .map_err(|e| TokenizerError::Metadata(e.to_string()))?;
        Self::from_gguf(f.metadata())
    }
}
