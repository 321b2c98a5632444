//! Which block type llama-quantize gives each tensor of a model, for every llama.cpp file
//! type (`llama_ftype`: Q4_K_M, Q2_K, IQ2_M, IQ1_M, ...): a port of llama.cpp's
//! src/llama-quant.cpp at the commit of moxie's quantize goldens. The one place moxie answers
//! that question: `moxie quantize` quantizes with it (byte-identical to llama-quantize) and
//! `moxie gen` (random-weight models and `--header-only` headers of real big models) lays
//! files out with it.
//!
//! * [`ftype`]: the file types, their command-line names and default block types.
//! * [`rules`]: `llama_tensor_get_type` and what it calls, tensor by tensor in
//!   llama-quantize's order ([`rules::tensor_order`]; some rules count tensors as they go).
//! * [`ModelInfo::from_lookup`]: the hyper-parameters the rules read, from GGUF metadata.
//! * [`tensor_types`]: the types of a whole tensor list in one call.

pub mod ftype;
pub mod rules;

use moxie_gguf::{Metadata, Value};
use moxie_quant::GgmlType;

pub use ftype::Ftype;
pub use rules::{Fallback, ModelInfo, Params, Planner};

use crate::{Error, Result};

impl ModelInfo {
    /// The hyper-parameters the rules read (llama.cpp's `load_hparams` for them) from a
    /// file's metadata.
    pub fn from_metadata(md: &Metadata) -> Result<ModelInfo> {
        ModelInfo::from_lookup(md.source(), |k| md.get(k))
    }

    /// [`from_metadata`](ModelInfo::from_metadata) over any key lookup (`source` names the
    /// metadata in errors): `general.architecture`, `{arch}.block_count`,
    /// `{arch}.expert_count` and the first entries of `{arch}.attention.head_count` /
    /// `head_count_kv` (scalars or per-layer arrays).
    pub fn from_lookup<'a>(
        source: &str,
        get: impl Fn(&str) -> Option<&'a Value>,
    ) -> Result<ModelInfo> {
        let bad = |msg: String| Error::Model(format!("{source}: {msg}"));
        let arch = get("general.architecture")
            .ok_or_else(|| bad("missing key general.architecture".into()))?
            .as_str()
            .ok_or_else(|| bad("general.architecture is not a string".into()))?
            .to_owned();
        let u32_of = |key: &str, v: &Value| -> Result<u32> {
            v.as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .ok_or_else(|| bad(format!("{key} = {v} is not an unsigned 32-bit integer")))
        };
        let key = format!("{arch}.block_count");
        let n_layer = u32_of(
            &key,
            get(&key).ok_or_else(|| bad(format!("missing key {key}")))?,
        )?;
        if n_layer == 0 {
            return Err(bad(format!("{arch}.block_count is 0")));
        }
        let first = |key: &str| -> Result<Option<u32>> {
            match get(key) {
                None => Ok(None),
                Some(Value::Array(a)) => {
                    let v = a.to_i64_vec().unwrap_or_default();
                    match v.first() {
                        Some(&x) => Ok(Some(
                            u32::try_from(x).map_err(|_| bad(format!("{key}: {x}")))?,
                        )),
                        None => Err(bad(format!("{key} is an empty array"))),
                    }
                }
                Some(v) => u32_of(key, v).map(Some),
            }
        };
        let n_expert = get(&format!("{arch}.expert_count"))
            .and_then(Value::as_u64)
            .and_then(|x| u32::try_from(x).ok())
            .unwrap_or(0);
        let n_head = first(&format!("{arch}.attention.head_count"))?.unwrap_or(0);
        let n_head_kv = first(&format!("{arch}.attention.head_count_kv"))?.unwrap_or(n_head);
        let n_gqa = n_head.checked_div(n_head_kv).unwrap_or(0);
        Ok(ModelInfo {
            is_70b: arch == "llama" && n_expert != 8 && n_layer == 80 && n_head != n_head_kv,
            arch,
            n_layer,
            n_expert,
            n_gqa,
        })
    }
}

impl Params {
    /// `llama-quantize IN OUT FTYPE` with no other flag and no importance matrix.
    pub fn plain(ftype: Ftype) -> Params {
        Params {
            ftype,
            output_tensor_type: None,
            token_embedding_type: None,
            pure: false,
            quantize_output_tensor: true,
            overrides: Vec::new(),
            has_imatrix: false,
        }
    }
}

/// The types llama-quantize gives `tensors` (`(name, dims, stored type)`, in any order): the
/// rules are asked in llama-quantize's order ([`rules::tensor_order`]), the answer is in the
/// order given, with the tensors that needed a fallback type (in llama-quantize's order).
pub fn tensor_types(
    model: &ModelInfo,
    params: &Params,
    tensors: &[(&str, &[u64], GgmlType)],
) -> Result<(Vec<GgmlType>, Vec<Fallback>)> {
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by(|&a, &b| rules::tensor_order(tensors[a].0, tensors[b].0));
    let mut planner = Planner::new(model, params, order.iter().map(|&i| tensors[i].0));
    let mut types = vec![GgmlType::F32; tensors.len()];
    for &i in &order {
        let (name, dims, cur) = tensors[i];
        types[i] = planner.target_type(name, dims, cur)?;
    }
    Ok((types, planner.fallbacks))
}

/// llama-quantize's `--pure` with block type `ty` for one tensor: `cur` for what it does not
/// quantize (1-D tensors, norms, routers, ...), else `ty` or its fallback for rows that are
/// not whole blocks of it.
pub fn pure_type(
    arch: &str,
    name: &str,
    dims: &[u64],
    cur: GgmlType,
    ty: GgmlType,
) -> Result<GgmlType> {
    let p = Params {
        pure: true,
        ..Params::plain(Ftype::F32)
    };
    if !rules::allows_quantization(&p, arch, name, dims) {
        return Ok(cur);
    }
    if !rules::is_quantized(ty) {
        return Ok(ty);
    }
    rules::type_fallback(name, dims[0], ty)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(pairs: &[(&str, Value)]) -> Result<ModelInfo> {
        ModelInfo::from_lookup("test", |k| {
            pairs.iter().find(|(key, _)| *key == k).map(|(_, v)| v)
        })
    }

    #[test]
    fn model_info_from_metadata() {
        let m = lookup(&[
            ("general.architecture", "deepseek2".into()),
            ("deepseek2.block_count", Value::U32(61)),
            ("deepseek2.expert_count", Value::U32(256)),
            ("deepseek2.attention.head_count", Value::U32(128)),
            ("deepseek2.attention.head_count_kv", Value::U32(1)),
        ])
        .unwrap();
        assert_eq!(
            (m.arch.as_str(), m.n_layer, m.n_expert, m.n_gqa, m.is_70b),
            ("deepseek2", 61, 256, 128, false)
        );
        let e = lookup(&[("general.architecture", "x".into())]).unwrap_err();
        assert!(e.to_string().contains("missing key x.block_count"), "{e}");
        let e = lookup(&[
            ("general.architecture", "x".into()),
            ("x.block_count", Value::F32(2.0)),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("x.block_count"), "{e}");
    }

    #[test]
    fn types_in_any_order_and_pure() {
        let m = ModelInfo {
            arch: "test".into(),
            n_layer: 8,
            n_expert: 0,
            n_gqa: 1,
            is_70b: false,
        };
        let p = Params::plain(Ftype::Q4_K_M);
        // The attn_v counter runs in llama-quantize's order (blk.10 after blk.9).
        let names: Vec<String> = (0..8)
            .rev()
            .map(|i| format!("blk.{i}.attn_v.weight"))
            .collect();
        let dims = [256u64, 256];
        let t: Vec<(&str, &[u64], GgmlType)> = names
            .iter()
            .map(|n| (n.as_str(), &dims[..], GgmlType::F32))
            .collect();
        let (types, fb) = tensor_types(&m, &p, &t).unwrap();
        assert!(fb.is_empty());
        let more = [true, false, false, true, false, false, true, true];
        for (i, ty) in types.iter().rev().enumerate() {
            let want = if more[i] {
                GgmlType::Q6_K
            } else {
                GgmlType::Q4_K
            };
            assert_eq!(*ty, want, "layer {i}");
        }
        let pure = |n: &str, d: &[u64], ty| pure_type("test", n, d, GgmlType::F32, ty).unwrap();
        assert_eq!(
            pure("blk.0.attn_k_b.weight", &[128, 512, 4], GgmlType::IQ2_S),
            GgmlType::IQ4_NL
        );
        assert_eq!(
            pure("blk.0.attn_norm.weight", &[256], GgmlType::Q8_0),
            GgmlType::F32
        );
        assert_eq!(
            pure("blk.0.ffn_gate_inp.weight", &[256, 8], GgmlType::Q8_0),
            GgmlType::F32
        );
        assert_eq!(
            pure("output.weight", &[256, 8], GgmlType::IQ2_S),
            GgmlType::IQ2_S
        );
        assert_eq!(
            pure("output.weight", &[48, 8], GgmlType::F16),
            GgmlType::F16
        );
    }
}
