//! What the machine's memory is, for sizing the KV pool's ceiling, and what this process holds.
//!
//! Linux reads `/proc/meminfo` and `/proc/self/status`; macOS asks `sysctl hw.memsize` and the
//! task's VM info. Platform code stays here.

/// Physical memory and memory available now, in bytes (None where the system does not say).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostMemory {
    pub physical: Option<u64>,
    pub available: Option<u64>,
}

impl HostMemory {
    /// Reads this machine's figures.
    pub fn read() -> HostMemory {
        imp::read()
    }
}

/// The resident set of this process in bytes (phys_footprint on macOS), when known.
pub fn resident_bytes() -> Option<u64> {
    imp::resident()
}

#[cfg(target_os = "linux")]
mod imp {
    use super::HostMemory;

    fn meminfo_kb(text: &str, key: &str) -> Option<u64> {
        text.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
    }

    pub fn read() -> HostMemory {
        let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        HostMemory {
            physical: meminfo_kb(&text, "MemTotal:").map(|kb| kb * 1024),
            available: meminfo_kb(&text, "MemAvailable:").map(|kb| kb * 1024),
        }
    }

    pub fn resident() -> Option<u64> {
        let text = std::fs::read_to_string("/proc/self/status").ok()?;
        meminfo_kb(&text, "VmRSS:").map(|kb| kb * 1024)
    }
}

#[cfg(target_os = "macos")]
mod imp {
    use super::HostMemory;

    fn sysctl_u64(name: &std::ffi::CStr) -> Option<u64> {
        let mut value: u64 = 0;
        let mut len = std::mem::size_of::<u64>();
        // SAFETY: `value` and `len` describe a u64 buffer; the name is NUL-terminated.
        let rc = unsafe {
            libc::sysctlbyname(
                name.as_ptr(),
                (&mut value as *mut u64).cast(),
                &mut len,
                std::ptr::null_mut(),
                0,
            )
        };
        (rc == 0).then_some(value)
    }

    pub fn read() -> HostMemory {
        let physical = sysctl_u64(c"hw.memsize");
        // Free plus inactive pages are what the system can hand out without swapping.
        let page = sysctl_u64(c"hw.pagesize").unwrap_or(16384);
        let free = sysctl_u64(c"vm.page_free_count").unwrap_or(0);
        let inactive = sysctl_u64(c"vm.page_inactive_count").unwrap_or(0);
        let available = (free + inactive > 0).then_some((free + inactive) * page);
        HostMemory {
            physical,
            available,
        }
    }

    pub fn resident() -> Option<u64> {
        // The proc_pid_rusage footprint is what Activity Monitor shows.
        let mut info: libc::rusage_info_v2 = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a rusage_info_v2 buffer for the RUSAGE_INFO_V2 flavour.
        let rc = unsafe {
            libc::proc_pid_rusage(
                std::process::id() as i32,
                libc::RUSAGE_INFO_V2,
                (&mut info as *mut libc::rusage_info_v2).cast(),
            )
        };
        (rc == 0).then_some(info.ri_phys_footprint)
    }
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
mod imp {
    use super::HostMemory;

    pub fn read() -> HostMemory {
        HostMemory {
            physical: None,
            available: None,
        }
    }

    pub fn resident() -> Option<u64> {
        None
    }
}

/// Gives the allocator's free pages back to the operating system now: glibc keeps freed
/// buffers in its heaps (its mmap threshold rises after each large free, so a slab allocated
/// after another was freed comes from the heap), and `malloc_trim` returns every free page of
/// them. Called when a slab is dropped and when the engine goes idle.
pub fn trim_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Runs `f` (which allocates a KV slab) with every buffer of 256 KiB or more mmapped, then puts
/// glibc's mmap threshold at its dynamic ceiling (32 MiB) again: a slab then never sits in a
/// heap, where freeing it would leave pages pinned by what was allocated beside it, while the
/// engine's per-step buffers keep coming from the heap (mapping those each step costs page
/// faults: 4-5x slower gathers, measured), and lets the heap keep what a step frees.
pub fn with_mapped_buffers<T>(f: impl FnOnce() -> T) -> T {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tunables.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
    }
    let out = f();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: as above.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        // Setting the threshold turns glibc's dynamic tuning off, and with it the rise of the
        // trim threshold: left at its 128 KiB default, every free at the top of the heap
        // would hand pages back and the next step fault them in again. Freed memory goes back
        // when the engine is idle, after a step of 256 or more prompt tokens, or when a slab is
        // dropped (`trim_freed_memory`).
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
    }
    out
}

/// Free heap memory glibc may keep at the top of its heap while the engine is busy.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD: libc::c_int = 256 << 20;
