//! What a synthetic model contains: the tensor list (names and shapes as llama.cpp's loader
//! declares them, how each is initialised, its block type) and the metadata.

use moxie_gguf::{Array, Value};
use moxie_quant::GgmlType;

use super::random_blocks::random_blocks;
use super::routing::{self, RowRule, OUT_GAIN};
use super::vocab::{self, TokenizerStyle};
use super::SynthArch;
use super::{SynthSpec, SynthType};
use crate::config::Gating;
use crate::quant_rules::{self, ModelInfo, Params};
use crate::{Error, Result};

/// How a tensor's values are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TensorInit {
    /// `N(0, std²)`
    Normal { std: f32 },
    /// `1 + N(0, std²)` (norm weights)
    OnePlusNormal { std: f32 },
}

/// One tensor of the planned model.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedTensor {
    pub name: String,
    /// ggml order: `dims[0]` is the row length.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    pub init: TensorInit,
    /// How each drawn row is reshaped (`moxie gen --routing`'s attention window).
    pub rule: RowRule,
}

impl PlannedTensor {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    pub fn row_len(&self) -> u64 {
        self.dims[0]
    }

    pub fn n_rows(&self) -> u64 {
        self.dims[1..].iter().product()
    }

    /// Bytes of one row in the tensor's type.
    pub fn row_bytes(&self) -> u64 {
        self.ty.row_bytes(self.row_len()).unwrap_or(0)
    }

    pub fn n_bytes(&self) -> u64 {
        self.row_bytes() * self.n_rows()
    }
}

/// Std of norm weights around 1.
const NORM_STD: f32 = 0.1;
/// Std of attention biases.
const BIAS_STD: f32 = 0.1;
/// Largest value of any shape field.
const MAX_DIM: usize = 1 << 24;
/// Largest tensor (elements).
const MAX_TENSOR_ELEMENTS: u64 = 1 << 40;

fn bad(msg: String) -> Error {
    Error::Model(format!("synth: {msg}"))
}

/// Shape checks (everything [`plan`] and llama.cpp rely on).
pub(crate) fn validate(spec: &SynthSpec) -> Result<()> {
    let s = &spec.shape;
    let arch = spec.arch.name();
    let fields: [(&str, usize); 19] = [
        ("vocab", s.n_vocab),
        ("n_embd", s.n_embd),
        ("n_layer", s.n_layer),
        ("n_ff", s.n_ff),
        ("n_head", s.n_head),
        ("n_head_kv", s.n_head_kv),
        ("head_dim", s.head_dim),
        ("n_rot", s.n_rot.unwrap_or(0)),
        ("q_lora_rank", s.q_lora_rank),
        ("kv_lora_rank", s.kv_lora_rank),
        ("qk_nope_dim", s.qk_nope_dim),
        ("qk_rope_dim", s.qk_rope_dim),
        ("v_head_dim", s.v_head_dim),
        ("n_expert", s.n_expert),
        ("n_ff_exp", s.n_ff_exp),
        ("n_expert_shared", s.n_expert_shared),
        ("n_ctx", s.n_ctx_train),
        ("n_dense_lead", s.n_dense_lead),
        ("n_expert_used", s.n_expert_used),
    ];
    for (k, v) in fields {
        if v > MAX_DIM {
            return Err(bad(format!("{k} = {v} is too large (at most {MAX_DIM})")));
        }
    }
    let positive: [(&str, usize); 6] = [
        ("n_embd", s.n_embd),
        ("n_layer", s.n_layer),
        ("n_head", s.n_head),
        ("n_expert", s.n_expert),
        ("n_expert_used", s.n_expert_used),
        ("n_ctx", s.n_ctx_train),
    ];
    for (k, v) in positive {
        if v == 0 {
            return Err(bad(format!("{k} must be > 0")));
        }
    }
    if s.n_vocab < vocab::MIN_VOCAB {
        return Err(bad(format!(
            "vocab {} is too small: at least {} (256 byte tokens + {} special tokens)",
            s.n_vocab,
            vocab::MIN_VOCAB,
            vocab::SPECIALS.len()
        )));
    }
    if s.n_vocab > i32::MAX as usize {
        return Err(bad(format!("vocab {} is too large", s.n_vocab)));
    }
    if s.n_expert_used > s.n_expert {
        return Err(bad(format!(
            "n_expert_used {} is more than n_expert {}",
            s.n_expert_used, s.n_expert
        )));
    }
    if s.n_expert_groups > 1
        && (!s.n_expert.is_multiple_of(s.n_expert_groups)
            || s.n_group_used == 0
            || s.n_group_used >= s.n_expert_groups
            || s.n_group_used * (s.n_expert / s.n_expert_groups) < s.n_expert_used)
    {
        return Err(bad(format!(
            "expert groups: {} groups with {} used must split n_expert {} evenly, use fewer \
             groups than there are, and hold n_expert_used {} experts",
            s.n_expert_groups, s.n_group_used, s.n_expert, s.n_expert_used
        )));
    }
    if s.n_dense_lead > s.n_layer {
        return Err(bad(format!(
            "n_dense_lead {} is more than n_layer {}",
            s.n_dense_lead, s.n_layer
        )));
    }
    if s.n_dense_lead < s.n_layer && s.n_ff_exp == 0 {
        return Err(bad("n_ff_exp must be > 0".into()));
    }
    if s.n_dense_lead > 0 && s.n_ff == 0 {
        return Err(bad("n_ff must be > 0 when there are dense layers".into()));
    }
    if !(s.rms_eps > 0.0 && s.rope_theta > 0.0 && s.expert_weights_scale.is_finite()) {
        return Err(bad("rms_eps and rope_theta must be > 0".into()));
    }
    if !(s.logit_std > 0.0 && s.router_std > 0.0) {
        return Err(bad("logit_std and router_std must be > 0".into()));
    }
    if s.n_ctx_train > u32::MAX as usize {
        return Err(bad("n_ctx is too large".into()));
    }
    match spec.arch {
        SynthArch::Deepseek2 => {
            if s.kv_lora_rank == 0 || s.qk_nope_dim == 0 || s.v_head_dim == 0 {
                return Err(bad(
                    "deepseek2 needs kv_lora_rank, qk_nope_dim and v_head_dim > 0".into(),
                ));
            }
            if s.qk_rope_dim == 0 || !s.qk_rope_dim.is_multiple_of(2) {
                return Err(bad(format!(
                    "qk_rope_dim {} must be even and > 0",
                    s.qk_rope_dim
                )));
            }
            if let Some(y) = s.yarn {
                if !y.factor.is_finite() || y.factor <= 0.0 || y.orig_ctx == 0 {
                    return Err(bad(
                        "YaRN needs yarn_factor > 0 and yarn_orig_ctx > 0".into()
                    ));
                }
            }
        }
        SynthArch::Qwen3Moe | SynthArch::Glm4Moe => {
            if s.n_head_kv == 0 || s.head_dim == 0 {
                return Err(bad(format!("{arch} needs n_head_kv and head_dim > 0")));
            }
            if !s.n_head.is_multiple_of(s.n_head_kv) {
                return Err(bad(format!(
                    "n_head {} is not a multiple of n_head_kv {}",
                    s.n_head, s.n_head_kv
                )));
            }
            let rot = s.rot_dims(spec.arch);
            if rot == 0 || !rot.is_multiple_of(2) || rot > s.head_dim {
                return Err(bad(format!(
                    "rotary dims {rot} must be even, > 0 and at most head_dim {}",
                    s.head_dim
                )));
            }
            if s.yarn.is_some() {
                return Err(bad(format!(
                    "YaRN is only supported for deepseek2, not {arch}"
                )));
            }
        }
    }
    if spec.arch == SynthArch::Qwen3Moe {
        if s.n_dense_lead != 0 || s.n_expert_shared != 0 {
            return Err(bad(
                "qwen3moe has no dense layers and no shared experts (n_dense_lead = n_expert_shared = 0)"
                    .into(),
            ));
        }
        if s.gating != Gating::Softmax {
            return Err(bad(
                "qwen3moe routing is softmax (llama.cpp hard-codes it)".into()
            ));
        }
        if s.rot_dims(spec.arch) != s.head_dim {
            return Err(bad(
                "qwen3moe rotates the whole head (n_rot = head_dim)".into()
            ));
        }
    }
    routing::validate(spec)
}

fn normal(std: f32) -> TensorInit {
    TensorInit::Normal { std }
}

fn scaled(gain: f32, fan_in: usize) -> TensorInit {
    normal(gain / (fan_in as f32).sqrt())
}

const NORM: TensorInit = TensorInit::OnePlusNormal { std: NORM_STD };

/// Tensor names, shapes and initialisation, in file order (the fixtures' order).
pub(super) fn tensor_list(spec: &SynthSpec) -> Vec<(String, Vec<u64>, TensorInit)> {
    let s = &spec.shape;
    let mut t: Vec<(String, Vec<u64>, TensorInit)> = Vec::new();
    let mut add = |name: String, dims: &[usize], init: TensorInit| {
        t.push((name, dims.iter().map(|&d| d as u64).collect(), init));
    };
    let e = s.n_embd;
    add("token_embd.weight".into(), &[e, s.n_vocab], normal(1.0));
    for il in 0..s.n_layer {
        let n = |x: &str| format!("blk.{il}.{x}");
        add(n("attn_norm.weight"), &[e], NORM);
        match spec.arch {
            SynthArch::Deepseek2 => {
                let qk_head = s.qk_nope_dim + s.qk_rope_dim;
                if s.q_lora_rank > 0 {
                    add(n("attn_q_a_norm.weight"), &[s.q_lora_rank], NORM);
                }
                add(n("attn_kv_a_norm.weight"), &[s.kv_lora_rank], NORM);
                if s.q_lora_rank > 0 {
                    add(n("attn_q_a.weight"), &[e, s.q_lora_rank], scaled(1.0, e));
                    add(
                        n("attn_q_b.weight"),
                        &[s.q_lora_rank, s.n_head * qk_head],
                        scaled(1.0, s.q_lora_rank),
                    );
                } else {
                    add(n("attn_q.weight"), &[e, s.n_head * qk_head], scaled(1.0, e));
                }
                add(
                    n("attn_kv_a_mqa.weight"),
                    &[e, s.kv_lora_rank + s.qk_rope_dim],
                    scaled(1.0, e),
                );
                // k_b / v_b are the halves of the latent -> per-head projection kv_b
                // (fan-in kv_lora_rank), stored transposed / per head.
                add(
                    n("attn_k_b.weight"),
                    &[s.qk_nope_dim, s.kv_lora_rank, s.n_head],
                    scaled(1.0, s.kv_lora_rank),
                );
                add(
                    n("attn_v_b.weight"),
                    &[s.kv_lora_rank, s.v_head_dim, s.n_head],
                    scaled(1.0, s.kv_lora_rank),
                );
                let v_all = s.n_head * s.v_head_dim;
                add(
                    n("attn_output.weight"),
                    &[v_all, e],
                    scaled(s.routing.attn_gain, v_all),
                );
                add(n("ffn_norm.weight"), &[e], NORM);
            }
            SynthArch::Qwen3Moe | SynthArch::Glm4Moe => {
                let q = s.n_head * s.head_dim;
                let kv = s.n_head_kv * s.head_dim;
                add(n("attn_q.weight"), &[e, q], scaled(1.0, e));
                add(n("attn_k.weight"), &[e, kv], scaled(1.0, e));
                add(n("attn_v.weight"), &[e, kv], scaled(1.0, e));
                if spec.arch == SynthArch::Glm4Moe {
                    add(n("attn_q.bias"), &[q], normal(BIAS_STD));
                    add(n("attn_k.bias"), &[kv], normal(BIAS_STD));
                    add(n("attn_v.bias"), &[kv], normal(BIAS_STD));
                }
                add(
                    n("attn_output.weight"),
                    &[q, e],
                    scaled(s.routing.attn_gain, q),
                );
                add(n("attn_q_norm.weight"), &[s.head_dim], NORM);
                add(n("attn_k_norm.weight"), &[s.head_dim], NORM);
                let ffn_norm = if spec.arch == SynthArch::Glm4Moe {
                    "post_attention_norm.weight"
                } else {
                    "ffn_norm.weight"
                };
                add(n(ffn_norm), &[e], NORM);
            }
        }
        if s.is_dense(il) {
            add(n("ffn_gate.weight"), &[e, s.n_ff], scaled(1.0, e));
            add(n("ffn_up.weight"), &[e, s.n_ff], scaled(1.0, e));
            add(n("ffn_down.weight"), &[s.n_ff, e], scaled(OUT_GAIN, s.n_ff));
        } else {
            let (x, f) = (s.n_expert, s.n_ff_exp);
            add(n("ffn_gate_inp.weight"), &[e, x], scaled(s.router_std, e));
            let probs_b = match spec.arch {
                SynthArch::Glm4Moe => true, // required by llama.cpp's glm4moe loader
                SynthArch::Deepseek2 => s.gating == Gating::Sigmoid,
                SynthArch::Qwen3Moe => false,
            };
            if probs_b {
                let n_moe = s.n_layer - s.n_dense_lead.min(s.n_layer);
                let skew = s.routing.skew_at(il - s.n_dense_lead, n_moe);
                add(n("exp_probs_b.bias"), &[x], normal(skew));
            }
            add(n("ffn_gate_exps.weight"), &[e, f, x], scaled(1.0, e));
            add(n("ffn_up_exps.weight"), &[e, f, x], scaled(1.0, e));
            add(n("ffn_down_exps.weight"), &[f, e, x], scaled(OUT_GAIN, f));
            if s.n_expert_shared > 0 {
                let fs = f * s.n_expert_shared;
                add(n("ffn_gate_shexp.weight"), &[e, fs], scaled(1.0, e));
                add(n("ffn_up_shexp.weight"), &[e, fs], scaled(1.0, e));
                add(n("ffn_down_shexp.weight"), &[fs, e], scaled(OUT_GAIN, fs));
            }
        }
    }
    add("output_norm.weight".into(), &[e], NORM);
    add(
        "output.weight".into(),
        &[e, s.n_vocab],
        scaled(s.logit_std, e),
    );
    t
}

/// The block type of each of `tensors` (names and shapes, in any order) in a file of
/// architecture `arch` whose other metadata `keys` holds (the `<arch>.*` hyper-parameters
/// llama-quantize's rules read): llama-quantize's choice for type `ty` from an F32 master
/// ([`crate::quant_rules`]), asked in llama-quantize's order.
pub(super) fn choose_types(
    ty: SynthType,
    arch: &str,
    keys: &[(String, Value)],
    tensors: &[(&str, &[u64])],
) -> Result<Vec<GgmlType>> {
    let master = GgmlType::F32;
    match ty {
        SynthType::Ftype(f) => {
            let arch_value = Value::from(arch);
            let model = ModelInfo::from_lookup("synth", |k| {
                if k == "general.architecture" {
                    Some(&arch_value)
                } else {
                    keys.iter().find(|(key, _)| key == k).map(|(_, v)| v)
                }
            })?;
            let list: Vec<(&str, &[u64], GgmlType)> =
                tensors.iter().map(|&(n, d)| (n, d, master)).collect();
            Ok(quant_rules::tensor_types(&model, &Params::plain(f), &list)?.0)
        }
        SynthType::Pure(t) => tensors
            .iter()
            .map(|&(n, d)| quant_rules::pure_type(arch, n, d, master, t))
            .collect(),
    }
}

/// The full tensor plan: names, shapes, initialisation and block types, in file order.
pub fn plan(spec: &SynthSpec) -> Result<Vec<PlannedTensor>> {
    validate(spec)?;
    let list = tensor_list(spec);
    for (name, dims, _) in &list {
        if dims.contains(&0) {
            return Err(bad(format!(
                "tensor '{name}' would have a zero dimension: {dims:?}"
            )));
        }
        let n_elements = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        if n_elements.is_none_or(|n| n > MAX_TENSOR_ELEMENTS) || dims[0] > MAX_DIM as u64 {
            return Err(bad(format!("tensor '{name}' would be too large: {dims:?}")));
        }
    }
    let shapes: Vec<(&str, &[u64])> = list
        .iter()
        .map(|(n, d, _)| (n.as_str(), d.as_slice()))
        .collect();
    let types = choose_types(spec.ty, spec.arch.name(), &arch_keys(spec), &shapes)?;
    let mut out = Vec::with_capacity(list.len());
    for ((name, dims, init), ty) in list.into_iter().zip(types) {
        let ncols = dims[0];
        if random_blocks(ty) {
            if !matches!(init, TensorInit::Normal { .. }) {
                return Err(bad(format!(
                    "tensor '{name}' would be {ty}, written as random blocks, which cannot stand for its initialisation {init:?}"
                )));
            }
        } else if moxie_quant::quantize_weights_fn(ty).is_none() {
            return Err(bad(format!(
                "tensor '{name}' would be {ty}, which moxie can neither quantize to nor write random blocks of (it writes random IQ1_S/IQ1_M/IQ2_XXS/IQ2_XS/IQ2_S/IQ3_XXS/IQ3_S blocks; --header-only writes any type)"
            )));
        }
        if ty.row_bytes(ncols).is_none() {
            return Err(bad(format!(
                "tensor '{name}': rows of {ncols} do not fit {ty} blocks"
            )));
        }
        let rule = routing::row_rule(spec, &name);
        if rule != RowRule::AsDrawn && random_blocks(ty) {
            return Err(bad(format!(
                "tensor '{name}' would be {ty}, written as random blocks, which cannot hold the attention window of --routing / attn_window (pick a type whose attention tensors moxie quantizes, e.g. Q4_K_M or Q8_0)"
            )));
        }
        out.push(PlannedTensor {
            name,
            dims,
            ty,
            init,
            rule,
        });
    }
    Ok(out)
}

/// The architecture's hyper-parameter keys (`<arch>.*`) as llama.cpp's converter writes them
/// for this shape.
pub(super) fn arch_keys(spec: &SynthSpec) -> Vec<(String, Value)> {
    let s = &spec.shape;
    let a = spec.arch.name();
    let u = |x: usize| Value::U32(x as u32);
    let ak = |k: &str| format!("{a}.{k}");
    let mut keys: Vec<(String, Value)> = vec![
        (ak("block_count"), u(s.n_layer)),
        (ak("context_length"), u(s.n_ctx_train)),
        (ak("embedding_length"), u(s.n_embd)),
        (ak("feed_forward_length"), u(s.n_ff)),
        (ak("attention.head_count"), u(s.n_head)),
        (ak("rope.freq_base"), Value::F32(s.rope_theta)),
        (
            ak("attention.layer_norm_rms_epsilon"),
            Value::F32(s.rms_eps),
        ),
        (ak("expert_count"), u(s.n_expert)),
        (ak("expert_used_count"), u(s.n_expert_used)),
        (ak("expert_feed_forward_length"), u(s.n_ff_exp)),
        (ak("vocab_size"), u(s.n_vocab)),
    ];
    if s.n_expert_groups > 1 {
        // Where DeepSeek-V3's converter writes them: right after `expert_used_count`.
        let at = keys.len() - 2;
        keys.splice(
            at..at,
            [
                (ak("expert_group_count"), u(s.n_expert_groups)),
                (ak("expert_group_used_count"), u(s.n_group_used)),
            ],
        );
    }
    let gating = Value::U32(match s.gating {
        Gating::Softmax => 1,
        Gating::Sigmoid => 2,
    });
    match spec.arch {
        SynthArch::Deepseek2 => {
            keys.extend([
                (ak("attention.head_count_kv"), u(1)),
                (ak("leading_dense_block_count"), u(s.n_dense_lead)),
                (ak("attention.q_lora_rank"), u(s.q_lora_rank)),
                (ak("attention.kv_lora_rank"), u(s.kv_lora_rank)),
                (
                    ak("attention.key_length"),
                    u(s.kv_lora_rank + s.qk_rope_dim),
                ),
                (ak("attention.value_length"), u(s.kv_lora_rank)),
                (
                    ak("attention.key_length_mla"),
                    u(s.qk_nope_dim + s.qk_rope_dim),
                ),
                (ak("attention.value_length_mla"), u(s.v_head_dim)),
                (ak("expert_shared_count"), u(s.n_expert_shared)),
                (
                    ak("expert_weights_scale"),
                    Value::F32(s.expert_weights_scale),
                ),
                (
                    ak("expert_weights_norm"),
                    Value::Bool(s.expert_weights_norm),
                ),
                (ak("expert_gating_func"), gating),
                (ak("rope.dimension_count"), u(s.qk_rope_dim)),
            ]);
            if let Some(y) = s.yarn {
                keys.extend([
                    (ak("rope.scaling.type"), "yarn".into()),
                    (ak("rope.scaling.factor"), Value::F32(y.factor)),
                    (ak("rope.scaling.original_context_length"), u(y.orig_ctx)),
                    (
                        ak("rope.scaling.yarn_log_multiplier"),
                        Value::F32(y.log_multiplier),
                    ),
                ]);
            }
        }
        SynthArch::Qwen3Moe => keys.extend([
            (ak("attention.head_count_kv"), u(s.n_head_kv)),
            (ak("attention.key_length"), u(s.head_dim)),
            (ak("attention.value_length"), u(s.head_dim)),
        ]),
        SynthArch::Glm4Moe => keys.extend([
            (ak("attention.head_count_kv"), u(s.n_head_kv)),
            (ak("attention.key_length"), u(s.head_dim)),
            (ak("attention.value_length"), u(s.head_dim)),
            (ak("rope.dimension_count"), u(s.rot_dims(spec.arch))),
            (ak("expert_shared_count"), u(s.n_expert_shared)),
            (ak("leading_dense_block_count"), u(s.n_dense_lead)),
            (ak("expert_gating_func"), gating),
            (
                ak("expert_weights_scale"),
                Value::F32(s.expert_weights_scale),
            ),
            (
                ak("expert_weights_norm"),
                Value::Bool(s.expert_weights_norm),
            ),
        ]),
    }
    keys
}

/// The metadata, in file order: `general.*`, the architecture's keys (exactly the fixtures'
/// key set), `general.file_type` / `quantization_version`, then the tokenizer.
pub fn metadata(spec: &SynthSpec) -> Result<Vec<(String, Value)>> {
    validate(spec)?;
    let s = &spec.shape;
    let a = spec.arch.name();
    let mut m: Vec<(String, Value)> = Vec::new();
    let mut put = |k: &str, v: Value| m.push((k.to_owned(), v));
    put("general.architecture", a.into());
    put("general.name", spec.name.as_str().into());
    put("general.description", spec.description().into());

    for (k, v) in arch_keys(spec) {
        put(&k, v);
    }
    put("general.file_type", Value::U32(spec.ty.file_type()));
    put("general.quantization_version", Value::U32(2));

    let v = vocab::build(s.n_vocab).map_err(bad)?;
    let style = TokenizerStyle::of(spec.arch);
    let id = |t: &str| -> Result<Value> {
        v.id_of(t)
            .map(Value::U32)
            .ok_or_else(|| bad(format!("special token {t} missing from the vocabulary")))
    };
    let (bos, eos, pad) = (id(style.bos)?, id(style.eos)?, id(style.padding)?);
    let eot = style.eot.map(id).transpose()?;
    put("tokenizer.ggml.model", "gpt2".into());
    put("tokenizer.ggml.pre", style.pre.into());
    put(
        "tokenizer.ggml.tokens",
        Value::Array(Array::from_strs(&v.tokens)),
    );
    put(
        "tokenizer.ggml.token_type",
        Value::Array(Array::from(v.token_types)),
    );
    put(
        "tokenizer.ggml.merges",
        Value::Array(Array::from_strs(&v.merges)),
    );
    put("tokenizer.ggml.bos_token_id", bos);
    put("tokenizer.ggml.eos_token_id", eos);
    put("tokenizer.ggml.padding_token_id", pad);
    if let Some(eot) = eot {
        put("tokenizer.ggml.eot_token_id", eot);
    }
    put("tokenizer.ggml.add_bos_token", Value::Bool(style.add_bos));
    put("tokenizer.ggml.add_eos_token", Value::Bool(false));
    put("tokenizer.chat_template", style.chat_template.into());
    Ok(m)
}
