//! Shared by the integration tests: where the llama.cpp fixtures live, KL divergence of
//! logits, and the prefill + decode run the placement tests compare. Each test binary uses a
//! part of it.
#![allow(dead_code)]

use std::path::PathBuf;

use moxie_core::{Arch, Logits, Model, Parallel};
use serde_json::Value;

/// `$MOXIE_FIXTURES`, else `../shared/fixtures` next to the checkout. Panics (fails the test)
/// when the directory is missing: fidelity tests must not skip silently.
pub fn fixtures() -> PathBuf {
    let dir = match std::env::var_os("MOXIE_FIXTURES") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures"),
    };
    assert!(
        dir.join("golden/index.json").is_file() && dir.join("models").is_dir(),
        "fixture directory {} not found (set MOXIE_FIXTURES)",
        dir.display()
    );
    dir
}

/// The golden index (`golden/index.json`).
pub fn golden_index() -> Value {
    let path = fixtures().join("golden/index.json");
    serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
}

/// A fixture model moxie can run, with its golden index entry.
pub struct FixtureModel {
    pub stem: String,
    pub arch: String,
    pub path: PathBuf,
    /// Every tensor is F32 (the masters: tighter bounds).
    pub is_f32: bool,
    pub entry: Value,
}

/// The fixture models whose architecture moxie runs and whose every block type it can compute
/// with, sorted by name. Tests that go over "every fixture" take these, so a model moxie should
/// run never drops out silently. Their goldens come from llama.cpp or, where the entry's
/// `reference_engine` says so, from ik_llama.cpp ([`is_ik`]).
pub fn supported_models(index: &Value) -> Vec<FixtureModel> {
    let mut out = Vec::new();
    for (stem, entry) in index["models"].as_object().expect("models") {
        let arch = entry["arch"].as_str().unwrap_or("");
        if Arch::from_name(arch).is_err() {
            continue;
        }
        let types = entry["tensor_types"].as_object().expect("tensor_types");
        let computable = |t: &String| {
            moxie_quant::GgmlType::from_name(t)
                .and_then(moxie_quant::vec_dot_type)
                .is_some()
        };
        if !types.keys().all(computable) {
            continue;
        }
        out.push(FixtureModel {
            stem: stem.clone(),
            arch: arch.to_string(),
            path: fixtures().join("models").join(format!("{stem}.gguf")),
            is_f32: types.keys().all(|t| t == "F32"),
            entry: entry.clone(),
        });
    }
    out.sort_by(|a, b| a.stem.cmp(&b.stem));
    out
}

/// A golden sequence's token ids (its `token_ids`).
pub fn token_ids(seq: &Value) -> Vec<u32> {
    seq["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

/// Whether this fixture's goldens come from ik_llama.cpp (its own block types), not llama.cpp.
pub fn is_ik(m: &FixtureModel) -> bool {
    m.entry["reference_engine"].as_str() == Some("ik_llama.cpp")
}

/// ik_llama.cpp measured against itself on sequence `seq` of an ik fixture (`entry`'s
/// `determinism_checks`): (mean KLD, top-1 agreement) of its batch-1 run against its batch-512
/// goldens. Its kernels change with the batch size, so this is the scale of the differences
/// its own arithmetic makes.
pub fn ik_own(entry: &Value, seq: &str) -> (f64, f64) {
    let own = &entry["determinism_checks"][seq];
    let kld = own["mean_kld_batch1_vs_512"]
        .as_f64()
        .expect("mean_kld_batch1_vs_512");
    let top1 = own["argmax_agree_batch1_vs_512"]
        .as_f64()
        .expect("argmax_agree_batch1_vs_512");
    (kld, top1)
}

/// [`ik_own`] over all positions of an ik fixture's golden sequences (each sequence weighted
/// by its tokens, as a file's positions are pooled).
pub fn ik_own_pooled(entry: &Value) -> (f64, f64) {
    let (mut n, mut kld, mut top1) = (0.0, 0.0, 0.0);
    for (seq, s) in entry["sequences"].as_object().expect("sequences") {
        let tokens = s["token_ids"].as_array().expect("token_ids").len() as f64;
        let (k, t) = ik_own(entry, seq);
        n += tokens;
        kld += tokens * k;
        top1 += tokens * t;
    }
    (kld / n, top1 / n)
}

/// The bounds of an ik_llama.cpp file (golden.rs's module doc), from those of any other
/// quantized file (`core_kld`, `core_top1`) and ik's own distance ([`ik_own`]): mean KLD at
/// most max(core, 2 x ik's own), top-1 agreement at least min(core, ik's own - 5 points).
pub fn ik_bound(core_kld: f64, core_top1: f64, own_kld: f64, own_top1: f64) -> (f64, f64) {
    (core_kld.max(2.0 * own_kld), core_top1.min(own_top1 - 0.05))
}

/// Layer `il` of a tensor named `blk.{il}.…`, and the rest of its name.
pub fn block(name: &str) -> Option<(usize, &str)> {
    let rest = name.strip_prefix("blk.")?;
    let (il, rest) = rest.split_once('.')?;
    Some((il.parse().ok()?, rest))
}

/// Prefill of 19 tokens (all logits), then 3 one-token steps (decode paths).
pub fn prefill_and_decode(model: &Model, par: &Parallel) -> Vec<f32> {
    let n_vocab = model.config.n_vocab as u32;
    let tokens: Vec<u32> = (0..22u32).map(|i| (i * 37 + 5) % n_vocab).collect();
    let mut cache = model.new_state(Some(64)).unwrap();
    let mut all = model
        .forward(&tokens[..19], &mut cache, par, Logits::All)
        .unwrap();
    for &t in &tokens[19..] {
        all.extend(model.forward(&[t], &mut cache, par, Logits::Last).unwrap());
    }
    all
}

pub fn log_softmax(x: &[f32]) -> Vec<f64> {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = x.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln() + max;
    x.iter().map(|&v| v as f64 - lse).collect()
}

/// KL(p ‖ q) per row, with p, q the softmaxes of the rows of `a`, `b`.
pub fn kld_per_row(a: &[f32], b: &[f32], n_vocab: usize) -> Vec<f64> {
    (0..a.len() / n_vocab)
        .map(|r| {
            let lp = log_softmax(&a[r * n_vocab..(r + 1) * n_vocab]);
            let lq = log_softmax(&b[r * n_vocab..(r + 1) * n_vocab]);
            lp.iter()
                .zip(&lq)
                .map(|(p, q)| p.exp() * (p - q))
                .sum::<f64>()
        })
        .collect()
}

/// A fresh directory `moxie-{what}-{pid}` under the target dir's tmp (emptied first), for a
/// test's generated files.
#[allow(dead_code)] // not every test binary writes files
pub fn tmp_dir(what: &str) -> PathBuf {
    let base = std::env::var_os("CARGO_TARGET_TMPDIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let d = base.join(format!("moxie-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}
