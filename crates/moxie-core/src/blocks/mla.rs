//! Multi-head latent attention (deepseek2, glm-dsa) in llama.cpp's absorbed layout: the state
//! holds the normed latent plus the rotary key per position (`kv_lora_rank + n_rot` values);
//! `attn_k_b` folds into the queries and `attn_v_b` expands the attended latent per head, so
//! attention is MQA over one latent "head" whose values are its first `kv_lora_rank` values.
//! With DeepSeek sparse attention (glm-dsa) a lightning indexer ([`crate::blocks::dsa`])
//! picks the positions each query attends to. With `--mla-use 3` ([`MlaPrompts::Expanded`])
//! prompt batches expand the cached latents into each head's keys and values instead, as
//! ik_llama.cpp does.

use moxie_gpu::ops::{AttnShape, KvView};
use moxie_gpu::DevPtr;
use moxie_quant::f32gemm::gemm_f32_abt;

use crate::blocks::attention::{attend, AttnGeom};
use crate::blocks::dsa::{gpu_selection, host_selection, Indexer, Selected};
use crate::blocks::{matmul_shared, per_head_products};
use crate::device::DeviceId;
use crate::forward::{Block, Pass};
use crate::gpu_pass::weight;
use crate::loader::Vector;
use crate::ops::{self, Rope, RopeKind};
use crate::parallel::{MlaPrompts, Numerics, Parallel};
use crate::scratch;
use crate::state::{CacheRows, LayerState, LayerStateSpec, RowSpec};
use crate::tensor::{gemv_many, QuantizedActs, Tensor};
use crate::{Error, Result};

/// The dimensions of MLA.
#[derive(Clone, Copy, Debug)]
pub struct MlaShape {
    pub n_head: usize,
    /// `q_lora_rank` (0: a plain `attn_q`).
    pub q_lora_rank: usize,
    pub kv_lora_rank: usize,
    /// Rotary dimensions of a query/key head.
    pub n_rot: usize,
    /// Per-head query/key width before absorption (`key_length_mla`: nope + rope).
    pub head_k: usize,
    /// Per-head value width after expansion (`value_length_mla`).
    pub head_v: usize,
}

impl MlaShape {
    /// llama.cpp's kq scale for MLA: YaRN's magnitude scale, cancelled in the RoPE attention
    /// factor, is applied to the scores instead (squared), over `sqrt(head_k)`
    /// (TAG_DEEPSEEK2_YARN_LOG_MUL_FIX).
    pub fn kq_scale(&self, rope: &Rope, yarn_log_mul: f32) -> f32 {
        let fs = rope.freq_scale;
        let attn_factor_org = rope.attn_factor * (1.0 + 0.1 * (1.0 / fs).ln());
        let mscale = attn_factor_org * (1.0 + 0.1 * yarn_log_mul * (1.0 / fs).ln());
        mscale * mscale / (self.head_k as f32).sqrt()
    }
}

pub struct Mla {
    /// Where its weights (and the layer's state) are.
    pub device: DeviceId,
    pub shape: MlaShape,
    pub kq_scale: f32,
    /// `attn_q_a` + `attn_q_a_norm`, absent in "lite" models that have a plain `attn_q`.
    pub wq_a: Option<(Tensor, Vector)>,
    /// `attn_q_b` (or `attn_q` without q-lora).
    pub wq_b: Tensor,
    pub wkv_a: Tensor,
    pub kv_a_norm: Vector,
    pub wk_b: Tensor,
    pub wv_b: Tensor,
    pub wo: Tensor,
    /// DeepSeek sparse attention: which positions each query attends to.
    pub sparse: Option<Sparse>,
}

/// Where a sparse MLA layer's selection of positions comes from.
pub enum Sparse {
    /// The layer's own lightning indexer.
    Indexer(Box<Indexer>),
    /// The selection of the last layer before it that ran an indexer (GLM-5.2's "shared"
    /// indexer layers).
    Shared,
}

impl Mla {
    pub fn state_spec(&self) -> LayerStateSpec {
        let width = self.shape.kv_lora_rank + self.shape.n_rot;
        LayerStateSpec {
            keys: Some(RowSpec { width, head: width }),
            indexer_keys: match &self.sparse {
                Some(Sparse::Indexer(ix)) => Some(ix.state_rows()),
                _ => None,
            },
            ..Default::default()
        }
    }

    /// The projections load-time repacking may interleave (not the DSA indexer's).
    pub fn projections_mut(&mut self) -> Vec<&mut Tensor> {
        let indexer = match &self.sparse {
            Some(Sparse::Indexer(ix)) => ix.matrices().len(),
            _ => 0,
        };
        let mut m = self.matrices_mut();
        m.truncate(m.len() - indexer);
        m
    }

    /// [`Mla::matrices`], to replace: the projections, then the indexer's.
    pub fn matrices_mut(&mut self) -> Vec<&mut Tensor> {
        let indexer = match &mut self.sparse {
            Some(Sparse::Indexer(ix)) => Some(ix.matrices_mut()),
            _ => None,
        };
        let mut m: Vec<&mut Tensor> = self.wq_a.iter_mut().map(|(t, _)| t).collect();
        m.extend([
            &mut self.wq_b,
            &mut self.wkv_a,
            &mut self.wk_b,
            &mut self.wv_b,
            &mut self.wo,
        ]);
        m.extend(indexer.into_iter().flatten());
        m
    }

    pub fn matrices(&self) -> Vec<&Tensor> {
        let mut m: Vec<&Tensor> = self.wq_a.iter().map(|(t, _)| t).collect();
        m.extend([&self.wq_b, &self.wkv_a, &self.wk_b, &self.wv_b, &self.wo]);
        if let Some(Sparse::Indexer(ix)) = &self.sparse {
            m.extend(ix.matrices());
        }
        m
    }
}

/// Whether a prompt batch of `n` tokens after `pos0` costs fewer multiply-adds per head with
/// the cached latents expanded into keys and values ([`Mla::attend_expanded`]) than in the
/// absorbed layout. Absorbed attention multiplies `rank + n_rot` key and `rank` value
/// elements per (query, position) and projects each query into the latent and each output
/// out of it (int8 products, counted at half an f32 one); expanded attention multiplies
/// `head_k` and `head_v` elements but first expands every cached position (f32 products).
fn expanded_is_cheaper(s: MlaShape, pos0: usize, n: usize) -> bool {
    let (rank, nope, dv) = (
        s.kv_lora_rank as f64,
        (s.head_k - s.n_rot) as f64,
        s.head_v as f64,
    );
    let n_f = n as f64;
    // Query-position pairs under the causal mask.
    let pairs = n_f * (pos0 as f64 + (n_f + 1.0) / 2.0);
    let absorbed = pairs * (2.0 * rank + s.n_rot as f64) + 0.5 * n_f * rank * (nope + dv);
    let expanded = pairs * (s.head_k as f64 + dv) + (pos0 + n) as f64 * rank * (nope + dv);
    n > 1 && s.head_k > s.n_rot && expanded < absorbed
}

/// Bytes of expanded keys and values one group of heads may hold at once
/// ([`Mla::attend_expanded`]): DeepSeek-V3's 128 heads at 32k positions would take 5 GB.
const EXPANDED_BYTES: usize = 256 << 20;

impl Mla {
    /// Attention of a prompt batch with every cached latent expanded into the heads' keys
    /// (`attn_k_b` per head, transposed, then the rotary key) and values (`attn_v_b`), as
    /// ik_llama.cpp's `-mla 3` runs prompt batches ([`MlaPrompts::Expanded`]): per (query,
    /// position) it multiplies `head_k + head_v` elements instead of the absorbed
    /// `2 * rank + n_rot`, at the cost of expanding all `pos0 + n` positions. The expansion is
    /// f32 (the weights dequantized, the latents as cached); the absorbed path's roundings of
    /// the projected query (to the cache type's dot partner) and of the attended latent (to
    /// `attn_v_b`'s) have no counterpart here, which the small fixtures amplify past
    /// llama.cpp's bounds on quantized files, so this is not the default. `q`: the batch's
    /// roped queries `[token][head][nope | rope]`; writes `[token][head][dv]` into `heads`.
    /// Heads go in groups whose expanded rows fit [`EXPANDED_BYTES`].
    fn attend_expanded(
        &self,
        par: &Parallel,
        q: &[f32],
        latent: CacheRows,
        pos0: usize,
        heads: &mut [f32],
    ) -> Result<()> {
        let s = self.shape;
        let (n_head, rank, n_rot, dk, dv) = (s.n_head, s.kv_lora_rank, s.n_rot, s.head_k, s.head_v);
        let nope = dk - n_rot;
        let n = q.len() / (n_head * dk);
        let n_pos = pos0 + n;
        let mut k_b = scratch::take(n_head * rank * nope);
        self.wk_b.to_f32_into(&mut k_b)?;
        let mut wk = scratch::take(n_head * nope * rank);
        par.for_each_range(n_head * nope, rank, &mut wk[..], rank, |rows, out| {
            for (i, row) in rows.zip(out.chunks_exact_mut(rank)) {
                let (h, j) = (i / nope, i % nope);
                for (r, v) in row.iter_mut().enumerate() {
                    *v = k_b[(h * rank + r) * nope + j];
                }
            }
        });
        drop(k_b);
        let mut wv = scratch::take(n_head * dv * rank);
        self.wv_b.to_f32_into(&mut wv)?;
        let mut lat = scratch::take(n_pos * rank);
        latent.block_to_f32(0, n_pos, 0, rank, &mut lat);
        let mut rope = scratch::take(n_pos * n_rot);
        latent.block_to_f32(0, n_pos, rank, n_rot, &mut rope);
        let per_head = n_pos * (dk + dv) * 4;
        let group = (EXPANDED_BYTES / per_head.max(1)).clamp(1, n_head);
        for h0 in (0..n_head).step_by(group) {
            let g = group.min(n_head - h0);
            let mut keys = scratch::take(n_pos * g * dk);
            let mut values = scratch::take(n_pos * g * dv);
            let expand = |w: &[f32], width: usize, stride: usize, out: &mut [f32]| {
                par.for_each_range(n_pos, g * width * rank, out, g * stride, |ps, o| {
                    let a = &lat[ps.start * rank..ps.end * rank];
                    for h in 0..g {
                        let b = &w[(h0 + h) * width * rank..][..width * rank];
                        let c = &mut o[h * stride..];
                        gemm_f32_abt(ps.len(), width, rank, a, rank, b, rank, c, g * stride, &[]);
                    }
                });
            };
            expand(&wk, nope, dk, &mut keys);
            expand(&wv, dv, dv, &mut values);
            par.for_each_range(n_pos, g * n_rot, &mut keys[..], g * dk, |ps, o| {
                for (p, row) in ps.zip(o.chunks_exact_mut(g * dk)) {
                    for k in row.chunks_exact_mut(dk) {
                        k[nope..].copy_from_slice(&rope[p * n_rot..][..n_rot]);
                    }
                }
            });
            let whole = g == n_head;
            let mut qg = scratch::take(if whole { 0 } else { n * g * dk });
            if !whole {
                for (t, out) in qg.chunks_exact_mut(g * dk).enumerate() {
                    out.copy_from_slice(&q[(t * n_head + h0) * dk..][..g * dk]);
                }
            }
            let mut og = scratch::take(if whole { 0 } else { n * g * dv });
            attend(
                AttnGeom {
                    n_head: g,
                    n_head_kv: g,
                    dk,
                    dv,
                    kq_scale: self.kq_scale,
                    pos0,
                    n_kv_batch: n_pos,
                },
                if whole { q } else { &qg },
                CacheRows::f32(&keys, g * dk),
                Some(CacheRows::f32(&values, g * dv)),
                None,
                if whole { &mut heads[..] } else { &mut og[..] },
                par,
            );
            if !whole {
                for (t, o) in og.chunks_exact(g * dv).enumerate() {
                    heads[(t * n_head + h0) * dv..][..g * dv].copy_from_slice(o);
                }
            }
        }
        Ok(())
    }
}

/// Tokens per chunk of a prompt batch's absorbed attention ([`Mla`]'s CPU side): a multiple
/// of 16 (the products' tiles), large enough that the products keep their batch kernels.
const ATTEND_CHUNK: usize = 128;

fn no_state() -> Error {
    Error::Model("MLA state without its rows".into())
}

impl Block for Mla {
    fn device(&self) -> DeviceId {
        self.device
    }

    fn cpu(&self, p: &mut Pass, h: &[f32], x: &mut [f32], state: &mut LayerState) -> Result<()> {
        let (c, par, n) = (p.c, p.par, p.n);
        let s = self.shape;
        let (n_head, rank, n_rot) = (s.n_head, s.kv_lora_rank, s.n_rot);
        let dk = s.head_k;
        let nope = dk - n_rot;
        let dv = s.head_v;

        // Work buffers from the thread's pool (`scratch`), each given back once dead, so a
        // prompt batch holds the absorbed queries and the latent outputs (tens of MB) but not
        // the rest at once.
        // Queries: optional low-rank compression (`qa`), then per head [nope | rope]; and the
        // latent + rotary key (`kv`) from the same input.
        let mut q = scratch::take(n * n_head * dk);
        let kw = rank + n_rot;
        let wkv_a = self.wkv_a.matrix()?;
        let wq_a = match &self.wq_a {
            Some((t, norm)) => Some((t.matrix()?, norm)),
            None => None,
        };
        let qa_width = wq_a.as_ref().map_or(0, |(m, _)| m.n_out);
        let first = match &wq_a {
            Some((m, _)) => m.act_type(),
            None => self.wq_b.matrix()?.act_type(),
        };
        let acts_h = QuantizedActs::new(par, first, c.n_embd, h);
        let mut qa_kv = scratch::take(n * (qa_width + kw));
        // One token: both products of the layer input in one parallel region.
        let fused = match &wq_a {
            Some((m, _)) if n == 1 && wkv_a.act_type() == acts_h.ty => {
                let x = acts_h.row(0);
                gemv_many(par, &[(*m, x), (wkv_a, x)], &mut qa_kv);
                true
            }
            _ => false,
        };
        let (qa, kv) = qa_kv.split_at_mut(n * qa_width);
        match &wq_a {
            Some((m, norm)) => {
                if !fused {
                    m.matmul_q(par, &acts_h, qa);
                    matmul_shared(&self.wkv_a, &acts_h, h, par, kv)?;
                }
                ops::rms_norm_mul_par(par, qa, norm, c.rms_eps);
                self.wq_b.matrix()?.matmul(par, qa, &mut q);
            }
            None => {
                self.wq_b.matrix()?.matmul_q(par, &acts_h, &mut q);
                matmul_shared(&self.wkv_a, &acts_h, h, par, kv)?;
            }
        }
        // The positions each query attends to (DSA), from the normed `q_a`.
        if let Some(Sparse::Indexer(ix)) = &self.sparse {
            let keys = state.indexer_keys.as_mut().ok_or_else(no_state)?;
            p.top_k = Some(ix.select_cpu(p, h, qa, keys)?);
        }
        // Borrowed out of the pass while the attention below reads it.
        let selected = match &self.sparse {
            Some(_) => {
                host_selection(p)?;
                p.top_k.take()
            }
            None => None,
        };
        let sel = match &selected {
            Some(Selected::Host(top)) => Some(top),
            _ => None,
        };

        // The latent + rotary keys of every token go into the cache first: each chunk of
        // queries below attends to the positions up to its own last token.
        ops::for_each_row(par, kv, kw, 4 * kw, |t, row| {
            c.rope.apply(&mut row[rank..], n_rot, 0, &p.rope[t]);
            ops::rms_norm_mul(&mut row[..rank], &self.kv_a_norm, c.rms_eps);
        });
        let latent = state.keys.as_mut().ok_or_else(no_state)?;
        latent.append(kv);
        drop(qa_kv);

        let mut heads = scratch::take(n * n_head * dv);
        // DSA's selection and the exact path keep the absorbed layout.
        let expand = par.mla_prompts() == MlaPrompts::Expanded
            && par.numerics() == Numerics::Fast
            && sel.is_none()
            && expanded_is_cheaper(s, p.pos0, n);
        if expand {
            // Queries [nope | rope] per head as they are: the keys come expanded.
            ops::for_each_row(
                par,
                &mut q[..],
                n_head * dk,
                4 * n_head * n_rot,
                |t, row| {
                    c.rope.apply(row, dk, nope, &p.rope[t]);
                },
            );
            self.attend_expanded(par, &q, latent.view(), p.pos0, &mut heads)?;
        } else {
            // Absorbed queries, attention over the latent and the heads' values, in chunks of
            // tokens: the absorbed queries and the attended latents are the largest buffers of a
            // prompt batch (n_head x (rank + n_rot) and n_head x rank per token). Chunks of a
            // multiple of 16 tokens keep every product's tiles where the whole batch has them;
            // the exact path and DSA's selection (rows by batch token) take the batch whole.
            let chunk = match par.numerics() {
                Numerics::Fast if sel.is_none() => ATTEND_CHUNK,
                _ => n,
            };
            let qw = rank + n_rot;
            for t0 in (0..n).step_by(chunk) {
                let t1 = (t0 + chunk).min(n);
                let m = t1 - t0;
                // Absorbed queries [latent (rank) | rope (n_rot)] per head.
                let q = &q[t0 * n_head * dk..t1 * n_head * dk];
                let mut qfull = scratch::take(m * n_head * qw);
                per_head_products(par, &self.wk_b, q, dk, true, &mut qfull, qw)?;
                // Each head's rope part goes after its absorbed query and rotates there.
                ops::for_each_row(
                    par,
                    &mut qfull,
                    n_head * qw,
                    4 * n_head * n_rot,
                    |t, row| {
                        let qt = &q[t * n_head * dk..(t + 1) * n_head * dk];
                        for (qh, fh) in qt.chunks_exact(dk).zip(row.chunks_exact_mut(qw)) {
                            fh[rank..].copy_from_slice(&qh[nope..]);
                        }
                        c.rope.apply(row, qw, rank, &p.rope[t0 + t]);
                    },
                );
                // MQA over the latent: one kv "head" of width rank + n_rot, values = its first
                // `rank`.
                let mut latent_out = scratch::take(m * n_head * rank);
                attend(
                    AttnGeom {
                        n_head,
                        n_head_kv: 1,
                        dk: qw,
                        dv: rank,
                        kq_scale: self.kq_scale,
                        pos0: p.pos0 + t0,
                        n_kv_batch: p.pos0 + n,
                    },
                    &qfull,
                    latent.view(),
                    None,
                    sel,
                    &mut latent_out,
                    par,
                );
                drop(qfull);
                // Per head: expand the attended latent with attn_v_b.
                let heads = &mut heads[t0 * n_head * dv..t1 * n_head * dv];
                per_head_products(par, &self.wv_b, &latent_out, rank, false, heads, dv)?;
            }
        }
        drop(q);
        if selected.is_some() {
            p.top_k = selected;
        }
        let mut o = scratch::take(n * c.n_embd);
        self.wo.matrix()?.matmul(par, &heads, &mut o);
        ops::add_assign_par(par, x, &o);
        Ok(())
    }

    fn gpu(
        &self,
        p: &mut Pass,
        id: DeviceId,
        h: DevPtr,
        x: DevPtr,
        state: &mut LayerState,
    ) -> Result<()> {
        let (c, n) = (p.c, p.n);
        let gpu = p.gpu.gpu(id)?;
        let s = self.shape;
        let (nh, rank, n_rot) = (s.n_head, s.kv_lora_rank, s.n_rot);
        let dk = s.head_k;
        let nope = dk - n_rot;
        let dv = s.head_v;
        let q = p.gpu.buf(id, "q", n * nh * dk)?;
        // The latent and rope part of the keys, from the quantization of `h` the first query
        // product takes.
        let kw = rank + n_rot;
        let kvr = p.gpu.buf(id, "kv", n * kw)?;
        let wkv_a = weight(&self.wkv_a)?;
        let mut qa_dev = None;
        match &self.wq_a {
            Some((wq_a, norm)) => {
                let wa = weight(wq_a)?;
                let qa = p.gpu.buf(id, "q_a", n * wa.n_out)?;
                gpu.mul_mats(&[(&wa, qa, wa.n_out), (&wkv_a, kvr, kw)], h, c.n_embd, n)?;
                let norm = norm.ptr("attn_q_a_norm")?;
                gpu.rms_norm(qa, wa.n_out, norm, qa, wa.n_out, n, wa.n_out, c.rms_eps)?;
                gpu.mul_mat(&weight(&self.wq_b)?, 1, qa, wa.n_out, 0, q, nh * dk, 0, n)?;
                qa_dev = Some(qa);
            }
            None => {
                let wq = weight(&self.wq_b)?;
                gpu.mul_mats(&[(&wq, q, nh * dk), (&wkv_a, kvr, kw)], h, c.n_embd, n)?;
            }
        }
        // The positions each query attends to (DSA), from the normed `q_a`.
        if let Some(Sparse::Indexer(ix)) = &self.sparse {
            let keys = state.indexer_keys.as_ref().ok_or_else(no_state)?;
            let qa = qa_dev.ok_or_else(|| Error::Model("a DSA indexer needs MLA's q_a".into()))?;
            p.top_k = Some(ix.select_gpu(p, id, h, qa, keys)?);
        }
        let sel = match &self.sparse {
            Some(_) => gpu_selection(p, id)?,
            None => None,
        };
        // Absorbed queries [latent | rope] per head: attn_k_b maps each head's nope part.
        let qw = rank + n_rot;
        let qfull = p.gpu.buf(id, "q_full", n * nh * qw)?;
        let wk_b = weight(&self.wk_b)?;
        gpu.mul_mat(&wk_b, nh, q, nh * dk, dk, qfull, nh * qw, qw, n)?;
        let cs = p.gpu.rope_table(id)?;
        let neox = c.rope.kind == RopeKind::Neox;
        let pairs = p.gpu.n_pairs;
        gpu.rope(q, cs, n, nh, dk, nh * dk, nope, pairs, neox)?;
        gpu.copy_rows(
            qfull.offset::<f32>(rank),
            qw,
            q.offset::<f32>(nope),
            dk,
            n * nh,
            n_rot,
        )?;
        gpu.rope(kvr, cs, n, 1, kw, kw, rank, pairs, neox)?;
        gpu.rms_norm(
            kvr,
            kw,
            self.kv_a_norm.ptr("attn_kv_a_norm")?,
            kvr,
            kw,
            n,
            rank,
            c.rms_eps,
        )?;
        let latent = state.keys.as_ref().ok_or_else(no_state)?;
        let kb = latent.gpu().ok_or_else(|| {
            Error::Model(format!(
                "attention runs on {} but its KV cache is not there",
                gpu.name()
            ))
        })?;
        gpu.kv_store(
            kb.at(p.pos0 * latent.row_bytes()),
            latent.ty,
            kvr,
            n,
            kw,
            kw,
        )?;
        let out = p.gpu.buf(id, "latent_out", n * nh * rank)?;
        gpu.attention(
            AttnShape {
                n_head: nh,
                n_head_kv: 1,
                dk: qw,
                dv: rank,
                pos0: p.pos0,
                scale: self.kq_scale,
            },
            qfull,
            KvView {
                k: kb.ptr(),
                v: kb.ptr(),
                k_row: kw,
                v_row: kw,
                k_type: latent.ty,
                v_type: latent.ty,
            },
            sel,
            out,
            n,
        )?;
        let heads = p.gpu.buf(id, "heads", n * nh * dv)?;
        gpu.mul_mat(
            &weight(&self.wv_b)?,
            nh,
            out,
            nh * rank,
            rank,
            heads,
            nh * dv,
            dv,
            n,
        )?;
        let o = p.gpu.buf(id, "o", n * c.n_embd)?;
        gpu.mul_mat(&weight(&self.wo)?, 1, heads, nh * dv, 0, o, c.n_embd, 0, n)?;
        gpu.add(x, o, n * c.n_embd)?;
        Ok(())
    }
}
