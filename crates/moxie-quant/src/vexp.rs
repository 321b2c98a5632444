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

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn expf_16s(x: &mut [f32]) {
        let c = |bits: u32| _mm512_set1_ps(f32::from_bits(bits));
        let r = c(0x4b40_0000);
        for chunk in x.chunks_exact_mut(16) {
            let chunk: &mut [f32; 16] = chunk.try_into().unwrap();
            // SAFETY: `chunk` is 16 readable and writable floats; no alignment needed.
            let v = unsafe { _mm512_loadu_ps(chunk.as_ptr()) };
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
            // SAFETY: as for the load.
            unsafe { _mm512_storeu_ps(chunk.as_mut_ptr(), res) };
        }
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
        let mut got = x.clone();
        ggml_v_expf_16s(&mut got);
        for (&i, &g) in x.iter().zip(&got) {
            let want = ggml_v_expf(i);
            assert!(
                g.to_bits() == want.to_bits() || g.is_nan() && want.is_nan(),
                "exp({i}): {g} vs {want}"
            );
        }
    }
}
