//! `moxie serve` driven over real HTTP: chat (whole and streamed), text completions, stop
//! sequences, reasoning on/off and budgets, a tool-call round trip, prefix reuse (also of a
//! model with recurrent layers, through its state checkpoints), API keys, and a client that
//! leaves mid-stream.

mod serve_support;

use std::io::{Read, Write};
use std::time::Duration;

use serde_json::{json, Value};
use serve_support::*;

const MODEL: &str = "qwen3moe-tiny-Q8_0.gguf";

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

#[test]
fn chat_whole_and_streamed_agree_with_usage_and_timings() {
    let s = Server::start(MODEL, &["-t", "1", "--alias", "tiny"]);
    let body =
        json!({"messages": user("Tell me about licenses."), "max_tokens": 16, "temperature": 0});
    // Asked twice, so the answer compared with the stream below comes from the same cache
    // state (a prompt evaluated in one batch and one evaluated after a cached prefix may
    // differ in the last bits, enough to change a greedy pick of this random model).
    let first = s.post("/v1/chat/completions", &body);
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(
        first.json()["usage"]["prompt_tokens_details"]["cached_tokens"],
        0
    );
    let r = s.post("/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "tiny");
    let msg = &v["choices"][0]["message"];
    assert_eq!(msg["role"], "assistant");
    let content = msg["content"].as_str().unwrap().to_string();
    assert!(!content.is_empty());
    let fin = v["choices"][0]["finish_reason"].as_str().unwrap();
    assert!(fin == "length" || fin == "stop", "{fin}");
    let usage = &v["usage"];
    let n_completion = usage["completion_tokens"].as_u64().unwrap();
    assert!((1..=16).contains(&n_completion));
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + n_completion
    );
    let t = &v["timings"];
    for k in [
        "prompt_n",
        "prompt_ms",
        "predicted_n",
        "predicted_ms",
        "predicted_per_token_ms",
        "prompt_per_second",
    ] {
        assert!(t[k].is_number(), "timings.{k}: {t}");
    }
    assert_eq!(t["predicted_n"].as_u64().unwrap(), n_completion);

    // The same request streamed: same text, [DONE] last, usage chunk when asked.
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    sbody["stream_options"] = json!({"include_usage": true});
    let r = s.post("/v1/chat/completions", &sbody);
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let (reasoning, streamed, finish, chunks) = collect_chat_stream(&r);
    assert_eq!(streamed, content);
    assert_eq!(reasoning, "");
    assert_eq!(finish.as_deref(), Some(fin));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(
        last["usage"]["completion_tokens"].as_u64().unwrap(),
        n_completion
    );
    // The second request reuses the first one's prompt from the slot's cache.
    assert!(
        last["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    let fin_chunk = &chunks[chunks.len() - 2];
    assert!(fin_chunk["timings"]["predicted_n"].is_number());

    let m = s.get("/v1/models").json();
    assert_eq!(m["data"][0]["id"], "tiny");
    // llama-server's tokenizer endpoints, with the model's own tokenizer.
    let ids = s
        .post("/tokenize", &json!({"content": "Hello world<|im_end|>"}))
        .json()["tokens"]
        .clone();
    assert!(ids.as_array().unwrap().len() >= 2, "{ids}");
    let back = s.post("/detokenize", &json!({"tokens": ids})).json();
    assert_eq!(back["content"], "Hello world");
    assert_eq!(
        s.post("/detokenize", &json!({"tokens": [1, 99999999]}))
            .status,
        400
    );
    let metrics = s.get("/metrics").text();
    assert!(
        metrics.contains("moxie_requests_success_total 3"),
        "{metrics}"
    );
    assert!(metrics.contains("moxie_kv_cache_usage_ratio"));
}

#[test]
fn completions_give_llama_cpp_greedy_continuation() {
    let index: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures_dir().join("golden/index.json")).unwrap(),
    )
    .unwrap();
    let seq = &index["models"]["qwen3moe-tiny-F32"]["sequences"]["s8"];
    let ids = seq["token_ids"].clone();
    let want = seq["greedy_text"].as_str().unwrap();
    let s = Server::start("qwen3moe-tiny-F32.gguf", &["-t", "1"]);
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": ids, "max_tokens": 32, "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], want);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 32);

    // Streamed text completion: the same text in pieces.
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": ids, "max_tokens": 32, "temperature": 0, "ignore_eos": true, "stream": true}),
    );
    let data = r.sse_data();
    assert_eq!(data.last().unwrap(), "[DONE]");
    let text: String = data[..data.len() - 1]
        .iter()
        .map(|d| {
            serde_json::from_str::<Value>(d).unwrap()["choices"][0]["text"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert_eq!(text, want);
}

#[test]
fn stop_sequences_end_the_answer_before_them() {
    let s = Server::start(MODEL, &["-t", "1"]);
    let base = json!({"prompt": "Permission is hereby granted", "max_tokens": 24, "temperature": 0, "ignore_eos": true});
    let full = s.post("/v1/completions", &base).json()["choices"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    // A stop sequence taken from the middle of the free-running text.
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() > 12, "{full:?}");
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 3].iter().collect();
    let at = full.find(&stop).unwrap();
    for stream in [false, true] {
        let mut body = base.clone();
        body["stop"] = json!(["never-appears", stop]);
        body["stream"] = json!(stream);
        let r = s.post("/v1/completions", &body);
        assert_eq!(r.status, 200);
        let (text, finish) = if stream {
            let mut text = String::new();
            let mut finish = String::new();
            for d in r.sse_data().iter().filter(|d| *d != "[DONE]") {
                let v: Value = serde_json::from_str(d).unwrap();
                text.push_str(v["choices"][0]["text"].as_str().unwrap_or(""));
                if let Some(f) = v["choices"][0]["finish_reason"].as_str() {
                    finish = f.to_string();
                }
            }
            (text, finish)
        } else {
            let v = r.json();
            (
                v["choices"][0]["text"].as_str().unwrap().to_string(),
                v["choices"][0]["finish_reason"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        };
        assert_eq!(text, full[..at], "stream={stream}, stop={stop:?}");
        assert_eq!(finish, "stop");
    }
}

#[test]
fn reasoning_on_off_and_budget() {
    let tpl = test_data("qwen3-thinking.jinja");
    let s = Server::start(MODEL, &["-t", "1", "--chat-template-file", &tpl]);
    // Reasoning on (the template opens <think>): with a budget of 6 tokens, `</think>` is
    // inserted after them and the rest is the answer.
    let body = json!({
        "messages": user("What is 2+2?"),
        "max_tokens": 24, "temperature": 0, "ignore_eos": true,
        "chat_template_kwargs": {"enable_thinking": true},
        "reasoning_budget": 6,
    });
    let v = s.post("/v1/chat/completions", &body).json();
    let msg = &v["choices"][0]["message"];
    let reasoning = msg["reasoning_content"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"));
    assert!(!reasoning.is_empty());
    assert!(!reasoning.contains("</think>"));
    let content = msg["content"].as_str().unwrap();
    assert!(
        !content.is_empty() && !content.contains("think>"),
        "{content:?}"
    );
    // Streamed: the same split.
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let (r2, c2, _, _) = collect_chat_stream(&s.post("/v1/chat/completions", &sbody));
    assert_eq!(r2.trim(), reasoning);
    assert_eq!(c2, content);

    // Reasoning off: the template closes the think block; no reasoning_content.
    let off = json!({
        "messages": user("What is 2+2?"), "max_tokens": 8, "temperature": 0, "ignore_eos": true,
        "chat_template_kwargs": {"enable_thinking": false},
    });
    let v_off = s.post("/v1/chat/completions", &off).json();
    assert!(
        v_off["choices"][0]["message"]
            .get("reasoning_content")
            .is_none(),
        "{v_off}"
    );
    assert!(!v_off["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .is_empty());
    // reasoning_effort "none" is the same switch.
    let none = json!({
        "messages": user("What is 2+2?"), "max_tokens": 8, "temperature": 0, "ignore_eos": true,
        "reasoning_effort": "none",
    });
    let v_none = s.post("/v1/chat/completions", &none).json();
    assert_eq!(
        v_none["choices"][0]["message"],
        v_off["choices"][0]["message"]
    );
    assert_eq!(
        v_none["usage"]["prompt_tokens"],
        v_off["usage"]["prompt_tokens"]
    );
    drop(s);

    // The server default: --reasoning off.
    let s = Server::start(
        MODEL,
        &[
            "-t",
            "1",
            "--chat-template-file",
            &tpl,
            "--reasoning",
            "off",
        ],
    );
    let plain = json!({"messages": user("What is 2+2?"), "max_tokens": 8, "temperature": 0, "ignore_eos": true});
    let v = s.post("/v1/chat/completions", &plain).json();
    assert_eq!(v["choices"][0]["message"], v_off["choices"][0]["message"]);
}

#[test]
fn tool_call_round_trip() {
    let tpl = test_data("qwen3-thinking.jinja");
    let s = Server::start(
        MODEL,
        &[
            "-t",
            "1",
            "--chat-template-file",
            &tpl,
            "--reasoning",
            "off",
        ],
    );
    let tools = json!([{
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        }
    }, {
        "type": "function",
        "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}
    }]);
    let ask = user("What's the weather in Paris?");
    // The tools reach the template (the prompt grows by their description), except with
    // tool_choice "none".
    let usage = |body: Value| {
        s.post("/v1/chat/completions", &body).json()["usage"]["prompt_tokens"]
            .as_u64()
            .unwrap()
    };
    let without = usage(json!({"messages": ask, "max_tokens": 1}));
    let with = usage(json!({"messages": ask, "tools": tools, "max_tokens": 1}));
    let none =
        usage(json!({"messages": ask, "tools": tools, "tool_choice": "none", "max_tokens": 1}));
    assert!(with > without, "{with} {without}");
    assert_eq!(none, without);

    // A forced call: the model's output follows the call syntax and is parsed into tool_calls.
    for stream in [false, true] {
        let body = json!({
            "messages": ask, "tools": tools, "max_tokens": 48, "temperature": 0,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "stream": stream,
        });
        let r = s.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        let (calls, finish) = if stream {
            let (_, _, finish, chunks) = collect_chat_stream(&r);
            let calls: Vec<Value> = chunks
                .iter()
                .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array().cloned())
                .flatten()
                .collect();
            (calls, finish.unwrap())
        } else {
            let v = r.json();
            (
                v["choices"][0]["message"]["tool_calls"]
                    .as_array()
                    .cloned()
                    .unwrap_or_else(|| panic!("{v}")),
                v["choices"][0]["finish_reason"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        };
        assert_eq!(finish, "tool_calls");
        assert_eq!(calls.len(), 1, "{calls:?}");
        let call = &calls[0];
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], "get_weather");
        assert!(call["id"].as_str().unwrap().starts_with("call_"));
        let args: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert!(args.is_object(), "{args}");
    }

    // "required" with both tools: a call to one of them.
    let body = json!({"messages": ask, "tools": tools, "tool_choice": "required", "max_tokens": 48, "temperature": 0});
    let v = s.post("/v1/chat/completions", &body).json();
    let call = &v["choices"][0]["message"]["tool_calls"][0];
    let name = call["function"]["name"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"));
    assert!(name == "get_weather" || name == "get_time");

    // The result goes back as a tool message; the model answers.
    let follow = json!({
        "messages": [
            {"role": "user", "content": "What's the weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "{\"temp_c\": 18, \"sky\": \"clear\"}"}
        ],
        "tools": tools, "max_tokens": 8, "temperature": 0,
    });
    let r = s.post("/v1/chat/completions", &follow);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    // The call and its result are in the prompt now.
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > with);
}

#[test]
fn json_response_format_gives_a_json_object() {
    let s = Server::start(MODEL, &["-t", "1"]);
    let body = json!({
        "messages": user("Describe Paris as JSON."), "max_tokens": 40, "temperature": 0,
        "response_format": {"type": "json_object"},
    });
    let v = s.post("/v1/chat/completions", &body).json();
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    let parsed: Value =
        serde_json::from_str(content).unwrap_or_else(|e| panic!("{e}: {content:?}"));
    assert!(parsed.is_object());
}

#[test]
fn api_key_guards_the_api() {
    let s = Server::start(MODEL, &["-t", "1", "--api-key", "sekrit"]);
    let body = json!({"messages": user("hi"), "max_tokens": 2});
    let r = s.post("/v1/chat/completions", &body);
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["type"], "authentication_error");
    assert_eq!(s.get("/v1/models").status, 401);
    let r = s.raw_json(
        "POST",
        "/v1/chat/completions",
        &["Authorization: Bearer sekrit"],
        body.to_string().as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(s.get("/health").status, 200);
    assert_eq!(s.get("/metrics").status, 200);
}

#[test]
fn a_client_that_leaves_frees_its_slot() {
    let s = Server::start(MODEL, &["-t", "1", "--parallel", "1"]);
    // A long streamed answer, abandoned after its first chunk.
    let body = json!({"messages": user("Go on forever."), "max_tokens": 3000, "ignore_eos": true, "stream": true}).to_string();
    let mut c = std::net::TcpStream::connect(s.addr).unwrap();
    write!(
        c,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut buf = [0u8; 512];
    let n = c.read(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).contains("200"));
    let t0 = std::time::Instant::now();
    loop {
        let h = s.get("/health").json();
        if h["slots_processing"] == 1 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the request never took a slot: {h}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(c);
    // The only slot is free again well before 3000 tokens could be generated.
    wait_idle(&s, Duration::from_secs(20));
    let r = s.post(
        "/v1/chat/completions",
        &json!({"messages": user("hi"), "max_tokens": 2}),
    );
    assert_eq!(r.status, 200);
    let predicted = s.get("/metrics").text();
    let line = predicted
        .lines()
        .find(|l| l.starts_with("moxie_requests_cancelled_total"))
        .unwrap();
    assert_eq!(line, "moxie_requests_cancelled_total 1");
}

/// Greedy continuation of `prompt` by `model` in-process, one token per forward pass in exact
/// numerics: what `moxie serve --exact -ub 1 -t 1` computes for a fresh slot.
fn greedy_ids(model: &moxie_core::Model, prompt: &[u32], n: usize) -> Vec<u32> {
    use moxie_core::{Logits, Numerics, Parallel};
    let par = Parallel::single().with_numerics(Numerics::Exact);
    let mut state = model.new_state(Some(256)).unwrap();
    let mut logits = Vec::new();
    for &t in prompt {
        logits = model.forward(&[t], &mut state, &par, Logits::Last).unwrap();
    }
    let mut out = Vec::new();
    for _ in 0..n {
        let t = moxie_core::sampling::argmax(&logits);
        out.push(t);
        logits = model.forward(&[t], &mut state, &par, Logits::Last).unwrap();
    }
    out
}

/// A slot of a model with recurrent layers (qwen3next: gated DeltaNet) that reuses a cached
/// prefix answers exactly as a fresh slot does. Recurrent state exists only where the engine
/// checkpointed it (each prompt's end and each answer's end), so reusing a prefix means
/// restoring the latest checkpoint at or before the shared part and evaluating the rest again.
///
/// Both servers run `--exact -ub 1`: every token goes through the model on its own, so the
/// computation after the reused prefix is the same sequence of one-token passes in both, and
/// the answers are bit-identical exactly when the restored state (convolution window, DeltaNet
/// matrices, the attention layer's rows) equals the fresh slot's state at that position. A
/// checkpoint restored at the wrong position, not restored at all, or partly restored gives
/// the recurrent layers another history, hence other logits and, with greedy sampling on this
/// random model, other tokens within the 12 compared (skipping the restore, or restoring the
/// DeltaNet matrices without the convolution window, made request 3 fail here). The
/// number of cached tokens each request reports is checked too: it says which checkpoint the
/// engine chose. The reference answers come from a second server whose slot is flushed
/// before each request (a prompt sharing no token, so it starts from an empty state:
/// `cached_tokens` 0), and the prompts are built from token ids computed in-process (the
/// server's first answer is checked to be those ids).
///
/// Requests, in order, on the reusing server:
/// 1. P1 (30 tokens), a fresh start; answer A1 (12 tokens). Checkpoints at 30 and 41 (the
///    answer's last token is sampled, not evaluated).
/// 2. P2 = P1 + A1 + X: extends the previous exchange, continues the state at 41 (cached 41).
///    Checkpoints at len(P2) = 47 and after its answer.
/// 3. P2 + Y, diverging from the answer to P2: restores the checkpoint at 47 (cached 47).
/// 4. P2[..44] + Z, diverging inside X: restores the checkpoint at 41, the end of the first
///    answer (cached 41).
/// 5. P1[..20] + W, diverging inside P1 before every checkpoint: starts over (cached 0).
#[test]
fn recurrent_slot_reusing_a_prefix_answers_as_a_fresh_slot() {
    const QWEN3NEXT: &str = "qwen3next-tiny-F32.gguf";
    let n_answer = 12;
    let file = moxie_gguf::GgufFile::open(fixture_model(QWEN3NEXT).as_ref()).unwrap();
    let model = moxie_core::Model::load(std::sync::Arc::new(file)).unwrap();
    let args = [
        "-t",
        "1",
        "--exact",
        "-ub",
        "1",
        "-c",
        "256",
        "--parallel",
        "1",
    ];
    let reusing = Server::start(QWEN3NEXT, &args);
    let fresh = Server::start(QWEN3NEXT, &args);
    let ids = |seed: u32, n: u32| -> Vec<u32> { (0..n).map(|i| (i * 37 + seed) % 2000).collect() };
    // Answer `prompt` on `s`, checking the reported cache reuse; returns the text and why it
    // ended.
    let complete = |s: &Server, prompt: &[u32], cached: usize, what: &str| -> (String, Value) {
        let body = json!({"prompt": prompt, "max_tokens": n_answer, "temperature": 0});
        let r = s.post("/v1/completions", &body);
        assert_eq!(r.status, 200, "{what}: {}", r.text());
        let v = r.json();
        assert_eq!(v["usage"]["prompt_tokens"], prompt.len(), "{what}");
        assert_eq!(
            v["usage"]["prompt_tokens_details"]["cached_tokens"], cached,
            "{what}: cached tokens"
        );
        let text = v["choices"][0]["text"].as_str().unwrap().to_string();
        (text, v["choices"][0]["finish_reason"].clone())
    };
    // The fresh slot's answer: flushed by a one-token prompt no other prompt starts with.
    let fresh_answer = |prompt: &[u32], what: &str| -> (String, Value) {
        let flush = [prompt[0] + 1];
        let r = fresh.post(
            "/v1/completions",
            &json!({"prompt": flush, "max_tokens": 1}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        complete(&fresh, prompt, 0, &format!("{what} (fresh)"))
    };

    let p1 = ids(5, 30);
    let a1 = greedy_ids(&model, &p1, n_answer);
    let (got, finish) = complete(&reusing, &p1, 0, "P1");
    let want = reusing.post("/detokenize", &json!({"tokens": a1})).json();
    assert_eq!(
        got, want["content"],
        "the server's first answer is the in-process one"
    );
    // All n_answer tokens: the checkpoint after the answer is at 30 + 11.
    assert_eq!(finish, "length");

    let mut p2 = p1.clone();
    p2.extend(&a1);
    p2.extend(ids(11, 5));
    let a2 = greedy_ids(&model, &p2, 1);
    let mut p2y = p2.clone();
    p2y.extend(ids(a2[0] + 1, 3));
    let mut p2z = p2[..44].to_vec();
    p2z.extend(ids(17, 4));
    let mut p1w = p1[..20].to_vec();
    p1w.extend(ids(23, 6));
    let n1 = p1.len() + n_answer - 1;
    for (prompt, cached, what) in [
        (&p2, n1, "P1 + A1 + X"),
        (&p2y, p2.len(), "P2 + Y"),
        (&p2z, n1, "P2[..44] + Z"),
        (&p1w, 0, "P1[..20] + W"),
    ] {
        let got = complete(&reusing, prompt, cached, what);
        assert_eq!(
            got,
            fresh_answer(prompt, what),
            "{what}: reused slot vs fresh slot"
        );
    }
}

/// `--expert-cache` on a simulated device: `/metrics` reports its lookups, hits and experts
/// brought in, as they grow with decode steps.
#[test]
fn metrics_report_the_expert_cache() {
    let flags = ["-t", "1", "--sim", "1GiB", "-ngl", "999", "-ot", "exps=CPU"];
    let s = Server::start(MODEL, &[&flags[..], &["--expert-cache", "auto"]].concat());
    let body = json!({"messages": user("Count to three."), "max_tokens": 6, "temperature": 0});
    let r = s.post("/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let value = |metrics: &str, name: &str| metric_value(metrics, name) as u64;
    // qwen3moe tiny: 2 MoE layers, top-2; every generated token but the last is a decode step.
    let decoded = r.json()["usage"]["completion_tokens"].as_u64().unwrap() - 1;
    let want = 2 * 2 * decoded;
    // The engine sets the counters after its step, which may end after the answer went out.
    let mut metrics = s.get("/metrics").text();
    for _ in 0..50 {
        if value(&metrics, "expert_cache_lookups_total") == want {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        metrics = s.get("/metrics").text();
    }
    let lookups = value(&metrics, "expert_cache_lookups_total");
    assert_eq!(lookups, want, "{metrics}");
    let hits = value(&metrics, "expert_cache_hits_total");
    assert!(
        hits <= lookups && value(&metrics, "expert_cache_uploads_total") > 0,
        "{metrics}"
    );
    // Without a cache, nothing of it.
    let plain = Server::start(MODEL, &flags);
    assert!(!plain.get("/metrics").text().contains("expert_cache"));
}

/// Routing telemetry (issue 19): `/metrics` has per-layer routing summaries, and
/// `--profile-out` writes every MoE layer's selections at shutdown (SIGTERM), added to what the
/// file held, so two runs of the server leave the sum of both.
#[test]
fn routing_profile_accumulates_across_restarts() {
    let dir = std::env::temp_dir().join(format!("moxie-profile-out-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("routing.json");
    let p = path.to_str().unwrap();
    let run = || {
        let mut s = Server::start(MODEL, &["-t", "1", "--profile-out", p]);
        let body = json!({"messages": user("Count to three."), "max_tokens": 6, "temperature": 0});
        let r = s.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        let usage = r.json()["usage"].clone();
        let metrics = s.get("/metrics").text();
        for line in [
            "moxie_routing_tokens_total{layer=\"0\",phase=\"prefill\"}",
            "moxie_routing_tokens_total{layer=\"1\",phase=\"decode\"}",
            "moxie_routing_experts_for_share{layer=\"1\",share=\"0.5\"}",
            "moxie_routing_top_expert_share{layer=\"0\"}",
        ] {
            assert!(metrics.contains(line), "{line} missing from:\n{metrics}");
        }
        let killed = std::process::Command::new("kill")
            .args(["-TERM", &s.pid().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        assert!(
            s.child.wait().unwrap().success(),
            "{}",
            s.log.lock().unwrap()
        );
        (
            usage["prompt_tokens"].as_u64().unwrap(),
            usage["completion_tokens"].as_u64().unwrap(),
        )
    };
    let read =
        || -> Value { serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap() };
    let (prompt, completion) = run();
    let first = read();
    assert_eq!(first["format"], "moxie-routing-profile");
    let layers = first["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 2, "qwen3moe tiny has two MoE layers");
    let n_expert = first["n_expert"].as_u64().unwrap() as usize;
    for l in layers {
        let (pre, dec) = (&l["prefill"], &l["decode"]);
        assert_eq!(pre["tokens"], prompt, "{l}");
        // Every generated token but the last is fed back one at a time.
        let decoded = dec["tokens"].as_u64().unwrap();
        assert!(
            (completion.saturating_sub(1)..=completion).contains(&decoded),
            "{l}"
        );
        for (phase, tokens) in [(pre, prompt), (dec, decoded)] {
            let counts = phase["counts"].as_array().unwrap();
            assert_eq!(counts.len(), n_expert);
            let selected: u64 = counts.iter().map(|c| c.as_u64().unwrap()).sum();
            assert_eq!(selected, 2 * tokens, "top-2 routing: {l}");
            let mass: f64 = phase["mass"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m.as_f64().unwrap())
                .sum();
            assert!(
                (mass - tokens as f64).abs() < 1e-3 * (1 + tokens) as f64,
                "weights sum to 1 per token: {l}"
            );
        }
    }
    // A second run adds its counters to the file's.
    let (prompt2, _) = run();
    let second = read();
    assert_eq!(
        second["layers"][0]["prefill"]["tokens"].as_u64().unwrap(),
        prompt + prompt2
    );
    // Another model's profile in the file: refused at start, the file left alone.
    let mut other = second.clone();
    other["n_expert"] = json!(3);
    std::fs::write(&path, other.to_string()).unwrap();
    let o = serve_output(MODEL, &["--profile-out", p]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("--profile-out") && err.contains("routing.json"),
        "{err}"
    );
    assert_eq!(read()["n_expert"], 3);
    let _ = std::fs::remove_dir_all(&dir);
}
