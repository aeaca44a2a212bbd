//! Requests that arrive while the engine is busy are prefilled together: a step computes the
//! chunks of every sequence it prefills in one forward pass (the daemon's counts show a pass
//! with more than one chunk), and each request still gets its golden tokens.

use std::time::Duration;

use mlxcel_tests::daemon::{Daemon, frontend, greedy_generate, health, replies};
use mlxcel_tests::{fixtures, ids, root};

#[tokio::test]
async fn arrivals_share_prefill_passes_and_keep_their_golden_tokens() {
    let dir = mlxcel_tests::temp_dir("mxa");
    let model = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let mut d = Daemon::spawn(dir.path(), &model, &["--kv-pool-bytes", "512MiB"], &[]);
    d.wait_serving(dir.path());
    let mut c = frontend(dir.path()).await;
    let chats = fixtures()["chats"].as_array().expect("chats").clone();
    // ~3,000 tokens: six 512-token prefill steps; the last leaves room in its step.
    let long: Vec<u32> = ids(&chats[2]["prompt_ids"])
        .into_iter()
        .cycle()
        .take(3000)
        .collect();
    c.write_frame(&greedy_generate(1, long, 1)).await.unwrap();
    // Until its first step has run (the engine publishes its counts before each step).
    while health(&mut c).await.steps.prefill_tokens == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let before = health(&mut c).await.steps;
    for (i, chat) in chats.iter().take(2).enumerate() {
        let prompt = ids(&chat["prompt_ids"]);
        c.write_frame(&greedy_generate(2 + i as u64, prompt, 8))
            .await
            .unwrap();
    }
    let replies = replies(&mut c, 3).await;
    for (i, chat) in chats.iter().take(2).enumerate() {
        let want = ids(&chat["greedy_ids"]);
        assert_eq!(replies[&(2 + i as u64)].tokens, want[..8], "chat {i}");
    }
    let after = health(&mut c).await.steps;
    let (passes, chunks) = (
        after.prefill_passes - before.prefill_passes,
        after.prefill_chunks - before.prefill_chunks,
    );
    // The long prompt's last chunk and the first arrival share a pass at least.
    assert!(chunks > passes, "{chunks} chunks in {passes} passes");
}
