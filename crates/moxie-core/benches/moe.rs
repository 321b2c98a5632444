//! Micro-benchmark of the fused MoE layer (`moxie_core::blocks::moe::forward`): routing, every
//! selected expert's gate/up/SiLU·mul/down and the weighted sum, plus the shared expert, as the
//! forward pass runs it. Reported as weight bytes read per second (divan's `BytesCount`, GB/s).
//!
//! ```text
//! cargo bench -p moxie-core --bench moe                  # ~1 min to generate the layers, then ~30 s
//! cargo bench -p moxie-core --bench moe -- decode        # one group (divan filter)
//! ```
//!
//! The layers are `bench-deepseek2`'s (hidden 1536, 64 experts x 512, top-6 + 1 shared,
//! Q4_K_M: Q4_K gate/up, Q4_K or Q6_K down), 8 MoE layers generated once into the system temp
//! directory (~700 MB, more than any L3), and each iteration runs the next layer on fresh
//! pseudo-random inputs, so weights come from memory and routing varies as in decode.
//!
//! * `decode`: one token. Bytes = router + shared expert + 6/64 of the layer's routed experts
//!   (what one token must read).
//! * `batch64`: 64 tokens (a prefill micro-batch; nearly every expert is selected). Bytes = the
//!   whole layer.
//!
//! Threads: 1 and 2 (the pool is built outside the timed loop). Under `cargo test --benches`
//! (divan's test mode) the tiny deepseek2 preset is used instead, so the check stays fast. Not
//! a test: nothing about time is asserted.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use divan::counter::BytesCount;
use divan::{black_box, Bencher};
use moxie_core::blocks::{Ffn, Moe};
use moxie_core::synth::{self, SynthSpec, SynthType};
use moxie_core::{Model, Parallel};
use moxie_gguf::GgufFile;

fn main() {
    divan::main();
}

fn test_mode() -> bool {
    std::env::args().any(|a| a == "--test")
}

/// The generated model (cached in the temp dir between runs).
fn model() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| {
        let (preset, layers, name) = if test_mode() {
            ("deepseek2-tiny", 3, "moxie-moe-bench-tiny.gguf")
        } else {
            ("bench-deepseek2", 9, "moxie-moe-bench-ds-9l.gguf")
        };
        let path: PathBuf = std::env::temp_dir().join(name);
        if !path.exists() {
            let mut spec = SynthSpec::preset(preset).expect("preset exists");
            spec.ty = SynthType::parse("Q4_K_M").expect("type exists");
            spec.shape.set("n_layer", &layers.to_string()).unwrap();
            spec.shape.set("n_vocab", "2048").unwrap();
            let tmp = path.with_extension("partial");
            synth::generate(&spec, &tmp).expect("generate the benchmark layers");
            std::fs::rename(&tmp, &path).unwrap();
        }
        let file = Arc::new(GgufFile::open(&path).expect("open the benchmark layers"));
        Model::load(file).expect("load the benchmark layers")
    })
}

fn moe_layers() -> Vec<&'static Moe> {
    model()
        .layers
        .iter()
        .filter_map(|l| match &l.ffn {
            Ffn::Moe(m) => Some(&**m),
            Ffn::Dense(_) => None,
        })
        .collect()
}

fn tensor_bytes(t: &moxie_core::tensor::Tensor) -> u64 {
    t.data().len() as u64
}

/// Bytes one token reads in `m` (`all_experts`: every routed expert instead of top-k).
fn layer_bytes(m: &Moe, all_experts: bool) -> u64 {
    let c = &model().config;
    let routed = tensor_bytes(&m.gate_exps) + tensor_bytes(&m.up_exps) + tensor_bytes(&m.down_exps);
    let routed = if all_experts {
        routed
    } else {
        routed * c.n_expert_used as u64 / c.n_expert as u64
    };
    let shared = m.shared.as_ref().map_or(0, |s| {
        tensor_bytes(&s.gate) + tensor_bytes(&s.up) + tensor_bytes(&s.down)
    });
    routed + shared + tensor_bytes(&m.router)
}

/// Deterministic pseudo-random inputs, `n` rows, a different set per call index.
fn inputs(n: usize, call: u64) -> Vec<f32> {
    let n_embd = model().config.n_embd;
    let mut s = call.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n * n_embd)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn run(bencher: Bencher, threads: usize, n_tok: usize) {
    let layers = moe_layers();
    let par = Parallel::new(threads);
    let sets: Vec<Vec<f32>> = (0..16).map(|i| inputs(n_tok, i)).collect();
    let bytes = layer_bytes(layers[0], n_tok > 1);
    let mut i = 0usize;
    let mut scratch = moxie_core::blocks::moe::MoeScratch::default();
    bencher.counter(BytesCount::new(bytes)).bench_local(|| {
        i += 1;
        let m = layers[i % layers.len()];
        let h = &sets[i % sets.len()];
        black_box(moxie_core::blocks::moe::forward(m, h, n_tok, &par, &mut scratch).unwrap());
    });
}

#[divan::bench(args = [1, 2])]
fn decode(bencher: Bencher, threads: usize) {
    run(bencher, threads, 1);
}

#[divan::bench(args = [1, 2], sample_count = 20)]
fn batch64(bencher: Bencher, threads: usize) {
    run(bencher, threads, 64);
}
