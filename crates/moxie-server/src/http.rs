//! The HTTP side: routes, authentication, body limits, and the OpenAI response shapes
//! (whole responses and SSE chunks).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::engine::{Done, Engine, Event};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::prompt::Prompter;
use crate::request::{parse_body, parse_chat, parse_completion, GenDefaults};

/// What the handlers share.
pub struct AppState {
    pub engine: Arc<Engine>,
    pub prompter: Prompter,
    /// The name `/v1/models` lists and responses carry (`--alias`, else the file's name).
    pub model_name: String,
    pub api_key: Option<String>,
    /// Request bodies larger than this get 413.
    pub max_body_bytes: usize,
    /// `--timeout`: a body not whole within it gets 408.
    pub timeout: std::time::Duration,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    /// What requests get for the settings they leave out.
    pub defaults: GenDefaults,
    pub created: u64,
    /// Where `--profile-out` keeps the routing profile, if anywhere.
    pub profile: Option<ProfileOut>,
    next_id: AtomicU64,
}

/// `moxie serve --profile-out FILE`: the routing counters written to `path` (atomically) every
/// `every` and at shutdown, added to what the file held when the server started, so the
/// profile accumulates across restarts.
pub struct ProfileOut {
    pub path: std::path::PathBuf,
    pub every: std::time::Duration,
    base: Option<moxie_core::telemetry::RoutingProfile>,
}

impl ProfileOut {
    /// Read what `path` already holds (a profile of another model is an error naming it).
    pub fn open(
        path: std::path::PathBuf,
        every: std::time::Duration,
    ) -> moxie_core::Result<ProfileOut> {
        let base = moxie_core::telemetry::RoutingProfile::read(&path)?;
        Ok(ProfileOut { path, every, base })
    }

    /// Write the file now: the starting profile plus the counters of `stats`.
    pub fn write(&self, stats: &moxie_core::telemetry::RoutingStats) -> moxie_core::Result<()> {
        let mut p = stats.snapshot();
        if let Some(base) = &self.base {
            let mut total = base.clone();
            total.merge(&p)?;
            p = total;
        }
        p.write_atomic(&self.path)
    }
}

impl AppState {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        engine: Arc<Engine>,
        prompter: Prompter,
        model_name: String,
        api_key: Option<String>,
        max_body_bytes: usize,
        n_vocab: usize,
        n_ctx_train: usize,
    ) -> AppState {
        AppState {
            engine,
            prompter,
            model_name,
            api_key,
            max_body_bytes,
            timeout: crate::DEFAULT_TIMEOUT,
            n_vocab,
            n_ctx_train,
            defaults: GenDefaults::default(),
            created: unix_now(),
            profile: None,
            next_id: AtomicU64::new(1),
        }
    }

    /// With `defaults` for what requests leave out (the server's sampling flags).
    pub fn with_defaults(mut self, defaults: GenDefaults) -> AppState {
        self.defaults = defaults;
        self
    }

    /// With this read and write limit (`--timeout`).
    pub fn with_timeout(mut self, timeout: std::time::Duration) -> AppState {
        self.timeout = timeout;
        self
    }

    /// Keep the routing profile in a file (`--profile-out`).
    pub fn with_profile_out(mut self, profile: ProfileOut) -> AppState {
        self.profile = Some(profile);
        self
    }

    /// A fresh id with `prefix` (`chatcmpl-`, `cmpl-`, `call_`).
    fn id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Relaxed);
        format!("{prefix}{:x}{n:06x}", self.created)
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The router with every endpoint (also under llama-server's paths without `/v1`).
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .route("/metrics", get(metrics))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(format!("no endpoint at '{}'", uri.path()))
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        message: format!("'{}' does not take {method}", uri.path()),
        kind: "invalid_request_error",
        param: None,
        code: None,
    }
}

async fn health(State(s): State<Arc<AppState>>) -> Json<Value> {
    let m = &s.engine.metrics;
    Json(json!({
        "status": "ok",
        "slots_idle": m.n_slots.load(Relaxed).saturating_sub(m.requests_processing.load(Relaxed)),
        "slots_processing": m.requests_processing.load(Relaxed),
        "requests_queued": m.requests_queued.load(Relaxed),
    }))
}

async fn metrics(State(s): State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.engine.metrics.render() + &crate::metrics::render_routing(&s.engine.routing.snapshot()),
    )
        .into_response()
}

async fn models(State(s): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = check_auth(&s, &headers) {
        return e.into_response();
    }
    Json(json!({
        "object": "list",
        "data": [{
            "id": s.model_name,
            "object": "model",
            "created": s.created,
            "owned_by": "moxie",
            "meta": {
                "n_ctx_train": s.n_ctx_train,
                "n_ctx_slot": s.prompter.n_ctx,
                "n_vocab": s.n_vocab,
                "slots": s.engine.config.n_slots,
            }
        }]
    }))
    .into_response()
}

/// llama-server's `POST /tokenize`: `{"content", "add_special" (false), "parse_special"
/// (true)}` → `{"tokens": [...]}`.
async fn tokenize(State(s): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let r = async {
        let obj = json_body(&s, &headers, body).await?;
        let content = match obj.get("content") {
            Some(Value::String(c)) => c,
            _ => return Err(ApiError::invalid("content", "'content' must be a string")),
        };
        let flag = |k: &str, default: bool| match obj.get(k) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(ApiError::invalid(k, format!("'{k}' must be a boolean"))),
        };
        let ids = s.prompter.tokenizer.encode(
            content,
            flag("add_special", false)?,
            flag("parse_special", true)?,
        );
        Ok(Json(json!({"tokens": ids})).into_response())
    }
    .await;
    answer(&s, r)
}

/// llama-server's `POST /detokenize`: `{"tokens": [...]}` → `{"content"}`.
async fn detokenize(State(s): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let r = async {
        let obj = json_body(&s, &headers, body).await?;
        let ids: Vec<u32> = match obj.get("tokens") {
            Some(Value::Array(a)) => a
                .iter()
                .map(|t| {
                    t.as_u64()
                        .filter(|&id| (id as usize) < s.n_vocab)
                        .map(|id| id as u32)
                        .ok_or_else(|| {
                            ApiError::invalid(
                                "tokens",
                                format!(
                                    "'tokens' must hold token ids below {}, not {t}",
                                    s.n_vocab
                                ),
                            )
                        })
                })
                .collect::<Result<_, _>>()?,
            _ => {
                return Err(ApiError::invalid(
                    "tokens",
                    "'tokens' must be an array of token ids",
                ))
            }
        };
        let text = s.prompter.tokenizer.detokenize(&ids, false, false);
        Ok(Json(json!({"content": String::from_utf8_lossy(&text)})).into_response())
    }
    .await;
    answer(&s, r)
}

fn check_auth(s: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &s.api_key else {
        return Ok(());
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    if given.is_some_and(|g| same_secret(g.as_bytes(), key.as_bytes())) {
        Ok(())
    } else {
        Err(ApiError::unauthorized())
    }
}

/// `given == key` in a time that depends on `given`'s length alone, not on where the two first
/// differ nor on the key's length: a client timing its refusals learns nothing about the key.
fn same_secret(given: &[u8], key: &[u8]) -> bool {
    if key.is_empty() {
        return given.is_empty();
    }
    let mut diff = u8::from(given.len() != key.len());
    for (i, &g) in given.iter().enumerate() {
        diff |= g ^ key[i % key.len()];
    }
    std::hint::black_box(diff) == 0
}

/// The body, at most `limit` bytes (413 past it), whole within `deadline` (408 past it: a
/// client trickling its body would otherwise hold the connection as long as it liked).
async fn read_body(
    body: Body,
    headers: &HeaderMap,
    limit: usize,
    deadline: std::time::Duration,
) -> Result<Vec<u8>, ApiError> {
    let too_big = || ApiError {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        message: format!("the request body is larger than {limit} bytes"),
        kind: "invalid_request_error",
        param: None,
        code: Some("request_too_large"),
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_big());
    }
    let Ok(read) = tokio::time::timeout(deadline, axum::body::to_bytes(body, limit)).await else {
        return Err(ApiError::request_timeout(format!(
            "the request body did not arrive within {} s (--timeout)",
            deadline.as_secs_f64()
        )));
    };
    match read {
        Ok(b) => Ok(b.to_vec()),
        Err(e) => {
            let mut text = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                text.push_str(&s.to_string());
                src = s.source();
            }
            if text.contains("length limit") {
                Err(too_big())
            } else {
                Err(ApiError::bad_request(format!(
                    "could not read the request body: {text}"
                )))
            }
        }
    }
}

/// An API request's body as a JSON object, after the key check and the size limit.
async fn json_body(
    s: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<serde_json::Map<String, Value>, ApiError> {
    check_auth(s, headers)?;
    parse_body(&read_body(body, headers, s.max_body_bytes, s.timeout).await?)
}

/// Count the answer in the metrics and turn it into a response.
fn answer(s: &AppState, r: Result<Response, ApiError>) -> Response {
    match r {
        Ok(resp) => resp,
        Err(e) => {
            if e.status.is_client_error() {
                Metrics::add(&s.engine.metrics.requests_invalid_total, 1);
            }
            e.into_response()
        }
    }
}

async fn chat_completions(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    Metrics::add(&s.engine.metrics.requests_total, 1);
    let r = chat_inner(&s, &headers, body).await;
    answer(&s, r)
}

async fn chat_inner(
    s: &Arc<AppState>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let req = parse_chat(&json_body(s, headers, body).await?, &s.defaults)?;
    let (tx, rx) = unbounded_channel();
    s.engine.submit(s.prompter.chat(&req, tx)?)?;
    let ctx = ResponseCtx {
        id: s.id("chatcmpl-"),
        created: unix_now(),
        model: req.model.clone().unwrap_or_else(|| s.model_name.clone()),
        call_prefix: s.id("call_"),
        kimi_ids: s.prompter.tool_format == crate::tool_calls::ToolFormat::KimiK2,
    };
    if req.gen.stream {
        Ok(chat_stream(ctx, rx, req.gen.include_usage))
    } else {
        let done = wait_done(rx).await?;
        Ok(Json(chat_response(&ctx, &done)).into_response())
    }
}

async fn completions(State(s): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    Metrics::add(&s.engine.metrics.requests_total, 1);
    let r = completions_inner(&s, &headers, body).await;
    answer(&s, r)
}

async fn completions_inner(
    s: &Arc<AppState>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let req = parse_completion(&json_body(s, headers, body).await?, s.n_vocab, &s.defaults)?;
    let (tx, rx) = unbounded_channel();
    s.engine.submit(s.prompter.completion(&req, tx)?)?;
    let ctx = ResponseCtx {
        id: s.id("cmpl-"),
        created: unix_now(),
        model: req.model.clone().unwrap_or_else(|| s.model_name.clone()),
        call_prefix: String::new(),
        kimi_ids: false,
    };
    let echo = if req.echo {
        match &req.prompt {
            crate::request::PromptInput::Text(t) => t.clone(),
            crate::request::PromptInput::Tokens(ids) => {
                String::from_utf8_lossy(&s.prompter.tokenizer.decode(ids, false)).into_owned()
            }
        }
    } else {
        String::new()
    };
    if req.gen.stream {
        Ok(completion_stream(ctx, rx, req.gen.include_usage, echo))
    } else {
        let done = wait_done(rx).await?;
        let text = format!("{echo}{}", done.output.content);
        Ok(Json(json!({
            "id": ctx.id,
            "object": "text_completion",
            "created": ctx.created,
            "model": ctx.model,
            "system_fingerprint": FINGERPRINT,
            "choices": [{
                "text": text,
                "index": 0,
                "logprobs": null,
                "finish_reason": done.finish_reason,
            }],
            "usage": usage_json(&done),
            "timings": done.timings.to_json(),
        }))
        .into_response())
    }
}

const FINGERPRINT: &str = concat!("moxie-", env!("CARGO_PKG_VERSION"));

/// Per-response constants.
struct ResponseCtx {
    id: String,
    created: u64,
    model: String,
    /// Tool-call ids are this plus the call's index.
    call_prefix: String,
    /// Kimi K2's template writes call ids into the prompt as `functions.NAME:INDEX`, the form
    /// the model itself uses.
    kimi_ids: bool,
}

/// The engine's answer to a non-streamed request.
async fn wait_done(mut rx: UnboundedReceiver<Event>) -> Result<Box<Done>, ApiError> {
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Done(d) => return Ok(d),
            Event::Error(e) => return Err(e),
            Event::Started | Event::Delta(_) => {}
        }
    }
    Err(ApiError::internal("the engine stopped before answering"))
}

fn usage_json(done: &Done) -> Value {
    let u = done.usage;
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

fn tool_calls_json(ctx: &ResponseCtx, done: &Done, with_index: bool) -> Vec<Value> {
    done.output
        .tool_calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut v = json!({
                "id": if ctx.kimi_ids {
                    format!("functions.{}:{i}", c.name)
                } else {
                    format!("{}{i}", ctx.call_prefix)
                },
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            });
            if with_index {
                v["index"] = json!(i);
            }
            v
        })
        .collect()
}

fn chat_response(ctx: &ResponseCtx, done: &Done) -> Value {
    let out = &done.output;
    let mut message = json!({"role": "assistant"});
    message["content"] = if out.content.is_empty() && !out.tool_calls.is_empty() {
        Value::Null
    } else {
        Value::String(out.content.clone())
    };
    if !out.reasoning.is_empty() {
        message["reasoning_content"] = Value::String(out.reasoning.clone());
    }
    if !out.tool_calls.is_empty() {
        message["tool_calls"] = Value::Array(tool_calls_json(ctx, done, false));
    }
    json!({
        "id": ctx.id,
        "object": "chat.completion",
        "created": ctx.created,
        "model": ctx.model,
        "system_fingerprint": FINGERPRINT,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": done.finish_reason,
        }],
        "usage": usage_json(done),
        "timings": done.timings.to_json(),
    })
}

fn chat_chunk(ctx: &ResponseCtx, delta: Value, finish: Option<&str>) -> Value {
    json!({
        "id": ctx.id,
        "object": "chat.completion.chunk",
        "created": ctx.created,
        "model": ctx.model,
        "system_fingerprint": FINGERPRINT,
        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
    })
}

fn sse(v: &Value) -> SseEvent {
    SseEvent::default().data(v.to_string())
}

/// Turns engine events into SSE events; `on_event` maps one event to data chunks and says
/// whether the stream is over.
fn event_stream(
    rx: UnboundedReceiver<Event>,
    mut on_event: impl FnMut(Event) -> (Vec<Value>, bool) + Send + 'static,
) -> Response {
    use futures_util::StreamExt;
    // The engine drops a request's sender after its Done or Error, which ends the stream.
    let stream =
        futures_util::stream::unfold(
            rx,
            |mut rx| async move { rx.recv().await.map(|ev| (ev, rx)) },
        )
        .flat_map(move |ev| {
            let (chunks, end) = on_event(ev);
            let mut out: Vec<Result<SseEvent, std::convert::Infallible>> =
                chunks.iter().map(|c| Ok(sse(c))).collect();
            if end {
                out.push(Ok(SseEvent::default().data("[DONE]")));
            }
            futures_util::stream::iter(out)
        });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

fn chat_stream(ctx: ResponseCtx, rx: UnboundedReceiver<Event>, include_usage: bool) -> Response {
    let mut sent_role = false;
    event_stream(rx, move |ev| {
        let mut chunks = Vec::new();
        let mut role = |chunks: &mut Vec<Value>| {
            if !sent_role {
                sent_role = true;
                chunks.push(chat_chunk(
                    &ctx,
                    json!({"role": "assistant", "content": null}),
                    None,
                ));
            }
        };
        match ev {
            Event::Started => {
                role(&mut chunks);
                (chunks, false)
            }
            Event::Delta(d) => {
                role(&mut chunks);
                if !d.reasoning.is_empty() {
                    chunks.push(chat_chunk(
                        &ctx,
                        json!({"reasoning_content": d.reasoning}),
                        None,
                    ));
                }
                if !d.content.is_empty() {
                    chunks.push(chat_chunk(&ctx, json!({"content": d.content}), None));
                }
                (chunks, false)
            }
            Event::Done(done) => {
                role(&mut chunks);
                let last = &done.output.last;
                if !last.reasoning.is_empty() {
                    chunks.push(chat_chunk(
                        &ctx,
                        json!({"reasoning_content": last.reasoning}),
                        None,
                    ));
                }
                if !last.content.is_empty() {
                    chunks.push(chat_chunk(&ctx, json!({"content": last.content}), None));
                }
                if !done.output.tool_calls.is_empty() {
                    chunks.push(chat_chunk(
                        &ctx,
                        json!({"tool_calls": tool_calls_json(&ctx, &done, true)}),
                        None,
                    ));
                }
                let mut fin = chat_chunk(&ctx, json!({}), Some(done.finish_reason));
                fin["timings"] = done.timings.to_json();
                chunks.push(fin);
                if include_usage {
                    let mut u = chat_chunk(&ctx, json!({}), None);
                    u["choices"] = json!([]);
                    u["usage"] = usage_json(&done);
                    chunks.push(u);
                }
                (chunks, true)
            }
            Event::Error(e) => (vec![e.body()], true),
        }
    })
}

fn completion_stream(
    ctx: ResponseCtx,
    rx: UnboundedReceiver<Event>,
    include_usage: bool,
    echo: String,
) -> Response {
    let mut echo = Some(echo).filter(|e| !e.is_empty());
    event_stream(rx, move |ev| {
        let chunk = |text: &str, finish: Option<&str>| {
            json!({
                "id": ctx.id,
                "object": "text_completion",
                "created": ctx.created,
                "model": ctx.model,
                "system_fingerprint": FINGERPRINT,
                "choices": [{"text": text, "index": 0, "logprobs": null, "finish_reason": finish}],
            })
        };
        let mut chunks = Vec::new();
        if let Some(e) = echo.take() {
            chunks.push(chunk(&e, None));
        }
        match ev {
            Event::Started => (chunks, false),
            Event::Delta(d) => {
                chunks.push(chunk(&d.content, None));
                (chunks, false)
            }
            Event::Done(done) => {
                if !done.output.last.content.is_empty() {
                    chunks.push(chunk(&done.output.last.content, None));
                }
                let mut fin = chunk("", Some(done.finish_reason));
                fin["timings"] = done.timings.to_json();
                chunks.push(fin);
                if include_usage {
                    let mut u = chunk("", None);
                    u["choices"] = json!([]);
                    u["usage"] = usage_json(&done);
                    chunks.push(u);
                }
                (chunks, true)
            }
            Event::Error(e) => (vec![e.body()], true),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::same_secret;

    #[test]
    fn api_keys_compare_equal_only_when_equal() {
        let key = b"sk-0123456789";
        assert!(same_secret(key, key));
        for other in [
            &b"sk-0123456788"[..],
            b"xk-0123456789",
            b"sk-012345678",
            b"sk-01234567890",
            b"sk-0123456789sk-0123456789",
            b"",
            b"s",
        ] {
            assert!(
                !same_secret(other, key),
                "{:?}",
                String::from_utf8_lossy(other)
            );
        }
        assert!(same_secret(b"", b""));
        assert!(!same_secret(b"a", b""));
    }
}
