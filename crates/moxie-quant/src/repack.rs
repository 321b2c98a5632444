//! Interleaved-row weight layouts for one-token products (decode), built once at load time.
//!
//! In GGUF order each weight row is contiguous, so a one-token product is one dot product per
//! row: every row unpacks its own scales, multiplies by the same activations and ends in a
//! horizontal sum. That is compute-bound well below memory bandwidth on 2 cores (Q4_K: ~19 GB/s
//! per core). Here 16 rows are interleaved four bytes at a time, as the int8 GEMM's tiles are
//! (`gemm.rs`), but still 4-bit: one 64-byte load holds the same four bytes of 16 rows, two
//! `vpdpbusd` with a broadcast activation word multiply them, and the 16 results stay in the 16
//! lanes of one register, so nothing is reduced horizontally and each activation load feeds 16
//! rows. The repacked matrix has exactly the bytes of the original (ik_llama.cpp's `_R4` /
//! `_R8` types, `-rtr`, do the same with 4 or 8 rows).
//!
//! Q4_K as Q4_K x16 (`Q4_K_R16`): for each group of 16 rows and each 256-element super-block,
//! 2304 bytes:
//! - `d`: 16 x f16, then `dmin`: 16 x f16 (64 bytes);
//! - the 12 packed scale/min bytes as three little-endian words per row, word-major
//!   (`[word 0..3][row 0..16]` u32, 192 bytes), so the 16 rows' 6-bit scales and mins come out
//!   of three loads with ggml's `utmp` shuffle done on 16 lanes;
//! - the 128 quant bytes as `[chunk j 0..4][group g 0..8][row 0..16][4 bytes]` (2048 bytes):
//!   bytes `32j + 4g .. 32j + 4g + 4` of each row, whose low nibbles are elements
//!   `64j + 4g ..+4` (sub-block `2j`) and high nibbles elements `64j + 32 + 4g ..+4`
//!   (sub-block `2j + 1`).
//!
//! The products are exact integers per sub-block (as in ggml) and the float work per row is
//! `acc += (d * y.d) * Σ_s sc_s·isum_s`, `acc_m += (dmin * y.d) * Σ_s m_s·bsum_s` per
//! super-block, then `acc - acc_m`: ggml's terms, summed in another order, so results agree
//! with `vec_dot` to float rounding (fast numerics only; `--exact` keeps GGUF order).

use crate::common::{rd_f16, rd_f32, rd_i16, rd_u32};
use crate::GgmlType;

/// Rows interleaved per group.
pub const REPACK_ROWS: usize = 16;

const Q4K_BLOCK: usize = 144;
const Q8K_BLOCK: usize = 292;
/// Bytes of one 16-row group's super-block.
const Q4K_GROUP_BLOCK: usize = REPACK_ROWS * Q4K_BLOCK;

/// The weight types with an interleaved layout here.
pub fn repack_supports(ty: GgmlType, n_rows: usize, n_in: usize) -> bool {
    ty == GgmlType::Q4_K && n_rows.is_multiple_of(REPACK_ROWS) && n_in.is_multiple_of(256)
}

/// `src` (`n_rows` GGUF rows of `n_in` Q4_K values) interleaved into `dst` (same size), group
/// after group. Panics unless [`repack_supports`] and the sizes match.
pub fn repack_q4_k(src: &[u8], n_rows: usize, n_in: usize, dst: &mut [u8]) {
    assert!(repack_supports(GgmlType::Q4_K, n_rows, n_in));
    let nb = n_in / 256;
    let row_bytes = nb * Q4K_BLOCK;
    assert!(src.len() == n_rows * row_bytes && dst.len() == src.len());
    for (group, out) in src
        .chunks_exact(REPACK_ROWS * row_bytes)
        .zip(dst.chunks_exact_mut(REPACK_ROWS * row_bytes))
    {
        for (b, o) in out.chunks_exact_mut(Q4K_GROUP_BLOCK).enumerate() {
            let block = |r: usize| &group[r * row_bytes + b * Q4K_BLOCK..][..Q4K_BLOCK];
            for r in 0..REPACK_ROWS {
                let x = block(r);
                o[2 * r..2 * r + 2].copy_from_slice(&x[0..2]);
                o[32 + 2 * r..32 + 2 * r + 2].copy_from_slice(&x[2..4]);
                for w in 0..3 {
                    let at = 64 + 64 * w + 4 * r;
                    o[at..at + 4].copy_from_slice(&x[4 + 4 * w..8 + 4 * w]);
                }
                for j in 0..4 {
                    for g in 0..8 {
                        let at = 256 + (j * 8 + g) * 64 + 4 * r;
                        let from = 16 + 32 * j + 4 * g;
                        o[at..at + 4].copy_from_slice(&x[from..from + 4]);
                    }
                }
            }
        }
    }
}

/// The inverse of [`repack_q4_k`] (tests, and writing GGUF order back).
pub fn unrepack_q4_k(src: &[u8], n_rows: usize, n_in: usize, dst: &mut [u8]) {
    assert!(repack_supports(GgmlType::Q4_K, n_rows, n_in));
    let nb = n_in / 256;
    let row_bytes = nb * Q4K_BLOCK;
    assert!(src.len() == n_rows * row_bytes && dst.len() == src.len());
    for (group, out) in src
        .chunks_exact(REPACK_ROWS * row_bytes)
        .zip(dst.chunks_exact_mut(REPACK_ROWS * row_bytes))
    {
        for (b, o) in group.chunks_exact(Q4K_GROUP_BLOCK).enumerate() {
            for r in 0..REPACK_ROWS {
                let x = &mut out[r * row_bytes + b * Q4K_BLOCK..][..Q4K_BLOCK];
                x[0..2].copy_from_slice(&o[2 * r..2 * r + 2]);
                x[2..4].copy_from_slice(&o[32 + 2 * r..32 + 2 * r + 2]);
                for w in 0..3 {
                    let at = 64 + 64 * w + 4 * r;
                    x[4 + 4 * w..8 + 4 * w].copy_from_slice(&o[at..at + 4]);
                }
                for j in 0..4 {
                    for g in 0..8 {
                        let at = 256 + (j * 8 + g) * 64 + 4 * r;
                        let to = 16 + 32 * j + 4 * g;
                        x[to..to + 4].copy_from_slice(&o[at..at + 4]);
                    }
                }
            }
        }
    }
}

/// The 16 products of one repacked row group (`group`: `n_in / 256` super-blocks of 2304
/// bytes) with one Q8_K activation row `act`, into `out`. Runs the AVX-512 VNNI kernel where
/// the CPU has it, else [`gemv_q4_k_r16_scalar`] (the same arithmetic, bit for bit).
pub fn gemv_q4_k_r16(n_in: usize, group: &[u8], act: &[u8], out: &mut [f32; REPACK_ROWS]) {
    let nb = n_in / 256;
    let group = &group[..nb * Q4K_GROUP_BLOCK];
    let act = &act[..nb * Q8K_BLOCK];
    #[cfg(target_arch = "x86_64")]
    if crate::simd_level() == crate::SimdLevel::Avx512 {
        // SAFETY: the AVX-512 level is only reported after AVX-512 F/BW/VL/VNNI were detected at
        // run time; the slices hold exactly `nb` blocks (checked by the slicing above).
        unsafe { avx512::gemv_q4_k_r16(group, act, out) };
        return;
    }
    gemv_q4_k_r16_scalar(group, act, out);
}

/// Portable [`gemv_q4_k_r16`]: per row, exact integer sums per sub-block, then ggml's two
/// float terms per super-block.
pub fn gemv_q4_k_r16_scalar(group: &[u8], act: &[u8], out: &mut [f32; REPACK_ROWS]) {
    let mut acc = [0f32; REPACK_ROWS];
    let mut acc_m = [0f32; REPACK_ROWS];
    for (o, y) in group
        .chunks_exact(Q4K_GROUP_BLOCK)
        .zip(act.chunks_exact(Q8K_BLOCK))
    {
        let yd = rd_f32(y, 0);
        let yq = |i: usize| y[4 + i] as i8 as i32;
        let bsum32 = |s: usize| rd_i16(y, 260 + 4 * s) as i32 + rd_i16(y, 262 + 4 * s) as i32;
        for r in 0..REPACK_ROWS {
            let word = |w: usize| rd_u32(o, 64 + 64 * w + 4 * r);
            let (sc, mn) = unpack_scales_mins(word(0), word(1), word(2));
            let (mut sumi, mut summ) = (0i32, 0i32);
            for j in 0..4 {
                let (mut lo, mut hi) = (0i32, 0i32);
                for g in 0..8 {
                    let q = &o[256 + (j * 8 + g) * 64 + 4 * r..][..4];
                    for (i, &b) in q.iter().enumerate() {
                        lo += (b & 0xF) as i32 * yq(64 * j + 4 * g + i);
                        hi += (b >> 4) as i32 * yq(64 * j + 32 + 4 * g + i);
                    }
                }
                sumi += lo * sc[2 * j] + hi * sc[2 * j + 1];
            }
            for s in 0..8 {
                summ += mn[s] * bsum32(s);
            }
            let d = rd_f16(o, 2 * r) * yd;
            let dmin = rd_f16(o, 32 + 2 * r) * yd;
            acc[r] = d.mul_add(sumi as f32, acc[r]);
            acc_m[r] = dmin.mul_add(summ as f32, acc_m[r]);
        }
    }
    for r in 0..REPACK_ROWS {
        out[r] = acc[r] - acc_m[r];
    }
}

/// The 8 scales and 8 mins of a Q4_K super-block from its three packed words
/// (`get_scale_min_k4`, as ggml's `utmp` shuffle computes them).
fn unpack_scales_mins(u0: u32, u1: u32, u2: u32) -> ([i32; 8], [i32; 8]) {
    const M1: u32 = 0x3f3f_3f3f;
    const M2: u32 = 0x0f0f_0f0f;
    const M3: u32 = 0x0303_0303;
    let words = [
        u0 & M1,
        (u2 & M2) | (((u0 >> 6) & M3) << 4),
        u1 & M1,
        ((u2 >> 4) & M2) | (((u1 >> 6) & M3) << 4),
    ];
    let byte = |w: u32, i: usize| ((w >> (8 * i)) & 0xFF) as i32;
    let mut sc = [0i32; 8];
    let mut mn = [0i32; 8];
    for i in 0..4 {
        sc[i] = byte(words[0], i);
        sc[4 + i] = byte(words[1], i);
        mn[i] = byte(words[2], i);
        mn[4 + i] = byte(words[3], i);
    }
    (sc, mn)
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use core::arch::x86_64::*;

    use super::{Q4K_GROUP_BLOCK, Q8K_BLOCK, REPACK_ROWS};
    use crate::common::{rd_f32, rd_i16, rd_u32};

    /// 64 bytes at `off` of `s`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    fn ld(s: &[u8], off: usize) -> __m512i {
        let s: &[u8; 64] = s[off..off + 64].try_into().unwrap();
        // SAFETY: `s` is exactly 64 readable bytes; `loadu` has no alignment requirement.
        unsafe { _mm512_loadu_si512(s.as_ptr().cast()) }
    }

    /// 16 f16 at `off` of `s` as f32.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    fn ld_f16(s: &[u8], off: usize) -> __m512 {
        let s: &[u8; 32] = s[off..off + 32].try_into().unwrap();
        // SAFETY: `s` is exactly 32 readable bytes; `loadu` has no alignment requirement.
        let h = unsafe { _mm256_loadu_si256(s.as_ptr().cast()) };
        _mm512_cvtph_ps(h)
    }

    /// Byte `i` of every i32 lane, zero-extended.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    fn lane_byte(v: __m512i, i: u32) -> __m512i {
        _mm512_and_si512(
            _mm512_srlv_epi32(v, _mm512_set1_epi32(8 * i as i32)),
            _mm512_set1_epi32(0xFF),
        )
    }

    /// See [`super::gemv_q4_k_r16`]; `group` and `act` hold the same number of super-blocks.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) fn gemv_q4_k_r16(group: &[u8], act: &[u8], out: &mut [f32; REPACK_ROWS]) {
        let m4 = _mm512_set1_epi8(0xF);
        let (m1, m2, m3) = (
            _mm512_set1_epi32(0x3f3f_3f3f),
            _mm512_set1_epi32(0x0f0f_0f0f),
            _mm512_set1_epi32(0x0303_0303),
        );
        let mut acc = _mm512_setzero_ps();
        let mut acc_m = _mm512_setzero_ps();
        for (o, y) in group
            .chunks_exact(Q4K_GROUP_BLOCK)
            .zip(act.chunks_exact(Q8K_BLOCK))
        {
            let yd = _mm512_set1_ps(rd_f32(y, 0));
            let d = _mm512_mul_ps(ld_f16(o, 0), yd);
            let dmin = _mm512_mul_ps(ld_f16(o, 32), yd);
            let (u0, u1, u2) = (ld(o, 64), ld(o, 128), ld(o, 192));
            // ggml's utmp words on 16 lanes: scales 0..3, 4..7, mins 0..3, 4..7 (a byte each)
            let sc_lo = _mm512_and_si512(u0, m1);
            let sc_hi = _mm512_or_si512(
                _mm512_and_si512(u2, m2),
                _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u0), m3)),
            );
            let mn_lo = _mm512_and_si512(u1, m1);
            let mn_hi = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi32::<4>(u2), m2),
                _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u1), m3)),
            );
            let mut sumi = _mm512_setzero_si512();
            let mut summ = _mm512_setzero_si512();
            for j in 0..4 {
                let mut lo = _mm512_setzero_si512();
                let mut hi = _mm512_setzero_si512();
                for g in 0..8 {
                    let q = ld(o, 256 + (j * 8 + g) * 64);
                    let ql = _mm512_and_si512(q, m4);
                    let qh = _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4);
                    let ya = _mm512_set1_epi32(rd_u32(y, 4 + 64 * j + 4 * g) as i32);
                    let yb = _mm512_set1_epi32(rd_u32(y, 4 + 64 * j + 32 + 4 * g) as i32);
                    lo = _mm512_dpbusd_epi32(lo, ql, ya);
                    hi = _mm512_dpbusd_epi32(hi, qh, yb);
                }
                let scales = if j < 2 { sc_lo } else { sc_hi };
                let mins = if j < 2 { mn_lo } else { mn_hi };
                let (s0, s1) = ((2 * j % 4) as u32, (2 * j % 4 + 1) as u32);
                sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(lo, lane_byte(scales, s0)));
                sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(hi, lane_byte(scales, s1)));
                let bsum = |s: usize| rd_i16(y, 260 + 4 * s) as i32 + rd_i16(y, 262 + 4 * s) as i32;
                summ = _mm512_add_epi32(
                    summ,
                    _mm512_mullo_epi32(lane_byte(mins, s0), _mm512_set1_epi32(bsum(2 * j))),
                );
                summ = _mm512_add_epi32(
                    summ,
                    _mm512_mullo_epi32(lane_byte(mins, s1), _mm512_set1_epi32(bsum(2 * j + 1))),
                );
            }
            acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc);
            acc_m = _mm512_fmadd_ps(dmin, _mm512_cvtepi32_ps(summ), acc_m);
        }
        let r = _mm512_sub_ps(acc, acc_m);
        // SAFETY: `out` is 16 f32 = 64 writable bytes; `storeu` has no alignment requirement.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), r) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// Random Q4_K rows (quantized from random values) and Q8_K activations.
    fn data(n_rows: usize, n_in: usize, seed: &mut u64) -> (Vec<u8>, Vec<u8>) {
        let ty = GgmlType::Q4_K;
        let rb = ty.row_bytes(n_in as u64).unwrap() as usize;
        let mut w = vec![0u8; n_rows * rb];
        let q = crate::quantize_weights_fn(ty).unwrap();
        for row in w.chunks_exact_mut(rb) {
            let x: Vec<f32> = (0..n_in).map(|_| lcg(seed)).collect();
            q(&x, row);
        }
        let x: Vec<f32> = (0..n_in).map(|_| lcg(seed) * 3.0).collect();
        let act = GgmlType::Q8_K;
        let mut a = vec![0u8; act.row_bytes(n_in as u64).unwrap() as usize];
        crate::quantize_fn(act).unwrap()(&x, &mut a);
        (w, a)
    }

    #[test]
    fn repack_round_trips() {
        let mut seed = 3;
        let (n_rows, n_in) = (32, 512);
        let (w, _) = data(n_rows, n_in, &mut seed);
        let mut r = vec![0u8; w.len()];
        repack_q4_k(&w, n_rows, n_in, &mut r);
        assert_ne!(r, w);
        let mut back = vec![0u8; w.len()];
        unrepack_q4_k(&r, n_rows, n_in, &mut back);
        assert_eq!(back, w);
    }

    /// The interleaved kernels equal `vec_dot` to float rounding, and the SIMD kernel equals
    /// the scalar one bit for bit.
    #[test]
    fn gemv_matches_vec_dot() {
        let mut seed = 11;
        let (n_rows, n_in) = (48, 1536);
        let (w, a) = data(n_rows, n_in, &mut seed);
        let mut r = vec![0u8; w.len()];
        repack_q4_k(&w, n_rows, n_in, &mut r);
        let rb = w.len() / n_rows;
        let dot = crate::vec_dot_fn(GgmlType::Q4_K).unwrap();
        for (gi, group) in r.chunks_exact(REPACK_ROWS * rb).enumerate() {
            let mut got = [0f32; REPACK_ROWS];
            gemv_q4_k_r16(n_in, group, &a, &mut got);
            let mut scalar = [0f32; REPACK_ROWS];
            gemv_q4_k_r16_scalar(group, &a, &mut scalar);
            assert_eq!(got.map(f32::to_bits), scalar.map(f32::to_bits));
            for (i, &g) in got.iter().enumerate() {
                let row = gi * REPACK_ROWS + i;
                let want = dot(n_in, &w[row * rb..(row + 1) * rb], &a);
                assert!(
                    (g - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "row {row}: {g} vs vec_dot {want}"
                );
            }
        }
    }
}
