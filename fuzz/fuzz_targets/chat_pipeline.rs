//! What `chat_request` and `chat_request_json` run on a request body: the server's parsers
//! (`/v1/chat/completions` and `/v1/completions`), then every fixture template's rendering of
//! a chat request that parses.

use std::sync::{Arc, OnceLock};

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
    eprintln!("chat request targets: {} templates", p.len());
    p
}

/// A request body through the parsers and, where it is a valid chat request, every template.
pub fn run(body: &[u8]) {
    let prompters = PROMPTERS.get_or_init(prompters);
    let Ok(obj) = parse_body(body) else {
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
}
