//! The ggml tensor types: ids as stored in GGUF files (source: ggml's `ggml.h`). Block sizes,
//! bytes per block, names and everything else about a type are its row in `table.rs`. Every
//! id a GGUF file may carry is listed so that the reader can compute byte ranges even for
//! types moxie cannot compute with yet; `GgmlType::from_id` rejects ids that ggml removed.

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
}

/// Super-block size of the K-quants and most IQ types.
pub const QK_K: usize = 256;

impl GgmlType {
    /// Every type, in id order (the rows of `table.rs`).
    pub const ALL: [GgmlType; crate::table::ALL.len()] = crate::table::ALL;

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

    /// Bytes taken by one row of `n` elements, or `None` if `n` is not a whole number of
    /// blocks or the product overflows.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n.is_multiple_of(bs) {
            return None;
        }
        (n / bs).checked_mul(self.type_size() as u64)
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
        for removed in [4, 5, 31, 32, 33, 36, 37, 38, 43, 1000] {
            assert_eq!(GgmlType::from_id(removed), None);
        }
    }

    #[test]
    fn row_bytes_checks_block_multiples() {
        assert_eq!(GgmlType::Q4_K.row_bytes(512), Some(288));
        assert_eq!(GgmlType::Q4_K.row_bytes(100), None);
        assert_eq!(GgmlType::F32.row_bytes(3), Some(12));
        assert_eq!(GgmlType::F32.row_bytes(u64::MAX), None);
    }
}
