//! One request's constraint: its grammar's matcher (which tokens may come next), and its logit
//! biases. The engine asks for the next token's mask after each accepted token, applies it to
//! the row's logits (on the host, or as a bias row of the device's draw), and feeds the drawn
//! token back.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use llguidance::Matcher;
use llguidance::toktrie::SimpleVob;

use crate::landing::{LANDING_TOKENS, Landing};

/// What the grammar says after a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// More may follow.
    Continue,
    /// The grammar is complete and allows nothing more: the answer ends here.
    Complete,
}

/// One request's constraint.
pub struct Constraint {
    matcher: Option<Matcher>,
    /// (token, added to its logit), OpenAI's `logit_bias`.
    bias: Vec<(u32, f32)>,
    stop_ids: Arc<Vec<u32>>,
    landing: Arc<Landing>,
    vocab: usize,
    /// Tokens allowed next (`None`: any).
    mask: Option<SimpleVob>,
}

/// Masks computed by this process, and the nanoseconds they took.
static MASKS: AtomicU64 = AtomicU64::new(0);
static MASK_NANOS: AtomicU64 = AtomicU64::new(0);

/// Masks computed by this process so far, and the time they took.
pub fn mask_totals() -> (u64, Duration) {
    (
        MASKS.load(Ordering::Relaxed),
        Duration::from_nanos(MASK_NANOS.load(Ordering::Relaxed)),
    )
}

impl Constraint {
    pub(crate) fn new(
        matcher: Option<Matcher>,
        bias: Vec<(u32, f32)>,
        stop_ids: Arc<Vec<u32>>,
        landing: Arc<Landing>,
        vocab: usize,
    ) -> Self {
        Self {
            matcher,
            bias,
            stop_ids,
            landing,
            vocab,
            mask: None,
        }
    }

    /// Whether a grammar constrains the answer (not only biases).
    pub fn has_grammar(&self) -> bool {
        self.matcher.is_some()
    }

    /// Computes which tokens may come next (before the first token, and after each), with
    /// `remaining` tokens left before the answer's limit (near it, the answer lands).
    pub fn prepare(&mut self, remaining: usize) -> Result<(), String> {
        let Some(m) = self.matcher.as_mut() else {
            return Ok(());
        };
        let t = Instant::now();
        let mask = m.compute_mask_or_eos().map_err(|e| e.to_string());
        MASKS.fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
        MASK_NANOS.fetch_add(nanos, Ordering::Relaxed);
        let mut mask = mask?;
        if mask.is_zero() {
            return Err("the grammar allows no token here".into());
        }
        if remaining <= LANDING_TOKENS {
            self.landing.narrow(&mut mask);
        }
        self.mask = Some(mask);
        Ok(())
    }

    /// Masks and biases one row of logits in place (the host's sampler).
    pub fn apply(&self, logits: &mut [f32]) {
        if let Some(mask) = &self.mask {
            for (i, l) in logits.iter_mut().enumerate() {
                if !allowed(mask, i) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        for &(token, bias) in &self.bias {
            if let Some(l) = logits.get_mut(token as usize) {
                *l += bias;
            }
        }
    }

    /// The row to add to `width` logits for the same effect as [`Constraint::apply`] (a
    /// device's draw): 0 or `-inf`, plus the biases.
    pub fn bias_row(&self, width: usize, out: &mut Vec<f32>) {
        let start = out.len();
        out.resize(start + width, 0.0);
        self.apply(&mut out[start..]);
    }

    /// Feeds the chosen `token` to the grammar (a stop token the grammar allowed ends it).
    pub fn accept(&mut self, token: u32) -> Result<Verdict, String> {
        let Some(m) = self.matcher.as_mut() else {
            return Ok(Verdict::Continue);
        };
        self.mask = None;
        if m.is_stopped() {
            return Ok(Verdict::Complete);
        }
        if self.stop_ids.contains(&token) {
            return match m.is_accepting() {
                Ok(true) => Ok(Verdict::Complete),
                _ => Err(format!(
                    "token {token} ended the answer before its grammar did"
                )),
            };
        }
        m.consume_token(token).map_err(|e| e.to_string())?;
        Ok(if m.is_stopped() {
            Verdict::Complete
        } else {
            Verdict::Continue
        })
    }

    /// The width of a mask.
    pub fn vocab(&self) -> usize {
        self.vocab
    }
}

fn allowed(mask: &SimpleVob, i: usize) -> bool {
    mask.as_slice()
        .get(i / 32)
        .is_some_and(|w| (w >> (i % 32)) & 1 == 1)
}
