//! The real stack under `mlxcelctl serve` for end-to-end tests, and `mlxcelctl` as a client.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::http;
pub use crate::{bin, wait_until};

/// `mlxcelctl serve` with its own socket directory, port and (empty) configuration.
pub struct Served {
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub port: u16,
    log: Arc<Mutex<String>>,
    env: Vec<(String, String)>,
}

impl Served {
    /// Starts the stack with `env` (e.g. `MLXCEL_CACHE_LEASE_TIMEOUT`) and waits for /health 200.
    pub fn start(env: &[(&str, &str)]) -> Served {
        let dir = crate::temp_dir("mxs");
        let port = http::free_port();
        let mut all: Vec<(String, String)> = vec![
            ("MLXCEL_PORT".into(), port.to_string()),
            ("MLXCEL_KV_POOL_BYTES".into(), "256MiB".into()),
            // Tests that count cached tokens must not depend on a 50 ms budget on a busy
            // machine; the hung-manager test sets the default back.
            ("MLXCEL_ACQUIRE_TIMEOUT".into(), "30s".into()),
            ("MLXCEL_LOG".into(), "info".into()),
            // No configuration file but the test's (there is none in this directory).
            (
                "XDG_CONFIG_HOME".into(),
                dir.path().to_string_lossy().into_owned(),
            ),
            // The manager's block-hash key is created here, not in the user's state directory.
            (
                "XDG_STATE_HOME".into(),
                dir.path().to_string_lossy().into_owned(),
            ),
        ];
        all.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let mut c = Command::new(bin("mlxcelctl"));
        c.args(["serve", "--socket-dir"]).arg(dir.path());
        c.envs(all.iter().map(|(k, v)| (k, v)));
        // As from a terminal: a test run under `nohup` would otherwise pass on an ignored
        // SIGHUP, and the hang-up test would wait for ever.
        // SAFETY: between fork and exec only an async-signal-safe call (sigaction) runs.
        unsafe {
            use std::os::unix::process::CommandExt;
            c.pre_exec(|| {
                nix::sys::signal::signal(
                    nix::sys::signal::Signal::SIGHUP,
                    nix::sys::signal::SigHandler::SigDfl,
                )
                .map(drop)
                .map_err(std::io::Error::from)
            });
        }
        let mut child = c
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start mlxcelctl serve");
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let served = Served {
            child,
            dir,
            port,
            log,
            env: all,
        };
        wait_until(
            Duration::from_secs(180),
            "the stack answered /health with 200",
            || http::request(port, "GET", "/health", None).is_ok_and(|(s, _)| s == 200),
        );
        served
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    fn run_ctl(&self, args: &[&str]) -> std::process::Output {
        Command::new(bin("mlxcelctl"))
            .args(args)
            .arg("--socket-dir")
            .arg(self.dir.path())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .output()
            .expect("mlxcelctl")
    }

    /// Runs `mlxcelctl args...` against this stack; returns its stdout parsed as JSON.
    pub fn ctl_json(&self, args: &[&str]) -> Value {
        serde_json::from_slice(&self.run_ctl(args).stdout).unwrap_or(Value::Null)
    }

    /// Runs `mlxcelctl args...` against this stack, which must succeed; returns its stdout.
    pub fn ctl(&self, args: &[&str]) -> String {
        let out = self.run_ctl(args);
        assert!(
            out.status.success(),
            "mlxcelctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn status(&self) -> Value {
        self.ctl_json(&["status", "--json"])
    }

    pub fn cache_stats(&self) -> Value {
        self.ctl_json(&["cache", "stats", "--json"])
    }

    /// The pid of `name` when it is up.
    pub fn pid(&self, name: &str) -> Option<i32> {
        pid_of(&self.status(), name)
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        // SIGTERM lets serve stop its children; SIGKILL after a while if it does not.
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn pid_of(status: &Value, name: &str) -> Option<i32> {
    status["processes"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == name && p["up"] == true)?["pid"]
        .as_i64()
        .map(|p| p as i32)
}

pub fn kill(pid: i32, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal).expect("signal");
}
