//! The vocabulary as llguidance needs it: every token's bytes (the trie it walks to find which
//! tokens a grammar allows) and a tokenizer for text the grammar forces.
//!
//! Bytes come from `tokenizer.json`: byte-level BPE tokens (GPT-2, Llama 3, Qwen, SmolLM) spell
//! bytes with GPT-2's printable stand-ins; SentencePiece vocabularies with byte fallback (Llama 2,
//! Gemma, Mistral) write `<0xNN>` for raw bytes and `▁` for a space. Special tokens are marked as
//! llguidance expects (a `0xFF` byte first), so text never matches them and a Lark grammar names
//! them as `<|im_end|>`. Logits wider than the vocabulary get placeholder special tokens that no
//! grammar allows.

use std::str::FromStr;
use std::sync::Arc;

use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use serde_json::Value;
use tokenizers::Tokenizer;

use crate::GrammarError;

/// How the vocabulary spells bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spelling {
    /// GPT-2's byte-to-character map.
    ByteLevel,
    /// `<0xNN>` tokens for bytes; `space` stands for ' '.
    ByteFallback { space: char },
}

/// The tokenizer environment llguidance works in for `tokenizer_json`, whose turns end with
/// `stop_ids`, padded to `model_vocab` tokens.
pub fn token_env(
    tokenizer_json: &str,
    stop_ids: &[u32],
    model_vocab: usize,
) -> Result<TokEnv, GrammarError> {
    let bad = |e: String| GrammarError::Vocabulary(e);
    let mut json: Value =
        serde_json::from_str(tokenizer_json).map_err(|e| bad(format!("not JSON: {e}")))?;
    let spelling = spelling(&json)?;
    no_prefix_space(&mut json);
    let tokenizer = Tokenizer::from_str(&json.to_string()).map_err(|e| bad(e.to_string()))?;
    let mut bytes = token_bytes(&tokenizer, spelling)?;
    while bytes.len() < model_vocab {
        bytes.push(special(&format!("<[{}]>", bytes.len())));
    }
    let eos = stop_ids
        .first()
        .copied()
        .ok_or_else(|| bad("the model names no end-of-turn token".into()))?;
    let info = TokRxInfo::new(bytes.len() as u32, eos);
    let trie = TokTrie::from(&info, &bytes).with_eos_tokens(stop_ids);
    Ok(Arc::new(Vocabulary { trie, tokenizer }))
}

/// The tokenizer and its trie.
struct Vocabulary {
    trie: TokTrie,
    tokenizer: Tokenizer,
}

impl TokenizerEnv for Vocabulary {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            self.tokenizer
                .encode(text, false)
                .map(|e| e.get_ids().to_vec())
                .unwrap_or_else(|_| self.trie.greedy_tokenize(text.as_bytes()))
        })
    }
}

fn spelling(json: &Value) -> Result<Spelling, GrammarError> {
    let decoder = &json["decoder"];
    let mut kinds = vec![decoder];
    if let Some(list) = decoder["decoders"].as_array() {
        kinds.extend(list);
    }
    if kinds.iter().any(|d| d["type"] == "ByteLevel") {
        return Ok(Spelling::ByteLevel);
    }
    if kinds.iter().any(|d| d["type"] == "ByteFallback") {
        let space = kinds
            .iter()
            .find(|d| d["type"] == "Replace" && d["content"] == " ")
            .and_then(|d| d["pattern"]["String"].as_str())
            .and_then(|s| {
                let mut chars = s.chars();
                match (chars.next(), chars.next()) {
                    (Some(c), None) => Some(c),
                    _ => None,
                }
            })
            .unwrap_or('▁');
        return Ok(Spelling::ByteFallback { space });
    }
    Err(GrammarError::Vocabulary(format!(
        "its decoder ({}) is neither byte-level nor byte-fallback",
        decoder["type"]
    )))
}

/// Forced text is tokenized where it stands, mid-answer: without the space a SentencePiece or
/// byte-level pre-tokenizer would put before the start of a text.
fn no_prefix_space(json: &mut Value) {
    fn visit(v: &mut Value) {
        match v {
            Value::Object(map) => {
                if map.get("type").and_then(Value::as_str) == Some("Metaspace") {
                    map.insert("prepend_scheme".into(), Value::from("never"));
                    map.insert("add_prefix_space".into(), Value::from(false));
                }
                if map.get("type").and_then(Value::as_str) == Some("ByteLevel") {
                    map.insert("add_prefix_space".into(), Value::from(false));
                }
                if let Some(Value::Array(list)) = map.get_mut("normalizers") {
                    list.retain(|n| n["type"] != "Prepend");
                }
                for child in map.values_mut() {
                    visit(child);
                }
            }
            Value::Array(list) => list.iter_mut().for_each(visit),
            _ => {}
        }
    }
    if json["normalizer"]["type"] == "Prepend" {
        json["normalizer"] = Value::Null;
    }
    visit(&mut json["normalizer"]);
    visit(&mut json["pre_tokenizer"]);
}

/// Each token id's bytes (special tokens marked).
fn token_bytes(tokenizer: &Tokenizer, spelling: Spelling) -> Result<Vec<Vec<u8>>, GrammarError> {
    let size = tokenizer.get_vocab_size(true);
    let added = tokenizer.get_added_tokens_decoder();
    let byte_of = byte_level_map();
    let mut out = Vec::with_capacity(size);
    for id in 0..size as u32 {
        if let Some(token) = added.get(&id) {
            out.push(if token.special {
                special(&token.content)
            } else {
                token.content.as_bytes().to_vec()
            });
            continue;
        }
        let Some(piece) = tokenizer.id_to_token(id) else {
            out.push(special(&format!("<[{id}]>")));
            continue;
        };
        let bytes = match spelling {
            Spelling::ByteLevel => piece
                .chars()
                .map(|c| byte_of.get(&c).copied())
                .collect::<Option<Vec<u8>>>()
                .ok_or_else(|| {
                    GrammarError::Vocabulary(format!(
                        "token {id} ({piece:?}) is not spelled in byte-level characters"
                    ))
                })?,
            Spelling::ByteFallback { space } => match fallback_byte(&piece) {
                Some(b) => vec![b],
                None => piece.replace(space, " ").into_bytes(),
            },
        };
        out.push(bytes);
    }
    Ok(out)
}

/// A special token's bytes: llguidance's marker, then its text.
fn special(text: &str) -> Vec<u8> {
    let mut bytes = vec![TokTrie::SPECIAL_TOKEN_MARKER];
    bytes.extend_from_slice(text.as_bytes());
    bytes
}

/// `<0xNN>` → the byte NN.
fn fallback_byte(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// GPT-2's map from the printable character standing for each byte back to the byte: printable
/// Latin-1 bytes stand for themselves, the rest for 256, 257, ... in byte order.
fn byte_level_map() -> std::collections::HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 256u32;
    let mut map = std::collections::HashMap::with_capacity(256);
    for b in 0..=255u8 {
        let c = if printable(b) {
            char::from(b)
        } else {
            let c = char::from_u32(next).unwrap_or('\u{FFFD}');
            next += 1;
            c
        };
        map.insert(c, b);
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_characters_map_back_to_every_byte() {
        let map = byte_level_map();
        assert_eq!(map.len(), 256);
        assert_eq!(map[&'Ġ'], b' ');
        assert_eq!(map[&'Ċ'], b'\n');
        assert_eq!(map[&'a'], b'a');
    }

    #[test]
    fn fallback_bytes_are_read_from_their_names() {
        assert_eq!(fallback_byte("<0x0A>"), Some(b'\n'));
        assert_eq!(fallback_byte("<0xFF>"), Some(0xFF));
        assert_eq!(fallback_byte("<0x0A"), None);
        assert_eq!(fallback_byte("<s>"), None);
    }
}
