//! Models: architectures and their loaders, written against a backend's operations
//! ([`crate::backend`]). An architecture is a forward pass over K/V stores ([`crate::kv`]): it
//! writes each layer's new K/V rows and reads back what attention needs; it never allocates or
//! frees blocks, and never asks which device it runs on.
//!
//! - [`config`]: [`ModelConfig`], the architecture and geometry.
//! - [`weights`]: a file's named tensors, and the layers an architecture takes out of them.
//! - [`gguf`]: loading a GGUF file (weights, configuration, tokenizer metadata);
//!   [`gguf_check`]: its structure checked in Rust first (MLX's reader trusts the file).
//! - [`safetensors`]: loading an MLX / Hugging Face directory.
//! - [`hf_config`]: a Hugging Face `config.json` read into a [`ModelConfig`].
//! - [`decoder`]: the pre-norm transformer decoder every family we serve is a variant of
//!   (Llama, Mistral, SmolLM2; Qwen2's biases; Qwen3's q/k norms; Gemma 3's sandwich norms and
//!   local layers; gpt-oss's sinks; Qwen3-MoE's and gpt-oss's experts).
//! - [`rope`]: a layer's rotation from the RoPE settings (linear, YaRN, Llama 3 scaling).
//! - [`moe`]: mixture-of-experts feed-forward blocks (routers, stacked experts);
//!   [`activation`]: the gated activations.
//! - [`quantized`]: MLX's quantized formats, and the ops over them in every mode.
//!
//! Adding an architecture: its names in [`config::Arch`], what it reads from `config.json` in
//! [`hf_config`], and either what differs in [`decoder`] or, for a model that is no such
//! decoder, a file here implementing [`Architecture`] and a line in [`Model::build`].

use std::rc::Rc;

use mlx_rs::Array;

use crate::Result;
use crate::backend::{Backend, Heads};
use crate::device::Placement;
use crate::kv::{BatchKv, ChunksKv, KvStore, OneChunk};

pub mod activation;
pub mod config;
pub mod decoder;
pub mod gguf;
pub mod gguf_check;
pub mod hf_config;
pub mod moe;
pub mod quantized;
pub mod rope;
pub mod safetensors;
pub mod weights;

pub use config::{Arch, ModelConfig};

/// One architecture's forward passes.
pub trait Architecture {
    /// Runs chunk `i` = `tokens[i]` (new positions after what sequence `i` of `kv` holds; the
    /// store has room for them) for every chunk in one pass and returns each chunk's
    /// last-position logits, `[chunks, vocab]` f32.
    fn forward_packed(&self, tokens: &[&[u32]], kv: &mut dyn ChunksKv) -> Result<Array>;

    /// One decode step: `ids[i]` (`[batch]` u32) is the next token of sequence `i` of `kv` (which
    /// has room for it). Returns the logits, `[batch, vocab]` f32.
    fn forward_step(&self, ids: &Array, kv: &mut dyn BatchKv) -> Result<Array>;

    /// The attention heads of its layers (what a warm-up builds attention shapes for).
    fn heads(&self) -> Heads;

    /// Bytes of parameters one decode step reads.
    fn weight_bytes_per_token(&self) -> usize;
}

/// A loaded model, ready to run.
pub struct Model {
    pub config: ModelConfig,
    pub placement: Placement,
    backend: Rc<dyn Backend>,
    arch: Box<dyn Architecture>,
}

impl Model {
    /// Builds the architecture `config` names from `weights` named by `names`, on `backend`.
    pub fn build(
        config: ModelConfig,
        weights: &mut weights::Weights,
        names: &dyn decoder::TensorNames,
        backend: Rc<dyn Backend>,
    ) -> Result<Model> {
        // Every family we serve is a variant of one decoder.
        let arch: Box<dyn Architecture> = Box::new(decoder::Decoder::build(
            &config,
            weights,
            names,
            backend.clone(),
        )?);
        Ok(Model {
            placement: *backend.placement(),
            config,
            backend,
            arch,
        })
    }

    /// The backend the model runs on.
    pub fn backend(&self) -> &dyn Backend {
        &*self.backend
    }

    /// Runs `tokens` (new positions after what `kv` holds) and returns the logits of the last
    /// position as f32 (`[vocab]`).
    pub fn forward(&self, tokens: &[u32], kv: &mut dyn KvStore) -> Result<Array> {
        let logits = self.forward_packed(&[tokens], &mut OneChunk(kv))?;
        Ok(logits.reshape(&[self.config.vocab as i32])?)
    }

    /// See [`Architecture::forward_packed`].
    pub fn forward_packed(&self, tokens: &[&[u32]], kv: &mut dyn ChunksKv) -> Result<Array> {
        if tokens.is_empty() || tokens.len() != kv.count() || tokens.iter().any(|t| t.is_empty()) {
            return Err(crate::EngineError::Internal(
                "a prefill pass needs one non-empty chunk per sequence".into(),
            ));
        }
        self.arch.forward_packed(tokens, kv)
    }

    /// One decode step over token ids on the host: `tokens[i]` is the next token of sequence `i`.
    pub fn forward_batch(&self, tokens: &[u32], kv: &mut dyn BatchKv) -> Result<Array> {
        let ids = Array::from_slice(tokens, &[tokens.len() as i32]);
        self.forward_step(&ids, kv)
    }

    /// See [`Architecture::forward_step`]: token ids already in an array (`[batch]`, u32), e.g.
    /// drawn on the device by the step before, which need not be read first.
    pub fn forward_step(&self, ids: &Array, kv: &mut dyn BatchKv) -> Result<Array> {
        let rows = kv.lens().len();
        if ids.ndim() != 1 || ids.shape()[0] as usize != rows {
            return Err(crate::EngineError::Internal(format!(
                "a decode step of {rows} sequences got token ids of shape {:?}",
                ids.shape()
            )));
        }
        self.arch.forward_step(ids, kv)
    }

    /// The attention heads of its layers.
    pub fn heads(&self) -> Heads {
        self.arch.heads()
    }

    /// Bytes of parameters one decode step reads.
    pub fn weight_bytes_per_token(&self) -> usize {
        self.arch.weight_bytes_per_token()
    }

    /// The prefill chunk sizes a warm-up runs so that chunks of at most `chunk` tokens meet no
    /// row count whose kernels it has not built.
    pub fn warm_up_chunks(&self, chunk: usize) -> Vec<usize> {
        self.backend.chunks(chunk)
    }

    /// Builds the prefill attention's shapes for chunks of at most `chunk` tokens over at most
    /// `max_keys` keys (capped at the context), where the backend builds kernels per shape; how
    /// many.
    pub fn warm_up_attention(&self, chunk: usize, max_keys: usize) -> Result<usize> {
        let keys = max_keys.min(self.config.context_length);
        self.backend.attention(self.arch.heads(), chunk, keys)
    }

    /// The batch sizes a warm-up steps for batches of at most `max` rows.
    pub fn warm_up_batches(&self, max: usize) -> Vec<usize> {
        self.backend.batches(max)
    }

    /// Where decode steps split a long row's keys into parts (a warm-up runs such a step).
    pub fn split_decode_from(&self) -> Option<usize> {
        self.backend.split_decode_from(self.arch.heads())
    }
}
