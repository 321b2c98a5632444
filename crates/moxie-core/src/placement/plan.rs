//! The planner: a pure function from a tensor index, the model's shape, placement flags,
//! devices with budgets and the run's sizes to a [`Plan`] — every tensor's device and why,
//! and the bytes each device needs.

use moxie_gguf::TensorInfo;
use moxie_quant::GgmlType;

use super::devices::{human_bytes, DeviceKind, DeviceSpec};
use super::experts::{split_experts, ExpertFrequencies, ExpertOverride, ExpertSplit};
use super::rules::{compile_rules, first_match, PlacementArg, Rule, RuleOrigin};
use super::shape::ModelShape;
use crate::inventory::{layer_of, Role};
use crate::state::{kv_type_name, KvTypes, LayerStateSpec};
use crate::{Error, Result};

/// Memory a GPU needs beyond weights, KV and compute buffers: the CUDA context, cuBLAS
/// workspaces and allocator slack. A fixed guess, the same for every GPU.
pub const GPU_HEADROOM_BYTES: u64 = 512 << 20;

/// llama.cpp rounds the context up to a multiple of this before sizing the KV cache
/// (`GGML_PAD(n_ctx, 256)` in `llama_context`).
pub const KV_POSITION_PADDING: usize = 256;

/// How layers are spread over several GPUs (`-sm`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SplitMode {
    /// Everything offloaded goes to the main GPU (`-mg`).
    None,
    /// Whole layers per GPU, in proportion to `-ts` or to the GPUs' budgets.
    #[default]
    Layer,
}

impl SplitMode {
    /// A `-sm` value. `row` and `tensor` split single weights across GPUs, which moxie does
    /// not do.
    pub fn parse(text: &str) -> Result<SplitMode> {
        match text {
            "none" => Ok(SplitMode::None),
            "layer" => Ok(SplitMode::Layer),
            "row" | "tensor" => Err(Error::Placement(format!(
                "-sm {text} splits single weights across GPUs, which moxie does not do; \
                 use -sm layer (whole layers per GPU) or -sm none (one GPU)"
            ))),
            _ => Err(Error::Placement(format!(
                "unknown split mode '{text}' (expected none or layer)"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SplitMode::None => "none",
            SplitMode::Layer => "layer",
        }
    }
}

/// The placement flags, as llama.cpp takes them, plus moxie's `--fit`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PlacementOptions {
    /// `-ot`, `--cpu-moe`, `--n-cpu-moe` in command-line order (earlier rules win).
    pub args: Vec<PlacementArg>,
    /// `-ngl`: how many of the `n_block + 1` layer slots (blocks, then the output layer)
    /// go to GPUs, counted from the end. `None`: all of them when there is a GPU.
    pub n_gpu_layers: Option<usize>,
    pub split_mode: SplitMode,
    /// `-ts`: layer proportions per GPU; empty or all zero means by the GPUs' budgets.
    pub tensor_split: Vec<f32>,
    /// `-mg`: the GPU (index among GPUs) that `-sm none` uses.
    pub main_gpu: usize,
    /// Plan to the budgets instead of reproducing llama.cpp's assignment.
    pub fit: bool,
    /// Order in which `--fit` offers whole routed-expert layers to the GPUs. Layers not listed
    /// follow in the default order (head and tail first, alternating).
    pub expert_priority: Option<Vec<usize>>,
    /// `-oe`: routed experts placed one by one, in command-line order.
    pub expert_overrides: Vec<ExpertOverride>,
    /// `--profile` with `--fit`: how often each layer's experts are chosen per decoded token,
    /// so the fit can place hot experts one by one where that saves more CPU reads than whole
    /// expert layers.
    pub expert_profile: Option<ExpertFrequencies>,
    /// `--expert-cache`: a dynamic VRAM cache of the experts in RAM.
    pub expert_cache: Option<super::ExpertCacheRequest>,
}

/// The context when none is given: `moxie run`'s default, capped at the training context.
pub const DEFAULT_CONTEXT: usize = 4096;

/// The sizes of the run being planned for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunShape {
    /// Context length (`-c`); the KV cache holds it rounded up to 256 positions. `None`:
    /// [`DEFAULT_CONTEXT`], capped at the model's training context.
    pub n_ctx: Option<usize>,
    /// Logical batch (`-b`).
    pub n_batch: usize,
    /// Micro-batch (`-ub`); compute buffers hold one of `min(n_ubatch, n_batch)` tokens.
    pub n_ubatch: usize,
    pub kv_types: KvTypes,
    /// Sequences held at once, each with its own cache of the context and its own recurrent
    /// state: `moxie serve`'s slots (`-np`), 1 for a single generation.
    pub n_seq: usize,
    /// CPU threads of prompt batches (`-tb`, else `-t`): each holds its own attention buffers.
    pub n_threads: usize,
}

impl RunShape {
    /// The context length for `model`.
    pub fn context(&self, model: &ModelShape) -> usize {
        self.n_ctx
            .unwrap_or_else(|| DEFAULT_CONTEXT.min(model.n_ctx_train.unwrap_or(DEFAULT_CONTEXT)))
    }

    /// Positions the KV cache holds for `model`: the context rounded up to 256.
    pub fn kv_positions(&self, model: &ModelShape) -> usize {
        self.context(model).div_ceil(KV_POSITION_PADDING) * KV_POSITION_PADDING
    }

    pub fn ubatch(&self) -> usize {
        self.n_ubatch.min(self.n_batch)
    }
}

/// What part of the model a tensor belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorGroup {
    /// `token_embd` and other input-layer tensors: llama.cpp keeps them on the CPU.
    Input,
    /// A block's tensors that every token reads: attention, norms, router, shared experts,
    /// dense FFN.
    AlwaysUsed,
    /// A block's routed experts (`*_exps`): only the selected ones are read per token.
    RoutedExperts,
    /// The output layer (`output`, `output_norm`).
    Output,
    /// A tensor of an MTP/nextn block, which llama.cpp does not load.
    UnusedNextn,
}

impl TensorGroup {
    pub fn name(self) -> &'static str {
        match self {
            TensorGroup::Input => "input",
            TensorGroup::AlwaysUsed => "always_used",
            TensorGroup::RoutedExperts => "routed_experts",
            TensorGroup::Output => "output",
            TensorGroup::UnusedNextn => "unused_nextn",
        }
    }
}

/// Why a tensor went where it did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The rule with this index into [`Plan::rules`] matched first.
    Rule(usize),
    /// The input layer: always on the CPU, as in llama.cpp.
    InputLayer,
    /// llama.cpp's assignment of its layer (`-ngl`, `-sm`, `-ts`).
    LayerSplit,
    /// `--fit` put its layer's always-used part (or the output layer) on this GPU.
    FitAlwaysUsed,
    /// `--fit` put its block's routed experts on this GPU.
    FitExpertLayer,
    /// `--fit` found no GPU room for it.
    FitKeptOnCpu,
    /// Not loaded (MTP/nextn block).
    UnusedNextn,
}

/// One tensor's place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorPlacement {
    pub name: String,
    pub layer: Option<usize>,
    pub group: TensorGroup,
    /// Index into [`Plan::devices`]; `None` for tensors that are not loaded.
    pub device: Option<usize>,
    /// What it is for (attention, indexer, recurrent mixer, router, ...).
    pub role: Role,
    /// Bytes it takes on its device (0 when not loaded).
    pub bytes: u64,
    pub reason: Reason,
}

/// What a block is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    Dense,
    Moe,
    Nextn,
}

impl LayerKind {
    pub fn name(self) -> &'static str {
        match self {
            LayerKind::Dense => "dense",
            LayerKind::Moe => "moe",
            LayerKind::Nextn => "nextn",
        }
    }
}

/// One block's place: the layer's device (its KV cache, and its tensors unless a rule or the
/// fit moved them) and where its bytes ended up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerPlacement {
    pub layer: usize,
    pub kind: LayerKind,
    /// `None` for unused nextn blocks.
    pub device: Option<usize>,
    /// Bytes of the always-used tensors per device index, ascending by device.
    pub always_used: Vec<(usize, u64)>,
    /// Bytes of the routed experts per device index, ascending by device.
    pub experts: Vec<(usize, u64)>,
    /// Attention KV cache bytes (on `device`): GQA keys and values, MLA's latent, for every
    /// sequence.
    pub kv_bytes: u64,
    /// Other per-sequence state (on `device`): DSA indexer keys, recurrent (DeltaNet) state.
    pub state_bytes: u64,
}

/// One rule and what it selected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleUse {
    pub pattern: String,
    pub device: usize,
    pub origin: RuleOrigin,
    /// Tensors this rule placed (it matched them first).
    pub tensors: usize,
    pub bytes: u64,
}

/// One device's share of the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceUse {
    pub spec: DeviceSpec,
    pub weights_bytes: u64,
    /// Attention KV cache of the layers it runs.
    pub kv_bytes: u64,
    /// Indexer key cache and recurrent state of the layers it runs.
    pub state_bytes: u64,
    pub compute_bytes: u64,
    pub headroom_bytes: u64,
}

impl DeviceUse {
    pub fn total_bytes(&self) -> u64 {
        self.weights_bytes
            + self.kv_bytes
            + self.state_bytes
            + self.compute_bytes
            + self.headroom_bytes
    }

    /// Budget left; negative when over budget.
    pub fn free_bytes(&self) -> i128 {
        self.spec.budget_bytes as i128 - self.total_bytes() as i128
    }

    pub fn fits(&self) -> bool {
        self.total_bytes() <= self.spec.budget_bytes
    }
}

/// The plan: where every tensor goes, what each device holds, and whether it fits.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub arch: String,
    pub n_block: usize,
    pub n_nextn: usize,
    pub devices: Vec<DeviceUse>,
    pub tensors: Vec<TensorPlacement>,
    /// One entry per block, nextn blocks included.
    pub layers: Vec<LayerPlacement>,
    /// Device of the output layer (its tensors unless a rule moved them, and the logits).
    pub output_device: usize,
    pub rules: Vec<RuleUse>,
    /// llama.cpp's `-ngl` that gives the same layers on GPUs (with `--fit`: the equivalent
    /// of what the fit chose).
    pub n_gpu_layers: usize,
    pub split_mode: SplitMode,
    pub fit_mode: bool,
    pub n_ctx: usize,
    /// Positions each sequence's cache holds.
    pub kv_positions: usize,
    /// Sequences (server slots) whose caches and state are counted.
    pub n_seq: usize,
    pub n_ubatch: usize,
    pub kv_types: KvTypes,
    /// Every device within its budget.
    pub fits: bool,
    /// What the planner did and, when it does not fit, by how much and what to change.
    pub messages: Vec<String>,
    /// Settings that reach a GPU's kernels and that they do not handle (a weight type
    /// without GPU kernels, a KV cache pair the attention kernel cannot read, heads wider
    /// than it takes), each naming the device and what to do instead: found before any weight
    /// is read. A plan with any cannot run.
    pub unsupported: Vec<String>,
    /// Experts that `-oe` (or `--fit --profile`) put on another device than the rest of
    /// their layer's.
    pub expert_splits: Vec<ExpertSplit>,
    /// `--expert-cache`, sized.
    pub expert_cache: Option<super::ExpertCachePlan>,
}

impl Plan {
    /// Within every budget and nothing a GPU cannot do.
    pub fn can_run(&self) -> bool {
        self.fits && self.unsupported.is_empty()
    }

    /// How a reason reads in tables (`user rule 2`, `--cpu-moe`, `fit: expert layer`).
    pub fn describe(&self, reason: Reason) -> String {
        match reason {
            Reason::Rule(i) => match &self.rules[i].origin {
                RuleOrigin::OverrideTensor { .. } => format!("user rule {}", i + 1),
                other => other.flag(),
            },
            Reason::InputLayer => "input layer (CPU)".into(),
            Reason::LayerSplit => "-ngl layer split".into(),
            Reason::FitAlwaysUsed => "fit: always-used".into(),
            Reason::FitExpertLayer => "fit: expert layer".into(),
            Reason::FitKeptOnCpu => "fit: kept on CPU".into(),
            Reason::UnusedNextn => "unused nextn".into(),
        }
    }

    /// The index of the device called `name`.
    pub fn device_index(&self, name: &str) -> Option<usize> {
        self.devices.iter().position(|d| d.spec.name == name)
    }

    /// The placement of tensor `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorPlacement> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// Per-ubatch compute buffer estimates (see `docs/architecture.md`, "Placement").
#[derive(Clone, Copy, Debug)]
struct ComputeEstimate {
    /// Activations of one ubatch through one layer, f32: four hidden-size buffers (residual,
    /// normed input, attention and FFN outputs), the query projection and attention's output,
    /// and the FFN's gate, up and product buffers for the widest FFN. Attention keeps no
    /// score matrix over the cache: it walks it in tiles on the CPU and online on GPUs.
    activations: u64,
    /// Batched attention's buffers on the CPU: one tile of the cache, its scores and the
    /// running softmax per thread ([`crate::blocks::attention::batch_scratch_bytes`]),
    /// independent of the context. GPUs' attention kernel holds nothing beyond the
    /// activations.
    cpu_attention: u64,
    /// DeepSeek sparse attention's indexer scores of one ubatch over the whole cache, f32, on a
    /// GPU that runs layers (its `dsa_scores` kernel fills them before the top-k; the CPU scores
    /// one token at a time in tiles instead). 0 without an indexer.
    gpu_indexer: u64,
    /// The logits of one ubatch, f32, where the output layer runs.
    logits: u64,
}

impl ComputeEstimate {
    fn new(model: &ModelShape, run: &RunShape) -> ComputeEstimate {
        let ub = run.ubatch() as u64;
        let per_token = 4 * model.n_embd
            + model.n_head * model.head_q
            + model.n_head * model.attn_head_v
            + 3 * model.ffn_width;
        let per_thread = crate::blocks::attention::batch_scratch_bytes(
            model.n_head,
            model.attn_kv_heads,
            model.attn_head_k,
            model.attn_head_v,
        );
        let indexer = model.kv.iter().any(|s| s.indexer_keys.is_some());
        ComputeEstimate {
            activations: ub * 4 * per_token as u64,
            cpu_attention: run.n_threads.max(1) as u64 * per_thread,
            gpu_indexer: if indexer {
                ub * 4 * run.kv_positions(model) as u64
            } else {
                0
            },
            logits: ub * 4 * model.n_vocab as u64,
        }
    }
}

/// What one device holds while planning.
#[derive(Clone, Copy, Debug, Default)]
struct Load {
    weights: u64,
    kv: u64,
    state: u64,
    /// Holds weights of a block or of the output layer, so it runs part of the graph.
    runs_layers: bool,
    runs_output: bool,
}

impl Load {
    fn compute(&self, kind: DeviceKind, est: &ComputeEstimate) -> u64 {
        let mut c = 0;
        if self.runs_layers {
            c += est.activations;
            if kind.is_gpu() {
                c += est.gpu_indexer;
            } else {
                c += est.cpu_attention;
            }
        }
        if self.runs_output {
            c += est.logits;
        }
        c
    }

    /// A GPU that holds nothing costs nothing; one that holds anything needs its context.
    fn headroom(&self, kind: DeviceKind) -> u64 {
        if kind.is_gpu() && (self.runs_layers || self.weights > 0 || self.cache() > 0) {
            GPU_HEADROOM_BYTES
        } else {
            0
        }
    }

    fn total(&self, kind: DeviceKind, est: &ComputeEstimate) -> u64 {
        self.weights + self.cache() + self.compute(kind, est) + self.headroom(kind)
    }

    fn cache(&self) -> u64 {
        self.kv + self.state
    }

    fn add_cache(&mut self, c: LayerCache) {
        self.kv += c.kv;
        self.state += c.state;
    }
}

/// What one block keeps for all sequences of the run, split as the report shows it.
#[derive(Clone, Copy, Debug, Default)]
struct LayerCache {
    /// Attention rows (keys and values, MLA latent).
    kv: u64,
    /// Indexer keys and recurrent state.
    state: u64,
}

impl LayerCache {
    fn of(spec: &LayerStateSpec, model: &ModelShape, run: &RunShape) -> LayerCache {
        let positions = run.kv_positions(model) as u64;
        let n_seq = run.n_seq as u64;
        let attention = LayerStateSpec {
            keys: spec.keys,
            values: spec.values,
            ..Default::default()
        };
        let indexer = LayerStateSpec {
            indexer_keys: spec.indexer_keys,
            ..Default::default()
        };
        LayerCache {
            kv: n_seq * positions * attention.bytes_per_position(run.kv_types),
            state: n_seq
                * (positions * indexer.bytes_per_position(run.kv_types) + spec.fixed_bytes()),
        }
    }

    fn total(&self) -> u64 {
        self.kv + self.state
    }
}

/// A tensor's place while planning.
#[derive(Clone, Copy, Debug)]
struct Slot {
    device: Option<usize>,
    reason: Reason,
}

/// Plan `tensors` of `model` onto `devices` (one of them the CPU) for a run of `run`'s sizes.
/// Errors are bad input: rules, devices, split settings, cache types, tensor names.
pub fn plan(
    model: &ModelShape,
    tensors: &[TensorInfo],
    opts: &PlacementOptions,
    devices: &[DeviceSpec],
    run: &RunShape,
) -> Result<Plan> {
    let cpu = check_devices(devices)?;
    check_run(model, run)?;
    let loaded = loaded_sizes(model, tensors);
    let tensors = &loaded[..];
    let gpus: Vec<usize> = (0..devices.len())
        .filter(|&d| devices[d].kind.is_gpu())
        .collect();
    let split_gpus = split_gpus(opts, &gpus)?;
    if let Some(freq) = &opts.expert_profile {
        check_profile(freq, tensors)?;
    }
    let rules = compile_rules(&opts.args, devices)?;
    let groups = classify(model, tensors)?;
    let n_block = model.n_block;
    let n_main = model.n_main();
    let est = ComputeEstimate::new(model, run);
    let caches: Vec<LayerCache> = model
        .kv
        .iter()
        .map(|s| LayerCache::of(s, model, run))
        .collect();

    // llama.cpp's assignment: the first matching rule, else the tensor's layer's device.
    let n_gpu_layers = opts
        .n_gpu_layers
        .unwrap_or(if gpus.is_empty() { 0 } else { n_block + 1 });
    let proportions = split_proportions(opts, devices, &split_gpus)?;
    let slot_devices = llama_layer_devices(n_block, n_gpu_layers, cpu, &split_gpus, &proportions)?;
    let mut slots = Vec::with_capacity(tensors.len());
    for (t, &(layer, group)) in tensors.iter().zip(&groups) {
        let slot = if group == TensorGroup::UnusedNextn {
            Slot {
                device: None,
                reason: Reason::UnusedNextn,
            }
        } else if let Some(r) = first_match(&rules, &t.name)? {
            Slot {
                device: Some(rules[r].device),
                reason: Reason::Rule(r),
            }
        } else if group == TensorGroup::Input {
            Slot {
                device: Some(cpu),
                reason: Reason::InputLayer,
            }
        } else {
            Slot {
                device: Some(slot_devices[layer.unwrap_or(n_block)]),
                reason: Reason::LayerSplit,
            }
        };
        slots.push(slot);
    }
    let mut layer_devices: Vec<Option<usize>> = (0..n_block)
        .map(|il| (il < n_main).then_some(slot_devices[il]))
        .collect();
    let mut output_device = slot_devices[n_block];
    let mut messages = Vec::new();
    let mut effective_ngl = if split_gpus.is_empty() {
        0
    } else {
        n_gpu_layers.min(n_block + 1)
    };

    let mut fitted_experts = Vec::new();
    if opts.fit {
        let fitted = Fit {
            model,
            tensors,
            groups: &groups,
            devices,
            cpu,
            gpus: &split_gpus,
            caches: &caches,
            est: &est,
        }
        .run(opts, &mut slots, &mut messages)?;
        layer_devices = fitted.layer_devices;
        output_device = fitted.output_device;
        effective_ngl = fitted.n_gpu_layers;
        fitted_experts = fitted.hot_experts;
    }

    let placed: Vec<Option<usize>> = slots.iter().map(|s| s.device).collect();
    // The user's -oe first (they win an expert), then the profile fit's hot experts.
    let mut overrides = opts.expert_overrides.clone();
    overrides.extend(fitted_experts.iter().map(|(il, g, list)| ExpertOverride {
        text: FIT_PROFILE.to_string(),
        layers: Some(vec![*il]),
        experts: list.clone(),
        device: devices[*g].name.clone(),
    }));
    let expert_splits = split_experts(&overrides, tensors, &groups, &placed, devices)?;

    // Totals per device.
    let mut loads = vec![Load::default(); devices.len()];
    for s in &expert_splits {
        // Added where they go; they stay in RAM too (see `experts`).
        loads[s.device].weights += s.bytes;
        loads[s.device].runs_layers = true;
    }
    for ((t, slot), &(_, group)) in tensors.iter().zip(&slots).zip(&groups) {
        if let Some(d) = slot.device {
            loads[d].weights += t.n_bytes;
            match group {
                TensorGroup::AlwaysUsed | TensorGroup::RoutedExperts => loads[d].runs_layers = true,
                TensorGroup::Output => {
                    loads[d].runs_layers = true;
                    loads[d].runs_output = true;
                }
                TensorGroup::Input | TensorGroup::UnusedNextn => {}
            }
        }
    }
    for (il, d) in layer_devices.iter().enumerate() {
        if let Some(d) = *d {
            loads[d].add_cache(caches[il]);
        }
    }
    let mut device_uses: Vec<DeviceUse> = devices
        .iter()
        .zip(&loads)
        .map(|(spec, load)| DeviceUse {
            spec: spec.clone(),
            weights_bytes: load.weights,
            kv_bytes: load.kv,
            state_bytes: load.state,
            compute_bytes: load.compute(spec.kind, &est),
            headroom_bytes: load.headroom(spec.kind),
        })
        .collect();
    // The expert cache takes its share last: `auto` is what the device has left.
    let expert_cache = match &opts.expert_cache {
        Some(req) => {
            let free: Vec<i128> = device_uses.iter().map(DeviceUse::free_bytes).collect();
            let split: Vec<usize> = expert_splits.iter().map(|s| s.layer).collect();
            let layers =
                super::expert_cache::cacheable_layers(tensors, &groups, &placed, cpu, &split);
            let c = super::expert_cache::plan_cache(
                req,
                devices,
                cpu,
                &free,
                &layers,
                &layer_devices,
                opts.expert_profile.as_ref(),
            )?;
            let d = &mut device_uses[c.device];
            d.weights_bytes += c.bytes;
            if d.compute_bytes == 0 {
                // It computes the hits: a device that ran nothing needs its compute buffers.
                let mut load = loads[c.device];
                load.runs_layers = true;
                d.compute_bytes = load.compute(d.spec.kind, &est);
                d.headroom_bytes = load.headroom(d.spec.kind);
            }
            messages.push(c.describe(devices));
            Some(c)
        }
        None => None,
    };

    let layers = layer_placements(model, tensors, &groups, &slots, &layer_devices, &caches);
    let rule_uses = rule_uses(&rules, tensors, &slots);
    for (i, r) in rule_uses.iter().enumerate() {
        if r.tensors == 0 && matches!(r.origin, RuleOrigin::OverrideTensor { .. }) {
            messages.push(format!(
                "user rule {} ({}: '{}'={}) placed no tensor",
                i + 1,
                r.origin.flag(),
                r.pattern,
                devices[r.device].name
            ));
        }
    }
    let tensor_placements: Vec<TensorPlacement> = tensors
        .iter()
        .zip(&slots)
        .zip(&groups)
        .map(|((t, slot), &(layer, group))| TensorPlacement {
            name: t.name.clone(),
            layer,
            group,
            role: Role::of(&t.name),
            device: slot.device,
            bytes: if slot.device.is_some() { t.n_bytes } else { 0 },
            reason: slot.reason,
        })
        .collect();

    let mut plan = Plan {
        arch: model.arch.clone(),
        n_block,
        n_nextn: model.n_nextn,
        devices: device_uses,
        tensors: tensor_placements,
        layers,
        output_device,
        rules: rule_uses,
        n_gpu_layers: effective_ngl,
        split_mode: opts.split_mode,
        fit_mode: opts.fit,
        n_ctx: run.context(model),
        kv_positions: run.kv_positions(model),
        n_seq: run.n_seq,
        n_ubatch: run.ubatch(),
        kv_types: run.kv_types,
        fits: false,
        messages,
        unsupported: gpu_problems(model, tensors, &slots, &layer_devices, devices, run),
        expert_splits,
        expert_cache,
    };
    let experts_unsupported =
        super::experts::unsupported(&plan.expert_splits, devices, cpu, &layer_devices);
    plan.unsupported.extend(experts_unsupported);

    plan.fits = plan.devices.iter().all(DeviceUse::fits);
    let advice = over_budget_advice(&plan, model, run);
    plan.messages.extend(advice);
    Ok(plan)
}

/// What [`Plan::unsupported`] lists: on each device that runs CUDA kernels
/// ([`DeviceSpec::runs_cuda_kernels`]), weight types without GPU kernels, a KV cache pair the
/// attention kernel does not read, and attention heads wider than it takes.
fn gpu_problems(
    model: &ModelShape,
    tensors: &[TensorInfo],
    slots: &[Slot],
    layer_devices: &[Option<usize>],
    devices: &[DeviceSpec],
    run: &RunShape,
) -> Vec<String> {
    let mut out = Vec::new();
    for (d, spec) in devices.iter().enumerate() {
        if !spec.runs_cuda_kernels() {
            continue;
        }
        let name = &spec.name;
        // Weights: one line per type, with an example tensor.
        let mut by_type: Vec<(GgmlType, usize, &str)> = Vec::new();
        for (t, slot) in tensors.iter().zip(slots) {
            if slot.device != Some(d) || t.dims.len() < 2 || moxie_gpu::Gpu::supports(t.ty) {
                continue;
            }
            match by_type.iter_mut().find(|(ty, _, _)| *ty == t.ty) {
                Some((_, n, _)) => *n += 1,
                None => by_type.push((t.ty, 1, &t.name)),
            }
        }
        for (ty, n, example) in by_type {
            out.push(format!(
                "{name}: {n} tensor(s) of type {ty} (e.g. {example}) have no GPU kernels; keep \
                 them on the CPU with a first -ot rule (e.g. -ot \"{}=CPU\")",
                regex_escape(example)
            ));
        }
        // Attention: the layers whose cache (and so attention) is here.
        let here: Vec<usize> = (0..layer_devices.len())
            .filter(|&il| layer_devices[il] == Some(d))
            .filter(|&il| model.kv.get(il).is_some_and(|s| s.keys.is_some()))
            .collect();
        if here.is_empty() {
            continue;
        }
        let kv = run.kv_types;
        let v = if model.mla { kv.k } else { kv.v };
        if !moxie_gpu::ops::kv_types_supported(kv.k, v) {
            out.push(format!(
                "{name}: a {} / {} KV cache (layers {}) is not supported by the GPU's attention \
                 (-ctk and -ctv both f32, f16 or q8_0, or q8_0 with f16)",
                kv_type_name(kv.k),
                kv_type_name(v),
                layer_list(&here)
            ));
        }
        let (dk, dv) = (model.attn_head_k, model.attn_head_v);
        let (max_k, max_v) = (moxie_gpu::ops::ATTN_MAX_DK, moxie_gpu::ops::ATTN_MAX_DV);
        if dk > max_k || dv > max_v {
            out.push(format!(
                "{name}: attention heads of {dk} x {dv} (layers {}) are wider than the GPU \
                 kernel takes ({max_k} x {max_v}); keep those layers' attention on the CPU",
                layer_list(&here)
            ));
        }
    }
    out
}

/// `3-5, 9` for layers 3, 4, 5, 9.
fn layer_list(layers: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < layers.len() {
        let mut j = i;
        while j + 1 < layers.len() && layers[j + 1] == layers[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            layers[i].to_string()
        } else {
            format!("{}-{}", layers[i], layers[j])
        });
        i = j + 1;
    }
    parts.join(", ")
}

/// `name` as a regex matching itself (for an `-ot` suggestion).
fn regex_escape(name: &str) -> String {
    name.replace('.', "\\.")
}

/// The CPU's index; names must be unique.
fn check_devices(devices: &[DeviceSpec]) -> Result<usize> {
    let cpus: Vec<usize> = (0..devices.len())
        .filter(|&d| devices[d].kind == DeviceKind::Cpu)
        .collect();
    if cpus.len() != 1 {
        return Err(Error::Placement(format!(
            "the device list needs exactly one CPU, it has {}",
            cpus.len()
        )));
    }
    for (i, d) in devices.iter().enumerate() {
        if devices[..i].iter().any(|e| e.name == d.name) {
            return Err(Error::Placement(format!(
                "device name '{}' is given twice",
                d.name
            )));
        }
    }
    Ok(cpus[0])
}

fn check_run(model: &ModelShape, run: &RunShape) -> Result<()> {
    if run.context(model) == 0 || run.n_batch == 0 || run.n_ubatch == 0 || run.n_seq == 0 {
        return Err(Error::Placement(format!(
            "context ({}), batch ({}), micro-batch ({}) and sequences ({}) must be at least 1",
            run.context(model),
            run.n_batch,
            run.n_ubatch,
            run.n_seq
        )));
    }
    for (il, shape) in model.kv.iter().enumerate() {
        shape.check_types(il, run.kv_types)?;
    }
    Ok(())
}

/// The GPUs layers are split over: all of them, or with `-sm none` the main GPU only.
fn split_gpus(opts: &PlacementOptions, gpus: &[usize]) -> Result<Vec<usize>> {
    if !opts.tensor_split.is_empty() && opts.tensor_split.len() > gpus.len().max(1) {
        return Err(Error::Placement(format!(
            "-ts gives {} proportions for {} GPU(s)",
            opts.tensor_split.len(),
            gpus.len()
        )));
    }
    if let Some(bad) = opts
        .tensor_split
        .iter()
        .find(|x| !x.is_finite() || **x < 0.0)
    {
        return Err(Error::Placement(format!(
            "-ts proportions must be finite and >= 0, got {bad}"
        )));
    }
    match opts.split_mode {
        SplitMode::Layer => Ok(gpus.to_vec()),
        SplitMode::None if gpus.is_empty() => Ok(Vec::new()),
        SplitMode::None => gpus.get(opts.main_gpu).map(|&g| vec![g]).ok_or_else(|| {
            Error::Placement(format!(
                "-mg {}: there are only {} GPU(s)",
                opts.main_gpu,
                gpus.len()
            ))
        }),
    }
}

/// Each split GPU's share: the `-ts` proportions, or where those are absent or all zero over
/// the split GPUs, the GPUs' budgets (llama.cpp uses their free memory).
fn split_proportions(
    opts: &PlacementOptions,
    devices: &[DeviceSpec],
    split_gpus: &[usize],
) -> Result<Vec<f32>> {
    let given: Vec<f32> = (0..split_gpus.len())
        .map(|i| opts.tensor_split.get(i).copied().unwrap_or(0.0))
        .collect();
    if given.iter().any(|&x| x != 0.0) {
        return Ok(given);
    }
    Ok(split_gpus
        .iter()
        .map(|&g| devices[g].budget_bytes as f32)
        .collect())
}

/// llama.cpp's `load_tensors` layer assignment (commit `0c1e57098`): of the `n_block + 1`
/// slots (blocks, then the output layer at `n_block`), the last `n_gpu_layers` go to GPUs;
/// slot `il` goes to the GPU `upper_bound(splits, (il - i_gpu_start) / act_gpu_layers)` where
/// `splits` are the cumulative normalised proportions, all in f32 as there. The input layer is
/// always on the CPU. (Before the output layer was counted, llama.cpp used
/// `i_gpu_start = n_layer - n_gpu_layers`.)
fn llama_layer_devices(
    n_block: usize,
    n_gpu_layers: usize,
    cpu: usize,
    split_gpus: &[usize],
    proportions: &[f32],
) -> Result<Vec<usize>> {
    let n_slots = n_block + 1;
    let i_gpu_start = n_slots.saturating_sub(n_gpu_layers);
    let act_gpu_layers = if split_gpus.is_empty() {
        0
    } else {
        n_gpu_layers.min(n_slots)
    };
    let mut splits = proportions.to_vec();
    let mut sum = 0.0f32;
    for s in splits.iter_mut() {
        sum += *s;
        *s = sum;
    }
    if act_gpu_layers > 0 && !(sum > 0.0 && sum.is_finite()) {
        return Err(Error::Placement(
            "cannot split layers over the GPUs: their budgets (or -ts proportions) sum to 0".into(),
        ));
    }
    for s in splits.iter_mut() {
        *s /= sum;
    }
    Ok((0..n_slots)
        .map(|il| {
            if il < i_gpu_start || il - i_gpu_start >= act_gpu_layers {
                return cpu;
            }
            let x = (il - i_gpu_start) as f32 / act_gpu_layers as f32;
            let g = splits.partition_point(|&s| s <= x);
            split_gpus[g.min(split_gpus.len() - 1)]
        })
        .collect())
}

/// Each tensor's block (if any) and group.
fn classify(
    model: &ModelShape,
    tensors: &[TensorInfo],
) -> Result<Vec<(Option<usize>, TensorGroup)>> {
    tensors
        .iter()
        .map(|t| {
            let layer = layer_of(&t.name);
            let group = match layer {
                Some(il) if il >= model.n_block => {
                    return Err(Error::Placement(format!(
                        "tensor {} names block {il}, but the model has {} blocks",
                        t.name, model.n_block
                    )))
                }
                Some(il) if il >= model.n_main() => TensorGroup::UnusedNextn,
                Some(_) if Role::of(&t.name) == Role::RoutedExperts => TensorGroup::RoutedExperts,
                Some(_) => TensorGroup::AlwaysUsed,
                None if is_input_tensor(&t.name) => TensorGroup::Input,
                None => TensorGroup::Output,
            };
            Ok((layer, group))
        })
        .collect()
}

/// `tensors` with the bytes each takes once moxie has loaded it: what the file stores, except a
/// legacy MLA file's fused `attn_kv_b`, split into F32 parts at load
/// ([`legacy_mla`](crate::arch::legacy_mla)).
fn loaded_sizes(model: &ModelShape, tensors: &[TensorInfo]) -> Vec<TensorInfo> {
    let names: std::collections::HashSet<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    tensors
        .iter()
        .map(|t| {
            let mut t = t.clone();
            if model.mla {
                t.n_bytes = crate::arch::legacy_mla::loaded_bytes(&t, |n| names.contains(n));
            }
            t
        })
        .collect()
}

/// What the profile fit's expert splits name as their flag.
const FIT_PROFILE: &str = "--fit --profile";

/// A routing profile fits the model: every layer it has rates for has routed experts, as many
/// as it has rates.
fn check_profile(freq: &ExpertFrequencies, tensors: &[TensorInfo]) -> Result<()> {
    for (il, rates) in freq.layers() {
        let n_expert = tensors
            .iter()
            .filter(|t| layer_of(&t.name) == Some(il) && Role::of(&t.name) == Role::RoutedExperts)
            .map(|t| t.dims.get(2).copied().unwrap_or(1) as usize)
            .next();
        match n_expert {
            Some(n) if n == rates.len() => {}
            Some(n) => {
                return Err(Error::Placement(format!(
                    "--profile: layer {il} has {} experts in the profile and {n} in the model \
                     (a profile of another model?)",
                    rates.len()
                )))
            }
            None => {
                return Err(Error::Placement(format!(
                    "--profile: the profile routes layer {il}, which has no routed experts in \
                     this model (a profile of another model?)"
                )))
            }
        }
    }
    Ok(())
}

/// llama.cpp's input-layer tensors (`LLM_TENSOR_LAYER_INPUT`) that MoE GGUFs carry.
fn is_input_tensor(name: &str) -> bool {
    ["token_embd", "token_types", "position_embd"]
        .iter()
        .any(|p| name.starts_with(p))
}

/// The `--fit` pass over the tensors no rule pinned.
struct Fit<'a> {
    model: &'a ModelShape,
    tensors: &'a [TensorInfo],
    groups: &'a [(Option<usize>, TensorGroup)],
    devices: &'a [DeviceSpec],
    cpu: usize,
    /// GPUs the fit may fill, in device order.
    gpus: &'a [usize],
    caches: &'a [LayerCache],
    est: &'a ComputeEstimate,
}

struct Fitted {
    layer_devices: Vec<Option<usize>>,
    output_device: usize,
    n_gpu_layers: usize,
    /// Hot experts the profile placed one by one: (layer, GPU, experts).
    hot_experts: Vec<(usize, usize, Vec<usize>)>,
}

/// A unit the fit moves as a whole: a block's always-used part with its KV, or the output.
#[derive(Clone, Copy, Debug)]
struct LayerUnit {
    /// Block index, or `n_block` for the output layer.
    slot: usize,
    weights: u64,
    cache: LayerCache,
}

impl Fit<'_> {
    fn run(
        &self,
        opts: &PlacementOptions,
        slots: &mut [Slot],
        messages: &mut Vec<String>,
    ) -> Result<Fitted> {
        let n_block = self.model.n_block;
        let n_main = self.model.n_main();
        let pinned: Vec<bool> = slots
            .iter()
            .map(|s| matches!(s.reason, Reason::Rule(_)))
            .collect();

        // What the rules and the input layer already put on each device.
        let mut base = vec![Load::default(); self.devices.len()];
        let mut units: Vec<LayerUnit> = (0..n_main)
            .map(|il| LayerUnit {
                slot: il,
                weights: 0,
                cache: self.caches[il],
            })
            .chain(std::iter::once(LayerUnit {
                slot: n_block,
                weights: 0,
                cache: LayerCache::default(),
            }))
            .collect();
        let mut experts = vec![0u64; n_main];
        for (i, t) in self.tensors.iter().enumerate() {
            let (layer, group) = self.groups[i];
            if group == TensorGroup::UnusedNextn {
                continue;
            }
            if pinned[i] || group == TensorGroup::Input {
                let d = slots[i].device.unwrap_or(self.cpu);
                base[d].weights += t.n_bytes;
                base[d].runs_layers |= group != TensorGroup::Input;
                continue;
            }
            match (group, layer) {
                (TensorGroup::AlwaysUsed, Some(il)) => units[il].weights += t.n_bytes,
                (TensorGroup::RoutedExperts, Some(il)) => experts[il] += t.n_bytes,
                _ => units[n_main].weights += t.n_bytes,
            }
        }

        // -ngl, when given, caps which layer slots may have anything on a GPU.
        let first_gpu_slot = opts
            .n_gpu_layers
            .map_or(0, |ngl| (n_block + 1).saturating_sub(ngl));
        let allowed = units.iter().filter(|u| u.slot >= first_gpu_slot).count();
        let mut open: Vec<usize> = Vec::new();
        for &g in self.gpus {
            let mut load = base[g];
            load.runs_layers = true;
            if load.total(self.devices[g].kind, self.est) < self.devices[g].budget_bytes {
                open.push(g);
            }
        }

        // Phase 1: the always-used part and KV of the last k layers (and the output layer),
        // as many as fit, split over the GPUs by bytes in proportion to their room.
        let mut chosen: Vec<(usize, usize)> = Vec::new();
        for k in (0..=allowed).rev() {
            let tail = &units[units.len() - k..];
            if let Some(assign) = self.split_by_room(tail, &base, &open) {
                chosen = assign;
                break;
            }
        }
        let mut loads = base.clone();
        let mut layer_devices: Vec<Option<usize>> = (0..n_block)
            .map(|il| (il < n_main).then_some(self.cpu))
            .collect();
        let mut output_device = self.cpu;
        for &(unit, g) in &chosen {
            let u = units[unit];
            loads[g].weights += u.weights;
            loads[g].add_cache(u.cache);
            loads[g].runs_layers = true;
            if u.slot == n_block {
                output_device = g;
                loads[g].runs_output = true;
            } else {
                layer_devices[u.slot] = Some(g);
            }
        }
        let offloaded = chosen.len();
        // The llama.cpp -ngl that starts the GPU slots at the first offloaded unit.
        let n_gpu_layers = match offloaded {
            0 => 0,
            k => n_block + 1 - units[units.len() - k].slot,
        };
        if !self.gpus.is_empty() && offloaded < allowed {
            let kept = units[units.len() - allowed..units.len() - offloaded]
                .iter()
                .map(|u| u.slot)
                .collect::<Vec<_>>();
            messages.push(format!(
                "--fit: the GPUs cannot hold every layer's always-used weights and KV cache; \
                 kept {} on CPU (like -ngl {n_gpu_layers})",
                describe_slots(&kept, n_block)
            ));
        }

        // Phase 2: whole routed-expert layers by priority, each to the GPU with the most
        // free room that holds it.
        let loads_before_experts = loads.clone();
        let order = expert_order(self.model, &experts, opts.expert_priority.as_deref())?;
        let mut expert_devices = vec![self.cpu; n_main];
        let mut placed = Vec::new();
        let mut kept = Vec::new();
        for il in order {
            if il < first_gpu_slot {
                kept.push(il);
                continue;
            }
            match self.roomiest_gpu(open.iter().copied(), &loads, experts[il]) {
                Some(g) => {
                    loads[g].weights += experts[il];
                    loads[g].runs_layers = true;
                    expert_devices[il] = g;
                    placed.push(il);
                }
                None => kept.push(il),
            }
        }
        let mut whole_message = None;
        if !self.gpus.is_empty() && (!placed.is_empty() || !kept.is_empty()) {
            placed.sort_unstable();
            whole_message = Some(format!(
                "--fit: routed experts of {} of {} MoE layers on GPUs{}",
                placed.len(),
                placed.len() + kept.len(),
                if placed.is_empty() {
                    String::new()
                } else {
                    format!(" (blocks {})", ranges(&placed))
                }
            ));
        }

        // With a profile: hot experts one by one instead, where that saves more CPU reads
        // per decoded token than the whole layers above (the loads before those layers).
        let mut hot_experts = Vec::new();
        if let Some(freq) = &opts.expert_profile {
            // Expected routed-expert bytes per decoded token that layer `il` reads.
            let reads = |il: usize| {
                freq.get(il).map_or(0.0, |f| {
                    f.iter().sum::<f64>() * experts[il] as f64 / f.len().max(1) as f64
                })
            };
            let whole: f64 = placed.iter().map(|&il| reads(il)).sum();
            let (hot, saved) = self.hot_experts_by_profile(
                freq,
                &experts,
                first_gpu_slot,
                &open,
                &loads_before_experts,
                &layer_devices,
            );
            let all: f64 = (0..n_main).map(reads).sum();
            let show = |b: f64| human_bytes(b.max(0.0).round() as u64);
            // Whole layers on a tie (they need no per-slot sums).
            let pick_experts = saved > whole + 1e-9 * all;
            messages.push(format!(
                "--fit --profile: expected routed-expert reads on the CPU per decoded token: \
                 {} with whole expert layers on GPUs, {} with hot experts one by one ({} with \
                 every expert on the CPU): {}",
                show(all - whole),
                show(all - saved),
                show(all),
                if pick_experts {
                    "placing hot experts"
                } else {
                    "keeping whole layers"
                }
            ));
            if pick_experts {
                expert_devices.iter_mut().for_each(|d| *d = self.cpu);
                hot_experts = hot;
                whole_message = Some(format!(
                    "--fit: hot routed experts of {} MoE layers on GPUs, one by one",
                    hot_experts.len()
                ));
            }
        }
        messages.extend(whole_message);

        for (i, slot) in slots.iter_mut().enumerate() {
            let (layer, group) = self.groups[i];
            if pinned[i] || matches!(group, TensorGroup::Input | TensorGroup::UnusedNextn) {
                continue;
            }
            let (device, on_gpu_reason) = match (group, layer) {
                (TensorGroup::RoutedExperts, Some(il)) => {
                    (expert_devices[il], Reason::FitExpertLayer)
                }
                (TensorGroup::AlwaysUsed, Some(il)) => {
                    (layer_devices[il].unwrap_or(self.cpu), Reason::FitAlwaysUsed)
                }
                _ => (output_device, Reason::FitAlwaysUsed),
            };
            *slot = Slot {
                device: Some(device),
                reason: if device == self.cpu {
                    Reason::FitKeptOnCpu
                } else {
                    on_gpu_reason
                },
            };
        }
        Ok(Fitted {
            layer_devices,
            output_device,
            n_gpu_layers,
            hot_experts,
        })
    }

    /// Of `gpus`, the one with the most free room that still holds `bytes` more weights on top
    /// of `loads` (the first such on a tie).
    fn roomiest_gpu(
        &self,
        gpus: impl Iterator<Item = usize>,
        loads: &[Load],
        bytes: u64,
    ) -> Option<usize> {
        let mut best: Option<(usize, u64)> = None;
        for g in gpus {
            let (budget, kind) = (self.devices[g].budget_bytes, self.devices[g].kind);
            let mut after = loads[g];
            after.weights += bytes;
            after.runs_layers = true;
            if after.total(kind, self.est) <= budget {
                let free = budget.saturating_sub(loads[g].total(kind, self.est));
                if best.is_none_or(|(_, f)| free > f) {
                    best = Some((g, free));
                }
            }
        }
        best.map(|(g, _)| g)
    }

    /// Hot experts by the profile: every expert of a layer the GPUs may hold (from
    /// `first_gpu_slot` on), most often chosen first, each to the GPU with the most free room
    /// that holds it, on top of `loads`. Returns the (layer, GPU, experts) lists and the
    /// expected routed-expert bytes per decoded token they take off the CPU.
    fn hot_experts_by_profile(
        &self,
        freq: &ExpertFrequencies,
        experts: &[u64],
        first_gpu_slot: usize,
        open: &[usize],
        loads: &[Load],
        layer_devices: &[Option<usize>],
    ) -> (Vec<(usize, usize, Vec<usize>)>, f64) {
        let mut loads = loads.to_vec();
        // (selections per token, layer, expert, bytes)
        let mut candidates: Vec<(f64, usize, usize, u64)> = Vec::new();
        for (il, &bytes) in experts.iter().enumerate() {
            let Some(f) = freq.get(il) else { continue };
            if il < first_gpu_slot || bytes == 0 || f.is_empty() {
                continue;
            }
            let each = bytes / f.len() as u64;
            candidates.extend(
                f.iter()
                    .enumerate()
                    .filter(|(_, &r)| r > 0.0)
                    .map(|(e, &r)| (r, il, e, each)),
            );
        }
        candidates.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        // A layer's hot experts go to one GPU: the first that took one of them; on a CUDA GPU,
        // only the one that runs the layer (its routes are made there).
        let mut layer_gpu: std::collections::BTreeMap<usize, usize> = Default::default();
        let mut lists: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
        let mut saved = 0.0;
        for (rate, il, e, bytes) in candidates {
            let runs_here = |g: usize| {
                !self.devices[g].runs_cuda_kernels()
                    || layer_devices.get(il).copied().flatten() == Some(g)
            };
            let gpus = open
                .iter()
                .copied()
                .filter(|&g| layer_gpu.get(&il).is_none_or(|&lg| lg == g) && runs_here(g));
            if let Some(g) = self.roomiest_gpu(gpus, &loads, bytes) {
                loads[g].weights += bytes;
                loads[g].runs_layers = true;
                layer_gpu.insert(il, g);
                lists.entry(il).or_default().push(e);
                saved += rate * bytes as f64;
            }
        }
        let out = lists
            .into_iter()
            .map(|(il, mut list)| {
                list.sort_unstable();
                (il, layer_gpu[&il], list)
            })
            .collect();
        (out, saved)
    }

    /// Split `units` (in layer order) over the `open` GPUs contiguously, a unit to the GPU
    /// whose share of the cumulative bytes its midpoint falls in, shares in proportion to each
    /// GPU's room. `None` if some GPU would go over budget. Returns (unit index into the full
    /// unit list, GPU) pairs.
    fn split_by_room(
        &self,
        units: &[LayerUnit],
        base: &[Load],
        open: &[usize],
    ) -> Option<Vec<(usize, usize)>> {
        if units.is_empty() {
            return Some(Vec::new());
        }
        let n_units = self.model.n_main() + 1;
        let first = n_units - units.len();
        let rooms: Vec<f64> = open
            .iter()
            .map(|&g| {
                let mut load = base[g];
                load.runs_layers = true;
                let used = load.total(self.devices[g].kind, self.est);
                self.devices[g].budget_bytes.saturating_sub(used) as f64
            })
            .collect();
        let room_sum: f64 = rooms.iter().sum();
        if room_sum <= 0.0 {
            return None;
        }
        let bytes_sum: u64 = units.iter().map(|u| u.weights + u.cache.total()).sum();
        let mut bounds = Vec::with_capacity(rooms.len());
        let mut acc = 0.0;
        for r in &rooms {
            acc += r / room_sum;
            bounds.push(acc);
        }
        let mut loads: Vec<Load> = base.to_vec();
        let mut assign = Vec::with_capacity(units.len());
        let mut before = 0u64;
        for (j, u) in units.iter().enumerate() {
            let bytes = u.weights + u.cache.total();
            let mid = if bytes_sum == 0 {
                j as f64 / units.len() as f64
            } else {
                (before as f64 + bytes as f64 / 2.0) / bytes_sum as f64
            };
            before += bytes;
            let k = bounds.partition_point(|&b| b <= mid).min(open.len() - 1);
            let g = open[k];
            loads[g].weights += u.weights;
            loads[g].add_cache(u.cache);
            loads[g].runs_layers = true;
            loads[g].runs_output |= u.slot == self.model.n_block;
            assign.push((first + j, g));
        }
        open.iter()
            .all(|&g| {
                loads[g].total(self.devices[g].kind, self.est) <= self.devices[g].budget_bytes
            })
            .then_some(assign)
    }
}

/// The order `--fit` offers routed-expert layers: the given priority first, then the
/// default, which alternates from the ends: first, last, second, second-to-last, ...
fn expert_order(
    model: &ModelShape,
    experts: &[u64],
    priority: Option<&[usize]>,
) -> Result<Vec<usize>> {
    let moe: Vec<usize> = (0..experts.len()).filter(|&il| experts[il] > 0).collect();
    let mut order = Vec::with_capacity(moe.len());
    if let Some(priority) = priority {
        for &il in priority {
            if il >= model.n_main() || experts[il] == 0 {
                return Err(Error::Placement(format!(
                    "expert priority names block {il}, which has no routed experts to place \
                     (not pinned by a rule)"
                )));
            }
            if order.contains(&il) {
                return Err(Error::Placement(format!(
                    "expert priority names block {il} twice"
                )));
            }
            order.push(il);
        }
    }
    let (mut lo, mut hi) = (0, moe.len());
    let mut from_front = true;
    while lo < hi {
        let il = if from_front {
            lo += 1;
            moe[lo - 1]
        } else {
            hi -= 1;
            moe[hi]
        };
        from_front = !from_front;
        if !order.contains(&il) {
            order.push(il);
        }
    }
    Ok(order)
}

fn layer_placements(
    model: &ModelShape,
    tensors: &[TensorInfo],
    groups: &[(Option<usize>, TensorGroup)],
    slots: &[Slot],
    layer_devices: &[Option<usize>],
    caches: &[LayerCache],
) -> Vec<LayerPlacement> {
    let mut layers: Vec<LayerPlacement> = (0..model.n_block)
        .map(|il| LayerPlacement {
            layer: il,
            kind: if il >= model.n_main() {
                LayerKind::Nextn
            } else {
                LayerKind::Dense
            },
            device: layer_devices[il],
            always_used: Vec::new(),
            experts: Vec::new(),
            kv_bytes: caches.get(il).map_or(0, |c| c.kv),
            state_bytes: caches.get(il).map_or(0, |c| c.state),
        })
        .collect();
    let add = |list: &mut Vec<(usize, u64)>, d: usize, b: u64| match list
        .iter_mut()
        .find(|(e, _)| *e == d)
    {
        Some((_, sum)) => *sum += b,
        None => {
            list.push((d, b));
            list.sort_unstable();
        }
    };
    for ((t, slot), &(layer, group)) in tensors.iter().zip(slots).zip(groups) {
        let (Some(il), Some(d)) = (layer, slot.device) else {
            continue;
        };
        let l = &mut layers[il];
        match group {
            TensorGroup::RoutedExperts => {
                l.kind = LayerKind::Moe;
                add(&mut l.experts, d, t.n_bytes);
            }
            _ => add(&mut l.always_used, d, t.n_bytes),
        }
    }
    layers
}

fn rule_uses(rules: &[Rule], tensors: &[TensorInfo], slots: &[Slot]) -> Vec<RuleUse> {
    let mut uses: Vec<RuleUse> = rules
        .iter()
        .map(|r| RuleUse {
            pattern: r.pattern.clone(),
            device: r.device,
            origin: r.origin.clone(),
            tensors: 0,
            bytes: 0,
        })
        .collect();
    for (t, slot) in tensors.iter().zip(slots) {
        if let Reason::Rule(r) = slot.reason {
            uses[r].tensors += 1;
            uses[r].bytes += t.n_bytes;
        }
    }
    uses
}

/// For each device over budget: by how much, what fills it, and what would help.
fn over_budget_advice(plan: &Plan, model: &ModelShape, run: &RunShape) -> Vec<String> {
    let mut out = Vec::new();
    for (d, dev) in plan.devices.iter().enumerate() {
        if dev.fits() {
            continue;
        }
        let over = dev.total_bytes() - dev.spec.budget_bytes;
        let mut msg = format!(
            "{} is over its budget by {}: needs {} (weights {}, KV {}, state {}, compute {}, \
             headroom {}) of {}",
            dev.spec.name,
            human_bytes(over),
            human_bytes(dev.total_bytes()),
            human_bytes(dev.weights_bytes),
            human_bytes(dev.kv_bytes),
            human_bytes(dev.state_bytes),
            human_bytes(dev.compute_bytes),
            human_bytes(dev.headroom_bytes),
            human_bytes(dev.spec.budget_bytes)
        );
        if dev.spec.kind == DeviceKind::Cpu {
            if plan.fit_mode {
                msg.push_str(&format!(
                    "; the GPUs are already filled, so it needs {} more RAM or GPU memory \
                     (its KV cache, which a smaller -c or -ctk q8_0 shrinks, is {})",
                    human_bytes(over),
                    human_bytes(dev.kv_bytes)
                ));
            } else {
                msg.push_str(
                    "; put more on the GPUs (fewer --n-cpu-moe layers, or --fit), use a smaller \
                     -c, or give --ram more if the machine has it",
                );
            }
        } else {
            // Routed expert layers that sit here, lowest blocks first (as --n-cpu-moe takes).
            let mut expert_layers: Vec<(usize, u64)> = plan
                .layers
                .iter()
                .filter_map(|l| {
                    l.experts
                        .iter()
                        .find(|(e, _)| *e == d)
                        .map(|&(_, b)| (l.layer, b))
                })
                .collect();
            expert_layers.sort_unstable();
            let mut freed = 0u64;
            let mut moved = Vec::new();
            for &(il, b) in &expert_layers {
                if freed >= over {
                    break;
                }
                freed += b;
                moved.push(il);
            }
            if freed >= over && !moved.is_empty() {
                let alts: Vec<String> = moved.iter().map(|il| il.to_string()).collect();
                msg.push_str(&format!(
                    "; keeping the routed experts of {} more block(s) off it would fit, e.g. \
                     -ot \"blk\\.({})\\.ffn_(up|down|gate)_exps=CPU\" before the other rules",
                    moved.len(),
                    alts.join("|")
                ));
            } else if !expert_layers.is_empty() {
                msg.push_str(&format!(
                    "; even with all {} routed-expert layers on it moved to CPU it would not fit",
                    expert_layers.len()
                ));
            }
            if dev.kv_bytes > 0 {
                let q8 = KvTypes {
                    k: moxie_quant::GgmlType::Q8_0,
                    v: moxie_quant::GgmlType::Q8_0,
                };
                let q8_ok = model
                    .kv
                    .iter()
                    .enumerate()
                    .all(|(il, s)| s.check_types(il, q8).is_ok());
                if q8_ok && run.kv_types != q8 {
                    let ratio = kv_ratio(model, run.kv_types, q8);
                    let saved = dev.kv_bytes - (dev.kv_bytes as f64 * ratio) as u64;
                    msg.push_str(&format!(
                        "; -ctk q8_0 -ctv q8_0 would save {} of its KV cache{}",
                        human_bytes(saved),
                        if saved >= over { " (enough)" } else { "" }
                    ));
                }
                msg.push_str(&format!(
                    "; a smaller -c shrinks the KV cache ({} per 1024 positions here, types {}/{}) \
                     and the attention scores",
                    human_bytes(dev.kv_bytes * 1024 / plan.kv_positions.max(1) as u64),
                    kv_type_name(run.kv_types.k),
                    kv_type_name(run.kv_types.v)
                ));
            }
            if !plan.fit_mode {
                msg.push_str("; or let --fit choose");
            }
        }
        out.push(msg);
    }
    out
}

/// KV bytes with `to` over KV bytes with `from`, over all layers.
fn kv_ratio(model: &ModelShape, from: KvTypes, to: KvTypes) -> f64 {
    let a: u64 = model.kv.iter().map(|s| s.bytes_per_position(from)).sum();
    let b: u64 = model.kv.iter().map(|s| s.bytes_per_position(to)).sum();
    if a == 0 {
        1.0
    } else {
        b as f64 / a as f64
    }
}

/// `blocks 0-7, 9 and the output layer` for a list of slots.
fn describe_slots(slots: &[usize], n_block: usize) -> String {
    let blocks: Vec<usize> = slots.iter().copied().filter(|&s| s < n_block).collect();
    let output = slots.contains(&n_block);
    match (blocks.is_empty(), output) {
        (true, true) => "the output layer".into(),
        (false, true) => format!("blocks {} and the output layer", ranges(&blocks)),
        _ => format!("blocks {}", ranges(&blocks)),
    }
}

/// `0-7, 9, 12-13` for sorted numbers.
pub fn ranges(sorted: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            sorted[i].to_string()
        } else {
            format!("{}-{}", sorted[i], sorted[j])
        });
        i = j + 1;
    }
    parts.join(", ")
}
