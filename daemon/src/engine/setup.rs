//! Loading the model and sizing the pool: what the engine has before its first command.

use mlx_rs::Dtype;
use mlxcel_ipc::Geometry;
use mlxcel_ipc::proto::daemon::{ModelInfo, PoolStats};

use super::ceiling;
use super::{CacheLink, Engine, EngineConfig, Started, Vitals};
use crate::device_memory::PoolMemory;
use crate::pool::{BlockPool, PoolShape};
use crate::scheduler::{Limits, Scheduler};
use crate::{EngineError, Result};
use mlxcel_ipc::size::format_size;

impl Engine {
    pub(super) fn load(config: &EngineConfig) -> Result<(Engine, Started)> {
        // Checked before the weights load, so a bad setting fails at once.
        let progress = &config.progress;
        let defaults = crate::sampling_defaults::resolve(&config.model, &config.sampling)?;
        tracing::info!("sampling defaults: {}", defaults.describe());
        progress.report("loading the model");
        let loaded = crate::load_on(&config.model, config.device)?;
        // Loading leaves temporaries (the dequantized copies' sources) in MLX's buffer cache.
        mlx_rs::memory::clear_cache()?;
        let weights_bytes = mlx_rs::memory::active_memory()? as u64;
        let c = &loaded.model.config;
        let dtype = loaded.model.placement.dtype;
        let mut shape = PoolShape {
            layers: c.layers,
            num_blocks: 0,
            block_tokens: config.block_tokens,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            dtype,
        };
        let block_bytes = shape.block_bytes() as u64;
        let need = ceiling::Need {
            cache_capacity: config.cache_capacity,
            max_running: config.max_running,
            context_tokens: loaded.text.context_length,
            token_bytes: block_bytes / config.block_tokens.max(1) as u64,
        };
        let ceiling = ceiling::choose(
            config.kv_pool_bytes,
            need,
            PoolMemory::of(&loaded.model.placement),
        )?;
        shape.num_blocks = (ceiling.bytes / block_bytes.max(1)).min(u64::from(u32::MAX)) as u32;
        if shape.num_blocks == 0 {
            return Err(EngineError::Request(format!(
                "the KV pool ceiling ({}) is smaller than one block ({})",
                format_size(ceiling.bytes),
                format_size(block_bytes)
            )));
        }
        let mut pool = BlockPool::for_device(shape, loaded.model.placement.gpu)?;
        progress.hold();
        let warmed = super::warmup::run(
            &loaded.model,
            &mut pool,
            config.prefill_chunk,
            config.max_running,
            config.warm_up_share,
            progress,
        )?;
        let prefill = match warmed.chunks {
            1 => format!("a {}-token prefill chunk", config.prefill_chunk),
            n => format!(
                "{n} prefill chunk sizes (up to {} tokens) and {} attention shapes",
                config.prefill_chunk, warmed.attention_shapes
            ),
        };
        let decode = match warmed.batches.as_slice() {
            [] => "no decode step (no room in the pool)".to_string(),
            [one] => format!("{one}-sequence decode steps (masked and not)"),
            sizes => format!("decode steps of {sizes:?} sequences (masked and not)"),
        };
        let warmup_ms = warmed.took.as_millis() as u64;
        if config.warm_up_share == crate::warm_workers::Share::WHOLE {
            tracing::info!(warmup_ms, "warm-up done: {prefill} and {decode}");
        } else {
            tracing::info!(warmup_ms, "this worker's share of the warm-up done");
        }
        if loaded.model.placement.keeps_step_buffers && warmed.step_bytes > 0 {
            // A step's freed buffers wait for the next step up to a prefill chunk's worth; the
            // rest goes back at once, and all of it when the engine goes idle.
            mlx_rs::memory::set_cache_limit(warmed.step_bytes as usize)?;
            tracing::info!(
                step_bytes = warmed.step_bytes,
                "MLX keeps up to {} of a step's freed buffers for the next step",
                format_size(warmed.step_bytes)
            );
        }
        let geometry = Geometry {
            model_id: loaded.model_id.clone(),
            layers: c.layers as u32,
            kv_heads: c.kv_heads as u32,
            head_dim: c.head_dim as u32,
            dtype: match dtype {
                Dtype::Float32 => mlxcel_ipc::Dtype::F32,
                Dtype::Bfloat16 => mlxcel_ipc::Dtype::BF16,
                _ => mlxcel_ipc::Dtype::F16,
            },
            block_tokens: config.block_tokens as u32,
            pool_blocks: shape.num_blocks,
        };
        tracing::info!(
            ceiling_blocks = shape.num_blocks,
            block_bytes,
            slab_blocks = pool.slab_blocks(),
            "KV pool ceiling {} ({}); memory is taken as blocks are used",
            format_size(u64::from(shape.num_blocks) * block_bytes),
            ceiling.why
        );
        let info = ModelInfo {
            model_id: loaded.model_id.clone(),
            context_length: loaded.text.context_length as u32,
            vocab_size: c.vocab as u32,
            tokenizer_json: loaded.text.tokenizer_json()?,
            chat_template: loaded.text.chat_template.clone(),
            bos: loaded.text.bos,
            eos: loaded.text.eos,
            stop_ids: loaded.text.stop_ids.clone(),
            geometry: geometry.clone(),
            pool: PoolStats::default(),
            sampling_defaults: defaults.values,
        };
        progress.report("building the grammar engine");
        let grammars = mlxcel_grammar::Grammars::new(&info.tokenizer_json, &info.stop_ids, c.vocab)
            .map_err(|e| {
                tracing::warn!("constrained decoding is unavailable: {e}");
                e.to_string()
            });
        let engine = Engine {
            grammars,
            loaded,
            pool,
            config: config.clone(),
            sched: Scheduler::new(Limits {
                max_running: config.max_running,
                block_tokens: config.block_tokens,
                prefill_budget: config.prefill_chunk,
                whole_chunks: true,
            }),
            cache: CacheLink::default(),
            runner: Default::default(),
            preemptions: 0,
            vitals: Vitals::default(),
            weights_bytes,
        };
        engine.publish();
        let info = ModelInfo {
            pool: engine.pool_stats(),
            ..info
        };
        let vitals = engine.vitals.clone();
        Ok((
            engine,
            Started {
                info,
                geometry,
                vitals,
            },
        ))
    }
}
