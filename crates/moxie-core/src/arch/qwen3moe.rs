//! Qwen3-MoE (`qwen3moe`, Qwen3-30B-A3B / 235B-A22B): GQA with per-head q/k RMS norms, NEOX
//! rotary over the whole head, softmax top-k routing with renormalised weights (llama.cpp
//! hard-codes the renormalisation), no shared expert.

use super::{blk, moe_ffn};
use crate::config::Config;
use crate::model::{Attention, Gqa, Layer, TensorSource};
use crate::Result;

pub(crate) fn load_layer(c: &Config, src: &TensorSource, il: usize) -> Result<Layer> {
    let d = c.n_embd;
    let hd = c.head_dim_k;
    let (q_w, kv_w) = (c.n_head * hd, c.n_head_kv * hd);
    let v_w = c.n_head_kv * c.head_dim_v;
    let attn = Attention::Gqa(Gqa {
        wq: src.get(&blk(il, "attn_q.weight"), &[d, q_w])?,
        wk: src.get(&blk(il, "attn_k.weight"), &[d, kv_w])?,
        wv: src.get(&blk(il, "attn_v.weight"), &[d, v_w])?,
        bq: None,
        bk: None,
        bv: None,
        q_norm: Some(src.vec(&blk(il, "attn_q_norm.weight"), hd)?),
        k_norm: Some(src.vec(&blk(il, "attn_k_norm.weight"), hd)?),
        wo: src.get(
            &blk(il, "attn_output.weight"),
            &[c.n_head * c.head_dim_v, d],
        )?,
    });
    Ok(Layer {
        attn_norm: src.vec(&blk(il, "attn_norm.weight"), d)?,
        attn,
        ffn_norm: src.vec(&blk(il, "ffn_norm.weight"), d)?,
        ffn: moe_ffn(c, src, il)?,
    })
}
