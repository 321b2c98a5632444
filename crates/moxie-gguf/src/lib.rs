//! GGUF reading (zero-copy mmap, split files, strict validation) and writing.
//!
//! # Format (GGUF v2 / v3, little-endian)
//!
//! ```text
//! "GGUF"  u32 version  u64 n_tensors  u64 n_kv
//! n_kv ×      { string key, u32 value_type, value }
//! n_tensors × { string name, u32 n_dims, u64 dims[n_dims] (ne0 first), u32 ggml_type, u64 offset }
//! zero padding to general.alignment (default 32)
//! data section: each tensor at data_start + offset (a multiple of the alignment)
//! ```
//!
//! A string is a `u64` byte length followed by UTF-8 bytes. An array value is a `u32` element
//! type, a `u64` count and the elements; an element of type array repeats that layout (arrays of
//! arrays). Versions 2 and 3 share this layout (v3 only added big-endian files, which are
//! rejected); v1 used 32-bit counts and is rejected.
//!
//! A model may be split into `PREFIX-00001-of-0000N.gguf` ... files (llama.cpp `gguf-split`):
//! every part carries `split.no`, `split.count` and `split.tensors.count`; the first part also
//! carries all other metadata. [`GgufFile::open`] finds and opens all parts and presents one
//! tensor index; each [`TensorInfo`] records which part holds it.
//!
//! # Validation
//!
//! Before anything is used, [`GgufFile`] checks, and reports as a [`GgufError`] naming the
//! file, the field and the byte offset:
//!
//! * magic, version (2 or 3; v1, big-endian and newer versions rejected);
//! * every read against the end of the file (truncation), every count and length against the
//!   bytes that remain divided by the element's minimum encoded size; up-front reservations are
//!   further capped at a few thousand elements, so a corrupt count never drives an allocation
//!   (memory grows only with elements actually read); strings are valid UTF-8;
//! * metadata: known value types, non-empty unique keys, bools 0/1, arrays nested at most
//!   [`MAX_ARRAY_DEPTH`] deep, `general.alignment` a `u32` nonzero power of two;
//! * tensors: non-empty unique names (also across split parts), 1 to 4 dims each
//!   `≤ i64::MAX`, known ggml type, row length a multiple of the block size, element count and
//!   byte size without overflow, offset aligned, data ranges not overlapping and (unless opened
//!   header-only) inside the file;
//! * splits: `split.count` / `split.no` consistent in every part, file names following the
//!   pattern, every part present, `split.tensors.count` equal to the tensors found.
//!
//! Parsing never panics on any input.

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod error;
mod file;
mod metadata;
mod parse;
mod tensor;
mod value;
mod writer;

pub use error::GgufError;
pub use file::{
    split_path, split_prefix, GgufFile, OpenOptions, KEY_SPLIT_COUNT, KEY_SPLIT_NO,
    KEY_SPLIT_TENSORS_COUNT, MAX_SPLIT_COUNT,
};
pub use metadata::Metadata;
pub use moxie_quant::GgmlType;
pub use parse::{DEFAULT_ALIGNMENT, KEY_ALIGNMENT, MAX_DIMS};
pub use tensor::TensorInfo;
pub use value::{Array, ArrayData, Strings, StringsIter, Value, ValueType, MAX_ARRAY_DEPTH};
pub use writer::{GgufStreamWriter, GgufWriter};
