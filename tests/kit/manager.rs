//! Starts a real `mlxcel-cachemgr` process on a private socket directory for a test.
//! (Shared by the cache manager's and `mlxcelctl`'s tests.)

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A running cache manager; killed when dropped.
pub struct Manager {
    child: Child,
    /// The socket directory (removed when dropped).
    pub dir: tempfile::TempDir,
    /// The manager's socket.
    pub socket: PathBuf,
}

impl Manager {
    /// Starts `bin` with `--socket-dir <fresh dir>` and `extra` flags; returns once it accepts
    /// connections.
    pub fn start(bin: &Path, extra: &[&str]) -> Manager {
        let dir = crate::temp_dir("mx");
        Self::start_in(bin, dir, extra)
    }

    /// Like [`Manager::start`] in an existing directory.
    pub fn start_in(bin: &Path, dir: tempfile::TempDir, extra: &[&str]) -> Manager {
        let socket = dir.path().join("cachemgr.sock");
        let child = Command::new(bin)
            .arg("--socket-dir")
            .arg(dir.path())
            .args(extra)
            .env("MLXCEL_LOG", "error")
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let mut m = Manager { child, dir, socket };
        m.wait_ready();
        m
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("mlxcel-cachemgr exited during startup: {status}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!(
            "mlxcel-cachemgr did not listen on {} within 20 s",
            self.socket.display()
        );
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` and waits up to `limit` for the process to exit.
    pub fn signal_and_wait(
        &mut self,
        signal: nix::sys::signal::Signal,
        limit: Duration,
    ) -> Option<ExitStatus> {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, signal).expect("signal");
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    /// Kills the process hard (no cleanup) and hands back its directory.
    pub fn kill9(mut self) -> tempfile::TempDir {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let dir = tempfile::Builder::new().tempdir().expect("placeholder");
        std::mem::replace(&mut self.dir, dir)
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
