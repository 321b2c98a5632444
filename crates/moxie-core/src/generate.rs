//! The generation loop: prefill the prompt in micro-batches, then decode one token at a time.

use std::time::{Duration, Instant};

use crate::model::{Logits, Model};
use crate::parallel::Parallel;
use crate::sampling::Sampler;
use crate::state::SeqState;
use crate::Result;

/// Timings of one generation, for the tokens/s report.
#[derive(Clone, Debug, Default)]
pub struct GenStats {
    pub n_prompt: usize,
    pub n_generated: usize,
    pub prompt_time: Duration,
    pub gen_time: Duration,
}

impl GenStats {
    pub fn prompt_tps(&self) -> f64 {
        self.n_prompt as f64 / self.prompt_time.as_secs_f64().max(1e-9)
    }

    pub fn gen_tps(&self) -> f64 {
        self.n_generated as f64 / self.gen_time.as_secs_f64().max(1e-9)
    }
}

/// Generation settings.
#[derive(Clone, Debug)]
pub struct GenParams {
    /// Tokens to generate at most (`-n`).
    pub n_predict: usize,
    /// Micro-batch size for prompt processing (`-ub`).
    pub ubatch: usize,
}

/// Evaluate `prompt` after what `cache` holds and generate up to `n_predict` tokens.
/// `on_token` receives each new token and returns false to stop (e.g. at an end-of-generation
/// token).
pub fn generate(
    model: &Model,
    cache: &mut SeqState,
    par: &Parallel,
    prompt: &[u32],
    params: &GenParams,
    sampler: &mut Sampler,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<GenStats> {
    let mut stats = GenStats {
        n_prompt: prompt.len(),
        ..Default::default()
    };
    let t0 = Instant::now();
    let mut logits = model.prefill(prompt, cache, par, params.ubatch)?;
    for &t in prompt {
        sampler.accept(t);
    }
    stats.prompt_time = t0.elapsed();
    if logits.is_empty() {
        return Ok(stats);
    }
    let t1 = Instant::now();
    for i in 0..params.n_predict {
        let tok = sampler.sample(&logits);
        sampler.accept(tok);
        stats.n_generated += 1;
        let keep_going = on_token(tok);
        if !keep_going || i + 1 == params.n_predict {
            break;
        }
        if cache.len() >= cache.n_ctx() {
            break;
        }
        logits = model.forward(&[tok], cache, par, Logits::Last)?;
    }
    stats.gen_time = t1.elapsed();
    Ok(stats)
}
