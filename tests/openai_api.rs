//! The OpenAI API end to end: the real cache manager, daemon (default model) and front end as
//! separate processes, driven over HTTP. Expected outputs come from the engine's golden
//! fixtures (reference template rendering, tokenization and greedy tokens), not from mlxcel.

use std::time::{Duration, Instant};

use mlxcel_frontend::text::ModelText;
use mlxcel_frontend::text::detokenize::decode;
use mlxcel_frontend::text::template::TemplateMessage;
use mlxcel_ipc::client::connect;
use mlxcel_ipc::proto::daemon::{DaemonToFrontend, FrontendToDaemon};
use mlxcel_ipc::{Limits, Role};
use mlxcel_tests::stack::{self, Stack, StackOptions, get, post, stream, wait_idle};
use mlxcel_tests::{fixtures, ids};
use serde_json::{Value, json};

/// The model as the front end builds it, from the running daemon's model info.
async fn model_text(stack: &Stack) -> ModelText {
    let mut conn = connect(
        &stack.dir.path().join("daemon.sock"),
        Role::Frontend,
        Limits::new(32 << 20),
    )
    .await
    .expect("connect to the daemon");
    conn.write_frame(&FrontendToDaemon::Info)
        .await
        .expect("ask");
    match conn.read_frame::<DaemonToFrontend>().await {
        Ok(Some(DaemonToFrontend::Info(info))) => ModelText::new(&info).expect("model text"),
        other => panic!("no model info: {other:?}"),
    }
}

/// Golden greedy tokens cut at the first stop id or `max`; with the finish reason.
fn expected(greedy: &[u32], stop_ids: &[u32], max: usize) -> (Vec<u32>, &'static str) {
    match greedy.iter().take(max).position(|t| stop_ids.contains(t)) {
        Some(i) => (greedy[..i].to_vec(), "stop"),
        None => (greedy[..max].to_vec(), "length"),
    }
}

fn chat_body(messages: &Value, extra: Value) -> Value {
    let mut body = json!({"messages": messages, "temperature": 0});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body
}

/// Concatenated chat deltas (or completion texts) of a stream, and its parsed chunks.
fn stream_text(events: &[String]) -> (String, Vec<Value>) {
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap_or_else(|_| panic!("chunk is not JSON: {e}")))
        .collect();
    let text = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .filter_map(|c| c["delta"]["content"].as_str().or(c["text"].as_str()))
        .collect();
    (text, chunks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn templates_tokens_and_greedy_text_match_the_goldens_streamed_or_not() {
    let stack = Stack::start(StackOptions::default());
    let model = model_text(&stack).await;
    let fx = fixtures();

    // The chat template renders exactly what the reference (jinja2) rendered, and the
    // tokenizer built from the daemon's data gives the reference ids.
    for chat in fx["chats"].as_array().unwrap() {
        let messages: Vec<TemplateMessage> = chat["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                TemplateMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap())
            })
            .collect();
        let prompt = model.render_chat(&messages).expect("render");
        assert_eq!(prompt, chat["prompt"].as_str().unwrap());
        assert_eq!(
            model.encode(&prompt, false).unwrap(),
            ids(&chat["prompt_ids"])
        );
    }
    for case in fx["tokenization"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        assert_eq!(
            model.encode(text, true).unwrap(),
            ids(&case["ids"]),
            "{text:?}"
        );
        if !text.contains("<|") {
            // (Special tokens are left out of generated text.)
            assert_eq!(decode(&model.tokenizer, &ids(&case["ids"])), text);
        }
    }

    let url = stack.url("/v1/chat/completions");
    for chat in fx["chats"].as_array().unwrap() {
        let (tokens, finish) = expected(&ids(&chat["greedy_ids"]), &model.stop_ids, 24);
        let want = decode(&model.tokenizer, &tokens);
        let body = chat_body(&chat["messages"], json!({"max_tokens": 24}));

        let (status, r) = post(&url, &body).await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["object"], "chat.completion");
        assert_eq!(r["choices"][0]["message"]["role"], "assistant");
        assert_eq!(r["choices"][0]["message"]["content"], want.as_str());
        assert_eq!(r["choices"][0]["finish_reason"], finish);
        let prompt_len = ids(&chat["prompt_ids"]).len();
        assert_eq!(r["usage"]["prompt_tokens"], prompt_len);
        assert_eq!(r["usage"]["completion_tokens"], tokens.len());
        assert_eq!(r["usage"]["total_tokens"], prompt_len + tokens.len());
        assert!(r["usage"]["prompt_tokens_details"]["cached_tokens"].is_u64());

        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        streamed["stream_options"] = json!({"include_usage": true});
        let events = stream(&url, &streamed).await;
        let (text, chunks) = stream_text(&events);
        assert_eq!(text, want);
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        assert!(
            chunks
                .iter()
                .all(|c| c["object"] == "chat.completion.chunk")
        );
        let n = chunks.len();
        assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], finish);
        assert!(chunks[..n - 1].iter().all(|c| c["usage"].is_null()));
        assert_eq!(chunks[n - 1]["choices"].as_array().unwrap().len(), 0);
        assert_eq!(chunks[n - 1]["usage"]["completion_tokens"], tokens.len());
        assert_eq!(chunks[n - 1]["usage"]["prompt_tokens"], prompt_len);

        // Without include_usage there is no usage anywhere.
        streamed.as_object_mut().unwrap().remove("stream_options");
        let events = stream(&url, &streamed).await;
        let (text, chunks) = stream_text(&events);
        assert_eq!(text, want);
        assert!(chunks.iter().all(|c| c.get("usage").is_none()));
    }

    // /v1/completions with the rendered prompt continues exactly like the chat.
    let chat = &fx["chats"][1];
    let (tokens, finish) = expected(&ids(&chat["greedy_ids"]), &model.stop_ids, 16);
    let want = decode(&model.tokenizer, &tokens);
    let body = json!({"prompt": chat["prompt"], "max_tokens": 16, "temperature": 0,
                      "logprobs": 1});
    let (status, r) = post(&stack.url("/v1/completions"), &body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["object"], "text_completion");
    assert_eq!(r["choices"][0]["text"], want.as_str());
    assert_eq!(r["choices"][0]["finish_reason"], finish);
    assert_eq!(r["usage"]["prompt_tokens"], ids(&chat["prompt_ids"]).len());
    let lp = &r["choices"][0]["logprobs"];
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), tokens.len());
    assert!(
        lp["token_logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|x| x.as_f64().unwrap() <= 0.0)
    );
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (text, chunks) = stream_text(&stream(&stack.url("/v1/completions"), &streamed).await);
    assert_eq!(text, want);
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));

    // Token ids as the prompt give the same continuation.
    let body = json!({"prompt": chat["prompt_ids"], "max_tokens": 16, "temperature": 0});
    let (_, r) = post(&stack.url("/v1/completions"), &body).await;
    assert_eq!(r["choices"][0]["text"], want.as_str());

    // Chat logprobs: one entry per token, with the chosen token as its own top alternative.
    let body = chat_body(
        &fx["chats"][0]["messages"],
        json!({"max_tokens": 4, "logprobs": true, "top_logprobs": 2}),
    );
    let (_, r) = post(&url, &body).await;
    let content = r["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(content.len(), 4);
    let joined: String = content
        .iter()
        .map(|c| c["token"].as_str().unwrap())
        .collect();
    assert_eq!(
        joined,
        r["choices"][0]["message"]["content"].as_str().unwrap()
    );
    assert_eq!(content[0]["top_logprobs"][0]["token"], content[0]["token"]);
    wait_idle(&stack).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_end_text_across_token_boundaries_and_never_leak() {
    let stack = Stack::start(StackOptions::default());
    let model = model_text(&stack).await;
    let fx = fixtures();
    let chat = &fx["chats"][1];
    let (tokens, _) = expected(&ids(&chat["greedy_ids"]), &model.stop_ids, 24);
    let full = decode(&model.tokenizer, &tokens);
    // A stop string that spans two tokens: the end of token 3's text and the start of token 4's.
    let before = decode(&model.tokenizer, &tokens[..3]);
    let fourth = decode(&model.tokenizer, &tokens[..4]);
    let stop = format!(
        "{}{}",
        &before[before.len() - 2..],
        &fourth[before.len()..before.len() + 2]
    );
    let cut = full
        .find(&stop)
        .expect("the stop occurs in the golden text");
    let url = stack.url("/v1/chat/completions");
    let body = chat_body(
        &chat["messages"],
        json!({"max_tokens": 24, "stop": ["never appears", stop]}),
    );
    let (status, r) = post(&url, &body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["choices"][0]["message"]["content"], &full[..cut]);
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    assert!(r["usage"]["completion_tokens"].as_u64().unwrap() <= 5);

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (text, chunks) = stream_text(&stream(&url, &streamed).await);
    assert_eq!(text, &full[..cut]);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );

    // A single stop string (not a list) and one that never matches.
    let body = chat_body(&chat["messages"], json!({"max_tokens": 24, "stop": "zzzz"}));
    let (_, r) = post(&url, &body).await;
    assert_eq!(r["choices"][0]["message"]["content"], full.as_str());
    assert_eq!(r["choices"][0]["finish_reason"], "length");
    wait_idle(&stack).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_makes_sampling_reproducible() {
    let stack = Stack::start(StackOptions::default());
    let url = stack.url("/v1/completions");
    let body = |seed: u64| {
        json!({"prompt": "Once upon a time", "max_tokens": 16, "temperature": 1.0,
               "top_p": 0.95, "seed": seed})
    };
    let text = |r: Value| r["choices"][0]["text"].as_str().unwrap().to_string();
    let a = text(post(&url, &body(7)).await.1);
    let b = text(post(&url, &body(7)).await.1);
    assert_eq!(a, b, "the same seed gave different text");
    let mut others = Vec::new();
    for seed in [8, 9, 10] {
        others.push(text(post(&url, &body(seed)).await.1));
    }
    assert!(
        others.iter().any(|o| *o != a),
        "four seeds gave identical text: sampling ignores the seed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_long_prompt_is_served_from_the_cache_and_the_cache_routes_answer() {
    let stack = Stack::start(StackOptions::default());
    let system = "You are a careful assistant. ".repeat(60);
    let body = json!({"messages": [{"role": "system", "content": system},
                                   {"role": "user", "content": "Say hi."}],
                      "max_tokens": 4, "temperature": 0});
    let url = stack.url("/v1/chat/completions");
    let (status, first) = post(&url, &body).await;
    assert_eq!(status, 200, "{first}");
    let prompt = first["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt > 300, "prompt of {prompt} tokens");
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let (_, second) = post(&url, &body).await;
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    // Every full 32-token block of the prompt but the last token's comes from the cache.
    assert!(
        cached >= (prompt - 1) / 32 * 32 - 32 && cached < prompt,
        "cached {cached} of {prompt}"
    );
    assert_eq!(
        second["choices"][0]["message"],
        first["choices"][0]["message"]
    );

    let (status, stats) = get(&stack.url("/v1/cache/stats")).await;
    assert_eq!(status, 200);
    let blocks = stats["blocks"].as_u64().unwrap();
    assert!(blocks * 32 >= cached);
    assert_eq!(
        stats["used_bytes"].as_u64().unwrap(),
        blocks * mlxcel_tests::daemon::block_bytes()
    );
    assert!(stats["prefix_hits"].as_u64().unwrap() >= 1);

    let (status, entries) = get(&stack.url("/v1/cache/entries?limit=10")).await;
    assert_eq!(status, 200);
    let list = entries["data"].as_array().unwrap();
    assert!(!list.is_empty());
    let (status, bad) = get(&stack.url("/v1/cache/entries?limit=0")).await;
    assert_eq!(
        (status, bad["error"]["param"].as_str()),
        (400, Some("limit"))
    );

    // /metrics gathers all three processes.
    let text = stack::client()
        .get(stack.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let metric = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
            .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{text}"))
    };
    assert_eq!(
        metric("mlxcel_cache_used_bytes "),
        (blocks * mlxcel_tests::daemon::block_bytes()) as f64
    );
    assert_eq!(metric("mlxcel_daemon_up "), 1.0);
    // An honest daemon never trips the front end's protocol checks.
    assert_eq!(metric("mlxcel_daemon_protocol_violations_total "), 0.0);
    assert_eq!(metric("mlxcel_cachemgr_up "), 1.0);
    assert_eq!(metric("mlxcel_pool_blocks "), 256.0);
    assert!(metric("mlxcel_cached_prompt_tokens_total ") >= cached as f64);
    assert_eq!(metric("mlxcel_generations_total "), 2.0);
    assert_eq!(metric("mlxcel_time_to_first_token_seconds_count "), 2.0);
    assert_eq!(
        metric("mlxcel_http_responses_total{route=\"/v1/chat/completions\",status=\"200\"} "),
        2.0
    );
    assert!(text.contains("mlxcel_cache_evicted_blocks_total{reason=\"manual\"} 0"));
    // Where the engine's time went: the two chats computed a prompt and decoded tokens.
    let steps = metric("mlxcel_decode_steps_total ");
    assert!(steps >= 1.0, "{text}");
    assert!(metric("mlxcel_decode_rows_total ") >= steps);
    assert!(metric("mlxcel_prefill_tokens_total ") >= 1.0);
    for phase in ["prefill", "model", "sampling", "other"] {
        let s = metric(&format!(
            "mlxcel_engine_seconds_total{{phase=\"{phase}\"}} "
        ));
        assert!(s >= 0.0 && s.is_finite(), "{phase}: {s}");
    }
    assert!(metric("mlxcel_engine_seconds_total{phase=\"model\"} ") > 0.0);

    // Evict by entry id, then everything; a missing entry is a 404.
    let id = list[0]["id"].as_str().unwrap();
    let (status, r) = post(&stack.url("/v1/cache/evict"), &json!({"entry": id})).await;
    assert_eq!(status, 200, "{r}");
    assert!(r["blocks"].as_u64().unwrap() >= 1);
    let (status, r) = post(&stack.url("/v1/cache/evict"), &json!({"entry": "nope"})).await;
    assert_eq!(status, 404, "{r}");
    let (status, r) = post(
        &stack.url("/v1/cache/evict"),
        &json!({"all": true, "entry": "x"}),
    )
    .await;
    assert_eq!(status, 400, "{r}");
    let (status, _) = post(&stack.url("/v1/cache/evict"), &json!({"all": true})).await;
    assert_eq!(status, 200);
    let (_, stats) = get(&stack.url("/v1/cache/stats")).await;
    assert_eq!(stats["used_bytes"], 0);
    assert!(stats["evicted_blocks"]["manual"].as_u64().unwrap() >= blocks);
}

/// Reads SSE events until `n` content chunks arrived, then drops the connection.
async fn read_some_then_hang_up(url: &str, body: &Value, n: usize) {
    use futures_util::StreamExt;
    let r = stack::client().post(url).json(body).send().await.unwrap();
    let mut bytes = r.bytes_stream();
    let mut seen = 0;
    while let Some(chunk) = bytes.next().await {
        seen += String::from_utf8_lossy(&chunk.unwrap())
            .matches("\"content\"")
            .count();
        if seen > n {
            return;
        }
    }
    panic!("the stream ended before {n} chunks");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_cancels_its_request_and_frees_its_blocks() {
    let stack = Stack::start(StackOptions::default());
    let idle = wait_idle(&stack).await;
    let total = idle["pool"]["total_blocks"].as_u64().unwrap();
    assert_eq!(idle["pool"]["free_blocks"], total);
    let long = "Tell me a very long story about a lighthouse keeper. ".repeat(12);
    let url = stack.url("/v1/chat/completions");
    let body = json!({"messages": [{"role": "user", "content": long}], "max_tokens": 2000,
                      "temperature": 0.8, "seed": 1, "stream": true});
    read_some_then_hang_up(&url, &body, 3).await;
    // Without the client the request stops long before 2000 tokens, and its blocks come back:
    // free again, or held for the prefix cache (evicting the cache frees them too).
    let started = Instant::now();
    let after = wait_idle(&stack).await;
    assert!(started.elapsed() < Duration::from_secs(20));
    let (_, stats) = get(&stack.url("/v1/cache/stats")).await;
    assert_eq!(
        after["pool"]["cache_blocks"].as_u64().unwrap(),
        stats["blocks"].as_u64().unwrap() + stats["releasing_blocks"].as_u64().unwrap()
    );
    // The same for a non-streaming request whose client gives up.
    let mut plain = body.clone();
    plain["stream"] = json!(false);
    let gave_up = stack::client()
        .post(&url)
        .json(&plain)
        .timeout(Duration::from_secs(3))
        .send()
        .await;
    assert!(gave_up.is_err(), "a 2000-token request finished within 3 s");
    wait_idle(&stack).await;
    let (status, _) = post(&stack.url("/v1/cache/evict"), &json!({"all": true})).await;
    assert_eq!(status, 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let d = stack::daemon_health(&stack).await;
        if d["pool"]["free_blocks"] == total {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "blocks not all free after evicting: {d}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
