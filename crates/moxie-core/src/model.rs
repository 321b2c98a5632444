//! A loaded model: its hyper-parameters, token embeddings, layers of blocks (`crate::blocks`,
//! chosen per layer by the architecture's file in `crate::arch`) and output head, each block's
//! weights on the device the placement gave them. The forward pass is in `crate::forward`.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use moxie_gguf::GgufFile;

use crate::blocks::embed::Embeddings;
use crate::blocks::head::OutputHead;
use crate::blocks::moe::MoeScratch;
use crate::blocks::{Layer, LayerDevices};
use crate::config::{Config, Keys};
use crate::device::{Devices, CPU};
use crate::gpu_pass::GpuScratchPool;
use crate::loader::TensorSource;
use crate::parallel::Parallel;
use crate::progress::{NoProgress, Progress};
use crate::state::{KvTypes, LayerStateSpec, SeqState};
use crate::telemetry::RoutingStats;
use crate::tensor::Tensor;
use crate::{Error, Result};

pub use crate::loader::Placement;
pub use crate::mtp::LoadOptions;
use crate::mtp::Mtp;

/// Which rows of logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    All,
    Last,
    /// Only fill the state (prompt chunks whose logits nobody reads).
    None,
}

pub struct Model {
    /// Host weights page-locked for a GPU's copies ([`Model::pin_streamed_experts`]). The
    /// first field, so the pins are released before the weights they hold drop.
    host_pins: std::sync::Mutex<Vec<moxie_gpu::HostPin>>,
    pub config: Config,
    pub file: Arc<GgufFile>,
    pub embeddings: Embeddings,
    pub layers: Vec<Layer>,
    pub head: OutputHead,
    /// The MTP (nextn) head, when loaded on request ([`LoadOptions::mtp`]).
    pub mtp: Option<Mtp>,
    /// The CPU and any accelerators the model is placed on.
    pub devices: Devices,
    /// Buffers forward passes reuse, so decode does not allocate them per token.
    pub(crate) scratch: ScratchPool,
    /// GPU work buffers kept between forward passes.
    pub(crate) gpu_scratch: GpuScratchPool,
    /// Batches of at least this many tokens stream host-resident routed experts to the GPU
    /// running their layer's router (`usize::MAX`: never). See [`Model::calibrate_op_offload`].
    op_offload_min_batch: AtomicUsize,
    /// Bytes of GPU memory op offload may hold for the experts it streams at a time
    /// (`u64::MAX`: what the GPU has free).
    op_offload_buffer_limit: AtomicU64,
    /// Which experts each MoE layer's tokens selected, always counted
    /// ([`crate::telemetry`]).
    pub routing: Arc<RoutingStats>,
    /// Forward passes since GPU routing tallies were last flushed.
    pub(crate) routing_passes: AtomicUsize,
}

/// Forward passes between flushes of the GPUs' routing tallies into [`Model::routing`] (so
/// `/metrics` lags by at most this many passes on GPU-routed layers).
pub const ROUTING_FLUSH_PASSES: usize = 32;

/// MoE buffers for forward passes: each pass takes a set and gives it back, so concurrent
/// passes (several sequences) never share one and a pass after the first allocates nothing.
#[derive(Default)]
pub(crate) struct ScratchPool(Mutex<Vec<MoeScratch>>);

impl ScratchPool {
    pub(crate) fn take(&self) -> MoeScratch {
        let mut pool = self.0.lock().unwrap_or_else(|p| p.into_inner());
        pool.pop().unwrap_or_default()
    }

    pub(crate) fn give(&self, s: MoeScratch) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(s);
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
        Model::load_with(file, placement, LoadOptions::default())
    }

    /// [`Model::load_placed`], with what `opts` asks for besides the main graph.
    pub fn load_with(
        file: Arc<GgufFile>,
        placement: &Placement,
        opts: LoadOptions,
    ) -> Result<Model> {
        Model::load_reporting(file, placement, opts, &NoProgress)
    }

    /// [`Model::load_with`], telling `progress` the bytes copied to GPUs (and simulated
    /// devices) as they go; weights on the host stay mapped, so they take no time here.
    pub fn load_reporting(
        file: Arc<GgufFile>,
        placement: &Placement,
        opts: LoadOptions,
        progress: &dyn Progress,
    ) -> Result<Model> {
        let config = Config::from_metadata(file.metadata())?;
        let src = TensorSource::new(&file, placement, progress);
        let to_devices = src.device_bytes();
        if to_devices > 0 {
            let names: Vec<&str> = (1..placement.devices.len())
                .map(|d| placement.devices.get(d).name.as_str())
                .collect();
            progress.start(
                &format!("copying weights to {}", names.join(", ")),
                to_devices,
            );
        }
        let model = Model::build(file.clone(), config, &src, opts);
        if to_devices > 0 {
            progress.finish();
        }
        model
    }

    fn build(
        file: Arc<GgufFile>,
        config: Config,
        src: &TensorSource,
        opts: LoadOptions,
    ) -> Result<Model> {
        let c = &config;
        let embd = src.block("the token embeddings");
        let tok_embd = embd.get("token_embd.weight", &[c.n_embd, c.n_vocab])?;
        let head = src.block("the output head");
        let norm = head.vec("output_norm.weight", c.n_embd)?;
        let output = match head.opt("output.weight", &[c.n_embd, c.n_vocab])? {
            Some(t) => t,
            None => {
                // Tied embeddings: the head reads the embedding table where it is.
                if head.device() != tok_embd.device {
                    return Err(Error::Model(
                        "output_norm.weight and the output projection (the tied token \
                         embeddings) must be on one device"
                            .into(),
                    ));
                }
                tok_embd.clone()
            }
        };
        let arch = crate::arch::def(c.arch);
        let keys = Keys::new(file.metadata(), c.arch.name());
        let layers = (arch.layers)(c, &keys, src)?;
        let mtp = if opts.mtp {
            Some(Mtp::load(c, &keys, src, &output)?)
        } else {
            None
        };
        let layers_moe = layers
            .iter()
            .map(|l| matches!(l.ffn, crate::blocks::Ffn::Moe(_)));
        let routing = Arc::new(RoutingStats::new(c.arch.name(), c.n_expert, layers_moe));
        let model = Model {
            host_pins: Default::default(),
            config,
            file: Arc::clone(&file),
            embeddings: Embeddings { tok_embd },
            layers,
            head: OutputHead { norm, output },
            mtp,
            devices: src.devices().clone(),
            scratch: ScratchPool::default(),
            gpu_scratch: Default::default(),
            op_offload_min_batch: AtomicUsize::new(usize::MAX),
            op_offload_buffer_limit: AtomicU64::new(u64::MAX),
            routing,
            routing_passes: AtomicUsize::new(0),
        };
        model.check_types()?;
        Ok(model)
    }

    /// Set the layout of the weight matrices in host memory. With `interleave`, the matrices
    /// that live there and are only read there (routed experts whose router runs on the CPU
    /// too, so no GPU streams them; the CPU's attention projections, dense and shared-expert
    /// FFNs and output head; names as [`interleave_candidate`]) get the 16-row layout of
    /// moxie's fastest one-token kernels ([`Tensor::interleaved`], load-time repacking;
    /// ik_llama.cpp's `-rtr`). Every other interleaved matrix (all of them without
    /// `interleave`: `--no-repack`, `--exact`; a file written by `moxie quantize --repack`
    /// stores them so) is put back in GGUF order ([`Tensor::in_gguf_order`]). Tensors are
    /// done one at a time and each mapped source is released after its copy, so resident
    /// memory stays about the model's size.
    /// `progress` is told the bytes of every matrix looked at.
    pub fn set_cpu_weight_layout(
        &mut self,
        par: &crate::parallel::Parallel,
        interleave: bool,
        progress: &dyn Progress,
    ) -> LayoutChange {
        use crate::blocks::{Ffn, Mixer};
        // (matrix, whether it should be interleaved)
        let mut tensors: Vec<(&mut Tensor, bool)> = Vec::new();
        let layers = self
            .layers
            .iter_mut()
            .chain(self.mtp.iter_mut().map(|m| &mut m.layer));
        for layer in layers {
            match &mut layer.mixer {
                Mixer::Mla(a) => tensors.extend(a.projections_mut().into_iter().map(|t| (t, true))),
                Mixer::Gqa(a) => tensors.extend(a.matrices_mut().into_iter().map(|t| (t, true))),
                Mixer::DeltaNet(_) => {}
            }
            match &mut layer.ffn {
                Ffn::Dense(f) => tensors.extend(f.matrices_mut().into_iter().map(|t| (t, true))),
                Ffn::Moe(m) => {
                    let host_only =
                        m.device == crate::device::CPU && m.experts_device == crate::device::CPU;
                    tensors.extend(
                        [&mut m.gate_exps, &mut m.up_exps, &mut m.down_exps]
                            .into_iter()
                            .map(|t| (t, host_only)),
                    );
                    if let Some(sh) = &mut m.shared {
                        tensors.extend(sh.matrices_mut().into_iter().map(|t| (t, true)));
                    }
                }
            }
        }
        // The output head on the host (interleave_candidate keeps a tied head's rows).
        let head_on_host = self.head.output.device == crate::device::CPU;
        tensors.push((&mut self.head.output, head_on_host));
        let mut change = LayoutChange::default();
        let host = |t: &Tensor| {
            if t.device == CPU {
                t.data().len() as u64
            } else {
                0
            }
        };
        let total = tensors.iter().map(|(t, _)| host(t)).sum();
        let what = if interleave {
            "repacking weights"
        } else {
            "checking the weights' row order"
        };
        progress.start(what, total);
        for (t, wanted) in tensors {
            let bytes = host(t);
            let wanted = wanted && interleave && interleave_candidate(&t.name);
            if wanted {
                if let Some(r) = t.interleaved(par) {
                    change.interleaved += 1;
                    change.interleaved_bytes += r.data().len() as u64;
                    *t = r;
                } else if t.is_interleaved() {
                    change.as_stored += 1;
                    change.as_stored_bytes += t.data().len() as u64;
                }
            } else if let Some(r) = t.in_gguf_order(par) {
                change.restored += 1;
                change.restored_bytes += r.data().len() as u64;
                *t = r;
            }
            progress.advance(bytes);
        }
        progress.finish();
        change
    }

    /// `--no-mmap`: every host weight still mapped from the file (not repacked) copied into
    /// memory moxie owns, the file's pages released, so that nothing is paged in from the
    /// file later; `progress` is told the bytes as they are copied. Returns the tensors and
    /// bytes copied.
    pub fn own_mapped_weights(&mut self, progress: &dyn Progress) -> (usize, u64) {
        let mut tensors = self.weights_mut();
        let total = tensors
            .iter()
            .filter(|t| t.mapped_on_host().is_some())
            .map(|t| t.data().len() as u64)
            .sum();
        progress.start("reading weights into memory", total);
        let mut copies = std::collections::HashMap::new();
        let (mut n, mut bytes) = (0, 0);
        for t in tensors.iter_mut() {
            let len = t.data().len() as u64;
            if let Some(b) = t.own_mapped_bytes(&mut copies) {
                n += 1;
                bytes += b;
                progress.advance(len);
            }
        }
        progress.finish();
        (n, bytes)
    }

    /// The host weights still read from the file's mapping, paged in now (llama.cpp maps
    /// them with `MAP_POPULATE`), so that the first requests do not fault their way through
    /// the model: in chunks of 64 MiB, each reported to `progress`. The token embeddings are
    /// left to be read a row per token (most runs read few of their rows; paging all of them
    /// in held 27 MB more of a 2 GB bench model). Skipped (`skipped`: the bytes and what is
    /// available) when they exceed the memory available, where paging all of them in would
    /// only push earlier ones out again.
    pub fn page_in_mapped_weights(&self, progress: &dyn Progress) -> PageIn {
        const CHUNK: u64 = 64 << 20;
        let embeddings = self.embeddings.tok_embd.mapped_on_host().map(|(_, i)| i);
        let mut seen: std::collections::HashSet<usize> = embeddings.into_iter().collect();
        let mapped: Vec<(usize, u64)> = self
            .weights()
            .into_iter()
            .filter_map(|t| t.mapped_on_host())
            .filter(|&(_, index)| seen.insert(index))
            .map(|(file, index)| (index, file.tensors()[index].n_bytes))
            .collect();
        let bytes = mapped.iter().map(|&(_, b)| b).sum();
        let mut out = PageIn {
            tensors: mapped.len(),
            bytes,
            ..PageIn::default()
        };
        if let Some(available) = crate::placement::available_memory_bytes() {
            if bytes > available {
                out.skipped = Some(available);
                return out;
            }
        }
        progress.start("paging in mapped weights", bytes);
        let mut populated = true;
        for (index, n_bytes) in mapped {
            let mut at = 0;
            while at < n_bytes {
                let end = (at + CHUNK).min(n_bytes);
                populated &= self.file.populate_tensor_pages(index, at..end);
                progress.advance(end - at);
                at = end;
            }
        }
        progress.finish();
        out.populated = populated && out.tensors > 0;
        out
    }

    /// The MoE layers: `(block index, layer)`, in order.
    pub fn moe_layers(&self) -> impl Iterator<Item = (usize, &crate::blocks::moe::Moe)> {
        self.layers
            .iter()
            .enumerate()
            .filter_map(|(il, l)| match &l.ffn {
                crate::blocks::Ffn::Moe(m) => Some((il, &**m)),
                _ => None,
            })
    }

    /// What the expert caches of all layers did so far (`--expert-cache`), if there are any.
    pub fn expert_cache_counts(&self) -> Option<crate::blocks::moe::CacheCounts> {
        let mut total: Option<crate::blocks::moe::CacheCounts> = None;
        for c in self.moe_layers().filter_map(|(_, m)| m.cache.as_ref()) {
            total.get_or_insert_with(Default::default).add(&c.counts());
        }
        total
    }

    /// Move the routing counted on GPUs (layers whose routes stay on the device) into
    /// [`Model::routing`], zeroing the GPUs' tallies: a download per such layer, so the
    /// forward pass does it only every [`ROUTING_FLUSH_PASSES`] passes and before any
    /// profile is read ([`Model::routing_profile`]). The host's own routes are counted as
    /// they are made.
    pub fn flush_routing(&self) -> Result<()> {
        use crate::telemetry::Phase;
        for (il, m) in self.moe_layers() {
            let Some(t) = &m.tally else { continue };
            let n_e = m.routing.n_expert;
            let mut words = vec![0u32; moxie_gpu::ops::route_tally_words(n_e)];
            t.read(0, bytemuck::cast_slice_mut(&mut words))?;
            if words[..2].iter().all(|&w| w == 0) {
                continue;
            }
            for (p, phase) in [Phase::Prefill, Phase::Decode].into_iter().enumerate() {
                let counts = &words[2 + p * n_e..2 + (p + 1) * n_e];
                let mass: &[f32] =
                    bytemuck::cast_slice(&words[2 + (2 + p) * n_e..2 + (3 + p) * n_e]);
                self.routing.add(il, phase, words[p] as u64, counts, mass);
            }
            t.write(0, &vec![0u8; 4 * words.len()])?;
        }
        self.routing_passes.store(0, Ordering::Relaxed);
        Ok(())
    }

    /// The routing counters now, GPU tallies included ([`Model::flush_routing`]).
    pub fn routing_profile(&self) -> Result<crate::telemetry::RoutingProfile> {
        self.flush_routing()?;
        Ok(self.routing.snapshot())
    }

    /// Weight bytes per buffer, as llama.cpp's `model buffer size` lines: `CPU_Mapped` (read
    /// from the file's mapping), `CPU` (copies moxie owns: repacked, derived, or read in by
    /// `--no-mmap`) and each device's copies, in device order. Norms and biases (a few MB,
    /// converted to f32) are not counted.
    pub fn weight_buffers(&self) -> Vec<(String, u64)> {
        let mut seen = std::collections::HashSet::new();
        let mut out: Vec<(String, u64)> = Vec::new();
        for t in self.weights() {
            if !seen.insert((t.device, t.data().as_ptr() as usize)) {
                continue; // a tied head
            }
            let name = if t.mapped_on_host().is_some() {
                "CPU_Mapped".to_owned()
            } else {
                self.devices.get(t.device).name.clone()
            };
            let bytes = t.data().len() as u64;
            match out.iter_mut().find(|(n, _)| *n == name) {
                Some((_, b)) => *b += bytes,
                None => out.push((name, bytes)),
            }
        }
        let order = |n: &str| match n {
            "CPU_Mapped" => 0,
            "CPU" => 1,
            _ => 2,
        };
        out.sort_by_key(|(n, _)| order(n));
        out
    }

    /// Every weight tensor of the model: the embeddings, the output head, every layer's
    /// matrices and the MTP block's (a tied head is listed twice).
    fn weights_mut(&mut self) -> Vec<&mut Tensor> {
        let mut tensors: Vec<&mut Tensor> =
            vec![&mut self.embeddings.tok_embd, &mut self.head.output];
        let mut layers: Vec<&mut Layer> = self.layers.iter_mut().collect();
        if let Some(m) = &mut self.mtp {
            tensors.push(&mut m.eh_proj);
            tensors.extend(&mut m.embed);
            tensors.extend(&mut m.head);
            layers.push(&mut m.layer);
        }
        for l in layers {
            tensors.extend(l.mixer.matrices_mut());
            tensors.extend(l.ffn.matrices_mut());
        }
        tensors
    }

    /// [`Model::weights_mut`], to read.
    fn weights(&self) -> Vec<&Tensor> {
        let mut tensors: Vec<&Tensor> = vec![&self.embeddings.tok_embd, &self.head.output];
        let mut layers: Vec<&Layer> = self.layers.iter().collect();
        if let Some(m) = &self.mtp {
            tensors.push(&m.eh_proj);
            tensors.extend(&m.embed);
            tensors.extend(&m.head);
            layers.push(&m.layer);
        }
        for l in layers {
            tensors.extend(l.mixer.matrices());
            tensors.extend(l.ffn.matrices());
        }
        tensors
    }

    /// The batch size from which host-resident routed experts are streamed to the GPU that
    /// runs their layer's router (llama.cpp's op offload), `None` when never.
    pub fn op_offload_min_batch(&self) -> Option<usize> {
        let v = self.op_offload_min_batch.load(Ordering::Relaxed);
        (v != usize::MAX).then_some(v)
    }

    /// Set (or turn off, `None`) op offload's batch threshold.
    pub fn set_op_offload_min_batch(&self, min_batch: Option<usize>) {
        self.op_offload_min_batch
            .store(min_batch.unwrap_or(usize::MAX).max(1), Ordering::Relaxed);
    }

    /// Page-lock the routed experts that op offload may stream (layers whose router runs on a
    /// GPU and whose experts are in RAM) with that GPU, so that their copies to it go straight
    /// from them instead of through staging buffers. Only bytes moxie owns (`--no-mmap`, as
    /// llama.cpp pins only then): the file's mapped pages stay pageable (pinning them would
    /// read the whole file in and hold it past what the page cache can drop). Returns the
    /// tensors and bytes pinned by this call (already pinned ones are skipped). Call it once
    /// the weights are where they stay: the pins last until the model drops.
    pub fn pin_streamed_experts(&self) -> Result<(usize, u64)> {
        let mut pins = self.host_pins.lock().unwrap_or_else(|p| p.into_inner());
        let mut seen: std::collections::HashSet<*const u8> =
            pins.iter().map(moxie_gpu::HostPin::ptr).collect();
        let (mut n, mut bytes) = (0, 0);
        for layer in &self.layers {
            let crate::blocks::Ffn::Moe(m) = &layer.ffn else {
                continue;
            };
            let Some(gpu) = self.devices.gpu(m.device) else {
                continue;
            };
            if m.experts_device != crate::device::CPU {
                continue;
            }
            for t in [&m.gate_exps, &m.up_exps, &m.down_exps] {
                let data = t.data();
                if !t.owned_on_host() || !seen.insert(data.as_ptr()) {
                    continue;
                }
                // SAFETY: bytes moxie owns, which the model's tensors keep unchanged until the
                // model drops, after its pins (its first field).
                let pin = unsafe { moxie_gpu::HostPin::new(gpu.backend(), data) }
                    .map_err(|e| Error::Model(format!("pinning '{}': {e}", t.name)))?;
                if let Some(pin) = pin {
                    pins.push(pin);
                    n += 1;
                    bytes += data.len() as u64;
                }
            }
        }
        Ok((n, bytes))
    }

    /// The most GPU memory op offload holds for streamed experts at a time (`None`: what the
    /// GPU has free, after its headroom). Experts stream in chunks of as many as fit; with
    /// less room than one expert the CPU computes the layer's experts.
    pub fn op_offload_buffer_limit(&self) -> Option<u64> {
        let v = self.op_offload_buffer_limit.load(Ordering::Relaxed);
        (v != u64::MAX).then_some(v)
    }

    /// Set (or lift, `None`) [`Model::op_offload_buffer_limit`].
    pub fn set_op_offload_buffer_limit(&self, bytes: Option<u64>) {
        self.op_offload_buffer_limit
            .store(bytes.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Where each layer's blocks run.
    pub fn layer_devices(&self) -> Vec<LayerDevices> {
        self.layers.iter().map(Layer::devices).collect()
    }

    fn check_types(&self) -> Result<()> {
        let mut mats: Vec<&Tensor> = vec![&self.head.output];
        for l in self.layers.iter().chain(self.mtp.iter().map(|m| &m.layer)) {
            mats.extend(l.mixer.matrices());
            mats.extend(l.ffn.matrices());
        }
        if let Some(m) = &self.mtp {
            mats.push(&m.eh_proj);
            mats.extend(&m.head);
        }
        for t in mats {
            t.matrix()?;
        }
        // token_embd is only read row by row: it needs a dequantizer.
        let tok_embd = &self.embeddings.tok_embd;
        if moxie_quant::dequantize_fn(tok_embd.ty).is_none() {
            return Err(Error::Model(format!(
                "tensor 'token_embd.weight' has type {}, which moxie cannot read yet",
                tok_embd.ty
            )));
        }
        Ok(())
    }

    /// What every layer keeps per sequence.
    pub fn state_specs(&self) -> Vec<LayerStateSpec> {
        self.layers.iter().map(|l| l.mixer.state_spec()).collect()
    }

    /// A sequence's state for `n_ctx` positions (the model's training context when `None`),
    /// with llama.cpp's default f16 KV cache.
    pub fn new_state(&self, n_ctx: Option<usize>) -> Result<SeqState> {
        self.new_state_typed(n_ctx, KvTypes::default())
    }

    /// A sequence's state with attention rows of `types` (llama.cpp's `-ctk` / `-ctv`; MLA
    /// layers keep only keys) for `n_ctx` positions. Each layer's part is held in the memory
    /// of the device its token mixer runs on, for the whole context. Fails if the heads do not
    /// fit the types' blocks or a device's budget cannot hold its layers' part.
    pub fn new_state_typed(&self, n_ctx: Option<usize>, types: KvTypes) -> Result<SeqState> {
        let n_ctx = n_ctx.unwrap_or(self.config.n_ctx_train);
        let mut state = SeqState::new(&self.state_specs(), n_ctx, types)?;
        for (il, layer) in self.layers.iter().enumerate() {
            self.place_layer_state(&mut state, il, layer, n_ctx, types)?;
        }
        Ok(state)
    }

    /// Hold layer `il` of `state` (for `layer`) in the memory of the device its token mixer
    /// runs on: reserved against that device's budget, in GPU memory on a GPU.
    pub(crate) fn place_layer_state(
        &self,
        state: &mut SeqState,
        il: usize,
        layer: &Layer,
        n_ctx: usize,
        types: KvTypes,
    ) -> Result<()> {
        let dev = layer.mixer.block().device();
        if dev == CPU {
            return Ok(());
        }
        let bytes = state.layer_bytes_when_full(il) as u64;
        let what = format!("the KV cache of layer {il} ({n_ctx} positions)");
        let held = self.devices.reserve(dev, bytes, &what)?;
        state.hold(held);
        if let Some(gpu) = self.devices.gpu(dev) {
            let layer_state = state.layer_mut(il);
            // MLA keeps no value rows: its values are read from the keys.
            let k = layer_state.keys.as_ref().map_or(types.k, |r| r.ty);
            let v = layer_state.values.as_ref().map_or(k, |r| r.ty);
            if !moxie_gpu::ops::kv_types_supported(k, v) {
                return Err(Error::Model(format!(
                    "the KV cache of layer {il} on {}: a {} / {} cache is not supported on \
                     the GPU (-ctk and -ctv both f32, f16 or q8_0, or q8_0 with f16)",
                    gpu.name(),
                    types.k,
                    types.v
                )));
            }
            layer_state.move_to_gpu(n_ctx, |bytes| {
                Ok(moxie_gpu::Buffer::new(gpu.backend(), bytes)?)
            })?;
        }
        Ok(())
    }

    /// A prompt after what `state` holds, in micro-batches of `ubatch` tokens; returns the
    /// last token's logits (only the last micro-batch asks for any).
    pub fn prefill(
        &self,
        tokens: &[u32],
        state: &mut SeqState,
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
            logits = self.forward(chunk, state, par, which)?;
        }
        Ok(logits)
    }
}

/// What [`Model::page_in_mapped_weights`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageIn {
    /// Weight tensors read from the file's mapping on the host, and their bytes.
    pub tensors: usize,
    pub bytes: u64,
    /// Whether the kernel paged them in (`MADV_POPULATE_READ`; Linux 5.14 on).
    pub populated: bool,
    /// Not paged in: the bytes exceed what the system had available (this many bytes).
    pub skipped: Option<u64>,
}

/// What [`Model::set_cpu_weight_layout`] did: tensors (and their bytes) interleaved now, used
/// as the file stores them interleaved, and put back in GGUF order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayoutChange {
    pub interleaved: usize,
    pub interleaved_bytes: u64,
    pub as_stored: usize,
    pub as_stored_bytes: u64,
    pub restored: usize,
    pub restored_bytes: u64,
}

/// Whether tensor `name` is one of the weight matrices moxie keeps interleaved in host memory
/// (where its type and shape have that layout): the attention projections, dense and
/// shared-expert FFNs and routed experts of a layer, and the output head (`output.weight`; a
/// head tied to the token embeddings stays in GGUF order, the embedding lookup reads rows).
/// Load-time repacking and `moxie quantize --repack` both go by this, so a repacked file holds
/// what loading would repack.
pub fn interleave_candidate(name: &str) -> bool {
    const MATRICES: [&str; 18] = [
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_output",
        "attn_q_a",
        "attn_q_b",
        "attn_kv_a_mqa",
        "attn_k_b",
        "attn_v_b",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
        "ffn_gate_exps",
        "ffn_up_exps",
        "ffn_down_exps",
        "ffn_gate_shexp",
        "ffn_up_shexp",
        "ffn_down_shexp",
    ];
    if name == "output.weight" {
        return true;
    }
    let Some(rest) = name.strip_prefix("blk.") else {
        return false;
    };
    let Some((layer, rest)) = rest.split_once('.') else {
        return false;
    };
    layer.parse::<usize>().is_ok()
        && rest
            .strip_suffix(".weight")
            .is_some_and(|m| MATRICES.contains(&m))
}
