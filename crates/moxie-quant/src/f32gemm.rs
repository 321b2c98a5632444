//! Small dense f32 matrix products for attention over a batch (scores = Q·Kᵀ, out = P·V),
//! register-blocked on AVX-512 or AVX2 with a portable fallback. Summation order is this module's own
//! (moxie's fast numerics); the exact path keeps ggml's order elsewhere.

/// `c[i*ldc + j] = Σ_k a[i*lda + k] · b[j*ldb + k]` for `i < m`, `j < n`, `k < kd`.
/// `prefetch`: bytes to bring into L2 while the products run, a few lines per output tile
/// (one-token attention passes the next block of the cache, so that its conversion finds it
/// there; the hardware prefetcher alone does not run ahead of a conversion pass).
#[allow(clippy::too_many_arguments)]
pub fn gemm_f32_abt(
    m: usize,
    n: usize,
    kd: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    prefetch: &[u8],
) {
    check(m, kd, a.len(), lda, "a");
    check(n, kd, b.len(), ldb, "b");
    check(m, n, c.len(), ldc, "c");
    #[cfg(target_arch = "x86_64")]
    if crate::simd_level() == crate::SimdLevel::Avx512 {
        // SAFETY: AVX-512F is present (simd_level) and the slices cover every index used
        // (checked above).
        unsafe { avx512::abt(m, n, kd, a, lda, b, ldb, c, ldc, prefetch) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::simd_level() == crate::SimdLevel::Avx2 {
        // SAFETY: AVX2, FMA and F16C are present (simd_level) and the slices cover every
        // index used (checked above).
        unsafe { avx2::abt(m, n, kd, a, lda, b, ldb, c, ldc, prefetch) };
        return;
    }
    crate::prefetch::prefetch_l2(prefetch);
    for i in 0..m {
        for j in 0..n {
            let (x, y) = (&a[i * lda..i * lda + kd], &b[j * ldb..j * ldb + kd]);
            c[i * ldc + j] = x.iter().zip(y).map(|(p, q)| p * q).sum();
        }
    }
}

/// Rows of a panel of [`pack_rows`]: two AVX-512 vectors, four AVX2 ones.
pub const PANEL_ROWS: usize = 32;

/// `a`'s first `m` rows of `kd` values (stride `lda`) for [`gemm_f32_abt_packed`]: panels of
/// [`PANEL_ROWS`] rows, transposed, element `k` of row `PANEL_ROWS * p + r` at
/// `packed[(p * kd + k) * PANEL_ROWS + r]`, the rows past `m` zero.
pub fn pack_rows(m: usize, kd: usize, a: &[f32], lda: usize, packed: &mut Vec<f32>) {
    check(m, kd, a.len(), lda, "a");
    let panels = m.div_ceil(PANEL_ROWS);
    packed.clear();
    packed.resize(panels * kd * PANEL_ROWS, 0.0);
    #[cfg(target_arch = "x86_64")]
    if crate::simd_level() == crate::SimdLevel::Avx512 && lda <= (i32::MAX as usize) / 32 {
        // SAFETY: AVX-512F is present (simd_level), `a` holds the m rows (checked) and
        // `packed` the panels (sized above); 31 * lda fits the gathers' i32 offsets.
        unsafe { avx512::pack_rows(m, kd, a, lda, packed) };
        return;
    }
    for (p, panel) in packed.chunks_exact_mut(kd * PANEL_ROWS).enumerate() {
        let rows = PANEL_ROWS.min(m - p * PANEL_ROWS);
        // Step by step: the writes in order, the panel's rows read from L1.
        for (k, step) in panel.chunks_exact_mut(PANEL_ROWS).enumerate() {
            for (r, x) in step[..rows].iter_mut().enumerate() {
                *x = a[(p * PANEL_ROWS + r) * lda + k];
            }
        }
    }
}

/// [`gemm_f32_abt`] for many rows against the same `b`, a prompt batch's query rows against
/// a tile of keys: `a` packed by [`pack_rows`] (`m` rows of `kd`). Each product is one chain
/// of fused multiply-adds in `k` order, so the bits are the same on AVX-512, AVX2 and without
/// SIMD, and do not depend on `m` or on where a row falls in its panel. A panel's 32 rows are
/// vectors (two on AVX-512) times one of 12 rows of `b` broadcast, so each value of `b` loaded
/// feeds 32 multiply-adds, where [`gemm_f32_abt`]'s dot products feed 4. On the prompt batch's
/// MLA shapes (256 rows, 512 keys of 576) that is about 55% of the FMA rate against 35%,
/// bound by L2 (the same loop in L1 runs at 90%; docs/performance.md, session 26).
#[allow(clippy::too_many_arguments)]
pub fn gemm_f32_abt_packed(
    m: usize,
    n: usize,
    kd: usize,
    packed: &[f32],
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
) {
    assert!(
        packed.len() >= m.div_ceil(PANEL_ROWS) * kd * PANEL_ROWS,
        "gemm_f32_abt_packed: {} packed values for {m} rows of {kd}",
        packed.len()
    );
    check(n, kd, b.len(), ldb, "b");
    check(m, n, c.len(), ldc, "c");
    if m == 0 || n == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::simd_level() == crate::SimdLevel::Avx512 && ldc <= (i32::MAX as usize) / 16 {
        // SAFETY: AVX-512F is present (simd_level), the slices cover every index used
        // (checked above), and 15 * ldc fits the scatter's i32 offsets.
        unsafe { avx512::abt_packed(m, n, kd, packed, b, ldb, c, ldc) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::simd_level() >= crate::SimdLevel::Avx2 {
        // SAFETY: AVX2 and FMA are present (simd_level) and the slices cover every index used
        // (checked above).
        unsafe { avx2::abt_packed(m, n, kd, packed, b, ldb, c, ldc) };
        return;
    }
    for i in 0..m {
        let panel = &packed[i / PANEL_ROWS * kd * PANEL_ROWS..];
        for j in 0..n {
            let row = &b[j * ldb..j * ldb + kd];
            let mut sum = 0f32;
            for (k, &y) in row.iter().enumerate() {
                sum = panel[k * PANEL_ROWS + i % PANEL_ROWS].mul_add(y, sum);
            }
            c[i * ldc + j] = sum;
        }
    }
}

/// `c[i*ldc + d] = Σ_j p[i*ldp + j] · v[j*ldv + d]` for `i < m`, `d < dv`, `j < n`.
#[allow(clippy::too_many_arguments)]
pub fn gemm_f32_ab(
    m: usize,
    n: usize,
    dv: usize,
    p: &[f32],
    ldp: usize,
    v: &[f32],
    ldv: usize,
    c: &mut [f32],
    ldc: usize,
) {
    check(m, n, p.len(), ldp, "p");
    check(n, dv, v.len(), ldv, "v");
    check(m, dv, c.len(), ldc, "c");
    #[cfg(target_arch = "x86_64")]
    if crate::simd_level() == crate::SimdLevel::Avx512 {
        // SAFETY: as in gemm_f32_abt.
        unsafe { avx512::ab(m, n, dv, p, ldp, v, ldv, c, ldc) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::simd_level() == crate::SimdLevel::Avx2 {
        // SAFETY: as in gemm_f32_abt.
        unsafe { avx2::ab(m, n, dv, p, ldp, v, ldv, c, ldc) };
        return;
    }
    for i in 0..m {
        let out = &mut c[i * ldc..i * ldc + dv];
        out.fill(0.0);
        for j in 0..n {
            let w = p[i * ldp + j];
            for (o, x) in out.iter_mut().zip(&v[j * ldv..j * ldv + dv]) {
                *o += w * x;
            }
        }
    }
}

/// The output tiles of an `m`-row, `n`-column product, in the order the kernels run them:
/// row tiles of `rows` (single rows where fewer are left), within each, column tiles of
/// `cols.0` (`cols.1` where fewer are left; the last may reach past `n`, the kernels mask it).
/// Calls `tile(i, j, full_rows, full_cols)` for each, and asks for `prefetch`'s lines into L2
/// spread evenly over them.
#[cfg(target_arch = "x86_64")]
#[inline]
fn walk_tiles(
    m: usize,
    rows: usize,
    n: usize,
    cols: (usize, usize),
    prefetch: &[u8],
    mut tile: impl FnMut(usize, usize, bool, bool),
) {
    let steps = |len: usize, big: usize, small: usize| len / big + (len % big).div_ceil(small);
    let tiles = steps(m, rows, 1) * steps(n, cols.0, cols.1);
    let mut lines = prefetch.chunks(64);
    let per_tile = prefetch.len().div_ceil(64).div_ceil(tiles.max(1));
    let mut i = 0;
    while i < m {
        let full_rows = m - i >= rows;
        let mut j = 0;
        while j < n {
            for line in lines.by_ref().take(per_tile) {
                crate::prefetch::prefetch_l2(line);
            }
            let full_cols = n - j >= cols.0;
            tile(i, j, full_rows, full_cols);
            j += if full_cols { cols.0 } else { cols.1 };
        }
        i += if full_rows { rows } else { 1 };
    }
}

/// A `rows x cols` matrix with leading dimension `ld` must fit in `len` elements.
pub(crate) fn check(rows: usize, cols: usize, len: usize, ld: usize, what: &str) {
    assert!(
        cols <= ld || rows <= 1,
        "{what}: {cols} columns exceed leading dimension {ld}"
    );
    if rows > 0 && cols > 0 {
        assert!(
            (rows - 1) * ld + cols <= len,
            "{what}: {rows}x{cols} (ld {ld}) exceeds {len}"
        );
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// Mask of the first `n` (< 16) lanes, or all lanes.
    fn lanes(n: usize) -> __mmask16 {
        if n >= 16 {
            0xFFFF
        } else {
            (1u16 << n) - 1
        }
    }

    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn abt(
        m: usize,
        n: usize,
        kd: usize,
        a: &[f32],
        lda: usize,
        b: &[f32],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
        prefetch: &[u8],
    ) {
        super::walk_tiles(m, 4, n, (4, 1), prefetch, |i, j, full_rows, full_cols| {
            // SAFETY: rows i..i+4 (or i) of a, j..j+4 (or j) of b and the c block are in
            // bounds (the caller checked the shapes).
            unsafe {
                match (full_rows, full_cols) {
                    (true, true) => tile_abt::<4, 4>(kd, a, lda, b, ldb, c, ldc, i, j),
                    (true, false) => tile_abt::<4, 1>(kd, a, lda, b, ldb, c, ldc, i, j),
                    (false, true) => tile_abt::<1, 4>(kd, a, lda, b, ldb, c, ldc, i, j),
                    (false, false) => tile_abt::<1, 1>(kd, a, lda, b, ldb, c, ldc, i, j),
                }
            }
        });
    }

    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    unsafe fn tile_abt<const MR: usize, const NR: usize>(
        kd: usize,
        a: &[f32],
        lda: usize,
        b: &[f32],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
        i0: usize,
        j0: usize,
    ) {
        let mut acc = [[_mm512_setzero_ps(); NR]; MR];
        let mut k = 0;
        while k < kd {
            let mask = lanes(kd - k);
            let mut bv = [_mm512_setzero_ps(); NR];
            for (jj, v) in bv.iter_mut().enumerate() {
                // SAFETY: lanes k..k+popcount(mask) of row j0+jj are inside b.
                *v = unsafe { _mm512_maskz_loadu_ps(mask, b.as_ptr().add((j0 + jj) * ldb + k)) };
            }
            for (ii, row) in acc.iter_mut().enumerate() {
                // SAFETY: as for b.
                let av =
                    unsafe { _mm512_maskz_loadu_ps(mask, a.as_ptr().add((i0 + ii) * lda + k)) };
                for (jj, r) in row.iter_mut().enumerate() {
                    *r = _mm512_fmadd_ps(av, bv[jj], *r);
                }
            }
            k += 16;
        }
        for (ii, row) in acc.iter().enumerate() {
            for (jj, r) in row.iter().enumerate() {
                c[(i0 + ii) * ldc + j0 + jj] = _mm512_reduce_add_ps(*r);
            }
        }
    }

    /// [`super::pack_rows`]: each step of a panel gathered from its 32 rows, two vectors at a
    /// time (the rows past `m` masked to zero).
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn pack_rows(m: usize, kd: usize, a: &[f32], lda: usize, packed: &mut [f32]) {
        use super::PANEL_ROWS;
        let offsets = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(lda as i32),
        );
        for (p, panel) in packed.chunks_exact_mut(kd * PANEL_ROWS).enumerate() {
            let i = p * PANEL_ROWS;
            let masks = [lanes(m - i), lanes(m.saturating_sub(i + 16))];
            for (k, step) in panel.chunks_exact_mut(PANEL_ROWS).enumerate() {
                for (h, mask) in masks.iter().enumerate() {
                    // SAFETY: the lanes gathered, element k of rows i + 16h .. min(+16, m),
                    // are inside `a` (checked by the caller); none is read under a zero mask.
                    unsafe {
                        let base = a.as_ptr().wrapping_add((i + 16 * h) * lda + k);
                        let v =
                            _mm512_mask_i32gather_ps(_mm512_setzero_ps(), *mask, offsets, base, 4);
                        _mm512_storeu_ps(step.as_mut_ptr().add(16 * h), v);
                    }
                }
            }
        }
    }

    /// Rows of `b` a tile of [`abt_packed`] broadcasts.
    const PACKED_COLS: usize = 12;

    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn abt_packed(
        m: usize,
        n: usize,
        kd: usize,
        packed: &[f32],
        b: &[f32],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
    ) {
        use super::PANEL_ROWS;
        let offsets = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(ldc as i32),
        );
        let panels = m.div_ceil(PANEL_ROWS);
        for j in (0..n).step_by(PACKED_COLS) {
            let cols = (n - j).min(PACKED_COLS);
            // Columns past n read the last row again (their sums are not stored).
            let rows: [*const f32; PACKED_COLS] =
                core::array::from_fn(|q| b.as_ptr().wrapping_add((j + q.min(cols - 1)) * ldb));
            for (p, panel) in packed
                .chunks_exact(kd * PANEL_ROWS)
                .take(panels)
                .enumerate()
            {
                let mut acc = [[_mm512_setzero_ps(); 2]; PACKED_COLS];
                for k in 0..kd {
                    // SAFETY: the panel holds kd steps of PANEL_ROWS values.
                    let (a0, a1) = unsafe {
                        let at = panel.as_ptr().add(k * PANEL_ROWS);
                        (_mm512_loadu_ps(at), _mm512_loadu_ps(at.add(16)))
                    };
                    for (q, r) in acc.iter_mut().enumerate() {
                        // SAFETY: rows[q] is a row of b (checked: kd values each).
                        let x = _mm512_set1_ps(unsafe { *rows[q].add(k) });
                        r[0] = _mm512_fmadd_ps(a0, x, r[0]);
                        r[1] = _mm512_fmadd_ps(a1, x, r[1]);
                    }
                }
                for (q, r) in acc.iter().enumerate().take(cols) {
                    for (h, v) in r.iter().enumerate() {
                        let i = p * PANEL_ROWS + 16 * h;
                        if i >= m {
                            continue;
                        }
                        // SAFETY: the lanes stored, rows i..min(i + 16, m) of column j + q,
                        // are inside c (checked), at offsets below 16 * ldc (fits i32).
                        unsafe {
                            _mm512_mask_i32scatter_ps(
                                c.as_mut_ptr().add(i * ldc + j + q),
                                lanes(m - i),
                                offsets,
                                *v,
                                4,
                            )
                        };
                    }
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn ab(
        m: usize,
        n: usize,
        dv: usize,
        p: &[f32],
        ldp: usize,
        v: &[f32],
        ldv: usize,
        c: &mut [f32],
        ldc: usize,
    ) {
        // Blocks of 8 rows (a prompt batch's many rows: each value vector loaded feeds 8
        // multiply-adds), then of 4 (one-token GQA groups), then single rows; each sum is the
        // same chain of fused multiply-adds in j order whatever its block.
        let mut i = 0;
        while i < m {
            let rows = match m - i {
                8.. => 8,
                4..=7 => 4,
                _ => 1,
            };
            let mut d = 0;
            while d < dv {
                let wide = match rows {
                    8 => 48,
                    _ => 64,
                };
                let full = dv - d >= wide;
                // SAFETY: as in abt (the tiles mask columns past dv).
                unsafe {
                    match (rows, full) {
                        (8, true) => tile_ab::<8, 3>(n, dv, p, ldp, v, ldv, c, ldc, i, d),
                        (8, false) => tile_ab::<8, 1>(n, dv, p, ldp, v, ldv, c, ldc, i, d),
                        (4, true) => tile_ab::<4, 4>(n, dv, p, ldp, v, ldv, c, ldc, i, d),
                        (4, false) => tile_ab::<4, 1>(n, dv, p, ldp, v, ldv, c, ldc, i, d),
                        (_, true) => tile_ab::<1, 4>(n, dv, p, ldp, v, ldv, c, ldc, i, d),
                        (_, false) => tile_ab::<1, 1>(n, dv, p, ldp, v, ldv, c, ldc, i, d),
                    }
                }
                d += if full { wide } else { 16 };
            }
            i += rows;
        }
    }

    /// Rows `i0..i0+MR`, columns `d0..d0+16*NV` (clipped to `dv`).
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    unsafe fn tile_ab<const MR: usize, const NV: usize>(
        n: usize,
        dv: usize,
        p: &[f32],
        ldp: usize,
        v: &[f32],
        ldv: usize,
        c: &mut [f32],
        ldc: usize,
        i0: usize,
        d0: usize,
    ) {
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        let mut masks = [0 as __mmask16; NV];
        for (q, mk) in masks.iter_mut().enumerate() {
            *mk = lanes(dv.saturating_sub(d0 + 16 * q));
        }
        for j in 0..n {
            let mut vv = [_mm512_setzero_ps(); NV];
            for (q, x) in vv.iter_mut().enumerate() {
                // SAFETY: masked lanes stay inside row j of v (columns < dv).
                *x = unsafe {
                    _mm512_maskz_loadu_ps(masks[q], v.as_ptr().add(j * ldv + d0 + 16 * q))
                };
            }
            for (ii, row) in acc.iter_mut().enumerate() {
                // SAFETY: row i0 + ii of p holds n values (checked by gemm_f32_ab).
                let w = _mm512_set1_ps(unsafe { *p.as_ptr().add((i0 + ii) * ldp + j) });
                for (q, r) in row.iter_mut().enumerate() {
                    *r = _mm512_fmadd_ps(w, vv[q], *r);
                }
            }
        }
        for (ii, row) in acc.iter().enumerate() {
            for (q, r) in row.iter().enumerate() {
                // SAFETY: masked lanes stay inside row i0+ii of c (columns < dv).
                unsafe {
                    _mm512_mask_storeu_ps(
                        c.as_mut_ptr().add((i0 + ii) * ldc + d0 + 16 * q),
                        masks[q],
                        *r,
                    )
                };
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use crate::simd::x86_avx2::hsum_float_8;

    /// Load mask of the first `n` (< 8) lanes, or all lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn lanes(n: usize) -> __m256i {
        let n = n.min(8) as i32;
        _mm256_cmpgt_epi32(
            _mm256_set1_epi32(n),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        )
    }

    /// [`super::avx512::abt`]'s results bit for bit: each dot product is summed in 16 lanes
    /// (two 8-lane halves, masked past `kd` as AVX-512's loads are) and reduced as
    /// `_mm512_reduce_add_ps` is, so fast numerics do not depend on the CPU's vector width.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn abt(
        m: usize,
        n: usize,
        kd: usize,
        a: &[f32],
        lda: usize,
        b: &[f32],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
        prefetch: &[u8],
    ) {
        super::walk_tiles(m, 3, n, (2, 1), prefetch, |i, j, full_rows, full_cols| {
            // SAFETY: rows i..i+3 (or i) of a, j..j+2 (or j) of b and the c block are in
            // bounds (the caller checked the shapes).
            unsafe {
                match (full_rows, full_cols) {
                    (true, true) => tile_abt::<3, 2>(kd, a, lda, b, ldb, c, ldc, i, j),
                    (true, false) => tile_abt::<3, 1>(kd, a, lda, b, ldb, c, ldc, i, j),
                    (false, true) => tile_abt::<1, 2>(kd, a, lda, b, ldb, c, ldc, i, j),
                    (false, false) => tile_abt::<1, 1>(kd, a, lda, b, ldb, c, ldc, i, j),
                }
            }
        });
    }

    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile_abt<const MR: usize, const NR: usize>(
        kd: usize,
        a: &[f32],
        lda: usize,
        b: &[f32],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
        i0: usize,
        j0: usize,
    ) {
        // [row][column][half of the 16 lanes]
        let mut acc = [[[_mm256_setzero_ps(); 2]; NR]; MR];
        let a_row = |ii: usize| a.as_ptr().wrapping_add((i0 + ii) * lda);
        let b_row = |jj: usize| b.as_ptr().wrapping_add((j0 + jj) * ldb);
        // Whole steps of 16 with plain loads, in a loop of their own: the tail's masks would
        // take registers the accumulators need (one spilled accumulator put a store and a
        // reload on every step's dependency chain).
        let whole = kd / 16 * 16;
        for k in (0..whole).step_by(16) {
            for h in 0..2 {
                let at = k + 8 * h;
                // SAFETY: at + 8 <= whole <= kd: the 8 lanes are inside each row.
                let bv: [__m256; NR] =
                    core::array::from_fn(|jj| unsafe { _mm256_loadu_ps(b_row(jj).add(at)) });
                for (ii, row) in acc.iter_mut().enumerate() {
                    // SAFETY: as for `bv`.
                    let av = unsafe { _mm256_loadu_ps(a_row(ii).add(at)) };
                    for (jj, r) in row.iter_mut().enumerate() {
                        r[h] = _mm256_fmadd_ps(av, bv[jj], r[h]);
                    }
                }
            }
        }
        if whole < kd {
            // The tail: masked loads, lanes past kd read as zero (AVX-512's masked loads).
            for h in 0..2 {
                let at = whole + 8 * h;
                let mask = lanes(kd.saturating_sub(at));
                // SAFETY: the lanes the mask loads, at..min(at + 8, kd) of the row, are
                // inside it; with none loaded the address is not read.
                let load = |p: *const f32| unsafe { _mm256_maskload_ps(p.wrapping_add(at), mask) };
                let bv: [__m256; NR] = core::array::from_fn(|jj| load(b_row(jj)));
                for (ii, row) in acc.iter_mut().enumerate() {
                    let av = load(a_row(ii));
                    for (jj, r) in row.iter_mut().enumerate() {
                        r[h] = _mm256_fmadd_ps(av, bv[jj], r[h]);
                    }
                }
            }
        }
        for (ii, row) in acc.iter().enumerate() {
            for (jj, r) in row.iter().enumerate() {
                c[(i0 + ii) * ldc + j0 + jj] = hsum_float_8(_mm256_add_ps(r[0], r[1]));
            }
        }
    }

    /// Rows of `b` a tile of [`abt_packed`] broadcasts (16 registers: 12 sums, two of a
    /// half-panel's rows, one broadcast).
    const PACKED_COLS: usize = 6;

    /// [`super::avx512::abt_packed`]'s results bit for bit (each sum the same chain of fused
    /// multiply-adds), a half-panel of 16 rows at a time.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn abt_packed(
        m: usize,
        n: usize,
        kd: usize,
        packed: &[f32],
        b: &[f32],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
    ) {
        use super::PANEL_ROWS;
        for j in (0..n).step_by(PACKED_COLS) {
            let cols = (n - j).min(PACKED_COLS);
            let rows: [*const f32; PACKED_COLS] =
                core::array::from_fn(|q| b.as_ptr().wrapping_add((j + q.min(cols - 1)) * ldb));
            for i0 in (0..m).step_by(16) {
                let panel = &packed[i0 / PANEL_ROWS * kd * PANEL_ROWS + i0 % PANEL_ROWS..];
                let mut acc = [[_mm256_setzero_ps(); 2]; PACKED_COLS];
                for k in 0..kd {
                    // SAFETY: the half-panel's 16 values of step k are inside the panel.
                    let (a0, a1) = unsafe {
                        let at = panel.as_ptr().add(k * PANEL_ROWS);
                        (_mm256_loadu_ps(at), _mm256_loadu_ps(at.add(8)))
                    };
                    for (q, r) in acc.iter_mut().enumerate() {
                        // SAFETY: rows[q] is a row of b (checked: kd values each).
                        let x = _mm256_set1_ps(unsafe { *rows[q].add(k) });
                        r[0] = _mm256_fmadd_ps(a0, x, r[0]);
                        r[1] = _mm256_fmadd_ps(a1, x, r[1]);
                    }
                }
                let mut sums = [0f32; 16];
                for (q, r) in acc.iter().enumerate().take(cols) {
                    // SAFETY: sums holds 16 values.
                    unsafe {
                        _mm256_storeu_ps(sums.as_mut_ptr(), r[0]);
                        _mm256_storeu_ps(sums.as_mut_ptr().add(8), r[1]);
                    }
                    for (ii, &x) in sums.iter().enumerate().take(m - i0) {
                        c[(i0 + ii) * ldc + j + q] = x;
                    }
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn ab(
        m: usize,
        n: usize,
        dv: usize,
        p: &[f32],
        ldp: usize,
        v: &[f32],
        ldv: usize,
        c: &mut [f32],
        ldc: usize,
    ) {
        super::walk_tiles(m, 4, dv, (24, 8), &[], |i, d, full_rows, full_cols| {
            // SAFETY: as in abt (the tiles mask columns past dv).
            unsafe {
                match (full_rows, full_cols) {
                    (true, true) => tile_ab::<4, 3>(n, dv, p, ldp, v, ldv, c, ldc, i, d),
                    (true, false) => tile_ab::<4, 1>(n, dv, p, ldp, v, ldv, c, ldc, i, d),
                    (false, true) => tile_ab::<1, 3>(n, dv, p, ldp, v, ldv, c, ldc, i, d),
                    (false, false) => tile_ab::<1, 1>(n, dv, p, ldp, v, ldv, c, ldc, i, d),
                }
            }
        });
    }

    /// Rows `i0..i0+MR`, columns `d0..d0+8*NV` (clipped to `dv`).
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile_ab<const MR: usize, const NV: usize>(
        n: usize,
        dv: usize,
        p: &[f32],
        ldp: usize,
        v: &[f32],
        ldv: usize,
        c: &mut [f32],
        ldc: usize,
        i0: usize,
        d0: usize,
    ) {
        let mut acc = [[_mm256_setzero_ps(); NV]; MR];
        let masks: [__m256i; NV] = core::array::from_fn(|q| lanes(dv.saturating_sub(d0 + 8 * q)));
        let whole = d0 + 8 * NV <= dv;
        for j in 0..n {
            let mut vv = [_mm256_setzero_ps(); NV];
            for (q, x) in vv.iter_mut().enumerate() {
                let at = v.as_ptr().wrapping_add(j * ldv + d0 + 8 * q);
                // SAFETY: with `whole`, columns d0..d0+8*NV of row j are inside v; else the
                // masked lanes stay inside row j of v (columns < dv).
                *x = unsafe {
                    if whole {
                        _mm256_loadu_ps(at)
                    } else {
                        _mm256_maskload_ps(at, masks[q])
                    }
                };
            }
            for (ii, row) in acc.iter_mut().enumerate() {
                let w = _mm256_set1_ps(p[(i0 + ii) * ldp + j]);
                for (q, r) in row.iter_mut().enumerate() {
                    *r = _mm256_fmadd_ps(w, vv[q], *r);
                }
            }
        }
        for (ii, row) in acc.iter().enumerate() {
            for (q, r) in row.iter().enumerate() {
                let at = c.as_mut_ptr().wrapping_add((i0 + ii) * ldc + d0 + 8 * q);
                // SAFETY: as for the loads of v, in row i0+ii of c.
                unsafe {
                    if whole {
                        _mm256_storeu_ps(at, *r)
                    } else {
                        _mm256_maskstore_ps(at, masks[q], *r)
                    }
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    }

    /// The SIMD kernels of `gemm_f32_abt` (AVX-512, and AVX2 in two halves) sum each product in
    /// 16 lanes and reduce them as `_mm512_reduce_add_ps`: the same bits on either CPU.
    #[test]
    fn abt_sums_in_sixteen_lanes_on_every_simd_level() {
        if crate::simd_level() < crate::SimdLevel::Avx2 {
            return;
        }
        for (m, n, k) in [(7, 5, 576), (4, 3, 33), (1, 1, 7), (5, 9, 128)] {
            let (lda, ldb) = (k + 1, k + 2);
            let a = data(m * lda, 5);
            let b = data(n * ldb, 6);
            let mut c = vec![f32::NAN; m * n];
            gemm_f32_abt(m, n, k, &a, lda, &b, ldb, &mut c, n, &[]);
            for i in 0..m {
                for j in 0..n {
                    let mut lanes = [0f32; 16];
                    for k0 in (0..k).step_by(16) {
                        for (l, v) in lanes.iter_mut().enumerate() {
                            let (x, y) = match k0 + l {
                                e if e < k => (a[i * lda + e], b[j * ldb + e]),
                                _ => (0.0, 0.0),
                            };
                            *v = x.mul_add(y, *v);
                        }
                    }
                    let want = crate::tinyblas::reduce_add_16(&lanes);
                    assert_eq!(
                        c[i * n + j].to_bits(),
                        want.to_bits(),
                        "{m}x{n}x{k} at {i},{j}"
                    );
                }
            }
        }
    }

    /// `gemm_f32_abt_packed` sums each product as one chain of fused multiply-adds in `k`
    /// order: the same bits from the dispatched kernel, the AVX2 one and the chain itself,
    /// for rows anywhere in a panel and columns anywhere in a tile; `c` past `n` untouched.
    #[test]
    fn abt_packed_is_one_fused_chain_on_every_simd_level() {
        for (m, n, k) in [
            (1, 1, 1),
            (16, 5, 576),
            (31, 12, 7),
            (33, 13, 64),
            (70, 25, 33),
        ] {
            let (lda, ldb, ldc) = (k + 3, k + 1, n + 2);
            let a = data(m * lda, 7);
            let b = data(n * ldb, 8);
            let mut packed = Vec::new();
            pack_rows(m, k, &a, lda, &mut packed);
            let want = |i: usize, j: usize| {
                (0..k).fold(0f32, |s, x| a[i * lda + x].mul_add(b[j * ldb + x], s))
            };
            let check = |c: &[f32], what: &str| {
                for i in 0..m {
                    for j in 0..ldc {
                        let got = c[i * ldc + j];
                        if j < n {
                            assert_eq!(
                                got.to_bits(),
                                want(i, j).to_bits(),
                                "{what} {m}x{n}x{k} at {i},{j}"
                            );
                        } else {
                            assert!(got.is_nan(), "{what} {m}x{n}x{k} wrote past n at {i},{j}");
                        }
                    }
                }
            };
            let mut c = vec![f32::NAN; m * ldc];
            gemm_f32_abt_packed(m, n, k, &packed, &b, ldb, &mut c, ldc);
            check(&c, "dispatched");
            #[cfg(target_arch = "x86_64")]
            if crate::simd_level() >= crate::SimdLevel::Avx2 {
                let mut c = vec![f32::NAN; m * ldc];
                // SAFETY: AVX2 and FMA are present; the shapes are as gemm_f32_abt_packed's.
                unsafe { avx2::abt_packed(m, n, k, &packed, &b, ldb, &mut c, ldc) };
                check(&c, "avx2");
            }
        }
    }

    /// `gemm_f32_ab` sums each output as one chain of fused multiply-adds in `j` order on
    /// AVX-512 and AVX2, whatever block of rows (8, 4 or 1) and columns it falls in.
    #[test]
    fn ab_is_one_fused_chain_in_every_block() {
        if crate::simd_level() < crate::SimdLevel::Avx2 {
            return;
        }
        for (m, n, dv) in [(13, 9, 512), (16, 64, 40), (5, 3, 100), (9, 1, 17)] {
            let (ldp, ldv, ldc) = (n + 1, dv + 5, dv + 2);
            let p = data(m * ldp, 9);
            let v = data(n * ldv, 10);
            let mut c = vec![f32::NAN; m * ldc];
            gemm_f32_ab(m, n, dv, &p, ldp, &v, ldv, &mut c, ldc);
            for i in 0..m {
                for d in 0..dv {
                    let want = (0..n).fold(0f32, |s, j| p[i * ldp + j].mul_add(v[j * ldv + d], s));
                    assert_eq!(
                        c[i * ldc + d].to_bits(),
                        want.to_bits(),
                        "{m}x{n}x{dv} at {i},{d}"
                    );
                }
            }
        }
    }

    #[test]
    fn abt_and_ab_match_naive_loops() {
        for (m, n, k) in [(1, 1, 1), (5, 7, 33), (9, 4, 576), (4, 13, 17), (17, 3, 64)] {
            let (lda, ldb, ldc) = (k + 3, k + 1, n + 2);
            let a = data(m * lda, 1);
            let b = data(n * ldb, 2);
            let mut c = vec![f32::NAN; m * ldc];
            gemm_f32_abt(m, n, k, &a, lda, &b, ldb, &mut c, ldc, &[]);
            for i in 0..m {
                for j in 0..n {
                    let want: f64 = (0..k)
                        .map(|x| a[i * lda + x] as f64 * b[j * ldb + x] as f64)
                        .sum();
                    assert!(
                        (c[i * ldc + j] as f64 - want).abs() < 1e-3,
                        "abt {m}x{n}x{k} at {i},{j}"
                    );
                }
            }
            // ab: p is m x n, v is n x k.
            let (ldp, ldv, ldo) = (n + 1, k + 5, k + 2);
            let p = data(m * ldp, 3);
            let v = data(n * ldv, 4);
            let mut o = vec![f32::NAN; m * ldo];
            gemm_f32_ab(m, n, k, &p, ldp, &v, ldv, &mut o, ldo);
            for i in 0..m {
                for d in 0..k {
                    let want: f64 = (0..n)
                        .map(|j| p[i * ldp + j] as f64 * v[j * ldv + d] as f64)
                        .sum();
                    assert!(
                        (o[i * ldo + d] as f64 - want).abs() < 1e-3,
                        "ab {m}x{n}x{k} at {i},{d}"
                    );
                }
            }
        }
    }
}
