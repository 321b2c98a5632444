//! `moxie quantize`: llama-quantize's command (same arguments, flags and per-tensor type
//! rules; the output is byte-identical to llama-quantize's where moxie has the quantizers),
//! streaming: the input is memory-mapped and each tensor is quantized in slabs of rows, in
//! parallel over `-t` threads, and written as it goes. Output can be split into
//! `OUT-00001-of-0000N.gguf` parts (gguf-split's `--split-max-size` / `--split-max-tensors`).
//!
//! Port of llama.cpp's tools/quantize/quantize.cpp (command line, imatrix loading and keys)
//! and src/llama-quant.cpp (`llama_model_quantize_impl`: metadata, tensor order, the main
//! loop); the type rules and file types are moxie-core's [`moxie_core::quant_rules`] (shared
//! with `moxie gen`).

mod imatrix;
mod progress;

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{bail, Context, Result};
use fancy_regex::Regex;
use moxie_gguf::{split_path, GgmlType, GgufFile, GgufStreamWriter, GgufWriter, TensorInfo, Value};
use moxie_quant::ImatrixQuantizer;

use moxie_core::quant_rules::{ftype, rules, Ftype, ModelInfo, Params, Planner};
use progress::{human_bytes, Progress};

#[derive(clap::Args)]
#[command(after_help = quantize_help())]
pub struct Args {
    /// Input GGUF (F32 / F16 / BF16 master; all parts of a split model are read).
    input: PathBuf,
    /// `OUT TYPE [NTHREADS]`, or `TYPE [NTHREADS]` to write `ggml-model-TYPE.gguf` next to
    /// the input. TYPE is a llama-quantize file type (below), in any case, or its number.
    #[arg(value_name = "OUT TYPE [NTHREADS]", num_args = 1..=3, required = true)]
    rest: Vec<String>,
    /// Quantize tensors whose name matches REGEX (searched, ECMAScript-like syntax, lowercased
    /// as llama-quantize does) to TYPE, e.g. `--tensor-type "blk\.(3|4)\.ffn_down_exps=q6_k"`.
    /// Repeatable; the first matching pattern wins. Fallbacks for rows that do not split into
    /// TYPE's blocks still apply.
    #[arg(long = "tensor-type", value_name = "REGEX=TYPE")]
    tensor_type: Vec<String>,
    /// A file of REGEX=TYPE entries separated by spaces or newlines.
    #[arg(long = "tensor-type-file", value_name = "FILE")]
    tensor_type_file: Vec<PathBuf>,
    /// No mix: every quantized tensor gets TYPE's block type (or its fallback).
    #[arg(long)]
    pure: bool,
    /// Importance matrix from llama-imatrix (GGUF or legacy .dat).
    #[arg(long, value_name = "FILE")]
    imatrix: Option<PathBuf>,
    /// Use the importance matrix only for tensors whose name contains NAME (repeatable).
    #[arg(
        long = "include-weights",
        value_name = "NAME",
        conflicts_with = "exclude_weights"
    )]
    include_weights: Vec<String>,
    /// Do not use the importance matrix for tensors whose name contains NAME (repeatable).
    #[arg(long = "exclude-weights", value_name = "NAME")]
    exclude_weights: Vec<String>,
    /// Block type of output.weight (ggml type name, e.g. q6_k).
    #[arg(long = "output-tensor-type", value_name = "TYPE")]
    output_tensor_type: Option<String>,
    /// Block type of the token embeddings.
    #[arg(long = "token-embedding-type", value_name = "TYPE")]
    token_embedding_type: Option<String>,
    /// Allow requantizing tensors that are already quantized (loses quality).
    #[arg(long)]
    allow_requantize: bool,
    /// Leave output.weight unquantized.
    #[arg(long)]
    leave_output_tensor: bool,
    /// Print each tensor's type and size without writing anything (reads only the header:
    /// works on header-only files).
    #[arg(long)]
    dry_run: bool,
    /// Threads (default: all cores).
    #[arg(short = 't', long)]
    threads: Option<usize>,
    /// Split the output into parts of at most N megabytes (`M`) or gigabytes (`G`, decimal
    /// units as gguf-split), named OUT-00001-of-0000K.gguf.
    #[arg(long, value_name = "N[M|G]", conflicts_with = "split_max_tensors")]
    split_max_size: Option<String>,
    /// Split the output into parts of at most N tensors.
    #[arg(long, value_name = "N")]
    split_max_tensors: Option<usize>,
    /// No progress line and no summary.
    #[arg(short = 'q', long)]
    quiet: bool,
    /// Store the weight matrices moxie interleaves at load time (attention projections, dense,
    /// shared and routed expert FFNs and the output head, of a type and shape with a layout:
    /// Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, Q5_0 with whole groups of 16 rows) interleaved, so that loading the file skips repacking. Such tensors get their own type
    /// ids (1000 + the base type's), which llama.cpp and ik_llama.cpp refuse rather than
    /// misread. With the file type COPY, an existing quantized file is rewritten repacked.
    #[arg(long)]
    repack: bool,
}

fn quantize_help() -> String {
    let mut s = String::from("File types moxie can write (llama-quantize's names):\n  ");
    s.push_str(&ftype::supported_names().join(" "));
    s.push_str(" COPY (tensors as they are; with --repack, a repacked copy)");
    s.push_str("\nllama-quantize's IQ1/IQ2/IQ3, TQ, MXFP4 and Q1_0/Q2_0 types need quantizers moxie does not have yet.");
    s.push_str(
        "\n\nBlock types for --tensor-type / --output-tensor-type / --token-embedding-type:\n  ",
    );
    s.push_str(&ftype::writable_types().join(" "));
    s
}

/// Slab of output kept in memory while quantizing one tensor (llama-quantize uses 8 GiB).
const SLAB_BYTES: usize = 64 << 20;
/// Elements per parallel work item (llama-quantize's `min_chunk_size`).
const CHUNK_ELEMENTS: usize = 32 * 512;

/// What each input tensor becomes.
struct Job {
    /// Index into the input's tensor list.
    src: usize,
    target: GgmlType,
    /// The importance-matrix entry (`n_per_row * n_expert` weights) used for this tensor.
    imatrix: Option<String>,
    out_bytes: u64,
    /// Written with rows interleaved 16 at a time (`--repack`).
    interleave: bool,
}

pub fn main(a: Args) -> Result<()> {
    let cmd = parse_command_line(&a)?;
    // (The reader's errors name the file.) A dry run reads no tensor data, so header-only
    // files (moxie gen --header-only) can be planned too.
    let input = if a.dry_run {
        GgufFile::open_header_only(&a.input)
    } else {
        GgufFile::open(&a.input)
    }
    .context("input")?;
    let model = ModelInfo::from_metadata(input.metadata())
        .with_context(|| format!("input {}", a.input.display()))?;

    let mut imx = match &a.imatrix {
        Some(p) => Some(imatrix::load(p)?),
        None => None,
    };
    if let Some(m) = &mut imx {
        filter_imatrix(m, &a.include_weights, &a.exclude_weights);
        if m.entries.is_empty() {
            imx = None;
        }
    }
    // COPY (no file type): every tensor keeps its type.
    let params = cmd.ftype.map(|ftype| Params {
        ftype,
        output_tensor_type: cmd.output_tensor_type,
        token_embedding_type: cmd.token_embedding_type,
        pure: a.pure,
        quantize_output_tensor: !a.leave_output_tensor,
        overrides: cmd.overrides,
        has_imatrix: imx.is_some(),
    });

    // llama-quantize's tensor order: by block number, then by name.
    let mut order: Vec<usize> = (0..input.tensors().len()).collect();
    order.sort_by(|&x, &y| rules::tensor_order(&input.tensors()[x].name, &input.tensors()[y].name));
    let mut planner = params.as_ref().map(|p| {
        Planner::new(
            &model,
            p,
            order.iter().map(|&i| input.tensors()[i].name.as_str()),
        )
    });
    let mut jobs = Vec::with_capacity(order.len());
    for &i in &order {
        let t = &input.tensors()[i];
        let mut job = match (&mut planner, &params) {
            (Some(planner), Some(p)) => {
                let target = planner.target_type(&t.name, &t.dims, t.ty)?;
                check_job(&a, p, imx.as_ref(), i, t, target)?
            }
            _ => Job {
                src: i,
                target: t.ty,
                imatrix: None,
                out_bytes: t.n_bytes,
                interleave: false,
            },
        };
        job.interleave = a.repack && interleaves(t, job.target);
        jobs.push(job);
    }
    let fallbacks = planner.map(|p| p.fallbacks).unwrap_or_default();

    if let (Some(_), false) = (&imx, a.quiet) {
        // llama-quantize notes these too: quantized without importance weights.
        let missing: Vec<&str> = jobs
            .iter()
            .map(|j| &input.tensors()[j.src])
            .zip(&jobs)
            .filter(|(t, j)| j.target != t.ty && j.imatrix.is_none())
            .map(|(t, _)| t.name.as_str())
            .collect();
        if !missing.is_empty() {
            eprintln!(
                "note: the importance matrix has no weights for {} quantized tensors (quantized without): {}",
                missing.len(),
                missing.join(", ")
            );
        }
    }
    if a.dry_run {
        return dry_run(&input, &jobs, &fallbacks);
    }

    let parts = split_parts(cmd.split_max_size, a.split_max_tensors, &jobs)?;
    let out_paths: Vec<PathBuf> = if parts.len() == 1 {
        vec![cmd.out.clone()]
    } else {
        let prefix = strip_gguf(&cmd.out);
        (0..parts.len())
            .map(|i| split_path(&prefix, i, parts.len()))
            .collect()
    };
    for p in &out_paths {
        for inp in input.paths() {
            if same_file(inp, p) {
                bail!(
                    "input and output are the same file: {} (choose another output path)",
                    p.display()
                );
            }
        }
    }

    let meta = output_metadata(&input, &a, params.as_ref(), imx.as_ref())?;
    let writers = part_writers(&meta, &input, &jobs, &parts)?;

    let source = Source::open(&input)?;
    let total_in: u64 = jobs.iter().map(|j| input.tensors()[j.src].n_bytes).sum();
    let mut progress = Progress::new(a.quiet, jobs.len(), total_in);
    let mut slabs = Slabs::default();
    let mut written = Vec::new();
    let res = (|| -> Result<()> {
        for (pi, (w, range)) in writers.iter().zip(&parts).enumerate() {
            let path = &out_paths[pi];
            let mut s = w.begin(path)?;
            // Only files this run created are removed on failure.
            written.push(path.clone());
            for ji in range.clone() {
                write_tensor(
                    &input,
                    &source,
                    &jobs[ji],
                    ji,
                    imx.as_ref(),
                    cmd.threads,
                    &mut slabs,
                    &mut s,
                    &mut progress,
                )?;
            }
            s.finish()?
                .into_inner()
                .map_err(|e| e.into_error())
                .with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(())
    })();
    progress.finish();
    if let Err(e) = res {
        for p in &written {
            let _ = std::fs::remove_file(p);
        }
        return Err(e);
    }

    if !a.quiet {
        let total_out: u64 = jobs.iter().map(|j| j.out_bytes).sum();
        let n_el: u64 = input.tensors().iter().map(TensorInfo::n_elements).sum();
        let bpw = |b: u64| b as f64 * 8.0 / n_el.max(1) as f64;
        eprintln!(
            "moxie quantize: {} -> {} as {}: {} ({:.2} BPW) -> {} ({:.2} BPW), {} tensors in {:.1} s",
            a.input.display(),
            if out_paths.len() == 1 {
                out_paths[0].display().to_string()
            } else {
                format!("{} parts {}", out_paths.len(), out_paths[0].display())
            },
            cmd.ftype_name,
            human_bytes(total_in),
            bpw(total_in),
            human_bytes(total_out),
            bpw(total_out),
            jobs.len(),
            progress.elapsed(),
        );
        if !fallbacks.is_empty() {
            eprintln!(
                "{} of {} tensors required fallback quantization (rows not a multiple of the block size)",
                fallbacks.len(),
                jobs.len()
            );
        }
        if a.repack {
            let (n, bytes) = jobs
                .iter()
                .filter(|j| j.interleave)
                .fold((0, 0), |(n, b), j| (n + 1, b + j.out_bytes));
            eprintln!(
                "{n} tensors ({}) written interleaved (--repack); moxie loads them without repacking",
                human_bytes(bytes)
            );
        }
    }
    Ok(())
}

/// The parsed positional arguments and type options.
struct Command {
    out: PathBuf,
    /// `None` for COPY.
    ftype: Option<Ftype>,
    ftype_name: &'static str,
    threads: usize,
    split_max_size: Option<u64>,
    output_tensor_type: Option<GgmlType>,
    token_embedding_type: Option<GgmlType>,
    overrides: Vec<(Regex, GgmlType)>,
}

fn parse_command_line(a: &Args) -> Result<Command> {
    let bad_type = |s: &str| {
        anyhow::anyhow!(
            "unknown file type '{s}'; llama-quantize's types are {} (moxie writes {})",
            ftype::NAMES
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(" "),
            ftype::supported_names().join(" ")
        )
    };
    // COPY: llama-quantize's copy-only mode (no file type; tensors keep theirs).
    let parse = |s: &str| -> Option<(Option<Ftype>, &'static str)> {
        if s.eq_ignore_ascii_case("COPY") {
            return Some((None, "COPY"));
        }
        Ftype::parse(s).map(|(f, n)| (Some(f), n))
    };
    // `IN TYPE [N]` when the first word is a file type, else `IN OUT TYPE [N]` (as llama-quantize).
    let (out, (ftype, ftype_name), nthreads) = match parse(&a.rest[0]) {
        Some(f) => {
            let dir = a.input.parent().unwrap_or(Path::new(""));
            let out = dir.join(format!("ggml-model-{}.gguf", f.1));
            if a.rest.len() > 2 {
                bail!("too many arguments after the file type: {:?}", &a.rest[2..]);
            }
            (out, f, a.rest.get(1))
        }
        None => {
            let Some(t) = a.rest.get(1) else {
                bail!(
                    "missing file type after the output path '{}' (or '{}' is not a file type)",
                    a.rest[0],
                    a.rest[0]
                );
            };
            let f = parse(t).ok_or_else(|| bad_type(t))?;
            (PathBuf::from(&a.rest[0]), f, a.rest.get(2))
        }
    };
    let Some(ftype) = ftype else {
        let typing = [
            ("--tensor-type", !a.tensor_type.is_empty()),
            ("--tensor-type-file", !a.tensor_type_file.is_empty()),
            ("--pure", a.pure),
            ("--imatrix", a.imatrix.is_some()),
            ("--output-tensor-type", a.output_tensor_type.is_some()),
            ("--token-embedding-type", a.token_embedding_type.is_some()),
            ("--leave-output-tensor", a.leave_output_tensor),
        ];
        if let Some((flag, _)) = typing.iter().find(|(_, on)| *on) {
            bail!("{flag} chooses tensor types, but COPY keeps every tensor's type");
        }
        return Ok(Command {
            out,
            ftype: None,
            ftype_name,
            threads: threads(a, nthreads)?,
            split_max_size: a
                .split_max_size
                .as_deref()
                .map(parse_split_size)
                .transpose()?,
            output_tensor_type: None,
            token_embedding_type: None,
            overrides: Vec::new(),
        });
    };
    if !ftype::can_write(ftype.default_type()) {
        bail!(
            "file type {ftype_name} ({} blocks) needs a quantizer moxie does not have yet (the IQ1/IQ2/IQ3 grid searches, TQ, MXFP4, Q1_0/Q2_0); moxie writes {}",
            ftype.default_type(),
            ftype::supported_names().join(" ")
        );
    }
    let threads = threads(a, nthreads)?;

    let mut overrides = Vec::new();
    for s in &a.tensor_type {
        overrides.push(parse_tensor_type(s, "--tensor-type")?);
    }
    for f in &a.tensor_type_file {
        let text = std::fs::read_to_string(f)
            .with_context(|| format!("--tensor-type-file {}", f.display()))?;
        for s in text.split_whitespace() {
            overrides.push(parse_tensor_type(
                s,
                &format!("--tensor-type-file {}", f.display()),
            )?);
        }
    }
    if a.split_max_tensors == Some(0) {
        bail!("--split-max-tensors must be at least 1");
    }
    Ok(Command {
        out,
        ftype: Some(ftype),
        ftype_name,
        threads,
        split_max_size: a
            .split_max_size
            .as_deref()
            .map(parse_split_size)
            .transpose()?,
        output_tensor_type: a
            .output_tensor_type
            .as_deref()
            .map(|s| parse_ggml_type(s, "--output-tensor-type"))
            .transpose()?,
        token_embedding_type: a
            .token_embedding_type
            .as_deref()
            .map(|s| parse_ggml_type(s, "--token-embedding-type"))
            .transpose()?,
        overrides,
    })
}

/// The thread count: positional `NTHREADS` or `-t`, 0 or neither meaning all cores.
fn threads(a: &Args, positional: Option<&String>) -> Result<usize> {
    let positional = match positional {
        Some(s) => Some(
            s.parse::<i64>()
                .map_err(|_| anyhow::anyhow!("invalid thread count '{s}'"))?,
        ),
        None => None,
    };
    let threads = match (positional, a.threads) {
        (Some(_), Some(_)) => bail!("thread count given twice (positional and -t)"),
        (Some(n), None) => usize::try_from(n).unwrap_or(0),
        (None, Some(n)) => n,
        (None, None) => 0,
    };
    Ok(if threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        threads
    })
}

/// Whether `--repack` writes tensor `t`, quantized to `target`, interleaved: the matrices
/// moxie interleaves at load ([`moxie_core::interleave_candidate`]) where `target` and the
/// shape have the layout.
fn interleaves(t: &TensorInfo, target: GgmlType) -> bool {
    moxie_core::interleave_candidate(&t.name)
        && moxie_quant::repack::repack_supports_shape(target, &t.dims)
}

fn parse_ggml_type(s: &str, flag: &str) -> Result<GgmlType> {
    GgmlType::from_name(s).ok_or_else(|| {
        anyhow::anyhow!(
            "{flag}: unknown type '{s}' (ggml types moxie writes: {})",
            ftype::writable_types().join(" ")
        )
    })
}

/// `REGEX=TYPE` (llama-quantize's `parse_tensor_type`: split at the first `=`, the pattern
/// lowercased).
fn parse_tensor_type(s: &str, flag: &str) -> Result<(Regex, GgmlType)> {
    let Some((pat, ty)) = s.split_once('=') else {
        bail!("{flag} '{s}': expected REGEX=TYPE");
    };
    if pat.is_empty() {
        bail!("{flag} '{s}': missing tensor name pattern before '='");
    }
    if ty.is_empty() {
        bail!("{flag} '{s}': missing type after '='");
    }
    let pat = pat.to_ascii_lowercase();
    let re = Regex::new(&pat)
        .map_err(|e| anyhow::anyhow!("{flag} '{s}': bad regular expression '{pat}': {e}"))?;
    Ok((re, parse_ggml_type(ty, flag)?))
}

/// `--include-weights` / `--exclude-weights`: substring filters on the entry names.
fn filter_imatrix(m: &mut imatrix::Imatrix, include: &[String], exclude: &[String]) {
    if !exclude.is_empty() {
        m.entries
            .retain(|k, _| !exclude.iter().any(|x| k.contains(x.as_str())));
    }
    if !include.is_empty() {
        m.entries
            .retain(|k, _| include.iter().any(|x| k.contains(x.as_str())));
    }
}

/// Checks what writing `t` as `target` needs, before anything is written.
fn check_job(
    a: &Args,
    p: &Params,
    imx: Option<&imatrix::Imatrix>,
    src: usize,
    t: &TensorInfo,
    target: GgmlType,
) -> Result<Job> {
    let name = &t.name;
    let ncols = t.dims[0];
    let out_bytes = target
        .row_bytes(ncols)
        .and_then(|rb| rb.checked_mul(t.n_rows()))
        .with_context(|| {
            format!(
                "tensor {name}: rows of {ncols} do not split into {target} blocks of {}",
                target.block_size()
            )
        })?;
    let mut job = Job {
        src,
        target,
        imatrix: None,
        out_bytes,
        interleave: false,
    };
    if target == t.ty {
        return Ok(job);
    }
    if rules::is_quantized(t.ty) && !a.allow_requantize {
        bail!(
            "tensor {name} is already quantized ({}); requantizing loses quality, pass --allow-requantize to do it anyway",
            t.ty
        );
    }
    if moxie_quant::dequantize_fn(t.ty).is_none() {
        bail!(
            "tensor {name}: moxie cannot read {} values to requantize them",
            t.ty
        );
    }
    if !ftype::can_write(target) {
        bail!(
            "tensor {name}: moxie cannot quantize to {target} yet (the IQ1/IQ2/IQ3 types need grid-search quantizers); block types moxie writes: {}",
            ftype::writable_types().join(" ")
        );
    }
    if t.dims.len() == 4 && t.dims[3] > 1 {
        bail!("tensor {name}: 4-D tensors cannot be quantized (llama-quantize handles up to 3-D)");
    }
    if let Some(m) = imx {
        if let Some(w) = m.entries.get(name) {
            let n_mat = t.dims.get(2).copied().unwrap_or(1);
            if w.len() as u64 == ncols * n_mat {
                job.imatrix = Some(name.clone());
            } else if !(name == "token_embd.weight" || name == "per_layer_token_embd.weight") {
                bail!(
                    "--imatrix: {} importance weights for tensor {name}, which needs {} ({ncols} per row x {n_mat} experts); was the matrix made for another model?",
                    w.len(),
                    ncols * n_mat
                );
            }
        }
    }
    if job.imatrix.is_some() && moxie_quant::quantize_weights_imatrix(target).is_none() {
        bail!("tensor {name}: moxie has no importance-matrix quantizer for {target}; run without --imatrix or choose another type");
    }
    if job.imatrix.is_none() && rules::requires_imatrix(name, target, p.ftype) {
        bail!(
            "tensor {name}: {target} in a {:?} file requires an importance matrix (--imatrix); without one the result is garbage",
            p.ftype
        );
    }
    Ok(job)
}

/// Parts of the output as ranges of jobs (gguf-split's strategy on the output sizes).
fn split_parts(
    max_size: Option<u64>,
    max_tensors: Option<usize>,
    jobs: &[Job],
) -> Result<Vec<std::ops::Range<usize>>> {
    let mut starts = vec![0usize];
    if let Some(max) = max_size {
        let mut cur = 0u64;
        for (i, j) in jobs.iter().enumerate() {
            let n = j.out_bytes.div_ceil(32) * 32;
            // A tensor larger than the limit gets a part of its own (gguf-split refuses one
            // only when it is the very first tensor).
            if cur + n > max && i > *starts.last().unwrap_or(&0) {
                starts.push(i);
                cur = n;
            } else {
                cur += n;
            }
        }
    } else if let Some(n) = max_tensors.filter(|&n| n > 0) {
        starts.extend((n..jobs.len()).step_by(n));
    }
    if starts.len() as u64 > moxie_gguf::MAX_SPLIT_COUNT {
        bail!(
            "{} parts is more than the split naming allows ({})",
            starts.len(),
            moxie_gguf::MAX_SPLIT_COUNT
        );
    }
    let mut parts = Vec::with_capacity(starts.len());
    for (k, &s) in starts.iter().enumerate() {
        parts.push(s..starts.get(k + 1).copied().unwrap_or(jobs.len()));
    }
    Ok(parts)
}

/// gguf-split's size: a positive integer and `M` (10^6 bytes) or `G` (10^9 bytes).
fn parse_split_size(s: &str) -> Result<u64> {
    let bad = || {
        anyhow::anyhow!("--split-max-size '{s}': expected a positive number followed by M or G (e.g. 500M, 40G)")
    };
    let (num, unit) = s.split_at(s.len().saturating_sub(1));
    let mult: u64 = match unit {
        "M" | "m" => 1_000_000,
        "G" | "g" => 1_000_000_000,
        _ => return Err(bad()),
    };
    let n: u64 = num.parse().map_err(|_| bad())?;
    if n == 0 {
        return Err(bad());
    }
    n.checked_mul(mult).ok_or_else(bad)
}

fn strip_gguf(p: &Path) -> PathBuf {
    let s = p.as_os_str().to_string_lossy();
    match s.strip_suffix(".gguf") {
        Some(stem) if !stem.is_empty() => PathBuf::from(stem),
        _ => p.to_owned(),
    }
}

/// Whether two paths name the same existing file.
fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// llama-quantize's output metadata: the input's pairs in order, then
/// `general.quantization_version` and `general.file_type` (set, so moved to the end), no
/// `split.*` keys, then the `quantize.imatrix.*` keys when an importance matrix is used.
fn output_metadata(
    input: &GgufFile,
    a: &Args,
    p: Option<&Params>,
    imx: Option<&imatrix::Imatrix>,
) -> Result<GgufWriter> {
    let mut w = GgufWriter::new();
    for (k, v) in input.metadata().iter() {
        w.add(k, v.clone())
            .with_context(|| format!("copying metadata key {k}"))?;
    }
    w.set("general.quantization_version", Value::U32(2))?;
    // COPY keeps the input's file type (llama-quantize: `ftype = ml.ftype`).
    if let Some(p) = p {
        w.set("general.file_type", Value::U32(p.ftype.id()))?;
    }
    for k in [
        moxie_gguf::KEY_SPLIT_NO,
        moxie_gguf::KEY_SPLIT_COUNT,
        moxie_gguf::KEY_SPLIT_TENSORS_COUNT,
    ] {
        w.remove(k);
    }
    if let (Some(m), Some(path)) = (imx, &a.imatrix) {
        // llama-quantize stores these strings in 128-byte buffers.
        let trunc = |s: &str| -> String {
            let mut end = s.len().min(127);
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            s[..end].to_owned()
        };
        w.set(
            "quantize.imatrix.file",
            Value::String(trunc(&path.to_string_lossy())),
        )?;
        if let Some(d) = m.datasets.first() {
            w.set("quantize.imatrix.dataset", Value::String(trunc(d)))?;
        }
        w.set(
            "quantize.imatrix.entries_count",
            Value::U32(m.entries.len() as u32),
        )?;
        if m.chunk_count > 0 {
            w.set(
                "quantize.imatrix.chunks_count",
                Value::U32(m.chunk_count as u32),
            )?;
        }
    }
    Ok(w)
}

/// One writer per part: part 0 has all metadata, every part (when split) `split.no`,
/// `split.tensors.count` and `split.count` in gguf-split's order.
fn part_writers(
    meta: &GgufWriter,
    input: &GgufFile,
    jobs: &[Job],
    parts: &[std::ops::Range<usize>],
) -> Result<Vec<GgufWriter>> {
    let mut out = Vec::with_capacity(parts.len());
    for (i, r) in parts.iter().enumerate() {
        let mut w = if i == 0 {
            meta.clone()
        } else {
            let mut w = GgufWriter::new();
            if let Some(al) = meta.get(moxie_gguf::KEY_ALIGNMENT) {
                w.add(moxie_gguf::KEY_ALIGNMENT, al.clone())?;
            }
            w
        };
        if parts.len() > 1 {
            w.set(moxie_gguf::KEY_SPLIT_NO, Value::U16(i as u16))?;
            w.set(
                moxie_gguf::KEY_SPLIT_TENSORS_COUNT,
                Value::I32(i32::try_from(jobs.len()).context("too many tensors")?),
            )?;
            w.set(moxie_gguf::KEY_SPLIT_COUNT, Value::U16(parts.len() as u16))?;
        }
        for j in &jobs[r.clone()] {
            let t = &input.tensors()[j.src];
            // ggml writes `ggml_n_dims` dimensions: trailing 1s are dropped ([256, 1] -> [256]).
            w.add_tensor_info(&t.name, &t.dims[..rules::n_dims(&t.dims)], j.target)?;
            if j.interleave {
                w.set_interleaved(&t.name)?;
            }
        }
        out.push(w);
    }
    Ok(out)
}

fn dry_run(input: &GgufFile, jobs: &[Job], fallbacks: &[rules::Fallback]) -> Result<()> {
    let mut s = String::new();
    let n = jobs.len();
    let w = n.to_string().len();
    let (mut total_in, mut total_out) = (0u64, 0u64);
    for (i, j) in jobs.iter().enumerate() {
        let t = &input.tensors()[j.src];
        let shape: Vec<String> = t.dims.iter().map(u64::to_string).collect();
        s.push_str(&format!(
            "[{:>w$}/{n}] {:<40} {:<18} {:>7} -> {:<7} {:>10} -> {:>10}{}\n",
            i + 1,
            t.name,
            format!("[{}]", shape.join(", ")),
            t.ty.name(),
            j.target.name(),
            human_bytes(t.n_bytes),
            human_bytes(j.out_bytes),
            if j.imatrix.is_some() {
                "  (imatrix)"
            } else {
                ""
            },
        ));
        total_in += t.n_bytes;
        total_out += j.out_bytes;
    }
    s.push_str(&format!(
        "model size {} -> {}; {} of {n} tensors required fallback quantization\n",
        human_bytes(total_in),
        human_bytes(total_out),
        fallbacks.len()
    ));
    crate::emit(&s)
}

/// Reads tensor data from the input's files by offset. The data is read (not touched through
/// the reader's mapping) so that only the slabs in hand are resident: a mapped input would
/// keep every page read so far in this process's memory until the end.
struct Source {
    files: Vec<(File, PathBuf)>,
}

impl Source {
    fn open(input: &GgufFile) -> Result<Source> {
        let mut files = Vec::new();
        for p in input.paths() {
            let f = File::open(p).with_context(|| format!("input {}: cannot open", p.display()))?;
            files.push((f, p.clone()));
        }
        Ok(Source { files })
    }

    /// `buf.len()` bytes of `t`'s data from byte `off` of it.
    fn read(&self, t: &TensorInfo, off: u64, buf: &mut [u8]) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let (f, p) = self
            .files
            .get(t.split)
            .with_context(|| format!("tensor {}: no input part {}", t.name, t.split))?;
        f.read_exact_at(buf, t.file_offset + off)
            .with_context(|| format!("reading tensor {} from {}", t.name, p.display()))
    }
}

/// The slab buffers (input, output), kept from tensor to tensor: allocating up to
/// [`SLAB_BYTES`] of each again for every tensor would page-fault it in every time.
#[derive(Default)]
struct Slabs {
    src: Vec<u8>,
    dst: Vec<u8>,
    /// Input rows put back in GGUF order (an interleaved input), and output rows interleaved
    /// (`--repack`).
    reorder: Vec<u8>,
    packed: Vec<u8>,
}

/// `slab` (whole groups of 16 rows of `n_in` values of `ty`) put back in GGUF order
/// (`to_interleaved` false) or interleaved, in `buf`.
fn reorder<'a>(
    ty: GgmlType,
    n_in: usize,
    slab: &[u8],
    buf: &'a mut Vec<u8>,
    to_interleaved: bool,
) -> &'a [u8] {
    let out = scratch(buf, slab.len());
    let n_rows = slab.len() / ty.row_bytes(n_in as u64).unwrap_or(1) as usize;
    if to_interleaved {
        moxie_quant::repack::repack(ty, slab, n_rows, n_in, out);
    } else {
        moxie_quant::repack::unrepack(ty, slab, n_rows, n_in, out);
    }
    out
}

/// The first `n` bytes of `buf`, grown to hold them (its contents are to be overwritten).
fn scratch(buf: &mut Vec<u8>, n: usize) -> &mut [u8] {
    if buf.len() < n {
        buf.resize(n, 0);
    }
    &mut buf[..n]
}

/// Streams one tensor: a copy when its type does not change, else quantized in slabs.
#[allow(clippy::too_many_arguments)]
fn write_tensor(
    input: &GgufFile,
    source: &Source,
    job: &Job,
    index: usize,
    imx: Option<&imatrix::Imatrix>,
    threads: usize,
    slabs: &mut Slabs,
    out: &mut GgufStreamWriter<BufWriter<File>>,
    progress: &mut Progress,
) -> Result<()> {
    let t = &input.tensors()[job.src];
    let name = &t.name;
    let n_per_row = t.dims[0] as usize;
    let n_rows = t.n_rows() as usize;
    let src_rb = t.row_bytes() as usize;
    let dst_rb = job.target.row_bytes(t.dims[0]).unwrap_or(0) as usize;
    let invalid = |what: &str, at: usize, ty: GgmlType| {
        let unit = if ty.block_size() == 1 {
            "element"
        } else {
            "block"
        };
        anyhow::anyhow!("tensor {name} has invalid data: {what} non-finite value at {unit} {at}")
    };
    if t.n_bytes == 0 || job.out_bytes == 0 {
        out.write_tensor(name, &[])?;
        return Ok(());
    }
    // Interleaved rows (read or written) go in slabs of whole groups of 16.
    let group_rows = if t.interleaved || job.interleave {
        moxie_quant::repack::REPACK_ROWS
    } else {
        1
    };
    if job.target == t.ty {
        // Copied in slabs of whole rows, each validated as llama-quantize does.
        let rows = (SLAB_BYTES / src_rb / group_rows).max(1) * group_rows;
        let buf = scratch(&mut slabs.src, (rows * src_rb).min(t.n_bytes as usize));
        let mut off = 0usize;
        while (off as u64) < t.n_bytes {
            let n = buf.len().min(t.n_bytes as usize - off);
            let slab = &mut buf[..n];
            source.read(t, off as u64, slab)?;
            let valid = |rows: &[u8]| {
                moxie_quant::validate_row_data(t.ty, rows)
                    .map_err(|i| invalid("input", i + off / t.ty.type_size(), t.ty))
            };
            // Validated in GGUF order; written in the layout the job asks for.
            if t.interleaved {
                let plain = reorder(t.ty, n_per_row, slab, &mut slabs.reorder, false);
                valid(plain)?;
                out.write_tensor_chunk(name, if job.interleave { slab } else { plain })?;
            } else {
                valid(slab)?;
                if job.interleave {
                    let packed = reorder(t.ty, n_per_row, slab, &mut slabs.reorder, true);
                    out.write_tensor_chunk(name, packed)?;
                } else {
                    out.write_tensor_chunk(name, slab)?;
                }
            }
            progress.advance(index, name, n as u64);
            off += n;
        }
        return Ok(());
    }

    let dequantize = moxie_quant::dequantize_fn(t.ty)
        .with_context(|| format!("tensor {name}: cannot read {}", t.ty))?;
    let quantize = moxie_quant::quantize_weights_fn(job.target)
        .with_context(|| format!("tensor {name}: cannot write {}", job.target))?;
    let weighted = match &job.imatrix {
        None => None,
        Some(k) => {
            let w = imx.and_then(|m| m.entries.get(k)).map(Vec::as_slice);
            match (w, moxie_quant::quantize_weights_imatrix(job.target)) {
                (Some(w), Some(ImatrixQuantizer::Weighted(f))) => Some((w, f)),
                (Some(_), Some(ImatrixQuantizer::Ignores)) => None,
                _ => bail!(
                    "tensor {name}: no importance-matrix quantizer for {}",
                    job.target
                ),
            }
        }
    };
    let rows_per_expert = t.dims.get(1).copied().unwrap_or(1) as usize;
    let chunk_rows = CHUNK_ELEMENTS.div_ceil(n_per_row).max(1);
    let slab_rows = (SLAB_BYTES / (src_rb + dst_rb).max(1) / group_rows).max(1) * group_rows;
    let slab_rows = slab_rows.min(n_rows.max(1));
    let buf = scratch(&mut slabs.dst, slab_rows * dst_rb);
    let src_buf = scratch(&mut slabs.src, slab_rows * src_rb);
    let mut r0 = 0;
    while r0 < n_rows {
        let nr = slab_rows.min(n_rows - r0);
        let src_slab = &mut src_buf[..nr * src_rb];
        source.read(t, (r0 * src_rb) as u64, src_slab)?;
        let mut src_slab = &*src_slab;
        if t.interleaved {
            src_slab = reorder(t.ty, n_per_row, src_slab, &mut slabs.reorder, false);
        }
        moxie_quant::validate_row_data(t.ty, src_slab)
            .map_err(|i| invalid("input", i + r0 * (n_per_row / t.ty.block_size()), t.ty))?;
        let dst_slab = &mut buf[..nr * dst_rb];
        let work = Mutex::new(dst_slab.chunks_mut(chunk_rows * dst_rb).enumerate());
        let n_chunks = nr.div_ceil(chunk_rows);
        std::thread::scope(|sc| {
            for _ in 0..threads.min(n_chunks).max(1) {
                sc.spawn(|| {
                    let mut row = vec![0f32; n_per_row];
                    loop {
                        let next = work.lock().unwrap_or_else(|e| e.into_inner()).next();
                        let Some((c, dst)) = next else { break };
                        for (k, drow) in dst.chunks_exact_mut(dst_rb).enumerate() {
                            let r = c * chunk_rows + k;
                            dequantize(&src_slab[r * src_rb..(r + 1) * src_rb], &mut row);
                            match weighted {
                                Some((w, f)) => {
                                    let e = (r0 + r) / rows_per_expert;
                                    f(&row, drow, &w[e * n_per_row..(e + 1) * n_per_row]);
                                }
                                None => quantize(&row, drow),
                            }
                        }
                    }
                });
            }
        });
        moxie_quant::validate_row_data(job.target, dst_slab).map_err(|_| {
            anyhow::anyhow!("tensor {name}: quantized data validation failed (non-finite scale)")
        })?;
        if job.interleave {
            // (The source slab is no longer needed: its buffer takes the interleaved rows.)
            let packed = reorder(job.target, n_per_row, dst_slab, &mut slabs.packed, true);
            out.write_tensor_chunk(name, packed)?;
        } else {
            out.write_tensor_chunk(name, dst_slab)?;
        }
        progress.advance(index, name, (nr * src_rb) as u64);
        r0 += nr;
    }
    Ok(())
}
