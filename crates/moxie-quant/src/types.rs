//! The ggml tensor types: ids as stored in GGUF files (source: ggml's `ggml.h`, and
//! ik_llama.cpp's for its own types). Block sizes, bytes per block, names and everything else
//! about a type are its row in `table.rs`. Every weight type id a GGUF file may carry is listed
//! so that the reader can compute byte ranges even for types moxie cannot compute with yet;
//! `GgmlType::from_id` rejects ids that ggml removed.

use crate::table::row;

/// A ggml tensor element type. The discriminant is the id stored in GGUF tensor infos.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
    NVFP4 = 40,
    Q1_0 = 41,
    Q2_0 = 42,
    // ik_llama.cpp's own types (its ggml.h, commit 8337e4cd). Not listed: its activation-only
    // types (Q8_K64 ...), the ids it removed (142, 143) and its row-interleaved `_R4`/`_R8`
    // variants (ids 202 and up), which its run-time repacking makes and files rarely hold.
    Q6_0 = 133,
    IQ1_BN = 134,
    IQ2_BN = 135,
    IQ2_K = 137,
    IQ3_K = 138,
    IQ4_K = 139,
    IQ5_K = 140,
    IQ6_K = 141,
    IQ4_KS = 144,
    IQ2_KS = 145,
    IQ4_KSS = 146,
    IQ5_KS = 152,
    IQ2_KT = 153,
    IQ3_KT = 154,
    IQ4_KT = 155,
    IQ3_KS = 156,
    IQ2_KL = 157,
    IQ1_KT = 158,
}

/// Super-block size of the K-quants and most IQ types.
pub const QK_K: usize = 256;

impl GgmlType {
    /// Every type, in id order (the rows of `table.rs`).
    pub const ALL: [GgmlType; crate::table::ALL.len()] = crate::table::ALL;

    /// ggml's code-book types, IQ2_XXS .. IQ1_M: each group of values is an entry of a fixed
    /// grid (with signs, or IQ1's offset) times a sub-block scale. ggml-cpu has no `from_float`
    /// for them, and llama-quantize writes them only with an importance matrix.
    pub const IQ_GRID: [GgmlType; 7] = [
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ2_S,
        GgmlType::IQ3_XXS,
        GgmlType::IQ3_S,
        GgmlType::IQ1_S,
        GgmlType::IQ1_M,
    ];

    /// The type with this GGUF id, or `None` for an unknown or removed id.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        Self::ALL.iter().copied().find(|t| *t as u32 == id)
    }

    /// The id stored in GGUF files.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Byte offsets of the f16 scale fields (`d`, and `dmin`/`m` where present) within one
    /// block of a quantized type; empty for float types and types without such fields.
    pub fn f16_scale_offsets(self) -> &'static [usize] {
        row(self).f16_scales
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        row(self).block_size
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        row(self).type_size
    }

    /// Bytes stored at the start of every row before its blocks: ik_llama.cpp's `_KS` types
    /// keep one scale per row there (ggml's `row_meta_size`); 0 for every other type.
    pub fn row_meta_bytes(self) -> usize {
        row(self).row_meta
    }

    /// The name ggml and llama.cpp print (`Q4_K`, `IQ4_XS`, `F32`, ...).
    pub fn name(self) -> &'static str {
        row(self).name
    }

    /// Parse a type name as printed by `name` (case-insensitive).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        Self::ALL
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Bytes taken by one row of `n` elements (its blocks plus [`row_meta_bytes`]), or `None`
    /// if `n` is not a whole number of blocks or the size overflows.
    ///
    /// [`row_meta_bytes`]: GgmlType::row_meta_bytes
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n.is_multiple_of(bs) {
            return None;
        }
        (n / bs)
            .checked_mul(self.type_size() as u64)?
            .checked_add(self.row_meta_bytes() as u64)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_removed_ids_are_rejected() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
        }
        for removed in [4, 5, 31, 32, 33, 36, 37, 38, 43, 142, 143, 1000] {
            assert_eq!(GgmlType::from_id(removed), None);
        }
    }

    #[test]
    fn row_bytes_checks_block_multiples() {
        assert_eq!(GgmlType::Q4_K.row_bytes(512), Some(288));
        assert_eq!(GgmlType::Q4_K.row_bytes(100), None);
        assert_eq!(GgmlType::F32.row_bytes(3), Some(12));
        assert_eq!(GgmlType::F32.row_bytes(u64::MAX), None);
        // ik_llama.cpp's per-row scale: an f32 before IQ4_KS blocks, an f16 before IQ2_KS ones.
        assert_eq!(GgmlType::IQ4_KS.row_bytes(512), Some(4 + 2 * 136));
        assert_eq!(GgmlType::IQ2_KS.row_bytes(256), Some(2 + 70));
        assert_eq!(GgmlType::IQ4_K.row_bytes(512), Some(2 * 144));
        assert_eq!(GgmlType::IQ4_KS.row_bytes(100), None);
    }
}
