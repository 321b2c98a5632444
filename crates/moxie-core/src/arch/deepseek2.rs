//! DeepSeek-V2/V3/R1, Kimi K2, GLM-4.7-Flash (`deepseek2`): MLA attention in the absorbed
//! layout llama.cpp's converter writes (`attn_k_b`, `attn_v_b`), optional q-lora, leading dense
//! layers, routed + shared experts with softmax or sigmoid gating and selection bias.

use super::{blk, dense_ffn, moe_ffn};
use crate::config::Config;
use crate::model::{Attention, Layer, Mla, TensorSource};
use crate::{Error, Result};

pub(crate) fn load_layer(c: &Config, src: &TensorSource, il: usize) -> Result<Layer> {
    let d = c.n_embd;
    let (rank, n_rot, n_head) = (c.kv_lora_rank, c.n_rot, c.n_head);
    let nope = c.head_dim_k_mla - n_rot;
    let q_width = n_head * c.head_dim_k_mla;
    let wq_a = if c.q_lora_rank > 0 {
        Some((
            src.get(&blk(il, "attn_q_a.weight"), &[d, c.q_lora_rank])?,
            src.vec(&blk(il, "attn_q_a_norm.weight"), c.q_lora_rank)?,
        ))
    } else {
        None
    };
    let wq_b = match &wq_a {
        Some(_) => src.get(&blk(il, "attn_q_b.weight"), &[c.q_lora_rank, q_width])?,
        None => src.get(&blk(il, "attn_q.weight"), &[d, q_width])?,
    };
    if !src.has(&blk(il, "attn_k_b.weight")) && src.has(&blk(il, "attn_kv_b.weight")) {
        return Err(Error::Model(
            "this deepseek2 GGUF has the old fused 'attn_kv_b' layout; re-convert it with a current llama.cpp converter (attn_k_b / attn_v_b)".into(),
        ));
    }
    let attn = Attention::Mla(Mla {
        wq_a,
        wq_b,
        wkv_a: src.get(&blk(il, "attn_kv_a_mqa.weight"), &[d, rank + n_rot])?,
        kv_a_norm: src.vec(&blk(il, "attn_kv_a_norm.weight"), rank)?,
        wk_b: src.get(&blk(il, "attn_k_b.weight"), &[nope, rank, n_head])?,
        wv_b: src.get(
            &blk(il, "attn_v_b.weight"),
            &[rank, c.head_dim_v_mla, n_head],
        )?,
        wo: src.get(
            &blk(il, "attn_output.weight"),
            &[n_head * c.head_dim_v_mla, d],
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
        ffn_norm: src.vec(&blk(il, "ffn_norm.weight"), d)?,
        ffn,
    })
}
