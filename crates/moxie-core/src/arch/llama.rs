//! Llama (`llama`: Llama 2/3, SmolLM2, Mistral, and Mixtral with its experts): GQA with
//! optional q/k/v biases, normal (not NEOX) rotary, RMS norms, a dense SwiGLU FFN, or softmax
//! top-k routed experts with renormalised weights where the file has them (llama.cpp's
//! `llm_build_llama`). Llama 3.1's rotary frequency factors (`rope_freqs.weight`) and an
//! attention output bias are refused by name, not ignored.

use super::{
    attention_tensors, blk, dense_ffn, ffn_tensors, gqa_attention, moe_ffn, ArchDef, QkNorm,
};
use crate::blocks::Layer;
use crate::config::{Arch, Config, Gating, Keys};
use crate::loader::TensorSource;
use crate::ops::RopeKind;
use crate::{Error, Result};

pub(crate) const DEF: ArchDef = ArchDef {
    arch: Arch::Llama,
    hparams,
    layers,
    mtp_layer: None,
};

fn hparams(c: &mut Config, _: &Keys) -> Result<()> {
    c.gating = Gating::Softmax;
    c.expert_weights_norm = true;
    c.rope.kind = RopeKind::Normal;
    Ok(())
}

fn layers(c: &Config, _: &Keys, src: &TensorSource) -> Result<Vec<Layer>> {
    for name in ["rope_freqs.weight", &blk(0, "attn_output.bias")] {
        if src.has(name) {
            return Err(Error::Model(format!(
                "llama: tensor '{name}' is not supported yet (Llama 3.1 rotary frequency \
                 factors, attention output bias)"
            )));
        }
    }
    (0..c.n_layer)
        .map(|il| {
            let attn = attention_tensors(src, il);
            let ffn = ffn_tensors(src, il);
            Ok(Layer {
                attn_norm: attn.vec(&blk(il, "attn_norm.weight"), c.n_embd)?,
                mixer: gqa_attention(c, &attn, il, true, QkNorm::Optional)?,
                ffn_norm: ffn.vec(&blk(il, "ffn_norm.weight"), c.n_embd)?,
                ffn: if c.n_expert == 0 {
                    dense_ffn(c, &ffn, il)?
                } else {
                    moe_ffn(c, &ffn, src, il)?
                },
            })
        })
        .collect()
}
