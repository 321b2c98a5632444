//! Structured chat and completion requests: the fuzzer's bytes choose a request's shape
//! (messages of every role with string, null, part-list or odd content, tool calls, tools and
//! tool_choice, response formats, sampling fields, template kwargs) and its text from strings
//! the templates and parsers treat specially, so most inputs get past JSON parsing to the
//! field checks and the templates (`chat_request` takes raw bytes, most of which are not
//! JSON). The body then goes through `chat_pipeline::run`.
#![no_main]

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Map, Value};

#[path = "chat_pipeline.rs"]
mod chat_pipeline;

/// Text the templates and output parsers look for, and a few awkward strings.
const PIECES: &[&str] = &[
    "",
    " ",
    "\n",
    "Hello",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "{{",
    "}}",
    "{%",
    "%}",
    "<arg_key>",
    "<arg_value>",
    "<｜tool▁calls▁begin｜>",
    "<|tool_calls_section_begin|>",
    "\"",
    "\\",
    "é漢字",
    "\u{0}",
    "\u{FFFD}",
    "🙂",
    "[gMASK]<sop>",
    "<function=get_weather>",
    "{\"city\": \"Paris\"}",
];

const ROLES: &[&str] = &[
    "system",
    "user",
    "assistant",
    "tool",
    "developer",
    "function",
    "bot",
    "",
];

fn text(u: &mut Unstructured) -> Result<String> {
    let mut s = String::new();
    for _ in 0..u.int_in_range(0..=4)? {
        if u.arbitrary()? {
            s.push_str(u.choose(PIECES)?);
        } else {
            let raw: &str = u.arbitrary()?;
            s.extend(raw.chars().take(64));
        }
    }
    Ok(s)
}

/// Any JSON value, `depth` levels deep at most.
fn value(u: &mut Unstructured, depth: u32) -> Result<Value> {
    Ok(match u.int_in_range(0..=7)? {
        0 => Value::Null,
        1 => Value::Bool(u.arbitrary()?),
        2 => json!(u.arbitrary::<i64>()?),
        3 => json!(u.arbitrary::<f64>()?),
        4 => Value::String(text(u)?),
        5 if depth > 0 => Value::Array(
            (0..u.int_in_range(0..=3)?)
                .map(|_| value(u, depth - 1))
                .collect::<Result<_>>()?,
        ),
        6 if depth > 0 => {
            let mut m = Map::new();
            for _ in 0..u.int_in_range(0..=3)? {
                m.insert(text(u)?, value(u, depth - 1)?);
            }
            Value::Object(m)
        }
        _ => json!(u.int_in_range(-2..=300)?),
    })
}

/// `value` most of the time, sometimes any value at all (a wrong type for the field).
fn or_any(u: &mut Unstructured, v: Value) -> Result<Value> {
    if u.ratio(1, 8)? {
        value(u, 2)
    } else {
        Ok(v)
    }
}

fn tool_call(u: &mut Unstructured) -> Result<Value> {
    let args = if u.arbitrary()? {
        Value::String(text(u)?)
    } else {
        json!({"city": text(u)?, "n": u.int_in_range(-1..=3)?})
    };
    let call = json!({
        "id": text(u)?, "type": "function",
        "function": {"name": u.choose(&["get_weather", "search", ""])?, "arguments": args},
    });
    or_any(u, call)
}

fn message(u: &mut Unstructured) -> Result<Value> {
    let mut m = Map::new();
    m.insert("role".into(), Value::String(u.choose(ROLES)?.to_string()));
    let content = match u.int_in_range(0..=4)? {
        0 => Value::Null,
        1 => json!([{"type": "text", "text": text(u)?}, {"type": "text", "text": text(u)?}]),
        2 => json!([{"type": "image_url", "image_url": {"url": text(u)?}}]),
        3 => value(u, 2)?,
        _ => Value::String(text(u)?),
    };
    if u.ratio(7, 8)? {
        m.insert("content".into(), content);
    }
    if u.ratio(1, 4)? {
        m.insert("reasoning_content".into(), Value::String(text(u)?));
    }
    if u.ratio(1, 4)? {
        let calls = (0..u.int_in_range(0..=2)?)
            .map(|_| tool_call(u))
            .collect::<Result<Vec<_>>>()?;
        m.insert("tool_calls".into(), Value::Array(calls));
    }
    if u.ratio(1, 4)? {
        m.insert("tool_call_id".into(), Value::String(text(u)?));
    }
    if u.ratio(1, 8)? {
        m.insert("name".into(), Value::String(text(u)?));
    }
    Ok(Value::Object(m))
}

fn tool(u: &mut Unstructured) -> Result<Value> {
    let params = if u.arbitrary()? {
        json!({"type": "object", "properties": {"city": {"type": "string"},
            "unit": {"type": "string", "enum": ["C", "F"]}}, "required": ["city"]})
    } else {
        value(u, 3)?
    };
    let t = json!({"type": "function", "function": {
        "name": u.choose(&["get_weather", "search", "", "a b"])?,
        "description": text(u)?, "parameters": params}});
    or_any(u, t)
}

fn request(u: &mut Unstructured) -> Result<Value> {
    let mut r = Map::new();
    let mut put = |u: &mut Unstructured, k: &str, v: Value| -> Result<()> {
        let v = or_any(u, v)?;
        r.insert(k.to_string(), v);
        Ok(())
    };
    if u.ratio(7, 8)? {
        let msgs = (0..u.int_in_range(0..=6)?)
            .map(|_| message(u))
            .collect::<Result<Vec<_>>>()?;
        put(u, "messages", Value::Array(msgs))?;
    }
    if u.ratio(1, 4)? {
        let prompt = if u.arbitrary()? {
            Value::String(text(u)?)
        } else {
            json!((0..u.int_in_range(0..=4)?)
                .map(|_| u.int_in_range(-1..=1200))
                .collect::<Result<Vec<i64>>>()?)
        };
        put(u, "prompt", prompt)?;
    }
    if u.ratio(1, 3)? {
        let tools = (0..u.int_in_range(0..=3)?)
            .map(|_| tool(u))
            .collect::<Result<Vec<_>>>()?;
        put(u, "tools", Value::Array(tools))?;
    }
    if u.ratio(1, 3)? {
        let choice = match u.int_in_range(0..=3)? {
            0 => json!("auto"),
            1 => json!("none"),
            2 => json!("required"),
            _ => {
                json!({"type": "function", "function": {"name": u.choose(&["get_weather", "x"])?}})
            }
        };
        put(u, "tool_choice", choice)?;
    }
    if u.ratio(1, 4)? {
        let f = match u.int_in_range(0..=2)? {
            0 => json!({"type": "json_object"}),
            1 => {
                json!({"type": "json_schema", "json_schema": {"name": "x", "schema": value(u, 3)?}})
            }
            _ => json!({"type": "text"}),
        };
        put(u, "response_format", f)?;
    }
    if u.ratio(1, 3)? {
        let v = json!({"enable_thinking": u.arbitrary::<bool>()?});
        put(u, "chat_template_kwargs", v)?;
    }
    for (k, lo, hi) in [
        ("max_tokens", -2i64, 5000),
        ("max_completion_tokens", -2, 5000),
        ("top_k", -2, 200),
        ("seed", -2, 1 << 40),
        ("n", 0, 3),
        ("reasoning_budget", -2, 100),
    ] {
        if u.ratio(1, 4)? {
            let v = u.int_in_range(lo..=hi)?;
            put(u, k, json!(v))?;
        }
    }
    for k in [
        "temperature",
        "top_p",
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "repeat_penalty",
    ] {
        if u.ratio(1, 5)? {
            let v: f64 = f64::from(u.int_in_range(-300..=300)?) / 100.0;
            put(u, k, json!(v))?;
        }
    }
    for k in ["stream", "ignore_eos", "echo", "logprobs"] {
        if u.ratio(1, 5)? {
            let v = json!(u.arbitrary::<bool>()?);
            put(u, k, v)?;
        }
    }
    if u.ratio(1, 5)? {
        let stop = if u.arbitrary()? {
            Value::String(text(u)?)
        } else {
            json!((0..u.int_in_range(0..=5)?)
                .map(|_| text(u))
                .collect::<Result<Vec<_>>>()?)
        };
        put(u, "stop", stop)?;
    }
    if u.ratio(1, 6)? {
        let v = json!({"include_usage": u.arbitrary::<bool>()?});
        put(u, "stream_options", v)?;
    }
    if u.ratio(1, 6)? {
        let v = json!(u.choose(&["low", "medium", "high", "none", ""])?);
        put(u, "reasoning_effort", v)?;
    }
    if u.ratio(1, 6)? {
        let v = json!({"1": u.int_in_range(-100..=100)?, "x": 1});
        put(u, "logit_bias", v)?;
    }
    if u.ratio(1, 8)? {
        let k = text(u)?;
        let v = value(u, 2)?;
        put(u, &k, v)?;
    }
    Ok(Value::Object(r))
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    if let Ok(req) = request(&mut u) {
        chat_pipeline::run(req.to_string().as_bytes());
    }
});
