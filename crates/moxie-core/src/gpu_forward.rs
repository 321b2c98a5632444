//! The stages of a layer run on a GPU: the same computation as the CPU path in `model.rs`
//! (norm → attention → residual, norm → FFN or MoE → residual, the output head), as kernel
//! launches on the GPU holding the stage's weights. The hidden state stays in device memory
//! between stages on one GPU; only it (and the routing, when routed experts live elsewhere)
//! crosses to other devices.
//!
//! GPU numerics are f32 activations against the weights' exact dequantized values, not
//! ggml's CPU conversions of activations to q8: results match the CPU backend within the
//! tolerance llama.cpp's own CUDA and CPU backends differ by, not bit for bit.

use std::collections::HashMap;
use std::sync::Mutex;

use moxie_gpu::ops::{AttnShape, KvView, RouteSpec};
use moxie_gpu::{Buffer, DevPtr, Gpu, Weight};
use moxie_quant::GgmlType;

use crate::config::{Config, Gating};
use crate::device::{DeviceId, Devices, Reservation, Resident, CPU};
use crate::kv_cache::{GpuKv, KvCache, KvTypes, LayerKvShape};
use crate::model::{Attention, DenseFfn, Ffn, Gqa, Layer, LayerDevices, Mla, Model, Moe};
use crate::moe::MoeScratch;
use crate::ops::RopeKind;
use crate::parallel::Parallel;
use crate::tensor::Tensor;
use crate::{Error, Result};

/// One layer's cache in GPU memory for `n_ctx` positions: keys and values of one type, f16
/// or f32 (the attention kernel reads both with one element type).
pub(crate) fn new_layer_cache(
    gpu: &Gpu,
    shape: LayerKvShape,
    n_ctx: usize,
    types: KvTypes,
) -> Result<GpuKv> {
    let f16 = match (types.k, types.v) {
        (GgmlType::F16, GgmlType::F16) => true,
        (GgmlType::F32, GgmlType::F32) => false,
        (k, v) => {
            return Err(Error::Model(format!(
                "a {k} / {v} cache is not supported on the GPU yet (use -ctk and -ctv both f16 \
                 or both f32)"
            )))
        }
    };
    let elem = if f16 { 2 } else { 4 };
    let k = Buffer::new(gpu.backend(), n_ctx * shape.k_width * elem)?;
    let v = Buffer::new(gpu.backend(), n_ctx * shape.v_width * elem)?;
    Ok(GpuKv { k, v, f16 })
}

/// A layer's vectors (norm weights, biases, selection bias) copied to the GPU of the stage
/// that reads them. Their device memory was reserved when they were loaded.
#[derive(Default)]
pub(crate) struct LayerVectors {
    attn_norm: Option<Buffer>,
    bq: Option<Buffer>,
    bk: Option<Buffer>,
    bv: Option<Buffer>,
    q_norm: Option<Buffer>,
    k_norm: Option<Buffer>,
    q_a_norm: Option<Buffer>,
    kv_a_norm: Option<Buffer>,
    ffn_norm: Option<Buffer>,
    probs_bias: Option<Buffer>,
}

fn upload(gpu: Option<&Gpu>, v: Option<&Vec<f32>>) -> Result<Option<Buffer>> {
    match (gpu, v) {
        (Some(g), Some(v)) => Ok(Some(Buffer::from_f32(g.backend(), v)?)),
        _ => Ok(None),
    }
}

impl LayerVectors {
    pub(crate) fn new(devices: &Devices, layer: &Layer, ld: &LayerDevices) -> Result<Self> {
        let attn = devices.gpu(ld.attn);
        let ffn = devices.gpu(ld.ffn);
        let mut v = LayerVectors {
            attn_norm: upload(attn, Some(&layer.attn_norm))?,
            ffn_norm: upload(ffn, Some(&layer.ffn_norm))?,
            ..Default::default()
        };
        match &layer.attn {
            Attention::Gqa(a) => {
                v.bq = upload(attn, a.bq.as_ref())?;
                v.bk = upload(attn, a.bk.as_ref())?;
                v.bv = upload(attn, a.bv.as_ref())?;
                v.q_norm = upload(attn, a.q_norm.as_ref())?;
                v.k_norm = upload(attn, a.k_norm.as_ref())?;
            }
            Attention::Mla(a) => {
                v.q_a_norm = upload(attn, a.wq_a.as_ref().map(|(_, n)| n))?;
                v.kv_a_norm = upload(attn, Some(&a.kv_a_norm))?;
            }
        }
        if let Ffn::Moe(m) = &layer.ffn {
            v.probs_bias = upload(ffn, m.probs_bias.as_ref())?;
        }
        Ok(v)
    }
}

/// Named work buffers of one GPU, grown on demand and kept between forward passes (held
/// against the device's budget), and the host-side buffers of its transfers, so decode
/// allocates neither.
#[derive(Default)]
pub(crate) struct GpuScratch {
    bufs: HashMap<&'static str, (Buffer, Reservation)>,
    /// Expert ids and weights crossing with the host.
    host_ids: Vec<i32>,
    host_w: Vec<f32>,
    /// The RoPE table flattened for upload; routed experts' sums from the host.
    host_rows: Vec<f32>,
}

impl GpuScratch {
    fn get(
        &mut self,
        devices: &Devices,
        dev: DeviceId,
        name: &'static str,
        bytes: usize,
    ) -> Result<DevPtr> {
        let fits = self.bufs.get(name).is_some_and(|(b, _)| b.len() >= bytes);
        if !fits {
            // Give the old one back before taking the larger one.
            self.bufs.remove(name);
            let held = devices.reserve(dev, bytes as u64, &format!("GPU work buffer '{name}'"))?;
            let gpu = devices.gpu(dev).expect("GPU scratch on a GPU");
            let buf = Buffer::new(gpu.backend(), bytes)?;
            self.bufs.insert(name, (buf, held));
        }
        Ok(self.bufs[name].0.ptr())
    }
}

/// Work buffers per GPU for forward passes, taken and given back like the MoE scratch.
#[derive(Default)]
pub(crate) struct GpuScratchPool(Mutex<Vec<(DeviceId, GpuScratch)>>);

impl GpuScratchPool {
    fn take(&self, dev: DeviceId) -> GpuScratch {
        let mut pool = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match pool.iter().position(|(d, _)| *d == dev) {
            Some(i) => pool.swap_remove(i).1,
            None => GpuScratch::default(),
        }
    }

    fn give(&self, dev: DeviceId, s: GpuScratch) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((dev, s));
    }
}

fn weight(t: &Tensor) -> Result<Weight> {
    t.gpu_weight().ok_or_else(|| {
        Error::Model(format!(
            "tensor '{}' runs in a GPU stage but is not in GPU memory",
            t.name
        ))
    })
}

fn ptr(b: &Option<Buffer>, what: &str) -> Result<DevPtr> {
    b.as_ref()
        .map(Buffer::ptr)
        .ok_or_else(|| Error::Model(format!("{what} is not in GPU memory")))
}

const F32: usize = 4;

/// One forward pass's GPU state: per GPU used, the RoPE table of this batch and work buffers
/// (nothing is done for a pass that touches no GPU).
pub(crate) struct GpuPass<'m> {
    model: &'m Model,
    n: usize,
    pos0: usize,
    /// (cos, sin) per token and rotated pair, as the CPU path computes them.
    rope: &'m [Vec<(f32, f32)>],
    n_pairs: usize,
    devs: Vec<Option<DevPass>>,
}

struct DevPass {
    gpu: Gpu,
    /// This batch's RoPE table in the work buffer "rope" (none without rotated pairs).
    rope: Option<DevPtr>,
    scratch: GpuScratch,
}

impl<'m> GpuPass<'m> {
    pub(crate) fn new(model: &'m Model, rope: &'m [Vec<(f32, f32)>], pos0: usize) -> GpuPass<'m> {
        GpuPass {
            model,
            n: rope.len(),
            pos0,
            rope,
            n_pairs: rope.first().map_or(0, Vec::len),
            devs: (0..model.devices.len()).map(|_| None).collect(),
        }
    }

    /// Give the work buffers back to the model's pool.
    pub(crate) fn finish(self) -> Result<()> {
        for (id, d) in self.devs.into_iter().enumerate() {
            if let Some(d) = d {
                d.gpu.synchronize()?;
                self.model.gpu_scratch.give(id, d.scratch);
            }
        }
        Ok(())
    }

    fn dev(&mut self, id: DeviceId) -> Result<&mut DevPass> {
        if self.devs[id].is_none() {
            let devices = &self.model.devices;
            let gpu = devices.gpu(id).expect("a GPU stage").clone();
            let mut scratch = self.model.gpu_scratch.take(id);
            let rope = if self.n_pairs == 0 {
                None
            } else {
                let table = &mut scratch.host_rows;
                table.clear();
                table.extend(self.rope.iter().flatten().flat_map(|&(c, s)| [c, s]));
                let bytes = table.len() * F32;
                let p = scratch.get(devices, id, "rope", bytes)?;
                gpu.backend()
                    .upload(p, bytemuck::cast_slice(&scratch.host_rows))?;
                devices.count_copy(CPU, id, scratch.host_rows.len() * F32);
                Some(p)
            };
            self.devs[id] = Some(DevPass { gpu, rope, scratch });
        }
        Ok(self.devs[id].as_mut().expect("set above"))
    }

    /// A work buffer of `elems` f32 on GPU `id`.
    fn buf(&mut self, id: DeviceId, name: &'static str, elems: usize) -> Result<DevPtr> {
        let devices = &self.model.devices;
        let d = self.devs[id].as_mut().expect("dev() first");
        d.scratch.get(devices, id, name, elems * F32)
    }

    fn rope_table(&self, id: DeviceId) -> Result<DevPtr> {
        let d = self.devs[id].as_ref().expect("dev() first");
        d.rope
            .ok_or_else(|| Error::Model("the model has no RoPE table".into()))
    }

    /// GPU `id`'s host transfer buffers, taken out (give them back with
    /// [`GpuPass::give_host`]) so work buffers can be asked for meanwhile.
    fn take_host(&mut self, id: DeviceId) -> (Vec<i32>, Vec<f32>, Vec<f32>) {
        let s = &mut self.devs[id].as_mut().expect("dev() first").scratch;
        (
            std::mem::take(&mut s.host_ids),
            std::mem::take(&mut s.host_w),
            std::mem::take(&mut s.host_rows),
        )
    }

    fn give_host(&mut self, id: DeviceId, (ids, w, rows): (Vec<i32>, Vec<f32>, Vec<f32>)) {
        let s = &mut self.devs[id].as_mut().expect("dev() first").scratch;
        (s.host_ids, s.host_w, s.host_rows) = (ids, w, rows);
    }

    /// The token embeddings of `tokens` from a GPU-resident table into `x` on that GPU.
    pub(crate) fn embed(&mut self, tokens: &[u32], x: &mut Resident<'_>) -> Result<()> {
        let m = self.model;
        let id = m.tok_embd.device;
        let gpu = self.dev(id)?.gpu.clone();
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let ids_dev = self.buf(id, "token_ids", ids.len())?;
        gpu.backend().upload(ids_dev, bytemuck::cast_slice(&ids))?;
        m.devices.count_copy(CPU, id, ids.len() * 4);
        let xp = x.loaded_on_gpu(id, tokens.len() * m.config.n_embd)?;
        gpu.get_rows(&weight(&m.tok_embd)?, ids_dev, tokens.len(), xp)?;
        Ok(())
    }

    /// `x += attention(norm(x))` for layer `il` on GPU `id` (`x` already there).
    pub(crate) fn attention(
        &mut self,
        il: usize,
        id: DeviceId,
        x: DevPtr,
        cache: &KvCache,
    ) -> Result<()> {
        let m = self.model;
        let c = &m.config;
        let layer = &m.layers[il];
        let vecs = &m.gpu_vectors[il];
        let gpu = self.dev(id)?.gpu.clone();
        let n = self.n;
        let h = self.buf(id, "h", n * c.n_embd)?;
        gpu.rms_norm(
            x,
            c.n_embd,
            ptr(&vecs.attn_norm, "attn_norm")?,
            h,
            c.n_embd,
            n,
            c.n_embd,
            c.rms_eps,
        )?;
        let kv = cache.gpu(il).ok_or_else(|| {
            Error::Model(format!(
                "layer {il}'s attention runs on {} but its KV cache is not there",
                gpu.name()
            ))
        })?;
        let o = match &layer.attn {
            Attention::Gqa(a) => self.gqa(&gpu, id, c, a, vecs, h, kv)?,
            Attention::Mla(a) => self.mla(&gpu, id, c, a, vecs, h, kv)?,
        };
        gpu.add(x, o, n * c.n_embd)?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn gqa(
        &mut self,
        gpu: &Gpu,
        id: DeviceId,
        c: &Config,
        a: &Gqa,
        vecs: &LayerVectors,
        h: DevPtr,
        kv: &GpuKv,
    ) -> Result<DevPtr> {
        let n = self.n;
        let (hd, dv, nh, nkv) = (c.head_dim_k, c.head_dim_v, c.n_head, c.n_head_kv);
        let q = self.buf(id, "q", n * nh * hd)?;
        let k = self.buf(id, "k", n * nkv * hd)?;
        let v = self.buf(id, "v", n * nkv * dv)?;
        gpu.mul_mat(&weight(&a.wq)?, 1, h, c.n_embd, 0, q, nh * hd, 0, n)?;
        gpu.mul_mat(&weight(&a.wk)?, 1, h, c.n_embd, 0, k, nkv * hd, 0, n)?;
        gpu.mul_mat(&weight(&a.wv)?, 1, h, c.n_embd, 0, v, nkv * dv, 0, n)?;
        for (b, y, width) in [
            (&vecs.bq, q, nh * hd),
            (&vecs.bk, k, nkv * hd),
            (&vecs.bv, v, nkv * dv),
        ] {
            if let Some(b) = b {
                gpu.add_bias(y, b.ptr(), n * width, width)?;
            }
        }
        if let Some(w) = &vecs.q_norm {
            gpu.rms_norm(q, hd, w.ptr(), q, hd, n * nh, hd, c.rms_eps)?;
        }
        if let Some(w) = &vecs.k_norm {
            gpu.rms_norm(k, hd, w.ptr(), k, hd, n * nkv, hd, c.rms_eps)?;
        }
        let cs = self.rope_table(id)?;
        let neox = c.rope.kind == RopeKind::Neox;
        gpu.rope(q, cs, n, nh, hd, nh * hd, 0, self.n_pairs, neox)?;
        gpu.rope(k, cs, n, nkv, hd, nkv * hd, 0, self.n_pairs, neox)?;
        let elem = if kv.f16 { 2 } else { 4 };
        let (kw, vw) = (nkv * hd, nkv * dv);
        gpu.kv_store(kv.k.at(self.pos0 * kw * elem), kv.f16, k, n, kw, kw)?;
        gpu.kv_store(kv.v.at(self.pos0 * vw * elem), kv.f16, v, n, vw, vw)?;
        let out = self.buf(id, "attn_out", n * nh * dv)?;
        gpu.attention(
            AttnShape {
                n_head: nh,
                n_head_kv: nkv,
                dk: hd,
                dv,
                pos0: self.pos0,
                scale: c.kq_scale(),
            },
            q,
            KvView {
                k: kv.k.ptr(),
                v: kv.v.ptr(),
                k_row: kw,
                v_row: vw,
                f16: kv.f16,
            },
            out,
            n,
        )?;
        let o = self.buf(id, "o", n * c.n_embd)?;
        gpu.mul_mat(&weight(&a.wo)?, 1, out, nh * dv, 0, o, c.n_embd, 0, n)?;
        Ok(o)
    }

    #[allow(clippy::too_many_arguments)]
    fn mla(
        &mut self,
        gpu: &Gpu,
        id: DeviceId,
        c: &Config,
        a: &Mla,
        vecs: &LayerVectors,
        h: DevPtr,
        kv: &GpuKv,
    ) -> Result<DevPtr> {
        let n = self.n;
        let (nh, rank, n_rot) = (c.n_head, c.kv_lora_rank, c.n_rot);
        let dk = c.head_dim_k_mla;
        let nope = dk - n_rot;
        let dv = c.head_dim_v_mla;
        let q = self.buf(id, "q", n * nh * dk)?;
        match &a.wq_a {
            Some((wq_a, _)) => {
                let wa = weight(wq_a)?;
                let qa = self.buf(id, "q_a", n * wa.n_out)?;
                gpu.mul_mat(&wa, 1, h, c.n_embd, 0, qa, wa.n_out, 0, n)?;
                let norm = ptr(&vecs.q_a_norm, "attn_q_a_norm")?;
                gpu.rms_norm(qa, wa.n_out, norm, qa, wa.n_out, n, wa.n_out, c.rms_eps)?;
                gpu.mul_mat(&weight(&a.wq_b)?, 1, qa, wa.n_out, 0, q, nh * dk, 0, n)?;
            }
            None => gpu.mul_mat(&weight(&a.wq_b)?, 1, h, c.n_embd, 0, q, nh * dk, 0, n)?,
        }
        let kw = rank + n_rot;
        let kvr = self.buf(id, "kv", n * kw)?;
        gpu.mul_mat(&weight(&a.wkv_a)?, 1, h, c.n_embd, 0, kvr, kw, 0, n)?;
        // Absorbed queries [latent | rope] per head: attn_k_b maps each head's nope part.
        let qw = rank + n_rot;
        let qfull = self.buf(id, "q_full", n * nh * qw)?;
        let wk_b = weight(&a.wk_b)?;
        gpu.mul_mat(&wk_b, nh, q, nh * dk, dk, qfull, nh * qw, qw, n)?;
        let cs = self.rope_table(id)?;
        let neox = c.rope.kind == RopeKind::Neox;
        gpu.rope(q, cs, n, nh, dk, nh * dk, nope, self.n_pairs, neox)?;
        gpu.copy_rows(
            qfull + (rank * F32) as u64,
            qw,
            q + (nope * F32) as u64,
            dk,
            n * nh,
            n_rot,
        )?;
        gpu.rope(kvr, cs, n, 1, kw, kw, rank, self.n_pairs, neox)?;
        let norm = ptr(&vecs.kv_a_norm, "attn_kv_a_norm")?;
        gpu.rms_norm(kvr, kw, norm, kvr, kw, n, rank, c.rms_eps)?;
        let elem = if kv.f16 { 2 } else { 4 };
        gpu.kv_store(kv.k.at(self.pos0 * kw * elem), kv.f16, kvr, n, kw, kw)?;
        let latent = self.buf(id, "latent_out", n * nh * rank)?;
        gpu.attention(
            AttnShape {
                n_head: nh,
                n_head_kv: 1,
                dk: qw,
                dv: rank,
                pos0: self.pos0,
                scale: c.kq_scale(),
            },
            qfull,
            KvView {
                k: kv.k.ptr(),
                v: kv.k.ptr(),
                k_row: kw,
                v_row: kw,
                f16: kv.f16,
            },
            latent,
            n,
        )?;
        let heads = self.buf(id, "heads", n * nh * dv)?;
        gpu.mul_mat(
            &weight(&a.wv_b)?,
            nh,
            latent,
            nh * rank,
            rank,
            heads,
            nh * dv,
            dv,
            n,
        )?;
        let o = self.buf(id, "o", n * c.n_embd)?;
        gpu.mul_mat(&weight(&a.wo)?, 1, heads, nh * dv, 0, o, c.n_embd, 0, n)?;
        Ok(o)
    }

    /// SwiGLU FFN of `h` into a work buffer on GPU `id`.
    fn dense(&mut self, gpu: &Gpu, id: DeviceId, f: &DenseFfn, h: DevPtr) -> Result<DevPtr> {
        let n = self.n;
        let gate = weight(&f.gate)?;
        let n_ff = gate.n_out;
        let g = self.buf(id, "ffn_gate", n * n_ff)?;
        let u = self.buf(id, "ffn_up", n * n_ff)?;
        gpu.mul_mat(&gate, 1, h, gate.n_in, 0, g, n_ff, 0, n)?;
        gpu.mul_mat(&weight(&f.up)?, 1, h, gate.n_in, 0, u, n_ff, 0, n)?;
        gpu.swiglu(g, u, n * n_ff)?;
        let down = weight(&f.down)?;
        let o = self.buf(id, "ffn_out", n * down.n_out)?;
        gpu.mul_mat(&down, 1, g, n_ff, 0, o, down.n_out, 0, n)?;
        Ok(o)
    }

    /// The routed experts (`[gate, up, down]` weights in this GPU's memory) on GPU `id` for
    /// routes `ids`/`weights` already there: `out (+)=` their weighted sum.
    #[allow(clippy::too_many_arguments)]
    fn routed_experts(
        &mut self,
        gpu: &Gpu,
        id: DeviceId,
        [gate, up, down]: [Weight; 3],
        h: DevPtr,
        ids: DevPtr,
        weights: DevPtr,
        out: DevPtr,
        accumulate: bool,
    ) -> Result<()> {
        let c = &self.model.config;
        let (n, k) = (self.n, c.n_expert_used);
        let n_ff = gate.n_out;
        let g = self.buf(id, "exp_gate", n * k * n_ff)?;
        let u = self.buf(id, "exp_up", n * k * n_ff)?;
        gpu.mul_mat_id(&gate, ids, n * k, h, c.n_embd, k, g, n_ff)?;
        gpu.mul_mat_id(&up, ids, n * k, h, c.n_embd, k, u, n_ff)?;
        gpu.swiglu(g, u, n * k * n_ff)?;
        let d = self.buf(id, "exp_down", n * k * c.n_embd)?;
        gpu.mul_mat_id(&down, ids, n * k, g, n_ff, 1, d, c.n_embd)?;
        gpu.moe_sum(d, weights, out, n, k, c.n_embd, accumulate)?;
        Ok(())
    }

    /// The expert weights of `m` as they sit in GPU memory.
    fn resident_experts(m: &Moe) -> Result<[Weight; 3]> {
        Ok([
            weight(&m.gate_exps)?,
            weight(&m.up_exps)?,
            weight(&m.down_exps)?,
        ])
    }

    /// llama.cpp's op offload: copy a host-resident layer's expert weights into work buffers
    /// of GPU `id` for one large batch (when streaming them over PCIe beats the CPU).
    fn streamed_experts(&mut self, id: DeviceId, m: &Moe) -> Result<[Weight; 3]> {
        Ok([
            self.stream_weight(id, "offload_gate", &m.gate_exps)?,
            self.stream_weight(id, "offload_up", &m.up_exps)?,
            self.stream_weight(id, "offload_down", &m.down_exps)?,
        ])
    }

    /// Host tensor `t` copied into work buffer `name` of GPU `id`.
    fn stream_weight(&mut self, id: DeviceId, name: &'static str, t: &Tensor) -> Result<Weight> {
        let bytes = t.data();
        let p = self.buf(id, name, bytes.len().div_ceil(F32))?;
        self.dev(id)?.gpu.backend().upload(p, bytes)?;
        self.model.devices.count_copy(CPU, id, bytes.len());
        Ok(t.weight_at(p))
    }

    /// `x += ffn(norm(x))` for layer `il` with its FFN part on GPU `ld.ffn` (`x` there). Routed
    /// experts on another device get the normed input and the routes, and send back their
    /// weighted sum; the shared expert runs on the GPU meanwhile (launches are queued, so the
    /// GPU works while the host computes the experts).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn ffn(
        &mut self,
        il: usize,
        ld: &LayerDevices,
        x: DevPtr,
        par: &Parallel,
        moe: &mut MoeScratch,
        host_h: &mut Vec<f32>,
    ) -> Result<()> {
        let m = self.model;
        let c = &m.config;
        let id = ld.ffn;
        let layer = &m.layers[il];
        let vecs = &m.gpu_vectors[il];
        let gpu = self.dev(id)?.gpu.clone();
        let n = self.n;
        let e = c.n_embd;
        let h = self.buf(id, "h", n * e)?;
        gpu.rms_norm(
            x,
            e,
            ptr(&vecs.ffn_norm, "ffn_norm")?,
            h,
            e,
            n,
            e,
            c.rms_eps,
        )?;
        let moe_layer = match &layer.ffn {
            Ffn::Dense(f) => {
                let o = self.dense(&gpu, id, f, h)?;
                return Ok(gpu.add(x, o, n * e)?);
            }
            Ffn::Moe(mo) => mo,
        };
        let k = c.n_expert_used;
        let router = weight(&moe_layer.router)?;
        let logits = self.buf(id, "router_logits", n * c.n_expert)?;
        gpu.mul_mat(&router, 1, h, e, 0, logits, c.n_expert, 0, n)?;
        let ids = self.buf(id, "expert_ids", n * k)?;
        let weights = self.buf(id, "expert_weights", n * k)?;
        let bias = vecs.probs_bias.as_ref().map(Buffer::ptr);
        gpu.route(route_spec(c), logits, bias, ids, weights, n)?;
        let offload = ld.experts == CPU && n >= m.op_offload_min_batch().unwrap_or(usize::MAX);
        if ld.experts == id || offload {
            let experts = if offload {
                self.streamed_experts(id, moe_layer)?
            } else {
                Self::resident_experts(moe_layer)?
            };
            self.routed_experts(&gpu, id, experts, h, ids, weights, x, true)?;
            if let Some(sh) = &moe_layer.shared {
                let o = self.dense(&gpu, id, sh, h)?;
                gpu.add(x, o, n * e)?;
            }
        } else {
            // The normed input and the routes go to the experts' device.
            let (mut route_ids, mut route_w, mut sum) = self.take_host(id);
            host_h.resize(n * e, 0.0);
            route_ids.resize(n * k, 0);
            route_w.resize(n * k, 0.0);
            gpu.backend()
                .download(h, bytemuck::cast_slice_mut(host_h))?;
            gpu.backend()
                .download(ids, bytemuck::cast_slice_mut(&mut route_ids))?;
            gpu.backend()
                .download(weights, bytemuck::cast_slice_mut(&mut route_w))?;
            m.devices
                .count_copy(id, ld.experts, (n * e + 2 * n * k) * F32);
            // Queue the shared expert before the host starts on the routed ones.
            if let Some(sh) = &moe_layer.shared {
                let o = self.dense(&gpu, id, sh, h)?;
                gpu.add(x, o, n * e)?;
            }
            moe.set_routes(&route_ids, &route_w, c.n_expert)?;
            let s = self.buf(id, "expert_sum", n * e)?;
            if let Some(egpu) = m.devices.gpu(ld.experts) {
                // Experts on another GPU: through the host.
                let egpu = egpu.clone();
                self.experts_on_gpu_from_host(&egpu, ld.experts, moe_layer, host_h, moe, &mut sum)?;
                gpu.backend().upload(s, bytemuck::cast_slice(&sum))?;
            } else {
                let routed = crate::moe::routed_experts(c, moe_layer, host_h, n, par, moe)?;
                gpu.backend().upload(s, bytemuck::cast_slice(routed))?;
            }
            m.devices.count_copy(ld.experts, id, n * e * F32);
            gpu.add(x, s, n * e)?;
            self.give_host(id, (route_ids, route_w, sum));
        }
        Ok(())
    }

    /// Routed experts on GPU `id` for a layer whose router ran elsewhere: the normed input
    /// and the routes (in `moe`) are uploaded, the weighted sum comes back into `sum`.
    pub(crate) fn experts_on_gpu_from_host(
        &mut self,
        gpu: &Gpu,
        id: DeviceId,
        m: &Moe,
        h: &[f32],
        moe: &MoeScratch,
        sum: &mut Vec<f32>,
    ) -> Result<()> {
        self.dev(id)?;
        let c = &self.model.config;
        let (n, k, e) = (self.n, c.n_expert_used, c.n_embd);
        let (mut ids_host, mut w_host, rows) = self.take_host(id);
        ids_host.clear();
        ids_host.extend(moe.routes().iter().map(|r| r.0 as i32));
        w_host.clear();
        w_host.extend(moe.routes().iter().map(|r| r.1));
        let hd = self.buf(id, "exp_in", n * e)?;
        let ids = self.buf(id, "exp_ids_in", n * k)?;
        let weights = self.buf(id, "exp_w_in", n * k)?;
        gpu.backend().upload(hd, bytemuck::cast_slice(h))?;
        gpu.backend().upload(ids, bytemuck::cast_slice(&ids_host))?;
        gpu.backend()
            .upload(weights, bytemuck::cast_slice(&w_host))?;
        self.give_host(id, (ids_host, w_host, rows));
        let out = self.buf(id, "exp_out", n * e)?;
        self.routed_experts(
            gpu,
            id,
            Self::resident_experts(m)?,
            hd,
            ids,
            weights,
            out,
            false,
        )?;
        sum.resize(n * e, 0.0);
        gpu.backend().download(out, bytemuck::cast_slice_mut(sum))?;
        Ok(())
    }

    /// The output head on GPU `id`: norm and project the rows `which` asks for, logits back
    /// to the host.
    pub(crate) fn output(
        &mut self,
        id: DeviceId,
        x: DevPtr,
        rows: std::ops::Range<usize>,
    ) -> Result<Vec<f32>> {
        let m = self.model;
        let c = &m.config;
        let gpu = self.dev(id)?.gpu.clone();
        let e = c.n_embd;
        let n_out = rows.len();
        let h = self.buf(id, "h", self.n * e)?;
        let norm = ptr(&m.gpu_output_norm, "output_norm")?;
        gpu.rms_norm(
            x + (rows.start * e * F32) as u64,
            e,
            norm,
            h,
            e,
            n_out,
            e,
            c.rms_eps,
        )?;
        let out = weight(&m.output)?;
        let logits = self.buf(id, "logits", n_out * c.n_vocab)?;
        gpu.mul_mat(&out, 1, h, e, 0, logits, c.n_vocab, 0, n_out)?;
        let mut host = vec![0f32; n_out * c.n_vocab];
        gpu.backend()
            .download(logits, bytemuck::cast_slice_mut(&mut host))?;
        m.devices.count_copy(id, CPU, host.len() * F32);
        Ok(host)
    }
}

fn route_spec(c: &Config) -> RouteSpec {
    RouteSpec {
        n_expert: c.n_expert,
        k: c.n_expert_used,
        sigmoid: c.gating == Gating::Sigmoid,
        n_groups: c.n_expert_groups.max(1),
        n_group_used: c.n_group_used,
        norm: c.expert_weights_norm,
        scale: c.expert_weights_scale,
    }
}

/// What [`Model::calibrate_op_offload`] measured, and the threshold it chose.
#[derive(Clone, Debug)]
pub struct OpOffloadCalibration {
    /// The GPU the experts would be streamed to.
    pub device: String,
    /// Bytes of the largest host-resident expert layer whose router is on that GPU.
    pub layer_bytes: u64,
    /// Host-to-GPU copy rate measured on those weights, bytes per second.
    pub upload_bytes_per_s: f64,
    /// CPU time of that layer's routed experts per token (measured on a batch).
    pub cpu_s_per_token: f64,
    /// Batches of at least this many tokens stream (`None`: the GPU has no room for a layer).
    pub min_batch: Option<usize>,
}

impl std::fmt::Display for OpOffloadCalibration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "op offload to {}: experts layer {}, upload {:.2} GB/s = {:.1} ms, CPU experts \
             {:.3} ms per token: ",
            self.device,
            crate::placement::human_bytes(self.layer_bytes),
            self.upload_bytes_per_s / 1e9,
            self.layer_bytes as f64 / self.upload_bytes_per_s * 1e3,
            self.cpu_s_per_token * 1e3
        )?;
        match self.min_batch {
            Some(b) => write!(f, "batches of {b}+ tokens stream the experts to the GPU"),
            None => write!(f, "off (no room on the GPU for a layer's experts)"),
        }
    }
}

impl Model {
    /// Measure when streaming a layer's host-resident routed experts to the GPU that runs
    /// its router beats computing them on the CPU (llama.cpp's op offload, whose threshold
    /// is a fixed 32 tokens): the copy rate of those weights to that GPU, and the CPU's time
    /// per token for that layer's experts on a batch; streaming pays from
    /// `upload time / CPU time per token` tokens on (the GPU's own expert time is small next
    /// to the copy and is not counted). Sets and returns the threshold; `None` when no layer
    /// has its router on a GPU and its experts in RAM.
    pub fn calibrate_op_offload(&self, par: &Parallel) -> Result<Option<OpOffloadCalibration>> {
        let mut pick: Option<(usize, DeviceId, u64)> = None;
        for (il, (layer, ld)) in self.layers.iter().zip(&self.layer_devices).enumerate() {
            let Ffn::Moe(m) = &layer.ffn else { continue };
            if ld.experts != CPU || self.devices.gpu(ld.ffn).is_none() {
                continue;
            }
            let bytes = [&m.gate_exps, &m.up_exps, &m.down_exps]
                .iter()
                .map(|t| t.data().len() as u64)
                .sum::<u64>();
            if pick.is_none_or(|(_, _, b)| bytes > b) {
                pick = Some((il, ld.ffn, bytes));
            }
        }
        let Some((il, dev, layer_bytes)) = pick else {
            self.set_op_offload_min_batch(None);
            return Ok(None);
        };
        let Ffn::Moe(m) = &self.layers[il].ffn else {
            unreachable!("picked an MoE layer")
        };
        let device = self.devices.get(dev);
        let gpu = self.devices.gpu(dev).expect("picked a GPU").clone();

        // The copy rate, on the layer's own weights (best of three).
        let src = m.gate_exps.data();
        let n = src.len().min(64 << 20);
        let buf = Buffer::new(gpu.backend(), n)?;
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let t0 = std::time::Instant::now();
            gpu.backend().upload(buf.ptr(), &src[..n])?;
            gpu.synchronize()?;
            best = best.min(t0.elapsed().as_secs_f64());
        }
        let upload_bytes_per_s = n as f64 / best.max(1e-9);

        // The CPU's experts on a batch with routes spread over all experts (best of two).
        let c = &self.config;
        let n_tok = 32;
        let h: Vec<f32> = (0..n_tok * c.n_embd)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.5)
            .collect();
        let k = c.n_expert_used;
        let ids: Vec<i32> = (0..n_tok * k)
            .map(|i| ((i * 37 + i / k) % c.n_expert) as i32)
            .collect();
        let w = vec![1.0 / k as f32; n_tok * k];
        let mut s = MoeScratch::default();
        s.set_routes(&ids, &w, c.n_expert)?;
        let mut cpu = f64::INFINITY;
        for _ in 0..2 {
            let t0 = std::time::Instant::now();
            crate::moe::routed_experts(c, m, &h, n_tok, par, &mut s)?;
            cpu = cpu.min(t0.elapsed().as_secs_f64());
        }
        let cpu_s_per_token = cpu / n_tok as f64;

        let free = device.budget.map_or(u64::MAX, |b| {
            b.saturating_sub(device.stats().resident_bytes)
        });
        let min_batch = (free >= layer_bytes).then(|| {
            let upload_s = layer_bytes as f64 / upload_bytes_per_s;
            ((upload_s / cpu_s_per_token.max(1e-12)).ceil() as usize).max(2)
        });
        self.set_op_offload_min_batch(min_batch);
        Ok(Some(OpOffloadCalibration {
            device: device.name.clone(),
            layer_bytes,
            upload_bytes_per_s,
            cpu_s_per_token,
            min_batch,
        }))
    }
}
