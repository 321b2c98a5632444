//! `moxie sweep-bench`: ik_llama.cpp's `llama-sweep-bench` for moxie. One token sequence fills
//! the context a micro-batch at a time; at each depth `N_KV` (0, ub, 2·ub, ...) it measures
//!
//! 1. token generation: `TG` one-token decodes after the `N_KV` cached tokens (default
//!    `TG = ub/4`, `-n` sets it), which are then dropped from the cache again;
//! 2. prompt processing: `PP = ub` tokens in one batch after the `N_KV` cached tokens, which
//!    stay, so the next step starts at `N_KV + PP`,
//!
//! until the next step would not fit in the context (`-c`, default: the model's training
//! context). Tokens are pseudo-random ids from a fixed seed; the printed table has
//! sweep-bench's columns and number formats, and `-o jsonl` its JSON keys.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use moxie_core::synth::rng::Xoshiro256;
use moxie_core::{Logits, Model, Parallel, SeqState};
use serde_json::json;

#[derive(clap::Args)]
pub struct Args {
    /// Model GGUF (the first part of a split model).
    #[arg(short = 'm', long = "model")]
    model: PathBuf,
    /// Context to sweep, in tokens; 0 = the model's training context.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 0)]
    ctx_size: usize,
    /// Logical batch size: a prompt batch is evaluated in pieces of min(-b, -ub) tokens.
    #[arg(short = 'b', long = "batch-size", default_value_t = 2048)]
    batch_size: usize,
    /// Micro-batch size (`-ub`): the prompt tokens per step (PP) and the step between depths.
    #[arg(long = "ubatch-size", default_value_t = 512)]
    ubatch_size: usize,
    /// Tokens generated per step (TG); 0 or absent = ub/4 (at least 1).
    #[arg(short = 'n', long = "n-predict", visible_alias = "predict")]
    n_predict: Option<usize>,
    /// Threads (default: all cores).
    #[arg(short = 't', long = "threads")]
    threads: Option<usize>,
    /// Output format: md (sweep-bench's table), json or jsonl.
    #[arg(
        short = 'o',
        long = "output",
        visible_alias = "output-format",
        default_value = "md"
    )]
    output: String,
    /// Skip the warm-up (one token, then the cache is cleared).
    #[arg(long)]
    no_warmup: bool,
    /// llama.cpp's summation order everywhere (bit-identical logits, slower prompt processing).
    #[arg(long)]
    exact: bool,
    /// Keep the routed experts in the file's row order (no load-time repacking).
    #[arg(long = "no-repack")]
    no_repack: bool,
    /// Warm up with a full micro-batch as well (`-wb`), so the first row does not pay for
    /// first-touch page faults of the mapped weights.
    #[arg(long = "warmup-batch")]
    warmup_batch: bool,
    #[command(flatten)]
    cache_types: crate::run::CacheTypeArgs,
}

/// Seed of the token stream (fixed, so runs are comparable).
const TOKEN_SEED: u64 = 1234;

/// Run settings, resolved from the flags and the model.
#[derive(Clone, Copy, Debug)]
struct Setup {
    n_kv_max: usize,
    n_batch: usize,
    n_ubatch: usize,
    pp: usize,
    tg: usize,
    n_threads: usize,
}

/// One step of the sweep.
#[derive(Clone, Copy, Debug)]
struct Row {
    n_kv: usize,
    t_pp: f64,
    t_tg: f64,
}

impl Setup {
    /// Checks the flags that do not depend on the model (before loading it).
    fn check_flags(a: &Args) -> Result<()> {
        if !["md", "json", "jsonl"].contains(&a.output.as_str()) {
            bail!("-o must be md, json or jsonl, not '{}'", a.output);
        }
        if a.ubatch_size == 0 {
            bail!("-ub must be at least 1 (it is the number of prompt tokens per step)");
        }
        if a.batch_size == 0 {
            bail!("-b must be at least 1");
        }
        if a.threads == Some(0) {
            bail!("-t must be at least 1");
        }
        if a.ctx_size > 0 {
            // An explicit -c can be checked against -ub / -n without the model.
            Setup::resolve(a, a.ctx_size, 1)?;
        }
        Ok(())
    }

    fn resolve(a: &Args, n_ctx_train: usize, n_threads: usize) -> Result<Setup> {
        let n_kv_max = if a.ctx_size == 0 {
            n_ctx_train
        } else {
            a.ctx_size
        };
        let pp = a.ubatch_size;
        let tg = match a.n_predict {
            Some(n) if n > 0 => n,
            _ => (pp / 4).max(1),
        };
        if n_kv_max < pp.max(tg) {
            bail!(
                "-c {n_kv_max} is smaller than one step: each step needs room for -ub {pp} prompt \
                 tokens and {tg} generated tokens (raise -c or lower -ub / -n)"
            );
        }
        Ok(Setup {
            n_kv_max,
            n_batch: a.batch_size,
            n_ubatch: a.ubatch_size,
            pp,
            tg,
            n_threads,
        })
    }

    /// Depths `N_KV` of the steps: multiples of PP whose step fits in the context.
    fn depths(&self) -> impl Iterator<Item = usize> {
        let step = self.pp.max(self.tg);
        let n_kv_max = self.n_kv_max;
        (0..n_kv_max)
            .step_by(self.pp)
            .take_while(move |n_kv| n_kv + step <= n_kv_max)
    }
}

/// Fixed-seed pseudo-random token ids.
struct Tokens {
    rng: Xoshiro256,
    n_vocab: u64,
}

impl Tokens {
    fn next(&mut self) -> u32 {
        (self.rng.next_u64() % self.n_vocab) as u32
    }
}

/// One sweep step at depth `n_kv` (the cache holds at least `n_kv` tokens): TG decodes, which
/// are dropped again, then PP prompt tokens, which stay. Returns the two times in seconds.
fn step(
    model: &Model,
    cache: &mut SeqState,
    par: &Parallel,
    s: &Setup,
    n_kv: usize,
    tokens: &mut Tokens,
) -> Result<Row> {
    cache.truncate(n_kv)?;
    // Recurrent layers can only come back to n_kv from a checkpoint there.
    cache.checkpoint()?;
    let t0 = Instant::now();
    for _ in 0..s.tg {
        model.forward(&[tokens.next()], cache, par, Logits::Last)?;
    }
    let t_tg = t0.elapsed().as_secs_f64();
    let kept = cache.truncate(n_kv)?;
    debug_assert_eq!(kept, n_kv);

    let batch: Vec<u32> = (0..s.pp).map(|_| tokens.next()).collect();
    let t0 = Instant::now();
    model.prefill(&batch, cache, par, s.n_ubatch.min(s.n_batch))?;
    let t_pp = t0.elapsed().as_secs_f64();
    debug_assert_eq!(cache.len(), n_kv + s.pp);
    Ok(Row { n_kv, t_pp, t_tg })
}

pub fn main(a: Args) -> Result<()> {
    Setup::check_flags(&a)?;
    let par = a
        .threads
        .map_or_else(Parallel::available, Parallel::new)
        .with_numerics(crate::run::numerics(a.exact));
    let file = crate::open_gguf(&a.model)?;
    let mut model = Model::load(file).with_context(|| format!("loading {}", a.model.display()))?;
    crate::run::repack(&mut model, !a.exact && !a.no_repack);
    let s = Setup::resolve(&a, model.config.n_ctx_train, par.n_threads())?;
    if s.n_kv_max > model.config.n_ctx_train {
        eprintln!(
            "warning: -c {} exceeds the model's training context {}",
            s.n_kv_max, model.config.n_ctx_train
        );
    }

    let mut cache = model.new_state_typed(Some(s.n_kv_max), a.cache_types.types())?;
    let mut tokens = Tokens {
        rng: Xoshiro256::new(TOKEN_SEED),
        n_vocab: model.config.n_vocab as u64,
    };
    if !a.no_warmup {
        model.forward(&[tokens.next()], &mut cache, &par, Logits::Last)?;
    }
    if a.warmup_batch {
        let batch: Vec<u32> = (0..s.pp).map(|_| tokens.next()).collect();
        cache.truncate(0)?;
        model.prefill(&batch, &mut cache, &par, s.n_ubatch.min(s.n_batch))?;
    }
    cache.truncate(0)?;

    if a.output == "md" {
        crate::emit(&md_header(&s))?;
    }
    let mut rows = Vec::new();
    for n_kv in s.depths() {
        let row = step(&model, &mut cache, &par, &s, n_kv, &mut tokens)?;
        match a.output.as_str() {
            "md" => crate::emit(&md_row(&s, &row))?,
            "jsonl" => crate::emit(&format!("{}\n", row_json(&s, &row)))?,
            _ => {}
        }
        rows.push(row);
    }
    if a.output == "json" {
        let all: Vec<_> = rows.iter().map(|r| row_json(&s, r)).collect();
        crate::emit(&format!("{}\n", serde_json::to_string_pretty(&all)?))?;
    }
    Ok(())
}

/// sweep-bench's settings line and table head.
fn md_header(s: &Setup) -> String {
    format!(
        "\nmain: n_kv_max = {}, n_batch = {}, n_ubatch = {}, flash_attn = 0, n_gpu_layers = 0, n_threads = {}, n_threads_batch = {}\n\n\
         |{:>6} | {:>6} | {:>6} | {:>8} | {:>8} | {:>8} | {:>8} |\n\
         |-------|--------|--------|----------|----------|----------|----------|\n",
        s.n_kv_max,
        s.n_batch,
        s.n_ubatch,
        s.n_threads,
        s.n_threads,
        "PP",
        "TG",
        "N_KV",
        "T_PP s",
        "S_PP t/s",
        "T_TG s",
        "S_TG t/s"
    )
}

fn md_row(s: &Setup, r: &Row) -> String {
    format!(
        "|{:>6} | {:>6} | {:>6} | {:>8.3} | {:>8.2} | {:>8.3} | {:>8.2} |\n",
        s.pp,
        s.tg,
        r.n_kv,
        r.t_pp,
        s.pp as f64 / r.t_pp.max(1e-9),
        r.t_tg,
        s.tg as f64 / r.t_tg.max(1e-9)
    )
}

/// sweep-bench's `--output-format jsonl` record.
fn row_json(s: &Setup, r: &Row) -> serde_json::Value {
    json!({
        "n_kv_max": s.n_kv_max,
        "n_batch": s.n_batch,
        "n_ubatch": s.n_ubatch,
        "flash_attn": 0,
        "n_gpu_layers": 0,
        "n_threads": s.n_threads,
        "n_threads_batch": s.n_threads,
        "pp": s.pp,
        "tg": s.tg,
        "n_kv": r.n_kv,
        "t_pp": r.t_pp,
        "speed_pp": s.pp as f64 / r.t_pp.max(1e-9),
        "t_tg": r.t_tg,
        "speed_tg": s.tg as f64 / r.t_tg.max(1e-9),
    })
}
