//! `moxie run` and `moxie logits`.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::ArgMatches;
use moxie_core::generate::{generate, GenParams};
use moxie_core::model::Placement;
use moxie_core::placement::{plan_for_file, RunShape};
use moxie_core::{Logits, MlaPrompts, Model, Numerics, Parallel, Sampler, SamplerConfig};
use moxie_quant::GgmlType;

use crate::placement_args::PlacementArgs;

#[derive(clap::Args)]
pub struct ModelArgs {
    /// Model GGUF (the first part of a split model).
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    /// Threads (default: all cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Threads for prompt batches (also `-tb`; default: -t), as llama.cpp's
    /// `--threads-batch`.
    #[arg(long = "threads-batch")]
    pub threads_batch: Option<usize>,
    /// NUMA: distribute (threads spread over the nodes, memory interleaved), isolate (the
    /// node the process started on) or numactl (the CPUs numactl gave), as llama.cpp's.
    #[arg(long, value_name = "distribute|isolate|numactl", value_parser = numa_mode)]
    pub numa: Option<moxie_core::numa::NumaMode>,
    /// Context size in tokens (default: 4096, capped at the model's training context).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
    /// Sum every product in llama.cpp's order (bit-identical logits, slower prompt processing)
    /// instead of the fast batched kernels.
    #[arg(long)]
    pub exact: bool,
    /// How MLA models attend over a prompt batch (also `-mla`, ik_llama.cpp's flag): 3
    /// expands each head's keys and values from the cached latents first, as ik_llama.cpp's
    /// `-mla 3` does (faster prompts from a few hundred positions on; ik's rounding, not
    /// llama.cpp's); 1 or 2, the default, attends over the latents as llama.cpp does. Decode
    /// always attends over the latents.
    #[arg(long = "mla-use", value_name = "1|2|3", value_parser = mla_use)]
    pub mla_use: Option<MlaPrompts>,
    /// Read the weights into memory instead of mapping the file: nothing is paged in from
    /// the file later (weights repacked at load are copies either way).
    #[arg(long = "no-mmap")]
    pub no_mmap: bool,
    /// Keep the model (and all of moxie's memory) in RAM: never swapped or dropped from the
    /// page cache. Needs `ulimit -l` above the model's size (if refused: a warning).
    #[arg(long)]
    pub mlock: bool,
    #[command(flatten)]
    pub cache_types: CacheTypeArgs,
    #[command(flatten)]
    pub placement: PlacementArgs,
}

/// `-ctk` / `-ctv`, one value each (`bench` takes lists instead).
#[derive(clap::Args)]
pub struct CacheTypeArgs {
    /// KV cache type for keys (also `-ctk`): f16, f32 or q8_0.
    #[arg(long = "cache-type-k", default_value = "f16", value_parser = kv_type)]
    cache_type_k: GgmlType,
    /// KV cache type for values (also `-ctv`): f16, f32 or q8_0. MLA models keep no value
    /// cache (values are part of the latent keys).
    #[arg(long = "cache-type-v", default_value = "f16", value_parser = kv_type)]
    cache_type_v: GgmlType,
}

impl CacheTypeArgs {
    pub fn types(&self) -> moxie_core::KvTypes {
        moxie_core::KvTypes {
            k: self.cache_type_k,
            v: self.cache_type_v,
        }
    }
}

/// A `--numa` value.
/// `--mla-use`: ik_llama.cpp's MLA modes. 0 (no MLA: a full key and value cache) is refused:
/// moxie always caches the compressed latents.
pub fn mla_use(s: &str) -> std::result::Result<MlaPrompts, String> {
    match s {
        "1" | "2" => Ok(MlaPrompts::Absorbed),
        "3" => Ok(MlaPrompts::Expanded),
        "0" => Err(
            "0 (attention without MLA's compressed cache) is not supported: moxie \
                    always caches MLA's latents; use 1, 2 or 3"
                .into(),
        ),
        _ => Err(format!(
            "'{s}' is not an MLA mode: 1 or 2 (the default: attend over the \
                          latents) or 3 (prompt batches expand keys and values)"
        )),
    }
}

pub fn numa_mode(s: &str) -> std::result::Result<moxie_core::numa::NumaMode, String> {
    moxie_core::numa::NumaMode::parse(s).map_err(|e| e.to_string())
}

/// `--numa`: pin the threads of every pool made from now on and set the memory policy, with
/// a line on stderr saying what was done. Before loading, so that the weights moxie copies
/// follow the policy.
pub(crate) fn apply_numa(mode: Option<moxie_core::numa::NumaMode>) -> Result<()> {
    if let Some(mode) = mode {
        eprintln!("{}", moxie_core::numa::apply(mode)?);
    }
    Ok(())
}

/// A `-ctk` / `-ctv` value.
pub fn kv_type(s: &str) -> std::result::Result<GgmlType, String> {
    moxie_core::state::parse_kv_type(s).map_err(|e| e.to_string())
}

impl ModelArgs {
    /// `--no-mmap` (else the page-in of mapped weights), `--mlock` and the buffer summary,
    /// on a loaded model.
    pub(crate) fn keep_in_memory(&self, model: &mut Model) {
        settle(model, self.no_mmap, self.mlock);
    }

    pub(crate) fn parallel(&self) -> Parallel {
        let par = match (self.threads, self.threads_batch) {
            (None, None) => Parallel::available(),
            (t, tb) => {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                let t = t.unwrap_or(cores);
                Parallel::with_batch_threads(t, tb.unwrap_or(t))
            }
        };
        par.with_numerics(numerics(self.exact))
            .with_mla_prompts(self.mla_use.unwrap_or_default())
    }

    /// The context a generation uses: -c, or 4096, within the model's training context.
    pub(crate) fn context_size(&self, n_ctx_train: usize) -> usize {
        self.ctx_size.unwrap_or(4096).min(n_ctx_train).max(1)
    }

    /// A cache of the requested types for `n_ctx` positions.
    fn cache(&self, model: &Model, n_ctx: usize) -> Result<moxie_core::SeqState> {
        Ok(model.new_state_typed(Some(n_ctx), self.cache_types.types())?)
    }
}

/// The training context `file`'s metadata gives (4096 when it says none): what caps the
/// default context.
pub(crate) fn n_ctx_train(file: &moxie_gguf::GgufFile) -> usize {
    moxie_core::Config::from_metadata(file.metadata())
        .map(|c| c.n_ctx_train)
        .unwrap_or(4096)
}

/// `--exact` as [`Numerics`].
pub fn numerics(exact: bool) -> Numerics {
    if exact {
        Numerics::Exact
    } else {
        Numerics::Fast
    }
}

/// llama.cpp's sampling flags but the seed (`run` and `serve` give it different defaults).
#[derive(clap::Args)]
pub(crate) struct SamplingArgs {
    /// Temperature (0: greedy).
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temp: f32,
    /// Top-k (0: off).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// Top-p (1: off).
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Min-p (0: off).
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Repetition penalty (1: off).
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Tokens the penalties look back over.
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    #[arg(
        long = "presence-penalty",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub presence_penalty: f32,
    #[arg(
        long = "frequency-penalty",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub frequency_penalty: f32,
}

impl SamplingArgs {
    /// These settings with `seed`.
    pub(crate) fn config(&self, seed: u64) -> SamplerConfig {
        SamplerConfig {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed,
        }
    }
}

#[derive(clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt text.
    #[arg(short = 'p', long = "prompt")]
    prompt: String,
    /// Tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    n_predict: usize,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    chat: bool,
    /// With --chat: pass enable_thinking=false to the template (reasoning off).
    #[arg(long)]
    no_think: bool,
    /// Logical batch size for prompt processing.
    #[arg(short = 'b', long = "batch-size", default_value_t = 2048)]
    batch_size: usize,
    /// Physical (micro-)batch size for prompt processing (also `-ub`).
    #[arg(long = "ubatch-size", default_value_t = 512)]
    ubatch_size: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// RNG seed (default: random).
    #[arg(short = 's', long = "seed")]
    seed: Option<u64>,
    /// Do not print the prompt before the generated text.
    #[arg(long)]
    no_display_prompt: bool,
}

/// Plan where every tensor goes (the placement flags, over the CPU and any `--sim` devices),
/// print the plan to stderr, refuse one that does not fit, and load the model that way.
/// `n_ctx`: the context the command will use (`None`: -c or its default), so the plan counts
/// the KV cache it will hold; `ubatch`: its prompt micro-batch.
pub(crate) fn load_model(
    a: &ModelArgs,
    matches: &ArgMatches,
    n_ctx: Option<usize>,
    ubatch: usize,
) -> Result<Model> {
    load_opened_model(crate::open_gguf(&a.model)?, a, matches, n_ctx, ubatch, 1)
}

/// [`load_model`] for a file the command has already opened (to read its context size), for
/// `n_seq` sequences each with a cache of `n_ctx` (the server's slots).
pub(crate) fn load_opened_model(
    file: std::sync::Arc<moxie_gguf::GgufFile>,
    a: &ModelArgs,
    matches: &ArgMatches,
    n_ctx: Option<usize>,
    ubatch: usize,
    n_seq: usize,
) -> Result<Model> {
    apply_numa(a.numa)?;
    let run = RunShape {
        n_ctx: n_ctx.or(a.ctx_size),
        n_batch: ubatch,
        n_ubatch: ubatch,
        kv_types: a.cache_types.types(),
        n_seq,
        n_threads: a.parallel().n_threads_batch(),
    };
    let mut model = plan_and_load(file, &a.model, &a.placement, matches, &run, a.exact)?;
    a.keep_in_memory(&mut model);
    Ok(model)
}

/// What loading does once the weights are in place: `--no-mmap`'s copy of the mapped host
/// weights into memory moxie owns, or else their page-in (as llama.cpp's `MAP_POPULATE`), so
/// the first requests do not fault through the model; `--mlock`; and a summary of the weight
/// buffers per device, as llama.cpp prints them.
pub(crate) fn settle(model: &mut Model, no_mmap: bool, mlock: bool) {
    let bar = crate::progress::LoadBar::default();
    let gib = moxie_core::placement::human_bytes;
    let t0 = std::time::Instant::now();
    if no_mmap {
        let (n, bytes) = model.own_mapped_weights(&bar);
        eprintln!(
            "--no-mmap: read {n} weight tensors ({}) into memory in {:.1} s",
            gib(bytes),
            t0.elapsed().as_secs_f64()
        );
        // Op offload's copies then go straight from these bytes (llama.cpp pins host weights
        // only with --no-mmap too).
        if model.op_offload_min_batch().is_some() {
            match model.pin_streamed_experts() {
                Ok((0, _)) => {}
                Ok((n, bytes)) => eprintln!(
                    "op offload: pinned {n} expert tensors ({}) for the copies to the GPU",
                    gib(bytes)
                ),
                Err(e) => eprintln!(
                    "warning: op offload: pinning the experts failed ({e}); their copies go \
                     through staging buffers"
                ),
            }
        }
    } else {
        let p = model.page_in_mapped_weights(&bar);
        let secs = t0.elapsed().as_secs_f64();
        match p.skipped {
            Some(available) => eprintln!(
                "{} weight tensors ({}) stay mapped and are read on first use: more than the \
                 {} of memory available (--no-mmap reads them in at load)",
                p.tensors,
                gib(p.bytes),
                gib(available)
            ),
            None if p.tensors == 0 => {}
            None if p.populated => eprintln!(
                "paged in {} mapped weight tensors ({}) in {secs:.1} s",
                p.tensors,
                gib(p.bytes)
            ),
            None => eprintln!(
                "asked the kernel to read ahead {} mapped weight tensors ({}): it cannot page \
                 them in at once (Linux before 5.14)",
                p.tensors,
                gib(p.bytes)
            ),
        }
    }
    // As llama.cpp: a lock the system refuses is a warning, not a failure.
    if mlock {
        match moxie_core::lock_memory() {
            Ok(()) => eprintln!("--mlock: the model is locked in RAM"),
            Err(e) => eprintln!(
                "warning: --mlock: locking the model in RAM failed ({e}); it runs \
                 unlocked (raise the limit with `ulimit -l`)"
            ),
        }
    }
    for (buffer, bytes) in model.weight_buffers() {
        eprintln!(
            "{buffer:>12} model buffer size = {:10.2} MiB",
            bytes as f64 / (1u64 << 20) as f64
        );
    }
}

/// Load-time repacking (`on`): the CPU's weight matrices interleaved for the fast one-token
/// kernels (or, off, put back in GGUF order where the file stores them interleaved), with a
/// line on stderr saying what was done.
pub(crate) fn repack(model: &mut Model, on: bool) {
    let t0 = std::time::Instant::now();
    let bar = crate::progress::LoadBar::default();
    let c = model.set_cpu_weight_layout(&Parallel::available(), on, &bar);
    let secs = t0.elapsed().as_secs_f64();
    let gib = moxie_core::placement::human_bytes;
    if c.interleaved > 0 {
        eprintln!(
            "repacked {} weight tensors ({}) into interleaved rows in {secs:.1} s \
             (--no-repack keeps the file's order; `moxie quantize --repack` writes them so once)",
            c.interleaved,
            gib(c.interleaved_bytes),
        );
    }
    if c.as_stored > 0 {
        eprintln!(
            "{} weight tensors ({}) are stored interleaved in the file and used as they are",
            c.as_stored,
            gib(c.as_stored_bytes)
        );
    }
    if c.restored > 0 {
        eprintln!(
            "put {} weight tensors ({}) stored interleaved back in GGUF order in {secs:.1} s{}",
            c.restored,
            gib(c.restored_bytes),
            if on {
                " (routed experts streamed to a GPU)"
            } else {
                " (--no-repack / --exact)"
            }
        );
    }
}

/// The plan for `file` under the placement flags and `run`'s shape, printed to stderr; a plan
/// that does not fit is refused before any weight is read; otherwise the model loaded that way.
pub(crate) fn plan_and_load(
    file: std::sync::Arc<moxie_gguf::GgufFile>,
    path: &std::path::Path,
    placement: &PlacementArgs,
    matches: &ArgMatches,
    run: &RunShape,
    exact: bool,
) -> Result<Model> {
    let plan = plan_for_file(
        &file,
        &placement.options(matches)?,
        &placement.devices()?,
        run,
    )
    .context("planning the placement")?;
    eprint!("{}", plan.report());
    if !plan.unsupported.is_empty() {
        bail!(
            "the placement cannot run: {} (see the plan above; nothing was loaded)",
            plan.unsupported.join("; ")
        );
    }
    if !plan.fits {
        bail!(
            "the placement does not fit: {} (see the plan above)",
            plan.messages.join("; ")
        );
    }
    // The op offload flags are checked before the weights are read.
    let op_offload = match placement.op_offload.as_str() {
        "off" => OpOffload::Off,
        "auto" => OpOffload::Auto,
        n => OpOffload::From(n.parse().ok().filter(|&n| n > 0).with_context(|| {
            format!("--op-offload takes auto, off or a token count, not '{n}'")
        })?),
    };
    let op_offload_buffer = match &placement.op_offload_buffer {
        Some(size) => Some(
            moxie_core::placement::parse_size(size)
                .with_context(|| format!("--op-offload-buffer '{size}'"))?,
        ),
        None => None,
    };
    let devices = Placement::from_plan(&plan)?;
    let bar = crate::progress::LoadBar::default();
    let mut model = Model::load_reporting(file, &devices, Default::default(), &bar)
        .with_context(|| format!("loading {}", path.display()))?;
    repack(&mut model, !exact && !placement.no_repack);
    if let Some(bytes) = op_offload_buffer {
        model.set_op_offload_buffer_limit(Some(bytes));
    }
    match op_offload {
        OpOffload::Off => model.set_op_offload_min_batch(None),
        OpOffload::Auto => {
            let par = Parallel::available();
            if let Some(cal) = model.calibrate_op_offload(&par)? {
                eprintln!("{cal}");
            }
        }
        OpOffload::From(n) => model.set_op_offload_min_batch(Some(n)),
    }
    Ok(model)
}

/// `--op-offload`.
enum OpOffload {
    Off,
    Auto,
    From(usize),
}

/// The tokenizer described by a model's metadata.
pub(crate) fn load_tokenizer(meta: &moxie_gguf::Metadata) -> Result<moxie_tokenizer::Tokenizer> {
    let data = moxie_tokenizer::VocabData::from_gguf(meta)?;
    Ok(moxie_tokenizer::Tokenizer::new(data)?)
}

pub fn run(a: RunArgs, matches: &ArgMatches) -> Result<()> {
    if a.batch_size == 0 || a.ubatch_size == 0 {
        bail!("-b and -ub must be positive");
    }
    let model = load_model(&a.model, matches, None, a.ubatch_size)?;
    let tok = load_tokenizer(model.file.metadata())?;
    let par = a.model.parallel();
    let n_ctx = a.model.context_size(model.config.n_ctx_train);

    let (text, parse_special, add_special) = if a.chat {
        let tpl = moxie_tokenizer::ChatTemplate::from_tokenizer(&tok).context("--chat")?;
        let msgs = vec![serde_json::json!({"role": "user", "content": a.prompt})];
        let mut extra = serde_json::Map::new();
        if a.no_think {
            extra.insert("enable_thinking".into(), serde_json::Value::Bool(false));
        }
        let text = tpl.render(&msgs, true, &extra)?;
        // A rendered template may already start with the BOS text: do not add a second one.
        let add_special = !tpl.starts_with_bos(&text);
        (text, true, add_special)
    } else {
        (a.prompt.clone(), false, true)
    };
    let prompt = tok.encode(&text, add_special, parse_special);
    if prompt.is_empty() {
        bail!("the prompt tokenizes to nothing");
    }
    if prompt.len() >= n_ctx {
        bail!(
            "the prompt has {} tokens; the context holds {n_ctx} (raise -c)",
            prompt.len()
        );
    }
    let mut cache = a.model.cache(&model, n_ctx)?;
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let mut sampler = Sampler::new(a.sampling.config(seed));
    let mut out = std::io::stdout().lock();
    if !a.no_display_prompt {
        write!(out, "{text}")?;
        out.flush()?;
    }
    let mut stream = moxie_tokenizer::Utf8Stream::default();
    let mut write_err = None;
    let params = GenParams {
        n_predict: a.n_predict,
        ubatch: a.ubatch_size.min(a.batch_size),
    };
    let devices_before = model.devices.stats();
    let stats = generate(
        &model,
        &mut cache,
        &par,
        &prompt,
        &params,
        &mut sampler,
        |t| {
            if tok.is_eog(t) {
                return false;
            }
            let s = stream.push(&tok.token_to_piece(t, false));
            if let Err(e) = out.write_all(s.as_bytes()).and_then(|_| out.flush()) {
                write_err = Some(e);
                return false;
            }
            true
        },
    )?;
    let rest = stream.finish();
    let end = writeln!(out, "{rest}");
    // A reader that went away (`moxie run ... | head`) ends generation quietly.
    match write_err.map_or(end, Err) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
        r => r?,
    }
    eprintln!(
        "\nprompt: {} tokens, {:.2} tok/s | generated: {} tokens, {:.2} tok/s | {} threads ({} for the prompt)",
        stats.n_prompt,
        stats.prompt_tps(),
        stats.n_generated,
        stats.gen_tps(),
        par.n_threads(),
        par.n_threads_batch()
    );
    // One-token passes: every generated token but the last was fed back.
    let decode_passes = stats.n_generated.saturating_sub(1) as u64;
    let after = model.devices.stats();
    if let Some(r) =
        moxie_core::bench::expert_reads_per_token(&devices_before, &after, decode_passes)
    {
        eprintln!("routed-expert weights read per generated token: {r}");
    }
    if let Some(c) = model.expert_cache_counts() {
        eprintln!("{}", moxie_core::bench::expert_cache_line(&c));
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct LogitsArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Comma-separated token ids.
    #[arg(long, value_delimiter = ',', required = true)]
    tokens: Vec<u32>,
    /// Output .npy (float32, shape [n_tokens, n_vocab]).
    #[arg(long)]
    out: PathBuf,
    /// Tokens per forward call (also `-ub`), as llama.cpp's micro-batch: 1 evaluates token by
    /// token through the decode kernels (default: all tokens in one batch).
    #[arg(long = "ubatch-size", value_parser = clap::value_parser!(u64).range(1..))]
    ubatch: Option<u64>,
}

pub fn logits(a: LogitsArgs, matches: &ArgMatches) -> Result<()> {
    let n = a.tokens.len();
    let n_ctx = n.max(a.model.ctx_size.unwrap_or(0));
    let model = load_model(&a.model, matches, Some(n_ctx), n)?;
    let par = a.model.parallel();
    let mut cache = a.model.cache(&model, n_ctx)?;
    let ub = a.ubatch.map_or(n, |u| u as usize).max(1);
    let mut logits = Vec::with_capacity(n * model.config.n_vocab);
    for batch in a.tokens.chunks(ub) {
        logits.extend(model.forward(batch, &mut cache, &par, Logits::All)?);
    }
    moxie_core::npy::write_f32(&a.out, &[n, model.config.n_vocab], &logits)?;
    eprintln!(
        "wrote {} x {} logits to {}",
        n,
        model.config.n_vocab,
        a.out.display()
    );
    Ok(())
}
