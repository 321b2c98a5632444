//! The hyper-parameters placement needs, read from GGUF metadata without
//! [`Config::from_metadata`](crate::Config::from_metadata): planning must work for
//! architectures moxie cannot run yet (GLM-5.1's MLA) as long as their keys follow llama.cpp's
//! `<arch>.*` names.
//!
//! Per-layer state follows llama.cpp's caches: MLA's latent rows; glm-dsa's indexer key cache
//! (`llama_kv_cache_dsa`: one head of `attention.indexer.key_length` values per position, of
//! the key cache type, on the layers whose indexer is "full"); and for hybrid recurrent models
//! (qwen3next) a KV cache on the full-attention layers only, the other layers holding
//! llama.cpp's `n_embd_r()` convolution values plus `n_embd_s()` SSM values (f32) per sequence.

use moxie_gguf::{Metadata, TensorInfo};

use crate::state::{LayerStateSpec, RecurrentSpec, RowSpec};
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
    /// Attention as its kernels see it: kv heads (the fewest of any attention layer, where the
    /// most query heads share one) and key and value widths per head (MLA: one kv head, the
    /// latent plus rope width, the latent).
    pub attn_kv_heads: usize,
    pub attn_head_k: usize,
    pub attn_head_v: usize,
    /// The widest FFN intermediate one token needs: the dense FFN's, or the selected routed
    /// experts' plus the shared experts'.
    pub ffn_width: usize,
    /// `<arch>.context_length`, if given.
    pub n_ctx_train: Option<usize>,
    /// MLA attention (`attention.kv_lora_rank`): a legacy file's fused `attn_kv_b` is loaded
    /// split into its absorbed parts.
    pub mla: bool,
    /// What each main (non-nextn) block keeps per sequence: attention rows per position
    /// (GQA keys and values, MLA's latent), DSA indexer keys per position on the layers with a
    /// full indexer, and a fixed-size recurrent state on the recurrent layers of a hybrid
    /// model (qwen3next's gated DeltaNet layers, which keep no attention rows).
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
        let (kv, head_q, attn) = match kv_lora {
            // MLA as llama.cpp caches it: per position one row of the normed latent and the
            // roped key part, shared by all heads; the values are the latent (no V cache).
            Some(kv_lora) => {
                let n_rot = keys.required("rope.dimension_count")?;
                let width = kv_lora + n_rot;
                let indexer = keys.indexer_keys(n_main)?;
                let kv = (0..n_main)
                    .map(|il| LayerStateSpec {
                        keys: Some(RowSpec { width, head: width }),
                        indexer_keys: indexer[il],
                        ..Default::default()
                    })
                    .collect();
                (kv, width, (1, width, kv_lora))
            }
            None => {
                let default_head = n_embd / n_head;
                let head_k = keys.scalar("attention.key_length")?.unwrap_or(default_head);
                let head_v = keys.scalar("attention.value_length")?.unwrap_or(head_k);
                let recurrent = keys.recurrent_layers(n_block, n_main)?;
                let kv = heads_kv[..n_main]
                    .iter()
                    .enumerate()
                    .map(|(il, &n_kv)| match &recurrent {
                        Some((spec, is_recurrent)) if is_recurrent[il] => LayerStateSpec {
                            recurrent: Some(*spec),
                            ..Default::default()
                        },
                        _ => LayerStateSpec {
                            keys: Some(RowSpec {
                                width: n_kv * head_k,
                                head: head_k,
                            }),
                            values: Some(RowSpec {
                                width: n_kv * head_v,
                                head: head_v,
                            }),
                            ..Default::default()
                        },
                    })
                    .collect::<Vec<_>>();
                let kv_heads = kv
                    .iter()
                    .filter_map(|l: &LayerStateSpec| l.keys.map(|k| k.width / k.head.max(1)))
                    .filter(|&h| h > 0)
                    .min()
                    .unwrap_or(n_head);
                (kv, head_k.max(head_v), (kv_heads, head_k, head_v))
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
            attn_kv_heads: attn.0,
            attn_head_k: attn.1,
            attn_head_v: attn.2,
            ffn_width,
            n_ctx_train: keys.scalar("context_length")?,
            mla: kv_lora.is_some(),
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

    /// One flag per block: a bool or integer (non-zero = set), or an array of `n` of them
    /// (llama.cpp's `get_key_or_arr` into a bool/u32 array).
    fn flags(&self, key: &str, n: usize) -> Result<Option<Vec<bool>>> {
        let name = self.name(key);
        let Some(v) = self.meta.get(&name) else {
            return Ok(None);
        };
        let flag = |v: &moxie_gguf::Value| v.as_bool().or_else(|| v.as_u64().map(|x| x != 0));
        let bad = || {
            Error::Placement(format!(
                "metadata '{name}' must hold booleans or non-negative integers"
            ))
        };
        if let Some(arr) = v.as_array() {
            if arr.len() != n {
                return Err(Error::Placement(format!(
                    "metadata '{name}' has {} entries, expected {n}",
                    arr.len()
                )));
            }
            return arr
                .iter()
                .map(|x| flag(&x).ok_or_else(bad))
                .collect::<Result<Vec<bool>>>()
                .map(Some);
        }
        let x = flag(v).ok_or_else(bad)?;
        Ok(Some(vec![x; n]))
    }

    /// The DSA indexer's key rows of each of the `n_main` main blocks, if the model has an
    /// indexer (`attention.indexer.key_length`): one head per position on the blocks whose
    /// indexer is full. glm-dsa marks them in `attention.indexer.types` (1 full, 0 sharing
    /// another layer's selection); without that key llama.cpp takes GLM-5/5.1 (context below
    /// 2^20) as all full and GLM-5.2 as full on blocks 0, 1 and every fourth from 2
    /// (`GLM_5_2_DEFAULT_INDEXER_TYPES`, 78 entries). Other architectures cache indexer keys on
    /// every block.
    fn indexer_keys(&self, n_main: usize) -> Result<Vec<Option<RowSpec>>> {
        let Some(width) = self.scalar("attention.indexer.key_length")? else {
            return Ok(vec![None; n_main]);
        };
        if width == 0 {
            return Err(Error::Placement(format!(
                "metadata '{}' is 0",
                self.name("attention.indexer.key_length")
            )));
        }
        let full = match self.flags("attention.indexer.types", n_main)? {
            Some(full) => full,
            None if self.arch == "glm-dsa"
                && self.scalar("context_length")?.unwrap_or(0) >= 1 << 20 =>
            {
                (0..n_main)
                    .map(|il| il < 78 && (il < 2 || (il - 2) % 4 == 0))
                    .collect()
            }
            None => vec![true; n_main],
        };
        let row = RowSpec { width, head: width };
        Ok(full.into_iter().map(|f| f.then_some(row)).collect())
    }

    /// A hybrid recurrent model's state per recurrent block and which of the `n_main` main
    /// blocks are recurrent, if the model has `ssm.*` keys. The blocks come from
    /// `attention.recurrent_layers` (one flag per block of `n_block`), else from
    /// `full_attention_interval` (default 4: every fourth block has full attention), as
    /// qwen3next, qwen35 and qwen35moe read them. The state is llama.cpp's for one sequence:
    /// `(conv_kernel - 1) * (inner_size + 2 * group_count * state_size)` convolution values
    /// (`n_embd_r`) and `state_size * inner_size` SSM values (`n_embd_s`; for gated DeltaNet
    /// a `state_size` x `inner_size / time_step_rank` matrix per value head), all f32.
    fn recurrent_layers(
        &self,
        n_block: usize,
        n_main: usize,
    ) -> Result<Option<(RecurrentSpec, Vec<bool>)>> {
        let Some(conv_kernel) = self.scalar("ssm.conv_kernel")? else {
            return Ok(None);
        };
        let inner = self.required("ssm.inner_size")?;
        let state = self.required("ssm.state_size")?;
        let groups = self.required("ssm.group_count")?;
        let overflow = || {
            Error::Placement(format!(
                "metadata '{}': the recurrent state size overflows",
                self.name("ssm.inner_size")
            ))
        };
        let conv = groups
            .checked_mul(state)
            .and_then(|x| x.checked_mul(2))
            .and_then(|x| x.checked_add(inner))
            .and_then(|x| x.checked_mul(conv_kernel.saturating_sub(1)))
            .ok_or_else(overflow)?;
        let ssm = state.checked_mul(inner).ok_or_else(overflow)?;
        let is_recurrent = match self.flags("attention.recurrent_layers", n_block)? {
            Some(flags) => flags[..n_main].to_vec(),
            None => {
                let interval = self.scalar("full_attention_interval")?.unwrap_or(4);
                if interval == 0 {
                    return Err(Error::Placement(format!(
                        "metadata '{}' is 0",
                        self.name("full_attention_interval")
                    )));
                }
                (0..n_main).map(|il| (il + 1) % interval != 0).collect()
            }
        };
        Ok(Some((RecurrentSpec { conv, ssm }, is_recurrent)))
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
