//! `moxie profile`: which experts a workload selects (issue 19).
//!
//! - `moxie profile -m MODEL (-f PROMPTS.txt | --chat-file F.jsonl) [-n N] [--chat] -o P.json`
//!   runs every prompt from an empty cache (greedy, `N` generated tokens each) and writes the
//!   routing profile: per MoE layer and expert, selections and routing weight, prompt and
//!   generated tokens apart (the JSON `moxie serve --profile-out` keeps).
//! - `moxie profile show P.json [--svg FILE]`: per layer the tokens, how many experts took half
//!   and nine tenths of the selections and the busiest one's share, as a table; `--svg` draws
//!   the layers x experts heatmap and a per-layer concentration chart a person opens.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{ArgMatches, Subcommand};
use moxie_core::generate::{generate, GenParams};
use moxie_core::telemetry::RoutingProfile;
use moxie_core::{Sampler, SamplerConfig};

use crate::run::{load_model, load_tokenizer, ModelArgs};

/// `moxie profile -m ...` is `moxie profile run -m ...` ([`with_run`] inserts the `run`).
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Sub,
}

#[derive(Subcommand)]
enum Sub {
    /// Run prompts and write the routing profile (`moxie profile -m MODEL ...` for short).
    Run(Box<Collect>),
    /// Summarise a profile per layer; `--svg` draws its heatmap.
    Show(ShowArgs),
    /// Replay a routing trace (`profile -m ... --trace T`) against a VRAM expert cache and
    /// report the expert bytes per token it leaves to the CPU.
    Simulate(SimulateArgs),
}

#[derive(clap::Args)]
struct SimulateArgs {
    /// A routing trace (`moxie profile --trace`).
    #[arg(long)]
    trace: PathBuf,
    /// The model the trace came from (its header gives each layer's expert bytes).
    #[arg(short = 'm', long = "model")]
    model: PathBuf,
    /// VRAM for experts, e.g. 24GiB (several GPUs: their sum, `24GiB,24GiB`).
    #[arg(long)]
    gpu: String,
    /// Cache policy: static (the trace's most selected experts, fixed), lru, lfu, decay
    /// (selections halved every 8 tokens since) (default: all four).
    #[arg(long)]
    policy: Option<String>,
}

/// `moxie profile -m MODEL ...` as `moxie profile run -m MODEL ...`: the arguments after
/// `profile` name no subcommand of it.
pub fn with_run(mut args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let at = args.iter().position(|a| a == "profile");
    if let Some(i) = at {
        let next = args.get(i + 1).and_then(|a| a.to_str());
        if !matches!(
            next,
            Some("run" | "show" | "simulate" | "help" | "-h" | "--help") | None
        ) {
            args.insert(i + 1, "run".into());
        }
    }
    args
}

#[derive(clap::Args)]
struct ShowArgs {
    /// A profile (`moxie profile -o`, `moxie serve --profile-out`).
    profile: PathBuf,
    /// Also draw the layers x experts heatmap and the per-layer concentration as SVG here.
    #[arg(long)]
    svg: Option<PathBuf>,
}

#[derive(clap::Args)]
struct Collect {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompts, one per line (empty lines skipped).
    #[arg(short = 'f', long = "file", conflicts_with = "chat_file")]
    file: Option<PathBuf>,
    /// Conversations, one JSON object per line with OpenAI-style `messages`, each rendered with
    /// the model's chat template.
    #[arg(long = "chat-file")]
    chat_file: Option<PathBuf>,
    /// With -f: wrap each prompt as a user message in the model's chat template.
    #[arg(long)]
    chat: bool,
    /// Tokens generated (greedily) after each prompt.
    #[arg(short = 'n', long = "n-predict", default_value_t = 64)]
    n_predict: usize,
    /// Physical (micro-)batch size for prompt processing (also `-ub`).
    #[arg(long = "ubatch-size", default_value_t = 512)]
    ubatch_size: usize,
    /// Where to write the profile.
    #[arg(short = 'o', long = "out", default_value = "profile.json")]
    out: PathBuf,
    /// Also write every routed token's selections (token x layer x top-k) here, for
    /// `moxie profile simulate`.
    #[arg(long)]
    trace: Option<PathBuf>,
}

pub fn main(a: Args, matches: &ArgMatches) -> Result<()> {
    match a.cmd {
        Sub::Show(s) => show(s),
        Sub::Simulate(s) => simulate(s),
        Sub::Run(c) => collect(*c, matches.subcommand_matches("run").unwrap_or(matches)),
    }
}

/// The prompts' texts and whether special tokens in them are parsed (rendered templates).
fn prompts(c: &Collect, tok: &moxie_tokenizer::Tokenizer) -> Result<Vec<(String, bool)>> {
    let read = |p: &PathBuf| {
        std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
    };
    let template = || moxie_tokenizer::ChatTemplate::from_tokenizer(tok).context("chat template");
    let extra = serde_json::Map::new();
    let mut out = Vec::new();
    match (&c.file, &c.chat_file) {
        (Some(f), None) => {
            let tpl = if c.chat { Some(template()?) } else { None };
            for line in read(f)?.lines().filter(|l| !l.trim().is_empty()) {
                match &tpl {
                    Some(t) => {
                        let msgs = vec![serde_json::json!({"role": "user", "content": line})];
                        out.push((t.render(&msgs, true, &extra)?, true));
                    }
                    None => out.push((line.to_owned(), false)),
                }
            }
        }
        (None, Some(f)) => {
            let tpl = template()?;
            for (i, line) in read(f)?.lines().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                let v: serde_json::Value = serde_json::from_str(line)
                    .with_context(|| format!("{} line {}: not JSON", f.display(), i + 1))?;
                let Some(msgs) = v["messages"].as_array() else {
                    bail!("{} line {}: no \"messages\" array", f.display(), i + 1);
                };
                out.push((tpl.render(msgs, true, &extra)?, true));
            }
        }
        _ => bail!("moxie profile needs prompts: -f PROMPTS.txt or --chat-file F.jsonl"),
    }
    if out.is_empty() {
        bail!("no prompts in the file");
    }
    Ok(out)
}

fn collect(c: Collect, matches: &ArgMatches) -> Result<()> {
    if c.ubatch_size == 0 {
        bail!("-ub must be positive");
    }
    let model = load_model(&c.model, matches, None, c.ubatch_size)?;
    let tok = load_tokenizer(model.file.metadata())?;
    let texts = prompts(&c, &tok)?;
    let par = c.model.parallel();
    let n_ctx = c.model.context_size(model.config.n_ctx_train);
    let params = GenParams {
        n_predict: c.n_predict,
        ubatch: c.ubatch_size,
    };
    if let Some(t) = &c.trace {
        model.routing.trace_to(t)?;
    }
    let (mut n_prompt, mut n_gen) = (0, 0);
    let t0 = std::time::Instant::now();
    for (i, (text, special)) in texts.iter().enumerate() {
        let prompt = tok.encode(text, true, *special);
        if prompt.is_empty() || prompt.len() + c.n_predict > n_ctx {
            eprintln!(
                "prompt {}: {} tokens + {} generated do not fit the context of {n_ctx}: skipped",
                i + 1,
                prompt.len(),
                c.n_predict
            );
            continue;
        }
        let mut cache = model.new_state_typed(Some(n_ctx), c.model.cache_types.types())?;
        let mut sampler = Sampler::new(SamplerConfig::greedy());
        let stats = generate(
            &model,
            &mut cache,
            &par,
            &prompt,
            &params,
            &mut sampler,
            |t| !tok.is_eog(t),
        )?;
        n_prompt += stats.n_prompt;
        n_gen += stats.n_generated;
    }
    model.routing.finish_trace()?;
    let profile = model.routing_profile()?;
    if profile.layers.is_empty() {
        bail!(
            "{} has no routed experts to profile",
            c.model.model.display()
        );
    }
    profile
        .write_atomic(&c.out)
        .with_context(|| format!("-o {}", c.out.display()))?;
    eprintln!(
        "profiled {} prompts ({n_prompt} prompt tokens, {n_gen} generated) in {:.1} s: {}",
        texts.len(),
        t0.elapsed().as_secs_f64(),
        c.out.display()
    );
    crate::emit(&summary(&profile))
}

fn show(s: ShowArgs) -> Result<()> {
    let p = RoutingProfile::read(&s.profile)?
        .with_context(|| format!("{} not found", s.profile.display()))?;
    crate::emit(&summary(&p))?;
    if let Some(svg) = &s.svg {
        std::fs::write(svg, heatmap_svg(&p))
            .with_context(|| format!("writing {}", svg.display()))?;
        eprintln!("wrote {}", svg.display());
    }
    Ok(())
}

fn simulate(a: SimulateArgs) -> Result<()> {
    use moxie_core::telemetry::{simulate_cache, CachePolicy, RoutingTrace};
    let budget: u64 = moxie_core::placement::parse_size_list(&a.gpu)?.iter().sum();
    let trace = RoutingTrace::read(&a.trace)?;
    let file = moxie_gguf::GgufFile::open_header_only(&a.model)?;
    // One expert's bytes per layer: its three `_exps` tensors over the expert count.
    let mut expert_bytes = vec![0u64; trace.n_layer];
    for t in file.tensors() {
        let layer = t
            .name
            .strip_prefix("blk.")
            .and_then(|r| r.split('.').next()?.parse::<usize>().ok());
        if let Some(l) = layer.filter(|&l| l < trace.n_layer && t.name.contains("_exps.")) {
            expert_bytes[l] += t.n_bytes / trace.n_expert.max(1) as u64;
        }
    }
    let policies = match &a.policy {
        Some(p) => vec![(p.clone(), CachePolicy::parse(p)?)],
        None => ["static", "lru", "lfu", "decay"]
            .map(|p| (p.to_owned(), CachePolicy::parse(p).expect("known")))
            .to_vec(),
    };
    let mib = |b: f64| b / (1u64 << 20) as f64;
    let mut out = format!(
        "{}: {} of VRAM for experts; expert bytes per token the CPU reads (all-CPU: with no \
         cache)\n\npolicy  phase    tokens  hit rate  CPU MiB/token  all-CPU MiB/token  saved\n",
        a.trace.display(),
        moxie_core::placement::human_bytes(budget)
    );
    for (name, policy) in policies {
        let s = simulate_cache(&trace, &expert_bytes, budget, policy)?;
        for (p, phase) in [(0, "prefill"), (1, "decode")] {
            if s.tokens[p] == 0 {
                continue;
            }
            let per_tok = |b: u64| mib(b as f64 / s.tokens[p] as f64);
            let hit = s.hits[p] as f64 / s.selections[p].max(1) as f64;
            let saved = 1.0 - s.cpu_bytes[p] as f64 / s.all_bytes[p].max(1) as f64;
            let _ = writeln!(
                out,
                "{name:<6}  {phase:<7}  {:>6}  {:>7.1}%  {:>13.2}  {:>17.2}  {:>4.1}%",
                s.tokens[p],
                hit * 100.0,
                per_tok(s.cpu_bytes[p]),
                per_tok(s.all_bytes[p]),
                saved * 100.0
            );
        }
    }
    crate::emit(&out)
}

/// The per-layer table: tokens (prompt / generated), experts for 50% and 90% of the
/// selections, the busiest expert and its share, and experts never selected.
fn summary(p: &RoutingProfile) -> String {
    let mut s = format!(
        "{}: {} MoE layers, {} experts each (uniform routing: 50% of selections take {} \
         experts)\n\nlayer  prompt tok  gen tok  experts for 50%  for 90%  busiest (share)  \
         never\n",
        p.arch,
        p.layers.len(),
        p.n_expert,
        p.n_expert.div_ceil(2)
    );
    for l in &p.layers {
        let c = l.total_counts();
        let (top, share) = l.busiest();
        let _ = writeln!(
            s,
            "{:>5}  {:>10}  {:>7}  {:>15}  {:>7}  {:>7} ({:>4.1}%)  {:>5}",
            l.layer,
            l.tokens[0],
            l.tokens[1],
            l.experts_for_share(None, 0.5),
            l.experts_for_share(None, 0.9),
            top,
            share * 100.0,
            c.iter().filter(|&&n| n == 0).count()
        );
    }
    s
}

/// A layers x experts heatmap (cell shade: the expert's share of its layer's selections,
/// relative to the layer's busiest) above a bar per layer of the experts that took 90% of its
/// selections, as an SVG document.
fn heatmap_svg(p: &RoutingProfile) -> String {
    let (cell, left, top) = (6usize, 60usize, 30usize);
    let (n_l, n_e) = (p.layers.len(), p.n_expert);
    let (w, map_h) = (left + n_e * cell + 20, n_l * cell);
    let bars_top = top + map_h + 40;
    let bar_h = 8;
    let h = bars_top + n_l * (bar_h + 2) + 30;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
         font-family=\"sans-serif\" font-size=\"10\">\n<rect width=\"100%\" height=\"100%\" \
         fill=\"white\"/>\n<text x=\"{left}\" y=\"15\">{} routing: layers (rows) x experts \
         (columns), darker = more selections</text>\n",
        p.arch
    );
    for (row, l) in p.layers.iter().enumerate() {
        let c = l.total_counts();
        let max = c.iter().copied().max().unwrap_or(0).max(1) as f64;
        let y = top + row * cell;
        if row % 5 == 0 {
            let _ = writeln!(
                s,
                "<text x=\"5\" y=\"{}\">layer {}</text>",
                y + cell,
                l.layer
            );
        }
        for (e, &n) in c.iter().enumerate() {
            let shade = 255 - (n as f64 / max * 255.0).round() as u32;
            let _ = writeln!(
                s,
                "<rect x=\"{}\" y=\"{y}\" width=\"{cell}\" height=\"{cell}\" \
                 fill=\"rgb({shade},{shade},255)\"/>",
                left + e * cell
            );
        }
    }
    let _ = writeln!(
        s,
        "<text x=\"{left}\" y=\"{}\">experts that took 90% of each layer's selections (of {n_e})</text>",
        bars_top - 8
    );
    for (row, l) in p.layers.iter().enumerate() {
        let n90 = l.experts_for_share(None, 0.9);
        let y = bars_top + row * (bar_h + 2);
        let len = n90 * cell;
        let _ = writeln!(
            s,
            "<rect x=\"{left}\" y=\"{y}\" width=\"{len}\" height=\"{bar_h}\" fill=\"steelblue\"/>\
             <text x=\"{}\" y=\"{}\">{n90}</text><text x=\"5\" y=\"{}\">{}</text>",
            left + len + 4,
            y + bar_h,
            y + bar_h,
            l.layer
        );
    }
    s.push_str("</svg>\n");
    s
}
