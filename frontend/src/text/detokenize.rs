//! Incremental detokenization: text for each new token, never splitting a UTF-8 character.
//!
//! Byte-level BPE tokens can end mid-character, and some decoders change a token's text by what
//! precedes it (leading spaces). So each step decodes a short window of recent tokens twice —
//! without and with the new ones — and emits the difference once it no longer ends in an
//! incomplete character (U+FFFD).

use tokenizers::Tokenizer;

/// The text of a growing token sequence, handed out piece by piece.
#[derive(Debug, Default)]
pub struct IncrementalDecoder {
    tokens: Vec<u32>,
    /// Start of the window decoded for context.
    prefix_offset: usize,
    /// Tokens before this have been emitted as text.
    read_offset: usize,
}

impl IncrementalDecoder {
    /// Adds `token`; returns the text that became complete (often empty mid-character).
    pub fn push(&mut self, tokenizer: &Tokenizer, token: u32) -> String {
        self.tokens.push(token);
        let prefix = decode(
            tokenizer,
            &self.tokens[self.prefix_offset..self.read_offset],
        );
        let full = decode(tokenizer, &self.tokens[self.prefix_offset..]);
        if full.len() <= prefix.len() || full.ends_with('\u{FFFD}') {
            return String::new();
        }
        let delta = match full.get(prefix.len()..) {
            Some(d) if full.starts_with(&prefix) => d.to_string(),
            // The decoder rewrote the context: emit what differs after the common prefix.
            _ => full.chars().skip(prefix.chars().count()).collect(),
        };
        self.prefix_offset = self.read_offset;
        self.read_offset = self.tokens.len();
        delta
    }

    /// Adds a special token the caller keeps as `literal` (decoding drops special tokens):
    /// the text held back before it, then the literal.
    pub fn push_literal(&mut self, tokenizer: &Tokenizer, token: u32, literal: &str) -> String {
        let mut text = self.flush(tokenizer);
        self.tokens.push(token);
        self.prefix_offset = self.tokens.len();
        self.read_offset = self.tokens.len();
        text.push_str(literal);
        text
    }

    /// The text still held back (an incomplete character at the very end), lossily decoded.
    pub fn flush(&mut self, tokenizer: &Tokenizer) -> String {
        if self.read_offset == self.tokens.len() {
            return String::new();
        }
        let prefix = decode(
            tokenizer,
            &self.tokens[self.prefix_offset..self.read_offset],
        );
        let full = decode(tokenizer, &self.tokens[self.prefix_offset..]);
        self.prefix_offset = self.tokens.len();
        self.read_offset = self.tokens.len();
        full.get(prefix.len()..).unwrap_or_default().to_string()
    }
}

/// Decodes `ids` without special tokens ("" when the ids are out of the vocabulary).
pub fn decode(tokenizer: &Tokenizer, ids: &[u32]) -> String {
    tokenizer.decode(ids, true).unwrap_or_default()
}
