//! Placement: which device holds each tensor and KV cache layer, with llama.cpp's rules
//! (`-ot`, `--cpu-moe`, `--n-cpu-moe`, `-ngl`, `-sm`, `-ts`, `-mg`) reproduced exactly, and
//! `--fit`, which fills each device's own budget. Planning is pure: it reads a tensor index and
//! a few hyper-parameters, never weights, so `moxie plan` works on header-only files and tests
//! need no GPU. `docs/architecture.md` ("Placement") describes the rules and the estimates.

mod devices;
mod expert_cache;
mod experts;
#[cfg(test)]
mod fit_tests;
mod plan;
mod report;
mod rules;
mod shape;

pub use devices::{
    available_memory_bytes, device_list, human_bytes, parse_size, parse_size_list,
    system_memory_bytes, DeviceKind, DeviceSpec,
};
pub use expert_cache::{CacheSize, ExpertCachePlan, ExpertCacheRequest};
pub use experts::{ExpertFrequencies, ExpertOverride, ExpertSplit};
pub use plan::{
    plan, ranges, DeviceUse, LayerKind, LayerPlacement, PlacementOptions, Plan, Reason, RuleUse,
    RunShape, SplitMode, TensorGroup, TensorPlacement, DEFAULT_CONTEXT, GPU_HEADROOM_BYTES,
    KV_POSITION_PADDING,
};
pub use rules::{
    block_experts_pattern, compile_rules, first_match, PlacementArg, Rule, RuleOrigin,
    EXPERTS_PATTERN,
};
pub use shape::ModelShape;

use moxie_gguf::GgufFile;

use crate::{Error, Result};

/// Plan an opened GGUF (header-only is enough): reads the shape from its metadata, then
/// [`plan`]s its tensor index.
pub fn plan_for_file(
    file: &GgufFile,
    opts: &PlacementOptions,
    devices: &[DeviceSpec],
    run: &RunShape,
) -> Result<Plan> {
    let shape = ModelShape::from_metadata(file.metadata(), file.tensors())?;
    plan(&shape, file.tensors(), opts, devices, run)
}

impl crate::model::Placement {
    /// What `plan` decided, for [`crate::Model::load_placed`]: the CPU, the plan's GPUs and
    /// simulated devices (with their budgets), and each loaded tensor's device. CUDA devices
    /// are opened here: without the `cuda` feature, or without a driver, that is an error
    /// naming the device.
    pub fn from_plan(plan: &Plan) -> Result<crate::model::Placement> {
        let mut devices = crate::device::Devices::cpu_only();
        for d in &plan.devices {
            match d.spec.kind {
                DeviceKind::Cpu => {}
                DeviceKind::Sim => devices.push_sim(&d.spec.name, d.spec.budget_bytes),
                DeviceKind::Cuda => {
                    let gpu = open_cuda(&d.spec.name)?;
                    devices.push_gpu(gpu, d.spec.budget_bytes);
                }
            }
        }
        let mut tensors = std::collections::HashMap::new();
        for t in &plan.tensors {
            if let Some(d) = t.device {
                let id = devices.by_name(&plan.devices[d].spec.name)?;
                tensors.insert(t.name.clone(), id);
            }
        }
        let mut experts = std::collections::HashMap::new();
        for s in &plan.expert_splits {
            let id = devices.by_name(&plan.devices[s.device].spec.name)?;
            let (dev, list) = experts.entry(s.layer).or_insert((id, Vec::new()));
            if *dev != id {
                return Err(Error::Placement(format!(
                    "layer {}: -oe puts experts on two devices; one device per layer so far",
                    s.layer
                )));
            }
            list.extend(&s.experts);
            list.sort_unstable();
        }
        let expert_cache = match &plan.expert_cache {
            Some(c) => {
                let device = devices.by_name(&plan.devices[c.device].spec.name)?;
                let mut seed: std::collections::HashMap<usize, Vec<u64>> =
                    c.seed.iter().cloned().collect();
                let layers = c
                    .layers
                    .iter()
                    .map(|&(il, slots, _)| (il, (slots, seed.remove(&il))))
                    .collect();
                Some(crate::loader::CachePlacement {
                    device,
                    policy: c.policy,
                    layers,
                })
            }
            None => None,
        };
        Ok(crate::model::Placement {
            devices,
            tensors,
            experts,
            expert_cache,
        })
    }
}

/// The CUDA GPU called `name` (`CUDA0`, ...).
#[cfg(feature = "cuda")]
fn open_cuda(name: &str) -> Result<moxie_gpu::Gpu> {
    let ordinal: usize = name
        .strip_prefix("CUDA")
        .and_then(|i| i.parse().ok())
        .ok_or_else(|| Error::Placement(format!("'{name}' is not a CUDA device name")))?;
    let gpu =
        moxie_gpu::cuda::CudaGpu::open(ordinal).map_err(|e| Error::Placement(e.to_string()))?;
    Ok(moxie_gpu::Gpu::new(gpu))
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(name: &str) -> Result<moxie_gpu::Gpu> {
    Err(Error::Placement(format!(
        "{name}: this build of moxie has no CUDA backend (build with `--features cuda`); plan \
         for it with `moxie plan`, or run the same placement on simulated devices with --sim"
    )))
}

/// The environment variable that makes `CUDA0`, `CUDA1`, ... simulated devices.
pub const SIM_CUDA_ENV: &str = "MOXIE_SIM_CUDA";

/// `MOXIE_SIM_CUDA=24GiB,24GiB,...`: budgets of simulated devices named `CUDA0`, `CUDA1`, ...
/// that stand for GPUs this machine does not have, so that a launch line written for them
/// plans, loads and runs (computing on the CPU) and its out-of-memory errors show before the
/// hardware is bought. `None` when unset.
pub fn simulated_cuda_budgets() -> Result<Option<Vec<u64>>> {
    let Some(v) = std::env::var_os(SIM_CUDA_ENV) else {
        return Ok(None);
    };
    let v = v
        .to_str()
        .ok_or_else(|| Error::Placement(format!("{SIM_CUDA_ENV} is not valid UTF-8")))?;
    let budgets = v
        .split(',')
        .map(parse_size)
        .collect::<Result<Vec<u64>>>()
        .map_err(|e| Error::Placement(format!("{SIM_CUDA_ENV}={v}: {e}")))?;
    Ok(Some(budgets))
}

/// The free memory of each CUDA GPU this machine has, in device order: what placement
/// budgets when the user states no `--gpu` sizes. Empty without the `cuda` feature or a
/// driver (no GPU to use); a GPU the driver lists but moxie cannot open (no NVRTC of a usable
/// version, say) is an error naming it, never a silent run on the CPU alone.
pub fn detected_cuda_budgets() -> Result<Vec<u64>> {
    #[cfg(feature = "cuda")]
    {
        let n = moxie_gpu::cuda::CudaGpu::device_count().unwrap_or(0);
        (0..n)
            .map(|i| {
                let gpu = moxie_gpu::cuda::CudaGpu::open(i)
                    .and_then(|g| moxie_gpu::GpuBackend::memory(&*g));
                gpu.map(|(_total, free)| free).map_err(|e| {
                    Error::Placement(format!(
                        "{e} (to run on the CPU only, hide the GPUs: CUDA_VISIBLE_DEVICES=\"\")"
                    ))
                })
            })
            .collect()
    }
    #[cfg(not(feature = "cuda"))]
    Ok(Vec::new())
}

/// Why [`detected_cuda_budgets`] finds no GPU: this build has no CUDA backend, the driver did
/// not load or start, or it sees no device.
pub fn no_cuda_reason() -> String {
    #[cfg(feature = "cuda")]
    {
        match moxie_gpu::cuda::CudaGpu::device_count() {
            Ok(0) => "the CUDA driver sees no device".to_string(),
            Ok(n) => format!("the CUDA driver sees {n} device(s)"),
            Err(e) => e.to_string(),
        }
    }
    #[cfg(not(feature = "cuda"))]
    "this build has no CUDA backend (build with --features cuda)".to_string()
}
