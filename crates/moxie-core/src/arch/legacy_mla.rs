//! Legacy MLA files: deepseek2 GGUFs converted before llama.cpp split MLA's `attn_kv_b` (many
//! early-2025 DeepSeek-V3/R1 quants) hold per layer one fused `attn_kv_b`
//! {kv_lora_rank, n_head * (qk_nope + v_head)} instead of the absorbed `attn_k_b`
//! {qk_nope, kv_lora_rank, n_head} and `attn_v_b` {kv_lora_rank, v_head, n_head}. Their
//! metadata has no `key_length_mla` / `value_length_mla`: `key_length` is `qk_nope + qk_rope`
//! and `value_length` is `v_head`, which [`mla_shape`](super::deepseek2::mla_shape) falls back
//! to as llama.cpp's `n_embd_head_k_mla()` / `n_embd_head_v_mla()` do.
//!
//! The fused tensor is split at load, as ik_llama.cpp does (`llm_prepare_mla`) and as llama.cpp's
//! converter does from the checkpoint's `kv_b_proj` (`view(n_head, qk_nope + v_head, rank)`,
//! split, `k_b.transpose(1, 2)`): of each head's `qk_nope + v_head` rows of `kv_lora_rank`
//! values, the first `qk_nope` are the key part, transposed into that head's `attn_k_b`
//! matrix, and the other `v_head` are that head's `attn_v_b` as they are.
//!
//! Both parts are kept as F32. F32 holds ggml's dequantized values of every block type exactly
//! (what `dequantize_row_*` gives), so the absorbed products use the file's weights and differ
//! from llama.cpp's, which runs such files through its non-absorbed path with `attn_kv_b` as is,
//! only by summation order and activation rounding. F16 would round the weights again (a Q8_0
//! value `d * q` needs up to 19 significant bits, f16 keeps 11) and, as F16's dot-product
//! partner, round the activations to f16 too; a quantized type would need the key part
//! re-quantized after the transpose (ik_llama.cpp uses Q8_0). The cost is memory: 4 bytes per
//! value (DeepSeek-V3: 61 layers x 64 MiB = 3.8 GiB, where a Q8_0 `attn_kv_b` takes 1.0 GiB),
//! which the plan counts ([`loaded_bytes`]).

use moxie_gguf::TensorInfo;
use moxie_quant::GgmlType;

use super::blk;
use crate::blocks::mla::MlaShape;
use crate::loader::BlockTensors;
use crate::tensor::Tensor;
use crate::{Error, Result};

/// The absorbed `attn_k_b` and `attn_v_b` of layer `il` from its fused `attn_kv_b`, on that
/// tensor's device; `None` if the file has no `attn_kv_b` for the layer either.
pub(crate) fn split_fused_kv_b(
    t: &BlockTensors,
    il: usize,
    s: MlaShape,
) -> Result<Option<(Tensor, Tensor)>> {
    let name = blk(il, "attn_kv_b.weight");
    let (rank, n_head, v) = (s.kv_lora_rank, s.n_head, s.head_v);
    let nope = s.head_k - s.n_rot;
    let parts = t
        .derived(&name, &[rank, n_head * (nope + v)], |kv_b| {
            split(kv_b, il, rank, n_head, nope, v)
        })
        .map_err(|e| {
            Error::Model(format!(
                "{e} (a legacy MLA file without attn_k_b/attn_v_b: '{name}' must be \
                 {{kv_lora_rank {rank}, n_head {n_head} x (key_length - rope.dimension_count \
                 = {nope} + value_length {v})}})"
            ))
        })?;
    Ok(parts.map(|[k_b, v_b]| (k_b, v_b)))
}

/// `attn_k_b` {nope, rank, n_head} and `attn_v_b` {rank, v, n_head}, F32, from `kv_b`
/// {rank, n_head * (nope + v)}.
fn split(
    kv_b: &Tensor,
    il: usize,
    rank: usize,
    n_head: usize,
    nope: usize,
    v: usize,
) -> Result<[Tensor; 2]> {
    let mut row = vec![0f32; rank];
    // k_b[h][r][j] = kv_b row (h, j), value r: each head's key block transposed.
    let mut k_b = vec![0f32; n_head * rank * nope];
    let mut v_b = Vec::with_capacity(n_head * v * rank);
    for h in 0..n_head {
        let k_head = &mut k_b[h * rank * nope..(h + 1) * rank * nope];
        for j in 0..nope + v {
            kv_b.row_to_f32(h * (nope + v) + j, &mut row)?;
            if j < nope {
                for (r, &x) in row.iter().enumerate() {
                    k_head[r * nope + j] = x;
                }
            } else {
                v_b.extend_from_slice(&row);
            }
        }
    }
    let bytes = |x: &[f32]| x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    Ok([
        Tensor::owned(
            &blk(il, "attn_k_b.weight"),
            GgmlType::F32,
            [nope, rank, n_head, 1],
            bytes(&k_b),
        )?,
        Tensor::owned(
            &blk(il, "attn_v_b.weight"),
            GgmlType::F32,
            [rank, v, n_head, 1],
            bytes(&v_b),
        )?,
    ])
}

/// Bytes tensor `t` of an MLA model takes once loaded: a fused `attn_kv_b` of a layer without
/// `attn_k_b` (`has` tells which names the file holds) becomes its F32 split parts, as many
/// values as it has; every other tensor is loaded as it is stored.
pub fn loaded_bytes(t: &TensorInfo, has: impl Fn(&str) -> bool) -> u64 {
    let fused = t
        .name
        .strip_suffix(".attn_kv_b.weight")
        .is_some_and(|block| !has(&format!("{block}.attn_k_b.weight")));
    if fused {
        t.n_elements().saturating_mul(4)
    } else {
        t.n_bytes
    }
}
