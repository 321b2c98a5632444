//! Synthetic models (`moxie gen`): GGUF files of the supported MoE architectures with random
//! weights, shaped and scaled like the test fixtures (`shared/fixtures/README.md`), loadable by
//! moxie and by llama.cpp.
//!
//! * Weights `N(0, (g/√fan_in)²)` with `g = 1` (0.6 for the output projections `attn_output`
//!   and `ffn_down*`), norms `1 + N(0, 0.1²)`, embeddings `N(0, 1)`, attention biases
//!   `N(0, 0.1²)`, the output head scaled for logit std ≈ `logit_std` (4), the router for
//!   router-logit std ≈ `router_std` (1.5), `exp_probs_b` `N(0, 0.05²)`: outputs are peaked and
//!   every expert gets used.
//! * Routing (`--routing`, [`RoutingShape`]): a chosen static skew (the spread of
//!   `exp_probs_b`, growing with depth) and temporal locality (attention made a causal window
//!   over the last few tokens), in the weights alone (`routing.rs`).
//! * Types: [`SynthType`], a llama-quantize file type (every name it takes: Q4_K_M, Q2_K,
//!   IQ2_M, IQ1_M, Q8_0, ...) whose per-tensor types come from [`crate::quant_rules`], the port
//!   of llama-quantize's rules that `moxie quantize` uses, or one block type for every tensor
//!   (llama-quantize's `--pure`). Weights are quantized with moxie's ports of llama-quantize's
//!   quantizers; the IQ1/IQ2/IQ3 types it has none for (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S,
//!   IQ3_XXS, IQ3_S) are written as random valid blocks scaled to the weights' spread, not as
//!   a quantization of them (`random_blocks.rs`).
//! * Deterministic: every tensor row has its own random stream, seeded from the model seed,
//!   the tensor name and the row index, so the bytes do not depend on threads or order.
//! * Streaming: tensors are generated, quantized and written a chunk of rows at a time, so a
//!   multi-GB model needs a few tens of MB of memory.
//! * Tokenizer: a byte-level BPE vocabulary built in code ([`vocab`]), with each
//!   architecture's special tokens, `tokenizer.ggml.pre` and chat template.
//!
//! ```no_run
//! # fn main() -> moxie_core::Result<()> {
//! use moxie_core::synth::{generate, SynthSpec, SynthType};
//! let mut spec = SynthSpec::preset("deepseek2-tiny")?;
//! spec.ty = SynthType::parse("Q4_K_M")?;
//! spec.shape.set("n_layer", "4")?;
//! let report = generate(&spec, std::path::Path::new("/tmp/ds.gguf"))?;
//! println!("{} bytes, {} params", report.bytes, report.n_params);
//! # Ok(()) }
//! ```

mod corpus;
mod header;
mod plan;
mod random_blocks;
pub mod rng;
mod routing;
pub mod vocab;
mod write;

use std::path::PathBuf;

pub use crate::quant_rules::Ftype;
pub use header::{header_presets, write_header_only, HeaderSpec, Indexer, SpecialTokens};
pub use moxie_quant::GgmlType;
pub use plan::{metadata, plan, PlannedTensor, TensorInit};
pub use random_blocks::random_blocks;
pub use routing::{RoutingShape, RowRule, ROUTING_PRESETS};
pub use write::{generate, generate_with, Progress};

use crate::config::Gating;
use crate::{Error, Result};

/// The architectures `moxie gen` writes (a subset of what moxie runs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SynthArch {
    Deepseek2,
    Qwen3Moe,
    Glm4Moe,
}

impl SynthArch {
    const ALL: [SynthArch; 3] = [
        SynthArch::Deepseek2,
        SynthArch::Qwen3Moe,
        SynthArch::Glm4Moe,
    ];

    /// The architecture's GGUF name.
    pub fn name(self) -> &'static str {
        match self {
            SynthArch::Deepseek2 => "deepseek2",
            SynthArch::Qwen3Moe => "qwen3moe",
            SynthArch::Glm4Moe => "glm4moe",
        }
    }

    /// The architecture called `name`; the error lists the ones `moxie gen` writes.
    pub fn from_name(name: &str) -> Result<SynthArch> {
        Self::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|a| a.name()).collect();
                Error::Model(format!(
                    "synth: cannot generate architecture '{name}'; it writes: {}",
                    names.join(", ")
                ))
            })
    }
}

/// YaRN rope scaling (deepseek2 only), written as `rope.scaling.*`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    pub factor: f32,
    pub orig_ctx: usize,
    /// `rope.scaling.yarn_log_multiplier` as llama.cpp's converter writes it (0.1 × the
    /// model's `mscale_all_dim`; llama.cpp divides it by 0.1 again).
    pub log_multiplier: f32,
}

/// Model shape and hyper-parameters. Fields an architecture does not use are ignored for it
/// (e.g. the MLA ranks for GQA models, `n_head_kv` / `head_dim` for deepseek2).
#[derive(Clone, Debug, PartialEq)]
pub struct SynthShape {
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    /// Leading layers with a dense FFN (deepseek2, glm4moe).
    pub n_dense_lead: usize,
    /// Dense FFN width (`feed_forward_length`).
    pub n_ff: usize,
    pub n_head: usize,
    /// GQA key/value heads (qwen3moe, glm4moe).
    pub n_head_kv: usize,
    /// GQA head size (qwen3moe, glm4moe).
    pub head_dim: usize,
    /// Rotary dimensions of a GQA head; `None`: the architecture's default (qwen3moe: the whole
    /// head, glm4moe: half of it).
    pub n_rot: Option<usize>,
    /// MLA (deepseek2); `q_lora_rank` 0 means a plain `attn_q` projection.
    pub q_lora_rank: usize,
    pub kv_lora_rank: usize,
    pub qk_nope_dim: usize,
    pub qk_rope_dim: usize,
    pub v_head_dim: usize,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff_exp: usize,
    pub n_expert_shared: usize,
    /// Group-limited routing (DeepSeek-V3): experts in `n_expert_groups` equal groups (1: no
    /// groups), each token choosing its experts within its best `n_group_used` groups.
    pub n_expert_groups: usize,
    pub n_group_used: usize,
    pub gating: Gating,
    pub expert_weights_norm: bool,
    pub expert_weights_scale: f32,
    pub n_ctx_train: usize,
    pub rope_theta: f32,
    pub rms_eps: f32,
    pub yarn: Option<Yarn>,
    /// Target standard deviation of the output logits.
    pub logit_std: f32,
    /// Target standard deviation of the router logits.
    pub router_std: f32,
    /// Static skew and temporal locality of the routing ([`RoutingShape`]).
    pub routing: RoutingShape,
}

/// Shape fields that [`SynthShape::set`] accepts, with a description.
pub const SHAPE_KEYS: &[(&str, &str)] = &[
    (
        "vocab",
        "vocabulary size (alias n_vocab); padded with <|reserved_N|> tokens",
    ),
    ("n_embd", "hidden size"),
    ("n_layer", "number of blocks"),
    (
        "n_dense_lead",
        "leading dense-FFN blocks (deepseek2, glm4moe)",
    ),
    ("n_ff", "dense FFN width"),
    ("n_head", "attention heads"),
    ("n_head_kv", "key/value heads (qwen3moe, glm4moe)"),
    ("head_dim", "head size (qwen3moe, glm4moe)"),
    (
        "n_rot",
        "rotary dims per head (glm4moe; qwen3moe must rotate the whole head)",
    ),
    (
        "q_lora_rank",
        "MLA query rank, 0 = plain attn_q (deepseek2)",
    ),
    ("kv_lora_rank", "MLA latent size (deepseek2)"),
    (
        "qk_nope_dim",
        "MLA non-rotary key dims per head (deepseek2)",
    ),
    ("qk_rope_dim", "MLA rotary key dims (deepseek2)"),
    ("v_head_dim", "MLA value dims per head (deepseek2)"),
    ("n_expert", "routed experts per MoE layer"),
    ("n_expert_used", "experts selected per token"),
    ("n_ff_exp", "expert FFN width"),
    ("n_expert_shared", "shared experts (deepseek2, glm4moe)"),
    (
        "n_expert_groups",
        "expert groups for group-limited routing, 1 = none (DeepSeek-V3: 8)",
    ),
    (
        "n_group_used",
        "groups a token's experts come from (DeepSeek-V3: 4)",
    ),
    (
        "gating",
        "router gating: softmax or sigmoid (deepseek2, glm4moe)",
    ),
    (
        "expert_weights_norm",
        "renormalise the top-k weights: true/false",
    ),
    (
        "expert_weights_scale",
        "scale of the routed experts' weights",
    ),
    ("n_ctx", "training context length (alias n_ctx_train)"),
    ("rope_theta", "rope base frequency"),
    ("rms_eps", "RMS norm epsilon"),
    ("yarn_factor", "YaRN scaling factor, 0 = off (deepseek2)"),
    ("yarn_orig_ctx", "YaRN original context (deepseek2)"),
    ("logit_std", "target std of the output logits"),
    ("router_std", "target std of the router logits"),
    (
        "skew_first",
        "std of the expert selection bias exp_probs_b in the first MoE layer (static skew)",
    ),
    (
        "skew_last",
        "std of exp_probs_b in the last MoE layer (linear in between)",
    ),
    (
        "attn_window",
        "tokens each attention layer averages over, 0 = random attention (temporal locality; deepseek2)",
    ),
    (
        "attn_sharpness",
        "score of a position with itself in window mode (fall-off beyond the window)",
    ),
    ("attn_gain", "gain of attn_output (0.6)"),
];

fn parse_num<T: std::str::FromStr>(key: &str, value: &str) -> Result<T> {
    value
        .trim()
        .parse()
        .map_err(|_| Error::Model(format!("synth: bad value '{value}' for '{key}'")))
}

impl SynthShape {
    /// Sets field `key` (see [`SHAPE_KEYS`]) from its text form.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let u = || parse_num::<usize>(key, value);
        let f = || parse_num::<f32>(key, value);
        match key {
            "vocab" | "n_vocab" => self.n_vocab = u()?,
            "n_embd" => self.n_embd = u()?,
            "n_layer" => self.n_layer = u()?,
            "n_dense_lead" | "n_dense" => self.n_dense_lead = u()?,
            "n_ff" => self.n_ff = u()?,
            "n_head" => self.n_head = u()?,
            "n_head_kv" => self.n_head_kv = u()?,
            "head_dim" => self.head_dim = u()?,
            "n_rot" => self.n_rot = Some(u()?),
            "q_lora_rank" => self.q_lora_rank = u()?,
            "kv_lora_rank" => self.kv_lora_rank = u()?,
            "qk_nope_dim" => self.qk_nope_dim = u()?,
            "qk_rope_dim" => self.qk_rope_dim = u()?,
            "v_head_dim" => self.v_head_dim = u()?,
            "n_expert" => self.n_expert = u()?,
            "n_expert_used" => self.n_expert_used = u()?,
            "n_ff_exp" => self.n_ff_exp = u()?,
            "n_expert_shared" => self.n_expert_shared = u()?,
            "n_expert_groups" => self.n_expert_groups = u()?,
            "n_group_used" => self.n_group_used = u()?,
            "gating" => {
                self.gating = match value.trim() {
                    "softmax" => Gating::Softmax,
                    "sigmoid" => Gating::Sigmoid,
                    _ => {
                        return Err(Error::Model(format!(
                            "synth: gating must be 'softmax' or 'sigmoid', not '{value}'"
                        )))
                    }
                }
            }
            "expert_weights_norm" => self.expert_weights_norm = parse_num(key, value)?,
            "expert_weights_scale" => self.expert_weights_scale = f()?,
            "n_ctx" | "n_ctx_train" => self.n_ctx_train = u()?,
            "rope_theta" => self.rope_theta = f()?,
            "rms_eps" => self.rms_eps = f()?,
            "yarn_factor" => {
                let factor = f()?;
                self.yarn = if factor == 0.0 {
                    None
                } else {
                    Some(Yarn {
                        factor,
                        ..self.yarn.unwrap_or(Yarn {
                            factor,
                            orig_ctx: self.n_ctx_train,
                            log_multiplier: 0.1,
                        })
                    })
                };
            }
            "yarn_orig_ctx" => match &mut self.yarn {
                Some(y) => y.orig_ctx = u()?,
                None => {
                    return Err(Error::Model(
                        "synth: yarn_orig_ctx needs YaRN on (set yarn_factor first)".into(),
                    ))
                }
            },
            "logit_std" => self.logit_std = f()?,
            "router_std" => self.router_std = f()?,
            "skew_first" => self.routing.skew_first = f()?,
            "skew_last" => self.routing.skew_last = f()?,
            "attn_window" => self.routing.attn_window = u()?,
            "attn_sharpness" => self.routing.attn_sharpness = f()?,
            "attn_gain" => self.routing.attn_gain = f()?,
            _ => {
                return Err(Error::Model(format!(
                    "synth: unknown shape field '{key}'; known: {}",
                    SHAPE_KEYS
                        .iter()
                        .map(|(k, _)| *k)
                        .collect::<Vec<_>>()
                        .join(", ")
                )))
            }
        }
        Ok(())
    }

    /// Rotary dims per head for `arch`.
    pub fn rot_dims(&self, arch: SynthArch) -> usize {
        match arch {
            SynthArch::Deepseek2 => self.qk_rope_dim,
            SynthArch::Qwen3Moe => self.n_rot.unwrap_or(self.head_dim),
            SynthArch::Glm4Moe => self.n_rot.unwrap_or(self.head_dim / 2),
        }
    }

    /// Whether block `il` has a dense FFN.
    pub fn is_dense(&self, il: usize) -> bool {
        il < self.n_dense_lead
    }
}

/// The tensor types of a synthetic model, chosen tensor by tensor by llama-quantize's rules
/// ([`crate::quant_rules`], the port `moxie quantize` uses): what `llama-quantize` would give
/// each tensor of an F32 master of the model (1-D tensors, norms and routers stay F32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SynthType {
    /// A llama-quantize file type (`Q4_K_M`, `Q2_K`, `IQ2_M`, `Q8_0`, ...): its per-tensor mix,
    /// as `llama-quantize MASTER OUT FTYPE` without an importance matrix writes it.
    Ftype(Ftype),
    /// One block type for every tensor llama-quantize quantizes (its `--pure`), with its
    /// fallbacks where a row is not a whole number of blocks.
    Pure(GgmlType),
}

impl SynthType {
    /// A llama-quantize file type by name (any case, aliases such as `Q4_K` = `Q4_K_M`) or id.
    pub fn parse(name: &str) -> Result<SynthType> {
        match Ftype::parse(name.trim()) {
            Some((f, _)) => Ok(SynthType::Ftype(f)),
            None => Err(Error::Model(format!(
                "synth: unknown file type '{name}'; llama-quantize's file types: {} (for one block type in every tensor, e.g. IQ2_S, use --pure / SynthType::parse_pure)",
                ftype_names()
            ))),
        }
    }

    /// One block type for every quantized tensor (llama-quantize's `--pure`): a ggml type name
    /// (`Q4_K`, `IQ2_S`, ...), or a file type name for its default block type (`Q4_K_M`:
    /// Q4_K).
    pub fn parse_pure(name: &str) -> Result<SynthType> {
        let name = name.trim();
        if let Some(t) = GgmlType::from_name(name) {
            return Ok(SynthType::Pure(t));
        }
        match Ftype::parse(name) {
            Some((f, _)) => Ok(SynthType::Pure(f.default_type())),
            None => Err(Error::Model(format!(
                "synth: unknown block type '{name}'; ggml types: {}",
                GgmlType::ALL
                    .iter()
                    .map(|t| t.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    /// The file type's or block type's name (`Q4_K_M`; `Q4_K` for pure Q4_K).
    pub fn name(&self) -> &'static str {
        match self {
            SynthType::Ftype(f) => f.name(),
            SynthType::Pure(t) => t.name(),
        }
    }

    /// `general.file_type` (llama.cpp's `llama_ftype`). A pure type writes the file type of
    /// the same name whose bulk type it is (Q3_K/Q4_K/Q5_K: the `_S` mixes, IQ2_S: IQ2_S),
    /// else 1024 (`LLAMA_FTYPE_GUESSED`).
    pub fn file_type(&self) -> u32 {
        use GgmlType::*;
        match *self {
            SynthType::Ftype(f) => f.id(),
            SynthType::Pure(t) => match t {
                Q3_K => Ftype::Q3_K_S.id(),
                Q4_K => Ftype::Q4_K_S.id(),
                Q5_K => Ftype::Q5_K_S.id(),
                IQ2_S => Ftype::IQ2_S.id(),
                _ => Ftype::parse(t.name())
                    .filter(|(f, _)| f.default_type() == t)
                    .map_or(1024, |(f, _)| f.id()),
            },
        }
    }
}

impl std::fmt::Display for SynthType {
    /// `Q4_K_M`, or `pure Q4_K`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SynthType::Ftype(t) => f.write_str(t.name()),
            SynthType::Pure(t) => write!(f, "pure {}", t.name()),
        }
    }
}

/// llama-quantize's file type names (without aliases), for messages and help.
pub fn ftype_names() -> String {
    let mut v: Vec<&str> = Vec::new();
    for (_, f) in crate::quant_rules::ftype::NAMES {
        if !v.contains(&f.name()) {
            v.push(f.name());
        }
    }
    v.join(", ")
}

/// What to generate.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthSpec {
    pub arch: SynthArch,
    pub shape: SynthShape,
    pub ty: SynthType,
    pub seed: u64,
    /// `general.name`.
    pub name: String,
}

/// Preset names and descriptions.
const PRESETS: &[(&str, &str)] = &[
    (
        "deepseek2-tiny",
        "deepseek2 like the fixture (4.3 M params): hidden 256, 3 layers (1 dense + 2 MoE), MLA 4 heads (q_lora 128, kv_lora 512, rope 64, nope 32, v 32), 16 experts x 64 top-4 + 1 shared, sigmoid + bias, YaRN x4, vocab 2048",
    ),
    (
        "qwen3moe-tiny",
        "qwen3moe like the fixture (4.6 M params): hidden 256, 2 MoE layers, GQA 4/2 x 64 with q/k norm, 8 experts x 256 top-2, softmax, vocab 2048",
    ),
    (
        "glm4moe-tiny",
        "glm4moe like the fixture (3.7 M params): hidden 256, 3 layers (1 dense + 2 MoE), GQA 4/2 x 64 with qkv bias, q/k norm, rope on 32 of 64 dims, 16 experts x 64 top-4 + 1 shared, sigmoid + bias, vocab 2048",
    ),
    (
        "bench-deepseek2",
        "deepseek2 benchmark model (3.23 B params; Q4_K_M 1.96 GB, Q8_0 3.43 GB): hidden 1536, 20 layers (1 dense n_ff 4096 + 19 MoE), MLA 16 heads (q_lora 768, kv_lora 512, rope 64, nope 128, v 128), 64 experts x 512 top-6 + 1 shared, sigmoid + bias, vocab 32768",
    ),
    (
        "bench-qwen3moe",
        "qwen3moe benchmark model (3.28 B params; Q4_K_M 2.00 GB, Q8_0 3.50 GB): hidden 1536, 20 MoE layers, GQA 16/4 x 128, 128 experts x 256 top-8, softmax, vocab 32768",
    ),
    ("bench-ds", "alias of bench-deepseek2"),
    (
        "bench-qwen",
        "alias of bench-qwen3moe (before it, bench-qwen had 64 experts x 512: add --set n_expert=64 --set n_ff_exp=512 for that shape)",
    ),
];

/// The presets: `(name, description)`. `tiny` with an architecture picks `<arch>-tiny`
/// (see [`SynthSpec::preset_for`]).
pub fn presets() -> &'static [(&'static str, &'static str)] {
    PRESETS
}

fn deepseek2_tiny_shape() -> SynthShape {
    SynthShape {
        n_vocab: 2048,
        n_embd: 256,
        n_layer: 3,
        n_dense_lead: 1,
        n_ff: 512,
        n_head: 4,
        n_head_kv: 1,
        head_dim: 0,
        n_rot: None,
        q_lora_rank: 128,
        kv_lora_rank: 512,
        qk_nope_dim: 32,
        qk_rope_dim: 64,
        v_head_dim: 32,
        n_expert: 16,
        n_expert_used: 4,
        n_ff_exp: 64,
        n_expert_shared: 1,
        n_expert_groups: 1,
        n_group_used: 1,
        gating: Gating::Sigmoid,
        expert_weights_norm: true,
        expert_weights_scale: 2.5,
        n_ctx_train: 4096,
        rope_theta: 10000.0,
        rms_eps: 1e-6,
        yarn: Some(Yarn {
            factor: 4.0,
            orig_ctx: 1024,
            log_multiplier: 0.1,
        }),
        logit_std: 4.0,
        router_std: 1.5,
        routing: RoutingShape::default(),
    }
}

fn qwen3moe_tiny_shape() -> SynthShape {
    SynthShape {
        n_vocab: 2048,
        n_embd: 256,
        n_layer: 2,
        n_dense_lead: 0,
        n_ff: 768,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_rot: None,
        q_lora_rank: 0,
        kv_lora_rank: 0,
        qk_nope_dim: 0,
        qk_rope_dim: 0,
        v_head_dim: 0,
        n_expert: 8,
        n_expert_used: 2,
        n_ff_exp: 256,
        n_expert_shared: 0,
        n_expert_groups: 1,
        n_group_used: 1,
        gating: Gating::Softmax,
        expert_weights_norm: true,
        expert_weights_scale: 1.0,
        n_ctx_train: 4096,
        rope_theta: 1_000_000.0,
        rms_eps: 1e-6,
        yarn: None,
        logit_std: 4.0,
        router_std: 1.5,
        routing: RoutingShape::default(),
    }
}

fn glm4moe_tiny_shape() -> SynthShape {
    SynthShape {
        n_vocab: 2048,
        n_embd: 256,
        n_layer: 3,
        n_dense_lead: 1,
        n_ff: 512,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_rot: None,
        q_lora_rank: 0,
        kv_lora_rank: 0,
        qk_nope_dim: 0,
        qk_rope_dim: 0,
        v_head_dim: 0,
        n_expert: 16,
        n_expert_used: 4,
        n_ff_exp: 64,
        n_expert_shared: 1,
        n_expert_groups: 1,
        n_group_used: 1,
        gating: Gating::Sigmoid,
        expert_weights_norm: true,
        expert_weights_scale: 2.5,
        n_ctx_train: 4096,
        rope_theta: 1_000_000.0,
        rms_eps: 1e-5,
        yarn: None,
        logit_std: 4.0,
        router_std: 1.5,
        routing: RoutingShape::default(),
    }
}

/// `bench-deepseek2`: DeepSeek-V3's proportions at 3.23 B parameters (the shape of the peer
/// baselines in `shared/notes/baselines.md`).
fn bench_deepseek2_shape() -> SynthShape {
    SynthShape {
        n_vocab: 32768,
        n_embd: 1536,
        n_layer: 20,
        n_dense_lead: 1,
        n_ff: 4096,
        n_head: 16,
        q_lora_rank: 768,
        kv_lora_rank: 512,
        qk_nope_dim: 128,
        qk_rope_dim: 64,
        v_head_dim: 128,
        n_expert: 64,
        n_expert_used: 6,
        n_ff_exp: 512,
        n_expert_shared: 1,
        n_expert_groups: 1,
        n_group_used: 1,
        ..deepseek2_tiny_shape()
    }
}

/// `bench-qwen3moe`: Qwen3-30B-A3B's routing (128 experts, top-8, no shared expert) at
/// 3.28 B parameters; `n_ff_exp` 256 keeps expert rows a whole number of K-quant blocks.
fn bench_qwen3moe_shape() -> SynthShape {
    SynthShape {
        n_vocab: 32768,
        n_embd: 1536,
        n_layer: 20,
        n_ff: 4096,
        n_head: 16,
        n_head_kv: 4,
        head_dim: 128,
        n_expert: 128,
        n_expert_used: 8,
        n_ff_exp: 256,
        ..qwen3moe_tiny_shape()
    }
}

impl SynthSpec {
    /// The preset `name` (see [`presets`]); also accepts `tiny-<arch>` and the aliases
    /// `bench-ds` (= `bench-deepseek2`) and `bench-qwen` (= `bench-qwen3moe`).
    pub fn preset(name: &str) -> Result<SynthSpec> {
        let (arch, shape, ty, seed) = match name {
            "deepseek2-tiny" | "tiny-deepseek2" => (
                SynthArch::Deepseek2,
                deepseek2_tiny_shape(),
                SynthType::Ftype(Ftype::F32),
                1001,
            ),
            "qwen3moe-tiny" | "tiny-qwen3moe" => (
                SynthArch::Qwen3Moe,
                qwen3moe_tiny_shape(),
                SynthType::Ftype(Ftype::F32),
                2002,
            ),
            "glm4moe-tiny" | "tiny-glm4moe" => (
                SynthArch::Glm4Moe,
                glm4moe_tiny_shape(),
                SynthType::Ftype(Ftype::F32),
                3003,
            ),
            "bench-deepseek2" | "bench-ds" => (
                SynthArch::Deepseek2,
                bench_deepseek2_shape(),
                SynthType::Ftype(Ftype::Q4_K_M),
                4004,
            ),
            "bench-qwen3moe" | "bench-qwen" => (
                SynthArch::Qwen3Moe,
                bench_qwen3moe_shape(),
                SynthType::Ftype(Ftype::Q4_K_M),
                5005,
            ),
            _ => {
                let hint = if header_presets().iter().any(|(n, _)| *n == name) {
                    format!(
                        " ('{name}' is a real model written header-only, without weights: use --header-only / synth::write_header_only)"
                    )
                } else {
                    String::new()
                };
                return Err(Error::Model(format!(
                    "synth: unknown preset '{name}'; presets: {}{hint}",
                    PRESETS
                        .iter()
                        .map(|(n, _)| *n)
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        };
        let name = match name {
            "bench-ds" => "bench-deepseek2".to_owned(),
            "bench-qwen" => "bench-qwen3moe".to_owned(),
            _ => name
                .strip_prefix("tiny-")
                .map_or(name.to_owned(), |a| format!("{a}-tiny")),
        };
        Ok(SynthSpec {
            arch,
            shape,
            ty,
            seed,
            name,
        })
    }

    /// A preset, where `tiny` is resolved with `arch` (`tiny` + deepseek2 = `deepseek2-tiny`);
    /// an explicit `arch` must match the preset's.
    pub fn preset_for(name: &str, arch: Option<SynthArch>) -> Result<SynthSpec> {
        let spec =
            match (name, arch) {
                ("tiny", Some(a)) => SynthSpec::preset(&format!("{}-tiny", a.name()))?,
                ("tiny", None) => return Err(Error::Model(
                    "synth: preset 'tiny' needs an architecture (deepseek2, glm4moe or qwen3moe)"
                        .into(),
                )),
                _ => SynthSpec::preset(name)?,
            };
        if let Some(a) = arch {
            if a != spec.arch {
                return Err(Error::Model(format!(
                    "synth: preset '{name}' is a {} model, not {}",
                    spec.arch.name(),
                    a.name()
                )));
            }
        }
        Ok(spec)
    }

    /// Checks the shape for this architecture (sizes, divisibility, what llama.cpp's loader
    /// accepts) and that every tensor type can be written.
    pub fn validate(&self) -> Result<()> {
        plan::validate(self)?;
        plan(self).map(|_| ())
    }

    /// The model's `general.description`.
    pub fn description(&self) -> String {
        let s = &self.shape;
        let attn = match self.arch {
            SynthArch::Deepseek2 => format!(
                "MLA {} heads (q_lora {}, kv_lora {}, rope {}, nope {}, v {})",
                s.n_head, s.q_lora_rank, s.kv_lora_rank, s.qk_rope_dim, s.qk_nope_dim, s.v_head_dim
            ),
            _ => format!(
                "GQA {}/{} x {} (rope {})",
                s.n_head,
                s.n_head_kv,
                s.head_dim,
                s.rot_dims(self.arch)
            ),
        };
        let shared = if s.n_expert_shared > 0 {
            format!(" + {} shared", s.n_expert_shared)
        } else {
            String::new()
        };
        let r = &s.routing;
        let routing = if *r == RoutingShape::default() {
            String::new()
        } else {
            format!(
                ", routing: exp_probs_b std {} to {}, attention window {} (sharpness {}, gain {})",
                r.skew_first, r.skew_last, r.attn_window, r.attn_sharpness, r.attn_gain
            )
        };
        format!(
            "{}-shaped synthetic model: hidden {}, {} layers ({} dense), {attn}, {} experts x {} top-{}{shared}{routing}, vocab {}, {} (random weights, seed {}; moxie gen)",
            self.arch.name(),
            s.n_embd,
            s.n_layer,
            s.n_dense_lead,
            s.n_expert,
            s.n_ff_exp,
            s.n_expert_used,
            s.n_vocab,
            self.ty,
            self.seed
        )
    }
}

/// What [`generate`] wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthReport {
    pub path: PathBuf,
    /// File size.
    pub bytes: u64,
    /// Tensor data bytes (without header and padding).
    pub tensor_bytes: u64,
    /// Parameters (tensor elements).
    pub n_params: u64,
    pub n_tensors: usize,
    /// `general.file_type`.
    pub file_type: u32,
    /// Tensor count per block type, in type-id order.
    pub tensor_types: Vec<(GgmlType, usize)>,
    pub seconds: f64,
}

/// Tensors per block type, in type-id order (a [`SynthReport`]'s `tensor_types`).
pub(crate) fn count_types(types: impl Iterator<Item = GgmlType>) -> Vec<(GgmlType, usize)> {
    let mut counts: Vec<(GgmlType, usize)> = Vec::new();
    for ty in types {
        match counts.iter_mut().find(|(t, _)| *t == ty) {
            Some((_, n)) => *n += 1,
            None => counts.push((ty, 1)),
        }
    }
    counts.sort_by_key(|(ty, _)| ty.id());
    counts
}
