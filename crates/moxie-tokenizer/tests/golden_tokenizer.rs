//! Every tokenizer golden (llama.cpp `llama_tokenize` / `llama_token_to_piece`) of the fixture
//! models: 32 texts x add_special x parse_special, ids and detokenized bytes.

mod common;

use common::*;

const SETTINGS: [(&str, bool, bool); 4] = [
    ("add_special=true,parse_special=false", true, false),
    ("add_special=true,parse_special=true", true, true),
    ("add_special=false,parse_special=false", false, false),
    ("add_special=false,parse_special=true", false, true),
];

fn check_arch(arch: &str) {
    let tok = tokenizer(arch);
    let golden = read_json(&format!("golden/tokenizer-{arch}.json"));
    let cases = golden.as_array().expect("list of cases");
    assert_eq!(cases.len(), 32, "{arch}: expected 32 golden texts");
    let mut failures = Vec::new();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        for (key, add_special, parse_special) in SETTINGS {
            let g = &case[key];
            let want = ids(&g["ids"]);
            let got = tok.encode(text, add_special, parse_special);
            if got != want {
                failures.push(format!(
                    "{arch} {key} {text:?}\n  got  {got:?}\n  want {want:?}"
                ));
                continue;
            }
            let detok = tok.decode(&got, true);
            let want_hex = g["detok_special_hex"].as_str().unwrap();
            if hex(&detok) != want_hex {
                failures.push(format!(
                    "{arch} {key} {text:?}: detok {:?} != {:?}",
                    String::from_utf8_lossy(&detok),
                    g["detok_special"]
                ));
            }
        }
        // per-token pieces of the plain tokenization
        let plain = ids(&case["add_special=false,parse_special=false"]["ids"]);
        let pieces: Vec<String> = case["pieces_hex"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap().to_string())
            .collect();
        let got: Vec<String> = plain
            .iter()
            .map(|&id| hex(&tok.token_to_piece(id, true)))
            .collect();
        if got != pieces {
            failures.push(format!("{arch} pieces {text:?}: {got:?} != {pieces:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn golden_deepseek2() {
    check_arch("deepseek2");
}

#[test]
fn golden_glm4moe() {
    check_arch("glm4moe");
}

#[test]
fn golden_qwen3moe() {
    check_arch("qwen3moe");
}

#[test]
fn golden_qwen3next() {
    check_arch("qwen3next");
}

/// The token ids of the logits goldens' sequences (first 8/40/120 tokens of
/// `llama_tokenize(seq_text, add_special = true)`).
#[test]
fn golden_sequences() {
    let index = read_json("golden/index.json");
    let text = index["seq_text"].as_str().unwrap();
    let models = index["models"].as_object().unwrap();
    let mut checked = 0;
    for arch in ["deepseek2", "glm4moe", "qwen3moe", "qwen3next"] {
        let tok = tokenizer(arch);
        let full = tok.encode(text, true, false);
        let full_special = tok.encode(text, true, true);
        assert_eq!(full, full_special);
        for (name, m) in models {
            if m["arch"].as_str() != Some(arch) {
                continue;
            }
            for (sname, seq) in m["sequences"].as_object().unwrap() {
                let want = ids(&seq["token_ids"]);
                assert_eq!(&full[..want.len()], &want[..], "{name} {sname}");
                checked += 1;
            }
        }
    }
    assert!(checked >= 3 * 20, "only {checked} sequences checked");
}
