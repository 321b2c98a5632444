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

use crate::Result;

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
