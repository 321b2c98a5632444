//! The MTP (multi-token prediction, "nextn") head of DeepSeek-V3 / GLM-4.5+ / GLM-5.x
//! checkpoints: a draft model for speculative decoding. It is not part of the main graph, so it
//! is loaded only on request ([`LoadOptions::mtp`]); llama.cpp skips it the same way.
//!
//! As llama.cpp's MTP graph (`graph_mtp` in `src/models/glm-dsa.cpp` and its siblings): for a
//! token `t` and the main model's hidden state `h` after its output norm (at the position
//! before `t`), `x = eh_proj([enorm(embed(t)) | hnorm(h)])`, then one full decoder layer (with
//! its own KV cache, a [`SeqState`] of one layer), then `shared_head_norm` (or the model's
//! output norm) and `shared_head_head` (or the model's LM head). The normed hidden state it
//! ends with seeds the next draft step.

use crate::arch::blk;
use crate::blocks::head::head;
use crate::blocks::Layer;
use crate::config::Config;
use crate::device::{DeviceId, Resident, CPU};
use crate::forward::Pass;
use crate::gpu_pass::{weight, F32};
use crate::loader::{TensorSource, Vector};
use crate::model::{Logits, Model};
use crate::ops;
use crate::parallel::Parallel;
use crate::state::{KvTypes, SeqState};
use crate::tensor::Tensor;
use crate::{Error, Result};

/// What to load besides the main graph.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// The MTP (nextn) block, for [`Model::draft`].
    pub mtp: bool,
}

/// The MTP head: its input combination, decoder layer and output head.
pub struct Mtp {
    /// `nextn.eh_proj`: `[embedding | hidden]` (2 × n_embd) to n_embd.
    pub eh_proj: Tensor,
    pub enorm: Vector,
    pub hnorm: Vector,
    /// `nextn.embed_tokens`, when the block has its own embeddings.
    pub embed: Option<Tensor>,
    pub layer: Layer,
    /// `nextn.shared_head_norm` and `nextn.shared_head_head`, when the block has its own.
    pub head_norm: Option<Vector>,
    pub head: Option<Tensor>,
}

impl Mtp {
    /// Load the first MTP block (llama.cpp runs one) of the model described by `c`.
    pub(crate) fn load(
        c: &Config,
        keys: &crate::config::Keys,
        src: &TensorSource,
        main_head: &Tensor,
    ) -> Result<Mtp> {
        if c.n_layer_nextn == 0 {
            return Err(Error::Model(
                "the model has no MTP block (nextn_predict_layers = 0)".into(),
            ));
        }
        let layer_fn = crate::arch::def(c.arch).mtp_layer.ok_or_else(|| {
            Error::Model(format!(
                "moxie does not run {}'s MTP block yet",
                c.arch.name()
            ))
        })?;
        let il = c.n_layer;
        let e = c.n_embd;
        let input = src.block(format!("the MTP block's input (layer {il})"));
        let eh_proj = input.get(&blk(il, "nextn.eh_proj.weight"), &[2 * e, e])?;
        let enorm = input.vec(&blk(il, "nextn.enorm.weight"), e)?;
        let hnorm = input.vec(&blk(il, "nextn.hnorm.weight"), e)?;
        let embed = input.opt(&blk(il, "nextn.embed_tokens.weight"), &[e, c.n_vocab])?;
        let layer = layer_fn(c, keys, src, il)?;
        // The head runs where its matrix is (the block's own, or the model's LM head); its
        // norm goes with it.
        let head_t = src.block(format!("the MTP block's output head (layer {il})"));
        let head = head_t.opt(&blk(il, "nextn.shared_head_head.weight"), &[e, c.n_vocab])?;
        let head_dev = head.as_ref().map_or(main_head.device, |t| t.device);
        let head_norm = src.vec_on(&blk(il, "nextn.shared_head_norm.weight"), e, head_dev)?;
        Ok(Mtp {
            eh_proj,
            enorm,
            hnorm,
            embed,
            layer,
            head_norm,
            head,
        })
    }

    /// Where the input combination runs.
    fn input_device(&self) -> DeviceId {
        self.eh_proj.device
    }

    /// `eh_proj([enorm(e) | hnorm(h)])` for the `n` rows of `e` (on `e`'s device) and `hidden`
    /// (host rows), on the input's device.
    fn input<'m>(
        &self,
        p: &mut Pass<'m>,
        mut e: Resident<'m>,
        hidden: &[f32],
    ) -> Result<Resident<'m>> {
        let (n, d, eps) = (p.n, p.c.n_embd, p.c.rms_eps);
        let dev = self.input_device();
        if let Some(gpu) = p.devices.gpu(dev) {
            let gpu = gpu.clone();
            let ep = e.on_gpu(dev)?;
            let hb = p.gpu.buf(dev, "mtp_hidden", n * d)?;
            gpu.backend().upload(hb, bytemuck::cast_slice(hidden))?;
            p.devices.count_copy(CPU, dev, hidden.len() * F32);
            let cat = p.gpu.buf(dev, "mtp_concat", n * 2 * d)?;
            let second = cat.offset::<f32>(d);
            gpu.rms_norm(ep, d, self.enorm.ptr("nextn.enorm")?, cat, 2 * d, n, d, eps)?;
            gpu.rms_norm(
                hb,
                d,
                self.hnorm.ptr("nextn.hnorm")?,
                second,
                2 * d,
                n,
                d,
                eps,
            )?;
            let mut x = Resident::new(p.devices, CPU, Vec::new());
            let xp = x.loaded_on_gpu(dev, n * d)?;
            gpu.mul_mat(&weight(&self.eh_proj)?, 1, cat, 2 * d, 0, xp, d, 0, n)?;
            return Ok(x);
        }
        let es = e.on(dev)?;
        let mut cat = vec![0f32; n * 2 * d];
        for ((row, er), hr) in cat
            .chunks_exact_mut(2 * d)
            .zip(es.chunks_exact(d))
            .zip(hidden.chunks_exact(d))
        {
            row[..d].copy_from_slice(er);
            ops::rms_norm_mul(&mut row[..d], &self.enorm, eps);
            row[d..].copy_from_slice(hr);
            ops::rms_norm_mul(&mut row[d..], &self.hnorm, eps);
        }
        let mut x = vec![0f32; n * d];
        self.eh_proj.matrix()?.matmul(p.par, &cat, &mut x);
        Ok(Resident::new(p.devices, dev, x))
    }
}

impl Model {
    /// A state for the MTP block's own layer (its KV cache), for `n_ctx` positions, held on
    /// the device its attention runs on.
    pub fn new_draft_state(&self, n_ctx: usize, types: KvTypes) -> Result<SeqState> {
        let mtp = self.mtp()?;
        let mut state = SeqState::new(&[mtp.layer.mixer.state_spec()], n_ctx, types)?;
        self.place_layer_state(&mut state, 0, &mtp.layer, n_ctx, types)?;
        Ok(state)
    }

    fn mtp(&self) -> Result<&Mtp> {
        self.mtp.as_ref().ok_or_else(|| {
            Error::Model("the MTP block is not loaded (load with LoadOptions { mtp: true })".into())
        })
    }

    /// Draft with the MTP head: `tokens` at the positions following what the draft `state`
    /// holds, each with the main model's output-normed hidden state at the position before it
    /// (`hidden`: `n_embd` per token, from [`Model::forward_hidden`] or a previous draft
    /// step). Returns the logits of the rows `which` asks for and their normed hidden state
    /// (the next draft step's input).
    pub fn draft(
        &self,
        tokens: &[u32],
        hidden: &[f32],
        state: &mut SeqState,
        par: &Parallel,
        which: Logits,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let mtp = self.mtp()?;
        let n = tokens.len();
        if hidden.len() != n * self.config.n_embd {
            return Err(Error::Model(format!(
                "draft: {} hidden values for {n} tokens of {}",
                hidden.len(),
                self.config.n_embd
            )));
        }
        if n == 0 {
            return Ok((Vec::new(), Vec::new()));
        }
        self.check_tokens(tokens, state)?;
        let out = self.with_pass(n, state.len(), par, |p| {
            let e = match &mtp.embed {
                Some(t) => crate::blocks::embed::Embeddings::rows(t, p, tokens)?,
                None => self.embeddings.run(p, tokens)?,
            };
            let mut x = mtp.input(p, e, hidden)?;
            let st = state.layer_mut(0);
            p.sublayer(&mut x, &mtp.layer.attn_norm, mtp.layer.mixer.block(), st)?;
            p.sublayer(&mut x, &mtp.layer.ffn_norm, mtp.layer.ffn.block(), st)?;
            let norm = mtp.head_norm.as_ref().unwrap_or(&self.head.norm);
            let output = mtp.head.as_ref().unwrap_or(&self.head.output);
            head(p, &mut x, which, true, norm, output)
        })?;
        state.commit(n);
        Ok((out.logits, out.hidden.unwrap_or_default()))
    }
}
