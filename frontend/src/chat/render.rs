//! A conversation through the model's chat template: the prompt's tokens, the grammar its
//! answer must follow, the prefixes to pin, and how to read the answer.
//!
//! Tools reach the template as Hugging Face's `apply_chat_template(tools=...)` passes them,
//! and earlier calls and results as its messages carry them. A template that renders no tools
//! can still be made to call one when the request forces a call: the tools are described in
//! the system turn, the call is forced in the generic format, and earlier calls and results
//! are written into the turns' text.

use mlxcel_grammar::Grammar;
use mlxcel_ipc::proto::daemon::Pin;
use serde_json::{Map, Value, json};

use super::reply::{Reasoning, ReplyParser};
use super::tool_formats::{GENERIC, ToolFormat};
use super::{Conversation, OutputFormat, Role, Thinking, Tool, ToolChoice};
use crate::error::ApiError;
use crate::text::template::{
    ChatTemplate, RenderContext, TemplateFunction, TemplateMessage, TemplateToolCall, python_json,
};
use crate::text::{ModelText, TemplateAbilities};

/// Marks a breakpoint in a rendering (a private-use character no tokenizer merges across).
const SENTINEL: &str = "\u{F8FF}mlxcel-breakpoint\u{F8FF}";

/// A rendered conversation.
#[derive(Debug)]
pub struct Rendered {
    pub prompt: Vec<u32>,
    pub grammar: Option<Grammar>,
    pub pins: Vec<Pin>,
    pub reply: ReplySetup,
}

/// How to read the answer.
#[derive(Debug, Clone)]
pub struct ReplySetup {
    pub tools: Option<(&'static ToolFormat, Vec<Tool>)>,
    /// How reasoning is split from the text (None: it stays in the text).
    pub reasoning: Option<Reasoning>,
    /// The prompt ends inside reasoning (the template opened `<think>`).
    pub thinking: bool,
}

impl ReplySetup {
    /// Plain text (completions).
    pub fn text() -> Self {
        Self {
            tools: None,
            reasoning: None,
            thinking: false,
        }
    }

    /// A parser for the answer; tool calls get ids starting with `id_prefix`.
    pub fn parser(&self, id_prefix: &'static str) -> ReplyParser {
        ReplyParser::new(self.tools.clone(), self.reasoning, self.thinking, id_prefix)
    }
}

/// Renders `conv` for `model`; `reasoning_inline` keeps reasoning in the text.
pub fn render(
    conv: &Conversation,
    model: &ModelText,
    reasoning_inline: bool,
) -> Result<Rendered, ApiError> {
    let Some(template) = &model.template else {
        return Err(ApiError::param(
            "messages",
            format!(
                "cannot be rendered: the model `{}` has no chat template (use /v1/completions)",
                model.model_id
            ),
        ));
    };
    let prepared = prepare(conv, model.abilities, &model.model_id)?;
    let text = prepared.text(template, &prepared.messages)?;
    let (prompt, ends) = model
        .encode_with_ends(&text)
        .map_err(|e| ApiError::param("messages", format!("could not be tokenized: {e}")))?;
    let mut pins = Vec::new();
    for bp in &conv.breakpoints {
        let Some(&at) = prepared.index.get(bp.turn) else {
            continue;
        };
        let mut marked = prepared.messages.clone();
        let content = &mut marked[at].content;
        let offset = bp.offset.min(content.len());
        if !content.is_char_boundary(offset) {
            continue;
        }
        content.insert_str(offset, SENTINEL);
        let Some(pos) = prepared.text(template, &marked)?.find(SENTINEL) else {
            tracing::debug!(
                turn = bp.turn,
                "a cache breakpoint is not in the rendered prompt"
            );
            continue;
        };
        let tokens = ends.iter().take_while(|&&end| end <= pos).count();
        pins.push(Pin {
            tokens: tokens as u32,
            ttl_secs: bp.ttl_secs,
        });
    }
    let grammar = super::grammar::of(conv, prepared.format, &|t| model.lark_literal(t))?;
    if let Some(g) = &grammar {
        check(model, g, conv)?;
    }
    let reasoning = model.abilities.reasoning;
    Ok(Rendered {
        prompt,
        grammar,
        pins,
        reply: ReplySetup {
            tools: prepared
                .wants_tools
                .then(|| (prepared.format, conv.tools.clone())),
            reasoning: reasoning.filter(|_| !reasoning_inline),
            thinking: reasoning.is_some_and(|r| {
                !reasoning_inline && !constrained(conv) && text.trim_end().ends_with(r.open)
            }),
        },
    })
}

/// The prompt's text of `conv` with `template` (for a model whose template does `abilities`).
pub fn prompt_text(
    conv: &Conversation,
    template: &ChatTemplate,
    abilities: TemplateAbilities,
) -> Result<String, ApiError> {
    let prepared = prepare(conv, abilities, "the model")?;
    prepared.text(template, &prepared.messages)
}

/// A conversation as its template takes it.
struct Prepared<'a> {
    conv: &'a Conversation,
    messages: Vec<TemplateMessage>,
    /// Where each turn went among the messages.
    index: Vec<usize>,
    ctx: RenderContext,
    /// The format calls are written and forced in.
    format: &'static ToolFormat,
    wants_tools: bool,
}

fn prepare<'a>(
    conv: &'a Conversation,
    abilities: TemplateAbilities,
    model_id: &str,
) -> Result<Prepared<'a>, ApiError> {
    let wants_tools = !conv.tools.is_empty() && conv.tool_choice != ToolChoice::None;
    let native = abilities.tool_format;
    let format = match (native, wants_tools, conv.tool_choice.forces()) {
        (Some(f), _, _) => f,
        (None, true, false) => {
            return Err(ApiError::param(
                "tools",
                format!(
                    "cannot be offered to the model `{model_id}`: its chat template does not \
                     render tools, so it cannot choose to call one; force a call with \
                     `tool_choice` (`required` or a named function), or use a model whose \
                     template renders tools"
                ),
            ));
        }
        (None, _, _) => GENERIC,
    };
    // Tools are described to a template that renders none whenever the request has tools, so
    // that turns which force a call and turns which do not share the prompt's head (and its
    // cached blocks).
    let described = native.is_none() && !conv.tools.is_empty();
    let (messages, index) = template_messages(conv, native.is_some(), described);
    Ok(Prepared {
        conv,
        messages,
        index,
        ctx: context(
            conv,
            native.is_some(),
            abilities.reasoning.is_some(),
            constrained(conv),
        ),
        format,
        wants_tools,
    })
}

impl Prepared<'_> {
    /// `messages` (these, or a marked copy) rendered.
    fn text(
        &self,
        template: &ChatTemplate,
        messages: &[TemplateMessage],
    ) -> Result<String, ApiError> {
        let text = template.render_with(messages, &self.ctx).map_err(|e| {
            ApiError::param(
                "messages",
                format!("were refused by the chat template: {e}"),
            )
        })?;
        Ok(match self.conv.continue_last {
            true => continue_final(text, messages),
            false => text,
        })
    }
}

/// Refuses a grammar the engine cannot compile, naming the field it came from.
fn check(model: &ModelText, grammar: &Grammar, conv: &Conversation) -> Result<(), ApiError> {
    let field = if conv.tool_choice.forces() {
        "tools"
    } else {
        match conv.format {
            OutputFormat::JsonSchema { .. } => "response_format.json_schema.schema",
            _ => "response_format",
        }
    };
    let grammars = model.grammars.as_ref().map_err(|e| {
        ApiError::param(
            field,
            format!("needs constrained decoding, unavailable for this model: {e}"),
        )
    })?;
    grammars
        .check(grammar)
        .map_err(|e| ApiError::param(field, format!("cannot be enforced: {e}")))
}

/// The turns as template messages, and where each turn went.
fn template_messages(
    conv: &Conversation,
    native: bool,
    described: bool,
) -> (Vec<TemplateMessage>, Vec<usize>) {
    let mut out: Vec<TemplateMessage> = Vec::new();
    let mut index = Vec::with_capacity(conv.turns.len());
    for turn in &conv.turns {
        let mut m = TemplateMessage::new(turn.role.as_str(), turn.content.clone());
        match turn.role {
            Role::Assistant if native => {
                m.tool_calls = turn
                    .tool_calls
                    .iter()
                    .map(|c| TemplateToolCall {
                        id: c.id.clone(),
                        kind: "function",
                        function: TemplateFunction {
                            name: c.name.clone(),
                            arguments: serde_json::from_str(&c.arguments)
                                .unwrap_or_else(|_| Value::from(c.arguments.as_str())),
                        },
                    })
                    .collect();
            }
            Role::Assistant if !turn.tool_calls.is_empty() => {
                let calls = GENERIC.write(&turn.tool_calls);
                if !m.content.is_empty() {
                    m.content.push('\n');
                }
                m.content.push_str(&calls);
            }
            Role::Tool if native => {
                m.tool_call_id = turn.tool_call_id.clone();
                m.name = turn.name.clone();
            }
            Role::Tool => {
                m.role = "user".into();
                m.content = format!("<tool_response>\n{}\n</tool_response>", turn.content);
            }
            _ => m.name = turn.name.clone(),
        }
        if turn.role == Role::Assistant {
            m.reasoning_content = turn.reasoning.clone();
        }
        index.push(out.len());
        out.push(m);
    }
    if described {
        let described = describe_tools(&conv.tools);
        match out.first_mut() {
            Some(first) if first.role == "system" => {
                first.content.push_str("\n\n");
                first.content.push_str(&described);
            }
            _ => {
                out.insert(0, TemplateMessage::new("system", described));
                index.iter_mut().for_each(|i| *i += 1);
            }
        }
    }
    (out, index)
}

/// Tools for a template that renders none: their signatures and how to call one.
fn describe_tools(tools: &[Tool]) -> String {
    let lines: Vec<String> = tools.iter().map(|t| python_json(&tool_value(t))).collect();
    format!(
        "You can call functions. Their signatures, one JSON object per line, are:\n<tools>\n{}\n\
         </tools>\nTo call one, answer with a JSON object holding its name and arguments \
         inside <tool_call></tool_call> tags:\n<tool_call>\n{{\"name\": <function name>, \
         \"arguments\": <arguments object>}}\n</tool_call>",
        lines.join("\n")
    )
}

/// A tool as templates receive it: `{"type": "function", "function": {...}}`.
fn tool_value(t: &Tool) -> Value {
    let mut f = Map::new();
    f.insert("name".into(), Value::from(t.name.as_str()));
    if let Some(d) = &t.description {
        f.insert("description".into(), Value::from(d.as_str()));
    }
    f.insert("parameters".into(), t.parameters.clone());
    json!({"type": "function", "function": f})
}

/// Whether a grammar will shape the answer from its first token (a format, a forced call).
fn constrained(conv: &Conversation) -> bool {
    (conv.tool_choice.forces() && !conv.tools.is_empty()) || conv.format != OutputFormat::Text
}

/// The template's variables besides the messages. A constrained answer starts with what its
/// grammar allows, so a thinking template is asked not to think.
fn context(conv: &Conversation, native: bool, thinks: bool, constrained: bool) -> RenderContext {
    let mut kwargs = Map::new();
    let thinking = if constrained {
        Thinking::Off
    } else {
        conv.thinking.clone()
    };
    match thinking {
        Thinking::On if thinks => {
            kwargs.insert("enable_thinking".into(), Value::Bool(true));
        }
        Thinking::Off if thinks => {
            kwargs.insert("enable_thinking".into(), Value::Bool(false));
        }
        _ => {}
    }
    if let Some(effort) = &conv.effort {
        kwargs.insert("reasoning_effort".into(), Value::from(effort.as_str()));
    }
    let tools = (native && !conv.tools.is_empty())
        .then(|| Value::Array(conv.tools.iter().map(tool_value).collect()));
    RenderContext {
        tools,
        add_generation_prompt: !conv.continue_last,
        kwargs,
    }
}

/// `text` cut right after the last message's content (the assistant continues it), as
/// `apply_chat_template(continue_final_message=True)` does.
fn continue_final(text: String, messages: &[TemplateMessage]) -> String {
    let Some(last) = messages.last() else {
        return text;
    };
    let content = last.content.trim_end();
    match text.rfind(content) {
        Some(at) if !content.is_empty() => text[..at + content.len()].to_string(),
        _ => text,
    }
}

#[cfg(test)]
mod tests;
