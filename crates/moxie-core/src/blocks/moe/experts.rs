//! The routed experts on the CPU, in the two shapes decode and prefill need (see the parent
//! module): one token's selected experts as two parallel regions, and a batch grouped by
//! expert. Every product is the kernel [`crate::tensor::Mat`] would pick for that expert alone,
//! so the grouping changes scheduling, not results.

use moxie_quant::GgmlType;

use super::{Moe, MoeScratch};
use crate::blocks::DenseFfn;
use crate::ops;
use crate::parallel::Parallel;
use crate::scratch;
use crate::tensor::{gemv_many, ChunkedLayout, Mat, QuantizedActs, CHUNK_ROWS, TILE};
use crate::Result;

/// An empty vector for items of other lifetimes that keeps `v`'s allocation: std collects a
/// `vec::IntoIter` adapter in place when the item layouts match, as they do here, so per-token
/// lists of borrowed items reuse one buffer without `unsafe`.
pub(super) fn recycle<'a, 'b>(mut v: Vec<(Mat<'a>, &'a [u8])>) -> Vec<(Mat<'b>, &'b [u8])> {
    v.clear();
    v.into_iter()
        .map(|_| unreachable!("the vector is empty"))
        .collect()
}

/// One token (decode): the selected experts' gate and up projections and the shared expert's (if
/// given) in one parallel region, SiLU·mul, then every down projection in a second region, and
/// the routing-weighted sum into `s.out`.
pub(super) fn one_token(
    m: &Moe,
    h: &[f32],
    par: &Parallel,
    s: &mut MoeScratch,
    shared: Option<&DenseFfn>,
) -> Result<()> {
    let MoeScratch {
        inputs,
        gate_up,
        down_in,
        shared_down_in,
        down,
        products,
        out,
        routes,
        skip,
        active,
        ..
    } = s;
    let n_embd = m.n_embd();
    // The slots computed here (all but those of experts another device computes).
    active.clear();
    active.extend((0..routes.len()).filter(|&i| !skips(skip, routes[i].0)));
    let k = active.len();
    let n_ff = m.gate_exps.ne[1];
    let shared = match shared {
        Some(sh) => Some([sh.gate.matrix()?, sh.up.matrix()?, sh.down.matrix()?]),
        None => None,
    };
    let n_ff_sh = shared.as_ref().map_or(0, |sh| sh[0].n_out);
    // qwen3next's gate of the shared expert: one more product with the layer input.
    let shared_gate = match (&shared, &m.shared_gate) {
        (Some(_), Some(g)) => Some(g.matrix()?),
        _ => None,
    };
    let gate_ty = m.gate_exps.slice(0)?.act_type();
    let up_ty = m.up_exps.slice(0)?.act_type();
    let shared_types = shared
        .iter()
        .flat_map(|sh| [sh[0].act_type(), sh[1].act_type()])
        .chain(shared_gate.iter().map(|g| g.act_type()));
    inputs.convert(
        par,
        [gate_ty, up_ty].into_iter().chain(shared_types),
        n_embd,
        h,
    );

    let mut list = recycle(std::mem::take(products));
    for (t, ty) in [(&m.gate_exps, gate_ty), (&m.up_exps, up_ty)] {
        for &i in active.iter() {
            list.push((t.slice(routes[i].0)?, inputs.get(ty).row(0)));
        }
    }
    for w in shared.iter().flat_map(|sh| &sh[..2]).chain(&shared_gate) {
        list.push((*w, inputs.get(w.act_type()).row(0)));
    }
    let n_gate = shared_gate.map_or(0, |g| g.n_out);
    gate_up.resize(2 * k * n_ff + 2 * n_ff_sh + n_gate, 0.0);
    gemv_many(par, &list, gate_up);
    let (g, rest) = gate_up.split_at_mut(k * n_ff);
    let (u, rest) = rest.split_at_mut(k * n_ff);
    ops::swiglu_rows(g, u, n_ff);
    let (sg, rest) = rest.split_at_mut(n_ff_sh);
    let (su, shared_logit) = rest.split_at_mut(n_ff_sh);
    ops::swiglu_rows(sg, su, n_ff_sh);
    let shared_scale = shared_logit.first().map(|&l| ops::sigmoid(l));

    down_in.refill(par, m.down_exps.slice(0)?.act_type(), n_ff, g);
    if let Some(sh) = &shared {
        shared_down_in.refill(par, sh[2].act_type(), n_ff_sh, sg);
    }
    let mut list = recycle(list);
    for (j, &i) in active.iter().enumerate() {
        list.push((m.down_exps.slice(routes[i].0)?, down_in.row(j)));
    }
    if let Some(sh) = &shared {
        list.push((sh[2], shared_down_in.row(0)));
    }
    down.resize(list.len() * n_embd, 0.0);
    gemv_many(par, &list, down);
    *products = recycle(list);
    out.resize(n_embd, 0.0);
    if k == 0 {
        out.fill(0.0);
    }
    for (j, &i) in active.iter().enumerate() {
        let v = &down[j * n_embd..(j + 1) * n_embd];
        add_weighted(out, v, routes[i].1, j == 0);
    }
    if shared.is_some() {
        let sh = &mut down[k * n_embd..];
        if let Some(scale) = shared_scale {
            sh.iter_mut().for_each(|v| *v *= scale);
        }
        ops::add_assign(out, sh);
    }
    Ok(())
}

/// Whether the expert list `skip` (empty: none) leaves expert `e` to another device.
fn skips(skip: &[bool], e: usize) -> bool {
    skip.get(e).copied().unwrap_or(false)
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

/// The same rows converted once per activation type; the buffers are reused by the next
/// [`ActsByType::convert`].
#[derive(Default)]
pub(super) struct ActsByType {
    acts: Vec<QuantizedActs>,
    /// How many of `acts` hold the current rows.
    n_used: usize,
}

impl ActsByType {
    /// A batch's rows converted to every type in `types` (each once) over `par`'s threads
    /// ([`QuantizedActs::new`]).
    fn new(
        par: &Parallel,
        types: impl Iterator<Item = GgmlType>,
        n: usize,
        x: &[f32],
    ) -> ActsByType {
        let mut acts: Vec<QuantizedActs> = Vec::new();
        for ty in types {
            if !acts.iter().any(|a| a.ty == ty) {
                acts.push(QuantizedActs::new(par, ty, n, x));
            }
        }
        ActsByType {
            n_used: acts.len(),
            acts,
        }
    }

    /// The rows of `x` (each `n` long) converted to every type in `types` (each once).
    fn convert(
        &mut self,
        par: &Parallel,
        types: impl Iterator<Item = GgmlType>,
        n: usize,
        x: &[f32],
    ) {
        self.n_used = 0;
        for ty in types {
            if self.acts[..self.n_used].iter().any(|a| a.ty == ty) {
                continue;
            }
            if self.acts.len() == self.n_used {
                self.acts.push(QuantizedActs::default());
            }
            self.acts[self.n_used].refill(par, ty, n, x);
            self.n_used += 1;
        }
    }

    fn get(&self, ty: GgmlType) -> &QuantizedActs {
        self.acts[..self.n_used]
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

/// The most bytes of down-projection results [`batch`] holds at once (one pass over the
/// output rows).
const DOWN_PASS_BYTES: usize = 8 << 20;

/// A batch (`routes`: each token's top-k, token after token; the experts flagged in `skip`
/// are computed elsewhere and left out): tokens grouped by expert; see the module
/// documentation for the five regions.
pub(super) fn batch(
    m: &Moe,
    h: &[f32],
    par: &Parallel,
    routes: &[(usize, f32)],
    skip: &[bool],
    shared: Option<&DenseFfn>,
    out: &mut Vec<f32>,
) -> Result<()> {
    let n_embd = m.n_embd();
    let k_used = m.routing.n_expert_used;
    let n = routes.len() / k_used;
    let routes: Vec<&[(usize, f32)]> = routes.chunks_exact(k_used).collect();
    let mut by_expert: Vec<Vec<(usize, usize)>> = vec![Vec::new(); m.routing.n_expert];
    for (t, r) in routes.iter().enumerate() {
        for (slot, &(e, _)) in r.iter().enumerate() {
            if !skips(skip, e) {
                by_expert[e].push((t, slot));
            }
        }
    }
    let n_ff = m.gate_exps.ne[1];
    // The layer input is converted once for the gate/up type (ggml quantizes src1 of
    // mul_mat_id once too); each expert gathers its tokens' rows from it.
    let gate_ty = m.gate_exps.slice(0)?.act_type();
    let up_ty = m.up_exps.slice(0)?.act_type();
    // Converted over the threads, with the int8 GEMM's form of every token made once: the
    // experts copy their tokens' rows of it (each token goes to k_used experts).
    let input = ActsByType::new(par, [gate_ty, up_ty].into_iter(), n_embd, h);
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
    // From the thread's pool (`scratch`): every value is written by its region before it is
    // read.
    let mut act = scratch::take(ff.len());
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
            let acts = QuantizedActs::from_fn(down_ty, n_ff, n_tok[a], |t, row| {
                ff.gather(&act, a, t, row)
            });
            acts.prepare_for(kernels[a].2);
            acts
        },
    );
    drop((acts_in, act));

    // Regions 4 and 5 in passes over the output rows, each pass's products at most
    // DOWN_PASS_BYTES (a 512-token batch's whole would be n x k_used x n_embd floats, tens of
    // MB at the peak of the layer). Region 4: every (expert, chunk of the pass's rows) of the
    // down projections. Region 5: each token's experts, weighted, summed in selection order
    // (the first assigns, so `out` needs no clearing); per element, so passes change nothing.
    let n_routes = n * k_used;
    let n_pass = (n_routes * n_embd * 4).div_ceil(DOWN_PASS_BYTES).max(1);
    let pass_rows = n_embd.div_ceil(n_pass).next_multiple_of(CHUNK_ROWS);
    let mut down_out = scratch::take(n_routes * pass_rows.min(n_embd));
    out.resize(n * n_embd, 0.0);
    for r0 in (0..n_embd).step_by(pass_rows) {
        let pass = r0..(r0 + pass_rows).min(n_embd);
        let emb = ChunkedLayout::over_rows(pass.clone(), n_tok.clone());
        let down_out = &mut down_out[..emb.len()];
        emb.for_each_item(par, n_ff, down_out, |a, rows, o, [scratch, _]| {
            let r = &routed[a];
            r.down
                .rows_times(kernels[a].2, &acts_down[a], rows, o, scratch);
        });
        par.for_each_range(n, k_used * pass.len(), out, n_embd, |toks, o| {
            for (t, orow) in toks.zip(o.chunks_exact_mut(n_embd)) {
                let orow = &mut orow[pass.clone()];
                let mut first = true;
                for (slot, &(e, w)) in routes[t].iter().enumerate() {
                    if skips(skip, e) {
                        continue;
                    }
                    let (a, i) = where_is[t * k_used + slot];
                    let first = std::mem::take(&mut first);
                    emb.for_each_run(down_out, a, i, |r0, v| {
                        add_weighted(&mut orow[r0..r0 + v.len()], v, w, first)
                    });
                }
                if first {
                    // Every expert of this token is computed elsewhere.
                    orow.fill(0.0);
                }
            }
        });
    }
    drop(down_out);
    if let Some(s) = shared {
        let mut sh = s.cpu_rows(h, n, Some(input.get(gate_ty)), par)?;
        if let Some(g) = &m.shared_gate {
            super::gate_shared_rows(g, h, &mut sh, par)?;
        }
        ops::add_assign_par(par, out, &sh);
    }
    Ok(())
}
