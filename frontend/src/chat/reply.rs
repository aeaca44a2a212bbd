//! An answer as it streams, split into what each API reports apart: reasoning (`<think>…</think>`),
//! text, and tool calls (in the model's [`ToolFormat`]). Text that may be the start of a marker
//! is held back until the next piece decides; a call is held until it is complete. A call that
//! does not parse is text, never lost.

use super::ids;
use super::tool_formats::ToolFormat;
use super::{Tool, ToolCall};

/// What the parser makes of the text.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Reasoning(String),
    Text(String),
    Call(ToolCall),
}

/// Where reasoning starts and ends in an answer.
const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";

#[derive(Debug, Clone, PartialEq)]
enum State {
    Answer,
    Thinking,
    /// Inside a call: the text since its opening marker.
    Call(String),
}

/// Splits one answer.
pub struct ReplyParser {
    /// The format calls come in, and the request's tools (none: calls are not looked for).
    tools: Option<(&'static ToolFormat, Vec<Tool>)>,
    /// Whether `<think>` opens reasoning (false: it stays in the text).
    split_reasoning: bool,
    state: State,
    held: String,
    /// Nothing but blanks in the answer so far.
    at_start: bool,
    /// Blanks before the answer (after reasoning) are dropped.
    after_reasoning: bool,
    /// The prefix of call ids (`call`, `toolu`).
    id_prefix: &'static str,
    calls: usize,
}

impl ReplyParser {
    /// A parser for an answer whose calls come as `tools` says; `thinking` when the prompt
    /// ends inside reasoning (the template opened `<think>`).
    pub fn new(
        tools: Option<(&'static ToolFormat, Vec<Tool>)>,
        split_reasoning: bool,
        thinking: bool,
        id_prefix: &'static str,
    ) -> Self {
        Self {
            tools,
            split_reasoning,
            state: if thinking && split_reasoning {
                State::Thinking
            } else {
                State::Answer
            },
            held: String::new(),
            at_start: true,
            after_reasoning: false,
            id_prefix,
            calls: 0,
        }
    }

    /// Calls found so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Whether text arriving now is reasoning.
    pub fn thinking(&self) -> bool {
        self.state == State::Thinking
    }

    /// The parts `text` completes.
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            let progressed = match std::mem::replace(&mut self.state, State::Answer) {
                State::Thinking => self.think(&mut out),
                State::Answer => self.answer(&mut out),
                State::Call(body) => self.call(body, &mut out),
            };
            if !progressed {
                return out;
            }
        }
    }

    /// The parts left at the end of the answer.
    pub fn finish(&mut self) -> Vec<Part> {
        let mut out = self.push("");
        let rest = std::mem::take(&mut self.held);
        match std::mem::replace(&mut self.state, State::Answer) {
            State::Thinking => out.push(Part::Reasoning(rest)),
            State::Call(body) => {
                let body = body + &rest;
                match self.tools.as_ref() {
                    Some((f, _)) if f.close.is_none() => self.calls_or_text(&body, "", &mut out),
                    Some((f, _)) => out.push(Part::Text(format!("{}{body}", f.open))),
                    None => out.push(Part::Text(body)),
                }
            }
            State::Answer if self.calls > 0 && rest.trim().is_empty() => {}
            State::Answer => out.push(Part::Text(rest)),
        }
        out.retain(|p| !matches!(p, Part::Text(t) | Part::Reasoning(t) if t.is_empty()));
        out
    }

    fn think(&mut self, out: &mut Vec<Part>) -> bool {
        if let Some(at) = self.held.find(THINK_CLOSE) {
            out.push(Part::Reasoning(self.held[..at].to_string()));
            self.held.drain(..at + THINK_CLOSE.len());
            self.after_reasoning = true;
            self.state = State::Answer;
            return true;
        }
        let keep = partial_suffix(&self.held, THINK_CLOSE);
        let cut = self.held.len() - keep;
        if cut > 0 {
            out.push(Part::Reasoning(self.held[..cut].to_string()));
            self.held.drain(..cut);
        }
        self.state = State::Thinking;
        false
    }

    fn answer(&mut self, out: &mut Vec<Part>) -> bool {
        if self.after_reasoning {
            let blanks = self.held.len() - self.held.trim_start().len();
            self.held.drain(..blanks);
            if self.held.is_empty() {
                return false;
            }
            self.after_reasoning = false;
        }
        let lead = self.held.len() - self.held.trim_start().len();
        let mut markers: Vec<(&'static str, bool)> = Vec::new();
        if self.split_reasoning && self.at_start {
            markers.push((THINK_OPEN, true));
        }
        if let Some((f, _)) = &self.tools
            && (!f.open_at_start || self.at_start)
        {
            markers.push((f.open, false));
        }
        let found = markers
            .iter()
            .filter_map(|&(m, think)| {
                let at = self.held.find(m)?;
                // A marker that counts only at the start must come before any text.
                let ok = !(think
                    || self
                        .tools
                        .as_ref()
                        .is_some_and(|(f, _)| f.open == m && f.open_at_start))
                    || at == lead;
                ok.then_some((at, m, think))
            })
            .min_by_key(|(at, _, _)| *at);
        if let Some((at, marker, think)) = found {
            if self.held[..at].trim().is_empty() {
                self.held.drain(..at);
            } else {
                self.emit_text(at, out);
            }
            self.held.drain(..marker.len());
            self.state = if think {
                State::Thinking
            } else {
                State::Call(String::new())
            };
            return true;
        }
        // Keep what may still become a marker; blanks wait for text (they may only separate
        // calls, and are dropped then).
        let mut keep = markers
            .iter()
            .map(|&(m, _)| partial_suffix(&self.held, m))
            .max()
            .unwrap_or(0);
        if self.at_start
            && markers
                .iter()
                .any(|&(m, _)| m.starts_with(self.held.trim_start()))
        {
            keep = self.held.len();
        }
        let cut = self.held.len() - keep;
        if self.held[..cut].trim().is_empty() {
            return false;
        }
        self.emit_text(cut, out);
        false
    }

    /// Emits `held[..cut]` as text.
    fn emit_text(&mut self, cut: usize, out: &mut Vec<Part>) {
        let text: String = self.held.drain(..cut).collect();
        if !text.trim().is_empty() {
            self.at_start = false;
        }
        let between_calls = self.calls > 0 && text.trim().is_empty();
        if !text.is_empty() && !between_calls {
            out.push(Part::Text(text));
        }
    }

    fn call(&mut self, mut body: String, out: &mut Vec<Part>) -> bool {
        let Some(close) = self.tools.as_ref().and_then(|(f, _)| f.close) else {
            body.push_str(&std::mem::take(&mut self.held));
            self.state = State::Call(body);
            return false;
        };
        if let Some(at) = self.held.find(close) {
            body.push_str(&self.held[..at]);
            self.held.drain(..at + close.len());
            self.calls_or_text(&body, close, out);
            self.at_start = false;
            return true;
        }
        let keep = partial_suffix(&self.held, close);
        let cut = self.held.len() - keep;
        body.extend(self.held.drain(..cut));
        self.state = State::Call(body);
        false
    }

    /// The calls in `body`, or the whole call as text when it does not parse.
    fn calls_or_text(&mut self, body: &str, close: &str, out: &mut Vec<Part>) {
        let Some((format, tools)) = self.tools.as_ref() else {
            return;
        };
        match format.parse(body, tools) {
            Ok(calls) if !calls.is_empty() => {
                for c in calls {
                    self.calls += 1;
                    out.push(Part::Call(ToolCall {
                        id: ids::fresh(self.id_prefix),
                        name: c.name,
                        arguments: c.arguments,
                    }));
                }
            }
            Ok(_) | Err(_) => {
                tracing::debug!(
                    format = format.name,
                    "a tool call did not parse; kept as text"
                );
                out.push(Part::Text(format!("{}{body}{close}", format.open)));
            }
        }
    }
}

/// The length of the longest suffix of `text` that is a proper prefix of `marker`.
fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests;
