//! NPY v1.0 float32 arrays (the format of llama.cpp-derived golden logits and of
//! `moxie logits --out`).

use std::io::Write;
use std::path::Path;

use crate::{Error, Result};

/// Write a C-order little-endian f32 array of `shape`.
pub fn write_f32(path: &Path, shape: &[usize], data: &[f32]) -> Result<()> {
    let mut w = NpyWriter::create(path, shape)?;
    w.write(data)?;
    w.finish()
}

/// The NPY v1.0 header of a C-order little-endian f32 array of `shape`, padded so that the
/// data starts at a multiple of 64 bytes.
fn header(shape: &[usize]) -> Result<Vec<u8>> {
    let dims = match shape.len() {
        1 => format!("({},)", shape[0]),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut text = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {dims}, }}");
    let total = 10 + text.len() + 1;
    text.push_str(&" ".repeat((64 - total % 64) % 64));
    text.push('\n');
    let len = u16::try_from(text.len())
        .map_err(|_| Error::Model(format!("npy: shape {shape:?} has too many dimensions")))?;
    let mut out = Vec::with_capacity(10 + text.len());
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    Ok(out)
}

/// An f32 array written to a file piece by piece (for arrays larger than memory, e.g. a
/// dequantized expert tensor); [`NpyWriter::finish`] checks that exactly the shape's values
/// were written.
pub struct NpyWriter {
    out: std::io::BufWriter<std::fs::File>,
    path: std::path::PathBuf,
    expected: u64,
    written: u64,
}

impl NpyWriter {
    /// Create `path` and write the header of an array of `shape`.
    pub fn create(path: &Path, shape: &[usize]) -> Result<NpyWriter> {
        let expected = shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d as u64))
            .ok_or_else(|| Error::Model(format!("npy: shape {shape:?} overflows")))?;
        let header = header(shape)?;
        let file = std::fs::File::create(path)
            .map_err(|e| Error::Model(format!("cannot create {}: {e}", path.display())))?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
        out.write_all(&header)?;
        Ok(NpyWriter {
            out,
            path: path.to_path_buf(),
            expected,
            written: 0,
        })
    }

    /// Append values in C order.
    pub fn write(&mut self, data: &[f32]) -> Result<()> {
        self.written += data.len() as u64;
        if self.written > self.expected {
            return Err(Error::Model(format!(
                "npy {}: more values than the shape holds ({})",
                self.path.display(),
                self.expected
            )));
        }
        // Straight into the buffered writer: no array of bytes per call (`moxie inspect
        // --dump` writes row by row).
        for v in data {
            self.out.write_all(&v.to_le_bytes())?;
        }
        Ok(())
    }

    /// Flush, after checking that the whole array was written.
    pub fn finish(mut self) -> Result<()> {
        if self.written != self.expected {
            return Err(Error::Model(format!(
                "npy {}: the shape holds {} values, {} given",
                self.path.display(),
                self.expected,
                self.written
            )));
        }
        self.out.flush()?;
        Ok(())
    }
}

/// Read a C-order little-endian f32 array: (shape, values).
pub fn read_f32(path: &Path) -> Result<(Vec<usize>, Vec<f32>)> {
    let b = std::fs::read(path)?;
    let bad = |what: &str| {
        Error::Model(format!(
            "{}: not a float32 NPY v1 file: {what}",
            path.display()
        ))
    };
    if b.len() < 10 || &b[..6] != b"\x93NUMPY" || b[6] != 1 {
        return Err(bad("bad magic or version"));
    }
    let h = u16::from_le_bytes([b[8], b[9]]) as usize;
    let hdr = b
        .get(10..10 + h)
        .and_then(|s| std::str::from_utf8(s).ok())
        .ok_or_else(|| bad("truncated header"))?;
    if !hdr.contains("'descr': '<f4'") || !hdr.contains("'fortran_order': False") {
        return Err(bad("dtype must be <f4, C order"));
    }
    let open = hdr.find('(').ok_or_else(|| bad("no shape"))?;
    let close = hdr[open..].find(')').ok_or_else(|| bad("no shape"))? + open;
    let shape: Vec<usize> = hdr[open + 1..close]
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|_| bad("bad shape")))
        .collect::<Result<_>>()?;
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| bad("shape overflows"))?;
    let data = &b[10 + h..];
    if data.len() != n * 4 {
        return Err(bad("data length does not match the shape"));
    }
    let vals = data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok((shape, vals))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let dir = std::env::temp_dir().join(format!("moxie-npy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("a.npy");
        let data: Vec<f32> = (0..12).map(|i| i as f32 * 0.5).collect();
        write_f32(&p, &[3, 4], &data).unwrap();
        let (shape, back) = read_f32(&p).unwrap();
        assert_eq!(shape, vec![3, 4]);
        assert_eq!(back, data);
        let raw = std::fs::read(&p).unwrap();
        assert_eq!((raw.len() - 12 * 4) % 64, 0);
        assert!(write_f32(&p, &[5], &data).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
