//! Reading a decode step's K/V where they lie, by block table, for an attention kernel that
//! takes the slabs and the tables ([`TableKeys`]): nothing is gathered, padded or masked. On a
//! GPU a gather costs a copy of every row's context per layer and step (~2 ms of an 8B-like
//! model's ~10 ms step at 8 rows, measured on an H200).
//!
//! The kernel takes a fixed number of slab inputs ([`MOST_TABLE_SLABS`]); a step whose blocks
//! lie in more slabs is gathered instead (GPU slabs are 1/32 of the ceiling, so a step rarely
//! reads more than a few).

use mlx_rs::Array;

use super::{BlockId, BlockPool};
use crate::Result;
use crate::kv::{MOST_TABLE_SLABS, TABLE_SLAB_SHIFT, TableKeys};

/// A step's tables, planned once and read by every layer.
pub struct TableRead {
    /// The slabs read, in the order the table entries name them.
    slabs: Vec<usize>,
    slab_blocks: Array,
    tables: Array,
    lens: Array,
    longest: i32,
}

impl BlockPool {
    /// Plans reading each row's blocks `tables[i]`, whose first `lens[i]` positions it reads.
    /// `None` where they lie in more than [`MOST_TABLE_SLABS`] slabs, a row has no block or
    /// fewer than its length needs, or a slab holds more blocks than an entry can name.
    pub fn plan_tables(&self, tables: &[&[BlockId]], lens: &[usize]) -> Option<TableRead> {
        let bt = self.shape.block_tokens;
        if tables.len() != lens.len()
            || tables
                .iter()
                .zip(lens)
                .any(|(t, &n)| n == 0 || t.len() * bt < n)
            || self.slab_blocks >= 1 << TABLE_SLAB_SHIFT
        {
            return None;
        }
        let mut slabs: Vec<usize> = tables
            .iter()
            .flat_map(|t| t.iter())
            .map(|&b| self.slab_of(b))
            .collect();
        slabs.sort_unstable();
        slabs.dedup();
        if slabs.len() > MOST_TABLE_SLABS || slabs.iter().any(|&s| self.slabs[s].is_none()) {
            return None;
        }
        let blocks = tables.iter().map(|t| t.len()).max()?;
        let mut entries = Vec::with_capacity(tables.len() * blocks);
        for t in tables {
            let first = *t.first()?;
            for j in 0..blocks {
                let b = t.get(j).copied().unwrap_or(first);
                let s = self.slab_of(b);
                let at = slabs.binary_search(&s).ok()? as i32;
                let local = (b - s as u32 * self.slab_blocks) as i32;
                entries.push((at << TABLE_SLAB_SHIFT) | local);
            }
        }
        let slab_blocks: Vec<i32> = slabs.iter().map(|&s| self.slab_len(s) as i32).collect();
        let lens: Vec<i32> = lens.iter().map(|&n| n as i32).collect();
        Some(TableRead {
            longest: lens.iter().copied().max()?,
            slab_blocks: Array::from_slice(&slab_blocks, &[slab_blocks.len() as i32]),
            tables: Array::from_slice(&entries, &[tables.len() as i32, blocks as i32]),
            lens: Array::from_slice(&lens, &[lens.len() as i32]),
            slabs,
        })
    }

    /// `layer`'s keys as `plan` reads them.
    pub fn table_keys(&self, layer: usize, plan: &TableRead) -> Result<TableKeys> {
        let mut slabs = Vec::with_capacity(plan.slabs.len());
        for &s in &plan.slabs {
            let Some(slab) = self.slabs[s].as_ref() else {
                return Err(crate::EngineError::Internal(
                    "a table read of a slab that holds no block".into(),
                ));
            };
            slabs.push(slab.layer(layer).clone());
        }
        Ok(TableKeys {
            slabs,
            slab_blocks: plan.slab_blocks.clone(),
            tables: plan.tables.clone(),
            lens: plan.lens.clone(),
            longest: plan.longest,
            block_tokens: self.shape.block_tokens as i32,
        })
    }
}
