//! Products with weight matrices of every ggml block type moxie reads: `mul_mat` (dense and
//! batched per head), `mul_mat_id` (routed experts picked per token) and `get_rows`
//! (embedding rows), launching the per-type kernels of `kernels/matmul.cu`.
//!
//! TO BE WRITTEN (see the helper brief): `Weight`, `Gpu::supports`, `Gpu::mul_mat`,
//! `Gpu::mul_mat_id`, `Gpu::get_rows`.

/// A weight tensor in device memory.
#[derive(Clone, Copy, Debug)]
pub struct Weight;
