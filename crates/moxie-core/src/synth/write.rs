//! Generating the tensor data and streaming it into a GGUF file (the only part of `synth`
//! that touches `moxie-gguf`'s writer).

use std::path::{Path, PathBuf};
use std::time::Instant;

use moxie_gguf::GgufWriter;

use super::plan::{metadata, plan, PlannedTensor, TensorInit};
use super::random_blocks::{self, random_blocks};
use super::rng::{tensor_seed, Xoshiro256};
use super::{count_types, SynthReport, SynthSpec};
use crate::Result;

/// Progress of [`generate_with`], reported after every chunk of rows written.
#[derive(Clone, Copy, Debug)]
pub struct Progress<'a> {
    /// Tensor being written and its index.
    pub tensor: &'a str,
    pub index: usize,
    pub n_tensors: usize,
    /// Tensor data bytes written so far, of `total_bytes`.
    pub bytes_done: u64,
    pub total_bytes: u64,
}

/// f32 values generated per thread per chunk (16 MB).
const CHUNK_ELEMS: usize = 4 << 20;

/// Writes the model `spec` describes to `path` (via `path.partial`, renamed when complete),
/// using all available cores.
pub fn generate(spec: &SynthSpec, path: &Path) -> Result<SynthReport> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    generate_with(spec, path, threads, &mut |_| {})
}

/// [`generate`] with a thread count and a progress callback.
pub fn generate_with(
    spec: &SynthSpec,
    path: &Path,
    threads: usize,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<SynthReport> {
    let start = Instant::now();
    let tensors = plan(spec)?;
    let meta = metadata(spec)?;

    let mut w = GgufWriter::new();
    for (k, v) in meta {
        w.add(&k, v)?;
    }
    for t in &tensors {
        w.add_tensor_info(&t.name, &t.dims, t.ty)?;
    }
    let total_bytes: u64 = tensors.iter().map(PlannedTensor::n_bytes).sum();

    let partial = partial_path(path);
    let result = (|| -> Result<()> {
        let mut out = w.begin(&partial)?;
        let mut done = 0u64;
        for (index, t) in tensors.iter().enumerate() {
            write_tensor(spec.seed, t, threads.max(1), &mut |bytes| {
                out.write_tensor_chunk(&t.name, bytes)?;
                done += bytes.len() as u64;
                progress(Progress {
                    tensor: &t.name,
                    index,
                    n_tensors: tensors.len(),
                    bytes_done: done,
                    total_bytes,
                });
                Ok(())
            })?;
        }
        out.finish()?;
        std::fs::rename(&partial, path)?;
        Ok(())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }

    Ok(SynthReport {
        path: path.to_owned(),
        bytes: std::fs::metadata(path)?.len(),
        tensor_bytes: total_bytes,
        n_params: tensors.iter().map(PlannedTensor::n_elements).sum(),
        n_tensors: tensors.len(),
        file_type: spec.ty.file_type(),
        tensor_types: count_types(tensors.iter().map(|t| t.ty)),
        seconds: start.elapsed().as_secs_f64(),
    })
}

fn partial_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".partial");
    PathBuf::from(s)
}

/// Generates rows `rows` of tensor `t` into `out` (`rows.len() * row_bytes` bytes), using
/// `f32` scratch space `buf` of one row: a Normal draw quantized to the tensor's type, or for
/// the types moxie has no quantizer for, random blocks with the draw's spread
/// ([`super::random_blocks`]).
fn fill_rows(
    t: &PlannedTensor,
    seed: u64,
    rows: std::ops::Range<u64>,
    buf: &mut [f32],
    out: &mut [u8],
) {
    let row_bytes = t.row_bytes() as usize;
    if random_blocks(t.ty) {
        let TensorInit::Normal { std } = t.init else {
            unreachable!("checked by plan()")
        };
        for (r, dst) in rows.zip(out.chunks_exact_mut(row_bytes)) {
            let mut rng = Xoshiro256::for_row(seed, r);
            random_blocks::fill_row(t.ty, &mut rng, std, dst, buf);
        }
        return;
    }
    let quantize = moxie_quant::quantize_weights_fn(t.ty).expect("checked by plan()");
    for (r, dst) in rows.zip(out.chunks_exact_mut(row_bytes)) {
        let mut rng = Xoshiro256::for_row(seed, r);
        rng.fill_normal(buf);
        match t.init {
            TensorInit::Normal { std } => buf.iter_mut().for_each(|x| *x *= std),
            TensorInit::OnePlusNormal { std } => buf.iter_mut().for_each(|x| *x = 1.0 + *x * std),
        }
        t.rule.apply(r, buf);
        quantize(buf, dst);
    }
}

/// Generates and quantizes tensor `t` chunk by chunk (each chunk split across `threads`),
/// handing the bytes of each chunk, in order, to `sink`.
fn write_tensor(
    model_seed: u64,
    t: &PlannedTensor,
    threads: usize,
    sink: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let seed = tensor_seed(model_seed, &t.name);
    let row_len = t.row_len() as usize;
    let row_bytes = t.row_bytes() as usize;
    let n_rows = t.n_rows();
    let rows_per_thread = (CHUNK_ELEMS / row_len.max(1)).max(1) as u64;
    // Small tensors on one thread: spawning costs more than generating them.
    let threads = if n_rows * row_len as u64 <= 1 << 16 {
        1
    } else {
        threads
    };
    let rows_per_chunk = rows_per_thread * threads as u64;
    let mut out = vec![0u8; (rows_per_chunk.min(n_rows) as usize) * row_bytes];
    let mut r0 = 0u64;
    while r0 < n_rows {
        let n = rows_per_chunk.min(n_rows - r0);
        let bytes = &mut out[..n as usize * row_bytes];
        let per = n.div_ceil(threads as u64);
        if threads == 1 || n <= 1 {
            let mut buf = vec![0f32; row_len];
            fill_rows(t, seed, r0..r0 + n, &mut buf, bytes);
        } else {
            std::thread::scope(|s| {
                for (k, part) in bytes.chunks_mut(per as usize * row_bytes).enumerate() {
                    let first = r0 + k as u64 * per;
                    let count = (part.len() / row_bytes) as u64;
                    s.spawn(move || {
                        let mut buf = vec![0f32; row_len];
                        fill_rows(t, seed, first..first + count, &mut buf, part);
                    });
                }
            });
        }
        sink(bytes)?;
        r0 += n;
    }
    Ok(())
}
