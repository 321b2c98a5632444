//! AVX2 + FMA + F16C kernels.
//!
//! Formats: dot products for F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL (x Q8_0 / Q8_1),
//! Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS (x Q8_K); activation
//! quantizers Q8_0 and Q8_K. (ggml's x86 kernels of the IQ2/IQ3 types have no AVX-512 branch;
//! `x86_avx512_iq.rs` computes the same bits faster at the AVX-512 level, and falls back to
//! these where the CPU lacks AVX512_VBMI.)
//!
//! Each kernel is a port of the `__AVX2__` branch of the matching function in ggml's
//! `ggml-cpu/arch/x86/quants.c` (F32/F16: of `vec.cpp`'s AVX-512 branch, on 8-lane halves, see
//! below): the same 8 integer lanes per block,
//! the same float operations in the same order (`fmadd` per block, `hsum_float_8` at the end),
//! so the results are bit-identical to ggml's built by GCC 12 with `-march=native` on an Intel
//! AVX-512 machine (the golden-logit machine; reproduced with `-march=sapphirerapids`). Scalar
//! statements that GCC contracts into FMAs there (`summs += m * s` of Q4_1/Q5_1/Q5_K, the
//! IQ4_NL odd-block tail, F32 tails; checked in the disassembly) use `mul_add` here, the
//! others plain `*` and `+`. (GCC's AMD tunings contract less; on such builds a few results
//! differ from these kernels in the last bit.)
//!
//! Verified by: `tests/ggml_golden.rs` (bit-exact against ggml's compiled x86 kernels),
//! `tests/simd_props.rs` (property tests against the scalar reference, random raw blocks) and
//! `tests/known_answers.rs`.
//!
//! Every `unsafe` block below is an unaligned load or store through a pointer derived from a
//! slice of sufficient, checked length; the `#[target_feature]` functions are only called after
//! run-time detection (see `simd/mod.rs`).

use core::arch::x86_64::*;

use crate::common::{rd_f32, rd_u16, rd_u32};
use crate::iq4::KVALUES_IQ4NL;
use crate::iq_grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3XXS_GRID, KSIGNS64};

/// Declares the safe entry point `$name` (a `VecDotFn`): checks that `w` and `a` hold `nb`
/// blocks and calls the `#[target_feature]` kernel `$imp` on exactly those bytes.
macro_rules! entry {
    ($name:ident, $imp:ident, $bs:expr, $wts:expr, $ats:expr) => {
        pub(crate) fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let nb = n / $bs;
            let w = &w[..nb * $wts];
            let a = &a[..nb * $ats];
            // SAFETY: this function is only handed out through its type's table row at a
            // level the CPU supports (AVX2, FMA, F16C detected: `Simd::at`); the slices were
            // bounds-checked above.
            unsafe { $imp(w, a) }
        }
    };
}

entry!(dot_q8_0, dot_q8_0_imp, 32, 34, 34);
entry!(dot_q4_0, dot_q4_0_imp, 32, 18, 34);
entry!(dot_q4_1, dot_q4_1_imp, 32, 20, 36);
entry!(dot_q5_0, dot_q5_0_imp, 32, 22, 34);
entry!(dot_q5_1, dot_q5_1_imp, 32, 24, 36);
entry!(dot_iq4_nl, dot_iq4_nl_imp, 32, 18, 34);
entry!(dot_q2_k, dot_q2_k_imp, 256, 84, 292);
entry!(dot_q3_k, dot_q3_k_imp, 256, 110, 292);
entry!(dot_q4_k, dot_q4_k_imp, 256, 144, 292);
entry!(dot_q5_k, dot_q5_k_imp, 256, 176, 292);
entry!(dot_q6_k, dot_q6_k_imp, 256, 210, 292);
entry!(dot_iq4_xs, dot_iq4_xs_imp, 256, 136, 292);
entry!(dot_iq2_xxs, dot_iq2_xxs_imp, 256, 66, 292);
entry!(dot_iq2_xs, dot_iq2_xs_imp, 256, 74, 292);
entry!(dot_iq2_s, dot_iq2_s_imp, 256, 82, 292);
entry!(dot_iq3_xxs, dot_iq3_xxs_imp, 256, 98, 292);
entry!(dot_f32, dot_f32_imp, 1, 4, 4);
entry!(dot_f16, dot_f16_imp, 1, 2, 2);

// ---------------------------------------------------------------------------------------------
// helpers (ggml's static inline functions)

/// Unaligned 32-byte load.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn ld256(s: &[u8], off: usize) -> __m256i {
    let s: &[u8; 32] = s[off..off + 32].try_into().unwrap();
    // SAFETY: `s` is exactly 32 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
}

/// Unaligned 16-byte load.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn ld128(s: &[u8], off: usize) -> __m128i {
    let s: &[u8; 16] = s[off..off + 16].try_into().unwrap();
    // SAFETY: `s` is exactly 16 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm_loadu_si128(s.as_ptr().cast()) }
}

/// f16 at byte offset `off`, widened with F16C (exact, like ggml's lookup table).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn h2f(s: &[u8], off: usize) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(rd_u16(s, off) as i32)))
}

/// ggml `hsum_float_8`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum_float_8(x: __m256) -> f32 {
    let mut res = _mm256_extractf128_ps::<1>(x);
    res = _mm_add_ps(res, _mm256_castps256_ps128(x));
    res = _mm_add_ps(res, _mm_movehl_ps(res, res));
    res = _mm_add_ss(res, _mm_movehdup_ps(res));
    _mm_cvtss_f32(res)
}

/// ggml `bytes_from_nibbles_32`: 16 bytes -> 32 nibbles (low nibbles first).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn bytes_from_nibbles_32(s: &[u8], off: usize) -> __m256i {
    let tmp = ld128(s, off);
    let bytes = _mm256_set_m128i(_mm_srli_epi16::<4>(tmp), tmp);
    _mm256_and_si256(_mm256_set1_epi8(0xF), bytes)
}

/// ggml `bytes_from_bits_32`: bit j of the 32-bit word -> byte j is 0xFF or 0x00.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn bytes_from_bits_32(x32: u32) -> __m256i {
    let shuf_mask = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0x0000_0000_0000_0000,
    );
    let mut bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x32 as i32), shuf_mask);
    let bit_mask = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    bytes = _mm256_or_si256(bytes, bit_mask);
    _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
}

/// ggml `mul_sum_us8_pairs_float`: unsigned x signed bytes, groups of 4 summed to i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn mul_sum_us8_pairs_float(ax: __m256i, sy: __m256i) -> __m256 {
    let dot = _mm256_maddubs_epi16(ax, sy);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_set1_epi16(1), dot))
}

/// ggml `mul_sum_i8_pairs_float`: signed x signed bytes via the sign trick.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn mul_sum_i8_pairs_float(x: __m256i, y: __m256i) -> __m256 {
    let ax = _mm256_sign_epi8(x, x);
    let sy = _mm256_sign_epi8(y, x);
    mul_sum_us8_pairs_float(ax, sy)
}

/// ggml `mul_add_epi8`: signed x signed bytes, pairs summed to i16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn mul_add_epi8(x: __m256i, y: __m256i) -> __m256i {
    let ax = _mm256_sign_epi8(x, x);
    let sy = _mm256_sign_epi8(y, x);
    _mm256_maddubs_epi16(ax, sy)
}

/// 256-bit vector of i16: low 128 bits all `lo`, high 128 bits all `hi`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn split_scale(lo: i16, hi: i16) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo))
}

/// Q4_K / Q5_K scales and mins of one super-block (`get_scale_min_k4` for j = 0..8) from its
/// 12 packed bytes, as i16 lanes `(scales, mins)`: ggml's AVX2 `utmp` shuffle.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn k4_scales_mins(packed: &[u8]) -> (__m128i, __m128i) {
    const M1: u32 = 0x3f3f_3f3f;
    const M2: u32 = 0x0f0f_0f0f;
    const M3: u32 = 0x0303_0303;
    let (u0, u1, u2) = (rd_u32(packed, 0), rd_u32(packed, 4), rd_u32(packed, 8));
    let scales_hi = (u2 & M2) | (((u0 >> 6) & M3) << 4);
    let mins_hi = ((u2 >> 4) & M2) | (((u1 >> 6) & M3) << 4);
    let b = _mm_set_epi32(
        mins_hi as i32,
        (u1 & M1) as i32,
        scales_hi as i32,
        (u0 & M1) as i32,
    );
    let w = _mm256_cvtepu8_epi16(b);
    (_mm256_castsi256_si128(w), _mm256_extracti128_si256::<1>(w))
}

/// `pshufb` indices that pick i16 lane `k` of a 128-bit lane into every i16 of it.
#[inline(always)]
pub(super) const fn word_pick(k: usize) -> i16 {
    ((2 * k) | ((2 * k + 1) << 8)) as i16
}

// ---------------------------------------------------------------------------------------------
// 32-element block formats

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q8_0_imp(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.chunks_exact(34).zip(a.chunks_exact(34)) {
        let d = _mm256_set1_ps(h2f(x, 0) * h2f(y, 0));
        let qx = ld256(x, 2);
        let qy = ld256(y, 2);
        let q = mul_sum_i8_pairs_float(qx, qy);
        acc = _mm256_fmadd_ps(d, q, acc);
    }
    hsum_float_8(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q4_0_imp(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let off = _mm256_set1_epi8(8);
    for (x, y) in w.chunks_exact(18).zip(a.chunks_exact(34)) {
        let d = _mm256_set1_ps(h2f(x, 0) * h2f(y, 0));
        let qx = _mm256_sub_epi8(bytes_from_nibbles_32(x, 2), off);
        let qy = ld256(y, 2);
        let q = mul_sum_i8_pairs_float(qx, qy);
        acc = _mm256_fmadd_ps(d, q, acc);
    }
    hsum_float_8(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q4_1_imp(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0f32;
    for (x, y) in w.chunks_exact(20).zip(a.chunks_exact(36)) {
        let d0 = h2f(x, 0);
        let d1 = h2f(y, 0);
        summs = h2f(x, 2).mul_add(h2f(y, 2), summs);
        let d0d1 = _mm256_mul_ps(_mm256_set1_ps(d0), _mm256_set1_ps(d1));
        let qx = bytes_from_nibbles_32(x, 4);
        let qy = ld256(y, 4);
        let xy = mul_sum_us8_pairs_float(qx, qy);
        acc = _mm256_fmadd_ps(d0d1, xy, acc);
    }
    hsum_float_8(acc) + summs
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q5_0_imp(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.chunks_exact(22).zip(a.chunks_exact(34)) {
        let d = _mm256_set1_ps(h2f(x, 0) * h2f(y, 0));
        let mut qx = bytes_from_nibbles_32(x, 6);
        let mut bxhi = bytes_from_bits_32(rd_u32(x, 2));
        bxhi = _mm256_andnot_si256(bxhi, _mm256_set1_epi8(0xF0u8 as i8));
        qx = _mm256_or_si256(qx, bxhi);
        let qy = ld256(y, 2);
        let q = mul_sum_i8_pairs_float(qx, qy);
        acc = _mm256_fmadd_ps(d, q, acc);
    }
    hsum_float_8(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q5_1_imp(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0f32;
    for (x, y) in w.chunks_exact(24).zip(a.chunks_exact(36)) {
        let dx = _mm256_set1_ps(h2f(x, 0));
        summs = h2f(x, 2).mul_add(h2f(y, 2), summs);
        let mut qx = bytes_from_nibbles_32(x, 8);
        let mut bxhi = bytes_from_bits_32(rd_u32(x, 4));
        bxhi = _mm256_and_si256(bxhi, _mm256_set1_epi8(0x10));
        qx = _mm256_or_si256(qx, bxhi);
        let dy = _mm256_set1_ps(h2f(y, 0));
        let qy = ld256(y, 4);
        let q = mul_sum_us8_pairs_float(qx, qy);
        acc = _mm256_fmadd_ps(q, _mm256_mul_ps(dx, dy), acc);
    }
    hsum_float_8(acc) + summs
}

/// IQ4_NL code book as a 16-byte shuffle table.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn iq4nl_values() -> __m128i {
    let v: [u8; 16] = KVALUES_IQ4NL.map(|k| k as u8);
    ld128(&v, 0)
}

/// 16 packed IQ4 bytes -> 32 signed code-book values (low nibbles, then high nibbles).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn iq4_lookup(values: __m128i, s: &[u8], off: usize) -> __m256i {
    let bits = ld128(s, off);
    let m4b = _mm_set1_epi8(0x0f);
    _mm256_set_m128i(
        _mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16::<4>(bits), m4b)),
        _mm_shuffle_epi8(values, _mm_and_si128(bits, m4b)),
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_iq4_nl_imp(w: &[u8], a: &[u8]) -> f32 {
    let values = iq4nl_values();
    let mone = _mm256_set1_epi16(1);
    let mut accum1 = _mm256_setzero_ps();
    let mut accum2 = _mm256_setzero_ps();
    let mut wp = w.chunks_exact(36);
    let mut ap = a.chunks_exact(68);
    for (x, y) in (&mut wp).zip(&mut ap) {
        let q4b_1 = iq4_lookup(values, x, 2);
        let q4b_2 = iq4_lookup(values, x, 20);
        let p16_1 = mul_add_epi8(q4b_1, ld256(y, 2));
        let p16_2 = mul_add_epi8(q4b_2, ld256(y, 36));
        let p_1 = _mm256_madd_epi16(p16_1, mone);
        let p_2 = _mm256_madd_epi16(p16_2, mone);
        accum1 = _mm256_fmadd_ps(
            _mm256_set1_ps(h2f(y, 0) * h2f(x, 0)),
            _mm256_cvtepi32_ps(p_1),
            accum1,
        );
        accum2 = _mm256_fmadd_ps(
            _mm256_set1_ps(h2f(y, 34) * h2f(x, 18)),
            _mm256_cvtepi32_ps(p_2),
            accum2,
        );
    }
    let mut sumf = hsum_float_8(_mm256_add_ps(accum1, accum2));
    // odd block count: ggml's scalar tail `sumf += d * (sumi1 + sumi2)`, contracted into an FMA
    // by GCC 12 with Intel tuning (AMD tuning keeps mul + add)
    let (xr, yr) = (wp.remainder(), ap.remainder());
    if !xr.is_empty() {
        let d = h2f(yr, 0) * h2f(xr, 0);
        let mut sumi1 = 0i32;
        let mut sumi2 = 0i32;
        for j in 0..16 {
            sumi1 += (yr[2 + j] as i8) as i32 * KVALUES_IQ4NL[(xr[2 + j] & 0xf) as usize] as i32;
            sumi2 += (yr[18 + j] as i8) as i32 * KVALUES_IQ4NL[(xr[2 + j] >> 4) as usize] as i32;
        }
        sumf = d.mul_add((sumi1 + sumi2) as f32, sumf);
    }
    sumf
}

// ---------------------------------------------------------------------------------------------
// K-quants

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q2_k_imp(w: &[u8], a: &[u8]) -> f32 {
    let m3 = _mm256_set1_epi8(3);
    let m4 = _mm_set1_epi8(0xF);
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.chunks_exact(84).zip(a.chunks_exact(292)) {
        let yd = rd_f32(y, 0);
        let d = yd * h2f(x, 80);
        let dmin = -yd * h2f(x, 82);

        let mins_and_scales = ld128(x, 0);
        let mins8 = _mm_and_si128(_mm_srli_epi16::<4>(mins_and_scales), m4);
        let mins = _mm256_cvtepi8_epi16(mins8);
        let prod = _mm256_madd_epi16(mins, ld256(y, 260));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(prod), acc);

        let mut sc = [0u8; 16];
        sc.copy_from_slice(&x[0..16]);
        let mut sumi = _mm256_setzero_si256();
        for j in 0..2 {
            let q2bits = ld256(x, 16 + 32 * j);
            let q2 = [
                _mm256_and_si256(q2bits, m3),
                _mm256_and_si256(_mm256_srli_epi16::<2>(q2bits), m3),
                _mm256_and_si256(_mm256_srli_epi16::<4>(q2bits), m3),
                _mm256_and_si256(_mm256_srli_epi16::<6>(q2bits), m3),
            ];
            let mut p = [_mm256_setzero_si256(); 4];
            for k in 0..4 {
                let q8 = ld256(y, 4 + 128 * j + 32 * k);
                let s = 8 * j + 2 * k;
                let scale = split_scale((sc[s] & 0xF) as i16, (sc[s + 1] & 0xF) as i16);
                p[k] = _mm256_madd_epi16(scale, _mm256_maddubs_epi16(q2[k], q8));
            }
            let p0 = _mm256_add_epi32(p[0], p[1]);
            let p2 = _mm256_add_epi32(p[2], p[3]);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p2));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_float_8(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q3_k_imp(w: &[u8], a: &[u8]) -> f32 {
    let m3 = _mm256_set1_epi8(3);
    let four = _mm256_set1_epi8(4);
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.chunks_exact(110).zip(a.chunks_exact(292)) {
        let d = rd_f32(y, 0) * h2f(x, 108);
        let s6 = crate::common::q3k_scales(&x[96..108]);
        let hbits = ld256(x, 0);
        let mut sumi = _mm256_setzero_si256();
        for j in 0..2 {
            let q3bits = ld256(x, 32 + 32 * j);
            let q3l = [
                _mm256_and_si256(q3bits, m3),
                _mm256_and_si256(_mm256_srli_epi16::<2>(q3bits), m3),
                _mm256_and_si256(_mm256_srli_epi16::<4>(q3bits), m3),
                _mm256_and_si256(_mm256_srli_epi16::<6>(q3bits), m3),
            ];
            let mut p = [_mm256_setzero_si256(); 4];
            for k in 0..4 {
                // 4 where the high bit is NOT set (the value is q3l - 4 there)
                let bit = _mm256_set1_epi8(1 << (4 * j + k));
                let hset = _mm256_cmpeq_epi8(_mm256_and_si256(hbits, bit), bit);
                let q3h = _mm256_andnot_si256(hset, four);
                let q8 = ld256(y, 4 + 128 * j + 32 * k);
                let q8s = _mm256_maddubs_epi16(q3h, q8);
                let p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(q3l[k], q8), q8s);
                let s = 8 * j + 2 * k;
                let scale = split_scale(s6[s] as i16 - 32, s6[s + 1] as i16 - 32);
                p[k] = _mm256_madd_epi16(scale, p16);
            }
            let p0 = _mm256_add_epi32(p[0], p[1]);
            let p2 = _mm256_add_epi32(p[2], p[3]);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p2));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_float_8(acc)
}

/// `prod` of ggml's Q4_K/Q5_K mins term: bsums pairwise added (`hadd_epi16`), times the mins.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn k4_mins_prod(y: &[u8], mins: __m128i) -> __m128i {
    let q8sums = ld256(y, 260);
    let q8s = _mm_hadd_epi16(
        _mm256_extracti128_si256::<0>(q8sums),
        _mm256_extracti128_si256::<1>(q8sums),
    );
    _mm_madd_epi16(mins, q8s)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q4_k_imp(w: &[u8], a: &[u8]) -> f32 {
    let m4 = _mm256_set1_epi8(0xF);
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for (x, y) in w.chunks_exact(144).zip(a.chunks_exact(292)) {
        let yd = rd_f32(y, 0);
        let d = yd * h2f(x, 0);
        let dmin = -yd * h2f(x, 2);
        let (sc, mn) = k4_scales_mins(&x[4..16]);
        let prod = k4_mins_prod(y, mn);
        acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m);

        let sc = _mm256_broadcastsi128_si256(sc);
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            let scale_l = _mm256_shuffle_epi8(sc, _mm256_set1_epi16(word_pick(2 * j)));
            let scale_h = _mm256_shuffle_epi8(sc, _mm256_set1_epi16(word_pick(2 * j + 1)));
            let q4bits = ld256(x, 16 + 32 * j);
            let q4l = _mm256_and_si256(q4bits, m4);
            let q4h = _mm256_and_si256(_mm256_srli_epi16::<4>(q4bits), m4);
            let q8l = ld256(y, 4 + 64 * j);
            let p16l = _mm256_madd_epi16(scale_l, _mm256_maddubs_epi16(q4l, q8l));
            let q8h = ld256(y, 4 + 64 * j + 32);
            let p16h = _mm256_madd_epi16(scale_h, _mm256_maddubs_epi16(q4h, q8h));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p16l, p16h));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
    acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
    hsum_float_8(acc) + _mm_cvtss_f32(acc_m)
}

/// Sum of the 4 lanes of ggml's Q5_K `prod` as `hadd(hadd(prod, 0), 0)` computes it.
#[inline(always)]
pub(super) fn hsum_i32_4_hadd(p: [i32; 4]) -> i32 {
    p[0].wrapping_add(p[1])
        .wrapping_add(p[2].wrapping_add(p[3]))
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q5_k_imp(w: &[u8], a: &[u8]) -> f32 {
    let m4 = _mm256_set1_epi8(0xF);
    let sixteen = _mm256_set1_epi8(16);
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0f32;
    for (x, y) in w.chunks_exact(176).zip(a.chunks_exact(292)) {
        let yd = rd_f32(y, 0);
        let d = yd * h2f(x, 0);
        let dmin = -yd * h2f(x, 2);
        let (sc, mn) = k4_scales_mins(&x[4..16]);
        let prod = k4_mins_prod(y, mn);
        let p: [i32; 4] = [
            _mm_extract_epi32::<0>(prod),
            _mm_extract_epi32::<1>(prod),
            _mm_extract_epi32::<2>(prod),
            _mm_extract_epi32::<3>(prod),
        ];
        summs = dmin.mul_add(hsum_i32_4_hadd(p) as f32, summs);

        let sc = _mm256_broadcastsi128_si256(sc);
        let hbits = ld256(x, 16);
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            let q5bits = ld256(x, 48 + 32 * j);
            let b0 = _mm256_set1_epi8(1 << (2 * j));
            let b1 = _mm256_set1_epi8(1 << (2 * j + 1));
            let h0 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, b0), b0), sixteen);
            let h1 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, b1), b1), sixteen);
            let q5_0 = _mm256_add_epi8(_mm256_and_si256(q5bits, m4), h0);
            let q5_1 = _mm256_add_epi8(_mm256_and_si256(_mm256_srli_epi16::<4>(q5bits), m4), h1);
            let q8_0 = ld256(y, 4 + 64 * j);
            let q8_1 = ld256(y, 4 + 64 * j + 32);
            let p16_0 = _mm256_madd_epi16(
                _mm256_shuffle_epi8(sc, _mm256_set1_epi16(word_pick(2 * j))),
                _mm256_maddubs_epi16(q5_0, q8_0),
            );
            let p16_1 = _mm256_madd_epi16(
                _mm256_shuffle_epi8(sc, _mm256_set1_epi16(word_pick(2 * j + 1))),
                _mm256_maddubs_epi16(q5_1, q8_1),
            );
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p16_0, p16_1));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_float_8(acc) + summs
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q6_k_imp(w: &[u8], a: &[u8]) -> f32 {
    let m3 = _mm256_set1_epi8(3);
    let m15 = _mm256_set1_epi8(15);
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.chunks_exact(210).zip(a.chunks_exact(292)) {
        let d = rd_f32(y, 0) * h2f(x, 208);
        let q8sums = ld256(y, 260);
        let scales_16 = _mm256_cvtepi8_epi16(ld128(x, 192));
        let q8sclsub = _mm256_slli_epi32::<5>(_mm256_madd_epi16(q8sums, scales_16));
        let sc = &x[192..208];
        let mut sumi = _mm256_setzero_si256();
        for j in 0..2 {
            let q4bits1 = ld256(x, 64 * j);
            let q4bits2 = ld256(x, 64 * j + 32);
            let q4bits_h = ld256(x, 128 + 32 * j);
            let q4h_0 = _mm256_slli_epi16::<4>(_mm256_and_si256(q4bits_h, m3));
            let q4h_1 = _mm256_slli_epi16::<2>(_mm256_and_si256(q4bits_h, _mm256_set1_epi8(12)));
            let q4h_2 = _mm256_and_si256(q4bits_h, _mm256_set1_epi8(48));
            let q4h_3 = _mm256_srli_epi16::<2>(_mm256_and_si256(q4bits_h, _mm256_set1_epi8(-64)));
            let q4 = [
                _mm256_or_si256(_mm256_and_si256(q4bits1, m15), q4h_0),
                _mm256_or_si256(_mm256_and_si256(q4bits2, m15), q4h_1),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(q4bits1), m15),
                    q4h_2,
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(q4bits2), m15),
                    q4h_3,
                ),
            ];
            let mut p = [_mm256_setzero_si256(); 4];
            for k in 0..4 {
                let q8 = ld256(y, 4 + 128 * j + 32 * k);
                let s = 8 * j + 2 * k;
                let scale = split_scale(sc[s] as i8 as i16, sc[s + 1] as i8 as i16);
                p[k] = _mm256_madd_epi16(scale, _mm256_maddubs_epi16(q4[k], q8));
            }
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p[0], p[1]));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p[2], p[3]));
        }
        sumi = _mm256_sub_epi32(sumi, q8sclsub);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_float_8(acc)
}

/// IQ4_XS sub-block scales `ls - 32` of one super-block.
#[inline(always)]
pub(super) fn iq4xs_scales(x: &[u8]) -> [i16; 8] {
    let mut sh = rd_u16(x, 2);
    let mut out = [0i16; 8];
    for ib2 in 0..4 {
        let l = x[4 + ib2] as u16;
        out[2 * ib2] = ((l & 0xf) | ((sh << 4) & 0x30)) as i16 - 32;
        out[2 * ib2 + 1] = ((l >> 4) | ((sh << 2) & 0x30)) as i16 - 32;
        sh >>= 4;
    }
    out
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_iq4_xs_imp(w: &[u8], a: &[u8]) -> f32 {
    let values = iq4nl_values();
    let mut accum = _mm256_setzero_ps();
    for (x, y) in w.chunks_exact(136).zip(a.chunks_exact(292)) {
        let ls = iq4xs_scales(x);
        let mut sumi1 = _mm256_setzero_si256();
        let mut sumi2 = _mm256_setzero_si256();
        for ib in (0..8).step_by(2) {
            let q4b_1 = iq4_lookup(values, x, 8 + 16 * ib);
            let q4b_2 = iq4_lookup(values, x, 8 + 16 * (ib + 1));
            let p16_1 = mul_add_epi8(q4b_1, ld256(y, 4 + 32 * ib));
            let p16_2 = mul_add_epi8(q4b_2, ld256(y, 4 + 32 * (ib + 1)));
            let p_1 = _mm256_madd_epi16(p16_1, _mm256_set1_epi16(ls[ib]));
            let p_2 = _mm256_madd_epi16(p16_2, _mm256_set1_epi16(ls[ib + 1]));
            sumi1 = _mm256_add_epi32(p_1, sumi1);
            sumi2 = _mm256_add_epi32(p_2, sumi2);
        }
        accum = _mm256_fmadd_ps(
            _mm256_set1_ps(h2f(x, 0) * rd_f32(y, 0)),
            _mm256_cvtepi32_ps(_mm256_add_epi32(sumi1, sumi2)),
            accum,
        );
    }
    hsum_float_8(accum)
}

// ---------------------------------------------------------------------------------------------
// IQ2/IQ3 code-book types (x Q8_K)

/// ggml's `keven_signs_q2xs` viewed as `uint64_t`: the 8 bytes of entry `k` are -1 where
/// `KSIGNS_IQ2XS[k]` has its bit set, else +1 (operands of `_mm256_sign_epi8`).
#[inline(always)]
fn keven_signs(k: u32) -> i64 {
    (KSIGNS64[(k & 127) as usize] | 0x0101_0101_0101_0101) as i64
}

/// 4 x 8 sign multipliers from the four 7-bit sign fields in the low 28 bits of `aux`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn signs_4x7(aux: u32) -> __m256i {
    _mm256_set_epi64x(
        keven_signs(aux >> 21),
        keven_signs(aux >> 14),
        keven_signs(aux >> 7),
        keven_signs(aux),
    )
}

/// `q8` with the signs of the 32 bits of `signs` applied (byte j negated where bit j is set),
/// as ggml's IQ2_S and IQ3_S kernels do: `(q ^ s) - s`, `s` 0xff where the bit is set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn apply_sign_bits(signs: u32, q8: __m256i) -> __m256i {
    // byte b of the 4 sign bytes to lanes 8b..8b+8, then bit j of it in lane 8b + j
    let spread = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bits = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
    let s = _mm256_shuffle_epi8(_mm256_set1_epi32(signs as i32), spread);
    let s = _mm256_cmpeq_epi8(_mm256_and_si256(s, bits), bits);
    _mm256_sub_epi8(_mm256_xor_si256(s, q8), s)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_iq2_xxs_imp(w: &[u8], a: &[u8]) -> f32 {
    let mut accumf = _mm256_setzero_ps();
    for (x, y) in w.chunks_exact(66).zip(a.chunks_exact(292)) {
        let d = h2f(x, 0) * rd_f32(y, 0);
        let mut sumi1 = _mm256_setzero_si256();
        let mut sumi2 = _mm256_setzero_si256();
        for ib32 in (0..8).step_by(2) {
            let q8_1 = ld256(y, 4 + 32 * ib32);
            let q8_2 = ld256(y, 4 + 32 * (ib32 + 1));
            // per 32: a u32 of 4 grid indices, a u32 of 4 x 7 sign bits + the scale
            let aux: [u32; 4] = core::array::from_fn(|k| rd_u32(x, 2 + 8 * ib32 + 4 * k));
            let grid = |word: u32, l: u32| IQ2XXS_GRID[((word >> (8 * l)) & 0xff) as usize] as i64;
            let q2_1 = _mm256_set_epi64x(
                grid(aux[0], 3),
                grid(aux[0], 2),
                grid(aux[0], 1),
                grid(aux[0], 0),
            );
            let q2_2 = _mm256_set_epi64x(
                grid(aux[2], 3),
                grid(aux[2], 2),
                grid(aux[2], 1),
                grid(aux[2], 0),
            );
            let q8s_1 = _mm256_sign_epi8(q8_1, signs_4x7(aux[1]));
            let q8s_2 = _mm256_sign_epi8(q8_2, signs_4x7(aux[3]));
            let dot1 = _mm256_maddubs_epi16(q2_1, q8s_1);
            let dot2 = _mm256_maddubs_epi16(q2_2, q8s_2);
            let ls1 = (aux[1] >> 28) as i16;
            let ls2 = (aux[3] >> 28) as i16;
            let p1 = _mm256_madd_epi16(dot1, _mm256_set1_epi16(2 * ls1 + 1));
            let p2 = _mm256_madd_epi16(dot2, _mm256_set1_epi16(2 * ls2 + 1));
            sumi1 = _mm256_add_epi32(sumi1, p1);
            sumi2 = _mm256_add_epi32(sumi2, p2);
        }
        accumf = _mm256_fmadd_ps(
            _mm256_set1_ps(d),
            _mm256_cvtepi32_ps(_mm256_add_epi32(sumi1, sumi2)),
            accumf,
        );
    }
    0.125 * hsum_float_8(accumf)
}

/// ggml `get_scale_shuffle(i)`: bytes `2i` (8 times), then `2i + 1` (8 times).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scale_shuffle_2x8(i: usize) -> __m128i {
    let bytes = |b: usize| (b as i64) * 0x0101_0101_0101_0101;
    _mm_set_epi64x(bytes(2 * i + 1), bytes(2 * i))
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_iq2_xs_imp(w: &[u8], a: &[u8]) -> f32 {
    let mone = _mm256_set1_epi8(1);
    // the sign byte of element group g (u16 index) is byte 2g of the full-sign vector
    let block_sign_shuffle_1 = _mm256_set_epi64x(
        0x0606_0606_0606_0606,
        0x0404_0404_0404_0404,
        0x0202_0202_0202_0202,
        0,
    );
    let block_sign_shuffle_2 = _mm256_set_epi64x(
        0x0e0e_0e0e_0e0e_0e0e,
        0x0c0c_0c0c_0c0c_0c0c,
        0x0a0a_0a0a_0a0a_0a0a,
        0x0808_0808_0808_0808,
    );
    let bit_selector_mask = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
    // parity of a 4-bit value in bit 7: the 8th sign, which makes the negative count even
    let bit_helper = _mm256_broadcastsi128_si256(_mm_set_epi64x(
        0x0080_8000_8000_0080,
        0x8000_0080_0080_8000_u64 as i64,
    ));
    let m511 = _mm256_set1_epi16(511);
    let m4 = _mm_set1_epi8(0xf);
    let m1 = _mm_set1_epi8(1);
    let mut gindex = [0u16; 16];

    let mut accumf = _mm256_setzero_ps();
    for (x, y) in w.chunks_exact(74).zip(a.chunks_exact(292)) {
        let d = h2f(x, 0) * rd_f32(y, 0);
        let aux64 = u64::from_le_bytes(x[66..74].try_into().unwrap());
        let mut stmp = _mm_set1_epi64x(aux64 as i64);
        stmp = _mm_unpacklo_epi8(
            _mm_and_si128(stmp, m4),
            _mm_and_si128(_mm_srli_epi16::<4>(stmp), m4),
        );
        let scales = _mm_add_epi8(_mm_slli_epi16::<1>(stmp), m1);

        let mut sumi1 = _mm256_setzero_si256();
        let mut sumi2 = _mm256_setzero_si256();
        for ib32 in (0..8).step_by(4) {
            let q2_data = ld256(x, 2 + 8 * ib32);
            let aux_gindex = _mm256_and_si256(q2_data, m511);
            // SAFETY: `gindex` is 32 writable bytes; `storeu` has no alignment requirement.
            unsafe { _mm256_storeu_si256(gindex.as_mut_ptr().cast(), aux_gindex) };

            let partial_sign_bits = _mm256_srli_epi16::<9>(q2_data);
            let partial_sign_bits_upper = _mm256_srli_epi16::<13>(q2_data);
            let partial_sign_bits_for_counting =
                _mm256_xor_si256(partial_sign_bits, partial_sign_bits_upper);
            let odd_bits = _mm256_shuffle_epi8(bit_helper, partial_sign_bits_for_counting);
            let full_sign_bits = _mm256_or_si256(partial_sign_bits, odd_bits);

            let q8_1 = ld256(y, 4 + 32 * ib32);
            let q8_2 = ld256(y, 4 + 32 * (ib32 + 1));
            let q8_3 = ld256(y, 4 + 32 * (ib32 + 2));
            let q8_4 = ld256(y, 4 + 32 * (ib32 + 3));

            let grid = |k: usize| IQ2XS_GRID[gindex[k] as usize] as i64;
            let q2_1 = _mm256_set_epi64x(grid(3), grid(2), grid(1), grid(0));
            let q2_2 = _mm256_set_epi64x(grid(7), grid(6), grid(5), grid(4));
            let q2_3 = _mm256_set_epi64x(grid(11), grid(10), grid(9), grid(8));
            let q2_4 = _mm256_set_epi64x(grid(15), grid(14), grid(13), grid(12));

            let full_signs_l = _mm256_castsi256_si128(full_sign_bits);
            let full_signs_h = _mm256_extracti128_si256::<1>(full_sign_bits);
            let full_signs_1 = _mm256_set_m128i(full_signs_l, full_signs_l);
            let full_signs_2 = _mm256_set_m128i(full_signs_h, full_signs_h);

            let sign = |full: __m256i, shuffle: __m256i, q8: __m256i| {
                let s = _mm256_shuffle_epi8(full, shuffle);
                let s =
                    _mm256_cmpeq_epi8(_mm256_and_si256(s, bit_selector_mask), bit_selector_mask);
                _mm256_sign_epi8(q8, _mm256_or_si256(s, mone))
            };
            let q8s_1 = sign(full_signs_1, block_sign_shuffle_1, q8_1);
            let q8s_2 = sign(full_signs_1, block_sign_shuffle_2, q8_2);
            let q8s_3 = sign(full_signs_2, block_sign_shuffle_1, q8_3);
            let q8s_4 = sign(full_signs_2, block_sign_shuffle_2, q8_4);

            let dot1 = _mm256_maddubs_epi16(q2_1, q8s_1);
            let dot2 = _mm256_maddubs_epi16(q2_2, q8s_2);
            let dot3 = _mm256_maddubs_epi16(q2_3, q8s_3);
            let dot4 = _mm256_maddubs_epi16(q2_4, q8s_4);

            let sc =
                |i: usize| _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, scale_shuffle_2x8(i)));
            sumi1 = _mm256_add_epi32(sumi1, _mm256_madd_epi16(dot1, sc(ib32)));
            sumi2 = _mm256_add_epi32(sumi2, _mm256_madd_epi16(dot2, sc(ib32 + 1)));
            sumi1 = _mm256_add_epi32(sumi1, _mm256_madd_epi16(dot3, sc(ib32 + 2)));
            sumi2 = _mm256_add_epi32(sumi2, _mm256_madd_epi16(dot4, sc(ib32 + 3)));
        }
        accumf = _mm256_fmadd_ps(
            _mm256_set1_ps(d),
            _mm256_cvtepi32_ps(_mm256_add_epi32(sumi1, sumi2)),
            accumf,
        );
    }
    0.125 * hsum_float_8(accumf)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_iq2_s_imp(w: &[u8], a: &[u8]) -> f32 {
    let m4 = _mm_set1_epi8(0xf);
    let m1 = _mm_set1_epi8(1);

    let mut accumf = _mm256_setzero_ps();
    for (x, y) in w.chunks_exact(82).zip(a.chunks_exact(292)) {
        let d = h2f(x, 0) * rd_f32(y, 0);
        let qs = &x[2..34];
        let qh = &x[66..74];
        let aux64 = u64::from_le_bytes(x[74..82].try_into().unwrap());
        // low nibbles (first 16 of each 32) in the low 8 bytes, high nibbles in the high 8
        let scales8 = _mm_add_epi8(
            _mm_slli_epi16::<1>(_mm_and_si128(
                _mm_set_epi64x((aux64 >> 4) as i64, aux64 as i64),
                m4,
            )),
            m1,
        );
        let scales16 = _mm256_cvtepi8_epi16(scales8);

        let mut sumi1 = _mm256_setzero_si256();
        let mut sumi2 = _mm256_setzero_si256();
        for ib32 in (0..8).step_by(2) {
            let q8_1 = ld256(y, 4 + 32 * ib32);
            let q8_2 = ld256(y, 4 + 32 * (ib32 + 1));
            let grid = |k: usize, h: usize, shift: u32| {
                IQ2S_GRID[qs[4 * ib32 + k] as usize | (((qh[ib32 + h] as usize) << shift) & 0x300)]
                    as i64
            };
            let q2_1 =
                _mm256_set_epi64x(grid(3, 0, 2), grid(2, 0, 4), grid(1, 0, 6), grid(0, 0, 8));
            let q2_2 =
                _mm256_set_epi64x(grid(7, 1, 2), grid(6, 1, 4), grid(5, 1, 6), grid(4, 1, 8));

            let q8s_1 = apply_sign_bits(rd_u32(x, 34 + 4 * ib32), q8_1);
            let q8s_2 = apply_sign_bits(rd_u32(x, 34 + 4 * ib32 + 4), q8_2);

            let dot1 = _mm256_maddubs_epi16(q2_1, q8s_1);
            let dot2 = _mm256_maddubs_epi16(q2_2, q8s_2);

            // i16 lane `i` of each 128-bit half: the low nibble's scale, then the high one's
            let sc = |i: usize| {
                let pair = ((2 * i) | (2 * i + 1) << 8) as i16;
                _mm256_shuffle_epi8(scales16, _mm256_set1_epi16(pair))
            };
            let p1 = _mm256_madd_epi16(dot1, sc(ib32));
            let p2 = _mm256_madd_epi16(dot2, sc(ib32 + 1));
            sumi1 = _mm256_add_epi32(sumi1, p1);
            sumi2 = _mm256_add_epi32(sumi2, p2);
        }
        accumf = _mm256_fmadd_ps(
            _mm256_set1_ps(d),
            _mm256_cvtepi32_ps(_mm256_add_epi32(sumi1, sumi2)),
            accumf,
        );
    }
    0.125 * hsum_float_8(accumf)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_iq3_xxs_imp(w: &[u8], a: &[u8]) -> f32 {
    let mut accumf = _mm256_setzero_ps();
    for (x, y) in w.chunks_exact(98).zip(a.chunks_exact(292)) {
        let d = h2f(x, 0) * rd_f32(y, 0);
        let mut sumi1 = _mm256_setzero_si256();
        let mut sumi2 = _mm256_setzero_si256();
        for ib32 in (0..8).step_by(2) {
            let q8_1 = ld256(y, 4 + 32 * ib32);
            let q8_2 = ld256(y, 4 + 32 * (ib32 + 1));
            let grid = |k: usize| IQ3XXS_GRID[x[2 + 8 * ib32 + k] as usize] as i32;
            let q2_1 = _mm256_set_epi32(
                grid(7),
                grid(6),
                grid(5),
                grid(4),
                grid(3),
                grid(2),
                grid(1),
                grid(0),
            );
            let q2_2 = _mm256_set_epi32(
                grid(15),
                grid(14),
                grid(13),
                grid(12),
                grid(11),
                grid(10),
                grid(9),
                grid(8),
            );
            let aux0 = rd_u32(x, 66 + 4 * ib32);
            let aux1 = rd_u32(x, 66 + 4 * ib32 + 4);
            let q8s_1 = _mm256_sign_epi8(q8_1, signs_4x7(aux0));
            let q8s_2 = _mm256_sign_epi8(q8_2, signs_4x7(aux1));
            let dot1 = _mm256_maddubs_epi16(q2_1, q8s_1);
            let dot2 = _mm256_maddubs_epi16(q2_2, q8s_2);
            let ls1 = (aux0 >> 28) as i16;
            let ls2 = (aux1 >> 28) as i16;
            let p1 = _mm256_madd_epi16(dot1, _mm256_set1_epi16(2 * ls1 + 1));
            let p2 = _mm256_madd_epi16(dot2, _mm256_set1_epi16(2 * ls2 + 1));
            sumi1 = _mm256_add_epi32(sumi1, p1);
            sumi2 = _mm256_add_epi32(sumi2, p2);
        }
        accumf = _mm256_fmadd_ps(
            _mm256_set1_ps(d),
            _mm256_cvtepi32_ps(_mm256_add_epi32(sumi1, sumi2)),
            accumf,
        );
    }
    0.25 * hsum_float_8(accumf)
}

// ---------------------------------------------------------------------------------------------
// float formats: ggml vec.cpp's AVX-512 mappings (4 accumulators of 16 lanes), each 16-lane
// register as two 8-lane halves. ggml's AVX2 build sums in 4 x 8 lanes instead; moxie follows
// the AVX-512 build on every x86 level, so that exact numerics give the same bits on any host
// (the golden logits come from the AVX-512 build).

/// `GGML_F32x16_REDUCE` of 4 accumulators (`lo`/`hi`: lanes 0..8 and 8..16 of each), ending in
/// GCC's `_mm512_reduce_add_ps` order: halves, then quarters, then pairs.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn reduce_f32x16(lo: [__m256; 4], hi: [__m256; 4]) -> f32 {
    let half = |s: [__m256; 4]| {
        let x0 = _mm256_add_ps(s[0], s[2]);
        let x1 = _mm256_add_ps(s[1], s[3]);
        _mm256_add_ps(x0, x1)
    };
    let t3 = _mm256_add_ps(half(hi), half(lo));
    let t6 = _mm_add_ps(_mm256_extractf128_ps::<1>(t3), _mm256_castps256_ps128(t3));
    let t8 = _mm_add_ps(t6, _mm_movehl_ps(t6, t6));
    _mm_cvtss_f32(_mm_add_ss(t8, _mm_movehdup_ps(t8)))
}

/// 8 f32 at byte offset `off`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn ld_f32x8(s: &[u8], off: usize) -> __m256 {
    _mm256_castsi256_ps(ld256(s, off))
}

/// 8 f16 at byte offset `off`, widened.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn ld_f16x8(s: &[u8], off: usize) -> __m256 {
    _mm256_cvtph_ps(ld128(s, off))
}

/// vec.cpp's AVX-512 main loop over the first `np` (a multiple of 64) elements, reduced:
/// `fma` into 4 accumulators of 16 lanes (here two halves each), 64 elements a step. `ld(s, i)`
/// gives the 8 values of `s` from element `i` as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn sum_f32x16(w: &[u8], a: &[u8], np: usize, ld: impl Fn(&[u8], usize) -> __m256) -> f32 {
    let mut lo = [_mm256_setzero_ps(); 4];
    let mut hi = [_mm256_setzero_ps(); 4];
    for i in (0..np).step_by(64) {
        for j in 0..4 {
            let e = i + 16 * j;
            lo[j] = _mm256_fmadd_ps(ld(w, e), ld(a, e), lo[j]);
            hi[j] = _mm256_fmadd_ps(ld(w, e + 8), ld(a, e + 8), hi[j]);
        }
    }
    reduce_f32x16(lo, hi)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_f32_imp(w: &[u8], a: &[u8]) -> f32 {
    let n = w.len() / 4;
    let np = n & !63;
    let mut sumf = sum_f32x16(w, a, np, |s, i| ld_f32x8(s, 4 * i));
    // ggml's leftover loop `sumf += x[i]*y[i]` as GCC 12 compiles it for Intel AVX-512
    // (-march=sapphirerapids, 256-bit preference): products of whole groups of 4 are rounded
    // and then added in order, the last `n % 4` are FMAs.
    let nv = np + ((n - np) & !3);
    for i in np..nv {
        sumf += rd_f32(w, 4 * i) * rd_f32(a, 4 * i);
    }
    for i in nv..n {
        sumf = rd_f32(w, 4 * i).mul_add(rd_f32(a, 4 * i), sumf);
    }
    sumf
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_f16_imp(w: &[u8], a: &[u8]) -> f32 {
    let n = w.len() / 2;
    let np = n & !63;
    // ggml accumulates this one in double (ggml_float)
    let mut sumf = sum_f32x16(w, a, np, |s, i| ld_f16x8(s, 2 * i)) as f64;
    for i in np..n {
        sumf += (h2f(w, 2 * i) * h2f(a, 2 * i)) as f64;
    }
    sumf as f32
}

// ---------------------------------------------------------------------------------------------
// activation quantizer

/// x86 `quantize_row_q8_0` (AVX2 branch), bit-identical to `legacy::quantize_row_q8_0`.
pub(crate) fn quantize_q8_0(src: &[f32], dst: &mut [u8]) {
    let nb = src.len() / 32;
    let dst = &mut dst[..nb * 34];
    // SAFETY: only handed out through its table row after AVX2/FMA/F16C detection; `dst` holds `nb` blocks (checked
    // by the slicing above) and `src` holds `nb * 32` floats.
    unsafe { quantize_q8_0_imp(&src[..nb * 32], dst) }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn quantize_q8_0_imp(src: &[f32], dst: &mut [u8]) {
    let sign_bit = _mm256_set1_ps(-0.0);
    for (x, y) in src.chunks_exact(32).zip(dst.chunks_exact_mut(34)) {
        let x: &[f32; 32] = x.try_into().unwrap();
        // SAFETY: `x` is 32 readable floats; `loadu` has no alignment requirement.
        let v = unsafe {
            [
                _mm256_loadu_ps(x.as_ptr()),
                _mm256_loadu_ps(x.as_ptr().add(8)),
                _mm256_loadu_ps(x.as_ptr().add(16)),
                _mm256_loadu_ps(x.as_ptr().add(24)),
            ]
        };
        let mut max_abs = _mm256_andnot_ps(sign_bit, v[0]);
        max_abs = _mm256_max_ps(max_abs, _mm256_andnot_ps(sign_bit, v[1]));
        max_abs = _mm256_max_ps(max_abs, _mm256_andnot_ps(sign_bit, v[2]));
        max_abs = _mm256_max_ps(max_abs, _mm256_andnot_ps(sign_bit, v[3]));
        let mut max4 = _mm_max_ps(
            _mm256_extractf128_ps::<1>(max_abs),
            _mm256_castps256_ps128(max_abs),
        );
        max4 = _mm_max_ps(max4, _mm_movehl_ps(max4, max4));
        max4 = _mm_max_ss(max4, _mm_movehdup_ps(max4));
        let max_scalar = _mm_cvtss_f32(max4);

        let d = max_scalar / 127.0;
        y[0..2].copy_from_slice(&crate::f16::f32_to_fp16(d).to_le_bytes());
        let id = if max_scalar != 0.0 {
            127.0 / max_scalar
        } else {
            0.0
        };
        let mul = _mm256_set1_ps(id);
        let (i0, i1, i2, i3) = (
            round_i32(v[0], mul),
            round_i32(v[1], mul),
            round_i32(v[2], mul),
            round_i32(v[3], mul),
        );
        let i0 = _mm256_packs_epi32(i0, i1);
        let i2 = _mm256_packs_epi32(i2, i3);
        let i0 = _mm256_packs_epi16(i0, i2);
        let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        let q = _mm256_permutevar8x32_epi32(i0, perm);
        let out: &mut [u8; 32] = (&mut y[2..34]).try_into().unwrap();
        // SAFETY: `out` is 32 writable bytes; `storeu` has no alignment requirement.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), q) };
    }
}

/// `cvtps_epi32(round(v * mul))` with round-half-to-even.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn round_i32(v: __m256, mul: __m256) -> __m256i {
    _mm256_cvtps_epi32(_mm256_round_ps::<_MM_FROUND_TO_NEAREST_INT>(_mm256_mul_ps(
        v, mul,
    )))
}

/// `quantize_row_q8_K_ref`, vectorized; bit-identical to `kquants::quantize_row_q8_k` for
/// finite inputs.
pub(crate) fn quantize_q8_k(src: &[f32], dst: &mut [u8]) {
    let nb = src.len() / 256;
    let dst = &mut dst[..nb * 292];
    // SAFETY: only handed out through its table row after AVX2/FMA/F16C detection; `dst` holds `nb` blocks (checked
    // by the slicing above) and `src` holds `nb * 256` floats.
    unsafe { quantize_q8_k_imp(&src[..nb * 256], dst) }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn quantize_q8_k_imp(src: &[f32], dst: &mut [u8]) {
    let sign_bit = _mm256_set1_ps(-0.0);
    for (x, y) in src.chunks_exact(256).zip(dst.chunks_exact_mut(292)) {
        let x: &[f32; 256] = x.try_into().unwrap();
        let mut v = [_mm256_setzero_ps(); 32];
        for (k, vk) in v.iter_mut().enumerate() {
            // SAFETY: `x` is 256 readable floats and `8 * k + 8 <= 256`; no alignment needed.
            *vk = unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * k)) };
        }
        let mut m = _mm256_andnot_ps(sign_bit, v[0]);
        for vk in &v[1..] {
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign_bit, *vk));
        }
        let mut m4 = _mm_max_ps(_mm256_extractf128_ps::<1>(m), _mm256_castps256_ps128(m));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        let amax = _mm_cvtss_f32(m4);
        if amax == 0.0 {
            y.fill(0);
            continue;
        }
        // the signed value of the first element with |x| == amax (ggml's scan keeps the first)
        let target = _mm256_set1_ps(amax);
        let mut max = 0f32;
        for (k, vk) in v.iter().enumerate() {
            let eq = _mm256_cmp_ps::<_CMP_EQ_OQ>(_mm256_andnot_ps(sign_bit, *vk), target);
            let hit = _mm256_movemask_ps(eq) as u32;
            if hit != 0 {
                max = x[8 * k + hit.trailing_zeros() as usize];
                break;
            }
        }
        let iscale = -127.0f32 / max;
        let vs = _mm256_set1_ps(iscale);
        let lim = _mm256_set1_epi32(127);
        let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for g in 0..8 {
            // nearest_int == round-half-to-even for these magnitudes; MIN(127, v)
            let r: [__m256i; 4] = core::array::from_fn(|k| {
                let p = _mm256_mul_ps(vs, v[4 * g + k]);
                _mm256_min_epi32(round_i32(p, _mm256_set1_ps(1.0)), lim)
            });
            for h in 0..2 {
                let s = _mm256_add_epi32(r[2 * h], r[2 * h + 1]);
                let s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
                let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
                let s1 = _mm_add_epi32(s2, _mm_shuffle_epi32::<0b01>(s2));
                let sum = _mm_cvtsi128_si32(s1) as i16;
                let o = 260 + 2 * (2 * g + h);
                y[o..o + 2].copy_from_slice(&sum.to_le_bytes());
            }
            let p01 = _mm256_packs_epi32(r[0], r[1]);
            let p23 = _mm256_packs_epi32(r[2], r[3]);
            let q = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), perm);
            let out: &mut [u8; 32] = (&mut y[4 + 32 * g..36 + 32 * g]).try_into().unwrap();
            // SAFETY: `out` is 32 writable bytes; `storeu` has no alignment requirement.
            unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), q) };
        }
        y[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}

// ---------------------------------------------------------------------------------------------
// F16 rows

/// F16 row to f32 with F16C (`vcvtph2ps`): widening is exact, so the result equals
/// `f16::dequantize_row_f16`'s scalar port (ggml's own F16C conversion) bit for bit.
pub(crate) fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    let src = &src[..dst.len() * 2];
    // SAFETY: only called after AVX2/FMA/F16C detection (`f16::dequantize_row_f16`); `src`
    // holds `dst.len()` halves (checked by the slicing above).
    unsafe { dequantize_f16_imp(src, dst) }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dequantize_f16_imp(src: &[u8], dst: &mut [f32]) {
    let done = dst.len() / 8 * 8;
    let (body, tail) = dst.split_at_mut(done);
    for (i, d) in body.chunks_exact_mut(8).enumerate() {
        let x = _mm256_cvtph_ps(ld128(src, i * 16));
        let d: &mut [f32; 8] = d.try_into().unwrap();
        // SAFETY: `d` is 8 writable floats; `storeu` has no alignment requirement.
        unsafe { _mm256_storeu_ps(d.as_mut_ptr(), x) };
    }
    for (i, d) in tail.iter_mut().enumerate() {
        *d = h2f(src, (done + i) * 2);
    }
}

/// f32 row to F16 with F16C (`vcvtps2ph`, round to nearest even), as ggml's
/// `ggml_cpu_fp32_to_fp16` converts on x86; bit-identical to `f16::quantize_row_f16`.
pub(crate) fn quantize_f16(src: &[f32], dst: &mut [u8]) {
    let dst = &mut dst[..src.len() * 2];
    // SAFETY: only handed out through its table row after AVX2/FMA/F16C detection; `dst` holds
    // `src.len()` halves (checked by the slicing above).
    unsafe { quantize_f16_imp(src, dst) }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn quantize_f16_imp(src: &[f32], dst: &mut [u8]) {
    let mut chunks = src.chunks_exact(8);
    for (i, s) in chunks.by_ref().enumerate() {
        let s: &[f32; 8] = s.try_into().unwrap();
        let d: &mut [u8; 16] = (&mut dst[i * 16..i * 16 + 16]).try_into().unwrap();
        // SAFETY: `s` is 8 readable floats and `d` 16 writable bytes; no alignment needed.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(s.as_ptr()));
            _mm_storeu_si128(d.as_mut_ptr().cast(), h);
        }
    }
    let done = src.len() / 8 * 8;
    for (i, &s) in chunks.remainder().iter().enumerate() {
        let h = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(s));
        let at = (done + i) * 2;
        dst[at..at + 2].copy_from_slice(&(_mm_extract_epi16::<0>(h) as u16).to_le_bytes());
    }
}
