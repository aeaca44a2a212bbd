//! The Llama-family decoder: RMS norm, GQA attention with RoPE, SwiGLU MLP.
//! Qwen2 adds biases to q/k/v (picked up from the weights); Qwen3 adds per-head q/k RMS norms.

use mlx_rs::{Array, Dtype, nn, ops};

use super::attention::{causal_attention, causal_mask, explicit_attention};
use super::config::ModelConfig;
use super::fast_exp;
use super::fused_prefill;
use super::joined::Joined;
use super::rotary::{Angles, Rotary};
use super::skinny_cuda::{Epilogue, RmsNorm};
use super::span_attention;
use super::weights::{Linear, Weights};
use crate::Result;
use crate::device::Placement;

mod heads;
mod prefill;
mod step_read;
use crate::kv::{BatchKv, OwnLayout};
use step_read::StepRead;

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
        placement: Placement,
    ) -> Result<Layer> {
        let (n, dt) = (|p| names.layer(i, p), placement.dtype);
        let mut linears = |parts: &[LayerPart]| -> Result<Joined> {
            let parts = parts
                .iter()
                .map(|&p| weights.linear(&n(p), placement))
                .collect::<Result<Vec<_>>>()?;
            Joined::new(parts, placement)
        };
        let qkv = linears(&[LayerPart::Q, LayerPart::K, LayerPart::V])?;
        let gate_up = linears(&[LayerPart::Gate, LayerPart::Up])?;
        Ok(Layer {
            attn_norm: norm(weights, n(LayerPart::AttnNorm), dt)?,
            qkv,
            o: weights.linear(&n(LayerPart::O), placement)?,
            q_norm: weights.vector(&n(LayerPart::QNorm), dt)?,
            k_norm: weights.vector(&n(LayerPart::KNorm), dt)?,
            ffn_norm: norm(weights, n(LayerPart::FfnNorm), dt)?,
            gate_up,
            down: weights.linear(&n(LayerPart::Down), placement)?,
        })
    }
}

/// A norm's weight (required), cast to `dtype`.
fn norm(weights: &Weights, name: String, dtype: Dtype) -> Result<Array> {
    weights
        .vector(&name, dtype)?
        .ok_or_else(|| crate::EngineError::Request(format!("tensor `{name}` is missing")))
}

/// A loaded model, ready to run.
pub struct Model {
    pub config: ModelConfig,
    pub placement: Placement,
    embed: Array,
    layers: Vec<Layer>,
    norm: Array,
    lm_head: Linear,
    rotary: Rotary,
}

impl Model {
    /// Builds the model from `weights` named by `names`, taking each layer's tensors out of
    /// `weights` as it goes: what a load makes of them (dequantized, cast or joined weights)
    /// then replaces them one layer at a time instead of beside the whole file.
    pub fn build(
        config: ModelConfig,
        weights: &mut Weights,
        names: &dyn TensorNames,
        placement: Placement,
    ) -> Result<Model> {
        let dt = placement.dtype;
        let mut layers = Vec::with_capacity(config.layers);
        for i in 0..config.layers {
            layers.push(Layer::build(weights, names, i, placement)?);
        }
        let embed = weights.dense(&names.embed(), dt)?;
        embed.eval()?;
        let lm_head = if weights.has(&format!("{}.weight", names.output())) {
            weights.linear(&names.output(), placement)?
        } else {
            // Tied output head: reuse the (dequantized) embedding table.
            Linear::dense(embed.clone(), None, placement)
        };
        let norm = norm(weights, names.output_norm(), dt)?;
        let rotary = Rotary::new(config.head_dim, config.rope_theta, config.rope_traditional);
        Ok(Model {
            rotary,
            config,
            placement,
            embed,
            layers,
            norm,
            lm_head,
        })
    }

    /// Bytes of parameters one decode step reads: every layer's weights and norms, the final
    /// norm and the output head (one embedding row is negligible).
    pub fn weight_bytes_per_token(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                l.qkv.nbytes()
                    + l.gate_up.nbytes()
                    + l.o.nbytes()
                    + l.down.nbytes()
                    + l.attn_norm.nbytes()
                    + l.ffn_norm.nbytes()
                    + l.q_norm.as_ref().map_or(0, Array::nbytes)
                    + l.k_norm.as_ref().map_or(0, Array::nbytes)
            })
            .sum();
        layers + self.norm.nbytes() + self.lm_head.nbytes()
    }

    /// The residual stream `x` after `layer`'s feed-forward block (RMS norm, SwiGLU, added to
    /// `x`): on CUDA at a decode step's few rows, two kernels (gate/up with the SwiGLU, down with
    /// the add) where MLX runs five and a split.
    fn mlp_add(&self, layer: &Layer, x: &Array) -> Result<Array> {
        let norm = RmsNorm {
            weight: &layer.ffn_norm,
            eps: self.config.rms_eps,
        };
        if let Some(act) = layer.gate_up.swiglu_normed(x, norm)? {
            return layer.down.forward_add(&act, x);
        }
        let h = norm.apply(x)?;
        let act = match layer.gate_up.swiglu(&h)? {
            Some(act) => act,
            None => {
                let [g, u] = <[Array; 2]>::try_from(layer.gate_up.forward(&h)?).map_err(|_| {
                    crate::EngineError::Internal("gate and up projections are not two".into())
                })?;
                if self.placement.gpu {
                    ops::multiply(&nn::silu(g)?, &u)?
                } else {
                    fast_exp::silu_mul(&g, &u)?
                }
            }
        };
        layer.down.forward_add(&act, x)
    }

    /// Attention of one sequence's queries (`[1, heads, t, head_dim]`) over its keys and values
    /// in `spans`; `[1, t, heads * head_dim]`. `mask` is `[t, keys]`; the queries are positions
    /// `offset..offset + t`.
    fn attend(
        &self,
        q: &Array,
        spans: &[(Array, Array)],
        mask: &mut LazyMask,
        offset: i32,
    ) -> Result<Array> {
        let c = &self.config;
        let t = q.shape()[2];
        let (heads, kv_heads, hd) = (c.heads as i32, c.kv_heads as i32, c.head_dim as i32);
        let scale = 1.0 / (hd as f32).sqrt();
        let out = if self.placement.gpu {
            let pad = fused_prefill::Pad::of(&self.placement);
            fused_prefill::attend(q, spans, scale, mask.get()?, pad)?
        } else if let Some(out) = span_attention::attend(
            q,
            &[spans.to_vec()],
            &[(offset + t) as usize],
            scale,
            (heads / kv_heads) as usize,
        )? {
            return Ok(out);
        } else if let Some(mask) = mask.get()?.filter(|_| t >= 2 * CAUSAL_PIECE) {
            causal_attention(
                q,
                spans,
                scale,
                mask,
                heads / kv_heads,
                offset,
                CAUSAL_PIECE,
            )?
        } else {
            explicit_attention(q, spans, scale, mask.get()?, heads / kv_heads)?
        };
        Ok(out
            .transpose_axes(&[0, 2, 1, 3])?
            .reshape(&[1, t, heads * hd])?)
    }

    /// How a decode step reads each row's keys: CUDA's table kernel reads the pool in place;
    /// a GPU's fused kernel reads one padded tensor; the CPU's span kernel reads spans in place.
    pub fn decode_layout(&self) -> OwnLayout {
        match (self.placement.gpu, span_attention::available()) {
            (true, _) if self.reads_tables() => OwnLayout::Tables,
            (true, _) => OwnLayout::Padded,
            (false, true) => OwnLayout::Spans,
            (false, false) => OwnLayout::Either,
        }
    }

    /// One decode step for several sequences at once: `tokens[i]` is the next token of sequence
    /// `i` of `kv`. Every op runs once for the whole batch: the projections, one RoPE with
    /// per-row offsets, one write of the new K/V rows per layer, one attention per layer over
    /// the blocks every row shares (read once, in place: a shared system prompt costs one read,
    /// not one per row) and each row's own blocks (one gather, padded), one mask per step.
    /// Returns the logits, `[batch, vocab]` f32.
    pub fn forward_batch(&self, tokens: &[u32], kv: &mut dyn BatchKv) -> Result<Array> {
        let ids = Array::from_slice(tokens, &[tokens.len() as i32]);
        self.forward_step(&ids, kv)
    }

    /// [`Model::forward_batch`] over token ids already in an array (`[batch]`, u32): a step's
    /// tokens drawn on the device by the step before, which need not be read first.
    pub fn forward_step(&self, ids: &Array, kv: &mut dyn BatchKv) -> Result<Array> {
        let c = &self.config;
        let b = ids.shape().first().copied().unwrap_or(0);
        kv.reserve()?;
        let lens: Vec<i32> = kv.lens().into_iter().map(|l| l as i32).collect();
        if lens.len() != b as usize || ids.ndim() != 1 {
            return Err(crate::EngineError::Internal(format!(
                "a decode step of {} sequences got token ids of shape {:?}",
                lens.len(),
                ids.shape()
            )));
        }
        let rope = if self.placement.gpu {
            Rope::Fused(Offset::PerRow(Array::from_slice(&lens, &[b])))
        } else {
            Rope::Table(self.rotary.rows(&lens))
        };
        let mut x = self
            .embed
            .take_axis(ids, 0)?
            .reshape(&[b, 1, c.hidden as i32])?;
        let mut read: Option<StepRead> = None;
        let layout = self.decode_layout();
        for (i, layer) in self.layers.iter().enumerate() {
            let p = self.project_normed(layer, &x)?;
            let (q, keys) = self.turn_and_store((i, layer), p, &rope, kv, layout)?;
            if let (None, Some(padded)) = (&read, keys.own.padded_len()) {
                read = Some(StepRead::new(
                    self.placement,
                    &lens,
                    keys.shared_len,
                    padded,
                ));
            }
            let out = self.attend_batch(&q, &keys, read.as_mut())?;
            x = layer.o.forward_add(&out, &x)?;
            x = self.mlp_add(layer, &x)?;
        }
        kv.commit();
        let norm = RmsNorm {
            weight: &self.norm,
            eps: c.rms_eps,
        };
        let logits = match self.lm_head.forward_normed(&x, norm, Epilogue::Plain)? {
            Some(logits) => logits,
            None => self.lm_head.forward(&norm.apply(&x)?)?,
        };
        let logits = logits.reshape(&[b, c.vocab as i32])?;
        Ok(logits.as_dtype(Dtype::Float32)?)
    }
}

/// Query rows per piece of a long prefill chunk's attention on the CPU: each piece reads the
/// keys up to its own last position only, so the scores above the diagonal past that are
/// neither computed nor exponentiated (a 512-token chunk at offset 0 computes 10/16 of them).
const CAUSAL_PIECE: i32 = 128;

/// A forward pass's causal mask (`[t, keys]`), built from `keys` (queries, their offset, keys,
/// dtype; `None`: no mask needed) the first time a path reads it.
#[derive(Default)]
struct LazyMask {
    keys: Option<(i32, i32, i32, Dtype)>,
    built: Option<Array>,
}

impl LazyMask {
    fn get(&mut self) -> Result<Option<&Array>> {
        let Some((t, offset, keys, dtype)) = self.keys else {
            return Ok(None);
        };
        if self.built.as_ref().is_none_or(|m| m.shape() != [t, keys]) {
            self.built = Some(causal_mask(t, offset, keys, dtype)?);
        }
        Ok(self.built.as_ref())
    }
}

/// How a forward pass applies RoPE: MLX's fused kernel (GPU) or the angles of [`Rotary`].
enum Rope {
    Fused(Offset),
    Table(Angles),
}

/// Where RoPE starts: one offset for a sequence, or one per row of a batch.
enum Offset {
    Fixed(i32),
    PerRow(Array),
}
