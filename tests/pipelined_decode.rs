//! The decode step is pipelined: each step is queued on the tokens the step before drew on the
//! device, before they are read. A request whose drawn token is a stop token ends there (the
//! step computed for it after that token sends nothing), rows sampled on the host (penalties)
//! share the batch with drawn rows, and every request keeps its golden tokens.

use std::time::Duration;

use mlxcel_ipc::proto::daemon::{FinishReason, FrontendToDaemon, Sampling};
use mlxcel_tests::daemon::{Daemon, frontend, greedy_generate, health, replies, reply};
use mlxcel_tests::{fixtures, ids, root};

fn with(
    frame: FrontendToDaemon,
    edit: impl FnOnce(&mut mlxcel_ipc::proto::daemon::Generate),
) -> FrontendToDaemon {
    let FrontendToDaemon::Generate(mut g) = frame else {
        unreachable!("greedy_generate makes a Generate")
    };
    edit(&mut g);
    FrontendToDaemon::Generate(g)
}

#[tokio::test]
async fn a_stop_token_mid_batch_ends_its_request_and_host_rows_mix_with_drawn_rows() {
    let dir = mlxcel_tests::temp_dir("mxp");
    let model = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let mut d = Daemon::spawn(dir.path(), &model, &["--kv-pool-bytes", "256MiB"], &[]);
    d.wait_serving(dir.path());
    let mut c = frontend(dir.path()).await;
    let chats = fixtures()["chats"].as_array().expect("chats").clone();
    let golden: Vec<Vec<u32>> = chats.iter().map(|c| ids(&c["greedy_ids"])).collect();
    let prompt = |i: usize| ids(&chats[i]["prompt_ids"]);
    // Chat 1 stops at the first occurrence of its sixth golden token.
    let stop = golden[1][5];
    let cut = golden[1].iter().position(|&t| t == stop).unwrap_or(0);
    assert!(
        cut >= 3,
        "the stop token comes too early to test: {:?}",
        golden[1]
    );
    let stopping = with(greedy_generate(1, prompt(1), 32), |g| {
        g.stop_ids = vec![stop];
        g.logprobs = true;
    });
    let penalised = |id| {
        with(greedy_generate(id, prompt(0), 12), |g| {
            g.sampling = Sampling {
                repetition_penalty: 1.3,
                ..Sampling::default()
            };
        })
    };
    c.write_frame(&stopping).await.unwrap();
    c.write_frame(&greedy_generate(2, prompt(2), 16))
        .await
        .unwrap();
    c.write_frame(&penalised(3)).await.unwrap();
    let mut replies = replies(&mut c, 3).await;
    let (a, b, host) = (
        replies.remove(&1).expect("request 1"),
        replies.remove(&2).expect("request 2"),
        replies.remove(&3).expect("request 3"),
    );
    assert_eq!(
        a.tokens,
        golden[1][..cut],
        "nothing is sent after the stop token"
    );
    assert_eq!(a.finish, FinishReason::Stop);
    assert!(
        a.logprobs.iter().all(|l| l.is_some_and(|l| l <= 0.0)),
        "{:?}",
        a.logprobs
    );
    assert_eq!(b.tokens, golden[2][..16]);
    assert_eq!(b.finish, FinishReason::Length);
    assert_eq!(host.tokens.len(), 12);
    // The host-sampled request gets the same tokens alone as beside the drawn rows.
    c.write_frame(&penalised(4)).await.unwrap();
    assert_eq!(reply(&mut c, 4).await.tokens, host.tokens);
    // Every block comes back free or held for the cache: none leaked by the void rows. (The
    // health the daemon answers with is published after each step, so wait for the one after
    // the last request's end.)
    let since = std::time::Instant::now();
    loop {
        let h = health(&mut c).await;
        assert!(h.steps.decode_steps > 0);
        if h.pool.free_blocks + h.pool.cache_blocks == h.pool.total_blocks {
            break;
        }
        assert!(
            since.elapsed() < Duration::from_secs(120),
            "blocks still held: {:?}",
            h.pool
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
