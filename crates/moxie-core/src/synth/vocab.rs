//! The synthetic models' vocabulary: a GPT-2-style byte-level BPE built in code.
//!
//! Layout (like the fixtures, whose special tokens are the vocabulary's last 15 ids):
//! `[256 byte tokens][learned merges][<|reserved_N|> padding][15 special tokens]`.
//! Byte tokens use GPT-2's byte↔unicode mapping; merges are learned deterministically from
//! the built-in [`CORPUS`](super::corpus::CORPUS) with a plain BPE training loop (most frequent
//! adjacent pair, ties to the smallest token ids), inside pre-tokenized words.

use std::collections::{BTreeMap, HashMap};

use super::SynthArch;

/// `tokenizer.ggml.token_type` values.
pub const TOKEN_NORMAL: i32 = 1;
pub const TOKEN_CONTROL: i32 = 3;
pub const TOKEN_USER_DEFINED: i32 = 4;
pub const TOKEN_UNUSED: i32 = 5;

/// Most merges learned (fewer if the corpus runs out of repeated pairs or the vocabulary
/// is too small).
pub const MAX_MERGES: usize = 1024;

/// The special tokens, in id order at the end of the vocabulary (the fixtures' set: every
/// architecture's chat tokens, so all three archs share one vocabulary).
pub const SPECIALS: [(&str, i32); 15] = [
    ("<|endoftext|>", TOKEN_CONTROL),
    ("<|im_start|>", TOKEN_CONTROL),
    ("<|im_end|>", TOKEN_CONTROL),
    ("<｜begin▁of▁sentence｜>", TOKEN_CONTROL),
    ("<｜end▁of▁sentence｜>", TOKEN_CONTROL),
    ("<｜User｜>", TOKEN_CONTROL),
    ("<｜Assistant｜>", TOKEN_CONTROL),
    ("[gMASK]", TOKEN_CONTROL),
    ("<sop>", TOKEN_CONTROL),
    ("<|system|>", TOKEN_CONTROL),
    ("<|user|>", TOKEN_CONTROL),
    ("<|assistant|>", TOKEN_CONTROL),
    ("<|observation|>", TOKEN_CONTROL),
    ("<think>", TOKEN_USER_DEFINED),
    ("</think>", TOKEN_USER_DEFINED),
];

/// Smallest vocabulary: the byte tokens plus the special tokens.
pub const MIN_VOCAB: usize = 256 + SPECIALS.len();

/// Chat templates (the fixtures' `golden/chat-<arch>.json` templates, CC0).
pub const TEMPLATE_DEEPSEEK2: &str = "{%- for message in messages %}{%- if message['role'] == 'system' %}{{- message['content'] + '\\n\\n' }}{%- elif message['role'] == 'user' %}{{- '<｜User｜>' + message['content'] }}{%- elif message['role'] == 'assistant' %}{{- '<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>' }}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<｜Assistant｜>' }}{%- endif %}";
pub const TEMPLATE_QWEN3MOE: &str = "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
pub const TEMPLATE_GLM4MOE: &str = "[gMASK]<sop>{%- for message in messages %}{{- '<|' + message['role'] + '|>' + '\\n' + message['content'] }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|assistant|>\\n' }}{%- endif %}";

/// Per-architecture tokenizer settings (as in the fixtures).
#[derive(Clone, Copy, Debug)]
pub struct TokenizerStyle {
    /// `tokenizer.ggml.pre`
    pub pre: &'static str,
    pub bos: &'static str,
    pub eos: &'static str,
    pub padding: &'static str,
    pub eot: Option<&'static str>,
    pub add_bos: bool,
    pub chat_template: &'static str,
}

impl TokenizerStyle {
    pub fn of(arch: SynthArch) -> TokenizerStyle {
        match arch {
            SynthArch::Deepseek2 => TokenizerStyle {
                pre: "deepseek-v3",
                bos: "<｜begin▁of▁sentence｜>",
                eos: "<｜end▁of▁sentence｜>",
                padding: "<｜end▁of▁sentence｜>",
                eot: None,
                add_bos: true,
                chat_template: TEMPLATE_DEEPSEEK2,
            },
            SynthArch::Qwen3Moe => TokenizerStyle {
                pre: "qwen2",
                bos: "<|endoftext|>",
                eos: "<|im_end|>",
                padding: "<|endoftext|>",
                eot: None,
                add_bos: false,
                chat_template: TEMPLATE_QWEN3MOE,
            },
            SynthArch::Glm4Moe => TokenizerStyle {
                pre: "glm4",
                bos: "[gMASK]",
                eos: "<|endoftext|>",
                padding: "<|endoftext|>",
                eot: Some("<|user|>"),
                add_bos: false,
                chat_template: TEMPLATE_GLM4MOE,
            },
        }
    }
}

/// A built vocabulary.
#[derive(Clone, Debug, PartialEq)]
pub struct Vocab {
    pub tokens: Vec<String>,
    pub token_types: Vec<i32>,
    /// `"left right"` pairs in rank order.
    pub merges: Vec<String>,
}

impl Vocab {
    /// Id of token `text` (linear search from the end: for the special tokens).
    pub fn id_of(&self, text: &str) -> Option<u32> {
        self.tokens
            .iter()
            .rposition(|t| t == text)
            .map(|i| i as u32)
    }
}

/// GPT-2's byte → unicode character mapping: printable Latin-1 bytes map to themselves, the
/// others to U+0100.. in byte order.
pub fn byte_to_unicode() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable =
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        let c = if printable {
            b
        } else {
            n += 1;
            255 + n
        };
        map[b as usize] = char::from_u32(c).unwrap_or('?');
    }
    map
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Letter,
    Digit,
    Space,
    Other,
}

fn class(c: char) -> Class {
    if c.is_alphabetic() {
        Class::Letter
    } else if c.is_numeric() {
        Class::Digit
    } else if c.is_whitespace() {
        Class::Space
    } else {
        Class::Other
    }
}

/// Splits `text` roughly like GPT-2's pre-tokenizer: ` ?letters+`, ` ?digits{1,3}`,
/// ` ?punctuation+`, whitespace runs (leaving one space for the word that follows).
pub fn pre_tokenize(text: &str) -> Vec<&str> {
    let idx: Vec<(usize, char)> = text.char_indices().collect();
    let end_of = |i: usize| idx.get(i).map_or(text.len(), |&(b, _)| b);
    let mut out = Vec::new();
    let mut i = 0;
    while i < idx.len() {
        let start = i;
        let c = idx[i].1;
        if class(c) == Class::Space {
            let mut j = i;
            while j < idx.len() && class(idx[j].1) == Class::Space {
                j += 1;
            }
            // leave a final ' ' to prefix the following word
            if j < idx.len() && j - i > 1 && idx[j - 1].1 == ' ' {
                j -= 1;
            } else if j < idx.len() && j - i == 1 && c == ' ' {
                j = i; // a single space joins the next word
            }
            if j > i {
                out.push(&text[end_of(start)..end_of(j)]);
                i = j;
                continue;
            }
        }
        let mut j = i;
        if idx[j].1 == ' ' {
            j += 1;
        }
        let Some(&(_, first)) = idx.get(j) else {
            out.push(&text[end_of(start)..end_of(j)]);
            break;
        };
        let cls = class(first);
        let mut n = 0;
        while j < idx.len() && class(idx[j].1) == cls && !(cls == Class::Digit && n == 3) {
            j += 1;
            n += 1;
        }
        out.push(&text[end_of(start)..end_of(j)]);
        i = j;
    }
    out
}

/// Learns up to `max_new_tokens` new tokens (and at most [`MAX_MERGES`] merges) from `text`.
/// Returns the token strings (byte tokens first) and the merges.
fn learn(text: &str, max_new_tokens: usize) -> (Vec<String>, Vec<String>) {
    let b2u = byte_to_unicode();
    let mut tokens: Vec<String> = b2u.iter().map(|c| c.to_string()).collect();
    let mut by_text: HashMap<String, u32> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
    for w in pre_tokenize(text) {
        *counts.entry(w).or_default() += 1;
    }
    let mut words: Vec<(Vec<u32>, u64)> = counts
        .into_iter()
        .map(|(w, n)| (w.bytes().map(u32::from).collect(), n))
        .collect();
    let mut merges = Vec::new();
    let mut new_tokens = 0;
    while merges.len() < MAX_MERGES {
        let mut pairs: HashMap<(u32, u32), u64> = HashMap::new();
        for (w, n) in &words {
            for p in w.windows(2) {
                *pairs.entry((p[0], p[1])).or_default() += n;
            }
        }
        let best = pairs
            .into_iter()
            .max_by(|(pa, ca), (pb, cb)| ca.cmp(cb).then(pb.cmp(pa)));
        let Some(((a, b), count)) = best else { break };
        if count < 2 {
            break;
        }
        let merged = format!("{}{}", tokens[a as usize], tokens[b as usize]);
        let id = match by_text.get(&merged) {
            Some(&id) => id,
            None => {
                if new_tokens == max_new_tokens {
                    break;
                }
                new_tokens += 1;
                let id = tokens.len() as u32;
                tokens.push(merged.clone());
                by_text.insert(merged, id);
                id
            }
        };
        merges.push(format!("{} {}", tokens[a as usize], tokens[b as usize]));
        for (w, _) in &mut words {
            let mut k = 0;
            let mut out = Vec::with_capacity(w.len());
            while k < w.len() {
                if k + 1 < w.len() && w[k] == a && w[k + 1] == b {
                    out.push(id);
                    k += 2;
                } else {
                    out.push(w[k]);
                    k += 1;
                }
            }
            *w = out;
        }
    }
    (tokens, merges)
}

/// The vocabulary of `n_vocab` tokens (at least [`MIN_VOCAB`]).
pub fn build(n_vocab: usize) -> Result<Vocab, String> {
    if n_vocab < MIN_VOCAB {
        return Err(format!(
            "vocab {n_vocab} is too small: the byte-level vocabulary needs at least {MIN_VOCAB} tokens (256 bytes + {} special)",
            SPECIALS.len()
        ));
    }
    if n_vocab > i32::MAX as usize {
        return Err(format!("vocab {n_vocab} is too large"));
    }
    let (mut tokens, merges) = learn(super::corpus::CORPUS, n_vocab - MIN_VOCAB);
    let mut token_types = vec![TOKEN_NORMAL; tokens.len()];
    let n_pad = n_vocab - SPECIALS.len() - tokens.len();
    for i in 0..n_pad {
        tokens.push(format!("<|reserved_{i}|>"));
        token_types.push(TOKEN_UNUSED);
    }
    for (t, ty) in SPECIALS {
        tokens.push(t.to_owned());
        token_types.push(ty);
    }
    Ok(Vocab {
        tokens,
        token_types,
        merges,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_is_gpt2s() {
        let m = byte_to_unicode();
        assert_eq!(m[b'a' as usize], 'a');
        assert_eq!(m[b' ' as usize], 'Ġ');
        assert_eq!(m[b'\n' as usize], 'Ċ');
        let mut s: Vec<char> = m.to_vec();
        s.sort_unstable();
        s.dedup();
        assert_eq!(s.len(), 256);
    }

    #[test]
    fn pre_tokenizer_splits_words() {
        assert_eq!(
            pre_tokenize("Hello  world, 12345!\n"),
            vec!["Hello", " ", " world", ",", " 123", "45", "!", "\n"]
        );
    }

    #[test]
    fn vocab_is_consistent() {
        let v = build(2048).unwrap();
        assert_eq!(v.tokens.len(), 2048);
        assert!(v.merges.len() >= 300, "{} merges", v.merges.len());
        let set: std::collections::HashSet<&str> = v.tokens.iter().map(String::as_str).collect();
        assert_eq!(set.len(), 2048, "duplicate token strings");
        for m in &v.merges {
            let (a, b) = m.split_once(' ').unwrap();
            assert!(
                set.contains(a) && set.contains(b) && set.contains(format!("{a}{b}").as_str()),
                "{m}"
            );
        }
        assert_eq!(v.id_of("<｜begin▁of▁sentence｜>"), Some(2036));
        assert_eq!(v.id_of("[gMASK]"), Some(2040));
        assert_eq!(build(MIN_VOCAB).unwrap().tokens.len(), MIN_VOCAB);
        assert!(build(MIN_VOCAB - 1).is_err());
    }
}
