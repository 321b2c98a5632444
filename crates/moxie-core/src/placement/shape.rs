//! The hyper-parameters placement needs, read from GGUF metadata without
//! [`Config::from_metadata`](crate::Config::from_metadata): planning must work for
//! architectures moxie cannot run yet (GLM-5.1's MLA) as long as their keys follow llama.cpp's
//! `<arch>.*` names.

use moxie_gguf::{Metadata, TensorInfo};

use crate::state::{LayerStateSpec, RowSpec};
use crate::{Error, Result};

/// What the planner needs to know about a model besides its tensor index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelShape {
    /// `general.architecture`.
    pub arch: String,
    /// `<arch>.block_count`: every block, MTP/nextn blocks included (llama.cpp's
    /// `n_layer_all`; `-ngl` and the layer split count these).
    pub n_block: usize,
    /// `<arch>.nextn_predict_layers`: trailing MTP blocks llama.cpp does not load.
    pub n_nextn: usize,
    pub n_embd: usize,
    pub n_vocab: usize,
    /// Query heads (the largest per-layer value).
    pub n_head: usize,
    /// Values per query head in the attention product (MLA: the latent + rope width).
    pub head_q: usize,
    /// The widest FFN intermediate one token needs: the dense FFN's, or the selected routed
    /// experts' plus the shared experts'.
    pub ffn_width: usize,
    /// `<arch>.context_length`, if given.
    pub n_ctx_train: Option<usize>,
    /// What each main (non-nextn) block keeps per sequence.
    pub kv: Vec<LayerStateSpec>,
}

impl ModelShape {
    /// Blocks the forward pass runs (`n_block - n_nextn`).
    pub fn n_main(&self) -> usize {
        self.n_block - self.n_nextn
    }

    /// Read the shape from metadata; `tensors` supply the vocabulary size when
    /// `<arch>.vocab_size` is absent. Missing or malformed keys are errors naming the key.
    pub fn from_metadata(meta: &Metadata, tensors: &[TensorInfo]) -> Result<ModelShape> {
        let arch = meta
            .get_str("general.architecture")
            .ok_or_else(|| Error::Placement("missing metadata key 'general.architecture'".into()))?
            .to_owned();
        let keys = Keys { meta, arch: &arch };
        let n_block = keys.required("block_count")?;
        let n_nextn = keys.scalar("nextn_predict_layers")?.unwrap_or(0);
        if n_block == 0 || n_nextn >= n_block {
            return Err(Error::Placement(format!(
                "metadata '{arch}.block_count' = {n_block} with {n_nextn} nextn blocks: no blocks to run"
            )));
        }
        let n_main = n_block - n_nextn;
        let n_embd = keys.required("embedding_length")?;
        let heads = keys
            .per_layer("attention.head_count", n_block)?
            .ok_or_else(|| {
                Error::Placement(format!(
                    "missing metadata key '{arch}.attention.head_count'"
                ))
            })?;
        let n_head = heads.iter().copied().max().unwrap_or(0);
        if n_head == 0 {
            return Err(Error::Placement(format!(
                "metadata '{arch}.attention.head_count' is 0"
            )));
        }
        let heads_kv = keys
            .per_layer("attention.head_count_kv", n_block)?
            .unwrap_or_else(|| heads.clone());

        let kv_lora = keys.scalar("attention.kv_lora_rank")?;
        let (kv, head_q) = match kv_lora {
            // MLA as llama.cpp caches it: per position one row of the normed latent and the
            // roped key part, shared by all heads; the values are the latent (no V cache).
            Some(kv_lora) => {
                let n_rot = keys.required("rope.dimension_count")?;
                let width = kv_lora + n_rot;
                let shape = LayerStateSpec {
                    keys: Some(RowSpec { width, head: width }),
                    ..Default::default()
                };
                (vec![shape; n_main], width)
            }
            None => {
                let default_head = n_embd / n_head;
                let head_k = keys.scalar("attention.key_length")?.unwrap_or(default_head);
                let head_v = keys.scalar("attention.value_length")?.unwrap_or(head_k);
                let kv = heads_kv[..n_main]
                    .iter()
                    .map(|&n_kv| LayerStateSpec {
                        keys: Some(RowSpec {
                            width: n_kv * head_k,
                            head: head_k,
                        }),
                        values: Some(RowSpec {
                            width: n_kv * head_v,
                            head: head_v,
                        }),
                        ..Default::default()
                    })
                    .collect();
                (kv, head_k.max(head_v))
            }
        };

        let n_vocab = match keys.scalar("vocab_size")? {
            Some(n) => n,
            None => ["token_embd.weight", "output.weight"]
                .iter()
                .find_map(|name| tensors.iter().find(|t| t.name == *name))
                .and_then(|t| t.dims.get(1).copied())
                .map(|n| n as usize)
                .ok_or_else(|| {
                    Error::Placement(format!(
                        "no '{arch}.vocab_size' and no token_embd.weight to read it from"
                    ))
                })?,
        };

        let n_ff = keys
            .per_layer("feed_forward_length", n_block)?
            .and_then(|v| v.into_iter().max())
            .unwrap_or(0);
        let n_ff_exp = keys.scalar("expert_feed_forward_length")?.unwrap_or(0);
        let n_used = keys.scalar("expert_used_count")?.unwrap_or(0);
        let n_shared = keys.scalar("expert_shared_count")?.unwrap_or(0);
        let n_ff_shexp = keys
            .scalar("expert_shared_feed_forward_length")?
            .unwrap_or(n_shared * n_ff_exp);
        let ffn_width = n_ff.max(n_used * n_ff_exp + n_ff_shexp);

        Ok(ModelShape {
            n_block,
            n_nextn,
            n_embd,
            n_vocab,
            n_head,
            head_q,
            ffn_width,
            n_ctx_train: keys.scalar("context_length")?,
            kv,
            arch,
        })
    }
}

/// Typed lookups of `<arch>.<key>`.
struct Keys<'a> {
    meta: &'a Metadata,
    arch: &'a str,
}

impl Keys<'_> {
    fn name(&self, key: &str) -> String {
        format!("{}.{key}", self.arch)
    }

    fn scalar(&self, key: &str) -> Result<Option<usize>> {
        let name = self.name(key);
        match self.meta.get(&name) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|x| usize::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| {
                    Error::Placement(format!(
                        "metadata '{name}' has type {:?}, expected a non-negative integer",
                        v.value_type()
                    ))
                }),
        }
    }

    fn required(&self, key: &str) -> Result<usize> {
        self.scalar(key)?
            .ok_or_else(|| Error::Placement(format!("missing metadata key '{}'", self.name(key))))
    }

    /// One value per block: an integer (the same for every block) or an array of
    /// `n_block` integers (llama.cpp's `get_key_or_arr`).
    fn per_layer(&self, key: &str, n_block: usize) -> Result<Option<Vec<usize>>> {
        let name = self.name(key);
        let Some(v) = self.meta.get(&name) else {
            return Ok(None);
        };
        if let Some(arr) = v.as_array() {
            let vals = arr
                .to_u64_vec()
                .and_then(|v| v.into_iter().map(|x| usize::try_from(x).ok()).collect())
                .ok_or_else(|| {
                    Error::Placement(format!("metadata '{name}' must hold non-negative integers"))
                })?;
            let vals: Vec<usize> = vals;
            if vals.len() != n_block {
                return Err(Error::Placement(format!(
                    "metadata '{name}' has {} entries for {n_block} blocks",
                    vals.len()
                )));
            }
            return Ok(Some(vals));
        }
        Ok(self.scalar(key)?.map(|x| vec![x; n_block]))
    }
}
