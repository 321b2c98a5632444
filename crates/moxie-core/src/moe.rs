//! The routed-expert feed-forward layer: route each token to its top-k experts, run those
//! experts' SwiGLU blocks, and sum their outputs weighted by the router (plus the shared
//! expert). This is where decode spends most of its time, so both paths keep the number of
//! parallel hand-offs per layer small and constant:
//!
//! - one token ([`one_token`]): the selected experts' gate and up projections (and the shared
//!   expert's) in one region, their down projections in another;
//! - a batch ([`batch`]): tokens grouped by expert so each expert's weights are read once per
//!   batch; one region gathers each expert's input rows, one computes every (expert, 32-row
//!   chunk) of gate and up plus SiLU·mul, one converts each expert's results for its down
//!   projection, one runs every (expert, chunk) of the down projections, one sums each
//!   token's experts.
//!
//! Every product is the kernel [`crate::tensor::Mat`] would pick for that expert alone, so the
//! grouping changes scheduling, not results.

use moxie_quant::GgmlType;

use crate::config::Config;
use crate::model::{dense_ffn, route_top_k, Moe};
use crate::ops;
use crate::parallel::Parallel;
use crate::tensor::{gemv_many, ChunkedLayout, Mat, QuantizedActs, Tensor, TILE};
use crate::Result;

/// The MoE layer for `n` rows of `h` (each `n_embd` long, already normed), as the forward pass
/// runs it; public for the micro-benchmarks.
pub fn forward(c: &Config, m: &Moe, h: &[f32], n: usize, par: &Parallel) -> Result<Vec<f32>> {
    if n == 1 {
        one_token(c, m, h, par)
    } else {
        batch(c, m, h, n, par)
    }
}

/// One token (decode): the selected experts' gate and up projections and the shared expert's in
/// one parallel region, SiLU·mul, then every down projection in a second region, and the
/// routing-weighted sum.
fn one_token(c: &Config, m: &Moe, h: &[f32], par: &Parallel) -> Result<Vec<f32>> {
    let n_embd = c.n_embd;
    let mut logits = vec![0f32; c.n_expert];
    m.router.matrix()?.matmul(par, h, &mut logits);
    let route = route_top_k(c, &logits, m.probs_bias.as_deref());
    let k = route.len();
    let n_ff = m.gate_exps.ne[1];
    let (gates, ups, downs) = (
        route_slices(&route, &m.gate_exps)?,
        route_slices(&route, &m.up_exps)?,
        route_slices(&route, &m.down_exps)?,
    );
    let shared = match &m.shared {
        Some(s) => Some([s.gate.matrix()?, s.up.matrix()?, s.down.matrix()?]),
        None => None,
    };
    let in_mats: Vec<Mat> = gates
        .iter()
        .chain(&ups)
        .chain(shared.iter().flat_map(|s| &s[..2]))
        .copied()
        .collect();
    // The layer input converted once per activation type the gate/up matrices consume.
    let inputs = ActsByType::new(in_mats.iter().map(|w| w.act_type()), n_embd, h);
    let n_ff_sh = shared.as_ref().map_or(0, |s| s[0].n_out);
    let products: Vec<_> = in_mats
        .iter()
        .map(|w| (*w, inputs.get(w.act_type()).row(0)))
        .collect();
    let mut gu = vec![0f32; 2 * k * n_ff + 2 * n_ff_sh];
    gemv_many(par, &products, &mut gu);
    let (g, rest) = gu.split_at_mut(k * n_ff);
    let (u, rest) = rest.split_at_mut(k * n_ff);
    ops::swiglu_rows(g, u, n_ff);
    let (sg, su) = rest.split_at_mut(n_ff_sh);
    ops::swiglu_rows(sg, su, n_ff_sh);

    let acts_d = QuantizedActs::new(m.down_exps.slice(0)?.act_type(), n_ff, g);
    let acts_sd = shared
        .as_ref()
        .map(|s| QuantizedActs::new(s[2].act_type(), n_ff_sh, sg));
    let mut products: Vec<_> = downs
        .iter()
        .enumerate()
        .map(|(i, w)| (*w, acts_d.row(i)))
        .collect();
    if let (Some(s), Some(a)) = (&shared, &acts_sd) {
        products.push((s[2], a.row(0)));
    }
    let mut d = vec![0f32; products.len() * n_embd];
    gemv_many(par, &products, &mut d);
    let mut out = vec![0f32; n_embd];
    for (slot, &(_, w)) in route.iter().enumerate() {
        add_weighted(
            &mut out,
            &d[slot * n_embd..(slot + 1) * n_embd],
            w,
            slot == 0,
        );
    }
    if shared.is_some() {
        ops::add_assign(&mut out, &d[k * n_embd..]);
    }
    Ok(out)
}

/// The routed experts' matrices of a `*_exps` tensor, in selection order.
fn route_slices<'a>(route: &[(usize, f32)], t: &'a Tensor) -> Result<Vec<Mat<'a>>> {
    route.iter().map(|&(e, _)| t.slice(e)).collect()
}

/// `out = v * w` (first expert) or `out += v * w`, the product rounded before the add, as
/// ggml's chain of adds over the scaled expert outputs does.
fn add_weighted(out: &mut [f32], v: &[f32], w: f32, first: bool) {
    if first {
        for (o, &x) in out.iter_mut().zip(v) {
            *o = x * w;
        }
    } else {
        for (o, &x) in out.iter_mut().zip(v) {
            *o += x * w;
        }
    }
}

/// The same rows converted once per activation type.
struct ActsByType(Vec<QuantizedActs>);

impl ActsByType {
    fn new(types: impl Iterator<Item = GgmlType>, n: usize, x: &[f32]) -> ActsByType {
        let mut v: Vec<QuantizedActs> = Vec::new();
        for ty in types {
            if !v.iter().any(|a| a.ty == ty) {
                v.push(QuantizedActs::new(ty, n, x));
            }
        }
        ActsByType(v)
    }

    fn get(&self, ty: GgmlType) -> &QuantizedActs {
        self.0
            .iter()
            .find(|a| a.ty == ty)
            .expect("every type was converted")
    }
}

/// One expert's share of a batch.
struct Routed<'a> {
    /// The (token, slot) pairs routed to it, in token order.
    users: Vec<(usize, usize)>,
    gate: Mat<'a>,
    up: Mat<'a>,
    down: Mat<'a>,
}

/// A batch: tokens grouped by expert; see the module documentation for the five regions.
fn batch(c: &Config, m: &Moe, h: &[f32], n: usize, par: &Parallel) -> Result<Vec<f32>> {
    let n_embd = c.n_embd;
    let k_used = c.n_expert_used;
    let mut logits = vec![0f32; n * c.n_expert];
    m.router.matrix()?.matmul(par, h, &mut logits);
    let routes: Vec<Vec<(usize, f32)>> = logits
        .chunks_exact(c.n_expert)
        .map(|l| route_top_k(c, l, m.probs_bias.as_deref()))
        .collect();
    let mut by_expert: Vec<Vec<(usize, usize)>> = vec![Vec::new(); c.n_expert];
    for (t, r) in routes.iter().enumerate() {
        for (slot, &(e, _)) in r.iter().enumerate() {
            by_expert[e].push((t, slot));
        }
    }
    let n_ff = m.gate_exps.ne[1];
    // The layer input is converted once for the gate/up type (ggml quantizes src1 of
    // mul_mat_id once too); each expert gathers its tokens' rows from it.
    let gate_ty = m.gate_exps.slice(0)?.act_type();
    let up_ty = m.up_exps.slice(0)?.act_type();
    let input = ActsByType::new([gate_ty, up_ty].into_iter(), n_embd, h);
    // (expert index in `routed`, its token index) for every (token, slot).
    let mut where_is = vec![(0usize, 0usize); n * k_used];
    let mut routed: Vec<Routed> = Vec::new();
    for (e, users) in by_expert.into_iter().enumerate() {
        if users.is_empty() {
            continue;
        }
        for (i, &(t, slot)) in users.iter().enumerate() {
            where_is[t * k_used + slot] = (routed.len(), i);
        }
        routed.push(Routed {
            gate: m.gate_exps.slice(e)?,
            up: m.up_exps.slice(e)?,
            down: m.down_exps.slice(e)?,
            users,
        });
    }
    let kernels: Vec<_> = routed
        .iter()
        .map(|r| {
            let nt = r.users.len();
            (
                r.gate.id_kernel(par, nt),
                r.up.id_kernel(par, nt),
                r.down.id_kernel(par, nt),
            )
        })
        .collect();
    let n_tok: Vec<usize> = routed.iter().map(|r| r.users.len()).collect();
    // Region 1: each expert's rows of the layer input, for gate and (when its type differs)
    // up, ready for their kernels.
    let acts_in = par.map(
        routed.len(),
        |a| n_tok[a] * n_embd,
        |a| {
            let rows: Vec<usize> = routed[a].users.iter().map(|&(t, _)| t).collect();
            let gate = input.get(gate_ty).gather(&rows);
            gate.prepare_for(kernels[a].0);
            let up = (up_ty != gate_ty).then(|| input.get(up_ty).gather(&rows));
            if let Some(u) = &up {
                u.prepare_for(kernels[a].1);
            }
            (gate, up)
        },
    );

    // Region 2: gate and up of every (expert, chunk of rows), then SiLU·mul.
    let ff = ChunkedLayout::new(n_ff, n_tok.clone());
    let mut act = vec![0f32; ff.len()];
    ff.for_each_item(par, 2 * n_embd, &mut act, |a, rows, g, [scratch, up]| {
        let (r, r0, width) = (&routed[a], rows.start, rows.len());
        let (acts_gate, acts_up) = &acts_in[a];
        let acts_up = acts_up.as_ref().unwrap_or(acts_gate);
        up.resize(g.len(), 0.0);
        r.gate
            .rows_times(kernels[a].0, acts_gate, rows.clone(), g, scratch);
        r.up.rows_times(kernels[a].1, acts_up, rows, up, scratch);
        // Runs of 16 rows, token-major within a run (rows_times' order).
        let nt = n_tok[a];
        for (k, (gk, uk)) in g
            .chunks_mut(TILE * nt)
            .zip(up.chunks(TILE * nt))
            .enumerate()
        {
            let w = TILE.min(width - k * TILE);
            for (gt, ut) in gk.chunks_exact_mut(w).zip(uk.chunks_exact(w)) {
                ops::swiglu_cols(gt, ut, r0 + k * TILE, n_ff);
            }
        }
    });

    // Region 3: each expert's token rows converted for its down projection.
    let down_ty = m.down_exps.slice(0)?.act_type();
    let acts_down = par.map(
        routed.len(),
        |a| n_tok[a] * n_ff,
        |a| {
            let mut rows = vec![0f32; n_tok[a] * n_ff];
            for (t, row) in rows.chunks_exact_mut(n_ff).enumerate() {
                ff.gather(&act, a, t, row);
            }
            let acts = QuantizedActs::new(down_ty, n_ff, &rows);
            acts.prepare_for(kernels[a].2);
            acts
        },
    );

    // Region 4: every (expert, chunk of rows) of the down projections.
    let emb = ChunkedLayout::new(n_embd, n_tok);
    let mut down_out = vec![0f32; emb.len()];
    emb.for_each_item(par, n_ff, &mut down_out, |a, rows, o, [scratch, _]| {
        let r = &routed[a];
        r.down
            .rows_times(kernels[a].2, &acts_down[a], rows, o, scratch);
    });

    // Region 5: each token's experts, weighted, summed in selection order.
    let mut out = vec![0f32; n * n_embd];
    par.for_each_range(n, k_used * n_embd, &mut out, n_embd, |toks, o| {
        let mut v = vec![0f32; n_embd];
        for (t, orow) in toks.zip(o.chunks_exact_mut(n_embd)) {
            for (slot, &(_, w)) in routes[t].iter().enumerate() {
                let (a, i) = where_is[t * k_used + slot];
                emb.gather(&down_out, a, i, &mut v);
                add_weighted(orow, &v, w, slot == 0);
            }
        }
    });
    if let Some(s) = &m.shared {
        let sh = dense_ffn(s, h, n, Some(input.get(gate_ty)), par)?;
        ops::add_assign(&mut out, &sh);
    }
    Ok(out)
}
