//! A decoder layer's tensors, as each family stores them: taken out of the file's weights at
//! load, with what differs between families ([`Style`]).

use mlx_rs::{Array, Dtype, ops};

use super::{LayerPart, TensorNames};
use crate::Result;
use crate::backend::{Backend, Joined, Linear};
use crate::model::activation::Activation;
use crate::model::config::{Arch, ModelConfig};
use crate::model::moe::Moe;
use crate::model::weights::Weights;

/// A layer's feed-forward block.
pub(super) enum Ffn {
    /// Gate and up joined, the activation, then down.
    Dense {
        gate_up: Joined,
        down: Linear,
        activation: Activation,
    },
    Moe(Moe),
}

pub(super) struct Layer {
    /// Index into [`Decoder::kinds`].
    pub kind: usize,
    pub attn_norm: Array,
    /// q, k and v.
    pub qkv: Joined,
    pub o: Linear,
    pub q_norm: Option<Array>,
    pub k_norm: Option<Array>,
    pub sinks: Option<Array>,
    pub post_attn_norm: Option<Array>,
    pub ffn_norm: Array,
    pub ffn: Ffn,
    pub post_ffn_norm: Option<Array>,
}

/// What differs between the families in how a layer's tensors are read.
pub(super) struct Style {
    /// Norm weights are stored as offsets from 1 (Gemma).
    norm_offset: bool,
    /// The dense MLP's activation.
    activation: Activation,
}

impl Style {
    pub(super) fn of(config: &ModelConfig) -> Style {
        match config.arch {
            Arch::Gemma3 => Style {
                norm_offset: true,
                activation: Activation::GeGlu,
            },
            _ => Style {
                norm_offset: false,
                activation: Activation::SwiGlu,
            },
        }
    }

    /// A norm's weight, cast to `dtype` (None where the file has none).
    fn norm(&self, weights: &Weights, name: &str, dtype: Dtype) -> Result<Option<Array>> {
        let Some(w) = weights.vector(name, dtype)? else {
            return Ok(None);
        };
        if self.norm_offset {
            return Ok(Some(ops::add(&w, Array::from_f32(1.0).as_dtype(dtype)?)?));
        }
        Ok(Some(w))
    }

    /// A norm's weight the layer cannot do without.
    pub(super) fn required_norm(
        &self,
        weights: &Weights,
        name: &str,
        dtype: Dtype,
    ) -> Result<Array> {
        self.norm(weights, name, dtype)?
            .ok_or_else(|| crate::EngineError::Request(format!("tensor `{name}` is missing")))
    }
}

impl Layer {
    /// Layer `i`'s tensors, taken out of `weights`.
    pub(super) fn build(
        weights: &mut Weights,
        names: &dyn TensorNames,
        i: usize,
        config: &ModelConfig,
        kind: usize,
        backend: &dyn Backend,
    ) -> Result<Layer> {
        let (n, dt) = (|p| names.layer(i, p), backend.placement().dtype);
        let style = Style::of(config);
        let mut linears = |parts: &[LayerPart]| -> Result<Joined> {
            let parts = parts
                .iter()
                .map(|&p| weights.linear(&n(p), backend))
                .collect::<Result<Vec<_>>>()?;
            Joined::new(parts, backend)
        };
        let qkv = linears(&[LayerPart::Q, LayerPart::K, LayerPart::V])?;
        let ffn = match &config.moe {
            Some(m) if m.is_moe(i) => Ffn::Moe(Moe {
                router: weights.linear(&n(LayerPart::Router), backend)?,
                gate: weights.experts(&n(LayerPart::ExpertGate), backend)?,
                up: weights.experts(&n(LayerPart::ExpertUp), backend)?,
                down: weights.experts(&n(LayerPart::ExpertDown), backend)?,
                top_k: m.top_k as i32,
                routing: m.routing,
                activation: m.activation,
            }),
            _ => Ffn::Dense {
                gate_up: linears(&[LayerPart::Gate, LayerPart::Up])?,
                down: weights.linear(&n(LayerPart::Down), backend)?,
                activation: style.activation,
            },
        };
        // Gemma's "sandwich": norms of the attention's and the MLP's outputs.
        let sandwich = |weights: &Weights, part| match config.arch {
            Arch::Gemma3 => style.required_norm(weights, &n(part), dt).map(Some),
            _ => Ok(None),
        };
        let sinks = match config.arch {
            Arch::GptOss => Some(
                weights
                    .vector(&n(LayerPart::Sinks), Dtype::Float32)?
                    .ok_or_else(|| weights.missing(&n(LayerPart::Sinks)))?,
            ),
            _ => None,
        };
        Ok(Layer {
            kind,
            attn_norm: style.required_norm(weights, &n(LayerPart::AttnNorm), dt)?,
            qkv,
            o: weights.linear(&n(LayerPart::O), backend)?,
            q_norm: style.norm(weights, &n(LayerPart::QNorm), dt)?,
            k_norm: style.norm(weights, &n(LayerPart::KNorm), dt)?,
            sinks,
            post_attn_norm: sandwich(weights, LayerPart::PostAttnNorm)?,
            ffn_norm: style.required_norm(weights, &n(LayerPart::FfnNorm), dt)?,
            ffn,
            post_ffn_norm: sandwich(weights, LayerPart::PostFfnNorm)?,
        })
    }

    /// Bytes a decode step reads.
    pub(super) fn nbytes(&self, experts: i32) -> usize {
        let ffn = match &self.ffn {
            Ffn::Dense { gate_up, down, .. } => gate_up.nbytes() + down.nbytes(),
            Ffn::Moe(m) => m.nbytes_per_token(experts),
        };
        let optional = [
            &self.q_norm,
            &self.k_norm,
            &self.sinks,
            &self.post_attn_norm,
            &self.post_ffn_norm,
        ];
        self.qkv.nbytes()
            + ffn
            + self.o.nbytes()
            + self.attn_norm.nbytes()
            + self.ffn_norm.nbytes()
            + optional
                .iter()
                .map(|a| a.as_ref().map_or(0, Array::nbytes))
                .sum::<usize>()
    }
}
