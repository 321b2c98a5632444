//! Any model output through every family's tool-call parser.
#![no_main]

use libfuzzer_sys::fuzz_target;
use moxie_server::tool_calls::{parse_tool_calls, tool_section_start, ToolFormat};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for format in ToolFormat::ALL {
        std::hint::black_box(parse_tool_calls(format, &text));
        if let Some(at) = tool_section_start(format, &text) {
            assert!(
                at <= text.len() && text.is_char_boundary(at),
                "{format:?}: start {at}"
            );
        }
    }
});
