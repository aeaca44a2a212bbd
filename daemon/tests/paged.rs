//! The paged pool against the dense path: the same golden tokens, prefixes shared between
//! sequences by block id, blocks conserved, and the pool's bytes as MLX measures them equal to
//! the cache manager's formula.

mod support;

use mlx_rs::Dtype;
use mlxcel_daemon::generate::{GenerateRequest, generate};
use mlxcel_daemon::pool::{BlockPool, PoolShape};
use mlxcel_daemon::scheduler::BlockTable;
use mlxcel_tests::{fixtures, ids, root};
use support::{forward_alone, grow_rows};

fn shape(layers: usize, num_blocks: u32, block_tokens: usize) -> PoolShape {
    PoolShape {
        layers,
        num_blocks,
        block_tokens,
        kv_heads: 3,
        head_dim: 64,
        dtype: Dtype::Float32,
    }
}

fn request(prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prefill_chunk: 24,
        ..support::greedy_request(prompt, max_tokens)
    }
}

#[test]
fn paged_attention_gives_the_golden_tokens_and_shares_prefixes() {
    let m = mlxcel_daemon::load(&root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"))
        .expect("make setup");
    let layers = m.model.config.layers;
    for block_tokens in [32, 5] {
        let mut pool = BlockPool::new(shape(layers, 64, block_tokens)).unwrap();
        let total = pool.free_blocks();
        for chat in fixtures()["chats"].as_array().unwrap() {
            let prompt = ids(&chat["prompt_ids"]);
            let want = ids(&chat["greedy_ids"]);
            // A cold sequence computes the whole prompt.
            let mut a = BlockTable::default();
            let got = generate(
                &m.model,
                &mut a.store(&mut pool),
                &request(prompt.clone(), 32),
                |_| true,
            )
            .unwrap();
            assert_eq!(got.tokens, want, "block_tokens {block_tokens}");
            // A second sequence maps the first one's full prompt blocks and computes only the rest.
            let shared_blocks = (prompt.len() - 1) / block_tokens;
            let shared: Vec<u32> = a.blocks[..shared_blocks].to_vec();
            for &b in &shared {
                pool.retain(b);
            }
            let mut b = BlockTable::with_prefix(shared, block_tokens);
            assert_eq!(b.len, shared_blocks * block_tokens);
            let got = generate(
                &m.model,
                &mut b.store(&mut pool),
                &request(prompt.clone(), 16),
                |_| true,
            )
            .unwrap();
            assert_eq!(
                got.tokens,
                want[..16],
                "with {shared_blocks} shared blocks of {block_tokens}"
            );
            assert!(
                a.blocks[..shared_blocks]
                    .iter()
                    .all(|&x| pool.refcount(x) == 2)
            );
            a.free(&mut pool);
            b.free(&mut pool);
            assert_eq!(pool.free_blocks(), total, "every block comes back");
        }
        assert_eq!(pool.bugs().double_frees, 0);
    }
}

#[test]
fn a_full_pool_says_not_now_without_taking_more_blocks() {
    let m = mlxcel_daemon::load(&root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"))
        .expect("make setup");
    let mut pool = BlockPool::new(shape(m.model.config.layers, 2, 16)).unwrap();
    let mut seq = BlockTable::default();
    let err = generate(
        &m.model,
        &mut seq.store(&mut pool),
        &request(vec![1; 40], 1),
        |_| true,
    )
    .unwrap_err();
    assert!(err.to_string().contains("KV pool is full"), "{err}");
    // The first 24-token chunk took both blocks; the second chunk's refusal took nothing more.
    assert_eq!((seq.blocks.len(), pool.free_blocks()), (2, 0));
    seq.free(&mut pool);
    assert_eq!(pool.free_blocks(), 2);
}

#[test]
fn measured_pool_bytes_equal_the_cache_managers_formula_when_every_block_is_held() {
    let mut pool = BlockPool::new(shape(30, 10, 32)).unwrap();
    assert_eq!(pool.measured_bytes(), 0, "an idle pool holds nothing");
    let blocks = pool.allocate(10).unwrap();
    let geometry = mlxcel_ipc::Geometry {
        model_id: "m".into(),
        layers: 30,
        kv_heads: 3,
        head_dim: 64,
        dtype: mlxcel_ipc::Dtype::F32,
        block_tokens: 32,
        pool_blocks: 10,
    };
    assert_eq!(pool.measured_bytes(), geometry.pool_bytes().unwrap());
    assert_eq!(
        pool.shape().block_bytes() as u64,
        geometry.block_bytes().unwrap()
    );
    blocks.into_iter().for_each(|b| pool.release(b));
    assert_eq!(pool.measured_bytes(), 0, "released slabs are dropped");
}

#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "double free")]
fn a_double_free_fails_loudly_in_debug_builds() {
    let mut pool = BlockPool::new(shape(1, 2, 4)).unwrap();
    let b = pool.allocate(1).unwrap()[0];
    pool.release(b);
    pool.release(b);
}

#[test]
#[cfg(not(debug_assertions))]
fn a_double_free_is_counted_in_release_builds() {
    let mut pool = BlockPool::new(shape(1, 2, 4)).unwrap();
    let b = pool.allocate(1).unwrap()[0];
    pool.release(b);
    pool.release(b);
    assert_eq!((pool.bugs().double_frees, pool.free_blocks()), (1, 2));
}

#[test]
fn batched_decode_of_three_sequences_at_different_positions_gives_each_its_golden_tokens() {
    use mlxcel_daemon::paged::OwnRead;

    // Each way of reading a row's own blocks: whichever is cheaper, gathered, in place.
    for read in [OwnRead::Cheaper, OwnRead::Gather, OwnRead::Spans] {
        batched_goldens(read);
    }
}

#[test]
fn a_batch_whose_rows_share_prompt_blocks_reads_them_once_and_keeps_the_golden_tokens() {
    use mlxcel_daemon::paged::{OwnRead, PagedBatch};

    let m = model();
    let bt = 8;
    let chat = &fixtures()["chats"][0];
    let (prompt, want) = (ids(&chat["prompt_ids"]), ids(&chat["greedy_ids"]));
    for read in [OwnRead::Cheaper, OwnRead::Gather, OwnRead::Spans] {
        let mut pool = BlockPool::new(shape(m.model.config.layers, 64, bt)).unwrap();
        // Row 0 computes the prompt; rows 1 and 2 map its full blocks and compute the rest.
        let mut seqs = vec![BlockTable::default()];
        let first = forward_alone(&m.model, &mut seqs[0], &mut pool, &prompt).unwrap();
        let shared_blocks = (prompt.len() - 1) / bt;
        let mut next = vec![argmax(first.as_slice::<f32>())];
        for _ in 0..2 {
            let shared: Vec<u32> = seqs[0].blocks[..shared_blocks].to_vec();
            shared.iter().for_each(|&b| pool.retain(b));
            let mut seq = BlockTable::with_prefix(shared, bt);
            let rest = &prompt[shared_blocks * bt..];
            let logits = forward_alone(&m.model, &mut seq, &mut pool, rest).unwrap();
            next.push(argmax(logits.as_slice::<f32>()));
            seqs.push(seq);
        }
        let mut got: Vec<Vec<u32>> = next.iter().map(|&t| vec![t]).collect();
        for _ in 1..24 {
            let logits = {
                grow_rows(seqs.iter_mut(), &mut pool);
                let batch = PagedBatch::new(seqs.iter_mut().collect(), &mut pool);
                m.model
                    .forward_batch(&next, &mut batch.reading(read))
                    .unwrap()
            };
            let all = logits.as_slice::<f32>();
            for (i, row) in all.chunks(m.model.config.vocab).enumerate() {
                next[i] = argmax(row);
                got[i].push(next[i]);
            }
        }
        for tokens in &got {
            assert_eq!(tokens[..], want[..24], "own blocks read as {read:?}");
        }
        for s in seqs.iter_mut() {
            s.free(&mut pool);
        }
        assert_eq!(pool.free_blocks(), 64);
    }
}

fn argmax(row: &[f32]) -> u32 {
    row.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i as u32)
        .unwrap_or(0)
}

fn model() -> mlxcel_daemon::Loaded {
    mlxcel_daemon::load(&root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf")).expect("make setup")
}

fn batched_goldens(read: mlxcel_daemon::paged::OwnRead) {
    let chats = fixtures()["chats"].as_array().unwrap().clone();
    decode_goldens(&model(), &chats, read, false);
}

#[test]
fn batched_decode_in_the_gpus_formulation_gives_the_golden_tokens() {
    use mlxcel_daemon::device::Placement;
    use mlxcel_daemon::paged::OwnRead;

    // MLX's fused attention (its CPU reference here) reads one padded K/V per row: masked
    // only when the rows differ in length; a lone row read in place when its blocks are one
    // run, gathered when they are scattered.
    let m = mlxcel_daemon::load_placed(
        &root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"),
        Placement::formulation_on_cpu(false),
    )
    .expect("make setup");
    assert!(m.model.placement.gpu);
    let chats = fixtures()["chats"].as_array().unwrap().clone();
    decode_goldens(&m, &chats, OwnRead::Cheaper, false);
    // And the last step's logits are the CPU formulation's (an extra key read as zeros, say,
    // can leave greedy tokens unchanged).
    let cpu = model();
    for chat in &chats {
        let chat = std::slice::from_ref(chat);
        let want = decode_goldens(&cpu, chat, OwnRead::Cheaper, false);
        let scale = want.iter().fold(0f32, |a, x| a.max(x.abs()));
        for scattered in [false, true] {
            let got = decode_goldens(&m, chat, OwnRead::Cheaper, scattered);
            let diff = got
                .iter()
                .zip(&want)
                .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
            assert!(
                diff <= 1e-4 * scale,
                "scattered: {scattered}: logits differ by {diff} (largest {scale})"
            );
        }
    }
}

/// Prefills each chat's prompt, then decodes them together, greedily: each gets its golden
/// tokens. `scattered`: every other block of the pool is held, so no two of a sequence's
/// blocks are adjacent. Returns the last step's logits.
fn decode_goldens(
    m: &mlxcel_daemon::Loaded,
    chats: &[serde_json::Value],
    read: mlxcel_daemon::paged::OwnRead,
    scattered: bool,
) -> Vec<f32> {
    use mlxcel_daemon::paged::PagedBatch;

    let mut pool = BlockPool::new(shape(m.model.config.layers, 64, 16)).unwrap();
    let held: Vec<u32> = if scattered {
        let all = pool.allocate(64).unwrap();
        let (keep, free): (Vec<u32>, Vec<u32>) = all.iter().partition(|&&b| b % 2 == 0);
        free.into_iter().for_each(|b| pool.release(b));
        keep
    } else {
        Vec::new()
    };
    let mut seqs: Vec<BlockTable> = Vec::new();
    let mut next: Vec<u32> = Vec::new();
    for chat in chats {
        let mut seq = BlockTable::default();
        let logits =
            forward_alone(&m.model, &mut seq, &mut pool, &ids(&chat["prompt_ids"])).unwrap();
        next.push(argmax(logits.as_slice::<f32>()));
        seqs.push(seq);
    }
    let mut got: Vec<Vec<u32>> = next.iter().map(|&t| vec![t]).collect();
    let mut last = Vec::new();
    for _ in 1..32 {
        let logits = {
            grow_rows(seqs.iter_mut(), &mut pool);
            let mut batch = PagedBatch::new(seqs.iter_mut().collect(), &mut pool).reading(read);
            m.model.forward_batch(&next, &mut batch).unwrap()
        };
        let vocab = m.model.config.vocab;
        let all = logits.as_slice::<f32>();
        last = all.to_vec();
        for (i, row) in all.chunks(vocab).enumerate() {
            next[i] = argmax(row);
            got[i].push(next[i]);
        }
    }
    for (chat, tokens) in chats.iter().zip(&got) {
        assert_eq!(
            tokens,
            &ids(&chat["greedy_ids"]),
            "prompt {:?}, own blocks read as {read:?}, scattered: {scattered}",
            chat["messages"]
        );
    }
    for mut s in seqs {
        s.free(&mut pool);
    }
    held.into_iter().for_each(|b| pool.release(b));
    assert_eq!(pool.free_blocks(), 64);
    last
}
