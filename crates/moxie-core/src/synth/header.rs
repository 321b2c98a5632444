//! Header-only GGUFs of real big MoE models (`moxie gen --header-only`): the metadata and the
//! tensor index that llama.cpp's converter followed by `llama-quantize` (no imatrix) would
//! write for the model, with no tensor data. The file ends where the data section would
//! start, the tensor offsets are those of the full file, and `moxie.header_only = true` says
//! so. It is for planning tests (which weights go where) on models far too big to download.
//!
//! How a file is put together:
//! * Blocks: the runnable synthetic layout of the same architecture ([`SynthSpec`], the
//!   tensor list `moxie gen` writes, `plan.rs`) with the real model's shapes; the MTP blocks
//!   llama.cpp keeps after the main ones are ordinary MoE blocks in that list.
//! * What only real checkpoints carry is added here: the MTP blocks' `nextn.*` tensors, the
//!   DeepSeek sparse attention indexer of GLM-5 (`indexer.*`), expert groups, YaRN betas.
//! * Order: llama-quantize's (its loader's `weight_name_comparer`): tensors outside blocks
//!   first, then block by block, names in byte order within each.
//! * Types: llama-quantize's per-tensor rules ([`crate::quant_rules`], the port `moxie
//!   quantize` uses) for the preset's type, any llama-quantize file type (Q4_K_M by default:
//!   Q6_K `output`, Q4_K `token_embd`, Q6_K `ffn_down*` and `attn_v` in the `use_more_bits`
//!   layers of `n_layer_all` blocks, Q4_K elsewhere with its fallback for rows that are not a
//!   whole number of 256-blocks, e.g. MLA's `attn_k_b` -> Q5_0; F32 for 1-D tensors, norms and
//!   the router), chosen in that order, without an importance matrix (as `llama-quantize
//!   --dry-run` chooses them; a real IQ1/IQ2/IQ3 file needs one, which changes only the
//!   IQ3_XXS, IQ4_NL/IQ4_XS and Q4_0/Q5_0 mixes' choices for a few tensor kinds).
//! * Tokenizer: 4-entry placeholder arrays (the vocabulary size is `<arch>.vocab_size` and the
//!   `token_embd` / `output` shapes) with the model's real special-token ids.
//!
//! The `deepseek-v3-671b` and `glm-4.7-355b` presets reproduce the fixture files
//! `shared/fixtures/headers/*.header.gguf` tensor for tensor (`tests/header_only.rs`).
//!
//! # GLM-5.1 (`glm-5.1-744b`)
//! Architecture `glm-dsa` (llama.cpp's `LLM_ARCH_GLM_DSA`, HF `GlmMoeDsaForCausalLM`),
//! which moxie cannot run. Sources:
//! * llama.cpp `conversion/glm.py` (`GlmMoeDsaModel`, a `DeepseekV2Model`): deepseek2's
//!   metadata under `glm-dsa.*`, `block_count = num_hidden_layers + num_nextn_predict_layers`,
//!   `nextn_predict_layers`, `attention.indexer.{head_count,key_length,top_k}`; the GLM
//!   tokenizer (`tokenizer.ggml.pre = glm4`).
//! * llama.cpp `src/models/glm-dsa.cpp` (`load_arch_tensors`) and `src/llama-arch.cpp`: the
//!   deepseek2 MLA block (`attn_q_a`, `attn_q_b`, `attn_kv_a_mqa`, `attn_k_b`, `attn_v_b`,
//!   ...), shared expert, `exp_probs_b`, per block `indexer.k_norm.{weight,bias}` {128},
//!   `indexer.proj` {6144, 32}, `indexer.attn_k` {6144, 128}, `indexer.attn_q_b`
//!   {2048, 32·128}, and in the MTP block `nextn.eh_proj` {12288, 6144},
//!   `nextn.{enorm,hnorm,shared_head_norm}`. As in the GLM-4.7 file, no
//!   `nextn.embed_tokens` / `nextn.shared_head_head` (optional in the loader).
//! * HF transformers `configuration_glm_moe_dsa.py`, whose defaults are zai-org/GLM-5's
//!   `config.json`; GLM-5.1 has the same shapes (NVIDIA NeMo model docs: "same architecture
//!   and mapping shape as GLM-5"): hidden 6144, 78 layers + 1 MTP, first 3 dense
//!   (`intermediate_size` 12288), 64 heads, q_lora 2048, kv_lora 512, qk nope 192 / rope 64,
//!   v 256, 256 experts x 2048 top-8 + 1 shared, sigmoid routing with bias, 1 group, scale 2.5,
//!   normalised top-k, vocab 154880, context 202752, rms eps 1e-5, indexer 32 heads x 128,
//!   top-k 2048, no rope scaling. `rope_theta` 1e6 from a published spec sheet of GLM-5.1
//!   (apxml.com); not a shape, so planning does not depend on it.
//! * Special-token ids (placeholders only): GLM-4.x's layout moved to 154820
//!   (`<|endoftext|>` 154820, `[gMASK]` 154822, `<|user|>` 154827; `eos_token_id` in the
//!   config is [154820, 154827, 154829]).
//!
//! Check against published GGUFs: 753.86 B parameters in 79 blocks (743.9 B without the MTP
//! block, Z.ai's "744B"); the blocks alone hold 751.961 B, the figure llama.cpp prints as
//! "repeating layers = ... 751.961 B parameters" for sokann/GLM-5.1-GGUF-1.673bpw, and
//! ubergarm/GLM-5.1-GGUF's BF16 (1404.406 GiB at 16.003 BPW) is 753.84 B. The Q4_K_M tensor
//! data is 454.8 GB (423.6 GiB, 4.83 bits per weight; 1809 tensors), a little under
//! AesSedai/GLM-5.1-GGUF's "Q4_K_M" (432.80 GiB, 4.93 BPW), whose default type is Q8_0 rather
//! than Q4_K (its expert tensors are Q4_K/Q4_K/Q5_K).

use std::path::Path;
use std::time::Instant;

use moxie_gguf::{Array, GgufWriter, Value};

use super::plan::{self, arch_keys, choose_types, tensor_list};
use super::SynthArch;
use super::{count_types, Ftype, SynthReport, SynthShape, SynthSpec, SynthType, Yarn};
use crate::config::Gating;
use crate::inventory::layer_of;
use crate::{Error, Result};

/// DeepSeek sparse attention's lightning indexer (GLM-5's `index_*` settings).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Indexer {
    pub n_head: usize,
    pub head_dim: usize,
    /// Keys each query attends to.
    pub top_k: usize,
}

/// Special-token ids written as `tokenizer.ggml.*_token_id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos: u32,
    pub eos: u32,
    pub eot: Option<u32>,
    pub padding: u32,
}

/// A real model's header-only file: what to write.
#[derive(Clone, Debug, PartialEq)]
pub struct HeaderSpec {
    /// `general.architecture` as llama.cpp names it (may be one moxie cannot run).
    pub arch_name: &'static str,
    /// `general.name`.
    pub model_name: &'static str,
    /// The block layout and hyper-parameters: `base.arch` is the runnable architecture whose
    /// tensor list the blocks follow, `base.shape.n_layer` counts the MTP blocks too, and
    /// `base.ty` is the quantization.
    pub base: SynthSpec,
    /// Trailing MTP blocks (`nextn_predict_layers`), part of `base.shape.n_layer`.
    pub n_nextn: usize,
    /// The converter writes `expert_group_count` / `_used_count` even without groups (1 / 1;
    /// with groups, `base.shape` has them and they are always written).
    pub group_keys: bool,
    /// YaRN `beta_fast` / `beta_slow`, written with `base.shape.yarn`.
    pub yarn_betas: Option<(f32, f32)>,
    pub indexer: Option<Indexer>,
    /// `tokenizer.ggml.pre`.
    pub tokenizer_pre: &'static str,
    pub tokens: SpecialTokens,
    /// Where the numbers come from (`moxie.header_only.sources`).
    pub sources: &'static str,
    /// What is assumed rather than known (`moxie.header_only.uncertain`).
    pub uncertain: Option<&'static str>,
}

const PRESETS: &[(&str, &str)] = &[
    (
        "deepseek-v3-671b",
        "DeepSeek-V3 (deepseek2, 671.0 B params): hidden 7168, 61 blocks (3 dense n_ff 18432 + 58 MoE), MLA 128 heads (q_lora 1536, kv_lora 512, nope 128, rope 64, v 128), 256 experts x 2048 top-8 in 8 groups (4 used) + 1 shared, YaRN x40, vocab 129280; Q4_K_M 404.5 GB",
    ),
    (
        "glm-4.7-355b",
        "GLM-4.7 (glm4moe, 356.8 B params): hidden 5120, 92 blocks (3 dense n_ff 12288) + 1 MTP, GQA 96/8 x 128 (rope 64), qkv bias, q/k norm, 160 experts x 1536 top-8 + 1 shared, vocab 151552; Q4_K_M 215.3 GB",
    ),
    (
        "glm-5.1-744b",
        "GLM-5.1 (glm-dsa, 753.9 B params): hidden 6144, 78 blocks (3 dense n_ff 12288) + 1 MTP, MLA 64 heads (q_lora 2048, kv_lora 512, nope 192, rope 64, v 256) + DSA indexer 32 x 128 top-2048, 256 experts x 2048 top-8 + 1 shared, vocab 154880; Q4_K_M 454.8 GB",
    ),
];

/// The header-only presets: `(name, description)`.
pub fn header_presets() -> &'static [(&'static str, &'static str)] {
    PRESETS
}

fn preset_names() -> String {
    PRESETS
        .iter()
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Target output-logit and router-logit spreads: used only to draw random weights, which a
/// header has none of, but [`SynthSpec::validate`] wants them set.
const LOGIT_STD: f32 = 4.0;
const ROUTER_STD: f32 = 1.5;

fn deepseek_v3() -> HeaderSpec {
    HeaderSpec {
        arch_name: "deepseek2",
        model_name: "DeepSeek-V3",
        base: SynthSpec {
            arch: SynthArch::Deepseek2,
            shape: SynthShape {
                n_vocab: 129280,
                n_embd: 7168,
                n_layer: 61,
                n_dense_lead: 3,
                n_ff: 18432,
                n_head: 128,
                n_head_kv: 1,
                head_dim: 0,
                n_rot: None,
                q_lora_rank: 1536,
                kv_lora_rank: 512,
                qk_nope_dim: 128,
                qk_rope_dim: 64,
                v_head_dim: 128,
                n_expert: 256,
                n_expert_used: 8,
                n_ff_exp: 2048,
                n_expert_shared: 1,
                n_expert_groups: 8,
                n_group_used: 4,
                gating: Gating::Sigmoid,
                expert_weights_norm: true,
                expert_weights_scale: 2.5,
                n_ctx_train: 163840,
                rope_theta: 10000.0,
                rms_eps: 1e-6,
                yarn: Some(Yarn {
                    factor: 40.0,
                    orig_ctx: 4096,
                    log_multiplier: 0.1,
                }),
                logit_std: LOGIT_STD,
                router_std: ROUTER_STD,
                routing: super::RoutingShape::default(),
            },
            ty: SynthType::Ftype(Ftype::Q4_K_M),
            seed: 0,
            name: "deepseek-v3-671b".into(),
        },
        // llama.cpp's DeepseekV2Model converter drops the MTP layer (61).
        n_nextn: 0,
        group_keys: true,
        yarn_betas: Some((32.0, 1.0)),
        indexer: None,
        tokenizer_pre: "deepseek-v3",
        tokens: SpecialTokens {
            bos: 0,
            eos: 1,
            eot: None,
            padding: 1,
        },
        sources: "deepseek-ai/DeepSeek-V3 config.json; llama.cpp DeepseekV2Model converter (MTP layer 61 skipped), llama-quantize Q4_K_M rules",
        uncertain: None,
    }
}

fn glm_4_7() -> HeaderSpec {
    HeaderSpec {
        arch_name: "glm4moe",
        model_name: "GLM-4.7",
        base: SynthSpec {
            arch: SynthArch::Glm4Moe,
            shape: SynthShape {
                n_vocab: 151552,
                n_embd: 5120,
                n_layer: 93,
                n_dense_lead: 3,
                n_ff: 12288,
                n_head: 96,
                n_head_kv: 8,
                head_dim: 128,
                n_rot: Some(64),
                q_lora_rank: 0,
                kv_lora_rank: 0,
                qk_nope_dim: 0,
                qk_rope_dim: 0,
                v_head_dim: 0,
                n_expert: 160,
                n_expert_used: 8,
                n_ff_exp: 1536,
                n_expert_shared: 1,
                n_expert_groups: 1,
                n_group_used: 1,
                gating: Gating::Sigmoid,
                expert_weights_norm: true,
                expert_weights_scale: 2.5,
                n_ctx_train: 202752,
                rope_theta: 1_000_000.0,
                rms_eps: 1e-5,
                yarn: None,
                logit_std: LOGIT_STD,
                router_std: ROUTER_STD,
                routing: super::RoutingShape::default(),
            },
            ty: SynthType::Ftype(Ftype::Q4_K_M),
            seed: 0,
            name: "glm-4.7-355b".into(),
        },
        n_nextn: 1,
        group_keys: true,
        yarn_betas: None,
        indexer: None,
        tokenizer_pre: "glm4",
        tokens: SpecialTokens {
            bos: 151331,
            eos: 151329,
            eot: Some(151336),
            padding: 151329,
        },
        sources: "zai-org/GLM-4.5/4.7 config.json (same architecture); llama.cpp Glm4MoeModel converter, llama-quantize Q4_K_M rules",
        uncertain: Some(
            "MTP block carries nextn.eh_proj/enorm/hnorm/shared_head_norm but not nextn.embed_tokens/shared_head_head (as GLM-4.6 GGUFs); context_length 202752 (GLM-4.6/4.7)",
        ),
    }
}

fn glm_5_1() -> HeaderSpec {
    HeaderSpec {
        arch_name: "glm-dsa",
        model_name: "GLM-5.1",
        base: SynthSpec {
            // glm-dsa's blocks are deepseek2's plus the indexer.
            arch: SynthArch::Deepseek2,
            shape: SynthShape {
                n_vocab: 154880,
                n_embd: 6144,
                n_layer: 79,
                n_dense_lead: 3,
                n_ff: 12288,
                n_head: 64,
                n_head_kv: 1,
                head_dim: 0,
                n_rot: None,
                q_lora_rank: 2048,
                kv_lora_rank: 512,
                qk_nope_dim: 192,
                qk_rope_dim: 64,
                v_head_dim: 256,
                n_expert: 256,
                n_expert_used: 8,
                n_ff_exp: 2048,
                n_expert_shared: 1,
                n_expert_groups: 1,
                n_group_used: 1,
                gating: Gating::Sigmoid,
                expert_weights_norm: true,
                expert_weights_scale: 2.5,
                n_ctx_train: 202752,
                rope_theta: 1_000_000.0,
                rms_eps: 1e-5,
                yarn: None,
                logit_std: LOGIT_STD,
                router_std: ROUTER_STD,
                routing: super::RoutingShape::default(),
            },
            ty: SynthType::Ftype(Ftype::Q4_K_M),
            seed: 0,
            name: "glm-5.1-744b".into(),
        },
        n_nextn: 1,
        group_keys: true,
        yarn_betas: None,
        indexer: Some(Indexer {
            n_head: 32,
            head_dim: 128,
            top_k: 2048,
        }),
        tokenizer_pre: "glm4",
        tokens: SpecialTokens {
            bos: 154822,
            eos: 154820,
            eot: Some(154827),
            padding: 154820,
        },
        sources: "zai-org/GLM-5 config.json as HF transformers' GlmMoeDsaConfig defaults (GLM-5.1: same shapes); llama.cpp GlmMoeDsaModel converter and glm-dsa loader, llama-quantize Q4_K_M rules",
        uncertain: Some(
            "MTP block carries nextn.eh_proj/enorm/hnorm/shared_head_norm but not nextn.embed_tokens/shared_head_head (as the GLM-4.7 file); indexer tensors in every block including the MTP block; rope.freq_base 1e6 and special-token ids not from the config itself",
        ),
    }
}

impl HeaderSpec {
    /// The header-only preset `name` (see [`header_presets`]).
    pub fn preset(name: &str) -> Result<HeaderSpec> {
        match name {
            "deepseek-v3-671b" => Ok(deepseek_v3()),
            "glm-4.7-355b" => Ok(glm_4_7()),
            "glm-5.1-744b" => Ok(glm_5_1()),
            _ => {
                let hint = if super::presets().iter().any(|(n, _)| *n == name) {
                    format!(" ('{name}' is a synthetic-model preset: generate it without --header-only)")
                } else {
                    String::new()
                };
                Err(Error::Model(format!(
                    "synth: unknown header-only preset '{name}'; header-only presets: {}{hint}",
                    preset_names()
                )))
            }
        }
    }

    /// Tensor names and shapes in llama-quantize's order (block types not yet chosen).
    fn tensor_shapes(&self) -> Result<Vec<(String, Vec<u64>)>> {
        plan::validate(&self.base)?;
        let s = &self.base.shape;
        if self.n_nextn > s.n_layer {
            return Err(Error::Model(format!(
                "synth: {} MTP blocks in a model of {} blocks",
                self.n_nextn, s.n_layer
            )));
        }
        let mut list: Vec<(String, Vec<u64>)> = tensor_list(&self.base)
            .into_iter()
            .map(|(name, dims, _)| (name, dims))
            .collect();
        let e = s.n_embd as u64;
        let mut add = |il: usize, name: &str, dims: &[u64]| {
            list.push((format!("blk.{il}.{name}"), dims.to_vec()));
        };
        // The MTP block's input projection ([normed embedding | normed hidden state] -> hidden)
        // and norms; the rest of it is an ordinary MoE block.
        for il in s.n_layer - self.n_nextn..s.n_layer {
            add(il, "nextn.eh_proj.weight", &[2 * e, e]);
            add(il, "nextn.enorm.weight", &[e]);
            add(il, "nextn.hnorm.weight", &[e]);
            add(il, "nextn.shared_head_norm.weight", &[e]);
        }
        if let Some(ix) = self.indexer {
            let (h, d) = (ix.n_head as u64, ix.head_dim as u64);
            for il in 0..s.n_layer {
                add(il, "indexer.k_norm.weight", &[d]);
                add(il, "indexer.k_norm.bias", &[d]);
                add(il, "indexer.proj.weight", &[e, h]);
                add(il, "indexer.attn_k.weight", &[e, d]);
                add(
                    il,
                    "indexer.attn_q_b.weight",
                    &[s.q_lora_rank as u64, h * d],
                );
            }
        }
        if let Some((name, dims)) = list.iter().find(|(_, d)| d.contains(&0)) {
            return Err(Error::Model(format!(
                "synth: tensor '{name}' would have a zero dimension: {dims:?} (the indexer needs q_lora_rank > 0)"
            )));
        }
        // llama.cpp's loader keeps weights in a map ordered by block (-1 for tensors outside
        // blocks), then name; llama-quantize writes them in that order.
        list.sort_by(|(a, _), (b, _)| {
            let block = |n: &str| layer_of(n).map_or(-1, |l| l as i64);
            block(a).cmp(&block(b)).then_with(|| a.cmp(b))
        });
        Ok(list)
    }

    /// The metadata in file order.
    pub fn metadata(&self) -> Vec<(String, Value)> {
        let a = self.arch_name;
        let mut m: Vec<(String, Value)> = vec![
            ("general.architecture".into(), a.into()),
            ("general.type".into(), "model".into()),
            ("general.name".into(), self.model_name.into()),
            (
                "general.file_type".into(),
                Value::U32(self.base.ty.file_type()),
            ),
            ("general.quantization_version".into(), Value::U32(2)),
            ("moxie.header_only".into(), Value::Bool(true)),
            (
                "moxie.header_only.note".into(),
                format!(
                    "written by moxie gen --header-only: metadata and tensor index of a llama.cpp {} conversion of {}, without tensor data (the file ends where the data section starts; offsets are the full file's); tokenizer arrays are 4-entry placeholders (vocabulary size: {a}.vocab_size)",
                    self.base.ty,
                    self.model_name
                )
                .into(),
            ),
            ("moxie.header_only.sources".into(), self.sources.into()),
        ];
        if let Some(u) = self.uncertain {
            m.push(("moxie.header_only.uncertain".into(), u.into()));
        }

        // The runnable architecture's keys under this file's architecture name, with what
        // only the real model's converter writes slotted in where it writes them.
        let base_prefix = format!("{}.", self.base.arch.name());
        let key = |k: &str| format!("{a}.{k}");
        let u = |x: usize| Value::U32(x as u32);
        for (k, v) in arch_keys(&self.base) {
            let k = format!("{a}.{}", k.strip_prefix(&base_prefix).unwrap_or(&k));
            let after = k.strip_prefix(&format!("{a}.")).unwrap_or("").to_owned();
            m.push((k, v));
            match after.as_str() {
                "block_count" if self.n_nextn > 0 => {
                    m.push((key("nextn_predict_layers"), u(self.n_nextn)));
                }
                "expert_used_count" => {
                    let sh = &self.base.shape;
                    if self.group_keys && sh.n_expert_groups <= 1 {
                        m.push((key("expert_group_count"), u(sh.n_expert_groups)));
                        m.push((key("expert_group_used_count"), u(sh.n_group_used)));
                    }
                }
                "rope.scaling.original_context_length" => {
                    if let Some((fast, slow)) = self.yarn_betas {
                        m.push((key("rope.scaling.yarn_beta_fast"), Value::F32(fast)));
                        m.push((key("rope.scaling.yarn_beta_slow"), Value::F32(slow)));
                    }
                }
                _ => {}
            }
        }
        if let Some(ix) = self.indexer {
            m.push((key("attention.indexer.head_count"), u(ix.n_head)));
            m.push((key("attention.indexer.key_length"), u(ix.head_dim)));
            m.push((key("attention.indexer.top_k"), u(ix.top_k)));
        }

        let t = self.tokens;
        m.extend([
            ("tokenizer.ggml.model".into(), "gpt2".into()),
            ("tokenizer.ggml.pre".into(), self.tokenizer_pre.into()),
            (
                "tokenizer.ggml.tokens".into(),
                Value::Array(Array::from_strs([
                    "<moxie-header-only-placeholder>",
                    "a",
                    "b",
                    "ab",
                ])),
            ),
            (
                "tokenizer.ggml.token_type".into(),
                // CONTROL, then NORMAL
                Value::Array(Array::from(vec![3i32, 1, 1, 1])),
            ),
            (
                "tokenizer.ggml.merges".into(),
                Value::Array(Array::from_strs(["a b"])),
            ),
            ("tokenizer.ggml.bos_token_id".into(), Value::U32(t.bos)),
            ("tokenizer.ggml.eos_token_id".into(), Value::U32(t.eos)),
        ]);
        if let Some(eot) = t.eot {
            m.push(("tokenizer.ggml.eot_token_id".into(), Value::U32(eot)));
        }
        m.push((
            "tokenizer.ggml.padding_token_id".into(),
            Value::U32(t.padding),
        ));
        m
    }

    /// A writer holding the metadata and the tensor index with llama-quantize's block types
    /// and the full file's offsets ([`GgufWriter::tensor_infos`] lists them).
    pub fn writer(&self) -> Result<GgufWriter> {
        let tensors = self.tensor_shapes()?;
        let meta = self.metadata();
        let shapes: Vec<(&str, &[u64])> = tensors
            .iter()
            .map(|(n, d)| (n.as_str(), d.as_slice()))
            .collect();
        let types = choose_types(self.base.ty, self.arch_name, &meta, &shapes)?;
        let mut w = GgufWriter::new();
        for (k, v) in meta {
            w.add(&k, v)?;
        }
        for ((name, dims), ty) in tensors.iter().zip(types) {
            w.add_tensor_info(name, dims, ty)?;
        }
        Ok(w)
    }

    /// Writes the header-only file to `path`.
    pub fn write(&self, path: &Path) -> Result<SynthReport> {
        let start = Instant::now();
        let w = self.writer()?;
        let bytes = w.write_header_only(path)?;
        let infos = w.tensor_infos();
        Ok(SynthReport {
            path: path.to_owned(),
            bytes,
            tensor_bytes: infos.iter().map(|t| t.n_bytes).sum(),
            n_params: infos.iter().map(|t| t.n_elements()).sum(),
            n_tensors: infos.len(),
            file_type: self.base.ty.file_type(),
            tensor_types: count_types(infos.iter().map(|t| t.ty)),
            seconds: start.elapsed().as_secs_f64(),
        })
    }
}

/// Writes the header-only file of preset `preset` (see [`header_presets`]) to `path`.
pub fn write_header_only(preset: &str, path: &Path) -> Result<SynthReport> {
    HeaderSpec::preset(preset)?.write(path)
}
