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

use serde_json::{Map, Value, json};

use super::grammar::{lark_json, lark_string};
use super::{Tool, ToolCall};
use crate::text::template::python_json;

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
pub const FORMATS: &[ToolFormat] = &[QWEN3_XML, HERMES, MISTRAL, LLAMA3_JSON];

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

/// Calls written as JSON objects `{"name": ..., key: {...}}` (one, or a list).
fn json_calls(body: &str, key: &str) -> Result<Vec<ParsedCall>, String> {
    let value: Value =
        serde_json::from_str(body.trim()).map_err(|e| format!("the call is not JSON: {e}"))?;
    let items = match value {
        Value::Array(items) => items,
        one => vec![one],
    };
    items.iter().map(|v| json_call(v, key)).collect()
}

fn json_call(v: &Value, key: &str) -> Result<ParsedCall, String> {
    let name = v["name"]
        .as_str()
        .ok_or("the call has no string `name`")?
        .to_string();
    let args = match v
        .get(key)
        .or_else(|| v.get("arguments"))
        .or_else(|| v.get("parameters"))
    {
        Some(Value::String(s)) => serde_json::from_str::<Value>(s)
            .map_err(|e| format!("the arguments of `{name}` are not JSON: {e}"))?,
        Some(a) => a.clone(),
        None => json!({}),
    };
    if !args.is_object() {
        return Err(format!("the arguments of `{name}` are not an object"));
    }
    Ok(ParsedCall {
        name,
        arguments: args.to_string(),
    })
}

/// `[{"name":..,"arguments":..}]`, or `NAME[ARGS]{...}` repeated.
fn mistral_calls(body: &str, _: &[Tool]) -> Result<Vec<ParsedCall>, String> {
    let body = body.trim();
    if body.starts_with('[') || body.starts_with('{') {
        return json_calls(body, "arguments");
    }
    let mut calls = Vec::new();
    for part in body.split("[TOOL_CALLS]").filter(|p| !p.trim().is_empty()) {
        let (name, args) = part
            .split_once("[ARGS]")
            .ok_or("no `[ARGS]` after the name")?;
        let args: Value = serde_json::from_str(args.trim())
            .map_err(|e| format!("the arguments of `{}` are not JSON: {e}", name.trim()))?;
        calls.push(ParsedCall {
            name: name.trim().to_string(),
            arguments: args.to_string(),
        });
    }
    Ok(calls)
}

/// `<function=NAME>` with `<parameter=P>VALUE</parameter>` children; values become JSON as
/// the tool's schema types them (text stays a string).
fn xml_calls(body: &str, tools: &[Tool]) -> Result<Vec<ParsedCall>, String> {
    let mut calls = Vec::new();
    let mut rest = body;
    while let Some(at) = rest.find("<function=") {
        let after = &rest[at + "<function=".len()..];
        let (name, after) = after.split_once('>').ok_or("an unclosed `<function=`")?;
        let (inner, after) = after.split_once("</function>").ok_or("no `</function>`")?;
        let schema = tools
            .iter()
            .find(|t| t.name == name.trim())
            .map(|t| &t.parameters);
        let mut args = Map::new();
        let mut params = inner;
        while let Some(p) = params.find("<parameter=") {
            let after_p = &params[p + "<parameter=".len()..];
            let (key, after_key) = after_p.split_once('>').ok_or("an unclosed `<parameter=`")?;
            let (raw, after_value) = after_key
                .split_once("</parameter>")
                .ok_or("no `</parameter>`")?;
            let raw = raw.strip_prefix('\n').unwrap_or(raw);
            let raw = raw.strip_suffix('\n').unwrap_or(raw);
            let kind = schema.and_then(|s| s["properties"][key]["type"].as_str());
            let value = match kind {
                Some("string") => Value::from(raw),
                _ => serde_json::from_str(raw).unwrap_or_else(|_| Value::from(raw)),
            };
            args.insert(key.to_string(), value);
            params = after_value;
        }
        calls.push(ParsedCall {
            name: name.trim().to_string(),
            arguments: Value::Object(args).to_string(),
        });
        rest = after;
    }
    if calls.is_empty() {
        return Err("no `<function=` in the call".into());
    }
    Ok(calls)
}

#[cfg(test)]
mod tests;
