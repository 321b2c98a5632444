//! The error type of this crate.

use std::str::Utf8Error;

/// Everything that can go wrong while reading, validating or writing a GGUF file.
///
/// Parse and validation errors name the file (`file`: the path, or the name given to
/// [`GgufFile::from_bytes`](crate::GgufFile::from_bytes)), the field that is wrong (`field`,
/// for example `tensor 'blk.3.ffn_up_exps.weight' offset` or
/// `metadata key #12 'tokenizer.ggml.tokens' element 7 length`) and the byte offset of that
/// field in the file (`offset`). The `Display` text carries all three.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// An I/O operation on a file failed (open, stat, mmap, create, write).
    #[error("{file}: {op} failed: {source}")]
    Io {
        /// The file.
        file: String,
        /// What was being done (`open`, `mmap`, `write`, ...).
        op: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// The file does not start with the bytes `GGUF`.
    #[error("{file}: not a GGUF file: magic at byte 0 is {found:02x?}, expected \"GGUF\" [47, 47, 55, 46]")]
    BadMagic {
        /// The file.
        file: String,
        /// The first (up to) four bytes.
        found: Vec<u8>,
    },

    /// A GGUF version this reader does not support (only 2 and 3 are).
    #[error("{file}: version at byte 4: unsupported GGUF version {version}: {reason}")]
    UnsupportedVersion {
        /// The file.
        file: String,
        /// The version read (little-endian).
        version: u32,
        /// Why it is rejected.
        reason: String,
    },

    /// The file ends inside a field.
    #[error("{file}: truncated: {field} at byte {offset} needs {needed} bytes but only {available} remain (file is {file_len} bytes)")]
    Truncated {
        /// The file.
        file: String,
        /// The field being read.
        field: String,
        /// Byte offset of the field.
        offset: u64,
        /// Bytes the field needs.
        needed: u64,
        /// Bytes left in the file at `offset`.
        available: u64,
        /// Length of the file.
        file_len: u64,
    },

    /// A length or count is larger than what the rest of the file could possibly hold.
    #[error("{file}: {field} at byte {offset} is {length}, more than the {remaining} bytes remaining in the file can hold{detail}: the file is truncated or the value is corrupt")]
    LengthTooLarge {
        /// The file.
        file: String,
        /// The length / count field.
        field: String,
        /// Byte offset of the field.
        offset: u64,
        /// The value read.
        length: u64,
        /// Bytes left in the file after the field.
        remaining: u64,
        /// Extra explanation (minimum encoded size per element), may be empty.
        detail: String,
    },

    /// A metadata value type id outside 0..=12.
    #[error("{file}: {field} at byte {offset}: unknown metadata value type id {id}")]
    UnknownValueType {
        /// The file.
        file: String,
        /// The field.
        field: String,
        /// Byte offset of the type id.
        offset: u64,
        /// The id read.
        id: u32,
    },

    /// A tensor type id that is not a known ggml type.
    #[error("{file}: {field} at byte {offset}: unknown ggml tensor type id {id}")]
    UnknownTensorType {
        /// The file.
        file: String,
        /// The field.
        field: String,
        /// Byte offset of the type id.
        offset: u64,
        /// The id read.
        id: u32,
    },

    /// A string that is not valid UTF-8.
    #[error("{file}: {field} at byte {offset}: invalid UTF-8: {source}")]
    InvalidUtf8 {
        /// The file.
        file: String,
        /// The field.
        field: String,
        /// Byte offset of the string bytes.
        offset: u64,
        /// The UTF-8 error (position relative to the string start).
        #[source]
        source: Utf8Error,
    },

    /// Arrays of arrays nested deeper than the limit.
    #[error("{file}: {field} at byte {offset}: arrays nested more than {limit} levels deep")]
    NestingTooDeep {
        /// The file.
        file: String,
        /// The field.
        field: String,
        /// Byte offset of the array that exceeds the limit.
        offset: u64,
        /// The limit ([`MAX_ARRAY_DEPTH`](crate::MAX_ARRAY_DEPTH)).
        limit: usize,
    },

    /// The same metadata key appears twice.
    #[error("{file}: metadata key #{index} at byte {offset}: duplicate key '{key}' (first defined by key #{first})")]
    DuplicateKey {
        /// The file.
        file: String,
        /// The key.
        key: String,
        /// Index of the second occurrence.
        index: u64,
        /// Byte offset of the second occurrence.
        offset: u64,
        /// Index of the first occurrence.
        first: u64,
    },

    /// The same tensor name appears twice (within a file or across split parts).
    #[error("{file}: tensor #{index} at byte {offset}: duplicate tensor name '{name}' (first defined in {first_file})")]
    DuplicateTensor {
        /// The file holding the second occurrence.
        file: String,
        /// The tensor name.
        name: String,
        /// Index of the second occurrence within its file.
        index: u64,
        /// Byte offset of the second occurrence's info record.
        offset: u64,
        /// The file holding the first occurrence.
        first_file: String,
    },

    /// An element count, byte size or offset computation overflows.
    #[error("{file}: {field} at byte {offset}: {what} overflows")]
    Overflow {
        /// The file.
        file: String,
        /// The field.
        field: String,
        /// Byte offset of the field.
        offset: u64,
        /// What overflows.
        what: String,
    },

    /// A tensor's data offset is not a multiple of the file's alignment.
    #[error("{file}: {field} at byte {offset}: data offset {value} is not a multiple of the alignment {alignment}")]
    Misaligned {
        /// The file.
        file: String,
        /// The field (`tensor 'NAME' offset`).
        field: String,
        /// Byte offset of the offset field.
        offset: u64,
        /// The data offset read (relative to the data section).
        value: u64,
        /// The alignment in force.
        alignment: u64,
    },

    /// Two tensors' data ranges overlap.
    #[error("{file}: tensor '{name}' offset at byte {offset}: data bytes {start}..{end} of the data section overlap tensor '{other}' (bytes {other_start}..{other_end})")]
    Overlap {
        /// The file.
        file: String,
        /// The tensor that overlaps a previous one.
        name: String,
        /// Byte offset of its offset field.
        offset: u64,
        /// Its data range start (relative to the data section).
        start: u64,
        /// Its data range end.
        end: u64,
        /// The other tensor.
        other: String,
        /// The other tensor's range start.
        other_start: u64,
        /// The other tensor's range end.
        other_end: u64,
    },

    /// A tensor's data lies (partly) past the end of the file.
    #[error("{file}: truncated: tensor '{name}' offset at byte {offset}: its data occupies file bytes {start}..{end} but the file ends at byte {file_len} (if this is a header-only file, open it with open_header_only)")]
    DataPastEnd {
        /// The file.
        file: String,
        /// The tensor.
        name: String,
        /// Byte offset of the tensor's offset field.
        offset: u64,
        /// Absolute start of the data in the file.
        start: u64,
        /// Absolute end of the data in the file.
        end: u64,
        /// Length of the file.
        file_len: u64,
    },

    /// Any other invalid field value (bad alignment, empty key, n_dims out of range, ...).
    #[error("{file}: {field} at byte {offset}: {reason}")]
    Invalid {
        /// The file.
        file: String,
        /// The field.
        field: String,
        /// Byte offset of the field.
        offset: u64,
        /// What is wrong.
        reason: String,
    },

    /// Split parts are inconsistent (`split.count`, `split.no`, file naming, tensor counts).
    #[error("{file}: split {field}: {reason}")]
    Split {
        /// The file.
        file: String,
        /// The field or key concerned, with its byte offset when known.
        field: String,
        /// What is wrong.
        reason: String,
    },

    /// A split part named by `split.count` does not exist.
    #[error("{file}: missing split part {part} of {count} (the model was opened from {opened})")]
    MissingSplit {
        /// The missing file.
        file: String,
        /// Its 1-based part number.
        part: u64,
        /// The number of parts.
        count: u64,
        /// The file that was opened.
        opened: String,
    },

    /// Tensor data was requested from a file opened header-only.
    #[error("{file}: tensor '{name}': no tensor data available, the file was opened header-only")]
    HeaderOnly {
        /// The file.
        file: String,
        /// The tensor.
        name: String,
    },

    /// A [`TensorInfo`](crate::TensorInfo) passed to a file that does not hold it.
    #[error("{file}: tensor '{name}' (split {split}, file bytes {start}..{end}) does not belong to this file")]
    ForeignTensor {
        /// The file.
        file: String,
        /// The tensor name.
        name: String,
        /// The split index claimed.
        split: usize,
        /// Data start claimed.
        start: u64,
        /// Data end claimed.
        end: u64,
    },

    /// A required metadata key is absent.
    #[error("{file}: missing metadata key '{key}'")]
    MissingKey {
        /// The file.
        file: String,
        /// The key.
        key: String,
    },

    /// A metadata key has the wrong type.
    #[error("{file}: metadata key '{key}' at byte {offset} has type {found}, expected {expected}")]
    KeyType {
        /// The file.
        file: String,
        /// The key.
        key: String,
        /// Byte offset of the key/value pair.
        offset: u64,
        /// The type found.
        found: String,
        /// The type wanted.
        expected: &'static str,
    },

    /// A metadata key has the right type but an unusable value (negative, out of range).
    #[error("{file}: metadata key '{key}' at byte {offset}: {reason}")]
    KeyValue {
        /// The file.
        file: String,
        /// The key.
        key: String,
        /// Byte offset of the key/value pair.
        offset: u64,
        /// What is wrong.
        reason: String,
    },

    /// The writer was used incorrectly (duplicate key, bad dims, wrong tensor order or size, ...).
    #[error("GGUF writer: {field}: {reason}")]
    Writer {
        /// The key, tensor or setting concerned.
        field: String,
        /// What is wrong.
        reason: String,
    },
}

impl GgufError {
    pub(crate) fn writer(field: impl Into<String>, reason: impl Into<String>) -> GgufError {
        GgufError::Writer {
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn io(file: impl Into<String>, op: &'static str, source: std::io::Error) -> Self {
        GgufError::Io {
            file: file.into(),
            op,
            source,
        }
    }
}
