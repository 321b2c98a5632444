//! Float formats: F32, F16 (IEEE binary16) and BF16 rows, plus ggml-exact scalar conversions.
//!
//! * [`fp16_to_f32`] / [`f32_to_fp16`] are bit-for-bit ports of ggml's
//!   `ggml_compute_fp16_to_fp32` / `ggml_compute_fp32_to_fp16` (ggml-impl.h, after
//!   Maratyszcza/FP16): exact widening, round-to-nearest-even narrowing, overflow to ±inf,
//!   NaN -> 0x7E00 with the input's sign.
//! * [`bf16_to_f32`] / [`f32_to_bf16`] port `ggml_compute_bf16_to_fp32` /
//!   `ggml_compute_fp32_to_bf16`: round-to-nearest-even, subnormals kept, NaN forced quiet by
//!   truncating and setting bit 6.
//! * Dot products: the scalar references follow ggml's non-SIMD `ggml_vec_dot_f32/f16/bf16`
//!   (float products accumulated in f64). The AVX2/AVX-512 kernels in `simd/` follow ggml's
//!   SIMD accumulator layout instead.
//!
//! Verified by: exhaustive comparison of the f16 conversions with the `half` crate over all
//! 2^16 halves and 2^20 random floats (tests in this module), bf16 known answers, and the
//! crate-level round-trip / dot-consistency tests.

/// Widen an IEEE half (bit pattern) to f32, exactly as ggml does.
#[inline]
pub fn fp16_to_f32(h: u16) -> f32 {
    let w = (h as u32) << 16;
    let sign = w & 0x8000_0000;
    let two_w = w.wrapping_add(w);

    let exp_offset: u32 = 0xE0 << 23;
    let exp_scale = f32::from_bits(0x0780_0000); // 0x1.0p-112f
    let normalized_value = f32::from_bits((two_w >> 4) + exp_offset) * exp_scale;

    let magic_mask: u32 = 126 << 23;
    let magic_bias = 0.5f32;
    let denormalized_value = f32::from_bits((two_w >> 17) | magic_mask) - magic_bias;

    let denormalized_cutoff: u32 = 1 << 27;
    let result = sign
        | if two_w < denormalized_cutoff {
            denormalized_value.to_bits()
        } else {
            normalized_value.to_bits()
        };
    f32::from_bits(result)
}

/// Narrow an f32 to an IEEE half bit pattern with round-to-nearest-even, exactly as ggml's
/// `GGML_FP32_TO_FP16` does (NaN becomes 0x7E00 | sign).
#[inline]
pub fn f32_to_fp16(f: f32) -> u16 {
    let scale_to_inf = f32::from_bits(0x7780_0000); // 0x1.0p+112f
    let scale_to_zero = f32::from_bits(0x0880_0000); // 0x1.0p-110f
    let mut base = (f.abs() * scale_to_inf) * scale_to_zero;

    let w = f.to_bits();
    let shl1_w = w.wrapping_add(w);
    let sign = w & 0x8000_0000;
    let mut bias = shl1_w & 0xFF00_0000;
    if bias < 0x7100_0000 {
        bias = 0x7100_0000;
    }

    base += f32::from_bits((bias >> 1) + 0x0780_0000);
    let bits = base.to_bits();
    let exp_bits = (bits >> 13) & 0x0000_7C00;
    let mantissa_bits = bits & 0x0000_0FFF;
    let nonsign = exp_bits + mantissa_bits;
    ((sign >> 16)
        | if shl1_w > 0xFF00_0000 {
            0x7E00
        } else {
            nonsign
        }) as u16
}

/// Widen a bf16 bit pattern to f32 (exact).
#[inline]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Narrow an f32 to bf16 as ggml does: round-to-nearest-even, NaN made quiet.
#[inline]
pub fn f32_to_bf16(s: f32) -> u16 {
    let i = s.to_bits();
    if (i & 0x7fff_ffff) > 0x7f80_0000 {
        return ((i >> 16) | 64) as u16;
    }
    (i.wrapping_add(0x7fff + ((i >> 16) & 1)) >> 16) as u16
}

// ---------------------------------------------------------------------------------------------
// F32 rows

/// "Dequantize" an F32 row: little-endian bytes to floats.
pub fn dequantize_row_f32(src: &[u8], dst: &mut [f32]) {
    let src = &src[..dst.len() * 4];
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    }
}

/// "Quantize" to F32: floats to little-endian bytes.
pub fn quantize_row_f32(src: &[f32], dst: &mut [u8]) {
    let dst = &mut dst[..src.len() * 4];
    for (d, s) in dst.chunks_exact_mut(4).zip(src) {
        d.copy_from_slice(&s.to_le_bytes());
    }
}

/// F32 x F32 dot product, ggml's scalar `ggml_vec_dot_f32`: products in f32, sum in f64.
pub fn vec_dot_f32_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let w = &w[..n * 4];
    let a = &a[..n * 4];
    let mut sum = 0f64;
    for (x, y) in w.chunks_exact(4).zip(a.chunks_exact(4)) {
        let x = f32::from_le_bytes([x[0], x[1], x[2], x[3]]);
        let y = f32::from_le_bytes([y[0], y[1], y[2], y[3]]);
        sum += (x * y) as f64;
    }
    sum as f32
}

// ---------------------------------------------------------------------------------------------
// F16 rows

/// Dequantize an F16 row (with F16C where the SIMD level allows: the same bits, ~20x faster,
/// which matters for attention over an f16 cache).
pub fn dequantize_row_f16(src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::dispatch::simd_level() >= crate::dispatch::SimdLevel::Avx2 {
        return crate::simd::x86_avx2::dequantize_f16(src, dst);
    }
    dequantize_row_f16_scalar(src, dst);
}

/// [`dequantize_row_f16`]'s portable reference.
pub fn dequantize_row_f16_scalar(src: &[u8], dst: &mut [f32]) {
    let src = &src[..dst.len() * 2];
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = fp16_to_f32(u16::from_le_bytes([s[0], s[1]]));
    }
}

/// Quantize a row to F16 (round-to-nearest-even, as `ggml_cpu_fp32_to_fp16` with F16C).
pub fn quantize_row_f16(src: &[f32], dst: &mut [u8]) {
    let dst = &mut dst[..src.len() * 2];
    for (d, s) in dst.chunks_exact_mut(2).zip(src) {
        d.copy_from_slice(&f32_to_fp16(*s).to_le_bytes());
    }
}

/// F16 x F16 dot product, ggml's scalar `ggml_vec_dot_f16`: products in f32, sum in f64.
pub fn vec_dot_f16_f16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let w = &w[..n * 2];
    let a = &a[..n * 2];
    let mut sum = 0f64;
    for (x, y) in w.chunks_exact(2).zip(a.chunks_exact(2)) {
        let x = fp16_to_f32(u16::from_le_bytes([x[0], x[1]]));
        let y = fp16_to_f32(u16::from_le_bytes([y[0], y[1]]));
        sum += (x * y) as f64;
    }
    sum as f32
}

// ---------------------------------------------------------------------------------------------
// BF16 rows

/// Dequantize a BF16 row.
pub fn dequantize_row_bf16(src: &[u8], dst: &mut [f32]) {
    let src = &src[..dst.len() * 2];
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = bf16_to_f32(u16::from_le_bytes([s[0], s[1]]));
    }
}

/// Quantize a row to BF16 (`ggml_cpu_fp32_to_bf16`).
pub fn quantize_row_bf16(src: &[f32], dst: &mut [u8]) {
    let dst = &mut dst[..src.len() * 2];
    for (d, s) in dst.chunks_exact_mut(2).zip(src) {
        d.copy_from_slice(&f32_to_bf16(*s).to_le_bytes());
    }
}

/// BF16 x BF16 dot product, ggml's scalar `ggml_vec_dot_bf16`: products in f32, sum in f64.
pub fn vec_dot_bf16_bf16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let w = &w[..n * 2];
    let a = &a[..n * 2];
    let mut sum = 0f64;
    for (x, y) in w.chunks_exact(2).zip(a.chunks_exact(2)) {
        let x = bf16_to_f32(u16::from_le_bytes([x[0], x[1]]));
        let y = bf16_to_f32(u16::from_le_bytes([y[0], y[1]]));
        sum += (x * y) as f64;
    }
    sum as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp16_to_f32_matches_ieee_for_all_halves() {
        for h in 0..=u16::MAX {
            let ours = fp16_to_f32(h);
            let reference = half::f16::from_bits(h).to_f32();
            if reference.is_nan() {
                assert!(ours.is_nan(), "{h:#06x}");
            } else {
                assert_eq!(ours.to_bits(), reference.to_bits(), "{h:#06x}");
            }
        }
    }

    #[test]
    fn f32_to_fp16_is_round_to_nearest_even() {
        // every half value round-trips, and every midpoint rounds to even
        for h in 0..=u16::MAX {
            let f = half::f16::from_bits(h).to_f32();
            if f.is_nan() {
                assert_eq!(f32_to_fp16(f) & 0x7fff, 0x7E00);
                continue;
            }
            assert_eq!(f32_to_fp16(f), h, "{h:#06x}");
        }
        let mut s = 0x1234_5678u64;
        for _ in 0..(1 << 20) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let f = f32::from_bits(s as u32);
            let r = half::f16::from_f32(f).to_bits();
            if f.is_nan() {
                continue;
            }
            assert_eq!(f32_to_fp16(f), r, "{f:e} ({:#010x})", f.to_bits());
        }
        // explicit ties: 1 + 2^-11 is halfway between 1 and 1+2^-10 -> even (1.0)
        assert_eq!(f32_to_fp16(1.0 + f32::powi(2.0, -11)), 0x3C00);
        assert_eq!(f32_to_fp16(1.0 + 3.0 * f32::powi(2.0, -11)), 0x3C02);
        assert_eq!(f32_to_fp16(65520.0), 0x7C00); // rounds up to inf
        assert_eq!(f32_to_fp16(65519.0), 0x7BFF);
        assert_eq!(f32_to_fp16(-f32::NAN), 0xFE00);
    }

    /// The F16C row conversions against the scalar ports: every half (odd row lengths, so the
    /// tails run too), and 2^20 random floats plus ties and overflows narrowed.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn f16c_rows_equal_the_scalar_ports() {
        if crate::dispatch::hardware_simd_level() < crate::dispatch::SimdLevel::Avx2 {
            return;
        }
        use crate::simd::x86_avx2::{dequantize_f16, quantize_f16};
        let halves: Vec<u8> = (0..=u16::MAX).flat_map(|h| h.to_le_bytes()).collect();
        for len in [65536, 65531, 7, 1] {
            let (mut simd, mut scalar) = (vec![0f32; len], vec![0f32; len]);
            dequantize_f16(&halves, &mut simd);
            dequantize_row_f16_scalar(&halves, &mut scalar);
            for (h, (a, b)) in simd.iter().zip(&scalar).enumerate() {
                assert!(
                    a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan(),
                    "{h:#06x}"
                );
            }
        }
        let mut floats: Vec<f32> = [1.0 + f32::powi(2.0, -11), 65520.0, 65519.0, -0.0, 1e-8]
            .into_iter()
            .collect();
        let mut s = 0x9E37_79B9u64;
        floats.extend((0..1 << 20).map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            f32::from_bits(s as u32)
        }));
        floats.retain(|f| !f.is_nan());
        for len in [floats.len(), floats.len() - 3, 5] {
            let (mut simd, mut scalar) = (vec![0u8; 2 * len], vec![0u8; 2 * len]);
            quantize_f16(&floats[..len], &mut simd);
            quantize_row_f16(&floats[..len], &mut scalar);
            assert_eq!(simd, scalar);
        }
    }

    #[test]
    fn bf16_known_answers() {
        assert_eq!(f32_to_bf16(1.0), 0x3F80);
        // 1 + 2^-8 is a tie between 0x3F80 and 0x3F81 -> even
        assert_eq!(f32_to_bf16(f32::from_bits(0x3F80_8000)), 0x3F80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3F81_8000)), 0x3F82);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3F80_8001)), 0x3F81);
        // signalling NaN becomes quiet, payload truncated
        assert_eq!(f32_to_bf16(f32::from_bits(0x7F80_0001)), 0x7FC0);
        assert_eq!(f32_to_bf16(f32::from_bits(0xFF81_2345)), 0xFFC1);
        assert_eq!(f32_to_bf16(f32::INFINITY), 0x7F80);
        // subnormal kept
        assert_eq!(f32_to_bf16(f32::from_bits(0x0001_0000)), 0x0001);
        assert_eq!(bf16_to_f32(0xC040), -3.0);
        assert_eq!(f32_to_bf16(f32::MAX), 0x7F80);
    }
}
