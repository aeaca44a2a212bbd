//! Loading the model and sizing the pool: what the engine has before its first command.

use mlx_rs::Dtype;
use mlxcel_ipc::Geometry;
use mlxcel_ipc::proto::daemon::{ModelInfo, PoolStats};

use super::scheduler::{Limits, Scheduler};
use super::{CacheLink, Engine, EngineConfig, Started, Vitals};
use crate::pool::{BlockPool, PoolShape};
use crate::{EngineError, Result};

fn pool_blocks(config: &EngineConfig, block_bytes: u64) -> u32 {
    let bytes = config.kv_pool_bytes.unwrap_or_else(|| {
        let available = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find(|l| l.starts_with("MemAvailable:"))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            })
            .map_or(8 << 30, |kb| kb * 1024);
        (available / 4).min(4 << 30)
    });
    (bytes / block_bytes.max(1)).min(u64::from(u32::MAX)) as u32
}

impl Engine {
    pub(super) fn load(config: &EngineConfig) -> Result<(Engine, Started)> {
        // Checked before the weights load, so a bad setting fails at once.
        let defaults = crate::sampling_defaults::resolve(&config.model, &config.sampling)?;
        tracing::info!("sampling defaults: {}", defaults.describe());
        let loaded = crate::load_on(&config.model, config.device)?;
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
        shape.num_blocks = pool_blocks(config, shape.block_bytes() as u64);
        if shape.num_blocks == 0 {
            return Err(EngineError::Request(
                "the KV pool is smaller than one block".into(),
            ));
        }
        let pool = BlockPool::new(shape)?;
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
            blocks = shape.num_blocks,
            block_bytes = shape.block_bytes(),
            pool_bytes = pool.measured_bytes(),
            "KV pool ready"
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
        let engine = Engine {
            loaded,
            pool,
            config: config.clone(),
            sched: Scheduler::new(Limits {
                max_running: config.max_running,
                block_tokens: config.block_tokens,
                prefill_budget: config.prefill_chunk,
            }),
            cache: CacheLink::default(),
            preemptions: 0,
            vitals: Vitals::default(),
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
