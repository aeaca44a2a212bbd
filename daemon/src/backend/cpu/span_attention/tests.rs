use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype, ops};

use super::attend;
use crate::backend::cpu::attention::explicit_attention;
use crate::backend::masks::causal_mask;

fn rand(shape: &[i32]) -> Array {
    mlx_rs::random::normal::<f32>(shape, None, None, None).expect("random")
}

/// MLX's attention, `[1, heads, t, hd]` turned into the kernel's `[1, t, heads * hd]`.
fn reference(q: &Array, spans: &[(Array, Array)], mask: Option<&Array>, group: i32) -> Array {
    let s = q.shape();
    explicit_attention(q, spans, 0.125, mask, group, None)
        .and_then(|o| {
            Ok(o.transpose_axes(&[0, 2, 1, 3])?
                .reshape(&[1, s[2], s[1] * s[3]])?)
        })
        .expect("reference")
}

fn max_diff(a: &Array, b: &Array) -> f32 {
    assert_eq!(a.shape(), b.shape());
    ops::abs(ops::subtract(a, b).expect("sub"))
        .expect("abs")
        .max(None)
        .expect("max")
        .item_exact::<f32>()
}

/// Spans as the pool hands them out: views of one `[2, kv_heads, positions, hd]` array.
fn slab_spans(kvh: i32, hd: i32, cuts: &[(i32, i32)]) -> Vec<(Array, Array)> {
    let slab = rand(&[2, kvh, 128, hd]);
    cuts.iter()
        .map(|&(a, b)| {
            let k = slab.index((0, .., a..b)).expand_dims(0).expect("k");
            let v = slab.index((1, .., a..b)).expand_dims(0).expect("v");
            (k, v)
        })
        .collect()
}

#[test]
fn a_prefill_chunk_matches_the_masked_attention_over_its_spans() {
    if !super::available() {
        return;
    }
    // 37 queries after 50 stored positions; spans of whole blocks cover 96 > 87 positions.
    let (kvh, group, hd, offset, t) = (3, 3, 64, 50, 37);
    let spans = slab_spans(kvh, hd, &[(0, 32), (64, 96), (32, 64)]);
    // Queries as RoPE leaves them: a transposed view, not contiguous.
    let q = rand(&[1, t, kvh * group, hd])
        .transpose_axes(&[0, 2, 1, 3])
        .expect("q");
    let mask = causal_mask(t, offset, 96, None, Dtype::Float32).expect("mask");
    let want = reference(&q, &spans, Some(&mask), group);
    let rows = vec![spans];
    let got = attend(&q, &rows, &[(offset + t) as usize], 0.125, group as usize)
        .expect("kernel")
        .expect("read");
    let diff = max_diff(&got, &want);
    assert!(diff < 2e-5, "max difference {diff}");
}

#[test]
fn a_decode_step_reads_each_row_over_its_own_spans() {
    if !super::available() {
        return;
    }
    let (kvh, group, hd) = (3, 3, 64);
    let shared = slab_spans(kvh, hd, &[(0, 32)]);
    let rows: Vec<Vec<(Array, Array)>> = [vec![(32, 45)], vec![], vec![(96, 128), (40, 41)]]
        .iter()
        .map(|own| {
            let mut row = shared.clone();
            row.extend(slab_spans(kvh, hd, own));
            row
        })
        .collect();
    let valid: Vec<usize> = rows
        .iter()
        .map(|r| r.iter().map(|(k, _)| k.shape()[2] as usize).sum())
        .collect();
    let q = rand(&[3, kvh * group, 1, hd]);
    let got = attend(&q, &rows, &valid, 0.125, group as usize)
        .expect("kernel")
        .expect("read");
    for (i, row) in rows.iter().enumerate() {
        let qi = q.index((i as i32..i as i32 + 1,));
        let want = reference(&qi, row, None, group);
        let diff = max_diff(&got.index((i as i32..i as i32 + 1,)), &want);
        assert!(diff < 2e-5, "row {i}: max difference {diff}");
    }
}

#[test]
fn inputs_it_does_not_read_are_left_to_mlx() {
    let spans = slab_spans(1, 8, &[(0, 4)]);
    let q = rand(&[1, 1, 2, 8]).as_dtype(Dtype::Float16).expect("f16");
    let out = attend(&q, &[spans], &[4], 0.125, 1).expect("kernel");
    assert!(out.is_none());
}
