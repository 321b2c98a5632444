//! `moxie`: the command-line tool. A thin layer over the library crates; flag names follow
//! llama.cpp where one exists (-m, -p, -n, -t, -c, -b, -ub, --temp, --top-k, ...).

mod bench;
mod bench_ab;
mod compat;
mod gen;
mod inspect;
mod placement_args;
mod plan;
mod profile;
mod progress;
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
    /// Which experts a workload selects: run prompts and write the routing profile (per MoE
    /// layer and expert), or `profile show FILE [--svg F]` to summarise and draw one.
    Profile(profile::Args),
    /// OpenAI-compatible HTTP server (llama-server's endpoints and flags): chat and text
    /// completions with streaming, tools and reasoning; slots; /v1/models, /health, /metrics.
    Serve(serve::Args),
}

fn main() -> ExitCode {
    // The matches are kept: placement rules apply in command-line order, which only they
    // record.
    let matches = match parse_launch_line(std::env::args_os().collect()) {
        Ok((matches, notes)) => {
            for note in notes {
                eprintln!("moxie: {note}");
            }
            matches
        }
        Err(e) => {
            eprint!("{e}");
            return ExitCode::from(2);
        }
    };
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    moxie_core::keep_freed_memory();
    moxie_core::explain_bus_errors();
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
        Cmd::Profile(a) => profile::main(a, subcommand(&matches, "profile")),
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

/// The command line as clap parses it, after [`compat::rewrite`]: llama.cpp's spellings
/// rewritten and other engines' tuning flags taken out, with a note each (the subcommand's
/// own flags are never taken out). Errors are clap's message (or the rewrite's), ready to
/// print.
pub(crate) fn parse_launch_line(
    args: Vec<std::ffi::OsString>,
) -> Result<(clap::ArgMatches, Vec<String>), String> {
    let args = profile::with_run(args);
    let sub = args
        .iter()
        .skip(1)
        .filter_map(|a| a.to_str())
        .find(|a| !a.starts_with('-'))
        .map(str::to_string);
    let cmd = Cli::command();
    let defines = |flag: &str| {
        let long = flag.trim_start_matches("--");
        sub.as_deref()
            .and_then(|s| cmd.find_subcommand(s))
            .is_some_and(|c| c.get_arguments().any(|a| a.get_long() == Some(long)))
    };
    let (args, notes) = compat::rewrite(args, defines)?;
    cmd.try_get_matches_from(args)
        .map(|m| (m, notes))
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The launch lines of issue 18, from users' reports (`tests/data/launch_lines.txt`).
    fn launch_lines() -> impl Iterator<Item = &'static str> {
        include_str!("../tests/data/launch_lines.txt")
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
    }

    fn argv(line: &str) -> Vec<std::ffi::OsString> {
        std::iter::once("moxie")
            .chain(line.split_whitespace())
            .map(Into::into)
            .collect()
    }

    #[test]
    fn every_launch_line_parses() {
        for line in launch_lines() {
            if let Err(e) = parse_launch_line(argv(line)) {
                panic!("{line}\n{e}");
            }
        }
    }

    #[test]
    fn ik_flags_are_not_misread_and_unknown_flags_are_named() {
        // clap alone read -muge as `-m uge`.
        let (m, notes) = parse_launch_line(argv("serve -m M -muge -mla 3 -amb 512")).unwrap();
        let serve = m.subcommand_matches("serve").unwrap();
        assert_eq!(
            serve
                .get_one::<std::path::PathBuf>("model")
                .unwrap()
                .to_str(),
            Some("M")
        );
        // -muge and -amb go with a note; serve takes ik's -mla 3 itself.
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert_eq!(
            serve.get_one::<moxie_core::MlaPrompts>("mla_use"),
            Some(&moxie_core::MlaPrompts::Expanded)
        );
        let e = parse_launch_line(argv("serve -m M -mla 0")).unwrap_err();
        assert!(e.contains("is not supported"), "{e}");
        let e = parse_launch_line(argv("serve -m M --frobnicate")).unwrap_err();
        assert!(e.contains("--frobnicate"), "{e}");
        let e = parse_launch_line(argv("serve -m M -xyz 3")).unwrap_err();
        assert!(e.contains("-x"), "{e}");
    }
}
