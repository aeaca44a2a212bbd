//! The environment variables a process reads that are not settings of the key table: where the
//! configuration file is (`MLXCEL_CONFIG`) and the lifeline a supervisor hands its children
//! (`mlxcel_ipc::lifeline`). With the table's own variables ([`crate::resolve`]), every
//! `MLXCEL_*` variable a process reads is read in this crate.

use std::path::PathBuf;

/// The variable naming the configuration file.
pub const CONFIG_FILE: &str = "MLXCEL_CONFIG";

/// The configuration file `MLXCEL_CONFIG` names, if it is set and not empty.
pub fn config_file() -> Option<PathBuf> {
    std::env::var_os(CONFIG_FILE)
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

/// The inherited descriptor of a supervisor's lifeline (`mlxcel_ipc::lifeline::ENV`), if this
/// process was started by one.
pub fn lifeline_fd() -> Option<i32> {
    std::env::var(mlxcel_ipc::lifeline::ENV)
        .ok()
        .and_then(|v| v.parse().ok())
}

/// The value of the environment variable `name` (a key's, for `mlxcelctl config show`).
pub fn variable(name: &str) -> Option<String> {
    std::env::var(name).ok()
}
