//! The grammar an answer must follow: its output format (`json_object`, `json_schema`), or
//! tool calls when the request forces them (a named tool, or `required`/`any`).

use mlxcel_grammar::{Grammar, JsonStyle};
use serde_json::Value;

use super::tool_formats::ToolFormat;
use super::{Conversation, OutputFormat, Tool, ToolChoice};
use crate::error::ApiError;

/// The grammar of `conv`'s answer in a model that writes calls as `format`; `lit` writes a
/// Lark literal (a special token by its id). Errors name the field at fault.
pub fn of(
    conv: &Conversation,
    format: &ToolFormat,
    lit: &dyn Fn(&str) -> String,
) -> Result<Option<Grammar>, ApiError> {
    if conv.tool_choice.forces() {
        let tools: Vec<&Tool> = match &conv.tool_choice {
            ToolChoice::Named(name) => vec![conv.tool(name).ok_or_else(|| {
                ApiError::param(
                    "tool_choice",
                    format!("names the tool `{name}`, which is not among `tools`"),
                )
            })?],
            _ => conv.tools.iter().collect(),
        };
        if tools.is_empty() {
            return Err(ApiError::param(
                "tool_choice",
                "forces a tool call, but `tools` is empty",
            ));
        }
        let parallel =
            conv.parallel_tool_calls && !matches!(conv.tool_choice, ToolChoice::Named(_));
        let rules = format.grammar(&tools, parallel, lit);
        return Ok(Some(Grammar::lark(rules)));
    }
    Ok(match &conv.format {
        OutputFormat::Text => None,
        // Content is rendered back as it came, so its spacing is free to be the usual one.
        OutputFormat::JsonObject => Some(Grammar::json_object(JsonStyle::Python)),
        OutputFormat::JsonSchema { schema, strict } => {
            Some(Grammar::json_schema(schema, JsonStyle::Python, *strict))
        }
    })
}

/// A JSON schema embedded in Lark, spaced as a chat template's `tojson` writes (so a call
/// renders back into the next prompt byte for byte).
pub fn lark_json(schema: &Value) -> String {
    let mut schema = match schema {
        Value::Object(_) => schema.clone(),
        _ => serde_json::json!({}),
    };
    JsonStyle::Python.apply(&mut schema);
    format!("%json {schema}")
}

/// A Lark string literal for `text`.
pub fn lark_string(text: &str) -> String {
    Value::from(text).to_string()
}
