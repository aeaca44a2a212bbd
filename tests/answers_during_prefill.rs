//! While the engine is deep in a long prefill (several steps of seconds each in a debug
//! build), the daemon still answers at once: `Health` and `Info` from what the engine
//! published, and a `Cancel` with the request's `Done { Cancelled }`, nothing after it.

use std::time::{Duration, Instant};

use mlxcel_ipc::proto::daemon::{DaemonToFrontend, FinishReason, FrontendToDaemon};
use mlxcel_tests::daemon::{Daemon, frontend, greedy_generate};
use mlxcel_tests::{fixtures, ids, root};

/// The bound for an answer that needs no engine step.
const PROMPT_ANSWER: Duration = Duration::from_millis(100);

#[tokio::test]
async fn health_info_and_cancel_are_answered_during_a_long_prefill() {
    let dir = mlxcel_tests::temp_dir("mxp");
    let model = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let _d = Daemon::start(dir.path(), &model, &["--kv-pool-bytes", "512MiB"]);
    let mut c = frontend(dir.path()).await;
    let chat = ids(&fixtures()["chats"][0]["prompt_ids"]);
    // ~3,000 tokens: six 512-token prefill steps before its first token.
    let long: Vec<u32> = chat.iter().copied().cycle().take(3000).collect();
    c.write_frame(&greedy_generate(1, long, 2)).await.unwrap();
    c.write_frame(&greedy_generate(2, chat, 8)).await.unwrap();
    // Until the engine runs them (it publishes its counts before each step).
    loop {
        c.write_frame(&FrontendToDaemon::Health).await.unwrap();
        match c.read_frame::<DaemonToFrontend>().await.unwrap() {
            Some(DaemonToFrontend::Health(h)) if h.running == 2 => break,
            Some(DaemonToFrontend::Health(_)) => tokio::time::sleep(Duration::from_millis(5)).await,
            other => panic!("{other:?}"),
        }
    }

    let mut asked = Instant::now();
    c.write_frame(&FrontendToDaemon::Health).await.unwrap();
    let mut answers = Vec::new();
    let mut first_token_of_long = None;
    let mut cancelled_at = None;
    let mut after_cancel = 0;
    loop {
        let msg = c
            .read_frame::<DaemonToFrontend>()
            .await
            .unwrap()
            .expect("open");
        match msg {
            DaemonToFrontend::Health(h) => {
                answers.push(("health", asked.elapsed()));
                assert_eq!(h.running, 2, "{h:?}");
                asked = Instant::now();
                c.write_frame(&FrontendToDaemon::Info).await.unwrap();
            }
            DaemonToFrontend::Info(_) => {
                answers.push(("info", asked.elapsed()));
                asked = Instant::now();
                c.write_frame(&FrontendToDaemon::Cancel { request_id: 2 })
                    .await
                    .unwrap();
            }
            DaemonToFrontend::Done {
                request_id: 2,
                finish,
                ..
            } => {
                assert_eq!(finish, FinishReason::Cancelled);
                assert!(cancelled_at.is_none(), "one end per request");
                answers.push(("cancel", asked.elapsed()));
                cancelled_at = Some(Instant::now());
            }
            DaemonToFrontend::Token { request_id: 1, .. } => {
                first_token_of_long.get_or_insert_with(Instant::now);
            }
            DaemonToFrontend::Token { request_id: 2, .. } if cancelled_at.is_some() => {
                after_cancel += 1;
            }
            DaemonToFrontend::Done { request_id: 1, .. } => break,
            DaemonToFrontend::Failed { error, .. } => panic!("{error}"),
            _ => {}
        }
    }
    eprintln!("answered during the prefill: {answers:?}");
    assert_eq!(answers.len(), 3, "{answers:?}");
    assert!(
        cancelled_at < first_token_of_long,
        "the answers came during the long prefill"
    );
    for (what, took) in &answers {
        // Info carries the 2 MB tokenizer: its cost is the copy, never a wait on the engine.
        let bound = if *what == "info" {
            PROMPT_ANSWER * 5
        } else {
            PROMPT_ANSWER
        };
        assert!(*took < bound, "{what} took {took:?}");
    }
    assert_eq!(after_cancel, 0, "no token after the cancel's answer");
}
