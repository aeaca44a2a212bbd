//! Writing new K/V rows into the pool. A [`WritePlan`] (which slab rows each new position goes
//! to) is made once per forward pass and used by every layer: the positions are the same in
//! each, and on a GPU each index array built is one more upload per layer.

use mlx_rs::{Array, ops};

use super::{BlockId, BlockPool};
use crate::Result;

/// Where a forward pass's new positions go: per slab touched, the flat rows and (when the
/// positions span slabs) which of the new positions are this slab's.
pub struct WritePlan {
    parts: Vec<(usize, Array, Option<Array>)>,
}

impl BlockPool {
    /// Plans writing positions `at[i]` = (block, position in the block) for token `i`.
    pub fn plan_write(&self, at: &[(BlockId, usize)]) -> WritePlan {
        let (kvh, bt) = (self.shape.kv_heads, self.shape.block_tokens);
        let mut touched: Vec<usize> = at.iter().map(|&(b, _)| self.slab_of(b)).collect();
        touched.sort_unstable();
        touched.dedup();
        let single = touched.len() == 1;
        let parts = touched
            .into_iter()
            .map(|s| {
                let (base, len) = (s as u32 * self.slab_blocks, self.slab_len(s) as usize);
                let mine: Vec<usize> = (0..at.len())
                    .filter(|&i| self.slab_of(at[i].0) == s)
                    .collect();
                let mut rows = Vec::with_capacity(2 * kvh * mine.len());
                for half in 0..2 {
                    for h in 0..kvh {
                        rows.extend(mine.iter().map(|&i| {
                            let (b, p) = at[i];
                            let chunk = (half * kvh + h) * len + (b - base) as usize;
                            (chunk * bt + p) as i32
                        }));
                    }
                }
                let pick = (!single).then(|| {
                    let idx: Vec<i32> = mine.iter().map(|&i| i as i32).collect();
                    Array::from_slice(&idx, &[idx.len() as i32])
                });
                (s, Array::from_slice(&rows, &[rows.len() as i32]), pick)
            })
            .collect();
        WritePlan { parts }
    }

    /// Writes `k`, `v` (`[kv_heads, n, head_dim]`) of `layer` where `plan` says: one update
    /// per slab touched.
    pub fn write_planned(
        &mut self,
        layer: usize,
        plan: &WritePlan,
        k: &Array,
        v: &Array,
    ) -> Result<()> {
        // [2 * kv_heads, n, head_dim]: K heads then V heads.
        let values = ops::concatenate(&[k, v], 0)?;
        self.write_packed(layer, plan, &values)
    }

    /// [`BlockPool::write_planned`] of K and V already side by side: `values` is
    /// `[2 * kv_heads, n, head_dim]`, the K heads then the V heads.
    pub fn write_packed(&mut self, layer: usize, plan: &WritePlan, values: &Array) -> Result<()> {
        let hd = self.shape.head_dim as i32;
        for (s, rows, pick) in &plan.parts {
            let part = match pick {
                Some(idx) => values.take_axis(idx, 1)?,
                None => values.clone(),
            };
            let part = part.reshape(&[-1, hd])?;
            let Some(slab) = self.slabs[*s].as_mut() else {
                return Err(crate::EngineError::Internal(format!(
                    "write into slab {s}, which holds no block"
                )));
            };
            slab.write(layer, rows, &part)?;
        }
        Ok(())
    }

    /// Writes `k`, `v` (`[kv_heads, n, head_dim]`) of `layer` at `at[i]` = (block, position in
    /// the block) for token `i` (a plan used once).
    pub fn write(
        &mut self,
        layer: usize,
        at: &[(BlockId, usize)],
        k: &Array,
        v: &Array,
    ) -> Result<()> {
        let plan = self.plan_write(at);
        self.write_planned(layer, &plan, k, v)
    }
}
