//! Header-only files of real big models (`synth::write_header_only`): the DeepSeek-V3 and
//! GLM-4.7 presets must have exactly the tensor index and metadata of the fixture files in
//! `headers/` (which reproduce llama.cpp's converter + llama-quantize Q4_K_M), and GLM-5.1,
//! made by the same code, the shape of the published model.
//!
//! Fixtures come from $MOXIE_FIXTURES or ../shared/fixtures next to the checkout; a missing
//! directory or file fails the test.

use std::collections::BTreeSet;
use std::path::Path;

use moxie_core::synth::{self, HeaderSpec, SynthSpec};
use moxie_gguf::{GgmlType, GgufFile, Value};

mod common;
use common::{fixtures, tmp_dir};

/// Metadata keys of the fixtures not compared: free text about how the file was made.
const PROSE_KEYS: [&str; 3] = [
    "moxie.header_only.note",
    "moxie.header_only.sources",
    "moxie.header_only.uncertain",
];

fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("header fixture {} missing: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn open_fixture(path: &Path) -> GgufFile {
    assert!(
        path.is_file(),
        "header fixture {} missing (headers/ of the fixture directory; set MOXIE_FIXTURES)",
        path.display()
    );
    GgufFile::open_header_only(path).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn generated_headers_match_the_fixture_files() {
    let fx = fixtures().join("headers");
    let dir = tmp_dir("header-fixtures");
    for (preset, stem) in [
        ("deepseek-v3-671b", "DeepSeek-V3-671B-Q4_K_M"),
        ("glm-4.7-355b", "GLM-4.7-355B-Q4_K_M"),
    ] {
        let want = open_fixture(&fx.join(format!("{stem}.header.gguf")));
        let info = read_json(&fx.join(format!("{stem}.header.json")));
        let path = dir.join(format!("{preset}.gguf"));
        let report = synth::write_header_only(preset, &path).unwrap();
        let got = GgufFile::open_header_only(&path).unwrap();

        // The tensor index: names in the same order, dims, types, data offsets.
        assert_eq!(got.tensors().len(), want.tensors().len(), "{preset}");
        for (g, w) in got.tensors().iter().zip(want.tensors()) {
            assert_eq!(
                (&g.name, &g.dims, g.ty, g.offset, g.n_bytes),
                (&w.name, &w.dims, w.ty, w.offset, w.n_bytes),
                "{preset}: generated vs fixture"
            );
        }

        // Metadata: the same keys with the same values, prose aside. This covers everything
        // a planner reads (`<arch>.*`, `general.architecture`, `general.file_type`) and the
        // placeholder tokenizer.
        let keys = |f: &GgufFile| -> BTreeSet<String> {
            f.metadata()
                .keys()
                .filter(|k| !PROSE_KEYS.contains(k))
                .map(str::to_owned)
                .collect()
        };
        assert_eq!(keys(&got), keys(&want), "{preset}: metadata keys");
        for k in keys(&want) {
            assert_eq!(
                got.metadata().get(&k),
                want.metadata().get(&k),
                "{preset}: {k}"
            );
        }
        let arch = want.metadata().get_str("general.architecture").unwrap();
        assert!(keys(&want).iter().filter(|k| k.starts_with(arch)).count() > 20);
        assert_eq!(got.metadata().get_u32("general.file_type"), Some(15));

        // Totals of the .header.json.
        let json_u64 = |k: &str| info[k].as_u64().unwrap_or_else(|| panic!("{stem}: {k}"));
        assert_eq!(got.total_tensor_bytes(), json_u64("tensor_data_bytes"));
        assert_eq!(report.tensor_bytes, json_u64("tensor_data_bytes"));
        assert_eq!(report.n_params, json_u64("n_params"));
        assert_eq!(report.n_tensors, json_u64("n_tensors") as usize);
        // Header only: the file ends where the data section starts.
        assert_eq!(report.bytes, std::fs::metadata(&path).unwrap().len());
        assert_eq!(got.data_offset(0), Some(report.bytes));
        assert!(report.seconds < 10.0, "{preset}: {} s", report.seconds);
    }
}

#[test]
fn glm_5_1_has_the_published_shape() {
    let dir = tmp_dir("header-glm51");
    let path = dir.join("glm-5.1.gguf");
    let report = synth::write_header_only("glm-5.1-744b", &path).unwrap();
    let f = GgufFile::open_header_only(&path).unwrap();
    let m = f.metadata();
    assert_eq!(m.get_str("general.architecture"), Some("glm-dsa"));
    assert_eq!(m.get_bool("moxie.header_only"), Some(true));
    assert_eq!(m.get_u32("general.file_type"), Some(15));
    let u = |k: &str| {
        m.get_u32(&format!("glm-dsa.{k}"))
            .unwrap_or_else(|| panic!("{k}"))
    };
    // Every key llama.cpp's glm-dsa loader requires, with GLM-5's config values.
    for (k, v) in [
        ("block_count", 79),
        ("nextn_predict_layers", 1),
        ("leading_dense_block_count", 3),
        ("context_length", 202752),
        ("embedding_length", 6144),
        ("feed_forward_length", 12288),
        ("vocab_size", 154880),
        ("attention.head_count", 64),
        ("attention.head_count_kv", 1),
        ("attention.q_lora_rank", 2048),
        ("attention.kv_lora_rank", 512),
        ("attention.key_length", 576),
        ("attention.value_length", 512),
        ("attention.key_length_mla", 256),
        ("attention.value_length_mla", 256),
        ("rope.dimension_count", 64),
        ("expert_count", 256),
        ("expert_used_count", 8),
        ("expert_feed_forward_length", 2048),
        ("expert_shared_count", 1),
        ("expert_group_count", 1),
        ("expert_group_used_count", 1),
        ("expert_gating_func", 2),
        ("attention.indexer.head_count", 32),
        ("attention.indexer.key_length", 128),
        ("attention.indexer.top_k", 2048),
    ] {
        assert_eq!(u(k), v, "{k}");
    }
    assert!(m.get("glm-dsa.rope.scaling.type").is_none());
    assert!(m.keys().all(|k| !k.starts_with("deepseek2.")));

    let t = |name: &str| {
        f.tensors()
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("{name} missing"))
    };
    assert_eq!(t("token_embd.weight").dims, [6144, 154880]);
    assert_eq!(t("token_embd.weight").ty, GgmlType::Q4_K);
    assert_eq!(t("output.weight").ty, GgmlType::Q6_K);
    let blocks: BTreeSet<usize> = f
        .tensors()
        .iter()
        .filter_map(|t| t.name.strip_prefix("blk.")?.split('.').next()?.parse().ok())
        .collect();
    assert_eq!(blocks, (0..79).collect());
    for il in 0..79 {
        let b = |x: &str| format!("blk.{il}.{x}");
        assert_eq!(t(&b("attn_q_b.weight")).dims, [2048, 64 * 256]);
        assert_eq!(t(&b("attn_kv_a_mqa.weight")).dims, [6144, 576]);
        // Rows of 192 are not whole Q4_K blocks: llama-quantize falls back to Q5_0.
        assert_eq!(t(&b("attn_k_b.weight")).dims, [192, 512, 64]);
        assert_eq!(t(&b("attn_k_b.weight")).ty, GgmlType::Q5_0);
        assert_eq!(t(&b("attn_v_b.weight")).dims, [512, 256, 64]);
        assert_eq!(t(&b("attn_output.weight")).dims, [64 * 256, 6144]);
        assert_eq!(t(&b("indexer.attn_q_b.weight")).dims, [2048, 32 * 128]);
        assert_eq!(t(&b("indexer.attn_k.weight")).dims, [6144, 128]);
        assert_eq!(t(&b("indexer.proj.weight")).dims, [6144, 32]);
        assert_eq!(t(&b("indexer.k_norm.bias")).ty, GgmlType::F32);
        let has = |x: &str| f.tensors().iter().any(|t| t.name == b(x));
        assert_eq!(has("ffn_down.weight"), il < 3, "{il}");
        assert_eq!(has("nextn.eh_proj.weight"), il == 78, "{il}");
        if il >= 3 {
            assert_eq!(t(&b("ffn_gate_exps.weight")).dims, [6144, 2048, 256]);
            assert_eq!(t(&b("ffn_down_exps.weight")).dims, [2048, 6144, 256]);
            assert_eq!(t(&b("ffn_up_shexp.weight")).dims, [6144, 2048]);
            assert_eq!(t(&b("exp_probs_b.bias")).dims, [256]);
            assert_eq!(t(&b("ffn_gate_inp.weight")).ty, GgmlType::F32);
            // llama-quantize's use_more_bits over all 79 blocks.
            let more_bits = !(9..69).contains(&il) || (il - 9) % 3 == 2;
            let down = if more_bits {
                GgmlType::Q6_K
            } else {
                GgmlType::Q4_K
            };
            assert_eq!(t(&b("ffn_down_exps.weight")).ty, down, "{il}");
        }
    }
    assert_eq!(t("blk.78.nextn.eh_proj.weight").dims, [12288, 6144]);

    // 753.86 B parameters with the MTP block (the figure of published BF16 GGUFs), 743.9 B
    // without it ("744B"); Q4_K_M like published ~4.8-bit GGUFs.
    let p = report.n_params as f64;
    assert!((753.0e9..755.0e9).contains(&p), "{p}");
    let mtp: u64 = f
        .tensors()
        .iter()
        .filter(|t| t.name.starts_with("blk.78."))
        .map(|t| t.n_elements())
        .sum();
    assert!(
        (743.0e9..745.0e9).contains(&(p - mtp as f64)),
        "{p} - {mtp}"
    );
    let blocks_only: u64 = f
        .tensors()
        .iter()
        .filter(|t| t.name.starts_with("blk."))
        .map(|t| t.n_elements())
        .sum();
    // llama.cpp prints "repeating layers = ... 751.961 B parameters" for GLM-5.1 GGUFs.
    assert_eq!(
        (blocks_only as f64 / 1e6).round(),
        751_961.0,
        "{blocks_only}"
    );
    let bytes = report.tensor_bytes as f64;
    assert!((440e9..470e9).contains(&bytes), "{bytes}");
    assert_eq!(f.total_tensor_bytes(), report.tensor_bytes);
}

#[test]
fn unknown_presets_fail_with_the_list() {
    let dir = tmp_dir("header-bad");
    let path = dir.join("x.gguf");
    let e = synth::write_header_only("glm-6", &path)
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown header-only preset 'glm-6'"), "{e}");
    for (name, _) in synth::header_presets() {
        assert!(e.contains(name), "{e}");
    }
    assert!(!path.exists());
    // A synthetic preset is pointed to plain generation, a real one to --header-only.
    let e = HeaderSpec::preset("bench-deepseek2")
        .unwrap_err()
        .to_string();
    assert!(e.contains("without --header-only"), "{e}");
    let e = SynthSpec::preset("glm-5.1-744b").unwrap_err().to_string();
    assert!(e.contains("--header-only"), "{e}");
    // A hand-made spec that cannot be written is an error too.
    let mut spec = HeaderSpec::preset("glm-5.1-744b").unwrap();
    spec.base.shape.q_lora_rank = 0;
    let e = spec.write(&path).unwrap_err().to_string();
    assert!(e.contains("indexer.attn_q_b") && e.contains("zero"), "{e}");
    assert!(!path.exists());
    // An unwritable path is an error, not a panic.
    let e = synth::write_header_only("glm-4.7-355b", &dir.join("no/such/x.gguf"));
    assert!(e.is_err());
}

#[test]
fn metadata_values_are_typed_like_the_converter() {
    // u32 counts, f32 floats, bool flags: what llama.cpp's loader reads back.
    let spec = HeaderSpec::preset("deepseek-v3-671b").unwrap();
    let m = spec.metadata();
    let get = |k: &str| &m.iter().find(|(key, _)| key == k).unwrap().1;
    assert_eq!(get("deepseek2.expert_group_count"), &Value::U32(8));
    assert_eq!(
        get("deepseek2.rope.scaling.yarn_beta_fast"),
        &Value::F32(32.0)
    );
    assert_eq!(get("deepseek2.expert_weights_norm"), &Value::Bool(true));
    assert!(m.iter().all(|(k, _)| !k.contains("nextn")));
}
