use super::*;

/// Logits whose softmax is `probs` (at temperature 1).
fn logits_of(probs: &[f32]) -> Vec<f32> {
    probs.iter().map(|p| p.ln()).collect()
}

fn row(temperature: f32, top_k: u32, top_p: f32, min_p: f32) -> RowDraw {
    RowDraw {
        temperature,
        top_k,
        top_p,
        min_p,
        uniform: 0.0,
    }
}

/// How often each token is drawn from `logits` over a grid of `n` uniforms, as shares.
fn shares(logits: &[f32], r: RowDraw, n: usize) -> Vec<f32> {
    let v = logits.len();
    let rows: Vec<RowDraw> = (0..n)
        .map(|i| RowDraw {
            uniform: (i as f32 + 0.5) / n as f32,
            ..r
        })
        .collect();
    let all: Vec<f32> = (0..n).flat_map(|_| logits.iter().copied()).collect();
    let drawn = draw(
        &Array::from_slice(&all, &[n as i32, v as i32]),
        None,
        &rows,
        false,
    )
    .unwrap();
    let mut count = vec![0f32; v];
    for &t in drawn.tokens.as_slice::<u32>() {
        count[t as usize] += 1.0 / n as f32;
    }
    count
}

fn assert_shares(got: &[f32], want: &[f32]) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() < 2e-3,
            "token {i}: drawn {g}, expected {w} ({got:?})"
        );
    }
}

#[test]
fn greedy_rows_take_the_argmax_with_its_log_probability() {
    let logits = [0.5f32, 3.0, -1.0, 2.9, 1.0, 3.0, 0.0, -2.0];
    let rows = [row(0.0, 0, 1.0, 0.0), row(0.0, 0, 1.0, 0.0)];
    let a = Array::from_slice(&logits, &[2, 4]);
    let drawn = draw(&a, None, &rows, true).unwrap();
    assert_eq!(drawn.tokens.as_slice::<u32>(), &[1, 1]);
    let lp = drawn.logprobs.unwrap();
    for (r, &t) in [0usize, 1].iter().zip(drawn.tokens.as_slice::<u32>()) {
        let x = &logits[r * 4..r * 4 + 4];
        let z: f32 = x.iter().map(|v| v.exp()).sum();
        let want = x[t as usize] - z.ln();
        assert!((lp.as_slice::<f32>()[*r] - want).abs() < 1e-5);
    }
}

#[test]
fn draws_follow_the_softmax_at_the_temperature() {
    let probs = [0.1f32, 0.4, 0.2, 0.3];
    assert_shares(
        &shares(&logits_of(&probs), row(1.0, 0, 1.0, 0.0), 4000),
        &probs,
    );
    // At temperature 0.5 each probability is squared, then renormalized.
    let sq: Vec<f32> = probs.iter().map(|p| p * p).collect();
    let z: f32 = sq.iter().sum();
    let want: Vec<f32> = sq.iter().map(|p| p / z).collect();
    assert_shares(
        &shares(&logits_of(&probs), row(0.5, 0, 1.0, 0.0), 4000),
        &want,
    );
}

#[test]
fn top_k_top_p_and_min_p_keep_what_the_host_sampler_keeps() {
    // Best first: 1 (0.4), 3 (0.3), 2 (0.2), 0 (0.1); tokens out of order on purpose.
    let logits = logits_of(&[0.1, 0.4, 0.2, 0.3]);
    // top-k 2: tokens 1 and 3, renormalized.
    assert_shares(
        &shares(&logits, row(1.0, 2, 1.0, 0.0), 4000),
        &[0.0, 0.4 / 0.7, 0.0, 0.3 / 0.7],
    );
    // top-p 0.65: 0.4 < 0.65 <= 0.7, so tokens 1 and 3.
    assert_shares(
        &shares(&logits, row(1.0, 0, 0.65, 0.0), 4000),
        &[0.0, 0.4 / 0.7, 0.0, 0.3 / 0.7],
    );
    // top-p 0.75 within the top 3 (0.9 of the mass): 0.4/0.9 < 0.75 <= 0.7/0.9: tokens 1, 3.
    assert_shares(
        &shares(&logits, row(1.0, 3, 0.75, 0.0), 4000),
        &[0.0, 0.4 / 0.7, 0.0, 0.3 / 0.7],
    );
    // min-p 0.5: at least 0.2 (half of 0.4): tokens 1, 3 and 2.
    assert_shares(
        &shares(&logits, row(1.0, 0, 1.0, 0.5), 4000),
        &[0.0, 0.4 / 0.9, 0.2 / 0.9, 0.3 / 0.9],
    );
    // top-k 1, top-p 0 and min-p 1 are greedy.
    for r in [
        row(1.0, 1, 1.0, 0.0),
        row(1.0, 0, 0.0, 0.0),
        row(1.0, 0, 1.0, 1.0),
    ] {
        assert_shares(&shares(&logits, r, 100), &[0.0, 1.0, 0.0, 0.0]);
    }
}

#[test]
fn a_mixed_batch_draws_each_row_as_it_would_alone() {
    let v = 64;
    let rows: Vec<RowDraw> = vec![
        row(0.0, 0, 1.0, 0.0),
        RowDraw {
            uniform: 0.3,
            ..row(0.8, 0, 1.0, 0.0)
        },
        RowDraw {
            uniform: 0.9,
            ..row(1.2, 5, 1.0, 0.0)
        },
        RowDraw {
            uniform: 0.6,
            ..row(0.7, 0, 0.9, 0.05)
        },
        RowDraw {
            uniform: 0.1,
            ..row(1.0, 10, 0.5, 0.0)
        },
    ];
    let logits: Vec<f32> = (0..rows.len() * v)
        .map(|i| ((i * 7919) % 113) as f32 / 17.0)
        .collect();
    let all = Array::from_slice(&logits, &[rows.len() as i32, v as i32]);
    let together = draw(&all, None, &rows, true).unwrap();
    for (i, r) in rows.iter().enumerate() {
        let one = Array::from_slice(&logits[i * v..(i + 1) * v], &[1, v as i32]);
        let alone = draw(&one, None, &[*r], true).unwrap();
        assert_eq!(
            together.tokens.as_slice::<u32>()[i],
            alone.tokens.as_slice::<u32>()[0],
            "row {i}"
        );
    }
}

#[test]
fn rows_with_penalties_or_a_sort_on_the_cpu_stay_on_the_host() {
    let plain = SamplingParams {
        temperature: 0.7,
        ..SamplingParams::default()
    };
    assert!(RowDraw::fits(&plain, false) && RowDraw::fits(&plain, true));
    let nucleus = SamplingParams {
        top_p: 0.9,
        ..plain.clone()
    };
    assert!(!RowDraw::fits(&nucleus, false) && RowDraw::fits(&nucleus, true));
    let penalised = SamplingParams {
        repetition_penalty: 1.1,
        ..plain
    };
    assert!(!RowDraw::fits(&penalised, true));
}

#[test]
fn a_bias_row_masks_tokens_and_logprobs_stay_the_model_s() {
    // Row 0 may only take tokens 2 and 3 (greedy: 3); row 1 is not biased (greedy: 1).
    let logits = [0.5f32, 3.0, -1.0, 2.9, 1.0, 3.0, 0.0, -2.0];
    let ninf = f32::NEG_INFINITY;
    let bias = [ninf, ninf, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
    let a = Array::from_slice(&logits, &[2, 4]);
    let b = Array::from_slice(&bias, &[2, 4]);
    let rows = [row(0.0, 0, 1.0, 0.0), row(0.0, 0, 1.0, 0.0)];
    let drawn = draw(&a, Some(&b), &rows, true).unwrap();
    assert_eq!(drawn.tokens.as_slice::<u32>(), &[3, 1]);
    let z: f32 = logits[..4].iter().map(|v| v.exp()).sum();
    let lp = drawn.logprobs.unwrap();
    assert!((lp.as_slice::<f32>()[0] - (2.9 - z.ln())).abs() < 1e-5);
    // Sampled rows never draw a masked token.
    let rows: Vec<RowDraw> = (0..64)
        .map(|i| RowDraw {
            uniform: i as f32 / 64.0,
            ..row(1.0, 0, 1.0, 0.0)
        })
        .collect();
    let all: Vec<f32> = (0..64).flat_map(|_| logits[..4].iter().copied()).collect();
    let mask: Vec<f32> = (0..64).flat_map(|_| bias[..4].iter().copied()).collect();
    let drawn = draw(
        &Array::from_slice(&all, &[64, 4]),
        Some(&Array::from_slice(&mask, &[64, 4])),
        &rows,
        false,
    )
    .unwrap();
    assert!(
        drawn
            .tokens
            .as_slice::<u32>()
            .iter()
            .all(|&t| t == 2 || t == 3)
    );
}
