//! BF16 matrix products for one-token attention over a long cache (moxie's fast numerics):
//! scores = Q·Kᵀ and out = P·V with bf16 operands and f32 sums. On CPUs with AVX512_BF16 each
//! `VDPBF16PS` does 32 multiply-adds, twice the f32 FMA rate, and the operands are half the
//! bytes; that is what lets decode at depth keep up (issue 17). Without the instruction the
//! portable loops compute the same products (bf16 values, f32 sums) in a simpler order, so
//! callers pick this path only where [`bf16_products_fast`] says it pays.
//!
//! Where the CPU has AMX-BF16 (`crate::amx`), the products run on its tiles instead
//! (`tdpbf16ps`: 16 x 16 x 32 multiply-adds per instruction; 4-6x the `VDPBF16PS` rate for the
//! scores and about 2x for the weighted values on one Sapphire-Rapids-class core, see
//! docs/performance.md); the sums are f32 either way, in a different order.
//!
//! Operands are bf16 bit patterns (`u16`). [`f16_to_bf16`] and [`f32_to_bf16`] round to
//! nearest even.

use crate::f16::{f32_to_bf16 as f32_to_bf16_one, fp16_to_f32};
use crate::f32gemm::check;

/// Whether the products below run on `VDPBF16PS` (AVX512_BF16 at the AVX-512 level).
pub fn bf16_products_fast() -> bool {
    crate::simd_level() == crate::SimdLevel::Avx512 && crate::simd::has_avx512_bf16()
}

/// Whether a prompt batch's attention products take bf16 here rather than f32: on AMX tiles,
/// or on `VDPBF16PS` where it does twice an FMA's multiply-adds (AMD's Zen 4 and 5). Intel's
/// cores issue it at half the FMA rate (one `VDPBF16PS` to two FMAs a cycle, measured on a
/// Sapphire-Rapids-class Xeon with AMX denied), where the f32 products on packed queries
/// (`f32gemm::gemm_f32_abt_packed`) run 1.3-1.4x faster (docs/performance.md, session 26).
pub fn bf16_batch_products_fast() -> bool {
    crate::amx::bf16_available() || (bf16_products_fast() && !crate::simd::intel_cpu())
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

/// Positions (`n`) from which the products take the AMX tiles where they run: below it the
/// padding to whole 16 x 32 tiles costs more than it saves.
const AMX_FROM: usize = 16;

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
    if crate::amx::bf16_available() && n >= AMX_FROM {
        amx::abt(m, n, kd, a, lda, b, ldb, c, ldc, prefetch);
        return;
    }
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
    if crate::amx::bf16_available() && n >= AMX_FROM {
        amx::ab(m, n, dv, p, ldp, v, ldv, c, ldc);
        return;
    }
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
            // One-token attention converts the cache block by block as it reads it, once per
            // token, from DRAM (`crate::prefetch`).
            crate::prefetch::prefetch_ahead(s);
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
                        crate::prefetch::prefetch_l2(line);
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

/// The products on AMX tiles (`tdpbf16ps`: 16 x 16 f32 sums per tile, 32 bf16 along the sum
/// per step). Operands are repacked into the tiles' layouts in per-thread buffers (rows past
/// `m` or `n` zero), so any shape runs on whole tiles; only whole results are written back.
#[cfg(target_arch = "x86_64")]
mod amx {
    use std::cell::RefCell;

    use crate::aligned::AlignedU16;
    use crate::amx::{configure, dp_bf16, load, store, zero, TileConfig};

    thread_local! {
        /// Per-thread repacked operands and the sums of partial tiles.
        static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
    }

    /// Bytes of scratch a thread keeps between calls: one-token attention's operands (a few
    /// hundred KiB) stay, a long prompt's (MBs per thread, growing with the context) are
    /// freed when its call ends.
    const KEEP_BYTES: usize = 4 << 20;

    impl Scratch {
        fn trim(&mut self) {
            for v in [&mut self.shared, &mut self.edge, &mut self.pairs] {
                if v.capacity() * 2 > KEEP_BYTES {
                    *v = AlignedU16::new();
                }
            }
        }
    }

    #[derive(Default)]
    struct Scratch {
        /// The operand shared by every product of a step (queries, or probabilities).
        shared: AlignedU16,
        /// Zero-padded rows of the other operand where a tile would run past its end.
        edge: AlignedU16,
        /// Values in pairs of positions (the B layout of `ab`).
        pairs: AlignedU16,
        /// One tile of sums.
        sums: Vec<f32>,
    }

    /// One operand of [`accumulate`]: its first tile's rows at `at`, `stride` bytes apart;
    /// each step of 32 along the sum moves it `step` bytes.
    #[derive(Clone, Copy)]
    struct Operand {
        at: *const u8,
        stride: usize,
        step: usize,
    }

    /// C tiles tmm0..tmm(tiles - 1) = the sum over `steps` steps of `shared` times tile t's
    /// `own[t]`; `SHARED_A`: the shared operand is A (the probabilities of `ab`), else B (the
    /// queries of `abt`). The shared operand alternates between tmm3 and tmm4 and tile t's own
    /// goes to tmm(5 + t), so no tile is reloaded while a product may still read it (the tile
    /// unit would wait for the reader). One line of `lines` is prefetched per step.
    ///
    /// # Safety
    /// Tiles configured (`configure(&TileConfig::FULL)`); `tiles <= 3`; every tile read (16
    /// rows of 64 bytes from `at + i * step`, `i < steps`) readable.
    #[inline(always)]
    unsafe fn accumulate<'a, const SHARED_A: bool>(
        tiles: usize,
        steps: usize,
        shared: Operand,
        own: [Operand; 3],
        lines: &mut impl Iterator<Item = &'a [u8]>,
    ) {
        macro_rules! step {
            ($s:literal, $i:expr) => {{
                let i = $i;
                if let Some(line) = lines.next() {
                    crate::prefetch::prefetch_l2(line);
                }
                load::<$s>(shared.at.add(i * shared.step), shared.stride);
                let at = |t: usize| own[t].at.add(i * own[t].step);
                macro_rules! product {
                    ($c:literal, $o:literal) => {
                        load::<$o>(at($c), own[$c].stride);
                        if SHARED_A {
                            dp_bf16::<$c, $s, $o>();
                        } else {
                            dp_bf16::<$c, $o, $s>();
                        }
                    };
                }
                product!(0, 5);
                if tiles > 1 {
                    product!(1, 6);
                }
                if tiles > 2 {
                    product!(2, 7);
                }
            }};
        }
        // SAFETY: the caller's contract.
        unsafe {
            zero::<0>();
            zero::<1>();
            zero::<2>();
            let mut i = 0;
            while i + 2 <= steps {
                step!(3, i);
                step!(4, i + 1);
                i += 2;
            }
            if i < steps {
                step!(3, i);
            }
        }
    }

    /// Store C tile `t` (0..3) at `at`, rows `stride` bytes apart.
    ///
    /// # Safety
    /// As [`store`].
    #[inline(always)]
    unsafe fn store_sums(t: usize, at: *mut u8, stride: usize) {
        // SAFETY: the caller's contract.
        unsafe {
            match t {
                0 => store::<0>(at, stride),
                1 => store::<1>(at, stride),
                _ => store::<2>(at, stride),
            }
        }
    }

    /// [`super::gemm_bf16_abt`] on AMX: the keys (16 positions x 32 values, straight from
    /// `b`) times each group of 16 query rows laid out as 16 pairs per tile row, into sums of
    /// 16 positions x 16 rows, three position tiles per step (a fourth would have to reuse a
    /// key tile a product may still be reading: 1.7x slower on the divan bench). Positions
    /// outside, groups inside: a block of 48 keys stays in L1 for every group (prompt
    /// batches have 16 groups).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn abt(
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
        // The callers checked the shapes (`f32gemm::check`, kd a multiple of 32).
        // SAFETY: `bf16_available()` (the dispatcher's check).
        unsafe { configure(&TileConfig::FULL) };
        let groups = m.div_ceil(16);
        SCRATCH.with_borrow_mut(|s| {
            let mut lines = prefetch.chunks(64);
            s.sums.resize(256, 0.0);
            // Queries as B, per group: row p holds, for each of its 16 rows, elements 2p and
            // 2p + 1.
            s.shared.resize(groups * 16 * kd, 0);
            for (g, qt) in s.shared.chunks_exact_mut(16 * kd).enumerate() {
                let hm = (m - 16 * g).min(16);
                // SAFETY: AVX-512F is present (bf16_available implies bf16_products_fast);
                // rows 16g..16g + hm of `a` hold kd values each from h * lda (`check`).
                unsafe { query_pairs(&a[16 * g * lda..], lda, hm, kd, qt) };
            }
            // Key rows past `n` (the last block's) come from a zero-padded copy.
            let whole = n / 16 * 16;
            if whole < n {
                s.edge.clear();
                s.edge.resize(16 * kd, 0);
                for (j, row) in s.edge.chunks_exact_mut(kd).take(n - whole).enumerate() {
                    row.copy_from_slice(&b[(whole + j) * ldb..][..kd]);
                }
            }
            let key_tile = |j: usize| -> (*const u8, usize) {
                if j < whole {
                    (b[j * ldb..].as_ptr().cast(), 2 * ldb)
                } else {
                    (s.edge.as_ptr().cast(), 2 * kd)
                }
            };
            for p0 in (0..n).step_by(48) {
                let tiles = (n - p0).div_ceil(16).min(3);
                let k_tiles: [(*const u8, usize); 3] =
                    std::array::from_fn(|t| key_tile(p0 + 16 * t.min(tiles - 1)));
                for g in 0..groups {
                    let (h0, hm) = (16 * g, (m - 16 * g).min(16));
                    let queries = Operand {
                        at: s.shared[g * 16 * kd..].as_ptr().cast(),
                        stride: 64,
                        step: 1024,
                    };
                    let keys = k_tiles.map(|(at, stride)| Operand {
                        at,
                        stride,
                        step: 64,
                    });
                    // SAFETY: the tiles are configured (above); every tile read lies in
                    // `shared` (the group's 16 * kd values), in `b` (whole tiles of 16 rows of
                    // kd from a row < n, strides of ldb: the callers checked (n - 1) * ldb + kd
                    // <= b.len()) or in `edge` (16 * kd).
                    unsafe { accumulate::<false>(tiles, kd / 32, queries, keys, &mut lines) };
                    for t in 0..tiles {
                        let sums: &mut [f32; 256] = (&mut s.sums[..256]).try_into().unwrap();
                        // SAFETY: as above; `sums` holds 256 floats; the AVX-512 level is present
                        // (bf16_available implies bf16_products_fast).
                        unsafe { store_sums(t, sums.as_mut_ptr().cast(), 64) };
                        // Sums are [position][row]: transposed into `c`.
                        let j0 = p0 + 16 * t;
                        let cols = (n - j0).min(16);
                        // SAFETY: as above (the AVX-512 level).
                        unsafe { store_transposed(sums, &mut c[h0 * ldc + j0..], ldc, hm, cols) };
                    }
                }
            }
            s.trim();
        });
    }

    /// Element (j, h) of `sums` (16 x 16, [position][row]) into `c[h * ldc + j]` for rows
    /// `h < rows` and positions `j < cols`: one transpose in registers (the int8 GEMM's 32-bit
    /// lane transpose) and a masked store per row.
    ///
    /// # Safety
    /// The AVX-512 level present (`crate::simd_level()`: AVX-512 F/BW/VL/VNNI on AVX2/FMA/F16C).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn store_transposed(
        sums: &[f32; 256],
        c: &mut [f32],
        ldc: usize,
        rows: usize,
        cols: usize,
    ) {
        use std::arch::x86_64::*;
        debug_assert!(rows <= 16 && cols <= 16);
        // SAFETY: 16 loads of 16 lanes inside the 256.
        let r: [__m512i; 16] = std::array::from_fn(|i| unsafe {
            _mm512_loadu_si512(sums.as_ptr().add(16 * i).cast())
        });
        let t = crate::simd::x86_avx512_iqk::transpose_16x16(r);
        let mask = ((1u32 << cols) - 1) as u16;
        for (h, row) in t.iter().enumerate().take(rows) {
            let dst = &mut c[h * ldc..][..cols];
            // SAFETY: the mask writes the first `cols` lanes, all inside `dst`.
            unsafe { _mm512_mask_storeu_ps(dst.as_mut_ptr(), mask, _mm512_castsi512_ps(*row)) };
        }
    }

    /// `out[(p * 16 + h) * 2 + e] = a[h * lda + 2p + e]` for `h < hm` (zero for the other
    /// rows of 16), `p < kd / 2`: each row's pair `p` as one 32-bit lane, gathered.
    ///
    /// # Safety
    /// AVX-512F present; rows `h < hm` of `a` hold `kd` values from `h * lda`; `out` holds
    /// `16 * kd` values.
    #[target_feature(enable = "avx512f")]
    unsafe fn query_pairs(a: &[u16], lda: usize, hm: usize, kd: usize, out: &mut [u16]) {
        use std::arch::x86_64::*;
        debug_assert!(hm <= 16 && out.len() >= 16 * kd);
        debug_assert!(hm == 0 || (hm - 1) * lda + kd <= a.len());
        let rows = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(2 * lda as i32),
        );
        let live: __mmask16 = ((1u32 << hm) - 1) as u16;
        for p in 0..kd / 2 {
            // SAFETY: lanes h < hm read a[h * lda + 2p..+2] (in `a`); the store writes
            // out[32p..32p + 32] (inside 16 * kd).
            unsafe {
                let v = _mm512_mask_i32gather_epi32::<1>(
                    _mm512_setzero_si512(),
                    live,
                    rows,
                    a.as_ptr().add(2 * p).cast(),
                );
                _mm512_storeu_si512(out.as_mut_ptr().add(32 * p).cast(), v);
            }
        }
    }

    /// `out[(j / 2) * 2 * dv + 2d + j % 2] = v[j * ldv + d]` for `j < n`, zero for the
    /// positions from `n` to `out.len() / dv`: two positions' columns interleaved.
    ///
    /// # Safety
    /// AVX-512F and AVX-512BW present; rows `j < n` of `v` hold `dv` (a multiple of 32) values
    /// from `j * ldv`; `out.len()` is an even number of rows of `dv`, at least `n`.
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn position_pairs(v: &[u16], ldv: usize, n: usize, dv: usize, out: &mut [u16]) {
        use std::arch::x86_64::*;
        debug_assert!(dv.is_multiple_of(32) && out.len().is_multiple_of(2 * dv));
        debug_assert!(n == 0 || (n - 1) * ldv + dv <= v.len());
        // Lanes 0..31 of (x, y): x0 y0 x1 y1 ... x15 y15, then x16 y16 ... x31 y31.
        let lo = _mm512_set_epi16(
            47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37, 5, 36,
            4, 35, 3, 34, 2, 33, 1, 32, 0,
        );
        let hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
        for (pair, row) in out.chunks_exact_mut(2 * dv).enumerate() {
            let (j, ptr) = (2 * pair, v.as_ptr());
            for d in (0..dv).step_by(32) {
                // SAFETY: rows j, j + 1 are read only when below n (inside `v`), 32 values
                // from column d < dv; the stores write row[2d..2d + 64] (inside 2 * dv).
                unsafe {
                    let x = if j < n {
                        _mm512_loadu_si512(ptr.add(j * ldv + d).cast())
                    } else {
                        _mm512_setzero_si512()
                    };
                    let y = if j + 1 < n {
                        _mm512_loadu_si512(ptr.add((j + 1) * ldv + d).cast())
                    } else {
                        _mm512_setzero_si512()
                    };
                    let o = row.as_mut_ptr().add(2 * d);
                    _mm512_storeu_si512(o.cast(), _mm512_permutex2var_epi16(x, lo, y));
                    _mm512_storeu_si512(o.add(32).cast(), _mm512_permutex2var_epi16(x, hi, y));
                }
            }
        }
    }

    /// [`super::gemm_bf16_ab`] on AMX: each group of 16 probability rows (zero-padded to
    /// whole steps of 32 positions) times the values laid out in pairs of positions, into
    /// sums of 16 rows x 16 columns, three column tiles per step (as `abt`). Columns outside,
    /// groups inside: a block of 48 columns' values stays in L2 for every group.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn ab(
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
        // The callers checked the shapes (`f32gemm::check`, dv a multiple of 32).
        let n_pad = n.next_multiple_of(32);
        let groups = m.div_ceil(16);
        // SAFETY: `bf16_available()` (the dispatcher's check).
        unsafe { configure(&TileConfig::FULL) };
        SCRATCH.with_borrow_mut(|s| {
            s.sums.resize(256, 0.0);
            // Values as B: row j/2 holds, per column, positions j and j + 1 (zero past n).
            s.pairs.resize(n_pad * dv, 0);
            // SAFETY: AVX-512F and BW are present (bf16_available implies the AVX-512 level);
            // rows j < n of `v` hold dv values from j * ldv (`check`); `pairs` holds n_pad * dv
            // values.
            unsafe { position_pairs(v, ldv, n, dv, &mut s.pairs) };
            // Probabilities as A: 16 rows per group, n_pad values each (zero past n and m).
            s.shared.resize(groups * 16 * n_pad, 0);
            for (h, row) in s.shared.chunks_exact_mut(n_pad).enumerate() {
                if h < m {
                    row[..n].copy_from_slice(&p[h * ldp..][..n]);
                    row[n..].fill(0);
                } else {
                    row.fill(0);
                }
            }
            for d0 in (0..dv).step_by(48) {
                let tiles = ((dv - d0) / 16).min(3);
                let col = |t: usize| 2 * (d0 + 16 * t.min(tiles - 1));
                for g in 0..groups {
                    let (h0, hm) = (16 * g, (m - 16 * g).min(16));
                    let probs = Operand {
                        at: s.shared[g * 16 * n_pad..].as_ptr().cast(),
                        stride: 2 * n_pad,
                        step: 64,
                    };
                    let values = std::array::from_fn(|t| Operand {
                        at: s.pairs[col(t)..].as_ptr().cast(),
                        stride: 4 * dv,
                        step: 64 * dv,
                    });
                    // SAFETY: the tiles are configured (above); the A tiles lie in `shared`
                    // (the group's 16 rows of n_pad, read 32 at a time below n_pad), the B
                    // tiles in `pairs` (rows j/2 < n_pad/2 of 2 * dv values, 32 of them from
                    // column 2 * (d0 + 16t) with d0 + 16t + 16 <= dv).
                    unsafe {
                        accumulate::<true>(tiles, n_pad / 32, probs, values, &mut [].into_iter())
                    };
                    for t in 0..tiles {
                        let d = d0 + 16 * t;
                        // A whole group of rows goes straight into `c`, else through `sums`.
                        let (at, stride) = if hm == 16 {
                            (c[h0 * ldc + d..].as_mut_ptr(), 4 * ldc)
                        } else {
                            (s.sums.as_mut_ptr(), 64)
                        };
                        // SAFETY: as above; with hm == 16, rows h0..h0 + 16 of `c` hold
                        // columns d..d + 16 <= dv (the callers checked (m - 1) * ldc + dv <=
                        // c.len()); `sums` holds 256 floats.
                        unsafe { store_sums(t, at.cast(), stride) };
                        if hm < 16 {
                            for (h, row) in s.sums.chunks_exact(16).take(hm).enumerate() {
                                c[(h0 + h) * ldc + d..][..16].copy_from_slice(row);
                            }
                        }
                    }
                }
            }
            s.trim();
        });
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

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn store_transposed_writes_the_transpose_of_each_part() {
        if !crate::amx::bf16_available() {
            return;
        }
        let m: [f32; 256] = std::array::from_fn(|i| i as f32);
        for (rows, cols) in [(16, 16), (5, 16), (16, 3), (1, 1)] {
            let ldc = 19;
            let mut c = vec![-1f32; (rows - 1) * ldc + cols];
            // SAFETY: bf16_available implies the AVX-512 level.
            unsafe { super::amx::store_transposed(&m, &mut c, ldc, rows, cols) };
            for h in 0..rows {
                for j in 0..ldc.min(c.len() - h * ldc) {
                    let want = if j < cols { (16 * j + h) as f32 } else { -1.0 };
                    assert_eq!(c[h * ldc + j], want, "{rows}x{cols}: [{h}][{j}]");
                }
            }
        }
    }

    /// Both products (on AMX tiles, AVX-512 or the portable loops, whichever runs here) against
    /// f64 sums of the same bf16 values, on shapes with edge rows and columns (partial tiles on
    /// every side, an odd count of positions for P·V).
    #[test]
    fn products_match_f64_sums() {
        let mut s = 7;
        for (m, n, kd) in [
            (16, 64, 576),
            (5, 7, 32),
            (1, 1, 128),
            (3, 33, 64),
            (20, 100, 192),
            (40, 130, 576),
        ] {
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
        for (m, n, dv) in [
            (16, 64, 512),
            (5, 7, 32),
            (9, 1, 64),
            (8, 33, 96),
            (20, 100, 96),
            (33, 47, 128),
        ] {
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
