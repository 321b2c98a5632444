//! The "legacy" 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1.
//!
//! Layouts (little-endian, `d`/`m`/`s` are IEEE halves), from ggml-common.h:
//!
//! | type | bytes | layout                            | value        |
//! |------|-------|-----------------------------------|--------------|
//! | Q4_0 | 18    | d, `qs[16]`                       | d * (q - 8)  |
//! | Q4_1 | 20    | d, m, `qs[16]`                    | d * q + m    |
//! | Q5_0 | 22    | d, `qh[4]`, `qs[16]`              | d * (q - 16) |
//! | Q5_1 | 24    | d, m, `qh[4]`, `qs[16]`           | d * q + m    |
//! | Q8_0 | 34    | d, `qs[32]` (i8)                  | d * q        |
//! | Q8_1 | 36    | d, s = d * sum(qs), `qs[32]` (i8) | d * q        |
//!
//! Nibble packing: byte `j` holds element `j` in its low nibble and element `j + 16` in its high
//! nibble; bit `j` of `qh` is the fifth bit of element `j`.
//!
//! Ports of ggml-quants.c `dequantize_row_*` / `quantize_row_*_ref` (weights, as llama-quantize
//! writes them without an imatrix), ggml-cpu/arch/x86/quants.c `quantize_row_q8_0` /
//! `quantize_row_q8_1` (activations: `id = 127/amax`, round-half-to-even, saturating packs) and
//! ggml-cpu/quants.c `ggml_vec_dot_*_generic` (same integer sums and per-block float formula).
//!
//! Verified by: known-answer blocks, quantize/dequantize round-trip bounds, vec_dot vs
//! dequantized dot consistency, and SIMD-vs-scalar property tests (`tests/`).

use crate::common::*;
use crate::f16::f32_to_fp16;

pub const QK: usize = 32;
pub const Q4_0_BYTES: usize = 18;
pub const Q4_1_BYTES: usize = 20;
pub const Q5_0_BYTES: usize = 22;
pub const Q5_1_BYTES: usize = 24;
pub const Q8_0_BYTES: usize = 34;
pub const Q8_1_BYTES: usize = 36;

// ---------------------------------------------------------------------------------------------
// dequantize

/// The 32 four-bit quants of a Q4_0 / Q4_1 block from its 16 packed bytes, in element order
/// (0..15; Q4_0's value is q - 8).
#[inline]
pub(crate) fn quants_4bit(qs: &[u8]) -> [u8; QK] {
    let mut q = [0u8; QK];
    for j in 0..16 {
        q[j] = qs[j] & 0x0F;
        q[j + 16] = qs[j] >> 4;
    }
    q
}

/// The 32 five-bit quants of a Q5_0 / Q5_1 block from its 16 packed low nibbles and 32 high
/// bits, in element order (0..31; Q5_0's value is q - 16).
#[inline]
pub(crate) fn quants_5bit(qs: &[u8], qh: u32) -> [u8; QK] {
    let mut q = [0u8; QK];
    for j in 0..16 {
        q[j] = (qs[j] & 0x0F) | ((((qh >> j) << 4) & 0x10) as u8);
        q[j + 16] = (qs[j] >> 4) | (((qh >> (j + 12)) & 0x10) as u8);
    }
    q
}

/// The inverse of [`quants_4bit`]: 32 four-bit quants into a Q4_0 / Q4_1 block's 16 bytes
/// (element `j` in the low nibble of byte `j`, element `j + 16` in the high nibble).
#[inline]
pub(crate) fn pack_4bit(l: &[u8; QK], qs: &mut [u8]) {
    for j in 0..16 {
        qs[j] = l[j] | (l[j + 16] << 4);
    }
}

/// The inverse of [`quants_5bit`]: 32 five-bit quants into a Q5_0 / Q5_1 block's 16 bytes of
/// low nibbles (as [`pack_4bit`]); returns the fifth bits (`qh`, bit `j` for element `j`).
#[inline]
pub(crate) fn pack_5bit(l: &[u8; QK], qs: &mut [u8]) -> u32 {
    let mut qh = 0u32;
    for j in 0..16 {
        let (xi0, xi1) = (l[j], l[j + 16]);
        qs[j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
        qh |= (u32::from(xi0 & 0x10) >> 4) << j;
        qh |= (u32::from(xi1 & 0x10) >> 4) << (j + 16);
    }
    qh
}

/// Dequantize a Q4_0 row (`dst.len()` a multiple of 32).
pub fn dequantize_row_q4_0(src: &[u8], dst: &mut [f32]) {
    let nb = dst.len() / QK;
    for (x, y) in src[..nb * Q4_0_BYTES]
        .chunks_exact(Q4_0_BYTES)
        .zip(dst.chunks_exact_mut(QK))
    {
        let d = rd_f16(x, 0);
        for (yj, q) in y.iter_mut().zip(quants_4bit(&x[2..18])) {
            *yj = (q as i32 - 8) as f32 * d;
        }
    }
}

/// Dequantize a Q4_1 row.
pub fn dequantize_row_q4_1(src: &[u8], dst: &mut [f32]) {
    let nb = dst.len() / QK;
    for (x, y) in src[..nb * Q4_1_BYTES]
        .chunks_exact(Q4_1_BYTES)
        .zip(dst.chunks_exact_mut(QK))
    {
        let d = rd_f16(x, 0);
        let m = rd_f16(x, 2);
        for (yj, q) in y.iter_mut().zip(quants_4bit(&x[4..20])) {
            *yj = q as f32 * d + m;
        }
    }
}

/// Dequantize a Q5_0 row.
pub fn dequantize_row_q5_0(src: &[u8], dst: &mut [f32]) {
    let nb = dst.len() / QK;
    for (x, y) in src[..nb * Q5_0_BYTES]
        .chunks_exact(Q5_0_BYTES)
        .zip(dst.chunks_exact_mut(QK))
    {
        let d = rd_f16(x, 0);
        for (yj, q) in y.iter_mut().zip(quants_5bit(&x[6..22], rd_u32(x, 2))) {
            *yj = (q as i32 - 16) as f32 * d;
        }
    }
}

/// Dequantize a Q5_1 row.
pub fn dequantize_row_q5_1(src: &[u8], dst: &mut [f32]) {
    let nb = dst.len() / QK;
    for (x, y) in src[..nb * Q5_1_BYTES]
        .chunks_exact(Q5_1_BYTES)
        .zip(dst.chunks_exact_mut(QK))
    {
        let d = rd_f16(x, 0);
        let m = rd_f16(x, 2);
        for (yj, q) in y.iter_mut().zip(quants_5bit(&x[8..24], rd_u32(x, 4))) {
            *yj = q as f32 * d + m;
        }
    }
}

/// Dequantize a Q8_0 row.
pub fn dequantize_row_q8_0(src: &[u8], dst: &mut [f32]) {
    let nb = dst.len() / QK;
    for (x, y) in src[..nb * Q8_0_BYTES]
        .chunks_exact(Q8_0_BYTES)
        .zip(dst.chunks_exact_mut(QK))
    {
        let d = rd_f16(x, 0);
        for (yj, q) in y.iter_mut().zip(&x[2..34]) {
            *yj = (*q as i8) as f32 * d;
        }
    }
}

/// Dequantize a Q8_1 row (`d * q`; the stored sum `s` is not needed).
pub fn dequantize_row_q8_1(src: &[u8], dst: &mut [f32]) {
    let nb = dst.len() / QK;
    for (x, y) in src[..nb * Q8_1_BYTES]
        .chunks_exact(Q8_1_BYTES)
        .zip(dst.chunks_exact_mut(QK))
    {
        let d = rd_f16(x, 0);
        for (yj, q) in y.iter_mut().zip(&x[4..36]) {
            *yj = (*q as i8) as f32 * d;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// weight quantizers (quantize_row_*_ref)

/// Index and signed value of the first element with the largest |x| (ggml's `amax`/`max` scan).
#[inline(always)]
fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let mut amax = 0f32;
    let mut max = 0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

#[inline(always)]
fn min_max(x: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// Quantize a row to Q4_0 (`quantize_row_q4_0_ref`).
pub fn quantize_row_q4_0(src: &[f32], dst: &mut [u8]) {
    let nb = src.len() / QK;
    for (x, y) in src
        .chunks_exact(QK)
        .zip(dst[..nb * Q4_0_BYTES].chunks_exact_mut(Q4_0_BYTES))
    {
        let (_, max) = signed_absmax(x);
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        wr_u16(y, 0, f32_to_fp16(d));
        let l: [u8; QK] =
            std::array::from_fn(|j| 15.min(c_f32_to_i8(x[j] * id + 8.5) as i32) as u8);
        pack_4bit(&l, &mut y[2..18]);
    }
}

/// Quantize a row to Q4_1 (`quantize_row_q4_1_ref`).
pub fn quantize_row_q4_1(src: &[f32], dst: &mut [u8]) {
    let nb = src.len() / QK;
    for (x, y) in src
        .chunks_exact(QK)
        .zip(dst[..nb * Q4_1_BYTES].chunks_exact_mut(Q4_1_BYTES))
    {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        wr_u16(y, 0, f32_to_fp16(d));
        wr_u16(y, 2, f32_to_fp16(min));
        let l: [u8; QK] =
            std::array::from_fn(|j| 15.min(c_f32_to_i8((x[j] - min) * id + 0.5) as i32) as u8);
        pack_4bit(&l, &mut y[4..20]);
    }
}

/// Quantize a row to Q5_0 (`quantize_row_q5_0_ref`).
pub fn quantize_row_q5_0(src: &[f32], dst: &mut [u8]) {
    let nb = src.len() / QK;
    for (x, y) in src
        .chunks_exact(QK)
        .zip(dst[..nb * Q5_0_BYTES].chunks_exact_mut(Q5_0_BYTES))
    {
        let (_, max) = signed_absmax(x);
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        wr_u16(y, 0, f32_to_fp16(d));
        let l: [u8; QK] =
            std::array::from_fn(|j| 31.min(c_f32_to_i8(x[j] * id + 16.5) as i32) as u8);
        let qh = pack_5bit(&l, &mut y[6..22]);
        wr_u32(y, 2, qh);
    }
}

/// Quantize a row to Q5_1 (`quantize_row_q5_1_ref`).
pub fn quantize_row_q5_1(src: &[f32], dst: &mut [u8]) {
    let nb = src.len() / QK;
    for (x, y) in src
        .chunks_exact(QK)
        .zip(dst[..nb * Q5_1_BYTES].chunks_exact_mut(Q5_1_BYTES))
    {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        wr_u16(y, 0, f32_to_fp16(d));
        wr_u16(y, 2, f32_to_fp16(min));
        let l: [u8; QK] = std::array::from_fn(|j| c_f32_to_u8((x[j] - min) * id + 0.5));
        let qh = pack_5bit(&l, &mut y[8..24]);
        wr_u32(y, 4, qh);
    }
}

/// Quantize a row to Q8_0 the way llama-quantize writes weights (`quantize_row_q8_0_ref`:
/// `d = amax/127`, `id = 1/d`, `roundf` = round half away from zero).
pub fn quantize_row_q8_0_ref(src: &[f32], dst: &mut [u8]) {
    let nb = src.len() / QK;
    for (x, y) in src
        .chunks_exact(QK)
        .zip(dst[..nb * Q8_0_BYTES].chunks_exact_mut(Q8_0_BYTES))
    {
        let mut amax = 0f32;
        for &v in x {
            let a = v.abs();
            amax = if amax > a { amax } else { a };
        }
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        wr_u16(y, 0, f32_to_fp16(d));
        for j in 0..QK {
            y[2 + j] = c_f32_to_i8((x[j] * id).round()) as u8;
        }
    }
}

/// Quantize a row to Q8_1 with the reference algorithm (`quantize_row_q8_1_ref`).
pub fn quantize_row_q8_1_ref(src: &[f32], dst: &mut [u8]) {
    let nb = src.len() / QK;
    for (x, y) in src
        .chunks_exact(QK)
        .zip(dst[..nb * Q8_1_BYTES].chunks_exact_mut(Q8_1_BYTES))
    {
        let mut amax = 0f32;
        for &v in x {
            let a = v.abs();
            amax = if amax > a { amax } else { a };
        }
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        wr_u16(y, 0, f32_to_fp16(d));
        let mut sum = 0i32;
        for j in 0..16 {
            let q0 = c_f32_to_i8((x[j] * id).round());
            let q1 = c_f32_to_i8((x[16 + j] * id).round());
            y[4 + j] = q0 as u8;
            y[4 + 16 + j] = q1 as u8;
            sum += q0 as i32 + q1 as i32;
        }
        wr_u16(y, 2, f32_to_fp16(sum as f32 * d));
    }
}

// ---------------------------------------------------------------------------------------------
// activation quantizers (x86 ggml-cpu behaviour)

/// Quantize activations to Q8_0 exactly as ggml-cpu does on x86 (AVX/AVX2 `quantize_row_q8_0`):
/// `d = amax/127`, `id = 127/amax`, round-half-to-even, saturate to i8.
pub fn quantize_row_q8_0(src: &[f32], dst: &mut [u8]) {
    let nb = src.len() / QK;
    for (x, y) in src
        .chunks_exact(QK)
        .zip(dst[..nb * Q8_0_BYTES].chunks_exact_mut(Q8_0_BYTES))
    {
        let max_scalar = x86_absmax_32(x);
        let d = max_scalar / 127.0;
        wr_u16(y, 0, f32_to_fp16(d));
        let id = if max_scalar != 0.0 {
            127.0 / max_scalar
        } else {
            0.0
        };
        for j in 0..QK {
            y[2 + j] = sat_i8(cvt_rne_i32(x[j] * id)) as u8;
        }
    }
}

/// Quantize activations to Q8_1 exactly as ggml-cpu does on x86 (AVX2 `quantize_row_q8_1`).
/// The stored sum uses the 32-bit integers before saturation, like the AVX2 code.
pub fn quantize_row_q8_1(src: &[f32], dst: &mut [u8]) {
    let nb = src.len() / QK;
    for (x, y) in src
        .chunks_exact(QK)
        .zip(dst[..nb * Q8_1_BYTES].chunks_exact_mut(Q8_1_BYTES))
    {
        let max_scalar = x86_absmax_32(x);
        let d = max_scalar / 127.0;
        wr_u16(y, 0, f32_to_fp16(d));
        let id = if max_scalar != 0.0 {
            127.0 / max_scalar
        } else {
            0.0
        };
        let mut sum = 0i32;
        for j in 0..QK {
            let v = cvt_rne_i32(x[j] * id);
            sum = sum.wrapping_add(v);
            y[4 + j] = sat_i8(v) as u8;
        }
        wr_u16(y, 2, f32_to_fp16(d * sum as f32));
    }
}

// ---------------------------------------------------------------------------------------------
// dot products (ggml_vec_dot_*_generic)

/// Q4_0 weights x Q8_0 activations.
pub fn vec_dot_q4_0_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let nb = n / QK;
    let mut sumf = 0f32;
    for (x, y) in w[..nb * Q4_0_BYTES]
        .chunks_exact(Q4_0_BYTES)
        .zip(a[..nb * Q8_0_BYTES].chunks_exact(Q8_0_BYTES))
    {
        let sumi: i32 = quants_4bit(&x[2..18])
            .iter()
            .zip(&y[2..34])
            .map(|(&q, &v)| (q as i32 - 8) * (v as i8) as i32)
            .sum();
        sumf += sumi as f32 * rd_f16(x, 0) * rd_f16(y, 0);
    }
    sumf
}

/// Q4_1 weights x Q8_1 activations.
pub fn vec_dot_q4_1_q8_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let nb = n / QK;
    let mut sumf = 0f32;
    for (x, y) in w[..nb * Q4_1_BYTES]
        .chunks_exact(Q4_1_BYTES)
        .zip(a[..nb * Q8_1_BYTES].chunks_exact(Q8_1_BYTES))
    {
        let sumi: i32 = quants_4bit(&x[4..20])
            .iter()
            .zip(&y[4..36])
            .map(|(&q, &v)| q as i32 * (v as i8) as i32)
            .sum();
        sumf += (rd_f16(x, 0) * rd_f16(y, 0)) * sumi as f32 + rd_f16(x, 2) * rd_f16(y, 2);
    }
    sumf
}

/// Q5_0 weights x Q8_0 activations.
pub fn vec_dot_q5_0_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let nb = n / QK;
    let mut sumf = 0f32;
    for (x, y) in w[..nb * Q5_0_BYTES]
        .chunks_exact(Q5_0_BYTES)
        .zip(a[..nb * Q8_0_BYTES].chunks_exact(Q8_0_BYTES))
    {
        let sumi: i32 = quants_5bit(&x[6..22], rd_u32(x, 2))
            .iter()
            .zip(&y[2..34])
            .map(|(&q, &v)| (q as i32 - 16) * (v as i8) as i32)
            .sum();
        sumf += (rd_f16(x, 0) * rd_f16(y, 0)) * sumi as f32;
    }
    sumf
}

/// Q5_1 weights x Q8_1 activations.
pub fn vec_dot_q5_1_q8_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let nb = n / QK;
    let mut sumf = 0f32;
    for (x, y) in w[..nb * Q5_1_BYTES]
        .chunks_exact(Q5_1_BYTES)
        .zip(a[..nb * Q8_1_BYTES].chunks_exact(Q8_1_BYTES))
    {
        let sumi: i32 = quants_5bit(&x[8..24], rd_u32(x, 4))
            .iter()
            .zip(&y[4..36])
            .map(|(&q, &v)| q as i32 * (v as i8) as i32)
            .sum();
        sumf += (rd_f16(x, 0) * rd_f16(y, 0)) * sumi as f32 + rd_f16(x, 2) * rd_f16(y, 2);
    }
    sumf
}

/// Q8_0 weights x Q8_0 activations.
pub fn vec_dot_q8_0_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let nb = n / QK;
    let mut sumf = 0f32;
    for (x, y) in w[..nb * Q8_0_BYTES]
        .chunks_exact(Q8_0_BYTES)
        .zip(a[..nb * Q8_0_BYTES].chunks_exact(Q8_0_BYTES))
    {
        let mut sumi = 0i32;
        for (p, q) in x[2..34].iter().zip(&y[2..34]) {
            sumi += (*p as i8) as i32 * (*q as i8) as i32;
        }
        sumf += sumi as f32 * (rd_f16(x, 0) * rd_f16(y, 0));
    }
    sumf
}
