//! A pass's next tokens, drawn where they can be: each row whose sampler the device can follow
//! ([`RowDraw::fits`]) gets its token drawn on the device ([`crate::batch_draw`]), left lazy as
//! the sequence's next input ([`Input::Device`]); the others keep their row of the logits for the host sampler.

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
        let drawn = batch_draw::draw(logits, &rows, logprobs)?;
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
