//! Run-time selected SIMD kernels (x86-64 only): `x86_avx2.rs` (AVX2 + FMA + F16C),
//! `x86_avx512.rs` (AVX-512 F/BW/VL/VNNI on top of that), `x86_avx2_iq1_iq3s.rs` (AVX2 dots
//! of IQ3_S, IQ1_S, IQ1_M), `x86_avx512_iq.rs` (AVX-512 + VBMI dots of the seven IQ1/IQ2/IQ3
//! code-book types, bit-identical to the AVX2 ones) and `x86_avx2_iqk.rs` / `x86_avx512_iqk.rs`
//! (ik_llama.cpp's types, AVX2 / AVX-512; they keep the scalar reference's float steps instead).
//!
//! Kernels keep ggml's x86 float evaluation order (which 8 integer lanes are formed, when they
//! are converted, the FMA accumulation per block and the final horizontal sum), so results
//! equal ggml's x86 kernels bit for bit (checked against `tests/data/ggml_golden.bin`); integer
//! sums are exact, so against the scalar reference they differ only by float summation order.
//!
//! Safety model: every kernel entry point is a safe `fn` with the `VecDotFn`/`QuantizeFn`
//! signature that asserts the slice lengths it is going to read, then calls a
//! `#[target_feature]` function. The entry points sit in their type's row of the type table
//! (`table.rs`, the `avx2` / `avx512` columns of a `Simd`), whose only way out is
//! `Simd::at(level)`, which refuses a level above what [`detect`] found; so the target
//! features are present whenever they run.

use crate::dispatch::SimdLevel;

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86_avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86_avx2_iq1_iq3s;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86_avx2_iqk;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86_avx512;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86_avx512_iq;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86_avx512_iqk;

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

/// Whether the CPU has AVX512_VBMI (`VPERMB`, `VPERMI2B`, `VPMULTISHIFTQB`), which the
/// code-book kernels of `x86_avx512_iq.rs` use on top of the AVX-512 level (without it they run
/// the AVX2 kernels, with the same results).
pub(crate) fn has_avx512_vbmi() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| {
            is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vbmi")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the CPU has AVX512_BF16 (`VDPBF16PS`), which the BF16 kernels use on top of the
/// AVX-512 level (`bf16.rs`; without it they emulate the instruction, with the same results).
pub(crate) fn has_avx512_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| {
            is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}
