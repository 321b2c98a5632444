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

/// Declares, in the kernel file of ik_llama.cpp's types that invokes it (`x86_avx2_iqk.rs`,
/// `x86_avx512_iqk.rs`), the safe entry points (`VecDotFn`s) `dot_iq2_k` .. `dot_iq6_k`,
/// `dot_iq2_ks` .. `dot_iq5_ks` and `dot_q6_0`, each calling that file's `#[target_feature]`
/// kernel of the same name with `_imp` appended on exactly the bytes it checked: `n / 256`
/// blocks (after the row's scale) and as many Q8_K blocks; for Q6_0 `n / 32` blocks and as
/// many Q8_0 blocks.
#[cfg(target_arch = "x86_64")]
macro_rules! iqk_dot_entries {
    () => {
        iqk_dot_entries!(@super_block dot_iq2_k, dot_iq2_k_imp, IQ2_K);
        iqk_dot_entries!(@super_block dot_iq3_k, dot_iq3_k_imp, IQ3_K);
        iqk_dot_entries!(@super_block dot_iq4_k, dot_iq4_k_imp, IQ4_K);
        iqk_dot_entries!(@super_block dot_iq5_k, dot_iq5_k_imp, IQ5_K);
        iqk_dot_entries!(@super_block dot_iq6_k, dot_iq6_k_imp, IQ6_K);
        iqk_dot_entries!(@super_block dot_iq2_ks, dot_iq2_ks_imp, IQ2_KS);
        iqk_dot_entries!(@super_block dot_iq3_ks, dot_iq3_ks_imp, IQ3_KS);
        iqk_dot_entries!(@super_block dot_iq4_ks, dot_iq4_ks_imp, IQ4_KS);
        iqk_dot_entries!(@super_block dot_iq5_ks, dot_iq5_ks_imp, IQ5_KS);

        pub(crate) fn dot_q6_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let nb = n / 32;
            let w = &w[..nb * $crate::iqk::Q6_0_BYTES];
            let a = &a[..nb * $crate::legacy::Q8_0_BYTES];
            // SAFETY: as for the super-block types' entry points below; the slices were
            // bounds-checked above.
            unsafe { dot_q6_0_imp(w, a) }
        }
    };
    (@super_block $name:ident, $imp:ident, $kind:ident) => {
        pub(crate) fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let k: &$crate::iqk::Kind = &$crate::iqk::$kind;
            let nb = n / 256;
            if nb == 0 {
                return 0.0;
            }
            let w = &w[..k.row_prefix() + nb * k.bytes];
            let a = &a[..nb * $crate::kquants::Q8_K_BYTES];
            // SAFETY: this function is only handed out through its type's table row at the
            // level of the file that declares it (`Simd::at`, which refuses a level above what
            // `detect` found), so the target features of that file's kernels were detected;
            // the slices were bounds-checked above.
            unsafe { $imp(w, a) }
        }
    };
}

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
/// the AVX2 kernels, with the same results). `is_x86_feature_detected!` caches what it found,
/// so a call is a load and a bit test.
pub(crate) fn has_avx512_vbmi() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vbmi")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the CPU has AVX512_BF16 (`VDPBF16PS`), which the BF16 kernels use on top of the
/// AVX-512 level (`bf16.rs`; without it they emulate the instruction, with the same results).
/// Cached as [`has_avx512_vbmi`].
pub(crate) fn has_avx512_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the CPU is Intel's (CPUID's vendor string), asked once: CPUID serializes, and under
/// a hypervisor it traps.
pub(crate) fn intel_cpu() -> bool {
    static INTEL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *INTEL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let id = std::arch::x86_64::__cpuid(0);
            // "GenuineIntel" in EBX, EDX, ECX.
            id.ebx == 0x756e_6547 && id.edx == 0x4965_6e69 && id.ecx == 0x6c65_746e
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}
