//! The Llama-family decoder: RMS norm, GQA attention with RoPE, SwiGLU MLP.
//! Qwen2 adds biases to q/k/v (picked up from the weights); Qwen3 adds per-head q/k RMS norms.

use mlx_rs::{Array, Dtype, fast, nn, ops};

use super::config::ModelConfig;
use super::weights::{Linear, Weights};
use crate::Result;
use crate::device::Placement;
use crate::kv::{BatchKv, KvStore};

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
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: Option<Array>,
    k_norm: Option<Array>,
    ffn_norm: Array,
    gate: Linear,
    up: Linear,
    down: Linear,
}

/// A loaded model, ready to run.
pub struct Model {
    pub config: ModelConfig,
    pub placement: Placement,
    embed: Array,
    layers: Vec<Layer>,
    norm: Array,
    lm_head: Linear,
}

impl Model {
    /// Builds the model from `weights` named by `names`.
    pub fn build(
        config: ModelConfig,
        weights: &Weights,
        names: &dyn TensorNames,
        placement: Placement,
    ) -> Result<Model> {
        let dt = placement.dtype;
        let norm = |name: String| -> Result<Array> {
            weights
                .vector(&name, dt)?
                .ok_or_else(|| crate::EngineError::Request(format!("tensor `{name}` is missing")))
        };
        let mut layers = Vec::with_capacity(config.layers);
        for i in 0..config.layers {
            let n = |p| names.layer(i, p);
            layers.push(Layer {
                attn_norm: norm(n(LayerPart::AttnNorm))?,
                q: weights.linear(&n(LayerPart::Q), placement)?,
                k: weights.linear(&n(LayerPart::K), placement)?,
                v: weights.linear(&n(LayerPart::V), placement)?,
                o: weights.linear(&n(LayerPart::O), placement)?,
                q_norm: weights.vector(&n(LayerPart::QNorm), dt)?,
                k_norm: weights.vector(&n(LayerPart::KNorm), dt)?,
                ffn_norm: norm(n(LayerPart::FfnNorm))?,
                gate: weights.linear(&n(LayerPart::Gate), placement)?,
                up: weights.linear(&n(LayerPart::Up), placement)?,
                down: weights.linear(&n(LayerPart::Down), placement)?,
            });
        }
        let embed = weights.dense(&names.embed(), dt)?;
        embed.eval()?;
        let lm_head = if weights.has(&format!("{}.weight", names.output())) {
            weights.linear(&names.output(), placement)?
        } else {
            // Tied output head: reuse the (dequantized) embedding table.
            Linear::Dense {
                wt: embed.t(),
                bias: None,
            }
        };
        let norm = norm(names.output_norm())?;
        Ok(Model {
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
                [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down]
                    .iter()
                    .map(|x| x.nbytes())
                    .sum::<usize>()
                    + l.attn_norm.nbytes()
                    + l.ffn_norm.nbytes()
                    + l.q_norm.as_ref().map_or(0, Array::nbytes)
                    + l.k_norm.as_ref().map_or(0, Array::nbytes)
            })
            .sum();
        layers + self.norm.nbytes() + self.lm_head.nbytes()
    }

    /// Runs `tokens` (new positions after what `kv` holds) and returns the logits of the last
    /// position as f32 (`[vocab]`).
    pub fn forward(&self, tokens: &[u32], kv: &mut dyn KvStore) -> Result<Array> {
        let c = &self.config;
        let t = tokens.len() as i32;
        kv.reserve(tokens.len())?;
        let offset = kv.len() as i32;
        let ids = Array::from_slice(tokens, &[t]);
        let mut x = self
            .embed
            .take_axis(&ids, 0)?
            .reshape(&[1, t, c.hidden as i32])?;
        let mask = (t > 1)
            .then(|| causal_mask(t, offset, self.placement.dtype))
            .transpose()?;
        for (i, layer) in self.layers.iter().enumerate() {
            let h = fast::rms_norm(&x, Some(&layer.attn_norm), c.rms_eps)?;
            let a = self.attention(layer, i, &h, offset, mask.as_ref(), kv)?;
            x = ops::add(&x, &a)?;
            x = ops::add(&x, &self.mlp(layer, &x)?)?;
        }
        kv.commit(tokens.len());
        let last = x.take_axis(Array::from_int(t - 1), 1)?;
        let last = fast::rms_norm(&last, Some(&self.norm), c.rms_eps)?;
        let logits = self.lm_head.forward(&last)?.reshape(&[c.vocab as i32])?;
        Ok(logits.as_dtype(Dtype::Float32)?)
    }

    fn attention(
        &self,
        layer: &Layer,
        index: usize,
        h: &Array,
        offset: i32,
        mask: Option<&Array>,
        kv: &mut dyn KvStore,
    ) -> Result<Array> {
        let t = h.shape()[1];
        let (q, k, v) = (
            layer.q.forward(h)?,
            layer.k.forward(h)?,
            layer.v.forward(h)?,
        );
        let (q, k, v) = self.heads(layer, q, k, v, offset)?;
        let (keys, values) = kv.append(index, k, v)?;
        let out = self.attend(&q, &keys, &values, mask)?;
        layer.o.forward(&out.reshape(&[1, t, -1])?)
    }

    /// The feed-forward block of `layer` (RMS norm, SwiGLU) on the residual stream `x`.
    fn mlp(&self, layer: &Layer, x: &Array) -> Result<Array> {
        let h = fast::rms_norm(x, Some(&layer.ffn_norm), self.config.rms_eps)?;
        let g = nn::silu(layer.gate.forward(&h)?)?;
        layer
            .down
            .forward(&ops::multiply(&g, &layer.up.forward(&h)?)?)
    }

    /// Splits projected q, k, v (`[1, t, n * head_dim]`) into heads (`[1, n, t, head_dim]`),
    /// applies the q/k norms and RoPE at `offset`.
    fn heads(
        &self,
        layer: &Layer,
        q: Array,
        k: Array,
        v: Array,
        offset: i32,
    ) -> Result<(Array, Array, Array)> {
        let c = &self.config;
        let t = q.shape()[1];
        let (heads, kv_heads, hd) = (c.heads as i32, c.kv_heads as i32, c.head_dim as i32);
        let split = |x: Array, n: i32| -> Result<Array> {
            Ok(x.reshape(&[1, t, n, hd])?.transpose_axes(&[0, 2, 1, 3])?)
        };
        let mut q = split(q, heads)?;
        let mut k = split(k, kv_heads)?;
        let v = split(v, kv_heads)?;
        if let Some(w) = &layer.q_norm {
            q = fast::rms_norm(&q, Some(w), c.rms_eps)?;
        }
        if let Some(w) = &layer.k_norm {
            k = fast::rms_norm(&k, Some(w), c.rms_eps)?;
        }
        let q = fast::rope(&q, hd, c.rope_traditional, c.rope_theta, 1.0, offset, None)?;
        let k = fast::rope(&k, hd, c.rope_traditional, c.rope_theta, 1.0, offset, None)?;
        Ok((q, k, v))
    }

    /// Attention of one sequence's queries over its keys and values; `[1, t, heads * head_dim]`.
    fn attend(
        &self,
        q: &Array,
        keys: &Array,
        values: &Array,
        mask: Option<&Array>,
    ) -> Result<Array> {
        let c = &self.config;
        let t = q.shape()[2];
        let (heads, kv_heads, hd) = (c.heads as i32, c.kv_heads as i32, c.head_dim as i32);
        let scale = 1.0 / (hd as f32).sqrt();
        let out = if self.placement.gpu {
            let mask = mask.map(fast::ScaledDotProductAttentionMask::Array);
            fast::scaled_dot_product_attention(q, keys, values, scale, mask, None)?
        } else {
            explicit_attention(q, keys, values, scale, mask, heads / kv_heads)?
        };
        Ok(out
            .transpose_axes(&[0, 2, 1, 3])?
            .reshape(&[1, t, heads * hd])?)
    }

    /// One decode step for several sequences at once: `tokens[i]` is the next token of sequence
    /// `i` of `kv`. The linear layers run once on the whole batch (the weights are read once for
    /// all of them), each layer's new K/V rows go into the pool in one update, and attention runs
    /// per sequence on its own K/V. Returns the logits, `[batch, vocab]` f32.
    pub fn forward_batch(&self, tokens: &[u32], kv: &mut dyn BatchKv) -> Result<Array> {
        let c = &self.config;
        let b = tokens.len() as i32;
        kv.reserve()?;
        let offsets: Vec<i32> = kv.lens().into_iter().map(|l| l as i32).collect();
        let ids = Array::from_slice(tokens, &[b]);
        let mut x = self
            .embed
            .take_axis(&ids, 0)?
            .reshape(&[b, 1, c.hidden as i32])?;
        for (i, layer) in self.layers.iter().enumerate() {
            let h = fast::rms_norm(&x, Some(&layer.attn_norm), c.rms_eps)?;
            let (q, k, v) = (
                layer.q.forward(&h)?,
                layer.k.forward(&h)?,
                layer.v.forward(&h)?,
            );
            let (mut qs, mut ks, mut vs) = (Vec::new(), Vec::new(), Vec::new());
            for (row, &offset) in offsets.iter().enumerate() {
                let pick = |a: &Array| a.take_axis(Array::from_slice(&[row as i32], &[1]), 0);
                let (q, k, v) = self.heads(layer, pick(&q)?, pick(&k)?, pick(&v)?, offset)?;
                qs.push(q);
                ks.push(k);
                vs.push(v);
            }
            let kvs = kv.append_all(i, ks, vs)?;
            let outs = qs
                .iter()
                .zip(&kvs)
                .map(|(q, (keys, values))| self.attend(q, keys, values, None))
                .collect::<Result<Vec<_>>>()?;
            let attn = layer.o.forward(&ops::concatenate(&outs, 0)?)?;
            x = ops::add(&x, &attn)?;
            x = ops::add(&x, &self.mlp(layer, &x)?)?;
        }
        kv.commit();
        let x = fast::rms_norm(&x, Some(&self.norm), c.rms_eps)?;
        let logits = self.lm_head.forward(&x)?.reshape(&[b, c.vocab as i32])?;
        Ok(logits.as_dtype(Dtype::Float32)?)
    }
}

/// Attention as two matmuls and a softmax, grouping query heads over shared K/V heads without
/// copying K/V. On MLX's CPU backend this is far faster than the fused kernel.
fn explicit_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: Option<&Array>,
    group: i32,
) -> Result<Array> {
    let qs = q.shape();
    let (heads, t, hd) = (qs[1], qs[2], qs[3]);
    let kv_heads = heads / group;
    // [1, kvh, g*t, hd] x [1, kvh, hd, s] -> [1, kvh, g*t, s]
    let q = ops::multiply(q, Array::from_f32(scale))?.reshape(&[1, kv_heads, group * t, hd])?;
    let mut scores = ops::matmul(&q, &k.swap_axes(2, 3)?)?;
    if let Some(m) = mask {
        let s = scores.shape()[3];
        scores = ops::add(&scores.reshape(&[1, kv_heads, group, t, s])?, m)?.reshape(&[
            1,
            kv_heads,
            group * t,
            s,
        ])?;
    }
    let p = ops::softmax_axis(&scores, -1, true)?;
    let out = ops::matmul(&p, v)?;
    Ok(out.reshape(&[1, heads, t, hd])?)
}

/// `[t, offset + t]` additive mask: position `offset + i` sees keys `0..=offset + i`.
fn causal_mask(t: i32, offset: i32, dtype: Dtype) -> Result<Array> {
    let s = offset + t;
    let mut m = vec![0f32; (t * s) as usize];
    for i in 0..t {
        for j in (offset + i + 1)..s {
            m[(i * s + j) as usize] = f32::NEG_INFINITY;
        }
    }
    Ok(Array::from_slice(&m, &[t, s]).as_dtype(dtype)?)
}
