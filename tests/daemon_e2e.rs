//! The real `mlxcel-daemon` process with the default model and the real `mlxcel-cachemgr`:
//! golden tokens over the socket, prefix reuse reported as cached tokens, the ledger equal to
//! what the daemon holds, cancellation, block conservation, and a cache manager that dies
//! mid-run.

use std::path::Path;
use std::time::{Duration, Instant};

use mlxcel_ipc::client::AdminClient;
use mlxcel_ipc::proto::admin::{AdminReply, AdminRequest, CacheStats, EvictSelector};
use mlxcel_ipc::proto::daemon::{
    DaemonHealth, DaemonToFrontend, FinishReason, FrontendToDaemon, Usage,
};
use mlxcel_ipc::socket::LocalStream;
use mlxcel_ipc::{Connection, Role};
use mlxcel_tests::bin;
use mlxcel_tests::daemon::{Daemon, block_bytes, frontend, greedy_generate, health, reply};
use mlxcel_tests::manager::Manager;
use mlxcel_tests::{fixtures, ids, root};

fn start_daemon(dir: &Path, pool_blocks: u64) -> Daemon {
    let pool = (pool_blocks * block_bytes()).to_string();
    let model = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    Daemon::start(
        dir,
        &model,
        // Counting cached tokens must not depend on a 50 ms budget on a busy machine.
        &[
            "--kv-pool-bytes",
            &pool,
            "--acquire-timeout",
            "30s",
            "--log-level",
            "warn",
        ],
    )
}

/// A greedy request with log-probabilities.
fn greedy(request_id: u64, prompt: Vec<u32>, max_tokens: u32) -> FrontendToDaemon {
    let mut g = greedy_generate(request_id, prompt, max_tokens);
    if let FrontendToDaemon::Generate(r) = &mut g {
        r.logprobs = true;
    }
    g
}

/// Reads one request's tokens until its end; every token has a log-probability ≤ 0.
async fn collect(
    c: &mut Connection<LocalStream>,
    request_id: u64,
) -> (Vec<u32>, FinishReason, Usage) {
    let r = reply(c, request_id).await;
    assert!(r.logprobs.iter().all(|l| l.is_some_and(|l| l <= 0.0)));
    (r.tokens, r.finish, r.usage)
}

/// Polls the daemon's health until `ok` (the pool settles asynchronously after a request).
async fn wait_for(c: &mut Connection<LocalStream>, ok: impl Fn(&DaemonHealth) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let h = health(c).await;
        if ok(&h) {
            return;
        }
        assert!(Instant::now() < deadline, "the pool did not settle: {h:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn admin(socket: &Path, request: AdminRequest) -> AdminReply {
    AdminClient::connect(socket, Role::Admin)
        .await
        .unwrap()
        .request(&request)
        .await
        .unwrap()
}

async fn stats(socket: &Path) -> CacheStats {
    match admin(socket, AdminRequest::Stats).await {
        AdminReply::Stats(s) => *s,
        other => panic!("{other:?}"),
    }
}

async fn wait_registered(socket: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while stats(socket).await.daemon.is_none() {
        assert!(Instant::now() < deadline, "the daemon never registered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn golden_tokens_prefix_reuse_and_a_ledger_equal_to_real_memory() {
    let m = Manager::start(&bin("mlxcel-cachemgr"), &["--reconcile-interval", "off"]);
    let _d = start_daemon(m.dir.path(), 64);
    wait_registered(&m.socket).await;
    let mut c = frontend(m.dir.path()).await;

    c.write_frame(&FrontendToDaemon::Info).await.unwrap();
    let info = loop {
        if let DaemonToFrontend::Info(i) = c.read_frame().await.unwrap().unwrap() {
            break i;
        }
    };
    assert_eq!(info.model_id, "SmolLM2-135M-Instruct.Q4_1");
    assert_eq!(info.context_length, 8192);
    assert!(info.tokenizer_json.contains("<|im_start|>"));
    assert_eq!(info.geometry.block_bytes().unwrap(), block_bytes());
    assert_eq!(
        (info.pool.total_blocks, info.pool.pool_bytes_measured),
        (64, 0),
        "a ceiling of 64 blocks, and an idle pool holds no memory"
    );
    assert!(
        // f32 on the CPU (dequantized), Q4_1 kept quantized on a GPU.
        info.pool.weights_bytes
            > if block_bytes() == 1_474_560 {
                500 << 20
            } else {
                100 << 20
            },
        "the weights as MLX measures them: {:?}",
        info.pool
    );

    let chat = &fixtures()["chats"][0];
    let (prompt, want) = (ids(&chat["prompt_ids"]), ids(&chat["greedy_ids"]));
    c.write_frame(&greedy(1, prompt.clone(), 32)).await.unwrap();
    let (tokens, finish, usage) = collect(&mut c, 1).await;
    assert_eq!((tokens, finish), (want.clone(), FinishReason::Length));
    assert_eq!(
        (
            usage.prompt_tokens,
            usage.cached_tokens,
            usage.generated_tokens
        ),
        (37, 0, 32)
    );

    // The same prompt again: its first full block comes from the cache.
    c.write_frame(&greedy(2, prompt.clone(), 32)).await.unwrap();
    let (tokens, _, usage) = collect(&mut c, 2).await;
    assert_eq!(tokens, want);
    assert_eq!(
        usage.cached_tokens, 32,
        "one 32-token block of the 37-token prompt was reused"
    );

    // 37 prompt + 31 computed tokens = 68 stored: two full blocks, stored once for both requests.
    let h = health(&mut c).await;
    let s = stats(&m.socket).await;
    assert_eq!((s.blocks, s.used_bytes), (2, 2 * block_bytes()));
    assert_eq!(
        h.pool.cache_blocks, 2,
        "the daemon holds exactly what the ledger books"
    );
    match admin(&m.socket, AdminRequest::Reconcile).await {
        AdminReply::Reconciled(r) => {
            assert_eq!((r.drift_bytes, r.inventory_bytes), (0, 2 * block_bytes()))
        }
        other => panic!("{other:?}"),
    }
    // Conservation: once the second request's donation is settled only the cache holds blocks;
    // with the cache emptied, every block is free again.
    wait_for(&mut c, |h| h.pool.free_blocks == 64 - 2).await;
    admin(&m.socket, AdminRequest::Evict(EvictSelector::All)).await;
    wait_for(&mut c, |h| h.pool.free_blocks == 64).await;
}

#[tokio::test]
async fn cancel_and_disconnect_free_a_requests_blocks() {
    let m = Manager::start(&bin("mlxcel-cachemgr"), &["--reconcile-interval", "off"]);
    let _d = start_daemon(m.dir.path(), 64);
    let mut c = frontend(m.dir.path()).await;
    let prompt = ids(&fixtures()["chats"][1]["prompt_ids"]);
    c.write_frame(&greedy(7, prompt.clone(), 4000))
        .await
        .unwrap();
    // Wait for the first token, then cancel.
    loop {
        if let DaemonToFrontend::Token { .. } = c.read_frame().await.unwrap().unwrap() {
            break;
        }
    }
    c.write_frame(&FrontendToDaemon::Cancel { request_id: 7 })
        .await
        .unwrap();
    let (_, finish, _) = collect(&mut c, 7).await;
    assert_eq!(finish, FinishReason::Cancelled);
    admin(&m.socket, AdminRequest::Evict(EvictSelector::All)).await;

    // A second connection starts a long request and hangs up: the daemon frees its blocks.
    let mut gone = frontend(m.dir.path()).await;
    gone.write_frame(&greedy(1, prompt, 4000)).await.unwrap();
    loop {
        if let DaemonToFrontend::Token { .. } = gone.read_frame().await.unwrap().unwrap() {
            break;
        }
    }
    drop(gone);
    wait_for(&mut c, |h| {
        h.running == 0 && h.pool.free_blocks + h.pool.cache_blocks == 64
    })
    .await;
}

#[tokio::test]
async fn the_daemon_serves_through_a_cache_manager_restart_and_drift_returns_to_zero() {
    let m = Manager::start(&bin("mlxcel-cachemgr"), &["--reconcile-interval", "off"]);
    let _d = start_daemon(m.dir.path(), 64);
    wait_registered(&m.socket).await;
    let mut c = frontend(m.dir.path()).await;
    let chat = &fixtures()["chats"][2];
    let (prompt, want) = (ids(&chat["prompt_ids"]), ids(&chat["greedy_ids"]));
    c.write_frame(&greedy(1, prompt.clone(), 32)).await.unwrap();
    // Kill the manager while the request runs; it must still complete.
    let dir = m.kill9();
    let (tokens, finish, _) = collect(&mut c, 1).await;
    assert_eq!((tokens, finish), (want.clone(), FinishReason::Length));
    // Without a manager: still served, no reuse.
    c.write_frame(&greedy(2, prompt.clone(), 8)).await.unwrap();
    let (tokens, _, usage) = collect(&mut c, 2).await;
    assert_eq!(tokens, want[..8]);
    assert_eq!(usage.cached_tokens, 0);
    let h = health(&mut c).await;
    assert!(!h.cachemgr_connected);
    assert_eq!(
        h.pool.cache_blocks, 0,
        "nobody governs cached blocks: they were freed"
    );

    let m = Manager::start_in(
        &bin("mlxcel-cachemgr"),
        dir,
        &["--reconcile-interval", "off"],
    );
    wait_registered(&m.socket).await;
    c.write_frame(&greedy(3, prompt, 32)).await.unwrap();
    let (tokens, _, _) = collect(&mut c, 3).await;
    assert_eq!(tokens, want);
    // The donation is enqueued before Done; wait until the new ledger has it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while stats(&m.socket).await.blocks == 0 {
        assert!(
            Instant::now() < deadline,
            "the last request's blocks never reached the new ledger"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    match admin(&m.socket, AdminRequest::Reconcile).await {
        AdminReply::Reconciled(r) => {
            assert_eq!(r.drift_bytes, 0);
            assert!(
                r.ledger_bytes > 0,
                "the new epoch retains the last request's blocks"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_full_pool_preempts_and_recomputes_without_repeating_tokens() {
    // 6 blocks of 32 tokens; each request needs 4 (74-token prompt + 32 tokens): they cannot
    // both hold their blocks, so one is preempted, recomputes, and continues where it stopped.
    let m = Manager::start(
        &bin("mlxcel-cachemgr"),
        &["--reconcile-interval", "off", "--capacity-bytes", "0"],
    );
    let _d = start_daemon(m.dir.path(), 6);
    let mut c = frontend(m.dir.path()).await;
    let chat = &fixtures()["chats"][2];
    let (prompt, want) = (ids(&chat["prompt_ids"]), ids(&chat["greedy_ids"]));
    c.write_frame(&greedy(1, prompt.clone(), 32)).await.unwrap();
    c.write_frame(&greedy(2, prompt.clone(), 32)).await.unwrap();
    let mut got: [Vec<u32>; 2] = [vec![], vec![]];
    let mut done = 0;
    while done < 2 {
        match c.read_frame::<DaemonToFrontend>().await.unwrap().unwrap() {
            DaemonToFrontend::Token {
                request_id, token, ..
            } => got[request_id as usize - 1].push(token),
            DaemonToFrontend::Done { finish, .. } => {
                assert_eq!(finish, FinishReason::Length);
                done += 1;
            }
            DaemonToFrontend::Failed { error, .. } => panic!("{error}"),
            _ => {}
        }
    }
    assert_eq!(got[0], want, "request 1");
    assert_eq!(got[1], want, "request 2: no token twice, none lost");
    assert!(
        health(&mut c).await.preemptions >= 1,
        "the pool was too small for both: one was preempted"
    );
    wait_for(&mut c, |h| h.running == 0 && h.pool.free_blocks == 6).await;

    // A prompt that needs more blocks than the whole pool fails clearly instead of waiting.
    let long: Vec<u32> = prompt.iter().copied().cycle().take(6 * 32 + 1).collect();
    c.write_frame(&greedy(3, long, 1)).await.unwrap();
    loop {
        match c.read_frame::<DaemonToFrontend>().await.unwrap().unwrap() {
            DaemonToFrontend::Failed {
                request_id: 3,
                error,
            } => {
                assert!(
                    error
                        .message
                        .contains("more than the KV pool's ceiling of 192 tokens")
                        && error.message.contains("--kv-pool-bytes"),
                    "{error}"
                );
                break;
            }
            DaemonToFrontend::Done { .. } => panic!("an impossible request finished"),
            _ => {}
        }
    }
}

/// A prompt of `shared` tokens of a common system text followed by a distinct question.
fn shared_prefix_prompt(common: &[u32], i: u32) -> Vec<u32> {
    let mut p = common.to_vec();
    p.extend([1_000 + i, 2_000 + i, 3_000 + i, 30]);
    p
}

#[tokio::test]
async fn a_shared_system_prompt_is_stored_once_and_reused_by_every_later_request() {
    let m = Manager::start(&bin("mlxcel-cachemgr"), &["--reconcile-interval", "off"]);
    let _d = start_daemon(m.dir.path(), 128);
    wait_registered(&m.socket).await;
    let mut c = frontend(m.dir.path()).await;
    // 8 blocks of common prefix (256 tokens), then 4 tokens of each request's own.
    let common: Vec<u32> = ids(&fixtures()["chats"][2]["prompt_ids"])
        .into_iter()
        .cycle()
        .take(256)
        .collect();
    c.write_frame(&greedy(0, shared_prefix_prompt(&common, 0), 4))
        .await
        .unwrap();
    let (_, _, first) = collect(&mut c, 0).await;
    assert_eq!(first.cached_tokens, 0);
    // Seven more at once, after the first finished: each maps the 8 shared blocks.
    for i in 1..8 {
        c.write_frame(&greedy(u64::from(i), shared_prefix_prompt(&common, i), 4))
            .await
            .unwrap();
    }
    let mut cached = Vec::new();
    let mut left = 7;
    while left > 0 {
        match c.read_frame::<DaemonToFrontend>().await.unwrap().unwrap() {
            DaemonToFrontend::Done { usage, .. } => {
                cached.push(usage.cached_tokens);
                left -= 1;
            }
            DaemonToFrontend::Failed { error, .. } => panic!("{error}"),
            _ => {}
        }
    }
    assert!(
        cached.iter().all(|&t| t >= 256),
        "every later request reused the shared blocks: {cached:?}"
    );
    // 256 + 4 + 3 computed = 263 tokens per request: 8 full blocks each, all of them the shared
    // prefix. The ledger holds one copy.
    wait_for(&mut c, |h| {
        h.running == 0 && h.pool.free_blocks + h.pool.cache_blocks == 128
    })
    .await;
    let s = stats(&m.socket).await;
    assert_eq!(
        (s.blocks, s.used_bytes),
        (8, 8 * block_bytes()),
        "the shared prefix is stored once"
    );
    assert_eq!(health(&mut c).await.pool.cache_blocks, 8);
}

#[tokio::test]
async fn a_small_cache_capacity_holds_and_the_daemon_agrees_with_the_ledger() {
    // Room for 3 blocks in the cache; 6 distinct prompts of 2+ full blocks each.
    let cap = (3 * block_bytes()).to_string();
    let m = Manager::start(
        &bin("mlxcel-cachemgr"),
        &["--reconcile-interval", "off", "--capacity-bytes", &cap],
    );
    let mut d = start_daemon(m.dir.path(), 64);
    wait_registered(&m.socket).await;
    let mut c = frontend(m.dir.path()).await;
    let base = ids(&fixtures()["chats"][1]["prompt_ids"]);
    for i in 0..6u32 {
        let mut prompt: Vec<u32> = vec![100 + i; 40];
        prompt.extend(&base);
        c.write_frame(&greedy(u64::from(i), prompt, 2))
            .await
            .unwrap();
        collect(&mut c, u64::from(i)).await;
        let s = stats(&m.socket).await;
        assert!(
            s.used_bytes + s.releasing_bytes <= 3 * block_bytes(),
            "over capacity: {s:?}"
        );
    }
    wait_for(&mut c, |h| {
        h.running == 0 && h.pool.free_blocks + h.pool.cache_blocks == 64
    })
    .await;
    let s = stats(&m.socket).await;
    assert!(
        s.evicted_blocks.capacity > 0,
        "the cap fired: {:?}",
        s.evicted_blocks
    );
    let h = health(&mut c).await;
    assert_eq!(
        u64::from(h.pool.cache_blocks) * block_bytes(),
        s.used_bytes + s.releasing_bytes
    );
    match admin(&m.socket, AdminRequest::Reconcile).await {
        AdminReply::Reconciled(r) => assert_eq!(r.drift_bytes, 0),
        other => panic!("{other:?}"),
    }
    // SIGTERM: the daemon stops well within 20 s, cleanly.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = d.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the daemon ignored SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    assert!(!m.dir.path().join("daemon.sock").exists());
}
