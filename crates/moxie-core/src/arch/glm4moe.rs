//! GLM-4.5/4.6/4.7 (`glm4moe`): GQA with q/k/v biases and optional per-head q/k norms, partial
//! NEOX rotary, `post_attention_norm` before the FFN, leading dense layers, sigmoid-gated
//! experts with selection bias plus a shared expert. The trailing MTP (nextn) block is not
//! part of the main graph and is skipped.

use super::{blk, dense_ffn, moe_ffn};
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
        bq: src.vec_opt(&blk(il, "attn_q.bias"), q_w)?,
        bk: src.vec_opt(&blk(il, "attn_k.bias"), kv_w)?,
        bv: src.vec_opt(&blk(il, "attn_v.bias"), v_w)?,
        q_norm: src.vec_opt(&blk(il, "attn_q_norm.weight"), hd)?,
        k_norm: src.vec_opt(&blk(il, "attn_k_norm.weight"), hd)?,
        wo: src.get(
            &blk(il, "attn_output.weight"),
            &[c.n_head * c.head_dim_v, d],
        )?,
    });
    let ffn = if il < c.n_layer_dense_lead {
        dense_ffn(c, src, il)?
    } else {
        moe_ffn(c, src, il)?
    };
    Ok(Layer {
        attn_norm: src.vec(&blk(il, "attn_norm.weight"), d)?,
        attn,
        ffn_norm: src.vec(&blk(il, "post_attention_norm.weight"), d)?,
        ffn,
    })
}
