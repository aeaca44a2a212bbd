//! Constrained decoding in the daemon itself, under the front end: a batch of requests that
//! follow one JSON schema, sampled at temperature 0.8 beside a greedy one and one sampled on the
//! host (a penalty), each answer parses and keeps to the schema; a logit bias of +100 makes every
//! token the biased one; a grammar that does not compile is the request's error. Run on a GPU
//! too (scripts/gpu_check.sh), where the masks are added to the device's batched draw.

use mlxcel_frontend::text::ModelText;
use mlxcel_frontend::text::template::TemplateMessage;
use mlxcel_grammar::{Grammar, JsonStyle};
use mlxcel_ipc::proto::ErrorCode;
use mlxcel_ipc::proto::daemon::{
    DaemonToFrontend, FinishReason, FrontendToDaemon, Generate, Sampling,
};
use mlxcel_tests::daemon::{Daemon, frontend, replies};
use mlxcel_tests::default_model;
use serde_json::{Value, json};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "legs": {"type": "integer", "minimum": 0, "maximum": 8},
            "colors": {"type": "array", "maxItems": 3, "items": {"enum": ["black", "white", "orange"]}}
        },
        "required": ["name", "legs", "colors"]
    })
}

#[tokio::test]
async fn answers_follow_their_grammar_whatever_path_samples_them() {
    let dir = mlxcel_tests::temp_dir("mxg");
    let mut d = Daemon::spawn(
        dir.path(),
        &default_model(),
        &["--kv-pool-bytes", "256MiB"],
        &[],
    );
    d.wait_serving(dir.path());
    let mut c = frontend(dir.path()).await;
    c.write_frame(&FrontendToDaemon::Info).await.unwrap();
    let model = match c.read_frame::<DaemonToFrontend>().await {
        Ok(Some(DaemonToFrontend::Info(info))) => ModelText::new(&info).expect("model text"),
        other => panic!("no model info: {other:?}"),
    };
    let chat = [TemplateMessage::new("user", "Describe a cat as JSON.")];
    let prompt = model
        .encode(&model.render_chat(&chat).unwrap(), false)
        .unwrap();
    let grammar = Grammar::json_schema(&schema(), JsonStyle::Python, true).to_wire();
    let request = |id: u64, sampling: Sampling| {
        FrontendToDaemon::Generate(Generate {
            request_id: id,
            prompt: prompt.clone(),
            max_tokens: 120,
            stop_ids: model.stop_ids.clone(),
            sampling,
            logprobs: false,
            cache_salt: None,
            grammar: Some(grammar.clone()),
            logit_bias: Vec::new(),
            pins: Vec::new(),
        })
    };
    let sampled = |seed| Sampling {
        temperature: 0.8,
        seed: Some(seed),
        ..Sampling::default()
    };
    for id in 0..6 {
        c.write_frame(&request(id, sampled(id))).await.unwrap();
    }
    c.write_frame(&request(6, Sampling::default()))
        .await
        .unwrap();
    let host = Sampling {
        repetition_penalty: 1.2,
        ..sampled(7)
    };
    c.write_frame(&request(7, host)).await.unwrap();
    let done = replies(&mut c, 8).await;
    for (id, r) in &done {
        let text = model.tokenizer.decode(&r.tokens, true).unwrap();
        assert_eq!(
            r.finish,
            FinishReason::Stop,
            "request {id} did not complete: {text:?}"
        );
        let v: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("request {id}: {text:?}: {e}"));
        let legs = v["legs"].as_i64().expect("legs");
        assert!((0..=8).contains(&legs), "{text}");
        assert!(v["name"].as_str().unwrap().chars().count() <= 20, "{text}");
        assert_eq!(v.as_object().unwrap().len(), 3, "strict: {text}");
        for color in v["colors"].as_array().unwrap() {
            assert!(
                ["black", "white", "orange"].contains(&color.as_str().unwrap()),
                "{text}"
            );
        }
    }

    // A bias of +100 on one token: every token is that one.
    c.write_frame(&FrontendToDaemon::Generate(Generate {
        request_id: 20,
        prompt: prompt.clone(),
        max_tokens: 5,
        stop_ids: model.stop_ids.clone(),
        sampling: sampled(3),
        logprobs: false,
        cache_salt: None,
        grammar: None,
        logit_bias: vec![(1000, 100.0)],
        pins: Vec::new(),
    }))
    .await
    .unwrap();
    let biased = replies(&mut c, 1).await.remove(&20).expect("request 20");
    assert_eq!(biased.tokens, vec![1000; 5]);

    // A grammar that does not compile fails its request, with the reason.
    let bad = Grammar::json_schema(&json!({"type": "strin"}), JsonStyle::Python, false);
    c.write_frame(&FrontendToDaemon::Generate(Generate {
        request_id: 21,
        grammar: Some(bad.to_wire()),
        ..match request(21, Sampling::default()) {
            FrontendToDaemon::Generate(g) => g,
            _ => unreachable!(),
        }
    }))
    .await
    .unwrap();
    loop {
        match c.read_frame::<DaemonToFrontend>().await.unwrap().unwrap() {
            DaemonToFrontend::Failed {
                request_id: 21,
                error,
            } => {
                assert_eq!(error.code, ErrorCode::BadRequest);
                assert!(error.message.contains("strin"), "{}", error.message);
                break;
            }
            DaemonToFrontend::Done { request_id: 21, .. } => panic!("a bad grammar was served"),
            _ => {}
        }
    }
}
