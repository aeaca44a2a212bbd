//! A private directory for MLX's CPU kernel compiler, shared between daemons through a cache.
//!
//! `mlx::compile` on the CPU writes each fused kernel's C++ source to
//! `$TMPDIR/mlx/<version>/cpu/`, runs the C++ compiler there and loads the library, trusting any
//! file of that name it finds. Two daemons starting at once (tests do) would write the same
//! files at the same time, and one could load the other's half-written library. So each daemon
//! gets its own `TMPDIR` (`<cache>/proc-<pid>`), seeded with hard links to the kernels already
//! built, and publishes the ones it builds back into the cache only whole (a hard link made
//! after the compiler finished, which either appears complete or not at all). Directories of
//! daemons that are gone are removed at the next start.
//!
//! The cache is `$XDG_CACHE_HOME/mlxcel/mlx-jit`, else `~/.cache/mlxcel/mlx-jit`.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

static INSTALLED: OnceLock<JitCache> = OnceLock::new();

/// Publishes what this process compiled, when [`JitCache::install`] ran. Call only while no
/// MLX work is in flight (a kernel being compiled is not whole yet): the engine calls it when
/// idle and after its warm-up.
pub fn publish() {
    if let Some(j) = INSTALLED.get() {
        j.publish();
    }
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
    /// Creates this process's directory, seeded from the cache, and points `TMPDIR` at it.
    ///
    /// # Safety
    /// Sets an environment variable: call before any other thread starts.
    pub unsafe fn install() -> std::io::Result<()> {
        let root = cache_root().ok_or_else(|| std::io::Error::other("no home directory"))?;
        let shared = root.join("shared");
        fs::create_dir_all(&shared)?;
        sweep(&root);
        let private = root.join(format!("proc-{}", std::process::id()));
        let _ = fs::remove_dir_all(&private);
        fs::create_dir_all(&private)?;
        copy_libraries(&shared, &private, Link::Seed);
        // SAFETY: the caller guarantees no other thread is running.
        unsafe { std::env::set_var("TMPDIR", &private) };
        let _ = INSTALLED.set(JitCache { shared, private });
        Ok(())
    }

    /// Publishes the kernels this process built into the shared cache.
    fn publish(&self) {
        copy_libraries(&self.private, &self.shared, Link::Publish);
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

/// Hard-links every compiled library (`mlx/<version>/cpu/lib*.so` or `.dylib`) under `from` to
/// the same place under `to`, skipping those already there. Sources are not copied: a seeded
/// library is found by name, and MLX writes a source only to build a missing one.
fn copy_libraries(from: &Path, to: &Path, how: Link) {
    let Ok(versions) = fs::read_dir(from.join("mlx")) else {
        return;
    };
    for v in versions.flatten() {
        let rel = Path::new("mlx").join(v.file_name()).join("cpu");
        let Ok(files) = fs::read_dir(from.join(&rel)) else {
            continue;
        };
        let dest = to.join(&rel);
        if fs::create_dir_all(&dest).is_err() {
            continue;
        }
        for f in files.flatten() {
            let name = f.file_name();
            let is_lib = name.to_str().is_some_and(|n| {
                n.starts_with("lib") && (n.ends_with(".so") || n.ends_with(".dylib"))
            });
            if !is_lib || dest.join(&name).exists() {
                continue;
            }
            if let Err(e) = fs::hard_link(f.path(), dest.join(&name)) {
                if e.kind() != std::io::ErrorKind::AlreadyExists && matches!(how, Link::Publish) {
                    tracing::debug!(error = %e, file = ?name, "cannot publish a compiled kernel");
                }
            }
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
        copy_libraries(&private, &shared, Link::Publish);
        assert_eq!(
            fs::read(cpu(&shared).join("libB.so")).expect("published"),
            b"b"
        );
        assert!(!cpu(&shared).join("B.cpp").exists());
        // A second publish finds them there and changes nothing.
        copy_libraries(&private, &shared, Link::Publish);
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
