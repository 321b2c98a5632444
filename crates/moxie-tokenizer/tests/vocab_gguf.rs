//! `VocabData::from_gguf` on the fixture models: keys as llama.cpp reads them.

mod common;

use common::*;
use moxie_tokenizer::{attr, Tokenizer, TokenizerError, VocabData};

#[test]
fn gguf_vocab_matches_tokenizer_json() {
    let (tokens, merges) = tokenizer_json_vocab();
    for arch in ARCHS {
        let v = vocab(arch);
        assert_eq!(v.model, "gpt2");
        assert_eq!(v.tokens.len(), 2048);
        assert_eq!(&v.tokens[..tokens.len()], &tokens[..], "{arch}");
        for (i, s) in SPECIALS.iter().enumerate() {
            assert_eq!(v.tokens[2033 + i], *s, "{arch}");
        }
        assert_eq!(v.merges.as_deref(), Some(&merges[..]), "{arch}");
        let types = v.token_types.as_ref().unwrap();
        assert!(types[..2033].iter().all(|&t| t == 1));
        assert!(types[2033..2046].iter().all(|&t| t == 3));
        assert_eq!(&types[2046..], &[4, 4]);
    }
}

#[test]
fn special_tokens_per_arch() {
    let ds = tokenizer("deepseek2");
    assert_eq!(ds.pre(), "deepseek-v3");
    assert_eq!((ds.bos(), ds.eos()), (Some(2036), Some(2037)));
    assert!(ds.add_bos());
    assert!(!ds.add_eos());

    let glm = tokenizer("glm4moe");
    assert_eq!(glm.pre(), "glm4");
    assert_eq!(
        (glm.bos(), glm.eos(), glm.eot()),
        (Some(2040), Some(2033), Some(2043))
    );
    assert!(!glm.add_bos());

    let qw = tokenizer("qwen3moe");
    assert_eq!(qw.pre(), "qwen2");
    assert_eq!((qw.bos(), qw.eos()), (Some(2033), Some(2035)));
    assert!(!qw.add_bos());

    for t in [&ds, &glm, &qw] {
        assert_eq!(t.n_vocab(), 2048);
        // EOG as llama.cpp builds it: the text-recognised tokens plus eos/eot
        for name in ["<|endoftext|>", "<|im_end|>", "<｜end▁of▁sentence｜>"] {
            assert!(t.is_eog(t.token_id(name).unwrap()), "{name}");
        }
        assert!(t.is_eog(t.eos().unwrap()));
        assert!(!t.is_eog(t.token_id("<|im_start|>").unwrap()));
        assert!(!t.is_eog(t.token_id("Hello").unwrap_or(0)));
        assert!(!t.is_eog(u32::MAX));
        // an explicit or detected end-of-turn token exists
        let eot = t.eot().unwrap();
        assert!(t.is_eog(eot));
        // control vs user-defined
        assert!(t.is_control(2034));
        assert_eq!(t.token_attr(2046), Some(attr::USER_DEFINED));
    }
    // GLM: <|user|> is the end-of-turn token (tokenizer.ggml.eot_token_id)
    assert!(glm.is_eog(2043));
    assert!(!glm.is_eog(2044)); // <|assistant|>
    let eog_glm: Vec<&str> = glm
        .eog_tokens()
        .iter()
        .map(|&i| glm.token_text(i).unwrap())
        .collect();
    assert_eq!(
        eog_glm,
        [
            "<|endoftext|>",
            "<|im_end|>",
            "<｜end▁of▁sentence｜>",
            "<|user|>"
        ]
    );
}

#[test]
fn unknown_pre_and_model_are_errors() {
    let mut v = vocab("qwen3moe");
    v.pre = Some("no-such-pre".into());
    match Tokenizer::new(v) {
        Err(e @ TokenizerError::UnknownPre { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("no-such-pre") && msg.contains("deepseek-v3") && msg.contains("qwen2"),
                "{msg}"
            );
        }
        other => panic!("expected UnknownPre, got {other:?}"),
    }
    let mut v = vocab("qwen3moe");
    v.model = "bert".into();
    assert!(matches!(Tokenizer::new(v), Err(TokenizerError::UnsupportedModel(m)) if m == "bert"));
    let mut v = vocab("qwen3moe");
    v.merges = None;
    assert!(matches!(
        Tokenizer::new(v),
        Err(TokenizerError::MissingMerges)
    ));
    assert!(matches!(
        Tokenizer::new(VocabData {
            model: "gpt2".into(),
            ..Default::default()
        }),
        Err(TokenizerError::EmptyVocab)
    ));
}

#[test]
fn missing_tokenizer_keys_are_errors() {
    let md = moxie_gguf::Metadata::new("empty");
    assert!(matches!(
        VocabData::from_gguf(&md),
        Err(TokenizerError::Metadata(_))
    ));
}
