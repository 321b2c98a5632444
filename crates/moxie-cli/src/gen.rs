//! `moxie gen`: write a synthetic model with random weights.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use moxie_core::synth::{self, SynthSpec, SynthType};
use moxie_core::Arch;

#[derive(clap::Args)]
#[command(after_help = gen_help())]
pub struct Args {
    /// Architecture: deepseek2, glm4moe or qwen3moe.
    #[arg(long)]
    arch: Option<String>,
    /// Shape preset (see below); `tiny` picks the fixture-sized model of --arch.
    #[arg(long, default_value = "tiny")]
    preset: String,
    /// Block type or mix: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K, IQ4_NL,
    /// IQ4_XS, Q4_K_M, Q5_K_M.
    #[arg(long = "type", default_value = "F32")]
    ty: String,
    /// RNG seed (same seed and settings = identical file).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Override a shape field, e.g. `--set n_layer=4 --set n_expert=32` (fields below).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Threads for generation and quantization (default: all cores).
    #[arg(short = 't', long)]
    threads: Option<usize>,
    /// Output GGUF path.
    #[arg(short = 'o', long)]
    out: PathBuf,
}

fn gen_help() -> String {
    let mut s = String::from("Presets:\n");
    for (name, desc) in synth::presets() {
        s.push_str(&format!("  {name:<16} {desc}\n"));
    }
    s.push_str("\nShape fields for --set:\n");
    for (k, desc) in synth::SHAPE_KEYS {
        s.push_str(&format!("  {k:<22} {desc}\n"));
    }
    s
}

pub fn main(a: Args) -> Result<()> {
    let arch = a.arch.as_deref().map(Arch::from_name).transpose()?;
    let mut spec = SynthSpec::preset_for(&a.preset, arch)?;
    spec.ty = SynthType::parse(&a.ty)?;
    spec.seed = a.seed;
    for kv in &a.set {
        let (k, v) = kv
            .split_once('=')
            .with_context(|| format!("--set expects KEY=VALUE, got '{kv}'"))?;
        spec.shape.set(k.trim(), v)?;
    }
    spec.validate()?;
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let mut last_pct = u64::MAX;
    let report = synth::generate_with(&spec, &a.out, threads, &mut |p| {
        let pct = p.bytes_done * 100 / p.total_bytes.max(1);
        if pct != last_pct && pct % 5 == 0 {
            last_pct = pct;
            eprint!("\r{pct:>3}% {:<40}", p.tensor);
            let _ = std::io::stderr().flush();
        }
    })?;
    eprintln!("\r{:<60}", "");
    let types: Vec<String> = report
        .tensor_types
        .iter()
        .map(|(t, n)| format!("{t} {n}"))
        .collect();
    println!(
        "wrote {}: {} bytes, {:.3} M params, {} tensors ({}), {:.1} s",
        report.path.display(),
        report.bytes,
        report.n_params as f64 / 1e6,
        report.n_tensors,
        types.join(", "),
        report.seconds
    );
    Ok(())
}
