//! Choosing the next token from logits: greedy, or sampled with temperature, top-k, top-p and
//! min-p, after repetition/presence/frequency penalties; seeded for reproducibility.

use std::collections::HashMap;

/// Sampling settings for one request: the wire type itself, so the front end, the daemon and
/// the sampler share one definition (OpenAI's names; neutral values disable each).
pub use mlxcel_ipc::proto::daemon::Sampling as SamplingParams;

/// SplitMix64: a small, well-mixed PRNG; enough for sampling and trivially reproducible.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
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

/// Per-request sampling state.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: SplitMix64,
    /// Occurrences of each token in the output so far.
    generated: HashMap<u32, u32>,
    /// Tokens of prompt and output (for the repetition penalty).
    seen: HashMap<u32, ()>,
}

/// A chosen token and its log-probability under the model (before any penalty).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    pub token: u32,
    pub logprob: f32,
}

impl Sampler {
    /// A sampler for a request whose prompt is `prompt`.
    pub fn new(params: SamplingParams, prompt: &[u32]) -> Self {
        let seed = params.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        Self {
            params,
            rng: SplitMix64(seed),
            generated: HashMap::new(),
            seen: prompt.iter().map(|&t| (t, ())).collect(),
        }
    }

    /// Picks the next token from a logits array (`[vocab]` or `[1, vocab]`, f32).
    pub fn sample_logits(&mut self, logits: &mlx_rs::Array) -> crate::Result<Choice> {
        let row = logits
            .try_as_slice::<f32>()
            .map_err(|e| crate::EngineError::Internal(format!("logits: {e}")))?;
        Ok(self.sample(row))
    }

    /// Picks the next token from `logits` and records it.
    pub fn sample(&mut self, logits: &[f32]) -> Choice {
        let logprobs = log_softmax(logits);
        let mut adjusted = logits.to_vec();
        self.apply_penalties(&mut adjusted);
        let token = if self.params.temperature <= 0.0 {
            argmax(&adjusted)
        } else {
            self.draw(&adjusted)
        };
        *self.generated.entry(token).or_insert(0) += 1;
        self.seen.insert(token, ());
        Choice {
            token,
            logprob: logprobs
                .get(token as usize)
                .copied()
                .unwrap_or(f32::NEG_INFINITY),
        }
    }

    fn apply_penalties(&self, logits: &mut [f32]) {
        let p = &self.params;
        if p.repetition_penalty != 1.0 && p.repetition_penalty > 0.0 {
            for &t in self.seen.keys() {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 {
                        *l / p.repetition_penalty
                    } else {
                        *l * p.repetition_penalty
                    };
                }
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            for (&t, &n) in &self.generated {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l -= p.presence_penalty + p.frequency_penalty * n as f32;
                }
            }
        }
    }

    fn draw(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
        let inv_t = 1.0 / p.temperature;
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l * inv_t))
            .collect();
        cand.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if p.top_k > 0 {
            cand.truncate(p.top_k as usize);
        }
        let max = cand.first().map_or(0.0, |c| c.1);
        let mut probs: Vec<f64> = cand.iter().map(|c| f64::from(c.1 - max).exp()).collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= total);
        let mut keep = probs.len();
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            for (i, &x) in probs.iter().enumerate() {
                acc += x;
                if acc >= f64::from(p.top_p) {
                    keep = i + 1;
                    break;
                }
            }
        }
        if p.min_p > 0.0 {
            let floor = probs[0] * f64::from(p.min_p);
            keep = keep.min(probs.iter().take_while(|&&x| x >= floor).count().max(1));
        }
        let kept: f64 = probs[..keep].iter().sum();
        let mut u = self.rng.next_f64() * kept;
        for (i, &x) in probs[..keep].iter().enumerate() {
            if u < x {
                return cand[i].0;
            }
            u -= x;
        }
        cand[keep - 1].0
    }
}

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

fn log_softmax(x: &[f32]) -> Vec<f32> {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = x.iter().map(|&v| f64::from(v - max).exp()).sum();
    let log_sum = sum.ln() as f32 + max;
    x.iter().map(|&v| v - log_sum).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_argmax_and_reports_its_logprob() {
        let mut s = Sampler::new(SamplingParams::default(), &[]);
        let c = s.sample(&[0.0, 2.0, 1.0]);
        assert_eq!(c.token, 1);
        let expected = 2.0 - (1f32 + 2f32.exp() + 1f32.exp()).ln();
        assert!((c.logprob - expected).abs() < 1e-6);
    }

    #[test]
    fn a_seed_reproduces_a_sampled_sequence_and_another_seed_differs() {
        let logits: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin()).collect();
        let run = |seed| {
            let params = SamplingParams {
                temperature: 1.0,
                seed: Some(seed),
                ..SamplingParams::default()
            };
            let mut s = Sampler::new(params, &[]);
            (0..50).map(|_| s.sample(&logits).token).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn top_k_one_and_min_p_one_are_greedy() {
        let logits = [0.1, 3.0, 2.9, -1.0];
        for params in [
            SamplingParams {
                temperature: 1.0,
                top_k: 1,
                seed: Some(1),
                ..SamplingParams::default()
            },
            SamplingParams {
                temperature: 1.0,
                min_p: 1.0,
                seed: Some(1),
                ..SamplingParams::default()
            },
            SamplingParams {
                temperature: 1.0,
                top_p: 0.01,
                seed: Some(1),
                ..SamplingParams::default()
            },
        ] {
            let mut s = Sampler::new(params, &[]);
            assert!((0..20).all(|_| s.sample(&logits).token == 1));
        }
    }

    #[test]
    fn penalties_push_away_from_repeats() {
        let logits = [1.0, 0.9];
        let params = SamplingParams {
            presence_penalty: 0.5,
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(params, &[]);
        assert_eq!(s.sample(&logits).token, 0);
        assert_eq!(
            s.sample(&logits).token,
            1,
            "token 0 now carries a 0.5 presence penalty"
        );
        let params = SamplingParams {
            repetition_penalty: 2.0,
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(params, &[0]);
        assert_eq!(
            s.sample(&logits).token,
            1,
            "token 0 is in the prompt: 1.0 / 2 < 0.9"
        );
    }
}
