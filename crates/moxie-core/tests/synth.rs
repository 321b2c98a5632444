//! `moxie gen`: synthetic models must look like the fixtures to a loader (same tensor names
//! and shapes, same metadata keys), be reproducible from their seed, and run.
//!
//! Fixtures come from $MOXIE_FIXTURES or ../shared/fixtures next to the checkout; a missing
//! directory fails the test.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use moxie_core::synth::SynthArch as Arch;
use moxie_core::synth::{self, SynthSpec, SynthType};
use moxie_core::{Logits, Model, Parallel};
use moxie_gguf::{GgmlType, GgufFile, Value};

mod common;
use common::{fixtures, tmp_dir};

const ARCHS: [&str; 3] = ["deepseek2", "glm4moe", "qwen3moe"];

fn tiny(arch: &str, ty: &str) -> SynthSpec {
    let mut spec = SynthSpec::preset(&format!("{arch}-tiny")).unwrap();
    spec.ty = SynthType::parse(ty).unwrap();
    spec
}

fn gen(spec: &SynthSpec, dir: &Path, file: &str) -> (PathBuf, synth::SynthReport) {
    let path = dir.join(file);
    let report = synth::generate(spec, &path).unwrap();
    (path, report)
}

/// Metadata keys compared with the fixtures: all but `general.*` (names, descriptions,
/// licence) — the tokenizer keys must be there too, their array contents may differ.
fn keys(f: &GgufFile) -> BTreeSet<String> {
    f.metadata()
        .keys()
        .filter(|k| {
            !k.starts_with("general.") || *k == "general.architecture" || *k == "general.file_type"
        })
        .map(str::to_owned)
        .collect()
}

fn shapes(f: &GgufFile) -> Vec<(String, Vec<u64>)> {
    f.tensors()
        .iter()
        .map(|t| (t.name.clone(), t.dims.to_vec()))
        .collect()
}

fn types(f: &GgufFile) -> Vec<(String, GgmlType)> {
    f.tensors().iter().map(|t| (t.name.clone(), t.ty)).collect()
}

/// Scalar metadata values must equal the fixture's, except tokenizer arrays and general.*.
fn same_scalars(ours: &GgufFile, fixture: &GgufFile, what: &str) {
    for (k, v) in fixture.metadata().iter() {
        if k.starts_with("general.") && k != "general.architecture" && k != "general.file_type" {
            continue;
        }
        if matches!(v, Value::Array(_)) {
            continue;
        }
        let o = ours
            .metadata()
            .get(k)
            .unwrap_or_else(|| panic!("{what}: missing key {k}"));
        assert_eq!(o, v, "{what}: key {k}");
    }
}

#[test]
fn tiny_models_match_the_fixtures_layout() {
    let fx = fixtures();
    let dir = tmp_dir("synth-layout");
    for arch in ARCHS {
        let fixture = GgufFile::open(&fx.join(format!("models/{arch}-tiny-F32.gguf"))).unwrap();
        let (path, report) = gen(&tiny(arch, "F32"), &dir, &format!("{arch}-F32.gguf"));
        let ours = GgufFile::open(&path).unwrap();
        assert_eq!(keys(&ours), keys(&fixture), "{arch}: metadata keys");
        same_scalars(&ours, &fixture, arch);
        assert_eq!(
            shapes(&ours),
            shapes(&fixture),
            "{arch}: tensor names/shapes/order"
        );
        assert_eq!(types(&ours), types(&fixture), "{arch}: tensor types");
        // Same layout => same file size up to the tokenizer arrays.
        assert_eq!(
            ours.total_tensor_bytes(),
            fixture.total_tensor_bytes(),
            "{arch}"
        );
        assert_eq!(report.n_tensors, fixture.tensors().len());
        assert_eq!(report.bytes, std::fs::metadata(&path).unwrap().len());
        let manifest: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(fx.join("models/manifest-tiny.json")).unwrap(),
        )
        .unwrap();
        let n_params = manifest
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["arch"] == arch)
            .unwrap()["n_params"]
            .as_u64()
            .unwrap();
        assert_eq!(report.n_params, n_params, "{arch}: parameter count");

        let toks = ours.metadata().get_array("tokenizer.ggml.tokens").unwrap();
        let tt = ours
            .metadata()
            .get_array("tokenizer.ggml.token_type")
            .unwrap();
        assert_eq!(toks.len(), 2048);
        assert_eq!(tt.len(), 2048);
        assert!(
            ours.metadata()
                .get_array("tokenizer.ggml.merges")
                .unwrap()
                .len()
                >= 300
        );
    }
}

#[test]
fn tiny_q4_k_m_types_follow_llama_quantize() {
    let fx = fixtures();
    let dir = tmp_dir("synth-q4km");
    for arch in ARCHS {
        let fixture = GgufFile::open(&fx.join(format!("models/{arch}-tiny-Q4_K_M.gguf"))).unwrap();
        let (path, _) = gen(&tiny(arch, "Q4_K_M"), &dir, &format!("{arch}-Q4_K_M.gguf"));
        let ours = GgufFile::open(&path).unwrap();
        // llama-quantize reorders tensors; compare by name.
        let mut a = types(&ours);
        let mut b = types(&fixture);
        a.sort();
        b.sort();
        assert_eq!(a, b, "{arch}: per-tensor types");
        assert_eq!(ours.metadata().get_u32("general.file_type"), Some(15));
        assert_eq!(
            ours.total_tensor_bytes(),
            fixture.total_tensor_bytes(),
            "{arch}"
        );
    }
}

#[test]
fn pure_types_quantize_every_matrix() {
    let dir = tmp_dir("synth-plain");
    for (ty, ft) in [
        ("Q8_0", 7),
        ("Q4_K", 14),
        ("F16", 1),
        ("BF16", 32),
        ("Q6_K", 18),
        ("IQ2_S", 28),
    ] {
        let mut spec = tiny("deepseek2", "F32");
        spec.ty = SynthType::parse_pure(ty).unwrap();
        assert_eq!(spec.ty.to_string(), format!("pure {ty}"));
        let (path, _) = gen(&spec, &dir, &format!("ds-{ty}.gguf"));
        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.metadata().get_u32("general.file_type"), Some(ft), "{ty}");
        let want = GgmlType::from_name(ty).unwrap();
        for t in f.tensors() {
            let expect = if t.dims.len() == 1 || t.name.contains("ffn_gate_inp") {
                GgmlType::F32
            } else if t.dims[0] % want.block_size() as u64 == 0 {
                want
            } else {
                // llama-quantize's fallbacks (rows of 32/64/128 for 256-blocks)
                match want {
                    GgmlType::Q4_K => GgmlType::Q5_0,
                    GgmlType::Q6_K => GgmlType::Q8_0,
                    GgmlType::IQ2_S => GgmlType::IQ4_NL,
                    _ => unreachable!(),
                }
            };
            assert_eq!(t.ty, expect, "{ty}: {}", t.name);
        }
    }
    // A file type's name with --pure is its default block type.
    assert_eq!(
        SynthType::parse_pure("Q4_K_M").unwrap(),
        SynthType::Pure(GgmlType::Q4_K)
    );
    assert!(SynthType::parse_pure("Q9_9")
        .unwrap_err()
        .to_string()
        .contains("IQ2_S"));
}

#[test]
fn file_type_names_are_llama_quantizes() {
    // Every llama-quantize name (aliases too) parses to its file type, whose id is written.
    for (name, id) in [
        ("Q4_K_M", 15),
        ("q4_k", 15),
        ("Q2_K", 10),
        ("IQ2_M", 29),
        ("IQ1_M", 31),
        ("IQ3_XXS", 23),
        ("Q8_0", 7),
        ("F32", 0),
        ("29", 29),
    ] {
        let t = SynthType::parse(name).unwrap();
        assert_eq!(t.file_type(), id, "{name}");
    }
    assert_eq!(SynthType::parse("q4_k").unwrap().to_string(), "Q4_K_M");
    // Q8_0's mix is pure Q8_0 for these models; Q4_0's is not (Q6_K output).
    for arch in ARCHS {
        let types = |spec: &SynthSpec| -> Vec<GgmlType> {
            synth::plan(spec).unwrap().iter().map(|t| t.ty).collect()
        };
        let mut pure = tiny(arch, "F32");
        pure.ty = SynthType::parse_pure("Q8_0").unwrap();
        assert_eq!(types(&tiny(arch, "Q8_0")), types(&pure), "{arch}");
        let q4_0 = synth::plan(&tiny(arch, "Q4_0")).unwrap();
        let out = q4_0.iter().find(|t| t.name == "output.weight").unwrap();
        assert_eq!(out.ty, GgmlType::Q6_K, "{arch}");
    }
}

/// Standard deviation of tensor `name`'s values in `f`.
fn value_std(f: &GgufFile, name: &str) -> f64 {
    let t = f.tensor(name).unwrap();
    let data = f.tensor_data(t).unwrap();
    let mut v = vec![0f32; t.n_elements() as usize];
    moxie_quant::dequantize_fn(t.ty).unwrap()(data, &mut v);
    assert!(v.iter().all(|x| x.is_finite()), "{name}: non-finite values");
    let n = v.len() as f64;
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
    (v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt()
}

#[test]
fn iq_file_types_write_random_blocks_with_the_weights_spread() {
    let dir = tmp_dir("synth-iq");
    for arch in ARCHS {
        for ty in ["IQ2_M", "IQ1_M", "IQ2_XXS", "IQ3_XXS"] {
            let spec = tiny(arch, ty);
            let (path, report) = gen(&spec, &dir, &format!("{arch}-{ty}.gguf"));
            let f = GgufFile::open(&path).unwrap();
            let plan = synth::plan(&spec).unwrap();
            let mut n_random = 0;
            for p in &plan {
                assert_eq!(f.tensor(&p.name).unwrap().ty, p.ty, "{arch} {ty}");
                moxie_quant::validate_row_data(
                    p.ty,
                    f.tensor_data(f.tensor(&p.name).unwrap()).unwrap(),
                )
                .unwrap_or_else(|b| panic!("{arch} {ty} {}: bad block {b}", p.name));
                if !synth::random_blocks(p.ty) {
                    continue;
                }
                n_random += 1;
                let synth::TensorInit::Normal { std } = p.init else {
                    panic!("{}: {:?}", p.name, p.init)
                };
                let got = value_std(&f, &p.name);
                let want = std as f64;
                assert!(
                    got > want / 2.0 && got < want * 2.0,
                    "{arch} {ty} {} ({}): std {got} for {want}",
                    p.name,
                    p.ty
                );
            }
            assert!(n_random > 0, "{arch} {ty}: {:?}", report.tensor_types);
            assert_eq!(
                f.metadata().get_u32("general.file_type"),
                Some(spec.ty.file_type())
            );
            // The model loads and runs on them.
            let model = Model::load(Arc::new(f)).unwrap();
            let mut cache = model.new_state(Some(16)).unwrap();
            let logits = model
                .forward(&[1, 2, 3, 4], &mut cache, &Parallel::new(2), Logits::Last)
                .unwrap();
            assert!(logits.iter().all(|x| x.is_finite()), "{arch} {ty}");
        }
    }
    // Types moxie can neither quantize to nor write random blocks of are refused by name.
    let e = synth::plan(&tiny("qwen3moe", "TQ1_0"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("TQ1_0") && e.contains("neither"), "{e}");
}

#[test]
fn same_seed_same_bytes_other_seed_other_weights() {
    let dir = tmp_dir("synth-seed");
    let spec = tiny("glm4moe", "Q4_K_M");
    let (a, _) = gen(&spec, &dir, "a.gguf");
    // Thread count must not matter.
    let b = dir.join("b.gguf");
    synth::generate_with(&spec, &b, 1, &mut |_| {}).unwrap();
    let ba = std::fs::read(&a).unwrap();
    assert_eq!(ba, std::fs::read(&b).unwrap(), "same seed, different bytes");

    let mut other = spec.clone();
    other.seed += 1;
    let (c, _) = gen(&other, &dir, "c.gguf");
    let (fa, fc) = (GgufFile::open(&a).unwrap(), GgufFile::open(&c).unwrap());
    assert_eq!(shapes(&fa), shapes(&fc));
    let ta = fa.tensor_data_by_name("output.weight").unwrap().unwrap();
    let tc = fc.tensor_data_by_name("output.weight").unwrap().unwrap();
    assert_ne!(ta, tc, "another seed must give other weights");
}

#[test]
fn weights_are_scaled_like_the_fixtures() {
    let fx = fixtures();
    let dir = tmp_dir("synth-scale");
    for arch in ARCHS {
        let fixture = GgufFile::open(&fx.join(format!("models/{arch}-tiny-F32.gguf"))).unwrap();
        let (path, _) = gen(&tiny(arch, "F32"), &dir, &format!("{arch}.gguf"));
        let ours = GgufFile::open(&path).unwrap();
        for t in fixture.tensors() {
            if t.name.starts_with("blk.") && !t.name.starts_with("blk.1.") {
                continue;
            }
            let stats = |f: &GgufFile| {
                let b = f.tensor_data_by_name(&t.name).unwrap().unwrap();
                let v: Vec<f64> = b
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
                    .collect();
                let n = v.len() as f64;
                let mean = v.iter().sum::<f64>() / n;
                let std = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
                (mean, std, n)
            };
            let (m0, s0, n) = stats(&fixture);
            let (m1, s1, _) = stats(&ours);
            // sampling error: a few standard errors
            let tol_s = s0 * (6.0 / n.sqrt()).max(0.02);
            assert!(
                (s1 - s0).abs() <= tol_s + 0.01 * s0 + if n < 100.0 { 0.05 } else { 0.0 },
                "{arch} {}: std {s1} vs fixture {s0}",
                t.name
            );
            let tol_m = 6.0 * s0 / n.sqrt() + 1e-3;
            assert!(
                (m1 - m0).abs() <= tol_m + (m0.abs() > 0.5) as u8 as f64 * 0.05,
                "{arch} {}: mean {m1} vs fixture {m0}",
                t.name
            );
        }
    }
}

#[test]
fn bad_specs_are_errors() {
    let mut s = tiny("qwen3moe", "F32");
    s.shape.n_head = 5; // not a multiple of n_head_kv 2
    assert!(s.validate().unwrap_err().to_string().contains("n_head_kv"));
    let mut s = tiny("qwen3moe", "F32");
    s.shape.n_expert_used = 9;
    assert!(s.validate().is_err());
    let mut s = tiny("deepseek2", "F32");
    s.shape.n_vocab = 100;
    assert!(s.validate().is_err());
    let mut s = tiny("deepseek2", "F32");
    s.shape.set("n_embd", "100000000").unwrap();
    assert!(s.validate().unwrap_err().to_string().contains("too large"));
    let mut s = tiny("glm4moe", "F32");
    s.shape.set("n_ff_exp", "16777216").unwrap();
    s.shape.set("n_expert", "16777216").unwrap();
    assert!(s.validate().unwrap_err().to_string().contains("too large"));
    assert!(SynthType::parse("Q9_K")
        .unwrap_err()
        .to_string()
        .contains("Q4_K_M"));
    let e = SynthSpec::preset("huge").unwrap_err().to_string();
    for (name, _) in synth::presets() {
        assert!(e.contains(name), "{e}");
    }
    assert!(SynthSpec::preset_for("tiny", None).is_err());
    assert_eq!(
        SynthSpec::preset_for("tiny", Some(Arch::Glm4Moe))
            .unwrap()
            .name,
        "glm4moe-tiny"
    );
    assert!(SynthSpec::preset_for("bench-deepseek2", Some(Arch::Qwen3Moe)).is_err());
    assert!(SynthSpec::preset_for("bench-qwen3moe", Some(Arch::Glm4Moe)).is_err());
    let mut s = tiny("glm4moe", "F32");
    assert!(s.shape.set("n_experts", "4").is_err());
    assert!(s.shape.set("n_expert", "four").is_err());
    s.shape.set("n_expert", "8").unwrap();
    assert_eq!(s.shape.n_expert, 8);
    let dir = tmp_dir("synth-bad");
    let mut s = tiny("deepseek2", "F32");
    s.shape.qk_rope_dim = 3;
    assert!(synth::generate(&s, &dir.join("x.gguf")).is_err());
    assert!(!dir.join("x.gguf").exists() && !dir.join("x.gguf.partial").exists());
}

/// Parameters and tensor bytes of `spec` from its plan (nothing generated).
fn planned_size(spec: &SynthSpec) -> (u64, u64) {
    let plan = synth::plan(spec).unwrap();
    (
        plan.iter().map(|t| t.n_elements()).sum(),
        plan.iter().map(|t| t.n_bytes()).sum(),
    )
}

#[test]
fn bench_presets_have_the_documented_sizes() {
    // (preset, arch, params, Q4_K_M bytes, Q8_0 bytes), each as a range around the sizes in
    // the presets' descriptions. bench-deepseek2 is the model of ../shared/notes/baselines.md
    // (Q4_K_M file 1.96 GB, Q8_0 3.43 GB).
    type Range = std::ops::Range<f64>;
    let cases: [(&str, Arch, Range, Range, Range); 2] = [
        (
            "bench-deepseek2",
            Arch::Deepseek2,
            3.20e9..3.26e9,
            1.90e9..2.02e9,
            3.38e9..3.48e9,
        ),
        (
            "bench-qwen3moe",
            Arch::Qwen3Moe,
            3.25e9..3.31e9,
            1.95e9..2.06e9,
            3.45e9..3.55e9,
        ),
    ];
    for (name, arch, params, q4, q8) in cases {
        let spec = SynthSpec::preset(name).unwrap();
        assert_eq!(spec.arch, arch, "{name}");
        assert_eq!(spec.name, name);
        assert_eq!(spec.ty, SynthType::parse("Q4_K_M").unwrap(), "{name}");
        spec.validate().unwrap();
        let (n, q4_bytes) = planned_size(&spec);
        assert!(params.contains(&(n as f64)), "{name} params {n}");
        assert!(
            q4.contains(&(q4_bytes as f64)),
            "{name} Q4_K_M bytes {q4_bytes}"
        );
        let mut q8_spec = spec.clone();
        q8_spec.ty = SynthType::parse("Q8_0").unwrap();
        q8_spec.validate().unwrap();
        let (n8, q8_bytes) = planned_size(&q8_spec);
        assert_eq!(n8, n);
        assert!(
            q8.contains(&(q8_bytes as f64)),
            "{name} Q8_0 bytes {q8_bytes}"
        );
        // Far beyond a 300 MiB L3 even at Q4_K_M; Q8_0 fits a 24 GiB machine many times.
        assert!(q4_bytes > 5 * (300 << 20), "{name}");
        assert!(q8_bytes < 8 << 30, "{name}");
        let meta = synth::metadata(&spec).unwrap();
        let toks = meta
            .iter()
            .find(|(k, _)| k == "tokenizer.ggml.tokens")
            .unwrap();
        match &toks.1 {
            Value::Array(a) => assert_eq!(a.len(), 32768),
            _ => panic!(),
        }
    }

    let ds = SynthSpec::preset("bench-deepseek2").unwrap().shape;
    assert_eq!(
        (ds.n_layer, ds.n_dense_lead, ds.n_expert, ds.n_expert_used),
        (20, 1, 64, 6)
    );
    assert_eq!((ds.n_expert_shared, ds.kv_lora_rank), (1, 512));
    let qw = SynthSpec::preset("bench-qwen3moe").unwrap().shape;
    assert_eq!(
        (qw.n_embd, qw.n_layer, qw.n_expert, qw.n_expert_used),
        (1536, 20, 128, 8)
    );
    assert_eq!((qw.n_head, qw.n_head_kv, qw.n_expert_shared), (16, 4, 0));
}

#[test]
fn bench_ds_and_bench_qwen_are_aliases() {
    for (alias, name) in [
        ("bench-ds", "bench-deepseek2"),
        ("bench-qwen", "bench-qwen3moe"),
    ] {
        assert_eq!(
            SynthSpec::preset(alias).unwrap(),
            SynthSpec::preset(name).unwrap()
        );
        let arch = SynthSpec::preset(name).unwrap().arch;
        assert_eq!(SynthSpec::preset_for(alias, Some(arch)).unwrap().name, name);
        let desc = synth::presets()
            .iter()
            .find(|(n, _)| *n == alias)
            .unwrap()
            .1;
        assert!(desc.starts_with(&format!("alias of {name}")), "{desc}");
    }
}

#[test]
fn generated_tiny_models_run_with_peaked_logits() {
    let dir = tmp_dir("synth-run");
    for arch in ARCHS {
        for ty in ["F32", "Q4_K_M"] {
            let (path, _) = gen(&tiny(arch, ty), &dir, &format!("{arch}-{ty}.gguf"));
            let file = Arc::new(GgufFile::open(&path).unwrap());
            let model = Model::load(file).unwrap();
            let n_vocab = model.config.n_vocab;
            let mut cache = model.new_state(Some(64)).unwrap();
            let tokens: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 2000).collect();
            let logits = model
                .forward(&tokens, &mut cache, &Parallel::new(2), Logits::All)
                .unwrap();
            assert_eq!(logits.len(), tokens.len() * n_vocab);
            assert!(
                logits.iter().all(|x| x.is_finite()),
                "{arch} {ty}: non-finite logits"
            );
            let mut top1 = 0.0;
            let mut std = 0.0;
            for row in logits.chunks_exact(n_vocab) {
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
                let z: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
                top1 += 1.0 / z;
                let mean = row.iter().map(|&x| x as f64).sum::<f64>() / n_vocab as f64;
                std += (row.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>()
                    / n_vocab as f64)
                    .sqrt();
            }
            let n = tokens.len() as f64;
            let (top1, std) = (top1 / n, std / n);
            eprintln!("{arch} {ty}: mean top-1 {top1:.3}, logit std {std:.2}");
            assert!(
                top1 > 0.1,
                "{arch} {ty}: mean top-1 probability {top1} (uniform {})",
                1.0 / n_vocab as f64
            );
            assert!((2.5..6.0).contains(&std), "{arch} {ty}: logit std {std}");
        }
    }
}

#[test]
fn decode_bytes_count_every_dense_weight_and_the_selected_experts_share() {
    let dir = tmp_dir("synth-decode-bytes");
    let (path, _) = gen(&tiny("deepseek2", "Q4_K_M"), &dir, "ds.gguf");
    let file = Arc::new(GgufFile::open(&path).unwrap());
    let model = Model::load(Arc::clone(&file)).unwrap();
    let c = &model.config;
    let b = moxie_core::bench::decode_bytes(&model, 10, moxie_core::KvTypes::default()).unwrap();
    let bytes = |pred: &dyn Fn(&str) -> bool| -> u64 {
        file.tensors()
            .iter()
            .filter(|t| pred(&t.name))
            .map(|t| t.n_bytes)
            .sum()
    };
    let routed = bytes(&|n| n.ends_with("_exps.weight"));
    let embd = bytes(&|n| n == "token_embd.weight");
    assert!(routed > 0 && embd > 0);
    assert_eq!(
        b.experts,
        routed * c.n_expert_used as u64 / c.n_expert as u64
    );
    assert_eq!(b.embedding_row, embd / c.n_vocab as u64);
    assert_eq!(b.dense, file.total_tensor_bytes() - routed - embd);
    let per_pos: usize = model
        .state_specs()
        .iter()
        .flat_map(|s| [s.keys, s.values])
        .flatten()
        .map(|r| r.width * 2)
        .sum();
    assert_eq!(b.kv, 10 * per_pos as u64);
}

/// Per MoE layer of `path`: the mean share of a token's experts that the token before it also
/// chose, and the share of all selections taken by the `top` most chosen experts, over a
/// 256-token prompt of pseudo-random tokens (no token repeats nearby, so any locality comes
/// from the model).
fn routing_stats(path: &Path, top: usize) -> Vec<(f64, f64)> {
    use moxie_core::telemetry::RoutingTrace;
    let model = Model::load(Arc::new(GgufFile::open(path).unwrap())).unwrap();
    let trace = path.with_extension("trace");
    model.routing.trace_to(&trace).unwrap();
    let mut state = model.new_state(Some(512)).unwrap();
    let tokens: Vec<u32> = (0..256u32).map(|i| (i * 811 + 13) % 2000).collect();
    model
        .prefill(&tokens, &mut state, &Parallel::new(2), 512)
        .unwrap();
    model.routing.finish_trace().unwrap();
    let t = RoutingTrace::read(&trace).unwrap();
    let mut out = Vec::new();
    for r in &t.records {
        let sets: Vec<&[u16]> = r.experts.chunks_exact(r.k).collect();
        let overlap: f64 = sets
            .windows(2)
            .map(|w| w[1].iter().filter(|e| w[0].contains(e)).count() as f64 / r.k as f64)
            .sum::<f64>()
            / (sets.len() - 1) as f64;
        let mut counts = vec![0u64; t.n_expert];
        r.experts.iter().for_each(|&e| counts[e as usize] += 1);
        counts.sort_unstable_by(|a, b| b.cmp(a));
        let share = counts[..top].iter().sum::<u64>() as f64 / r.experts.len() as f64;
        out.push((overlap, share));
    }
    out
}

/// `--routing`: the recency preset makes consecutive tokens share experts (the attention
/// window), the skewed preset concentrates selections on a few experts, more in the last MoE
/// layer than in the first; the uniform default does neither. Measured on deepseek2-tiny
/// (2 MoE layers, 16 experts, top-4: a token repeats 25% of its predecessor's by chance, and
/// the two most chosen experts take 12.5% of the selections under uniform routing; measured
/// when written: uniform 0.23-0.24 overlap / 0.17 top-2 share, recency 0.33-0.37 / 0.19-0.20,
/// skewed top-2 share 0.40 then 0.47; with 2 MoE layers and one window layer before them the
/// tiny model's locality is weaker than bench-deepseek2's 20 layers give).
#[test]
fn routing_presets_shape_the_routing() {
    let dir = tmp_dir("synth-routing");
    let mut stats = std::collections::HashMap::new();
    for preset in ["uniform", "recency", "skewed"] {
        let mut spec = tiny("deepseek2", "Q8_0");
        spec.shape.routing = synth::RoutingShape::preset(preset).unwrap();
        let (path, _) = gen(&spec, &dir, &format!("{preset}.gguf"));
        let s = routing_stats(&path, 2);
        eprintln!("{preset}: (overlap, top-2 share) per MoE layer {s:?}");
        assert_eq!(s.len(), 2);
        stats.insert(preset, s);
    }
    let (uni, rec, skew) = (&stats["uniform"], &stats["recency"], &stats["skewed"]);
    for l in 0..2 {
        assert!(
            uni[l].0 < 0.4 && uni[l].1 < 0.3,
            "uniform layer {l}: {:?}",
            uni[l]
        );
        assert!(
            rec[l].0 > uni[l].0 + 0.08,
            "recency layer {l}: {:?}",
            rec[l]
        );
        assert!(rec[l].1 < 0.3, "recency layer {l}: weak skew {:?}", rec[l]);
        assert!(skew[l].1 > 0.35, "skewed layer {l}: {:?}", skew[l]);
    }
    assert!(skew[1].1 > skew[0].1, "skew grows with depth: {skew:?}");
}

/// The attention window's structure survives quantization: channel 0 of the embeddings is the
/// constant, no output projection writes channel 0, the queries read channel 0 only.
#[test]
fn the_attention_window_is_in_the_weights() {
    let dir = tmp_dir("synth-window");
    let mut spec = tiny("deepseek2", "Q8_0");
    spec.shape.routing = synth::RoutingShape::preset("recency").unwrap();
    let (path, _) = gen(&spec, &dir, "window.gguf");
    let file = GgufFile::open(&path).unwrap();
    let rows = |name: &str| -> Vec<Vec<f32>> {
        let t = file.tensor(name).unwrap();
        let data = file.tensor_data(t).unwrap();
        let n = t.dims[0] as usize;
        let rb = t.ty.row_bytes(n as u64).unwrap() as usize;
        data.chunks_exact(rb)
            .map(|src| {
                let mut row = vec![0f32; n];
                moxie_quant::dequantize_row(t.ty, src, &mut row).unwrap();
                row
            })
            .collect()
    };
    // (Q8_0 rounds the 1.0 to its block's scale.)
    assert!(rows("token_embd.weight")
        .iter()
        .all(|r| (r[0] - 1.0).abs() < 0.03));
    let e = spec.shape.n_embd;
    for name in [
        "blk.1.attn_output.weight",
        "blk.1.ffn_down_exps.weight",
        "blk.0.ffn_down.weight",
    ] {
        for (r, row) in rows(name).iter().enumerate() {
            if r % e == 0 {
                assert!(
                    row.iter().all(|&x| x == 0.0),
                    "{name} row {r} writes channel 0"
                );
            }
        }
    }
    for row in rows("blk.1.attn_q_a.weight") {
        assert!(row[0] != 0.0 && row[1..].iter().all(|&x| x == 0.0));
    }
    // Other archs, and random-block types, are refused.
    let mut q = tiny("qwen3moe", "Q8_0");
    q.shape.set("attn_window", "4").unwrap();
    assert!(q.validate().unwrap_err().to_string().contains("deepseek2"));
    let mut q = tiny("qwen3moe", "Q8_0");
    q.shape.set("skew_last", "0.5").unwrap();
    assert!(q
        .validate()
        .unwrap_err()
        .to_string()
        .contains("exp_probs_b"));
    let mut iq = tiny("deepseek2", "IQ2_XXS");
    iq.shape.routing = synth::RoutingShape::preset("recency").unwrap();
    let err = iq.validate().unwrap_err().to_string();
    assert!(err.contains("random blocks"), "{err}");
}
