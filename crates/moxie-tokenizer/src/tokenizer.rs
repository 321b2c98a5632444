//! The tokenizer: llama.cpp's `llama_vocab` (load, special-token partitioning, BPE and
//! SentencePiece sessions, `token_to_piece`, `detokenize`) ported to Rust.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};

use crate::pre_regex::*;
use crate::pretok::PreTokenizer;
use crate::unicode::{char_to_byte, BYTE_TO_CHAR};
use crate::VocabData;

/// Errors building a [`Tokenizer`].
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// `tokenizer.ggml.model` is not one this crate implements.
    #[error("unsupported tokenizer model '{0}' (supported: gpt2, llama)")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` is not one this crate implements.
    #[error("unknown pre-tokenizer type '{pre}' (supported: {supported})")]
    UnknownPre {
        /// the name found in the file
        pre: String,
        /// comma-separated list of supported names
        supported: String,
    },
    /// A BPE vocabulary without `tokenizer.ggml.merges`.
    #[error("cannot find tokenizer merges (tokenizer.ggml.merges) in model file")]
    MissingMerges,
    /// `tokenizer.ggml.tokens` is empty.
    #[error("tokenizer vocabulary is empty")]
    EmptyVocab,
    /// An array shorter than the vocabulary.
    #[error("{what} has {got} entries but the vocabulary has {want} tokens")]
    ArrayTooShort {
        /// which array
        what: &'static str,
        /// its length
        got: usize,
        /// the vocabulary size
        want: usize,
    },
    /// A pre-tokenizer expression failed to compile (a bug in this crate).
    #[error("{0}")]
    Regex(String),
    /// Reading GGUF metadata failed (missing key or wrong type).
    #[error("GGUF metadata: {0}")]
    Metadata(String),
}

/// Token attribute bits (llama.cpp `llama_token_attr`).
pub mod attr {
    /// unknown token
    pub const UNKNOWN: u32 = 1 << 0;
    /// unused token
    pub const UNUSED: u32 = 1 << 1;
    /// normal token
    pub const NORMAL: u32 = 1 << 2;
    /// control token (rendered only when special tokens are asked for)
    pub const CONTROL: u32 = 1 << 3;
    /// user-defined token (always parsed and rendered as text)
    pub const USER_DEFINED: u32 = 1 << 4;
    /// byte token
    pub const BYTE: u32 = 1 << 5;
    /// normalized
    pub const NORMALIZED: u32 = 1 << 6;
    /// strip whitespace left of the token when parsing
    pub const LSTRIP: u32 = 1 << 7;
    /// strip whitespace right of the token when parsing
    pub const RSTRIP: u32 = 1 << 8;
    /// single word
    pub const SINGLE_WORD: u32 = 1 << 9;
}

/// Which algorithm the vocabulary uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabKind {
    /// Byte-level BPE (`tokenizer.ggml.model = "gpt2"`).
    Bpe,
    /// SentencePiece BPE with byte fallback (`tokenizer.ggml.model = "llama"`).
    Spm,
}

struct PreSpec {
    names: &'static [&'static str],
    regex: &'static [&'static str],
    ignore_merges: bool,
    clean_spaces: bool,
    add_bos: bool,
    bos_null: bool,
}

const fn spec(
    names: &'static [&'static str],
    regex: &'static [&'static str],
    ignore_merges: bool,
    clean_spaces: bool,
) -> PreSpec {
    PreSpec {
        names,
        regex,
        ignore_merges,
        clean_spaces,
        add_bos: false,
        bos_null: false,
    }
}

/// `tokenizer.ggml.pre` names, as llama.cpp maps them (commit 0c1e57098).
static PRE_SPECS: &[PreSpec] = &[
    spec(&["default"], RE_DEFAULT, false, true),
    spec(&["minicpm5"], RE_MINICPM5, true, true),
    PreSpec {
        add_bos: true,
        ..spec(
            &[
                "llama3",
                "llama-v3",
                "llama-bpe",
                "falcon3",
                "falcon-h1",
                "pixtral",
                "midm-2.0",
                "lfm2",
                "jina-v5-nano",
            ],
            RE_LLAMA3,
            true,
            true,
        )
    },
    spec(&["deepseek-llm"], RE_DEEPSEEK_LLM, false, false),
    spec(&["deepseek-coder"], RE_DEEPSEEK_CODER, false, false),
    spec(
        &["deepseek-v3", "hunyuan-dense", "hy_v4", "joyai-llm"],
        RE_DEEPSEEK3_LLM,
        false,
        false,
    ),
    spec(&["spark2_5"], RE_SPARK2_5, false, false),
    spec(&["youtu"], RE_YOUTU, true, false),
    spec(&["falcon"], RE_FALCON, false, true),
    spec(
        &[
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "jina-v1-en",
            "jina-v2-code",
            "roberta-bpe",
            "mpt",
            "olmo",
            "jais",
            "exaone4",
        ],
        RE_GPT2,
        false,
        true,
    ),
    spec(&["trillion", "granite-docling"], RE_GPT2, false, false),
    spec(&["jais-2"], RE_JAIS2, false, true),
    spec(
        &[
            "starcoder",
            "refact",
            "codeshell",
            "exaone",
            "minerva-7b",
            "mellum2",
        ],
        RE_STARCODER,
        false,
        true,
    ),
    spec(&["command-r", "smollm"], RE_STARCODER, false, false),
    spec(
        &[
            "qwen2",
            "deepseek-r1-qwen",
            "kormo",
            "f2llmv2",
            "hunyuan",
            "grok-2",
            "solar-open",
        ],
        RE_STABLELM2,
        false,
        false,
    ),
    spec(&["stablelm2", "megrez"], RE_STABLELM2, false, true),
    spec(&["qwen35"], RE_QWEN35, false, false),
    spec(&["dbrx", "smaug-bpe"], RE_LLAMA3, false, true),
    spec(&["poro-chat"], RE_PORO, false, false),
    spec(&["bloom", "gpt3-finnish"], RE_PORO, false, true),
    PreSpec {
        bos_null: true,
        ..spec(&["chatglm-bpe"], RE_LLAMA3, false, true)
    },
    PreSpec {
        bos_null: true,
        ..spec(&["glm4", "glm5"], RE_LLAMA3, true, true)
    },
    spec(&["viking"], RE_VIKING, false, false),
    PreSpec {
        add_bos: true,
        ..spec(&["tekken"], RE_TEKKEN, true, false)
    },
    PreSpec {
        add_bos: true,
        ..spec(&["chameleon"], RE_CHAMELEON, false, false)
    },
    spec(&["exaone-moe"], RE_EXAONE_MOE, false, true),
    spec(
        &["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"],
        RE_GPT4O,
        false,
        false,
    ),
    spec(
        &["granite-embed-multi-97m"],
        RE_GRANITE_EMB_MULTI,
        true,
        false,
    ),
    spec(&["kimi-k2"], RE_KIMI_K2, false, false),
    spec(
        &["bailingmoe", "bailingmoe2", "llada-moe"],
        RE_BAILINGMOE,
        false,
        false,
    ),
    spec(&["seed-coder"], RE_SEED_CODER, false, false),
    spec(&["ufakzeka"], RE_UFAKZEKA, false, false),
    spec(&["laguna"], RE_LAGUNA, false, false),
];

/// The `tokenizer.ggml.pre` values this crate accepts (plus absent/empty = `default`).
pub fn supported_pre_tokenizers() -> Vec<&'static str> {
    PRE_SPECS
        .iter()
        .flat_map(|s| s.names.iter().copied())
        .collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fragment {
    /// `[start, start + len)` of the input text
    Text(usize, usize),
    Token(u32),
}

/// A GGUF tokenizer that reproduces llama.cpp's `llama_tokenize` / `llama_token_to_piece`.
///
/// Built once from [`VocabData`]; everything (token map, merge ranks, special-token list,
/// compiled pre-tokenizer, piece cache) is precomputed, and all methods take `&self`
/// (the type is `Send + Sync`).
pub struct Tokenizer {
    kind: VocabKind,
    pre_name: String,
    texts: Vec<String>,
    scores: Vec<f32>,
    attrs: Vec<u32>,
    token_to_id: HashMap<String, u32>,
    /// `"left right"` -> rank
    bpe_ranks: HashMap<String, u32>,
    pretok: Option<PreTokenizer>,
    ignore_merges: bool,
    clean_spaces: bool,
    add_space_prefix: bool,
    add_bos: bool,
    add_eos: bool,
    add_sep: bool,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    unk: Option<u32>,
    sep: Option<u32>,
    pad: Option<u32>,
    mask: Option<u32>,
    fim_pre: Option<u32>,
    fim_suf: Option<u32>,
    fim_mid: Option<u32>,
    fim_pad: Option<u32>,
    fim_rep: Option<u32>,
    fim_sep: Option<u32>,
    eog: Vec<u32>,
    /// control / user-defined / unknown tokens, longest text first
    special_tokens: Vec<u32>,
    /// `token_to_piece(id, special = true)` for every token
    pieces: Vec<Vec<u8>>,
    chat_template: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind)
            .field("pre", &self.pre_name)
            .field("n_vocab", &self.texts.len())
            .field("n_merges", &self.bpe_ranks.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eot", &self.eot)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .field("eog", &self.eog)
            .finish_non_exhaustive()
    }
}

const EOT_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_NAMES: &[&str] = &["<|eom_id|>"];
const FIM_PRE_NAMES: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_NAMES: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_NAMES: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_NAMES: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_NAMES: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_NAMES: &[&str] = &["<|file_sep|>"];
const EOG_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

fn token_type_to_attr(t: i32) -> u32 {
    match t {
        1 => attr::NORMAL,
        2 => attr::UNKNOWN,
        3 => attr::CONTROL,
        4 => attr::USER_DEFINED,
        5 => attr::UNUSED,
        6 => attr::BYTE,
        _ => 0,
    }
}

/// `ArrayTooShort` when a per-token array (`got` entries) is shorter than the vocabulary.
fn check_len(what: &'static str, got: usize, want: usize) -> Result<(), TokenizerError> {
    if got < want {
        return Err(TokenizerError::ArrayTooShort { what, got, want });
    }
    Ok(())
}

/// C `isspace` in the "C" locale.
#[inline]
fn c_isspace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

impl Tokenizer {
    /// Builds the tokenizer the way llama.cpp's `llama_vocab::load` does.
    pub fn new(v: VocabData) -> Result<Self, TokenizerError> {
        let kind = match v.model.as_str() {
            "gpt2" => VocabKind::Bpe,
            "llama" => VocabKind::Spm,
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };
        let n = v.tokens.len();
        if n == 0 {
            return Err(TokenizerError::EmptyVocab);
        }
        let pre_name = v.pre.clone().unwrap_or_default();

        // defaults per vocabulary type
        let (mut bos, mut eos, mut unk): (Option<u32>, Option<u32>, Option<u32>) = match kind {
            VocabKind::Bpe => (Some(11), Some(11), None),
            VocabKind::Spm => (Some(1), Some(2), Some(0)),
        };
        let mut ignore_merges = false;
        let mut clean_spaces = false;
        let mut add_space_prefix = false;
        let mut add_bos = false;
        let mut add_eos = false;
        let mut add_sep = false;
        let mut pretok = None;
        let mut bpe_ranks = HashMap::new();

        match kind {
            VocabKind::Bpe => {
                match &v.merges {
                    Some(merges) => {
                        bpe_ranks.reserve(merges.len());
                        for (i, m) in merges.iter().enumerate() {
                            // C-string semantics, as for the tokens
                            let m = m.split('\0').next().unwrap_or_default();
                            // llama.cpp splits at the first space after byte 0 into
                            // (first, second); the lookup key "first second" is then the line
                            // itself, or " " (both empty) when there is no such space.
                            let has_sep = m.as_bytes().iter().skip(1).any(|&b| b == b' ');
                            let key = if has_sep {
                                m.to_string()
                            } else {
                                " ".to_string()
                            };
                            bpe_ranks.entry(key).or_insert(i as u32);
                        }
                    }
                    None if pre_name == "kimi-k2" => {}
                    None => return Err(TokenizerError::MissingMerges),
                }
                let spec_name = if pre_name.is_empty() {
                    "default"
                } else {
                    &pre_name
                };
                let spec = PRE_SPECS
                    .iter()
                    .find(|s| s.names.contains(&spec_name))
                    .ok_or_else(|| TokenizerError::UnknownPre {
                        pre: pre_name.clone(),
                        supported: supported_pre_tokenizers().join(", "),
                    })?;
                ignore_merges = spec.ignore_merges;
                clean_spaces = spec.clean_spaces;
                if spec.add_bos {
                    add_bos = true;
                }
                if spec.bos_null {
                    bos = None;
                }
                if matches!(spec_name, "jina-v1-en" | "jina-v2-code" | "roberta-bpe") {
                    add_sep = true;
                }
                pretok = Some(PreTokenizer::new(spec.regex).map_err(TokenizerError::Regex)?);
            }
            VocabKind::Spm => {
                add_space_prefix = true;
                add_bos = true;
            }
        }
        if let Some(b) = v.add_space_prefix {
            add_space_prefix = b;
        }

        if let Some(s) = &v.scores {
            check_len("tokenizer.ggml.scores", s.len(), n)?;
        }
        if let Some(t) = &v.token_types {
            check_len("tokenizer.ggml.token_type", t.len(), n)?;
        }

        let mut texts = Vec::with_capacity(n);
        let mut scores = Vec::with_capacity(n);
        let mut attrs = Vec::with_capacity(n);
        let mut token_to_id = HashMap::with_capacity(n);
        for (i, mut word) in v.tokens.into_iter().enumerate() {
            // llama.cpp reads GGUF strings as C strings: a NUL ends the token text
            if let Some(p) = word.find('\0') {
                word.truncate(p);
            }
            let word = if word.is_empty() {
                format!("[EMPTY_{i}]")
            } else {
                word
            };
            token_to_id.insert(word.clone(), i as u32);
            texts.push(word);
            scores.push(v.scores.as_ref().map_or(0.0, |s| s[i]));
            attrs.push(
                v.token_types
                    .as_ref()
                    .map_or(attr::NORMAL, |t| token_type_to_attr(t[i])),
            );
        }

        // special token ids: defaults out of range are dropped, keys override when valid
        let fix = |default: Option<u32>, key: Option<u32>| -> Option<u32> {
            let d = default.filter(|&d| (d as usize) < n);
            match key {
                Some(k) if (k as usize) < n => Some(k),
                _ => d,
            }
        };
        bos = fix(bos, v.bos_id);
        eos = fix(eos, v.eos_id);
        let mut eot = fix(None, v.eot_id);
        let mut eom = fix(None, v.eom_id);
        unk = fix(unk, v.unk_id);
        let sep = fix(None, v.sep_id);
        let pad = fix(None, v.pad_id);
        let mask = fix(None, v.mask_id);
        let mut fim_pre = fix(None, v.fim_pre_id);
        let mut fim_suf = fix(None, v.fim_suf_id);
        let mut fim_mid = fix(None, v.fim_mid_id);
        let mut fim_pad = fix(None, v.fim_pad_id);
        let mut fim_rep = fix(None, v.fim_rep_id);
        let mut fim_sep = fix(None, v.fim_sep_id);

        if let Some(b) = v.add_bos {
            add_bos = b;
        }
        if let Some(b) = v.add_eos {
            add_eos = b;
        }
        if let Some(b) = v.add_sep {
            add_sep = b;
        }

        // Auto-detect special tokens by text. llama.cpp walks an unordered_map, so with
        // several candidates its choice depends on hashing; we take the lowest id.
        {
            let mut detect = |slot: &mut Option<u32>, names: &[&str]| {
                if slot.is_some() {
                    return;
                }
                if let Some(id) = (0..n).find(|&i| names.contains(&texts[i].as_str())) {
                    *slot = Some(id as u32);
                    attrs[id] |= attr::CONTROL;
                }
            };
            detect(&mut eot, EOT_NAMES);
            detect(&mut eom, EOM_NAMES);
            detect(&mut fim_pre, FIM_PRE_NAMES);
            detect(&mut fim_suf, FIM_SUF_NAMES);
            detect(&mut fim_mid, FIM_MID_NAMES);
            detect(&mut fim_pad, FIM_PAD_NAMES);
            detect(&mut fim_rep, FIM_REP_NAMES);
            detect(&mut fim_sep, FIM_SEP_NAMES);
        }

        // control tokens named "unused..." are unused
        for i in 0..n {
            if attrs[i] & attr::CONTROL != 0 && texts[i].contains("unused") {
                attrs[i] |= attr::UNUSED;
            }
        }

        // end-of-generation set
        let mut eog: Vec<u32> = Vec::new();
        let add_eog = |id: Option<u32>, eog: &mut Vec<u32>| {
            if let Some(id) = id {
                if !eog.contains(&id) {
                    eog.push(id);
                }
            }
        };
        add_eog(fim_pad, &mut eog);
        add_eog(fim_rep, &mut eog);
        add_eog(fim_sep, &mut eog);
        for i in 0..n {
            if EOG_NAMES.contains(&texts[i].as_str()) {
                add_eog(Some(i as u32), &mut eog);
                attrs[i] |= attr::CONTROL;
            }
        }
        // gpt-oss: always render these
        for i in 0..n {
            if matches!(
                texts[i].as_str(),
                "<|channel|>" | "<|message|>" | "<|start|>" | "<|constrain|>"
            ) {
                attrs[i] = attr::USER_DEFINED;
            }
        }
        add_eog(eos, &mut eog);
        add_eog(eot, &mut eog);
        add_eog(eom, &mut eog);
        {
            let find =
                |eog: &[u32], name: &str| eog.iter().copied().find(|&t| texts[t as usize] == name);
            let has = |eog: &[u32], name: &str| find(eog, name).is_some();
            let has_call = has(&eog, "<|call|>") || has(&eog, "<|calls|>");
            if let Some(end_id) = find(&eog, "<|end|>") {
                if has_call && (has(&eog, "<|return|>") || has(&eog, "<|flush|>")) {
                    eog.retain(|&t| t != end_id);
                    attrs[end_id as usize] = attr::USER_DEFINED;
                }
            }
            let normal_s = has(&eog, "<|tool_response>") || has(&eog, "<|plamo:eos|>");
            if let (true, Some(s_id)) = (normal_s, find(&eog, "</s>")) {
                eog.retain(|&t| t != s_id);
                attrs[s_id as usize] = attr::NORMAL;
            }
        }
        eog.sort_unstable();

        // special tokens, longest first
        let mut special_tokens: Vec<u32> = (0..n as u32)
            .filter(|&i| {
                attrs[i as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
            })
            .collect();
        special_tokens.sort_by(|&a, &b| texts[b as usize].len().cmp(&texts[a as usize].len()));

        let mut tok = Tokenizer {
            kind,
            pre_name,
            texts,
            scores,
            attrs,
            token_to_id,
            bpe_ranks,
            pretok,
            ignore_merges,
            clean_spaces,
            add_space_prefix,
            add_bos,
            add_eos,
            add_sep,
            bos,
            eos,
            eot,
            eom,
            unk,
            sep,
            pad,
            mask,
            fim_pre,
            fim_suf,
            fim_mid,
            fim_pad,
            fim_rep,
            fim_sep,
            eog,
            special_tokens,
            pieces: Vec::new(),
            chat_template: v.chat_template,
        };

        tok.pieces = (0..n as u32).map(|id| tok.compute_piece(id)).collect();

        // per-model attribute fixes (after the piece cache, as in llama.cpp)
        let model_name = v.model_name.unwrap_or_default().to_ascii_lowercase();
        let arch = v.architecture.unwrap_or_default();
        let pre = tok.pre_name.clone();
        let contains_any = |s: &str, subs: &[&str]| subs.iter().any(|x| s.contains(x));
        if contains_any(&pre, &["jina-v2-de", "jina-v2-es", "jina-v2-code"])
            || contains_any(&arch, &["nomic-bert-moe", "jina-bert-v3"])
        {
            tok.set_attr("<mask>", attr::LSTRIP, true);
        } else if contains_any(&model_name, &["phi-3", "phi3"]) {
            for i in tok.special_tokens.clone() {
                tok.attrs[i as usize] |= attr::RSTRIP;
            }
            tok.set_attr("</s>", attr::RSTRIP, true);
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                tok.set_attr(t, attr::RSTRIP, false);
            }
        } else if contains_any(&model_name, &["modern-bert"]) {
            tok.set_attr("[MASK]", attr::LSTRIP, true);
        }

        Ok(tok)
    }

    fn set_attr(&mut self, text: &str, bit: u32, on: bool) {
        if let Some(&id) = self.token_to_id.get(text) {
            let a = &mut self.attrs[id as usize];
            if on {
                *a |= bit;
            } else {
                *a &= !bit;
            }
        }
    }

    /// llama.cpp `token_to_piece` without the cache (`special = true`).
    fn compute_piece(&self, id: u32) -> Vec<u8> {
        let a = self.attrs[id as usize];
        let text = &self.texts[id as usize];
        if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
            return text.as_bytes().to_vec();
        }
        if a & attr::NORMAL != 0 {
            return match self.kind {
                VocabKind::Spm => text.replace('\u{2581}', " ").into_bytes(),
                VocabKind::Bpe => decode_byte_level(text),
            };
        }
        if a & attr::BYTE != 0 {
            // "<0xXX>" (strtol of the two hex digits; 0 when malformed)
            let b = text
                .get(3..5)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .unwrap_or(0);
            return vec![b];
        }
        Vec::new()
    }

    // ----------------------------------------------------------------------------------
    // public API
    // ----------------------------------------------------------------------------------

    /// Number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.texts.len()
    }

    /// Vocabulary type.
    pub fn kind(&self) -> VocabKind {
        self.kind
    }

    /// The `tokenizer.ggml.pre` name (empty when absent).
    pub fn pre(&self) -> &str {
        &self.pre_name
    }

    /// Beginning-of-sequence token.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }
    /// End-of-sequence token.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }
    /// End-of-turn token (explicit or detected by text).
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }
    /// End-of-message token.
    pub fn eom(&self) -> Option<u32> {
        self.eom
    }
    /// Unknown token.
    pub fn unk(&self) -> Option<u32> {
        self.unk
    }
    /// Separator token.
    pub fn sep(&self) -> Option<u32> {
        self.sep
    }
    /// Padding token.
    pub fn pad(&self) -> Option<u32> {
        self.pad
    }
    /// Mask token.
    pub fn mask(&self) -> Option<u32> {
        self.mask
    }
    /// Fill-in-the-middle tokens: `(prefix, suffix, middle, pad, repo, file separator)`.
    #[allow(clippy::type_complexity)]
    pub fn fim_tokens(
        &self,
    ) -> (
        Option<u32>,
        Option<u32>,
        Option<u32>,
        Option<u32>,
        Option<u32>,
        Option<u32>,
    ) {
        (
            self.fim_pre,
            self.fim_suf,
            self.fim_mid,
            self.fim_pad,
            self.fim_rep,
            self.fim_sep,
        )
    }
    /// Whether `encode(.., add_special = true)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos && self.bos.is_some()
    }
    /// Whether `encode(.., add_special = true)` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos && self.eos.is_some()
    }
    /// `tokenizer.ggml.add_sep_token` (llama.cpp uses it only for WPM/BERT vocabularies).
    pub fn add_sep(&self) -> bool {
        self.add_sep
    }

    /// End-of-generation check (eos, eot, eom and the tokens llama.cpp recognises by text:
    /// `<|im_end|>`, `<|endoftext|>`, `<｜end▁of▁sentence｜>`, FIM pad/repo/sep, ...).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// All end-of-generation tokens, sorted.
    pub fn eog_tokens(&self) -> &[u32] {
        &self.eog
    }

    /// The id of a token by its exact vocabulary text.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }

    /// The vocabulary text of a token (byte-level encoded for BPE).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(String::as_str)
    }

    /// The attribute bits of a token (see [`attr`]).
    pub fn token_attr(&self, id: u32) -> Option<u32> {
        self.attrs.get(id as usize).copied()
    }

    /// The SentencePiece score of a token (0 when the file has none).
    pub fn token_score(&self, id: u32) -> Option<f32> {
        self.scores.get(id as usize).copied()
    }

    /// Whether a token is a control token (rendered only with `special = true`).
    pub fn is_control(&self, id: u32) -> bool {
        self.token_attr(id).is_some_and(|a| a & attr::CONTROL != 0)
    }

    /// `tokenizer.chat_template` as given to [`Tokenizer::new`].
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The bytes of one token (llama.cpp `llama_token_to_piece` with `lstrip = 0`): empty for
    /// control/unknown tokens unless `special`, and for ids outside the vocabulary.
    pub fn token_to_piece(&self, id: u32, special: bool) -> Vec<u8> {
        self.piece(id, special).to_vec()
    }

    fn piece(&self, id: u32, special: bool) -> &[u8] {
        let Some(&a) = self.attrs.get(id as usize) else {
            return &[];
        };
        if !special && a & (attr::UNKNOWN | attr::CONTROL) != 0 {
            return &[];
        }
        &self.pieces[id as usize]
    }

    /// Concatenated pieces of `ids` (no space cleanup); invalid ids are skipped. This is what
    /// a streaming caller sees token by token, and equals llama.cpp's detokenization for the
    /// vocabularies that have `clean_spaces` off.
    pub fn decode(&self, ids: &[u32], special: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            out.extend_from_slice(self.piece(id, special));
        }
        out
    }

    /// llama.cpp `llama_detokenize(.., remove_special, unparse_special)`: drops a leading BOS
    /// / trailing EOS when `remove_special` and the model adds them, strips the SentencePiece
    /// prefix space, and applies `clean_up_tokenization_spaces` where the vocabulary asks for it.
    pub fn detokenize(&self, ids: &[u32], remove_special: bool, unparse_special: bool) -> Vec<u8> {
        let mut ids = ids;
        let mut remove_space = self.add_space_prefix;
        if remove_special && self.add_bos {
            if let (Some(&first), Some(bos)) = (ids.first(), self.bos) {
                if first == bos {
                    remove_space = false;
                    ids = &ids[1..];
                }
            }
        }
        if remove_special && self.add_eos {
            if let (Some(&last), Some(eos)) = (ids.last(), self.eos) {
                if last == eos {
                    ids = &ids[..ids.len() - 1];
                }
            }
        }
        let mut text: Vec<u8> = Vec::new();
        for &id in ids {
            let mut p = self.piece(id, unparse_special);
            if remove_space {
                if let Some(rest) = p.strip_prefix(b" ") {
                    p = rest;
                }
            }
            remove_space = false;
            text.extend_from_slice(p);
        }
        if self.clean_spaces {
            clean_up_spaces(&mut text);
        }
        text
    }

    /// llama.cpp `llama_tokenize(text, add_special, parse_special)`.
    ///
    /// `add_special` adds BOS/EOS as the model asks (`add_bos()` / `add_eos()`).
    /// `parse_special` lets control tokens written in the text (e.g. `<|im_start|>`) become
    /// tokens; user-defined tokens (e.g. `<think>`) are always matched, as in llama.cpp.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        let fragments = if text.is_empty() {
            Vec::new()
        } else {
            self.partition(text, parse_special)
        };
        if add_special && self.add_bos {
            if let Some(b) = self.bos {
                out.push(b);
            }
        }
        match self.kind {
            VocabKind::Bpe => {
                let mut scratch = BpeScratch::default();
                for f in fragments {
                    match f {
                        Fragment::Text(s, l) => {
                            self.bpe_fragment(&text[s..s + l], &mut out, &mut scratch)
                        }
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
            VocabKind::Spm => {
                let mut is_prev_special = true;
                for f in fragments {
                    match f {
                        Fragment::Text(s, l) => {
                            let mut t = String::with_capacity(l + 4);
                            if self.add_space_prefix && is_prev_special {
                                t.push(' ');
                            }
                            t.push_str(&text[s..s + l]);
                            let t = t.replace(' ', "\u{2581}");
                            self.spm_fragment(&t, &mut out);
                            is_prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            is_prev_special = true;
                        }
                    }
                }
            }
        }
        if add_special && self.add_eos {
            if let Some(e) = self.eos {
                out.push(e);
            }
        }
        out
    }

    // ----------------------------------------------------------------------------------
    // special-token partitioning (llama.cpp `tokenizer_st_partition`)
    // ----------------------------------------------------------------------------------

    fn partition(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        let raw = text.as_bytes();
        let mut frags = vec![Fragment::Text(0, raw.len())];
        for &sid in &self.special_tokens {
            let a = self.attrs[sid as usize];
            if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
                continue;
            }
            let tok = self.texts[sid as usize].as_str();
            let tb = tok.as_bytes();
            if tb.is_empty() || !text.contains(tok) {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Fragment::Text(off, len) = f else {
                    next.push(f);
                    continue;
                };
                let mut base = off;
                let mut blen = len;
                loop {
                    let Some(rel) = text[base..base + blen].find(tok) else {
                        if blen > 0 {
                            next.push(Fragment::Text(base, blen));
                        }
                        break;
                    };
                    let m = base + rel;
                    if m > base {
                        let mut left_len = m - base;
                        if a & attr::LSTRIP != 0 {
                            while left_len > 0 && c_isspace(raw[base + left_len - 1]) {
                                left_len -= 1;
                            }
                        }
                        if left_len > 0 {
                            next.push(Fragment::Text(base, left_len));
                        }
                    }
                    next.push(Fragment::Token(sid));
                    let end = m + tb.len();
                    if end < base + blen {
                        let mut r_off = end;
                        let mut r_len = blen - (m - base + tb.len());
                        if a & attr::RSTRIP != 0 {
                            while r_len > 0 && c_isspace(raw[r_off]) {
                                r_off += 1;
                                r_len -= 1;
                            }
                        }
                        base = r_off;
                        blen = r_len;
                        if blen == 0 {
                            break;
                        }
                    } else {
                        break;
                    }
                }
            }
            frags = next;
        }
        frags
    }

    // ----------------------------------------------------------------------------------
    // BPE (llama.cpp `llm_tokenizer_bpe_session`)
    // ----------------------------------------------------------------------------------

    fn bpe_fragment(&self, text: &str, out: &mut Vec<u32>, sc: &mut BpeScratch) {
        let Some(pretok) = &self.pretok else { return };
        for (a, b) in pretok.split(text) {
            sc.word.clear();
            for &byte in &text.as_bytes()[a..b] {
                sc.word.push(BYTE_TO_CHAR[byte as usize]);
            }
            self.bpe_word(out, sc);
        }
    }

    fn rank(&self, key: &mut String, word: &str, l: &Sym, r: &Sym) -> Option<u32> {
        key.clear();
        key.push_str(&word[l.start..l.start + l.n]);
        key.push(' ');
        key.push_str(&word[r.start..r.start + r.n]);
        self.bpe_ranks.get(key.as_str()).copied()
    }

    fn bpe_word(&self, out: &mut Vec<u32>, sc: &mut BpeScratch) {
        let word = std::mem::take(&mut sc.word);
        let syms = &mut sc.syms;
        syms.clear();
        sc.heap.clear();

        if self.ignore_merges {
            if let Some(&id) = self.token_to_id.get(word.as_str()) {
                out.push(id);
                sc.word = word;
                return;
            }
        }
        syms.extend(char_syms(&word));
        let mut key = std::mem::take(&mut sc.key);
        let push = |heap: &mut BinaryHeap<Reverse<Bigram>>,
                    syms: &[Sym],
                    key: &mut String,
                    l: isize,
                    r: isize| {
            if l < 0 || r < 0 {
                return;
            }
            let (ls, rs) = (&syms[l as usize], &syms[r as usize]);
            if let Some(rank) = self.rank(key, &word, ls, rs) {
                heap.push(Reverse(Bigram {
                    rank,
                    left: l as usize,
                    right: r as usize,
                    ln: ls.n,
                    rn: rs.n,
                }));
            }
        };
        for i in 1..syms.len() {
            push(&mut sc.heap, syms, &mut key, i as isize - 1, i as isize);
        }
        while let Some(Reverse(bg)) = sc.heap.pop() {
            let (l, r) = (bg.left, bg.right);
            if syms[l].n == 0 || syms[r].n == 0 || syms[l].n != bg.ln || syms[r].n != bg.rn {
                continue; // outdated
            }
            let (lprev, rnext) = merge_syms(syms, l, r);
            push(&mut sc.heap, syms, &mut key, lprev, l as isize);
            push(&mut sc.heap, syms, &mut key, l as isize, rnext);
        }
        for s in syms.iter() {
            if s.n == 0 {
                continue;
            }
            let piece = &word[s.start..s.start + s.n];
            match self.token_to_id.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    // llama.cpp looks every byte of the encoded symbol up as a one-byte token
                    for &b in piece.as_bytes() {
                        if let Some(id) = self.ascii_token(b) {
                            out.push(id);
                        }
                    }
                }
            }
        }
        sc.key = key;
        sc.word = word;
    }

    // ----------------------------------------------------------------------------------
    // SentencePiece (llama.cpp `llm_tokenizer_spm_session`)
    // ----------------------------------------------------------------------------------

    fn spm_fragment(&self, text: &str, out: &mut Vec<u32>) {
        let mut syms: Vec<Sym> = char_syms(text).collect();
        let mut heap: BinaryHeap<SpmBigram> = BinaryHeap::new();
        let try_add = |heap: &mut BinaryHeap<SpmBigram>, syms: &[Sym], l: isize, r: isize| {
            if l < 0 || r < 0 {
                return;
            }
            let (ls, rs) = (&syms[l as usize], &syms[r as usize]);
            let s = &text[ls.start..ls.start + ls.n + rs.n];
            if let Some(&id) = self.token_to_id.get(s) {
                heap.push(SpmBigram {
                    score: self.scores[id as usize],
                    left: l as usize,
                    right: r as usize,
                    size: s.len(),
                });
            }
        };
        for i in 1..syms.len() {
            try_add(&mut heap, &syms, i as isize - 1, i as isize);
        }
        while let Some(bg) = heap.pop() {
            let (l, r) = (bg.left, bg.right);
            if syms[l].n == 0 || syms[r].n == 0 || syms[l].n + syms[r].n != bg.size {
                continue;
            }
            let (lprev, rnext) = merge_syms(&mut syms, l, r);
            try_add(&mut heap, &syms, lprev, l as isize);
            try_add(&mut heap, &syms, l as isize, rnext);
        }
        // llama.cpp resegments through `rev_merge`, which only holds texts that are tokens, so a
        // final symbol is either a token or falls back to byte tokens.
        let mut i: isize = if syms.is_empty() { -1 } else { 0 };
        while i >= 0 {
            let s = &syms[i as usize];
            let piece = &text[s.start..s.start + s.n];
            match self.token_to_id.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for &b in piece.as_bytes() {
                        if let Some(id) = self.spm_byte_token(b) {
                            out.push(id);
                        }
                    }
                }
            }
            i = s.next;
        }
    }

    fn spm_byte_token(&self, b: u8) -> Option<u32> {
        let hex = format!("<0x{b:02X}>");
        if let Some(&id) = self.token_to_id.get(&hex) {
            return Some(id);
        }
        self.ascii_token(b)
    }

    /// The token whose text is the single ASCII character `b` (none for `b >= 0x80`).
    fn ascii_token(&self, b: u8) -> Option<u32> {
        if b >= 0x80 {
            return None;
        }
        let mut buf = [0u8; 4];
        let one = (b as char).encode_utf8(&mut buf);
        self.token_to_id.get(&*one).copied()
    }
}

#[derive(Clone, Copy, Debug)]
struct Sym {
    start: usize,
    n: usize,
    prev: isize,
    next: isize,
}

/// One symbol per character of `text`, linked in order (`-1` ends the list).
fn char_syms(text: &str) -> impl Iterator<Item = Sym> + '_ {
    let n_chars = text.chars().count();
    text.char_indices()
        .enumerate()
        .map(move |(i, (start, c))| Sym {
            start,
            n: c.len_utf8(),
            prev: i as isize - 1,
            next: if i + 1 == n_chars { -1 } else { i as isize + 1 },
        })
}

/// Merges symbol `r` into its left neighbour `l` and unlinks it; returns `l`'s new
/// neighbours `(prev, next)`, whose bigrams with `l` are queued next.
fn merge_syms(syms: &mut [Sym], l: usize, r: usize) -> (isize, isize) {
    syms[l].n += syms[r].n;
    syms[r].n = 0;
    let rnext = syms[r].next;
    syms[l].next = rnext;
    if rnext >= 0 {
        syms[rnext as usize].prev = l as isize;
    }
    (syms[l].prev, rnext)
}

/// Ordered by (rank, left) like llama.cpp's comparator; the symbol lengths identify outdated
/// entries (equivalent to llama.cpp's text comparison: symbols only grow, starts are fixed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Bigram {
    rank: u32,
    left: usize,
    right: usize,
    ln: usize,
    rn: usize,
}

#[derive(Default)]
struct BpeScratch {
    word: String,
    key: String,
    syms: Vec<Sym>,
    heap: BinaryHeap<Reverse<Bigram>>,
}

struct SpmBigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for SpmBigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for SpmBigram {}
impl PartialOrd for SpmBigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for SpmBigram {
    /// Max-heap: higher score first, then lower left index.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// llama.cpp `llama_decode_text`: byte-level code points back to bytes; a code point outside
/// the mapping becomes `[UNK_BYTE_0x<hex>` + the whole token text + `]`.
fn decode_byte_level(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).as_bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
    out
}

/// The three `clean_spaces` passes of llama.cpp's `detokenize`, ported literally (they work
/// in place, and the second pass zeroes the byte after a " ' " match).
fn clean_up_spaces(text: &mut Vec<u8>) {
    let mut total = text.len();
    // pass 1: " ?", " !", " .", " ," -> drop the space
    let total1 = total;
    total = usize::from(total > 0);
    for i in 1..total1 {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        text[total] = x;
        total += 1;
    }
    // pass 2: " ' " -> "'"
    let total2 = total;
    total = usize::from(total > 0);
    let mut i = 1;
    while i < total2 {
        let x = text[i];
        if x == b'\'' && i + 1 < total2 && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0;
        }
        text[total] = x;
        total += 1;
        i += 1;
    }
    // pass 3: " 's", " 'm", " 're", " 've" -> drop the space
    let total3 = total;
    total = usize::from(total > 0);
    for i in 1..total3 {
        let x = text[i];
        if text[i - 1] == b' ' && x == b'\'' && i + 1 < total3 {
            let x1 = text[i + 1];
            if x1 == b't' || x1 == b'd' {
                // kept
            } else if x1 == b's' || x1 == b'm' {
                total -= 1;
            } else if i + 2 < total3 {
                let x2 = text[i + 2];
                if x2 == b'e' && (x1 == b'r' || x1 == b'v') {
                    total -= 1;
                }
            }
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_spaces_passes() {
        let clean = |s: &[u8]| {
            let mut v = s.to_vec();
            clean_up_spaces(&mut v);
            v
        };
        assert_eq!(clean(b"a , b ."), b"a, b.");
        assert_eq!(clean(b"x ' y"), b"x'y");
        assert_eq!(clean(b"a ' ' b"), b"a'' b");
        assert_eq!(
            clean(b"it 's I 'm we 're they 've don 't"),
            b"it's I'm we're they've don 't"
        );
    }

    #[test]
    fn decode_byte_level_text() {
        assert_eq!(decode_byte_level("ĠhelloĊ"), b" hello\n");
        assert_eq!(
            decode_byte_level("a中"),
            b"a[UNK_BYTE_0xe4b8ada\xe4\xb8\xad]".to_vec()
        );
    }
}
