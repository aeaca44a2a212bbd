//! The CUDA decode attention (`backend::cuda::attention`) gives what a softmax over each row's own
//! valid keys gives (f32, MLX's ops): rows of different lengths in one padded batch, a shared
//! prefix read before them, both layouts of the padded keys, queries that are a strided view,
//! f16 and f32, and the group sizes of SmolLM2 (3) and Llama 3 8B (4). Needs a CUDA GPU: without
//! one each test says it was skipped (CI has none; `scripts/gpu_check.sh` runs them on one).

mod support;

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Dtype, ops};
use mlxcel_daemon::backend::cuda::attention::{attend_batch, lengths};
use mlxcel_daemon::kv::{BatchKeys, OwnKeys};
use support::cuda::{max_error, normal, on_cuda, reference, tolerance};

struct Case {
    heads: i32,
    kvh: i32,
    d: i32,
    own: Vec<i32>,
    shared: i32,
    heads_first: bool,
    dtype: Dtype,
}

fn check(c: Case) {
    let (b, padded) = (c.own.len() as i32, *c.own.iter().max().unwrap() + 2);
    // Queries as `heads()` makes them: a transposed view of `[b, 1, heads, d]`.
    let q = normal(&[b, 1, c.heads, c.d], c.dtype)
        .swap_axes(1, 2)
        .unwrap();
    let k = normal(&[b, c.kvh, padded, c.d], c.dtype);
    let v = normal(&[b, c.kvh, padded, c.d], c.dtype);
    let (sk, sv) = (
        normal(&[1, c.kvh, c.shared.max(1), c.d], c.dtype),
        normal(&[1, c.kvh, c.shared.max(1), c.d], c.dtype),
    );
    let own = if c.heads_first {
        let (kh, vh) = (k.swap_axes(0, 1).unwrap(), v.swap_axes(0, 1).unwrap());
        OwnKeys::Padded(kh.contiguous().unwrap(), vh.contiguous().unwrap())
    } else {
        OwnKeys::RowsFirst(k.clone(), v.clone())
    };
    let keys = BatchKeys {
        shared: if c.shared > 0 {
            vec![(sk.clone(), sv.clone())]
        } else {
            vec![]
        },
        shared_len: c.shared as usize,
        own,
    };
    let out = attend_batch(&q, &keys, &lengths(&c.own, c.shared), c.kvh)
        .unwrap()
        .expect("the kernel takes these inputs");
    assert_eq!(out.shape(), &[b, 1, c.heads * c.d]);
    for (i, &n) in c.own.iter().enumerate() {
        let i = i as i32;
        let (mut ks, mut vs) = (k.index((i, .., ..n, ..)), v.index((i, .., ..n, ..)));
        if c.shared > 0 {
            ks = ops::concatenate(&[sk.index(0), ks], 1).unwrap();
            vs = ops::concatenate(&[sv.index(0), vs], 1).unwrap();
        }
        let want = reference(&q.index((i, .., 0, ..)), &ks, &vs, c.heads / c.kvh);
        let err = max_error(&out.index((i, 0, ..)), &want);
        assert!(
            err < tolerance(c.dtype),
            "row {i} ({n} own keys, {} shared, {:?}): error {err}",
            c.shared,
            c.dtype
        );
    }
}

#[test]
fn rows_of_different_lengths_read_only_their_own_keys() {
    if !on_cuda() {
        return;
    }
    for dtype in [Dtype::Float16, Dtype::Float32] {
        // SmolLM2's shape: 9 heads over 3, head_dim 64.
        check(Case {
            heads: 9,
            kvh: 3,
            d: 64,
            own: vec![1, 7, 300, 33, 64],
            shared: 0,
            heads_first: false,
            dtype,
        });
        // Llama 3 8B's: 32 over 8, head_dim 128; keys heads first.
        check(Case {
            heads: 32,
            kvh: 8,
            d: 128,
            own: vec![450, 301, 2, 512],
            shared: 0,
            heads_first: true,
            dtype,
        });
    }
}

#[test]
fn a_shared_prefix_is_read_before_each_rows_own_keys() {
    if !on_cuda() {
        return;
    }
    check(Case {
        heads: 32,
        kvh: 8,
        d: 128,
        own: vec![1, 40, 17],
        shared: 96,
        heads_first: false,
        dtype: Dtype::Float16,
    });
    check(Case {
        heads: 9,
        kvh: 3,
        d: 64,
        own: vec![5, 1],
        shared: 2048,
        heads_first: false,
        dtype: Dtype::Float16,
    });
}

#[test]
fn inputs_it_does_not_read_are_left_to_mlx() {
    if !on_cuda() {
        return;
    }
    let q = normal(&[2, 4, 1, 48], Dtype::Float16);
    let k = normal(&[2, 2, 8, 48], Dtype::Float16);
    let keys = BatchKeys {
        shared: vec![],
        shared_len: 0,
        own: OwnKeys::RowsFirst(k.clone(), k),
    };
    // A head width that is not a multiple of 32.
    assert!(
        attend_batch(&q, &keys, &lengths(&[3, 8], 0), 2)
            .unwrap()
            .is_none()
    );
    // Own keys as spans.
    let spans = BatchKeys {
        shared: vec![],
        shared_len: 0,
        own: OwnKeys::Spans(vec![]),
    };
    assert!(
        attend_batch(&q, &spans, &lengths(&[3, 8], 0), 2)
            .unwrap()
            .is_none()
    );
}
