//! The GPU forward pass, run by the CPU emulator of the CUDA kernels (`moxie_gpu::emu`):
//! every fixture model all on one GPU, on the hybrid split users run (`-ngl 999 --cpu-moe`:
//! routed experts in RAM, the rest on the GPU), and on a mixed split over two GPUs and the
//! CPU (attention, FFN part and routed experts of a layer on different devices, both
//! directions of the experts' crossing), against the all-CPU logits.
//!
//! The GPU rounds where the CPU does (activations to the CPU's 8-bit blocks for the weight
//! types with int8 kernels, attention queries and prompt probabilities; docs/architecture.md,
//! "GPUs"), so files whose weights all have int8 kernels agree to float rounding (~1e-13 mean
//! KLD per position), and the others, whose products take f32 activations, within the core
//! issue's KLD bounds, not bit for bit: F32 files mean KLD ≤ 1e-5 and top-1 ≥ 99%. For a quantized file the bound is
//! max(2e-3, KLD(file ‖ its F32 master) / 10), both run here on the CPU, applied per position
//! as the golden tests do for runs whose summation order differs from llama.cpp's (median
//! position within the bound, at most one position in 20 beyond 10× it: MoE routing flips on
//! near-tied experts), and top-1 ≥ 90%. Top-1 is compared only where the CPU's top-1 leads by
//! more than 0.1 (the tiny models have near-ties, as the fixtures' README notes). The floor is 2e-3, not the core issue's 1e-3: that
//! is the size of the activation-quantization gap itself (the fixtures' README,
//! `dequant_f32_check`: an engine multiplying exactly with dequantized weights differs from
//! llama.cpp's quantized runs by up to 0.012 mean KLD on these files; measured here, the
//! median position of Q8_0 files sits at 1.1-1.3e-3).
//!
//! ik_llama.cpp's files (their own block types) are bounded as golden.rs bounds them against
//! ik's goldens (`common::ik_bound`): pooled over all of a file's positions, mean KLD at most
//! max(the quantized bound above, 2 x ik's own batch-1 vs batch-512 KLD) and top-1 at least
//! min(90%, ik's own agreement - 5 points). They run their golden sequences (168 positions, the
//! last 3 tokens of each one at a time), the positions ik's own figures were measured on: over
//! the 22 positions of the other files' run one routing flip moves the mean by 2e-2. Measured
//! here: median positions at 6-10e-4 (the activation-quantization gap of the other files), means
//! 6.5e-4 .. 6e-3, at most about half the bound (IQ4_K: 5.8e-3 of 1.1e-2).
//!
//! On a machine with an NVIDIA GPU the same comparison runs on the real device:
//! `cargo test -p moxie-core --features cuda --test gpu_emu -- --ignored`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use moxie_core::blocks::moe::op_offload_threshold;
use moxie_core::device::{DeviceId, Devices, CPU};
use moxie_core::model::Placement;
use moxie_core::telemetry::Phase;
use moxie_core::{Logits, Model, Parallel};
use moxie_gguf::GgufFile;
use moxie_gpu::emu::EmuGpu;
use moxie_gpu::Gpu;

mod common;
use common::{
    block, fixtures, golden_index, ik_bound, ik_own_pooled, is_ik, kld_per_row,
    prefill_and_decode as run, supported_models, token_ids, FixtureModel,
};

const GPU0: DeviceId = 1;
const GPU1: DeviceId = 2;

/// The CPU and two emulated GPUs.
fn two_gpus() -> Devices {
    let mut d = Devices::cpu_only();
    for name in ["CUDA0", "CUDA1"] {
        d.push_gpu(Gpu::new(EmuGpu::new(name, 1 << 30)), 1 << 30);
    }
    d
}

/// The CPU and the machine's first CUDA GPU, twice (as "two" GPUs sharing its memory).
#[cfg(feature = "cuda")]
fn cuda_gpus() -> Devices {
    let gpu = moxie_gpu::cuda::CudaGpu::open(0).expect("a CUDA GPU");
    let mut d = Devices::cpu_only();
    for _ in 0..2 {
        d.push_gpu(Gpu::new(gpu.clone()), 4 << 30);
    }
    d
}

/// Which stage of its layer a tensor belongs to.
enum Part {
    Attn,
    Ffn,
    Experts,
}

fn part(rest: &str) -> Part {
    if rest.contains("_exps") {
        Part::Experts
    } else if rest.starts_with("ffn_")
        || rest.starts_with("exp_probs_b")
        || rest.starts_with("post_attention_norm")
    {
        Part::Ffn
    } else {
        Part::Attn
    }
}

/// Place each tensor by `f(layer, part)`; tensors outside blocks by `outside(name)`.
fn placement(
    file: &GgufFile,
    devices: Devices,
    f: impl Fn(usize, Part) -> DeviceId,
    outside: impl Fn(&str) -> DeviceId,
) -> Placement {
    let mut tensors = HashMap::new();
    for t in file.tensors() {
        let dev = match block(&t.name) {
            None => outside(&t.name),
            Some((il, rest)) => f(il, part(rest)),
        };
        tensors.insert(t.name.clone(), dev);
    }
    Placement {
        devices,
        tensors,
        ..Default::default()
    }
}

/// Everything on GPU0, the token embeddings included.
fn all_gpu(file: &GgufFile, devices: Devices) -> Placement {
    placement(file, devices, |_, _| GPU0, |_| GPU0)
}

/// `-ngl 999 --cpu-moe`: routed experts and token embeddings in RAM, the rest on GPU0.
fn hybrid(file: &GgufFile, devices: Devices) -> Placement {
    placement(
        file,
        devices,
        |_, p| match p {
            Part::Experts => CPU,
            _ => GPU0,
        },
        |name| {
            if name.starts_with("token_embd") {
                CPU
            } else {
                GPU0
            }
        },
    )
}

/// Layer 0: attention on the CPU, FFN and experts on GPU0. Layer 1: attention on GPU1, FFN
/// on GPU0, experts on the CPU. Layer 2: attention on GPU0, FFN on the CPU, experts on GPU1.
/// Output on GPU1.
fn mixed(file: &GgufFile, devices: Devices) -> Placement {
    placement(
        file,
        devices,
        |il, p| match (il % 3, p) {
            (0, Part::Attn) => CPU,
            (0, _) => GPU0,
            (1, Part::Attn) => GPU1,
            (1, Part::Ffn) => GPU0,
            (1, Part::Experts) => CPU,
            (_, Part::Attn) => GPU0,
            (_, Part::Ffn) => CPU,
            (_, Part::Experts) => GPU1,
        },
        |name| {
            if name.starts_with("token_embd") {
                CPU
            } else {
                GPU1
            }
        },
    )
}

fn argmax(x: &[f32]) -> usize {
    x.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map_or(0, |(i, _)| i)
}

/// What a file's GPU logits must meet against the CPU's (the module doc).
#[derive(Clone, Copy, Debug)]
enum Bound {
    /// An F32 file: mean KLD at most 1e-5, top-1 at least 99%.
    F32,
    /// A quantized file: the per-position rule at this KLD, top-1 at least 90%.
    Quant(f64),
    /// An ik_llama.cpp file: mean KLD over all positions at most `kld`, top-1 at least `top1`.
    Ik { kld: f64, top1: f64 },
}

impl Bound {
    /// The KLD the report and the outlier count measure against.
    fn kld(self) -> f64 {
        match self {
            Bound::F32 => 1e-5,
            Bound::Quant(b) => b,
            Bound::Ik { kld, .. } => kld,
        }
    }
}

/// Check `got` against the CPU's `want` within `bound`.
fn agree(name: &str, how: &str, bound: Bound, want: &[f32], got: &[f32], n_vocab: usize) {
    assert_eq!(want.len(), got.len(), "{name} {how}: logits length");
    assert!(
        got.iter().all(|v| v.is_finite()),
        "{name} {how}: non-finite logits"
    );
    let klds = kld_per_row(want, got, n_vocab);
    let mean = klds.iter().sum::<f64>() / klds.len() as f64;
    let mut sorted = klds.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    let outliers = klds.iter().filter(|&&k| k > 10.0 * bound.kld()).count();
    let rows = klds.len();
    // Top-1 must agree where the CPU's top-1 is not near-tied (the fixtures' greedy
    // continuations have top1-top2 margins down to 0.000).
    let clear = |r: usize| {
        let row = &want[r * n_vocab..(r + 1) * n_vocab];
        let top = argmax(row);
        let second = row
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != top)
            .map(|(_, v)| *v)
            .fold(f32::NEG_INFINITY, f32::max);
        row[top] - second > 0.1
    };
    let same_top1 = (0..rows)
        .filter(|&r| {
            !clear(r)
                || argmax(&want[r * n_vocab..(r + 1) * n_vocab])
                    == argmax(&got[r * n_vocab..(r + 1) * n_vocab])
        })
        .count();
    eprintln!(
        "{name} {how}: mean KLD {mean:.2e}, median {median:.2e}, bound {:.1e}, {outliers} of \
         {rows} over 10x, top-1 {same_top1}/{rows}",
        bound.kld()
    );
    match bound {
        Bound::F32 => {
            assert!(mean <= 1e-5, "{name} {how}: mean KLD {mean:.3e} > 1e-5");
            assert!(
                same_top1 * 100 >= rows * 99,
                "{name} {how}: top-1 agrees on {same_top1} of {rows}"
            );
        }
        Bound::Quant(b) => {
            assert!(
                median <= b && outliers * 20 <= rows,
                "{name} {how}: median KLD {median:.3e} (bound {b:.1e}), {outliers} of {rows} \
                 positions beyond 10x"
            );
            assert!(
                same_top1 * 100 >= rows * 90,
                "{name} {how}: top-1 agrees on {same_top1} of {rows}"
            );
        }
        Bound::Ik { kld, top1 } => {
            assert!(
                mean <= kld,
                "{name} {how}: mean KLD {mean:.3e} over all positions (bound {kld:.1e})"
            );
            assert!(
                same_top1 as f64 >= top1 * rows as f64,
                "{name} {how}: top-1 agrees on {same_top1} of {rows} (min {:.1}%)",
                top1 * 100.0
            );
        }
    }
}

fn open(path: &Path) -> Arc<GgufFile> {
    Arc::new(GgufFile::open(path).unwrap())
}

/// An ik_llama.cpp file's golden sequences, the positions ik's own distance was measured on:
/// each sequence's tokens in one batch but the last 3, which follow one at a time; the logits of
/// every position, sequence after sequence.
fn golden_sequences(model: &Model, par: &Parallel, entry: &serde_json::Value) -> Vec<f32> {
    let mut all = Vec::new();
    for s in entry["sequences"].as_object().expect("sequences").values() {
        let tokens = token_ids(s);
        let split = tokens.len() - 3;
        let mut state = model.new_state(Some(tokens.len())).unwrap();
        all.extend(
            model
                .forward(&tokens[..split], &mut state, par, Logits::All)
                .unwrap(),
        );
        for &t in &tokens[split..] {
            all.extend(model.forward(&[t], &mut state, par, Logits::Last).unwrap());
        }
    }
    all
}

fn check_file(fx: &FixtureModel, par: &Parallel, devices: fn() -> Devices) {
    let path = &fx.path;
    let file = open(path);
    // ik files run their golden sequences (their bound is pooled over a file's positions),
    // the others `prefill_and_decode`.
    let ik = is_ik(fx);
    let run = |model: &Model| {
        if ik {
            golden_sequences(model, par, &fx.entry)
        } else {
            run(model, par)
        }
    };
    let cpu = Model::load(Arc::clone(&file)).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let name = path.file_name().unwrap().to_string_lossy().to_string();
    let n_vocab = cpu.config.n_vocab;
    let want = run(&cpu);
    let bound = if name.contains("-F32") {
        Bound::F32
    } else {
        let master = run(&Model::load(master_of(&name)).unwrap());
        let core = quant_bound(&master, &want, n_vocab);
        if ik {
            let (own_kld, own_top1) = ik_own_pooled(&fx.entry);
            let (kld, top1) = ik_bound(core, 0.90, own_kld, own_top1);
            Bound::Ik { kld, top1 }
        } else {
            Bound::Quant(core)
        }
    };
    for (how, place) in [
        ("all-GPU", all_gpu as fn(&GgufFile, Devices) -> Placement),
        ("hybrid --cpu-moe", hybrid),
        ("mixed over 2 GPUs + CPU", mixed),
    ] {
        let model = Model::load_placed(Arc::clone(&file), &place(&file, devices()))
            .unwrap_or_else(|e| panic!("{name} {how}: {e}"));
        let got = run(&model);
        agree(&name, how, bound, &want, &got, n_vocab);
        // The GPUs that hold something were crossed into and out of.
        for (dev, s) in &model.devices.stats()[1..] {
            if s.resident_bytes > 0 {
                assert!(s.copies_in > 0, "{name} {how}: {dev}: {s:?}");
            }
        }
    }
}

/// Quantized fixture `name` loaded on the CPU, its logits from `run`, and the bound a placed
/// run of it must meet ([`quant_bound`] against its F32 master).
fn on_cpu(name: &str, run: impl Fn(&Model) -> Vec<f32>) -> (Arc<GgufFile>, Model, Vec<f32>, Bound) {
    let file = open(&fixtures().join("models").join(name));
    let cpu = Model::load(Arc::clone(&file)).unwrap();
    let want = run(&cpu);
    let master = run(&Model::load(master_of(name)).unwrap());
    let bound = Bound::Quant(quant_bound(&master, &want, cpu.config.n_vocab));
    (file, cpu, want, bound)
}

/// The F32 master of a fixture (`deepseek2-tiny-Q4_K_M` -> `deepseek2-tiny-F32.gguf`).
fn master_of(name: &str) -> Arc<GgufFile> {
    let arch = name.split("-tiny-").next().unwrap();
    open(
        &fixtures()
            .join("models")
            .join(format!("{arch}-tiny-F32.gguf")),
    )
}

/// A quantized file's bound: its own quantization error over its F32 master on the same tokens
/// (mean KLD of `want` against `master`) / 10, at least 2e-3.
fn quant_bound(master: &[f32], want: &[f32], n_vocab: usize) -> f64 {
    let k = kld_per_row(master, want, n_vocab);
    (k.iter().sum::<f64>() / k.len() as f64 / 10.0).max(2e-3)
}

/// The supported fixtures whose every block type the GPU kernels handle, with goldens from
/// ik_llama.cpp (`ik`) or llama.cpp.
fn fixture_models(ik: bool) -> Vec<FixtureModel> {
    supported_models(&golden_index())
        .into_iter()
        .filter(|m| {
            let types = m.entry["tensor_types"].as_object().expect("tensor_types");
            is_ik(m) == ik
                && types.keys().all(|t| {
                    moxie_quant::GgmlType::from_name(t).is_some_and(moxie_gpu::Gpu::supports)
                })
        })
        .collect()
}

/// Every llama.cpp fixture, then (`ik`) every ik_llama.cpp one, on `devices`.
fn check_fixtures(ik: bool, devices: fn() -> Devices) {
    let par = Parallel::new(2);
    let models = fixture_models(ik);
    for model in &models {
        check_file(model, &par, devices);
    }
    let checked = models.len();
    let expected = if ik { 9 } else { 17 };
    assert!(
        checked >= expected,
        "expected the fixture models, checked {checked}"
    );
}

#[test]
fn emulated_gpu_matches_cpu_on_every_fixture() {
    check_fixtures(false, two_gpus);
}

/// ik_llama.cpp's types (IQ2_K .. IQ6_K, IQ2_KS .. IQ5_KS) on the GPU, within the ik bound.
#[test]
fn emulated_gpu_matches_cpu_on_ik_fixtures() {
    check_fixtures(true, two_gpus);
}

/// Where every weight type has int8 kernels the GPU rounds where the CPU does (activations
/// to the CPU's q8 blocks, attention queries through the keys' type, a prompt's probabilities
/// to f16), so its logits agree with the CPU's to float rounding: on these files the median
/// position within 1e-9 (measured ~3e-13; with f32 products and no attention rounding it was
/// 4e-4..8e-4). Not every position: a rounding flip at one reaches the later ones through the
/// cache (IQ4_K's file flips early in this sequence: median 4e-4). scripts/test.sh also runs it
/// on the emulator built to fuse multiply-adds as NVRTC does (MXEMU_FP_CONTRACT=1), which
/// reproduced the H200's one failure of it (IQ3_KS, median 1.085e-4, fused scale terms).
#[test]
fn int8_gpu_products_agree_with_the_cpu_to_float_rounding() {
    check_float_rounding_agreement(two_gpus);
}

/// The same on a real GPU (CUDA0), where NVRTC may fuse the products' float terms: `cargo
/// test -p moxie-core --features cuda --test gpu_emu -- --ignored cuda_int8`.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn cuda_int8_gpu_products_agree_with_the_cpu_to_float_rounding() {
    check_float_rounding_agreement(cuda_gpus);
}

fn check_float_rounding_agreement(devices: fn() -> Devices) {
    let par = Parallel::new(2);
    let mut models = fixture_models(false);
    models.extend(fixture_models(true));
    for stem in [
        "qwen3moe-tiny-Q4_K_M",
        "qwen3moe-tiny-Q4_0",
        "qwen3moe-tiny-IQ2_XXS",
        "qwen3moe-tiny-IQ4_XS",
        // ik_llama.cpp's types.
        "qwen3moe-tiny-IQ3_KS",
        "qwen3moe-tiny-IQ5_KS",
    ] {
        let fx = models
            .iter()
            .find(|m| m.stem == stem)
            .unwrap_or_else(|| panic!("fixture {stem}"));
        let file = open(&fx.path);
        let cpu = Model::load(Arc::clone(&file)).unwrap();
        let want = run(&cpu, &par);
        let gpu = Model::load_placed(Arc::clone(&file), &all_gpu(&file, devices())).unwrap();
        let got = run(&gpu, &par);
        let mut klds = kld_per_row(&want, &got, cpu.config.n_vocab);
        klds.sort_by(f64::total_cmp);
        let median = klds[klds.len() / 2];
        eprintln!("{stem} all-GPU, int8 products: median KLD {median:.2e}");
        assert!(
            median <= 1e-9,
            "{stem}: median position KLD {median:.3e} > 1e-9"
        );
    }
}

/// The same on a real GPU (CUDA0): `cargo test -p moxie-core --features cuda --test gpu_emu
/// -- --ignored`.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn cuda_gpu_matches_cpu_on_every_fixture() {
    check_fixtures(false, cuda_gpus);
    check_fixtures(true, cuda_gpus);
}

#[test]
fn budgets_and_unsupported_caches_are_clear_errors() {
    let path = fixtures().join("models/qwen3moe-tiny-Q4_K_M.gguf");
    let file = open(&path);
    // A GPU too small for the weights: refused naming the device.
    let mut small = Devices::cpu_only();
    small.push_gpu(Gpu::new(EmuGpu::new("CUDA0", 1 << 30)), 64 << 10);
    let p = all_gpu(&file, small);
    let err = Model::load_placed(Arc::clone(&file), &p)
        .err()
        .expect("over budget")
        .to_string();
    assert!(
        err.contains("CUDA0") && err.contains("out of memory"),
        "{err}"
    );
    // A cache pair the GPU kernels do not read (f32 keys, q8_0 values) is refused with what to
    // use instead (the planner refuses it before loading; this is the loader's own check).
    let model = Model::load_placed(Arc::clone(&file), &hybrid(&file, two_gpus())).unwrap();
    let types = moxie_core::state::KvTypes {
        k: moxie_quant::GgmlType::F32,
        v: moxie_quant::GgmlType::Q8_0,
    };
    let err = model
        .new_state_typed(Some(64), types)
        .err()
        .expect("f32 / q8_0 on the GPU")
        .to_string();
    assert!(err.contains("CUDA0") && err.contains("-ctk"), "{err}");
    // GPU memory is given back with the model.
    let devices = model.devices.clone();
    assert!(devices.get(GPU0).stats().resident_bytes > 0);
    drop(model);
    assert_eq!(devices.get(GPU0).stats().resident_bytes, 0);
}

/// q8_0 KV caches on GPU layers (`-ctk q8_0 -ctv q8_0`, and q8_0 keys with f16 values), which
/// users run to save VRAM: the GPU's cache holds the CPU cache's bytes and its attention
/// reads them, so every placement gives the CPU's logits with the same cache types, for MLA
/// (deepseek2: one latent of 576 per position), GQA (qwen3moe, glm4moe) and glm-dsa (MLA
/// with the indexer's keys).
#[test]
fn q8_0_kv_cache_on_emulated_gpus_matches_the_cpu() {
    check_q8_0_kv_cache(two_gpus);
}

/// The same on a real GPU (CUDA0, twice).
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn cuda_q8_0_kv_cache_matches_the_cpu() {
    check_q8_0_kv_cache(cuda_gpus);
}

fn check_q8_0_kv_cache(devices: fn() -> Devices) {
    use moxie_quant::GgmlType::{F16, Q8_0};
    let par = Parallel::new(2);
    for stem in [
        "deepseek2-tiny-Q4_K_M",
        "qwen3moe-tiny-Q4_K_M",
        "glm4moe-tiny-Q4_K_M",
        "glm-dsa-tiny-Q4_K_M",
    ] {
        let file = open(&fixtures().join(format!("models/{stem}.gguf")));
        for (k, v) in [(Q8_0, Q8_0), (Q8_0, F16)] {
            let types = moxie_core::state::KvTypes { k, v };
            let run = |model: &Model| {
                let n_vocab = model.config.n_vocab as u32;
                let tokens: Vec<u32> = (0..22u32).map(|i| (i * 37 + 5) % n_vocab).collect();
                let mut cache = model.new_state_typed(Some(64), types).unwrap();
                let mut all = model
                    .forward(&tokens[..19], &mut cache, &par, Logits::All)
                    .unwrap();
                for &t in &tokens[19..] {
                    all.extend(model.forward(&[t], &mut cache, &par, Logits::Last).unwrap());
                }
                all
            };
            let cpu = Model::load(Arc::clone(&file)).unwrap();
            let n_vocab = cpu.config.n_vocab;
            let want = run(&cpu);
            // As `check_file`: the file's own quantization error over its F32 master (same
            // tokens, same cache types) / 10, at least 2e-3; glm-dsa's indexer selection
            // flips on near-ties as MoE routing does.
            let master = run(&Model::load(master_of(stem)).unwrap());
            let bound = quant_bound(&master, &want, n_vocab);
            for (how, place) in [
                ("all-GPU", all_gpu as fn(&GgufFile, Devices) -> Placement),
                ("mixed over 2 GPUs + CPU", mixed),
            ] {
                let model = Model::load_placed(Arc::clone(&file), &place(&file, devices()))
                    .unwrap_or_else(|e| panic!("{stem} {how}: {e}"));
                let got = run(&model);
                let how = format!("{how}, {k}/{v} cache");
                agree(stem, &how, Bound::Quant(bound), &want, &got, n_vocab);
            }
        }
    }
}

/// The GPU's routing kernel picks the experts and weights `route_top_k` does: softmax and
/// sigmoid gating, selection bias, group-limited selection, normalisation and scale; with
/// logits on a coarse grid, ties broken to the lower index as the CPU breaks them.
#[test]
fn gpu_routing_matches_route_top_k() {
    use moxie_core::blocks::moe::Routing;
    use moxie_core::config::Gating;
    use moxie_gpu::ops::RouteSpec;
    use moxie_gpu::Buffer;
    let path = fixtures().join("models/deepseek2-tiny-F32.gguf");
    let base = Routing::from_config(&Model::load(open(&path)).unwrap().config);
    let gpu = Gpu::new(EmuGpu::new("CUDA0", 1 << 26));
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
    };
    for (gating, groups, used, norm, scale, with_bias, tied) in [
        (Gating::Sigmoid, 1, 1, true, 2.5, true, false),
        (Gating::Softmax, 1, 1, true, 1.0, false, false),
        (Gating::Softmax, 1, 1, false, 1.0, false, false),
        (Gating::Sigmoid, 4, 2, true, 2.5, true, false),
        (Gating::Softmax, 1, 1, true, 1.0, false, true),
        (Gating::Sigmoid, 4, 2, true, 1.0, false, true),
    ] {
        let mut r = base;
        r.gating = gating;
        r.n_groups = groups;
        r.n_group_used = used;
        r.norm = norm;
        r.scale = scale;
        let (n_tok, ne, k) = (7, r.n_expert, r.n_expert_used);
        let logits: Vec<f32> = (0..n_tok * ne)
            .map(|_| next())
            .map(|x| if tied { (x * 2.0).round() / 2.0 } else { x })
            .collect();
        let bias: Vec<f32> = (0..ne).map(|_| next() * 0.05).collect();
        let lb = Buffer::from_f32(gpu.backend(), &logits).unwrap();
        let bb = Buffer::from_f32(gpu.backend(), &bias).unwrap();
        let ids = Buffer::new(gpu.backend(), n_tok * k * 4).unwrap();
        let w = Buffer::new(gpu.backend(), n_tok * k * 4).unwrap();
        let spec = RouteSpec {
            n_expert: ne,
            k,
            sigmoid: gating == Gating::Sigmoid,
            n_groups: groups,
            n_group_used: used,
            norm,
            scale,
        };
        let bias_ptr = with_bias.then(|| bb.ptr());
        gpu.route(spec, lb.ptr(), bias_ptr, ids.ptr(), w.ptr(), n_tok)
            .unwrap();
        let mut got_ids = vec![0u8; n_tok * k * 4];
        ids.read(0, &mut got_ids).unwrap();
        let mut got_w = vec![0f32; n_tok * k];
        w.read_f32(0, &mut got_w).unwrap();
        for t in 0..n_tok {
            let want = moxie_core::blocks::moe::route_top_k(
                &r,
                &logits[t * ne..(t + 1) * ne],
                with_bias.then_some(&bias[..]),
            );
            for (j, &(e, wt)) in want.iter().enumerate() {
                let i = t * k + j;
                let got_e = i32::from_ne_bytes(got_ids[4 * i..4 * i + 4].try_into().unwrap());
                assert_eq!(
                    got_e as usize, e,
                    "{gating:?} groups {groups}: token {t} slot {j}"
                );
                assert!(
                    (got_w[i] - wt).abs() <= 1e-5 * wt.abs().max(1.0),
                    "{gating:?}: weight {} vs {wt}",
                    got_w[i]
                );
            }
        }
    }
}

/// Op offload: with the threshold at 8 tokens, the 19-token prefill of the hybrid split streams
/// to the GPU the experts each MoE layer's prompt chose (counted uploads of exactly their
/// bytes) and the one-token steps do not; the logits stay within the bounds. Streamed 3
/// experts at a time (a buffer limit), the logits are those of streaming them all at once,
/// bit for bit, and the same bytes cross. Calibration measures the copy rate and the CPU's and
/// the GPU's time per token, and takes its threshold from them.
#[test]
fn op_offload_streams_ram_experts_for_large_batches() {
    check_op_offload(two_gpus);
}

/// The same on CUDA0: `cargo test -p moxie-core --features cuda --test gpu_emu -- --ignored
/// cuda_op_offload`.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn cuda_op_offload_streams_ram_experts_for_large_batches() {
    check_op_offload(cuda_gpus);
}

fn check_op_offload(devices: fn() -> Devices) {
    let path = fixtures().join("models/deepseek2-tiny-F32.gguf");
    let file = open(&path);
    let par = Parallel::new(2);
    let cpu = Model::load(Arc::clone(&file)).unwrap();
    let want = run(&cpu, &par);
    let model = Model::load_placed(Arc::clone(&file), &hybrid(&file, devices())).unwrap();
    let cal = model
        .calibrate_op_offload(&par)
        .unwrap()
        .expect("a hybrid split");
    eprintln!("{cal}");
    assert!(
        cal.upload_bytes_per_s > 0.0 && cal.cpu_s_per_token > 0.0,
        "{cal}"
    );
    // The GPU holds the tiny model's experts layer whole.
    assert_eq!(cal.experts_per_chunk, cal.n_expert, "{cal}");
    let gpu_s = cal.gpu_s_per_token.expect("room for the experts");
    assert!(gpu_s > 0.0, "{cal}");
    let upload_s = cal.layer_bytes as f64 / cal.upload_bytes_per_s;
    assert_eq!(
        cal.min_batch,
        op_offload_threshold(upload_s, cal.cpu_s_per_token, gpu_s),
        "{cal}"
    );

    let bytes_in = |m: &Model| m.devices.get(GPU0).stats().bytes_in;
    let prefill_counts = |m: &Model| {
        let p = m.routing_profile().unwrap();
        p.layers
            .iter()
            .map(|l| (l.layer, l.counts(Phase::Prefill).to_vec()))
            .collect::<Vec<_>>()
    };
    model.set_op_offload_min_batch(None);
    let before = bytes_in(&model);
    let plain = run(&model, &par);
    let plain_in = bytes_in(&model) - before;
    model.set_op_offload_min_batch(Some(8));
    let counts_before = prefill_counts(&model);
    let before = bytes_in(&model);
    let streamed = run(&model, &par);
    let streamed_in = bytes_in(&model) - before;
    // The experts the prompt chose, per MoE layer, and their bytes.
    let mut chosen_bytes = 0u64;
    let mut chosen = 0;
    for ((il, now), (_, was)) in prefill_counts(&model).iter().zip(&counts_before) {
        let per_expert: u64 = ["gate", "up", "down"]
            .iter()
            .map(|m| {
                let t = file
                    .tensor(&format!("blk.{il}.ffn_{m}_exps.weight"))
                    .unwrap();
                t.n_bytes / cpu.config.n_expert as u64
            })
            .sum();
        let n = now.iter().zip(was).filter(|(a, b)| a > b).count();
        chosen += n;
        chosen_bytes += n as u64 * per_expert;
    }
    assert!(chosen > 0);
    // The prefill uploads the chosen experts instead of their weighted sum (19 rows per MoE
    // layer); decode crosses as before.
    let moe_layers = counts_before.len() as u64;
    let sums = moe_layers * 19 * cpu.config.n_embd as u64 * 4;
    assert_eq!(streamed_in + sums - plain_in, chosen_bytes);
    agree(
        "deepseek2-tiny-F32",
        "op offload",
        Bound::F32,
        &want,
        &streamed,
        cpu.config.n_vocab,
    );
    agree(
        "deepseek2-tiny-F32",
        "no offload",
        Bound::F32,
        &want,
        &plain,
        cpu.config.n_vocab,
    );

    // Three experts at a time: several chunks per layer, the same logits and bytes.
    let per_expert = cal.layer_bytes / cal.n_expert as u64;
    model.set_op_offload_buffer_limit(Some(3 * per_expert + per_expert / 2));
    let before = bytes_in(&model);
    let chunked = run(&model, &par);
    assert_eq!(bytes_in(&model) - before, streamed_in);
    assert!(
        chunked
            .iter()
            .zip(&streamed)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "chunked op offload changed the logits"
    );
    // Less room than one expert: the CPU computes them, as without op offload.
    model.set_op_offload_buffer_limit(Some(per_expert / 2));
    let before = bytes_in(&model);
    let no_room = run(&model, &par);
    assert_eq!(bytes_in(&model) - before, plain_in);
    assert!(no_room
        .iter()
        .zip(&plain)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
}

/// Op offload from experts read into memory (`--no-mmap`): pinning registers each streamed
/// layer's three expert tensors with the GPU (mapped ones stay pageable), every expert copy of
/// the prefill comes straight from the pinned bytes, the logits are those of the copies from
/// the mapping, bit for bit, and dropping the model releases the pins.
#[test]
fn op_offload_copies_pinned_experts_straight() {
    let file = open(&fixtures().join("models/deepseek2-tiny-F32.gguf"));
    let par = Parallel::new(2);
    let emus = [EmuGpu::new("CUDA0", 1 << 30), EmuGpu::new("CUDA1", 1 << 30)];
    let mut devices = Devices::cpu_only();
    for e in &emus {
        devices.push_gpu(Gpu::new(e.clone()), 1 << 30);
    }
    let mut model = Model::load_placed(Arc::clone(&file), &hybrid(&file, devices)).unwrap();
    model.set_op_offload_min_batch(Some(8));
    let mapped = run(&model, &par);
    assert_eq!(model.pin_streamed_experts().unwrap(), (0, 0));

    model.own_mapped_weights(&moxie_core::progress::NoProgress);
    let experts: Vec<_> = file
        .tensors()
        .iter()
        .filter(|t| t.name.contains("_exps"))
        .map(|t| t.n_bytes)
        .collect();
    let (n, bytes) = model.pin_streamed_experts().unwrap();
    assert_eq!((n, bytes), (experts.len(), experts.iter().sum::<u64>()));
    assert_eq!(emus[0].pinned_ranges(), experts.len());
    assert_eq!(
        model.pin_streamed_experts().unwrap(),
        (0, 0),
        "pinned twice"
    );

    let bytes_in = |m: &Model| m.devices.get(GPU0).stats().bytes_in;
    model.set_op_offload_min_batch(None);
    let before = bytes_in(&model);
    run(&model, &par);
    let plain_in = bytes_in(&model) - before;
    model.set_op_offload_min_batch(Some(8));
    let (before, direct_before) = (bytes_in(&model), emus[0].pinned_upload_bytes());
    let pinned = run(&model, &par);
    let streamed_in = bytes_in(&model) - before;
    let direct = emus[0].pinned_upload_bytes() - direct_before;
    // The expert copies (what streaming adds over the 19 rows of weighted sums per MoE
    // layer) all came from the pins.
    let moe_layers = experts.len() as u64 / 3;
    let sums = moe_layers * 19 * model.config.n_embd as u64 * 4;
    assert!(direct > 0);
    assert_eq!(streamed_in + sums - plain_in, direct);
    assert!(pinned
        .iter()
        .zip(&mapped)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
    drop(model);
    assert_eq!(emus[0].pinned_ranges(), 0, "pins outlived the model");
}

/// Prefill of the first 56 tokens of the golden s120 sequence (all logits), then the next 8
/// one at a time: long enough that the DSA indexer (top-k 32) selects a strict subset of the
/// past in both paths.
fn long_run(model: &Model, tokens: &[u32], par: &Parallel) -> Vec<f32> {
    let mut state = model.new_state(Some(256)).unwrap();
    let mut all = model
        .forward(&tokens[..56], &mut state, par, Logits::All)
        .unwrap();
    for &t in &tokens[56..64] {
        all.extend(model.forward(&[t], &mut state, par, Logits::Last).unwrap());
    }
    all
}

/// Make every glm-dsa layer after the first reuse its selection (GLM-5.2's shared indexer
/// layers), so the selection crosses devices in the mixed placement.
fn share_indexers(model: &mut Model) {
    for layer in model.layers.iter_mut().skip(1) {
        if let moxie_core::blocks::Mixer::Mla(m) = &mut layer.mixer {
            m.sparse = Some(moxie_core::blocks::mla::Sparse::Shared);
        }
    }
}

/// glm-dsa's sparse attention on GPUs: sequences past the indexer's top-k, with every layer
/// running its indexer and with layers 1 and 2 sharing layer 0's selection, all-GPU, hybrid and
/// mixed (the selection made on the CPU and used on GPU1, made on GPU1 and used on GPU0), within
/// the emulator's per-position bounds.
#[test]
fn glm_dsa_sparse_attention_on_emulated_gpus() {
    let par = Parallel::new(2);
    let index = golden_index();
    let tokens = token_ids(&index["models"]["glm-dsa-tiny-F32"]["sequences"]["s120"]);
    let open_stem = |stem: &str| open(&fixtures().join(format!("models/{stem}.gguf")));
    for shared in [false, true] {
        let cpu_run = |stem: &str| {
            let mut m = Model::load(open_stem(stem)).unwrap();
            if shared {
                share_indexers(&mut m);
            }
            long_run(&m, &tokens, &par)
        };
        let master = cpu_run("glm-dsa-tiny-F32");
        for stem in ["glm-dsa-tiny-F32", "glm-dsa-tiny-Q4_K_M"] {
            let file = open_stem(stem);
            let want = if stem.ends_with("F32") {
                master.clone()
            } else {
                cpu_run(stem)
            };
            let n_vocab = 2048;
            // A near-tie in the indexer's scores flips a position's selection under another
            // summation order, as MoE routing flips experts: llama.cpp's own flash-attention
            // variant moves the F32 file's s120 logits by up to 2.2 (fixtures index,
            // determinism_checks). So the per-position rule applies to the F32 file too, with
            // its 1e-5; a quantized file's bound is its own quantization error over its F32
            // master on these tokens, / 10, at least 2e-3 (as `check_file`).
            let bound = if stem.ends_with("F32") {
                1e-5
            } else {
                quant_bound(&master, &want, n_vocab)
            };
            for (how, place) in [
                ("all-GPU", all_gpu as fn(&GgufFile, Devices) -> Placement),
                ("hybrid --cpu-moe", hybrid),
                ("mixed over 2 GPUs + CPU", mixed),
            ] {
                let mut model = Model::load_placed(Arc::clone(&file), &place(&file, two_gpus()))
                    .unwrap_or_else(|e| panic!("{stem} {how}: {e}"));
                if shared {
                    share_indexers(&mut model);
                }
                let got = long_run(&model, &tokens, &par);
                let name = format!("{stem} (shared indexers: {shared})");
                agree(&name, how, Bound::Quant(bound), &want, &got, n_vocab);
            }
        }
    }
}

/// The GPU's top-k selection keeps the same positions as the CPU's (libstdc++'s heap
/// selection) on scores full of ties, as ReLU makes them.
#[test]
fn gpu_top_k_breaks_ties_as_the_cpu() {
    use moxie_gpu::Buffer;
    let gpu = Gpu::new(EmuGpu::new("CUDA0", 1 << 26));
    let mut seed = 0x9e37_79b9u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let (n_tok, pos0, k) = (40, 60, 16);
    let stride = pos0 + n_tok;
    let scores: Vec<f32> = (0..n_tok * stride)
        .map(|_| [0.0, 0.0, 0.0, 0.5, -0.25, 1.0][(next() % 6) as usize])
        .collect();
    let sb = Buffer::from_f32(gpu.backend(), &scores).unwrap();
    let lb = Buffer::new(gpu.backend(), n_tok * k * 4).unwrap();
    let cb = Buffer::new(gpu.backend(), n_tok * 4).unwrap();
    gpu.dsa_top_k(sb.ptr(), stride, n_tok, pos0, k, lb.ptr(), cb.ptr())
        .unwrap();
    let mut list = vec![0u8; n_tok * k * 4];
    lb.read(0, &mut list).unwrap();
    let list: Vec<i32> = list
        .chunks_exact(4)
        .map(|b| i32::from_ne_bytes(b.try_into().unwrap()))
        .collect();
    let mut idx = Vec::new();
    for t in 0..n_tok {
        let row = &scores[t * stride..t * stride + pos0 + t + 1];
        moxie_core::blocks::dsa::heap_select(row, k, &mut idx);
        idx.sort_unstable();
        let mut got: Vec<u32> = list[t * k..(t + 1) * k].iter().map(|&x| x as u32).collect();
        got.sort_unstable();
        assert_eq!(got, idx, "token {t}");
    }
}

/// A file whose matrices are stored interleaved (`moxie quantize --repack`) runs on GPUs
/// from rows put back in GGUF order at upload: every placement gives the logits of the same
/// placement of the plain file, bit for bit.
#[test]
fn interleaved_file_uploads_in_gguf_order() {
    let path = fixtures().join("models/deepseek2-tiny-Q4_K_M.gguf");
    let plain = open(&path);
    let mut w = moxie_gguf::GgufWriter::new();
    for (k, v) in plain.metadata().iter() {
        w.add(k, v.clone()).unwrap();
    }
    let mut n_interleaved = 0;
    for t in plain.tensors() {
        w.add_tensor_info(&t.name, &t.dims, t.ty).unwrap();
        if moxie_core::interleave_candidate(&t.name) && w.set_interleaved(&t.name).is_ok() {
            n_interleaved += 1;
        }
    }
    assert!(n_interleaved >= 6, "{n_interleaved}");
    let bytes = w
        .write_to_bytes(|t| {
            let src = plain.tensor_data(plain.tensor(&t.name).unwrap()).unwrap();
            if !t.interleaved {
                return src.to_vec();
            }
            let mut out = vec![0u8; src.len()];
            let n_rows = t.n_rows() as usize;
            moxie_quant::repack::repack(t.ty, src, n_rows, t.dims[0] as usize, &mut out);
            out
        })
        .unwrap();
    let packed = Arc::new(GgufFile::from_bytes("packed.gguf", bytes).unwrap());
    // Exact: the host's interleaved experts (hybrid) give their GGUF rows' products.
    let par = Parallel::new(2).with_numerics(moxie_core::Numerics::Exact);
    for (how, place) in [
        ("all-GPU", all_gpu as fn(&GgufFile, Devices) -> Placement),
        ("hybrid --cpu-moe", hybrid),
    ] {
        let load = |f: &Arc<GgufFile>| {
            Model::load_placed(Arc::clone(f), &place(f, two_gpus()))
                .unwrap_or_else(|e| panic!("{how}: {e}"))
        };
        let (want, got) = (run(&load(&plain), &par), run(&load(&packed), &par));
        assert!(
            want.iter()
                .zip(&got)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{how}: logits of the interleaved file differ"
        );
    }
}

/// Routing telemetry on GPUs: a layer routed and run on a GPU counts its routes there
/// (`route_tally`, flushed into the model's counters), a layer whose experts are in RAM
/// counts the routes brought down, and either way every MoE layer reports the tokens it
/// routed, top-k selections per token and routing weights summing to one per token
/// (qwen3moe renormalises), prompts and single tokens apart.
#[test]
fn routing_telemetry_counts_gpu_routed_layers() {
    check_routing_telemetry(two_gpus);
}

/// The same on a real GPU (CUDA0, twice): `route_tally` as NVRTC compiles it.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn cuda_routing_telemetry_counts_gpu_routed_layers() {
    check_routing_telemetry(cuda_gpus);
}

fn check_routing_telemetry(devices: fn() -> Devices) {
    use moxie_core::telemetry::Phase;
    let path = fixtures().join("models/qwen3moe-tiny-Q4_K_M.gguf");
    let file = open(&path);
    let par = Parallel::new(2);
    for (how, place) in [
        ("all-GPU", all_gpu as fn(&GgufFile, Devices) -> Placement),
        ("hybrid --cpu-moe", hybrid),
    ] {
        let model = Model::load_placed(Arc::clone(&file), &place(&file, devices())).unwrap();
        let mut cache = model.new_state(Some(64)).unwrap();
        let prompt: Vec<u32> = (0..12u32).map(|i| (i * 37 + 5) % 1000).collect();
        model
            .forward(&prompt, &mut cache, &par, Logits::Last)
            .unwrap();
        for t in [7u32, 9, 11] {
            model.forward(&[t], &mut cache, &par, Logits::Last).unwrap();
        }
        let p = model.routing_profile().unwrap();
        assert_eq!(p.layers.len(), 2, "{how}");
        for l in &p.layers {
            assert_eq!(l.tokens, [12, 3], "{how}: layer {}", l.layer);
            for (phase, tokens) in [(Phase::Prefill, 12u64), (Phase::Decode, 3)] {
                let selected: u64 = l.counts(phase).iter().sum();
                assert_eq!(selected, 2 * tokens, "{how}: layer {} {phase:?}", l.layer);
                let mass: f64 = l.mass[phase as usize].iter().sum();
                assert!(
                    (mass - tokens as f64).abs() < 1e-3,
                    "{how}: {mass} for {tokens}"
                );
            }
        }
        // Flushed: a second profile adds nothing new.
        assert_eq!(model.routing_profile().unwrap(), p, "{how}");
    }
}

/// Hot experts on the GPU that runs their layer (`-ngl 999 -ot exps=CPU -oe '*:...=CUDA0'`):
/// the GPU computes their selections from copies of them (routes remapped, the others rows of
/// zeros) while the CPU computes the rest and leaves them out of its sum; the logits agree with
/// the CPU's within the fixture's bound, and each decode step's hot selections are booked on
/// the GPU.
#[test]
fn hot_experts_on_the_gpu_running_their_layer() {
    check_hot_experts_on_gpu(two_gpus);
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn cuda_hot_experts_on_the_gpu_running_their_layer() {
    check_hot_experts_on_gpu(cuda_gpus);
}

fn check_hot_experts_on_gpu(devices: fn() -> Devices) {
    use moxie_core::telemetry::Phase;
    let par = Parallel::new(2);
    for stem in ["deepseek2-tiny-Q4_K_M", "qwen3moe-tiny-Q4_K_M"] {
        let name = format!("{stem}.gguf");
        let (file, cpu, want, bound) = on_cpu(&name, |m| run(m, &par));
        let n_vocab = cpu.config.n_vocab;
        let n_expert = cpu.config.n_expert;
        let hot: Vec<usize> = (0..n_expert).filter(|e| e % 3 == 0).collect();
        let moe_layers: Vec<usize> = cpu.moe_layers().map(|(il, _)| il).collect();
        let mut placed = hybrid(&file, devices());
        placed.experts = moe_layers
            .iter()
            .map(|&il| (il, (GPU0, hot.clone())))
            .collect();
        let model = Model::load_placed(Arc::clone(&file), &placed)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = run(&model, &par);
        agree(
            &name,
            "hybrid + hot experts on GPU0",
            bound,
            &want,
            &got,
            n_vocab,
        );

        let profile = model.routing_profile().unwrap();
        let (mut gpu_reads, mut cpu_reads, mut held) = (0u64, 0u64, 0u64);
        for (il, m) in model.moe_layers() {
            assert!(
                m.hot.as_ref().unwrap().gpu.is_some(),
                "{name}: copies on GPU0"
            );
            held += m.expert_bytes() * hot.len() as u64;
            let p = profile.layers.iter().find(|l| l.layer == il).unwrap();
            for (e, &c) in p.counts(Phase::Decode).iter().enumerate() {
                let side = if e % 3 == 0 {
                    &mut gpu_reads
                } else {
                    &mut cpu_reads
                };
                *side += c * m.expert_bytes();
            }
        }
        let stats = model.devices.stats();
        assert_eq!(
            stats[GPU0].1.expert_bytes[Phase::Decode as usize],
            gpu_reads,
            "{name}"
        );
        assert_eq!(
            stats[CPU].1.expert_bytes[Phase::Decode as usize],
            cpu_reads,
            "{name}"
        );
        assert!(gpu_reads > 0 && cpu_reads > 0, "{name}");
        // Loaded (on fresh devices: a placement's devices keep their counters), before any
        // work buffer: the copies are what GPU0 holds beyond plain hybrid.
        let mut fresh = hybrid(&file, devices());
        fresh.experts = placed.experts.clone();
        let resident = |p: &Placement| {
            let m = Model::load_placed(Arc::clone(&file), p).unwrap();
            m.devices.stats()[GPU0].1.resident_bytes
        };
        let plain = resident(&hybrid(&file, devices()));
        assert_eq!(
            resident(&fresh) - plain,
            held,
            "{name}: the copies are held on GPU0"
        );

        // A layer whose router is not on the GPU cannot have hot experts there.
        let mut cpu_router = placement(&file, devices(), |_, _| CPU, |_| CPU);
        cpu_router.experts = [(moe_layers[0], (GPU0, hot.clone()))].into();
        let err = Model::load_placed(Arc::clone(&file), &cpu_router)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("with the layer's router"), "{name}: {err}");
    }
}

/// The expert cache on the GPU that runs its layers (`-ngl 999 -ot exps=CPU --expert-cache`):
/// a decode step's residents are computed there from their slots' copies, the misses on the
/// CPU and copied into their slots after the step; the logits agree with the CPU's within the
/// fixture's bound (over more decode steps than slots, so experts are evicted and replaced),
/// and the hits are booked on the GPU.
#[test]
fn the_expert_cache_on_the_gpu_running_its_layers() {
    check_expert_cache_on_gpu(two_gpus);
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn cuda_expert_cache_on_the_gpu_running_its_layers() {
    check_expert_cache_on_gpu(cuda_gpus);
}

fn check_expert_cache_on_gpu(devices: fn() -> Devices) {
    use moxie_core::loader::CachePlacement;
    use moxie_core::telemetry::{CachePolicy, Phase};
    let par = Parallel::new(2);
    for stem in ["deepseek2-tiny-Q4_K_M", "qwen3moe-tiny-Q4_K_M"] {
        let name = format!("{stem}.gguf");
        // A prompt, then 12 decode steps: enough to fill the slots and evict.
        let tokens: Vec<u32> = (0..20u32).map(|i| (i * 131 + 7) % 1500).collect();
        let steps = |model: &Model| {
            let mut cache = model.new_state(Some(64)).unwrap();
            let mut all = model
                .forward(&tokens[..8], &mut cache, &par, Logits::Last)
                .unwrap();
            for &t in &tokens[8..] {
                all.extend(model.forward(&[t], &mut cache, &par, Logits::Last).unwrap());
            }
            all
        };
        let (file, cpu, want, bound) = on_cpu(&name, steps);
        let n_vocab = cpu.config.n_vocab;
        let n_expert = cpu.config.n_expert;
        let moe_layers: Vec<usize> = cpu.moe_layers().map(|(il, _)| il).collect();
        let slots = cpu.config.n_expert_used + 1;
        for policy in [CachePolicy::Lru, CachePolicy::Lfu, CachePolicy::Decay] {
            let mut placed = hybrid(&file, devices());
            placed.expert_cache = Some(CachePlacement {
                device: GPU0,
                policy,
                layers: moe_layers.iter().map(|&il| (il, (slots, None))).collect(),
            });
            let model = Model::load_placed(Arc::clone(&file), &placed)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let got = steps(&model);
            let how = format!("hybrid + expert cache ({policy:?}) on GPU0");
            agree(&name, &how, bound, &want, &got, n_vocab);
            let c = model.expert_cache_counts().unwrap();
            assert!(c.hits > 0 && c.hits < c.lookups, "{name} {how}: {c:?}");
            assert!(c.uploads > slots as u64, "{name} {how}: evictions {c:?}");
            // Per layer (expert sizes differ between layers of a Q4_K_M mix).
            let (mut hit_bytes, mut miss_bytes) = (0, 0);
            for (_, m) in model.moe_layers() {
                let lc = m.cache.as_ref().unwrap().counts();
                hit_bytes += lc.hits * m.expert_bytes();
                miss_bytes += (lc.lookups - lc.hits) * m.expert_bytes();
            }
            let stats = model.devices.stats();
            let decode = Phase::Decode as usize;
            assert_eq!(
                stats[GPU0].1.expert_bytes[decode], hit_bytes,
                "{name} {how}"
            );
            assert_eq!(
                stats[CPU].1.expert_bytes[decode], miss_bytes,
                "{name} {how}"
            );
            assert!(n_expert > slots);
        }
    }
}
