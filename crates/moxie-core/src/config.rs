//! The hyper-parameters every architecture has, read from GGUF metadata as llama.cpp's loader
//! reads them (key names, defaults, RoPE and YaRN derivation). What is particular to one
//! architecture (its gating default, RoPE layout, YaRN fix-ups, MLA / indexer / SSM sizes)
//! lives in its file under `crate::arch`, which adjusts this after the common part is read.

use moxie_gguf::{Metadata, Value};

use crate::ops::{Rope, RopeKind};
use crate::{Error, Result};

/// Architectures moxie can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Deepseek2,
    GlmDsa,
    Glm4Moe,
    Qwen3Moe,
    Qwen3Next,
}

impl Arch {
    pub const SUPPORTED: [(&'static str, Arch); 6] = [
        ("llama", Arch::Llama),
        ("deepseek2", Arch::Deepseek2),
        ("glm-dsa", Arch::GlmDsa),
        ("glm4moe", Arch::Glm4Moe),
        ("qwen3moe", Arch::Qwen3Moe),
        ("qwen3next", Arch::Qwen3Next),
    ];

    pub fn from_name(name: &str) -> Result<Arch> {
        Self::SUPPORTED
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, a)| *a)
            .ok_or_else(|| {
                Error::Model(format!(
                    "unsupported architecture '{name}'; supported: {}",
                    Self::SUPPORTED
                        .iter()
                        .map(|(n, _)| *n)
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
    }

    pub fn name(self) -> &'static str {
        Self::SUPPORTED
            .iter()
            .find(|(_, a)| *a == self)
            .map(|(n, _)| *n)
            .unwrap_or("?")
    }
}

/// How router logits become expert probabilities (`expert_gating_func`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    Softmax,
    Sigmoid,
}

/// Hyper-parameters of a model, as llama.cpp derives them from the metadata.
#[derive(Clone, Debug)]
pub struct Config {
    pub arch: Arch,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Per-head key / value sizes (`attention.key_length`, `value_length`).
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    pub n_ff: usize,
    pub rms_eps: f32,
    pub n_rot: usize,
    pub n_layer_dense_lead: usize,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_expert_shared: usize,
    pub n_ff_exp: usize,
    pub n_expert_groups: usize,
    pub n_group_used: usize,
    pub expert_weights_scale: f32,
    pub expert_weights_norm: bool,
    pub gating: Gating,
    /// `nextn_predict_layers`: trailing MTP blocks that the main graph skips.
    pub n_layer_nextn: usize,
    pub rope: Rope,
    /// YaRN's log multiplier (`mscale_all_dims`), where the architecture reads one (0: none).
    pub rope_yarn_log_mul: f32,
    /// YaRN's `mscale` equals `mscale_all_dims` instead of 1 (DeepSeek-V2's config; llama.cpp
    /// special-cases it).
    pub rope_yarn_mscale_is_log_mul: bool,
}

/// Typed metadata lookups for one architecture prefix.
pub(crate) struct Keys<'a> {
    meta: &'a Metadata,
    arch: &'a str,
}

impl<'a> Keys<'a> {
    pub fn new(meta: &'a Metadata, arch: &'a str) -> Keys<'a> {
        Keys { meta, arch }
    }

    pub fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    fn value(&self, k: &str) -> Option<&Value> {
        self.meta.get(&self.key(k))
    }

    /// A non-negative integer, or an array of them that must hold one value for every layer
    /// (llama.cpp's get_key_or_arr; moxie needs them uniform).
    pub fn uint_opt(&self, k: &str) -> Result<Option<usize>> {
        let Some(v) = self.value(k) else {
            return Ok(None);
        };
        if let Some(x) = v.as_u64() {
            return usize::try_from(x)
                .map(Some)
                .map_err(|_| Error::Model(format!("metadata '{}' is too large", self.key(k))));
        }
        if let Some(arr) = v.as_array() {
            let mut vals = Vec::new();
            for i in 0..arr.len() {
                let x = arr.get(i).and_then(|e| e.as_u64()).ok_or_else(|| {
                    Error::Model(format!("metadata '{}' must hold integers", self.key(k)))
                })?;
                vals.push(x);
            }
            let first = vals.first().copied().unwrap_or(0);
            // Layers with 0 (e.g. no experts in dense layers) are allowed besides one value.
            let distinct: Vec<u64> = {
                let mut d: Vec<u64> = vals.iter().copied().filter(|&x| x != 0).collect();
                d.sort_unstable();
                d.dedup();
                d
            };
            return match distinct.len() {
                0 => Ok(Some(first as usize)),
                1 => Ok(Some(distinct[0] as usize)),
                _ => Err(Error::Model(format!(
                    "metadata '{}' varies per layer ({vals:?}); moxie supports one value for all layers",
                    self.key(k)
                ))),
            };
        }
        Err(Error::Model(format!(
            "metadata '{}' has type {:?}, expected an integer",
            self.key(k),
            v.value_type()
        )))
    }

    /// An array of non-negative integers, one per layer (`None` when absent); a single
    /// integer is repeated for `n` layers.
    pub fn uint_per_layer(&self, k: &str, n: usize) -> Result<Option<Vec<u64>>> {
        let Some(v) = self.value(k) else {
            return Ok(None);
        };
        if let Some(x) = v.as_u64() {
            return Ok(Some(vec![x; n]));
        }
        let bad = || {
            Error::Model(format!(
                "metadata '{}' must hold one integer per layer ({n})",
                self.key(k)
            ))
        };
        let arr = v.as_array().ok_or_else(bad)?;
        if arr.len() < n {
            return Err(bad());
        }
        (0..n)
            .map(|i| arr.get(i).and_then(|e| e.as_u64()).ok_or_else(bad))
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    pub fn uint(&self, k: &str) -> Result<usize> {
        self.uint_opt(k)?
            .ok_or_else(|| Error::Model(format!("missing metadata key '{}'", self.key(k))))
    }

    pub fn float_opt(&self, k: &str) -> Result<Option<f32>> {
        match self.value(k) {
            None => Ok(None),
            Some(v) => v.as_f64().map(|x| Some(x as f32)).ok_or_else(|| {
                Error::Model(format!("metadata '{}' must be a number", self.key(k)))
            }),
        }
    }

    pub fn bool_opt(&self, k: &str) -> Result<Option<bool>> {
        match self.value(k) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| Error::Model(format!("metadata '{}' must be a bool", self.key(k)))),
        }
    }

    /// An array of booleans (integers count as their truth value), one per entry.
    pub fn bool_array_opt(&self, k: &str) -> Result<Option<Vec<bool>>> {
        let Some(v) = self.value(k) else {
            return Ok(None);
        };
        let bad = || {
            Error::Model(format!(
                "metadata '{}' must be an array of bools",
                self.key(k)
            ))
        };
        let arr = v.as_array().ok_or_else(bad)?;
        arr.iter()
            .map(|e| {
                e.as_bool()
                    .or_else(|| e.as_u64().map(|x| x != 0))
                    .ok_or_else(bad)
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    pub fn str_opt(&self, k: &str) -> Option<&str> {
        self.value(k).and_then(|v| v.as_str())
    }
}

impl Config {
    /// Read the hyper-parameters of the model described by `meta`: the common ones, then the
    /// architecture's adjustments, then RoPE (whose YaRN factors depend on those).
    pub fn from_metadata(meta: &Metadata) -> Result<Config> {
        let arch_name = meta
            .get_str("general.architecture")
            .ok_or_else(|| Error::Model("missing metadata key 'general.architecture'".into()))?;
        let def = crate::arch::def(Arch::from_name(arch_name)?);
        let k = Keys::new(meta, arch_name);
        let mut cfg = Config::common(def.arch, &k)?;
        (def.hparams)(&mut cfg, &k)?;
        cfg.rope = rope(&cfg, &k)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The keys every architecture reads, with llama.cpp's defaults (softmax gating, normal
    /// RoPE over the whole key head, no YaRN log multiplier).
    fn common(arch: Arch, k: &Keys) -> Result<Config> {
        let arch_name = k.arch;
        let n_embd = k.uint("embedding_length")?;
        let n_layer_all = k.uint("block_count")?;
        let n_layer_nextn = k.uint_opt("nextn_predict_layers")?.unwrap_or(0);
        if n_layer_all == 0 || n_layer_nextn >= n_layer_all {
            return Err(Error::Model(format!(
                "metadata '{arch_name}.block_count' = {n_layer_all} with {n_layer_nextn} nextn layers: no layers to run"
            )));
        }
        let n_head = k.uint("attention.head_count")?;
        if n_head == 0 {
            return Err(Error::Model(format!(
                "metadata '{arch_name}.attention.head_count' is 0"
            )));
        }
        let n_head_kv = k.uint_opt("attention.head_count_kv")?.unwrap_or(n_head);
        if n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(Error::Model(format!(
                "metadata: head_count {n_head} is not a multiple of head_count_kv {n_head_kv}"
            )));
        }
        let head_dim_k = k
            .uint_opt("attention.key_length")?
            .unwrap_or(n_embd / n_head);
        let head_dim_v = k
            .uint_opt("attention.value_length")?
            .unwrap_or(n_embd / n_head);
        let n_rot = k.uint_opt("rope.dimension_count")?.unwrap_or(head_dim_k);
        let n_vocab = match k.uint_opt("vocab_size")? {
            Some(v) => v,
            None => k
                .meta
                .get_array("tokenizer.ggml.tokens")
                .map(|a| a.len())
                .ok_or_else(|| {
                    Error::Model(format!(
                        "missing metadata key '{arch_name}.vocab_size' and no tokenizer.ggml.tokens"
                    ))
                })?,
        };

        let n_expert = k.uint_opt("expert_count")?.unwrap_or(0);
        let n_expert_used = k.uint_opt("expert_used_count")?.unwrap_or(0);
        let n_expert_groups = k.uint_opt("expert_group_count")?.unwrap_or(0);
        let n_group_used = k.uint_opt("expert_group_used_count")?.unwrap_or(0);
        // Dense llama files have no experts (Mixtral, also `llama`, has them).
        let dense = arch == Arch::Llama && n_expert == 0 && n_expert_used == 0;
        if !dense && (n_expert == 0 || n_expert_used == 0 || n_expert_used > n_expert) {
            return Err(Error::Model(format!(
                "metadata: {arch_name} needs expert_count > 0 and 0 < expert_used_count <= expert_count (got {n_expert}, {n_expert_used})"
            )));
        }
        if n_expert_groups > 1
            && (n_expert % n_expert_groups != 0
                || n_group_used == 0
                || n_group_used >= n_expert_groups
                || n_expert_groups >= n_expert)
        {
            return Err(Error::Model(format!(
                "metadata: invalid expert groups ({n_expert_groups} groups, {n_group_used} used, {n_expert} experts)"
            )));
        }
        let gating = match k.uint_opt("expert_gating_func")?.unwrap_or(0) {
            0 | 1 => Gating::Softmax,
            2 => Gating::Sigmoid,
            g => {
                return Err(Error::Model(format!(
                    "metadata '{arch_name}.expert_gating_func' = {g}: supported are 1 (softmax) and 2 (sigmoid)"
                )))
            }
        };
        let rms_eps = k
            .float_opt("attention.layer_norm_rms_epsilon")?
            .ok_or_else(|| {
                Error::Model(format!(
                    "missing metadata key '{arch_name}.attention.layer_norm_rms_epsilon'"
                ))
            })?;
        Ok(Config {
            arch,
            n_vocab,
            n_ctx_train: k.uint("context_length")?,
            n_embd,
            n_layer: n_layer_all - n_layer_nextn,
            n_head,
            n_head_kv,
            head_dim_k,
            head_dim_v,
            n_ff: k.uint_opt("feed_forward_length")?.unwrap_or(0),
            rms_eps,
            n_rot,
            n_layer_dense_lead: k.uint_opt("leading_dense_block_count")?.unwrap_or(0),
            n_expert,
            n_expert_used,
            n_expert_shared: k.uint_opt("expert_shared_count")?.unwrap_or(0),
            n_ff_exp: k.uint_opt("expert_feed_forward_length")?.unwrap_or(0),
            n_expert_groups,
            n_group_used,
            expert_weights_scale: k.float_opt("expert_weights_scale")?.unwrap_or(0.0),
            expert_weights_norm: k.bool_opt("expert_weights_norm")?.unwrap_or(false),
            gating,
            n_layer_nextn,
            // Set by `rope()` once the architecture has had its say.
            rope: Rope {
                kind: RopeKind::Normal,
                n_dims: n_rot,
                freq_base: 10000.0,
                freq_scale: 1.0,
                ext_factor: 0.0,
                attn_factor: 1.0,
                beta_fast: 32.0,
                beta_slow: 1.0,
                n_ctx_orig: 0,
            },
            rope_yarn_log_mul: 0.0,
            rope_yarn_mscale_is_log_mul: false,
        })
    }

    fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::Model(format!("metadata: {what}")));
        if !self.n_rot.is_multiple_of(2) || self.n_rot > self.head_dim_k {
            return bad(format!(
                "rope.dimension_count {} must be even and <= key_length {}",
                self.n_rot, self.head_dim_k
            ));
        }
        // A sanity bound against absurd values before anything is allocated from them.
        for (name, v) in [
            ("embedding_length", self.n_embd),
            ("head_count", self.n_head),
            ("key_length", self.head_dim_k),
            ("expert_count", self.n_expert),
            ("vocab_size", self.n_vocab),
        ] {
            if v > 1 << 24 {
                return bad(format!("{name} = {v} is implausibly large"));
            }
        }
        Ok(())
    }
}

/// RoPE as llama_context derives it from the metadata, the architecture's RoPE layout and its
/// YaRN log multiplier.
fn rope(c: &Config, k: &Keys) -> Result<Rope> {
    let arch_name = k.arch;
    let freq_base = k.float_opt("rope.freq_base")?.unwrap_or(10000.0);
    let scaling = k.str_opt("rope.scaling.type").unwrap_or("linear");
    let factor = match k.float_opt("rope.scaling.factor")? {
        Some(f) => f,
        None => k.float_opt("rope.scale_linear")?.unwrap_or(0.0),
    };
    let mut freq_scale = if factor == 0.0 { 1.0 } else { 1.0 / factor };
    let n_ctx_orig = k
        .uint_opt("rope.scaling.original_context_length")?
        .unwrap_or(c.n_ctx_train) as u32;
    let rope_attn_factor = k.float_opt("rope.scaling.attn_factor")?.unwrap_or(1.0);
    let ext_factor;
    let mut attn_factor = 1.0f32;
    match scaling {
        "none" => {
            freq_scale = 1.0;
            ext_factor = 0.0;
        }
        "linear" => ext_factor = 0.0,
        "yarn" => {
            ext_factor = 1.0;
            // llama.cpp's own sources are built for baseline x86-64 (no FMA contraction,
            // unlike the -march=native ggml CPU backend): plain multiply then add here.
            let get_mscale = |scale: f32, mscale: f32| {
                if scale <= 1.0 {
                    1.0
                } else {
                    0.1 * mscale * scale.ln() + 1.0
                }
            };
            let factor = 1.0 / freq_scale;
            let log_mul = c.rope_yarn_log_mul;
            if log_mul != 0.0 {
                let mscale = if c.rope_yarn_mscale_is_log_mul && log_mul != 1.0 {
                    log_mul
                } else {
                    1.0
                };
                attn_factor = get_mscale(factor, mscale) / get_mscale(factor, log_mul);
            } else {
                attn_factor = get_mscale(factor, 1.0);
            }
            attn_factor *= 1.0 / (1.0 + 0.1 * factor.ln());
        }
        other => {
            return Err(Error::Model(format!(
                "metadata '{arch_name}.rope.scaling.type' = '{other}': supported are none, linear, yarn"
            )))
        }
    }
    attn_factor *= rope_attn_factor;
    Ok(Rope {
        kind: c.rope.kind,
        n_dims: c.n_rot,
        freq_base,
        freq_scale,
        ext_factor,
        attn_factor,
        beta_fast: 32.0,
        beta_slow: 1.0,
        n_ctx_orig,
    })
}
