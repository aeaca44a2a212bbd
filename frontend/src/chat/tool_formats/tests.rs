use super::*;

fn weather() -> Tool {
    Tool {
        name: "get_weather".into(),
        description: None,
        parameters: json!({"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}),
    }
}

fn call(name: &str, args: &str) -> ParsedCall {
    ParsedCall {
        name: name.into(),
        arguments: args.into(),
    }
}

#[test]
fn templates_are_recognized_by_what_they_write() {
    let of = |t: &str| ToolFormat::of_template(t).map(|f| f.name);
    assert_eq!(of("{{ '<tool_call>\\n' }}{{ tools }}"), Some("hermes"));
    assert_eq!(of("<tool_call>\n<function={{ name }}>"), Some("qwen3-xml"));
    assert_eq!(of("[TOOL_CALLS] {{ tools }}"), Some("mistral"));
    assert_eq!(
        of("<|start_header_id|>ipython \"parameters\""),
        Some("llama3-json")
    );
    assert_eq!(
        of("<|start|>assistant to=functions.{{ name }}<|channel|>commentary"),
        Some("harmony")
    );
    assert_eq!(of("{{ messages }}"), None);
}

#[test]
fn each_format_reads_its_calls() {
    let hermes = HERMES.parse(
        "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n",
        &[],
    );
    assert_eq!(
        hermes,
        Ok(vec![call("get_weather", "{\"city\":\"Paris\"}")])
    );
    let xml = QWEN3_XML.parse(
        "\n<function=get_weather>\n<parameter=city>\nLe Mans\n</parameter>\n\
         <parameter=days>\n3\n</parameter>\n</function>\n",
        &[weather()],
    );
    assert_eq!(
        xml,
        Ok(vec![call(
            "get_weather",
            "{\"city\":\"Le Mans\",\"days\":3}"
        )])
    );
    let mistral = MISTRAL.parse(
        "[{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": {\"x\": 1}}]",
        &[],
    );
    assert_eq!(mistral, Ok(vec![call("a", "{}"), call("b", "{\"x\":1}")]));
    let newer = MISTRAL.parse("get_weather[ARGS]{\"city\": \"Oslo\"}", &[]);
    assert_eq!(newer, Ok(vec![call("get_weather", "{\"city\":\"Oslo\"}")]));
    // The answer's opening brace is the format's marker, so the body lacks it.
    let llama = LLAMA3_JSON.parse(
        "\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}",
        &[],
    );
    assert_eq!(llama, Ok(vec![call("get_weather", "{\"city\":\"Rome\"}")]));
    let harmony = HARMONY.parse(
        "get_weather <|constrain|>json<|message|>{\"city\": \"Lima\"}",
        &[],
    );
    assert_eq!(
        harmony,
        Ok(vec![call("get_weather", "{\"city\":\"Lima\"}")])
    );
    assert!(HARMONY.parse(" <|message|>{}", &[]).is_err());
    assert!(HARMONY.parse("f <|message|>[1]", &[]).is_err());
    assert!(HERMES.parse("{\"name\": 3}", &[]).is_err());
    assert!(HERMES.parse("not json", &[]).is_err());
}

#[test]
fn calls_are_written_back_as_the_format_writes_them() {
    let c = ToolCall {
        id: "x".into(),
        name: "get_weather".into(),
        arguments: "{\"city\":\"Paris\",\"days\":2}".into(),
    };
    assert_eq!(
        HERMES.write(std::slice::from_ref(&c)),
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>"
    );
    assert_eq!(
        QWEN3_XML.write(std::slice::from_ref(&c)),
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n\
         <parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"
    );
    assert_eq!(
        HARMONY.write(std::slice::from_ref(&c)),
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json\
         <|message|>{\"city\": \"Paris\", \"days\": 2}<|call|>"
    );
}

#[test]
fn forced_call_grammars_name_every_tool_and_repeat_only_when_parallel() {
    let lit = |t: &str| format!("{t:?}");
    let w = weather();
    let one = HERMES.grammar(&[&w], false, &lit);
    assert!(one.starts_with("start: call\n"), "{one}");
    assert!(
        one.contains("%json") && one.contains("\"const\":\"get_weather\""),
        "{one}"
    );
    let many = HERMES.grammar(&[&w], true, &lit);
    assert!(many.contains("(\"\\n\" call)*"), "{many}");
    let harmony = HARMONY.grammar(&[&w], true, &lit);
    assert!(
        harmony.contains("commentary to=functions.get_weather ")
            && harmony.ends_with("\"<|call|>\"\n"),
        "{harmony}"
    );
    let xml = QWEN3_XML.grammar(&[&w], false, &lit);
    assert!(
        xml.contains("<function=get_weather>") && xml.contains("<parameter=days>"),
        "{xml}"
    );
}
