//! What the blocks that run on GPUs share during one forward pass ([`GpuPass`]): per GPU used,
//! the batch's RoPE table in device memory and named work buffers, grown on demand and kept
//! between passes (held against the device's budget), and host buffers for transfers, so
//! decode allocates neither. Nothing is done for a pass that touches no GPU.
//!
//! GPU numerics round where the CPU's do (activations to the CPU's q8 blocks for the weight
//! types with int8 kernels, attention queries and a prompt batch's probabilities as the CPU's
//! attention does; docs/architecture.md, "GPUs"): results match the CPU backend to float
//! rounding where every weight type has int8 kernels, else within the tolerance llama.cpp's
//! own CUDA and CPU backends differ by.

use std::collections::HashMap;
use std::sync::Mutex;

use moxie_gpu::{Buffer, DevPtr, Gpu, Weight};

use crate::device::{DeviceId, Devices, Reservation, CPU};
use crate::tensor::Tensor;
use crate::{Error, Result};

/// Bytes of an f32.
pub(crate) const F32: usize = 4;

/// `t` as a GPU kernel's weight operand (an error if it is not in GPU memory).
pub(crate) fn weight(t: &Tensor) -> Result<Weight> {
    t.gpu_weight().ok_or_else(|| {
        Error::Model(format!(
            "tensor '{}' runs in a GPU stage but is not in GPU memory",
            t.name
        ))
    })
}

/// Named work buffers of one GPU, grown on demand and kept between forward passes (held
/// against the device's budget), and the host-side buffers of its transfers.
#[derive(Default)]
pub(crate) struct GpuScratch {
    bufs: HashMap<&'static str, (Buffer, Reservation)>,
    host: HostBuffers,
}

/// Host-side buffers of one GPU's transfers: expert ids and weights crossing with the host,
/// and rows (the RoPE table flattened for upload; routed experts' sums from the host).
#[derive(Default)]
pub(crate) struct HostBuffers {
    pub ids: Vec<i32>,
    pub weights: Vec<f32>,
    pub rows: Vec<f32>,
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

/// One forward pass's GPU state: per GPU used, the RoPE table of this batch and work buffers.
pub(crate) struct GpuPass<'m> {
    devices: &'m Devices,
    pool: &'m GpuScratchPool,
    /// (cos, sin) per token and rotated pair, as the CPU path computes them.
    rope: &'m [Vec<(f32, f32)>],
    /// Rotated pairs per token.
    pub n_pairs: usize,
    devs: Vec<Option<DevPass>>,
}

struct DevPass {
    gpu: Gpu,
    /// This batch's RoPE table in the work buffer "rope" (none without rotated pairs).
    rope: Option<DevPtr>,
    scratch: GpuScratch,
}

impl<'m> GpuPass<'m> {
    pub(crate) fn new(
        devices: &'m Devices,
        pool: &'m GpuScratchPool,
        rope: &'m [Vec<(f32, f32)>],
    ) -> GpuPass<'m> {
        GpuPass {
            devices,
            pool,
            rope,
            n_pairs: rope.first().map_or(0, Vec::len),
            devs: (0..devices.len()).map(|_| None).collect(),
        }
    }

    /// Give the work buffers back to the model's pool.
    pub(crate) fn finish(self) -> Result<()> {
        for (id, d) in self.devs.into_iter().enumerate() {
            if let Some(d) = d {
                d.gpu.synchronize()?;
                self.pool.give(id, d.scratch);
            }
        }
        Ok(())
    }

    fn dev(&mut self, id: DeviceId) -> Result<&mut DevPass> {
        if self.devs[id].is_none() {
            let gpu = self.devices.gpu(id).expect("a GPU stage").clone();
            let mut scratch = self.pool.take(id);
            let rope = if self.n_pairs == 0 {
                None
            } else {
                let table = &mut scratch.host.rows;
                table.clear();
                table.extend(self.rope.iter().flatten().flat_map(|&(c, s)| [c, s]));
                let bytes = table.len() * F32;
                let p = scratch.get(self.devices, id, "rope", bytes)?;
                gpu.backend()
                    .upload(p, bytemuck::cast_slice(&scratch.host.rows))?;
                self.devices
                    .count_copy(CPU, id, scratch.host.rows.len() * F32);
                Some(p)
            };
            self.devs[id] = Some(DevPass { gpu, rope, scratch });
        }
        Ok(self.devs[id].as_mut().expect("set above"))
    }

    /// GPU `id`, set up for this pass.
    pub(crate) fn gpu(&mut self, id: DeviceId) -> Result<Gpu> {
        Ok(self.dev(id)?.gpu.clone())
    }

    /// A work buffer of `elems` f32 on GPU `id`.
    pub(crate) fn buf(&mut self, id: DeviceId, name: &'static str, elems: usize) -> Result<DevPtr> {
        let devices = self.devices;
        let d = self.dev(id)?;
        d.scratch.get(devices, id, name, elems * F32)
    }

    /// This batch's RoPE table on GPU `id`.
    pub(crate) fn rope_table(&mut self, id: DeviceId) -> Result<DevPtr> {
        self.dev(id)?
            .rope
            .ok_or_else(|| Error::Model("the model has no RoPE table".into()))
    }

    /// GPU `id`'s host transfer buffers, taken out (give them back with
    /// [`GpuPass::give_host`]) so work buffers can be asked for meanwhile.
    pub(crate) fn take_host(&mut self, id: DeviceId) -> Result<HostBuffers> {
        Ok(std::mem::take(&mut self.dev(id)?.scratch.host))
    }

    pub(crate) fn give_host(&mut self, id: DeviceId, host: HostBuffers) {
        self.devs[id].as_mut().expect("dev() first").scratch.host = host;
    }
}
