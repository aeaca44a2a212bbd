//! The pre-norm transformer decoder every architecture we serve is a variant of: RMS norm, GQA
//! attention with RoPE, a gated MLP or a mixture of experts. What varies, read from the
//! [`ModelConfig`] at load:
//!
//! - per-layer attention kinds ([`Kind`]): full or a sliding window, each with its own RoPE
//!   (Gemma 3's local base; YaRN or linear scaling) and score scale;
//! - biases on the projections (Qwen2, gpt-oss: picked up from the weights), per-head q/k RMS
//!   norms (Qwen3, Gemma 3), attention sinks (gpt-oss);
//! - Gemma 3's "sandwich" norms after the attention and the MLP, its norm weights stored as
//!   offsets from 1, its embedding scaled by √hidden, its GELU MLP;
//! - mixture-of-experts blocks ([`super::moe`]) on the layers the config names (Qwen3-MoE,
//!   gpt-oss).

use std::rc::Rc;

use mlx_rs::{Array, Dtype, fast, ops};

use super::Architecture;
use super::activation::Activation;
use super::config::{Arch, ModelConfig, RopeScaling};
use super::weights::Weights;
use crate::Result;
use crate::backend::{Backend, Heads, Linear, RopeSpec};
use crate::kv::{BatchKv, ChunksKv};

mod heads;
mod layer;
mod prefill;
mod step;

use layer::{Ffn, Layer, Style};

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
    /// Per-head sink logits (gpt-oss).
    Sinks,
    /// Gemma's norm of the attention's output, before the residual add.
    PostAttnNorm,
    FfnNorm,
    /// Gemma's norm of the MLP's output, before the residual add.
    PostFfnNorm,
    Gate,
    Up,
    Down,
    /// A mixture of experts' router, and its experts' stacked projections.
    Router,
    ExpertGate,
    ExpertUp,
    ExpertDown,
}

/// One kind of attention layer: its heads (window, sinks, score scale) and rotation.
pub(super) struct Kind {
    pub heads: Heads,
    pub rope: RopeSpec,
}

/// A decoder model.
pub struct Decoder {
    config: ModelConfig,
    backend: Rc<dyn Backend>,
    embed: Array,
    /// Multiplies the embeddings (Gemma: √hidden, rounded to bfloat16 as the reference does).
    embed_scale: Option<f32>,
    layers: Vec<Layer>,
    norm: Array,
    lm_head: Linear,
    kinds: Vec<Kind>,
}

/// The attention kinds of `config`'s layers, and each layer's.
fn kinds(config: &ModelConfig) -> (Vec<Kind>, Vec<usize>) {
    let hd = config.head_dim as i32;
    let mut kinds: Vec<Kind> = Vec::new();
    let mut of_layer = Vec::with_capacity(config.layers);
    for i in 0..config.layers {
        let window = config.window(i);
        let (rope, score) = match (&config.gemma3, window) {
            // Gemma 3's local layers turn at their own base, unscaled.
            (Some(g), Some(_)) => (RopeSpec::plain(hd, g.local_rope_theta, false), 1.0),
            _ => super::rope::rotation(hd, config.rope_theta, config.rope_scaling),
        };
        let rope = RopeSpec {
            traditional: config.rope_traditional,
            ..rope
        };
        let base = match &config.gemma3 {
            Some(g) => 1.0 / g.query_pre_attn_scalar.sqrt(),
            None => 1.0 / (hd as f32).sqrt(),
        };
        let heads = Heads {
            heads: config.heads as i32,
            kv_heads: config.kv_heads as i32,
            head_dim: hd,
            scale: base * score,
            window: window.map(|w| w as i32),
            sinks: config.arch == Arch::GptOss,
        };
        let at = match kinds
            .iter()
            .position(|k| k.heads == heads && k.rope == rope)
        {
            Some(at) => at,
            None => {
                kinds.push(Kind { heads, rope });
                kinds.len() - 1
            }
        };
        of_layer.push(at);
    }
    (kinds, of_layer)
}

/// `x` rounded to bfloat16 (round to nearest even).
fn bf16(x: f32) -> f32 {
    let bits = x.to_bits();
    f32::from_bits(bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) & 0xFFFF_0000)
}

impl Decoder {
    /// Builds the model from `weights` named by `names`, taking each layer's tensors out of
    /// `weights` as it goes: what a load makes of them (dequantized, cast or joined weights)
    /// then replaces them one layer at a time instead of beside the whole file.
    pub fn build(
        config: &ModelConfig,
        weights: &mut Weights,
        names: &dyn TensorNames,
        backend: Rc<dyn Backend>,
    ) -> Result<Decoder> {
        let dt = backend.placement().dtype;
        let (kinds, of_layer) = kinds(config);
        let mut layers = Vec::with_capacity(config.layers);
        for (i, &kind) in of_layer.iter().enumerate() {
            layers.push(Layer::build(weights, names, i, config, kind, &*backend)?);
        }
        let embed = weights.dense(&names.embed(), dt)?;
        embed.eval()?;
        let lm_head = if weights.has(&format!("{}.weight", names.output())) {
            weights.linear(&names.output(), &*backend)?
        } else {
            // Tied output head: reuse the (dequantized) embedding table.
            Linear::dense(embed.clone(), None, &*backend)
        };
        let norm = Style::of(config).required_norm(weights, &names.output_norm(), dt)?;
        let embed_scale =
            (config.arch == Arch::Gemma3).then(|| bf16((config.hidden as f32).sqrt()));
        if config.rope_scaling != RopeScaling::None {
            tracing::info!(scaling = ?config.rope_scaling, "RoPE scaling");
        }
        Ok(Decoder {
            config: config.clone(),
            backend,
            embed,
            embed_scale,
            layers,
            norm,
            lm_head,
            kinds,
        })
    }

    /// The embeddings of `ids` (u32), reshaped to `shape` and scaled where the family does.
    fn embed(&self, ids: &Array, shape: &[i32]) -> Result<Array> {
        let x = self.embed.take_axis(ids, 0)?.reshape(shape)?;
        match self.embed_scale {
            Some(s) => Ok(ops::multiply(&x, Array::from_f32(s).as_dtype(x.dtype())?)?),
            None => Ok(x),
        }
    }

    /// The residual stream `x` after `layer`'s attention output `out` and its feed-forward
    /// block. Where the backend's few-row kernel takes them, the SwiGLU and the residual adds
    /// run inside the projections.
    fn rest(&self, layer: &Layer, x: &Array, out: &Array) -> Result<Array> {
        let eps = self.config.rms_eps;
        let x = match &layer.post_attn_norm {
            Some(w) => residual(x, &fast::rms_norm(&layer.o.forward(out)?, Some(w), eps)?)?,
            None => layer.o.forward_add(out, x)?,
        };
        let h = fast::rms_norm(&x, Some(&layer.ffn_norm), eps)?;
        let (gate_up, down, activation) = match &layer.ffn {
            Ffn::Dense {
                gate_up,
                down,
                activation,
            } => (gate_up, down, *activation),
            Ffn::Moe(m) => {
                let y = m.forward(&h, &*self.backend)?;
                return self.add_ffn(layer, &x, &y);
            }
        };
        let fused = match activation {
            Activation::SwiGlu => gate_up.swiglu(&h)?,
            _ => None,
        };
        let act = match fused {
            Some(act) => act,
            None => {
                let [g, u] = <[Array; 2]>::try_from(gate_up.forward(&h)?).map_err(|_| {
                    crate::EngineError::Internal("gate and up projections are not two".into())
                })?;
                activation.apply(&g, &u, &*self.backend)?
            }
        };
        match &layer.post_ffn_norm {
            Some(_) => self.add_ffn(layer, &x, &down.forward(&act)?),
            None => down.forward_add(&act, &x),
        }
    }

    /// `x` plus the feed-forward block's output `y` (normed first where the family does).
    fn add_ffn(&self, layer: &Layer, x: &Array, y: &Array) -> Result<Array> {
        match &layer.post_ffn_norm {
            Some(w) => residual(x, &fast::rms_norm(y, Some(w), self.config.rms_eps)?),
            None => Ok(ops::add(x, y)?),
        }
    }

    /// The final norm and the output head over `x` (`[..., hidden]`): f32 logits.
    fn logits(&self, x: &Array) -> Result<Array> {
        let x = fast::rms_norm(x, Some(&self.norm), self.config.rms_eps)?;
        Ok(self.lm_head.forward(&x)?.as_dtype(Dtype::Float32)?)
    }
}

/// `x + y`; in float16, added in float32 and clamped to float16's range (a Gemma residual
/// stream outgrows it, as the reference guards against).
fn residual(x: &Array, y: &Array) -> Result<Array> {
    if x.dtype() != Dtype::Float16 {
        return Ok(ops::add(x, y)?);
    }
    let sum = ops::add(&x.as_dtype(Dtype::Float32)?, &y.as_dtype(Dtype::Float32)?)?;
    Ok(ops::clip(&sum, (-65504.0f32, 65504.0f32))?.as_dtype(Dtype::Float16)?)
}

impl Architecture for Decoder {
    fn forward_packed(&self, tokens: &[&[u32]], kv: &mut dyn ChunksKv) -> Result<Array> {
        self.prefill(tokens, kv)
    }

    fn forward_step(&self, ids: &Array, kv: &mut dyn BatchKv) -> Result<Array> {
        self.step(ids, kv)
    }

    fn heads(&self) -> Heads {
        // A warm-up builds the full-attention layers' shapes where there are any.
        let full = self.kinds.iter().find(|k| k.heads.window.is_none());
        full.or(self.kinds.first()).map_or(
            Heads {
                heads: 0,
                kv_heads: 0,
                head_dim: 0,
                scale: 1.0,
                window: None,
                sinks: false,
            },
            |k| k.heads,
        )
    }

    fn weight_bytes_per_token(&self) -> usize {
        let experts = self.config.moe.as_ref().map_or(0, |m| m.experts as i32);
        let layers: usize = self.layers.iter().map(|l| l.nbytes(experts)).sum();
        layers + self.norm.nbytes() + self.lm_head.nbytes()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_embedding_scale_is_rounded_to_bfloat16() {
        // The reference's figures: √1152 → 34.0, √2560 → 50.5, √3840 → 62.0, √5376 → 73.5.
        for (h, want) in [
            (1152f32, 34.0),
            (2560.0, 50.5),
            (3840.0, 62.0),
            (5376.0, 73.5),
        ] {
            assert_eq!(super::bf16(h.sqrt()), want);
        }
    }
}
