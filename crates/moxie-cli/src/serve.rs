//! `moxie serve`: the OpenAI-compatible server (see the `moxie-server` crate).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::ArgMatches;
use moxie_server::{AppState, Engine, EngineConfig, Prompter, ReasoningMode};

use crate::run::{load_opened_model, load_tokenizer, ModelArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the one chosen is printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Model name for /v1/models and responses (default: the file name without .gguf).
    #[arg(short = 'a', long)]
    alias: Option<String>,
    /// Require `Authorization: Bearer KEY` on the API endpoints (/health and /metrics stay
    /// open).
    #[arg(long = "api-key", value_name = "KEY")]
    api_key: Option<String>,
    /// Slots: requests generated at once, each with its own KV cache of -c tokens (also
    /// `-np`).
    #[arg(long = "parallel", default_value_t = 1)]
    parallel: usize,
    /// Requests that may wait for a slot; past that, 503.
    #[arg(long = "max-queue", default_value_t = 64)]
    max_queue: usize,
    /// Reasoning default for chat requests: on, off (enable_thinking=false to the template),
    /// or auto (the template's default). Requests override it with
    /// chat_template_kwargs.enable_thinking or reasoning_effort.
    #[arg(long, default_value = "auto", value_parser = reasoning_mode)]
    reasoning: ReasoningMode,
    /// Reasoning tokens allowed before `</think>` is inserted: -1 unlimited, 0 reasoning off.
    /// Requests override it with `reasoning_budget`.
    #[arg(long = "reasoning-budget", default_value_t = -1, allow_negative_numbers = true)]
    reasoning_budget: i64,
    /// A Jinja chat template file to use instead of the model's.
    #[arg(long = "chat-template-file", value_name = "PATH")]
    chat_template_file: Option<PathBuf>,
    /// Physical (micro-)batch size for prompt processing (also `-ub`).
    #[arg(long = "ubatch-size", default_value_t = 512)]
    ubatch_size: usize,
    /// Largest request body accepted, in bytes (larger: 413).
    #[arg(long = "max-body-bytes", default_value_t = 16 << 20)]
    max_body_bytes: usize,
}

fn reasoning_mode(s: &str) -> std::result::Result<ReasoningMode, String> {
    match s {
        "on" => Ok(ReasoningMode::On),
        "off" => Ok(ReasoningMode::Off),
        "auto" => Ok(ReasoningMode::Auto),
        _ => Err(format!("expected on, off or auto, not '{s}'")),
    }
}

pub fn main(a: Args, matches: &ArgMatches) -> Result<()> {
    if a.parallel == 0 {
        bail!("--parallel must be at least 1");
    }
    if a.ubatch_size == 0 {
        bail!("-ub must be positive");
    }
    if a.reasoning_budget < -1 {
        bail!("--reasoning-budget takes -1 (unlimited), 0 (off) or a token count");
    }
    let file = crate::open_gguf(&a.model.model)?;
    let n_ctx_train = moxie_core::Config::from_metadata(file.metadata())
        .map(|c| c.n_ctx_train)
        .unwrap_or(4096);
    // Each slot's context; a prompt needs room for one more token.
    let n_ctx = a.model.context_size(n_ctx_train).max(2);
    // The plan counts every slot's cache and recurrent state.
    let model = load_opened_model(
        file,
        &a.model,
        matches,
        Some(n_ctx),
        a.ubatch_size,
        a.parallel,
    )?;
    let tokenizer = Arc::new(load_tokenizer(model.file.metadata())?);
    let template_source = match &a.chat_template_file {
        Some(p) => std::fs::read_to_string(p)
            .with_context(|| format!("reading --chat-template-file {}", p.display()))?,
        None => tokenizer
            .chat_template()
            .unwrap_or(moxie_server::prompt::CHATML_TEMPLATE)
            .to_string(),
    };
    let template = moxie_tokenizer::ChatTemplate::with_tokens_of(&template_source, &tokenizer)
        .context("the chat template")?;
    let prompter = Prompter::new(
        tokenizer.clone(),
        template,
        n_ctx,
        a.reasoning,
        Some(a.reasoning_budget),
    );
    let n_vocab = model.config.n_vocab;
    let par = a.model.parallel();
    let n_threads = par.n_threads();
    let engine = Engine::start(
        model,
        tokenizer,
        par,
        EngineConfig {
            n_slots: a.parallel,
            n_ctx,
            ubatch: a.ubatch_size,
            queue_limit: a.max_queue,
            kv_types: a.model.cache_types.types(),
        },
    )
    .context("starting the engine")?;
    let model_name = a.alias.clone().unwrap_or_else(|| {
        a.model
            .model
            .file_stem()
            .map_or("model".into(), |s| s.to_string_lossy().into_owned())
    });
    eprintln!(
        "serving {model_name}: {} slots x {n_ctx} tokens of context, {n_threads} threads, chat template with {} tool calls, reasoning {:?} (budget {})",
        a.parallel,
        prompter.tool_format.name(),
        a.reasoning,
        a.reasoning_budget
    );
    let state = Arc::new(AppState::new(
        engine,
        prompter,
        model_name,
        a.api_key.clone(),
        a.max_body_bytes,
        n_vocab,
        n_ctx_train,
    ));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((a.host.as_str(), a.port))
            .await
            .with_context(|| format!("listening on {}:{}", a.host, a.port))?;
        let addr = listener.local_addr()?;
        // Tests and scripts wait for this line.
        eprintln!("listening on http://{addr}");
        moxie_server::serve(listener, state).await?;
        eprintln!("server stopped");
        anyhow::Ok(())
    })
}
