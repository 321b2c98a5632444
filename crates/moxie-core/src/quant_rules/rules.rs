//! Which block type llama-quantize gives each tensor: a port of llama-quant.cpp's
//! `tensor_allows_quantization`, `tensor_get_category`, `llama_tensor_get_type` (the
//! `--token-embedding-type` / `--output-tensor-type` / `--tensor-type` precedence),
//! `llama_tensor_get_type_impl` (the per-ftype mixes), `tensor_type_fallback` and
//! `tensor_requires_imatrix`, at the llama.cpp commit of moxie's goldens.
//!
//! The rules read tensor names, shapes and a few hyper-parameters (layer and expert counts,
//! heads per KV head), and keep llama-quantize's counters: some rules depend on how many
//! `attn_v`-like tensors were seen before, so tensors must be asked for in llama-quantize's
//! order (see [`tensor_order`]).

use fancy_regex::Regex;
use moxie_quant::GgmlType;

use super::ftype::Ftype;
use crate::{Error, Result};

fn err(msg: String) -> Error {
    Error::Model(msg)
}

/// The hyper-parameters the rules use (`llama_hparams` / `llama_model` fields).
#[derive(Clone, Debug, Default)]
pub struct ModelInfo {
    /// `general.architecture`.
    pub arch: String,
    /// `{arch}.block_count` (`n_layer_all`, MTP layers included).
    pub n_layer: u32,
    /// `{arch}.expert_count` (0 for dense models).
    pub n_expert: u32,
    /// `n_head(0) / n_head_kv(0)`, 0 when there is no KV head count.
    pub n_gqa: u32,
    /// llama.cpp's `LLM_TYPE_70B` (Llama-2/3 70B: 80 layers, grouped-query attention).
    pub is_70b: bool,
}

/// The user's choices (`llama_model_quantize_params`).
#[derive(Debug)]
pub struct Params {
    pub ftype: Ftype,
    pub output_tensor_type: Option<GgmlType>,
    pub token_embedding_type: Option<GgmlType>,
    /// `--pure`: no mix, every quantized tensor gets the default type (or its fallback).
    pub pure: bool,
    /// Not `--leave-output-tensor`.
    pub quantize_output_tensor: bool,
    /// `--tensor-type` patterns in command-line order (the first that matches wins).
    pub overrides: Vec<(Regex, GgmlType)>,
    pub has_imatrix: bool,
}

/// Broad tensor roles (`tensor_category`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Category {
    TokenEmbd,
    AttnQ,
    AttnV,
    AttnK,
    AttnQkv,
    AttnKvB,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Output,
    Other,
}

fn is_token_embd(name: &str) -> bool {
    name == "token_embd.weight" || name == "per_layer_token_embd.weight"
}

/// `tensor_get_category`: substring tests in llama.cpp's order (so `ffn_up_exps`,
/// `ffn_up_shexp` are `FfnUp`, and `attn_kv_b` wins over `attn_v`).
pub fn category(name: &str) -> Category {
    use Category::*;
    if name == "output.weight" {
        return Output;
    }
    if is_token_embd(name) {
        return TokenEmbd;
    }
    let table: [(&str, Category); 9] = [
        ("attn_qkv.weight", AttnQkv),
        ("attn_kv_b.weight", AttnKvB),
        ("attn_v.weight", AttnV),
        ("attn_k.weight", AttnK),
        ("attn_q.weight", AttnQ),
        ("attn_output.weight", AttnOutput),
        ("ffn_up", FfnUp),
        ("ffn_gate", FfnGate),
        ("ffn_down", FfnDown),
    ];
    table
        .iter()
        .find(|(s, _)| name.contains(s))
        .map_or(Other, |&(_, c)| c)
}

fn is_attn_v(c: Category) -> bool {
    matches!(c, Category::AttnV | Category::AttnQkv | Category::AttnKvB)
}

/// ggml's `ggml_n_dims`: trailing dimensions of 1 do not count (a `[n, 1]` tensor is 1-D).
pub fn n_dims(dims: &[u64]) -> usize {
    dims.iter().rposition(|&d| d > 1).map_or(1, |i| i + 1)
}

/// The order llama-quantize visits tensors in (its `weights_map` comparator): by block number
/// (`blk.N.`; other tensors count as -1, so they come first), then by name.
pub fn tensor_order(a: &str, b: &str) -> std::cmp::Ordering {
    let key = |n| block_number(n).unwrap_or(-1);
    (key(a), a).cmp(&(key(b), b))
}

/// `sscanf(name, "blk.%d.", &n)`: the number after `blk.`, if there is one. Like `%d` it takes
/// an optional sign and the longest run of digits (the trailing `.` is not checked).
pub fn block_number(name: &str) -> Option<i64> {
    let rest = name.strip_prefix("blk.")?;
    let rest = rest.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let (neg, digits) = match rest.as_bytes().first() {
        Some(b'-') => (true, &rest[1..]),
        Some(b'+') => (false, &rest[1..]),
        _ => (false, rest),
    };
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    if end == 0 {
        return None;
    }
    // Clamp absurd lengths (a C int would overflow); such a layer is out of range anyway.
    let v = digits[..end]
        .parse::<i64>()
        .unwrap_or(i64::MAX / 2)
        .min(i64::MAX / 2);
    Some(if neg { -v } else { v })
}

/// Whether `--tensor-type` pattern `re` is found in `name` (`std::regex_search`).
fn found(re: &Regex, name: &str) -> Result<bool> {
    re.is_match(name).map_err(|e| {
        err(format!(
            "--tensor-type pattern '{}' on {name}: {e}",
            re.as_str()
        ))
    })
}

/// `tensor_allows_quantization` (without the copy-only mode).
pub fn allows_quantization(p: &Params, arch: &str, name: &str, dims: &[u64]) -> bool {
    if n_dims(dims) < 2 {
        return false;
    }
    // llama.cpp tests `rfind("weight") == size() - 6`; for a name shorter than 6 bytes both
    // sides are npos, so such names pass too.
    let mut q = match name.rfind("weight") {
        Some(p) => p + 6 == name.len(),
        None => name.len() == 5,
    };
    let has = |s: &str| name.contains(s);
    q &= !has("_norm.weight");
    q &= p.quantize_output_tensor || name != "output.weight";
    for s in [
        // expert routers and DeepSeek-V4's token -> expert table
        "ffn_gate_inp.weight",
        "ffn_gate_tid2eid.weight",
        // small Gemma-3n tensors
        "altup",
        "laurel",
        "per_layer_model_proj",
        // Mamba / Kimi conv1d, MiniMax indexer projections
        "ssm_conv1d",
        "shortconv.conv.weight",
        "indexer.k_proj.weight",
        "indexer.q_proj.weight",
        // RWKV
        "time_mix_first.weight",
        "time_mix_w0.weight",
        "time_mix_w1.weight",
        "time_mix_w2.weight",
        "time_mix_v0.weight",
        "time_mix_v1.weight",
        "time_mix_v2.weight",
        "time_mix_a0.weight",
        "time_mix_a1.weight",
        "time_mix_a2.weight",
        "time_mix_g1.weight",
        "time_mix_g2.weight",
        "time_mix_decay_w1.weight",
        "time_mix_decay_w2.weight",
        "time_mix_lerp_fused.weight",
        // T5 relative position bias, multimodal projector parts, audio code books
        "attn_rel_b.weight",
        ".position_embd",
        "sam.pos_embd",
        "sam.neck.",
        "sam.net_",
        ".rel_pos",
        ".patch_embd",
        ".patch_merger",
        "a.rvq.codebook",
        "mm.a.code_embd",
    ] {
        q &= !has(s);
    }
    q &= name != "position_embd.weight" && name != "token_types.weight";
    if arch == "glm5-next" {
        for s in [
            "hc_",
            "indexer.attn_q_b",
            "indexer.attn_k",
            "indexer.proj",
            "indexer_compressor_gate",
            "indexer_compressor_ape",
            "ssm_f_a.weight",
            "ssm_f_b.weight",
            "ssm_g_a.weight",
            "ssm_g_b.weight",
            "ssm_beta.weight",
            "attn_kv_a_mqa.weight",
            "attn_k_b.weight",
            "attn_v_b.weight",
        ] {
            q &= !has(s);
        }
    }
    q
}

/// `tensor_requires_imatrix`: the very low-bit types (and Q2_K inside a Q2_K_S file) are
/// garbage without an importance matrix.
pub fn requires_imatrix(name: &str, ty: GgmlType, ftype: Ftype) -> bool {
    if is_token_embd(name) || name == "output.weight" {
        return false;
    }
    use GgmlType::*;
    match ty {
        IQ3_XXS | IQ2_XXS | IQ2_XS | IQ2_S | IQ1_M | IQ1_S => true,
        Q2_K => ftype == Ftype::Q2_K_S,
        _ => false,
    }
}

/// Whether a type is a block-quantized one (`ggml_is_quantized`): not F32/F16/BF16/F64 or an
/// integer type.
pub fn is_quantized(ty: GgmlType) -> bool {
    use GgmlType::*;
    !matches!(ty, F32 | F16 | BF16 | F64 | I8 | I16 | I32 | I64)
}

/// `use_more_bits`: the first and last eighth of the layers and every third in between.
fn use_more_bits(i_layer: i64, n_layers: i64) -> bool {
    i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2
}

/// A tensor given the fallback type because its rows do not split into the chosen type's
/// blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fallback {
    pub name: String,
    pub ncols: u64,
    pub wanted: GgmlType,
    pub got: GgmlType,
}

/// `tensor_type_fallback`: `ty` if rows of `ncols` split into its blocks, else a type whose
/// blocks fit them (F16 when even the fallback's do not).
pub fn type_fallback(name: &str, ncols: u64, ty: GgmlType) -> Result<GgmlType> {
    use GgmlType::*;
    let bs = ty.block_size() as u64;
    if ncols.is_multiple_of(bs) {
        return Ok(ty);
    }
    let mut got = match ty {
        IQ1_S | IQ1_M | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ4_XS => IQ4_NL,
        Q2_0 | Q2_K | Q3_K | TQ1_0 | TQ2_0 => Q4_0,
        Q4_K => Q5_0,
        Q5_K => Q5_1,
        Q6_K => Q8_0,
        // A 32-block type has no smaller block to go to: F16 below.
        _ if bs <= 32 => ty,
        _ => {
            return Err(err(format!(
                "tensor {name}: no fallback type is defined for {ty} (rows of {ncols} are not a multiple of its block size {bs})"
            )))
        }
    };
    if !ncols.is_multiple_of(got.block_size() as u64) {
        got = F16;
    }
    Ok(got)
}

/// llama-quantize's `quantize_state_impl`: the parameters and the counters the mixes keep.
pub struct Planner<'a> {
    model: &'a ModelInfo,
    params: &'a Params,
    n_attention_wv: i64,
    i_attention_wv: i64,
    n_ffn_down: i64,
    n_ffn_gate: i64,
    n_ffn_up: i64,
    i_ffn_down: i64,
    i_ffn_gate: i64,
    i_ffn_up: i64,
    has_tied_embeddings: bool,
    /// Tensors that needed `tensor_type_fallback`, in order.
    pub fallbacks: Vec<Fallback>,
}

impl<'a> Planner<'a> {
    /// `init_quantize_state_counters` over the names of all tensors of the output.
    pub fn new<'n>(
        model: &'a ModelInfo,
        params: &'a Params,
        names: impl IntoIterator<Item = &'n str>,
    ) -> Planner<'a> {
        let mut n_attention_wv = 0;
        let mut has_tied_embeddings = true;
        for name in names {
            let c = category(name);
            if is_attn_v(c) {
                n_attention_wv += 1;
            }
            if c == Category::Output {
                has_tied_embeddings = false;
            }
        }
        let n = i64::from(model.n_layer);
        Planner {
            model,
            params,
            n_attention_wv,
            i_attention_wv: 0,
            n_ffn_down: n,
            n_ffn_gate: n,
            n_ffn_up: n,
            i_ffn_down: 0,
            i_ffn_gate: 0,
            i_ffn_up: 0,
            has_tied_embeddings,
            fallbacks: Vec::new(),
        }
    }

    /// `llama_tensor_get_type`: the type of tensor `name` (shape `dims`, stored as `cur`).
    /// Call once per tensor, in [`tensor_order`].
    pub fn target_type(&mut self, name: &str, dims: &[u64], cur: GgmlType) -> Result<GgmlType> {
        let p = self.params;
        if !allows_quantization(p, &self.model.arch, name, dims) {
            return Ok(cur);
        }
        let cat = category(name);
        if let (Some(t), Category::TokenEmbd) = (p.token_embedding_type, cat) {
            // per_layer_token_embd follows --token-embedding-type unless a --tensor-type
            // pattern names it.
            let mut named = false;
            if name == "per_layer_token_embd.weight" {
                for (re, _) in &p.overrides {
                    named |= found(re, name)?;
                }
            }
            if !named {
                return Ok(t);
            }
        }
        if let (Some(t), Category::Output) = (p.output_tensor_type, cat) {
            return Ok(t);
        }
        let default = p.ftype.default_type();
        let mut ty = default;
        if is_quantized(default) {
            let mut manual = false;
            for (re, t) in &p.overrides {
                if found(re, name)? {
                    ty = *t;
                    manual = true;
                    break;
                }
            }
            if !manual && !p.pure {
                ty = self.mix_type(ty, name, dims, cat)?;
            }
            ty = self.fallback(name, dims[0], ty)?;
        }
        Ok(ty)
    }

    /// `tensor_type_fallback`, recording the tensors that needed it.
    fn fallback(&mut self, name: &str, ncols: u64, ty: GgmlType) -> Result<GgmlType> {
        let got = type_fallback(name, ncols, ty)?;
        if got != ty {
            self.fallbacks.push(Fallback {
                name: name.to_owned(),
                ncols,
                wanted: ty,
                got,
            });
        }
        Ok(got)
    }

    /// The layer of an FFN tensor: from its name for MoE models (experts are not stored in
    /// layer order everywhere), else the running count.
    fn layer_info(&self, counter: i64, n_layer: i64, name: &str) -> Result<(i64, i64)> {
        if self.model.n_expert.max(1) > 1 {
            let Some(i) = block_number(name) else {
                return Err(err(format!(
                    "failed to determine the layer of tensor {name}"
                )));
            };
            if i < 0 || i >= n_layer {
                return Err(err(format!(
                    "bad layer {i} for tensor {name}: must be in [0, {n_layer})"
                )));
            }
            return Ok((i, n_layer));
        }
        Ok((counter, n_layer))
    }

    /// `llama_tensor_get_type_impl`: the mix of `ftype` for one tensor.
    fn mix_type(
        &mut self,
        mut new_type: GgmlType,
        name: &str,
        dims: &[u64],
        cat: Category,
    ) -> Result<GgmlType> {
        use Category as C;
        use Ftype as F;
        use GgmlType as T;
        let ftype = self.params.ftype;
        let arch = self.model.arch.as_str();
        let falcon = arch == "falcon";
        let n_expert = self.model.n_expert;
        let n_gqa = self.model.n_gqa;
        let has_imatrix = self.params.has_imatrix;

        // GLM-5-next keeps these at Q8_0 or better.
        if arch == "glm5-next"
            && (name.contains("attn_q_a")
                || name.contains("attn_q_b")
                || name.contains("nextn.eh_proj"))
            && !matches!(new_type, T::F32 | T::BF16 | T::F16)
        {
            return Ok(T::Q8_0);
        }

        let iq_low = matches!(
            ftype,
            F::IQ2_XXS | F::IQ2_XS | F::IQ1_S | F::IQ2_S | F::IQ2_M | F::IQ1_M
        );
        if cat == C::Output || (self.has_tied_embeddings && cat == C::TokenEmbd) {
            // Tied embeddings are quantized like the output tensor.
            if let Some(t) = self.params.output_tensor_type {
                new_type = t;
            } else {
                let nx = dims[0];
                let qk_k = new_type.block_size() as u64;
                if ftype == F::MXFP4_MOE || falcon || !nx.is_multiple_of(qk_k) {
                    new_type = T::Q8_0;
                } else if iq_low || ftype == F::IQ3_XXS {
                    new_type = T::Q5_K;
                } else if new_type != T::Q8_0 {
                    new_type = T::Q6_K;
                }
            }
        } else if ftype == F::MXFP4_MOE {
            // Expert tensors (3-D) to MXFP4, the rest Q8_0; bailingmoe3's 3-D MLA projections
            // are not experts.
            let expert_role = matches!(cat, C::FfnUp | C::FfnGate | C::FfnDown);
            let d2 = dims.get(2).copied().unwrap_or(1);
            new_type = if d2 > 1 && (arch != "bailingmoe3" || expert_role) {
                T::MXFP4
            } else {
                T::Q8_0
            };
        } else if cat == C::TokenEmbd {
            if let Some(t) = self.params.token_embedding_type {
                new_type = t;
            } else if matches!(ftype, F::IQ2_XXS | F::IQ2_XS | F::IQ1_S | F::IQ1_M) {
                new_type = T::Q2_K;
            } else if matches!(ftype, F::IQ2_S | F::IQ2_M | F::IQ3_XXS) {
                new_type = T::IQ3_S;
            } else if matches!(ftype, F::TQ1_0 | F::TQ2_0 | F::Q2_0) {
                new_type = T::Q4_K;
            }
        } else if iq_low {
            let iq2sm = matches!(ftype, F::IQ2_S | F::IQ2_M);
            if is_attn_v(cat) {
                new_type = if n_gqa >= 4 || n_expert >= 4 {
                    T::Q4_K
                } else if iq2sm {
                    T::IQ3_S
                } else {
                    T::Q2_K
                };
                self.i_attention_wv += 1;
            } else if n_expert == 8 && cat == C::AttnK {
                new_type = T::Q4_K;
            } else if cat == C::FfnDown {
                if self.i_ffn_down < self.n_ffn_down / 8 {
                    new_type = if iq2sm { T::IQ3_S } else { T::Q2_K };
                }
                self.i_ffn_down += 1;
            } else if cat == C::AttnOutput {
                if n_expert == 8 {
                    new_type = T::Q5_K;
                } else if matches!(ftype, F::IQ1_S | F::IQ1_M) {
                    new_type = T::IQ2_XXS;
                } else if iq2sm {
                    new_type = T::IQ3_S;
                }
            }
        } else if is_attn_v(cat) {
            let (i, n) = (self.i_attention_wv, self.n_attention_wv);
            match ftype {
                F::Q2_K => new_type = if n_gqa >= 4 { T::Q4_K } else { T::Q3_K },
                F::Q2_K_S if n_gqa >= 4 => new_type = T::Q4_K,
                F::IQ3_XXS => {
                    new_type = if n_gqa >= 4 {
                        T::Q4_K
                    } else if !has_imatrix {
                        T::IQ3_S
                    } else {
                        T::IQ3_XXS
                    }
                }
                F::IQ3_XS | F::IQ3_S if n_gqa >= 4 => new_type = T::Q4_K,
                F::IQ3_M => new_type = T::Q4_K,
                F::Q3_K_M => new_type = if i < 2 { T::Q5_K } else { T::Q4_K },
                F::Q3_K_L => new_type = T::Q5_K,
                F::IQ4_NL | F::IQ4_XS if n_gqa >= 4 => new_type = T::Q5_K,
                F::Q4_K_M | F::Q5_K_M if use_more_bits(i, n) => new_type = T::Q6_K,
                F::Q4_K_S if i < 4 => new_type = T::Q5_K,
                _ => {}
            }
            if self.model.is_70b && matches!(new_type, T::Q3_K | T::Q4_K) {
                // 70B: 8 heads share attn_v, so more bits cost little.
                new_type = T::Q5_K;
            }
            if n_expert == 8 {
                new_type = T::Q8_0;
            }
            self.i_attention_wv += 1;
        } else if cat == C::AttnK {
            if n_expert == 8 {
                new_type = T::Q8_0;
            } else if ftype == F::IQ3_XS {
                new_type = T::IQ3_XXS;
            } else if ftype == F::IQ3_XXS {
                new_type = T::IQ2_S;
            }
        } else if cat == C::AttnQ {
            if ftype == F::IQ3_XS {
                new_type = T::IQ3_XXS;
            } else if ftype == F::IQ3_XXS {
                new_type = T::IQ2_S;
            }
        } else if cat == C::FfnDown {
            let (i_layer, n_layer) = self.layer_info(self.i_ffn_down, self.n_ffn_down, name)?;
            let first8 = i_layer < n_layer / 8;
            let more = use_more_bits(i_layer, n_layer);
            match ftype {
                F::Q2_K => new_type = T::Q3_K,
                F::Q2_K_S if first8 => new_type = T::Q4_K,
                F::IQ3_XXS if !has_imatrix => {
                    new_type = if first8 { T::Q4_K } else { T::Q3_K };
                }
                F::Q3_K_M => {
                    new_type = if i_layer < n_layer / 16 {
                        T::Q5_K
                    } else if !falcon || more {
                        T::Q4_K
                    } else {
                        T::Q3_K
                    };
                }
                F::IQ3_M if first8 || (n_expert == 8 && more) => new_type = T::Q4_K,
                F::Q3_K_L => new_type = if falcon { T::Q4_K } else { T::Q5_K },
                F::Q4_K_M => {
                    if falcon {
                        new_type = if i_layer < n_layer / 16 {
                            T::Q6_K
                        } else if more {
                            T::Q5_K
                        } else {
                            T::Q4_K
                        };
                    } else if more {
                        new_type = T::Q6_K;
                    }
                }
                F::IQ4_NL | F::IQ4_XS if first8 && !has_imatrix => new_type = T::Q5_K,
                F::Q5_K_M if more => new_type = T::Q6_K,
                F::Q4_K_S if !falcon && first8 => new_type = T::Q5_K,
                // With an imatrix only: guard the first ffn_down layers of Q4_0/Q5_0.
                F::Q4_0 if has_imatrix && first8 => new_type = T::Q4_1,
                F::Q5_0 if has_imatrix && first8 => new_type = T::Q5_1,
                _ => {}
            }
            self.i_ffn_down += 1;
        } else if cat == C::AttnOutput {
            if !falcon {
                if n_expert == 8 {
                    if matches!(
                        ftype,
                        F::Q2_K
                            | F::IQ3_XS
                            | F::IQ3_XXS
                            | F::Q3_K_S
                            | F::Q3_K_M
                            | F::IQ4_NL
                            | F::Q4_K_S
                            | F::Q4_K_M
                            | F::IQ3_S
                            | F::IQ3_M
                            | F::IQ4_XS
                    ) {
                        new_type = T::Q5_K;
                    }
                } else {
                    match ftype {
                        F::Q2_K => new_type = T::Q3_K,
                        F::IQ3_XXS => new_type = T::IQ3_S,
                        F::Q3_K_M | F::IQ3_M => new_type = T::Q4_K,
                        F::Q3_K_L => new_type = T::Q5_K,
                        _ => {}
                    }
                }
            } else if ftype == F::Q3_K_L {
                new_type = T::Q4_K;
            }
            // (llama.cpp's separate attn_qkv branch after this one is unreachable: attn_qkv
            // is attn_v-like and taken above.)
        } else if cat == C::FfnGate || cat == C::FfnUp {
            let gate = cat == C::FfnGate;
            let counter = if gate { self.i_ffn_gate } else { self.i_ffn_up };
            let n = if gate { self.n_ffn_gate } else { self.n_ffn_up };
            let (i_layer, n_layer) = self.layer_info(counter, n, name)?;
            if ftype == F::IQ3_XS && i_layer >= n_layer / 8 && i_layer < 7 * n_layer / 8 {
                new_type = T::IQ3_XXS;
            }
            if gate {
                self.i_ffn_gate += 1;
            } else {
                self.i_ffn_up += 1;
            }
        }
        Ok(new_type)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use GgmlType as T;

    /// `llama-quantize IN OUT FTYPE` with `--tensor-type` patterns `overrides`.
    fn params(ftype: Ftype, overrides: &[(&str, T)]) -> Params {
        Params {
            overrides: overrides
                .iter()
                .map(|(p, t)| (Regex::new(p).unwrap(), *t))
                .collect(),
            ..Params::plain(ftype)
        }
    }

    fn model(n_layer: u32, n_expert: u32, n_gqa: u32) -> ModelInfo {
        ModelInfo {
            arch: "test".into(),
            n_layer,
            n_expert,
            n_gqa,
            is_70b: false,
        }
    }

    /// Types of `(name, dims)` in order, F32 inputs.
    fn plan(m: &ModelInfo, p: &Params, tensors: &[(&str, &[u64])]) -> Result<Vec<T>> {
        let mut pl = Planner::new(m, p, tensors.iter().map(|t| t.0));
        tensors
            .iter()
            .map(|(n, d)| pl.target_type(n, d, T::F32))
            .collect()
    }

    #[test]
    fn categories_names_and_order() {
        assert_eq!(category("blk.0.attn_kv_b.weight"), Category::AttnKvB);
        assert_eq!(category("blk.0.ffn_up_shexp.weight"), Category::FfnUp);
        assert_eq!(category("blk.0.ffn_gate_inp.weight"), Category::FfnGate);
        assert_eq!(category("output.weight"), Category::Output);
        assert_eq!(category("per_layer_token_embd.weight"), Category::TokenEmbd);
        assert_eq!(category("blk.0.attn_q_a.weight"), Category::Other);
        assert_eq!(block_number("blk.12.ffn_up.weight"), Some(12));
        assert_eq!(block_number("blk.x.ffn_up.weight"), None);
        assert_eq!(block_number("output.weight"), None);
        let mut v = [
            "blk.10.a",
            "blk.2.b",
            "token_embd.weight",
            "output.weight",
            "blk.2.a",
        ];
        v.sort_by(|a, b| tensor_order(a, b));
        assert_eq!(
            v,
            [
                "output.weight",
                "token_embd.weight",
                "blk.2.a",
                "blk.2.b",
                "blk.10.a"
            ]
        );
        assert_eq!(n_dims(&[256, 1]), 1);
        assert_eq!(n_dims(&[256, 1, 8]), 3);
        assert_eq!(n_dims(&[1]), 1);
    }

    #[test]
    fn what_is_quantized() {
        let p = params(Ftype::Q4_K_M, &[]);
        let q = |n: &str, d: &[u64]| allows_quantization(&p, "test", n, d);
        assert!(q("blk.0.ffn_up.weight", &[256, 512]));
        assert!(!q("blk.0.ffn_up.bias", &[256, 512]));
        assert!(!q("blk.0.attn_norm.weight", &[256, 1]));
        assert!(!q("blk.0.attn_q_norm.weight", &[64, 4]));
        assert!(!q("blk.0.ffn_gate_inp.weight", &[256, 8]));
        assert!(!q("blk.0.ssm_conv1d.weight", &[4, 256]));
        assert!(!q("blk.0.ffn_up.weight", &[256, 1]));
        let leave = Params {
            quantize_output_tensor: false,
            ..params(Ftype::Q4_K_M, &[])
        };
        assert!(!allows_quantization(
            &leave,
            "test",
            "output.weight",
            &[256, 512]
        ));
        assert!(!allows_quantization(
            &p,
            "glm5-next",
            "blk.0.attn_k_b.weight",
            &[256, 512]
        ));
        assert!(allows_quantization(
            &p,
            "deepseek2",
            "blk.0.attn_k_b.weight",
            &[256, 512]
        ));
    }

    #[test]
    fn q4_k_m_mix_of_a_dense_model() {
        // 8 layers: use_more_bits is true for layers 0, 3, 6, 7.
        let m = model(8, 0, 1);
        let p = params(Ftype::Q4_K_M, &[]);
        let mut t: Vec<(String, Vec<u64>)> = vec![
            ("output.weight".into(), vec![256, 1000]),
            ("token_embd.weight".into(), vec![256, 1000]),
        ];
        for i in 0..8 {
            t.push((format!("blk.{i}.attn_v.weight"), vec![256, 256]));
            t.push((format!("blk.{i}.ffn_down.weight"), vec![512, 256]));
        }
        let tr: Vec<(&str, &[u64])> = t.iter().map(|(n, d)| (n.as_str(), d.as_slice())).collect();
        let got = plan(&m, &p, &tr).unwrap();
        assert_eq!(got[0], T::Q6_K);
        assert_eq!(got[1], T::Q4_K);
        let more = [true, false, false, true, false, false, true, true];
        for i in 0..8 {
            let want = if more[i] { T::Q6_K } else { T::Q4_K };
            assert_eq!((got[2 + 2 * i], got[3 + 2 * i]), (want, want), "layer {i}");
        }
    }

    #[test]
    fn eight_experts_and_moe_layers() {
        let m = model(2, 8, 2);
        let p = params(Ftype::Q4_K_M, &[]);
        let got = plan(
            &m,
            &p,
            &[
                ("blk.0.attn_k.weight", &[256, 128]),
                ("blk.0.attn_v.weight", &[256, 128]),
                ("blk.0.attn_output.weight", &[256, 256]),
                ("blk.1.ffn_down_exps.weight", &[256, 256, 8]),
            ],
        )
        .unwrap();
        assert_eq!(got, [T::Q8_0, T::Q8_0, T::Q5_K, T::Q6_K]);
        // MoE layers come from the names, which must be in range.
        let e = plan(&m, &p, &[("blk.2.ffn_down_exps.weight", &[256, 256, 8])]);
        assert!(e.unwrap_err().to_string().contains("bad layer 2"));
    }

    #[test]
    fn fallbacks_for_short_rows() {
        let m = model(1, 0, 1);
        let p = params(Ftype::Q4_K_M, &[]);
        let mut pl = Planner::new(
            &m,
            &p,
            ["a.weight", "b.weight", "c.weight", "output.weight"],
        );
        assert_eq!(
            pl.target_type("a.weight", &[64, 8], T::F32).unwrap(),
            T::Q5_0
        );
        assert_eq!(
            pl.target_type("b.weight", &[48, 8], T::F32).unwrap(),
            T::F16
        );
        assert_eq!(
            pl.target_type("c.weight", &[256, 8], T::F32).unwrap(),
            T::Q4_K
        );
        // output: Q8_0 when the default type's blocks do not fit, no fallback needed.
        assert_eq!(
            pl.target_type("output.weight", &[64, 8], T::F32).unwrap(),
            T::Q8_0
        );
        assert_eq!(pl.fallbacks.len(), 2);
        assert_eq!(
            (pl.fallbacks[0].wanted, pl.fallbacks[0].got),
            (T::Q4_K, T::Q5_0)
        );
    }

    #[test]
    fn override_precedence() {
        let m = model(2, 8, 2);
        let mut p = params(
            Ftype::Q4_K_M,
            &[
                ("ffn_down", T::Q8_0),
                ("blk\\.1\\.ffn_down", T::Q2_K),
                ("embd|output", T::Q4_0),
            ],
        );
        p.token_embedding_type = Some(T::Q6_K);
        p.output_tensor_type = Some(T::Q5_K);
        let got = plan(
            &m,
            &p,
            &[
                ("output.weight", &[256, 64]),
                ("token_embd.weight", &[256, 64]),
                ("blk.0.attn_v.weight", &[256, 128]),
                ("blk.1.ffn_down_exps.weight", &[64, 256, 8]),
            ],
        )
        .unwrap();
        // The type flags beat the patterns (no fallback for them); the first pattern that
        // matches wins and then falls back (Q8_0 fits 64); attn_v keeps the mix.
        assert_eq!(got, [T::Q5_K, T::Q6_K, T::Q8_0, T::Q8_0]);
        // --pure: no mix, the default type with its fallback.
        let pure = Params {
            pure: true,
            ..params(Ftype::Q4_K_M, &[])
        };
        let got = plan(
            &m,
            &pure,
            &[
                ("blk.0.attn_v.weight", &[256, 128]),
                ("blk.0.ffn_down_exps.weight", &[64, 256, 8]),
            ],
        )
        .unwrap();
        assert_eq!(got, [T::Q4_K, T::Q5_0]);
        // Float file types ignore the patterns.
        let f16 = params(Ftype::F16, &[("ffn", T::Q4_0)]);
        assert_eq!(
            plan(&m, &f16, &[("blk.0.ffn_up_exps.weight", &[256, 256, 8])]).unwrap(),
            [T::F16]
        );
    }

    #[test]
    fn importance_matrix_rules() {
        let m = model(8, 0, 1);
        let mut p = params(Ftype::Q4_0, &[]);
        let t: [(&str, &[u64]); 1] = [("blk.0.ffn_down.weight", &[256, 256])];
        assert_eq!(plan(&m, &p, &t).unwrap(), [T::Q4_0]);
        p.has_imatrix = true;
        assert_eq!(plan(&m, &p, &t).unwrap(), [T::Q4_1]);
        assert!(requires_imatrix(
            "blk.0.ffn_up.weight",
            T::Q2_K,
            Ftype::Q2_K_S
        ));
        assert!(!requires_imatrix(
            "blk.0.ffn_up.weight",
            T::Q2_K,
            Ftype::Q2_K
        ));
        assert!(!requires_imatrix(
            "output.weight",
            T::IQ2_XXS,
            Ftype::IQ2_XXS
        ));
    }
}
