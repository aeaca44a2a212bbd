//! The Llama-family decoder: RMS norm, GQA attention with RoPE, SwiGLU MLP.
//! Qwen2 adds biases to q/k/v (picked up from the weights); Qwen3 adds per-head q/k RMS norms.

use std::rc::Rc;

use mlx_rs::{Array, Dtype, fast};

use super::Architecture;
use super::config::ModelConfig;
use super::weights::Weights;
use crate::Result;
use crate::backend::{Backend, Heads, Joined, Linear, RopeSpec};
use crate::kv::{BatchKv, ChunksKv};

mod heads;
mod prefill;
mod step;

/// Tensor names in a file format.
pub trait TensorNames {
    fn embed(&self) -> String;
    fn output(&self) -> String;
    fn output_norm(&self) -> String;
    fn layer(&self, i: usize, part: LayerPart) -> String;
}

/// The tensors of one decoder layer.
#[derive(Debug, Clone, Copy)]
pub enum LayerPart {
    AttnNorm,
    Q,
    K,
    V,
    O,
    QNorm,
    KNorm,
    FfnNorm,
    Gate,
    Up,
    Down,
}

struct Layer {
    attn_norm: Array,
    /// q, k and v.
    qkv: Joined,
    o: Linear,
    q_norm: Option<Array>,
    k_norm: Option<Array>,
    ffn_norm: Array,
    /// The MLP's gate and up.
    gate_up: Joined,
    down: Linear,
}

impl Layer {
    /// Layer `i`'s tensors, taken out of `weights`.
    fn build(
        weights: &mut Weights,
        names: &dyn TensorNames,
        i: usize,
        backend: &dyn Backend,
    ) -> Result<Layer> {
        let (n, dt) = (|p| names.layer(i, p), backend.placement().dtype);
        let mut linears = |parts: &[LayerPart]| -> Result<Joined> {
            let parts = parts
                .iter()
                .map(|&p| weights.linear(&n(p), backend))
                .collect::<Result<Vec<_>>>()?;
            Joined::new(parts, backend)
        };
        let qkv = linears(&[LayerPart::Q, LayerPart::K, LayerPart::V])?;
        let gate_up = linears(&[LayerPart::Gate, LayerPart::Up])?;
        Ok(Layer {
            attn_norm: norm(weights, n(LayerPart::AttnNorm), dt)?,
            qkv,
            o: weights.linear(&n(LayerPart::O), backend)?,
            q_norm: weights.vector(&n(LayerPart::QNorm), dt)?,
            k_norm: weights.vector(&n(LayerPart::KNorm), dt)?,
            ffn_norm: norm(weights, n(LayerPart::FfnNorm), dt)?,
            gate_up,
            down: weights.linear(&n(LayerPart::Down), backend)?,
        })
    }

    fn nbytes(&self) -> usize {
        self.qkv.nbytes()
            + self.gate_up.nbytes()
            + self.o.nbytes()
            + self.down.nbytes()
            + self.attn_norm.nbytes()
            + self.ffn_norm.nbytes()
            + self.q_norm.as_ref().map_or(0, Array::nbytes)
            + self.k_norm.as_ref().map_or(0, Array::nbytes)
    }
}

/// A norm's weight (required), cast to `dtype`.
fn norm(weights: &Weights, name: String, dtype: Dtype) -> Result<Array> {
    weights
        .vector(&name, dtype)?
        .ok_or_else(|| crate::EngineError::Request(format!("tensor `{name}` is missing")))
}

/// A Llama-family model.
pub struct Llama {
    config: ModelConfig,
    backend: Rc<dyn Backend>,
    embed: Array,
    layers: Vec<Layer>,
    norm: Array,
    lm_head: Linear,
    rope: RopeSpec,
    heads: Heads,
}

impl Llama {
    /// Builds the model from `weights` named by `names`, taking each layer's tensors out of
    /// `weights` as it goes: what a load makes of them (dequantized, cast or joined weights)
    /// then replaces them one layer at a time instead of beside the whole file.
    pub fn build(
        config: &ModelConfig,
        weights: &mut Weights,
        names: &dyn TensorNames,
        backend: Rc<dyn Backend>,
    ) -> Result<Llama> {
        let dt = backend.placement().dtype;
        let mut layers = Vec::with_capacity(config.layers);
        for i in 0..config.layers {
            layers.push(Layer::build(weights, names, i, &*backend)?);
        }
        let embed = weights.dense(&names.embed(), dt)?;
        embed.eval()?;
        let lm_head = if weights.has(&format!("{}.weight", names.output())) {
            weights.linear(&names.output(), &*backend)?
        } else {
            // Tied output head: reuse the (dequantized) embedding table.
            Linear::dense(embed.clone(), None, &*backend)
        };
        let norm = norm(weights, names.output_norm(), dt)?;
        let hd = config.head_dim as i32;
        Ok(Llama {
            rope: RopeSpec {
                dims: hd,
                theta: config.rope_theta,
                traditional: config.rope_traditional,
            },
            heads: Heads {
                heads: config.heads as i32,
                kv_heads: config.kv_heads as i32,
                head_dim: hd,
                scale: 1.0 / (hd as f32).sqrt(),
            },
            config: config.clone(),
            backend,
            embed,
            layers,
            norm,
            lm_head,
        })
    }

    /// The residual stream `x` after `layer`'s feed-forward block (RMS norm, SwiGLU, added to
    /// `x`): where the backend's few-row kernel takes them, the SwiGLU and the add run inside
    /// the gate/up and down projections.
    fn mlp_add(&self, layer: &Layer, x: &Array) -> Result<Array> {
        let h = fast::rms_norm(x, Some(&layer.ffn_norm), self.config.rms_eps)?;
        let act = match layer.gate_up.swiglu(&h)? {
            Some(act) => act,
            None => {
                let [g, u] = <[Array; 2]>::try_from(layer.gate_up.forward(&h)?).map_err(|_| {
                    crate::EngineError::Internal("gate and up projections are not two".into())
                })?;
                self.backend.silu_mul(&g, &u)?
            }
        };
        layer.down.forward_add(&act, x)
    }

    /// The final norm and the output head over `x` (`[..., hidden]`): f32 logits.
    fn logits(&self, x: &Array) -> Result<Array> {
        let x = fast::rms_norm(x, Some(&self.norm), self.config.rms_eps)?;
        Ok(self.lm_head.forward(&x)?.as_dtype(Dtype::Float32)?)
    }
}

impl Architecture for Llama {
    fn forward_packed(&self, tokens: &[&[u32]], kv: &mut dyn ChunksKv) -> Result<Array> {
        self.prefill(tokens, kv)
    }

    fn forward_step(&self, ids: &Array, kv: &mut dyn BatchKv) -> Result<Array> {
        self.step(ids, kv)
    }

    fn heads(&self) -> Heads {
        self.heads
    }

    fn weight_bytes_per_token(&self) -> usize {
        let layers: usize = self.layers.iter().map(Layer::nbytes).sum();
        layers + self.norm.nbytes() + self.lm_head.nbytes()
    }
}
