//! GLM-4.5/4.6/4.7 (`glm4moe`): GQA with q/k/v biases and optional per-head q/k norms, partial
//! NEOX rotary, `post_attention_norm` before the FFN, leading dense layers, sigmoid-gated
//! experts with selection bias plus a shared expert. The trailing MTP (nextn) block is not
//! part of the main graph and is skipped.

use super::{blk, dense_ffn, gqa_attention, moe_ffn};
use crate::config::Config;
use crate::model::{Layer, TensorSource};
use crate::Result;

pub(crate) fn load_layer(c: &Config, src: &TensorSource, il: usize) -> Result<Layer> {
    let ffn = if il < c.n_layer_dense_lead {
        dense_ffn(c, src, il)?
    } else {
        moe_ffn(c, src, il)?
    };
    Ok(Layer {
        attn_norm: src.vec(&blk(il, "attn_norm.weight"), c.n_embd)?,
        attn: gqa_attention(c, src, il, true, false)?,
        ffn_norm: src.vec(&blk(il, "post_attention_norm.weight"), c.n_embd)?,
        ffn,
    })
}
