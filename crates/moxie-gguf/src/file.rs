//! [`GgufFile`]: an opened (possibly split) GGUF model.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use crate::parse::{parse, ParsedHeader};
use crate::{GgufError, Metadata, TensorInfo};

/// Key: number of split parts (`u16` as written by llama.cpp's `gguf-split`).
pub const KEY_SPLIT_COUNT: &str = "split.count";
/// Key: 0-based index of this part (`u16`).
pub const KEY_SPLIT_NO: &str = "split.no";
/// Key: total number of tensors over all parts (`i32`).
pub const KEY_SPLIT_TENSORS_COUNT: &str = "split.tensors.count";
/// Largest part count the `-%05d-of-%05d` naming can express.
pub const MAX_SPLIT_COUNT: u64 = 99_999;

/// The file name of part `index` (0-based) of `count`: `PREFIX-00001-of-00008.gguf` for
/// `index` 0, `count` 8 (llama.cpp's `llama_split_path`).
pub fn split_path(prefix: &Path, index: usize, count: usize) -> PathBuf {
    let mut s = prefix.as_os_str().to_owned();
    s.push(format!("-{:05}-of-{:05}.gguf", index + 1, count));
    PathBuf::from(s)
}

/// The `PREFIX` of a split part's path, if its name ends with the `-%05d-of-%05d.gguf`
/// suffix for part `index` (0-based) of `count` (llama.cpp's `llama_split_prefix`).
pub fn split_prefix(path: &Path, index: usize, count: usize) -> Option<PathBuf> {
    let name = path.file_name()?.to_str()?;
    let suffix = format!("-{:05}-of-{:05}.gguf", index + 1, count);
    let stem = name.strip_suffix(&suffix)?;
    if stem.is_empty() {
        return None;
    }
    Some(path.with_file_name(stem))
}

/// How to open a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenOptions {
    /// Validate the index only; tensor data may be absent (the file may end where the data
    /// section starts). [`GgufFile::tensor_data`] then always fails.
    pub header_only: bool,
    /// When the file has `split.count` > 1, find and open all parts.
    pub follow_splits: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            header_only: false,
            follow_splits: true,
        }
    }
}

enum Backing {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

struct Part {
    name: String,
    backing: Backing,
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Metadata,
    n_tensors: usize,
}

/// An opened GGUF model: metadata, tensor index and zero-copy access to tensor data.
///
/// Files are memory-mapped read-only and never copied; [`tensor_data`](GgufFile::tensor_data)
/// returns slices of the mapping. A model split into `PREFIX-0000k-of-0000n.gguf` parts is
/// presented as one index whose [`TensorInfo::split`] says which part holds each tensor.
/// `GgufFile` is `Send + Sync`.
pub struct GgufFile {
    paths: Vec<PathBuf>,
    parts: Vec<Part>,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    header_only: bool,
    total_bytes: u64,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("paths", &self.paths)
            .field("version", &self.version())
            .field("alignment", &self.alignment())
            .field("n_metadata", &self.metadata().len())
            .field("n_tensors", &self.tensors.len())
            .field("total_tensor_bytes", &self.total_bytes)
            .field("header_only", &self.header_only)
            .finish()
    }
}

fn path_name(path: &Path) -> String {
    path.display().to_string()
}

#[allow(unsafe_code)] // the one mmap call below
fn load_part(path: &Path, header_only: bool) -> Result<(Backing, ParsedHeader), GgufError> {
    let name = path_name(path);
    let file = File::open(path).map_err(|e| GgufError::io(&name, "open", e))?;
    let len = file
        .metadata()
        .map_err(|e| GgufError::io(&name, "stat", e))?
        .len();
    let backing = if len == 0 {
        Backing::Owned(Vec::new())
    } else {
        // SAFETY: the mapping is read-only and private to this process; we never create a
        // mutable view of it. Like every mmap-based reader we rely on the file not being
        // truncated or modified by another process while it is mapped (doing so is outside
        // what this library supports; all bounds were validated against the length at open).
        let map = unsafe { memmap2::MmapOptions::new().map(&file) };
        Backing::Mmap(map.map_err(|e| GgufError::io(&name, "mmap", e))?)
    };
    let parsed = parse(&name, backing.bytes(), header_only)?;
    Ok((backing, parsed))
}

fn make_part(name: String, backing: Backing, p: ParsedHeader) -> (Part, Vec<TensorInfo>, Vec<u64>) {
    let part = Part {
        name,
        backing,
        version: p.version,
        alignment: p.alignment,
        data_offset: p.data_offset,
        metadata: p.metadata,
        n_tensors: p.tensors.len(),
    };
    (part, p.tensors, p.record_offsets)
}

/// Reads `split.count` / `split.no` of one part: `Ok(None)` if unsplit.
fn split_keys(name: &str, md: &Metadata) -> Result<Option<(u64, u64)>, GgufError> {
    let field = |key: &str| match md.offset_of(key) {
        Some(o) => format!("key '{key}' at byte {o}"),
        None => format!("key '{key}'"),
    };
    let err = |key: &str, reason: String| GgufError::Split {
        file: name.to_owned(),
        field: field(key),
        reason,
    };
    let int = |key: &str| -> Result<Option<u64>, GgufError> {
        match md.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                err(
                    key,
                    format!(
                        "value {v} (type {}) is not a non-negative integer",
                        v.value_type()
                    ),
                )
            }),
        }
    };
    let count = int(KEY_SPLIT_COUNT)?;
    let no = int(KEY_SPLIT_NO)?;
    match count {
        None => {
            if let Some(no) = no {
                if no != 0 {
                    return Err(err(
                        KEY_SPLIT_NO,
                        format!("split.no is {no} but split.count is absent"),
                    ));
                }
            }
            Ok(None)
        }
        Some(0) => Err(err(KEY_SPLIT_COUNT, "split.count is 0".to_owned())),
        Some(c) if c > MAX_SPLIT_COUNT => Err(err(
            KEY_SPLIT_COUNT,
            format!("split.count {c} exceeds {MAX_SPLIT_COUNT}"),
        )),
        Some(c) => {
            let no = match no {
                Some(no) => no,
                None if c == 1 => 0,
                None => {
                    return Err(err(
                        KEY_SPLIT_NO,
                        format!("missing although split.count is {c}"),
                    ))
                }
            };
            if no >= c {
                return Err(err(
                    KEY_SPLIT_NO,
                    format!("split.no {no} is not below split.count {c}"),
                ));
            }
            Ok(Some((c, no)))
        }
    }
}

impl GgufFile {
    /// Opens a GGUF file, memory-mapping it read-only. If it is one part of a split model
    /// (`split.count` > 1), all parts `PREFIX-00001-of-0000N.gguf` ... are found next to it
    /// and opened too (any part may be given; part 1 comes first in the index). Every tensor's
    /// data must be inside its file.
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        Self::open_with(path, OpenOptions::default())
    }

    /// Like [`open`](GgufFile::open), but tensor data may be absent: validates the header and
    /// the tensor index (types, shapes, alignment, overlaps, overflow) only. For header-only
    /// GGUFs of big models and for planning. [`tensor_data`](GgufFile::tensor_data) fails.
    pub fn open_header_only(path: &Path) -> Result<GgufFile, GgufError> {
        Self::open_with(
            path,
            OpenOptions {
                header_only: true,
                follow_splits: true,
            },
        )
    }

    /// Opens with explicit [`OpenOptions`].
    pub fn open_with(path: &Path, opts: OpenOptions) -> Result<GgufFile, GgufError> {
        let (backing, parsed) = load_part(path, opts.header_only)?;
        let name = path_name(path);
        let split = split_keys(&name, &parsed.metadata)?;
        let (count, no) = match split {
            Some((c, no)) if c > 1 && opts.follow_splits => (c as usize, no as usize),
            _ => {
                let (part, tensors, recs) = make_part(name, backing, parsed);
                return Self::assemble(
                    vec![path.to_owned()],
                    vec![(part, tensors, recs)],
                    opts.header_only,
                );
            }
        };

        let prefix = split_prefix(path, no, count).ok_or_else(|| GgufError::Split {
            file: name.clone(),
            field: "file name".to_owned(),
            reason: format!(
                "split.no {no} / split.count {count} but the name does not end with -{:05}-of-{:05}.gguf",
                no + 1,
                count
            ),
        })?;
        let mut given = Some((backing, parsed));
        let mut paths = Vec::with_capacity(crate::parse::prealloc(count));
        let mut parts = Vec::with_capacity(crate::parse::prealloc(count));
        for idx in 0..count {
            let p = split_path(&prefix, idx, count);
            let pname = path_name(&p);
            let (b, h) = if idx == no {
                given.take().ok_or_else(|| GgufError::Split {
                    file: pname.clone(),
                    field: "parts".to_owned(),
                    reason: "internal error: part visited twice".to_owned(),
                })?
            } else {
                match std::fs::metadata(&p) {
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        return Err(GgufError::MissingSplit {
                            file: pname,
                            part: idx as u64 + 1,
                            count: count as u64,
                            opened: name,
                        })
                    }
                    Err(e) => return Err(GgufError::io(pname, "stat", e)),
                }
                let (b, h) = load_part(&p, opts.header_only)?;
                match split_keys(&pname, &h.metadata)? {
                    Some((c, n)) if c == count as u64 && n == idx as u64 => {}
                    other => {
                        let (c, n) = other.unwrap_or((1, 0));
                        return Err(GgufError::Split {
                            file: pname,
                            field: format!("keys '{KEY_SPLIT_COUNT}' / '{KEY_SPLIT_NO}'"),
                            reason: format!(
                                "part says it is part {} of {c}, expected part {} of {count} (opened from {name})",
                                n + 1,
                                idx + 1
                            ),
                        });
                    }
                }
                (b, h)
            };
            let (part, tensors, recs) = make_part(pname, b, h);
            paths.push(p);
            parts.push((part, tensors, recs));
        }
        let file = Self::assemble(paths, parts, opts.header_only)?;
        // split.tensors.count, where present (every part written by gguf-split), must match.
        for part in &file.parts {
            let md = &part.metadata;
            if let Some(v) = md.get(KEY_SPLIT_TENSORS_COUNT) {
                let at = md.offset_of(KEY_SPLIT_TENSORS_COUNT).unwrap_or(0);
                if v.as_u64() != Some(file.tensors.len() as u64) {
                    return Err(GgufError::Split {
                        file: part.name.clone(),
                        field: format!("key '{KEY_SPLIT_TENSORS_COUNT}' at byte {at}"),
                        reason: format!(
                            "says {v} tensors but the {count} parts hold {}",
                            file.tensors.len()
                        ),
                    });
                }
            }
        }
        Ok(file)
    }

    /// Parses an in-memory GGUF image (for tests and tools). `name` is used in error messages
    /// and as [`paths`](GgufFile::paths)`()[0]`. Split keys are not followed.
    pub fn from_bytes(name: &str, bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::from_bytes_with(name, bytes, false)
    }

    /// [`from_bytes`](GgufFile::from_bytes), optionally header-only.
    pub fn from_bytes_with(
        name: &str,
        bytes: Vec<u8>,
        header_only: bool,
    ) -> Result<GgufFile, GgufError> {
        let parsed = parse(name, &bytes, header_only)?;
        let (part, tensors, recs) = make_part(name.to_owned(), Backing::Owned(bytes), parsed);
        Self::assemble(
            vec![PathBuf::from(name)],
            vec![(part, tensors, recs)],
            header_only,
        )
    }

    fn assemble(
        paths: Vec<PathBuf>,
        parts: Vec<(Part, Vec<TensorInfo>, Vec<u64>)>,
        header_only: bool,
    ) -> Result<GgufFile, GgufError> {
        let n: usize = parts.iter().map(|p| p.1.len()).sum();
        let mut tensors = Vec::with_capacity(n);
        let mut by_name: HashMap<String, usize> = HashMap::with_capacity(n);
        let mut out_parts = Vec::with_capacity(parts.len());
        let mut total_bytes = 0u64;
        for (s, (part, ts, recs)) in parts.into_iter().enumerate() {
            for (i, (mut t, rec)) in ts.into_iter().zip(recs).enumerate() {
                if let Some(&first) = by_name.get(&t.name) {
                    let first_split: usize = tensors
                        .get(first)
                        .map(|x: &TensorInfo| x.split)
                        .unwrap_or(0);
                    let first_file = out_parts
                        .get(first_split)
                        .map(|p: &Part| p.name.clone())
                        .unwrap_or_default();
                    return Err(GgufError::DuplicateTensor {
                        file: part.name.clone(),
                        name: t.name,
                        index: i as u64,
                        offset: rec,
                        first_file,
                    });
                }
                t.split = s;
                total_bytes = total_bytes.saturating_add(t.n_bytes);
                by_name.insert(t.name.clone(), tensors.len());
                tensors.push(t);
            }
            out_parts.push(part);
        }
        Ok(GgufFile {
            paths,
            parts: out_parts,
            tensors,
            by_name,
            header_only,
            total_bytes,
        })
    }

    /// GGUF version of the (first) file: 2 or 3.
    pub fn version(&self) -> u32 {
        self.parts[0].version
    }

    /// Data alignment of the (first) file: `general.alignment` or 32.
    pub fn alignment(&self) -> u64 {
        self.parts[0].alignment
    }

    /// One path per split part, in part order (one entry for unsplit files).
    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    /// Number of split parts (1 for unsplit files).
    pub fn split_count(&self) -> usize {
        self.parts.len()
    }

    /// Whether the file was opened header-only.
    pub fn is_header_only(&self) -> bool {
        self.header_only
    }

    /// The model metadata: that of the first part (llama.cpp's `gguf-split` writes all
    /// metadata there; later parts carry only the `split.*` keys).
    pub fn metadata(&self) -> &Metadata {
        &self.parts[0].metadata
    }

    /// Metadata of split part `split`.
    pub fn part_metadata(&self, split: usize) -> Option<&Metadata> {
        self.parts.get(split).map(|p| &p.metadata)
    }

    /// Byte offset of split part `split`'s data section in its file.
    pub fn data_offset(&self, split: usize) -> Option<u64> {
        self.parts.get(split).map(|p| p.data_offset)
    }

    /// Alignment of split part `split`.
    pub fn part_alignment(&self, split: usize) -> Option<u64> {
        self.parts.get(split).map(|p| p.alignment)
    }

    /// Number of tensors in split part `split`.
    pub fn part_tensor_count(&self, split: usize) -> Option<usize> {
        self.parts.get(split).map(|p| p.n_tensors)
    }

    /// The whole mapped file of split part `split` (for madvise / prefetch by the caller).
    /// `None` for a bad index or in header-only mode.
    pub fn part_bytes(&self, split: usize) -> Option<&[u8]> {
        if self.header_only {
            return None;
        }
        self.parts.get(split).map(|p| p.backing.bytes())
    }

    /// All tensors, in file order (part 0 first).
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The bytes of tensor `t`: a zero-copy slice of its part's mapping. Fails in
    /// header-only mode and for a `TensorInfo` that does not describe a tensor of this file.
    pub fn tensor_data(&self, t: &TensorInfo) -> Result<&[u8], GgufError> {
        let own = self.tensor(&t.name).ok_or_else(|| self.foreign(t))?;
        if own.split != t.split || own.file_offset != t.file_offset || own.n_bytes != t.n_bytes {
            return Err(self.foreign(t));
        }
        self.bytes_of(t)
    }

    /// The bytes of tensor `index` of [`GgufFile::tensors`]: [`GgufFile::tensor_data`] without
    /// the name lookup that checks the entry is this file's (the forward pass asks for every
    /// weight's bytes on every token). `None` if there is no tensor `index`.
    pub fn tensor_data_at(&self, index: usize) -> Option<Result<&[u8], GgufError>> {
        self.tensors().get(index).map(|t| self.bytes_of(t))
    }

    /// Drop the mapped pages that lie wholly inside tensor `index`'s bytes from this process
    /// (`madvise(MADV_DONTNEED)`), for a caller that has copied the tensor elsewhere (e.g.
    /// repacked it) so the copy does not double the resident memory. The bytes stay readable:
    /// a later access reads them from the file again. No effect on files read into memory.
    #[allow(unsafe_code)] // the one madvise call below
    pub fn release_tensor_pages(&self, index: usize) {
        let Some(t) = self.tensors.get(index) else {
            return;
        };
        let Some(Part {
            backing: Backing::Mmap(map),
            ..
        }) = self.parts.get(t.split)
        else {
            return;
        };
        const PAGE: u64 = 4096;
        let start = t.file_offset.next_multiple_of(PAGE);
        let end = (t.file_offset + t.n_bytes) / PAGE * PAGE;
        if end <= start || end > map.len() as u64 {
            return;
        }
        // SAFETY: the mapping is a read-only view of the file (`Mmap`, not `MmapMut`), so
        // MADV_DONTNEED only drops pages that the next access faults in again from the file;
        // no bytes change. The range is page-aligned and inside the mapping (checked above).
        let r = unsafe {
            map.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                start as usize,
                (end - start) as usize,
            )
        };
        // Best effort: keeping the pages costs memory, never correctness.
        let _ = r;
    }

    /// Bytes `range` (offsets inside tensor `index`) read from the file and mapped into this
    /// process now (`madvise(MADV_POPULATE_READ)`, what llama.cpp's `MAP_POPULATE` does for the
    /// whole file), so later reads do not fault. Kernels before Linux 5.14 lack it: they are
    /// asked to read ahead instead (`MADV_WILLNEED`, which returns at once). Returns whether
    /// the pages were populated; `false` also for files read into memory and bad ranges.
    pub fn populate_tensor_pages(&self, index: usize, range: std::ops::Range<u64>) -> bool {
        let Some(t) = self.tensors.get(index) else {
            return false;
        };
        let Some(Part {
            backing: Backing::Mmap(map),
            ..
        }) = self.parts.get(t.split)
        else {
            return false;
        };
        const PAGE: u64 = 4096;
        let start = (t.file_offset + range.start) / PAGE * PAGE;
        let end = (t.file_offset + range.end.min(t.n_bytes)).min(map.len() as u64);
        if range.start >= range.end || end <= start {
            return false;
        }
        let (offset, len) = (start as usize, (end - start) as usize);
        match map.advise_range(memmap2::Advice::PopulateRead, offset, len) {
            Ok(()) => true,
            Err(_) => {
                // Best effort: a read-ahead hint, or nothing; the bytes are read on use.
                let _ = map.advise_range(memmap2::Advice::WillNeed, offset, len);
                false
            }
        }
    }

    fn foreign(&self, t: &TensorInfo) -> GgufError {
        GgufError::ForeignTensor {
            file: self
                .parts
                .get(t.split)
                .map_or_else(|| self.parts[0].name.clone(), |p| p.name.clone()),
            name: t.name.clone(),
            split: t.split,
            start: t.file_offset,
            end: t.file_offset.saturating_add(t.n_bytes),
        }
    }

    /// `t`'s bytes in its split's mapping (`t` is one of this file's entries).
    fn bytes_of(&self, t: &TensorInfo) -> Result<&[u8], GgufError> {
        let foreign = || self.foreign(t);
        let part = self.parts.get(t.split).ok_or_else(foreign)?;
        if self.header_only {
            return Err(GgufError::HeaderOnly {
                file: part.name.clone(),
                name: t.name.clone(),
            });
        }
        let bytes = part.backing.bytes();
        let start = usize::try_from(t.file_offset).map_err(|_| foreign())?;
        let n = usize::try_from(t.n_bytes).map_err(|_| foreign())?;
        let end = start.checked_add(n).ok_or_else(foreign)?;
        bytes.get(start..end).ok_or_else(foreign)
    }

    /// The bytes of the tensor called `name` (`Ok(None)` if there is no such tensor).
    pub fn tensor_data_by_name(&self, name: &str) -> Result<Option<&[u8]>, GgufError> {
        match self.tensor(name) {
            None => Ok(None),
            Some(t) => self.tensor_data(t).map(Some),
        }
    }

    /// Sum of all tensors' `n_bytes` (padding between tensors not included).
    pub fn total_tensor_bytes(&self) -> u64 {
        self.total_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_names() {
        let p = split_path(Path::new("/m/DeepSeek"), 0, 8);
        assert_eq!(p, Path::new("/m/DeepSeek-00001-of-00008.gguf"));
        assert_eq!(split_prefix(&p, 0, 8), Some(PathBuf::from("/m/DeepSeek")));
        assert_eq!(split_prefix(&p, 1, 8), None);
        assert_eq!(split_prefix(Path::new("-00001-of-00008.gguf"), 0, 8), None);
        assert_eq!(split_prefix(Path::new("x.gguf"), 0, 1), None);
    }

    #[test]
    fn send_sync() {
        fn check<T: Send + Sync>() {}
        check::<GgufFile>();
        check::<GgufError>();
    }
}
