//! AVX2 kernels of [`super::gemv`], for CPUs without AVX-512 VNNI (AMD Zen 2/3, Intel before
//! Ice Lake). A 64-byte word of a group (the same four bytes of 16 rows) is two 256-bit halves:
//! rows 0..8 and 8..16. Without `vpdpbusd`, four unsigned-by-signed byte products are summed
//! by `vpmaddubsw` (pairs, into i16) and `vpmaddwd` with ones (pairs of pairs, into i32), so
//! that lane `r` of a half again holds row `r`'s sum. The i16 step saturates above 32767: the
//! unsigned operand is a code of at most 6 bits here (Q8_0 multiplies |w| by y with w's sign,
//! as ggml's AVX2 kernels do), so two products stay below 2·63·128 and nothing saturates.
//! Integer sums are exact and the float steps are the portable kernels' per row, so results
//! equal them bit for bit.

use core::arch::x86_64::*;

use super::{
    Q4K_GROUP_BLOCK, Q4_0_GROUP_BLOCK, Q5K_GROUP_BLOCK, Q5_0_GROUP_BLOCK, Q6K_GROUP_BLOCK,
    Q8K_BLOCK, Q8_0_GROUP_BLOCK, REPACK_ROWS, SPREAD,
};
use crate::common::{rd_f16, rd_f32, rd_i16, rd_u32};
use crate::prefetch::prefetch_ahead;
use crate::simd::x86_avx2::{ld256, ld_f16x8, mul_add_epi8};

/// Rows per half of a 16-row word.
const HALF: usize = REPACK_ROWS / 2;

/// The little-endian word at `off` of `s` in every 32-bit lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bcast(s: &[u8], off: usize) -> __m256i {
    _mm256_set1_epi32(rd_u32(s, off) as i32)
}

/// Per 32-bit lane, the sum of the four products of unsigned bytes `u` and signed bytes `s`
/// (`vpdpbusd` without the accumulator; the byte pairs' sums must fit in i16).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot4(u: __m256i, s: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
}

/// Stores the two halves' 8 results each into `out`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn store(out: &mut [f32; REPACK_ROWS], v: [__m256; 2]) {
    for (h, v) in v.into_iter().enumerate() {
        // SAFETY: `out` holds 16 f32; `8 * h + 8 <= 16`; `storeu` has no alignment requirement.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(HALF * h), v) };
    }
}

/// The fifth bits of one chunk (bit `B` of each byte of `h`) at bit 4.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bit_at_4<const B: i32>(h: __m256i) -> __m256i {
    // 16-bit shifts by at most 4: bit 4 of each byte comes from its own byte.
    let moved = if B <= 4 {
        _mm256_sll_epi16(h, _mm_cvtsi32_si128(4 - B))
    } else {
        _mm256_srl_epi16(h, _mm_cvtsi32_si128(B - 4))
    };
    _mm256_and_si256(moved, _mm256_set1_epi8(0x10))
}

/// Per 32-bit lane of `v`, its bytes `a` and `b` zero-extended into the lane's two i16
/// halves (`vpmaddwd`'s operand: `b` multiplies the odd i16 of the other operand).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn byte_pair(v: __m256i, a: i32, b: i32) -> __m256i {
    let c = |p: i32| (4 * p + a) | 0x80 << 8 | (4 * p + b) << 16 | (0x80 << 24);
    _mm256_shuffle_epi8(
        v,
        _mm256_setr_epi32(c(0), c(1), c(2), c(3), c(0), c(1), c(2), c(3)),
    )
}

/// ggml's scale and min words (its `utmp`) of half `h` (rows 8h..8h+8) of a Q4_K/Q5_K group
/// block `o`, a row per lane: `[scales 0..3, scales 4..7]` and `[mins 0..3, mins 4..7]`, a
/// 6-bit value per byte.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn q4_k_scale_words(o: &[u8], h: usize) -> ([__m256i; 2], [__m256i; 2]) {
    let (m1, m2, m3) = (
        _mm256_set1_epi32(0x3f3f_3f3f),
        _mm256_set1_epi32(0x0f0f_0f0f),
        _mm256_set1_epi32(0x0303_0303),
    );
    let half = 32 * h;
    let (u0, u1, u2) = (
        ld256(o, 64 + half),
        ld256(o, 128 + half),
        ld256(o, 192 + half),
    );
    let high = |u: __m256i| _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(u), m3));
    let sc = [
        _mm256_and_si256(u0, m1),
        _mm256_or_si256(_mm256_and_si256(u2, m2), high(u0)),
    ];
    let mn = [
        _mm256_and_si256(u1, m1),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32::<4>(u2), m2), high(u1)),
    ];
    (sc, mn)
}

/// [`super::gemv`] for Q4_K (`Q5`: Q5_K); `group` and `act` hold the same number of
/// super-blocks.
///
/// ggml's AVX2 form: a sub-block's `vpmaddubsw` pairs are summed in i16 and widened once, by
/// `vpmaddwd` with the row's 6-bit scale in both halves of its lane, so that no product is
/// widened by ones and no integer is multiplied per lane (`vpmulld`). The pairs of 4-bit codes
/// stay within 2·15·128, 8 of them below 32768; 5-bit codes within 2·31·128, 4 of them. The
/// mins meet the activation sums the same way, two sub-blocks per `vpmaddwd`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn gemv_q4_k_r16<const Q5: bool>(
    group: &[u8],
    act: &[u8],
    out: &mut [f32; REPACK_ROWS],
) {
    let group_block = if Q5 { Q5K_GROUP_BLOCK } else { Q4K_GROUP_BLOCK };
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut acc_m = [_mm256_setzero_ps(); 2];
    for (o, y) in group
        .chunks_exact(group_block)
        .zip(act.chunks_exact(Q8K_BLOCK))
    {
        prefetch_ahead(o);
        let yd = _mm256_set1_ps(rd_f32(y, 0));
        // Sub-blocks 2j and 2j + 1's activation sums (|sum| <= 32·128, an i16 each) as one
        // word: the pair `vpmaddwd` meets with the two mins.
        let bsum = |s: usize| rd_i16(y, 260 + 4 * s) as i32 + rd_i16(y, 262 + 4 * s) as i32;
        let pairs: [__m256i; 4] = core::array::from_fn(|j| {
            _mm256_set1_epi32((bsum(2 * j) & 0xFFFF) | bsum(2 * j + 1) << 16)
        });
        let mut sc = [[_mm256_setzero_si256(); 2]; 2];
        for (h, sc) in sc.iter_mut().enumerate() {
            let mn;
            (*sc, mn) = q4_k_scale_words(o, h);
            let mut summ = _mm256_setzero_si256();
            for (j, &pair) in pairs.iter().enumerate() {
                let s0 = (2 * j % 4) as i32;
                let m = byte_pair(mn[j / 2], s0, s0 + 1);
                summ = _mm256_add_epi32(summ, _mm256_madd_epi16(m, pair));
            }
            let dmin = _mm256_mul_ps(ld_f16x8(o, 32 + 16 * h), yd);
            acc_m[h] = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(summ), acc_m[h]);
        }
        let mut sumi = [_mm256_setzero_si256(); 2];
        q4_k_chunk::<Q5, 0>(o, y, &sc, &mut sumi);
        q4_k_chunk::<Q5, 1>(o, y, &sc, &mut sumi);
        q4_k_chunk::<Q5, 2>(o, y, &sc, &mut sumi);
        q4_k_chunk::<Q5, 3>(o, y, &sc, &mut sumi);
        for h in 0..2 {
            let d = _mm256_mul_ps(ld_f16x8(o, 16 * h), yd);
            acc[h] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi[h]), acc[h]);
        }
    }
    store(out, [0, 1].map(|h| _mm256_sub_ps(acc[h], acc_m[h])));
}

/// Chunk `J` of a Q4_K (`Q5`: Q5_K) super-block of group block `o` (64 elements of every
/// row: sub-blocks 2J and 2J + 1) against Q8_K block `y`, added to `sumi` (per half) with the
/// scales `sc` (per half, ggml's two scale words).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q4_k_chunk<const Q5: bool, const J: usize>(
    o: &[u8],
    y: &[u8],
    sc: &[[__m256i; 2]; 2],
    sumi: &mut [__m256i; 2],
) {
    let (qs, depth) = if Q5 { (768, 4) } else { (256, 8) };
    let m4 = _mm256_set1_epi8(0xF);
    let s0 = (2 * J % 4) as i32;
    for g0 in (0..8).step_by(depth) {
        let mut lo = [_mm256_setzero_si256(); 2];
        let mut hi = [_mm256_setzero_si256(); 2];
        for g in g0..g0 + depth {
            let ya = bcast(y, 4 + 64 * J + 4 * g);
            let yb = bcast(y, 4 + 64 * J + 32 + 4 * g);
            for h in 0..2 {
                let half = 32 * h;
                let q = ld256(o, qs + (J * 8 + g) * 64 + half);
                let mut ql = _mm256_and_si256(q, m4);
                let mut qh = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
                if Q5 {
                    let bits = ld256(o, 256 + 64 * g + half);
                    let (h0, h1) = match J {
                        0 => (bit_at_4::<0>(bits), bit_at_4::<1>(bits)),
                        1 => (bit_at_4::<2>(bits), bit_at_4::<3>(bits)),
                        2 => (bit_at_4::<4>(bits), bit_at_4::<5>(bits)),
                        _ => (bit_at_4::<6>(bits), bit_at_4::<7>(bits)),
                    };
                    ql = _mm256_or_si256(ql, h0);
                    qh = _mm256_or_si256(qh, h1);
                }
                lo[h] = _mm256_add_epi16(lo[h], _mm256_maddubs_epi16(ql, ya));
                hi[h] = _mm256_add_epi16(hi[h], _mm256_maddubs_epi16(qh, yb));
            }
        }
        for h in 0..2 {
            let scales = sc[h][J / 2];
            let (a, b) = (byte_pair(scales, s0, s0), byte_pair(scales, s0 + 1, s0 + 1));
            sumi[h] = _mm256_add_epi32(sumi[h], _mm256_madd_epi16(lo[h], a));
            sumi[h] = _mm256_add_epi32(sumi[h], _mm256_madd_epi16(hi[h], b));
        }
    }
}

/// The four 6-bit code words of one Q6_K step (the low-nibble units `a`, `c` and the high-bit
/// unit `h`), in the order of [`crate::gemm::q6_k_quads`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q6_k_quads(a: __m256i, c: __m256i, h: __m256i) -> [__m256i; 4] {
    let lo = |v: __m256i| _mm256_and_si256(v, _mm256_set1_epi32(0x0F0F_0F0F));
    let hi = |v: __m256i| _mm256_and_si256(v, _mm256_set1_epi32(0x3030_3030));
    [
        _mm256_or_si256(lo(a), hi(_mm256_slli_epi32::<4>(h))),
        _mm256_or_si256(lo(c), hi(_mm256_slli_epi32::<2>(h))),
        _mm256_or_si256(lo(_mm256_srli_epi32::<4>(a)), hi(h)),
        _mm256_or_si256(lo(_mm256_srli_epi32::<4>(c)), hi(_mm256_srli_epi32::<2>(h))),
    ]
}

/// [`super::gemv`] for Q6_K; `group` and `act` hold the same number of super-blocks.
///
/// As Q4_K's: two groups' `vpmaddubsw` pairs summed in i16 (6-bit codes: 2 · 2 · 63 · 128 <
/// 32768), widened by `vpmaddwd` with the row's (signed) scale in both halves of its lane.
/// The codes' offset of 32 comes off once per super-block: Σ scale · 32 · Σy, the activation
/// sums of the sub-blocks meeting the scales in `vpmaddwd` too.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn gemv_q6_k_r16(group: &[u8], act: &[u8], out: &mut [f32; REPACK_ROWS]) {
    let mut acc = [_mm256_setzero_ps(); 2];
    for (o, y) in group
        .chunks_exact(Q6K_GROUP_BLOCK)
        .zip(act.chunks_exact(Q8K_BLOCK))
    {
        prefetch_ahead(o);
        let yd = _mm256_set1_ps(rd_f32(y, 0));
        for h in 0..2 {
            let half = 32 * h;
            let d = _mm256_mul_ps(ld_f16x8(o, 16 * h), yd);
            // Sub-block s's scale of each of the half's 8 rows, in both i16 halves of its lane.
            let scale = |s: usize| {
                let sc: &[u8; 8] = o[32 + 16 * s + HALF * h..][..8].try_into().unwrap();
                // SAFETY: `sc` is exactly 8 readable bytes.
                let x = unsafe { _mm_loadl_epi64(sc.as_ptr().cast()) };
                _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(x, x))
            };
            let mut sumi = _mm256_setzero_si256();
            let mut offset = _mm256_setzero_si256();
            // Sub-block 8n + 2k + gg takes the steps 8n + 4gg .. 8n + 4gg + 4 of chunk k.
            for n in 0..2 {
                for gg in 0..2 {
                    let sc: [__m256i; 4] = core::array::from_fn(|k| scale(8 * n + 2 * k + gg));
                    for pair in 0..2 {
                        let mut isum = [_mm256_setzero_si256(); 4];
                        for g in 4 * gg + 2 * pair..4 * gg + 2 * pair + 2 {
                            let step = 288 + (8 * n + g) * 192 + half;
                            let q = q6_k_quads(
                                ld256(o, step),
                                ld256(o, step + 64),
                                ld256(o, step + 128),
                            );
                            for (k, &q) in q.iter().enumerate() {
                                let yw = bcast(y, 4 + 128 * n + 32 * k + 4 * g);
                                isum[k] = _mm256_add_epi16(isum[k], _mm256_maddubs_epi16(q, yw));
                            }
                        }
                        for (k, &v) in isum.iter().enumerate() {
                            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(v, sc[k]));
                        }
                    }
                    for (k, &sc) in sc.iter().enumerate() {
                        let b = rd_i16(y, 260 + 2 * (8 * n + 2 * k + gg)) as i32;
                        let pair = _mm256_set1_epi32((b & 0xFFFF) | b << 16);
                        offset = _mm256_add_epi32(offset, _mm256_madd_epi16(sc, pair));
                    }
                }
            }
            // offset holds 2 · Σ scale · Σy; the codes' 32 makes it 16 times that.
            let sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32::<4>(offset));
            acc[h] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc[h]);
        }
    }
    store(out, acc);
}

/// Σ y of a Q8_0 activation block (`y`: its 34 bytes): the byte sums of y + 128, less 32·128
/// (the AVX-512 kernels call it too).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q8_0_sum(y: &[u8]) -> i32 {
    let yu = _mm256_xor_si256(ld256(y, 2), _mm256_set1_epi8(-128));
    let s4 = _mm256_sad_epu8(yu, _mm256_setzero_si256());
    let s2 = _mm_add_epi64(
        _mm256_castsi256_si128(s4),
        _mm256_extracti128_si256::<1>(s4),
    );
    (_mm_cvtsi128_si64(s2) + _mm_extract_epi64::<1>(s2)) as i32 - 32 * 128
}

/// [`super::gemv`] for Q4_0 (`Q5`: Q5_0); `group` and `act` hold the same number of blocks.
/// The codes of unit `g` of a half are those of `crate::repack::legacy_codes`: elements
/// 4g..4g+4 (low nibbles) and 16+4g..16+4g+4 (high nibbles), each with its fifth bit (bit e
/// of the row's word) for Q5_0.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn gemv_q4_0_r16<const Q5: bool>(
    group: &[u8],
    act: &[u8],
    out: &mut [f32; REPACK_ROWS],
) {
    let (group_block, offset, qs) = if Q5 {
        (Q5_0_GROUP_BLOCK, 16, 96)
    } else {
        (Q4_0_GROUP_BLOCK, 8, 32)
    };
    let m4 = _mm256_set1_epi8(0xF);
    let b4 = _mm256_set1_epi8(0x10);
    let mut acc = [_mm256_setzero_ps(); 2];
    for (o, y) in group.chunks_exact(group_block).zip(act.chunks_exact(34)) {
        prefetch_ahead(o);
        let dy = _mm256_set1_ps(rd_f16(y, 0));
        let ysum = q8_0_sum(y);
        for h in 0..2 {
            let half = 32 * h;
            let d = _mm256_mul_ps(ld_f16x8(o, 16 * h), dy);
            let mut isum = _mm256_set1_epi32(-offset * ysum);
            let qh = if Q5 {
                ld256(o, 32 + half)
            } else {
                _mm256_setzero_si256()
            };
            for g in 0..4 {
                let q = ld256(o, qs + 64 * g + half);
                let mut lo = _mm256_and_si256(q, m4);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
                if Q5 {
                    // Byte i of a row tests bit i (even g) or bit 4 + i (odd g) of its copy.
                    let t = _mm256_set1_epi32(if g.is_multiple_of(2) {
                        0x0804_0201
                    } else {
                        0x8040_2010_u32 as i32
                    });
                    let set = |k: usize| {
                        let spread = _mm256_shuffle_epi8(qh, ld256(&SPREAD[k], 0));
                        let on = _mm256_cmpeq_epi8(_mm256_and_si256(spread, t), t);
                        _mm256_and_si256(on, b4)
                    };
                    // Elements 4g + i (byte g / 2 of the word) and 16 + 4g + i (byte 2 + g / 2).
                    lo = _mm256_or_si256(lo, set(g / 2));
                    hi = _mm256_or_si256(hi, set(2 + g / 2));
                }
                isum = _mm256_add_epi32(isum, dot4(lo, bcast(y, 2 + 4 * g)));
                isum = _mm256_add_epi32(isum, dot4(hi, bcast(y, 18 + 4 * g)));
            }
            acc[h] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), acc[h]);
        }
    }
    store(out, acc);
}

/// [`super::gemv`] for Q8_0; `group` and `act` hold the same number of blocks. The weights are
/// signed: |w| times y with w's sign (ggml's AVX2 trick; y of a Q8_0 block is within ±127, so
/// a pair of products stays below 2·128·127).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn gemv_q8_0_r16(group: &[u8], act: &[u8], out: &mut [f32; REPACK_ROWS]) {
    let mut acc = [_mm256_setzero_ps(); 2];
    for (o, y) in group
        .chunks_exact(Q8_0_GROUP_BLOCK)
        .zip(act.chunks_exact(34))
    {
        prefetch_ahead(o);
        let dy = _mm256_set1_ps(rd_f16(y, 0));
        for h in 0..2 {
            let d = _mm256_mul_ps(ld_f16x8(o, 16 * h), dy);
            let mut isum = _mm256_setzero_si256();
            for g in 0..8 {
                let w = ld256(o, 32 + 64 * g + 32 * h);
                let yw = bcast(y, 2 + 4 * g);
                let p = mul_add_epi8(w, yw);
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
            }
            acc[h] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), acc[h]);
        }
    }
    store(out, acc);
}
