//! The type table: one row per ggml type holding everything moxie knows about it — layout
//! (block size, bytes per block, where its f16 scales are), row conversions (ggml's
//! `dequantize_row_*`, ggml-cpu's `from_float` and the x86 SIMD versions of it,
//! llama-quantize's weight quantizer), and for the types moxie computes with: the dot
//! product's activation type, the dot kernels per SIMD level, and the batched kernels whose
//! summation order ggml's batched `mul_mat` paths use (llamafile tinyBLAS, the tiled K-quant
//! matmul) or that the fast int8 GEMM decodes. Supporting a new type is one row here (plus its
//! id in [`GgmlType`]); every per-type question in the crate (`block_size`, `vec_dot_type`,
//! `vec_dot_fn`, `tinyblas_dot_fn`, `tiled_dot_fn`, `gemm_supports`, ...) reads its row.
//!
//! Sources: ggml's `ggml.h` / `ggml-common.h` (ids, block structs), ggml-cpu's
//! `type_traits_cpu` (`vec_dot_type`, `from_float`), `llamafile/sgemm.cpp` and
//! `ggml-cpu/tiled/` (which types take which batched path), as listed in each kernel module.

use crate::dispatch::{DequantizeFn, ImatrixQuantizer, QuantizeFn, SimdLevel, VecDotFn};
use crate::gemm::{self, GemmLayout};
#[cfg(target_arch = "x86_64")]
use crate::simd::x86_avx2_iq1_iq3s as avx2_iq;
#[cfg(target_arch = "x86_64")]
use crate::simd::{
    x86_avx2 as avx2, x86_avx2_iqk as avx2_iqk, x86_avx512 as avx512, x86_avx512_iq as avx512_iq,
    x86_avx512_iqk as avx512_iqk,
};
use crate::tiled::{self, DotManyFn};
use crate::types::{GgmlType, QK_K};
use crate::{bf16, f16, iq1, iq2_3, iq3s, iq4, iqk, kquants, legacy, tinyblas, weighted};

/// `Some(kernel)` of the x86-64 SIMD modules; `None` when building for another architecture
/// (the kernel's path is then never resolved).
#[cfg(target_arch = "x86_64")]
macro_rules! x86 {
    ($f:path) => {
        Some($f)
    };
}
#[cfg(not(target_arch = "x86_64"))]
macro_rules! x86 {
    ($f:path) => {
        None
    };
}

/// Everything about one ggml type.
pub(crate) struct TypeRow {
    pub ty: GgmlType,
    /// The name ggml and llama.cpp print.
    pub name: &'static str,
    /// Elements per block.
    pub block_size: usize,
    /// Bytes per block.
    pub type_size: usize,
    /// Bytes before a row's blocks (ik_llama.cpp's `_KS` types keep the row's scale there).
    pub row_meta: usize,
    /// Byte offsets of the f16 scale fields (`d`, and `dmin`/`m`) within one block.
    pub f16_scales: &'static [usize],
    /// ggml-cpu runs batched `mul_mat` / `mul_mat_id` of this type through its tiled matmul
    /// (`ggml_tiled_supported`), whether or not moxie has ported that order ([`Dot::tiled`]).
    pub ggml_tiled: bool,
    /// Row conversions, for the types moxie reads or writes (weights, activations, caches).
    pub rows: Option<Rows>,
    /// Dot products, for the weight types moxie computes with.
    pub dot: Option<Dot>,
}

/// A type's row conversions.
pub(crate) struct Rows {
    /// ggml's `dequantize_row_*`.
    pub dequantize: DequantizeFn,
    /// ggml-cpu's `from_float` on x86 (what activations are converted with); the SIMD
    /// versions are bit-identical to the scalar one. `None` where ggml-cpu has none (the
    /// IQ1/IQ2/IQ3 types: their quantizers search code books and need an importance matrix).
    pub quantize: Option<Simd<QuantizeFn>>,
    /// What llama-quantize writes without an importance matrix (`quantize_row_*_ref`), where
    /// moxie has that quantizer.
    pub quantize_weights: Option<QuantizeFn>,
    /// What llama-quantize does with an importance matrix, where moxie has ported it.
    pub quantize_imatrix: Option<ImatrixQuantizer>,
}

/// Dot products with weights of a type.
pub(crate) struct Dot {
    /// The activation type ggml pairs with it (`vec_dot_type`).
    pub act: GgmlType,
    /// `vec_dot`, per SIMD level.
    pub vec_dot: Simd<VecDotFn>,
    /// llamafile tinyBLAS's order, which ggml uses for batched `mul_mat` of this type.
    pub tinyblas: Option<TinyBlas>,
    /// The tiled K-quant matmul's order (ported types; see [`TypeRow::ggml_tiled`]).
    pub tiled: Option<Tiled>,
    /// How the int8 VNNI GEMM (fast numerics) decodes this type.
    pub gemm: Option<GemmLayout>,
}

/// A kernel with x86 SIMD versions. `avx512` falls back to `avx2`, which falls back to
/// `scalar`.
pub(crate) struct Simd<F> {
    pub scalar: F,
    avx2: Option<F>,
    avx512: Option<F>,
}

impl<F: Copy> Simd<F> {
    /// The kernel for `level`, or `None` if this CPU lacks `level` (a SIMD kernel may only run
    /// where its target features were detected).
    pub fn at(&self, level: SimdLevel) -> Option<F> {
        if level > crate::hardware_simd_level() {
            return None;
        }
        let pick = match level {
            SimdLevel::Avx512 => self.avx512.or(self.avx2),
            SimdLevel::Avx2 => self.avx2,
            SimdLevel::Scalar => None,
        };
        Some(pick.unwrap_or(self.scalar))
    }
}

/// llamafile tinyBLAS's dot for one weight row against one activation row, and for many
/// activation rows at once (each weight block unpacked once); ggml takes the path for rows
/// of a multiple of `k_multiple` elements.
#[derive(Clone, Copy)]
pub(crate) struct TinyBlas {
    pub dot: VecDotFn,
    pub many: Option<DotManyFn>,
    pub k_multiple: usize,
}

/// The tiled matmul's dot, single and many activation rows (rows of whole 256-blocks).
#[derive(Clone, Copy)]
pub(crate) struct Tiled {
    pub dot: VecDotFn,
    pub many: DotManyFn,
}

/// A type moxie only knows the layout of (it can read files holding it, not compute with it).
const fn layout(ty: GgmlType, name: &'static str, block_size: usize, type_size: usize) -> TypeRow {
    TypeRow {
        ty,
        name,
        block_size,
        type_size,
        row_meta: 0,
        f16_scales: &[],
        ggml_tiled: false,
        rows: None,
        dot: None,
    }
}

/// Row conversions whose weight quantizer is `from_float`'s scalar one.
const fn conversions(
    dequantize: DequantizeFn,
    quantize: QuantizeFn,
    avx2: Option<QuantizeFn>,
    avx512: Option<QuantizeFn>,
) -> Rows {
    Rows {
        dequantize,
        quantize: Some(Simd {
            scalar: quantize,
            avx2,
            avx512,
        }),
        quantize_weights: Some(quantize),
        quantize_imatrix: None,
    }
}

/// `rows` whose importance-matrix quantizer is `weighted` (or that ignore the matrix).
const fn with_imatrix(rows: Rows, imatrix: ImatrixQuantizer) -> Rows {
    Rows {
        quantize_imatrix: Some(imatrix),
        ..rows
    }
}

/// Row conversions of a type moxie reads but does not write.
const fn dequantize_only(dequantize: DequantizeFn) -> Rows {
    Rows {
        dequantize,
        quantize: None,
        quantize_weights: None,
        quantize_imatrix: None,
    }
}

/// A dot product with only `vec_dot` kernels.
const fn dot(
    act: GgmlType,
    scalar: VecDotFn,
    avx2: Option<VecDotFn>,
    avx512: Option<VecDotFn>,
) -> Dot {
    Dot {
        act,
        vec_dot: Simd {
            scalar,
            avx2,
            avx512,
        },
        tinyblas: None,
        tiled: None,
        gemm: None,
    }
}

const fn tinyblas(dot: VecDotFn, many: Option<DotManyFn>, k_multiple: usize) -> Option<TinyBlas> {
    Some(TinyBlas {
        dot,
        many,
        k_multiple,
    })
}

const fn tiled(dot: VecDotFn, many: DotManyFn) -> Option<Tiled> {
    Some(Tiled { dot, many })
}

/// How the int8 GEMM reads an ik_llama.cpp type: `sub`-value groups, values + `offset`.
const fn ik_gemm(
    sub: usize,
    offset: i32,
    decode: gemm::DecodeRowFn,
    unpack_tile: Option<gemm::UnpackTileFn>,
) -> GemmLayout {
    GemmLayout {
        sub,
        mins: false,
        offset,
        code_bits: 8,
        decode,
        unpack_tile,
    }
}

/// The row of one of ik_llama.cpp's super-block types (`kind` is its layout in `iqk.rs`):
/// read-only, Q8_K activations, a scalar reference and AVX2 and AVX-512 kernels, and for the
/// int8 GEMM a row decoder and an AVX-512 tile decoder.
#[allow(clippy::too_many_arguments)]
const fn ik_row(
    ty: GgmlType,
    name: &'static str,
    kind: &iqk::Kind,
    dequantize: DequantizeFn,
    scalar: VecDotFn,
    avx2: Option<VecDotFn>,
    avx512: Option<VecDotFn>,
    decode: gemm::DecodeRowFn,
    unpack_tile: Option<gemm::UnpackTileFn>,
) -> TypeRow {
    TypeRow {
        row_meta: kind.row_prefix(),
        f16_scales: if kind.row_prefix() == 0 { &[0] } else { &[] },
        rows: Some(dequantize_only(dequantize)),
        dot: Some(Dot {
            // Values + 128 are unsigned bytes: every code book lies in -127..127.
            gemm: Some(ik_gemm(kind.group, 128, decode, unpack_tile)),
            ..dot(T::Q8_K, scalar, avx2, avx512)
        }),
        ..layout(ty, name, QK_K, kind.bytes)
    }
}

use GgmlType as T;

/// Every type, in id order.
const ROWS: [TypeRow; 53] = [
    TypeRow {
        rows: Some(with_imatrix(
            conversions(f16::dequantize_row_f32, f16::quantize_row_f32, None, None),
            ImatrixQuantizer::Ignores,
        )),
        dot: Some(Dot {
            tinyblas: tinyblas(tinyblas::dot_f32, None, 16),
            ..dot(
                T::F32,
                f16::vec_dot_f32_f32,
                x86!(avx2::dot_f32),
                x86!(avx512::dot_f32),
            )
        }),
        ..layout(T::F32, "F32", 1, 4)
    },
    TypeRow {
        rows: Some(with_imatrix(
            conversions(
                f16::dequantize_row_f16,
                f16::quantize_row_f16,
                x86!(avx2::quantize_f16),
                x86!(avx2::quantize_f16),
            ),
            ImatrixQuantizer::Ignores,
        )),
        dot: Some(Dot {
            tinyblas: tinyblas(tinyblas::dot_f16, None, 16),
            ..dot(
                T::F16,
                f16::vec_dot_f16_f16,
                x86!(avx2::dot_f16),
                x86!(avx512::dot_f16),
            )
        }),
        ..layout(T::F16, "F16", 1, 2)
    },
    TypeRow {
        f16_scales: &[0],
        rows: Some(with_imatrix(
            conversions(
                legacy::dequantize_row_q4_0,
                legacy::quantize_row_q4_0,
                None,
                None,
            ),
            ImatrixQuantizer::Weighted(weighted::quantize_row_q4_0_imatrix),
        )),
        dot: Some(Dot {
            tinyblas: tinyblas(tinyblas::dot_q4_0, Some(tinyblas::many_q4_0), 1),
            gemm: Some(GemmLayout {
                sub: 32,
                mins: false,
                offset: 8,
                code_bits: 4,
                decode: gemm::decode_q4_0,
                unpack_tile: None,
            }),
            ..dot(
                T::Q8_0,
                legacy::vec_dot_q4_0_q8_0,
                x86!(avx2::dot_q4_0),
                x86!(avx512::dot_q4_0),
            )
        }),
        ..layout(T::Q4_0, "Q4_0", 32, 18)
    },
    TypeRow {
        f16_scales: &[0, 2],
        rows: Some(with_imatrix(
            conversions(
                legacy::dequantize_row_q4_1,
                legacy::quantize_row_q4_1,
                None,
                None,
            ),
            ImatrixQuantizer::Weighted(weighted::quantize_row_q4_1_imatrix),
        )),
        dot: Some(Dot {
            gemm: Some(GemmLayout {
                sub: 32,
                mins: true,
                offset: 0,
                code_bits: 4,
                decode: gemm::decode_q4_1,
                unpack_tile: None,
            }),
            ..dot(
                T::Q8_1,
                legacy::vec_dot_q4_1_q8_1,
                x86!(avx2::dot_q4_1),
                None,
            )
        }),
        ..layout(T::Q4_1, "Q4_1", 32, 20)
    },
    TypeRow {
        f16_scales: &[0],
        rows: Some(with_imatrix(
            conversions(
                legacy::dequantize_row_q5_0,
                legacy::quantize_row_q5_0,
                None,
                None,
            ),
            ImatrixQuantizer::Weighted(weighted::quantize_row_q5_0_imatrix),
        )),
        dot: Some(Dot {
            tinyblas: tinyblas(tinyblas::dot_q5_0, Some(tinyblas::many_q5_0), 1),
            gemm: Some(GemmLayout {
                sub: 32,
                mins: false,
                offset: 16,
                code_bits: 5,
                decode: gemm::decode_q5_0,
                unpack_tile: None,
            }),
            ..dot(
                T::Q8_0,
                legacy::vec_dot_q5_0_q8_0,
                x86!(avx2::dot_q5_0),
                None,
            )
        }),
        ..layout(T::Q5_0, "Q5_0", 32, 22)
    },
    TypeRow {
        f16_scales: &[0, 2],
        rows: Some(with_imatrix(
            conversions(
                legacy::dequantize_row_q5_1,
                legacy::quantize_row_q5_1,
                None,
                None,
            ),
            ImatrixQuantizer::Weighted(weighted::quantize_row_q5_1_imatrix),
        )),
        dot: Some(dot(
            T::Q8_1,
            legacy::vec_dot_q5_1_q8_1,
            x86!(avx2::dot_q5_1),
            None,
        )),
        ..layout(T::Q5_1, "Q5_1", 32, 24)
    },
    TypeRow {
        f16_scales: &[0],
        rows: Some(Rows {
            // Activations round half to even with `id = 127/amax` (x86); llama-quantize
            // writes the reference rounding.
            quantize_weights: Some(legacy::quantize_row_q8_0_ref),
            // `quantize_q8_0` takes the weights and ignores them.
            quantize_imatrix: Some(ImatrixQuantizer::Ignores),
            ..conversions(
                legacy::dequantize_row_q8_0,
                legacy::quantize_row_q8_0,
                x86!(avx2::quantize_q8_0),
                x86!(avx512::quantize_q8_0),
            )
        }),
        dot: Some(Dot {
            tinyblas: tinyblas(tinyblas::dot_q8_0, Some(tinyblas::many_q8_0), 1),
            gemm: Some(GemmLayout {
                sub: 32,
                mins: false,
                offset: 128,
                code_bits: 8,
                decode: gemm::decode_q8_0,
                unpack_tile: None,
            }),
            ..dot(
                T::Q8_0,
                legacy::vec_dot_q8_0_q8_0,
                x86!(avx2::dot_q8_0),
                x86!(avx512::dot_q8_0),
            )
        }),
        ..layout(T::Q8_0, "Q8_0", 32, 34)
    },
    // Activations only (the partner of Q4_1 / Q5_1).
    TypeRow {
        rows: Some(Rows {
            quantize_weights: Some(legacy::quantize_row_q8_1_ref),
            ..conversions(
                legacy::dequantize_row_q8_1,
                legacy::quantize_row_q8_1,
                None,
                None,
            )
        }),
        ..layout(T::Q8_1, "Q8_1", 32, 36)
    },
    TypeRow {
        f16_scales: &[80, 82],
        ggml_tiled: true,
        rows: Some(with_imatrix(
            conversions(
                kquants::dequantize_row_q2_k,
                kquants::quantize_row_q2_k,
                None,
                None,
            ),
            ImatrixQuantizer::Weighted(weighted::quantize_row_q2_k_imatrix),
        )),
        dot: Some(Dot {
            tiled: tiled(tiled::dot_q2_k, tiled::many_q2_k),
            ..dot(
                T::Q8_K,
                kquants::vec_dot_q2_k_q8_k,
                x86!(avx2::dot_q2_k),
                None,
            )
        }),
        ..layout(T::Q2_K, "Q2_K", QK_K, 84)
    },
    TypeRow {
        f16_scales: &[108],
        ggml_tiled: true,
        rows: Some(with_imatrix(
            conversions(
                kquants::dequantize_row_q3_k,
                kquants::quantize_row_q3_k,
                None,
                None,
            ),
            ImatrixQuantizer::Weighted(weighted::quantize_row_q3_k_imatrix),
        )),
        dot: Some(Dot {
            tiled: tiled(tiled::dot_q3_k, tiled::many_q3_k),
            ..dot(
                T::Q8_K,
                kquants::vec_dot_q3_k_q8_k,
                x86!(avx2::dot_q3_k),
                None,
            )
        }),
        ..layout(T::Q3_K, "Q3_K", QK_K, 110)
    },
    TypeRow {
        f16_scales: &[0, 2],
        ggml_tiled: true,
        rows: Some(with_imatrix(
            conversions(
                kquants::dequantize_row_q4_k,
                kquants::quantize_row_q4_k,
                None,
                None,
            ),
            ImatrixQuantizer::Weighted(weighted::quantize_row_q4_k_imatrix),
        )),
        dot: Some(Dot {
            tiled: tiled(tiled::dot_q4_k, tiled::many_q4_k),
            gemm: Some(GemmLayout {
                sub: 32,
                mins: true,
                offset: 0,
                code_bits: 4,
                decode: gemm::decode_q4_k,
                unpack_tile: x86!(gemm::unpack_tile_q4_k),
            }),
            ..dot(
                T::Q8_K,
                kquants::vec_dot_q4_k_q8_k,
                x86!(avx2::dot_q4_k),
                x86!(avx512::dot_q4_k),
            )
        }),
        ..layout(T::Q4_K, "Q4_K", QK_K, 144)
    },
    TypeRow {
        f16_scales: &[0, 2],
        ggml_tiled: true,
        rows: Some(with_imatrix(
            conversions(
                kquants::dequantize_row_q5_k,
                kquants::quantize_row_q5_k,
                None,
                None,
            ),
            ImatrixQuantizer::Weighted(weighted::quantize_row_q5_k_imatrix),
        )),
        dot: Some(Dot {
            tiled: tiled(tiled::dot_q5_k, tiled::many_q5_k),
            gemm: Some(GemmLayout {
                sub: 32,
                mins: true,
                offset: 0,
                code_bits: 5,
                decode: gemm::decode_q5_k,
                unpack_tile: None,
            }),
            ..dot(
                T::Q8_K,
                kquants::vec_dot_q5_k_q8_k,
                x86!(avx2::dot_q5_k),
                x86!(avx512::dot_q5_k),
            )
        }),
        ..layout(T::Q5_K, "Q5_K", QK_K, 176)
    },
    TypeRow {
        f16_scales: &[208],
        ggml_tiled: true,
        rows: Some(with_imatrix(
            conversions(
                kquants::dequantize_row_q6_k,
                kquants::quantize_row_q6_k,
                None,
                None,
            ),
            ImatrixQuantizer::Weighted(weighted::quantize_row_q6_k_imatrix),
        )),
        dot: Some(Dot {
            tiled: tiled(tiled::dot_q6_k, tiled::many_q6_k),
            gemm: Some(GemmLayout {
                sub: 16,
                mins: false,
                offset: 32,
                code_bits: 6,
                decode: gemm::decode_q6_k,
                unpack_tile: x86!(gemm::unpack_tile_q6_k),
            }),
            ..dot(
                T::Q8_K,
                kquants::vec_dot_q6_k_q8_k,
                x86!(avx2::dot_q6_k),
                x86!(avx512::dot_q6_k),
            )
        }),
        ..layout(T::Q6_K, "Q6_K", QK_K, 210)
    },
    // Activations only (the partner of the K-quants and the 256-element IQ types).
    TypeRow {
        rows: Some(conversions(
            kquants::dequantize_row_q8_k,
            kquants::quantize_row_q8_k,
            x86!(avx2::quantize_q8_k),
            x86!(avx512::quantize_q8_k),
        )),
        ..layout(T::Q8_K, "Q8_K", QK_K, 292)
    },
    TypeRow {
        ggml_tiled: true,
        f16_scales: &[0],
        rows: Some(dequantize_only(iq2_3::dequantize_row_iq2_xxs)),
        dot: Some(Dot {
            tiled: tiled(tiled::dot_iq2_xxs, tiled::many_iq2_xxs),
            gemm: Some(GemmLayout {
                sub: 32,
                mins: false,
                offset: 128,
                code_bits: 8,
                decode: gemm::decode_iq2_xxs,
                unpack_tile: None,
            }),
            ..dot(
                T::Q8_K,
                iq2_3::vec_dot_iq2_xxs_q8_k,
                x86!(avx2::dot_iq2_xxs),
                x86!(avx512_iq::dot_iq2_xxs),
            )
        }),
        ..layout(T::IQ2_XXS, "IQ2_XXS", QK_K, 66)
    },
    TypeRow {
        ggml_tiled: true,
        f16_scales: &[0],
        rows: Some(dequantize_only(iq2_3::dequantize_row_iq2_xs)),
        dot: Some(Dot {
            tiled: tiled(tiled::dot_iq2_xs, tiled::many_iq2_xs),
            gemm: Some(GemmLayout {
                sub: 16,
                mins: false,
                offset: 128,
                code_bits: 8,
                decode: gemm::decode_iq2_xs,
                unpack_tile: None,
            }),
            ..dot(
                T::Q8_K,
                iq2_3::vec_dot_iq2_xs_q8_k,
                x86!(avx2::dot_iq2_xs),
                x86!(avx512_iq::dot_iq2_xs),
            )
        }),
        ..layout(T::IQ2_XS, "IQ2_XS", QK_K, 74)
    },
    TypeRow {
        ggml_tiled: true,
        f16_scales: &[0],
        rows: Some(dequantize_only(iq2_3::dequantize_row_iq3_xxs)),
        dot: Some(Dot {
            tiled: tiled(tiled::dot_iq3_xxs, tiled::many_iq3_xxs),
            gemm: Some(GemmLayout {
                sub: 32,
                mins: false,
                offset: 128,
                code_bits: 8,
                decode: gemm::decode_iq3_xxs,
                unpack_tile: None,
            }),
            ..dot(
                T::Q8_K,
                iq2_3::vec_dot_iq3_xxs_q8_k,
                x86!(avx2::dot_iq3_xxs),
                x86!(avx512_iq::dot_iq3_xxs),
            )
        }),
        ..layout(T::IQ3_XXS, "IQ3_XXS", QK_K, 98)
    },
    TypeRow {
        f16_scales: &[0],
        ggml_tiled: true,
        rows: Some(dequantize_only(iq1::dequantize_row_iq1_s)),
        dot: Some(Dot {
            tiled: tiled(tiled::dot_iq1_s, tiled::many_iq1_s),
            gemm: Some(GemmLayout {
                sub: 32,
                mins: false,
                offset: 128,
                code_bits: 8,
                decode: tiled::gemm_decode_iq1_s,
                unpack_tile: None,
            }),
            ..dot(
                T::Q8_K,
                iq1::vec_dot_iq1_s_q8_k,
                x86!(avx2_iq::dot_iq1_s),
                x86!(avx512_iq::dot_iq1_s),
            )
        }),
        ..layout(T::IQ1_S, "IQ1_S", QK_K, 50)
    },
    TypeRow {
        f16_scales: &[0],
        rows: Some(Rows {
            // llama-quantize searches 7 scales (`quantize_iq4_nl`); `from_float` is the
            // reference quantizer.
            quantize_weights: Some(iq4::quantize_row_iq4_nl),
            quantize_imatrix: Some(ImatrixQuantizer::Weighted(iq4::quantize_row_iq4_nl_imatrix)),
            ..conversions(
                iq4::dequantize_row_iq4_nl,
                iq4::quantize_row_iq4_nl_ref,
                None,
                None,
            )
        }),
        dot: Some(Dot {
            tinyblas: tinyblas(tinyblas::dot_iq4_nl, Some(tinyblas::many_iq4_nl), 1),
            ..dot(
                T::Q8_0,
                iq4::vec_dot_iq4_nl_q8_0,
                x86!(avx2::dot_iq4_nl),
                None,
            )
        }),
        ..layout(T::IQ4_NL, "IQ4_NL", 32, 18)
    },
    TypeRow {
        f16_scales: &[0],
        ggml_tiled: true,
        rows: Some(dequantize_only(iq3s::dequantize_row_iq3_s)),
        dot: Some(Dot {
            tiled: tiled(tiled::dot_iq3_s, tiled::many_iq3_s),
            gemm: Some(GemmLayout {
                sub: 32,
                mins: false,
                offset: 128,
                code_bits: 8,
                decode: tiled::gemm_decode_iq3_s,
                unpack_tile: None,
            }),
            ..dot(
                T::Q8_K,
                iq3s::vec_dot_iq3_s_q8_k,
                x86!(avx2_iq::dot_iq3_s),
                x86!(avx512_iq::dot_iq3_s),
            )
        }),
        ..layout(T::IQ3_S, "IQ3_S", QK_K, 110)
    },
    TypeRow {
        ggml_tiled: true,
        f16_scales: &[0],
        rows: Some(dequantize_only(iq2_3::dequantize_row_iq2_s)),
        dot: Some(Dot {
            tiled: tiled(tiled::dot_iq2_s, tiled::many_iq2_s),
            gemm: Some(GemmLayout {
                sub: 16,
                mins: false,
                offset: 128,
                code_bits: 8,
                decode: gemm::decode_iq2_s,
                unpack_tile: None,
            }),
            ..dot(
                T::Q8_K,
                iq2_3::vec_dot_iq2_s_q8_k,
                x86!(avx2::dot_iq2_s),
                x86!(avx512_iq::dot_iq2_s),
            )
        }),
        ..layout(T::IQ2_S, "IQ2_S", QK_K, 82)
    },
    TypeRow {
        f16_scales: &[0],
        ggml_tiled: true,
        rows: Some(with_imatrix(
            conversions(
                iq4::dequantize_row_iq4_xs,
                iq4::quantize_row_iq4_xs,
                None,
                None,
            ),
            ImatrixQuantizer::Weighted(iq4::quantize_row_iq4_xs_imatrix),
        )),
        dot: Some(Dot {
            tiled: tiled(tiled::dot_iq4_xs, tiled::many_iq4_xs),
            ..dot(
                T::Q8_K,
                iq4::vec_dot_iq4_xs_q8_k,
                x86!(avx2::dot_iq4_xs),
                None,
            )
        }),
        ..layout(T::IQ4_XS, "IQ4_XS", QK_K, 136)
    },
    layout(T::I8, "I8", 1, 1),
    layout(T::I16, "I16", 1, 2),
    layout(T::I32, "I32", 1, 4),
    layout(T::I64, "I64", 1, 8),
    layout(T::F64, "F64", 1, 8),
    // The f16 scale is spread over the top nibbles of the scale words (no `f16_scales`).
    TypeRow {
        ggml_tiled: true,
        rows: Some(dequantize_only(iq1::dequantize_row_iq1_m)),
        dot: Some(Dot {
            tiled: tiled(tiled::dot_iq1_m, tiled::many_iq1_m),
            gemm: Some(GemmLayout {
                sub: 16,
                mins: false,
                offset: 128,
                code_bits: 8,
                decode: tiled::gemm_decode_iq1_m,
                unpack_tile: None,
            }),
            ..dot(
                T::Q8_K,
                iq1::vec_dot_iq1_m_q8_k,
                x86!(avx2_iq::dot_iq1_m),
                x86!(avx512_iq::dot_iq1_m),
            )
        }),
        ..layout(T::IQ1_M, "IQ1_M", QK_K, 56)
    },
    TypeRow {
        rows: Some(with_imatrix(
            conversions(f16::dequantize_row_bf16, f16::quantize_row_bf16, None, None),
            ImatrixQuantizer::Ignores,
        )),
        dot: Some(Dot {
            tinyblas: tinyblas(bf16::tinyblas_dot, Some(bf16::tinyblas_many), 32),
            ..dot(T::BF16, f16::vec_dot_bf16_bf16, None, x86!(bf16::vec_dot))
        }),
        ..layout(T::BF16, "BF16", 1, 2)
    },
    layout(T::TQ1_0, "TQ1_0", QK_K, 54),
    layout(T::TQ2_0, "TQ2_0", QK_K, 66),
    layout(T::MXFP4, "MXFP4", 32, 17),
    layout(T::NVFP4, "NVFP4", 64, 36),
    layout(T::Q1_0, "Q1_0", 128, 18),
    layout(T::Q2_0, "Q2_0", 64, 18),
    // ik_llama.cpp's types (`iqk.rs`). ik's own kernels are its only reference for the dots
    // (`iqk_mul_mat`, whose order changes with the batch size), so there is no ggml order to
    // follow: every level computes the reference's integers and float steps, and the int8
    // GEMM serves batches in fast numerics.
    TypeRow {
        f16_scales: &[0],
        rows: Some(dequantize_only(iqk::dequantize_row_q6_0)),
        dot: Some(Dot {
            gemm: Some(ik_gemm(
                32,
                32,
                iqk::gemm_decode_q6_0,
                x86!(avx512_iqk::unpack_tile_q6_0),
            )),
            ..dot(
                T::Q8_0,
                iqk::vec_dot_q6_0_q8_0,
                x86!(avx2_iqk::dot_q6_0),
                x86!(avx512_iqk::dot_q6_0),
            )
        }),
        ..layout(T::Q6_0, "Q6_0", 32, iqk::Q6_0_BYTES)
    },
    TypeRow {
        row_meta: 2,
        ..layout(T::IQ1_BN, "IQ1_BN", 64, 13)
    },
    TypeRow {
        row_meta: 4,
        ..layout(T::IQ2_BN, "IQ2_BN", 64, 16)
    },
    ik_row(
        T::IQ2_K,
        "IQ2_K",
        &iqk::IQ2_K,
        iqk::dequantize_row_iq2_k,
        iqk::vec_dot_iq2_k_q8_k,
        x86!(avx2_iqk::dot_iq2_k),
        x86!(avx512_iqk::dot_iq2_k),
        iqk::gemm_decode_iq2_k,
        x86!(avx512_iqk::unpack_tile_iq2_k),
    ),
    ik_row(
        T::IQ3_K,
        "IQ3_K",
        &iqk::IQ3_K,
        iqk::dequantize_row_iq3_k,
        iqk::vec_dot_iq3_k_q8_k,
        x86!(avx2_iqk::dot_iq3_k),
        x86!(avx512_iqk::dot_iq3_k),
        iqk::gemm_decode_iq3_k,
        x86!(avx512_iqk::unpack_tile_iq3_k),
    ),
    ik_row(
        T::IQ4_K,
        "IQ4_K",
        &iqk::IQ4_K,
        iqk::dequantize_row_iq4_k,
        iqk::vec_dot_iq4_k_q8_k,
        x86!(avx2_iqk::dot_iq4_k),
        x86!(avx512_iqk::dot_iq4_k),
        iqk::gemm_decode_iq4_k,
        x86!(avx512_iqk::unpack_tile_iq4_k),
    ),
    ik_row(
        T::IQ5_K,
        "IQ5_K",
        &iqk::IQ5_K,
        iqk::dequantize_row_iq5_k,
        iqk::vec_dot_iq5_k_q8_k,
        x86!(avx2_iqk::dot_iq5_k),
        x86!(avx512_iqk::dot_iq5_k),
        iqk::gemm_decode_iq5_k,
        x86!(avx512_iqk::unpack_tile_iq5_k),
    ),
    ik_row(
        T::IQ6_K,
        "IQ6_K",
        &iqk::IQ6_K,
        iqk::dequantize_row_iq6_k,
        iqk::vec_dot_iq6_k_q8_k,
        x86!(avx2_iqk::dot_iq6_k),
        x86!(avx512_iqk::dot_iq6_k),
        iqk::gemm_decode_iq6_k,
        x86!(avx512_iqk::unpack_tile_iq6_k),
    ),
    ik_row(
        T::IQ4_KS,
        "IQ4_KS",
        &iqk::IQ4_KS,
        iqk::dequantize_row_iq4_ks,
        iqk::vec_dot_iq4_ks_q8_k,
        x86!(avx2_iqk::dot_iq4_ks),
        x86!(avx512_iqk::dot_iq4_ks),
        iqk::gemm_decode_iq4_ks,
        x86!(avx512_iqk::unpack_tile_iq4_ks),
    ),
    ik_row(
        T::IQ2_KS,
        "IQ2_KS",
        &iqk::IQ2_KS,
        iqk::dequantize_row_iq2_ks,
        iqk::vec_dot_iq2_ks_q8_k,
        x86!(avx2_iqk::dot_iq2_ks),
        x86!(avx512_iqk::dot_iq2_ks),
        iqk::gemm_decode_iq2_ks,
        x86!(avx512_iqk::unpack_tile_iq2_ks),
    ),
    TypeRow {
        row_meta: 4,
        ..layout(T::IQ4_KSS, "IQ4_KSS", QK_K, 128)
    },
    ik_row(
        T::IQ5_KS,
        "IQ5_KS",
        &iqk::IQ5_KS,
        iqk::dequantize_row_iq5_ks,
        iqk::vec_dot_iq5_ks_q8_k,
        x86!(avx2_iqk::dot_iq5_ks),
        x86!(avx512_iqk::dot_iq5_ks),
        iqk::gemm_decode_iq5_ks,
        x86!(avx512_iqk::unpack_tile_iq5_ks),
    ),
    TypeRow {
        row_meta: 4,
        ..layout(T::IQ2_KT, "IQ2_KT", QK_K, 68)
    },
    TypeRow {
        row_meta: 4,
        ..layout(T::IQ3_KT, "IQ3_KT", QK_K, 100)
    },
    TypeRow {
        row_meta: 4,
        ..layout(T::IQ4_KT, "IQ4_KT", QK_K, 128)
    },
    ik_row(
        T::IQ3_KS,
        "IQ3_KS",
        &iqk::IQ3_KS,
        iqk::dequantize_row_iq3_ks,
        iqk::vec_dot_iq3_ks_q8_k,
        x86!(avx2_iqk::dot_iq3_ks),
        x86!(avx512_iqk::dot_iq3_ks),
        iqk::gemm_decode_iq3_ks,
        x86!(avx512_iqk::unpack_tile_iq3_ks),
    ),
    TypeRow {
        row_meta: 2,
        ..layout(T::IQ2_KL, "IQ2_KL", QK_K, 86)
    },
    TypeRow {
        row_meta: 4,
        ..layout(T::IQ1_KT, "IQ1_KT", QK_K, 56)
    },
];

/// The table, at one address (a `const` would be copied where it is indexed).
static TABLE: [TypeRow; ROWS.len()] = ROWS;

/// Ids are below this (ik_llama.cpp's reach 158; one byte per id up to here).
const MAX_ID: usize = 160;

/// Number of rows.
pub(crate) const N_ROWS: usize = ROWS.len();

/// Row index by type id; ids must be unique and below [`MAX_ID`] (checked when compiling).
static INDEX: [u8; MAX_ID] = {
    let mut index = [u8::MAX; MAX_ID];
    let mut i = 0;
    while i < ROWS.len() {
        let id = ROWS[i].ty as usize;
        assert!(
            id < MAX_ID && index[id] == u8::MAX,
            "type ids must be unique and < MAX_ID"
        );
        index[id] = i as u8;
        i += 1;
    }
    index
};

/// Every type, in table (id) order.
pub(crate) const ALL: [GgmlType; ROWS.len()] = {
    let mut all = [GgmlType::F32; ROWS.len()];
    let mut i = 0;
    while i < ROWS.len() {
        all[i] = ROWS[i].ty;
        assert!(
            i == 0 || (ROWS[i - 1].ty as u32) < (ROWS[i].ty as u32),
            "rows in id order"
        );
        i += 1;
    }
    all
};

/// The position of `ty`'s row (`0..N_ROWS`, in id order).
pub(crate) fn row_index(ty: GgmlType) -> usize {
    INDEX[ty as usize] as usize
}

/// The row of `ty`.
pub(crate) fn row(ty: GgmlType) -> &'static TypeRow {
    &TABLE[row_index(ty)]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An exhaustive match: a new `GgmlType` variant does not compile here until it is listed,
    /// and then fails this test until it has a row.
    #[test]
    fn every_type_has_its_row() {
        use GgmlType::*;
        let all = [
            F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K,
            IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ4_NL, IQ3_S, IQ2_S, IQ4_XS, I8, I16, I32, I64, F64,
            IQ1_M, BF16, TQ1_0, TQ2_0, MXFP4, NVFP4, Q1_0, Q2_0, Q6_0, IQ1_BN, IQ2_BN, IQ2_K,
            IQ3_K, IQ4_K, IQ5_K, IQ6_K, IQ4_KS, IQ2_KS, IQ4_KSS, IQ5_KS, IQ2_KT, IQ3_KT, IQ4_KT,
            IQ3_KS, IQ2_KL, IQ1_KT,
        ];
        for ty in all {
            match ty {
                F32 | F16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | Q2_K | Q3_K | Q4_K | Q5_K
                | Q6_K | Q8_K | IQ2_XXS | IQ2_XS | IQ3_XXS | IQ1_S | IQ4_NL | IQ3_S | IQ2_S
                | IQ4_XS | I8 | I16 | I32 | I64 | F64 | IQ1_M | BF16 | TQ1_0 | TQ2_0 | MXFP4
                | NVFP4 | Q1_0 | Q2_0 | Q6_0 | IQ1_BN | IQ2_BN | IQ2_K | IQ3_K | IQ4_K | IQ5_K
                | IQ6_K | IQ4_KS | IQ2_KS | IQ4_KSS | IQ5_KS | IQ2_KT | IQ3_KT | IQ4_KT
                | IQ3_KS | IQ2_KL | IQ1_KT => {}
            }
            assert_eq!(row(ty).ty, ty);
        }
        assert_eq!(all.len(), ALL.len());
    }

    /// What the rows promise each other: a type with dot products has row conversions, and
    /// so has its activation type, whose blocks cover as many elements (ggml's `vec_dot` walks
    /// both in step); the tiled order exists for 256-element blocks of types ggml tiles; GEMM
    /// sub-blocks are whole groups of 16 inside a block.
    #[test]
    fn rows_are_consistent() {
        for (i, r) in TABLE.iter().enumerate() {
            assert_eq!(ALL[i], r.ty);
            assert_eq!(GgmlType::from_name(r.name), Some(r.ty));
            let Some(d) = &r.dot else { continue };
            assert!(r.rows.is_some(), "{}: dot without conversions", r.name);
            let act = row(d.act);
            let act_quantize = act.rows.as_ref().and_then(|a| a.quantize.as_ref());
            assert!(
                act_quantize.is_some(),
                "{}: activation {}",
                r.name,
                act.name
            );
            assert_eq!(act.block_size, r.block_size, "{}", r.name);
            if d.tiled.is_some() {
                assert!(r.ggml_tiled && r.block_size == QK_K, "{}", r.name);
            }
            if let Some(g) = &d.gemm {
                assert!(g.sub.is_multiple_of(16) && r.block_size.is_multiple_of(g.sub));
            }
        }
    }
}
