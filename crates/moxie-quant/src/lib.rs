//! ggml block types: layout, dequantize, quantize and dot products.

pub mod types;

pub use types::{GgmlType, QK_K};
