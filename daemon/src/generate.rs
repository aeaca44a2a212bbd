//! Generating tokens for one sequence: prefill in chunks, then decode one token at a time.

use std::time::{Duration, Instant};

use crate::kv::GrowingKv;
use crate::model::Model;
use crate::sampler::{Choice, Sampler, SamplingParams};
use crate::{EngineError, Result};

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    /// Token ids that end generation (not included in the output).
    pub stop_ids: Vec<u32>,
    pub sampling: SamplingParams,
    /// Prompt tokens per forward pass during prefill.
    pub prefill_chunk: usize,
}

/// Why generation ended (the wire type: stop, length, cancelled).
pub use mlxcel_ipc::proto::daemon::FinishReason;

/// The result of a generation.
#[derive(Debug, Clone)]
pub struct Generated {
    pub tokens: Vec<u32>,
    pub logprobs: Vec<f32>,
    pub finish: FinishReason,
    pub prefill_time: Duration,
    pub decode_time: Duration,
}

/// Runs `req` on `model` with `kv` (which may already hold a prefix of the prompt: only the
/// rest is prefilled), growing it before each pass. `on_token` sees each token; returning false cancels.
pub fn generate(
    model: &Model,
    kv: &mut dyn GrowingKv,
    req: &GenerateRequest,
    mut on_token: impl FnMut(Choice) -> bool,
) -> Result<Generated> {
    let ctx = model.config.context_length;
    if req.prompt.is_empty() {
        return Err(EngineError::Request("the prompt is empty".into()));
    }
    if req.prompt.len() >= ctx {
        return Err(EngineError::Request(format!(
            "the prompt has {} tokens; the model's context window is {ctx}",
            req.prompt.len()
        )));
    }
    if kv.len() >= req.prompt.len() {
        return Err(EngineError::Request(
            "the cache holds the whole prompt; at least one token must be computed".into(),
        ));
    }
    let max_tokens = req.max_tokens.min(ctx - req.prompt.len());
    let mut sampler = Sampler::new(req.sampling.clone(), &req.prompt);
    let started = Instant::now();
    let chunk = req.prefill_chunk.max(1);
    let mut logits = None;
    for piece in req.prompt[kv.len()..].chunks(chunk) {
        kv.grow(piece.len())?;
        let l = model.forward(piece, kv)?;
        l.eval()?;
        logits = Some(l);
    }
    let prefill_time = started.elapsed();
    let decode_start = Instant::now();
    let mut out = Generated {
        tokens: Vec::new(),
        logprobs: Vec::new(),
        finish: FinishReason::Length,
        prefill_time,
        decode_time: Duration::ZERO,
    };
    while out.tokens.len() < max_tokens {
        let Some(l) = logits.take() else { break };
        let choice = sampler.sample_logits(&l)?;
        if req.stop_ids.contains(&choice.token) {
            out.finish = FinishReason::Stop;
            break;
        }
        out.tokens.push(choice.token);
        out.logprobs.push(choice.logprob.unwrap_or(f32::NAN));
        if !on_token(choice) {
            out.finish = FinishReason::Cancelled;
            break;
        }
        if out.tokens.len() < max_tokens {
            kv.grow(1)?;
            let l = model.forward(&[choice.token], kv)?;
            l.eval()?;
            logits = Some(l);
        }
    }
    out.decode_time = decode_start.elapsed();
    Ok(out)
}
