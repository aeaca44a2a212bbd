use super::*;
use mlx_rs::{ops, random};

fn max_diff(a: &Array, b: &Array) -> f32 {
    let d = ops::abs(ops::subtract(a, b).unwrap())
        .unwrap()
        .max(None)
        .unwrap();
    d.item_cast::<f32>()
}

#[test]
fn few_rows_match_mlx_matmul_with_ragged_sizes() {
    // 37 outputs (not a multiple of the 4-row block), 70 inputs (not a multiple of 8 lanes).
    let w = random::normal::<f32>(&[37, 70], None, None, None).unwrap();
    w.eval().unwrap();
    let Some(k) = Skinny::new(&w) else {
        eprintln!("skipped: this CPU has no AVX2/FMA, the kernel is not used here");
        return;
    };
    for rows in [1, 3, 16] {
        let x = random::normal::<f32>(&[rows, 70], None, None, None).unwrap();
        let want = ops::matmul(&x, w.t()).unwrap();
        let got = k.forward(&x).unwrap().expect("fits the kernel");
        assert_eq!(got.shape(), want.shape());
        assert!(
            got.try_as_slice::<f32>().is_ok(),
            "row-major, as MLX's would be"
        );
        assert!(max_diff(&got, &want) < 1e-4, "rows {rows}");
    }
    // A [rows, 1, in] decode batch and a transposed (non-contiguous) input.
    let x = random::normal::<f32>(&[4, 1, 70], None, None, None).unwrap();
    let got = k.forward(&x).unwrap().expect("fits");
    assert_eq!(got.shape(), &[4, 1, 37]);
    assert!(max_diff(&got, &ops::matmul(&x, w.t()).unwrap()) < 1e-4);
    let xt = random::normal::<f32>(&[70, 2], None, None, None)
        .unwrap()
        .t();
    let got = k.forward(&xt).unwrap().expect("fits");
    assert!(max_diff(&got, &ops::matmul(&xt, w.t()).unwrap()) < 1e-4);
}

#[test]
fn many_rows_or_other_widths_are_left_to_mlx() {
    let w = random::normal::<f32>(&[8, 16], None, None, None).unwrap();
    w.eval().unwrap();
    let Some(k) = Skinny::new(&w) else {
        return;
    };
    let many = random::normal::<f32>(&[MAX_ROWS as i32 + 1, 16], None, None, None).unwrap();
    assert!(k.forward(&many).unwrap().is_none());
    let wide = random::normal::<f32>(&[1, 17], None, None, None).unwrap();
    assert!(k.forward(&wide).unwrap().is_none());
    let half = ops::ones::<f32>(&[1, 16])
        .unwrap()
        .as_dtype(Dtype::Float16)
        .unwrap();
    assert!(k.forward(&half).unwrap().is_none());
}
