//! DeepSeek-V2/V3/R1, Kimi K2, GLM-4.7-Flash (`deepseek2`): MLA attention in the absorbed
//! layout llama.cpp's converter writes (`attn_k_b`, `attn_v_b`; older files' fused `attn_kv_b`
//! is split at load, see `legacy_mla.rs`), optional q-lora, leading dense
//! layers, routed + shared experts with softmax or sigmoid gating and selection bias, YaRN with
//! DeepSeek's log-multiplier fix-ups.

use super::{attention_tensors, blk, dense_ffn, ffn_tensors, legacy_mla, moe_ffn, ArchDef};
use crate::blocks::mla::MlaShape;
use crate::blocks::{Layer, Mixer, Mla};
use crate::config::{Arch, Config, Gating, Keys};
use crate::loader::{BlockTensors, TensorSource};
use crate::tensor::Tensor;
use crate::{Error, Result};

pub(crate) const DEF: ArchDef = ArchDef {
    arch: Arch::Deepseek2,
    hparams,
    layers,
    mtp_layer: Some(mtp_layer),
};

fn hparams(c: &mut Config, k: &Keys) -> Result<()> {
    if k.uint_opt("expert_gating_func")?.unwrap_or(0) == 0 {
        // GGUFs of DeepSeek V2 / V2.5 name no gating function (softmax); GLM-4.7-Flash
        // ("GLM 4.7 Lite") conversions without one are sigmoid-gated, as llama.cpp tells them
        // apart.
        let glm_lite = matches!(c.n_layer, 47 | 48) && c.n_vocab == 154880;
        c.gating = if glm_lite {
            Gating::Sigmoid
        } else {
            Gating::Softmax
        };
    }
    // llama.cpp cancels the 0.1 factor the converter applies (TAG_DEEPSEEK2_YARN_LOG_MUL_FIX),
    // and DeepSeek-V2's YaRN mscale equals mscale_all_dims.
    if let Some(m) = k.float_opt("rope.scaling.yarn_log_multiplier")? {
        c.rope_yarn_log_mul = m / 0.1;
    }
    c.rope_yarn_mscale_is_log_mul = true;
    Ok(())
}

/// MLA's dimensions from the metadata (shared with `glm-dsa`).
pub(crate) fn mla_shape(c: &Config, k: &Keys) -> Result<MlaShape> {
    let kv_lora_rank = k.uint_opt("attention.kv_lora_rank")?.unwrap_or(0);
    let arch = k.key("");
    if kv_lora_rank == 0 {
        return Err(Error::Model(format!(
            "metadata: {}attention.kv_lora_rank is missing: MLA needs it",
            arch
        )));
    }
    let head_k = k
        .uint_opt("attention.key_length_mla")?
        .unwrap_or(c.head_dim_k);
    if head_k <= c.n_rot {
        return Err(Error::Model(format!(
            "metadata: key_length_mla {head_k} must exceed rope.dimension_count {}",
            c.n_rot
        )));
    }
    Ok(MlaShape {
        n_head: c.n_head,
        q_lora_rank: k.uint_opt("attention.q_lora_rank")?.unwrap_or(0),
        kv_lora_rank,
        n_rot: c.n_rot,
        head_k,
        head_v: k
            .uint_opt("attention.value_length_mla")?
            .unwrap_or(c.head_dim_v),
    })
}

/// MLA's tensors in the absorbed layout (`attn_k_b`, `attn_v_b`).
pub(crate) fn mla_attention(
    c: &Config,
    s: MlaShape,
    src: &TensorSource,
    t: &BlockTensors,
    il: usize,
) -> Result<Mla> {
    let d = c.n_embd;
    let (rank, n_rot, n_head) = (s.kv_lora_rank, s.n_rot, s.n_head);
    let nope = s.head_k - n_rot;
    let q_width = n_head * s.head_k;
    let wq_a = if s.q_lora_rank > 0 {
        Some((
            t.get(&blk(il, "attn_q_a.weight"), &[d, s.q_lora_rank])?,
            t.vec(&blk(il, "attn_q_a_norm.weight"), s.q_lora_rank)?,
        ))
    } else {
        None
    };
    let wq_b = match &wq_a {
        Some(_) => t.get(&blk(il, "attn_q_b.weight"), &[s.q_lora_rank, q_width])?,
        None => t.get(&blk(il, "attn_q.weight"), &[d, q_width])?,
    };
    let absorbed = |t: &BlockTensors| -> Result<(Tensor, Tensor)> {
        Ok((
            t.get(&blk(il, "attn_k_b.weight"), &[nope, rank, n_head])?,
            t.get(&blk(il, "attn_v_b.weight"), &[rank, s.head_v, n_head])?,
        ))
    };
    // Legacy files hold the fused attn_kv_b instead: split at load.
    let (wk_b, wv_b) = if src.has(&blk(il, "attn_k_b.weight")) {
        absorbed(t)?
    } else {
        match legacy_mla::split_fused_kv_b(t, il, s)? {
            Some(parts) => parts,
            None => absorbed(t)?,
        }
    };
    Ok(Mla {
        shape: s,
        kq_scale: s.kq_scale(&c.rope, c.rope_yarn_log_mul),
        wq_a,
        wq_b,
        wkv_a: t.get(&blk(il, "attn_kv_a_mqa.weight"), &[d, rank + n_rot])?,
        kv_a_norm: t.vec(&blk(il, "attn_kv_a_norm.weight"), rank)?,
        wk_b,
        wv_b,
        wo: t.get(&blk(il, "attn_output.weight"), &[n_head * s.head_v, d])?,
        sparse: None,
        device: t.device(),
    })
}

fn layers(c: &Config, k: &Keys, src: &TensorSource) -> Result<Vec<Layer>> {
    let shape = mla_shape(c, k)?;
    (0..c.n_layer).map(|il| layer(c, shape, src, il)).collect()
}

/// The MTP block's decoder layer: the same as the main ones.
fn mtp_layer(c: &Config, k: &Keys, src: &TensorSource, il: usize) -> Result<Layer> {
    layer(c, mla_shape(c, k)?, src, il)
}

fn layer(c: &Config, shape: MlaShape, src: &TensorSource, il: usize) -> Result<Layer> {
    let attn = attention_tensors(src, il);
    let ffn = ffn_tensors(src, il);
    Ok(Layer {
        attn_norm: attn.vec(&blk(il, "attn_norm.weight"), c.n_embd)?,
        mixer: Mixer::Mla(mla_attention(c, shape, src, &attn, il)?),
        ffn_norm: ffn.vec(&blk(il, "ffn_norm.weight"), c.n_embd)?,
        ffn: if il < c.n_layer_dense_lead {
            dense_ffn(c, &ffn, il)?
        } else {
            moe_ffn(c, &ffn, src, il)?
        },
    })
}
