//! `moxie`: the command-line tool. A thin layer over the library crates; flag names follow
//! llama.cpp where one exists (-m, -p, -n, -t, -c, -b, -ub, --temp, --top-k, ...).

mod bench;
mod gen;
mod inspect;
mod placement_args;
mod plan;
mod quantize;
mod run;
mod serve;
mod sweep_bench;
mod tokenize;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "moxie",
    version,
    about = "Inference engine for huge Mixture-of-Experts models in GGUF"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Summarise a GGUF: metadata, and tensors grouped by role with bytes and quant types.
    Inspect(inspect::Args),
    /// Generate text from a prompt, streaming to stdout.
    Run(run::RunArgs),
    /// Evaluate token ids in one batch from an empty cache and write all logits as .npy.
    Logits(run::LogitsArgs),
    /// Tokenize text with the model's tokenizer.
    Tokenize(tokenize::Args),
    /// Write a synthetic model with random weights (for tests and benchmarks).
    Gen(gen::Args),
    /// Quantize a GGUF like llama-quantize (same arguments, type mixes, --tensor-type,
    /// --imatrix; byte-identical output), streaming, optionally split into parts.
    Quantize(quantize::Args),
    /// Measure prompt processing and generation speed (llama-bench's flags and output).
    Bench(bench::Args),
    /// Prompt processing and generation speed over a growing context (ik_llama.cpp's
    /// llama-sweep-bench: PP, TG, N_KV, T_PP s, S_PP t/s, T_TG s, S_TG t/s).
    SweepBench(sweep_bench::Args),
    /// Where each tensor and KV cache layer would go (llama.cpp's -ot/--cpu-moe/--n-cpu-moe/
    /// -ngl/-sm/-ts/-mg, or --fit to the budgets), bytes per device, and whether it fits.
    /// Reads the header only.
    Plan(plan::Args),
    /// OpenAI-compatible HTTP server (llama-server's endpoints and flags): chat and text
    /// completions with streaming, tools and reasoning; slots; /v1/models, /health, /metrics.
    Serve(serve::Args),
}

/// llama.cpp spells some flags with one dash and several letters (`-ub`), which clap cannot
/// express as short flags: map them to their long forms.
fn llama_cpp_style_args(args: impl Iterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    args.map(|a| match a.to_str() {
        Some("-ub") => "--ubatch-size".into(),
        Some("-pg") => "--n-pg".into(),
        Some("-wb") => "--warmup-batch".into(),
        Some("-ctk") => "--cache-type-k".into(),
        Some("-ctv") => "--cache-type-v".into(),
        Some("-ot") => "--override-tensor".into(),
        Some("-cmoe") => "--cpu-moe".into(),
        Some("-ncmoe") => "--n-cpu-moe".into(),
        Some("-ngl") => "--n-gpu-layers".into(),
        Some("-sm") => "--split-mode".into(),
        Some("-ts") => "--tensor-split".into(),
        Some("-mg") => "--main-gpu".into(),
        Some("-np") => "--parallel".into(),
        _ => a,
    })
    .collect()
}

fn main() -> ExitCode {
    // The matches are kept: placement rules apply in command-line order, which only they
    // record.
    let matches = Cli::command().get_matches_from(llama_cpp_style_args(std::env::args_os()));
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    moxie_core::keep_freed_memory();
    let res = match cli.cmd {
        Cmd::Inspect(a) => inspect::main(a),
        Cmd::Run(a) => run::run(a, subcommand(&matches, "run")),
        Cmd::Logits(a) => run::logits(a, subcommand(&matches, "logits")),
        Cmd::Tokenize(a) => tokenize::main(a),
        Cmd::Gen(a) => gen::main(a),
        Cmd::Quantize(a) => quantize::main(a),
        Cmd::Bench(a) => bench::main(a, subcommand(&matches, "bench")),
        Cmd::SweepBench(a) => sweep_bench::main(a),
        Cmd::Plan(a) => plan::main(a, subcommand(&matches, "plan")),
        Cmd::Serve(a) => serve::main(a, subcommand(&matches, "serve")),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// The arguments of subcommand `name`, which clap has just parsed (so they are there).
fn subcommand<'m>(matches: &'m clap::ArgMatches, name: &str) -> &'m clap::ArgMatches {
    static EMPTY: std::sync::OnceLock<clap::ArgMatches> = std::sync::OnceLock::new();
    matches
        .subcommand_matches(name)
        .unwrap_or_else(|| EMPTY.get_or_init(clap::ArgMatches::default))
}

/// The error and its causes, skipping causes whose text the message already includes (the
/// library errors embed their source).
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// Write `text` to stdout; a closed pipe (`moxie inspect m.gguf | head`) is not an error.
pub(crate) fn emit(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// Open a GGUF (all split parts) with a readable error.
pub(crate) fn open_gguf(
    path: &std::path::Path,
) -> anyhow::Result<std::sync::Arc<moxie_gguf::GgufFile>> {
    let f = moxie_gguf::GgufFile::open(path)?;
    Ok(std::sync::Arc::new(f))
}
