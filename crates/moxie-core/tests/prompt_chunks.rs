//! Prompt batches large enough that the CPU side bounds its largest buffers give the logits of
//! the same prompt fed in pieces small enough that nothing is cut:
//! - MLA takes the absorbed queries, the attention over the latent and the heads' values in
//!   chunks of 128 tokens (each chunk attends to exactly the positions up to its own tokens,
//!   with its own rotary positions);
//! - the routed experts' down projections and their weighted sum go in passes over the output
//!   rows once a batch's results would pass 8 MiB (n x k_used x n_embd floats).

use std::sync::Arc;

use moxie_core::blocks::moe::{self, MoeScratch};
use moxie_core::blocks::Ffn;
use moxie_core::synth::{self, SynthSpec, SynthType};
use moxie_core::{Logits, Model, Parallel};
use moxie_gguf::GgufFile;

mod common;

/// Logits of every position of `tokens`, fed in batches of `batch`.
fn logits(model: &Model, tokens: &[u32], batch: usize) -> Vec<f32> {
    let par = Parallel::new(2);
    let mut state = model.new_state(Some(tokens.len())).unwrap();
    let mut all = Vec::new();
    for piece in tokens.chunks(batch) {
        all.extend(model.forward(piece, &mut state, &par, Logits::All).unwrap());
    }
    all
}

/// How many values of `a` and `b` differ in their bits.
fn differing_bits(a: &[f32], b: &[f32]) -> usize {
    a.iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count()
}

#[test]
fn a_long_mla_batch_matches_the_prompt_in_pieces() {
    for stem in ["deepseek2-tiny-F32", "deepseek2-tiny-Q4_K_M"] {
        let path = common::fixtures().join(format!("models/{stem}.gguf"));
        let model = Model::load(Arc::new(GgufFile::open(&path).unwrap())).unwrap();
        let n_vocab = model.config.n_vocab;
        // 300 tokens: two whole chunks and a partial one.
        let tokens: Vec<u32> = (0..300u32)
            .map(|i| (i * 211 + 3) % n_vocab as u32)
            .collect();
        let whole = logits(&model, &tokens, 512);
        let pieces = logits(&model, &tokens, 128);
        assert_eq!(whole.len(), 300 * n_vocab);
        // Bit for bit: the chunks are multiples of the products' 16-token tiles, and every
        // other block computes each token's row alone.
        assert_eq!(
            differing_bits(&whole, &pieces),
            0,
            "{stem}: logits differ from the prompt in pieces"
        );
    }
}

#[test]
fn down_projections_in_passes_match_the_layer_in_pieces() {
    // 512 tokens x 8 experts x 2048 rows of down products are 32 MiB: four passes of 512 rows;
    // 64 tokens need one. All 8 experts take every token, so each runs the int8 GEMM in both.
    let mut spec = SynthSpec::preset("qwen3moe-tiny").unwrap();
    for (k, v) in [
        ("n_embd", "2048"),
        ("n_expert_used", "8"),
        ("n_ff_exp", "64"),
    ] {
        spec.shape.set(k, v).unwrap();
    }
    spec.ty = SynthType::parse("Q8_0").unwrap();
    let dir = std::env::var_os("CARGO_TARGET_TMPDIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let path = dir.join(format!("moxie-down-passes-{}.gguf", std::process::id()));
    synth::generate(&spec, &path).unwrap();
    let model = Model::load(Arc::new(GgufFile::open(&path).unwrap())).unwrap();
    let _ = std::fs::remove_file(&path);
    let n_embd = model.config.n_embd;
    let Ffn::Moe(m) = &model.layers[0].ffn else {
        panic!("qwen3moe's first layer is MoE")
    };
    // Pseudo-random layer inputs.
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let h: Vec<f32> = (0..512 * n_embd)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    let par = Parallel::new(2);
    let mut scratch = MoeScratch::default();
    let whole = moe::forward(m, &h, 512, &par, &mut scratch)
        .unwrap()
        .to_vec();
    let mut pieces: Vec<f32> = Vec::new();
    for piece in h.chunks(64 * n_embd) {
        pieces.extend(moe::forward(m, piece, 64, &par, &mut scratch).unwrap());
    }
    assert_eq!(whole.len(), 512 * n_embd);
    assert_eq!(
        differing_bits(&whole, &pieces),
        0,
        "the MoE layer's outputs differ from the layer in pieces"
    );
}
