//! Products with weight matrices of every ggml block type moxie reads: `mul_mat` (dense and
//! batched per head), `mul_mat_id` (routed experts picked per token) and `get_rows`
//! (embedding rows), launching the per-type kernels of `kernels/matmul.cu`.
//!
//! Weights whose values are integer codes times a scale plus an offset (the legacy types,
//! the K-quants, IQ4_NL, IQ4_XS, the IQ1/IQ2/IQ3 grid types and ik_llama.cpp's IQ2_K..IQ6_K,
//! IQ2_KS..IQ5_KS and Q6_0) multiply int8 activations (`kernels/matmul_q8.cu`, as
//! llama.cpp's CUDA backend does): the activations are quantized into a work buffer the
//! [`Gpu`] keeps, to the integers the CPU path's Q8_0 / Q8_1 / Q8_K blocks hold, then `dp4a`
//! sums the integer codes. The other types (F32, F16, BF16) dequantize
//! 32-value chunks exactly as moxie-quant does (`kernels/quant.cuh`) and accumulate the
//! products in f32 (`kernels/matmul.cu`). Both: one warp per output row, lanes over the
//! row's chunks, up to eight tokens per pass over the row.

use moxie_quant::GgmlType;

use crate::{Arg, Buffer, DevPtr, Error, Gpu, LaunchConfig, Result};

/// A weight tensor in device memory: `n_mat` matrices (ggml ne\[2\]) of `n_out` rows (ne\[1\])
/// of `n_in` values (ne\[0\]) of type `ty`, rows contiguous, matrices contiguous.
#[derive(Clone, Copy, Debug)]
pub struct Weight {
    pub ptr: DevPtr,
    pub ty: GgmlType,
    pub n_in: usize,
    pub n_out: usize,
    pub n_mat: usize,
}

impl Weight {
    /// Bytes of one row (`n_in` is a multiple of the block size for every weight the kernels
    /// accept; 0 otherwise).
    pub fn row_bytes(&self) -> usize {
        self.ty.row_bytes(self.n_in as u64).unwrap_or(0) as usize
    }

    /// Bytes of one matrix.
    pub fn mat_bytes(&self) -> usize {
        self.row_bytes() * self.n_out
    }
}

/// The kernels of one weight type, and the alignment their loads need of the weight's base
/// address (the widest access `quant.cuh` makes: the largest power of two, at most 16,
/// dividing the block size and the row prefix of ik_llama.cpp's `_KS` types, for whole-row
/// types that of a 32-value chunk). A `_KS` row is its scale (2 or 4 bytes) and its blocks,
/// so rows, and the blocks in them, are only 2- or 4-aligned.
struct Kernels {
    mul_mat: &'static str,
    mul_mat_id: &'static str,
    get_rows: &'static str,
    align: u64,
    /// `mul_mat`, `mul_mat_id` and `mul_mat_id` over rows grouped by expert, over int8
    /// activations, for types with integer codes.
    q8: Option<Q8Kernels>,
}

/// The kernels of a type's products over int8 activations (`matmul_q8.cu`).
#[derive(Clone, Copy)]
struct Q8Kernels {
    mul_mat: &'static str,
    mul_mat_id: &'static str,
    /// `mul_mat_id` over rows grouped by expert (`group_rows`).
    grouped: &'static str,
    /// `mul_mat` and `grouped` on tensor cores ([`Gpu::tensor_cores`]).
    mul_mat_mma: &'static str,
    grouped_mma: &'static str,
}

fn kernels(ty: GgmlType) -> Option<&'static Kernels> {
    macro_rules! k {
        ($name:literal, $align:expr) => {
            &Kernels {
                mul_mat: concat!("mul_mat_", $name),
                mul_mat_id: concat!("mul_mat_id_", $name),
                get_rows: concat!("get_rows_", $name),
                align: $align,
                q8: None,
            }
        };
        ($name:literal, $align:expr, q8) => {
            &Kernels {
                mul_mat: concat!("mul_mat_", $name),
                mul_mat_id: concat!("mul_mat_id_", $name),
                get_rows: concat!("get_rows_", $name),
                align: $align,
                q8: Some(Q8Kernels {
                    mul_mat: concat!("mul_mat_q8_", $name),
                    mul_mat_id: concat!("mul_mat_id_q8_", $name),
                    grouped: concat!("mul_mat_id_grouped_q8_", $name),
                    mul_mat_mma: concat!("mul_mat_q8_mma_", $name),
                    grouped_mma: concat!("mul_mat_id_grouped_q8_mma_", $name),
                }),
            }
        };
    }
    use GgmlType::*;
    Some(match ty {
        F32 => k!("f32", 16),
        F16 => k!("f16", 16),
        BF16 => k!("bf16", 16),
        Q4_0 => k!("q4_0", 2, q8),
        Q4_1 => k!("q4_1", 4, q8),
        Q5_0 => k!("q5_0", 2, q8),
        Q5_1 => k!("q5_1", 8, q8),
        Q8_0 => k!("q8_0", 2, q8),
        Q2_K => k!("q2_k", 4, q8),
        Q3_K => k!("q3_k", 2, q8),
        Q4_K => k!("q4_k", 16, q8),
        Q5_K => k!("q5_k", 16, q8),
        Q6_K => k!("q6_k", 2, q8),
        IQ4_NL => k!("iq4_nl", 2, q8),
        IQ4_XS => k!("iq4_xs", 8, q8),
        IQ2_XXS => k!("iq2_xxs", 2, q8),
        IQ2_XS => k!("iq2_xs", 2, q8),
        IQ2_S => k!("iq2_s", 2, q8),
        IQ3_XXS => k!("iq3_xxs", 2, q8),
        IQ3_S => k!("iq3_s", 2, q8),
        IQ1_S => k!("iq1_s", 2, q8),
        IQ1_M => k!("iq1_m", 8, q8),
        IQ2_K => k!("iq2_k", 4, q8),
        IQ3_K => k!("iq3_k", 2, q8),
        IQ4_K => k!("iq4_k", 16, q8),
        IQ5_K => k!("iq5_k", 16, q8),
        IQ6_K => k!("iq6_k", 4, q8),
        IQ2_KS => k!("iq2_ks", 2, q8),
        IQ3_KS => k!("iq3_ks", 2, q8),
        IQ4_KS => k!("iq4_ks", 4, q8),
        IQ5_KS => k!("iq5_ks", 4, q8),
        Q6_0 => k!("q6_0", 2, q8),
        _ => return None,
    })
}

/// The most device memory the int8 activations of one product take (the work buffer [`Gpu`]
/// keeps, within the planner's per-GPU headroom); a product whose activations need more runs
/// the f32 kernel. 64 MiB holds a 512-token batch of rows of 80k values.
pub(crate) const Q8X_MAX_BYTES: usize = 64 << 20;
/// Routed rows per expert (on average) from which `mul_mat_id` groups them by expert
/// (`group_rows`, then one pass of up to 8 rows per weight row), so that each expert's weights
/// are read once per 8 rows rather than once per row. Decode's few rows per expert take the
/// kernel that reads each routed row's weights on its own.
const GROUP_ROWS_PER_EXPERT: usize = 4;
/// Tokens from which a dense int8 product runs on tensor cores where the GPU has them
/// ([`Gpu::tensor_cores`]): a warp there computes 16 rows for `MMA_TOKENS` tokens
/// (`MX_MMA_TOK`), so fewer tokens would leave most of each product unused.
const MMA_MIN_TOKENS: usize = 16;
/// Tokens per warp of the tensor-core kernels (`MX_MMA_TOK`).
const MMA_TOKENS: usize = 32;
/// Warps per block of the tensor-core kernels (`MX_MMA_WARPS`).
const MMA_WARPS: usize = 4;
/// Routed rows per pass of the grouped kernel (`MX_MM_TOK`).
const GROUP_CHUNK: usize = 8;
/// Threads of `group_rows` (one block).
const GROUP_THREADS: u32 = 256;

/// Bytes of `group_rows`' outputs and scratch: offsets and chunk starts (n_mat + 1 each),
/// cursors (n_mat), the sorted row indices (n_ids); i32s.
fn group_bytes(n_mat: usize, n_ids: usize) -> usize {
    4 * (3 * n_mat + 2 + n_ids)
}

/// Warps per block of `quantize_q8x` (one activation block of 32 or 256 values each).
const Q8X_WARPS_PER_BLOCK: usize = 8;

/// Output rows per block of `mul_mat` / `mul_mat_id` (one warp each).
const ROWS_PER_BLOCK: usize = 4;
/// Threads per block of `get_rows` (one 32-value chunk each).
const GET_ROWS_THREADS: usize = 64;
/// CUDA's limit on grid y and z.
const GRID_YZ_MAX: usize = 65535;

/// Grid y and z covering `n` (the kernels index `blockIdx.z * gridDim.y + blockIdx.y` and
/// skip indices from `n` on). `n` is at most `i32::MAX`, well within 65535².
fn grid_yz(n: usize) -> [u32; 2] {
    if n <= GRID_YZ_MAX {
        [n as u32, 1]
    } else {
        [GRID_YZ_MAX as u32, n.div_ceil(GRID_YZ_MAX) as u32]
    }
}

fn arg_error(kernel: &str, msg: String) -> Error {
    Error::Kernel {
        kernel: kernel.to_string(),
        msg,
    }
}

/// `v` as a kernel's `int`, or an error naming `what`.
fn int(kernel: &str, what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| arg_error(kernel, format!("{what} = {v} exceeds i32::MAX")))
}

/// The kernel `pick` chooses for `w`'s type, after checking what every launch needs of the
/// weight.
fn check_weight(w: &Weight, pick: fn(&Kernels) -> &'static str) -> Result<&'static str> {
    let k = kernels(w.ty).ok_or_else(|| {
        Error::Unsupported(format!("{} weights are not supported on the GPU", w.ty))
    })?;
    let name = pick(k);
    let block = w.ty.block_size().max(32);
    if !w.n_in.is_multiple_of(block) {
        return Err(arg_error(
            name,
            format!(
                "n_in = {} is not a multiple of {block} ({} weights)",
                w.n_in, w.ty
            ),
        ));
    }
    if !w.ptr.raw().is_multiple_of(k.align) {
        return Err(arg_error(
            name,
            format!(
                "weight address {:#x} is not aligned to {} bytes",
                w.ptr, k.align
            ),
        ));
    }
    int(name, "n_in", w.n_in)?;
    int(name, "n_out", w.n_out)?;
    int(name, "n_mat", w.n_mat)?;
    w.n_out
        .checked_mul(w.n_mat)
        .and_then(|rows| rows.checked_mul(w.row_bytes()))
        .ok_or_else(|| arg_error(name, "weight size overflows".to_string()))?;
    Ok(name)
}

fn check_align4(kernel: &str, what: &str, p: DevPtr) -> Result<()> {
    if !p.raw().is_multiple_of(4) {
        return Err(arg_error(
            kernel,
            format!("{what} address {p:#x} is not aligned to 4 bytes"),
        ));
    }
    Ok(())
}

/// One warp per output row (`ROWS_PER_BLOCK` rows a block) for each of `n_slices` matrices
/// or routed rows (grid y and z).
fn warp_per_row(n_out: usize, n_slices: usize) -> LaunchConfig {
    let [gy, gz] = grid_yz(n_slices);
    LaunchConfig {
        grid: [n_out.div_ceil(ROWS_PER_BLOCK) as u32, gy, gz],
        block: [32, ROWS_PER_BLOCK as u32, 1],
        shared_bytes: 0,
    }
}

/// The tensor-core kernels' shape: a warp per 16 output rows (`MMA_WARPS` warps a block) for
/// each of `n_slices` token tiles (grid y and z).
fn mma_tiles(n_out: usize, n_slices: usize) -> LaunchConfig {
    let [gy, gz] = grid_yz(n_slices);
    LaunchConfig {
        grid: [n_out.div_ceil(16 * MMA_WARPS) as u32, gy, gz],
        block: [32, MMA_WARPS as u32, 1],
        shared_bytes: 0,
    }
}

/// Output rows `ldy` apart must not overlap when there is more than one.
fn check_ldy(name: &str, n_rows: usize, ldy: usize, n_out: usize) -> Result<()> {
    if n_rows > 1 && ldy < n_out {
        return Err(arg_error(
            name,
            format!("ldy = {ldy} is less than n_out = {n_out}"),
        ));
    }
    Ok(())
}

/// Device bytes of `rows` rows of q8x activations of `n_in` values (`kernels/matmul_q8.cu`):
/// the int8 codes, padded to 256 bytes, then 16 bytes per 32 values, then `extra` bytes of
/// the product's own (16-aligned); where the second and third parts start, and the total.
/// `None` past [`Q8X_MAX_BYTES`].
/// Values per activation scale where products with `ty` take int8 activations: 256 where
/// moxie's CPU path multiplies it with Q8_K blocks, else 32 (Q8_0 / Q8_1).
fn q8x_block(ty: GgmlType) -> usize {
    if moxie_quant::vec_dot_type(ty) == Some(GgmlType::Q8_K) {
        256
    } else {
        32
    }
}

/// Each `(w, y, ldy)` of products sharing an input, checked as the product of `kernel` (a
/// [`Kernels`] entry) over `rows` rows checks it alone: the weight, `ldy` and `y`'s alignment.
fn check_outputs(
    products: &[(&Weight, DevPtr, usize)],
    rows: usize,
    kernel: fn(&Kernels) -> &'static str,
) -> Result<()> {
    for &(w, y, ldy) in products {
        let name = check_weight(w, kernel)?;
        check_ldy(name, rows, ldy, w.n_out)?;
        check_align4(name, "y", y)?;
    }
    Ok(())
}

/// Whether `mul_mat_id` of `w` groups its `n_ids` routed rows by expert first: where experts
/// see several rows each (prompt batches).
fn groups_rows(w: &Weight, n_ids: usize) -> bool {
    n_ids >= GROUP_ROWS_PER_EXPERT * w.n_mat
}

/// The q8x work buffer's bytes of scratch `mul_mat_id` of `w` over `n_ids` rows needs: the
/// grouping's, where it groups.
fn id_extra_bytes(w: &Weight, n_ids: usize) -> usize {
    if groups_rows(w, n_ids) {
        group_bytes(w.n_mat, n_ids)
    } else {
        0
    }
}

fn q8x_layout(rows: usize, n_in: usize, extra: usize) -> Option<(usize, usize, usize)> {
    let codes = rows.checked_mul(n_in)?.checked_next_multiple_of(256)?;
    let meta_end = codes.checked_add(rows.checked_mul(n_in / 32 * 16)?)?;
    let total = meta_end.checked_add(extra)?;
    (total <= Q8X_MAX_BYTES).then_some((codes, meta_end, total))
}

impl Gpu {
    /// Whether products with weights of type `ty` can multiply int8 activations (quantized
    /// as moxie's CPU path quantizes them for that type: Q8_0 / Q8_1 / Q8_K blocks) rather
    /// than f32 ones: they do where [`Gpu::int8_activations`] is on and their work buffer
    /// fits ([`Q8X_MAX_BYTES`]).
    pub fn has_int8_kernels(ty: GgmlType) -> bool {
        kernels(ty).is_some_and(|k| k.q8.is_some())
    }

    /// Quantizes `n_rows * n_batch` rows of `x` (row `t * n_batch + b` at
    /// `x[t*ldx + b*x_batch]`, `n_in` values) into the q8x work buffer, as the CPU path
    /// quantizes activations for weights of type `ty`, and queues `product`
    /// (given the codes, their scales and `extra` bytes of scratch) after it, with the buffer
    /// held. `false` (nothing
    /// queued) where the buffer would exceed [`Q8X_MAX_BYTES`] or cannot be allocated: the
    /// caller runs the f32 kernel instead.
    #[allow(clippy::too_many_arguments)]
    fn with_q8x(
        &self,
        ty: GgmlType,
        x: DevPtr,
        n_in: usize,
        n_batch: usize,
        ldx: usize,
        x_batch: usize,
        n_rows: usize,
        extra: usize,
        product: impl FnOnce(DevPtr, DevPtr, DevPtr) -> Result<()>,
    ) -> Result<bool> {
        const NAME: &str = "quantize_q8x";
        let Some(all) = n_rows.checked_mul(n_batch) else {
            return Ok(false);
        };
        let Some((codes, meta_end, total)) = q8x_layout(all, n_in, extra) else {
            return Ok(false);
        };
        let mut held = self.q8x.lock().unwrap_or_else(|p| p.into_inner());
        if held.as_ref().is_none_or(|b| b.len() < total) {
            // Give the old buffer back before asking for the larger one.
            *held = None;
            match Buffer::new(self.backend(), total) {
                Ok(b) => *held = Some(b),
                // Out of device memory for it: the f32 kernel needs none.
                Err(_) => return Ok(false),
            }
        }
        let buf = held.as_ref().expect("set above").ptr();
        let (qs, meta, aux) = (buf, buf.byte_add(codes), buf.byte_add(meta_end));
        let per = q8x_block(ty);
        let [gy, gz] = grid_yz(all);
        let cfg = LaunchConfig {
            grid: [(n_in / per).div_ceil(Q8X_WARPS_PER_BLOCK) as u32, gy, gz],
            block: [32, Q8X_WARPS_PER_BLOCK as u32, 1],
            shared_bytes: 0,
        };
        let args = [
            Arg::Ptr(x),
            Arg::I32(int(NAME, "n_in", n_in)?),
            Arg::I32(int(NAME, "n_batch", n_batch)?),
            Arg::I32(int(NAME, "ldx", ldx)?),
            Arg::I32(int(NAME, "x_batch", x_batch)?),
            Arg::I32(int(NAME, "n_rows", n_rows)?),
            Arg::I32(per as i32),
            Arg::Ptr(qs),
            Arg::Ptr(meta),
        ];
        self.backend().launch(NAME, cfg, &args)?;
        product(qs, meta, aux)?;
        Ok(true)
    }

    /// `mul_mat_id` over rows grouped by expert: `group_rows` sorts the routed rows into `aux`
    /// (offsets, cursors, chunk starts, order), then `kernel` runs one block row per chunk of
    /// up to [`GROUP_CHUNK`] rows of one expert.
    #[allow(clippy::too_many_arguments)]
    fn mul_mat_id_grouped(
        &self,
        w: &Weight,
        k: Q8Kernels,
        ids: DevPtr,
        n_ids: usize,
        qs: DevPtr,
        meta: DevPtr,
        aux: DevPtr,
        x_div: usize,
        y: DevPtr,
        ldy: usize,
    ) -> Result<()> {
        let offsets = aux;
        let cursor = offsets.offset::<i32>(w.n_mat + 1);
        let chunk_start = cursor.offset::<i32>(w.n_mat);
        let order = chunk_start.offset::<i32>(w.n_mat + 1);
        let n_mat = int("group_rows", "n_mat", w.n_mat)?;
        let tensor_cores = self.mma;
        let kernel = if tensor_cores {
            k.grouped_mma
        } else {
            k.grouped
        };
        let ldy = Arg::I32(int(kernel, "ldy", ldy)?);
        self.backend().launch(
            "group_rows",
            LaunchConfig::linear(1, GROUP_THREADS),
            &[
                Arg::Ptr(ids),
                Arg::I32(int("group_rows", "n_ids", n_ids)?),
                Arg::I32(n_mat),
                Arg::I32(int("group_rows", "n_out", w.n_out)?),
                Arg::Ptr(y),
                ldy,
                Arg::Ptr(offsets),
                Arg::Ptr(cursor),
                Arg::Ptr(chunk_start),
                Arg::Ptr(order),
            ],
        )?;
        // At most this many chunks: each expert's last one may be partial.
        let chunks = n_ids.div_ceil(GROUP_CHUNK) + w.n_mat;
        let args = [
            Arg::Ptr(w.ptr),
            Arg::U64(w.row_bytes() as u64),
            Arg::U64(w.mat_bytes() as u64),
            Arg::I32(int(kernel, "n_in", w.n_in)?),
            Arg::I32(int(kernel, "n_out", w.n_out)?),
            Arg::I32(n_mat),
            Arg::Ptr(order),
            Arg::Ptr(offsets),
            Arg::Ptr(chunk_start),
            Arg::Ptr(qs),
            Arg::Ptr(meta),
            Arg::I32(int(kernel, "x_div", x_div)?),
            Arg::Ptr(y),
            ldy,
        ];
        let cfg = if tensor_cores {
            mma_tiles(w.n_out, chunks)
        } else {
            warp_per_row(w.n_out, chunks)
        };
        self.backend().launch(kernel, cfg, &args)
    }

    /// Whether the GPU kernels handle weights of type `ty`.
    pub fn supports(ty: GgmlType) -> bool {
        kernels(ty).is_some()
    }

    /// `y[t*ldy + b*y_batch + r] = Σ_i W_b[r][i] · x[t*ldx + b*x_batch + i]` for rows
    /// `r < w.n_out`, tokens `t < n_tok` and matrices `b < n_batch` (matrix `b` of `w`; a
    /// dense product is `n_batch = 1`). Strides are in f32 elements.
    #[allow(clippy::too_many_arguments)]
    pub fn mul_mat(
        &self,
        w: &Weight,
        n_batch: usize,
        x: DevPtr,
        ldx: usize,
        x_batch: usize,
        y: DevPtr,
        ldy: usize,
        y_batch: usize,
        n_tok: usize,
    ) -> Result<()> {
        let name = check_weight(w, |k| k.mul_mat)?;
        if n_batch > w.n_mat {
            return Err(arg_error(
                name,
                format!(
                    "n_batch = {n_batch} exceeds the weight's {} matrices",
                    w.n_mat
                ),
            ));
        }
        check_ldy(name, n_tok, ldy, w.n_out)?;
        check_align4(name, "x", x)?;
        check_align4(name, "y", y)?;
        if n_batch == 0 || n_tok == 0 || w.n_out == 0 {
            return Ok(());
        }
        if self.int8 && Gpu::has_int8_kernels(w.ty) {
            let product = |qs: DevPtr, meta: DevPtr, _: DevPtr| {
                self.mul_mat_q8(w, n_batch, qs, meta, y, ldy, y_batch, n_tok)
            };
            if self.with_q8x(w.ty, x, w.n_in, n_batch, ldx, x_batch, n_tok, 0, product)? {
                return Ok(());
            }
        }
        let args = [
            Arg::Ptr(w.ptr),
            Arg::U64(w.row_bytes() as u64),
            Arg::U64(w.mat_bytes() as u64),
            Arg::I32(int(name, "n_in", w.n_in)?),
            Arg::I32(int(name, "n_out", w.n_out)?),
            Arg::I32(int(name, "n_batch", n_batch)?),
            Arg::Ptr(x),
            Arg::I32(int(name, "ldx", ldx)?),
            Arg::I32(int(name, "x_batch", x_batch)?),
            Arg::Ptr(y),
            Arg::I32(int(name, "ldy", ldy)?),
            Arg::I32(int(name, "y_batch", y_batch)?),
            Arg::I32(int(name, "n_tok", n_tok)?),
        ];
        self.backend()
            .launch(name, warp_per_row(w.n_out, n_batch), &args)
    }

    /// Dense products of several weights with one input: for each `(w, y, ldy)` of
    /// `products`, `y[t*ldy + r] = Σ_i W[r][i] · x[t*ldx + i]` (as [`Gpu::mul_mat`] with one
    /// matrix). Where every weight takes the same int8 activations (int8 kernels, the same
    /// `n_in` and activation block: q/k/v, gate/up), `x` is quantized once for all of them;
    /// else each product is a `mul_mat` of its own. The results are the same either way.
    pub fn mul_mats(
        &self,
        products: &[(&Weight, DevPtr, usize)],
        x: DevPtr,
        ldx: usize,
        n_tok: usize,
    ) -> Result<()> {
        let separate = || {
            products
                .iter()
                .try_for_each(|&(w, y, ldy)| self.mul_mat(w, 1, x, ldx, 0, y, ldy, 0, n_tok))
        };
        let Some(first) = self.shared_int8_input(products, n_tok) else {
            return separate();
        };
        check_outputs(products, n_tok, |k| k.mul_mat)?;
        check_align4("mul_mats", "x", x)?;
        let all = |qs: DevPtr, meta: DevPtr, _: DevPtr| {
            products.iter().try_for_each(|&(w, y, ldy)| match w.n_out {
                0 => Ok(()),
                _ => self.mul_mat_q8(w, 1, qs, meta, y, ldy, 0, n_tok),
            })
        };
        if self.with_q8x(first.ty, x, first.n_in, 1, ldx, 0, n_tok, 0, all)? {
            return Ok(());
        }
        separate()
    }

    /// The first of `products` over `rows` input rows where they can share one quantization
    /// of their input (int8 activations on; two or more products, all of types with int8
    /// kernels, one `n_in`, one activation block), else `None`.
    fn shared_int8_input<'w>(
        &self,
        products: &[(&'w Weight, DevPtr, usize)],
        rows: usize,
    ) -> Option<&'w Weight> {
        let &(first, _, _) = products.first()?;
        let shared = self.int8
            && products.len() > 1
            && rows > 0
            && products.iter().all(|&(w, _, _)| {
                Gpu::has_int8_kernels(w.ty)
                    && w.n_in == first.n_in
                    && q8x_block(w.ty) == q8x_block(first.ty)
            });
        shared.then_some(first)
    }

    /// The int8 product of [`Gpu::mul_mat`] over activations already in q8x form (`qs`,
    /// `meta`).
    #[allow(clippy::too_many_arguments)]
    fn mul_mat_q8(
        &self,
        w: &Weight,
        n_batch: usize,
        qs: DevPtr,
        meta: DevPtr,
        y: DevPtr,
        ldy: usize,
        y_batch: usize,
        n_tok: usize,
    ) -> Result<()> {
        let k = kernels(w.ty)
            .and_then(|k| k.q8)
            .expect("callers checked has_int8_kernels");
        let tensor_cores = n_tok >= MMA_MIN_TOKENS && self.mma;
        let q8_name = if tensor_cores {
            k.mul_mat_mma
        } else {
            k.mul_mat
        };
        let args = [
            Arg::Ptr(w.ptr),
            Arg::U64(w.row_bytes() as u64),
            Arg::U64(w.mat_bytes() as u64),
            Arg::I32(int(q8_name, "n_in", w.n_in)?),
            Arg::I32(int(q8_name, "n_out", w.n_out)?),
            Arg::I32(int(q8_name, "n_batch", n_batch)?),
            Arg::Ptr(qs),
            Arg::Ptr(meta),
            Arg::Ptr(y),
            Arg::I32(int(q8_name, "ldy", ldy)?),
            Arg::I32(int(q8_name, "y_batch", y_batch)?),
            Arg::I32(int(q8_name, "n_tok", n_tok)?),
        ];
        let cfg = if tensor_cores {
            mma_tiles(w.n_out, n_tok.div_ceil(MMA_TOKENS) * n_batch)
        } else {
            warp_per_row(w.n_out, n_batch)
        };
        self.backend().launch(q8_name, cfg, &args)
    }

    /// Routed experts: for `j < n_ids`, with `e = ids[j]` (device `i32`s),
    /// `y[j*ldy + r] = Σ_i W_e[r][i] · x[(j / x_div)*ldx + i]` — gate and up projections
    /// read their token's row (`x_div` = experts per token), down projections their own row
    /// (`x_div = 1`). An id outside `0..w.n_mat` gives a row of zeros.
    #[allow(clippy::too_many_arguments)]
    pub fn mul_mat_id(
        &self,
        w: &Weight,
        ids: DevPtr,
        n_ids: usize,
        x: DevPtr,
        ldx: usize,
        x_div: usize,
        y: DevPtr,
        ldy: usize,
    ) -> Result<()> {
        let name = check_weight(w, |k| k.mul_mat_id)?;
        if x_div == 0 {
            return Err(arg_error(name, "x_div = 0".to_string()));
        }
        check_ldy(name, n_ids, ldy, w.n_out)?;
        check_align4(name, "x", x)?;
        check_align4(name, "y", y)?;
        check_align4(name, "ids", ids)?;
        if n_ids == 0 || w.n_out == 0 {
            return Ok(());
        }
        if self.int8 && Gpu::has_int8_kernels(w.ty) {
            let product = |qs: DevPtr, meta: DevPtr, aux: DevPtr| {
                self.mul_mat_id_q8(w, ids, n_ids, qs, meta, aux, x_div, y, ldy)
            };
            // The rows the routed rows read: one per x_div of them.
            let n_x = n_ids.div_ceil(x_div);
            let extra = id_extra_bytes(w, n_ids);
            if self.with_q8x(w.ty, x, w.n_in, 1, ldx, 0, n_x, extra, product)? {
                return Ok(());
            }
        }
        let args = [
            Arg::Ptr(w.ptr),
            Arg::U64(w.row_bytes() as u64),
            Arg::U64(w.mat_bytes() as u64),
            Arg::I32(int(name, "n_in", w.n_in)?),
            Arg::I32(int(name, "n_out", w.n_out)?),
            Arg::I32(int(name, "n_mat", w.n_mat)?),
            Arg::Ptr(ids),
            Arg::I32(int(name, "n_ids", n_ids)?),
            Arg::Ptr(x),
            Arg::I32(int(name, "ldx", ldx)?),
            Arg::I32(int(name, "x_div", x_div)?),
            Arg::Ptr(y),
            Arg::I32(int(name, "ldy", ldy)?),
        ];
        self.backend()
            .launch(name, warp_per_row(w.n_out, n_ids), &args)
    }

    /// Routed products of several weights with one input and one set of routes (an expert
    /// layer's gate and up): for each `(w, y, ldy)` of `products`, [`Gpu::mul_mat_id`] of `w`
    /// into `y`. Where every weight takes the same int8 activations, `x` is quantized once for
    /// all of them; the results are the same either way.
    #[allow(clippy::too_many_arguments)]
    pub fn mul_mat_ids(
        &self,
        products: &[(&Weight, DevPtr, usize)],
        ids: DevPtr,
        n_ids: usize,
        x: DevPtr,
        ldx: usize,
        x_div: usize,
    ) -> Result<()> {
        let separate = || {
            products
                .iter()
                .try_for_each(|&(w, y, ldy)| self.mul_mat_id(w, ids, n_ids, x, ldx, x_div, y, ldy))
        };
        let Some(first) = self
            .shared_int8_input(products, n_ids)
            .filter(|_| x_div > 0)
        else {
            return separate();
        };
        check_outputs(products, n_ids, |k| k.mul_mat_id)?;
        check_align4("mul_mat_ids", "x", x)?;
        check_align4("mul_mat_ids", "ids", ids)?;
        // The products run one after another on the stream, so they share the scratch.
        let extra = products
            .iter()
            .map(|&(w, _, _)| id_extra_bytes(w, n_ids))
            .max()
            .unwrap_or(0);
        let all = |qs: DevPtr, meta: DevPtr, aux: DevPtr| {
            products.iter().try_for_each(|&(w, y, ldy)| match w.n_out {
                0 => Ok(()),
                _ => self.mul_mat_id_q8(w, ids, n_ids, qs, meta, aux, x_div, y, ldy),
            })
        };
        let n_x = n_ids.div_ceil(x_div);
        if self.with_q8x(first.ty, x, first.n_in, 1, ldx, 0, n_x, extra, all)? {
            return Ok(());
        }
        separate()
    }

    /// The int8 product of [`Gpu::mul_mat_id`] over activations already in q8x form: grouped
    /// by expert (in `aux`, [`id_extra_bytes`]) where experts see several rows each (prompt
    /// batches), else a row at a time.
    #[allow(clippy::too_many_arguments)]
    fn mul_mat_id_q8(
        &self,
        w: &Weight,
        ids: DevPtr,
        n_ids: usize,
        qs: DevPtr,
        meta: DevPtr,
        aux: DevPtr,
        x_div: usize,
        y: DevPtr,
        ldy: usize,
    ) -> Result<()> {
        let k = kernels(w.ty)
            .and_then(|k| k.q8)
            .expect("callers checked has_int8_kernels");
        let q8_name = k.mul_mat_id;
        if groups_rows(w, n_ids) {
            return self.mul_mat_id_grouped(w, k, ids, n_ids, qs, meta, aux, x_div, y, ldy);
        }
        let args = [
            Arg::Ptr(w.ptr),
            Arg::U64(w.row_bytes() as u64),
            Arg::U64(w.mat_bytes() as u64),
            Arg::I32(int(q8_name, "n_in", w.n_in)?),
            Arg::I32(int(q8_name, "n_out", w.n_out)?),
            Arg::I32(int(q8_name, "n_mat", w.n_mat)?),
            Arg::Ptr(ids),
            Arg::I32(int(q8_name, "n_ids", n_ids)?),
            Arg::Ptr(qs),
            Arg::Ptr(meta),
            Arg::I32(int(q8_name, "x_div", x_div)?),
            Arg::Ptr(y),
            Arg::I32(int(q8_name, "ldy", ldy)?),
        ];
        self.backend()
            .launch(q8_name, warp_per_row(w.n_out, n_ids), &args)
    }

    /// Embedding lookup: `out[j*n_in + i] = W[rows[j]][i]` as f32 for `j < n`, with `rows`
    /// device `i32`s counting through all `n_out · n_mat` rows of `w`, matrix after matrix.
    /// An id outside that range gives zeros. The values are exactly moxie-quant's
    /// dequantization.
    pub fn get_rows(&self, w: &Weight, rows: DevPtr, n: usize, out: DevPtr) -> Result<()> {
        let name = check_weight(w, |k| k.get_rows)?;
        check_align4(name, "rows", rows)?;
        check_align4(name, "out", out)?;
        let n_chunks = w.n_in / 32;
        if n == 0 || n_chunks == 0 {
            return Ok(());
        }
        // `n_out * n_mat` does not overflow: check_weight checked it times row_bytes.
        let n_rows = int(name, "n_out * n_mat", w.n_out * w.n_mat)?;
        let args = [
            Arg::Ptr(w.ptr),
            Arg::U64(w.row_bytes() as u64),
            Arg::I32(int(name, "n_in", w.n_in)?),
            Arg::I32(n_rows),
            Arg::Ptr(rows),
            Arg::I32(int(name, "n", n)?),
            Arg::Ptr(out),
        ];
        let [gy, gz] = grid_yz(n);
        let cfg = LaunchConfig {
            grid: [n_chunks.div_ceil(GET_ROWS_THREADS) as u32, gy, gz],
            block: [GET_ROWS_THREADS as u32, 1, 1],
            shared_bytes: 0,
        };
        self.backend().launch(name, cfg, &args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_yz_covers_large_counts() {
        assert_eq!(grid_yz(1), [1, 1]);
        assert_eq!(grid_yz(65535), [65535, 1]);
        assert_eq!(grid_yz(65536), [65535, 2]);
        let n = i32::MAX as usize;
        let [y, z] = grid_yz(n);
        assert!(z as usize <= GRID_YZ_MAX);
        assert!(y as usize * z as usize >= n);
    }

    #[test]
    fn every_dequantizable_weight_type_has_kernels() {
        for ty in GgmlType::ALL {
            let deq = moxie_quant::dequantize_fn(ty).is_some();
            // Q8_1 and Q8_K are activation formats, never weights.
            let activation = matches!(ty, GgmlType::Q8_1 | GgmlType::Q8_K);
            assert_eq!(Gpu::supports(ty), deq && !activation, "{ty}");
        }
        for ty in GgmlType::ALL.into_iter().filter(|t| Gpu::supports(*t)) {
            let k = kernels(ty).unwrap();
            // Blocks (and 32-value chunks of float rows) and row prefixes keep the base
            // alignment, and the alignment is the largest that does.
            let unit = if ty.block_size() == 1 {
                32 * ty.type_size()
            } else {
                ty.type_size()
            } as u64;
            let prefix = ty.row_meta_bytes() as u64;
            assert_eq!(unit % k.align, 0, "{ty}");
            assert_eq!(prefix % k.align, 0, "{ty}");
            assert!(k.align.is_power_of_two() && k.align <= 16);
            let widest = (unit | if prefix == 0 { 16 } else { prefix })
                .trailing_zeros()
                .min(4);
            assert_eq!(k.align, 1 << widest, "{ty}");
        }
    }
}
