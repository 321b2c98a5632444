//! `moxie gen`: write a synthetic model with random weights, or (`--header-only`) the tensor
//! index of a real big model without any weights.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use moxie_core::synth::SynthArch;
use moxie_core::synth::{self, HeaderSpec, SynthReport, SynthSpec, SynthType};

#[derive(clap::Args)]
#[command(after_help = gen_help())]
pub struct Args {
    /// Architecture: deepseek2, glm4moe or qwen3moe.
    #[arg(long)]
    arch: Option<String>,
    /// Shape preset (see below); `tiny` picks the fixture-sized model of --arch.
    #[arg(long, default_value = "tiny")]
    preset: String,
    /// Write only the header (metadata and tensor index, no data) of a real model's GGUF;
    /// needs a header-only preset (below). For planning tests on models too big to have.
    #[arg(long)]
    header_only: bool,
    /// llama-quantize file type (any of its names, below): each tensor gets the block type
    /// llama-quantize's rules give it, as `llama-quantize` on an F32 master without an
    /// importance matrix [default: F32; with --header-only: Q4_K_M].
    #[arg(long = "type")]
    ty: Option<String>,
    /// No mix: --type names one block type (a ggml type such as Q4_K or IQ2_S, or a file type
    /// for its default block type) for every tensor llama-quantize quantizes, with its
    /// fallbacks (llama-quantize's --pure).
    #[arg(long)]
    pure: bool,
    /// RNG seed (same seed and settings = identical file).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Routing preset (below): static skew and temporal locality of the expert choices, for
    /// testing placement policies; applied before --set, which can adjust its fields.
    #[arg(long)]
    routing: Option<String>,
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
    s.push_str("\nHeader-only presets (--header-only; llama-quantize's Q4_K_M by default):\n");
    for (name, desc) in synth::header_presets() {
        s.push_str(&format!("  {name:<16} {desc}\n"));
    }
    s.push_str("\nTypes (--type): llama-quantize's file types\n  ");
    s.push_str(&synth::ftype_names());
    s.push_str(
        "\n(also the aliases Q3_K, Q4_K, Q5_K and the numeric ids), with llama-quantize's per-tensor\n\
         rules (the ones moxie quantize uses). Tensors of IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S,\n\
         IQ3_XXS and IQ3_S (most of the IQ1/IQ2/IQ3 file types), which moxie has no quantizer for,\n\
         are random valid blocks scaled to the weights' spread, not a quantization of them; TQ1_0,\n\
         TQ2_0, MXFP4, Q1_0 and Q2_0 tensors are refused. --header-only writes every type.\n\
         --pure: one block type for all tensors.\n",
    );
    s.push_str("\nRouting presets (--routing):\n");
    for (name, desc) in synth::ROUTING_PRESETS {
        s.push_str(&format!("  {name:<16} {desc}\n"));
    }
    s.push_str("\nShape fields for --set:\n");
    for (k, desc) in synth::SHAPE_KEYS {
        s.push_str(&format!("  {k:<22} {desc}\n"));
    }
    s
}

pub fn main(a: Args) -> Result<()> {
    if a.header_only {
        return header_only(&a);
    }
    let arch = a.arch.as_deref().map(SynthArch::from_name).transpose()?;
    let mut spec = SynthSpec::preset_for(&a.preset, arch)?;
    spec.ty = synth_type(a.ty.as_deref().unwrap_or("F32"), a.pure)?;
    spec.seed = a.seed;
    if let Some(r) = &a.routing {
        spec.shape.routing = synth::RoutingShape::preset(r)?;
    }
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
    println!(
        "wrote {}: {} bytes, {:.3} M params, {} tensors ({}), {:.1} s",
        report.path.display(),
        report.bytes,
        report.n_params as f64 / 1e6,
        report.n_tensors,
        type_counts(&report),
        report.seconds
    );
    Ok(())
}

/// `moxie gen --header-only`: a real model's header, instantly (no weights to make).
fn header_only(a: &Args) -> Result<()> {
    if a.routing.is_some() {
        bail!("--routing does not apply to --header-only: a header has no weights to route");
    }
    if !a.set.is_empty() {
        bail!("--set does not apply to --header-only: header-only presets are real models with fixed shapes");
    }
    let mut spec = HeaderSpec::preset(&a.preset)?;
    if let Some(arch) = a.arch.as_deref() {
        if arch != spec.arch_name {
            bail!(
                "header-only preset '{}' is a {} model, not {arch}",
                a.preset,
                spec.arch_name
            );
        }
    }
    match (a.ty.as_deref(), a.pure) {
        (Some(ty), pure) => spec.base.ty = synth_type(ty, pure)?,
        (None, true) => bail!("--pure needs --type (the block type of every tensor)"),
        (None, false) => {}
    }
    let report = spec.write(&a.out)?;
    println!(
        "wrote {}: header only, {} bytes: the tensor index of a {} {} file with {} bytes of tensor data, {:.3} B params, {} tensors ({})",
        report.path.display(),
        report.bytes,
        spec.model_name,
        spec.base.ty,
        report.tensor_bytes,
        report.n_params as f64 / 1e9,
        report.n_tensors,
        type_counts(&report)
    );
    Ok(())
}

/// `--type NAME [--pure]`.
fn synth_type(name: &str, pure: bool) -> Result<SynthType> {
    Ok(if pure {
        SynthType::parse_pure(name)?
    } else {
        SynthType::parse(name)?
    })
}

/// "Q4_K 606, Q6_K 58, ...": tensors per block type.
fn type_counts(report: &SynthReport) -> String {
    report
        .tensor_types
        .iter()
        .map(|(t, n)| format!("{t} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}
