//! A step's prefill: the chunks the plan names, all in one forward pass
//! ([`Model::forward_packed`]), so arrivals share the pass's weight reads and, on a GPU, its
//! encoding. If the shared pass fails, each chunk runs alone, so only a chunk that fails by
//! itself fails its request.

use super::{End, Ends, Runner, rows};
use crate::Result;
use crate::model::Model;
use crate::paged::{OwnRead, PagedChunks};
use crate::pool::BlockPool;
use crate::scheduler::{BlockTable, Job, SeqKey};
use crate::sequence::Sequence;

impl Runner {
    /// Runs `chunks` (request, tokens), oldest first; each has its room in its table.
    pub(super) fn prefill(
        &mut self,
        model: &Model,
        chunks: &[(SeqKey, usize)],
        running: &mut [Sequence],
        pool: &mut BlockPool,
    ) -> Ends {
        let mut ends = Ends::new();
        if chunks.is_empty() {
            return ends;
        }
        let keys: Vec<SeqKey> = chunks.iter().map(|(k, _)| *k).collect();
        let mut rows = rows(running, &keys);
        let befores: Vec<usize> = rows.iter().map(|(_, s)| s.kv.len).collect();
        let pieces: Vec<Vec<u32>> = rows
            .iter()
            .map(|(i, s)| s.next_piece(chunks[*i].1))
            .collect();
        let together = {
            let seqs: Vec<&mut BlockTable> = rows.iter_mut().map(|(_, s)| &mut s.kv).collect();
            let read = if model.placement.gathers_prefill_keys {
                OwnRead::Cheaper
            } else {
                OwnRead::Spans
            };
            let mut kv = PagedChunks::new(seqs, pool).reading(read);
            let refs: Vec<&[u32]> = pieces.iter().map(Vec::as_slice).collect();
            model.forward_packed(&refs, &mut kv).and_then(|logits| {
                logits.eval()?;
                Ok(logits)
            })
        };
        match together {
            Ok(logits) => {
                self.clock.prefill_pass(rows.len());
                for (r, (_, s)) in rows.iter_mut().enumerate() {
                    self.clock.prefilled(s.kv.len.saturating_sub(befores[r]));
                    s.prefilled(&logits, r);
                }
                return ends;
            }
            Err(e) => {
                tracing::warn!(error = %e, chunks = rows.len(), "a packed prefill pass failed; running its chunks one by one");
            }
        }
        for (r, (_, s)) in rows.into_iter().enumerate() {
            s.kv.len = befores[r];
            match alone(model, s, &pieces[r], pool) {
                Ok(()) => {
                    self.clock.prefilled(pieces[r].len());
                    self.clock.prefill_pass(1);
                }
                Err(e) => {
                    tracing::error!(request = s.id, error = %e, "prefill failed");
                    ends.push((s.key(), End::Failed(e)));
                }
            }
        }
        ends
    }
}

/// `piece` of `s`'s tokens in a pass of its own.
fn alone(model: &Model, s: &mut Sequence, piece: &[u32], pool: &mut BlockPool) -> Result<()> {
    let logits = model.forward(piece, &mut s.kv.store(pool))?;
    logits.eval()?;
    s.prefilled(&logits, 0);
    Ok(())
}
