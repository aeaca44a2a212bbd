//! A pass's next tokens, drawn where they can be: each row whose sampler the device can follow
//! ([`RowDraw::fits`]) gets its token drawn on the device ([`crate::batch_draw`]), left lazy as
//! the sequence's next input ([`Input::Device`]); the others keep their row of the logits for
//! the host sampler. A row with a constraint (a grammar's mask, logit biases) adds its bias row
//! to the logits it is drawn from.

use mlx_rs::Array;

use crate::Result;
use crate::batch_draw::{self, RowDraw};
use crate::sequence::{Input, Logits, Pending, Sequence};

/// Draws the next token of `seqs[r]` from row `r` of `logits` (`[rows, vocab]` f32, lazy) on
/// the device where it fits, naming the draw `draw`; returns the arrays to evaluate (the drawn
/// tokens, their log-probabilities when a drawn row asks, and the logits when a row is left to
/// the host). `gpu`: whether the model runs on a GPU (where sorting draws fit).
pub(super) fn draw_next(
    seqs: &mut [&mut Sequence],
    logits: &Array,
    gpu: bool,
    draw: u64,
) -> Result<Vec<Array>> {
    let on_device: Vec<bool> = seqs
        .iter()
        .map(|s| RowDraw::fits(s.sampler.params(), gpu))
        .collect();
    let mut queued: Vec<Array> = Vec::new();
    if on_device.iter().any(|&d| d) {
        let rows: Vec<RowDraw> = seqs
            .iter_mut()
            .zip(&on_device)
            .map(|(s, &d)| match (d, s.sampler.params().temperature > 0.0) {
                (true, true) => {
                    let u = s.sampler.uniform();
                    RowDraw::new(s.sampler.params(), u)
                }
                (true, false) => RowDraw::new(s.sampler.params(), 0.0),
                // Drawn greedily and unused: its logits go to the host sampler.
                (false, _) => RowDraw::new(&Default::default(), 0.0),
            })
            .collect();
        let logprobs = seqs
            .iter()
            .zip(&on_device)
            .any(|(s, &d)| d && s.sampler.logprobs());
        let bias = bias_rows(seqs, &on_device, logits)?;
        let drawn = batch_draw::draw(logits, bias.as_ref(), &rows, logprobs)?;
        queued.push(drawn.tokens.clone());
        queued.extend(drawn.logprobs.clone());
        for (row, s) in seqs.iter_mut().enumerate().filter(|(r, _)| on_device[*r]) {
            s.input = Some(Input::Device(Pending {
                drawn: drawn.clone(),
                row,
                draw,
            }));
        }
    }
    if on_device.iter().any(|&d| !d) {
        queued.push(logits.clone());
        for (row, s) in seqs.iter_mut().enumerate().filter(|(r, _)| !on_device[*r]) {
            s.next_logits = Some(Logits::row(logits, row));
        }
    }
    Ok(queued)
}

/// The `[rows, vocab]` biases of the rows drawn on the device, when one has a constraint: its
/// mask (0 or `-inf`) and logit biases; 0 for every other row.
fn bias_rows(seqs: &[&mut Sequence], on_device: &[bool], logits: &Array) -> Result<Option<Array>> {
    let constrained = seqs
        .iter()
        .zip(on_device)
        .any(|(s, &d)| d && s.constraint.is_some());
    if !constrained {
        return Ok(None);
    }
    let width = logits.shape().last().copied().unwrap_or(0).max(0) as usize;
    let mut values: Vec<f32> = Vec::with_capacity(seqs.len() * width);
    for (s, &d) in seqs.iter().zip(on_device) {
        match (&s.constraint, d) {
            (Some(c), true) => c.bias_row(width, &mut values),
            _ => values.resize(values.len() + width, 0.0),
        }
    }
    Ok(Some(Array::from_slice(
        &values,
        &[seqs.len() as i32, width as i32],
    )))
}
