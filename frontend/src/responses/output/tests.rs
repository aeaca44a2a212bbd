use super::*;
use crate::chat::ToolCall;

fn echo() -> Echo {
    Echo {
        model: "m".into(),
        instructions: None,
        max_output_tokens: None,
        temperature: None,
        top_p: None,
        tools: vec![],
        tool_choice: json!("auto"),
        parallel_tool_calls: true,
        text: json!({"format": {"type": "text"}}),
        reasoning_effort: None,
        metadata: json!({}),
    }
}

fn tally() -> Tally {
    Tally {
        prompt: 10,
        cached: 4,
        pinned: 0,
        completion: 3,
        reasoning: 1,
    }
}

#[test]
fn the_stream_opens_items_before_their_deltas_and_completes_with_every_item() {
    let mut r = ResponseOut::new(echo());
    let mut frames = r.opening();
    frames.extend(r.event(&Event::Reasoning("why".into())));
    frames.extend(r.event(&Event::Text {
        text: "Hi".into(),
        logprobs: vec![],
    }));
    frames.extend(r.event(&Event::Call(ToolCall {
        id: "call_1".into(),
        name: "f".into(),
        arguments: "{}".into(),
    })));
    frames.extend(r.event(&Event::Finished {
        finish: Finish::Stop,
        usage: tally(),
        calls: 1,
    }));
    let ev: Vec<(&str, Value)> = frames
        .iter()
        .map(|f| (f.event.unwrap(), serde_json::from_str(&f.data).unwrap()))
        .collect();
    let names: Vec<&str> = ev.iter().map(|(n, _)| *n).collect();
    assert_eq!(names[..2], ["response.created", "response.in_progress"]);
    assert_eq!(
        names[2..6],
        [
            "response.output_item.added",
            "response.content_part.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.done"
        ]
    );
    let text_delta = names
        .iter()
        .position(|n| *n == "response.output_text.delta")
        .unwrap();
    assert_eq!(names[text_delta - 1], "response.content_part.added");
    assert_eq!(names.last(), Some(&"response.completed"));
    for (i, (name, data)) in ev.iter().enumerate() {
        assert_eq!(data["type"], *name);
        assert_eq!(data["sequence_number"], i);
    }
    let done = &ev.last().unwrap().1["response"];
    assert_eq!(done["id"], ev[0].1["response"]["id"]);
    let kinds: Vec<&str> = done["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["reasoning", "message", "function_call"]);
    assert_eq!(done["output"][1]["content"][0]["text"], "Hi");
    assert_eq!(done["output"][2]["call_id"], "call_1");
    assert_eq!(done["usage"]["input_tokens_details"]["cached_tokens"], 4);
    assert_eq!(
        done["usage"]["output_tokens_details"]["reasoning_tokens"],
        1
    );
}

#[test]
fn a_cut_answer_is_incomplete() {
    let mut r = ResponseOut::new(echo());
    r.opening();
    let frames = r.event(&Event::Finished {
        finish: Finish::Length,
        usage: tally(),
        calls: 0,
    });
    let last: Value = serde_json::from_str(&frames.last().unwrap().data).unwrap();
    assert_eq!(last["type"], "response.incomplete");
    assert_eq!(
        last["response"]["incomplete_details"]["reason"],
        "max_output_tokens"
    );
}
