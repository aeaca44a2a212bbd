//! Choosing the next token from logits: greedy, or sampled with temperature, top-k, top-p and
//! min-p, after repetition/presence/frequency penalties; seeded for reproducibility.
//!
//! A step samples every running sequence, so the common cases stay cheap: no copy of the
//! logits without penalties, a log-probability only when asked, and no sort of the whole
//! vocabulary (top-k selects first; top-p sorts only the tokens that can be in the nucleus).

use std::borrow::Cow;
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
    /// Whether choices carry their log-probability (a pass over the vocabulary).
    logprobs: bool,
}

/// Changes a row of logits before sampling (a grammar's mask, logit biases).
type Adjust<'a> = &'a dyn Fn(&mut [f32]);

/// A chosen token and, when asked for, its log-probability under the model (before any
/// penalty).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    pub token: u32,
    pub logprob: Option<f32>,
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
            logprobs: true,
        }
    }

    /// Whether choices carry their log-probability (on by default).
    pub fn with_logprobs(mut self, on: bool) -> Self {
        self.logprobs = on;
        self
    }

    /// The request's settings.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Whether choices carry their log-probability.
    pub fn logprobs(&self) -> bool {
        self.logprobs
    }

    /// The next uniform in [0, 1) of the request's seeded generator, for a draw made elsewhere
    /// ([`crate::batch_draw`]).
    pub fn uniform(&mut self) -> f32 {
        (self.rng.next_f64() as f32).min(1.0 - f32::EPSILON)
    }

    /// Records `token`, chosen elsewhere, as generated (for the penalties).
    pub fn record(&mut self, token: u32) {
        *self.generated.entry(token).or_insert(0) += 1;
        self.seen.insert(token, ());
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
        self.pick(logits, None)
    }

    /// Like [`Sampler::sample`], from `logits` as `adjust` changes them after the penalties (a
    /// grammar's mask, logit biases); the log-probability is still the model's.
    pub fn sample_adjusted(&mut self, logits: &[f32], adjust: impl Fn(&mut [f32])) -> Choice {
        self.pick(logits, Some(&adjust))
    }

    fn pick(&mut self, logits: &[f32], adjust: Option<Adjust<'_>>) -> Choice {
        let adjusted = if self.penalised() || adjust.is_some() {
            let mut v = logits.to_vec();
            self.apply_penalties(&mut v);
            if let Some(adjust) = adjust {
                adjust(&mut v);
            }
            Cow::Owned(v)
        } else {
            Cow::Borrowed(logits)
        };
        let token = if self.params.temperature <= 0.0 {
            argmax(&adjusted)
        } else {
            self.draw(&adjusted)
        };
        self.record(token);
        Choice {
            token,
            logprob: self.logprobs.then(|| log_prob(logits, token)),
        }
    }

    fn penalised(&self) -> bool {
        let p = &self.params;
        (p.repetition_penalty != 1.0 && p.repetition_penalty > 0.0)
            || p.presence_penalty != 0.0
            || p.frequency_penalty != 0.0
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
        let Candidates { cand, max, mass } = candidates(logits, inv_t, p.top_k as usize, p.top_p);
        let mut probs: Vec<f64> = cand.iter().map(|c| f64::from(c.1 - max).exp()).collect();
        let total = mass.unwrap_or_else(|| probs.iter().sum());
        probs.iter_mut().for_each(|x| *x /= total);
        let mut keep = probs.len();
        if p.top_p < 1.0 {
            // `cand` is sorted, best first, when top-p applies.
            let mut acc = 0.0;
            for (i, &x) in probs.iter().enumerate() {
                acc += x;
                if acc >= f64::from(p.top_p) {
                    keep = i + 1;
                    break;
                }
            }
        }
        let (cand, probs) = (&cand[..keep], &probs[..keep]);
        let floor = if p.min_p > 0.0 {
            probs.iter().copied().fold(0.0, f64::max) * f64::from(p.min_p)
        } else {
            0.0
        };
        let kept: f64 = probs.iter().filter(|&&x| x >= floor).sum();
        let mut u = self.rng.next_f64() * kept;
        let mut last = cand[0].0;
        for (c, &x) in cand.iter().zip(probs).filter(|(_, x)| **x >= floor) {
            if u < x {
                return c.0;
            }
            u -= x;
            last = c.0;
        }
        last
    }
}

/// The tokens a draw can pick, with their scaled logits: all of them (in vocabulary order)
/// when neither top-k nor top-p applies; otherwise sorted best first (ties by id), the `top_k`
/// best, and for top-p only those within reach of the nucleus. A token whose scaled logit is
/// below the best by more than `NUCLEUS_SPAN` is left out when the ones kept already hold
/// `top_p` of the mass: the nucleus is a prefix of the sorted order, so it lies among them.
fn candidates(logits: &[f32], inv_t: f32, top_k: usize, top_p: f32) -> Candidates {
    const NUCLEUS_SPAN: f32 = 20.0;
    let mut cand: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as u32, l * inv_t))
        .collect();
    let better = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    let top_k_cuts = top_k > 0 && top_k < cand.len();
    if top_k_cuts {
        cand.select_nth_unstable_by(top_k - 1, better);
        cand.truncate(top_k);
    }
    let max = cand.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
    let mut mass = None;
    if !top_k_cuts {
        if top_p >= 1.0 {
            return Candidates { cand, max, mass };
        }
        let of = |c: &[(u32, f32)]| c.iter().map(|x| f64::from(x.1 - max).exp()).sum::<f64>();
        let near: Vec<(u32, f32)> = cand
            .iter()
            .copied()
            .filter(|c| c.1 >= max - NUCLEUS_SPAN)
            .collect();
        let all = of(&cand);
        if of(&near) >= f64::from(top_p) * all {
            cand = near;
            // Probabilities stay relative to the whole vocabulary.
            mass = Some(all);
        }
    }
    cand.sort_unstable_by(better);
    Candidates { cand, max, mass }
}

/// What [`candidates`] keeps.
struct Candidates {
    cand: Vec<(u32, f32)>,
    /// The best scaled logit.
    max: f32,
    /// `Σ exp(l - max)` over every candidate when some were left out before the nucleus cut.
    mass: Option<f64>,
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

/// `log softmax(x)[token]`.
fn log_prob(x: &[f32], token: u32) -> f32 {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = x.iter().map(|&v| f64::from(v - max).exp()).sum();
    let at = x.get(token as usize).copied().unwrap_or(f32::NEG_INFINITY);
    at - (sum.ln() as f32 + max)
}

#[cfg(test)]
mod tests;
