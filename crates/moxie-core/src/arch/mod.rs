//! Per-architecture tensor layouts. Each file names the tensors of one block with their
//! shapes (as llama.cpp's loader declares them); the forward pass is shared (`model.rs`).

pub mod deepseek2;
pub mod glm4moe;
pub mod qwen3moe;

use crate::config::Config;
use crate::model::{DenseFfn, Ffn, Moe, TensorSource};
use crate::Result;

/// `blk.{il}.{name}`
pub(crate) fn blk(il: usize, name: &str) -> String {
    format!("blk.{il}.{name}")
}

/// The dense SwiGLU FFN of a leading dense layer.
pub(crate) fn dense_ffn(c: &Config, src: &TensorSource, il: usize) -> Result<Ffn> {
    Ok(Ffn::Dense(Box::new(DenseFfn {
        gate: src.get(&blk(il, "ffn_gate.weight"), &[c.n_embd, c.n_ff])?,
        up: src.get(&blk(il, "ffn_up.weight"), &[c.n_embd, c.n_ff])?,
        down: src.get(&blk(il, "ffn_down.weight"), &[c.n_ff, c.n_embd])?,
    })))
}

/// Routed experts, selection bias and shared experts of an MoE layer.
pub(crate) fn moe_ffn(c: &Config, src: &TensorSource, il: usize) -> Result<Ffn> {
    let (e, d, f) = (c.n_expert, c.n_embd, c.n_ff_exp);
    let shared = if c.n_expert_shared > 0 {
        let fs = f * c.n_expert_shared;
        Some(DenseFfn {
            gate: src.get(&blk(il, "ffn_gate_shexp.weight"), &[d, fs])?,
            up: src.get(&blk(il, "ffn_up_shexp.weight"), &[d, fs])?,
            down: src.get(&blk(il, "ffn_down_shexp.weight"), &[fs, d])?,
        })
    } else {
        None
    };
    Ok(Ffn::Moe(Box::new(Moe {
        router: src.get(&blk(il, "ffn_gate_inp.weight"), &[d, e])?,
        probs_bias: src.vec_opt(&blk(il, "exp_probs_b.bias"), e)?,
        gate_exps: src.get(&blk(il, "ffn_gate_exps.weight"), &[d, f, e])?,
        up_exps: src.get(&blk(il, "ffn_up_exps.weight"), &[d, f, e])?,
        down_exps: src.get(&blk(il, "ffn_down_exps.weight"), &[f, d, e])?,
        shared,
    })))
}
