//! ggml's AVX-512 `ggml_v_expf`: one port that runs on 16 lanes where the CPU has AVX-512 and
//! lane by lane elsewhere, with the same bits (softmax, SiLU and attention's online softmax
//! call it on 16-value chunks).

/// exp(x) exactly as ggml's AVX-512 `ggml_v_expf` computes it (ARM's optimized-routines
/// polynomial: max error 1.45 ulp + 0.5). ggml uses it for softmax and SiLU on 16-lane chunks
/// and libm `expf` for the remainder; matching it bit for bit keeps MoE routing near-ties
/// resolving the same way as in llama.cpp.
#[inline]
pub fn ggml_v_expf(x: f32) -> f32 {
    let r = f32::from_bits(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3fb8_aa3b), r); // 0x1.715476p+0
    let n = z - r;
    // b = x - n*ln2_hi - n*ln2_lo, as two fused negated multiply-adds.
    let b = (-n).mul_add(
        f32::from_bits(0x35bf_be8e),                  // 0x1.7f7d1cp-20
        (-n).mul_add(f32::from_bits(0x3f31_7200), x), // 0x1.62e4p-1
    );
    let u = b * b;
    let j = f32::from_bits(0x3c07_2010) // 0x1.0e4020p-7
        .mul_add(b, f32::from_bits(0x3d2b_9f17)) // 0x1.573e2ep-5
        .mul_add(
            u,
            f32::from_bits(0x3e2a_af33).mul_add(b, f32::from_bits(0x3eff_fedb)), // 0x1.555e66p-3, 0x1.fffdb6p-2
        )
        .mul_add(u, f32::from_bits(0x3f7f_fff6).mul_add(b, 1.0)); // 0x1.ffffecp-1
    if n.abs() > 192.0 || n.is_nan() {
        // _CMP_GT_OQ is false for NaN: NaN falls through to scalef below.
        if n.is_nan() {
            return f32::NAN;
        }
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    // scalef: j * 2^n with one rounding (exact in f64, then rounded to f32). n is an integer
    // in [-192, 192] here, so 2^n is built from its exponent bits (what libm's exp2 returns
    // for it, without the call).
    let pow2 = f64::from_bits(((n as i64 + 1023) as u64) << 52);
    (j as f64 * pow2) as f32
}

/// [`ggml_v_expf`] of every value of `x` in place (`x.len()` a multiple of 16): AVX-512 on 16
/// lanes at a time where the CPU has it (the same bits as the scalar port).
pub fn ggml_v_expf_16s(x: &mut [f32]) {
    assert_eq!(
        x.len() % 16,
        0,
        "ggml_v_expf_16s takes whole 16-value chunks"
    );
    #[cfg(target_arch = "x86_64")]
    if crate::simd_level() == crate::SimdLevel::Avx512 {
        // SAFETY: AVX-512F is present (simd_level); the chunks are whole (asserted).
        unsafe { avx512::expf_16s(x) };
        return;
    }
    x.iter_mut().for_each(|v| *v = ggml_v_expf(*v));
}

/// SiLU as ggml's `ggml_v_silu`: `x / (1 + exp(-x))` with [`ggml_v_expf`].
#[inline]
pub fn ggml_v_silu(x: f32) -> f32 {
    x / (1.0 + ggml_v_expf(-x))
}

/// `gate = ggml_v_silu(gate) * up` element by element (`gate.len()` a multiple of 16, `up` as
/// long), as ggml's `ggml_vec_swiglu_f32` computes its 16-lane chunks: AVX-512 where the CPU
/// has it (the same bits as the scalar port; the SwiGLU of every prompt token's expert and FFN
/// outputs, 3-4% of a prompt batch with the exponential out of line).
pub fn ggml_v_swiglu_16s(gate: &mut [f32], up: &[f32]) {
    assert!(
        gate.len().is_multiple_of(16) && up.len() == gate.len(),
        "ggml_v_swiglu_16s takes whole 16-value chunks of equal lengths"
    );
    #[cfg(target_arch = "x86_64")]
    if crate::simd_level() == crate::SimdLevel::Avx512 {
        // SAFETY: AVX-512F is present (simd_level); the lengths were checked above.
        unsafe { avx512::swiglu_16s(gate, up) };
        return;
    }
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = ggml_v_silu(*g) * u;
    }
}

/// `x = ggml_v_silu(x)` element by element (`x.len()` a multiple of 16), as ggml's
/// `ggml_vec_silu_f32` computes its 16-lane chunks.
pub fn ggml_v_silu_16s(x: &mut [f32]) {
    assert!(
        x.len().is_multiple_of(16),
        "ggml_v_silu_16s takes whole 16-value chunks"
    );
    #[cfg(target_arch = "x86_64")]
    if crate::simd_level() == crate::SimdLevel::Avx512 {
        // SAFETY: AVX-512F is present (simd_level); the length was checked above.
        unsafe { avx512::silu_16s(x) };
        return;
    }
    x.iter_mut().for_each(|v| *v = ggml_v_silu(*v));
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn expf_16s(x: &mut [f32]) {
        for chunk in x.chunks_exact_mut(16) {
            // SAFETY: `chunk` is 16 readable and writable floats; no alignment needed.
            unsafe { _mm512_storeu_ps(chunk.as_mut_ptr(), exp(_mm512_loadu_ps(chunk.as_ptr()))) };
        }
    }

    /// `x / (1 + exp(-x))` on 16 lanes, as `ggml_v_silu`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn silu(x: __m512) -> __m512 {
        let neg = _mm512_sub_ps(_mm512_setzero_ps(), x);
        _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0), exp(neg)))
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn swiglu_16s(gate: &mut [f32], up: &[f32]) {
        for (g, u) in gate.chunks_exact_mut(16).zip(up.chunks_exact(16)) {
            // SAFETY: `g` and `u` are 16 floats each (g writable); no alignment needed.
            unsafe {
                let v = _mm512_mul_ps(
                    silu(_mm512_loadu_ps(g.as_ptr())),
                    _mm512_loadu_ps(u.as_ptr()),
                );
                _mm512_storeu_ps(g.as_mut_ptr(), v);
            }
        }
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn silu_16s(x: &mut [f32]) {
        for c in x.chunks_exact_mut(16) {
            // SAFETY: `c` is 16 readable and writable floats; no alignment needed.
            unsafe { _mm512_storeu_ps(c.as_mut_ptr(), silu(_mm512_loadu_ps(c.as_ptr()))) };
        }
    }

    /// `ggml_v_expf` on 16 lanes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn exp(v: __m512) -> __m512 {
        let c = |bits: u32| _mm512_set1_ps(f32::from_bits(bits));
        let r = c(0x4b40_0000);
        let z = _mm512_fmadd_ps(v, c(0x3fb8_aa3b), r);
        let n = _mm512_sub_ps(z, r);
        let b = _mm512_fnmadd_ps(n, c(0x35bf_be8e), _mm512_fnmadd_ps(n, c(0x3f31_7200), v));
        let d = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(192.0));
        let u = _mm512_mul_ps(b, b);
        let j = _mm512_fmadd_ps(
            _mm512_fmadd_ps(
                _mm512_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
                u,
                _mm512_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
            ),
            u,
            _mm512_fmadd_ps(c(0x3f7f_fff6), b, _mm512_set1_ps(1.0)),
        );
        let mut res = _mm512_scalef_ps(j, n);
        if d != 0 {
            let zero = _mm512_setzero_ps();
            let le = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, zero);
            let alt = _mm512_mask_blend_ps(le, _mm512_set1_ps(f32::INFINITY), zero);
            res = _mm512_mask_blend_ps(d, res, alt);
        }
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 16-lane version equals the scalar port on a sweep of inputs, specials included.
    #[test]
    fn lanes_equal_the_scalar_port() {
        let mut x: Vec<f32> = (0..200_000)
            .map(|i| (i as f32 - 100_000.0) * 1.7e-3)
            .collect();
        x.extend([
            0.0,
            -0.0,
            88.7,
            89.0,
            -103.0,
            -87.3,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ]);
        x.extend([
            f32::NAN,
            192.5 * 0.693,
            -200.0,
            1e-30,
            -1e-30,
            0.5,
            1.5,
            -2.5,
        ]);
        x.resize(x.len().next_multiple_of(16), 1.0);
        let same = |g: f32, w: f32| g.to_bits() == w.to_bits() || g.is_nan() && w.is_nan();
        let mut got = x.clone();
        ggml_v_expf_16s(&mut got);
        for (&i, &g) in x.iter().zip(&got) {
            let want = ggml_v_expf(i);
            assert!(same(g, want), "exp({i}): {g} vs {want}");
        }
        let mut got = x.clone();
        ggml_v_silu_16s(&mut got);
        for (&i, &g) in x.iter().zip(&got) {
            let want = ggml_v_silu(i);
            assert!(same(g, want), "silu({i}): {g} vs {want}");
        }
        // The up values: the inputs reversed, so that every kind of value meets every other.
        let up: Vec<f32> = x.iter().rev().copied().collect();
        let mut got = x.clone();
        ggml_v_swiglu_16s(&mut got, &up);
        for ((&i, &u), &g) in x.iter().zip(&up).zip(&got) {
            let want = ggml_v_silu(i) * u;
            assert!(same(g, want), "swiglu({i}, {u}): {g} vs {want}");
        }
    }
}
