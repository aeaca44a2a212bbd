//! RoPE and K/V packing in one CUDA kernel (`rope_cuda::RopeKv`) against MLX's own RoPE with
//! per-row offsets and a concatenation: q rotated, then the rotated K heads and the V heads
//! `[2 * kv_heads, b, head_dim]`, read from views of one joined projection (strided, as a decode
//! step gives them), for SmolLM2's and Llama 3 8B's heads, both pairings, f16, bf16 and f32,
//! offsets up to 30k. The kernel needs a CUDA GPU (without one the test says it was skipped;
//! `make test` compiles it all the same).

mod support;

use mlx_rs::{Array, Dtype, fast, ops};
use mlxcel_daemon::model::rope_cuda::RopeKv;
use support::cuda::{f32, max_error, normal, on_cuda, rope_cases};

/// `x` (`[b, 1, n * d]`) as heads `[b, n, 1, d]`, rotated by MLX from `offsets`.
fn mlx_rope(x: &Array, n: i32, r: &RopeKv, offsets: &Array) -> Array {
    let b = x.shape()[0];
    let heads = x
        .reshape(&[b, 1, n, r.head_dim])
        .unwrap()
        .transpose_axes(&[0, 2, 1, 3])
        .unwrap();
    fast::rope_dynamic(
        &heads,
        r.head_dim,
        r.traditional,
        r.theta,
        1.0,
        offsets,
        None,
    )
    .unwrap()
}

/// `[b, n, 1, d]` as `[n, b, d]`.
fn heads_first(x: &Array) -> Array {
    let s = x.shape();
    x.reshape(&[s[0], s[1], s[3]])
        .unwrap()
        .swap_axes(0, 1)
        .unwrap()
}

#[test]
fn one_kernel_rotates_and_packs_as_mlx_does() {
    if !on_cuda() {
        return;
    }
    for (dtype, r) in rope_cases() {
        let (heads, kvh, d, traditional) = (r.heads, r.kv_heads, r.head_dim, r.traditional);
        let offsets = Array::from_slice(&[0, 7, 300, 1, 4000, 30_000], &[6]);
        let b = 6;
        let joined = normal(&[b, 1, (heads + 2 * kvh) * d], dtype);
        let parts = joined
            .split_at_indices(&[heads * d, (heads + kvh) * d], -1)
            .unwrap();
        let (q, k, v) = (&parts[0], &parts[1], &parts[2]);
        let (got_q, got_kv) = r
            .apply(q, k, v, &offsets)
            .unwrap()
            .expect("the kernel takes these inputs");
        let want_q = mlx_rope(q, heads, &r, &offsets);
        let want_k = heads_first(&mlx_rope(k, kvh, &r, &offsets));
        let want_v = heads_first(
            &v.reshape(&[b, 1, kvh, d])
                .unwrap()
                .transpose_axes(&[0, 2, 1, 3])
                .unwrap(),
        );
        let want_kv = ops::concatenate(&[want_k, want_v], 0).unwrap();
        assert_eq!(got_q.shape(), &[b, heads, 1, d]);
        assert_eq!(got_kv.shape(), &[2 * kvh, b, d]);
        // One rounding of the same f32 value: at most one unit in the last place of
        // values of magnitude ~4 (normal inputs rotated).
        let ulp = match dtype {
            Dtype::Float32 => 1e-5,
            Dtype::Float16 => 4.0 / 1024.0,
            _ => 4.0 / 128.0,
        };
        let what = format!("{dtype:?} {heads}/{kvh}x{d} traditional={traditional}");
        let eq = max_error(&got_q, &f32(&want_q));
        assert!(eq <= ulp, "{what}: q off by {eq}");
        let ekv = max_error(&got_kv, &f32(&want_kv));
        assert!(ekv <= ulp, "{what}: k/v off by {ekv}");
        // The V heads are copied, not rounded again.
        let v_got = got_kv.split_at_indices(&[kvh], 0).unwrap().pop().unwrap();
        let v_want = want_kv.split_at_indices(&[kvh], 0).unwrap().pop().unwrap();
        assert_eq!(max_error(&v_got, &f32(&v_want)), 0.0, "{what}: v");
    }
}

#[test]
fn inputs_it_does_not_take_are_left_to_mlx() {
    if !on_cuda() {
        return;
    }
    let r = RopeKv {
        heads: 9,
        kv_heads: 3,
        head_dim: 64,
        theta: 10_000.0,
        traditional: false,
    };
    let offsets = Array::from_slice(&[3, 4], &[2]);
    let x = |n: i32, t: i32| ops::zeros_dtype(&[2, t, n * 64], Dtype::Float16).unwrap();
    // Two positions per row (a prefill chunk).
    assert!(
        r.apply(&x(9, 2), &x(3, 2), &x(3, 2), &offsets)
            .unwrap()
            .is_none()
    );
    // k of the wrong width.
    assert!(
        r.apply(&x(9, 1), &x(4, 1), &x(3, 1), &offsets)
            .unwrap()
            .is_none()
    );
    // Offsets of another count or dtype.
    let three = Array::from_slice(&[3, 4, 5], &[3]);
    assert!(
        r.apply(&x(9, 1), &x(3, 1), &x(3, 1), &three)
            .unwrap()
            .is_none()
    );
    let float = Array::from_slice(&[3.0f32, 4.0], &[2]);
    assert!(
        r.apply(&x(9, 1), &x(3, 1), &x(3, 1), &float)
            .unwrap()
            .is_none()
    );
}
