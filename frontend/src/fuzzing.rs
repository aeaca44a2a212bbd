//! Fuzzing entry points (used by `fuzz/` and by the corpus replay test): arbitrary bytes as
//! request bodies of every route, and as text through the stop-string matcher. Parsing must
//! return an error, never panic.

use crate::body::{RequestBody, parse};
use crate::openai::request::{ChatRequest, CompletionRequest};
use crate::routes::EvictBody;
use crate::text::stop::StopMatcher;

/// Parses `data` as each route's body (and checks evict selectors).
pub fn request_bodies(data: &[u8]) {
    if let Ok(mut chat) = parse::<ChatRequest>(data) {
        let _ = chat.complete(data);
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
