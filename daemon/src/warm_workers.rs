//! Warm-up workers: a first start on a CUDA GPU builds its kernels in several processes at once.
//!
//! MLX's CUDA backend compiles each kernel with NVRTC on the thread that first runs it, one at a
//! time: on a fresh H100 the default model's warm-up built 19 kernels in 226 s, one CPU core
//! busy and the GPU idle. Kernels land in the shared cache ([`crate::jit_cache`]) whichever
//! process built them, so before its own warm-up a daemon whose cache is empty starts a few
//! copies of itself (`--warm-up-share PART:I/N`), each loading the model and running every N-th
//! job of the warm-up's prefill part ([`Share`]), taking what the others published before each
//! job; then as many for its decode part ([`Part`]). It waits for them, takes their kernels from
//! the cache and runs the whole warm-up itself, which builds only what they left. A worker that
//! fails costs nothing but its time: the daemon's own warm-up builds what it missed.

use std::fmt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use crate::device::DeviceKind;

/// The most workers `auto` starts: the kernels every job needs are built by each worker again,
/// so more buy less.
const MOST_AUTO: usize = 8;

/// The warm-up's two parts. Workers run the prefill part first, all of them, then the decode
/// part: a decode job prefills its rows too, and then finds the prefill part's kernels cached
/// instead of building them again beside the worker that builds them (on a fresh H100, one
/// worker's 1-row decode job spent 52 s building the quantized matmuls another was building).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Both (the daemon's own warm-up).
    Whole,
    /// The attention shapes and prefill chunks.
    Prefill,
    /// The decode steps.
    Decode,
}

/// Which of the warm-up's jobs one process runs: of `part`'s, every `of`-th, from `index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    pub part: Part,
    pub index: usize,
    pub of: usize,
}

impl Share {
    /// All of them (the daemon's own warm-up).
    pub const WHOLE: Share = Share {
        part: Part::Whole,
        index: 0,
        of: 1,
    };

    /// Whether this share runs jobs of `part`.
    pub fn runs(self, part: Part) -> bool {
        self.part == Part::Whole || self.part == part
    }

    /// Whether job number `job` of a part it runs (counted from 0 in the warm-up's order) is
    /// this share's.
    pub fn takes(self, job: usize) -> bool {
        job % self.of.max(1) == self.index
    }
}

impl Default for Share {
    fn default() -> Self {
        Share::WHOLE
    }
}

impl fmt::Display for Share {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let part = match self.part {
            Part::Whole => "whole",
            Part::Prefill => "prefill",
            Part::Decode => "decode",
        };
        write!(f, "{part}:{}/{}", self.index, self.of)
    }
}

impl std::str::FromStr for Share {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad =
            || format!("`{s}` is not a warm-up share such as prefill:0/4 (part:index/workers)");
        let (part, share) = s.split_once(':').ok_or_else(bad)?;
        let part = match part {
            "whole" => Part::Whole,
            "prefill" => Part::Prefill,
            "decode" => Part::Decode,
            _ => return Err(bad()),
        };
        let (index, of) = share.split_once('/').ok_or_else(bad)?;
        let (index, of) = (
            index.parse().map_err(|_| bad())?,
            of.parse().map_err(|_| bad())?,
        );
        if index < of {
            Ok(Share { part, index, of })
        } else {
            Err(bad())
        }
    }
}

/// What `--warm-up-workers` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Workers {
    /// On a CUDA GPU with an empty kernel cache, as many as the cores and the device's memory
    /// allow (at most [`MOST_AUTO`]); else none.
    #[default]
    Auto,
    /// This many (0 or 1: none), on any device.
    Exactly(usize),
}

impl std::str::FromStr for Workers {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Workers::Auto),
            n => n.parse().map(Workers::Exactly).map_err(|_| {
                format!("`{s}` is not a number of warm-up workers: auto, or 0 or more")
            }),
        }
    }
}

/// What the choice of a worker count reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Machine {
    pub device: DeviceKind,
    /// Compiled kernels the cache held at this start.
    pub cached_kernels: usize,
    pub cores: usize,
    /// The model's weights (its file, or its directory's safetensors).
    pub weights_bytes: u64,
    /// The device's free memory, where it says.
    pub free_bytes: Option<u64>,
}

impl Workers {
    /// How many workers to start on `m` (fewer than 2 are none: one would only add a load).
    pub fn count(self, m: Machine) -> usize {
        let n = match self {
            Workers::Exactly(n) => n,
            Workers::Auto if m.device != DeviceKind::Cuda || m.cached_kernels > 0 => 0,
            Workers::Auto => {
                // Each loads the weights: together at most half of what is free.
                let by_memory = m
                    .free_bytes
                    .map_or(MOST_AUTO as u64, |free| free / 2 / m.weights_bytes.max(1));
                MOST_AUTO.min(m.cores / 2).min(by_memory as usize)
            }
        };
        if n < 2 { 0 } else { n }
    }
}

/// The model's weights on disk: a file's size, or a directory's safetensors.
pub fn weights_bytes(model: &Path) -> u64 {
    let Ok(meta) = std::fs::metadata(model) else {
        return 0;
    };
    if meta.is_file() {
        return meta.len();
    }
    crate::model::safetensors::weight_files(model)
        .into_iter()
        .flatten()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum()
}

/// Runs the warm-up's prefill part, then its decode part, each in `n` workers (this executable
/// with this process's arguments and `--warm-up-share PART:I/N`), and logs how each ended.
/// Returns how many finished cleanly, of `2 * n`.
pub fn run(n: usize) -> usize {
    let started = Instant::now();
    tracing::info!(
        workers = n,
        "warm-up: {n} workers build kernels in parallel before the daemon's own warm-up \
         (prefill, then decode)"
    );
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            tracing::warn!(error = %e, "cannot find this executable; warming up alone");
            return 0;
        }
    };
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    let mut clean = 0;
    for part in [Part::Prefill, Part::Decode] {
        let mut children: Vec<(Share, Child)> = Vec::new();
        for index in 0..n {
            let share = Share { part, index, of: n };
            let mut c = Command::new(&exe);
            c.args(&args)
                .arg("--warm-up-share")
                .arg(share.to_string())
                .stdin(Stdio::null());
            end_with_parent(&mut c);
            match c.spawn() {
                Ok(child) => children.push((share, child)),
                Err(e) => tracing::warn!(%share, error = %e, "cannot start a warm-up worker"),
            }
        }
        for (share, mut child) in children {
            match child.wait() {
                Ok(status) if status.success() => {
                    clean += 1;
                    let ms = started.elapsed().as_millis() as u64;
                    tracing::info!(%share, ms, "warm-up worker done");
                }
                Ok(status) => tracing::warn!(
                    %share, %status,
                    "a warm-up worker failed; the daemon's own warm-up builds what it left"
                ),
                Err(e) => tracing::warn!(%share, error = %e, "lost a warm-up worker"),
            }
        }
    }
    clean
}

/// A worker gets SIGTERM when the daemon that started it dies (Linux: the daemon's supervisor
/// may stop it mid warm-up); elsewhere it finishes its share and exits.
fn end_with_parent(c: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            c.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = c;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cuda(cached_kernels: usize) -> Machine {
        Machine {
            device: DeviceKind::Cuda,
            cached_kernels,
            cores: 16,
            weights_bytes: 100 << 20,
            free_bytes: Some(78 << 30),
        }
    }

    #[test]
    fn shares_split_the_jobs_between_them_and_bad_ones_are_refused() {
        let shares: Vec<Share> = ["prefill:0/3", "prefill:1/3", "prefill:2/3"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        for job in 0..10 {
            assert_eq!(
                shares.iter().filter(|s| s.takes(job)).count(),
                1,
                "job {job}"
            );
        }
        assert!(shares[0].runs(Part::Prefill) && !shares[0].runs(Part::Decode));
        let decode: Share = "decode:1/2".parse().unwrap();
        assert!(decode.runs(Part::Decode) && !decode.runs(Part::Prefill));
        assert!(Share::WHOLE.takes(7));
        assert!(Share::WHOLE.runs(Part::Prefill) && Share::WHOLE.runs(Part::Decode));
        for share in [shares[2], decode, Share::WHOLE] {
            assert_eq!(share.to_string().parse(), Ok(share));
        }
        for bad in [
            "prefill:3/3",
            "decode:0/0",
            "1/2",
            "other:0/2",
            "prefill:1",
            "prefill:a/2",
            "prefill:-1/2",
            "",
        ] {
            assert!(bad.parse::<Share>().is_err(), "{bad}");
        }
    }

    #[test]
    fn auto_starts_workers_only_for_a_first_start_on_cuda_within_cores_and_memory() {
        assert_eq!(Workers::Auto.count(cuda(0)), 8);
        assert_eq!(Workers::Auto.count(cuda(19)), 0, "kernels cached: none");
        let cpu = Machine {
            device: DeviceKind::Cpu,
            ..cuda(0)
        };
        assert_eq!(Workers::Auto.count(cpu), 0);
        let metal = Machine {
            device: DeviceKind::Metal,
            ..cuda(0)
        };
        assert_eq!(Workers::Auto.count(metal), 0);
        let two_cores = Machine {
            cores: 2,
            ..cuda(0)
        };
        assert_eq!(Workers::Auto.count(two_cores), 0, "one worker is none");
        let big = Machine {
            weights_bytes: 16 << 30,
            ..cuda(0)
        };
        assert_eq!(
            Workers::Auto.count(big),
            2,
            "78 GiB free: two 16 GiB copies"
        );
        let unknown = Machine {
            free_bytes: None,
            ..cuda(0)
        };
        assert_eq!(Workers::Auto.count(unknown), 8);
        assert_eq!(
            Workers::Exactly(3).count(Machine {
                device: DeviceKind::Cpu,
                ..cuda(5)
            }),
            3
        );
        assert_eq!(Workers::Exactly(1).count(cuda(0)), 0);
        assert_eq!("auto".parse(), Ok(Workers::Auto));
        assert_eq!("0".parse(), Ok(Workers::Exactly(0)));
        assert!("many".parse::<Workers>().is_err());
    }

    #[test]
    fn weights_are_a_files_size_or_a_directorys_safetensors() {
        let dir = std::env::temp_dir().join(format!("mxw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a.safetensors"), [0u8; 10]).unwrap();
        std::fs::write(dir.join("b.safetensors"), [0u8; 5]).unwrap();
        std::fs::write(dir.join("config.json"), [0u8; 100]).unwrap();
        assert_eq!(weights_bytes(&dir), 15);
        assert_eq!(weights_bytes(&dir.join("config.json")), 100);
        assert_eq!(weights_bytes(&dir.join("missing")), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
