//! Any text through each fixture architecture's tokenizer, special-token parsing on and off,
//! and back; and any token ids (in range or not) through the decoders.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use moxie_tokenizer::Tokenizer;

#[path = "fixtures.rs"]
#[allow(dead_code)]
mod fixtures;

static TOKS: OnceLock<Vec<Arc<Tokenizer>>> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let toks = TOKS.get_or_init(fixtures::tokenizers);
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let tok = &toks[sel as usize % toks.len()];
    let (add_special, parse_special) = (sel & 0x40 != 0, sel & 0x80 != 0);
    let text = String::from_utf8_lossy(rest);
    let ids = tok.encode(&text, add_special, parse_special);
    assert!(
        ids.iter().all(|&i| (i as usize) < tok.n_vocab()),
        "id out of the vocabulary"
    );
    std::hint::black_box(tok.detokenize(&ids, !add_special, parse_special));
    // The same bytes as token ids, many out of the vocabulary.
    let raw: Vec<u32> = rest
        .chunks(2)
        .map(|c| u32::from(c[0]) | u32::from(*c.get(1).unwrap_or(&0)) << 8 | (sel as u32) << 16)
        .collect();
    std::hint::black_box(tok.decode(&raw, parse_special));
    std::hint::black_box(tok.detokenize(&raw, add_special, parse_special));
    for &id in raw.iter().take(8) {
        std::hint::black_box(tok.token_to_piece(id, parse_special));
    }
});
