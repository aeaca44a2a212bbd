use super::*;

#[test]
fn greedy_takes_the_argmax_and_reports_its_logprob() {
    let mut s = Sampler::new(SamplingParams::default(), &[]);
    let c = s.sample(&[0.0, 2.0, 1.0]);
    assert_eq!(c.token, 1);
    let expected = 2.0 - (1f32 + 2f32.exp() + 1f32.exp()).ln();
    assert!((c.logprob.expect("asked for") - expected).abs() < 1e-6);
    let mut s = Sampler::new(SamplingParams::default(), &[]).with_logprobs(false);
    assert_eq!(s.sample(&[0.0, 2.0, 1.0]).logprob, None);
}

#[test]
fn a_seed_reproduces_a_sampled_sequence_and_another_seed_differs() {
    let logits: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin()).collect();
    let run = |seed| {
        let params = SamplingParams {
            temperature: 1.0,
            seed: Some(seed),
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(params, &[]);
        (0..50).map(|_| s.sample(&logits).token).collect::<Vec<_>>()
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8));
}

fn draws(params: SamplingParams, logits: &[f32], n: usize) -> Vec<usize> {
    let mut s = Sampler::new(params, &[]).with_logprobs(false);
    let mut counts = vec![0; logits.len()];
    for _ in 0..n {
        counts[s.sample(logits).token as usize] += 1;
    }
    counts
}

#[test]
fn unfiltered_draws_follow_the_softmax() {
    let params = SamplingParams {
        temperature: 1.0,
        seed: Some(3),
        ..SamplingParams::default()
    };
    let counts = draws(params, &[0.0, 3f32.ln()], 8000);
    let share = counts[1] as f64 / 8000.0;
    assert!((share - 0.75).abs() < 0.03, "{counts:?}");
}

#[test]
fn the_nucleus_holds_its_share_of_the_whole_vocabulary() {
    // Two strong tokens, a thousand far below (left out before the sort), one in between.
    let mut logits = vec![-40.0f32; 1003];
    logits[0] = 5.0;
    logits[1] = 5.0;
    logits[2] = 4.0;
    let params = |top_p| SamplingParams {
        temperature: 1.0,
        top_p,
        seed: Some(5),
        ..SamplingParams::default()
    };
    let c = draws(params(0.5), &logits, 2000);
    assert_eq!(c[0] + c[1], 2000, "{:?}", &c[..3]);
    let c = draws(params(0.99), &logits, 4000);
    assert!(
        c[2] > 400 && c[3..].iter().all(|&x| x == 0),
        "{:?}",
        &c[..4]
    );
    // top-k picks the k best even when they are not in vocabulary order.
    let k = SamplingParams {
        top_k: 2,
        ..params(1.0)
    };
    let c = draws(k, &logits, 500);
    assert_eq!(c[0] + c[1], 500);
}

#[test]
fn top_k_one_and_min_p_one_are_greedy() {
    let logits = [0.1, 3.0, 2.9, -1.0];
    for params in [
        SamplingParams {
            temperature: 1.0,
            top_k: 1,
            seed: Some(1),
            ..SamplingParams::default()
        },
        SamplingParams {
            temperature: 1.0,
            min_p: 1.0,
            seed: Some(1),
            ..SamplingParams::default()
        },
        SamplingParams {
            temperature: 1.0,
            top_p: 0.01,
            seed: Some(1),
            ..SamplingParams::default()
        },
    ] {
        let mut s = Sampler::new(params, &[]);
        assert!((0..20).all(|_| s.sample(&logits).token == 1));
    }
}

#[test]
fn penalties_push_away_from_repeats() {
    let logits = [1.0, 0.9];
    let params = SamplingParams {
        presence_penalty: 0.5,
        ..SamplingParams::default()
    };
    let mut s = Sampler::new(params, &[]);
    assert_eq!(s.sample(&logits).token, 0);
    assert_eq!(
        s.sample(&logits).token,
        1,
        "token 0 now carries a 0.5 presence penalty"
    );
    let params = SamplingParams {
        repetition_penalty: 2.0,
        ..SamplingParams::default()
    };
    let mut s = Sampler::new(params, &[0]);
    assert_eq!(
        s.sample(&logits).token,
        1,
        "token 0 is in the prompt: 1.0 / 2 < 0.9"
    );
}
