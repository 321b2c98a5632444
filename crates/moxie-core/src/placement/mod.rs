//! Placement: which device holds each tensor and KV cache layer, with llama.cpp's rules
//! (`-ot`, `--cpu-moe`, `--n-cpu-moe`, `-ngl`, `-sm`, `-ts`, `-mg`) reproduced exactly, and
//! `--fit`, which fills each device's own budget. Planning is pure: it reads a tensor index and
//! a few hyper-parameters, never weights, so `moxie plan` works on header-only files and tests
//! need no GPU. `docs/architecture.md` ("Placement") describes the rules and the estimates.

mod devices;
#[cfg(test)]
mod fit_tests;
mod plan;
mod report;
mod rules;
mod shape;

pub use devices::{
    device_list, human_bytes, parse_size, parse_size_list, system_memory_bytes, DeviceKind,
    DeviceSpec,
};
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
    /// What `plan` decided, for [`crate::Model::load_placed`]: the CPU and the plan's
    /// simulated devices (with their budgets), and each loaded tensor's device. Fails for a
    /// plan with CUDA devices: this build has no CUDA backend.
    pub fn from_plan(plan: &Plan) -> Result<crate::model::Placement> {
        let mut sims = Vec::new();
        for d in &plan.devices {
            match d.spec.kind {
                DeviceKind::Cpu => {}
                DeviceKind::Sim => sims.push(d.spec.budget_bytes),
                DeviceKind::Cuda => {
                    return Err(Error::Placement(format!(
                        "{}: this build of moxie has no CUDA backend; plan for it with `moxie \
                         plan`, or run the same placement on simulated devices with --sim",
                        d.spec.name
                    )))
                }
            }
        }
        let devices = crate::device::Devices::with_sims(&sims);
        let mut tensors = std::collections::HashMap::new();
        for t in &plan.tensors {
            if let Some(d) = t.device {
                let id = devices.by_name(&plan.devices[d].spec.name)?;
                tensors.insert(t.name.clone(), id);
            }
        }
        Ok(crate::model::Placement { devices, tensors })
    }
}
