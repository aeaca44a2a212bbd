//! A private directory for MLX's kernel compilers, shared between daemons through a cache.
//!
//! `mlx::compile` on the CPU writes each fused kernel's C++ source to
//! `$TMPDIR/mlx/<version>/cpu/`, runs the C++ compiler there and loads the library, trusting any
//! file of that name it finds. Two daemons starting at once (tests do) would write the same
//! files at the same time, and one could load the other's half-written library. So each daemon
//! gets its own `TMPDIR` (`<cache>/proc-<pid>`), seeded with hard links to the kernels already
//! built, and publishes the ones it builds back into the cache only whole (a hard link made
//! after the compiler finished, which either appears complete or not at all). Directories of
//! daemons that are gone are removed at the next start. MLX's CUDA backend keeps its NVRTC
//! output under the same `TMPDIR` (`mlx/<version>/ptx/`), reading it back on a later run: it
//! is shared the same way ([`Kernels`]).
//!
//! The cache is `$XDG_CACHE_HOME/mlxcel/mlx-jit`, else `~/.cache/mlxcel/mlx-jit`.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

static INSTALLED: OnceLock<JitCache> = OnceLock::new();

/// Publishes what this process compiled, when [`JitCache::install`] ran, and names the kernel
/// files (libraries, PTX modules) that were new to the cache. Call only while no MLX work is in
/// flight (a kernel being compiled is not whole yet): the engine calls it when idle and after
/// each stage of its warm-up.
pub fn publish() -> Vec<String> {
    INSTALLED.get().map_or_else(Vec::new, JitCache::publish)
}

/// Gives this process the kernels other processes published since it started (the warm-up
/// workers'); says how many. Call before this process's MLX work.
pub fn reseed() -> usize {
    INSTALLED.get().map_or(0, |j| {
        copy_libraries(&j.shared, &j.private, Link::Seed).len()
    })
}

/// Publishes and removes this process's directory (at exit, after the engine stopped).
pub fn close() {
    if let Some(j) = INSTALLED.get() {
        j.close();
    }
}

/// This process's kernel directory and the shared cache.
#[derive(Debug)]
pub struct JitCache {
    shared: PathBuf,
    private: PathBuf,
}

impl JitCache {
    /// Creates this process's directory, seeded from the cache, and points `TMPDIR` at it; says
    /// how many compiled kernels the cache gave it.
    ///
    /// # Safety
    /// Sets an environment variable: call before any other thread starts.
    pub unsafe fn install() -> std::io::Result<usize> {
        let root = cache_root().ok_or_else(|| std::io::Error::other("no home directory"))?;
        let shared = root.join("shared");
        fs::create_dir_all(&shared)?;
        sweep(&root);
        let private = root.join(format!("proc-{}", std::process::id()));
        let _ = fs::remove_dir_all(&private);
        fs::create_dir_all(&private)?;
        let seeded = copy_libraries(&shared, &private, Link::Seed).len();
        // SAFETY: the caller guarantees no other thread is running.
        unsafe { std::env::set_var("TMPDIR", &private) };
        let _ = INSTALLED.set(JitCache { shared, private });
        Ok(seeded)
    }

    /// Publishes the kernels this process built into the shared cache; names those that were new.
    fn publish(&self) -> Vec<String> {
        copy_libraries(&self.private, &self.shared, Link::Publish)
    }

    /// Publishes, then removes this process's directory.
    fn close(&self) {
        self.publish();
        let _ = fs::remove_dir_all(&self.private);
    }
}

fn cache_root() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("mlxcel").join("mlx-jit"))
}

/// Removes the directories of daemons that no longer run.
fn sweep(root: &Path) {
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("proc-"))
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        if !alive(pid) {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

fn alive(pid: i32) -> bool {
    #[cfg(unix)]
    {
        // SAFETY: signal 0 only checks that the process exists.
        let r = unsafe { libc::kill(pid, 0) };
        r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        true
    }
}

#[derive(Clone, Copy)]
enum Link {
    Seed,
    Publish,
}

/// The pass in which a kernel itself (a library, a module's PTX) is linked, after its names.
const KERNEL_PASS: u8 = 1;

/// What MLX keeps under `$TMPDIR/mlx/<version>/`, per backend directory.
#[derive(Clone, Copy)]
enum Kernels {
    /// `cpu/lib*.so` (or `.dylib`): the CPU's compiled kernels.
    CpuLibraries,
    /// `ptx/**/<module>.ptx` with its kernel names in `<module>.txt` (a long module name is split
    /// into nested directories): the CUDA backend's NVRTC output, which MLX reads back instead
    /// of compiling again. Without it every daemon start compiled them anew (a GPU warm-up of
    /// ~100 s for SmolLM2's Q4_1 path in each end-to-end test's daemon).
    Ptx,
}

impl Kernels {
    const ALL: [Kernels; 2] = [Kernels::CpuLibraries, Kernels::Ptx];

    fn dir(self) -> &'static str {
        match self {
            Kernels::CpuLibraries => "cpu",
            Kernels::Ptx => "ptx",
        }
    }

    /// Whether `name` is linked, and in which pass: a module's names (`.txt`) before its PTX,
    /// so a daemon that finds the PTX in the cache finds the names too.
    fn pass(self, name: &str) -> Option<u8> {
        match self {
            Kernels::CpuLibraries => (name.starts_with("lib")
                && (name.ends_with(".so") || name.ends_with(".dylib")))
            .then_some(KERNEL_PASS),
            Kernels::Ptx if name.ends_with(".txt") => Some(0),
            Kernels::Ptx if name.ends_with(".ptx") => Some(KERNEL_PASS),
            Kernels::Ptx => None,
        }
    }
}

/// Hard-links every compiled kernel file ([`Kernels`]) under `from` to the same place under
/// `to`, skipping those already there, and names the kernels (a library, a module's PTX) it
/// linked. Sources are not copied: a seeded kernel is found by name, and MLX writes a source
/// only to build a missing one.
fn copy_libraries(from: &Path, to: &Path, how: Link) -> Vec<String> {
    let Ok(versions) = fs::read_dir(from.join("mlx")) else {
        return Vec::new();
    };
    let mut linked = Vec::new();
    for v in versions.flatten() {
        for kind in Kernels::ALL {
            let rel = Path::new("mlx").join(v.file_name()).join(kind.dir());
            link_dir(from, to, &rel, kind, how, &mut linked);
        }
    }
    linked
}

/// [`copy_libraries`] of one directory `rel` (and, for PTX, the directories below it), naming
/// what it linked in `linked`.
fn link_dir(
    from: &Path,
    to: &Path,
    rel: &Path,
    kind: Kernels,
    how: Link,
    linked: &mut Vec<String>,
) {
    let Ok(entries) = fs::read_dir(from.join(rel)) else {
        return;
    };
    let mut files: Vec<(u8, std::ffi::OsString)> = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        if matches!(kind, Kernels::Ptx) && e.file_type().is_ok_and(|t| t.is_dir()) {
            link_dir(from, to, &rel.join(&name), kind, how, linked);
        } else if let Some(pass) = name.to_str().and_then(|n| kind.pass(n)) {
            files.push((pass, name));
        }
    }
    files.sort();
    let dest = to.join(rel);
    if files.is_empty() || fs::create_dir_all(&dest).is_err() {
        return;
    }
    for (pass, name) in files {
        if dest.join(&name).exists() {
            continue;
        }
        match fs::hard_link(from.join(rel).join(&name), dest.join(&name)) {
            // The kernel itself (not a module's names) counts.
            Ok(()) if pass == KERNEL_PASS => {
                linked.push(rel.join(&name).to_string_lossy().into_owned());
            }
            Ok(()) => {}
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                if matches!(how, Link::Publish) {
                    tracing::debug!(error = %e, file = ?name, "cannot publish a compiled kernel");
                }
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libraries_are_linked_both_ways_and_sources_stay_private() {
        let dir = std::env::temp_dir().join(format!("mlxcel-jit-test-{}", std::process::id()));
        let (shared, private) = (dir.join("shared"), dir.join("proc-1"));
        let cpu = |root: &Path| root.join("mlx").join("0.0.0").join("cpu");
        fs::create_dir_all(cpu(&shared)).expect("shared");
        fs::write(cpu(&shared).join("libA.so"), b"a").expect("a");
        copy_libraries(&shared, &private, Link::Seed);
        assert_eq!(
            fs::read(cpu(&private).join("libA.so")).expect("seeded"),
            b"a"
        );
        fs::write(cpu(&private).join("libB.so"), b"b").expect("b");
        fs::write(cpu(&private).join("B.cpp"), b"src").expect("src");
        let published = copy_libraries(&private, &shared, Link::Publish);
        assert_eq!(
            published,
            ["mlx/0.0.0/cpu/libB.so"],
            "only the new library is named"
        );
        assert_eq!(
            fs::read(cpu(&shared).join("libB.so")).expect("published"),
            b"b"
        );
        assert!(!cpu(&shared).join("B.cpp").exists());
        // A second publish finds them there and changes nothing.
        assert!(copy_libraries(&private, &shared, Link::Publish).is_empty());
        fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn cuda_ptx_and_its_kernel_names_are_linked_nested_ones_too() {
        let dir = std::env::temp_dir().join(format!("mlxcel-ptx-test-{}", std::process::id()));
        let (shared, private) = (dir.join("shared"), dir.join("proc-1"));
        let ptx = |root: &Path| root.join("mlx").join("0.0.0").join("ptx");
        // A module of a short name, and one whose long name MLX split into a directory.
        let nested = ptx(&private).join("a_very_long_module_name_prefix");
        fs::create_dir_all(&nested).expect("dirs");
        for (at, stem) in [(ptx(&private), "binary_add"), (nested.clone(), "rest")] {
            fs::write(at.join(format!("{stem}.ptx")), b"ptx").expect("ptx");
            fs::write(at.join(format!("{stem}.txt")), b"k\tm").expect("txt");
            fs::write(at.join(format!("{stem}.cu")), b"src").expect("cu");
        }
        let mut named = copy_libraries(&private, &shared, Link::Publish);
        named.sort();
        assert_eq!(
            named,
            [
                "mlx/0.0.0/ptx/a_very_long_module_name_prefix/rest.ptx",
                "mlx/0.0.0/ptx/binary_add.ptx"
            ],
            "each module's PTX once, its names file not counted"
        );
        let published = ptx(&shared).join("a_very_long_module_name_prefix");
        for (at, stem) in [(ptx(&shared), "binary_add"), (published, "rest")] {
            assert_eq!(
                fs::read(at.join(format!("{stem}.ptx"))).expect("ptx"),
                b"ptx"
            );
            assert!(at.join(format!("{stem}.txt")).exists(), "{stem}.txt");
            assert!(
                !at.join(format!("{stem}.cu")).exists(),
                "sources stay private"
            );
        }
        // A later daemon is seeded with them.
        let later = dir.join("proc-2");
        copy_libraries(&shared, &later, Link::Seed);
        assert!(ptx(&later).join("binary_add.ptx").exists());
        fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn only_dead_daemons_directories_are_swept() {
        let dir = std::env::temp_dir().join(format!("mlxcel-sweep-test-{}", std::process::id()));
        let mine = dir.join(format!("proc-{}", std::process::id()));
        // Pid 2^22 + 1 is above Linux's pid_max ceiling, so no process has it.
        let gone = dir.join("proc-4194305");
        for d in [&mine, &gone] {
            fs::create_dir_all(d).expect("dir");
        }
        sweep(&dir);
        assert!(mine.exists() && !gone.exists());
        fs::remove_dir_all(&dir).expect("clean up");
    }
}
