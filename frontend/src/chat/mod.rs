//! The conversation an agent sends, whichever API it came through (chat completions, Responses,
//! Anthropic Messages), and what becomes of it: one prompt, one grammar, one reply parser.
//!
//! - [`Conversation`]: turns (with tool calls, tool results, reasoning), tools, the tool
//!   choice, the output format, thinking, and cache breakpoints; each API converts into it.
//! - [`render`]: the conversation through the model's chat template → prompt tokens, the
//!   grammar that enforces the format or a forced tool call, pins for breakpoints.
//! - [`tool_formats`]: how each model family writes tool calls (one table).
//! - [`grammar`]: the grammars of output formats and forced tool calls.
//! - [`reply`]: generated text → reasoning, text and tool calls, as they stream.
//! - [`ids`]: ids for responses and tool calls.

pub mod grammar;
pub mod ids;
pub mod render;
pub mod reply;
pub mod tool_formats;

use serde_json::Value;

/// Who speaks a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
    /// A tool's result.
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// A tool call, made by the model (in an earlier turn, or in this answer).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as JSON text (an object).
    pub arguments: String,
}

/// One turn of the conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    pub role: Role,
    pub content: String,
    /// An assistant turn's calls.
    pub tool_calls: Vec<ToolCall>,
    /// A tool turn: the call it answers.
    pub tool_call_id: Option<String>,
    /// A tool turn: the tool's name, where the API says it; a user's name otherwise.
    pub name: Option<String>,
    /// An assistant turn's reasoning.
    pub reasoning: Option<String>,
}

impl Turn {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
            reasoning: None,
        }
    }
}

/// A function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// The arguments' JSON schema.
    pub parameters: Value,
}

/// Whether and which tools the model must call.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// The model decides (the default with tools).
    #[default]
    Auto,
    /// No calls (the tools stay in the prompt).
    None,
    /// At least one call, of any tool.
    Required,
    /// A call of this tool.
    Named(String),
}

impl ToolChoice {
    /// Whether the answer must be tool calls (a grammar forces them).
    pub fn forces(&self) -> bool {
        matches!(self, ToolChoice::Required | ToolChoice::Named(_))
    }
}

/// The shape the answer's text must have.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum OutputFormat {
    #[default]
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON valid under `schema`; `strict`: no properties the schema does not name.
    JsonSchema { schema: Value, strict: bool },
}

/// Whether a reasoning model thinks before it answers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Thinking {
    /// As the model's template does by default.
    #[default]
    Default,
    On,
    Off,
}

/// Where a cache breakpoint stands: the end of a turn's first `offset` bytes of content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Breakpoint {
    pub turn: usize,
    pub offset: usize,
    pub ttl_secs: u32,
}

/// What a request asks for, in one shape for every API.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Conversation {
    pub turns: Vec<Turn>,
    pub tools: Vec<Tool>,
    pub tool_choice: ToolChoice,
    /// Whether several calls may come in one answer.
    pub parallel_tool_calls: bool,
    pub format: OutputFormat,
    pub thinking: Thinking,
    /// `reasoning_effort` as the template's `reasoning_effort` variable (gpt-oss).
    pub effort: Option<String>,
    /// Prefixes to keep cached (Anthropic's `cache_control`).
    pub breakpoints: Vec<Breakpoint>,
    /// The last turn is the assistant's beginning, to be continued (Anthropic prefill).
    pub continue_last: bool,
}

impl Conversation {
    /// The tool named `name`.
    pub fn tool(&self, name: &str) -> Option<&Tool> {
        self.tools.iter().find(|t| t.name == name)
    }
}
