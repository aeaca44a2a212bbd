//! The padded shapes: which a chunk runs, which a warm-up builds, and that padding changes no
//! real query.

use super::*;

#[test]
fn queries_pad_to_few_shapes() {
    assert_eq!(query_rows(1), 1);
    assert_eq!(query_rows(2), 16);
    assert_eq!(query_rows(17), 32);
    assert_eq!(query_rows(300), 512);
    assert_eq!(query_rows(512), 512);
    assert_eq!(query_rows(513), 1024);
    assert_eq!(query_rows(1500), 1536);
    let distinct: std::collections::BTreeSet<i32> = (1..=512).map(query_rows).collect();
    assert_eq!(distinct.len(), 7, "{distinct:?}");
}

#[test]
fn keys_pad_to_one_short_bucket_then_to_powers_of_two() {
    assert_eq!(shape(1, 37), (1, 37), "one query runs exact");
    assert_eq!(shape(5, 37), (16, 1024));
    assert_eq!(shape(17, 37), (512, 1024));
    assert_eq!(shape(300, 1024), (512, 1024));
    assert_eq!(shape(300, 1025), (512, 2048));
    assert_eq!(shape(512, 4096), (512, 4096));
    assert_eq!(shape(64, 4097), (512, 8192));
    assert_eq!(shape(700, 3000), (1024, 4096));
    assert_eq!(
        shape(7, 4100),
        (16, 8192),
        "a few rows keep them over long keys"
    );
}

#[test]
fn warm_up_covers_every_shape_up_to_its_keys() {
    assert_eq!(row_shapes(512), vec![1, 16, 32, 64, 128, 256, 512]);
    assert_eq!(row_shapes(100), vec![1, 16, 32, 64, 100]);
    // 16 and 512 rows over 1024 keys, then 2048, 4096, 8192 and 16384 keys, each with its
    // few-rows shape too.
    assert_eq!(attention_shapes(512, WARM_KEYS).len(), 2 + 4 + 4);
    assert_eq!(attention_shapes(512, 8192).len(), 2 + 3 + 3);
    for chunk in [7usize, 100, 512, 700] {
        for max_keys in [900usize, 5000] {
            let warmed: std::collections::BTreeSet<(i32, i32)> =
                attention_shapes(chunk, max_keys).into_iter().collect();
            for s in 2..=max_keys as i32 {
                for t in (2..=(chunk as i32).min(s)).step_by(3) {
                    assert!(
                        warmed.contains(&shape(t, s)),
                        "{chunk}/{max_keys}: {t} of {s}"
                    );
                }
            }
        }
    }
}

/// The padded shape gives every real query the attention of the unpadded one (on any
/// device: the CPU runs MLX's reference of the fused kernel).
#[test]
fn padding_changes_no_real_query() {
    use mlx_rs::{Array, fast};
    let r = |shape: &[i32]| mlx_rs::random::normal::<f32>(shape, None, None, None).expect("r");
    let (heads, kv_heads, hd) = (4, 2, 8);
    let cases = [
        (0, 5),
        (0, 16),
        (37, 20),
        (250, 9),
        (300, 300),
        (1100, 40),
        (1100, 7),
    ];
    for (offset, t) in cases {
        let s = offset + t;
        let q = r(&[1, heads, t, hd]);
        // Two spans, as the pool hands them out.
        let cut = s / 3;
        let spans = vec![
            (r(&[1, kv_heads, cut, hd]), r(&[1, kv_heads, cut, hd])),
            (
                r(&[1, kv_heads, s - cut, hd]),
                r(&[1, kv_heads, s - cut, hd]),
            ),
        ];
        let (ks, vs): (Vec<Array>, Vec<Array>) = spans.iter().cloned().unzip();
        let (k, v) = (
            ops::concatenate(&ks, 2).expect("k"),
            ops::concatenate(&vs, 2).expect("v"),
        );
        let exact = causal_mask(t, offset, s, None, mlx_rs::Dtype::Float32).expect("mask");
        let want = fast::scaled_dot_product_attention(
            &q,
            &k,
            &v,
            0.3,
            Some(fast::ScaledDotProductAttentionMask::Array(&exact)),
            None,
        )
        .expect("want");
        let (tp, sp) = shape(t, s);
        let padded_mask = causal_mask(tp, offset, sp, None, mlx_rs::Dtype::Float32).expect("mask");
        let got =
            fused_attend(&q, &spans, 0.3, Some(&padded_mask), (tp, sp), true, None).expect("got");
        assert_eq!(got.shape(), want.shape());
        let diff = ops::abs(ops::subtract(&got, &want).expect("d"))
            .expect("abs")
            .max(None)
            .expect("max")
            .item_exact::<f32>();
        assert!(diff < 1e-5, "{offset}+{t}: {diff}");
    }
}
