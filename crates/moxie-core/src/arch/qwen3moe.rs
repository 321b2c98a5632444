//! Qwen3-MoE (`qwen3moe`, Qwen3-30B-A3B / 235B-A22B): GQA with per-head q/k RMS norms, NEOX
//! rotary over the whole head, softmax top-k routing with renormalised weights (llama.cpp's
//! graph hard-codes both, whatever the metadata says), no shared expert.

use super::{attention_tensors, blk, ffn_tensors, gqa_attention, moe_ffn, ArchDef, QkNorm};
use crate::blocks::Layer;
use crate::config::{Arch, Config, Gating, Keys};
use crate::loader::TensorSource;
use crate::ops::RopeKind;
use crate::Result;

pub(crate) const DEF: ArchDef = ArchDef {
    arch: Arch::Qwen3Moe,
    hparams,
    layers,
    // Qwen3-MoE checkpoints have no MTP block.
    mtp_layer: None,
};

fn hparams(c: &mut Config, _: &Keys) -> Result<()> {
    c.gating = Gating::Softmax;
    c.expert_weights_norm = true;
    c.rope.kind = RopeKind::Neox;
    Ok(())
}

fn layers(c: &Config, _: &Keys, src: &TensorSource) -> Result<Vec<Layer>> {
    (0..c.n_layer)
        .map(|il| {
            let attn = attention_tensors(src, il);
            let ffn = ffn_tensors(src, il);
            Ok(Layer {
                attn_norm: attn.vec(&blk(il, "attn_norm.weight"), c.n_embd)?,
                mixer: gqa_attention(c, &attn, il, false, QkNorm::Required)?,
                ffn_norm: ffn.vec(&blk(il, "ffn_norm.weight"), c.n_embd)?,
                ffn: moe_ffn(c, &ffn, src, il)?,
            })
        })
        .collect()
}
