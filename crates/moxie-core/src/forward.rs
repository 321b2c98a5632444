//! The forward pass over a batch of tokens: embeddings, then every layer's sublayers
//! (`x += block(norm(x))` for the token mixer, then for the feed-forward part), then the output
//! head. The loop does not know about devices: each block runs where its weights are
//! ([`Block`]), and the hidden state ([`Resident`]) follows it there, crossing devices only
//! when the next block lives elsewhere.

use std::sync::atomic::Ordering;

use moxie_gpu::DevPtr;

use crate::blocks::dsa::Selected;
use crate::blocks::head::HeadOut;
use crate::blocks::moe::{MoeScratch, SplitMoeBuffers};
use crate::config::Config;
use crate::device::{DeviceId, Devices, Resident};
use crate::gpu_pass::GpuPass;
use crate::loader::Vector;
use crate::model::{Logits, Model};
use crate::ops;
use crate::parallel::Parallel;
use crate::state::{LayerState, SeqState};
use crate::telemetry::Phase;
use crate::Result;

/// A block of a layer: `x += f(h)` for the normed hidden state `h` of the batch, on the device
/// holding its weights. Every block has both implementations, side by side in its module.
pub(crate) trait Block {
    /// The device its weights are on.
    fn device(&self) -> DeviceId;
    /// On the host (the CPU or a simulated device): `h` and `x` hold `p.n` rows.
    fn cpu(&self, p: &mut Pass, h: &[f32], x: &mut [f32], state: &mut LayerState) -> Result<()>;
    /// On GPU `id` (the block's device): `h` and `x` are `p.n` rows in its memory.
    fn gpu(
        &self,
        p: &mut Pass,
        id: DeviceId,
        h: DevPtr,
        x: DevPtr,
        state: &mut LayerState,
    ) -> Result<()>;
}

/// One forward pass over `n` tokens at positions `pos0..pos0 + n`: what every block reads
/// besides its weights and its layer's state.
pub(crate) struct Pass<'m> {
    pub c: &'m Config,
    pub devices: &'m Devices,
    pub par: &'m Parallel,
    pub n: usize,
    pub pos0: usize,
    /// RoPE's (cos, sin) per token and rotated pair: the same for every layer.
    pub rope: &'m [Vec<(f32, f32)>],
    pub gpu: GpuPass<'m>,
    /// MoE buffers (taken from the model's pool for the pass).
    pub moe: MoeScratch,
    /// Rows crossing between an MoE layer's router and its routed experts on another device.
    pub split: SplitMoeBuffers<'m>,
    /// Batches of at least this many tokens stream host-resident routed experts to the GPU
    /// running their router (`usize::MAX`: never).
    pub op_offload_min_batch: usize,
    /// At most this many bytes of a GPU's memory hold the experts op offload streams at a
    /// time (`u64::MAX`: what the GPU has free).
    pub op_offload_buffer_limit: u64,
    /// The DSA indexer's selection of the last layer that ran one, for the layers that share
    /// it.
    pub top_k: Option<Selected>,
    /// The host copy of the normed input of the block being run.
    h: Vec<f32>,
}

impl<'m> Pass<'m> {
    /// `x += block(norm(x))`, on the block's device.
    pub fn sublayer(
        &mut self,
        x: &mut Resident<'m>,
        norm: &Vector,
        block: &dyn Block,
        state: &mut LayerState,
    ) -> Result<()> {
        let dev = block.device();
        let (n, e, eps) = (self.n, self.c.n_embd, self.c.rms_eps);
        if self.devices.gpu(dev).is_some() {
            let gpu = self.gpu.gpu(dev)?;
            let xp = x.on_gpu(dev)?;
            let h = self.gpu.buf(dev, "h", n * e)?;
            gpu.rms_norm(xp, e, norm.ptr("a norm weight")?, h, e, n, e, eps)?;
            return block.gpu(self, dev, h, xp, state);
        }
        let xs = x.on(dev)?;
        let mut h = std::mem::take(&mut self.h);
        ops::rms_norm_mul_into_par(self.par, xs, &mut h, norm, eps);
        let r = block.cpu(self, &h, xs, state);
        self.h = h;
        r
    }

    /// The host copy of the block's normed input, taken out for a block that needs it beside
    /// `self` (a GPU block sending it to the host); give it back with [`Pass::give_h`].
    pub fn take_h(&mut self) -> Vec<f32> {
        std::mem::take(&mut self.h)
    }

    pub fn give_h(&mut self, h: Vec<f32>) {
        self.h = h;
    }
}

impl Model {
    /// Run `tokens` (at the positions following what `state` holds) through the model and
    /// return logits (`n_vocab` per returned row).
    pub fn forward(
        &self,
        tokens: &[u32],
        state: &mut SeqState,
        par: &Parallel,
        which: Logits,
    ) -> Result<Vec<f32>> {
        Ok(self.forward_rows(tokens, state, par, which, false)?.logits)
    }

    /// [`Model::forward`], also returning the returned rows' hidden state after the output
    /// norm (`n_embd` per row): what an MTP head drafts from ([`Model::draft`]).
    pub fn forward_hidden(
        &self,
        tokens: &[u32],
        state: &mut SeqState,
        par: &Parallel,
        which: Logits,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let out = self.forward_rows(tokens, state, par, which, true)?;
        Ok((out.logits, out.hidden.unwrap_or_default()))
    }

    fn forward_rows(
        &self,
        tokens: &[u32],
        state: &mut SeqState,
        par: &Parallel,
        which: Logits,
        want_hidden: bool,
    ) -> Result<HeadOut> {
        if tokens.is_empty() {
            return Ok(HeadOut {
                logits: Vec::new(),
                hidden: want_hidden.then(Vec::new),
            });
        }
        self.check_tokens(tokens, state)?;
        let out = self.with_pass(tokens.len(), state.len(), par, |p| {
            let mut x = self.embeddings.run(p, tokens)?;
            let phase = Phase::of_batch(tokens.len());
            for (il, layer) in self.layers.iter().enumerate() {
                let st = state.layer_mut(il);
                p.sublayer(&mut x, &layer.attn_norm, layer.mixer.block(), st)?;
                // Routes the host saw (its own router's, or a GPU router's brought down for
                // host experts); a layer routed and run on one GPU leaves none.
                p.moe.clear_routes();
                p.sublayer(&mut x, &layer.ffn_norm, layer.ffn.block(), st)?;
                let routes = p.moe.routes();
                if !routes.is_empty() {
                    self.routing.record(il, phase, tokens.len(), routes);
                }
            }
            self.head.run(p, &mut x, which, want_hidden)
        })?;
        state.commit(tokens.len());
        let passes = self.routing_passes.fetch_add(1, Ordering::Relaxed) + 1;
        if passes >= crate::model::ROUTING_FLUSH_PASSES {
            self.flush_routing()?;
        }
        Ok(out)
    }

    /// Refuse an empty-context overflow or a token outside the vocabulary before any work.
    pub(crate) fn check_tokens(&self, tokens: &[u32], state: &SeqState) -> Result<()> {
        let c = &self.config;
        state.check_room(tokens.len())?;
        for &t in tokens {
            if t as usize >= c.n_vocab {
                return Err(crate::Error::BadToken {
                    id: t,
                    n_vocab: c.n_vocab,
                });
            }
        }
        Ok(())
    }

    /// Run `f` over a [`Pass`] of `n` tokens at positions `pos0..`, then give its buffers
    /// back (the state's positions are committed by the caller after the last layer: until
    /// then its length is the position of the first token).
    pub(crate) fn with_pass<R>(
        &self,
        n: usize,
        pos0: usize,
        par: &Parallel,
        f: impl FnOnce(&mut Pass) -> Result<R>,
    ) -> Result<R> {
        let c = &self.config;
        // Prompt batches may run on more threads than decode (`-tb`).
        let par = &par.for_tokens(n);
        let rope: Vec<Vec<(f32, f32)>> = (0..n)
            .map(|t| {
                let mut rc = Vec::new();
                c.rope.cache((pos0 + t) as i64, &mut rc);
                rc
            })
            .collect();
        let mut p = Pass {
            c,
            devices: &self.devices,
            par,
            n,
            pos0,
            rope: &rope,
            gpu: GpuPass::new(&self.devices, &self.gpu_scratch, &rope),
            moe: self.scratch.take(),
            split: SplitMoeBuffers::new(&self.devices),
            op_offload_min_batch: self.op_offload_min_batch().unwrap_or(usize::MAX),
            op_offload_buffer_limit: self.op_offload_buffer_limit().unwrap_or(u64::MAX),
            top_k: None,
            h: Vec::new(),
        };
        let result = f(&mut p);
        self.scratch.give(std::mem::take(&mut p.moe));
        let finished = p.gpu.finish();
        let out = result?;
        finished?;
        Ok(out)
    }
}
