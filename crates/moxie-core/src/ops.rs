//! Element-wise and row-wise operations of the forward pass, written to follow ggml's CPU
//! numerics (accumulation precision, operation order) so that logits match llama.cpp.

/// RMS norm of each row of `x` (row length `w.len()`), multiplied by `w`, written in place.
/// ggml accumulates the sum of squares in f64 and scales by `1/sqrt(mean + eps)` in f32.
pub fn rms_norm_mul(x: &mut [f32], w: &[f32], eps: f32) {
    let n = w.len();
    for row in x.chunks_exact_mut(n) {
        let sum: f64 = row.iter().map(|&v| (v * v) as f64).sum();
        let mean = (sum / n as f64) as f32;
        let scale = 1.0f32 / (mean + eps).sqrt();
        for (v, &g) in row.iter_mut().zip(w) {
            *v = (*v * scale) * g;
        }
    }
}

/// [`rms_norm_mul`] with the rows split over `par`'s threads (the same values: each row is
/// normed alone).
pub fn rms_norm_mul_par(par: &crate::parallel::Parallel, x: &mut [f32], w: &[f32], eps: f32) {
    let n = w.len();
    par.for_each_range(x.len() / n, 4 * n, x, n, |_, rows| {
        rms_norm_mul(rows, w, eps)
    });
}

/// [`rms_norm_mul`] of the rows of `src` into `dst` (resized to match, without clearing what it
/// held: every value is written), over `par`'s threads: a prompt batch's copy of the residual
/// stream is made by the threads that norm it, not by the main thread first.
pub fn rms_norm_mul_into_par(
    par: &crate::parallel::Parallel,
    src: &[f32],
    dst: &mut Vec<f32>,
    w: &[f32],
    eps: f32,
) {
    let n = w.len();
    dst.resize(src.len(), 0.0);
    par.for_each_range(src.len() / n, 5 * n, dst, n, |rows, out| {
        out.copy_from_slice(&src[rows.start * n..rows.end * n]);
        rms_norm_mul(out, w, eps)
    });
}

/// `f(t, row t)` for every row of `x` (`row_len` values each) over `par`'s threads, with
/// `work` operations a row: per-token work of a batch (RoPE, norms) off the main thread alone.
pub fn for_each_row(
    par: &crate::parallel::Parallel,
    x: &mut [f32],
    row_len: usize,
    work: usize,
    f: impl Fn(usize, &mut [f32]) + Sync,
) {
    par.for_each_range(x.len() / row_len, work, x, row_len, |toks, rows| {
        for (t, row) in toks.zip(rows.chunks_exact_mut(row_len)) {
            f(t, row);
        }
    });
}

pub use moxie_quant::vexp::ggml_v_expf;

/// Softmax of one row in place, as ggml's CPU soft_max: subtract the max, exponentiate
/// (`ggml_v_expf` on 16-lane chunks, libm on the tail), sum in f64 per chunk, scale by 1/sum.
/// `-inf` entries (masked) become 0.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    let n16 = x.len() / 16 * 16;
    x[..n16].iter_mut().for_each(|v| *v -= max);
    moxie_quant::vexp::ggml_v_expf_16s(&mut x[..n16]);
    let mut chunks = x.chunks_exact_mut(16);
    for c in &mut chunks {
        sum += moxie_quant::reduce_add_16((&*c).try_into().unwrap()) as f64;
    }
    for v in chunks.into_remainder() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// SiLU of one row in place, as ggml's `ggml_vec_silu_f32` (its unary SiLU op, row by row):
/// `ggml_v_expf` on 16-lane chunks, libm on the tail.
pub fn silu_row(x: &mut [f32]) {
    let n16 = x.len() / 16 * 16;
    moxie_quant::vexp::ggml_v_silu_16s(&mut x[..n16]);
    for v in &mut x[n16..] {
        *v = silu(*v);
    }
}

/// ggml's softplus op: `log(1 + exp(x))`, `x` itself above 20 (libm).
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (1.0 + x.exp()).ln()
    }
}

/// L2 normalisation of each row of `x` (rows of `n`), as llama.cpp's gated DeltaNet graphs
/// build it: an RMS norm with `eps / n` (f64 sum of squares, f32 scale), then a separate scale
/// by `1 / sqrt(n)`.
pub fn l2_norm(x: &mut [f32], n: usize, eps: f32) {
    let nf = n as f32;
    let (eps, post) = (eps / nf, 1.0 / nf.sqrt());
    for row in x.chunks_exact_mut(n) {
        let sum: f64 = row.iter().map(|&v| (v * v) as f64).sum();
        let mean = (sum / n as f64) as f32;
        let scale = 1.0f32 / (mean + eps).sqrt();
        for v in row.iter_mut() {
            *v = (*v * scale) * post;
        }
    }
}

/// `gate = silu(gate) * up`, element-wise, as ggml's `ggml_vec_swiglu_f32` (SiLU through
/// `ggml_v_expf` on 16-lane chunks, libm on the tail).
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    let n16 = gate.len() / 16 * 16;
    moxie_quant::vexp::ggml_v_swiglu_16s(&mut gate[..n16], &up[..n16]);
    for (g, &u) in gate[n16..].iter_mut().zip(&up[n16..]) {
        *g = silu(*g) * u;
    }
}

/// [`swiglu`] applied to each row of `row_len` values, as ggml runs it row by row.
pub fn swiglu_rows(gate: &mut [f32], up: &[f32], row_len: usize) {
    if row_len == 0 {
        return;
    }
    for (g, u) in gate.chunks_exact_mut(row_len).zip(up.chunks_exact(row_len)) {
        swiglu(g, u);
    }
}

/// [`swiglu`] on columns `first_col..first_col + gate.len()` of one row of `row_len` values:
/// each element takes the formula its column gets in the whole row.
pub fn swiglu_cols(gate: &mut [f32], up: &[f32], first_col: usize, row_len: usize) {
    let n16 = row_len / 16 * 16;
    if first_col.is_multiple_of(16)
        && gate.len().is_multiple_of(16)
        && first_col + gate.len() <= n16
    {
        // Whole 16-column chunks of the row: `swiglu`'s own vector form (the int8 GEMM's
        // runs of 16 rows land here).
        return swiglu(gate, up);
    }
    for (col, (g, &u)) in (first_col..).zip(gate.iter_mut().zip(up)) {
        *g = if col < n16 {
            moxie_quant::vexp::ggml_v_silu(*g) * u
        } else {
            silu(*g) * u
        };
    }
}

/// `y += x`
pub fn add_assign(y: &mut [f32], x: &[f32]) {
    for (a, &b) in y.iter_mut().zip(x) {
        *a += b;
    }
}

/// [`add_assign`] over `par`'s threads (a prompt batch's residual adds; one token stays on the
/// caller's thread). The same sums: each element is added alone.
pub fn add_assign_par(par: &crate::parallel::Parallel, y: &mut [f32], x: &[f32]) {
    assert_eq!(y.len(), x.len(), "add_assign_par: lengths");
    // Runs of 1024 values (the tail's run is shorter): a few per thread.
    const RUN: usize = 1024;
    let runs = y.len().div_ceil(RUN);
    par.for_each_run(
        runs,
        |_| RUN / 4,
        y,
        |i| (i * RUN).min(x.len()),
        |r, out| add_assign(out, &x[r.start * RUN..r.start * RUN + out.len()]),
    );
}

/// Add `bias` to every row of `x`.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        add_assign(row, bias);
    }
}

/// The RoPE layout: which pairs of dimensions rotate together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeKind {
    /// Adjacent pairs (x[2i], x[2i+1]) — ggml's "normal" mode (DeepSeek, Llama).
    Normal,
    /// Halves (x[i], x[i + n_dims/2]) — ggml's NEOX mode (Qwen, GLM).
    Neox,
}

/// Rotary position embedding parameters, with YaRN scaling as ggml implements it (including
/// the fused multiply-adds GCC's default `-ffp-contract=fast` puts into ggml's rope).
#[derive(Clone, Debug)]
pub struct Rope {
    pub kind: RopeKind,
    /// Rotated dimensions per head (the first `n_dims` of each head).
    pub n_dims: usize,
    pub freq_base: f32,
    pub freq_scale: f32,
    pub ext_factor: f32,
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    pub n_ctx_orig: u32,
}

impl Rope {
    fn corr_dim(&self, n_rot: f32) -> f32 {
        self.n_dims as f32 * (self.n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
            / (2.0 * self.freq_base.ln())
    }

    /// (cos, sin) for every rotated pair at position `pos`, as ggml's rope cache computes them
    /// (theta advanced by repeated multiplication in f32).
    pub fn cache(&self, pos: i64, out: &mut Vec<(f32, f32)>) {
        out.clear();
        let theta_scale = self.freq_base.powf(-2.0 / self.n_dims as f32);
        let start = self.corr_dim(self.beta_fast).floor();
        let end = self.corr_dim(self.beta_slow).ceil();
        let corr = [start.max(0.0), end.min(self.n_dims as f32 - 1.0)];
        let mut theta = pos as f32;
        let mut i0 = 0usize;
        while i0 < self.n_dims {
            let theta_extrap = theta;
            let theta_interp = self.freq_scale * theta_extrap;
            let mut t = theta_interp;
            let mut mscale = self.attn_factor;
            if self.ext_factor != 0.0 {
                let y = ((i0 / 2) as f32 - corr[0]) / (corr[1] - corr[0]).max(0.001);
                let ramp = 1.0 - y.clamp(0.0, 1.0);
                let mix = ramp * self.ext_factor;
                // GCC builds ggml with -ffp-contract=fast: `a*b + c*d` is fma(a, b, c*d).
                t = theta_interp.mul_add(1.0 - mix, theta_extrap * mix);
                mscale *= 1.0 + 0.1 * (1.0 / self.freq_scale).ln();
            }
            out.push((t.cos() * mscale, t.sin() * mscale));
            theta *= theta_scale;
            i0 += 2;
        }
    }

    /// Rotate the first `n_dims` dimensions of every head in `x` (`n_heads` heads of
    /// `head_dim`, starting at `offset` within each head) for position `pos`.
    pub fn apply(&self, x: &mut [f32], head_dim: usize, offset: usize, cache: &[(f32, f32)]) {
        for head in x.chunks_exact_mut(head_dim) {
            let h = &mut head[offset..offset + self.n_dims];
            match self.kind {
                RopeKind::Normal => {
                    for (i, &(c, s)) in cache.iter().enumerate() {
                        let x0 = h[2 * i];
                        let x1 = h[2 * i + 1];
                        h[2 * i] = x0.mul_add(c, -(x1 * s));
                        h[2 * i + 1] = x0.mul_add(s, x1 * c);
                    }
                }
                RopeKind::Neox => {
                    let half = self.n_dims / 2;
                    for (i, &(c, s)) in cache.iter().enumerate() {
                        let x0 = h[i];
                        let x1 = h[i + half];
                        h[i] = x0.mul_add(c, -(x1 * s));
                        h[i + half] = x0.mul_add(s, x1 * c);
                    }
                }
            }
        }
    }
}

/// Round to f16 and back, as ggml does when it stores into an F16 tensor.
#[inline]
pub fn f16_round(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_matches_definition() {
        let mut x = vec![1.0f32, 2.0, 3.0, 4.0];
        let w = vec![1.0f32, 0.5, 2.0, 1.0];
        rms_norm_mul(&mut x, &w, 0.0);
        let rms = ((1.0 + 4.0 + 9.0 + 16.0) / 4.0f32).sqrt();
        assert!((x[0] - 1.0 / rms).abs() < 1e-6);
        assert!((x[1] - 1.0 / rms).abs() < 1e-6);
        assert!((x[2] - 6.0 / rms).abs() < 1e-6);
    }

    /// Pieces of a row (whole 16-column chunks, odd pieces, the libm tail) give the bits
    /// `swiglu` gives the whole row.
    #[test]
    fn swiglu_cols_match_the_whole_row() {
        let row_len = 200; // 192 columns in 16-lane chunks, 8 in the tail
        let gate: Vec<f32> = (0..row_len)
            .map(|i| (i as f32 * 0.37).sin() * 6.0)
            .collect();
        let up: Vec<f32> = (0..row_len).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut want = gate.clone();
        swiglu(&mut want, &up);
        for cuts in [
            &[0, 16, 32, 48, 192, 200][..],
            &[0, 5, 16, 40, 190, 196, 200],
            &[0, 200],
        ] {
            let mut got = gate.clone();
            for w in cuts.windows(2) {
                let (a, b) = (w[0], w[1]);
                swiglu_cols(&mut got[a..b], &up[a..b], a, row_len);
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "cuts {cuts:?}");
        }
    }

    #[test]
    fn ggml_expf_is_accurate() {
        let mut x = -80.0f32; // normal range: subnormal results lose relative precision
        while x < 88.0 {
            let want = (x as f64).exp();
            let got = ggml_v_expf(x) as f64;
            assert!(((got - want) / want).abs() < 4e-7, "{x}: {got} vs {want}");
            x += 0.137;
        }
        assert_eq!(ggml_v_expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(ggml_v_expf(0.0), 1.0);
        assert_eq!(ggml_v_expf(200.0), f32::INFINITY);
    }

    #[test]
    fn softmax_sums_to_one_and_masks() {
        let mut x = vec![1.0f32, 2.0, f32::NEG_INFINITY, 0.5];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert_eq!(x[2], 0.0);
        assert!(x[1] > x[0] && x[0] > x[3]);
    }

    #[test]
    fn rope_position_zero_is_identity_and_norm_preserving() {
        let rope = Rope {
            kind: RopeKind::Neox,
            n_dims: 4,
            freq_base: 10000.0,
            freq_scale: 1.0,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig: 4096,
        };
        let mut cache = Vec::new();
        rope.cache(0, &mut cache);
        let mut x = vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        rope.apply(&mut x, 6, 0, &cache);
        assert_eq!(x, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        rope.cache(7, &mut cache);
        rope.apply(&mut x, 6, 0, &cache);
        let n: f32 = x[..4].iter().map(|v| v * v).sum();
        assert!((n - 30.0).abs() < 1e-4);
        assert_eq!(&x[4..], &[5.0, 6.0]);
        // NEOX pairs dims (0,2) and (1,3): the first pair at theta = 7 rad
        let (c, s) = (7.0f32.cos(), 7.0f32.sin());
        assert!((x[0] - (1.0 * c - 3.0 * s)).abs() < 1e-5);
    }
}
