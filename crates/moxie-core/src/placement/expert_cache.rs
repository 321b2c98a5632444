//! `--expert-cache SIZE|auto`: a dynamic VRAM expert cache. Every MoE layer whose routed
//! experts are in RAM gets an equal share of SIZE on one accelerator, holding as many of its
//! experts as fit; between decode steps a policy (LRU, LFU) brings in the experts the last
//! step missed and evicts others. Hits are computed where the cache is, misses on the CPU.
//! Prompt batches do not use it (their experts stream through op offload or the CPU as
//! without a cache), they only refill it before decoding starts.
//!
//! The plan sizes it (`auto`: what the device has left after everything else; on a GPU, over
//! the layers whose router runs there); the loader holds the bytes and gives each layer its
//! [`crate::blocks::moe::ExpertCache`].

use moxie_gguf::TensorInfo;

use super::devices::{human_bytes, DeviceKind, DeviceSpec};
use super::plan::TensorGroup;
use crate::telemetry::CachePolicy;
use crate::{Error, Result};

/// How big the cache is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheSize {
    Bytes(u64),
    /// What the cache device has left in the plan.
    Auto,
}

/// `--expert-cache SIZE|auto` with its `--expert-cache-policy` and `--expert-cache-device`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpertCacheRequest {
    pub size: CacheSize,
    pub policy: CachePolicy,
    /// Device name; `None`: the first accelerator.
    pub device: Option<String>,
}

impl ExpertCacheRequest {
    /// `SIZE` as `--sim` takes sizes (`4GiB`, `512MiB`), or `auto`.
    pub fn parse(size: &str, policy: &str, device: Option<&str>) -> Result<ExpertCacheRequest> {
        let size = match size.trim() {
            "auto" => CacheSize::Auto,
            s => CacheSize::Bytes(
                super::parse_size(s)
                    .map_err(|e| Error::Placement(format!("--expert-cache: {e}, or auto")))?,
            ),
        };
        // Every dynamic policy of `moxie profile simulate` (not its fixed `static`).
        let policy = CachePolicy::parse(policy)
            .ok()
            .filter(|&p| p != CachePolicy::Static)
            .ok_or_else(|| {
                Error::Placement(format!(
                    "--expert-cache-policy '{policy}': lru, lfu or decay"
                ))
            })?;
        Ok(ExpertCacheRequest {
            size,
            policy,
            device: device.map(str::to_owned),
        })
    }
}

/// The planned cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpertCachePlan {
    /// Device index in the plan.
    pub device: usize,
    pub policy: CachePolicy,
    /// Bytes held: the layers' slots, each an expert's bytes.
    pub bytes: u64,
    /// `(layer, experts it holds, one expert's bytes)` for every cached layer.
    pub layers: Vec<(usize, usize, u64)>,
    /// With `--profile`: per cached layer, its experts' decode selections per million tokens,
    /// which seed the cache (LFU's counts, and the residents before the first token).
    pub seed: Vec<(usize, Vec<u64>)>,
}

impl ExpertCachePlan {
    pub fn describe(&self, devices: &[DeviceSpec]) -> String {
        let slots: Vec<usize> = self.layers.iter().map(|l| l.1).collect();
        let (lo, hi) = (
            slots.iter().min().copied().unwrap_or(0),
            slots.iter().max().copied().unwrap_or(0),
        );
        let per = if lo == hi {
            format!("{lo}")
        } else {
            format!("{lo}-{hi}")
        };
        let seeded = if self.seed.is_empty() {
            ""
        } else {
            ", seeded from the profile"
        };
        format!(
            "expert cache: {} on {}, {} MoE layers x {per} experts, policy {}{seeded}",
            human_bytes(self.bytes),
            devices[self.device].name,
            self.layers.len(),
            self.policy.name()
        )
    }
}

/// A layer the cache may serve: its number, one expert's bytes, its expert count.
pub(super) type CacheableLayer = (usize, u64, usize);

/// The MoE layers whose routed experts are all in RAM (`placed[i]` is where tensor `i` went,
/// `groups[i]` its `(layer, group)`), except `split_layers` (experts placed one by one with
/// `-oe`, which the cache leaves alone).
pub(super) fn cacheable_layers(
    tensors: &[TensorInfo],
    groups: &[(Option<usize>, TensorGroup)],
    placed: &[Option<usize>],
    cpu: usize,
    split_layers: &[usize],
) -> Vec<CacheableLayer> {
    let n_layer = groups.iter().filter_map(|g| g.0).max().map_or(0, |l| l + 1);
    let mut bytes = vec![0u64; n_layer];
    let mut n_expert = vec![0usize; n_layer];
    let mut on_cpu = vec![true; n_layer];
    for ((t, &(layer, group)), dev) in tensors.iter().zip(groups).zip(placed) {
        let (Some(il), TensorGroup::RoutedExperts) = (layer, group) else {
            continue;
        };
        bytes[il] += t.n_bytes;
        n_expert[il] = t.dims.get(2).copied().unwrap_or(1) as usize;
        on_cpu[il] &= *dev == Some(cpu);
    }
    (0..n_layer)
        .filter(|&il| bytes[il] > 0 && on_cpu[il] && !split_layers.contains(&il))
        .map(|il| (il, bytes[il] / n_expert[il].max(1) as u64, n_expert[il]))
        .collect()
}

/// Sizes the cache over `layers` ([`cacheable_layers`]): `free[d]` is what device `d` has
/// left once everything else is placed; `profile` seeds it. On a GPU, only the layers whose
/// router runs there (`layer_devices`) are cached: the GPU computes its hits with the routes
/// it made.
pub(super) fn plan_cache(
    req: &ExpertCacheRequest,
    devices: &[DeviceSpec],
    cpu: usize,
    free: &[i128],
    layers: &[CacheableLayer],
    layer_devices: &[Option<usize>],
    profile: Option<&super::ExpertFrequencies>,
) -> Result<ExpertCachePlan> {
    let device = match &req.device {
        Some(name) => devices
            .iter()
            .position(|d| &d.name == name)
            .ok_or_else(|| {
                Error::Placement(format!("--expert-cache-device '{name}': no such device"))
            })?,
        None => devices
            .iter()
            .position(|d| d.kind != DeviceKind::Cpu)
            .ok_or_else(|| {
                Error::Placement(
                    "--expert-cache needs an accelerator to hold the cache (a GPU, or --sim)"
                        .into(),
                )
            })?,
    };
    if device == cpu {
        return Err(Error::Placement(
            "--expert-cache-device: the cache holds experts off the CPU; name a GPU or sim".into(),
        ));
    }
    if layers.is_empty() {
        return Err(Error::Placement(
            "--expert-cache: no MoE layer has its routed experts in RAM to cache (they are all \
             on accelerators already, or placed one by one with -oe)"
                .into(),
        ));
    }
    let layers: Vec<CacheableLayer> = if devices[device].runs_cuda_kernels() {
        let here = |il: usize| layer_devices.get(il).copied().flatten() == Some(device);
        let v: Vec<_> = layers.iter().copied().filter(|l| here(l.0)).collect();
        if v.is_empty() {
            return Err(Error::Placement(format!(
                "--expert-cache on {}: no MoE layer with its experts in RAM runs its router \
                 there (give the layers to it with -ngl)",
                devices[device].name
            )));
        }
        v
    } else {
        layers.to_vec()
    };
    let size = match req.size {
        CacheSize::Bytes(b) => b,
        CacheSize::Auto => free[device].max(0) as u64,
    };
    let share = size / layers.len() as u64;
    let mut plan = ExpertCachePlan {
        device,
        policy: req.policy,
        bytes: 0,
        layers: Vec::new(),
        seed: Vec::new(),
    };
    for &(il, one, n_expert) in &layers {
        let slots = ((share / one.max(1)) as usize).min(n_expert);
        if slots > 0 {
            plan.bytes += slots as u64 * one;
            plan.layers.push((il, slots, one));
            if let Some(rates) = profile.and_then(|p| p.get(il)) {
                let per_million = rates.iter().map(|r| (r * 1e6).round() as u64).collect();
                plan.seed.push((il, per_million));
            }
        }
    }
    if plan.layers.is_empty() {
        let smallest = layers.iter().map(|l| l.1).min().unwrap_or(0);
        return Err(Error::Placement(format!(
            "--expert-cache: {} over the MoE layers holds no expert in any layer (an expert takes \
             {}); give it more room",
            human_bytes(size),
            human_bytes(smallest)
        )));
    }
    Ok(plan)
}
