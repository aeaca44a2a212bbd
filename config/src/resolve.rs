//! Effective values: flag > environment > file (the process's table, then the top level) >
//! default. Processes get the file's values through their environment variables
//! ([`apply_file_to_env`]), so their flag parsing applies the precedence by itself.

use std::path::PathBuf;

use serde::Serialize;

use crate::file::{ConfigError, ConfigFile};
use crate::keys::{Key, Kind, Section, keys_of};

/// Where an effective value came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Source {
    Flag,
    Env {
        var: String,
    },
    File {
        path: PathBuf,
        section: String,
    },
    Default,
    /// No value (the key is optional).
    Unset,
}

/// One key's effective value for one process.
#[derive(Debug, Clone, Serialize)]
pub struct Setting {
    pub process: &'static str,
    pub key: &'static str,
    /// `None` for unset keys; secrets print as `(set)`.
    pub value: Option<String>,
    pub source: Source,
}

/// The effective settings of `process` given its flags (`flags`: key name → value, for those
/// given on the command line), the environment (`env`) and the file.
pub fn effective(
    process: Section,
    flags: &[(&str, String)],
    env: &dyn Fn(&str) -> Option<String>,
    file: Option<&ConfigFile>,
) -> Vec<Setting> {
    keys_of(process)
        .map(|key| {
            let (value, source) = resolve(process, key, flags, env, file);
            let value = match (key.kind, value) {
                (Kind::Secret, Some(_)) => Some("(set)".to_string()),
                (_, v) => v,
            };
            Setting {
                process: process.table(),
                key: key.name,
                value,
                source,
            }
        })
        .collect()
}

fn resolve(
    process: Section,
    key: &Key,
    flags: &[(&str, String)],
    env: &dyn Fn(&str) -> Option<String>,
    file: Option<&ConfigFile>,
) -> (Option<String>, Source) {
    if let Some((_, v)) = flags.iter().find(|(name, _)| *name == key.name) {
        return (Some(v.clone()), Source::Flag);
    }
    if let Some(v) = env(key.env).filter(|v| !v.is_empty()) {
        return (
            Some(v),
            Source::Env {
                var: key.env.to_string(),
            },
        );
    }
    if let Some(e) = file.and_then(|f| f.value(process, key).map(|e| (f, e))) {
        let (f, e) = e;
        return (
            Some(e.value.clone()),
            Source::File {
                path: f.path.clone(),
                section: e.section.to_string(),
            },
        );
    }
    match key.default {
        Some(d) => (Some(d.to_string()), Source::Default),
        None => (None, Source::Unset),
    }
}

/// For a process starting up: reads the configuration file and exports each of its values for
/// `process` as the key's environment variable, unless that variable is already set (the
/// environment overrides the file; flags, parsed next, override both). Returns the file's path
/// when one was read.
///
/// Call it first thing in `main`, before any thread exists (it changes the environment).
pub fn apply_file_to_env(process: Section) -> Result<Option<PathBuf>, ConfigError> {
    let Some(file) = ConfigFile::load()? else {
        return Ok(None);
    };
    for key in keys_of(process) {
        let unset = std::env::var_os(key.env).is_none_or(|v| v.is_empty());
        if let (true, Some(entry)) = (unset, file.value(process, key)) {
            // SAFETY: called at the start of `main`, before the process starts any thread, so
            // nothing reads the environment concurrently.
            unsafe { std::env::set_var(key.env, &entry.value) };
        }
    }
    Ok(Some(file.path))
}

/// Also applies `owner`'s key `name` from the file to the environment when unset: a setting
/// another process reads too (the daemon sizes its pool for the cache manager's capacity).
pub fn apply_shared_key_to_env(owner: Section, name: &str) -> Result<(), ConfigError> {
    let Some(file) = ConfigFile::load()? else {
        return Ok(());
    };
    let Some(key) = keys_of(owner).find(|k| k.section == owner && k.name == name) else {
        return Ok(());
    };
    let unset = std::env::var_os(key.env).is_none_or(|v| v.is_empty());
    if let (true, Some(entry)) = (unset, file.value(owner, key)) {
        // SAFETY: as in `apply_file_to_env`, called before any thread starts.
        unsafe { std::env::set_var(key.env, &entry.value) };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn flags_beat_the_environment_which_beats_the_file_which_beats_defaults() {
        let file = ConfigFile::parse(
            Path::new("/c.toml"),
            "log-level = \"warn\"\n[frontend]\nport = 9000\nmax-queue = 5\nmax-body-bytes = \"1MiB\"\napi-key = \"s\"\n",
        )
        .unwrap();
        let env = |var: &str| {
            (var == "MLXCEL_MAX_QUEUE" || var == "MLXCEL_PORT").then(|| "7".to_string())
        };
        let flags = [("port", "1234".to_string())];
        let s = effective(Section::Frontend, &flags, &env, Some(&file));
        let get = |k: &str| s.iter().find(|x| x.key == k).unwrap().clone();
        assert_eq!(
            (get("port").value.as_deref(), get("port").source),
            (Some("1234"), Source::Flag)
        );
        assert_eq!(get("max-queue").value.as_deref(), Some("7"));
        assert_eq!(
            get("max-queue").source,
            Source::Env {
                var: "MLXCEL_MAX_QUEUE".into()
            }
        );
        assert_eq!(get("max-body-bytes").value.as_deref(), Some("1MiB"));
        assert_eq!(
            get("max-body-bytes").source,
            Source::File {
                path: "/c.toml".into(),
                section: "[frontend]".into()
            }
        );
        assert_eq!(
            get("log-level").source,
            Source::File {
                path: "/c.toml".into(),
                section: "top level".into()
            }
        );
        assert_eq!(
            (get("host").value.as_deref(), get("host").source),
            (Some("127.0.0.1"), Source::Default)
        );
        assert_eq!(get("api-key").value.as_deref(), Some("(set)"));
        assert_eq!(get("socket-dir").source, Source::Unset);
    }
}
