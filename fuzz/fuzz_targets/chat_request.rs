//! Any request body through the server's parsers (`/v1/chat/completions` and
//! `/v1/completions`), and the chat requests that parse through each fixture model's template
//! as the server renders them.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use moxie_server::prompt::{Prompter, ReasoningMode};
use moxie_server::request::{parse_body, parse_chat, parse_completion, GenDefaults};

#[path = "fixtures.rs"]
#[allow(dead_code)]
mod fixtures;

static PROMPTERS: OnceLock<Vec<Prompter>> = OnceLock::new();

fn prompters() -> Vec<Prompter> {
    let toks = fixtures::tokenizers();
    let p: Vec<Prompter> = fixtures::templates(&toks)
        .into_iter()
        .map(|(t, tok)| Prompter::new(Arc::clone(&tok), t, 4096, ReasoningMode::Auto, None))
        .collect();
    assert!(!p.is_empty(), "no chat templates in the fixtures");
    eprintln!("chat_request: {} templates", p.len());
    p
}

fuzz_target!(|data: &[u8]| {
    let prompters = PROMPTERS.get_or_init(prompters);
    let Ok(obj) = parse_body(data) else {
        return;
    };
    let defaults = GenDefaults::default();
    let _ = parse_completion(&obj, 1000, &defaults);
    let Ok(req) = parse_chat(&obj, &defaults) else {
        return;
    };
    for p in prompters {
        let _ = std::hint::black_box(p.render_chat(&req));
    }
});
