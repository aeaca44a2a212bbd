use super::*;
use crate::chat::{ToolCall, Turn};

/// ChatML that renders no tools (like the default model's template).
const PLAIN: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
                     {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

fn template(source: &str) -> (ChatTemplate, TemplateAbilities) {
    (
        ChatTemplate::new(source, "", "").unwrap(),
        TemplateAbilities::of(source),
    )
}

fn weather() -> Tool {
    Tool {
        name: "get_weather".into(),
        description: Some("Weather now".into()),
        parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
    }
}

fn conversation(choice: ToolChoice) -> Conversation {
    let mut call_turn = Turn::new(Role::Assistant, "");
    call_turn.tool_calls.push(ToolCall {
        id: "c1".into(),
        name: "get_weather".into(),
        arguments: "{\"city\":\"Paris\"}".into(),
    });
    let mut result = Turn::new(Role::Tool, "18C");
    result.tool_call_id = Some("c1".into());
    Conversation {
        turns: vec![
            Turn::new(Role::User, "Weather in Paris?"),
            call_turn,
            result,
        ],
        tools: vec![weather()],
        tool_choice: choice,
        ..Conversation::default()
    }
}

#[test]
fn a_template_without_tools_refuses_auto_and_is_taught_a_forced_call() {
    let (t, abilities) = template(PLAIN);
    let err = prompt_text(&conversation(ToolChoice::Auto), &t, abilities).unwrap_err();
    assert!(err.to_string().contains("does not render tools"), "{err}");
    let text = prompt_text(&conversation(ToolChoice::Required), &t, abilities).unwrap();
    // The tools in a system turn, the earlier call in the assistant's text (as the generic
    // format writes it), the result as a user turn.
    assert!(
        text.starts_with("<|im_start|>system\nYou can call functions."),
        "{text}"
    );
    assert!(
        text.contains("{\"type\": \"function\", \"function\": {\"name\": \"get_weather\""),
        "{text}"
    );
    assert!(text.contains("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>"), "{text}");
    assert!(
        text.contains("<|im_start|>user\n<tool_response>\n18C\n</tool_response><|im_end|>"),
        "{text}"
    );
    // `none`: the tools are still described (the prompt's head, and its cached blocks, stay
    // the same whether a turn forces a call or not); no call is forced.
    let forced = prompt_text(&conversation(ToolChoice::Required), &t, abilities).unwrap();
    let none = prompt_text(&conversation(ToolChoice::None), &t, abilities).unwrap();
    assert_eq!(none, forced);
}

#[test]
fn a_template_with_tools_gets_them_as_hugging_face_passes_them() {
    let source = "{% for t in tools %}{{ t | tojson }}\n{% endfor %}{% for m in messages %}\
                  [{{ m.role }}:{{ m.content }}{% for c in m.tool_calls %}<tool_call>{{ c.function.name }} \
                  {{ c.function.arguments | tojson }}{% endfor %}{% if m.tool_call_id %}#{{ m.tool_call_id }}{% endif %}]{% endfor %}";
    let (t, abilities) = template(source);
    assert_eq!(abilities.tool_format.map(|f| f.name), Some("hermes"));
    let text = prompt_text(&conversation(ToolChoice::Auto), &t, abilities).unwrap();
    assert_eq!(
        text,
        "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather now\", \
         \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}\n\
         [user:Weather in Paris?][assistant:<tool_call>get_weather {\"city\": \"Paris\"}][tool:18C#c1]"
    );
}

#[test]
fn a_continued_turn_ends_where_its_text_ends() {
    let (t, abilities) = template(PLAIN);
    let conv = Conversation {
        turns: vec![
            Turn::new(Role::User, "Count"),
            Turn::new(Role::Assistant, "1, 2,"),
        ],
        continue_last: true,
        ..Conversation::default()
    };
    let text = prompt_text(&conv, &t, abilities).unwrap();
    assert!(text.ends_with("<|im_start|>assistant\n1, 2,"), "{text}");
}
