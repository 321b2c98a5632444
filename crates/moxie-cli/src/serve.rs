//! `moxie serve`: the OpenAI-compatible server (see the `moxie-server` crate).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::ArgMatches;
use moxie_server::{AppState, Engine, EngineConfig, GenDefaults, Prompter, ReasoningMode};

use crate::run::{load_opened_model, load_tokenizer, ModelArgs, SamplingArgs};

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
    /// Slots: requests generated at once (also `-np`). As in llama-server, the -c tokens of
    /// context are split between them.
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
    /// Logical batch size: prompt batches are at most this many tokens (-ub is capped to it,
    /// as in llama-server).
    #[arg(short = 'b', long = "batch-size", default_value_t = 2048)]
    batch_size: usize,
    /// Tokens a request generates at most when it does not say (`max_tokens`); -1: until the
    /// context is full.
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    n_predict: i64,
    #[command(flatten)]
    sampling: SamplingDefaults,
    /// Read and write timeout, seconds (also `-to`, as llama-server): a request's head, and
    /// its whole body, must arrive within it (an unfinished head: the connection is closed; a
    /// body: 408), and a client that reads nothing of its answer for that long is
    /// disconnected (its request stops, freeing the slot).
    #[arg(long = "timeout", value_name = "SECS", default_value_t = moxie_server::DEFAULT_TIMEOUT.as_secs())]
    timeout: u64,
    /// Largest request body accepted, in bytes (larger: 413).
    #[arg(long = "max-body-bytes", default_value_t = 16 << 20)]
    max_body_bytes: usize,
    /// Keep the routing profile (per MoE layer and expert: selections and routing weight, for
    /// prompts and for generated tokens) in this JSON file: rewritten atomically every
    /// --profile-interval seconds and at shutdown, added to what the file already holds (a
    /// profile of another model is refused).
    #[arg(long = "profile-out", value_name = "FILE")]
    profile_out: Option<std::path::PathBuf>,
    /// Seconds between --profile-out writes.
    #[arg(long = "profile-interval", value_name = "SECS", default_value_t = 60)]
    profile_interval: u64,
}

/// llama-server's sampling flags: the defaults of requests that do not set them.
#[derive(clap::Args)]
struct SamplingDefaults {
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Seed (-1: a fresh random seed per request).
    #[arg(short = 's', long = "seed", default_value_t = -1, allow_negative_numbers = true)]
    seed: i64,
}

impl SamplingDefaults {
    /// The request defaults, with `max_tokens` (-n; -1: none).
    fn defaults(&self, n_predict: i64) -> Result<GenDefaults> {
        let s = &self.sampling;
        let checks = [
            (s.temp >= 0.0 && s.temp <= 100.0, "--temp takes 0 to 100"),
            ((0.0..=1.0).contains(&s.top_p), "--top-p takes 0 to 1"),
            ((0.0..=1.0).contains(&s.min_p), "--min-p takes 0 to 1"),
            (
                (0.0..=10.0).contains(&s.repeat_penalty),
                "--repeat-penalty takes 0 to 10",
            ),
            (
                (-2.0..=2.0).contains(&s.presence_penalty),
                "--presence-penalty takes -2 to 2",
            ),
            (
                (-2.0..=2.0).contains(&s.frequency_penalty),
                "--frequency-penalty takes -2 to 2",
            ),
            (self.seed >= -1, "--seed takes -1 (random) or a seed"),
            (
                n_predict >= -1,
                "-n takes -1 (until the context is full) or a count",
            ),
        ];
        if let Some((_, what)) = checks.iter().find(|(ok, _)| !ok) {
            bail!("{what}");
        }
        Ok(GenDefaults {
            // Requests take their seed from `seed` below, not from the sampler settings.
            sampler: s.config(0),
            seed: u64::try_from(self.seed).ok(),
            max_tokens: usize::try_from(n_predict).ok(),
        })
    }
}

/// `--timeout`'s largest value: a year.
const MAX_TIMEOUT_SECS: u64 = 365 * 24 * 3600;

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
    if a.ubatch_size == 0 || a.batch_size == 0 {
        bail!("-b and -ub must be positive");
    }
    // A year at most: the deadlines are instants, and one past the clock's range would panic.
    if !(1..=MAX_TIMEOUT_SECS).contains(&a.timeout) {
        bail!(
            "--timeout takes 1 to {MAX_TIMEOUT_SECS} seconds, not {}",
            a.timeout
        );
    }
    let ubatch = a.ubatch_size.min(a.batch_size);
    let defaults = a.sampling.defaults(a.n_predict)?;
    if a.reasoning_budget < -1 {
        bail!("--reasoning-budget takes -1 (unlimited), 0 (off) or a token count");
    }
    let file = crate::open_gguf(&a.model.model)?;
    let n_ctx_train = crate::run::n_ctx_train(&file);
    // As llama-server does, -c is the context of all slots together; a prompt needs room
    // for one more token.
    let n_ctx_total = a.model.context_size(n_ctx_train);
    let n_ctx = n_ctx_total / a.parallel;
    if n_ctx < 2 {
        bail!(
            "-c {n_ctx_total} split across --parallel {} slots leaves {n_ctx} tokens each (raise -c)",
            a.parallel
        );
    }
    // The plan counts every slot's cache and recurrent state.
    let model = load_opened_model(file, &a.model, matches, Some(n_ctx), ubatch, a.parallel)?;
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
    let (n_threads, n_threads_batch) = (par.n_threads(), par.n_threads_batch());
    let engine = Engine::start(
        model,
        tokenizer,
        par,
        EngineConfig {
            n_slots: a.parallel,
            n_ctx,
            ubatch,
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
        "serving {model_name}: {} slots x {n_ctx} tokens of context, {n_threads} threads ({n_threads_batch} for prompt batches), chat template with {} tool calls, reasoning {:?} (budget {})",
        a.parallel,
        prompter.tool_format.name(),
        a.reasoning,
        a.reasoning_budget
    );
    let mut app = AppState::new(
        engine,
        prompter,
        model_name,
        a.api_key.clone(),
        a.max_body_bytes,
        n_vocab,
        n_ctx_train,
    )
    .with_defaults(defaults)
    .with_timeout(std::time::Duration::from_secs(a.timeout));
    if let Some(path) = &a.profile_out {
        if a.profile_interval == 0 {
            bail!("--profile-interval must be at least 1 second");
        }
        let every = std::time::Duration::from_secs(a.profile_interval);
        let what = || format!("--profile-out {}", path.display());
        let out = moxie_server::ProfileOut::open(path.clone(), every).with_context(what)?;
        // Refuse another model's profile now, not at the first write.
        out.write(&app.engine.routing).with_context(what)?;
        eprintln!(
            "routing profile: {} (every {} s and at shutdown)",
            path.display(),
            a.profile_interval
        );
        app = app.with_profile_out(out);
    }
    let state = Arc::new(app);
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
