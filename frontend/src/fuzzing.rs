//! Fuzzing entry points (used by `fuzz/` and by the corpus replay test): arbitrary bytes as
//! request bodies of every route (parsed, checked against the field tables, converted into a
//! conversation), and as text through the stop-string matcher and the reply parser. Parsing
//! must return an error, never panic.

use crate::anthropic::request::MessagesRequest;
use crate::body::{RequestBody, parse};
use crate::chat::reply::{Part, Reasoning, ReplyParser};
use crate::chat::tool_formats::FORMATS;
use crate::openai::request::{ChatRequest, CompletionRequest};
use crate::responses::request::ResponsesRequest;
use crate::routes::EvictBody;
use crate::text::stop::StopMatcher;

/// Parses `data` as each route's body (and checks evict selectors).
pub fn request_bodies(data: &[u8]) {
    if let Ok(fields) = parse::<serde_json::Map<String, serde_json::Value>>(data) {
        for table in [
            crate::fields::CHAT,
            crate::fields::RESPONSES,
            crate::fields::MESSAGES,
        ] {
            let _ = crate::fields::check(table, &fields);
        }
    }
    if let Ok(mut chat) = parse::<ChatRequest>(data) {
        let _ = chat.complete(data);
        let _ = crate::openai::chat::conversation(&chat);
    }
    if let Ok(r) = parse::<ResponsesRequest>(data) {
        let _ = crate::responses::request::conversation(&r);
    }
    if let Ok(m) = parse::<MessagesRequest>(data) {
        let _ = crate::anthropic::request::conversation(&m, true);
    }
    if let Ok(mut completion) = parse::<CompletionRequest>(data) {
        let _ = completion.complete(data);
    }
    if let Ok(evict) = parse::<EvictBody>(data) {
        let _ = evict.selector();
    }
}

/// The first line of `data` gives stop strings (split on `|`), the rest is fed in pieces of
/// varying sizes; the released text plus what is held must never exceed what went in.
pub fn stop_strings(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (stops, rest) = text.split_once('\n').unwrap_or(("", &text));
    let mut m = StopMatcher::new(stops.split('|').map(str::to_string).collect());
    let mut out = String::new();
    let mut chars = rest.chars().peekable();
    let mut size = 1;
    while chars.peek().is_some() {
        let piece: String = chars.by_ref().take(size).collect();
        size = size % 7 + 1;
        let r = m.push(&piece);
        out.push_str(&r.text);
        if r.stopped {
            return;
        }
    }
    out.push_str(&m.finish());
    assert_eq!(
        out, rest,
        "without a stop, every character comes out exactly once"
    );
}

/// `data` as an answer, in pieces, through the reply parser with every tool format (and
/// reasoning split): without tools or reasoning the text comes out exactly as it went in.
pub fn replies(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let feed = |mut p: ReplyParser| {
        let mut parts = Vec::new();
        let mut chars = text.chars().peekable();
        let mut size = 1;
        while chars.peek().is_some() {
            let piece: String = chars.by_ref().take(size).collect();
            size = size % 5 + 1;
            parts.extend(p.push(&piece));
        }
        parts.extend(p.finish());
        parts
    };
    for format in FORMATS {
        for reasoning in [Reasoning::THINK, Reasoning::HARMONY] {
            feed(ReplyParser::new(
                Some((format, Vec::new())),
                Some(reasoning),
                false,
                "call",
            ));
        }
    }
    let plain: String = feed(ReplyParser::new(None, None, false, "call"))
        .into_iter()
        .map(|p| match p {
            Part::Text(t) => t,
            other => panic!("a plain answer gave {other:?}"),
        })
        .collect();
    assert_eq!(plain, text, "a plain answer comes out as it went in");
}
