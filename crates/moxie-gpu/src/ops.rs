//! Typed launches of the kernels in `kernels/ops.cu` (norms, elementwise, RoPE, attention,
//! routing, KV-cache stores). The products with quantized weights are in `matmul.rs`.
//! Every op takes device addresses and sizes in elements; it only queues work.

use std::sync::{Arc, Mutex};

use moxie_quant::GgmlType;

use crate::{Arg, Buffer, DevPtr, Error, GpuBackend, LaunchConfig, Result};

/// A GPU with typed kernel launches.
#[derive(Clone, Debug)]
pub struct Gpu {
    backend: Arc<dyn GpuBackend>,
    /// The int8 activations of the product being queued (`matmul.rs`), shared by the clones:
    /// grown on demand up to [`crate::matmul::Q8X_MAX_BYTES`], held while a product's two
    /// launches are queued (one stream runs them in order, so the next product's quantizer
    /// cannot overwrite activations a queued product still reads).
    pub(crate) q8x: Arc<Mutex<Option<Buffer>>>,
    /// Whether products with weight types that have int8 kernels use them
    /// ([`Gpu::int8_activations`]).
    pub(crate) int8: bool,
    /// Whether prompt batches' int8 products take the tensor-core kernels
    /// ([`Gpu::tensor_cores`]).
    pub(crate) mma: bool,
    /// Query heads an attention block serves at most ([`Gpu::with_attention_heads`]).
    attn_heads: usize,
}

/// The environment variable that turns int8 activations off for every GPU (`0`).
pub const INT8_ACTIVATIONS_ENV: &str = "MOXIE_GPU_INT8";
/// The environment variable that keeps the int8 products off tensor cores (`0`): the dp4a
/// kernels instead, on every GPU.
pub const TENSOR_CORES_ENV: &str = "MOXIE_GPU_MMA";

/// The environment variable that caps the query heads an attention block serves (1 to 8,
/// default 8), for measuring: fewer heads a block give one token's attention more blocks (an
/// H200 ran MLA's 16 heads on 2 of its 132 SMs), each reading the cache for its heads only.
/// The results do not depend on it.
pub const ATTENTION_HEADS_ENV: &str = "MOXIE_GPU_ATTN_HEADS";

/// Threads per block of the elementwise kernels, and the most blocks they launch (they loop).
const EW_THREADS: u32 = 256;
const EW_MAX_BLOCKS: u32 = 4096;
/// Limits fixed in ops.cu: threads per attention block, and the widest heads the attention
/// kernel takes (keys, values).
const ATTN_THREADS: u32 = 128;
pub const ATTN_MAX_DK: usize = 1152;
pub const ATTN_MAX_DV: usize = 8 * ATTN_THREADS as usize;
/// Query heads of one kv head an attention block serves (reading each cached row once for
/// them), and the floats their queries may take in its shared memory (ops.cu's
/// MX_ATTN_MAX_HEADS, MX_ATTN_Q_FLOATS).
const ATTN_MAX_HEADS: usize = 8;
const ATTN_Q_FLOATS: usize = 4608;
const ROUTE_MAX_EXPERTS: usize = 1024;
/// Prompt batches whose context stays under this many positions round their attention
/// probabilities to f16 before the weighted f16 values, as the CPU's batched attention does
/// where the whole context is one tile of its (`BATCH_KV_TILE` in moxie-core) and its bf16
/// products, from that many positions on, are not taken.
pub const ATTN_ROUND_PROBS_BELOW: usize = 512;
const ROUTE_MAX_GROUPS: usize = 64;
/// CUDA's limit on gridDim.y and gridDim.z.
const MAX_GRID_YZ: usize = 65535;
const CONV_MAX_K: usize = 8;
const GDN_MAX_D: usize = 256;

fn int(what: &str, v: usize) -> Result<Arg> {
    i32::try_from(v)
        .map(Arg::I32)
        .map_err(|_| Error::Unsupported(format!("{what} = {v} is too large for a GPU kernel")))
}

fn ew_grid(n: usize) -> u32 {
    (n.div_ceil(EW_THREADS as usize) as u32).clamp(1, EW_MAX_BLOCKS)
}

/// Rows go along grid x (at most 2^31 - 1).
fn row_grid(n: usize) -> Result<u32> {
    u32::try_from(n.min(i32::MAX as usize))
        .map_err(|_| Error::Unsupported(format!("{n} rows for one launch")))
}

/// Where the cached keys and values of one layer live, and their element type.
#[derive(Clone, Copy, Debug)]
pub struct KvView {
    pub k: DevPtr,
    pub v: DevPtr,
    /// Elements per position of a key row and a value row.
    pub k_row: usize,
    pub v_row: usize,
    /// The caches' types ([`kv_types_supported`]).
    pub k_type: GgmlType,
    pub v_type: GgmlType,
}

/// The cache rows the GPU kernels store and read, with the kernels that do it: (type, the
/// store kernel, the DSA indexer's score kernel).
const KV_KERNELS: [(GgmlType, &str, &str); 3] = [
    (GgmlType::F32, "kv_store_f32", "dsa_scores_f32"),
    (GgmlType::F16, "kv_store_f16", "dsa_scores_f16"),
    (GgmlType::Q8_0, "kv_store_q8_0", "dsa_scores_q8_0"),
];

/// The store and indexer-score kernels for cache type `ty`.
fn kv_kernels(ty: GgmlType) -> Result<(&'static str, &'static str)> {
    KV_KERNELS
        .iter()
        .find(|(t, _, _)| *t == ty)
        .map(|&(_, store, scores)| (store, scores))
        .ok_or_else(|| {
            Error::Unsupported(format!(
                "a {ty} KV cache on the GPU (f32, f16 and q8_0 are supported)"
            ))
        })
}

/// The attention kernel for keys of `k` and values of `v`: both of one type, or q8_0 with f16.
fn attention_kernel(k: GgmlType, v: GgmlType) -> Option<&'static str> {
    use GgmlType::{F16, F32, Q8_0};
    Some(match (k, v) {
        (F16, F16) => "attention_f16",
        (F32, F32) => "attention_f32",
        (Q8_0, Q8_0) => "attention_q8_0",
        (Q8_0, F16) => "attention_q8_0_f16",
        (F16, Q8_0) => "attention_f16_q8_0",
        _ => return None,
    })
}

/// 32-bit words of a [`Gpu::route_tally`] buffer for `n_expert` experts.
pub fn route_tally_words(n_expert: usize) -> usize {
    2 + 4 * n_expert
}

/// Whether the GPU kernels take a cache of keys of type `k` and values of type `v` (the
/// planner checks this before any weight is read).
pub fn kv_types_supported(k: GgmlType, v: GgmlType) -> bool {
    attention_kernel(k, v).is_some()
}

/// Head shapes of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub dk: usize,
    pub dv: usize,
    /// Position of the first query token.
    pub pos0: usize,
    pub scale: f32,
}

/// The positions each query token attends to when not all of them (DeepSeek sparse
/// attention): `counts[t]` (i32) positions listed at `list + t * stride` (i32), or all of
/// them where `counts[t]` is negative.
#[derive(Clone, Copy, Debug)]
pub struct Selection {
    pub list: DevPtr,
    pub counts: DevPtr,
    pub stride: usize,
}

/// The sizes of a gated DeltaNet layer (see `gated_delta_net_f32` in ops.cu).
#[derive(Clone, Copy, Debug)]
pub struct DeltaNetDims {
    /// Key heads and value heads (a multiple of the key heads).
    pub n_k: usize,
    pub n_v: usize,
    /// Key and value width per head (the state is `d × d` per value head).
    pub d: usize,
}

impl DeltaNetDims {
    /// The convolved channels per token: q, k, v.
    pub fn channels(&self) -> usize {
        (2 * self.n_k + self.n_v) * self.d
    }
}

/// How router logits become experts and weights (see `route_f32` in ops.cu).
#[derive(Clone, Copy, Debug)]
pub struct RouteSpec {
    pub n_expert: usize,
    pub k: usize,
    pub sigmoid: bool,
    pub n_groups: usize,
    pub n_group_used: usize,
    pub norm: bool,
    pub scale: f32,
}

impl Gpu {
    /// A GPU on `backend`; int8 activations on unless [`INT8_ACTIVATIONS_ENV`] is `0`.
    pub fn new(backend: Arc<dyn GpuBackend>) -> Gpu {
        let int8 = std::env::var(INT8_ACTIVATIONS_ENV).map_or(true, |v| v != "0");
        let mma =
            backend.tensor_cores() && std::env::var(TENSOR_CORES_ENV).map_or(true, |v| v != "0");
        let attn_heads = std::env::var(ATTENTION_HEADS_ENV)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(ATTN_MAX_HEADS);
        Gpu {
            backend,
            q8x: Arc::default(),
            int8,
            mma,
            attn_heads: attn_heads.clamp(1, ATTN_MAX_HEADS),
        }
    }

    /// This GPU with attention blocks of at most `heads` query heads of one kv head (1 to 8;
    /// [`ATTENTION_HEADS_ENV`]). Each head's sums run in the same order whatever the block, so
    /// only the speed changes: more blocks for one token, more reads of the cache.
    pub fn with_attention_heads(mut self, heads: usize) -> Gpu {
        self.attn_heads = heads.clamp(1, ATTN_MAX_HEADS);
        self
    }

    /// This GPU with products over int8 activations on (the default) or off: on, weights of
    /// the types with int8 kernels ([`Gpu::has_int8_kernels`]: the legacy types, the
    /// K-quants, IQ4_NL, IQ4_XS, IQ1_S..IQ3_S) multiply activations quantized as the CPU path quantizes
    /// them, with `dp4a` (`kernels/matmul_q8.cu`), so the products equal the CPU's to float
    /// rounding; off, every product dequantizes its weights to f32 and multiplies f32
    /// activations (`kernels/matmul.cu`).
    pub fn with_int8_activations(mut self, on: bool) -> Gpu {
        self.int8 = on;
        self
    }

    /// Whether products use int8 activations where the weight type has int8 kernels.
    pub fn int8_activations(&self) -> bool {
        self.int8
    }

    /// Whether prompt batches' int8 products run on tensor cores: the backend has them
    /// ([`GpuBackend::tensor_cores`]) and [`TENSOR_CORES_ENV`] is not `0`.
    pub fn tensor_cores(&self) -> bool {
        self.mma
    }

    pub fn backend(&self) -> &Arc<dyn GpuBackend> {
        &self.backend
    }

    pub fn name(&self) -> &str {
        self.backend.name()
    }

    pub fn synchronize(&self) -> Result<()> {
        self.backend.synchronize()
    }

    /// `y` rows = RMS-normed `x` rows times `w` (`n_rows` rows of `ncols`; may be in place).
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm(
        &self,
        x: DevPtr,
        x_stride: usize,
        w: DevPtr,
        y: DevPtr,
        y_stride: usize,
        n_rows: usize,
        ncols: usize,
        eps: f32,
    ) -> Result<()> {
        if n_rows == 0 {
            return Ok(());
        }
        let threads = (ncols.next_multiple_of(32) as u32).clamp(32, 1024);
        self.backend.launch(
            "rms_norm_f32",
            LaunchConfig::linear(row_grid(n_rows)?, threads),
            &[
                Arg::Ptr(x),
                Arg::Ptr(w),
                Arg::Ptr(y),
                int("ncols", ncols)?,
                int("x_stride", x_stride)?,
                int("y_stride", y_stride)?,
                Arg::F32(eps),
            ],
        )
    }

    fn elementwise(&self, kernel: &str, n: usize, args: &[Arg]) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        self.backend
            .launch(kernel, LaunchConfig::linear(ew_grid(n), EW_THREADS), args)
    }

    /// `y += x` over `n` values.
    pub fn add(&self, y: DevPtr, x: DevPtr, n: usize) -> Result<()> {
        self.elementwise("add_f32", n, &[Arg::Ptr(y), Arg::Ptr(x), int("n", n)?])
    }

    /// `y[i] += b[i % ncols]` over `n` values.
    pub fn add_bias(&self, y: DevPtr, b: DevPtr, n: usize, ncols: usize) -> Result<()> {
        self.elementwise(
            "add_bias_f32",
            n,
            &[Arg::Ptr(y), Arg::Ptr(b), int("n", n)?, int("ncols", ncols)?],
        )
    }

    /// `g = silu(g) * u` over `n` values.
    pub fn swiglu(&self, g: DevPtr, u: DevPtr, n: usize) -> Result<()> {
        self.elementwise("swiglu_f32", n, &[Arg::Ptr(g), Arg::Ptr(u), int("n", n)?])
    }

    /// Copy `n_cols` values of `n_rows` rows between strided layouts.
    pub fn copy_rows(
        &self,
        dst: DevPtr,
        dst_stride: usize,
        src: DevPtr,
        src_stride: usize,
        n_rows: usize,
        n_cols: usize,
    ) -> Result<()> {
        if n_rows == 0 || n_cols == 0 {
            return Ok(());
        }
        self.backend.launch(
            "copy_rows_f32",
            LaunchConfig::linear(row_grid(n_rows)?.min(EW_MAX_BLOCKS * 16), 128),
            &[
                Arg::Ptr(dst),
                int("dst_stride", dst_stride)?,
                Arg::Ptr(src),
                int("src_stride", src_stride)?,
                int("n_rows", n_rows)?,
                int("n_cols", n_cols)?,
            ],
        )
    }

    /// Rotary embedding of `n_tok` tokens × `n_head` heads in `x` (head `h` of token `t` at
    /// `t * tok_stride + h * head_stride`, rotating from `offset`), with `cs` holding
    /// (cos, sin) for each token and pair (`n_pairs` per token).
    #[allow(clippy::too_many_arguments)]
    pub fn rope(
        &self,
        x: DevPtr,
        cs: DevPtr,
        n_tok: usize,
        n_head: usize,
        head_stride: usize,
        tok_stride: usize,
        offset: usize,
        n_pairs: usize,
        neox: bool,
    ) -> Result<()> {
        if n_tok == 0 || n_head == 0 || n_pairs == 0 {
            return Ok(());
        }
        for t0 in (0..n_tok).step_by(MAX_GRID_YZ) {
            let nt = (n_tok - t0).min(MAX_GRID_YZ);
            self.backend.launch(
                "rope_f32",
                LaunchConfig {
                    grid: [row_grid(n_head)?, nt as u32, 1],
                    block: [(n_pairs.next_multiple_of(32) as u32).min(256), 1, 1],
                    shared_bytes: 0,
                },
                &[
                    Arg::Ptr(x.offset::<f32>(t0 * tok_stride)),
                    Arg::Ptr(cs.offset::<f32>(t0 * n_pairs * 2)),
                    int("n_head", n_head)?,
                    int("head_stride", head_stride)?,
                    int("tok_stride", tok_stride)?,
                    int("offset", offset)?,
                    int("n_pairs", n_pairs)?,
                    Arg::I32(neox as i32),
                ],
            )?;
        }
        Ok(())
    }

    /// Store `n_rows` rows of `width` values of `src` (rows `src_stride` apart) as
    /// consecutive cache rows of type `ty` from `cache` (f32, f16, or q8_0 with `width` a
    /// multiple of 32).
    pub fn kv_store(
        &self,
        cache: DevPtr,
        ty: GgmlType,
        src: DevPtr,
        n_rows: usize,
        width: usize,
        src_stride: usize,
    ) -> Result<()> {
        if n_rows == 0 || width == 0 {
            return Ok(());
        }
        if ty == GgmlType::Q8_0 && !width.is_multiple_of(32) {
            return Err(Error::Unsupported(format!(
                "q8_0 cache rows of {width} values (whole blocks of 32 are needed)"
            )));
        }
        let (kernel, _) = kv_kernels(ty)?;
        self.backend.launch(
            kernel,
            LaunchConfig::linear(row_grid(n_rows)?.min(EW_MAX_BLOCKS * 16), 128),
            &[
                Arg::Ptr(cache),
                Arg::Ptr(src),
                int("n_rows", n_rows)?,
                int("width", width)?,
                int("src_stride", src_stride)?,
            ],
        )
    }

    /// Causal attention of `n_tok` query tokens (`q`: token-major, `n_head × dk` each) over
    /// the cache, which already holds their own positions (or only the selected ones, with
    /// `sel`); `out` gets `n_head × dv` per token. As the CPU does, the queries take the
    /// rounding of the keys' dot partner (f16, q8_0), and a prompt batch over f16 values whose
    /// context stays under [`ATTN_ROUND_PROBS_BELOW`] positions weights them with its
    /// probabilities normalised and rounded to f16.
    pub fn attention(
        &self,
        s: AttnShape,
        q: DevPtr,
        kv: KvView,
        sel: Option<Selection>,
        out: DevPtr,
        n_tok: usize,
    ) -> Result<()> {
        if n_tok == 0 {
            return Ok(());
        }
        if s.dk > ATTN_MAX_DK || s.dv > ATTN_MAX_DV {
            return Err(Error::Unsupported(format!(
                "attention heads of {} x {} (the GPU kernel takes keys up to {ATTN_MAX_DK} and \
                 values up to {ATTN_MAX_DV} wide)",
                s.dk, s.dv
            )));
        }
        if s.n_head_kv == 0 || !s.n_head.is_multiple_of(s.n_head_kv) {
            return Err(Error::Unsupported(format!(
                "{} query heads over {} kv heads",
                s.n_head, s.n_head_kv
            )));
        }
        let kernel = attention_kernel(kv.k_type, kv.v_type).ok_or_else(|| {
            Error::Unsupported(format!(
                "a cache of {} keys and {} values on the GPU (both f32, f16 or q8_0, or q8_0 \
                 with f16)",
                kv.k_type, kv.v_type
            ))
        })?;
        let round_p =
            n_tok > 1 && kv.v_type == GgmlType::F16 && s.pos0 + n_tok < ATTN_ROUND_PROBS_BELOW;
        // Blocks of up to `hb` heads sharing a kv head (MLA: every head shares the latent).
        let group = s.n_head / s.n_head_kv;
        let hb = group.min(self.attn_heads).min(ATTN_Q_FLOATS / s.dk.max(1));
        let blocks = s.n_head_kv * group.div_ceil(hb);
        for t0 in (0..n_tok).step_by(MAX_GRID_YZ) {
            let nt = (n_tok - t0).min(MAX_GRID_YZ);
            let (list, counts, stride) = match sel {
                Some(sl) => (
                    sl.list.offset::<i32>(t0 * sl.stride),
                    sl.counts.offset::<i32>(t0),
                    sl.stride,
                ),
                None => (DevPtr::NULL, DevPtr::NULL, 0),
            };
            self.backend.launch(
                kernel,
                LaunchConfig {
                    grid: [row_grid(blocks)?, nt as u32, 1],
                    block: [ATTN_THREADS, 1, 1],
                    shared_bytes: 0,
                },
                &[
                    Arg::Ptr(q.offset::<f32>(t0 * s.n_head * s.dk)),
                    Arg::Ptr(kv.k),
                    Arg::Ptr(kv.v),
                    Arg::Ptr(out.offset::<f32>(t0 * s.n_head * s.dv)),
                    int("n_head", s.n_head)?,
                    int("n_head_kv", s.n_head_kv)?,
                    int("dk", s.dk)?,
                    int("dv", s.dv)?,
                    int("k_row", kv.k_row)?,
                    int("v_row", kv.v_row)?,
                    int("pos0", s.pos0 + t0)?,
                    Arg::F32(s.scale),
                    Arg::Ptr(list),
                    Arg::Ptr(counts),
                    int("sel_stride", stride)?,
                    Arg::I32(round_p as i32),
                    int("hb", hb)?,
                ],
            )?;
        }
        Ok(())
    }

    /// Count `n_tok` tokens' routes (`ids`/`weights`, `k` each) into `tally`, a buffer of
    /// [`route_tally_words`] 32-bit words (tokens, counts and weight per expert, per `phase`:
    /// 0 for a prompt batch, 1 for one token), for routing telemetry.
    #[allow(clippy::too_many_arguments)]
    pub fn route_tally(
        &self,
        ids: DevPtr,
        weights: DevPtr,
        n_tok: usize,
        k: usize,
        n_expert: usize,
        phase: usize,
        tally: DevPtr,
    ) -> Result<()> {
        if n_tok == 0 || k == 0 {
            return Ok(());
        }
        if phase > 1 {
            return Err(Error::Unsupported(format!("routing phase {phase}")));
        }
        let n_sel = n_tok * k;
        let threads = 128u32;
        let blocks = n_sel.div_ceil(threads as usize).min(EW_MAX_BLOCKS as usize) as u32;
        self.backend.launch(
            "route_tally",
            LaunchConfig::linear(blocks, threads),
            &[
                Arg::Ptr(ids),
                Arg::Ptr(weights),
                int("n_sel", n_sel)?,
                int("n_tok", n_tok)?,
                int("n_expert", n_expert)?,
                int("phase", phase)?,
                Arg::Ptr(tally),
            ],
        )
    }

    /// Choose experts for `n_tok` tokens from their router `logits` (`n_expert` each):
    /// `ids` (i32) and `weights` (f32) get `k` per token.
    pub fn route(
        &self,
        r: RouteSpec,
        logits: DevPtr,
        bias: Option<DevPtr>,
        ids: DevPtr,
        weights: DevPtr,
        n_tok: usize,
    ) -> Result<()> {
        if n_tok == 0 {
            return Ok(());
        }
        if r.n_expert > ROUTE_MAX_EXPERTS || r.n_groups > ROUTE_MAX_GROUPS || r.k > r.n_expert {
            return Err(Error::Unsupported(format!(
                "routing {} of {} experts in {} groups on the GPU (at most {ROUTE_MAX_EXPERTS} \
                 experts and {ROUTE_MAX_GROUPS} groups)",
                r.k, r.n_expert, r.n_groups
            )));
        }
        // One warp per token.
        let blocks = u32::try_from(n_tok)
            .map_err(|_| Error::Unsupported(format!("routing {n_tok} tokens at once")))?;
        self.backend.launch(
            "route_f32",
            LaunchConfig::linear(blocks, 32),
            &[
                Arg::Ptr(logits),
                Arg::Ptr(bias.unwrap_or(logits)),
                Arg::I32(bias.is_some() as i32),
                Arg::Ptr(ids),
                Arg::Ptr(weights),
                int("n_tok", n_tok)?,
                int("n_expert", r.n_expert)?,
                int("k", r.k)?,
                Arg::I32(r.sigmoid as i32),
                int("n_groups", r.n_groups)?,
                int("n_group_used", r.n_group_used)?,
                Arg::I32(r.norm as i32),
                Arg::F32(r.scale),
            ],
        )
    }

    /// `y *= s` over `n` values.
    pub fn scale(&self, y: DevPtr, s: f32, n: usize) -> Result<()> {
        self.elementwise("scale_f32", n, &[Arg::Ptr(y), Arg::F32(s), int("n", n)?])
    }

    /// LayerNorm of `n_rows` contiguous rows of `ncols` (`x` into `y`, which may be `x`),
    /// then times `w` and plus `b` where given.
    #[allow(clippy::too_many_arguments)]
    pub fn layer_norm(
        &self,
        x: DevPtr,
        w: Option<DevPtr>,
        b: Option<DevPtr>,
        y: DevPtr,
        n_rows: usize,
        ncols: usize,
        eps: f32,
    ) -> Result<()> {
        if n_rows == 0 {
            return Ok(());
        }
        let threads = (ncols.next_multiple_of(32) as u32).clamp(32, 1024);
        self.backend.launch(
            "layer_norm_f32",
            LaunchConfig::linear(row_grid(n_rows)?, threads),
            &[
                Arg::Ptr(x),
                Arg::Ptr(w.unwrap_or(DevPtr::NULL)),
                Arg::Ptr(b.unwrap_or(DevPtr::NULL)),
                Arg::Ptr(y),
                int("ncols", ncols)?,
                Arg::F32(eps),
            ],
        )
    }

    /// DeepSeek sparse attention's indexer scores of `n_tok` query tokens at positions
    /// `pos0..`: for token `t` and every position `j <= pos0 + t`,
    /// `scores[t * stride + j] = Σ_h relu(q[t, h] · keys[j]) · w[t, h]` (`q`: `n_head` heads of
    /// `dim` per token; `keys`: one row of `dim` per position, f32, f16 or q8_0; `w`: `n_head`
    /// per token).
    #[allow(clippy::too_many_arguments)]
    pub fn dsa_scores(
        &self,
        q: DevPtr,
        keys: DevPtr,
        keys_type: GgmlType,
        w: DevPtr,
        scores: DevPtr,
        stride: usize,
        n_tok: usize,
        n_head: usize,
        dim: usize,
        pos0: usize,
    ) -> Result<()> {
        if n_tok == 0 {
            return Ok(());
        }
        if pos0 + n_tok > stride {
            return Err(Error::Unsupported(format!(
                "indexer scores of {} positions in rows of {stride}",
                pos0 + n_tok
            )));
        }
        let (_, kernel) = kv_kernels(keys_type)?;
        self.backend.launch(
            kernel,
            LaunchConfig::linear(row_grid(n_tok)?, 128),
            &[
                Arg::Ptr(q),
                Arg::Ptr(keys),
                Arg::Ptr(w),
                Arg::Ptr(scores),
                int("n_head", n_head)?,
                int("dim", dim)?,
                int("pos0", pos0)?,
                int("stride", stride)?,
            ],
        )
    }

    /// The `k` best-scored positions of each of `n_tok` query tokens (rows of `stride` scores,
    /// token `t` at position `pos0 + t` scoring positions `0..=pos0 + t`), as a [`Selection`]
    /// into `list` (`n_tok × k` i32) and `counts` (`n_tok` i32; -1 where a token sees no more
    /// than `k` positions). Ties are broken as `std::partial_sort` does, like the CPU.
    #[allow(clippy::too_many_arguments)]
    pub fn dsa_top_k(
        &self,
        scores: DevPtr,
        stride: usize,
        n_tok: usize,
        pos0: usize,
        k: usize,
        list: DevPtr,
        counts: DevPtr,
    ) -> Result<Selection> {
        if n_tok > 0 {
            self.backend.launch(
                "dsa_top_k",
                LaunchConfig::linear(n_tok.div_ceil(64) as u32, 64),
                &[
                    Arg::Ptr(scores),
                    int("stride", stride)?,
                    int("n_tok", n_tok)?,
                    int("pos0", pos0)?,
                    int("k", k)?,
                    Arg::Ptr(list),
                    Arg::Ptr(counts),
                ],
            )?;
        }
        Ok(Selection {
            list,
            counts,
            stride: k,
        })
    }

    /// `out[t] (+)= Σ_j weights[t, j] · rows[t·k + j]` for `n_tok` tokens of `n_embd`.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_sum(
        &self,
        rows: DevPtr,
        weights: DevPtr,
        out: DevPtr,
        n_tok: usize,
        k: usize,
        n_embd: usize,
        accumulate: bool,
    ) -> Result<()> {
        if n_tok == 0 || n_embd == 0 {
            return Ok(());
        }
        for t0 in (0..n_tok).step_by(MAX_GRID_YZ) {
            let nt = (n_tok - t0).min(MAX_GRID_YZ);
            self.backend.launch(
                "moe_sum_f32",
                LaunchConfig {
                    grid: [n_embd.div_ceil(256) as u32, nt as u32, 1],
                    block: [256, 1, 1],
                    shared_bytes: 0,
                },
                &[
                    Arg::Ptr(rows.offset::<f32>(t0 * k * n_embd)),
                    Arg::Ptr(weights.offset::<f32>(t0 * k)),
                    Arg::Ptr(out.offset::<f32>(t0 * n_embd)),
                    int("n_tok", nt)?,
                    int("k", k)?,
                    int("n_embd", n_embd)?,
                    Arg::I32(accumulate as i32),
                ],
            )?;
        }
        Ok(())
    }

    /// `y[i] *= sigmoid(g[i / group])` over `n` values (`group` consecutive values share a
    /// gate).
    pub fn mul_sigmoid(&self, y: DevPtr, g: DevPtr, n: usize, group: usize) -> Result<()> {
        if group == 0 {
            return Err(Error::Unsupported("mul_sigmoid with group 0".into()));
        }
        self.elementwise(
            "mul_sigmoid_f32",
            n,
            &[Arg::Ptr(y), Arg::Ptr(g), int("n", n)?, int("group", group)?],
        )
    }

    /// Gated DeltaNet's β = sigmoid(b) and g = softplus(α + `dt_bias`) · `a` per token and
    /// value head from `ba` (per token and key head: β then α of its value heads).
    #[allow(clippy::too_many_arguments)]
    pub fn delta_net_gates(
        &self,
        dims: DeltaNetDims,
        ba: DevPtr,
        dt_bias: DevPtr,
        a: DevPtr,
        beta: DevPtr,
        g: DevPtr,
        n_tok: usize,
    ) -> Result<()> {
        check_delta_net(dims)?;
        self.elementwise(
            "delta_net_gates_f32",
            n_tok * dims.n_v,
            &[
                Arg::Ptr(ba),
                Arg::Ptr(dt_bias),
                Arg::Ptr(a),
                Arg::Ptr(beta),
                Arg::Ptr(g),
                int("n_tok", n_tok)?,
                int("n_v", dims.n_v)?,
                int("r", dims.n_v / dims.n_k)?,
            ],
        )
    }

    /// The causal convolution (`k` taps per channel in `w`) of `n_tok` rows of `ch` channels
    /// `x` continuing `state` (the last `k - 1` inputs per channel, updated), with SiLU, into
    /// `out` (not `x`).
    #[allow(clippy::too_many_arguments)]
    pub fn ssm_conv_silu(
        &self,
        x: DevPtr,
        state: DevPtr,
        w: DevPtr,
        out: DevPtr,
        n_tok: usize,
        ch: usize,
        k: usize,
    ) -> Result<()> {
        if !(1..=CONV_MAX_K).contains(&k) {
            return Err(Error::Unsupported(format!(
                "a convolution of {k} taps (the GPU kernel takes 1 to {CONV_MAX_K})"
            )));
        }
        if n_tok == 0 || ch == 0 {
            return Ok(());
        }
        let threads = 128u32;
        self.backend.launch(
            "ssm_conv_silu_f32",
            LaunchConfig::linear(ch.div_ceil(threads as usize) as u32, threads),
            &[
                Arg::Ptr(x),
                Arg::Ptr(state),
                Arg::Ptr(w),
                Arg::Ptr(out),
                int("n_tok", n_tok)?,
                int("ch", ch)?,
                int("k", k)?,
            ],
        )
    }

    /// The gated delta rule over `n_tok` tokens: `conv` holds the convolved q | k | v rows
    /// (`dims.channels()` per token), `beta` and `g` one value per token and value head, `ssm`
    /// the value heads' transposed `d × d` states (updated); `out` gets `n_v × d` per token.
    /// q and k are L2-normed with `eps` here.
    #[allow(clippy::too_many_arguments)]
    pub fn gated_delta_net(
        &self,
        dims: DeltaNetDims,
        conv: DevPtr,
        beta: DevPtr,
        g: DevPtr,
        ssm: DevPtr,
        out: DevPtr,
        n_tok: usize,
        eps: f32,
    ) -> Result<()> {
        check_delta_net(dims)?;
        if n_tok == 0 {
            return Ok(());
        }
        self.backend.launch(
            "gated_delta_net_f32",
            LaunchConfig::linear(row_grid(dims.n_v)?, dims.d as u32),
            &[
                Arg::Ptr(conv),
                Arg::Ptr(beta),
                Arg::Ptr(g),
                Arg::Ptr(ssm),
                Arg::Ptr(out),
                int("n_tok", n_tok)?,
                int("n_k", dims.n_k)?,
                int("n_v", dims.n_v)?,
                int("d", dims.d)?,
                int("ch", dims.channels())?,
                Arg::F32(eps),
            ],
        )
    }
}

/// The head shapes the DeltaNet kernels take: value heads a multiple of the key heads, a head
/// width that is a whole number of warps up to the kernel's limit.
fn check_delta_net(d: DeltaNetDims) -> Result<()> {
    if d.n_k == 0 || !d.n_v.is_multiple_of(d.n_k) {
        return Err(Error::Unsupported(format!(
            "gated DeltaNet with {} value heads over {} key heads",
            d.n_v, d.n_k
        )));
    }
    if d.d == 0 || !d.d.is_multiple_of(32) || d.d > GDN_MAX_D {
        return Err(Error::Unsupported(format!(
            "gated DeltaNet heads of {} (the GPU kernel takes multiples of 32 up to {GDN_MAX_D})",
            d.d
        )));
    }
    Ok(())
}
