//! Causal softmax attention of queries against cached rows, on the CPU: the kernel every
//! attention block (GQA, MLA, DSA-selected MLA) runs after writing its new rows into the
//! layer's state. Exact numerics follow ggml's non-flash path to the last bit; fast numerics
//! use blocked f32 products (docs/architecture.md, "Numerics").

use moxie_quant::GgmlType;

use crate::blocks::dsa::TopK;
use crate::ops::{self, f16_round};
use crate::parallel::{Numerics, Parallel};
use crate::state::CacheRows;

/// Shapes of one attention call over the cache.
#[derive(Clone, Copy)]
pub(crate) struct AttnGeom {
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Query/key width per head.
    pub dk: usize,
    /// Value width per head.
    pub dv: usize,
    pub kq_scale: f32,
    /// Position of the first query.
    pub pos0: usize,
}

/// Causal softmax attention of `q` (`n` tokens × n_head × dk) against the cache, the way
/// ggml's non-flash path computes it: queries converted to the key type's dot-product partner
/// (f16 for the default cache, q8_0 for a q8_0 one) for the KQ product, probabilities rounded
/// to f16 for the product with f16 values, and both products summed in llama.cpp's order
/// (tinyBLAS for a batch, `vec_dot` for one token; docs/architecture.md "Numerics"). A
/// quantized value cache is converted to f32 rows (llama.cpp runs those through its
/// flash-attention kernel only, so they are not bit-matched). `values` `None`: the values are
/// the first `dv` elements of each key row (MLA's latent, one kv head). `sel`: the past
/// positions each query may attend to when not all of them (DSA's top-k; llama.cpp masks the
/// others to -inf before the softmax, so they drop out of it exactly).
pub(crate) fn attend(
    g: AttnGeom,
    q: &[f32],
    keys: CacheRows,
    values: Option<CacheRows>,
    sel: Option<&TopK>,
    out: &mut [f32],
    par: &Parallel,
) {
    let n = q.len() / (g.n_head * g.dk);
    if par.numerics() == Numerics::Fast {
        return if n > 1 {
            attend_batch_f32(g, q, keys, values, sel, out, par)
        } else {
            attend_one_token(g, q, keys, values, sel, out, par)
        };
    }
    let group = g.n_head / g.n_head_kv;
    let n_rows = n * g.n_head;
    let work = (g.pos0 + n) * (g.dk + g.dv);
    let batched = n > 1;
    let values = values.unwrap_or(keys);
    let kq_dot = match moxie_quant::tinyblas_dot_fn(keys.ty, g.dk) {
        Some(f) if batched => f,
        _ => moxie_quant::vec_dot_fn(keys.ty).expect("cache types have a dot product"),
    };
    let q_ty = moxie_quant::vec_dot_type(keys.ty).expect("cache types have a dot partner");
    let q_conv = moxie_quant::quantize_fn(q_ty).expect("dot partners can be converted to");
    let q_bytes_len = q_ty.row_bytes(g.dk as u64).expect("heads are whole blocks") as usize;
    let round_p = values.ty == GgmlType::F16;
    // V product accumulators: tinyBLAS keeps 16 lanes per output, vec_dot_f16 four groups of
    // 16; lane of position j = j % 16, group = (j % 64) / 16. Laid out [slot][d] so the inner
    // loop runs over contiguous d.
    let slots = if batched { 16 } else { 64 };
    par.for_each_range(n_rows, work, out, g.dv, |rows, o| {
        let mut scores = Vec::new();
        let mut q_bytes = vec![0u8; q_bytes_len];
        let mut vrow = vec![0f32; g.dv];
        let mut acc = vec![0f32; slots * g.dv];
        let mut lanes = vec![0f32; 16 * g.dv];
        for (row, orow) in rows.zip(o.chunks_exact_mut(g.dv)) {
            let (t, hh) = (row / g.n_head, row % g.n_head);
            let kvh = hh / group;
            let n_kv = g.pos0 + t + 1;
            q_conv(&q[row * g.dk..(row + 1) * g.dk], &mut q_bytes);
            scores.clear();
            let allowed = sel.and_then(|s| s.row(t));
            let mut next_allowed = 0;
            for j in 0..n_kv {
                if let Some(a) = allowed {
                    if a.get(next_allowed) != Some(&(j as u32)) {
                        scores.push(f32::NEG_INFINITY);
                        continue;
                    }
                    next_allowed += 1;
                }
                let s = kq_dot(g.dk, keys.span(j, kvh * g.dk, g.dk), &q_bytes);
                scores.push(s * g.kq_scale);
            }
            // llama.cpp's kq rows span the padded cache (a multiple of 256) with masked
            // entries; padding to 16 lanes reproduces its softmax chunking exactly.
            scores.resize(n_kv.next_multiple_of(16), f32::NEG_INFINITY);
            ops::softmax(&mut scores);
            // Slots at or past n_kv never receive a term: only the used ones are cleared and
            // read back.
            let used = slots.min(n_kv);
            acc[..used * g.dv].iter_mut().for_each(|v| *v = 0.0);
            for (j, &p) in scores.iter().take(n_kv).enumerate() {
                let p = if round_p { f16_round(p) } else { p };
                if p == 0.0 {
                    continue; // fma(v, 0, acc) leaves acc unchanged
                }
                values.to_f32(j, kvh * g.dv, &mut vrow);
                let slot = j % slots;
                let a = &mut acc[slot * g.dv..(slot + 1) * g.dv];
                for (x, &v) in a.iter_mut().zip(&vrow) {
                    *x = v.mul_add(p, *x);
                }
            }
            reduce_v_slots(&acc, used, batched, g.dv, &mut lanes, orow);
        }
    });
}

/// [`Numerics::Fast`] attention for one query token (decode), flash-style: the query heads that
/// share a kv head (a GQA group, or all heads of MLA's single latent) go through the cache
/// together in blocks of positions. Each block's keys and values are converted to f32 once for
/// all those heads, scores and the weighted values are small f32 matrix products, and the
/// softmax is the running (online) one, so the cache is read once. The exact path instead
/// walks the cache once per query head in ggml's summation order. Queries take the rounding
/// of the key type's dot partner as there; probabilities are not rounded (rounding the
/// running, unnormalised ones to f16 moved the fixtures' decode further from exact decode).
fn attend_one_token(
    g: AttnGeom,
    q: &[f32],
    keys: CacheRows,
    values: Option<CacheRows>,
    sel: Option<&TopK>,
    out: &mut [f32],
    par: &Parallel,
) {
    /// Positions per block: a block of MLA's 576-wide keys is 144 KiB of f32.
    const BLOCK: usize = 64;
    debug_assert_eq!(q.len(), g.n_head * g.dk, "one query token");
    let group = g.n_head / g.n_head_kv;
    // The positions read: all of them, or the selected ones.
    let list = sel.and_then(|s| s.row(0));
    let n_kv = list.map_or(g.pos0 + 1, <[u32]>::len);
    let work = n_kv * (g.dk + g.dv) / group.max(1);
    let q_ty = moxie_quant::vec_dot_type(keys.ty).expect("cache types have a dot partner");
    par.for_each_range(g.n_head, work, out, g.dv, |rows, o| {
        // This thread's query heads read kv heads kv.start..kv.end: per block, their keys
        // (and values) of all positions are converted in one go.
        let kv = rows.start / group..(rows.end - 1) / group + 1;
        let (k_width, v_width) = (kv.len() * g.dk, kv.len() * g.dv);
        let mut qh = q[rows.start * g.dk..rows.end * g.dk].to_vec();
        round_through(q_ty, g.dk, &mut qh, &mut Vec::new());
        let mut kbuf = vec![0f32; BLOCK * k_width];
        let mut vbuf = vec![0f32; if values.is_some() { BLOCK * v_width } else { 0 }];
        let mut scores = Vec::new();
        let mut part = Vec::new();
        // Per head: running max and sum of exp(score - max).
        let mut max = vec![f32::NEG_INFINITY; rows.len()];
        let mut sum = vec![0f32; rows.len()];
        o.fill(0.0);
        for j0 in (0..n_kv).step_by(BLOCK) {
            let b = BLOCK.min(n_kv - j0);
            let chunk = list.map(|l| &l[j0..j0 + b]);
            rows_to_f32(keys, j0, b, chunk, kv.start * g.dk, k_width, &mut kbuf);
            // MLA's values are part of the converted keys.
            let (v, ldv) = match values {
                Some(values) => {
                    rows_to_f32(values, j0, b, chunk, kv.start * g.dv, v_width, &mut vbuf);
                    (&vbuf[..], v_width)
                }
                None => (&kbuf[..], k_width),
            };
            for kvh in kv.clone() {
                // This thread's heads reading kv head `kvh`, as indices into `rows`.
                let hs = rows.start.max(kvh * group) - rows.start
                    ..rows.end.min((kvh + 1) * group) - rows.start;
                let kk = (kvh - kv.start) * g.dk;
                scores.resize(hs.len() * b, 0.0);
                moxie_quant::gemm_f32_abt(
                    hs.len(),
                    b,
                    g.dk,
                    &qh[hs.start * g.dk..hs.end * g.dk],
                    g.dk,
                    &kbuf[kk..(b - 1) * k_width + kk + g.dk],
                    k_width,
                    &mut scores,
                    b,
                );
                for (h, srow) in hs.clone().zip(scores.chunks_exact_mut(b)) {
                    let block_max = srow
                        .iter()
                        .fold(f32::NEG_INFINITY, |m, &x| m.max(x * g.kq_scale));
                    let new_max = max[h].max(block_max);
                    let rescale = (max[h] - new_max).exp();
                    max[h] = new_max;
                    let mut s = 0f32;
                    for x in srow.iter_mut() {
                        *x = (*x * g.kq_scale - new_max).exp();
                        s += *x;
                    }
                    sum[h] = sum[h] * rescale + s;
                    if rescale != 1.0 {
                        o[h * g.dv..(h + 1) * g.dv]
                            .iter_mut()
                            .for_each(|x| *x *= rescale);
                    }
                }
                let vv = (kvh - kv.start) * g.dv;
                part.resize(hs.len() * g.dv, 0.0);
                moxie_quant::gemm_f32_ab(
                    hs.len(),
                    b,
                    g.dv,
                    &scores,
                    b,
                    &v[vv..(b - 1) * ldv + vv + g.dv],
                    ldv,
                    &mut part,
                    g.dv,
                );
                for (x, &y) in o[hs.start * g.dv..hs.end * g.dv].iter_mut().zip(&part) {
                    *x += y;
                }
            }
        }
        for (oh, &s) in o.chunks_exact_mut(g.dv).zip(&sum) {
            let inv = 1.0 / s;
            oh.iter_mut().for_each(|x| *x *= inv);
        }
    });
}

/// `width` elements from element `first` of `n` positions as f32 rows: positions
/// `j0..j0 + n`, or the listed ones.
fn rows_to_f32(
    rows: CacheRows,
    j0: usize,
    n: usize,
    list: Option<&[u32]>,
    first: usize,
    width: usize,
    out: &mut [f32],
) {
    match list {
        None => rows.block_to_f32(j0, n, first, width, out),
        Some(l) => {
            for (&pos, row) in l.iter().zip(out.chunks_exact_mut(width)) {
                rows.block_to_f32(pos as usize, 1, first, width, row);
            }
        }
    }
}

/// The V product's final sums, `out[d]` for every `d` at once (vectorised over `d`): slot `s`
/// of `acc` (`dv` values each; slots at or past `used` are zero) is lane `s % 16` of group
/// `s / 16`. One token: the four groups are added as ggml's `reduce_f32x16` does,
/// `(g0 + g2) + (g1 + g3)`; a batch has one group. Then the 16 lanes are summed in
/// [`moxie_quant::reduce_add_16`]'s tree order.
fn reduce_v_slots(
    acc: &[f32],
    used: usize,
    batched: bool,
    dv: usize,
    lanes: &mut [f32],
    out: &mut [f32],
) {
    let slot = |s: usize| &acc[s * dv..(s + 1) * dv];
    for (l, dst) in lanes.chunks_exact_mut(dv).enumerate() {
        if batched || used <= 16 {
            // The other groups are zero: (a + 0) + (0 + 0) = a.
            dst.copy_from_slice(slot(l));
        } else {
            let (a, c, b, e) = (slot(l), slot(32 + l), slot(16 + l), slot(48 + l));
            for d in 0..dv {
                dst[d] = (a[d] + c[d]) + (b[d] + e[d]);
            }
        }
    }
    // The lane tree, `t[i] = v[i + 8] + v[i]`, `u[i] = t[i + 4] + t[i]`, `(u0 + u2) + (u1 + u3)`,
    // in place: lanes 0..8 become t, then lanes 0..4 become u.
    for step in [8usize, 4] {
        for i in 0..step {
            let (lo, hi) = lanes.split_at_mut((i + step) * dv);
            for (x, &y) in lo[i * dv..(i + 1) * dv].iter_mut().zip(&hi[..dv]) {
                *x += y;
            }
        }
    }
    let lane = |l: usize| &lanes[l * dv..(l + 1) * dv];
    let (u0, u1, u2, u3) = (lane(0), lane(1), lane(2), lane(3));
    for d in 0..dv {
        out[d] = (u0[d] + u2[d]) + (u1[d] + u3[d]);
    }
}

/// [`Numerics::Fast`] attention for a batch of queries: the cache's keys and values are
/// converted to f32 once per call, then per block of tokens and kv head the scores and the
/// weighted sum of values are blocked f32 matrix products (each K/V row is read once per block
/// instead of once per query row). Causal masking is applied to the scores.
fn attend_batch_f32(
    g: AttnGeom,
    q: &[f32],
    keys: CacheRows,
    values: Option<CacheRows>,
    sel: Option<&TopK>,
    out: &mut [f32],
    par: &Parallel,
) {
    /// Tokens per block: all their query heads of one kv head share one pass over K and V.
    const BLOCK: usize = 16;
    let n = q.len() / (g.n_head * g.dk);
    let n_kv = g.pos0 + n;
    let group = g.n_head / g.n_head_kv;
    // Per kv head, all positions' `width` elements as f32 rows.
    let to_f32 = |src: CacheRows, width: usize| {
        let mut dst = vec![0f32; g.n_head_kv * n_kv * width];
        for (kvh, head) in dst.chunks_exact_mut(n_kv * width).enumerate() {
            src.block_to_f32(0, n_kv, kvh * width, width, head);
        }
        dst
    };
    let k32 = to_f32(keys, g.dk);
    // MLA's values are the first `dv` elements of its (single) key rows: no second copy.
    let v32_own;
    let (v32, ldv) = match values {
        Some(values) => {
            v32_own = to_f32(values, g.dv);
            (&v32_own, g.dv)
        }
        None => (&k32, g.dk),
    };
    // Queries take the rounding of the key type's dot partner, probabilities f16's when the
    // values are f16, as ggml converts the other operand to them: the fixtures' quantized
    // models amplify that rounding, so skipping it would not be "float rounding" only.
    let q_ty = moxie_quant::vec_dot_type(keys.ty).expect("cache types have a dot partner");
    let round_p = values.unwrap_or(keys).ty == GgmlType::F16;
    // Token t attends to pos0 + t + 1 positions: threads get runs of equal total work, not
    // equal token counts (with two threads the second would otherwise do ~3/4 of it).
    let head_work = g.n_head * (g.dk + g.dv);
    let out_row = g.n_head * g.dv;
    let cost = |t: usize| (g.pos0 + t + 1 + BLOCK) * head_work;
    par.for_each_run(
        n,
        cost,
        out,
        |t| t * out_row,
        |toks, o| {
            let mut qbuf = Vec::new();
            let mut qtmp = Vec::new();
            let mut scores = Vec::new();
            let mut obuf = Vec::new();
            let mut t0 = toks.start;
            while t0 < toks.end {
                let t1 = (t0 + BLOCK).min(toks.end);
                let rows = (t1 - t0) * group;
                let kv_len = g.pos0 + t1;
                for kvh in 0..g.n_head_kv {
                    qbuf.clear();
                    for t in t0..t1 {
                        let first = (t * g.n_head + kvh * group) * g.dk;
                        qbuf.extend_from_slice(&q[first..first + group * g.dk]);
                    }
                    round_through(q_ty, g.dk, &mut qbuf, &mut qtmp);
                    scores.resize(rows * kv_len, 0.0);
                    let kh = &k32[kvh * n_kv * g.dk..];
                    moxie_quant::gemm_f32_abt(
                        rows,
                        kv_len,
                        g.dk,
                        &qbuf,
                        g.dk,
                        kh,
                        g.dk,
                        &mut scores,
                        kv_len,
                    );
                    for (r, srow) in scores.chunks_exact_mut(kv_len).enumerate() {
                        let t = t0 + r / group;
                        let len = g.pos0 + t + 1;
                        srow[..len].iter_mut().for_each(|s| *s *= g.kq_scale);
                        if let Some(allowed) = sel.and_then(|s| s.row(t)) {
                            mask_unselected(&mut srow[..len], allowed);
                        }
                        ops::softmax(&mut srow[..len]);
                        if round_p {
                            srow[..len].iter_mut().for_each(|p| *p = f16_round(*p));
                        }
                        srow[len..].fill(0.0);
                    }
                    obuf.resize(rows * g.dv, 0.0);
                    let vh = &v32[kvh * n_kv * ldv..];
                    moxie_quant::gemm_f32_ab(
                        rows, kv_len, g.dv, &scores, kv_len, vh, ldv, &mut obuf, g.dv,
                    );
                    for (r, orow) in obuf.chunks_exact(g.dv).enumerate() {
                        let (t, hg) = (t0 + r / group, r % group);
                        let at = ((t - toks.start) * g.n_head + kvh * group + hg) * g.dv;
                        o[at..at + g.dv].copy_from_slice(orow);
                    }
                }
                t0 = t1;
            }
        },
    );
}

/// Set the scores of positions not in `allowed` (sorted) to -inf.
fn mask_unselected(scores: &mut [f32], allowed: &[u32]) {
    let mut next = allowed.iter().peekable();
    for (j, s) in scores.iter_mut().enumerate() {
        if next.peek() == Some(&&(j as u32)) {
            next.next();
        } else {
            *s = f32::NEG_INFINITY;
        }
    }
}

/// Round `x` (rows of `width`) as converting it to `ty` and back does; f32 is left alone.
fn round_through(ty: GgmlType, width: usize, x: &mut [f32], tmp: &mut Vec<u8>) {
    match ty {
        GgmlType::F32 => {}
        GgmlType::F16 => x.iter_mut().for_each(|v| *v = f16_round(*v)),
        _ => {
            let conv = moxie_quant::quantize_fn(ty).expect("dot partners can be converted to");
            let rb = ty.row_bytes(width as u64).expect("heads are whole blocks") as usize;
            tmp.resize(rb, 0);
            for row in x.chunks_exact_mut(width) {
                conv(row, tmp);
                moxie_quant::dequantize_row(ty, tmp, row).expect("dot partners dequantize");
            }
        }
    }
}
