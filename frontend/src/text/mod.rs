//! Text ↔ tokens for the loaded model, built from the model info the daemon hands over (the
//! front end never reads model files): tokenizer, chat template, incremental detokenization,
//! stop strings.

pub mod detokenize;
pub mod stop;
pub mod template;

use std::str::FromStr;

use mlxcel_ipc::proto::daemon::{ModelInfo, SamplingDefaults};
use tokenizers::Tokenizer;

use template::{ChatTemplate, TemplateMessage};

/// The loaded model as the front end sees it.
pub struct ModelText {
    pub model_id: String,
    pub context_length: u32,
    pub tokenizer: Tokenizer,
    pub template: Option<ChatTemplate>,
    /// Token ids that end a turn (the daemon stops on them), sorted, no repeats.
    pub stop_ids: Vec<u32>,
    /// Sampling for parameters a request omits (the model's own, as the daemon resolved them).
    pub sampling_defaults: SamplingDefaults,
}

impl ModelText {
    /// Builds the tokenizer and compiles the chat template (the tokenizer JSON is megabytes:
    /// call this off the async threads).
    pub fn new(info: &ModelInfo) -> Result<Self, String> {
        let tokenizer = Tokenizer::from_str(&info.tokenizer_json)
            .map_err(|e| format!("the daemon's tokenizer does not load: {e}"))?;
        let special = |id: Option<u32>| {
            id.and_then(|id| tokenizer.id_to_token(id))
                .unwrap_or_default()
        };
        let template = match &info.chat_template {
            Some(source) => Some(ChatTemplate::new(
                source,
                &special(info.bos),
                &special(info.eos),
            )?),
            None => None,
        };
        let mut stop_ids = info.stop_ids.clone();
        stop_ids.sort_unstable();
        stop_ids.dedup();
        Ok(Self {
            model_id: info.model_id.clone(),
            context_length: info.context_length,
            template,
            stop_ids,
            tokenizer,
            sampling_defaults: info.sampling_defaults,
        })
    }

    /// Renders a conversation with the chat template, ready for the assistant's reply.
    pub fn render_chat(&self, messages: &[TemplateMessage]) -> Result<String, String> {
        match &self.template {
            Some(t) => t.render(messages, true),
            None => Err(format!(
                "the model `{}` has no chat template: use /v1/completions",
                self.model_id
            )),
        }
    }

    /// Token ids of `text`. A rendered chat prompt already holds its special tokens
    /// (`add_special = false`); a raw completion prompt gets the model's (e.g. BOS).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, String> {
        self.tokenizer
            .encode(text, add_special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| format!("tokenization failed: {e}"))
    }

    /// One token's text, for logprobs.
    pub fn token_text(&self, id: u32) -> String {
        detokenize::decode(&self.tokenizer, &[id])
    }
}
