//! Routing telemetry (issue 19): per MoE layer and expert, how many tokens selected it and the
//! routing weight they gave it, split by prompt batches (prefill) and single tokens (decode).
//! Always on: one relaxed atomic add per selection and per weight, from the thread that routed
//! the layer. A [`RoutingProfile`] is a snapshot of the counters as plain numbers: written as
//! JSON (atomically: a temporary file renamed over the old one), read back and merged, so a
//! server's profile accumulates across restarts.

use std::io::{BufWriter, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use serde_json::{json, Value};

use crate::{Error, Result};

/// Routing weights are summed as fixed point with this many fraction bits (an `AtomicU64`
/// holds 2^44 weights of 1.0; a weight's rounding error is below 1e-6).
const MASS_FRACTION_BITS: u32 = 20;

/// A routing weight in the counters' fixed point (negative weights count as 0).
fn to_fixed(w: f32) -> u64 {
    (w.max(0.0) as f64 * (1u64 << MASS_FRACTION_BITS) as f64).round() as u64
}

/// Which kind of pass a selection came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// A batch of several tokens (a prompt).
    Prefill = 0,
    /// One token (generation).
    Decode = 1,
}

impl Phase {
    /// The phase of a pass over `n` tokens.
    pub fn of_batch(n: usize) -> Phase {
        if n > 1 {
            Phase::Prefill
        } else {
            Phase::Decode
        }
    }

    const ALL: [Phase; 2] = [Phase::Prefill, Phase::Decode];

    fn name(self) -> &'static str {
        match self {
            Phase::Prefill => "prefill",
            Phase::Decode => "decode",
        }
    }
}

/// One MoE layer's counters, per phase.
struct LayerCounters {
    tokens: [AtomicU64; 2],
    /// Selections per expert.
    counts: [Vec<AtomicU64>; 2],
    /// Routing weight per expert, fixed point.
    mass: [Vec<AtomicU64>; 2],
}

impl LayerCounters {
    fn new(n_expert: usize) -> LayerCounters {
        let zeros = || (0..n_expert).map(|_| AtomicU64::new(0)).collect::<Vec<_>>();
        LayerCounters {
            tokens: [AtomicU64::new(0), AtomicU64::new(0)],
            counts: [zeros(), zeros()],
            mass: [zeros(), zeros()],
        }
    }
}

/// The live counters of a model: one entry per layer (`None` for layers without routed
/// experts).
pub struct RoutingStats {
    arch: String,
    n_expert: usize,
    layers: Vec<Option<LayerCounters>>,
    /// Every routed token's selections, when a trace was asked for ([`RoutingStats::trace_to`]).
    trace: Mutex<Option<TraceWriter>>,
    /// Whether `trace` is open: a record reads this, not the lock, when no trace is wanted.
    tracing: AtomicBool,
}

impl RoutingStats {
    /// Counters for the layers `moe` marks as MoE layers, `n_expert` experts each.
    pub fn new(arch: &str, n_expert: usize, moe: impl IntoIterator<Item = bool>) -> RoutingStats {
        RoutingStats {
            arch: arch.to_owned(),
            n_expert,
            layers: moe
                .into_iter()
                .map(|is_moe| is_moe.then(|| LayerCounters::new(n_expert)))
                .collect(),
            trace: Mutex::new(None),
            tracing: AtomicBool::new(false),
        }
    }

    /// From now on also write every routed token's selections to `path` (a [`RoutingTrace`]
    /// file; buffered, complete once [`RoutingStats::finish_trace`] returns).
    pub fn trace_to(&self, path: &Path) -> Result<()> {
        let io = |e: std::io::Error| Error::Model(format!("writing {}: {e}", path.display()));
        let mut w = BufWriter::new(std::fs::File::create(path).map_err(io)?);
        w.write_all(TRACE_MAGIC).map_err(io)?;
        for v in [
            TRACE_VERSION,
            self.n_expert as u32,
            self.layers.len() as u32,
        ] {
            w.write_all(&v.to_le_bytes()).map_err(io)?;
        }
        *self.trace.lock().unwrap_or_else(|p| p.into_inner()) = Some(TraceWriter {
            w,
            path: path.to_owned(),
            error: None,
        });
        self.tracing.store(true, Ordering::Release);
        Ok(())
    }

    /// Flush and close the trace, reporting the first write error it met.
    pub fn finish_trace(&self) -> Result<()> {
        self.tracing.store(false, Ordering::Release);
        let t = self.trace.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(mut t) = t else { return Ok(()) };
        let flushed = t.w.flush();
        match (t.error.take(), flushed) {
            (Some(e), _) | (None, Err(e)) => {
                Err(Error::Model(format!("writing {}: {e}", t.path.display())))
            }
            _ => Ok(()),
        }
    }

    /// Count `n_tok` tokens' routes of layer `il` (top-k `(expert, weight)` per token, token
    /// after token). Routes naming an expert out of range are not counted.
    pub fn record(&self, il: usize, phase: Phase, n_tok: usize, routes: &[(usize, f32)]) {
        let Some(Some(l)) = self.layers.get(il) else {
            return;
        };
        let p = phase as usize;
        l.tokens[p].fetch_add(n_tok as u64, Ordering::Relaxed);
        if self.tracing.load(Ordering::Acquire) {
            if let Some(t) = self
                .trace
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_mut()
            {
                t.record(il, phase, n_tok, routes);
            }
        }
        for &(e, w) in routes {
            if e < self.n_expert {
                l.counts[p][e].fetch_add(1, Ordering::Relaxed);
                l.mass[p][e].fetch_add(to_fixed(w), Ordering::Relaxed);
            }
        }
    }

    /// Add counts gathered elsewhere (a GPU's tally) to layer `il`: `tokens` routed in
    /// `phase`, and per expert its selections and routing weight.
    pub fn add(&self, il: usize, phase: Phase, tokens: u64, counts: &[u32], mass: &[f32]) {
        let Some(Some(l)) = self.layers.get(il) else {
            return;
        };
        let p = phase as usize;
        l.tokens[p].fetch_add(tokens, Ordering::Relaxed);
        for (e, (&c, &m)) in counts.iter().zip(mass).enumerate().take(self.n_expert) {
            l.counts[p][e].fetch_add(c as u64, Ordering::Relaxed);
            l.mass[p][e].fetch_add(to_fixed(m), Ordering::Relaxed);
        }
    }

    /// The counters now, as plain numbers.
    pub fn snapshot(&self) -> RoutingProfile {
        let scale = 1.0 / (1u64 << MASS_FRACTION_BITS) as f64;
        let layers = self
            .layers
            .iter()
            .enumerate()
            .filter_map(|(il, l)| {
                let l = l.as_ref()?;
                let load = |v: &[AtomicU64]| v.iter().map(|a| a.load(Ordering::Relaxed)).collect();
                Some(LayerProfile {
                    layer: il,
                    tokens: [0, 1].map(|p| l.tokens[p].load(Ordering::Relaxed)),
                    counts: [0, 1].map(|p| load(&l.counts[p])),
                    mass: [0, 1].map(|p| {
                        l.mass[p]
                            .iter()
                            .map(|a| a.load(Ordering::Relaxed) as f64 * scale)
                            .collect()
                    }),
                })
            })
            .collect();
        RoutingProfile {
            arch: self.arch.clone(),
            n_expert: self.n_expert,
            layers,
        }
    }
}

/// One layer of a [`RoutingProfile`]: per phase (prefill, decode) the tokens routed, and per
/// expert the selections and the routing weight.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerProfile {
    pub layer: usize,
    pub tokens: [u64; 2],
    pub counts: [Vec<u64>; 2],
    pub mass: [Vec<f64>; 2],
}

impl LayerProfile {
    /// Selections of `phase` per expert.
    pub fn counts(&self, phase: Phase) -> &[u64] {
        &self.counts[phase as usize]
    }

    /// Selections per expert, both phases together.
    pub fn total_counts(&self) -> Vec<u64> {
        self.counts[0]
            .iter()
            .zip(&self.counts[1])
            .map(|(a, b)| a + b)
            .collect()
    }

    /// The busiest expert (both phases) and its share of the layer's selections (0 when
    /// there were none).
    pub fn busiest(&self) -> (usize, f64) {
        let c = self.total_counts();
        let sum: u64 = c.iter().sum();
        let (top, &n) = c
            .iter()
            .enumerate()
            .max_by_key(|&(_, n)| *n)
            .unwrap_or((0, &0));
        (top, if sum > 0 { n as f64 / sum as f64 } else { 0.0 })
    }

    /// The fewest experts that took `share` (0..=1) of the layer's selections in `phase`
    /// (both phases when `None`): how concentrated its routing is.
    pub fn experts_for_share(&self, phase: Option<Phase>, share: f64) -> usize {
        let mut c: Vec<u64> = match phase {
            Some(p) => self.counts[p as usize].clone(),
            None => self.total_counts(),
        };
        let total: u64 = c.iter().sum();
        if total == 0 {
            return 0;
        }
        c.sort_unstable_by(|a, b| b.cmp(a));
        let want = share * total as f64;
        let mut acc = 0u64;
        for (i, &x) in c.iter().enumerate() {
            acc += x;
            if acc as f64 >= want {
                return i + 1;
            }
        }
        c.len()
    }
}

/// Routing counters as numbers: what `moxie serve --profile-out` writes.
#[derive(Clone, Debug, PartialEq)]
pub struct RoutingProfile {
    pub arch: String,
    pub n_expert: usize,
    pub layers: Vec<LayerProfile>,
}

impl RoutingProfile {
    pub fn to_json(&self) -> Value {
        let layers: Vec<Value> = self
            .layers
            .iter()
            .map(|l| {
                let mut v = json!({ "layer": l.layer });
                for p in Phase::ALL {
                    let i = p as usize;
                    v[p.name()] = json!({
                        "tokens": l.tokens[i],
                        "counts": l.counts[i],
                        "mass": l.mass[i],
                    });
                }
                v
            })
            .collect();
        json!({
            "format": "moxie-routing-profile",
            "version": 1,
            "arch": self.arch,
            "n_expert": self.n_expert,
            "layers": layers,
        })
    }

    /// A profile written by [`RoutingProfile::to_json`]; `what` names it in errors.
    pub fn from_json(v: &Value, what: &str) -> Result<RoutingProfile> {
        let bad = |why: String| Error::Model(format!("{what}: not a moxie routing profile: {why}"));
        if v["format"] != "moxie-routing-profile" || v["version"] != 1 {
            return Err(bad("format/version".into()));
        }
        let n_expert = v["n_expert"]
            .as_u64()
            .ok_or_else(|| bad("n_expert".into()))? as usize;
        let arch = v["arch"].as_str().ok_or_else(|| bad("arch".into()))?;
        let layers = v["layers"]
            .as_array()
            .ok_or_else(|| bad("layers".into()))?
            .iter()
            .map(|l| {
                let layer = l["layer"].as_u64().ok_or_else(|| bad("layer".into()))? as usize;
                let phase = |p: Phase| -> Result<(u64, Vec<u64>, Vec<f64>)> {
                    let o = &l[p.name()];
                    let tokens = o["tokens"].as_u64().ok_or_else(|| bad("tokens".into()))?;
                    let nums = |key: &str| {
                        o[key]
                            .as_array()
                            .filter(|a| a.len() == n_expert)
                            .ok_or_else(|| bad(format!("layer {layer} {}.{key}", p.name())))
                    };
                    let counts = nums("counts")?
                        .iter()
                        .map(|x| x.as_u64().ok_or_else(|| bad("a count".into())))
                        .collect::<Result<_>>()?;
                    let mass = nums("mass")?
                        .iter()
                        .map(|x| x.as_f64().ok_or_else(|| bad("a mass".into())))
                        .collect::<Result<_>>()?;
                    Ok((tokens, counts, mass))
                };
                let (t0, c0, m0) = phase(Phase::Prefill)?;
                let (t1, c1, m1) = phase(Phase::Decode)?;
                Ok(LayerProfile {
                    layer,
                    tokens: [t0, t1],
                    counts: [c0, c1],
                    mass: [m0, m1],
                })
            })
            .collect::<Result<_>>()?;
        Ok(RoutingProfile {
            arch: arch.to_owned(),
            n_expert,
            layers,
        })
    }

    /// Add `other`'s counters (the same model's: arch, experts and layers must agree).
    pub fn merge(&mut self, other: &RoutingProfile) -> Result<()> {
        let same_layers = self.layers.len() == other.layers.len()
            && self
                .layers
                .iter()
                .zip(&other.layers)
                .all(|(a, b)| a.layer == b.layer);
        if self.arch != other.arch || self.n_expert != other.n_expert || !same_layers {
            return Err(Error::Model(format!(
                "routing profiles of different models ({} with {} experts and {} MoE layers, \
                 {} with {} and {})",
                self.arch,
                self.n_expert,
                self.layers.len(),
                other.arch,
                other.n_expert,
                other.layers.len()
            )));
        }
        for (a, b) in self.layers.iter_mut().zip(&other.layers) {
            for p in 0..2 {
                a.tokens[p] += b.tokens[p];
                a.counts[p]
                    .iter_mut()
                    .zip(&b.counts[p])
                    .for_each(|(x, y)| *x += y);
                a.mass[p]
                    .iter_mut()
                    .zip(&b.mass[p])
                    .for_each(|(x, y)| *x += y);
            }
        }
        Ok(())
    }

    /// Write to `path` atomically: a temporary file beside it, then renamed over it, so a
    /// reader (or a crash) never sees half a profile.
    pub fn write_atomic(&self, path: &Path) -> Result<()> {
        let io = |e: std::io::Error| Error::Model(format!("writing {}: {e}", path.display()));
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let text = serde_json::to_string(&self.to_json()).expect("a JSON value serialises");
        std::fs::write(&tmp, text).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io(e)
        })
    }

    /// The profile at `path`, or `None` where there is no file.
    pub fn read(path: &Path) -> Result<Option<RoutingProfile>> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::Model(format!("reading {}: {e}", path.display()))),
        };
        let what = path.display().to_string();
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| Error::Model(format!("{what}: not JSON: {e}")))?;
        RoutingProfile::from_json(&v, &what).map(Some)
    }
}

const TRACE_MAGIC: &[u8; 4] = b"MXRT";
const TRACE_VERSION: u32 = 1;

/// An open trace file: after the header (`MXRT`, version, experts, layers: u32 each), one
/// record per layer and pass: phase (u8: 0 prefill, 1 decode), a zero byte, the layer (u16),
/// tokens (u32), top-k (u32), then tokens x top-k expert ids (u16), token after token.
struct TraceWriter {
    w: BufWriter<std::fs::File>,
    path: std::path::PathBuf,
    error: Option<std::io::Error>,
}

impl TraceWriter {
    fn record(&mut self, il: usize, phase: Phase, n_tok: usize, routes: &[(usize, f32)]) {
        if self.error.is_some() || n_tok == 0 {
            return;
        }
        let k = routes.len() / n_tok;
        let mut rec = Vec::with_capacity(12 + 2 * routes.len());
        rec.extend([phase as u8, 0]);
        rec.extend((il as u16).to_le_bytes());
        rec.extend((n_tok as u32).to_le_bytes());
        rec.extend((k as u32).to_le_bytes());
        for &(e, _) in &routes[..n_tok * k] {
            rec.extend((e as u16).to_le_bytes());
        }
        if let Err(e) = self.w.write_all(&rec) {
            self.error = Some(e);
        }
    }
}

/// One layer's selections in one pass of a [`RoutingTrace`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceRecord {
    pub phase: Phase,
    pub layer: usize,
    pub n_tok: usize,
    pub k: usize,
    /// `n_tok * k` expert ids, token after token.
    pub experts: Vec<u16>,
}

/// A routing trace read back: every pass's selections per layer, in the order they ran.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoutingTrace {
    pub n_expert: usize,
    pub n_layer: usize,
    pub records: Vec<TraceRecord>,
}

impl RoutingTrace {
    /// Read a trace file; a truncated or foreign file is an error naming the byte offset.
    pub fn read(path: &Path) -> Result<RoutingTrace> {
        let what = path.display().to_string();
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .map_err(|e| Error::Model(format!("reading {what}: {e}")))?;
        let bad = |at: usize, why: &str| {
            Error::Model(format!(
                "{what}: not a moxie routing trace at byte {at}: {why}"
            ))
        };
        let u32_at = |at: usize| -> Result<u32> {
            bytes
                .get(at..at + 4)
                .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
                .ok_or_else(|| bad(at, "truncated"))
        };
        if bytes.get(..4) != Some(TRACE_MAGIC.as_slice()) || u32_at(4)? != TRACE_VERSION {
            return Err(bad(0, "magic or version"));
        }
        let (n_expert, n_layer) = (u32_at(8)? as usize, u32_at(12)? as usize);
        let mut records = Vec::new();
        let mut at = 16;
        while at < bytes.len() {
            let phase = match bytes[at] {
                0 => Phase::Prefill,
                1 => Phase::Decode,
                _ => return Err(bad(at, "phase")),
            };
            let layer = bytes
                .get(at + 2..at + 4)
                .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
                .ok_or_else(|| bad(at, "truncated"))?;
            let (n_tok, k) = (u32_at(at + 4)? as usize, u32_at(at + 8)? as usize);
            let n = n_tok.checked_mul(k).filter(|&n| n <= bytes.len());
            let ids = n
                .and_then(|n| bytes.get(at + 12..at + 12 + 2 * n))
                .ok_or_else(|| bad(at, "truncated record"))?;
            let experts: Vec<u16> = ids
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
                .collect();
            if layer >= n_layer || experts.iter().any(|&e| e as usize >= n_expert) {
                return Err(bad(at, "layer or expert out of range"));
            }
            at += 12 + 2 * experts.len();
            records.push(TraceRecord {
                phase,
                layer,
                n_tok,
                k,
                experts,
            });
        }
        Ok(RoutingTrace {
            n_expert,
            n_layer,
            records,
        })
    }
}

/// How a simulated VRAM expert cache chooses its residents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CachePolicy {
    /// The experts the trace selects most, fixed for the whole run (an oracle when the trace
    /// is also the workload: the best a static placement can do).
    Static,
    /// Per layer, the most recently selected experts.
    Lru,
    /// Per layer, the most often selected experts so far (ties: the most recent).
    Lfu,
    /// Per layer, the highest recency-weighted count: every selection counts 1, halved every
    /// [`DECAY_HALF_LIFE`] tokens since (between LRU's memory of one use and LFU's of all).
    Decay,
}

/// Tokens after which a selection counts half under [`CachePolicy::Decay`].
pub const DECAY_HALF_LIFE: f64 = 8.0;

/// A recency-weighted selection count ([`CachePolicy::Decay`]): the count as of token `at`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DecayedCount {
    count: f64,
    at: u64,
}

impl DecayedCount {
    /// The count at token `now` (not before `at`).
    pub fn at(&self, now: u64) -> f64 {
        let age = now.saturating_sub(self.at) as f64;
        self.count * (-age / DECAY_HALF_LIFE).exp2()
    }

    /// One more selection at token `now`.
    pub fn add(&mut self, now: u64) {
        self.count = self.at(now) + 1.0;
        self.at = now;
    }

    /// An ordering key at token `now` (non-negative floats order as their bits do).
    pub fn key(&self, now: u64) -> u64 {
        self.at(now).to_bits()
    }
}

impl CachePolicy {
    pub fn parse(s: &str) -> Result<CachePolicy> {
        match s {
            "static" => Ok(CachePolicy::Static),
            "lru" => Ok(CachePolicy::Lru),
            "lfu" => Ok(CachePolicy::Lfu),
            "decay" => Ok(CachePolicy::Decay),
            _ => Err(Error::Model(format!(
                "--policy {s}: static, lru, lfu or decay"
            ))),
        }
    }

    /// How much a dynamic policy wants to keep an expert selected `uses` times, last at
    /// `last_use`, with recency-weighted count `decayed`, at token `now`: the smallest is
    /// evicted (LRU: the least recent; LFU: the fewest uses, then the least recent; decay:
    /// the lowest decayed count, then the least recent).
    pub fn keep_rank(
        self,
        uses: u64,
        last_use: u64,
        decayed: &DecayedCount,
        now: u64,
    ) -> (u64, u64) {
        match self {
            CachePolicy::Lfu => (uses, last_use),
            CachePolicy::Decay => (decayed.key(now), last_use),
            CachePolicy::Lru | CachePolicy::Static => (last_use, 0),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            CachePolicy::Static => "static",
            CachePolicy::Lru => "lru",
            CachePolicy::Lfu => "lfu",
            CachePolicy::Decay => "decay",
        }
    }
}

/// What a simulated cache left on the CPU, per phase (prefill, decode).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CacheSim {
    pub tokens: [u64; 2],
    pub selections: [u64; 2],
    pub hits: [u64; 2],
    /// Expert bytes the CPU read (misses), and all selections' bytes (nothing cached).
    pub cpu_bytes: [u64; 2],
    pub all_bytes: [u64; 2],
}

/// Replay `trace` against a cache of `budget` bytes of experts (`expert_bytes[il]`: one
/// expert of layer `il`, 0 for layers without experts) run by `policy`; dynamic policies give
/// each MoE layer an equal share of the budget. Tokens are counted once per pass, from the
/// first MoE layer's records.
pub fn simulate_cache(
    trace: &RoutingTrace,
    expert_bytes: &[u64],
    budget: u64,
    policy: CachePolicy,
) -> Result<CacheSim> {
    if expert_bytes.len() != trace.n_layer {
        return Err(Error::Model(format!(
            "the trace has {} layers, the model {}",
            trace.n_layer,
            expert_bytes.len()
        )));
    }
    let n_e = trace.n_expert;
    let moe_layers: Vec<usize> = (0..trace.n_layer)
        .filter(|&l| expert_bytes[l] > 0)
        .collect();
    let first = moe_layers.first().copied();
    // Residents per layer: a flag per expert, and for the dynamic policies the capacity,
    // last use and use count.
    let mut resident = vec![vec![false; n_e]; trace.n_layer];
    let mut capacity = vec![0usize; trace.n_layer];
    if policy == CachePolicy::Static {
        let mut counts = vec![vec![0u64; n_e]; trace.n_layer];
        for r in &trace.records {
            for &e in &r.experts {
                counts[r.layer][e as usize] += 1;
            }
        }
        let mut all: Vec<(u64, usize, usize)> = moe_layers
            .iter()
            .flat_map(|&l| (0..n_e).map(move |e| (l, e)))
            .map(|(l, e)| (counts[l][e], l, e))
            .filter(|&(c, _, _)| c > 0)
            .collect();
        all.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        let mut left = budget;
        for (_, l, e) in all {
            if expert_bytes[l] <= left {
                left -= expert_bytes[l];
                resident[l][e] = true;
            }
        }
    } else if !moe_layers.is_empty() {
        let share = budget / moe_layers.len() as u64;
        for &l in &moe_layers {
            capacity[l] = (share / expert_bytes[l]).min(n_e as u64) as usize;
        }
    }
    let mut last_use = vec![vec![0u64; n_e]; trace.n_layer];
    let mut uses = vec![vec![0u64; n_e]; trace.n_layer];
    let mut decayed = vec![vec![DecayedCount::default(); n_e]; trace.n_layer];
    let mut held = vec![0usize; trace.n_layer];
    // Tokens each layer has seen (the decay's clock).
    let mut tokens = vec![0u64; trace.n_layer];
    let mut clock = 0u64;
    let mut sim = CacheSim::default();
    for r in &trace.records {
        let p = r.phase as usize;
        let bytes = expert_bytes[r.layer];
        if Some(r.layer) == first {
            sim.tokens[p] += r.n_tok as u64;
        }
        for (i, &e) in r.experts.iter().enumerate() {
            let (l, e) = (r.layer, e as usize);
            let now = tokens[l] + (i / r.k.max(1)) as u64;
            clock += 1;
            sim.selections[p] += 1;
            sim.all_bytes[p] += bytes;
            uses[l][e] += 1;
            decayed[l][e].add(now);
            if resident[l][e] {
                sim.hits[p] += 1;
            } else {
                sim.cpu_bytes[p] += bytes;
                if policy != CachePolicy::Static && capacity[l] > 0 {
                    // Bring it in, evicting the policy's victim when full.
                    if held[l] == capacity[l] {
                        let victim = (0..n_e)
                            .filter(|&x| resident[l][x])
                            .min_by_key(|&x| {
                                policy.keep_rank(uses[l][x], last_use[l][x], &decayed[l][x], now)
                            })
                            .expect("a full cache holds experts");
                        resident[l][victim] = false;
                    } else {
                        held[l] += 1;
                    }
                    resident[l][e] = true;
                }
            }
            last_use[l][e] = clock;
        }
        tokens[r.layer] += r.n_tok as u64;
    }
    Ok(sim)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats() -> RoutingStats {
        // Layer 0 dense, layers 1 and 2 with 4 experts.
        RoutingStats::new("test", 4, [false, true, true])
    }

    #[test]
    fn selections_and_mass_are_counted_per_layer_and_phase() {
        let s = stats();
        s.record(
            1,
            Phase::Prefill,
            2,
            &[(0, 0.75), (3, 0.25), (0, 0.5), (1, 0.5)],
        );
        s.record(1, Phase::Decode, 1, &[(3, 1.0), (2, 0.0)]);
        s.record(0, Phase::Decode, 1, &[(3, 1.0)]); // a dense layer: nothing
        s.record(2, Phase::Decode, 1, &[(9, 1.0)]); // out of range: not counted
        let p = s.snapshot();
        assert_eq!(p.layers.len(), 2);
        let l1 = &p.layers[0];
        assert_eq!((l1.layer, l1.tokens), (1, [2, 1]));
        assert_eq!(l1.counts(Phase::Prefill), [2, 1, 0, 1]);
        assert_eq!(l1.counts(Phase::Decode), [0, 0, 1, 1]);
        assert_eq!(l1.mass[0], [1.25, 0.5, 0.0, 0.25]);
        assert_eq!(l1.experts_for_share(None, 0.5), 2);
        assert_eq!(l1.experts_for_share(Some(Phase::Prefill), 0.5), 1);
        assert_eq!(p.layers[1].counts(Phase::Decode), [0, 0, 0, 0]);
    }

    #[test]
    fn traces_round_trip_and_refuse_truncation() {
        let s = stats();
        let dir = std::env::temp_dir().join(format!("moxie-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.bin");
        s.record(1, Phase::Prefill, 1, &[(0, 1.0)]); // before the trace: not in it
        s.trace_to(&path).unwrap();
        s.record(
            1,
            Phase::Prefill,
            2,
            &[(0, 0.5), (3, 0.5), (2, 0.5), (1, 0.5)],
        );
        s.record(2, Phase::Decode, 1, &[(3, 0.7), (1, 0.3)]);
        s.finish_trace().unwrap();
        s.record(2, Phase::Decode, 1, &[(0, 1.0)]); // after: not in it
        let t = RoutingTrace::read(&path).unwrap();
        assert_eq!((t.n_expert, t.n_layer, t.records.len()), (4, 3, 2));
        assert_eq!(t.records[0].experts, [0, 3, 2, 1]);
        assert_eq!((t.records[0].n_tok, t.records[0].k), (2, 2));
        assert_eq!((t.records[1].phase, t.records[1].layer), (Phase::Decode, 2));
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
        let err = RoutingTrace::read(&path).unwrap_err().to_string();
        assert!(err.contains("t.bin") && err.contains("byte 36"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The cache policies on a small trace worked by hand: one layer of 4 experts of 10
    /// bytes, top-1, decode tokens selecting 0 1 0 2 0 1; room for two experts.
    #[test]
    fn cache_policies_replay_a_trace() {
        let rec = |e: u16| TraceRecord {
            phase: Phase::Decode,
            layer: 1,
            n_tok: 1,
            k: 1,
            experts: vec![e],
        };
        let trace = RoutingTrace {
            n_expert: 4,
            n_layer: 2,
            records: [0, 1, 0, 2, 0, 1].into_iter().map(rec).collect(),
        };
        let bytes = [0, 10];
        let run = |p| simulate_cache(&trace, &bytes, 20, p).unwrap();
        // static: 0 and 1 resident (3 and 2 uses): misses only on the 2.
        let s = run(CachePolicy::Static);
        assert_eq!((s.tokens[1], s.selections[1], s.hits[1]), (6, 6, 5));
        assert_eq!((s.cpu_bytes[1], s.all_bytes[1]), (10, 60));
        // lru: 0 m, 1 m, 0 h, 2 m (evicts 1), 0 h, 1 m (evicts 2).
        assert_eq!(run(CachePolicy::Lru).hits[1], 2);
        // lfu: 0 m, 1 m, 0 h, 2 m (evicts 1: one use against 0's two), 0 h, 1 m (evicts 2:
        // one use against 0's three).
        assert_eq!(run(CachePolicy::Lfu).hits[1], 2);
        // decay: as lfu here until the 1 at token 5, whose choice of victim (2, one use at
        // token 3; 0, uses at 0, 2, 4) keeps 0.
        assert_eq!(run(CachePolicy::Decay).hits[1], 2);
        // No budget: everything from the CPU; a model of another depth is refused.
        assert_eq!(
            simulate_cache(&trace, &bytes, 0, CachePolicy::Lru)
                .unwrap()
                .hits[1],
            0
        );
        assert!(simulate_cache(&trace, &[10], 20, CachePolicy::Lru).is_err());
    }

    #[test]
    fn decayed_counts_halve_every_half_life() {
        let mut c = DecayedCount::default();
        c.add(0);
        c.add(0);
        assert_eq!(c.at(0), 2.0);
        assert!((c.at(8) - 1.0).abs() < 1e-12);
        c.add(16);
        assert!((c.at(16) - 1.5).abs() < 1e-12);
        let (old, new) = (
            DecayedCount { count: 3.0, at: 0 },
            DecayedCount { count: 1.0, at: 20 },
        );
        // Three uses long ago weigh less than one just now.
        assert!(old.key(20) < new.key(20));
    }

    #[test]
    fn profiles_round_trip_merge_and_refuse_other_models() {
        let s = stats();
        s.record(2, Phase::Prefill, 1, &[(1, 0.5), (2, 0.5)]);
        let a = s.snapshot();
        let dir = std::env::temp_dir().join(format!("moxie-profile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("p.json");
        assert_eq!(RoutingProfile::read(&path).unwrap(), None);
        a.write_atomic(&path).unwrap();
        let back = RoutingProfile::read(&path).unwrap().unwrap();
        assert_eq!(back, a);
        let mut twice = back.clone();
        twice.merge(&a).unwrap();
        assert_eq!(twice.layers[1].counts(Phase::Prefill), [0, 2, 2, 0]);
        assert_eq!(twice.layers[1].tokens, [2, 0]);
        let other = RoutingStats::new("test", 8, [true]).snapshot();
        assert!(twice
            .merge(&other)
            .unwrap_err()
            .to_string()
            .contains("different models"));
        std::fs::write(&path, "{\"format\": 3}").unwrap();
        let err = RoutingProfile::read(&path).unwrap_err().to_string();
        assert!(
            err.contains("p.json") && err.contains("not a moxie routing profile"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
