//! Throughput measurement the way llama-bench does it: prompt processing (`ppN`: N tokens
//! from an empty cache, in micro-batches), token generation (`tgN`: N one-token decodes),
//! both (`pgN,M`), optionally after a context of `depth` tokens that is not timed. Tokens are
//! fixed pseudo-random ids, so runs are comparable between engines.

use std::time::Instant;

use crate::model::{Logits, Model};
use crate::parallel::Parallel;
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
pub fn run_once(model: &Model, par: &Parallel, test: BenchTest, ubatch: usize) -> Result<f64> {
    let n_vocab = model.config.n_vocab;
    let mut cache = model.new_cache(Some(test.depth + test.n_tokens() + 1));
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
