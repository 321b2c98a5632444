//! Tensor index entries.

use moxie_quant::GgmlType;

/// One tensor of the index: name, shape, type and where its bytes are.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.3.ffn_up_exps.weight`.
    pub name: String,
    /// Shape in ggml order: `dims[0]` is the row length (`ne0`), the fastest-varying
    /// dimension. 1 to 4 entries.
    pub dims: Vec<u64>,
    /// Element / block type.
    pub ty: GgmlType,
    /// Whether the rows are stored interleaved 16 at a time (`moxie_quant::repack`; files
    /// written by `moxie quantize --repack`, type id [`moxie_quant::repack::interleaved_type_id`]).
    pub interleaved: bool,
    /// Index of the split part (file) that holds the data; 0 for unsplit files.
    pub split: usize,
    /// Data offset relative to the start of that part's data section (a multiple of the
    /// part's alignment).
    pub offset: u64,
    /// Absolute byte offset of the data in its part's file.
    pub file_offset: u64,
    /// Size of the data in bytes (rows × row bytes).
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of elements (product of `dims`; saturates instead of overflowing for
    /// hand-built infos, which the reader never produces).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |a, &d| a.saturating_mul(d))
    }

    /// Number of rows: product of `dims[1..]` (1 for a 1-D tensor).
    pub fn n_rows(&self) -> u64 {
        self.dims
            .iter()
            .skip(1)
            .fold(1u64, |a, &d| a.saturating_mul(d))
    }

    /// Row length in elements (`dims[0]`).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Bytes per row: `dims[0] / block_size × type_size`, plus the per-row scale of the types
    /// that store one (`GgmlType::row_meta_bytes`); 0 if `dims[0]` is not a whole number of
    /// blocks, which the reader rejects.
    pub fn row_bytes(&self) -> u64 {
        self.ty.row_bytes(self.row_len()).unwrap_or(0)
    }

    /// The type id stored in the file (an interleaved tensor's own id).
    pub fn type_id(&self) -> u32 {
        if self.interleaved {
            moxie_quant::repack::interleaved_type_id(self.ty).unwrap_or(self.ty.id())
        } else {
            self.ty.id()
        }
    }

    /// Number of dimensions.
    pub fn n_dims(&self) -> usize {
        self.dims.len()
    }

    /// The absolute byte range of the data in its part's file.
    pub fn file_range(&self) -> std::ops::Range<u64> {
        self.file_offset..self.file_offset.saturating_add(self.n_bytes)
    }
}
