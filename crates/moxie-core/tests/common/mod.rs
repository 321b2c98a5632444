//! Shared by the integration tests: where the llama.cpp fixtures live, KL divergence of
//! logits, and the prefill + decode run the placement tests compare. Each test binary uses a
//! part of it.
#![allow(dead_code)]

use std::path::PathBuf;

use moxie_core::{Logits, Model, Parallel};

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
    let mut cache = model.new_cache(Some(64)).unwrap();
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
