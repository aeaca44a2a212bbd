//! An answer as it streams, split into what each API reports apart: reasoning (`<think>…</think>`,
//! or harmony's analysis channel: [`Reasoning`]), text, and tool calls (in the model's
//! [`ToolFormat`]). Text that may be the start of a marker
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

/// Where a family's reasoning starts and ends in an answer, and the headers between an
/// answer's messages that are no part of its text.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reasoning {
    pub open: &'static str,
    pub close: &'static str,
    pub elide: &'static [&'static str],
}

impl Reasoning {
    /// `<think>…</think>` (Qwen3, DeepSeek-R1 and others).
    pub const THINK: Reasoning = Reasoning {
        open: "<think>",
        close: "</think>",
        elide: &[],
    };
    /// Harmony (gpt-oss): the `analysis` channel is reasoning; the `final` channel's message,
    /// and the `commentary` channel's to the user, are the text.
    pub const HARMONY: Reasoning = Reasoning {
        open: "<|channel|>analysis<|message|>",
        close: "<|end|>",
        elide: &[
            "<|start|>assistant",
            "<|channel|>final<|message|>",
            "<|channel|>commentary<|message|>",
            "<|channel|>commentary ",
            "<|end|>",
            "<|return|>",
        ],
    };

    /// The reasoning a chat template's source writes.
    pub fn of_template(source: &str) -> Option<Reasoning> {
        if source.contains("<|channel|>") {
            Some(Reasoning::HARMONY)
        } else if source.contains("<think>") {
            Some(Reasoning::THINK)
        } else {
            None
        }
    }
}

/// What a marker in an answer starts.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Marker {
    Reasoning,
    Call,
    /// Nothing: it is dropped.
    Elided,
}

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
    /// How reasoning is marked, where it is split from the text (None: it stays in the text).
    reasoning: Option<Reasoning>,
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
    /// A parser for an answer whose calls come as `tools` says and whose reasoning is split
    /// as `reasoning` marks it; `thinking` when the prompt ends inside reasoning (the template
    /// opened `<think>`).
    pub fn new(
        tools: Option<(&'static ToolFormat, Vec<Tool>)>,
        reasoning: Option<Reasoning>,
        thinking: bool,
        id_prefix: &'static str,
    ) -> Self {
        Self {
            tools,
            reasoning,
            state: if thinking && reasoning.is_some() {
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
                // A call whose close is the answer's end (harmony's `<|call|>` stops it) or
                // is missing reads as a call when it parses, else as text.
                match self.tools.as_ref() {
                    Some(_) => self.calls_or_text(&body, "", &mut out),
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
        let close = self.reasoning.map_or(Reasoning::THINK.close, |r| r.close);
        if let Some(at) = self.held.find(close) {
            out.push(Part::Reasoning(self.held[..at].to_string()));
            self.held.drain(..at + close.len());
            self.after_reasoning = true;
            self.state = State::Answer;
            return true;
        }
        let keep = partial_suffix(&self.held, close);
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
        let mut markers: Vec<(&'static str, Marker)> = Vec::new();
        if let Some(r) = self.reasoning {
            if self.at_start {
                markers.push((r.open, Marker::Reasoning));
            }
            markers.extend(r.elide.iter().map(|&m| (m, Marker::Elided)));
        }
        if let Some((f, _)) = &self.tools
            && (!f.open_at_start || self.at_start)
        {
            markers.push((f.open, Marker::Call));
        }
        // The first marker in the text (the longest of those starting there).
        let found = markers
            .iter()
            .filter_map(|&(m, kind)| {
                let at = self.held.find(m)?;
                // A marker that counts only at the start must come before any text.
                let at_start_only = kind == Marker::Reasoning
                    || (kind == Marker::Call
                        && self.tools.as_ref().is_some_and(|(f, _)| f.open_at_start));
                (!at_start_only || at == lead).then_some((at, m, kind))
            })
            .min_by_key(|(at, m, _)| (*at, std::cmp::Reverse(m.len())));
        if let Some((at, marker, kind)) = found {
            if self.held[..at].trim().is_empty() {
                self.held.drain(..at);
            } else {
                self.emit_text(at, out);
            }
            self.held.drain(..marker.len());
            self.state = match kind {
                Marker::Reasoning => State::Thinking,
                Marker::Call => State::Call(String::new()),
                Marker::Elided => State::Answer,
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
