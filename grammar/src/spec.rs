//! The grammars the APIs ask for, as llguidance grammars that cross the socket as JSON.

use llguidance::api::TopLevelGrammar;
use serde_json::{Map, Value, json};

use crate::GrammarError;

/// A grammar, as it crosses the socket: the JSON of llguidance's `TopLevelGrammar`.
#[derive(Debug, Clone, PartialEq)]
pub struct Grammar(String);

/// How generated JSON is spaced. Every style is bounded: free whitespace would let a sampled
/// answer run on in blanks until its token limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonStyle {
    /// `{"a": 1, "b": [2, 3]}`: what Python's `json.dumps` (and a chat template's `tojson`)
    /// writes, so an answer renders back byte for byte in the next turn's prompt.
    Python,
    /// `{"a":1,"b":[2,3]}`.
    Compact,
}

impl Grammar {
    /// Output that is one JSON value valid under `schema`; `strict` (OpenAI's) also refuses
    /// properties a schema does not name.
    pub fn json_schema(schema: &Value, style: JsonStyle, strict: bool) -> Grammar {
        let mut schema = match schema {
            Value::Object(_) => schema.clone(),
            // `true` (anything) and an absent schema: any JSON value.
            _ => json!({}),
        };
        if strict {
            close_objects(&mut schema);
        }
        style.apply(&mut schema);
        Grammar::of(TopLevelGrammar::from_json_schema(schema))
    }

    /// Output that is one JSON object.
    pub fn json_object(style: JsonStyle) -> Grammar {
        Self::json_schema(&json!({"type": "object"}), style, false)
    }

    /// A Lark grammar (llguidance's dialect: `%json {...}` embeds a JSON schema).
    pub fn lark(text: String) -> Grammar {
        Grammar::of(TopLevelGrammar::from_lark(text))
    }

    /// A grammar received from a peer.
    pub fn from_wire(json: String) -> Grammar {
        Grammar(json)
    }

    /// The grammar to send.
    pub fn to_wire(&self) -> String {
        self.0.clone()
    }

    fn of(grammar: TopLevelGrammar) -> Grammar {
        // Serializing plain data into a string cannot fail.
        Grammar(serde_json::to_string(&grammar).unwrap_or_default())
    }

    pub(crate) fn top_level(&self) -> Result<TopLevelGrammar, GrammarError> {
        serde_json::from_str(&self.0).map_err(|e| GrammarError::Malformed(e.to_string()))
    }
}

impl JsonStyle {
    /// The llguidance options for this style, set in `schema`'s `x-guidance` unless the schema
    /// sets them itself.
    pub fn apply(self, schema: &mut Value) {
        let Value::Object(map) = schema else { return };
        let options = map
            .entry("x-guidance")
            .or_insert_with(|| Value::Object(Map::new()));
        let Value::Object(options) = options else {
            return;
        };
        let (item, key) = match self {
            JsonStyle::Python => (", ", ": "),
            JsonStyle::Compact => (",", ":"),
        };
        options
            .entry("whitespace_flexible")
            .or_insert(Value::Bool(false));
        options.entry("item_separator").or_insert(Value::from(item));
        options.entry("key_separator").or_insert(Value::from(key));
    }

    /// This style's `x-guidance` options, for a schema embedded in Lark (`%json`).
    pub fn options(self) -> Value {
        let mut v = json!({});
        self.apply(&mut v);
        v["x-guidance"].take()
    }
}

/// Adds `"additionalProperties": false` to every object schema that does not say (OpenAI's
/// strict mode: only the named properties).
fn close_objects(schema: &mut Value) {
    let Value::Object(map) = schema else { return };
    let is_object = map.contains_key("properties") || map.get("type") == Some(&json!("object"));
    if is_object && !map.contains_key("additionalProperties") {
        map.insert("additionalProperties".into(), Value::Bool(false));
    }
    for key in ["properties", "$defs", "definitions", "patternProperties"] {
        if let Some(Value::Object(children)) = map.get_mut(key) {
            children.values_mut().for_each(close_objects);
        }
    }
    for key in ["items", "additionalProperties", "not", "contains"] {
        if let Some(child) = map.get_mut(key) {
            close_objects(child);
        }
    }
    for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        if let Some(Value::Array(children)) = map.get_mut(key) {
            children.iter_mut().for_each(close_objects);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_closes_nested_objects_and_keeps_what_a_schema_says() {
        let mut s = json!({
            "type": "object",
            "properties": {
                "a": {"type": "object", "properties": {"b": {"type": "integer"}}},
                "c": {"type": "array", "items": {"type": "object", "additionalProperties": true}}
            }
        });
        close_objects(&mut s);
        assert_eq!(s["additionalProperties"], json!(false));
        assert_eq!(s["properties"]["a"]["additionalProperties"], json!(false));
        assert_eq!(
            s["properties"]["c"]["items"]["additionalProperties"],
            json!(true)
        );
    }

    #[test]
    fn a_style_does_not_override_the_schema_s_own_options() {
        let mut s = json!({"x-guidance": {"item_separator": ";"}});
        JsonStyle::Python.apply(&mut s);
        assert_eq!(s["x-guidance"]["item_separator"], ";");
        assert_eq!(s["x-guidance"]["key_separator"], ": ");
        assert_eq!(JsonStyle::Compact.options()["item_separator"], ",");
    }
}
