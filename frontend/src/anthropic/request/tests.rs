use super::*;
use serde_json::json;

fn req(body: Value) -> MessagesRequest {
    serde_json::from_value(body).unwrap()
}

#[test]
fn claude_code_s_billing_line_is_dropped_and_blocks_join() {
    let r = req(json!({
        "model": "claude-sonnet-4-5", "max_tokens": 100,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.100.7b4; cc_entrypoint=cli; cch=eb6c6;"},
            {"type": "text", "text": "You are Claude Code."},
            {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}
        ],
        "messages": [{"role": "user", "content": "hi"}]
    }));
    let conv = conversation(&r, true).unwrap();
    assert_eq!(conv.turns[0].content, "You are Claude Code.\nBe brief.");
    assert_eq!(
        conv.breakpoints,
        vec![Breakpoint {
            turn: 0,
            offset: conv.turns[0].content.len(),
            ttl_secs: 300
        }]
    );
    let kept = conversation(&r, false).unwrap();
    assert!(
        kept.turns[0]
            .content
            .starts_with("x-anthropic-billing-header:")
    );
    let s = req(
        json!({"model": "m", "system": "x-anthropic-billing-header: a;\nReal prompt",
                       "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(
        conversation(&s, true).unwrap().turns[0].content,
        "Real prompt"
    );
}

#[test]
fn tool_use_and_results_become_calls_and_tool_turns_before_the_user_s_text() {
    let r = req(json!({
        "model": "m", "max_tokens": 10,
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true},
        "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "use it", "signature": "anything"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"b": 1, "a": 2}}]},
            {"role": "user", "content": [
                {"type": "text", "text": "also"},
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "boom", "is_error": true}]}
        ]
    }));
    let conv = conversation(&r, true).unwrap();
    let roles: Vec<Role> = conv.turns.iter().map(|t| t.role).collect();
    assert_eq!(
        roles,
        [
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::Tool,
            Role::User
        ]
    );
    let a = &conv.turns[1];
    assert_eq!(a.content, "Checking.");
    assert_eq!(a.reasoning.as_deref(), Some("use it"));
    // The input's keys keep their order: the call renders back as it was generated.
    assert_eq!(a.tool_calls[0].arguments, "{\"b\":1,\"a\":2}");
    assert_eq!(conv.turns[3].content, "Error: boom");
    assert_eq!(conv.turns[4].content, "also");
    assert_eq!(conv.tool_choice, ToolChoice::Named("get_weather".into()));
    assert!(!conv.parallel_tool_calls);
}

#[test]
fn refusals_name_the_field() {
    let bad = |body: Value, needle: &str| {
        let e = conversation(&req(body), true).unwrap_err().to_string();
        assert!(e.contains(needle), "{e}");
    };
    bad(
        json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
               "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
        "tools.0",
    );
    bad(
        json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
        "messages.0.content.0.type",
    );
    bad(
        json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
               "system": [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral", "ttl": "2d"}}]}),
        "ttl",
    );
    let five: Vec<Value> = (0..5)
        .map(|i| json!({"type": "text", "text": format!("s{i}"), "cache_control": {"type": "ephemeral"}}))
        .collect();
    bad(
        json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "system": five}),
        "A maximum of 4 blocks with cache_control",
    );
}

#[test]
fn a_last_assistant_turn_is_continued_and_same_roles_merge() {
    let r = req(json!({"model": "m", "messages": [
        {"role": "user", "content": "a"}, {"role": "user", "content": "b"},
        {"role": "system", "content": "be nice"},
        {"role": "assistant", "content": "The answer is"}]}));
    let conv = conversation(&r, true).unwrap();
    assert_eq!(conv.turns.len(), 2);
    assert_eq!(conv.turns[0].content, "a\nb\nbe nice");
    assert!(conv.continue_last);
}
