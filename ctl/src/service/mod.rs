//! One typed description of the three services, from which launchd agents (macOS) and systemd
//! user units (Linux) are generated, so the two can never drift apart.
//!
//! - [`launchd`]: agents in `~/Library/LaunchAgents/com.mlxcel.<name>.plist`.
//! - [`systemd`]: units in `~/.config/systemd/user/mlxcel-<name>.service`.

pub mod launchd;
pub mod systemd;

use std::path::{Path, PathBuf};
use std::time::Duration;

/// One of the three processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Process {
    Cachemgr,
    Daemon,
    Frontend,
}

impl Process {
    /// In start order: each needs the ones before it.
    pub const ALL: [Process; 3] = [Process::Cachemgr, Process::Daemon, Process::Frontend];

    pub fn name(self) -> &'static str {
        match self {
            Process::Cachemgr => "cachemgr",
            Process::Daemon => "daemon",
            Process::Frontend => "frontend",
        }
    }

    pub fn binary(self) -> &'static str {
        match self {
            Process::Cachemgr => "mlxcel-cachemgr",
            Process::Daemon => "mlxcel-daemon",
            Process::Frontend => "mlxcel-frontend",
        }
    }

    fn description(self) -> &'static str {
        match self {
            Process::Cachemgr => "mlxcel cache manager (KV prompt cache ledger)",
            Process::Daemon => "mlxcel inference daemon (MLX)",
            Process::Frontend => "mlxcel HTTP front end (OpenAI-compatible API)",
        }
    }

    /// The processes this one is ordered after.
    pub fn after(self) -> &'static [Process] {
        match self {
            Process::Cachemgr => &[],
            Process::Daemon => &[Process::Cachemgr],
            Process::Frontend => &[Process::Daemon],
        }
    }
}

/// How launchd should schedule a process (its `ProcessType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// The default.
    Standard,
    /// Not throttled: the inference daemon's latency is what users feel.
    Interactive,
}

/// Everything a service manager needs to run one process.
#[derive(Debug, Clone)]
pub struct ServiceSpec {
    pub process: Process,
    /// `com.mlxcel.<name>` (launchd label; systemd units are `mlxcel-<name>.service`).
    pub label: String,
    pub description: &'static str,
    /// Absolute path of the program.
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Where launchd writes stdout and stderr (systemd uses the journal).
    pub stdout_log: PathBuf,
    pub stderr_log: PathBuf,
    /// Restart when it exits with failure (not after a clean stop).
    pub restart_on_failure: bool,
    /// The shortest time between restarts.
    pub throttle: Duration,
    /// How long a stop may take before the manager kills it.
    pub stop_timeout: Duration,
    pub priority: Priority,
    pub after: Vec<Process>,
}

/// Where things go for one user.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Directory of the mlxcel binaries.
    pub bin_dir: PathBuf,
    /// The user's home directory.
    pub home: PathBuf,
    /// Environment passed to every service (e.g. `MLXCEL_CONFIG`, `MLXCEL_SOCKET_DIR`).
    pub env: Vec<(String, String)>,
}

impl Layout {
    /// `~/Library/Logs/mlxcel` (launchd's log directory).
    pub fn log_dir(&self) -> PathBuf {
        self.home.join("Library/Logs/mlxcel")
    }
}

/// The three services, in start order.
pub fn services(layout: &Layout) -> Vec<ServiceSpec> {
    Process::ALL.into_iter().map(|p| spec(p, layout)).collect()
}

fn spec(process: Process, layout: &Layout) -> ServiceSpec {
    let logs = layout.log_dir();
    ServiceSpec {
        process,
        label: format!("com.mlxcel.{}", process.name()),
        description: process.description(),
        program: layout.bin_dir.join(process.binary()),
        args: Vec::new(),
        env: layout.env.clone(),
        stdout_log: logs.join(format!("{}.log", process.name())),
        stderr_log: logs.join(format!("{}.err.log", process.name())),
        restart_on_failure: true,
        throttle: Duration::from_secs(5),
        // Each process stops well inside launchd's 20 s.
        stop_timeout: Duration::from_secs(20),
        priority: match process {
            Process::Daemon => Priority::Interactive,
            _ => Priority::Standard,
        },
        after: process.after().to_vec(),
    }
}

/// The directory of the running `mlxcelctl` (the other binaries are built next to it).
pub fn default_bin_dir() -> Option<PathBuf> {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout {
            bin_dir: PathBuf::from("/opt/mlx cel/bin"),
            home: PathBuf::from("/Users/ada"),
            env: vec![("MLXCEL_CONFIG".into(), "/etc/mlxcel.toml".into())],
        }
    }

    #[test]
    fn plists_parse_and_carry_the_launchd_keys() {
        for spec in services(&layout()) {
            let xml = launchd::plist(&spec).unwrap();
            let v: plist::Value = plist::from_bytes(xml.as_bytes()).expect("a valid plist");
            let d = v.as_dictionary().unwrap();
            let name = spec.process.name();
            assert_eq!(
                d["Label"].as_string(),
                Some(format!("com.mlxcel.{name}").as_str())
            );
            let argv = d["ProgramArguments"].as_array().unwrap();
            assert_eq!(
                argv[0].as_string(),
                Some(format!("/opt/mlx cel/bin/{}", spec.process.binary()).as_str())
            );
            let keep = d["KeepAlive"].as_dictionary().unwrap();
            assert_eq!(keep["SuccessfulExit"].as_boolean(), Some(false));
            let kind = d["ProcessType"].as_string().unwrap();
            let want = if name == "daemon" {
                "Interactive"
            } else {
                "Standard"
            };
            assert_eq!(kind, want);
            assert_eq!(d["ThrottleInterval"].as_unsigned_integer(), Some(5));
            assert_eq!(d["RunAtLoad"].as_boolean(), Some(true));
            assert_eq!(
                d["StandardOutPath"].as_string(),
                Some(format!("/Users/ada/Library/Logs/mlxcel/{name}.log").as_str())
            );
            assert_eq!(
                d["StandardErrorPath"].as_string(),
                Some(format!("/Users/ada/Library/Logs/mlxcel/{name}.err.log").as_str())
            );
            let env = d["EnvironmentVariables"].as_dictionary().unwrap();
            assert_eq!(env["MLXCEL_CONFIG"].as_string(), Some("/etc/mlxcel.toml"));
            assert_eq!(
                launchd::plist_path(&layout().home, &spec),
                PathBuf::from(format!(
                    "/Users/ada/Library/LaunchAgents/com.mlxcel.{name}.plist"
                ))
            );
        }
    }

    #[test]
    fn systemd_units_order_the_processes_and_restart_on_failure() {
        let specs = services(&layout());
        let units: Vec<String> = specs.iter().map(systemd::unit).collect();
        for u in &units {
            assert!(u.contains("\nRestart=on-failure\n"), "{u}");
            assert!(u.contains("\nTimeoutStopSec=20\n"), "{u}");
            assert!(u.contains("\nWantedBy=default.target\n"), "{u}");
            assert!(
                u.contains("\nEnvironment=MLXCEL_CONFIG=/etc/mlxcel.toml\n"),
                "{u}"
            );
        }
        assert!(units[0].contains("ExecStart=\"/opt/mlx cel/bin/mlxcel-cachemgr\"\n"));
        assert!(!units[0].contains("After="));
        assert!(units[1].contains("After=mlxcel-cachemgr.service\n"));
        assert!(units[2].contains("After=mlxcel-daemon.service\n"));
    }

    /// `systemd-analyze verify` accepts the units (where the tool exists and the programs do).
    #[test]
    fn systemd_analyze_verifies_the_units() {
        let Ok(out) = std::process::Command::new("systemd-analyze")
            .arg("--version")
            .output()
        else {
            eprintln!("systemd-analyze is not installed here; skipped");
            return;
        };
        assert!(out.status.success());
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        for p in Process::ALL {
            // verify checks that ExecStart's program exists and is executable.
            std::fs::copy("/bin/true", bin.join(p.binary())).unwrap();
        }
        let layout = Layout {
            bin_dir: bin,
            home: dir.path().to_path_buf(),
            env: Vec::new(),
        };
        let mut paths = Vec::new();
        for spec in services(&layout) {
            let path = systemd::unit_path(&dir.path().join("config"), &spec);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, systemd::unit(&spec)).unwrap();
            paths.push(path);
        }
        let out = std::process::Command::new("systemd-analyze")
            .arg("verify")
            .args(&paths)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        // Only complaints about our units count (the host's own units may be untidy).
        let ours: Vec<&str> = stderr.lines().filter(|l| l.contains("mlxcel-")).collect();
        assert!(out.status.success() && ours.is_empty(), "{stderr}");
    }
}
