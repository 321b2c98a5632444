//! Weight tensors (zero-copy views of the GGUF mapping) and the matrix-vector products of the
//! forward pass.
//!
//! Numerics follow ggml's CPU `mul_mat`: each activation row is converted once to the weight
//! type's dot-product partner (`vec_dot_type`: F32, F16, Q8_0, Q8_1 or Q8_K) and every output
//! element is one `vec_dot` of a weight row against it.

use std::ops::Range;
use std::sync::{Arc, OnceLock};

use moxie_gguf::GgufFile;
use moxie_quant::repack::{self, REPACK_ROWS};
use moxie_quant::{GgmlType, VecDotFn};

use crate::device::{DeviceId, Devices, Reservation, CPU};
use crate::parallel::{Numerics, Parallel};
use crate::scratch::{self, Buf};
use crate::{Error, Result};

/// Where a tensor's bytes live.
#[derive(Clone)]
enum Storage {
    /// A tensor of a mapped GGUF file (no copy).
    Mapped { file: Arc<GgufFile>, index: usize },
    /// Bytes owned by moxie (synthetic or converted tensors).
    Owned(Arc<Vec<u8>>),
    /// A copy in an accelerator's memory, held against its budget.
    OnDevice(Arc<(Vec<u8>, Reservation)>),
    /// A copy in a GPU's memory; the host bytes it came from stay readable (a mapping costs
    /// no RAM of its own).
    OnGpu(Arc<GpuCopy>),
}

struct GpuCopy {
    host: Storage,
    buf: moxie_gpu::Buffer,
    _held: Reservation,
}

/// A weight tensor: type, shape in ggml order (`ne[0]` is the row length) and its bytes.
#[derive(Clone)]
pub struct Tensor {
    pub name: String,
    pub ty: GgmlType,
    pub ne: [usize; 4],
    /// Where the bytes live ([`CPU`] unless placed elsewhere).
    pub device: DeviceId,
    storage: Storage,
    /// The rows are interleaved 16 at a time ([`Tensor::interleaved`]), not in GGUF order.
    interleaved: bool,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({} {} {:?})", self.name, self.ty, self.ne)
    }
}

impl Tensor {
    /// A tensor of `file`, by its index in `file.tensors()`. Checks that the bytes are present.
    pub fn mapped(file: &Arc<GgufFile>, index: usize) -> Result<Tensor> {
        let info = file
            .tensors()
            .get(index)
            .ok_or_else(|| Error::Model(format!("tensor index {index} out of range")))?;
        if info.dims.len() > 4 {
            return Err(Error::Model(format!(
                "tensor '{}' has {} dimensions, at most 4 are supported",
                info.name,
                info.dims.len()
            )));
        }
        let mut ne = [1usize; 4];
        for (i, &d) in info.dims.iter().enumerate() {
            ne[i] = usize::try_from(d)
                .map_err(|_| Error::Model(format!("tensor '{}' is too large", info.name)))?;
        }
        file.tensor_data(info)?;
        Ok(Tensor {
            name: info.name.clone(),
            ty: info.ty,
            ne,
            device: CPU,
            storage: Storage::Mapped {
                file: Arc::clone(file),
                index,
            },
            // Files written by `moxie quantize --repack` store some matrices interleaved.
            interleaved: info.interleaved,
        })
    }

    /// A tensor over bytes moxie owns. `data` must hold exactly the tensor's bytes.
    pub fn owned(name: &str, ty: GgmlType, ne: [usize; 4], data: Vec<u8>) -> Result<Tensor> {
        let rb = ty
            .row_bytes(ne[0] as u64)
            .ok_or_else(|| Error::Model(format!("tensor '{name}': bad row length {}", ne[0])))?;
        let want = rb as usize * ne[1] * ne[2] * ne[3];
        if data.len() != want {
            return Err(Error::Model(format!(
                "tensor '{name}': {} bytes given, {want} expected",
                data.len()
            )));
        }
        Ok(Tensor {
            name: name.to_string(),
            ty,
            ne,
            device: CPU,
            storage: Storage::Owned(Arc::new(data)),
            interleaved: false,
        })
    }

    /// This tensor copied into device `to`'s memory (an upload, counted; fails if the device's
    /// budget cannot hold it). Placing it on the CPU keeps the mapped bytes.
    pub fn to_device(&self, devices: &Devices, to: DeviceId) -> Result<Tensor> {
        if to == self.device {
            return Ok(self.clone());
        }
        if to == CPU {
            return Err(Error::Model(format!(
                "tensor '{}': moving weights back to the host is not supported",
                self.name
            )));
        }
        let bytes = self.data();
        let held = devices.reserve(to, bytes.len() as u64, &format!("tensor '{}'", self.name))?;
        devices.count_copy(CPU, to, bytes.len());
        if let Some(gpu) = devices.gpu(to) {
            // GPU kernels read rows in GGUF order; the host bytes (and `interleaved`) stay as
            // they are, so host reads keep working without a second copy in RAM.
            let bytes = self.gguf_order_bytes();
            if !moxie_gpu::Gpu::supports(self.ty) {
                return Err(Error::Model(format!(
                    "tensor '{}': {} weights cannot go on {} (no GPU kernels for that type); \
                     keep it on the CPU with -ot",
                    self.name,
                    self.ty,
                    gpu.name()
                )));
            }
            let buf = moxie_gpu::Buffer::from_bytes(gpu.backend(), &bytes)?;
            return Ok(Tensor {
                device: to,
                storage: Storage::OnGpu(Arc::new(GpuCopy {
                    host: self.storage.clone(),
                    buf,
                    _held: held,
                })),
                ..self.clone()
            });
        }
        Ok(Tensor {
            device: to,
            storage: Storage::OnDevice(Arc::new((bytes.to_vec(), held))),
            ..self.clone()
        })
    }

    /// The file and tensor index of a tensor the CPU reads from the file's mapping (not
    /// copied, repacked or placed on a device).
    pub fn mapped_on_host(&self) -> Option<(&Arc<GgufFile>, usize)> {
        match &self.storage {
            Storage::Mapped { file, index } if self.device == CPU => Some((file, *index)),
            _ => None,
        }
    }

    /// Whether the CPU reads this tensor from bytes moxie owns (read in by `--no-mmap`,
    /// repacked or converted), not from the file's mapping or a device.
    pub fn owned_on_host(&self) -> bool {
        matches!(self.storage, Storage::Owned(_)) && self.device == CPU
    }

    /// The tensor's bytes (on the host: for a GPU tensor, the bytes it was uploaded from).
    pub fn data(&self) -> &[u8] {
        Self::bytes_of(&self.storage)
    }

    fn bytes_of(storage: &Storage) -> &[u8] {
        match storage {
            Storage::Mapped { file, index } => file
                .tensor_data_at(*index)
                .and_then(|r| r.ok())
                .expect("tensor data was checked when the tensor was created"),
            Storage::Owned(v) => v,
            Storage::OnDevice(d) => &d.0,
            Storage::OnGpu(g) => Self::bytes_of(&g.host),
        }
    }

    /// The tensor's host bytes with rows in GGUF order: [`Tensor::data`], or for an
    /// interleaved tensor a copy with its groups put back (for GPU uploads, whose kernels
    /// read GGUF rows).
    pub fn gguf_order_bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        let data = self.data();
        if !self.interleaved {
            return std::borrow::Cow::Borrowed(data);
        }
        let mut plain = vec![0u8; data.len()];
        let n_rows = self.ne[1] * self.ne[2] * self.ne[3];
        repack::unrepack(self.ty, data, n_rows, self.ne[0], &mut plain);
        std::borrow::Cow::Owned(plain)
    }

    /// Matrix `i` (of a 3-D tensor: expert `i`) in GGUF row order: borrowed, or un-interleaved
    /// from a repacked copy (matrices hold whole groups of interleaved rows).
    pub fn matrix_gguf_bytes(&self, i: usize) -> std::borrow::Cow<'_, [u8]> {
        self.matrices_gguf_bytes(i, 1)
    }

    /// Matrices `i..i + count` (experts), back to back, in GGUF row order.
    pub fn matrices_gguf_bytes(&self, i: usize, count: usize) -> std::borrow::Cow<'_, [u8]> {
        let mat = self.row_bytes() * self.ne[1];
        let data = &self.data()[i * mat..(i + count) * mat];
        if !self.interleaved {
            return std::borrow::Cow::Borrowed(data);
        }
        let mut plain = vec![0u8; data.len()];
        repack::unrepack(self.ty, data, self.ne[1] * count, self.ne[0], &mut plain);
        std::borrow::Cow::Owned(plain)
    }

    /// The tensor as a GPU kernel's weight operand, if it is in a GPU's memory.
    pub fn gpu_weight(&self) -> Option<moxie_gpu::Weight> {
        match &self.storage {
            Storage::OnGpu(g) => Some(self.weight_at(g.buf.ptr())),
            _ => None,
        }
    }

    /// This tensor's shape and type as a GPU weight operand whose bytes are at `ptr` (its own
    /// copy, or one streamed into a work buffer).
    pub fn weight_at(&self, ptr: moxie_gpu::DevPtr) -> moxie_gpu::Weight {
        moxie_gpu::Weight {
            ptr,
            ty: self.ty,
            n_in: self.ne[0],
            n_out: self.ne[1],
            n_mat: self.ne[2] * self.ne[3],
        }
    }

    pub fn n_elements(&self) -> usize {
        self.ne.iter().product()
    }

    /// Bytes of one row of `ne[0]` elements.
    pub fn row_bytes(&self) -> usize {
        self.ty.row_bytes(self.ne[0] as u64).unwrap_or(0) as usize
    }

    /// The whole tensor as f32 (for small tensors: norms, biases).
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let mut out = vec![0f32; self.n_elements()];
        self.to_f32_into(&mut out)?;
        Ok(out)
    }

    /// Every value as f32 into `out` (`n_elements` long), in GGUF row order: one conversion
    /// of the whole tensor (an interleaved one is put back in order first).
    pub fn to_f32_into(&self, out: &mut [f32]) -> Result<()> {
        if out.len() != self.n_elements() {
            return Err(Error::Model(format!(
                "tensor '{}': {} values into {}",
                self.name,
                self.n_elements(),
                out.len()
            )));
        }
        moxie_quant::dequantize_row(self.ty, &self.gguf_order_bytes(), out)
            .map_err(|e| Error::Model(format!("tensor '{}': {e}", self.name)))
    }

    /// Dequantize row `r` (counting rows over all of ne[1..]) into `out` (`ne[0]` long).
    pub fn row_to_f32(&self, r: usize, out: &mut [f32]) -> Result<()> {
        let rb = self.row_bytes();
        let out_of_range = || Error::Model(format!("tensor '{}': row {r} out of range", self.name));
        let unpacked;
        let bytes = if self.interleaved {
            let g = r / REPACK_ROWS;
            let group = self
                .data()
                .get(g * REPACK_ROWS * rb..(g + 1) * REPACK_ROWS * rb)
                .ok_or_else(out_of_range)?;
            let mut plain = vec![0u8; group.len()];
            repack::unrepack(self.ty, group, REPACK_ROWS, self.ne[0], &mut plain);
            unpacked = plain;
            &unpacked[r % REPACK_ROWS * rb..][..rb]
        } else {
            self.data()
                .get(r * rb..(r + 1) * rb)
                .ok_or_else(out_of_range)?
        };
        moxie_quant::dequantize_row(self.ty, bytes, out)
            .map_err(|e| Error::Model(format!("tensor '{}': {e}", self.name)))
    }

    /// Whether the rows are interleaved ([`Tensor::interleaved`]).
    pub fn is_interleaved(&self) -> bool {
        self.interleaved
    }

    /// A copy of this host tensor with its rows interleaved 16 at a time
    /// (`moxie_quant::repack`), the layout of moxie's fastest one-token kernels; `None` where
    /// the type or shape has no such layout ([`repack::repack_supports`]). The copy has the
    /// same size; a mapped source's pages are released from this process afterwards, so the model's resident memory does not double. Products with an
    /// interleaved matrix are the same numbers in [`Numerics::Exact`] (its rows are put back
    /// in GGUF order first) and agree to float rounding in [`Numerics::Fast`].
    pub fn interleaved(&self, par: &Parallel) -> Option<Tensor> {
        // Whole groups per matrix, so no group straddles two experts or heads.
        let fits = repack::repack_supports(self.ty, self.ne[1], self.ne[0]);
        if self.interleaved || !fits {
            return None;
        }
        self.relaid(par, true)
    }

    /// The inverse of [`Tensor::interleaved`]: a copy of this interleaved host tensor with its
    /// rows back in GGUF order (`--no-repack` or `--exact` on a file written interleaved, and
    /// host experts that are streamed to a GPU); `None` when the rows are already in GGUF
    /// order. A mapped source's pages are released afterwards, as there.
    pub fn in_gguf_order(&self, par: &Parallel) -> Option<Tensor> {
        if !self.interleaved {
            return None;
        }
        self.relaid(par, false)
    }

    /// A host copy of this tensor with its rows interleaved (`to_interleaved`) or put back in
    /// GGUF order, made on `par` a run of groups per work item; a mapped source's pages are
    /// released afterwards. `None` for a tensor not in host memory.
    fn relaid(&self, par: &Parallel, to_interleaved: bool) -> Option<Tensor> {
        if self.device != CPU {
            return None;
        }
        let (src, released) = match &self.storage {
            Storage::Mapped { file, index } => (self.data(), Some((file, *index))),
            Storage::Owned(v) => (&v[..], None),
            _ => return None,
        };
        let mut data = vec![0u8; src.len()];
        // Whole groups per thread: a 300 GB model is mostly this copy.
        let group = REPACK_ROWS * self.row_bytes();
        par.for_each_range(src.len() / group, group, &mut data, group, |groups, to| {
            let from = &src[groups.start * group..groups.end * group];
            let n_rows = groups.len() * REPACK_ROWS;
            if to_interleaved {
                repack::repack(self.ty, from, n_rows, self.ne[0], to);
            } else {
                repack::unrepack(self.ty, from, n_rows, self.ne[0], to);
            }
        });
        if let Some((file, index)) = released {
            file.release_tensor_pages(index);
        }
        Some(Tensor {
            storage: Storage::Owned(Arc::new(data)),
            interleaved: to_interleaved,
            ..self.clone()
        })
    }

    /// A host tensor still mapped from its file gets its bytes copied into memory moxie owns
    /// (`--no-mmap`) and the file's pages released; `copies` shares one copy between tensors
    /// of the same file tensor (a tied output head). Returns the bytes copied (0 when
    /// `copies` already had them), `None` for a tensor that was not mapped on the host.
    pub fn own_mapped_bytes(
        &mut self,
        copies: &mut std::collections::HashMap<usize, Arc<Vec<u8>>>,
    ) -> Option<u64> {
        let Storage::Mapped { file, index } = &self.storage else {
            return None;
        };
        if self.device != CPU {
            return None;
        }
        let (file, index) = (Arc::clone(file), *index);
        let mut copied = 0;
        let bytes = copies.entry(index).or_insert_with(|| {
            let v = self.data().to_vec();
            copied = v.len() as u64;
            file.release_tensor_pages(index);
            Arc::new(v)
        });
        self.storage = Storage::Owned(Arc::clone(bytes));
        Some(copied)
    }

    /// The whole tensor as one matrix of `ne[1]*ne[2]*ne[3]` rows.
    pub fn matrix(&self) -> Result<Mat<'_>> {
        Mat::new(self, 0, self.ne[1] * self.ne[2] * self.ne[3])
    }

    /// Matrix `i` of a 3-D tensor (an expert of `*_exps`, a head of `attn_k_b`).
    pub fn slice(&self, i: usize) -> Result<Mat<'_>> {
        if i >= self.ne[2] * self.ne[3] {
            return Err(Error::Model(format!(
                "tensor '{}': matrix {i} out of range",
                self.name
            )));
        }
        Mat::new(self, i * self.ne[1], self.ne[1])
    }

    /// Check the shape against what the architecture expects (`None` = any).
    pub fn expect_shape(&self, want: &[usize]) -> Result<()> {
        let mut full = [1usize; 4];
        full[..want.len()].copy_from_slice(want);
        if full != self.ne {
            return Err(Error::Model(format!(
                "tensor '{}' has shape {:?}, expected {:?}",
                self.name, &self.ne, &full
            )));
        }
        Ok(())
    }
}

/// A matrix view: `n_out` rows of `n_in` elements of one ggml type.
#[derive(Clone, Copy)]
pub struct Mat<'a> {
    pub ty: GgmlType,
    pub n_in: usize,
    pub n_out: usize,
    row_bytes: usize,
    data: &'a [u8],
    dot: VecDotFn,
    act_ty: GgmlType,
    /// Rows interleaved 16 at a time ([`Tensor::interleaved`]).
    interleaved: bool,
}

impl<'a> Mat<'a> {
    fn new(t: &'a Tensor, first_row: usize, n_rows: usize) -> Result<Mat<'a>> {
        let rb = t.row_bytes();
        let data = t
            .data()
            .get(first_row * rb..(first_row + n_rows) * rb)
            .ok_or_else(|| Error::Model(format!("tensor '{}': rows out of range", t.name)))?;
        let unsupported = || {
            Error::Model(format!(
                "tensor '{}' has type {}, which moxie cannot multiply yet",
                t.name, t.ty
            ))
        };
        let act_ty = moxie_quant::vec_dot_type(t.ty).ok_or_else(unsupported)?;
        let dot = moxie_quant::vec_dot_fn(t.ty).ok_or_else(unsupported)?;
        Ok(Mat {
            ty: t.ty,
            n_in: t.ne[0],
            n_out: n_rows,
            row_bytes: rb,
            data,
            dot,
            act_ty,
            interleaved: t.interleaved,
        })
    }

    /// The activation type this matrix's dot product consumes.
    pub fn act_type(&self) -> GgmlType {
        self.act_ty
    }

    /// Rows `[first, first + n)` as a smaller matrix (of an interleaved matrix: whole groups
    /// of 16 rows).
    pub fn rows(&self, first: usize, n: usize) -> Mat<'a> {
        assert!(
            !self.interleaved
                || (first.is_multiple_of(REPACK_ROWS) && n.is_multiple_of(REPACK_ROWS)),
            "rows of an interleaved matrix come in groups of {REPACK_ROWS}"
        );
        let mut m = *self;
        m.data = &self.data[first * self.row_bytes..(first + n) * self.row_bytes];
        m.n_out = n;
        m
    }

    /// `out[t][r] = W[r] · x[t]` for `n_tok` rows of `x`, quantizing `x` first
    /// (ggml `mul_mat` semantics; see [`Mat::matmul_q`]).
    pub fn matmul(&self, par: &Parallel, x: &[f32], out: &mut [f32]) {
        let acts = QuantizedActs::new(par, self.act_ty, self.n_in, x);
        self.matmul_q(par, &acts, out);
    }

    /// Like [`Mat::matmul`] with activations already converted to [`Mat::act_type`] (so that
    /// several matrices reading the same input convert it once). Follows ggml's `mul_mat`: from
    /// 8 rows on llama.cpp runs K-quant / IQ weights through its tiled matmul, and for two
    /// or more rows F32/F16/Q8_0/Q4_0/Q5_0/IQ4_NL weights through llamafile's tinyBLAS; both
    /// sum in an order that differs from `vec_dot`'s.
    pub fn matmul_q(&self, par: &Parallel, acts: &QuantizedActs, out: &mut [f32]) {
        self.run(
            par,
            acts,
            out,
            self.mul_mat_kernel(par, acts.n_rows(), false),
        );
    }

    /// The kernel [`Mat::matmul_q`] uses for `n` activation rows. `permuted_input`: ggml holds
    /// the input as a permuted (non-contiguous) view, e.g. MLA's per-head `q_nope`; llamafile's
    /// batched kernel only sees it after conversion to the dot-product type, which never
    /// happens for f32 weights, so those keep `vec_dot` order.
    pub(crate) fn mul_mat_kernel(&self, par: &Parallel, n: usize, permuted_input: bool) -> Kernel {
        let tinyblas =
            n >= 2 && self.n_out.is_multiple_of(4) && !(permuted_input && self.ty == GgmlType::F32);
        self.mul_mat_kernel_with(par, n, tinyblas)
    }

    /// The kernel ggml's `mul_mat_id` uses for one expert with `n` routed rows (routed
    /// experts): the tiled K-quant order when at least 8 rows are routed to it, else
    /// `vec_dot`'s.
    pub(crate) fn id_kernel(&self, par: &Parallel, n: usize) -> Kernel {
        if let Some(k) = self.fast_kernel(par, n) {
            k
        } else if moxie_quant::tiled_used_for_mul_mat_id(self.ty, n) {
            moxie_quant::tiled_dot_many_fn(self.ty, self.n_in)
                .map_or(Kernel::Dot(self.dot), Kernel::Many)
        } else {
            Kernel::Dot(self.dot)
        }
    }

    /// Output rows `rows` for every row of `acts` with `kernel`, in [`TILE`]-row runs: the
    /// chunk's rows are cut in runs of 16 from `rows.start` (the last may be shorter, `w`
    /// wide), and run `k` holds `n_tok` token rows of `w` results:
    /// `out[16k * n_tok + t * w + i] = W[rows.start + 16k + i] · x[t]`. That is the int8
    /// GEMM's own output order, so it writes `out` directly; with one token it is plain row
    /// order. For the int8 GEMM `rows` must start on a [`CHUNK_ROWS`] boundary and span at
    /// most one chunk. `scratch` is reused between calls. Each value is what [`Mat::run`]
    /// computes for it with the same kernel.
    pub(crate) fn rows_times(
        &self,
        kernel: Kernel,
        acts: &QuantizedActs,
        rows: Range<usize>,
        out: &mut [f32],
        scratch: &mut Vec<f32>,
    ) {
        if self.interleaved && !matches!(kernel, Kernel::Int8Gemm) {
            return self.interleaved_rows_times(kernel, acts, rows, out, scratch);
        }
        let n_tok = acts.n_rows();
        let len = rows.len();
        debug_assert_eq!(out.len(), n_tok * len);
        let at = |i: usize, t: usize| tile_order(i, t, len, n_tok);
        match kernel {
            Kernel::Dot(dot) if n_tok == 1 => self.dot_rows(dot, rows, acts.row(0), out),
            Kernel::Dot(dot) => {
                for t in 0..n_tok {
                    let a = acts.row(t);
                    for (i, r) in rows.clone().enumerate() {
                        out[at(i, t)] = dot(self.n_in, self.row(r), a);
                    }
                }
            }
            Kernel::Many(many) => {
                scratch.resize(n_tok, 0.0);
                for (i, r) in rows.enumerate() {
                    many(self.n_in, self.row(r), &acts.data, acts.row_bytes, scratch);
                    for (t, &v) in scratch.iter().enumerate() {
                        out[at(i, t)] = v;
                    }
                }
            }
            Kernel::Tiles(dot, tile_fn) => {
                let (rb, ab) = (self.row_bytes, acts.row_bytes);
                let (tiled_rows, tiled_toks) = (len / 4 * 4, n_tok / 4 * 4);
                let mut tile = [[0f32; 4]; 4];
                // Four tokens (in L1) against every four rows of the run (in L2).
                for t0 in (0..tiled_toks).step_by(4) {
                    for i0 in (0..tiled_rows).step_by(4) {
                        tile_fn(
                            self.n_in,
                            &self.data[(rows.start + i0) * rb..],
                            rb,
                            &acts.data[t0 * ab..],
                            ab,
                            &mut tile,
                        );
                        for (i, vals) in tile.iter().enumerate() {
                            for (j, &v) in vals.iter().enumerate() {
                                out[at(i0 + i, t0 + j)] = v;
                            }
                        }
                    }
                }
                // The rows and tokens left over, one dot each.
                for t in 0..n_tok {
                    let a = acts.row(t);
                    for (i, r) in rows.clone().enumerate() {
                        if t >= tiled_toks || i >= tiled_rows {
                            out[at(i, t)] = dot(self.n_in, self.row(r), a);
                        }
                    }
                }
            }
            Kernel::Interleaved => unreachable!("only interleaved matrices get this kernel"),
            Kernel::Int8Gemm => {
                debug_assert!(rows.start.is_multiple_of(CHUNK_ROWS) && len <= CHUNK_ROWS);
                let data = &self.data[rows.start * self.row_bytes..rows.end * self.row_bytes];
                // The next chunk of this matrix is usually what this thread computes next.
                let next_end = (rows.end + CHUNK_ROWS).min(self.n_out);
                let next = &self.data[rows.end * self.row_bytes..next_end * self.row_bytes];
                // An interleaved matrix's groups lie where their rows would: the same bytes.
                let gemm_q8 = if self.interleaved {
                    moxie_quant::gemm_q8_interleaved
                } else {
                    moxie_quant::gemm_q8
                };
                let gemm = |o: &mut [f32]| {
                    let done = gemm_q8(self.ty, self.n_in, data, acts.gemm_acts(), o, next);
                    debug_assert!(done, "fast_kernel checked the int8 GEMM applies");
                };
                if len.is_multiple_of(TILE) {
                    gemm(out);
                    return;
                }
                // A short last run: the GEMM pads it to 16 rows per token.
                let full = len / TILE * TILE * n_tok;
                scratch.resize(len.div_ceil(TILE) * TILE * n_tok, 0.0);
                gemm(scratch);
                out[..full].copy_from_slice(&scratch[..full]);
                let w = len % TILE;
                for (o, v) in out[full..]
                    .chunks_exact_mut(w)
                    .zip(scratch[full..].chunks_exact(TILE))
                {
                    o.copy_from_slice(&v[..w]);
                }
            }
        }
    }

    fn fast_kernel(&self, par: &Parallel, n_tok: usize) -> Option<Kernel> {
        if par.numerics() != Numerics::Fast {
            return None;
        }
        if n_tok >= GEMM_MIN_TOKENS
            && moxie_quant::gemm_available()
            && moxie_quant::gemm_supports(self.ty, self.n_in)
        {
            return Some(Kernel::Int8Gemm);
        }
        self.interleaved.then_some(Kernel::Interleaved)
    }

    /// The bytes of row group `g` of an interleaved matrix.
    fn group(&self, g: usize) -> &'a [u8] {
        let b = REPACK_ROWS * self.row_bytes;
        &self.data[g * b..(g + 1) * b]
    }

    /// [`Mat::rows_times`] of an interleaved matrix for the kernels other than the int8 GEMM
    /// (which reads the groups itself): [`Kernel::Interleaved`] runs the interleaved kernel on
    /// every group the rows touch; ggml's kernels get the groups put back in GGUF order (a
    /// per-thread buffer) and run as on a plain matrix, so exact numerics see ggml's bytes and
    /// order.
    fn interleaved_rows_times(
        &self,
        kernel: Kernel,
        acts: &QuantizedActs,
        rows: Range<usize>,
        out: &mut [f32],
        scratch: &mut Vec<f32>,
    ) {
        let n_tok = acts.n_rows();
        let len = rows.len();
        let groups = rows.start / REPACK_ROWS..rows.end.div_ceil(REPACK_ROWS);
        if let Kernel::Interleaved = kernel {
            if n_tok == 1 {
                return self.interleaved_gemv(true, rows, acts.row(0), out);
            }
            scratch.resize(len, 0.0);
            for t in 0..n_tok {
                self.interleaved_gemv(true, rows.clone(), acts.row(t), scratch);
                for (i, &v) in scratch.iter().enumerate() {
                    out[tile_order(i, t, len, n_tok)] = v;
                }
            }
            return;
        }
        PLAIN_ROWS.with_borrow_mut(|buf| {
            let gb = REPACK_ROWS * self.row_bytes;
            buf.resize(groups.len() * gb, 0);
            for (g, dst) in groups.clone().zip(buf.chunks_exact_mut(gb)) {
                repack::unrepack(self.ty, self.group(g), REPACK_ROWS, self.n_in, dst);
            }
            let first = groups.start * REPACK_ROWS;
            let plain = Mat {
                data: &buf[..],
                n_out: groups.len() * REPACK_ROWS,
                interleaved: false,
                ..*self
            };
            plain.rows_times(
                kernel,
                acts,
                rows.start - first..rows.end - first,
                out,
                scratch,
            );
        });
    }

    /// The kernel for `mul_mat` over `n_rows` activation rows: the fast int8 GEMM where it
    /// applies, else ggml's choice: the tiled K-quant path when it is eligible (checked first,
    /// as ggml does), else tinyBLAS when `tinyblas` allows it and the type has a port, else
    /// `vec_dot`.
    fn mul_mat_kernel_with(&self, par: &Parallel, n_rows: usize, tinyblas: bool) -> Kernel {
        if let Some(k) = self.fast_kernel(par, n_rows) {
            return k;
        }
        if moxie_quant::tiled_used_for_mul_mat(self.ty, n_rows) {
            if let Some(f) = moxie_quant::tiled_dot_many_fn(self.ty, self.n_in) {
                return Kernel::Many(f);
            }
        }
        if tinyblas {
            if let Some(f) = moxie_quant::tinyblas_dot_many_fn(self.ty, self.n_in) {
                return Kernel::Many(f);
            }
            if let Some(f) = moxie_quant::tinyblas_dot_fn(self.ty, self.n_in) {
                return match moxie_quant::tinyblas_dot_tile_fn(self.ty, self.n_in) {
                    Some(tile) if n_rows >= 4 => Kernel::Tiles(f, tile),
                    _ => Kernel::Dot(f),
                };
            }
        }
        Kernel::Dot(self.dot)
    }

    /// `out[i]` = row `rows.start + i` · `x` with `dot`, asking for the row
    /// [`moxie_quant::PREFETCH_AHEAD`] bytes on as each is read (one token reads its rows once,
    /// from DRAM; [`moxie_quant::prefetch`]).
    fn dot_rows(&self, dot: VecDotFn, rows: Range<usize>, x: &[u8], out: &mut [f32]) {
        let ahead = moxie_quant::PREFETCH_AHEAD.div_ceil(self.row_bytes);
        for (o, r) in out.iter_mut().zip(rows.clone()) {
            if r + ahead < rows.end {
                moxie_quant::prefetch_l2(self.row(r + ahead));
            }
            *o = dot(self.n_in, self.row(r), x);
        }
    }

    fn row(&self, r: usize) -> &[u8] {
        debug_assert!(
            !self.interleaved,
            "rows of an interleaved matrix are not contiguous"
        );
        &self.data[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// Rows `rows` of an interleaved matrix times one activation row `x`, into `out[..len]`:
    /// the interleaved kernel (`fast`), or each row's `vec_dot` on its group put back in GGUF
    /// order (bit-identical to the plain matrix).
    fn interleaved_gemv(&self, fast: bool, rows: Range<usize>, x: &[u8], out: &mut [f32]) {
        let mut res = [0f32; REPACK_ROWS];
        let rb = self.row_bytes;
        for g in rows.start / REPACK_ROWS..rows.end.div_ceil(REPACK_ROWS) {
            let first = g * REPACK_ROWS;
            let (lo, hi) = (rows.start.max(first), rows.end.min(first + REPACK_ROWS));
            if fast {
                repack::gemv(self.ty, self.n_in, self.group(g), x, &mut res);
            } else {
                PLAIN_ROWS.with_borrow_mut(|buf| {
                    buf.resize(REPACK_ROWS * rb, 0);
                    repack::unrepack(self.ty, self.group(g), REPACK_ROWS, self.n_in, buf);
                    for r in lo..hi {
                        res[r - first] = (self.dot)(self.n_in, &buf[(r - first) * rb..][..rb], x);
                    }
                });
            }
            for r in lo..hi {
                out[r - rows.start] = res[r - first];
            }
        }
    }

    fn run(&self, par: &Parallel, acts: &QuantizedActs, out: &mut [f32], kernel: Kernel) {
        debug_assert_eq!(acts.ty, self.act_ty);
        debug_assert_eq!(acts.n, self.n_in);
        let n_tok = acts.n_rows();
        debug_assert_eq!(out.len(), n_tok * self.n_out);
        if n_tok == 1 {
            // One token: its output row is already in row order (the int8 GEMM, which needs
            // whole chunks, is never chosen for one token).
            debug_assert!(!matches!(kernel, Kernel::Int8Gemm));
            let grain = stream_grain(self.row_bytes);
            par.for_each_piece(self.n_out, self.n_in, grain, out, 1, |rows, o| {
                self.rows_times(kernel, acts, rows, o, &mut Vec::new());
            });
            return;
        }
        // A batch: chunks of rows for every token, then back to token-major order in
        // parallel (a large batch's copy is as long as a small product).
        acts.prepare_for(kernel);
        let layout = ChunkedLayout::new(self.n_out, vec![n_tok]);
        // From the thread's pool: every value is written by its item before it is read.
        let mut chunked = crate::scratch::take(layout.len());
        layout.for_each_item(par, self.n_in, &mut chunked, |_, rows, o, [scratch, _]| {
            self.rows_times(kernel, acts, rows, o, scratch);
        });
        par.for_each_range(n_tok, self.n_out, out, self.n_out, |toks, o| {
            for (t, orow) in toks.zip(o.chunks_exact_mut(self.n_out)) {
                layout.gather(&chunked, 0, t, orow);
            }
        });
    }
}

/// One activation row against several matrices in a single parallel region: `out` receives
/// `W_0 · x_0`, then `W_1 · x_1`, ... (`n_out` values each). Decode uses it for the selected
/// experts' projections and for MLA's per-head products, where one region per matrix would
/// cost more in hand-offs than the products themselves. Each output is the matrix's `vec_dot`,
/// as [`Mat::matmul_q`] computes one row, so results are bit-identical to separate calls.
/// `x_i` is a row of [`QuantizedActs`] of `W_i`'s [`Mat::act_type`].
pub fn gemv_many(par: &Parallel, products: &[(Mat<'_>, &[u8])], out: &mut [f32]) {
    let total: usize = products.iter().map(|(m, _)| m.n_out).sum();
    assert_eq!(out.len(), total, "gemv_many: output length");
    for (m, x) in products {
        let want = m.act_ty.row_bytes(m.n_in as u64);
        assert_eq!(Some(x.len() as u64), want, "gemv_many: activation row size");
    }
    let work = products.iter().map(|(m, _)| m.n_in).max().unwrap_or(0);
    let fast = par.numerics() == Numerics::Fast;
    let row_bytes = products.iter().map(|(m, _)| m.row_bytes).max().unwrap_or(1);
    par.for_each_piece(total, work, stream_grain(row_bytes), out, 1, |range, o| {
        let mut base = 0;
        for (m, x) in products {
            let (lo, hi) = (range.start.max(base), range.end.min(base + m.n_out));
            if lo < hi && m.interleaved {
                m.interleaved_gemv(fast, lo - base..hi - base, x, &mut o[lo - range.start..]);
            } else if lo < hi {
                m.dot_rows(m.dot, lo - base..hi - base, x, &mut o[lo - range.start..]);
            }
            base += m.n_out;
        }
    });
}

/// Rows per piece of a one-token product ([`Parallel::for_each_piece`]): whole groups of
/// interleaved rows (at least one, however long a row), about [`STREAM_PIECE_BYTES`] of
/// weights.
fn stream_grain(row_bytes: usize) -> usize {
    (STREAM_PIECE_BYTES / row_bytes.max(1))
        .max(1)
        .next_multiple_of(REPACK_ROWS)
}

/// Weight bytes per piece of a one-token product: a few microseconds of streaming, so taking
/// a piece costs little against it, and a thread left waiting at the end of a region waits
/// for at most one.
const STREAM_PIECE_BYTES: usize = 64 << 10;

/// How a matrix product forms each output (see [`Mat::matmul_q`]).
#[derive(Clone, Copy)]
pub(crate) enum Kernel {
    /// One weight row against one activation row.
    Dot(VecDotFn),
    /// One weight row against all activation rows.
    Many(moxie_quant::DotManyFn),
    /// tinyBLAS's dot (given) 4 rows x 4 tokens at a time with its tile kernel
    /// ([`moxie_quant::tinyblas_dot_tile_fn`]: the same bits), single dots for the edges.
    Tiles(VecDotFn, moxie_quant::DotTileFn),
    /// 16 weight rows at a time against all activation rows, int8 on VNNI ([`Numerics::Fast`]).
    Int8Gemm,
    /// One activation row at a time against 16 interleaved weight rows
    /// ([`Tensor::interleaved`], [`Numerics::Fast`]).
    Interleaved,
}

/// Output rows per work item where products are split in chunks: two int8 GEMM tiles, which
/// its kernel runs together (each activation load feeds both).
pub(crate) const CHUNK_ROWS: usize = 2 * TILE;

/// Rows per run in the order [`Mat::rows_times`] writes (the int8 GEMM's tile height).
pub(crate) const TILE: usize = moxie_quant::GEMM_TILE_ROWS;

/// Where the results of several matrices' products (an expert's, or one matrix's with `a` = 0)
/// live in a buffer of (matrix, chunk of rows) items: matrix `a` owns
/// `start[a]..start[a + 1]`, chunk `c` of it starts `c * CHUNK_ROWS * n_tok(a)` further, and
/// holds the chunk's results in [`Mat::rows_times`]'s order (runs of 16 rows, token-major
/// within a run).
pub(crate) struct ChunkedLayout {
    /// The matrices' first row in this layout ([`ChunkedLayout::over_rows`]); 0 for all rows.
    row0: usize,
    n_rows: usize,
    n_chunks: usize,
    start: Vec<usize>,
    n_tok: Vec<usize>,
}

impl ChunkedLayout {
    pub(crate) fn new(n_rows: usize, n_tok: Vec<usize>) -> ChunkedLayout {
        ChunkedLayout::over_rows(0..n_rows, n_tok)
    }

    /// The layout of the matrices' rows `rows` only (`rows.start` a multiple of
    /// [`CHUNK_ROWS`]): [`ChunkedLayout::for_each_item`] hands out rows of the matrices, and
    /// [`ChunkedLayout::gather`] gives a token's `rows.len()` results.
    pub(crate) fn over_rows(rows: Range<usize>, n_tok: Vec<usize>) -> ChunkedLayout {
        debug_assert!(rows.start.is_multiple_of(CHUNK_ROWS));
        let n_rows = rows.len();
        let mut start = vec![0];
        for &nt in &n_tok {
            start.push(start.last().unwrap() + nt * n_rows);
        }
        ChunkedLayout {
            row0: rows.start,
            n_rows,
            n_chunks: n_rows.div_ceil(CHUNK_ROWS),
            start,
            n_tok,
        }
    }

    fn n_items(&self) -> usize {
        self.n_tok.len() * self.n_chunks
    }

    pub(crate) fn len(&self) -> usize {
        *self.start.last().unwrap()
    }

    /// Item `i` as (expert, first row, rows).
    fn item(&self, i: usize) -> (usize, usize, usize) {
        let (a, c) = (i / self.n_chunks, i % self.n_chunks);
        let r0 = c * CHUNK_ROWS;
        (a, r0, CHUNK_ROWS.min(self.n_rows - r0))
    }

    fn item_start(&self, i: usize) -> usize {
        if i == self.n_items() {
            return self.len();
        }
        let (a, r0, _) = self.item(i);
        self.start[a] + r0 * self.n_tok[a]
    }

    /// Every row's result for token `t` (the matrix's `t`-th) of matrix `a`, run by run:
    /// `f(first row, its results)`, 16 rows a run (the last may be shorter), in row order.
    pub(crate) fn for_each_run(
        &self,
        buf: &[f32],
        a: usize,
        t: usize,
        mut f: impl FnMut(usize, &[f32]),
    ) {
        let n_tok = self.n_tok[a];
        let base = self.start[a];
        let whole = self.n_rows / TILE;
        for k in 0..whole {
            let at = base + (k * n_tok + t) * TILE;
            f(k * TILE, &buf[at..at + TILE]);
        }
        let tail = self.n_rows - whole * TILE;
        if tail > 0 {
            let at = base + whole * TILE * n_tok + t * tail;
            f(whole * TILE, &buf[at..at + tail]);
        }
    }

    /// Every row's result for token `t` (the matrix's `t`-th) of matrix `a`, into `out`.
    pub(crate) fn gather(&self, buf: &[f32], a: usize, t: usize, out: &mut [f32]) {
        let n_tok = self.n_tok[a];
        let base = self.start[a];
        let mut runs = out.chunks_exact_mut(TILE);
        // Whole runs as fixed-size copies: a `memmove` call per 16 floats cost more than the
        // copy (this runs for every token row of every expert).
        for (k, dst) in runs.by_ref().enumerate() {
            let at = base + (k * n_tok + t) * TILE;
            let src: &[f32; TILE] = buf[at..at + TILE].try_into().unwrap();
            *<&mut [f32; TILE]>::try_from(dst).unwrap() = *src;
        }
        let tail = runs.into_remainder();
        if !tail.is_empty() {
            let at = base + self.n_rows / TILE * TILE * n_tok + t * tail.len();
            tail.copy_from_slice(&buf[at..at + tail.len()]);
        }
    }

    /// `f(a, rows, out, scratch)` for every item over `par`'s threads, each thread taking a
    /// run of items of about equal cost (`work` multiply-adds per row and token, plus as much
    /// per row for decoding the weights). `out` receives the item's `rows.len() * n_tok(a)`
    /// results, token-major; `scratch` is two buffers reused within a thread.
    pub(crate) fn for_each_item<F>(&self, par: &Parallel, work: usize, out: &mut [f32], f: F)
    where
        F: Fn(usize, Range<usize>, &mut [f32], &mut [Vec<f32>; 2]) + Sync,
    {
        let cost = |i: usize| {
            let (a, _, rows) = self.item(i);
            rows * work * (self.n_tok[a] + 1)
        };
        par.for_each_run(
            self.n_items(),
            cost,
            out,
            |i| self.item_start(i),
            |items, o| {
                let mut scratch = [Vec::new(), Vec::new()];
                let mut off = 0;
                for i in items {
                    let (a, r0, rows) = self.item(i);
                    let len = rows * self.n_tok[a];
                    let r0 = self.row0 + r0;
                    f(a, r0..r0 + rows, &mut o[off..off + len], &mut scratch);
                    off += len;
                }
            },
        );
    }
}

/// From this many activation rows on, [`Numerics::Fast`] uses the int8 GEMM: decoding a weight
/// tile once then costs less than `vec_dot` unpacking it per token.
const GEMM_MIN_TOKENS: usize = 4;

/// Where [`Mat::rows_times`] puts row `i` of a `len`-row chunk for token `t` of `n_tok`: runs of
/// [`TILE`] rows (the last may be shorter), token-major within a run.
fn tile_order(i: usize, t: usize, len: usize, n_tok: usize) -> usize {
    let (k, w) = (i / TILE, TILE.min(len - i / TILE * TILE));
    k * TILE * n_tok + t * w + i % TILE
}

thread_local! {
    /// Groups of an interleaved matrix put back in GGUF order, per thread.
    static PLAIN_ROWS: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Activation rows converted to a dot-product partner type. The default holds no rows (a
/// buffer for [`QuantizedActs::refill`]).
pub struct QuantizedActs {
    pub ty: GgmlType,
    /// Elements per row.
    pub n: usize,
    row_bytes: usize,
    /// From the thread's pool (`scratch`): a prompt batch converts MBs per product.
    data: Buf<u8>,
    /// The same rows prepared for the int8 GEMM, built by the first matrix that needs them
    /// and shared by the others reading these activations.
    gemm: OnceLock<moxie_quant::GemmActs>,
}

impl Default for QuantizedActs {
    fn default() -> QuantizedActs {
        QuantizedActs::from_bytes(GgmlType::F32, 1, Vec::new())
    }
}

impl QuantizedActs {
    /// Rows of `n` values each, wherever they lie (e.g. one head's strided rows of a batch),
    /// converted to `ty` in order.
    pub fn from_rows<'a>(
        ty: GgmlType,
        n: usize,
        rows: impl ExactSizeIterator<Item = &'a [f32]>,
    ) -> QuantizedActs {
        let row_bytes = ty
            .row_bytes(n as u64)
            .expect("activation row length fits the block size") as usize;
        let mut data = scratch::take_bytes(row_bytes * rows.len());
        let q = moxie_quant::quantize_fn(ty).expect("activation types can always be quantized");
        for (src, dst) in rows.zip(data.chunks_exact_mut(row_bytes)) {
            q(src, dst);
        }
        QuantizedActs::from_buf(ty, n, data)
    }

    /// Convert the rows of `x` (each `n` long) to `ty` over `par`'s threads: each thread
    /// converts parts of the rows and, where the int8 GEMM may read them (fast numerics, a
    /// batch it takes), prepares those parts for it too, so no thread waits on a serial
    /// conversion.
    pub fn new(par: &Parallel, ty: GgmlType, n: usize, x: &[f32]) -> QuantizedActs {
        let n_rows = x.len() / n;
        let row_bytes = ty
            .row_bytes(n as u64)
            .expect("activation row length fits the block size") as usize;
        let q = moxie_quant::quantize_fn(ty).expect("activation types can always be quantized");
        let mut data = scratch::take_bytes(row_bytes * n_rows);
        let mut gemm = (par.numerics() == Numerics::Fast
            && n_rows >= GEMM_MIN_TOKENS
            && moxie_quant::gemm_available())
        .then(|| moxie_quant::GemmActs::unfilled(ty, n, n_rows))
        .flatten();
        // Parts of 16 rows: a few per thread, so that a slow thread holds up little.
        const PART: usize = 16;
        let mut gemm_parts = gemm.as_mut().map(|g| g.parts(PART).into_iter());
        let mut parts: Vec<_> = x
            .chunks(PART * n)
            .zip(data.chunks_mut(PART * row_bytes))
            .map(|(x, d)| (x, d, gemm_parts.as_mut().and_then(|p| p.next())))
            .collect();
        drop(gemm_parts);
        // About 8 operations per value to quantize and sum it.
        par.for_each_range(parts.len(), 8 * PART * n, &mut parts, 1, |_, parts| {
            for (x, d, g) in parts {
                for (src, dst) in x.chunks_exact(n).zip(d.chunks_exact_mut(row_bytes)) {
                    q(src, dst);
                }
                if let Some(g) = g {
                    g.fill(d);
                }
            }
        });
        drop(parts);
        let acts = QuantizedActs::from_buf(ty, n, data);
        if let Some(g) = gemm {
            let _ = acts.gemm.set(g);
        }
        acts
    }

    /// `n_rows` rows of `n` values converted to `ty`, each written by `fill(row index, row)`
    /// into one reused buffer first (rows gathered from elsewhere need no batch-sized copy).
    pub fn from_fn(
        ty: GgmlType,
        n: usize,
        n_rows: usize,
        mut fill: impl FnMut(usize, &mut [f32]),
    ) -> QuantizedActs {
        let row_bytes = ty
            .row_bytes(n as u64)
            .expect("activation row length fits the block size") as usize;
        let mut data = scratch::take_bytes(row_bytes * n_rows);
        let q = moxie_quant::quantize_fn(ty).expect("activation types can always be quantized");
        let mut row = vec![0f32; n];
        for (t, dst) in data.chunks_exact_mut(row_bytes).enumerate() {
            fill(t, &mut row);
            q(&row, dst);
        }
        QuantizedActs::from_buf(ty, n, data)
    }

    /// Convert the rows of `x` (each `n` long) to `ty` in place of what these activations
    /// held, reusing their buffer (decode converts every layer's input this way without
    /// allocating), over `par`'s threads where the rows are enough work.
    pub fn refill(&mut self, par: &Parallel, ty: GgmlType, n: usize, x: &[f32]) {
        let row_bytes = ty
            .row_bytes(n as u64)
            .expect("activation row length fits the block size") as usize;
        let q = moxie_quant::quantize_fn(ty).expect("activation types can always be quantized");
        let n_rows = x.len() / n;
        // Not cleared first: every byte is written below.
        self.data.resize(row_bytes * n_rows);
        par.for_each_range(n_rows, 8 * n, &mut self.data, row_bytes, |rows, data| {
            let x = &x[rows.start * n..rows.end * n];
            for (src, dst) in x.chunks_exact(n).zip(data.chunks_exact_mut(row_bytes)) {
                q(src, dst);
            }
        });
        self.ty = ty;
        self.n = n;
        self.row_bytes = row_bytes;
        self.gemm = OnceLock::new();
    }

    /// Rows already converted to `ty` (`n` elements each), back to back in `data`.
    pub fn from_bytes(ty: GgmlType, n: usize, data: Vec<u8>) -> QuantizedActs {
        QuantizedActs::from_buf(ty, n, Buf::from_vec(data))
    }

    fn from_buf(ty: GgmlType, n: usize, data: Buf<u8>) -> QuantizedActs {
        let row_bytes = ty
            .row_bytes(n as u64)
            .expect("activation row length fits the block size") as usize;
        assert!(
            data.len().is_multiple_of(row_bytes),
            "whole activation rows"
        );
        QuantizedActs {
            ty,
            n,
            row_bytes,
            data,
            gemm: OnceLock::new(),
        }
    }

    /// The rows `rows` (in that order) as a new set of activations.
    pub fn gather(&self, rows: &[usize]) -> QuantizedActs {
        let mut data = scratch::take_bytes(rows.len() * self.row_bytes);
        for (dst, &r) in data.chunks_exact_mut(self.row_bytes).zip(rows) {
            dst.copy_from_slice(self.row(r));
        }
        let out = QuantizedActs::from_buf(self.ty, self.n, data);
        // Prepared once for all rows, the int8 GEMM's input is copied, not built again.
        if let Some(g) = self.gemm.get() {
            let _ = out.gemm.set(g.gather(rows));
        }
        out
    }

    /// Prepare what `kernel` will read (the int8 GEMM's input). Every caller that starts a
    /// region of [`Mat::rows_times`] calls it first, so the region does not build it on one
    /// thread while the others wait.
    pub(crate) fn prepare_for(&self, kernel: Kernel) {
        if matches!(kernel, Kernel::Int8Gemm) {
            self.gemm_acts();
        }
    }

    /// These rows as the int8 GEMM's input (prepared once). Only for Q8_K / Q8_0 rows, the
    /// activation types of the weight types `gemm_supports`.
    fn gemm_acts(&self) -> &moxie_quant::GemmActs {
        self.gemm.get_or_init(|| {
            moxie_quant::GemmActs::new(self.ty, self.n, &self.data, self.row_bytes)
                .expect("the int8 GEMM is only chosen for Q8_K / Q8_0 activations")
        })
    }

    pub fn n_rows(&self) -> usize {
        self.data.len().checked_div(self.row_bytes).unwrap_or(0)
    }

    pub fn row(&self, i: usize) -> &[u8] {
        &self.data[i * self.row_bytes..(i + 1) * self.row_bytes]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// Batched products (chunks in rows_times' run order, gathered back to token-major) equal
    /// one-token products row for row, for row counts that end in a short run and token counts
    /// on both sides of the int8 GEMM threshold, with every kernel choice.
    #[test]
    fn batched_products_match_one_token_products() {
        let mut seed = 11u64;
        let n_in = 256;
        for ty in [GgmlType::Q8_0, GgmlType::Q4_K] {
            for n_out in [37, 64, 5] {
                let w: Vec<f32> = (0..n_in * n_out).map(|_| lcg(&mut seed)).collect();
                let rb = ty.row_bytes(n_in as u64).unwrap() as usize;
                let mut wq = vec![0u8; rb * n_out];
                let qw = moxie_quant::quantize_weights_fn(ty).unwrap();
                for (src, dst) in w.chunks_exact(n_in).zip(wq.chunks_exact_mut(rb)) {
                    qw(src, dst);
                }
                let t = Tensor::owned("w", ty, [n_in, n_out, 1, 1], wq).unwrap();
                let m = t.matrix().unwrap();
                for numerics in [Numerics::Exact, Numerics::Fast] {
                    let par = Parallel::new(2).with_numerics(numerics);
                    for n_tok in [2, 3, 4, 9] {
                        let x: Vec<f32> = (0..n_in * n_tok).map(|_| lcg(&mut seed)).collect();
                        let mut got = vec![f32::NAN; n_tok * n_out];
                        m.matmul(&par, &x, &mut got);
                        for (xt, gt) in x.chunks_exact(n_in).zip(got.chunks_exact(n_out)) {
                            let mut want = vec![0f32; n_out];
                            m.matmul(&par, xt, &mut want);
                            for (r, (&g, &w)) in gt.iter().zip(&want).enumerate() {
                                assert!(
                                    (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
                                    "{ty} {numerics:?} n_out {n_out} n_tok {n_tok} row {r}: \
                                     batch {g}, one token {w}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
