//! ggml block types: layout, dequantize, quantize and dot products.
//!
//! Numerics follow ggml's CPU backend at the llama.cpp commit that produced moxie's golden
//! logits (vendored by llama-cpp-python 0.3.36), so that dot products agree with llama.cpp:
//!
//! * [`f16`](mod@f16): F32 / F16 / BF16 rows and ggml-exact half/bfloat conversions;
//! * `bf16`: BF16 dot products in the orders of ggml's AVX512_BF16 build (`VDPBF16PS`, used
//!   where the CPU has it, emulated bit for bit where not);
//! * [`legacy`]: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1;
//! * [`kquants`]: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K;
//! * [`iq4`]: IQ4_NL, IQ4_XS;
//! * [`iq2_3`]: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS (read and computed with, not written);
//! * [`iq3s`]: IQ3_S; [`iq1`]: IQ1_S, IQ1_M (code books in [`iq_grids`]);
//! * [`iqk`]: ik_llama.cpp's types IQ2_K .. IQ6_K, IQ2_KS .. IQ5_KS and Q6_0;
//! * [`weighted`]: llama-quantize's quantizers given an importance matrix (K-quants, Q4_0..Q5_1;
//!   IQ4_NL / IQ4_XS's are in `iq4`), [`quantize_weights_imatrix`] per type;
//! * `table`: the type table, one row per type with everything about it (layout, kernels);
//! * [`dispatch`]: the per-type entry points over it, run-time SIMD selection and checked
//!   wrappers;
//! * [`tinyblas`], [`tiled`]: the summation orders of ggml's batched `mul_mat` paths
//!   (llamafile tinyBLAS; the tiled K-quant / IQ matmul);
//! * `simd`: AVX2 / AVX-512 kernels (x86-64 only, selected at run time).
//!
//! The unchecked function pointers ([`DequantizeFn`], [`QuantizeFn`], [`VecDotFn`]) assume the
//! caller validated lengths; they never cause UB but panic on short slices. The checked wrappers
//! ([`dequantize_row`], [`quantize_row`], [`vec_dot`]) validate first.
//!
//! How it is verified (see `tests/`):
//! * `ggml_golden.rs`: bit-exact against ggml's own compiled C code (generator in
//!   `tests/data/gen_golden.c`): dequantization of random raw blocks, x86 activation
//!   quantization, llama-quantize weight quantization, scalar dots == ggml's generic dots, and
//!   every SIMD dot == ggml's x86 dot as built on the golden (Intel AVX-512) machine.
//! * `ggml_tiled_golden.rs`: [`tiled_dot_fn`] bit-exact against ggml's tiled K-quant / IQ matmul
//!   (`ggml-cpu/tiled/`, generator `tests/data/gen_tiled.c`) through `mul_mat` and `mul_mat_id`.
//! * `imatrix_golden.rs`: the importance-matrix quantizers ([`quantize_weights_imatrix`])
//!   bit-exact against ggml's `quantize_<type>(..., quant_weights)` (generator
//!   `tests/data/gen_imatrix_golden.c`).
//! * `known_answers.rs`: hand-built blocks of every type with per-element expected values.
//! * `roundtrip.rs`: round-trip error bounds and `vec_dot` vs the f64 dot of dequantized data.
//! * `simd_props.rs`: proptest of every SIMD kernel against the scalar reference.
//! * Outside the test suite (once, by hand): every quantized tensor of the fixture GGUFs
//!   (Q2_K..Q6_K, Q4_0, Q5_0, Q8_0, IQ4_NL, IQ4_XS) re-quantized from the F32 master with
//!   [`quantize_weights_fn`] is byte-identical to llama-quantize's output.

// Index loops mirror ggml's C loops one to one, which keeps the ports reviewable.
#![allow(clippy::needless_range_loop)]

pub mod aligned;
pub mod amx;
pub(crate) mod bf16;
pub mod bf16gemm;
mod common;
pub mod dispatch;
pub mod f16;
pub mod f32gemm;
pub mod gemm;
pub mod iq1;
pub mod iq2_3;
pub mod iq3s;
pub mod iq4;
pub mod iq_grids;
pub mod iqk;
pub mod kquants;
pub mod legacy;
pub mod pool;
pub mod prefetch;
pub mod repack;
mod simd;
mod table;
#[cfg(test)]
mod test_data;
pub mod tiled;
pub mod tinyblas;
pub mod types;
pub mod vexp;
pub mod weighted;

pub use bf16gemm::{bf16_products_fast, gemm_bf16_ab, gemm_bf16_abt};
pub use dispatch::{
    dequantize_fn, dequantize_row, hardware_simd_level, quantize_fn, quantize_fn_for_level,
    quantize_row, quantize_weights_fn, quantize_weights_imatrix, quantize_weights_row, simd_level,
    validate_row_data, vec_dot, vec_dot_fn, vec_dot_fn_for_level, vec_dot_type, DequantizeFn,
    ImatrixQuantizer, QuantError, QuantizeFn, QuantizeImatrixFn, SimdLevel, VecDotFn,
};
pub use f16::{bf16_to_f32, f32_to_bf16, f32_to_fp16, fp16_to_f32};
pub use f32gemm::{gemm_f32_ab, gemm_f32_abt, gemm_f32_abt_packed};
pub use gemm::{
    gemm_available, gemm_avx512, gemm_q8, gemm_q8_interleaved, gemm_supports, GemmActs, GemmRows,
    GEMM_TILE_ROWS,
};
#[doc(hidden)]
pub use gemm::{gemm_decode_tile, DecodedTile};
pub use prefetch::{prefetch_ahead, prefetch_l2, PREFETCH_AHEAD};
pub use tiled::{
    tiled_dot_fn, tiled_dot_many_fn, tiled_used_for_mul_mat, tiled_used_for_mul_mat_id, DotManyFn,
};
pub use tinyblas::{
    reduce_add_16, tinyblas_dot_fn, tinyblas_dot_many_fn, tinyblas_dot_tile_fn, tinyblas_f32_tile,
    DotTileFn,
};
pub use types::{GgmlType, QK_K};

/// The scalar reference kernels: always available, used by tests and as the fallback.
pub mod scalar {
    pub use crate::f16::{
        dequantize_row_bf16, dequantize_row_f16, dequantize_row_f32, quantize_row_bf16,
        quantize_row_f16, quantize_row_f32, vec_dot_bf16_bf16, vec_dot_f16_f16, vec_dot_f32_f32,
    };
    pub use crate::iq1::{
        dequantize_row_iq1_m, dequantize_row_iq1_s, vec_dot_iq1_m_q8_k, vec_dot_iq1_s_q8_k,
    };
    pub use crate::iq2_3::{
        dequantize_row_iq2_s, dequantize_row_iq2_xs, dequantize_row_iq2_xxs,
        dequantize_row_iq3_xxs, vec_dot_iq2_s_q8_k, vec_dot_iq2_xs_q8_k, vec_dot_iq2_xxs_q8_k,
        vec_dot_iq3_xxs_q8_k,
    };
    pub use crate::iq3s::{dequantize_row_iq3_s, vec_dot_iq3_s_q8_k};
    pub use crate::iq4::{
        dequantize_row_iq4_nl, dequantize_row_iq4_xs, quantize_row_iq4_nl, quantize_row_iq4_nl_ref,
        quantize_row_iq4_xs, vec_dot_iq4_nl_q8_0, vec_dot_iq4_xs_q8_k,
    };
    pub use crate::iqk::{
        dequantize_row_iq2_k, dequantize_row_iq2_ks, dequantize_row_iq3_k, dequantize_row_iq3_ks,
        dequantize_row_iq4_k, dequantize_row_iq4_ks, dequantize_row_iq5_k, dequantize_row_iq5_ks,
        dequantize_row_iq6_k, dequantize_row_q6_0, vec_dot_iq2_k_q8_k, vec_dot_iq2_ks_q8_k,
        vec_dot_iq3_k_q8_k, vec_dot_iq3_ks_q8_k, vec_dot_iq4_k_q8_k, vec_dot_iq4_ks_q8_k,
        vec_dot_iq5_k_q8_k, vec_dot_iq5_ks_q8_k, vec_dot_iq6_k_q8_k, vec_dot_q6_0_q8_0,
    };
    pub use crate::kquants::{
        dequantize_row_q2_k, dequantize_row_q3_k, dequantize_row_q4_k, dequantize_row_q5_k,
        dequantize_row_q6_k, dequantize_row_q8_k, quantize_row_q2_k, quantize_row_q3_k,
        quantize_row_q4_k, quantize_row_q5_k, quantize_row_q6_k, quantize_row_q8_k,
        vec_dot_q2_k_q8_k, vec_dot_q3_k_q8_k, vec_dot_q4_k_q8_k, vec_dot_q5_k_q8_k,
        vec_dot_q6_k_q8_k,
    };
    pub use crate::legacy::{
        dequantize_row_q4_0, dequantize_row_q4_1, dequantize_row_q5_0, dequantize_row_q5_1,
        dequantize_row_q8_0, dequantize_row_q8_1, quantize_row_q4_0, quantize_row_q4_1,
        quantize_row_q5_0, quantize_row_q5_1, quantize_row_q8_0, quantize_row_q8_0_ref,
        quantize_row_q8_1, quantize_row_q8_1_ref, vec_dot_q4_0_q8_0, vec_dot_q4_1_q8_1,
        vec_dot_q5_0_q8_0, vec_dot_q5_1_q8_1, vec_dot_q8_0_q8_0,
    };

    use crate::{GgmlType, QuantizeFn, VecDotFn};

    /// Scalar dot kernel for weight type `ty`.
    pub fn vec_dot_fn(ty: GgmlType) -> Option<VecDotFn> {
        crate::dispatch::vec_dot_fn_scalar(ty)
    }

    /// Scalar activation quantizer (ggml-cpu `from_float` semantics) for `ty`.
    pub fn quantize_fn(ty: GgmlType) -> Option<QuantizeFn> {
        crate::dispatch::quantize_fn_scalar(ty)
    }

    pub use crate::dispatch::dequantize_fn;
}
