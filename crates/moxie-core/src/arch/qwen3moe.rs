//! Qwen3-MoE (`qwen3moe`, Qwen3-30B-A3B / 235B-A22B): GQA with per-head q/k RMS norms, NEOX
//! rotary over the whole head, softmax top-k routing with renormalised weights (llama.cpp
//! hard-codes the renormalisation), no shared expert.

use super::{blk, gqa_attention, moe_ffn};
use crate::config::Config;
use crate::model::{Layer, TensorSource};
use crate::Result;

pub(crate) fn load_layer(c: &Config, src: &TensorSource, il: usize) -> Result<Layer> {
    Ok(Layer {
        attn_norm: src.vec(&blk(il, "attn_norm.weight"), c.n_embd)?,
        attn: gqa_attention(c, src, il, false, true)?,
        ffn_norm: src.vec(&blk(il, "ffn_norm.weight"), c.n_embd)?,
        ffn: moe_ffn(c, src, il)?,
    })
}
