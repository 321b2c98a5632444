//! Throughput measurement the way llama-bench does it: prompt processing (`ppN`: N tokens
//! from an empty cache, in micro-batches), token generation (`tgN`: N one-token decodes),
//! both (`pgN,M`), optionally after a context of `depth` tokens that is not timed. Tokens are
//! fixed pseudo-random ids, so runs are comparable between engines.

use std::time::Instant;

use crate::inventory::Role;
use crate::model::{Logits, Model};
use crate::parallel::Parallel;
use crate::state::KvTypes;
use crate::Result;

/// One benchmark test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BenchTest {
    pub n_prompt: usize,
    pub n_gen: usize,
    /// Tokens already in the cache before the timed part.
    pub depth: usize,
}

impl BenchTest {
    /// llama-bench's test name: `pp512`, `tg128`, `pp512+tg128`, with ` @ dN` for a depth.
    pub fn name(&self) -> String {
        let base = match (self.n_prompt, self.n_gen) {
            (p, 0) => format!("pp{p}"),
            (0, g) => format!("tg{g}"),
            (p, g) => format!("pp{p}+tg{g}"),
        };
        if self.depth > 0 {
            format!("{base} @ d{}", self.depth)
        } else {
            base
        }
    }

    /// The short untimed run before the test's repetitions: up to 16 prompt tokens and one
    /// generated, from an empty cache.
    pub fn warm_up(&self) -> BenchTest {
        BenchTest {
            n_prompt: self.n_prompt.min(16),
            n_gen: self.n_gen.min(1),
            depth: 0,
        }
    }

    /// Tokens processed per timed run.
    pub fn n_tokens(&self) -> usize {
        self.n_prompt + self.n_gen
    }
}

/// Token `i` of the benchmark stream (same formula as the peers script: `(i*7919 + 1) % vocab`).
pub fn bench_token(i: usize, n_vocab: usize) -> u32 {
    ((i * 7919 + 1) % n_vocab) as u32
}

/// Run `test` once: a fresh cache, the untimed depth, then the timed prompt and generation.
/// Returns tokens per second.
pub fn run_once(
    model: &Model,
    par: &Parallel,
    test: BenchTest,
    ubatch: usize,
    kv: KvTypes,
) -> Result<f64> {
    let n_vocab = model.config.n_vocab;
    let mut cache = model.new_state_typed(Some(test.depth + test.n_tokens() + 1), kv)?;
    let depth: Vec<u32> = (0..test.depth).map(|i| bench_token(i, n_vocab)).collect();
    for chunk in depth.chunks(ubatch.max(1)) {
        model.forward(chunk, &mut cache, par, Logits::None)?;
    }
    let prompt: Vec<u32> = (0..test.n_prompt)
        .map(|i| bench_token(test.depth + i, n_vocab))
        .collect();
    let t0 = Instant::now();
    // llama-bench's batches ask for the last token's logits of every batch; so do these.
    for chunk in prompt.chunks(ubatch.max(1)) {
        model.forward(chunk, &mut cache, par, Logits::Last)?;
    }
    for i in 0..test.n_gen {
        let t = bench_token(test.depth + test.n_prompt + i, n_vocab);
        model.forward(&[t], &mut cache, par, Logits::Last)?;
    }
    let secs = t0.elapsed().as_secs_f64().max(1e-9);
    Ok(test.n_tokens() as f64 / secs)
}

/// What one decode step must read from memory at least, in bytes, by part.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeBytes {
    /// Every weight that runs for every token: attention, dense and shared-expert FFNs,
    /// routers, norms, the output head.
    pub dense: u64,
    /// The selected experts' slices: `n_expert_used / n_expert` of the routed-expert tensors.
    pub experts: u64,
    /// One row of the token embeddings.
    pub embedding_row: u64,
    /// The KV cache at the mean context length of the run.
    pub kv: u64,
}

impl DecodeBytes {
    pub fn total(&self) -> u64 {
        self.dense + self.experts + self.embedding_row + self.kv
    }
}

/// The bytes a decode step reads with `n_kv` positions in a cache of `kv` types. MTP/NextN
/// tensors are not run and not counted.
pub fn decode_bytes(model: &Model, n_kv: usize, kv: KvTypes) -> Result<DecodeBytes> {
    let c = &model.config;
    let mut b = DecodeBytes::default();
    for t in model.file.tensors() {
        match Role::of(&t.name) {
            Role::RoutedExperts => {
                b.experts += t.n_bytes * c.n_expert_used as u64 / c.n_expert.max(1) as u64
            }
            Role::Embeddings => b.embedding_row += t.n_bytes / c.n_vocab.max(1) as u64,
            Role::NextN => {}
            // A legacy MLA file's attn_kv_b is read as its F32 split parts.
            _ => {
                let has = |name: &str| model.file.tensor(name).is_some();
                b.dense += crate::arch::legacy_mla::loaded_bytes(t, has)
            }
        }
    }
    // An empty cache of those types: it knows its row sizes and reserves nothing yet.
    let per_pos = model.new_state_typed(Some(n_kv), kv)?.bytes_per_position();
    b.kv = (per_pos * n_kv) as u64;
    Ok(b)
}

/// What the expert caches did, e.g. `expert cache: 71.3% of decode selections hit (5000 of
/// 7000), 1204 experts brought in`.
pub fn expert_cache_line(c: &crate::blocks::moe::CacheCounts) -> String {
    format!(
        "expert cache: {:.1}% of decode selections hit ({} of {}), {} experts brought in",
        100.0 * c.hits as f64 / c.lookups.max(1) as f64,
        c.hits,
        c.lookups,
        c.uploads
    )
}

/// Routed-expert weights each device read per one-token pass between two snapshots of
/// [`crate::device::Devices::stats`] that `tokens` decode passes apart (the devices that read
/// none left out), e.g. `CPU 45.2 MiB, sim0 3.1 MiB`; `None` when no device read any (a dense
/// model, or experts routed on a GPU, which keeps its routes).
pub fn expert_reads_per_token(
    before: &[(String, crate::device::DeviceStats)],
    after: &[(String, crate::device::DeviceStats)],
    tokens: u64,
) -> Option<String> {
    let decode = crate::telemetry::Phase::Decode as usize;
    let parts: Vec<String> = before
        .iter()
        .zip(after)
        .filter_map(|((name, b), (_, a))| {
            let bytes = a.expert_bytes[decode].saturating_sub(b.expert_bytes[decode]);
            (bytes > 0 && tokens > 0)
                .then(|| format!("{name} {}", crate::placement::human_bytes(bytes / tokens)))
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// Read bandwidth of this machine with `par`'s threads, in bytes per second: the median of five
/// passes summing a `bytes`-long buffer (make it well above the last-level cache). The median,
/// not the best pass: on a shared machine single passes vary by tens of percent. Read as the
/// one-token products read their weights (software prefetch [`moxie_quant::PREFETCH_AHEAD`]
/// bytes ahead, pieces a free thread takes from a held-up one), so the fraction of it decode
/// reaches counts what the products leave unused, not what a plain loop cannot reach.
pub fn read_bandwidth(par: &Parallel, bytes: usize) -> f64 {
    const BLOCK: usize = 1 << 17; // u64s per work item (1 MiB)
    let n_blocks = (bytes / 8).div_ceil(BLOCK).max(1);
    // Distinct non-zero contents, so every page is really backed by memory.
    let buf: Vec<u64> = (0..n_blocks * BLOCK)
        .map(|i| i as u64 ^ 0x9E37_79B9_7F4A_7C15)
        .collect();
    let mut sums = vec![0u64; n_blocks];
    let mut rates = Vec::with_capacity(5);
    for _ in 0..5 {
        let t0 = Instant::now();
        par.for_each_piece(n_blocks, BLOCK * 64, 1, &mut sums, 1, |blocks, out| {
            for (b, o) in blocks.zip(out.iter_mut()) {
                // Cache lines of 8 values.
                *o = buf[b * BLOCK..(b + 1) * BLOCK]
                    .chunks_exact(8)
                    .fold(0u64, |a, line| {
                        moxie_quant::prefetch_ahead(bytemuck::cast_slice(line));
                        line.iter().fold(a, |a, &x| a.wrapping_add(x))
                    });
            }
        });
        let secs = t0.elapsed().as_secs_f64().max(1e-9);
        std::hint::black_box(&sums);
        rates.push((buf.len() * 8) as f64 / secs);
    }
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

/// Mean and sample standard deviation.
pub fn mean_std(samples: &[f64]) -> (f64, f64) {
    let n = samples.len() as f64;
    if samples.is_empty() {
        return (0.0, 0.0);
    }
    let mean = samples.iter().sum::<f64>() / n;
    let var = if samples.len() > 1 {
        samples.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_llama_bench() {
        let t = |p, g, d| BenchTest {
            n_prompt: p,
            n_gen: g,
            depth: d,
        };
        assert_eq!(t(512, 0, 0).name(), "pp512");
        assert_eq!(t(0, 128, 0).name(), "tg128");
        assert_eq!(t(512, 128, 0).name(), "pp512+tg128");
        assert_eq!(t(0, 128, 4096).name(), "tg128 @ d4096");
    }

    #[test]
    fn mean_and_sample_std() {
        let (m, s) = mean_std(&[1.0, 2.0, 3.0]);
        assert_eq!(m, 2.0);
        assert!((s - 1.0).abs() < 1e-12);
        assert_eq!(mean_std(&[5.0]), (5.0, 0.0));
    }
}
