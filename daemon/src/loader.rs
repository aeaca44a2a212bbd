//! Opening a model path: a `.gguf` file or an MLX / Hugging Face safetensors directory.

use std::path::Path;
use std::time::Instant;

use crate::device::{DeviceChoice, Placement};
use crate::model::Model;
use crate::model::gguf::{self, GgufNames};
use crate::model::safetensors;
use crate::tokenizer::TextInfo;
use crate::{EngineError, Result};

/// A model ready to run, with its tokenizer facts.
pub struct Loaded {
    pub model: Model,
    pub text: TextInfo,
    /// The model's identity (file stem).
    pub model_id: String,
}

/// Loads the model at `path` onto the GPU if MLX has one, else the CPU.
pub fn load(path: &Path) -> Result<Loaded> {
    load_on(path, DeviceChoice::Auto)
}

/// Loads the model at `path` onto the device `choice` asks for ([`Placement::choose`]).
pub fn load_on(path: &Path, choice: DeviceChoice) -> Result<Loaded> {
    let placement = Placement::choose(choice).map_err(EngineError::Request)?;
    load_placed(path, placement)
}

/// Loads the model at `path` with `placement` (its device already MLX's default).
pub fn load_placed(path: &Path, placement: Placement) -> Result<Loaded> {
    let started = Instant::now();
    let backend = crate::backend::for_placement(placement);
    let shown = path.display().to_string();
    let is_gguf = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    let (model, text) = if path.is_dir() {
        let (config, mut weights, names) = safetensors::load(path)?;
        let text = TextInfo::from_hf_dir(path, config.context_length)?;
        (Model::build(config, &mut weights, &names, backend)?, text)
    } else if is_gguf || !path.exists() {
        let mut g = gguf::load(path)?;
        let text = TextInfo::from_gguf(&g.vocab)?;
        (
            Model::build(g.config, &mut g.weights, &GgufNames, backend)?,
            text,
        )
    } else {
        return Err(EngineError::Model {
            path: shown,
            reason: "not a .gguf file or a model directory (config.json + *.safetensors)".into(),
        });
    };
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
