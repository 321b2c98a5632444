//! IQ1_S (1.5625 bits per weight) and IQ1_M (1.75 bits per weight): 256-element super-blocks
//! whose groups of 8 elements are points of the ternary grid [`IQ1S_GRID`] (values -1, 0, 1)
//! shifted by a delta of `±1/8` (`IQ1S_DELTA` = `IQ1M_DELTA` = 0.125).
//!
//! Layouts (little-endian), from ggml-common.h:
//!
//! | type  | bytes | layout                                                                 |
//! |-------|-------|------------------------------------------------------------------------|
//! | IQ1_S | 50    | d (f16), `qs[32]`, `qh[8]` (u16 per sub-block of 32)                   |
//! | IQ1_M | 56    | `qs[32]`, `qh[16]` (one byte per 16 elements), `scales[8]` (4 x u16)   |
//!
//! IQ1_S, sub-block `ib` of 32, `h = qh[ib]`: group `l` (0..4) has grid index
//! `qs[4 ib + l] | ((h >> 3 l) & 7) << 8`, the scale is `d * (2 * ((h >> 12) & 7) + 1)`, the delta
//! is negative where bit 15 is set.
//!
//! IQ1_M has no `d` field: its f16 super-block scale is spread over the top nibbles of the four
//! u16 scale words (`sc[0] >> 12 | sc[1] >> 8 & 0xf0 | sc[2] >> 4 & 0xf00 | sc[3] & 0xf000`).
//! The remaining 12 bits of `sc[ib / 2]` hold 3-bit scales, one per 16 elements: bits
//! `6 (ib % 2)` and `6 (ib % 2) + 3` for the two halves of sub-block `ib`. Each `qh` byte covers
//! two groups of 8: bits 0..3 the high index bits of the first and bit 3 its delta sign,
//! bits 4..7 likewise for the second.
//!
//! Ports of ggml-quants.c `dequantize_row_iq1_s/m` and ggml-cpu/quants.c
//! `ggml_vec_dot_iq1_s/m_q8_K_generic`. llama-quantize needs an importance matrix for these
//! types (and ggml-cpu has no `from_float` for them), so there are no quantizers here.
//!
//! Verified by: `tests/ggml_golden.rs` (bit-exact against ggml's compiled C on random raw
//! blocks), `tests/roundtrip.rs` (vec_dot vs the f64 dot of dequantized values).

use crate::common::{rd_f16, rd_f32, rd_i16, rd_u16};
use crate::f16::fp16_to_f32;
use crate::iq_grids::IQ1S_GRID;
use crate::kquants::Q8_K_BYTES;
use crate::QK_K;

pub const IQ1_S_BYTES: usize = 50;
pub const IQ1_M_BYTES: usize = 56;

/// `IQ1S_DELTA` / `IQ1M_DELTA`.
pub(crate) const IQ1_DELTA: f32 = 0.125;

/// The 8 grid values (-1, 0, 1) of grid index `idx`.
#[inline(always)]
pub(crate) fn iq1_grid(idx: usize) -> [i8; 8] {
    IQ1S_GRID[idx].to_le_bytes().map(|b| b as i8)
}

/// IQ1_S `qh[ib]`.
#[inline(always)]
pub(crate) fn iq1s_qh(x: &[u8], ib: usize) -> u16 {
    rd_u16(x, 34 + 2 * ib)
}

/// IQ1_S grid index of group `l` (0..4) of sub-block `ib`.
#[inline(always)]
pub(crate) fn iq1s_index(x: &[u8], ib: usize, l: usize) -> usize {
    x[2 + 4 * ib + l] as usize | ((((iq1s_qh(x, ib) >> (3 * l)) & 7) as usize) << 8)
}

/// IQ1_S sub-block scale multiplier `2 * s + 1`.
#[inline(always)]
pub(crate) fn iq1s_scale(qh: u16) -> i32 {
    2 * ((qh >> 12) & 7) as i32 + 1
}

/// The IQ1_M super-block scale (an f16's bits) from the top nibbles of the 4 scale words.
#[inline(always)]
pub(crate) fn iq1m_scale_bits(x: &[u8]) -> u16 {
    let sc = |i: usize| rd_u16(x, 48 + 2 * i);
    (sc(0) >> 12) | ((sc(1) >> 8) & 0x00f0) | ((sc(2) >> 4) & 0x0f00) | (sc(3) & 0xf000)
}

/// Store `d` (an f16's bits) as the IQ1_M super-block scale of `block`: the top nibbles of its 4
/// scale words (the 3-bit sub-block scales below them are kept).
pub fn set_iq1m_scale(block: &mut [u8], d: u16) {
    for k in 0..4 {
        let hi = &mut block[48 + 2 * k + 1];
        *hi = (*hi & 0x0f) | ((((d >> (4 * k)) & 0xf) as u8) << 4);
    }
}

/// IQ1_M scale multiplier `2 * s + 1` of half `h` (0, 1: 16 elements each) of sub-block `ib`.
#[inline(always)]
pub(crate) fn iq1m_scale(x: &[u8], ib: usize, h: usize) -> i32 {
    let sc = rd_u16(x, 48 + 2 * (ib / 2));
    2 * ((sc >> (6 * (ib % 2) + 3 * h)) & 7) as i32 + 1
}

/// IQ1_M `qh` byte of group `l` (0..4) of sub-block `ib`, already shifted so that its low
/// nibble is the group's (3 index bits, then the delta sign in bit 3).
#[inline(always)]
fn iq1m_qh_nibble(x: &[u8], ib: usize, l: usize) -> u16 {
    (x[32 + 2 * ib + l / 2] >> (4 * (l % 2))) as u16 & 0xf
}

/// IQ1_M grid index of group `l` (0..4) of sub-block `ib`.
#[inline(always)]
pub(crate) fn iq1m_index(x: &[u8], ib: usize, l: usize) -> usize {
    x[4 * ib + l] as usize | (((iq1m_qh_nibble(x, ib, l) & 7) as usize) << 8)
}

/// Whether the delta of group `l` (0..4) of IQ1_M sub-block `ib` is negative.
#[inline(always)]
pub(crate) fn iq1m_delta_negative(x: &[u8], ib: usize, l: usize) -> bool {
    iq1m_qh_nibble(x, ib, l) & 8 != 0
}

/// Dequantize an IQ1_S row (`dst.len()` a multiple of 256).
pub fn dequantize_row_iq1_s(src: &[u8], dst: &mut [f32]) {
    let nb = dst.len() / QK_K;
    for (x, y) in src[..nb * IQ1_S_BYTES]
        .chunks_exact(IQ1_S_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let d = rd_f16(x, 0);
        for ib in 0..QK_K / 32 {
            let qh = iq1s_qh(x, ib);
            let dl = d * iq1s_scale(qh) as f32;
            let delta = if qh & 0x8000 != 0 {
                -IQ1_DELTA
            } else {
                IQ1_DELTA
            };
            for l in 0..4 {
                let grid = iq1_grid(iq1s_index(x, ib, l));
                for j in 0..8 {
                    y[32 * ib + 8 * l + j] = dl * (grid[j] as f32 + delta);
                }
            }
        }
    }
}

/// Dequantize an IQ1_M row (`dst.len()` a multiple of 256).
pub fn dequantize_row_iq1_m(src: &[u8], dst: &mut [f32]) {
    let nb = dst.len() / QK_K;
    for (x, y) in src[..nb * IQ1_M_BYTES]
        .chunks_exact(IQ1_M_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let d = fp16_to_f32(iq1m_scale_bits(x));
        for ib in 0..QK_K / 32 {
            let dl = [
                d * iq1m_scale(x, ib, 0) as f32,
                d * iq1m_scale(x, ib, 1) as f32,
            ];
            for l in 0..4 {
                let grid = iq1_grid(iq1m_index(x, ib, l));
                let delta = if iq1m_delta_negative(x, ib, l) {
                    -IQ1_DELTA
                } else {
                    IQ1_DELTA
                };
                for j in 0..8 {
                    y[32 * ib + 8 * l + j] = dl[l / 2] * (grid[j] as f32 + delta);
                }
            }
        }
    }
}

/// `sum_j q8[j] * grid[j]` over one group of 8.
#[inline(always)]
fn group_dot(grid: [i8; 8], q8: &[u8]) -> i32 {
    grid.iter()
        .zip(q8)
        .map(|(&g, &q)| q as i8 as i32 * g as i32)
        .sum()
}

/// IQ1_S weights x Q8_K activations (`ggml_vec_dot_iq1_s_q8_K_generic`).
pub fn vec_dot_iq1_s_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let nb = n / QK_K;
    let mut sumf = 0f32;
    for (x, y) in w[..nb * IQ1_S_BYTES]
        .chunks_exact(IQ1_S_BYTES)
        .zip(a[..nb * Q8_K_BYTES].chunks_exact(Q8_K_BYTES))
    {
        let q8 = &y[4..4 + QK_K];
        let mut sumi = 0i32;
        let mut sumi1 = 0i32;
        for ib in 0..QK_K / 32 {
            let qh = iq1s_qh(x, ib);
            let ls = iq1s_scale(qh);
            let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
            let mut lsum = 0i32;
            for l in 0..4 {
                let off = 32 * ib + 8 * l;
                lsum += group_dot(iq1_grid(iq1s_index(x, ib, l)), &q8[off..off + 8]);
            }
            let bsums = rd_i16(y, 260 + 4 * ib) as i32 + rd_i16(y, 260 + 4 * ib + 2) as i32;
            sumi += ls * lsum;
            sumi1 += ls * delta * bsums;
        }
        sumf += rd_f16(x, 0) * rd_f32(y, 0) * (sumi as f32 + IQ1_DELTA * sumi1 as f32);
    }
    sumf
}

/// IQ1_M weights x Q8_K activations (`ggml_vec_dot_iq1_m_q8_K_generic`).
pub fn vec_dot_iq1_m_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let nb = n / QK_K;
    let mut sumf = 0f32;
    for (x, y) in w[..nb * IQ1_M_BYTES]
        .chunks_exact(IQ1_M_BYTES)
        .zip(a[..nb * Q8_K_BYTES].chunks_exact(Q8_K_BYTES))
    {
        let q8 = &y[4..4 + QK_K];
        let mut sumi1 = 0i32;
        let mut sumi2 = 0i32;
        for ib in 0..QK_K / 32 {
            // per half of 16: the grid dot and the delta-signed activation sum
            let mut sum1 = [0i32; 2];
            let mut sum2 = [0i32; 2];
            for l in 0..4 {
                let q = &q8[32 * ib + 8 * l..32 * ib + 8 * l + 8];
                let lsum2: i32 = q.iter().map(|&v| v as i8 as i32).sum();
                let delta = if iq1m_delta_negative(x, ib, l) { -1 } else { 1 };
                sum1[l / 2] += group_dot(iq1_grid(iq1m_index(x, ib, l)), q);
                sum2[l / 2] += lsum2 * delta;
            }
            let (ls1, ls2) = (iq1m_scale(x, ib, 0), iq1m_scale(x, ib, 1));
            sumi1 += sum1[0] * ls1 + sum1[1] * ls2;
            sumi2 += sum2[0] * ls1 + sum2[1] * ls2;
        }
        let d = fp16_to_f32(iq1m_scale_bits(x));
        sumf += d * rd_f32(y, 0) * (sumi1 as f32 + IQ1_DELTA * sumi2 as f32);
    }
    sumf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iq1m_scale_round_trips_and_keeps_the_sub_block_scales() {
        let mut blk = [0xa5u8; IQ1_M_BYTES];
        for d in [0x0000u16, 0x2c00, 0xb3c1, 0x7bff] {
            set_iq1m_scale(&mut blk, d);
            assert_eq!(iq1m_scale_bits(&blk), d);
            for w in 0..4 {
                assert_eq!(rd_u16(&blk, 48 + 2 * w) & 0x0fff, 0x05a5);
            }
        }
    }
}
