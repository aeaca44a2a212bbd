//! Landing: a constrained answer finishes within its token limit. A grammar can be unbounded
//! (an array of any length, a string of any length), and a small model can run on in one until
//! the limit cuts it, leaving JSON that does not parse. In its last [`LANDING_TOKENS`] tokens a
//! constrained answer is steered to land: among the tokens its grammar allows, the end of the
//! turn if allowed, else tokens that close a string, an array or an object, else separators
//! (the next required item), else anything that opens nothing new.

use llguidance::toktrie::{SimpleVob, TokTrie};

/// Tokens before the limit at which an answer starts to land.
pub const LANDING_TOKENS: usize = 32;

/// The vocabulary's tokens by what they do to JSON-like structure.
pub struct Landing {
    /// One `"`, and no `,`, `:`, `{` or `[` (a string ends and nothing new starts).
    quotes: SimpleVob,
    /// `}` or `]`, and no `"`, `,`, `:`, `{` or `[`.
    brackets: SimpleVob,
    /// `,` or `:`, and no `{` or `[`.
    separators: SimpleVob,
    /// Contain `{` or `[`.
    openers: SimpleVob,
    eos: SimpleVob,
}

impl Landing {
    pub fn new(trie: &TokTrie) -> Self {
        let n = trie.vocab_size();
        let mut sets = [(); 4].map(|_| SimpleVob::alloc(n));
        for t in 0..n as u32 {
            let bytes = trie.token(t);
            if bytes.first() == Some(&TokTrie::SPECIAL_TOKEN_MARKER) {
                continue;
            }
            let count = |c: u8| bytes.iter().filter(|&&b| b == c).count();
            let goes_on = count(b',') + count(b':') > 0;
            let set = if count(b'{') + count(b'[') > 0 {
                3
            } else if count(b'"') == 1 && !goes_on {
                0
            } else if count(b'"') == 0 && !goes_on && count(b'}') + count(b']') > 0 {
                1
            } else if goes_on {
                2
            } else {
                continue;
            };
            sets[set].allow_token(t);
        }
        let [quotes, brackets, separators, openers] = sets;
        Self {
            quotes,
            brackets,
            separators,
            openers,
            eos: trie.eos_token_set(),
        }
    }

    /// Narrows `mask` (the tokens a grammar allows) to the first non-empty of: the end of the
    /// turn, string ends, bracket closes, separators, what opens nothing.
    pub fn narrow(&self, mask: &mut SimpleVob) {
        for tier in [&self.eos, &self.quotes, &self.brackets, &self.separators] {
            let mut m = mask.clone();
            m.and(tier);
            if !m.is_zero() {
                *mask = m;
                return;
            }
        }
        let mut m = mask.clone();
        m.sub(&self.openers);
        if !m.is_zero() {
            *mask = m;
        }
    }
}
