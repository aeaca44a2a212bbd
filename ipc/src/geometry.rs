//! A model's KV geometry and the one formula for the real size of a block.
//!
//! A block holds the K and V rows of `block_tokens` consecutive tokens for every layer. The cache
//! manager computes its size from the geometry with [`Geometry::block_bytes`] and never books a
//! byte figure sent by anyone (see `shared/seed/`: a ledger that booked 32 B per ~128 KiB block).

use serde::{Deserialize, Serialize};

/// Element type of the KV pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Dtype {
    F16,
    BF16,
    F32,
}

impl Dtype {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::F16 | Dtype::BF16 => 2,
            Dtype::F32 => 4,
        }
    }

    /// Lower-case name (`f16`, `bf16`, `f32`).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F16 => "f16",
            Dtype::BF16 => "bf16",
            Dtype::F32 => "f32",
        }
    }
}

/// The KV layout a daemon registers with the cache manager.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Geometry {
    /// Model identity (also mixed into every [`crate::BlockHash`]).
    pub model_id: String,
    /// Transformer layers holding a KV cache.
    pub layers: u32,
    /// Key/value heads per layer.
    pub kv_heads: u32,
    /// Dimension of one head.
    pub head_dim: u32,
    /// Element type of the pool tensors.
    pub dtype: Dtype,
    /// Tokens per block.
    pub block_tokens: u32,
    /// Blocks in the daemon's pool.
    pub pool_blocks: u32,
}

/// Why a geometry cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GeometryError {
    #[error("geometry field `{0}` must be greater than zero")]
    Zero(&'static str),
    #[error("geometry gives a block size that overflows 64 bits")]
    Overflow,
    #[error("model id must be 1 to 512 bytes")]
    ModelId,
}

impl Geometry {
    /// Real bytes of one block: 2 (K and V) × layers × kv_heads × head_dim × dtype bytes ×
    /// block_tokens. Errors on a zero field or overflow.
    pub fn block_bytes(&self) -> Result<u64, GeometryError> {
        self.validate()?;
        [self.layers, self.kv_heads, self.head_dim, self.block_tokens]
            .into_iter()
            .try_fold(2 * self.dtype.bytes(), |acc, f| {
                acc.checked_mul(u64::from(f))
            })
            .ok_or(GeometryError::Overflow)
    }

    /// Real bytes of the whole pool (`pool_blocks × block_bytes`).
    pub fn pool_bytes(&self) -> Result<u64, GeometryError> {
        self.block_bytes()?
            .checked_mul(u64::from(self.pool_blocks))
            .ok_or(GeometryError::Overflow)
    }

    fn validate(&self) -> Result<(), GeometryError> {
        for (name, v) in [
            ("layers", self.layers),
            ("kv_heads", self.kv_heads),
            ("head_dim", self.head_dim),
            ("block_tokens", self.block_tokens),
        ] {
            if v == 0 {
                return Err(GeometryError::Zero(name));
            }
        }
        if self.model_id.is_empty() || self.model_id.len() > 512 {
            return Err(GeometryError::ModelId);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn smollm2() -> Geometry {
        Geometry {
            model_id: "SmolLM2-135M-Instruct".into(),
            layers: 30,
            kv_heads: 3,
            head_dim: 64,
            dtype: Dtype::F16,
            block_tokens: 32,
            pool_blocks: 1000,
        }
    }

    #[test]
    fn smollm2_block_is_737280_bytes() {
        // The figure in DESIGN.md: 23,040 B per token x 32 tokens.
        assert_eq!(smollm2().block_bytes().unwrap(), 737_280);
        assert_eq!(smollm2().pool_bytes().unwrap(), 737_280_000);
    }

    #[test]
    fn zero_fields_and_overflow_are_errors() {
        let mut g = smollm2();
        g.kv_heads = 0;
        assert_eq!(g.block_bytes(), Err(GeometryError::Zero("kv_heads")));
        let mut g = smollm2();
        g.layers = u32::MAX;
        g.head_dim = u32::MAX;
        g.block_tokens = u32::MAX;
        assert_eq!(g.block_bytes(), Err(GeometryError::Overflow));
    }
}
