//! A decode step's attention, and how it reads each row's padded own keys: a padding mask
//! (every device's fused or plain attention), or, on CUDA, each row's length for
//! `attention_cuda`'s kernel, which needs no mask (where the keys were gathered: on CUDA they
//! are mostly read in place by block table). Decided once per step, at the first layer,
//! each built when first asked for.

use mlx_rs::{Array, Dtype};

use super::super::attention::{batch_attention, fused_batch_attention, padding_mask};
use super::super::{attention_cuda, skinny_cuda, span_attention};
use super::Model;
use crate::Result;
use crate::device::{Backend, Placement};
use crate::kv::{BatchKeys, OwnKeys};

impl Model {
    /// Attention of a decode step over [`BatchKeys`], reading padded own keys as `read` says.
    /// Returns `[b, 1, heads * head_dim]`.
    pub(super) fn attend_batch(
        &self,
        q: &Array,
        keys: &BatchKeys,
        read: Option<&mut StepRead>,
    ) -> Result<Array> {
        let c = &self.config;
        let (heads, kv_heads, hd) = (c.heads as i32, c.kv_heads as i32, c.head_dim as i32);
        let scale = 1.0 / (hd as f32).sqrt();
        if let OwnKeys::Tables(t) = &keys.own {
            return attention_cuda::attend_tables(q, t, kv_heads);
        }
        if !self.placement.gpu {
            let group = heads / kv_heads;
            if let Some(out) = span_attention::attend_batch(q, keys, scale, group as usize)? {
                return Ok(out);
            }
        }
        let Some(read) = read else {
            return self.attend_masked(q, keys, scale, None);
        };
        if let Some(lengths) = read.lengths()
            && let Some(out) = attention_cuda::attend_batch(q, keys, lengths, kv_heads)?
        {
            return Ok(out);
        }
        self.attend_masked(q, keys, scale, read.mask()?)
    }

    /// Whether decode steps read K/V by block table ([`attention_cuda::attend_tables`]).
    pub(super) fn reads_tables(&self) -> bool {
        let c = &self.config;
        self.placement.backend == Backend::Cuda
            && attention_cuda::reads_tables(
                c.heads as i32,
                c.kv_heads as i32,
                c.head_dim as i32,
                self.placement.dtype,
            )
    }

    /// Where decode steps by table split rows' keys into parts: from this many keys (`None`
    /// where steps do not read by table). The warm-up runs such a step.
    pub fn split_decode_from(&self) -> Option<usize> {
        self.reads_tables()
            .then_some(attention_cuda::SPLIT_FROM as usize)
    }

    /// The batch sizes a warm-up steps so that serving up to `max` rows meets no row count
    /// whose kernels it has not built: on a GPU one per kind of matmul a step's row count
    /// chooses (one row: MLX's matrix-vector kernel; 2–8 and 9–16 rows: the few-row kernel's
    /// tiles on CUDA; more: the BLAS), each with one row fewer beside it (see the warm-up);
    /// elsewhere (kernels not built per shape) `max` alone.
    pub fn warm_up_batches(&self, max: usize) -> Vec<usize> {
        batch_sizes(self.placement.gpu, max)
    }

    /// [`Model::attend_batch`] through MLX's ops (the CPU's plain ones, a GPU's fused kernel).
    fn attend_masked(
        &self,
        q: &Array,
        keys: &BatchKeys,
        scale: f32,
        mask: Option<&Array>,
    ) -> Result<Array> {
        let c = &self.config;
        let (heads, kv_heads) = (c.heads as i32, c.kv_heads as i32);
        if self.placement.gpu {
            fused_batch_attention(q, keys, scale, mask, kv_heads)
        } else {
            batch_attention(q, keys, scale, mask, heads / kv_heads)
        }
    }
}

pub(super) struct StepRead {
    /// Each row's own positions before this step's (after the shared ones).
    own: Vec<i32>,
    /// The padded own keys' length.
    padded: i32,
    shared: i32,
    dtype: Dtype,
    /// Some row is shorter than the padded keys (so a mask is needed).
    ragged: bool,
    /// The CUDA kernel reads the keys: the rows' lengths differ, or they share a prefix.
    by_lengths: bool,
    mask: Option<Option<Array>>,
    lengths: Option<Array>,
}

impl StepRead {
    /// For rows whose positions before this step are `lens`, the first `shared` of them shared,
    /// own keys padded to `padded`.
    pub(super) fn new(placement: Placement, lens: &[i32], shared: usize, padded: i32) -> Self {
        let own: Vec<i32> = lens.iter().map(|&l| l - shared as i32).collect();
        let ragged = own.iter().any(|&l| l + 1 < padded);
        let by_lengths = placement.backend == Backend::Cuda
            && attention_cuda::wanted()
            && (ragged || shared > 0);
        StepRead {
            own,
            padded,
            shared: shared as i32,
            dtype: placement.dtype,
            ragged,
            by_lengths,
            mask: None,
            lengths: None,
        }
    }

    /// The padding mask (`[b, 1, 1, padded]`), `None` where every row fills the padded keys.
    pub(super) fn mask(&mut self) -> Result<Option<&Array>> {
        if self.mask.is_none() {
            self.mask = Some(if self.ragged {
                Some(padding_mask(&self.own, self.padded, self.dtype)?)
            } else {
                None
            });
        }
        Ok(self.mask.as_ref().and_then(Option::as_ref))
    }

    /// The CUDA kernel's lengths input (each row's own keys with this step's, then the shared
    /// count), where the kernel reads this step's keys.
    pub(super) fn lengths(&mut self) -> Option<&Array> {
        if !self.by_lengths {
            return None;
        }
        if self.lengths.is_none() {
            let own: Vec<i32> = self.own.iter().map(|&l| l + 1).collect();
            self.lengths = Some(attention_cuda::lengths(&own, self.shared));
        }
        self.lengths.as_ref()
    }
}

/// [`Model::warm_up_batches`]: on a GPU each row count that ends a kind of matmul below `max`
/// (1; 8 and [`skinny_cuda::MAX_ROWS`], the few-row kernel's two tiles), then `max`.
fn batch_sizes(gpu: bool, max: usize) -> Vec<usize> {
    if !gpu {
        return vec![max];
    }
    let mut sizes: Vec<usize> = [1, 8, skinny_cuda::MAX_ROWS as usize]
        .into_iter()
        .filter(|&n| n < max)
        .collect();
    sizes.push(max);
    sizes
}

#[cfg(test)]
mod tests {
    use super::batch_sizes;

    #[test]
    fn a_gpu_warms_every_kind_of_step_matmul_and_a_cpu_its_largest_batch() {
        assert_eq!(batch_sizes(false, 32), [32]);
        assert_eq!(batch_sizes(true, 32), [1, 8, 16, 32]);
        assert_eq!(batch_sizes(true, 12), [1, 8, 12]);
        assert_eq!(batch_sizes(true, 8), [1, 8]);
        assert_eq!(batch_sizes(true, 1), [1]);
    }
}
