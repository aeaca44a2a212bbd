//! Constrained decoding: which tokens may come next, so that an answer matches a JSON schema,
//! a forced tool call or another grammar.
//!
//! The grammar engine is `llguidance` (what vLLM and llama.cpp use). Both processes build the
//! same [`Grammars`] from the model's tokenizer: the front end to refuse a grammar that does not
//! compile (a 400 naming the problem) before anything is sent, the daemon to follow each
//! constrained request token by token ([`Constraint`]). A grammar crosses the socket as the
//! JSON of llguidance's `TopLevelGrammar` ([`Grammar`]).
//!
//! - [`vocabulary`]: each token's bytes, read from `tokenizer.json`, and the tokenizer adapter
//!   llguidance asks to tokenize forced text.
//! - [`spec`]: the grammars the APIs ask for (a JSON schema, any JSON object, Lark).
//! - [`constraint`]: one request's matcher, its next-token mask and its logit biases.
//! - [`landing`]: a constrained answer steered to finish within its token limit.

pub mod constraint;
pub mod landing;
pub mod spec;
pub mod vocabulary;

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};

pub use constraint::{Constraint, Verdict, mask_totals};
pub use landing::{LANDING_TOKENS, Landing};
pub use spec::{Grammar, JsonStyle};

/// Why a grammar or a vocabulary was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    /// The tokenizer cannot be read as bytes per token.
    #[error("the tokenizer cannot be used for constrained decoding: {0}")]
    Vocabulary(String),
    /// The grammar (a schema, a Lark text) does not compile.
    #[error("{0}")]
    Compile(String),
    /// The grammar is not the JSON of a grammar (a peer that does not speak our protocol).
    #[error("the grammar is not valid: {0}")]
    Malformed(String),
}

/// The grammar engine for one model's tokenizer: built once (hundreds of milliseconds for a
/// large vocabulary), shared by every request.
#[derive(Clone)]
pub struct Grammars {
    factory: Arc<ParserFactory>,
    landing: Arc<Landing>,
    /// Tokens that end a turn: allowed wherever the grammar may end.
    stop_ids: Arc<Vec<u32>>,
    /// The width of the model's logits (at least the tokenizer's vocabulary).
    vocab: usize,
}

impl Grammars {
    /// The engine for the tokenizer `tokenizer_json` (as `tokenizer.json`), whose turns end with
    /// `stop_ids`, for a model with `model_vocab` logits.
    pub fn new(
        tokenizer_json: &str,
        stop_ids: &[u32],
        model_vocab: usize,
    ) -> Result<Self, GrammarError> {
        let env = vocabulary::token_env(tokenizer_json, stop_ids, model_vocab)?;
        let vocab = env.tok_trie().vocab_size();
        let landing = Arc::new(Landing::new(env.tok_trie()));
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        factory.set_stderr_log_level(0);
        factory.limits_mut().verbose_errors = false;
        Ok(Self {
            factory: Arc::new(factory),
            landing,
            stop_ids: Arc::new(stop_ids.to_vec()),
            vocab,
        })
    }

    /// The width of a mask: the model's logits or the tokenizer's vocabulary, the larger.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Compiles `grammar`: the error says what is wrong with it, in llguidance's words.
    pub fn check(&self, grammar: &Grammar) -> Result<(), GrammarError> {
        self.matcher(grammar.top_level()?).map(drop)
    }

    /// A request's state, constrained by `grammar` (if any) and biased by `bias` (token, added
    /// to its logit).
    pub fn constraint(
        &self,
        grammar: Option<&Grammar>,
        bias: Vec<(u32, f32)>,
    ) -> Result<Constraint, GrammarError> {
        let matcher = match grammar {
            Some(g) => Some(self.matcher(g.top_level()?)?),
            None => None,
        };
        Ok(Constraint::new(
            matcher,
            bias,
            self.stop_ids.clone(),
            self.landing.clone(),
            self.vocab,
        ))
    }

    fn matcher(&self, grammar: TopLevelGrammar) -> Result<Matcher, GrammarError> {
        let matcher = Matcher::new(self.factory.create_parser(grammar));
        match matcher.get_error() {
            Some(e) => Err(GrammarError::Compile(tidy(&e))),
            None => Ok(matcher),
        }
    }
}

/// llguidance's message without its non-verbose marker.
fn tidy(message: &str) -> String {
    message.replace("<non-verbose/>", "").trim().to_string()
}
