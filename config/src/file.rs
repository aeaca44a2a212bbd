//! The configuration file: `$MLXCEL_CONFIG`, else `$XDG_CONFIG_HOME/mlxcel/config.toml`, else
//! `~/.config/mlxcel/config.toml`. Every key is checked when the file is read: an unknown key or
//! a bad value is an error that names the key, the file and what was expected.

use std::path::{Path, PathBuf};

use mlxcel_ipc::size::parse_size;

use crate::keys::{Key, Kind, Section, find, keys_of};

/// Why the configuration could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the configuration file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not valid TOML: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("{path}: unknown key `{key}` in {section} (known: {known})")]
    UnknownKey {
        path: PathBuf,
        section: Section,
        key: String,
        known: String,
    },
    #[error("{path}: `{key}` in {section} must be {expected}, got {got}")]
    BadValue {
        path: PathBuf,
        section: Section,
        key: String,
        expected: &'static str,
        got: String,
    },
}

/// One value set in the file.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Where it was written (a top-level key may be repeated in a process's table).
    pub section: Section,
    pub key: &'static Key,
    /// The value as the flag takes it.
    pub value: String,
}

/// A parsed, checked configuration file.
#[derive(Debug, Clone)]
pub struct ConfigFile {
    pub path: PathBuf,
    pub entries: Vec<Entry>,
}

/// Where the configuration file is looked for.
pub fn default_path() -> Option<PathBuf> {
    if let Some(p) = crate::process_env::config_file() {
        return Some(p);
    }
    let config_home = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(config_home.join("mlxcel/config.toml"))
}

impl ConfigFile {
    /// Reads the file at [`default_path`]: `None` when there is none (a file named by
    /// `MLXCEL_CONFIG` must exist).
    pub fn load() -> Result<Option<ConfigFile>, ConfigError> {
        let Some(path) = default_path() else {
            return Ok(None);
        };
        let explicit = crate::process_env::config_file().is_some();
        match std::fs::read_to_string(&path) {
            Ok(text) => ConfigFile::parse(&path, &text).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => Ok(None),
            Err(source) => Err(ConfigError::Read { path, source }),
        }
    }

    /// Parses and checks `text` (read from `path`).
    pub fn parse(path: &Path, text: &str) -> Result<ConfigFile, ConfigError> {
        let table: toml::Table =
            text.parse()
                .map_err(|e: toml::de::Error| ConfigError::Syntax {
                    path: path.to_path_buf(),
                    message: e.to_string(),
                })?;
        let mut entries = Vec::new();
        for (name, value) in &table {
            match (value, Section::from_table(name)) {
                (toml::Value::Table(inner), Some(section)) => {
                    for (name, value) in inner {
                        entries.push(entry(path, section, name, value)?);
                    }
                }
                _ => entries.push(entry(path, Section::Common, name, value)?),
            }
        }
        Ok(ConfigFile {
            path: path.to_path_buf(),
            entries,
        })
    }

    /// The value `process` gets for `key` from the file, and where it was written: the
    /// process's own table first, then the top level.
    pub fn value(&self, process: Section, key: &Key) -> Option<&Entry> {
        let of = |section: Section| {
            self.entries.iter().find(|e| {
                e.section == section && e.key.name == key.name && e.key.section == key.section
            })
        };
        of(process).or_else(|| of(Section::Common))
    }
}

fn entry(
    path: &Path,
    section: Section,
    name: &str,
    value: &toml::Value,
) -> Result<Entry, ConfigError> {
    let Some(key) = find(section, name) else {
        let known: Vec<&str> = match section {
            Section::Common => {
                let mut k: Vec<&str> = keys_of(Section::Common).map(|k| k.name).collect();
                k.extend(Section::PROCESSES.iter().map(|s| s.table()));
                k
            }
            s => keys_of(s)
                .filter(|k| k.name != "socket-dir")
                .map(|k| k.name)
                .collect(),
        };
        return Err(ConfigError::UnknownKey {
            path: path.to_path_buf(),
            section,
            key: name.to_string(),
            known: known.join(", "),
        });
    };
    let bad = |got: String| ConfigError::BadValue {
        path: path.to_path_buf(),
        section,
        key: name.to_string(),
        expected: key.kind.expected(),
        got,
    };
    let text = match value {
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(i) if !matches!(key.kind, Kind::Text | Kind::Secret) => i.to_string(),
        toml::Value::Float(f) if key.kind == Kind::Number => f.to_string(),
        toml::Value::Boolean(b) if key.kind == Kind::Switch => {
            if *b { "on" } else { "off" }.to_string()
        }
        other => return Err(bad(format!("{} `{other}`", other.type_str()))),
    };
    if !is_valid(key.kind, &text) {
        return Err(bad(format!("`{text}`")));
    }
    Ok(Entry {
        section,
        key,
        value: text,
    })
}

/// `on`/`off` (also `true`/`false`, `yes`/`no`, `1`/`0`) as a flag's value.
pub fn parse_switch(text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" | "1" => Ok(true),
        "off" | "false" | "no" | "0" => Ok(false),
        _ => Err(format!("`{text}` is neither on nor off")),
    }
}

/// Whether `text` is a valid value of `kind`.
pub fn is_valid(kind: Kind, text: &str) -> bool {
    let t = text.trim();
    match kind {
        Kind::Size => parse_size(t).is_ok(),
        Kind::SizeOrAuto => t == "auto" || parse_size(t).is_ok(),
        Kind::Duration => humantime::parse_duration(t).is_ok(),
        Kind::DurationOrOff => {
            matches!(t, "off" | "none" | "0") || humantime::parse_duration(t).is_ok()
        }
        Kind::Count => t.parse::<u64>().is_ok_and(|n| n >= 1),
        Kind::Port => t.parse::<u16>().is_ok_and(|n| n >= 1),
        Kind::Number => t.parse::<f64>().is_ok_and(f64::is_finite),
        Kind::Whole => t.parse::<u64>().is_ok(),
        Kind::WholeOrAuto => t == "auto" || t.parse::<u64>().is_ok(),
        Kind::Switch => parse_switch(t).is_ok(),
        Kind::Text | Kind::Secret => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ConfigFile, ConfigError> {
        ConfigFile::parse(Path::new("/etc/x.toml"), text)
    }

    #[test]
    fn values_are_read_from_the_top_level_and_the_process_tables() {
        let f = parse(
            "log-level = \"warn\"\nsocket-dir = \"/tmp/s\"\n\
             [cachemgr]\ncapacity-bytes = \"1GiB\"\nidle-ttl = \"off\"\n\
             [daemon]\nlog-level = \"debug\"\nblock-tokens = 16\n\
             [frontend]\nport = 9000\n",
        )
        .unwrap();
        let get = |process, section, name| {
            let key = find(section, name).unwrap();
            f.value(process, key).map(|e| e.value.clone())
        };
        assert_eq!(
            get(Section::Cachemgr, Section::Cachemgr, "capacity-bytes").as_deref(),
            Some("1GiB")
        );
        assert_eq!(
            get(Section::Daemon, Section::Common, "log-level").as_deref(),
            Some("debug")
        );
        assert_eq!(
            get(Section::Frontend, Section::Common, "log-level").as_deref(),
            Some("warn")
        );
        assert_eq!(
            get(Section::Daemon, Section::Daemon, "block-tokens").as_deref(),
            Some("16")
        );
        assert_eq!(
            get(Section::Frontend, Section::Frontend, "port").as_deref(),
            Some("9000")
        );
        assert_eq!(
            get(Section::Frontend, Section::Common, "socket-dir").as_deref(),
            Some("/tmp/s")
        );
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key_and_the_file() {
        let e = parse("[daemon]\nkv-pol-bytes = \"1GiB\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown key `kv-pol-bytes` in [daemon]"), "{e}");
        assert!(e.contains("kv-pool-bytes"), "{e}");
        assert!(e.contains("/etc/x.toml"), "{e}");
        let e = parse("[cachemgr]\ncapacity-bytes = \"lots\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`capacity-bytes` in [cachemgr] must be a size"),
            "{e}"
        );
        assert!(e.contains("`lots`"), "{e}");
        let e = parse("[frontend]\nport = 70000\n").unwrap_err().to_string();
        assert!(e.contains("`port` in [frontend] must be a TCP port"), "{e}");
        let e = parse("[frontend]\nhost = true\n").unwrap_err().to_string();
        assert!(e.contains("got boolean `true`"), "{e}");
        let e = parse("colour = \"red\"\n").unwrap_err().to_string();
        assert!(e.contains("unknown key `colour` in top level"), "{e}");
        let e = parse("[daemon]\nsocket-dir = \"/x\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown key `socket-dir` in [daemon]"), "{e}");
        let e = parse("[daemon\n").unwrap_err().to_string();
        assert!(e.contains("not valid TOML"), "{e}");
    }
}
