//! Models whose GGUF is well-formed but whose contents do not describe a runnable model must
//! fail to load with an error naming the problem, never panic. Built by rewriting a fixture's
//! metadata or tensor index.

use std::sync::Arc;

use moxie_core::{Logits, Model, Parallel};
use moxie_gguf::{Array, ArrayData, GgufFile, GgufWriter, Value};

mod common;
use common::fixtures;

fn fixture(stem: &str) -> GgufFile {
    let path = fixtures().join("models").join(format!("{stem}.gguf"));
    assert!(
        path.is_file(),
        "fixture {} not found (set MOXIE_FIXTURES)",
        path.display()
    );
    GgufFile::open(&path).unwrap()
}

/// The fixture with metadata changed by `edit` (None drops the key) and tensors filtered.
fn rewrite(
    src: &GgufFile,
    edit: impl Fn(&str, &Value) -> Option<Option<Value>>,
    keep_tensor: impl Fn(&str) -> bool,
) -> Result<Model, String> {
    rewrite_with(src, edit, keep_tensor, &[])
}

/// [`rewrite`], also adding the keys in `add`.
fn rewrite_with(
    src: &GgufFile,
    edit: impl Fn(&str, &Value) -> Option<Option<Value>>,
    keep_tensor: impl Fn(&str) -> bool,
    add: &[(&str, Value)],
) -> Result<Model, String> {
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata().iter() {
        match edit(k, v) {
            None => w.add(k, v.clone()).unwrap(),
            Some(Some(nv)) => w.add(k, nv).unwrap(),
            Some(None) => {}
        }
    }
    for (k, v) in add {
        w.add(k, v.clone()).unwrap();
    }
    for t in src.tensors().iter().filter(|t| keep_tensor(&t.name)) {
        w.add_tensor_info(&t.name, &t.dims, t.ty).unwrap();
    }
    let bytes = w
        .write_to_bytes(|t| src.tensor_data_by_name(&t.name).unwrap().unwrap().to_vec())
        .unwrap();
    let file = GgufFile::from_bytes("rewritten.gguf", bytes).map_err(|e| e.to_string())?;
    let model = Model::load(Arc::new(file)).map_err(|e| e.to_string())?;
    // A model that loads must also run.
    let mut cache = model.new_state(Some(16)).unwrap();
    model
        .forward(&[1, 2, 3], &mut cache, &Parallel::single(), Logits::All)
        .map_err(|e| e.to_string())?;
    Ok(model)
}

fn load_err(r: Result<Model, String>) -> String {
    match r {
        Ok(_) => panic!("a broken model loaded"),
        Err(e) => e,
    }
}

#[test]
fn unchanged_rewrite_loads() {
    let src = fixture("qwen3moe-tiny-Q4_K_M");
    assert!(rewrite(&src, |_, _| None, |_| true).is_ok());
}

#[test]
fn unsupported_architecture_lists_the_supported_ones() {
    let src = fixture("qwen3moe-tiny-F32");
    let e = load_err(rewrite(
        &src,
        |k, _| (k == "general.architecture").then(|| Some(Value::from("llama4"))),
        |_| true,
    ));
    assert!(
        e.contains("llama4") && e.contains("deepseek2") && e.contains("qwen3moe"),
        "{e}"
    );
}

#[test]
fn missing_key_is_named() {
    let src = fixture("glm4moe-tiny-F32");
    let e = load_err(rewrite(
        &src,
        |k, _| (k == "glm4moe.embedding_length").then_some(None),
        |_| true,
    ));
    assert!(e.contains("glm4moe.embedding_length"), "{e}");
}

#[test]
fn inconsistent_hyperparameters_are_errors() {
    let src = fixture("deepseek2-tiny-Q4_K_M");
    for (key, value) in [
        ("deepseek2.attention.head_count", Value::U32(3)),
        ("deepseek2.expert_used_count", Value::U32(99)),
        ("deepseek2.attention.kv_lora_rank", Value::U32(64)),
        ("deepseek2.rope.dimension_count", Value::U32(7)),
        ("deepseek2.expert_gating_func", Value::U32(9)),
        ("deepseek2.rope.scaling.type", Value::from("longrope")),
        ("deepseek2.embedding_length", Value::String("256".into())),
    ] {
        match rewrite(
            &src,
            |k, _| (k == key).then(|| Some(value.clone())),
            |_| true,
        ) {
            Ok(_) => panic!("{key} = {value:?} loaded"),
            Err(e) => assert!(!e.is_empty(), "{key}"),
        }
    }
    // Expert groups that do not divide the experts, or no used-group count.
    for add in [
        vec![
            ("deepseek2.expert_group_count", Value::U32(5)),
            ("deepseek2.expert_group_used_count", Value::U32(2)),
        ],
        vec![("deepseek2.expert_group_count", Value::U32(4))],
    ] {
        let e = load_err(rewrite_with(&src, |_, _| None, |_| true, &add));
        assert!(e.contains("expert groups"), "{e}");
    }
    // Valid groups load and run.
    let add = [
        ("deepseek2.expert_group_count", Value::U32(4)),
        ("deepseek2.expert_group_used_count", Value::U32(2)),
    ];
    assert!(rewrite_with(&src, |_, _| None, |_| true, &add).is_ok());
}

#[test]
fn missing_or_misshapen_tensor_is_named() {
    let src = fixture("deepseek2-tiny-F32");
    let e = load_err(rewrite(
        &src,
        |_, _| None,
        |n| n != "blk.1.ffn_up_exps.weight",
    ));
    assert!(e.contains("blk.1.ffn_up_exps.weight"), "{e}");
    // A vocabulary larger than the embedding matrix: the shape check catches it.
    let e = load_err(rewrite(
        &src,
        |k, _| (k == "deepseek2.vocab_size").then_some(Some(Value::U32(4096))),
        |_| true,
    ));
    assert!(e.contains("token_embd.weight"), "{e}");
}

#[test]
fn out_of_vocabulary_token_and_full_context_are_errors() {
    let file = Arc::new(fixture("qwen3moe-tiny-F32"));
    let model = Model::load(file).unwrap();
    let par = Parallel::single();
    let mut cache = model.new_state(Some(4)).unwrap();
    let e = model
        .forward(&[5, 2048], &mut cache, &par, Logits::Last)
        .unwrap_err();
    assert!(e.to_string().contains("2048"), "{e}");
    let e = model
        .forward(&[1, 2, 3, 4, 5], &mut cache, &par, Logits::Last)
        .unwrap_err();
    assert!(e.to_string().contains("context"), "{e}");
    // Nothing was stored by the failed calls; the cache is still usable.
    assert!(cache.is_empty());
    model
        .forward(&[1, 2, 3, 4], &mut cache, &par, Logits::Last)
        .unwrap();
}

/// qwen3next: the older converter's fused `ssm_in` layout is refused with what to do, and
/// `ssm.*` sizes the gated DeltaNet cannot have and bad lists of recurrent layers are named.
#[test]
fn qwen3next_legacy_layout_and_bad_metadata_are_refused() {
    let src = fixture("qwen3next-tiny-F32");
    // blk.0's attn_qkv renamed to the legacy ssm_in (its attn_gate dropped).
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata().iter() {
        w.add(k, v.clone()).unwrap();
    }
    let legacy = |name: &str| {
        if name == "blk.0.attn_qkv.weight" {
            "blk.0.ssm_in.weight".to_string()
        } else {
            name.to_string()
        }
    };
    for t in src.tensors() {
        if t.name != "blk.0.attn_gate.weight" {
            w.add_tensor_info(&legacy(&t.name), &t.dims, t.ty).unwrap();
        }
    }
    let bytes = w
        .write_to_bytes(|t| {
            let name = if t.name == "blk.0.ssm_in.weight" {
                "blk.0.attn_qkv.weight"
            } else {
                &t.name
            };
            src.tensor_data_by_name(name).unwrap().unwrap().to_vec()
        })
        .unwrap();
    let file = GgufFile::from_bytes("legacy.gguf", bytes).unwrap();
    let e = Model::load(Arc::new(file))
        .err()
        .expect("legacy layout")
        .to_string();
    assert!(e.contains("ssm_in") && e.contains("re-convert"), "{e}");

    for (key, value, named) in [
        (
            "qwen3next.ssm.time_step_rank",
            Value::U32(3),
            "time_step_rank",
        ),
        ("qwen3next.ssm.inner_size", Value::U32(100), "inner_size"),
        ("qwen3next.ssm.conv_kernel", Value::U32(1), "conv_kernel"),
        (
            "qwen3next.full_attention_interval",
            Value::U32(0),
            "full_attention_interval",
        ),
    ] {
        let e = load_err(rewrite(
            &src,
            |k, _| (k == key).then(|| Some(value.clone())),
            |_| true,
        ));
        assert!(e.contains(named), "{key}: {e}");
    }
    let e = load_err(rewrite(
        &src,
        |k, _| (k == "qwen3next.ssm.state_size").then_some(None),
        |_| true,
    ));
    assert!(e.contains("qwen3next.ssm.state_size"), "{e}");

    // Recurrent layers listed per layer: the fixture's own pattern loads; too few entries, or
    // a full-attention layer where the file has DeltaNet tensors, are named errors.
    let flags = |v: &[bool]| Value::Array(Array::new(ArrayData::Bool(v.to_vec())));
    let key = "qwen3next.attention.recurrent_layers";
    let with = |v: &[bool]| rewrite_with(&src, |_, _| None, |_| true, &[(key, flags(v))]);
    assert!(with(&[true, true, true, false]).is_ok());
    let e = load_err(with(&[true, true, true]));
    assert!(e.contains(key) && e.contains("3 entries"), "{e}");
    let e = load_err(with(&[false, true, true, false]));
    assert!(e.contains("blk.0.attn_q.weight"), "{e}");
}
