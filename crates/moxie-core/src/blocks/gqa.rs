//! Grouped-query attention (qwen3moe, glm4moe, qwen3next's full-attention layers): q/k/v
//! projections with optional biases and per-head q/k RMS norms, RoPE on the first
//! `rope.n_dims` of each head, causal softmax attention over the layer's cached keys and
//! values, output projection. Gated (qwen3next): `attn_q` gives each head's query followed by
//! as many gate values, and the attention output is multiplied by their sigmoid before the
//! output projection.

use moxie_gpu::ops::{AttnShape, KvView};
use moxie_gpu::DevPtr;

use crate::blocks::attention::{attend, AttnGeom};
use crate::blocks::matmul_shared;
use crate::device::DeviceId;
use crate::forward::{Block, Pass};
use crate::gpu_pass::weight;
use crate::loader::Vector;
use crate::ops::{self, RopeKind};
use crate::state::{LayerState, LayerStateSpec, RowSpec};
use crate::tensor::{gemv_many, QuantizedActs, Tensor};
use crate::{Error, Result};

pub struct Gqa {
    /// Where its weights (and the layer's state) are.
    pub device: DeviceId,
    pub wq: Tensor,
    pub wk: Tensor,
    pub wv: Tensor,
    pub bq: Option<Vector>,
    pub bk: Option<Vector>,
    pub bv: Option<Vector>,
    pub q_norm: Option<Vector>,
    pub k_norm: Option<Vector>,
    pub wo: Tensor,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Per-head key (= query) and value widths.
    pub head_k: usize,
    pub head_v: usize,
    pub kq_scale: f32,
    /// `attn_q` holds [query | gate] per head; the output is scaled by sigmoid(gate).
    pub gated: bool,
}

impl Gqa {
    pub fn state_spec(&self) -> LayerStateSpec {
        LayerStateSpec {
            keys: Some(RowSpec {
                width: self.n_head_kv * self.head_k,
                head: self.head_k,
            }),
            values: Some(RowSpec {
                width: self.n_head_kv * self.head_v,
                head: self.head_v,
            }),
            ..Default::default()
        }
    }

    pub fn matrices(&self) -> Vec<&Tensor> {
        vec![&self.wq, &self.wk, &self.wv, &self.wo]
    }

    /// [`Gqa::matrices`], to replace (load-time repacking).
    pub fn matrices_mut(&mut self) -> [&mut Tensor; 4] {
        [&mut self.wq, &mut self.wk, &mut self.wv, &mut self.wo]
    }
}

/// The layer's rows, which its attention block declared.
fn missing(what: &str) -> Error {
    Error::Model(format!("attention state without {what}"))
}

impl Block for Gqa {
    fn device(&self) -> DeviceId {
        self.device
    }

    fn cpu(&self, p: &mut Pass, h: &[f32], x: &mut [f32], state: &mut LayerState) -> Result<()> {
        let (c, par, n) = (p.c, p.par, p.n);
        let (hd, n_kv) = (self.head_k, self.n_head_kv);
        let q_len = n * self.n_head * hd;
        let k_len = n * n_kv * hd;
        let wq = self.wq.matrix()?;
        let (wk, wv) = (self.wk.matrix()?, self.wv.matrix()?);
        let acts = QuantizedActs::new(par, wq.act_type(), c.n_embd, h);
        // wq's rows ([query | gate] per head when gated), then k, then v: one token's three
        // products are `gemv_many`'s contiguous outputs.
        let first = if self.gated { 2 * q_len } else { q_len };
        let mut qkv = vec![0f32; first + k_len + n * n_kv * self.head_v];
        let fused = n == 1 && wk.act_type() == acts.ty && wv.act_type() == acts.ty;
        if fused {
            // One token: the three products of the input in one parallel region.
            let x = acts.row(0);
            gemv_many(par, &[(wq, x), (wk, x), (wv, x)], &mut qkv);
        }
        let (wq_out, kv) = qkv.split_at_mut(first);
        let (k, v) = kv.split_at_mut(k_len);
        if !fused {
            wq.matmul_q(par, &acts, wq_out);
            matmul_shared(&self.wk, &acts, h, par, k)?;
            matmul_shared(&self.wv, &acts, h, par, v)?;
        }
        let (mut split_q, mut gate) = (Vec::new(), None);
        if self.gated {
            // Split into the query heads and the gates.
            split_q = vec![0f32; q_len];
            let mut g = vec![0f32; q_len];
            for ((both, qh), gh) in wq_out
                .chunks_exact(2 * hd)
                .zip(split_q.chunks_exact_mut(hd))
                .zip(g.chunks_exact_mut(hd))
            {
                qh.copy_from_slice(&both[..hd]);
                gh.copy_from_slice(&both[hd..]);
            }
            gate = Some(g);
        }
        let q: &mut [f32] = if self.gated { &mut split_q } else { wq_out };
        if let Some(b) = &self.bq {
            ops::add_bias(q, b);
        }
        if let Some(b) = &self.bk {
            ops::add_bias(k, b);
        }
        if let Some(b) = &self.bv {
            ops::add_bias(v, b);
        }
        // Per token (threads split the batch's rows): the norms of each head, then RoPE.
        for (x, heads, norm) in [
            (&mut *q, self.n_head, &self.q_norm),
            (&mut *k, n_kv, &self.k_norm),
        ] {
            ops::for_each_row(par, x, heads * hd, 8 * heads * hd, |t, row| {
                if let Some(w) = norm {
                    ops::rms_norm_mul(row, w, c.rms_eps);
                }
                c.rope.apply(row, hd, 0, &p.rope[t]);
            });
        }
        let keys = state.keys.as_mut().ok_or_else(|| missing("keys"))?;
        keys.append(k);
        let values = state.values.as_mut().ok_or_else(|| missing("values"))?;
        values.append(v);
        let (keys, values) = (
            state.keys.as_ref().expect("checked").view(),
            state.values.as_ref().expect("checked").view(),
        );
        let mut out = vec![0f32; n * self.n_head * self.head_v];
        attend(
            AttnGeom {
                n_head: self.n_head,
                n_head_kv: n_kv,
                dk: hd,
                dv: self.head_v,
                kq_scale: self.kq_scale,
                pos0: p.pos0,
                n_kv_batch: 0,
            },
            q,
            keys,
            Some(values),
            None,
            &mut out,
            par,
        );
        if let Some(gate) = gate {
            // ggml: sigmoid of the gates, then an element-wise product.
            for (v, &g) in out.iter_mut().zip(&gate) {
                *v *= ops::sigmoid(g);
            }
        }
        let mut o = vec![0f32; n * c.n_embd];
        self.wo.matrix()?.matmul(par, &out, &mut o);
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
        let (hd, dv, nh, nkv) = (self.head_k, self.head_v, self.n_head, self.n_head_kv);
        let q = p.gpu.buf(id, "q", n * nh * hd)?;
        let k = p.gpu.buf(id, "k", n * nkv * hd)?;
        let v = p.gpu.buf(id, "v", n * nkv * dv)?;
        // q (with its gates, [query | gate] per head, where gated), k and v from one
        // quantization of `h`.
        let (wq, wk, wv) = (weight(&self.wq)?, weight(&self.wk)?, weight(&self.wv)?);
        let qg = match self.gated {
            true => p.gpu.buf(id, "q_gate_in", n * nh * 2 * hd)?,
            false => q,
        };
        gpu.mul_mats(
            &[(&wq, qg, wq.n_out), (&wk, k, nkv * hd), (&wv, v, nkv * dv)],
            h,
            c.n_embd,
            n,
        )?;
        let gate = if self.gated {
            // Split into the query heads and the gates.
            let gate = p.gpu.buf(id, "q_gate", n * nh * hd)?;
            gpu.copy_rows(q, hd, qg, 2 * hd, n * nh, hd)?;
            gpu.copy_rows(gate, hd, qg.offset::<f32>(hd), 2 * hd, n * nh, hd)?;
            Some(gate)
        } else {
            None
        };
        for (b, y, width, what) in [
            (&self.bq, q, nh * hd, "attn_q.bias"),
            (&self.bk, k, nkv * hd, "attn_k.bias"),
            (&self.bv, v, nkv * dv, "attn_v.bias"),
        ] {
            if let Some(b) = b {
                gpu.add_bias(y, b.ptr(what)?, n * width, width)?;
            }
        }
        if let Some(w) = &self.q_norm {
            gpu.rms_norm(q, hd, w.ptr("attn_q_norm")?, q, hd, n * nh, hd, c.rms_eps)?;
        }
        if let Some(w) = &self.k_norm {
            gpu.rms_norm(k, hd, w.ptr("attn_k_norm")?, k, hd, n * nkv, hd, c.rms_eps)?;
        }
        let cs = p.gpu.rope_table(id)?;
        let neox = c.rope.kind == RopeKind::Neox;
        let pairs = p.gpu.n_pairs;
        gpu.rope(q, cs, n, nh, hd, nh * hd, 0, pairs, neox)?;
        gpu.rope(k, cs, n, nkv, hd, nkv * hd, 0, pairs, neox)?;
        let (keys, values) = match (&state.keys, &state.values) {
            (Some(k), Some(v)) => (k, v),
            _ => return Err(missing("keys and values")),
        };
        let (kb, vb) = match (keys.gpu(), values.gpu()) {
            (Some(k), Some(v)) => (k, v),
            _ => {
                return Err(Error::Model(format!(
                    "attention runs on {} but its KV cache is not there",
                    gpu.name()
                )))
            }
        };
        let (kw, vw) = (nkv * hd, nkv * dv);
        gpu.kv_store(kb.at(p.pos0 * keys.row_bytes()), keys.ty, k, n, kw, kw)?;
        gpu.kv_store(vb.at(p.pos0 * values.row_bytes()), values.ty, v, n, vw, vw)?;
        let out = p.gpu.buf(id, "attn_out", n * nh * dv)?;
        gpu.attention(
            AttnShape {
                n_head: nh,
                n_head_kv: nkv,
                dk: hd,
                dv,
                pos0: p.pos0,
                scale: self.kq_scale,
            },
            q,
            KvView {
                k: kb.ptr(),
                v: vb.ptr(),
                k_row: kw,
                v_row: vw,
                k_type: keys.ty,
                v_type: values.ty,
            },
            None,
            out,
            n,
        )?;
        if let Some(gate) = gate {
            gpu.mul_sigmoid(out, gate, n * nh * dv, 1)?;
        }
        let o = p.gpu.buf(id, "o", n * c.n_embd)?;
        gpu.mul_mat(&weight(&self.wo)?, 1, out, nh * dv, 0, o, c.n_embd, 0, n)?;
        gpu.add(x, o, n * c.n_embd)?;
        Ok(())
    }
}
