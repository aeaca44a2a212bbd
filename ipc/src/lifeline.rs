//! A supervised process dies with its supervisor, however the supervisor ends (SIGKILL, a
//! closed terminal): `mlxcelctl serve` keeps the write end of a pipe whose read end every child
//! inherits, named by `MLXCEL_LIFELINE_FD`. The kernel closes the write end when the supervisor
//! dies, the child's read returns end-of-file, and the child stops as on SIGTERM. One mechanism
//! for Linux and macOS (where there is no `PR_SET_PDEATHSIG`). Processes started by launchd or
//! systemd have no lifeline.

use std::os::fd::{AsRawFd, OwnedFd};

/// The environment variable naming the inherited read end.
pub const ENV: &str = "MLXCEL_LIFELINE_FD";

/// The supervisor's side: the pipe, kept open for as long as the children must live.
#[derive(Debug)]
pub struct Lifeline {
    /// Inherited by every child (no close-on-exec).
    read: OwnedFd,
    /// Held only by the supervisor (close-on-exec): its closing is the signal.
    _write: OwnedFd,
}

impl Lifeline {
    pub fn new() -> std::io::Result<Lifeline> {
        use nix::fcntl::{F_SETFD, FdFlag, fcntl};
        let (read, write) = nix::unistd::pipe()?;
        fcntl(&write, F_SETFD(FdFlag::FD_CLOEXEC))?;
        fcntl(&read, F_SETFD(FdFlag::empty()))?;
        Ok(Lifeline {
            read,
            _write: write,
        })
    }

    /// The value of [`ENV`] for a child.
    pub fn env_value(&self) -> String {
        self.read.as_raw_fd().to_string()
    }
}

/// The child's side: returns when the supervisor whose lifeline is the inherited descriptor
/// `fd` (the value of [`ENV`], read by `mlxcel_config::process_env::lifeline_fd`) is gone; never,
/// without one.
pub async fn supervisor_gone(fd: Option<i32>) {
    let Some(fd) = fd else {
        return std::future::pending().await;
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    let watch = std::thread::Builder::new()
        .name("lifeline".into())
        .spawn(move || {
            let mut byte = [0u8; 1];
            // Blocks until the write end closes (the supervisor never writes).
            loop {
                // SAFETY: reading into a valid one-byte buffer from an inherited descriptor.
                let n = unsafe { nix::libc::read(fd, byte.as_mut_ptr().cast(), 1) };
                if n < 0
                    && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
                {
                    continue;
                }
                break;
            }
            let _ = tx.send(());
        });
    if watch.is_err() || rx.await.is_err() {
        return std::future::pending().await;
    }
    tracing::warn!("the supervisor is gone; stopping");
}
