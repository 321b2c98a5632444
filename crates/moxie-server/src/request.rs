//! Request bodies: parsed field by field from JSON so every wrong type or value gets a 400
//! naming the field. Unknown fields are ignored (clients send many); `null` means absent.

use serde_json::{Map, Value};

use crate::error::ApiError;

/// Sampling and stopping settings shared by both completion endpoints.
#[derive(Clone, Debug, PartialEq)]
pub struct GenRequest {
    /// `max_tokens` / `max_completion_tokens` (`n_predict` as llama-server calls it).
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub repeat_penalty: f32,
    pub repeat_last_n: usize,
    /// None: a fresh random seed.
    pub seed: Option<u64>,
    /// llama-server's `ignore_eos`: keep generating past end-of-generation tokens.
    pub ignore_eos: bool,
}

/// Largest `max_tokens` accepted; anything larger is surely a mistake (contexts are smaller).
pub const MAX_TOKENS_LIMIT: usize = 1 << 24;
/// At most this many stop sequences, each at most this many bytes.
pub const MAX_STOPS: usize = 16;
pub const MAX_STOP_BYTES: usize = 256;

/// `tool_choice`.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolChoice {
    Auto,
    None,
    Required,
    Function(String),
}

/// `response_format`.
#[derive(Clone, Debug, PartialEq)]
pub enum ResponseFormat {
    Text,
    /// `json_object`, or `json_schema` (its schema's top-level `properties` names, when given).
    JsonObject {
        keys: Option<Vec<String>>,
    },
}

/// `POST /v1/chat/completions`.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatRequest {
    pub model: Option<String>,
    /// Messages as the template sees them (content normalised to a string).
    pub messages: Vec<Value>,
    /// The `tools` array as sent (each `{"type": "function", "function": {...}}`).
    pub tools: Vec<Value>,
    pub tool_choice: ToolChoice,
    pub response_format: ResponseFormat,
    /// `chat_template_kwargs`.
    pub template_kwargs: Map<String, Value>,
    /// Reasoning asked for by this request: `chat_template_kwargs.enable_thinking` (or
    /// `thinking`), or `reasoning_effort` ("none" = off). None: the server's default.
    pub reasoning: Option<bool>,
    /// `reasoning_budget` (tokens of thinking; -1 = unlimited, 0 = none).
    pub reasoning_budget: Option<i64>,
    /// `reasoning_format: "none"`: leave the thinking in `content` (llama-server's option).
    pub reasoning_in_content: bool,
    pub gen: GenRequest,
}

/// A completion prompt: text, or token ids.
#[derive(Clone, Debug, PartialEq)]
pub enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
}

/// `POST /v1/completions`.
#[derive(Clone, Debug, PartialEq)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: PromptInput,
    pub echo: bool,
    pub gen: GenRequest,
}

/// The request body as a JSON object, or the 400 that says why not.
pub fn parse_body(bytes: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        ApiError::bad_request(format!(
            "the request body is not valid UTF-8 (at byte {})",
            e.valid_up_to()
        ))
    })?;
    if text.trim().is_empty() {
        return Err(ApiError::bad_request(
            "the request body is empty; expected a JSON object",
        ));
    }
    let v: Value = serde_json::from_str(text).map_err(|e| {
        ApiError::bad_request(format!(
            "the request body is not valid JSON: {e} (line {}, column {})",
            e.line(),
            e.column()
        ))
    })?;
    match v {
        Value::Object(m) => Ok(m),
        other => Err(ApiError::bad_request(format!(
            "the request body must be a JSON object, not {}",
            kind_of(&other)
        ))),
    }
}

/// "a string", "an array", ... for messages.
pub fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn field<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

fn wrong_type(key: &str, want: &str, got: &Value) -> ApiError {
    ApiError::invalid(key, format!("'{key}' must be {want}, not {}", kind_of(got)))
}

fn opt_bool(obj: &Map<String, Value>, key: &str) -> Result<Option<bool>, ApiError> {
    match field(obj, key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(wrong_type(key, "a boolean", v)),
    }
}

fn opt_str<'a>(obj: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>, ApiError> {
    match field(obj, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(wrong_type(key, "a string", v)),
    }
}

/// A finite number within `[lo, hi]`.
fn opt_num(obj: &Map<String, Value>, key: &str, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
    match field(obj, key) {
        None => Ok(None),
        Some(v @ Value::Number(n)) => {
            let x = n.as_f64().ok_or_else(|| wrong_type(key, "a number", v))?;
            if !(lo..=hi).contains(&x) {
                return Err(ApiError::invalid(
                    key,
                    format!("'{key}' must be between {lo} and {hi}, got {x}"),
                ));
            }
            Ok(Some(x as f32))
        }
        Some(v) => Err(wrong_type(key, "a number", v)),
    }
}

/// An integer within `[lo, hi]` (`3.0` counts as 3, as JSON does not tell them apart).
fn opt_int(obj: &Map<String, Value>, key: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
    match field(obj, key) {
        None => Ok(None),
        Some(v @ Value::Number(n)) => {
            let x = if let Some(i) = n.as_i64() {
                i
            } else if n.as_u64().is_some() {
                // Above i64::MAX: out of any range we accept.
                return Err(ApiError::invalid(
                    key,
                    format!("'{key}' must be between {lo} and {hi}, got {n}"),
                ));
            } else {
                let f = n.as_f64().unwrap_or(f64::NAN);
                if f.fract() != 0.0 || !f.is_finite() || f.abs() > 9.0e15 {
                    return Err(wrong_type(key, "an integer", v));
                }
                f as i64
            };
            if !(lo..=hi).contains(&x) {
                return Err(ApiError::invalid(
                    key,
                    format!("'{key}' must be between {lo} and {hi}, got {x}"),
                ));
            }
            Ok(Some(x))
        }
        Some(v) => Err(wrong_type(key, "an integer", v)),
    }
}

/// What a request gets for the settings it leaves out: the server's command line
/// (llama-server's `--temp`, `--top-k`, `--top-p`, `--min-p`, `--repeat-penalty`, `--seed`,
/// `-n`, ...).
#[derive(Clone, Debug, Default)]
pub struct GenDefaults {
    /// Every sampling setting but the seed.
    pub sampler: moxie_core::SamplerConfig,
    /// None: a fresh random seed per request.
    pub seed: Option<u64>,
    /// Tokens to generate at most; None: until the context is full.
    pub max_tokens: Option<usize>,
}

/// The settings both endpoints share. `chat`: the chat endpoint (`max_completion_tokens` is
/// its newer name for `max_tokens`).
fn parse_gen(
    obj: &Map<String, Value>,
    chat: bool,
    defaults: &GenDefaults,
) -> Result<GenRequest, ApiError> {
    let d = &defaults.sampler;
    let mut max_tokens = opt_int(obj, "max_tokens", 1, MAX_TOKENS_LIMIT as i64)?;
    if chat {
        if let Some(m) = opt_int(obj, "max_completion_tokens", 1, MAX_TOKENS_LIMIT as i64)? {
            max_tokens = Some(m);
        }
    }
    // llama-server's name for it.
    if max_tokens.is_none() {
        max_tokens = opt_int(obj, "n_predict", -1, MAX_TOKENS_LIMIT as i64)?.filter(|&n| n >= 0);
    }
    if let Some(n) = opt_int(obj, "n", 1, i64::MAX)? {
        if n != 1 {
            return Err(ApiError::invalid(
                "n",
                format!("'n' must be 1 (one choice per request), got {n}"),
            ));
        }
    }
    if let Some(true) = opt_bool(obj, "logprobs")? {
        return Err(ApiError::invalid(
            "logprobs",
            "'logprobs' is not supported by this server",
        ));
    }
    let stream = opt_bool(obj, "stream")?.unwrap_or(false);
    let include_usage = match field(obj, "stream_options") {
        None => false,
        Some(Value::Object(o)) => match field(o, "include_usage") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(v) => return Err(wrong_type("stream_options.include_usage", "a boolean", v)),
        },
        Some(v) => return Err(wrong_type("stream_options", "an object", v)),
    };
    let stop = match field(obj, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => {
            if a.len() > MAX_STOPS {
                return Err(ApiError::invalid(
                    "stop",
                    format!(
                        "'stop' holds at most {MAX_STOPS} sequences, got {}",
                        a.len()
                    ),
                ));
            }
            a.iter()
                .enumerate()
                .map(|(i, s)| match s {
                    Value::String(s) => Ok(s.clone()),
                    v => Err(wrong_type(&format!("stop[{i}]"), "a string", v)),
                })
                .collect::<Result<_, _>>()?
        }
        Some(v) => return Err(wrong_type("stop", "a string or an array of strings", v)),
    };
    for s in &stop {
        if s.is_empty() || s.len() > MAX_STOP_BYTES {
            return Err(ApiError::invalid(
                "stop",
                format!("each stop sequence must be 1 to {MAX_STOP_BYTES} bytes long"),
            ));
        }
    }
    let seed = match field(obj, "seed").and_then(Value::as_u64) {
        Some(s) => Some(s),
        // llama-server: -1 = random.
        None => match opt_int(obj, "seed", i64::MIN, i64::MAX)? {
            None => defaults.seed,
            Some(-1) => None,
            Some(s) => Some(s as u64),
        },
    };
    Ok(GenRequest {
        max_tokens: max_tokens.map(|m| m as usize).or(defaults.max_tokens),
        stop,
        stream,
        include_usage,
        temperature: opt_num(obj, "temperature", 0.0, 100.0)?.unwrap_or(d.temperature),
        top_k: opt_int(obj, "top_k", 0, 1 << 30)?.map_or(d.top_k, |k| k as usize),
        top_p: opt_num(obj, "top_p", 0.0, 1.0)?.unwrap_or(d.top_p),
        min_p: opt_num(obj, "min_p", 0.0, 1.0)?.unwrap_or(d.min_p),
        presence_penalty: opt_num(obj, "presence_penalty", -2.0, 2.0)?
            .unwrap_or(d.presence_penalty),
        frequency_penalty: opt_num(obj, "frequency_penalty", -2.0, 2.0)?
            .unwrap_or(d.frequency_penalty),
        repeat_penalty: opt_num(obj, "repeat_penalty", 0.0, 10.0)?.unwrap_or(d.repeat_penalty),
        repeat_last_n: opt_int(obj, "repeat_last_n", 0, 1 << 20)?
            .map_or(d.repeat_last_n, |n| n as usize),
        seed,
        ignore_eos: opt_bool(obj, "ignore_eos")?.unwrap_or(false),
    })
}

/// Roles a message may have.
const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// One message, checked and normalised: `content` a string (text parts joined; `null` kept
/// only for an assistant message with tool calls), `developer` → `system`.
fn parse_message(i: usize, m: &Value) -> Result<Value, ApiError> {
    let at = |f: &str| format!("messages[{i}].{f}");
    let Value::Object(obj) = m else {
        return Err(wrong_type(&format!("messages[{i}]"), "an object", m));
    };
    let role = match obj.get("role") {
        Some(Value::String(r)) => r.as_str(),
        Some(v) => return Err(wrong_type(&at("role"), "a string", v)),
        None => {
            return Err(ApiError::invalid(
                &at("role"),
                format!("'{}' is missing", at("role")),
            ))
        }
    };
    if !ROLES.contains(&role) {
        return Err(ApiError::invalid(
            &at("role"),
            format!(
                "'{}' is '{role}'; expected one of {}",
                at("role"),
                ROLES.join(", ")
            ),
        ));
    }
    let mut out = obj.clone();
    if role == "developer" {
        out.insert("role".into(), "system".into());
    }
    let tool_calls = match obj.get("tool_calls") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) if role == "assistant" => Some(a),
        Some(Value::Array(_)) => {
            return Err(ApiError::invalid(
                &at("tool_calls"),
                format!("only assistant messages carry tool_calls (this one is '{role}')"),
            ))
        }
        Some(v) => return Err(wrong_type(&at("tool_calls"), "an array", v)),
    };
    let content = match obj.get("content") {
        None | Some(Value::Null) => {
            if role == "assistant" && tool_calls.is_some() {
                Value::Null
            } else if role == "assistant" {
                Value::String(String::new())
            } else {
                return Err(ApiError::invalid(
                    &at("content"),
                    format!("'{}' is missing", at("content")),
                ));
            }
        }
        Some(Value::String(s)) => Value::String(s.clone()),
        Some(Value::Array(parts)) => Value::String(text_of_parts(&at("content"), parts)?),
        Some(v) => {
            return Err(wrong_type(
                &at("content"),
                "a string or an array of parts",
                v,
            ))
        }
    };
    out.insert("content".into(), content);
    if let Some(r) = field(obj, "reasoning_content") {
        if !r.is_string() {
            return Err(wrong_type(&at("reasoning_content"), "a string", r));
        }
    }
    if let Some(calls) = tool_calls {
        let mut norm = Vec::with_capacity(calls.len());
        for (j, c) in calls.iter().enumerate() {
            norm.push(parse_tool_call(
                &format!("messages[{i}].tool_calls[{j}]"),
                c,
            )?);
        }
        out.insert("tool_calls".into(), Value::Array(norm));
    }
    if role == "tool" {
        if let Some(v) = field(obj, "tool_call_id") {
            if !v.is_string() {
                return Err(wrong_type(&at("tool_call_id"), "a string", v));
            }
        }
    }
    Ok(Value::Object(out))
}

/// `[{"type": "text", "text": ...}, ...]` → the texts joined.
fn text_of_parts(param: &str, parts: &[Value]) -> Result<String, ApiError> {
    let mut text = String::new();
    for (k, p) in parts.iter().enumerate() {
        let here = format!("{param}[{k}]");
        let Value::Object(o) = p else {
            return Err(wrong_type(&here, "an object", p));
        };
        match o.get("type").and_then(Value::as_str) {
            Some("text") => match o.get("text") {
                Some(Value::String(s)) => text.push_str(s),
                Some(v) => return Err(wrong_type(&format!("{here}.text"), "a string", v)),
                None => {
                    return Err(ApiError::invalid(
                        &format!("{here}.text"),
                        format!("'{here}.text' is missing"),
                    ))
                }
            },
            Some(t) => {
                return Err(ApiError::invalid(
                    &format!("{here}.type"),
                    format!(
                    "content parts of type '{t}' are not supported: this server takes text only"
                ),
                ))
            }
            None => {
                return Err(ApiError::invalid(
                    &format!("{here}.type"),
                    format!("'{here}.type' is missing or not a string"),
                ))
            }
        }
    }
    Ok(text)
}

/// An assistant message's tool call: `{"id", "type": "function", "function": {"name",
/// "arguments"}}`; `arguments` a JSON string (as OpenAI clients send) or an object.
fn parse_tool_call(param: &str, c: &Value) -> Result<Value, ApiError> {
    let Value::Object(o) = c else {
        return Err(wrong_type(param, "an object", c));
    };
    let Some(Value::Object(f)) = o.get("function") else {
        return Err(ApiError::invalid(
            &format!("{param}.function"),
            format!("'{param}.function' must be an object"),
        ));
    };
    match f.get("name") {
        Some(Value::String(s)) if !s.is_empty() => {}
        _ => {
            return Err(ApiError::invalid(
                &format!("{param}.function.name"),
                format!("'{param}.function.name' must be a non-empty string"),
            ))
        }
    }
    match f.get("arguments") {
        Some(Value::String(s)) => {
            if serde_json::from_str::<Value>(s).is_err() {
                return Err(ApiError::invalid(
                    &format!("{param}.function.arguments"),
                    format!("'{param}.function.arguments' is not valid JSON"),
                ));
            }
        }
        Some(Value::Object(_)) | None => {}
        Some(v) => {
            return Err(wrong_type(
                &format!("{param}.function.arguments"),
                "a JSON string or an object",
                v,
            ))
        }
    }
    let mut out = o.clone();
    out.entry("type").or_insert_with(|| "function".into());
    Ok(Value::Object(out))
}

fn parse_tools(obj: &Map<String, Value>) -> Result<Vec<Value>, ApiError> {
    let tools = match field(obj, "tools") {
        None => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(v) => return Err(wrong_type("tools", "an array", v)),
    };
    for (i, t) in tools.iter().enumerate() {
        let here = format!("tools[{i}]");
        let Value::Object(o) = t else {
            return Err(wrong_type(&here, "an object", t));
        };
        match o.get("type") {
            Some(Value::String(s)) if s == "function" => {}
            _ => {
                return Err(ApiError::invalid(
                    &format!("{here}.type"),
                    format!("'{here}.type' must be \"function\""),
                ))
            }
        }
        let Some(Value::Object(f)) = o.get("function") else {
            return Err(ApiError::invalid(
                &format!("{here}.function"),
                format!("'{here}.function' must be an object"),
            ));
        };
        match f.get("name") {
            Some(Value::String(s)) if !s.is_empty() => {}
            _ => {
                return Err(ApiError::invalid(
                    &format!("{here}.function.name"),
                    format!("'{here}.function.name' must be a non-empty string"),
                ))
            }
        }
        if let Some(p) = field(f, "parameters") {
            if !p.is_object() {
                return Err(wrong_type(
                    &format!("{here}.function.parameters"),
                    "an object",
                    p,
                ));
            }
        }
    }
    Ok(tools.clone())
}

/// The name of tool `t` (checked by [`parse_tools`]).
pub fn tool_name(t: &Value) -> &str {
    t["function"]["name"].as_str().unwrap_or("")
}

fn parse_tool_choice(obj: &Map<String, Value>, tools: &[Value]) -> Result<ToolChoice, ApiError> {
    let choice = match field(obj, "tool_choice") {
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("'tool_choice' is '{other}'; expected auto, none, required or an object naming a function"),
                ))
            }
        },
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    ApiError::invalid(
                        "tool_choice",
                        "'tool_choice' as an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    )
                })?;
            ToolChoice::Function(name.to_string())
        }
        Some(v) => return Err(wrong_type("tool_choice", "a string or an object", v)),
    };
    match &choice {
        ToolChoice::Required if tools.is_empty() => Err(ApiError::invalid(
            "tool_choice",
            "'tool_choice' is 'required' but the request has no tools",
        )),
        ToolChoice::Function(name) if !tools.iter().any(|t| tool_name(t) == name) => {
            Err(ApiError::invalid(
                "tool_choice",
                format!(
                    "'tool_choice' names function '{name}', which is not among the request's tools"
                ),
            ))
        }
        _ => Ok(choice),
    }
}

fn parse_response_format(obj: &Map<String, Value>) -> Result<ResponseFormat, ApiError> {
    let Some(v) = field(obj, "response_format") else {
        return Ok(ResponseFormat::Text);
    };
    let Value::Object(o) = v else {
        return Err(wrong_type("response_format", "an object", v));
    };
    match o.get("type").and_then(Value::as_str) {
        Some("text") => Ok(ResponseFormat::Text),
        Some("json_object") => Ok(ResponseFormat::JsonObject { keys: None }),
        Some("json_schema") => {
            let schema = o
                .get("json_schema")
                .and_then(|s| s.get("schema"))
                .or_else(|| o.get("schema"));
            let schema = match schema {
                Some(Value::Object(s)) => s,
                Some(v) => {
                    return Err(wrong_type(
                        "response_format.json_schema.schema",
                        "an object",
                        v,
                    ))
                }
                None => {
                    return Err(ApiError::invalid(
                        "response_format.json_schema",
                        "'response_format.json_schema.schema' is missing",
                    ))
                }
            };
            if let Some(t) = schema.get("type").and_then(Value::as_str) {
                if t != "object" {
                    return Err(ApiError::invalid(
                        "response_format.json_schema.schema",
                        format!("only object schemas are supported, not type '{t}'"),
                    ));
                }
            }
            let keys = schema
                .get("properties")
                .and_then(Value::as_object)
                .map(|p| p.keys().cloned().collect());
            Ok(ResponseFormat::JsonObject { keys })
        }
        Some(t) => Err(ApiError::invalid(
            "response_format.type",
            format!("'response_format.type' is '{t}'; expected text, json_object or json_schema"),
        )),
        None => Err(ApiError::invalid(
            "response_format.type",
            "'response_format.type' is missing or not a string",
        )),
    }
}

fn parse_model(obj: &Map<String, Value>) -> Result<Option<String>, ApiError> {
    Ok(opt_str(obj, "model")?.map(str::to_string))
}

/// `POST /v1/chat/completions`, with the server's `defaults` for what it leaves out.
pub fn parse_chat(
    obj: &Map<String, Value>,
    defaults: &GenDefaults,
) -> Result<ChatRequest, ApiError> {
    let messages = match obj.get("messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => {
            return Err(ApiError::invalid(
                "messages",
                "'messages' must not be empty",
            ))
        }
        Some(v) if !v.is_null() => return Err(wrong_type("messages", "an array", v)),
        _ => return Err(ApiError::invalid("messages", "'messages' is missing")),
    };
    let messages = messages
        .iter()
        .enumerate()
        .map(|(i, m)| parse_message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    let tools = parse_tools(obj)?;
    let tool_choice = parse_tool_choice(obj, &tools)?;
    let template_kwargs = match field(obj, "chat_template_kwargs") {
        None => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(v) => return Err(wrong_type("chat_template_kwargs", "an object", v)),
    };
    let mut reasoning = None;
    for key in ["enable_thinking", "thinking"] {
        match template_kwargs.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::Bool(b)) => reasoning = Some(*b),
            Some(v) => {
                return Err(wrong_type(
                    &format!("chat_template_kwargs.{key}"),
                    "a boolean",
                    v,
                ))
            }
        }
    }
    if let Some(effort) = opt_str(obj, "reasoning_effort")? {
        match effort {
            "none" => reasoning = Some(false),
            "minimal" | "low" | "medium" | "high" => {
                reasoning.get_or_insert(true);
            }
            other => {
                return Err(ApiError::invalid(
                    "reasoning_effort",
                    format!(
                    "'reasoning_effort' is '{other}'; expected none, minimal, low, medium or high"
                ),
                ))
            }
        }
    }
    let reasoning_in_content = match opt_str(obj, "reasoning_format")? {
        None | Some("auto") | Some("deepseek") | Some("deepseek-legacy") => false,
        Some("none") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "reasoning_format",
                format!("'reasoning_format' is '{other}'; expected none, auto or deepseek"),
            ))
        }
    };
    Ok(ChatRequest {
        model: parse_model(obj)?,
        messages,
        tool_choice,
        tools,
        response_format: parse_response_format(obj)?,
        template_kwargs,
        reasoning,
        reasoning_budget: opt_int(obj, "reasoning_budget", -1, MAX_TOKENS_LIMIT as i64)?,
        reasoning_in_content,
        gen: parse_gen(obj, true, defaults)?,
    })
}

/// `POST /v1/completions`. `n_vocab` bounds token-id prompts; `defaults` as for
/// [`parse_chat`].
pub fn parse_completion(
    obj: &Map<String, Value>,
    n_vocab: usize,
    defaults: &GenDefaults,
) -> Result<CompletionRequest, ApiError> {
    let token_ids = |a: &[Value]| -> Result<Vec<u32>, ApiError> {
        a.iter()
            .enumerate()
            .map(|(i, t)| match t.as_u64() {
                Some(id) if (id as usize) < n_vocab => Ok(id as u32),
                _ => Err(ApiError::invalid(
                    "prompt",
                    format!("'prompt[{i}]' must be a token id below {n_vocab}, got {t}"),
                )),
            })
            .collect()
    };
    let prompt = match obj.get("prompt") {
        Some(Value::String(s)) => PromptInput::Text(s.clone()),
        Some(Value::Array(a)) if a.is_empty() => {
            return Err(ApiError::invalid("prompt", "'prompt' must not be empty"))
        }
        Some(Value::Array(a)) if a.iter().all(Value::is_number) => {
            PromptInput::Tokens(token_ids(a)?)
        }
        Some(Value::Array(a)) if a.len() == 1 => match &a[0] {
            Value::String(s) => PromptInput::Text(s.clone()),
            Value::Array(ids) if !ids.is_empty() => PromptInput::Tokens(token_ids(ids)?),
            v => {
                return Err(wrong_type(
                    "prompt[0]",
                    "a string or an array of token ids",
                    v,
                ))
            }
        },
        Some(Value::Array(_)) => {
            return Err(ApiError::invalid(
                "prompt",
                "'prompt' holds several prompts; this server answers one prompt per request",
            ))
        }
        Some(v) if !v.is_null() => {
            return Err(wrong_type("prompt", "a string or an array of token ids", v))
        }
        _ => return Err(ApiError::invalid("prompt", "'prompt' is missing")),
    };
    Ok(CompletionRequest {
        model: parse_model(obj)?,
        prompt,
        echo: opt_bool(obj, "echo")?.unwrap_or(false),
        gen: parse_gen(obj, false, defaults)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat(v: Value) -> Result<ChatRequest, ApiError> {
        parse_chat(v.as_object().unwrap(), &GenDefaults::default())
    }

    #[test]
    fn minimal_chat_takes_llama_defaults() {
        let r = chat(json!({"messages": [{"role": "user", "content": "hi"}]})).unwrap();
        assert_eq!(r.gen.temperature, 0.8);
        assert_eq!(r.gen.top_k, 40);
        assert_eq!(r.gen.max_tokens, None);
        assert_eq!(r.tool_choice, ToolChoice::Auto);
        assert!(!r.gen.stream);
    }

    #[test]
    fn content_parts_join_and_developer_is_system() {
        let r = chat(json!({"messages": [
            {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "x", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]},
            {"role": "tool", "tool_call_id": "x", "content": "42"}
        ]}))
        .unwrap();
        assert_eq!(r.messages[0]["role"], "system");
        assert_eq!(r.messages[0]["content"], "ab");
        assert!(r.messages[1]["content"].is_null());
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (json!({}), "messages"),
            (json!({"messages": []}), "messages"),
            (
                json!({"messages": [{"role": "wizard", "content": "x"}]}),
                "messages[0].role",
            ),
            (
                json!({"messages": [{"role": "user"}]}),
                "messages[0].content",
            ),
            (
                json!({"messages": [{"role": "user", "content": 5}]}),
                "messages[0].content",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}),
                "temperature",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": -5}),
                "max_tokens",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1e30}),
                "max_tokens",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2.5}),
                "max_tokens",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "n": 3}),
                "n",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "stop": [1]}),
                "stop[0]",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}),
                "tool_choice",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}),
                "tools[0].function",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}),
                "response_format.type",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": 1}}),
                "stream_options.include_usage",
            ),
        ];
        for (body, param) in cases {
            let e = chat(body.clone()).unwrap_err();
            assert_eq!(e.status.as_u16(), 400, "{body}");
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        }
    }

    #[test]
    fn seeds_take_the_whole_u64_range() {
        let r = chat(json!({"messages": [{"role": "user", "content": "x"}], "seed": u64::MAX}))
            .unwrap();
        assert_eq!(r.gen.seed, Some(u64::MAX));
        let r = chat(json!({"messages": [{"role": "user", "content": "x"}], "seed": -1})).unwrap();
        assert_eq!(r.gen.seed, None);
    }

    #[test]
    fn body_errors() {
        assert!(parse_body(b"").unwrap_err().message.contains("empty"));
        assert!(parse_body(b"{")
            .unwrap_err()
            .message
            .contains("not valid JSON"));
        assert!(parse_body(b"[1]").unwrap_err().message.contains("an array"));
        assert!(parse_body(b"{\"a\": \"\xff\"}")
            .unwrap_err()
            .message
            .contains("UTF-8"));
    }

    #[test]
    fn completion_prompts() {
        let p = |v: Value| {
            parse_completion(v.as_object().unwrap(), 100, &GenDefaults::default()).map(|r| r.prompt)
        };
        assert_eq!(
            p(json!({"prompt": "x"})).unwrap(),
            PromptInput::Text("x".into())
        );
        assert_eq!(
            p(json!({"prompt": [1, 2]})).unwrap(),
            PromptInput::Tokens(vec![1, 2])
        );
        assert_eq!(
            p(json!({"prompt": ["y"]})).unwrap(),
            PromptInput::Text("y".into())
        );
        assert!(p(json!({"prompt": [1, 200]})).is_err());
        assert!(p(json!({"prompt": ["a", "b"]})).is_err());
        assert!(p(json!({"prompt": {}})).is_err());
    }
}
