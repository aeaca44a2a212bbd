//! The tokenizer and the text facts around it, built from GGUF metadata.
//!
//! GGUF carries a byte-level BPE (`tokenizer.ggml.model = "gpt2"`) as its token list, merges,
//! token types and a pre-tokenizer name. We rebuild the equivalent `tokenizers::Tokenizer`, which
//! the front end receives serialized as `tokenizer.json`, so it never reads model files.

use std::path::Path;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer};

use crate::{EngineError, Result};

/// GGUF token types (llama.cpp's `llama_token_type`).
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// Llama 3's pre-tokenizer regex (GGUF `llama-bpe`).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's pre-tokenizer regex (GGUF `qwen2`).
const QWEN2_SPLIT: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The vocabulary section of a GGUF file.
#[derive(Debug, Clone, Default)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model` (only `gpt2`, byte-level BPE, is supported).
    pub model: String,
    /// `tokenizer.ggml.pre`: which pre-tokenizer splits text before BPE.
    pub pre: String,
    pub tokens: Vec<String>,
    pub merges: Vec<String>,
    pub token_types: Vec<i32>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub add_bos: bool,
    pub chat_template: Option<String>,
    pub context_length: usize,
}

/// A tokenizer with the facts a front end needs to build prompts and stop generation.
#[derive(Clone)]
pub struct TextInfo {
    pub tokenizer: Tokenizer,
    /// The chat template (Jinja), if the model has one.
    pub chat_template: Option<String>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// Token ids that end generation (eos and end-of-turn control tokens).
    pub stop_ids: Vec<u32>,
    pub context_length: usize,
}

impl TextInfo {
    /// Builds the tokenizer described by `vocab`.
    pub fn from_gguf(vocab: &GgufVocab) -> Result<TextInfo> {
        let err = |m: String| EngineError::Tokenizer(m);
        if vocab.model != "gpt2" {
            return Err(err(format!(
                "GGUF tokenizer model `{}` is not supported (only byte-level BPE, `gpt2`)",
                vocab.model
            )));
        }
        let ids: Vocab = vocab
            .tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let merges = vocab
            .merges
            .iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| err("a merge is not two tokens separated by a space".into()))?;
        let bpe = BPE::builder()
            .vocab_and_merges(ids, merges)
            .build()
            .map_err(|e| err(e.to_string()))?;
        let mut tk = Tokenizer::new(bpe);
        tk.with_pre_tokenizer(Some(pre_tokenizer(&vocab.pre)?));
        tk.with_decoder(Some(ByteLevelDecoder::default()));
        let special: Vec<AddedToken> = vocab
            .token_types
            .iter()
            .enumerate()
            .filter(|(_, t)| matches!(**t, TOKEN_TYPE_CONTROL | TOKEN_TYPE_USER_DEFINED))
            .filter_map(|(i, _)| vocab.tokens.get(i))
            .map(|t| AddedToken::from(t.clone(), true))
            .collect();
        tk.add_special_tokens(&special);
        if vocab.add_bos
            && let Some(bos) = vocab.bos
        {
            let name = vocab
                .tokens
                .get(bos as usize)
                .cloned()
                .ok_or_else(|| err("bos id out of range".into()))?;
            let post = TemplateProcessing::builder()
                .try_single(format!("{name}:0 $A:0"))
                .map_err(|e| err(e.to_string()))?
                .special_tokens(vec![(name, bos)])
                .build()
                .map_err(|e| err(e.to_string()))?;
            tk.with_post_processor(Some(post));
        }
        Ok(TextInfo {
            stop_ids: stop_ids(&tk, vocab.eos.into_iter().collect()),
            tokenizer: tk,
            chat_template: vocab.chat_template.clone(),
            bos: vocab.bos,
            eos: vocab.eos,
            context_length: vocab.context_length,
        })
    }

    /// Reads `tokenizer.json`, `tokenizer_config.json` and (if present) `generation_config.json`
    /// of a Hugging Face / MLX model directory.
    pub fn from_hf_dir(dir: &Path, context_length: usize) -> Result<TextInfo> {
        let err = |m: String| EngineError::Tokenizer(format!("{}: {m}", dir.display()));
        let tk = Tokenizer::from_file(dir.join("tokenizer.json"))
            .map_err(|e| err(format!("tokenizer.json: {e}")))?;
        let read_json = |name: &str| -> Result<Option<serde_json::Value>> {
            match std::fs::read_to_string(dir.join(name)) {
                Ok(t) => serde_json::from_str(&t)
                    .map(Some)
                    .map_err(|e| err(format!("{name}: {e}"))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(err(format!("{name}: {e}"))),
            }
        };
        let cfg = read_json("tokenizer_config.json")?.unwrap_or_default();
        let token_id = |v: &serde_json::Value| -> Option<u32> {
            let name = v
                .as_str()
                .or_else(|| v.get("content").and_then(|c| c.as_str()))?;
            tk.token_to_id(name)
        };
        let bos = cfg.get("bos_token").and_then(token_id);
        let eos = cfg.get("eos_token").and_then(token_id);
        let chat_template = match cfg.get("chat_template") {
            Some(serde_json::Value::String(t)) => Some(t.clone()),
            Some(serde_json::Value::Array(named)) => named
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| {
                    t.get("template")
                        .and_then(|t| t.as_str())
                        .map(str::to_string)
                }),
            _ => None,
        };
        let mut eos_ids: Vec<u32> = eos.into_iter().collect();
        if let Some(gen_cfg) = read_json("generation_config.json")? {
            match gen_cfg.get("eos_token_id") {
                Some(serde_json::Value::Number(n)) => eos_ids.extend(n.as_u64().map(|v| v as u32)),
                Some(serde_json::Value::Array(a)) => {
                    eos_ids.extend(a.iter().filter_map(|v| v.as_u64()).map(|v| v as u32))
                }
                _ => {}
            }
        }
        Ok(TextInfo {
            stop_ids: stop_ids(&tk, eos_ids),
            tokenizer: tk,
            chat_template,
            bos,
            eos,
            context_length,
        })
    }

    /// Token ids of `text`; special-token text (`<|im_start|>`) becomes its token.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`, special tokens included.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer
            .decode(ids, false)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))
    }

    /// The tokenizer serialized as `tokenizer.json`.
    pub fn tokenizer_json(&self) -> Result<String> {
        self.tokenizer
            .to_string(false)
            .map_err(|e| EngineError::Tokenizer(e.to_string()))
    }
}

/// `eos` plus the end-of-turn tokens the vocabulary has as special tokens, each once.
fn stop_ids(tk: &Tokenizer, eos: Vec<u32>) -> Vec<u32> {
    let special = tk.get_added_tokens_decoder();
    let mut ids = Vec::new();
    for id in eos {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    for name in [
        "<|im_end|>",
        "<|eot_id|>",
        "<|end_of_text|>",
        "<|endoftext|>",
        "</s>",
        // Harmony (gpt-oss): the end of an answer, and of a tool call.
        "<|return|>",
        "<|call|>",
        // Gemma.
        "<end_of_turn>",
    ] {
        if let Some(id) = tk.token_to_id(name)
            && special.get(&id).is_some_and(|t| t.special)
            && !ids.contains(&id)
        {
            ids.push(id);
        }
    }
    ids
}

/// The pre-tokenizer llama.cpp uses for GGUF pre-tokenizer `name`.
fn pre_tokenizer(name: &str) -> Result<PreTokenizerWrapper> {
    let split = |pattern: &str| -> Result<PreTokenizerWrapper> {
        let s = Split::new(
            SplitPattern::Regex(pattern.into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
        Ok(Sequence::new(vec![s.into(), ByteLevel::new(false, true, false).into()]).into())
    };
    match name {
        // GPT-2's regex (inside ByteLevel), with every digit its own piece first.
        "smollm" => Ok(Sequence::new(vec![
            Digits::new(true).into(),
            ByteLevel::new(false, true, true).into(),
        ])
        .into()),
        "default" | "gpt2" | "gpt-2" => Ok(ByteLevel::new(false, true, true).into()),
        "llama-bpe" | "llama3" => split(LLAMA3_SPLIT),
        "qwen2" => split(QWEN2_SPLIT),
        other => Err(EngineError::Tokenizer(format!(
            "GGUF pre-tokenizer `{other}` is not supported (supported: smollm, gpt2, llama-bpe, qwen2)"
        ))),
    }
}
