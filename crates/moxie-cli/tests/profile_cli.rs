//! `moxie profile` (issue 19): prompts from a file or conversations from a JSONL file run
//! through a fixture model, the routing profile written (selections per layer and expert add
//! up to top-k per routed token), `profile show` summarising it and drawing an SVG, and bad
//! input refused by name.

mod common;

use common::{fixture_model, moxie, tmp};
use serde_json::Value;

const MODEL: &str = "qwen3moe-tiny-Q8_0.gguf";

#[test]
fn profile_runs_prompts_and_shows_them() {
    let model = fixture_model(MODEL);
    let prompts = tmp("profile", "prompts.txt");
    std::fs::write(&prompts, "Tell me about the weather.\n\nWrite a haiku.\n").unwrap();
    let out = tmp("profile", "p.json");
    let o = moxie(&[
        "profile",
        "-m",
        &model,
        "-f",
        prompts.to_str().unwrap(),
        "-n",
        "4",
        "-t",
        "1",
        "-o",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("profiled 2 prompts"), "{err}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    // The trace of the same run, replayed against expert caches: none, and room for all.
    let trace = tmp("profile", "t.bin");
    let o = moxie(&[
        "profile",
        "-m",
        &model,
        "-f",
        prompts.to_str().unwrap(),
        "-n",
        "4",
        "-t",
        "1",
        "-o",
        out.to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let sim = |gpu: &str| {
        let o = moxie(&[
            "profile",
            "simulate",
            "--trace",
            trace.to_str().unwrap(),
            "-m",
            &model,
            "--gpu",
            gpu,
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let none = sim("0");
    // No room: 0% hits and 0% saved for each of 4 policies x 2 phases.
    assert_eq!(none.matches("   0.0%").count(), 8 * 2, "{none}");
    assert!(none.lines().any(|l| l.starts_with("decay")), "{none}");
    let all = sim("1GiB");
    assert_eq!(
        all.lines().filter(|l| l.starts_with("static")).count(),
        2,
        "{all}"
    );
    assert!(
        all.lines()
            .filter(|l| l.starts_with("static"))
            .all(|l| l.contains("100.0%")),
        "{all}"
    );
    let layers = v["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 2);
    for l in layers {
        for phase in ["prefill", "decode"] {
            let p = &l[phase];
            let tokens = p["tokens"].as_u64().unwrap();
            let selected: u64 = p["counts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_u64().unwrap())
                .sum();
            assert_eq!(selected, 2 * tokens, "{phase}: {l}");
            assert!(tokens > 0, "{phase}: {l}");
        }
    }
    // The summary table (stdout) and the SVG.
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        table.contains("qwen3moe: 2 MoE layers, 8 experts each"),
        "{table}"
    );
    let svg = tmp("profile", "p.svg");
    let o = moxie(&[
        "profile",
        "show",
        out.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout), table);
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    assert!(svg_text.starts_with("<svg") && svg_text.trim_end().ends_with("</svg>"));
    // One cell per layer and expert, plus a bar per layer and the background.
    assert_eq!(svg_text.matches("<rect").count(), 2 * 8 + 2 + 1);

    // Conversations through the chat template.
    let chats = tmp("profile", "chats.jsonl");
    std::fs::write(
        &chats,
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}\n",
    )
    .unwrap();
    let o = moxie(&[
        "profile",
        "-m",
        &model,
        "--chat-file",
        chats.to_str().unwrap(),
        "-n",
        "2",
        "-t",
        "1",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Bad input: a line that is not JSON names the file and line; no prompts at all.
    std::fs::write(&chats, "{\"messages\": []}\nnot json\n").unwrap();
    let o = moxie(&[
        "profile",
        "-m",
        &model,
        "--chat-file",
        chats.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("chats.jsonl line 2: not JSON"), "{err}");
    let o = moxie(&["profile", "-m", &model, "-o", out.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("-f PROMPTS.txt"),
        "{err}"
    );
    let o = moxie(&["profile", "show", "/nonexistent/p.json"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("/nonexistent/p.json"),
        "{err}"
    );
    for f in [prompts, out, svg, chats, trace] {
        let _ = std::fs::remove_file(f);
    }
}
