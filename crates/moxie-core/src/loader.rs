//! Loading a model's tensors where the placement puts them: [`Placement`] (a device per tensor
//! name), [`TensorSource`] (lookup with the shapes an architecture expects), [`BlockTensors`]
//! (the tensors of one block, which must share a device: the block runs there) and
//! [`Vector`] (a small f32 weight, in the memory of its block's GPU too).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use moxie_gguf::GgufFile;
use moxie_gpu::{Buffer, DevPtr};

use crate::device::{DeviceId, Devices, Reservation, CPU};
use crate::progress::Progress;
use crate::tensor::Tensor;
use crate::{Error, Result};

/// Where a model's tensors go: its devices and a device per tensor name (a tensor not listed
/// stays on the CPU), and routed experts placed one by one (`-oe`).
#[derive(Default)]
pub struct Placement {
    pub devices: Devices,
    pub tensors: HashMap<String, DeviceId>,
    /// Per block: the device and the experts that live there rather than with the rest of
    /// the block's routed experts.
    pub experts: HashMap<usize, (DeviceId, Vec<usize>)>,
    /// `--expert-cache`, if any.
    pub expert_cache: Option<CachePlacement>,
}

/// Where the expert cache is and how many experts each layer's share holds.
pub struct CachePlacement {
    pub device: DeviceId,
    pub policy: crate::telemetry::CachePolicy,
    /// Per block: its experts in the cache, and the profile's selections per million tokens
    /// that seed it, if any.
    pub layers: HashMap<usize, (usize, Option<Vec<u64>>)>,
}

impl Placement {
    pub fn device_of(&self, name: &str) -> DeviceId {
        self.tensors.get(name).copied().unwrap_or(CPU)
    }
}

/// A small weight read as f32 (a norm, a bias, a selection bias): on the host, and in GPU
/// memory when its block runs on a GPU. Its memory on an accelerator is held against that
/// device's budget as long as it lives.
pub struct Vector {
    host: Vec<f32>,
    gpu: Option<Buffer>,
    _held: Option<Reservation>,
}

impl Vector {
    /// Its address in GPU memory (an error naming `what` if it is not there).
    pub fn ptr(&self, what: &str) -> Result<DevPtr> {
        self.gpu
            .as_ref()
            .map(Buffer::ptr)
            .ok_or_else(|| Error::Model(format!("{what} is not in GPU memory")))
    }
}

impl std::ops::Deref for Vector {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        &self.host
    }
}

/// Tensor lookup in a model file with the shapes an architecture expects; each tensor goes
/// where the placement says (copied into an accelerator's memory, or left mapped on the CPU).
pub(crate) struct TensorSource<'a> {
    pub file: &'a Arc<GgufFile>,
    placement: &'a Placement,
    /// Told the file bytes of every tensor placed off the host as it is copied there.
    progress: &'a dyn Progress,
}

impl<'a> TensorSource<'a> {
    pub fn new(
        file: &'a Arc<GgufFile>,
        placement: &'a Placement,
        progress: &'a dyn Progress,
    ) -> TensorSource<'a> {
        TensorSource {
            file,
            placement,
            progress,
        }
    }

    /// The file bytes of the tensors placed off the host (what loading copies to devices).
    pub fn device_bytes(&self) -> u64 {
        self.file
            .tensors()
            .iter()
            .filter(|t| self.placement.device_of(&t.name) != CPU)
            .map(|t| t.n_bytes)
            .sum()
    }

    /// Count tensor `t`'s file bytes as copied when it went to device `dev`.
    fn copied(&self, t: &Tensor, dev: DeviceId) {
        if dev != CPU {
            self.progress.advance(t.data().len() as u64);
        }
    }

    pub fn devices(&self) -> &Devices {
        &self.placement.devices
    }

    /// Layer `il`'s experts that the placement puts on another device than the rest of
    /// `moe`'s routed experts, held against that device's budget; on a GPU (which must run the
    /// layer's router) copied there.
    pub fn hot_experts(
        &self,
        il: usize,
        moe: &crate::blocks::moe::Moe,
    ) -> Result<Option<crate::blocks::moe::HotExperts>> {
        let Some((device, list)) = self.placement.experts.get(&il) else {
            return Ok(None);
        };
        let n_expert = moe.routing.n_expert;
        let devices = self.devices();
        let name = &devices.get(*device).name;
        if let Some(e) = list.iter().find(|&&e| e >= n_expert) {
            return Err(Error::Model(format!(
                "layer {il}: expert {e} placed on {name}, but the layer has {n_expert} experts"
            )));
        }
        if *device == moe.experts_device || list.is_empty() {
            return Ok(None);
        }
        let gpu = self.experts_off_cpu(il, moe, *device, &format!("experts placed on {name}"))?;
        let what = format!("layer {il}'s experts {}", crate::placement::ranges(list));
        let held = devices.reserve(*device, moe.expert_bytes() * list.len() as u64, &what)?;
        let mut is_hot = vec![false; n_expert];
        list.iter().for_each(|&e| is_hot[e] = true);
        let gpu = match gpu {
            Some(g) => Some(crate::blocks::moe::GpuHotCopies::upload(g, moe, list)?),
            None => None,
        };
        Ok(Some(crate::blocks::moe::HotExperts {
            device: *device,
            is_hot,
            held,
            gpu,
        }))
    }

    /// Checks that `moe`'s experts may be computed on `device` by `what` (-oe's hot experts,
    /// the expert cache) for layer `il`: the layer's routed experts are in RAM, and on a GPU
    /// the layer's router runs there (the GPU computes with the routes it made). Returns that
    /// GPU, if `device` is one.
    fn experts_off_cpu(
        &self,
        il: usize,
        moe: &crate::blocks::moe::Moe,
        device: DeviceId,
        what: &str,
    ) -> Result<Option<&moxie_gpu::Gpu>> {
        let devices = self.devices();
        if moe.experts_device != CPU {
            return Err(Error::Model(format!(
                "layer {il}: {what} takes experts off the CPU's, but this layer's routed experts \
                 are on {}",
                devices.get(moe.experts_device).name
            )));
        }
        let gpu = devices.gpu(device);
        if gpu.is_some() && moe.device != device {
            return Err(Error::Model(format!(
                "layer {il}: {what} computes with the layer's router, which is on {} (give the \
                 layer to {} with -ngl)",
                devices.get(moe.device).name,
                devices.get(device).name
            )));
        }
        Ok(gpu)
    }

    /// Layer `il`'s share of the expert cache, held against the cache device's budget (on a
    /// GPU, its slots allocated there and a seeded cache's first residents copied in), if the
    /// placement has one for it. Its routed experts must be in RAM, and on a GPU its router
    /// there.
    pub fn expert_cache(
        &self,
        il: usize,
        moe: &crate::blocks::moe::Moe,
    ) -> Result<Option<crate::blocks::moe::ExpertCache>> {
        let Some(c) = &self.placement.expert_cache else {
            return Ok(None);
        };
        let Some((slots, seed)) = c.layers.get(&il) else {
            return Ok(None);
        };
        let devices = self.devices();
        let name = &devices.get(c.device).name;
        let gpu =
            self.experts_off_cpu(il, moe, c.device, &format!("the expert cache on {name}"))?;
        let what = format!("layer {il}'s expert cache ({slots} experts)");
        let held = devices.reserve(c.device, moe.expert_bytes() * *slots as u64, &what)?;
        let mut cache = crate::blocks::moe::ExpertCache::new(
            c.device,
            c.policy,
            *slots,
            moe.routing.n_expert,
            held,
            seed.as_deref(),
        );
        if let Some(gpu) = gpu {
            let on_gpu = crate::blocks::moe::GpuExpertSlots::new(gpu, moe, *slots)?;
            for (e, slot) in cache.placed() {
                on_gpu.fill(gpu, moe, e, slot)?;
            }
            cache.gpu = Some(on_gpu);
        }
        Ok(Some(cache))
    }

    /// The tensors of one block (`what`, e.g. "layer 3's attention"), which must all be on
    /// one device.
    pub fn block(&self, what: impl Into<String>) -> BlockTensors<'_> {
        BlockTensors {
            src: self,
            what: what.into(),
            first: RefCell::new(None),
        }
    }

    /// Whether the file has a tensor called `name` (nothing is loaded).
    pub fn has(&self, name: &str) -> bool {
        self.index(name).is_some()
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.file.tensors().iter().position(|t| t.name == name)
    }

    /// Tensor `name` as mapped in the file, checked against `shape`, with its device.
    fn mapped(&self, name: &str, shape: &[usize]) -> Result<Option<(Tensor, DeviceId)>> {
        let Some(index) = self.index(name) else {
            return Ok(None);
        };
        let t = Tensor::mapped(self.file, index)?;
        t.expect_shape(shape)?;
        Ok(Some((t, self.placement.device_of(name))))
    }
}

/// The tensors of one block as it loads them: each goes to its placed device, and every one
/// must be on the device of the first (a block runs on one device).
pub(crate) struct BlockTensors<'a> {
    src: &'a TensorSource<'a>,
    what: String,
    /// The first tensor loaded and its device.
    first: RefCell<Option<(String, DeviceId)>>,
}

impl BlockTensors<'_> {
    /// Record that `name` is on `dev`; refuse a second device.
    fn place(&self, name: &str, dev: DeviceId) -> Result<()> {
        let mut first = self.first.borrow_mut();
        match &*first {
            None => *first = Some((name.to_string(), dev)),
            Some((f, d)) if *d != dev => {
                let devs = self.src.devices();
                return Err(Error::Model(format!(
                    "{}: '{f}' is on {} but '{name}' is on {}; moxie runs a block on one \
                     device, so place its tensors together",
                    self.what,
                    devs.get(*d).name,
                    devs.get(dev).name,
                )));
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// The device this block's tensors are on ([`CPU`] if it loaded none).
    pub fn device(&self) -> DeviceId {
        self.first.borrow().as_ref().map_or(CPU, |(_, d)| *d)
    }

    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.opt(name, shape)?
            .ok_or_else(|| Error::Model(format!("missing tensor '{name}'")))
    }

    pub fn opt(&self, name: &str, shape: &[usize]) -> Result<Option<Tensor>> {
        let Some((t, dev)) = self.src.mapped(name, shape)? else {
            return Ok(None);
        };
        self.place(name, dev)?;
        let placed = t.to_device(self.src.devices(), dev)?;
        self.src.copied(&t, dev);
        Ok(Some(placed))
    }

    /// A tensor the block derives at load time (not in the file), placed with the block's
    /// tensors: call it after those are loaded.
    pub fn with_block(&self, t: Tensor) -> Result<Tensor> {
        t.to_device(self.src.devices(), self.device())
    }

    /// Tensors computed at load time from tensor `name` of the file (checked against
    /// `shape`; `None` if the file has no such tensor): `derive` reads it as mapped on the
    /// host and returns tensors over memory moxie owns, which then go to the device the
    /// placement gives `name` (copied there and held against its budget like any weight) and
    /// count as this block's.
    pub fn derived<const N: usize>(
        &self,
        name: &str,
        shape: &[usize],
        derive: impl FnOnce(&Tensor) -> Result<[Tensor; N]>,
    ) -> Result<Option<[Tensor; N]>> {
        let Some((t, dev)) = self.src.mapped(name, shape)? else {
            return Ok(None);
        };
        self.place(name, dev)?;
        let mut parts = derive(&t)?;
        for p in parts.iter_mut() {
            *p = p.to_device(self.src.devices(), dev)?;
        }
        self.src.copied(&t, dev);
        Ok(Some(parts))
    }

    /// A small tensor (norm weight, bias) as f32.
    pub fn vec(&self, name: &str, len: usize) -> Result<Vector> {
        self.vec_opt(name, len)?
            .ok_or_else(|| Error::Model(format!("missing tensor '{name}'")))
    }

    pub fn vec_opt(&self, name: &str, len: usize) -> Result<Option<Vector>> {
        self.vec_of_shape_opt(name, &[len])
    }

    /// A small tensor of `shape` (e.g. a convolution's taps per channel) as f32, in order.
    pub fn vec_of_shape(&self, name: &str, shape: &[usize]) -> Result<Vector> {
        self.vec_of_shape_opt(name, shape)?
            .ok_or_else(|| Error::Model(format!("missing tensor '{name}'")))
    }

    fn vec_of_shape_opt(&self, name: &str, shape: &[usize]) -> Result<Option<Vector>> {
        let Some((t, dev)) = self.src.mapped(name, shape)? else {
            return Ok(None);
        };
        self.place(name, dev)?;
        let v = self.src.vector(name, &t, dev)?;
        self.src.copied(&t, dev);
        Ok(Some(v))
    }
}

impl TensorSource<'_> {
    /// Small tensor `name` as f32 on device `dev`, wherever the placement put it: for a norm
    /// that must sit with the matrix it feeds.
    pub fn vec_on(&self, name: &str, len: usize, dev: DeviceId) -> Result<Option<Vector>> {
        match self.mapped(name, &[len])? {
            Some((t, _)) => self.vector(name, &t, dev).map(Some),
            None => Ok(None),
        }
    }

    /// Mapped tensor `t` (called `name`) as a [`Vector`] on device `dev`.
    fn vector(&self, name: &str, t: &Tensor, dev: DeviceId) -> Result<Vector> {
        let devices = self.devices();
        let host = t.to_f32()?;
        let mut held = None;
        let mut gpu = None;
        if dev != CPU {
            let bytes = t.data().len();
            held = Some(devices.reserve(dev, bytes as u64, &format!("tensor '{name}'"))?);
            devices.count_copy(CPU, dev, bytes);
            if let Some(g) = devices.gpu(dev) {
                gpu = Some(Buffer::from_f32(g.backend(), &host)?);
            }
        }
        Ok(Vector {
            host,
            gpu,
            _held: held,
        })
    }
}
