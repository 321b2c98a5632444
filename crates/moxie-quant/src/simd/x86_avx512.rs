//! AVX-512 (F/BW/VL/VNNI) kernels.
//!
//! Formats: dot products for F32, F16 (x same), Q8_0, Q4_0 (x Q8_0), Q4_K, Q5_K, Q6_K (x Q8_K);
//! activation quantizer Q8_K. The IQ1/IQ2/IQ3 code-book types have their own file
//! (`x86_avx512_iq.rs`); other types use the AVX2 kernels at this level.
//!
//! The integer work runs on 512-bit registers (two 32-byte chunks per register, VNNI
//! `vpdpbusd` / `vpdpwssd` for the multiply-adds), but the float work is kept exactly as in
//! ggml's x86 build on an AVX-512 machine: for the quantized types the 8 integer lanes of
//! ggml's AVX2 kernels are rebuilt (lane k of the low half plus lane k of the high half) and
//! accumulated with the same per-block 256-bit FMAs; F32/F16 use ggml's AVX-512 `vec.cpp`
//! layout (4 x 16-lane accumulators, GCC's `_mm512_reduce_add_ps` order). Results are therefore
//! bit-identical to ggml's, and to this crate's AVX2 kernels for the quantized types.
//!
//! Verified by: `tests/ggml_golden.rs` (bit-exact against ggml compiled with `-march=native`
//! on the golden AVX-512 machine), `tests/simd_props.rs` (property tests against the scalar
//! reference and against the AVX2 kernels on random raw blocks), `tests/known_answers.rs`.
//!
//! Every `unsafe` block is an unaligned load/store through a pointer derived from a slice of
//! checked length; the `#[target_feature]` functions are only called after run-time detection.

use core::arch::x86_64::*;

use super::x86_avx2::{h2f, hsum_float_8, k4_mins_prod, k4_scales_mins, ld128, ld256, word_pick};
use crate::common::rd_f32;

/// Declares the safe entry point `$name` (a `VecDotFn`): checks that `w` and `a` hold `nb`
/// blocks and calls the `#[target_feature]` kernel `$imp` on exactly those bytes.
macro_rules! entry {
    ($name:ident, $imp:ident, $bs:expr, $wts:expr, $ats:expr) => {
        pub(crate) fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let nb = n / $bs;
            let w = &w[..nb * $wts];
            let a = &a[..nb * $ats];
            // SAFETY: this function is only handed out through its type's table row at the
            // AVX-512 level (`Simd::at`), i.e. after AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C
            // were detected; the slices were bounds-checked above.
            unsafe { $imp(w, a) }
        }
    };
}

entry!(dot_q8_0, dot_q8_0_imp, 32, 34, 34);
entry!(dot_q4_0, dot_q4_0_imp, 32, 18, 34);
entry!(dot_q4_k, dot_q4_k_imp, 256, 144, 292);
entry!(dot_q5_k, dot_q5_k_imp, 256, 176, 292);
entry!(dot_q6_k, dot_q6_k_imp, 256, 210, 292);
entry!(dot_f32, dot_f32_imp, 1, 4, 4);
entry!(dot_f16, dot_f16_imp, 1, 2, 2);

/// Unaligned 64-byte load.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) fn ld512(s: &[u8], off: usize) -> __m512i {
    let s: &[u8; 64] = s[off..off + 64].try_into().unwrap();
    // SAFETY: `s` is exactly 64 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm512_loadu_si512(s.as_ptr().cast()) }
}

/// `[lo | hi]` as one 512-bit register.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// Low 256 bits + high 256 bits (i32 lanes).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn fold(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v))
}

/// `pshufb` indices giving i16 lane `2j` of a broadcast 128-bit vector in the low 256 bits and
/// lane `2j + 1` in the high 256 bits: the scales of sub-blocks `2j`, `2j + 1` of a K-quant.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn pair_pick(j: usize) -> __m512i {
    join(
        _mm256_set1_epi16(word_pick(2 * j)),
        _mm256_set1_epi16(word_pick(2 * j + 1)),
    )
}

/// i16 vector: low 256 bits all `lo`, high 256 bits all `hi`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn halves_epi16(lo: i16, hi: i16) -> __m512i {
    join(_mm256_set1_epi16(lo), _mm256_set1_epi16(hi))
}

// ---------------------------------------------------------------------------------------------
// 32-element blocks: two blocks per register, ggml's per-block FMA order kept

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn dot_q8_0_imp(w: &[u8], a: &[u8]) -> f32 {
    let zero = _mm512_setzero_si512();
    let mut acc = _mm256_setzero_ps();
    let mut wp = w.chunks_exact(68);
    let mut ap = a.chunks_exact(68);
    for (x, y) in (&mut wp).zip(&mut ap) {
        let qx = join(ld256(x, 2), ld256(x, 36));
        let qy = join(ld256(y, 2), ld256(y, 36));
        // ggml's sign trick: |x| (as u8) times y with the sign of x; exact for all inputs
        let neg = _mm512_movepi8_mask(qx);
        let ax = _mm512_abs_epi8(qx);
        let sy = _mm512_mask_sub_epi8(qy, neg, zero, qy);
        let q = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, ax, sy));
        let d0 = h2f(x, 0) * h2f(y, 0);
        let d1 = h2f(x, 34) * h2f(y, 34);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d0), _mm512_castps512_ps256(q), acc);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d1), hi_ps(q), acc);
    }
    for (x, y) in wp
        .remainder()
        .chunks_exact(34)
        .zip(ap.remainder().chunks_exact(34))
    {
        let qx = ld256(x, 2);
        let qy = ld256(y, 2);
        let ax = _mm256_sign_epi8(qx, qx);
        let sy = _mm256_sign_epi8(qy, qx);
        let q = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x, 0) * h2f(y, 0)), q, acc);
    }
    hsum_float_8(acc)
}

/// High 8 lanes of a 16-lane float vector.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn hi_ps(v: __m512) -> __m256 {
    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)))
}

/// Two Q4_0/IQ4-style 16-byte nibble arrays -> `[b0 lo, b0 hi, b1 lo, b1 hi]` (bytes 0..15).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn nibbles_2x16(b0: __m128i, b1: __m128i) -> __m512i {
    let t = _mm256_set_m128i(b1, b0);
    let m4 = _mm256_set1_epi8(0xF);
    let lo = _mm256_and_si256(t, m4);
    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(t), m4);
    let z = join(lo, hi); // [b0lo, b1lo, b0hi, b1hi]
    _mm512_shuffle_i64x2::<0xD8>(z, z) // 128-bit lanes 0, 2, 1, 3
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn dot_q4_0_imp(w: &[u8], a: &[u8]) -> f32 {
    let zero = _mm512_setzero_si512();
    let eight = _mm512_set1_epi8(8);
    let mut acc = _mm256_setzero_ps();
    let mut wp = w.chunks_exact(36);
    let mut ap = a.chunks_exact(68);
    for (x, y) in (&mut wp).zip(&mut ap) {
        let q = nibbles_2x16(ld128(x, 2), ld128(x, 20));
        let qy = join(ld256(y, 2), ld256(y, 36));
        // sum (q - 8) * y over groups of 4 = sum q*y - 8 * sum y (exact integers)
        let p = _mm512_sub_epi32(
            _mm512_dpbusd_epi32(zero, q, qy),
            _mm512_dpbusd_epi32(zero, eight, qy),
        );
        let qf = _mm512_cvtepi32_ps(p);
        let d0 = h2f(x, 0) * h2f(y, 0);
        let d1 = h2f(x, 18) * h2f(y, 34);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d0), _mm512_castps512_ps256(qf), acc);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d1), hi_ps(qf), acc);
    }
    for (x, y) in wp
        .remainder()
        .chunks_exact(18)
        .zip(ap.remainder().chunks_exact(34))
    {
        let q = super::x86_avx2::bytes_from_nibbles_32(x, 2);
        let qx = _mm256_sub_epi8(q, _mm256_set1_epi8(8));
        let qy = ld256(y, 2);
        let ax = _mm256_sign_epi8(qx, qx);
        let sy = _mm256_sign_epi8(qy, qx);
        let qf = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x, 0) * h2f(y, 0)), qf, acc);
    }
    hsum_float_8(acc)
}

// ---------------------------------------------------------------------------------------------
// K-quants: one 64-byte step per pair of 32-element sub-blocks

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn dot_q4_k_imp(w: &[u8], a: &[u8]) -> f32 {
    let m4 = _mm256_set1_epi8(0xF);
    let picks = [pair_pick(0), pair_pick(1), pair_pick(2), pair_pick(3)];
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for (x, y) in w.chunks_exact(144).zip(a.chunks_exact(292)) {
        let yd = rd_f32(y, 0);
        let d = yd * h2f(x, 0);
        let dmin = -yd * h2f(x, 2);
        let (sc, mn) = k4_scales_mins(&x[4..16]);
        let prod = k4_mins_prod(y, mn);
        acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m);
        let sc = _mm512_broadcast_i32x4(sc);

        let mut sumi = _mm512_setzero_si512();
        for j in 0..4 {
            let q4bits = ld256(x, 16 + 32 * j);
            let q4 = join(
                _mm256_and_si256(q4bits, m4),
                _mm256_and_si256(_mm256_srli_epi16::<4>(q4bits), m4),
            );
            let p16 = _mm512_maddubs_epi16(q4, ld512(y, 4 + 64 * j));
            sumi = _mm512_dpwssd_epi32(sumi, p16, _mm512_shuffle_epi8(sc, picks[j]));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(fold(sumi)), acc);
    }
    acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
    acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
    hsum_float_8(acc) + _mm_cvtss_f32(acc_m)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn dot_q5_k_imp(w: &[u8], a: &[u8]) -> f32 {
    let m4 = _mm256_set1_epi8(0xF);
    let picks = [pair_pick(0), pair_pick(1), pair_pick(2), pair_pick(3)];
    let sixteen = _mm512_set1_epi8(16);
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
        summs = dmin.mul_add(super::x86_avx2::hsum_i32_4_hadd(p) as f32, summs);

        let sc = _mm512_broadcast_i32x4(sc);
        let hb = ld256(x, 16);
        let hbits = join(hb, hb);
        let mut sumi = _mm512_setzero_si512();
        for j in 0..4 {
            let q5bits = ld256(x, 48 + 32 * j);
            let q5 = join(
                _mm256_and_si256(q5bits, m4),
                _mm256_and_si256(_mm256_srli_epi16::<4>(q5bits), m4),
            );
            let sel = join(
                _mm256_set1_epi8(1 << (2 * j)),
                _mm256_set1_epi8(1 << (2 * j + 1)),
            );
            let high = _mm512_test_epi8_mask(hbits, sel);
            let q5 = _mm512_mask_add_epi8(q5, high, q5, sixteen);
            let p16 = _mm512_maddubs_epi16(q5, ld512(y, 4 + 64 * j));
            sumi = _mm512_dpwssd_epi32(sumi, p16, _mm512_shuffle_epi8(sc, picks[j]));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(fold(sumi)), acc);
    }
    hsum_float_8(acc) + summs
}

/// Word indices that broadcast scale `4*g + t` to the t-th 128-bit lane (8 words each).
const Q6K_SCALE_IDX: [i16; 32] = [
    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
];

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn dot_q6_k_imp(w: &[u8], a: &[u8]) -> f32 {
    let m15 = _mm512_set1_epi8(15);
    let m48 = _mm512_set1_epi8(48);
    let idx_bytes: [u8; 64] = {
        let mut b = [0u8; 64];
        for (i, v) in Q6K_SCALE_IDX.iter().enumerate() {
            b[2 * i..2 * i + 2].copy_from_slice(&v.to_le_bytes());
        }
        b
    };
    let idx0 = ld512(&idx_bytes, 0);
    // shift counts: low 256 bits by `lo`, high 256 bits by `hi` (16-bit lanes)
    let shl_a = halves_epi16(4, 2);
    let shr_b = halves_epi16(0, 2);
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.chunks_exact(210).zip(a.chunks_exact(292)) {
        let d = rd_f32(y, 0) * h2f(x, 208);
        let q8sums = ld256(y, 260);
        let scales_16 = _mm256_cvtepi8_epi16(ld128(x, 192));
        let q8sclsub = _mm256_slli_epi32::<5>(_mm256_madd_epi16(q8sums, scales_16));
        let sc512 = _mm512_castsi256_si512(scales_16);

        let mut sumi = _mm512_setzero_si512();
        for j in 0..2 {
            let ql = ld512(x, 64 * j); // [q4bits1 | q4bits2]
            let h = ld256(x, 128 + 32 * j);
            let hz = join(h, h);
            let a_lo = _mm512_and_si512(ql, m15);
            let b_lo = _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m15);
            let a_hi = _mm512_and_si512(_mm512_sllv_epi16(hz, shl_a), m48);
            let b_hi = _mm512_and_si512(_mm512_srlv_epi16(hz, shr_b), m48);
            let qa = _mm512_or_si512(a_lo, a_hi); // chunks 0, 1 of this half
            let qb = _mm512_or_si512(b_lo, b_hi); // chunks 2, 3
            let off = 8 * j as i16;
            let sa =
                _mm512_permutexvar_epi16(_mm512_add_epi16(idx0, _mm512_set1_epi16(off)), sc512);
            let sb =
                _mm512_permutexvar_epi16(_mm512_add_epi16(idx0, _mm512_set1_epi16(off + 4)), sc512);
            let pa = _mm512_maddubs_epi16(qa, ld512(y, 4 + 128 * j));
            let pb = _mm512_maddubs_epi16(qb, ld512(y, 4 + 128 * j + 64));
            sumi = _mm512_dpwssd_epi32(sumi, pa, sa);
            sumi = _mm512_dpwssd_epi32(sumi, pb, sb);
        }
        let s = _mm256_sub_epi32(fold(sumi), q8sclsub);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(s), acc);
    }
    hsum_float_8(acc)
}

// ---------------------------------------------------------------------------------------------
// float formats (ggml vec.cpp AVX-512 mappings: 4 accumulators of 16 lanes)

/// `GGML_F32x16_REDUCE` of 4 accumulators, ending in GCC's `_mm512_reduce_add_ps` order.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn reduce_f32x16(s: [__m512; 4]) -> f32 {
    let x0 = _mm512_add_ps(s[0], s[2]);
    let x1 = _mm512_add_ps(s[1], s[3]);
    let x0 = _mm512_add_ps(x0, x1);
    let t3 = _mm256_add_ps(hi_ps(x0), _mm512_castps512_ps256(x0));
    let t6 = _mm_add_ps(_mm256_extractf128_ps::<1>(t3), _mm256_castps256_ps128(t3));
    let t8 = _mm_add_ps(t6, _mm_movehl_ps(t6, t6));
    _mm_cvtss_f32(_mm_add_ss(t8, _mm_movehdup_ps(t8)))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn dot_f32_imp(w: &[u8], a: &[u8]) -> f32 {
    let n = w.len() / 4;
    let np = n & !63;
    let mut sum = [_mm512_setzero_ps(); 4];
    for i in (0..np).step_by(64) {
        for (j, s) in sum.iter_mut().enumerate() {
            let o = 4 * (i + 16 * j);
            let x = _mm512_castsi512_ps(ld512(w, o));
            let y = _mm512_castsi512_ps(ld512(a, o));
            *s = _mm512_fmadd_ps(x, y, *s);
        }
    }
    let mut sumf = reduce_f32x16(sum);
    // ggml's leftover loop `sumf += x[i]*y[i]` as GCC 12 compiles it for Intel AVX-512
    // (-march=sapphirerapids, 256-bit preference): products of whole groups of 4 are rounded
    // and then added in order, the last `n % 4` are FMAs. (With AMD tuning GCC groups by 8
    // instead; the golden logits come from an Intel machine.)
    let nv = np + ((n - np) & !3);
    for i in np..nv {
        sumf += rd_f32(w, 4 * i) * rd_f32(a, 4 * i);
    }
    for i in nv..n {
        sumf = rd_f32(w, 4 * i).mul_add(rd_f32(a, 4 * i), sumf);
    }
    sumf
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn dot_f16_imp(w: &[u8], a: &[u8]) -> f32 {
    let n = w.len() / 2;
    let np = n & !63;
    let mut sum = [_mm512_setzero_ps(); 4];
    for i in (0..np).step_by(64) {
        for (j, s) in sum.iter_mut().enumerate() {
            let o = 2 * (i + 16 * j);
            let x = _mm512_cvtph_ps(ld256(w, o));
            let y = _mm512_cvtph_ps(ld256(a, o));
            *s = _mm512_fmadd_ps(x, y, *s);
        }
    }
    // ggml accumulates this one in double (ggml_float)
    let mut sumf = reduce_f32x16(sum) as f64;
    for i in np..n {
        sumf += (h2f(w, 2 * i) * h2f(a, 2 * i)) as f64;
    }
    sumf as f32
}

// ---------------------------------------------------------------------------------------------
// Q8_0 activation quantizer

/// `quantize_row_q8_0` as ggml's x86 build computes it (`d = amax / 127`, `id = 127 / amax`,
/// `round(x * id)` half to even); bit-identical to `x86_avx2::quantize_q8_0`.
pub(crate) fn quantize_q8_0(src: &[f32], dst: &mut [u8]) {
    let nb = src.len() / 32;
    let dst = &mut dst[..nb * 34];
    // SAFETY: only handed out through its table row at the AVX-512 level (detected); `dst`
    // holds `nb` blocks (checked by the slicing above) and `src` holds `nb * 32` floats.
    unsafe { quantize_q8_0_imp(&src[..nb * 32], dst) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn quantize_q8_0_imp(src: &[f32], dst: &mut [u8]) {
    // 16 blocks at a time: their maxima in one vector, so that the scales, their inverses and
    // the scales' f16 take one instruction each (correctly rounded as the scalar ones).
    for (x, y) in src.chunks(16 * 32).zip(dst.chunks_mut(16 * 34)) {
        let ld = |b: usize, h: usize| {
            // SAFETY: block b < x.len() / 32 of `x`, half h: 16 readable floats.
            unsafe { _mm512_loadu_ps(x.as_ptr().add(32 * b + 16 * h)) }
        };
        let n = x.len() / 32;
        let mut amax = [0f32; 16];
        for (b, m) in amax.iter_mut().enumerate().take(n) {
            *m = _mm512_reduce_max_ps(_mm512_max_ps(
                _mm512_abs_ps(ld(b, 0)),
                _mm512_abs_ps(ld(b, 1)),
            ));
        }
        // SAFETY: `amax` is 16 floats.
        let am = unsafe { _mm512_loadu_ps(amax.as_ptr()) };
        let d = _mm512_div_ps(am, _mm512_set1_ps(127.0));
        let nonzero = _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(am, _mm512_setzero_ps());
        let id = _mm512_maskz_div_ps(nonzero, _mm512_set1_ps(127.0), am);
        let (mut dh, mut ids) = ([0u16; 16], [0f32; 16]);
        // SAFETY: `dh` is 32 writable bytes and `ids` 16 floats.
        unsafe {
            _mm256_storeu_si256(
                dh.as_mut_ptr().cast(),
                _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(d),
            );
            _mm512_storeu_ps(ids.as_mut_ptr(), id);
        }
        for (b, yb) in y.chunks_exact_mut(34).enumerate() {
            yb[0..2].copy_from_slice(&dh[b].to_le_bytes());
            let mul = _mm512_set1_ps(ids[b]);
            for h in 0..2 {
                let q = _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                    _mm512_mul_ps(ld(b, h), mul),
                );
                let out: &mut [u8; 16] = (&mut yb[2 + 16 * h..18 + 16 * h]).try_into().unwrap();
                // SAFETY: `out` is 16 writable bytes; `storeu` has no alignment requirement.
                unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), _mm512_cvtsepi32_epi8(q)) };
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Q8_K activation quantizer

/// `quantize_row_q8_K_ref`, vectorized; bit-identical to `kquants::quantize_row_q8_k` for
/// finite inputs.
pub(crate) fn quantize_q8_k(src: &[f32], dst: &mut [u8]) {
    let nb = src.len() / 256;
    let dst = &mut dst[..nb * 292];
    // SAFETY: only handed out through its table row at the AVX-512 level (detected); `dst` holds `nb`
    // blocks (checked by the slicing above) and `src` holds `nb * 256` floats.
    unsafe { quantize_q8_k_imp(&src[..nb * 256], dst) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn quantize_q8_k_imp(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(256).zip(dst.chunks_exact_mut(292)) {
        let x: &[f32; 256] = x.try_into().unwrap();
        let mut v = [_mm512_setzero_ps(); 16];
        for (k, vk) in v.iter_mut().enumerate() {
            // SAFETY: `x` is 256 readable floats and `16 * k + 16 <= 256`; no alignment needed.
            *vk = unsafe { _mm512_loadu_ps(x.as_ptr().add(16 * k)) };
        }
        let mut m = _mm512_abs_ps(v[0]);
        for vk in &v[1..] {
            m = _mm512_max_ps(m, _mm512_abs_ps(*vk));
        }
        let amax = _mm512_reduce_max_ps(m);
        if amax == 0.0 {
            y.fill(0);
            continue;
        }
        // the signed value of the first element with |x| == amax (ggml's scan keeps the first)
        let target = _mm512_set1_ps(amax);
        let mut max = 0f32;
        for (k, vk) in v.iter().enumerate() {
            let hit = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(_mm512_abs_ps(*vk), target);
            if hit != 0 {
                max = x[16 * k + hit.trailing_zeros() as usize];
                break;
            }
        }
        let iscale = -127.0f32 / max;
        let vs = _mm512_set1_ps(iscale);
        let lim = _mm512_set1_epi32(127);
        let qs: &mut [u8; 256] = (&mut y[4..260]).try_into().unwrap();
        // The sums of 16: each 128-bit lane of `sad` (per group of four 16-value runs) gets
        // the sums of its two 8-byte halves of the quants + 128 (`psadbw` against zero).
        let bias = _mm512_set1_epi8(-128);
        let mut sums = [_mm512_setzero_si512(); 4];
        for (k, vk) in v.iter().enumerate() {
            // nearest_int == round-half-to-even for these magnitudes; MIN(127, v)
            let r = _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm512_mul_ps(vs, *vk),
            );
            let b = _mm512_cvtsepi32_epi8(_mm512_min_epi32(r, lim));
            let out: &mut [u8; 16] = (&mut qs[16 * k..16 * k + 16]).try_into().unwrap();
            // SAFETY: `out` is 16 writable bytes; `storeu` has no alignment requirement.
            unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), b) };
            let lane = _mm512_castsi128_si512(b);
            sums[k / 4] = match k % 4 {
                0 => lane,
                1 => _mm512_inserti32x4::<1>(sums[k / 4], b),
                2 => _mm512_inserti32x4::<2>(sums[k / 4], b),
                _ => _mm512_inserti32x4::<3>(sums[k / 4], b),
            };
        }
        // Per group: 8 qwords (two halves per run of 16) -> 4 sums, less 16 * 128.
        let mut bsums = [0i32; 16];
        for (g, v) in sums.iter().enumerate() {
            let sad = _mm512_sad_epu8(_mm512_xor_si512(*v, bias), _mm512_setzero_si512());
            let pair = _mm512_add_epi64(sad, _mm512_shuffle_epi32::<0b01_00_11_10>(sad));
            let mut q = [0i64; 8];
            // SAFETY: `q` is 64 writable bytes; `storeu` has no alignment requirement.
            unsafe { _mm512_storeu_si512(q.as_mut_ptr().cast(), pair) };
            for j in 0..4 {
                bsums[4 * g + j] = q[2 * j] as i32 - 16 * 128;
            }
        }
        for (k, s) in bsums.iter().enumerate() {
            y[260 + 2 * k..262 + 2 * k].copy_from_slice(&(*s as i16).to_le_bytes());
        }
        y[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}

// ---------------------------------------------------------------------------------------------
// BF16 on VDPBF16PS (orders and emulation in `bf16.rs`)

/// 32 bf16 at byte offset `off` as the instruction's operand.
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
fn ld_bh(s: &[u8], off: usize) -> __m512bh {
    assert!(off + 64 <= s.len());
    // SAFETY: 64 bytes from `off` are in bounds (asserted); __m512bh is 32 bf16 in the same
    // 512 bits as __m512i, any bit pattern valid.
    unsafe {
        std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(s.as_ptr().add(off).cast()))
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
fn lanes(v: __m512) -> [f32; 16] {
    let mut o = [0f32; 16];
    // SAFETY: `o` holds 16 f32, the unaligned store writes exactly those.
    unsafe { _mm512_storeu_ps(o.as_mut_ptr(), v) };
    o
}

/// `ggml_vec_dot_bf16` of an AVX512_BF16 build. Only called where `has_avx512_bf16()`.
pub(crate) fn dot_bf16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    assert!(super::has_avx512_bf16() && w.len() >= 2 * n && a.len() >= 2 * n);
    // SAFETY: AVX512F + AVX512_BF16 detected (asserted); lengths asserted.
    unsafe { dot_bf16_imp(n, w, a) }
}

#[target_feature(enable = "avx512f,avx512bf16")]
fn dot_bf16_imp(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let np = n & !63;
    let (mut c1, mut c2) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    for i in (0..np).step_by(64) {
        c1 = _mm512_dpbf16_ps(c1, ld_bh(w, 2 * i), ld_bh(a, 2 * i));
        c2 = _mm512_dpbf16_ps(c2, ld_bh(w, 2 * i + 64), ld_bh(a, 2 * i + 64));
    }
    crate::bf16::vec_dot_finish(n, np, w, a, &lanes(c1), &lanes(c2))
}

/// tinyBLAS's BF16 dot (`n % 32 == 0`). Only called where `has_avx512_bf16()`.
pub(crate) fn tinyblas_bf16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut out = [0f32; 1];
    tinyblas_bf16_many(n, w, a, 0, &mut out);
    out[0]
}

/// tinyBLAS's BF16 dot of one weight row with `out.len()` activation rows `stride` bytes
/// apart. Only called where `has_avx512_bf16()`.
pub(crate) fn tinyblas_bf16_many(n: usize, w: &[u8], acts: &[u8], stride: usize, out: &mut [f32]) {
    assert!(super::has_avx512_bf16() && n.is_multiple_of(32) && w.len() >= 2 * n);
    if let Some(last) = out.len().checked_sub(1) {
        assert!(acts.len() >= last * stride + 2 * n);
    }
    // SAFETY: AVX512F + AVX512_BF16 detected (asserted); every activation row read lies in
    // `acts` (asserted) and the loads check their bounds.
    unsafe { tinyblas_bf16_many_imp(n, w, acts, stride, out) }
}

#[target_feature(enable = "avx512f,avx512bf16")]
fn tinyblas_bf16_many_imp(n: usize, w: &[u8], acts: &[u8], stride: usize, out: &mut [f32]) {
    // Four activation rows per pass share each weight load (the chains stay per row).
    let mut t = 0;
    while t < out.len() {
        let rows = (out.len() - t).min(4);
        let mut acc = [_mm512_setzero_ps(); 4];
        for i in (0..n).step_by(32) {
            let wv = ld_bh(w, 2 * i);
            for (r, c) in acc.iter_mut().enumerate().take(rows) {
                *c = _mm512_dpbf16_ps(*c, wv, ld_bh(acts, (t + r) * stride + 2 * i));
            }
        }
        for (r, c) in acc.iter().enumerate().take(rows) {
            out[t + r] = crate::tinyblas::reduce_add_16(&lanes(*c));
        }
        t += rows;
    }
}
