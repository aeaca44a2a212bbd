use super::*;
use crate::chat::ToolCall;

fn events(frames: &[Frame]) -> Vec<(&'static str, Value)> {
    frames
        .iter()
        .map(|f| (f.event.unwrap(), serde_json::from_str(&f.data).unwrap()))
        .collect()
}

#[test]
fn a_stream_has_anthropic_s_events_in_order_and_honest_usage() {
    let mut m = MessageOut::new("claude-x".into(), 100, false);
    let mut frames = m.opening();
    frames.extend(m.event(&Event::Reasoning("hm".into())));
    frames.extend(m.event(&Event::Text {
        text: "Hi".into(),
        logprobs: vec![],
    }));
    frames.extend(m.event(&Event::Call(ToolCall {
        id: "toolu_1".into(),
        name: "f".into(),
        arguments: "{\"a\":1}".into(),
    })));
    frames.extend(m.event(&Event::Finished {
        finish: Finish::Stop,
        usage: Tally {
            prompt: 100,
            cached: 32,
            pinned: 64,
            completion: 7,
            reasoning: 1,
        },
        calls: 1,
    }));
    let ev = events(&frames);
    let names: Vec<&str> = ev.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    for (name, data) in &ev {
        assert_eq!(data["type"], *name);
    }
    assert_eq!(ev[0].1["message"]["content"], json!([]));
    assert_eq!(
        ev[1].1["content_block"],
        json!({"type": "thinking", "thinking": "", "signature": ""})
    );
    assert_eq!(ev[3].1["delta"]["type"], "signature_delta");
    assert_eq!(
        ev[5].1["content_block"],
        json!({"type": "text", "text": ""})
    );
    assert_eq!(ev[8].1["index"], 2);
    assert_eq!(ev[8].1["content_block"]["input"], json!({}));
    assert_eq!(ev[9].1["delta"]["partial_json"], "{\"a\":1}");
    let delta = &ev[11].1;
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    let u = &delta["usage"];
    // 32 read, 64 pinned of which 32 were read: 32 written, 36 neither.
    assert_eq!(u["cache_read_input_tokens"], 32);
    assert_eq!(u["cache_creation_input_tokens"], 32);
    assert_eq!(u["input_tokens"], 36);
    assert_eq!(u["output_tokens"], 7);
}

#[test]
fn stop_reasons_follow_anthropic_s_names() {
    assert_eq!(stop_reason(&Finish::Stop, 0), ("end_turn", None));
    assert_eq!(stop_reason(&Finish::Length, 0), ("max_tokens", None));
    assert_eq!(
        stop_reason(&Finish::StopSequence("END".into()), 0),
        ("stop_sequence", Some("END".into()))
    );
}
