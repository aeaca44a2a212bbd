use super::*;

fn dir_with(config: Option<&str>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    if let Some(text) = config {
        std::fs::write(dir.path().join("generation_config.json"), text).unwrap();
    }
    dir
}

fn error_of(model: &Path, operator: &OperatorDefaults) -> String {
    resolve(model, operator).expect_err("refused").to_string()
}

#[test]
fn without_a_file_or_settings_the_server_defaults_apply() {
    let dir = dir_with(None);
    let r = resolve(dir.path(), &OperatorDefaults::default()).unwrap();
    assert_eq!(r.values, SamplingDefaults::default());
    assert!(
        r.sources.iter().all(|(_, s)| s == "server default"),
        "{r:?}"
    );
    assert_eq!(r.sources.len(), 5);
}

#[test]
fn the_models_file_comes_first_then_the_settings_then_the_server() {
    let dir = dir_with(Some(
        r#"{"temperature": 0.6, "top_p": 0.95, "top_k": 20, "eos_token_id": [1, 2], "min_p": null}"#,
    ));
    let operator = OperatorDefaults {
        temperature: Some(0.1),
        min_p: Some(0.05),
        ..OperatorDefaults::default()
    };
    let r = resolve(dir.path(), &operator).unwrap();
    let want = SamplingDefaults {
        temperature: 0.6,
        top_p: 0.95,
        top_k: 20,
        min_p: 0.05,
        repetition_penalty: 1.0,
    };
    assert_eq!(r.values, want);
    let file = dir
        .path()
        .join("generation_config.json")
        .display()
        .to_string();
    let source = |name: &str| {
        r.sources
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap()
            .1
            .clone()
    };
    assert_eq!(source("temperature"), file);
    assert_eq!(source("top_k"), file);
    assert_eq!(source("min_p"), "settings");
    assert_eq!(source("repetition_penalty"), "server default");
    assert!(
        r.describe().contains("temperature=0.6 ("),
        "{}",
        r.describe()
    );
}

#[test]
fn a_gguf_file_reads_the_settings_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.Q4_1.gguf");
    std::fs::write(&model, b"not read here").unwrap();
    assert_eq!(
        generation_config_path(&model),
        dir.path().join("tiny.Q4_1.generation_config.json")
    );
    std::fs::write(
        dir.path().join("tiny.Q4_1.generation_config.json"),
        r#"{"temperature": 0.2, "top_p": 0.9}"#,
    )
    .unwrap();
    let r = resolve(&model, &OperatorDefaults::default()).unwrap();
    assert_eq!((r.values.temperature, r.values.top_p), (0.2, 0.9));
}

#[test]
fn a_malformed_file_is_an_error_naming_it() {
    let dir = dir_with(Some("{\"temperature\": 0.7,"));
    let e = error_of(dir.path(), &OperatorDefaults::default());
    assert!(
        e.contains("generation_config.json") && e.contains("not valid JSON"),
        "{e}"
    );

    let dir = dir_with(Some("[0.7]"));
    let e = error_of(dir.path(), &OperatorDefaults::default());
    assert!(
        e.contains("generation_config.json") && e.contains("JSON object"),
        "{e}"
    );
}

#[test]
fn a_bad_value_in_the_file_or_the_settings_is_an_error_naming_the_key() {
    let dir = dir_with(Some(r#"{"temperature": "hot"}"#));
    let e = error_of(dir.path(), &OperatorDefaults::default());
    assert!(
        e.contains("generation_config.json")
            && e.contains("`temperature` must be a number, got a string"),
        "{e}"
    );

    let dir = dir_with(Some(r#"{"top_p": 1.5}"#));
    let e = error_of(dir.path(), &OperatorDefaults::default());
    assert!(
        e.contains("`top_p` must be above 0 and at most 1, got 1.5"),
        "{e}"
    );

    let dir = dir_with(Some(r#"{"top_k": 2.5}"#));
    let e = error_of(dir.path(), &OperatorDefaults::default());
    assert!(e.contains("`top_k` must be a whole number"), "{e}");

    let dir = dir_with(None);
    let operator = OperatorDefaults {
        temperature: Some(-1.0),
        ..OperatorDefaults::default()
    };
    let e = error_of(dir.path(), &operator);
    assert!(
        e.contains("default temperature (settings) must be at least 0"),
        "{e}"
    );
}
