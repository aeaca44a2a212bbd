//! What happens to every top-level request field of each API: honoured, accepted and ignored
//! (with why), or refused with a 400 that names it. A field in no table is refused as unknown.
//! Nested objects tolerate fields they do not know (SDKs echo a response's extras back).
//! `docs/api-fields.md` is [`markdown`] (a test keeps it equal).

use serde_json::{Map, Value};

use crate::error::ApiError;

/// What happens to a field.
#[derive(Debug, Clone, Copy)]
pub enum Treatment {
    Honoured,
    /// Accepted, has no effect; why.
    Ignored(&'static str),
    /// Refused unless its value is one `allowed` takes (null always is); why.
    Refused(&'static str, fn(&Value) -> bool),
}

/// One field of a request body.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    pub name: &'static str,
    pub treatment: Treatment,
}

const fn honoured(name: &'static str) -> Field {
    Field {
        name,
        treatment: Treatment::Honoured,
    }
}

const fn ignored(name: &'static str, why: &'static str) -> Field {
    Field {
        name,
        treatment: Treatment::Ignored(why),
    }
}

const fn refused(name: &'static str, why: &'static str, allowed: fn(&Value) -> bool) -> Field {
    Field {
        name,
        treatment: Treatment::Refused(why, allowed),
    }
}

fn never(_: &Value) -> bool {
    false
}

fn falsy(v: &Value) -> bool {
    matches!(v, Value::Bool(false)) || v.as_array().is_some_and(Vec::is_empty)
}

fn text_only(v: &Value) -> bool {
    v.as_array().is_some_and(|a| a.iter().all(|m| m == "text"))
}

const NOT_STORED: &str = "nothing is stored: answers cannot be fetched later";
const AUTOMATIC_CACHE: &str = "the prefix cache is automatic (hits are reported in usage)";
const NO_TENANT_USE: &str = "identifies the end user to OpenAI; unused here";

/// The samplers every generating route takes (our extensions beside OpenAI's).
const SAMPLERS: [Field; 9] = [
    honoured("temperature"),
    honoured("top_p"),
    honoured("top_k"),
    honoured("min_p"),
    honoured("seed"),
    honoured("presence_penalty"),
    honoured("frequency_penalty"),
    honoured("repetition_penalty"),
    honoured("logit_bias"),
];

/// `POST /v1/chat/completions`.
pub const CHAT: &[&[Field]] = &[
    &[
        honoured("model"),
        honoured("messages"),
        honoured("max_tokens"),
        honoured("max_completion_tokens"),
        honoured("stop"),
        honoured("n"),
        honoured("stream"),
        honoured("stream_options"),
        honoured("logprobs"),
        honoured("top_logprobs"),
        honoured("tools"),
        honoured("tool_choice"),
        honoured("parallel_tool_calls"),
        honoured("response_format"),
        honoured("reasoning_effort"),
        honoured("chat_template_kwargs"),
        honoured("cache_salt"),
        honoured("ignore_eos"),
    ],
    &SAMPLERS,
    &[
        ignored("user", NO_TENANT_USE),
        ignored("safety_identifier", NO_TENANT_USE),
        ignored("metadata", NOT_STORED),
        ignored("store", NOT_STORED),
        ignored("service_tier", "there is one tier"),
        ignored("prompt_cache_key", AUTOMATIC_CACHE),
        ignored("prompt_cache_retention", AUTOMATIC_CACHE),
        ignored("prompt_cache_options", AUTOMATIC_CACHE),
        ignored(
            "prediction",
            "predicted outputs do not speed up decoding here",
        ),
        ignored("verbosity", "no served model takes a verbosity setting"),
        refused("audio", "audio output is not supported", never),
        refused("modalities", "only text output is supported", text_only),
        refused("functions", "deprecated by OpenAI: send `tools`", never),
        refused(
            "function_call",
            "deprecated by OpenAI: send `tool_choice`",
            never,
        ),
        refused("web_search_options", "web search is not supported", never),
        refused("moderation", "moderation is not supported", never),
    ],
];

/// `POST /v1/completions`.
pub const COMPLETIONS: &[&[Field]] = &[
    &[
        honoured("model"),
        honoured("prompt"),
        honoured("max_tokens"),
        honoured("stop"),
        honoured("n"),
        honoured("stream"),
        honoured("stream_options"),
        honoured("logprobs"),
        honoured("echo"),
        honoured("suffix"),
        honoured("best_of"),
        honoured("cache_salt"),
        honoured("ignore_eos"),
    ],
    &SAMPLERS,
    &[ignored("user", NO_TENANT_USE)],
];

/// `POST /v1/responses`.
pub const RESPONSES: &[&[Field]] = &[&[
    honoured("model"),
    honoured("input"),
    honoured("instructions"),
    honoured("max_output_tokens"),
    honoured("temperature"),
    honoured("top_p"),
    honoured("tools"),
    honoured("tool_choice"),
    honoured("parallel_tool_calls"),
    honoured("text"),
    honoured("reasoning"),
    honoured("stream"),
    honoured("metadata"),
    honoured("truncation"),
    ignored("store", NOT_STORED),
    ignored("include", "no hidden outputs exist to include"),
    ignored("user", NO_TENANT_USE),
    ignored("safety_identifier", NO_TENANT_USE),
    ignored("service_tier", "there is one tier"),
    ignored("prompt_cache_key", AUTOMATIC_CACHE),
    ignored("prompt_cache_retention", AUTOMATIC_CACHE),
    ignored("prompt_cache_options", AUTOMATIC_CACHE),
    ignored("stream_options", "stream obfuscation is not used"),
    ignored(
        "max_tool_calls",
        "one answer is generated per request; its calls are all returned",
    ),
    refused(
        "previous_response_id",
        "responses are not stored: send the whole conversation in `input`",
        never,
    ),
    refused(
        "conversation",
        "conversations are not stored: send them in `input`",
        never,
    ),
    refused(
        "background",
        "background responses are not supported",
        falsy,
    ),
    refused("prompt", "stored prompt templates are not supported", never),
    refused(
        "top_logprobs",
        "log-probabilities are not reported here",
        |v| v == 0,
    ),
    refused(
        "context_management",
        "server-side compaction is not supported",
        never,
    ),
]];

/// `POST /v1/messages` (and, less the generation settings, `count_tokens`).
pub const MESSAGES: &[&[Field]] = &[
    MESSAGES_PROMPT,
    &[
        honoured("max_tokens"),
        honoured("stop_sequences"),
        honoured("stream"),
        honoured("temperature"),
        honoured("top_p"),
        honoured("top_k"),
        ignored(
            "metadata",
            "used by Anthropic for abuse detection; unused here",
        ),
        ignored("service_tier", "there is one tier"),
        ignored("inference_geo", "inference runs on this machine"),
    ],
];

/// What shapes a Messages prompt (also all `count_tokens` takes).
pub const MESSAGES_PROMPT: &[Field] = &[
    honoured("model"),
    honoured("messages"),
    honoured("system"),
    honoured("tools"),
    honoured("tool_choice"),
    honoured("thinking"),
    honoured("output_config"),
    honoured("output_format"),
    ignored("cache_control", AUTOMATIC_CACHE),
    ignored("speed", "there is one speed"),
    ignored("diagnostics", "no diagnostics are reported"),
    ignored(
        "context_management",
        "earlier turns are rendered as the chat template renders them",
    ),
    ignored("thread", "threads are not stored"),
    ignored("safeguards", "no safeguard classifiers run here"),
    ignored(
        "compaction",
        "server-side compaction is not supported; clients compact themselves",
    ),
    ignored("fallbacks", "one model is served"),
    ignored("fallback_credit_token", "one model is served"),
    ignored("billing_policy", "nothing is billed"),
    refused(
        "container",
        "code execution containers are not supported",
        never,
    ),
    refused("mcp_servers", "the MCP connector is not supported", falsy),
];

/// `POST /v1/messages/count_tokens`.
pub const COUNT_TOKENS: &[&[Field]] = &[MESSAGES_PROMPT];

/// Checks `body`'s top-level fields against `table`.
pub fn check(table: &[&[Field]], body: &Map<String, Value>) -> Result<(), ApiError> {
    for (name, value) in body {
        let field = table.iter().flat_map(|t| t.iter()).find(|f| f.name == name);
        match field.map(|f| f.treatment) {
            None => {
                return Err(ApiError::param(
                    name,
                    "is not a field of this API (unrecognized request argument)",
                ));
            }
            Some(Treatment::Refused(why, allowed)) if !value.is_null() && !allowed(value) => {
                return Err(ApiError::param(name, format!("is not supported: {why}")));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Every table as Markdown.
pub fn markdown() -> String {
    let apis: [(&str, &[&[Field]]); 5] = [
        ("POST /v1/chat/completions", CHAT),
        ("POST /v1/completions", COMPLETIONS),
        ("POST /v1/responses", RESPONSES),
        ("POST /v1/messages", MESSAGES),
        ("POST /v1/messages/count_tokens", COUNT_TOKENS),
    ];
    let mut out = String::from(
        "# Request fields\n\nWhat each API does with every top-level field of a request. \
         Generated from the front end's table (`frontend/src/fields.rs`; the test `fields_doc` \
         keeps this file equal to it). A field that is in no table is refused with a 400 that \
         names it; nested objects accept fields they do not know (SDKs send a response's extras \
         back).\n",
    );
    for (api, table) in apis {
        out.push_str(&format!("\n## {api}\n\n| field | treatment |\n|---|---|\n"));
        for f in table.iter().flat_map(|t| t.iter()) {
            let treatment = match f.treatment {
                Treatment::Honoured => "honoured".to_string(),
                Treatment::Ignored(why) => format!("accepted and ignored: {why}"),
                Treatment::Refused(why, _) => format!("refused (400) unless null: {why}"),
            };
            out.push_str(&format!("| `{}` | {treatment} |\n", f.name));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn unknown_and_refused_fields_are_named_and_ignored_ones_pass() {
        let e = check(CHAT, &body(json!({"messages": [], "frobnicate": 1}))).unwrap_err();
        assert!(e.to_string().contains("frobnicate"), "{e}");
        assert!(
            check(
                CHAT,
                &body(json!({"messages": [], "user": "u", "audio": null}))
            )
            .is_ok()
        );
        let e = check(CHAT, &body(json!({"audio": {"voice": "x"}}))).unwrap_err();
        assert!(e.to_string().contains("audio"), "{e}");
        assert!(check(CHAT, &body(json!({"modalities": ["text"]}))).is_ok());
        assert!(check(RESPONSES, &body(json!({"previous_response_id": "r"}))).is_err());
        assert!(check(MESSAGES, &body(json!({"mcp_servers": []}))).is_ok());
        assert!(check(COUNT_TOKENS, &body(json!({"max_tokens": 5}))).is_err());
    }

    #[test]
    fn no_field_is_listed_twice_in_one_api() {
        for table in [CHAT, COMPLETIONS, RESPONSES, MESSAGES, COUNT_TOKENS] {
            let mut names: Vec<&str> = table
                .iter()
                .flat_map(|t| t.iter())
                .map(|f| f.name)
                .collect();
            let n = names.len();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), n);
        }
    }
}
