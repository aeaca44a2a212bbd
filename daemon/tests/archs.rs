//! Each architecture beyond Llama against mlx_lm's own implementation of it: tiny random-weight
//! models made with mlx_lm's classes and mlx_lm's greedy answers on them
//! (`scripts/make_arch_goldens.py`, fixtures in `tests/fixtures/archs/`). Float32 on the CPU,
//! through the CPU backend and through the GPU backends' formulation (their fused ops, MLX's
//! reference implementations on the CPU): the prompt's last logits within 1e-3 of mlx_lm's,
//! and 64 greedy tokens equal to mlx_lm's for eight prompts of mixed lengths, one sequence at a
//! time in a dense store, as one batch of eight in the paged pool, and resumed from a cached
//! prefix. A divergence is allowed only where mlx_lm's two best logits were within 1e-3 (a near
//! tie either implementation may break either way); the tokens after it are not compared.
//! Where MLX has a GPU (the device check), the same in float16: logits within 0.25, ties within
//! 0.25, and fewer tokens compared (float16 breaks more near ties).

mod support;

use std::path::{Path, PathBuf};

use mlxcel_daemon::device::{DeviceChoice, Placement};
use mlxcel_daemon::kv::DenseKv;
use mlxcel_daemon::load_placed;
use mlxcel_daemon::model::Model;
use mlxcel_daemon::paged::PagedBatch;
use mlxcel_daemon::pool::{BlockPool, PoolShape};
use mlxcel_daemon::scheduler::BlockTable;
use serde_json::Value;
use support::{forward_alone, greedy, grow_rows};

const BLOCK: usize = 8;

/// How close to the reference a run must come.
struct Tolerance {
    logits: f32,
    near_tie: f64,
    /// Tokens compared per prompt, at least (of 64 alone + 64 batched + 32 resumed).
    tokens: usize,
}

const F32: Tolerance = Tolerance {
    logits: 1e-3,
    near_tie: 1e-3,
    tokens: 48,
};
const F16: Tolerance = Tolerance {
    logits: 0.25,
    near_tie: 0.25,
    tokens: 8,
};

struct Case {
    prompt: Vec<u32>,
    greedy: Vec<u32>,
    gaps: Vec<f64>,
    last_logits: Vec<f32>,
}

fn fixture(name: &str) -> (PathBuf, Vec<Case>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/archs")
        .join(name);
    let text = std::fs::read_to_string(dir.join("reference.json"))
        .unwrap_or_else(|e| panic!("{}: {e} (scripts/make_arch_goldens.py)", dir.display()));
    let v: Value = serde_json::from_str(&text).unwrap();
    let list = |x: &Value| -> Vec<f64> {
        x.as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_f64().unwrap())
            .collect()
    };
    let cases = v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            prompt: list(&c["prompt"]).into_iter().map(|t| t as u32).collect(),
            greedy: list(&c["greedy"]).into_iter().map(|t| t as u32).collect(),
            gaps: list(&c["gaps"]),
            last_logits: list(&c["last_logits"])
                .into_iter()
                .map(|x| x as f32)
                .collect(),
        })
        .collect();
    (dir, cases)
}

/// `got` agrees with the reference `want` up to its first near tie (see the module's doc);
/// returns how many tokens were compared.
fn agrees(what: &str, want: &[u32], gaps: &[f64], got: &[u32], near_tie: f64) -> usize {
    match want.iter().zip(got).position(|(a, b)| a != b) {
        None => want.len().min(got.len()),
        Some(i) => {
            assert!(
                gaps[i] < near_tie,
                "{what}: token {i} is {} where mlx_lm chose {} by a margin of {} \
                 (want {:?}, got {:?})",
                got[i],
                want[i],
                gaps[i],
                &want[..=i],
                &got[..=i]
            );
            i
        }
    }
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

fn pool(model: &Model) -> BlockPool {
    let c = &model.config;
    BlockPool::new(PoolShape {
        layers: c.layers,
        num_blocks: 512,
        block_tokens: BLOCK,
        kv_heads: c.kv_heads,
        head_dim: c.head_dim,
        dtype: model.placement.dtype,
    })
    .unwrap()
}

/// The checks on each placement there is: the CPU backend and the GPU formulation in float32,
/// and a GPU in float16 where MLX has one.
fn check(name: &str) {
    let (dir, _) = fixture(name);
    let cpu = mlxcel_daemon::load_on(&dir, DeviceChoice::Cpu);
    check_on(
        name,
        "CPU",
        cpu.unwrap_or_else(|e| panic!("{name}: {e}")),
        &F32,
    );
    let formulation = load_placed(&dir, Placement::formulation_on_cpu(false));
    let formulation = formulation.unwrap_or_else(|e| panic!("{name}: {e}"));
    check_on(name, "GPU formulation on the CPU", formulation, &F32);
    match Placement::choose(DeviceChoice::Auto) {
        Ok(p) if p.gpu => {
            eprintln!("{name}: on the GPU ({})", p.kind);
            let gpu = load_placed(&dir, p).unwrap_or_else(|e| panic!("{name}: {e}"));
            check_on(name, "GPU", gpu, &F16);
        }
        _ => eprintln!("{name}: no GPU in this MLX build; the GPU run is SKIPPED"),
    }
}

fn check_on(name: &str, path: &str, m: mlxcel_daemon::Loaded, tol: &Tolerance) {
    let (_, cases) = fixture(name);
    let name = &format!("{name} ({path}: {})", m.model.placement.describe());
    let vocab = m.model.config.vocab;
    let mut compared = 0;
    // One sequence at a time, dense store: the last logits and 64 greedy tokens.
    for (i, c) in cases.iter().enumerate() {
        let logits = m
            .model
            .forward(&c.prompt, &mut DenseKv::new(m.model.config.layers))
            .unwrap();
        let got = logits.as_slice::<f32>();
        let worst = got
            .iter()
            .zip(&c.last_logits)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            worst < tol.logits,
            "{name} prompt {i}: logits differ by up to {worst}"
        );
        let tokens = greedy(&m.model, c.prompt.clone(), c.greedy.len());
        compared += agrees(
            &format!("{name} prompt {i}"),
            &c.greedy,
            &c.gaps,
            &tokens,
            tol.near_tie,
        );
    }
    // All eight at once in the paged pool: prefill each, then decode steps over the batch.
    let mut pool = pool(&m.model);
    let mut seqs: Vec<BlockTable> = cases.iter().map(|_| BlockTable::default()).collect();
    let mut next: Vec<u32> = Vec::new();
    for (s, c) in seqs.iter_mut().zip(&cases) {
        let l = forward_alone(&m.model, s, &mut pool, &c.prompt).unwrap();
        next.push(argmax(l.as_slice::<f32>()));
    }
    let mut got: Vec<Vec<u32>> = next.iter().map(|&t| vec![t]).collect();
    for _ in 1..cases[0].greedy.len() {
        grow_rows(seqs.iter_mut(), &mut pool);
        let logits = {
            let mut batch = PagedBatch::new(seqs.iter_mut().collect(), &mut pool);
            m.model.forward_batch(&next, &mut batch).unwrap()
        };
        next = logits.as_slice::<f32>().chunks(vocab).map(argmax).collect();
        got.iter_mut().zip(&next).for_each(|(g, &t)| g.push(t));
    }
    for (i, (c, g)) in cases.iter().zip(&got).enumerate() {
        compared += agrees(
            &format!("{name} batch row {i}"),
            &c.greedy,
            &c.gaps,
            g,
            tol.near_tie,
        );
    }
    // Resumed from a cached prefix: the longest prompt's full blocks, mapped by a new sequence.
    let (long, first) = cases
        .iter()
        .zip(&seqs)
        .max_by_key(|(c, _)| c.prompt.len())
        .unwrap();
    let shared: Vec<u32> = first.blocks[..(long.prompt.len() - 1) / BLOCK].to_vec();
    shared.iter().for_each(|&b| pool.retain(b));
    let mut resumed = BlockTable::with_prefix(shared, BLOCK);
    let mut kv = resumed.store(&mut pool);
    let tokens = mlxcel_daemon::generate::generate(
        &m.model,
        &mut kv,
        &support::greedy_request(long.prompt.clone(), 32),
        |_| true,
    )
    .unwrap()
    .tokens;
    compared += agrees(
        &format!("{name} resumed"),
        &long.greedy[..32],
        &long.gaps,
        &tokens,
        tol.near_tie,
    );
    eprintln!("{name}: {compared} tokens equal to mlx_lm's");
    assert!(
        compared >= cases.len() * tol.tokens,
        "{name}: too few tokens compared ({compared})"
    );
}

#[test]
fn qwen3_moe_matches_mlx_lm() {
    check("qwen3_moe");
}

#[test]
fn qwen3_moe_quantized_matches_mlx_lm() {
    check("qwen3_moe_q4");
}

#[test]
fn gemma3_text_matches_mlx_lm() {
    check("gemma3_text");
}

#[test]
fn gpt_oss_matches_mlx_lm() {
    check("gpt_oss");
}

#[test]
fn gpt_oss_mxfp4_matches_mlx_lm() {
    check("gpt_oss_mxfp4");
}
