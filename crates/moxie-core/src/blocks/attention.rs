//! Causal softmax attention of queries against cached rows, on the CPU: the kernel every
//! attention block (GQA, MLA, DSA-selected MLA) runs after writing its new rows into the
//! layer's state. Exact numerics follow ggml's non-flash path to the last bit; fast numerics
//! use blocked f32 products (docs/architecture.md, "Numerics").

use moxie_quant::aligned::AlignedU16;
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
    /// Cache positions of the whole batch when this call attends a chunk of it (0: none):
    /// the products' type ([`bf16_products`]) is chosen for that length, so every chunk
    /// computes as the whole batch would.
    pub n_kv_batch: usize,
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
            attend_batch(g, q, keys, values, sel, out, par)
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
/// together in blocks of positions. Each block's keys and values are converted once for all
/// those heads, scores and the weighted values are small matrix products, and the softmax is
/// the running (online) one, so the cache is read once. Threads split the positions (each run
/// ends with its own max, sum and weighted values, merged at the end), not the heads: MLA has
/// one kv head, and splitting its heads made every thread read and convert all of the cache.
///
/// Products are bf16 with f32 sums ([`moxie_quant::gemm_bf16_abt`]) from
/// [`BF16_FROM_POSITIONS`] positions on, where the CPU has `VDPBF16PS` and the cache is f16
/// with head widths a multiple of 32 (twice the f32 FMA rate, half the bytes of converted keys;
/// decode at depth is these products), else f32 with the queries rounded through the key
/// type's dot partner as ggml does. The exact path instead
/// walks the cache once per query head in ggml's summation order. Probabilities are not
/// rounded to f16 (rounding the running, unnormalised ones moved the fixtures' decode further
/// from exact decode).
fn attend_one_token(
    g: AttnGeom,
    q: &[f32],
    keys: CacheRows,
    values: Option<CacheRows>,
    sel: Option<&TopK>,
    out: &mut [f32],
    par: &Parallel,
) {
    /// Positions per run below which a run is not split further between threads.
    const MIN_RUN: usize = 32;
    debug_assert_eq!(q.len(), g.n_head * g.dk, "one query token");
    // The positions read: all of them, or the selected ones.
    let list = sel.and_then(|s| s.row(0));
    let n_kv = list.map_or(g.pos0 + 1, <[u32]>::len);
    let bf16 = bf16_products(
        g,
        n_kv.max(g.n_kv_batch),
        keys,
        values,
        moxie_quant::bf16_products_fast(),
    );
    // Work items: runs of positions, each over every kv head (whole cache rows, read in
    // order).
    let runs = par.n_threads().min(n_kv.div_ceil(MIN_RUN)).max(1);
    let run_len = n_kv.div_ceil(runs);
    // Per item and head: running max, running sum, weighted values (dv).
    let head_state = g.dv + 2;
    let stride = g.n_head * head_state;
    // (Each run starts its own state: the buffer is not cleared.)
    let mut partial = PARTIAL.take();
    partial.resize(runs * stride, 0.0);
    let work = run_len * g.n_head * (g.dk + g.dv);
    par.for_each_range(runs, work, &mut partial, stride, |items, parts| {
        let mut scratch = match RUN_SCRATCH.take() {
            Some(s) if s.k.is_bf16() == bf16 => s,
            _ => RunScratch::new(bf16),
        };
        for (run, part) in items.zip(parts.chunks_exact_mut(stride)) {
            let span = run * run_len..((run + 1) * run_len).min(n_kv);
            let run = KvRun {
                keys,
                values,
                list,
                span,
                block: run_block(bf16),
            };
            attend_run(g, q, run, &mut scratch, part);
        }
        RUN_SCRATCH.set(Some(scratch));
    });
    // Merge the runs of each head: rescale each to the largest max, then normalise.
    for (h, oh) in out.chunks_exact_mut(g.dv).enumerate() {
        let state = |r: usize| &partial[r * stride + h * head_state..][..head_state];
        let max = (0..runs).fold(f32::NEG_INFINITY, |m, r| m.max(state(r)[0]));
        oh.fill(0.0);
        let mut sum = 0f32;
        for r in 0..runs {
            let st = state(r);
            if st[0] == f32::NEG_INFINITY {
                continue; // an empty run
            }
            let scale = (st[0] - max).exp();
            sum += st[1] * scale;
            for (o, &x) in oh.iter_mut().zip(&st[2..]) {
                *o += x * scale;
            }
        }
        let inv = 1.0 / sum;
        oh.iter_mut().for_each(|x| *x *= inv);
    }
    PARTIAL.set(partial);
}

thread_local! {
    /// Buffers kept by each thread from call to call (decode attends once per layer and
    /// token): the caller's per-run states, each worker's run buffers.
    static PARTIAL: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    static RUN_SCRATCH: std::cell::Cell<Option<RunScratch>> = const { std::cell::Cell::new(None) };
}

/// Cached positions from which one-token attention takes bf16 products: there the products
/// are most of a decode step's time, while below it they are a small part and f32 keeps
/// their rounding (bf16 keys lose 3 of f16's mantissa bits) out of short-context decode.
const BF16_FROM_POSITIONS: usize = 512;

/// One work item of [`attend_one_token`]: positions `span` of every kv head (indices into
/// `list` when the positions are a selection).
#[derive(Clone)]
struct KvRun<'a> {
    keys: CacheRows<'a>,
    values: Option<CacheRows<'a>>,
    list: Option<&'a [u32]>,
    span: std::ops::Range<usize>,
    /// Positions per block ([`run_block`]).
    block: usize,
}

impl KvRun<'_> {
    /// Blocks of positions: `(first index, count, the listed positions of the block)`.
    fn blocks(&self) -> impl Iterator<Item = (usize, usize, Option<&[u32]>)> + '_ {
        self.span.clone().step_by(self.block).map(|j0| {
            let b = self.block.min(self.span.end - j0);
            (j0, b, self.list.map(|l| &l[j0..j0 + b]))
        })
    }
}

/// Positions per block of a run: 64 for f32 products (a block of MLA's 576-wide keys is then
/// 144 KiB), 256 for bf16 ones (288 KiB): each block pays a fixed cost (the online softmax's
/// rescaling of every head's weighted values, the products' operand repacking on AMX), which
/// the bf16 products, 4-6x faster on AMX, no longer hide at 64 (tg32 at depth 4096 1.1x).
fn run_block(bf16: bool) -> usize {
    if bf16 {
        256
    } else {
        64
    }
}

/// A thread's buffers for its runs: queries, keys and values in the products' type.
struct RunScratch {
    q: Converted,
    k: Converted,
    v: Converted,
    p16: Vec<u16>,
    scores: Vec<f32>,
    part: Vec<f32>,
    tmp: Vec<u8>,
}

impl RunScratch {
    fn new(bf16: bool) -> RunScratch {
        RunScratch {
            q: Converted::new(bf16),
            k: Converted::new(bf16),
            v: Converted::new(bf16),
            p16: Vec::new(),
            scores: Vec::new(),
            part: Vec::new(),
            tmp: Vec::new(),
        }
    }
}

/// The online softmax step of one block for `heads` heads: scales `scores` (`heads` rows of
/// `b`) and turns them into exp(score - running max); rescales each head's running sum and
/// weighted values in `state` (`[max, sum, o..]` per head) to the new max.
fn online_softmax(g: AttnGeom, scores: &mut [f32], b: usize, state: &mut [f32]) {
    for (srow, st) in scores
        .chunks_exact_mut(b)
        .zip(state.chunks_exact_mut(g.dv + 2))
    {
        online_softmax_row(g.kq_scale, srow, st);
    }
}

/// The largest of `x` (-inf when empty), over 16 lanes so it vectorises (max is exact in any
/// order). `kq_scale` is positive, so scaling commutes with it.
fn lanes_max(x: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l = l.max(v);
        }
    }
    let rest = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    lanes.iter().fold(rest, |m, &l| m.max(l))
}

/// The sum of `x` over 16 lanes (vectorised; a fixed order, so runs are deterministic).
fn lanes_sum(x: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l += v;
        }
    }
    chunks.remainder().iter().sum::<f32>() + lanes.iter().sum::<f32>()
}

/// Start every head's state of a run: max -inf, sum and weighted values zero.
fn start_run(g: AttnGeom, state: &mut [f32]) {
    for st in state.chunks_exact_mut(g.dv + 2) {
        st[0] = f32::NEG_INFINITY;
        st[1..].fill(0.0);
    }
}

/// Add `part` (`heads` rows of dv) into the weighted values of `state`.
fn add_weighted(g: AttnGeom, part: &[f32], state: &mut [f32]) {
    for (p, st) in part
        .chunks_exact(g.dv)
        .zip(state.chunks_exact_mut(g.dv + 2))
    {
        for (x, &y) in st[2..].iter_mut().zip(p) {
            *x += y;
        }
    }
}

/// The per-kv-head geometry of a run: (query heads per kv head, key row width, value row
/// width) — rows hold every kv head's `dk` (`dv`) values.
fn run_widths(g: AttnGeom) -> (usize, usize, usize) {
    (
        g.n_head / g.n_head_kv,
        g.n_head_kv * g.dk,
        g.n_head_kv * g.dv,
    )
}

/// One run: per block, the keys (and values) of every kv head converted once to the products'
/// type of `s` (bf16, or f32 with the queries rounded through the key type's dot partner),
/// then per kv head the scores, the online softmax and the weighted values.
fn attend_run(g: AttnGeom, q: &[f32], run: KvRun, s: &mut RunScratch, state: &mut [f32]) {
    let (group, kw, vw) = run_widths(g);
    start_run(g, state);
    s.q.set(q);
    if let Converted::F32(qf) = &mut s.q {
        let q_ty = moxie_quant::vec_dot_type(run.keys.ty).expect("cache types have a dot partner");
        round_through(q_ty, g.dk, qf, &mut s.tmp);
    }
    for (j0, b, chunk) in run.blocks() {
        s.k.put_rows(0, run.keys, j0, b, chunk, 0, kw);
        // MLA's values are the first dv elements of the converted keys.
        let (v, ldv) = match run.values {
            Some(values) => {
                s.v.put_rows(0, values, j0, b, chunk, 0, vw);
                (&s.v, vw)
            }
            None => (&s.k, kw),
        };
        // The next block's rows (contiguous positions) stream in during the first score
        // product.
        let next = (j0 + b).min(run.span.end)..(j0 + b + run.block).min(run.span.end);
        let (rb, data) = (run.keys.row_bytes, run.keys.data);
        let mut ahead = match chunk {
            None => &data[next.start * rb..next.end * rb],
            Some(_) => &[],
        };
        for kvh in 0..g.n_head_kv {
            let heads = kvh * group..(kvh + 1) * group;
            let st = &mut state[heads.start * (g.dv + 2)..heads.end * (g.dv + 2)];
            s.scores.resize(group * b, 0.0);
            let q_at = heads.start * g.dk;
            let ahead = std::mem::take(&mut ahead);
            s.k.scores(
                &s.q,
                q_at,
                group,
                b,
                g.dk,
                kvh * g.dk,
                kw,
                &mut s.scores,
                ahead,
            );
            online_softmax(g, &mut s.scores, b, st);
            s.part.resize(group * g.dv, 0.0);
            v.values(
                group,
                b,
                g.dv,
                &s.scores,
                kvh * g.dv,
                ldv,
                &mut s.p16,
                &mut s.part,
            );
            add_weighted(g, &s.part, st);
        }
    }
}

/// As [`rows_to_f32`], to bf16, for f16 rows.
fn rows_to_bf16(
    rows: CacheRows,
    j0: usize,
    n: usize,
    list: Option<&[u32]>,
    first: usize,
    width: usize,
    out: &mut [u16],
) {
    debug_assert_eq!(rows.ty, GgmlType::F16);
    let convert = |pos: usize, n_pos: usize, out: &mut [u16]| {
        if first == 0 && width == rows.width {
            let bytes = &rows.data[pos * rows.row_bytes..(pos + n_pos) * rows.row_bytes];
            moxie_quant::bf16gemm::f16_to_bf16(bytes, &mut out[..n_pos * width]);
        } else {
            let at = pos * rows.row_bytes + first * 2;
            moxie_quant::bf16gemm::f16_rows_to_bf16(
                &rows.data[at..],
                rows.row_bytes,
                width,
                &mut out[..n_pos * width],
            );
        }
    };
    match list {
        None => convert(j0, n, out),
        Some(l) => {
            for (&pos, row) in l.iter().zip(out.chunks_exact_mut(width)) {
                convert(pos as usize, 1, row);
            }
        }
    }
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

/// Cached positions per tile of batched attention: a thread holds one tile's keys, values and
/// scores, whatever the context (the whole cache as scores and converted rows was ~1 GiB per
/// thread at 131K positions). Below it a row's softmax is over one tile and is computed as
/// ggml's non-flash path does (normalised, probabilities rounded as ggml rounds them).
pub const BATCH_KV_TILE: usize = 512;

/// Query tokens per block of batched attention: their query heads of one kv head share each
/// tile's keys and values, up to 256 query rows (16 tokens of MLA's 16-head bench model, 2 of
/// DeepSeek-V3's 128 heads). One query head per kv head (MLA's expanded prompt attention)
/// takes 64 tokens: 16 rows a tile left each tile's fixed costs (softmax state, the products'
/// edges) on too few rows.
fn batch_block_tokens(group: usize) -> usize {
    if group == 1 {
        return 64;
    }
    (256 / group.max(1)).clamp(1, 16)
}

/// Bytes one thread's buffers of batched attention take at most ([`attend`] with a batch):
/// the queries of one block (as f32 and in the products' type), one tile's converted keys
/// and values (f32, the larger type) and scores, the products' outputs and the running
/// softmax state of the block's rows. Independent of the context; the planner counts it per
/// CPU thread.
pub fn batch_scratch_bytes(n_head: usize, n_head_kv: usize, dk: usize, dv: usize) -> u64 {
    let group = n_head / n_head_kv.max(1);
    let rows = batch_block_tokens(group) * group;
    let tile = BATCH_KV_TILE;
    let floats = 2 * rows * dk // queries: f32 and converted
        + rows.div_ceil(moxie_quant::f32gemm::PANEL_ROWS) * moxie_quant::f32gemm::PANEL_ROWS * dk // packed
        + tile * (dk + dv) // the tile's keys and values
        + rows * tile // scores
        + rows * dv // the weighted values of a tile
        + rows * (dv + 2); // running max, sum and weighted values

    // The bf16 copy of the probabilities, and the queries rounded through the key type.
    let bytes = 2 * rows * tile + rows * dk;
    (4 * floats + bytes) as u64
}

/// [`Numerics::Fast`] attention for a batch of queries, flash-style: per block of tokens and
/// kv head, the cache is walked in tiles of [`BATCH_KV_TILE`] positions, each tile's keys and
/// values converted once for the block's query rows, scores and the weighted sum of values
/// blocked matrix products, and the softmax the running (online) one across tiles. Causal
/// masking is applied to the scores. Rows whose positions fit one tile take ggml's softmax
/// (probabilities rounded to f16 for f16 values in the f32 products, as ggml does). The
/// products are f32, or bf16 with f32 sums under the same conditions as one-token attention
/// ([`bf16_products`]: from [`BF16_FROM_POSITIONS`] positions on an f16 cache, where prompt
/// processing at depth is mostly these products).
fn attend_batch(
    g: AttnGeom,
    q: &[f32],
    keys: CacheRows,
    values: Option<CacheRows>,
    sel: Option<&TopK>,
    out: &mut [f32],
    par: &Parallel,
) {
    let n = q.len() / (g.n_head * g.dk);
    let group = g.n_head / g.n_head_kv;
    let block = batch_block_tokens(group);
    let bf16 = bf16_products(
        g,
        (g.pos0 + n).max(g.n_kv_batch),
        keys,
        values,
        moxie_quant::bf16gemm::bf16_batch_products_fast(),
    );
    // f32 products: queries take the rounding of the key type's dot partner, probabilities
    // f16's when the values are f16, as ggml converts the other operand to them: the fixtures'
    // quantized models amplify that rounding, so skipping it would not be "float rounding"
    // only. bf16 products round both to bf16.
    let q_ty = moxie_quant::vec_dot_type(keys.ty).expect("cache types have a dot partner");
    let round_p = !bf16 && values.unwrap_or(keys).ty == GgmlType::F16;
    // Token t attends to pos0 + t + 1 positions: threads get runs of equal total work, not
    // equal token counts (with two threads the second would otherwise do ~3/4 of it).
    let head_work = g.n_head * (g.dk + g.dv);
    let out_row = g.n_head * g.dv;
    let cost = |t: usize| (g.pos0 + t + 1 + block) * head_work;
    // f32 keys and values (MLA's expanded ones, an f32 cache) are multiplied where they are:
    // (keys, their row width, values, theirs, the values' offset per kv head).
    let direct = match (bf16, keys.as_f32(), values) {
        (false, Some(k), None) => Some((k, keys.width, k, keys.width, g.dk)),
        (false, Some(k), Some(v)) => v.as_f32().map(|vf| (k, keys.width, vf, v.width, g.dv)),
        _ => None,
    };
    par.for_each_run(
        n,
        cost,
        out,
        |t| t * out_row,
        |toks, o| {
            let mut s = match BATCH_SCRATCH.take() {
                Some(s) if s.run.k.is_bf16() == bf16 => s,
                _ => BatchScratch::new(bf16),
            };
            let mut t0 = toks.start;
            while t0 < toks.end {
                let t1 = (t0 + block).min(toks.end);
                let rows = (t1 - t0) * group;
                let kv_len = g.pos0 + t1;
                for kvh in 0..g.n_head_kv {
                    if g.n_head_kv == 1 {
                        // One kv head (MQA, MLA's latent): the block's query rows lie back
                        // to back, no gather.
                        let first = t0 * g.n_head * g.dk;
                        s.run.q.set(&q[first..first + rows * g.dk]);
                    } else {
                        s.qbuf.clear();
                        for t in t0..t1 {
                            let first = (t * g.n_head + kvh * group) * g.dk;
                            s.qbuf.extend_from_slice(&q[first..first + group * g.dk]);
                        }
                        s.run.q.set(&s.qbuf);
                    }
                    // f32 products: the queries rounded as ggml converts them (bf16 ones
                    // were rounded by their conversion).
                    if let Converted::F32(qs) = &mut s.run.q {
                        round_through(q_ty, g.dk, qs, &mut s.run.tmp);
                        // As panels for the f32 scores of every tile.
                        moxie_quant::f32gemm::pack_rows(rows, g.dk, qs, g.dk, &mut s.packed);
                    }
                    // One tile (a context within BATCH_KV_TILE): its normalised probabilities
                    // weight the values straight into the output, no running state.
                    let one_tile = kv_len <= BATCH_KV_TILE;
                    let state_len = if one_tile { 0 } else { rows * (g.dv + 2) };
                    s.state.resize(state_len, 0.0);
                    start_run(g, &mut s.state);
                    for j0 in (0..kv_len).step_by(BATCH_KV_TILE) {
                        let b = BATCH_KV_TILE.min(kv_len - j0);
                        let r = &mut s.run;
                        // Tiles of f32 rows are read where they are (the same values the copy
                        // would hold); others are converted into the run's buffers.
                        let tile = match direct {
                            Some((k, kw, v, vw, v0)) => Tile::Direct {
                                k: &k[j0 * kw + kvh * g.dk..][..(b - 1) * kw + g.dk],
                                kw,
                                v: &v[j0 * vw + v0 * kvh..][..(b - 1) * vw + g.dv],
                                vw,
                            },
                            None => {
                                r.k.put_rows(0, keys, j0, b, None, kvh * g.dk, g.dk);
                                if let Some(values) = values {
                                    r.v.put_rows(0, values, j0, b, None, kvh * g.dv, g.dv);
                                }
                                Tile::Converted
                            }
                        };
                        // MLA's values are the first `dv` elements of its (single) key rows.
                        let (v, ldv) = match values {
                            Some(_) => (&r.v, g.dv),
                            None => (&r.k, g.dk),
                        };
                        r.scores.resize(rows * b, 0.0);
                        // f32 scores from the packed queries (many rows against one tile);
                        // bf16 ones through the converted rows.
                        let f32_keys = match (&tile, &r.k) {
                            (Tile::Direct { k, kw, .. }, _) => Some((*k, *kw)),
                            (Tile::Converted, Converted::F32(k)) => Some((&k[..b * g.dk], g.dk)),
                            (Tile::Converted, Converted::Bf16(_)) => None,
                        };
                        match f32_keys {
                            Some((k, kw)) => moxie_quant::gemm_f32_abt_packed(
                                rows,
                                b,
                                g.dk,
                                &s.packed,
                                k,
                                kw,
                                &mut r.scores,
                                b,
                            ),
                            None => {
                                r.k.scores(&r.q, 0, rows, b, g.dk, 0, g.dk, &mut r.scores, &[])
                            }
                        }
                        for (i, srow) in r.scores.chunks_exact_mut(b).enumerate() {
                            let t = t0 + i / group;
                            // Positions of this tile the row sees (causal).
                            let len = (g.pos0 + t + 1).saturating_sub(j0).min(b);
                            if let Some(allowed) = sel.and_then(|s| s.row(t)) {
                                mask_unselected_from(&mut srow[..len], j0, allowed);
                            }
                            srow[len..].fill(0.0);
                            let srow = &mut srow[..len];
                            if one_tile {
                                srow.iter_mut().for_each(|x| *x *= g.kq_scale);
                                ops::softmax(srow);
                                if round_p {
                                    srow.iter_mut().for_each(|p| *p = f16_round(*p));
                                }
                            } else {
                                let st = &mut s.state[i * (g.dv + 2)..(i + 1) * (g.dv + 2)];
                                online_softmax_row(g.kq_scale, srow, st);
                            }
                        }
                        r.part.resize(rows * g.dv, 0.0);
                        match tile {
                            Tile::Direct { v, vw, .. } => moxie_quant::gemm_f32_ab(
                                rows,
                                b,
                                g.dv,
                                &r.scores,
                                b,
                                v,
                                vw,
                                &mut r.part,
                                g.dv,
                            ),
                            Tile::Converted => {
                                v.values(rows, b, g.dv, &r.scores, 0, ldv, &mut r.p16, &mut r.part)
                            }
                        }
                        if !one_tile {
                            add_weighted(g, &r.part, &mut s.state);
                        }
                    }
                    for i in 0..rows {
                        let (t, hg) = (t0 + i / group, i % group);
                        let at = ((t - toks.start) * g.n_head + kvh * group + hg) * g.dv;
                        let orow = &mut o[at..at + g.dv];
                        if one_tile {
                            orow.copy_from_slice(&s.run.part[i * g.dv..(i + 1) * g.dv]);
                        } else {
                            let st = &s.state[i * (g.dv + 2)..(i + 1) * (g.dv + 2)];
                            let inv = 1.0 / st[1];
                            orow.iter_mut()
                                .zip(&st[2..])
                                .for_each(|(o, &x)| *o = x * inv);
                        }
                    }
                }
                t0 = t1;
            }
            BATCH_SCRATCH.set(Some(s));
        },
    );
}

/// Where one tile's keys and values are for [`attend_batch`]'s products.
enum Tile<'a> {
    /// f32 rows in place: `b` rows of stride `kw` (`vw`) from the tile's first.
    Direct {
        k: &'a [f32],
        kw: usize,
        v: &'a [f32],
        vw: usize,
    },
    /// Converted into the run's buffers (`put_rows`).
    Converted,
}

thread_local! {
    /// Each thread's buffers of batched attention, kept from layer to layer.
    static BATCH_SCRATCH: std::cell::Cell<Option<BatchScratch>> = const { std::cell::Cell::new(None) };
}

/// One thread's buffers of [`attend_batch`] (sized by [`batch_scratch_bytes`]).
struct BatchScratch {
    run: RunScratch,
    qbuf: Vec<f32>,
    /// The block's f32 queries as panels (`moxie_quant::f32gemm::pack_rows`).
    packed: Vec<f32>,
    state: Vec<f32>,
}

impl BatchScratch {
    fn new(bf16: bool) -> BatchScratch {
        BatchScratch {
            run: RunScratch::new(bf16),
            qbuf: Vec::new(),
            packed: Vec::new(),
            state: Vec::new(),
        }
    }

    /// Bytes in use (what [`batch_scratch_bytes`] bounds).
    #[cfg(test)]
    fn bytes(&self) -> usize {
        let r = &self.run;
        let conv = |c: &Converted| match c {
            Converted::F32(v) => 4 * v.len(),
            Converted::Bf16(v) => 2 * v.len(),
        };
        4 * (self.qbuf.len() + self.packed.len() + self.state.len() + r.scores.len() + r.part.len())
            + conv(&r.q)
            + conv(&r.k)
            + conv(&r.v)
            + 2 * r.p16.len()
            + r.tmp.len()
    }
}

/// The online softmax step of one query row over one tile (`scores`, unscaled; masked
/// entries -inf): the row's running `[max, sum, weighted values..]` rescaled to the new max,
/// `scores` turned into exp(scaled score - max). A tile with no visible position (all masked)
/// leaves the state alone and gets zero weights.
fn online_softmax_row(kq_scale: f32, scores: &mut [f32], st: &mut [f32]) {
    let tile_max = lanes_max(scores) * kq_scale;
    if tile_max == f32::NEG_INFINITY {
        scores.fill(0.0);
        return;
    }
    let new_max = st[0].max(tile_max);
    let rescale = (st[0] - new_max).exp();
    st[0] = new_max;
    scores.iter_mut().for_each(|x| *x = *x * kq_scale - new_max);
    let n16 = scores.len() / 16 * 16;
    moxie_quant::vexp::ggml_v_expf_16s(&mut scores[..n16]);
    scores[n16..]
        .iter_mut()
        .for_each(|x| *x = ops::ggml_v_expf(*x));
    st[1] = st[1] * rescale + lanes_sum(scores);
    if rescale != 1.0 {
        st[2..].iter_mut().for_each(|x| *x *= rescale);
    }
}

/// Whether attention over `n_kv` positions takes bf16 products: from [`BF16_FROM_POSITIONS`]
/// on, where `fast` (the CPU's bf16 products outrun f32 ones for the caller's shapes), on an
/// f16 cache with head widths a multiple of 32.
fn bf16_products(
    g: AttnGeom,
    n_kv: usize,
    keys: CacheRows,
    values: Option<CacheRows>,
    fast: bool,
) -> bool {
    n_kv >= BF16_FROM_POSITIONS
        && fast
        && keys.ty == GgmlType::F16
        && values.is_none_or(|v| v.ty == GgmlType::F16)
        && g.dk.is_multiple_of(32)
        && g.dv.is_multiple_of(32)
}

/// Rows in the products' type: f32, or bf16 for bf16 products ([`bf16_products`]), whose
/// rows start on cache lines (AMX tile loads of rows across two lines are ~3x slower).
enum Converted {
    F32(Vec<f32>),
    Bf16(AlignedU16),
}

impl Converted {
    fn new(bf16: bool) -> Converted {
        if bf16 {
            Converted::Bf16(AlignedU16::new())
        } else {
            Converted::F32(Vec::new())
        }
    }

    fn is_bf16(&self) -> bool {
        matches!(self, Converted::Bf16(_))
    }

    /// `x` in this type (copied, or rounded to bf16).
    fn set(&mut self, x: &[f32]) {
        match self {
            Converted::F32(d) => {
                d.clear();
                d.extend_from_slice(x);
            }
            Converted::Bf16(d) => {
                d.resize(x.len(), 0);
                moxie_quant::bf16gemm::f32_to_bf16(x, d);
            }
        }
    }

    /// `n` cached positions from `j0` (or the listed ones), `width` elements of each from
    /// element `first`, as rows of `width` from element `at` (the buffer grows when needed and
    /// is otherwise overwritten in place: no fill per block).
    #[allow(clippy::too_many_arguments)]
    fn put_rows(
        &mut self,
        at: usize,
        src: CacheRows,
        j0: usize,
        n: usize,
        list: Option<&[u32]>,
        first: usize,
        width: usize,
    ) {
        let end = at + n * width;
        match self {
            Converted::F32(d) => {
                if d.len() < end {
                    d.resize(end, 0.0);
                }
                rows_to_f32(src, j0, n, list, first, width, &mut d[at..end]);
            }
            Converted::Bf16(d) => {
                if d.len() < end {
                    d.resize(end, 0);
                }
                rows_to_bf16(src, j0, n, list, first, width, &mut d[at..end]);
            }
        }
    }

    /// `scores` (`m` rows of `n`) = the `m` query rows of `kd` of `q` from element `q_at`
    /// against `n` of these rows (stride `ld`), `kd` elements from element `at`. `prefetch`:
    /// bytes the product brings into L2 meanwhile.
    #[allow(clippy::too_many_arguments)]
    fn scores(
        &self,
        q: &Converted,
        q_at: usize,
        m: usize,
        n: usize,
        kd: usize,
        at: usize,
        ld: usize,
        scores: &mut [f32],
        prefetch: &[u8],
    ) {
        let k_end = at + (n - 1) * ld + kd;
        match (self, q) {
            (Converted::F32(k), Converted::F32(q)) => moxie_quant::gemm_f32_abt(
                m,
                n,
                kd,
                &q[q_at..q_at + m * kd],
                kd,
                &k[at..k_end],
                ld,
                scores,
                n,
                prefetch,
            ),
            (Converted::Bf16(k), Converted::Bf16(q)) => moxie_quant::gemm_bf16_abt(
                m,
                n,
                kd,
                &q[q_at..q_at + m * kd],
                kd,
                &k[at..k_end],
                ld,
                scores,
                n,
                prefetch,
            ),
            _ => unreachable!("queries and keys are converted to the same type"),
        }
    }

    /// `out` (`m` rows of `dv`) = `p` (`m` rows of `n`) times `n` of these rows (stride `ld`),
    /// `dv` elements from element `at`. `p16`: scratch for the probabilities in bf16.
    #[allow(clippy::too_many_arguments)]
    fn values(
        &self,
        m: usize,
        n: usize,
        dv: usize,
        p: &[f32],
        at: usize,
        ld: usize,
        p16: &mut Vec<u16>,
        out: &mut [f32],
    ) {
        let v_end = at + (n - 1) * ld + dv;
        match self {
            Converted::F32(v) => {
                moxie_quant::gemm_f32_ab(m, n, dv, p, n, &v[at..v_end], ld, out, dv);
            }
            Converted::Bf16(v) => {
                p16.resize(p.len(), 0);
                moxie_quant::bf16gemm::f32_to_bf16(p, p16);
                moxie_quant::gemm_bf16_ab(m, n, dv, p16, n, &v[at..v_end], ld, out, dv);
            }
        }
    }
}

/// Set the scores of positions `j0..j0 + scores.len()` not in `allowed` (sorted) to -inf.
fn mask_unselected_from(scores: &mut [f32], j0: usize, allowed: &[u32]) {
    let first = allowed.partition_point(|&p| (p as usize) < j0);
    let mut next = allowed[first..].iter().peekable();
    for (j, s) in (j0..).zip(scores.iter_mut()) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Rows;

    /// The GPU's attention rounds a prompt batch's probabilities to f16 exactly where this
    /// path does (the whole context in one tile, so no bf16 products either): one limit.
    #[test]
    fn the_gpu_rounds_probabilities_where_the_cpu_does() {
        assert_eq!(moxie_gpu::ops::ATTN_ROUND_PROBS_BELOW, BATCH_KV_TILE);
        assert_eq!(BF16_FROM_POSITIONS, BATCH_KV_TILE);
    }

    fn random(s: &mut u64, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((*s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// `n` query tokens (`shape`: heads, kv heads, key and value widths) at the end of a cache
    /// of `n_kv` random positions of type `ty`: the geometry, keys, values and queries.
    fn depth_case(
        s: &mut u64,
        (n_head, n_head_kv, dk, dv): (usize, usize, usize, usize),
        n: usize,
        n_kv: usize,
        ty: GgmlType,
    ) -> (AttnGeom, Rows, Rows, Vec<f32>) {
        let g = AttnGeom {
            n_head,
            n_head_kv,
            dk,
            dv,
            kq_scale: 0.1,
            pos0: n_kv - n,
            n_kv_batch: 0,
        };
        let mut keys = Rows::new(ty, n_head_kv * dk);
        keys.append(&random(s, n_kv * n_head_kv * dk));
        let mut values = Rows::new(ty, n_head_kv * dv);
        values.append(&random(s, n_kv * n_head_kv * dv));
        let q = random(s, n * n_head * dk);
        (g, keys, values, q)
    }

    /// Fast attention at depth (bf16 products where the CPU has them; one token: runs of
    /// positions split between threads and merged; a batch: tiles of the cache with the online
    /// softmax) against the exact path: MLA's shape (one latent kv head, values inside the
    /// keys) and GQA's (separate values), f16 caches and a q8_0 one (f32 products over several
    /// tiles), every position or a DSA-style selection.
    #[test]
    fn fast_attention_at_depth_is_close_to_exact() {
        let mut s = 11;
        let shapes = [(16, 1, 576, 512, true), (8, 2, 128, 128, false)];
        for (n_head, n_head_kv, dk, dv, mla) in shapes {
            for (n, ty, select) in [
                (1, GgmlType::F16, false),
                (4, GgmlType::F16, false),
                (4, GgmlType::Q8_0, false),
                (3, GgmlType::F16, true),
            ] {
                let n_kv = 2048;
                let (g, keys, values, q) =
                    depth_case(&mut s, (n_head, n_head_kv, dk, dv), n, n_kv, ty);
                let vals = (!mla).then(|| values.view());
                // Every third position, and none of the second tile: a tile with nothing
                // visible must leave the running softmax alone.
                let sel = select.then(|| {
                    let rows = (0..n)
                        .map(|t| {
                            (0..=(g.pos0 + t) as u32)
                                .filter(|p| p % 3 == 0 && !(512..1024).contains(p))
                                .collect()
                        })
                        .collect::<Vec<Vec<u32>>>();
                    let mut top = TopK::default();
                    rows.iter().for_each(|r| top.push(r));
                    top
                });
                let run = |numerics| {
                    let mut out = vec![0f32; n * n_head * dv];
                    let par = Parallel::new(2).with_numerics(numerics);
                    attend(g, &q, keys.view(), vals, sel.as_ref(), &mut out, &par);
                    out
                };
                let (exact, fast) = (run(Numerics::Exact), run(Numerics::Fast));
                let scale = exact.iter().fold(0f32, |m, x| m.max(x.abs()));
                let worst = exact
                    .iter()
                    .zip(&fast)
                    .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                assert!(
                    worst <= 1e-2 * scale,
                    "{n} tokens, {n_head}x{dk}, {ty}, selected {select}: worst {worst} of {scale}"
                );
            }
        }
    }

    /// A batch at depth holds one tile of the cache per thread, not the whole of it: the
    /// buffers it used are within [`batch_scratch_bytes`] (what the planner counts per CPU
    /// thread), at 4K positions as at 512.
    #[test]
    fn batch_attention_buffers_do_not_grow_with_the_context() {
        let mut s = 5;
        for (n_head, n_head_kv, dk, dv, mla) in [(16, 1, 576, 512, true), (8, 2, 128, 128, false)] {
            for (n_kv, ty) in [
                (512, GgmlType::F16),
                (4096, GgmlType::F16),
                (4096, GgmlType::Q8_0),
            ] {
                let n = 40;
                let (g, keys, values, q) =
                    depth_case(&mut s, (n_head, n_head_kv, dk, dv), n, n_kv, ty);
                let vals = (!mla).then(|| values.view());
                let mut out = vec![0f32; n * n_head * dv];
                // One thread: the work runs here, so this thread's buffers are the ones used.
                BATCH_SCRATCH.set(None);
                attend(g, &q, keys.view(), vals, None, &mut out, &Parallel::new(1));
                let used = BATCH_SCRATCH.take().expect("the batch ran here").bytes();
                let bound = batch_scratch_bytes(n_head, n_head_kv, dk, dv) as usize;
                // The bound is the larger of the two modes' (f32 products also keep the
                // queries packed; bf16 ones keep half-size rows), so bf16 uses less of it.
                assert!(
                    used <= bound && used > bound / 5,
                    "{n_head}x{dk} at {n_kv} ({ty}): {used} bytes used, {bound} counted"
                );
            }
        }
    }
}
