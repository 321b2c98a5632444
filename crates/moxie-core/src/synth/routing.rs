//! Synthetic models whose expert routing has a chosen static skew, temporal locality and
//! per-layer concentration (`moxie gen --routing PRESET`), so that placement policies (static
//! hot experts, whole layers, a dynamic expert cache) can be compared without real weights.
//!
//! Random weights route almost uniformly and without memory: each token's router input is a
//! fresh random vector. Two mechanisms, both in the weights alone (the files are ordinary
//! GGUFs that llama.cpp runs the same way):
//!
//! * **Static skew**: the expert selection bias `exp_probs_b` (DeepSeek-V3's load-balancing
//!   bias, which moves the choice of experts but not their weights) is drawn with a standard
//!   deviation that grows linearly from `skew_first` in the first MoE layer to `skew_last` in
//!   the last, so later layers are more concentrated, as measured on real models.
//! * **Temporal locality**: every attention layer becomes a causal window over the last few
//!   tokens, so consecutive tokens' hidden states, and so their router inputs, share most of
//!   what attention adds. Channel 0 of the residual stream is a constant (the embedding sets
//!   it, no layer writes it); the queries read only that channel, through `attn_q_a` and its
//!   RMS norm, so every query is the same vector; the rotary keys read only that channel too.
//!   A score then depends on the distance `Δ` between the two positions alone:
//!   `A · mean_p cos(θ_p Δ)` over the rotary pairs `p` whose frequency `θ_p` is at most
//!   `1 / attn_window`. It is flat for `Δ ≲ attn_window` and falls off beyond (the pairs'
//!   frequencies are geometric, so the fall is a power of `Δ` set by `A = attn_sharpness`).
//!   `attn_gain` scales the attention output against the token's own embedding: how much of
//!   the router input is shared with the neighbours.

use super::{SynthArch, SynthSpec};
use crate::config::Gating;
use crate::{Error, Result};

/// The routing knobs of a synthetic model (see the module documentation). The default is
/// what every other preset has: weak skew (`exp_probs_b` ~ `N(0, 0.05²)`), random attention.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RoutingShape {
    /// Std of `exp_probs_b` in the first MoE layer.
    pub skew_first: f32,
    /// Std of `exp_probs_b` in the last MoE layer (linear in between).
    pub skew_last: f32,
    /// 0: random attention; otherwise the width in tokens of every attention layer's window.
    pub attn_window: usize,
    /// Score (in logits) of a position with itself in window mode; larger means a faster
    /// fall-off beyond the window.
    pub attn_sharpness: f32,
    /// Gain of `attn_output` (the other output projections keep 0.6).
    pub attn_gain: f32,
}

/// Output-projection gain (attn_output, ffn_down*).
pub(super) const OUT_GAIN: f32 = 0.6;
/// Std of the expert selection bias `exp_probs_b` in the default preset.
pub(super) const PROBS_B_STD: f32 = 0.05;

impl Default for RoutingShape {
    fn default() -> RoutingShape {
        RoutingShape {
            skew_first: PROBS_B_STD,
            skew_last: PROBS_B_STD,
            attn_window: 0,
            attn_sharpness: 12.0,
            attn_gain: OUT_GAIN,
        }
    }
}

/// `(name, description)` of the `--routing` presets.
pub const ROUTING_PRESETS: &[(&str, &str)] = &[
    (
        "skewed",
        "strong static skew, no temporal locality: about 10% of a layer's experts take 80% of \
         its selections (the skewed model in the field's reports), more in later layers than \
         in early ones",
    ),
    (
        "recency",
        "weak static skew, strong temporal locality: the 6.25% most selected experts take \
         about 10% of the selections (uniform: 6.25%), and a token reuses many of the previous \
         tokens' experts (median reuse distance about 2 tokens, as reported for an LRU expert \
         cache)",
    ),
    ("uniform", "the default: weak skew, no temporal locality"),
];

impl RoutingShape {
    /// A `--routing` preset (see [`ROUTING_PRESETS`]).
    pub fn preset(name: &str) -> Result<RoutingShape> {
        let d = RoutingShape::default();
        Ok(match name {
            "skewed" => RoutingShape {
                skew_first: 0.45,
                skew_last: 0.9,
                ..d
            },
            "recency" => RoutingShape {
                skew_first: 0.05,
                skew_last: 0.1,
                attn_window: 4,
                attn_sharpness: 12.0,
                attn_gain: 1.0,
            },
            "uniform" => d,
            _ => {
                return Err(Error::Model(format!(
                    "synth: unknown routing preset '{name}'; presets: {}",
                    ROUTING_PRESETS
                        .iter()
                        .map(|(n, _)| *n)
                        .collect::<Vec<_>>()
                        .join(", ")
                )))
            }
        })
    }

    /// Std of `exp_probs_b` in MoE layer `i` of `n` (0-based, in file order).
    pub fn skew_at(&self, i: usize, n: usize) -> f32 {
        if n <= 1 {
            return self.skew_last;
        }
        let f = i as f32 / (n - 1) as f32;
        self.skew_first + (self.skew_last - self.skew_first) * f
    }
}

/// How a tensor's drawn rows are reshaped for the attention window (applied to each row after
/// its random draw, before quantization).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RowRule {
    /// As drawn.
    AsDrawn,
    /// Element 0 of every row is `value` (`token_embd`: the constant channel).
    SetChannel0 { value: f32 },
    /// Rows `r` with `r % period == 0` are zero (output projections: channel 0 of each expert's
    /// output is never written).
    ZeroEvery { period: usize },
    /// Every row is `[value, 0, 0, ...]`: reads channel 0 only (`attn_q_a`).
    ReadChannel0 { value: f32 },
    /// `attn_kv_a_mqa`: rows from `first` are the rotary key dims `j = r - first`; those of the
    /// first element of the window's pairs (`j` even, `j / 2 >= pair0`) are `[value, 0, ...]`,
    /// the others zero. The latent rows before `first` stay as drawn.
    RopeKeys {
        first: usize,
        pair0: usize,
        value: f32,
    },
    /// `attn_q_b`: per head, the `nope` non-rotary rows are zero and the rotary rows of the
    /// window's pairs' first elements are `value` throughout (the query is a constant), the
    /// other rotary rows zero.
    RopeQueries {
        nope: usize,
        rope: usize,
        pair0: usize,
        value: f32,
    },
}

impl RowRule {
    /// Reshapes row `r` (drawn already) in place.
    pub fn apply(&self, r: u64, row: &mut [f32]) {
        let r = r as usize;
        let window_pair = |j: usize, pair0: usize| j.is_multiple_of(2) && j / 2 >= pair0;
        let read0 = |row: &mut [f32], v: f32| {
            row.fill(0.0);
            row[0] = v;
        };
        match *self {
            RowRule::AsDrawn => {}
            RowRule::SetChannel0 { value } => row[0] = value,
            RowRule::ZeroEvery { period } => {
                if r.is_multiple_of(period) {
                    row.fill(0.0);
                }
            }
            RowRule::ReadChannel0 { value } => read0(row, value),
            RowRule::RopeKeys {
                first,
                pair0,
                value,
            } => {
                if r >= first {
                    let v = if window_pair(r - first, pair0) {
                        value
                    } else {
                        0.0
                    };
                    read0(row, v);
                }
            }
            RowRule::RopeQueries {
                nope,
                rope,
                pair0,
                value,
            } => {
                let d = r % (nope + rope);
                let v = if d >= nope && window_pair(d - nope, pair0) {
                    value
                } else {
                    0.0
                };
                row.fill(v);
            }
        }
    }
}

/// The window's first rotary pair: the first whose frequency `θ_p = base^(-2p / rope_dim)` is
/// at most `1 / window`.
fn first_window_pair(spec: &SynthSpec) -> usize {
    let s = &spec.shape;
    let w = s.routing.attn_window as f64;
    let base = s.rope_theta as f64;
    let d = s.qk_rope_dim as f64;
    (0..s.qk_rope_dim / 2)
        .find(|&p| base.powf(-2.0 * p as f64 / d) <= 1.0 / w)
        .unwrap_or(s.qk_rope_dim / 2)
}

/// Checks that the routing knobs fit the architecture and shape.
pub(super) fn validate(spec: &SynthSpec) -> Result<()> {
    let s = &spec.shape;
    let r = &s.routing;
    let bad = |m: String| Err(Error::Model(format!("synth: {m}")));
    let finite = [r.skew_first, r.skew_last, r.attn_sharpness, r.attn_gain];
    if finite.iter().any(|v| !v.is_finite() || *v < 0.0) {
        return bad(format!(
            "skew_first, skew_last, attn_sharpness and attn_gain must be finite and >= 0: {r:?}"
        ));
    }
    let has_bias = match spec.arch {
        SynthArch::Glm4Moe => true,
        SynthArch::Deepseek2 => s.gating == Gating::Sigmoid,
        SynthArch::Qwen3Moe => false,
    };
    let d = RoutingShape::default();
    if !has_bias && (r.skew_first, r.skew_last) != (d.skew_first, d.skew_last) {
        return bad(format!(
            "skew_first / skew_last set the expert selection bias exp_probs_b, which {} with {:?} gating has not (deepseek2 with sigmoid gating and glm4moe have it)",
            spec.arch.name(),
            s.gating
        ));
    }
    if r.attn_window > 0 {
        if spec.arch != SynthArch::Deepseek2 || s.q_lora_rank == 0 {
            return bad(format!(
                "attn_window (temporal locality) is built for deepseek2's MLA with a query rank (q_lora_rank > 0), not {} with q_lora_rank {}",
                spec.arch.name(),
                s.q_lora_rank
            ));
        }
        if first_window_pair(spec) >= s.qk_rope_dim / 2 {
            return bad(format!(
                "attn_window {} is wider than the slowest rotary frequency allows (rope_theta {}, qk_rope_dim {})",
                r.attn_window, s.rope_theta, s.qk_rope_dim
            ));
        }
    }
    Ok(())
}

/// The row rule of tensor `name` (`blk.N.<suffix>` or a global tensor).
pub(super) fn row_rule(spec: &SynthSpec, name: &str) -> RowRule {
    let s = &spec.shape;
    if s.routing.attn_window == 0 {
        return RowRule::AsDrawn;
    }
    let suffix = name
        .strip_prefix("blk.")
        .and_then(|n| n.split_once('.'))
        .map_or(name, |(_, rest)| rest);
    let pair0 = first_window_pair(spec);
    let n_pairs = s.qk_rope_dim / 2 - pair0;
    match suffix {
        "token_embd.weight" => RowRule::SetChannel0 { value: 1.0 },
        "attn_output.weight"
        | "ffn_down.weight"
        | "ffn_down_exps.weight"
        | "ffn_down_shexp.weight" => RowRule::ZeroEvery { period: s.n_embd },
        "attn_q_a.weight" => RowRule::ReadChannel0 { value: 1.0 },
        // The normed `q_a` is the norm's weights (~1) in every dim, so each query row's dot
        // product is its value times `q_lora_rank`: 1 per window pair.
        "attn_q_b.weight" => RowRule::RopeQueries {
            nope: s.qk_nope_dim,
            rope: s.qk_rope_dim,
            pair0,
            value: 1.0 / s.q_lora_rank as f32,
        },
        // Channel 0 of the normed input is about 1 (the constant over a residual stream of
        // RMS about 1), so a position's score with itself is about
        // n_pairs * value / sqrt(head size) = attn_sharpness.
        "attn_kv_a_mqa.weight" => RowRule::RopeKeys {
            first: s.kv_lora_rank,
            pair0,
            value: s.routing.attn_sharpness * ((s.qk_nope_dim + s.qk_rope_dim) as f32).sqrt()
                / n_pairs as f32,
        },
        _ => RowRule::AsDrawn,
    }
}
