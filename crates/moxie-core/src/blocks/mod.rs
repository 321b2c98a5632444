//! The blocks layers are built from. Each block kind owns its weights and declares the state it
//! keeps per sequence; its CPU and GPU implementations sit side by side in its module
//! ([`crate::forward::Block`]):
//!
//! | block | module | state |
//! | --- | --- | --- |
//! | grouped-query attention (optionally gated) | [`gqa`] | keys and values per position |
//! | multi-head latent attention | [`mla`] | the latent + rotary key per position |
//! | DSA lightning indexer (in sparse MLA layers) | [`dsa`] | indexer keys per position |
//! | gated DeltaNet linear attention | [`delta_net`] | convolution window + state matrices |
//! | dense SwiGLU feed-forward | [`ffn`] | none |
//! | MoE: router, routed experts (on their own device), shared expert | [`moe`] | none |
//! | token embeddings, output head | [`embed`], [`head`] | none |
//!
//! A layer is a token mixer and a feed-forward part, each behind its norm; the architecture
//! files (`crate::arch`) say which blocks each layer has and name their tensors.

pub(crate) mod attention;
pub mod delta_net;
pub mod dsa;
pub mod embed;
pub mod ffn;
pub mod gqa;
pub mod head;
pub mod mla;
pub mod moe;

use crate::device::DeviceId;
pub(crate) use crate::forward::Block;
use crate::loader::Vector;
use crate::parallel::Parallel;
use crate::state::LayerStateSpec;
use crate::tensor::{gemv_many, ChunkedLayout, Mat, QuantizedActs, Tensor};
use crate::Result;

pub use delta_net::DeltaNet;
pub use ffn::DenseFfn;
pub use gqa::Gqa;
pub use mla::Mla;
pub use moe::Moe;

/// The token-mixing block of a layer.
pub enum Mixer {
    Gqa(Gqa),
    Mla(Mla),
    DeltaNet(Box<DeltaNet>),
}

impl Mixer {
    /// What it keeps per sequence.
    pub fn state_spec(&self) -> LayerStateSpec {
        match self {
            Mixer::Gqa(a) => a.state_spec(),
            Mixer::Mla(a) => a.state_spec(),
            Mixer::DeltaNet(a) => a.state_spec(),
        }
    }

    /// Its weight matrices.
    pub fn matrices(&self) -> Vec<&Tensor> {
        match self {
            Mixer::Gqa(a) => a.matrices(),
            Mixer::Mla(a) => a.matrices(),
            Mixer::DeltaNet(a) => a.matrices(),
        }
    }

    /// [`Mixer::matrices`], to replace.
    pub fn matrices_mut(&mut self) -> Vec<&mut Tensor> {
        match self {
            Mixer::Gqa(a) => a.matrices_mut().into(),
            Mixer::Mla(a) => a.matrices_mut(),
            Mixer::DeltaNet(a) => a.matrices_mut().into(),
        }
    }

    /// The block, to run where its weights are.
    pub(crate) fn block(&self) -> &dyn Block {
        match self {
            Mixer::Gqa(a) => a,
            Mixer::Mla(a) => a,
            Mixer::DeltaNet(a) => &**a,
        }
    }
}

/// The feed-forward block of a layer.
pub enum Ffn {
    Dense(Box<DenseFfn>),
    Moe(Box<Moe>),
}

impl Ffn {
    /// Its weight matrices.
    pub fn matrices(&self) -> Vec<&Tensor> {
        match self {
            Ffn::Dense(f) => f.matrices().to_vec(),
            Ffn::Moe(m) => m.matrices(),
        }
    }

    /// [`Ffn::matrices`], to replace.
    pub fn matrices_mut(&mut self) -> Vec<&mut Tensor> {
        match self {
            Ffn::Dense(f) => f.matrices_mut().into(),
            Ffn::Moe(m) => m.matrices_mut(),
        }
    }

    /// The block, to run where its weights are.
    pub(crate) fn block(&self) -> &dyn Block {
        match self {
            Ffn::Dense(f) => &**f,
            Ffn::Moe(m) => &**m,
        }
    }
}

/// Where each part of a layer runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerDevices {
    /// The token mixer (attention) and the layer's state.
    pub attn: DeviceId,
    /// FFN norm, router, shared expert or dense FFN.
    pub ffn: DeviceId,
    /// Routed experts (the same as `ffn` for a dense layer).
    pub experts: DeviceId,
}

/// One layer: `x += mixer(attn_norm(x))`, then `x += ffn(ffn_norm(x))`.
pub struct Layer {
    pub attn_norm: Vector,
    pub mixer: Mixer,
    /// `ffn_norm` (glm4moe and qwen3next call it `post_attention_norm`).
    pub ffn_norm: Vector,
    pub ffn: Ffn,
}

impl Layer {
    /// Where its blocks run.
    pub fn devices(&self) -> LayerDevices {
        let ffn = self.ffn.block().device();
        LayerDevices {
            attn: self.mixer.block().device(),
            ffn,
            experts: match &self.ffn {
                Ffn::Moe(m) => m.experts_device,
                Ffn::Dense(_) => ffn,
            },
        }
    }
}

/// Multiply with `w`, reusing `acts` when `w` consumes the same activation type.
pub(crate) fn matmul_shared(
    w: &Tensor,
    acts: &QuantizedActs,
    x: &[f32],
    par: &Parallel,
    out: &mut [f32],
) -> Result<()> {
    let m = w.matrix()?;
    if m.act_type() == acts.ty {
        m.matmul_q(par, acts, out);
    } else {
        m.matmul(par, x, out);
    }
    Ok(())
}

/// [`per_head_products`] of one token: every head's activations converted on the caller (a
/// few thousand values), then all heads' rows in one parallel region ([`gemv_many`], the
/// kernel `mul_mat` picks for one row, so the same values as the batch path's), where the
/// batch path takes three regions.
fn one_token_per_head(
    par: &Parallel,
    mats: &[Mat<'_>],
    x: &[f32],
    x_stride: usize,
    out: &mut [f32],
    out_stride: usize,
) -> Result<()> {
    let (n_in, n_out) = (mats[0].n_in, mats[0].n_out);
    let rows = (0..mats.len()).map(|h| &x[h * x_stride..][..n_in]);
    let acts = QuantizedActs::from_rows(mats[0].act_type(), n_in, rows);
    let list: Vec<_> = mats
        .iter()
        .enumerate()
        .map(|(h, m)| (*m, acts.row(h)))
        .collect();
    if out_stride == n_out {
        gemv_many(par, &list, &mut out[..mats.len() * n_out]);
        return Ok(());
    }
    ONE_TOKEN_HEADS.with_borrow_mut(|heads| {
        heads.resize(mats.len() * n_out, 0.0);
        gemv_many(par, &list, heads);
        for (dst, src) in out.chunks_mut(out_stride).zip(heads.chunks_exact(n_out)) {
            dst[..n_out].copy_from_slice(src);
        }
    });
    Ok(())
}

thread_local! {
    /// [`one_token_per_head`]'s results before they go to their strided places (kept between
    /// calls: decode makes two per layer).
    static ONE_TOKEN_HEADS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `W_h · x_h` for every head `h` of a 3-D weight (MLA's `attn_k_b`, `attn_v_b`: one matrix per
/// head, `n_head` = its third dimension), all heads in one parallel region. Head `h` of token
/// `t` reads the first `W_h.n_in` values at `x[(t * n_head + h) * x_stride..]` and writes
/// `W_h.n_out` values at `out[(t * n_head + h) * out_stride..]`. Each head's product uses the
/// kernel `mul_mat` of that head alone would (`permuted_input` as in
/// [`crate::tensor::Mat::mul_mat_kernel`]).
pub(crate) fn per_head_products(
    par: &Parallel,
    w: &Tensor,
    x: &[f32],
    x_stride: usize,
    permuted_input: bool,
    out: &mut [f32],
    out_stride: usize,
) -> Result<()> {
    let n_head = w.ne[2];
    let n = x.len() / (n_head * x_stride);
    let mats = (0..n_head)
        .map(|h| w.slice(h))
        .collect::<Result<Vec<_>>>()?;
    let (n_in, n_out) = (mats[0].n_in, mats[0].n_out);
    if n == 1 {
        return one_token_per_head(par, &mats, x, x_stride, out, out_stride);
    }
    let kernels: Vec<_> = mats
        .iter()
        .map(|m| m.mul_mat_kernel(par, n, permuted_input))
        .collect();
    // Each head's activations (converted straight from its strided rows), heads in parallel:
    // on one thread this was a tenth of a 512-token prefill.
    let acts = par.map(
        n_head,
        |_| n * n_in,
        |h| {
            let rows = (0..n).map(|t| &x[(t * n_head + h) * x_stride..][..n_in]);
            let a = QuantizedActs::from_rows(mats[h].act_type(), n_in, rows);
            a.prepare_for(kernels[h]);
            a
        },
    );
    let layout = ChunkedLayout::new(n_out, vec![n; n_head]);
    // From the thread's pool: every value is written by its item before it is read.
    let mut results = crate::scratch::take(layout.len());
    layout.for_each_item(par, n_in, &mut results, |h, rows, o, [scratch, _]| {
        mats[h].rows_times(kernels[h], &acts[h], rows, o, scratch);
    });
    let token_stride = n_head * out_stride;
    par.for_each_range(n, n_head * n_out, out, token_stride, |toks, o| {
        for (t, orow) in toks.zip(o.chunks_exact_mut(token_stride)) {
            for h in 0..n_head {
                layout.gather(&results, h, t, &mut orow[h * out_stride..][..n_out]);
            }
        }
    });
    Ok(())
}
