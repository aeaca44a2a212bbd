//! Text ↔ tokens for the loaded model, built from the model info the daemon hands over (the
//! front end never reads model files): tokenizer, chat template, incremental detokenization,
//! stop strings.

pub mod detokenize;
pub mod stop;
pub mod template;

use std::collections::HashMap;
use std::str::FromStr;

use mlxcel_grammar::Grammars;
use mlxcel_ipc::proto::daemon::{ModelInfo, SamplingDefaults};
use tokenizers::Tokenizer;

use crate::chat::reply::Reasoning;
use crate::chat::tool_formats::ToolFormat;
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
    /// What the chat template can do with tools and reasoning.
    pub abilities: TemplateAbilities,
    /// Special tokens kept in the answer's text (markers the reply parser reads, e.g.
    /// `[TOOL_CALLS]`): decoding drops every other special token.
    pub kept_specials: HashMap<u32, String>,
    /// Constrained decoding over this tokenizer (or why it is unavailable), to check grammars.
    pub grammars: Result<Grammars, String>,
    /// Logits per position (the model's vocabulary, at least the tokenizer's).
    pub vocab_size: u32,
}

/// What a chat template does with tools and reasoning, read from its source.
#[derive(Debug, Clone, Copy, Default)]
pub struct TemplateAbilities {
    /// It renders `tools` (and earlier calls and results), in this format.
    pub tool_format: Option<&'static ToolFormat>,
    /// It thinks before it answers, marked so (Qwen3's `<think>`, harmony's analysis).
    pub reasoning: Option<Reasoning>,
}

impl TemplateAbilities {
    pub fn of(source: &str) -> Self {
        let renders_tools = source.contains("tools");
        Self {
            tool_format: renders_tools
                .then(|| ToolFormat::of_template(source))
                .flatten(),
            reasoning: Reasoning::of_template(source),
        }
    }
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
        let abilities = info
            .chat_template
            .as_deref()
            .map(TemplateAbilities::of)
            .unwrap_or_default();
        let grammars = Grammars::new(
            &info.tokenizer_json,
            &info.stop_ids,
            info.vocab_size as usize,
        )
        .map_err(|e| {
            tracing::warn!("constrained decoding is unavailable: {e}");
            e.to_string()
        });
        let kept_specials = kept_specials(&tokenizer, &abilities);
        Ok(Self {
            model_id: info.model_id.clone(),
            context_length: info.context_length,
            template,
            stop_ids,
            tokenizer,
            sampling_defaults: info.sampling_defaults,
            abilities,
            kept_specials,
            grammars,
            vocab_size: info.vocab_size,
        })
    }

    /// The id of the special token written `text`, if there is one.
    pub fn special_token(&self, text: &str) -> Option<u32> {
        special_id(&self.tokenizer, text)
    }

    /// `text` as a Lark literal: a special token by its id (text never matches one), else
    /// the quoted text.
    pub fn lark_literal(&self, text: &str) -> String {
        match self.special_token(text) {
            Some(id) => format!("<[{id}]>"),
            None => crate::chat::grammar::lark_string(text),
        }
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

    /// Token ids of `text` and the byte offset where each ends.
    pub fn encode_with_ends(&self, text: &str) -> Result<(Vec<u32>, Vec<usize>), String> {
        let e = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| format!("tokenization failed: {e}"))?;
        let ends = e.get_offsets().iter().map(|&(_, end)| end).collect();
        Ok((e.get_ids().to_vec(), ends))
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

/// The id of the special token written `text`.
fn special_id(tokenizer: &Tokenizer, text: &str) -> Option<u32> {
    tokenizer
        .get_added_tokens_decoder()
        .into_iter()
        .find(|(_, t)| t.special && t.content == text)
        .map(|(id, _)| id)
}

/// The special tokens the reply parser's markers are written with (`<think>`, `[TOOL_CALLS]`,
/// harmony's `<|channel|>` and `<|message|>`).
fn kept_specials(tokenizer: &Tokenizer, abilities: &TemplateAbilities) -> HashMap<u32, String> {
    let mut markers = vec!["[ARGS]"];
    if let Some(r) = abilities.reasoning {
        markers.extend([r.open, r.close]);
        markers.extend(r.elide);
    }
    if let Some(f) = abilities.tool_format {
        markers.push(f.open);
        markers.extend(f.close);
    }
    tokenizer
        .get_added_tokens_decoder()
        .into_iter()
        .filter(|(_, t)| t.special && t.content.len() > 1)
        .filter(|(_, t)| markers.iter().any(|m| m.contains(t.content.as_str())))
        .map(|(id, t)| (id, t.content))
        .collect()
}
