//! Small helpers shared by the format modules: little-endian field access and the exact
//! C conversions ggml relies on (`nearest_int`, float-to-int casts as x86 performs them).

use crate::f16::fp16_to_f32;

/// Read a little-endian `u16` at byte offset `off`.
#[inline(always)]
pub(crate) fn rd_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

/// Read a little-endian `u32` at byte offset `off`.
#[inline(always)]
pub(crate) fn rd_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Read a little-endian `f32` at byte offset `off`.
#[inline(always)]
pub(crate) fn rd_f32(b: &[u8], off: usize) -> f32 {
    f32::from_bits(rd_u32(b, off))
}

/// Read a little-endian `i16` at byte offset `off`.
#[inline(always)]
pub(crate) fn rd_i16(b: &[u8], off: usize) -> i16 {
    i16::from_le_bytes([b[off], b[off + 1]])
}

/// Read an IEEE half at byte offset `off` and widen it (exact).
#[inline(always)]
pub(crate) fn rd_f16(b: &[u8], off: usize) -> f32 {
    fp16_to_f32(rd_u16(b, off))
}

#[inline(always)]
pub(crate) fn wr_u16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}

#[inline(always)]
pub(crate) fn wr_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

#[inline(always)]
pub(crate) fn wr_f32(b: &mut [u8], off: usize, v: f32) {
    wr_u32(b, off, v.to_bits());
}

#[inline(always)]
pub(crate) fn wr_i16(b: &mut [u8], off: usize, v: i16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}

/// ggml's `nearest_int`: round to nearest (ties to even under the default rounding mode) by
/// adding 1.5 * 2^23 and reading the mantissa bits. Valid for |x| <= 4194303; outside that
/// range it returns the same garbage the C code returns.
#[inline(always)]
pub(crate) fn nearest_int(fval: f32) -> i32 {
    let val = fval + 12_582_912.0f32;
    let i = val.to_bits() as i32;
    (i & 0x007f_ffff) - 0x0040_0000
}

/// C float -> int32 truncation as x86 `cvttss2si` performs it: NaN and out-of-range values
/// give `i32::MIN` (the "integer indefinite" value) instead of Rust's saturation.
#[inline(always)]
pub(crate) fn cvtt_i32(x: f32) -> i32 {
    if !(-2_147_483_648.0..2_147_483_648.0).contains(&x) {
        i32::MIN
    } else {
        x as i32
    }
}

/// C `(int8_t)(float)` as GCC emits it on x86: `cvttss2si` to 32 bits, keep the low byte.
#[inline(always)]
pub(crate) fn c_f32_to_i8(x: f32) -> i8 {
    cvtt_i32(x) as i8
}

/// C `(uint8_t)(float)` as GCC emits it on x86: `cvttss2si` to 32 bits, keep the low byte.
#[inline(always)]
pub(crate) fn c_f32_to_u8(x: f32) -> u8 {
    cvtt_i32(x) as u8
}

/// x86 `cvtps2dq` with round-to-nearest-even: NaN and out-of-range give `i32::MIN`.
#[inline(always)]
pub(crate) fn cvt_rne_i32(x: f32) -> i32 {
    let r = x.round_ties_even();
    if !(-2_147_483_648.0..2_147_483_648.0).contains(&r) {
        i32::MIN
    } else {
        r as i32
    }
}

/// `maxps` semantics: `a > b ? a : b` (returns `b` if either is NaN).
#[inline(always)]
pub(crate) fn x86_max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// max |x| over 32 floats, reduced in exactly the lane order of ggml's AVX `quantize_row_q8_0`
/// (4 x 8-lane `maxps`, then 128-bit halves, `movehl`, `movehdup`), so NaN handling agrees too.
#[inline(always)]
pub(crate) fn x86_absmax_32(x: &[f32]) -> f32 {
    let mut m = [0f32; 8];
    for (l, ml) in m.iter_mut().enumerate() {
        let mut v = x[l].abs();
        v = x86_max(v, x[8 + l].abs());
        v = x86_max(v, x[16 + l].abs());
        v = x86_max(v, x[24 + l].abs());
        *ml = v;
    }
    let m4 = [
        x86_max(m[4], m[0]),
        x86_max(m[5], m[1]),
        x86_max(m[6], m[2]),
        x86_max(m[7], m[3]),
    ];
    let m2 = [x86_max(m4[0], m4[2]), x86_max(m4[1], m4[3])];
    x86_max(m2[0], m2[1])
}

/// Saturating int32 -> int8 as `packssdw` + `packsswb` do.
#[inline(always)]
pub(crate) fn sat_i8(v: i32) -> i8 {
    v.clamp(-128, 127) as i8
}

/// Scale and min of sub-block `j` (0..8) of a Q4_K / Q5_K 12-byte packed scale array.
#[inline(always)]
pub(crate) fn get_scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Unpack the 16 six-bit signed scales of a Q3_K block (values 0..63, subtract 32 to use).
#[inline(always)]
pub(crate) fn q3k_scales(sc: &[u8]) -> [i8; 16] {
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let a0 = rd_u32(sc, 0);
    let a1 = rd_u32(sc, 4);
    let tmp = rd_u32(sc, 8);
    let aux = [
        (a0 & KMASK2) | (((tmp) & KMASK1) << 4),
        (a1 & KMASK2) | (((tmp >> 2) & KMASK1) << 4),
        ((a0 >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4),
        ((a1 >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4),
    ];
    let mut out = [0i8; 16];
    for (i, w) in aux.iter().enumerate() {
        for (k, b) in w.to_le_bytes().iter().enumerate() {
            out[4 * i + k] = *b as i8;
        }
    }
    out
}
