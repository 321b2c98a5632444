//! `moxie plan -m MODEL [placement flags] [--json]`: where every tensor and KV layer would
//! go, bytes per device, and whether it fits. Reads the header only, never weights.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::ArgMatches;
use moxie_core::placement::{plan_for_file, RunShape};
use moxie_gguf::GgufFile;

use crate::placement_args::PlacementArgs;
use crate::run::CacheTypeArgs;

#[derive(clap::Args)]
pub struct Args {
    /// Model GGUF (the first part of a split model); a header-only file is enough.
    #[arg(short = 'm', long = "model")]
    model: PathBuf,
    #[command(flatten)]
    placement: PlacementArgs,
    /// Context size in tokens (default: 4096, capped at the model's training context).
    #[arg(short = 'c', long = "ctx-size")]
    ctx_size: Option<usize>,
    /// Logical batch size.
    #[arg(short = 'b', long = "batch-size", default_value_t = 2048)]
    batch_size: usize,
    /// Physical (micro-)batch size (also `-ub`): compute buffers hold one.
    #[arg(long = "ubatch-size", default_value_t = 512)]
    ubatch_size: usize,
    #[command(flatten)]
    cache_types: CacheTypeArgs,
    /// Sequences held at once (also `-np`, `moxie serve`'s slots): as in `moxie serve` and
    /// llama-server, -c is split between them; each has its own cache and recurrent state.
    #[arg(long = "parallel", default_value_t = 1)]
    parallel: usize,
    /// CPU threads (as `moxie run`; default: every core). Each thread of a prompt batch holds
    /// its own attention buffers.
    #[arg(short = 't', long = "threads")]
    threads: Option<usize>,
    /// CPU threads for prompt batches (also `-tb`; default: `-t`).
    #[arg(long = "threads-batch")]
    threads_batch: Option<usize>,
    /// Print the plan as JSON.
    #[arg(long)]
    json: bool,
}

pub fn main(a: Args, matches: &ArgMatches) -> Result<()> {
    let options = a.placement.options(matches)?;
    let devices = a.placement.devices()?;
    let file = GgufFile::open_header_only(&a.model)?;
    if a.parallel == 0 {
        bail!("--parallel must be at least 1");
    }
    // Each slot's share of -c (or of the default context), as `moxie serve` gives it.
    let n_ctx = match (a.ctx_size, a.parallel) {
        (c, 1) => c,
        (c, n) => {
            let total = c.unwrap_or(4096.min(crate::run::n_ctx_train(&file)));
            if total / n == 0 {
                bail!("-c {total} split across --parallel {n} slots leaves no context");
            }
            Some(total / n)
        }
    };
    let run = RunShape {
        n_ctx,
        n_batch: a.batch_size,
        n_ubatch: a.ubatch_size,
        kv_types: a.cache_types.types(),
        n_seq: a.parallel,
        n_threads: a
            .threads_batch
            .or(a.threads)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
    };
    let plan = plan_for_file(&file, &options, &devices, &run)?;
    if a.json {
        crate::emit(&format!("{:#}\n", plan.to_json()))
    } else {
        crate::emit(&plan.report())
    }
}
