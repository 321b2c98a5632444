//! No panics on any input, invalid ids are skipped, and encoding is fast.

mod common;

use common::*;

/// xorshift64*, deterministic
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const PIECES: &[&str] = &[
    "a",
    "Z",
    "hello",
    " ",
    "  ",
    "\t",
    "\n",
    "\r\n",
    "\u{a0}",
    "\u{3000}",
    "\u{85}",
    "\u{200b}",
    "'s",
    "'LL",
    "'",
    "0",
    "123",
    "٣",
    "²",
    ".",
    "!?",
    "$",
    "<",
    ">",
    "|",
    "é",
    "e\u{301}",
    "ß",
    "İ",
    "\u{212a}",
    "Привет",
    "日本語",
    "ひらがな",
    "カタカナ",
    "한국어",
    "مرحبا",
    "हिन्दी",
    "🙂",
    "👨\u{200d}👩",
    "🇯🇵",
    "\u{10ffff}",
    "\u{fffd}",
    "\0",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<|",
    "|>",
    "<｜User｜>",
    "｜",
    "[gMASK]",
    "<sop>",
    "<|endoftext|>",
];

fn random_text(rng: &mut Rng, max_pieces: usize) -> String {
    let n = rng.below(max_pieces + 1);
    (0..n).map(|_| PIECES[rng.below(PIECES.len())]).collect()
}

#[test]
fn random_inputs_roundtrip_and_never_panic() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for arch in ARCHS {
        let tok = tokenizer(arch);
        for _ in 0..400 {
            let text = random_text(&mut rng, 40);
            for (add, parse) in [(false, false), (false, true), (true, false), (true, true)] {
                let ids = tok.encode(&text, add, parse);
                assert!(ids.iter().all(|&i| (i as usize) < tok.n_vocab()));
                // byte-level BPE is lossless: special=true detokenization gives the text back
                // (after a BOS the model added)
                let skip = usize::from(add && tok.add_bos());
                assert_eq!(
                    tok.decode(&ids[skip..], true),
                    text.as_bytes(),
                    "{arch} {text:?} {add} {parse}"
                );
                let _ = tok.detokenize(&ids, add, parse);
            }
        }
    }
}

#[test]
fn invalid_ids_are_skipped() {
    let tok = tokenizer("qwen3moe");
    let hello = tok.encode("Hello", false, false);
    let mut ids = vec![u32::MAX, 2048, 99_999];
    ids.extend(&hello);
    ids.push(u32::MAX);
    assert_eq!(tok.decode(&ids, true), b"Hello");
    assert_eq!(tok.detokenize(&ids, true, true), b"Hello");
    assert!(tok.token_to_piece(u32::MAX, true).is_empty());
    assert_eq!(tok.token_text(5000), None);
    assert!(!tok.is_eog(u32::MAX));
    assert_eq!(tok.encode("", true, true), Vec::<u32>::new());
}

#[test]
fn special_tokens_render_only_when_asked() {
    let tok = tokenizer("qwen3moe");
    let ids = tok.encode(
        "<|im_start|>user\nhi<think>x</think><|im_end|>",
        false,
        true,
    );
    assert_eq!(ids[0], tok.token_id("<|im_start|>").unwrap());
    // control tokens vanish without `special`; user-defined tokens (<think>) always render
    assert_eq!(tok.decode(&ids, false), b"user\nhi<think>x</think>");
    assert_eq!(
        tok.decode(&ids, true),
        b"<|im_start|>user\nhi<think>x</think><|im_end|>"
    );
    // without parse_special, control tokens are plain text but user-defined ones still parse
    let plain = tok.encode("<|im_end|><think>", false, false);
    assert!(!plain.contains(&tok.token_id("<|im_end|>").unwrap()));
    assert!(plain.contains(&tok.token_id("<think>").unwrap()));
}

#[test]
fn encoding_100kb_is_fast() {
    let golden = read_json("golden/index.json");
    let seq = golden["seq_text"].as_str().unwrap();
    let mut text = String::new();
    let mut rng = Rng(7);
    while text.len() < 100_000 {
        text.push_str(seq);
        text.push_str(&random_text(&mut rng, 30));
    }
    for arch in ARCHS {
        let tok = tokenizer(arch);
        let t0 = std::time::Instant::now();
        let ids = tok.encode(&text, true, true);
        let dt = t0.elapsed();
        eprintln!(
            "{arch}: {} bytes -> {} tokens in {:?}",
            text.len(),
            ids.len(),
            dt
        );
        assert!(ids.len() > 10_000);
        // generous bound for a loaded 2-core CI machine (release build: a few ms)
        assert!(dt.as_secs_f64() < 5.0, "{arch}: {dt:?}");
    }
}

#[test]
fn types_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<moxie_tokenizer::Tokenizer>();
    check::<moxie_tokenizer::ChatTemplate>();
    check::<moxie_tokenizer::VocabData>();
}
