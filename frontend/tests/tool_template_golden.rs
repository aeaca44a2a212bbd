//! Tools, earlier calls, tool results and reasoning reach a chat template as Hugging Face's
//! `apply_chat_template` passes them: a Qwen-style template renders each conversation of the
//! fixture byte for byte as transformers rendered it (`scripts/make_goldens.py --templates`),
//! from the OpenAI request a client would send.

use std::path::Path;

use mlxcel_frontend::chat::render::prompt_text;
use mlxcel_frontend::openai::chat::conversation;
use mlxcel_frontend::openai::request::ChatRequest;
use mlxcel_frontend::text::TemplateAbilities;
use mlxcel_frontend::text::template::ChatTemplate;
use serde_json::{Value, json};

#[test]
fn a_qwen_style_template_renders_tool_conversations_as_hugging_face_does() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let golden: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tool_templates.json")).unwrap())
            .unwrap();
    let source = std::fs::read_to_string(dir.join("qwen_style_template.jinja")).unwrap();
    let template = ChatTemplate::new(&source, "", "<|im_end|>").unwrap();
    let abilities = TemplateAbilities::of(&source);
    assert_eq!(abilities.tool_format.map(|f| f.name), Some("hermes"));
    let cases = golden["cases"].as_array().unwrap();
    assert!(cases.len() >= 4);
    for (i, case) in cases.iter().enumerate() {
        let mut body = json!({"messages": case["messages"]});
        if let Some(tools) = case.get("tools") {
            body["tools"] = tools.clone();
        }
        if let Some(on) = case.get("enable_thinking") {
            body["chat_template_kwargs"] = json!({"enable_thinking": on});
        }
        let req: ChatRequest = serde_json::from_value(body).unwrap();
        let conv = conversation(&req).unwrap();
        let text = prompt_text(&conv, &template, abilities).unwrap();
        assert_eq!(
            text,
            case["rendered"].as_str().unwrap(),
            "case {i} renders differently"
        );
    }
}
