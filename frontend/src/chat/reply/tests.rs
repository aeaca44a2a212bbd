use super::*;
use crate::chat::tool_formats::{FORMATS, ToolFormat};

fn format(name: &str) -> &'static ToolFormat {
    FORMATS.iter().find(|f| f.name == name).unwrap()
}

/// Feeds `pieces` and returns every part, texts of a kind joined.
fn run(mut p: ReplyParser, pieces: &[&str]) -> Vec<Part> {
    let mut parts = Vec::new();
    for piece in pieces {
        parts.extend(p.push(piece));
    }
    parts.extend(p.finish());
    let mut joined: Vec<Part> = Vec::new();
    for part in parts {
        match (joined.last_mut(), part) {
            (Some(Part::Text(a)), Part::Text(b)) => a.push_str(&b),
            (Some(Part::Reasoning(a)), Part::Reasoning(b)) => a.push_str(&b),
            (_, p) => joined.push(p),
        }
    }
    joined
}

fn tools(name: &str) -> Option<(&'static ToolFormat, Vec<Tool>)> {
    Some((format(name), Vec::new()))
}

#[test]
fn reasoning_is_split_from_the_answer_across_pieces() {
    let p = ReplyParser::new(None, Some(Reasoning::THINK), true, "call");
    let parts = run(
        p,
        &["I sh", "ould think", "</th", "ink>\n\nThe answer", " is 4."],
    );
    assert_eq!(
        parts,
        vec![
            Part::Reasoning("I should think".into()),
            Part::Text("The answer is 4.".into())
        ]
    );
    // A model that opens its reasoning itself; a `<think>` later in the text stays text.
    let p = ReplyParser::new(None, Some(Reasoning::THINK), false, "call");
    let parts = run(p, &["<think>", "hmm</think>ok <think>"]);
    assert_eq!(
        parts,
        vec![
            Part::Reasoning("hmm".into()),
            Part::Text("ok <think>".into())
        ]
    );
    // Inline: nothing is split.
    let p = ReplyParser::new(None, None, false, "call");
    assert_eq!(
        run(p, &["<think>a</think>b"]),
        vec![Part::Text("<think>a</think>b".into())]
    );
}

#[test]
fn hermes_calls_are_found_across_pieces_and_blanks_between_them_dropped() {
    let p = ReplyParser::new(tools("hermes"), None, false, "call");
    let parts = run(
        p,
        &[
            "<tool_",
            "call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>",
            "\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool",
            "_call>\n",
        ],
    );
    let names: Vec<&str> = parts
        .iter()
        .map(|p| match p {
            Part::Call(c) => c.name.as_str(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(names, ["a", "b"]);
    if let Part::Call(c) = &parts[0] {
        assert!(c.id.starts_with("call_"));
        assert_eq!(c.arguments, "{\"x\":1}");
    }
}

#[test]
fn text_before_a_call_is_text_and_a_broken_call_is_never_lost() {
    let p = ReplyParser::new(tools("hermes"), None, false, "toolu");
    let parts = run(p, &["Let me check.\n<tool_call>\n{oops}\n</tool_call>"]);
    assert_eq!(
        parts,
        vec![Part::Text(
            "Let me check.\n<tool_call>\n{oops}\n</tool_call>".into()
        )]
    );
    // Cut off by the token limit inside a call: the text comes back.
    let p = ReplyParser::new(tools("hermes"), None, false, "call");
    assert_eq!(
        run(p, &["<tool_call>\n{\"name\": \"a\""]),
        vec![Part::Text("<tool_call>\n{\"name\": \"a\"".into())]
    );
}

#[test]
fn formats_without_a_closing_marker_run_to_the_end() {
    let p = ReplyParser::new(tools("llama3-json"), None, false, "call");
    let parts = run(
        p,
        &["  {\"name\": \"a\", ", "\"parameters\": {\"q\": \"x\"}}"],
    );
    assert!(
        matches!(&parts[..], [Part::Call(c)] if c.name == "a"),
        "{parts:?}"
    );
    // Only at the start: a brace later in prose is text.
    let p = ReplyParser::new(tools("llama3-json"), None, false, "call");
    assert_eq!(run(p, &["Use {x}."]), vec![Part::Text("Use {x}.".into())]);
    let p = ReplyParser::new(tools("mistral"), None, false, "call");
    let parts = run(p, &["[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}]"]);
    assert!(
        matches!(&parts[..], [Part::Call(c)] if c.name == "a"),
        "{parts:?}"
    );
}

#[test]
fn partial_suffixes_respect_character_boundaries() {
    assert_eq!(partial_suffix("abc<tool", "<tool_call>"), 5);
    assert_eq!(partial_suffix("é", "<think>"), 0);
    assert_eq!(partial_suffix("x</thin", "</think>"), 6);
}

#[test]
fn harmony_channels_split_into_reasoning_text_and_calls() {
    let harmony = Some(Reasoning::HARMONY);
    // Reasoning, then the final channel's answer (split anywhere, markers included).
    let answer = "<|channel|>analysis<|message|>The user greets.<|end|><|start|>assistant\
                  <|channel|>final<|message|>Hello there!<|return|>";
    for cut in [1, 5, 9, 13] {
        let pieces: Vec<String> = answer
            .chars()
            .collect::<Vec<_>>()
            .chunks(cut)
            .map(|c| c.iter().collect())
            .collect();
        let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
        let p = ReplyParser::new(tools("harmony"), harmony, false, "call");
        assert_eq!(
            run(p, &refs),
            vec![
                Part::Reasoning("The user greets.".into()),
                Part::Text("Hello there!".into())
            ],
            "pieces of {cut}"
        );
    }
    // Reasoning, then a call whose `<|call|>` stopped the answer (not in the text) ...
    let call = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant\
                <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>\
                {\"city\":\"Tokyo\"}";
    let parts = run(
        ReplyParser::new(tools("harmony"), harmony, false, "call"),
        &[call],
    );
    assert_eq!(parts[0], Part::Reasoning("Need the weather.".into()));
    match &parts[1..] {
        [Part::Call(c)] => assert_eq!(
            (c.name.as_str(), c.arguments.as_str()),
            ("get_weather", "{\"city\":\"Tokyo\"}")
        ),
        other => panic!("{other:?}"),
    }
    // ... or with the recipient before the channel, and the close kept.
    let call = "<|start|>assistant to=functions.get_weather<|channel|>commentary json\
                <|message|>{\"city\":\"Oslo\"}<|call|>";
    let parts = run(
        ReplyParser::new(tools("harmony"), harmony, false, "call"),
        &[call],
    );
    match &parts[..] {
        [Part::Call(c)] => assert_eq!(c.arguments, "{\"city\":\"Oslo\"}"),
        other => panic!("{other:?}"),
    }
}
