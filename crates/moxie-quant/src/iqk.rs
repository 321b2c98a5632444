//! ik_llama.cpp's own block types: IQ2_K .. IQ6_K (256-value super-blocks, an f16 scale
//! each), IQ2_KS .. IQ5_KS (the same idea with one scale per row, stored before the row's
//! blocks) and Q6_0 (32-value blocks; ik's fallback where a row is not whole super-blocks).
//!
//! The IQ types map a small index through a non-linear code book ([`IQ2NL`] .. [`IQ6NL`],
//! ik_llama.cpp's `ggml-common.h`) whose second half is the first shifted by a constant; one bit
//! per group (`extra`, or bit 0 of a `_KS` scale byte) picks the half. A group is 16 values (the
//! `_K` types) or 32 (the `_KS` types) with a small integer scale; a value is
//! `(d * scale) * code`.
//!
//! | type   | bytes | row prefix | groups  | block layout (little-endian)                     |
//! |--------|-------|------------|---------|--------------------------------------------------|
//! | IQ2_K  | 76    | -          | 16 x 16 | d, extra, `scales[8]` (4 bit, -8), `qs[64]`      |
//! | IQ3_K  | 110   | -          | 16 x 16 | d, extra, sign bits, `scales[8]` (2s+1), `qs[64]`, `qh[32]` |
//! | IQ4_K  | 144   | -          | 16 x 16 | d, extra, `scales_h[4]`, `scales_l[8]` (6 bit, -32), `qs[128]` |
//! | IQ5_K  | 176   | -          | 16 x 16 | as IQ4_K, then `qh[32]`                          |
//! | IQ6_K  | 212   | -          | 16 x 16 | d, extra, `scales[16]` (i8), `qs[128]`, `qh[64]` |
//! | IQ2_KS | 70    | f16        | 8 x 32  | extra, `scales[4]` (4 bit + extra bit, -16), `qs[64]` |
//! | IQ3_KS | 102   | f16        | 8 x 32  | extra, `scales[4]` (as IQ2_KS), `qs[64]`, `qh[32]` |
//! | IQ4_KS | 136   | f32        | 8 x 32  | `scales[8]` (bits 1-7, -127; bit 0 the half), `qs[128]` |
//! | IQ5_KS | 168   | f32        | 8 x 32  | as IQ4_KS, then `qh[32]`                         |
//! | Q6_0   | 26    | -          | 1 x 32  | d, `qh[8]`, `qs[16]`: `d * (q - 32)`             |
//!
//! Dequantization is ik_llama.cpp's `dequantize_row_*` (`iqk/iqk_quantize.cpp`; Q6_0:
//! `ggml-quants.c`) to the bit: `(d * scale) * code` in f32. IQ6_K alone dequantizes through a
//! cubic in its 6-bit index (plus 1 for the upper half) whose values, rounded, are the
//! [`IQ6NL`] code book that its dot products use; ik does the same.
//!
//! Dot products pair the super-block types with Q8_K and Q6_0 with Q8_0, as ik_llama.cpp's
//! `type_traits` do (for Q6_0 its AVX2 builds take Q8_2_X4, Q8_0's values with another scale
//! layout). ik has no reference kernel (only `iqk_mul_mat`, whose order depends on the batch
//! size), so the reference here is: each group summed in integers, times its integer scale,
//! summed over the block in integers (all exact), then `sum += (d_w * d_a) * sumi` in f32 per
//! block, in block order. The AVX2 and AVX-512 kernels compute the same integers and the same
//! float steps, so they equal it bit for bit.
//!
//! Verified by: `tests/iqk.rs` (dequantization of the fixture tensors equals ik_llama.cpp's
//! own to the bit; hand-built blocks; dot products against the f64 dot of the dequantized
//! values; SIMD against scalar).

use crate::common::*;
use crate::kquants::Q8_K_BYTES;
use crate::legacy::Q8_0_BYTES;
use crate::QK_K;

pub const Q6_0_BYTES: usize = 26;
pub const IQ2_K_BYTES: usize = 76;
pub const IQ3_K_BYTES: usize = 110;
pub const IQ4_K_BYTES: usize = 144;
pub const IQ5_K_BYTES: usize = 176;
pub const IQ6_K_BYTES: usize = 212;
pub const IQ2_KS_BYTES: usize = 70;
pub const IQ3_KS_BYTES: usize = 102;
pub const IQ4_KS_BYTES: usize = 136;
pub const IQ5_KS_BYTES: usize = 168;

/// `iq2nl_values`: two halves of 4; the upper is the lower + 5.
pub const IQ2NL: [i8; 8] = [-31, -13, 1, 17, -26, -8, 6, 22];

/// `iq3nl_values`: two halves of 8; the upper is the lower + 4.
pub const IQ3NL: [i8; 16] = [
    -63, -40, -23, -10, 1, 13, 28, 47, -59, -36, -19, -6, 5, 17, 32, 51,
];

/// `iq4k_values`: two halves of 16 (the lower is IQ4_NL's); the upper is the lower + 4.
pub const IQ4K: [i8; 32] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113, -123, -100, -79, -61,
    -45, -31, -18, -6, 5, 17, 29, 42, 57, 73, 93, 117,
];

/// `iq5nl_values`: two halves of 32; the upper is the lower + 2.
pub const IQ5NL: [i8; 64] = [
    -126, -114, -103, -92, -83, -74, -65, -57, -50, -43, -36, -30, -24, -18, -12, -6, -1, 5, 11,
    17, 23, 29, 36, 43, 51, 59, 68, 77, 87, 97, 109, 121, -124, -112, -101, -90, -81, -72, -63,
    -55, -48, -41, -34, -28, -22, -16, -10, -4, 1, 7, 13, 19, 25, 31, 38, 45, 53, 61, 70, 79, 89,
    99, 111, 123,
];

/// `iq6nl_values`: two halves of 64; the upper is the lower + 1.
pub const IQ6NL: [i8; 128] = [
    -127, -121, -115, -109, -104, -98, -93, -88, -84, -79, -74, -70, -66, -62, -58, -54, -51, -47,
    -44, -40, -37, -34, -31, -28, -25, -22, -19, -16, -13, -11, -8, -5, -2, 0, 3, 6, 9, 12, 14, 17,
    20, 23, 27, 30, 33, 36, 40, 44, 47, 51, 55, 59, 63, 68, 72, 77, 82, 87, 92, 98, 103, 109, 115,
    121, -126, -120, -114, -108, -103, -97, -92, -87, -83, -78, -73, -69, -65, -61, -57, -53, -50,
    -46, -43, -39, -36, -33, -30, -27, -24, -21, -18, -15, -12, -10, -7, -4, -1, 1, 4, 7, 10, 13,
    15, 18, 21, 24, 28, 31, 34, 37, 41, 45, 48, 52, 56, 60, 64, 69, 73, 78, 83, 88, 93, 99, 104,
    110, 116, 122,
];

/// IQ6_K's dequantization curve `A + q (B + q (-C + q D))` (`A_IQ6K` .. `D_IQ6K`).
const IQ6K_A: f32 = -127.0;
const IQ6K_B: f32 = 6.2568;
const IQ6K_C: f32 = 0.11218;
const IQ6K_D: f32 = 0.0011972;

/// Where a super-block type keeps its scale `d`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scale {
    /// An f16 at the start of every block.
    Block,
    /// An f16 before the row's blocks.
    RowF16,
    /// An f32 before the row's blocks.
    RowF32,
}

/// What the generic super-block code needs of one type: its layout and the three parts of a
/// block's decoding (the SIMD kernels decode scales and quants their own way, and must agree
/// with these: `tests/iqk.rs`).
pub(crate) struct Kind {
    pub bytes: usize,
    pub scale: Scale,
    /// Values per scaled group (16 or 32).
    pub group: usize,
    /// The code book, both halves.
    pub values: &'static [i8],
    /// The integer scale of every group (`256 / group` of them).
    pub scales: fn(&[u8], &mut [i32; 16]),
    /// Bit g set: group g reads the code book's upper half.
    pub halves: fn(&[u8]) -> u16,
    /// Every value's index into the lower half.
    pub quants: fn(&[u8], &mut [u8; QK_K]),
}

impl Kind {
    /// Bytes before the first block of a row.
    pub(crate) const fn row_prefix(&self) -> usize {
        match self.scale {
            Scale::Block => 0,
            Scale::RowF16 => 2,
            Scale::RowF32 => 4,
        }
    }

    /// The row's scale (0 for block-scaled types) and its blocks.
    #[inline(always)]
    pub(crate) fn split_row<'a>(&self, row: &'a [u8]) -> (f32, &'a [u8]) {
        match self.scale {
            Scale::Block => (0.0, row),
            Scale::RowF16 => (rd_f16(row, 0), &row[2..]),
            Scale::RowF32 => (rd_f32(row, 0), &row[4..]),
        }
    }

    /// The scale of block `x` of a row whose scale is `row_d`.
    #[inline(always)]
    pub(crate) fn block_d(&self, row_d: f32, x: &[u8]) -> f32 {
        if self.scale == Scale::Block {
            rd_f16(x, 0)
        } else {
            row_d
        }
    }

    /// Index of every value of block `x` into the whole code book, and the group scales.
    pub(crate) fn unpack(&self, x: &[u8], idx: &mut [u8; QK_K], sc: &mut [i32; 16]) {
        (self.quants)(x, idx);
        (self.scales)(x, sc);
        let halves = (self.halves)(x);
        let upper = (self.values.len() / 2) as u8;
        for (g, ig) in idx.chunks_exact_mut(self.group).enumerate() {
            if (halves >> g) & 1 == 1 {
                ig.iter_mut().for_each(|i| *i += upper);
            }
        }
    }
}

macro_rules! kind {
    ($name:ident, $bytes:expr, $scale:ident, $group:expr, $values:expr, $scales:ident, $halves:ident, $quants:ident) => {
        pub(crate) const $name: Kind = Kind {
            bytes: $bytes,
            scale: Scale::$scale,
            group: $group,
            values: &$values,
            scales: $scales,
            halves: $halves,
            quants: $quants,
        };
    };
}

kind!(
    IQ2_K,
    IQ2_K_BYTES,
    Block,
    16,
    IQ2NL,
    scales_iq2_k,
    extra_at_2,
    quants_iq2
);
kind!(
    IQ3_K,
    IQ3_K_BYTES,
    Block,
    16,
    IQ3NL,
    scales_iq3_k,
    extra_at_2,
    quants_iq3_k
);
kind!(
    IQ4_K,
    IQ4_K_BYTES,
    Block,
    16,
    IQ4K,
    scales_k6,
    extra_at_2,
    quants_iq4_k
);
kind!(
    IQ5_K,
    IQ5_K_BYTES,
    Block,
    16,
    IQ5NL,
    scales_k6,
    extra_at_2,
    quants_iq5_k
);
kind!(
    IQ6_K,
    IQ6_K_BYTES,
    Block,
    16,
    IQ6NL,
    scales_iq6_k,
    extra_at_2,
    quants_iq6_k
);
kind!(
    IQ2_KS,
    IQ2_KS_BYTES,
    RowF16,
    32,
    IQ2NL,
    scales_iq2_ks,
    extra_at_0,
    quants_iq2_ks
);
kind!(
    IQ3_KS,
    IQ3_KS_BYTES,
    RowF16,
    32,
    IQ3NL,
    scales_iq3_ks,
    extra_hi_at_0,
    quants_iq3_ks
);
kind!(
    IQ4_KS,
    IQ4_KS_BYTES,
    RowF32,
    32,
    IQ4K,
    scales_ks,
    halves_ks,
    quants_iq4_ks
);
kind!(
    IQ5_KS,
    IQ5_KS_BYTES,
    RowF32,
    32,
    IQ5NL,
    scales_ks,
    halves_ks,
    quants_iq5_ks
);

// ---------------------------------------------------------------------------------------------
// decoding, per part

/// `extra` at byte 2 (the `_K` types): bit g for group g.
#[inline]
pub(crate) fn extra_at_2(x: &[u8]) -> u16 {
    rd_u16(x, 2)
}

/// `extra` at byte 0, low byte (IQ2_KS).
#[inline]
pub(crate) fn extra_at_0(x: &[u8]) -> u16 {
    rd_u16(x, 0) & 0xff
}

/// `extra` at byte 0, high byte (IQ3_KS; its low byte tops the scales).
#[inline]
pub(crate) fn extra_hi_at_0(x: &[u8]) -> u16 {
    rd_u16(x, 0) >> 8
}

/// Bit 0 of each scale byte (IQ4_KS, IQ5_KS).
#[inline]
pub(crate) fn halves_ks(x: &[u8]) -> u16 {
    (0..8).fold(0, |h, s| h | (((x[s] & 1) as u16) << s))
}

/// IQ2_K: nibble `g % 2` of `scales[g/2]`, minus 8.
#[inline]
pub(crate) fn scales_iq2_k(x: &[u8], sc: &mut [i32; 16]) {
    for (g, s) in sc.iter_mut().enumerate() {
        *s = ((x[4 + g / 2] >> (4 * (g % 2))) & 0xf) as i32 - 8;
    }
}

/// IQ3_K: `2 s + 1` with s nibble `g % 2` of `scales_l[g/2]`, negated where bit g of
/// `scales_h` is set.
#[inline]
pub(crate) fn scales_iq3_k(x: &[u8], sc: &mut [i32; 16]) {
    let signs = rd_u16(x, 4);
    for (g, s) in sc.iter_mut().enumerate() {
        let v = 2 * ((x[6 + g / 2] >> (4 * (g % 2))) & 0xf) as i32 + 1;
        *s = if (signs >> g) & 1 == 1 { -v } else { v };
    }
}

/// IQ4_K / IQ5_K: a nibble of `scales_l[g/2]` with two bits of `scales_h[g/4]` on top, minus
/// 32.
#[inline]
pub(crate) fn scales_k6(x: &[u8], sc: &mut [i32; 16]) {
    for (g, s) in sc.iter_mut().enumerate() {
        let lo = (x[8 + g / 2] >> (4 * (g % 2))) & 0xf;
        let hi = (x[4 + g / 4] >> (2 * (g % 4))) & 3;
        *s = (lo | (hi << 4)) as i32 - 32;
    }
}

/// IQ6_K: one signed byte per group.
#[inline]
pub(crate) fn scales_iq6_k(x: &[u8], sc: &mut [i32; 16]) {
    for (g, s) in sc.iter_mut().enumerate() {
        *s = x[4 + g] as i8 as i32;
    }
}

/// IQ2_KS: nibble `s % 2` of `scales[s/2]` with bit `8 + s` of `extra` on top, minus 16.
#[inline]
pub(crate) fn scales_iq2_ks(x: &[u8], sc: &mut [i32; 16]) {
    let extra = rd_u16(x, 0);
    for (s, o) in sc[..8].iter_mut().enumerate() {
        let nib = (x[2 + s / 2] >> (4 * (s % 2))) & 0xf;
        *o = (nib | ((((extra >> (8 + s)) & 1) as u8) << 4)) as i32 - 16;
    }
}

/// IQ3_KS: nibble `s / 4` of `scales[s % 4]` with bit s of `extra` on top, minus 16.
#[inline]
pub(crate) fn scales_iq3_ks(x: &[u8], sc: &mut [i32; 16]) {
    let extra = rd_u16(x, 0);
    for (s, o) in sc[..8].iter_mut().enumerate() {
        let nib = (x[2 + s % 4] >> (4 * (s / 4))) & 0xf;
        *o = (nib | ((((extra >> s) & 1) as u8) << 4)) as i32 - 16;
    }
}

/// IQ4_KS / IQ5_KS: bits 1..7 of the scale byte, minus 127.
#[inline]
pub(crate) fn scales_ks(x: &[u8], sc: &mut [i32; 16]) {
    for (s, o) in sc[..8].iter_mut().enumerate() {
        *o = (x[s] & 254) as i32 - 127;
    }
}

/// IQ2_K: group g's quants are bit pair `(g/2) % 4` of `qs[32 (g/8) + 16 (g%2) + j]`.
fn quants_iq2(x: &[u8], idx: &mut [u8; QK_K]) {
    let qs = &x[12..76];
    for (g, o) in idx.chunks_exact_mut(16).enumerate() {
        let shift = 2 * ((g / 2) % 4);
        for (o, &b) in o.iter_mut().zip(&qs[32 * (g / 8) + 16 * (g % 2)..]) {
            *o = (b >> shift) & 3;
        }
    }
}

/// IQ3_K: as IQ2_K, with bit `g/2` of `qh[16 (g%2) + j]` as the third bit.
fn quants_iq3_k(x: &[u8], idx: &mut [u8; QK_K]) {
    let qs = &x[14..78];
    let qh = &x[78..110];
    for (g, o) in idx.chunks_exact_mut(16).enumerate() {
        let ib32 = g / 2;
        let shift = 2 * (ib32 % 4);
        let q = &qs[32 * (ib32 / 4) + 16 * (g % 2)..];
        let h = &qh[16 * (g % 2)..];
        for ((o, &b), &hb) in o.iter_mut().zip(q).zip(h) {
            *o = ((b >> shift) & 3) | (((hb >> ib32) & 1) << 2);
        }
    }
}

/// IQ4_K: 32-value block b holds group 2b in the low nibbles of `qs[16b..16b+16]`, group
/// 2b + 1 in their high nibbles.
fn quants_iq4_k(x: &[u8], idx: &mut [u8; QK_K]) {
    for (g, o) in idx.chunks_exact_mut(16).enumerate() {
        for (o, &b) in o.iter_mut().zip(&x[16 + 16 * (g / 2)..]) {
            *o = (b >> (4 * (g % 2))) & 0xf;
        }
    }
}

/// IQ5_K: in 64-value chunk c, group `4c + k` takes nibble `k/2` of `qs[32c + 16 (k%2) + j]`
/// and bit `2c + k/2` of `qh[16 (k%2) + j]`.
fn quants_iq5_k(x: &[u8], idx: &mut [u8; QK_K]) {
    let qs = &x[16..144];
    let qh = &x[144..176];
    for (g, o) in idx.chunks_exact_mut(16).enumerate() {
        let (c, k) = (g / 4, g % 4);
        let q = &qs[32 * c + 16 * (k % 2)..];
        let h = &qh[16 * (k % 2)..];
        let hs = 2 * c + k / 2;
        for ((o, &b), &hb) in o.iter_mut().zip(q).zip(h) {
            *o = ((b >> (4 * (k / 2))) & 0xf) | (((hb >> hs) & 1) << 4);
        }
    }
}

/// IQ6_K: as IQ5_K with two high bits, bits `4 (c%2) + 2 (k/2)` of
/// `qh[32 (c/2) + 16 (k%2) + j]`.
fn quants_iq6_k(x: &[u8], idx: &mut [u8; QK_K]) {
    let qs = &x[20..148];
    let qh = &x[148..212];
    for (g, o) in idx.chunks_exact_mut(16).enumerate() {
        let (c, k) = (g / 4, g % 4);
        let q = &qs[32 * c + 16 * (k % 2)..];
        let h = &qh[32 * (c / 2) + 16 * (k % 2)..];
        let hs = 4 * (c % 2) + 2 * (k / 2);
        for ((o, &b), &hb) in o.iter_mut().zip(q).zip(h) {
            *o = ((b >> (4 * (k / 2))) & 0xf) | (((hb >> hs) & 3) << 4);
        }
    }
}

/// IQ2_KS: group s (32 values) is bit pair `s % 4` of `qs[32 (s/4) + j]`.
fn quants_iq2_ks(x: &[u8], idx: &mut [u8; QK_K]) {
    let qs = &x[6..70];
    for (s, o) in idx.chunks_exact_mut(32).enumerate() {
        for (o, &b) in o.iter_mut().zip(&qs[32 * (s / 4)..]) {
            *o = (b >> (2 * (s % 4))) & 3;
        }
    }
}

/// IQ3_KS: as IQ2_KS, with bit s of `qh[j]` as the third bit.
fn quants_iq3_ks(x: &[u8], idx: &mut [u8; QK_K]) {
    let qs = &x[6..70];
    let qh = &x[70..102];
    for (s, o) in idx.chunks_exact_mut(32).enumerate() {
        let q = &qs[32 * (s / 4)..];
        for ((o, &b), &hb) in o.iter_mut().zip(q).zip(qh) {
            *o = ((b >> (2 * (s % 4))) & 3) | (((hb >> s) & 1) << 2);
        }
    }
}

/// IQ4_KS: group s is the low nibbles of `qs[16s..16s+16]`, then their high nibbles.
fn quants_iq4_ks(x: &[u8], idx: &mut [u8; QK_K]) {
    for (s, o) in idx.chunks_exact_mut(32).enumerate() {
        let (lo, hi) = o.split_at_mut(16);
        for ((l, h), &b) in lo.iter_mut().zip(hi).zip(&x[8 + 16 * s..]) {
            *l = b & 0xf;
            *h = b >> 4;
        }
    }
}

/// IQ5_KS: group s is nibble `s % 2` of `qs[32 (s/2) + j]` with bit s of `qh[j]` on top.
fn quants_iq5_ks(x: &[u8], idx: &mut [u8; QK_K]) {
    let qs = &x[8..136];
    let qh = &x[136..168];
    for (s, o) in idx.chunks_exact_mut(32).enumerate() {
        let q = &qs[32 * (s / 2)..];
        for ((o, &b), &hb) in o.iter_mut().zip(q).zip(qh) {
            *o = ((b >> (4 * (s % 2))) & 0xf) | (((hb >> s) & 1) << 4);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// generic super-block row functions

/// Dequantize a row of `dst.len()` values (a multiple of 256) of type `k`.
pub(crate) fn dequantize(k: &Kind, src: &[u8], dst: &mut [f32]) {
    let nb = dst.len() / QK_K;
    if nb == 0 {
        return;
    }
    let (row_d, blocks) = k.split_row(src);
    let (mut idx, mut sc) = ([0u8; QK_K], [0i32; 16]);
    for (x, y) in blocks[..nb * k.bytes]
        .chunks_exact(k.bytes)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let d = k.block_d(row_d, x);
        k.unpack(x, &mut idx, &mut sc);
        for ((yg, ig), &sc) in y
            .chunks_exact_mut(k.group)
            .zip(idx.chunks_exact(k.group))
            .zip(&sc)
        {
            let dl = d * sc as f32;
            for (o, &i) in yg.iter_mut().zip(ig) {
                *o = dl * k.values[i as usize] as f32;
            }
        }
    }
}

/// Dot product of `n` values: a row of type `k` with a Q8_K row.
pub(crate) fn dot_q8_k(k: &Kind, n: usize, w: &[u8], a: &[u8]) -> f32 {
    let nb = n / QK_K;
    if nb == 0 {
        return 0.0;
    }
    let (row_d, blocks) = k.split_row(w);
    let (mut idx, mut sc) = ([0u8; QK_K], [0i32; 16]);
    let mut sum = 0f32;
    for (x, y) in blocks[..nb * k.bytes]
        .chunks_exact(k.bytes)
        .zip(a[..nb * Q8_K_BYTES].chunks_exact(Q8_K_BYTES))
    {
        let d = k.block_d(row_d, x);
        k.unpack(x, &mut idx, &mut sc);
        let mut sumi = 0i32;
        for ((ig, qg), &sc) in idx
            .chunks_exact(k.group)
            .zip(y[4..4 + QK_K].chunks_exact(k.group))
            .zip(&sc)
        {
            let s: i32 = ig
                .iter()
                .zip(qg)
                .map(|(&i, &q)| k.values[i as usize] as i32 * q as i8 as i32)
                .sum();
            sumi += sc * s;
        }
        sum += (d * rd_f32(y, 0)) * sumi as f32;
    }
    sum
}

/// One row decoded for the int8 GEMM (`gemm::DecodeRowFn`): code values + 128 as unsigned
/// bytes, and `d * scale` per group.
pub(crate) fn gemm_decode(k: &Kind, row: &[u8], q: &mut [u8], scale: &mut [f32]) {
    let nb = q.len() / QK_K;
    if nb == 0 {
        return;
    }
    let (row_d, blocks) = k.split_row(row);
    let n_groups = QK_K / k.group;
    let (mut idx, mut sc) = ([0u8; QK_K], [0i32; 16]);
    for (b, x) in blocks[..nb * k.bytes].chunks_exact(k.bytes).enumerate() {
        let d = k.block_d(row_d, x);
        k.unpack(x, &mut idx, &mut sc);
        for (s, &sc) in scale[n_groups * b..n_groups * (b + 1)].iter_mut().zip(&sc) {
            *s = d * sc as f32;
        }
        for (o, &i) in q[QK_K * b..QK_K * (b + 1)].iter_mut().zip(&idx) {
            *o = (k.values[i as usize] as u8) ^ 0x80;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// per-type entry points

macro_rules! super_block_type {
    ($kind:ident, $deq:ident, $dot:ident, $gemm:ident) => {
        #[doc = concat!("Dequantize a ", stringify!($kind), " row (`dst.len()` a multiple of 256).")]
        pub fn $deq(src: &[u8], dst: &mut [f32]) {
            dequantize(&$kind, src, dst)
        }

        #[doc = concat!(stringify!($kind), " weights x Q8_K activations.")]
        pub fn $dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
            dot_q8_k(&$kind, n, w, a)
        }

        pub(crate) fn $gemm(row: &[u8], q: &mut [u8], scale: &mut [f32], _min: &mut [f32]) {
            gemm_decode(&$kind, row, q, scale)
        }
    };
}

super_block_type!(
    IQ2_K,
    dequantize_row_iq2_k,
    vec_dot_iq2_k_q8_k,
    gemm_decode_iq2_k
);
super_block_type!(
    IQ3_K,
    dequantize_row_iq3_k,
    vec_dot_iq3_k_q8_k,
    gemm_decode_iq3_k
);
super_block_type!(
    IQ4_K,
    dequantize_row_iq4_k,
    vec_dot_iq4_k_q8_k,
    gemm_decode_iq4_k
);
super_block_type!(
    IQ5_K,
    dequantize_row_iq5_k,
    vec_dot_iq5_k_q8_k,
    gemm_decode_iq5_k
);
super_block_type!(
    IQ2_KS,
    dequantize_row_iq2_ks,
    vec_dot_iq2_ks_q8_k,
    gemm_decode_iq2_ks
);
super_block_type!(
    IQ3_KS,
    dequantize_row_iq3_ks,
    vec_dot_iq3_ks_q8_k,
    gemm_decode_iq3_ks
);
super_block_type!(
    IQ4_KS,
    dequantize_row_iq4_ks,
    vec_dot_iq4_ks_q8_k,
    gemm_decode_iq4_ks
);
super_block_type!(
    IQ5_KS,
    dequantize_row_iq5_ks,
    vec_dot_iq5_ks_q8_k,
    gemm_decode_iq5_ks
);

/// IQ6_K x Q8_K (through the [`IQ6NL`] code book, as ik_llama.cpp's kernels do).
pub fn vec_dot_iq6_k_q8_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    dot_q8_k(&IQ6_K, n, w, a)
}

pub(crate) fn gemm_decode_iq6_k(row: &[u8], q: &mut [u8], scale: &mut [f32], _min: &mut [f32]) {
    gemm_decode(&IQ6_K, row, q, scale)
}

/// IQ6_K's value for index `q` (0..63) of the lower half: ik_llama.cpp's cubic, evaluated as
/// its x86 build does (GCC contracts the Horner steps into fused multiply-adds).
#[inline(always)]
fn iq6k_curve(q: f32) -> f32 {
    q.mul_add(q.mul_add(q.mul_add(IQ6K_D, -IQ6K_C), IQ6K_B), IQ6K_A)
}

/// Dequantize an IQ6_K row (`dst.len()` a multiple of 256): `(d * scale) * (curve(q) + half)`.
pub fn dequantize_row_iq6_k(src: &[u8], dst: &mut [f32]) {
    let nb = dst.len() / QK_K;
    let (mut idx, mut sc) = ([0u8; QK_K], [0i32; 16]);
    for (x, y) in src[..nb * IQ6_K_BYTES]
        .chunks_exact(IQ6_K_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let d = rd_f16(x, 0);
        IQ6_K.unpack(x, &mut idx, &mut sc);
        for ((yg, ig), &sc) in y.chunks_exact_mut(16).zip(idx.chunks_exact(16)).zip(&sc) {
            let dl = d * sc as f32;
            for (o, &i) in yg.iter_mut().zip(ig) {
                let m = (i >> 6) as f32;
                *o = dl * (iq6k_curve((i & 63) as f32) + m);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Q6_0

/// The 32 six-bit quants of a Q6_0 block (value `q - 32`): element j < 16 is the low nibble of
/// `qs[j]` with bits `4 (j/8)` .. of `qh[j % 8]` on top, element j + 16 the high nibble with
/// the next two bits.
#[inline]
pub(crate) fn q6_0_quants(x: &[u8]) -> [u8; 32] {
    let qh = &x[2..10];
    let qs = &x[10..26];
    let mut q = [0u8; 32];
    for j in 0..16 {
        let h = qh[j % 8] >> (4 * (j / 8));
        q[j] = (qs[j] & 0xf) | ((h & 3) << 4);
        q[j + 16] = (qs[j] >> 4) | (((h >> 2) & 3) << 4);
    }
    q
}

/// Dequantize a Q6_0 row (`dst.len()` a multiple of 32).
pub fn dequantize_row_q6_0(src: &[u8], dst: &mut [f32]) {
    let nb = dst.len() / 32;
    for (x, y) in src[..nb * Q6_0_BYTES]
        .chunks_exact(Q6_0_BYTES)
        .zip(dst.chunks_exact_mut(32))
    {
        let d = rd_f16(x, 0);
        for (o, q) in y.iter_mut().zip(q6_0_quants(x)) {
            *o = (q as i32 - 32) as f32 * d;
        }
    }
}

/// Q6_0 weights x Q8_0 activations.
pub fn vec_dot_q6_0_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let nb = n / 32;
    let mut sum = 0f32;
    for (x, y) in w[..nb * Q6_0_BYTES]
        .chunks_exact(Q6_0_BYTES)
        .zip(a[..nb * Q8_0_BYTES].chunks_exact(Q8_0_BYTES))
    {
        let sumi: i32 = q6_0_quants(x)
            .iter()
            .zip(&y[2..34])
            .map(|(&q, &v)| (q as i32 - 32) * v as i8 as i32)
            .sum();
        sum += (rd_f16(x, 0) * rd_f16(y, 0)) * sumi as f32;
    }
    sum
}

/// A Q6_0 row for the int8 GEMM: quants 0..63 (the layout's offset is 32), scale `d`.
pub(crate) fn gemm_decode_q6_0(row: &[u8], q: &mut [u8], scale: &mut [f32], _min: &mut [f32]) {
    for (b, x) in row.chunks_exact(Q6_0_BYTES).enumerate() {
        scale[b] = rd_f16(x, 0);
        q[32 * b..32 * (b + 1)].copy_from_slice(&q6_0_quants(x));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The halves of every code book differ by one constant: the `extra` bit adds it.
    #[test]
    fn code_book_halves_are_shifted_copies() {
        for (values, shift) in [
            (&IQ2NL[..], 5),
            (&IQ3NL[..], 4),
            (&IQ4K[..], 4),
            (&IQ5NL[..], 2),
            (&IQ6NL[..], 1),
        ] {
            let (lo, hi) = values.split_at(values.len() / 2);
            for (a, b) in lo.iter().zip(hi) {
                assert_eq!(*b as i32 - *a as i32, shift);
            }
        }
    }

    /// IQ6_K's cubic, rounded, is its code book: dequantized values and dot products agree to
    /// within the curve's rounding.
    #[test]
    fn iq6k_curve_rounds_to_the_code_book() {
        for q in 0..64 {
            let v = iq6k_curve(q as f32);
            assert_eq!(v.round() as i32, IQ6NL[q] as i32, "q {q}: {v}");
            assert!((v - IQ6NL[q] as f32).abs() < 0.5);
        }
    }
}
