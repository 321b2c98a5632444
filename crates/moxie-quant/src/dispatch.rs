//! The public per-type entry points over the type table (`table.rs`, one row per type), the
//! run-time SIMD level, and the checked wrappers.
//!
//! * [`vec_dot_type`] is ggml-cpu's `type_traits_cpu[ty].vec_dot_type` for the types moxie
//!   computes with.
//! * [`dequantize_fn`] returns the scalar port of ggml's `dequantize_row_*` (what ggml's CPU
//!   backend uses for `get_rows` and conversions).
//! * [`quantize_fn`] is ggml-cpu's `from_float` on x86 (activations: x86 Q8_0/Q8_1,
//!   reference Q8_K, F16/BF16 conversion; weight types: the `_ref` quantizers).
//!   [`quantize_weights_fn`] is what llama-quantize writes without an importance matrix
//!   (differs from `quantize_fn` for Q8_0, Q8_1 and IQ4_NL).
//! * [`vec_dot_fn`] picks the best kernel of the type's row for the running CPU once (a
//!   `OnceLock` array by type id, from `is_x86_feature_detected!`). The environment variable `MOXIE_QUANT_SIMD`
//!   (`scalar`, `avx2`, `avx512`) can lower, never raise, the level that is used.
//!
//! Verified by: `tests/` (every listed type goes through the checked wrappers) and the unit
//! tests below.

use std::sync::OnceLock;

use crate::table::{row, row_index, N_ROWS};
use crate::types::GgmlType;

/// Dequantize `dst.len()` elements from the packed bytes `src`.
pub type DequantizeFn = fn(src: &[u8], dst: &mut [f32]);
/// Quantize `src.len()` elements into the packed bytes `dst`.
pub type QuantizeFn = fn(src: &[f32], dst: &mut [u8]);
/// Dot product of `n` elements: `w` in the weight type, `a` in its `vec_dot_type`.
pub type VecDotFn = fn(n: usize, w: &[u8], a: &[u8]) -> f32;
pub use crate::weighted::QuantizeImatrixFn;

/// What llama-quantize does with a type when it has an importance matrix.
#[derive(Clone, Copy, Debug)]
pub enum ImatrixQuantizer {
    /// The quantizer takes the matrix and ignores it (Q8_0) or there is nothing to weigh
    /// (F32 / F16 / BF16 conversions): the result is [`quantize_weights_fn`]'s.
    Ignores,
    /// `quantize_<type>(src, dst, nrow, n_per_row, quant_weights)`, one row at a time: the
    /// row and its `n_per_row` importance weights.
    Weighted(QuantizeImatrixFn),
}

/// Errors of the checked entry points.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    #[error("{op} is not supported for {ty}")]
    Unsupported { ty: GgmlType, op: &'static str },
    #[error("{n} elements is not a multiple of the {ty} block size {block}")]
    NotBlockMultiple {
        ty: GgmlType,
        n: usize,
        block: usize,
    },
    #[error("{what} has length {actual}, expected {expected}")]
    Length {
        what: &'static str,
        expected: usize,
        actual: usize,
    },
}

/// Instruction-set level of a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SimdLevel {
    /// Portable scalar reference.
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F/BW/VL (+ VNNI where available) on top of AVX2.
    Avx512,
}

impl SimdLevel {
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
        }
    }
}

/// The highest level the CPU supports (ignores `MOXIE_QUANT_SIMD`).
pub fn hardware_simd_level() -> SimdLevel {
    static LEVEL: OnceLock<SimdLevel> = OnceLock::new();
    *LEVEL.get_or_init(crate::simd::detect)
}

/// The level [`vec_dot_fn`] uses: the hardware level, lowered by `MOXIE_QUANT_SIMD` if set.
pub fn simd_level() -> SimdLevel {
    static LEVEL: OnceLock<SimdLevel> = OnceLock::new();
    *LEVEL.get_or_init(|| hardware_simd_level().min(requested_simd().0))
}

/// What `MOXIE_QUANT_SIMD` asks for: the highest level to use, and whether AMX tiles may run
/// on top of it (`crate::amx`; only when the variable is unset or `amx`, so `avx512` compares
/// the AVX-512 kernels on an AMX machine).
pub(crate) fn requested_simd() -> (SimdLevel, bool) {
    match std::env::var("MOXIE_QUANT_SIMD").as_deref() {
        Ok("scalar") => (SimdLevel::Scalar, false),
        Ok("avx2") => (SimdLevel::Avx2, false),
        Ok("avx512") => (SimdLevel::Avx512, false),
        _ => (SimdLevel::Avx512, true),
    }
}

/// The activation type ggml pairs with weights of type `ty` in dot products, or `None` if
/// moxie cannot compute with `ty`.
pub fn vec_dot_type(ty: GgmlType) -> Option<GgmlType> {
    row(ty).dot.as_ref().map(|d| d.act)
}

/// Scalar dequantizer for `ty` (ggml's `dequantize_row_*`).
pub fn dequantize_fn(ty: GgmlType) -> Option<DequantizeFn> {
    row(ty).rows.as_ref().map(|r| r.dequantize)
}

/// Scalar version of ggml-cpu's `from_float` for `ty` on x86.
pub(crate) fn quantize_fn_scalar(ty: GgmlType) -> Option<QuantizeFn> {
    row(ty).rows.as_ref()?.quantize.as_ref().map(|q| q.scalar)
}

/// Row quantizer as ggml-cpu's `from_float` runs it on x86 — use this for activations
/// (Q8_0/Q8_1: AVX rounding half-to-even with `id = 127/amax`; Q8_K: `quantize_row_q8_K_ref`).
/// Uses SIMD where available; results are bit-identical to the scalar version.
pub fn quantize_fn(ty: GgmlType) -> Option<QuantizeFn> {
    resolved()[row_index(ty)].quantize
}

/// Row quantizer as llama-quantize runs it without an importance matrix — use this to write
/// weight files (`quantize_row_*_ref`; for IQ4_NL `quantize_iq4_nl` with `ntry = 7`).
pub fn quantize_weights_fn(ty: GgmlType) -> Option<QuantizeFn> {
    row(ty).rows.as_ref()?.quantize_weights
}

/// What llama-quantize runs for `ty` given an importance matrix, or `None` where moxie has not
/// ported it (callers must then refuse the matrix rather than ignore it).
pub fn quantize_weights_imatrix(ty: GgmlType) -> Option<ImatrixQuantizer> {
    row(ty).rows.as_ref()?.quantize_imatrix
}

/// Whether a row of type `ty` holds only finite values where ggml checks them
/// (`ggml_validate_row_data`: every element of F32 / F16 / BF16 / F64, the f16 scales of
/// quantized blocks). Returns the index of the first offending element or block. `data` must
/// be whole blocks.
pub fn validate_row_data(ty: GgmlType, data: &[u8]) -> Result<(), usize> {
    let ts = ty.type_size();
    match ty {
        GgmlType::F32 => data
            .chunks_exact(4)
            .position(|c| !f32::from_le_bytes([c[0], c[1], c[2], c[3]]).is_finite())
            .map_or(Ok(()), Err),
        GgmlType::F64 => data
            .chunks_exact(8)
            .position(|c| !f64::from_le_bytes(c.try_into().unwrap_or([0; 8])).is_finite())
            .map_or(Ok(()), Err),
        // Exponent all ones: infinity or NaN.
        GgmlType::F16 => data
            .chunks_exact(2)
            .position(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7c00 == 0x7c00)
            .map_or(Ok(()), Err),
        GgmlType::BF16 => data
            .chunks_exact(2)
            .position(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7f80 == 0x7f80)
            .map_or(Ok(()), Err),
        _ => {
            let offs = ty.f16_scale_offsets();
            data.chunks_exact(ts)
                .position(|b| {
                    offs.iter()
                        .any(|&o| u16::from_le_bytes([b[o], b[o + 1]]) & 0x7c00 == 0x7c00)
                })
                .map_or(Ok(()), Err)
        }
    }
}

/// Scalar reference dot product for weight type `ty` (ggml's `*_generic` kernels).
pub(crate) fn vec_dot_fn_scalar(ty: GgmlType) -> Option<VecDotFn> {
    row(ty).dot.as_ref().map(|d| d.vec_dot.scalar)
}

/// The kernel used at `level` for `ty` (falling back to lower levels where a type has no kernel
/// at that level), or `None` if `ty` is not supported or the CPU lacks `level`.
pub fn vec_dot_fn_for_level(ty: GgmlType, level: SimdLevel) -> Option<VecDotFn> {
    row(ty).dot.as_ref()?.vec_dot.at(level)
}

/// Activation quantizer used at `level` (see [`vec_dot_fn_for_level`]).
pub fn quantize_fn_for_level(ty: GgmlType, level: SimdLevel) -> Option<QuantizeFn> {
    row(ty).rows.as_ref()?.quantize.as_ref()?.at(level)
}

/// Best dot-product kernel for this CPU (selected once).
pub fn vec_dot_fn(ty: GgmlType) -> Option<VecDotFn> {
    resolved()[row_index(ty)].vec_dot
}

/// The SIMD kernels of each type at [`simd_level`], by table row, resolved once: the hot paths
/// (a matrix's dot, the activations' conversion) look them up per matrix.
#[derive(Clone, Copy, Default)]
struct Resolved {
    vec_dot: Option<VecDotFn>,
    quantize: Option<QuantizeFn>,
}

fn resolved() -> &'static [Resolved; N_ROWS] {
    static RESOLVED: OnceLock<[Resolved; N_ROWS]> = OnceLock::new();
    RESOLVED.get_or_init(|| {
        let level = simd_level();
        let mut t = [Resolved::default(); N_ROWS];
        for ty in GgmlType::ALL {
            t[row_index(ty)] = Resolved {
                vec_dot: vec_dot_fn_for_level(ty, level),
                quantize: quantize_fn_for_level(ty, level),
            };
        }
        t
    })
}

fn check_blocks(ty: GgmlType, n: usize) -> Result<(), QuantError> {
    let block = ty.block_size();
    if !n.is_multiple_of(block) {
        return Err(QuantError::NotBlockMultiple { ty, n, block });
    }
    Ok(())
}

fn check_len(what: &'static str, expected: usize, actual: usize) -> Result<(), QuantError> {
    if expected != actual {
        return Err(QuantError::Length {
            what,
            expected,
            actual,
        });
    }
    Ok(())
}

/// Bytes of a row of `n` values (`n` checked to be whole blocks).
fn row_bytes(ty: GgmlType, n: usize) -> usize {
    ty.row_bytes(n as u64).map_or(usize::MAX, |b| b as usize)
}

/// Checked dequantization of one row: `dst.len()` elements from `src`.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    let f = dequantize_fn(ty).ok_or(QuantError::Unsupported {
        ty,
        op: "dequantize",
    })?;
    check_blocks(ty, dst.len())?;
    check_len("src", row_bytes(ty, dst.len()), src.len())?;
    f(src, dst);
    Ok(())
}

fn quantize_checked(
    ty: GgmlType,
    f: Option<QuantizeFn>,
    src: &[f32],
    dst: &mut [u8],
) -> Result<(), QuantError> {
    let f = f.ok_or(QuantError::Unsupported { ty, op: "quantize" })?;
    check_blocks(ty, src.len())?;
    check_len("dst", row_bytes(ty, src.len()), dst.len())?;
    f(src, dst);
    Ok(())
}

/// Checked activation quantization ([`quantize_fn`]) of one row.
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    quantize_checked(ty, quantize_fn(ty), src, dst)
}

/// Checked weight quantization ([`quantize_weights_fn`]) of one row.
pub fn quantize_weights_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    quantize_checked(ty, quantize_weights_fn(ty), src, dst)
}

/// Checked dot product of `n` elements: `w` of type `ty`, `a` of type `vec_dot_type(ty)`.
pub fn vec_dot(ty: GgmlType, n: usize, w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
    let unsupported = QuantError::Unsupported { ty, op: "vec_dot" };
    let at = vec_dot_type(ty).ok_or(unsupported.clone())?;
    let f = vec_dot_fn(ty).ok_or(unsupported)?;
    check_blocks(ty, n)?;
    check_blocks(at, n)?;
    check_len("weights", row_bytes(ty, n), w.len())?;
    check_len("activations", row_bytes(at, n), a.len())?;
    Ok(f(n, w, a))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_compute_type_has_all_kernels() {
        for ty in GgmlType::ALL {
            if let Some(at) = vec_dot_type(ty) {
                assert!(vec_dot_fn(ty).is_some(), "{ty}");
                assert!(dequantize_fn(ty).is_some(), "{ty}");
                assert!(quantize_fn(at).is_some(), "{ty} act {at}");
                assert!(dequantize_fn(at).is_some(), "{ty} act {at}");
            } else {
                assert!(vec_dot_fn(ty).is_none(), "{ty}");
            }
        }
        assert_eq!(vec_dot_type(GgmlType::IQ4_NL), Some(GgmlType::Q8_0));
        assert_eq!(vec_dot_type(GgmlType::IQ4_XS), Some(GgmlType::Q8_K));
        assert_eq!(vec_dot_type(GgmlType::Q5_1), Some(GgmlType::Q8_1));
        assert_eq!(vec_dot_type(GgmlType::Q8_K), None);
        assert_eq!(vec_dot_type(GgmlType::IQ2_XXS), Some(GgmlType::Q8_K));
        assert_eq!(vec_dot_type(GgmlType::TQ1_0), None);
    }

    #[test]
    fn checked_wrappers_reject_bad_lengths() {
        let mut out = vec![0f32; 32];
        assert_eq!(
            dequantize_row(GgmlType::Q4_0, &[0u8; 17], &mut out),
            Err(QuantError::Length {
                what: "src",
                expected: 18,
                actual: 17
            })
        );
        let mut out = vec![0f32; 31];
        assert!(matches!(
            dequantize_row(GgmlType::Q4_0, &[0u8; 18], &mut out),
            Err(QuantError::NotBlockMultiple { .. })
        ));
        assert!(matches!(
            dequantize_row(GgmlType::TQ1_0, &[0u8; 54], &mut [0f32; 256]),
            Err(QuantError::Unsupported { .. })
        ));
        let mut dst = vec![0u8; 144];
        assert!(quantize_row(GgmlType::Q4_K, &[0.5f32; 256], &mut dst).is_ok());
        assert!(quantize_row(GgmlType::Q4_K, &[0.5f32; 128], &mut dst).is_err());
        // Q4_K dot needs whole super-blocks for both operands
        assert!(matches!(
            vec_dot(GgmlType::Q4_K, 32, &[0u8; 18], &[0u8; 34]),
            Err(QuantError::NotBlockMultiple { .. })
        ));
        assert!(matches!(
            vec_dot(GgmlType::Q4_K, 256, &dst, &[0u8; 291]),
            Err(QuantError::Length {
                what: "activations",
                ..
            })
        ));
        assert_eq!(vec_dot(GgmlType::Q4_K, 256, &dst, &[0u8; 292]), Ok(0.0));
    }
}
