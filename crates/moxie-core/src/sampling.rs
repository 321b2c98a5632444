//! Token sampling with llama.cpp's default chain and defaults: penalties → top-k → top-p →
//! min-p → temperature → draw. A temperature <= 0 means greedy (argmax).

/// Sampling settings (llama.cpp flag names and defaults).
#[derive(Clone, Debug)]
pub struct SamplerConfig {
    /// `--temp`: 0 or less = greedy.
    pub temperature: f32,
    /// `--top-k`: 0 = off.
    pub top_k: usize,
    /// `--top-p`: 1.0 = off.
    pub top_p: f32,
    /// `--min-p`: 0.0 = off.
    pub min_p: f32,
    /// `--repeat-penalty`: 1.0 = off.
    pub repeat_penalty: f32,
    /// `--repeat-last-n`: how many recent tokens the penalties look at.
    pub repeat_last_n: usize,
    /// `--presence-penalty`
    pub presence_penalty: f32,
    /// `--frequency-penalty`
    pub frequency_penalty: f32,
    /// `--seed`
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    pub fn greedy() -> Self {
        SamplerConfig {
            temperature: 0.0,
            ..Default::default()
        }
    }
}

/// SplitMix64: small, seedable, good enough for sampling.
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A stateful sampler (keeps the RNG and the recent tokens for penalties).
pub struct Sampler {
    cfg: SamplerConfig,
    rng: Rng,
    recent: std::collections::VecDeque<u32>,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Sampler {
        let rng = Rng(cfg.seed);
        Sampler {
            cfg,
            rng,
            recent: Default::default(),
        }
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Record a token that is now part of the context (prompt or generated), for penalties.
    pub fn accept(&mut self, token: u32) {
        if self.cfg.repeat_last_n == 0 {
            return;
        }
        if self.recent.len() == self.cfg.repeat_last_n {
            self.recent.pop_front();
        }
        self.recent.push_back(token);
    }

    /// Choose the next token from `logits` (one row of `n_vocab`).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let mut logits = logits.to_vec();
        self.apply_penalties(&mut logits);
        if self.cfg.temperature <= 0.0 {
            return argmax(&logits);
        }
        // Candidates sorted by logit, best first.
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_finite())
            .map(|(i, &l)| (i as u32, l))
            .collect();
        if cand.is_empty() {
            return argmax(&logits);
        }
        cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if self.cfg.top_k > 0 {
            cand.truncate(self.cfg.top_k);
        }
        if self.cfg.top_p < 1.0 {
            let probs = softmax_of(&cand, 1.0);
            let mut cum = 0.0f32;
            let mut keep = cand.len();
            for (i, p) in probs.iter().enumerate() {
                cum += p;
                if cum >= self.cfg.top_p {
                    keep = i + 1;
                    break;
                }
            }
            cand.truncate(keep.max(1));
        }
        if self.cfg.min_p > 0.0 {
            // Keep tokens whose probability is at least min_p times the best one's.
            let max = cand[0].1;
            let cut = max + self.cfg.min_p.ln();
            let n = cand.iter().take_while(|c| c.1 >= cut).count();
            cand.truncate(n.max(1));
        }
        let probs = softmax_of(&cand, self.cfg.temperature);
        let r = self.rng.next_f64() as f32;
        let mut cum = 0.0f32;
        for (c, p) in cand.iter().zip(&probs) {
            cum += p;
            if r < cum {
                return c.0;
            }
        }
        cand.last().map_or(0, |c| c.0)
    }

    fn apply_penalties(&self, logits: &mut [f32]) {
        let c = &self.cfg;
        if self.recent.is_empty()
            || (c.repeat_penalty == 1.0 && c.presence_penalty == 0.0 && c.frequency_penalty == 0.0)
        {
            return;
        }
        let mut counts: std::collections::HashMap<u32, u32> = Default::default();
        for &t in &self.recent {
            *counts.entry(t).or_default() += 1;
        }
        for (&t, &n) in &counts {
            let Some(l) = logits.get_mut(t as usize) else {
                continue;
            };
            if *l <= 0.0 {
                *l *= c.repeat_penalty;
            } else {
                *l /= c.repeat_penalty;
            }
            *l -= n as f32 * c.frequency_penalty + c.presence_penalty;
        }
    }
}

/// Index of the largest value (first one on ties).
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

fn softmax_of(cand: &[(u32, f32)], temp: f32) -> Vec<f32> {
    let max = cand[0].1 / temp;
    let mut p: Vec<f32> = cand.iter().map(|c| (c.1 / temp - max).exp()).collect();
    let s: f32 = p.iter().sum();
    p.iter_mut().for_each(|v| *v /= s);
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_argmax() {
        let mut s = Sampler::new(SamplerConfig::greedy());
        assert_eq!(s.sample(&[0.1, 3.0, 2.0]), 1);
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_follows_distribution() {
        let logits = [0.0f32, 1.0, 2.0, -10.0];
        let cfg = SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 42,
            ..Default::default()
        };
        let draw = |cfg: &SamplerConfig| {
            let mut s = Sampler::new(cfg.clone());
            (0..4000).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        let a = draw(&cfg);
        assert_eq!(a, draw(&cfg));
        let frac2 = a.iter().filter(|&&t| t == 2).count() as f32 / a.len() as f32;
        // softmax([0,1,2]) ≈ [0.090, 0.245, 0.665]
        assert!((frac2 - 0.665).abs() < 0.03, "{frac2}");
        assert!(!a.contains(&3));
    }

    #[test]
    fn top_k_one_is_greedy_and_min_p_cuts_tail() {
        let mut s = Sampler::new(SamplerConfig {
            top_k: 1,
            temperature: 5.0,
            ..Default::default()
        });
        for _ in 0..50 {
            assert_eq!(s.sample(&[0.0, 0.5, 0.4]), 1);
        }
        let mut s = Sampler::new(SamplerConfig {
            top_k: 0,
            top_p: 1.0,
            min_p: 0.5,
            temperature: 1.0,
            seed: 7,
            ..Default::default()
        });
        // p(1)/p(0) = e^-1 < 0.5: only token 0 survives min-p.
        for _ in 0..50 {
            assert_eq!(s.sample(&[1.0, 0.0, -1.0]), 0);
        }
    }

    #[test]
    fn repetition_penalty_discourages_recent_tokens() {
        let mut s = Sampler::new(SamplerConfig {
            temperature: 0.0,
            repeat_penalty: 2.0,
            ..Default::default()
        });
        s.accept(0);
        assert_eq!(s.sample(&[2.0, 1.5]), 1);
        let mut s = Sampler::new(SamplerConfig {
            temperature: 0.0,
            presence_penalty: 1.0,
            ..Default::default()
        });
        s.accept(0);
        assert_eq!(s.sample(&[2.0, 1.5]), 1);
    }
}
