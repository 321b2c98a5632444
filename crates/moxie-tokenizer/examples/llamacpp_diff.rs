//! Compares this crate with llama.cpp's own output (a development check, not part of the
//! test suite; see `tools/llamacpp-diff/README.md`).
//!
//! usage: `llamacpp_diff MODEL.gguf HARNESS_OUTPUT.txt TEXTS.json`
//!
//! Checks BOS/EOS/EOT/add_bos/add_eos, the EOG set, every token attribute, every token piece
//! (special false/true), and for each text the ids of the four add_special x parse_special
//! settings and `llama_detokenize` in the four remove_special x unparse_special modes.

use moxie_tokenizer::{Tokenizer, VocabData};

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        eprintln!("usage: llamacpp_diff MODEL.gguf HARNESS_OUTPUT.txt TEXTS.json");
        std::process::exit(2);
    }
    let (model, out, texts) = (&args[1], &args[2], &args[3]);
    let out = std::fs::read_to_string(out).expect("harness output");
    let texts: Vec<String> =
        serde_json::from_str(&std::fs::read_to_string(texts).expect("texts")).expect("texts json");
    let tok = match VocabData::from_gguf_file(std::path::Path::new(model)).and_then(Tokenizer::new)
    {
        Ok(t) => t,
        Err(e) => {
            println!("{model}: cannot build tokenizer: {e}");
            std::process::exit(1);
        }
    };
    let (mut ok, mut fail) = (0usize, 0usize);
    let report = |what: String, fail: &mut usize| {
        *fail += 1;
        if *fail <= 20 {
            println!("{what}");
        }
    };
    let mut lines = out.lines();

    let header: Vec<&str> = lines.next().unwrap_or_default().split(' ').collect();
    let field = |k: &str| -> i64 {
        header
            .iter()
            .position(|x| *x == k)
            .and_then(|i| header.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(-2)
    };
    let id = |x: Option<u32>| x.map_or(-1, i64::from);
    if field("bos") != id(tok.bos())
        || field("eos") != id(tok.eos())
        || (field("addbos") != 0) != tok.add_bos()
        || (field("addeos") != 0) != tok.add_eos()
    {
        report(
            format!("special ids: llama {header:?}, ours {tok:?}"),
            &mut fail,
        );
    }
    if field("eot") != id(tok.eot()) {
        // llama.cpp picks among several EOT-looking tokens by hash-map order
        println!("note: eot llama {} ours {:?}", field("eot"), tok.eot());
    }
    let eog: Vec<u32> = lines
        .next()
        .unwrap_or_default()
        .split(' ')
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    if eog != tok.eog_tokens() {
        report(
            format!("eog: llama {eog:?} ours {:?}", tok.eog_tokens()),
            &mut fail,
        );
    }
    let attrs = lines.next().unwrap_or_default().split(' ').skip(1);
    for (i, a) in attrs.enumerate() {
        if a.parse::<u32>().ok() != tok.token_attr(i as u32) {
            report(
                format!("attr {i}: llama {a} ours {:?}", tok.token_attr(i as u32)),
                &mut fail,
            );
        }
    }
    for special in [false, true] {
        let pieces = lines.next().unwrap_or_default().split(' ').skip(1);
        for (i, h) in pieces.enumerate() {
            let want = if h == "-" { "" } else { h };
            let got = hex(&tok.token_to_piece(i as u32, special));
            if got != want {
                report(
                    format!("piece {i} special={special}: llama {want} ours {got}"),
                    &mut fail,
                );
            }
        }
    }
    let mut text = "";
    let mut ids: Vec<u32> = Vec::new();
    for line in lines {
        let parts: Vec<&str> = line.split(' ').collect();
        match parts[0] {
            "T" => text = &texts[parts[1].parse::<usize>().expect("text index")],
            "S" => {
                let (add, parse) = (parts[1] == "1", parts[2] == "1");
                let want: Vec<u32> = parts[3..].iter().filter_map(|x| x.parse().ok()).collect();
                let got = tok.encode(text, add, parse);
                if got == want {
                    ok += 1;
                } else {
                    report(
                        format!("ids add={add} parse={parse} {text:?}\n  llama {want:?}\n  ours  {got:?}"),
                        &mut fail,
                    );
                }
                ids = want;
            }
            "D" => {
                let (rs, us) = (parts[1] == "1", parts[2] == "1");
                let want = parts.get(3).copied().unwrap_or("");
                let got = hex(&tok.detokenize(&ids, rs, us));
                if got == want {
                    ok += 1;
                } else {
                    report(
                        format!(
                            "detokenize rs={rs} us={us} {text:?}\n  llama {want}\n  ours  {got}"
                        ),
                        &mut fail,
                    );
                }
            }
            _ => {}
        }
    }
    println!("{model}: {ok} ok, {fail} mismatches");
    if fail > 0 {
        std::process::exit(1);
    }
}
