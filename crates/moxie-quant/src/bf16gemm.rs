//! BF16 matrix products for one-token attention over a long cache (moxie's fast numerics):
//! scores = Q·Kᵀ and out = P·V with bf16 operands and f32 sums. On CPUs with AVX512_BF16 each
//! `VDPBF16PS` does 32 multiply-adds, twice the f32 FMA rate, and the operands are half the
//! bytes; that is what lets decode at depth keep up (issue 17). Without the instruction the
//! portable loops compute the same products (bf16 values, f32 sums) in a simpler order, so
//! callers pick this path only where [`bf16_products_fast`] says it pays.
//!
//! Operands are bf16 bit patterns (`u16`). [`f16_to_bf16`] and [`f32_to_bf16`] round to
//! nearest even.

use crate::f16::{f32_to_bf16 as f32_to_bf16_one, fp16_to_f32};
use crate::f32gemm::check;

/// Whether the products below run on `VDPBF16PS` (AVX512_BF16 at the AVX-512 level).
pub fn bf16_products_fast() -> bool {
    crate::simd_level() == crate::SimdLevel::Avx512 && crate::simd::has_avx512_bf16()
}

/// f16 values (little-endian bytes) to bf16, `dst.len()` of them.
pub fn f16_to_bf16(src: &[u8], dst: &mut [u16]) {
    let src = &src[..dst.len() * 2];
    #[cfg(target_arch = "x86_64")]
    if bf16_products_fast() {
        // SAFETY: AVX-512F and AVX512_BF16 are present (bf16_products_fast); `src` holds
        // `dst.len()` halves (sliced above).
        unsafe { avx512::f16_to_bf16(src, dst) };
        return;
    }
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = f32_to_bf16_one(fp16_to_f32(u16::from_le_bytes([s[0], s[1]])));
    }
}

/// Rows of f16 values to bf16: row `i` is `width` values at byte `i * stride` of `src`, and
/// goes to `dst[i * width..]` (`dst.len() / width` rows). One call for a block of positions
/// of one kv head, whose rows are strided in the cache.
pub fn f16_rows_to_bf16(src: &[u8], stride: usize, width: usize, dst: &mut [u16]) {
    let rows = dst.len() / width;
    if rows == 0 {
        return;
    }
    let src = &src[..(rows - 1) * stride + 2 * width];
    for (i, d) in dst.chunks_exact_mut(width).enumerate() {
        f16_to_bf16(&src[i * stride..i * stride + 2 * width], d);
    }
}

/// f32 values to bf16.
pub fn f32_to_bf16(src: &[f32], dst: &mut [u16]) {
    assert_eq!(src.len(), dst.len(), "f32_to_bf16 lengths");
    #[cfg(target_arch = "x86_64")]
    if bf16_products_fast() {
        // SAFETY: as in f16_to_bf16; the lengths are equal (asserted).
        unsafe { avx512::f32_to_bf16(src, dst) };
        return;
    }
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f32_to_bf16_one(s);
    }
}

fn bf(x: u16) -> f32 {
    f32::from_bits((x as u32) << 16)
}

/// `c[i*ldc + j] = Σ_k a[i*lda + k] · b[j*ldb + k]` for `i < m`, `j < n`, `k < kd`;
/// `kd` a multiple of 32. `prefetch`: bytes to bring into L2 while the products run, one line
/// per step of 32 values (one-token attention passes the next block of the cache, so reading
/// it from memory overlaps these products; the hardware prefetcher alone does not run ahead of
/// a conversion pass).
#[allow(clippy::too_many_arguments)]
pub fn gemm_bf16_abt(
    m: usize,
    n: usize,
    kd: usize,
    a: &[u16],
    lda: usize,
    b: &[u16],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    prefetch: &[u8],
) {
    assert!(
        kd.is_multiple_of(32),
        "gemm_bf16_abt: kd {kd} is not a multiple of 32"
    );
    check(m, kd, a.len(), lda, "a");
    check(n, kd, b.len(), ldb, "b");
    check(m, n, c.len(), ldc, "c");
    #[cfg(target_arch = "x86_64")]
    if bf16_products_fast() {
        // SAFETY: AVX-512F and AVX512_BF16 are present (bf16_products_fast) and the slices
        // cover every index used (checked above).
        unsafe { avx512::abt(m, n, kd, a, lda, b, ldb, c, ldc, prefetch) };
        return;
    }
    for i in 0..m {
        for j in 0..n {
            let (x, y) = (&a[i * lda..i * lda + kd], &b[j * ldb..j * ldb + kd]);
            c[i * ldc + j] = x.iter().zip(y).map(|(&p, &q)| bf(p) * bf(q)).sum();
        }
    }
}

/// `c[i*ldc + d] = Σ_j p[i*ldp + j] · v[j*ldv + d]` for `i < m`, `d < dv`, `j < n`; `dv` a
/// multiple of 32.
#[allow(clippy::too_many_arguments)]
pub fn gemm_bf16_ab(
    m: usize,
    n: usize,
    dv: usize,
    p: &[u16],
    ldp: usize,
    v: &[u16],
    ldv: usize,
    c: &mut [f32],
    ldc: usize,
) {
    assert!(
        dv.is_multiple_of(32),
        "gemm_bf16_ab: dv {dv} is not a multiple of 32"
    );
    check(m, n, p.len(), ldp, "p");
    check(n, dv, v.len(), ldv, "v");
    check(m, dv, c.len(), ldc, "c");
    #[cfg(target_arch = "x86_64")]
    if bf16_products_fast() {
        // SAFETY: as in gemm_bf16_abt.
        unsafe { avx512::ab(m, n, dv, p, ldp, v, ldv, c, ldc) };
        return;
    }
    for i in 0..m {
        let out = &mut c[i * ldc..i * ldc + dv];
        out.fill(0.0);
        for j in 0..n {
            let w = bf(p[i * ldp + j]);
            for (o, &x) in out.iter_mut().zip(&v[j * ldv..j * ldv + dv]) {
                *o += w * bf(x);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bf16")]
    fn bh(x: __m512i) -> __m512bh {
        // SAFETY: both are 512 bits of plain data (32 bf16).
        unsafe { std::mem::transmute::<__m512i, __m512bh>(x) }
    }

    /// 32 values per step: two 16-value f16 → f32 conversions, one paired rounding to bf16.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn f16_to_bf16(src: &[u8], dst: &mut [u16]) {
        let body = dst.len() / 32 * 32;
        let (head, tail) = dst.split_at_mut(body);
        for (s, d) in src.chunks_exact(64).zip(head.chunks_exact_mut(32)) {
            let s: &[u8; 64] = s.try_into().unwrap();
            let d: &mut [u16; 32] = d.try_into().unwrap();
            // SAFETY: `s` is 64 readable bytes and `d` 64 writable ones; no alignment needed.
            unsafe {
                let lo = _mm512_cvtph_ps(_mm256_loadu_si256(s.as_ptr().cast()));
                let hi = _mm512_cvtph_ps(_mm256_loadu_si256(s.as_ptr().add(32).cast()));
                let y: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
                _mm512_storeu_si512(d.as_mut_ptr().cast(), y);
            }
        }
        for (i, d) in tail.iter_mut().enumerate() {
            let at = (body + i) * 2;
            let h = u16::from_le_bytes([src[at], src[at + 1]]);
            *d = crate::f16::f32_to_bf16(crate::f16::fp16_to_f32(h));
        }
    }

    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn f32_to_bf16(src: &[f32], dst: &mut [u16]) {
        let body = dst.len() / 16 * 16;
        let (head, tail) = dst.split_at_mut(body);
        for (s, d) in src.chunks_exact(16).zip(head.chunks_exact_mut(16)) {
            let s: &[f32; 16] = s.try_into().unwrap();
            let d: &mut [u16; 16] = d.try_into().unwrap();
            // SAFETY: `s` is 16 readable floats and `d` 16 writable bf16; no alignment needed.
            unsafe {
                let y: __m256i =
                    std::mem::transmute(_mm512_cvtneps_pbh(_mm512_loadu_ps(s.as_ptr())));
                _mm256_storeu_si256(d.as_mut_ptr().cast(), y);
            }
        }
        for (d, &s) in tail.iter_mut().zip(&src[body..]) {
            *d = crate::f16::f32_to_bf16(s);
        }
    }

    /// Sixteen 16-lane vectors to one whose lane `v` is the sum of vector `v`'s lanes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bf16")]
    fn sum_each(v: &[__m512; 16]) -> __m512 {
        // Pairs: per 128-bit lane [a(0)+a(2), b(0)+b(2), a(1)+a(3), b(1)+b(3)].
        let pair = |a: __m512, b: __m512| {
            _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b))
        };
        // Quads: per 128-bit lane the four vectors' partial sums.
        let quad = |ab: __m512, cd: __m512| {
            let (ab, cd) = (_mm512_castps_pd(ab), _mm512_castps_pd(cd));
            _mm512_add_ps(
                _mm512_castpd_ps(_mm512_unpacklo_pd(ab, cd)),
                _mm512_castpd_ps(_mm512_unpackhi_pd(ab, cd)),
            )
        };
        // Across 128-bit lanes: [x.L0+x.L1, x.L2+x.L3, y.L0+y.L1, y.L2+y.L3].
        let lanes = |x: __m512, y: __m512| {
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b10_00_10_00>(x, y),
                _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y),
            )
        };
        let q: [__m512; 4] = std::array::from_fn(|i| {
            quad(
                pair(v[4 * i], v[4 * i + 1]),
                pair(v[4 * i + 2], v[4 * i + 3]),
            )
        });
        lanes(lanes(q[0], q[1]), lanes(q[2], q[3]))
    }

    /// Q·Kᵀ in 4x4 blocks: 16 accumulators of 16 lanes over 32-element steps, then each
    /// reduced to one sum. Columns (cached positions) outside, rows (query heads) inside, so a
    /// block's four key rows are read from L2 once and stay in L1 for every row block. Rows and
    /// columns past `m`/`n` reuse the last one (computed, not stored).
    ///
    /// # Safety
    /// AVX-512F and AVX512_BF16 present; `a`, `b`, `c` cover the shapes (`f32gemm::check`);
    /// `kd` a multiple of 32.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn abt(
        m: usize,
        n: usize,
        kd: usize,
        a: &[u16],
        lda: usize,
        b: &[u16],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
        prefetch: &[u8],
    ) {
        if m == 0 || n == 0 {
            return;
        }
        let mut sums = [0f32; 16];
        let mut lines = prefetch.chunks(64);
        let (ap, bp) = (a.as_ptr(), b.as_ptr());
        for j0 in (0..n).step_by(4) {
            let cols: [usize; 4] = std::array::from_fn(|s| (j0 + s).min(n - 1) * ldb);
            for i0 in (0..m).step_by(4) {
                let rows: [usize; 4] = std::array::from_fn(|r| (i0 + r).min(m - 1) * lda);
                let mut acc = [_mm512_setzero_ps(); 16];
                for k in (0..kd).step_by(32) {
                    if let Some(line) = lines.next() {
                        _mm_prefetch::<_MM_HINT_T1>(line.as_ptr().cast());
                    }
                    // SAFETY: rows < m and columns < n, k + 32 <= kd; `check` verified that
                    // (m - 1) * lda + kd <= a.len() and (n - 1) * ldb + kd <= b.len().
                    let x: [__m512bh; 4] = std::array::from_fn(|r| unsafe {
                        bh(_mm512_loadu_si512(ap.add(rows[r] + k).cast()))
                    });
                    for (s, &col) in cols.iter().enumerate() {
                        // SAFETY: as above.
                        let y = unsafe { bh(_mm512_loadu_si512(bp.add(col + k).cast())) };
                        for r in 0..4 {
                            acc[4 * r + s] = _mm512_dpbf16_ps(acc[4 * r + s], x[r], y);
                        }
                    }
                }
                // SAFETY: `sums` is 16 writable floats.
                unsafe { _mm512_storeu_ps(sums.as_mut_ptr(), sum_each(&acc)) };
                for r in 0..4.min(m - i0) {
                    for s in 0..4.min(n - j0) {
                        c[(i0 + r) * ldc + j0 + s] = sums[4 * r + s];
                    }
                }
            }
        }
    }

    /// One pair of positions of [`ab`]: V rows `x` and `y` interleaved, times each of 8 P rows'
    /// broadcast pair `w`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bf16")]
    fn pv_pair(
        lo: &mut [__m512; 8],
        hi: &mut [__m512; 8],
        x: __m512i,
        y: __m512i,
        w: [__m512bh; 8],
    ) {
        let (vl, vh) = (
            bh(_mm512_unpacklo_epi16(x, y)),
            bh(_mm512_unpackhi_epi16(x, y)),
        );
        for r in 0..8 {
            lo[r] = _mm512_dpbf16_ps(lo[r], vl, w[r]);
            hi[r] = _mm512_dpbf16_ps(hi[r], vh, w[r]);
        }
    }

    /// P·V over pairs of positions: rows `j` and `j + 1` of V interleaved 16 bits at a time
    /// (`unpacklo/hi_epi16`) meet a broadcast pair of each P row (adjacent in P, so one 32-bit
    /// broadcast load); 8 rows of P by 32 columns of V per block. The interleave leaves columns
    /// in the order {0-3, 8-11, 16-19, 24-27} (lo) and {4-7, ...} (hi); the stores put them
    /// back. An odd last position pairs with zeros.
    ///
    /// # Safety
    /// AVX-512F and AVX512_BF16 present; `p`, `v`, `c` cover the shapes (`f32gemm::check`);
    /// `dv` a multiple of 32.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn ab(
        m: usize,
        n: usize,
        dv: usize,
        p: &[u16],
        ldp: usize,
        v: &[u16],
        ldv: usize,
        c: &mut [f32],
        ldc: usize,
    ) {
        if m == 0 || n == 0 {
            return;
        }
        let first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
        let second =
            _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
        let (pp, vp) = (p.as_ptr(), v.as_ptr());
        let pairs = n / 2 * 2;
        for i0 in (0..m).step_by(8) {
            let rows: [usize; 8] = std::array::from_fn(|r| (i0 + r).min(m - 1) * ldp);
            for d0 in (0..dv).step_by(32) {
                let mut lo = [_mm512_setzero_ps(); 8];
                let mut hi = [_mm512_setzero_ps(); 8];
                for j in (0..pairs).step_by(2) {
                    // SAFETY: j + 1 < n and d0 + 32 <= dv: (n - 1) * ldv + dv <= v.len()
                    // (`check`); each row's j + 1 < n: (m - 1) * ldp + n <= p.len().
                    unsafe {
                        let x = _mm512_loadu_si512(vp.add(j * ldv + d0).cast());
                        let y = _mm512_loadu_si512(vp.add((j + 1) * ldv + d0).cast());
                        let w = rows.map(|row| {
                            bh(_mm512_set1_epi32(
                                pp.add(row + j).cast::<i32>().read_unaligned(),
                            ))
                        });
                        pv_pair(&mut lo, &mut hi, x, y, w);
                    }
                }
                if pairs < n {
                    let j = pairs;
                    // SAFETY: j < n (as above); the pair's second half is zero.
                    unsafe {
                        let x = _mm512_loadu_si512(vp.add(j * ldv + d0).cast());
                        let w = rows.map(|row| bh(_mm512_set1_epi32(*pp.add(row + j) as i32)));
                        pv_pair(&mut lo, &mut hi, x, _mm512_setzero_si512(), w);
                    }
                }
                for r in 0..8.min(m - i0) {
                    let out: &mut [f32; 32] =
                        (&mut c[(i0 + r) * ldc + d0..][..32]).try_into().unwrap();
                    // SAFETY: `out` is 32 writable floats; `storeu` has no alignment requirement.
                    unsafe {
                        _mm512_storeu_ps(
                            out.as_mut_ptr(),
                            _mm512_permutex2var_ps(lo[r], first, hi[r]),
                        );
                        _mm512_storeu_ps(
                            out.as_mut_ptr().add(16),
                            _mm512_permutex2var_ps(lo[r], second, hi[r]),
                        );
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_data::lcg;

    fn random_bf16(s: &mut u64, n: usize) -> Vec<u16> {
        let x: Vec<f32> = (0..n).map(|_| lcg(s)).collect();
        let mut out = vec![0u16; n];
        f32_to_bf16(&x, &mut out);
        out
    }

    /// Both products against f64 sums of the same bf16 values, on shapes with edge rows and
    /// columns (and an odd count of positions for P·V).
    #[test]
    fn products_match_f64_sums() {
        let mut s = 7;
        for (m, n, kd) in [(16, 64, 576), (5, 7, 32), (1, 1, 128), (3, 33, 64)] {
            let (lda, ldb) = (kd + 32, kd);
            let a = random_bf16(&mut s, m * lda);
            let b = random_bf16(&mut s, n * ldb);
            let mut c = vec![f32::NAN; m * (n + 1)];
            gemm_bf16_abt(m, n, kd, &a, lda, &b, ldb, &mut c, n + 1, &[]);
            for i in 0..m {
                for j in 0..n {
                    let want: f64 = (0..kd)
                        .map(|k| bf(a[i * lda + k]) as f64 * bf(b[j * ldb + k]) as f64)
                        .sum();
                    let got = c[i * (n + 1) + j] as f64;
                    assert!(
                        (got - want).abs() < 1e-4 * (kd as f64).sqrt(),
                        "abt {m}x{n}x{kd} [{i},{j}]: {got} vs {want}"
                    );
                }
            }
        }
        for (m, n, dv) in [(16, 64, 512), (5, 7, 32), (9, 1, 64), (8, 33, 96)] {
            let (ldp, ldv) = (n + 3, dv + 64);
            let p = random_bf16(&mut s, m * ldp);
            let v = random_bf16(&mut s, n * ldv);
            let mut c = vec![f32::NAN; m * dv];
            gemm_bf16_ab(m, n, dv, &p, ldp, &v, ldv, &mut c, dv);
            for i in 0..m {
                for d in 0..dv {
                    let want: f64 = (0..n)
                        .map(|j| bf(p[i * ldp + j]) as f64 * bf(v[j * ldv + d]) as f64)
                        .sum();
                    let got = c[i * dv + d] as f64;
                    assert!(
                        (got - want).abs() < 1e-4 * (n as f64).sqrt(),
                        "ab {m}x{n}x{dv} [{i},{d}]: {got} vs {want}"
                    );
                }
            }
        }
    }

    /// The conversions round to nearest even, like the scalar `f32_to_bf16`.
    #[test]
    fn conversions_round_to_nearest_even() {
        let mut s = 3;
        let x: Vec<f32> = (0..1000).map(|_| lcg(&mut s) * 1e3).collect();
        let mut got = vec![0u16; x.len()];
        f32_to_bf16(&x, &mut got);
        for (g, &v) in got.iter().zip(&x) {
            assert_eq!(*g, f32_to_bf16_one(v), "{v}");
        }
        let h: Vec<u8> = x
            .iter()
            .flat_map(|&v| crate::f16::f32_to_fp16(v).to_le_bytes())
            .collect();
        f16_to_bf16(&h, &mut got);
        for (i, g) in got.iter().enumerate() {
            let f = fp16_to_f32(u16::from_le_bytes([h[2 * i], h[2 * i + 1]]));
            assert_eq!(*g, f32_to_bf16_one(f), "{f}");
        }
    }
}
