//! The architectures moxie runs. Each file declares, for one architecture: where its
//! hyper-parameters differ from the common ones (`config.rs`), the tensors of its layers with
//! their shapes (as llama.cpp's loader declares them), and the blocks each layer is built
//! from. The blocks themselves (`crate::blocks`) and the forward pass are shared.

pub mod deepseek2;
pub mod glm4moe;
pub mod glm_dsa;
pub mod legacy_mla;
pub mod llama;
pub mod qwen3moe;
pub mod qwen3next;

use crate::blocks::moe::Routing;
use crate::blocks::{DenseFfn, Ffn, Gqa, Layer, Mixer, Moe};
use crate::config::{Arch, Config, Keys};
use crate::loader::{BlockTensors, TensorSource};
use crate::Result;

/// Loads layer `il` of an architecture.
pub(crate) type LayerFn = fn(&Config, &Keys, &TensorSource, usize) -> Result<Layer>;

/// One architecture: its hyper-parameter quirks and its layers.
pub(crate) struct ArchDef {
    pub arch: Arch,
    /// Adjust the common hyper-parameters where llama.cpp's graph for this architecture
    /// differs (gating default, RoPE layout, YaRN fix-ups).
    pub hparams: fn(&mut Config, &Keys) -> Result<()>,
    /// Every layer of the main graph, its tensors loaded where the placement puts them.
    pub layers: fn(&Config, &Keys, &TensorSource) -> Result<Vec<Layer>>,
    /// The decoder layer of the MTP (nextn) block at index `il` (after the main layers), as
    /// llama.cpp's MTP graph runs it, for architectures whose MTP head moxie runs.
    pub mtp_layer: Option<LayerFn>,
}

/// The definition of `arch`.
pub(crate) fn def(arch: Arch) -> &'static ArchDef {
    match arch {
        Arch::Llama => &llama::DEF,
        Arch::Deepseek2 => &deepseek2::DEF,
        Arch::GlmDsa => &glm_dsa::DEF,
        Arch::Glm4Moe => &glm4moe::DEF,
        Arch::Qwen3Moe => &qwen3moe::DEF,
        Arch::Qwen3Next => &qwen3next::DEF,
    }
}

/// `blk.{il}.{name}`
pub(crate) fn blk(il: usize, name: &str) -> String {
    format!("blk.{il}.{name}")
}

/// The tensors of layer `il`'s token mixer (with its norm).
pub(crate) fn attention_tensors<'a>(src: &'a TensorSource<'a>, il: usize) -> BlockTensors<'a> {
    src.block(format!("layer {il}'s attention"))
}

/// The tensors of layer `il`'s feed-forward part (its norm, a dense FFN or the router,
/// selection bias and shared expert).
pub(crate) fn ffn_tensors<'a>(src: &'a TensorSource<'a>, il: usize) -> BlockTensors<'a> {
    src.block(format!(
        "layer {il}'s FFN norm, router and shared or dense FFN"
    ))
}

/// The dense SwiGLU FFN of a leading dense layer.
pub(crate) fn dense_ffn(c: &Config, t: &BlockTensors, il: usize) -> Result<Ffn> {
    Ok(Ffn::Dense(Box::new(DenseFfn {
        gate: t.get(&blk(il, "ffn_gate.weight"), &[c.n_embd, c.n_ff])?,
        up: t.get(&blk(il, "ffn_up.weight"), &[c.n_embd, c.n_ff])?,
        down: t.get(&blk(il, "ffn_down.weight"), &[c.n_ff, c.n_embd])?,
        device: t.device(),
    })))
}

/// Routed experts (their own block: they may live on another device), selection bias and
/// shared experts of an MoE layer; the router and shared expert load through `t`.
pub(crate) fn moe_ffn(c: &Config, t: &BlockTensors, src: &TensorSource, il: usize) -> Result<Ffn> {
    let (e, d, f) = (c.n_expert, c.n_embd, c.n_ff_exp);
    let experts = src.block(format!("layer {il}'s routed experts"));
    let router = t.get(&blk(il, "ffn_gate_inp.weight"), &[d, e])?;
    let probs_bias = t.vec_opt(&blk(il, "exp_probs_b.bias"), e)?;
    let shared = if c.n_expert_shared > 0 {
        let fs = f * c.n_expert_shared;
        Some(DenseFfn {
            gate: t.get(&blk(il, "ffn_gate_shexp.weight"), &[d, fs])?,
            up: t.get(&blk(il, "ffn_up_shexp.weight"), &[d, fs])?,
            down: t.get(&blk(il, "ffn_down_shexp.weight"), &[fs, d])?,
            device: t.device(),
        })
    } else {
        None
    };
    let mut moe = Moe {
        routing: Routing::from_config(c),
        router,
        probs_bias,
        gate_exps: experts.get(&blk(il, "ffn_gate_exps.weight"), &[d, f, e])?,
        up_exps: experts.get(&blk(il, "ffn_up_exps.weight"), &[d, f, e])?,
        down_exps: experts.get(&blk(il, "ffn_down_exps.weight"), &[f, d, e])?,
        shared,
        shared_gate: None,
        device: t.device(),
        experts_device: experts.device(),
        tally: match src.devices().gpu(t.device()) {
            Some(g) => {
                let words = moxie_gpu::ops::route_tally_words(e);
                Some(moxie_gpu::Buffer::from_bytes(
                    g.backend(),
                    &vec![0u8; 4 * words],
                )?)
            }
            None => None,
        },
        hot: None,
        cache: None,
    };
    moe.hot = src.hot_experts(il, &moe)?;
    moe.cache = src.expert_cache(il, &moe)?;
    Ok(Ffn::Moe(Box::new(moe)))
}

/// Whether a GQA layer's per-head q/k norms are required, optional or absent.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum QkNorm {
    Required,
    Optional,
}

/// Grouped-query attention tensors (`attn_q/k/v/output`), with optional q/k/v biases and
/// per-head q/k RMS norms.
pub(crate) fn gqa_attention(
    c: &Config,
    t: &BlockTensors,
    il: usize,
    with_biases: bool,
    qk_norm: QkNorm,
) -> Result<Mixer> {
    let d = c.n_embd;
    let hd = c.head_dim_k;
    let (q_w, kv_w) = (c.n_head * hd, c.n_head_kv * hd);
    let v_w = c.n_head_kv * c.head_dim_v;
    let bias = |name: &str, len: usize| {
        if with_biases {
            t.vec_opt(&blk(il, name), len)
        } else {
            Ok(None)
        }
    };
    let norm = |name: &str| match qk_norm {
        QkNorm::Required => t.vec(&blk(il, name), hd).map(Some),
        QkNorm::Optional => t.vec_opt(&blk(il, name), hd),
    };
    Ok(Mixer::Gqa(Gqa {
        wq: t.get(&blk(il, "attn_q.weight"), &[d, q_w])?,
        wk: t.get(&blk(il, "attn_k.weight"), &[d, kv_w])?,
        wv: t.get(&blk(il, "attn_v.weight"), &[d, v_w])?,
        bq: bias("attn_q.bias", q_w)?,
        bk: bias("attn_k.bias", kv_w)?,
        bv: bias("attn_v.bias", v_w)?,
        q_norm: norm("attn_q_norm.weight")?,
        k_norm: norm("attn_k_norm.weight")?,
        wo: t.get(
            &blk(il, "attn_output.weight"),
            &[c.n_head * c.head_dim_v, d],
        )?,
        n_head: c.n_head,
        n_head_kv: c.n_head_kv,
        head_k: hd,
        head_v: c.head_dim_v,
        kq_scale: 1.0 / (hd as f32).sqrt(),
        gated: false,
        device: t.device(),
    }))
}
