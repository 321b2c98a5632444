//! The int8 GEMM's products on AVX2, for CPUs without AVX-512 VNNI (AMD Zen 2/3, Intel before
//! Ice Lake): the same tiles (`[n_in/4][16 rows][4]` unsigned bytes, float scales and mins per
//! sub-block and row) and activations, and the same float steps per sub-block and activation
//! block as the AVX-512 kernel, so the results are the same up to nothing: integer sums are
//! exact on both.
//!
//! A tile's 64-byte group is two 256-bit halves (rows 0..8 and 8..16). `vpdpbusd` becomes
//! `vpmaddubsw` (pairs of unsigned-by-signed byte products, into i16) and `vpmaddwd` with ones
//! (pairs of pairs, into i32). `vpmaddubsw` saturates above 32767, so:
//! - layouts whose codes fit in 4 bits (Q4_K, Q4_0, Q4_1) sum a whole sub-block's i16 pairs
//!   before widening (8 · 2 · 15 · 128 < 32768), 5 bits (Q5_K, Q5_0) 4 groups' (4 · 2 · 31 ·
//!   128), 6-bit Q6_K 2 (2 · 2 · 63 · 128);
//! - layouts of signed bytes stored with offset 128 (Q8_0, the IQ code-book types, ik_llama.cpp's
//!   types) take the signed value back (`^ 0x80`) and multiply |w| by y with w's sign, as
//!   ggml's AVX2 kernels do (activations are within ±127), widening every group; they need no
//!   offset correction.

use core::arch::x86_64::*;

use super::{GemmActs, Layout, WeightTile, GEMM_TILE_ROWS};

/// Rows per 256-bit half of a tile.
const HALF: usize = GEMM_TILE_ROWS / 2;

/// `R` tiles (1 or 2) times every token of `acts`: `out[r]` receives tile `r`'s `n_tok` runs
/// of 16 results. Prefetches `next` along the way.
///
/// # Safety
/// AVX2, FMA and F16C are present; the tiles, `acts` and `out` have the sizes
/// `super::gemm_q8_rows` checked.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tiles_times_tokens<const R: usize>(
    l: Layout,
    n_in: usize,
    w: [&WeightTile; R],
    acts: &GemmActs,
    out: [&mut [f32]; R],
    next: &[u8],
) {
    // Passes of up to 4 tokens per tile: 4 tokens x 2 halves of integer sums stay in
    // registers (16 on AVX2); the float sums are touched once per sub-block.
    const FULL: usize = 4;
    let passes = R * acts.n_tok.div_ceil(FULL);
    let per_pass = next.len().div_ceil(64 * passes.max(1)) * 64;
    let mut ahead = next.chunks(per_pass.max(64));
    // Groups summed in i16 per widening; 0: signed bytes (offset 128). 4-bit codes take a
    // whole sub-block (8), one group's weights at a time; 5- and 6-bit codes hold 4 or 2
    // groups' weights in registers per widening.
    let depth = match l.code_bits {
        _ if l.offset == 128 => 0,
        ..=4 => 8,
        5 => 4,
        _ => 2,
    };
    for (t, o) in w.into_iter().zip(out) {
        let mut t0 = 0;
        while t0 < acts.n_tok {
            let pf = ahead.next().unwrap_or(&[]);
            let left = acts.n_tok - t0;
            let o = &mut o[t0 * GEMM_TILE_ROWS..];
            // SAFETY: per this function's contract.
            t0 += unsafe {
                match (l.sub, depth) {
                    (16, 0) => pass::<16, 0>(l, n_in, t, acts, t0, o, left, pf),
                    (16, 2) => pass::<16, 2>(l, n_in, t, acts, t0, o, left, pf),
                    (16, 4) => pass::<16, 4>(l, n_in, t, acts, t0, o, left, pf),
                    (16, _) => pass::<16, 8>(l, n_in, t, acts, t0, o, left, pf),
                    (_, 0) => pass::<32, 0>(l, n_in, t, acts, t0, o, left, pf),
                    (_, 2) => pass::<32, 2>(l, n_in, t, acts, t0, o, left, pf),
                    (_, 4) => pass::<32, 4>(l, n_in, t, acts, t0, o, left, pf),
                    (_, _) => pass::<32, 8>(l, n_in, t, acts, t0, o, left, pf),
                }
            };
        }
    }
}

/// One pass of up to 4 of the `left` tokens from `t0` against tile `w`; returns the tokens
/// done.
///
/// # Safety
/// As [`tiles_times_tokens`].
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pass<const S: usize, const D: usize>(
    l: Layout,
    n_in: usize,
    w: &WeightTile,
    acts: &GemmActs,
    t0: usize,
    out: &mut [f32],
    left: usize,
    pf: &[u8],
) -> usize {
    // SAFETY: per this function's contract.
    unsafe {
        match left {
            4.. => tokens::<4, S, D>(l, n_in, w, acts, t0, out, pf),
            3 => tokens::<3, S, D>(l, n_in, w, acts, t0, out, pf),
            2 => tokens::<2, S, D>(l, n_in, w, acts, t0, out, pf),
            _ => tokens::<1, S, D>(l, n_in, w, acts, t0, out, pf),
        }
    }
}

/// Tokens `t0..t0+N` against the 16 rows of tile `w` (sub-blocks of `S` values; `D` groups
/// summed in i16 per widening, or 0: codes are signed bytes plus 128); writes `N` runs of 16
/// results into `out`.
///
/// # Safety
/// As [`tiles_times_tokens`]; `t0 + N <= acts.n_tok` and `out` holds `N` runs of 16.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tokens<const N: usize, const S: usize, const D: usize>(
    l: Layout,
    n_in: usize,
    w: &WeightTile,
    acts: &GemmActs,
    t0: usize,
    out: &mut [f32],
    pf: &[u8],
) -> usize {
    let ones = _mm256_set1_epi16(1);
    let flip = _mm256_set1_epi8(-128);
    let mut facc = [[_mm256_setzero_ps(); 2]; N];
    let super::PassActs {
        x,
        dx,
        sums,
        scaled,
        act_block,
        n_blocks,
        n_sub,
    } = acts.pass(S, t0, N);
    let per_dx = act_block / S;
    let per_sub = pf.len().div_ceil(64 * n_sub);
    // The broadcast activation word of token j at column k.
    let xw = |j: usize, k: usize| {
        // SAFETY: k + 4 <= n_in, inside token j's row of `x` (j < N).
        _mm256_set1_epi32(unsafe { x.as_ptr().add(j * n_in + k).cast::<i32>().read_unaligned() })
    };
    // The two halves of the tile's group at column k.
    let wq = |k: usize| {
        // SAFETY: the tile holds n_in/4 groups of 64 bytes; k/4 < n_in/4.
        [0, 1].map(|h| unsafe { _mm256_loadu_si256(w.q.as_ptr().add(k * 16 + 32 * h).cast()) })
    };
    for blk in 0..n_blocks {
        let mut fblk = [[_mm256_setzero_ps(); 2]; N];
        for sb in blk * per_dx..(blk + 1) * per_dx {
            super::platform::prefetch_share::<_MM_HINT_T0>(pf, sb, per_sub);
            let mut iacc = [[_mm256_setzero_si256(); 2]; N];
            if D > 0 && D != 8 && l.offset != 0 {
                // Undo the unsigned weight offset: -offset * sum(x).
                for (j, acc) in iacc.iter_mut().enumerate() {
                    // SAFETY: j < N and sb < n_sub index inside `sums`.
                    let b = unsafe { *sums.get_unchecked(j * n_sub + sb) };
                    *acc = [_mm256_set1_epi32(-l.offset * b); 2];
                }
            }
            if D == 8 {
                // 4-bit codes: every group of the sub-block summed in i16 (8 · 2 · 15 · 128 <
                // 32768), one group's weights at a time against every token, so that the
                // N x 2 sums are all that stays live (no i32 sums beside them to spill).
                let mut p = [[_mm256_setzero_si256(); 2]; N];
                for g in 0..S / 4 {
                    let k = sb * S + 4 * g;
                    let w = wq(k);
                    for (j, pj) in p.iter_mut().enumerate() {
                        let xb = xw(j, k);
                        for h in 0..2 {
                            pj[h] = _mm256_add_epi16(pj[h], _mm256_maddubs_epi16(w[h], xb));
                        }
                    }
                }
                for (j, (acc, pj)) in iacc.iter_mut().zip(p).enumerate() {
                    *acc = pj.map(|v| _mm256_madd_epi16(v, ones));
                    if l.offset != 0 {
                        // Undo the unsigned weight offset: -offset * sum(x).
                        // SAFETY: j < N and sb < n_sub index inside `sums`.
                        let b = unsafe { *sums.get_unchecked(j * n_sub + sb) };
                        let off = _mm256_set1_epi32(-l.offset * b);
                        *acc = acc.map(|v| _mm256_add_epi32(v, off));
                    }
                }
            } else if D == 0 {
                for g in 0..S / 4 {
                    let k = sb * S + 4 * g;
                    let ws = wq(k).map(|v| _mm256_xor_si256(v, flip));
                    let wa = ws.map(|v| _mm256_sign_epi8(v, v));
                    for (j, acc) in iacc.iter_mut().enumerate() {
                        let xb = xw(j, k);
                        for h in 0..2 {
                            let p = _mm256_maddubs_epi16(wa[h], _mm256_sign_epi8(xb, ws[h]));
                            acc[h] = _mm256_add_epi32(acc[h], _mm256_madd_epi16(p, ones));
                        }
                    }
                }
            } else {
                // D groups' i16 pair sums, then one widening.
                for g0 in (0..S / 4).step_by(D) {
                    let k0 = sb * S + 4 * g0;
                    let w: [[__m256i; 2]; D] = core::array::from_fn(|g| wq(k0 + 4 * g));
                    for (j, acc) in iacc.iter_mut().enumerate() {
                        let mut p = [_mm256_setzero_si256(); 2];
                        for (g, wg) in w.iter().enumerate() {
                            let xb = xw(j, k0 + 4 * g);
                            for h in 0..2 {
                                p[h] = _mm256_add_epi16(p[h], _mm256_maddubs_epi16(wg[h], xb));
                            }
                        }
                        for h in 0..2 {
                            acc[h] = _mm256_add_epi32(acc[h], _mm256_madd_epi16(p[h], ones));
                        }
                    }
                }
            }
            for h in 0..2 {
                // SAFETY: the tile holds n_sub * 16 scales (and mins).
                let sc = unsafe { _mm256_loadu_ps(w.scale.as_ptr().add(sb * 16 + HALF * h)) };
                for j in 0..N {
                    fblk[j][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[j][h]), sc, fblk[j][h]);
                }
                if l.mins {
                    // SAFETY: as above.
                    let mn = unsafe { _mm256_loadu_ps(w.min.as_ptr().add(sb * 16 + HALF * h)) };
                    for (j, acc) in facc.iter_mut().enumerate() {
                        // SAFETY: as for `sums`.
                        let xs = _mm256_set1_ps(unsafe { *scaled.get_unchecked(j * n_sub + sb) });
                        acc[h] = _mm256_fnmadd_ps(mn, xs, acc[h]);
                    }
                }
            }
        }
        for (j, (acc, f)) in facc.iter_mut().zip(fblk).enumerate() {
            // SAFETY: j < N and blk < n_blocks index inside `dx`.
            let d = _mm256_set1_ps(unsafe { *dx.get_unchecked(j * n_blocks + blk) });
            for h in 0..2 {
                acc[h] = _mm256_fmadd_ps(f[h], d, acc[h]);
            }
        }
    }
    for (j, acc) in facc.into_iter().enumerate() {
        for (h, v) in acc.into_iter().enumerate() {
            // SAFETY: `out` holds at least N runs of 16 floats (sliced at t0).
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(j * GEMM_TILE_ROWS + HALF * h), v) };
        }
    }
    N
}

/// The float scales and mins of one Q4_K or Q5_K group block `o` (16 rows, 8 sub-blocks of
/// 32) into `scale` and `min` (`[sub-block][16 rows]`, 128 each), as the portable tile fill
/// makes them: ggml's scale and min words for 8 rows a register, each 6-bit value times the
/// row's `d` (or `dmin`), rounded once.
///
/// # Safety
/// AVX2, FMA and F16C are present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_k_scales(o: &[u8], scale: &mut [f32], min: &mut [f32]) {
    use crate::repack::avx2::q4_k_scale_words;
    use crate::simd::x86_avx2::ld_f16x8;
    assert!(o.len() >= 256 && scale.len() >= 128 && min.len() >= 128);
    for h in 0..2 {
        let d = ld_f16x8(o, 16 * h);
        let dmin = ld_f16x8(o, 32 + 16 * h);
        let (sc, mn) = q4_k_scale_words(o, h);
        for s in 0..8 {
            let shift = _mm_cvtsi32_si128(8 * (s % 4) as i32);
            let byte = |w: __m256i| {
                let b = _mm256_and_si256(_mm256_srl_epi32(w, shift), _mm256_set1_epi32(0xFF));
                _mm256_cvtepi32_ps(b)
            };
            let at = 16 * s + HALF * h;
            // SAFETY: `at + 8 <= 128`, inside both outputs (asserted).
            unsafe {
                _mm256_storeu_ps(
                    scale.as_mut_ptr().add(at),
                    _mm256_mul_ps(d, byte(sc[s / 4])),
                );
                _mm256_storeu_ps(
                    min.as_mut_ptr().add(at),
                    _mm256_mul_ps(dmin, byte(mn[s / 4])),
                );
            }
        }
    }
}
