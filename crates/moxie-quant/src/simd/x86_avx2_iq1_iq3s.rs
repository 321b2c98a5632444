//! AVX2 dot products of IQ3_S, IQ1_S and IQ1_M weights with Q8_K activations.
//!
//! Ports of the `__AVX2__` branches of `ggml_vec_dot_iq3_s_q8_K`, `ggml_vec_dot_iq1_s_q8_K` and
//! `ggml_vec_dot_iq1_m_q8_K` in ggml's `ggml-cpu/arch/x86/quants.c`, which is what the golden
//! machine's `-march=sapphirerapids`-class build runs (ggml has no AVX-512 branch for these
//! types; its IQ1 `__BMI2__` sub-branches only form the same grid indices with `pdep`). The
//! grid indices of two sub-blocks are computed in one vector (as ggml's IQ3_S code does),
//! stored, and the grid rows loaded one by one. The integer lanes are formed as ggml forms them
//! (the same bytes in the same 32-bit lanes), so the per-block `fmadd`s and the final
//! `hsum_float_8` see the same values. The scalar float statements are
//! evaluated as GCC 12 compiles them for Sapphire Rapids (checked in the disassembly): IQ1_S's
//! `accum1 += d * sumi1` is contracted into an FMA, the final `+ IQ1S_DELTA * accum1` is a
//! multiply then an add; IQ1_M's final `hsum1 + IQ1M_DELTA * hsum2` is an FMA (the product by
//! 1/8 is exact, so either way gives the same bits).
//!
//! Verified by: `tests/ggml_golden.rs` (bit-exact against ggml's compiled x86 kernels) and
//! `tests/simd_props.rs` (against the scalar reference on random raw blocks).

use core::arch::x86_64::*;

use super::x86_avx2::{apply_sign_bits, h2f, hsum_float_8, ld128, ld256, mul_add_epi8};
use crate::common::{rd_f32, rd_i16, rd_u16, rd_u32};
use crate::f16::fp16_to_f32;
use crate::iq1::{iq1m_scale_bits, iq1s_scale, IQ1_DELTA, IQ1_M_BYTES, IQ1_S_BYTES};
use crate::iq3s::{iq3s_scale, IQ3_S_BYTES};
use crate::iq_grids::{IQ1S_GRID, IQ3S_GRID};
use crate::kquants::Q8_K_BYTES;

/// Declares the safe entry point `$name` (a `VecDotFn`): checks that `w` and `a` hold `nb`
/// super-blocks and calls the `#[target_feature]` kernel `$imp` on exactly those bytes.
macro_rules! entry {
    ($name:ident, $imp:ident, $wts:expr) => {
        pub(crate) fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let nb = n / 256;
            let w = &w[..nb * $wts];
            let a = &a[..nb * Q8_K_BYTES];
            // SAFETY: this function is only handed out through its type's table row at a
            // level the CPU supports (AVX2, FMA, F16C detected: `Simd::at`); the slices were
            // bounds-checked above.
            unsafe { $imp(w, a) }
        }
    };
}

entry!(dot_iq3_s, dot_iq3_s_imp, IQ3_S_BYTES);
entry!(dot_iq1_s, dot_iq1_s_imp, IQ1_S_BYTES);
entry!(dot_iq1_m, dot_iq1_m_imp, IQ1_M_BYTES);

/// The 32 magnitudes of IQ3_S sub-blocks `ib` and `ib + 1`: grid row `k` of each in 32-bit
/// lane `k` (ggml's index arithmetic: 8 bits from `qs`, the 9th from `qh` bit `k`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn iq3s_magnitudes(x: &[u8], ib: usize) -> [__m256i; 2] {
    let qs = _mm256_cvtepu8_epi16(ld128(x, 2 + 8 * ib));
    let shift = _mm256_set_epi32(1, 2, 3, 4, 5, 6, 7, 8);
    let bit9 = _mm256_set1_epi32(256);
    let hi =
        |qh: u8| _mm256_and_si256(_mm256_sllv_epi32(_mm256_set1_epi32(qh as i32), shift), bit9);
    let idx = [
        _mm256_or_si256(
            hi(x[66 + ib]),
            _mm256_cvtepi16_epi32(_mm256_castsi256_si128(qs)),
        ),
        _mm256_or_si256(
            hi(x[67 + ib]),
            _mm256_cvtepi16_epi32(_mm256_extracti128_si256::<1>(qs)),
        ),
    ];
    [iq3s_rows(idx[0]), iq3s_rows(idx[1])]
}

/// The grid rows whose indices (below 512) are the 32-bit lanes of `idx`, row k in lane k. A
/// function, not a closure given to `array::map`, which LLVM left out of line (a call per
/// sub-block pair; in some builds two, 1.5x slower).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn iq3s_rows(idx: __m256i) -> __m256i {
    let mut a = [0u32; 8];
    // SAFETY: `a` is 32 writable bytes; `storeu` has no alignment requirement.
    unsafe { _mm256_storeu_si256(a.as_mut_ptr().cast(), idx) };
    let g = |k: usize| IQ3S_GRID[a[k] as usize & 511] as i32;
    _mm256_setr_epi32(g(0), g(1), g(2), g(3), g(4), g(5), g(6), g(7))
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_iq3_s_imp(w: &[u8], a: &[u8]) -> f32 {
    let mut accumf = _mm256_setzero_ps();
    for (x, y) in w.chunks_exact(IQ3_S_BYTES).zip(a.chunks_exact(Q8_K_BYTES)) {
        let d = h2f(x, 0) * rd_f32(y, 0);
        let mut sumi1 = _mm256_setzero_si256();
        let mut sumi2 = _mm256_setzero_si256();
        for ib in (0..8).step_by(2) {
            // sub-block ib's sign bits: u32 ib of `signs` (bytes 74..106)
            let q8s_1 = apply_sign_bits(rd_u32(x, 74 + 4 * ib), ld256(y, 4 + 32 * ib));
            let q8s_2 = apply_sign_bits(rd_u32(x, 74 + 4 * (ib + 1)), ld256(y, 4 + 32 * (ib + 1)));
            let [q2_1, q2_2] = iq3s_magnitudes(x, ib);
            let dot1 = _mm256_maddubs_epi16(q2_1, q8s_1);
            let dot2 = _mm256_maddubs_epi16(q2_2, q8s_2);
            let p1 = _mm256_madd_epi16(dot1, _mm256_set1_epi16(iq3s_scale(x, ib) as i16));
            let p2 = _mm256_madd_epi16(dot2, _mm256_set1_epi16(iq3s_scale(x, ib + 1) as i16));
            sumi1 = _mm256_add_epi32(sumi1, p1);
            sumi2 = _mm256_add_epi32(sumi2, p2);
        }
        accumf = _mm256_fmadd_ps(
            _mm256_set1_ps(d),
            _mm256_cvtepi32_ps(_mm256_add_epi32(sumi1, sumi2)),
            accumf,
        );
    }
    hsum_float_8(accumf)
}

/// The grid rows (8 values -1/0/1 each) of the 8 groups of two sub-blocks from their grid
/// indices (32-bit lanes, below 2048): groups 0..4 in the 64-bit lanes of the first vector,
/// 4..8 in the second.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn iq1_rows(idx: __m256i) -> [__m256i; 2] {
    let mut a = [0u32; 8];
    // SAFETY: `a` is 32 writable bytes; `storeu` has no alignment requirement.
    unsafe { _mm256_storeu_si256(a.as_mut_ptr().cast(), idx) };
    let g = |k: usize| IQ1S_GRID[a[k] as usize & 2047] as i64;
    [
        _mm256_set_epi64x(g(3), g(2), g(1), g(0)),
        _mm256_set_epi64x(g(7), g(6), g(5), g(4)),
    ]
}

/// The 8 low index bytes of two sub-blocks (`qs` at byte `off`) as 32-bit lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn qs8(x: &[u8], off: usize) -> __m256i {
    _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(
        u64::from_le_bytes(x[off..off + 8].try_into().unwrap()) as i64,
    ))
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_iq1_s_imp(w: &[u8], a: &[u8]) -> f32 {
    // group l of a sub-block takes bits 3l..3l+3 of its qh word
    let shift = _mm256_setr_epi32(0, 3, 6, 9, 0, 3, 6, 9);
    let seven = _mm256_set1_epi32(7);
    let mut accum = _mm256_setzero_ps();
    let mut accum1 = 0f32;
    for (x, y) in w.chunks_exact(IQ1_S_BYTES).zip(a.chunks_exact(Q8_K_BYTES)) {
        let qh: [u16; 8] = core::array::from_fn(|ib| rd_u16(x, 34 + 2 * ib));
        let bsums: [i32; 16] = core::array::from_fn(|j| rd_i16(y, 260 + 2 * j) as i32);
        let mut sumi = _mm256_setzero_si256();
        let mut sumi1 = 0i32;
        for ib in (0..8).step_by(2) {
            let (h1, h2) = (qh[ib] as i32, qh[ib + 1] as i32);
            let hi = _mm256_srlv_epi32(_mm256_setr_epi32(h1, h1, h1, h1, h2, h2, h2, h2), shift);
            let idx = _mm256_or_si256(
                qs8(x, 2 + 4 * ib),
                _mm256_slli_epi32::<8>(_mm256_and_si256(hi, seven)),
            );
            let [q1b_1, q1b_2] = iq1_rows(idx);
            let dot1 = mul_add_epi8(q1b_1, ld256(y, 4 + 32 * ib));
            let dot2 = mul_add_epi8(q1b_2, ld256(y, 4 + 32 * (ib + 1)));
            let (ls1, ls2) = (iq1s_scale(qh[ib]), iq1s_scale(qh[ib + 1]));
            let p1 = _mm256_madd_epi16(dot1, _mm256_set1_epi16(ls1 as i16));
            let p2 = _mm256_madd_epi16(dot2, _mm256_set1_epi16(ls2 as i16));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p1, p2));
            let sign = |qh: u16| if qh & 0x8000 != 0 { -1 } else { 1 };
            sumi1 += (bsums[2 * ib] + bsums[2 * ib + 1]) * sign(qh[ib]) * ls1
                + (bsums[2 * ib + 2] + bsums[2 * ib + 3]) * sign(qh[ib + 1]) * ls2;
        }
        let d = rd_f32(y, 0) * h2f(x, 0);
        accum = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), accum);
        // GCC contracts `accum1 += d * sumi1`
        accum1 = d.mul_add(sumi1 as f32, accum1);
    }
    hsum_float_8(accum) + IQ1_DELTA * accum1
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_iq1_m_imp(w: &[u8], a: &[u8]) -> f32 {
    let mask = _mm256_set1_epi16(0x7);
    let mone = _mm256_set1_epi16(1);
    let mone8 = _mm256_set1_epi8(1);
    let mtwo8 = _mm256_set1_epi8(2);
    // the 16 3-bit scales as i16: the low 128 bits hold the first halves' (shift 0 for even,
    // 6 for odd sub-blocks), the high 128 bits the second halves' (3, 9)
    let scales_shift = _mm256_set_epi64x(9, 3, 6, 0);
    // group g of a pair of sub-blocks: index bits 4g..4g+3 and delta sign bit 4g+3 of their qh
    let idx_shift = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    let seven = _mm256_set1_epi32(7);
    let sign_shift1 = _mm256_setr_epi64x(3, 7, 11, 15);
    let sign_shift2 = _mm256_setr_epi64x(19, 23, 27, 31);
    let one64 = _mm256_set1_epi64x(1);
    let mut accum1 = _mm256_setzero_ps();
    let mut accum2 = _mm256_setzero_ps();
    for (x, y) in w.chunks_exact(IQ1_M_BYTES).zip(a.chunks_exact(Q8_K_BYTES)) {
        let sc = u64::from_le_bytes(x[48..56].try_into().unwrap());
        let mut scales = _mm256_srlv_epi64(_mm256_set1_epi64x(sc as i64), scales_shift);
        scales = _mm256_add_epi16(_mm256_slli_epi16::<1>(_mm256_and_si256(scales, mask)), mone);
        // shuffle indices repeating one i16 scale per 128-bit half, advanced by one i16 per
        // pair of sub-blocks
        let mut scales_idx1 = _mm256_set1_epi16(0x0100);
        let mut scales_idx2 = _mm256_add_epi8(scales_idx1, _mm256_set1_epi8(8));
        let mut sumi1 = _mm256_setzero_si256();
        let mut sumi2 = _mm256_setzero_si256();
        for ib in (0..8).step_by(2) {
            // the 4 qh bytes of the two sub-blocks: a nibble per group, 3 index bits and the
            // delta sign
            let q32 = rd_u32(x, 32 + 2 * ib) as i32;
            let hi = _mm256_srlv_epi32(_mm256_set1_epi32(q32), idx_shift);
            let idx = _mm256_or_si256(
                qs8(x, 4 * ib),
                _mm256_slli_epi32::<8>(_mm256_and_si256(hi, seven)),
            );
            let [q1b_1, q1b_2] = iq1_rows(idx);
            // all bytes of group l's 64-bit lane -1 where its delta is negative, else 1
            let delta = |shift: __m256i| {
                let bit = _mm256_and_si256(
                    _mm256_srlv_epi64(_mm256_set1_epi64x(q32 as i64), shift),
                    one64,
                );
                _mm256_or_si256(_mm256_cmpeq_epi64(bit, one64), mone8)
            };
            let (delta1, delta2) = (delta(sign_shift1), delta(sign_shift2));
            let q8b_1 = ld256(y, 4 + 32 * ib);
            let q8b_2 = ld256(y, 4 + 32 * (ib + 1));
            let dot1 = mul_add_epi8(q1b_1, q8b_1);
            let dot2 = mul_add_epi8(q1b_2, q8b_2);
            let dot3 = _mm256_maddubs_epi16(mone8, _mm256_sign_epi8(q8b_1, delta1));
            let dot4 = _mm256_maddubs_epi16(mone8, _mm256_sign_epi8(q8b_2, delta2));
            let scale1 = _mm256_shuffle_epi8(scales, scales_idx1);
            let scale2 = _mm256_shuffle_epi8(scales, scales_idx2);
            scales_idx1 = _mm256_add_epi8(scales_idx1, mtwo8);
            scales_idx2 = _mm256_add_epi8(scales_idx2, mtwo8);
            let p1 = _mm256_madd_epi16(dot1, scale1);
            let p2 = _mm256_madd_epi16(dot2, scale2);
            let p3 = _mm256_madd_epi16(dot3, scale1);
            let p4 = _mm256_madd_epi16(dot4, scale2);
            sumi1 = _mm256_add_epi32(sumi1, _mm256_add_epi32(p1, p2));
            sumi2 = _mm256_add_epi32(sumi2, _mm256_add_epi32(p3, p4));
        }
        let d = _mm256_set1_ps(rd_f32(y, 0) * fp16_to_f32(iq1m_scale_bits(x)));
        accum1 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi1), accum1);
        accum2 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi2), accum2);
    }
    // GCC contracts `hsum1 + IQ1M_DELTA * hsum2`
    hsum_float_8(accum2).mul_add(IQ1_DELTA, hsum_float_8(accum1))
}
