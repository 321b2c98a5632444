//! Constrained decoding: grammars built from the input (JSON objects with and without allowed
//! keys, any JSON value, text up to a terminator, tagged fields, each family's forced tool
//! call), then any bytes fed to them. Wherever the state can still complete, its shortest
//! completion must be accepted and complete it, in exactly `completion_len` bytes.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use moxie_server::grammar::{Fields, Grammar, GrammarState, Part};
use moxie_server::tool_calls::{forced_call_grammar, ToolFormat, ToolSpec};

fn words(spec: &str) -> Vec<String> {
    spec.split(',').map(str::to_string).collect()
}

fn grammar(kind: u8, spec: &str) -> Grammar {
    let part = match kind % 7 {
        0 => Part::JsonObject { keys: None },
        1 => Part::JsonObject {
            keys: Some(words(spec)),
        },
        2 => Part::JsonValue,
        3 => Part::TextUntil(spec.to_string()),
        4 => Part::OneOf(words(spec)),
        5 => {
            let w = words(spec);
            let at = |i: usize| w.get(i).cloned().unwrap_or_default();
            Part::Fields(Fields {
                keys: (w.len() > 4).then(|| w[4..].to_vec()),
                key_open: at(0),
                key_close: at(1),
                value_close: at(2),
                end: at(3),
            })
        }
        _ => {
            let format = ToolFormat::ALL[(kind as usize / 7) % ToolFormat::ALL.len()];
            let tools: Vec<ToolSpec> = serde_json::from_str::<Vec<serde_json::Value>>(spec)
                .unwrap_or_default()
                .into_iter()
                .map(|t| ToolSpec {
                    name: t["name"].as_str().unwrap_or("f").to_string(),
                    parameters: t["parameters"].clone(),
                })
                .collect();
            return forced_call_grammar(format, &tools);
        }
    };
    Grammar {
        parts: vec![Part::Literal("<".into()), part, Part::Literal(">".into())],
    }
}

fn check_completion(state: &GrammarState) {
    let Some(len) = state.completion_len() else {
        assert!(state.is_dead());
        return;
    };
    let c = state.shortest_completion();
    assert_eq!(
        c.len(),
        len,
        "completion_len disagrees with shortest_completion"
    );
    let mut s = state.clone();
    assert!(
        s.accept_bytes(&c),
        "the shortest completion {c:?} is refused"
    );
    assert!(
        s.is_complete(),
        "the shortest completion {c:?} does not complete"
    );
}

fuzz_target!(|data: &[u8]| {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    // The grammar's strings, then (after the first 0xff) the bytes fed to it.
    let (spec, feed) = match rest.iter().position(|&b| b == 0xff) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let g = Arc::new(grammar(kind, &String::from_utf8_lossy(spec)));
    let mut state = GrammarState::new(&g);
    check_completion(&state);
    for &b in feed {
        let mut next = state.clone();
        if next.accept_bytes(&[b]) {
            state = next;
            check_completion(&state);
        }
    }
});
