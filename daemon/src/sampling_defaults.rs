//! The sampling a request gets for each parameter it omits (temperature, top_p, top_k, min_p,
//! repetition penalty), resolved once at startup, in order:
//! 1. the model's own `generation_config.json`: inside an MLX / Hugging Face directory, or beside
//!    a GGUF file as `<stem>.generation_config.json` (`make setup` writes the default model's,
//!    with its card's settings);
//! 2. the operator's settings (`--default-temperature` ..., their `MLXCEL_DEFAULT_*` variables,
//!    the `[daemon]` keys of the configuration file);
//! 3. the server's defaults ([`SamplingDefaults::default`]: OpenAI's values).
//!
//! An explicit request value always wins (the front end applies these only to omitted fields),
//! so `temperature: 0` stays greedy. A malformed file or an out-of-range value stops the daemon
//! with a message naming the file and the key.

use std::path::{Path, PathBuf};

use mlxcel_ipc::proto::daemon::{SamplingDefaults, limits};
use serde_json::Value;

use crate::{EngineError, Result};

/// The operator's settings; None where not set.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OperatorDefaults {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<u32>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
}

/// The resolved defaults and where each came from (for the startup log).
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    pub values: SamplingDefaults,
    /// `(parameter, source)`: the file's path, `settings` or `server default`.
    pub sources: Vec<(&'static str, String)>,
}

impl Resolved {
    /// One line for the log: `temperature=0.2 (models/x.generation_config.json), ...`.
    pub fn describe(&self) -> String {
        let v = &self.values;
        let values = [
            v.temperature.to_string(),
            v.top_p.to_string(),
            v.top_k.to_string(),
            v.min_p.to_string(),
            v.repetition_penalty.to_string(),
        ];
        self.sources
            .iter()
            .zip(values)
            .map(|((name, source), value)| format!("{name}={value} ({source})"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Where the model's own generation settings live.
pub fn generation_config_path(model: &Path) -> PathBuf {
    if model.is_dir() {
        return model.join("generation_config.json");
    }
    let stem = model
        .file_stem()
        .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned());
    model.with_file_name(format!("{stem}.generation_config.json"))
}

/// Resolves the defaults for the model at `model`.
pub fn resolve(model: &Path, operator: &OperatorDefaults) -> Result<Resolved> {
    let path = generation_config_path(model);
    let file = read(&path)?;
    let mut l = Lookup {
        file: file.as_ref(),
        shown: path.display().to_string(),
        sources: Vec::new(),
    };
    let server = SamplingDefaults::default();
    let o = operator;
    let values = SamplingDefaults {
        temperature: l.number(
            "temperature",
            limits::TEMPERATURE,
            o.temperature,
            server.temperature,
        )?,
        top_p: l.number("top_p", limits::TOP_P, o.top_p, server.top_p)?,
        top_k: l.whole("top_k", o.top_k, server.top_k)?,
        min_p: l.number("min_p", limits::MIN_P, o.min_p, server.min_p)?,
        repetition_penalty: l.number(
            "repetition_penalty",
            limits::REPETITION_PENALTY,
            o.repetition_penalty,
            server.repetition_penalty,
        )?,
    };
    Ok(Resolved {
        values,
        sources: l.sources,
    })
}

/// One parameter at a time: the file, else the operator's setting, else the server's default.
struct Lookup<'a> {
    file: Option<&'a serde_json::Map<String, Value>>,
    shown: String,
    sources: Vec<(&'static str, String)>,
}

impl Lookup<'_> {
    fn in_file(&self, key: &str) -> Result<Option<f64>> {
        file_number(self.file, key).map_err(|e| self.bad(key, e))
    }

    fn bad(&self, key: &str, why: String) -> EngineError {
        EngineError::Model {
            path: self.shown.clone(),
            reason: format!("`{key}` {why}"),
        }
    }

    fn number(
        &mut self,
        key: &'static str,
        range: (f64, f64),
        setting: Option<f64>,
        fallback: f32,
    ) -> Result<f32> {
        let (value, source) = match (self.in_file(key)?, setting) {
            (Some(v), _) => (
                limits::check(v, range).map_err(|e| self.bad(key, e))?,
                self.shown.clone(),
            ),
            (None, Some(v)) => (
                limits::check(v, range).map_err(|e| {
                    EngineError::Request(format!("the default {key} (settings) {e}"))
                })?,
                "settings".to_string(),
            ),
            (None, None) => (fallback, "server default".to_string()),
        };
        self.sources.push((key, source));
        Ok(value)
    }

    /// A count; 0 (or Hugging Face's "no limit" values below 0) means off.
    fn whole(&mut self, key: &'static str, setting: Option<u32>, fallback: u32) -> Result<u32> {
        let (value, source) = match (self.in_file(key)?, setting) {
            (Some(k), _) if k.fract() != 0.0 => {
                return Err(self.bad(key, format!("must be a whole number, got {k}")));
            }
            (Some(k), _) => (k.clamp(0.0, f64::from(u32::MAX)) as u32, self.shown.clone()),
            (None, Some(k)) => (k, "settings".to_string()),
            (None, None) => (fallback, "server default".to_string()),
        };
        self.sources.push((key, source));
        Ok(value)
    }
}

/// The file's JSON object, or None when there is no file.
fn read(path: &Path) -> Result<Option<serde_json::Map<String, Value>>> {
    let err = |reason: String| EngineError::Model {
        path: path.display().to_string(),
        reason,
    };
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(err(format!("cannot be read: {e}"))),
    };
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(map)) => Ok(Some(map)),
        Ok(other) => Err(err(format!(
            "must be a JSON object (generation settings), got {}",
            kind(&other)
        ))),
        Err(e) => Err(err(format!("is not valid JSON: {e}"))),
    }
}

/// A numeric key of the file (null or absent: None).
fn file_number(
    file: Option<&serde_json::Map<String, Value>>,
    key: &str,
) -> std::result::Result<Option<f64>, String> {
    match file.and_then(|f| f.get(key)) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(other) => Err(format!("must be a number, got {}", kind(other))),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests;
