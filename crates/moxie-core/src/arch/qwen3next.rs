//! Qwen3-Next / Qwen3-Coder-Next (`qwen3next`): gated DeltaNet linear-attention layers
//! interleaved with gated full attention (every `full_attention_interval`-th layer: query and
//! gate per head, q/k norms, partial NEOX rotary), an MoE on every layer with softmax top-k
//! routing and renormalised weights (llama.cpp's graph hard-codes both) plus a shared expert
//! scaled by sigmoid(`ffn_gate_inp_shexp` · x). `post_attention_norm` is the pre-FFN norm.
//! Only the current converter's layout (`attn_qkv` + `attn_gate`) is read; the older fused
//! `ssm_in` layout is refused. Trailing MTP blocks are not part of the main graph.

use super::{attention_tensors, blk, ffn_tensors, moe_ffn, ArchDef};
use crate::blocks::delta_net::{DeltaNet, DeltaNetShape};
use crate::blocks::{DenseFfn, Ffn, Gqa, Layer, Mixer};
use crate::config::{Arch, Config, Gating, Keys};
use crate::loader::{BlockTensors, TensorSource};
use crate::ops::RopeKind;
use crate::{Error, Result};

pub(crate) const DEF: ArchDef = ArchDef {
    arch: Arch::Qwen3Next,
    hparams,
    layers,
    // Its MTP block (a gated full-attention layer in llama.cpp's graph) is not run yet: no
    // fixture carries one to check it against.
    mtp_layer: None,
};

fn hparams(c: &mut Config, _: &Keys) -> Result<()> {
    c.gating = Gating::Softmax;
    c.expert_weights_norm = true;
    c.rope.kind = RopeKind::Neox;
    // One shared expert, whatever `expert_shared_count` says: llama.cpp loads it always.
    c.n_expert_shared = 1;
    if c.n_ff_exp == 0 {
        // llama.cpp's fallback when the metadata names no expert width.
        c.n_ff_exp = c.n_ff / c.n_expert_used;
    }
    Ok(())
}

/// The DeltaNet sizes from the `ssm.*` keys, checked against what the layer needs.
fn delta_net_shape(k: &Keys) -> Result<DeltaNetShape> {
    let shape = DeltaNetShape {
        n_k_heads: k.uint("ssm.group_count")?,
        n_v_heads: k.uint("ssm.time_step_rank")?,
        head_dim: k.uint("ssm.state_size")?,
        conv_kernel: k.uint("ssm.conv_kernel")?,
    };
    let inner = k.uint("ssm.inner_size")?;
    let bad = |what: String| Err(Error::Model(format!("metadata: {what}")));
    if shape.n_k_heads == 0 || !shape.n_v_heads.is_multiple_of(shape.n_k_heads) {
        return bad(format!(
            "ssm.time_step_rank {} (value heads) is not a multiple of ssm.group_count {} (key \
             heads)",
            shape.n_v_heads, shape.n_k_heads
        ));
    }
    if shape.head_dim == 0 || inner != shape.value_dim() {
        return bad(format!(
            "ssm.inner_size {inner} must be ssm.state_size {} x ssm.time_step_rank {} (the \
             gated DeltaNet's key and value heads have one width)",
            shape.head_dim, shape.n_v_heads
        ));
    }
    if shape.conv_kernel < 2 {
        return bad(format!(
            "ssm.conv_kernel {} must be at least 2",
            shape.conv_kernel
        ));
    }
    // A sanity bound before state of these sizes is allocated.
    for (name, v) in [
        ("ssm.state_size", shape.head_dim),
        ("ssm.time_step_rank", shape.n_v_heads),
        ("ssm.conv_kernel", shape.conv_kernel),
    ] {
        if v > 1 << 12 {
            return bad(format!("{name} = {v} is implausibly large"));
        }
    }
    Ok(shape)
}

/// Which layers are recurrent: `attention.recurrent_layers` when the file lists them, else
/// every layer but each `full_attention_interval`-th (default 4), as llama.cpp decides.
fn recurrent_layers(c: &Config, k: &Keys) -> Result<Vec<bool>> {
    if let Some(flags) = k.bool_array_opt("attention.recurrent_layers")? {
        if flags.len() < c.n_layer {
            return Err(Error::Model(format!(
                "metadata '{}' has {} entries for {} layers",
                k.key("attention.recurrent_layers"),
                flags.len(),
                c.n_layer
            )));
        }
        return Ok(flags[..c.n_layer].to_vec());
    }
    let interval = k.uint_opt("full_attention_interval")?.unwrap_or(4);
    if interval == 0 {
        return Err(Error::Model(format!(
            "metadata '{}' is 0",
            k.key("full_attention_interval")
        )));
    }
    Ok((0..c.n_layer).map(|il| (il + 1) % interval != 0).collect())
}

/// A recurrent layer's gated DeltaNet.
fn delta_net(
    c: &Config,
    s: DeltaNetShape,
    src: &TensorSource,
    t: &BlockTensors,
    il: usize,
) -> Result<Mixer> {
    let d = c.n_embd;
    if !src.has(&blk(il, "attn_qkv.weight")) && src.has(&blk(il, "ssm_in.weight")) {
        return Err(Error::Model(format!(
            "layer {il}: this qwen3next GGUF has the old fused 'ssm_in' layout; re-convert it \
             with a current llama.cpp converter (attn_qkv / attn_gate)"
        )));
    }
    let (nv, ch) = (s.n_v_heads, s.channels());
    Ok(Mixer::DeltaNet(Box::new(DeltaNet {
        wqkv: t.get(&blk(il, "attn_qkv.weight"), &[d, ch])?,
        wz: t.get(&blk(il, "attn_gate.weight"), &[d, s.value_dim()])?,
        wba: t.get(&blk(il, "ssm_ba.weight"), &[d, 2 * nv])?,
        conv: t.vec_of_shape(&blk(il, "ssm_conv1d.weight"), &[s.conv_kernel, ch])?,
        dt_bias: t.vec(&blk(il, "ssm_dt.bias"), nv)?,
        a: t.vec(&blk(il, "ssm_a"), nv)?,
        norm: t.vec(&blk(il, "ssm_norm.weight"), s.head_dim)?,
        wo: t.get(&blk(il, "ssm_out.weight"), &[s.value_dim(), d])?,
        rms_eps: c.rms_eps,
        shape: s,
        device: t.device(),
    })))
}

/// A full-attention layer: GQA whose `attn_q` gives [query | gate] per head.
fn gated_attention(c: &Config, t: &BlockTensors, il: usize) -> Result<Mixer> {
    let (d, hd) = (c.n_embd, c.head_dim_k);
    if c.head_dim_v != hd {
        return Err(Error::Model(format!(
            "metadata: qwen3next attention needs key_length = value_length (got {hd} and {})",
            c.head_dim_v
        )));
    }
    let kv_w = c.n_head_kv * hd;
    Ok(Mixer::Gqa(Gqa {
        wq: t.get(&blk(il, "attn_q.weight"), &[d, 2 * c.n_head * hd])?,
        wk: t.get(&blk(il, "attn_k.weight"), &[d, kv_w])?,
        wv: t.get(&blk(il, "attn_v.weight"), &[d, kv_w])?,
        bq: None,
        bk: None,
        bv: None,
        q_norm: Some(t.vec(&blk(il, "attn_q_norm.weight"), hd)?),
        k_norm: Some(t.vec(&blk(il, "attn_k_norm.weight"), hd)?),
        wo: t.get(&blk(il, "attn_output.weight"), &[c.n_head * hd, d])?,
        n_head: c.n_head,
        n_head_kv: c.n_head_kv,
        head_k: hd,
        head_v: hd,
        kq_scale: 1.0 / (hd as f32).sqrt(),
        gated: true,
        device: t.device(),
    }))
}

/// The MoE with its sigmoid-gated shared expert (`expert_shared_feed_forward_length` wide, else
/// `feed_forward_length`).
fn moe_with_gated_shared(
    c: &Config,
    k: &Keys,
    t: &BlockTensors,
    src: &TensorSource,
    il: usize,
) -> Result<Ffn> {
    let d = c.n_embd;
    let fs = match k.uint_opt("expert_shared_feed_forward_length")? {
        Some(f) if f > 0 => f,
        _ => c.n_ff,
    };
    // The routed part as every MoE has it; the shared expert is this architecture's own.
    let routed_only = Config {
        n_expert_shared: 0,
        ..c.clone()
    };
    let Ffn::Moe(mut moe) = moe_ffn(&routed_only, t, src, il)? else {
        unreachable!("moe_ffn builds an MoE")
    };
    moe.shared = Some(DenseFfn {
        gate: t.get(&blk(il, "ffn_gate_shexp.weight"), &[d, fs])?,
        up: t.get(&blk(il, "ffn_up_shexp.weight"), &[d, fs])?,
        down: t.get(&blk(il, "ffn_down_shexp.weight"), &[fs, d])?,
        device: t.device(),
    });
    moe.shared_gate = Some(t.get(&blk(il, "ffn_gate_inp_shexp.weight"), &[d])?);
    Ok(Ffn::Moe(moe))
}

fn layers(c: &Config, k: &Keys, src: &TensorSource) -> Result<Vec<Layer>> {
    let shape = delta_net_shape(k)?;
    let recurrent = recurrent_layers(c, k)?;
    (0..c.n_layer)
        .map(|il| {
            let attn = attention_tensors(src, il);
            let ffn = ffn_tensors(src, il);
            Ok(Layer {
                attn_norm: attn.vec(&blk(il, "attn_norm.weight"), c.n_embd)?,
                mixer: if recurrent[il] {
                    delta_net(c, shape, src, &attn, il)?
                } else {
                    gated_attention(c, &attn, il)?
                },
                ffn_norm: ffn.vec(&blk(il, "post_attention_norm.weight"), c.n_embd)?,
                ffn: moe_with_gated_shared(c, k, &ffn, src, il)?,
            })
        })
        .collect()
}
