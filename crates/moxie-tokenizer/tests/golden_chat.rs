//! Chat-template goldens: jinja2 renderings of the fixture models' templates, byte for byte,
//! and the token ids of each rendering (`add_special = true`, `parse_special = true`).

mod common;

use common::*;
use moxie_tokenizer::ChatTemplate;

fn check_arch(arch: &str) {
    let tok = tokenizer(arch);
    let golden = read_json(&format!("golden/chat-{arch}.json"));
    let template_src = golden["template"].as_str().unwrap();
    assert_eq!(
        tok.chat_template(),
        Some(template_src),
        "{arch}: GGUF chat template"
    );
    let tmpl = ChatTemplate::from_tokenizer(&tok).unwrap();
    assert_eq!(tmpl.source(), template_src);
    let messages = golden["messages"].as_array().unwrap();
    let rendered = golden["rendered"].as_object().unwrap();
    assert_eq!(rendered.len(), 3);
    for (key, r) in rendered {
        // "2msgs_add_ass=true"
        let n: usize = key[..1].parse().unwrap();
        let add_ass = key.ends_with("=true");
        let out = tmpl
            .render(&messages[..n], add_ass, &Default::default())
            .unwrap();
        assert_eq!(out, r["jinja2"].as_str().unwrap(), "{arch} {key}");
        assert_eq!(
            out,
            r["llama_chat_apply_template"].as_str().unwrap(),
            "{arch} {key}"
        );
        let want = ids(&r["token_ids_add_special_parse_special"]);
        assert_eq!(tok.encode(&out, true, true), want, "{arch} {key} ids");
    }
}

#[test]
fn chat_deepseek2() {
    check_arch("deepseek2");
}

#[test]
fn chat_glm4moe() {
    check_arch("glm4moe");
}

#[test]
fn chat_qwen3moe() {
    check_arch("qwen3moe");
}

#[test]
fn chat_qwen3next() {
    check_arch("qwen3next");
}
