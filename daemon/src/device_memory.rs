//! The memory the KV pool lives in, for sizing its ceiling: the host's on the CPU, Metal's
//! recommended working set on a Mac (unified memory), a CUDA device's free memory on an NVIDIA
//! GPU. The GPU figures come from MLX's device info; where a GPU does not give them, the host's
//! stand in and the startup log says so.

use std::ffi::CStr;

use crate::device::{DeviceKind, Placement};
use crate::host_memory::HostMemory;

/// What the pool's ceiling is measured against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolMemory {
    /// All of that memory: an explicit ceiling above it is refused.
    pub total: Option<u64>,
    /// What an `auto` ceiling takes its fraction of.
    pub usable: Option<u64>,
    /// What `usable` is, for the startup log.
    pub basis: &'static str,
}

impl PoolMemory {
    /// The host's physical memory.
    pub fn host(host: HostMemory) -> PoolMemory {
        PoolMemory {
            total: host.physical,
            usable: host.physical,
            basis: "physical memory",
        }
    }

    /// The memory of the device `placement` runs on, read now (after the weights have loaded,
    /// so a CUDA device's free memory no longer counts them).
    pub fn of(placement: &Placement) -> PoolMemory {
        let host = PoolMemory::host(HostMemory::read());
        let (total_key, usable_key, basis) = match placement.kind {
            DeviceKind::Cpu => return host,
            DeviceKind::Metal => (
                c"memory_size",
                c"max_recommended_working_set_size",
                "Metal's recommended working set",
            ),
            DeviceKind::Cuda => (c"total_memory", c"free_memory", "free CUDA device memory"),
        };
        let [total, usable] = gpu_info([total_key, usable_key]);
        match usable {
            Some(usable) => PoolMemory {
                total: total.or(host.total),
                usable: Some(usable),
                basis,
            },
            None => {
                tracing::warn!(
                    device = %placement.kind,
                    "MLX did not give the GPU's memory; sizing the KV pool from the host's"
                );
                host
            }
        }
    }
}

/// Size-valued keys of MLX's device info for GPU 0 (None for a key it does not have).
fn gpu_info<const N: usize>(keys: [&CStr; N]) -> [Option<u64>; N] {
    let mut out = [None; N];
    // SAFETY: plain mlx-c calls on objects created here and freed before returning; every
    // out-pointer points at a live local.
    unsafe {
        let device = mlx_sys::mlx_device_new_type(mlx_sys::mlx_device_type__MLX_GPU, 0);
        let mut info = mlx_sys::mlx_device_info_new();
        if mlx_sys::mlx_device_info_get(&mut info, device) == 0 {
            for (slot, key) in out.iter_mut().zip(keys) {
                let mut value: usize = 0;
                if mlx_sys::mlx_device_info_get_size(&mut value, info, key.as_ptr()) == 0 {
                    *slot = Some(value as u64);
                }
            }
        }
        mlx_sys::mlx_device_info_free(info);
        mlx_sys::mlx_device_free(device);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_sizes_from_the_host() {
        let host = HostMemory {
            physical: Some(24 << 30),
            available: Some(12 << 30),
        };
        let m = PoolMemory::host(host);
        assert_eq!((m.total, m.usable), (Some(24 << 30), Some(24 << 30)));
        assert_eq!(m.basis, "physical memory");
    }
}
