//! The routed-expert feed-forward block: route each token to its top-k experts, run those
//! experts' SwiGLU blocks, and sum their outputs weighted by the router, plus the shared
//! expert. This is where decode spends most of its time.
//!
//! The router, selection bias and shared expert run on the block's device; the routed experts
//! may live on another one (`-ot exps=CPU` with the rest on a GPU, or the reverse). Then the
//! normed input and the routes cross to the experts' device and their weighted sum crosses
//! back: the same sum, in the same order, as the fused path.
//!
//! On the CPU ([`experts`]) both paths keep the number of parallel hand-offs per layer small
//! and constant:
//! - one token: the selected experts' gate and up projections (and the shared expert's) in one
//!   region, their down projections in another;
//! - a batch: tokens grouped by expert so each expert's weights are read once per batch; one
//!   region gathers each expert's input rows, one computes every (expert, 32-row chunk) of gate
//!   and up plus SiLU·mul, one converts each expert's results for its down projection, one runs
//!   every (expert, chunk) of the down projections, one sums each token's experts.
//!
//! On a GPU: the routing kernel, `mul_mat_id` for gate/up/down, the weighted sum. Host-resident
//! experts of a layer whose router is on a GPU are streamed to it for large batches (llama.cpp's
//! op offload; [`Model::calibrate_op_offload`]).

mod cache;
mod experts;

use moxie_gpu::ops::RouteSpec;
use moxie_gpu::{Buffer, DevPtr, Gpu, Weight};

use crate::blocks::DenseFfn;
use crate::config::{Config, Gating};
use crate::device::{DeviceId, Devices, Resident, CPU};
use crate::forward::{Block, Pass};
use crate::gpu_pass::{weight, GpuPass, F32};
use crate::loader::Vector;
use crate::model::Model;
use crate::ops;
use crate::parallel::Parallel;
use crate::placement::GPU_HEADROOM_BYTES;
use crate::state::LayerState;
use crate::tensor::{Mat, QuantizedActs, Tensor};
use crate::{Error, Result};

pub use cache::{CacheCounts, ExpertCache};
use experts::ActsByType;

/// How router logits become each token's experts and weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Routing {
    pub n_expert: usize,
    /// Experts per token (top-k).
    pub n_expert_used: usize,
    /// How logits become probabilities (`expert_gating_func`).
    pub gating: Gating,
    /// Group-limited selection: `n_groups` groups (1: none), the best `n_group_used` kept.
    pub n_groups: usize,
    pub n_group_used: usize,
    /// Normalise the selected weights to sum to 1.
    pub norm: bool,
    /// Scale the weights (0 or 1: no scaling).
    pub scale: f32,
}

impl Routing {
    /// The routing the model's hyper-parameters describe.
    pub fn from_config(c: &Config) -> Routing {
        Routing {
            n_expert: c.n_expert,
            n_expert_used: c.n_expert_used,
            gating: c.gating,
            n_groups: c.n_expert_groups.max(1),
            n_group_used: c.n_group_used,
            norm: c.expert_weights_norm,
            scale: c.expert_weights_scale,
        }
    }

    /// The same for the GPU's routing kernel.
    fn spec(&self) -> RouteSpec {
        RouteSpec {
            n_expert: self.n_expert,
            k: self.n_expert_used,
            sigmoid: self.gating == Gating::Sigmoid,
            n_groups: self.n_groups,
            n_group_used: self.n_group_used,
            norm: self.norm,
            scale: self.scale,
        }
    }
}

/// Routed experts with their router, and an optional shared expert.
pub struct Moe {
    /// Where the router, selection bias and shared expert are (the layer's FFN part).
    pub device: DeviceId,
    /// Where the routed experts are.
    pub experts_device: DeviceId,
    pub routing: Routing,
    pub router: Tensor,
    /// `exp_probs_b`: selection bias added to probabilities for choosing experts only.
    pub probs_bias: Option<Vector>,
    pub gate_exps: Tensor,
    pub up_exps: Tensor,
    pub down_exps: Tensor,
    pub shared: Option<DenseFfn>,
    /// `ffn_gate_inp_shexp` (qwen3next): the shared expert's output is scaled per token by
    /// sigmoid(this · the layer input).
    pub shared_gate: Option<Tensor>,
    /// Routing telemetry of a layer routed on a GPU whose routes stay there: a zeroed
    /// `route_tally` buffer in that GPU's memory, emptied into the model's counters by
    /// [`crate::Model::flush_routing`].
    pub tally: Option<moxie_gpu::Buffer>,
    /// Experts placed one by one on another device (`-oe`), if any.
    pub hot: Option<HotExperts>,
    /// `--expert-cache`'s share of this layer, if any.
    pub cache: Option<ExpertCache>,
}

/// A layer's routed experts that `-oe` placed on another device than the rest of them, held
/// against that device's budget. Simulated devices only so far: the CPU computes the layer as
/// ever (so the logits are the all-CPU ones) while the counters book the hot experts' reads on
/// their device and the rows that would cross to it and back.
pub struct HotExperts {
    pub device: DeviceId,
    /// Per expert of the layer: whether it is on `device`.
    pub is_hot: Vec<bool>,
    pub held: crate::device::Reservation,
    /// On a GPU (the one running the layer's router): their copies there, which compute them.
    pub gpu: Option<GpuHotCopies>,
}

/// Copies of some of a layer's experts in a GPU's memory: its gate, up and down matrices,
/// `n` of each (slots), which `-oe`'s hot experts and the expert cache compute from.
pub struct GpuExpertSlots {
    bufs: [Buffer; 3],
    n: usize,
}

impl GpuExpertSlots {
    /// `n` empty slots of `m`'s experts' shape in `gpu`'s memory.
    pub fn new(gpu: &Gpu, m: &Moe, n: usize) -> Result<GpuExpertSlots> {
        let slots = |t: &Tensor| Buffer::new(gpu.backend(), t.row_bytes() * t.ne[1] * n);
        Ok(GpuExpertSlots {
            bufs: [
                slots(&m.gate_exps)?,
                slots(&m.up_exps)?,
                slots(&m.down_exps)?,
            ],
            n,
        })
    }

    /// `m`'s expert `e` copied into slot `slot` (queued on the GPU's stream).
    pub fn fill(&self, gpu: &Gpu, m: &Moe, e: usize, slot: usize) -> Result<()> {
        self.fill_run(gpu, m, e, 1, slot).map(|_| ())
    }

    /// `m`'s experts `e..e + count` copied into slots `slot..slot + count`, one copy per
    /// matrix (queued on the GPU's stream); the bytes copied.
    fn fill_run(&self, gpu: &Gpu, m: &Moe, e: usize, count: usize, slot: usize) -> Result<usize> {
        if slot + count > self.n {
            return Err(Error::Model(format!(
                "experts {e}..{} into slots {slot}.. of {}",
                e + count,
                self.n
            )));
        }
        let mut copied = 0;
        for (t, b) in [&m.gate_exps, &m.up_exps, &m.down_exps]
            .into_iter()
            .zip(&self.bufs)
        {
            let bytes = t.matrices_gguf_bytes(e, count);
            gpu.backend()
                .upload(b.at(slot * (bytes.len() / count)), &bytes)?;
            copied += bytes.len();
        }
        Ok(copied)
    }

    /// The slots as kernel operands, shaped like `m`'s tensors.
    fn operands(&self, m: &Moe) -> [Weight; 3] {
        let w = |t: &Tensor, b: &Buffer| Weight {
            n_mat: self.n,
            ..t.weight_at(b.ptr())
        };
        [
            w(&m.gate_exps, &self.bufs[0]),
            w(&m.up_exps, &self.bufs[1]),
            w(&m.down_exps, &self.bufs[2]),
        ]
    }
}

/// The hot experts' copies on a GPU, in their order, and where each expert of the layer sits
/// among them.
pub struct GpuHotCopies {
    slots: GpuExpertSlots,
    /// Per expert of the layer: its slot, or -1 (computed on the CPU).
    slot_of: Vec<i32>,
}

impl GpuHotCopies {
    /// `m`'s `experts` (sorted) copied into `gpu`'s memory.
    pub fn upload(gpu: &Gpu, m: &Moe, experts: &[usize]) -> Result<GpuHotCopies> {
        let slots = GpuExpertSlots::new(gpu, m, experts.len())?;
        let mut slot_of = vec![-1i32; m.routing.n_expert];
        for (slot, &e) in experts.iter().enumerate() {
            slots.fill(gpu, m, e, slot)?;
            slot_of[e] = slot as i32;
        }
        Ok(GpuHotCopies { slots, slot_of })
    }
}

impl Moe {
    pub fn matrices(&self) -> Vec<&Tensor> {
        let mut m = vec![
            &self.router,
            &self.gate_exps,
            &self.up_exps,
            &self.down_exps,
        ];
        if let Some(s) = &self.shared {
            m.extend(s.matrices());
        }
        m.extend(&self.shared_gate);
        m
    }

    /// [`Moe::matrices`], to replace.
    pub fn matrices_mut(&mut self) -> Vec<&mut Tensor> {
        let mut m = vec![
            &mut self.router,
            &mut self.gate_exps,
            &mut self.up_exps,
            &mut self.down_exps,
        ];
        if let Some(s) = &mut self.shared {
            m.extend(s.matrices_mut());
        }
        m.extend(&mut self.shared_gate);
        m
    }

    /// The shared expert (if any) of `n` rows of `h` on the host, gated where the model
    /// gates it: the term [`forward`] adds after the routed experts.
    fn shared_cpu(
        &self,
        h: &[f32],
        n: usize,
        par: &Parallel,
    ) -> Result<Option<crate::scratch::Buf>> {
        let Some(sh) = &self.shared else {
            return Ok(None);
        };
        let mut out = sh.cpu_rows(h, n, None, par)?;
        if let Some(g) = &self.shared_gate {
            gate_shared_rows(g, h, &mut out, par)?;
        }
        Ok(Some(out))
    }

    /// The hidden size (the experts' input width).
    pub fn n_embd(&self) -> usize {
        self.gate_exps.ne[0]
    }

    /// Bytes of one expert's gate, up and down weights (every expert's are the same size).
    pub fn expert_bytes(&self) -> u64 {
        self.routed_bytes() / self.routing.n_expert.max(1) as u64
    }

    /// Bytes of the routed experts' weights.
    pub fn routed_bytes(&self) -> u64 {
        [&self.gate_exps, &self.up_exps, &self.down_exps]
            .iter()
            .map(|t| t.data().len() as u64)
            .sum()
    }
}

/// `rows[t] *= sigmoid(w · h[t])` for every token `t` (`w` has one output): qwen3next's gate of
/// the shared expert, as ggml's product, sigmoid op and broadcast multiply.
fn gate_shared_rows(w: &Tensor, h: &[f32], rows: &mut [f32], par: &Parallel) -> Result<()> {
    let m = w.matrix()?;
    let n = h.len() / m.n_in;
    if n == 0 || rows.len() < n {
        return Ok(());
    }
    let mut logits = vec![0f32; n * m.n_out];
    m.matmul(par, h, &mut logits);
    for (row, &l) in rows.chunks_exact_mut(rows.len() / n).zip(&logits) {
        let g = ops::sigmoid(l);
        row.iter_mut().for_each(|v| *v *= g);
    }
    Ok(())
}

/// Choose the experts for one token from its router logits: probabilities by the gating
/// function, top-k by probability plus selection bias (within the best expert groups when the
/// model uses group-limited routing), then weights = the unbiased probabilities, normalised
/// and scaled as configured. Returns (expert, weight) in selection order.
pub fn route_top_k(r: &Routing, logits: &[f32], bias: Option<&[f32]>) -> Vec<(usize, f32)> {
    let mut out = Vec::new();
    route_top_k_into(r, logits, bias, &mut RouteScratch::default(), &mut out);
    out
}

/// The working buffers of [`route_top_k_into`], kept between tokens so decode routes without
/// allocating.
#[derive(Default)]
pub struct RouteScratch {
    probs: Vec<f32>,
    sel: Vec<f32>,
    groups: Vec<(usize, f32)>,
    keep: Vec<bool>,
    idx: Vec<usize>,
}

/// [`route_top_k`], appended to `out`, with reusable buffers.
pub fn route_top_k_into(
    r: &Routing,
    logits: &[f32],
    bias: Option<&[f32]>,
    s: &mut RouteScratch,
    out: &mut Vec<(usize, f32)>,
) {
    let RouteScratch {
        probs,
        sel,
        groups,
        keep,
        idx,
    } = s;
    probs.clear();
    probs.extend_from_slice(logits);
    match r.gating {
        Gating::Softmax => ops::softmax(probs),
        Gating::Sigmoid => probs.iter_mut().for_each(|p| *p = ops::sigmoid(*p)),
    }
    sel.clear();
    match bias {
        Some(b) => sel.extend(probs.iter().zip(b).map(|(p, b)| p + b)),
        None => sel.extend_from_slice(probs),
    }
    if r.n_groups > 1 {
        let per = r.n_expert / r.n_groups;
        // Group score: sum of the group's two best selection scores.
        groups.clear();
        groups.extend(sel.chunks_exact(per).enumerate().map(|(g, s)| {
            let mut best = [f32::NEG_INFINITY; 2];
            for &v in s {
                if v > best[0] {
                    best[1] = best[0];
                    best[0] = v;
                } else if v > best[1] {
                    best[1] = v;
                }
            }
            let second = if per > 1 { best[1] } else { 0.0 };
            (g, best[0] + second)
        }));
        // Best first, ties to the lower group (a stable sort's order, without its buffer).
        groups.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        keep.clear();
        keep.resize(r.n_groups, false);
        for &(g, _) in groups.iter().take(r.n_group_used) {
            keep[g] = true;
        }
        for (g, s) in sel.chunks_exact_mut(per).enumerate() {
            if !keep[g] {
                s.iter_mut().for_each(|v| *v = f32::NEG_INFINITY);
            }
        }
    }
    // Best first, ties to the lower expert: a total order, so selecting the k best and then
    // sorting only those gives the full sort's first k.
    let order = |a: &usize, b: &usize| sel[*b].total_cmp(&sel[*a]).then(a.cmp(b));
    idx.clear();
    idx.extend(0..sel.len());
    let k = r.n_expert_used.min(idx.len());
    if k > 0 && k < idx.len() {
        idx.select_nth_unstable_by(k - 1, order);
    }
    idx.truncate(k);
    idx.sort_unstable_by(order);
    let first = out.len();
    out.extend(idx.iter().map(|&e| (e, probs[e])));
    let out = &mut out[first..];
    if r.norm {
        // ggml_sum_rows accumulates in f64.
        let sum = out.iter().map(|x| x.1 as f64).sum::<f64>() as f32;
        let sum = sum.max(6.103_515_6e-5);
        out.iter_mut().for_each(|x| x.1 /= sum);
    }
    let s = r.scale;
    if s != 0.0 && s != 1.0 {
        out.iter_mut().for_each(|x| x.1 *= s);
    }
}

/// Everything the one-token path writes, kept from token to token so that decode allocates
/// nothing once the first token has sized the buffers (checked by `tests/decode_alloc.rs`).
#[derive(Default)]
pub struct MoeScratch {
    router_in: QuantizedActs,
    logits: Vec<f32>,
    routing: RouteScratch,
    /// Every token's routes, top-k each, token after token.
    routes: Vec<(usize, f32)>,
    /// The layer input, once per activation type the gate/up matrices consume.
    inputs: ActsByType,
    /// Gate, up and shared gate, up results, then SiLU·mul in the gate part.
    gate_up: Vec<f32>,
    down_in: QuantizedActs,
    shared_down_in: QuantizedActs,
    down: Vec<f32>,
    /// (matrix, activation row) lists for [`crate::tensor::gemv_many`]; empty between uses,
    /// only the allocation is kept (see [`experts::recycle`]).
    products: Vec<(Mat<'static>, &'static [u8])>,
    out: Vec<f32>,
    /// Which experts the routes select, for counting each once ([`count_expert_reads`]), and
    /// the distinct ones in order of first selection.
    seen: Vec<bool>,
    selected: Vec<usize>,
    /// Per expert: computed elsewhere (hot experts on the GPU running the layer), so the CPU
    /// paths leave its selections out of their sum. Empty: none.
    skip: Vec<bool>,
    /// The slots of the one-token path's route that it computes.
    active: Vec<usize>,
    /// Routes remapped to the hot experts' copies on a GPU.
    hot_ids: Vec<i32>,
    /// What the layer's expert cache brought in after the last pass: `(expert, slot)`.
    brought_in: Vec<(usize, usize)>,
}

impl MoeScratch {
    /// The routes of the last [`route`]: top-k (expert, weight) per token, token after token.
    pub fn routes(&self) -> &[(usize, f32)] {
        &self.routes
    }

    /// Forget the last routes (so a layer that routes nowhere on the host leaves none).
    pub fn clear_routes(&mut self) {
        self.routes.clear();
    }

    /// Routes chosen elsewhere (by a GPU's router): `ids[i]` with `weights[i]`, top-k per
    /// token, token after token. Fails on an expert id outside `0..n_expert`.
    pub fn set_routes(&mut self, ids: &[i32], weights: &[f32], n_expert: usize) -> Result<()> {
        // New routes: whatever the last layer left to another device is computed here again.
        self.skip.clear();
        self.routes.clear();
        for (&e, &w) in ids.iter().zip(weights) {
            let e = usize::try_from(e)
                .ok()
                .filter(|&e| e < n_expert)
                .ok_or_else(|| Error::Model(format!("MoE: routed to expert {e} of {n_expert}")))?;
            self.routes.push((e, w));
        }
        Ok(())
    }
}

/// The MoE layer for `n` rows of `h` (each `n_embd` long, already normed), as the forward pass
/// runs it when the routed experts live with the rest of the layer: [`route`], then
/// [`routed_experts`] with the shared expert fused in. Public for the micro-benchmarks. The
/// result (`n * n_embd` values) lives in `scratch` until its next use.
pub fn forward<'s>(
    m: &Moe,
    h: &[f32],
    n: usize,
    par: &Parallel,
    scratch: &'s mut MoeScratch,
) -> Result<&'s [f32]> {
    route(m, h, n, par, scratch)?;
    run_experts(m, h, n, par, scratch, true)?;
    Ok(&scratch.out)
}

/// Each of the `n` tokens' top-k experts and weights from the router, into `scratch` (read by
/// [`routed_experts`], and by [`MoeScratch::routes`] for whoever moves them between devices).
pub fn route(m: &Moe, h: &[f32], n: usize, par: &Parallel, s: &mut MoeScratch) -> Result<()> {
    s.skip.clear();
    let router = m.router.matrix()?;
    let r = &m.routing;
    s.router_in.refill(par, router.act_type(), m.n_embd(), h);
    s.logits.resize(n * r.n_expert, 0.0);
    router.matmul_q(par, &s.router_in, &mut s.logits);
    s.routes.clear();
    let bias = m.probs_bias.as_deref();
    if n == 1 {
        // Decode: the kept buffers, no allocation.
        route_top_k_into(r, &s.logits, bias, &mut s.routing, &mut s.routes);
        return Ok(());
    }
    // A batch's tokens are routed over the threads, each token alone (the same routes).
    let k = r.n_expert_used.min(r.n_expert);
    s.routes.resize(n * k, (0, 0.0));
    let logits = &s.logits;
    par.for_each_range(n, 16 * r.n_expert, &mut s.routes, k, |toks, out| {
        let (mut scratch, mut one) = (RouteScratch::default(), Vec::with_capacity(k));
        for (t, o) in toks.zip(out.chunks_exact_mut(k)) {
            one.clear();
            let l = &logits[t * r.n_expert..(t + 1) * r.n_expert];
            route_top_k_into(r, l, bias, &mut scratch, &mut one);
            o.copy_from_slice(&one);
        }
    });
    Ok(())
}

/// The routed experts alone (no shared expert) for the routes [`route`] left in `scratch`: the
/// weighted sum per token, `n * n_embd` values. Used where the routed experts live on another
/// device than the rest of the layer; the caller adds the shared expert (the same sum as
/// [`forward`]'s: routed experts in selection order, then the shared expert).
pub fn routed_experts<'s>(
    m: &Moe,
    h: &[f32],
    n: usize,
    par: &Parallel,
    scratch: &'s mut MoeScratch,
) -> Result<&'s [f32]> {
    run_experts(m, h, n, par, scratch, false)?;
    Ok(&scratch.out)
}

fn run_experts(
    m: &Moe,
    h: &[f32],
    n: usize,
    par: &Parallel,
    s: &mut MoeScratch,
    with_shared: bool,
) -> Result<()> {
    let k = m.routing.n_expert_used;
    if s.routes.len() != n * k {
        return Err(Error::Model(format!(
            "MoE: {} routes for {n} tokens of top-{k}",
            s.routes.len()
        )));
    }
    let shared = if with_shared { m.shared.as_ref() } else { None };
    if n == 1 {
        experts::one_token(m, h, par, s, shared)
    } else {
        experts::batch(m, h, par, &s.routes, &s.skip, shared, &mut s.out)
    }
}

/// Count the routed-expert weights that the routes in `s` (for `n` tokens) make device `dev`
/// read: each selected expert's gate, up and down once, however many tokens chose it. Hot
/// experts ([`HotExperts`]) and a decode step's cache hits ([`ExpertCache`]) are read on their
/// device, which the tokens' rows and routes cross to and their weighted sum back from, when
/// any token chose one; the cache's uploads after the step are copies to its device.
fn count_expert_reads(m: &Moe, devices: &Devices, dev: DeviceId, n: usize, s: &mut MoeScratch) {
    s.seen.clear();
    s.seen.resize(m.routing.n_expert, false);
    s.selected.clear();
    let (mut cold, mut hot) = (0u64, 0u64);
    for &(e, _) in &s.routes {
        if !std::mem::replace(&mut s.seen[e], true) {
            s.selected.push(e);
            match &m.hot {
                Some(h) if h.is_hot[e] => hot += 1,
                _ => cold += 1,
            }
        }
    }
    let phase = crate::telemetry::Phase::of_batch(n);
    let bytes = m.expert_bytes();
    let rows = n * m.n_embd() * F32;
    if let Some(c) = &m.cache {
        let (hits, uploads) = c.step(&s.selected, n, &s.routes, &mut s.brought_in);
        cold -= hits;
        if hits > 0 {
            devices.count_expert_reads(c.device, phase, hits * bytes);
            devices.count_copy(dev, c.device, rows + std::mem::size_of_val(s.routes()));
            devices.count_copy(c.device, dev, rows);
        }
        devices.count_copy(CPU, c.device, (uploads * bytes) as usize);
    }
    devices.count_expert_reads(dev, phase, cold * bytes);
    if let Some(h) = m.hot.as_ref().filter(|_| hot > 0) {
        devices.count_expert_reads(h.device, phase, hot * bytes);
        devices.count_copy(dev, h.device, rows + std::mem::size_of_val(s.routes()));
        devices.count_copy(h.device, dev, rows);
    }
}

/// The rows an MoE layer with its routed experts on another device sends there (its normed
/// input) and gets back (their weighted sum), kept for all layers of a forward pass.
pub(crate) struct SplitMoeBuffers<'d> {
    input: Resident<'d>,
    sum: Resident<'d>,
}

impl<'d> SplitMoeBuffers<'d> {
    pub(crate) fn new(devices: &'d Devices) -> SplitMoeBuffers<'d> {
        SplitMoeBuffers {
            input: Resident::new(devices, CPU, Vec::new()),
            sum: Resident::new(devices, CPU, Vec::new()),
        }
    }
}

impl Block for Moe {
    fn device(&self) -> DeviceId {
        self.device
    }

    fn cpu(&self, p: &mut Pass, h: &[f32], x: &mut [f32], _: &mut LayerState) -> Result<()> {
        if self.experts_device == self.device {
            let out = forward(self, h, p.n, p.par, &mut p.moe)?;
            ops::add_assign_par(p.par, x, out);
            count_expert_reads(self, p.devices, self.device, p.n, &mut p.moe);
            return Ok(());
        }
        // The routed experts live elsewhere (e.g. `-ot exps=CPU` with the rest on a GPU):
        // route here, send the normed input and the routes to the experts' device, run them
        // there, bring their weighted sum back and add the shared expert: the sum
        // [`forward`] forms.
        let (n, dev, edev) = (p.n, self.device, self.experts_device);
        route(self, h, n, p.par, &mut p.moe)?;
        count_expert_reads(self, p.devices, edev, n, &mut p.moe);
        // The routes cross too: an expert id and a weight per selection.
        let route_bytes = std::mem::size_of_val(p.moe.routes());
        p.devices.count_copy(dev, edev, route_bytes);
        if p.devices.gpu(edev).is_some() {
            p.devices.count_copy(dev, edev, std::mem::size_of_val(h));
            let (g, moe) = (&mut p.gpu, &p.moe);
            p.split.sum.fill(dev, |rows| {
                self.experts_on_gpu_from_host(g, moe, edev, h, rows)
            })?;
            p.devices.count_copy(edev, dev, std::mem::size_of_val(h));
        } else {
            p.split.input.load(dev, h);
            let routed = routed_experts(self, p.split.input.on(edev)?, n, p.par, &mut p.moe)?;
            p.split.sum.load(edev, routed);
        }
        let sum = p.split.sum.on(dev)?;
        if let Some(sh) = self.shared_cpu(h, n, p.par)? {
            ops::add_assign_par(p.par, sum, &sh);
        }
        ops::add_assign_par(p.par, x, sum);
        Ok(())
    }

    /// The router on GPU `id` (`x` and `h` there). Routed experts on another device get the
    /// normed input and the routes, and send back their weighted sum; the shared expert runs
    /// on the GPU meanwhile (launches are queued, so the GPU works while the host computes the
    /// experts).
    fn gpu(
        &self,
        p: &mut Pass,
        id: DeviceId,
        h: DevPtr,
        x: DevPtr,
        _: &mut LayerState,
    ) -> Result<()> {
        let gpu = p.gpu.gpu(id)?;
        let (n, e) = (p.n, self.n_embd());
        let r = &self.routing;
        let k = r.n_expert_used;
        let router = weight(&self.router)?;
        let logits = p.gpu.buf(id, "router_logits", n * r.n_expert)?;
        gpu.mul_mat(&router, 1, h, e, 0, logits, r.n_expert, 0, n)?;
        // The routes (ids, then weights) go after room for a copy of `h`: experts on the host
        // get the normed input and the routes in one download.
        let crossing = p.gpu.buf(id, "moe_crossing", n * e + 2 * n * k)?;
        let ids = crossing.offset::<f32>(n * e);
        let weights = crossing.offset::<f32>(n * e + n * k);
        let bias = match &self.probs_bias {
            Some(b) => Some(b.ptr("exp_probs_b")?),
            None => None,
        };
        gpu.route(r.spec(), logits, bias, ids, weights, n)?;
        // Op offload: a large batch streams host experts here, as many at a time as fit.
        let stream_chunk = if self.experts_device == CPU && n >= p.op_offload_min_batch {
            self.stream_chunk_experts(p.devices, id, n, p.op_offload_buffer_limit)
        } else {
            0
        };
        let io = [h, ids, weights, x];
        // (false where the GPU could not give the streamed experts' memory after all: the
        // host computes them below.)
        let streamed =
            stream_chunk > 0 && self.streamed_experts_gpu(p, &gpu, id, n, stream_chunk, io)?;
        if self.experts_device == id || streamed {
            if !streamed {
                let experts = self.resident_experts()?;
                self.routed_experts_gpu(&mut p.gpu, &gpu, id, n, experts, io, true)?;
            }
            // The routes stay on the GPU: count them there.
            if let Some(t) = &self.tally {
                let phase = crate::telemetry::Phase::of_batch(n) as usize;
                gpu.route_tally(ids, weights, n, k, r.n_expert, phase, t.ptr())?;
            }
            if let Some(o) = self.shared_gpu(&mut p.gpu, &gpu, id, h, n)? {
                gpu.add(x, o, n * e)?;
            }
            return Ok(());
        }
        // The normed input and the routes go to the experts' device.
        // One download (one wait for the GPU) instead of three.
        let mut host = p.gpu.take_host(id)?;
        let mut host_h = p.take_h();
        host_h.resize(n * e + 2 * n * k, 0.0);
        gpu.copy_rows(crossing, e, h, e, n, e)?;
        gpu.backend()
            .download(crossing, bytemuck::cast_slice_mut(&mut host_h))?;
        let (ids_bits, route_weights) = host_h[n * e..].split_at(n * k);
        host.ids.clear();
        host.ids
            .extend_from_slice(bytemuck::cast_slice::<f32, i32>(ids_bits));
        host.weights.clear();
        host.weights.extend_from_slice(route_weights);
        host_h.truncate(n * e);
        p.devices
            .count_copy(id, self.experts_device, (n * e + 2 * n * k) * F32);
        // Queue the shared expert before the host starts on the routed ones.
        if let Some(o) = self.shared_gpu(&mut p.gpu, &gpu, id, h, n)? {
            gpu.add(x, o, n * e)?;
        }
        p.moe.set_routes(&host.ids, &host.weights, r.n_expert)?;
        // Experts this GPU holds (hot copies, or a decode step's cache residents) compute their
        // selections here (routes remapped to their copies, -1 for the others: rows of
        // zeros); the CPU leaves them out of its sum.
        if let Some(operands) = self.experts_here(id, n, &host.ids, &mut p.moe) {
            if p.moe.hot_ids.iter().any(|&s| s >= 0) {
                let ids_hot = p.gpu.buf(id, "hot_ids", n * k)?;
                gpu.backend()
                    .upload(ids_hot, bytemuck::cast_slice(&p.moe.hot_ids))?;
                let out = p.gpu.buf(id, "hot_sum", n * e)?;
                let io = [h, ids_hot, weights, out];
                self.routed_experts_gpu(&mut p.gpu, &gpu, id, n, operands, io, false)?;
                gpu.add(x, out, n * e)?;
            }
        }
        count_expert_reads(self, p.devices, self.experts_device, n, &mut p.moe);
        // What the cache brought in goes to its slots, queued after this step's kernels (one
        // stream), while the CPU computes the step's other experts.
        if let Some(c) = self.cache.as_ref().filter(|c| c.device == id) {
            if let Some(slots) = &c.gpu {
                for &(ex, slot) in &p.moe.brought_in {
                    slots.fill(&gpu, self, ex, slot)?;
                }
            }
        }
        let s = p.gpu.buf(id, "expert_sum", n * e)?;
        if p.devices.gpu(self.experts_device).is_some() {
            // Experts on another GPU: through the host.
            let mut sum = std::mem::take(&mut host.rows);
            self.experts_on_gpu_from_host(
                &mut p.gpu,
                &p.moe,
                self.experts_device,
                &host_h,
                &mut sum,
            )?;
            gpu.backend().upload(s, bytemuck::cast_slice(&sum))?;
            host.rows = sum;
        } else {
            let routed = routed_experts(self, &host_h, n, p.par, &mut p.moe)?;
            gpu.backend().upload(s, bytemuck::cast_slice(routed))?;
        }
        p.devices.count_copy(self.experts_device, id, n * e * F32);
        gpu.add(x, s, n * e)?;
        p.gpu.give_host(id, host);
        p.give_h(host_h);
        Ok(())
    }
}

impl Moe {
    /// The experts GPU `id` holds for this pass, as kernel operands, with the routes `ids`
    /// remapped to them in `s.hot_ids` and the CPU told to skip them (`s.skip`): the hot
    /// copies (`-oe`), or for a decode step the cache's residents.
    fn experts_here(
        &self,
        id: DeviceId,
        n: usize,
        ids: &[i32],
        s: &mut MoeScratch,
    ) -> Option<[Weight; 3]> {
        if let Some(h) = self.hot.as_ref().filter(|h| h.device == id) {
            let copies = h.gpu.as_ref()?;
            remap_to_slots(ids, &copies.slot_of, &mut s.hot_ids);
            s.skip.clone_from(&h.is_hot);
            return Some(copies.slots.operands(self));
        }
        let c = self.cache.as_ref().filter(|c| c.device == id && n == 1)?;
        let slots = c.gpu.as_ref()?;
        c.residents(ids, &mut s.hot_ids, &mut s.skip);
        Some(slots.operands(self))
    }

    /// The shared expert (if any) of `n` rows `h` on GPU `id`, gated where the model gates
    /// it, into a work buffer there.
    fn shared_gpu(
        &self,
        gp: &mut GpuPass,
        gpu: &Gpu,
        id: DeviceId,
        h: DevPtr,
        n: usize,
    ) -> Result<Option<DevPtr>> {
        let Some(sh) = &self.shared else {
            return Ok(None);
        };
        let o = sh.gpu_rows(gp, gpu, id, h, n)?;
        if let Some(g) = &self.shared_gate {
            let w = weight(g)?;
            let e = self.n_embd();
            let logits = gp.buf(id, "shared_gate", n * w.n_out)?;
            gpu.mul_mat(&w, 1, h, e, 0, logits, w.n_out, 0, n)?;
            gpu.mul_sigmoid(o, logits, n * e, e)?;
        }
        Ok(Some(o))
    }

    /// The routed experts (`[gate, up, down]` weights in this GPU's memory) on GPU `id` for
    /// `n` tokens `h` with routes `ids`/`weights` already there: `out (+)=` their weighted sum.
    #[allow(clippy::too_many_arguments)]
    fn routed_experts_gpu(
        &self,
        gp: &mut GpuPass,
        gpu: &Gpu,
        id: DeviceId,
        n: usize,
        [gate, up, down]: [Weight; 3],
        [h, ids, weights, out]: [DevPtr; 4],
        accumulate: bool,
    ) -> Result<()> {
        let (k, e) = (self.routing.n_expert_used, self.n_embd());
        let d = gp.buf(id, "exp_down", n * k * e)?;
        self.expert_rows_gpu(gp, gpu, id, n, [gate, up, down], h, ids, d)?;
        gpu.moe_sum(d, weights, out, n, k, e, accumulate)?;
        Ok(())
    }

    /// One chunk of op offload's experts (`operands`, the chunk's copies) for `n` tokens `h`:
    /// the routes remapped to the chunk's slots (`local`, -1 for the other chunks' experts)
    /// go to `chunk_ids`, and the expert rows go into `rows` for the first chunk, else into
    /// `part` and are added to `rows` (the other chunks' rows are zero there).
    #[allow(clippy::too_many_arguments)]
    fn chunk_rows_gpu(
        &self,
        gp: &mut GpuPass,
        gpu: &Gpu,
        id: DeviceId,
        n: usize,
        operands: [Weight; 3],
        local: &[i32],
        first: bool,
        [h, chunk_ids, rows, part]: [DevPtr; 4],
    ) -> Result<()> {
        gpu.backend()
            .upload(chunk_ids, bytemuck::cast_slice(local))?;
        if first {
            return self.expert_rows_gpu(gp, gpu, id, n, operands, h, chunk_ids, rows);
        }
        self.expert_rows_gpu(gp, gpu, id, n, operands, h, chunk_ids, part)?;
        let (k, e) = (self.routing.n_expert_used, self.n_embd());
        gpu.add(rows, part, n * k * e)?;
        Ok(())
    }

    /// Each (token, slot)'s expert output, before the weighted sum: `d[t·k + j]` = expert
    /// `ids[t·k + j]`'s SwiGLU block of `h[t]`, a row of zeros where the id is not one of the
    /// `[gate, up, down]` operands' experts.
    #[allow(clippy::too_many_arguments)]
    fn expert_rows_gpu(
        &self,
        gp: &mut GpuPass,
        gpu: &Gpu,
        id: DeviceId,
        n: usize,
        [gate, up, down]: [Weight; 3],
        h: DevPtr,
        ids: DevPtr,
        d: DevPtr,
    ) -> Result<()> {
        let (k, e) = (self.routing.n_expert_used, self.n_embd());
        let n_ff = gate.n_out;
        let g = gp.buf(id, "exp_gate", n * k * n_ff)?;
        let u = gp.buf(id, "exp_up", n * k * n_ff)?;
        gpu.mul_mat_ids(&[(&gate, g, n_ff), (&up, u, n_ff)], ids, n * k, h, e, k)?;
        gpu.swiglu(g, u, n * k * n_ff)?;
        gpu.mul_mat_id(&down, ids, n * k, g, n_ff, 1, d, e)?;
        Ok(())
    }

    /// The expert weights as they sit in GPU memory.
    fn resident_experts(&self) -> Result<[Weight; 3]> {
        Ok([
            weight(&self.gate_exps)?,
            weight(&self.up_exps)?,
            weight(&self.down_exps)?,
        ])
    }

    /// How many of this layer's experts op offload can stream to GPU `id` at a time for a
    /// batch of `n` tokens: what the GPU's budget has left after what it holds, the planner's
    /// headroom and this batch's expert work buffers (counted whole, held already or not),
    /// within `limit` bytes. 0 when not one expert fits: the CPU computes them.
    fn stream_chunk_experts(&self, devices: &Devices, id: DeviceId, n: usize, limit: u64) -> usize {
        let device = devices.get(id);
        let (k, e) = (self.routing.n_expert_used, self.n_embd());
        let n_ff = self.gate_exps.ne[1];
        // exp_gate, exp_up; exp_down and offload_rows; offload_ids.
        let work = (n * k * (2 * n_ff + 2 * e + 1) * F32) as u64;
        let free = device.budget.map_or(u64::MAX, |b| {
            b.saturating_sub(device.stats().resident_bytes + GPU_HEADROOM_BYTES + work)
        });
        let per_expert = self.expert_bytes().max(1);
        (free.min(limit) / per_expert).min(self.routing.n_expert as u64) as usize
    }

    /// llama.cpp's op offload, in chunks: the host-resident experts that this batch's routes
    /// (`ids` on GPU `id`) selected are copied to the GPU, `chunk` experts at a time, and run
    /// there; `x += ` their weighted sum. Each chunk's expert rows are zero for the routes to
    /// other chunks, and they add up in one buffer before the one weighted sum, so the result
    /// is the one of computing every expert at once, bit for bit, whatever the chunk size.
    /// Experts no token chose are not copied. `false` (nothing done) where the memory for
    /// the chunk's copies cannot be had after all (its budget, or the device's allocator):
    /// the caller computes the experts on the host instead.
    fn streamed_experts_gpu(
        &self,
        p: &mut Pass,
        gpu: &Gpu,
        id: DeviceId,
        n: usize,
        chunk: usize,
        [h, ids, weights, x]: [DevPtr; 4],
    ) -> Result<bool> {
        let (k, e, n_expert) = (
            self.routing.n_expert_used,
            self.n_embd(),
            self.routing.n_expert,
        );
        let mut host = p.gpu.take_host(id)?;
        host.ids.resize(n * k, 0);
        gpu.backend()
            .download(ids, bytemuck::cast_slice_mut(&mut host.ids))?;
        let mut chosen = vec![false; n_expert];
        for &ex in &host.ids {
            if let Some(c) = usize::try_from(ex).ok().and_then(|ex| chosen.get_mut(ex)) {
                *c = true;
            }
        }
        let chosen: Vec<usize> = (0..n_expert).filter(|&ex| chosen[ex]).collect();
        if chosen.is_empty() {
            // No route names an expert of the layer: every row is zero, `x` stays.
            p.gpu.give_host(id, host);
            return Ok(true);
        }
        let chunk = chunk.min(chosen.len()).max(1);
        let held = p.devices.reserve(
            id,
            chunk as u64 * self.expert_bytes(),
            "op offload's streamed experts",
        );
        let slots = held.and_then(|held| Ok((held, GpuExpertSlots::new(gpu, self, chunk)?)));
        let Ok((_held, slots)) = slots else {
            p.gpu.give_host(id, host);
            return Ok(false);
        };
        let operands = slots.operands(self);
        let rows = p.gpu.buf(id, "exp_down", n * k * e)?;
        let part = if chosen.len() > chunk {
            Some(p.gpu.buf(id, "offload_rows", n * k * e)?)
        } else {
            None
        };
        let chunk_ids = p.gpu.buf(id, "offload_ids", n * k)?;
        let mut slot_of = vec![-1i32; n_expert];
        for (i, experts) in chosen.chunks(chunk).enumerate() {
            slot_of.fill(-1);
            let mut copied = 0;
            // Runs of consecutive experts go in one copy per matrix.
            let mut s0 = 0;
            while s0 < experts.len() {
                let mut s1 = s0 + 1;
                while s1 < experts.len() && experts[s1] == experts[s1 - 1] + 1 {
                    s1 += 1;
                }
                copied += slots.fill_run(gpu, self, experts[s0], s1 - s0, s0)?;
                s0 = s1;
            }
            for (slot, &ex) in experts.iter().enumerate() {
                slot_of[ex] = slot as i32;
            }
            p.devices.count_copy(CPU, id, copied);
            remap_to_slots(&host.ids, &slot_of, &mut p.moe.hot_ids);
            let io = [h, chunk_ids, rows, part.unwrap_or(rows)];
            self.chunk_rows_gpu(&mut p.gpu, gpu, id, n, operands, &p.moe.hot_ids, i == 0, io)?;
        }
        gpu.moe_sum(rows, weights, x, n, k, e, true)?;
        p.gpu.give_host(id, host);
        Ok(true)
    }

    /// The routed experts on GPU `id` for a layer whose router ran elsewhere: the normed
    /// input `h` and the routes in `moe` are uploaded, the weighted sum comes back into `sum`.
    fn experts_on_gpu_from_host(
        &self,
        gp: &mut GpuPass,
        moe: &MoeScratch,
        id: DeviceId,
        h: &[f32],
        sum: &mut Vec<f32>,
    ) -> Result<()> {
        let gpu = gp.gpu(id)?;
        let (k, e) = (self.routing.n_expert_used, self.n_embd());
        let n = h.len() / e;
        let mut host = gp.take_host(id)?;
        host.ids.clear();
        host.ids.extend(moe.routes().iter().map(|r| r.0 as i32));
        host.weights.clear();
        host.weights.extend(moe.routes().iter().map(|r| r.1));
        let hd = gp.buf(id, "exp_in", n * e)?;
        let ids = gp.buf(id, "exp_ids_in", n * k)?;
        let weights = gp.buf(id, "exp_w_in", n * k)?;
        gpu.backend().upload(hd, bytemuck::cast_slice(h))?;
        gpu.backend().upload(ids, bytemuck::cast_slice(&host.ids))?;
        gpu.backend()
            .upload(weights, bytemuck::cast_slice(&host.weights))?;
        gp.give_host(id, host);
        let out = gp.buf(id, "exp_out", n * e)?;
        let resident = self.resident_experts()?;
        self.routed_experts_gpu(gp, &gpu, id, n, resident, [hd, ids, weights, out], false)?;
        sum.resize(n * e, 0.0);
        gpu.backend().download(out, bytemuck::cast_slice_mut(sum))?;
        Ok(())
    }
}

/// `ids` (routes to experts) as the slots of copies holding some experts (`slot_of`: per
/// expert its slot or -1) into `out`: -1 where the expert has no copy or the id no expert.
fn remap_to_slots(ids: &[i32], slot_of: &[i32], out: &mut Vec<i32>) {
    out.clear();
    out.extend(ids.iter().map(|&e| {
        usize::try_from(e)
            .ok()
            .and_then(|e| slot_of.get(e).copied())
            .unwrap_or(-1)
    }));
}

/// What [`Model::calibrate_op_offload`] measured, and the threshold it chose.
#[derive(Clone, Debug)]
pub struct OpOffloadCalibration {
    /// The GPU the experts would be streamed to.
    pub device: String,
    /// Bytes of the largest host-resident expert layer whose router is on that GPU.
    pub layer_bytes: u64,
    /// That layer's experts, and how many of them fit the GPU's free memory at a time (0:
    /// not one).
    pub n_expert: usize,
    pub experts_per_chunk: usize,
    /// Host-to-GPU copy rate measured on those weights, bytes per second.
    pub upload_bytes_per_s: f64,
    /// CPU time of that layer's routed experts per token (measured on a batch).
    pub cpu_s_per_token: f64,
    /// The GPU's time for the same batch per token, chunk by chunk as op offload runs it
    /// (`None` when not one expert fits).
    pub gpu_s_per_token: Option<f64>,
    /// Batches of at least this many tokens stream (`None`: never).
    pub min_batch: Option<usize>,
}

impl std::fmt::Display for OpOffloadCalibration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "op offload to {}: experts layer {} ({} of {} experts at a time), upload {:.2} GB/s \
             = {:.1} ms, CPU experts {:.3} ms per token",
            self.device,
            crate::placement::human_bytes(self.layer_bytes),
            self.experts_per_chunk,
            self.n_expert,
            self.upload_bytes_per_s / 1e9,
            self.layer_bytes as f64 / self.upload_bytes_per_s * 1e3,
            self.cpu_s_per_token * 1e3
        )?;
        if let Some(g) = self.gpu_s_per_token {
            write!(f, ", GPU {:.3} ms per token", g * 1e3)?;
        }
        match (self.min_batch, self.gpu_s_per_token) {
            (Some(b), _) => write!(f, ": batches of {b}+ tokens stream the experts to the GPU"),
            (None, None) => write!(f, ": off (no room on the GPU for one expert)"),
            (None, Some(_)) => write!(f, ": off (the GPU is not faster per token than the CPU)"),
        }
    }
}

/// Op offload's batch threshold: streaming a layer's experts takes `upload_s`, after which
/// each token costs `gpu_s_per_token` on the GPU instead of `cpu_s_per_token` on the CPU, so
/// streaming pays from `upload_s / (cpu - gpu)` tokens on (at least 2, so decode never
/// streams); never when the GPU is not faster per token.
pub fn op_offload_threshold(
    upload_s: f64,
    cpu_s_per_token: f64,
    gpu_s_per_token: f64,
) -> Option<usize> {
    let saved = cpu_s_per_token - gpu_s_per_token;
    if saved.is_nan() || saved <= 0.0 || !upload_s.is_finite() {
        return None;
    }
    let n = (upload_s.max(0.0) / saved).ceil();
    // A threshold past any batch is "never".
    (n < 1e12).then(|| (n as usize).max(2))
}

impl Model {
    /// Measure when streaming a layer's host-resident routed experts to the GPU that runs
    /// its router beats computing them on the CPU (llama.cpp's op offload, whose threshold
    /// is a fixed 32 tokens): the copy rate of those weights to that GPU, the CPU's time per
    /// token for that layer's experts on a batch, and the GPU's for the same batch in the
    /// chunks of experts its free memory holds ([`op_offload_threshold`]). Sets and returns
    /// the threshold; `None` when no layer has its router on a GPU and its experts in RAM.
    pub fn calibrate_op_offload(&self, par: &Parallel) -> Result<Option<OpOffloadCalibration>> {
        let mut pick: Option<(&Moe, u64)> = None;
        for layer in &self.layers {
            let crate::blocks::Ffn::Moe(m) = &layer.ffn else {
                continue;
            };
            if m.experts_device != CPU || self.devices.gpu(m.device).is_none() {
                continue;
            }
            let bytes = m.routed_bytes();
            if pick.is_none_or(|(_, b)| bytes > b) {
                pick = Some((m, bytes));
            }
        }
        let Some((m, layer_bytes)) = pick else {
            self.set_op_offload_min_batch(None);
            return Ok(None);
        };
        let device = self.devices.get(m.device);
        let gpu = self.devices.gpu(m.device).expect("picked a GPU").clone();

        // The copy rate, on the layer's own weights (best of three).
        let src = m.gate_exps.data();
        let n = src.len().min(64 << 20);
        let buf = Buffer::new(gpu.backend(), n)?;
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let t0 = std::time::Instant::now();
            gpu.backend().upload(buf.ptr(), &src[..n])?;
            gpu.synchronize()?;
            best = best.min(t0.elapsed().as_secs_f64());
        }
        drop(buf);
        let upload_bytes_per_s = n as f64 / best.max(1e-9);

        // The CPU's experts on a batch with routes spread over all experts (best of two).
        let r = &m.routing;
        let n_tok = 32;
        let h: Vec<f32> = (0..n_tok * m.n_embd())
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.5)
            .collect();
        let k = r.n_expert_used;
        let ids: Vec<i32> = (0..n_tok * k)
            .map(|i| ((i * 37 + i / k) % r.n_expert) as i32)
            .collect();
        let w = vec![1.0 / k as f32; n_tok * k];
        let mut s = MoeScratch::default();
        s.set_routes(&ids, &w, r.n_expert)?;
        let mut cpu = f64::INFINITY;
        for _ in 0..2 {
            let t0 = std::time::Instant::now();
            routed_experts(m, &h, n_tok, par, &mut s)?;
            cpu = cpu.min(t0.elapsed().as_secs_f64());
        }
        let cpu_s_per_token = cpu / n_tok as f64;

        // The GPU's, in the chunks op offload would use.
        let limit = self.op_offload_buffer_limit().unwrap_or(u64::MAX);
        let chunk = m.stream_chunk_experts(&self.devices, m.device, n_tok, limit);
        let gpu_s_per_token = if chunk == 0 {
            None
        } else {
            let mut gp = GpuPass::new(&self.devices, &self.gpu_scratch, &[]);
            let timed = m.streamed_seconds(&self.devices, &mut gp, &gpu, &h, &ids, &w, chunk);
            let finished = gp.finish();
            let seconds = timed?;
            finished?;
            Some(seconds / n_tok as f64)
        };
        let upload_s = layer_bytes as f64 / upload_bytes_per_s;
        let min_batch =
            gpu_s_per_token.and_then(|g| op_offload_threshold(upload_s, cpu_s_per_token, g));
        self.set_op_offload_min_batch(min_batch);
        Ok(Some(OpOffloadCalibration {
            device: device.name.clone(),
            layer_bytes,
            n_expert: r.n_expert,
            experts_per_chunk: chunk,
            upload_bytes_per_s,
            cpu_s_per_token,
            gpu_s_per_token,
            min_batch,
        }))
    }
}

impl Moe {
    /// Seconds GPU `gpu` (this layer's router's) takes for this layer's experts on `h` with
    /// routes `ids` / `weights`, in chunks of `chunk` experts as [`Moe::streamed_experts_gpu`]
    /// runs them, the weights' copies aside (every chunk computes from the first chunk's
    /// copies: the same shapes, other values). Best of two.
    #[allow(clippy::too_many_arguments)]
    fn streamed_seconds(
        &self,
        devices: &Devices,
        gp: &mut GpuPass,
        gpu: &Gpu,
        h: &[f32],
        ids: &[i32],
        weights: &[f32],
        chunk: usize,
    ) -> Result<f64> {
        let id = self.device;
        let (k, e, n_expert) = (
            self.routing.n_expert_used,
            self.n_embd(),
            self.routing.n_expert,
        );
        let n = ids.len() / k;
        let _held = devices.reserve(
            id,
            chunk as u64 * self.expert_bytes(),
            "op offload's streamed experts",
        )?;
        let slots = GpuExpertSlots::new(gpu, self, chunk)?;
        slots.fill_run(gpu, self, 0, chunk, 0)?;
        let operands = slots.operands(self);
        let hd = gp.buf(id, "exp_in", n * e)?;
        let wd = gp.buf(id, "exp_w_in", n * k)?;
        let out = gp.buf(id, "exp_out", n * e)?;
        let rows = gp.buf(id, "exp_down", n * k * e)?;
        let part = gp.buf(id, "offload_rows", n * k * e)?;
        let chunk_ids = gp.buf(id, "offload_ids", n * k)?;
        gpu.backend().upload(hd, bytemuck::cast_slice(h))?;
        gpu.backend().upload(wd, bytemuck::cast_slice(weights))?;
        let local: Vec<Vec<i32>> = (0..n_expert.div_ceil(chunk))
            .map(|c| {
                ids.iter()
                    .map(|&ex| match ex as usize {
                        ex if ex / chunk == c => (ex % chunk) as i32,
                        _ => -1,
                    })
                    .collect()
            })
            .collect();
        let mut best = f64::INFINITY;
        for _ in 0..2 {
            gpu.synchronize()?;
            let t0 = std::time::Instant::now();
            for (c, l) in local.iter().enumerate() {
                let io = [hd, chunk_ids, rows, part];
                self.chunk_rows_gpu(gp, gpu, id, n, operands, l, c == 0, io)?;
            }
            gpu.moe_sum(rows, wd, out, n, k, e, false)?;
            gpu.synchronize()?;
            best = best.min(t0.elapsed().as_secs_f64());
        }
        Ok(best)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routing(n_expert: usize, used: usize, groups: usize, groups_used: usize) -> Routing {
        Routing {
            n_expert,
            n_expert_used: used,
            gating: Gating::Sigmoid,
            n_groups: groups.max(1),
            n_group_used: groups_used,
            norm: false,
            scale: 0.0,
        }
    }

    #[test]
    fn op_offload_threshold_counts_the_gpus_time() {
        // 100 ms to stream, 1 ms a token on the CPU: 100 tokens with a free GPU, 200 when
        // the GPU takes half the CPU's time.
        assert_eq!(op_offload_threshold(0.1, 1e-3, 0.0), Some(100));
        assert_eq!(op_offload_threshold(0.1, 1e-3, 0.5e-3), Some(200));
        // Never below 2 tokens (decode never streams).
        assert_eq!(op_offload_threshold(0.0, 1e-3, 0.0), Some(2));
        assert_eq!(op_offload_threshold(1e-9, 1e-3, 0.0), Some(2));
        // A GPU no faster than the CPU, or a threshold past any batch: never.
        assert_eq!(op_offload_threshold(0.1, 1e-3, 1e-3), None);
        assert_eq!(op_offload_threshold(0.1, 1e-3, 2e-3), None);
        assert_eq!(op_offload_threshold(1e9, 1e-3, 0.999_999e-3), None);
        assert_eq!(op_offload_threshold(f64::INFINITY, 1e-3, 0.0), None);
        assert_eq!(op_offload_threshold(0.1, f64::NAN, 0.0), None);
    }

    #[test]
    fn top_k_uses_bias_for_selection_but_not_for_weights() {
        let r = routing(4, 2, 0, 0);
        let logits = [2.0f32, 1.0, 0.0, -1.0];
        let bias = [0.0f32, 0.0, 5.0, 0.0];
        let got = route_top_k(&r, &logits, Some(&bias));
        assert_eq!(got.iter().map(|x| x.0).collect::<Vec<_>>(), vec![2, 0]);
        assert_eq!(got[0].1, ops::sigmoid(0.0));
        assert_eq!(got[1].1, ops::sigmoid(2.0));
    }

    #[test]
    fn weights_are_normalised_and_scaled() {
        let mut r = routing(4, 2, 0, 0);
        r.norm = true;
        r.scale = 2.5;
        let got = route_top_k(&r, &[1.0, 0.5, -3.0, -4.0], None);
        let sum: f32 = got.iter().map(|x| x.1).sum();
        assert!((sum - 2.5).abs() < 1e-6);
        r.gating = Gating::Softmax;
        r.norm = false;
        r.scale = 0.0;
        let got = route_top_k(&r, &[0.0, 0.0, 0.0, 0.0], None);
        assert!(got.iter().all(|x| (x.1 - 0.25).abs() < 1e-7));
    }

    #[test]
    fn group_limited_routing_keeps_the_best_groups() {
        // 8 experts in 4 groups of 2; keep 2 groups. Group scores are the sum of the group's
        // two best selection scores: group 0 = 0.9+0.0, group 1 = 0.5+0.5, group 2 =
        // 0.8+0.3, group 3 = 0.2+0.2. The best single expert (0) is in group 0, which loses
        // to groups 1 and 2.
        let r = routing(8, 2, 4, 2);
        let probs = [0.9f32, 0.0, 0.5, 0.5, 0.8, 0.3, 0.2, 0.2];
        let logits: Vec<f32> = probs
            .iter()
            .map(|&p: &f32| {
                let p = p.clamp(1e-6, 1.0 - 1e-6);
                (p / (1.0 - p)).ln()
            })
            .collect();
        let got = route_top_k(&r, &logits, None);
        let picked: Vec<usize> = got.iter().map(|x| x.0).collect();
        assert_eq!(picked, vec![4, 2]);
    }
}
