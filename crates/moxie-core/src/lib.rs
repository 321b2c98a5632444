//! moxie's inference core: hyper-parameters, architectures, the CPU forward pass, KV cache,
//! sampling and the generation loop.

pub mod arch;
pub mod bench;
pub mod config;
pub mod generate;
pub mod inventory;
pub mod kv_cache;
pub mod model;
pub mod moe;
pub mod npy;
pub mod ops;
pub mod parallel;
pub mod sampling;
mod spin_pool;
pub mod synth;
pub mod tensor;

pub use config::{Arch, Config};
pub use kv_cache::KvCache;
pub use model::{Logits, Model};
pub use parallel::{Numerics, Parallel};
pub use sampling::{Sampler, SamplerConfig};

/// Errors of the core crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Gguf(#[from] moxie_gguf::GgufError),
    #[error("{0}")]
    Model(String),
    #[error("token id {id} is outside the vocabulary (n_vocab = {n_vocab})")]
    BadToken { id: u32, n_vocab: usize },
    #[error("context is full: {needed} positions needed, the context holds {n_ctx} (raise -c)")]
    ContextFull { n_ctx: usize, needed: usize },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T> = std::result::Result<T, Error>;
