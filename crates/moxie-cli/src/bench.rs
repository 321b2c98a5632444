//! `moxie bench`: llama-bench's interface and output for moxie.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use moxie_core::bench::{
    decode_bytes, expert_reads_per_token, mean_std, read_bandwidth, run_once, BenchTest,
};
use moxie_core::state::kv_type_name;
use moxie_core::{KvTypes, Model, Parallel};
use moxie_quant::GgmlType;
use serde_json::json;

#[derive(clap::Args)]
pub struct Args {
    /// Model GGUF(s).
    #[arg(short = 'm', long = "model", required = true)]
    pub(crate) model: Vec<PathBuf>,
    /// Prompt lengths (ppN tests); 0 disables.
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512"
    )]
    pub(crate) n_prompt: Vec<usize>,
    /// Generation lengths (tgN tests); 0 disables.
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128"
    )]
    pub(crate) n_gen: Vec<usize>,
    /// Prompt + generation tests, `-pg 512,128` (repeatable).
    #[arg(long = "n-pg", value_name = "PP,TG")]
    pub(crate) pg: Vec<String>,
    /// Context depth before each test (not timed).
    #[arg(
        short = 'd',
        long = "n-depth",
        value_delimiter = ',',
        default_value = "0"
    )]
    pub(crate) depth: Vec<usize>,
    /// Threads (default: all cores).
    #[arg(short = 't', long = "threads", value_delimiter = ',')]
    pub(crate) threads: Vec<usize>,
    /// Logical batch size.
    #[arg(
        short = 'b',
        long = "batch-size",
        value_delimiter = ',',
        default_value = "2048"
    )]
    pub(crate) batch: Vec<usize>,
    /// Micro-batch size (`-ub`).
    #[arg(long = "ubatch-size", value_delimiter = ',', default_value = "512")]
    pub(crate) ubatch: Vec<usize>,
    /// KV cache types for keys (`-ctk`): f16, f32, q8_0.
    #[arg(long = "cache-type-k", value_delimiter = ',', default_value = "f16", value_parser = crate::run::kv_type)]
    pub(crate) cache_type_k: Vec<GgmlType>,
    /// KV cache types for values (`-ctv`): f16, f32, q8_0 (MLA models keep no value cache).
    #[arg(long = "cache-type-v", value_delimiter = ',', default_value = "f16", value_parser = crate::run::kv_type)]
    pub(crate) cache_type_v: Vec<GgmlType>,
    /// Repetitions per test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub(crate) reps: usize,
    /// llama.cpp's summation order everywhere (bit-identical logits, slower prompt processing).
    #[arg(long)]
    pub(crate) exact: bool,
    /// How MLA models attend over a prompt batch (also `-mla`): 3 expands keys and values
    /// from the latents first, as ik_llama.cpp's `-mla 3`; 1 or 2, the default, attends over
    /// the latents as llama.cpp does (see `moxie run --help`).
    #[arg(long = "mla-use", value_name = "1|2|3", value_parser = crate::run::mla_use)]
    pub(crate) mla_use: Option<moxie_core::MlaPrompts>,
    /// Output format: md, json, jsonl or csv.
    #[arg(short = 'o', long = "output", default_value = "md")]
    pub(crate) output: String,
    /// Skip the warm-up run.
    #[arg(long)]
    pub(crate) no_warmup: bool,
    /// NUMA placement: distribute, isolate or numactl (as on `run`).
    #[arg(long, value_name = "distribute|isolate|numactl", value_parser = crate::run::numa_mode)]
    pub(crate) numa: Option<moxie_core::numa::NumaMode>,
    /// llama-bench's `-w 0|1`: run the warm-up (1, the default) or not (0).
    #[arg(short = 'w', long = "warmup", value_parser = clap::value_parser!(u8).range(0..=1))]
    pub(crate) warmup: Option<u8>,
    /// After the table, for each generation test: bytes read per token, this machine's read
    /// bandwidth measured with the same threads, and the fraction of it decode reached (on
    /// stderr, so the table stays llama-bench's).
    #[arg(long)]
    pub(crate) bandwidth: bool,
    /// Buffer the bandwidth measurement reads (MiB); keep it well above the last-level cache.
    #[arg(long, default_value = "2048", value_name = "MIB")]
    pub(crate) bandwidth_mib: usize,
    #[command(flatten)]
    pub(crate) placement: crate::placement_args::PlacementArgs,
    /// A/B on wall-clock time: each `--ab 'FLAGS'` is a configuration (bench flags added to
    /// this command line, e.g. `--ab '-t 2' --ab '-t 2 --no-repack'`); all are loaded, their
    /// repetitions alternate on the same tests, and each arm's t/s and ratio to the first
    /// (95% confidence interval) are reported.
    #[arg(long = "ab", value_name = "FLAGS", allow_hyphen_values = true)]
    pub(crate) ab: Vec<String>,
}

impl Args {
    /// Whether each test starts with a warm-up run (neither `--no-warmup` nor `-w 0`).
    pub(crate) fn warms_up(&self) -> bool {
        !self.no_warmup && self.warmup != Some(0)
    }
}

/// The sizes a benchmarked model is planned for (the largest of its tests' settings).
#[derive(Clone, Copy)]
pub(crate) struct LoadSizes {
    pub n_batch: usize,
    pub n_ubatch: usize,
    pub kv_types: KvTypes,
    pub n_threads: usize,
}

/// `file` planned for `tests` (the context of the largest) at `sizes` with `a`'s placement,
/// loaded and settled as `moxie run` does.
pub(crate) fn load(
    file: std::sync::Arc<moxie_gguf::GgufFile>,
    path: &std::path::Path,
    a: &Args,
    matches: &clap::ArgMatches,
    tests: &[BenchTest],
    sizes: LoadSizes,
) -> Result<Model> {
    let run = moxie_core::placement::RunShape {
        n_ctx: tests.iter().map(|t| t.depth + t.n_tokens() + 1).max(),
        n_batch: sizes.n_batch,
        n_ubatch: sizes.n_ubatch,
        kv_types: sizes.kv_types,
        n_seq: 1,
        n_threads: sizes.n_threads,
    };
    let mut model = crate::run::plan_and_load(file, path, &a.placement, matches, &run, a.exact)?;
    crate::run::settle(&mut model, false, false);
    Ok(model)
}

/// llama.cpp's `llama_ftype` names for `general.file_type`.
fn ftype_name(ft: Option<u64>) -> String {
    let name = match ft {
        Some(0) => "all F32",
        Some(1) => "F16",
        Some(2) => "Q4_0",
        Some(3) => "Q4_1",
        Some(7) => "Q8_0",
        Some(8) => "Q5_0",
        Some(9) => "Q5_1",
        Some(10) => "Q2_K - Medium",
        Some(11) => "Q3_K - Small",
        Some(12) => "Q3_K - Medium",
        Some(13) => "Q3_K - Large",
        Some(14) => "Q4_K - Small",
        Some(15) => "Q4_K - Medium",
        Some(16) => "Q5_K - Small",
        Some(17) => "Q5_K - Medium",
        Some(18) => "Q6_K",
        Some(25) => "IQ4_NL - 4.5 bpw",
        Some(30) => "IQ4_XS - 4.25 bpw",
        Some(32) => "BF16",
        Some(_) => "mixed",
        None => "unknown type",
    };
    name.to_string()
}

fn params_label(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.2} B", n as f64 / 1e9)
    } else {
        format!("{:.2} M", n as f64 / 1e6)
    }
}

struct Row {
    model: String,
    /// llama-bench's backend column: "CUDA" when a GPU holds part of the model, else "CPU".
    backend: String,
    file: String,
    size: u64,
    params: u64,
    threads: usize,
    batch: usize,
    ubatch: usize,
    kv: KvTypes,
    test: BenchTest,
    samples: Vec<f64>,
}

/// llama-bench's name for the backend that runs `model`: "CUDA" as soon as a GPU holds any of
/// it (llama-bench names its build's GPU backend whatever `-ngl` is), else "CPU" (simulated
/// devices compute with the CPU kernels).
/// The devices the model runs on: `CPU`, then each GPU or simulated device that holds weights
/// (`CPU+CUDA0,CUDA1`), where llama-bench names its backend (`CUDA`).
fn backend_name(model: &Model) -> String {
    let others: Vec<&str> = model
        .devices
        .iter()
        .skip(1)
        .filter(|d| d.stats().peak_bytes > 0)
        .map(|d| d.name.as_str())
        .collect();
    if others.is_empty() {
        "CPU".to_owned()
    } else {
        format!("CPU+{}", others.join(","))
    }
}

pub(crate) fn tests(a: &Args) -> Result<Vec<BenchTest>> {
    let mut out = Vec::new();
    for &d in &a.depth {
        for &p in a.n_prompt.iter().filter(|&&p| p > 0) {
            out.push(BenchTest {
                n_prompt: p,
                n_gen: 0,
                depth: d,
            });
        }
        for &n in a.n_gen.iter().filter(|&&n| n > 0) {
            out.push(BenchTest {
                n_prompt: 0,
                n_gen: n,
                depth: d,
            });
        }
        for pg in &a.pg {
            let (p, n) = pg
                .split_once(',')
                .and_then(|(p, n)| Some((p.trim().parse().ok()?, n.trim().parse().ok()?)))
                .with_context(|| format!("-pg expects PP,TG, got '{pg}'"))?;
            out.push(BenchTest {
                n_prompt: p,
                n_gen: n,
                depth: d,
            });
        }
    }
    if out.is_empty() {
        bail!("no tests: give -p, -n or -pg with a value above 0");
    }
    Ok(out)
}

pub fn main(a: Args, matches: &clap::ArgMatches) -> Result<()> {
    crate::run::apply_numa(a.numa)?;
    if !["md", "json", "jsonl", "csv"].contains(&a.output.as_str()) {
        bail!("-o must be md, json, jsonl or csv, not '{}'", a.output);
    }
    if a.reps == 0 {
        bail!("-r must be at least 1");
    }
    if a.batch.contains(&0) || a.ubatch.contains(&0) {
        bail!("-b and -ub must be positive");
    }
    if !a.ab.is_empty() {
        return crate::bench_ab::main(&a, &a.ab);
    }
    let tests = tests(&a)?;
    let threads = if a.threads.is_empty() {
        vec![Parallel::available().n_threads()]
    } else {
        a.threads.clone()
    };
    let kv_types: Vec<KvTypes> = a
        .cache_type_k
        .iter()
        .flat_map(|&k| a.cache_type_v.iter().map(move |&v| KvTypes { k, v }))
        .collect();
    // llama-bench shows the cache types only when they are not its defaults.
    let show_kv = kv_types.iter().any(|t| *t != KvTypes::default());
    let mut rows = Vec::new();
    let mut bandwidths = Vec::new();
    let mut expert_reads = Vec::new();
    for path in &a.model {
        let file = crate::open_gguf(path)?;
        let size = file.total_tensor_bytes();
        let params: u64 = file.tensors().iter().map(|t| t.n_elements()).sum();
        let ftype = file.metadata().get_u64("general.file_type");
        let sizes = LoadSizes {
            n_batch: a.batch.iter().copied().max().unwrap_or(512),
            n_ubatch: a.ubatch.iter().copied().max().unwrap_or(512),
            kv_types: kv_types.first().copied().unwrap_or_default(),
            n_threads: threads.iter().copied().max().unwrap_or(1),
        };
        let model = load(file, path, &a, matches, &tests, sizes)?;
        let backend = backend_name(&model);
        let desc = format!(
            "{} {} {}",
            model.config.arch.name(),
            params_label(params).replace(' ', ""),
            ftype_name(ftype)
        );
        for &t in &threads {
            let par = Parallel::new(t)
                .with_numerics(crate::run::numerics(a.exact))
                .with_mla_prompts(a.mla_use.unwrap_or_default());
            for &b in &a.batch {
                for (&ub, kv) in a
                    .ubatch
                    .iter()
                    .flat_map(|u| kv_types.iter().map(move |k| (u, *k)))
                {
                    let micro = ub.min(b);
                    for &test in &tests {
                        if a.warms_up() {
                            run_once(&model, &par, test.warm_up(), micro, kv)?;
                        }
                        let mut samples = Vec::with_capacity(a.reps);
                        let before = model.devices.stats();
                        let cache_before = model.expert_cache_counts();
                        for _ in 0..a.reps {
                            samples.push(run_once(&model, &par, test, micro, kv)?);
                        }
                        if test.n_gen > 0 {
                            let tokens = (a.reps * test.n_gen) as u64;
                            let after = model.devices.stats();
                            if let Some(r) = expert_reads_per_token(&before, &after, tokens) {
                                expert_reads.push(format!(
                                    "{} t={t}: routed-expert weights read per generated token: {r}",
                                    test.name()
                                ));
                            }
                            if let (Some(b), Some(a)) = (cache_before, model.expert_cache_counts())
                            {
                                expert_reads.push(format!(
                                    "{} t={t}: {}",
                                    test.name(),
                                    moxie_core::bench::expert_cache_line(&a.since(&b))
                                ));
                            }
                        }
                        let row = Row {
                            model: desc.clone(),
                            backend: backend.clone(),
                            file: path.display().to_string(),
                            size,
                            params,
                            threads: t,
                            batch: b,
                            ubatch: ub,
                            kv,
                            test,
                            samples,
                        };
                        if a.output == "jsonl" {
                            crate::emit(&format!("{}\n", row_json(&row)))?;
                        } else if a.output == "md" && rows.is_empty() {
                            crate::emit(&md_header(show_kv))?;
                        }
                        if a.output == "md" {
                            crate::emit(&md_row(&row, show_kv))?;
                        }
                        if a.bandwidth && test.n_prompt == 0 && test.n_gen > 0 {
                            bandwidths.push(bandwidth_line(&model, &par, &row, a.bandwidth_mib)?);
                        }
                        rows.push(row);
                    }
                }
            }
        }
    }
    for line in expert_reads.iter().chain(&bandwidths) {
        eprintln!("{line}");
    }
    match a.output.as_str() {
        "json" => {
            let all: Vec<_> = rows.iter().map(row_json).collect();
            crate::emit(&format!("{}\n", serde_json::to_string_pretty(&all)?))
        }
        "csv" => {
            let mut o = String::from(
                "model_filename,model_type,model_size,model_n_params,n_threads,n_batch,n_ubatch,type_k,type_v,n_prompt,n_gen,n_depth,test,avg_ts,stddev_ts\n",
            );
            for r in &rows {
                let (m, s) = mean_std(&r.samples);
                writeln!(
                    o,
                    "\"{}\",\"{}\",{},{},{},{},{},{},{},{},{},{},\"{}\",{m:.6},{s:.6}",
                    r.file,
                    r.model,
                    r.size,
                    r.params,
                    r.threads,
                    r.batch,
                    r.ubatch,
                    kv_type_name(r.kv.k),
                    kv_type_name(r.kv.v),
                    r.test.n_prompt,
                    r.test.n_gen,
                    r.test.depth,
                    r.test.name()
                )?;
            }
            crate::emit(&o)
        }
        _ => Ok(()),
    }
}

/// Decode as a fraction of the machine's read bandwidth: bytes per token (at the test's mean
/// context length) times tokens per second, over the bandwidth measured now with the same
/// threads on a `mib` MiB buffer (median of five passes).
fn bandwidth_line(model: &Model, par: &Parallel, r: &Row, mib: usize) -> Result<String> {
    let n_kv = r.test.depth + r.test.n_gen.div_ceil(2);
    let b = decode_bytes(model, n_kv, r.kv)?;
    let (tps, _) = mean_std(&r.samples);
    let bw = read_bandwidth(par, mib << 20);
    let used = b.total() as f64 * tps;
    let mb = |x: u64| x as f64 / 1e6;
    Ok(format!(
        "{} {} t={}: {:.1} MB/token (dense {:.1} + experts {:.1} + embedding row {:.3} + KV {:.1} at {n_kv} positions) x {tps:.2} t/s = {:.1} GB/s of {:.1} GB/s measured read bandwidth = {:.0}%",
        r.model,
        r.test.name(),
        r.threads,
        mb(b.total()),
        mb(b.dense),
        mb(b.experts),
        mb(b.embedding_row),
        mb(b.kv),
        used / 1e9,
        bw / 1e9,
        100.0 * used / bw
    ))
}

fn md_header(show_kv: bool) -> String {
    let (kv, kv_align) = if show_kv {
        (" type_k | type_v |", " ---: | ---: |")
    } else {
        ("", "")
    };
    format!(
        "| model | size | params | backend | threads |{kv} test | t/s |\n| --- | ---: | ---: | --- | ---: |{kv_align} ---: | ---: |\n"
    )
}

fn md_row(r: &Row, show_kv: bool) -> String {
    let (m, s) = mean_std(&r.samples);
    let size = if r.size >= 1 << 30 {
        format!("{:.2} GiB", r.size as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.2} MiB", r.size as f64 / (1u64 << 20) as f64)
    };
    let kv = if show_kv {
        format!(" {} | {} |", kv_type_name(r.kv.k), kv_type_name(r.kv.v))
    } else {
        String::new()
    };
    format!(
        "| {} | {size} | {} | {} | {} |{kv} {} | {m:.2} ± {s:.2} |\n",
        r.model,
        params_label(r.params),
        r.backend,
        r.threads,
        r.test.name()
    )
}

fn row_json(r: &Row) -> serde_json::Value {
    let (m, s) = mean_std(&r.samples);
    json!({
        "model_filename": r.file,
        "model_type": r.model,
        "model_size": r.size,
        "model_n_params": r.params,
        "backend": r.backend,
        "n_threads": r.threads,
        "n_batch": r.batch,
        "n_ubatch": r.ubatch,
        "type_k": kv_type_name(r.kv.k),
        "type_v": kv_type_name(r.kv.v),
        "n_prompt": r.test.n_prompt,
        "n_gen": r.test.n_gen,
        "n_depth": r.test.depth,
        "test": r.test.name(),
        "avg_ts": m,
        "stddev_ts": s,
        "samples_ts": r.samples,
    })
}
