//! The gated activations between a feed-forward block's gate/up and down projections.

use mlx_rs::{Array, ops};

use crate::Result;
use crate::backend::Backend;

/// How the gate and up projections combine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    /// `silu(gate) * up` (Llama, Qwen).
    SwiGlu,
    /// `gelu_tanh(gate) * up` (Gemma).
    GeGlu,
    /// gpt-oss's experts: `gate` clamped above at `limit`, `up` to ±`limit`, then
    /// `(up + 1) * gate * sigmoid(alpha * gate)`.
    ClampedSwiGlu { alpha: f32, limit: f32 },
}

impl Activation {
    /// The activation of `gate` and `up` (same shape).
    pub fn apply(self, gate: &Array, up: &Array, backend: &dyn Backend) -> Result<Array> {
        let dt = gate.dtype();
        let k = |v: f32| Array::from_f32(v).as_dtype(dt);
        Ok(match self {
            Activation::SwiGlu => backend.silu_mul(gate, up)?,
            Activation::GeGlu => ops::multiply(&gelu_tanh(gate)?, up)?,
            Activation::ClampedSwiGlu { alpha, limit } => {
                let gate = ops::minimum(gate, &k(limit)?)?;
                let up = ops::clip(up, (-limit, limit))?;
                let glu = ops::multiply(&gate, &ops::sigmoid(&ops::multiply(&gate, &k(alpha)?)?)?)?;
                ops::multiply(&ops::add(&up, &k(1.0)?)?, &glu)?
            }
        })
    }
}

/// GELU, tanh approximation: `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`.
fn gelu_tanh(x: &Array) -> Result<Array> {
    let dt = x.dtype();
    let k = |v: f32| Array::from_f32(v).as_dtype(dt);
    let c = (2.0f32 / std::f32::consts::PI).sqrt();
    let cube = ops::multiply(&ops::multiply(x, x)?, x)?;
    let inner = ops::multiply(&ops::add(x, &ops::multiply(&cube, &k(0.044715)?)?)?, &k(c)?)?;
    let t = ops::add(&ops::tanh(&inner)?, &k(1.0)?)?;
    Ok(ops::multiply(&ops::multiply(x, &t)?, &k(0.5)?)?)
}
