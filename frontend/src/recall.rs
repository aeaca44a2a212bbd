//! Why an agent's next turn misses the cache: the last answers' tokens (prompt + answer), so
//! that a prompt which continues one of them but renders its answer differently from the tokens
//! generated (a template that rewrites earlier turns, drops their reasoning, respaces their
//! tool calls) is logged and counted with where it diverged, rather than silently prefilled.

use std::collections::VecDeque;
use std::sync::Mutex;

/// Answers remembered.
const KEPT: usize = 64;

/// One remembered answer.
struct Remembered {
    salt: Option<String>,
    prompt_len: usize,
    tokens: Vec<u32>,
}

/// Where a prompt left an earlier answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Divergence {
    /// Tokens of the answer that the prompt repeats.
    pub kept: usize,
    /// Tokens the answer had.
    pub answer: usize,
}

/// The last answers.
#[derive(Default)]
pub struct Recall {
    answers: Mutex<VecDeque<Remembered>>,
}

impl Recall {
    /// Remembers a finished answer: its prompt and the tokens generated.
    pub fn remember(&self, salt: Option<&str>, prompt: &[u32], generated: &[u32]) {
        if generated.is_empty() {
            return;
        }
        let mut tokens = Vec::with_capacity(prompt.len() + generated.len());
        tokens.extend_from_slice(prompt);
        tokens.extend_from_slice(generated);
        let mut answers = self.answers.lock().unwrap_or_else(|p| p.into_inner());
        if answers.len() == KEPT {
            answers.pop_front();
        }
        answers.push_back(Remembered {
            salt: salt.map(str::to_string),
            prompt_len: prompt.len(),
            tokens,
        });
    }

    /// If `prompt` continues a remembered answer's prompt but not the answer itself, where.
    pub fn diverges(&self, salt: Option<&str>, prompt: &[u32]) -> Option<Divergence> {
        let answers = self.answers.lock().unwrap_or_else(|p| p.into_inner());
        answers
            .iter()
            .rev()
            .filter(|a| a.salt.as_deref() == salt && prompt.len() > a.prompt_len)
            .filter(|a| prompt[..a.prompt_len] == a.tokens[..a.prompt_len])
            .map(|a| {
                let common = a.tokens[a.prompt_len..]
                    .iter()
                    .zip(&prompt[a.prompt_len..])
                    .take_while(|(x, y)| x == y)
                    .count();
                (common, a.tokens.len() - a.prompt_len)
            })
            .max_by_key(|&(common, _)| common)
            .filter(|&(common, answer)| common < answer)
            .map(|(kept, answer)| Divergence { kept, answer })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_that_repeats_an_answer_is_fine_and_one_that_rewrites_it_is_caught() {
        let r = Recall::default();
        r.remember(None, &[1, 2, 3], &[7, 8, 9]);
        assert_eq!(r.diverges(None, &[1, 2, 3, 7, 8, 9, 0, 4]), None);
        assert_eq!(
            r.diverges(None, &[1, 2, 3, 7, 5, 9, 0, 4]),
            Some(Divergence { kept: 1, answer: 3 })
        );
        // Another conversation, another tenant: nothing to say.
        assert_eq!(r.diverges(None, &[4, 2, 3, 7, 5]), None);
        assert_eq!(r.diverges(Some("t"), &[1, 2, 3, 7, 5, 9]), None);
    }
}
