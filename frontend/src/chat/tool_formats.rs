//! How each model family writes tool calls: one row per format, recognized by what the model's
//! chat template writes. A row says where a call starts and ends in an answer, how to read the
//! calls, the grammar of an answer that must be calls, and how a call is written back into an
//! earlier turn where the template cannot render calls itself. To add a family, add a row.
//!
//! | format | a call in an answer |
//! |---|---|
//! | `qwen3-xml` (Qwen3-Coder, Qwen3.5) | `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>` |
//! | `hermes` (Qwen2.5, Qwen3, Hermes; our generic format) | `<tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>` |
//! | `mistral` | `[TOOL_CALLS][{"name": NAME, "arguments": {...}}]`, or `[TOOL_CALLS]NAME[ARGS]{...}` |
//! | `llama3-json` | the whole answer `{"name": NAME, "parameters": {...}}` (after `<|python_tag|>` or not) |
//! | `harmony` (gpt-oss) | `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>` |
//!
//! Harmony's other channels (its reasoning, `analysis`, and the answer's `final`) are
//! [`super::reply::Reasoning::HARMONY`]'s.

use serde_json::{Map, Value, json};

use super::grammar::{lark_json, lark_string};
use super::{Tool, ToolCall};
use crate::text::template::python_json;
use read::{harmony_calls, json_calls, mistral_calls, xml_calls};

/// A call read from an answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedCall {
    pub name: String,
    /// JSON text of an object.
    pub arguments: String,
}

/// How a template's model family writes tool calls.
pub struct ToolFormat {
    pub name: &'static str,
    /// Whether a chat template (its source) writes calls this way.
    detect: fn(&str) -> bool,
    /// Where a call (or the list of calls) starts in an answer.
    pub open: &'static str,
    /// Whether `open` counts only at the very start of the answer (after blanks).
    pub open_at_start: bool,
    /// Where it ends (`None`: at the end of the answer).
    pub close: Option<&'static str>,
    /// The calls in the text between `open` and `close`.
    parse: fn(&str, &[Tool]) -> Result<Vec<ParsedCall>, String>,
    /// The Lark rules of an answer that is only calls of `tools` (`parallel`: one or more);
    /// `lit` writes a literal (a special token by its id).
    grammar: fn(&[&Tool], bool, &Literal<'_>) -> String,
    /// An earlier call as this format writes it, for templates that cannot render calls.
    write: fn(&ToolCall) -> String,
}

impl std::fmt::Debug for ToolFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ToolFormat({})", self.name)
    }
}

/// Writes a Lark literal for a text (a special token by its id).
type Literal<'a> = dyn Fn(&str) -> String + 'a;

/// Every format, most specific first.
pub const FORMATS: &[ToolFormat] = &[HARMONY, QWEN3_XML, HERMES, MISTRAL, LLAMA3_JSON];

/// The format for templates without tool support (calls are forced and written in content).
pub const GENERIC: &ToolFormat = &HERMES;

impl ToolFormat {
    /// The format `template` writes calls in, if it renders tools at all.
    pub fn of_template(template: &str) -> Option<&'static ToolFormat> {
        FORMATS.iter().find(|f| (f.detect)(template))
    }

    /// The calls in `body` (between `open` and `close`).
    pub fn parse(&self, body: &str, tools: &[Tool]) -> Result<Vec<ParsedCall>, String> {
        (self.parse)(body, tools)
    }

    /// Lark rules for an answer of calls of `tools` only.
    pub fn grammar(&self, tools: &[&Tool], parallel: bool, lit: &dyn Fn(&str) -> String) -> String {
        (self.grammar)(tools, parallel, lit)
    }

    /// `calls` written as this format writes them.
    pub fn write(&self, calls: &[ToolCall]) -> String {
        let parts: Vec<String> = calls.iter().map(self.write).collect();
        parts.join("\n")
    }
}

const HERMES: ToolFormat = ToolFormat {
    name: "hermes",
    detect: |t| t.contains("<tool_call>") && !t.contains("<function="),
    open: "<tool_call>",
    open_at_start: false,
    close: Some("</tool_call>"),
    parse: |body, _| json_calls(body, "arguments"),
    grammar: |tools, parallel, lit| {
        let call = format!(
            "call: {} \"\\n\" {} \"\\n\" {}\n",
            lit("<tool_call>"),
            lark_json(&call_schema(tools, "arguments")),
            lit("</tool_call>")
        );
        format!("{}{call}", repeat("call", "\"\\n\"", parallel))
    },
    write: |c| {
        format!(
            "<tool_call>\n{{\"name\": {}, \"arguments\": {}}}\n</tool_call>",
            python_json(&Value::from(c.name.as_str())),
            arguments_text(c)
        )
    },
};

const QWEN3_XML: ToolFormat = ToolFormat {
    name: "qwen3-xml",
    detect: |t| t.contains("<tool_call>") && t.contains("<function="),
    open: "<tool_call>",
    open_at_start: false,
    close: Some("</tool_call>"),
    parse: xml_calls,
    grammar: |tools, parallel, lit| {
        let mut rules = repeat("call", "\"\\n\"", parallel);
        let names: Vec<String> = (0..tools.len()).map(|i| format!("f{i}")).collect();
        rules.push_str(&format!(
            "call: {} \"\\n\" ({}) {}\n",
            lit("<tool_call>"),
            names.join(" | "),
            lit("</tool_call>")
        ));
        for (i, t) in tools.iter().enumerate() {
            let mut params = String::new();
            let props = t.parameters["properties"].as_object();
            let required = required_names(&t.parameters);
            for (name, schema) in props.into_iter().flatten() {
                let value = match schema["type"].as_str() {
                    Some("string") | None => "/[^<]*(<[^\\/][^<]*)*/".to_string(),
                    Some(_) => lark_json(schema),
                };
                let part = format!(
                    "{} \"\\n\" {value} \"\\n</parameter>\\n\"",
                    lark_string(&format!("<parameter={name}>"))
                );
                if required.contains(&name.as_str()) {
                    params.push_str(&format!(" {part}"));
                } else {
                    params.push_str(&format!(" ({part})?"));
                }
            }
            rules.push_str(&format!(
                "f{i}: {} \"\\n\"{params} \"</function>\\n\"\n",
                lark_string(&format!("<function={}>", t.name))
            ));
        }
        rules
    },
    write: |c| {
        let mut out = format!("<tool_call>\n<function={}>\n", c.name);
        if let Ok(Value::Object(args)) = serde_json::from_str::<Value>(&c.arguments) {
            for (k, v) in args {
                let text = match &v {
                    Value::String(s) => s.clone(),
                    other => python_json(other),
                };
                out.push_str(&format!("<parameter={k}>\n{text}\n</parameter>\n"));
            }
        }
        out.push_str("</function>\n</tool_call>");
        out
    },
};

const MISTRAL: ToolFormat = ToolFormat {
    name: "mistral",
    detect: |t| t.contains("[TOOL_CALLS]"),
    open: "[TOOL_CALLS]",
    open_at_start: false,
    close: None,
    parse: mistral_calls,
    grammar: |tools, parallel, lit| {
        let mut list =
            json!({"type": "array", "items": call_schema(tools, "arguments"), "minItems": 1});
        if !parallel {
            list["maxItems"] = json!(1);
        }
        format!("start: {} {}\n", lit("[TOOL_CALLS]"), lark_json(&list))
    },
    write: |c| {
        format!(
            "[TOOL_CALLS][{{\"name\": {}, \"arguments\": {}}}]",
            python_json(&Value::from(c.name.as_str())),
            arguments_text(c)
        )
    },
};

const HARMONY: ToolFormat = ToolFormat {
    name: "harmony",
    detect: |t| t.contains("<|channel|>") && t.contains("to=functions."),
    // The recipient, wherever the header puts it (before or after the channel).
    open: "to=functions.",
    open_at_start: false,
    close: Some("<|call|>"),
    parse: harmony_calls,
    grammar: |tools, _, lit| {
        // A harmony answer ends at its call: one call.
        let calls: Vec<String> = tools
            .iter()
            .map(|t| {
                format!(
                    "{} {} {} \"json\" {} {}",
                    lit("<|channel|>"),
                    lark_string(&format!("commentary to=functions.{} ", t.name)),
                    lit("<|constrain|>"),
                    lit("<|message|>"),
                    lark_json(&t.parameters)
                )
            })
            .collect();
        format!("start: ({}) {}\n", calls.join(" | "), lit("<|call|>"))
    },
    write: |c| {
        format!(
            "<|start|>assistant<|channel|>commentary to=functions.{} <|constrain|>json<|message|>{}<|call|>",
            c.name,
            arguments_text(c)
        )
    },
};

const LLAMA3_JSON: ToolFormat = ToolFormat {
    name: "llama3-json",
    detect: |t| {
        t.contains("<|python_tag|>")
            || (t.contains("<|start_header_id|>") && t.contains("\"parameters\""))
    },
    open: "{",
    open_at_start: true,
    close: None,
    parse: |body, _| {
        let text = format!("{{{body}");
        let mut calls = Vec::new();
        for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            calls.extend(json_calls(part, "parameters")?);
        }
        Ok(calls)
    },
    grammar: |tools, _, _| format!("start: {}\n", lark_json(&call_schema(tools, "parameters"))),
    write: |c| {
        format!(
            "{{\"name\": {}, \"parameters\": {}}}",
            python_json(&Value::from(c.name.as_str())),
            arguments_text(c)
        )
    },
};

/// `start:` as one `rule`, or one or more separated by `sep`.
fn repeat(rule: &str, sep: &str, parallel: bool) -> String {
    if parallel {
        format!("start: {rule} ({sep} {rule})*\n")
    } else {
        format!("start: {rule}\n")
    }
}

/// The JSON schema of one call object of any of `tools`: `{"name": NAME, key: ARGS}`.
fn call_schema(tools: &[&Tool], key: &str) -> Value {
    let one = |t: &Tool| {
        let mut properties = Map::new();
        properties.insert("name".into(), json!({"const": t.name}));
        properties.insert(key.into(), t.parameters.clone());
        json!({
            "type": "object",
            "properties": properties,
            "required": ["name", key],
            "additionalProperties": false
        })
    };
    match tools {
        [t] => one(t),
        many => json!({"anyOf": many.iter().map(|t| one(t)).collect::<Vec<_>>()}),
    }
}

fn required_names(schema: &Value) -> Vec<&str> {
    schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// A call's arguments as Python's `json.dumps` writes them (what a template's `tojson` does).
fn arguments_text(c: &ToolCall) -> String {
    match serde_json::from_str::<Value>(&c.arguments) {
        Ok(v) => python_json(&v),
        Err(_) => c.arguments.clone(),
    }
}

mod read;
#[cfg(test)]
mod tests;
