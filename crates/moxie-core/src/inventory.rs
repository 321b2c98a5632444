//! What each tensor of a GGUF is for, and how many bytes each role takes — the basis of
//! `moxie inspect` and of placement decisions (routed experts are ~95% of an MoE's bytes but
//! only top-k of them are read per token).

use std::collections::BTreeMap;

use moxie_gguf::TensorInfo;

/// The role a tensor plays in the forward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// `token_embd`
    Embeddings,
    /// `attn_*` weights and biases
    Attention,
    /// DeepSeek sparse attention's lightning indexer (`indexer.*`, GLM-5's `glm-dsa`): read by
    /// every token of its layer, like attention
    Indexer,
    /// A recurrent token mixer's weights (`ssm_*`: qwen3next's gated DeltaNet, Mamba), used by
    /// every token of its layer like attention
    Recurrent,
    /// Dense FFN of leading dense layers (`ffn_gate/up/down`)
    DenseFfn,
    /// Shared experts (`*_shexp`, with qwen3next's shared-expert gate `ffn_gate_inp_shexp`)
    SharedExperts,
    /// Routed experts (`*_exps`)
    RoutedExperts,
    /// Router (`ffn_gate_inp`) and selection bias (`exp_probs_b`)
    Router,
    /// Norm weights
    Norms,
    /// `output` (LM head) and `output_norm`
    Output,
    /// MTP / nextn block tensors
    NextN,
    Other,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Embeddings => "embeddings",
            Role::Attention => "attention",
            Role::Indexer => "indexer",
            Role::Recurrent => "recurrent",
            Role::DenseFfn => "dense_ffn",
            Role::SharedExperts => "shared_experts",
            Role::RoutedExperts => "routed_experts",
            Role::Router => "router",
            Role::Norms => "norms",
            Role::Output => "output",
            Role::NextN => "nextn",
            Role::Other => "other",
        }
    }

    /// Classify a tensor by name.
    pub fn of(name: &str) -> Role {
        let local = match name.strip_prefix("blk.") {
            Some(rest) => rest.split_once('.').map_or(rest, |(_, r)| r),
            None => name,
        };
        if local.starts_with("nextn.") {
            Role::NextN
        } else if local.starts_with("token_embd") {
            Role::Embeddings
        } else if local.starts_with("output") {
            Role::Output
        } else if local.starts_with("indexer.") {
            Role::Indexer
        } else if local.starts_with("ssm_") {
            Role::Recurrent
        } else if local.contains("_exps") {
            Role::RoutedExperts
        } else if local.contains("_shexp") {
            Role::SharedExperts
        } else if local.starts_with("ffn_gate_inp") || local.starts_with("exp_probs_b") {
            Role::Router
        } else if local.contains("norm") {
            Role::Norms
        } else if local.starts_with("attn_") {
            Role::Attention
        } else if local.starts_with("ffn_") {
            Role::DenseFfn
        } else {
            Role::Other
        }
    }
}

/// The block (layer) a tensor belongs to, if any.
pub fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// Bytes and tensor counts per quant type.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    pub bytes: u64,
    pub tensors: usize,
    pub by_type: BTreeMap<String, u64>,
}

impl Tally {
    fn add(&mut self, t: &TensorInfo) {
        self.bytes += t.n_bytes;
        self.tensors += 1;
        *self.by_type.entry(t.ty.name().to_string()).or_default() += t.n_bytes;
    }
}

/// Bytes per role, overall and per layer.
#[derive(Clone, Debug, Default)]
pub struct Inventory {
    pub total: Tally,
    pub by_role: BTreeMap<Role, Tally>,
    /// layer -> role -> tally
    pub by_layer: BTreeMap<usize, BTreeMap<Role, Tally>>,
}

impl Inventory {
    pub fn of(tensors: &[TensorInfo]) -> Inventory {
        let mut inv = Inventory::default();
        for t in tensors {
            let role = Role::of(&t.name);
            inv.total.add(t);
            inv.by_role.entry(role).or_default().add(t);
            if let Some(l) = layer_of(&t.name) {
                inv.by_layer
                    .entry(l)
                    .or_default()
                    .entry(role)
                    .or_default()
                    .add(t);
            }
        }
        inv
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_by_name() {
        assert_eq!(Role::of("token_embd.weight"), Role::Embeddings);
        assert_eq!(Role::of("output.weight"), Role::Output);
        assert_eq!(Role::of("output_norm.weight"), Role::Output);
        assert_eq!(Role::of("blk.3.ffn_up_exps.weight"), Role::RoutedExperts);
        assert_eq!(Role::of("blk.3.ffn_down_shexp.weight"), Role::SharedExperts);
        assert_eq!(Role::of("blk.3.ffn_gate_inp.weight"), Role::Router);
        assert_eq!(Role::of("blk.3.exp_probs_b.bias"), Role::Router);
        assert_eq!(Role::of("blk.0.attn_kv_a_mqa.weight"), Role::Attention);
        assert_eq!(Role::of("blk.0.attn_q_a_norm.weight"), Role::Norms);
        assert_eq!(Role::of("blk.0.ffn_gate.weight"), Role::DenseFfn);
        assert_eq!(Role::of("blk.92.nextn.eh_proj.weight"), Role::NextN);
        // GLM-5's lightning indexer, its norm included.
        for t in [
            "k_norm.weight",
            "k_norm.bias",
            "proj.weight",
            "attn_k.weight",
            "attn_q_b.weight",
        ] {
            assert_eq!(
                Role::of(&format!("blk.7.indexer.{t}")),
                Role::Indexer,
                "{t}"
            );
        }
        // qwen3next's gated DeltaNet, its norm included; its q/k/v and gate projections are
        // attention-shaped.
        for t in [
            "ssm_conv1d.weight",
            "ssm_dt.bias",
            "ssm_a",
            "ssm_ba.weight",
            "ssm_norm.weight",
            "ssm_out.weight",
        ] {
            assert_eq!(Role::of(&format!("blk.0.{t}")), Role::Recurrent, "{t}");
        }
        assert_eq!(Role::of("blk.0.attn_qkv.weight"), Role::Attention);
        assert_eq!(Role::of("blk.0.attn_gate.weight"), Role::Attention);
        // The shared expert's sigmoid gate is the shared expert's, not a routed one's.
        assert_eq!(
            Role::of("blk.0.ffn_gate_inp_shexp.weight"),
            Role::SharedExperts
        );
        assert_eq!(layer_of("blk.17.attn_q.weight"), Some(17));
        assert_eq!(layer_of("output.weight"), None);
    }
}
