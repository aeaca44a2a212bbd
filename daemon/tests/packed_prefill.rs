//! Several sequences' prefill chunks in one forward pass (`Model::forward_packed`, what the
//! engine runs when requests arrive together) give each sequence the logits and the greedy
//! tokens it gets alone: on the CPU's formulation and on CUDA's (padded rows, through MLX's CPU
//! reference of the fused ops; with the CUDA backend compiled: `make check-cuda`), with one sequence continued from a chunk of an earlier pass;
//! and with the keys gathered from a pool whose free blocks are scattered (what a GPU reads when
//! a prompt's blocks are many runs).

use mlxcel_daemon::device::DeviceChoice;
#[cfg(mlxcel_cuda)]
use mlxcel_daemon::device::Placement;
#[cfg(mlxcel_cuda)]
use mlxcel_daemon::load_placed;
use mlxcel_daemon::paged::{OwnRead, PagedBatch, PagedChunks};
use mlxcel_daemon::pool::{BlockPool, PoolShape};
use mlxcel_daemon::scheduler::BlockTable;
use mlxcel_daemon::{Loaded, load_on};
use mlxcel_tests::{fixtures, ids, root};

fn path() -> std::path::PathBuf {
    root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
}

fn pool(m: &Loaded) -> BlockPool {
    let c = &m.model.config;
    BlockPool::new(PoolShape {
        layers: c.layers,
        num_blocks: 128,
        block_tokens: 16,
        kv_heads: c.kv_heads,
        head_dim: c.head_dim,
        dtype: m.model.placement.dtype,
    })
    .expect("pool")
}

fn rows(logits: &mlx_rs::Array) -> Vec<Vec<f32>> {
    logits.eval().expect("eval");
    let vocab = *logits.shape().last().expect("vocab") as usize;
    logits
        .as_slice::<f32>()
        .chunks(vocab)
        .map(<[f32]>::to_vec)
        .collect()
}

fn argmax(row: &[f32]) -> u32 {
    let best = row.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1));
    best.map_or(0, |(i, _)| i as u32)
}

/// Holds every other block of `pool` (two fillers allocated in turn, one freed): what is left
/// free is scattered, one block per run. Returns the filler to free at the end.
fn scatter_free_blocks(pool: &mut BlockPool) -> BlockTable {
    let (mut kept, mut freed) = (BlockTable::default(), BlockTable::default());
    for blocks in 1..=32 {
        assert!(kept.grow(pool, 16 * blocks).is_some() && freed.grow(pool, 16 * blocks).is_some());
    }
    freed.free(pool);
    kept
}

fn packed_prefill_matches_each_sequence_alone(m: &Loaded, read: OwnRead, scattered: bool) {
    let chats = fixtures()["chats"].as_array().expect("chats").clone();
    let prompts: Vec<Vec<u32>> = chats.iter().map(|c| ids(&c["prompt_ids"])).collect();
    let golden: Vec<Vec<u32>> = chats.iter().map(|c| ids(&c["greedy_ids"])).collect();
    assert!(prompts.len() >= 3, "three golden chats");
    // Alone: each prompt in one pass of its own.
    let mut alone_pool = pool(m);
    let mut alone = Vec::new();
    for p in &prompts[..3] {
        let mut seq = BlockTable::default();
        seq.grow(&mut alone_pool, p.len()).expect("room");
        let l = m
            .model
            .forward(p, &mut seq.store(&mut alone_pool))
            .expect("alone");
        alone.push(rows(&l.reshape(&[1, -1]).expect("row")).remove(0));
        seq.free(&mut alone_pool);
    }
    // Packed: chat 0 whole with chat 1's first half, then chat 1's rest with chat 2 whole.
    let mut pool = pool(m);
    let filler = scattered.then(|| scatter_free_blocks(&mut pool));
    let mut seqs: Vec<BlockTable> = (0..3).map(|_| BlockTable::default()).collect();
    let half = prompts[1].len() / 2;
    let (s0, rest) = seqs.split_at_mut(1);
    let (s1, s2) = rest.split_at_mut(1);
    s0[0].grow(&mut pool, prompts[0].len()).expect("room");
    s1[0].grow(&mut pool, half).expect("room");
    let first = {
        let mut kv = PagedChunks::new(vec![&mut s0[0], &mut s1[0]], &mut pool).reading(read);
        let chunks = [&prompts[0][..], &prompts[1][..half]];
        rows(
            &m.model
                .forward_packed(&chunks, &mut kv)
                .expect("first pass"),
        )
    };
    s1[0]
        .grow(&mut pool, prompts[1].len() - half)
        .expect("room");
    s2[0].grow(&mut pool, prompts[2].len()).expect("room");
    let second = {
        let mut kv = PagedChunks::new(vec![&mut s1[0], &mut s2[0]], &mut pool).reading(read);
        let chunks = [&prompts[1][half..], &prompts[2][..]];
        rows(
            &m.model
                .forward_packed(&chunks, &mut kv)
                .expect("second pass"),
        )
    };
    let packed = [&first[0], &second[0], &second[1]];
    for (i, (got, want)) in packed.iter().zip(&alone).enumerate() {
        let scale = want.iter().fold(0f32, |a, x| a.max(x.abs()));
        let diff = got
            .iter()
            .zip(want)
            .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
        assert!(
            diff <= 1e-4 * scale,
            "chat {i}: logits differ by {diff} (scale {scale})"
        );
        assert_eq!(argmax(got), golden[i][0], "chat {i}'s first token");
    }
    // The sequences go on from the packed passes as from their own: golden tokens, batched.
    let mut next: Vec<u32> = (0..3).map(|i| golden[i][0]).collect();
    let mut got: Vec<Vec<u32>> = next.iter().map(|&t| vec![t]).collect();
    for _ in 1..8 {
        for s in seqs.iter_mut() {
            s.grow(&mut pool, 1).expect("room");
        }
        let mut kv = PagedBatch::new(seqs.iter_mut().collect(), &mut pool);
        let l = m.model.forward_batch(&next, &mut kv).expect("decode");
        next = rows(&l).iter().map(|r| argmax(r)).collect();
        got.iter_mut().zip(&next).for_each(|(g, &t)| g.push(t));
    }
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g[..], golden[i][..8], "chat {i}'s first 8 tokens");
    }
    if scattered {
        let runs = pool.span_count(&seqs[1].blocks);
        assert!(
            runs > 2,
            "chat 1's {} blocks are {runs} runs",
            seqs[1].blocks.len()
        );
    }
    for s in seqs.iter_mut() {
        s.free(&mut pool);
    }
    if let Some(mut f) = filler {
        f.free(&mut pool);
    }
}

#[test]
fn packed_prefill_gives_each_sequence_its_logits_and_golden_tokens_on_the_cpu() {
    let m = load_on(&path(), DeviceChoice::Cpu).expect("load");
    packed_prefill_matches_each_sequence_alone(&m, OwnRead::Spans, false);
    packed_prefill_matches_each_sequence_alone(&m, OwnRead::Cheaper, true);
}

#[cfg(mlxcel_cuda)]
#[test]
fn packed_prefill_gives_each_sequence_its_logits_and_golden_tokens_in_cudas_formulation() {
    let m = load_placed(&path(), Placement::formulation_on_cpu(true)).expect("load");
    assert!(m.model.placement.pads_prefill);
    packed_prefill_matches_each_sequence_alone(&m, OwnRead::Spans, false);
    packed_prefill_matches_each_sequence_alone(&m, OwnRead::Gather, true);
}
