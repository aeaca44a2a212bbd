use super::*;
use crate::chat::ToolCall;
use crate::completion::Tally;
use serde_json::Value;

fn usage() -> Tally {
    Tally {
        prompt: 10,
        cached: 0,
        pinned: 0,
        completion: 2,
        reasoning: 0,
    }
}

fn parse(f: &Frame) -> Value {
    serde_json::from_str(&f.data).unwrap()
}

fn text(t: &str) -> Event {
    Event::Text {
        text: t.into(),
        logprobs: vec![],
    }
}

#[test]
fn a_chat_stream_opens_with_the_role_and_ends_with_usage() {
    let mut c = Chunker::new(Kind::Chat, "chatcmpl-1".into(), "m".into());
    c.include_usage = true;
    let open = parse(&c.opening()[0]);
    assert_eq!(open["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(open["object"], "chat.completion.chunk");
    assert!(open["usage"].is_null() && open.as_object().unwrap().contains_key("usage"));
    let t = parse(&c.event(&text("Hi"))[0]);
    assert_eq!(t["choices"][0]["delta"]["content"], "Hi");
    assert!(t["choices"][0]["delta"].get("role").is_none());
    let end = c.event(&Event::Finished {
        finish: Finish::Stop,
        usage: usage(),
        calls: 0,
    });
    assert_eq!(end.len(), 2);
    assert_eq!(parse(&end[0])["choices"][0]["finish_reason"], "stop");
    let last = parse(&end[1]);
    assert_eq!(last["choices"].as_array().unwrap().len(), 0);
    assert_eq!(last["usage"]["total_tokens"], 12);
    assert_eq!(last["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(c.closing()[0].data, "[DONE]");
}

#[test]
fn tool_calls_stream_as_openai_streams_them() {
    let mut c = Chunker::new(Kind::Chat, "chatcmpl-1".into(), "m".into());
    let call = |id: &str, args: &str| {
        Event::Call(ToolCall {
            id: id.into(),
            name: "get_weather".into(),
            arguments: args.into(),
        })
    };
    let first = c.event(&call("call_a", "{\"city\":\"Paris\"}"));
    assert_eq!(first.len(), 2);
    let head = &parse(&first[0])["choices"][0]["delta"]["tool_calls"][0];
    assert_eq!(head["index"], 0);
    assert_eq!(head["id"], "call_a");
    assert_eq!(head["type"], "function");
    assert_eq!(head["function"]["name"], "get_weather");
    assert_eq!(head["function"]["arguments"], "");
    let args = &parse(&first[1])["choices"][0]["delta"]["tool_calls"][0];
    assert_eq!(args["index"], 0);
    assert!(args.get("id").is_none() && args["function"].get("name").is_none());
    assert_eq!(args["function"]["arguments"], "{\"city\":\"Paris\"}");
    let second = c.event(&call("call_b", "{}"));
    assert_eq!(
        parse(&second[0])["choices"][0]["delta"]["tool_calls"][0]["index"],
        1
    );
    let end = c.event(&Event::Finished {
        finish: Finish::Stop,
        usage: usage(),
        calls: 2,
    });
    assert_eq!(parse(&end[0])["choices"][0]["finish_reason"], "tool_calls");
}

#[test]
fn reasoning_streams_under_both_names() {
    let mut c = Chunker::new(Kind::Chat, "chatcmpl-1".into(), "m".into());
    let r = parse(&c.event(&Event::Reasoning("hmm".into()))[0]);
    assert_eq!(r["choices"][0]["delta"]["reasoning_content"], "hmm");
    assert_eq!(r["choices"][0]["delta"]["reasoning"], "hmm");
    assert!(r["choices"][0]["delta"].get("content").is_none());
}

#[test]
fn completion_chunks_carry_text_and_offsets() {
    let mut c = Chunker::new(Kind::Completion, "cmpl-1".into(), "m".into());
    c.logprobs = true;
    assert!(c.opening().is_empty());
    let lp = |t: &str| TokenLogprob {
        token: t.into(),
        logprob: -0.5,
    };
    c.event(&Event::Text {
        text: "ab".into(),
        logprobs: vec![lp("ab")],
    });
    let second = parse(
        &c.event(&Event::Text {
            text: "c".into(),
            logprobs: vec![lp("c")],
        })[0],
    );
    assert_eq!(second["object"], "text_completion");
    assert_eq!(second["choices"][0]["text"], "c");
    assert_eq!(second["choices"][0]["logprobs"]["text_offset"][0], 2);
    assert!(second.get("usage").is_none());
    let end = c.event(&Event::Finished {
        finish: Finish::Length,
        usage: usage(),
        calls: 0,
    });
    assert_eq!(end.len(), 1);
    assert_eq!(parse(&end[0])["choices"][0]["finish_reason"], "length");
}
