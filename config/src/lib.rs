//! mlxcel's configuration: one TOML file read by every process, under `MLXCEL_*` environment
//! variables and command-line flags (flag > environment > file > default).
//!
//! ```toml
//! # ~/.config/mlxcel/config.toml (or the file named by MLXCEL_CONFIG)
//! log-level = "info"          # top level: every process (a process's table may repeat it)
//! [cachemgr]
//! capacity-bytes = "2GiB"
//! [daemon]
//! kv-pool-bytes = "auto"
//! [frontend]
//! port = 8080
//! ```
//!
//! # Layout
//! - [`keys`]: the table of keys (file name = flag name, environment variable, default, kind).
//! - [`file`]: finding, parsing and checking the file (unknown keys and bad values are errors
//!   that name the key).
//! - [`resolve`]: effective values with their sources (`mlxcelctl config show`), and
//!   [`resolve::apply_file_to_env`], which processes call at startup.
//! - [`logging`]: the logger every process installs (stderr, `log-level`, never panics).
//! - [`cli`]: a process's command line, its flags' help from the table.
//! - [`reference`]: the table as Markdown (the README's settings reference).
//! - [`check`]: the test helper that keeps each process's flags equal to the table.
//! - [`process_env`]: the variables that are not settings (the file's path, a lifeline).

pub mod check;
pub mod cli;
pub mod file;
pub mod keys;
pub mod logging;
pub mod process_env;
pub mod reference;
pub mod resolve;

pub use file::{ConfigError, ConfigFile, parse_switch};
pub use keys::{KEYS, Key, Kind, Section};
pub use resolve::{Setting, Source, apply_file_to_env, apply_shared_key_to_env, effective};
