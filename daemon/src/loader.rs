//! Opening a model path: a `.gguf` file (MLX/HF safetensors directories come next).

use std::path::Path;
use std::time::Instant;

use crate::device::Placement;
use crate::model::Model;
use crate::model::gguf::{self, GgufNames};
use crate::tokenizer::TextInfo;
use crate::{EngineError, Result};

/// A model ready to run, with its tokenizer facts.
pub struct Loaded {
    pub model: Model,
    pub text: TextInfo,
    /// The model's identity (file stem).
    pub model_id: String,
}

/// Loads the model at `path` onto the device [`Placement::choose`] picks.
pub fn load(path: &Path) -> Result<Loaded> {
    let started = Instant::now();
    let placement = Placement::choose();
    let is_gguf = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    if !is_gguf {
        return Err(EngineError::Model {
            path: path.display().to_string(),
            reason: "not a .gguf file (safetensors directories are not supported yet)".into(),
        });
    }
    let g = gguf::load(path)?;
    let text = TextInfo::from_gguf(&g.vocab)?;
    let model = Model::build(g.config, &g.weights, &GgufNames, placement)?;
    let model_id = path
        .file_stem()
        .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned());
    tracing::info!(
        model = %model_id, device = %placement.describe(), layers = model.config.layers,
        seconds = started.elapsed().as_secs_f64(), "model loaded"
    );
    Ok(Loaded {
        model,
        text,
        model_id,
    })
}
