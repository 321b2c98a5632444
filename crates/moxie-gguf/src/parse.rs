//! Parsing and validation of one GGUF file (one split part) from a byte slice.
//!
//! Every read is bounds-checked against the slice; every count is checked against the bytes
//! that remain (times the minimum encoded size of one element) before anything is reserved,
//! so a corrupt count can never trigger a large allocation.

use std::collections::HashMap;

use moxie_quant::GgmlType;

use crate::value::{ArrayData, Strings, MAX_ARRAY_DEPTH};
use crate::{Array, GgufError, Metadata, TensorInfo, Value, ValueType};

/// `GGUF` as stored at byte 0.
pub(crate) const MAGIC: [u8; 4] = *b"GGUF";
/// Alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Maximum number of tensor dimensions (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Metadata key holding the data alignment.
pub const KEY_ALIGNMENT: &str = "general.alignment";

/// Fewest bytes one key/value pair can occupy: key length (8) + 1 key byte + type (4) +
/// 1 value byte.
const MIN_KV_BYTES: u64 = 8 + 1 + 4 + 1;
/// Fewest bytes one tensor info can occupy: name length (8) + 1 name byte + n_dims (4) +
/// one dimension (8) + type (4) + offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 1 + 4 + 8 + 4 + 8;

type Field<'f> = &'f dyn Fn() -> String;

/// Most elements reserved up front for a counted sequence. Counts are already bounded by the
/// bytes remaining, but a corrupt count could still claim far more elements than are really
/// there; beyond this, vectors grow with the elements actually read.
const PREALLOC_MAX: usize = 4096;

pub(crate) fn prealloc(n: usize) -> usize {
    n.min(PREALLOC_MAX)
}

/// The parsed and validated header of one file.
pub(crate) struct ParsedHeader {
    pub version: u32,
    pub metadata: Metadata,
    pub alignment: u64,
    /// `split` is 0 in every entry; the caller renumbers.
    pub tensors: Vec<TensorInfo>,
    /// Byte offset of each tensor's info record (its name length), for error messages.
    pub record_offsets: Vec<u64>,
    /// Byte offset of the data section.
    pub data_offset: u64,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    file: &'a str,
}

impl<'a> Cursor<'a> {
    fn pos(&self) -> u64 {
        self.pos as u64
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, field: Field<'_>) -> Result<&'a [u8], GgufError> {
        let available = self.remaining();
        if n > available {
            return Err(GgufError::Truncated {
                file: self.file.to_owned(),
                field: field(),
                offset: self.pos(),
                needed: n,
                available,
                file_len: self.buf.len() as u64,
            });
        }
        // n <= remaining <= usize::MAX, so the cast and the slice are in bounds.
        let n = n as usize;
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn bytes<const N: usize>(&mut self, field: Field<'_>) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, field)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self, field: Field<'_>) -> Result<u8, GgufError> {
        Ok(self.bytes::<1>(field)?[0])
    }

    fn u32(&mut self, field: Field<'_>) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.bytes(field)?))
    }

    fn u64(&mut self, field: Field<'_>) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.bytes(field)?))
    }

    /// A count of elements of at least `min_size` bytes each, checked against what remains.
    fn count(&mut self, min_size: u64, field: Field<'_>) -> Result<usize, GgufError> {
        let at = self.pos();
        let n = self.u64(field)?;
        let remaining = self.remaining();
        if n > remaining / min_size.max(1) {
            return Err(GgufError::LengthTooLarge {
                file: self.file.to_owned(),
                field: field(),
                offset: at,
                length: n,
                remaining,
                detail: if min_size > 1 {
                    format!(" (each element needs at least {min_size} bytes)")
                } else {
                    String::new()
                },
            });
        }
        // n <= remaining, which fits usize.
        Ok(n as usize)
    }

    /// A length-prefixed UTF-8 string, borrowed from the buffer.
    fn string(&mut self, field: Field<'_>) -> Result<&'a str, GgufError> {
        let len = self.count(1, &|| format!("{} length", field()))?;
        let at = self.pos();
        let bytes = self.take(len as u64, field)?;
        std::str::from_utf8(bytes).map_err(|source| GgufError::InvalidUtf8 {
            file: self.file.to_owned(),
            field: field(),
            offset: at,
            source,
        })
    }

    fn err_invalid(&self, field: String, offset: u64, reason: String) -> GgufError {
        GgufError::Invalid {
            file: self.file.to_owned(),
            field,
            offset,
            reason,
        }
    }

    fn err_overflow(&self, field: String, offset: u64, what: String) -> GgufError {
        GgufError::Overflow {
            file: self.file.to_owned(),
            field,
            offset,
            what,
        }
    }

    fn value_type(&mut self, field: Field<'_>) -> Result<ValueType, GgufError> {
        let at = self.pos();
        let id = self.u32(field)?;
        ValueType::from_id(id).ok_or_else(|| GgufError::UnknownValueType {
            file: self.file.to_owned(),
            field: field(),
            offset: at,
            id,
        })
    }

    fn bool(&mut self, field: Field<'_>) -> Result<bool, GgufError> {
        let at = self.pos();
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(self.err_invalid(field(), at, format!("bool value {b} is neither 0 nor 1"))),
        }
    }

    fn value(&mut self, ty: ValueType, field: Field<'_>) -> Result<Value, GgufError> {
        let f = || format!("{} value", field());
        Ok(match ty {
            ValueType::U8 => Value::U8(self.u8(&f)?),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.bytes(&f)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.bytes(&f)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.bytes(&f)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.bytes(&f)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.bytes(&f)?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.bytes(&f)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.bytes(&f)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.bytes(&f)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.bytes(&f)?)),
            ValueType::Bool => Value::Bool(self.bool(&f)?),
            ValueType::String => Value::String(self.string(&f)?.to_owned()),
            ValueType::Array => Value::Array(self.array(field, 1)?),
        })
    }

    /// Reads fixed-size elements: the whole block is bounds-checked before anything is
    /// allocated.
    fn fixed<const N: usize, T>(
        &mut self,
        n: usize,
        field: Field<'_>,
        conv: fn([u8; N]) -> T,
    ) -> Result<Vec<T>, GgufError> {
        // `n` was checked against the remaining bytes with min size N, so this cannot overflow.
        let bytes = self.take((n as u64) * (N as u64), field)?;
        Ok(bytes
            .chunks_exact(N)
            .map(|c| {
                let mut a = [0u8; N];
                a.copy_from_slice(c);
                conv(a)
            })
            .collect())
    }

    /// An array body: element type, count, elements. `depth` is 1 for a top-level array.
    fn array(&mut self, field: Field<'_>, depth: usize) -> Result<Array, GgufError> {
        if depth > MAX_ARRAY_DEPTH {
            return Err(GgufError::NestingTooDeep {
                file: self.file.to_owned(),
                field: field(),
                offset: self.pos(),
                limit: MAX_ARRAY_DEPTH,
            });
        }
        let et = self.value_type(&|| format!("{} array element type", field()))?;
        let n = self.count(et.min_encoded_size(), &|| {
            format!("{} array length", field())
        })?;
        let f = || format!("{} array data", field());
        let data = match et {
            ValueType::U8 => ArrayData::U8(self.take(n as u64, &f)?.to_vec()),
            ValueType::I8 => ArrayData::I8(self.fixed(n, &f, i8::from_le_bytes)?),
            ValueType::U16 => ArrayData::U16(self.fixed(n, &f, u16::from_le_bytes)?),
            ValueType::I16 => ArrayData::I16(self.fixed(n, &f, i16::from_le_bytes)?),
            ValueType::U32 => ArrayData::U32(self.fixed(n, &f, u32::from_le_bytes)?),
            ValueType::I32 => ArrayData::I32(self.fixed(n, &f, i32::from_le_bytes)?),
            ValueType::U64 => ArrayData::U64(self.fixed(n, &f, u64::from_le_bytes)?),
            ValueType::I64 => ArrayData::I64(self.fixed(n, &f, i64::from_le_bytes)?),
            ValueType::F32 => ArrayData::F32(self.fixed(n, &f, f32::from_le_bytes)?),
            ValueType::F64 => ArrayData::F64(self.fixed(n, &f, f64::from_le_bytes)?),
            ValueType::Bool => {
                let mut v = Vec::with_capacity(prealloc(n));
                for j in 0..n {
                    v.push(self.bool(&|| format!("{} element {j}", field()))?);
                }
                ArrayData::Bool(v)
            }
            ValueType::String => {
                let mut s = Strings::with_capacity(prealloc(n), 0);
                for j in 0..n {
                    s.push(self.string(&|| format!("{} element {j}", field()))?);
                }
                ArrayData::String(s)
            }
            ValueType::Array => {
                let mut v = Vec::with_capacity(prealloc(n));
                for j in 0..n {
                    v.push(self.array(&|| format!("{} element {j}", field()), depth + 1)?);
                }
                ArrayData::Array(v)
            }
        };
        Ok(Array::new(data))
    }
}

fn align_up(x: u64, alignment: u64) -> Option<u64> {
    // alignment is a nonzero power of two.
    Some(x.checked_add(alignment - 1)? & !(alignment - 1))
}

/// Parses and validates the header of one GGUF file held in `buf`.
///
/// With `header_only`, tensor data may lie past the end of `buf` (the index is still fully
/// validated: alignment, overlap, overflow); otherwise every tensor's bytes must be inside
/// `buf`.
pub(crate) fn parse(file: &str, buf: &[u8], header_only: bool) -> Result<ParsedHeader, GgufError> {
    let mut c = Cursor { buf, pos: 0, file };

    // Magic and version.
    let head = &buf[..buf.len().min(4)];
    if !MAGIC.starts_with(head) {
        return Err(GgufError::BadMagic {
            file: file.to_owned(),
            found: head.to_vec(),
        });
    }
    c.take(4, &|| "magic".to_owned())?;
    let version = c.u32(&|| "version".to_owned())?;
    let unsupported = |reason: &str| GgufError::UnsupportedVersion {
        file: file.to_owned(),
        version,
        reason: reason.to_owned(),
    };
    if version != 0 && version & 0xFFFF == 0 {
        return Err(unsupported(
            "the low 16 bits are zero, this looks like a big-endian (byte-swapped) file; only little-endian GGUF is supported",
        ));
    }
    match version {
        0 => return Err(unsupported("version 0 is invalid")),
        1 => {
            return Err(unsupported(
                "GGUF v1 (32-bit counts and lengths) is obsolete and not supported; re-convert the model with a current llama.cpp",
            ))
        }
        2 | 3 => {}
        _ => return Err(unsupported("only versions 2 and 3 are supported")),
    }

    let n_tensors = c.count(MIN_TENSOR_INFO_BYTES, &|| "tensor count".to_owned())?;
    let n_kv = c.count(MIN_KV_BYTES, &|| "metadata key-value count".to_owned())?;

    // Metadata.
    let mut metadata = Metadata::with_capacity(file, prealloc(n_kv));
    for i in 0..n_kv {
        let kv_at = c.pos();
        let key = c.string(&|| format!("metadata key #{i} key"))?;
        if key.is_empty() {
            return Err(c.err_invalid(
                format!("metadata key #{i} key"),
                kv_at,
                "empty key".to_owned(),
            ));
        }
        if let Some(first) = metadata.index_of(key) {
            return Err(GgufError::DuplicateKey {
                file: file.to_owned(),
                key: key.to_owned(),
                index: i as u64,
                offset: kv_at,
                first: first as u64,
            });
        }
        let field = || format!("metadata key #{i} '{key}'");
        let ty = c.value_type(&|| format!("{} value type", field()))?;
        let value = c.value(ty, &field)?;
        // The key was checked for duplicates above, so push cannot fail.
        let _ = metadata.push(key.to_owned(), value, kv_at);
    }

    // Alignment.
    let alignment = match metadata.get(KEY_ALIGNMENT) {
        None => DEFAULT_ALIGNMENT,
        Some(v) => {
            let at = metadata.offset_of(KEY_ALIGNMENT).unwrap_or(0);
            let field = format!("metadata key '{KEY_ALIGNMENT}'");
            match *v {
                Value::U32(a) if a != 0 && a.is_power_of_two() => u64::from(a),
                Value::U32(a) => {
                    return Err(c.err_invalid(
                        field,
                        at,
                        format!("alignment {a} is not a nonzero power of two"),
                    ))
                }
                _ => {
                    return Err(c.err_invalid(
                        field,
                        at,
                        format!("has type {}, expected u32", v.value_type()),
                    ))
                }
            }
        }
    };

    // Tensor infos.
    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(prealloc(n_tensors));
    let mut record_offsets: Vec<u64> = Vec::with_capacity(prealloc(n_tensors));
    let mut offset_fields: Vec<u64> = Vec::with_capacity(prealloc(n_tensors));
    let mut names: HashMap<&str, usize> = HashMap::with_capacity(prealloc(n_tensors));
    for i in 0..n_tensors {
        let rec_at = c.pos();
        let name = c.string(&|| format!("tensor #{i} name"))?;
        if name.is_empty() {
            return Err(c.err_invalid(
                format!("tensor #{i} name"),
                rec_at,
                "empty tensor name".to_owned(),
            ));
        }
        if let Some(&first) = names.get(name) {
            return Err(GgufError::DuplicateTensor {
                file: file.to_owned(),
                name: name.to_owned(),
                index: i as u64,
                offset: rec_at,
                first_file: format!("{file} (tensor #{first})"),
            });
        }
        let tf = |what: &str| format!("tensor '{name}' {what}");

        let nd_at = c.pos();
        let n_dims = c.u32(&|| tf("n_dims"))?;
        if n_dims == 0 || n_dims as usize > MAX_DIMS {
            return Err(c.err_invalid(
                tf("n_dims"),
                nd_at,
                format!("n_dims is {n_dims}, must be 1 to {MAX_DIMS}"),
            ));
        }
        let dims_at = c.pos();
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            let at = c.pos();
            let v = c.u64(&|| tf(&format!("dimension {d}")))?;
            if v > i64::MAX as u64 {
                return Err(c.err_invalid(
                    tf(&format!("dimension {d}")),
                    at,
                    format!("dimension {v} exceeds i64::MAX (ggml stores dimensions as int64)"),
                ));
            }
            dims.push(v);
        }
        let shape = || {
            dims.iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(" x ")
        };
        let n_rows = dims[1..]
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| {
                c.err_overflow(
                    tf("dimensions"),
                    dims_at,
                    format!("row count of shape {}", shape()),
                )
            })?;
        n_rows
            .checked_mul(dims[0])
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| {
                c.err_overflow(
                    tf("dimensions"),
                    dims_at,
                    format!("element count of shape {} (limit i64::MAX)", shape()),
                )
            })?;

        let ty_at = c.pos();
        let ty_id = c.u32(&|| tf("type"))?;
        let interleaved_ty = moxie_quant::repack::interleaved_base_type(ty_id);
        let interleaved = interleaved_ty.is_some();
        let ty = GgmlType::from_id(ty_id).or(interleaved_ty).ok_or_else(|| {
            GgufError::UnknownTensorType {
                file: file.to_owned(),
                field: tf("type"),
                offset: ty_at,
                id: ty_id,
            }
        })?;
        if interleaved && !moxie_quant::repack::repack_supports_shape(ty, &dims) {
            return Err(c.err_invalid(
                tf("type"),
                ty_at,
                format!(
                    "type id {ty_id} ({ty} rows interleaved by 16) needs {}, not shape {}",
                    moxie_quant::repack::layout_requirement(ty),
                    shape()
                ),
            ));
        }
        let bs = ty.block_size() as u64;
        if !dims[0].is_multiple_of(bs) {
            return Err(c.err_invalid(
                tf("dimension 0"),
                dims_at,
                format!(
                    "row length {} is not a multiple of the {ty} block size {bs}",
                    dims[0]
                ),
            ));
        }
        let n_bytes = ty
            .row_bytes(dims[0])
            .and_then(|rb| rb.checked_mul(n_rows))
            .ok_or_else(|| {
                c.err_overflow(
                    tf("dimensions"),
                    dims_at,
                    format!("byte size of {ty} shape {}", shape()),
                )
            })?;

        let off_at = c.pos();
        let offset = c.u64(&|| tf("offset"))?;
        if !offset.is_multiple_of(alignment) {
            return Err(GgufError::Misaligned {
                file: file.to_owned(),
                field: tf("offset"),
                offset: off_at,
                value: offset,
                alignment,
            });
        }
        if offset.checked_add(n_bytes).is_none() {
            return Err(c.err_overflow(
                tf("offset"),
                off_at,
                format!("data end {offset} + {n_bytes}"),
            ));
        }

        names.insert(name, i);
        tensors.push(TensorInfo {
            name: name.to_owned(),
            dims,
            ty,
            interleaved,
            split: 0,
            offset,
            file_offset: 0,
            n_bytes,
        });
        record_offsets.push(rec_at);
        offset_fields.push(off_at);
    }
    drop(names);

    // Data section: starts at the next multiple of the alignment after the tensor infos.
    let header_end = c.pos();
    let data_offset = if n_tensors > 0 {
        align_up(header_end, alignment).ok_or_else(|| {
            c.err_overflow(
                "data section start".to_owned(),
                header_end,
                "header end + alignment padding".to_owned(),
            )
        })?
    } else {
        header_end
    };
    let file_len = buf.len() as u64;
    if !header_only && data_offset > file_len {
        return Err(GgufError::Truncated {
            file: file.to_owned(),
            field: "padding before the data section".to_owned(),
            offset: header_end,
            needed: data_offset - header_end,
            available: file_len - header_end,
            file_len,
        });
    }
    for (t, &off_at) in tensors.iter_mut().zip(&offset_fields) {
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        let (Some(start), Some(end)) = (start, end) else {
            return Err(c.err_overflow(
                format!("tensor '{}' offset", t.name),
                off_at,
                format!(
                    "absolute data end {data_offset} + {} + {}",
                    t.offset, t.n_bytes
                ),
            ));
        };
        if !header_only && end > file_len {
            return Err(GgufError::DataPastEnd {
                file: file.to_owned(),
                name: t.name.clone(),
                offset: off_at,
                start,
                end,
                file_len,
            });
        }
        t.file_offset = start;
    }

    // Overlaps: sort by start, compare each range with the furthest end seen so far.
    let mut order: Vec<usize> = (0..tensors.len())
        .filter(|&i| tensors[i].n_bytes > 0)
        .collect();
    order.sort_by_key(|&i| (tensors[i].offset, i));
    let mut furthest: Option<usize> = None;
    for &i in &order {
        let t = &tensors[i];
        if let Some(p) = furthest {
            let prev = &tensors[p];
            let prev_end = prev.offset + prev.n_bytes;
            if t.offset < prev_end {
                // Report the tensor that comes later in the file.
                let (a, b) = if i > p { (t, prev) } else { (prev, t) };
                let a_idx = if i > p { i } else { p };
                return Err(GgufError::Overlap {
                    file: file.to_owned(),
                    name: a.name.clone(),
                    offset: offset_fields[a_idx],
                    start: a.offset,
                    end: a.offset + a.n_bytes,
                    other: b.name.clone(),
                    other_start: b.offset,
                    other_end: b.offset + b.n_bytes,
                });
            }
            if t.offset + t.n_bytes > prev_end {
                furthest = Some(i);
            }
        } else {
            furthest = Some(i);
        }
    }

    Ok(ParsedHeader {
        version,
        metadata,
        alignment,
        tensors,
        record_offsets,
        data_offset,
    })
}
