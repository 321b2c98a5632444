//! GLM-4.5/4.6/4.7 (`glm4moe`): GQA with q/k/v biases and optional per-head q/k norms, partial
//! NEOX rotary, `post_attention_norm` before the FFN, leading dense layers, sigmoid-gated
//! experts (the default when the metadata names no gating function) with selection bias plus
//! a shared expert. The trailing MTP (nextn) block is not part of the main graph and is
//! skipped.

use super::{
    attention_tensors, blk, dense_ffn, ffn_tensors, gqa_attention, moe_ffn, ArchDef, QkNorm,
};
use crate::blocks::Layer;
use crate::config::{Arch, Config, Gating, Keys};
use crate::loader::TensorSource;
use crate::ops::RopeKind;
use crate::Result;

pub(crate) const DEF: ArchDef = ArchDef {
    arch: Arch::Glm4Moe,
    hparams,
    layers,
    mtp_layer: Some(layer),
};

fn hparams(c: &mut Config, k: &Keys) -> Result<()> {
    if k.uint_opt("expert_gating_func")?.unwrap_or(0) == 0 {
        c.gating = Gating::Sigmoid;
    }
    c.rope.kind = RopeKind::Neox;
    Ok(())
}

fn layers(c: &Config, k: &Keys, src: &TensorSource) -> Result<Vec<Layer>> {
    (0..c.n_layer).map(|il| layer(c, k, src, il)).collect()
}

/// Layer `il` (the MTP block's decoder layer is the same as the main ones).
fn layer(c: &Config, _: &Keys, src: &TensorSource, il: usize) -> Result<Layer> {
    let attn = attention_tensors(src, il);
    let ffn = ffn_tensors(src, il);
    Ok(Layer {
        attn_norm: attn.vec(&blk(il, "attn_norm.weight"), c.n_embd)?,
        mixer: gqa_attention(c, &attn, il, true, QkNorm::Optional)?,
        ffn_norm: ffn.vec(&blk(il, "post_attention_norm.weight"), c.n_embd)?,
        ffn: if il < c.n_layer_dense_lead {
            dense_ffn(c, &ffn, il)?
        } else {
            moe_ffn(c, &ffn, src, il)?
        },
    })
}
