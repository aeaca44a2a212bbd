//! systemd user units (Linux): one `.service` per process in `~/.config/systemd/user`, ordered
//! cache manager → daemon → front end, managed with `systemctl --user`.

use std::path::{Path, PathBuf};

use super::ServiceSpec;

/// `mlxcel-<name>.service`.
pub fn unit_name(spec: &ServiceSpec) -> String {
    format!("mlxcel-{}.service", spec.process.name())
}

/// `~/.config/systemd/user/<unit>` (or under `$XDG_CONFIG_HOME`).
pub fn unit_path(config_home: &Path, spec: &ServiceSpec) -> PathBuf {
    config_home.join("systemd/user").join(unit_name(spec))
}

/// Quotes one word of a command line for `ExecStart=` (specifiers and variables escaped).
fn quote(word: &str) -> String {
    let escaped = word
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('%', "%%")
        .replace('$', "$$");
    if escaped.contains(char::is_whitespace) || escaped.is_empty() {
        format!("\"{escaped}\"")
    } else {
        escaped
    }
}

/// The unit file's text.
pub fn unit(spec: &ServiceSpec) -> String {
    let mut u = String::new();
    u.push_str("[Unit]\n");
    u.push_str(&format!("Description={}\n", spec.description));
    for dep in &spec.after {
        // Ordered after, and pulled in by, what it needs; each process also retries its own
        // connections, so any start order works.
        let name = format!("mlxcel-{}.service", dep.name());
        u.push_str(&format!("After={name}\nWants={name}\n"));
    }
    u.push_str("\n[Service]\nType=exec\n");
    let mut exec = vec![quote(&spec.program.to_string_lossy())];
    exec.extend(spec.args.iter().map(|a| quote(a)));
    u.push_str(&format!("ExecStart={}\n", exec.join(" ")));
    for (k, v) in &spec.env {
        u.push_str(&format!("Environment={}\n", quote(&format!("{k}={v}"))));
    }
    if spec.restart_on_failure {
        u.push_str("Restart=on-failure\n");
    }
    u.push_str(&format!("RestartSec={}\n", spec.throttle.as_secs()));
    u.push_str(&format!("TimeoutStopSec={}\n", spec.stop_timeout.as_secs()));
    u.push_str("KillSignal=SIGTERM\n");
    u.push_str("\n[Install]\nWantedBy=default.target\n");
    u
}
