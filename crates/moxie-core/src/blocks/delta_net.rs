//! Gated DeltaNet linear attention (qwen3next's recurrent layers), as llama.cpp's graph with
//! its fused `GATED_DELTA_NET` op computes it, for a batch and for one token alike:
//!
//! 1. projections of the normed input: `attn_qkv` (q | k | v, the convolution's channels),
//!    `attn_gate` (z) and `ssm_ba` (per key head β for its value heads, then α for them);
//! 2. a depthwise causal convolution over the channels (`ssm_conv1d`, `conv_kernel` taps)
//!    continuing the sequence's convolution state, then SiLU;
//! 3. q and k L2-normalised per key head; each key head serves `n_v / n_k` consecutive value
//!    heads;
//! 4. per value head the delta rule on a `d × d` state `S`, token by token:
//!    `S *= exp(g)`, `S += k (β (v - Sᵀk))ᵀ`, `o = Sᵀq / √d`, with `β = sigmoid(b)` and
//!    `g = softplus(α + dt_bias) · ssm_a` (`ssm_a` is stored negative);
//! 5. `o` RMS-normed per head (`ssm_norm`), times SiLU(z), through `ssm_out`.
//!
//! The state of a sequence ([`crate::state::Recurrent`], f32):
//! - `conv`: the last `conv_kernel - 1` inputs of every channel, channel after channel, oldest
//!   first (`conv[c * (K - 1) + i]`), as llama.cpp's `r` cache;
//! - `ssm`: per value head a `d × d` matrix stored transposed, as ggml's op keeps it:
//!   `ssm[h * d * d + j * d + i] = S_h[i][j]`, so that row `j` (column `j` of `S`) is
//!   contiguous for the dot products with `k` and `q`.
//!
//! Both are read and overwritten by every forward pass; [`crate::state::SeqState`] keeps
//! copies at checkpoints for prefix reuse. Exact numerics: the convolution sums each channel's
//! taps with fused multiply-adds (GCC contracts ggml's scalar loop), the recurrence uses
//! `ggml_vec_dot_f32`'s order for its dot products, fused multiply-adds for the rank-1
//! update and libm's `expf`, SiLU is ggml's vector/tail split per row. The GPU kernels run the
//! same steps in f32 (not bit-identical).

use moxie_gpu::ops::DeltaNetDims;
use moxie_gpu::DevPtr;

use crate::blocks::matmul_shared;
use crate::device::DeviceId;
use crate::forward::{Block, Pass};
use crate::gpu_pass::weight;
use crate::loader::Vector;
use crate::ops;
use crate::parallel::Parallel;
use crate::state::{LayerState, LayerStateSpec, RecurrentSpec};
use crate::tensor::{QuantizedActs, Tensor};
use crate::{Error, Result};

/// The sizes of a gated DeltaNet layer (llama.cpp's `ssm.*` keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNetShape {
    /// Key (and query) heads (`ssm.group_count`).
    pub n_k_heads: usize,
    /// Value heads, each with its own state (`ssm.time_step_rank`); a multiple of `n_k_heads`.
    pub n_v_heads: usize,
    /// Key and value width per head, the state's side (`ssm.state_size`).
    pub head_dim: usize,
    /// Convolution taps (`ssm.conv_kernel`).
    pub conv_kernel: usize,
}

impl DeltaNetShape {
    pub fn key_dim(&self) -> usize {
        self.n_k_heads * self.head_dim
    }

    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.head_dim
    }

    /// The convolution's channels: q, k and v.
    pub fn channels(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// The state a sequence keeps for one layer.
    pub fn recurrent(&self) -> RecurrentSpec {
        RecurrentSpec {
            conv: (self.conv_kernel - 1) * self.channels(),
            ssm: self.n_v_heads * self.head_dim * self.head_dim,
        }
    }
}

pub struct DeltaNet {
    /// Where its weights (and the layer's state) are.
    pub device: DeviceId,
    pub shape: DeltaNetShape,
    /// `attn_qkv`: the convolution's input channels (q | k | v).
    pub wqkv: Tensor,
    /// `attn_gate`: z, the output gate.
    pub wz: Tensor,
    /// `ssm_ba`: per key head, β then α of each of its value heads.
    pub wba: Tensor,
    /// `ssm_conv1d`: `conv_kernel` taps per channel, channel after channel.
    pub conv: Vector,
    /// `ssm_dt.bias`, per value head.
    pub dt_bias: Vector,
    /// `ssm_a` (= -exp(A_log)), per value head.
    pub a: Vector,
    /// `ssm_norm`, over one head's output.
    pub norm: Vector,
    /// `ssm_out`.
    pub wo: Tensor,
    pub rms_eps: f32,
}

impl DeltaNet {
    pub fn state_spec(&self) -> LayerStateSpec {
        LayerStateSpec {
            recurrent: Some(self.shape.recurrent()),
            ..Default::default()
        }
    }

    pub fn matrices(&self) -> Vec<&Tensor> {
        vec![&self.wqkv, &self.wz, &self.wba, &self.wo]
    }

    /// [`DeltaNet::matrices`], to replace.
    pub fn matrices_mut(&mut self) -> [&mut Tensor; 4] {
        [&mut self.wqkv, &mut self.wz, &mut self.wba, &mut self.wo]
    }

    /// β and g per token and value head from the `ssm_ba` projection (`2 * n_v` per token).
    fn gates(&self, ba: &[f32], beta: &mut [f32], g: &mut [f32]) {
        let s = &self.shape;
        let r = s.n_v_heads / s.n_k_heads;
        let per_token = ba.chunks_exact(2 * s.n_v_heads);
        for ((row, bt), gt) in per_token
            .zip(beta.chunks_exact_mut(s.n_v_heads))
            .zip(g.chunks_exact_mut(s.n_v_heads))
        {
            for (vh, (b, g)) in bt.iter_mut().zip(gt.iter_mut()).enumerate() {
                let (kh, j) = (vh / r, vh % r);
                *b = ops::sigmoid(row[kh * 2 * r + j]);
                *g = ops::softplus(row[kh * 2 * r + r + j] + self.dt_bias[vh]) * self.a[vh];
            }
        }
    }
}

/// The layer's recurrent state, which its block declared.
fn missing() -> Error {
    Error::Model("gated DeltaNet layer without recurrent state".into())
}

/// The causal convolution of `n` tokens' channel rows `x` (`ch` per token) continuing `state`
/// (`k - 1` past inputs per channel, updated to the last ones), with SiLU, into `out`. Tap `i`
/// of a channel weighs the input `k - 1 - i` tokens back; each output sums its taps in order
/// with fused multiply-adds.
fn conv_silu(
    par: &Parallel,
    x: &[f32],
    state: &mut [f32],
    w: &[f32],
    k: usize,
    ch: usize,
    out: &mut [f32],
) {
    let past = k - 1;
    let n = x.len() / ch;
    // Input `j` of the window of channel `c`: the state, then the batch.
    let input = |state: &[f32], c: usize, j: usize| {
        if j < past {
            state[c * past + j]
        } else {
            x[(j - past) * ch + c]
        }
    };
    let st: &[f32] = state;
    par.for_each_range(n, ch * k, out, ch, |toks, o| {
        for (t, row) in toks.zip(o.chunks_exact_mut(ch)) {
            for (c, y) in row.iter_mut().enumerate() {
                let taps = &w[c * k..(c + 1) * k];
                *y = taps
                    .iter()
                    .enumerate()
                    .fold(0.0f32, |acc, (i, &wi)| input(st, c, t + i).mul_add(wi, acc));
            }
            ops::silu_row(row);
        }
    });
    // The window's last `k - 1` inputs, in place: input `n + i` is at or after state slot
    // `i`, so ascending `i` reads each old slot before it is overwritten.
    for c in 0..ch {
        for i in 0..past {
            state[c * past + i] = input(state, c, n + i);
        }
    }
}

/// Where one value head reads its inputs: the convolved channel rows (`ch` per token, q and k
/// already L2-normed) at its key head's q and k and its own v, and its β and g (one per token,
/// `stride` apart).
struct HeadInputs<'a> {
    rows: &'a [f32],
    ch: usize,
    q: usize,
    k: usize,
    v: usize,
    beta: &'a [f32],
    g: &'a [f32],
    stride: usize,
}

/// The delta rule over the batch for one value head: `s` is its state (transposed, see the
/// module documentation), `out` receives `d` values per token. As ggml's fused op: scale the
/// state by `exp(g)`, then per row `j` the delta `(v[j] - s_j · k) β`, the rank-1 update
/// `s_j += delta[j] k` (fused multiply-adds), and `out[j] = (s_j · q) / √d`.
fn delta_rule(s: &mut [f32], d: usize, x: &HeadInputs, out: &mut [f32], delta: &mut [f32]) {
    fn bytes(v: &[f32]) -> &[u8] {
        bytemuck::cast_slice(v)
    }
    let dot = moxie_quant::vec_dot_fn(moxie_quant::GgmlType::F32).expect("f32 has a dot product");
    let scale = 1.0 / (d as f32).sqrt();
    for (t, o) in out.chunks_exact_mut(d).enumerate() {
        let row = &x.rows[t * x.ch..(t + 1) * x.ch];
        let (q, k, v) = (&row[x.q..x.q + d], &row[x.k..x.k + d], &row[x.v..x.v + d]);
        let decay = x.g[t * x.stride].exp();
        s.iter_mut().for_each(|e| *e *= decay);
        let beta = x.beta[t * x.stride];
        for ((sj, dj), &vj) in s.chunks_exact(d).zip(delta.iter_mut()).zip(v) {
            *dj = (vj - dot(d, bytes(sj), bytes(k))) * beta;
        }
        for (sj, &dj) in s.chunks_exact_mut(d).zip(delta.iter()) {
            for (e, &ki) in sj.iter_mut().zip(k) {
                *e = ki.mul_add(dj, *e);
            }
        }
        for (sj, oj) in s.chunks_exact(d).zip(o.iter_mut()) {
            *oj = dot(d, bytes(sj), bytes(q)) * scale;
        }
    }
}

impl Block for DeltaNet {
    fn device(&self) -> DeviceId {
        self.device
    }

    fn cpu(&self, p: &mut Pass, h: &[f32], x: &mut [f32], state: &mut LayerState) -> Result<()> {
        let (c, par, n) = (p.c, p.par, p.n);
        let s = self.shape;
        let (d, nv, ch) = (s.head_dim, s.n_v_heads, s.channels());
        let (key_dim, value_dim) = (s.key_dim(), s.value_dim());
        let wqkv = self.wqkv.matrix()?;
        let acts = QuantizedActs::new(par, wqkv.act_type(), c.n_embd, h);
        let mut qkv = vec![0f32; n * ch];
        wqkv.matmul_q(par, &acts, &mut qkv);
        let mut z = vec![0f32; n * value_dim];
        matmul_shared(&self.wz, &acts, h, par, &mut z)?;
        let mut ba = vec![0f32; n * 2 * nv];
        matmul_shared(&self.wba, &acts, h, par, &mut ba)?;
        let (mut beta, mut g) = (vec![0f32; n * nv], vec![0f32; n * nv]);
        self.gates(&ba, &mut beta, &mut g);

        let rec = state.recurrent.as_mut().ok_or_else(missing)?;
        let mut conv = vec![0f32; n * ch];
        conv_silu(
            par,
            &qkv,
            &mut rec.conv,
            &self.conv,
            s.conv_kernel,
            ch,
            &mut conv,
        );
        for row in conv.chunks_exact_mut(ch) {
            ops::l2_norm(&mut row[..2 * key_dim], d, self.rms_eps);
        }

        // Value heads in parallel, each through all tokens; outputs head-major, then token-major.
        let mut by_head = vec![0f32; nv * n * d];
        let r = nv / s.n_k_heads;
        let mut heads: Vec<(&mut [f32], &mut [f32])> = rec
            .ssm
            .chunks_exact_mut(d * d)
            .zip(by_head.chunks_exact_mut(n * d))
            .collect();
        par.for_each_range(nv, n * 4 * d * d, &mut heads, 1, |vhs, items| {
            let mut delta = vec![0f32; d];
            for (vh, (st, out)) in vhs.zip(items.iter_mut()) {
                let kh = vh / r;
                let inputs = HeadInputs {
                    rows: &conv,
                    ch,
                    q: kh * d,
                    k: key_dim + kh * d,
                    v: 2 * key_dim + vh * d,
                    beta: &beta[vh..],
                    g: &g[vh..],
                    stride: nv,
                };
                delta_rule(st, d, &inputs, out, &mut delta);
            }
        });
        let mut o = vec![0f32; n * value_dim];
        for (vh, head) in by_head.chunks_exact(n * d).enumerate() {
            for (t, src) in head.chunks_exact(d).enumerate() {
                o[(t * nv + vh) * d..][..d].copy_from_slice(src);
            }
        }

        // Gated output norm: RMS norm per head times SiLU(z) (SiLU row by row of a head).
        ops::rms_norm_mul(&mut o, &self.norm, self.rms_eps);
        for zh in z.chunks_exact_mut(d) {
            ops::silu_row(zh);
        }
        for (v, &zv) in o.iter_mut().zip(&z) {
            *v *= zv;
        }
        let mut y = vec![0f32; n * c.n_embd];
        self.wo.matrix()?.matmul(par, &o, &mut y);
        ops::add_assign_par(par, x, &y);
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
        let dims = DeltaNetDims {
            n_k: s.n_k_heads,
            n_v: s.n_v_heads,
            d: s.head_dim,
        };
        let (nv, ch, vd, e) = (s.n_v_heads, s.channels(), s.value_dim(), c.n_embd);
        let rec = state.recurrent.as_ref().ok_or_else(missing)?;
        let (conv_state, ssm) = rec.gpu().ok_or_else(|| {
            Error::Model(format!(
                "gated DeltaNet runs on {} but its state is not there",
                gpu.name()
            ))
        })?;
        let qkv = p.gpu.buf(id, "dn_qkv", n * ch)?;
        let z = p.gpu.buf(id, "dn_z", n * vd)?;
        let ba = p.gpu.buf(id, "dn_ba", n * 2 * nv)?;
        let (wqkv, wz, wba) = (weight(&self.wqkv)?, weight(&self.wz)?, weight(&self.wba)?);
        gpu.mul_mats(
            &[(&wqkv, qkv, ch), (&wz, z, vd), (&wba, ba, 2 * nv)],
            h,
            e,
            n,
        )?;
        let beta = p.gpu.buf(id, "dn_beta", n * nv)?;
        let g = p.gpu.buf(id, "dn_g", n * nv)?;
        let (dt_bias, a) = (self.dt_bias.ptr("ssm_dt.bias")?, self.a.ptr("ssm_a")?);
        gpu.delta_net_gates(dims, ba, dt_bias, a, beta, g, n)?;
        let conv = p.gpu.buf(id, "dn_conv", n * ch)?;
        let taps = self.conv.ptr("ssm_conv1d")?;
        gpu.ssm_conv_silu(qkv, conv_state.ptr(), taps, conv, n, ch, s.conv_kernel)?;
        let o = p.gpu.buf(id, "dn_out", n * vd)?;
        gpu.gated_delta_net(dims, conv, beta, g, ssm.ptr(), o, n, self.rms_eps)?;
        // Gated output norm: RMS norm per head, then z = silu(z) * that.
        let d = s.head_dim;
        let norm = self.norm.ptr("ssm_norm")?;
        gpu.rms_norm(o, d, norm, o, d, n * nv, d, self.rms_eps)?;
        gpu.swiglu(z, o, n * vd)?;
        let y = p.gpu.buf(id, "dn_y", n * e)?;
        gpu.mul_mat(&weight(&self.wo)?, 1, z, vd, 0, y, e, 0, n)?;
        gpu.add(x, y, n * e)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// The convolution and the delta rule continue their state exactly: a batch split in
    /// parts (one shorter than the convolution window) gives the whole batch's outputs and
    /// final state bit for bit, as llama.cpp's fused op does for prompt and decode alike.
    #[test]
    fn split_batches_continue_the_state_bit_for_bit() {
        let (n_k, n_v, d, k) = (2, 4, 32, 4);
        let (key_dim, ch) = (n_k * d, (2 * n_k + n_v) * d);
        let n = 9;
        let x = values(n * ch, 1);
        let w = values(ch * k, 2);
        let beta: Vec<f32> = values(n * n_v, 3)
            .iter()
            .map(|&v| ops::sigmoid(v))
            .collect();
        let g: Vec<f32> = values(n * n_v, 4).iter().map(|v| -v.abs()).collect();
        let par = Parallel::new(2);
        let run = |parts: &[usize]| {
            let mut conv_state = values(ch * (k - 1), 5);
            let mut ssm = values(n_v * d * d, 6);
            let mut outs = vec![0f32; n * n_v * d];
            let mut t0 = 0;
            for &nt in parts {
                let mut conv = vec![0f32; nt * ch];
                let xs = &x[t0 * ch..(t0 + nt) * ch];
                conv_silu(&par, xs, &mut conv_state, &w, k, ch, &mut conv);
                for row in conv.chunks_exact_mut(ch) {
                    ops::l2_norm(&mut row[..2 * key_dim], d, 1e-6);
                }
                for vh in 0..n_v {
                    let kh = vh / (n_v / n_k);
                    let inputs = HeadInputs {
                        rows: &conv,
                        ch,
                        q: kh * d,
                        k: key_dim + kh * d,
                        v: 2 * key_dim + vh * d,
                        beta: &beta[t0 * n_v + vh..],
                        g: &g[t0 * n_v + vh..],
                        stride: n_v,
                    };
                    let mut out = vec![0f32; nt * d];
                    let st = &mut ssm[vh * d * d..(vh + 1) * d * d];
                    delta_rule(st, d, &inputs, &mut out, &mut vec![0f32; d]);
                    for (t, o) in out.chunks_exact(d).enumerate() {
                        outs[((t0 + t) * n_v + vh) * d..][..d].copy_from_slice(o);
                    }
                }
                t0 += nt;
            }
            (outs, conv_state, ssm)
        };
        let whole = run(&[n]);
        let split = run(&[5, 1, 2, 1]);
        assert!(whole.0 == split.0, "outputs differ");
        assert!(whole.1 == split.1, "convolution states differ");
        assert!(whole.2 == split.2, "DeltaNet states differ");
    }
}
