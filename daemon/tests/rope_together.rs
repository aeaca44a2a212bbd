//! q and k rotated in one RoPE call over the joined projection's output
//! ([`Placement::ropes_qk_together`], the default) give the same logits, bit for bit, as q and
//! k rotated apart: prefill of several chunks in one pass, then batched decode steps, on the
//! CPU's formulation (RoPE by table) and a GPU's (MLX's fused RoPE, through its CPU reference).

use mlxcel_daemon::device::{DeviceChoice, Placement};
use mlxcel_daemon::kv::BatchKv;
use mlxcel_daemon::paged::{PagedBatch, PagedChunks, PagedSeq};
use mlxcel_daemon::pool::{BlockPool, PoolShape};
use mlxcel_daemon::{Loaded, load_placed};
use mlxcel_tests::{fixtures, ids, root};

fn load(mut placement: Placement, together: bool) -> Loaded {
    placement.ropes_qk_together = together;
    let path = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    load_placed(&path, placement).expect("load the default model (`make setup`)")
}

fn pool(m: &Loaded) -> BlockPool {
    let c = &m.model.config;
    BlockPool::new(PoolShape {
        layers: c.layers,
        num_blocks: 64,
        block_tokens: 16,
        kv_heads: c.kv_heads,
        head_dim: c.head_dim,
        dtype: m.model.placement.dtype,
    })
    .expect("pool")
}

fn values(logits: &mlx_rs::Array) -> Vec<f32> {
    logits.eval().expect("eval");
    logits.as_slice::<f32>().to_vec()
}

/// Every logit of a packed prefill of three chats, then of three batched decode steps.
fn logits(m: &Loaded) -> Vec<Vec<f32>> {
    let chats = fixtures()["chats"].as_array().expect("chats").clone();
    let prompts: Vec<Vec<u32>> = chats
        .iter()
        .take(3)
        .map(|c| ids(&c["prompt_ids"]))
        .collect();
    let mut pool = pool(m);
    let mut seqs: Vec<PagedSeq> = prompts.iter().map(|_| PagedSeq::default()).collect();
    let mut out = Vec::new();
    {
        let mut kv = PagedChunks::new(seqs.iter_mut().collect(), &mut pool);
        let chunks: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
        out.push(values(
            &m.model.forward_packed(&chunks, &mut kv).expect("prefill"),
        ));
    }
    let mut next: Vec<u32> = vec![1, 2, 3];
    for _ in 0..3 {
        let mut kv = PagedBatch::new(seqs.iter_mut().collect(), &mut pool);
        kv.reserve().expect("room");
        let l = values(&m.model.forward_batch(&next, &mut kv).expect("decode"));
        next = next.iter().map(|t| t + 7).collect();
        out.push(l);
    }
    seqs.iter_mut().for_each(|s| s.free(&mut pool));
    out
}

fn same_either_way(placement: impl Fn() -> Placement) {
    let (together, apart) = (load(placement(), true), load(placement(), false));
    let (a, b) = (logits(&together), logits(&apart));
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(x.len(), y.len());
        let worst = x
            .iter()
            .zip(y)
            .map(|(p, q)| (p - q).abs())
            .fold(0f32, f32::max);
        assert!(
            worst == 0.0,
            "pass {i} ({}): logits differ by {worst} between q and k rotated together and apart",
            together.model.placement.describe()
        );
    }
}

#[test]
fn rotating_q_and_k_together_changes_no_logit_on_the_cpu() {
    same_either_way(|| Placement::choose(DeviceChoice::Cpu).expect("the CPU"));
}

#[test]
fn rotating_q_and_k_together_changes_no_logit_in_a_gpus_formulation() {
    same_either_way(|| Placement::gpu_formulation_on_cpu(false));
}
