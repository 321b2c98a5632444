//! Any request body through the server's parsers (`/v1/chat/completions` and
//! `/v1/completions`), and the chat requests that parse through each fixture model's template
//! as the server renders them.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "chat_pipeline.rs"]
mod chat_pipeline;

fuzz_target!(|data: &[u8]| chat_pipeline::run(data));
