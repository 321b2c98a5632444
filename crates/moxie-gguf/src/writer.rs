//! Writing GGUF files: in memory, to a file, streamed tensor by tensor, and split into parts.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use moxie_quant::GgmlType;

use crate::file::{split_path, KEY_SPLIT_COUNT, KEY_SPLIT_NO, KEY_SPLIT_TENSORS_COUNT};
use crate::parse::{DEFAULT_ALIGNMENT, KEY_ALIGNMENT, MAGIC, MAX_DIMS};
use crate::value::{ArrayData, MAX_ARRAY_DEPTH};
use crate::{Array, GgufError, GgufFile, TensorInfo, Value};

fn align_up(x: u64, alignment: u64) -> Option<u64> {
    Some(x.checked_add(alignment - 1)? & !(alignment - 1))
}

/// Builds a GGUF file: metadata in insertion order, tensor infos with aligned offsets, then
/// the data written from a callback ([`write_to_bytes`](GgufWriter::write_to_bytes),
/// [`write_file`](GgufWriter::write_file)) or streamed ([`begin`](GgufWriter::begin)).
///
/// Output is GGUF v3 (or v2 with [`set_version`](GgufWriter::set_version)), little-endian,
/// laid out like ggml's `gguf_write_to_file`: header, tensor infos, zero padding to the
/// alignment, then each tensor's data followed by zero padding to the alignment.
#[derive(Clone, Debug)]
pub struct GgufWriter {
    version: u32,
    alignment: u64,
    metadata: Vec<(String, Value)>,
    keys: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    names: HashMap<String, usize>,
    data_size: u64,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter::new()
    }
}

impl GgufWriter {
    /// An empty v3 writer with alignment 32.
    pub fn new() -> GgufWriter {
        GgufWriter {
            version: 3,
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            keys: HashMap::new(),
            tensors: Vec::new(),
            names: HashMap::new(),
            data_size: 0,
        }
    }

    /// A writer holding the metadata (minus `split.*` keys) and tensor index of `file`, in
    /// the same order; write it with `|t| file.tensor_data(...)` to copy or re-split a model.
    pub fn from_gguf(file: &GgufFile) -> Result<GgufWriter, GgufError> {
        let mut w = GgufWriter::new();
        w.set_version(file.version())?;
        for (k, v) in file.metadata().iter() {
            if k.starts_with("split.") {
                continue;
            }
            w.add(k, v.clone())?;
        }
        for t in file.tensors() {
            w.add_tensor_info(&t.name, &t.dims, t.ty)?;
        }
        Ok(w)
    }

    /// Sets the GGUF version written (2 or 3; the layouts are identical for little-endian).
    pub fn set_version(&mut self, version: u32) -> Result<(), GgufError> {
        if version != 2 && version != 3 {
            return Err(GgufError::writer(
                "version",
                format!("{version} is not 2 or 3"),
            ));
        }
        self.version = version;
        Ok(())
    }

    /// Sets the data alignment (a nonzero power of two that fits `u32`) and records it as
    /// `general.alignment` (u32). Offsets of tensors already added are recomputed.
    pub fn set_alignment(&mut self, alignment: u64) -> Result<(), GgufError> {
        let a = u32::try_from(alignment)
            .ok()
            .filter(|a| a.is_power_of_two())
            .ok_or_else(|| {
                GgufError::writer(
                    KEY_ALIGNMENT,
                    format!("alignment {alignment} is not a nonzero power of two that fits u32"),
                )
            })?;
        let old = self.alignment;
        self.alignment = alignment;
        if let Err(e) = self.recompute_offsets() {
            self.alignment = old;
            let _ = self.recompute_offsets();
            return Err(e);
        }
        match self.keys.get(KEY_ALIGNMENT) {
            Some(&i) => self.metadata[i].1 = Value::U32(a),
            None => {
                self.keys
                    .insert(KEY_ALIGNMENT.to_owned(), self.metadata.len());
                self.metadata
                    .push((KEY_ALIGNMENT.to_owned(), Value::U32(a)));
            }
        }
        Ok(())
    }

    /// The data alignment.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    fn recompute_offsets(&mut self) -> Result<(), GgufError> {
        let mut pos = 0u64;
        for t in &mut self.tensors {
            t.offset = pos;
            pos = pos
                .checked_add(t.n_bytes)
                .and_then(|e| align_up(e, self.alignment))
                .ok_or_else(|| {
                    GgufError::writer(format!("tensor '{}'", t.name), "data offset overflows u64")
                })?;
        }
        self.data_size = pos;
        Ok(())
    }

    /// Adds a metadata pair. Keys keep insertion order; an empty or duplicate key, or arrays
    /// nested deeper than [`MAX_ARRAY_DEPTH`](crate::MAX_ARRAY_DEPTH), are rejected. Adding
    /// `general.alignment` (must be a u32 power of two) also sets the alignment.
    pub fn add(&mut self, key: &str, value: impl Into<Value>) -> Result<(), GgufError> {
        let value = value.into();
        if key.is_empty() {
            return Err(GgufError::writer("metadata key", "empty key"));
        }
        if self.keys.contains_key(key) {
            return Err(GgufError::writer(
                format!("metadata key '{key}'"),
                "duplicate key",
            ));
        }
        if value.depth() > MAX_ARRAY_DEPTH {
            return Err(GgufError::writer(
                format!("metadata key '{key}'"),
                format!(
                    "arrays nested {} levels deep (limit {MAX_ARRAY_DEPTH})",
                    value.depth()
                ),
            ));
        }
        if key == KEY_ALIGNMENT {
            match value {
                Value::U32(a) => self.set_alignment(u64::from(a))?,
                ref v => {
                    return Err(GgufError::writer(
                        KEY_ALIGNMENT,
                        format!("must be u32, got {}", v.value_type()),
                    ))
                }
            }
            return Ok(());
        }
        self.keys.insert(key.to_owned(), self.metadata.len());
        self.metadata.push((key.to_owned(), value));
        Ok(())
    }

    /// Sets `key` as ggml's `gguf_set_val_*` does: an existing pair is removed and the new one
    /// appended, so the key moves to the end (llama-quantize's output order depends on it).
    pub fn set(&mut self, key: &str, value: impl Into<Value>) -> Result<(), GgufError> {
        let old = self.remove(key);
        let res = self.add(key, value);
        if res.is_err() {
            if let Some(v) = old {
                // Put the old pair back (at the end) so a rejected value changes nothing else.
                let _ = self.add(key, v);
            }
        }
        res
    }

    /// Removes `key` and returns its value. Removing `general.alignment` restores the default
    /// alignment.
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        let i = self.keys.remove(key)?;
        let (_, v) = self.metadata.remove(i);
        for idx in self.keys.values_mut() {
            if *idx > i {
                *idx -= 1;
            }
        }
        if key == KEY_ALIGNMENT {
            self.alignment = DEFAULT_ALIGNMENT;
            // Offsets only shrink with a smaller alignment; they fitted before.
            let _ = self.recompute_offsets();
        }
        Some(v)
    }

    /// Metadata pairs in insertion order.
    pub fn metadata(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.metadata.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The value of metadata key `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.keys.get(key).map(|&i| &self.metadata[i].1)
    }

    /// Adds a tensor (shape in ggml order: `dims[0]` = row length). Checks: unique non-empty
    /// name, 1 to 4 dims, each ≤ `i64::MAX`, row length a multiple of the type's block size,
    /// no u64 overflow. Its data offset is the previous tensor's end rounded up to the
    /// alignment.
    pub fn add_tensor_info(
        &mut self,
        name: &str,
        dims: &[u64],
        ty: GgmlType,
    ) -> Result<(), GgufError> {
        let field = || format!("tensor '{name}'");
        if name.is_empty() {
            return Err(GgufError::writer("tensor name", "empty name"));
        }
        if self.names.contains_key(name) {
            return Err(GgufError::writer(field(), "duplicate tensor name"));
        }
        if dims.is_empty() || dims.len() > MAX_DIMS {
            return Err(GgufError::writer(
                field(),
                format!("{} dims, must be 1 to {MAX_DIMS}", dims.len()),
            ));
        }
        if let Some(d) = dims.iter().find(|&&d| d > i64::MAX as u64) {
            return Err(GgufError::writer(
                field(),
                format!("dimension {d} exceeds i64::MAX"),
            ));
        }
        let bs = ty.block_size() as u64;
        if !dims[0].is_multiple_of(bs) {
            return Err(GgufError::writer(
                field(),
                format!(
                    "row length {} is not a multiple of the {ty} block size {bs}",
                    dims[0]
                ),
            ));
        }
        let n_rows = dims[1..].iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        let n_el = n_rows
            .and_then(|r| r.checked_mul(dims[0]))
            .filter(|&n| n <= i64::MAX as u64);
        let n_bytes = n_rows
            .zip(n_el)
            .and_then(|(r, _)| ty.row_bytes(dims[0])?.checked_mul(r))
            .ok_or_else(|| {
                GgufError::writer(field(), format!("size of shape {dims:?} overflows"))
            })?;
        let offset = self.data_size;
        let end = offset
            .checked_add(n_bytes)
            .and_then(|e| align_up(e, self.alignment))
            .ok_or_else(|| GgufError::writer(field(), "data offset overflows u64"))?;
        self.names.insert(name.to_owned(), self.tensors.len());
        self.tensors.push(TensorInfo {
            name: name.to_owned(),
            dims: dims.to_vec(),
            ty,
            interleaved: false,
            split: 0,
            offset,
            file_offset: 0,
            n_bytes,
        });
        self.data_size = end;
        Ok(())
    }

    /// Marks tensor `name` (already added) as stored with its rows interleaved 16 at a time
    /// (`moxie_quant::repack`): its infos carry the interleaved type id and the bytes written
    /// for it must be in that layout. Fails where the type or shape has no interleaved layout.
    pub fn set_interleaved(&mut self, name: &str) -> Result<(), GgufError> {
        let field = || format!("tensor '{name}'");
        let i = *self
            .names
            .get(name)
            .ok_or_else(|| GgufError::writer(field(), "no such tensor"))?;
        let t = &mut self.tensors[i];
        if !moxie_quant::repack::repack_supports_shape(t.ty, &t.dims) {
            return Err(GgufError::writer(
                field(),
                format!(
                    "{} {:?} has no interleaved layout (that needs {})",
                    t.ty,
                    t.dims,
                    moxie_quant::repack::layout_requirement(t.ty)
                ),
            ));
        }
        t.interleaved = true;
        Ok(())
    }

    /// Number of tensors added.
    pub fn tensor_count(&self) -> usize {
        self.tensors.len()
    }

    /// Size of the header (magic through the last tensor info), before padding.
    pub fn header_len(&self) -> u64 {
        let mut n = 4 + 4 + 8 + 8;
        for (k, v) in &self.metadata {
            n += 8 + k.len() as u64 + 4 + value_len(v);
        }
        for t in &self.tensors {
            n += 8 + t.name.len() as u64 + 4 + 8 * t.dims.len() as u64 + 4 + 8;
        }
        n
    }

    /// Byte offset of the data section in the written file.
    pub fn data_offset(&self) -> u64 {
        // header_len is far below u64::MAX for anything that fits in memory.
        align_up(self.header_len(), self.alignment).unwrap_or(u64::MAX)
    }

    /// Size of the data section including padding after each tensor.
    pub fn data_size(&self) -> u64 {
        self.data_size
    }

    /// The tensor infos as they will be written (`file_offset` filled in, `split` 0).
    pub fn tensor_infos(&self) -> Vec<TensorInfo> {
        let base = self.data_offset();
        self.tensors
            .iter()
            .map(|t| TensorInfo {
                file_offset: base.saturating_add(t.offset),
                ..t.clone()
            })
            .collect()
    }

    /// The header bytes including the zero padding up to the data section.
    pub fn header_bytes(&self) -> Vec<u8> {
        let len = self.header_len();
        let mut out = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut out, k);
            out.extend_from_slice(&v.value_type().id().to_le_bytes());
            put_value(&mut out, v);
        }
        for t in &self.tensors {
            put_str(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.type_id().to_le_bytes());
            out.extend_from_slice(&t.offset.to_le_bytes());
        }
        let padded = align_up(out.len() as u64, self.alignment).unwrap_or(out.len() as u64);
        out.resize(padded as usize, 0);
        out
    }

    /// Writes only the header to `path`: the metadata and the tensor infos with the offsets the
    /// full file would have, zero-padded to the alignment, so the file ends exactly where the
    /// data section would start. Returns the file size (= [`data_offset`](GgufWriter::data_offset)).
    ///
    /// Such a file carries a model's whole tensor index without its weights (for placement
    /// planning on models too big to have at hand). [`GgufFile::open_header_only`] reads it;
    /// a normal open rejects it because the tensor data lies past the end of the file. Mark
    /// it in the metadata (moxie writes `moxie.header_only = true`) so tools can tell why.
    pub fn write_header_only(&self, path: &Path) -> Result<u64, GgufError> {
        let name = path.display().to_string();
        let header = self.header_bytes();
        std::fs::write(path, &header).map_err(|e| GgufError::io(&name, "write", e))?;
        Ok(header.len() as u64)
    }

    /// Starts streaming to `out`: writes the header now; then call
    /// [`GgufStreamWriter::write_tensor`] for every tensor in order and
    /// [`finish`](GgufStreamWriter::finish).
    pub fn begin_with<W: Write>(&self, out: W) -> Result<GgufStreamWriter<W>, GgufError> {
        self.begin_named(out, "<stream>".to_owned(), 0)
    }

    fn begin_named<W: Write>(
        &self,
        mut out: W,
        name: String,
        split: usize,
    ) -> Result<GgufStreamWriter<W>, GgufError> {
        let header = self.header_bytes();
        out.write_all(&header)
            .map_err(|e| GgufError::io(&name, "write", e))?;
        let base = header.len() as u64;
        let tensors = self
            .tensors
            .iter()
            .map(|t| TensorInfo {
                split,
                file_offset: base + t.offset,
                ..t.clone()
            })
            .collect();
        Ok(GgufStreamWriter {
            out,
            name,
            tensors,
            alignment: self.alignment,
            next: 0,
            current: None,
            data_pos: 0,
        })
    }

    /// Creates `path` and streams to it (see [`begin_with`](GgufWriter::begin_with)).
    pub fn begin(&self, path: &Path) -> Result<GgufStreamWriter<BufWriter<File>>, GgufError> {
        let name = path.display().to_string();
        let f = File::create(path).map_err(|e| GgufError::io(&name, "create", e))?;
        self.begin_named(BufWriter::with_capacity(1 << 20, f), name, 0)
    }

    fn write_all_to<W: Write>(
        &self,
        mut s: GgufStreamWriter<W>,
        data: &mut dyn FnMut(&TensorInfo) -> Vec<u8>,
    ) -> Result<W, GgufError> {
        let infos = s.tensors.clone();
        for t in &infos {
            let d = data(t);
            s.write_tensor(&t.name, &d)?;
        }
        s.finish()
    }

    /// The whole file in memory; `data` returns each tensor's bytes (exactly `n_bytes`).
    pub fn write_to_bytes(
        &self,
        mut data: impl FnMut(&TensorInfo) -> Vec<u8>,
    ) -> Result<Vec<u8>, GgufError> {
        let s = self.begin_with(Vec::new())?;
        self.write_all_to(s, &mut data)
    }

    /// Writes the whole file to `path`; `data` returns each tensor's bytes.
    pub fn write_file(
        &self,
        path: &Path,
        mut data: impl FnMut(&TensorInfo) -> Vec<u8>,
    ) -> Result<(), GgufError> {
        let s = self.begin(path)?;
        let name = s.name.clone();
        let w = self.write_all_to(s, &mut data)?;
        w.into_inner()
            .map_err(|e| GgufError::io(&name, "write", e.into_error()))?;
        Ok(())
    }

    /// Splits into `n_parts` writers with tensor counts as even as possible (llama.cpp
    /// `gguf-split` layout: all metadata in part 0, `split.no` (u16), `split.count` (u16)
    /// and `split.tensors.count` (i32) in every part; `general.alignment`, if set, in every
    /// part too). Write part `i` to [`split_path`]`(prefix, i, n_parts)`.
    pub fn split(&self, n_parts: usize) -> Result<Vec<GgufWriter>, GgufError> {
        if n_parts == 0 {
            return Err(GgufError::writer("split", "0 parts"));
        }
        let n = self.tensors.len();
        let starts: Vec<usize> = (1..n_parts).map(|k| k * n / n_parts).collect();
        self.split_at(&starts)
    }

    /// Splits with at most `max_tensors` tensors per part (like `gguf-split --split-max-tensors`).
    pub fn split_max_tensors(&self, max_tensors: usize) -> Result<Vec<GgufWriter>, GgufError> {
        if max_tensors == 0 {
            return Err(GgufError::writer("split", "max_tensors is 0"));
        }
        let starts: Vec<usize> = (1..)
            .map(|k| k * max_tensors)
            .take_while(|&s| s < self.tensors.len())
            .collect();
        self.split_at(&starts)
    }

    /// Splits so that part `k + 1` starts with tensor `starts[k]` (`starts` non-decreasing,
    /// each at most the tensor count; a repeated start gives an empty part).
    pub fn split_at(&self, starts: &[usize]) -> Result<Vec<GgufWriter>, GgufError> {
        let n_parts = starts.len() + 1;
        if n_parts > usize::from(u16::MAX) {
            return Err(GgufError::writer(
                "split",
                format!("{n_parts} parts exceed u16::MAX"),
            ));
        }
        if let Some((k, _)) = self.metadata.iter().find(|(k, _)| k.starts_with("split.")) {
            return Err(GgufError::writer(
                format!("metadata key '{k}'"),
                "split keys already present",
            ));
        }
        let total = i32::try_from(self.tensors.len())
            .map_err(|_| GgufError::writer("split", "more than i32::MAX tensors"))?;
        let mut bounds = Vec::with_capacity(n_parts + 1);
        bounds.push(0);
        for &s in starts {
            if s < *bounds.last().unwrap_or(&0) || s > self.tensors.len() {
                return Err(GgufError::writer(
                    "split",
                    format!("bad part start {s} in {starts:?}"),
                ));
            }
            bounds.push(s);
        }
        bounds.push(self.tensors.len());
        let mut parts = Vec::with_capacity(n_parts);
        for p in 0..n_parts {
            let mut w = GgufWriter::new();
            w.version = self.version;
            if p == 0 {
                for (k, v) in &self.metadata {
                    w.add(k, v.clone())?;
                }
            } else if let Some(v) = self.get(KEY_ALIGNMENT) {
                w.add(KEY_ALIGNMENT, v.clone())?;
            }
            w.add(KEY_SPLIT_NO, Value::U16(p as u16))?;
            w.add(KEY_SPLIT_COUNT, Value::U16(n_parts as u16))?;
            w.add(KEY_SPLIT_TENSORS_COUNT, Value::I32(total))?;
            for t in &self.tensors[bounds[p]..bounds[p + 1]] {
                w.add_tensor_info(&t.name, &t.dims, t.ty)?;
            }
            parts.push(w);
        }
        Ok(parts)
    }

    /// Splits into `n_parts` (see [`split`](GgufWriter::split)) and writes
    /// `PREFIX-00001-of-0000N.gguf` ...; `data` gets each tensor with `split` set to its part.
    /// Returns the paths written.
    pub fn write_split_files(
        &self,
        prefix: &Path,
        n_parts: usize,
        mut data: impl FnMut(&TensorInfo) -> Vec<u8>,
    ) -> Result<Vec<PathBuf>, GgufError> {
        let parts = self.split(n_parts)?;
        let mut paths = Vec::with_capacity(n_parts);
        for (i, w) in parts.iter().enumerate() {
            let path = split_path(prefix, i, n_parts);
            let name = path.display().to_string();
            let f = File::create(&path).map_err(|e| GgufError::io(&name, "create", e))?;
            let s = w.begin_named(BufWriter::with_capacity(1 << 20, f), name.clone(), i)?;
            w.write_all_to(s, &mut data)?
                .into_inner()
                .map_err(|e| GgufError::io(&name, "write", e.into_error()))?;
            paths.push(path);
        }
        Ok(paths)
    }
}

/// Streams tensor data after the header, in the writer's tensor order, padding each tensor to
/// the alignment. Created by [`GgufWriter::begin`] / [`GgufWriter::begin_with`].
#[derive(Debug)]
pub struct GgufStreamWriter<W: Write = BufWriter<File>> {
    out: W,
    name: String,
    tensors: Vec<TensorInfo>,
    alignment: u64,
    next: usize,
    /// Tensor being written and bytes written so far.
    current: Option<(usize, u64)>,
    /// Bytes written into the data section so far.
    data_pos: u64,
}

const ZEROS: [u8; 4096] = [0; 4096];

impl<W: Write> GgufStreamWriter<W> {
    fn err(&self, field: String, reason: String) -> GgufError {
        GgufError::Writer {
            field: format!("{}: {field}", self.name),
            reason,
        }
    }

    fn raw(&mut self, b: &[u8]) -> Result<(), GgufError> {
        self.out
            .write_all(b)
            .map_err(|e| GgufError::io(&self.name, "write", e))?;
        self.data_pos += b.len() as u64;
        Ok(())
    }

    fn pad_to(&mut self, target: u64) -> Result<(), GgufError> {
        while self.data_pos < target {
            let n = (target - self.data_pos).min(ZEROS.len() as u64) as usize;
            self.raw(&ZEROS[..n])?;
        }
        Ok(())
    }

    /// The tensor infos being written (with final `file_offset`s).
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The next tensor expected (the one in progress, or the next to start).
    pub fn next_tensor(&self) -> Option<&TensorInfo> {
        match self.current {
            Some((i, _)) => self.tensors.get(i),
            None => self.tensors.get(self.next),
        }
    }

    /// Writes all of tensor `name`'s data; it must be the next tensor in order and `data`
    /// must be exactly its `n_bytes` long.
    pub fn write_tensor(&mut self, name: &str, data: &[u8]) -> Result<(), GgufError> {
        if let Some((i, done)) = self.current {
            let t = &self.tensors[i];
            return Err(self.err(
                format!("tensor '{name}'"),
                format!(
                    "tensor '{}' is incomplete ({done} of {} bytes written)",
                    t.name, t.n_bytes
                ),
            ));
        }
        if let Some(t) = self.tensors.get(self.next) {
            if t.name == name && data.len() as u64 != t.n_bytes {
                return Err(self.err(
                    format!("tensor '{name}'"),
                    format!("got {} bytes, expected {}", data.len(), t.n_bytes),
                ));
            }
        }
        self.write_tensor_chunk(name, data)
    }

    /// Writes the next piece of tensor `name`'s data, for tensors too large to hold in memory:
    /// the first chunk with a new name starts the next tensor (the previous one must be
    /// complete); the tensor is complete when `n_bytes` have been written.
    pub fn write_tensor_chunk(&mut self, name: &str, chunk: &[u8]) -> Result<(), GgufError> {
        let (i, done) = match self.current {
            Some((i, done)) if self.tensors[i].name == name => (i, done),
            Some((i, done)) => {
                let t = &self.tensors[i];
                return Err(self.err(
                    format!("tensor '{name}'"),
                    format!(
                        "tensor '{}' is incomplete ({done} of {} bytes written)",
                        t.name, t.n_bytes
                    ),
                ));
            }
            None => {
                let i = self.next;
                let Some(t) = self.tensors.get(i) else {
                    return Err(self.err(
                        format!("tensor '{name}'"),
                        "unexpected tensor: all tensors are written".to_owned(),
                    ));
                };
                if t.name != name {
                    return Err(self.err(
                        format!("tensor '{name}'"),
                        format!(
                            "expected tensor '{}' next (tensors are written in index order)",
                            t.name
                        ),
                    ));
                }
                let off = t.offset;
                self.pad_to(off)?;
                self.next += 1;
                (i, 0)
            }
        };
        let n_bytes = self.tensors[i].n_bytes;
        let new_done = done + chunk.len() as u64;
        if new_done > n_bytes {
            self.current = Some((i, done));
            return Err(self.err(
                format!("tensor '{name}'"),
                format!("{new_done} bytes written, more than its {n_bytes} bytes"),
            ));
        }
        self.current = Some((i, done));
        self.raw(chunk)?;
        if new_done == n_bytes {
            self.current = None;
            let end = align_up(self.data_pos, self.alignment).unwrap_or(self.data_pos);
            self.pad_to(end)?;
        } else {
            self.current = Some((i, new_done));
        }
        Ok(())
    }

    /// Checks that every tensor was written completely, flushes, and returns the sink.
    pub fn finish(mut self) -> Result<W, GgufError> {
        if let Some(t) = self.next_tensor() {
            return Err(self.err(
                format!("tensor '{}'", t.name),
                "not written (or incomplete) at finish".to_owned(),
            ));
        }
        self.out
            .flush()
            .map_err(|e| GgufError::io(&self.name, "flush", e))?;
        Ok(self.out)
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_str(out, s),
        Value::Array(a) => put_array(out, a),
    }
}

macro_rules! put_all {
    ($out:expr, $v:expr) => {
        for x in $v {
            $out.extend_from_slice(&x.to_le_bytes());
        }
    };
}

/// Element type, count, elements (nested arrays repeat this per element).
fn put_array(out: &mut Vec<u8>, a: &Array) {
    out.extend_from_slice(&a.elem_type().id().to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    match a.data() {
        ArrayData::U8(v) => out.extend_from_slice(v),
        ArrayData::I8(v) => put_all!(out, v),
        ArrayData::U16(v) => put_all!(out, v),
        ArrayData::I16(v) => put_all!(out, v),
        ArrayData::U32(v) => put_all!(out, v),
        ArrayData::I32(v) => put_all!(out, v),
        ArrayData::U64(v) => put_all!(out, v),
        ArrayData::I64(v) => put_all!(out, v),
        ArrayData::F32(v) => put_all!(out, v),
        ArrayData::F64(v) => put_all!(out, v),
        ArrayData::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        ArrayData::String(s) => {
            for x in s {
                put_str(out, x);
            }
        }
        ArrayData::Array(v) => {
            for x in v {
                put_array(out, x);
            }
        }
    }
}

/// Encoded size of a value (without its type id).
fn value_len(v: &Value) -> u64 {
    match v {
        Value::String(s) => 8 + s.len() as u64,
        Value::Array(a) => array_len(a),
        other => other.value_type().fixed_size().unwrap_or(0) as u64,
    }
}

fn array_len(a: &Array) -> u64 {
    let body = match a.data() {
        ArrayData::String(s) => 8 * s.len() as u64 + s.total_bytes() as u64,
        ArrayData::Array(v) => v.iter().map(array_len).sum(),
        _ => a.elem_type().fixed_size().unwrap_or(0) as u64 * a.len() as u64,
    };
    4 + 8 + body
}
