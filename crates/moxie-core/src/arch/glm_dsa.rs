//! GLM-5 / 5.1 / 5.2 (`glm-dsa`): deepseek2's MLA (always with q-lora) plus DeepSeek sparse
//! attention: in each layer a lightning indexer (`indexer.*` tensors, its own key cache) picks
//! the `attention.indexer.top_k` past positions every query attends to. GLM-5.2 runs the
//! indexer in some layers only ("full"); the others reuse the last selection ("shared").
//! Leading dense layers, sigmoid-gated experts with selection bias and a shared expert. The
//! trailing MTP (nextn) block is not part of the main graph.

use super::deepseek2::{mla_attention, mla_shape};
use super::{attention_tensors, blk, dense_ffn, ffn_tensors, moe_ffn, ArchDef};
use crate::blocks::dsa::{rotation_for, Indexer};
use crate::blocks::mla::Sparse;
use crate::blocks::{Layer, Mixer};
use crate::config::{Arch, Config, Gating, Keys};
use crate::loader::{BlockTensors, TensorSource};
use crate::{Error, Result};

pub(crate) const DEF: ArchDef = ArchDef {
    arch: Arch::GlmDsa,
    hparams,
    layers,
    mtp_layer: Some(mtp_layer),
};

fn hparams(c: &mut Config, k: &Keys) -> Result<()> {
    if k.uint_opt("expert_gating_func")?.unwrap_or(0) == 0 {
        c.gating = Gating::Sigmoid;
    }
    // Normal (adjacent-pair) RoPE, and no YaRN log multiplier: llama.cpp reads that key for
    // deepseek2 only.
    Ok(())
}

/// The indexer's sizes.
struct IndexerShape {
    n_head: usize,
    head_dim: usize,
    top_k: usize,
}

/// Which layers run their own indexer: `attention.indexer.types` (1 = full, 0 = shared) when
/// present; otherwise, as llama.cpp decides, every layer for GLM-5 / 5.1 (training context
/// under 1M) and GLM-5.2's pattern (layers 0, 1, then every fourth from 2).
fn full_indexer_layers(c: &Config, k: &Keys) -> Result<Vec<bool>> {
    if let Some(types) = k.uint_per_layer("attention.indexer.types", c.n_layer)? {
        return Ok(types.iter().map(|&t| t != 0).collect());
    }
    let pre_5_2 = c.n_ctx_train < 1 << 20;
    Ok((0..c.n_layer)
        .map(|il| pre_5_2 || il < 2 || (il - 2) % 4 == 0)
        .collect())
}

/// Layer `il`'s lightning indexer (the MLA tensors are already loaded through `t`).
fn indexer(
    c: &Config,
    q_lora: usize,
    s: &IndexerShape,
    t: &BlockTensors,
    il: usize,
) -> Result<Indexer> {
    let (d, nh, e) = (s.head_dim, s.n_head, c.n_embd);
    Ok(Indexer {
        n_head: nh,
        head_dim: d,
        top_k: s.top_k,
        wq_b: t.get(&blk(il, "indexer.attn_q_b.weight"), &[q_lora, nh * d])?,
        wk: t.get(&blk(il, "indexer.attn_k.weight"), &[e, d])?,
        k_norm: t.vec_opt(&blk(il, "indexer.k_norm.weight"), d)?,
        k_norm_b: t.vec_opt(&blk(il, "indexer.k_norm.bias"), d)?,
        proj: t.get(&blk(il, "indexer.proj.weight"), &[e, nh])?,
        rotation: t.with_block(rotation_for(d)?)?,
    })
}

/// The MTP block's decoder layer: dense MLA (llama.cpp's MTP graph does not run the block's
/// indexer, whose tensors stay unloaded) and the MoE FFN.
fn mtp_layer(c: &Config, k: &Keys, src: &TensorSource, il: usize) -> Result<Layer> {
    let shape = mla_shape(c, k)?;
    let attn = attention_tensors(src, il);
    let ffn = ffn_tensors(src, il);
    Ok(Layer {
        attn_norm: attn.vec(&blk(il, "attn_norm.weight"), c.n_embd)?,
        mixer: Mixer::Mla(mla_attention(c, shape, src, &attn, il)?),
        ffn_norm: ffn.vec(&blk(il, "ffn_norm.weight"), c.n_embd)?,
        ffn: moe_ffn(c, &ffn, src, il)?,
    })
}

fn layers(c: &Config, k: &Keys, src: &TensorSource) -> Result<Vec<Layer>> {
    let shape = mla_shape(c, k)?;
    if shape.q_lora_rank == 0 {
        return Err(Error::Model(
            "metadata: glm-dsa needs attention.q_lora_rank (its indexer reads MLA's q_a)".into(),
        ));
    }
    let ix = IndexerShape {
        n_head: k.uint("attention.indexer.head_count")?,
        head_dim: k.uint("attention.indexer.key_length")?,
        top_k: k.uint("attention.indexer.top_k")?,
    };
    if ix.n_head == 0 || ix.top_k == 0 || ix.head_dim < c.n_rot {
        return Err(Error::Model(format!(
            "metadata: glm-dsa indexer of {} heads x {} (rope {}) with top-k {}: heads and top-k \
             must be positive and the head at least as wide as the rotary part",
            ix.n_head, ix.head_dim, c.n_rot, ix.top_k
        )));
    }
    let full = full_indexer_layers(c, k)?;
    if full.first() == Some(&false) {
        return Err(Error::Model(
            "metadata: glm-dsa's layer 0 shares an indexer selection, but no earlier layer makes one".into(),
        ));
    }
    (0..c.n_layer)
        .map(|il| {
            let attn = attention_tensors(src, il);
            let ffn = ffn_tensors(src, il);
            let attn_norm = attn.vec(&blk(il, "attn_norm.weight"), c.n_embd)?;
            let mut mla = mla_attention(c, shape, src, &attn, il)?;
            mla.sparse = Some(if full[il] {
                Sparse::Indexer(Box::new(indexer(c, shape.q_lora_rank, &ix, &attn, il)?))
            } else {
                Sparse::Shared
            });
            Ok(Layer {
                attn_norm,
                mixer: Mixer::Mla(mla),
                ffn_norm: ffn.vec(&blk(il, "ffn_norm.weight"), c.n_embd)?,
                ffn: if il < c.n_layer_dense_lead {
                    dense_ffn(c, &ffn, il)?
                } else {
                    moe_ffn(c, &ffn, src, il)?
                },
            })
        })
        .collect()
}
