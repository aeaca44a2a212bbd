//! Reading the calls out of an answer, per format: the text between a format's open and close
//! markers becomes named calls with JSON-object arguments, or an error that keeps it as text.

use serde_json::{Map, Value, json};

use super::ParsedCall;
use crate::chat::Tool;

/// Calls written as JSON objects `{"name": ..., key: {...}}` (one, or a list).
pub(super) fn json_calls(body: &str, key: &str) -> Result<Vec<ParsedCall>, String> {
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
pub(super) fn mistral_calls(body: &str, _: &[Tool]) -> Result<Vec<ParsedCall>, String> {
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
pub(super) fn xml_calls(body: &str, tools: &[Tool]) -> Result<Vec<ParsedCall>, String> {
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

/// Harmony's (gpt-oss): `NAME <|constrain|>json<|message|>{...}` (or `NAME<|channel|>commentary
/// json<|message|>{...}`): the name up to the first blank or marker, the arguments after the
/// last `<|message|>`.
pub(super) fn harmony_calls(body: &str, _: &[Tool]) -> Result<Vec<ParsedCall>, String> {
    let end = body
        .find(|c: char| c.is_whitespace() || c == '<')
        .unwrap_or(body.len());
    let name = body[..end].trim();
    if name.is_empty() {
        return Err("no function name after `to=functions.`".into());
    }
    let (_, args) = body
        .rsplit_once("<|message|>")
        .ok_or("no `<|message|>` before the arguments")?;
    let args: Value = serde_json::from_str(args.trim())
        .map_err(|e| format!("the arguments of `{name}` are not JSON: {e}"))?;
    if !args.is_object() {
        return Err(format!("the arguments of `{name}` are not an object"));
    }
    Ok(vec![ParsedCall {
        name: name.to_string(),
        arguments: args.to_string(),
    }])
}
