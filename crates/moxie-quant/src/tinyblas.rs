//! Dot products in the summation order of llamafile's `tinyBLAS` (ggml-cpu's `sgemm.cpp`),
//! which llama.cpp uses instead of `vec_dot` for `mul_mat` with two or more activation rows
//! (prompt processing) when the weight type is F32, F16, Q8_0, Q4_0, Q5_0 or IQ4_NL.
//!
//! The integer sums are the same as `vec_dot`'s; only the float accumulation differs:
//! * F32 / F16 (AVX-512): one 16-lane accumulator, `fma(w, a, acc)` per 16-element step,
//!   `_mm512_reduce_add_ps` at the end. Requires `n.is_multiple_of(16)` (tinyBLAS declines otherwise
//!   and ggml falls back to `vec_dot`).
//! * Q8_0-paired types (AVX2 `tinyBLAS_Q0_AVX`): eight 32-bit lanes, each the integer sum of
//!   four consecutive products of a block, `fma(d_w * d_a, lane, acc)` per block, then the
//!   256-bit horizontal sum.
//!
//! Verified against the same formulas written out by hand (tests below); the golden-logit
//! tests of moxie-core check the end result against llama.cpp.

use crate::dispatch::VecDotFn;
use crate::f16::fp16_to_f32;
use crate::iq4::KVALUES_IQ4NL;
use crate::table::row;
use crate::types::GgmlType;

/// `_mm512_reduce_add_ps` as GCC implements it (halves, quarters, then pairs): the final sum
/// of ggml's 16-lane accumulators, also used by moxie-core's softmax and attention.
#[inline]
pub fn reduce_add_16(v: &[f32; 16]) -> f32 {
    let mut t = [0f32; 8];
    for i in 0..8 {
        t[i] = v[i + 8] + v[i];
    }
    let mut u = [0f32; 4];
    for i in 0..4 {
        u[i] = t[i + 4] + t[i];
    }
    (u[0] + u[2]) + (u[1] + u[3])
}

/// `hsum(__m256)` of sgemm.cpp: 128-bit halves, then movehl + movehdup.
#[inline]
fn reduce_8(v: &[f32; 8]) -> f32 {
    let t = [v[4] + v[0], v[5] + v[1], v[6] + v[2], v[7] + v[3]];
    (t[0] + t[2]) + (t[1] + t[3])
}

#[cfg(not(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
)))]
/// Portable form of the 16-lane chains, for builds without the x86-64-v3 baseline.
mod portable {
    use super::{fp16_to_f32, reduce_add_16};

    fn f32_at(b: &[u8], i: usize) -> f32 {
        f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
    }

    fn f16_at(b: &[u8], i: usize) -> f32 {
        fp16_to_f32(u16::from_le_bytes([b[2 * i], b[2 * i + 1]]))
    }

    /// One 16-element step: `acc[l] = fma(w[l], a[l], acc[l])`; each lane is its own
    /// sequential chain, which is the order being reproduced.
    fn fma_step(acc: &mut [f32; 16], w: &[f32; 16], a: &[f32; 16]) {
        for l in 0..16 {
            acc[l] = w[l].mul_add(a[l], acc[l]);
        }
    }

    fn chains(n: usize, w: &[u8], a: &[u8], elem: usize, at: fn(&[u8], usize) -> f32) -> f32 {
        assert!(w.len() >= elem * n && a.len() >= elem * n && n.is_multiple_of(16));
        let mut acc = [0f32; 16];
        let step = 16 * elem;
        for (wc, ac) in w[..elem * n]
            .chunks_exact(step)
            .zip(a[..elem * n].chunks_exact(step))
        {
            let wv: [f32; 16] = std::array::from_fn(|l| at(wc, l));
            let av: [f32; 16] = std::array::from_fn(|l| at(ac, l));
            fma_step(&mut acc, &wv, &av);
        }
        reduce_add_16(&acc)
    }

    pub(crate) fn dot_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
        chains(n, w, a, 4, f32_at)
    }

    pub(crate) fn dot_f16(n: usize, w: &[u8], a: &[u8]) -> f32 {
        chains(n, w, a, 2, f16_at)
    }
}
#[cfg(not(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
)))]
pub(crate) use portable::{dot_f16, dot_f32};

/// AVX2 form of the same 16-lane chains (two 8-lane registers), for builds with the x86-64-v3
/// baseline the workspace sets.
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
))]
mod avx2 {
    use std::arch::x86_64::*;

    fn finish(lo: __m256, hi: __m256) -> f32 {
        let mut v = [0f32; 16];
        // SAFETY: `v` holds 16 f32; the two unaligned stores write lanes 0..8 and 8..16.
        // AVX is enabled for the whole build (cfg on this module).
        unsafe {
            _mm256_storeu_ps(v.as_mut_ptr(), lo);
            _mm256_storeu_ps(v.as_mut_ptr().add(8), hi);
        }
        super::reduce_add_16(&v)
    }

    pub(crate) fn dot_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
        assert!(w.len() >= 4 * n && a.len() >= 4 * n && n.is_multiple_of(16));
        // SAFETY: AVX2/FMA are enabled for the whole build (cfg on this module). For every
        // step i + 16 <= n and both slices hold 4n bytes (asserted), so each 32-byte
        // unaligned load is in bounds.
        unsafe {
            let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            for i in (0..n).step_by(16) {
                let wp = w.as_ptr().add(4 * i) as *const f32;
                let ap = a.as_ptr().add(4 * i) as *const f32;
                lo = _mm256_fmadd_ps(_mm256_loadu_ps(wp), _mm256_loadu_ps(ap), lo);
                hi = _mm256_fmadd_ps(_mm256_loadu_ps(wp.add(8)), _mm256_loadu_ps(ap.add(8)), hi);
            }
            finish(lo, hi)
        }
    }

    pub(crate) fn dot_f16(n: usize, w: &[u8], a: &[u8]) -> f32 {
        assert!(w.len() >= 2 * n && a.len() >= 2 * n && n.is_multiple_of(16));
        // SAFETY: AVX2/FMA/F16C are enabled for the whole build (cfg on this module). For
        // every step i + 16 <= n and both slices hold 2n bytes (asserted), so each 16-byte
        // unaligned load is in bounds.
        unsafe {
            let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            for i in (0..n).step_by(16) {
                let wp = w.as_ptr().add(2 * i) as *const __m128i;
                let ap = a.as_ptr().add(2 * i) as *const __m128i;
                let w0 = _mm256_cvtph_ps(_mm_loadu_si128(wp));
                let w1 = _mm256_cvtph_ps(_mm_loadu_si128(wp.add(1)));
                let a0 = _mm256_cvtph_ps(_mm_loadu_si128(ap));
                let a1 = _mm256_cvtph_ps(_mm_loadu_si128(ap.add(1)));
                lo = _mm256_fmadd_ps(w0, a0, lo);
                hi = _mm256_fmadd_ps(w1, a1, hi);
            }
            finish(lo, hi)
        }
    }
}
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
))]
pub(crate) use avx2::{dot_f16, dot_f32};

/// The 32 signed values of one 32-element weight block, in element order.
type Unpack = fn(&[u8], &mut [i8; 32]) -> f32;

fn unpack_q8_0(b: &[u8], q: &mut [i8; 32]) -> f32 {
    for (o, &x) in q.iter_mut().zip(&b[2..34]) {
        *o = x as i8;
    }
    fp16_to_f32(u16::from_le_bytes([b[0], b[1]]))
}

fn unpack_q4_0(b: &[u8], q: &mut [i8; 32]) -> f32 {
    for j in 0..16 {
        q[j] = (b[2 + j] & 0xf) as i8 - 8;
        q[j + 16] = (b[2 + j] >> 4) as i8 - 8;
    }
    fp16_to_f32(u16::from_le_bytes([b[0], b[1]]))
}

fn unpack_q5_0(b: &[u8], q: &mut [i8; 32]) -> f32 {
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    for j in 0..16 {
        let lo = (b[6 + j] & 0xf) | ((((qh >> j) & 1) as u8) << 4);
        let hi = (b[6 + j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
        q[j] = lo as i8 - 16;
        q[j + 16] = hi as i8 - 16;
    }
    fp16_to_f32(u16::from_le_bytes([b[0], b[1]]))
}

fn unpack_iq4_nl(b: &[u8], q: &mut [i8; 32]) -> f32 {
    for j in 0..16 {
        q[j] = KVALUES_IQ4NL[(b[2 + j] & 0xf) as usize];
        q[j + 16] = KVALUES_IQ4NL[(b[2 + j] >> 4) as usize];
    }
    fp16_to_f32(u16::from_le_bytes([b[0], b[1]]))
}

#[inline]
/// One weight row against `out.len()` Q8_0 activation rows (`stride` bytes apart), each
/// weight block unpacked once; per output the same lanes and block order as `dot_q0`.
fn many_q0(
    n: usize,
    w: &[u8],
    acts: &[u8],
    stride: usize,
    out: &mut [f32],
    unpack: Unpack,
    w_block: usize,
) {
    let nb = n / 32;
    let n_act = out.len();
    assert!(
        n.is_multiple_of(32)
            && w.len() >= nb * w_block
            && stride >= nb * 34
            && (n_act == 0 || acts.len() >= (n_act - 1) * stride + nb * 34)
    );
    let mut acc = vec![[0f32; 8]; n_act];
    let mut qw = [0i8; 32];
    for b in 0..nb {
        let dw = unpack(&w[b * w_block..(b + 1) * w_block], &mut qw);
        for (t, lanes) in acc.iter_mut().enumerate() {
            let ab = &acts[t * stride + b * 34..t * stride + (b + 1) * 34];
            let da = fp16_to_f32(u16::from_le_bytes([ab[0], ab[1]]));
            let d = dw * da;
            let qa: &[u8; 32] = ab[2..34].try_into().expect("32 quants");
            let mut sums = [0i32; 8];
            for (k, s) in sums.iter_mut().enumerate() {
                for j in 4 * k..4 * k + 4 {
                    *s += qw[j] as i32 * qa[j] as i8 as i32;
                }
            }
            for (l, s) in lanes.iter_mut().zip(sums) {
                *l = d.mul_add(s as f32, *l);
            }
        }
    }
    for (o, lanes) in out.iter_mut().zip(&acc) {
        *o = reduce_8(lanes);
    }
}

fn dot_q0(n: usize, w: &[u8], a: &[u8], unpack: Unpack, w_block: usize) -> f32 {
    let mut out = [0f32];
    many_q0(n, w, a, a.len(), &mut out, unpack, w_block);
    out[0]
}

pub(crate) fn dot_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    dot_q0(n, w, a, unpack_q8_0, 34)
}

pub(crate) fn dot_q4_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    dot_q0(n, w, a, unpack_q4_0, 18)
}

pub(crate) fn dot_q5_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    dot_q0(n, w, a, unpack_q5_0, 22)
}

pub(crate) fn dot_iq4_nl(n: usize, w: &[u8], a: &[u8]) -> f32 {
    dot_q0(n, w, a, unpack_iq4_nl, 18)
}

pub(crate) fn many_q8_0(n: usize, w: &[u8], acts: &[u8], stride: usize, out: &mut [f32]) {
    many_q0(n, w, acts, stride, out, unpack_q8_0, 34)
}

pub(crate) fn many_q4_0(n: usize, w: &[u8], acts: &[u8], stride: usize, out: &mut [f32]) {
    many_q0(n, w, acts, stride, out, unpack_q4_0, 18)
}

pub(crate) fn many_q5_0(n: usize, w: &[u8], acts: &[u8], stride: usize, out: &mut [f32]) {
    many_q0(n, w, acts, stride, out, unpack_q5_0, 22)
}

pub(crate) fn many_iq4_nl(n: usize, w: &[u8], acts: &[u8], stride: usize, out: &mut [f32]) {
    many_q0(n, w, acts, stride, out, unpack_iq4_nl, 18)
}

/// [`tinyblas_dot_fn`] for one weight row against many activation rows (each weight block
/// unpacked or loaded once), for the Q8_0-paired types and BF16; identical results per
/// output. `None` where [`tinyblas_dot_fn`] is, or the type has no such kernel.
pub fn tinyblas_dot_many_fn(ty: GgmlType, n: usize) -> Option<crate::tiled::DotManyFn> {
    let t = row(ty).dot.as_ref()?.tinyblas?;
    n.is_multiple_of(t.k_multiple).then_some(t.many?)
}

/// The tinyBLAS-order dot for `ty`, when llama.cpp would use tinyBLAS for a batched `mul_mat`
/// with rows of `n` elements; `None` means llama.cpp uses `vec_dot` ([`crate::vec_dot_fn`]).
pub fn tinyblas_dot_fn(ty: GgmlType, n: usize) -> Option<VecDotFn> {
    let t = row(ty).dot.as_ref()?.tinyblas?;
    n.is_multiple_of(t.k_multiple).then_some(t.dot)
}

/// 4 weight rows (`w`, `w_stride` bytes apart) times 4 activation rows (`a`, `a_stride`
/// apart) of `n` elements into `out[row][activation]`, each output bit for bit the dot of
/// [`tinyblas_dot_fn`] (see [`tinyblas_dot_tile_fn`]).
pub type DotTileFn = fn(usize, &[u8], usize, &[u8], usize, &mut [[f32; 4]; 4]);

/// tinyBLAS's dot of `ty` over rows of `n` 4 x 4 outputs at a time, where this CPU has such a
/// kernel (F32 on AVX-512, [`tinyblas_f32_tile`]); `None` elsewhere.
pub fn tinyblas_dot_tile_fn(ty: GgmlType, n: usize) -> Option<DotTileFn> {
    let fits = ty == GgmlType::F32 && tinyblas_dot_fn(ty, n).is_some();
    (fits && tinyblas_f32_tile_available()).then_some(tinyblas_f32_tile as DotTileFn)
}

/// Whether [`tinyblas_f32_tile`] runs here (AVX-512).
fn tinyblas_f32_tile_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::simd_level() == crate::SimdLevel::Avx512
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// tinyBLAS's F32 products ([`tinyblas_dot_fn`] of F32, `n` a multiple of 16) of 4 weight rows
/// (`w`, `w_stride` bytes apart) and 4 activation rows (`a`, `a_stride` apart), bit for bit:
/// `out[i][j]` = weight row `i` · activation row `j`. Each output keeps its one 16-lane chain,
/// now a zmm register of its own, so the 16 chains run side by side where one dot waits on
/// its chain's latency (and every load feeds four products). Panics without AVX-512 or on
/// short rows.
pub fn tinyblas_f32_tile(
    n: usize,
    w: &[u8],
    w_stride: usize,
    a: &[u8],
    a_stride: usize,
    out: &mut [[f32; 4]; 4],
) {
    assert!(n.is_multiple_of(16) && w_stride >= 4 * n && a_stride >= 4 * n);
    assert!(w.len() >= 3 * w_stride + 4 * n && a.len() >= 3 * a_stride + 4 * n);
    assert!(
        tinyblas_f32_tile_available(),
        "tinyblas_f32_tile needs AVX-512"
    );
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX-512F is present (asserted); the rows are in bounds (asserted).
    unsafe {
        avx512::f32_tile(n, w, w_stride, a, a_stride, out)
    };
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// [`super::tinyblas_f32_tile`].
    ///
    /// # Safety
    /// AVX-512F; rows `0..4` of `w` and `a` hold `n` f32 each at their strides.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn f32_tile(
        n: usize,
        w: &[u8],
        w_stride: usize,
        a: &[u8],
        a_stride: usize,
        out: &mut [[f32; 4]; 4],
    ) {
        let mut acc = [[_mm512_setzero_ps(); 4]; 4];
        let wp: [*const f32; 4] = core::array::from_fn(|i| w[i * w_stride..].as_ptr().cast());
        let ap: [*const f32; 4] = core::array::from_fn(|j| a[j * a_stride..].as_ptr().cast());
        for k in (0..n).step_by(16) {
            // SAFETY: k + 16 <= n and every row holds n f32 (the caller's contract).
            let (wv, av): ([__m512; 4], [__m512; 4]) = unsafe {
                (
                    core::array::from_fn(|i| _mm512_loadu_ps(wp[i].add(k))),
                    core::array::from_fn(|j| _mm512_loadu_ps(ap[j].add(k))),
                )
            };
            for i in 0..4 {
                for j in 0..4 {
                    acc[i][j] = _mm512_fmadd_ps(wv[i], av[j], acc[i][j]);
                }
            }
        }
        for i in 0..4 {
            for j in 0..4 {
                let mut v = [0f32; 16];
                // SAFETY: `v` is 16 writable f32.
                unsafe { _mm512_storeu_ps(v.as_mut_ptr(), acc[i][j]) };
                out[i][j] = super::reduce_add_16(&v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{dequantize_row, quantize_row};

    fn data(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                ((s >> 8) as f32 / (1u32 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// The 4 x 4 tile gives each output's `tinyblas_dot_fn` bits.
    #[test]
    fn f32_tile_matches_the_dot() {
        if !tinyblas_f32_tile_available() {
            return;
        }
        let (n, w_stride, a_stride) = (96, 4 * 96 + 8, 4 * 96 + 36);
        let bytes = |v: Vec<f32>| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let w = bytes(data(4 * w_stride / 4, 5));
        let a = bytes(data(4 * a_stride / 4, 6));
        let dot = tinyblas_dot_fn(GgmlType::F32, n).unwrap();
        let mut out = [[0f32; 4]; 4];
        tinyblas_f32_tile(n, &w, w_stride, &a, a_stride, &mut out);
        for i in 0..4 {
            for j in 0..4 {
                let want = dot(n, &w[i * w_stride..], &a[j * a_stride..]);
                assert_eq!(out[i][j].to_bits(), want.to_bits(), "({i}, {j})");
            }
        }
    }

    #[test]
    fn q0_types_agree_with_dequantized_dot() {
        let n = 256;
        let x = data(n, 1);
        let y = data(n, 2);
        let mut a = vec![0u8; GgmlType::Q8_0.row_bytes(n as u64).unwrap() as usize];
        quantize_row(GgmlType::Q8_0, &y, &mut a).unwrap();
        let mut ad = vec![0f32; n];
        dequantize_row(GgmlType::Q8_0, &a, &mut ad).unwrap();
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q5_0,
            GgmlType::IQ4_NL,
        ] {
            let mut w = vec![0u8; ty.row_bytes(n as u64).unwrap() as usize];
            crate::quantize_weights_row(ty, &x, &mut w).unwrap();
            let mut wd = vec![0f32; n];
            dequantize_row(ty, &w, &mut wd).unwrap();
            let want: f64 = wd.iter().zip(&ad).map(|(p, q)| *p as f64 * *q as f64).sum();
            let got = tinyblas_dot_fn(ty, n).unwrap()(n, &w, &a) as f64;
            assert!(
                (got - want).abs() < 1e-4 * want.abs().max(1.0),
                "{ty}: {got} vs {want}"
            );
            let vd = crate::vec_dot(ty, n, &w, &a).unwrap() as f64;
            assert!((got - vd).abs() < 1e-4 * vd.abs().max(1.0));
        }
    }

    #[test]
    fn reduce_order_is_the_tree_not_the_sequence() {
        let v: [f32; 16] = std::array::from_fn(|i| if i == 0 { 1e8 } else { 1.0 + i as f32 });
        let seq: f32 = v.iter().sum();
        let tree = reduce_add_16(&v);
        let exact: f64 = v.iter().map(|&x| x as f64).sum();
        assert!((tree as f64 - exact).abs() <= 8.0);
        assert_ne!(tree, seq);
    }

    #[test]
    fn float_types_follow_lane_order() {
        let n = 64;
        let x = data(n, 3);
        let y = data(n, 4);
        let wb: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        let ab: Vec<u8> = y.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut acc = [0f32; 16];
        for l in (0..n).step_by(16) {
            for lane in 0..16 {
                acc[lane] = x[l + lane].mul_add(y[l + lane], acc[lane]);
            }
        }
        let want = reduce_add_16(&acc);
        assert_eq!(
            tinyblas_dot_fn(GgmlType::F32, n).unwrap()(n, &wb, &ab),
            want
        );
        assert!(tinyblas_dot_fn(GgmlType::F32, 40).is_none());
        assert!(tinyblas_dot_fn(GgmlType::Q4_K, 256).is_none());
    }
}
