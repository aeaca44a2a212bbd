//! The README's examples are tests: every `sh` block that calls `curl` and every `python` block
//! of README.md runs, as written (only the port is changed), against the real stack with the
//! default model, and its answer must be sensible: the capital question mentions Paris, the
//! haiku is made of dictionary words. An example this test has no check for fails it, so a new
//! example cannot go untested. Also here: omitted sampling parameters take the model's defaults.

use mlxcel_tests::{http, serve as stack};

use std::collections::HashSet;
use std::process::Command;

use mlxcel_tests::root;
use serde_json::{Value, json};
use stack::Served;

/// A fenced code block of the README.
struct Example {
    lang: String,
    code: String,
    line: usize,
}

fn examples(readme: &str) -> Vec<Example> {
    let mut out = Vec::new();
    let mut open: Option<Example> = None;
    for (n, line) in readme.lines().enumerate() {
        if let Some(fence) = line.strip_prefix("```") {
            match open.take() {
                Some(done) => out.push(done),
                None => {
                    open = Some(Example {
                        lang: fence.trim().to_string(),
                        code: String::new(),
                        line: n + 1,
                    })
                }
            }
        } else if let Some(e) = open.as_mut() {
            e.code.push_str(line);
            e.code.push('\n');
        }
    }
    out.into_iter()
        .filter(|e| (e.lang == "sh" && e.code.contains("curl ")) || e.lang == "python")
        .collect()
}

/// The example with the README's port (8080) replaced by the test stack's.
fn on_port(code: &str, port: u16) -> String {
    code.replace("localhost:8080", &format!("localhost:{port}"))
        .replace("127.0.0.1:8080", &format!("127.0.0.1:{port}"))
}

fn run(example: &Example, port: u16) -> String {
    let code = on_port(&example.code, port);
    let out = match example.lang.as_str() {
        "sh" => Command::new("bash")
            .args(["-euo", "pipefail", "-c", &code])
            .output(),
        _ => Command::new(root().join(".venv/bin/python"))
            .args(["-c", &code])
            .output(),
    }
    .expect("run the example");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "README line {}: the example failed ({}):\n{code}\nstdout: {stdout}\nstderr: {}",
        example.line,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The text an example printed: a chat completion's message, or the streamed text itself.
fn answer_of(stdout: &str) -> String {
    match serde_json::from_str::<Value>(stdout) {
        Ok(v) => v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_else(|| panic!("no message in {v}"))
            .to_string(),
        Err(_) => stdout.to_string(),
    }
}

fn words() -> HashSet<String> {
    let list = root().join("tests/readme/words.txt");
    std::fs::read_to_string(&list)
        .expect("the word list")
        .lines()
        .map(str::to_string)
        .collect()
}

/// The share of `text`'s words found in the word list, and how many words it has.
fn dictionary_share(text: &str, list: &HashSet<String>) -> (f64, usize) {
    let words: Vec<String> = text
        .split(|c: char| !c.is_ascii_alphabetic() && c != '\'')
        .map(|w| w.trim_matches('\'').to_ascii_lowercase())
        .filter(|w| !w.is_empty())
        .collect();
    let known = words
        .iter()
        .filter(|w| list.contains(*w) || w.strip_suffix("'s").is_some_and(|s| list.contains(s)))
        .count();
    (known as f64 / words.len().max(1) as f64, words.len())
}

fn check(example: &Example, answer: &str, list: &HashSet<String>) {
    let at = format!("README line {}", example.line);
    if example.code.contains("capital of France") {
        assert!(
            answer.contains("Paris"),
            "{at}: the capital answer was {answer:?}"
        );
    } else if example.code.contains("haiku") {
        let (share, n) = dictionary_share(answer, list);
        assert!(
            n >= 5 && share >= 0.8,
            "{at}: the haiku has {n} words, {:.0}% in the word list: {answer:?}",
            share * 100.0
        );
    } else {
        panic!(
            "{at}: an example this test has no check for; add one:\n{}",
            example.code
        );
    }
}

#[test]
fn the_readme_examples_run_as_written_and_answer_sensibly() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let found = examples(&readme);
    assert!(
        found.iter().any(|e| e.lang == "sh") && found.iter().any(|e| e.lang == "python"),
        "the README's curl and Python examples were not found"
    );
    let served = Served::start(&[]);
    let list = words();
    for example in &found {
        let answer = answer_of(&run(example, served.port));
        check(example, &answer, &list);
    }
}

fn chat(port: u16, extra: Value) -> String {
    let mut body = json!({"messages": [{"role": "user", "content": "Name a colour of the sea."}],
                          "max_tokens": 24});
    for (k, v) in extra.as_object().expect("an object") {
        body[k] = v.clone();
    }
    let (status, r) = http::request(port, "POST", "/v1/chat/completions", Some(&body)).unwrap();
    assert_eq!(status, 200, "{r}");
    r["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_string()
}

#[test]
fn omitted_sampling_parameters_take_the_models_defaults_and_explicit_ones_win() {
    let served = Served::start(&[]);
    let port = served.port;
    let (_, models) = http::request(port, "GET", "/v1/models", None).unwrap();
    let d = &models["data"][0]["sampling_defaults"];
    assert_eq!(
        (d["temperature"].as_f64(), d["top_p"].as_f64()),
        (Some(0.2), Some(0.9)),
        "{models}"
    );
    assert!(
        served
            .log()
            .contains("sampling defaults: temperature=0.2 ("),
        "{}",
        served.log()
    );
    // Seeded: the same text twice, and the same as asking for the card's settings explicitly.
    let omitted = chat(port, json!({"seed": 7}));
    assert_eq!(chat(port, json!({"seed": 7})), omitted);
    let explicit = chat(port, json!({"seed": 7, "temperature": 0.2, "top_p": 0.9}));
    assert_eq!(explicit, omitted);
    // An explicit value wins: temperature 0 is greedy, whatever the seed.
    let greedy = chat(port, json!({"temperature": 0, "seed": 1}));
    assert_eq!(chat(port, json!({"temperature": 0, "seed": 2})), greedy);
    // And a hot temperature with another seed does not reproduce the default's text.
    let hot: Vec<String> = (0..3)
        .map(|s| {
            chat(
                port,
                json!({"seed": 100 + s, "temperature": 2.0, "top_p": 1.0}),
            )
        })
        .collect();
    assert!(hot.iter().any(|h| *h != omitted), "{hot:?} vs {omitted:?}");
}

#[test]
fn the_word_check_tells_words_from_inventions() {
    let list = words();
    let (share, n) = dictionary_share("Waves kiss the shore,\nthe sea's salty breath.", &list);
    assert_eq!((n, share), (8, 1.0));
    let (share, _) = dictionary_share("Flumbrig quoxate vellisar, drumbotic seaward", &list);
    assert!(share < 0.5, "{share}");
    assert_eq!(
        on_port("curl -s localhost:8080/v1", 9),
        "curl -s localhost:9/v1"
    );
    let found =
        examples("text\n```sh\ncurl -s x\n```\n```sh\nmake test\n```\n```python\nprint(1)\n```\n");
    assert_eq!(
        found.iter().map(|e| e.lang.as_str()).collect::<Vec<_>>(),
        ["sh", "python"]
    );
}
