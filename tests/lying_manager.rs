//! The real daemon with the default model against a cache manager that lies: it leases the
//! blocks of another request's prefix, ids outside the pool, and "retains" a block nobody
//! offered. Every answer is still the golden text, each lie is refused and counted, and the
//! honest answer (the prompt's own blocks) is still used.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use mlxcel_ipc::proto::cache::{
    CacheToDaemon, DaemonToCache, DonateOutcome, DonatedBlock, Epoch, LeaseId,
};
use mlxcel_ipc::proto::daemon::Usage;
use mlxcel_ipc::socket::LocalStream;
use mlxcel_ipc::{BlockId, Connection, Limits, Role, handshake, socket};
use mlxcel_tests::daemon::{Daemon, frontend, greedy_generate, health, reply};
use mlxcel_tests::{fixtures, ids, root};
use tokio::sync::mpsc;

/// What the fake manager answers to the next acquire.
#[derive(Debug, Clone)]
enum Answer {
    /// The blocks donated by the `n`-th donation (another prompt's, or the prompt's own).
    Donation(usize),
    /// These ids, whatever they are.
    Ids(Vec<BlockId>),
}

/// A cache manager that registers the daemon, retains every donation plus a block nobody
/// offered, and answers acquires as it is told.
async fn lying_manager(dir: PathBuf, mut answers: mpsc::UnboundedReceiver<Answer>) {
    let listener = socket::bind(&dir.join("cachemgr.sock")).await.unwrap();
    let stream = listener.accept().await.unwrap();
    let (mut conn, _) = handshake::accept(
        stream,
        Limits::default(),
        Duration::from_secs(30),
        &[Role::Daemon],
    )
    .await
    .expect("the daemon's handshake");
    let mut donations: Vec<Vec<DonatedBlock>> = Vec::new();
    let mut next_lease = 0;
    while let Ok(Some(msg)) = conn.read_frame::<DaemonToCache>().await {
        let reply = match msg {
            DaemonToCache::Register { call, geometry } => CacheToDaemon::Registered {
                call,
                epoch: Epoch(1),
                block_bytes: geometry.block_bytes().unwrap(),
                hash_key: mlxcel_ipc::HashKey([9; 32]),
            },
            DaemonToCache::Donate { call, blocks, .. } => {
                let mut retained: Vec<BlockId> = blocks.iter().map(|b| b.block).collect();
                retained.push(5_000_000);
                donations.push(blocks);
                let outcome = DonateOutcome {
                    retained,
                    ..DonateOutcome::default()
                };
                CacheToDaemon::Donated { call, outcome }
            }
            DaemonToCache::Acquire { call, .. } => {
                let blocks = match answers.recv().await.expect("an answer") {
                    Answer::Donation(n) => donations[n].iter().map(|b| b.block).collect(),
                    Answer::Ids(ids) => ids,
                };
                next_lease += 1;
                CacheToDaemon::Acquired {
                    call,
                    lease: Some(LeaseId(next_lease)),
                    blocks,
                }
            }
            _ => continue,
        };
        conn.write_frame(&reply).await.unwrap();
    }
}

async fn generate(c: &mut Connection<LocalStream>, id: u64, prompt: Vec<u32>) -> (Vec<u32>, Usage) {
    c.write_frame(&greedy_generate(id, prompt, 32))
        .await
        .unwrap();
    let r = reply(c, id).await;
    (r.tokens, r.usage)
}

#[tokio::test]
async fn lies_of_the_cache_manager_are_refused_counted_and_change_no_answer() {
    let dir = mlxcel_tests::temp_dir("mxl");
    let (tell, answers) = mpsc::unbounded_channel();
    let manager = tokio::spawn(lying_manager(dir.path().to_path_buf(), answers));
    let model = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    // A generous acquire budget: this test is about what the answers say, not when they come.
    let args = ["--kv-pool-bytes", "64MiB", "--acquire-timeout", "60s"];
    let _d = Daemon::start(dir.path(), &model, &args);
    let mut c = frontend(dir.path()).await;
    // Registered: the daemon asks for prefixes only then.
    while !health(&mut c).await.cachemgr_connected {
        tokio::task::yield_now().await;
    }
    let chats = &fixtures()["chats"];
    let (a, a_golden) = (ids(&chats[0]["prompt_ids"]), ids(&chats[0]["greedy_ids"]));
    // B: another prompt whose first block differs from A's (the chats share a system prompt).
    let mut b = a.clone();
    b[5] = 1000;

    // A: nothing cached yet. Each donation is "retained" with an extra id nobody offered.
    tell.send(Answer::Ids(vec![])).unwrap();
    assert_eq!(generate(&mut c, 1, a.clone()).await.0, a_golden);
    // B without reuse: the answer it must give whatever the manager says.
    tell.send(Answer::Ids(vec![])).unwrap();
    let (b_reference, _) = generate(&mut c, 2, b.clone()).await;
    // B leased A's block (held by the cache, but under another hash).
    tell.send(Answer::Donation(0)).unwrap();
    let (tokens, usage) = generate(&mut c, 3, b).await;
    assert_eq!((tokens, usage.cached_tokens), (b_reference, 0));
    // A leased ids outside the pool.
    tell.send(Answer::Ids(vec![4_000_000, 4_000_001])).unwrap();
    let (tokens, usage) = generate(&mut c, 4, a.clone()).await;
    assert_eq!((tokens, usage.cached_tokens), (a_golden.clone(), 0));
    // The truth (A's own block) is still used.
    tell.send(Answer::Donation(0)).unwrap();
    let (tokens, usage) = generate(&mut c, 5, a).await;
    assert_eq!((tokens, usage.cached_tokens), (a_golden, 32));

    // One unoffered id per donation (5 donations), A's block leased to B, and the first of the
    // two ids outside the pool (a prefix stops at its first refused block). The last donation's
    // outcome arrives after its request ended: wait for it.
    let want = 5 + 1 + 1;
    let deadline = Instant::now() + Duration::from_secs(60);
    let h = loop {
        let h = health(&mut c).await;
        if h.refused_block_ids >= want || Instant::now() > deadline {
            break h;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(h.refused_block_ids, want, "{h:?}");
    // Held for the cache: two full blocks (prompt, then prompt + output) of each of requests
    // 1 to 4, and request 5's second (its first was the reused one).
    assert_eq!(h.pool.cache_blocks, 9, "{h:?}");
    manager.abort();
}
