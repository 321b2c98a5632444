//! Run-time selected SIMD kernels (x86-64 only): `x86_avx2.rs` (AVX2 + FMA + F16C) and
//! `x86_avx512.rs` (AVX-512 F/BW/VL/VNNI on top of that).
//!
//! Kernels keep ggml's x86 float evaluation order (which 8 integer lanes are formed, when they
//! are converted, the FMA accumulation per block and the final horizontal sum), so results
//! equal ggml's x86 kernels bit for bit (checked against `tests/data/ggml_golden.bin`); integer
//! sums are exact, so against the scalar reference they differ only by float summation order.
//!
//! Safety model: every kernel entry point is a safe `fn` with the `VecDotFn`/`QuantizeFn`
//! signature that asserts the slice lengths it is going to read, then calls a
//! `#[target_feature]` function. Pointers to these entry points are handed out only by
//! [`vec_dot_fn`] / [`quantize_fn`] at a level the running CPU supports (checked by
//! `dispatch::vec_dot_fn_for_level` against [`detect`]), so the target features are present
//! whenever they run.

use crate::dispatch::{QuantizeFn, SimdLevel, VecDotFn};
use crate::types::GgmlType;

#[cfg(target_arch = "x86_64")]
mod x86_avx2;
#[cfg(target_arch = "x86_64")]
mod x86_avx512;

/// Highest SIMD level supported by this CPU.
pub(crate) fn detect() -> SimdLevel {
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        let avx512 = avx2
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni");
        if avx512 {
            return SimdLevel::Avx512;
        }
        if avx2 {
            return SimdLevel::Avx2;
        }
    }
    SimdLevel::Scalar
}

/// SIMD dot kernel for `ty` at `level` (an AVX-512 request falls back to the AVX2 kernel for
/// types without an AVX-512 one), or `None` (use the scalar kernel). The caller guarantees that
/// the CPU supports `level`.
pub(crate) fn vec_dot_fn(ty: GgmlType, level: SimdLevel) -> Option<VecDotFn> {
    #[cfg(target_arch = "x86_64")]
    {
        if level >= SimdLevel::Avx512 {
            if let Some(f) = x86_avx512::vec_dot_fn(ty) {
                return Some(f);
            }
        }
        if level >= SimdLevel::Avx2 {
            return x86_avx2::vec_dot_fn(ty);
        }
    }
    let _ = (ty, level);
    None
}

/// SIMD activation quantizer for `ty` at `level` (bit-identical to the scalar one), if any.
pub(crate) fn quantize_fn(ty: GgmlType, level: SimdLevel) -> Option<QuantizeFn> {
    #[cfg(target_arch = "x86_64")]
    {
        if level >= SimdLevel::Avx512 {
            if let Some(f) = x86_avx512::quantize_fn(ty) {
                return Some(f);
            }
        }
        if level >= SimdLevel::Avx2 {
            return x86_avx2::quantize_fn(ty);
        }
    }
    let _ = (ty, level);
    None
}
