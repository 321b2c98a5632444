//! Typed launches of the kernels in `kernels/ops.cu` (norms, elementwise, RoPE, attention,
//! routing, KV-cache stores). The products with quantized weights are in `matmul.rs`.
//! Every op takes device addresses and sizes in elements; it only queues work.

use std::sync::Arc;

use crate::{GpuBackend, Result};

/// A GPU with typed kernel launches.
#[derive(Clone, Debug)]
pub struct Gpu {
    backend: Arc<dyn GpuBackend>,
}

impl Gpu {
    pub fn new(backend: Arc<dyn GpuBackend>) -> Gpu {
        Gpu { backend }
    }

    pub fn backend(&self) -> &Arc<dyn GpuBackend> {
        &self.backend
    }

    pub fn name(&self) -> &str {
        self.backend.name()
    }

    pub fn synchronize(&self) -> Result<()> {
        self.backend.synchronize()
    }
}
