//! The transformer shared by the supported MoE architectures: pre-norm blocks of attention
//! (GQA or MLA) and a feed-forward part (dense, or routed experts plus shared experts).
//! The per-architecture files in `arch/` only read hyper-parameters and name tensors; the
//! forward pass below reads like the model card: norm → attention → residual → norm → FFN →
//! residual.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use moxie_gguf::GgufFile;
use moxie_quant::GgmlType;

use crate::config::{Arch, Config, Gating};
use crate::device::{DeviceId, Devices, Reservation, Resident, CPU};
use crate::inventory::Role;
use crate::kv_cache::{CacheRows, KvCache, KvTypes, LayerKvShape};
use crate::moe::MoeScratch;
use crate::ops::{self, f16_round};
use crate::parallel::{Numerics, Parallel};
use crate::tensor::{ChunkedLayout, QuantizedActs, Tensor};
use crate::{Error, Result};

/// Grouped-query attention with optional q/k/v biases and per-head q/k RMS norms
/// (qwen3moe, glm4moe).
pub struct Gqa {
    pub wq: Tensor,
    pub wk: Tensor,
    pub wv: Tensor,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub wo: Tensor,
}

/// Multi-head latent attention in llama.cpp's absorbed layout (deepseek2): the cache holds
/// the normed latent plus the rotary key; `attn_k_b` folds into the queries and `attn_v_b`
/// expands the attended latent per head.
pub struct Mla {
    /// `attn_q_a` + `attn_q_a_norm`, absent in "lite" models that have a plain `attn_q`.
    pub wq_a: Option<(Tensor, Vec<f32>)>,
    /// `attn_q_b` (or `attn_q` without q-lora).
    pub wq_b: Tensor,
    pub wkv_a: Tensor,
    pub kv_a_norm: Vec<f32>,
    pub wk_b: Tensor,
    pub wv_b: Tensor,
    pub wo: Tensor,
}

pub enum Attention {
    Gqa(Gqa),
    Mla(Mla),
}

/// A gated (SwiGLU) feed-forward block.
pub struct DenseFfn {
    pub gate: Tensor,
    pub up: Tensor,
    pub down: Tensor,
}

impl DenseFfn {
    fn matrices(&self) -> [&Tensor; 3] {
        [&self.gate, &self.up, &self.down]
    }
}

/// Routed experts (+ optional shared experts).
pub struct Moe {
    pub router: Tensor,
    /// `exp_probs_b`: selection bias added to probabilities for choosing experts only.
    pub probs_bias: Option<Vec<f32>>,
    pub gate_exps: Tensor,
    pub up_exps: Tensor,
    pub down_exps: Tensor,
    pub shared: Option<DenseFfn>,
}

pub enum Ffn {
    Dense(Box<DenseFfn>),
    Moe(Box<Moe>),
}

pub struct Layer {
    pub attn_norm: Vec<f32>,
    pub attn: Attention,
    /// `ffn_norm` (or glm4moe's `post_attention_norm`).
    pub ffn_norm: Vec<f32>,
    pub ffn: Ffn,
}

/// Which rows of logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    All,
    Last,
    /// Only fill the KV cache (prompt chunks whose logits nobody reads).
    None,
}

pub struct Model {
    pub config: Config,
    pub file: Arc<GgufFile>,
    pub tok_embd: Tensor,
    pub output_norm: Vec<f32>,
    pub output: Tensor,
    pub layers: Vec<Layer>,
    /// The CPU and any accelerators the model is placed on.
    pub devices: Devices,
    /// Where each layer's stages run.
    pub layer_devices: Vec<LayerDevices>,
    /// Device memory of the tensors kept as host vectors (held until the model is dropped).
    _vectors_memory: Vec<Reservation>,
    /// Buffers forward passes reuse, so decode does not allocate them per token.
    scratch: ScratchPool,
    /// Each layer's vectors in the memory of the GPUs its stages run on (empty off GPUs).
    pub(crate) gpu_vectors: Vec<crate::gpu_forward::LayerVectors>,
    pub(crate) gpu_output_norm: Option<moxie_gpu::Buffer>,
    /// GPU work buffers kept between forward passes.
    pub(crate) gpu_scratch: crate::gpu_forward::GpuScratchPool,
    /// Batches of at least this many tokens stream host-resident routed experts to the GPU
    /// running their layer's FFN part (`usize::MAX`: never). See [`Model::calibrate_op_offload`].
    op_offload_min_batch: std::sync::atomic::AtomicUsize,
}

/// MoE buffers for forward passes: each pass takes a set and gives it back, so concurrent
/// passes (several sequences) never share one and a pass after the first allocates nothing.
#[derive(Default)]
struct ScratchPool(Mutex<Vec<MoeScratch>>);

impl ScratchPool {
    fn take(&self) -> MoeScratch {
        let mut pool = self.0.lock().unwrap_or_else(|p| p.into_inner());
        pool.pop().unwrap_or_default()
    }

    fn give(&self, s: MoeScratch) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(s);
    }
}

/// Tensor lookup with the architecture's expected shapes; each tensor goes where the
/// placement says (copied into an accelerator's memory, or left mapped on the CPU).
pub(crate) struct TensorSource<'a> {
    pub file: &'a Arc<GgufFile>,
    placement: &'a Placement,
    /// Every tensor loaded so far, with its device (to check each layer stage stays on one).
    loaded: RefCell<Vec<(String, DeviceId)>>,
    /// Device memory of small tensors kept as host vectors (norms, biases), which a real
    /// accelerator would hold too.
    held: RefCell<Vec<Reservation>>,
}

impl TensorSource<'_> {
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.opt(name, shape)?
            .ok_or_else(|| Error::Model(format!("missing tensor '{name}'")))
    }

    pub fn opt(&self, name: &str, shape: &[usize]) -> Result<Option<Tensor>> {
        let Some(t) = self.mapped(name, shape)? else {
            return Ok(None);
        };
        let dev = self.placement.device_of(name);
        Ok(Some(t.to_device(&self.placement.devices, dev)?))
    }

    /// Whether the file has a tensor called `name` (nothing is loaded).
    pub fn has(&self, name: &str) -> bool {
        self.file.tensors().iter().any(|t| t.name == name)
    }

    fn mapped(&self, name: &str, shape: &[usize]) -> Result<Option<Tensor>> {
        let Some(index) = self.file.tensors().iter().position(|t| t.name == name) else {
            return Ok(None);
        };
        let t = Tensor::mapped(self.file, index)?;
        t.expect_shape(shape)?;
        let dev = self.placement.device_of(name);
        self.loaded.borrow_mut().push((name.to_string(), dev));
        Ok(Some(t))
    }

    /// A small tensor (norm weight, bias) as f32.
    pub fn vec(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        self.vec_opt(name, len)?
            .ok_or_else(|| Error::Model(format!("missing tensor '{name}'")))
    }

    pub fn vec_opt(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
        let Some(t) = self.mapped(name, &[len])? else {
            return Ok(None);
        };
        let dev = self.placement.device_of(name);
        if dev != CPU {
            let what = format!("tensor '{name}'");
            let bytes = t.data().len();
            let r = self.placement.devices.reserve(dev, bytes as u64, &what)?;
            self.placement.devices.count_copy(CPU, dev, bytes);
            self.held.borrow_mut().push(r);
        }
        t.to_f32().map(Some)
    }

    /// The device each stage of layer `il` runs on, from where its tensors were placed; every
    /// tensor of a stage must be on that device.
    fn layer_devices(&self, il: usize) -> Result<LayerDevices> {
        let prefix = format!("blk.{il}.");
        let loaded = self.loaded.borrow();
        let mut stages: [Option<(&str, DeviceId)>; 3] = [None; 3];
        for (name, dev) in loaded.iter().filter(|(n, _)| n.starts_with(&prefix)) {
            let stage = Stage::of(name, &name[prefix.len()..]);
            match stages[stage as usize] {
                None => stages[stage as usize] = Some((name, *dev)),
                Some((first, d)) if d != *dev => {
                    let devs = &self.placement.devices;
                    return Err(Error::Model(format!(
                        "layer {il}: '{first}' is on {} but '{name}' is on {}; moxie runs a \
                         layer's {} on one device, so place its tensors together",
                        devs.get(d).name,
                        devs.get(*dev).name,
                        stage.describe()
                    )));
                }
                Some(_) => {}
            }
        }
        let dev = |st: Stage| stages[st as usize].map(|(_, d)| d);
        let attn = dev(Stage::Attention).unwrap_or(CPU);
        let ffn = dev(Stage::Ffn).unwrap_or(attn);
        Ok(LayerDevices {
            attn,
            ffn,
            experts: dev(Stage::Experts).unwrap_or(ffn),
        })
    }
}

/// The rows an MoE layer with its routed experts on another device sends there (its normed
/// input) and gets back (their weighted sum), kept for all layers of a forward pass.
struct SplitMoeBuffers<'d> {
    input: Resident<'d>,
    sum: Resident<'d>,
}

/// The parts of a layer that each run on one device.
#[derive(Clone, Copy)]
enum Stage {
    /// Attention norm, projections, q/k norms, biases (and the layer's KV cache).
    Attention,
    /// FFN norm, dense FFN or router, selection bias and shared expert.
    Ffn,
    /// Routed experts (`*_exps`).
    Experts,
}

impl Stage {
    /// The stage of block tensor `name`, from its role ([`Role::of`]); `local` is the name
    /// after its `blk.N.` prefix.
    fn of(name: &str, local: &str) -> Stage {
        match Role::of(name) {
            Role::RoutedExperts => Stage::Experts,
            Role::SharedExperts | Role::Router | Role::DenseFfn => Stage::Ffn,
            // The FFN's own norm (glm4moe's is `post_attention_norm`); other norms are
            // attention's.
            Role::Norms
                if local.starts_with("ffn_norm") || local.starts_with("post_attention_norm") =>
            {
                Stage::Ffn
            }
            _ => Stage::Attention,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Stage::Attention => "attention",
            Stage::Ffn => "FFN norm, router and shared or dense FFN",
            Stage::Experts => "routed experts",
        }
    }
}

/// Where each stage of a layer runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerDevices {
    /// Attention and the layer's KV cache.
    pub attn: DeviceId,
    /// FFN norm, router, shared expert or dense FFN.
    pub ffn: DeviceId,
    /// Routed experts (the same as `ffn` for a dense layer).
    pub experts: DeviceId,
}

/// Where a model's tensors go: its devices and a device per tensor name (a tensor not listed
/// stays on the CPU).
#[derive(Default)]
pub struct Placement {
    pub devices: Devices,
    pub tensors: HashMap<String, DeviceId>,
}

impl Placement {
    pub fn device_of(&self, name: &str) -> DeviceId {
        self.tensors.get(name).copied().unwrap_or(CPU)
    }
}

impl Model {
    /// Build the model described by `file` (architecture from `general.architecture`), all on
    /// the CPU.
    pub fn load(file: Arc<GgufFile>) -> Result<Model> {
        Model::load_placed(file, &Placement::default())
    }

    /// Build the model with each tensor on the device `placement` gives it (weights for an
    /// accelerator are copied into its memory, within its budget).
    pub fn load_placed(file: Arc<GgufFile>, placement: &Placement) -> Result<Model> {
        let config = Config::from_metadata(file.metadata())?;
        let src = TensorSource {
            file: &file,
            placement,
            loaded: RefCell::new(Vec::new()),
            held: RefCell::new(Vec::new()),
        };
        let c = &config;
        let tok_embd = src.get("token_embd.weight", &[c.n_embd, c.n_vocab])?;
        let output_norm = src.vec("output_norm.weight", c.n_embd)?;
        let output = match src.opt("output.weight", &[c.n_embd, c.n_vocab])? {
            Some(t) => t,
            None => tok_embd.clone(),
        };
        if placement.device_of("output_norm.weight") != output.device {
            return Err(Error::Model(
                "output_norm.weight and the output projection must be on one device".into(),
            ));
        }
        let mut layers = Vec::with_capacity(c.n_layer);
        let mut layer_devices = Vec::with_capacity(c.n_layer);
        for il in 0..c.n_layer {
            let layer = match c.arch {
                Arch::Deepseek2 => crate::arch::deepseek2::load_layer(c, &src, il)?,
                Arch::Glm4Moe => crate::arch::glm4moe::load_layer(c, &src, il)?,
                Arch::Qwen3Moe => crate::arch::qwen3moe::load_layer(c, &src, il)?,
            };
            layers.push(layer);
            layer_devices.push(src.layer_devices(il)?);
        }
        let devices = placement.devices.clone();
        let gpu_vectors = layers
            .iter()
            .zip(&layer_devices)
            .map(|(l, ld)| crate::gpu_forward::LayerVectors::new(&devices, l, ld))
            .collect::<Result<Vec<_>>>()?;
        let gpu_output_norm = match devices.gpu(output.device) {
            Some(g) => Some(moxie_gpu::Buffer::from_f32(g.backend(), &output_norm)?),
            None => None,
        };
        let model = Model {
            config,
            file: Arc::clone(&file),
            tok_embd,
            output_norm,
            output,
            layers,
            devices,
            layer_devices,
            _vectors_memory: src.held.into_inner(),
            scratch: ScratchPool::default(),
            gpu_vectors,
            gpu_output_norm,
            gpu_scratch: Default::default(),
            op_offload_min_batch: std::sync::atomic::AtomicUsize::new(usize::MAX),
        };
        model.check_types()?;
        Ok(model)
    }

    /// The batch size from which host-resident routed experts are streamed to the GPU that
    /// runs their layer's router (llama.cpp's op offload), `None` when never.
    pub fn op_offload_min_batch(&self) -> Option<usize> {
        let v = self
            .op_offload_min_batch
            .load(std::sync::atomic::Ordering::Relaxed);
        (v != usize::MAX).then_some(v)
    }

    /// Set (or turn off, `None`) op offload's batch threshold.
    pub fn set_op_offload_min_batch(&self, min_batch: Option<usize>) {
        self.op_offload_min_batch.store(
            min_batch.unwrap_or(usize::MAX).max(1),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    fn check_types(&self) -> Result<()> {
        let mut mats: Vec<&Tensor> = vec![&self.output];
        for l in &self.layers {
            match &l.attn {
                Attention::Gqa(a) => mats.extend([&a.wq, &a.wk, &a.wv, &a.wo]),
                Attention::Mla(a) => {
                    if let Some((t, _)) = &a.wq_a {
                        mats.push(t);
                    }
                    mats.extend([&a.wq_b, &a.wkv_a, &a.wk_b, &a.wv_b, &a.wo]);
                }
            }
            match &l.ffn {
                Ffn::Dense(f) => mats.extend(f.matrices()),
                Ffn::Moe(m) => {
                    mats.extend([&m.router, &m.gate_exps, &m.up_exps, &m.down_exps]);
                    if let Some(s) = &m.shared {
                        mats.extend(s.matrices());
                    }
                }
            }
        }
        for t in mats {
            t.matrix()?;
        }
        // token_embd is only read row by row: it needs a dequantizer.
        if moxie_quant::dequantize_fn(self.tok_embd.ty).is_none() {
            return Err(Error::Model(format!(
                "tensor 'token_embd.weight' has type {}, which moxie cannot read yet",
                self.tok_embd.ty
            )));
        }
        Ok(())
    }

    /// Cache geometry of every layer.
    pub fn kv_shapes(&self) -> Vec<LayerKvShape> {
        let c = &self.config;
        self.layers
            .iter()
            .map(|l| match l.attn {
                Attention::Gqa(_) => LayerKvShape {
                    k_width: c.n_head_kv * c.head_dim_k,
                    v_width: c.n_head_kv * c.head_dim_v,
                    head_k: c.head_dim_k,
                    head_v: c.head_dim_v,
                },
                // One latent "head"; values are its first kv_lora_rank elements.
                Attention::Mla(_) => LayerKvShape {
                    k_width: c.kv_lora_rank + c.n_rot,
                    v_width: 0,
                    head_k: c.kv_lora_rank + c.n_rot,
                    head_v: c.kv_lora_rank,
                },
            })
            .collect()
    }

    /// An f16 KV cache for `n_ctx` positions (the model's training context when `None`).
    pub fn new_cache(&self, n_ctx: Option<usize>) -> Result<KvCache> {
        self.new_cache_typed(n_ctx, KvTypes::default())
    }

    /// A KV cache of `types` (llama.cpp's `-ctk` / `-ctv`; MLA layers keep only keys) for
    /// `n_ctx` positions. Each layer's part is held in the memory of the device its attention
    /// runs on, for the whole context. Fails if the heads do not fit the types' blocks or a
    /// device's budget cannot hold its layers' part.
    pub fn new_cache_typed(&self, n_ctx: Option<usize>, types: KvTypes) -> Result<KvCache> {
        let n_ctx = n_ctx.unwrap_or(self.config.n_ctx_train);
        let mut cache = KvCache::typed(self.kv_shapes(), n_ctx, types)?;
        for (il, ld) in self.layer_devices.iter().enumerate() {
            if ld.attn != CPU {
                let bytes = cache.layer_bytes_when_full(il) as u64;
                let what = format!("the KV cache of layer {il} ({n_ctx} positions)");
                cache.hold(self.devices.reserve(ld.attn, bytes, &what)?);
            }
            if let Some(gpu) = self.devices.gpu(ld.attn) {
                let kv = crate::gpu_forward::new_layer_cache(gpu, cache.shape(il), n_ctx, types)
                    .map_err(|e| {
                        Error::Model(format!("the KV cache of layer {il} on {}: {e}", gpu.name()))
                    })?;
                cache.set_gpu(il, kv);
            }
        }
        Ok(cache)
    }

    /// A prompt after what `cache` holds, in micro-batches of `ubatch` tokens; returns the
    /// last token's logits (only the last micro-batch asks for any).
    pub fn prefill(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        par: &Parallel,
        ubatch: usize,
    ) -> Result<Vec<f32>> {
        let ub = ubatch.max(1);
        let n_chunks = tokens.len().div_ceil(ub);
        let mut logits = Vec::new();
        for (i, chunk) in tokens.chunks(ub).enumerate() {
            let which = if i + 1 == n_chunks {
                Logits::Last
            } else {
                Logits::None
            };
            logits = self.forward(chunk, cache, par, which)?;
        }
        Ok(logits)
    }

    /// Run `tokens` (at the positions following what `cache` holds) through the model and
    /// return logits (`n_vocab` per returned row).
    pub fn forward(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        par: &Parallel,
        which: Logits,
    ) -> Result<Vec<f32>> {
        let c = &self.config;
        let n = tokens.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        cache.check_room(n)?;
        for &t in tokens {
            if t as usize >= c.n_vocab {
                return Err(Error::BadToken {
                    id: t,
                    n_vocab: c.n_vocab,
                });
            }
        }
        let pos0 = cache.len();
        // RoPE's (cos, sin) per token: the same for every layer, so computed once.
        let rope: Vec<Vec<(f32, f32)>> = (0..n)
            .map(|t| {
                let mut rc = Vec::new();
                c.rope.cache((pos0 + t) as i64, &mut rc);
                rc
            })
            .collect();
        let mut gpu = crate::gpu_forward::GpuPass::new(self, &rope, pos0);
        let result = self.layers_and_output(tokens, &rope, cache, par, which, &mut gpu);
        let finished = gpu.finish();
        let logits = result?;
        finished?;
        cache.commit(n);
        Ok(logits)
    }

    /// The forward pass proper: embeddings, every layer's stages on their devices, the head.
    fn layers_and_output(
        &self,
        tokens: &[u32],
        rope: &[Vec<(f32, f32)>],
        cache: &mut KvCache,
        par: &Parallel,
        which: Logits,
        gpu: &mut crate::gpu_forward::GpuPass<'_>,
    ) -> Result<Vec<f32>> {
        let c = &self.config;
        let n = tokens.len();
        let n_embd = c.n_embd;
        let is_gpu = |d: DeviceId| self.devices.gpu(d).is_some();
        // The residual stream moves to each stage's device; `h` is that stage's normed copy.
        let mut x = if is_gpu(self.tok_embd.device) {
            let mut x = Resident::new(&self.devices, CPU, Vec::new());
            gpu.embed(tokens, &mut x)?;
            x
        } else {
            let mut x0 = vec![0f32; n * n_embd];
            for (&t, row) in tokens.iter().zip(x0.chunks_exact_mut(n_embd)) {
                self.tok_embd.row_to_f32(t as usize, row)?;
            }
            Resident::new(&self.devices, self.tok_embd.device, x0)
        };
        let mut h = vec![0f32; n * n_embd];
        let mut moe_scratch = self.scratch.take();
        let mut split = SplitMoeBuffers {
            input: Resident::new(&self.devices, CPU, Vec::new()),
            sum: Resident::new(&self.devices, CPU, Vec::new()),
        };
        for (il, (layer, ld)) in self.layers.iter().zip(&self.layer_devices).enumerate() {
            if is_gpu(ld.attn) {
                let xp = x.on_gpu(ld.attn)?;
                gpu.attention(il, ld.attn, xp, cache)?;
            } else {
                let xs = x.on(ld.attn)?;
                h.copy_from_slice(xs);
                ops::rms_norm_mul(&mut h, &layer.attn_norm, c.rms_eps);
                let attn_out = match &layer.attn {
                    Attention::Gqa(a) => self.gqa(a, il, &h, rope, cache, par)?,
                    Attention::Mla(a) => self.mla(a, il, &h, rope, cache, par)?,
                };
                ops::add_assign(xs, &attn_out);
            }
            if is_gpu(ld.ffn) {
                let xp = x.on_gpu(ld.ffn)?;
                gpu.ffn(il, ld, xp, par, &mut moe_scratch, &mut h)?;
                continue;
            }
            let xs = x.on(ld.ffn)?;
            h.copy_from_slice(xs);
            ops::rms_norm_mul(&mut h, &layer.ffn_norm, c.rms_eps);
            match &layer.ffn {
                Ffn::Dense(f) => ops::add_assign(xs, &dense_ffn(f, &h, n, None, par)?),
                Ffn::Moe(m) if ld.experts == ld.ffn => {
                    let out = crate::moe::forward(c, m, &h, n, par, &mut moe_scratch)?;
                    ops::add_assign(xs, out);
                }
                Ffn::Moe(m) => {
                    let out = self.split_moe(m, ld, &h, par, &mut moe_scratch, &mut split, gpu)?;
                    ops::add_assign(xs, out);
                }
            }
        }
        self.scratch.give(moe_scratch);

        let out_dev = self.output.device;
        let rows = match which {
            Logits::All => 0..n,
            Logits::Last => n - 1..n,
            Logits::None => return Ok(Vec::new()),
        };
        if is_gpu(out_dev) {
            let xp = x.on_gpu(out_dev)?;
            return gpu.output(out_dev, xp, rows);
        }
        let xs = x.on(out_dev)?;
        let rows = &mut xs[rows.start * n_embd..rows.end * n_embd];
        ops::rms_norm_mul(rows, &self.output_norm, c.rms_eps);
        let n_out = rows.len() / n_embd;
        let mut logits = vec![0f32; n_out * c.n_vocab];
        self.output.matrix()?.matmul(par, rows, &mut logits);
        if out_dev != CPU {
            // The logits come back to the host for sampling.
            let mut host = Vec::new();
            self.devices.copy(out_dev, &logits, CPU, &mut host);
            return Ok(host);
        }
        Ok(logits)
    }

    /// An MoE layer whose routed experts live on another device than its router and shared
    /// expert (e.g. `-ot exps=CPU` with the rest on a GPU): route on the layer's device, send
    /// the normed input and the routes to the experts' device, run them there, bring their
    /// weighted sum back and add the shared expert — the sum [`crate::moe::forward`] forms.
    #[allow(clippy::too_many_arguments)]
    fn split_moe<'b>(
        &self,
        m: &Moe,
        ld: &LayerDevices,
        h: &[f32],
        par: &Parallel,
        s: &mut crate::moe::MoeScratch,
        bufs: &'b mut SplitMoeBuffers<'_>,
        gpu: &mut crate::gpu_forward::GpuPass<'_>,
    ) -> Result<&'b [f32]> {
        let c = &self.config;
        let n = h.len() / c.n_embd;
        crate::moe::route(c, m, h, n, par, s)?;
        // The routes cross too: an expert id and a weight per selection.
        let route_bytes = std::mem::size_of_val(s.routes());
        self.devices.count_copy(ld.ffn, ld.experts, route_bytes);
        if let Some(g) = self.devices.gpu(ld.experts) {
            let g = g.clone();
            self.devices
                .count_copy(ld.ffn, ld.experts, std::mem::size_of_val(h));
            bufs.sum.fill(ld.ffn, |sum| {
                gpu.experts_on_gpu_from_host(&g, ld.experts, m, h, s, sum)
            })?;
            self.devices
                .count_copy(ld.experts, ld.ffn, std::mem::size_of_val(h));
        } else {
            bufs.input.load(ld.ffn, h);
            let routed = crate::moe::routed_experts(c, m, bufs.input.on(ld.experts)?, n, par, s)?;
            bufs.sum.load(ld.experts, routed);
        }
        let sum = bufs.sum.on(ld.ffn)?;
        if let Some(sh) = &m.shared {
            ops::add_assign(sum, &dense_ffn(sh, h, n, None, par)?);
        }
        Ok(sum)
    }

    fn gqa(
        &self,
        a: &Gqa,
        il: usize,
        h: &[f32],
        rope: &[Vec<(f32, f32)>],
        cache: &mut KvCache,
        par: &Parallel,
    ) -> Result<Vec<f32>> {
        let c = &self.config;
        // The batch's positions are committed after the last layer: until then the cache's
        // length is the position of its first token.
        let pos0 = cache.len();
        let n = h.len() / c.n_embd;
        let (hd, n_kv) = (c.head_dim_k, c.n_head_kv);
        let mut q = vec![0f32; n * c.n_head * hd];
        let mut k = vec![0f32; n * n_kv * hd];
        let mut v = vec![0f32; n * n_kv * c.head_dim_v];
        let wq = a.wq.matrix()?;
        let acts = QuantizedActs::new(wq.act_type(), c.n_embd, h);
        wq.matmul_q(par, &acts, &mut q);
        matmul_shared(&a.wk, &acts, h, par, &mut k)?;
        matmul_shared(&a.wv, &acts, h, par, &mut v)?;
        if let Some(b) = &a.bq {
            ops::add_bias(&mut q, b);
        }
        if let Some(b) = &a.bk {
            ops::add_bias(&mut k, b);
        }
        if let Some(b) = &a.bv {
            ops::add_bias(&mut v, b);
        }
        if let Some(w) = &a.q_norm {
            ops::rms_norm_mul(&mut q, w, c.rms_eps);
        }
        if let Some(w) = &a.k_norm {
            ops::rms_norm_mul(&mut k, w, c.rms_eps);
        }
        for (t, rc) in rope.iter().enumerate() {
            c.rope.apply(
                &mut q[t * c.n_head * hd..(t + 1) * c.n_head * hd],
                hd,
                0,
                rc,
            );
            c.rope
                .apply(&mut k[t * n_kv * hd..(t + 1) * n_kv * hd], hd, 0, rc);
        }
        cache.append(il, &k, &v);
        let mut out = vec![0f32; n * c.n_head * c.head_dim_v];
        attend(
            AttnGeom {
                n_head: c.n_head,
                n_head_kv: n_kv,
                dk: hd,
                dv: c.head_dim_v,
                kq_scale: c.kq_scale(),
                pos0,
            },
            &q,
            cache.keys(il),
            Some(cache.values(il)),
            &mut out,
            par,
        );
        let mut o = vec![0f32; n * c.n_embd];
        a.wo.matrix()?.matmul(par, &out, &mut o);
        Ok(o)
    }

    fn mla(
        &self,
        a: &Mla,
        il: usize,
        h: &[f32],
        rope: &[Vec<(f32, f32)>],
        cache: &mut KvCache,
        par: &Parallel,
    ) -> Result<Vec<f32>> {
        let c = &self.config;
        // The batch's positions are committed after the last layer: until then the cache's
        // length is the position of its first token.
        let pos0 = cache.len();
        let n = h.len() / c.n_embd;
        let (n_head, rank, n_rot) = (c.n_head, c.kv_lora_rank, c.n_rot);
        let dk = c.head_dim_k_mla;
        let nope = dk - n_rot;
        let dv = c.head_dim_v_mla;

        // Queries: optional low-rank compression, then per head [nope | rope].
        let mut q = vec![0f32; n * n_head * dk];
        let acts_h;
        match &a.wq_a {
            Some((wq_a, norm)) => {
                let m = wq_a.matrix()?;
                acts_h = QuantizedActs::new(m.act_type(), c.n_embd, h);
                let mut qa = vec![0f32; n * m.n_out];
                m.matmul_q(par, &acts_h, &mut qa);
                ops::rms_norm_mul(&mut qa, norm, c.rms_eps);
                a.wq_b.matrix()?.matmul(par, &qa, &mut q);
            }
            None => {
                let m = a.wq_b.matrix()?;
                acts_h = QuantizedActs::new(m.act_type(), c.n_embd, h);
                m.matmul_q(par, &acts_h, &mut q);
            }
        }
        // Latent + rotary key.
        let kw = rank + n_rot;
        let mut kv = vec![0f32; n * kw];
        matmul_shared(&a.wkv_a, &acts_h, h, par, &mut kv)?;

        // Absorbed queries [latent (rank) | rope (n_rot)] per head.
        let qw = rank + n_rot;
        let mut qfull = vec![0f32; n * n_head * qw];
        per_head_products(par, &a.wk_b, &q, dk, true, &mut qfull, qw)?;
        for (t, rc) in rope.iter().enumerate() {
            for hh in 0..n_head {
                let src = &mut q[(t * n_head + hh) * dk..][..dk];
                c.rope.apply(src, dk, nope, rc);
                qfull[(t * n_head + hh) * qw + rank..][..n_rot].copy_from_slice(&src[nope..]);
            }
            let row = &mut kv[t * kw..(t + 1) * kw];
            c.rope.apply(&mut row[rank..], n_rot, 0, rc);
            ops::rms_norm_mul(&mut row[..rank], &a.kv_a_norm, c.rms_eps);
        }
        cache.append(il, &kv, &[]);

        // MQA over the latent: one kv "head" of width rank + n_rot, values = its first `rank`.
        let mut latent_out = vec![0f32; n * n_head * rank];
        attend(
            AttnGeom {
                n_head,
                n_head_kv: 1,
                dk: qw,
                dv: rank,
                kq_scale: c.kq_scale(),
                pos0,
            },
            &qfull,
            cache.keys(il),
            None,
            &mut latent_out,
            par,
        );
        // Per head: expand the attended latent with attn_v_b.
        let mut heads = vec![0f32; n * n_head * dv];
        per_head_products(par, &a.wv_b, &latent_out, rank, false, &mut heads, dv)?;
        let mut o = vec![0f32; n * c.n_embd];
        a.wo.matrix()?.matmul(par, &heads, &mut o);
        Ok(o)
    }
}

/// `W_h · x_h` for every head `h` of a 3-D weight (MLA's `attn_k_b`, `attn_v_b`: one matrix per
/// head, `n_head` = its third dimension), all heads
/// in one parallel region. Head `h` of token `t` reads the first `W_h.n_in` values at
/// `x[(t * n_head + h) * x_stride..]` and writes `W_h.n_out` values at
/// `out[(t * n_head + h) * out_stride..]`. Each head's product uses the kernel `mul_mat` of that
/// head alone would (`permuted_input` as in [`crate::tensor::Mat::mul_mat_kernel`]).
fn per_head_products(
    par: &Parallel,
    w: &Tensor,
    x: &[f32],
    x_stride: usize,
    permuted_input: bool,
    out: &mut [f32],
    out_stride: usize,
) -> Result<()> {
    let n_head = w.ne[2];
    let n = x.len() / (n_head * x_stride);
    let mats = (0..n_head)
        .map(|h| w.slice(h))
        .collect::<Result<Vec<_>>>()?;
    let (n_in, n_out) = (mats[0].n_in, mats[0].n_out);
    let kernels: Vec<_> = mats
        .iter()
        .map(|m| m.mul_mat_kernel(par, n, permuted_input))
        .collect();
    // Each head's activations (converted straight from its strided rows), heads in parallel:
    // on one thread this was a tenth of a 512-token prefill.
    let acts = par.map(
        n_head,
        |_| n * n_in,
        |h| {
            let rows = (0..n).map(|t| &x[(t * n_head + h) * x_stride..][..n_in]);
            let a = QuantizedActs::from_rows(mats[h].act_type(), n_in, rows);
            a.prepare_for(kernels[h]);
            a
        },
    );
    let layout = ChunkedLayout::new(n_out, vec![n; n_head]);
    let mut results = vec![0f32; layout.len()];
    layout.for_each_item(par, n_in, &mut results, |h, rows, o, [scratch, _]| {
        mats[h].rows_times(kernels[h], &acts[h], rows, o, scratch);
    });
    let token_stride = n_head * out_stride;
    par.for_each_range(n, n_head * n_out, out, token_stride, |toks, o| {
        for (t, orow) in toks.zip(o.chunks_exact_mut(token_stride)) {
            for h in 0..n_head {
                layout.gather(&results, h, t, &mut orow[h * out_stride..][..n_out]);
            }
        }
    });
    Ok(())
}

/// Multiply with `w`, reusing `acts` when `w` consumes the same activation type.
fn matmul_shared(
    w: &Tensor,
    acts: &QuantizedActs,
    x: &[f32],
    par: &Parallel,
    out: &mut [f32],
) -> Result<()> {
    let m = w.matrix()?;
    if m.act_type() == acts.ty {
        m.matmul_q(par, acts, out);
    } else {
        m.matmul(par, x, out);
    }
    Ok(())
}

/// SwiGLU feed-forward of `h` (`n` rows). `input` is `h` already converted for another matrix
/// (the MoE layer's expert input); it is reused when it has the gate's activation type.
pub(crate) fn dense_ffn(
    f: &DenseFfn,
    h: &[f32],
    n: usize,
    input: Option<&QuantizedActs>,
    par: &Parallel,
) -> Result<Vec<f32>> {
    let gate = f.gate.matrix()?;
    let n_ff = gate.n_out;
    let own;
    let acts = match input {
        Some(a) if a.ty == gate.act_type() => a,
        _ => {
            own = QuantizedActs::new(gate.act_type(), gate.n_in, h);
            &own
        }
    };
    let mut g = vec![0f32; n * n_ff];
    let mut u = vec![0f32; n * n_ff];
    gate.matmul_q(par, acts, &mut g);
    matmul_shared(&f.up, acts, h, par, &mut u)?;
    ops::swiglu_rows(&mut g, &u, n_ff);
    let down = f.down.matrix()?;
    let mut out = vec![0f32; n * down.n_out];
    down.matmul(par, &g, &mut out);
    Ok(out)
}

/// Choose the experts for one token from its router logits: probabilities by the gating
/// function, top-k by probability plus selection bias (within the best expert groups when the
/// model uses group-limited routing), then weights = the unbiased probabilities, normalised
/// and scaled as configured. Returns (expert, weight) in selection order.
pub fn route_top_k(c: &Config, logits: &[f32], bias: Option<&[f32]>) -> Vec<(usize, f32)> {
    let mut out = Vec::new();
    route_top_k_into(c, logits, bias, &mut RouteScratch::default(), &mut out);
    out
}

/// The working buffers of [`route_top_k_into`], kept between tokens so decode routes without
/// allocating.
#[derive(Default)]
pub struct RouteScratch {
    probs: Vec<f32>,
    sel: Vec<f32>,
    groups: Vec<(usize, f32)>,
    keep: Vec<bool>,
    idx: Vec<usize>,
}

/// [`route_top_k`], appended to `out`, with reusable buffers.
pub fn route_top_k_into(
    c: &Config,
    logits: &[f32],
    bias: Option<&[f32]>,
    s: &mut RouteScratch,
    out: &mut Vec<(usize, f32)>,
) {
    let RouteScratch {
        probs,
        sel,
        groups,
        keep,
        idx,
    } = s;
    probs.clear();
    probs.extend_from_slice(logits);
    match c.gating {
        Gating::Softmax => ops::softmax(probs),
        Gating::Sigmoid => probs.iter_mut().for_each(|p| *p = ops::sigmoid(*p)),
    }
    sel.clear();
    match bias {
        Some(b) => sel.extend(probs.iter().zip(b).map(|(p, b)| p + b)),
        None => sel.extend_from_slice(probs),
    }
    if c.n_expert_groups > 1 {
        let per = c.n_expert / c.n_expert_groups;
        // Group score: sum of the group's two best selection scores.
        groups.clear();
        groups.extend(sel.chunks_exact(per).enumerate().map(|(g, s)| {
            let mut best = [f32::NEG_INFINITY; 2];
            for &v in s {
                if v > best[0] {
                    best[1] = best[0];
                    best[0] = v;
                } else if v > best[1] {
                    best[1] = v;
                }
            }
            let second = if per > 1 { best[1] } else { 0.0 };
            (g, best[0] + second)
        }));
        // Best first, ties to the lower group (a stable sort's order, without its buffer).
        groups.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        keep.clear();
        keep.resize(c.n_expert_groups, false);
        for &(g, _) in groups.iter().take(c.n_group_used) {
            keep[g] = true;
        }
        for (g, s) in sel.chunks_exact_mut(per).enumerate() {
            if !keep[g] {
                s.iter_mut().for_each(|v| *v = f32::NEG_INFINITY);
            }
        }
    }
    // Best first, ties to the lower expert: a total order, so selecting the k best and then
    // sorting only those gives the full sort's first k.
    let order = |a: &usize, b: &usize| sel[*b].total_cmp(&sel[*a]).then(a.cmp(b));
    idx.clear();
    idx.extend(0..sel.len());
    let k = c.n_expert_used.min(idx.len());
    if k > 0 && k < idx.len() {
        idx.select_nth_unstable_by(k - 1, order);
    }
    idx.truncate(k);
    idx.sort_unstable_by(order);
    let first = out.len();
    out.extend(idx.iter().map(|&e| (e, probs[e])));
    let out = &mut out[first..];
    if c.expert_weights_norm {
        // ggml_sum_rows accumulates in f64.
        let sum = out.iter().map(|x| x.1 as f64).sum::<f64>() as f32;
        let sum = sum.max(6.103_515_6e-5);
        out.iter_mut().for_each(|x| x.1 /= sum);
    }
    let s = c.expert_weights_scale;
    if s != 0.0 && s != 1.0 {
        out.iter_mut().for_each(|x| x.1 *= s);
    }
}

/// Shapes of one attention call over the cache.
#[derive(Clone, Copy)]
struct AttnGeom {
    n_head: usize,
    n_head_kv: usize,
    /// Query/key width per head.
    dk: usize,
    /// Value width per head.
    dv: usize,
    kq_scale: f32,
    /// Position of the first query.
    pos0: usize,
}

/// Causal softmax attention of `q` (`n` tokens × n_head × dk) against the cache, the way
/// ggml's non-flash path computes it: queries converted to the key type's dot-product partner
/// (f16 for the default cache, q8_0 for a q8_0 one) for the KQ product, probabilities rounded
/// to f16 for the product with f16 values, and both products summed in llama.cpp's order
/// (tinyBLAS for a batch, `vec_dot` for one token; docs/architecture.md "Numerics"). A
/// quantized value cache is converted to f32 rows (llama.cpp runs those through its
/// flash-attention kernel only, so they are not bit-matched). `values` `None`: the values are
/// the first `dv` elements of each key row (MLA's latent, one kv head).
fn attend(
    g: AttnGeom,
    q: &[f32],
    keys: CacheRows,
    values: Option<CacheRows>,
    out: &mut [f32],
    par: &Parallel,
) {
    let n = q.len() / (g.n_head * g.dk);
    if par.numerics() == Numerics::Fast {
        return if n > 1 {
            attend_batch_f32(g, q, keys, values, out, par)
        } else {
            attend_one_token(g, q, keys, values, out, par)
        };
    }
    let group = g.n_head / g.n_head_kv;
    let n_rows = n * g.n_head;
    let work = (g.pos0 + n) * (g.dk + g.dv);
    let batched = n > 1;
    let values = values.unwrap_or(keys);
    let kq_dot = match moxie_quant::tinyblas_dot_fn(keys.ty, g.dk) {
        Some(f) if batched => f,
        _ => moxie_quant::vec_dot_fn(keys.ty).expect("cache types have a dot product"),
    };
    let q_ty = moxie_quant::vec_dot_type(keys.ty).expect("cache types have a dot partner");
    let q_conv = moxie_quant::quantize_fn(q_ty).expect("dot partners can be converted to");
    let q_bytes_len = q_ty.row_bytes(g.dk as u64).expect("heads are whole blocks") as usize;
    let round_p = values.ty == GgmlType::F16;
    // V product accumulators: tinyBLAS keeps 16 lanes per output, vec_dot_f16 four groups of
    // 16; lane of position j = j % 16, group = (j % 64) / 16. Laid out [slot][d] so the inner
    // loop runs over contiguous d.
    let slots = if batched { 16 } else { 64 };
    par.for_each_range(n_rows, work, out, g.dv, |rows, o| {
        let mut scores = Vec::new();
        let mut q_bytes = vec![0u8; q_bytes_len];
        let mut vrow = vec![0f32; g.dv];
        let mut acc = vec![0f32; slots * g.dv];
        let mut lanes = vec![0f32; 16 * g.dv];
        for (row, orow) in rows.zip(o.chunks_exact_mut(g.dv)) {
            let (t, hh) = (row / g.n_head, row % g.n_head);
            let kvh = hh / group;
            let n_kv = g.pos0 + t + 1;
            q_conv(&q[row * g.dk..(row + 1) * g.dk], &mut q_bytes);
            scores.clear();
            for j in 0..n_kv {
                let s = kq_dot(g.dk, keys.span(j, kvh * g.dk, g.dk), &q_bytes);
                scores.push(s * g.kq_scale);
            }
            // llama.cpp's kq rows span the padded cache (a multiple of 256) with masked
            // entries; padding to 16 lanes reproduces its softmax chunking exactly.
            scores.resize(n_kv.next_multiple_of(16), f32::NEG_INFINITY);
            ops::softmax(&mut scores);
            // Slots at or past n_kv never receive a term: only the used ones are cleared and
            // read back.
            let used = slots.min(n_kv);
            acc[..used * g.dv].iter_mut().for_each(|v| *v = 0.0);
            for (j, &p) in scores.iter().take(n_kv).enumerate() {
                let p = if round_p { f16_round(p) } else { p };
                if p == 0.0 {
                    continue; // fma(v, 0, acc) leaves acc unchanged
                }
                values.to_f32(j, kvh * g.dv, &mut vrow);
                let slot = j % slots;
                let a = &mut acc[slot * g.dv..(slot + 1) * g.dv];
                for (x, &v) in a.iter_mut().zip(&vrow) {
                    *x = v.mul_add(p, *x);
                }
            }
            reduce_v_slots(&acc, used, batched, g.dv, &mut lanes, orow);
        }
    });
}

/// [`Numerics::Fast`] attention for one query token (decode), flash-style: the query heads that
/// share a kv head (a GQA group, or all heads of MLA's single latent) go through the cache
/// together in blocks of positions. Each block's keys and values are converted to f32 once for
/// all those heads, scores and the weighted values are small f32 matrix products, and the
/// softmax is the running (online) one, so the cache is read once. The exact path instead
/// walks the cache once per query head in ggml's summation order. Queries take the rounding
/// of the key type's dot partner as there; probabilities are not rounded (rounding the
/// running, unnormalised ones to f16 moved the fixtures' decode further from exact decode).
fn attend_one_token(
    g: AttnGeom,
    q: &[f32],
    keys: CacheRows,
    values: Option<CacheRows>,
    out: &mut [f32],
    par: &Parallel,
) {
    /// Positions per block: a block of MLA's 576-wide keys is 144 KiB of f32.
    const BLOCK: usize = 64;
    debug_assert_eq!(q.len(), g.n_head * g.dk, "one query token");
    let group = g.n_head / g.n_head_kv;
    let n_kv = g.pos0 + 1;
    let work = n_kv * (g.dk + g.dv) / group.max(1);
    let q_ty = moxie_quant::vec_dot_type(keys.ty).expect("cache types have a dot partner");
    par.for_each_range(g.n_head, work, out, g.dv, |rows, o| {
        // This thread's query heads read kv heads kv.start..kv.end: per block, their keys
        // (and values) of all positions are converted in one go.
        let kv = rows.start / group..(rows.end - 1) / group + 1;
        let (k_width, v_width) = (kv.len() * g.dk, kv.len() * g.dv);
        let mut qh = q[rows.start * g.dk..rows.end * g.dk].to_vec();
        round_through(q_ty, g.dk, &mut qh, &mut Vec::new());
        let mut kbuf = vec![0f32; BLOCK * k_width];
        let mut vbuf = vec![0f32; if values.is_some() { BLOCK * v_width } else { 0 }];
        let mut scores = Vec::new();
        let mut part = Vec::new();
        // Per head: running max and sum of exp(score - max).
        let mut max = vec![f32::NEG_INFINITY; rows.len()];
        let mut sum = vec![0f32; rows.len()];
        o.fill(0.0);
        for j0 in (0..n_kv).step_by(BLOCK) {
            let b = BLOCK.min(n_kv - j0);
            keys.block_to_f32(j0, b, kv.start * g.dk, k_width, &mut kbuf);
            // MLA's values are part of the converted keys.
            let (v, ldv) = match values {
                Some(values) => {
                    values.block_to_f32(j0, b, kv.start * g.dv, v_width, &mut vbuf);
                    (&vbuf[..], v_width)
                }
                None => (&kbuf[..], k_width),
            };
            for kvh in kv.clone() {
                // This thread's heads reading kv head `kvh`, as indices into `rows`.
                let hs = rows.start.max(kvh * group) - rows.start
                    ..rows.end.min((kvh + 1) * group) - rows.start;
                let kk = (kvh - kv.start) * g.dk;
                scores.resize(hs.len() * b, 0.0);
                moxie_quant::gemm_f32_abt(
                    hs.len(),
                    b,
                    g.dk,
                    &qh[hs.start * g.dk..hs.end * g.dk],
                    g.dk,
                    &kbuf[kk..(b - 1) * k_width + kk + g.dk],
                    k_width,
                    &mut scores,
                    b,
                );
                for (h, srow) in hs.clone().zip(scores.chunks_exact_mut(b)) {
                    let block_max = srow
                        .iter()
                        .fold(f32::NEG_INFINITY, |m, &x| m.max(x * g.kq_scale));
                    let new_max = max[h].max(block_max);
                    let rescale = (max[h] - new_max).exp();
                    max[h] = new_max;
                    let mut s = 0f32;
                    for x in srow.iter_mut() {
                        *x = (*x * g.kq_scale - new_max).exp();
                        s += *x;
                    }
                    sum[h] = sum[h] * rescale + s;
                    if rescale != 1.0 {
                        o[h * g.dv..(h + 1) * g.dv]
                            .iter_mut()
                            .for_each(|x| *x *= rescale);
                    }
                }
                let vv = (kvh - kv.start) * g.dv;
                part.resize(hs.len() * g.dv, 0.0);
                moxie_quant::gemm_f32_ab(
                    hs.len(),
                    b,
                    g.dv,
                    &scores,
                    b,
                    &v[vv..(b - 1) * ldv + vv + g.dv],
                    ldv,
                    &mut part,
                    g.dv,
                );
                for (x, &y) in o[hs.start * g.dv..hs.end * g.dv].iter_mut().zip(&part) {
                    *x += y;
                }
            }
        }
        for (oh, &s) in o.chunks_exact_mut(g.dv).zip(&sum) {
            let inv = 1.0 / s;
            oh.iter_mut().for_each(|x| *x *= inv);
        }
    });
}

/// The V product's final sums, `out[d]` for every `d` at once (vectorised over `d`): slot `s`
/// of `acc` (`dv` values each; slots at or past `used` are zero) is lane `s % 16` of group
/// `s / 16`. One token: the four groups are added as ggml's `reduce_f32x16` does,
/// `(g0 + g2) + (g1 + g3)`; a batch has one group. Then the 16 lanes are summed in
/// [`moxie_quant::reduce_add_16`]'s tree order.
fn reduce_v_slots(
    acc: &[f32],
    used: usize,
    batched: bool,
    dv: usize,
    lanes: &mut [f32],
    out: &mut [f32],
) {
    let slot = |s: usize| &acc[s * dv..(s + 1) * dv];
    for (l, dst) in lanes.chunks_exact_mut(dv).enumerate() {
        if batched || used <= 16 {
            // The other groups are zero: (a + 0) + (0 + 0) = a.
            dst.copy_from_slice(slot(l));
        } else {
            let (a, c, b, e) = (slot(l), slot(32 + l), slot(16 + l), slot(48 + l));
            for d in 0..dv {
                dst[d] = (a[d] + c[d]) + (b[d] + e[d]);
            }
        }
    }
    // The lane tree, `t[i] = v[i + 8] + v[i]`, `u[i] = t[i + 4] + t[i]`, `(u0 + u2) + (u1 + u3)`,
    // in place: lanes 0..8 become t, then lanes 0..4 become u.
    for step in [8usize, 4] {
        for i in 0..step {
            let (lo, hi) = lanes.split_at_mut((i + step) * dv);
            for (x, &y) in lo[i * dv..(i + 1) * dv].iter_mut().zip(&hi[..dv]) {
                *x += y;
            }
        }
    }
    let lane = |l: usize| &lanes[l * dv..(l + 1) * dv];
    let (u0, u1, u2, u3) = (lane(0), lane(1), lane(2), lane(3));
    for d in 0..dv {
        out[d] = (u0[d] + u2[d]) + (u1[d] + u3[d]);
    }
}

/// [`Numerics::Fast`] attention for a batch of queries: the cache's keys and values are
/// converted to f32 once per call, then per block of tokens and kv head the scores and the
/// weighted sum of values are blocked f32 matrix products (each K/V row is read once per block
/// instead of once per query row). Causal masking is applied to the scores.
fn attend_batch_f32(
    g: AttnGeom,
    q: &[f32],
    keys: CacheRows,
    values: Option<CacheRows>,
    out: &mut [f32],
    par: &Parallel,
) {
    /// Tokens per block: all their query heads of one kv head share one pass over K and V.
    const BLOCK: usize = 16;
    let n = q.len() / (g.n_head * g.dk);
    let n_kv = g.pos0 + n;
    let group = g.n_head / g.n_head_kv;
    // Per kv head, all positions' `width` elements as f32 rows.
    let to_f32 = |src: CacheRows, width: usize| {
        let mut dst = vec![0f32; g.n_head_kv * n_kv * width];
        for (kvh, head) in dst.chunks_exact_mut(n_kv * width).enumerate() {
            src.block_to_f32(0, n_kv, kvh * width, width, head);
        }
        dst
    };
    let k32 = to_f32(keys, g.dk);
    // MLA's values are the first `dv` elements of its (single) key rows: no second copy.
    let v32_own;
    let (v32, ldv) = match values {
        Some(values) => {
            v32_own = to_f32(values, g.dv);
            (&v32_own, g.dv)
        }
        None => (&k32, g.dk),
    };
    // Queries take the rounding of the key type's dot partner, probabilities f16's when the
    // values are f16, as ggml converts the other operand to them: the fixtures' quantized
    // models amplify that rounding, so skipping it would not be "float rounding" only.
    let q_ty = moxie_quant::vec_dot_type(keys.ty).expect("cache types have a dot partner");
    let round_p = values.unwrap_or(keys).ty == GgmlType::F16;
    // Token t attends to pos0 + t + 1 positions: threads get runs of equal total work, not
    // equal token counts (with two threads the second would otherwise do ~3/4 of it).
    let head_work = g.n_head * (g.dk + g.dv);
    let out_row = g.n_head * g.dv;
    let cost = |t: usize| (g.pos0 + t + 1 + BLOCK) * head_work;
    par.for_each_run(
        n,
        cost,
        out,
        |t| t * out_row,
        |toks, o| {
            let mut qbuf = Vec::new();
            let mut qtmp = Vec::new();
            let mut scores = Vec::new();
            let mut obuf = Vec::new();
            let mut t0 = toks.start;
            while t0 < toks.end {
                let t1 = (t0 + BLOCK).min(toks.end);
                let rows = (t1 - t0) * group;
                let kv_len = g.pos0 + t1;
                for kvh in 0..g.n_head_kv {
                    qbuf.clear();
                    for t in t0..t1 {
                        let first = (t * g.n_head + kvh * group) * g.dk;
                        qbuf.extend_from_slice(&q[first..first + group * g.dk]);
                    }
                    round_through(q_ty, g.dk, &mut qbuf, &mut qtmp);
                    scores.resize(rows * kv_len, 0.0);
                    let kh = &k32[kvh * n_kv * g.dk..];
                    moxie_quant::gemm_f32_abt(
                        rows,
                        kv_len,
                        g.dk,
                        &qbuf,
                        g.dk,
                        kh,
                        g.dk,
                        &mut scores,
                        kv_len,
                    );
                    for (r, srow) in scores.chunks_exact_mut(kv_len).enumerate() {
                        let len = g.pos0 + t0 + r / group + 1;
                        srow[..len].iter_mut().for_each(|s| *s *= g.kq_scale);
                        ops::softmax(&mut srow[..len]);
                        if round_p {
                            srow[..len].iter_mut().for_each(|p| *p = f16_round(*p));
                        }
                        srow[len..].fill(0.0);
                    }
                    obuf.resize(rows * g.dv, 0.0);
                    let vh = &v32[kvh * n_kv * ldv..];
                    moxie_quant::gemm_f32_ab(
                        rows, kv_len, g.dv, &scores, kv_len, vh, ldv, &mut obuf, g.dv,
                    );
                    for (r, orow) in obuf.chunks_exact(g.dv).enumerate() {
                        let (t, hg) = (t0 + r / group, r % group);
                        let at = ((t - toks.start) * g.n_head + kvh * group + hg) * g.dv;
                        o[at..at + g.dv].copy_from_slice(orow);
                    }
                }
                t0 = t1;
            }
        },
    );
}

/// Round `x` (rows of `width`) as converting it to `ty` and back does; f32 is left alone.
fn round_through(ty: GgmlType, width: usize, x: &mut [f32], tmp: &mut Vec<u8>) {
    match ty {
        GgmlType::F32 => {}
        GgmlType::F16 => x.iter_mut().for_each(|v| *v = f16_round(*v)),
        _ => {
            let conv = moxie_quant::quantize_fn(ty).expect("dot partners can be converted to");
            let rb = ty.row_bytes(width as u64).expect("heads are whole blocks") as usize;
            tmp.resize(rb, 0);
            for row in x.chunks_exact_mut(width) {
                conv(row, tmp);
                moxie_quant::dequantize_row(ty, tmp, row).expect("dot partners dequantize");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Arch, Config, Gating};
    use crate::ops::{Rope, RopeKind};

    fn config(n_expert: usize, used: usize, groups: usize, groups_used: usize) -> Config {
        Config {
            arch: Arch::Deepseek2,
            n_vocab: 16,
            n_ctx_train: 64,
            n_embd: 8,
            n_layer: 1,
            n_head: 1,
            n_head_kv: 1,
            head_dim_k: 8,
            head_dim_v: 8,
            n_ff: 8,
            rms_eps: 1e-6,
            n_rot: 4,
            n_layer_dense_lead: 0,
            n_expert,
            n_expert_used: used,
            n_expert_shared: 0,
            n_ff_exp: 8,
            n_expert_groups: groups,
            n_group_used: groups_used,
            expert_weights_scale: 0.0,
            expert_weights_norm: false,
            gating: Gating::Sigmoid,
            q_lora_rank: 0,
            kv_lora_rank: 0,
            head_dim_k_mla: 8,
            head_dim_v_mla: 8,
            n_layer_nextn: 0,
            rope: Rope {
                kind: RopeKind::Normal,
                n_dims: 4,
                freq_base: 10000.0,
                freq_scale: 1.0,
                ext_factor: 0.0,
                attn_factor: 1.0,
                beta_fast: 32.0,
                beta_slow: 1.0,
                n_ctx_orig: 64,
            },
            rope_yarn_log_mul: 0.0,
        }
    }

    #[test]
    fn top_k_uses_bias_for_selection_but_not_for_weights() {
        let c = config(4, 2, 0, 0);
        let logits = [2.0f32, 1.0, 0.0, -1.0];
        let bias = [0.0f32, 0.0, 5.0, 0.0];
        let r = route_top_k(&c, &logits, Some(&bias));
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![2, 0]);
        assert_eq!(r[0].1, ops::sigmoid(0.0));
        assert_eq!(r[1].1, ops::sigmoid(2.0));
    }

    #[test]
    fn weights_are_normalised_and_scaled() {
        let mut c = config(4, 2, 0, 0);
        c.expert_weights_norm = true;
        c.expert_weights_scale = 2.5;
        let r = route_top_k(&c, &[1.0, 0.5, -3.0, -4.0], None);
        let sum: f32 = r.iter().map(|x| x.1).sum();
        assert!((sum - 2.5).abs() < 1e-6);
        c.gating = Gating::Softmax;
        c.expert_weights_norm = false;
        c.expert_weights_scale = 0.0;
        let r = route_top_k(&c, &[0.0, 0.0, 0.0, 0.0], None);
        assert!(r.iter().all(|x| (x.1 - 0.25).abs() < 1e-7));
    }

    #[test]
    fn group_limited_routing_keeps_the_best_groups() {
        // 8 experts in 4 groups of 2; keep 2 groups. Group scores are the sum of the group's
        // two best selection scores: group 0 = 0.9+0.0, group 1 = 0.5+0.5, group 2 =
        // 0.8+0.3, group 3 = 0.2+0.2. The best single expert (0) is in group 0, which loses
        // to groups 1 and 2.
        let c = config(8, 2, 4, 2);
        let probs = [0.9f32, 0.0, 0.5, 0.5, 0.8, 0.3, 0.2, 0.2];
        let logits: Vec<f32> = probs
            .iter()
            .map(|&p: &f32| {
                let p = p.clamp(1e-6, 1.0 - 1e-6);
                (p / (1.0 - p)).ln()
            })
            .collect();
        let r = route_top_k(&c, &logits, None);
        let picked: Vec<usize> = r.iter().map(|x| x.0).collect();
        assert_eq!(picked, vec![4, 2]);
    }
}
