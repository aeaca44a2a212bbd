//! The KV pool's ceiling: how many blocks the pool may hold at most. Memory is taken only as
//! blocks are used (see [`crate::pool`]), so this bounds, it does not allocate.
//!
//! `auto` is enough for the cache cap plus `max_batch_size` full contexts, and never more than
//! [`MEMORY_FRACTION`] of the memory the pool lives in ([`PoolMemory`]: physical memory on the
//! CPU, Metal's recommended working set, a CUDA device's free memory). An explicit ceiling above
//! that memory's total is refused.

use mlxcel_ipc::size::format_size;

use crate::device_memory::PoolMemory;
use crate::{EngineError, Result};

/// The share of the pool's memory ([`PoolMemory::usable`]) an `auto` ceiling may take.
pub const MEMORY_FRACTION: f64 = 0.5;

/// What the pool must be able to hold.
#[derive(Debug, Clone, Copy)]
pub struct Need {
    /// The cache manager's capacity (the cap on cached blocks).
    pub cache_capacity: u64,
    pub max_running: usize,
    /// Tokens of one full context.
    pub context_tokens: usize,
    /// KV bytes of one token across all layers.
    pub token_bytes: u64,
}

/// The chosen ceiling and how it was chosen, for the startup log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ceiling {
    pub bytes: u64,
    pub why: String,
}

/// Chooses the ceiling: `explicit` (`--kv-pool-bytes`) or `auto` from `need` and `memory`.
pub fn choose(explicit: Option<u64>, need: Need, memory: PoolMemory) -> Result<Ceiling> {
    if let Some(bytes) = explicit {
        if let Some(p) = memory.total.filter(|&p| bytes > p) {
            return Err(EngineError::Request(format!(
                "--kv-pool-bytes {} is more than this device's {} of memory",
                format_size(bytes),
                format_size(p)
            )));
        }
        return Ok(Ceiling {
            bytes,
            why: "set by --kv-pool-bytes".into(),
        });
    }
    let running = need.max_running as u64 * need.context_tokens as u64 * need.token_bytes;
    let want = need.cache_capacity.saturating_add(running);
    let limit = memory
        .usable
        .map_or(8 << 30, |p| (p as f64 * MEMORY_FRACTION) as u64);
    let bytes = want.min(limit);
    let usable_text = memory.usable.map_or("unknown".to_string(), format_size);
    Ok(Ceiling {
        bytes,
        why: format!(
            "auto: cache cap {} + {} running x {} tokens x {} = {}, at most {:.0}% of {} {} = {}",
            format_size(need.cache_capacity),
            need.max_running,
            need.context_tokens,
            format_size(need.token_bytes),
            format_size(want),
            MEMORY_FRACTION * 100.0,
            usable_text,
            memory.basis,
            format_size(limit)
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn need() -> Need {
        Need {
            cache_capacity: 2 * GIB,
            max_running: 8,
            context_tokens: 8192,
            token_bytes: 46_080,
        }
    }

    fn host(physical: u64) -> PoolMemory {
        PoolMemory::host(crate::host_memory::HostMemory {
            physical: Some(physical),
            available: Some(physical / 2),
        })
    }

    #[test]
    fn a_gpu_sizes_from_what_it_has_free_and_refuses_above_its_total() {
        let free_on_device = PoolMemory {
            total: Some(140 * GIB),
            usable: Some(3 * GIB),
            basis: "free CUDA device memory",
        };
        let c = choose(None, need(), free_on_device).unwrap();
        assert_eq!(c.bytes, 3 * GIB / 2);
        assert!(c.why.contains("free CUDA device memory"), "{}", c.why);
        assert!(choose(Some(150 * GIB), need(), free_on_device).is_err());
    }

    #[test]
    fn auto_holds_the_cache_cap_plus_full_contexts() {
        let c = choose(None, need(), host(24 * GIB)).unwrap();
        assert_eq!(c.bytes, 2 * GIB + 8 * 8192 * 46_080);
        assert!(c.why.contains("cache cap 2.00 GiB"), "{}", c.why);
    }

    #[test]
    fn auto_never_takes_more_than_half_of_physical_memory() {
        let c = choose(None, need(), host(8 * GIB)).unwrap();
        assert_eq!(c.bytes, 4 * GIB);
    }

    #[test]
    fn an_explicit_ceiling_above_physical_memory_is_refused_with_the_figures() {
        let e = choose(Some(30 * GIB), need(), host(24 * GIB)).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("30.00 GiB") && text.contains("24.00 GiB"),
            "{text}"
        );
        assert_eq!(
            choose(Some(GIB), need(), host(24 * GIB)).unwrap().bytes,
            GIB
        );
    }
}
