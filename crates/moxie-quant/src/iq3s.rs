//! IQ3_S: 3.4375 bits per weight, 256-element super-blocks of 8 sub-blocks of 32.
//!
//! Layout (little-endian, `d` an IEEE half), from ggml-common.h `block_iq3_s`:
//!
//! | bytes   | field        | meaning                                                        |
//! |---------|--------------|----------------------------------------------------------------|
//! | 0..2    | d            | super-block scale                                              |
//! | 2..66   | `qs[64]`     | low 8 bits of the grid indices, 8 per sub-block                |
//! | 66..74  | `qh[8]`      | the 9th index bit, one byte per sub-block (bit k: index k)     |
//! | 74..106 | `signs[32]`  | one bit per element, 4 bytes per sub-block                     |
//! | 106..110| `scales[4]`  | 4-bit sub-block scales, two per byte (low nibble first)        |
//!
//! Sub-block `ib` has scale `d * (1 + 2 * sc)`; its 8 grid indices `qs[8 ib + k] | qh bit k`
//! pick 4 magnitudes each from [`IQ3S_GRID`] (odd values 1..15), element `j` negated where bit
//! `j % 8` of `signs[4 ib + j / 8]` is set.
//!
//! Ports of ggml-quants.c `dequantize_row_iq3_s` and ggml-cpu/quants.c
//! `ggml_vec_dot_iq3_s_q8_K_generic`. llama-quantize needs an importance matrix for IQ3_S
//! (and ggml-cpu has no `from_float` for it), so there is no quantizer here.
//!
//! Verified by: `tests/ggml_golden.rs` (bit-exact against ggml's compiled C on random raw
//! blocks), `tests/roundtrip.rs` (vec_dot vs the f64 dot of dequantized values).

use crate::common::{rd_f16, rd_f32};
use crate::iq_grids::{IQ3S_GRID, KMASK_IQ2XS};
use crate::kquants::Q8_K_BYTES;
use crate::QK_K;

pub const IQ3_S_BYTES: usize = 110;

const QS: usize = 2;
const QH: usize = 66;
const SIGNS: usize = 74;
const SCALES: usize = 106;

/// The 4-bit scale of sub-block `ib` as the odd multiplier `1 + 2 * sc`.
#[inline(always)]
pub(crate) fn iq3s_scale(x: &[u8], ib: usize) -> i32 {
    1 + 2 * ((x[SCALES + ib / 2] >> (4 * (ib % 2))) & 0xf) as i32
}

/// Grid index `k` (0..8) of sub-block `ib`: 8 bits from `qs`, the 9th from `qh[ib]` bit `k`.
#[inline(always)]
pub(crate) fn iq3s_index(x: &[u8], ib: usize, k: usize) -> usize {
    x[QS + 8 * ib + k] as usize | (((x[QH + ib] as usize) << (8 - k)) & 256)
}

/// The 4 magnitudes of grid index `k` of sub-block `ib`.
#[inline(always)]
fn grid(x: &[u8], ib: usize, k: usize) -> [u8; 4] {
    IQ3S_GRID[iq3s_index(x, ib, k)].to_le_bytes()
}

/// The sign byte of elements `8 l .. 8 l + 8` of sub-block `ib`.
#[inline(always)]
pub(crate) fn iq3s_signs(x: &[u8], ib: usize, l: usize) -> u8 {
    x[SIGNS + 4 * ib + l]
}

/// Dequantize an IQ3_S row (`dst.len()` a multiple of 256).
pub fn dequantize_row_iq3_s(src: &[u8], dst: &mut [f32]) {
    let nb = dst.len() / QK_K;
    for (x, y) in src[..nb * IQ3_S_BYTES]
        .chunks_exact(IQ3_S_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let d = rd_f16(x, 0);
        for ib in 0..QK_K / 32 {
            let db = d * iq3s_scale(x, ib) as f32;
            for l in 0..4 {
                let (g1, g2) = (grid(x, ib, 2 * l), grid(x, ib, 2 * l + 1));
                let signs = iq3s_signs(x, ib, l);
                let yo = &mut y[32 * ib + 8 * l..32 * ib + 8 * l + 8];
                for j in 0..4 {
                    // ggml multiplies by -1.f / 1.f (not a negation)
                    let s1 = if signs & KMASK_IQ2XS[j] != 0 {
                        -1.0
                    } else {
                        1.0
                    };
                    let s2 = if signs & KMASK_IQ2XS[j + 4] != 0 {
                        -1.0
                    } else {
                        1.0
                    };
                    yo[j] = db * g1[j] as f32 * s1;
                    yo[j + 4] = db * g2[j] as f32 * s2;
                }
            }
        }
    }
}

/// IQ3_S weights x Q8_K activations (`ggml_vec_dot_iq3_s_q8_K_generic`).
pub fn vec_dot_iq3_s_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let nb = n / QK_K;
    let mut sumf = 0f32;
    for (x, y) in w[..nb * IQ3_S_BYTES]
        .chunks_exact(IQ3_S_BYTES)
        .zip(a[..nb * Q8_K_BYTES].chunks_exact(Q8_K_BYTES))
    {
        let d = rd_f16(x, 0) * rd_f32(y, 0);
        let q8 = &y[4..4 + QK_K];
        // int32 in C (the scales are uint32_t there: the same bits when wrapping)
        let mut bsum = 0i32;
        for ib in 0..QK_K / 32 {
            let mut sumi = 0i32;
            for l in 0..4 {
                let (g1, g2) = (grid(x, ib, 2 * l), grid(x, ib, 2 * l + 1));
                let signs = iq3s_signs(x, ib, l);
                let q = &q8[32 * ib + 8 * l..32 * ib + 8 * l + 8];
                for j in 0..4 {
                    let s1 = if signs & KMASK_IQ2XS[j] != 0 { -1 } else { 1 };
                    let s2 = if signs & KMASK_IQ2XS[j + 4] != 0 {
                        -1
                    } else {
                        1
                    };
                    sumi += g1[j] as i32 * q[j] as i8 as i32 * s1;
                    sumi += g2[j] as i32 * q[j + 4] as i8 as i32 * s2;
                }
            }
            bsum = bsum.wrapping_add(sumi.wrapping_mul(iq3s_scale(x, ib)));
        }
        sumf += d * bsum as f32;
    }
    sumf
}
