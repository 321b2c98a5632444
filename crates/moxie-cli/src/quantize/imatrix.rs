//! Importance matrices as llama.cpp's `llama-imatrix` writes them, read the way llama-quantize
//! reads them (`common_imatrix_load` + `load_imatrix` in tools/quantize):
//!
//! * GGUF (the default output): per weight `NAME.in_sum2` (F32 `[n_per_row, n_mat]`, sums of
//!   squared activations per expert) and `NAME.counts` (F32 `[1, n_mat]`, tokens per expert),
//!   metadata `imatrix.datasets` (string array), `imatrix.chunk_count`, `imatrix.chunk_size`
//!   (u32). Each value becomes `sum / count`; an expert that saw no token gets all 1.
//! * legacy `.dat` (`--output-format dat`): `i32 n_entries`, per entry `i32 len, name, i32
//!   ncall, i32 nval, f32 values[nval]` (already divided by the token count and multiplied
//!   by `ncall`), then optionally `i32 chunk_count, i32 len, dataset`. Each value becomes
//!   `value / ncall`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use moxie_gguf::{GgmlType, GgufFile};

/// The per-tensor importance weights and where they came from.
#[derive(Debug, Default)]
pub struct Imatrix {
    /// Weight name -> `n_per_row * n_mat` weights (expert `e`'s at `e * n_per_row`).
    pub entries: BTreeMap<String, Vec<f32>>,
    /// `imatrix.datasets` (GGUF) or the trailing dataset name (legacy).
    pub datasets: Vec<String>,
    /// Chunks the matrix was computed over (0 when the file does not say).
    pub chunk_count: i64,
}

/// Reads `path` (GGUF if it starts with the GGUF magic, else the legacy format).
pub fn load(path: &Path) -> Result<Imatrix> {
    let name = path.display();
    let mut magic = [0u8; 4];
    {
        use std::io::Read;
        let mut f =
            std::fs::File::open(path).with_context(|| format!("--imatrix {name}: cannot open"))?;
        let n = f
            .read(&mut magic)
            .with_context(|| format!("--imatrix {name}: cannot read"))?;
        if n < 4 {
            bail!("--imatrix {name}: file too short to be an importance matrix");
        }
    }
    let m = if &magic == b"GGUF" {
        load_gguf(path)
    } else {
        let bytes =
            std::fs::read(path).with_context(|| format!("--imatrix {name}: cannot read"))?;
        load_legacy(&bytes)
    };
    let m = m.with_context(|| format!("--imatrix {name}"))?;
    for (k, v) in &m.entries {
        if let Some(x) = v.iter().find(|x| !x.is_finite()) {
            bail!("--imatrix {name}: entry {k} contains the non-finite value {x}");
        }
    }
    Ok(m)
}

fn load_gguf(path: &Path) -> Result<Imatrix> {
    let f = GgufFile::open(path)?;
    if f.tensors().is_empty() {
        bail!("no data (no tensors)");
    }
    let md = f.metadata();
    let has = |k: &str| md.contains_key(k);
    if !(has("imatrix.datasets") && has("imatrix.chunk_count") && has("imatrix.chunk_size")) {
        bail!(
            "missing imatrix metadata (imatrix.datasets, imatrix.chunk_count, imatrix.chunk_size)"
        );
    }
    let mut out = Imatrix {
        chunk_count: i64::from(md.require_u32("imatrix.chunk_count")?),
        ..Imatrix::default()
    };
    if let Some(arr) = md.get_array("imatrix.datasets") {
        if let Some(s) = arr.as_strings() {
            out.datasets = s.iter().map(str::to_owned).collect();
        }
    }
    let mut pairs: BTreeMap<&str, (Option<usize>, Option<usize>)> = BTreeMap::new();
    for (i, t) in f.tensors().iter().enumerate() {
        if let Some(n) = t.name.strip_suffix(".in_sum2") {
            pairs.entry(n).or_default().0 = Some(i);
        } else if let Some(n) = t.name.strip_suffix(".counts") {
            pairs.entry(n).or_default().1 = Some(i);
        }
    }
    for (name, (sums, counts)) in pairs {
        let (Some(si), Some(ci)) = (sums, counts) else {
            bail!("mismatched sums and counts for {name}");
        };
        let (st, ct) = (&f.tensors()[si], &f.tensors()[ci]);
        if st.ty != GgmlType::F32 || ct.ty != GgmlType::F32 {
            bail!("sums and counts for {name} must be F32");
        }
        let sums = f32s(f.tensor_data(st)?);
        let counts: Vec<f32> = f32s(f.tensor_data(ct)?);
        let nmat = counts.len();
        if nmat == 0 || !sums.len().is_multiple_of(nmat) {
            bail!(
                "{name}: {} sums do not split into {nmat} experts",
                sums.len()
            );
        }
        let ne0 = sums.len() / nmat;
        let mut e = vec![0f32; sums.len()];
        for (j, &c) in counts.iter().enumerate() {
            // Counts are stored as floats and rounded back to integers (std::lround).
            let count = c.round() as i64 as f32;
            for i in 0..ne0 {
                e[j * ne0 + i] = if count > 0.0 {
                    sums[j * ne0 + i] / count
                } else {
                    1.0
                };
            }
        }
        out.entries.insert(name.to_owned(), e);
    }
    Ok(out)
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A little-endian reader over the legacy file that reports truncation.
struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .with_context(|| format!("truncated at byte {} reading {what}", self.pos))?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn i32(&mut self, what: &str) -> Result<i32> {
        let s = self.take(4, what)?;
        Ok(i32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
}

fn load_legacy(bytes: &[u8]) -> Result<Imatrix> {
    let mut r = Reader { b: bytes, pos: 0 };
    let n_entries = r.i32("the entry count")?;
    if n_entries < 1 {
        bail!("no data (entry count {n_entries}; not a GGUF or legacy imatrix file?)");
    }
    let mut out = Imatrix::default();
    for i in 0..n_entries {
        let len = r.i32("an entry name length")?;
        let len = usize::try_from(len)
            .with_context(|| format!("entry {}: negative name length {len}", i + 1))?;
        let name = r.take(len, "an entry name")?;
        // C reads the name as a C string: it ends at the first NUL.
        let name = name.split(|&c| c == 0).next().unwrap_or(&[]);
        let name = String::from_utf8(name.to_vec())
            .with_context(|| format!("entry {}: name is not UTF-8", i + 1))?;
        let ncall = r.i32("a call count")?;
        let nval = r.i32("a value count")?;
        if nval < 1 {
            bail!("entry {name}: {nval} values");
        }
        let vals = f32s(r.take(nval as usize * 4, "entry values")?);
        let e = if ncall > 0 {
            vals.iter().map(|&v| v / ncall as f32).collect()
        } else {
            vals
        };
        out.entries.insert(name, e);
    }
    // Optional trailer: the chunk count and the dataset's name.
    if r.pos < bytes.len() {
        out.chunk_count = i64::from(r.i32("the chunk count")?);
        if r.pos < bytes.len() {
            let len = r.i32("the dataset name length")?;
            if len > 0 {
                let d = r.take(len as usize, "the dataset name")?;
                let d = d.split(|&c| c == 0).next().unwrap_or(&[]);
                out.datasets.push(String::from_utf8_lossy(d).into_owned());
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn legacy(entries: &[(&str, i32, &[f32])], trailer: Option<(i32, &str)>) -> Vec<u8> {
        let mut b = (entries.len() as i32).to_le_bytes().to_vec();
        for (name, ncall, vals) in entries {
            b.extend((name.len() as i32).to_le_bytes());
            b.extend(name.as_bytes());
            b.extend(ncall.to_le_bytes());
            b.extend((vals.len() as i32).to_le_bytes());
            for v in *vals {
                b.extend(v.to_le_bytes());
            }
        }
        if let Some((chunks, ds)) = trailer {
            b.extend(chunks.to_le_bytes());
            b.extend((ds.len() as i32).to_le_bytes());
            b.extend(ds.as_bytes());
        }
        b
    }

    #[test]
    fn legacy_values_are_divided_by_the_call_count() {
        let b = legacy(
            &[("a.weight", 4, &[2.0, 6.0]), ("b.weight", 0, &[3.0])],
            Some((10, "wiki.txt")),
        );
        let m = load_legacy(&b).unwrap();
        assert_eq!(m.entries["a.weight"], [0.5, 1.5]);
        assert_eq!(m.entries["b.weight"], [3.0]);
        assert_eq!(m.chunk_count, 10);
        assert_eq!(m.datasets, ["wiki.txt"]);
        let m = load_legacy(&legacy(&[("a", 1, &[1.0])], None)).unwrap();
        assert_eq!((m.chunk_count, m.datasets.len()), (0, 0));
    }

    #[test]
    fn legacy_rejects_truncation_and_bad_counts() {
        let b = legacy(&[("a.weight", 4, &[2.0, 6.0])], None);
        for cut in [0, 3, 10, b.len() - 1] {
            assert!(load_legacy(&b[..cut]).is_err(), "cut {cut}");
        }
        assert!(load_legacy(&legacy(&[], None)).is_err());
        assert!(load_legacy(&legacy(&[("a", 1, &[])], None)).is_err());
        let mut huge = legacy(&[("a", 1, &[1.0])], None);
        huge[4..8].copy_from_slice(&i32::MAX.to_le_bytes());
        assert!(load_legacy(&huge).is_err());
    }
}
