//! A decode step's next tokens drawn where its logits are (the GPU, or MLX's CPU stream), every
//! row at once: greedy, or sampled with temperature, top-k, top-p and min-p. A step then moves B
//! token ids to the host instead of B rows of logits, and the next step can be queued on them
//! before they are read (`engine::step`). Penalties need each request's history and stay on the
//! host ([`crate::sampler::Sampler`]), as does anything a device cannot do cheaply
//! ([`RowDraw::fits`]).
//!
//! The rules are [`crate::sampler::Sampler`]'s: temperature scales the logits; top-k keeps the
//! `top_k` best; top-p keeps the smallest best-first prefix of those whose probability (within
//! them) reaches `top_p`; min-p keeps what is at least `min_p` times the best's probability.
//! Each is a per-row threshold on the scaled logits, found from one sort of the rows (only when
//! a row asks for top-k or top-p). The draw is inverse-CDF sampling with one uniform per row from
//! the request's own seeded generator, over the kept tokens in vocabulary order.

use mlx_rs::ops::indexing::{argmax_axis, take_along_axis};
use mlx_rs::{Array, Dtype, ops};

use crate::Result;
use crate::sampler::SamplingParams;

/// How one row is drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowDraw {
    /// 0 (or less) = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: u32,
    /// 1 (or more) = off.
    pub top_p: f32,
    /// 0 = off.
    pub min_p: f32,
    /// The draw's uniform in [0, 1) (unused when greedy).
    pub uniform: f32,
}

impl RowDraw {
    /// The row for `params`, drawing with `uniform`.
    pub fn new(params: &SamplingParams, uniform: f32) -> Self {
        RowDraw {
            temperature: params.temperature,
            top_k: params.top_k,
            top_p: params.top_p,
            min_p: params.min_p,
            uniform,
        }
    }

    fn greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    fn sorts(&self) -> bool {
        !self.greedy() && (self.top_k > 0 || self.top_p < 1.0)
    }

    /// Whether requests with `params` are drawn here: no penalties (they need the request's
    /// history), and on a CPU no top-k or top-p (a sort of every row costs more there than the
    /// host's partial selection).
    pub fn fits(params: &SamplingParams, gpu: bool) -> bool {
        let penalised = (params.repetition_penalty != 1.0 && params.repetition_penalty > 0.0)
            || params.presence_penalty != 0.0
            || params.frequency_penalty != 0.0;
        let row = RowDraw::new(params, 0.0);
        !penalised && (gpu || !row.sorts())
    }
}

/// What [`draw`] queues: the rows' tokens and, when asked, their log-probabilities under the
/// model (before temperature), both lazy.
#[derive(Clone)]
pub struct Drawn {
    /// `[rows]`, u32.
    pub tokens: Array,
    /// `[rows]`, f32.
    pub logprobs: Option<Array>,
}

/// Draws row `i` of `logits` (`[rows, vocab]`, f32) plus `bias` (same shape: a grammar's mask
/// as 0 or `-inf`, logit biases) as `rows[i]` says; with `logprobs`, also each chosen token's
/// log-probability under the model (without the bias).
pub fn draw(
    model_logits: &Array,
    bias: Option<&Array>,
    rows: &[RowDraw],
    logprobs: bool,
) -> Result<Drawn> {
    let logits = &match bias {
        Some(b) => ops::add(model_logits, b)?,
        None => model_logits.clone(),
    };
    let b = rows.len() as i32;
    let vocab = logits.shape().last().copied().unwrap_or(0);
    if logits.shape() != [b, vocab] || vocab == 0 {
        return Err(crate::EngineError::Internal(format!(
            "drawing {b} rows from logits of shape {:?}",
            logits.shape()
        )));
    }
    let best = argmax_axis(logits, -1, false)?;
    let tokens = if rows.iter().all(RowDraw::greedy) {
        best
    } else {
        let sampled = sample(logits, rows, vocab)?;
        let greedy: Vec<bool> = rows.iter().map(RowDraw::greedy).collect();
        ops::select(Array::from_slice(&greedy, &[b]), &best, &sampled)?
    };
    let tokens = tokens.as_dtype(Dtype::Uint32)?;
    let logprobs = if logprobs {
        let at = take_along_axis(model_logits, tokens.reshape(&[b, 1])?, -1)?;
        let total = ops::logsumexp_axis(model_logits, -1, true)?;
        Some(ops::subtract(&at, &total)?.reshape(&[b])?)
    } else {
        None
    };
    Ok(Drawn { tokens, logprobs })
}

/// Inverse-CDF draws of the rows (greedy rows drawn at temperature 1, their result unused).
fn sample(logits: &Array, rows: &[RowDraw], vocab: i32) -> Result<Array> {
    let b = rows.len() as i32;
    let column = |f: &dyn Fn(&RowDraw) -> f32| -> Array {
        let v: Vec<f32> = rows.iter().map(f).collect();
        Array::from_slice(&v, &[b, 1])
    };
    let inv_t = column(&|r| {
        if r.greedy() { 1.0 } else { 1.0 / r.temperature }
    });
    let x = ops::multiply(logits, &inv_t)?;
    let top = ops::max_axis(&x, -1, true)?;
    let mut floor = ops::add(
        &top,
        column(&|r| {
            if r.min_p > 0.0 {
                r.min_p.min(1.0).ln()
            } else {
                f32::NEG_INFINITY
            }
        }),
    )?;
    if rows.iter().any(RowDraw::sorts) {
        floor = ops::maximum(&floor, &cut(&x, &top, rows, vocab)?)?;
    }
    let kept = ops::select(
        &ops::ge(&x, &floor)?,
        &ops::exp(&ops::subtract(&x, &top)?)?,
        Array::from_f32(0.0),
    )?;
    let cdf = ops::cumsum(&kept, -1, None, None)?;
    let total = cdf
        .take_axis(Array::from_int(vocab - 1), -1)?
        .reshape(&[b, 1])?;
    let target = ops::multiply(&total, column(&|r| r.uniform.clamp(0.0, 1.0)))?;
    // The first token whose cumulative mass passes the target: it has mass, so it is kept
    // (a token a grammar masks out has none, even at a target of 0).
    let below = ops::sum_axis(&ops::le(&cdf, &target)?.as_dtype(Dtype::Int32)?, -1, false)?;
    Ok(ops::minimum(&below, Array::from_int(vocab - 1))?)
}

/// Each row's top-k and top-p threshold on the scaled logits `x` (`[rows, 1]`; `-inf` where
/// neither applies). `top` is each row's best.
fn cut(x: &Array, top: &Array, rows: &[RowDraw], vocab: i32) -> Result<Array> {
    let b = rows.len() as i32;
    let sorted = ops::sort_axis(x, -1)?; // ascending: the best last
    let k: Vec<i32> = rows
        .iter()
        .map(|r| match r.top_k as i32 {
            k if k > 0 && k < vocab && !r.greedy() => vocab - k,
            _ => 0,
        })
        .collect();
    let kth = take_along_axis(&sorted, Array::from_slice(&k, &[b, 1]), -1)?;
    if rows.iter().all(|r| r.top_p >= 1.0 || r.greedy()) {
        return Ok(kth);
    }
    // Mass of each sorted token and everything better, within the top-k, over the top-k's mass.
    let mass = ops::select(
        &ops::ge(&sorted, &kth)?,
        &ops::exp(&ops::subtract(&sorted, top)?)?,
        Array::from_f32(0.0),
    )?;
    let at_least = ops::cumsum(&mass, -1, true, None)?;
    let whole = at_least
        .take_axis(Array::from_int(0), -1)?
        .reshape(&[b, 1])?;
    let p: Vec<f32> = rows.iter().map(|r| r.top_p.clamp(0.0, 1.0)).collect();
    let need = ops::multiply(&whole, Array::from_slice(&p, &[b, 1]))?;
    // The nucleus is the sorted tail from the last position whose mass-and-better reaches it.
    let reach = ops::sum_axis(
        &ops::ge(&at_least, &need)?.as_dtype(Dtype::Int32)?,
        -1,
        true,
    )?;
    let last = ops::maximum(
        &ops::subtract(&reach, Array::from_int(1))?,
        Array::from_int(0),
    )?;
    let nucleus = take_along_axis(&sorted, &last, -1)?;
    let off: Vec<bool> = rows.iter().map(|r| r.top_p >= 1.0 || r.greedy()).collect();
    let nucleus = ops::select(
        Array::from_slice(&off, &[b, 1]),
        Array::from_f32(f32::NEG_INFINITY),
        &nucleus,
    )?;
    Ok(ops::maximum(&kth, &nucleus)?)
}

#[cfg(test)]
mod tests;
