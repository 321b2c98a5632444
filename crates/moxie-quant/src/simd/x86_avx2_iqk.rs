//! AVX2 (+ FMA, F16C) dot products of ik_llama.cpp's types (`iqk.rs`): IQ2_K .. IQ6_K,
//! IQ2_KS .. IQ5_KS (x Q8_K) and Q6_0 (x Q8_0); and the decoding of their group scales into
//! i16 lanes, which the AVX-512 kernels (`x86_avx512_iqk.rs`) share.
//!
//! A super-block is eight 32-value blocks. In every layout a block's code-book indices are one
//! 32-byte load of the quants (and one of the high bits) shifted by the same count in every
//! byte, in value order: each 128-bit lane holds one 16-value group, or half of a 32-value
//! group. They are looked up with `vpshufb` in the lower half of the code book (16-entry parts
//! blended by the index's top bits where the half is longer) and the upper half's constant is
//! added in the lanes whose group has its half bit set (to the table itself where the half is
//! one part). The products with the activations go through the sign trick (|w| as unsigned
//! times `a` with w's sign: exact, as every code-book value lies in -127..127 and Q8_K and Q8_0
//! activations in -127..127, so a pair of products is at most 2 * 127 * 127 < 2^15),
//! `vpmaddubsw` to pairs and `vpmaddwd` with the group scales (|scale| <= 128: a lane is at
//! most 2^23; a block's sum at most 2^29). The block's integer sum is then exactly the scalar
//! reference's, and the float steps are the reference's too (`sum += (d_w * d_a) * sumi` per
//! block), so the result is bit-identical to it.
//!
//! Verified by: `tests/iqk.rs` (property tests against the scalar reference, bit for bit).
//!
//! Every `unsafe` block is a call of a `#[target_feature]` kernel after run-time detection;
//! loads go through the bounds-checked helpers of `x86_avx2.rs`.

use core::arch::x86_64::*;

use super::x86_avx2::{bytes_from_nibbles_32, h2f, ld128, ld256, mul_add_epi8};
use crate::common::rd_f32;
use crate::iqk::{self, Kind};
use crate::kquants::Q8_K_BYTES;
use crate::legacy::Q8_0_BYTES;

// The entry points `dot_iq2_k` .. `dot_iq5_ks`, `dot_q6_0` (`VecDotFn`s, at the AVX2 level).
iqk_dot_entries!();

// ---------------------------------------------------------------------------------------------
// group scales as i16 lanes (16, or 8 for the `_KS` types), as `iqk::scales_*` compute them

/// The 16 nibbles of the 8 bytes at `off`, low nibble first, as i16 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn nibbles16(x: &[u8], off: usize) -> __m256i {
    let b = _mm_cvtsi64_si128(i64::from_le_bytes(x[off..off + 8].try_into().unwrap()));
    let m4 = _mm_set1_epi8(0xf);
    let lo = _mm_and_si128(b, m4);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(b), m4);
    _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(lo, hi))
}

/// The 8 nibbles of the 4 bytes at `off` as i16 lanes 0..7: interleaved (low nibble of byte
/// 0, its high nibble, ...) or all low nibbles first.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn nibbles8(x: &[u8], off: usize, interleaved: bool) -> __m256i {
    let b = _mm_cvtsi32_si128(i32::from_le_bytes(x[off..off + 4].try_into().unwrap()));
    let m4 = _mm_set1_epi8(0xf);
    let lo = _mm_and_si128(b, m4);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(b), m4);
    let n = if interleaved {
        _mm_unpacklo_epi8(lo, hi)
    } else {
        _mm_unpacklo_epi32(lo, hi)
    };
    _mm256_cvtepu8_epi16(n)
}

/// All ones in i16 lane g where bit g of `bits` is set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bit_lanes(bits: u16) -> __m256i {
    let each = _mm256_setr_epi16(
        1,
        2,
        4,
        8,
        16,
        32,
        64,
        128,
        256,
        512,
        1024,
        2048,
        4096,
        8192,
        16384,
        i16::MIN,
    );
    _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16(bits as i16), each), each)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn scales_iq2_k(x: &[u8]) -> __m256i {
    _mm256_sub_epi16(nibbles16(x, 4), _mm256_set1_epi16(8))
}

/// IQ3_K's scales before their signs: `2 s + 1`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn scales_iq3_k_abs(x: &[u8]) -> __m256i {
    let n = nibbles16(x, 6);
    _mm256_add_epi16(_mm256_add_epi16(n, n), _mm256_set1_epi16(1))
}

/// Bit g of `scales_h`: group g's scale is negative.
#[inline(always)]
pub(super) fn scales_iq3_k_signs(x: &[u8]) -> u16 {
    u16::from_le_bytes([x[4], x[5]])
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scales_iq3_k(x: &[u8]) -> __m256i {
    // `(v ^ -1) + 1` where negative.
    let neg = bit_lanes(scales_iq3_k_signs(x));
    let v = scales_iq3_k_abs(x);
    _mm256_sub_epi16(_mm256_xor_si256(v, neg), neg)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn scales_k6(x: &[u8]) -> __m256i {
    // Group g's top bits are bits 2 (g%4), 2 (g%4) + 1 of scales_h[g/4]: that byte in i16
    // lane g, times 2^(6 - 2 (g%4)) (at most 255 * 64: no overflow) puts them at bits 6, 7.
    let h = _mm_cvtsi32_si128(i32::from_le_bytes(x[4..8].try_into().unwrap()));
    let spread = _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    let h = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(h, spread));
    let mul = _mm256_setr_epi16(64, 16, 4, 1, 64, 16, 4, 1, 64, 16, 4, 1, 64, 16, 4, 1);
    let top = _mm256_and_si256(
        _mm256_srli_epi16::<2>(_mm256_mullo_epi16(h, mul)),
        _mm256_set1_epi16(0x30),
    );
    _mm256_sub_epi16(_mm256_or_si256(nibbles16(x, 8), top), _mm256_set1_epi16(32))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn scales_iq6_k(x: &[u8]) -> __m256i {
    _mm256_cvtepi8_epi16(ld128(x, 4))
}

/// `nibbles + 16 (fifth bit) - 16` of the `_KS` types with 4-bit scales.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scales_5bit(nibbles: __m256i, top: u8) -> __m256i {
    let fifth = _mm256_and_si256(bit_lanes(top as u16), _mm256_set1_epi16(16));
    _mm256_sub_epi16(_mm256_or_si256(nibbles, fifth), _mm256_set1_epi16(16))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn scales_iq2_ks(x: &[u8]) -> __m256i {
    // bits 8.. of extra: each group's fifth scale bit
    scales_5bit(nibbles8(x, 2, true), x[1])
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn scales_iq3_ks(x: &[u8]) -> __m256i {
    // bits 0..8 of extra: each group's fifth scale bit
    scales_5bit(nibbles8(x, 2, false), x[0])
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn scales_ks(x: &[u8]) -> __m256i {
    let b = _mm_cvtsi64_si128(i64::from_le_bytes(x[..8].try_into().unwrap()));
    let v = _mm256_cvtepu8_epi16(_mm_and_si128(b, _mm_set1_epi8(-2)));
    _mm256_sub_epi16(v, _mm256_set1_epi16(127))
}

// ---------------------------------------------------------------------------------------------
// super-block kernels

/// For each 32-value block b, the `vpshufb` control that broadcasts its groups' scales over the
/// i16 lanes of its 128-bit lanes, from the scales' low 8 (blocks 0..3 of a 16-group type, or
/// any block of an 8-group one) or high 8 (blocks 4..7 of a 16-group type) copied to both
/// 128-bit lanes: group `2b + L` (16-value groups) or b (32-value groups) in lane L. Evaluated
/// at compile time (`const` blocks in the kernels).
const fn scale_shuffles(group: usize) -> [[u8; 32]; 8] {
    let mut ctl = [[0u8; 32]; 8];
    let mut b = 0;
    while b < 8 {
        let mut i = 0;
        while i < 32 {
            let g = if group == 16 { (2 * b + i / 16) % 8 } else { b };
            ctl[b][i] = (2 * g + i % 2) as u8;
            i += 1;
        }
        b += 1;
    }
    ctl
}

/// The half bits of block b as an index into [`Books::shift`]: bit L set where the group in
/// 128-bit lane L reads the upper half.
#[inline(always)]
fn block_halves(halves: u16, group: usize, b: usize) -> usize {
    if group == 16 {
        ((halves >> (2 * b)) & 3) as usize
    } else {
        3 * ((halves >> b) & 1) as usize
    }
}

/// A code book's lower half in 16-entry parts (1, 2 or 4), each a `vpshufb` table in both
/// 128-bit lanes, and the upper half's shift in the lanes of each half-bit pattern (of
/// [`block_halves`]). A one-part book also has its table per pattern with the shift added,
/// which saves the add per lookup; for longer books the 2 or 4 table loads cost more than it
/// (IQ6_K: 5% slower).
struct Books {
    t: [__m256i; 4],
    parts: usize,
    shift: [__m256i; 4],
    shifted: [__m256i; 4],
}

impl Books {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn new(values: &'static [i8]) -> Books {
        let half = values.len() / 2;
        let parts = half.div_ceil(16);
        debug_assert!(matches!(parts, 1 | 2 | 4));
        let mut t = [_mm256_setzero_si256(); 4];
        for (p, tp) in t.iter_mut().enumerate().take(parts) {
            let mut b = [0u8; 16];
            for (o, &v) in b.iter_mut().zip(&values[16 * p..half]) {
                *o = v as u8;
            }
            *tp = _mm256_broadcastsi128_si256(ld128(&b, 0));
        }
        let s = values[half] - values[0];
        let shift = [0, 1, 2, 3].map(|bits: i32| {
            let lane = |l: i32| if (bits >> l) & 1 == 1 { s } else { 0 };
            _mm256_set_m128i(_mm_set1_epi8(lane(1)), _mm_set1_epi8(lane(0)))
        });
        let shifted = shift.map(|sh| _mm256_add_epi8(t[0], sh));
        Books {
            t,
            parts,
            shift,
            shifted,
        }
    }

    /// The values of lower-half indices `idx` (bytes below 64), moved to the upper half in the
    /// 128-bit lanes that `halves` (of [`block_halves`]) names. `vpshufb` reads an index's low
    /// 4 bits; `vpblendvb` reads bit 7, where bit 4 (or 5) of the index is shifted.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn lookup(&self, idx: __m256i, halves: usize) -> __m256i {
        let sh = |p: usize| _mm256_shuffle_epi8(self.t[p], idx);
        let v = match self.parts {
            1 => return _mm256_shuffle_epi8(self.shifted[halves], idx),
            2 => _mm256_blendv_epi8(sh(0), sh(1), _mm256_slli_epi16::<3>(idx)),
            _ => {
                let bit4 = _mm256_slli_epi16::<3>(idx);
                _mm256_blendv_epi8(
                    _mm256_blendv_epi8(sh(0), sh(1), bit4),
                    _mm256_blendv_epi8(sh(2), sh(3), bit4),
                    _mm256_slli_epi16::<2>(idx),
                )
            }
        };
        _mm256_add_epi8(v, self.shift[halves])
    }
}

/// `(ld256(s, off) >> shift) & mask` per byte (`shift + bits of mask <= 8`: the 16-bit shift
/// brings in zeros or the next byte's bits, which the mask drops).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bits(s: &[u8], off: usize, shift: usize, mask: i8) -> __m256i {
    let v = _mm256_srl_epi16(ld256(s, off), _mm_cvtsi32_si128(shift as i32));
    _mm256_and_si256(v, _mm256_set1_epi8(mask))
}

/// The quants `qs` (`qs_len` bytes) and high bits `qh` (`qh_len` bytes) of block `x`: in every
/// layout (`iqk.rs`) they end the block, in this order, after its scales (so the `_K` and `_KS`
/// variants of a bit width differ only in where they start).
#[inline(always)]
pub(super) fn quant_fields(x: &[u8], qs_len: usize, qh_len: usize) -> (&[u8], &[u8]) {
    let (head, qh) = x.split_at(x.len() - qh_len);
    (&head[head.len() - qs_len..], qh)
}

// Block b's lower-half indices of each layout, from the super-block `x` (the `_K` and `_KS`
// variants of a bit width share their bit-field layout).

/// Bit pair `b % 4` of `qs[32 (b/4) ..+32]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn pairs(qs: &[u8], b: usize) -> __m256i {
    bits(qs, 32 * (b / 4), 2 * (b % 4), 3)
}

/// [`pairs`] of `qs[..64]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn idx_2bit(x: &[u8], b: usize) -> __m256i {
    pairs(quant_fields(x, 64, 0).0, b)
}

/// As `idx_2bit`, with bit b of `qh[..32]` as the third bit.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn idx_3bit(x: &[u8], b: usize) -> __m256i {
    let (qs, qh) = quant_fields(x, 64, 32);
    _mm256_or_si256(pairs(qs, b), _mm256_slli_epi16::<2>(bits(qh, 0, b, 1)))
}

/// The low nibbles of `qs[16b..+16]`, then their high nibbles (`qs[..128]`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn idx_4bit(x: &[u8], b: usize) -> __m256i {
    bytes_from_nibbles_32(quant_fields(x, 128, 0).0, 16 * b)
}

/// Nibble `b % 2` of `qs[32 (b/2) ..+32]` with bit b of `qh[..32]` on top.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn idx_5bit(x: &[u8], b: usize) -> __m256i {
    let (qs, qh) = quant_fields(x, 128, 32);
    let lo = bits(qs, 32 * (b / 2), 4 * (b % 2), 0xf);
    _mm256_or_si256(lo, _mm256_slli_epi16::<4>(bits(qh, 0, b, 1)))
}

/// Nibble `b % 2` of `qs[32 (b/2) ..+32]` with bit pair `b % 4` of `qh[32 (b/4) ..+32]` on
/// top (`qh[..64]`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn idx_6bit(x: &[u8], b: usize) -> __m256i {
    let (qs, qh) = quant_fields(x, 128, 64);
    let lo = bits(qs, 32 * (b / 2), 4 * (b % 2), 0xf);
    let hi = bits(qh, 32 * (b / 4), 2 * (b % 4), 3);
    _mm256_or_si256(lo, _mm256_slli_epi16::<4>(hi))
}

/// Sum of the 8 i32 lanes (wrapping, like the scalar reference's i32 sums).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum_i32_8(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<1>(s)))
}

/// One super-block kernel: `$idx(x, b)` gives block b's lower-half indices.
macro_rules! super_block_kernel {
    ($imp:ident, $kind:path, $idx:ident, $scales:ident) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        fn $imp(w: &[u8], a: &[u8]) -> f32 {
            let k: &Kind = &$kind;
            let books = Books::new(k.values);
            let mut shuffles = [_mm256_setzero_si256(); 8];
            for (s, ctl) in shuffles
                .iter_mut()
                .zip(&const { scale_shuffles($kind.group) })
            {
                *s = ld256(ctl, 0);
            }
            let (row_d, blocks) = k.split_row(w);
            let mut sum = 0f32;
            for (x, y) in blocks.chunks_exact(k.bytes).zip(a.chunks_exact(Q8_K_BYTES)) {
                let d = k.block_d(row_d, x);
                let sc = $scales(x);
                let sc_lo = _mm256_permute2x128_si256::<0x00>(sc, sc);
                let sc_hi = _mm256_permute2x128_si256::<0x11>(sc, sc);
                let halves = (k.halves)(x);
                let mut acc = _mm256_setzero_si256();
                for b in 0..8 {
                    let v = books.lookup($idx(x, b), block_halves(halves, k.group, b));
                    let src = if k.group == 16 && b >= 4 {
                        sc_hi
                    } else {
                        sc_lo
                    };
                    let s = _mm256_shuffle_epi8(src, shuffles[b]);
                    let p = mul_add_epi8(v, ld256(y, 4 + 32 * b));
                    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, s));
                }
                sum += (d * rd_f32(y, 0)) * hsum_i32_8(acc) as f32;
            }
            sum
        }
    };
}

super_block_kernel!(dot_iq2_k_imp, iqk::IQ2_K, idx_2bit, scales_iq2_k);
super_block_kernel!(dot_iq3_k_imp, iqk::IQ3_K, idx_3bit, scales_iq3_k);
super_block_kernel!(dot_iq4_k_imp, iqk::IQ4_K, idx_4bit, scales_k6);
super_block_kernel!(dot_iq5_k_imp, iqk::IQ5_K, idx_5bit, scales_k6);
super_block_kernel!(dot_iq6_k_imp, iqk::IQ6_K, idx_6bit, scales_iq6_k);
super_block_kernel!(dot_iq2_ks_imp, iqk::IQ2_KS, idx_2bit, scales_iq2_ks);
super_block_kernel!(dot_iq3_ks_imp, iqk::IQ3_KS, idx_3bit, scales_iq3_ks);
super_block_kernel!(dot_iq4_ks_imp, iqk::IQ4_KS, idx_4bit, scales_ks);
super_block_kernel!(dot_iq5_ks_imp, iqk::IQ5_KS, idx_5bit, scales_ks);

/// The 32 six-bit quants (0..63) of Q6_0 block `x`: low nibbles, then high; two bits of
/// `qh[e % 8]` on top, at bit `4 ((e%16)/8) + 2 (e/16)` for value e.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q6_0_quants(x: &[u8]) -> __m256i {
    let m4 = _mm_set1_epi8(0xf);
    // 64-bit lanes (8 values each) 0: values 0-7, 1: 8-15, 2: 16-23, 3: 24-31 (the shift keeps
    // each byte's own bits: at most 6 + 2 bits, the rest masked off).
    let shifts = _mm256_setr_epi64x(0, 4, 2, 6);
    let qs = ld128(x, 10);
    let nib = _mm256_set_m128i(
        _mm_and_si128(_mm_srli_epi16::<4>(qs), m4),
        _mm_and_si128(qs, m4),
    );
    let qh = i64::from_le_bytes(x[2..10].try_into().unwrap());
    let h = _mm256_and_si256(
        _mm256_srlv_epi64(_mm256_set1_epi64x(qh), shifts),
        _mm256_set1_epi8(3),
    );
    _mm256_or_si256(nib, _mm256_slli_epi16::<4>(h))
}

/// Q6_0: per block [`q6_0_quants`] q, `sum (q - 32) a` as `vpmaddubsw` of q minus that of 32
/// (each pair at most 2 * 63 * 127 in magnitude, their difference at most 2 * 32 * 127: exact
/// in i16).
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q6_0_imp(w: &[u8], a: &[u8]) -> f32 {
    let k32 = _mm256_set1_epi8(32);
    let ones = _mm256_set1_epi16(1);
    let mut sum = 0f32;
    for (x, y) in w
        .chunks_exact(iqk::Q6_0_BYTES)
        .zip(a.chunks_exact(Q8_0_BYTES))
    {
        let q = q6_0_quants(x);
        let qy = ld256(y, 2);
        let p = _mm256_sub_epi16(_mm256_maddubs_epi16(q, qy), _mm256_maddubs_epi16(k32, qy));
        let sumi = hsum_i32_8(_mm256_madd_epi16(p, ones));
        sum += (h2f(x, 0) * h2f(y, 0)) * sumi as f32;
    }
    sum
}
