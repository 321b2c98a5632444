//! `moxie inspect MODEL [--json] [--dump TENSOR --out FILE.npy]`

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Result};
use moxie_core::inventory::{Inventory, Role, Tally};
use moxie_gguf::{GgufFile, Value};
use serde_json::json;

#[derive(clap::Args)]
pub struct Args {
    /// GGUF file (the first part of a split model).
    model: PathBuf,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Read only the header and tensor index (for header-only files).
    #[arg(long)]
    header_only: bool,
    /// Write this tensor, dequantized to F32, to the file given by --out (NumPy .npy; its
    /// shape is ggml's ne reversed, so rows are the last axis) instead of printing the
    /// summary.
    #[arg(long, value_name = "TENSOR", requires = "out")]
    dump: Option<String>,
    /// Output file of --dump.
    #[arg(long, value_name = "FILE.npy", requires = "dump")]
    out: Option<PathBuf>,
}

fn gb(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

fn value_summary(v: &Value) -> String {
    match v {
        Value::String(s) if s.len() > 80 => {
            format!("{:?}… ({} chars)", &s[..s.floor_char_boundary(60)], s.len())
        }
        Value::String(s) => format!("{s:?}"),
        Value::Array(a) => format!("[array of {} {:?}]", a.len(), a.elem_type),
        other => value_plain(other).to_string(),
    }
}

fn value_plain(v: &Value) -> serde_json::Value {
    match v {
        Value::Bool(b) => json!(b),
        Value::String(s) => json!(s),
        Value::Array(a) => json!(format!("array[{}]", a.len())),
        _ => match (v.as_i64(), v.as_u64(), v.as_f64()) {
            (Some(i), _, _) => json!(i),
            (_, Some(u), _) => json!(u),
            (_, _, Some(f)) => json!(f),
            _ => json!(null),
        },
    }
}

fn tally_json(t: &Tally) -> serde_json::Value {
    json!({"bytes": t.bytes, "tensors": t.tensors, "by_type": t.by_type})
}

fn types(t: &Tally) -> String {
    t.by_type
        .iter()
        .map(|(k, v)| format!("{k} {}", gb(*v)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `--dump`: one tensor dequantized to F32, row by row, straight to the file (an expert
/// tensor of a big model is larger than memory once dequantized).
fn dump(f: &GgufFile, name: &str, out: &Path) -> Result<()> {
    let t = f.tensor(name).ok_or_else(|| {
        anyhow!(
            "no tensor '{name}' in {} (`moxie inspect --json` lists the tensors by role; names are \
             like blk.0.attn_q.weight)",
            f.paths()[0].display()
        )
    })?;
    let dequantize = moxie_quant::dequantize_fn(t.ty).ok_or_else(|| {
        anyhow!(
            "tensor '{name}' has type {}, which moxie cannot dequantize",
            t.ty
        )
    })?;
    let data = f.tensor_data(t)?;
    let row_len = usize::try_from(t.row_len())?;
    let row_bytes = usize::try_from(t.row_bytes())?;
    let shape: Vec<usize> = t
        .dims
        .iter()
        .rev()
        .map(|&d| usize::try_from(d))
        .collect::<Result<_, _>>()?;
    let mut w = moxie_core::npy::NpyWriter::create(out, &shape)?;
    let mut row = vec![0f32; row_len];
    // Interleaved rows (moxie quantize --repack) are put back in GGUF order 16 at a time.
    let group_rows = if t.interleaved {
        moxie_quant::repack::REPACK_ROWS
    } else {
        1
    };
    let mut plain = vec![0u8; group_rows * row_bytes];
    for group in data.chunks_exact((group_rows * row_bytes).max(1)) {
        let rows = if t.interleaved {
            moxie_quant::repack::unrepack(t.ty, group, group_rows, row_len, &mut plain);
            &plain[..]
        } else {
            group
        };
        for bytes in rows.chunks_exact(row_bytes.max(1)) {
            dequantize(bytes, &mut row);
            w.write(&row)?;
        }
    }
    w.finish()?;
    eprintln!(
        "wrote {name} ({}, ne {:?}) as F32 {shape:?} to {}",
        t.ty,
        t.dims,
        out.display()
    );
    Ok(())
}

pub fn main(a: Args) -> Result<()> {
    let mut o = String::new();
    let f = if a.header_only {
        GgufFile::open_header_only(&a.model)?
    } else {
        GgufFile::open(&a.model)?
    };
    if let (Some(name), Some(out)) = (&a.dump, &a.out) {
        if f.is_header_only() {
            bail!("{} holds no tensor data to dump", a.model.display());
        }
        return dump(&f, name, out);
    }
    let inv = Inventory::of(f.tensors());
    let meta = f.metadata();
    let config = moxie_core::Config::from_metadata(meta);
    if a.json {
        let mut md = serde_json::Map::new();
        for (k, v) in meta.iter() {
            if k.starts_with("tokenizer.ggml.") && matches!(v, Value::Array(_)) {
                md.insert(
                    k.to_string(),
                    json!(format!("array[{}]", v.as_array().map_or(0, |a| a.len()))),
                );
            } else {
                md.insert(k.to_string(), value_plain(v));
            }
        }
        let roles: serde_json::Map<_, _> = inv
            .by_role
            .iter()
            .map(|(r, t)| (r.name().to_string(), tally_json(t)))
            .collect();
        let layers: Vec<_> = inv
            .by_layer
            .iter()
            .map(|(l, roles)| {
                let r: serde_json::Map<_, _> = roles
                    .iter()
                    .map(|(r, t)| (r.name().to_string(), tally_json(t)))
                    .collect();
                json!({"layer": l, "roles": r})
            })
            .collect();
        let out = json!({
            "files": f.paths(),
            "version": f.version(),
            "alignment": f.alignment(),
            "interleaved_tensors": f.tensors().iter().filter(|t| t.interleaved).count(),
            "architecture": meta.get_str("general.architecture"),
            "supported": config.as_ref().map(|_| true).unwrap_or(false),
            "config_error": config.as_ref().err().map(|e| e.to_string()),
            "metadata": md,
            "total": tally_json(&inv.total),
            "by_role": roles,
            "layers": layers,
        });
        writeln!(o, "{}", serde_json::to_string_pretty(&out)?)?;
        return crate::emit(&o);
    }
    writeln!(
        o,
        "file(s):      {}",
        f.paths()
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    writeln!(
        o,
        "GGUF v{}, alignment {}, {} metadata keys, {} tensors, {}",
        f.version(),
        f.alignment(),
        meta.len(),
        f.tensors().len(),
        gb(inv.total.bytes)
    )?;
    let (n_interleaved, interleaved_bytes) = f
        .tensors()
        .iter()
        .filter(|t| t.interleaved)
        .fold((0, 0), |(n, b), t| (n + 1, b + t.n_bytes));
    if n_interleaved > 0 {
        writeln!(
            o,
            "{n_interleaved} tensors ({}) stored with rows interleaved by 16 (moxie quantize \
             --repack; type ids 1000 + the base type's, which only moxie reads)",
            gb(interleaved_bytes)
        )?;
    }
    writeln!(o)?;
    writeln!(o, "metadata:")?;
    for (k, v) in meta.iter() {
        writeln!(o, "  {k:<48} {}", value_summary(v))?;
    }
    match &config {
        Ok(c) => writeln!(
            o,
            "\nmoxie: {} — {} layers ({} dense), {} experts top-{} + {} shared, hidden {}, vocab {}",
            c.arch.name(),
            c.n_layer,
            c.n_layer_dense_lead,
            c.n_expert,
            c.n_expert_used,
            c.n_expert_shared,
            c.n_embd,
            c.n_vocab
        )?,
        Err(e) => writeln!(o, "\nmoxie cannot run this model: {e}")?,
    }
    writeln!(o, "\ntensors by role:")?;
    writeln!(
        o,
        "  {:<16} {:>8} {:>12} {:>7}  types",
        "role", "tensors", "bytes", "share"
    )?;
    for (r, t) in &inv.by_role {
        writeln!(
            o,
            "  {:<16} {:>8} {:>12} {:>6.2}%  {}",
            r.name(),
            t.tensors,
            gb(t.bytes),
            100.0 * t.bytes as f64 / inv.total.bytes.max(1) as f64,
            types(t)
        )?;
    }
    writeln!(o, "\nper layer:")?;
    // The per-block roles this file has (an indexer or recurrent column only where a model
    // has them).
    let cols: Vec<Role> = [
        Role::Attention,
        Role::Indexer,
        Role::Recurrent,
        Role::DenseFfn,
        Role::SharedExperts,
        Role::RoutedExperts,
        Role::Router,
        Role::Norms,
        Role::NextN,
    ]
    .into_iter()
    .filter(|r| inv.by_layer.values().any(|roles| roles.contains_key(r)))
    .collect();
    write!(o, "  {:>5}", "layer")?;
    for c in &cols {
        write!(o, " {:>15}", c.name())?;
    }
    writeln!(o, "  routed-expert types")?;
    for (l, roles) in &inv.by_layer {
        write!(o, "  {l:>5}")?;
        for c in &cols {
            let b = roles.get(c).map_or(0, |t| t.bytes);
            write!(o, " {:>15}", if b == 0 { "-".to_string() } else { gb(b) })?;
        }
        writeln!(
            o,
            "  {}",
            roles
                .get(&Role::RoutedExperts)
                .map(types)
                .unwrap_or_default()
        )?;
    }
    crate::emit(&o)
}
