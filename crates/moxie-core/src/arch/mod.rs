//! Per-architecture tensor layouts. Each file names the tensors of one block with their
//! shapes (as llama.cpp's loader declares them); the forward pass is shared (`model.rs`).

pub mod deepseek2;
pub mod glm4moe;
pub mod qwen3moe;

use crate::config::Config;
use crate::model::{Attention, DenseFfn, Ffn, Gqa, Moe, TensorSource};
use crate::Result;

/// `blk.{il}.{name}`
pub(crate) fn blk(il: usize, name: &str) -> String {
    format!("blk.{il}.{name}")
}

/// The dense SwiGLU FFN of a leading dense layer.
pub(crate) fn dense_ffn(c: &Config, src: &TensorSource, il: usize) -> Result<Ffn> {
    Ok(Ffn::Dense(Box::new(DenseFfn {
        gate: src.get(&blk(il, "ffn_gate.weight"), &[c.n_embd, c.n_ff])?,
        up: src.get(&blk(il, "ffn_up.weight"), &[c.n_embd, c.n_ff])?,
        down: src.get(&blk(il, "ffn_down.weight"), &[c.n_ff, c.n_embd])?,
    })))
}

/// Routed experts, selection bias and shared experts of an MoE layer.
pub(crate) fn moe_ffn(c: &Config, src: &TensorSource, il: usize) -> Result<Ffn> {
    let (e, d, f) = (c.n_expert, c.n_embd, c.n_ff_exp);
    let shared = if c.n_expert_shared > 0 {
        let fs = f * c.n_expert_shared;
        Some(DenseFfn {
            gate: src.get(&blk(il, "ffn_gate_shexp.weight"), &[d, fs])?,
            up: src.get(&blk(il, "ffn_up_shexp.weight"), &[d, fs])?,
            down: src.get(&blk(il, "ffn_down_shexp.weight"), &[fs, d])?,
        })
    } else {
        None
    };
    Ok(Ffn::Moe(Box::new(Moe {
        router: src.get(&blk(il, "ffn_gate_inp.weight"), &[d, e])?,
        probs_bias: src.vec_opt(&blk(il, "exp_probs_b.bias"), e)?,
        gate_exps: src.get(&blk(il, "ffn_gate_exps.weight"), &[d, f, e])?,
        up_exps: src.get(&blk(il, "ffn_up_exps.weight"), &[d, f, e])?,
        down_exps: src.get(&blk(il, "ffn_down_exps.weight"), &[f, d, e])?,
        shared,
    })))
}

/// Grouped-query attention tensors (`attn_q/k/v/output`), with optional q/k/v biases and
/// per-head q/k RMS norms that are required when `qk_norm_required`.
pub(crate) fn gqa_attention(
    c: &Config,
    src: &TensorSource,
    il: usize,
    with_biases: bool,
    qk_norm_required: bool,
) -> Result<Attention> {
    let d = c.n_embd;
    let hd = c.head_dim_k;
    let (q_w, kv_w) = (c.n_head * hd, c.n_head_kv * hd);
    let v_w = c.n_head_kv * c.head_dim_v;
    let bias = |name: &str, len: usize| -> Result<Option<Vec<f32>>> {
        if with_biases {
            src.vec_opt(&blk(il, name), len)
        } else {
            Ok(None)
        }
    };
    let norm = |name: &str| -> Result<Option<Vec<f32>>> {
        if qk_norm_required {
            src.vec(&blk(il, name), hd).map(Some)
        } else {
            src.vec_opt(&blk(il, name), hd)
        }
    };
    Ok(Attention::Gqa(Gqa {
        wq: src.get(&blk(il, "attn_q.weight"), &[d, q_w])?,
        wk: src.get(&blk(il, "attn_k.weight"), &[d, kv_w])?,
        wv: src.get(&blk(il, "attn_v.weight"), &[d, v_w])?,
        bq: bias("attn_q.bias", q_w)?,
        bk: bias("attn_k.bias", kv_w)?,
        bv: bias("attn_v.bias", v_w)?,
        q_norm: norm("attn_q_norm.weight")?,
        k_norm: norm("attn_k_norm.weight")?,
        wo: src.get(
            &blk(il, "attn_output.weight"),
            &[c.n_head * c.head_dim_v, d],
        )?,
    }))
}
